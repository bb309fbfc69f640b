//! The middleware that applies the codec around every request: protobuf request bodies
//! become JSON before the handlers run, and JSON answers become protobuf when the client
//! asked for it first.

use std::sync::Arc;

use axum::{
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use serde_json::Value;
#[cfg(test)]
use serde_json::json;

use super::{CONTENT_TYPE, ProtobufError, WATCH_CONTENT_TYPE, encode_object, encode_watch_frame};
use crate::api::{ServerState, negotiate, status::ApiError};

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
    /// [`encode_answer`] encodes a handler's value directly, sparing the JSON round trip.
    static WANTED: Wanted;
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
    State(state): State<Arc<ServerState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let wanted = negotiate::prefers_protobuf(request.headers()).map(|json_fallback| Wanted {
        json_fallback,
        watch: is_watch(request.uri()),
    });
    if wanted.is_some() {
        // The handlers answer in JSON; this layer encodes their answer.
        request
            .headers_mut()
            .insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    }
    let response = match (
        decode_request(request, state.config.max_request_bytes).await,
        wanted,
    ) {
        (Ok(request), Some(wanted)) => WANTED.scope(wanted, next.run(request)).await,
        (Ok(request), None) => next.run(request).await,
        (Err(e), _) => e.into_response(),
    };
    match wanted {
        Some(wanted) => encode_response(wanted, response).await,
        None => response,
    }
}

fn is_watch(uri: &axum::http::Uri) -> bool {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(uri.query().unwrap_or("")).unwrap_or_default();
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "watch")
        .is_some_and(|(_, v)| v == "true" || v == "1")
}

fn is_protobuf(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| negotiate::media_type(ct) == CONTENT_TYPE)
}

/// A protobuf body (of anything but a PATCH, whose body is a patch document) decoded to
/// JSON, with the request's `Content-Type` saying so.
async fn decode_request(request: Request, limit: usize) -> Result<Request, ApiError> {
    if request.method() == Method::PATCH || !is_protobuf(request.headers()) {
        return Ok(request);
    }
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
/// JSON.
async fn encode_response(wanted: Wanted, response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct == "application/json");
    if !is_json {
        return response;
    }
    if wanted.watch && response.status() == StatusCode::OK {
        return watch_stream(response);
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::internal("reading the response failed").into_response();
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

/// The JSON watch stream (one `{"type","object"}` line per event) as protobuf frames.
fn watch_stream(response: Response) -> Response {
    let (mut parts, body) = response.into_parts();
    let mut pending: Vec<u8> = Vec::new();
    let frames = body
        .into_data_stream()
        .map(move |chunk| {
            let chunk = chunk?;
            pending.extend_from_slice(&chunk);
            let mut out = Vec::new();
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                out.extend(watch_frame(&line));
            }
            Ok::<_, axum::Error>(Bytes::from(out))
        })
        .filter(|frame| futures::future::ready(frame.as_ref().map_or(true, |b| !b.is_empty())));
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(WATCH_CONTENT_TYPE),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from_stream(frames))
}

/// One JSON watch line as a frame; an event that cannot be encoded becomes an `ERROR`
/// event with a 500 `Status`, as upstream reports a failed encoding mid-stream.
fn watch_frame(line: &[u8]) -> Vec<u8> {
    let event: Value = serde_json::from_slice(line).unwrap_or(Value::Null);
    let event_type = event["type"].as_str().unwrap_or("ERROR");
    encode_watch_frame(event_type, &event["object"]).unwrap_or_else(|e| {
        tracing::error!(error = %e, "encoding a watch event as protobuf");
        let status = ApiError::internal(format!("encoding a watch event as protobuf: {e}"));
        encode_watch_frame("ERROR", &status.to_status()).unwrap_or_default()
    })
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

    /// Mid-stream errors travel as `ERROR` events with a `Status` (upstream's watch
    /// server); an event that cannot be encoded becomes one with a 500 rather than
    /// ending the stream silently.
    #[test]
    fn watch_errors_are_status_events() {
        use k8s_pb::apimachinery::pkg::apis::meta::v1::{Status, WatchEvent};
        use prost::Message;

        fn open(frame: &[u8]) -> (String, Status) {
            let event = WatchEvent::decode(&frame[4..]).expect("a WatchEvent");
            let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
            let unknown =
                k8s_pb::apimachinery::pkg::runtime::Unknown::decode(&raw[4..]).expect("envelope");
            let status =
                Status::decode(unknown.raw.unwrap_or_default().as_slice()).expect("Status");
            (event.r#type.unwrap_or_default(), status)
        }

        let expired = ApiError::expired("too old resource version: 1 (5)").to_status();
        let line = json!({"type": "ERROR", "object": expired}).to_string();
        let (kind, status) = open(&watch_frame(line.as_bytes()));
        assert_eq!(kind, "ERROR");
        assert_eq!(
            (status.code, status.reason.as_deref()),
            (Some(410), Some("Expired"))
        );

        let bad = json!({"type": "ADDED", "object": {"apiVersion": "v1", "kind": "ConfigMap",
                                                     "metadata": {"name": 7}}});
        let (kind, status) = open(&watch_frame(bad.to_string().as_bytes()));
        assert_eq!(kind, "ERROR");
        assert_eq!(status.code, Some(500));
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
