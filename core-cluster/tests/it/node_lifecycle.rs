//! Node lifecycle and taint eviction scenarios against the in-process API server, with
//! paused time. Kubelets are simulated here: a Node, a Lease in `kube-node-lease`, and a
//! loop that renews the leases of the live nodes every 10 s. The rules are upstream's
//! `pkg/controller/nodelifecycle` and `pkg/controller/tainteviction`.

use std::{collections::HashSet, sync::Arc, time::Duration};

use core_cluster::{
    ApiServer, ApiServerConfig,
    controllers::{
        node_lifecycle::{NodeLifecycleConfig, NodeLifecycleController},
        taint_eviction::TaintEvictionController,
    },
    store::MemoryStore,
};
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Event, Node, Pod, Taint},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use parking_lot::Mutex;
use serde_json::json;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

/// A simulated set of kubelets: creates Nodes and Leases, renews the leases of live nodes
/// every 10 s with a `renewTime` that follows tokio time.
struct Sim {
    client: Client,
    alive: Arc<Mutex<HashSet<String>>>,
    start: Instant,
    base: Timestamp,
    shutdown: CancellationToken,
}

impl Sim {
    async fn new() -> Self {
        let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
            .await
            .unwrap();
        let client = Client::new(server.router(), "default");
        let sim = Sim {
            client,
            alive: Arc::default(),
            start: Instant::now(),
            base: Timestamp::now(),
            shutdown: CancellationToken::new(),
        };
        let (client, alive, start, base, token) = (
            sim.client.clone(),
            sim.alive.clone(),
            sim.start,
            sim.base,
            sim.shutdown.clone(),
        );
        tokio::spawn(async move {
            let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
            let mut tick = tokio::time::interval(Duration::from_secs(10));
            loop {
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let names: Vec<String> = alive.lock().iter().cloned().collect();
                let now = stamp(base, start);
                for name in names {
                    let patch = json!({"spec": {"renewTime": MicroTime(now)}});
                    leases
                        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .unwrap();
                }
            }
        });
        sim
    }

    fn now(&self) -> Timestamp {
        stamp(self.base, self.start)
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), "default")
    }

    /// A Ready node in `zone` with its lease, renewed from now on.
    async fn add_node(&self, name: &str, zone: &str) {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        }))
        .unwrap();
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        self.post_status(name, "True").await;
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": MicroTime(self.now())},
        }))
        .unwrap();
        Api::<Lease>::namespaced(self.client.clone(), "kube-node-lease")
            .create(&PostParams::default(), &lease)
            .await
            .unwrap();
        self.alive.lock().insert(name.to_string());
    }

    /// The kubelet posts its status with Ready = `ready` and a fresh heartbeat.
    async fn post_status(&self, name: &str, ready: &str) {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(self.now());
        let cond = |t: &str, s: &str| json!({"type": t, "status": s, "reason": "Kubelet", "message": "sim", "lastHeartbeatTime": now, "lastTransitionTime": now});
        let patch = json!({"status": {"conditions": [
            cond("Ready", ready),
            cond("MemoryPressure", "False"),
            cond("DiskPressure", "False"),
            cond("PIDPressure", "False"),
            cond("NetworkUnavailable", "False"),
        ]}});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
    }

    fn stop(&self, name: &str) {
        self.alive.lock().remove(name);
    }

    /// The kubelet comes back: posts Ready=True and renews its lease again.
    async fn revive(&self, name: &str) {
        self.post_status(name, "True").await;
        self.alive.lock().insert(name.to_string());
    }

    /// A running pod bound to `node`, Ready=True.
    async fn add_pod(&self, name: &str, node: &str, tolerations: serde_json::Value) {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}], "tolerations": tolerations},
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
        let patch = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .unwrap();
    }

    fn start_lifecycle(&self, config: NodeLifecycleConfig) {
        let c = NodeLifecycleController::new(self.client.clone(), config);
        let token = self.shutdown.clone();
        tokio::spawn(async move { c.run(token).await.unwrap() });
    }

    fn start_eviction(&self) {
        let c = TaintEvictionController::new(self.client.clone());
        tokio::spawn(c.run(self.shutdown.clone()));
    }

    async fn node(&self, name: &str) -> Node {
        self.nodes().get(name).await.unwrap()
    }

    async fn condition(&self, node: &str, type_: &str) -> (String, Option<String>, Option<String>) {
        let n = self.node(node).await;
        let c = n
            .status
            .unwrap()
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == type_)
            .unwrap();
        (c.status, c.reason, c.message)
    }

    async fn taints(&self, node: &str) -> Vec<Taint> {
        self.node(node)
            .await
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
    }

    async fn has_taint(&self, node: &str, key: &str, effect: &str) -> bool {
        self.taints(node)
            .await
            .iter()
            .any(|t| t.key == key && t.effect == effect)
    }

    /// Nodes carrying the taint.
    async fn count_taint(&self, key: &str, effect: &str) -> usize {
        self.nodes()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == key && t.effect == effect))
            })
            .count()
    }

    /// Gone, or being deleted gracefully.
    async fn pod_deleted(&self, name: &str) -> bool {
        match self.pods().get_opt(name).await.unwrap() {
            None => true,
            Some(p) => p.metadata.deletion_timestamp.is_some(),
        }
    }

    async fn events(&self, reason: &str) -> Vec<Event> {
        Api::<Event>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }
}

