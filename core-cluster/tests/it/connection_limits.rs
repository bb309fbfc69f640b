//! The connection and request bounds of `core_cluster::serve` over real TLS on loopback:
//! idle connections are closed as kube-apiserver's Go server closes them, clients without
//! credentials cannot hold every slot, one source address holds a bounded number, refusals
//! are logged once per interval, and requests are bounded in size and time as upstream's
//! handler chain bounds them. Client sockets bind distinct loopback addresses
//! (`127.0.0.0/8`) to act as distinct sources. Limits and timeouts are configured small;
//! real sockets cannot run on paused time.

use std::{
    fmt::Debug,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use ccm_testkit::TestServer;
use core_cluster::{
    ApiServer, ApiServerConfig, auth::pki::CertAndKey, serve::ServeOptions, store::MemoryStore,
};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{Request, body::Incoming, client::conn::http2::SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::{ServerName, pem::PemObject};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    task::JoinHandle,
    time::Instant,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

type Body = BoxBody<Bytes, std::io::Error>;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

async fn start(config: ApiServerConfig, options: ServeOptions) -> TestServer {
    let api = ApiServer::new(Arc::new(MemoryStore::new()), config)
        .await
        .expect("API server");
    TestServer::start_with(api, options)
        .await
        .expect("TLS server")
}

fn source(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// A TCP connection to `server` from the loopback address `from`.
async fn tcp_from(server: &TestServer, from: IpAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    Ok(socket.connect(server.addr()).await?)
}

async fn tls_from(
    server: &TestServer,
    from: IpAddr,
    client: Option<&CertAndKey>,
    alpn: &[u8],
) -> Result<TlsStream<TcpStream>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca = server.security().pki.ca_pem();
    for der in rustls::pki_types::CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(der?)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match client {
        Some(c) => builder.with_client_auth_cert(c.cert_der()?, c.key_der()?)?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = tcp_from(server, from).await?;
    let name = ServerName::try_from("127.0.0.1")?;
    Ok(TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?)
}

/// An HTTP/2 client connection; its task answers the server's pings until it closes.
struct H2 {
    send: SendRequest<Body>,
    conn: JoinHandle<()>,
    /// The `Authorization` header of its requests, if any.
    authorization: Option<String>,
}

impl H2 {
    async fn connect(server: &TestServer, from: IpAddr, client: Option<&CertAndKey>) -> Result<H2> {
        let tls = tls_from(server, from, client, b"h2").await?;
        let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .handshake(TokioIo::new(tls))
            .await?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(H2 {
            send,
            conn,
            authorization: None,
        })
    }

    async fn admin(server: &TestServer, from: IpAddr) -> Result<H2> {
        let admin = server.security().pki.admin().clone();
        H2::connect(server, from, Some(&admin)).await
    }

    fn is_open(&self) -> bool {
        !self.conn.is_finished()
    }

    async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Body,
    ) -> Result<hyper::Response<Incoming>> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("https://127.0.0.1{path}"))
            .header("content-type", "application/json");
        if let Some(authorization) = &self.authorization {
            request = request.header("authorization", authorization);
        }
        let request = request.body(body)?;
        self.send.ready().await?;
        Ok(self.send.send_request(request).await?)
    }

    /// (status, body) of a request with a JSON body, read whole.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value)> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let response = self.send(method, path, full(body)).await?;
        let code = response.status().as_u16();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((code, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into())
        .map_err(|never| match never {})
        .boxed()
}

/// Polls `check` until it holds or `within` passes; whether it held.
async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn open(connections: &[H2]) -> Vec<bool> {
    connections.iter().map(H2::is_open).collect()
}

/// Whether the server closes `stream` within `within` (EOF or a reset).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// Go's `http2.Server.IdleTimeout` as kube-apiserver sets it
/// (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go`, 90 s): an HTTP/2 connection
/// with no open stream is closed after the idle timeout even though it answers every
/// keep-alive ping; one with a watch open is not idle, and is closed once the watch ends.
#[tokio::test]
async fn idle_http2_connections_are_closed_after_the_idle_timeout() -> Result<()> {
    let idle = Duration::from_millis(400);
    let options = ServeOptions {
        idle_timeout: idle,
        http2_keep_alive: Duration::from_millis(100),
        ..ServeOptions::default()
    };
    let server = start(ApiServerConfig::default(), options).await;
    let mut anonymous = H2::connect(&server, source(2), None).await?;
    assert_eq!(anonymous.call("GET", "/healthz", None).await?.0, 200);
    let served = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || !anonymous.is_open()).await,
        "an idle HTTP/2 connection answering pings is closed"
    );
    assert!(
        served.elapsed() >= idle / 2,
        "closed before the idle timeout"
    );

    // A watch keeps its connection busy past the idle timeout, and still gets events.
    let mut admin = H2::admin(&server, source(2)).await?;
    let watch = admin
        .send("GET", &format!("{CONFIGMAPS}?watch=1"), full(""))
        .await?;
    assert_eq!(watch.status(), 200);
    let mut events = watch.into_body();
    tokio::time::sleep(idle * 3).await;
    assert!(
        admin.is_open(),
        "a connection with a watch open is not idle"
    );
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "during"}});
    assert_eq!(admin.call("POST", CONFIGMAPS, Some(cm)).await?.0, 201);
    let event = event_about(&mut events, "during", Duration::from_secs(5)).await?;
    assert_eq!(event["type"], "ADDED");
    drop(events);
    assert!(
        eventually(Duration::from_secs(5), || !admin.is_open()).await,
        "closed once idle after the watch ended"
    );
    Ok(())
}

