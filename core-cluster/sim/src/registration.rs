//! kubelet's registration flags, parsed and checked as kubelet does:
//! `--register-with-taints` (`pkg/util/taints/taints.go` `ParseTaints`/`parseTaint`),
//! `--node-labels` (`cmd/kubelet/app/options/options.go` `ValidateKubeletFlags`, with
//! `pkg/kubelet/apis/well_known_labels.go`), and the reservations that shape
//! `status.allocatable` (`--kube-reserved`, `--system-reserved` and the hard eviction
//! thresholds, `pkg/kubelet/cm/node_container_manager_linux.go`
//! `GetNodeAllocatableReservation`).

use std::collections::BTreeMap;

use core_cluster_machinery::registry::quantity::parse_quantity;
use k8s_openapi::api::core::v1::Taint;

use crate::{
    NodeResources,
    eviction::{Signal, Threshold, format_binary_si},
};

/// The labels kubelet may set in the `kubernetes.io`/`k8s.io` namespaces
/// (`kubeletLabels`).
pub const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// The label namespaces kubelet may set labels in (`kubeletLabelNamespaces`).
pub const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_name_part(s: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| ok(b) || matches!(b, b'-' | b'_' | b'.'))
        && ok(s.as_bytes()[0])
        && ok(s.as_bytes()[s.len() - 1])
}

/// `validation.IsQualifiedName`: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(is_dns1123_label)
                && is_name_part(name)
        }
        None => is_name_part(s),
    }
}

/// `validation.IsValidLabelValue`: empty, or a name part.
pub fn is_valid_label_value(s: &str) -> bool {
    s.is_empty() || is_name_part(s)
}

/// One taint of `key=value:Effect` or `key:Effect` (`parseTaint`).
fn parse_taint(spec: &str) -> Result<Taint, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (key, value, effect) = match parts.as_slice() {
        [key] => (*key, "", ""),
        [kv, effect] => {
            if !matches!(*effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(format!(
                    "invalid taint effect: {effect}, unsupported taint effect"
                ));
            }
            let kv: Vec<&str> = kv.split('=').collect();
            match kv.as_slice() {
                [key] => (*key, "", *effect),
                [key, value] => {
                    if !is_valid_label_value(value) {
                        return Err(format!(
                            "invalid taint spec: {spec}, a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
                        ));
                    }
                    (*key, *value, *effect)
                }
                _ => return Err(format!("invalid taint spec: {spec}")),
            }
        }
        _ => return Err(format!("invalid taint spec: {spec}")),
    };
    if !is_qualified_name(key) {
        return Err(format!(
            "invalid taint spec: {spec}, name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ));
    }
    Ok(Taint {
        key: key.into(),
        value: (!value.is_empty()).then(|| value.into()),
        effect: effect.into(),
        time_added: None,
    })
}

/// `--register-with-taints`: comma-separated `key=value:Effect` (`ParseTaints`); an effect
/// is required and a key may appear once per effect.
pub fn parse_register_with_taints(s: &str) -> Result<Vec<Taint>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    let mut out: Vec<Taint> = Vec::new();
    for spec in s.split(',') {
        let taint = parse_taint(spec)?;
        if taint.effect.is_empty() {
            return Err(format!("invalid taint spec: {spec}"));
        }
        if out
            .iter()
            .any(|t| t.key == taint.key && t.effect == taint.effect)
        {
            return Err(format!(
                "duplicated taints with the same key and effect: {spec}"
            ));
        }
        out.push(taint);
    }
    Ok(out)
}

/// `IsKubeletLabel`: a label kubelet may set on its own Node.
fn is_kubelet_label(key: &str) -> bool {
    if KUBELET_LABELS.contains(&key) {
        return true;
    }
    let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
    KUBELET_LABEL_NAMESPACES
        .iter()
        .any(|allowed| namespace == *allowed || namespace.ends_with(&format!(".{allowed}")))
}

/// Whether the label is in the `kubernetes.io` or `k8s.io` namespaces.
fn is_kubernetes_label(key: &str) -> bool {
    let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| namespace == *d || namespace.ends_with(&format!(".{d}")))
}

