//! The protobuf codec on a 10,000-Node list: bytes, and encode and decode time against JSON
//! (median of `--runs`, default 3). Not a test: figures go to BENCHMARKS.md.
//!
//! `cargo bench -p core-cluster --bench protobuf` (optionally `-- --nodes 10000 --runs 3`).
//!
//! A LIST answered in protobuf costs the server the "protobuf encode" column: the handler's
//! `serde_json::Value` is encoded directly. "via JSON" is the middleware's path for
//! answers that were already written as JSON (errors, watch events): parse, then encode.

#![allow(missing_docs, clippy::disallowed_types)]

use std::time::{Duration, Instant};

use core_cluster::api::protobuf::{decode_object, encode_object};
use serde_json::{Value, json};

use ccm_testkit::bench::arg;

/// A Node as the simulated kubelets and the cloud controller leave it.
fn node(i: usize) -> Value {
    let condition = |kind: &str, status: &str, reason: &str| {
        json!({"type": kind, "status": status, "reason": reason,
               "message": format!("kubelet reports {kind} {status}"),
               "lastHeartbeatTime": "2024-05-01T10:01:00Z",
               "lastTransitionTime": "2024-05-01T10:00:10Z"})
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": format!("node-{i:05}"),
            "uid": format!("0b9f3a4e-1111-2222-3333-{i:012}"),
            "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {
                "kubernetes.io/hostname": format!("node-{i:05}"),
                "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                "topology.kubernetes.io/region": "region-a",
                "node.kubernetes.io/instance-type": "m5.large"
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"}
        },
        "spec": {
            "podCIDR": format!("10.{}.{}.0/24", 64 + i / 256, i % 256),
            "podCIDRs": [format!("10.{}.{}.0/24", 64 + i / 256, i % 256)],
            "providerID": format!("fake://zone-{}/node-{i:05}", i % 3)
        },
        "status": {
            "capacity": {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "3800m", "memory": "15Gi", "pods": "110", "ephemeral-storage": "90Gi"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": format!("10.0.{}.{}", i / 256, i % 256)},
                {"type": "Hostname", "address": format!("node-{i:05}")}
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                         "kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04",
                         "containerRuntimeVersion": "containerd://1.7.0",
                         "kubeletVersion": "v1.33.0", "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64"}
        }
    })
}

fn median(mut runs: Vec<Duration>) -> f64 {
    runs.sort();
    runs[runs.len() / 2].as_secs_f64() * 1000.0
}

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> (f64, T) {
    let mut durations = Vec::new();
    let mut last = None;
    for _ in 0..runs {
        let started = Instant::now();
        last = Some(std::hint::black_box(f()));
        durations.push(started.elapsed());
    }
    (median(durations), last.expect("at least one run"))
}

fn main() {
    let nodes: usize = arg("--nodes", 10_000);
    let runs = arg::<usize>("--runs", 3).max(1);
    let items: Vec<Value> = (0..nodes).map(node).collect();
    let list = json!({"apiVersion": "v1", "kind": "NodeList",
                      "metadata": {"resourceVersion": "20000"}, "items": items});

    let (json_encode, json_bytes) = time(runs, || serde_json::to_vec(&list).expect("JSON"));
    let (json_decode, _) = time(runs, || {
        serde_json::from_slice::<Value>(&json_bytes).expect("JSON")
    });
    let (pb_encode, pb_bytes) = time(runs, || encode_object(&list).expect("protobuf"));
    let (pb_decode, decoded) = time(runs, || decode_object(&pb_bytes).expect("protobuf"));
    let (via_json, _) = time(runs, || {
        let value: Value = serde_json::from_slice(&json_bytes).expect("JSON");
        encode_object(&value).expect("protobuf")
    });
    assert_eq!(
        decoded["items"].as_array().map(Vec::len),
        Some(nodes),
        "the list decodes back"
    );
    println!("NodeList of {nodes} Nodes, median of {runs}:");
    println!(
        "  JSON      {:>10} bytes  encode {json_encode:8.1} ms  decode {json_decode:8.1} ms",
        json_bytes.len()
    );
    println!(
        "  protobuf  {:>10} bytes  encode {pb_encode:8.1} ms  decode {pb_decode:8.1} ms",
        pb_bytes.len()
    );
    println!("  protobuf encode via JSON (parse + encode): {via_json:.1} ms");
}