/// The first watch event about `name` on `events` (newline-delimited JSON).
async fn event_about(events: &mut Incoming, name: &str, within: Duration) -> Result<Value> {
    let mut buffer = Vec::new();
    let deadline = Instant::now() + within;
    loop {
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let event: Value = serde_json::from_slice(&line)?;
            if event["object"]["metadata"]["name"] == name {
                return Ok(event);
            }
        }
        let frame = tokio::time::timeout_at(deadline, events.frame())
            .await
            .context("no watch event in time")?
            .context("the watch ended")??;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
}

/// Go's `http.Server.IdleTimeout` for HTTP/1 keep-alive connections: one idle between
/// requests is closed after the idle timeout, even when the header read timeout
/// (`ReadHeaderTimeout`, 32 s) is longer.
#[tokio::test]
async fn idle_http1_connections_are_closed_after_the_idle_timeout() -> Result<()> {
    let idle = Duration::from_millis(400);
    let options = ServeOptions {
        idle_timeout: idle,
        ..ServeOptions::default()
    };
    let server = start(ApiServerConfig::default(), options).await;
    let mut tls = tls_from(&server, source(2), None, b"http/1.1").await?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut buf = [0u8; 1024];
    let n = tls.read(&mut buf).await?;
    let answer = String::from_utf8_lossy(&buf[..n]);
    if !answer.starts_with("HTTP/1.1 200") {
        bail!("unexpected answer {answer:?}");
    }
    let served = Instant::now();
    assert!(closed_within(&mut tls, Duration::from_secs(5)).await);
    assert!(
        served.elapsed() >= idle / 2,
        "closed before the idle timeout"
    );
    Ok(())
}

