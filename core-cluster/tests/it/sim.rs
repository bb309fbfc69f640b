//! The node simulator (`core_cluster::sim`) against the in-process API server, with paused
//! tokio time, checked against what upstream's kubelet does (`pkg/kubelet/nodelease`,
//! `kubelet_node_status.go`).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    body::Body,
    http::{Request, Response, StatusCode},
};
use core_cluster::{
    ApiServer, ApiServerConfig,
    sim::{NodeSimulator, SimConfig, SimNode},
    store::MemoryStore,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use parking_lot::Mutex;
use serde_json::json;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// Lease requests seen by the faulty transport: (method, tokio time).
type Seen = Arc<Mutex<Vec<(String, Instant)>>>;

struct Harness {
    client: Client,
    sim: NodeSimulator,
    stop: CancellationToken,
    /// While set, every Lease request gets a 500.
    fail_leases: Arc<AtomicBool>,
    /// While set, Lease requests wait (an API server stall).
    stall_leases: Arc<AtomicBool>,
    lease_requests: Seen,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(config: SimConfig, nodes: Vec<SimNode>) -> Harness {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let router = server.router();
    let fail_leases = Arc::new(AtomicBool::new(false));
    let stall_leases = Arc::new(AtomicBool::new(false));
    let lease_requests: Seen = Arc::default();
    let (fail, stall, seen) = (
        fail_leases.clone(),
        stall_leases.clone(),
        lease_requests.clone(),
    );
    // A transport that can make the API fail Lease requests.
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let (router, fail, stall, seen) =
            (router.clone(), fail.clone(), stall.clone(), seen.clone());
        async move {
            if req.uri().path().contains("/leases") {
                while stall.load(Ordering::SeqCst) {
                    sleep(Duration::from_millis(10)).await;
                }
                seen.lock().push((req.method().to_string(), Instant::now()));
                if fail.load(Ordering::SeqCst) {
                    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "injected", "reason": "InternalError", "code": 500});
                    return Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .status(StatusCode::INTERNAL_SERVER_ERROR)
                            .header("content-type", "application/json")
                            .body(Body::from(body.to_string()))
                            .unwrap(),
                    );
                }
            }
            Ok(router.oneshot(req.map(Body::new)).await.unwrap())
        }
    });
    let client = Client::new(service, "default");
    let sim = NodeSimulator::new(client.clone(), config);
    sim.add_nodes(nodes);
    let stop = CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    let h = Harness {
        client,
        sim,
        stop,
        fail_leases,
        stall_leases,
        lease_requests,
    };
    let n = h.sim.node_names().len() as u64;
    for _ in 0..100 {
        if h.sim.stats().registered == n {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(h.sim.stats().registered, n, "nodes registered");
    h
}

fn leases(c: &Client) -> Api<Lease> {
    Api::namespaced(c.clone(), "kube-node-lease")
}

async fn renew_time(c: &Client, node: &str) -> jiff::Timestamp {
    leases(c)
        .get(node)
        .await
        .unwrap()
        .spec
        .unwrap()
        .renew_time
        .unwrap()
        .0
}

/// Samples a node's renewTime every 500 ms for `total`, returning the (test-relative)
/// seconds at which it was seen to have moved.
async fn renewal_times(c: &Client, node: &str, total: Duration) -> Vec<f64> {
    let start = Instant::now();
    let mut last = renew_time(c, node).await;
    let mut moves = Vec::new();
    while start.elapsed() < total {
        sleep(Duration::from_millis(500)).await;
        let now = renew_time(c, node).await;
        if now != last {
            moves.push(start.elapsed().as_secs_f64());
            last = now;
        }
    }
    moves
}

fn condition<'a>(node: &'a Node, t: &str) -> Option<&'a k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
}

async fn annotate(c: &Client, node: &str, ann: serde_json::Value) {
    Api::<Node>::all(c.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": ann}})),
        )
        .await
        .unwrap();
}

fn pod(name: &str, node: &str, priority_class: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "priorityClassName": priority_class,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        }
    }))
    .unwrap()
}

