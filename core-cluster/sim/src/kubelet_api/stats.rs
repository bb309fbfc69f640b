//! What the simulated containers use, and kubelet's two views of it: `/stats/summary` (the
//! Summary API, `k8s.io/kubelet/pkg/apis/stats/v1alpha1`) and `/metrics/resource` (the
//! Prometheus text metrics-server scrapes, `pkg/kubelet/metrics/collectors/
//! resource_metrics.go`).
//!
//! Usage is a pure function of the pod, so every scrape agrees with the last: each running
//! container uses [`CPU_USAGE_ANNOTATION`] / [`MEMORY_USAGE_ANNOTATION`] when the pod sets
//! them, else half of its request, else a small constant; the node adds a system overhead
//! to its pods' sum. CPU is used at a constant rate since the container started, so the
//! cumulative counters (`usageCoreNanoSeconds`, `container_cpu_usage_seconds_total`) grow
//! with time as a real container's would.

use std::fmt::Write as _;

use core_cluster_machinery::registry::quantity::parse_quantity;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;
use serde_json::{Value, json};

/// Pod annotation: the CPU each of its running containers uses (a quantity, `250m`).
pub const CPU_USAGE_ANNOTATION: &str = "sim.ccm-rs.io/cpu-usage";
/// Pod annotation: the memory (working set) each of its running containers uses (`64Mi`).
pub const MEMORY_USAGE_ANNOTATION: &str = "sim.ccm-rs.io/memory-usage";
/// A container's CPU without the annotation or a request: 1m, in nano-cores.
const DEFAULT_CPU_NANOCORES: u64 = 1_000_000;
/// A container's memory without the annotation or a request: 8 MiB.
const DEFAULT_MEMORY_BYTES: u64 = 8 << 20;
/// What the node itself (kubelet, the runtime, the system) uses beyond its pods: 50m CPU.
const NODE_CPU_NANOCORES: u64 = 50_000_000;
/// The node's own memory beyond its pods: 256 MiB.
const NODE_MEMORY_BYTES: u64 = 256 << 20;

/// One running container's usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ContainerUsage {
    pub(crate) name: String,
    pub(crate) started: Timestamp,
    pub(crate) nanocores: u64,
    pub(crate) memory: u64,
}

/// One pod's running containers.
#[derive(Debug, Clone)]
pub(crate) struct PodUsage {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: String,
    pub(crate) started: Timestamp,
    pub(crate) containers: Vec<ContainerUsage>,
}

impl PodUsage {
    fn nanocores(&self) -> u64 {
        self.containers.iter().map(|c| c.nanocores).sum()
    }

    fn memory(&self) -> u64 {
        self.containers.iter().map(|c| c.memory).sum()
    }

    fn core_nano_seconds(&self, now: Timestamp) -> u64 {
        self.containers
            .iter()
            .map(|c| core_nano_seconds(c.nanocores, c.started, now))
            .sum()
    }
}

/// CPU time used at `nanocores` from `started` to `now`, in core-nanoseconds.
fn core_nano_seconds(nanocores: u64, started: Timestamp, now: Timestamp) -> u64 {
    let elapsed = now.duration_since(started).as_secs_f64().max(0.0);
    // `nanocores` is nanoseconds of CPU per second.
    (nanocores as f64 * elapsed) as u64
}

fn request_of(container: &Container, resource: &str) -> Option<u64> {
    let q = container
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get(resource)?;
    let q = parse_quantity(&q.0).ok()?;
    let v = if resource == "cpu" {
        q.nanos()
    } else {
        i128::from(q.value())
    };
    u64::try_from(v).ok().filter(|v| *v > 0)
}

fn annotation_of(pod: &Pod, key: &str, cpu: bool) -> Option<u64> {
    let q = parse_quantity(pod.annotations().get(key)?).ok()?;
    let v = if cpu {
        q.nanos()
    } else {
        i128::from(q.value())
    };
    u64::try_from(v).ok()
}