fn stamp(base: Timestamp, start: Instant) -> Timestamp {
    base + SignedDuration::try_from(start.elapsed()).unwrap()
}

/// Polls `check` every second until it holds; returns the time it took, or None after
/// `limit`.
async fn wait_for<F: AsyncFnMut() -> bool>(limit: Duration, mut check: F) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if check().await {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        sleep(Duration::from_secs(1)).await;
    }
}

const NR: &str = "node.kubernetes.io/not-ready";
const UR: &str = "node.kubernetes.io/unreachable";

#[tokio::test(start_paused = true)]
async fn defaults_match_upstream_1_33() {
    let c = NodeLifecycleConfig::default();
    assert_eq!(c.node_monitor_period, Duration::from_secs(5));
    // 50 s since v1.32; we present 1.33
    assert_eq!(c.node_monitor_grace_period, Duration::from_secs(50));
    assert_eq!(c.node_startup_grace_period, Duration::from_secs(60));
    assert_eq!(c.large_cluster_size_threshold, 50);
    assert_eq!(
        (
            c.node_eviction_rate,
            c.secondary_node_eviction_rate,
            c.unhealthy_zone_threshold
        ),
        (0.1, 0.01, 0.55)
    );
}

/// The times the controller writes (the Ready condition's `lastTransitionTime`, the
/// unreachable taint's `timeAdded`) come from the same clock as its timers, as upstream's
/// controller reads one injected clock for both: under paused tokio time they are about
/// 80 s after the start, not the fraction of a second of real time the test takes.
#[tokio::test(start_paused = true)]
async fn written_times_follow_the_controller_clock() {
    let sim = Sim::new().await;
    sim.add_node("n1", "a").await;
    sim.add_node("n2", "a").await;
    let started = k8s_openapi::jiff::Timestamp::now();
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sleep(Duration::from_secs(30)).await;
    sim.stop("n1");
    let became_unknown = wait_for(Duration::from_secs(120), async || {
        sim.taints("n1").await.iter().any(|t| t.key == UR)
    })
    .await;
    assert!(
        became_unknown.is_some(),
        "n1 never got the unreachable taint"
    );
    let node = sim.node("n1").await;
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "Unknown");
    let transition = ready.last_transition_time.unwrap().0;
    let taint = sim
        .taints("n1")
        .await
        .into_iter()
        .find(|t| t.key == UR)
        .unwrap();
    let added = taint.time_added.unwrap().0;
    let since_start = |t: k8s_openapi::jiff::Timestamp| t.duration_since(started).as_secs();
    // Stopped at 30 s; Unknown once the 50 s grace has passed since the last renewal.
    assert!(
        (60..=120).contains(&since_start(transition)),
        "Ready went Unknown {}s after the start",
        since_start(transition)
    );
    assert!(
        (60..=150).contains(&since_start(added)) && added >= transition,
        "the taint was added {}s after the start",
        since_start(added)
    );
    sim.shutdown.cancel();
}

