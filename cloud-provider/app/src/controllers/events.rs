//! Writing core/v1 Events about the objects a controller manages, through client-go's
//! `EventCorrelator` rules (`tools/record/events_cache.go`), so that a condition repeating
//! every reconcile does not write a new Event each time:
//!
//! - **spam filter**: a token bucket per source and object (burst 25, one token back every
//!   5 minutes); an event without a token is dropped;
//! - **aggregation**: more than 10 distinct messages with the same source, object, type and
//!   reason within 10 minutes are combined into one Event, "(combined from similar events): …";
//! - **deduplication**: the same event again bumps `count` and `lastTimestamp` of the Event
//!   already written (a PATCH), instead of creating one more.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// client-go's `defaultSpamBurst`.
const SPAM_BURST: f64 = 25.0;
/// client-go's `defaultSpamQPS`: one event per 5 minutes.
const SPAM_REFILL: Duration = Duration::from_secs(300);
/// client-go's `defaultAggregateMaxEvents`.
const AGGREGATE_MAX_EVENTS: usize = 10;
/// client-go's `defaultAggregateIntervalInSeconds`.
const AGGREGATE_INTERVAL: Duration = Duration::from_secs(600);
/// client-go's `maxLruCacheEntries`: beyond it the least recently used entries go.
const MAX_CACHE_ENTRIES: usize = 4096;
/// client-go's prefix of a combined message.
const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What the correlator decided for one event.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// The spam filter has no token for this source and object.
    Drop,
    /// Write a new Event (remembered under `key` once written).
    Create { key: String, message: String },
    /// Bump the Event already written.
    Patch {
        key: String,
        namespace: String,
        name: String,
        count: i32,
        message: String,
    },
}

#[derive(Debug)]
struct Written {
    namespace: String,
    name: String,
    count: i32,
    used: Instant,
}

#[derive(Debug)]
struct Similar {
    messages: HashSet<String>,
    since: Instant,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The correlator's caches (client-go's `EventCorrelator`).
#[derive(Debug, Default)]
struct Correlator {
    written: HashMap<String, Written>,
    similar: HashMap<String, Similar>,
    buckets: HashMap<String, Bucket>,
}

impl Correlator {
    /// `object_key`: source and involved object; `aggregate_key`: that plus type and reason.
    fn decide(
        &mut self,
        object_key: &str,
        aggregate_key: &str,
        message: &str,
        now: Instant,
    ) -> Decision {
        // Spam filter: a token bucket per source and object.
        let bucket = self.buckets.entry(object_key.to_owned()).or_insert(Bucket {
            tokens: SPAM_BURST,
            at: now,
        });
        let refill = now.duration_since(bucket.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
        bucket.tokens = (bucket.tokens + refill).min(SPAM_BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return Decision::Drop;
        }
        bucket.tokens -= 1.0;

        // Aggregation: past 10 distinct messages in the interval, one combined Event.
        let similar = self
            .similar
            .entry(aggregate_key.to_owned())
            .or_insert_with(|| Similar {
                messages: HashSet::new(),
                since: now,
            });
        if now.duration_since(similar.since) > AGGREGATE_INTERVAL {
            similar.messages.clear();
            similar.since = now;
        }
        similar.messages.insert(message.to_owned());
        let (key, message) = if similar.messages.len() >= AGGREGATE_MAX_EVENTS {
            (
                format!("{aggregate_key}\u{0}{COMBINED_PREFIX}"),
                format!("{COMBINED_PREFIX}{message}"),
            )
        } else {
            (format!("{aggregate_key}\u{0}{message}"), message.to_owned())
        };

        // Deduplication: the same event bumps the one already written.
        match self.written.get_mut(&key) {
            Some(written) => {
                written.count += 1;
                written.used = now;
                Decision::Patch {
                    namespace: written.namespace.clone(),
                    name: written.name.clone(),
                    count: written.count,
                    key,
                    message,
                }
            }
            None => Decision::Create { key, message },
        }
    }

    fn remember(&mut self, key: String, namespace: String, name: String, now: Instant) {
        if self.written.len() >= MAX_CACHE_ENTRIES {
            self.evict();
        }
        self.written.insert(
            key,
            Written {
                namespace,
                name,
                count: 1,
                used: now,
            },
        );
    }

    fn forget(&mut self, key: &str) {
        self.written.remove(key);
    }

    /// Drops the least recently used half of the caches.
    fn evict(&mut self) {
        let mut used: Vec<Instant> = self.written.values().map(|w| w.used).collect();
        used.sort();
        let cutoff = used[used.len() / 2];
        self.written.retain(|_, w| w.used > cutoff);
        if self.similar.len() >= MAX_CACHE_ENTRIES {
            self.similar.clear();
        }
        if self.buckets.len() >= MAX_CACHE_ENTRIES {
            self.buckets.retain(|_, b| b.tokens < SPAM_BURST);
        }
    }
}

/// client-go's `maxQueuedEvents`: events recorded in the background wait in queues of
/// this many in all; beyond it they are dropped (its broadcaster's `DropIfChannelFull`).
const MAX_QUEUED_EVENTS: usize = 1000;
/// How many queued events are written at once by the background writer: one per lane.
const BACKGROUND_WRITES: usize = 8;

/// An event waiting in the background queue.
struct Queued {
    component: &'static str,
    involved: ObjectReference,
    type_: EventType,
    reason: &'static str,
    message: String,
}

/// Writes Events through the correlator. Clones share the caches: one recorder per manager.
#[derive(Clone)]
pub struct EventRecorder {
    client: kube::Client,
    correlator: Arc<Mutex<Correlator>>,
    /// The lanes of [`record_in_background`](Self::record_in_background), their writer tasks
    /// started on first use; the tasks end once every clone is dropped.
    queue: Arc<OnceLock<Vec<mpsc::Sender<Queued>>>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder writing with `client`, with empty caches.
    pub fn new(client: kube::Client) -> Self {
        EventRecorder {
            client,
            correlator: Arc::default(),
            queue: Arc::default(),
        }
    }

