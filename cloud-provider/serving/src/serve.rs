//! The TLS accept loop: see [`serve`].

use std::{
    convert::Infallible,
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Weak},
    task::{Context, Poll},
    time::Duration,
};

use axum::{Router, body::Body};
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::identity::{CertificateIdentity, Peer};

/// The time limits of a connection, as kube-apiserver's Go `http.Server`
/// (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go`) sets them, plus a TLS
/// handshake timeout, HTTP/2 keep-alive pings and a shutdown grace.
#[derive(Debug, Clone)]
pub struct Timeouts {
    /// How long a client has to complete the TLS handshake.
    pub handshake: Duration,
    /// How long an HTTP/1 client has to send a request's headers, from when the connection
    /// is ready for the next request: also closes kept-alive HTTP/1 connections idle that
    /// long (`ReadHeaderTimeout`, 32 s).
    pub header_read: Duration,
    /// How long a connection with no request in flight is kept: HTTP/2 with no open stream,
    /// HTTP/1 between requests (Go's `IdleTimeout`, 90 s, for both). An HTTP/2 connection
    /// that answers pings is closed too.
    pub idle: Duration,
    /// HTTP/2: how often an idle connection is pinged, and how long the answer may take
    /// before the connection is closed.
    pub http2_keep_alive: Duration,
    /// On shutdown (or when a connection is closed to make room), how long open requests
    /// (watches) may run before their connections are dropped.
    pub shutdown_grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake: Duration::from_secs(10),
            header_read: Duration::from_secs(32),
            idle: Duration::from_secs(90),
            http2_keep_alive: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// The requests in flight on one connection, and since when it has had none: what the idle
/// timeout and a [`ConnectionHook`] deciding which connection may be closed look at. Cheap
/// to clone (one shared state).
#[derive(Debug, Clone)]
pub struct Activity(Arc<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    counts: Mutex<Counts>,
    went_idle: Notify,
}

#[derive(Debug)]
struct Counts {
    in_flight: usize,
    idle_since: Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Activity::new()
    }
}

impl Activity {
    /// No request yet: idle since now.
    pub fn new() -> Self {
        Activity(Arc::new(ActivityState {
            counts: Mutex::new(Counts {
                in_flight: 0,
                idle_since: Instant::now(),
            }),
            went_idle: Notify::new(),
        }))
    }

    /// Whether no request is in flight.
    pub fn is_idle(&self) -> bool {
        self.0.counts.lock().in_flight == 0
    }

    /// Marks a request in flight until the returned guard is dropped (the loop drops it with
    /// the response body, so a watch keeps its connection busy).
    pub fn busy(&self) -> Busy {
        self.0.counts.lock().in_flight += 1;
        Busy(self.clone())
    }

    /// Resolves once no request has been in flight for `limit` (Go's `IdleTimeout`: for
    /// HTTP/2, no open stream; for HTTP/1, no request since the last response).
    pub async fn idle_for(&self, limit: Duration) {
        loop {
            // Created before the check, so a request ending in between still wakes us.
            let went_idle = self.0.went_idle.notified();
            let deadline = {
                let counts = self.0.counts.lock();
                (counts.in_flight == 0).then(|| counts.idle_since + limit)
            };
            match deadline {
                Some(deadline) if Instant::now() >= deadline => return,
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline) => {}
                        () = went_idle => {}
                    }
                }
                None => went_idle.await,
            }
        }
    }
}

/// A request in flight on a connection (see [`Activity::busy`]).
#[derive(Debug)]
pub struct Busy(Activity);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut counts = self.0.0.counts.lock();
        counts.in_flight -= 1;
        if counts.in_flight == 0 {
            counts.idle_since = Instant::now();
            drop(counts);
            self.0.0.went_idle.notify_waiters();
        }
    }
}

/// What [`serve`] asks about each connection: whether to serve it at all, and what becomes
/// of it. The server's connection limits live behind it.
pub trait ConnectionHook: Send + 'static {
    /// The state of one admitted connection, kept until the connection ends.
    type Slot: ConnectionSlot;
    /// A TCP connection from `peer` was accepted: its slot, or `None` to close it at once.
    fn admit(&self, peer: SocketAddr) -> Option<Self::Slot>;
}

