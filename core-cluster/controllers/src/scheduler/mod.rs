//! The scheduler: binds pending pods to nodes, like kube-scheduler's default profile.
//!
//! # What upstream does (`pkg/scheduler`)
//!
//! Informers on Nodes and Pods feed a node cache (each node's allocatable resources and the
//! requests of the pods bound or assumed on it) and a scheduling queue of the unbound pods
//! whose `spec.schedulerName` is this scheduler's. For each pod, one at a time:
//!
//! - **filter**: the default profile's filter plugins run per node in order and stop at the
//!   first failure: `NodeUnschedulable` (a cordoned node, unless the pod tolerates
//!   `node.kubernetes.io/unschedulable:NoSchedule`), `TaintToleration` (NoSchedule and
//!   NoExecute taints), `NodeAffinity` (`nodeSelector` and required node affinity),
//!   `NodeResourcesFit` (requests ≤ allocatable minus what is requested, and the pod count);
//!   once `numFeasibleNodesToFind` nodes fit (all under 100 nodes, else an adaptive
//!   percentage, at least 5 % and 100 nodes) the search stops, the next search starting
//!   where this one ended;
//! - **score**: `NodeResourcesFit`'s `LeastAllocated` picks the emptiest feasible node;
//! - **assume and bind**: the pod is charged to the node in the cache at once, then bound
//!   asynchronously with a POST of `pods/<name>/binding`; a failed bind un-assumes it and
//!   the pod is retried; a `Scheduled` event says "Successfully assigned ns/pod to node";
//! - **no fit**: a `FailedScheduling` Warning event and the pod condition
//!   `PodScheduled=False` (reason `Unschedulable`) carry the `FitError` message ("0/3 nodes
//!   are available: 1 Insufficient cpu, 2 node(s) were unschedulable. preemption: …"); the
//!   pod waits among the unschedulable pods until a cluster event may help (a node added or
//!   updated, an assigned pod deleted), then goes back to the queue after its backoff
//!   (1 s doubling to 10 s); pods unschedulable for 5 minutes are retried anyway.
//!
//! # Where we differ
//!
//! - No preemption: the `preemption:` part of the message is what `DefaultPreemption` says
//!   when it finds no victims (true when every pod has the default priority).
//! - Among equally scored nodes the first found wins (upstream picks one at random).
//! - Only the plugins above run (no inter-pod affinity, topology spread, volumes, ports).
//! - Every unschedulable pod is retried on any node or assigned-pod event (upstream asks
//!   each plugin's `QueueingHint` whether the event may help).

pub mod fit;

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        watcher,
    },
};
use serde_json::json;
use tokio::{sync::mpsc, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span, warn};

use self::fit::{NodeFacts, Resources, Unfit, fit_error_message, pod_requests};
use crate::clock::WallClock;
use ccm_workqueue::{Queue, RateLimiter, sleep_until};

/// The default scheduler name (pods default `spec.schedulerName` to it).
pub const DEFAULT_SCHEDULER_NAME: &str = "default-scheduler";
/// Binds in flight at once.
const MAX_INFLIGHT_BINDS: usize = 64;
/// Workers that record events and pod conditions.
const NOTE_WORKERS: usize = 4;

/// Configuration of the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// The `spec.schedulerName` this scheduler serves.
    pub scheduler_name: String,
    /// First retry delay of an unschedulable pod (upstream `podInitialBackoffSeconds`, 1 s).
    pub pod_initial_backoff: Duration,
    /// Longest retry delay (upstream `podMaxBackoffSeconds`, 10 s).
    pub pod_max_backoff: Duration,
    /// How long a pod stays unschedulable before it is retried without any event
    /// (upstream `podMaxInUnschedulablePodsDuration`, 5 min).
    pub max_in_unschedulable: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            scheduler_name: DEFAULT_SCHEDULER_NAME.to_owned(),
            pod_initial_backoff: Duration::from_secs(1),
            pod_max_backoff: Duration::from_secs(10),
            max_in_unschedulable: Duration::from_secs(300),
        }
    }
}

/// How many feasible nodes a search looks for (upstream `numFeasibleNodesToFind` with the
/// default adaptive `percentageOfNodesToScore`).
pub fn num_feasible_nodes_to_find(all: usize) -> usize {
    const MIN_FEASIBLE: usize = 100;
    if all < MIN_FEASIBLE {
        return all;
    }
    let percentage = 50usize.saturating_sub(all / 125).max(5);
    (all * percentage / 100).max(MIN_FEASIBLE)
}

