//! `/configz`: the node's effective KubeletConfiguration, as kubelet's
//! `pkg/kubelet/server/server.go` serves it through `component-base/configz` (`configz.New(
//! "kubeletconfig")` set to the `kubelet.config.k8s.io/v1beta1` conversion of the running
//! configuration, in its JSON field names, without `apiVersion`/`kind`).

use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::{
    SimConfig,
    eviction::ThresholdValue,
    topology::{TopologyPolicy, TopologyScope},
};

/// The component name kubelet registers its configuration under.
const COMPONENT: &str = "kubeletconfig";

/// The `/configz` document of a node with `config`, listening on `port`.
pub(crate) fn configz(config: &SimConfig, port: u16) -> Value {
    json!({ COMPONENT: kubelet_configuration(config, port) })
}

/// `config` as a v1beta1 KubeletConfiguration (the fields the simulator plays, and the
/// server's own).
fn kubelet_configuration(config: &SimConfig, port: u16) -> Value {
    let mut k = Map::new();
    let mut put = |key: &str, value: Value| {
        k.insert(key.to_owned(), value);
    };
    put("enableServer", json!(true));
    put("port", json!(port));
    put("readOnlyPort", json!(0));
    put("serverTLSBootstrap", json!(config.server_tls_bootstrap));
    put("registerNode", json!(config.register_node));
    put(
        "registerWithTaints",
        serde_json::to_value(&config.register_with_taints).unwrap_or(Value::Null),
    );
    if let Some(prefix) = &config.provider_id_prefix {
        put("providerID", json!(prefix));
    }
    put("maxPods", max_pods(&config.capacity.pods));
    put("kubeReserved", json!(config.kube_reserved));
    put("systemReserved", json!(config.system_reserved));
    let hard: Map<String, Value> = config
        .eviction
        .hard
        .iter()
        .map(|t| (t.signal.name().to_owned(), json!(threshold(t.value))))
        .collect();
    put("evictionHard", Value::Object(hard));
    put(
        "evictionPressureTransitionPeriod",
        json!(go_duration(config.eviction.pressure_transition_period)),
    );
    put("failSwapOn", json!(config.swap.fail_swap_on));
    put(
        "memorySwap",
        json!({"swapBehavior": config.swap.behavior.as_str()}),
    );
    put(
        "topologyManagerPolicy",
        json!(policy(config.topology.policy)),
    );
    put("topologyManagerScope", json!(scope(config.topology.scope)));
    put(
        "cpuManagerPolicy",
        json!(if config.topology.cpu_manager_static {
            "static"
        } else {
            "none"
        }),
    );
    put(
        "memoryManagerPolicy",
        json!(if config.topology.memory_manager_static {
            "Static"
        } else {
            "None"
        }),
    );
    let gc = &config.image_gc;
    put(
        "imageGCHighThresholdPercent",
        json!(gc.high_threshold_percent),
    );
    put(
        "imageGCLowThresholdPercent",
        json!(gc.low_threshold_percent),
    );
    put("imageMinimumGCAge", json!(go_duration(gc.minimum_gc_age)));
    put("imageMaximumGCAge", json!(go_duration(gc.maximum_gc_age)));
    put("nodeStatusMaxImages", json!(gc.node_status_max_images));
    put(
        "nodeStatusUpdateFrequency",
        json!(go_duration(config.node_status_update_frequency)),
    );
    put(
        "nodeStatusReportFrequency",
        json!(go_duration(config.node_status_report_frequency)),
    );
    put(
        "nodeLeaseDurationSeconds",
        json!(config.node_lease_duration.as_secs()),
    );
    put(
        "shutdownGracePeriod",
        json!(go_duration(config.shutdown_grace_period)),
    );
    put(
        "shutdownGracePeriodCriticalPods",
        json!(go_duration(config.shutdown_grace_period_critical_pods)),
    );
    if !config.shutdown_grace_period_by_pod_priority.is_empty() {
        let groups: Vec<Value> = config
            .shutdown_grace_period_by_pod_priority
            .iter()
            .map(|g| {
                json!({"priority": g.priority,
                    "shutdownGracePeriodSeconds": g.grace_period.as_secs()})
            })
            .collect();
        put("shutdownGracePeriodByPodPriority", Value::Array(groups));
    }
    Value::Object(k)
}

