//! PodDisruptionBudgets end to end with kube-rs against the in-process API server: the
//! disruption controller keeps a budget's status and the Eviction subresource honours it.

use ccm_testkit::eventually;
use core_cluster::controllers::disruption::DisruptionController;
use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    Api, Client,
    api::{EvictParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A Running pod of `app=web`, Ready or not.
async fn running_pod(pods: &Api<Pod>, name: &str, ready: bool) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    set_ready(pods, name, ready).await;
}

async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = if ready { "True" } else { "False" };
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": status}],
        }})),
    )
    .await
    .unwrap();
}

/// `current/desired/expected/allowed` once the controller observed the budget's generation.
async fn budget_reads(budgets: &Api<PodDisruptionBudget>, want: &str) {
    eventually(10, &format!("the budget reads {want}"), || async {
        let pdb = budgets.get("web").await.ok()?;
        let s = pdb.status?;
        let got = format!(
            "{}/{}/{}/{}",
            s.current_healthy, s.desired_healthy, s.expected_pods, s.disruptions_allowed
        );
        (got == want && s.observed_generation == pdb.metadata.generation).then_some(())
    })
    .await;
}

async fn evict(pods: &Api<Pod>, name: &str) -> Result<(), kube::core::Status> {
    match pods.evict(name, &EvictParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(*e),
        Err(e) => panic!("evicting {name}: {e}"),
    }
}

/// `pkg/controller/disruption/disruption.go` (an integer `minAvailable`: `expectedPods` is
/// the pods selected, `desiredHealthy` the integer, `disruptionsAllowed` the difference
/// with the Ready ones) and `pkg/registry/core/pod/storage/eviction.go` (an eviction spends
/// one allowed disruption and records the pod in `disruptedPods`; with none allowed it is a
/// 429 "Cannot evict pod as it would violate the pod's disruption budget." and the pod
/// stays; an unready pod may go when `unhealthyPodEvictionPolicy: AlwaysAllow` says so).
#[tokio::test]
async fn evictions_honour_the_budget_the_disruption_controller_keeps() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(DisruptionController::new(client.clone()).run(stop.clone()));
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let budgets: Api<PodDisruptionBudget> = Api::default_namespaced(client.clone());
    for name in ["web-0", "web-1", "web-2"] {
        running_pod(&pods, name, true).await;
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap();
    budgets.create(&PostParams::default(), &pdb).await.unwrap();
    budget_reads(&budgets, "3/2/3/1").await;

    evict(&pods, "web-0")
        .await
        .expect("one disruption is allowed");
    assert!(pods.get_opt("web-0").await.unwrap().is_none());
    budget_reads(&budgets, "2/2/2/0").await;

    let refused = evict(&pods, "web-1").await.expect_err("no disruption left");
    assert_eq!(
        (refused.code, refused.reason.as_str()),
        (429, "TooManyRequests")
    );
    assert_eq!(
        refused.message,
        "Cannot evict pod as it would violate the pod's disruption budget."
    );
    assert!(pods.get_opt("web-1").await.unwrap().is_some());

    // An unready pod under an unhealthy budget: IfHealthyBudget (the default) refuses ...
    set_ready(&pods, "web-1", false).await;
    budget_reads(&budgets, "1/2/2/0").await;
    let refused = evict(&pods, "web-1")
        .await
        .expect_err("the budget is not healthy");
    assert_eq!(refused.code, 429);
    // ... AlwaysAllow lets it go, and a Ready pod is still protected.
    budgets
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}})),
        )
        .await
        .unwrap();
    budget_reads(&budgets, "1/2/2/0").await;
    evict(&pods, "web-1")
        .await
        .expect("AlwaysAllow evicts an unready pod");
    assert!(pods.get_opt("web-1").await.unwrap().is_none());
    assert_eq!(evict(&pods, "web-2").await.unwrap_err().code, 429);
    assert!(pods.get_opt("web-2").await.unwrap().is_some());
}

/// `pkg/apis/policy/validation ValidatePodDisruptionBudgetSpec`: both bounds at once are
/// refused with a 422 naming the rule.
#[tokio::test]
async fn a_budget_with_both_bounds_is_invalid() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let budgets: Api<PodDisruptionBudget> = Api::default_namespaced(client);
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "both"},
        "spec": {"minAvailable": 1, "maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap();
    match budgets.create(&PostParams::default(), &pdb).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422);
            assert!(
                e.message
                    .contains("minAvailable and maxUnavailable cannot be both set"),
                "{}",
                e.message
            );
        }
        other => panic!("expected a 422, got {other:?}"),
    }
}
