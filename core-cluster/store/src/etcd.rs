//! [`EtcdStore`]: the store on etcd v3, the engine Kubernetes itself stores in.
//!
//! The model maps one to one onto etcd's (upstream's
//! `staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`):
//!
//! - a key is stored at `namespace + key`; `resourceVersion` is etcd's `mod_revision`;
//! - create is a transaction `If(CreateRevision(k) == 0) Then(Put) Else(Get)`; update and
//!   delete compare `ModRevision(k)` with the expected revision (or `CreateRevision(k) > 0`
//!   when none is expected), and read the key in the `Else` branch to tell a conflict from a
//!   missing key. A failed transaction consumes no revision in etcd either;
//! - lists are ranges at a revision, so continue tokens stay valid on every API server that
//!   shares the etcd, until compaction;
//! - watches are served from this server's watch window (upstream's watch cache), fed by one
//!   etcd watch over the whole namespace with `prev_kv` and progress notifications. Writes
//!   made through any server sharing the etcd reach every server's watchers. A write returns
//!   once its event is in this server's window, so `current_revision` stays a safe bookmark
//!   (upstream: `RequestWatchProgress` before serving a consistent read from the cache);
//! - compaction is coordinated through the compact key as upstream's `compact.go` does: a
//!   server compacts only if no other server did since its last look, so among several
//!   servers one compacts per interval;
//! - each member has its own connection, and requests go to the members that answer, by
//!   the rules of etcd's Go client (`etcd_members`): a request that never reached etcd is
//!   sent to the next member, a member that fails leaves the balance set until it answers
//!   again, and a write that may have reached etcd is settled rather than blindly repeated
//!   (see below). With one member of three down, no request fails.
//!
//! A write whose outcome is unknown (the connection to its member broke after it was sent,
//! or etcd answered that it timed out or that the leader changed) is sent again, to another
//! member if its own failed: every write is a transaction compared on a revision, which
//! etcd applies at most once however often it is sent. When the repeat is refused, the
//! store looks at what the key became: if the first attempt was applied (the key holds
//! exactly this write's value, or the key's first change after the expected revision is
//! this write), the write succeeded at that revision; otherwise the refusal stands (a
//! conflict, as without the failure). An update or delete with no expected revision is
//! not compared on one, so its unknown outcome is reported as an error, as kube-apiserver's
//! client does.
//!
//! etcd's own behaviour absorbed here: an empty etcd is at revision 1 (not 0); compacting at
//! or below the compacted revision is an error in etcd and a no-op here; a watch from a
//! compacted revision is created and then cancelled with the compact revision, which ends
//! this server's watchers (they re-list, as after a 410) and restarts the feed.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::Notify;

use std::path::PathBuf;

use super::etcd_members::{self, Members, Policy, SendError};
use super::etcd_options::{COMPACT_KEY, EtcdOptions};
use super::window::WatchWindow;
use super::{
    EventKind, KeyValue, ListResult, Store, StoreError, WatchEvent, WatchStream, prefix_end,
};

/// How long a write waits for its own event to come back through the feed before it is
/// acknowledged anyway (the write is committed in etcd; only this server's watchers lag).
const FEED_WAIT: Duration = Duration::from_secs(5);
/// The largest response taken from etcd: clientv3's default `MaxCallRecvMsgSize`
/// (`math.MaxInt32`), which kube-apiserver keeps, rather than tonic's 4 MiB, which failed a
/// list of 10,000 Nodes (about 9 MiB).
const MAX_RESPONSE_BYTES: usize = i32::MAX as usize;
/// How long to wait before re-establishing a broken feed.
const FEED_RETRY: Duration = Duration::from_millis(200);

struct Inner {
    /// Every member, each with its own connection, and the balance set.
    members: Arc<Members>,
    namespace: String,
    window: WatchWindow,
    /// Every event up to this revision has been published into the window.
    published: tokio::sync::watch::Sender<u64>,
    /// Asks the feed for a progress notification.
    progress: Notify,
    /// The highest compaction revision this server knows of.
    compacted: AtomicU64,
    /// The compact key's version when this server last looked (upstream's `t`).
    compact_version: AtomicI64,
    timeout: Duration,
    /// The last value of recently written keys, from the feed (see [`Store::recent`]).
    recent: parking_lot::Mutex<Recent>,
}

/// The last value of up to `capacity` recently written keys.
#[derive(Default)]
struct Recent {
    capacity: usize,
    keys: std::collections::HashMap<String, KeyValue>,
}