/// `maxPods` as a number (the capacity's `pods`, which the simulator keeps as a string).
fn max_pods(pods: &str) -> Value {
    pods.parse::<i64>().map(Value::from).unwrap_or(json!(pods))
}

fn policy(p: TopologyPolicy) -> &'static str {
    match p {
        TopologyPolicy::None => "none",
        TopologyPolicy::BestEffort => "best-effort",
        TopologyPolicy::Restricted => "restricted",
        TopologyPolicy::SingleNumaNode => "single-numa-node",
    }
}

fn scope(s: TopologyScope) -> &'static str {
    match s {
        TopologyScope::Container => "container",
        TopologyScope::Pod => "pod",
    }
}

/// A threshold as `evictionHard` writes it: `10%`, or a quantity in the largest binary
/// suffix that divides it (`100Mi`).
fn threshold(value: ThresholdValue) -> String {
    match value {
        ThresholdValue::Percentage(p) => {
            let percent = (p * 1e6).round() / 1e4;
            format!("{percent}%")
        }
        ThresholdValue::Quantity(q) => {
            const SUFFIXES: [(&str, u64); 5] = [
                ("Pi", 1 << 50),
                ("Ti", 1 << 40),
                ("Gi", 1 << 30),
                ("Mi", 1 << 20),
                ("Ki", 1 << 10),
            ];
            SUFFIXES
                .iter()
                .find(|(_, unit)| q != 0 && q % unit == 0)
                .map(|(suffix, unit)| format!("{}{suffix}", q / unit))
                .unwrap_or_else(|| q.to_string())
        }
    }
}

/// A duration as Go's `time.Duration.String` writes it (`metav1.Duration`'s JSON): `0s`,
/// `500ms`, `1m30s`, `2h0m0s`.
pub(crate) fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    if nanos < 1_000_000_000 {
        let (value, unit) = if nanos < 1_000 {
            (nanos as f64, "ns")
        } else if nanos < 1_000_000 {
            (nanos as f64 / 1e3, "µs")
        } else {
            (nanos as f64 / 1e6, "ms")
        };
        return format!("{value}{unit}");
    }
    let secs = d.as_secs();
    let frac = d.subsec_nanos();
    let (h, m, s) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let seconds = if frac == 0 {
        format!("{s}s")
    } else {
        let digits = format!("{frac:09}");
        format!("{s}.{}s", digits.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SwapBehavior, parse_eviction_hard};

    /// `time.Duration.String` as `metav1.Duration` marshals it.
    #[test]
    fn durations_are_written_as_go_writes_them() {
        for (d, s) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::from_secs(30), "30s"),
            (Duration::from_secs(120), "2m0s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(7200), "2h0m0s"),
            (Duration::from_millis(1500), "1.5s"),
        ] {
            assert_eq!(go_duration(d), s);
        }
    }

    /// The effective configuration in KubeletConfiguration's JSON names (`v1beta1`), under
    /// `kubeletconfig` as `component-base/configz` nests it.
    #[test]
    fn configz_shows_the_effective_configuration_under_kubeletconfig() {
        let mut config = SimConfig::default();
        config.swap.fail_swap_on = false;
        config.swap.behavior = SwapBehavior::LimitedSwap;
        config.topology.policy = TopologyPolicy::SingleNumaNode;
        config.eviction.hard =
            parse_eviction_hard("memory.available<100Mi,nodefs.available<10%").unwrap();
        config.image_gc.minimum_gc_age = Duration::from_secs(120);
        let z = configz(&config, 10250);
        let k = &z["kubeletconfig"];
        assert_eq!(k["failSwapOn"], false);
        assert_eq!(k["memorySwap"]["swapBehavior"], "LimitedSwap");
        assert_eq!(k["topologyManagerPolicy"], "single-numa-node");
        assert_eq!(k["topologyManagerScope"], "container");
        assert_eq!(
            k["evictionHard"],
            json!({"memory.available": "100Mi", "nodefs.available": "10%"})
        );
        assert_eq!(k["imageMinimumGCAge"], "2m0s");
        assert_eq!(k["imageGCHighThresholdPercent"], 85);
        assert_eq!(k["maxPods"], 110);
        assert_eq!(k["port"], 10250);
        assert_eq!(k["shutdownGracePeriod"], "0s");
        assert!(k.get("apiVersion").is_none());
    }
}
