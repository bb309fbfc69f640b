//! The node lifecycle controller (upstream `pkg/controller/nodelifecycle`), as a kube-rs
//! client of the API server.
//!
//! Every `node_monitor_period` one monitor pass runs over the Nodes and node Leases held in
//! memory by two reflectors (never a LIST per pass):
//!
//! - heartbeats are the Ready condition's `lastHeartbeatTime` and the Lease's `renewTime`;
//!   a change is stamped with the controller's own tokio clock (upstream's
//!   `probeTimestamp`), server timestamps are only compared with each other;
//! - a node silent for longer than the grace period gets Ready, MemoryPressure,
//!   DiskPressure and PIDPressure set to Unknown (`NodeStatusUnknown`);
//! - zones (region + zone labels) get a state (Initial, Normal, PartialDisruption,
//!   FullDisruption) and a rate-limited queue that applies the NoExecute `not-ready` /
//!   `unreachable` taints; when every zone is fully disrupted nothing is tainted;
//! - pods of a node whose Ready condition leaves True get their Ready condition set to False.
//!
//! The NoSchedule taints that mirror node conditions and `spec.unschedulable` follow every
//! Node watch event (upstream `doNoScheduleTaintingPass`).
//!
//! The pure part of a pass ([`MonitorCore::monitor_pass`]) only decides; the writes it
//! decides are then spread over [`NODE_UPDATE_WORKERS`] concurrent workers.

use crate::clock::WallClock;
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, NodeCondition, ObjectReference, Pod, Taint},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use parking_lot::Mutex;
use serde_json::json;
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

/// Taint key for a node whose Ready condition is False.
pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint key for a node whose Ready condition is Unknown.
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint key for a cordoned node (`spec.unschedulable`).
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// Taint key for MemoryPressure=True.
pub const TAINT_MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
/// Taint key for DiskPressure=True.
pub const TAINT_DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
/// Taint key for PIDPressure=True.
pub const TAINT_PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";
/// Taint key for NetworkUnavailable=True.
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";
/// Label that leaves a node out of the zone statistics.
pub const LABEL_EXCLUDE_DISRUPTION: &str = "node.kubernetes.io/exclude-disruption";
/// Namespace of the node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Workers that carry out the writes of one monitor pass and of the NoSchedule pass
/// (upstream `nodeUpdateWorkerSize`).
pub const NODE_UPDATE_WORKERS: usize = 8;
/// How often the rate-limited NoExecute tainting pass runs (upstream `NodeEvictionPeriod`).
pub const NODE_EVICTION_PERIOD: Duration = Duration::from_millis(100);
/// Pause between retries of a failed node status update (upstream `retrySleepTime`).
const RETRY_SLEEP: Duration = Duration::from_millis(20);
/// Tries of a node status update (upstream `NodeHealthUpdateRetry`).
const NODE_HEALTH_UPDATE_RETRY: usize = 5;
/// Delay before a queued node without Ready condition is looked at again.
const NO_READY_CONDITION_RETRY: Duration = Duration::from_millis(50);
/// Tries of a taint patch that meets conflicts.
const TAINT_UPDATE_RETRY: usize = 5;

const ZONE_LABEL_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const REGION_LABEL_BETA: &str = "failure-domain.beta.kubernetes.io/region";
const REGION_LABEL: &str = "topology.kubernetes.io/region";

const CONTROLLER_NAME: &str = "node-controller";

/// Configuration, with upstream's flag names and defaults for Kubernetes 1.33.
#[derive(Debug, Clone)]
pub struct NodeLifecycleConfig {
    /// `--node-monitor-period`: how often node health is checked (5 s).
    pub node_monitor_period: Duration,
    /// `--node-monitor-grace-period`: silence after which a node is Unknown (50 s since
    /// v1.32).
    pub node_monitor_grace_period: Duration,
    /// `--node-startup-grace-period`: the same for a node that never posted Ready (60 s).
    pub node_startup_grace_period: Duration,
    /// `--unhealthy-zone-threshold`: fraction of not-Ready nodes (more than 2) that puts a
    /// zone in partial disruption (0.55).
    pub unhealthy_zone_threshold: f64,
    /// `--large-cluster-size-threshold`: zones with more nodes than this keep tainting at
    /// the secondary rate in partial disruption; smaller ones stop (50).
    pub large_cluster_size_threshold: usize,
    /// `--node-eviction-rate`: NoExecute taints per second per zone (0.1).
    pub node_eviction_rate: f64,
    /// `--secondary-node-eviction-rate`: the rate in partial disruption of a large zone
    /// (0.01).
    pub secondary_node_eviction_rate: f64,
}

impl Default for NodeLifecycleConfig {
    fn default() -> Self {
        Self {
            node_monitor_period: Duration::from_secs(5),
            node_monitor_grace_period: Duration::from_secs(50),
            node_startup_grace_period: Duration::from_secs(60),
            unhealthy_zone_threshold: 0.55,
            large_cluster_size_threshold: 50,
            node_eviction_rate: 0.1,
            secondary_node_eviction_rate: 0.01,
        }
    }
}

/// Errors of the node lifecycle controller.
#[derive(Debug, thiserror::Error)]
pub enum NodeLifecycleError {
    /// A request to the API server failed.
    #[error("API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// A reflector ended before its first list completed.
    #[error("the {0} cache never synced")]
    CacheNotSynced(&'static str),
}

/// Health of a zone (upstream `ZoneState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneState {
    /// Seen for the first time in this pass.
    Initial,
    /// Healthy enough: NoExecute taints at `node_eviction_rate`.
    Normal,
    /// More than 2 and at least `unhealthy_zone_threshold` of the nodes are not Ready.
    PartialDisruption,
    /// No node is Ready.
    FullDisruption,
}

/// The zone key of a node: `region + ":\0:" + zone` (beta labels preferred), `""` when the
/// node has neither label (upstream `GetZoneKey`).
pub fn zone_key(node: &Node) -> String {
    let labels = node.labels();
    let get = |beta: &str, ga: &str| {
        labels
            .get(beta)
            .filter(|v| !v.is_empty())
            .or_else(|| labels.get(ga))
            .map(String::as_str)
            .unwrap_or("")
    };
    let zone = get(ZONE_LABEL_BETA, ZONE_LABEL);
    let region = get(REGION_LABEL_BETA, REGION_LABEL);
    if zone.is_empty() && region.is_empty() {
        return String::new();
    }
    format!("{region}:\x00:{zone}")
}

