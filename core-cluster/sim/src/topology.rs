//! The TopologyManager of a simulated node (`pkg/kubelet/cm/topologymanager`), over
//! simulated NUMA nodes that share the machine's CPUs and memory evenly.
//!
//! Hint providers, as kubelet's: the CPU manager's `static` policy gives hints for the
//! integer CPUs of Guaranteed containers (`cpumanager/policy_static.go`
//! `generateCPUTopologyHints`), the memory manager's `Static` policy for the memory of
//! Guaranteed containers (`memorymanager/policy_static.go`). A hint is a set of NUMA nodes
//! whose free resources fit the request; it is preferred when no smaller set could hold it
//! on an empty machine. The hints of the providers are merged (`policy.go`
//! `mergeFilteredHints`: every combination ANDed, the preferred and narrowest best), and the
//! policy decides (`policy_*.go` `canAdmitPodResult`):
//!
//! - `none`: every pod admitted, no alignment;
//! - `best-effort`: every pod admitted, placed on the best hint;
//! - `restricted`: admitted only when the best hint is preferred;
//! - `single-numa-node`: admitted only when a preferred hint of ONE NUMA node exists
//!   (`filterSingleNumaHints`).
//!
//! A pod refused fails admission with [`TOPOLOGY_AFFINITY_ERROR`] (`TopologyAffinityError`).
//! The scope (`container`, the default, or `pod`) decides whether each container is aligned
//! on its own or the pod's containers together (`scope_container.go`, `scope_pod.go`).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::config::SimConfigError;

/// The reason of a pod the TopologyManager refuses (`ErrorTopologyAffinity`).
pub const TOPOLOGY_AFFINITY_ERROR: &str = "TopologyAffinityError";
/// `TopologyAffinityError.Error()`.
pub const TOPOLOGY_AFFINITY_MESSAGE: &str = "Resources cannot be allocated with Topology locality";

/// `topologyManagerPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TopologyPolicy {
    /// `none` (the default).
    #[default]
    None,
    /// `best-effort`.
    BestEffort,
    /// `restricted`.
    Restricted,
    /// `single-numa-node`.
    SingleNumaNode,
}

impl TopologyPolicy {
    /// Parses a `topologyManagerPolicy` value.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "best-effort" => Ok(Self::BestEffort),
            "restricted" => Ok(Self::Restricted),
            "single-numa-node" => Ok(Self::SingleNumaNode),
            other => Err(format!(
                "unsupported policy {other:?}: must be one of none, best-effort, restricted, single-numa-node"
            )),
        }
    }
}

/// `topologyManagerScope`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TopologyScope {
    /// `container` (the default): each container aligned on its own.
    #[default]
    Container,
    /// `pod`: the pod's containers aligned together.
    Pod,
}

impl TopologyScope {
    /// Parses a `topologyManagerScope` value.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "container" => Ok(Self::Container),
            "pod" => Ok(Self::Pod),
            other => Err(format!(
                "unsupported scope {other:?}: must be container or pod"
            )),
        }
    }
}

/// A node's TopologyManager and its machine's NUMA layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyConfig {
    /// `topologyManagerPolicy` (none).
    pub policy: TopologyPolicy,
    /// `topologyManagerScope` (container).
    pub scope: TopologyScope,
    /// NUMA nodes of the machine (1), sharing its CPUs and memory evenly.
    pub numa_nodes: usize,
    /// `cpuManagerPolicy: static` (false: `none`, which gives no hints).
    pub cpu_manager_static: bool,
    /// `memoryManagerPolicy: Static` (false: `None`, which gives no hints).
    pub memory_manager_static: bool,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        Self {
            policy: TopologyPolicy::None,
            scope: TopologyScope::Container,
            numa_nodes: 1,
            cpu_manager_static: false,
            memory_manager_static: false,
        }
    }
}

/// kubelet refuses more NUMA nodes than this (`maxAllowableNUMANodes`).
pub const MAX_NUMA_NODES: usize = 8;

