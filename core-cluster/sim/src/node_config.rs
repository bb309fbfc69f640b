//! The simulator config file: [`NodeConfigFile`] says what it holds and how it reads.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

use core_cluster_machinery::registry::quantity::parse_quantity;
use k8s_openapi::api::core::v1::Taint;
use serde::Deserialize;

use crate::{
    SimConfig, SimNode,
    registration::{is_qualified_name, is_valid_label_value, parse_node_labels, parse_reserved},
    shutdown::ShutdownPriorityGroup,
    swap::{CgroupVersion, SwapBehavior},
    topology::{TopologyPolicy, TopologyScope},
};

/// The file's `apiVersion`.
pub const NODE_CONFIG_API_VERSION: &str = "sim.ccm-rs.io/v1alpha1";
/// The file's `kind`.
pub const NODE_CONFIG_KIND: &str = "NodeSimulatorConfiguration";
/// The `apiVersion` of the `kubelet` objects.
pub const KUBELET_CONFIG_API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";

/// A simulator config file kubelet (or the simulator) would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{field}: {message}", node.as_ref().map(|n| format!("node {n:?}: ")).unwrap_or_default())]
pub struct NodeConfigError {
    /// The node (or group's first node) whose settings are wrong; `None` for the file's
    /// own fields and defaults.
    pub node: Option<String>,
    /// The field, as the file names it.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

/// The simulated machine of a node.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineSpec {
    /// CPUs (`"8"`, `"7500m"`).
    pub cpu: Option<String>,
    /// Memory (`"32Gi"`).
    pub memory: Option<String>,
    /// The root filesystem (`ephemeral-storage` capacity).
    pub ephemeral_storage: Option<String>,
    /// Swap (`"4Gi"`; none by default).
    pub swap: Option<String>,
    /// NUMA nodes, sharing CPUs and memory evenly (1).
    pub numa_nodes: Option<usize>,
    /// The cgroup version, `1` or `2` (2): swap limits need cgroup v2.
    pub cgroup_version: Option<i64>,
}

/// `memorySwap`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemorySwap {
    /// `swapBehavior`.
    pub swap_behavior: Option<String>,
}

/// One `shutdownGracePeriodByPodPriority` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityGracePeriod {
    /// `priority`.
    pub priority: i32,
    /// `shutdownGracePeriodSeconds`.
    pub shutdown_grace_period_seconds: i64,
}

/// The fields of `KubeletConfiguration` the simulator plays; others are accepted and
/// ignored (with a warning), as they change nothing a simulated node shows.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    /// `apiVersion`: `kubelet.config.k8s.io/v1beta1` when given.
    pub api_version: Option<String>,
    /// `kind`: `KubeletConfiguration` when given.
    pub kind: Option<String>,
    /// `registerNode`.
    pub register_node: Option<bool>,
    /// `registerWithTaints`.
    pub register_with_taints: Option<Vec<Taint>>,
    /// `kubeReserved`.
    pub kube_reserved: Option<BTreeMap<String, String>>,
    /// `systemReserved`.
    pub system_reserved: Option<BTreeMap<String, String>>,
    /// `evictionHard` (`signal: value`).
    pub eviction_hard: Option<BTreeMap<String, String>>,
    /// `evictionPressureTransitionPeriod`.
    pub eviction_pressure_transition_period: Option<String>,
    /// `maxPods`.
    pub max_pods: Option<i64>,
    /// `failSwapOn`.
    pub fail_swap_on: Option<bool>,
    /// `failCgroupV1`.
    #[serde(rename = "failCgroupV1")]
    pub fail_cgroup_v1: Option<bool>,
    /// `featureGates`: `NodeSwap` is simulated; other gates are ignored (with a warning).
    pub feature_gates: Option<BTreeMap<String, bool>>,
    /// `memorySwap`.
    pub memory_swap: Option<MemorySwap>,
    /// `topologyManagerPolicy`.
    pub topology_manager_policy: Option<String>,
    /// `topologyManagerScope`.
    pub topology_manager_scope: Option<String>,
    /// `cpuManagerPolicy` (`none`, `static`).
    pub cpu_manager_policy: Option<String>,
    /// `memoryManagerPolicy` (`None`, `Static`).
    pub memory_manager_policy: Option<String>,
    /// `imageGCHighThresholdPercent`.
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i64>,
    /// `imageGCLowThresholdPercent`.
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i64>,
    /// `imageMinimumGCAge`.
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<String>,
    /// `imageMaximumGCAge`.
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<String>,
    /// `nodeStatusMaxImages`.
    pub node_status_max_images: Option<i64>,
    /// `shutdownGracePeriod`.
    pub shutdown_grace_period: Option<String>,
    /// `shutdownGracePeriodCriticalPods`.
    pub shutdown_grace_period_critical_pods: Option<String>,
    /// `shutdownGracePeriodByPodPriority`.
    pub shutdown_grace_period_by_pod_priority: Option<Vec<PriorityGracePeriod>>,
    /// `serverTLSBootstrap`.
    #[serde(rename = "serverTLSBootstrap")]
    pub server_tls_bootstrap: Option<bool>,
    /// Every other field, ignored.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// One entry of `nodes`: a node (`name`) or a group (`names`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeEntry {
    /// The node's name (the machine's hostname).
    pub name: Option<String>,
    /// The names of a group of nodes sharing these settings.
    #[serde(default)]
    pub names: Vec<String>,
    /// `topology.kubernetes.io/zone` of a node the file adds.
    pub zone: Option<String>,
    /// `--node-ip` (one node only).
    #[serde(rename = "nodeIP")]
    pub node_ip: Option<String>,
    /// `--hostname-override`: the Node's name, `kubernetes.io/hostname` label and
    /// `Hostname` address (one node only).
    pub hostname_override: Option<String>,
    /// `--node-labels`.
    pub node_labels: Option<BTreeMap<String, String>>,
    /// The simulated machine.
    pub machine: Option<MachineSpec>,
    /// The node's KubeletConfiguration, over the file's.
    pub kubelet: Option<KubeletConfiguration>,
}

