//! YAML answers: when a client's first choice is `application/yaml` (curl, scripts, the
//! conformance suite's raw requests), the handlers run as for JSON and their answer is
//! written as YAML, with the content type's `json` turned into `yaml` (`application/yaml`,
//! `application/yaml;as=Table;v=v1;g=meta.k8s.io`), as kube-apiserver's YAML serializer
//! does (`sigs.k8s.io/yaml` `JSONToYAML`, keys in order). Watches have no YAML stream
//! (negotiation refuses them before this layer matters), and answers that are not JSON
//! (logs, proxied bodies) pass through.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, header},
    middleware::Next,
    response::Response,
};
use serde_json::Value;

use crate::api::{ServerState, negotiate};

/// The YAML middleware (see the [module](self) docs).
pub(crate) async fn codec(
    State(_): State<Arc<ServerState>>,
    mut request: Request,
    next: Next,
) -> Response {
    if !negotiate::prefers_yaml(request.headers()) {
        return next.run(request).await;
    }
    let accept: Vec<String> = request
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.replace("application/yaml", "application/json"))
        .collect();
    if let Ok(value) = HeaderValue::from_str(&accept.join(",")) {
        request.headers_mut().insert(header::ACCEPT, value);
    }
    let response = next.run(request).await;
    to_yaml(response).await
}

/// The answer as YAML, if it is a JSON document of a known length.
async fn to_yaml(response: Response) -> Response {
    let Some(content_type) = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|ct| ct.starts_with("application/json"))
        .map(|ct| ct.replacen("application/json", "application/yaml", 1))
    else {
        return response;
    };
    let (mut parts, bytes) = match super::buffered(response).await {
        Ok(whole) => whole,
        Err(response) => return response,
    };
    let Ok(value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let Ok(yaml) = serde_norway::to_string(&value) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Ok(ct) = HeaderValue::from_str(&content_type) {
        parts.headers.insert(header::CONTENT_TYPE, ct);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(yaml))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::{http::StatusCode, response::IntoResponse};

    #[tokio::test]
    async fn json_answers_become_yaml_with_the_content_type_of_yaml() {
        let body = serde_json::to_vec(&serde_json::json!({
            "kind": "ConfigMap", "apiVersion": "v1",
            "metadata": {"name": "a"}, "data": {"k": "v"}
        }))
        .unwrap();
        let mut response = (StatusCode::OK, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let out = to_yaml(response).await;
        assert_eq!(out.headers()[header::CONTENT_TYPE], "application/yaml");
        let bytes = axum::body::to_bytes(out.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        assert!(text.contains("kind: ConfigMap\n"), "{text}");
        assert!(text.contains("data:\n  k: v\n"), "{text}");
    }

    #[tokio::test]
    async fn answers_that_are_not_json_pass_through() {
        let mut response = (StatusCode::OK, "log line\n").into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        let out = to_yaml(response).await;
        assert_eq!(out.headers()[header::CONTENT_TYPE], "text/plain");
    }
}