/// The node cache and the queue of pods to place: everything scheduling decides on,
/// without I/O (the controller feeds it from its watches).
#[derive(Debug)]
pub struct SchedulerCore {
    scheduler_name: String,
    nodes: HashMap<String, NodeFacts>,
    /// Node names in the order searches walk them.
    order: Vec<String>,
    next_start: usize,
    /// What each node's bound or assumed pods request, nodes in the cache or not.
    usage: HashMap<String, Resources>,
    /// Bound (or assumed) non-terminal pods by uid: their node and requests.
    bound: HashMap<String, (String, Resources)>,
    /// Unbound pods this scheduler serves, by `namespace/name`.
    pending: HashMap<String, Pod>,
    /// Pods that fit nowhere, and since when.
    unschedulable: HashMap<String, Instant>,
    queue: Queue<String>,
}

/// A scheduling decision for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Bind the pod to this node (already assumed in the cache).
    Bind(String),
    /// No node fits: the `FitError` message.
    Unschedulable(String),
}

fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

impl SchedulerCore {
    /// An empty cache for the scheduler called `scheduler_name`.
    pub fn new(config: &SchedulerConfig) -> Self {
        Self {
            scheduler_name: config.scheduler_name.clone(),
            nodes: HashMap::new(),
            order: Vec::new(),
            next_start: 0,
            usage: HashMap::new(),
            bound: HashMap::new(),
            pending: HashMap::new(),
            unschedulable: HashMap::new(),
            queue: Queue::new(RateLimiter::exponential(
                config.pod_initial_backoff,
                config.pod_max_backoff,
            )),
        }
    }

    /// Adds or updates a node; unschedulable pods get another chance.
    pub fn node_applied(&mut self, node: Node) {
        let name = node.name_any();
        let mut facts = NodeFacts::new(node);
        facts.requested = self.usage.get(&name).copied().unwrap_or_default();
        if self.nodes.insert(name.clone(), facts).is_none() {
            self.order.push(name);
        }
        self.retry_unschedulable();
    }

