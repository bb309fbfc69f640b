//! The four kinds of PATCH the API server accepts, on objects held as
//! [`serde_json::Value`] (the full JSON of a Kubernetes object, as stored).
//!
//! * [`json_patch`]: RFC 6902 JSON patch, with RFC 6901 pointers.
//! * [`merge_patch`]: RFC 7386 JSON merge patch.
//! * [`strategic`]: strategic merge patch, driven by the per-kind [`schema`].
//! * [`mod@apply`]: server-side apply and the `metadata.managedFields` bookkeeping that
//!   plain writes need too ([`apply::record_update`]).
//!
//! The request layer picks the kind with [`PatchType::from_content_type`] (answering
//! 415 Unsupported Media Type on `None`), decodes the body with [`decode_body`], and
//! calls [`patch_object`] or, for apply, [`fn@apply`]. Errors say which HTTP status
//! they stand for ([`PatchError::http_status`]).

pub mod apply;
pub mod json_patch;
pub mod limits;
pub mod merge_patch;
pub mod schema;
pub mod strategic;
pub mod yaml;

use std::sync::atomic::AtomicBool;

use serde_json::Value;

pub use apply::{
    ApplyError, FIELD_MANAGER_MAX_LENGTH, FieldSet, Updater, apply, manager_from_user_agent,
    record_update,
};
pub use schema::{ListStrategy, TypeNode, schema_for};

/// The patch formats, named by the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902).
    JsonPatch,
    /// `application/merge-patch+json` (RFC 7386).
    MergePatch,
    /// `application/strategic-merge-patch+json`.
    StrategicMergePatch,
    /// `application/apply-patch+yaml` (server-side apply; the body is YAML or JSON).
    ApplyPatch,
}

impl PatchType {
    /// The patch type for a `Content-Type` header value, ignoring parameters such as
    /// `; charset=utf-8` and letter case; `None` for anything else (answer 415).
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/json-patch+json" => Some(Self::JsonPatch),
            "application/merge-patch+json" => Some(Self::MergePatch),
            "application/strategic-merge-patch+json" => Some(Self::StrategicMergePatch),
            "application/apply-patch+yaml" => Some(Self::ApplyPatch),
            _ => None,
        }
    }

    /// The canonical media type.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::JsonPatch => "application/json-patch+json",
            Self::MergePatch => "application/merge-patch+json",
            Self::StrategicMergePatch => "application/strategic-merge-patch+json",
            Self::ApplyPatch => "application/apply-patch+yaml",
        }
    }
}

/// Why a patch could not be decoded or applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// The body is not valid JSON (or YAML, for apply). HTTP 400.
    #[error("the body of the request could not be decoded: {0}")]
    Decode(String),
    /// An apply body that is neither JSON nor YAML. HTTP 400.
    #[error("error decoding YAML: {0}")]
    Yaml(String),
    /// The patch document is not a valid patch of its type: an unknown JSON patch op,
    /// a bad pointer, an unknown or malformed strategic merge directive. HTTP 400.
    #[error("invalid patch: {0}")]
    Malformed(String),
    /// The patch is well formed but does not apply to this object: a failed `test`,
    /// a path that does not exist, a list element without its merge key. HTTP 422.
    #[error("the patch could not be applied: {0}")]
    Unprocessable(String),
    /// The patch is larger than the server accepts (too many JSON patch operations).
    /// HTTP 413.
    #[error("{0}")]
    TooLarge(String),
}

impl PatchError {
    /// The HTTP status the API server answers with for this error.
    pub fn http_status(&self) -> u16 {
        match self {
            PatchError::Decode(_) | PatchError::Yaml(_) | PatchError::Malformed(_) => 400,
            PatchError::Unprocessable(_) => 422,
            PatchError::TooLarge(_) => 413,
        }
    }
}

/// A value as a map key: its compact JSON. Object members serialize in sorted order, so two
/// values give the same key exactly when they are equal; patches use it to find list
/// elements by merge key or by value in a map instead of scanning the list.
pub(crate) fn id_key(value: &Value) -> String {
    value.to_string()
}

/// Decodes a PATCH body. JSON for every type; for [`PatchType::ApplyPatch`] YAML as
/// well (JSON is tried first, since it is by far the most common and is valid YAML), with
/// YAML's costs bounded ([`yaml::decode`]).
pub fn decode_body(patch_type: PatchType, body: &[u8]) -> Result<Value, PatchError> {
    decode_body_cancellable(patch_type, body, &AtomicBool::new(false))
}

