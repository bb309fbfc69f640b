//! Swap on a simulated node, as kubelet handles it on cgroup v2:
//!
//! - `failSwapOn` (true by default): a kubelet whose machine has swap refuses to start
//!   (`pkg/kubelet/cm/container_manager_linux.go` `validateSwapConfiguration`);
//! - `status.nodeInfo.swap.capacity`: the machine's swap (`pkg/kubelet/nodestatus/setters.go`
//!   `MachineInfo`, with the NodeSwap feature; absent when the machine has none);
//! - `memorySwap.swapBehavior`: `NoSwap` (the default: `memory.swap.max=0` for every
//!   container) or `LimitedSwap`, where a Burstable container that requests memory, without a
//!   limit equal to its request and outside critical pods, may swap
//!   `request / node memory capacity × node swap capacity` bytes
//!   (`pkg/kubelet/kuberuntime/kuberuntime_container_linux.go` `ConfigureLimitedSwap`,
//!   `calcSwapForBurstablePods`). The seed's `UnlimitedSwap` (`memory.swap.max=max` for those
//!   containers) is accepted too: upstream removed it in v1.30.
//!
//! What decides swap at startup, as kubelet 1.32 has it (there is no Node condition for swap):
//!
//! - the `NodeSwap` feature gate (beta, on by default in 1.32), per node in `featureGates`:
//!   off, `memorySwap` may not be set (`pkg/kubelet/apis/config/validation/validation.go`
//!   `ValidateKubeletConfiguration`), `status.nodeInfo.swap` is not reported, and every
//!   container gets NoSwap (`kuberuntime_container_linux.go` `GetContainerSwapBehavior`);
//! - the machine's cgroup version (v2 by default): on cgroup v1 LimitedSwap is NoSwap
//!   (`GetContainerSwapBehavior`: no `memory.swap.max` there), kubelet warns with a `CgroupV1`
//!   Event (`pkg/kubelet/kubelet.go` `warnCgroupV1Usage`), and `failCgroupV1: true` stops it
//!   (`validation_linux.go` `validateKubeletOSConfiguration`).
//!
//! The simulator shows a pod's limits in the [`SWAP_LIMIT_ANNOTATION`] (what kubelet writes to
//! each container's `memory.swap.max`).

use std::collections::BTreeMap;

use core_cluster_machinery::registry::quantity::parse_quantity;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;

use crate::shutdown::SYSTEM_CRITICAL_PRIORITY;

/// Pod annotation the simulator writes: `{"<container>": "<bytes>" | "max"}`, each
/// container's `memory.swap.max` when it may swap (absent when none may).
pub const SWAP_LIMIT_ANNOTATION: &str = "sim.ccm-rs.io/swap-limit";

/// kubelet's refusal to start on a machine with swap under `failSwapOn`.
pub const FAIL_SWAP_ON_MESSAGE: &str = "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false";

/// `memorySwap.swapBehavior`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SwapBehavior {
    /// `NoSwap` (also the empty value): no container swaps.
    #[default]
    NoSwap,
    /// `LimitedSwap`: Burstable containers swap in proportion to their memory request.
    LimitedSwap,
    /// `UnlimitedSwap` (the seed's; removed upstream in v1.30): those containers swap
    /// without limit.
    UnlimitedSwap,
}

impl SwapBehavior {
    /// Parses the KubeletConfiguration value (`""`, `NoSwap`, `LimitedSwap`,
    /// `UnlimitedSwap`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "NoSwap" => Ok(Self::NoSwap),
            "LimitedSwap" => Ok(Self::LimitedSwap),
            "UnlimitedSwap" => Ok(Self::UnlimitedSwap),
            other => Err(format!(
                "swapBehavior {other:?} must be one of: \"\", \"NoSwap\", \"LimitedSwap\" (or the seed's \"UnlimitedSwap\")"
            )),
        }
    }

    /// The KubeletConfiguration value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSwap => "NoSwap",
            Self::LimitedSwap => "LimitedSwap",
            Self::UnlimitedSwap => "UnlimitedSwap",
        }
    }
}