impl TopologyConfig {
    /// Checks the NUMA node count as kubelet does (`maxAllowableNUMANodes`).
    pub fn validate(&self) -> Result<(), SimConfigError> {
        if self.numa_nodes == 0 || self.numa_nodes > MAX_NUMA_NODES {
            return Err(SimConfigError {
                field: "numaNodes",
                message: format!(
                    "{} must be between 1 and {MAX_NUMA_NODES} (unsupported on machines with more than {MAX_NUMA_NODES} NUMA Nodes)",
                    self.numa_nodes
                ),
            });
        }
        Ok(())
    }
}

/// A request for alignment: millicores of exclusive CPUs and bytes of memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Request {
    cpu_millis: i64,
    memory: i64,
}

/// A topology hint: a NUMA bitmask and whether it is preferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hint {
    mask: u32,
    preferred: bool,
}

/// The NUMA nodes of one simulated machine: what is free on each, and what each admitted
/// pod holds.
#[derive(Debug, Default)]
pub(crate) struct NumaState {
    cpu_capacity: Vec<i64>,
    memory_capacity: Vec<i64>,
    free_cpu: Vec<i64>,
    free_memory: Vec<i64>,
    /// Per pod uid: `(numa node, cpu millis, memory bytes)` allocations.
    held: HashMap<String, Vec<(usize, i64, i64)>>,
}

fn quantity(c: &Container, resource: &str) -> (Option<i128>, Option<i128>) {
    let get = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        m.and_then(|m| m.get(resource))
            .and_then(|q| core_cluster_machinery::registry::quantity::parse_quantity(&q.0).ok())
            .map(|q| q.nanos())
    };
    let r = c.resources.as_ref();
    let limit = get(r.and_then(|r| r.limits.as_ref()));
    let request = get(r.and_then(|r| r.requests.as_ref())).or(limit);
    (request, limit)
}

impl NumaState {
    /// A machine of `numa_nodes` NUMA nodes sharing `cpu_millis` and `memory` evenly.
    pub(crate) fn new(numa_nodes: usize, cpu_millis: i64, memory: i64) -> Self {
        let n = numa_nodes.max(1);
        let split = |total: i64| -> Vec<i64> {
            (0..n)
                .map(|i| total / n as i64 + i64::from((i as i64) < total % n as i64))
                .collect()
        };
        let (cpu, mem) = (split(cpu_millis), split(memory));
        Self {
            free_cpu: cpu.clone(),
            free_memory: mem.clone(),
            cpu_capacity: cpu,
            memory_capacity: mem,
            held: HashMap::new(),
        }
    }

    fn numa_nodes(&self) -> usize {
        self.cpu_capacity.len()
    }

    /// What a container asks the hint providers to align (none for non-Guaranteed pods,
    /// fractional CPUs under the static CPU manager, or providers that are off).
    fn request_of(config: &TopologyConfig, guaranteed: bool, c: &Container) -> Request {
        if !guaranteed {
            return Request::default();
        }
        let (cpu, _) = quantity(c, "cpu");
        let (mem, _) = quantity(c, "memory");
        let cpu_millis = cpu.map_or(0, |n| (n / 1_000_000) as i64);
        Request {
            // policy_static.go: only integer CPUs are exclusive.
            cpu_millis: if config.cpu_manager_static && cpu_millis % 1000 == 0 {
                cpu_millis
            } else {
                0
            },
            memory: if config.memory_manager_static {
                mem.map_or(0, |n| (n / 1_000_000_000) as i64)
            } else {
                0
            },
        }
    }

