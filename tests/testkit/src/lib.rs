//! What the workspace's tests and benchmarks share, written once.
//!
//! - [`eventually`]: poll a condition on tokio's clock (paused time works);
//! - [`memory_server`], [`client`], [`send`]: an in-memory API server and ways to reach it
//!   without TCP;
//! - [`TestServer`]: the same API server over TLS on a loopback port, with its PKI;
//! - [`kubectl`]: the machine's kubectl against a test server, and [`kubectl::require_kubectl`];
//! - [`free_port`]: a loopback port nothing listens on;
//! - [`etcd`]: real etcd servers and clusters on loopback for the etcd backend's tests;
//! - [`bench`](mod@bench): the benchmarks' command-line arguments (`-- --nodes 10000`).
//!
//! A dev-dependency only: no library crate of the workspace may depend on it.

use std::{future::Future, sync::Arc, time::Duration};

use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};

pub mod bench;
pub mod etcd;
pub mod kubectl;
mod tls;

pub use tls::TestServer;

/// Polls `check` every 100 ms of tokio time for up to `secs` seconds until it gives a value;
/// panics naming `what` when it never does. With paused time the wait costs no wall time.
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
    panic!("timed out after {secs} s waiting for: {what}");
}

/// An API server over a fresh in-memory store, with the default configuration.
pub async fn memory_server() -> ApiServer {
    ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("the in-memory API server starts")
}

/// A kube-rs client of a fresh in-memory API server, through its router (no TCP, so paused
/// time works), in namespace `default`.
pub async fn client() -> kube::Client {
    kube::Client::new(memory_server().await.router(), "default")
}

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
        .oneshot(request.body(body.into()).expect("a valid request"))
        .await
        .expect("the router answers");
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the response body")
        .to_bytes();
    (code, headers, bytes)
}

/// A loopback TCP port that was free a moment ago (the OS picked it), for a process that
/// must be told its port. Another process may take it before it is bound again; prefer
/// binding `127.0.0.1:0` directly where the code under test allows it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}
