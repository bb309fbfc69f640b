//! Bounds on the plain TCP connections a process carries for something that would run
//! outside it (a cloud's load balancer, kube-proxy's node ports): see [`ConnectionLimits`].
//!
//! A real load balancer runs outside the control plane and closes the connections it
//! carries when they idle (an AWS Classic or Application Load Balancer after 60 s by
//! default, a Network Load Balancer after 350 s for TCP); kube-proxy forwards in the kernel
//! and holds no descriptor at all. A stand-in for them that runs in the process of the API
//! server spends that process's file descriptors, so without bounds idle clients could take
//! every descriptor and make the API server's own `accept` fail. This module gives such a
//! stand-in:
//!
//! - an idle timeout: [`splice`] (a connection forwarded to another) and
//!   [`serve_until_idle`] (a connection served in process) close a connection on which no
//!   byte has moved either way for [`ConnectionLimits::idle_timeout`];
//! - a cap of concurrent connections per listener ([`ConnectionLimits::max_connections`],
//!   each listener's [`ListenerLimits`]);
//! - a process-wide budget of file descriptors ([`process_descriptor_budget`]: a quarter of
//!   `RLIMIT_NOFILE`), shared by every listener given it, each connection taking as many
//!   permits as the descriptors it really holds ([`ListenerLimits::admit`]);
//! - a connection beyond the cap or the budget reset at accept, with a warning at most once
//!   a minute per listener ([`ListenerLimits::accept`], an accept loop that also rides out
//!   failed `accept`s);
//! - [`raise_open_files_limit`], the soft limit raised to the hard one at start, as Go
//!   programs do.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

/// How often a listener warns that it resets connections (at its cap, or out of budget).
const REFUSAL_WARNING_PERIOD: Duration = Duration::from_secs(60);
/// How long a listener waits after a failed `accept` before it tries again.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// A configuration of [`ConnectionLimits`] that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionLimitsError {
    /// The idle timeout is zero.
    #[error("the connections' idle timeout must be more than 0s")]
    ZeroIdleTimeout,
    /// The cap per listener is zero or more than a semaphore holds.
    #[error("the connections per listener must be between 1 and {max}, not {given}")]
    MaxConnections {
        /// What was asked for.
        given: usize,
        /// The largest cap.
        max: usize,
    },
}

/// How the listeners of a data path in process bound their connections, as a cloud's load
/// balancer bounds them outside the control plane:
///
/// - a connection with no byte in either direction for [`idle_timeout`](Self::idle_timeout)
///   is closed, both halves ([`DEFAULT_IDLE_TIMEOUT`](Self::DEFAULT_IDLE_TIMEOUT): an AWS
///   Classic or Application Load Balancer's default idle timeout, 60 s);
/// - each listener carries at most [`max_connections`](Self::max_connections) connections at
///   once: a new one beyond them is accepted and reset at once, as a load balancer at its
///   connection limit resets new connections, and the listener stays healthy;
/// - every connection takes permits of a [descriptor budget](Self::descriptors), one per
///   file descriptor it holds, for as long as it is open; a connection that finds too few is
///   reset likewise. The default budget is [`process_descriptor_budget`], a quarter of the
///   process's `RLIMIT_NOFILE` soft limit; give the same budget to every part of the data
///   path in one process so that together they stay within it.
///
/// Each listener takes its own [`ListenerLimits`] ([`listener`](Self::listener)); clones
/// share the budget.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    idle_timeout: Duration,
    max_connections: usize,
    descriptors: Arc<Semaphore>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            descriptors: process_descriptor_budget(),
        }
    }
}

impl ConnectionLimits {
    /// The default idle timeout: 60 s, an AWS Classic or Application Load Balancer's
    /// default (`idle_timeout.timeout_seconds`).
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    /// The default cap on one listener's connections at once.
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

    /// Limits with this idle timeout and cap per listener, and the process's descriptor
    /// budget ([`process_descriptor_budget`]).
    pub fn new(
        idle_timeout: Duration,
        max_connections: usize,
    ) -> Result<Self, ConnectionLimitsError> {
        if idle_timeout.is_zero() {
            return Err(ConnectionLimitsError::ZeroIdleTimeout);
        }
        if max_connections == 0 || max_connections > Semaphore::MAX_PERMITS {
            return Err(ConnectionLimitsError::MaxConnections {
                given: max_connections,
                max: Semaphore::MAX_PERMITS,
            });
        }
        Ok(ConnectionLimits {
            idle_timeout,
            max_connections,
            descriptors: process_descriptor_budget(),
        })
    }

