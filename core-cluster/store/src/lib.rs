//! # core-cluster-store: the versioned key-value store behind the API server
//!
//! The bottom layer: it may not depend on the other core-cluster crates, nor on the API
//! server's HTTP stack (axum); only the API server builds on it. The etcd backend speaks
//! etcd's gRPC API through the `etcd-client` crate, the one HTTP/2 and TLS client here.
//!
//! # Model
//!
//! The store maps string keys (such as `/registry/pods/default/web-0`) to byte values.
//! It keeps **one global revision** counter shared by every key: each successful write
//! (create, update or delete) increments it by exactly one and is stamped with the new
//! value. The revision is what Kubernetes calls `resourceVersion`; it never goes back,
//! also not across restarts of a durable backend. Failed writes (conflicts, missing
//! keys) consume no revision.
//!
//! Every [`KeyValue`] carries its `create_revision` (the revision of the write that
//! created this incarnation of the key) and its `mod_revision` (the revision of the
//! last write to it). These map one to one onto etcd v3's fields of the same names.
//!
//! # Optimistic concurrency
//!
//! [`Store::update`] and [`Store::delete`] take an optional expected `mod_revision`.
//! When given and it differs from the key's current `mod_revision`, the write fails
//! with [`StoreError::Conflict`] and changes nothing (etcd: a `Txn` comparing
//! `mod_revision`).
//!
//! # Lists and pagination
//!
//! [`Store::list`] returns keys under a prefix in byte order, at one revision, reported
//! in [`ListResult::revision`]. The backends keep a multi-version history of every key
//! (like etcd's MVCC), so a list can be served **at a past revision**: to page, pass
//! the last key of the previous page as `start_after` and the first page's revision as
//! `at_revision`; every page then shows the same consistent snapshot even while writes
//! go on. History older than the last [`Store::compact`] is gone: a list at a revision
//! below the compaction revision fails with [`StoreError::Expired`] (Kubernetes turns
//! that into "410 Gone: the continue token has expired"; the client relists).
//! A list at a revision above the current one fails with
//! [`StoreError::FutureRevision`].
//!
//! # Watch
//!
//! [`Store::watch`] delivers every event with `revision > from_revision` for keys under
//! a prefix, in revision order, first replaying recent history and then continuing
//! live. Recent history is a bounded in-memory ring of the last
//! [`WatchConfig::window_capacity`] events, holding at most [`WatchConfig::window_bytes`]
//! of them (see the watch window in the source), so
//! watching from a revision older than the ring yields [`StoreError::Expired`]
//! (Kubernetes: "410 Gone, too old resource version"; the client relists and watches
//! from the list's revision). After a restart the SQLite store refills the ring from its
//! table, which keeps every version since the last compaction (kine's model: the table is
//! the event log), so a watch resumed from a recent revision replays every event since.
//! On etcd ([`EtcdStore`]) the window is fed by an etcd watch, so it holds the writes of
//! every API server sharing that etcd.
//!
//! A watcher that does not keep up — its buffer of [`WatchConfig::watcher_buffer`]
//! events or [`WatchConfig::watcher_buffer_bytes`] fills — is ended: it receives the events that
//! were already buffered, then [`StoreError::WatcherLagged`], then the stream ends. It
//! never silently misses an event; the client re-watches from the last revision it saw.
//!
//! # Compaction
//!
//! [`Store::compact`] with revision `C` drops every version of every key that is no
//! longer visible at `C` (older versions superseded at or before `C`, and deletion
//! markers at or before `C`). Afterwards lists at revisions `< C` fail with
//! [`StoreError::Expired`]. Compaction also raises the floor of the watch window to
//! `C` (events at or below `C` are dropped from the ring), so watching from a revision
//! `< C` fails with `Expired` as it does on etcd, even if the ring still held those
//! events. Nothing compacts automatically: the API server calls `compact` periodically
//! (Kubernetes compacts every five minutes), otherwise history grows without bound.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

