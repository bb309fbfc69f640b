//! TEMPORARY shim until the patch module lands: merge and JSON patch only.

use serde_json::Value;

/// Patch content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 6902.
    JsonPatch,
    /// RFC 7386.
    MergePatch,
    /// Strategic merge patch.
    StrategicMergePatch,
    /// Server-side apply.
    ApplyPatch,
}

impl PatchType {
    /// From a Content-Type.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct {
            "application/json-patch+json" => Some(PatchType::JsonPatch),
            "application/merge-patch+json" => Some(PatchType::MergePatch),
            "application/strategic-merge-patch+json" => Some(PatchType::StrategicMergePatch),
            "application/apply-patch+yaml" => Some(PatchType::ApplyPatch),
            _ => None,
        }
    }
}

/// Schema placeholder.
#[derive(Debug)]
pub struct TypeNode;

static GENERIC: TypeNode = TypeNode;

/// Schema for a kind.
pub fn schema_for(_group: &str, _kind: &str) -> &'static TypeNode {
    &GENERIC
}

/// Patch errors.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// Malformed.
    #[error("{0}")]
    Malformed(String),
    /// Invalid.
    #[error("{0}")]
    Invalid(String),
    /// Apply conflict.
    #[error("{message}")]
    Conflict {
        /// Message.
        message: String,
        /// Causes.
        causes: Vec<(String, String)>,
    },
}

/// Parses a patch body.
pub fn parse_patch_body(_t: PatchType, body: &[u8]) -> Result<Value, PatchError> {
    serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))
}

/// Applies a non-apply patch.
pub fn patch(t: PatchType, current: &Value, doc: &Value, _schema: &TypeNode) -> Result<Value, PatchError> {
    let mut out = current.clone();
    match t {
        PatchType::JsonPatch => {
            let p: json_patch::Patch = serde_json::from_value(doc.clone()).map_err(|e| PatchError::Malformed(e.to_string()))?;
            json_patch::patch(&mut out, &p).map_err(|e| PatchError::Invalid(e.to_string()))?;
        }
        _ => json_patch::merge(&mut out, doc),
    }
    Ok(out)
}

/// Server-side apply.
pub fn apply(live: Option<&Value>, applied: &Value, _manager: &str, _force: bool, _schema: &TypeNode, _now: &str) -> Result<Value, PatchError> {
    let mut out = live.cloned().unwrap_or(Value::Object(Default::default()));
    json_patch::merge(&mut out, applied);
    Ok(out)
}

/// Records a manager.
pub fn record_update(_obj: &mut Value, _old: Option<&Value>, _manager: &str, _operation: &str, _now: &str) {}
