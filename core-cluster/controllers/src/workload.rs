//! What the workload controllers (ReplicaSet, Deployment, Job, DaemonSet) share: the loop
//! that turns watch events into keys and reconciles them one at a time through the work
//! queue, upstream's controller expectations, controllerRefs, pods made from templates and
//! pod readiness.

use std::{collections::HashMap, fmt::Debug, sync::Arc, time::Duration};

use async_trait::async_trait;
use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::core::v1::{ObjectReference, Pod, PodTemplateSpec},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        reflector::{self, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span, warn};

use ccm_workqueue::{Queue, RateLimiter, sleep_until};

/// How long an expectation is waited for before the controller acts anyway (upstream
/// `ExpectationsTimeout`, 5 minutes).
const EXPECTATIONS_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether any of `fields` differs between a workload's stored status `before` and the
/// computed `after`, each read as a count (absent is 0, as Go's zero value).
pub(crate) fn counts_differ<'a>(
    before: &Value,
    after: &Value,
    fields: impl IntoIterator<Item = &'a str>,
) -> bool {
    fields
        .into_iter()
        .any(|f| before[f].as_i64().unwrap_or(0) != after[f].as_i64().unwrap_or(0))
}

/// Merge-patches `status` onto the status subresource of `name`.
pub(crate) async fn patch_status<K>(api: &Api<K>, name: &str, status: Value) -> kube::Result<()>
where
    K: Clone + DeserializeOwned + Debug,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await?;
    Ok(())
}

/// What a watch tells the loop.
pub(crate) enum Trigger {
    /// These `namespace/name` keys need a reconcile.
    Keys(Vec<String>),
    /// The watch's store holds a complete list.
    Synced,
}

/// A reflector on `api` feeding `store`, mapped to the keys each object touches.
pub(crate) fn watch<K>(
    api: Api<K>,
    to_keys: impl Fn(&K) -> Vec<String> + Send + 'static,
) -> (Store<K>, BoxStream<'static, Trigger>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    watch_with(api, watcher::Config::default(), to_keys)
}

/// [`watch`] of the objects `config` selects (a field selector on the name, say).
pub(crate) fn watch_with<K>(
    api: Api<K>,
    config: watcher::Config,
    to_keys: impl Fn(&K) -> Vec<String> + Send + 'static,
) -> (Store<K>, BoxStream<'static, Trigger>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config))
        .default_backoff()
        .filter_map(move |event| {
            let trigger = match event {
                Ok(
                    watcher::Event::Apply(o)
                    | watcher::Event::InitApply(o)
                    | watcher::Event::Delete(o),
                ) => Some(Trigger::Keys(to_keys(&o))),
                Ok(watcher::Event::InitDone) => Some(Trigger::Synced),
                Ok(watcher::Event::Init) => None,
                Err(e) => {
                    warn!(error = %e, "watch error");
                    None
                }
            };
            std::future::ready(trigger)
        })
        .boxed();
    (store, stream)
}

/// The key of an object: `namespace/name`.
pub(crate) fn key_of<K: Resource>(o: &K) -> String {
    format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any())
}

/// The key of the controller of `o` if its kind is `kind`.
pub(crate) fn controller_key<K: Resource>(o: &K, kind: &str) -> Vec<String> {
    controller_of(o)
        .filter(|r| r.kind == kind)
        .map(|r| vec![format!("{}/{}", o.namespace().unwrap_or_default(), r.name)])
        .unwrap_or_default()
}

/// The ownerReference with `controller: true`, if any.
pub(crate) fn controller_of<K: Resource>(o: &K) -> Option<&OwnerReference> {
    o.meta()
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|r| r.controller == Some(true))
}

/// Whether `o` is controlled by the object with `uid`.
pub(crate) fn controlled_by<K: Resource>(o: &K, uid: &str) -> bool {
    controller_of(o).is_some_and(|r| r.uid == uid)
}

/// The controllerRef upstream's workload controllers set (`controller` and
/// `blockOwnerDeletion` true), so the garbage collector cascades.
pub(crate) fn controller_ref<K: Resource<DynamicType = ()>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::api_version(&()).into_owned(),
        kind: K::kind(&()).into_owned(),
        name: owner.name_any(),
        uid: owner.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Reconciles one key.
#[async_trait]
pub(crate) trait Reconcile: Send {
    /// The controller's name, for spans and logs.
    fn name(&self) -> &'static str;
    /// Brings the object at `key` (`namespace/name`) to its desired state; `Some(d)` asks
    /// for another pass after `d`.
    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error>;
}

