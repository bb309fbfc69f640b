//! Node lifecycle monitor pass benchmark (plain `main`, no harness): the CPU cost of one
//! pure monitor pass (health evaluation, zone states, queue updates, deciding the writes)
//! over 1,000, 10,000 and 50,000 cached nodes in 10 zones, with no API server.
//!
//! Scenarios, each measured over several passes 5 s apart on the controller clock:
//! - `renewed`: every lease renewed since the last pass (every probe refreshed);
//! - `quiet`: no lease moved (nothing changes);
//! - `zone-down`: the leases of one zone (10 % of the nodes) stopped 60 s ago, so the pass
//!   decides status writes, pod marking and queue entries for them; then the NoExecute pass.
//!
//! Run: `cargo bench -p core-cluster --bench node_lifecycle`. Without `--bench` (as
//! `cargo test --all-targets` does) it runs 1,000 nodes once as a smoke test.

use std::{collections::HashMap, sync::Arc, time::Duration};

use core_cluster::controllers::node_lifecycle::{MonitorCore, NodeAction, NodeLifecycleConfig};
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use serde_json::json;
use tokio::time::Instant;

const ZONES: usize = 10;

fn node(i: usize, t: Timestamp) -> Arc<Node> {
    let cond = |ty: &str, s: &str| json!({"type": ty, "status": s, "reason": "Kubelet", "message": "ok", "lastHeartbeatTime": t.to_string(), "lastTransitionTime": t.to_string()});
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("node-{i}"), "uid": format!("uid-{i}"), "resourceVersion": "1",
                "labels": {"topology.kubernetes.io/zone": format!("z{}", i % ZONES), "topology.kubernetes.io/region": "r", "kubernetes.io/hostname": format!("node-{i}")}},
            "spec": {"podCIDR": "10.0.0.0/24"},
            "status": {"conditions": [cond("Ready", "True"), cond("MemoryPressure", "False"), cond("DiskPressure", "False"), cond("PIDPressure", "False"), cond("NetworkUnavailable", "False")]}
        }))
        .unwrap(),
    )
}

fn lease(i: usize, renew: Timestamp) -> Arc<Lease> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": format!("node-{i}"), "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": format!("node-{i}"), "leaseDurationSeconds": 40, "renewTime": MicroTime(renew)}
        }))
        .unwrap(),
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn bench(n: usize, passes: usize) {
    let t0 = Timestamp::now();
    let start = Instant::now();
    let mut nodes: Vec<Arc<Node>> = (0..n).map(|i| node(i, t0)).collect();
    let mut leases: HashMap<String, Arc<Lease>> = (0..n)
        .map(|i| (format!("node-{i}"), lease(i, t0)))
        .collect();
    let mut core = MonitorCore::new(NodeLifecycleConfig::default());
    let mut clock = start;
    let period = Duration::from_secs(5);

    // First pass: every node registered (not measured as steady state, but reported).
    let t = Instant::now();
    let plan = core.monitor_pass(&nodes, &|n| leases.get(n).cloned(), clock, t0);
    let first = t.elapsed();
    assert_eq!(plan.nodes.len(), n);

    let mut renewed = Vec::new();
    let mut quiet = Vec::new();
    for p in 1..=passes {
        // renew every lease (untimed), then a pass
        clock += period;
        let renew = t0 + SignedDuration::from_secs(5 * p as i64);
        for l in leases.values_mut() {
            let mut new = (**l).clone();
            new.spec.as_mut().unwrap().renew_time = Some(MicroTime(renew));
            *l = Arc::new(new);
        }
        let t = Instant::now();
        let plan = core.monitor_pass(&nodes, &|n| leases.get(n).cloned(), clock, t0);
        renewed.push(t.elapsed());
        assert!(plan.nodes.is_empty());
        // a quiet pass: nothing moved
        clock += period;
        let t = Instant::now();
        let plan = core.monitor_pass(&nodes, &|n| leases.get(n).cloned(), clock, t0);
        quiet.push(t.elapsed());
        assert!(plan.nodes.is_empty());
    }

    // Zone z0 stops renewing; 60 s later the other zones are still renewing.
    let mut down = Vec::new();
    let mut writes = 0;
    let mut renew = t0 + SignedDuration::from_secs(5 * passes as i64);
    for _ in 0..12 {
        clock += period;
        renew += SignedDuration::from_secs(5);
        for (name, l) in leases.iter_mut() {
            let i: usize = name["node-".len()..].parse().unwrap();
            if i.is_multiple_of(ZONES) {
                continue;
            }
            let mut new = (**l).clone();
            new.spec.as_mut().unwrap().renew_time = Some(MicroTime(renew));
            *l = Arc::new(new);
        }
        let t = Instant::now();
        let plan = core.monitor_pass(&nodes, &|n| leases.get(n).cloned(), clock, t0);
        down.push(t.elapsed());
        // the status writes land (untimed), as the reflector would show them
        for np in plan.nodes {
            for action in np.actions {
                if let NodeAction::UpdateStatus(conditions) = action {
                    writes += 1;
                    let i: usize = np.name["node-".len()..].parse().unwrap();
                    let mut updated = (*nodes[i]).clone();
                    updated.status.as_mut().unwrap().conditions = Some(conditions);
                    nodes[i] = Arc::new(updated);
                }
            }
        }
    }
    assert_eq!(
        writes,
        n / ZONES,
        "one status write per node of the dead zone"
    );
    let by_name: HashMap<String, Arc<Node>> = nodes
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap(), n.clone()))
        .collect();
    let t = Instant::now();
    let decisions = core.no_execute_pass(&|n| by_name.get(n).cloned(), clock);
    let no_execute = t.elapsed();
    // one token per zone: the first node of the dead zone
    assert_eq!(decisions.len(), 1);

    println!(
        "{n:>6} nodes: first pass {:>8.2?}  renewed {:>8.2?}  quiet {:>8.2?}  zone-down (max of 12) {:>8.2?}  NoExecute pass {:>8.2?}",
        first,
        median(renewed),
        median(quiet),
        down.iter().max().unwrap(),
        no_execute,
    );
}

fn main() {
    let full = ccm_testkit::bench::full_run();
    if !full {
        bench(1_000, 1);
        return;
    }
    println!("node lifecycle monitor pass, pure CPU (median of 5 passes per scenario)");
    for n in [1_000, 10_000, 50_000] {
        bench(n, 5);
    }
}