async fn wait_for<F: Fn(&Pod) -> bool>(api: &Api<Pod>, name: &str, f: F) -> Pod {
    for _ in 0..200 {
        if let Some(p) = api.get_opt(name).await.unwrap()
            && f(&p)
        {
            return p;
        }
        sleep(Duration::from_millis(50)).await;
    }
    panic!("pod {name} never reached the expected state");
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// The Node as kubelet registers it with
/// `--cloud-provider=external --node-ip`, and its Lease with an ownerReference.
#[tokio::test(start_paused = true)]
async fn registration_shape() {
    let mut config = SimConfig::default().external_cloud_provider();
    config.node_labels = BTreeMap::from([("pool".into(), "sim".into())]);
    let ip = IpAddr::V4(Ipv4Addr::new(192, 168, 7, 9));
    let h = start(
        config,
        vec![SimNode::new("n1").zone("zone-a").ip(ip), SimNode::new("n2")],
    )
    .await;
    let nodes: Api<Node> = Api::all(h.client.clone());
    let n1 = nodes.get("n1").await.unwrap();
    let labels = n1.labels();
    assert_eq!(labels["kubernetes.io/hostname"], "n1");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    assert_eq!(labels["topology.kubernetes.io/zone"], "zone-a");
    assert_eq!(labels["pool"], "sim");
    assert_eq!(
        n1.annotations()["alpha.kubernetes.io/provided-node-ip"],
        "192.168.7.9"
    );
    let taints = n1.spec.as_ref().unwrap().taints.clone().unwrap();
    assert_eq!(taints.len(), 1);
    assert_eq!(
        taints[0].key,
        "node.cloudprovider.kubernetes.io/uninitialized"
    );
    assert_eq!(taints[0].value.as_deref(), Some("true"));
    assert_eq!(taints[0].effect, "NoSchedule");
    let status = n1.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["pods"].0, "110");
    assert_eq!(status.capacity.as_ref().unwrap()["cpu"].0, "4");
    assert_eq!(status.allocatable.as_ref().unwrap()["memory"].0, "16Gi");
    let info = status.node_info.as_ref().unwrap();
    assert_eq!(info.kubelet_version, "v1.33.0");
    assert_eq!(info.operating_system, "linux");
    let addrs: Vec<(String, String)> = status
        .addresses
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect();
    assert_eq!(
        addrs,
        [
            ("InternalIP".to_owned(), "192.168.7.9".to_owned()),
            ("Hostname".to_owned(), "n1".to_owned())
        ]
    );
    let ready = condition(&n1, "Ready").unwrap();
    assert_eq!(ready.status, "True");
    assert_eq!(ready.reason.as_deref(), Some("KubeletReady"));
    assert_eq!(
        ready.message.as_deref(),
        Some("kubelet is posting ready status")
    );
    for (t, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ] {
        let c = condition(&n1, t).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some(reason))
        );
    }
    assert!(condition(&n1, "NetworkUnavailable").is_none());

    // No --node-ip: no annotation, an InternalIP is still reported, no zone label.
    let n2 = nodes.get("n2").await.unwrap();
    assert!(
        !n2.annotations()
            .contains_key("alpha.kubernetes.io/provided-node-ip")
    );
    assert!(!n2.labels().contains_key("topology.kubernetes.io/zone"));

    let lease = leases(&h.client).get("n1").await.unwrap();
    let spec = lease.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert!(spec.renew_time.is_some());
    assert!(spec.acquire_time.is_none() && spec.lease_transitions.is_none());
    let owners = lease.owner_references();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (
            owners[0].api_version.as_str(),
            owners[0].kind.as_str(),
            owners[0].name.as_str()
        ),
        ("v1", "Node", "n1")
    );
    assert_eq!(Some(&owners[0].uid), n1.metadata.uid.as_ref());
}

