//! The workload controllers with the scheduler and the node simulator against the
//! in-process API server (kube-rs over the axum router, paused tokio time): pods are
//! created by controllers, bound by the scheduler and run by the simulated kubelets. Each
//! test names the upstream rule it checks.

use ccm_testkit::eventually;
use std::{sync::Arc, time::Duration};

use core_cluster::{
    ApiServer, ApiServerConfig,
    controllers::{
        daemonset::DaemonSetController,
        deployment::{DeploymentController, POD_TEMPLATE_HASH},
        garbage_collector::GarbageCollector,
        job::JobController,
        node_lifecycle::{NodeLifecycleConfig, NodeLifecycleController},
        replicaset::ReplicaSetController,
        scheduler::{Scheduler, SchedulerConfig},
        taint_eviction::TaintEvictionController,
    },
    sim::{NodeSimulator, SimConfig},
    store::MemoryStore,
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, ReplicaSet},
    batch::v1::{Job, JobCondition},
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Cluster {
    client: Client,
    sim: NodeSimulator,
    stop: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An API server, three simulated nodes, the scheduler, the node lifecycle and taint
/// eviction controllers, the garbage collector and the workload controllers.
async fn cluster() -> Cluster {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let stop = CancellationToken::new();
    let sim = NodeSimulator::new(client.clone(), SimConfig::default());
    sim.add_nodes(["node-a", "node-b", "node-c"]);
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    tokio::spawn(Scheduler::new(client.clone(), SchedulerConfig::default()).run(stop.clone()));
    tokio::spawn(ReplicaSetController::new(client.clone()).run(stop.clone()));
    tokio::spawn(DeploymentController::new(client.clone()).run(stop.clone()));
    tokio::spawn(GarbageCollector::new(client.clone()).run(stop.clone()));
    tokio::spawn(JobController::new(client.clone()).run(stop.clone()));
    tokio::spawn(DaemonSetController::new(client.clone()).run(stop.clone()));
    let lifecycle = NodeLifecycleController::new(client.clone(), NodeLifecycleConfig::default());
    tokio::spawn({
        let stop = stop.clone();
        async move { lifecycle.run(stop).await.unwrap() }
    });
    tokio::spawn(TaintEvictionController::new(client.clone()).run(stop.clone()));
    Cluster { client, sim, stop }
}

fn deployment(name: &str, replicas: i32, image: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "web", "image": image}]}},
        }
    }))
    .unwrap()
}

/// Pods with `app=<name>` that are not being deleted and not finished.
async fn live_pods(client: &Client, app: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    api.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Waits (up to 60 s) for exactly `n` live pods `app=<app>`, all Running.
async fn all_running(client: &Client, app: &str, n: usize) -> Vec<Pod> {
    eventually(60, &format!("{n} running {app} pods"), || async {
        let pods = live_pods(client, app).await;
        (pods.len() == n && pods.iter().all(running)).then_some(pods)
    })
    .await
}

/// A DaemonSet running `<name>` pods labelled `app=<name>`.
fn daemonset(name: &str) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": "fluentd"}]}}}
    }))
    .unwrap()
}

async fn rolled_out(api: &Api<Deployment>, name: &str, replicas: i32) -> Option<Deployment> {
    let d = api.get(name).await.unwrap();
    let s = d.status.clone()?;
    let progressed =
        s.conditions.as_ref()?.iter().any(|c| {
            c.type_ == "Progressing" && c.reason.as_deref() == Some("NewReplicaSetAvailable")
        });
    (s.observed_generation == d.metadata.generation
        && s.updated_replicas == Some(replicas)
        && s.available_replicas == Some(replicas)
        && s.replicas == Some(replicas)
        && progressed)
        .then_some(d)
}

/// ReplicaSet controller (`manageReplicas`): a ReplicaSet keeps `replicas` pods carrying
/// its controllerRef; a deleted pod is replaced, scaling down deletes the extra pods.
#[tokio::test(start_paused = true)]
async fn replicaset_keeps_replicas_with_owner_references() {
    let c = cluster().await;
    let api: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "rs1"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "rs1"}},
            "template": {"metadata": {"labels": {"app": "rs1"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap();
    let rs = api.create(&PostParams::default(), &rs).await.unwrap();
    let pods = eventually(30, "3 running pods", || async {
        let pods = live_pods(&c.client, "rs1").await;
        (pods.len() == 3 && pods.iter().all(running)).then_some(pods)
    })
    .await;
    for p in &pods {
        let owner = &p.owner_references()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.uid.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            (
                "ReplicaSet",
                rs.uid().unwrap().as_str(),
                Some(true),
                Some(true)
            )
        );
        assert!(p.name_any().starts_with("rs1-"));
        assert!(
            p.spec.as_ref().unwrap().node_name.is_some(),
            "bound by the scheduler"
        );
    }
    let status = eventually(10, "status counts", || async {
        let s = api.get("rs1").await.unwrap().status?;
        (s.available_replicas == Some(3)).then_some(s)
    })
    .await;
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.fully_labeled_replicas
        ),
        (3, Some(3), Some(3))
    );
    // A deleted pod is replaced.
    let pod_api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    pod_api
        .delete(&pods[0].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "replacement pod", || async {
        let now = live_pods(&c.client, "rs1").await;
        (now.len() == 3 && !now.iter().any(|p| p.name_any() == pods[0].name_any())).then_some(())
    })
    .await;
    // Scale down to 1.
    api.patch(
        "rs1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    eventually(30, "scaled down to 1", || async {
        (live_pods(&c.client, "rs1").await.len() == 1).then_some(())
    })
    .await;
}