/// The simulator config file: the simulated kubelets' configuration, per node or group of
/// nodes, each in KubeletConfiguration's shape (`kubelet.config.k8s.io/v1beta1`,
/// `pkg/kubelet/apis/config/types.go`), with the settings kubelet takes only as flags
/// (`--node-ip`, `--hostname-override`, `--node-labels`) and the simulated machine
/// (CPUs, memory, swap, NUMA nodes) beside it.
///
/// ```yaml
/// apiVersion: sim.ccm-rs.io/v1alpha1
/// kind: NodeSimulatorConfiguration
/// kubelet:                        # every node's, over the --sim-* flags
///   apiVersion: kubelet.config.k8s.io/v1beta1
///   kind: KubeletConfiguration
///   imageGCHighThresholdPercent: 90
/// machine: {cpu: "8", memory: 32Gi}
/// nodes:
///   - names: [sim-node-0, sim-node-1]   # a group
///     nodeLabels: {pool: swap}
///     machine: {swap: 4Gi, cgroupVersion: 2}
///     kubelet:
///       featureGates: {NodeSwap: true}
///       failSwapOn: false
///       memorySwap: {swapBehavior: LimitedSwap}
///   - name: big-0                       # a node not among --sim-nodes is added
///     zone: zone-b
///     nodeIP: 10.1.0.7
///     hostnameOverride: big-0.example
///     machine: {cpu: "64", memory: 256Gi, numaNodes: 2}
///     kubelet:
///       cpuManagerPolicy: static
///       topologyManagerPolicy: single-numa-node
///       registerWithTaints: [{key: dedicated, value: big, effect: NoSchedule}]
/// ```
///
/// A node's settings are the flags', then the file's `kubelet` and `machine`, then its
/// entry's, field by field. Anything kubelet would refuse is an error naming the node and
/// the field ([`NodeConfigError`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfigFile {
    /// [`NODE_CONFIG_API_VERSION`].
    pub api_version: String,
    /// [`NODE_CONFIG_KIND`].
    pub kind: String,
    /// Every node's KubeletConfiguration.
    pub kubelet: Option<KubeletConfiguration>,
    /// Every node's machine.
    pub machine: Option<MachineSpec>,
    /// `--node-labels` of every node.
    pub node_labels: Option<BTreeMap<String, String>>,
    /// Nodes and groups.
    #[serde(default)]
    pub nodes: Vec<NodeEntry>,
}

/// A Go duration (`metav1.Duration`: `90s`, `1h30m`, `500ms`).
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(format!("invalid duration {s:?}"));
    }
    while !rest.is_empty() {
        let n_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("invalid duration {s:?}: missing unit"))?;
        let (number, tail) = rest.split_at(n_end);
        let n: f64 = number
            .parse()
            .map_err(|_| format!("invalid duration {s:?}"))?;
        let u_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(u_end);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(format!("invalid duration {s:?}: unknown unit {unit:?}")),
        };
        total += n * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// `ParseNodeIPArgument` and `validateNodeIP`: one IP, not loopback, multicast, link-local
