//! Numbers a user chooses (tolerationSeconds, resource quantities) against the in-process
//! API server and the controllers, under paused tokio time: the API refuses what upstream
//! refuses, and what it accepts never stops a controller. Each test names the upstream rule
//! it checks.

use std::time::Duration;

use ccm_testkit::{client, eventually};

use core_cluster::controllers::{
    scheduler::{Scheduler, SchedulerConfig},
    taint_eviction::TaintEvictionController,
};
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

/// Creates node `name` with `cpu` and `memory` allocatable and 110 pods.
async fn node(client: &Client, name: &str, cpu: &str, memory: &str) {
    let api: Api<Node> = Api::all(client.clone());
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &n).await.unwrap();
    let r = json!({"cpu": cpu, "memory": memory, "pods": "110"});
    let status = json!({"status": {"allocatable": r, "capacity": r}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

async fn taint(client: &Client, node: &str, key: &str) {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({"spec": {"taints": [{"key": key, "effect": "NoExecute"}]}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

async fn create_pod(client: &Client, name: &str, spec: Value) -> Result<Pod, kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut spec = spec;
    if spec["containers"].is_null() {
        spec["containers"] = json!([{"name": "c", "image": "nginx"}]);
    }
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    api.create(&PostParams::default(), &p).await
}

async fn get_pod(client: &Client, name: &str) -> Option<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    api.get_opt(name).await.unwrap()
}

/// Deleted, or marked for deletion (a pod bound to a node waits for its kubelet).
async fn evicted(client: &Client, name: &str) -> bool {
    get_pod(client, name)
        .await
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

async fn failed_scheduling(client: &Client, pod: &str) -> Option<String> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    api.list(
        &ListParams::default().fields(&format!("regarding.name={pod},reason=FailedScheduling")),
    )
    .await
    .unwrap()
    .items
    .into_iter()
    .find_map(|e| e.note)
}

async fn node_of(client: &Client, name: &str) -> Option<String> {
    get_pod(client, name).await?.spec?.node_name
}

fn requests(cpu: &str, memory: &str) -> Value {
    json!({"name": "c", "image": "nginx", "resources": {"requests": {"cpu": cpu, "memory": memory}}})
}

/// Upstream `pkg/controller/tainteviction/taint_eviction.go` `getMinTolerationTime` and
/// `processPodOnNode`: `tolerationSeconds: 9223372036854775807` is upstream's "forever"
/// sentinel and 2^62 seconds lies beyond any clock; neither stops the controller. Both pods
/// stay, and a pod without tolerations on a node tainted afterwards is still evicted.
#[tokio::test(start_paused = true)]
async fn toleration_seconds_beyond_any_clock_leave_taint_eviction_running() {
    let client = client().await;
    node(&client, "n1", "4", "8Gi").await;
    node(&client, "n2", "4", "8Gi").await;
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn(TaintEvictionController::new(client.clone()).run(stop.clone()));
    for (name, seconds) in [("forever", i64::MAX), ("huge", 1i64 << 62)] {
        create_pod(&client, name, json!({"nodeName": "n2", "tolerations": [
            {"key": "k2", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}]}))
        .await
        .unwrap();
    }
    create_pod(&client, "victim", json!({"nodeName": "n1"}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    taint(&client, "n2", "k2").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    taint(&client, "n1", "k3").await;
    eventually(
        15,
        "the untolerating pod evicted after the hostile taint",
        || async { evicted(&client, "victim").await.then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    for name in ["forever", "huge"] {
        assert!(
            !evicted(&client, name).await,
            "{name} tolerates k2 for longer than any clock"
        );
    }
}

/// Upstream `pkg/scheduler/framework/plugins/noderesources/fit.go` `fitsRequest` and the
/// `FitError` message: two containers asking `cpu: 5e15` each (more millicores together
/// than an int64 holds) leave the pod Pending with "Insufficient cpu", and the scheduler
/// goes on to bind a plain pod.
#[tokio::test(start_paused = true)]
async fn cpu_requests_beyond_int64_leave_the_pod_pending_and_the_scheduler_running() {
    let client = client().await;
    node(&client, "n1", "4", "8Gi").await;
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn(Scheduler::new(client.clone(), SchedulerConfig::default()).run(stop.clone()));
    create_pod(
        &client,
        "hostile",
        json!({"containers": [requests("5e15", "1Mi"),
            {"name": "d", "image": "nginx", "resources": {"requests": {"cpu": "5e15"}}}]}),
    )
    .await
    .unwrap();
    let note = eventually(10, "FailedScheduling for the hostile pod", || {
        failed_scheduling(&client, "hostile")
    })
    .await;
    assert_eq!(
        note,
        "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."
    );
    create_pod(&client, "plain", json!({})).await.unwrap();
    assert_eq!(
        eventually(15, "the plain pod bound", || node_of(&client, "plain")).await,
        "n1"
    );
    assert_eq!(node_of(&client, "hostile").await, None);
}

/// Upstream `resource.ParseQuantity` (binary suffixes up to `Ei`, decimal up to `E`) and
/// `fitsRequest`: 9Ei of memory (more bytes than an int64 holds, capped at its maximum as
/// upstream caps quantities) and 1E do not fit an 8Gi node; the pods stay Pending with
/// "Insufficient memory".
#[tokio::test(start_paused = true)]
async fn exbibyte_and_exabyte_memory_requests_stay_pending_insufficient_memory() {
    let client = client().await;
    node(&client, "n1", "4", "8Gi").await;
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn(Scheduler::new(client.clone(), SchedulerConfig::default()).run(stop.clone()));
    for (name, memory) in [("nine-ei", "9Ei"), ("five-ei", "5Ei"), ("one-e", "1E")] {
        create_pod(
            &client,
            name,
            json!({"containers": [requests("100m", memory)]}),
        )
        .await
        .unwrap();
        let note = eventually(10, &format!("FailedScheduling for {name}"), || {
            failed_scheduling(&client, name)
        })
        .await;
        assert_eq!(
            note,
            "0/1 nodes are available: 1 Insufficient memory. preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod.",
            "{name} asks {memory}"
        );
        assert_eq!(node_of(&client, name).await, None, "{name} asks {memory}");
    }
    create_pod(
        &client,
        "plain",
        json!({"containers": [requests("100m", "1Gi")]}),
    )
    .await
    .unwrap();
    assert_eq!(
        eventually(15, "the plain pod bound", || node_of(&client, "plain")).await,
        "n1"
    );
}

fn status_of(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

/// Upstream `pkg/apis/core/validation/validation.go` `ValidateResourceRequirements` →
/// `ValidateNonnegativeQuantity`: a negative request or limit is 422 "must be greater than
/// or equal to 0" at `spec.containers[0].resources.requests[cpu]`.
#[tokio::test]
async fn negative_requests_and_limits_are_refused_with_422() {
    let client = client().await;
    let e = create_pod(
        &client,
        "neg",
        json!({"containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "-1"}}}]}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        status_of(e),
        (
            422,
            "Pod \"neg\" is invalid: spec.containers[0].resources.requests[cpu]: Invalid value: \"-1\": must be greater than or equal to 0".to_owned()
        )
    );
    let e = create_pod(
        &client,
        "neg-limit",
        json!({"initContainers": [{"name": "i", "image": "nginx",
            "resources": {"limits": {"memory": "-1Mi"}}}]}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        status_of(e),
        (
            422,
            // Upstream's `SetDefaults_Pod` copies a limit without a request into the
            // requests, so both are refused (limits first, `ValidateResourceRequirements`).
            "Pod \"neg-limit\" is invalid: [spec.initContainers[0].resources.limits[memory]: Invalid value: \"-1Mi\": must be greater than or equal to 0, spec.initContainers[0].resources.requests[memory]: Invalid value: \"-1Mi\": must be greater than or equal to 0]".to_owned()
        )
    );
    assert!(get_pod(&client, "neg").await.is_none());
}

/// Upstream `ValidateResourceRequirements`: a request above its limit is 422 "must be less
/// than or equal to cpu limit of 1" at `spec.containers[0].resources.requests`; the same
/// rule holds for a Deployment's template.
#[tokio::test]
async fn requests_above_limits_are_refused_with_422() {
    let client = client().await;
    let e = create_pod(
        &client,
        "over",
        json!({"containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1"}}}]}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        status_of(e),
        (
            422,
            "Pod \"over\" is invalid: spec.containers[0].resources.requests: Invalid value: \"1500m\": must be less than or equal to cpu limit of 1".to_owned()
        )
    );
    create_pod(
        &client,
        "equal",
        json!({"containers": [{"name": "c", "image": "nginx",
            "resources": {"requests": {"cpu": "1000m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]}),
    )
    .await
    .unwrap();
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "default");
    let d = serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": {
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [
            {"name": "c", "image": "nginx", "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}]}}}}))
    .unwrap();
    let (code, message) = status_of(
        deployments
            .create(&PostParams::default(), &d)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.template.spec.containers[0].resources.requests: Invalid value: \"2Gi\": must be less than or equal to memory limit of 1Gi"),
        "{message}"
    );
}

/// Upstream `resource.Quantity.UnmarshalJSON` → `ParseQuantity`: a quantity that does not
/// parse fails decoding (400) with `ErrFormatWrong`'s message, in a pod and in a workload's
/// template; before, it was stored and read as nothing by the scheduler.
#[tokio::test]
async fn quantities_that_do_not_parse_are_refused_with_400() {
    let client = client().await;
    let e = create_pod(
        &client,
        "bogus",
        json!({"containers": [requests("bogus", "1Gi")]}),
    )
    .await
    .unwrap_err();
    let (code, message) = status_of(e);
    assert_eq!(code, 400);
    assert!(
        message.contains("quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"),
        "{message}"
    );
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), "default");
    let j = serde_json::from_value(json!({"metadata": {"name": "j"}, "spec": {
        "template": {"spec": {"restartPolicy": "Never", "containers": [requests("1", "1Zi")]}}}}))
    .unwrap();
    let (code, _) = status_of(jobs.create(&PostParams::default(), &j).await.unwrap_err());
    assert_eq!(code, 400);
}

/// kube-controller-manager's per-controller health checks (named after the controller)
/// and its crash-and-restart model, in one process: a supervised controller that keeps
/// panicking is restarted and counted (`controller_panics_total`), then fails `/livez`
/// with `[-]<name> failed`, while a healthy one stays `[+]<name> ok` and `/readyz` is not
/// concerned.
#[tokio::test(start_paused = true)]
async fn a_controller_that_keeps_panicking_fails_livez_and_is_counted() {
    use ccm_testkit::send;
    use core_cluster::controllers::supervisor::{PANICS_HELP, PANICS_METRIC, Supervisor};
    use std::sync::Arc;

    let server = core_cluster::ApiServer::new(
        Arc::new(core_cluster::store::MemoryStore::new()),
        core_cluster::ApiServerConfig::default(),
    )
    .await
    .unwrap();
    let client = Client::new(server.router(), "default");
    let supervisor = Supervisor::default();
    server.register_metric(PANICS_METRIC, PANICS_HELP, supervisor.panics_metric());
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn(supervisor.run("taint-eviction-controller", stop.clone(), {
        let client = client.clone();
        move |s| TaintEvictionController::new(client.clone()).run(s)
    }));
    tokio::spawn(
        supervisor.run("crashy-controller", stop.clone(), |_| async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            panic!("attempt to add with overflow");
        }),
    );
    server.add_livez_checks(supervisor.health_checks());
    let router = server.router();
    let livez = || async {
        let (code, _, body) = send(&router, "GET", "/livez?verbose", &[], "").await;
        (code, String::from_utf8_lossy(&body).into_owned())
    };

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        supervisor.panics("crashy-controller"),
        2,
        "panicked at 0.1 s and 1.2 s"
    );
    let (code, body) = livez().await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]crashy-controller ok\n"), "{body}");

    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(supervisor.panics("crashy-controller") >= 5);
    assert_eq!(supervisor.panics("taint-eviction-controller"), 0);
    let (code, body) = livez().await;
    assert_eq!(code, 500, "{body}");
    assert!(body.contains("[+]etcd ok\n"), "{body}");
    assert!(body.contains("[+]taint-eviction-controller ok\n"), "{body}");
    assert!(
        body.contains("[-]crashy-controller failed: reason withheld\n"),
        "{body}"
    );
    assert!(body.ends_with("livez check failed\n"), "{body}");
    let (code, _, body) = send(&router, "GET", "/livez/crashy-controller", &[], "").await;
    assert_eq!(code, 500);
    assert!(
        String::from_utf8_lossy(&body).contains("panicked: attempt to add with overflow"),
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (code, _, _) = send(&router, "GET", "/readyz", &[], "").await;
    assert_eq!(code, 200, "readiness does not run the controller checks");
    let (_, _, metrics) = send(&router, "GET", "/metrics", &[], "").await;
    let metrics = String::from_utf8_lossy(&metrics);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("controller_panics_total{controller=\"crashy-controller\"}"))
        .unwrap_or_else(|| panic!("{metrics}"));
    let counted: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(counted, supervisor.panics("crashy-controller"));

    // The supervised taint eviction controller still works.
    node(&client, "n1", "4", "8Gi").await;
    create_pod(&client, "victim", json!({"nodeName": "n1"}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    taint(&client, "n1", "k").await;
    eventually(
        15,
        "the pod evicted by the supervised controller",
        || async { evicted(&client, "victim").await.then_some(()) },
    )
    .await;
}