    /// One provider's hints for `amount` of a resource: `None` when it asks nothing (no
    /// preference), else every mask whose free amount fits, preferred when of the fewest
    /// NUMA nodes whose capacity could hold it.
    fn hints(&self, capacity: &[i64], free: &[i64], amount: i64) -> Option<Vec<Hint>> {
        if amount <= 0 {
            return None;
        }
        let n = self.numa_nodes();
        let mut min_size = usize::MAX;
        let mut out = Vec::new();
        for mask in 1u32..(1 << n) {
            let nodes = (0..n).filter(|i| mask & (1 << i) != 0);
            let cap: i64 = nodes.clone().map(|i| capacity[i]).sum();
            let avail: i64 = nodes.map(|i| free[i]).sum();
            if cap >= amount {
                min_size = min_size.min(mask.count_ones() as usize);
            }
            if avail >= amount {
                out.push(Hint {
                    mask,
                    preferred: false,
                });
            }
        }
        for h in &mut out {
            h.preferred = h.mask.count_ones() as usize == min_size;
        }
        Some(out)
    }

    /// `mergeFilteredHints` (with `filterSingleNumaHints` under single-numa-node): the best
    /// merged hint of the providers' hints.
    fn merge(&self, policy: TopologyPolicy, providers: Vec<Option<Vec<Hint>>>) -> Hint {
        let all = (1u32 << self.numa_nodes()) - 1;
        let dont_care = Hint {
            mask: all,
            preferred: true,
        };
        let lists: Vec<Vec<Hint>> = providers
            .into_iter()
            .map(|p| match p {
                None => vec![dont_care],
                Some(list) if policy == TopologyPolicy::SingleNumaNode => list
                    .into_iter()
                    .filter(|h| h.preferred && h.mask.count_ones() == 1)
                    .collect(),
                Some(list) => list,
            })
            .collect();
        let mut best = Hint {
            mask: all,
            preferred: false,
        };
        // Every permutation: one hint from each provider.
        let mut idx = vec![0usize; lists.len()];
        if lists.iter().any(Vec::is_empty) {
            return best;
        }
        loop {
            let mut mask = all;
            let mut preferred = true;
            for (l, &i) in lists.iter().zip(&idx) {
                mask &= l[i].mask;
                preferred &= l[i].preferred;
            }
            if mask != 0 {
                let better = (preferred && !best.preferred)
                    || (preferred == best.preferred && mask.count_ones() < best.mask.count_ones());
                if better {
                    best = Hint { mask, preferred };
                }
            }
            // Next permutation.
            let mut k = 0;
            loop {
                if k == idx.len() {
                    return best;
                }
                idx[k] += 1;
                if idx[k] < lists[k].len() {
                    break;
                }
                idx[k] = 0;
                k += 1;
            }
        }
    }

    /// Aligns one request: the hint the policy accepts, or `None` (refused).
    fn align(&self, policy: TopologyPolicy, req: Request) -> Option<Hint> {
        let providers = vec![
            self.hints(&self.cpu_capacity, &self.free_cpu, req.cpu_millis),
            self.hints(&self.memory_capacity, &self.free_memory, req.memory),
        ];
        let best = self.merge(policy, providers);
        let admit = match policy {
            TopologyPolicy::None | TopologyPolicy::BestEffort => true,
            TopologyPolicy::Restricted => best.preferred,
            TopologyPolicy::SingleNumaNode => best.preferred && best.mask.count_ones() == 1,
        };
        admit.then_some(best)
    }

    /// Takes `req` from the NUMA nodes of `mask` first (as much as each has, in order),
    /// then from the others (a best-effort hint may be narrower than what fits).
    fn take(&mut self, mask: u32, req: Request) -> Vec<(usize, i64, i64)> {
        let mut out = Vec::new();
        let (mut cpu, mut mem) = (req.cpu_millis, req.memory);
        let n = self.numa_nodes();
        let order = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .chain((0..n).filter(|i| mask & (1 << i) == 0));
        for i in order {
            let c = cpu.min(self.free_cpu[i]).max(0);
            let m = mem.min(self.free_memory[i]).max(0);
            self.free_cpu[i] -= c;
            self.free_memory[i] -= m;
            cpu -= c;
            mem -= m;
            if c > 0 || m > 0 {
                out.push((i, c, m));
            }
        }
        out
    }

