//! The filter plugins of the default profile that this scheduler runs, in upstream's order
//! (`NodeUnschedulable`, `TaintToleration`, `NodeAffinity`, `NodeResourcesFit`), their
//! reasons, the `LeastAllocated` score and the "0/3 nodes are available: …" message.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint, Toleration},
    apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};

use crate::{registry::quantity::parse_quantity, taint_eviction::tolerates};

/// `NodeUnschedulable`'s reason (`ErrReasonUnschedulable`).
pub const REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
/// `NodeAffinity`'s reason (`ErrReasonPod`).
pub const REASON_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
/// `NodeResourcesFit`'s reason for the pod count.
pub const REASON_TOO_MANY_PODS: &str = "Too many pods";
/// The taint of a cordoned node.
pub const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

/// Amounts of the resources the fit check counts: CPU in millicores, memory in bytes, pods.
///
/// One quantity is at most an int64, as upstream caps it
/// ([`Quantity::MAX`](crate::registry::quantity::Quantity::MAX)); sums are kept in 128 bits
/// and saturate, so no pod (and no number of pods) can overflow a node's accounting, and
/// releasing a pod gives back exactly what it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// CPU, millicores.
    pub milli_cpu: i128,
    /// Memory, bytes.
    pub memory: i128,
    /// Pods.
    pub pods: i128,
}

impl Resources {
    /// Adds `other` to `self`.
    pub fn add(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_add(other.milli_cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.pods = self.pods.saturating_add(other.pods);
    }

    /// Takes `other` from `self`.
    pub fn sub(&mut self, other: &Resources) {
        self.milli_cpu = self.milli_cpu.saturating_sub(other.milli_cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.pods = self.pods.saturating_sub(other.pods);
    }
}

/// The amount of resource `name` in `map`, in millis (`MilliValue()`) or whole units
/// (`Value()`), through the API's own quantity parser.
fn amount(map: Option<&BTreeMap<String, K8sQuantity>>, name: &str, milli: bool) -> Option<i128> {
    let q = parse_quantity(&map?.get(name)?.0).ok()?;
    Some(i128::from(if milli { q.milli_value() } else { q.value() }))
}

fn container_requests(c: &k8s_openapi::api::core::v1::Container) -> Resources {
    let r = c.resources.as_ref();
    let requests = r.and_then(|r| r.requests.as_ref());
    let limits = r.and_then(|r| r.limits.as_ref());
    // A limit without a request defaults the request (API server defaulting).
    let get = |name: &str, milli: bool| {
        amount(requests, name, milli)
            .or_else(|| amount(limits, name, milli))
            .unwrap_or(0)
    };
    Resources {
        milli_cpu: get("cpu", true),
        memory: get("memory", false),
        pods: 0,
    }
}

/// What a pod asks of a node (upstream `computePodResourceRequest`): the sum of its
/// containers' requests, at least each init container's, plus the pod overhead; one pod.
pub fn pod_requests(pod: &Pod) -> Resources {
    let mut total = Resources {
        pods: 1,
        ..Resources::default()
    };
    let Some(spec) = pod.spec.as_ref() else {
        return total;
    };
    for c in &spec.containers {
        total.add(&container_requests(c));
    }
    for c in spec.init_containers.iter().flatten() {
        let r = container_requests(c);
        total.milli_cpu = total.milli_cpu.max(r.milli_cpu);
        total.memory = total.memory.max(r.memory);
    }
    if let Some(overhead) = spec.overhead.as_ref() {
        total.add(&Resources {
            milli_cpu: amount(Some(overhead), "cpu", true).unwrap_or(0),
            memory: amount(Some(overhead), "memory", false).unwrap_or(0),
            pods: 0,
        });
    }
    total
}

/// A node's allocatable resources (`status.allocatable`, else `status.capacity`).
pub fn node_allocatable(node: &Node) -> Resources {
    let status = node.status.as_ref();
    let map = status
        .and_then(|s| s.allocatable.as_ref())
        .or_else(|| status.and_then(|s| s.capacity.as_ref()));
    Resources {
        milli_cpu: amount(map, "cpu", true).unwrap_or(0),
        memory: amount(map, "memory", false).unwrap_or(0),
        pods: amount(map, "pods", false).unwrap_or(0),
    }
}

/// Why a node does not fit a pod: one or more reasons of the first failing plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unfit {
    /// Upstream's reason strings.
    pub reasons: Vec<String>,
    /// Whether preemption could help (only resource shortages can be resolved by it).
    pub resolvable: bool,
}

impl Unfit {
    fn unresolvable(reason: impl Into<String>) -> Self {
        Self {
            reasons: vec![reason.into()],
            resolvable: false,
        }
    }
}

/// What the filters need of a node, parsed once per node change.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    /// The Node.
    pub node: Node,
    /// Its allocatable resources.
    pub allocatable: Resources,
    /// What the pods bound to it request.
    pub requested: Resources,
}