/// ReplicaSet controller (`IsPodAvailable`): a ready pod counts as available once it has
/// been ready for `minReadySeconds`; the wait follows tokio's clock (paused here).
#[tokio::test(start_paused = true)]
async fn replicaset_counts_pods_available_after_min_ready_seconds() {
    let c = cluster().await;
    let api: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let rs: ReplicaSet = serde_json::from_value(json!({
        "metadata": {"name": "slow"},
        "spec": {"replicas": 2, "minReadySeconds": 20, "selector": {"matchLabels": {"app": "slow"}},
            "template": {"metadata": {"labels": {"app": "slow"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &rs).await.unwrap();
    let status = eventually(30, "2 ready", || async {
        let s = api.get("slow").await.unwrap().status?;
        (s.ready_replicas == Some(2)).then_some(s)
    })
    .await;
    let ready = tokio::time::Instant::now();
    assert_eq!(status.available_replicas.unwrap_or(0), 0);
    eventually(60, "2 available", || async {
        let s = api.get("slow").await.unwrap().status?;
        (s.available_replicas == Some(2)).then_some(())
    })
    .await;
    let waited = ready.elapsed();
    assert!(
        (Duration::from_secs(15)..Duration::from_secs(22)).contains(&waited),
        "minReadySeconds 20: available {waited:?} after ready"
    );
}

/// Deployment controller `rolloutRolling`: a new ReplicaSet per template
/// (`pod-template-hash`), never more than `replicas + maxSurge` pods and never fewer than
/// `replicas - maxUnavailable` available during the rollout; status as `kubectl rollout
/// status` reads it.
#[tokio::test(start_paused = true)]
async fn deployment_rolls_replica_sets_within_surge_and_unavailable() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    api.create(&PostParams::default(), &deployment("web", 3, "nginx:1"))
        .await
        .unwrap();
    let d = eventually(60, "first rollout", || rolled_out(&api, "web", 3)).await;
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("1")
    );
    let rs_api: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    let first = rs_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(first.len(), 1);
    let hash = first[0].labels()[POD_TEMPLATE_HASH].clone();
    assert_eq!(first[0].name_any(), format!("web-{hash}"));

    // Change the image: a second ReplicaSet takes over, one surge pod at a time.
    api.patch("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:2"}]}}}})))
        .await
        .unwrap();
    let mut max_pods = 0;
    let mut min_running = usize::MAX;
    for _ in 0..600 {
        let pods = live_pods(&c.client, "web").await;
        max_pods = max_pods.max(pods.len());
        min_running = min_running.min(pods.iter().filter(|p| running(p)).count());
        if rolled_out(&api, "web", 3).await.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let d = rolled_out(&api, "web", 3)
        .await
        .expect("second rollout finished");
    assert!(max_pods <= 4, "maxSurge 1 allows 4 pods, saw {max_pods}");
    assert!(
        min_running >= 3,
        "maxUnavailable 0 keeps 3 running, saw {min_running}"
    );
    assert_eq!(
        d.annotations()
            .get("deployment.kubernetes.io/revision")
            .map(String::as_str),
        Some("2")
    );
    let sets = rs_api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(sets.len(), 2);
    for rs in &sets {
        let want = if rs.name_any() == first[0].name_any() {
            0
        } else {
            3
        };
        assert_eq!(
            rs.spec.as_ref().unwrap().replicas,
            Some(want),
            "{}",
            rs.name_any()
        );
    }
    let pods = live_pods(&c.client, "web").await;
    assert!(
        pods.iter()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("nginx:2"))
    );

    // Scaling alone resizes the new ReplicaSet.
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 5}})),
    )
    .await
    .unwrap();
    eventually(60, "scaled to 5", || rolled_out(&api, "web", 5)).await;
}