    /// Forgets a node.
    pub fn node_deleted(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            self.order.retain(|n| n != name);
        }
    }

    /// The names of the cached nodes.
    pub fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }

    fn charge(&mut self, node: &str, r: &Resources, add: bool) {
        let usage = self.usage.entry(node.to_owned()).or_default();
        if add {
            usage.add(r);
        } else {
            usage.sub(r);
        }
        let now = *usage;
        if now == Resources::default() {
            self.usage.remove(node);
        }
        if let Some(facts) = self.nodes.get_mut(node) {
            facts.requested = now;
        }
    }

    /// Releases what the pod with `uid` held; whether it held anything.
    fn release(&mut self, uid: &str) -> bool {
        match self.bound.remove(uid) {
            Some((node, r)) => {
                self.charge(&node, &r, false);
                true
            }
            None => false,
        }
    }

    /// Takes in a pod added or changed.
    pub fn pod_applied(&mut self, pod: Pod) {
        let key = pod_key(&pod);
        let uid = pod.uid().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        match node {
            Some(node) => {
                self.pending.remove(&key);
                self.unschedulable.remove(&key);
                if is_terminal(&pod) {
                    if self.release(&uid) {
                        self.retry_unschedulable();
                    }
                } else if !self.bound.contains_key(&uid) {
                    let r = pod_requests(&pod);
                    self.charge(&node, &r, true);
                    self.bound.insert(uid, (node, r));
                }
            }
            None => {
                let ours = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
                    == Some(self.scheduler_name.as_str());
                if !ours || pod.metadata.deletion_timestamp.is_some() {
                    self.pending.remove(&key);
                    self.unschedulable.remove(&key);
                    return;
                }
                let new = !self.pending.contains_key(&key);
                self.pending.insert(key.clone(), pod);
                if new && !self.unschedulable.contains_key(&key) {
                    self.queue.add(key);
                }
            }
        }
    }

    /// Takes in a deleted pod; freed resources give unschedulable pods another chance.
    pub fn pod_deleted(&mut self, pod: &Pod) {
        let key = pod_key(pod);
        self.pending.remove(&key);
        self.unschedulable.remove(&key);
        if self.release(&pod.uid().unwrap_or_default()) {
            self.retry_unschedulable();
        }
    }

    /// Moves every unschedulable pod back to the queue, after its backoff.
    fn retry_unschedulable(&mut self) {
        for (key, _) in self.unschedulable.drain() {
            self.queue.add_rate_limited(key);
        }
    }

    /// Retries the pods unschedulable for longer than `max`.
    pub fn flush_unschedulable(&mut self, max: Duration) {
        let now = Instant::now();
        let due: Vec<String> = self
            .unschedulable
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= max)
            .map(|(k, _)| k.clone())
            .collect();
        for key in due {
            self.unschedulable.remove(&key);
            self.queue.add_rate_limited(key);
        }
    }

    /// The next pod to schedule, if one is due.
    pub fn next_pod(&mut self) -> Option<Pod> {
        loop {
            let key = self.queue.try_get()?;
            // Binding runs on its own task and reports back through `bound`/`bind_failed`:
            // the key is not held while it runs, so an update of the pod queues it at once.
            self.queue.done(&key);
            if let Some(pod) = self.pending.get(&key) {
                return Some(pod.clone());
            }
        }
    }

    /// When the next delayed pod becomes due.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queue.next_deadline()
    }

    /// Filters and scores the nodes for `pod`; a chosen node is assumed at once.
    pub fn schedule(&mut self, pod: &Pod) -> Decision {
        let requests = pod_requests(pod);
        let all = self.order.len();
        let wanted = num_feasible_nodes_to_find(all);
        let mut unfits: Vec<Unfit> = Vec::new();
        let mut best: Option<(i64, usize)> = None;
        let mut feasible = 0;
        let mut processed = 0;
        for i in 0..all {
            let idx = (self.next_start + i) % all;
            let facts = &self.nodes[&self.order[idx]];
            processed += 1;
            match facts.filter(pod, &requests) {
                Ok(()) => {
                    feasible += 1;
                    let score = facts.score(&requests);
                    if best.is_none_or(|(s, _)| score > s) {
                        best = Some((score, idx));
                    }
                    if feasible >= wanted {
                        break;
                    }
                }
                Err(u) => unfits.push(u),
            }
        }
        if all > 0 {
            self.next_start = (self.next_start + processed) % all;
        }
        match best {
            Some((_, idx)) => {
                let node = self.order[idx].clone();
                self.assume(pod, &node, requests);
                Decision::Bind(node)
            }
            None => {
                let key = pod_key(pod);
                self.unschedulable.insert(key, Instant::now());
                Decision::Unschedulable(fit_error_message(all, &unfits))
            }
        }
    }

    fn assume(&mut self, pod: &Pod, node: &str, requests: Resources) {
        self.pending.remove(&pod_key(pod));
        let uid = pod.uid().unwrap_or_default();
        self.release(&uid);
        self.charge(node, &requests, true);
        self.bound.insert(uid, (node.to_owned(), requests));
    }

    /// A bind succeeded: the pod's backoff is forgotten.
    pub fn bound(&mut self, pod: &Pod) {
        self.queue.forget(&pod_key(pod));
    }

    /// A bind failed: the assumed pod is released and, unless `gone`, queued again after
    /// its backoff.
    pub fn bind_failed(&mut self, pod: Pod, gone: bool) {
        self.release(&pod.uid().unwrap_or_default());
        if !gone {
            let key = pod_key(&pod);
            self.pending.insert(key.clone(), pod);
            self.queue.add_rate_limited(key);
        }
    }
}

/// Events and status writes, done off the scheduling loop.
#[derive(Debug)]
enum Note {
    Scheduled {
        reference: ObjectReference,
        message: String,
    },
    Failed {
        reference: ObjectReference,
        message: String,
    },
}

/// The scheduler controller.
pub struct Scheduler {
    client: Client,
    config: SchedulerConfig,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The outcome of one bind.
struct BindResult {
    pod: Pod,
    node: String,
    result: Result<(), kube::Error>,
}

async fn bind(client: Client, pod: Pod, node: String) -> BindResult {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client, &ns);
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": ns, "uid": pod.uid()},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    let result = api
        .create_subresource::<_, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ());
    BindResult { pod, node, result }
}

async fn record(client: &Client, recorder: &Recorder, clock: WallClock, note: Note) {
    let (reference, event) = match note {
        Note::Scheduled { reference, message } => (
            reference,
            KubeEvent {
                type_: EventType::Normal,
                reason: "Scheduled".into(),
                note: Some(message),
                action: "Binding".into(),
                secondary: None,
            },
        ),
        Note::Failed { reference, message } => {
            // The pod condition kube-scheduler writes next to its event.
            let api: Api<Pod> =
                Api::namespaced(client.clone(), reference.namespace.as_deref().unwrap_or(""));
            let status = json!({"status": {"conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message, "lastProbeTime": null,
                "lastTransitionTime": clock.now().to_string(),
            }]}});
            let name = reference.name.clone().unwrap_or_default();
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
                .await
            {
                debug!(pod = %name, error = %e, "could not set PodScheduled=False");
            }
            (
                reference,
                KubeEvent {
                    type_: EventType::Warning,
                    reason: "FailedScheduling".into(),
                    note: Some(message),
                    action: "Scheduling".into(),
                    secondary: None,
                },
            )
        }
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        warn!(error = %e, "could not record event");
    }
}