#[cfg(feature = "etcd")]
mod etcd;
#[cfg(feature = "etcd")]
mod etcd_members;
mod etcd_options;
mod memory;
mod sqlite;
mod window;

#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
pub use etcd_options::{COMPACT_KEY, ETCD_SUPPORTED, EtcdOptions, EtcdTls, connect_etcd};
pub use memory::MemoryStore;
pub use sqlite::{SqliteOptions, SqliteStore};

/// One key with its value and the revisions of its creation and last modification.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key, e.g. `/registry/pods/default/web-0`.
    pub key: String,
    /// The value bytes as last written.
    pub value: Bytes,
    /// The revision of the write that created this incarnation of the key. A key that
    /// is deleted and created again gets a new `create_revision`.
    pub create_revision: u64,
    /// The revision of the last write to the key (Kubernetes' `resourceVersion`).
    pub mod_revision: u64,
}

impl fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &self.key)
            .field("value_len", &self.value.len())
            .field("create_revision", &self.create_revision)
            .field("mod_revision", &self.mod_revision)
            .finish()
    }
}

/// The result of [`Store::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListResult {
    /// The live keys of the page, in ascending byte order of their keys.
    pub items: Vec<KeyValue>,
    /// The revision the list was served at. Pass it back as `at_revision` (with the last
    /// key as `start_after`) to get the next page of the same snapshot, and use it as
    /// `from_revision` of a watch that continues after the list.
    pub revision: u64,
    /// Whether more keys match after this page.
    pub more: bool,
}

/// What kind of change a [`WatchEvent`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// The key was created or modified. It is a creation when
    /// [`WatchEvent::create_revision`] equals [`WatchEvent::revision`]
    /// (see [`WatchEvent::is_create`]).
    Put,
    /// The key was deleted.
    Delete,
}

/// One committed change, as delivered by [`Store::watch`].
#[derive(Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key that changed.
    pub key: String,
    /// The new value for a put; `None` for a delete.
    pub value: Option<Bytes>,
    /// The previous state of the key: `None` for a creation, the deleted state for a
    /// delete, the state before the change for a modification.
    pub prev_value: Option<KeyValue>,
    /// The `create_revision` of the key: for a put, of the key as it is now; for a
    /// delete, of the incarnation that was deleted.
    pub create_revision: u64,
    /// The revision of this change; it becomes the key's `mod_revision` for a put.
    pub revision: u64,
}

impl WatchEvent {
    /// Whether this event created the key (a put whose `create_revision` is its own
    /// revision), as opposed to modifying an existing one.
    pub fn is_create(&self) -> bool {
        self.kind == EventKind::Put && self.create_revision == self.revision
    }

    /// About how many bytes of memory this event holds: its key, value and previous
    /// value plus a fixed overhead. The watch window and watcher buffers are bounded by
    /// the sum of it.
    pub fn size_bytes(&self) -> usize {
        const OVERHEAD: usize = std::mem::size_of::<WatchEvent>() + 64;
        OVERHEAD
            + self.key.len()
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .prev_value
                .as_ref()
                .map_or(0, |prev| prev.key.len() + prev.value.len())
    }

    /// The key's state after a put, as a [`KeyValue`]; `None` for a delete.
    pub fn kv(&self) -> Option<KeyValue> {
        self.value.as_ref().map(|value| KeyValue {
            key: self.key.clone(),
            value: value.clone(),
            create_revision: self.create_revision,
            mod_revision: self.revision,
        })
    }
}

impl fmt::Debug for WatchEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchEvent")
            .field("kind", &self.kind)
            .field("key", &self.key)
            .field("value_len", &self.value.as_ref().map(Bytes::len))
            .field("prev_value", &self.prev_value)
            .field("create_revision", &self.create_revision)
            .field("revision", &self.revision)
            .finish()
    }
}

/// A stream of watch events; it ends after yielding an error.
pub type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, StoreError>> + Send>>;