    /// The same limits, taking descriptors from `budget` (one permit per descriptor) instead
    /// of the process's.
    pub fn with_descriptors(mut self, budget: Arc<Semaphore>) -> Self {
        self.descriptors = budget;
        self
    }

    /// How long a connection may carry no byte before it is closed.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// How many connections one listener carries at once.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// The descriptor budget the connections take their permits from.
    pub fn descriptors(&self) -> &Arc<Semaphore> {
        &self.descriptors
    }

    /// The admission of one listener's connections under these limits: a cap of its own,
    /// this budget. `name` says what listens in its warnings (`"load balancer"`), `addr`
    /// where.
    pub fn listener(&self, name: &'static str, addr: SocketAddr) -> ListenerLimits {
        ListenerLimits {
            limits: self.clone(),
            slots: Arc::new(Semaphore::new(self.max_connections)),
            warned: Throttle::default(),
            name,
            addr,
        }
    }
}

/// The process's budget of file descriptors for its data path: a quarter of the
/// `RLIMIT_NOFILE` soft limit read the first time it is asked for, one permit per
/// descriptor, the same semaphore on every call. The rest stays for the API server, the
/// controllers and their clients: kube-apiserver's data path (kube-proxy and the cloud's
/// load balancers) takes none of its descriptors, so this keeps at least three quarters of
/// them out of the data path's reach. Call [`raise_open_files_limit`] first, if at all.
pub fn process_descriptor_budget() -> Arc<Semaphore> {
    static BUDGET: OnceLock<Arc<Semaphore>> = OnceLock::new();
    BUDGET
        .get_or_init(|| Arc::new(Semaphore::new(descriptor_share(open_files_soft_limit()))))
        .clone()
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard limit, as every Go
/// program does at start since Go 1.19 (`syscall`'s `init`), kube-apiserver among them: the
/// default soft limit of 1,024 is for `select`-based programs. The soft limit afterwards;
/// `None` where it cannot be read or raised (not Unix, or not allowed: it stays as it was).
/// Child processes inherit the raised limit. Call it before [`process_descriptor_budget`],
/// which reads the limit once.
pub fn raise_open_files_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        rlimit::increase_nofile_limit(u64::MAX).ok()
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// A quarter of `soft_limit`, within what a semaphore holds.
fn descriptor_share(soft_limit: u64) -> usize {
    usize::try_from(soft_limit / 4)
        .unwrap_or(usize::MAX)
        .min(Semaphore::MAX_PERMITS)
}

/// `RLIMIT_NOFILE`'s soft limit (1,024, Linux's usual default, if it cannot be read).
fn open_files_soft_limit() -> u64 {
    #[cfg(unix)]
    {
        rlimit::Resource::NOFILE
            .get()
            .map_or(1024, |(soft, _hard)| soft)
    }
    #[cfg(not(unix))]
    {
        1024
    }
}

/// One listener's share of [`ConnectionLimits`] ([`ConnectionLimits::listener`]): its own
/// cap of connections at once and the limits' descriptor budget, and the warning it gives,
/// at most once a minute, when it resets connections.
#[derive(Debug)]
pub struct ListenerLimits {
    limits: ConnectionLimits,
    slots: Arc<Semaphore>,
    warned: Throttle,
    name: &'static str,
    addr: SocketAddr,
}

impl ListenerLimits {
    /// The limits this listener keeps to.
    pub fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    /// Takes a connection's permits: a slot of this listener, and `descriptors` permits of
    /// the budget (the descriptors the connection holds: one for a connection served in
    /// process, two for one spliced to another). Nothing is held on refusal.
    pub fn try_admit(&self, descriptors: u32) -> Result<Admitted, Refusal> {
        let slot = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| Refusal::ListenerFull)?;
        let held = self
            .limits
            .descriptors
            .clone()
            .try_acquire_many_owned(descriptors)
            .map_err(|_| Refusal::BudgetSpent)?;
        Ok(Admitted {
            _slot: slot,
            _descriptors: held,
        })
    }

    /// [`try_admit`](Self::try_admit) for `stream`, just accepted from `peer`; on refusal the
    /// stream is set to reset (an RST when it is dropped, as a load balancer at its limit
    /// resets new connections) and the refusal logged: a warning at most once a minute, at
    /// debug level otherwise. The caller keeps accepting, so its backlog never fills.
    pub fn admit(
        &self,
        stream: &TcpStream,
        peer: SocketAddr,
        descriptors: u32,
    ) -> Option<Admitted> {
        let refusal = match self.try_admit(descriptors) {
            Ok(admitted) => return Some(admitted),
            Err(refusal) => refusal,
        };
        let _ = stream.set_zero_linger();
        let (name, addr) = (self.name, self.addr);
        if self.warned.ready(REFUSAL_WARNING_PERIOD) {
            tracing::warn!(
                %addr,
                %peer,
                max_connections = self.limits.max_connections,
                descriptors_left = self.limits.descriptors.available_permits(),
                "{name}: resetting new connections: {refusal} (warned at most once a minute)"
            );
        } else {
            tracing::debug!(%addr, %peer, "{name}: reset: {refusal}");
        }
        None
    }

    /// The next connection of `listener` (this listener's) that [`admit`](Self::admit)
    /// lets in, with its peer and its permits: those refused are reset, and a failed
    /// `accept` (out of descriptors, say) is logged at debug level and tried again after
    /// 50 ms, so that the listener keeps accepting and its backlog never fills. Cancel-safe.
    pub async fn accept(
        &self,
        listener: &TcpListener,
        descriptors: u32,
    ) -> (TcpStream, SocketAddr, Admitted) {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    if let Some(admitted) = self.admit(&stream, peer, descriptors) {
                        return (stream, peer, admitted);
                    }
                }
                Err(error) => {
                    let (name, addr) = (self.name, self.addr);
                    tracing::debug!(%addr, %error, "{name}: accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    }
}

/// An admitted connection's permits (its listener slot and its descriptors): keep it for as
/// long as the connection is open; dropping it gives them back.
#[derive(Debug)]
pub struct Admitted {
    _slot: OwnedSemaphorePermit,
    _descriptors: OwnedSemaphorePermit,
}

/// Why a connection was refused at accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its listener carries its cap.
    ListenerFull,
    /// The data path's descriptor budget is spent.
    BudgetSpent,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::ListenerFull => "the listener carries its maximum of connections",
            Refusal::BudgetSpent => "the data path's file-descriptor budget is spent",
        })
    }
}