/// [`decode_body`] that stops decoding YAML once `cancelled` is set (the request was
/// abandoned).
pub fn decode_body_cancellable(
    patch_type: PatchType,
    body: &[u8],
    cancelled: &AtomicBool,
) -> Result<Value, PatchError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(_) if patch_type == PatchType::ApplyPatch => {
            yaml::decode(body, cancelled).map_err(|e| match e {
                // kube-apiserver's words (`sigs.k8s.io/yaml` `YAMLToJSON` under the patch
                // handler's "error decoding YAML").
                yaml::YamlError::Syntax(go) => {
                    PatchError::Yaml(format!("error converting YAML to JSON: {go}"))
                }
                other => PatchError::Decode(format!("invalid YAML: {other}")),
            })
        }
        Err(e) => Err(PatchError::Decode(format!("invalid JSON: {e}"))),
    }
}

/// Applies a JSON, merge or strategic merge patch to `original` and returns the
/// patched object. `schema` is used by strategic merge patch only.
///
/// Server-side apply needs a field manager and ownership bookkeeping, so it goes
/// through [`fn@apply`]; passing [`PatchType::ApplyPatch`] here is an error.
pub fn patch_object(
    original: &Value,
    patch_type: PatchType,
    patch: &Value,
    schema: &TypeNode,
) -> Result<Value, PatchError> {
    match patch_type {
        PatchType::JsonPatch => json_patch::json_patch(original, patch),
        PatchType::MergePatch => {
            if !patch.is_object() {
                return Err(PatchError::Malformed(
                    "a merge patch of an object must be a JSON object".into(),
                ));
            }
            let mut out = original.clone();
            merge_patch::merge_patch(&mut out, patch);
            Ok(out)
        }
        PatchType::StrategicMergePatch => strategic::strategic_merge(original, patch, schema),
        PatchType::ApplyPatch => Err(PatchError::Malformed(
            "server-side apply needs a field manager: use apply::apply".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_types_map_to_patch_types() {
        assert_eq!(
            PatchType::from_content_type("application/json-patch+json"),
            Some(PatchType::JsonPatch)
        );
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::MergePatch)
        );
        assert_eq!(
            PatchType::from_content_type("Application/Strategic-Merge-Patch+JSON"),
            Some(PatchType::StrategicMergePatch)
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            Some(PatchType::ApplyPatch)
        );
        assert_eq!(PatchType::from_content_type("application/json"), None);
        assert_eq!(PatchType::from_content_type("application/yaml"), None);
        for t in [
            PatchType::JsonPatch,
            PatchType::MergePatch,
            PatchType::StrategicMergePatch,
            PatchType::ApplyPatch,
        ] {
            assert_eq!(PatchType::from_content_type(t.content_type()), Some(t));
        }
    }

    #[test]
    fn apply_bodies_may_be_yaml_others_must_be_json() {
        let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: \"1\"\n";
        let v = decode_body(PatchType::ApplyPatch, yaml).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"},"data":{"a":"1"}})
        );
        let v = decode_body(PatchType::ApplyPatch, br#"{"kind":"ConfigMap"}"#).unwrap();
        assert_eq!(v, json!({"kind":"ConfigMap"}));
        let err = decode_body(PatchType::MergePatch, yaml).unwrap_err();
        assert_eq!(err.http_status(), 400);
        let err = decode_body(PatchType::ApplyPatch, b"a: [unclosed").unwrap_err();
        assert!(matches!(err, PatchError::Yaml(_)), "{err:?}");
        assert_eq!(err.http_status(), 400);
        assert!(
            err.to_string()
                .starts_with("error decoding YAML: error converting YAML to JSON: yaml: "),
            "{err}"
        );
    }

    #[test]
    fn patch_object_dispatches_by_type() {
        let node = json!({"kind":"Node","spec":{"unschedulable":true,"taints":[{"key":"a"}]}});
        let schema = schema_for("", "Node");
        let cordoned = patch_object(
            &json!({"kind":"Node","spec":{}}),
            PatchType::MergePatch,
            &json!({"spec":{"unschedulable":true}}),
            schema,
        )
        .unwrap();
        assert_eq!(
            cordoned,
            json!({"kind":"Node","spec":{"unschedulable":true}})
        );
        let out = patch_object(
            &node,
            PatchType::MergePatch,
            &json!({"spec":{"unschedulable":null}}),
            schema,
        )
        .unwrap();
        assert_eq!(out, json!({"kind":"Node","spec":{"taints":[{"key":"a"}]}}));
        let out = patch_object(
            &node,
            PatchType::JsonPatch,
            &json!([{"op":"remove","path":"/spec/taints/0"}]),
            schema,
        )
        .unwrap();
        assert_eq!(
            out,
            json!({"kind":"Node","spec":{"unschedulable":true,"taints":[]}})
        );
        let err = patch_object(&node, PatchType::MergePatch, &json!([1]), schema).unwrap_err();
        assert_eq!(err.http_status(), 400);
        let err = patch_object(&node, PatchType::ApplyPatch, &json!({}), schema).unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)));
    }
}
