//! Pods that finish and the collection of finished work, against the in-process API server
//! with the node simulator, the scheduler and the controllers (paused tokio time). Rules:
//! kwok's `pod-general` stages (Job pods complete), upstream's
//! `pkg/controller/podgc/gc_controller.go` (`gcTerminated`, `gcTerminating`),
//! `pkg/controller/ttlafterfinished` and `pkg/controller/deployment/sync.go`
//! (`cleanupDeployment`).

use std::{sync::Arc, time::Duration};

use ccm_testkit::{client, eventually};
use core_cluster::{
    ApiServer, ApiServerConfig,
    controllers::{
        deployment::{DeploymentController, REVISION},
        garbage_collector::GarbageCollector,
        job::JobController,
        pod_gc::{PodGcConfig, PodGcController},
        replicaset::ReplicaSetController,
        scheduler::{Scheduler, SchedulerConfig},
        ttl_after_finished::TtlAfterFinishedController,
    },
    sim::{NodeSimulator, SimConfig},
    store::MemoryStore,
};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    batch::v1::Job,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Cluster {
    client: Client,
    stop: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An API server, two simulated nodes, the scheduler, the workload controllers, the
/// garbage collector and the TTL-after-finished controller.
async fn cluster() -> Cluster {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let stop = CancellationToken::new();
    let sim = NodeSimulator::new(client.clone(), SimConfig::default());
    sim.add_nodes(["node-a", "node-b"]);
    tokio::spawn({
        let stop = stop.clone();
        async move { sim.run(stop).await.unwrap() }
    });
    tokio::spawn(Scheduler::new(client.clone(), SchedulerConfig::default()).run(stop.clone()));
    tokio::spawn(ReplicaSetController::new(client.clone()).run(stop.clone()));
    tokio::spawn(DeploymentController::new(client.clone()).run(stop.clone()));
    tokio::spawn(GarbageCollector::new(client.clone()).run(stop.clone()));
    tokio::spawn(JobController::new(client.clone()).run(stop.clone()));
    tokio::spawn(TtlAfterFinishedController::new(client.clone()).run(stop.clone()));
    Cluster { client, stop }
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn bare_pod(name: &str, restart: &str, container: Value, annotations: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"restartPolicy": restart, "containers": [container]},
    }))
    .unwrap()
}

async fn wait_phase(api: &Api<Pod>, name: &str, want: &str) -> Pod {
    eventually(60, &format!("pod {name} {want}"), || async {
        api.get_opt(name)
            .await
            .unwrap()
            .filter(|p| phase(p) == want)
    })
    .await
}

fn exit_code(p: &Pod) -> Option<i32> {
    let cs = p.status.as_ref()?.container_statuses.as_ref()?;
    Some(cs[0].state.as_ref()?.terminated.as_ref()?.exit_code)
}

/// kwok's stage spirit for bare pods: `kubectl run t --image=busybox --restart=Never --
/// true` (args only) ends `Succeeded` with exit code 0, `-- false` ends `Failed` with 1,
/// a `helm test` hook pod completes, and a server (`restartPolicy: Always`) keeps running.
#[tokio::test(start_paused = true)]
async fn restart_never_pods_and_helm_tests_end_while_servers_keep_running() {
    let c = cluster().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let specs = [
        bare_pod(
            "t",
            "Never",
            json!({"name": "t", "image": "busybox", "args": ["true"]}),
            json!({}),
        ),
        bare_pod(
            "f",
            "Never",
            json!({"name": "f", "image": "busybox", "args": ["false"]}),
            json!({}),
        ),
        bare_pod(
            "web-test-connection",
            "Never",
            json!({"name": "wget", "image": "busybox", "command": ["wget"], "args": ["web:80"]}),
            json!({"helm.sh/hook": "test"}),
        ),
        bare_pod(
            "server",
            "Always",
            json!({"name": "nginx", "image": "nginx", "command": ["nginx", "-g", "daemon off;"]}),
            json!({}),
        ),
    ];
    for p in &specs {
        pods.create(&PostParams::default(), p).await.unwrap();
    }
    let t = wait_phase(&pods, "t", "Succeeded").await;
    assert_eq!(exit_code(&t), Some(0));
    let f = wait_phase(&pods, "f", "Failed").await;
    assert_eq!(exit_code(&f), Some(1));
    wait_phase(&pods, "web-test-connection", "Succeeded").await;
    wait_phase(&pods, "server", "Running").await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    let server = pods.get("server").await.unwrap();
    assert_eq!(phase(&server), "Running", "servers keep running");
    let restarts = server.status.unwrap().container_statuses.unwrap()[0].restart_count;
    assert_eq!(restarts, 0);
}