/// The state of a zone from its nodes' Ready statuses (`None`: no Ready condition, counted
/// as not Ready). Returns the number of not-Ready nodes and the state
/// (upstream `ComputeZoneState`).
pub fn compute_zone_state(ready: &[Option<ReadyStatus>], threshold: f64) -> (usize, ZoneState) {
    let ready_nodes = ready
        .iter()
        .filter(|s| **s == Some(ReadyStatus::True))
        .count();
    let not_ready = ready.len() - ready_nodes;
    let state = if ready_nodes == 0 && not_ready > 0 {
        ZoneState::FullDisruption
    } else if not_ready > 2 && not_ready as f64 / ready.len() as f64 >= threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    };
    (not_ready, state)
}

/// The status of a Ready condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown` (or any other value).
    Unknown,
}

impl ReadyStatus {
    fn parse(s: &str) -> Self {
        match s {
            "True" => Self::True,
            "False" => Self::False,
            _ => Self::Unknown,
        }
    }
}

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        ..Taint::default()
    }
}

fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == effect))
}

/// A token bucket with burst 1 (upstream `NewTokenBucketRateLimiter(qps, 1)`), or "never"
/// when the rate is 0.
#[derive(Debug, Clone)]
struct TokenBucket {
    qps: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(qps: f64, now: Instant) -> Self {
        Self {
            qps,
            tokens: 1.0,
            last: now,
        }
    }

    fn try_accept(&mut self, now: Instant) -> bool {
        if self.qps <= 0.0 {
            return false;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(1.0);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Upstream `SwapLimiter`: nothing when unchanged; a new bucket pre-drained when the old
    /// one was out of tokens.
    fn swap(&mut self, qps: f64, now: Instant) {
        if self.qps == qps {
            return;
        }
        let mut new = TokenBucket::new(qps, now);
        if qps > 0.0 && !self.try_accept(now) {
            new.try_accept(now);
        }
        *self = new;
    }
}

/// A zone's queue of nodes waiting for a NoExecute taint (upstream
/// `RateLimitedTimedQueue` over a `UniqueQueue`): a name stays in `set` after it was
/// processed, until `remove`, so it is not queued again meanwhile.
#[derive(Debug)]
struct ZoneTainter {
    limiter: TokenBucket,
    queue: BTreeMap<(Instant, u64), String>,
    position: HashMap<String, (Instant, u64)>,
    set: HashSet<String>,
    seq: u64,
}

impl ZoneTainter {
    fn new(qps: f64, now: Instant) -> Self {
        Self {
            limiter: TokenBucket::new(qps, now),
            queue: BTreeMap::new(),
            position: HashMap::new(),
            set: HashSet::new(),
            seq: 0,
        }
    }

    fn push(&mut self, name: &str, at: Instant) {
        self.seq += 1;
        let key = (at, self.seq);
        if let Some(old) = self.position.insert(name.to_string(), key) {
            self.queue.remove(&old);
        }
        self.queue.insert(key, name.to_string());
    }

    /// Upstream `Add`: queue the node unless it is already in the set.
    fn add(&mut self, name: &str, now: Instant) -> bool {
        if !self.set.insert(name.to_string()) {
            return false;
        }
        self.push(name, now);
        true
    }

    /// Upstream `Remove`: out of the queue and the set.
    fn remove(&mut self, name: &str) {
        self.set.remove(name);
        if let Some(key) = self.position.remove(name) {
            self.queue.remove(&key);
        }
    }

    fn remove_from_queue(&mut self, name: &str) {
        if let Some(key) = self.position.remove(name) {
            self.queue.remove(&key);
        }
    }

    fn head(&self) -> Option<(Instant, String)> {
        self.queue
            .iter()
            .next()
            .map(|((at, _), n)| (*at, n.clone()))
    }
}

/// What the controller remembers of one node (upstream `nodeHealthData`).
#[derive(Debug, Clone)]
struct NodeHealth {
    /// When (controller clock) the last heartbeat was observed.
    probe: Instant,
    /// When (controller clock) the last Ready transition was observed.
    ready_transition: Instant,
    /// The saved Ready condition's heartbeat and transition times, if it had one.
    saved_ready: Option<(Option<Time>, Option<Time>)>,
    /// The saved Lease renew time.
    lease_renew: Option<MicroTime>,
    /// The last cached node object seen, with its zone key and exclusion label: the
    /// reflector keeps the same `Arc` until the node changes, so these are recomputed only
    /// then (fewer pointer chases per node and pass).
    view: Option<(Arc<Node>, Arc<str>, bool)>,
}

/// One write decided by a monitor pass, carried out by a worker.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum NodeAction {
    /// Event `RegisteredNode`.
    Registered,
    /// Event `RemovingNode`.
    Removing,
    /// PUT `nodes/<n>/status` with these conditions.
    UpdateStatus(Vec<NodeCondition>),
    /// Event `NodeNotReady` on the node.
    NodeNotReadyEvent,
    /// Set the Ready condition of the node's pods to False.
    MarkPodsNotReady,
    /// Add and remove taints (matched on key and effect).
    SwapTaints {
        /// Taints to add.
        add: Vec<Taint>,
        /// Taints to remove.
        remove: Vec<Taint>,
    },
}

/// The writes for one node, carried out in order.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct NodePlan {
    /// Node name.
    pub name: String,
    /// The node as cached when the pass decided (absent for a removed node).
    pub node: Option<Arc<Node>>,
    /// The writes, in order.
    pub actions: Vec<NodeAction>,
}

/// The outcome of one monitor pass: what to write.
#[doc(hidden)]
#[derive(Debug, Default)]
pub struct PassPlan {
    /// Per-node writes.
    pub nodes: Vec<NodePlan>,
}

/// A NoExecute taint decided by the rate-limited tainting pass.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct TaintDecision {
    /// Zone key.
    pub zone: String,
    /// The node as cached.
    pub node: Arc<Node>,
    /// Taint to add.
    pub add: Taint,
    /// Taint to remove.
    pub remove: Taint,
}

/// What [`MonitorCore::update_health`] found for one node.
struct HealthUpdate {
    /// Ready before the update (`None`: never posted).
    observed: Option<ReadyStatus>,
    /// Ready after the update.
    current: Option<ReadyStatus>,
    /// The conditions to PUT when Ready changed.
    conditions: Option<Vec<NodeCondition>>,
    zone: Arc<str>,
    excluded: bool,
}