/// Lets something through at most once per period (a warning, say), on tokio time.
#[derive(Debug, Default)]
struct Throttle(Mutex<Option<Instant>>);

impl Throttle {
    /// Whether `period` has passed since the last time this answered true (or it never did).
    fn ready(&self, period: Duration) -> bool {
        let now = Instant::now();
        let mut last = self.0.lock();
        match *last {
            Some(at) if now.duration_since(at) < period => false,
            _ => {
                *last = Some(now);
                true
            }
        }
    }
}

/// When a connection last carried a byte, in either direction; cheap to clone.
#[derive(Debug, Clone)]
struct LastByte(Arc<Mutex<Instant>>);

impl LastByte {
    /// Active now.
    fn new() -> Self {
        LastByte(Arc::new(Mutex::new(Instant::now())))
    }

    fn touch(&self) {
        *self.0.lock() = Instant::now();
    }

    /// Resolves once no byte has moved for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let deadline = *self.0.lock() + limit;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// A stream watched for idleness by [`serve_until_idle`]: its reads and writes of one byte
/// or more count as activity.
#[derive(Debug)]
pub struct IdleTracked<S> {
    inner: S,
    last_byte: LastByte,
}

impl<S> IdleTracked<S> {
    fn new(inner: S, last_byte: &LastByte) -> Self {
        IdleTracked {
            inner,
            last_byte: last_byte.clone(),
        }
    }

    /// The stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.last_byte.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.last_byte.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.last_byte.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How a connection watched for idleness ([`splice`], [`serve_until_idle`]) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It ended of itself: both sides closed, one failed, or its server returned.
    Finished,
    /// No byte moved for the idle timeout: it was closed.
    Idle,
}

/// Copies bytes both ways between `a` and `b` (a load balancer's client and backend) until
/// both have closed, or until no byte has moved either way for `idle_timeout`; both are
/// dropped (closed) on return.
pub async fn splice<A, B>(a: A, b: B, idle_timeout: Duration) -> Ended
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last_byte = LastByte::new();
    let mut a = IdleTracked::new(a, &last_byte);
    let mut b = IdleTracked::new(b, &last_byte);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut a, &mut b) => Ended::Finished,
        () = last_byte.idle_for(idle_timeout) => Ended::Idle,
    }
}

