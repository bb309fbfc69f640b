//! The connection slots of [`super::serve_tls`]: who may hold them, which idle connection
//! gives its slot up when the server is full, and the one warning line per
//! [`LIMIT_LOG_INTERVAL`] that says so.
//!
//! kube-apiserver has no connection cap (Go's `http.Server` is limited by file descriptors
//! only); this server keeps [`ServeOptions::max_connections`](super::ServeOptions) and
//! makes sure clients without credentials cannot hold all of them:
//!
//! - A connection is *unauthenticated* from its TCP accept until it presents a verified
//!   client certificate or a request on it authenticates (a bearer token). Until then it
//!   counts against its source address ([`Caps::per_source`]); once its TLS handshake is
//!   done without a certificate it also counts against the anonymous share
//!   ([`Caps::anonymous`], three quarters of the slots by default), so the last quarter is
//!   always left to authenticated clients.
//! - When a limit is reached, the oldest *idle* anonymous connection (no request in flight),
//!   or failing that the oldest handshake stalled for [`HANDSHAKE_EVICTION_AGE`], is closed
//!   to make room, rather than refusing the newcomer, which may be a client with a
//!   certificate. Only when there is none is the newcomer refused. Authenticated
//!   connections are never closed to make room.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    future::Future,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use ccm_serving::{Activity, CertificateIdentity, ConnectionHook, ConnectionSlot};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// A handshaking connection younger than this is never closed to make room: a client
/// completes its TLS handshake well within it, so only stalled handshakes (raw TCP
/// holding a slot) are taken.
pub(super) const HANDSHAKE_EVICTION_AGE: Duration = Duration::from_secs(1);

/// At most one warning line per this long about refused connections and connections
/// closed to make room, with the counts since the previous line.
pub(super) const LIMIT_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The limits enforced.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// All connections.
    pub(super) max: usize,
    /// Connections whose handshake completed without a client certificate and that have not
    /// authenticated since.
    pub(super) anonymous: usize,
    /// Unauthenticated connections (handshaking or anonymous) from one source address.
    pub(super) per_source: usize,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its source holds its share of unauthenticated connections, all busy.
    Source,
    /// Every slot is taken and no unauthenticated connection is idle.
    Full,
    /// The anonymous share is taken by busy connections.
    Anonymous,
}

impl Refusal {
    fn reason(self) -> &'static str {
        match self {
            Refusal::Source => "too many unauthenticated connections from this address",
            Refusal::Full => "connection limit reached",
            Refusal::Anonymous => "the share of connections without credentials is used",
        }
    }
}

/// What is known of one connection, shared by its task, its requests and the registry.
#[derive(Debug)]
pub(super) struct Conn {
    id: u64,
    ip: IpAddr,
    accepted: Instant,
    activity: Activity,
    close: CancellationToken,
    /// Set (under the registry's lock) when the connection gave its slot up.
    evicted: AtomicBool,
    /// Set once it no longer counts as unauthenticated.
    authenticated: AtomicBool,
}

impl Conn {
    fn new(id: u64, ip: IpAddr, now: Instant) -> Self {
        Conn {
            id,
            ip,
            accepted: now,
            activity: Activity::new(),
            close: CancellationToken::new(),
            evicted: AtomicBool::new(false),
            authenticated: AtomicBool::new(false),
        }
    }

    fn is_idle(&self) -> bool {
        self.activity.is_idle()
    }

    /// Marks a request in flight until the returned guard is dropped (with the response
    /// body, so a watch keeps its connection busy).
    #[cfg(test)]
    fn busy(self: &Arc<Self>) -> ccm_serving::Busy {
        self.activity.busy()
    }

    /// Resolves when the connection gave its slot up to a newcomer.
    pub(super) fn evicted(&self) -> WaitForCancellationFuture<'_> {
        self.close.cancelled()
    }

    /// Resolves once no request has been in flight for `limit` (Go's `IdleTimeout`).
    #[cfg(test)]
    async fn idle_for(&self, limit: Duration) {
        self.activity.idle_for(limit).await
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Handshaking,
    Anonymous,
}

#[derive(Debug)]
struct Unauthenticated {
    conn: Arc<Conn>,
    stage: Stage,
}

