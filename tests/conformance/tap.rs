//! A tap on the in-process API server: an axum middleware around core-cluster's router that
//! records every request (method, path, content type, body, paused-clock time) and can answer
//! chosen requests with an error instead of passing them on. Tests use it to see *how* a
//! controller writes (PUT or PATCH, which subresource) and to make API writes fail.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use parking_lot::Mutex;
use tokio::time::Instant;

/// One request seen by the tap.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) content_type: Option<String>,
    pub(crate) body: Vec<u8>,
    pub(crate) at: Instant,
    /// The status the tap answered with, when it failed the request itself.
    pub(crate) failed_with: Option<u16>,
}

impl Seen {
    /// The body as JSON (`Null` when empty or not JSON).
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Fails the next `remaining` requests with `method` on exactly `path`.
#[derive(Debug, Clone)]
struct Rule {
    method: Method,
    path: String,
    status: u16,
    reason: &'static str,
    remaining: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Tap {
    seen: Mutex<Vec<Seen>>,
    rules: Mutex<Vec<Rule>>,
    /// Every request fails with 503 (the client's process is gone).
    down: std::sync::atomic::AtomicBool,
    /// `true` while cut: open response bodies (watches) end when it turns `true`.
    cut_signal: tokio::sync::watch::Sender<bool>,
    /// Paths whose next watch is answered with an expired resource version.
    expire: Mutex<Vec<String>>,
}

impl Tap {
    /// A client of `server` whose every request goes through a new tap.
    pub(crate) fn client(server: &core_cluster::ApiServer) -> (kube::Client, Arc<Tap>) {
        let tap = Arc::new(Tap::default());
        let router = server
            .router()
            .layer(axum::middleware::from_fn_with_state(tap.clone(), handle));
        (kube::Client::new(router, "default"), tap)
    }

    /// Answers the next `times` `method` requests on `path` with `status` (a `Status` body
    /// with `reason`), without passing them to the API server.
    pub(crate) fn fail(
        &self,
        method: Method,
        path: &str,
        status: u16,
        reason: &'static str,
        times: usize,
    ) {
        self.rules.lock().push(Rule {
            method,
            path: path.to_owned(),
            status,
            reason,
            remaining: times,
        });
    }

    /// From now on every request of this client fails with 503 Service Unavailable without
    /// reaching the API server: the connections of a process that died.
    /// Open watches end too, as the connections of a dead peer do.
    pub(crate) fn cut(&self) {
        self.down.store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut_signal.send_replace(true);
    }

    /// Undoes [`cut`](Self::cut): requests reach the API server again.
    pub(crate) fn restore(&self) {
        self.cut_signal.send_replace(false);
        self.down.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answers the next watch on `path` as an API server that compacted the watch's resource
    /// version does: `200` and one `ERROR` event with status 410 Gone, so the client relists.
    pub(crate) fn expire_next_watch(&self, path: &str) {
        self.expire.lock().push(path.to_owned());
    }

    /// Every request so far, in order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().clone()
    }

    /// The requests that were writes (not GET), in order.
    pub(crate) fn writes(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method != Method::GET)
            .collect()
    }
}

async fn handle(State(tap): State<Arc<Tap>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let is_watch = parts
        .uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    let expired = is_watch && !tap.down.load(std::sync::atomic::Ordering::SeqCst) && {
        let mut expire = tap.expire.lock();
        let found = expire.iter().position(|p| *p == path);
        found.map(|i| expire.remove(i)).is_some()
    };
    let failure = if tap.down.load(std::sync::atomic::Ordering::SeqCst) {
        Some((503, "ServiceUnavailable"))
    } else {
        let mut rules = tap.rules.lock();
        rules
            .iter_mut()
            .find(|r| r.remaining > 0 && r.method == parts.method && r.path == path)
            .map(|r| {
                r.remaining -= 1;
                (r.status, r.reason)
            })
    };
    tap.seen.lock().push(Seen {
        method: parts.method.clone(),
        path: path.clone(),
        content_type: parts
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body: body.to_vec(),
        at: Instant::now(),
        failed_with: failure.map(|(status, _)| status),
    });
    if expired {
        let event = serde_json::json!({
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "too old resource version (injected by the test)",
                "reason": "Expired",
                "code": 410,
            },
        });
        return Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(Body::from(format!("{event}\n")))
            .unwrap_or_default();
    }
    if let Some((status, reason)) = failure {
        let status_body = serde_json::json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("injected by the test: {reason}"),
            "reason": reason,
            "code": status,
        });
        return Response::builder()
            .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .header("content-type", "application/json")
            .body(Body::from(status_body.to_string()))
            .unwrap_or_default();
    }
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    // The body (a watch's, above all) ends when the tap is cut.
    let (parts, body) = response.into_parts();
    let cut = tap.cut_signal.subscribe();
    let data = body.into_data_stream();
    let body = futures::stream::unfold((data, cut), |(mut data, mut cut)| async move {
        use futures::StreamExt;
        let item = tokio::select! {
            item = data.next() => item,
            _ = cut.wait_for(|cut| *cut) => None,
        };
        item.map(|item| (item, (data, cut)))
    });
    Response::from_parts(parts, Body::from_stream(body))
}