/// The in-memory state and decisions of the controller, with no I/O: health map, zone
/// states, zone queues. Public only for the benchmark.
#[doc(hidden)]
#[derive(Debug)]
pub struct MonitorCore {
    config: NodeLifecycleConfig,
    health: HashMap<String, NodeHealth>,
    known: HashSet<String>,
    zone_states: HashMap<String, ZoneState>,
    tainters: HashMap<String, ZoneTainter>,
    nodes_to_retry: HashSet<String>,
}

fn plan_for<'a>(
    plans: &'a mut Vec<NodePlan>,
    index: &mut HashMap<String, usize>,
    name: &str,
    node: Option<&Arc<Node>>,
) -> &'a mut NodePlan {
    let i = *index.entry(name.to_string()).or_insert_with(|| {
        plans.push(NodePlan {
            name: name.to_string(),
            node: node.cloned(),
            actions: Vec::new(),
        });
        plans.len() - 1
    });
    &mut plans[i]
}

impl MonitorCore {
    /// An empty state.
    pub fn new(config: NodeLifecycleConfig) -> Self {
        Self {
            config,
            health: HashMap::new(),
            known: HashSet::new(),
            zone_states: HashMap::new(),
            tainters: HashMap::new(),
            nodes_to_retry: HashSet::new(),
        }
    }

    /// The current state of a zone.
    pub fn zone_state(&self, zone: &str) -> Option<ZoneState> {
        self.zone_states.get(zone).copied()
    }

    /// Nodes waiting in a zone's NoExecute queue.
    pub fn queued(&self, zone: &str) -> usize {
        self.tainters.get(zone).map_or(0, |t| t.queue.len())
    }

    fn tainter(&mut self, zone: &str, now: Instant) -> &mut ZoneTainter {
        let qps = self.config.node_eviction_rate;
        if !self.tainters.contains_key(zone) {
            self.tainters
                .insert(zone.to_string(), ZoneTainter::new(qps, now));
        }
        self.tainters.get_mut(zone).expect("inserted above")
    }

    /// Upstream `markNodeAsReachable`: remove both NoExecute taints, dequeue.
    fn mark_reachable(&mut self, node: &Node, zone: &str, now: Instant) -> Option<NodeAction> {
        self.tainter(zone, now)
            .remove(node.metadata.name.as_deref().unwrap_or_default());
        let remove: Vec<Taint> = [TAINT_UNREACHABLE, TAINT_NOT_READY]
            .into_iter()
            .filter(|k| has_taint(node, k, "NoExecute"))
            .map(|k| taint(k, "NoExecute"))
            .collect();
        (!remove.is_empty()).then_some(NodeAction::SwapTaints {
            add: Vec::new(),
            remove,
        })
    }