impl Recent {
    fn put(&mut self, kv: KeyValue) {
        if self.capacity == 0 {
            return;
        }
        if self
            .keys
            .get(&kv.key)
            .is_some_and(|held| held.mod_revision >= kv.mod_revision)
        {
            return;
        }
        self.keys.insert(kv.key.clone(), kv);
        if self.keys.len() > self.capacity {
            // Keep the most recently written three quarters.
            let mut revisions: Vec<u64> = self.keys.values().map(|kv| kv.mod_revision).collect();
            let drop = self.keys.len() - self.capacity * 3 / 4;
            let (_, cutoff, _) = revisions.select_nth_unstable(drop - 1);
            let cutoff = *cutoff;
            self.keys.retain(|_, kv| kv.mod_revision > cutoff);
        }
    }

    fn delete(&mut self, key: &str) {
        self.keys.remove(key);
    }
}

/// A [`Store`] on etcd v3 (how the store maps onto etcd: the [crate docs](crate)).
pub struct EtcdStore {
    inner: Arc<Inner>,
    feed: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        self.feed.abort();
    }
}

fn backend(context: &str, error: SendError) -> StoreError {
    StoreError::backend(format!("etcd: {context}"), error)
}

/// How many times a write whose outcome is unknown is sent again before the error is
/// reported (each repeat is tried on the members for up to the request timeout).
const UNSURE_REPEATS: u32 = 3;

fn is_compacted(error: &SendError) -> bool {
    error.answered().is_some_and(|error| {
        error
            .to_string()
            .contains("required revision has been compacted")
    })
}

fn is_future(error: &SendError) -> bool {
    error.answered().is_some_and(|error| {
        error
            .to_string()
            .contains("required revision is a future revision")
    })
}

fn revision(header: Option<&etcd_client::ResponseHeader>) -> u64 {
    header.map_or(0, |h| u64::try_from(h.revision()).unwrap_or(0))
}

fn rev_i64(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

async fn read_pem(path: &PathBuf, what: &str) -> Result<Vec<u8>, StoreError> {
    tokio::fs::read(path)
        .await
        .map_err(|source| StoreError::Io {
            context: format!("reading the etcd {what} {}", path.display()),
            source,
        })
}

impl EtcdStore {
    /// Connects to etcd, reads its current revision and the compaction state, and starts
    /// the watch feed. Fails when etcd cannot be reached within the request timeout.
    pub async fn connect(options: EtcdOptions) -> Result<Self, StoreError> {
        let mut connect = ConnectOptions::new()
            .with_timeout(options.request_timeout)
            .with_connect_timeout(options.request_timeout)
            .with_keep_alive(Duration::from_secs(10), options.request_timeout)
            // clientv3's `WithRequireLeader`: a member cut off from the leader turns requests
            // away at once ("etcdserver: no leader"), and they go to another member.
            .with_require_leader(true);
        let tls = &options.tls;
        if tls.ca_file.is_some() || tls.cert_file.is_some() || tls.key_file.is_some() {
            let mut config = TlsOptions::new();
            if let Some(ca) = &tls.ca_file {
                config = config.ca_certificate(Certificate::from_pem(read_pem(ca, "CA").await?));
            }
            match (&tls.cert_file, &tls.key_file) {
                (Some(cert), Some(key)) => {
                    config = config.identity(Identity::from_pem(
                        read_pem(cert, "client certificate").await?,
                        read_pem(key, "client key").await?,
                    ));
                }
                (None, None) => {}
                _ => {
                    return Err(StoreError::backend(
                        "etcd TLS",
                        std::io::Error::other(
                            "a client certificate needs both its certificate and key file",
                        ),
                    ));
                }
            }
            connect = connect.with_tls(config);
        }
        if options.endpoints.is_empty() {
            return Err(StoreError::backend(
                "etcd: connecting",
                std::io::Error::other("no etcd endpoint given"),
            ));
        }
        // One client, so one channel, per member: a request is routed to a member that
        // answers instead of to whichever connection a shared channel picks.
        let mut clients = Vec::with_capacity(options.endpoints.len());
        for url in &options.endpoints {
            let client = tokio::time::timeout(
                options.request_timeout,
                Client::connect([url.as_str()], Some(connect.clone())),
            )
            .await
            .map_err(|_| {
                StoreError::backend(
                    "etcd: connecting",
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer from {url}"),
                    ),
                )
            })?
            .map_err(|source| StoreError::backend(format!("etcd: connecting to {url}"), source))?;
            clients.push((url.clone(), client));
        }
        let namespace = options.namespace.clone();
        let compact_key = format!("{namespace}{COMPACT_KEY}").into_bytes();
        let members = Members::new(clients, options.request_timeout, compact_key.clone());
        let response = members
            .send(Policy::Repeatable, |client| {
                let key = compact_key.clone();
                async move {
                    client
                        .kv_client()
                        .max_decoding_message_size(MAX_RESPONSE_BYTES)
                        .get(key, None)
                        .await
                }
            })
            .await
            .map_err(|e| backend("reading the compaction state", e))?;
        let start = revision(response.header());
        let (compacted, compact_version) = response.kvs().first().map_or((0, 0), |kv| {
            let value = std::str::from_utf8(kv.value())
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (value, kv.version())
        });
        let inner = Arc::new(Inner {
            members,
            namespace,
            window: WatchWindow::new(options.watch, start),
            published: tokio::sync::watch::Sender::new(start),
            progress: Notify::new(),
            compacted: AtomicU64::new(compacted),
            compact_version: AtomicI64::new(compact_version),
            timeout: options.request_timeout,
            recent: parking_lot::Mutex::new(Recent {
                capacity: options.recent_writes,
                ..Recent::default()
            }),
        });
        let feed = tokio::spawn(feed(inner.clone()));
        Ok(Self { inner, feed })
    }
}

