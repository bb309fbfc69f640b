//! Several cloud controller managers in one cluster (beyond upstream; the shape of the
//! provisional KEP-5778): controllers whose context owns only the `onprem` platform leave the
//! other platform's Nodes alone and count them as skipped.

use std::sync::Arc;
use std::time::Duration;

use cloud_provider::CloudProvider;
use cloud_provider_app::controllers::cloud_node_lifecycle::{
    CloudNodeLifecycleConfig, CloudNodeLifecycleController,
};
use cloud_provider_app::controllers::service::{ServiceConfig, ServiceController};
use cloud_provider_app::controllers::{ControllerContext, NodeOwnership, PLATFORM_ANNOTATION};
use cloud_provider_fake::{FakeCloud, FakeInstance};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

/// A Node with `providerID`, and the platform annotation when given.
async fn add_node(client: &kube::Client, name: &str, provider_id: &str, platform: Option<&str>) {
    let annotations = platform
        .map(|p| serde_json::json!({ PLATFORM_ANNOTATION: p }))
        .unwrap_or_else(|| serde_json::json!({}));
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": { "providerID": provider_id },
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// The `onprem` ccm's context: a fake cloud that knows `a1` and `a2` only.
fn onprem(client: &kube::Client, token: &CancellationToken) -> (FakeCloud, ControllerContext) {
    let cloud = FakeCloud::builder()
        .platforms(["onprem"])
        .instances([
            FakeInstance::new("i-a1", "a1"),
            FakeInstance::new("i-a2", "a2"),
        ])
        .build();
    let provider: Arc<dyn CloudProvider> = Arc::new(cloud.clone());
    let ctx = ControllerContext::new(client.clone(), provider, "kubernetes", token.clone())
        .with_ownership(NodeOwnership::of(cloud.supported_platforms()));
    (cloud, ctx)
}

/// A load balancer of the `onprem` cloud holds only `onprem` Nodes (by annotation or by the
/// provider ID's scheme), where upstream's service controller
/// (`controllers/service/controller.go` `nodeSyncService`) gives it every eligible Node.
#[tokio::test]
async fn a_load_balancer_holds_only_the_nodes_of_its_platform() {
    let client = ccm_testkit::client().await;
    add_node(&client, "a1", "fake://i-a1", Some("onprem")).await;
    add_node(&client, "a2", "onprem://a2", None).await;
    add_node(&client, "e1", "edge://e1", None).await;
    add_node(&client, "e2", "fake://i-e2", Some("edge")).await;
    let token = CancellationToken::new();
    let (cloud, ctx) = onprem(&client, &token);
    let metrics = ctx.metrics.clone();
    let controller = ServiceController::new(ctx, ServiceConfig::default())
        .unwrap()
        .unwrap();
    let task = tokio::spawn(controller.run());

    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web", "namespace": "default" },
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
    }))
    .unwrap();
    let svc = Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let hosts = ccm_testkit::eventually(30, "the load balancer is ensured", || {
        let lb = cloud.load_balancer_of(&svc);
        async move { lb.map(|lb| lb.hosts().to_vec()) }
    })
    .await;
    assert_eq!(hosts, ["a1", "a2"]);
    assert!(metrics.ownership_skips("service-controller") >= 2);

    // Another platform's Node joining changes nothing; one of ours is added.
    add_node(&client, "e3", "edge://e3", None).await;
    add_node(&client, "a3", "fake://i-a3", Some("onprem")).await;
    let hosts = ccm_testkit::eventually(30, "the new onprem Node is a backend", || {
        let hosts = cloud.load_balancer_of(&svc).map(|lb| lb.hosts().to_vec());
        async move { hosts.filter(|h| h.len() == 3) }
    })
    .await;
    assert_eq!(hosts, ["a1", "a2", "a3"]);
    token.cancel();
    task.await.unwrap();
}

/// The lifecycle controller deletes an owned Node whose instance is gone, and never a Node of
/// another platform, which its cloud cannot know (upstream's
/// `controllers/nodelifecycle/node_lifecycle_controller.go` `MonitorNodes` deletes both).
#[tokio::test]
async fn the_lifecycle_controller_never_deletes_another_platforms_node() {
    let client = ccm_testkit::client().await;
    add_node(&client, "a1", "fake://i-a1", Some("onprem")).await;
    add_node(&client, "gone", "fake://i-gone", Some("onprem")).await;
    add_node(&client, "e1", "edge://e1", None).await;
    add_node(&client, "e2", "fake://i-e2", Some("edge")).await;
    let token = CancellationToken::new();
    let (_cloud, ctx) = onprem(&client, &token);
    let metrics = ctx.metrics.clone();
    let config = CloudNodeLifecycleConfig::default()
        .with_node_monitor_period(Duration::from_millis(100))
        .with_delete_grace_period(Duration::ZERO);
    let controller = CloudNodeLifecycleController::new(ctx, config)
        .unwrap()
        .unwrap();
    let task = tokio::spawn(controller.run());

    let nodes = Api::<Node>::all(client.clone());
    ccm_testkit::eventually(
        30,
        "the owned Node whose instance is gone is deleted",
        || {
            let nodes = nodes.clone();
            async move { nodes.get_opt("gone").await.unwrap().is_none().then_some(()) }
        },
    )
    .await;
    // More passes: the other platform's Nodes stay.
    ccm_testkit::eventually(30, "several more passes", || {
        let skips = metrics.ownership_skips("cloud-node-lifecycle-controller");
        async move { (skips >= 10).then_some(()) }
    })
    .await;
    let mut names: Vec<String> = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    assert_eq!(names, ["a1", "e1", "e2"]);
    token.cancel();
    task.await.unwrap();
}

/// The route table is this ccm's cloud's: only its Nodes get routes (upstream's
/// `controllers/route/route_controller.go` `reconcile` routes every Node with a pod CIDR).
#[tokio::test]
async fn routes_are_made_only_for_the_nodes_of_the_platform() {
    use cloud_provider_app::controllers::route::{RouteConfig, RouteController};
    let client = ccm_testkit::client().await;
    for (name, platform, cidr) in [
        ("a1", "onprem", "10.244.1.0/24"),
        ("e1", "edge", "10.244.2.0/24"),
    ] {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "annotations": { PLATFORM_ANNOTATION: platform } },
            "spec": { "podCIDRs": [cidr], "podCIDR": cidr },
        }))
        .unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }
    let token = CancellationToken::new();
    let (cloud, ctx) = onprem(&client, &token);
    let metrics = ctx.metrics.clone();
    let rc = RouteController::new(
        ctx,
        RouteConfig::new(vec!["10.244.0.0/16".parse().unwrap()]),
    )
    .unwrap()
    .unwrap();
    let report = rc.reconcile().await.unwrap();
    assert_eq!(report.created, 1);
    let targets: Vec<String> = cloud
        .routes("kubernetes")
        .into_iter()
        .map(|r| r.target_node)
        .collect();
    assert_eq!(targets, ["a1"]);
    assert_eq!(metrics.ownership_skips("route_controller"), 1);
}