/// `renewTime` moves every 10 s (+ up to 4 % jitter) on the tokio clock, by PUT
/// without GET.
#[tokio::test(start_paused = true)]
async fn lease_renewed_every_10s() {
    let h = start(SimConfig::default(), vec!["n1".into()]).await;
    let mut times = Vec::new();
    let mut last = renew_time(&h.client, "n1").await;
    let start = Instant::now();
    h.lease_requests.lock().clear();
    while start.elapsed() < Duration::from_secs(61) {
        sleep(Duration::from_millis(100)).await;
        let now = renew_time(&h.client, "n1").await;
        if now != last {
            times.push(now);
            last = now;
        }
    }
    assert!(
        (5..=7).contains(&times.len()),
        "renewals in 61 s: {}",
        times.len()
    );
    for w in times.windows(2) {
        let gap = w[1].duration_since(w[0]).as_secs_f64();
        assert!((10.0..=10.45).contains(&gap), "renew gap {gap}");
    }
    // The simulator itself only PUT (our own GETs are the test's).
    let puts = h
        .lease_requests
        .lock()
        .iter()
        .filter(|(m, _)| m == "PUT")
        .count();
    assert_eq!(puts, times.len());
}

/// Scale: after an API server stall the delayed renewals do not stay bunched; the nodes
/// keep their phases, so renewals stay spread over the interval.
#[tokio::test(start_paused = true)]
async fn renewals_stay_spread_after_a_stall() {
    let names: Vec<SimNode> = (0..200).map(|i| SimNode::new(format!("n{i}"))).collect();
    let h = start(SimConfig::default(), names).await;
    sleep(Duration::from_secs(20)).await;
    h.stall_leases.store(true, Ordering::SeqCst);
    sleep(Duration::from_secs(6)).await;
    h.stall_leases.store(false, Ordering::SeqCst);
    // The held-up renewals complete together at the release; look from 2 s later.
    sleep(Duration::from_secs(2)).await;
    h.lease_requests.lock().clear();
    let from = Instant::now();
    sleep(Duration::from_secs(30)).await;
    let mut buckets = [0u32; 30];
    for (m, t) in h.lease_requests.lock().iter() {
        if m == "PUT" {
            let s = (*t - from).as_secs() as usize;
            if s < 30 {
                buckets[s] += 1;
            }
        }
    }
    let total: u32 = buckets.iter().sum();
    assert!((570..=610).contains(&total), "200 nodes, 30 s: {total}");
    // 20/s on average; about 120 held-up nodes must not come back as one burst.
    let max = *buckets.iter().max().unwrap();
    assert!(max <= 40, "renewals per second after a stall: {buckets:?}");
}

/// A deleted Lease is recreated by the next sync, with its ownerReference: the renewal's
/// PUT itself recreates it, as kube-apiserver's Lease strategy allows a create on update
/// (`pkg/registry/coordination/lease/strategy.go AllowCreateOnUpdate`), so no second POST.
#[tokio::test(start_paused = true)]
async fn deleted_lease_is_recreated() {
    let h = start(SimConfig::default(), vec!["n1".into()]).await;
    let api = leases(&h.client);
    let uid_before = api.get("n1").await.unwrap().uid();
    api.delete("n1", &DeleteParams::default()).await.unwrap();
    sleep(Duration::from_secs(11)).await;
    let lease = api.get("n1").await.unwrap();
    assert_ne!(lease.uid(), uid_before);
    assert_eq!(lease.owner_references()[0].name, "n1");
    assert_eq!(h.sim.stats().lease_creates, 1);
}