/// One node dies: Unknown after the grace period, NoSchedule then NoExecute unreachable
/// taints, pods marked NotReady and evicted 300 s after the NoExecute taint.
#[tokio::test(start_paused = true)]
async fn one_node_dies() {
    let sim = Sim::new().await;
    for n in ["n1", "n2", "n3"] {
        sim.add_node(n, "a").await;
    }
    sim.add_pod("p1", "n1", json!([])).await;
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sim.start_eviction();
    sleep(Duration::from_secs(30)).await;
    // Registration event on first sight
    assert_eq!(sim.events("RegisteredNode").await.len(), 3);
    assert_eq!(sim.condition("n1", "Ready").await.0, "True");
    assert!(sim.taints("n1").await.is_empty());

    sim.stop("n1");
    // The last renewal was at most 10 s ago; a 40 s lease
    // duration is not used, the 50 s grace on our clock is.
    sleep(Duration::from_secs(39)).await;
    assert_eq!(sim.condition("n1", "Ready").await.0, "True");
    // Unknown by renewal + 50 s + one period
    let took = wait_for(Duration::from_secs(25), async || {
        sim.condition("n1", "Ready").await.0 == "Unknown"
    })
    .await;
    assert!(took.is_some(), "n1 never became Unknown");
    let (status, reason, message) = sim.condition("n1", "Ready").await;
    assert_eq!(status, "Unknown");
    assert_eq!(reason.as_deref(), Some("NodeStatusUnknown"));
    assert_eq!(
        message.as_deref(),
        Some("Kubelet stopped posting node status.")
    );
    for c in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(sim.condition("n1", c).await.0, "Unknown", "{c}");
    }
    // NetworkUnavailable untouched
    assert_eq!(sim.condition("n1", "NetworkUnavailable").await.0, "False");
    // the other nodes stay Ready
    assert_eq!(sim.condition("n2", "Ready").await.0, "True");

    // Unreachable NoSchedule follows the condition at once
    assert!(
        wait_for(Duration::from_secs(2), async || sim
            .has_taint("n1", UR, "NoSchedule")
            .await)
        .await
        .is_some()
    );
    // Pods Ready=False, NodeNotReady events
    let pod = sim.pods().get("p1").await.unwrap();
    let ready = pod.status.unwrap().conditions.unwrap();
    assert_eq!(
        ready.iter().find(|c| c.type_ == "Ready").unwrap().status,
        "False"
    );
    let events = sim.events("NodeNotReady").await;
    assert!(
        events
            .iter()
            .any(|e| e.message.as_deref() == Some("Node n1 status is now: NodeNotReady"))
    );
    assert!(
        events
            .iter()
            .any(|e| e.message.as_deref() == Some("Node is not ready"))
    );

    // NoExecute unreachable in the next pass
    // (first node of the zone: a token is there), with timeAdded, exclusive of not-ready
    let took = wait_for(Duration::from_secs(12), async || {
        sim.has_taint("n1", UR, "NoExecute").await
    })
    .await;
    assert!(took.is_some(), "no NoExecute taint");
    let taints = sim.taints("n1").await;
    let t = taints
        .iter()
        .find(|t| t.key == UR && t.effect == "NoExecute")
        .unwrap();
    assert!(t.time_added.is_some());
    assert!(!taints.iter().any(|t| t.key == NR));

    // Default 300 s toleration, counted from the taint
    sleep(Duration::from_secs(290)).await;
    assert!(!sim.pod_deleted("p1").await, "evicted before 300 s");
    assert!(
        wait_for(Duration::from_secs(20), async || sim
            .pod_deleted("p1")
            .await)
        .await
        .is_some(),
        "not evicted after 300 s"
    );
    // DisruptionTarget condition before the DELETE
    let pod = sim.pods().get("p1").await.unwrap();
    let conds = pod.status.unwrap().conditions.unwrap();
    let dt = conds
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap();
    assert_eq!(
        (dt.status.as_str(), dt.reason.as_deref()),
        ("True", Some("DeletionByTaintManager"))
    );
    let ev = sim.events("TaintManagerEviction").await;
    assert!(
        ev.iter()
            .any(|e| e.message.as_deref() == Some("Marking for deletion Pod default/p1"))
    );
    sim.shutdown.cancel();
}

