//! Graceful node shutdown of the node simulator triggered from kubectl (a Node
//! annotation), by pod priority, against the in-process API server with paused tokio
//! time. Rules: kubelet's `pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`
//! (`processShutdownEvent`: groups by `shutdownGracePeriodByPodPriority`, lowest priority
//! first, each pod's grace period capped by its group's; the node `Ready=False` with
//! "node is shutting down"; the admit handler rejecting new pods with `NodeShutdown`) and
//! `pkg/kubelet/nodelease` (the Lease keeps renewing until the node is off).

use std::{sync::Arc, time::Duration};

use ccm_testkit::eventually;
use core_cluster::{
    ApiServer, ApiServerConfig,
    sim::{NodeSimulator, SYSTEM_CRITICAL_PRIORITY, ShutdownPriorityGroup, SimConfig},
    store::MemoryStore,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

fn pod(name: &str, priority: Option<i32>, class: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": "n1", "priority": priority, "priorityClassName": class,
            "containers": [{"name": "c", "image": "nginx"}]},
    }))
    .unwrap()
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

async fn phases(pods: &Api<Pod>) -> [String; 3] {
    let mut out: [String; 3] = Default::default();
    for (i, name) in ["low", "mid", "critical"].into_iter().enumerate() {
        out[i] = phase(&pods.get(name).await.unwrap());
    }
    out
}

async fn renew_time(client: &Client) -> Option<jiff::Timestamp> {
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .get("n1")
        .await
        .ok()?
        .spec?
        .renew_time
        .map(|t| t.0)
}

/// `kubectl annotate node n1 sim.ccm-rs.io/shutdown=true` with
/// `shutdownGracePeriodByPodPriority` [0: 20 s, 10000: 20 s, SystemCriticalPriority: 10 s]:
/// the node goes `Ready=False` (`KubeletNotReady`, "node is shutting down"), a new pod is
/// rejected (`NodeShutdown`), the pods stop group by group, each after its group's grace
/// period (they use all of it), the Lease renews throughout, then the node is off.
#[tokio::test(start_paused = true)]
async fn graceful_shutdown_from_kubectl_stops_pods_by_priority_group_while_the_lease_renews() {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let group = |priority, secs| ShutdownPriorityGroup {
        priority,
        grace_period: Duration::from_secs(secs),
    };
    let config = SimConfig {
        shutdown_grace_period_by_pod_priority: vec![
            group(0, 20),
            group(10000, 20),
            group(SYSTEM_CRITICAL_PRIORITY, 10),
        ],
        wait_pod_grace_period: true,
        ..SimConfig::default()
    };
    let sim = NodeSimulator::new(client.clone(), config);
    sim.add_nodes(["n1", "n2"]);
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for p in [
        pod("low", None, None),
        pod("mid", Some(10000), None),
        pod("critical", None, Some("system-node-critical")),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    eventually(30, "pods running", || async {
        (phases(&pods).await == ["Running", "Running", "Running"]).then_some(())
    })
    .await;

    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.ccm-rs.io/shutdown": "true"}}})),
        )
        .await
        .unwrap();
    let t0 = Instant::now();
    let ready = eventually(5, "n1 Ready=False", || async {
        let n = nodes.get("n1").await.unwrap();
        n.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")
    })
    .await;
    assert_eq!(ready.reason.as_deref(), Some("KubeletNotReady"));
    assert_eq!(ready.message.as_deref(), Some("node is shutting down"));
    pods.create(&PostParams::default(), &pod("late", None, None))
        .await
        .unwrap();
    let late = eventually(5, "late rejected", || async {
        let p = pods.get("late").await.unwrap();
        (phase(&p) == "Failed").then_some(p)
    })
    .await;
    assert_eq!(late.status.unwrap().reason.as_deref(), Some("NodeShutdown"));

    let mut renewals = Vec::new();
    let mut last = renew_time(&client).await;
    let mut check = async |at: u64, want: [&str; 3]| {
        while t0.elapsed() < Duration::from_secs(at) {
            sleep(Duration::from_millis(500)).await;
            let now = renew_time(&client).await;
            if now != last {
                renewals.push(t0.elapsed().as_secs());
                last = now;
            }
        }
        assert_eq!(phases(&pods).await, want, "at t0+{at}s");
    };
    check(18, ["Running", "Running", "Running"]).await;
    check(22, ["Failed", "Running", "Running"]).await;
    check(38, ["Failed", "Running", "Running"]).await;
    check(42, ["Failed", "Failed", "Running"]).await;
    check(48, ["Failed", "Failed", "Running"]).await;
    check(52, ["Failed", "Failed", "Failed"]).await;
    assert!(
        renewals.len() >= 4,
        "the Lease renews while the node shuts down: {renewals:?}"
    );
    let off = renew_time(&client).await;
    sleep(Duration::from_secs(40)).await;
    assert_eq!(
        renew_time(&client).await,
        off,
        "powered off: no more renewals"
    );
    assert!(sim.heartbeats_stopped("n1").unwrap());
    assert!(!sim.heartbeats_stopped("n2").unwrap());
    assert_eq!(sim.stats().pods_shut_down, 3);
}
