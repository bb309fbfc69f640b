//! WATCH: newline-delimited JSON events (or protobuf frames), replayed from a
//! resourceVersion and then live, with bookmarks, `sendInitialEvents`, selector transitions,
//! and a 410 `ERROR` event inside the 200 stream when the version is too old, as
//! kube-apiserver does.
//!
//! What a watch holds for its client is bounded as upstream's cacher bounds it:
//! - each event is decoded once and serialized once per format (JSON, protobuf, Table row,
//!   partial metadata), and every watcher sends the same bytes (upstream's
//!   `cachingObject`); a watcher only adds the few bytes that frame them;
//! - each watcher's backlog (encoded, not yet taken by its connection) holds at most
//!   [`WatchLimits::events_per_watcher`] events and [`WatchLimits::bytes_per_watcher`];
//!   a watcher whose client leaves its backlog full for [`WatchLimits::full_grace`] while
//!   a live event waits is closed (upstream's `cacheWatcher.add`: "Forcing ... watcher
//!   close due to unresponsiveness", counted in `apiserver_terminated_watchers_total`)
//!   and its backlog freed at once. As upstream, a client that reads nothing is not
//!   closed for time alone: what it holds stays within the bounds;
//! - every backlog counts against [`WatchLimits::pending_bytes`]; past it, the watchers
//!   holding the most are closed.
//!
//! A closed watcher's stream is cut (not ended cleanly), so the connection lets go of what
//! it buffered too; the client re-watches from the last resourceVersion it saw.

use std::{
    collections::{HashMap, VecDeque},
    pin::Pin,
    sync::{
        Arc, OnceLock, Weak,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio::{sync::Notify, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    ServerState,
    metrics::{FormatLabels, Metrics, ResourceLabels, WatchMetrics},
    negotiate::{self, Representation},
    protobuf,
    status::{ApiError, Qualified},
};
use crate::{
    registry::{ResourceDef, table},
    storage::{
        Query, decode, flag,
        get_list::{ListOptions, list_objects},
    },
    store::{EventKind, StoreError, WatchEvent},
};

/// What watches may hold for clients that do not read (see the `watch` module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// How many encoded events one watcher's backlog holds (upstream's watch channel:
    /// 100 events for a resource without an index).
    pub events_per_watcher: usize,
    /// How many bytes of encoded events one watcher's backlog holds; one event larger than
    /// this still goes through an empty backlog.
    pub bytes_per_watcher: usize,
    /// How many bytes the backlogs of all watchers hold together; past it, the watchers
    /// holding the most are closed.
    pub pending_bytes: usize,
    /// How long a live event waits for room in a full backlog before the watcher is closed
    /// (upstream gives a blocked watcher a share of a 100 ms budget).
    pub full_grace: Duration,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            events_per_watcher: 100,
            bytes_per_watcher: 2 * 1024 * 1024,
            pending_bytes: 256 * 1024 * 1024,
            full_grace: Duration::from_secs(1),
        }
    }
}

/// How long a watch with `sendInitialEvents` from a resourceVersion newer than the store's
/// waits for the store to reach it (upstream's `blockTimeout` in
/// `watchCache.waitUntilFreshAndBlock`).
const FRESHNESS_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the store's revision is checked while waiting for it.
const FRESHNESS_POLL: Duration = Duration::from_millis(50);

/// The serialization a watch sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// `{"type":…,"object":…}` lines.
    Json,
    /// Length-prefixed `WatchEvent` frames (see [`protobuf`]).
    Protobuf,
}

/// One event as sent: its chunks (a small per-watcher head and the shared object bytes).
type Frame = Vec<Bytes>;

fn frame_len(frame: &Frame) -> usize {
    frame.iter().map(Bytes::len).sum()
}