    /// The topology manager's `Admit` for a pod: `Ok` (its resources now held on the NUMA
    /// nodes chosen) or `Err` with kubelet's [`TOPOLOGY_AFFINITY_MESSAGE`].
    pub(crate) fn admit(&mut self, config: &TopologyConfig, pod: &Pod) -> Result<(), String> {
        if config.policy == TopologyPolicy::None {
            return Ok(());
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if self.held.contains_key(&uid) {
            return Ok(());
        }
        let guaranteed = crate::swap::pod_qos(pod) == "Guaranteed";
        let containers: Vec<&Container> = pod.spec.iter().flat_map(|s| &s.containers).collect();
        let requests: Vec<Request> = match config.scope {
            TopologyScope::Container => containers
                .iter()
                .map(|c| Self::request_of(config, guaranteed, c))
                .collect(),
            TopologyScope::Pod => vec![containers.iter().fold(Request::default(), |a, c| {
                let r = Self::request_of(config, guaranteed, c);
                Request {
                    cpu_millis: a.cpu_millis + r.cpu_millis,
                    memory: a.memory + r.memory,
                }
            })],
        };
        let mut held = Vec::new();
        for req in requests {
            if req == Request::default() {
                continue;
            }
            let Some(hint) = self.align(config.policy, req) else {
                for (i, c, m) in held {
                    self.free_cpu[i] += c;
                    self.free_memory[i] += m;
                }
                return Err(TOPOLOGY_AFFINITY_MESSAGE.to_owned());
            };
            held.extend(self.take(hint.mask, req));
        }
        self.held.insert(uid, held);
        Ok(())
    }

    /// Gives back what a pod held (it ended or was deleted).
    pub(crate) fn release(&mut self, uid: &str) {
        for (i, c, m) in self.held.remove(uid).into_iter().flatten() {
            self.free_cpu[i] += c;
            self.free_memory[i] += m;
        }
    }

    /// Free `(cpu millis, memory bytes)` per NUMA node.
    pub(crate) fn free(&self) -> Vec<(i64, i64)> {
        self.free_cpu
            .iter()
            .copied()
            .zip(self.free_memory.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn guaranteed(uid: &str, containers: &[(&str, &str)]) -> Pod {
        let cs: Vec<_> = containers
            .iter()
            .enumerate()
            .map(|(i, (cpu, mem))| json!({"name": format!("c{i}"), "resources": {"limits": {"cpu": cpu, "memory": mem}}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": uid, "uid": uid},
            "spec": {"containers": cs},
        }))
        .unwrap()
    }

    fn config(policy: TopologyPolicy, scope: TopologyScope) -> TopologyConfig {
        TopologyConfig {
            policy,
            scope,
            numa_nodes: 2,
            cpu_manager_static: true,
            memory_manager_static: true,
        }
    }

    /// 8 CPUs and 16 GiB on two NUMA nodes: 4 CPUs, 8 GiB each.
    fn machine() -> NumaState {
        NumaState::new(2, 8000, 16 << 30)
    }

    /// `policy_single_numa_node.go`: a Guaranteed pod whose CPUs fit one NUMA node is
    /// admitted there; one asking more than a NUMA node has is refused with
    /// `TopologyAffinityError`, while `best-effort` admits it across both.
    #[test]
    fn single_numa_node_refuses_a_guaranteed_pod_larger_than_one_numa_node() {
        let single = config(TopologyPolicy::SingleNumaNode, TopologyScope::Container);
        let mut m = machine();
        m.admit(&single, &guaranteed("fits", &[("3", "1Gi")]))
            .unwrap();
        assert_eq!(m.free(), [(1000, 7 << 30), (4000, 8 << 30)]);
        assert_eq!(
            m.admit(&single, &guaranteed("big", &[("6", "1Gi")])),
            Err(TOPOLOGY_AFFINITY_MESSAGE.to_owned())
        );
        assert_eq!(m.free(), [(1000, 7 << 30), (4000, 8 << 30)], "nothing held");
        // Fits neither NUMA node now (1 and 4 CPUs free), though 5 are free in all.
        assert!(
            m.admit(&single, &guaranteed("two", &[("2", "1Gi")]))
                .is_ok()
        );
        assert!(
            m.admit(&single, &guaranteed("three", &[("3", "1Gi")]))
                .is_err()
        );
        m.release("fits");
        assert!(
            m.admit(&single, &guaranteed("three", &[("3", "1Gi")]))
                .is_ok()
        );

        let mut m = machine();
        let best_effort = config(TopologyPolicy::BestEffort, TopologyScope::Container);
        m.admit(&best_effort, &guaranteed("big", &[("6", "1Gi")]))
            .unwrap();
        assert_eq!(m.free()[0].0 + m.free()[1].0, 2000);
    }

    /// `policy_restricted.go`: admitted only on a preferred hint. Six CPUs and 12 GiB need
    /// both NUMA nodes even on an empty machine, so the two-node hint is preferred and the
    /// pod is admitted. Once 1 CPU is left on NUMA node 0 and 2 on node 1, 3 CPUs fit only
    /// across both, wider than the one node that could hold them: refused, where
    /// best-effort admits.
    #[test]
    fn restricted_admits_only_on_a_preferred_hint() {
        let restricted = config(TopologyPolicy::Restricted, TopologyScope::Container);
        let mut m = machine();
        m.admit(&restricted, &guaranteed("wide", &[("6", "12Gi")]))
            .unwrap();
        let mut m = machine();
        m.admit(&restricted, &guaranteed("a", &[("2", "1Gi")]))
            .unwrap();
        m.admit(&restricted, &guaranteed("b", &[("1", "1Gi")]))
            .unwrap();
        m.admit(&restricted, &guaranteed("d", &[("2", "1Gi")]))
            .unwrap();
        assert_eq!(m.free(), [(1000, 6 << 30), (2000, 7 << 30)]);
        assert_eq!(
            m.admit(&restricted, &guaranteed("c", &[("3", "1Gi")]))
                .unwrap_err(),
            TOPOLOGY_AFFINITY_MESSAGE
        );
        let best_effort = config(TopologyPolicy::BestEffort, TopologyScope::Container);
        m.admit(&best_effort, &guaranteed("c", &[("3", "1Gi")]))
            .unwrap();
        assert_eq!(m.free(), [(0, 5 << 30), (0, 7 << 30)]);
    }

    /// `scope_pod.go` against `scope_container.go`: two containers of 3 CPUs each fit one
    /// NUMA node each under the container scope, but under the pod scope their 6 CPUs must
    /// share one NUMA node, which single-numa-node refuses. Burstable pods and fractional
    /// CPUs ask for no alignment.
    #[test]
    fn the_pod_scope_aligns_the_containers_together() {
        let two = guaranteed("two", &[("3", "1Gi"), ("3", "1Gi")]);
        let mut m = machine();
        m.admit(
            &config(TopologyPolicy::SingleNumaNode, TopologyScope::Container),
            &two,
        )
        .unwrap();
        let mut m = machine();
        assert!(
            m.admit(
                &config(TopologyPolicy::SingleNumaNode, TopologyScope::Pod),
                &two
            )
            .is_err()
        );
        let fractional = guaranteed("frac", &[("5500m", "1Gi")]);
        let no_memory_manager = TopologyConfig {
            memory_manager_static: false,
            ..config(TopologyPolicy::SingleNumaNode, TopologyScope::Container)
        };
        m.admit(&no_memory_manager, &fractional).unwrap();
        let burstable: Pod = serde_json::from_value(json!({
            "metadata": {"name": "b", "uid": "b"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "7"}}}]},
        }))
        .unwrap();
        m.admit(
            &config(TopologyPolicy::SingleNumaNode, TopologyScope::Container),
            &burstable,
        )
        .unwrap();
        assert_eq!(m.free(), machine().free(), "neither holds a NUMA node");
    }
}
