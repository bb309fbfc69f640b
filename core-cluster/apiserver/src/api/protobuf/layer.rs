//! The middleware that applies the codec around every request: JSON answers become
//! protobuf when the client asked for it first ([`codec`], outermost), and protobuf request
//! bodies become JSON before the handlers run ([`decode`], after authorization and only for
//! paths that name a served resource).

use std::sync::Arc;

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use serde_json::Value;
#[cfg(test)]
use serde_json::json;

use super::{CONTENT_TYPE, ProtobufError, encode_object};
use crate::api::{Parsed, ServerState, negotiate, parse_path, status::ApiError};

/// What the client's Accept header asked of the answer.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    /// Whether JSON is acceptable when the answer has no protobuf form.
    json_fallback: bool,
    /// Whether the request is a watch.
    watch: bool,
}

tokio::task_local! {
    /// Set while a request whose client wants protobuf answers runs, so that
    /// [`encode_answer`] encodes a handler's value directly, sparing the JSON round trip,
    /// and a watch frames its events in protobuf itself.
    static WANTED: Wanted;
}

/// Marks a response whose body is a stream already in the form the client asked for (a
/// watch): the codec passes it through and never reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Streamed;

/// `Some(json_fallback)` while a request whose client wants protobuf answers runs (see
/// [`encode_answer`]); `json_fallback` says whether plain JSON is acceptable too.
pub(crate) fn wanted() -> Option<bool> {
    WANTED.try_with(|w| w.json_fallback).ok()
}

/// The handler's answer in protobuf, if the request being served asked for it first and the
/// value is an object with a protobuf form; `None` leaves it to JSON (and to the
/// middleware's fallback rules).
pub(crate) fn encode_answer(code: StatusCode, value: &Value) -> Option<Response> {
    let wanted = WANTED.try_with(|w| *w).ok()?;
    if wanted.watch {
        return None;
    }
    let bytes = encode_object(value).ok()?;
    let mut response = (code, bytes).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    Some(response)
}

/// The codec middleware (see the [module](super) docs).
pub(crate) async fn codec(
    State(_): State<Arc<ServerState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let wanted = negotiate::prefers_protobuf(request.headers()).map(|json_fallback| Wanted {
        json_fallback,
        watch: crate::api::watch_requested(request.uri()),
    });
    let Some(wanted) = wanted else {
        return next.run(request).await;
    };
    // The handlers answer in JSON; this layer encodes their answer.
    request
        .headers_mut()
        .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    let response = WANTED.scope(wanted, next.run(request)).await;
    encode_response(wanted, response).await
}

/// Decodes a protobuf request body to JSON (see [`decode_request`]), once the request is
/// authorized and its path names a served resource: a path that names none is answered
/// 404 by the router whatever its body, as upstream routes before it decodes.
pub(crate) async fn decode(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::PATCH
        || !is_protobuf(request.headers())
        || !names_a_resource(&state, request.uri().path())
    {
        return next.run(request).await;
    }
    match decode_request(request, state.config.max_request_bytes).await {
        Ok(request) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Whether `path` is a served resource or one of its served subresources.
fn names_a_resource(state: &ServerState, path: &str) -> bool {
    match parse_path(&state.registry, path) {
        Parsed::Resource(target) => match target.subresource.as_deref() {
            None => true,
            Some("status") => target.def.status,
            Some(sub) => target.def.extra_subresources.contains(&sub),
        },
        Parsed::Discovery(_) | Parsed::NotFound => false,
    }
}

fn is_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| negotiate::media_type(ct) == CONTENT_TYPE)
}

/// A protobuf body decoded to JSON, with the request's `Content-Type` saying so.
async fn decode_request(request: Request, limit: usize) -> Result<Request, ApiError> {
    let (mut parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(limit))?;
    let json = if bytes.is_empty() {
        bytes
    } else {
        let object = super::decode_object(&bytes).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as {CONTENT_TYPE}: {e}"
            ))
        })?;
        Bytes::from(serde_json::to_vec(&object).unwrap_or_default())
    };
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Ok(Request::from_parts(parts, Body::from(json)))
}