/// Runs `reconciler` on the keys the `watches` produce until `shutdown`, once every watch
/// has listed; failures are retried with the queue's backoff.
pub(crate) async fn drive(
    mut reconciler: impl Reconcile,
    watches: Vec<BoxStream<'static, Trigger>>,
    shutdown: CancellationToken,
) {
    let total = watches.len();
    let mut synced = vec![false; total];
    let mut events = futures::stream::select_all(
        watches
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map(move |t| (i, t))),
    );
    let mut queue: Queue<String> = Queue::new(RateLimiter::exponential(
        Duration::from_millis(5),
        Duration::from_secs(1000),
    ));
    loop {
        if synced.iter().all(|s| *s) {
            while let Some(key) = queue.try_get() {
                let span = info_span!("reconcile", controller = reconciler.name(), key = %key);
                match reconciler.reconcile(&key).instrument(span).await {
                    Ok(again) => {
                        queue.forget(&key);
                        if let Some(after) = again {
                            queue.add_after(key.clone(), after);
                        }
                    }
                    Err(e) => {
                        warn!(controller = reconciler.name(), %key, error = %e, "sync failed; retrying");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
                if shutdown.is_cancelled() {
                    return;
                }
            }
        }
        let deadline = queue.next_deadline();
        tokio::select! {
            _ = shutdown.cancelled() => return,
            next = events.next() => {
                let mut next = next;
                // Take every event already waiting before reconciling again, as an informer
                // keeps its cache current while the workers run: one event per reconcile
                // left the caches minutes behind a burst of 500 pod updates at 10,000 pods.
                loop {
                    match next {
                        Some((_, Trigger::Keys(keys))) => keys.into_iter().for_each(|k| queue.add(k)),
                        Some((i, Trigger::Synced)) => synced[i] = true,
                        None => return,
                    }
                    match events.next().now_or_never() {
                        Some(more) => next = more,
                        None => break,
                    }
                }
            }
            _ = sleep_until(deadline) => {}
        }
    }
}

/// Upstream's `ControllerExpectations`: after creating or deleting pods a controller waits
/// to see them in its cache before it counts again, so it never acts twice on one change.
#[derive(Debug, Default)]
pub(crate) struct Expectations {
    pending: HashMap<String, (Vec<(String, bool)>, Instant)>,
}

impl Expectations {
    /// Expects the pod `name` to appear (`created`) or to go under `key`.
    pub(crate) fn expect(&mut self, key: &str, name: String, created: bool) {
        let entry = self
            .pending
            .entry(key.to_owned())
            .or_insert_with(|| (Vec::new(), Instant::now()));
        entry.0.push((name, created));
        entry.1 = Instant::now();
    }

    /// Whether everything expected under `key` was seen in `pods` (or timed out).
    pub(crate) fn satisfied(&mut self, key: &str, pods: &Store<Pod>, namespace: &str) -> bool {
        let Some((list, since)) = self.pending.get_mut(key) else {
            return true;
        };
        list.retain(|(name, created)| {
            let pod = pods.get(&reflector::ObjectRef::new(name).within(namespace));
            let observed = if *created {
                pod.is_some()
            } else {
                pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
            };
            !observed
        });
        if list.is_empty() || since.elapsed() >= EXPECTATIONS_TIMEOUT {
            self.pending.remove(key);
            return true;
        }
        false
    }

    /// Forgets `key` (its object is gone).
    pub(crate) fn forget(&mut self, key: &str) {
        self.pending.remove(key);
    }
}

/// Pod phase, `Pending` when unset.
pub(crate) fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Not Succeeded or Failed and not being deleted (upstream `IsPodActive`).
pub(crate) fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed") && pod.metadata.deletion_timestamp.is_none()
}

/// When the pod's `Ready` condition became True, if it is.
pub(crate) fn ready_since(pod: &Pod) -> Option<Option<jiff::Timestamp>> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?;
    Some(c.last_transition_time.as_ref().map(|t| t.0))
}

/// Ready (upstream `IsPodReady`).
pub(crate) fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}