/// No upstream counterpart (Go's server has no connection cap): connections without
/// credentials hold at most three quarters of the slots, so clients with a certificate
/// always find one; when all are taken, an idle anonymous connection gives its slot up to
/// an authenticated newcomer instead of the newcomer being refused.
#[tokio::test]
async fn anonymous_connections_cannot_keep_an_authenticated_client_out() -> Result<()> {
    const MAX: usize = 16;
    const ANONYMOUS: usize = MAX * 3 / 4;
    let options = ServeOptions {
        max_connections: MAX,
        ..ServeOptions::default()
    };
    let server = start(ApiServerConfig::default(), options).await;
    // Forty idle anonymous HTTP/2 connections from four addresses, answering pings.
    let mut anonymous = Vec::new();
    for i in 0..40u8 {
        let mut conn = H2::connect(&server, source(2 + i % 4), None).await?;
        assert_eq!(conn.call("GET", "/healthz", None).await?.0, 200);
        anonymous.push(conn);
    }
    let count = |c: &[H2]| c.iter().filter(|c| c.is_open()).count();
    assert!(
        eventually(Duration::from_secs(5), || count(&anonymous) == ANONYMOUS).await,
        "anonymous connections hold {} slots, not {ANONYMOUS}",
        count(&anonymous)
    );
    // The oldest gave way to the newest.
    assert!(open(&anonymous)[40 - ANONYMOUS..].iter().all(|o| *o));
    // Authenticated clients get the rest, and then slots of idle anonymous connections.
    let mut admins = Vec::new();
    for i in 0..(MAX - ANONYMOUS + 2) {
        let mut admin = H2::admin(&server, source(2)).await?;
        let (code, body) = admin.call("GET", "/api/v1/namespaces", None).await?;
        assert_eq!(code, 200, "authenticated client {i}: {body}");
        admins.push(admin);
    }
    assert!(
        eventually(Duration::from_secs(5), || count(&anonymous)
            == ANONYMOUS - 2)
        .await
    );
    assert!(open(&admins).iter().all(|o| *o));
    // Anonymous newcomers still get in by replacing idle anonymous ones, never admins.
    let mut late = H2::connect(&server, source(3), None).await?;
    assert_eq!(late.call("GET", "/version", None).await?.0, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(open(&admins).iter().all(|o| *o));
    assert!(count(&anonymous) + usize::from(late.is_open()) <= ANONYMOUS);
    Ok(())
}

/// No upstream counterpart: one source address holds at most `max_connections_per_source`
/// unauthenticated connections. A new TLS connection from it replaces its oldest idle one;
/// raw TCP connections still in their handshake are refused at once; other addresses and
/// authenticated clients from the same address are not affected.
#[tokio::test]
async fn one_source_holds_a_bounded_number_of_unauthenticated_connections() -> Result<()> {
    const PER_SOURCE: usize = 4;
    let options = ServeOptions {
        max_connections: 64,
        max_connections_per_source: PER_SOURCE,
        ..ServeOptions::default()
    };
    let server = start(ApiServerConfig::default(), options).await;
    let mut crowd = Vec::new();
    for _ in 0..10 {
        let mut conn = H2::connect(&server, source(2), None).await?;
        assert_eq!(conn.call("GET", "/healthz", None).await?.0, 200);
        crowd.push(conn);
    }
    let wanted: Vec<bool> = (0..10).map(|i| i >= 10 - PER_SOURCE).collect();
    assert!(
        eventually(Duration::from_secs(5), || open(&crowd) == wanted).await,
        "{:?}",
        open(&crowd)
    );
    let mut others = Vec::new();
    for _ in 0..3 {
        let mut conn = H2::connect(&server, source(3), None).await?;
        assert_eq!(conn.call("GET", "/healthz", None).await?.0, 200);
        others.push(conn);
    }
    // Raw TCP that never starts TLS: the first PER_SOURCE are kept (for the handshake
    // timeout), the rest closed at once.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(tcp_from(&server, source(4)).await?);
    }
    let mut closed = 0;
    for tcp in &mut silent {
        if closed_within(tcp, Duration::from_millis(300)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 10 - PER_SOURCE);
    // An administrator behind the crowded address gets in.
    let mut admin = H2::admin(&server, source(2)).await?;
    assert_eq!(admin.call("GET", "/api/v1/namespaces", None).await?.0, 200);
    assert!(
        open(&others).iter().all(|o| *o),
        "other sources are untouched"
    );
    assert!(crowd.iter().filter(|c| c.is_open()).count() <= PER_SOURCE);
    Ok(())
}

/// A connection without a client certificate whose requests authenticate with a bearer
/// token (a service account's, as pods use) counts as authenticated from its first request:
/// anonymous connections opened later from its address do not take its slot.
#[tokio::test]
async fn a_connection_authenticated_by_a_token_keeps_its_slot() -> Result<()> {
    const PER_SOURCE: usize = 2;
    let options = ServeOptions {
        max_connections_per_source: PER_SOURCE,
        ..ServeOptions::default()
    };
    let server = start(ApiServerConfig::default(), options).await;
    let mut admin = H2::admin(&server, source(9)).await?;
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "robot"}});
    let (code, body) = admin
        .call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts",
            Some(sa),
        )
        .await?;
    assert_eq!(code, 201, "{body}");
    let request =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}});
    let (code, body) = admin
        .call(
            "POST",
            "/api/v1/namespaces/default/serviceaccounts/robot/token",
            Some(request),
        )
        .await?;
    assert_eq!(code, 201, "{body}");
    let token = body["status"]["token"].as_str().context("a token")?;
    let mut robot = H2::connect(&server, source(2), None).await?;
    robot.authorization = Some(format!("Bearer {token}"));
    assert_eq!(robot.call("GET", "/version", None).await?.0, 200);
    let mut anonymous = Vec::new();
    for _ in 0..PER_SOURCE + 2 {
        let mut conn = H2::connect(&server, source(2), None).await?;
        assert_eq!(conn.call("GET", "/healthz", None).await?.0, 200);
        anonymous.push(conn);
    }
    let wanted: Vec<bool> = (0..PER_SOURCE + 2).map(|i| i >= 2).collect();
    assert!(
        eventually(Duration::from_secs(5), || open(&anonymous) == wanted).await,
        "{:?}",
        open(&anonymous)
    );
    assert!(
        robot.is_open(),
        "the authenticated connection kept its slot"
    );
    assert_eq!(robot.call("GET", "/version", None).await?.0, 200);
    Ok(())
}

