//! Content negotiation: which representation a client asked for.

use axum::http::HeaderMap;

/// The representation of a GET, LIST or WATCH answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The objects themselves.
    Object,
    /// `meta.k8s.io/v1 Table` (kubectl get).
    Table,
    /// `PartialObjectMetadata` / `PartialObjectMetadataList` (kube-rs metadata watches).
    PartialMetadata,
}

/// The `Content-Type` of a Table answer.
pub const TABLE_CONTENT_TYPE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
/// The `Content-Type` of a partial-metadata answer.
pub const PARTIAL_CONTENT_TYPE: &str =
    "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io";
/// The `Content-Type` of a partial-metadata list.
pub const PARTIAL_LIST_CONTENT_TYPE: &str =
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";
/// The `Content-Type` of aggregated discovery.
pub const AGGREGATED_DISCOVERY_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The media type of a `Content-Type` value, lower-cased, without parameters.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// One media range of an Accept header, with its parameters.
fn media_ranges(headers: &HeaderMap) -> Vec<(String, Vec<(String, String)>)> {
    let accept = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    accept
        .split(',')
        .filter(|r| !r.trim().is_empty())
        .map(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let params = parts
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
            (media, params)
        })
        .collect()
}

fn param<'a>(params: &'a [(String, String)], key: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The representation asked for, in the client's order of preference; `Err` with the
/// header if nothing acceptable is offered (only protobuf, say).
pub fn representation(headers: &HeaderMap) -> Result<Representation, String> {
    let ranges = media_ranges(headers);
    if ranges.is_empty() {
        return Ok(Representation::Object);
    }
    for (media, params) in &ranges {
        let jsonish = matches!(
            media.as_str(),
            "application/json" | "*/*" | "application/*" | "application/yaml"
        );
        if !jsonish {
            continue;
        }
        match (param(params, "as"), param(params, "g")) {
            (Some("Table"), Some("meta.k8s.io")) => return Ok(Representation::Table),
            (Some("PartialObjectMetadata" | "PartialObjectMetadataList"), Some("meta.k8s.io")) => {
                return Ok(Representation::PartialMetadata);
            }
            (Some(_), _) => continue,
            (None, _) => return Ok(Representation::Object),
        }
    }
    Err(headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned())
}

/// Whether protobuf (`application/vnd.kubernetes.protobuf`, plain: no `as=`) is the
/// client's first choice among what the server serves, as kube-apiserver negotiates: media
/// ranges by quality (`q`), then in the client's order; the first one the server can
/// produce wins. `Some(json_fallback)` when protobuf wins, where `json_fallback` says
/// whether the client also takes plain JSON (for an answer without a protobuf form).
pub fn prefers_protobuf(headers: &HeaderMap) -> Option<bool> {
    let mut ranges = media_ranges(headers);
    let quality = |params: &[(String, String)]| {
        param(params, "q")
            .and_then(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0)
    };
    ranges.retain(|(_, params)| quality(params) > 0.0);
    // A stable sort keeps the client's order among equal qualities.
    ranges.sort_by(|(_, a), (_, b)| quality(b).total_cmp(&quality(a)));
    let json_fallback = ranges.iter().any(|(media, params)| {
        matches!(media.as_str(), "application/json" | "*/*" | "application/*")
            && param(params, "as").is_none()
    });
    for (media, params) in &ranges {
        match media.as_str() {
            "application/vnd.kubernetes.protobuf" if param(params, "as").is_none() => {
                return Some(json_fallback);
            }
            "application/json" | "*/*" | "application/*" | "application/yaml" => return None,
            _ => {}
        }
    }
    None
}

/// Whether the client asked for aggregated discovery (apidiscovery.k8s.io/v2).
pub fn wants_aggregated_discovery(headers: &HeaderMap) -> bool {
    media_ranges(headers).iter().any(|(_, params)| {
        param(params, "g") == Some("apidiscovery.k8s.io")
            && param(params, "v") == Some("v2")
            && param(params, "as") == Some("APIGroupDiscoveryList")
    })
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(accept: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("accept", HeaderValue::from_str(accept).unwrap());
        h
    }

    #[test]
    fn kubectl_get_asks_for_a_table() {
        let h = headers(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        );
        assert_eq!(representation(&h), Ok(Representation::Table));
    }

    #[test]
    fn protobuf_first_falls_back_to_json() {
        let h = headers("application/vnd.kubernetes.protobuf,application/json");
        assert_eq!(representation(&h), Ok(Representation::Object));
        assert!(representation(&headers("application/vnd.kubernetes.protobuf")).is_err());
        assert_eq!(
            representation(&HeaderMap::new()),
            Ok(Representation::Object)
        );
    }

    /// kube-apiserver's negotiation: the first acceptable media range by quality, then
    /// order; client-go's default `application/vnd.kubernetes.protobuf, */*` gets protobuf.
    #[test]
    fn protobuf_is_chosen_when_it_comes_first() {
        assert_eq!(
            prefers_protobuf(&headers("application/vnd.kubernetes.protobuf, */*")),
            Some(true)
        );
        assert_eq!(
            prefers_protobuf(&headers("application/vnd.kubernetes.protobuf")),
            Some(false)
        );
        assert_eq!(
            prefers_protobuf(&headers(
                "application/json, application/vnd.kubernetes.protobuf"
            )),
            None
        );
        assert_eq!(
            prefers_protobuf(&headers(
                "application/json;q=0.5, application/vnd.kubernetes.protobuf"
            )),
            Some(true)
        );
        // Tables and discovery documents in protobuf are not served: the next range wins.
        assert_eq!(
            prefers_protobuf(&headers(
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/json"
            )),
            None
        );
        assert_eq!(prefers_protobuf(&HeaderMap::new()), None);
    }

    #[test]
    fn kube_rs_metadata_and_discovery() {
        let h = headers("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1");
        assert_eq!(representation(&h), Ok(Representation::PartialMetadata));
        let d = headers(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        );
        assert!(wants_aggregated_discovery(&d));
        assert!(!wants_aggregated_discovery(&headers("application/json")));
    }
}
