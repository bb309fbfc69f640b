//! kubelet's eviction manager for disk (`pkg/kubelet/eviction/eviction_manager.go`,
//! `helpers.go`), on the simulated node and image filesystems.
//!
//! Every [`EvictionConfig::monitoring_interval`] (kubelet's 10 s) each node observes two
//! signals:
//!
//! - `nodefs.available`: `ephemeral-storage` capacity minus what its running pods write
//!   (the pod annotation [`DISK_USAGE_ANNOTATION`]), its dead containers
//!   ([`ContainerGcConfig::dead_container_bytes`](crate::ContainerGcConfig) each) and the
//!   node's [`NODEFS_FILL_ANNOTATION`];
//! - `imagefs.available`: the image filesystem's capacity minus its images and the node's
//!   [`IMAGEFS_FILL_ANNOTATION`] (a dedicated image filesystem, as containerd's).
//!
//! A hard threshold of `--eviction-hard` (defaults `nodefs.available<10%`,
//! `imagefs.available<15%`) below which a signal falls sets `DiskPressure=True`
//! (`KubeletHasDiskPressure`), which stays until no threshold has been met for
//! `--eviction-pressure-transition-period` (5 minutes); the node lifecycle controller then
//! taints the node `node.kubernetes.io/disk-pressure:NoSchedule`, as upstream. Then, as
//! `synchronize` does:
//!
//! 1. node-level resources are reclaimed first (`reclaimNodeLevelResources`): dead
//!    containers of finished and deleted pods for `nodefs`, and unused images too for
//!    `imagefs`; when that brings the signal back above its threshold no pod is evicted;
//! 2. otherwise one pod per interval is evicted, ranked as `rankDiskPressureFunc`: pods
//!    using more than their `ephemeral-storage` requests first, then lower priority, then
//!    larger usage above requests; critical pods (priority ≥ 2000000000) are never
//!    evicted. The pod becomes `Failed`, reason `Evicted`, with kubelet's message ("The node
//!    was low on resource: ephemeral-storage. Threshold quantity: …, available: …. ") and
//!    the `DisruptionTarget` condition, and a Warning Event `Evicted`.
//!
//! While the node has disk pressure it rejects new pods other than critical ones
//! (reason `Evicted`, "The node had condition: [DiskPressure]. ").
//!
//! A person fills a node's disk from kubectl:
//!
//! ```sh
//! kubectl annotate node sim-node-0 sim.ccm-rs.io/nodefs-fill=95% --overwrite
//! kubectl annotate node sim-node-0 sim.ccm-rs.io/imagefs-fill=19Gi --overwrite
//! kubectl annotate node sim-node-0 sim.ccm-rs.io/nodefs-fill-     # freed again
//! ```

use std::{collections::HashMap, sync::Arc, time::Duration};

use core_cluster_machinery::registry::quantity::parse_quantity;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::shutdown::{SYSTEM_CRITICAL_PRIORITY, pod_priority};

/// Pod annotation: the bytes its containers write to the node filesystem (a quantity,
/// e.g. `2Gi`), counted in `nodefs.available` while it runs.
pub const DISK_USAGE_ANNOTATION: &str = "sim.ccm-rs.io/disk-usage";
/// Node annotation: bytes of the node filesystem used outside pods, a quantity (`80Gi`) or
/// a percentage of its capacity (`95%`).
pub const NODEFS_FILL_ANNOTATION: &str = "sim.ccm-rs.io/nodefs-fill";
/// Node annotation: bytes of the image filesystem used outside images, as
/// [`NODEFS_FILL_ANNOTATION`].
pub const IMAGEFS_FILL_ANNOTATION: &str = "sim.ccm-rs.io/imagefs-fill";

/// kubelet's eviction reason (`eviction.Reason`).
pub const EVICTED_REASON: &str = "Evicted";

/// An eviction signal kubelet knows (`evictionapi.Signal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// `memory.available`.
    MemoryAvailable,
    /// `nodefs.available`.
    NodeFsAvailable,
    /// `nodefs.inodesFree`.
    NodeFsInodesFree,
    /// `imagefs.available`.
    ImageFsAvailable,
    /// `imagefs.inodesFree`.
    ImageFsInodesFree,
    /// `pid.available`.
    PidAvailable,
}