/// `--node-labels`: comma-separated `key=value`, checked as `ValidateKubeletFlags`: a
/// label in the `kubernetes.io` or `k8s.io` namespaces must be one kubelet may set.
pub fn parse_node_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "invalid label {pair:?}: each label must be in the form key=value"
            ));
        };
        if !is_qualified_name(k) || !is_valid_label_value(v) {
            return Err(format!("invalid node labels: {k}={v}"));
        }
        labels.insert(k.to_owned(), v.to_owned());
    }
    let unknown: Vec<&str> = labels
        .keys()
        .map(String::as_str)
        .filter(|k| is_kubernetes_label(k) && !is_kubelet_label(k))
        .collect();
    if !unknown.is_empty() {
        return Err(format!(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [{}]\n--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix ({}) or be in the specifically allowed set ({})",
            unknown.join(" "),
            KUBELET_LABEL_NAMESPACES.join(", "),
            KUBELET_LABELS.join(", ")
        ));
    }
    Ok(labels)
}

/// `--kube-reserved`/`--system-reserved`: comma-separated `resource=quantity` of `cpu`,
/// `memory`, `ephemeral-storage`, `pid`.
pub fn parse_reserved(s: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!(
                "invalid reservation {pair:?}: expected resource=quantity"
            ));
        };
        if !matches!(k, "cpu" | "memory" | "ephemeral-storage" | "pid") {
            return Err(format!("cannot reserve {k:?} resource"));
        }
        let q = parse_quantity(v).map_err(|e| format!("{k}={v}: {e}"))?;
        if q.is_negative() {
            return Err(format!(
                "resource quantity for {k:?} cannot be negative: {v}"
            ));
        }
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