/// When the API fails, 5 PUTs, then GETs with waits of 200 ms doubling to 7 s;
/// renewals resume when the API is back.
#[tokio::test(start_paused = true)]
async fn lease_backoff_on_api_errors() {
    let h = start(SimConfig::default(), vec!["n1".into()]).await;
    h.fail_leases.store(true, Ordering::SeqCst);
    h.lease_requests.lock().clear();
    sleep(Duration::from_secs(40)).await;
    let seen = h.lease_requests.lock().clone();
    let puts: Vec<_> = seen.iter().filter(|(m, _)| m == "PUT").collect();
    assert_eq!(puts.len(), 5, "maxUpdateRetries PUTs: {seen:?}");
    let gets: Vec<Instant> = seen
        .iter()
        .filter(|(m, _)| m == "GET")
        .map(|(_, t)| *t)
        .collect();
    let gaps: Vec<u128> = gets.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert!(gaps.len() >= 7, "gaps {gaps:?}");
    assert_eq!(&gaps[..7], &[200, 400, 800, 1600, 3200, 6400, 7000]);
    assert!(
        gaps[7..].iter().all(|g| *g == 7000),
        "capped at 7 s: {gaps:?}"
    );
    let before = h.sim.stats().lease_renewals;
    h.fail_leases.store(false, Ordering::SeqCst);
    sleep(Duration::from_secs(8)).await;
    // Back within one backoff step (≤ 7 s), then on with the schedule.
    assert!(h.sim.stats().lease_renewals > before, "renewed once back");
    let t = renew_time(&h.client, "n1").await;
    sleep(Duration::from_secs(11)).await;
    assert!(renew_time(&h.client, "n1").await > t, "renewals go on");
}

/// Fault injection: `sim.ccm-rs.io/heartbeat=stopped` stops renewals and status posts;
/// `running` resumes them at once; the test methods do the same.
#[tokio::test(start_paused = true)]
async fn heartbeat_annotation_stops_and_resumes() {
    let h = start(SimConfig::default(), vec!["n1".into(), "n2".into()]).await;
    annotate(
        &h.client,
        "n1",
        json!({"sim.ccm-rs.io/heartbeat": "stopped"}),
    )
    .await;
    sleep(Duration::from_millis(100)).await;
    assert!(h.sim.heartbeats_stopped("n1").unwrap());
    let (t1, t2) = (
        renew_time(&h.client, "n1").await,
        renew_time(&h.client, "n2").await,
    );
    sleep(Duration::from_secs(60)).await;
    assert_eq!(
        renew_time(&h.client, "n1").await,
        t1,
        "stopped node renewed"
    );
    assert!(
        renew_time(&h.client, "n2").await > t2,
        "other node keeps renewing"
    );

    annotate(
        &h.client,
        "n1",
        json!({"sim.ccm-rs.io/heartbeat": "running"}),
    )
    .await;
    sleep(Duration::from_millis(500)).await;
    assert!(
        renew_time(&h.client, "n1").await > t1,
        "renewed at once on resume"
    );

    // The same through the methods.
    h.sim.stop_heartbeats("n2").unwrap();
    let t2 = renew_time(&h.client, "n2").await;
    sleep(Duration::from_secs(30)).await;
    assert_eq!(renew_time(&h.client, "n2").await, t2);
    h.sim.resume_heartbeats("n2").unwrap();
    sleep(Duration::from_millis(500)).await;
    assert!(renew_time(&h.client, "n2").await > t2);
    assert!(h.sim.stop_heartbeats("nope").is_err());
}

/// Fault injection: `flapping` with a 20 s period: stopped for 20 s, running for 20 s, …
#[tokio::test(start_paused = true)]
async fn heartbeat_flapping() {
    let h = start(SimConfig::default(), vec!["n1".into()]).await;
    annotate(
        &h.client,
        "n1",
        json!({"sim.ccm-rs.io/heartbeat": "flapping", "sim.ccm-rs.io/flap-period": "20"}),
    )
    .await;
    let moves = renewal_times(&h.client, "n1", Duration::from_secs(80)).await;
    let running = |t: f64| (20.0..=40.5).contains(&t) || (60.0..=80.5).contains(&t);
    assert!(moves.iter().all(|t| running(*t)), "renewals {moves:?}");
    assert!(
        moves.iter().any(|t| *t < 21.0),
        "renewed at once when running: {moves:?}"
    );
    assert!(moves.iter().any(|t| (60.0..61.0).contains(t)), "{moves:?}");
    assert!(moves.len() >= 4, "{moves:?}");
}