impl EtcdStore {
    /// The client URLs of the members that requests go to now (the balance set, clientv3's
    /// READY connections): a member leaves it when its connection fails or it has no leader,
    /// and rejoins once it answers a linearizable read again.
    pub fn available_members(&self) -> Vec<String> {
        self.inner.members.available()
    }
}

impl Inner {
    fn key(&self, key: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.namespace.len() + key.len());
        out.extend_from_slice(self.namespace.as_bytes());
        out.extend_from_slice(key.as_bytes());
        out
    }

    /// The store's key of an etcd key, or `None` for keys outside the namespace, not UTF-8,
    /// or the compact key.
    fn store_key(&self, key: &[u8]) -> Option<String> {
        let key = key.strip_prefix(self.namespace.as_bytes())?;
        if key == COMPACT_KEY.as_bytes() {
            return None;
        }
        String::from_utf8(key.to_vec()).ok()
    }

    fn kv(&self, kv: &etcd_client::KeyValue) -> Option<KeyValue> {
        Some(KeyValue {
            key: self.store_key(kv.key())?,
            value: Bytes::copy_from_slice(kv.value()),
            create_revision: u64::try_from(kv.create_revision()).unwrap_or(0),
            mod_revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
        })
    }

    fn compact_key(&self) -> Vec<u8> {
        self.key(COMPACT_KEY)
    }

    /// A Range request, sent to the members in turn while one is unavailable, as etcd's
    /// clientv3 retry interceptor repeats Range, a repeatable request
    /// (`isSafeRetryImmutableRPC`): with one member of three down, reads still succeed.
    async fn range(
        &self,
        key: Vec<u8>,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, SendError> {
        self.members
            .send(Policy::Repeatable, |client| {
                let (key, options) = (key.clone(), options.clone());
                async move {
                    client
                        .kv_client()
                        .max_decoding_message_size(MAX_RESPONSE_BYTES)
                        .get(key, options)
                        .await
                }
            })
            .await
    }

    /// etcd's current revision (a linearizable read).
    async fn etcd_revision(&self) -> Result<u64, StoreError> {
        let response = self
            .range(
                self.compact_key(),
                Some(GetOptions::new().with_count_only()),
            )
            .await
            .map_err(|e| backend("reading the current revision", e))?;
        Ok(revision(response.header()))
    }

    /// Waits until the feed has published every event up to `revision`, asking etcd for a
    /// progress notification where the namespace saw no event at it.
    async fn await_published(&self, revision: u64) -> bool {
        self.await_published_asking(revision, true).await
    }

    /// [`Self::await_published`], asking for progress notifications only if `ask`. A
    /// write's own revision is an event under the namespace, which the feed delivers
    /// unasked: waiting for it without asking spares etcd a progress request per write
    /// (with 64 concurrent writers, one every few milliseconds).
    async fn await_published_asking(&self, revision: u64, ask: bool) -> bool {
        let mut published = self.published.subscribe();
        let wait = async {
            loop {
                if *published.borrow_and_update() >= revision {
                    return;
                }
                if ask {
                    self.progress.notify_one();
                    // Re-ask now and then: a progress request is answered only once the
                    // feed's watcher has caught up.
                    let _ =
                        tokio::time::timeout(Duration::from_millis(100), published.changed()).await;
                } else if published.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(FEED_WAIT, wait).await.is_ok()
    }

    async fn acknowledged(&self, revision: u64) -> u64 {
        if !self.await_published_asking(revision, false).await {
            tracing::warn!(
                revision,
                "etcd: the watch feed has not delivered a committed write; watchers lag"
            );
        }
        revision
    }

    /// The error for a list at a compacted revision: `oldest_available` from the compact key.
    async fn expired(&self, requested: u64) -> StoreError {
        if let Ok(response) = self.range(self.compact_key(), None).await
            && let Some(value) = response
                .kvs()
                .first()
                .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok())
        {
            self.compacted.fetch_max(value, Ordering::AcqRel);
        }
        StoreError::Expired {
            requested,
            oldest_available: self.compacted.load(Ordering::Acquire).max(requested + 1),
        }
    }

    async fn future(&self, requested: u64) -> StoreError {
        match self.etcd_revision().await {
            Ok(current) => StoreError::FutureRevision { requested, current },
            Err(error) => error,
        }
    }

    /// Sends a transaction, never blindly again: one that never reached etcd goes to the next
    /// member, one whose outcome is unknown fails with [`SendError::Unknown`].
    async fn send_txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, SendError> {
        self.members
            .send(Policy::NonRepeatable, |client| {
                let txn = txn.clone();
                async move {
                    client
                        .kv_client()
                        .max_decoding_message_size(MAX_RESPONSE_BYTES)
                        .txn(txn)
                        .await
                }
            })
            .await
    }

    /// Runs a transaction comparing `compare` and doing `then`, reading the key otherwise.
    /// Returns the response on success, or the key's current state on failure. A write that
    /// never reached etcd is sent to the next member; one whose outcome is unknown fails
    /// with [`SendError::Unknown`] (see [`Inner::write`]).
    async fn txn(
        &self,
        key: &[u8],
        compare: Compare,
        then: TxnOp,
    ) -> Result<Result<etcd_client::TxnResponse, Option<KeyValue>>, SendError> {
        let txn = Txn::new()
            .when([compare])
            .and_then([then])
            .or_else([TxnOp::get(key, None)]);
        let response = self.send_txn(txn).await?;
        if response.succeeded() {
            return Ok(Ok(response));
        }
        let current = response
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => Some(get.kvs().first().and_then(|kv| self.kv(kv))),
                _ => None,
            })
            .flatten();
        Ok(Err(current))
    }

    /// Runs `write` on `key`: its transaction, sent again while its outcome is unknown (at
    /// most [`UNSURE_REPEATS`] times). The transactions compare a revision, so etcd applies
    /// at most one of the attempts; when a repeat is refused, [`Inner::settle`] tells
    /// whether an earlier attempt was the one applied.
    async fn write(&self, key: &str, write: Write<'_>) -> Result<Written, StoreError> {
        let k = self.key(key);
        let mut repeats = 0;
        loop {
            let outcome = self.txn(&k, write.compare(&k), write.operation(&k)).await;
            match outcome {
                Ok(Ok(response)) => return Ok(Written::from(response, self)),
                Ok(Err(current)) if repeats == 0 => return Err(write.refused(key, current)),
                Ok(Err(current)) => return self.settle(key, &k, &write, current).await,
                Err(SendError::Unknown(error))
                    if write.repeatable() && repeats < UNSURE_REPEATS =>
                {
                    repeats += 1;
                    tracing::debug!(
                        key,
                        %error,
                        repeats,
                        "etcd: a write's outcome is unknown; sending it again"
                    );
                }
                Err(error) if repeats > 0 => {
                    return Err(backend(
                        &format!(
                            "{}: the outcome of an earlier attempt is unknown, and repeating it failed",
                            write.what()
                        ),
                        error,
                    ));
                }
                Err(error) => return Err(backend(write.what(), error)),
            }
        }
    }

    /// A repeat of `write` was refused after an earlier attempt's outcome was unknown:
    /// whether that attempt was applied (then the write succeeded, at its revision) or not
    /// (then the refusal stands). `current` is the key's state when the repeat was refused.
    async fn settle(
        &self,
        key: &str,
        k: &[u8],
        write: &Write<'_>,
        current: Option<KeyValue>,
    ) -> Result<Written, StoreError> {
        let settled = match (write, &current) {
            // The value carries the object's fresh uid: equal bytes are this create.
            (Write::Create { value }, Some(kv)) => {
                if kv.value == **value && kv.mod_revision == kv.create_revision {
                    Some(Written::at(kv.create_revision))
                } else {
                    // Modified since: the key as it was created.
                    self.range(
                        k.to_vec(),
                        Some(GetOptions::new().with_revision(rev_i64(kv.create_revision))),
                    )
                    .await
                    .ok()
                    .and_then(|r| r.kvs().first().and_then(|kv| self.kv(kv)))
                    .filter(|created| created.value == **value)
                    .map(|created| Written::at(created.create_revision))
                }
            }
            (Write::Create { .. }, None) => None,
            (Write::Update { value, .. }, Some(kv)) if kv.value == **value => {
                Some(Written::at(kv.mod_revision))
            }
            (Write::Update { value, expected }, _) => {
                match self.first_change_after(k, expected.unwrap_or(0)).await {
                    Some(change)
                        if change.follows(*expected)
                            && change.value.as_deref() == Some(&value[..]) =>
                    {
                        Some(Written::at(change.revision))
                    }
                    _ => None,
                }
            }
            (Write::Delete { expected }, _) => {
                match self.first_change_after(k, expected.unwrap_or(0)).await {
                    Some(change) if change.follows(*expected) && change.value.is_none() => {
                        Some(Written {
                            revision: change.revision,
                            prev: change.prev,
                        })
                    }
                    _ => None,
                }
            }
        };
        match settled {
            Some(written) => {
                tracing::debug!(
                    key,
                    revision = written.revision,
                    "etcd: an earlier attempt of a write whose outcome was unknown was applied"
                );
                Ok(written)
            }
            None => Err(write.refused(key, current)),
        }
    }

    /// The first change of `key` after `revision`, from etcd's history (a watch from
    /// `revision + 1`), if there was one and its history is not compacted: a write compared
    /// on `mod_revision == revision` that was applied is that change.
    async fn first_change_after(&self, key: &[u8], revision: u64) -> Option<Change> {
        if revision == 0 {
            return None;
        }
        let options = WatchOptions::new()
            .with_start_revision(rev_i64(revision + 1))
            .with_prev_key();
        let look = async {
            let (_, mut stream) = self
                .members
                .watch(key.to_vec(), options, MAX_RESPONSE_BYTES)
                .await
                .ok()?;
            loop {
                let response = stream.message().await.ok()??;
                if response.canceled() {
                    return None;
                }
                if let Some(event) = response.events().first() {
                    let kv = event.kv()?;
                    return Some(Change {
                        revision: u64::try_from(kv.mod_revision()).unwrap_or(0),
                        value: (event.event_type() == EventType::Put)
                            .then(|| Bytes::copy_from_slice(kv.value())),
                        prev: event.prev_kv().and_then(|prev| self.kv(prev)),
                    });
                }
            }
        };
        tokio::time::timeout(self.timeout, look)
            .await
            .ok()
            .flatten()
    }

    /// The compare guarding an update or delete.
    fn guard(key: &[u8], expected: Option<u64>) -> Compare {
        match expected {
            Some(expected) => Compare::mod_revision(key, CompareOp::Equal, rev_i64(expected)),
            None => Compare::create_revision(key, CompareOp::Greater, 0),
        }
    }

    fn refused(key: &str, expected: Option<u64>, current: Option<KeyValue>) -> StoreError {
        match (current, expected) {
            (Some(current), Some(expected)) => StoreError::Conflict {
                key: key.to_owned(),
                expected,
                actual: current.mod_revision,
            },
            _ => StoreError::NotFound {
                key: key.to_owned(),
            },
        }
    }
}

