//! Field errors of validation: upstream's `k8s.io/apimachinery/pkg/util/validation/field`.

use serde_json::Value;

/// One field error of an `Invalid` (422) answer: upstream's `field.Error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueForbidden`, `FieldValueDuplicate`,
    /// `FieldValueNotSupported`, `FieldValueTooLong`.
    pub reason: &'static str,
    /// The field path, e.g. `metadata.name`.
    pub field: String,
    /// The message, e.g. `Invalid value: "A": a lowercase RFC 1123 subdomain must ...`.
    pub message: String,
}

impl FieldError {
    /// `Invalid value: <value>: <detail>`.
    pub fn invalid(field: impl Into<String>, value: &Value, detail: impl AsRef<str>) -> Self {
        FieldError {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: format!("Invalid value: {}: {}", value, detail.as_ref()),
        }
    }

    /// `Required value[: detail]`.
    pub fn required(field: impl Into<String>, detail: &str) -> Self {
        FieldError {
            reason: "FieldValueRequired",
            field: field.into(),
            message: if detail.is_empty() {
                "Required value".to_owned()
            } else {
                format!("Required value: {detail}")
            },
        }
    }

    /// `Forbidden: <detail>`.
    pub fn forbidden(field: impl Into<String>, detail: &str) -> Self {
        FieldError {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: format!("Forbidden: {detail}"),
        }
    }

    /// `Unsupported value: <value>: supported values: ...`.
    pub fn not_supported(field: impl Into<String>, value: &Value, supported: &[&str]) -> Self {
        let quoted: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
        FieldError {
            reason: "FieldValueNotSupported",
            field: field.into(),
            message: format!(
                "Unsupported value: {value}: supported values: {}",
                quoted.join(", ")
            ),
        }
    }

    /// `Duplicate value: <value>`.
    pub fn duplicate(field: impl Into<String>, value: &Value) -> Self {
        FieldError {
            reason: "FieldValueDuplicate",
            field: field.into(),
            message: format!("Duplicate value: {value}"),
        }
    }

    /// `Too long: may not be more than <max> bytes` (upstream's `field.TooLong`, whose value
    /// is never shown).
    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        FieldError {
            reason: "FieldValueTooLong",
            field: field.into(),
            message: format!(
                "Too long: may not be more than {max} {}",
                if max == 1 { "byte" } else { "bytes" }
            ),
        }
    }

    /// `<field>: <message>`, as the message of an `Invalid` answer lists it (upstream's
    /// `field.Error.Error()`).
    pub fn full(&self) -> String {
        format!("{}: {}", self.field, self.message)
    }
}