/// Sizes of the in-memory watch window shared by the backends.
///
/// Both the window and each watcher's buffer are bounded twice: by a number of events and
/// by their size in bytes (see [`WatchEvent::size_bytes`]), whichever limit is reached
/// first. A count alone lets a few thousand deletions of large objects (each event holds
/// the deleted object) pin hundreds of megabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchConfig {
    /// How many recent events are kept for replay. Watching from a revision older than
    /// the oldest kept event fails with [`StoreError::Expired`]. At least 1.
    pub window_capacity: usize,
    /// How many bytes of recent events are kept for replay: the oldest events are dropped
    /// (raising the oldest revision a watch may start from) while the window holds more.
    pub window_bytes: usize,
    /// How many live events may wait in one watcher's buffer before that watcher is
    /// ended with [`StoreError::WatcherLagged`]. At least 1.
    pub watcher_buffer: usize,
    /// How many bytes of live events may wait in one watcher's buffer before that
    /// watcher is ended with [`StoreError::WatcherLagged`]. One event is always accepted
    /// into an empty buffer, however large.
    pub watcher_buffer_bytes: usize,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            window_capacity: 10_000,
            window_bytes: 128 * 1024 * 1024,
            watcher_buffer: 1_024,
            watcher_buffer_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Every error the store reports.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The key does not exist (update or delete of a missing key).
    #[error("key {key:?} not found")]
    NotFound {
        /// The key.
        key: String,
    },
    /// The key already exists (create of a present key).
    #[error("key {key:?} already exists")]
    AlreadyExists {
        /// The key.
        key: String,
    },
    /// The key's `mod_revision` is not the expected one; nothing was written.
    #[error("conflict on key {key:?}: expected mod_revision {expected}, found {actual}")]
    Conflict {
        /// The key.
        key: String,
        /// The `mod_revision` the caller expected.
        expected: u64,
        /// The key's current `mod_revision`.
        actual: u64,
    },
    /// The requested revision's history is no longer available: compacted (lists and
    /// watches) or out of the watch window (watches). Kubernetes: 410 Gone.
    #[error(
        "revision {requested} is no longer available; the oldest available is {oldest_available}"
    )]
    Expired {
        /// The revision asked for.
        requested: u64,
        /// The oldest revision that may be asked for now.
        oldest_available: u64,
    },
    /// The requested revision is newer than the store's current revision.
    #[error("revision {requested} is in the future; the current revision is {current}")]
    FutureRevision {
        /// The revision asked for.
        requested: u64,
        /// The store's current revision.
        current: u64,
    },
    /// The watcher fell too far behind and was ended; re-watch from the last revision
    /// received.
    #[error("watcher fell behind by more than {buffer} events and was ended; re-watch")]
    WatcherLagged {
        /// The watcher's buffer size that was exceeded.
        buffer: usize,
    },
    /// A file-system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The storage backend failed.
    #[error("{context}: {source}")]
    Backend {
        /// What was being done.
        context: String,
        /// The underlying error (shared, as one failed commit fails a whole batch).
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// The store is closed (or its writer stopped after a fatal error).
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    /// A [`StoreError::Backend`] from any error.
    pub fn backend(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}

/// A versioned key-value store with Kubernetes semantics. See the [module docs](self).
///
/// Object safe: use it as `Arc<dyn Store>`.
#[async_trait]
pub trait Store: Send + Sync {
    /// The current state of `key`, or `None` if it does not exist.
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError>;

    /// A copy of `key` the store holds in memory from its own view of recent writes, which
    /// may be behind the latest write (another server's, not yet seen), or `None`. A write
    /// compared on the copy's mod revision fails if the copy is stale, and the caller reads
    /// the key again: kube-apiserver's `GuaranteedUpdate` starts from its watch cache's
    /// object the same way (`storage/etcd3/store.go`, `origStateIsCurrent`). Only stores
    /// whose reads cost a round trip keep one (etcd); the default has none.
    fn recent(&self, key: &str) -> Option<KeyValue> {
        let _ = key;
        None
    }

    /// Live keys starting with `prefix` (a plain byte prefix: `/registry/pods/` does not
    /// match `/registry/podsx/a`), in ascending key order, only keys strictly after
    /// `start_after` if given, at most `limit` of them if given (`Some(0)` means no
    /// limit, as in Kubernetes), at revision `at_revision` if given (else the current
    /// revision). Fails with [`StoreError::Expired`] when `at_revision` is compacted
    /// and [`StoreError::FutureRevision`] when it is newer than the current revision.
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at_revision: Option<u64>,
    ) -> Result<ListResult, StoreError>;

    /// Creates `key`; fails with [`StoreError::AlreadyExists`] if it exists. Returns
    /// the new revision, which becomes the key's `create_revision` and `mod_revision`.
    async fn create(&self, key: &str, value: Bytes) -> Result<u64, StoreError>;

    /// Replaces the value of an existing `key`; fails with [`StoreError::NotFound`] if
    /// it does not exist and with [`StoreError::Conflict`] if `expected_mod_revision`
    /// is given and differs from the key's `mod_revision`. Returns the new revision.
    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<u64, StoreError>;

    /// Deletes an existing `key`, with the same checks as [`Store::update`]. Returns
    /// the revision of the deletion and the key's state just before it.
    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<(u64, KeyValue), StoreError>;

    /// The revision of the last acknowledged write (0 for a new, empty store).
    ///
    /// Every event up to the returned revision has already been handed to the matching
    /// watch streams: a watcher that reads this revision and then takes every event its
    /// stream has ready has seen all events up to it, so the revision is a safe bookmark
    /// for that watcher even when none of its keys changed (etcd: a progress
    /// notification).
    async fn current_revision(&self) -> Result<u64, StoreError>;

    /// Whether the store can serve: `Ok` when it accepts writes and a read succeeds,
    /// otherwise why not ([`StoreError::Closed`] after [`close`](SqliteStore::close); a
    /// [`StoreError::Backend`] naming the failure for a durable store whose writer stopped
    /// after a failed commit, until the store is reopened). The API server reports it in
    /// `/livez`, `/readyz` and `/healthz` as kube-apiserver reports etcd's health.
    async fn health(&self) -> Result<(), StoreError>;

    /// Every change to keys starting with `prefix` with revision `> from_revision`,
    /// replayed from the watch window, then live. Fails with [`StoreError::Expired`]
    /// when `from_revision` is older than the window or compacted. The stream ends
    /// after an error ([`StoreError::WatcherLagged`] for a slow consumer,
    /// [`StoreError::Closed`] when the store goes away).
    async fn watch(&self, prefix: &str, from_revision: u64) -> Result<WatchStream, StoreError>;

    /// Discards history not visible at `revision` (see the [module docs](self)).
    /// Compacting at or below an earlier compaction does nothing; compacting above the
    /// current revision fails with [`StoreError::FutureRevision`].
    async fn compact(&self, revision: u64) -> Result<(), StoreError>;
}

/// The exclusive upper bound of the keys starting with `prefix`, as bytes (etcd's
/// "prefix end"), or `None` when every key from `prefix` on matches.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(
            prefix_end(b"/registry/pods/"),
            Some(b"/registry/pods0".to_vec())
        );
        assert_eq!(prefix_end(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b""), None);
        assert_eq!(prefix_end(b"\xff"), None);
    }

    #[test]
    fn event_classifies_create_and_modify() {
        let mut event = WatchEvent {
            kind: EventKind::Put,
            key: "/a".into(),
            value: Some(Bytes::from_static(b"v")),
            prev_value: None,
            create_revision: 7,
            revision: 7,
        };
        assert!(event.is_create());
        event.revision = 8;
        assert!(!event.is_create());
        assert_eq!(event.kv().map(|kv| kv.mod_revision), Some(8));
        event.kind = EventKind::Delete;
        event.value = None;
        assert!(!event.is_create());
        assert_eq!(event.kv(), None);
    }
}