fn has_condition(j: &Job, t: &str) -> bool {
    j.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
}

/// `kubectl create job` without any simulator annotation: its pod completes (kwok's
/// `pod-complete` stage for pods owned by a Job), so the Job is `Complete`; then the
/// TTL-after-finished controller (`ttlafterfinished_controller.go` `processTTL`) deletes it
/// `ttlSecondsAfterFinished` after the Complete condition's transition, not before, with
/// foreground propagation so its pods go too.
#[tokio::test(start_paused = true)]
async fn a_finished_job_is_deleted_with_its_pods_once_its_ttl_has_passed() {
    let c = cluster().await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), "default");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "once"},
        "spec": {"ttlSecondsAfterFinished": 100, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "once", "image": "busybox"}]}}},
    }))
    .unwrap();
    jobs.create(&PostParams::default(), &job).await.unwrap();
    let done = eventually(60, "Job once Complete", || async {
        jobs.get_opt("once")
            .await
            .unwrap()
            .filter(|j| has_condition(j, "Complete"))
    })
    .await;
    assert_eq!(done.status.unwrap().succeeded, Some(1));
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let selector = ListParams::default().labels("batch.kubernetes.io/job-name=once");
    assert_eq!(pods.list(&selector).await.unwrap().items.len(), 1);

    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(
        jobs.get_opt("once").await.unwrap().is_some(),
        "kept until its TTL has passed"
    );
    eventually(30, "Job once deleted after its TTL", || async {
        jobs.get_opt("once").await.unwrap().is_none().then_some(())
    })
    .await;
    eventually(30, "the Job's pods deleted", || async {
        pods.list(&selector)
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;

    // A Job without a TTL is kept.
    let mut kept = job.clone();
    kept.metadata.name = Some("kept".into());
    kept.spec.as_mut().unwrap().ttl_seconds_after_finished = None;
    jobs.create(&PostParams::default(), &kept).await.unwrap();
    eventually(60, "Job kept Complete", || async {
        jobs.get_opt("kept")
            .await
            .unwrap()
            .filter(|j| has_condition(j, "Complete"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert!(jobs.get_opt("kept").await.unwrap().is_some());
}

/// `cleanupDeployment`: after four rollouts of a Deployment with `revisionHistoryLimit: 1`,
/// only the current ReplicaSet and the one revision before it remain.
#[tokio::test(start_paused = true)]
async fn deployment_keeps_only_revision_history_limit_old_replica_sets() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1, "revisionHistoryLimit": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1"}]}},
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &d).await.unwrap();
    let sets: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let revisions = || async {
        let mut r: Vec<(String, String)> = sets
            .list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|rs| rs.metadata.deletion_timestamp.is_none())
            .map(|rs| {
                let revision = rs.annotations().get(REVISION).cloned().unwrap_or_default();
                let image = rs.spec.unwrap().template.unwrap().spec.unwrap().containers[0]
                    .image
                    .clone()
                    .unwrap();
                (revision, image)
            })
            .collect();
        r.sort();
        r
    };
    for (i, image) in ["nginx:2", "nginx:3", "nginx:4"].into_iter().enumerate() {
        let current = format!("{}", i + 1);
        eventually(120, &format!("revision {current} rolled out"), || async {
            let d = api.get("web").await.unwrap();
            let s = d.status.unwrap_or_default();
            (s.updated_replicas == Some(1)
                && s.available_replicas == Some(1)
                && s.replicas == Some(1)
                && d.metadata.annotations.unwrap_or_default().get(REVISION) == Some(&current))
            .then_some(())
        })
        .await;
        api.patch(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"template": {"spec": {
                "containers": [{"name": "web", "image": image}]}}}})),
        )
        .await
        .unwrap();
    }
    let kept = eventually(120, "two ReplicaSets left: revisions 3 and 4", || async {
        let r = revisions().await;
        (r.len() == 2 && r.iter().any(|(rev, _)| rev == "4")).then_some(r)
    })
    .await;
    assert_eq!(
        kept,
        vec![
            ("3".to_string(), "nginx:3".to_string()),
            ("4".to_string(), "nginx:4".to_string())
        ]
    );
}

