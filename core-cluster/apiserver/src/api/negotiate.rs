//! Content negotiation: which representation a client asked for.

use axum::http::HeaderMap;

use super::status::ApiError;

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

/// The `Content-Type` of a Table answer: kube-apiserver writes the serializer's media type,
/// without the `as=`, `g=` and `v=` the client asked with (clients read the body's `kind`).
pub const TABLE_CONTENT_TYPE: &str = "application/json";
/// The `Content-Type` of a partial-metadata answer (as [`TABLE_CONTENT_TYPE`]).
pub const PARTIAL_CONTENT_TYPE: &str = "application/json";
/// The `Content-Type` of a partial-metadata list (as [`TABLE_CONTENT_TYPE`]).
pub const PARTIAL_LIST_CONTENT_TYPE: &str = "application/json";
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

/// The media types kube-apiserver encodes objects in, in its order (its serializers' order
/// without CBOR, which is off by default): what a 406 lists.
pub const SERVED_MEDIA_TYPES: [&str; 3] = [
    "application/json",
    "application/yaml",
    "application/vnd.kubernetes.protobuf",
];

/// The 406 of a request whose Accept header names nothing the endpoint can answer, as
/// upstream's `negotiation.NewNotAcceptableError` words it
/// (`k8s.io/apiserver/pkg/endpoints/handlers/negotiation/errors.go`).
pub fn not_acceptable() -> ApiError {
    ApiError {
        code: 406,
        reason: "NotAcceptable",
        message: format!(
            "only the following media types are accepted: {}",
            SERVED_MEDIA_TYPES.join(", ")
        ),
        details: None,
    }
}

/// The representation asked for: upstream's `NegotiateMediaTypeOptions` with a request
/// scope's `AllowsMediaTypeTransform` (`k8s.io/apiserver/pkg/endpoints/handlers/
/// negotiation/negotiate.go`, `handlers/rest.go`). The media ranges are tried by quality,
/// then in the client's order, each against the served media types it matches; a range is
/// taken when its parameters are ones the endpoint allows:
///
/// - no `as`/`g`/`v`: the objects themselves, in any served type;
/// - `as=Table;g=meta.k8s.io;v=v1` (or `v1beta1`): only where the resource has a table
///   convertor (`tables`: the resources of a generic store, their `status` and `scale`; not
///   access reviews, TokenReviews, TokenRequests, bindings, evictions, ephemeral
///   containers...), and only in JSON or YAML;
/// - `as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1` (or `v1beta1`): every endpoint
///   (served in JSON only here);
/// - any other `as`, `g` or `v`, a `stream` other than `watch` (or any on YAML), an `sv`
///   other than `v1`: not taken.
///
/// No Accept header is the objects; nothing taken is the 406 of [`not_acceptable`].
pub fn representation(headers: &HeaderMap, tables: bool) -> Result<Representation, ApiError> {
    let mut ranges = media_ranges(headers);
    if ranges.is_empty() {
        return Ok(Representation::Object);
    }
    let quality = |params: &[(String, String)]| {
        param(params, "q")
            .and_then(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0)
    };
    let wildcards = |media: &str| {
        let (kind, sub) = media.split_once('/').unwrap_or((media, ""));
        u8::from(kind == "*") + u8::from(sub == "*")
    };
    // Stable: the client's order stays among equals.
    ranges.sort_by(|(ma, a), (mb, b)| {
        quality(b)
            .total_cmp(&quality(a))
            .then(wildcards(ma).cmp(&wildcards(mb)))
    });
    for (media, params) in &ranges {
        let media = if media == "*" { "*/*" } else { media.as_str() };
        let Some((kind, sub)) = media.split_once('/') else {
            continue;
        };
        for served in SERVED_MEDIA_TYPES {
            let (served_kind, served_sub) = served.split_once('/').unwrap_or((served, ""));
            let matches = (kind == served_kind && (sub == served_sub || sub == "*"))
                || (kind == "*" && sub == "*");
            if matches && let Some(repr) = allowed(served_sub, params, tables) {
                return Ok(repr);
            }
        }
    }
    Err(not_acceptable())
}

/// `acceptMediaTypeOptions` with `AllowsMediaTypeTransform` for one served media type (its
/// subtype: `json`, `yaml`, `vnd.kubernetes.protobuf`): the representation a media range's
/// parameters ask for, if the endpoint can answer it in that type.
fn allowed(subtype: &str, params: &[(String, String)], tables: bool) -> Option<Representation> {
    match param(params, "stream") {
        None | Some("") => {}
        // YAML has no stream serializer; `watch` is the only stream schema.
        Some(stream) if subtype == "yaml" || stream != "watch" => return None,
        Some(_) => {}
    }
    if param(params, "sv").is_some_and(|sv| !sv.is_empty() && sv != "v1") {
        return None;
    }
    let (kind, group, version) = (param(params, "as"), param(params, "g"), param(params, "v"));
    if kind.is_none() && group.is_none() && version.is_none() {
        return Some(Representation::Object);
    }
    if group != Some("meta.k8s.io") || !matches!(version, Some("v1" | "v1beta1")) {
        return None;
    }
    let textual = matches!(subtype, "json" | "yaml");
    match kind {
        Some("Table") if tables && textual => Some(Representation::Table),
        // Upstream serves partial metadata in protobuf too; here it is JSON only.
        Some("PartialObjectMetadata" | "PartialObjectMetadataList") if textual => {
            Some(Representation::PartialMetadata)
        }
        _ => None,
    }
}