/// Counts the WARN lines whose message contains a pattern.
struct WarnLines {
    pattern: &'static str,
    count: Arc<AtomicUsize>,
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for WarnLines {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() == tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains(self.pattern) {
            self.count.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// No upstream counterpart: when every slot is held by authenticated clients, new
/// connections are closed at once, and the warning about it is written once per 10 s with
/// the count of refusals, not once per refused connection.
#[tokio::test]
async fn refused_connections_are_logged_once_per_interval() -> Result<()> {
    let lines = Arc::new(AtomicUsize::new(0));
    // This test's runtime runs on this thread, the server's tasks included.
    let _logs = tracing::subscriber::set_default(WarnLines {
        pattern: "connection limit reached",
        count: lines.clone(),
    });
    const MAX: usize = 4;
    let options = ServeOptions {
        max_connections: MAX,
        ..ServeOptions::default()
    };
    let server = start(ApiServerConfig::default(), options).await;
    let mut admins = Vec::new();
    for _ in 0..MAX {
        let mut admin = H2::admin(&server, source(2)).await?;
        assert_eq!(admin.call("GET", "/api/v1/namespaces", None).await?.0, 200);
        admins.push(admin);
    }
    for i in 0..200u32 {
        let mut tcp = tcp_from(&server, source(3 + (i % 8) as u8)).await?;
        assert!(
            closed_within(&mut tcp, Duration::from_secs(2)).await,
            "connection {i} beyond the limit is closed at once"
        );
    }
    assert_eq!(lines.load(Ordering::SeqCst), 1, "one line for 200 refusals");
    assert!(open(&admins).iter().all(|o| *o));
    Ok(())
}

/// `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go limitedReadBody`: a body over
/// `MaxRequestBodyBytes` (3 MiB) is 413 "limit is 3145728"; a declared `Content-Length`
/// over it is refused at once, before the body is sent.
#[tokio::test]
async fn a_content_length_over_the_limit_is_refused_before_the_body() -> Result<()> {
    let server = start(ApiServerConfig::default(), ServeOptions::default()).await;
    let admin = server.security().pki.admin().clone();
    let mut tls = tls_from(&server, source(2), Some(&admin), b"http/1.1").await?;
    let sent = Instant::now();
    tls.write_all(
        format!(
            "POST {CONFIGMAPS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: 10000000000\r\n\r\n{{\"apiVersion\":"
        )
        .as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut raw))
        .await
        .context("no answer before the body")?
        .ok();
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "{:?}",
        sent.elapsed()
    );
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    let body: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap_or(""))?;
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Request entity too large: limit is 3145728",
            "reason": "RequestEntityTooLarge", "code": 413})
    );
    Ok(())
}

