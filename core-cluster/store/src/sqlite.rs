//! [`SqliteStore`]: the durable store on SQLite (WAL, `synchronous=FULL`) with group
//! commit.
//!
//! # Layout
//!
//! One file, `store.sqlite` (plus its `-wal` and `-shm`), in the data directory, and a
//! `LOCK` file held with an exclusive advisory lock so that two stores (two processes)
//! never write the same directory, which would break the single revision sequence.
//!
//! * `kv(key BLOB, mod_revision, create_revision, value BLOB)` holds every version of
//!   every key since the last compaction; a `NULL` value marks a deletion. The primary
//!   key `(key, mod_revision)` serves point reads of the newest version and lists at a
//!   past revision.
//! * `meta(name, value)` holds the current `revision` and the `compacted` revision.
//!   Both are written in the same transaction as the data, so on open the store
//!   recovers exactly the revision of the last committed write.
//!
//! # Writes: one thread, group commit
//!
//! All writes go through a channel to one dedicated OS thread that owns the only
//! writing connection. It takes every request waiting in the channel (up to
//! [`SqliteOptions::max_batch`]), applies them one by one in a single transaction —
//! each request gets its own outcome, so one conflict does not fail its neighbours —
//! commits (with `synchronous=FULL`, the commit fsyncs the WAL), publishes the events
//! to the watch window and only then answers each request. One fsync thus serves
//! every writer that was waiting, which is what makes 64 concurrent writers fast.
//!
//! # Failures
//!
//! A batch that fails because another connection holds the database's write lock
//! (`SQLITE_BUSY`, `SQLITE_LOCKED`) is rolled back and retried: each attempt waits up to
//! [`SqliteOptions::busy_timeout`] inside SQLite's busy handler (which sleeps with its
//! own bounded backoff, up to 100 ms at a time), at most
//! [`SqliteOptions::busy_attempts`] attempts. When the lock is still held after the last
//! attempt the batch's requests fail and the writer carries on: nothing was written.
//!
//! Any other failure (a full disk or [`SqliteOptions::max_db_bytes`] reached, an I/O
//! error, a corrupted page) fails every request of the batch and stops the writer for
//! good: after a failed write or fsync the state of the file is unknown, and carrying on
//! could acknowledge lost writes. The failure is kept: later writes fail with it (not a
//! bare "closed"), watches end, and [`Store::health`] reports it so that `/livez` and
//! `/readyz` fail and a supervisor restarts the process, which reopens the store.
//!
//! # Reads
//!
//! Reads run on `spawn_blocking` threads on a small pool of separate connections.
//! In WAL mode readers see the last committed snapshot and neither wait for the writer
//! nor block it. A list runs in one read transaction, so its items and its revision
//! come from the same snapshot.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::{mpsc, oneshot};

use super::window::WatchWindow;
use super::{
    EventKind, KeyValue, ListResult, Store, StoreError, WatchConfig, WatchEvent, WatchStream,
    prefix_end,
};