/// Whether protobuf (`application/vnd.kubernetes.protobuf`, plain: no `as=`) is the
/// client's first choice among what the server serves, as kube-apiserver negotiates: media
/// ranges by quality (`q`), then in the client's order; the first one the server can
/// produce wins. `Some(json_fallback)` when protobuf wins, where `json_fallback` says
/// whether the client also takes plain JSON (for an answer without a protobuf form).
pub fn prefers_protobuf(headers: &HeaderMap) -> Option<bool> {
    let ranges = ranges_by_quality(headers);
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

/// The Accept header's media ranges the client takes at all (`q` above 0), best first; a
/// stable sort keeps the client's order among equal qualities.
fn ranges_by_quality(headers: &HeaderMap) -> Vec<(String, Vec<(String, String)>)> {
    let mut ranges = media_ranges(headers);
    let quality = |params: &[(String, String)]| {
        param(params, "q")
            .and_then(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0)
    };
    ranges.retain(|(_, params)| quality(params) > 0.0);
    ranges.sort_by(|(_, a), (_, b)| quality(b).total_cmp(&quality(a)));
    ranges
}

/// Whether YAML (`application/yaml`, with or without `as=`) is the client's first choice
/// among what the server serves, negotiated as [`prefers_protobuf`] does: kubectl's
/// `-o yaml` reads JSON, but curl and other clients ask for YAML and get it from
/// kube-apiserver.
pub fn prefers_yaml(headers: &HeaderMap) -> bool {
    for (media, _) in &ranges_by_quality(headers) {
        match media.as_str() {
            "application/yaml" => return true,
            "application/json"
            | "*/*"
            | "application/*"
            | "application/vnd.kubernetes.protobuf" => return false,
            _ => {}
        }
    }
    false
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
        assert_eq!(repr(&h, true), Some(Representation::Table));
    }

    fn repr(h: &HeaderMap, tables: bool) -> Option<Representation> {
        representation(h, tables).ok()
    }

    /// Protobuf is an encoding of the objects (the codec layer turns the handler's JSON
    /// into it): it negotiates as the objects themselves.
    #[test]
    fn protobuf_first_falls_back_to_json() {
        let h = headers("application/vnd.kubernetes.protobuf,application/json");
        assert_eq!(repr(&h, true), Some(Representation::Object));
        assert_eq!(
            repr(&headers("application/vnd.kubernetes.protobuf"), true),
            Some(Representation::Object)
        );
        assert_eq!(repr(&HeaderMap::new(), false), Some(Representation::Object));
        assert_eq!(repr(&headers("application/cbor"), true), None);
        assert_eq!(repr(&headers("text/html"), true), None);
    }

    /// `k8s.io/apiserver/pkg/endpoints/handlers/rest.go` `AllowsMediaTypeTransform`: a Table
    /// only from an endpoint with a table convertor, in JSON or YAML, of meta.k8s.io v1 or
    /// v1beta1; partial metadata from any endpoint; the media ranges by quality, then in
    /// order; a refusal is upstream's 406 word for word.
    #[test]
    fn tables_only_where_the_endpoint_has_a_table_convertor() {
        let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
        assert_eq!(repr(&headers(table), true), Some(Representation::Table));
        let refused = representation(&headers(table), false).unwrap_err();
        assert_eq!(refused.code, 406);
        assert_eq!(refused.reason, "NotAcceptable");
        assert_eq!(
            refused.message,
            "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
        let with_json = format!("{table}, application/json");
        assert_eq!(
            repr(&headers(&with_json), false),
            Some(Representation::Object)
        );
        for other in [
            "application/json;as=Table;v=v1beta1;g=meta.k8s.io",
            "application/yaml;as=Table;v=v1;g=meta.k8s.io",
        ] {
            assert_eq!(repr(&headers(other), true), Some(Representation::Table));
        }
        for never in [
            "application/json;as=Table;v=v2;g=meta.k8s.io",
            "application/json;as=Table;v=v1;g=example.com",
            "application/json;as=Table",
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
            "application/json;as=Widget;v=v1;g=meta.k8s.io",
            "application/yaml;stream=watch",
            "application/json;stream=chunks",
            "application/json;sv=v2",
        ] {
            assert_eq!(repr(&headers(never), true), None, "{never}");
        }
        assert_eq!(
            repr(&headers("application/json;stream=watch"), true),
            Some(Representation::Object)
        );
        let partial = "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io";
        assert_eq!(
            repr(&headers(partial), false),
            Some(Representation::PartialMetadata)
        );
        let by_quality = format!("application/json;q=0.5, {table}");
        assert_eq!(
            repr(&headers(&by_quality), true),
            Some(Representation::Table)
        );
        assert_eq!(
            repr(&headers(&by_quality), false),
            Some(Representation::Object)
        );
        assert_eq!(
            repr(&headers(&format!("*/*;q=0.1, {table}")), true),
            Some(Representation::Table)
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
        assert_eq!(repr(&h, true), Some(Representation::PartialMetadata));
        let d = headers(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
        );
        assert!(wants_aggregated_discovery(&d));
        assert!(!wants_aggregated_discovery(&headers("application/json")));
    }
}