/// One of the store's writes, as a transaction compared on a revision.
enum Write<'a> {
    /// Create: `If(CreateRevision(k) == 0) Then(Put)`.
    Create {
        /// The value to write.
        value: &'a Bytes,
    },
    /// Update: `If(ModRevision(k) == expected) Then(Put)`, or `CreateRevision(k) > 0`.
    Update {
        /// The value to write.
        value: &'a Bytes,
        /// The key's expected mod revision.
        expected: Option<u64>,
    },
    /// Delete: `If(ModRevision(k) == expected) Then(Delete)`, or `CreateRevision(k) > 0`.
    Delete {
        /// The key's expected mod revision.
        expected: Option<u64>,
    },
}

impl Write<'_> {
    fn what(&self) -> &'static str {
        match self {
            Write::Create { .. } => "create",
            Write::Update { .. } => "update",
            Write::Delete { .. } => "delete",
        }
    }

    fn compare(&self, k: &[u8]) -> Compare {
        match self {
            Write::Create { .. } => Compare::create_revision(k, CompareOp::Equal, 0),
            Write::Update { expected, .. } | Write::Delete { expected } => {
                Inner::guard(k, *expected)
            }
        }
    }

    fn operation(&self, k: &[u8]) -> TxnOp {
        match self {
            Write::Create { value } => TxnOp::put(k, value.to_vec(), None),
            Write::Update { value, .. } => TxnOp::put(k, value.to_vec(), Some(PutOptions::new())),
            Write::Delete { .. } => {
                TxnOp::delete(k, Some(etcd_client::DeleteOptions::new().with_prev_key()))
            }
        }
    }

    /// Whether sending it again cannot apply it twice: it is compared on a revision (a
    /// create on the key's absence). An update or delete of whatever revision is not.
    fn repeatable(&self) -> bool {
        match self {
            Write::Create { .. } => true,
            Write::Update { expected, .. } | Write::Delete { expected } => expected.is_some(),
        }
    }

    /// The error for a refused write, from the key's state when refused.
    fn refused(&self, key: &str, current: Option<KeyValue>) -> StoreError {
        match self {
            Write::Create { .. } => StoreError::AlreadyExists {
                key: key.to_owned(),
            },
            Write::Update { expected, .. } | Write::Delete { expected } => {
                Inner::refused(key, *expected, current)
            }
        }
    }
}