#[derive(Debug, Default)]
struct LimitLog {
    last: Option<Instant>,
    refused: u64,
    closed: u64,
}

impl LimitLog {
    /// Counts a refusal (or a connection closed to make room) and writes the warning line
    /// if none was written in the last [`LIMIT_LOG_INTERVAL`].
    fn note(&mut self, ip: IpAddr, refused: bool, reason: &str, caps: Caps) {
        if refused {
            self.refused += 1;
        } else {
            self.closed += 1;
        }
        let now = Instant::now();
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < LIMIT_LOG_INTERVAL)
        {
            return;
        }
        tracing::warn!(
            peer = %ip,
            reason,
            refused = self.refused,
            closed_idle = self.closed,
            max = caps.max,
            max_anonymous = caps.anonymous,
            max_per_source = caps.per_source,
            "connection limit reached: new connections refused and idle unauthenticated \
             connections closed (counts since the previous line; at most one line per 10 s)"
        );
        self.last = Some(now);
        self.refused = 0;
        self.closed = 0;
    }
}

#[derive(Debug)]
struct Registry {
    caps: Caps,
    next_id: u64,
    total: usize,
    anonymous: usize,
    /// Handshaking and anonymous connections, oldest first.
    unauthenticated: BTreeMap<u64, Unauthenticated>,
    per_source: HashMap<IpAddr, BTreeSet<u64>>,
    log: LimitLog,
}

impl Registry {
    fn admit(&mut self, ip: IpAddr, now: Instant) -> Result<Arc<Conn>, Refusal> {
        let from_source = self.per_source.get(&ip).map_or(0, BTreeSet::len);
        let victim = if from_source >= self.caps.per_source {
            Some(self.oldest_idle(Some(ip), now).ok_or(Refusal::Source)?)
        } else if self.total >= self.caps.max {
            Some(self.oldest_idle(None, now).ok_or(Refusal::Full)?)
        } else {
            None
        };
        if let Some(victim) = victim {
            self.evict(victim);
            let reason = if from_source >= self.caps.per_source {
                Refusal::Source
            } else {
                Refusal::Full
            };
            self.log.note(ip, false, reason.reason(), self.caps);
        }
        let id = self.next_id;
        self.next_id += 1;
        let conn = Arc::new(Conn::new(id, ip, now));
        self.total += 1;
        self.unauthenticated.insert(
            id,
            Unauthenticated {
                conn: conn.clone(),
                stage: Stage::Handshaking,
            },
        );
        self.per_source.entry(ip).or_default().insert(id);
        Ok(conn)
    }

    /// The unauthenticated connection to close to make room: idle anonymous, or a handshake
    /// stalled for [`HANDSHAKE_EVICTION_AGE`].
    ///
    /// - From one `source`: the oldest of either, so that a flood from one address churns
    ///   its own connections in turn rather than piling up handshakes for the server to
    ///   finish.
    /// - Across the server: the oldest idle anonymous one, and a handshake only when none
    ///   is idle, so that a client of another address whose handshake is slow (a loaded
    ///   server) is not taken while there are idle anonymous connections to close.
    fn oldest_idle(&self, source: Option<IpAddr>, now: Instant) -> Option<u64> {
        let idle_anonymous = |u: &Unauthenticated| u.stage == Stage::Anonymous && u.conn.is_idle();
        let stalled = |u: &Unauthenticated| {
            u.stage == Stage::Handshaking
                && now.duration_since(u.conn.accepted) >= HANDSHAKE_EVICTION_AGE
        };
        match source {
            Some(_) => self.first(source, |u| idle_anonymous(u) || stalled(u)),
            None => self
                .first(None, idle_anonymous)
                .or_else(|| self.first(None, stalled)),
        }
    }

    /// The oldest unauthenticated connection (from `source`, if given) that is `wanted`.
    fn first(
        &self,
        source: Option<IpAddr>,
        wanted: impl Fn(&Unauthenticated) -> bool,
    ) -> Option<u64> {
        match source {
            Some(ip) => self
                .per_source
                .get(&ip)?
                .iter()
                .copied()
                .find(|id| self.unauthenticated.get(id).is_some_and(&wanted)),
            None => self
                .unauthenticated
                .iter()
                .find(|(_, u)| wanted(u))
                .map(|(id, _)| *id),
        }
    }