/// Encodes one watch event as a line.
fn line(event_type: &str, object: Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// One watch event of a value made for this watcher alone (an initial object, a bookmark,
/// an error) in the watch's format. In protobuf, an event that cannot be encoded becomes an
/// `ERROR` event with a 500 `Status`, as upstream reports a failed encoding mid-stream.
fn value_frame(format: Format, event_type: &str, object: Value) -> Frame {
    match format {
        Format::Json => vec![line(event_type, object)],
        Format::Protobuf => {
            let bytes = protobuf::encode_watch_frame(event_type, &object).unwrap_or_else(|e| {
                tracing::error!(error = %e, "encoding a watch event as protobuf");
                let status = ApiError::internal(format!("encoding a watch event as protobuf: {e}"));
                protobuf::encode_watch_frame("ERROR", &status.to_status()).unwrap_or_default()
            });
            vec![Bytes::from(bytes)]
        }
    }
}

fn render(def: &ResourceDef, repr: Representation, obj: &Value, first: &mut bool) -> Value {
    match repr {
        Representation::Object => obj.clone(),
        Representation::PartialMetadata => table::partial_metadata(obj),
        Representation::Table => {
            let rv = obj["metadata"]["resourceVersion"].as_str().unwrap_or("");
            let t = table::table(def, std::slice::from_ref(obj), rv, None, *first);
            *first = false;
            t
        }
    }
}

/// A BOOKMARK's object: the watched kind, or `PartialObjectMetadata` for a watch of
/// metadata only (as upstream converts every event of such a watch: its clients, the
/// garbage collector's metadata informers, cannot decode the resource's own kind).
fn bookmark(
    def: &ResourceDef,
    repr: Representation,
    revision: u64,
    initial_events_end: bool,
) -> Value {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    match repr {
        Representation::PartialMetadata => json!({
            "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata
        }),
        _ => json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": metadata}),
    }
}

/// A store event decoded once and shared by every watcher of the resource, with its
/// serializations, each made the first time a watcher needs it.
pub(crate) struct DecodedEvent {
    /// The object after the change (for a delete: its last state, at the delete revision).
    object: Value,
    /// The object before the change, for modifications (selector transitions need it).
    previous: Option<Value>,
    /// The size of the stored value, the basis of [`DecodedEvent::size_bytes`].
    stored_len: usize,
    /// `object` as JSON.
    json: OnceLock<Bytes>,
    /// `object` as an enveloped protobuf object, or why it has none.
    protobuf: OnceLock<Result<Bytes, String>>,
    /// `object` as `PartialObjectMetadata` JSON.
    partial: OnceLock<Bytes>,
    /// `object` as a one-row Table without column definitions, as JSON.
    table: OnceLock<Bytes>,
}

/// The cached events by (resource, revision), their insertion order for eviction, and
/// their estimated size in bytes.
#[derive(Default)]
struct CacheEntries {
    map: HashMap<(usize, u64), Arc<DecodedEvent>>,
    order: VecDeque<(usize, u64)>,
    bytes: usize,
}

/// Decoded events shared by watchers, keyed by resource and revision: with many watchers on
/// one resource, each event is decoded and encoded once, not once per watcher.
#[derive(Default)]
pub(crate) struct EventCache {
    entries: parking_lot::Mutex<CacheEntries>,
}

/// How many decoded events the cache keeps at most.
const EVENT_CACHE_CAPACITY: usize = 4096;
/// How many bytes of decoded events the cache keeps at most ([`DecodedEvent::size_bytes`]).
const EVENT_CACHE_BYTES: usize = 64 * 1024 * 1024;

impl EventCache {
    fn get_or_decode(
        &self,
        def: &'static ResourceDef,
        event: &WatchEvent,
    ) -> Result<Option<Arc<DecodedEvent>>, ApiError> {
        let key = (std::ptr::from_ref(def) as usize, event.revision);
        if let Some(hit) = self.entries.lock().map.get(&key) {
            return Ok(Some(hit.clone()));
        }
        let decoded = match event.kind {
            EventKind::Delete => match &event.prev_value {
                Some(prev) => DecodedEvent::new(
                    decode(def, &prev.value, event.revision)?,
                    None,
                    prev.value.len(),
                ),
                None => return Ok(None),
            },
            EventKind::Put => {
                let Some(value) = &event.value else {
                    return Ok(None);
                };
                let previous = match &event.prev_value {
                    Some(prev) if !event.is_create() => {
                        Some(decode(def, &prev.value, prev.mod_revision)?)
                    }
                    _ => None,
                };
                DecodedEvent::new(decode(def, value, event.revision)?, previous, value.len())
            }
        };
        let decoded = Arc::new(decoded);
        let mut entries = self.entries.lock();
        let entries = &mut *entries;
        match entries.map.get(&key) {
            // Another watcher decoded it meanwhile: share that one, so its encodings are
            // made once.
            Some(first) => return Ok(Some(first.clone())),
            None => {
                entries.map.insert(key, decoded.clone());
            }
        }
        entries.order.push_back(key);
        entries.bytes += decoded.size_bytes();
        while entries.order.len() > EVENT_CACHE_CAPACITY || entries.bytes > EVENT_CACHE_BYTES {
            let Some(old) = entries.order.pop_front() else {
                break;
            };
            if let Some(evicted) = entries.map.remove(&old) {
                entries.bytes -= evicted.size_bytes();
            }
        }
        Ok(Some(decoded))
    }

    /// How many decoded events the cache holds and their estimated bytes.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let entries = self.entries.lock();
        (entries.map.len(), entries.bytes)
    }
}

fn encoded(metrics: &WatchMetrics, format: &str) {
    metrics
        .encodings
        .get_or_create(&FormatLabels {
            format: format.to_owned(),
        })
        .inc();
}

impl DecodedEvent {
    /// An estimate of the memory this event holds: the stored text, about twice that for
    /// each decoded object (a `serde_json::Value` takes more room than its text), and
    /// about as much again for its serializations.
    fn size_bytes(&self) -> usize {
        let decoded = if self.previous.is_some() { 4 } else { 2 };
        self.stored_len * (2 + decoded)
    }

