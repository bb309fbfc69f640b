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
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

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

/// The cached events by (resource, revision), and their insertion order for eviction.
type CacheEntries = (
    HashMap<(usize, u64), Arc<DecodedEvent>>,
    VecDeque<(usize, u64)>,
);

/// Decoded events shared by watchers, keyed by resource and revision: with many watchers on
/// one resource, each event is decoded and encoded once, not once per watcher.
#[derive(Default)]
pub(crate) struct EventCache {
    entries: parking_lot::Mutex<CacheEntries>,
}

/// How many decoded events the cache keeps.
const EVENT_CACHE_CAPACITY: usize = 4096;

impl EventCache {
    fn get_or_decode(
        &self,
        def: &'static ResourceDef,
        event: &WatchEvent,
    ) -> Result<Option<Arc<DecodedEvent>>, ApiError> {
        let key = (std::ptr::from_ref(def) as usize, event.revision);
        if let Some(hit) = self.entries.lock().0.get(&key) {
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
        let (map, order) = &mut *entries;
        if map.insert(key, decoded.clone()).is_none() {
            order.push_back(key);
            while order.len() > EVENT_CACHE_CAPACITY {
                if let Some(old) = order.pop_front() {
                    map.remove(&old);
                }
            }
        }
        Ok(Some(decoded))
    }
}

impl DecodedEvent {
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
    let bookmarks = matches!(
        query.get("allowWatchBookmarks").map(String::as_str),
        Some("true" | "1")
    );
    let send_initial = query.get("sendInitialEvents").map(String::as_str) == Some("true");
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
    let q = Qualified::new(def.group, def.plural, "");
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

    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let metrics_state = state.clone();
    state.metrics.watch_delta(1);
    tokio::spawn(async move {
        let state = metrics_state;
        let mut first = true;
        let mut last_revision = from_revision;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut events = match store_watch {
            Ok(events) => events,
            Err(StoreError::Expired {
                requested,
                oldest_available,
            }) => {
                let _ = tx
                    .send(expired_event(format!(
                        "too old resource version: {requested} ({oldest_available})"
                    )))
                    .await;
                state.metrics.watch_delta(-1);
                return;
            }
            Err(e) => {
                let _ = tx
                    .send(line("ERROR", ApiError::from_store(&q, e).to_status()))
                    .await;
                state.metrics.watch_delta(-1);
                return;
            }
        };
        for obj in &initial {
            if tx
                .send(line("ADDED", render(def, repr, obj, &mut first)))
                .await
                .is_err()
            {
                state.metrics.watch_delta(-1);
                return;
            }
        }
        if send_initial {
            let _ = tx
                .send(line("BOOKMARK", bookmark(def, from_revision, true)))
                .await;
        }
        let mut ticker = tokio::time::interval(state.config.bookmark_interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                _ = tx.closed() => break,
                _ = ticker.tick(), if bookmarks => {
                    if tx.send(line("BOOKMARK", bookmark(def, last_revision, false))).await.is_err() {
                        break;
                    }
                }
                next = events.next() => {
                    match next {
                        Some(Ok(event)) => {
                            last_revision = event.revision;
                            let decoded = match state.event_cache.get_or_decode(def, &event) {
                                Ok(Some(decoded)) => decoded,
                                Ok(None) => continue,
                                Err(e) => {
                                    let _ = tx.send(line("ERROR", e.to_status())).await;
                                    break;
                                }
                            };
                            let Some(kind) = translate(def, &opts, &event, &decoded) else {
                                continue;
                            };
                            let out = match repr {
                                Representation::Object => framed(kind, &decoded.object_json),
                                other => line(kind, render(def, other, &decoded.object, &mut first)),
                            };
                            if tx.send(out).await.is_err() {
                                break;
                            }
                        }
                        Some(Err(StoreError::Expired { requested, oldest_available })) => {
                            let _ = tx.send(expired_event(format!("too old resource version: {requested} ({oldest_available})"))).await;
                            break;
                        }
                        // A lagging watcher or a closed store: end the stream; the client
                        // re-watches from the last revision it saw.
                        Some(Err(_)) | None => break,
                    }
                }
            }
        }
        state.metrics.watch_delta(-1);
    });

    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, Infallible>(bytes), rx))
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
