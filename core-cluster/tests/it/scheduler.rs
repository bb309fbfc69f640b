//! The scheduler against the in-process API server (kube-rs over the axum router, paused
//! tokio time). Each test names the kube-scheduler rule it checks.

use ccm_testkit::{client, eventually};

use core_cluster::controllers::scheduler::{Scheduler, SchedulerConfig};
use k8s_openapi::api::{
    core::v1::{Node, Pod},
    events::v1::Event,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn start(client: &Client) -> CancellationToken {
    let token = CancellationToken::new();
    tokio::spawn(Scheduler::new(client.clone(), SchedulerConfig::default()).run(token.clone()));
    token
}

/// Creates a node with `spec`, `labels` and allocatable `cpu`/`pods`.
async fn node(client: &Client, name: &str, cpu: &str, labels: Value, spec: Value) {
    let api: Api<Node> = Api::all(client.clone());
    let n: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec}))
            .unwrap();
    api.create(&PostParams::default(), &n).await.unwrap();
    let status = json!({"status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
        "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

async fn pod(client: &Client, name: &str, spec: Value) {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut spec = spec;
    if spec["containers"].is_null() {
        spec["containers"] = json!([{"name": "c", "image": "nginx"}]);
    }
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    api.create(&PostParams::default(), &p).await.unwrap();
}

async fn node_of(client: &Client, name: &str) -> Option<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    api.get(name).await.unwrap().spec.unwrap().node_name
}

async fn scheduling_events(client: &Client, pod: &str, reason: &str) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default().fields(&format!("regarding.name={pod},reason={reason}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.note)
        .collect()
}

/// kube-scheduler's filters (`NodeUnschedulable`, `TaintToleration`, `NodeResourcesFit`)
/// and its `FitError` message: "0/3 nodes are available: …", recorded as a
/// `FailedScheduling` event and the `PodScheduled=False` condition; then the pod is retried
/// when a node is added (cluster event) and bound through `pods/binding` with a `Scheduled`
/// event.
#[tokio::test(start_paused = true)]
async fn failed_scheduling_message_then_retry_on_new_node() {
    let client = client().await;
    node(
        &client,
        "cordoned",
        "4",
        json!({}),
        json!({"unschedulable": true}),
    )
    .await;
    node(
        &client,
        "tainted",
        "4",
        json!({}),
        json!({"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}),
    )
    .await;
    node(&client, "small", "1", json!({}), json!({})).await;
    let _stop = start(&client).drop_guard();
    pod(&client, "big", json!({"containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "2"}}}]})).await;
    let expected = "0/3 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) were unschedulable. preemption: 0/3 nodes are available: 1 No preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.";
    let notes = eventually(10, "FailedScheduling event", || async {
        let n = scheduling_events(&client, "big", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(notes[0], expected);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let cond = eventually(10, "PodScheduled=False", || async {
        let p = pods.get("big").await.unwrap();
        p.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
    })
    .await;
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    assert_eq!(cond.message.as_deref(), Some(expected));
    assert_eq!(node_of(&client, "big").await, None);

    node(&client, "large", "8", json!({}), json!({})).await;
    let bound = eventually(30, "pod bound after a node was added", || async {
        node_of(&client, "big").await
    })
    .await;
    assert_eq!(bound, "large");
    let scheduled = eventually(10, "Scheduled event", || async {
        let n = scheduling_events(&client, "big", "Scheduled").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(scheduled[0], "Successfully assigned default/big to large");
}

/// `NodeAffinity` (nodeSelector and required node affinity) and `TaintToleration` with a
/// matching toleration; `NodeResourcesFit` counts what was bound before (requests ≤
/// allocatable minus bound requests).
#[tokio::test(start_paused = true)]
async fn selector_affinity_tolerations_and_bound_requests() {
    let client = client().await;
    node(&client, "ssd-1", "1", json!({"disk": "ssd"}), json!({})).await;
    node(&client, "hdd-1", "4", json!({"disk": "hdd"}), json!({})).await;
    node(
        &client,
        "gpu-1",
        "4",
        json!({"disk": "ssd"}),
        json!({"taints": [{"key": "gpu", "effect": "NoSchedule"}]}),
    )
    .await;
    let _stop = start(&client).drop_guard();
    pod(&client, "sel", json!({"nodeSelector": {"disk": "hdd"}})).await;
    pod(&client, "aff", json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "2"}}}]})).await;
    assert_eq!(
        eventually(10, "sel bound", || node_of(&client, "sel")).await,
        "hdd-1"
    );
    assert_eq!(
        eventually(10, "aff bound", || node_of(&client, "aff")).await,
        "gpu-1",
        "only the tolerated gpu node has room"
    );
    // gpu-1 has 2 of 4 CPUs left; a second 3-CPU ssd pod fits nowhere.
    pod(
        &client,
        "aff2",
        json!({"nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "3"}}}]}),
    )
    .await;
    let notes = eventually(10, "aff2 FailedScheduling", || async {
        let n = scheduling_events(&client, "aff2", "FailedScheduling").await;
        (!n.is_empty()).then_some(n)
    })
    .await;
    assert_eq!(
        notes[0],
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient cpu. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod."
    );
    // Deleting the pod on gpu-1 frees it: an assigned pod's deletion retries aff2.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete(
        "aff",
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        eventually(30, "aff2 bound", || node_of(&client, "aff2")).await,
        "gpu-1"
    );
}