/// A write that was applied: its revision, and for a delete the key's state before it.
struct Written {
    revision: u64,
    prev: Option<KeyValue>,
}

impl Written {
    fn at(revision: u64) -> Self {
        Written {
            revision,
            prev: None,
        }
    }

    fn from(response: etcd_client::TxnResponse, inner: &Inner) -> Self {
        let prev = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Delete(delete) => delete.prev_kvs().first().and_then(|kv| inner.kv(kv)),
            _ => None,
        });
        Written {
            revision: revision(response.header()),
            prev,
        }
    }
}

/// One change of a key from etcd's history.
struct Change {
    /// The change's revision.
    revision: u64,
    /// The value put, or `None` for a delete.
    value: Option<Bytes>,
    /// The key's state before the change.
    prev: Option<KeyValue>,
}

impl Change {
    /// Whether the change was made to the key at mod revision `expected`, as a write
    /// compared on it would be.
    fn follows(&self, expected: Option<u64>) -> bool {
        expected.is_some() && self.prev.as_ref().map(|prev| prev.mod_revision) == expected
    }
}

/// Follows every change under the namespace into the window, re-establishing the etcd
/// watch after errors from the last published revision.
async fn feed(inner: Arc<Inner>) {
    let range_end = prefix_end(inner.namespace.as_bytes()).unwrap_or_else(|| vec![0]);
    // etcd refuses an empty key; "\0" up to "\0" means every key.
    let watch_key = if inner.namespace.is_empty() {
        vec![0]
    } else {
        inner.namespace.as_bytes().to_vec()
    };
    loop {
        let from = *inner.published.borrow() + 1;
        let options = WatchOptions::new()
            .with_range(range_end.clone())
            .with_start_revision(rev_i64(from))
            .with_prev_key()
            .with_progress_notify();
        // On a member of the balance set; when it fails, the feed watches on from the last
        // published revision on another.
        let opened = inner
            .members
            .watch(watch_key.clone(), options, MAX_RESPONSE_BYTES)
            .await;
        let (member, mut stream) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                tracing::debug!(%error, "etcd: the watch feed could not start; retrying");
                tokio::time::sleep(FEED_RETRY).await;
                continue;
            }
        };
        loop {
            let message = tokio::select! {
                message = stream.message() => message,
                () = inner.progress.notified() => {
                    if stream.request_progress().await.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => break,
                Err(error) => {
                    let fate = etcd_members::fate(&error);
                    inner.members.failed(member, &error, fate);
                    tracing::debug!(%error, "etcd: the watch feed broke; re-watching");
                    break;
                }
            };
            if response.canceled() {
                let compacted = u64::try_from(response.compact_revision()).unwrap_or(0);
                if compacted > 0 {
                    // The history this server's watchers still needed is gone: end them (they
                    // re-list, as after a 410) and follow on from the current revision.
                    match inner.etcd_revision().await {
                        Ok(current) => {
                            tracing::warn!(
                                compacted,
                                current,
                                "etcd: the watch feed fell behind a compaction; ending watchers"
                            );
                            inner.compacted.fetch_max(compacted, Ordering::AcqRel);
                            inner.window.reset(current);
                            inner.recent.lock().keys.clear();
                            inner.published.send_replace(current);
                        }
                        Err(_) => tokio::time::sleep(FEED_RETRY).await,
                    }
                }
                break;
            }
            if response.created() {
                continue;
            }
            let events = response.events();
            if events.is_empty() {
                // A progress notification: every event up to its revision was delivered.
                let at = revision(response.header());
                inner.published.send_if_modified(|published| {
                    let raise = at > *published;
                    *published = (*published).max(at);
                    raise
                });
                continue;
            }
            let mut last = 0;
            let mut out = Vec::with_capacity(events.len());
            for event in events {
                let Some(kv) = event.kv() else { continue };
                let rev = u64::try_from(kv.mod_revision()).unwrap_or(0);
                last = last.max(rev);
                let Some(key) = inner.store_key(kv.key()) else {
                    continue;
                };
                let prev_value = event.prev_kv().and_then(|prev| inner.kv(prev));
                let put = event.event_type() == etcd_client::EventType::Put;
                out.push(WatchEvent {
                    kind: if put {
                        EventKind::Put
                    } else {
                        EventKind::Delete
                    },
                    key,
                    value: put.then(|| Bytes::copy_from_slice(kv.value())),
                    create_revision: if put {
                        u64::try_from(kv.create_revision()).unwrap_or(0)
                    } else {
                        prev_value.as_ref().map_or(0, |p| p.create_revision)
                    },
                    prev_value,
                    revision: rev,
                });
            }
            {
                let mut recent = inner.recent.lock();
                for event in &out {
                    match (&event.kind, &event.value) {
                        (EventKind::Put, Some(value)) => recent.put(KeyValue {
                            key: event.key.clone(),
                            value: value.clone(),
                            create_revision: event.create_revision,
                            mod_revision: event.revision,
                        }),
                        _ => recent.delete(&event.key),
                    }
                }
            }
            inner.window.publish(out);
            inner.published.send_if_modified(|published| {
                let raise = last > *published;
                *published = (*published).max(last);
                raise
            });
        }
        tokio::time::sleep(FEED_RETRY).await;
    }
}

