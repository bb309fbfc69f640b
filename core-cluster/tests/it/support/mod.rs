//! Helpers shared by the controller tests (in-process API server, paused time).

#![allow(dead_code, unreachable_pub)]

use std::{future::Future, sync::Arc, time::Duration};

use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};
use kube::Client;

pub mod kubectl;

/// Sends one request through `router` (no TCP): its status, headers and body bytes.
pub async fn send(
    router: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<axum::body::Body>,
) -> (u16, axum::http::HeaderMap, bytes::Bytes) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut request = axum::http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = router
        .clone()
        .oneshot(request.body(body.into()).unwrap())
        .await
        .unwrap();
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (code, headers, bytes)
}

/// A client of a fresh in-memory API server, through its router (no TCP, so paused time works).
pub async fn client() -> Client {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    Client::new(server.router(), "default")
}

/// Polls `check` every 100ms (paused time) for up to `secs` seconds until it gives a value.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for _ in 0..secs * 10 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for: {what}");
}