/// Fault injection: `kube-system/node-simulator` `stopped-zones` stops a whole zone.
#[tokio::test(start_paused = true)]
async fn stopped_zone_from_configmap() {
    let h = start(
        SimConfig::default(),
        vec![
            SimNode::new("a1").zone("zone-a"),
            SimNode::new("a2").zone("zone-a"),
            SimNode::new("b1").zone("zone-b"),
        ],
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(h.client.clone(), "kube-system");
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "node-simulator"},
        "data": {"stopped-zones": "zone-a, zone-c"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    sleep(Duration::from_millis(100)).await;
    let before: Vec<_> =
        futures::future::join_all(["a1", "a2", "b1"].map(|n| renew_time(&h.client, n))).await;
    sleep(Duration::from_secs(45)).await;
    assert_eq!(renew_time(&h.client, "a1").await, before[0]);
    assert_eq!(renew_time(&h.client, "a2").await, before[1]);
    assert!(renew_time(&h.client, "b1").await > before[2]);

    cms.delete("node-simulator", &DeleteParams::default())
        .await
        .unwrap();
    sleep(Duration::from_millis(500)).await;
    assert!(renew_time(&h.client, "a1").await > before[0]);
    assert!(renew_time(&h.client, "a2").await > before[1]);
}

/// Node status is posted again within 10 s when it differs from what the API
/// shows (a controller set Ready=Unknown), and every 5 minutes otherwise.
#[tokio::test(start_paused = true)]
async fn status_posted_on_change_and_every_5_minutes() {
    let h = start(SimConfig::default(), vec!["n1".into()]).await;
    let nodes: Api<Node> = Api::all(h.client.clone());
    // Nothing changes: no post before 5 minutes.
    sleep(Duration::from_secs(290)).await;
    assert_eq!(h.sim.stats().status_posts, 0);
    // The status loop looks every 10 s with kubelet's jitter (`wait.JitterUntil(syncNodeStatus,
    // nodeStatusUpdateFrequency, 0.04, ...)`): each look comes 10 to 10.4 s after the last, so
    // the 5-minute post lands before 310.4 s. Looking at 310 s failed when it came later.
    sleep(Duration::from_secs(21)).await;
    assert_eq!(h.sim.stats().status_posts, 1);
    let before = condition(&nodes.get("n1").await.unwrap(), "Ready")
        .unwrap()
        .clone();

    // The node lifecycle controller marks it Unknown, and adds NetworkUnavailable (kept).
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                 "message": "Kubelet stopped posting node status."},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            ]}})),
        )
        .await
        .unwrap();
    sleep(Duration::from_secs(11)).await;
    let n = nodes.get("n1").await.unwrap();
    let ready = condition(&n, "Ready").unwrap();
    assert_eq!(ready.status, "True");
    assert!(ready.last_heartbeat_time > before.last_heartbeat_time);
    assert!(
        ready.last_transition_time > before.last_transition_time,
        "Unknown -> True is a transition"
    );
    assert_eq!(condition(&n, "NetworkUnavailable").unwrap().status, "False");
    assert_eq!(h.sim.stats().status_posts, 2);
}