    fn new(object: Value, previous: Option<Value>, stored_len: usize) -> Self {
        DecodedEvent {
            object,
            previous,
            stored_len,
            json: OnceLock::new(),
            protobuf: OnceLock::new(),
            partial: OnceLock::new(),
            table: OnceLock::new(),
        }
    }

    fn json(&self, metrics: &WatchMetrics) -> &Bytes {
        self.json.get_or_init(|| {
            encoded(metrics, "json");
            Bytes::from(serde_json::to_vec(&self.object).unwrap_or_default())
        })
    }

    fn protobuf(&self, metrics: &WatchMetrics) -> &Result<Bytes, String> {
        self.protobuf.get_or_init(|| {
            encoded(metrics, "protobuf");
            protobuf::encode_object(&self.object)
                .map(Bytes::from)
                .map_err(|e| e.to_string())
        })
    }

    fn partial(&self, metrics: &WatchMetrics) -> &Bytes {
        self.partial.get_or_init(|| {
            encoded(metrics, "partial");
            let partial = table::partial_metadata(&self.object);
            Bytes::from(serde_json::to_vec(&partial).unwrap_or_default())
        })
    }

    fn table(&self, def: &ResourceDef, metrics: &WatchMetrics) -> &Bytes {
        self.table.get_or_init(|| {
            encoded(metrics, "table");
            let rv = self.object["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("");
            let row = table::table(def, std::slice::from_ref(&self.object), rv, None, false);
            Bytes::from(serde_json::to_vec(&row).unwrap_or_default())
        })
    }
}

/// What a store event means to a watcher with selectors: `None` to skip.
fn translate(
    def: &ResourceDef,
    opts: &ListOptions,
    event: &WatchEvent,
    decoded: &DecodedEvent,
) -> Option<&'static str> {
    let selecting = !opts.labels.is_empty() || !opts.fields.is_empty();
    let now = !selecting || opts.matches(def, &decoded.object);
    match event.kind {
        EventKind::Delete => now.then_some("DELETED"),
        EventKind::Put => {
            let before = match &decoded.previous {
                Some(prev) => !selecting || opts.matches(def, prev),
                None => false,
            };
            match (before, now) {
                (false, true) => Some("ADDED"),
                (true, true) => Some("MODIFIED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

/// Frames an already-encoded JSON object as a watch event line: the object's bytes are
/// shared, not copied.
fn framed(event_type: &'static str, object_json: &Bytes) -> Frame {
    let head: &'static [u8] = match event_type {
        "ADDED" => b"{\"type\":\"ADDED\",\"object\":",
        "MODIFIED" => b"{\"type\":\"MODIFIED\",\"object\":",
        "DELETED" => b"{\"type\":\"DELETED\",\"object\":",
        "BOOKMARK" => b"{\"type\":\"BOOKMARK\",\"object\":",
        _ => b"{\"type\":\"ERROR\",\"object\":",
    };
    vec![
        Bytes::from_static(head),
        object_json.clone(),
        Bytes::from_static(b"}\n"),
    ]
}

/// Frames an already-encoded protobuf object as a watch frame, sharing its bytes.
fn framed_protobuf(event_type: &str, raw: &Bytes) -> Frame {
    vec![
        Bytes::from(protobuf::watch_frame_head(event_type, raw.len())),
        raw.clone(),
    ]
}

fn expired_event(format: Format, message: String) -> Frame {
    value_frame(format, "ERROR", ApiError::expired(message).to_status())
}

/// `resource` or `resource.group`, as upstream's `GroupResource.String()`.
fn group_resource(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.plural.to_owned()
    } else {
        format!("{}.{}", def.plural, def.group)
    }
}

/// Starts a watch and returns the streaming response.
pub(crate) async fn watch(
    state: Arc<ServerState>,
    def: &'static ResourceDef,
    namespace: Option<String>,
    query: &Query,
    repr: Representation,
) -> Result<Response, ApiError> {
    let opts = ListOptions::parse(def, query)?;
    let bookmarks = flag(query, "allowWatchBookmarks");
    let send_initial = flag(query, "sendInitialEvents");
    if send_initial && opts.resource_version_match.as_deref() != Some("NotOlderThan") {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            vec![super::status::FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            )],
        ));
    }
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        None => state.config.default_watch_timeout,
    };
    let format = watch_format(def, repr)?;
    let rv = opts.resource_version.clone().unwrap_or_default();
    let requested: Option<u64> = match rv.as_str() {
        "" | "0" => None,
        rv => Some(
            rv.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?,
        ),
    };
    // With sendInitialEvents the initial state must be at least as new as the requested
    // version: upstream's cacher (waitUntilWatchCacheFreshAndForceAllEvents) waits for it
    // up to 3 s, then the stream is one ERROR event, 504 "Too large resource version".
    // Without it, a watch from a future version is established and waits for events, as
    // upstream's ("clients can wait for events without unnecessary blocking").
    if send_initial
        && let Some(requested) = requested
        && let Err(current) = wait_until_fresh(&state, requested).await
    {
        let error = ApiError::too_large_resource_version(requested, current).to_status();
        return Ok(single_event(
            format,
            repr,
            value_frame(format, "ERROR", error),
        ));
    }
    // From "" or "0" (or with sendInitialEvents) the watch starts with the current state.
    let (initial, from_revision) = match requested {
        Some(revision) if !send_initial => (Vec::new(), revision),
        _ => {
            let list_opts = ListOptions {
                continue_token: None,
                limit: None,
                resource_version: None,
                resource_version_match: None,
                ..opts_clone(&opts)
            };
            let (items, revision, _) =
                list_objects(&*state.store, def, namespace.as_deref(), &list_opts).await?;
            (items, revision)
        }
    };
    let prefix = def.key_prefix(namespace.as_deref());
    let store_watch = state.store.watch(&prefix, from_revision).await;

    let identifier = format!(
        "key: {prefix:?}, labels: {:?}, fields: {:?}",
        query.get("labelSelector").map_or("", String::as_str),
        query.get("fieldSelector").map_or("", String::as_str),
    );
    let (outbox, stream) = state.watchers.open(group_resource(def), identifier);
    let mut task = WatchTask {
        state: state.clone(),
        def,
        opts,
        repr,
        format,
        first: true,
        last_revision: from_revision,
        outbox,
    };
    state.metrics.watch_delta(1);
    tokio::spawn(async move {
        task.run(store_watch, initial, send_initial, bookmarks, timeout)
            .await;
        task.outbox.finish();
        task.state.metrics.watch_delta(-1);
    });
    Ok(streaming_response(format, repr, Body::from_stream(stream)))
}

