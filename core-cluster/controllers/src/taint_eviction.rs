//! The taint eviction controller (upstream `pkg/controller/tainteviction`): pods on a node
//! with NoExecute taints they do not tolerate are deleted at once; pods that tolerate them
//! for `tolerationSeconds` are deleted that long after the controller first saw the taint,
//! unless the taint goes away first; pods that tolerate them forever stay.
//!
//! One loop owns the state (NoExecute taints per node, pods per node, scheduled
//! deletions); node events are handled before pod events, as upstream. Deletions and events
//! are written by [`DELETION_WORKERS`] concurrent workers.

use crate::clock::WallClock;
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    time::Duration,
};

use futures::{StreamExt, stream};
use k8s_openapi::{
    api::core::v1::{Node, ObjectReference, Pod, Taint, Toleration},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        watcher,
    },
};
use serde_json::json;
use tokio::{
    sync::mpsc,
    time::{Instant, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span, warn};

/// Concurrent workers that delete pods and record events (upstream `UpdateWorkerSize`).
pub const DELETION_WORKERS: usize = 8;
/// Tries of one pod deletion (upstream `retries`).
const DELETE_RETRIES: usize = 5;
/// Pause between tries.
const DELETE_RETRY_SLEEP: Duration = Duration::from_millis(10);
const CONTROLLER_NAME: &str = "taint-eviction-controller";

/// Whether `toleration` tolerates `taint` (upstream `ToleratesTaint`): an empty effect or key
/// matches any; `Exists` ignores the value, `Equal` (or empty) compares it.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = toleration.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    if let Some(key) = toleration.key.as_deref().filter(|k| !k.is_empty())
        && key != taint.key
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

/// When a pod with these tolerations must go, given a node's NoExecute taints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionDecision {
    /// No NoExecute taints, or every taint tolerated forever: cancel any deletion.
    Keep,
    /// Some taint is not tolerated, or a matching `tolerationSeconds` is ≤ 0.
    Now,
    /// Delete this long after the taint was first seen (the smallest matching
    /// `tolerationSeconds`).
    After(Duration),
}

/// The longest toleration: Go's largest `time.Duration` (about 292 years). Upstream
/// multiplies `tolerationSeconds` by `time.Second` in int64 nanoseconds; where that would
/// overflow, the wait is capped here instead.
pub const MAX_TOLERATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// Upstream `GetMatchingTolerations` + `getMinTolerationTime`: each taint is matched by the
/// first toleration that tolerates it; the pod may stay for the smallest `tolerationSeconds`
/// among those, forever when none has seconds. As upstream, a smallest `tolerationSeconds`
/// of `math.MaxInt64` is its "forever" sentinel; other values are capped at
/// [`MAX_TOLERATION`].
pub fn eviction_decision(taints: &[Taint], tolerations: &[Toleration]) -> EvictionDecision {
    if taints.is_empty() {
        return EvictionDecision::Keep;
    }
    let mut min: Option<i64> = None;
    for taint in taints {
        let Some(t) = tolerations.iter().find(|t| tolerates(t, taint)) else {
            return EvictionDecision::Now;
        };
        if let Some(secs) = t.toleration_seconds {
            if secs <= 0 {
                return EvictionDecision::Now;
            }
            min = Some(min.map_or(secs, |m| m.min(secs)));
        }
    }
    match min {
        None | Some(i64::MAX) => EvictionDecision::Keep,
        Some(secs) => {
            EvictionDecision::After(Duration::from_secs(secs.unsigned_abs()).min(MAX_TOLERATION))
        }
    }
}

fn no_execute_taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .cloned()
        .collect()
}

#[derive(Debug, Clone)]
struct PodInfo {
    node: String,
    tolerations: Vec<Toleration>,
    reference: ObjectReference,
}

#[derive(Debug, Clone, Copy)]
enum Work {
    Scheduled {
        created_at: Instant,
        fire_at: Instant,
    },
    /// Fired: kept so the pod is not scheduled again until cancelled (upstream keeps a nil
    /// worker).
    Fired,
}

enum Job {
    Delete {
        key: String,
        reference: ObjectReference,
    },
    Event {
        reference: ObjectReference,
        note: String,
    },
}