/// Serves `stream` with `serve` until that returns or no byte has moved either way for
/// `idle_timeout`, when `serve` is dropped with the stream (closed).
pub async fn serve_until_idle<S, F, Fut>(stream: S, idle_timeout: Duration, serve: F) -> Ended
where
    F: FnOnce(IdleTracked<S>) -> Fut,
    Fut: Future<Output = ()>,
{
    let last_byte = LastByte::new();
    let tracked = IdleTracked::new(stream, &last_byte);
    tokio::select! {
        () = serve(tracked) => Ended::Finished,
        () = last_byte.idle_for(idle_timeout) => Ended::Idle,
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::*;

    /// An echo server, standing for a pod answering on a node port.
    async fn echo(mut s: IdleTracked<DuplexStream>) {
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    /// An AWS Classic or Application Load Balancer closes a connection on which no data has
    /// been sent or received for its idle timeout, 60 s by default, both sides: the client
    /// and the target see it close. A connection idle for just under that stays open.
    #[tokio::test(start_paused = true)]
    async fn a_spliced_connection_idle_for_the_idle_timeout_is_closed_both_ways() {
        assert_eq!(
            ConnectionLimits::default().idle_timeout(),
            Duration::from_secs(60)
        );
        let (mut client, lb_front) = duplex(64);
        let (lb_back, mut node) = duplex(64);
        let started = Instant::now();
        let spliced = tokio::spawn(splice(
            lb_front,
            lb_back,
            ConnectionLimits::DEFAULT_IDLE_TIMEOUT,
        ));
        tokio::time::sleep(Duration::from_secs(59)).await;
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        node.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping", "still open after 59 s idle");

        assert_eq!(spliced.await.unwrap(), Ended::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(59 + 60));
        assert_eq!(
            client.read(&mut buf).await.unwrap(),
            0,
            "the client sees EOF"
        );
        assert_eq!(node.read(&mut buf).await.unwrap(), 0, "the node sees EOF");
    }

    /// An AWS load balancer's idle timeout counts from the last byte sent or received in
    /// either direction: a connection with bytes flowing, however long it lasts, stays open.
    #[tokio::test(start_paused = true)]
    async fn a_spliced_connection_with_bytes_flowing_stays_open() {
        let (mut client, lb_front) = duplex(64);
        let (lb_back, mut node) = duplex(64);
        let spliced = tokio::spawn(splice(lb_front, lb_back, Duration::from_secs(60)));
        let mut buf = [0u8; 4];
        // Ten minutes, with a byte every 50 s, the node's way and the client's in turn.
        for i in 0..12 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            if i % 2 == 0 {
                client.write_all(b"ping").await.unwrap();
                node.read_exact(&mut buf).await.unwrap();
            } else {
                node.write_all(b"pong").await.unwrap();
                client.read_exact(&mut buf).await.unwrap();
            }
        }
        assert!(!spliced.is_finished());
        drop(client);
        drop(node);
        assert_eq!(spliced.await.unwrap(), Ended::Finished);
    }

    /// A connection served in process (a node port's) is kept no longer than a load
    /// balancer in front would keep it: one idle for just under 60 s stays open; at 60 s it
    /// is closed.
    #[tokio::test(start_paused = true)]
    async fn a_served_connection_idle_for_the_idle_timeout_is_closed() {
        let (mut client, server) = duplex(64);
        let started = Instant::now();
        let served = tokio::spawn(serve_until_idle(
            server,
            ConnectionLimits::DEFAULT_IDLE_TIMEOUT,
            echo,
        ));
        tokio::time::sleep(Duration::from_secs(59)).await;
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(served.await.unwrap(), Ended::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(59 + 60));
        assert_eq!(
            client.read(&mut buf).await.unwrap(),
            0,
            "the client sees EOF"
        );
    }

    /// The idle timeout counts from the last byte in either direction: a served connection
    /// with requests every 50 s stays open for as long as they come, and ends when its
    /// server returns.
    #[tokio::test(start_paused = true)]
    async fn a_served_connection_with_bytes_flowing_stays_open() {
        let (mut client, server) = duplex(64);
        let served = tokio::spawn(serve_until_idle(server, Duration::from_secs(60), echo));
        let mut buf = [0u8; 4];
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            client.write_all(b"ping").await.unwrap();
            client.read_exact(&mut buf).await.unwrap();
        }
        assert!(!served.is_finished());
        drop(client);
        assert_eq!(served.await.unwrap(), Ended::Finished);
    }

    fn any_addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    /// A cap is a cap: a listener's slots and the descriptor budget are both needed, each
    /// connection takes as many permits as it holds descriptors, and a connection's end
    /// gives both back. Listeners share the budget, not their slots.
    #[test]
    fn admission_takes_a_slot_and_the_connections_descriptors() {
        let budget = Arc::new(Semaphore::new(3));
        let limits = ConnectionLimits::new(Duration::from_secs(1), 2)
            .unwrap()
            .with_descriptors(budget.clone());
        let listener = limits.listener("test", any_addr());
        let first = listener.try_admit(2).unwrap();
        assert_eq!(listener.try_admit(2).unwrap_err(), Refusal::BudgetSpent);
        assert_eq!(
            listener.slots.available_permits(),
            1,
            "a refusal holds nothing"
        );
        let small = listener.try_admit(1).unwrap();
        assert_eq!(listener.try_admit(0).unwrap_err(), Refusal::ListenerFull);
        let other = limits.listener("other", any_addr());
        assert_eq!(other.try_admit(1).unwrap_err(), Refusal::BudgetSpent);
        assert!(other.try_admit(0).is_ok(), "its own slots");
        drop((first, small));
        assert_eq!(
            (
                listener.slots.available_permits(),
                budget.available_permits()
            ),
            (2, 3)
        );
    }

    /// A connection refused at accept is reset (the client reads an error, not a clean
    /// end), and the listener's warning comes at most once a minute.
    #[tokio::test]
    async fn a_refused_connection_is_reset() {
        let limits = ConnectionLimits::new(Duration::from_secs(1), 1)
            .unwrap()
            .with_descriptors(Arc::new(Semaphore::new(0)));
        let socket = tokio::net::TcpListener::bind(any_addr()).await.unwrap();
        let addr = socket.local_addr().unwrap();
        let listener = limits.listener("test", addr);
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (stream, peer) = socket.accept().await.unwrap();
        assert!(listener.admit(&stream, peer, 1).is_none());
        drop(stream);
        let mut buf = [0u8; 1];
        let read = client.read(&mut buf).await;
        assert_eq!(
            read.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset)
        );
        assert!(
            !listener.warned.ready(REFUSAL_WARNING_PERIOD),
            "warned already"
        );
    }

    /// A listener's accept loop hands on only the connections admitted: one beyond the cap
    /// is reset, and once the first ends the next is let in.
    #[tokio::test]
    async fn accept_hands_on_admitted_connections_and_resets_the_others() {
        let limits = ConnectionLimits::new(Duration::from_secs(1), 1).unwrap();
        let socket = tokio::net::TcpListener::bind(any_addr()).await.unwrap();
        let addr = socket.local_addr().unwrap();
        let listener = limits.listener("test", addr);
        let _first = TcpStream::connect(addr).await.unwrap();
        let (stream, _, admitted) = listener.accept(&socket, 1).await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        let next = tokio::spawn(async move { listener.accept(&socket, 1).await });
        let mut buf = [0u8; 1];
        assert_eq!(
            second.read(&mut buf).await.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset),
            "beyond the cap"
        );
        assert!(!next.is_finished());
        drop((stream, admitted));
        // Connected only once the slot is free: one waiting in the backlog before that
        // would have been reset as the second was.
        let third = TcpStream::connect(addr).await.unwrap();
        let (_, peer, _) = next.await.unwrap();
        assert_eq!(peer, third.local_addr().unwrap(), "the next one is let in");
    }

    #[tokio::test(start_paused = true)]
    async fn the_warning_comes_at_most_once_a_minute() {
        let throttle = Throttle::default();
        assert!(throttle.ready(REFUSAL_WARNING_PERIOD));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert!(!throttle.ready(REFUSAL_WARNING_PERIOD));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(throttle.ready(REFUSAL_WARNING_PERIOD));
        assert!(!throttle.ready(REFUSAL_WARNING_PERIOD));
    }

    /// The data path's share of the descriptors: a quarter of the soft limit (Go raises
    /// the soft limit to the hard one at start, so kube-apiserver has the hard one).
    #[test]
    fn the_process_budget_is_a_quarter_of_the_soft_limit() {
        assert_eq!(descriptor_share(1024), 256);
        assert_eq!(descriptor_share(20_000), 5_000);
        assert_eq!(descriptor_share(u64::MAX), Semaphore::MAX_PERMITS);
        let budget = process_descriptor_budget();
        assert!(Arc::ptr_eq(&budget, &process_descriptor_budget()));
        assert!(Arc::ptr_eq(
            ConnectionLimits::default().descriptors(),
            &budget
        ));
    }

    #[test]
    fn bad_limits_are_refused() {
        assert_eq!(
            ConnectionLimits::new(Duration::ZERO, 1).unwrap_err(),
            ConnectionLimitsError::ZeroIdleTimeout
        );
        let e = ConnectionLimits::new(Duration::from_secs(1), 0).unwrap_err();
        assert!(e.to_string().contains("between 1 and"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn raising_the_open_files_limit_leaves_it_at_least_as_high() {
        let before = open_files_soft_limit();
        let after = raise_open_files_limit().unwrap();
        assert!(after >= before, "{after} < {before}");
        assert_eq!(open_files_soft_limit(), after);
    }
}