/// The usage of `pod`'s running containers; `None` when the pod does not run.
pub(crate) fn pod_usage(pod: &Pod, now: Timestamp) -> Option<PodUsage> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let cpu_annotation = annotation_of(pod, CPU_USAGE_ANNOTATION, true);
    let memory_annotation = annotation_of(pod, MEMORY_USAGE_ANNOTATION, false);
    let containers = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|cs| {
            let started = cs.state.as_ref()?.running.as_ref()?.started_at.as_ref()?.0;
            let declared = spec.containers.iter().find(|c| c.name == cs.name)?;
            Some(ContainerUsage {
                name: cs.name.clone(),
                started,
                nanocores: cpu_annotation
                    .or_else(|| request_of(declared, "cpu").map(|r| r / 2))
                    .unwrap_or(DEFAULT_CPU_NANOCORES),
                memory: memory_annotation
                    .or_else(|| request_of(declared, "memory").map(|r| r / 2))
                    .unwrap_or(DEFAULT_MEMORY_BYTES),
            })
        })
        .collect();
    let started = status.start_time.as_ref().map(|t| t.0).unwrap_or(now);
    Some(PodUsage {
        name: pod.name_any(),
        namespace: pod.namespace().unwrap_or_default(),
        uid: pod.uid().unwrap_or_default(),
        started,
        containers,
    })
}

fn cpu_json(now: Timestamp, nanocores: u64, core_nano_seconds: u64) -> Value {
    json!({"time": now.to_string(), "usageNanoCores": nanocores,
           "usageCoreNanoSeconds": core_nano_seconds})
}

fn memory_json(now: Timestamp, bytes: u64) -> Value {
    json!({"time": now.to_string(), "usageBytes": bytes, "workingSetBytes": bytes,
           "rssBytes": bytes, "pageFaults": 0, "majorPageFaults": 0})
}

/// The node's usage: its pods' and its own overhead (nano-cores, bytes, core-nanoseconds).
fn node_usage(pods: &[PodUsage], node_started: Timestamp, now: Timestamp) -> (u64, u64, u64) {
    let nanocores = NODE_CPU_NANOCORES + pods.iter().map(PodUsage::nanocores).sum::<u64>();
    let memory = NODE_MEMORY_BYTES + pods.iter().map(PodUsage::memory).sum::<u64>();
    let cumulative = core_nano_seconds(NODE_CPU_NANOCORES, node_started, now)
        + pods.iter().map(|p| p.core_nano_seconds(now)).sum::<u64>();
    (nanocores, memory, cumulative)
}

/// `/stats/summary`: the `Summary` of the node and its running pods.
pub(crate) fn summary(
    node: &str,
    node_started: Timestamp,
    pods: &[PodUsage],
    now: Timestamp,
) -> Value {
    let (nanocores, memory, cumulative) = node_usage(pods, node_started, now);
    let pods: Vec<Value> = pods
        .iter()
        .map(|p| {
            let containers: Vec<Value> = p
                .containers
                .iter()
                .map(|c| {
                    json!({
                        "name": c.name,
                        "startTime": c.started.to_string(),
                        "cpu": cpu_json(now, c.nanocores, core_nano_seconds(c.nanocores, c.started, now)),
                        "memory": memory_json(now, c.memory),
                    })
                })
                .collect();
            json!({
                "podRef": {"name": p.name, "namespace": p.namespace, "uid": p.uid},
                "startTime": p.started.to_string(),
                "containers": containers,
                "cpu": cpu_json(now, p.nanocores(), p.core_nano_seconds(now)),
                "memory": memory_json(now, p.memory()),
            })
        })
        .collect();
    json!({
        "node": {
            "nodeName": node,
            "startTime": node_started.to_string(),
            "cpu": cpu_json(now, nanocores, cumulative),
            "memory": memory_json(now, memory),
        },
        "pods": pods,
    })
}