/// The state of the controller's loop.
#[derive(Default)]
struct State {
    pods: HashMap<String, PodInfo>,
    pods_on_node: HashMap<String, HashSet<String>>,
    tainted: HashMap<String, Vec<Taint>>,
    work: HashMap<String, Work>,
    timers: BTreeSet<(Instant, String)>,
    jobs: Vec<Job>,
}

impl State {
    fn cancel(&mut self, key: &str) {
        if let Some(work) = self.work.remove(key)
            && let Work::Scheduled { fire_at, .. } = work
        {
            self.timers.remove(&(fire_at, key.to_string()));
            if let Some(info) = self.pods.get(key) {
                self.jobs.push(Job::Event {
                    reference: info.reference.clone(),
                    note: format!("Cancelling deletion of Pod {key}"),
                });
            }
        }
    }

    fn add_work(&mut self, key: &str, created_at: Instant, fire_at: Instant) {
        if self.work.contains_key(key) {
            return;
        }
        self.work.insert(
            key.to_string(),
            Work::Scheduled {
                created_at,
                fire_at,
            },
        );
        self.timers.insert((fire_at, key.to_string()));
    }

    /// Upstream `processPodOnNode`.
    fn process_pod(&mut self, key: &str, taints: &[Taint], now: Instant) {
        let Some(info) = self.pods.get(key) else {
            return;
        };
        match eviction_decision(taints, &info.tolerations) {
            EvictionDecision::Keep => self.cancel(key),
            EvictionDecision::Now => {
                self.cancel(key);
                self.add_work(key, now, now);
            }
            EvictionDecision::After(min) => {
                let mut start = now;
                if let Some(Work::Scheduled { created_at, .. }) = self.work.get(key) {
                    start = *created_at;
                    // Upstream: keep the deletion when `start + min` is before `now + min`.
                    if start < now {
                        return;
                    }
                    self.cancel(key);
                }
                // A deadline past what the clock can hold never comes: nothing to schedule.
                match start.checked_add(min) {
                    Some(fire_at) => self.add_work(key, start, fire_at),
                    None => self.cancel(key),
                }
            }
        }
    }

    /// Upstream `handleNodeUpdate` (for a changed NoExecute taint set).
    fn node_changed(&mut self, name: &str, taints: Vec<Taint>, now: Instant) {
        if self
            .tainted
            .get(name)
            .map(Vec::as_slice)
            .unwrap_or_default()
            == taints.as_slice()
        {
            return;
        }
        if taints.is_empty() {
            self.tainted.remove(name);
        } else {
            self.tainted.insert(name.to_string(), taints.clone());
        }
        let pods: Vec<String> = self
            .pods_on_node
            .get(name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for key in pods {
            if taints.is_empty() {
                self.cancel(&key);
            } else {
                self.process_pod(&key, &taints, now);
            }
        }
    }

    fn pod_deleted(&mut self, key: &str) {
        self.cancel(key);
        self.work.remove(key);
        if let Some(info) = self.pods.remove(key)
            && let Some(set) = self.pods_on_node.get_mut(&info.node)
        {
            set.remove(key);
            if set.is_empty() {
                self.pods_on_node.remove(&info.node);
            }
        }
    }

    /// Upstream `PodUpdated` + `handlePodUpdate`: re-evaluated only when new or when its
    /// tolerations or node changed.
    fn pod_applied(&mut self, pod: &Pod, now: Instant) {
        let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.clone())
            .unwrap_or_default();
        if let Some(old) = self.pods.get(&key)
            && old.node == node
            && old.tolerations == tolerations
        {
            return;
        }
        if let Some(old) = self.pods.get(&key).cloned()
            && let Some(set) = self.pods_on_node.get_mut(&old.node)
        {
            set.remove(&key);
        }
        self.pods.insert(
            key.clone(),
            PodInfo {
                node: node.clone(),
                tolerations,
                reference: pod.object_ref(&()),
            },
        );
        if node.is_empty() {
            return;
        }
        self.pods_on_node
            .entry(node.clone())
            .or_default()
            .insert(key.clone());
        let Some(taints) = self.tainted.get(&node).cloned() else {
            return;
        };
        self.process_pod(&key, &taints, now);
    }