/// kubelet's `CgroupV1` Warning Event on a cgroup v1 machine (`warnCgroupV1Usage`,
/// `cm.CgroupV1MaintenanceModeWarning` as 1.32 words it).
pub const CGROUP_V1_WARNING: &str =
    "Cgroup v1 support is in maintenance mode, please migrate to Cgroup v2.";

/// The Event reason of [`CGROUP_V1_WARNING`].
pub const CGROUP_V1_REASON: &str = "CgroupV1";

/// `validateKubeletOSConfiguration`'s refusal under `failCgroupV1` on cgroup v1.
pub const FAIL_CGROUP_V1_MESSAGE: &str = "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is in maintenance mode";

/// The cgroup version of a simulated machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1: no per-container swap limit.
    V1,
    /// cgroup v2 (the unified hierarchy, the default).
    #[default]
    V2,
}

impl CgroupVersion {
    /// `1` or `2`.
    pub fn parse(n: i64) -> Result<Self, String> {
        match n {
            1 => Ok(Self::V1),
            2 => Ok(Self::V2),
            other => Err(format!("{other} must be 1 or 2")),
        }
    }
}

/// A node's swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapConfig {
    /// The machine's swap, bytes (0: none, the default).
    pub capacity: u64,
    /// `failSwapOn` (true): refuse to start when the machine has swap.
    pub fail_swap_on: bool,
    /// `memorySwap.swapBehavior` (NoSwap).
    pub behavior: SwapBehavior,
    /// The `NodeSwap` feature gate (true, as upstream 1.32's beta default).
    pub node_swap_gate: bool,
    /// The machine's cgroup version (v2).
    pub cgroup_version: CgroupVersion,
    /// `failCgroupV1` (false in 1.32): refuse to start on cgroup v1.
    pub fail_cgroup_v1: bool,
}

impl Default for SwapConfig {
    fn default() -> Self {
        Self {
            capacity: 0,
            fail_swap_on: true,
            behavior: SwapBehavior::NoSwap,
            node_swap_gate: true,
            cgroup_version: CgroupVersion::V2,
            fail_cgroup_v1: false,
        }
    }
}

impl SwapConfig {
    /// `NewContainerManager`: the error kubelet stops with at startup, if any (swap on
    /// under `failSwapOn`).
    pub fn startup_error(&self) -> Option<&'static str> {
        (self.fail_swap_on && self.capacity > 0).then_some(FAIL_SWAP_ON_MESSAGE)
    }

    /// `validateKubeletOSConfiguration`: `failCgroupV1` on a cgroup v1 machine; the field
    /// and kubelet's message.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.fail_cgroup_v1 && self.cgroup_version == CgroupVersion::V1 {
            return Err(("failCgroupV1", FAIL_CGROUP_V1_MESSAGE.to_owned()));
        }
        Ok(())
    }

    /// The node-wide part of `GetContainerSwapBehavior`: the configured behavior where the
    /// `NodeSwap` gate is on and the machine has cgroup v2 (and swap), NoSwap otherwise.
    pub fn effective_behavior(&self) -> SwapBehavior {
        if !self.node_swap_gate || self.cgroup_version == CgroupVersion::V1 || self.capacity == 0 {
            SwapBehavior::NoSwap
        } else {
            self.behavior
        }
    }

    /// `status.nodeInfo.swap.capacity` (`nodestatus/setters.go` `MachineInfo`): reported
    /// only with the `NodeSwap` gate on and when the machine has swap
    /// (`info.SwapCapacity != 0`); kube-apiserver refuses a capacity of 0
    /// (`metadata.nodeSwapStatus.capacity: must be greater than zero`).
    pub fn node_info_capacity(&self) -> Option<i64> {
        (self.node_swap_gate && self.capacity > 0)
            .then(|| i64::try_from(self.capacity).unwrap_or(i64::MAX))
    }
}