/// Escapes a Prometheus label value.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `/metrics/resource`: kubelet's resource metrics in the Prometheus text format, each
/// sample stamped (milliseconds), as metrics-server reads them.
pub(crate) fn resource_metrics(
    node_started: Timestamp,
    pods: &[PodUsage],
    now: Timestamp,
) -> String {
    let ms = now.as_millisecond();
    let secs = |ns: u64| ns as f64 / 1e9;
    let (_, memory, cumulative) = node_usage(pods, node_started, now);
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, help: &str, samples: Vec<(String, f64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {ms}");
        }
    };
    let container_labels = |p: &PodUsage, c: &ContainerUsage| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            label(&c.name),
            label(&p.namespace),
            label(&p.name)
        )
    };
    let pod_labels = |p: &PodUsage| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            label(&p.namespace),
            label(&p.name)
        )
    };
    let each_container = |f: &dyn Fn(&PodUsage, &ContainerUsage) -> f64| -> Vec<(String, f64)> {
        pods.iter()
            .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
            .map(|(p, c)| (container_labels(p, c), f(p, c)))
            .collect()
    };
    family(
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the container in core-seconds",
        each_container(&|_, c| secs(core_nano_seconds(c.nanocores, c.started, now))),
    );
    family(
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set of the container in bytes",
        each_container(&|_, c| c.memory as f64),
    );
    family(
        "container_start_time_seconds",
        "gauge",
        "Start time of the container since unix epoch in seconds",
        each_container(&|_, c| c.started.as_second() as f64),
    );
    family(
        "node_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the node in core-seconds",
        vec![(String::new(), secs(cumulative))],
    );
    family(
        "node_memory_working_set_bytes",
        "gauge",
        "Current working set of the node in bytes",
        vec![(String::new(), memory as f64)],
    );
    family(
        "pod_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pods.iter()
            .map(|p| (pod_labels(p), secs(p.core_nano_seconds(now))))
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "gauge",
        "Current working set of the pod in bytes",
        pods.iter()
            .map(|p| (pod_labels(p), p.memory() as f64))
            .collect(),
    );
    family(
        "resource_scrape_error",
        "gauge",
        "1 if there was an error while getting container metrics, 0 otherwise",
        vec![(String::new(), 0.0)],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(annotations: Value, requests: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1", "annotations": annotations},
            "spec": {"containers": [
                {"name": "a", "image": "x", "resources": {"requests": requests}},
                {"name": "b", "image": "x"}]},
            "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                "containerStatuses": [
                    {"name": "a", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                     "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}},
                    {"name": "b", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                     "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}}]},
        }))
        .unwrap()
    }

    /// The usage model: the annotations first, else half the request, else the defaults;
    /// CPU time accumulates at that rate from the container's start.
    #[test]
    fn usage_follows_the_annotations_then_half_the_requests() {
        let p = pod_usage(
            &pod(json!({}), json!({"cpu": "500m", "memory": "128Mi"})),
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(p.containers[0].nanocores, 250_000_000);
        assert_eq!(p.containers[0].memory, 64 << 20);
        assert_eq!(p.containers[1].nanocores, DEFAULT_CPU_NANOCORES);
        assert_eq!(p.containers[1].memory, DEFAULT_MEMORY_BYTES);
        let annotated = pod_usage(
            &pod(
                json!({CPU_USAGE_ANNOTATION: "2", MEMORY_USAGE_ANNOTATION: "1Gi"}),
                json!({"cpu": "500m"}),
            ),
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        assert_eq!(annotated.containers[0].nanocores, 2_000_000_000);
        assert_eq!(annotated.containers[1].memory, 1 << 30);

        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let s = summary("n1", "2025-12-31T23:59:00Z".parse().unwrap(), &[p], now);
        let a = &s["pods"][0]["containers"][0]["cpu"];
        assert_eq!(a["usageNanoCores"], 250_000_000);
        // 0.25 cores for 60 s.
        assert_eq!(a["usageCoreNanoSeconds"], 15_000_000_000u64);
        assert_eq!(
            s["node"]["memory"]["workingSetBytes"],
            NODE_MEMORY_BYTES + (64 << 20) + DEFAULT_MEMORY_BYTES
        );
        assert_eq!(
            s["node"]["cpu"]["usageNanoCores"],
            NODE_CPU_NANOCORES + 250_000_000 + DEFAULT_CPU_NANOCORES
        );
    }

    /// `resource_metrics.go`: the metric families metrics-server reads, one sample per
    /// container, with the pod's labels.
    #[test]
    fn resource_metrics_name_each_container_with_its_pod() {
        let p = pod_usage(
            &pod(json!({MEMORY_USAGE_ANNOTATION: "10Mi"}), json!({})),
            Timestamp::UNIX_EPOCH,
        )
        .unwrap();
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let text = resource_metrics("2026-01-01T00:00:00Z".parse().unwrap(), &[p], now);
        let ms = now.as_millisecond();
        assert!(
            text.contains(&format!(
                "container_memory_working_set_bytes{{container=\"a\",namespace=\"default\",pod=\"web\"}} 10485760 {ms}"
            )),
            "{text}"
        );
        assert!(
            text.contains("# TYPE node_cpu_usage_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains(&format!("resource_scrape_error 0 {ms}")),
            "{text}"
        );
    }
}