/// `staging/src/k8s.io/apiserver/pkg/server/filters/timeout.go
/// WithTimeoutForNonLongRunningRequests`: a request body trickled in one byte at a time is
/// cut by the request timeout with upstream's 504 Status, and nothing is stored.
#[tokio::test]
async fn a_trickled_body_is_cut_by_the_request_timeout() -> Result<()> {
    let timeout = Duration::from_secs(1);
    let config = ApiServerConfig {
        request_timeout: timeout,
        ..ApiServerConfig::default()
    };
    let server = start(config, ServeOptions::default()).await;
    let admin = server.security().pki.admin().clone();
    let tls = tls_from(&server, source(2), Some(&admin), b"http/1.1").await?;
    let (mut reader, mut writer) = tokio::io::split(tls);
    let body =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slow"}}).to_string();
    writer
        .write_all(
            format!(
                "POST {CONFIGMAPS} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .await?;
    let started = Instant::now();
    let trickle = tokio::spawn(async move {
        for byte in body.bytes() {
            if writer.write_all(&[byte]).await.is_err() || writer.flush().await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut raw = Vec::new();
    tokio::time::timeout(timeout * 5, reader.read_to_end(&mut raw))
        .await
        .context("the request was not cut")?
        .ok();
    let elapsed = started.elapsed();
    trickle.abort();
    assert!(elapsed >= timeout && elapsed < timeout * 3, "{elapsed:?}");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    let status: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap_or(""))?;
    assert_eq!(
        status,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Timeout: request did not complete within the allotted timeout",
            "reason": "Timeout", "details": {}, "code": 504})
    );
    let mut check = H2::admin(&server, source(2)).await?;
    let (code, list) = check.call("GET", CONFIGMAPS, None).await?;
    assert_eq!(code, 200);
    assert_eq!(list["items"], json!([]), "nothing was stored");
    Ok(())
}

/// `WithTimeoutForNonLongRunningRequests` once the handler has begun its answer: a client
/// that reads a list too slowly has the answer cut at the request timeout (upstream aborts
/// the handler: an HTTP/2 stream reset) instead of holding it indefinitely.
#[tokio::test]
async fn an_answer_read_too_slowly_is_cut_at_the_request_timeout() -> Result<()> {
    let timeout = Duration::from_millis(500);
    let config = ApiServerConfig {
        request_timeout: timeout,
        ..ApiServerConfig::default()
    };
    let server = start(config, ServeOptions::default()).await;
    let mut admin = H2::admin(&server, source(2)).await?;
    for i in 0..8 {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("big{i}")},
            "data": {"v": "x".repeat(100_000)}});
        assert_eq!(admin.call("POST", CONFIGMAPS, Some(cm)).await?.0, 201);
    }
    // A client whose flow-control window holds a small part of the list.
    let tls = tls_from(
        &server,
        source(2),
        Some(server.security().pki.admin()),
        b"h2",
    )
    .await?;
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .handshake::<_, Body>(TokioIo::new(tls))
        .await?;
    tokio::spawn(conn);
    let request = Request::get(format!("https://127.0.0.1{CONFIGMAPS}")).body(full(""))?;
    let response = send.send_request(request).await?;
    assert_eq!(response.status(), 200);
    tokio::time::sleep(timeout * 3).await;
    let read = tokio::time::timeout(Duration::from_secs(5), response.into_body().collect())
        .await
        .context("the answer was neither cut nor finished")?;
    assert!(
        read.is_err(),
        "the answer was sent whole after the deadline"
    );
    // A prompt reader gets the same list.
    let (code, list) = admin.call("GET", CONFIGMAPS, None).await?;
    assert_eq!(
        (code, list["items"].as_array().map(Vec::len)),
        (200, Some(8))
    );
    Ok(())
}

/// `BasicLongRunningRequestCheck` (kube-apiserver's long-running verbs `watch` and `proxy`):
/// a watch is not cut by the request timeout, whether asked as `watch=true`, `watch=1` or
/// the Python client's `watch=True`, while a list on the same connection still answers.
#[tokio::test]
async fn watches_are_not_cut_by_the_request_timeout() -> Result<()> {
    let timeout = Duration::from_millis(300);
    let config = ApiServerConfig {
        request_timeout: timeout,
        ..ApiServerConfig::default()
    };
    let server = start(config, ServeOptions::default()).await;
    let mut admin = H2::admin(&server, source(2)).await?;
    let mut watches = Vec::new();
    for flag in ["true", "1", "True"] {
        let watch = admin
            .send("GET", &format!("{CONFIGMAPS}?watch={flag}"), full(""))
            .await?;
        assert_eq!(watch.status(), 200);
        watches.push((flag, watch.into_body()));
    }
    tokio::time::sleep(timeout * 4).await;
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"}});
    assert_eq!(admin.call("POST", CONFIGMAPS, Some(cm)).await?.0, 201);
    for (flag, events) in &mut watches {
        let event = event_about(events, "late", Duration::from_secs(5))
            .await
            .with_context(|| format!("watch={flag}"))?;
        assert_eq!(event["type"], "ADDED", "watch={flag}");
    }
    assert_eq!(admin.call("GET", CONFIGMAPS, None).await?.0, 200);
    Ok(())
}