    /// Takes `id`'s slot away and tells its task to close it.
    fn evict(&mut self, id: u64) {
        if let Some(conn) = self.forget(id) {
            conn.evicted.store(true, Ordering::Relaxed);
            self.total -= 1;
            conn.close.cancel();
        }
    }

    /// Removes `id` from the unauthenticated connections.
    fn forget(&mut self, id: u64) -> Option<Arc<Conn>> {
        let gone = self.unauthenticated.remove(&id)?;
        if gone.stage == Stage::Anonymous {
            self.anonymous -= 1;
        }
        if let Some(ids) = self.per_source.get_mut(&gone.conn.ip) {
            ids.remove(&id);
            if ids.is_empty() {
                self.per_source.remove(&gone.conn.ip);
            }
        }
        Some(gone.conn)
    }

    /// The handshake of `conn` completed without a client certificate.
    fn anonymous(&mut self, conn: &Conn) -> Result<(), Refusal> {
        if !self.unauthenticated.contains_key(&conn.id) {
            // Evicted meanwhile: its task closes it.
            return Ok(());
        }
        if self.anonymous >= self.caps.anonymous {
            let victim = self
                .unauthenticated
                .iter()
                .find(|(id, u)| **id != conn.id && u.stage == Stage::Anonymous && u.conn.is_idle())
                .map(|(id, _)| *id)
                .ok_or(Refusal::Anonymous)?;
            self.evict(victim);
            self.log
                .note(conn.ip, false, Refusal::Anonymous.reason(), self.caps);
        }
        if let Some(u) = self.unauthenticated.get_mut(&conn.id) {
            u.stage = Stage::Anonymous;
            self.anonymous += 1;
        }
        Ok(())
    }

    fn release(&mut self, conn: &Conn) {
        if conn.evicted.load(Ordering::Relaxed) {
            return;
        }
        self.forget(conn.id);
        self.total -= 1;
    }
}

/// The connection slots of one listener.
#[derive(Debug)]
pub(super) struct Limits(Mutex<Registry>);

impl Limits {
    pub(super) fn new(caps: Caps) -> Arc<Self> {
        Arc::new(Limits(Mutex::new(Registry {
            caps,
            next_id: 0,
            total: 0,
            anonymous: 0,
            unauthenticated: BTreeMap::new(),
            per_source: HashMap::new(),
            log: LimitLog::default(),
        })))
    }

    /// A slot for a connection just accepted from `ip`, closing an idle unauthenticated
    /// connection to make room if need be; `None` (logged at most once per
    /// [`LIMIT_LOG_INTERVAL`]) when there is none to close.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        // One address per IPv4 client, whether it came as IPv4 or IPv4-mapped IPv6.
        let ip = ip.to_canonical();
        let mut registry = self.0.lock();
        match registry.admit(ip, Instant::now()) {
            Ok(conn) => Some(Slot {
                limits: self.clone(),
                conn,
            }),
            Err(refusal) => {
                let caps = registry.caps;
                registry.log.note(ip, true, refusal.reason(), caps);
                None
            }
        }
    }

    fn authenticated(&self, conn: &Conn) {
        if conn.authenticated.swap(true, Ordering::Relaxed) {
            return;
        }
        self.0.lock().forget(conn.id);
    }

    #[cfg(test)]
    fn counts(&self) -> (usize, usize, usize) {
        let r = self.0.lock();
        (r.total, r.unauthenticated.len(), r.anonymous)
    }
}

/// A connection's slot, given back when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    limits: Arc<Limits>,
    conn: Arc<Conn>,
}

impl Slot {
    /// The connection.
    #[cfg(test)]
    fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// After the TLS handshake: a connection with a verified client certificate is
    /// authenticated; one without joins the anonymous share, closing the oldest idle
    /// anonymous connection if the share is full. `false`: the share is full of busy
    /// connections, close this one.
    pub(super) fn handshake_done(&self, certificate: bool) -> bool {
        if certificate {
            self.limits.authenticated(&self.conn);
            return true;
        }
        let mut registry = self.limits.0.lock();
        match registry.anonymous(&self.conn) {
            Ok(()) => true,
            Err(refusal) => {
                let caps = registry.caps;
                registry
                    .log
                    .note(self.conn.ip, true, refusal.reason(), caps);
                false
            }
        }
    }