    /// Upstream `tryUpdateNodeHealth` without the write: updates the health entry and
    /// returns (observed Ready, current Ready after the update, new conditions to PUT).
    fn update_health(
        &mut self,
        node: &Arc<Node>,
        lease: Option<&Lease>,
        now: Instant,
        wall: Timestamp,
    ) -> HealthUpdate {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let ready = condition(node, "Ready");
        let grace;
        let observed;
        let entry = match ready {
            None => {
                // Never posted: a fake Unknown observation and the startup grace. Upstream
                // counts it from creationTimestamp; we count from our first sight of the
                // node on our own clock (a server timestamp is never compared with ours).
                grace = self.config.node_startup_grace_period;
                observed = None;
                let e = self.health.entry(name.to_string()).or_insert(NodeHealth {
                    probe: now,
                    ready_transition: now,
                    saved_ready: None,
                    lease_renew: None,
                    view: None,
                });
                if e.saved_ready.is_some() {
                    // Ready removed: treat as new.
                    e.probe = now;
                    e.ready_transition = now;
                    e.saved_ready = None;
                }
                e
            }
            Some(c) => {
                grace = self.config.node_monitor_grace_period;
                observed = Some(ReadyStatus::parse(&c.status));
                let times = (
                    c.last_heartbeat_time.clone(),
                    c.last_transition_time.clone(),
                );
                match self.health.get_mut(name) {
                    None => self.health.entry(name.to_string()).or_insert(NodeHealth {
                        probe: now,
                        ready_transition: now,
                        saved_ready: Some(times),
                        lease_renew: None,
                        view: None,
                    }),
                    Some(e) => {
                        match &e.saved_ready {
                            None => {
                                e.probe = now;
                                e.ready_transition = now;
                                e.saved_ready = Some(times);
                            }
                            Some((hb, tr)) if *hb != times.0 => {
                                e.probe = now;
                                if *tr != times.1 {
                                    e.ready_transition = now;
                                }
                                e.saved_ready = Some(times);
                            }
                            Some(_) => {}
                        }
                        e
                    }
                }
            }
        };
        let (zone, excluded) = match &entry.view {
            Some((seen, zone, excluded)) if Arc::ptr_eq(seen, node) => (zone.clone(), *excluded),
            _ => {
                let zone: Arc<str> = zone_key(node).into();
                let excluded = node.labels().contains_key(LABEL_EXCLUDE_DISRUPTION);
                entry.view = Some((node.clone(), zone.clone(), excluded));
                (zone, excluded)
            }
        };
        if let Some(renew) = lease.and_then(|l| l.spec.as_ref()?.renew_time.as_ref())
            && entry
                .lease_renew
                .as_ref()
                .is_none_or(|saved| saved.0 < renew.0)
        {
            entry.lease_renew = Some(renew.clone());
            entry.probe = now;
        }
        if now <= entry.probe + grace {
            return HealthUpdate {
                observed,
                current: observed,
                conditions: None,
                zone,
                excluded,
            };
        }
        // Stale: Ready, MemoryPressure, DiskPressure, PIDPressure to Unknown.
        let mut conditions = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let wall = Time(wall);
        for type_ in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
            match conditions.iter_mut().find(|c| c.type_ == type_) {
                None => conditions.push(NodeCondition {
                    type_: type_.into(),
                    status: "Unknown".into(),
                    reason: Some("NodeStatusNeverUpdated".into()),
                    message: Some("Kubelet never posted node status.".into()),
                    last_heartbeat_time: node.metadata.creation_timestamp.clone(),
                    last_transition_time: Some(wall.clone()),
                }),
                Some(c) if c.status != "Unknown" => {
                    c.status = "Unknown".into();
                    c.reason = Some("NodeStatusUnknown".into());
                    c.message = Some("Kubelet stopped posting node status.".into());
                    c.last_transition_time = Some(wall.clone());
                }
                Some(_) => {}
            }
        }
        let new_ready = conditions.iter().find(|c| c.type_ == "Ready");
        let current = new_ready.map(|c| ReadyStatus::parse(&c.status));
        let conditions = (new_ready != ready).then_some(conditions);
        if conditions.is_some() {
            entry.ready_transition = now;
        }
        HealthUpdate {
            observed,
            current,
            conditions,
            zone,
            excluded,
        }
    }

    /// One monitor pass over the cached nodes (upstream `monitorNodeHealth` +
    /// `handleDisruption`), deciding the writes. `lease` looks a node's Lease up; `now` is
    /// the controller clock, `wall` the time written into conditions.
    pub fn monitor_pass(
        &mut self,
        nodes: &[Arc<Node>],
        lease: &dyn Fn(&str) -> Option<Arc<Lease>>,
        now: Instant,
        wall: Timestamp,
    ) -> PassPlan {
        let mut plans: Vec<NodePlan> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();

        // classifyNodes: added and deleted.
        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            if !self.known.contains(name) {
                let zone = zone_key(node);
                let reach = self.mark_reachable(node, &zone, now);
                let plan = plan_for(&mut plans, &mut index, name, Some(node));
                plan.actions.push(NodeAction::Registered);
                plan.actions.extend(reach);
                self.known.insert(name.to_string());
            }
        }
        // Every present node is known now, so some known node is gone only when there are
        // more known nodes than present ones (the set of names is built only then).
        let deleted: Vec<String> = if self.known.len() > nodes.len() {
            let seen: HashSet<&str> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            self.known
                .iter()
                .filter(|n| !seen.contains(n.as_str()))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        for name in deleted {
            self.known.remove(&name);
            self.health.remove(&name);
            self.nodes_to_retry.remove(&name);
            plan_for(&mut plans, &mut index, &name, None)
                .actions
                .push(NodeAction::Removing);
        }

        // Per node: health, zone statistics, taint-based eviction, pods.
        let mut zone_conditions: HashMap<Arc<str>, Vec<Option<ReadyStatus>>> = HashMap::new();
        for node in nodes {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            let lease = lease(name);
            let HealthUpdate {
                observed,
                current,
                conditions: update,
                zone,
                excluded,
            } = self.update_health(node, lease.as_deref(), now, wall);
            if !excluded {
                match zone_conditions.get_mut(&zone) {
                    Some(v) => v.push(current),
                    None => {
                        zone_conditions.insert(zone.clone(), vec![current]);
                    }
                }
            }
            let mut actions = Vec::new();
            if let Some(conditions) = update {
                actions.push(NodeAction::UpdateStatus(conditions));
            }
            if let Some(current) = current {
                // The taint decision uses the observed (pre-update) Ready; a node that
                // never posted Ready is observed as Unknown.
                let observed_status = observed.unwrap_or(ReadyStatus::Unknown);
                match observed_status {
                    ReadyStatus::False | ReadyStatus::Unknown => {
                        let (want, opposite) = if observed_status == ReadyStatus::False {
                            (TAINT_NOT_READY, TAINT_UNREACHABLE)
                        } else {
                            (TAINT_UNREACHABLE, TAINT_NOT_READY)
                        };
                        if has_taint(node, opposite, "NoExecute") {
                            actions.push(NodeAction::SwapTaints {
                                add: vec![taint(want, "NoExecute")],
                                remove: vec![taint(opposite, "NoExecute")],
                            });
                        } else {
                            let tainter = self.tainter(&zone, now);
                            if !has_taint(node, want, "NoExecute") {
                                tainter.remove(name);
                            }
                            if tainter.add(name, now) {
                                debug!(node = %name, "node not ready: queued for NoExecute taint");
                            }
                        }
                    }
                    ReadyStatus::True => actions.extend(self.mark_reachable(node, &zone, now)),
                }
                // Taken out of the retry set now; a failed marking puts it back.
                let needs_retry = self.nodes_to_retry.remove(name);
                if current != ReadyStatus::True && observed == Some(ReadyStatus::True) {
                    actions.push(NodeAction::NodeNotReadyEvent);
                    actions.push(NodeAction::MarkPodsNotReady);
                } else if needs_retry && observed != Some(ReadyStatus::True) {
                    actions.push(NodeAction::MarkPodsNotReady);
                }
            }
            if !actions.is_empty() {
                plan_for(&mut plans, &mut index, name, Some(node))
                    .actions
                    .extend(actions);
            }
        }

        self.handle_disruption(&zone_conditions, nodes, now, &mut plans, &mut index);
        PassPlan { nodes: plans }
    }

    fn set_limiter(&mut self, zone: &str, size: usize, state: ZoneState, now: Instant) {
        let qps = match state {
            ZoneState::Normal | ZoneState::FullDisruption => self.config.node_eviction_rate,
            ZoneState::PartialDisruption => {
                if size > self.config.large_cluster_size_threshold {
                    self.config.secondary_node_eviction_rate
                } else {
                    0.0
                }
            }
            ZoneState::Initial => return,
        };
        self.tainter(zone, now).limiter.swap(qps, now);
    }

    fn handle_disruption(
        &mut self,
        zone_conditions: &HashMap<Arc<str>, Vec<Option<ReadyStatus>>>,
        nodes: &[Arc<Node>],
        now: Instant,
        plans: &mut Vec<NodePlan>,
        index: &mut HashMap<String, usize>,
    ) {
        let mut new_states = HashMap::new();
        let mut all_are_fully_disrupted = true;
        for (zone, conds) in zone_conditions {
            let (_, state) = compute_zone_state(conds, self.config.unhealthy_zone_threshold);
            if state != ZoneState::FullDisruption {
                all_are_fully_disrupted = false;
            }
            new_states.insert(zone.to_string(), state);
            if !self.zone_states.contains_key(&**zone) {
                self.zone_states
                    .insert(zone.to_string(), ZoneState::Initial);
                self.tainter(zone, now);
            }
        }
        self.zone_states
            .retain(|zone, _| zone_conditions.contains_key(zone.as_str()));
        let all_were_fully_disrupted = self
            .zone_states
            .values()
            .all(|s| *s == ZoneState::FullDisruption);
        if all_are_fully_disrupted && all_were_fully_disrupted {
            return;
        }
        if all_are_fully_disrupted {
            info!("all nodes are not ready: entering master disruption mode, no NoExecute taints");
            for node in nodes {
                let zone = zone_key(node);
                if let Some(action) = self.mark_reachable(node, &zone, now) {
                    plan_for(plans, index, &node.name_any(), Some(node))
                        .actions
                        .push(action);
                }
            }
            let zones: Vec<String> = self.zone_states.keys().cloned().collect();
            for zone in zones {
                self.tainter(&zone, now).limiter.swap(0.0, now);
                self.zone_states.insert(zone, ZoneState::FullDisruption);
            }
            return;
        }
        if all_were_fully_disrupted {
            info!("some nodes are ready again: leaving master disruption mode");
            for node in nodes {
                if let Some(h) = self.health.get_mut(&node.name_any()) {
                    h.probe = now;
                    h.ready_transition = now;
                }
            }
            let zones: Vec<String> = self.zone_states.keys().cloned().collect();
            for zone in zones {
                let state = new_states[&zone];
                self.set_limiter(&zone, zone_conditions[zone.as_str()].len(), state, now);
                self.zone_states.insert(zone, state);
            }
            return;
        }
        let zones: Vec<String> = self.zone_states.keys().cloned().collect();
        for zone in zones {
            let state = new_states[&zone];
            if self.zone_states[&zone] == state {
                continue;
            }
            info!(zone = %zone.replace('\0', ""), ?state, "zone changed state");
            self.set_limiter(&zone, zone_conditions[zone.as_str()].len(), state, now);
            self.zone_states.insert(zone, state);
        }
    }

    /// The rate-limited NoExecute pass (upstream `doNoExecuteTaintingPass`): for each zone,
    /// while its token bucket grants a token and the head is due, decide the taint swap.
    /// Processed nodes leave the queue (but stay in its set until dequeued by recovery).
    pub fn no_execute_pass(
        &mut self,
        node: &dyn Fn(&str) -> Option<Arc<Node>>,
        now: Instant,
    ) -> Vec<TaintDecision> {
        let mut decisions = Vec::new();
        for (zone, tainter) in &mut self.tainters {
            while let Some((at, name)) = tainter.head() {
                if !tainter.limiter.try_accept(now) || now < at {
                    break;
                }
                let Some(node) = node(&name) else {
                    tainter.remove_from_queue(&name);
                    continue;
                };
                let (add, remove) = match condition(&node, "Ready").map(|c| c.status.as_str()) {
                    None => {
                        tainter.push(&name, now + NO_READY_CONDITION_RETRY);
                        continue;
                    }
                    Some("False") => (TAINT_NOT_READY, TAINT_UNREACHABLE),
                    Some("Unknown") => (TAINT_UNREACHABLE, TAINT_NOT_READY),
                    Some(_) => {
                        tainter.remove_from_queue(&name);
                        continue;
                    }
                };
                tainter.remove_from_queue(&name);
                decisions.push(TaintDecision {
                    zone: zone.clone(),
                    node,
                    add: taint(add, "NoExecute"),
                    remove: taint(remove, "NoExecute"),
                });
            }
        }
        decisions
    }

    /// Puts a node whose taint write failed back at the head of its zone queue, unless it
    /// was dequeued meanwhile.
    fn requeue(&mut self, zone: &str, name: &str, now: Instant) {
        if let Some(t) = self.tainters.get_mut(zone)
            && t.set.contains(name)
        {
            t.push(name, now);
        }
    }
}

