//! The errors of every layer, answered as `meta/v1 Status` objects shaped exactly like
//! kube-apiserver's (upstream's `k8s.io/apimachinery/pkg/api/errors`, which the generic
//! registry store returns and the handlers answer unchanged). The HTTP rendering is
//! [`crate::api::status`]'s.

use serde_json::{Value, json};

use crate::{registry::FieldError, store::StoreError};

/// The resource an error is about: group, plural, and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Qualified {
    /// API group, empty for core.
    pub group: String,
    /// Plural resource name (upstream puts it in `details.kind`).
    pub resource: String,
    /// Object name.
    pub name: String,
}

impl Qualified {
    /// A qualified resource.
    pub fn new(group: &str, resource: &str, name: &str) -> Self {
        Qualified {
            group: group.to_owned(),
            resource: resource.to_owned(),
            name: name.to_owned(),
        }
    }

    /// `nodes` or `leases.coordination.k8s.io`.
    fn resource_name(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self) -> Value {
        let mut d = json!({ "name": self.name, "kind": self.resource });
        if !self.group.is_empty() {
            d["group"] = json!(self.group);
        }
        d
    }
}

/// How many field errors an `Invalid` answer lists; the rest are counted in its message.
pub const MAX_CAUSES: usize = 100;

/// An error answer of the API server.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Upstream's `StatusReason`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details`, if any.
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 404 `<resource> "<name>" not found`.
    pub fn not_found(q: &Qualified) -> Self {
        ApiError {
            details: Some(q.details()),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{}\" not found", q.resource_name(), q.name),
            )
        }
    }

    /// 404 for a path that names no resource.
    pub fn no_route(path: &str) -> Self {
        // kube-apiserver's `errors.NewGenericServerResponse(404, ...)` names nothing: the
        // path goes to the log only.
        tracing::debug!(%path, "no route");
        ApiError {
            details: Some(json!({})),
            ..Self::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    }

    /// 409 `<resource> "<name>" already exists`.
    pub fn already_exists(q: &Qualified) -> Self {
        ApiError {
            details: Some(q.details()),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{}\" already exists", q.resource_name(), q.name),
            )
        }
    }

    /// 409 `Operation cannot be fulfilled on <resource> "<name>": <why>`.
    pub fn conflict(q: &Qualified, why: &str) -> Self {
        ApiError {
            details: Some(q.details()),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{}\": {why}",
                    q.resource_name(),
                    q.name
                ),
            )
        }
    }

    /// 409 for a stale resourceVersion, with upstream's exact wording.
    pub fn modified(q: &Qualified) -> Self {
        Self::conflict(
            q,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `<Kind> "<name>" is invalid: <field errors>` with causes: the first
    /// [`MAX_CAUSES`], and how many more in the message, so a body with many bad elements
    /// does not make an answer many times its size.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: Vec<FieldError>) -> Self {
        let qualified_kind = if group.is_empty() {
            kind.to_owned()
        } else {
            format!("{kind}.{group}")
        };
        let shown = &errors[..errors.len().min(MAX_CAUSES)];
        let more = errors.len() - shown.len();
        let summary = match shown {
            [one] => one.full(),
            many => {
                let mut listed = many
                    .iter()
                    .map(FieldError::full)
                    .collect::<Vec<_>>()
                    .join(", ");
                if more > 0 {
                    listed.push_str(&format!(", and {more} more errors"));
                }
                format!("[{listed}]")
            }
        };
        let causes: Vec<Value> = shown
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        let mut details = json!({ "kind": kind, "causes": causes });
        // Go's `StatusDetails.Name` is `omitempty`: an options error names no object.
        if !name.is_empty() {
            details["name"] = json!(name);
        }
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError {
            details: Some(details),
            ..Self::new(
                422,
                "Invalid",
                format!("{qualified_kind} \"{name}\" is invalid: {summary}"),
            )
        }
    }

    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 403.
    pub fn forbidden(q: &Qualified, why: &str) -> Self {
        ApiError {
            details: Some(q.details()),
            ..Self::new(
                403,
                "Forbidden",
                format!("{} \"{}\" is forbidden: {why}", q.resource_name(), q.name),
            )
        }
    }

    /// 405 with its own message and the resource in the details: upstream's
    /// `errors.NewMethodNotSupported` with the message replaced, as
    /// `customresource_handler.go serveResource` answers a create while the definition is
    /// terminating.
    pub fn method_not_supported(group: &str, resource: &str, message: impl Into<String>) -> Self {
        let mut details = json!({ "kind": resource });
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        ApiError {
            details: Some(details),
            ..Self::new(405, "MethodNotAllowed", message)
        }
    }

    /// 405 for a method a resource's path does not serve at all (a `GET` of a review, which
    /// is create-only): go-restful's 405 as kube-apiserver's `serviceErrorHandler` writes it
    /// (`NewGenericServerResponse`), which `kubectl` shows as "the server does not allow this
    /// method on the requested resource".
    pub fn method_not_served() -> Self {
        ApiError {
            details: Some(json!({})),
            ..Self::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            )
        }
    }

    /// 503 `ServiceUnavailable` with a message (a backend such as a kubelet unreachable).
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// The error a backend (a kubelet) answered with `code` and `message`, as
    /// `k8s.io/apimachinery/pkg/api/errors NewGenericServerResponse` turns it into a Status:
    /// the reason follows the code, the message is the backend's.
    pub fn from_backend(code: u16, message: impl Into<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            422 => "Invalid",
            429 => "TooManyRequests",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        let code = if (400..600).contains(&code) {
            code
        } else {
            500
        };
        Self::new(code, reason, message)
    }

    /// 410 Expired.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 413 with a message: a patch or the object it makes is larger than the server
    /// stores.
    pub fn entity_too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }

    /// 415 for an unsupported body content type, worded as upstream.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/vnd.kubernetes.protobuf (not for PATCH), application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 415 for a content type the resource does not take, naming those it does, worded as
    /// upstream's `negotiation.NewUnsupportedMediaTypeError`.
    pub fn unsupported_media_type_of(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 406 for an Accept header we cannot serve.
    pub fn not_acceptable(accept: &str) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {accept:?})"
            ),
        )
    }

    /// 504 for a resourceVersion newer than the store's.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        ApiError {
            details: Some(json!({
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1
            })),
            ..Self::new(
                504,
                "Timeout",
                format!("Too large resource version: {requested}, current: {current}"),
            )
        }
    }

    /// 401 `Unauthorized`, as kube-apiserver answers a request whose credentials are missing
    /// or refused (the reason is never told to the client).
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// A store error on the object `q`.
    pub fn from_store(q: &Qualified, err: StoreError) -> Self {
        match err {
            StoreError::NotFound { .. } => Self::not_found(q),
            StoreError::AlreadyExists { .. } => Self::already_exists(q),
            StoreError::Conflict { .. } => Self::modified(q),
            StoreError::Expired {
                requested,
                oldest_available,
            } => Self::expired(format!(
                "too old resource version: {requested} ({oldest_available})"
            )),
            StoreError::FutureRevision { requested, current } => {
                Self::too_large_resource_version(requested, current)
            }
            other => Self::internal(format!("storage error: {other}")),
        }
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// A `Status` of success, as DELETE returns for an object removed at once.
pub fn success_status(q: &Qualified, uid: Option<&str>) -> Value {
    let mut details = q.details();
    if let Some(uid) = uid {
        details["uid"] = json!(uid);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    })
}