impl Signal {
    /// The signal's name in `--eviction-hard`.
    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::ImageFsInodesFree => "imagefs.inodesFree",
            Self::PidAvailable => "pid.available",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::MemoryAvailable,
            Self::NodeFsAvailable,
            Self::NodeFsInodesFree,
            Self::ImageFsAvailable,
            Self::ImageFsInodesFree,
            Self::PidAvailable,
        ]
        .into_iter()
        .find(|sig| sig.name() == s)
    }
}

/// A threshold's value: an absolute quantity (base units) or a fraction of capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// A quantity, in bytes (or inodes, pids).
    Quantity(u64),
    /// A fraction of capacity, `0.1` for `10%`.
    Percentage(f64),
}

impl ThresholdValue {
    /// The value against a capacity (`GetThresholdQuantity`).
    pub fn quantity(self, capacity: u64) -> u64 {
        match self {
            Self::Quantity(q) => q,
            Self::Percentage(p) => (capacity as f64 * p) as u64,
        }
    }
}

/// One hard eviction threshold: the signal is met when it falls below the value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The value (operator `LessThan`, the only one kubelet has).
    pub value: ThresholdValue,
}

/// kubelet's `--eviction-hard` default (`DefaultEvictionHard`).
pub const DEFAULT_EVICTION_HARD: &str = "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%,imagefs.inodesFree<5%";

/// Parses `--eviction-hard` (`signal<value` pairs, comma-separated) as kubelet's
/// `ParseThresholdConfig`/`parseThresholdStatement` do, with their messages. `0%` and
/// `100%` disable a signal, as upstream.
pub fn parse_eviction_hard(s: &str) -> Result<Vec<Threshold>, String> {
    let mut out: Vec<Threshold> = Vec::new();
    let mut seen = Vec::new();
    for stmt in s.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((signal, value)) = stmt.split_once('<') else {
            return Err(format!(
                "malformed pair {stmt:?}: each entry must be in the form key<value"
            ));
        };
        let (signal, value) = (signal.trim(), value.trim());
        let Some(sig) = Signal::parse(signal) else {
            return Err(format!("unsupported eviction signal {signal}"));
        };
        if seen.contains(&sig) {
            return Err(format!(
                "found duplicate eviction threshold for signal {signal}"
            ));
        }
        seen.push(sig);
        let value = if let Some(p) = value.strip_suffix('%') {
            if value == "0%" || value == "100%" {
                continue;
            }
            let p: f64 = p
                .parse()
                .map_err(|e| format!("invalid percentage {value:?} for {signal}: {e}"))?;
            if p < 0.0 {
                return Err(format!(
                    "eviction percentage threshold {signal} must be >= 0%: {value}"
                ));
            }
            if p > 100.0 {
                return Err(format!(
                    "eviction percentage threshold {signal} must be <= 100%: {value}"
                ));
            }
            ThresholdValue::Percentage(p / 100.0)
        } else {
            let q = parse_quantity(value).map_err(|e| format!("{signal}<{value}: {e}"))?;
            if q.nanos() <= 0 {
                return Err(format!(
                    "eviction threshold {signal} must be positive: {value}"
                ));
            }
            ThresholdValue::Quantity(q.value() as u64)
        };
        out.push(Threshold { signal: sig, value });
    }
    Ok(out)
}

/// The eviction manager's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// `--eviction-hard` ([`DEFAULT_EVICTION_HARD`]).
    pub hard: Vec<Threshold>,
    /// `--eviction-pressure-transition-period` (5 minutes).
    pub pressure_transition_period: Duration,
    /// kubelet's `evictionMonitoringPeriod` (10 s); zero turns the manager off.
    pub monitoring_interval: Duration,
}

impl Default for EvictionConfig {
    fn default() -> Self {
        Self {
            hard: parse_eviction_hard(DEFAULT_EVICTION_HARD).expect("the default parses"),
            pressure_transition_period: Duration::from_secs(300),
            monitoring_interval: Duration::from_secs(10),
        }
    }
}

/// A running pod as the eviction manager sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivePod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its priority (`spec.priority`).
    pub priority: i32,
    /// Sum of its containers' `ephemeral-storage` requests, bytes.
    pub request: u64,
    /// Bytes it writes ([`DISK_USAGE_ANNOTATION`]).
    pub usage: u64,
    /// Its first container's name (the usage is reported against it).
    pub container: String,
}