/// A node comes back: both NoExecute and NoSchedule lifecycle taints go.
#[tokio::test(start_paused = true)]
async fn node_comes_back() {
    let sim = Sim::new().await;
    for n in ["n1", "n2", "n3"] {
        sim.add_node(n, "a").await;
    }
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sleep(Duration::from_secs(20)).await;
    sim.stop("n1");
    assert!(
        wait_for(Duration::from_secs(90), async || sim
            .has_taint("n1", UR, "NoExecute")
            .await)
        .await
        .is_some()
    );
    // Ready=False now: immediate swap to not-ready
    sim.post_status("n1", "False").await;
    assert!(
        wait_for(Duration::from_secs(12), async || sim
            .has_taint("n1", NR, "NoExecute")
            .await
            && !sim.has_taint("n1", UR, "NoExecute").await)
        .await
        .is_some(),
        "no swap to not-ready"
    );
    assert!(sim.has_taint("n1", NR, "NoSchedule").await);
    // Ready again → lifecycle taints removed
    sim.revive("n1").await;
    assert!(
        wait_for(Duration::from_secs(12), async || sim
            .taints("n1")
            .await
            .is_empty())
        .await
        .is_some(),
        "taints left: {:?}",
        sim.taints("n1").await
    );
    sleep(Duration::from_secs(60)).await;
    assert_eq!(sim.condition("n1", "Ready").await.0, "True");
    assert!(sim.taints("n1").await.is_empty());
    sim.shutdown.cancel();
}

/// One zone of three fails in a large cluster: partial disruption, secondary rate.
#[tokio::test(start_paused = true)]
async fn partial_disruption_large_zone_secondary_rate() {
    let sim = Sim::new().await;
    for i in 0..52 {
        sim.add_node(&format!("a{i}"), "a").await;
    }
    for z in ["b", "c"] {
        for i in 0..2 {
            sim.add_node(&format!("{z}{i}"), z).await;
        }
    }
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sleep(Duration::from_secs(20)).await;
    for i in 0..40 {
        sim.stop(&format!("a{i}"));
    }
    // 40 of 52 not ready → partial disruption
    let first = wait_for(Duration::from_secs(90), async || {
        sim.count_taint(UR, "NoExecute").await >= 1
    })
    .await;
    assert!(first.is_some(), "no NoExecute taint at all");
    assert_eq!(sim.count_taint(UR, "NoSchedule").await, 40);
    // Zone of 52 > 50 → 0.01/s: one more taint per 100 s
    // (at the normal 0.1/s there would be 7 after 60 s)
    sleep(Duration::from_secs(60)).await;
    assert_eq!(sim.count_taint(UR, "NoExecute").await, 1);
    sleep(Duration::from_secs(45)).await;
    assert_eq!(sim.count_taint(UR, "NoExecute").await, 2);
    sim.shutdown.cancel();
}

/// One zone of three fails in a small cluster: partial disruption halts NoExecute taints.
#[tokio::test(start_paused = true)]
async fn partial_disruption_small_zone_halts() {
    let sim = Sim::new().await;
    for z in ["a", "b", "c"] {
        for i in 0..4 {
            sim.add_node(&format!("{z}{i}"), z).await;
        }
    }
    sim.add_pod("p", "a0", json!([])).await;
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sim.start_eviction();
    sleep(Duration::from_secs(20)).await;
    for i in 0..3 {
        sim.stop(&format!("a{i}"));
    }
    // 3 of 4 not ready, zone ≤ 50 nodes → rate 0
    assert!(
        wait_for(Duration::from_secs(90), async || sim
            .count_taint(UR, "NoSchedule")
            .await
            == 3)
        .await
        .is_some()
    );
    sleep(Duration::from_secs(400)).await;
    assert_eq!(sim.count_taint(UR, "NoExecute").await, 0);
    assert!(!sim.pod_deleted("p").await);
    sim.shutdown.cancel();
}

/// Every zone fails: master disruption mode, nothing is tainted NoExecute or evicted.
#[tokio::test(start_paused = true)]
async fn all_zones_fail_no_evictions() {
    let sim = Sim::new().await;
    let mut names = Vec::new();
    for z in ["a", "b", "c"] {
        for i in 0..2 {
            let n = format!("{z}{i}");
            sim.add_node(&n, z).await;
            names.push(n);
        }
    }
    sim.add_pod("p", "a0", json!([])).await;
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sim.start_eviction();
    sleep(Duration::from_secs(20)).await;
    for n in &names {
        sim.stop(n);
    }
    assert!(
        wait_for(Duration::from_secs(90), async || sim
            .count_taint(UR, "NoSchedule")
            .await
            == 6)
        .await
        .is_some()
    );
    // All zones fully disrupted → limiters 0
    sleep(Duration::from_secs(400)).await;
    for n in &names {
        assert_eq!(sim.condition(n, "Ready").await.0, "Unknown");
    }
    assert_eq!(sim.count_taint(UR, "NoExecute").await, 0);
    assert!(!sim.pod_deleted("p").await);
    sim.shutdown.cancel();
}