/// What kubelet says about swap and cgroups as it starts (after the startup checks
/// passed): a `CgroupV1` Warning Event on cgroup v1 (`warnCgroupV1Usage`), and a log line
/// with the behavior its containers get when the machine has swap.
pub(crate) async fn announce_startup(shared: &crate::Shared, node: &str, swap: &SwapConfig) {
    if swap.capacity > 0 {
        let effective = swap.effective_behavior();
        let why = if !swap.node_swap_gate {
            "the NodeSwap feature gate is off"
        } else if swap.cgroup_version == CgroupVersion::V1 {
            "swap limits need cgroup v2"
        } else {
            "as configured"
        };
        tracing::info!(
            configured = swap.behavior.as_str(),
            effective = effective.as_str(),
            why,
            capacity = swap.capacity,
            "swap is on"
        );
    }
    if swap.cgroup_version == CgroupVersion::V1 {
        tracing::warn!(message = CGROUP_V1_WARNING, "Warning: cgroup v1");
        crate::images::post_event(shared, node, CGROUP_V1_REASON, CGROUP_V1_WARNING).await;
    }
}

/// A container's `memory.swap.max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerSwap {
    /// `0`: no swap.
    None,
    /// At most this many bytes.
    Limited(u64),
    /// `max`.
    Unlimited,
}

fn quantity_bytes(c: &Container, which: &str, resource: &str) -> Option<i128> {
    let r = c.resources.as_ref()?;
    let map = if which == "requests" {
        r.requests.as_ref()
    } else {
        r.limits.as_ref()
    }?;
    let q = map.get(resource)?;
    parse_quantity(&q.0).ok().map(|q| q.nanos())
}

/// A container's request of `resource` (defaulted to its limit, as the API server does).
fn request(c: &Container, resource: &str) -> Option<i128> {
    quantity_bytes(c, "requests", resource).or_else(|| quantity_bytes(c, "limits", resource))
}