/// The serialization of a watch: protobuf when the client asked for it first and the kind
/// has a protobuf form; JSON when it does not and JSON is acceptable too; otherwise 406
/// (upstream refuses a kind without protobuf the same way).
fn watch_format(def: &ResourceDef, repr: Representation) -> Result<Format, ApiError> {
    match protobuf::wanted() {
        Some(json_fallback) if repr == Representation::Object => {
            let api_version = def.api_version();
            if protobuf::encodable(&api_version, def.kind) {
                Ok(Format::Protobuf)
            } else if json_fallback {
                Ok(Format::Json)
            } else {
                let accept = format!(
                    "{} (for {api_version} {})",
                    protobuf::CONTENT_TYPE,
                    def.kind
                );
                Err(ApiError::not_acceptable(&accept))
            }
        }
        _ => Ok(Format::Json),
    }
}

/// A 200 watch response with its content type, marked as a stream the codec passes
/// through.
fn streaming_response(format: Format, repr: Representation, body: Body) -> Response {
    let content_type = match (format, repr) {
        (Format::Protobuf, _) => protobuf::WATCH_CONTENT_TYPE,
        (Format::Json, Representation::Table) => negotiate::TABLE_CONTENT_TYPE,
        (Format::Json, Representation::PartialMetadata) => negotiate::PARTIAL_CONTENT_TYPE,
        (Format::Json, Representation::Object) => "application/json",
    };
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response.extensions_mut().insert(protobuf::Streamed);
    response
}

/// A watch stream of one event.
fn single_event(format: Format, repr: Representation, frame: Frame) -> Response {
    let bytes: Vec<u8> = frame
        .iter()
        .flat_map(|chunk| chunk.iter().copied())
        .collect();
    streaming_response(format, repr, Body::from(bytes))
}

/// Waits up to [`FRESHNESS_TIMEOUT`] until the store's revision reaches `requested`;
/// `Err` with the store's revision when it does not (upstream's
/// `watchCache.waitUntilFreshAndBlock`).
async fn wait_until_fresh(state: &ServerState, requested: u64) -> Result<(), u64> {
    let deadline = Instant::now() + FRESHNESS_TIMEOUT;
    loop {
        let current = state.store.current_revision().await.unwrap_or(0);
        if current >= requested {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(current);
        }
        tokio::time::sleep((deadline - now).min(FRESHNESS_POLL)).await;
    }
}

/// Every open watch's backlog, and the bytes they hold together.
pub(crate) struct Watchers {
    limits: WatchLimits,
    metrics: WatchMetrics,
    next_id: AtomicU64,
    backlogs: parking_lot::Mutex<HashMap<u64, Weak<Backlog>>>,
}