/// `status.allocatable` from capacity: capacity minus kube-reserved, system-reserved and
/// the hard eviction thresholds of `memory.available` and `nodefs.available`
/// (`GetNodeAllocatableReservation`), never below zero.
pub fn allocatable(
    capacity: &NodeResources,
    kube_reserved: &BTreeMap<String, String>,
    system_reserved: &BTreeMap<String, String>,
    eviction_hard: &[Threshold],
) -> Result<NodeResources, String> {
    let nanos = |s: &str, what: &str| {
        parse_quantity(s)
            .map(|q| q.nanos())
            .map_err(|e| format!("capacity {what} {s:?}: {e}"))
    };
    let reserved = |name: &str| -> i128 {
        [kube_reserved, system_reserved]
            .iter()
            .filter_map(|m| m.get(name))
            .filter_map(|v| parse_quantity(v).ok())
            .map(|q| q.nanos())
            .sum()
    };
    let hard = |signal: Signal, capacity_nanos: i128| -> i128 {
        eviction_hard
            .iter()
            .filter(|t| t.signal == signal)
            .map(|t| {
                t.value
                    .quantity((capacity_nanos / 1_000_000_000).max(0) as u64)
                    as i128
            })
            .sum::<i128>()
            * 1_000_000_000
    };
    let cpu = (nanos(&capacity.cpu, "cpu")? - reserved("cpu")).max(0);
    let mem_cap = nanos(&capacity.memory, "memory")?;
    let memory = (mem_cap - reserved("memory") - hard(Signal::MemoryAvailable, mem_cap)).max(0);
    let eph_cap = nanos(&capacity.ephemeral_storage, "ephemeral-storage")?;
    let eph =
        (eph_cap - reserved("ephemeral-storage") - hard(Signal::NodeFsAvailable, eph_cap)).max(0);
    let millis = cpu / 1_000_000;
    let cpu = if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    };
    let bytes = |n: i128| format_binary_si((n / 1_000_000_000) as u64);
    Ok(NodeResources {
        cpu,
        memory: bytes(memory),
        pods: capacity.pods.clone(),
        ephemeral_storage: bytes(eph),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::{DEFAULT_EVICTION_HARD, parse_eviction_hard};

    /// `taints.go` `parseTaint`/`ParseTaints`: `key=value:Effect` and `key:Effect`; an
    /// unknown effect, a missing effect, a bad key or value and a duplicate are refused
    /// with kubelet's messages.
    #[test]
    fn register_with_taints_parses_as_kubelet_parse_taints() {
        let t = parse_register_with_taints("dedicated=gpu:NoSchedule,example.com/spot:NoExecute")
            .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            (
                t[0].key.as_str(),
                t[0].value.as_deref(),
                t[0].effect.as_str()
            ),
            ("dedicated", Some("gpu"), "NoSchedule")
        );
        assert_eq!(
            (
                t[1].key.as_str(),
                t[1].value.as_deref(),
                t[1].effect.as_str()
            ),
            ("example.com/spot", None, "NoExecute")
        );
        assert_eq!(parse_register_with_taints("").unwrap(), []);
        assert_eq!(
            parse_register_with_taints("a=b:Sometimes").unwrap_err(),
            "invalid taint effect: Sometimes, unsupported taint effect"
        );
        assert_eq!(
            parse_register_with_taints("dedicated").unwrap_err(),
            "invalid taint spec: dedicated",
            "an effect is required"
        );
        assert!(
            parse_register_with_taints("a=b")
                .unwrap_err()
                .starts_with("invalid taint spec: a=b, name part")
        );
        assert_eq!(
            parse_register_with_taints("a=b=c:NoSchedule").unwrap_err(),
            "invalid taint spec: a=b=c:NoSchedule"
        );
        assert!(
            parse_register_with_taints("-bad:NoSchedule")
                .unwrap_err()
                .starts_with("invalid taint spec: -bad:NoSchedule, name part")
        );
        assert!(parse_register_with_taints("a=b!:NoSchedule").is_err());
        assert_eq!(
            parse_register_with_taints("a=1:NoSchedule,a=2:NoSchedule").unwrap_err(),
            "duplicated taints with the same key and effect: a=2:NoSchedule"
        );
        assert!(parse_register_with_taints("a=1:NoSchedule,a=2:NoExecute").is_ok());
    }

    /// `ValidateKubeletFlags`: `--node-labels` in `kubernetes.io`/`k8s.io` must be a kubelet
    /// label or in `kubelet.kubernetes.io`/`node.kubernetes.io`; other domains are free.
    #[test]
    fn node_labels_follow_kubelets_kubernetes_io_rule() {
        let ok = parse_node_labels(
            "node.kubernetes.io/instance-type=m5.large,tier.node.kubernetes.io/x=y,example.com/team=a,plain=1",
        )
        .unwrap();
        assert_eq!(ok.len(), 4);
        let err = parse_node_labels("node-role.kubernetes.io/worker=,k8s.io/x=1").unwrap_err();
        assert!(
            err.starts_with(
                "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [k8s.io/x node-role.kubernetes.io/worker]"
            ),
            "{err}"
        );
        assert!(err.contains(
            "must begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io)"
        ));
        assert!(parse_node_labels("novalue").is_err());
    }

    /// `GetNodeAllocatableReservation`: allocatable is capacity less kube-reserved,
    /// system-reserved and the hard eviction thresholds (memory.available 100Mi,
    /// nodefs.available 10 %).
    #[test]
    fn reservations_and_hard_eviction_shape_allocatable() {
        let capacity = NodeResources {
            cpu: "4".into(),
            memory: "16Gi".into(),
            pods: "110".into(),
            ephemeral_storage: "100Gi".into(),
        };
        let kube = parse_reserved("cpu=100m,memory=1Gi").unwrap();
        let system = parse_reserved("cpu=400m,memory=924Mi,ephemeral-storage=10Gi").unwrap();
        let hard = parse_eviction_hard(DEFAULT_EVICTION_HARD).unwrap();
        let a = allocatable(&capacity, &kube, &system, &hard).unwrap();
        assert_eq!(a.cpu, "3500m");
        assert_eq!(a.memory, "14Gi", "16Gi - 1Gi - 924Mi - 100Mi");
        assert_eq!(a.ephemeral_storage, "80Gi", "100Gi - 10Gi - 10%");
        assert_eq!(a.pods, "110");
        let none = allocatable(&capacity, &BTreeMap::new(), &BTreeMap::new(), &[]).unwrap();
        assert_eq!(none, capacity);
        assert_eq!(
            parse_reserved("gpu=1").unwrap_err(),
            "cannot reserve \"gpu\" resource"
        );
        assert!(parse_reserved("memory=lots").is_err());
        assert!(parse_reserved("memory=-1Gi").is_err());
    }
}