impl ActivePod {
    /// The eviction manager's view of a pod.
    pub fn of(pod: &Pod) -> Self {
        let spec = pod.spec.as_ref();
        let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        let request = containers
            .iter()
            .filter_map(|c| {
                c.resources
                    .as_ref()?
                    .requests
                    .as_ref()?
                    .get("ephemeral-storage")
            })
            .filter_map(|q| parse_quantity(&q.0).ok())
            .map(|q| q.value().max(0) as u64)
            .sum();
        let usage = pod
            .annotations()
            .get(DISK_USAGE_ANNOTATION)
            .and_then(|v| parse_quantity(v).ok())
            .map_or(0, |q| q.value().max(0) as u64);
        Self {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            priority: pod_priority(pod),
            request,
            usage,
            container: containers
                .first()
                .map(|c| c.name.clone())
                .unwrap_or_default(),
        }
    }

    fn critical(&self) -> bool {
        self.priority >= SYSTEM_CRITICAL_PRIORITY
    }
}

/// `rankDiskPressureFunc`: `exceedDiskRequests`, then `priority` (lowest first), then
/// `disk` (most usage above requests first). The first pod is evicted first.
pub fn rank_disk_pressure(pods: &mut [ActivePod]) {
    pods.sort_by(|a, b| {
        let exceeds = |p: &ActivePod| p.usage > p.request;
        let above = |p: &ActivePod| p.usage as i128 - p.request as i128;
        exceeds(b)
            .cmp(&exceeds(a))
            .then(a.priority.cmp(&b.priority))
            .then(above(b).cmp(&above(a)))
    });
}

/// A quantity as upstream prints a `BinarySI` one: the largest binary suffix that divides
/// it exactly, else plain bytes.
pub fn format_binary_si(bytes: u64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut value = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if !value.is_multiple_of(1024) {
            break;
        }
        value /= 1024;
        suffix = s;
    }
    format!("{value}{suffix}")
}

/// kubelet's eviction message (`evictionMessage`) for `ephemeral-storage`.
pub fn eviction_message(pod: &ActivePod, threshold: u64, available: u64) -> String {
    let mut m = format!(
        "The node was low on resource: ephemeral-storage. Threshold quantity: {}, available: {}. ",
        format_binary_si(threshold),
        format_binary_si(available)
    );
    if pod.usage > pod.request {
        m += &format!(
            "Container {} was using {}, request is {}, has larger consumption of ephemeral-storage. ",
            pod.container,
            format_binary_si(pod.usage),
            format_binary_si(pod.request)
        );
    }
    m
}

/// What one observation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsObservation {
    /// Bytes available.
    pub available: u64,
    /// Capacity, bytes.
    pub capacity: u64,
}

/// One node's eviction state.
#[derive(Debug, Default)]
pub(crate) struct EvictionState {
    /// [`NODEFS_FILL_ANNOTATION`] as the Node shows it.
    pub(crate) nodefs_fill: Option<String>,
    /// [`IMAGEFS_FILL_ANNOTATION`] as the Node shows it.
    pub(crate) imagefs_fill: Option<String>,
    /// When a threshold was last met (`nodeConditionsLastObservedAt`).
    last_met: Option<Instant>,
    /// `DiskPressure` as reported.
    pub(crate) disk_pressure: bool,
    /// Running pods, by uid.
    pub(crate) pods: HashMap<String, ActivePod>,
}

/// A fill annotation's bytes: a quantity or a percentage of `capacity` (malformed: 0).
fn fill_bytes(value: Option<&str>, capacity: u64) -> u64 {
    let Some(v) = value.map(str::trim) else {
        return 0;
    };
    if let Some(p) = v.strip_suffix('%') {
        return p
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| p.is_finite() && *p >= 0.0)
            .map_or(0, |p| (capacity as f64 * p.min(100.0) / 100.0) as u64);
    }
    parse_quantity(v).map_or(0, |q| q.value().max(0) as u64)
}