impl NodeFacts {
    /// Facts of `node` with nothing requested yet.
    pub fn new(node: Node) -> Self {
        Self {
            allocatable: node_allocatable(&node),
            node,
            requested: Resources::default(),
        }
    }

    fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }

    fn taints(&self) -> &[Taint] {
        self.node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
    }

    /// Runs the filters for `pod` (whose requests are `requests`) in upstream's order and
    /// stops at the first that fails.
    pub fn filter(&self, pod: &Pod, requests: &Resources) -> Result<(), Unfit> {
        let spec = pod.spec.as_ref();
        let tolerations = spec
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default();
        // NodeUnschedulable: a cordoned node, unless the pod tolerates its taint.
        let cordoned = self
            .node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if cordoned {
            let taint = Taint {
                key: TAINT_UNSCHEDULABLE.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            };
            if !tolerations.iter().any(|t| tolerates(t, &taint)) {
                return Err(Unfit::unresolvable(REASON_UNSCHEDULABLE));
            }
        }
        // TaintToleration: the first NoSchedule/NoExecute taint no toleration matches.
        if let Some(taint) = untolerated_taint(self.taints(), tolerations) {
            return Err(Unfit::unresolvable(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.as_deref().unwrap_or("")
            )));
        }
        // NodeAffinity: nodeSelector and required node affinity.
        if !matches_node_selector(pod, &self.node) {
            return Err(Unfit::unresolvable(REASON_AFFINITY));
        }
        // NodeResourcesFit.
        let mut reasons = Vec::new();
        let (used, free) = (&self.requested, &self.allocatable);
        if used.pods.saturating_add(1) > free.pods {
            reasons.push(REASON_TOO_MANY_PODS.to_owned());
        }
        if requests.milli_cpu > 0
            && used.milli_cpu.saturating_add(requests.milli_cpu) > free.milli_cpu
        {
            reasons.push("Insufficient cpu".to_owned());
        }
        if requests.memory > 0 && used.memory.saturating_add(requests.memory) > free.memory {
            reasons.push("Insufficient memory".to_owned());
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(Unfit {
                reasons,
                resolvable: true,
            })
        }
    }

    /// `NodeResourcesFit`'s default `LeastAllocated` score (0–100) after placing `requests`:
    /// the mean over CPU and memory of the free fraction. Pods without requests count as
    /// upstream's non-zero defaults (100 millicores, 200 MiB).
    pub fn score(&self, requests: &Resources) -> i64 {
        let cpu = if requests.milli_cpu == 0 {
            100
        } else {
            requests.milli_cpu
        };
        let mem = if requests.memory == 0 {
            200 * 1024 * 1024
        } else {
            requests.memory
        };
        let free = |cap: i128, used: i128| {
            if cap <= 0 || used > cap {
                0
            } else {
                (cap - used).saturating_mul(100) / cap
            }
        };
        // Placed pods count at least the defaults too (upstream `NonZeroRequested`; here
        // approximated per pod from the totals), so pods without requests spread out.
        let placed_cpu = self
            .requested
            .milli_cpu
            .max(self.requested.pods.saturating_mul(100));
        let placed_mem = self
            .requested
            .memory
            .max(self.requested.pods.saturating_mul(200 * 1024 * 1024));
        let mean = (free(self.allocatable.milli_cpu, placed_cpu.saturating_add(cpu))
            + free(self.allocatable.memory, placed_mem.saturating_add(mem)))
            / 2;
        mean as i64
    }

    /// The node's name, for messages.
    pub fn node_name(&self) -> &str {
        self.name()
    }
}

