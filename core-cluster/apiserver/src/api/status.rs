//! API errors, answered as `meta/v1 Status` objects shaped exactly like kube-apiserver's.

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

pub use crate::storage::status::{ApiError, MAX_CAUSES, Qualified, success_status};

pub use crate::registry::FieldError;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        let mut response = (code, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn not_found_matches_upstream() {
        let e = ApiError::not_found(&Qualified::new("coordination.k8s.io", "leases", "n1"));
        assert_eq!(
            e.to_status(),
            json!({
                "kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                "message":"leases.coordination.k8s.io \"n1\" not found","reason":"NotFound",
                "details":{"name":"n1","group":"coordination.k8s.io","kind":"leases"},"code":404
            })
        );
    }

    #[test]
    fn conflict_message_matches_upstream() {
        let e = ApiError::modified(&Qualified::new("", "nodes", "n1"));
        assert_eq!(e.code, 409);
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again"
        );
    }

    #[test]
    fn invalid_lists_causes() {
        let e = ApiError::invalid(
            "Node",
            "",
            "Bad",
            vec![FieldError::invalid(
                "metadata.name",
                &json!("Bad"),
                "must be lowercase",
            )],
        );
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Node \"Bad\" is invalid: metadata.name: Invalid value: \"Bad\": must be lowercase"
        );
        assert_eq!(e.details.unwrap()["causes"][0]["field"], "metadata.name");
    }

    /// A thousand field errors make an answer of a hundred causes that says how many more
    /// there were, not one of a thousand.
    #[test]
    fn invalid_lists_at_most_a_hundred_causes() {
        let errors = (0..1000)
            .map(|i| FieldError::required(format!("spec.containers[{i}].name"), ""))
            .collect();
        let e = ApiError::invalid("Pod", "", "p", errors);
        let causes = e.details.as_ref().unwrap()["causes"].as_array().unwrap();
        assert_eq!(causes.len(), MAX_CAUSES);
        assert_eq!(causes[99]["field"], "spec.containers[99].name");
        assert!(
            e.message.ends_with(", and 900 more errors]"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("containers[100]"));
        assert!(e.message.len() < 6000, "{} bytes", e.message.len());
    }
}
