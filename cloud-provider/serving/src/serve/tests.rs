use std::sync::atomic::{AtomicBool, Ordering};

use axum::{extract::Request, routing::get};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A CA, a serving certificate for `localhost` and a client certificate of `alice` in `dev`.
struct Certs {
    ca: CertificateDer<'static>,
    server: (Vec<CertificateDer<'static>>, String),
    client: (Vec<CertificateDer<'static>>, String),
}

fn certs() -> Certs {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name.push(DnType::CommonName, "test-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf = |cn: &str, org: Option<&str>, usage, san: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(san).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        if let Some(org) = org {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org);
        }
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &issuer).unwrap();
        (vec![cert.der().clone()], key.serialize_pem())
    };
    Certs {
        ca: ca_cert.der().clone(),
        server: leaf(
            "localhost",
            None,
            ExtendedKeyUsagePurpose::ServerAuth,
            vec!["localhost".into()],
        ),
        client: leaf(
            "alice",
            Some("dev"),
            ExtendedKeyUsagePurpose::ClientAuth,
            vec![],
        ),
    }
}

fn key(pem: &str) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(certs: &Certs) -> Arc<rustls::ServerConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs.ca.clone()).unwrap();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs.server.0.clone(), key(&certs.server.1))
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

fn connector(certs: &Certs, with_client_cert: bool) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs.ca.clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if with_client_cert {
        builder
            .with_client_auth_cert(certs.client.0.clone(), key(&certs.client.1))
            .unwrap()
    } else {
        builder.with_no_client_auth()
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// What a [`Recorder`] hook saw, in order.
#[derive(Debug, Clone, Default)]
struct Recorder {
    events: Arc<Mutex<Vec<String>>>,
    refuse: Arc<AtomicBool>,
    refuse_after_handshake: Arc<AtomicBool>,
    close: CancellationToken,
}

struct RecorderSlot {
    hook: Recorder,
    activity: Activity,
}

impl Recorder {
    fn events(&self) -> Vec<String> {
        self.events.lock().clone()
    }

    fn note(&self, event: String) {
        self.events.lock().push(event);
    }
}

impl ConnectionHook for Recorder {
    type Slot = RecorderSlot;

    fn admit(&self, peer: SocketAddr) -> Option<RecorderSlot> {
        assert!(peer.ip().is_loopback());
        if self.refuse.load(Ordering::SeqCst) {
            self.note("refused".into());
            return None;
        }
        self.note("admitted".into());
        Some(RecorderSlot {
            hook: self.clone(),
            activity: Activity::new(),
        })
    }
}

impl ConnectionSlot for RecorderSlot {
    fn activity(&self) -> &Activity {
        &self.activity
    }

    fn evicted(&self) -> impl Future<Output = ()> + Send + '_ {
        self.hook.close.cancelled()
    }

    fn handshake_done(&self, certificate: Option<&CertificateIdentity>) -> bool {
        let who = certificate.map_or("no certificate", |c| c.user.as_str());
        self.hook.note(format!("handshake: {who}"));
        !self.hook.refuse_after_handshake.load(Ordering::SeqCst)
    }

    fn authenticated(&self) {
        self.hook.note("authenticated".into());
    }
}

/// `/whoami` answers the connection's certificate user (or `anonymous`) and its peer
/// address; with `x-token`, it tells the connection that the request authenticated.
fn router() -> Router {
    Router::new().route(
        "/whoami",
        get(|request: Request| async move {
            let peer = request.extensions().get::<Peer>().cloned().expect("peer");
            if request.headers().contains_key("x-token") {
                request
                    .extensions()
                    .get::<ConnectionAuth>()
                    .expect("connection auth")
                    .authenticated();
            }
            let user = peer.certificate.map_or("anonymous".to_owned(), |c| {
                format!("{} {:?}", c.user, c.groups)
            });
            format!("{user} from {}", peer.addr.ip())
        }),
    )
}

struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn start<H: ConnectionHook>(certs: &Certs, hook: H, timeouts: Timeouts) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(serve(
        router(),
        listener,
        server_config(certs),
        hook,
        timeouts,
        shutdown.clone(),
    ));
    Server {
        addr,
        shutdown,
        task,
    }
}