impl Scheduler {
    /// A scheduler talking to the API server through `client`.
    pub fn new(client: Client, config: SchedulerConfig) -> Self {
        Self { client, config }
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
        let mut nodes = std::pin::pin!(nodes);
        let mut pods = std::pin::pin!(pods);
        let recorder = Recorder::new(
            self.client.clone(),
            Reporter {
                controller: self.config.scheduler_name.clone(),
                instance: None,
            },
        );
        let (note_tx, note_rx) = mpsc::unbounded_channel::<Note>();
        let client = self.client.clone();
        let clock = WallClock::new();
        let notes =
            futures::stream::unfold(
                note_rx,
                |mut rx| async move { rx.recv().await.map(|n| (n, rx)) },
            )
            .for_each_concurrent(NOTE_WORKERS, move |note| {
                let (client, recorder) = (client.clone(), recorder.clone());
                async move { record(&client, &recorder, clock, note).await }
            });
        let mut notes = std::pin::pin!(notes);

        let mut core = SchedulerCore::new(&self.config);
        let mut inflight: JoinSet<BindResult> = JoinSet::new();
        // Relists: what the watch showed since its last Init, to drop what vanished.
        let mut node_seen: Option<HashSet<String>> = None;
        let mut pod_seen: Option<Vec<Pod>> = None;
        let (mut nodes_synced, mut pods_synced) = (false, false);
        let mut flush = tokio::time::interval(Duration::from_secs(30));
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Schedule what is due (only once both caches are complete).
            while nodes_synced && pods_synced && inflight.len() < MAX_INFLIGHT_BINDS {
                let Some(pod) = core.next_pod() else { break };
                let key = pod_key(&pod);
                let span = info_span!("schedule", pod = %key);
                let _g = span.enter();
                let reference = pod.object_ref(&());
                match core.schedule(&pod) {
                    Decision::Bind(node) => {
                        debug!(%node, "binding");
                        inflight
                            .spawn(bind(self.client.clone(), pod, node).instrument(span.clone()));
                    }
                    Decision::Unschedulable(message) => {
                        debug!(%message, "unschedulable");
                        let _ = note_tx.send(Note::Failed { reference, message });
                    }
                }
            }
            let deadline = core.next_deadline();
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = &mut notes => return,
                Some(done) = inflight.join_next() => {
                    let Ok(BindResult { pod, node, result }) = done else { continue };
                    let key = pod_key(&pod);
                    match result {
                        Ok(()) => {
                            core.bound(&pod);
                            let _ = note_tx.send(Note::Scheduled {
                                reference: pod.object_ref(&()),
                                message: format!("Successfully assigned {key} to {node}"),
                            });
                        }
                        Err(e) => {
                            let gone = matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409);
                            warn!(pod = %key, %node, error = %e, "bind failed");
                            core.bind_failed(pod, gone);
                        }
                    }
                }
                Some(ev) = nodes.next() => match ev {
                    Ok(watcher::Event::Init) => node_seen = Some(HashSet::new()),
                    Ok(watcher::Event::InitApply(n)) => {
                        if let Some(seen) = node_seen.as_mut() {
                            seen.insert(n.name_any());
                        }
                        core.node_applied(n);
                    }
                    Ok(watcher::Event::InitDone) => {
                        if let Some(seen) = node_seen.take() {
                            let gone: Vec<String> =
                                core.node_names().filter(|n| !seen.contains(*n)).cloned().collect();
                            for n in gone {
                                core.node_deleted(&n);
                            }
                        }
                        nodes_synced = true;
                    }
                    Ok(watcher::Event::Apply(n)) => core.node_applied(n),
                    Ok(watcher::Event::Delete(n)) => core.node_deleted(&n.name_any()),
                    Err(e) => warn!(error = %e, "node watch error"),
                },
                Some(ev) = pods.next() => match ev {
                    Ok(watcher::Event::Init) => pod_seen = Some(Vec::new()),
                    Ok(watcher::Event::InitApply(p)) => match pod_seen.as_mut() {
                        Some(seen) => seen.push(p),
                        None => core.pod_applied(p),
                    },
                    Ok(watcher::Event::InitDone) => {
                        if let Some(seen) = pod_seen.take() {
                            // A relist: rebuild the pod side of the cache from it.
                            let mut fresh = SchedulerCore::new(&self.config);
                            std::mem::swap(&mut fresh.nodes, &mut core.nodes);
                            std::mem::swap(&mut fresh.order, &mut core.order);
                            for facts in fresh.nodes.values_mut() {
                                facts.requested = Resources::default();
                            }
                            core = fresh;
                            for p in seen {
                                core.pod_applied(p);
                            }
                        }
                        pods_synced = true;
                    }
                    Ok(watcher::Event::Apply(p)) => core.pod_applied(p),
                    Ok(watcher::Event::Delete(p)) => core.pod_deleted(&p),
                    Err(e) => warn!(error = %e, "pod watch error"),
                },
                _ = flush.tick() => core.flush_unschedulable(self.config.max_in_unschedulable),
                _ = sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, cpu: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name},
            "status": {"allocatable": {"cpu": cpu, "memory": "4Gi", "pods": "110"}}}))
        .unwrap()
    }

    fn pod(name: &str, cpu: &str) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"schedulerName": "default-scheduler",
                "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]}}),
        )
        .unwrap()
    }

    /// Upstream `numFeasibleNodesToFind`: all nodes under 100, then 50 % minus 1 % per 125
    /// nodes, at least 5 % and at least 100 nodes.
    #[test]
    fn feasible_nodes_to_find() {
        assert_eq!(num_feasible_nodes_to_find(50), 50);
        assert_eq!(num_feasible_nodes_to_find(100), 100);
        assert_eq!(num_feasible_nodes_to_find(1000), 420);
        assert_eq!(num_feasible_nodes_to_find(5000), 500);
        assert_eq!(num_feasible_nodes_to_find(10_000), 500);
    }

    /// `LeastAllocated` with upstream's non-zero defaults: pods without requests spread
    /// over equal nodes instead of piling onto the first.
    #[tokio::test(start_paused = true)]
    async fn best_effort_pods_spread() {
        let mut core = SchedulerCore::new(&SchedulerConfig::default());
        for n in ["a", "b", "c"] {
            core.node_applied(node(n, "4"));
        }
        for i in 0..6 {
            let mut p = pod(&format!("p{i}"), "0");
            p.spec.as_mut().unwrap().containers[0].resources = None;
            core.pod_applied(p);
        }
        let mut per_node = std::collections::HashMap::new();
        while let Some(p) = core.next_pod() {
            let Decision::Bind(n) = core.schedule(&p) else {
                panic!("unschedulable")
            };
            *per_node.entry(n).or_insert(0) += 1;
        }
        assert_eq!(per_node.values().copied().collect::<Vec<_>>(), [2, 2, 2]);
    }

    /// Upstream's assume-then-bind: a chosen node is charged at once, so the next pod sees
    /// it fuller; a failed bind releases it; a deleted bound pod frees its node and retries
    /// the unschedulable pods.
    #[tokio::test(start_paused = true)]
    async fn assume_release_and_retry() {
        let mut core = SchedulerCore::new(&SchedulerConfig::default());
        core.node_applied(node("a", "1"));
        core.node_applied(node("b", "1"));
        for p in ["p1", "p2", "p3"] {
            core.pod_applied(pod(p, "800m"));
        }
        let mut placed = Vec::new();
        while let Some(p) = core.next_pod() {
            placed.push(core.schedule(&p));
        }
        assert_eq!(placed[0], Decision::Bind("a".into()));
        assert_eq!(
            placed[1],
            Decision::Bind("b".into()),
            "a is full after p1 is assumed"
        );
        assert_eq!(
            placed[2],
            Decision::Unschedulable("0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.".into())
        );
        // p1's bind fails: a is free again, and p1 waits for its backoff (1 s).
        core.bind_failed(pod("p1", "800m"), false);
        assert!(core.next_pod().is_none());
        // p2 (on b) is deleted: p3 gets another chance after its backoff.
        let mut p2 = pod("p2", "800m");
        p2.spec.as_mut().unwrap().node_name = Some("b".into());
        core.pod_deleted(&p2);
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut retried = Vec::new();
        while let Some(p) = core.next_pod() {
            retried.push((p.name_any(), core.schedule(&p)));
        }
        retried.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(
            matches!(&retried[..], [(a, Decision::Bind(_)), (b, Decision::Bind(_))] if a == "p1" && b == "p3")
        );
    }
}