fn node(name: &str, ready: &str, taints: Value) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }))
    .unwrap()
}

fn pod_on(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap()
}

async fn set_phase(pods: &Api<Pod>, name: &str, phase: &str, reason: Option<&str>) {
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase, "reason": reason}})),
    )
    .await
    .unwrap();
}

fn pod_gc(client: &Client, threshold: usize) -> CancellationToken {
    let stop = CancellationToken::new();
    let config = PodGcConfig {
        terminated_pod_gc_threshold: threshold,
        ..PodGcConfig::default()
    };
    tokio::spawn(PodGcController::new(client.clone(), config).run(stop.clone()));
    stop
}

async fn names(pods: &Api<Pod>) -> Vec<String> {
    let mut n: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    n.sort();
    n
}

/// `gcTerminated`: with `--terminated-pod-gc-threshold` 2 and four terminated pods, the
/// evicted one goes first, then the oldest (`byEvictionAndCreationTimestamp`); running
/// pods are never counted.
#[tokio::test(start_paused = true)]
async fn terminated_pods_beyond_the_threshold_are_deleted_evicted_then_oldest_first() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n", "True", json!([])))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, phase, reason) in [
        ("a-oldest", "Succeeded", None),
        ("b-old", "Failed", None),
        ("c-newer", "Succeeded", None),
        ("d-evicted", "Failed", Some("Evicted")),
        ("e-running", "Running", None),
        ("f-running", "Running", None),
    ] {
        pods.create(&PostParams::default(), &pod_on(name, "n"))
            .await
            .unwrap();
        set_phase(&pods, name, phase, reason).await;
    }
    // Created in this order; creationTimestamp is wall time to the second, so pods created
    // within one second tie and their names (in the same order) decide.
    let _stop = pod_gc(&client, 2);
    let left = eventually(60, "two terminated pods collected", || async {
        let n = names(&pods).await;
        (n.len() == 4).then_some(n)
    })
    .await;
    assert_eq!(left, ["b-old", "c-newer", "e-running", "f-running"]);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        names(&pods).await.len(),
        4,
        "at the threshold nothing more goes"
    );
}

/// `gcTerminating` (non-graceful node shutdown): a terminating pod on a NotReady node with
/// the `node.kubernetes.io/out-of-service` taint is marked Failed and force-deleted; one on
/// a NotReady node without the taint waits for its kubelet.
#[tokio::test(start_paused = true)]
async fn terminating_pods_of_an_out_of_service_node_are_force_deleted() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let oos = json!([{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown",
        "effect": "NoExecute"}]);
    nodes
        .create(&PostParams::default(), &node("down", "False", oos))
        .await
        .unwrap();
    nodes
        .create(
            &PostParams::default(),
            &node("unreachable", "Unknown", json!([])),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [("on-down", "down"), ("on-unreachable", "unreachable")] {
        pods.create(&PostParams::default(), &pod_on(name, node))
            .await
            .unwrap();
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    pods.create(&PostParams::default(), &pod_on("running-on-down", "down"))
        .await
        .unwrap();
    let _stop = pod_gc(&client, 12_500);
    eventually(60, "on-down force-deleted", || async {
        pods.get_opt("on-down")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let waiting = pods.get("on-unreachable").await.unwrap();
    assert!(waiting.metadata.deletion_timestamp.is_some());
    assert!(
        pods.get_opt("running-on-down").await.unwrap().is_some(),
        "only terminating pods are collected (taint eviction evicts the others)"
    );
}