/// Garbage collection of a Deployment (upstream `pkg/controller/garbagecollector`):
/// background deletes the ReplicaSet and pods after the Deployment,
/// foreground keeps the Deployment until its dependents are gone, orphan leaves the
/// ReplicaSet and pods without the ownerReference.
#[tokio::test(start_paused = true)]
async fn cascading_deletion_of_a_deployment() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let rs_api: Api<ReplicaSet> = Api::namespaced(c.client.clone(), "default");
    for (name, policy) in [
        ("bg", PropagationPolicy::Background),
        ("fg", PropagationPolicy::Foreground),
        ("orphan", PropagationPolicy::Orphan),
    ] {
        api.create(&PostParams::default(), &deployment(name, 2, "nginx"))
            .await
            .unwrap();
        eventually(60, "rolled out", || rolled_out(&api, name, 2)).await;
        let dp = DeleteParams {
            propagation_policy: Some(policy.clone()),
            ..Default::default()
        };
        api.delete(name, &dp).await.unwrap();
        let selector = ListParams::default().labels(&format!("app={name}"));
        match policy {
            PropagationPolicy::Foreground => {
                // The Deployment stays (finalizer foregroundDeletion) while dependents exist.
                let d = api.get(name).await.unwrap();
                assert!(d.finalizers().iter().any(|f| f == "foregroundDeletion"));
                eventually(60, "fg deployment gone last", || async {
                    api.get_opt(name).await.unwrap().is_none().then_some(())
                })
                .await;
                assert!(rs_api.list(&selector).await.unwrap().items.is_empty());
                assert!(live_pods(&c.client, name).await.is_empty());
            }
            PropagationPolicy::Orphan => {
                eventually(30, "orphan deployment gone", || async {
                    api.get_opt(name).await.unwrap().is_none().then_some(())
                })
                .await;
                tokio::time::sleep(Duration::from_secs(5)).await;
                let sets = rs_api.list(&selector).await.unwrap().items;
                assert_eq!(sets.len(), 1, "the ReplicaSet is orphaned, not deleted");
                assert!(sets[0].owner_references().is_empty());
                let pods = live_pods(&c.client, name).await;
                assert_eq!(pods.len(), 2, "the ReplicaSet still keeps its pods");
                assert!(
                    pods.iter()
                        .all(|p| p.owner_references()[0].kind == "ReplicaSet")
                );
            }
            _ => {
                eventually(60, "bg dependents gone", || async {
                    let gone = api.get_opt(name).await.unwrap().is_none()
                        && rs_api.list(&selector).await.unwrap().items.is_empty()
                        && live_pods(&c.client, name).await.is_empty();
                    gone.then_some(())
                })
                .await;
            }
        }
    }
}

/// Validation of apps/v1 Deployments (upstream `ValidateDeployment`): the selector must
/// select the template's labels; a clear 422, nothing stored.
#[tokio::test(start_paused = true)]
async fn invalid_deployment_is_refused() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    let mut d = deployment("bad", 1, "nginx");
    let mut v: Value = serde_json::to_value(&d).unwrap();
    v["spec"]["template"]["metadata"]["labels"] = json!({"app": "other"});
    d = serde_json::from_value(v).unwrap();
    match api.create(&PostParams::default(), &d).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message
                    .contains("spec.template.metadata.labels: Invalid value"),
                "{}",
                s.message
            );
            assert!(
                s.message
                    .contains("`selector` does not match template `labels`"),
                "{}",
                s.message
            );
        }
        other => panic!("expected 422, got {other:?}"),
    }
    assert!(api.get_opt("bad").await.unwrap().is_none());
}

fn job(
    name: &str,
    completions: i32,
    parallelism: i32,
    annotations: Value,
    backoff_limit: i32,
) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "completions": completions, "parallelism": parallelism, "backoffLimit": backoff_limit,
            "template": {"metadata": {"annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "work", "image": "busybox"}]}},
        }
    }))
    .unwrap()
}

/// The Job's condition of type `t`, whatever its status.
fn find_job_condition(j: &Job, t: &str) -> Option<JobCondition> {
    j.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == t)
        .cloned()
}