/// The filesystems of a node: (nodefs, imagefs).
pub(crate) fn observe(shared: &crate::Shared, node: &crate::NodeState) -> [FsObservation; 2] {
    let nodefs_capacity = parse_quantity(&node.config.capacity.ephemeral_storage)
        .map_or(0, |q| q.value().max(0) as u64);
    let imagefs_capacity = node.config.image_gc.imagefs_capacity;
    let (nodefs_fill, imagefs_fill, pods_usage) = {
        let st = node.eviction.lock();
        (
            fill_bytes(st.nodefs_fill.as_deref(), nodefs_capacity),
            fill_bytes(st.imagefs_fill.as_deref(), imagefs_capacity),
            st.pods.values().map(|p| p.usage).sum::<u64>(),
        )
    };
    let dead = node
        .containers
        .lock()
        .dead_bytes(&shared.config.container_gc);
    let images = node.images.lock().used_bytes();
    let fs = |capacity: u64, used: u64| FsObservation {
        available: capacity.saturating_sub(used),
        capacity,
    };
    [
        fs(
            nodefs_capacity,
            nodefs_fill.saturating_add(pods_usage).saturating_add(dead),
        ),
        fs(imagefs_capacity, imagefs_fill.saturating_add(images)),
    ]
}

/// The disk thresholds met by an observation, nodefs first: (signal, threshold bytes,
/// available bytes).
pub(crate) fn thresholds_met(
    config: &EvictionConfig,
    obs: &[FsObservation; 2],
) -> Vec<(Signal, u64, u64)> {
    let mut met = Vec::new();
    for (signal, o) in [
        (Signal::NodeFsAvailable, obs[0]),
        (Signal::ImageFsAvailable, obs[1]),
    ] {
        for t in config.hard.iter().filter(|t| t.signal == signal) {
            let q = t.value.quantity(o.capacity);
            if o.available < q {
                met.push((signal, q, o.available));
            }
        }
    }
    met
}

/// Runs the eviction manager of every node each monitoring interval.
pub(crate) async fn run_eviction(
    shared: Arc<crate::Shared>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let period = shared.config.eviction.monitoring_interval;
    if period.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval_at(Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let nodes: Vec<Arc<crate::NodeState>> = shared.nodes.read().values().cloned().collect();
        for node in nodes {
            if shared.heartbeat_stopped(&node) || node.ctl.lock().shutting_down {
                continue;
            }
            synchronize(&shared, &node).await;
        }
    }
}