/// The handler's JSON answer in protobuf, if it is a Kubernetes object that has a
/// protobuf form; otherwise JSON when the client accepts it, or 406 (upstream's answer for
/// a kind without protobuf, such as a custom resource). Answers that are not objects stay
/// JSON. Only answers already whole in memory are read: a stream ([`Streamed`], or any body
/// whose length is not known) passes through untouched, so nothing endless is buffered.
async fn encode_response(wanted: Wanted, response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct == "application/json");
    if !is_json || response.extensions().get::<Streamed>().is_some() {
        return response;
    }
    let (mut parts, bytes) = match crate::api::buffered(response).await {
        Ok(whole) => whole,
        Err(response) => return response,
    };
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if value.get("kind").is_none() {
        // Not a Kubernetes object (`/version`'s version.Info, the OpenAPI documents):
        // upstream writes these as raw JSON whatever the Accept header says.
        return Response::from_parts(parts, Body::from(bytes));
    }
    match encode_object(&value) {
        Ok(encoded) => {
            parts
                .headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(encoded))
        }
        Err(_) if wanted.json_fallback => Response::from_parts(parts, Body::from(bytes)),
        Err(ProtobufError::NoMessage { api_version, kind }) => {
            let accept = format!("{CONTENT_TYPE} (for {api_version} {kind})");
            let error = ApiError::not_acceptable(&accept).to_status();
            protobuf_status(StatusCode::NOT_ACCEPTABLE, &error)
        }
        Err(e) => {
            let key = value["metadata"]["name"].as_str().unwrap_or("");
            tracing::error!(name = key, error = %e, "encoding an answer as protobuf");
            let error = ApiError::internal(format!("encoding the answer as protobuf: {e}"));
            protobuf_status(StatusCode::INTERNAL_SERVER_ERROR, &error.to_status())
        }
    }
}

/// A `Status` answer in protobuf (JSON if even that fails, which a Status cannot).
fn protobuf_status(code: StatusCode, status: &Value) -> Response {
    match encode_object(status) {
        Ok(bytes) => {
            let mut response = (code, bytes).into_response();
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            response
        }
        Err(_) => (code, axum::Json(status.clone())).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(value: Value) -> Response {
        let mut response = (StatusCode::OK, value.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }

    /// Handlers' values are encoded straight to protobuf only while a request that asked
    /// for it runs; anything without a protobuf form is left to JSON.
    #[tokio::test]
    async fn handlers_answer_in_protobuf_only_for_a_request_that_asked() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}});
        assert!(encode_answer(StatusCode::OK, &node).is_none());
        let wanted = Wanted {
            json_fallback: true,
            watch: false,
        };
        let (answer, version) = WANTED
            .scope(wanted, async {
                (
                    encode_answer(StatusCode::CREATED, &node),
                    encode_answer(StatusCode::OK, &json!({"major": "1"})),
                )
            })
            .await;
        let answer = answer.expect("a protobuf answer");
        assert_eq!(answer.status(), StatusCode::CREATED);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert!(version.is_none());
    }

    /// Upstream answers an Accept of protobuf alone with 406 for a kind that has no
    /// protobuf form (a custom resource), and with JSON when JSON is also acceptable.
    #[tokio::test]
    async fn a_kind_without_protobuf_is_json_or_406() {
        let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {}});
        let only = Wanted {
            json_fallback: false,
            watch: false,
        };
        let answer = encode_response(only, json(widget.clone())).await;
        assert_eq!(answer.status(), StatusCode::NOT_ACCEPTABLE);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let either = Wanted {
            json_fallback: true,
            watch: false,
        };
        let answer = encode_response(either, json(widget)).await;
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "application/json");
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}});
        let answer = encode_response(only, json(node)).await;
        assert_eq!(answer.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
    }
}