/// Reason and message of the Job's condition `t` when it is True.
fn job_condition(j: &Job, t: &str) -> Option<(String, String)> {
    find_job_condition(j, t)
        .filter(|c| c.status == "True")
        .map(|c| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

/// Job controller (NonIndexed): `completions` successes, at most `parallelism` pods at a
/// time, then `SuccessCriteriaMet` and `Complete` with `completionTime`; the simulated
/// kubelet ends each pod after its `sim.ccm-rs.io/run-duration`.
#[tokio::test(start_paused = true)]
async fn job_runs_completions_with_parallelism_to_complete() {
    let c = cluster().await;
    let api: Api<Job> = Api::namespaced(c.client.clone(), "default");
    let created = api
        .create(
            &PostParams::default(),
            &job("pi", 3, 2, json!({"sim.ccm-rs.io/run-duration": "10s"}), 6),
        )
        .await
        .unwrap();
    let uid = created.uid().unwrap();
    let pods_api: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let selector = ListParams::default().labels("batch.kubernetes.io/job-name=pi");
    let mut max_active = 0;
    let mut done = None;
    for _ in 0..1200 {
        let pods = pods_api.list(&selector).await.unwrap().items;
        let active = pods
            .iter()
            .filter(|p| {
                matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Pending" | "Running")
                )
            })
            .count();
        max_active = max_active.max(active);
        let j = api.get("pi").await.unwrap();
        if job_condition(&j, "Complete").is_some() {
            // List again: the Job can complete between the list above and the get, and
            // every pod the Job counted must show its terminated state by now.
            let pods = pods_api.list(&selector).await.unwrap().items;
            done = Some((j, pods));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = done.expect("job complete");
    let (j, pods) = done;
    assert!(
        max_active <= 2,
        "parallelism 2, saw {max_active} active pods"
    );
    let status = j.status.unwrap();
    // JobStatus' counts are `omitempty`: Go writes none of the zeros.
    assert_eq!(
        (status.succeeded, status.active, status.failed),
        (Some(3), None, None)
    );
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    assert!(job_condition(&api.get("pi").await.unwrap(), "SuccessCriteriaMet").is_some());
    assert_eq!(pods.len(), 3);
    for p in &pods {
        assert_eq!(p.owner_references()[0].uid, uid);
        assert_eq!(p.labels()["batch.kubernetes.io/controller-uid"], uid);
        assert!(p.name_any().starts_with("pi-"));
        let cs = &p
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0];
        assert_eq!(
            cs.state
                .as_ref()
                .unwrap()
                .terminated
                .as_ref()
                .unwrap()
                .reason
                .as_deref(),
            Some("Completed")
        );
    }
}

/// Job controller: failed pods are replaced after 10 s, then 20 s (pod failure backoff);
/// more failures than `backoffLimit` fail the Job with `BackoffLimitExceeded`.
#[tokio::test(start_paused = true)]
async fn job_fails_after_backoff_limit_with_backoff_between_pods() {
    let c = cluster().await;
    let api: Api<Job> = Api::namespaced(c.client.clone(), "default");
    let start = tokio::time::Instant::now();
    api.create(
        &PostParams::default(),
        &job(
            "flaky",
            1,
            1,
            json!({"sim.ccm-rs.io/run-duration": "1s", "sim.ccm-rs.io/exit-code": "1"}),
            2,
        ),
    )
    .await
    .unwrap();
    let j = eventually(300, "job failed", || async {
        let j = api.get("flaky").await.unwrap();
        job_condition(&j, "Failed").map(|_| j)
    })
    .await;
    let elapsed = start.elapsed();
    assert_eq!(
        job_condition(&j, "Failed"),
        Some((
            "BackoffLimitExceeded".into(),
            "Job has reached the specified backoff limit".into()
        ))
    );
    assert!(job_condition(&j, "FailureTarget").is_some());
    assert_eq!(
        j.status.as_ref().unwrap().failed,
        Some(3),
        "backoffLimit 2: the third failure fails the Job"
    );
    // Three 1 s runs with 10 s and 20 s of backoff between them.
    assert!(
        elapsed >= Duration::from_secs(33),
        "replacements waited for their backoff: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let list = pods
        .list(&ListParams::default().labels("job-name=flaky"))
        .await
        .unwrap()
        .items;
    assert_eq!(list.len(), 3);
    assert!(
        list.iter()
            .all(|p| p.status.as_ref().unwrap().phase.as_deref() == Some("Failed"))
    );
}

/// Job controller (`pastActiveDeadline`): a Job active for `activeDeadlineSeconds` since its
/// `startTime` gets `FailureTarget` with reason `DeadlineExceeded` and upstream's message
/// "Job was active longer than specified deadline", its running pods are deleted, and
/// `Failed` follows once none is left; the deadline is measured on tokio's clock.
#[tokio::test(start_paused = true)]
async fn job_past_its_active_deadline_fails_with_deadline_exceeded() {
    let c = cluster().await;
    let api: Api<Job> = Api::namespaced(c.client.clone(), "default");
    let mut slow = job("slow", 4, 2, json!({"sim.ccm-rs.io/run-duration": "1h"}), 6);
    slow.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
    let start = tokio::time::Instant::now();
    api.create(&PostParams::default(), &slow).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let selector = ListParams::default().labels("batch.kubernetes.io/job-name=slow");
    eventually(30, "two running pods", || async {
        let list = pods.list(&selector).await.unwrap().items;
        (list.len() == 2 && list.iter().all(running)).then_some(())
    })
    .await;
    let target = eventually(60, "FailureTarget", || async {
        let j = api.get("slow").await.unwrap();
        job_condition(&j, "FailureTarget")
    })
    .await;
    let at = start.elapsed();
    assert!(
        (Duration::from_secs(29)..Duration::from_secs(32)).contains(&at),
        "activeDeadlineSeconds 30: FailureTarget after {at:?}"
    );
    let deadline_exceeded = (
        "DeadlineExceeded".to_string(),
        "Job was active longer than specified deadline".to_string(),
    );
    assert_eq!(target, deadline_exceeded);
    let j = eventually(60, "Failed", || async {
        let j = api.get("slow").await.unwrap();
        job_condition(&j, "Failed").map(|_| j)
    })
    .await;
    assert_eq!(job_condition(&j, "Failed"), Some(deadline_exceeded));
    assert!(job_condition(&j, "Complete").is_none());
    let status = j.status.as_ref().unwrap();
    // Zero counts are `omitempty`: absent, as Go writes them.
    assert_eq!((status.active, status.succeeded), (None, None));
    assert!(
        status.completion_time.is_none(),
        "a failed Job has no completionTime"
    );
    // startTime and the condition follow the same clock: 30 s apart.
    let failed_at = find_job_condition(&j, "FailureTarget")
        .and_then(|c| c.last_transition_time)
        .unwrap()
        .0;
    let active_for = failed_at.duration_since(status.start_time.as_ref().unwrap().0);
    assert!(
        active_for >= jiff::SignedDuration::from_secs(29)
            && active_for < jiff::SignedDuration::from_secs(32),
        "{active_for:?}"
    );
    eventually(60, "the Job's pods deleted", || async {
        pods.list(&selector)
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
}

/// Job controller with `suspend` (API rules of `JobSpec.suspend` and `JobStatus.startTime`):
/// a Job created suspended runs no pod, has no `startTime` and its `activeDeadlineSeconds`
/// does not run; resumed, its `Suspended` condition turns False (`JobResumed`), `startTime`
/// is set then, and the deadline counts from there.
#[tokio::test(start_paused = true)]
async fn suspended_job_starts_its_deadline_when_resumed() {
    let c = cluster().await;
    let api: Api<Job> = Api::namespaced(c.client.clone(), "default");
    let mut held = job("held", 1, 1, json!({"sim.ccm-rs.io/run-duration": "1h"}), 6);
    held.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
    held.spec.as_mut().unwrap().suspend = Some(true);
    api.create(&PostParams::default(), &held).await.unwrap();
    let j = eventually(30, "Suspended", || async {
        let j = api.get("held").await.unwrap();
        job_condition(&j, "Suspended").map(|_| j)
    })
    .await;
    assert_eq!(
        job_condition(&j, "Suspended"),
        Some(("JobSuspended".into(), "Job suspended".into()))
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    let j = api.get("held").await.unwrap();
    let status = j.status.as_ref().unwrap();
    assert!(status.start_time.is_none(), "no startTime while suspended");
    assert!(
        job_condition(&j, "FailureTarget").is_none(),
        "the deadline does not run"
    );
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let selector = ListParams::default().labels("batch.kubernetes.io/job-name=held");
    assert!(pods.list(&selector).await.unwrap().items.is_empty());

    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": false}})),
    )
    .await
    .unwrap();
    let resumed = tokio::time::Instant::now();
    let j = eventually(30, "a running pod", || async {
        let list = pods.list(&selector).await.unwrap().items;
        let j = api.get("held").await.unwrap();
        (list.len() == 1 && running(&list[0])).then_some(j)
    })
    .await;
    let suspended = find_job_condition(&j, "Suspended").unwrap();
    assert_eq!(
        (suspended.status.as_str(), suspended.reason.as_deref()),
        ("False", Some("JobResumed"))
    );
    assert!(j.status.unwrap().start_time.is_some());
    let target = eventually(60, "FailureTarget", || async {
        job_condition(&api.get("held").await.unwrap(), "FailureTarget")
    })
    .await;
    assert_eq!(target.0, "DeadlineExceeded");
    let after = resumed.elapsed();
    assert!(
        (Duration::from_secs(29)..Duration::from_secs(33)).contains(&after),
        "the 30 s deadline counts from the resume: {after:?}"
    );
}

/// DaemonSet controller (`NodeShouldRunDaemonPod`, `AddOrUpdateDaemonPodTolerations`): one
/// running pod per eligible node, bound by the scheduler through its node affinity; a
/// cordoned node keeps its pod (unschedulable is tolerated); a node with an untolerated
/// NoSchedule taint keeps it too (`shouldContinueRunning`) but no longer counts as desired
/// and the pod as misscheduled; an untolerated NoExecute taint removes it.
#[tokio::test(start_paused = true)]
async fn daemonset_runs_one_pod_per_eligible_node() {
    let c = cluster().await;
    let api: Api<DaemonSet> = Api::namespaced(c.client.clone(), "default");
    api.create(&PostParams::default(), &daemonset("agent"))
        .await
        .unwrap();
    let pods = all_running(&c.client, "agent", 3).await;
    let mut nodes: Vec<String> = pods
        .iter()
        .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
        .collect();
    nodes.sort();
    assert_eq!(nodes, ["node-a", "node-b", "node-c"]);
    let tolerations = pods[0].spec.as_ref().unwrap().tolerations.clone().unwrap();
    let unreachable = tolerations
        .iter()
        .find(|t| t.key.as_deref() == Some("node.kubernetes.io/unreachable"))
        .unwrap();
    assert_eq!(
        (
            unreachable.effect.as_deref(),
            unreachable.toleration_seconds
        ),
        (Some("NoExecute"), None)
    );
    let status = eventually(10, "status", || async {
        let s = api.get("agent").await.unwrap().status?;
        (s.number_available == Some(3)).then_some(s)
    })
    .await;
    assert_eq!(
        (
            status.desired_number_scheduled,
            status.current_number_scheduled,
            status.number_ready,
            status.updated_number_scheduled
        ),
        (3, 3, 3, Some(3))
    );

    let nodes_api: Api<Node> = Api::all(c.client.clone());
    nodes_api
        .patch(
            "node-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    nodes_api.patch("node-c", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}))).await.unwrap();
    eventually(10, "node-c misscheduled", || async {
        let s = api.get("agent").await.unwrap().status?;
        (s.desired_number_scheduled == 2 && s.number_misscheduled == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        live_pods(&c.client, "agent").await.len(),
        3,
        "a NoSchedule taint does not evict a running daemon pod"
    );
    nodes_api.patch("node-c", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoExecute"}]}}))).await.unwrap();
    let pods = eventually(30, "node-c's pod removed", || async {
        let pods = live_pods(&c.client, "agent").await;
        (pods.len() == 2).then_some(pods)
    })
    .await;
    let mut on: Vec<String> = pods
        .iter()
        .map(|p| p.spec.as_ref().unwrap().node_name.clone().unwrap())
        .collect();
    on.sort();
    assert_eq!(
        on,
        ["node-a", "node-b"],
        "the cordoned node keeps its daemon pod"
    );
    eventually(10, "desired 2", || async {
        let s = api.get("agent").await.unwrap().status?;
        (s.desired_number_scheduled == 2 && s.number_misscheduled == 0).then_some(())
    })
    .await;
}

/// The `scale` subresource (upstream `ScaleREST` of Deployments and ReplicaSets): an
/// `autoscaling/v1` Scale with the selector as a string; PATCH and PUT change
/// `spec.replicas`, and a negative count is a 422.
#[tokio::test(start_paused = true)]
async fn scale_subresource_reads_and_writes_replicas() {
    let c = cluster().await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    api.create(&PostParams::default(), &deployment("sc", 1, "nginx"))
        .await
        .unwrap();
    let scale = api.get_scale("sc").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(1));
    assert_eq!(scale.status.unwrap().selector.as_deref(), Some("app=sc"));
    let patched = api
        .patch_scale(
            "sc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().replicas, Some(4));
    assert_eq!(api.get("sc").await.unwrap().spec.unwrap().replicas, Some(4));
    eventually(60, "scaled to 4", || rolled_out(&api, "sc", 4)).await;
    let bad = api
        .patch_scale(
            "sc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": -1}})),
        )
        .await;
    assert!(matches!(bad, Err(kube::Error::Api(s)) if s.code == 422));
    assert_eq!(api.get("sc").await.unwrap().spec.unwrap().replicas, Some(4));
}

// ---------------------------------------------------------------- pods on NotReady nodes

const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The status of the pod's `Ready` condition.
fn ready_status(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

/// Whether the pod is gone or being deleted.
async fn evicted(api: &Api<Pod>, name: &str) -> bool {
    api.get_opt(name)
        .await
        .unwrap()
        .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

async fn has_no_execute_taint(client: &Client, node: &str, key: &str) -> bool {
    let node = Api::<Node>::all(client.clone()).get(node).await.unwrap();
    node.spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == key && t.effect == "NoExecute")
}

/// Polls `check` once a second (paused time) for up to `secs` seconds; how long it took.
async fn within<F, Fut>(secs: u64, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = tokio::time::Instant::now();
    for _ in 0..=secs {
        if check().await {
            return start.elapsed();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("timed out after {secs} s waiting for: {what}");
}

/// Sets `spec.unschedulable` of `nodes` (kubectl cordon / uncordon), once they registered.
async fn cordon(client: &Client, nodes: &[&str], unschedulable: bool) {
    let api: Api<Node> = Api::all(client.clone());
    for node in nodes {
        eventually(30, "node registered", || async {
            api.get_opt(node).await.unwrap().map(|_| ())
        })
        .await;
        api.patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .unwrap();
    }
}

/// The node whose kubelet stops in the NotReady tests.
const VICTIM: &str = "node-a";

/// `node-a` runs a Deployment `web` of 3, a Job `batch` of one pod that runs for an hour and
/// the `agent` pod of a DaemonSet; the other nodes run only their `agent` pod (they were
/// cordoned while the workloads were placed, and are uncordoned now). The pods on `node-a`.
async fn workloads_on_the_victim(c: &Cluster) -> Vec<Pod> {
    cordon(&c.client, &["node-b", "node-c"], true).await;
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    deployments
        .create(&PostParams::default(), &deployment("web", 3, "nginx"))
        .await
        .unwrap();
    Api::<DaemonSet>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &daemonset("agent"))
        .await
        .unwrap();
    let mut batch = job(
        "batch",
        1,
        1,
        json!({"sim.ccm-rs.io/run-duration": "1h"}),
        6,
    );
    batch
        .spec
        .as_mut()
        .unwrap()
        .template
        .metadata
        .as_mut()
        .unwrap()
        .labels = Some([("app".to_string(), "batch".to_string())].into());
    Api::<Job>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &batch)
        .await
        .unwrap();
    eventually(60, "web rolled out", || rolled_out(&deployments, "web", 3)).await;
    all_running(&c.client, "agent", 3).await;
    all_running(&c.client, "batch", 1).await;
    cordon(&c.client, &["node-b", "node-c"], false).await;
    let mut on_victim = Vec::new();
    for app in ["web", "batch", "agent"] {
        on_victim.extend(live_pods(&c.client, app).await);
    }
    on_victim.retain(|p| node_of(p) == VICTIM);
    assert_eq!(on_victim.len(), 5, "3 web, 1 batch, 1 agent on {VICTIM}");
    on_victim
}

fn app_of(p: &Pod) -> &str {
    p.labels().get("app").map_or("", String::as_str)
}

/// Upstream node lifecycle controller, DefaultTolerationSeconds admission and taint
/// eviction controller, end to end: a node whose kubelet stops reporting goes Unknown after
/// the 50 s grace period, its pods are marked `Ready=False` (`MarkPodsNotReady`) and it gets
/// the `node.kubernetes.io/unreachable` NoExecute taint; every pod carries the admission's
/// 300 s tolerations, so the taint eviction controller deletes the Deployment's pods 300 s
/// after the taint and a pod tolerating it for 30 s after 30 s; the ReplicaSet replaces its
/// pods on the other nodes; the DaemonSet's pod tolerates the taint forever
/// (`AddOrUpdateDaemonPodTolerations`) and stays.
#[tokio::test(start_paused = true)]
async fn pods_on_an_unreachable_node_are_evicted_when_their_toleration_expires() {
    let c = cluster().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let on_victim = workloads_on_the_victim(&c).await;
    let victim = VICTIM;
    let evictable: Vec<String> = on_victim
        .iter()
        .filter(|p| app_of(p) != "agent")
        .map(|p| p.name_any())
        .collect();
    let agent = on_victim
        .iter()
        .find(|p| app_of(p) == "agent")
        .unwrap()
        .name_any();
    let web = pods.get(&evictable[0]).await.unwrap();
    for key in ["node.kubernetes.io/not-ready", UNREACHABLE] {
        let t = web
            .spec
            .as_ref()
            .unwrap()
            .tolerations
            .as_ref()
            .unwrap()
            .iter()
            .find(|t| t.key.as_deref() == Some(key))
            .unwrap_or_else(|| panic!("DefaultTolerationSeconds gives a toleration for {key}"));
        assert_eq!(
            (
                t.operator.as_deref(),
                t.effect.as_deref(),
                t.toleration_seconds
            ),
            (Some("Exists"), Some("NoExecute"), Some(300))
        );
    }
    // A pod that tolerates an unreachable node for 30 s only.
    let impatient: Pod = serde_json::from_value(json!({
        "metadata": {"name": "impatient", "labels": {"app": "impatient"}},
        "spec": {"nodeName": victim, "containers": [{"name": "c", "image": "nginx"}],
            "tolerations": [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &impatient)
        .await
        .unwrap();
    eventually(30, "impatient running", || async {
        running(&pods.get("impatient").await.unwrap()).then_some(())
    })
    .await;

    c.sim.stop_heartbeats(victim).unwrap();
    let silent = within(120, "unreachable NoExecute taint", || {
        has_no_execute_taint(&c.client, victim, UNREACHABLE)
    })
    .await;
    let tainted = tokio::time::Instant::now();
    // Lease renewals every 10 s, grace period 50 s, monitor pass every 5 s.
    assert!(
        (Duration::from_secs(40)..Duration::from_secs(70)).contains(&silent),
        "tainted {silent:?} after the kubelet stopped"
    );
    let node = Api::<Node>::all(c.client.clone())
        .get(victim)
        .await
        .unwrap();
    let ready = node
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("Unknown", Some("NodeStatusUnknown"))
    );
    for name in evictable.iter().chain([&agent, &"impatient".to_string()]) {
        eventually(10, "pod marked not ready", || async {
            (ready_status(&pods.get(name).await.unwrap()).as_deref() == Some("False")).then_some(())
        })
        .await;
    }
    // Not-ready pods are not available: the Deployment (all its pods on the node) has none.
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), "default");
    eventually(10, "web unavailable", || async {
        let s = deployments.get("web").await.unwrap().status?;
        (s.available_replicas.unwrap_or(0) == 0 && s.ready_replicas.unwrap_or(0) == 0).then_some(())
    })
    .await;

    let after = within(60, "impatient evicted", || evicted(&pods, "impatient")).await;
    assert!(
        (Duration::from_secs(28)..Duration::from_secs(34)).contains(&after),
        "tolerationSeconds 30: evicted {after:?} after the taint"
    );
    for name in &evictable {
        assert!(!evicted(&pods, name).await, "{name} tolerates 300 s");
    }
    within(330, "web and batch pods evicted", || async {
        for name in &evictable {
            if !evicted(&pods, name).await {
                return false;
            }
        }
        true
    })
    .await;
    let since_taint = tainted.elapsed();
    assert!(
        (Duration::from_secs(298)..Duration::from_secs(306)).contains(&since_taint),
        "tolerationSeconds 300: evicted {since_taint:?} after the taint"
    );
    if let Some(p) = pods.get_opt(&evictable[0]).await.unwrap() {
        let disruption = p
            .status
            .unwrap()
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .expect("DisruptionTarget condition");
        assert_eq!(disruption.reason.as_deref(), Some("DeletionByTaintManager"));
    }
    // The ReplicaSet and the Job replace them on the nodes that are left.
    let mut replaced = all_running(&c.client, "web", 3).await;
    replaced.extend(all_running(&c.client, "batch", 1).await);
    assert!(
        replaced
            .iter()
            .all(|p| node_of(p) != victim && !evictable.contains(&p.name_any())),
        "replacements avoid the unreachable node: {:?}",
        replaced.iter().map(node_of).collect::<Vec<_>>()
    );
    let batch = Api::<Job>::namespaced(c.client.clone(), "default")
        .get("batch")
        .await
        .unwrap();
    assert_eq!(batch.status.as_ref().unwrap().active, Some(1));
    assert!(
        job_condition(&batch, "FailureTarget").is_none(),
        "an evicted pod is replaced, the Job goes on"
    );
    eventually(30, "web available again", || {
        rolled_out(&deployments, "web", 3)
    })
    .await;
    // The daemon pod outlives every finite toleration.
    tokio::time::sleep_until(tainted + Duration::from_secs(600)).await;
    let agent = pods.get(&agent).await.unwrap();
    assert!(
        agent.metadata.deletion_timestamp.is_none(),
        "daemon pods stay"
    );
    assert_eq!(ready_status(&agent).as_deref(), Some("False"));
}

/// Upstream node lifecycle and taint eviction: when the kubelet comes back before the
/// tolerations run out, the node is Ready again, the NoExecute taint is removed
/// (`markNodeAsReachable`), the scheduled evictions are cancelled and the pods stay; the
/// kubelet's status manager reports them Ready again.
#[tokio::test(start_paused = true)]
async fn pods_stay_when_their_node_comes_back_before_the_deadline() {
    let c = cluster().await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let on_victim = workloads_on_the_victim(&c).await;
    let victim = VICTIM;
    let before: Vec<String> = {
        let mut v: Vec<String> = live_pods(&c.client, "web")
            .await
            .iter()
            .map(|p| p.name_any())
            .collect();
        v.sort();
        v
    };
    c.sim.stop_heartbeats(victim).unwrap();
    within(120, "unreachable NoExecute taint", || {
        has_no_execute_taint(&c.client, victim, UNREACHABLE)
    })
    .await;
    let tainted = tokio::time::Instant::now();
    for p in &on_victim {
        eventually(10, "pod marked not ready", || async {
            (ready_status(&pods.get(&p.name_any()).await.unwrap()).as_deref() == Some("False"))
                .then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(200)).await;
    c.sim.resume_heartbeats(victim).unwrap();
    let gone = within(60, "taint removed", || async {
        !has_no_execute_taint(&c.client, victim, UNREACHABLE).await
    })
    .await;
    assert!(tainted.elapsed() < Duration::from_secs(300), "{gone:?}");
    for p in &on_victim {
        eventually(30, "pod ready again", || async {
            (ready_status(&pods.get(&p.name_any()).await.unwrap()).as_deref() == Some("True"))
                .then_some(())
        })
        .await;
    }
    tokio::time::sleep_until(tainted + Duration::from_secs(600)).await;
    for p in &on_victim {
        assert!(
            !evicted(&pods, &p.name_any()).await,
            "{} stays on its node",
            p.name_any()
        );
    }
    let mut after: Vec<String> = live_pods(&c.client, "web")
        .await
        .iter()
        .map(|p| p.name_any())
        .collect();
    after.sort();
    assert_eq!(after, before, "no pod was replaced");
}