    /// Fires the deletions that are due.
    fn fire(&mut self, now: Instant) {
        while let Some((at, key)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.pop_first();
            if let Some(Work::Scheduled { fire_at, .. }) = self.work.get(&key)
                && *fire_at == at
            {
                self.work.insert(key.clone(), Work::Fired);
                if let Some(info) = self.pods.get(&key) {
                    self.jobs.push(Job::Delete {
                        key,
                        reference: info.reference.clone(),
                    });
                }
            }
        }
    }
}

/// The taint eviction controller.
pub struct TaintEvictionController {
    client: Client,
}

impl TaintEvictionController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let nodes = watcher(
            Api::<Node>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff();
        let pods = watcher(
            Api::<Pod>::all(self.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff();
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.into(),
                instance: None,
            },
        );
        let (job_tx, job_rx) = mpsc::unbounded_channel::<Job>();
        let (failed_tx, mut failed_rx) = mpsc::unbounded_channel::<String>();
        let client = self.client.clone();
        let clock = WallClock::new();
        let workers = stream::unfold(
            job_rx,
            |mut rx| async move { rx.recv().await.map(|j| (j, rx)) },
        )
        .for_each_concurrent(DELETION_WORKERS, move |job| {
            let client = client.clone();
            let recorder = recorder.clone();
            let failed_tx = failed_tx.clone();
            async move {
                match job {
                    Job::Event { reference, note } => {
                        publish(&recorder, &reference, note).await;
                    }
                    Job::Delete { key, reference } => {
                        publish(
                            &recorder,
                            &reference,
                            format!("Marking for deletion Pod {key}"),
                        )
                        .await;
                        let span = info_span!("taint_eviction", pod = %key);
                        if !delete_pod(&client, &reference, clock.now())
                            .instrument(span)
                            .await
                        {
                            let _ = failed_tx.send(key);
                        }
                    }
                }
            }
        });
        let mut workers = std::pin::pin!(workers);
        let mut nodes = std::pin::pin!(nodes);
        let mut pods = std::pin::pin!(pods);
        let mut state = State::default();
        loop {
            let next = state.timers.first().map(|(at, _)| *at);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = &mut workers => return,
                Some(ev) = nodes.next() => match ev {
                    Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                        let span = info_span!("taint_eviction", node = %n.name_any());
                        let _g = span.enter();
                        state.node_changed(&n.name_any(), no_execute_taints(&n), Instant::now());
                    }
                    Ok(watcher::Event::Delete(n)) => {
                        state.tainted.remove(&n.name_any());
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "node watch error"),
                },
                Some(ev) = pods.next() => match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                        state.pod_applied(&p, Instant::now());
                    }
                    Ok(watcher::Event::Delete(p)) => {
                        let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
                        state.pod_deleted(&key);
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "pod watch error"),
                },
                Some(key) = failed_rx.recv() => {
                    // Failed for good: forget it so a later event can schedule it again.
                    if matches!(state.work.get(&key), Some(Work::Fired)) {
                        state.work.remove(&key);
                    }
                }
                _ = sleep_until(next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))), if next.is_some() => {}
            }
            state.fire(Instant::now());
            for job in state.jobs.drain(..) {
                let _ = job_tx.send(job);
            }
        }
    }
}

async fn publish(recorder: &Recorder, reference: &ObjectReference, note: String) {
    let ev = Event {
        type_: EventType::Normal,
        reason: "TaintManagerEviction".into(),
        note: Some(note),
        action: "Delete".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        warn!(error = %e, "could not record event");
    }
}