/// One admitted connection, as its [`ConnectionHook`] sees it.
pub trait ConnectionSlot: Send + Sync + 'static {
    /// The connection's requests (for the idle timeout; the hook may look at it too).
    fn activity(&self) -> &Activity;

    /// Resolves when the connection must give its slot up: during the TLS handshake it is
    /// closed at once, after it in-flight requests get [`Timeouts::shutdown_grace`].
    /// Never, by default.
    fn evicted(&self) -> impl Future<Output = ()> + Send + '_ {
        std::future::pending()
    }

    /// The TLS handshake completed, with the identity of a verified client certificate if
    /// the client presented one. `false` closes the connection.
    fn handshake_done(&self, certificate: Option<&CertificateIdentity>) -> bool {
        let _ = certificate;
        true
    }

    /// A request on the connection authenticated (its router said so through
    /// [`ConnectionAuth`]); called for every such request.
    fn authenticated(&self) {}
}

/// In every request's extensions: the router calls [`authenticated`](Self::authenticated)
/// once the request authenticated (a bearer token on a connection without a client
/// certificate), and the connection's [`ConnectionSlot::authenticated`] learns it.
#[derive(Clone)]
pub struct ConnectionAuth(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ConnectionAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionAuth").finish_non_exhaustive()
    }
}

impl ConnectionAuth {
    /// Tells the connection that a request on it authenticated.
    pub fn authenticated(&self) {
        (self.0)()
    }

    fn of<S: ConnectionSlot>(slot: &Arc<S>) -> Self {
        // Weak: a request outliving its connection does not keep the slot taken.
        let slot: Weak<S> = Arc::downgrade(slot);
        ConnectionAuth(Arc::new(move || {
            if let Some(slot) = slot.upgrade() {
                slot.authenticated();
            }
        }))
    }
}

/// A [`ConnectionHook`] that bounds the TLS handshakes in progress: past `max`, new
/// connections are closed at once (logged), so clients that never finish a handshake cannot
/// pile up tasks. Connections are otherwise unlimited.
#[derive(Debug, Clone)]
pub struct HandshakeLimit {
    handshakes: Arc<Semaphore>,
    max: usize,
}

