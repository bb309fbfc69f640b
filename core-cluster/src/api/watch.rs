//! WATCH: newline-delimited JSON events, replayed from a resourceVersion and then live, with
//! bookmarks, `sendInitialEvents`, selector transitions, and a 410 `ERROR` event inside the
//! 200 stream when the version is too old, as kube-apiserver does.

use std::{
    collections::{HashMap, VecDeque},
    convert::Infallible,
    sync::Arc,
    time::Duration,
};

use axum::{
    body::{Body, Bytes},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::{
    ServerState,
    handlers::{ListOptions, Query, decode, list_objects},
    negotiate::{self, Representation},
    status::{ApiError, Qualified},
};
use crate::{
    registry::{ResourceDef, table},
    store::{EventKind, StoreError, WatchEvent},
};

/// Encodes one watch event as a line.
fn line(event_type: &str, object: Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
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

fn bookmark(def: &ResourceDef, revision: u64, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": metadata})
}

/// A store event decoded once and shared by every watcher of the resource.
pub(crate) struct DecodedEvent {
    /// The object after the change (for a delete: its last state, at the delete revision).
    object: Value,
    /// The object before the change, for modifications (selector transitions need it).
    previous: Option<Value>,
    /// `object` serialized, so watchers without a special representation only frame it.
    object_json: Bytes,
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
                Some(prev) => DecodedEvent::new(decode(def, &prev.value, event.revision)?, None),
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
                DecodedEvent::new(decode(def, value, event.revision)?, previous)
            }
        };
        let decoded = Arc::new(decoded);
        let mut entries = self.entries.lock();
        let entries = &mut *entries;
        if entries.map.insert(key, decoded.clone()).is_none() {
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

impl DecodedEvent {
    /// An estimate of the memory this event holds: its JSON text, and about twice that for
    /// each decoded object (a `serde_json::Value` takes more room than its text).
    fn size_bytes(&self) -> usize {
        let decoded = if self.previous.is_some() { 4 } else { 2 };
        self.object_json.len() * (1 + decoded)
    }

    fn new(object: Value, previous: Option<Value>) -> Self {
        let object_json = Bytes::from(serde_json::to_vec(&object).unwrap_or_default());
        DecodedEvent {
            object,
            previous,
            object_json,
        }
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

/// Frames an already-encoded object as a watch event line.
fn framed(event_type: &str, object_json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(object_json.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object_json);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn expired_event(message: String) -> Bytes {
    line("ERROR", ApiError::expired(message).to_status())
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
    let bookmarks = super::handlers::flag(query, "allowWatchBookmarks");
    let send_initial = super::handlers::flag(query, "sendInitialEvents");
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
    if send_initial && !bookmarks {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            vec![super::status::FieldError::forbidden(
                "allowWatchBookmarks",
                "sendInitialEvents requires setting allowWatchBookmarks to true",
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
    let rv = opts.resource_version.clone().unwrap_or_default();
    // From "" or "0" (or with sendInitialEvents) the watch starts with the current state.
    let (initial, from_revision) = if rv.is_empty() || rv == "0" || send_initial {
        let list_opts = ListOptions {
            continue_token: None,
            limit: None,
            resource_version: None,
            resource_version_match: None,
            ..opts_clone(&opts)
        };
        let (items, revision, _) =
            list_objects(&state, def, namespace.as_deref(), &list_opts).await?;
        (items, revision)
    } else {
        let revision: u64 = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv:?}")))?;
        (Vec::new(), revision)
    };
    let prefix = def.key_prefix(namespace.as_deref());
    let store_watch = state.store.watch(&prefix, from_revision).await;

    let (outbox, stream) = outbox();
    let mut task = WatchTask {
        state: state.clone(),
        def,
        opts,
        repr,
        first: true,
        last_revision: from_revision,
        outbox,
    };
    state.metrics.watch_delta(1);
    tokio::spawn(async move {
        task.run(store_watch, initial, send_initial, bookmarks, timeout)
            .await;
        task.state.metrics.watch_delta(-1);
    });

    let content_type = match repr {
        Representation::Table => negotiate::TABLE_CONTENT_TYPE,
        Representation::PartialMetadata => negotiate::PARTIAL_CONTENT_TYPE,
        Representation::Object => "application/json",
    };
    let mut response = (StatusCode::OK, Body::from_stream(stream)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(response)
}

/// How many encoded lines one watch response holds before its task waits for the client.
const RESPONSE_BUFFER_LINES: usize = 256;
/// How many bytes of encoded lines one watch response holds before its task waits for the
/// client (a single larger line still goes through alone). While the task waits it takes
/// nothing from the store, whose bounded buffer then ends a client that stays behind.
const RESPONSE_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// The sending side of a watch response: bounded by lines and by bytes.
struct Outbox {
    tx: mpsc::Sender<(Bytes, OwnedSemaphorePermit)>,
    bytes: Arc<Semaphore>,
}

/// The client went away.
struct Gone;

impl Outbox {
    /// Queues one line for the client, waiting while the response holds too much.
    async fn send(&self, line: Bytes) -> Result<(), Gone> {
        let weight = u32::try_from(line.len().clamp(1, RESPONSE_BUFFER_BYTES)).unwrap_or(u32::MAX);
        let permit = self
            .bytes
            .clone()
            .acquire_many_owned(weight)
            .await
            .map_err(|_| Gone)?;
        self.tx.send((line, permit)).await.map_err(|_| Gone)
    }
}

/// A watch response's outbox and the body stream that drains it; a line's bytes are
/// released when the body hands it to the connection.
fn outbox() -> (
    Outbox,
    impl futures::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) {
    let (tx, rx) = mpsc::channel(RESPONSE_BUFFER_LINES);
    let bytes = Arc::new(Semaphore::new(RESPONSE_BUFFER_BYTES));
    let stream = futures::stream::unfold(
        rx,
        |mut rx: mpsc::Receiver<(Bytes, OwnedSemaphorePermit)>| async move {
            let (line, permit) = rx.recv().await?;
            drop(permit);
            Some((Ok::<_, Infallible>(line), rx))
        },
    );
    (Outbox { tx, bytes }, stream)
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
    first: bool,
    /// Every event of this watch up to this revision has been sent (or skipped as not
    /// selected): the revision a bookmark may carry.
    last_revision: u64,
    outbox: Outbox,
}

impl WatchTask {
    async fn run(
        &mut self,
        store_watch: Result<crate::store::WatchStream, StoreError>,
        initial: Vec<Value>,
        send_initial: bool,
        bookmarks: bool,
        timeout: Duration,
    ) {
        let def = self.def;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut events = match store_watch {
            Ok(events) => events,
            Err(e) => {
                let _ = self.outbox.send(error_line(def, e)).await;
                return;
            }
        };
        for obj in &initial {
            let line = line("ADDED", render(def, self.repr, obj, &mut self.first));
            if self.outbox.send(line).await.is_err() {
                return;
            }
        }
        if send_initial {
            let marker = line("BOOKMARK", bookmark(def, self.last_revision, true));
            if self.outbox.send(marker).await.is_err() {
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
                _ = self.outbox.tx.closed() => Flow::Stop,
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
        let event = match next {
            Some(Ok(event)) => event,
            Some(Err(e @ StoreError::Expired { .. })) => {
                let _ = self.outbox.send(error_line(def, e)).await;
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
                let _ = self.outbox.send(line("ERROR", e.to_status())).await;
                return Flow::Stop;
            }
        };
        let Some(kind) = translate(def, &self.opts, &event, &decoded) else {
            return Flow::Continue;
        };
        let out = match self.repr {
            Representation::Object => framed(kind, &decoded.object_json),
            other => line(kind, render(def, other, &decoded.object, &mut self.first)),
        };
        match self.outbox.send(out).await {
            Ok(()) => Flow::Continue,
            Err(Gone) => Flow::Stop,
        }
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
        let marker = line("BOOKMARK", bookmark(self.def, self.last_revision, false));
        match self.outbox.send(marker).await {
            Ok(()) => Flow::Continue,
            Err(Gone) => Flow::Stop,
        }
    }
}

/// The `ERROR` line for a store error that ends a watch: 410 Expired for a version the
/// window no longer covers, as kube-apiserver.
fn error_line(def: &ResourceDef, e: StoreError) -> Bytes {
    match e {
        StoreError::Expired {
            requested,
            oldest_available,
        } => expired_event(format!(
            "too old resource version: {requested} ({oldest_available})"
        )),
        e => {
            let q = Qualified::new(def.group, def.plural, "");
            line("ERROR", ApiError::from_store(&q, e).to_status())
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
        // 100 events of 1 MiB would be 300 MiB by the estimate; the bound keeps about 21.
        assert!((15..=25).contains(&events), "{events} events");
    }

    #[test]
    fn framed_lines_match_serde() {
        let obj = json!({"kind": "Lease", "metadata": {"name": "a\"b"}});
        let bytes = serde_json::to_vec(&obj).unwrap();
        let framed = framed("MODIFIED", &bytes);
        let parsed: Value = serde_json::from_slice(&framed[..framed.len() - 1]).unwrap();
        assert_eq!(parsed, json!({"type": "MODIFIED", "object": obj}));
        assert_eq!(framed.last(), Some(&b'\n'));
    }
}