/// Upstream `addConditionAndDeletePod`, up to 5 tries: condition `DisruptionTarget=True`
/// (`DeletionByTaintManager`) on the pod status, then DELETE. True when done (or gone).
/// `now` is written as the `DisruptionTarget` condition's transition time.
async fn delete_pod(client: &Client, reference: &ObjectReference, now: Timestamp) -> bool {
    let ns = reference.namespace.clone().unwrap_or_default();
    let name = reference.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for attempt in 0..DELETE_RETRIES {
        if attempt > 0 {
            tokio::time::sleep(DELETE_RETRY_SLEEP).await;
        }
        let pod = match api.get_opt(&name).await {
            Ok(Some(p)) => p,
            Ok(None) => return true,
            Err(e) => {
                warn!(error = %e, "get pod failed");
                continue;
            }
        };
        let marked = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "DisruptionTarget"
                        && c.status == "True"
                        && c.reason.as_deref() == Some("DeletionByTaintManager")
                })
            });
        if !marked {
            let patch = json!({
                "metadata": {"uid": pod.uid()},
                "status": {"conditions": [{
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "DeletionByTaintManager",
                    "message": "Taint manager: deleting due to NoExecute taint",
                    "lastTransitionTime": Time(now),
                }]}
            });
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                    return true;
                }
                warn!(error = %e, "DisruptionTarget condition failed");
                continue;
            }
        }
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {
                info!("pod deleted for a NoExecute taint");
                return true;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => return true,
            Err(e) => warn!(error = %e, "delete failed"),
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tol(key: &str, secs: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: secs,
            ..Toleration::default()
        }
    }

    fn t(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoExecute".into(),
            ..Taint::default()
        }
    }

    #[test]
    fn decisions() {
        // Untolerated → now
        assert_eq!(eviction_decision(&[t("a")], &[]), EvictionDecision::Now);
        assert_eq!(
            eviction_decision(&[t("a")], &[tol("b", None)]),
            EvictionDecision::Now
        );
        // Min seconds; ≤ 0 → now; nil on all → never
        assert_eq!(
            eviction_decision(
                &[t("a"), t("b")],
                &[tol("a", Some(300)), tol("b", Some(30))]
            ),
            EvictionDecision::After(Duration::from_secs(30))
        );
        assert_eq!(
            eviction_decision(&[t("a")], &[tol("a", Some(0))]),
            EvictionDecision::Now
        );
        assert_eq!(
            eviction_decision(&[t("a")], &[tol("a", None)]),
            EvictionDecision::Keep
        );
        // an empty key with Exists tolerates every taint
        assert_eq!(
            eviction_decision(&[t("x")], &[tol("", None)]),
            EvictionDecision::Keep
        );
    }

    /// Upstream `getMinTolerationTime`: `math.MaxInt64` seconds is "forever" (-1); other
    /// seconds too many for int64 nanoseconds are capped at Go's largest Duration.
    #[test]
    fn toleration_seconds_beyond_int64_nanoseconds_are_forever_or_capped() {
        assert_eq!(
            eviction_decision(&[t("a")], &[tol("a", Some(i64::MAX))]),
            EvictionDecision::Keep
        );
        assert_eq!(
            eviction_decision(&[t("a")], &[tol("a", Some(1 << 62))]),
            EvictionDecision::After(MAX_TOLERATION)
        );
        assert_eq!(
            eviction_decision(
                &[t("a"), t("b")],
                &[tol("a", Some(i64::MAX)), tol("b", Some(60))]
            ),
            EvictionDecision::After(Duration::from_secs(60))
        );
    }

    /// `processPodOnNode` with the longest toleration: its deadline is computed without
    /// overflow (or, where the monotonic clock cannot hold it, never scheduled), and the
    /// loop's state goes on deciding for the next taint.
    #[test]
    fn the_longest_toleration_is_scheduled_without_overflow() {
        let now = Instant::now();
        let mut state = State::default();
        for (name, secs) in [("huge", Some(1i64 << 62)), ("plain", None)] {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"nodeName": "n", "containers": [], "tolerations": [
                    {"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs}]}
            }))
            .unwrap();
            state.pod_applied(&pod, now);
        }
        state.node_changed("n", vec![t("k")], now);
        let timers: Vec<(Instant, &str)> =
            state.timers.iter().map(|(t, k)| (*t, k.as_str())).collect();
        match now.checked_add(MAX_TOLERATION) {
            Some(at) => assert_eq!(timers, [(at, "ns/huge")]),
            None => assert!(timers.is_empty()),
        }
        state.node_changed("n", vec![t("k"), t("other")], now);
        state.fire(now);
        let mut deleted: Vec<&str> = state
            .jobs
            .iter()
            .filter_map(|j| match j {
                Job::Delete { key, .. } => Some(key.as_str()),
                Job::Event { .. } => None,
            })
            .collect();
        deleted.sort();
        assert_eq!(
            deleted,
            ["ns/huge", "ns/plain"],
            "neither tolerates `other`"
        );
    }
}