/// The NoSchedule taints a node should carry from its conditions and `spec.unschedulable`
/// (upstream `doNoScheduleTaintingPass`): returns (to add, to remove), considering only
/// existing NoSchedule taints with those keys.
pub fn no_schedule_taint_diff(node: &Node) -> (Vec<Taint>, Vec<Taint>) {
    const MAP: [(&str, &str, &str); 6] = [
        ("Ready", "False", TAINT_NOT_READY),
        ("Ready", "Unknown", TAINT_UNREACHABLE),
        ("MemoryPressure", "True", TAINT_MEMORY_PRESSURE),
        ("DiskPressure", "True", TAINT_DISK_PRESSURE),
        ("NetworkUnavailable", "True", TAINT_NETWORK_UNAVAILABLE),
        ("PIDPressure", "True", TAINT_PID_PRESSURE),
    ];
    let mut want: Vec<&str> = Vec::new();
    for c in node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
    {
        if let Some((_, _, key)) = MAP.iter().find(|(t, s, _)| *t == c.type_ && *s == c.status) {
            want.push(key);
        }
    }
    if node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
    {
        want.push(TAINT_UNSCHEDULABLE);
    }
    let have: Vec<&str> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|t| {
            t.effect == "NoSchedule"
                && (t.key == TAINT_UNSCHEDULABLE || MAP.iter().any(|(_, _, k)| *k == t.key))
        })
        .map(|t| t.key.as_str())
        .collect();
    let add = want
        .iter()
        .filter(|k| !have.contains(k))
        .map(|k| taint(k, "NoSchedule"))
        .collect();
    let remove = have
        .iter()
        .filter(|k| !want.contains(k))
        .map(|k| taint(k, "NoSchedule"))
        .collect();
    (add, remove)
}

/// Adds and removes taints (matched on key and effect) with a strategic merge patch that
/// carries `metadata.resourceVersion`, so a concurrent change is a 409 and a retry on a
/// fresh GET (upstream `SwapNodeControllerTaint` / `PatchNodeTaints`). The first try uses
/// the cached node. Added taints get `now` as their `timeAdded`. Returns false when the
/// node is gone.
pub async fn swap_node_taints(
    api: &Api<Node>,
    cached: Option<&Node>,
    name: &str,
    add: &[Taint],
    remove: &[Taint],
    now: Timestamp,
) -> Result<bool, kube::Error> {
    for attempt in 0..TAINT_UPDATE_RETRY {
        let node = match (attempt, cached) {
            (0, Some(n)) => n.clone(),
            _ => match api.get_opt(name).await? {
                Some(n) => n,
                None => return Ok(false),
            },
        };
        let old: Vec<Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let mut new: Vec<Taint> = old
            .iter()
            .filter(|t| {
                !remove
                    .iter()
                    .any(|r| r.key == t.key && r.effect == t.effect)
            })
            .cloned()
            .collect();
        for a in add {
            if !new.iter().any(|t| t.key == a.key && t.effect == a.effect) {
                let mut a = a.clone();
                a.time_added = Some(Time(now));
                new.push(a);
            }
        }
        if new.len() == old.len()
            && new
                .iter()
                .all(|t| old.iter().any(|o| o.key == t.key && o.effect == t.effect))
        {
            return Ok(true);
        }
        let patch = json!({
            "metadata": {"resourceVersion": node.resource_version()},
            "spec": {"taints": if new.is_empty() { serde_json::Value::Null } else { json!(new) }},
        });
        match api
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Err(kube::Error::Api(Box::new(kube::core::Status::failure(
        &format!("taints of node {name}: too many conflicts"),
        "Conflict",
    ))))
}

/// The node lifecycle controller.
pub struct NodeLifecycleController {
    client: Client,
    config: NodeLifecycleConfig,
}

/// What the workers share.
struct Shared {
    client: Client,
    nodes: Api<Node>,
    recorder: Recorder,
    core: Mutex<MonitorCore>,
    node_store: Store<Node>,
    /// The time written into conditions and taints (follows tokio's clock).
    clock: WallClock,
}

fn node_ref(node: Option<&Node>, name: &str) -> ObjectReference {
    match node {
        Some(n) => n.object_ref(&()),
        None => ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        },
    }
}