async fn tls(
    server: &Server,
    certs: &Certs,
    with_client_cert: bool,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(server.addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    connector(certs, with_client_cert).connect(name, tcp).await
}

/// One HTTP/1.1 request on a fresh connection, closed after the answer: the whole answer.
async fn get_whoami(
    server: &Server,
    certs: &Certs,
    with_client_cert: bool,
    token: bool,
) -> std::io::Result<String> {
    let mut stream = tls(server, certs, with_client_cert).await?;
    let token = if token { "x-token: 1\r\n" } else { "" };
    let request =
        format!("GET /whoami HTTP/1.1\r\nhost: localhost\r\n{token}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    Ok(answer)
}

/// x509.go `CommonNameUserConversion` on a verified chain: the request sees the client
/// certificate's CN and O; a client without one is anonymous; the hook learns both, and
/// hears when a request authenticated its connection.
#[tokio::test]
async fn requests_carry_their_connections_peer_and_certificate_identity() {
    let certs = certs();
    let hook = Recorder::default();
    let server = start(&certs, hook.clone(), Timeouts::default()).await;
    let answer = get_whoami(&server, &certs, true, false).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.ends_with("alice [\"dev\"] from 127.0.0.1"),
        "{answer}"
    );
    let answer = get_whoami(&server, &certs, false, true).await.unwrap();
    assert!(answer.ends_with("anonymous from 127.0.0.1"), "{answer}");
    assert_eq!(
        hook.events(),
        [
            "admitted",
            "handshake: alice",
            "admitted",
            "handshake: no certificate",
            "authenticated"
        ]
    );
    server.shutdown.cancel();
    server.task.await.unwrap();
}

/// The hook decides: a refused connection is closed before its handshake, one refused
/// after its handshake is closed before any request is read.
#[tokio::test]
async fn the_hook_may_refuse_a_connection_before_or_after_its_handshake() {
    let certs = certs();
    let hook = Recorder::default();
    let server = start(&certs, hook.clone(), Timeouts::default()).await;
    hook.refuse.store(true, Ordering::SeqCst);
    assert!(get_whoami(&server, &certs, true, false).await.is_err());
    hook.refuse.store(false, Ordering::SeqCst);
    hook.refuse_after_handshake.store(true, Ordering::SeqCst);
    let answer = get_whoami(&server, &certs, false, false).await;
    assert!(answer.as_ref().map_or(true, |a| a.is_empty()), "{answer:?}");
    assert_eq!(
        hook.events(),
        ["refused", "admitted", "handshake: no certificate"]
    );
}

/// Go's `IdleTimeout` (kube-apiserver's `secure_serving.go`): a kept-alive connection with
/// no request in flight is closed once idle that long.
#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let certs = certs();
    let timeouts = Timeouts {
        idle: Duration::from_millis(300),
        ..Timeouts::default()
    };
    let server = start(&certs, Recorder::default(), timeouts).await;
    let mut stream = tls(&server, &certs, false).await.unwrap();
    stream
        .write_all(b"GET /whoami HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // The answer, then the close (EOF) once idle.
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "still open after 5 s");
    assert!(String::from_utf8_lossy(&answer).contains("anonymous"));
    assert!(started.elapsed() >= Duration::from_millis(250));
}

/// A slot evicted during its handshake is closed at once; the hook's close also ends a
/// served connection.
#[tokio::test]
async fn an_evicted_connection_is_closed() {
    let certs = certs();
    let hook = Recorder::default();
    let server = start(&certs, hook.clone(), Timeouts::default()).await;
    // Raw TCP that never starts its handshake.
    let mut stalled = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    hook.close.cancel();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    server.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .expect("serve returns after shutdown")
        .unwrap();
}

/// `HandshakeLimit`: past `max` handshakes in progress a newcomer is closed; once a
/// handshake completes its permit is free again.
#[tokio::test]
async fn handshakes_in_progress_are_bounded() {
    let certs = certs();
    let timeouts = Timeouts {
        handshake: Duration::from_millis(500),
        ..Timeouts::default()
    };
    let server = start(&certs, HandshakeLimit::new(1), timeouts).await;
    let stalled = TcpStream::connect(server.addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(get_whoami(&server, &certs, false, false).await.is_err());
    // The stalled handshake times out and gives its permit back.
    tokio::time::sleep(Duration::from_millis(700)).await;
    drop(stalled);
    let answer = get_whoami(&server, &certs, false, false).await.unwrap();
    assert!(answer.ends_with("anonymous from 127.0.0.1"), "{answer}");
    // A completed handshake holds no permit: two sequential connections kept open.
    let _first = tls(&server, &certs, false).await.unwrap();
    let _second = tls(&server, &certs, false).await.unwrap();
}

/// Idle time counts from the end of the last request, on tokio time.
#[tokio::test(start_paused = true)]
async fn idle_time_counts_from_the_last_request() {
    let activity = Activity::new();
    let busy = activity.busy();
    assert!(!activity.is_idle());
    tokio::time::advance(Duration::from_secs(100)).await;
    let idle = activity.idle_for(Duration::from_secs(10));
    tokio::pin!(idle);
    assert!(futures_poll(&mut idle).await.is_none(), "busy is not idle");
    drop(busy);
    assert!(activity.is_idle());
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(futures_poll(&mut idle).await.is_none());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(futures_poll(&mut idle).await.is_some());
}

/// Polls `future` once (after letting other tasks run).
async fn futures_poll<F: Future + Unpin>(future: &mut F) -> Option<F::Output> {
    tokio::task::yield_now().await;
    std::future::poll_fn(|cx| match Pin::new(&mut *future).poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}