impl Watchers {
    /// Watchers bounded by `limits`, reporting through `metrics`.
    pub(crate) fn new(limits: WatchLimits, metrics: &Metrics) -> Self {
        Watchers {
            limits,
            metrics: metrics.watch().clone(),
            next_id: AtomicU64::new(0),
            backlogs: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// A new watcher's sending side and the body stream that drains it.
    fn open(self: &Arc<Self>, resource: String, identifier: String) -> (Outbox, WatchBody) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let backlog = Arc::new(Backlog {
            id,
            resource,
            identifier,
            state: parking_lot::Mutex::new(BacklogState {
                frames: VecDeque::new(),
                bytes: 0,
                end: End::Open,
                waker: None,
            }),
            room: Notify::new(),
            closed: CancellationToken::new(),
        });
        self.backlogs.lock().insert(id, Arc::downgrade(&backlog));
        let outbox = Outbox {
            backlog: backlog.clone(),
            watchers: self.clone(),
        };
        let body = WatchBody {
            backlog,
            watchers: self.clone(),
            current: VecDeque::new(),
            reported: false,
        };
        (outbox, body)
    }

    /// Counts `bytes` more in the backlogs (the gauge is the count); returns the total.
    fn add(&self, bytes: usize) -> usize {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        let before = self.metrics.pending_bytes.inc_by(bytes);
        usize::try_from(before.saturating_add(bytes)).unwrap_or(0)
    }

    fn sub(&self, bytes: usize) {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        self.metrics.pending_bytes.dec_by(bytes);
    }

    fn pending(&self) -> usize {
        usize::try_from(self.metrics.pending_bytes.get()).unwrap_or(0)
    }

    /// Closes the watchers holding the most until all hold no more than
    /// [`WatchLimits::pending_bytes`].
    fn enforce_budget(&self) {
        while self.pending() > self.limits.pending_bytes {
            let largest = {
                let backlogs = self.backlogs.lock();
                backlogs
                    .values()
                    .filter_map(Weak::upgrade)
                    .map(|b| {
                        let bytes = b.state.lock().bytes;
                        (bytes, b)
                    })
                    .max_by_key(|(bytes, _)| *bytes)
            };
            match largest {
                Some((bytes, backlog)) if bytes > 0 => {
                    backlog.close(self, "the watchers' backlogs hold too much together");
                }
                _ => break,
            }
        }
    }
}

/// How a watcher's body stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// Events may still come.
    Open,
    /// The watch ended; the stream ends once the client has taken what is queued.
    Finished,
    /// The watcher was closed for not reading: the stream is cut.
    Closed,
}

struct BacklogState {
    frames: VecDeque<(Frame, usize)>,
    bytes: usize,
    end: End,
    /// The body stream, waiting for a frame.
    waker: Option<Waker>,
}

/// One watcher's encoded events, not yet taken by its connection.
struct Backlog {
    id: u64,
    /// The watched resource, for the metric and the log.
    resource: String,
    /// The watch's key and selectors, for the log.
    identifier: String,
    state: parking_lot::Mutex<BacklogState>,
    /// Signalled when the client takes a frame.
    room: Notify,
    /// Cancelled when the watcher is closed or its client is gone.
    closed: CancellationToken,
}

impl Backlog {
    /// Closes the watcher for not reading and frees what it holds (upstream's
    /// `cacheWatcher.add` closeFunc).
    fn close(&self, watchers: &Watchers, why: &str) {
        let (freed, queued, waker) = {
            let mut state = self.state.lock();
            if state.end == End::Closed {
                return;
            }
            state.end = End::Closed;
            let queued = state.frames.len();
            state.frames.clear();
            (std::mem::take(&mut state.bytes), queued, state.waker.take())
        };
        watchers.sub(freed);
        tracing::warn!(
            "Forcing {} watcher close due to unresponsiveness: {}. len(backlog) = {queued}, bytes = {freed}: {why}",
            self.resource,
            self.identifier,
        );
        watchers
            .metrics
            .terminated
            .get_or_create(&ResourceLabels {
                resource: self.resource.clone(),
            })
            .inc();
        self.closed.cancel();
        self.room.notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The client went away, or the watcher was closed.
struct Gone;

/// The sending side of a watch response.
struct Outbox {
    backlog: Arc<Backlog>,
    watchers: Arc<Watchers>,
}

impl Outbox {
    /// Queues one event for the client. When the backlog is full, waits for the client to
    /// take something: up to `patience`, then closes the watcher; without a patience, as
    /// long as it takes.
    async fn send(&self, frame: Frame, patience: Option<Duration>) -> Result<(), Gone> {
        let limits = self.watchers.limits;
        let len = frame_len(&frame);
        let deadline = patience.map(|p| Instant::now() + p);
        let mut frame = Some(frame);
        loop {
            let room = self.backlog.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.backlog.state.lock();
                if state.end != End::Open {
                    return Err(Gone);
                }
                let fits = state.frames.len() < limits.events_per_watcher
                    && (state.bytes == 0 || state.bytes + len <= limits.bytes_per_watcher);
                if fits {
                    // Counted before the body can take it, so the total never goes below
                    // what is queued.
                    let total = self.watchers.add(len);
                    state
                        .frames
                        .push_back((frame.take().unwrap_or_default(), len));
                    state.bytes += len;
                    if let Some(waker) = state.waker.take() {
                        waker.wake();
                    }
                    drop(state);
                    if total > limits.pending_bytes {
                        self.watchers.enforce_budget();
                    }
                    return if self.backlog.closed.is_cancelled() {
                        Err(Gone)
                    } else {
                        Ok(())
                    };
                }
            }
            let expired = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut room => {}
                _ = self.backlog.closed.cancelled() => return Err(Gone),
                _ = expired => {
                    self.backlog.close(&self.watchers, "its backlog stayed full");
                    return Err(Gone);
                }
            }
        }
    }