    /// Records an event about `obj` without waiting for the API server, as client-go's
    /// recorder does (its broadcaster writes in the background): the event joins its object's
    /// lane, one of [`BACKGROUND_WRITES`] queues sharing [`MAX_QUEUED_EVENTS`], and is dropped
    /// when that queue is full. For events on a hot path (one per Node initialized, one per
    /// load balancer changed), so that writing them never holds up the work they report.
    /// Events about one object are written in the order recorded, as client-go's broadcaster
    /// writes them one after another.
    pub(crate) fn record_in_background<K>(
        &self,
        component: &'static str,
        obj: &K,
        type_: EventType,
        reason: &'static str,
        message: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let queued = Queued {
            component,
            involved: involved_object(obj),
            type_,
            reason,
            message,
        };
        let lanes = self.queue.get_or_init(|| self.start_writers());
        let lane = &lanes[lane_of(&queued.involved)];
        if let Err(mpsc::error::TrySendError::Full(queued)) = lane.try_send(queued) {
            tracing::debug!(
                reason = queued.reason,
                "event dropped: the background event queue is full"
            );
        }
    }

    /// The background writers: [`BACKGROUND_WRITES`] lanes, each a task writing its events one
    /// at a time, so events about one object (always the same lane) keep their order while
    /// events about different objects are written at once.
    fn start_writers(&self) -> Vec<mpsc::Sender<Queued>> {
        (0..BACKGROUND_WRITES)
            .map(|_| {
                let (tx, mut rx) =
                    mpsc::channel::<Queued>(MAX_QUEUED_EVENTS.div_ceil(BACKGROUND_WRITES));
                // The writer holds a recorder without the lanes, so dropping every user's
                // clone closes them and ends the tasks.
                let writer = EventRecorder {
                    client: self.client.clone(),
                    correlator: self.correlator.clone(),
                    queue: Arc::default(),
                };
                tokio::spawn(async move {
                    while let Some(q) = rx.recv().await {
                        writer
                            .write(q.component, q.involved, q.type_, q.reason, &q.message)
                            .await;
                    }
                });
                tx
            })
            .collect()
    }

    /// Records an event about `obj`; failures are logged, never returned (events are best
    /// effort).
    pub(crate) async fn record<K>(
        &self,
        component: &str,
        obj: &K,
        type_: EventType,
        reason: &str,
        message: &str,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.write(component, involved_object(obj), type_, reason, message)
            .await;
    }