/// Cordon gives the unschedulable taint; MemoryPressure=True gives the memory-pressure
/// taint; other taints are left alone.
#[tokio::test(start_paused = true)]
async fn cordon_and_memory_pressure_taints() {
    let sim = Sim::new().await;
    sim.add_node("n1", "a").await;
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sleep(Duration::from_secs(6)).await;
    let other = json!({"spec": {"taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}});
    sim.nodes()
        .patch("n1", &PatchParams::default(), &Patch::Strategic(other))
        .await
        .unwrap();
    sim.nodes()
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(3), async || {
            sim.has_taint("n1", "node.kubernetes.io/unschedulable", "NoSchedule")
                .await
        })
        .await
        .is_some()
    );
    let patch = json!({"status": {"conditions": [{"type": "MemoryPressure", "status": "True"}]}});
    sim.nodes()
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(3), async || {
            sim.has_taint("n1", "node.kubernetes.io/memory-pressure", "NoSchedule")
                .await
        })
        .await
        .is_some()
    );
    // uncordon and relief remove them; the foreign taint stays
    sim.nodes()
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"unschedulable": false}})),
        )
        .await
        .unwrap();
    let patch = json!({"status": {"conditions": [{"type": "MemoryPressure", "status": "False"}]}});
    sim.nodes()
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(3), async || {
            let t = sim.taints("n1").await;
            t.len() == 1 && t[0].key == "example.com/x"
        })
        .await
        .is_some(),
        "taints: {:?}",
        sim.taints("n1").await
    );
    sim.shutdown.cancel();
}

/// Taint eviction: untolerated at once, tolerationSeconds honoured, forever stays, a
/// removed taint cancels.
#[tokio::test(start_paused = true)]
async fn taint_eviction_toleration_seconds_and_cancel() {
    let sim = Sim::new().await;
    sim.add_node("n1", "a").await;
    sim.add_node("n2", "a").await;
    let tol = |secs: Option<i64>| json!([{"key": "example.com/t", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": secs}]);
    sim.add_pod("none", "n1", json!([])).await;
    sim.add_pod("sixty", "n1", tol(Some(60))).await;
    sim.add_pod("forever", "n1", tol(None)).await;
    sim.add_pod("cancelled", "n2", tol(Some(60))).await;
    sim.start_eviction();
    sleep(Duration::from_secs(1)).await;
    let taint = json!({"spec": {"taints": [{"key": "example.com/t", "effect": "NoExecute"}]}});
    for n in ["n1", "n2"] {
        sim.nodes()
            .patch(n, &PatchParams::default(), &Patch::Strategic(taint.clone()))
            .await
            .unwrap();
    }
    // Not tolerated → deleted at once
    assert!(
        wait_for(Duration::from_secs(1), async || sim
            .pod_deleted("none")
            .await)
        .await
        .is_some()
    );
    sleep(Duration::from_secs(30)).await;
    // Taint removed before 60 s → cancelled, with an event
    sim.nodes()
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    sleep(Duration::from_secs(25)).await;
    // 60 s
    assert!(!sim.pod_deleted("sixty").await, "deleted before 60 s");
    assert!(
        wait_for(Duration::from_secs(10), async || sim
            .pod_deleted("sixty")
            .await)
        .await
        .is_some()
    );
    sleep(Duration::from_secs(200)).await;
    assert!(!sim.pod_deleted("forever").await);
    assert!(!sim.pod_deleted("cancelled").await);
    let ev = sim.events("TaintManagerEviction").await;
    assert!(
        ev.iter()
            .any(|e| e.message.as_deref() == Some("Cancelling deletion of Pod default/cancelled"))
    );
    assert!(
        ev.iter()
            .any(|e| e.message.as_deref() == Some("Marking for deletion Pod default/sixty"))
    );
    sim.shutdown.cancel();
}

/// A node whose kubelet never posts status: Unknown after the 60 s startup grace with the
/// never-posted reason; a deleted node gets a RemovingNode event.
#[tokio::test(start_paused = true)]
async fn never_posted_startup_grace_and_removal() {
    let sim = Sim::new().await;
    sim.add_node("ok", "a").await;
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "silent", "labels": {"topology.kubernetes.io/zone": "a"}},
    }))
    .unwrap();
    sim.nodes()
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    sim.start_lifecycle(NodeLifecycleConfig::default());
    // Not before the 60 s startup grace (counted on our clock)
    sleep(Duration::from_secs(58)).await;
    let conds = sim
        .node("silent")
        .await
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(conds.is_empty(), "{conds:?}");
    // Conditions appended as never posted
    assert!(
        wait_for(Duration::from_secs(10), async || {
            sim.node("silent")
                .await
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| !c.is_empty())
        })
        .await
        .is_some()
    );
    for c in ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"] {
        let (status, reason, message) = sim.condition("silent", c).await;
        assert_eq!(status, "Unknown");
        assert_eq!(reason.as_deref(), Some("NodeStatusNeverUpdated"));
        assert_eq!(
            message.as_deref(),
            Some("Kubelet never posted node status.")
        );
    }
    // NetworkUnavailable is not added
    let n = sim.node("silent").await;
    assert!(
        !n.status
            .unwrap()
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "NetworkUnavailable")
    );
    // then the unreachable taints, as for any Unknown node
    assert!(
        wait_for(Duration::from_secs(15), async || sim
            .has_taint("silent", UR, "NoExecute")
            .await)
        .await
        .is_some()
    );
    sim.nodes()
        .delete("silent", &Default::default())
        .await
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(10), async || {
            sim.events("RemovingNode")
                .await
                .iter()
                .any(|e| e.message.as_deref() == Some("Removing Node silent from Controller"))
        })
        .await
        .is_some()
    );
    sim.shutdown.cancel();
}