impl Shared {
    async fn event(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, reference).await {
            warn!(error = %e, reason, "could not record event");
        }
    }

    /// Carries out one node's plan; returns false when marking its pods failed.
    async fn execute(&self, plan: NodePlan) -> bool {
        let name = plan.name.as_str();
        let reference = node_ref(plan.node.as_deref(), name);
        let mut pods_ok = true;
        for action in plan.actions {
            match action {
                NodeAction::Registered => {
                    self.event(
                        &reference,
                        EventType::Normal,
                        "RegisteredNode",
                        format!("Registered Node {name} in Controller"),
                    )
                    .await
                }
                NodeAction::Removing => {
                    self.event(
                        &reference,
                        EventType::Normal,
                        "RemovingNode",
                        format!("Removing Node {name} from Controller"),
                    )
                    .await
                }
                NodeAction::UpdateStatus(conditions) => {
                    if let Some(node) = &plan.node
                        && let Err(e) = self.update_status(node, conditions).await
                    {
                        warn!(error = %e, "node health update failed; skipping this pass");
                        return pods_ok;
                    }
                }
                NodeAction::NodeNotReadyEvent => {
                    self.event(
                        &reference,
                        EventType::Normal,
                        "NodeNotReady",
                        format!("Node {name} status is now: NodeNotReady"),
                    )
                    .await
                }
                NodeAction::MarkPodsNotReady => {
                    if let Err(e) = self.mark_pods_not_ready(name).await {
                        warn!(error = %e, "marking pods not ready failed; will retry");
                        pods_ok = false;
                    }
                }
                NodeAction::SwapTaints { add, remove } => {
                    if let Err(e) = swap_node_taints(
                        &self.nodes,
                        plan.node.as_deref(),
                        name,
                        &add,
                        &remove,
                        self.clock.now(),
                    )
                    .await
                    {
                        warn!(error = %e, "taint update failed");
                    }
                }
            }
        }
        pods_ok
    }

    /// PUT `nodes/<n>/status`; on failure re-GET and re-apply the Unknown conditions, every
    /// 20 ms, up to 5 tries, unless the kubelet posted a new heartbeat meanwhile.
    async fn update_status(
        &self,
        node: &Node,
        conditions: Vec<NodeCondition>,
    ) -> Result<(), kube::Error> {
        let name = node.name_any();
        let heartbeat = condition(node, "Ready").and_then(|c| c.last_heartbeat_time.clone());
        let mut current = node.clone();
        let mut result = Ok(());
        for attempt in 0..NODE_HEALTH_UPDATE_RETRY {
            if attempt > 0 {
                tokio::time::sleep(RETRY_SLEEP).await;
                match self.nodes.get_opt(&name).await? {
                    None => return Ok(()),
                    Some(fresh) => {
                        if condition(&fresh, "Ready").and_then(|c| c.last_heartbeat_time.clone())
                            != heartbeat
                        {
                            return Ok(());
                        }
                        current = fresh;
                    }
                }
            }
            let mut updated = current.clone();
            let status = updated.status.get_or_insert_with(Default::default);
            let mut merged = status.conditions.clone().unwrap_or_default();
            for c in &conditions {
                match merged.iter_mut().find(|m| m.type_ == c.type_) {
                    Some(m) => *m = c.clone(),
                    None => merged.push(c.clone()),
                }
            }
            status.conditions = Some(merged);
            match self
                .nodes
                .replace_status(&name, &PostParams::default(), &updated)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => result = Err(e),
            }
        }
        result
    }

    /// Upstream `MarkPodsNotReady`: each pod on the node with a Ready condition not yet
    /// False gets it set to False (PUT `pods/<p>/status`) and a Warning `NodeNotReady`.
    async fn mark_pods_not_ready(&self, node: &str) -> Result<(), kube::Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let list = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await?;
        let mut failed = None;
        for mut pod in list.items {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
                continue;
            }
            let Some(cond) = pod
                .status
                .as_mut()
                .and_then(|s| s.conditions.as_mut())
                .and_then(|cs| cs.iter_mut().find(|c| c.type_ == "Ready"))
            else {
                continue;
            };
            if cond.status == "False" {
                continue;
            }
            cond.status = "False".into();
            cond.last_transition_time = Some(Time(self.clock.now()));
            let ns = pod.namespace().unwrap_or_default();
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            match api
                .replace_status(&pod.name_any(), &PostParams::default(), &pod)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => continue,
                Err(e) => {
                    failed = Some(e);
                    continue;
                }
            }
            self.event(
                &pod.object_ref(&()),
                EventType::Warning,
                "NodeNotReady",
                "Node is not ready".into(),
            )
            .await;
        }
        failed.map_or(Ok(()), Err)
    }

    /// One monitor pass: decide under the lock, write with bounded concurrency.
    async fn monitor_pass(&self, leases: &Store<Lease>) {
        let nodes = self.node_store.state();
        let plan = {
            let lookup =
                |name: &str| leases.get(&ObjectRef::new(name).within(NODE_LEASE_NAMESPACE));
            self.core
                .lock()
                .monitor_pass(&nodes, &lookup, Instant::now(), self.clock.now())
        };
        let failed: Vec<String> = stream::iter(plan.nodes)
            .map(|p| {
                let span = info_span!("node_lifecycle", node = %p.name);
                let name = p.name.clone();
                async move { (!self.execute(p).await).then_some(name) }.instrument(span)
            })
            .buffer_unordered(NODE_UPDATE_WORKERS)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        self.core.lock().nodes_to_retry.extend(failed);
    }

    async fn no_execute_pass(&self) {
        let decisions = {
            let lookup = |name: &str| self.node_store.get(&ObjectRef::new(name));
            self.core.lock().no_execute_pass(&lookup, Instant::now())
        };
        let results: Vec<(TaintDecision, bool)> = stream::iter(decisions)
            .map(|d| async move {
                let name = d.node.name_any();
                let ok = swap_node_taints(
                    &self.nodes,
                    Some(&d.node),
                    &name,
                    std::slice::from_ref(&d.add),
                    std::slice::from_ref(&d.remove),
                    self.clock.now(),
                )
                .instrument(info_span!("node_lifecycle", node = %name))
                .await;
                if let Err(e) = &ok {
                    warn!(node = %name, error = %e, "NoExecute taint failed; requeued");
                } else {
                    info!(node = %name, taint = %d.add.key, "NoExecute taint applied");
                }
                (d, ok.is_ok())
            })
            .buffer_unordered(NODE_UPDATE_WORKERS)
            .collect()
            .await;
        let mut core = self.core.lock();
        for (d, ok) in results {
            if !ok {
                core.requeue(&d.zone, &d.node.name_any(), Instant::now());
            }
        }
    }

    async fn no_schedule_pass(&self, name: String) {
        let Some(node) = self.node_store.get(&ObjectRef::new(&name)) else {
            return;
        };
        let (add, remove) = no_schedule_taint_diff(&node);
        if add.is_empty() && remove.is_empty() {
            return;
        }
        if let Err(e) = swap_node_taints(
            &self.nodes,
            Some(&node),
            &name,
            &add,
            &remove,
            self.clock.now(),
        )
        .instrument(info_span!("node_lifecycle", node = %name))
        .await
        {
            warn!(node = %name, error = %e, "NoSchedule taint update failed");
        }
    }
}