/// Ready for at least `min_ready` seconds at `now` (upstream `IsPodAvailable`); otherwise,
/// if ready, how long until it is available. `now` comes from the controller's
/// [`WallClock`](crate::clock::WallClock), the clock the simulated kubelets stamp
/// `lastTransitionTime` with, so the wait follows tokio time.
pub(crate) fn availability(
    pod: &Pod,
    min_ready: i64,
    now: jiff::Timestamp,
) -> Result<(), Option<Duration>> {
    let Some(since) = ready_since(pod) else {
        return Err(None);
    };
    if min_ready <= 0 {
        return Ok(());
    }
    let ready_for = since.map_or(jiff::SignedDuration::ZERO, |t| now.duration_since(t));
    let left = jiff::SignedDuration::from_secs(min_ready).saturating_sub(ready_for);
    if left.is_positive() {
        Err(Some(Duration::try_from(left).unwrap_or(Duration::ZERO)))
    } else {
        Ok(())
    }
}

/// A pod from `template` controlled by `owner`, named `<prefix>-<random>` (upstream
/// `GetPodFromTemplate`), with `labels` added.
pub(crate) fn pod_from_template(
    template: &PodTemplateSpec,
    owner: OwnerReference,
    namespace: &str,
    prefix: &str,
    labels: &[(&str, String)],
) -> Pod {
    let mut pod = Pod {
        metadata: template.metadata.clone().unwrap_or_default(),
        spec: template.spec.clone(),
        status: None,
    };
    let meta = &mut pod.metadata;
    meta.name = None;
    meta.generate_name = Some(format!("{prefix}-"));
    meta.namespace = Some(namespace.to_owned());
    meta.owner_references = Some(vec![owner]);
    let l = meta.labels.get_or_insert_with(Default::default);
    for (k, v) in labels {
        l.insert((*k).to_owned(), v.clone());
    }
    pod
}

/// Creates a pod and records `SuccessfulCreate` (or `FailedCreate`) on the owner; the
/// created pod's name, to expect it.
pub(crate) async fn create_pod(
    client: &Client,
    events: &EventSink,
    owner: &ObjectReference,
    pod: &Pod,
) -> Result<String, kube::Error> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), pod).await {
        Ok(created) => {
            let name = created.name_any();
            events.normal(
                owner,
                "SuccessfulCreate",
                "Create",
                format!("Created pod: {name}"),
            );
            Ok(name)
        }
        Err(e) => {
            events.warning(
                owner,
                "FailedCreate",
                "Create",
                format!("Error creating: {e}"),
            );
            Err(e)
        }
    }
}

/// Deletes a pod and records `SuccessfulDelete` on the owner. A pod already gone is fine.
pub(crate) async fn delete_pod(
    client: &Client,
    events: &EventSink,
    owner: &ObjectReference,
    pod: &Pod,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    match api.delete(&pod.name_any(), &Default::default()).await {
        Ok(_) => {
            events.normal(
                owner,
                "SuccessfulDelete",
                "Delete",
                format!("Deleted pod: {}", pod.name_any()),
            );
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Records events in the background, so reconciles never wait for them.
#[derive(Clone)]
pub(crate) struct EventSink {
    tx: tokio::sync::mpsc::UnboundedSender<(ObjectReference, KubeEvent)>,
}

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSink").finish_non_exhaustive()
    }
}

impl EventSink {
    /// A sink recording as `controller` until `shutdown`.
    pub(crate) fn spawn(client: Client, controller: &str, shutdown: CancellationToken) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(ObjectReference, KubeEvent)>();
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: controller.to_owned(),
                instance: None,
            },
        );
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    n = rx.recv() => n,
                };
                let Some((reference, event)) = next else {
                    return;
                };
                if let Err(e) = recorder.publish(&event, &reference).await {
                    warn!(error = %e, "could not record event");
                }
            }
        });
        Self { tx }
    }

    fn send(
        &self,
        owner: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let _ = self.tx.send((
            owner.clone(),
            KubeEvent {
                type_,
                reason: reason.into(),
                note: Some(note),
                action: action.into(),
                secondary: None,
            },
        ));
    }

    /// A Normal event.
    pub(crate) fn normal(&self, owner: &ObjectReference, reason: &str, action: &str, note: String) {
        self.send(owner, EventType::Normal, reason, action, note);
    }

    /// A Warning event.
    pub(crate) fn warning(
        &self,
        owner: &ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.send(owner, EventType::Warning, reason, action, note);
    }
}

/// The `Arc`ed objects of a store that `keep` selects.
pub(crate) fn select<K>(store: &Store<K>, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store.state_filter(|o| keep(o))
}