#[async_trait]
impl Store for EtcdStore {
    fn recent(&self, key: &str) -> Option<KeyValue> {
        self.inner.recent.lock().keys.get(key).cloned()
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let inner = &self.inner;
        let response = inner
            .range(inner.key(key), None)
            .await
            .map_err(|e| backend("get", e))?;
        Ok(response.kvs().first().and_then(|kv| inner.kv(kv)))
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at_revision: Option<u64>,
    ) -> Result<ListResult, StoreError> {
        let inner = &self.inner;
        let full_prefix = inner.key(prefix);
        let start = match start_after {
            Some(after) if after >= prefix => {
                let mut start = inner.key(after);
                start.push(0);
                start
            }
            _ => full_prefix.clone(),
        };
        let end = prefix_end(&full_prefix).unwrap_or_else(|| vec![0]);
        let mut options = GetOptions::new().with_range(end);
        if let Some(limit) = limit.filter(|&l| l > 0) {
            options = options.with_limit(i64::try_from(limit).unwrap_or(i64::MAX));
        }
        if let Some(at) = at_revision.filter(|&at| at > 0) {
            options = options.with_revision(rev_i64(at));
        }
        // etcd refuses an empty key; "\0" up to "\0" means every key.
        let start = if start.is_empty() { vec![0] } else { start };
        let response = match inner.range(start, Some(options)).await {
            Ok(response) => response,
            Err(error) if is_compacted(&error) => {
                return Err(inner.expired(at_revision.unwrap_or(0)).await);
            }
            Err(error) if is_future(&error) => {
                return Err(inner.future(at_revision.unwrap_or(0)).await);
            }
            Err(error) => return Err(backend("list", error)),
        };
        let items: Vec<KeyValue> = response
            .kvs()
            .iter()
            .filter_map(|kv| inner.kv(kv))
            .collect();
        Ok(ListResult {
            items,
            revision: at_revision
                .filter(|&at| at > 0)
                .unwrap_or_else(|| revision(response.header())),
            more: response.more(),
        })
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let written = inner.write(key, Write::Create { value: &value }).await?;
        Ok(inner.acknowledged(written.revision).await)
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let write = Write::Update {
            value: &value,
            expected: expected_mod_revision,
        };
        let written = inner.write(key, write).await?;
        Ok(inner.acknowledged(written.revision).await)
    }

    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<(u64, KeyValue), StoreError> {
        let inner = &self.inner;
        let write = Write::Delete {
            expected: expected_mod_revision,
        };
        let written = inner.write(key, write).await?;
        let prev = written.prev.ok_or_else(|| StoreError::NotFound {
            key: key.to_owned(),
        })?;
        let revision = inner.acknowledged(written.revision).await;
        Ok((revision, prev))
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let current = inner.etcd_revision().await?;
        if inner.await_published(current).await {
            Ok(current)
        } else {
            Err(StoreError::backend(
                "etcd: the watch feed",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("events up to revision {current} were not delivered in time"),
                ),
            ))
        }
    }

    async fn health(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        match tokio::time::timeout(inner.timeout, inner.etcd_revision()).await {
            Ok(result) => result.map(|_| ()),
            Err(_) => Err(StoreError::backend(
                "etcd: health",
                std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer from etcd"),
            )),
        }
    }

    async fn watch(&self, prefix: &str, from_revision: u64) -> Result<WatchStream, StoreError> {
        self.inner.window.watch(prefix, from_revision)
    }

    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        let inner = &self.inner;
        let current = inner.etcd_revision().await?;
        if revision > current {
            return Err(StoreError::FutureRevision {
                requested: revision,
                current,
            });
        }
        if revision <= inner.compacted.load(Ordering::Acquire) {
            return Ok(());
        }
        // Upstream's compact.go: only if the compact key is at the version this server last
        // saw, i.e. no other server compacted since; otherwise adopt that server's turn.
        let key = inner.compact_key();
        let seen = inner.compact_version.load(Ordering::Acquire);
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, seen)])
            .and_then([TxnOp::put(key.clone(), revision.to_string(), None)])
            .or_else([TxnOp::get(key, None)]);
        let response = inner
            .send_txn(txn)
            .await
            .map_err(|e| backend("taking the compaction turn", e))?;
        if !response.succeeded() {
            if let Some((version, value)) =
                response.op_responses().into_iter().find_map(|op| match op {
                    TxnOpResponse::Get(get) => get.kvs().first().map(|kv| {
                        let value = std::str::from_utf8(kv.value())
                            .ok()
                            .and_then(|v| v.parse::<u64>().ok())
                            .unwrap_or(0);
                        (kv.version(), value)
                    }),
                    _ => None,
                })
            {
                inner.compact_version.store(version, Ordering::Release);
                inner.compacted.fetch_max(value, Ordering::AcqRel);
            }
            return Ok(());
        }
        inner.compact_version.store(seen + 1, Ordering::Release);
        // Compacting again at the same revision is a no-op: repeatable.
        match inner
            .members
            .send(Policy::Repeatable, |client| async move {
                client.kv_client().compact(rev_i64(revision), None).await
            })
            .await
        {
            Ok(_) => {}
            // Already compacted at or beyond: etcd's error, a no-op here.
            Err(error) if is_compacted(&error) => {}
            Err(error) => return Err(backend("compact", error)),
        }
        inner.compacted.fetch_max(revision, Ordering::AcqRel);
        inner.window.compact(revision);
        Ok(())
    }
}

#[cfg(test)]
mod recent_tests {
    use super::*;

    fn kv(key: &str, revision: u64) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Bytes::from_static(b"v"),
            create_revision: 1,
            mod_revision: revision,
        }
    }

    /// The copy of a key is its latest write seen; an older event never replaces it, a
    /// delete drops it, and past the capacity the least recently written keys go.
    #[test]
    fn recent_writes_keep_the_latest_copy_of_the_most_recently_written_keys() {
        let mut recent = Recent {
            capacity: 4,
            ..Recent::default()
        };
        recent.put(kv("a", 5));
        recent.put(kv("a", 3));
        assert_eq!(recent.keys["a"].mod_revision, 5);
        recent.delete("a");
        assert!(recent.keys.is_empty());
        for (i, key) in ["k1", "k2", "k3", "k4", "k5"].iter().enumerate() {
            recent.put(kv(key, 10 + i as u64));
        }
        let mut kept: Vec<&str> = recent.keys.keys().map(String::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["k3", "k4", "k5"]);
        let mut off = Recent::default();
        off.put(kv("a", 1));
        assert!(off.keys.is_empty(), "capacity 0 keeps nothing");
    }
}
