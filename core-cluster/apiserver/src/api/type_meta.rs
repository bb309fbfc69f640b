//! `apiVersion` and `kind` of a request body, read as kube-apiserver's decoder reads them.
//!
//! Upstream decodes every create and update body with the endpoint's group, version and kind
//! as defaults (`handlers/create.go`: `decoder.Decode(body, &defaultGVK, original)`; the JSON
//! serializer's `gvkWithDefaults`): a body without `kind` or `apiVersion` takes them from the
//! URL, which is what the official Python client relies on (it omits both when the model
//! leaves them unset). A body that names another kind or version is still refused, with the
//! messages upstream's decoder and `transformDecodeError` produce.

use serde_json::{Value, json};

use super::status::ApiError;
use crate::registry::ALL;

/// Where upstream's scheme lives, as its "not registered" errors name it.
const SCHEME: &str = "pkg/api/legacyscheme/scheme.go:30";

/// Fills in `apiVersion` and `kind` missing from `obj` (absent, null or empty) with the
/// endpoint's, then checks that the body names the endpoint's own: a present but different
/// pair is a 400 worded as kube-apiserver's.
pub(crate) fn default_from_path(
    obj: &mut Value,
    api_version: &str,
    kind: &str,
) -> Result<(), ApiError> {
    let Some(fields) = obj.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let mut given = |field: &str, default: &str| -> Result<String, ApiError> {
        match fields.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(Value::String(s)) => return Ok(s.clone()),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "couldn't get version/kind; json parse error: {field} must be a string, got {other}"
                )));
            }
        }
        fields.insert(field.to_owned(), json!(default));
        Ok(default.to_owned())
    };
    let data_kind = given("kind", kind)?;
    let data_version = given("apiVersion", api_version)?;
    if data_kind == kind && data_version == api_version {
        return Ok(());
    }
    Err(ApiError::bad_request(mismatch(
        &data_version,
        &data_kind,
        api_version,
        kind,
    )))
}

/// Upstream's message for a body of `data_version`/`data_kind` sent to an endpoint of
/// `api_version`/`kind`:
/// - a kind this server knows in the body's version, the endpoint's kind in another version
///   (core and `events.k8s.io` Events): the decoder accepts it and the handler refuses its
///   version ("the API version in the data (…) does not match the expected API version (…)");
/// - another kind it knows: the conversion into the endpoint's type fails
///   ("Pod in version \"v1\" cannot be handled as a Node: converting (v1.Pod) to
///   (core.Node): unknown conversion");
/// - a pair it does not know: the scheme has no such type ("… cannot be handled as a Node:
///   no kind \"Node\" is registered for version \"apps/v1\" …").
fn mismatch(data_version: &str, data_kind: &str, api_version: &str, kind: &str) -> String {
    // `metav1.Status` is registered in the core group's v1 too (`AddToGroupVersion`).
    let known = (data_kind == "Status" && data_version == "v1")
        || ALL
            .iter()
            .any(|d| d.kind == data_kind && d.api_version() == data_version);
    let version = data_version.rsplit('/').next().unwrap_or(data_version);
    let cause = match (known, data_kind == kind) {
        (true, true) => {
            return format!(
                "the API version in the data ({data_version}) does not match the expected API version ({api_version})"
            );
        }
        (true, false) => {
            let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
            // events.k8s.io Events are core Events inside kube-apiserver.
            let package = group
                .split('.')
                .next()
                .filter(|p| !(p.is_empty() || (kind == "Event" && *p == "events")));
            format!(
                "converting ({version}.{data_kind}) to ({}.{kind}): unknown conversion",
                package.unwrap_or("core")
            )
        }
        (false, _) => format!(
            "no kind \"{data_kind}\" is registered for version \"{data_version}\" in scheme \"{SCHEME}\""
        ),
    };
    format!("{data_kind} in version \"{version}\" cannot be handled as a {kind}: {cause}")
}

#[cfg(test)]
mod tests {
    use super::*;

    // A `Status` sent where an object is due: the scheme knows v1 Status and has no
    // conversion to the endpoint's internal type (core for both Event APIs).
    #[test]
    fn a_status_body_is_a_failed_conversion() {
        assert_eq!(
            mismatch("v1", "Status", "v1", "Node"),
            "Status in version \"v1\" cannot be handled as a Node: converting (v1.Status) to (core.Node): unknown conversion"
        );
        assert_eq!(
            mismatch("v1", "Status", "events.k8s.io/v1", "Event"),
            "Status in version \"v1\" cannot be handled as a Event: converting (v1.Status) to (core.Event): unknown conversion"
        );
    }

    fn decode(mut body: Value, api_version: &str, kind: &str) -> Result<Value, String> {
        default_from_path(&mut body, api_version, kind)
            .map(|()| body)
            .map_err(|e| e.message)
    }

    /// Upstream's `gvkWithDefaults`: missing parts come from the endpoint.
    #[test]
    fn missing_kind_and_api_version_come_from_the_endpoint() {
        let body = decode(json!({"metadata": {"name": "n1"}}), "v1", "Node").unwrap();
        assert_eq!(body["kind"], "Node");
        assert_eq!(body["apiVersion"], "v1");
        let body = decode(
            json!({"kind": "", "apiVersion": null}),
            "rbac.authorization.k8s.io/v1",
            "Role",
        )
        .unwrap();
        assert_eq!(body["kind"], "Role");
        assert_eq!(body["apiVersion"], "rbac.authorization.k8s.io/v1");
        let body = decode(json!({"kind": "Lease"}), "coordination.k8s.io/v1", "Lease").unwrap();
        assert_eq!(body["apiVersion"], "coordination.k8s.io/v1");
    }

    #[test]
    fn a_different_pair_is_refused_as_upstream() {
        assert_eq!(
            decode(
                json!({"kind": "Event", "apiVersion": "events.k8s.io/v1"}),
                "v1",
                "Event"
            )
            .unwrap_err(),
            "the API version in the data (events.k8s.io/v1) does not match the expected API version (v1)"
        );
        assert_eq!(
            decode(json!({"kind": "Pod"}), "v1", "Node").unwrap_err(),
            "Pod in version \"v1\" cannot be handled as a Node: converting (v1.Pod) to (core.Node): unknown conversion"
        );
        assert_eq!(
            decode(
                json!({"kind": "Role", "apiVersion": "rbac.authorization.k8s.io/v1"}),
                "rbac.authorization.k8s.io/v1",
                "ClusterRole"
            )
            .unwrap_err(),
            "Role in version \"v1\" cannot be handled as a ClusterRole: converting (v1.Role) to (rbac.ClusterRole): unknown conversion"
        );
        assert_eq!(
            decode(json!({"apiVersion": "apps/v1"}), "v1", "Node").unwrap_err(),
            "Node in version \"v1\" cannot be handled as a Node: no kind \"Node\" is registered for version \"apps/v1\" in scheme \"pkg/api/legacyscheme/scheme.go:30\""
        );
        assert!(
            decode(json!({"kind": 3}), "v1", "Node")
                .unwrap_err()
                .contains("kind must be a string")
        );
        assert!(decode(json!([]), "v1", "Node").is_err());
    }
}