impl HandshakeLimit {
    /// At most `max` handshakes at once.
    pub fn new(max: usize) -> Self {
        HandshakeLimit {
            handshakes: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// A connection of [`HandshakeLimit`]: holds a handshake permit until its handshake ends.
#[derive(Debug)]
pub struct HandshakeSlot {
    activity: Activity,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnectionHook for HandshakeLimit {
    type Slot = HandshakeSlot;

    fn admit(&self, peer: SocketAddr) -> Option<HandshakeSlot> {
        match self.handshakes.clone().try_acquire_owned() {
            Ok(permit) => Some(HandshakeSlot {
                activity: Activity::new(),
                permit: Mutex::new(Some(permit)),
            }),
            Err(_) => {
                tracing::warn!(%peer, max = self.max, "too many TLS handshakes in progress: closing the new connection");
                None
            }
        }
    }
}

impl ConnectionSlot for HandshakeSlot {
    fn activity(&self) -> &Activity {
        &self.activity
    }

    fn handshake_done(&self, _: Option<&CertificateIdentity>) -> bool {
        self.permit.lock().take();
        true
    }
}

/// Serves `router` over TLS (`tls`, with its ALPN) on `listener` until `shutdown` is
/// cancelled, then lets open requests finish for [`Timeouts::shutdown_grace`] and returns
/// once every connection ended.
///
/// Each accepted connection is offered to `hook` ([`ConnectionHook::admit`]); an admitted
/// one gets its own task: the TLS handshake (within [`Timeouts::handshake`]), then HTTP/2 or
/// HTTP/1.1 as ALPN chose, closed when idle ([`Timeouts::idle`]), when its slot is
/// [evicted](ConnectionSlot::evicted) or on shutdown (gracefully: HTTP/2 `GOAWAY`, HTTP/1
/// between requests). Every request carries its connection's [`Peer`] and
/// [`ConnectionAuth`] in its extensions.
pub async fn serve<H: ConnectionHook>(
    router: Router,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    hook: H,
    timeouts: Timeouts,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    let timeouts = Arc::new(timeouts);
    // Every connection task holds a sender: `recv` answers `None` once all have ended.
    let (live, mut all_ended) = mpsc::channel::<()>(1);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(slot) = hook.admit(peer) else {
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let timeouts = timeouts.clone();
        let shutdown = shutdown.clone();
        let live = live.clone();
        tokio::spawn(async move {
            serve_connection(
                tcp,
                peer,
                Arc::new(slot),
                acceptor,
                router,
                &timeouts,
                shutdown,
            )
            .await;
            drop(live);
        });
    }
    drop(live);
    let _ = all_ended.recv().await;
}

async fn serve_connection<S: ConnectionSlot>(
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Arc<S>,
    acceptor: TlsAcceptor,
    router: Router,
    timeouts: &Timeouts,
    shutdown: CancellationToken,
) {
    let handshake = tokio::time::timeout(timeouts.handshake, acceptor.accept(tcp));
    let stream = tokio::select! {
        handshake = handshake => match handshake {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        () = slot.evicted() => {
            tracing::debug!(%peer, "stalled TLS handshake closed to make room");
            return;
        }
        () = shutdown.cancelled() => return,
    };
    let (_, session) = stream.get_ref();
    let certificate = CertificateIdentity::from_chain(session.peer_certificates());
    if !slot.handshake_done(certificate.as_ref()) {
        return;
    }
    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
    let peer_info = Peer {
        addr: peer,
        certificate,
    };
    let auth = ConnectionAuth::of(&slot);
    let activity = slot.activity().clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // Busy until the response body is done: a watch keeps its connection busy.
        let busy = activity.busy();
        request.extensions_mut().insert(peer_info.clone());
        request.extensions_mut().insert(auth.clone());
        let mut router = router.clone();
        async move {
            let response = tower_service::Service::call(&mut router, request.map(Body::new))
                .await
                .unwrap_or_else(|never: Infallible| match never {});
            Ok::<_, Infallible>(response.map(|body| WhileBusy { body, _busy: busy }))
        }
    });
    let io = TokioIo::new(stream);
    let grace = timeouts.shutdown_grace;
    let idle = timeouts.idle;
    macro_rules! drive {
        ($conn:expr) => {{
            let served = $conn;
            tokio::pin!(served);
            let why = tokio::select! {
                r = served.as_mut() => Err(r),
                () = shutdown.cancelled() => Ok("shutdown"),
                () = slot.evicted() => Ok("closed to make room"),
                () = slot.activity().idle_for(idle) => Ok("idle timeout"),
            };
            let result = match why {
                Err(r) => r,
                Ok(why) => {
                    tracing::debug!(%peer, why, "closing the connection");
                    // HTTP/2: GOAWAY, open streams finish; HTTP/1: closed between requests.
                    served.as_mut().graceful_shutdown();
                    match tokio::time::timeout(grace, served.as_mut()).await {
                        Ok(r) => r,
                        Err(_) => Ok(()),
                    }
                }
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        }};
    }
    if h2 {
        let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(timeouts.http2_keep_alive))
            .keep_alive_timeout(timeouts.http2_keep_alive);
        drive!(builder.serve_connection(io, service));
    } else {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(timeouts.header_read)
            .keep_alive(true);
        // Upgrades (WebSocket: exec, attach, port-forward) leave the connection to their
        // handler once answered 101.
        drive!(builder.serve_connection(io, service).with_upgrades());
    }
}

/// A response body that keeps its connection busy (not idle, not to be closed to make
/// room) until it is done or dropped.
struct WhileBusy {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for WhileBusy {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests;