/// One `synchronize` of a node's eviction manager.
async fn synchronize(shared: &Arc<crate::Shared>, node: &Arc<crate::NodeState>) {
    let config = &node.config.eviction;
    let now = Instant::now();
    let met = thresholds_met(config, &observe(shared, node));
    let changed = {
        let mut st = node.eviction.lock();
        if !met.is_empty() {
            st.last_met = Some(now);
        }
        let pressure = st
            .last_met
            .is_some_and(|t| now.saturating_duration_since(t) < config.pressure_transition_period);
        std::mem::replace(&mut st.disk_pressure, pressure) != pressure
    };
    if changed {
        tracing::info!(node = %node.name, "disk pressure changed");
        node.notify.notify_one();
    }
    let Some(&(signal, _, _)) = met.first() else {
        return;
    };
    // reclaimNodeLevelResources: dead containers, and for the image filesystem unused
    // images too.
    let removed = node
        .containers
        .lock()
        .collect(&shared.config.container_gc, true, now);
    let mut images_freed = 0;
    if signal == Signal::ImageFsAvailable {
        let out = node.images.lock().free_unused(&node.config.image_gc, now);
        images_freed = out.freed;
        if !out.removed.is_empty() {
            node.notify.notify_one();
        }
    }
    let after = thresholds_met(config, &observe(shared, node));
    let Some(&(_, threshold, available)) = after.iter().find(|m| m.0 == signal) else {
        tracing::info!(node = %node.name, signal = signal.name(), containers = removed.len(), images_freed,
            "eviction manager: able to reduce resource pressure without evicting pods");
        return;
    };
    let victim = {
        let st = node.eviction.lock();
        let mut pods: Vec<(String, ActivePod)> = st
            .pods
            .iter()
            .filter(|(_, p)| !p.critical())
            .map(|(u, p)| (u.clone(), p.clone()))
            .collect();
        pods.sort_by(|a, b| {
            a.1.namespace
                .cmp(&b.1.namespace)
                .then(a.1.name.cmp(&b.1.name))
        });
        let mut ranked: Vec<ActivePod> = pods.iter().map(|(_, p)| p.clone()).collect();
        rank_disk_pressure(&mut ranked);
        ranked
            .first()
            .and_then(|v| pods.into_iter().find(|(_, p)| p == v))
    };
    let Some((uid, pod)) = victim else {
        tracing::warn!(node = %node.name, signal = signal.name(), "eviction manager: no pod to evict");
        return;
    };
    let message = eviction_message(&pod, threshold, available);
    tracing::info!(node = %node.name, pod = %format!("{}/{}", pod.namespace, pod.name), %message, "eviction manager: evicting pod");
    crate::pods::evict(shared, node, &uid, &pod, &message).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32, request: u64, usage: u64) -> ActivePod {
        ActivePod {
            namespace: "default".into(),
            name: name.into(),
            priority,
            request,
            usage,
            container: "c".into(),
        }
    }

    /// `ParseThresholdConfig`: kubelet's defaults, `0%`/`100%` dropped, and its messages
    /// for an unknown signal, a duplicate, a percentage out of range and a non-positive
    /// quantity.
    #[test]
    fn eviction_hard_parses_as_kubelet_parse_threshold_config() {
        let d = parse_eviction_hard(DEFAULT_EVICTION_HARD).unwrap();
        assert_eq!(d.len(), 5);
        assert!(d.contains(&Threshold {
            signal: Signal::NodeFsAvailable,
            value: ThresholdValue::Percentage(0.10)
        }));
        assert!(d.contains(&Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(100 << 20)
        }));
        assert_eq!(parse_eviction_hard("nodefs.available<0%").unwrap(), []);
        assert_eq!(
            parse_eviction_hard("disk.available<1Gi").unwrap_err(),
            "unsupported eviction signal disk.available"
        );
        assert_eq!(
            parse_eviction_hard("nodefs.available<1Gi,nodefs.available<2Gi").unwrap_err(),
            "found duplicate eviction threshold for signal nodefs.available"
        );
        assert_eq!(
            parse_eviction_hard("imagefs.available<150%").unwrap_err(),
            "eviction percentage threshold imagefs.available must be <= 100%: 150%"
        );
        assert_eq!(
            parse_eviction_hard("nodefs.available<0").unwrap_err(),
            "eviction threshold nodefs.available must be positive: 0"
        );
        assert!(parse_eviction_hard("nodefs.available=1Gi").is_err());
    }

    /// `helpers.go` `rankDiskPressureFunc`: pods over their requests first, then lowest
    /// priority, then the most usage above requests.
    #[test]
    fn disk_pressure_ranks_exceeding_requests_then_priority_then_usage() {
        let mut pods = vec![
            pod("within-low-prio", -10, 5 << 30, 1 << 30),
            pod("over-high-prio", 1000, 0, 1 << 30),
            pod("over-small", 0, 0, 1 << 20),
            pod("over-big", 0, 1 << 30, 3 << 30),
        ];
        rank_disk_pressure(&mut pods);
        let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "over-big",
                "over-small",
                "over-high-prio",
                "within-low-prio"
            ]
        );
    }

    /// `evictionMessage`: the node-low line, the threshold and what was available, and the
    /// container over its request, with quantities printed as upstream's BinarySI.
    #[test]
    fn eviction_message_is_kubelets() {
        assert_eq!(
            eviction_message(&pod("p", 0, 0, 2 << 30), 10 << 30, 5 << 30),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 5Gi. \
             Container c was using 2Gi, request is 0, has larger consumption of ephemeral-storage. "
        );
        assert_eq!(
            eviction_message(&pod("p", 0, 4 << 30, 1 << 30), 10 << 30, 1_000_000),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 1000000. "
        );
        assert_eq!(format_binary_si(1536 << 20), "1536Mi");
    }

    /// Fill annotations take a quantity or a percentage of the capacity.
    #[test]
    fn fill_is_a_quantity_or_a_percentage() {
        assert_eq!(fill_bytes(Some("95%"), 1000), 950);
        assert_eq!(fill_bytes(Some("1Ki"), 1000), 1024);
        assert_eq!(fill_bytes(Some("lots"), 1000), 0);
        assert_eq!(fill_bytes(None, 1000), 0);
    }
}