/// or all zeros (a dual-stack pair is not simulated).
pub fn parse_node_ip(s: &str) -> Result<IpAddr, String> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() > 1 {
        return Err(format!(
            "{s:?}: a dual-stack --node-ip is not simulated (one IP per node)"
        ));
    }
    let ip: IpAddr = parts[0]
        .parse()
        .map_err(|_| format!("could not parse {:?}", parts[0]))?;
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    if ip.is_loopback() {
        return Err("nodeIP can't be loopback address".into());
    }
    if ip.is_multicast() {
        return Err("nodeIP can't be a multicast address".into());
    }
    if link_local {
        return Err("nodeIP can't be a link-local unicast address".into());
    }
    if ip.is_unspecified() {
        return Err("nodeIP can't be an all zeros address".into());
    }
    Ok(ip)
}

/// `nodeutil.GetHostname`: trimmed, lower-cased, a DNS-1123 subdomain.
fn hostname(s: &str) -> Result<String, String> {
    let h = s.trim().to_lowercase();
    if h.is_empty() {
        return Err("empty hostname is invalid".into());
    }
    let ok = h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !ok {
        return Err(format!(
            "{h:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(h)
}

/// Field-by-field overlay: `over`'s fields that are set replace `base`'s.
fn overlay(base: &KubeletConfiguration, over: &KubeletConfiguration) -> KubeletConfiguration {
    macro_rules! pick {
        ($($f:ident),*) => {
            KubeletConfiguration {
                $($f: over.$f.clone().or_else(|| base.$f.clone()),)*
                other: base.other.clone().into_iter().chain(over.other.clone()).collect(),
            }
        };
    }
    pick!(
        api_version,
        kind,
        register_node,
        register_with_taints,
        kube_reserved,
        system_reserved,
        eviction_hard,
        eviction_pressure_transition_period,
        max_pods,
        fail_swap_on,
        fail_cgroup_v1,
        feature_gates,
        memory_swap,
        topology_manager_policy,
        topology_manager_scope,
        cpu_manager_policy,
        memory_manager_policy,
        image_gc_high_threshold_percent,
        image_gc_low_threshold_percent,
        image_minimum_gc_age,
        image_maximum_gc_age,
        node_status_max_images,
        shutdown_grace_period,
        shutdown_grace_period_critical_pods,
        shutdown_grace_period_by_pod_priority,
        server_tls_bootstrap
    )
}

fn overlay_machine(base: &MachineSpec, over: &MachineSpec) -> MachineSpec {
    MachineSpec {
        cpu: over.cpu.clone().or_else(|| base.cpu.clone()),
        memory: over.memory.clone().or_else(|| base.memory.clone()),
        ephemeral_storage: over
            .ephemeral_storage
            .clone()
            .or_else(|| base.ephemeral_storage.clone()),
        swap: over.swap.clone().or_else(|| base.swap.clone()),
        numa_nodes: over.numa_nodes.or(base.numa_nodes),
        cgroup_version: over.cgroup_version.or(base.cgroup_version),
    }
}

type FieldResult<T> = Result<T, (String, String)>;

fn field<T>(name: &str, r: Result<T, String>) -> FieldResult<T> {
    r.map_err(|m| (name.to_owned(), m))
}

fn bytes_of(name: &str, v: &str) -> FieldResult<u64> {
    let q = field(name, parse_quantity(v).map_err(|e| format!("{v:?}: {e}")))?;
    if q.is_negative() {
        return Err((name.into(), format!("{v:?} must not be negative")));
    }
    Ok(q.value().max(0) as u64)
}

fn percent(name: &str, v: i64) -> FieldResult<u8> {
    u8::try_from(v)
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| (name.into(), format!("{v} must be between 0 and 100")))
}

/// Applies a KubeletConfiguration and a machine to `config`, checking each field.
fn apply(
    config: &mut SimConfig,
    k: &KubeletConfiguration,
    m: &MachineSpec,
    labels: Option<&BTreeMap<String, String>>,
) -> FieldResult<()> {
    if let Some(v) = &k.api_version
        && v != KUBELET_CONFIG_API_VERSION
    {
        return Err((
            "kubelet.apiVersion".into(),
            format!("{v:?}: must be {KUBELET_CONFIG_API_VERSION}"),
        ));
    }
    if let Some(v) = &k.kind
        && v != "KubeletConfiguration"
    {
        return Err((
            "kubelet.kind".into(),
            format!("{v:?}: must be KubeletConfiguration"),
        ));
    }
    if let Some(v) = k.register_node {
        config.register_node = v;
    }
    if let Some(taints) = &k.register_with_taints {
        let spec = taints
            .iter()
            .map(|t| {
                format!(
                    "{}{}:{}",
                    t.key,
                    t.value
                        .as_deref()
                        .map(|v| format!("={v}"))
                        .unwrap_or_default(),
                    t.effect
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut parsed = field(
            "registerWithTaints",
            crate::registration::parse_register_with_taints(&spec),
        )?;
        // The cloud provider's uninitialized taint stays.
        if config.external_cloud_provider
            && !parsed
                .iter()
                .any(|t| t.key == crate::UNINITIALIZED_TAINT_KEY)
        {
            parsed.push(crate::uninitialized_taint());
        }
        config.register_with_taints = parsed;
    }
    if let Some(labels) = labels {
        for (key, value) in labels {
            if !is_qualified_name(key) || !is_valid_label_value(value) {
                return Err((
                    "nodeLabels".into(),
                    format!("invalid node labels: {key}={value}"),
                ));
            }
        }
        let joined = labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let parsed = field("nodeLabels", parse_node_labels(&joined))?;
        config.node_labels.extend(parsed);
    }
    let reserved = |name: &str, map: &BTreeMap<String, String>| {
        let joined = map
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        field(name, parse_reserved(&joined))
    };
    if let Some(map) = &k.kube_reserved {
        config.kube_reserved = reserved("kubeReserved", map)?;
    }
    if let Some(map) = &k.system_reserved {
        config.system_reserved = reserved("systemReserved", map)?;
    }
    if let Some(map) = &k.eviction_hard {
        let joined = map
            .iter()
            .map(|(k, v)| format!("{k}<{v}"))
            .collect::<Vec<_>>()
            .join(",");
        config.eviction.hard = field("evictionHard", crate::parse_eviction_hard(&joined))?;
    }
    let duration = |name: &str, v: &Option<String>| -> FieldResult<Option<Duration>> {
        v.as_deref()
            .map(|s| field(name, parse_go_duration(s)))
            .transpose()
    };
    if let Some(d) = duration(
        "evictionPressureTransitionPeriod",
        &k.eviction_pressure_transition_period,
    )? {
        config.eviction.pressure_transition_period = d;
    }
    if let Some(n) = k.max_pods {
        if n < 0 {
            return Err(("maxPods".into(), format!("{n} must not be negative")));
        }
        config.capacity.pods = n.to_string();
    }
    if let Some(v) = k.server_tls_bootstrap {
        config.server_tls_bootstrap = v;
    }
    if let Some(v) = k.fail_swap_on {
        config.swap.fail_swap_on = v;
    }
    if let Some(v) = k.fail_cgroup_v1 {
        config.swap.fail_cgroup_v1 = v;
    }
    for (gate, on) in k.feature_gates.iter().flatten() {
        match gate.as_str() {
            "NodeSwap" => config.swap.node_swap_gate = *on,
            other => {
                tracing::warn!(
                    gate = other,
                    "simulator config: feature gate not simulated, ignored"
                )
            }
        }
    }
    if let Some(v) = k
        .memory_swap
        .as_ref()
        .and_then(|m| m.swap_behavior.as_deref())
    {
        // ValidateKubeletConfiguration: memorySwap only with the NodeSwap gate.
        if !config.swap.node_swap_gate && !v.is_empty() {
            return Err((
                "memorySwap.swapBehavior".into(),
                "cannot be set when NodeSwap feature flag is disabled".into(),
            ));
        }
        config.swap.behavior = field("memorySwap.swapBehavior", SwapBehavior::parse(v))?;
    }
    if let Some(v) = &k.topology_manager_policy {
        config.topology.policy = field("topologyManagerPolicy", TopologyPolicy::parse(v))?;
    }
    if let Some(v) = &k.topology_manager_scope {
        config.topology.scope = field("topologyManagerScope", TopologyScope::parse(v))?;
    }
    if let Some(v) = &k.cpu_manager_policy {
        config.topology.cpu_manager_static = match v.as_str() {
            "none" | "" => false,
            "static" => true,
            other => {
                return Err((
                    "cpuManagerPolicy".into(),
                    format!("unknown policy {other:?}: must be none or static"),
                ));
            }
        };
    }
    if let Some(v) = &k.memory_manager_policy {
        config.topology.memory_manager_static = match v.as_str() {
            "None" | "" => false,
            "Static" => true,
            other => {
                return Err((
                    "memoryManagerPolicy".into(),
                    format!("unknown policy {other:?}: must be None or Static"),
                ));
            }
        };
    }
    if let Some(v) = k.image_gc_high_threshold_percent {
        config.image_gc.high_threshold_percent = percent("imageGCHighThresholdPercent", v)?;
    }
    if let Some(v) = k.image_gc_low_threshold_percent {
        config.image_gc.low_threshold_percent = percent("imageGCLowThresholdPercent", v)?;
    }
    if let Some(d) = duration("imageMinimumGCAge", &k.image_minimum_gc_age)? {
        config.image_gc.minimum_gc_age = d;
    }
    if let Some(d) = duration("imageMaximumGCAge", &k.image_maximum_gc_age)? {
        config.image_gc.maximum_gc_age = d;
    }
    if let Some(n) = k.node_status_max_images {
        // -1: no cap.
        config.image_gc.node_status_max_images = match n {
            -1 => usize::MAX,
            n if n >= 0 => n as usize,
            n => {
                return Err((
                    "nodeStatusMaxImages".into(),
                    format!("{n} must be -1 or greater"),
                ));
            }
        };
    }
    if let Some(d) = duration("shutdownGracePeriod", &k.shutdown_grace_period)? {
        config.shutdown_grace_period = d;
    }
    if let Some(d) = duration(
        "shutdownGracePeriodCriticalPods",
        &k.shutdown_grace_period_critical_pods,
    )? {
        config.shutdown_grace_period_critical_pods = d;
    }
    if let Some(groups) = &k.shutdown_grace_period_by_pod_priority {
        config.shutdown_grace_period_by_pod_priority = groups
            .iter()
            .map(|g| {
                u64::try_from(g.shutdown_grace_period_seconds)
                    .map(|s| ShutdownPriorityGroup {
                        priority: g.priority,
                        grace_period: Duration::from_secs(s),
                    })
                    .map_err(|_| {
                        (
                            "shutdownGracePeriodByPodPriority".to_owned(),
                            format!(
                                "shutdownGracePeriodSeconds {} must not be negative",
                                g.shutdown_grace_period_seconds
                            ),
                        )
                    })
            })
            .collect::<FieldResult<_>>()?;
    }
    if let Some(v) = &m.cpu {
        let q = field(
            "machine.cpu",
            parse_quantity(v).map_err(|e| format!("{v:?}: {e}")),
        )?;
        if q.is_negative() || q.nanos() == 0 {
            return Err(("machine.cpu".into(), format!("{v:?} must be positive")));
        }
        config.capacity.cpu = v.clone();
    }
    if let Some(v) = &m.memory {
        if bytes_of("machine.memory", v)? == 0 {
            return Err(("machine.memory".into(), format!("{v:?} must be positive")));
        }
        config.capacity.memory = v.clone();
    }
    if let Some(v) = &m.ephemeral_storage {
        bytes_of("machine.ephemeralStorage", v)?;
        config.capacity.ephemeral_storage = v.clone();
    }
    if let Some(v) = &m.swap {
        config.swap.capacity = bytes_of("machine.swap", v)?;
    }
    if let Some(n) = m.numa_nodes {
        config.topology.numa_nodes = n;
    }
    if let Some(n) = m.cgroup_version {
        config.swap.cgroup_version = field("machine.cgroupVersion", CgroupVersion::parse(n))?;
    }
    config
        .recompute_allocatable()
        .map_err(|e| (e.field.to_owned(), e.message))?;
    config
        .validate()
        .map_err(|e| (e.field.to_owned(), e.message))?;
    config
        .swap
        .validate()
        .map_err(|(field, message)| (field.to_owned(), message))?;
    Ok(())
}

impl NodeConfigFile {
    /// Parses a file's YAML (errors name the line and the field).
    pub fn parse(text: &str) -> Result<Self, NodeConfigError> {
        let file: Self = serde_norway::from_str(text).map_err(|e| NodeConfigError {
            node: None,
            field: "(file)".into(),
            message: e.to_string(),
        })?;
        if file.api_version != NODE_CONFIG_API_VERSION || file.kind != NODE_CONFIG_KIND {
            return Err(NodeConfigError {
                node: None,
                field: "apiVersion/kind".into(),
                message: format!(
                    "{}/{}: must be {NODE_CONFIG_API_VERSION}/{NODE_CONFIG_KIND}",
                    file.api_version, file.kind
                ),
            });
        }
        Ok(file)
    }

    /// The simulator's default configuration and its nodes: `base` (the flags') under the
    /// file's `kubelet` and `machine`, then each entry's settings on its nodes. `nodes` are
    /// the nodes already asked for; an entry naming another node adds it (with the entry's
    /// zone). A node whose settings differ from the default gets its own
    /// [`SimNode::config`].
    pub fn apply(
        &self,
        base: &SimConfig,
        mut nodes: Vec<SimNode>,
    ) -> Result<(SimConfig, Vec<SimNode>), NodeConfigError> {
        let kubelet = self.kubelet.clone().unwrap_or_default();
        let machine = self.machine.clone().unwrap_or_default();
        let mut default = base.clone();
        apply(&mut default, &kubelet, &machine, self.node_labels.as_ref()).map_err(
            |(field, message)| NodeConfigError {
                node: None,
                field,
                message,
            },
        )?;
        for key in kubelet.other.keys() {
            tracing::warn!(field = %key, "simulator config: KubeletConfiguration field not simulated, ignored");
        }
        let mut seen = BTreeSet::new();
        for entry in &self.nodes {
            let names: Vec<String> = entry
                .name
                .iter()
                .chain(&entry.names)
                .map(|n| n.trim().to_owned())
                .collect();
            let first = names.first().cloned();
            let err = |field: &str, message: String| NodeConfigError {
                node: first.clone(),
                field: field.into(),
                message,
            };
            if names.is_empty() {
                return Err(err("name", "an entry needs a name or names".into()));
            }
            if names.len() > 1 && (entry.node_ip.is_some() || entry.hostname_override.is_some()) {
                return Err(err(
                    if entry.node_ip.is_some() {
                        "nodeIP"
                    } else {
                        "hostnameOverride"
                    },
                    "one node's flag: give it to an entry of one name".into(),
                ));
            }
            let over = entry.kubelet.clone().unwrap_or_default();
            for key in over.other.keys() {
                tracing::warn!(node = ?first, field = %key, "simulator config: KubeletConfiguration field not simulated, ignored");
            }
            let mut config = default.clone();
            apply(
                &mut config,
                &overlay(&kubelet, &over),
                &overlay_machine(&machine, &entry.machine.clone().unwrap_or_default()),
                entry.node_labels.as_ref(),
            )
            .map_err(|(field, message)| err(&field, message))?;
            let ip = entry
                .node_ip
                .as_deref()
                .map(|s| parse_node_ip(s).map_err(|m| err("nodeIP", m)))
                .transpose()?;
            let renamed = entry
                .hostname_override
                .as_deref()
                .map(|s| hostname(s).map_err(|m| err("hostnameOverride", m)))
                .transpose()?;
            let config = Arc::new(config);
            for name in &names {
                hostname(name).map_err(|m| NodeConfigError {
                    node: Some(name.clone()),
                    field: "name".into(),
                    message: m,
                })?;
                if !seen.insert(name.clone()) {
                    return Err(NodeConfigError {
                        node: Some(name.clone()),
                        field: "name".into(),
                        message: "named by two entries".into(),
                    });
                }
                let node = match nodes.iter_mut().find(|n| n.name == *name) {
                    Some(n) => n,
                    None => {
                        let mut n = SimNode::new(name.clone());
                        n.zone = entry.zone.clone();
                        nodes.push(n);
                        nodes.last_mut().expect("just pushed")
                    }
                };
                if let Some(zone) = &entry.zone {
                    node.zone = Some(zone.clone());
                }
                if let Some(ip) = ip {
                    node.ip = Some(ip);
                }
                if let Some(h) = &renamed {
                    node.name = h.clone();
                }
                node.config = Some(config.clone());
            }
        }
        let mut names = BTreeSet::new();
        for n in &nodes {
            if !names.insert(n.name.clone()) {
                return Err(NodeConfigError {
                    node: Some(n.name.clone()),
                    field: "hostnameOverride".into(),
                    message: "two nodes would register under this name".into(),
                });
            }
        }
        Ok((default, nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
apiVersion: sim.ccm-rs.io/v1alpha1
kind: NodeSimulatorConfiguration
kubelet:
  apiVersion: kubelet.config.k8s.io/v1beta1
  kind: KubeletConfiguration
  imageGCHighThresholdPercent: 90
  cgroupDriver: systemd
machine: {cpu: "8", memory: 32Gi}
nodes:
  - names: [n-0, n-1]
    nodeLabels: {pool: swap}
    machine: {swap: 4Gi}
    kubelet:
      failSwapOn: false
      memorySwap: {swapBehavior: LimitedSwap}
      kubeReserved: {cpu: 500m, memory: 1Gi}
  - name: big-0
    zone: zone-b
    nodeIP: 10.1.0.7
    hostnameOverride: Big-0.Example
    machine: {cpu: "64", memory: 256Gi, numaNodes: 2}
    kubelet:
      cpuManagerPolicy: static
      topologyManagerPolicy: single-numa-node
      topologyManagerScope: pod
      registerWithTaints: [{key: dedicated, value: big, effect: NoSchedule}]
      shutdownGracePeriodByPodPriority:
        - {priority: 0, shutdownGracePeriodSeconds: 20}
"#;

    /// `pkg/kubelet/apis/config/types.go`: each node's KubeletConfiguration over the file's
    /// over the flags', field by field; `--node-ip` and `--hostname-override` per node
    /// (`nodeutil.GetHostname` lower-cases); a node the file names that the flags did not
    /// is added.
    #[test]
    fn each_node_gets_the_files_kubelet_configuration_over_the_flags() {
        let file = NodeConfigFile::parse(FILE).unwrap();
        let nodes = vec![
            SimNode::new("n-0"),
            SimNode::new("n-1"),
            SimNode::new("n-2"),
        ];
        let (default, nodes) = file.apply(&SimConfig::default(), nodes).unwrap();
        assert_eq!(default.image_gc.high_threshold_percent, 90);
        assert_eq!(default.capacity.cpu, "8");
        assert_eq!(nodes.len(), 4);
        let n0 = nodes[0].config.as_ref().unwrap();
        assert!(
            Arc::ptr_eq(n0, nodes[1].config.as_ref().unwrap()),
            "a group shares one"
        );
        assert_eq!(n0.swap.capacity, 4 << 30);
        assert!(!n0.swap.fail_swap_on);
        assert_eq!(n0.swap.behavior, SwapBehavior::LimitedSwap);
        assert_eq!(n0.image_gc.high_threshold_percent, 90, "the file's default");
        assert_eq!(n0.node_labels["pool"], "swap");
        assert_eq!(n0.allocatable.cpu, "7500m");
        assert_eq!(n0.allocatable.memory, "31644Mi", "32Gi - 1Gi - 100Mi");
        assert!(nodes[2].config.is_none(), "n-2 keeps the default");
        let big = &nodes[3];
        assert_eq!(big.name, "big-0.example");
        assert_eq!(big.zone.as_deref(), Some("zone-b"));
        assert_eq!(big.ip, Some("10.1.0.7".parse().unwrap()));
        let bc = big.config.as_ref().unwrap();
        assert_eq!(bc.topology.policy, TopologyPolicy::SingleNumaNode);
        assert_eq!(bc.topology.scope, TopologyScope::Pod);
        assert_eq!(bc.topology.numa_nodes, 2);
        assert!(bc.topology.cpu_manager_static);
        assert_eq!(bc.register_with_taints[0].key, "dedicated");
        assert_eq!(bc.shutdown_grace_period_by_pod_priority.len(), 1);
        assert_eq!(bc.capacity.memory, "256Gi");
    }

    /// A malformed file names the node and the field, as kubelet's
    /// `ValidateKubeletConfiguration` and flag checks refuse them.
    #[test]
    fn a_malformed_file_names_the_node_and_the_field() {
        let bad = |node: &str| {
            let text = format!(
                "apiVersion: sim.ccm-rs.io/v1alpha1\nkind: NodeSimulatorConfiguration\nnodes:\n  - name: n-1\n{node}"
            );
            NodeConfigFile::parse(&text)
                .and_then(|f| f.apply(&SimConfig::default(), vec![]))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            bad("    kubelet: {memorySwap: {swapBehavior: Sometimes}}\n"),
            "node \"n-1\": memorySwap.swapBehavior: swapBehavior \"Sometimes\" must be one of: \"\", \"NoSwap\", \"LimitedSwap\" (or the seed's \"UnlimitedSwap\")"
        );
        assert!(
            bad("    kubelet: {registerWithTaints: [{key: a, effect: Sometimes}]}\n")
                .starts_with("node \"n-1\": registerWithTaints: invalid taint effect: Sometimes")
        );
        assert!(
            bad("    kubelet: {imageGCHighThresholdPercent: 101}\n").starts_with(
                "node \"n-1\": imageGCHighThresholdPercent: 101 must be between 0 and 100"
            )
        );
        assert!(
            bad("    kubelet: {kubeReserved: {memory: lots}}\n")
                .starts_with("node \"n-1\": kubeReserved: memory=lots")
        );
        assert_eq!(
            bad("    nodeIP: 127.0.0.1\n"),
            "node \"n-1\": nodeIP: nodeIP can't be loopback address"
        );
        assert!(bad("    nodeIP: 10.0.0.1,10.0.0.2\n").contains("dual-stack"));
        assert!(
            bad("    hostnameOverride: \"bad_name\"\n")
                .starts_with("node \"n-1\": hostnameOverride:")
        );
        assert!(
            bad("    machine: {numaNodes: 9}\n")
                .starts_with("node \"n-1\": numaNodes: 9 must be between 1 and 8")
        );
        assert!(
            bad("    kubelet: {topologyManagerPolicy: strict}\n")
                .starts_with("node \"n-1\": topologyManagerPolicy: unsupported policy")
        );
        assert!(
            bad("    kubelet: {shutdownGracePeriod: 10s, shutdownGracePeriodCriticalPods: 20s}\n")
                .starts_with("node \"n-1\": shutdownGracePeriodCriticalPods:")
        );
        assert!(
            bad("    nodeLabels: {node-role.kubernetes.io/worker: \"\"}\n").starts_with(
                "node \"n-1\": nodeLabels: unknown 'kubernetes.io' or 'k8s.io' labels"
            )
        );
        assert!(bad("    machine: {swap: -1Gi}\n").starts_with("node \"n-1\": machine.swap:"));
        let typo = bad("    kubelt: {}\n");
        assert!(
            typo.starts_with("(file): nodes[0]: unknown field `kubelt`"),
            "{typo}"
        );
        assert!(NodeConfigFile::parse("apiVersion: v1\nkind: ConfigMap\n").is_err());
    }

    /// Swap at startup as kubelet 1.32 decides it: `ValidateKubeletConfiguration` refuses
    /// `memorySwap` with the `NodeSwap` feature gate off, `validateKubeletOSConfiguration`
    /// refuses `failCgroupV1` on a cgroup v1 machine, each naming the node and the field;
    /// the gate is on by default and can be turned off per node; the machine's cgroup
    /// version is 2 unless the file says 1.
    #[test]
    fn swap_startup_rules_follow_the_node_swap_gate_and_the_cgroup_version() {
        let apply = |node: &str| {
            let text = format!(
                "apiVersion: sim.ccm-rs.io/v1alpha1\nkind: NodeSimulatorConfiguration\nmachine: {{swap: 1Gi}}\nkubelet: {{failSwapOn: false}}\nnodes:\n  - name: n-1\n{node}"
            );
            NodeConfigFile::parse(&text).and_then(|f| f.apply(&SimConfig::default(), vec![]))
        };
        let error = |node: &str| apply(node).unwrap_err().to_string();
        assert_eq!(
            error(
                "    kubelet: {featureGates: {NodeSwap: false}, memorySwap: {swapBehavior: LimitedSwap}}\n"
            ),
            "node \"n-1\": memorySwap.swapBehavior: cannot be set when NodeSwap feature flag is disabled"
        );
        assert_eq!(
            error(
                "    kubelet: {featureGates: {NodeSwap: false}, memorySwap: {swapBehavior: NoSwap}}\n"
            ),
            "node \"n-1\": memorySwap.swapBehavior: cannot be set when NodeSwap feature flag is disabled",
            "any value counts as set"
        );
        assert_eq!(
            error("    machine: {cgroupVersion: 1}\n    kubelet: {failCgroupV1: true}\n"),
            format!(
                "node \"n-1\": failCgroupV1: {}",
                crate::swap::FAIL_CGROUP_V1_MESSAGE
            )
        );
        assert_eq!(
            error("    machine: {cgroupVersion: 3}\n"),
            "node \"n-1\": machine.cgroupVersion: 3 must be 1 or 2"
        );

        let config = |node: &str| {
            let (_, nodes) = apply(node).unwrap();
            nodes[0].config.clone().unwrap()
        };
        let default = config("    nodeLabels: {a: b}\n");
        assert!(default.swap.node_swap_gate, "NodeSwap is on by default");
        assert_eq!(default.swap.cgroup_version, CgroupVersion::V2);
        assert!(!default.swap.fail_cgroup_v1);
        let off = config("    kubelet: {featureGates: {NodeSwap: false, SomeOtherGate: true}}\n");
        assert!(!off.swap.node_swap_gate);
        assert_eq!(off.swap.effective_behavior(), SwapBehavior::NoSwap);
        let v1 = config(
            "    machine: {cgroupVersion: 1}\n    kubelet: {memorySwap: {swapBehavior: LimitedSwap}}\n",
        );
        assert_eq!(v1.swap.cgroup_version, CgroupVersion::V1);
        assert_eq!(v1.swap.behavior, SwapBehavior::LimitedSwap);
        assert_eq!(v1.swap.effective_behavior(), SwapBehavior::NoSwap);
        let v2 = config("    kubelet: {memorySwap: {swapBehavior: LimitedSwap}}\n");
        assert_eq!(v2.swap.effective_behavior(), SwapBehavior::LimitedSwap);
    }

    /// `metav1.Duration` text as Go's `time.ParseDuration` reads it.
    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(
            parse_go_duration("1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(parse_go_duration("1m0s").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert!(parse_go_duration("10").is_err());
        assert!(parse_go_duration("5 days").is_err());
    }
}