    /// Queues one event if the backlog has room; `Ok(false)` when it is full.
    fn try_send(&self, frame: Frame) -> Result<bool, Gone> {
        let limits = self.watchers.limits;
        let len = frame_len(&frame);
        let mut state = self.backlog.state.lock();
        if state.end != End::Open {
            return Err(Gone);
        }
        if state.frames.len() >= limits.events_per_watcher
            || (state.bytes > 0 && state.bytes + len > limits.bytes_per_watcher)
        {
            return Ok(false);
        }
        let total = self.watchers.add(len);
        state.frames.push_back((frame, len));
        state.bytes += len;
        if let Some(waker) = state.waker.take() {
            waker.wake();
        }
        drop(state);
        if total > limits.pending_bytes {
            self.watchers.enforce_budget();
        }
        Ok(!self.backlog.closed.is_cancelled())
    }

    /// Ends the watch: the stream ends once the client has taken what is queued.
    fn finish(&self) {
        let waker = {
            let mut state = self.backlog.state.lock();
            if state.end == End::Open {
                state.end = End::Finished;
            }
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Why a watch stream was cut.
#[derive(Debug, thiserror::Error)]
#[error("the watcher was closed because its client did not read")]
struct WatcherClosed;

/// A watch response's body: takes the backlog's frames as the connection asks for them.
struct WatchBody {
    backlog: Arc<Backlog>,
    watchers: Arc<Watchers>,
    /// The chunks of the frame being handed over.
    current: VecDeque<Bytes>,
    /// Whether the cut was reported (once, then the stream ends).
    reported: bool,
}

impl futures::Stream for WatchBody {
    type Item = Result<Bytes, WatcherClosed>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(chunk) = this.current.pop_front() {
            return Poll::Ready(Some(Ok(chunk)));
        }
        let mut state = this.backlog.state.lock();
        if let Some((frame, len)) = state.frames.pop_front() {
            state.bytes -= len;
            drop(state);
            this.watchers.sub(len);
            this.backlog.room.notify_one();
            this.current = frame.into_iter().filter(|c| !c.is_empty()).collect();
            return match this.current.pop_front() {
                Some(chunk) => Poll::Ready(Some(Ok(chunk))),
                None => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            };
        }
        match state.end {
            End::Open => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
            End::Finished => Poll::Ready(None),
            End::Closed if !this.reported => {
                this.reported = true;
                Poll::Ready(Some(Err(WatcherClosed)))
            }
            End::Closed => Poll::Ready(None),
        }
    }
}

impl Drop for WatchBody {
    fn drop(&mut self) {
        let freed = {
            let mut state = self.backlog.state.lock();
            state.frames.clear();
            if state.end != End::Closed {
                state.end = End::Finished;
            }
            std::mem::take(&mut state.bytes)
        };
        self.watchers.sub(freed);
        self.backlog.closed.cancel();
        self.backlog.room.notify_one();
        self.watchers.backlogs.lock().remove(&self.backlog.id);
    }
}

/// Whether a watch goes on.
enum Flow {
    Continue,
    Stop,
}

/// One watch's state while it streams.
struct WatchTask {
    state: Arc<ServerState>,
    def: &'static ResourceDef,
    opts: ListOptions,
    repr: Representation,
    format: Format,
    first: bool,
    /// Every event of this watch up to this revision has been sent (or skipped as not
    /// selected): the revision a bookmark may carry.
    last_revision: u64,
    outbox: Outbox,
}

impl WatchTask {
    /// Queues a live event (or a bookmark): a full backlog gets the short grace.
    async fn send_live(&self, frame: Frame) -> Flow {
        let patience = self.state.config.watch_limits.full_grace;
        match self.outbox.send(frame, Some(patience)).await {
            Ok(()) => Flow::Continue,
            Err(Gone) => Flow::Stop,
        }
    }

    async fn run(
        &mut self,
        store_watch: Result<crate::store::WatchStream, StoreError>,
        initial: Vec<Value>,
        send_initial: bool,
        bookmarks: bool,
        timeout: Duration,
    ) {
        let def = self.def;
        let format = self.format;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut events = match store_watch {
            Ok(events) => events,
            Err(e) => {
                let _ = self.send_live(error_frame(def, format, e)).await;
                return;
            }
        };
        // The initial state is this watcher's own: the client takes it at its pace (until
        // the watch's deadline), as upstream's watcher sends it from its own goroutine.
        for obj in &initial {
            let object = render(def, self.repr, obj, &mut self.first);
            let frame = value_frame(format, "ADDED", object);
            tokio::select! {
                sent = self.outbox.send(frame, None) => if sent.is_err() {
                    return;
                },
                _ = &mut deadline => return,
            }
        }
        // The cacher marks the end of the initial events only for a client that takes
        // bookmarks (`setInitialEventsEndBookmarkIfRequested`).
        if send_initial && bookmarks {
            let marker = value_frame(
                format,
                "BOOKMARK",
                bookmark(def, self.repr, self.last_revision, true),
            );
            if let Flow::Stop = self.send_live(marker).await {
                return;
            }
        }
        let mut ticker = tokio::time::interval(self.state.config.bookmark_interval);
        ticker.tick().await;
        loop {
            let flow = tokio::select! {
                _ = &mut deadline => {
                    // kube-apiserver sends a last bookmark before the deadline, so the
                    // client resumes from a current revision.
                    if bookmarks {
                        self.progress_bookmark(&mut events).await;
                    }
                    Flow::Stop
                }
                _ = self.outbox.backlog.closed.cancelled() => Flow::Stop,
                _ = ticker.tick(), if bookmarks => self.progress_bookmark(&mut events).await,
                next = events.next() => self.on_event(next).await,
            };
            if let Flow::Stop = flow {
                break;
            }
        }
    }

    /// Sends one store event (or the error that ends the watch) to the client.
    async fn on_event(&mut self, next: Option<Result<WatchEvent, StoreError>>) -> Flow {
        let def = self.def;
        let format = self.format;
        let event = match next {
            Some(Ok(event)) => event,
            Some(Err(e @ StoreError::Expired { .. })) => {
                let _ = self.send_live(error_frame(def, format, e)).await;
                return Flow::Stop;
            }
            // A lagging watcher or a closed store: end the stream; the client re-watches
            // from the last revision it saw.
            Some(Err(_)) | None => return Flow::Stop,
        };
        self.last_revision = event.revision;
        let decoded = match self.state.event_cache.get_or_decode(def, &event) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => return Flow::Continue,
            Err(e) => {
                let _ = self
                    .send_live(value_frame(format, "ERROR", e.to_status()))
                    .await;
                return Flow::Stop;
            }
        };
        let Some(kind) = translate(def, &self.opts, &event, &decoded) else {
            return Flow::Continue;
        };
        let metrics = &self.state.watchers.metrics;
        let out = match (format, self.repr) {
            (Format::Protobuf, _) => match decoded.protobuf(metrics) {
                Ok(raw) => framed_protobuf(kind, raw),
                Err(e) => {
                    tracing::error!(error = %e, "encoding a watch event as protobuf");
                    let status =
                        ApiError::internal(format!("encoding a watch event as protobuf: {e}"));
                    value_frame(format, "ERROR", status.to_status())
                }
            },
            (Format::Json, Representation::Object) => framed(kind, decoded.json(metrics)),
            (Format::Json, Representation::PartialMetadata) => {
                framed(kind, decoded.partial(metrics))
            }
            (Format::Json, Representation::Table) if !self.first => {
                framed(kind, decoded.table(def, metrics))
            }
            (Format::Json, repr) => value_frame(
                format,
                kind,
                render(def, repr, &decoded.object, &mut self.first),
            ),
        };
        self.send_live(out).await
    }

    /// A bookmark at the store's current revision, as kube-apiserver's carry the storage
    /// revision (etcd progress notify) even when nothing this watch selects changed: a
    /// client resuming from it is not sent 410 while the window still covers it. The store
    /// has every event up to that revision in this watch's stream already
    /// ([`Store::current_revision`](crate::store::Store::current_revision)); they are
    /// sent first, so the bookmark skips nothing.
    async fn progress_bookmark(&mut self, events: &mut crate::store::WatchStream) -> Flow {
        let current = self
            .state
            .store
            .current_revision()
            .await
            .unwrap_or(self.last_revision);
        // Unconstrained: tokio's cooperative budget must not make a ready event look
        // pending, or the bookmark could pass it.
        while let Some(next) = tokio::task::coop::unconstrained(events.next()).now_or_never() {
            if let Flow::Stop = self.on_event(next).await {
                return Flow::Stop;
            }
        }
        self.last_revision = self.last_revision.max(current);
        let marker = bookmark(self.def, self.repr, self.last_revision, false);
        // A bookmark never waits: upstream's cacher offers it to a watcher without
        // blocking (`nonblockingAdd`) and drops it when the watcher's buffer is full.
        match self
            .outbox
            .try_send(value_frame(self.format, "BOOKMARK", marker))
        {
            Ok(_) => Flow::Continue,
            Err(Gone) => Flow::Stop,
        }
    }
}

/// The `ERROR` event for a store error that ends a watch: 410 Expired for a version the
/// window no longer covers, as kube-apiserver.
fn error_frame(def: &ResourceDef, format: Format, e: StoreError) -> Frame {
    match e {
        StoreError::Expired {
            requested,
            oldest_available,
        } => expired_event(
            format,
            format!("too old resource version: {requested} ({oldest_available})"),
        ),
        e => {
            let q = Qualified::new(def.group, def.plural, "");
            value_frame(format, "ERROR", ApiError::from_store(&q, e).to_status())
        }
    }
}

fn opts_clone(opts: &ListOptions) -> ListOptions {
    ListOptions {
        labels: opts.labels.clone(),
        fields: opts.fields.clone(),
        limit: opts.limit,
        continue_token: opts.continue_token.clone(),
        resource_version: opts.resource_version.clone(),
        resource_version_match: opts.resource_version_match.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::KeyValue;

    #[test]
    fn event_cache_is_bounded_by_bytes() {
        let configmaps = crate::registry::Registry::standard()
            .find("", "v1", "configmaps")
            .expect("configmaps are served");
        let cache = EventCache::default();
        let big = "x".repeat(1024 * 1024);
        for revision in 1..=100u64 {
            let name = format!("c{revision}");
            let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "default"}, "data": {"k": big}});
            let value = Bytes::from(serde_json::to_vec(&object).unwrap());
            // The deletion of a 1 MiB ConfigMap: the event holds the deleted object.
            let event = WatchEvent {
                kind: EventKind::Delete,
                key: configmaps.key(Some("default"), &name),
                value: None,
                prev_value: Some(KeyValue {
                    key: configmaps.key(Some("default"), &name),
                    value,
                    create_revision: revision,
                    mod_revision: revision,
                }),
                create_revision: revision,
                revision,
            };
            assert!(cache.get_or_decode(configmaps, &event).unwrap().is_some());
        }
        let (events, bytes) = cache.held();
        assert!(bytes <= EVENT_CACHE_BYTES, "{bytes} bytes");
        // 100 events of 1 MiB would be 400 MiB by the estimate; the bound keeps 16.
        assert!((15..=25).contains(&events), "{events} events");
    }

    #[test]
    fn framed_lines_match_serde() {
        let obj = json!({"kind": "Lease", "metadata": {"name": "a\"b"}});
        let bytes = Bytes::from(serde_json::to_vec(&obj).unwrap());
        let framed: Vec<u8> = framed("MODIFIED", &bytes).concat();
        let parsed: Value = serde_json::from_slice(&framed[..framed.len() - 1]).unwrap();
        assert_eq!(parsed, json!({"type": "MODIFIED", "object": obj}));
        assert_eq!(framed.last(), Some(&b'\n'));
    }

    /// A protobuf frame built from a shared encoded object is byte for byte the frame
    /// prost writes for the whole `WatchEvent`, whatever the object's size (one-, two- and
    /// three-byte varint lengths).
    #[test]
    fn shared_protobuf_frames_match_prost() {
        for size in [0, 10, 200, 20_000] {
            let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "a"}, "data": {"k": "x".repeat(size)}});
            let raw = Bytes::from(protobuf::encode_object(&obj).unwrap());
            let shared: Vec<u8> = framed_protobuf("MODIFIED", &raw).concat();
            let whole = protobuf::encode_watch_frame("MODIFIED", &obj).unwrap();
            use k8s_pb::apimachinery::pkg::{
                apis::meta::v1::WatchEvent as PbEvent, runtime::RawExtension,
            };
            use prost::Message;
            let event = PbEvent {
                r#type: Some("MODIFIED".into()),
                object: Some(RawExtension {
                    raw: Some(raw.to_vec()),
                }),
            };
            let mut by_prost = (event.encoded_len() as u32).to_be_bytes().to_vec();
            event.encode(&mut by_prost).unwrap();
            assert_eq!(shared, by_prost, "{size}");
            assert_eq!(whole, by_prost, "{size}");
        }
    }

    /// Mid-stream errors travel as `ERROR` events with a `Status` (upstream's watch
    /// server); an event that cannot be encoded becomes one with a 500 rather than
    /// ending the stream silently.
    #[test]
    fn watch_errors_are_status_events() {
        use k8s_pb::apimachinery::pkg::apis::meta::v1::{Status, WatchEvent as PbEvent};
        use prost::Message;

        fn open(frame: &[u8]) -> (String, Status) {
            let event = PbEvent::decode(&frame[4..]).expect("a WatchEvent");
            let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
            let unknown =
                k8s_pb::apimachinery::pkg::runtime::Unknown::decode(&raw[4..]).expect("envelope");
            let status =
                Status::decode(unknown.raw.unwrap_or_default().as_slice()).expect("Status");
            (event.r#type.unwrap_or_default(), status)
        }

        let frame = expired_event(Format::Protobuf, "too old resource version: 1 (5)".into());
        let (kind, status) = open(&frame.concat());
        assert_eq!(kind, "ERROR");
        assert_eq!(
            (status.code, status.reason.as_deref()),
            (Some(410), Some("Expired"))
        );

        let bad = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": 7}});
        let (kind, status) = open(&value_frame(Format::Protobuf, "ADDED", bad).concat());
        assert_eq!(kind, "ERROR");
        assert_eq!(status.code, Some(500));
    }
}