/// The first taint with effect NoSchedule or NoExecute that no toleration tolerates
/// (upstream `FindMatchingUntoleratedTaint`).
pub fn untolerated_taint<'a>(taints: &'a [Taint], tolerations: &[Toleration]) -> Option<&'a Taint> {
    taints.iter().find(|taint| {
        matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerations.iter().any(|t| tolerates(t, taint))
    })
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    // An empty term matches nothing (upstream: "a null or empty node selector term
    // matches no objects").
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let labels = node.metadata.labels.as_ref();
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.and_then(|l| l.get(&r.key)).map(String::as_str)))
        && fields.iter().all(|r| {
            r.key == "metadata.name" && requirement_matches(r, node.metadata.name.as_deref())
        })
}

/// `NodeAffinity`'s filter: every `nodeSelector` label, and one of the required node
/// affinity terms.
pub fn matches_node_selector(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let labels = node.metadata.labels.as_ref();
    if let Some(selector) = spec.node_selector.as_ref()
        && !selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(r) => r.node_selector_terms.iter().any(|t| term_matches(t, node)),
        None => true,
    }
}

/// Upstream's `FitError` message: "0/3 nodes are available: 1 Insufficient cpu, 2 node(s)
/// were unschedulable. preemption: 0/3 nodes are available: …". Reason counts are sorted
/// as strings, as upstream sorts them; the preemption part says what `DefaultPreemption`
/// says when it finds no victim.
pub fn fit_error_message(total: usize, unfits: &[Unfit]) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".to_owned();
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let (mut resolvable, mut unresolvable) = (0, 0);
    for u in unfits {
        for r in &u.reasons {
            *counts.entry(r.as_str()).or_default() += 1;
        }
        if u.resolvable {
            resolvable += 1;
        } else {
            unresolvable += 1;
        }
    }
    let mut histogram: Vec<String> = counts.iter().map(|(r, n)| format!("{n} {r}")).collect();
    histogram.sort();
    let mut preemption = Vec::new();
    if unresolvable > 0 {
        preemption.push(format!(
            "{unresolvable} Preemption is not helpful for scheduling"
        ));
    }
    if resolvable > 0 {
        preemption.push(format!(
            "{resolvable} No preemption victims found for incoming pod"
        ));
    }
    preemption.sort();
    format!(
        "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {}.",
        histogram.join(", "),
        preemption.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(v: serde_json::Value) -> NodeFacts {
        NodeFacts::new(serde_json::from_value(v).unwrap())
    }

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    /// Upstream `fitsRequest` with `computePodResourceRequest`'s sum: two containers of
    /// `cpu: 5e15` ask more millicores than an int64 holds, 9Ei of memory is capped at the
    /// largest int64 (as `ParseQuantity` caps it), and 5Ei and 1E are read in full; none
    /// fits, and a node's accounting gives back exactly what a pod took.
    #[test]
    fn requests_beyond_int64_do_not_fit_and_do_not_overflow() {
        let n = node(json!({"metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}));
        let cpu = pod(json!({"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "5e15"}}},
            {"name": "b", "resources": {"requests": {"cpu": "5e15"}}}]}));
        let r = pod_requests(&cpu);
        assert_eq!(r.milli_cpu, 10_000_000_000_000_000_000);
        assert_eq!(
            n.filter(&cpu, &r).unwrap_err().reasons,
            ["Insufficient cpu"]
        );
        for (memory, bytes) in [
            ("9Ei", i128::from(i64::MAX)),
            ("5Ei", 5 << 60),
            ("1E", 10i128.pow(18)),
        ] {
            let p = pod(json!({"containers": [
                {"name": "a", "resources": {"requests": {"memory": memory}}}]}));
            let r = pod_requests(&p);
            assert_eq!(r.memory, bytes, "{memory}");
            assert_eq!(
                n.filter(&p, &r).unwrap_err().reasons,
                ["Insufficient memory"],
                "{memory}"
            );
        }
        let mut used = Resources::default();
        let before = used;
        for _ in 0..3 {
            used.add(&r);
        }
        for _ in 0..3 {
            used.sub(&r);
        }
        assert_eq!(used, before);
    }

    /// Upstream `computePodResourceRequest`: containers add up, an init container counts
    /// if larger, limits default requests.
    #[test]
    fn pod_requests_follow_upstream() {
        let p = pod(json!({
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "200m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "300m"}}},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "1", "memory": "1Mi"}}}],
        }));
        assert_eq!(
            pod_requests(&p),
            Resources {
                milli_cpu: 1000,
                memory: 1 << 30,
                pods: 1
            }
        );
    }

    #[test]
    fn filters_in_upstream_order() {
        let alloc = json!({"cpu": "1", "memory": "1Gi", "pods": "2"});
        let cordoned = node(
            json!({"metadata": {"name": "a"}, "spec": {"unschedulable": true,
            "taints": [{"key": "x", "effect": "NoSchedule"}]}, "status": {"allocatable": alloc}}),
        );
        let p = pod(json!({"containers": [{"name": "c"}]}));
        let r = pod_requests(&p);
        assert_eq!(
            cordoned.filter(&p, &r).unwrap_err().reasons,
            [REASON_UNSCHEDULABLE]
        );
        let tainted = node(json!({"metadata": {"name": "b"}, "spec": {
            "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}, {"key": "soft", "effect": "PreferNoSchedule"}]},
            "status": {"allocatable": alloc}}));
        assert_eq!(
            tainted.filter(&p, &r).unwrap_err().reasons,
            ["node(s) had untolerated taint {gpu: yes}"]
        );
        let tolerant = pod(json!({"containers": [{"name": "c"}],
            "tolerations": [{"key": "gpu", "operator": "Exists"}]}));
        assert!(tainted.filter(&tolerant, &r).is_ok());
        let mut full = node(json!({"metadata": {"name": "c", "labels": {"disk": "ssd"}},
            "status": {"allocatable": alloc}}));
        let big = pod(
            json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}]}),
        );
        let unfit = full.filter(&big, &pod_requests(&big)).unwrap_err();
        assert_eq!(unfit.reasons, ["Insufficient cpu", "Insufficient memory"]);
        assert!(unfit.resolvable);
        full.requested.pods = 2;
        assert_eq!(
            full.filter(&p, &r).unwrap_err().reasons,
            [REASON_TOO_MANY_PODS]
        );
    }

    #[test]
    fn node_selector_and_required_affinity() {
        let n = node(json!({"metadata": {"name": "n1", "labels": {"zone": "a", "cores": "8"}}}));
        let sel = |s: serde_json::Value| matches_node_selector(&pod(s), &n.node);
        assert!(sel(
            json!({"containers": [], "nodeSelector": {"zone": "a"}})
        ));
        assert!(!sel(
            json!({"containers": [], "nodeSelector": {"zone": "b"}})
        ));
        let aff = |terms: serde_json::Value| {
            sel(json!({"containers": [], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}))
        };
        assert!(aff(
            json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}])
        ));
        assert!(!aff(
            json!([{"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}])
        ));
        assert!(aff(
            json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])
        ));
        assert!(!aff(
            json!([{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}])
        ));
        assert!(!aff(json!([{}])), "an empty term matches nothing");
    }

    /// Upstream `FitError.Error()`: "0/N nodes are available: <sorted histogram>." then the
    /// preemption post-filter's own message.
    #[test]
    fn fit_error_message_as_upstream() {
        let unfits = vec![
            Unfit::unresolvable(REASON_UNSCHEDULABLE),
            Unfit {
                reasons: vec!["Insufficient cpu".into()],
                resolvable: true,
            },
            Unfit::unresolvable("node(s) had untolerated taint {gpu: yes}"),
        ];
        assert_eq!(
            fit_error_message(3, &unfits),
            "0/3 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {gpu: yes}, 1 node(s) were unschedulable. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling."
        );
        assert_eq!(
            fit_error_message(0, &[]),
            "no nodes available to schedule pods"
        );
    }
}