/// Pods bound to a simulated node go Running with an IP and ready containers; deleting
/// one is finished by the simulated kubelet (delete with grace 0).
#[tokio::test(start_paused = true)]
async fn pods_run_and_terminating_pods_are_finished() {
    let h = start(SimConfig::default(), vec!["n1".into()]).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p1", "n1", None))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("other", "not-simulated", None))
        .await
        .unwrap();
    let p = wait_for(&pods, "p1", |p| phase(p) == "Running").await;
    let st = p.status.unwrap();
    assert!(st.pod_ip.as_deref().is_some_and(|ip| ip.starts_with("10.")));
    assert_eq!(st.host_ip.as_deref(), Some("10.0.0.1"));
    let cs = st.container_statuses.unwrap();
    assert!(cs[0].ready && cs[0].started == Some(true) && cs[0].name == "app");
    let conds = st.conditions.unwrap();
    for t in ["Ready", "ContainersReady"] {
        assert_eq!(conds.iter().find(|c| c.type_ == t).unwrap().status, "True");
    }
    sleep(Duration::from_secs(1)).await;
    assert_eq!(
        phase(&pods.get("other").await.unwrap()),
        "Pending",
        "pods of other nodes are left alone"
    );

    pods.delete("p1", &DeleteParams::default()).await.unwrap();
    for _ in 0..20 {
        if pods.get_opt("p1").await.unwrap().is_none() {
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    assert!(pods.get_opt("p1").await.unwrap().is_none(), "finished");
    assert_eq!(h.sim.stats().pods_finished, 1);
}

/// With `wait_pod_grace_period`, a terminating pod stays for its grace period; a stopped
/// node does not finish pods until it is back.
#[tokio::test(start_paused = true)]
async fn pod_grace_period_and_stopped_node() {
    let config = SimConfig {
        wait_pod_grace_period: true,
        ..Default::default()
    };
    let h = start(config, vec!["n1".into()]).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    for name in ["p1", "p2"] {
        pods.create(&PostParams::default(), &pod(name, "n1", None))
            .await
            .unwrap();
        wait_for(&pods, name, |p| phase(p) == "Running").await;
    }
    pods.delete("p1", &DeleteParams::default().grace_period(20))
        .await
        .unwrap();
    sleep(Duration::from_secs(19)).await;
    assert!(
        pods.get_opt("p1").await.unwrap().is_some(),
        "still terminating"
    );
    sleep(Duration::from_secs(2)).await;
    assert!(
        pods.get_opt("p1").await.unwrap().is_none(),
        "finished after 20 s"
    );

    h.sim.stop_heartbeats("n1").unwrap();
    pods.delete("p2", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    sleep(Duration::from_secs(30)).await;
    assert!(
        pods.get_opt("p2").await.unwrap().is_some(),
        "an unreachable kubelet does not finish pods"
    );
    h.sim.resume_heartbeats("n1").unwrap();
    sleep(Duration::from_secs(2)).await;
    assert!(pods.get_opt("p2").await.unwrap().is_none());
}

/// Graceful node shutdown: Ready=False, regular pods then critical pods marked Failed
/// (reason Terminated, DisruptionTarget), then heartbeats stop.
#[tokio::test(start_paused = true)]
async fn graceful_shutdown_marks_pods_failed() {
    let config = SimConfig {
        shutdown_grace_period: Duration::from_secs(30),
        shutdown_grace_period_critical_pods: Duration::from_secs(10),
        ..Default::default()
    };
    let h = start(config, vec!["n1".into(), "n2".into()]).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "default");
    for (name, node, class) in [
        ("critical", "n1", Some("system-node-critical")),
        ("regular", "n1", None),
        ("elsewhere", "n2", None),
    ] {
        pods.create(&PostParams::default(), &pod(name, node, class))
            .await
            .unwrap();
        wait_for(&pods, name, |p| phase(p) == "Running").await;
    }
    h.sim.shutdown_node("n1").await.unwrap();

    let nodes: Api<Node> = Api::all(h.client.clone());
    let ready = condition(&nodes.get("n1").await.unwrap(), "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "False");
    assert_eq!(ready.message.as_deref(), Some("node is shutting down"));

    let mut versions = BTreeMap::new();
    for name in ["regular", "critical"] {
        let p = pods.get(name).await.unwrap();
        let st = p.status.as_ref().unwrap();
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some("Terminated"));
        assert_eq!(
            st.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown.")
        );
        let dt = st
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .unwrap();
        assert_eq!(dt.reason.as_deref(), Some("TerminationByKubelet"));
        versions.insert(name, p.resource_version().unwrap().parse::<u64>().unwrap());
    }
    assert!(
        versions["regular"] < versions["critical"],
        "regular pods go first"
    );
    assert_eq!(phase(&pods.get("elsewhere").await.unwrap()), "Running");
    assert_eq!(h.sim.stats().pods_shut_down, 2);

    // Powered off: no more renewals.
    let t = renew_time(&h.client, "n1").await;
    sleep(Duration::from_secs(30)).await;
    assert_eq!(renew_time(&h.client, "n1").await, t);
    assert!(h.sim.heartbeats_stopped("n1").unwrap());
}
