//! The node simulator's eviction manager and container GC against the in-process API
//! server with paused tokio time. Rules: kubelet's `pkg/kubelet/eviction/eviction_manager.go`
//! (`synchronize`: thresholds of `--eviction-hard`, `reclaimNodeLevelResources` before any
//! eviction, one pod per interval, `DiskPressure` kept for the pressure transition period,
//! `Admit` refusing pods under pressure), `helpers.go` (`rankDiskPressureFunc`,
//! `evictionMessage`) and `pkg/kubelet/kuberuntime/kuberuntime_gc.go` (`evictContainers`).

use std::{sync::Arc, time::Duration};

use ccm_testkit::eventually;
use core_cluster::{
    ApiServer, ApiServerConfig,
    sim::{
        DISK_USAGE_ANNOTATION, IMAGEFS_FILL_ANNOTATION, ImageGcConfig, NODEFS_FILL_ANNOTATION,
        NodeSimulator, RUN_DURATION_ANNOTATION, SimConfig, image_size,
    },
    store::MemoryStore,
};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

async fn start(config: SimConfig) -> (Client, NodeSimulator, CancellationToken) {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let sim = NodeSimulator::new(client.clone(), config);
    sim.add_nodes(["n1"]);
    let stop = CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(30, "n1 registered", || async {
        nodes.get_opt("n1").await.unwrap().map(|_| ())
    })
    .await;
    (client, sim, stop)
}

fn pod(name: &str, image: &str, extra: Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": name},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": image}]},
    });
    if let (Some(m), Some(e)) = (v["metadata"].as_object_mut(), extra.get("metadata")) {
        m.extend(e.as_object().unwrap().clone());
    }
    if let Some(r) = extra.get("resources") {
        v["spec"]["containers"][0]["resources"] = r.clone();
    }
    serde_json::from_value(v).unwrap()
}

async fn phase(pods: &Api<Pod>, name: &str) -> (String, String, String) {
    let s = pods.get(name).await.unwrap().status.unwrap_or_default();
    (
        s.phase.unwrap_or_default(),
        s.reason.unwrap_or_default(),
        s.message.unwrap_or_default(),
    )
}

async fn disk_pressure(nodes: &Api<Node>) -> Option<String> {
    let n = nodes.get("n1").await.unwrap();
    n.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "DiskPressure")
        .map(|c| c.status)
}

async fn annotate(nodes: &Api<Node>, key: &str, value: Option<&str>) {
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
        )
        .await
        .unwrap();
}

/// `nodefs.available` below `--eviction-hard`'s default 10 % (a node filled from kubectl):
/// the node reports `DiskPressure=True`, evicts the pod that exceeds its
/// `ephemeral-storage` request (`rankDiskPressureFunc`) with kubelet's message and an
/// `Evicted` Event, keeps the pod within its request once the signal is back above the
/// threshold, refuses new pods while under pressure (`Admit`), and reports
/// `DiskPressure=False` only after the 5-minute pressure transition period.
#[tokio::test(start_paused = true)]
async fn a_full_node_filesystem_evicts_the_pod_over_its_request_and_reports_disk_pressure() {
    let (client, sim, stop) = start(SimConfig::default()).await;
    let _guard = stop.drop_guard();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let hog = pod(
        "hog",
        "busybox",
        json!({"metadata": {"annotations": {DISK_USAGE_ANNOTATION: "30Gi"}}}),
    );
    let modest = pod(
        "modest",
        "busybox",
        json!({"metadata": {"annotations": {DISK_USAGE_ANNOTATION: "1Gi"}},
               "resources": {"requests": {"ephemeral-storage": "2Gi"}}}),
    );
    for p in [hog, modest] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    for name in ["hog", "modest"] {
        eventually(30, "pod running", || async {
            (phase(&pods, name).await.0 == "Running").then_some(())
        })
        .await;
    }
    assert_eq!(disk_pressure(&nodes).await.as_deref(), Some("False"));

    // 65 + 30 + 1 of 100 Gi used: 4 Gi available, below 10 Gi.
    annotate(&nodes, NODEFS_FILL_ANNOTATION, Some("65Gi")).await;
    eventually(30, "hog evicted", || async {
        (phase(&pods, "hog").await.0 == "Failed").then_some(())
    })
    .await;
    let (_, reason, message) = phase(&pods, "hog").await;
    assert_eq!(reason, "Evicted");
    assert_eq!(
        message,
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Gi, available: 4Gi. \
         Container c was using 30Gi, request is 0, has larger consumption of ephemeral-storage. "
    );
    let hog_now = pods.get("hog").await.unwrap();
    let disruption = hog_now
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap();
    assert_eq!(disruption.reason.as_deref(), Some("TerminationByKubelet"));
    eventually(30, "DiskPressure=True reported", || async {
        (disk_pressure(&nodes).await.as_deref() == Some("True")).then_some(())
    })
    .await;
    let events = Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.involved_object.name.as_deref() == Some("hog")
                && e.reason.as_deref() == Some("Evicted")
                && e.type_.as_deref() == Some("Warning")),
        "an Evicted Event on the pod"
    );

    // 66 Gi used now: above the threshold, so the pod within its request stays.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(phase(&pods, "modest").await.0, "Running");
    assert_eq!(sim.stats().pods_evicted, 1);

    // Under pressure a new pod is refused.
    pods.create(&PostParams::default(), &pod("late", "busybox", json!({})))
        .await
        .unwrap();
    eventually(30, "late rejected", || async {
        (phase(&pods, "late").await.0 == "Failed").then_some(())
    })
    .await;
    let (_, reason, message) = phase(&pods, "late").await;
    assert_eq!(
        (reason.as_str(), message.as_str()),
        ("Evicted", "The node had condition: [DiskPressure]. ")
    );

    // The pressure transition period: still True shortly after, False after 5 minutes.
    assert_eq!(disk_pressure(&nodes).await.as_deref(), Some("True"));
    eventually(
        400,
        "DiskPressure=False after the transition period",
        || async { (disk_pressure(&nodes).await.as_deref() == Some("False")).then_some(()) },
    )
    .await;
}