    /// A handle for the connection's requests (see [`Promote`]).
    pub(super) fn promote_handle(&self) -> Promote {
        Promote {
            limits: self.limits.clone(),
            conn: self.conn.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limits.0.lock().release(&self.conn);
    }
}

/// Once a request on the connection authenticates (a bearer token), the connection leaves
/// the unauthenticated share.
#[derive(Debug, Clone)]
pub(super) struct Promote {
    limits: Arc<Limits>,
    conn: Arc<Conn>,
}

impl Promote {
    /// The connection is authenticated.
    pub(super) fn authenticated(&self) {
        if !self.conn.authenticated.load(Ordering::Relaxed) {
            self.limits.authenticated(&self.conn);
        }
    }
}

/// The slots as the shared accept loop ([`ccm_serving::serve`]) asks for them.
#[derive(Debug, Clone)]
pub(super) struct Hook(pub(super) Arc<Limits>);

impl ConnectionHook for Hook {
    type Slot = Slot;

    fn admit(&self, peer: SocketAddr) -> Option<Slot> {
        self.0.admit(peer.ip())
    }
}

impl ConnectionSlot for Slot {
    fn activity(&self) -> &Activity {
        &self.conn.activity
    }

    fn evicted(&self) -> impl Future<Output = ()> + Send + '_ {
        self.conn.evicted()
    }

    fn handshake_done(&self, certificate: Option<&CertificateIdentity>) -> bool {
        Slot::handshake_done(self, certificate.is_some())
    }