/// Leaving master disruption mode: once one zone has a Ready node again, the zones that
/// are still fully disrupted get the normal rate back.
#[tokio::test(start_paused = true)]
async fn leaving_all_disrupted_resumes_tainting() {
    let sim = Sim::new().await;
    for z in ["a", "b"] {
        for i in 0..2 {
            sim.add_node(&format!("{z}{i}"), z).await;
        }
    }
    sim.start_lifecycle(NodeLifecycleConfig::default());
    sleep(Duration::from_secs(20)).await;
    for n in ["a0", "a1", "b0", "b1"] {
        sim.stop(n);
    }
    assert!(
        wait_for(Duration::from_secs(90), async || sim
            .count_taint(UR, "NoSchedule")
            .await
            == 4)
        .await
        .is_some()
    );
    sleep(Duration::from_secs(30)).await;
    assert_eq!(sim.count_taint(UR, "NoExecute").await, 0);
    // b0 comes back: zone b is no longer fully disrupted
    sim.revive("b0").await;
    // The Unknown nodes of zone a are then tainted under
    // the normal rate (zone a is fully disrupted, zone b is not)
    assert!(
        wait_for(Duration::from_secs(30), async || sim
            .count_taint(UR, "NoExecute")
            .await
            >= 1)
        .await
        .is_some(),
        "no NoExecute taint after leaving master disruption"
    );
    assert!(!sim.has_taint("b0", UR, "NoExecute").await);
    assert!(!sim.has_taint("b0", UR, "NoSchedule").await);
    sim.shutdown.cancel();
}

/// A taint patch built from a stale cached node meets a 409 (its resourceVersion is in the
/// patch) and is redone on a fresh GET, so a taint added meanwhile by someone else stays.
#[tokio::test(start_paused = true)]
async fn taint_patch_carries_resource_version_and_retries() {
    use core_cluster::controllers::node_lifecycle::swap_node_taints;
    let sim = Sim::new().await;
    sim.add_node("n1", "a").await;
    let stale = sim.node("n1").await;
    let other = json!({"spec": {"taints": [{"key": "example.com/x", "effect": "NoSchedule"}]}});
    sim.nodes()
        .patch("n1", &PatchParams::default(), &Patch::Strategic(other))
        .await
        .unwrap();
    let add = [Taint {
        key: UR.into(),
        effect: "NoExecute".into(),
        ..Taint::default()
    }];
    let added_at: k8s_openapi::jiff::Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
    let done = swap_node_taints(&sim.nodes(), Some(&stale), "n1", &add, &[], added_at)
        .await
        .unwrap();
    assert!(done);
    let taints = sim.taints("n1").await;
    let keys: Vec<&str> = taints.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(keys, vec!["example.com/x", UR], "{taints:?}");
    assert_eq!(taints[1].time_added.as_ref().map(|t| t.0), Some(added_at));
    // and removal replaces the list whole
    let done = swap_node_taints(&sim.nodes(), None, "n1", &[], &add, added_at)
        .await
        .unwrap();
    assert!(done);
    let keys: Vec<String> = sim.taints("n1").await.into_iter().map(|t| t.key).collect();
    assert_eq!(keys, vec!["example.com/x".to_string()]);
    sim.shutdown.cancel();
}