    /// Writes one event about `involved` through the correlator.
    async fn write(
        &self,
        component: &str,
        involved: ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let namespace = involved
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let object_key = [
            component,
            involved.kind.as_deref().unwrap_or(""),
            &namespace,
            involved.name.as_deref().unwrap_or(""),
            involved.uid.as_deref().unwrap_or(""),
            involved.api_version.as_deref().unwrap_or(""),
        ]
        .join("\u{0}");
        let aggregate_key = format!("{object_key}\u{0}{}\u{0}{reason}", type_.as_str());
        let now = Instant::now();
        let decision = self
            .correlator
            .lock()
            .decide(&object_key, &aggregate_key, message, now);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let stamp = Timestamp::now();
        match decision {
            Decision::Drop => {
                tracing::debug!(reason, "event dropped by the spam filter");
            }
            Decision::Patch {
                key,
                namespace: _,
                name,
                count,
                message,
            } => {
                let patch = serde_json::json!({
                    "count": count,
                    "lastTimestamp": Time(stamp),
                    "message": message,
                });
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {
                        // The Event expired: write it again.
                        self.correlator.lock().forget(&key);
                        self.create(&api, component, involved, type_, reason, &message, key)
                            .await;
                    }
                    Err(err) => tracing::warn!(%err, reason, "failed to update event"),
                }
            }
            Decision::Create { key, message } => {
                self.create(&api, component, involved, type_, reason, &message, key)
                    .await;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn create(
        &self,
        api: &Api<Event>,
        component: &str,
        involved: ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
        key: String,
    ) {
        let now = Timestamp::now();
        let name = involved.name.clone().unwrap_or_default();
        let namespace = involved
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{name}.")),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: involved,
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(type_.as_str().to_owned()),
            source: Some(EventSource {
                component: Some(component.to_owned()),
                host: None,
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            reporting_component: Some(component.to_owned()),
            reporting_instance: Some(component.to_owned()),
            action: Some(reason.to_owned()),
            count: Some(1),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => {
                self.correlator
                    .lock()
                    .remember(key, namespace, created.name_any(), Instant::now());
            }
            Err(err) => tracing::warn!(%err, reason, "failed to record event"),
        }
    }
}

/// The background lane of events about `involved`: by its UID (by kind, namespace and name
/// without one), so every event about one object goes to the same lane.
fn lane_of(involved: &ObjectReference) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    match involved.uid.as_deref() {
        Some(uid) => uid.hash(&mut hasher),
        None => (&involved.kind, &involved.namespace, &involved.name).hash(&mut hasher),
    }
    (hasher.finish() % BACKGROUND_WRITES as u64) as usize
}

/// The reference an Event makes to the object it is about.
fn involved_object<K>(obj: &K) -> ObjectReference
where
    K: Resource<DynamicType = ()>,
{
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(obj.name_any()),
        namespace: obj.namespace(),
        uid: obj.uid(),
        resource_version: obj.resource_version(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn create_key(decision: &Decision) -> String {
        match decision {
            Decision::Create { key, .. } => key.clone(),
            other => panic!("expected a create, got {other:?}"),
        }
    }

    /// client-go's EventLogger: the same event again is a PATCH of count on the first one.
    #[tokio::test(start_paused = true)]
    async fn repeated_events_bump_count() {
        let mut c = Correlator::default();
        let first = c.decide("obj", "agg", "route failed", Instant::now());
        c.remember(
            create_key(&first),
            "ns".into(),
            "ev.1".into(),
            Instant::now(),
        );
        for count in 2..=5 {
            tokio::time::advance(Duration::from_secs(10)).await;
            match c.decide("obj", "agg", "route failed", Instant::now()) {
                Decision::Patch { name, count: n, .. } => {
                    assert_eq!((name.as_str(), n), ("ev.1", count));
                }
                other => panic!("{other:?}"),
            }
        }
    }

    /// client-go's spam filter: burst 25 per source and object, then one per 5 minutes.
    #[tokio::test(start_paused = true)]
    async fn spam_filter_is_a_token_bucket_per_object() {
        let mut c = Correlator::default();
        for i in 0..25 {
            let d = c.decide("obj", "agg", &format!("m{}", i % 3), Instant::now());
            assert_ne!(d, Decision::Drop, "event {i}");
        }
        assert_eq!(c.decide("obj", "agg", "m0", Instant::now()), Decision::Drop);
        assert_ne!(
            c.decide("other", "agg2", "m0", Instant::now()),
            Decision::Drop,
            "another object has its own bucket"
        );
        tokio::time::advance(Duration::from_secs(299)).await;
        assert_eq!(c.decide("obj", "agg", "m0", Instant::now()), Decision::Drop);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_ne!(c.decide("obj", "agg", "m0", Instant::now()), Decision::Drop);
    }

    /// client-go's EventAggregator: from the 10th distinct message in 10 minutes on, one
    /// combined Event.
    #[tokio::test(start_paused = true)]
    async fn similar_messages_are_combined() {
        let mut c = Correlator::default();
        for i in 0..9 {
            let d = c.decide("obj", "agg", &format!("node-{i} failed"), Instant::now());
            assert!(matches!(d, Decision::Create { .. }), "{d:?}");
        }
        let tenth = c.decide("obj", "agg", "node-9 failed", Instant::now());
        let Decision::Create { key, message } = tenth else {
            panic!("{tenth:?}");
        };
        assert_eq!(message, "(combined from similar events): node-9 failed");
        c.remember(key, "ns".into(), "combined".into(), Instant::now());
        match c.decide("obj", "agg", "node-10 failed", Instant::now()) {
            Decision::Patch {
                name,
                count,
                message,
                ..
            } => {
                assert_eq!((name.as_str(), count), ("combined", 2));
                assert_eq!(message, "(combined from similar events): node-10 failed");
            }
            other => panic!("{other:?}"),
        }
    }

    /// client-go's broadcaster writes a component's events one after another: events about
    /// one object recorded in the background reach the API server in the order recorded, even
    /// when the first write is the slowest, while events about other objects are written
    /// beside them.
    #[tokio::test(start_paused = true)]
    async fn background_events_about_one_object_keep_their_order() {
        use k8s_openapi::api::core::v1::Node;
        let written: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most_in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let service = tower::service_fn({
            let (written, in_flight, most) =
                (written.clone(), in_flight.clone(), most_in_flight.clone());
            move |request: http::Request<kube::client::Body>| {
                let (written, in_flight, most) = (written.clone(), in_flight.clone(), most.clone());
                async move {
                    use std::sync::atomic::Ordering::SeqCst;
                    let body = request.into_body().collect_bytes().await?;
                    let event: serde_json::Value = serde_json::from_slice(&body)?;
                    let message = event["message"].as_str().unwrap_or_default().to_owned();
                    let object = event["involvedObject"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let now = in_flight.fetch_add(1, SeqCst) + 1;
                    most.fetch_max(now, SeqCst);
                    // The first event about an object is the slowest to write.
                    let index: u64 = message.trim_start_matches('m').parse().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(50 - 10 * index)).await;
                    in_flight.fetch_sub(1, SeqCst);
                    written.lock().push((object, message));
                    let mut created = event;
                    created["metadata"]["name"] = serde_json::json!(format!("ev.{}", now));
                    let response = http::Response::builder()
                        .status(201)
                        .body(kube::client::Body::from(serde_json::to_vec(&created)?))?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response)
                }
            }
        });
        let recorder = EventRecorder::new(kube::Client::new(service, "default"));
        let nodes: Vec<Node> = ["a", "b", "c", "d"]
            .iter()
            .map(|name| Node {
                metadata: ObjectMeta {
                    name: Some((*name).to_owned()),
                    uid: Some(format!("uid-{name}")),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect();
        for i in 0..4 {
            for node in &nodes {
                recorder.record_in_background(
                    "test",
                    node,
                    EventType::Normal,
                    "Tested",
                    format!("m{i}"),
                );
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let written = written.lock().clone();
        assert_eq!(written.len(), 16, "{written:?}");
        for node in ["a", "b", "c", "d"] {
            let order: Vec<&str> = written
                .iter()
                .filter(|(object, _)| object == node)
                .map(|(_, message)| message.as_str())
                .collect();
            assert_eq!(order, ["m0", "m1", "m2", "m3"], "events about {node}");
        }
        assert!(
            most_in_flight.load(std::sync::atomic::Ordering::SeqCst) > 1,
            "events about different objects are written at once"
        );
    }
}