/// `v1.PodQOSClass` as `GetPodQOS` computes it: `Guaranteed`, `Burstable` or
/// `BestEffort`.
pub fn pod_qos(pod: &Pod) -> &'static str {
    let Some(spec) = &pod.spec else {
        return "BestEffort";
    };
    let all: Vec<&Container> = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &all {
        for resource in ["cpu", "memory"] {
            let req = request(c, resource).filter(|v| *v != 0);
            let lim = quantity_bytes(c, "limits", resource).filter(|v| *v != 0);
            if req.is_some() || lim.is_some() {
                any = true;
            }
            if lim.is_none() || req != lim {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// `kubelettypes.IsCriticalPod`: a static or mirror pod, or one of priority at least
/// `system-cluster-critical`'s.
fn is_critical(pod: &Pod) -> bool {
    pod.annotations()
        .contains_key("kubernetes.io/config.mirror")
        || pod
            .annotations()
            .get("kubernetes.io/config.source")
            .is_some_and(|s| s != "api")
        || crate::shutdown::pod_priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// `calcSwapForBurstablePods`: the container's share of the node's memory, of its swap.
pub fn calc_swap_for_burstable(request: u64, node_memory: u64, node_swap: u64) -> u64 {
    if node_memory == 0 {
        return 0;
    }
    (request as f64 / node_memory as f64 * node_swap as f64) as u64
}

/// Each app container's `memory.swap.max` on a node with this swap and memory capacity
/// (`ConfigureSwap`, cgroup v2).
pub fn container_limits(
    swap: &SwapConfig,
    node_memory: u64,
    pod: &Pod,
) -> Vec<(String, ContainerSwap)> {
    let containers = pod.spec.iter().flat_map(|s| &s.containers);
    let behavior = swap.effective_behavior();
    let allowed =
        behavior != SwapBehavior::NoSwap && !is_critical(pod) && pod_qos(pod) == "Burstable";
    containers
        .map(|c| {
            let limit = if !allowed {
                ContainerSwap::None
            } else {
                let req = request(c, "memory").unwrap_or(0);
                let lim = quantity_bytes(c, "limits", "memory");
                let no_memory = req == 0 && lim.unwrap_or(0) == 0;
                if no_memory || lim == Some(req) {
                    ContainerSwap::None
                } else if behavior == SwapBehavior::UnlimitedSwap {
                    ContainerSwap::Unlimited
                } else {
                    let bytes = u64::try_from(req / 1_000_000_000).unwrap_or(0);
                    ContainerSwap::Limited(calc_swap_for_burstable(
                        bytes,
                        node_memory,
                        swap.capacity,
                    ))
                }
            };
            (c.name.clone(), limit)
        })
        .collect()
}

/// The [`SWAP_LIMIT_ANNOTATION`] value for these limits, or `None` when no container
/// swaps.
pub fn limit_annotation(limits: &[(String, ContainerSwap)]) -> Option<String> {
    let map: BTreeMap<&str, String> = limits
        .iter()
        .filter_map(|(name, l)| match l {
            ContainerSwap::None | ContainerSwap::Limited(0) => None,
            ContainerSwap::Limited(b) => Some((name.as_str(), b.to_string())),
            ContainerSwap::Unlimited => Some((name.as_str(), "max".to_owned())),
        })
        .collect();
    (!map.is_empty()).then(|| serde_json::to_string(&map).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: serde_json::Value, priority: Option<i32>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": containers, "priority": priority},
        }))
        .unwrap()
    }

    fn limited() -> SwapConfig {
        SwapConfig {
            capacity: 4 << 30,
            fail_swap_on: false,
            behavior: SwapBehavior::LimitedSwap,
            ..SwapConfig::default()
        }
    }

    /// `kuberuntime_container_linux.go` `calcSwapForBurstablePods`: (container memory request
    /// / node memory capacity) × node swap capacity, for Burstable containers only.
    #[test]
    fn limited_swap_gives_burstable_containers_their_share_of_the_nodes_swap() {
        let p = pod(
            json!([
                {"name": "a", "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
                {"name": "b", "resources": {"requests": {"memory": "2Gi"}}},
                {"name": "c", "resources": {"requests": {"cpu": "100m"}}},
            ]),
            None,
        );
        assert_eq!(pod_qos(&p), "Burstable");
        let limits = container_limits(&limited(), 16 << 30, &p);
        assert_eq!(
            limits,
            [
                ("a".to_owned(), ContainerSwap::Limited(256 << 20)),
                ("b".to_owned(), ContainerSwap::Limited(512 << 20)),
                ("c".to_owned(), ContainerSwap::None),
            ],
            "1Gi/16Gi × 4Gi = 256Mi; 2Gi/16Gi × 4Gi = 512Mi; no memory request: none"
        );
        assert_eq!(
            limit_annotation(&limits).unwrap(),
            r#"{"a":"268435456","b":"536870912"}"#
        );
    }

    /// `ConfigureLimitedSwap`: Guaranteed and BestEffort pods, containers whose memory limit
    /// equals their request, and critical pods (`IsCriticalPod`) get `memory.swap.max=0`;
    /// NoSwap gives none to anyone.
    #[test]
    fn guaranteed_best_effort_and_critical_pods_do_not_swap() {
        let guaranteed = pod(
            json!([{"name": "g", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]),
            None,
        );
        assert_eq!(pod_qos(&guaranteed), "Guaranteed");
        let best_effort = pod(json!([{"name": "b"}]), None);
        assert_eq!(pod_qos(&best_effort), "BestEffort");
        let critical = pod(
            json!([{"name": "c", "resources": {"requests": {"memory": "1Gi"}}}]),
            Some(SYSTEM_CRITICAL_PRIORITY),
        );
        let equal = pod(
            json!([
                {"name": "e", "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}},
                {"name": "x", "resources": {"requests": {"cpu": "1"}}},
            ]),
            None,
        );
        for p in [&guaranteed, &best_effort, &critical, &equal] {
            let limits = container_limits(&limited(), 16 << 30, p);
            assert!(
                limits.iter().all(|(_, l)| *l == ContainerSwap::None),
                "{limits:?}"
            );
            assert_eq!(limit_annotation(&limits), None);
        }
        let burstable = pod(
            json!([{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]),
            None,
        );
        let no_swap = SwapConfig {
            behavior: SwapBehavior::NoSwap,
            ..limited()
        };
        assert_eq!(
            container_limits(&no_swap, 16 << 30, &burstable),
            [("a".to_owned(), ContainerSwap::None)]
        );
        let unlimited = SwapConfig {
            behavior: SwapBehavior::UnlimitedSwap,
            ..limited()
        };
        assert_eq!(
            container_limits(&unlimited, 16 << 30, &burstable),
            [("a".to_owned(), ContainerSwap::Unlimited)]
        );
    }

    /// `validateSwapConfiguration`: with `failSwapOn` a machine with swap stops kubelet;
    /// without swap, or with `failSwapOn: false`, it starts.
    #[test]
    fn fail_swap_on_stops_a_kubelet_whose_machine_has_swap() {
        let mut c = SwapConfig {
            capacity: 1 << 30,
            ..SwapConfig::default()
        };
        assert_eq!(c.startup_error(), Some(FAIL_SWAP_ON_MESSAGE));
        c.fail_swap_on = false;
        assert_eq!(c.startup_error(), None);
        assert_eq!(SwapConfig::default().startup_error(), None);
        assert_eq!(SwapBehavior::parse("").unwrap(), SwapBehavior::NoSwap);
        assert!(SwapBehavior::parse("Sometimes").is_err());
    }

    /// `kuberuntime_container_linux.go` `GetContainerSwapBehavior`: LimitedSwap applies only
    /// with the `NodeSwap` feature gate on and on cgroup v2; otherwise every container gets
    /// NoSwap. `nodestatus/setters.go` `MachineInfo` reports `nodeInfo.swap` only with the
    /// gate on.
    #[test]
    fn limited_swap_needs_the_node_swap_gate_and_cgroup_v2() {
        let burstable = pod(
            json!([{"name": "a", "resources": {"requests": {"memory": "1Gi"}}}]),
            None,
        );
        let share = [("a".to_owned(), ContainerSwap::Limited(256 << 20))];
        assert_eq!(container_limits(&limited(), 16 << 30, &burstable), share);
        assert_eq!(limited().node_info_capacity(), Some(4 << 30));
        let gate_off = SwapConfig {
            node_swap_gate: false,
            ..limited()
        };
        assert_eq!(gate_off.effective_behavior(), SwapBehavior::NoSwap);
        assert_eq!(
            container_limits(&gate_off, 16 << 30, &burstable),
            [("a".to_owned(), ContainerSwap::None)]
        );
        assert_eq!(gate_off.node_info_capacity(), None);
        let v1 = SwapConfig {
            cgroup_version: CgroupVersion::V1,
            ..limited()
        };
        assert_eq!(v1.effective_behavior(), SwapBehavior::NoSwap);
        assert_eq!(
            container_limits(&v1, 16 << 30, &burstable),
            [("a".to_owned(), ContainerSwap::None)]
        );
        assert_eq!(
            v1.node_info_capacity(),
            Some(4 << 30),
            "v1 still reports swap"
        );
    }

    /// `nodestatus/setters.go` `MachineInfo` sets `nodeInfo.swap` only when
    /// `info.SwapCapacity != 0`: a machine without swap reports none (kube-apiserver refuses
    /// a capacity of 0: `metadata.nodeSwapStatus.capacity: must be greater than zero`).
    #[test]
    fn a_machine_without_swap_reports_no_node_info_swap() {
        let no_swap = SwapConfig {
            capacity: 0,
            ..limited()
        };
        assert!(no_swap.node_swap_gate);
        assert_eq!(no_swap.node_info_capacity(), None);
        assert_eq!(SwapConfig::default().node_info_capacity(), None);
        assert_eq!(limited().node_info_capacity(), Some(4 << 30));
    }

    /// `validation_linux.go` `validateKubeletOSConfiguration`: `failCgroupV1` refuses a cgroup
    /// v1 machine with kubelet's message; on cgroup v2, or with `failCgroupV1: false` (1.32's
    /// default), kubelet starts.
    #[test]
    fn fail_cgroup_v1_refuses_a_cgroup_v1_machine() {
        let mut c = SwapConfig {
            cgroup_version: CgroupVersion::V1,
            fail_cgroup_v1: true,
            ..SwapConfig::default()
        };
        assert_eq!(
            c.validate(),
            Err(("failCgroupV1", FAIL_CGROUP_V1_MESSAGE.to_owned()))
        );
        c.fail_cgroup_v1 = false;
        assert_eq!(c.validate(), Ok(()));
        c.fail_cgroup_v1 = true;
        c.cgroup_version = CgroupVersion::V2;
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(CgroupVersion::parse(1), Ok(CgroupVersion::V1));
        assert!(CgroupVersion::parse(3).is_err());
    }
}