impl NodeLifecycleController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client, config: NodeLifecycleConfig) -> Self {
        Self { client, config }
    }

    /// Runs until `shutdown` is cancelled: the Node and Lease reflectors, the monitor pass
    /// every `node_monitor_period`, the NoExecute pass every 100 ms, the NoSchedule taint
    /// workers on Node events.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), NodeLifecycleError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
        let (node_store, node_writer) = reflector::store();
        let (lease_store, lease_writer) = reflector::store();
        let mut tasks = JoinSet::new();

        // NoSchedule taints follow Node events; names are deduplicated while pending.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let pending: Arc<Mutex<HashSet<String>>> = Arc::default();
        {
            let pending = pending.clone();
            let stream = watcher(nodes.clone(), watcher::Config::default())
                .default_backoff()
                .reflect(node_writer)
                .applied_objects();
            tasks.spawn(async move {
                let mut stream = std::pin::pin!(stream);
                loop {
                    match stream.try_next().await {
                        Ok(Some(node)) => {
                            let name = node.name_any();
                            if pending.lock().insert(name.clone()) {
                                let _ = tx.send(name);
                            }
                        }
                        Ok(None) => break,
                        Err(e) => warn!(error = %e, "node watch error"),
                    }
                }
            });
        }
        tasks.spawn(
            watcher(leases, watcher::Config::default())
                .default_backoff()
                .reflect(lease_writer)
                .for_each(|_| async {}),
        );
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = node_store.wait_until_ready() => r.map_err(|_| NodeLifecycleError::CacheNotSynced("node"))?,
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            r = lease_store.wait_until_ready() => r.map_err(|_| NodeLifecycleError::CacheNotSynced("lease"))?,
        }
        let shared = Arc::new(Shared {
            client: self.client.clone(),
            nodes,
            recorder: Recorder::new(
                self.client.clone(),
                Reporter {
                    controller: CONTROLLER_NAME.into(),
                    instance: None,
                },
            ),
            core: Mutex::new(MonitorCore::new(self.config.clone())),
            node_store,
            clock: WallClock::new(),
        });
        {
            let shared = shared.clone();
            let names =
                stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|n| (n, rx)) });
            tasks.spawn(names.for_each_concurrent(NODE_UPDATE_WORKERS, move |name| {
                let shared = shared.clone();
                let pending = pending.clone();
                async move {
                    pending.lock().remove(&name);
                    shared.no_schedule_pass(name).await;
                }
            }));
        }
        {
            let shared = shared.clone();
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(NODE_EVICTION_PERIOD);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    shared.no_execute_pass().await;
                }
            });
        }
        let period = self.config.node_monitor_period;
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                shared.monitor_pass(&lease_store).await;
            }
        });
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(done) = tasks.join_next() => {
                    // A worker's panic is the controller's, for its supervisor to see: a
                    // silently dead worker would leave the controller half running.
                    if let Err(e) = done
                        && e.is_panic()
                    {
                        std::panic::resume_unwind(e.into_panic());
                    }
                }
            }
        }
        tasks.shutdown().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(s: &[Option<ReadyStatus>]) -> ZoneState {
        compute_zone_state(s, 0.55).1
    }

    #[test]
    fn zone_states() {
        use ReadyStatus::*;
        assert_eq!(ready(&[Some(False), None]), ZoneState::FullDisruption);
        // 4 of 6
        let mut z = vec![Some(Unknown); 4];
        z.extend([Some(True), Some(True)]);
        assert_eq!(ready(&z), ZoneState::PartialDisruption);
        // 2 of 3 is Normal
        assert_eq!(
            ready(&[Some(False), Some(False), Some(True)]),
            ZoneState::Normal
        );
        // Nil counts as not ready
        assert_eq!(
            ready(&[None, None, None, Some(True)]),
            ZoneState::PartialDisruption
        );
    }

    #[test]
    fn token_bucket_rate() {
        // 0.1/s, burst 1
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0.1, t0);
        assert!(b.try_accept(t0));
        assert!(!b.try_accept(t0 + Duration::from_secs(9)));
        assert!(b.try_accept(t0 + Duration::from_secs(10)));
        // swap to 0 never grants
        b.swap(0.0, t0 + Duration::from_secs(100));
        assert!(!b.try_accept(t0 + Duration::from_secs(1000)));
    }

    fn node(name: &str, zone: &str, ready: &str, heartbeat: i64) -> Arc<Node> {
        let t = Time(Timestamp::from_second(heartbeat).unwrap());
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.labels_mut().insert(ZONE_LABEL.into(), zone.into());
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                last_heartbeat_time: Some(t.clone()),
                last_transition_time: Some(t),
                ..NodeCondition::default()
            }]),
            ..Default::default()
        });
        Arc::new(n)
    }

    fn status_writes(plan: &PassPlan) -> Vec<String> {
        plan.nodes
            .iter()
            .filter(|p| {
                p.actions
                    .iter()
                    .any(|a| matches!(a, NodeAction::UpdateStatus(_)))
            })
            .map(|p| p.name.clone())
            .collect()
    }

    #[test]
    fn restart_gives_full_grace_and_heartbeat_refreshes() {
        let wall = Timestamp::now();
        let none = |_: &str| None;
        let t0 = Instant::now();
        // A node first seen (e.g. after a restart) with an old
        // heartbeat gets probe = now: no write until now + grace.
        let mut core = MonitorCore::new(NodeLifecycleConfig::default());
        let nodes = vec![node("n", "a", "True", 1)];
        core.monitor_pass(&nodes, &none, t0, wall);
        let plan = core.monitor_pass(&nodes, &none, t0 + Duration::from_secs(50), wall);
        assert!(status_writes(&plan).is_empty());
        // A new lastHeartbeatTime refreshes the probe
        let nodes = vec![node("n", "a", "True", 2)];
        core.monitor_pass(&nodes, &none, t0 + Duration::from_secs(50), wall);
        let plan = core.monitor_pass(&nodes, &none, t0 + Duration::from_secs(100), wall);
        assert!(status_writes(&plan).is_empty());
        // Strictly after probe + grace: one status write
        let plan = core.monitor_pass(&nodes, &none, t0 + Duration::from_secs(101), wall);
        assert_eq!(status_writes(&plan), vec!["n".to_string()]);
    }

    #[test]
    fn lease_renewal_only_counts_forward() {
        let wall = Timestamp::now();
        let t0 = Instant::now();
        let lease = |secs: i64| {
            Arc::new(Lease {
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    renew_time: Some(MicroTime(Timestamp::from_second(secs).unwrap())),
                    ..Default::default()
                }),
                ..Lease::default()
            })
        };
        let mut core = MonitorCore::new(NodeLifecycleConfig::default());
        let nodes = vec![node("n", "a", "True", 1)];
        let l100 = lease(100);
        core.monitor_pass(&nodes, &|_| Some(l100.clone()), t0, wall);
        // A renewTime that moves back is not a heartbeat
        let l50 = lease(50);
        core.monitor_pass(
            &nodes,
            &|_| Some(l50.clone()),
            t0 + Duration::from_secs(40),
            wall,
        );
        let plan = core.monitor_pass(
            &nodes,
            &|_| Some(l50.clone()),
            t0 + Duration::from_secs(51),
            wall,
        );
        assert_eq!(status_writes(&plan), vec!["n".to_string()]);
        // forward movement is
        let mut core = MonitorCore::new(NodeLifecycleConfig::default());
        core.monitor_pass(&nodes, &|_| Some(l100.clone()), t0, wall);
        let l101 = lease(101);
        core.monitor_pass(
            &nodes,
            &|_| Some(l101.clone()),
            t0 + Duration::from_secs(40),
            wall,
        );
        let plan = core.monitor_pass(
            &nodes,
            &|_| Some(l101.clone()),
            t0 + Duration::from_secs(51),
            wall,
        );
        assert!(status_writes(&plan).is_empty());
    }

    #[test]
    fn excluded_nodes_stay_out_of_zone_state() {
        // The Ready excluded node does not count, so the zone
        // is fully disrupted (it would be Normal if it counted)
        let wall = Timestamp::now();
        let t0 = Instant::now();
        let none = |_: &str| None;
        let mut core = MonitorCore::new(NodeLifecycleConfig::default());
        let mut ok = (*node("x", "a", "True", 1)).clone();
        ok.labels_mut()
            .insert(LABEL_EXCLUDE_DISRUPTION.into(), String::new());
        let nodes = vec![node("n", "a", "False", 1), Arc::new(ok)];
        core.monitor_pass(&nodes, &none, t0, wall);
        assert_eq!(core.zone_state(":\x00:a"), Some(ZoneState::FullDisruption));
        let nodes = vec![node("n", "a", "False", 1), node("x", "a", "True", 1)];
        core.monitor_pass(&nodes, &none, t0 + Duration::from_secs(5), wall);
        assert_eq!(core.zone_state(":\x00:a"), Some(ZoneState::Normal));
    }

    #[test]
    fn leaving_master_disruption_resets_probes() {
        // On leaving "all zones down", every probe is reset to
        // now. The excluded node x stops heartbeating at t0: without the reset it would be
        // written Unknown at t0 + 51 s; with it, not before 50 s after the exit at t0 + 40 s.
        let wall = Timestamp::now();
        let t0 = Instant::now();
        let none = |_: &str| None;
        let s = Duration::from_secs;
        let mut core = MonitorCore::new(NodeLifecycleConfig::default());
        let mut x = (*node("x", "a", "True", 1)).clone();
        x.labels_mut()
            .insert(LABEL_EXCLUDE_DISRUPTION.into(), String::new());
        let x = Arc::new(x);
        let up = vec![
            node("a0", "a", "True", 1),
            node("b0", "b", "True", 1),
            x.clone(),
        ];
        core.monitor_pass(&up, &none, t0, wall);
        let down = vec![
            node("a0", "a", "Unknown", 1),
            node("b0", "b", "Unknown", 1),
            x.clone(),
        ];
        core.monitor_pass(&down, &none, t0 + s(10), wall);
        // Every zone fully disrupted
        assert_eq!(core.zone_state(":\x00:a"), Some(ZoneState::FullDisruption));
        assert_eq!(core.zone_state(":\x00:b"), Some(ZoneState::FullDisruption));
        let back = vec![
            node("a0", "a", "Unknown", 1),
            node("b0", "b", "True", 2),
            x.clone(),
        ];
        core.monitor_pass(&back, &none, t0 + s(40), wall);
        assert_eq!(core.zone_state(":\x00:b"), Some(ZoneState::Normal));
        let writes = |p: &PassPlan| status_writes(p).contains(&"x".to_string());
        let back2 = vec![
            node("a0", "a", "Unknown", 1),
            node("b0", "b", "True", 3),
            x.clone(),
        ];
        assert!(!writes(&core.monitor_pass(&back2, &none, t0 + s(51), wall)));
        assert!(!writes(&core.monitor_pass(&back2, &none, t0 + s(90), wall)));
        assert!(writes(&core.monitor_pass(&back2, &none, t0 + s(91), wall)));
    }

    #[test]
    fn zone_key_labels() {
        let mut n = Node::default();
        assert_eq!(zone_key(&n), "");
        n.labels_mut().insert(ZONE_LABEL.into(), "a".into());
        n.labels_mut().insert(REGION_LABEL.into(), "r".into());
        assert_eq!(zone_key(&n), "r:\x00:a");
        n.labels_mut().insert(ZONE_LABEL_BETA.into(), "b".into());
        assert_eq!(zone_key(&n), "r:\x00:b");
    }
}