    fn authenticated(&self) {
        self.promote_handle().authenticated();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(max: usize, anonymous: usize, per_source: usize) -> Caps {
        Caps {
            max,
            anonymous,
            per_source,
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// No upstream counterpart (Go's server has no cap): anonymous connections past the
    /// share replace the oldest idle one, and never take the slots left to authenticated
    /// clients.
    #[tokio::test(start_paused = true)]
    async fn anonymous_connections_never_take_the_authenticated_share() {
        let limits = Limits::new(caps(8, 6, 100));
        let mut anonymous = Vec::new();
        for _ in 0..20 {
            let slot = limits.admit(ip(2)).expect("admitted");
            assert!(slot.handshake_done(false));
            anonymous.push(slot);
        }
        assert_eq!(limits.counts(), (6, 6, 6));
        // The oldest 14 were told to close; the newest 6 hold the share.
        for (i, slot) in anonymous.iter().enumerate() {
            assert_eq!(slot.conn().close.is_cancelled(), i < 14, "connection {i}");
        }
        // Two authenticated clients use the rest; more replace idle anonymous ones.
        let mut authenticated = Vec::new();
        for _ in 0..4 {
            let slot = limits
                .admit(ip(3))
                .expect("an authenticated client is admitted");
            assert!(slot.handshake_done(true));
            authenticated.push(slot);
        }
        assert_eq!(limits.counts(), (8, 4, 4));
        drop(anonymous);
        assert_eq!(limits.counts(), (4, 0, 0));
        drop(authenticated);
        assert_eq!(limits.counts(), (0, 0, 0));
    }

    /// Busy anonymous connections are not closed; a newcomer is refused instead, but only
    /// once its own handshake shows it has no certificate.
    #[tokio::test(start_paused = true)]
    async fn busy_connections_are_not_closed_to_make_room() {
        let limits = Limits::new(caps(4, 2, 100));
        let a = limits.admit(ip(2)).unwrap();
        let b = limits.admit(ip(2)).unwrap();
        assert!(a.handshake_done(false) && b.handshake_done(false));
        let _busy = (a.conn().busy(), b.conn().busy());
        let c = limits.admit(ip(2)).expect("room for a handshake");
        assert!(
            !c.handshake_done(false),
            "the share is full of busy connections"
        );
        let d = limits.admit(ip(4)).unwrap();
        assert!(d.handshake_done(true));
        assert!(!a.conn().close.is_cancelled() && !b.conn().close.is_cancelled());
    }

    /// A handshake in progress is not taken for a newcomer until it has stalled for
    /// [`HANDSHAKE_EVICTION_AGE`]; authenticated connections never are.
    #[tokio::test(start_paused = true)]
    async fn only_stalled_handshakes_give_their_slot_up() {
        let limits = Limits::new(caps(2, 2, 100));
        let authenticated = limits.admit(ip(2)).unwrap();
        assert!(authenticated.handshake_done(true));
        let handshaking = limits.admit(ip(3)).unwrap();
        assert!(limits.admit(ip(4)).is_none(), "a young handshake is kept");
        tokio::time::advance(HANDSHAKE_EVICTION_AGE).await;
        let newcomer = limits.admit(ip(4)).expect("a stalled handshake gives way");
        assert!(handshaking.conn().close.is_cancelled());
        assert!(!authenticated.conn().close.is_cancelled());
        drop(handshaking);
        assert_eq!(limits.counts(), (2, 1, 0));
        drop(newcomer);
        assert_eq!(limits.counts(), (1, 0, 0));
    }

    /// When the server is full, a handshake slowed past [`HANDSHAKE_EVICTION_AGE`] (a
    /// loaded server) is not taken while an idle anonymous connection can be closed
    /// instead; within one address the oldest goes first.
    #[tokio::test(start_paused = true)]
    async fn idle_anonymous_connections_go_before_slow_handshakes() {
        let limits = Limits::new(caps(2, 2, 100));
        let slow = limits.admit(ip(2)).unwrap();
        tokio::time::advance(HANDSHAKE_EVICTION_AGE * 3).await;
        let anonymous = limits.admit(ip(3)).unwrap();
        assert!(anonymous.handshake_done(false));
        let _newcomer = limits.admit(ip(4)).expect("room made");
        assert!(anonymous.conn().close.is_cancelled());
        assert!(
            !slow.conn().close.is_cancelled(),
            "the slow handshake is kept"
        );
        assert!(slow.handshake_done(true));

        let limits = Limits::new(caps(100, 100, 2));
        let stalled = limits.admit(ip(2)).unwrap();
        tokio::time::advance(HANDSHAKE_EVICTION_AGE).await;
        let anonymous = limits.admit(ip(2)).unwrap();
        assert!(anonymous.handshake_done(false));
        let _newcomer = limits.admit(ip(2)).expect("room made");
        assert!(
            stalled.conn().close.is_cancelled(),
            "the oldest of the address goes"
        );
        assert!(!anonymous.conn().close.is_cancelled());
    }

    /// One source holds at most `per_source` unauthenticated connections; a new one from it
    /// replaces its oldest idle one, and other sources are untouched.
    #[tokio::test(start_paused = true)]
    async fn a_source_holds_its_share_only() {
        let limits = Limits::new(caps(100, 100, 3));
        let other = limits.admit(ip(9)).unwrap();
        assert!(other.handshake_done(false));
        let mut mine = Vec::new();
        for _ in 0..5 {
            let slot = limits.admit(ip(2)).unwrap();
            assert!(slot.handshake_done(false));
            mine.push(slot);
        }
        let closed: Vec<bool> = mine.iter().map(|s| s.conn().close.is_cancelled()).collect();
        assert_eq!(closed, [true, true, false, false, false]);
        assert!(!other.conn().close.is_cancelled());
        // A connection that authenticated (a bearer token) no longer counts for its source.
        mine[4].promote_handle().authenticated();
        let _slot = limits.admit(ip(2)).unwrap();
        assert!(!mine[2].conn().close.is_cancelled());
    }

    /// Go's `http.Server.IdleTimeout`: the idle time counts from the end of the last
    /// request, and a connection with a request in flight is never idle.
    #[tokio::test(start_paused = true)]
    async fn idle_time_counts_from_the_last_request() {
        let conn = Arc::new(Conn::new(0, ip(2), Instant::now()));
        let start = Instant::now();
        let busy = conn.busy();
        let watcher = tokio::spawn({
            let conn = conn.clone();
            async move { conn.idle_for(Duration::from_secs(90)).await }
        });
        tokio::time::sleep(Duration::from_secs(200)).await;
        assert!(!watcher.is_finished(), "a busy connection is not idle");
        drop(busy);
        watcher.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(290));
    }
}