/// `reclaimNodeLevelResources`: with `imagefs.available` below 15 %, the node first
/// removes its unused images; when that is enough, no pod is evicted.
#[tokio::test(start_paused = true)]
async fn image_filesystem_pressure_is_relieved_by_removing_unused_images_before_evicting() {
    let names: Vec<String> = (0..500)
        .map(|i| format!("registry.local/img-{i}:v1"))
        .collect();
    let (x, y) = names
        .iter()
        .flat_map(|a| names.iter().map(move |b| (a, b)))
        .find(|(a, b)| a != b && image_size(b) <= 2 * image_size(a))
        .unwrap();
    let (sx, sy) = (image_size(x), image_size(y));
    let capacity = 5 * sx;
    // 1 % available with both images, 21 % once x is gone.
    let fill = capacity - sx - sy - capacity / 100;
    let config = SimConfig {
        image_gc: ImageGcConfig {
            enabled: true,
            imagefs_capacity: capacity,
            ..ImageGcConfig::default()
        },
        ..SimConfig::default()
    };
    let (client, sim, stop) = start(config).await;
    let _guard = stop.drop_guard();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    // x is pulled by a pod that ends, y by one that runs.
    let ends = pod(
        "ends",
        x,
        json!({"metadata": {"annotations": {RUN_DURATION_ANNOTATION: "5s"}}}),
    );
    let mut ends_spec = ends;
    ends_spec.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    pods.create(&PostParams::default(), &ends_spec)
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("runs", y, json!({})))
        .await
        .unwrap();
    eventually(60, "ends succeeded", || async {
        (phase(&pods, "ends").await.0 == "Succeeded").then_some(())
    })
    .await;
    // imageMinimumGCAge (2 minutes) has to pass before x may go.
    tokio::time::sleep(Duration::from_secs(130)).await;
    annotate(&nodes, IMAGEFS_FILL_ANNOTATION, Some(&fill.to_string())).await;
    eventually(30, "DiskPressure=True reported", || async {
        (disk_pressure(&nodes).await.as_deref() == Some("True")).then_some(())
    })
    .await;
    eventually(30, "the unused image removed", || async {
        (sim.image_fs_usage("n1").unwrap().0 == sy).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(phase(&pods, "runs").await.0, "Running");
    assert_eq!(sim.stats().pods_evicted, 0, "reclaim was enough");
    let [_, imagefs] = sim.fs_observations("n1").unwrap();
    assert!(imagefs.available * 100 / imagefs.capacity >= 15);
}

/// `evictContainers` through the simulator: a container that restarts leaves dead
/// instances, of which the default `MaxPerPodContainer` (1) keeps the newest at the
/// one-minute collection; once the pod is deleted its dead containers go too.
#[tokio::test(start_paused = true)]
async fn restarts_leave_dead_containers_that_container_gc_collects() {
    let (client, sim, stop) = start(SimConfig::default()).await;
    let _guard = stop.drop_guard();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod(
            "crashy",
            "busybox",
            json!({"metadata": {"annotations": {RUN_DURATION_ANNOTATION: "1s"}}}),
        ),
    )
    .await
    .unwrap();
    // Runs of 1 s with backoffs of 10, 20 s: three restarts within 40 s.
    eventually(45, "three dead instances", || async {
        (sim.dead_containers("n1").unwrap().len() >= 3).then_some(())
    })
    .await;
    eventually(70, "container GC keeps one dead instance", || async {
        (sim.dead_containers("n1").unwrap().len() == 1).then_some(())
    })
    .await;
    pods.delete("crashy", &Default::default()).await.unwrap();
    eventually(
        130,
        "the deleted pod's dead containers collected",
        || async { sim.dead_containers("n1").unwrap().is_empty().then_some(()) },
    )
    .await;
}