const DB_FILE: &str = "store.sqlite";
const LOCK_FILE: &str = "LOCK";
/// How long a reader waits for a lock (readers rarely wait in WAL mode).
const READER_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Tuning of a [`SqliteStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Sizes of the in-memory watch window.
    pub watch: WatchConfig,
    /// The most write requests committed in one transaction.
    pub max_batch: usize,
    /// How many idle read connections are kept open.
    pub max_idle_readers: usize,
    /// How long one attempt to write a batch waits for a write lock held by another
    /// connection (SQLite's busy timeout for the writer).
    pub busy_timeout: Duration,
    /// How many attempts a batch gets while the write lock is held elsewhere before its
    /// requests fail (the writer then carries on). At least 1.
    pub busy_attempts: u32,
    /// The largest the database file may grow to (SQLite's `max_page_count`), like etcd's
    /// `--quota-backend-bytes`; `None` for no limit but the disk's. A write that would
    /// grow it further fails as on a full disk: the writer stops and the store reports
    /// itself unhealthy.
    pub max_db_bytes: Option<u64>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            watch: WatchConfig::default(),
            max_batch: 1_024,
            max_idle_readers: 8,
            busy_timeout: Duration::from_secs(1),
            busy_attempts: 30,
            max_db_bytes: None,
        }
    }
}

/// The durable [`Store`]: SQLite in WAL mode with `synchronous=FULL`, one writer thread
/// doing group commit, reads on separate connections. A write is acknowledged only
/// after the transaction holding it has been committed and synced. See the module
/// source for the design.
///
/// Cloning is cheap and gives another handle on the same store; the writer stops when
/// the last handle is dropped or [`SqliteStore::close`] is called.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writes: mpsc::Sender<WriteRequest>,
    revision: Arc<AtomicU64>,
    window: Arc<WatchWindow>,
    readers: Mutex<Vec<Connection>>,
    max_idle_readers: usize,
    failure: Arc<WriterFailure>,
}

/// Why the writer stopped, once it has stopped after a failed commit: shared by the
/// writer thread and every handle.
#[derive(Default)]
struct WriterFailure(Mutex<Option<Arc<dyn std::error::Error + Send + Sync>>>);

impl WriterFailure {
    fn set(&self, source: Arc<dyn std::error::Error + Send + Sync>) {
        *self.0.lock() = Some(source);
    }

    /// The error later requests get, if the writer failed.
    fn error(&self) -> Option<StoreError> {
        self.0.lock().clone().map(|source| StoreError::Backend {
            context: "the store stopped writing after a failed commit; restart to reopen it".into(),
            source,
        })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing connections is SQLite work: keep it off the async worker threads.
        let readers = std::mem::take(self.readers.get_mut());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            drop(runtime.spawn_blocking(move || drop(readers)));
        }
    }
}

enum WriteOp {
    Create {
        key: String,
        value: Bytes,
    },
    Update {
        key: String,
        value: Bytes,
        expected: Option<u64>,
    },
    Delete {
        key: String,
        expected: Option<u64>,
    },
    Compact {
        revision: u64,
    },
    Shutdown,
}

enum WriteOutcome {
    Put(u64),
    Deleted(u64, KeyValue),
    Done,
}

struct WriteRequest {
    op: WriteOp,
    reply: oneshot::Sender<Result<WriteOutcome, StoreError>>,
}

impl SqliteStore {
    /// Opens (creating if needed) the store in data directory `dir` and recovers its
    /// revision. Fails with [`StoreError::Io`] if another store holds the directory.
    pub async fn open(dir: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_owned();
        tokio::task::spawn_blocking(move || Self::open_blocking(&dir, options))
            .await
            .map_err(|e| StoreError::backend("open task failed", e))?
    }

    fn open_blocking(dir: &Path, options: SqliteOptions) -> Result<Self, StoreError> {
        let io = |context: String| move |source| StoreError::Io { context, source };
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io(format!("opening {}", lock_path.display())))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::Io {
                    context: format!("locking {}", lock_path.display()),
                    source: std::io::Error::new(
                        std::io::ErrorKind::WouldBlock,
                        "the data directory is in use by another store",
                    ),
                });
            }
            Err(TryLockError::Error(e)) => {
                return Err(io(format!("locking {}", lock_path.display()))(e));
            }
        }

        let path = dir.join(DB_FILE);
        let mut conn = Connection::open(&path).map_err(|e| backend("opening database", e))?;
        configure_writer(&conn, &options).map_err(|e| backend("configuring database", e))?;
        let (revision, compacted) =
            init_schema(&mut conn).map_err(|e| backend("creating schema", e))?;
        // Make the new files' directory entries durable too.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io(format!("syncing {}", dir.display())))?;
        tracing::info!(path = %path.display(), revision, compacted, "opened sqlite store");

        let window = Arc::new(
            recover_window(&conn, options.watch, revision, compacted)
                .map_err(|e| backend("reading the event log", e))?,
        );
        let shared_revision = Arc::new(AtomicU64::new(revision));
        let (tx, rx) = mpsc::channel(options.max_batch.max(1) * 4);
        let failure = Arc::new(WriterFailure::default());
        let writer = Writer {
            conn,
            revision,
            compacted,
            window: window.clone(),
            shared_revision: shared_revision.clone(),
            max_batch: options.max_batch.max(1),
            busy_attempts: options.busy_attempts.max(1),
            failure: failure.clone(),
            _lock: lock,
        };
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(io("spawning the writer thread".into()))?;

        Ok(Self {
            inner: Arc::new(Inner {
                path,
                writes: tx,
                revision: shared_revision,
                window,
                readers: Mutex::new(Vec::new()),
                max_idle_readers: options.max_idle_readers,
                failure,
            }),
        })
    }

    /// Stops the writer after the writes already queued, and waits until it has
    /// closed the database and released the directory, so it can be opened again.
    /// Later writes on any handle fail with [`StoreError::Closed`].
    pub async fn close(&self) -> Result<(), StoreError> {
        let readers = std::mem::take(&mut *self.inner.readers.lock());
        tokio::task::spawn_blocking(move || drop(readers))
            .await
            .map_err(|e| StoreError::backend("closing readers", e))?;
        match self.submit(WriteOp::Shutdown).await {
            Ok(_) => Ok(()),
            // Already stopped (closed, or after a failed commit): nothing left to release.
            Err(_) if self.inner.writes.is_closed() => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn submit(&self, op: WriteOp) -> Result<WriteOutcome, StoreError> {
        let (reply, rx) = oneshot::channel();
        let stopped = || self.inner.failure.error().unwrap_or(StoreError::Closed);
        self.inner
            .writes
            .send(WriteRequest { op, reply })
            .await
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Runs `f` on a pooled read connection on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let pooled = inner.readers.lock().pop();
            let mut conn = match pooled {
                Some(conn) => conn,
                None => open_reader(&inner.path).map_err(|e| backend("opening reader", e))?,
            };
            let result = f(&mut conn);
            let mut pool = inner.readers.lock();
            if pool.len() < inner.max_idle_readers {
                pool.push(conn);
            }
            result
        })
        .await
        .map_err(|e| StoreError::backend("read task failed", e))?
    }
}

fn backend(context: &str, e: rusqlite::Error) -> StoreError {
    StoreError::backend(context, e)
}

/// Keeps each prepared statement's query plan whatever its parameters. SQLite, built with
/// `SQLITE_ENABLE_STAT4` (as the bundled library is), otherwise marks a statement such as
/// [`LATEST_SQL`] (an indexed `key = ?1` with `ORDER BY … LIMIT`) to be compiled again at
/// every new binding, so the cached statement was re-prepared on every read of a key: 8 % of
/// the embedded cluster's CPU while 10,000 Nodes registered. The plans here do not depend on
/// the values (`key = ?`, `key > ?`, `mod_revision <= ?` on the primary key), so nothing is
/// lost by fixing them (SQLite's query planner stability guarantee).
fn configure_planner(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

fn configure_writer(conn: &Connection, options: &SqliteOptions) -> rusqlite::Result<()> {
    configure_planner(conn)?;
    conn.busy_timeout(options.busy_timeout)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidQuery);
    }
    conn.pragma_update(None, "synchronous", "FULL")?;
    if let Some(max_bytes) = options.max_db_bytes {
        let page_size: u64 = conn.query_row("PRAGMA page_size", [], |row| row.get(0))?;
        let pages = (max_bytes / page_size.max(1)).max(1);
        conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))?;
    }
    Ok(())
}

/// Whether `e` means another connection holds a lock we need: worth another attempt.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    configure_planner(&conn)?;
    conn.busy_timeout(READER_BUSY_TIMEOUT)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(conn)
}

/// The watch window of a store reopened at `revision`: its last events read back from the
/// `kv` table, which is the event log (kine's model, `pkg/logstructured/sqllog`: every
/// version since the last compaction is a row, a deletion a row with no value), so a watch
/// resumed after a restart from a recent revision replays every event since, and one from
/// behind the compaction (or beyond the window's capacity) gets [`StoreError::Expired`].
fn recover_window(
    conn: &Connection,
    config: WatchConfig,
    revision: u64,
    compacted: u64,
) -> rusqlite::Result<WatchWindow> {
    let from = compacted.max(revision.saturating_sub(config.window_capacity as u64));
    // Each version with the one before it of the same key (the previous value of the event).
    let mut statement = conn.prepare(
        "SELECT c.key, c.mod_revision, c.create_revision, c.value,
                p.mod_revision, p.create_revision, p.value
           FROM kv c
           LEFT JOIN kv p ON p.key = c.key AND p.mod_revision =
                (SELECT MAX(q.mod_revision) FROM kv q
                  WHERE q.key = c.key AND q.mod_revision < c.mod_revision)
          WHERE c.mod_revision > ?1
          ORDER BY c.mod_revision",
    )?;
    let events = statement
        .query_map([from], |row| {
            let key = String::from_utf8_lossy(&row.get::<_, Vec<u8>>(0)?).into_owned();
            let value: Option<Vec<u8>> = row.get(3)?;
            let prev_value: Option<Vec<u8>> = row.get(6)?;
            let prev = match (prev_value, row.get::<_, Option<u64>>(4)?) {
                (Some(value), Some(mod_revision)) => Some(KeyValue {
                    key: key.clone(),
                    value: Bytes::from(value),
                    create_revision: row.get(5)?,
                    mod_revision,
                }),
                _ => None,
            };
            Ok(WatchEvent {
                kind: if value.is_some() {
                    EventKind::Put
                } else {
                    EventKind::Delete
                },
                key,
                value: value.map(Bytes::from),
                prev_value: prev,
                create_revision: row.get(2)?,
                revision: row.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let window = WatchWindow::new(config, from);
    window.publish(events);
    Ok(window)
}

fn init_schema(conn: &mut Connection) -> rusqlite::Result<(u64, u64)> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS kv (
             key BLOB NOT NULL,
             mod_revision INTEGER NOT NULL,
             create_revision INTEGER NOT NULL,
             value BLOB,
             PRIMARY KEY (key, mod_revision)
         );
         CREATE TABLE IF NOT EXISTS meta (
             name TEXT PRIMARY KEY,
             value INTEGER NOT NULL
         );
         INSERT OR IGNORE INTO meta (name, value)
             VALUES ('schema', 1), ('revision', 0), ('compacted', 0);",
    )?;
    let revision = read_meta(&tx, "revision")?;
    let compacted = read_meta(&tx, "compacted")?;
    tx.commit()?;
    Ok((revision, compacted))
}

fn read_meta(conn: &Connection, name: &str) -> rusqlite::Result<u64> {
    conn.prepare_cached("SELECT value FROM meta WHERE name = ?1")?
        .query_row([name], |row| row.get(0))
}

/// The newest version of one key: the read before every write and every point read.
const LATEST_SQL: &str = "SELECT mod_revision, create_revision, value FROM kv
                          WHERE key = ?1 ORDER BY mod_revision DESC LIMIT 1";

/// The newest version of `key` if it is live (not deleted).
fn latest(conn: &Connection, key: &str) -> rusqlite::Result<Option<KeyValue>> {
    let row = conn
        .prepare_cached(LATEST_SQL)?
        .query_row([key.as_bytes()], |row| {
            Ok((
                row.get::<_, u64>(0)?,
                row.get::<_, u64>(1)?,
                row.get::<_, Option<Vec<u8>>>(2)?,
            ))
        })
        .optional()?;
    Ok(row.and_then(|(mod_revision, create_revision, value)| {
        Some(KeyValue {
            key: key.to_owned(),
            value: Bytes::from(value?),
            create_revision,
            mod_revision,
        })
    }))
}

fn list_snapshot(
    conn: &mut Connection,
    prefix: &str,
    start_after: Option<&str>,
    limit: Option<usize>,
    at_revision: Option<u64>,
) -> Result<ListResult, StoreError> {
    let tx = conn
        .transaction()
        .map_err(|e| backend("starting read transaction", e))?;
    let current = read_meta(&tx, "revision").map_err(|e| backend("reading revision", e))?;
    let compacted = read_meta(&tx, "compacted").map_err(|e| backend("reading revision", e))?;
    let revision = at_revision.unwrap_or(current);
    if revision > current {
        return Err(StoreError::FutureRevision {
            requested: revision,
            current,
        });
    }
    if revision < compacted {
        return Err(StoreError::Expired {
            requested: revision,
            oldest_available: compacted,
        });
    }

    let (lower, lower_op) = match start_after {
        Some(after) if after >= prefix => (after, ">"),
        _ => (prefix, ">="),
    };
    let upper = prefix_end(prefix.as_bytes());
    // With exactly one max() aggregate, SQLite takes the bare columns from the row with
    // the maximum: the version of each key visible at `revision`.
    let sql = format!(
        "SELECT key, max(mod_revision), create_revision, value FROM kv
         WHERE key {lower_op} ?1 {} AND mod_revision <= ?2
         GROUP BY key ORDER BY key",
        if upper.is_some() { "AND key < ?3" } else { "" }
    );
    let limit = limit.filter(|&l| l > 0).unwrap_or(usize::MAX);
    let mut items = Vec::new();
    let mut more = false;
    {
        let mut stmt = tx
            .prepare_cached(&sql)
            .map_err(|e| backend("preparing list", e))?;
        let mut rows = match &upper {
            Some(upper) => stmt.query(params![lower.as_bytes(), revision, upper]),
            None => stmt.query(params![lower.as_bytes(), revision]),
        }
        .map_err(|e| backend("listing", e))?;
        while let Some(row) = rows.next().map_err(|e| backend("listing", e))? {
            let value: Option<Vec<u8>> = row.get(3).map_err(|e| backend("listing", e))?;
            let Some(value) = value else { continue };
            if items.len() == limit {
                more = true;
                break;
            }
            let key: Vec<u8> = row.get(0).map_err(|e| backend("listing", e))?;
            items.push(KeyValue {
                key: String::from_utf8(key).map_err(|e| StoreError::backend("listing", e))?,
                value: Bytes::from(value),
                create_revision: row.get(2).map_err(|e| backend("listing", e))?,
                mod_revision: row.get(1).map_err(|e| backend("listing", e))?,
            });
        }
    }
    tx.finish()
        .map_err(|e| backend("ending read transaction", e))?;
    Ok(ListResult {
        items,
        revision,
        more,
    })
}

/// The writer thread's state: the only writing connection.
struct Writer {
    conn: Connection,
    revision: u64,
    compacted: u64,
    window: Arc<WatchWindow>,
    shared_revision: Arc<AtomicU64>,
    max_batch: usize,
    busy_attempts: u32,
    /// Where the writer records why it stopped, for [`Store::health`] and later writes.
    failure: Arc<WriterFailure>,
    /// Held (locked) for as long as the writer runs.
    _lock: File,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<WriteRequest>) {
        let mut batch = Vec::with_capacity(self.max_batch);
        let mut shutdown = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            // Shutdown requests are answered once the database and lock are released.
            let (stops, writes): (Vec<_>, Vec<_>) = batch
                .drain(..)
                .partition(|r| matches!(r.op, WriteOp::Shutdown));
            batch = writes;
            shutdown.extend(stops.into_iter().map(|r| r.reply));
            let healthy = batch.is_empty() || self.commit_batch(&mut batch);
            if !shutdown.is_empty() || !healthy {
                break;
            }
        }
        tracing::info!(revision = self.revision, "sqlite writer stopped");
        let window = self.window.clone();
        let failure = self.failure.clone();
        // Release the database and the directory first: whoever sees a refusal below (or
        // a failed `close`) may reopen the store at once.
        drop(self);
        // Refuse whatever is still queued instead of leaving callers to guess.
        rx.close();
        while let Ok(request) = rx.try_recv() {
            let error = failure.error().unwrap_or(StoreError::Closed);
            let _ = request.reply.send(Err(error));
        }
        // No more events will come: end the watchers rather than leave them hanging.
        window.close();
        for reply in shutdown {
            let _ = reply.send(Ok(WriteOutcome::Done));
        }
    }

    /// Applies and commits one batch, then answers every request. Retries while another
    /// connection holds the write lock (up to `busy_attempts`). Returns false when the
    /// writer must stop (the transaction failed for any other reason), after recording
    /// why in `failure`.
    fn commit_batch(&mut self, batch: &mut Vec<WriteRequest>) -> bool {
        let mut attempt = 1;
        let error = loop {
            match self.try_commit(batch) {
                Ok(committed) => {
                    self.finish(batch, committed);
                    return true;
                }
                // A busy failure leaves nothing written once its transaction is rolled
                // back (dropping it did that; autocommit says it worked).
                Err(e) if is_busy(&e) && self.conn.is_autocommit() => {
                    if attempt >= self.busy_attempts {
                        tracing::warn!(error = %e, attempts = attempt, requests = batch.len(),
                            "the database stayed locked by another connection; failing the batch");
                        let source: Arc<dyn std::error::Error + Send + Sync> = Arc::new(e);
                        let context = format!(
                            "committing write batch: the database stayed locked by another connection for {attempt} attempts"
                        );
                        fail_all(batch, &context, &source);
                        return true;
                    }
                    tracing::warn!(error = %e, attempt, requests = batch.len(),
                        "the database is locked by another connection; retrying the batch");
                    attempt += 1;
                }
                Err(e) => break e,
            }
        };
        tracing::error!(error = %error, requests = batch.len(),
            "write batch failed; stopping the writer, the store reports itself unhealthy");
        let source: Arc<dyn std::error::Error + Send + Sync> = Arc::new(error);
        self.failure.set(source.clone());
        fail_all(batch, "committing write batch", &source);
        false
    }

    /// One attempt at the batch in one transaction: the new revision and compaction
    /// revision, the events and each request's outcome, or the failure that aborted it
    /// (the transaction is then rolled back).
    fn try_commit(&mut self, batch: &[WriteRequest]) -> rusqlite::Result<Committed> {
        let mut committed = Committed {
            revision: self.revision,
            compacted: self.compacted,
            events: Vec::new(),
            outcomes: Vec::with_capacity(batch.len()),
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        for request in batch {
            committed.outcomes.push(apply(
                &tx,
                &request.op,
                &mut committed.revision,
                &mut committed.compacted,
                &mut committed.events,
            )?);
        }
        if committed.revision != self.revision {
            tx.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'revision'")?
                .execute([committed.revision])?;
        }
        if committed.compacted != self.compacted {
            tx.prepare_cached("UPDATE meta SET value = ?1 WHERE name = 'compacted'")?
                .execute([committed.compacted])?;
        }
        tx.commit()?;
        Ok(committed)
    }

    /// Publishes a committed batch, then answers its requests.
    fn finish(&mut self, batch: &mut Vec<WriteRequest>, committed: Committed) {
        let Committed {
            revision,
            compacted,
            events,
            outcomes,
        } = committed;
        tracing::trace!(requests = batch.len(), revision, "committed write batch");
        self.revision = revision;
        // Events first, then the revision: once `current_revision` returns a revision,
        // its events are already in the watchers' buffers (a safe bookmark).
        self.window.publish(events);
        self.shared_revision.store(revision, Ordering::Release);
        if compacted != self.compacted {
            self.compacted = compacted;
            self.window.compact(compacted);
        }
        for (request, outcome) in batch.drain(..).zip(outcomes) {
            let _ = request.reply.send(outcome);
        }
    }
}

/// What one committed batch produced.
struct Committed {
    revision: u64,
    compacted: u64,
    events: Vec<WatchEvent>,
    outcomes: Vec<Result<WriteOutcome, StoreError>>,
}

/// Answers every request of a failed batch with the same backend error.
fn fail_all(
    batch: &mut Vec<WriteRequest>,
    context: &str,
    source: &Arc<dyn std::error::Error + Send + Sync>,
) {
    for request in batch.drain(..) {
        let _ = request.reply.send(Err(StoreError::Backend {
            context: context.to_owned(),
            source: source.clone(),
        }));
    }
}

/// Applies one request inside the batch's transaction. The outer error is a backend
/// failure that aborts the whole batch; the inner one is this request's own outcome.
fn apply(
    tx: &Connection,
    op: &WriteOp,
    revision: &mut u64,
    compacted: &mut u64,
    events: &mut Vec<WatchEvent>,
) -> rusqlite::Result<Result<WriteOutcome, StoreError>> {
    let (key, value, must_exist, expected) = match op {
        WriteOp::Create { key, value } => (key, Some(value), false, None),
        WriteOp::Update {
            key,
            value,
            expected,
        } => (key, Some(value), true, *expected),
        WriteOp::Delete { key, expected } => (key, None, true, *expected),
        WriteOp::Compact { revision: target } => {
            return compact(tx, *target, *revision, compacted);
        }
        WriteOp::Shutdown => return Ok(Ok(WriteOutcome::Done)),
    };
    let prev = latest(tx, key)?;
    match (&prev, must_exist) {
        (None, true) => return Ok(Err(StoreError::NotFound { key: key.clone() })),
        (Some(_), false) => return Ok(Err(StoreError::AlreadyExists { key: key.clone() })),
        _ => {}
    }
    if let (Some(prev), Some(expected)) = (&prev, expected)
        && prev.mod_revision != expected
    {
        return Ok(Err(StoreError::Conflict {
            key: key.clone(),
            expected,
            actual: prev.mod_revision,
        }));
    }
    let new_revision = *revision + 1;
    let create_revision = prev.as_ref().map_or(new_revision, |p| p.create_revision);
    tx.prepare_cached(
        "INSERT INTO kv (key, mod_revision, create_revision, value) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        key.as_bytes(),
        new_revision,
        create_revision,
        value.map(|v| v.as_ref())
    ])?;
    *revision = new_revision;
    events.push(WatchEvent {
        kind: if value.is_some() {
            EventKind::Put
        } else {
            EventKind::Delete
        },
        key: key.clone(),
        value: value.cloned(),
        prev_value: prev.clone(),
        create_revision,
        revision: new_revision,
    });
    Ok(Ok(match (value, prev) {
        (None, Some(prev)) => WriteOutcome::Deleted(new_revision, prev),
        _ => WriteOutcome::Put(new_revision),
    }))
}

fn compact(
    tx: &Connection,
    target: u64,
    current: u64,
    compacted: &mut u64,
) -> rusqlite::Result<Result<WriteOutcome, StoreError>> {
    if target > current {
        return Ok(Err(StoreError::FutureRevision {
            requested: target,
            current,
        }));
    }
    if target > *compacted {
        // Drop deletion markers at or below the target, and every version that a newer
        // version at or below the target supersedes.
        let removed = tx
            .prepare_cached(
                "DELETE FROM kv WHERE mod_revision <= ?1 AND (
                     value IS NULL OR EXISTS (
                         SELECT 1 FROM kv AS newer WHERE newer.key = kv.key
                         AND newer.mod_revision > kv.mod_revision
                         AND newer.mod_revision <= ?1))",
            )?
            .execute([target])?;
        tracing::debug!(revision = target, removed, "compacted sqlite store");
        *compacted = target;
    }
    Ok(Ok(WriteOutcome::Done))
}

fn unexpected() -> StoreError {
    StoreError::backend(
        "writer",
        std::io::Error::other("unexpected outcome from the writer"),
    )
}

#[async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        let key = key.to_owned();
        self.read(move |conn| latest(conn, &key).map_err(|e| backend("reading key", e)))
            .await
    }

    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at_revision: Option<u64>,
    ) -> Result<ListResult, StoreError> {
        let prefix = prefix.to_owned();
        let start_after = start_after.map(str::to_owned);
        self.read(move |conn| {
            list_snapshot(conn, &prefix, start_after.as_deref(), limit, at_revision)
        })
        .await
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, StoreError> {
        let op = WriteOp::Create {
            key: key.to_owned(),
            value,
        };
        match self.submit(op).await? {
            WriteOutcome::Put(revision) => Ok(revision),
            _ => Err(unexpected()),
        }
    }

    async fn update(
        &self,
        key: &str,
        value: Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        let op = WriteOp::Update {
            key: key.to_owned(),
            value,
            expected: expected_mod_revision,
        };
        match self.submit(op).await? {
            WriteOutcome::Put(revision) => Ok(revision),
            _ => Err(unexpected()),
        }
    }

    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<(u64, KeyValue), StoreError> {
        let op = WriteOp::Delete {
            key: key.to_owned(),
            expected: expected_mod_revision,
        };
        match self.submit(op).await? {
            WriteOutcome::Deleted(revision, prev) => Ok((revision, prev)),
            _ => Err(unexpected()),
        }
    }

    async fn current_revision(&self) -> Result<u64, StoreError> {
        Ok(self.inner.revision.load(Ordering::Acquire))
    }

    async fn health(&self) -> Result<(), StoreError> {
        if let Some(failure) = self.inner.failure.error() {
            return Err(failure);
        }
        if self.inner.writes.is_closed() {
            return Err(StoreError::Closed);
        }
        // A read through the same path as gets and lists (etcd's health check reads too).
        self.read(|conn| {
            read_meta(conn, "revision").map_err(|e| backend("reading the revision", e))
        })
        .await
        .map(drop)
    }

    async fn watch(&self, prefix: &str, from_revision: u64) -> Result<WatchStream, StoreError> {
        self.inner.window.watch(prefix, from_revision)
    }

    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        self.submit(WriteOp::Compact { revision }).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn writer_connection_is_wal_with_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        configure_writer(&conn, &SqliteOptions::default()).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2, "synchronous=FULL");
    }

    #[test]
    fn reading_a_key_reuses_its_prepared_statement() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        configure_writer(&conn, &SqliteOptions::default()).unwrap();
        init_schema(&mut conn).unwrap();
        for i in 0..20 {
            conn.execute(
                "INSERT INTO kv (key, mod_revision, create_revision, value) VALUES (?1, ?2, ?2, x'00')",
                rusqlite::params![format!("/registry/nodes/n{}", i % 5).into_bytes(), i + 1],
            )
            .unwrap();
        }
        for i in 0..10 {
            let kv = latest(&conn, &format!("/registry/nodes/n{}", i % 5)).unwrap();
            assert_eq!(kv.unwrap().mod_revision, 16 + i % 5);
        }
        let statement = conn.prepare_cached(LATEST_SQL).unwrap();
        assert_eq!(statement.get_status(rusqlite::StatementStatus::Run), 10);
        assert_eq!(
            statement.get_status(rusqlite::StatementStatus::RePrepare),
            0,
            "a new key must not compile the statement again"
        );
    }

    #[tokio::test]
    async fn revision_survives_reopen_and_directory_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap();
        store.create("/a", value("1")).await.unwrap();
        store.update("/a", value("2"), Some(1)).await.unwrap();
        store.delete("/a", None).await.unwrap();
        store.compact(3).await.unwrap();
        assert!(matches!(
            SqliteStore::open(dir.path(), SqliteOptions::default()).await,
            Err(StoreError::Io { .. })
        ));
        let mut watcher = store.watch("/", 3).await.unwrap();
        store.close().await.unwrap();
        assert!(matches!(
            store.create("/b", value("1")).await,
            Err(StoreError::Closed)
        ));
        assert!(matches!(
            futures::StreamExt::next(&mut watcher).await,
            Some(Err(StoreError::Closed))
        ));
        assert!(matches!(store.watch("/", 3).await, Err(StoreError::Closed)));

        let store = SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap();
        assert_eq!(store.current_revision().await.unwrap(), 3);
        assert_eq!(store.create("/b", value("1")).await.unwrap(), 4);
        // The compaction was persisted too.
        assert!(matches!(
            store.list("/", None, None, Some(2)).await,
            Err(StoreError::Expired {
                requested: 2,
                oldest_available: 3
            })
        ));
        // After a restart the watch window starts at the recovered revision.
        assert!(matches!(
            store.watch("/", 2).await,
            Err(StoreError::Expired {
                requested: 2,
                oldest_available: 3
            })
        ));
        assert!(store.watch("/", 3).await.is_ok());
        store.close().await.unwrap();
    }

    /// kine's model (`pkg/logstructured/sqllog`): the table is the event log, so a watch
    /// resumed after a restart from a recent revision replays every event since (puts,
    /// modifications and deletions, with their previous values), and one from behind the
    /// compaction gets 410 (`Expired`).
    #[tokio::test]
    async fn a_watch_resumed_after_a_restart_replays_every_event_since() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap();
        store.create("/a", value("1")).await.unwrap(); // 1
        store.create("/b", value("1")).await.unwrap(); // 2
        store.compact(2).await.unwrap();
        store.update("/a", value("2"), Some(1)).await.unwrap(); // 3
        store.delete("/b", None).await.unwrap(); // 4
        store.create("/b", value("3")).await.unwrap(); // 5
        store.create("/c", value("1")).await.unwrap(); // 6
        store.close().await.unwrap();

        let store = SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap();
        let mut watch = store.watch("/", 2).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let event = futures::StreamExt::next(&mut watch).await.unwrap().unwrap();
            seen.push(event);
        }
        let summary: Vec<(EventKind, &str, u64, u64, Option<u64>)> = seen
            .iter()
            .map(|e| {
                (
                    e.kind,
                    e.key.as_str(),
                    e.revision,
                    e.create_revision,
                    e.prev_value.as_ref().map(|p| p.mod_revision),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (EventKind::Put, "/a", 3, 1, Some(1)),
                (EventKind::Delete, "/b", 4, 2, Some(2)),
                (EventKind::Put, "/b", 5, 5, None),
                (EventKind::Put, "/c", 6, 6, None),
            ]
        );
        assert_eq!(seen[0].value.as_deref(), Some(&b"2"[..]));
        assert_eq!(seen[0].prev_value.as_ref().unwrap().value, value("1"));
        assert!(seen[2].is_create());
        // Live events follow the replay.
        store.update("/c", value("2"), Some(6)).await.unwrap();
        let live = futures::StreamExt::next(&mut watch).await.unwrap().unwrap();
        assert_eq!((live.key.as_str(), live.revision), ("/c", 7));
        // Behind the compaction: 410.
        assert!(matches!(
            store.watch("/", 1).await,
            Err(StoreError::Expired {
                requested: 1,
                oldest_available: 2
            })
        ));
        store.close().await.unwrap();
    }

    /// A writer on a fresh database in `dir`, outside any runtime.
    fn test_writer(dir: &Path) -> Writer {
        let mut conn = Connection::open(dir.join(DB_FILE)).unwrap();
        configure_writer(&conn, &SqliteOptions::default()).unwrap();
        let (revision, compacted) = init_schema(&mut conn).unwrap();
        Writer {
            conn,
            revision,
            compacted,
            window: Arc::new(WatchWindow::new(WatchConfig::default(), revision)),
            shared_revision: Arc::new(AtomicU64::new(revision)),
            max_batch: 64,
            busy_attempts: 3,
            failure: Arc::new(WriterFailure::default()),
            _lock: File::create(dir.join(LOCK_FILE)).unwrap(),
        }
    }

    fn request(
        op: WriteOp,
    ) -> (
        WriteRequest,
        oneshot::Receiver<Result<WriteOutcome, StoreError>>,
    ) {
        let (reply, rx) = oneshot::channel();
        (WriteRequest { op, reply }, rx)
    }

    fn put(key: &str) -> WriteOp {
        WriteOp::Create {
            key: key.into(),
            value: value("v"),
        }
    }

    #[test]
    fn each_request_in_a_batch_gets_its_own_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = test_writer(dir.path());
        let (a, rx_a) = request(put("/a"));
        let (dup, rx_dup) = request(put("/a"));
        let (stale, rx_stale) = request(WriteOp::Update {
            key: "/a".into(),
            value: value("x"),
            expected: Some(99),
        });
        let (fresh, rx_fresh) = request(WriteOp::Update {
            key: "/a".into(),
            value: value("y"),
            expected: Some(1),
        });
        let (missing, rx_missing) = request(WriteOp::Delete {
            key: "/nope".into(),
            expected: None,
        });
        let (b, rx_b) = request(put("/b"));
        let mut batch = vec![a, dup, stale, fresh, missing, b];
        assert!(writer.commit_batch(&mut batch));
        assert!(matches!(
            rx_a.blocking_recv().unwrap(),
            Ok(WriteOutcome::Put(1))
        ));
        assert!(matches!(
            rx_dup.blocking_recv().unwrap(),
            Err(StoreError::AlreadyExists { .. })
        ));
        assert!(matches!(
            rx_stale.blocking_recv().unwrap(),
            Err(StoreError::Conflict {
                expected: 99,
                actual: 1,
                ..
            })
        ));
        // Sees the earlier, still uncommitted write of the same batch.
        assert!(matches!(
            rx_fresh.blocking_recv().unwrap(),
            Ok(WriteOutcome::Put(2))
        ));
        assert!(matches!(
            rx_missing.blocking_recv().unwrap(),
            Err(StoreError::NotFound { .. })
        ));
        assert!(matches!(
            rx_b.blocking_recv().unwrap(),
            Ok(WriteOutcome::Put(3))
        ));
        assert_eq!(writer.shared_revision.load(Ordering::Acquire), 3);
        assert_eq!(read_meta(&writer.conn, "revision").unwrap(), 3);
    }

    #[test]
    fn a_failed_batch_fails_every_request_and_stops_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = test_writer(dir.path());
        let (a, rx_a) = request(put("/a"));
        let mut batch = vec![a];
        assert!(writer.commit_batch(&mut batch));
        assert!(rx_a.blocking_recv().unwrap().is_ok());

        // Break the database under the writer: the next inserts fail.
        writer.conn.execute_batch("DROP TABLE kv").unwrap();
        let (b, rx_b) = request(put("/b"));
        let (c, rx_c) = request(put("/c"));
        let mut batch = vec![b, c];
        assert!(!writer.commit_batch(&mut batch), "the writer must stop");
        assert!(matches!(
            rx_b.blocking_recv().unwrap(),
            Err(StoreError::Backend { .. })
        ));
        assert!(matches!(
            rx_c.blocking_recv().unwrap(),
            Err(StoreError::Backend { .. })
        ));
        // Nothing of the failed batch counts, and the failure is kept for health checks.
        assert_eq!(writer.revision, 1);
        assert_eq!(writer.shared_revision.load(Ordering::Acquire), 1);
        let kept = writer
            .failure
            .error()
            .expect("the failure is recorded")
            .to_string();
        assert!(kept.contains("no such table: kv"), "{kept}");
    }

    #[test]
    fn a_locked_database_fails_the_batch_after_bounded_attempts_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = test_writer(dir.path());
        writer.conn.busy_timeout(Duration::from_millis(10)).unwrap();
        // Another connection holds the write lock throughout.
        let other = Connection::open(dir.path().join(DB_FILE)).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let (a, rx_a) = request(put("/a"));
        assert!(
            writer.commit_batch(&mut vec![a]),
            "a busy database must not stop the writer"
        );
        match rx_a.blocking_recv().unwrap() {
            Err(StoreError::Backend { context, .. }) => {
                assert!(
                    context.contains("locked by another connection for 3 attempts"),
                    "{context}"
                );
            }
            Err(e) => panic!("expected a backend error, got {e}"),
            Ok(_) => panic!("expected a backend error, got a write"),
        }
        assert!(writer.failure.error().is_none(), "not a fatal failure");
        assert_eq!(writer.revision, 0);
        // Once the lock is released the same writer commits, and no revision was lost.
        other.execute_batch("COMMIT").unwrap();
        let (b, rx_b) = request(put("/a"));
        assert!(writer.commit_batch(&mut vec![b]));
        assert!(matches!(
            rx_b.blocking_recv().unwrap(),
            Ok(WriteOutcome::Put(1))
        ));
    }

    #[tokio::test]
    async fn compaction_keeps_only_visible_versions() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap();
        store.create("/a", value("1")).await.unwrap(); // 1
        store.update("/a", value("2"), None).await.unwrap(); // 2
        store.create("/b", value("1")).await.unwrap(); // 3
        store.delete("/b", None).await.unwrap(); // 4
        store.update("/a", value("3"), None).await.unwrap(); // 5
        store.compact(4).await.unwrap();
        let rows: Vec<(Vec<u8>, u64)> = store
            .read(|conn| {
                let mut stmt = conn
                    .prepare("SELECT key, mod_revision FROM kv ORDER BY key, mod_revision")
                    .unwrap();
                let rows = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                Ok(rows)
            })
            .await
            .unwrap();
        assert_eq!(rows, vec![(b"/a".to_vec(), 2), (b"/a".to_vec(), 5)]);
        store.close().await.unwrap();
    }
}
