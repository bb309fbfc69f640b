//! The controllers' metrics move when the controllers do, under upstream's names: each test
//! runs one controller against FakeCloud and the in-process API server (paused time) with a
//! registered [`ControllerMetrics`], then reads the registry as `/metrics` shows it.

use std::sync::Arc;
use std::time::Duration;

use cloud_provider::prometheus_client::registry::Registry;
use cloud_provider_app::controllers::ControllerContext;
use cloud_provider_app::controllers::ControllerMetrics;
use cloud_provider_app::controllers::node::{CloudNodeConfig, CloudNodeController};
use cloud_provider_app::controllers::route::{RouteConfig, RouteController};
use cloud_provider_app::controllers::service::{ServiceConfig, ServiceController};
use cloud_provider_fake::{FakeCloud, FakeInstance, Fault, FaultRule, Method};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::PostParams;
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "kubernetes";

/// One controller's world: the API server, the cloud, the registered metrics.
struct Env {
    client: kube::Client,
    cloud: FakeCloud,
    metrics: ControllerMetrics,
    registry: Registry,
    stop: CancellationToken,
}

impl Env {
    async fn new(nodes: &[&str]) -> Env {
        let server = ccm_testkit::memory_server().await;
        let client = kube::Client::new(server.router(), "default");
        let cloud = FakeCloud::builder()
            .instances(
                nodes
                    .iter()
                    .map(|n| FakeInstance::new(format!("i-{n}"), *n)),
            )
            .build();
        let metrics = ControllerMetrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        Env {
            client,
            cloud,
            metrics,
            registry,
            stop: CancellationToken::new(),
        }
    }

    fn ctx(&self) -> ControllerContext {
        ControllerContext::new(
            self.client.clone(),
            Arc::new(self.cloud.clone()),
            CLUSTER,
            self.stop.child_token(),
        )
        .with_metrics(self.metrics.clone())
    }

    async fn create_node(&self, node: serde_json::Value) {
        let node: Node = serde_json::from_value(node).unwrap();
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    /// The registry as `/metrics` shows it.
    fn scrape(&self) -> String {
        let mut text = String::new();
        cloud_provider::prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .unwrap();
        text
    }

    /// The value of one series (`name{labels}` exactly as exposed), or a panic showing all.
    fn sample(&self, series: &str) -> f64 {
        sample(&self.scrape(), series)
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The value of `series` in a Prometheus text exposition.
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{text}"))
}

fn has_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| !t.is_empty())
}

/// Upstream's cloud-node controller (controllers/node/metrics.go and client-go's workqueue):
/// initializing a Node observes `node_controller_cloud_provider_taint_removal_delay_seconds`
/// and `node_controller_initial_node_sync_delay_seconds` once (seconds since its creation),
/// and its key goes through the `Nodes` queue; a failed lookup is a retry on that queue.
#[tokio::test(start_paused = true)]
async fn cloud_node_controller_counts_initializations_and_retries() {
    let env = Env::new(&["n1", "n2"]).await;
    // n2's first lookup fails, and is retried after the queue's backoff.
    env.cloud.inject(
        FaultRule::always(Fault::Error("boom".into()))
            .on(Method::InstanceMetadataBatch)
            .times(1),
    );
    let controller = CloudNodeController::new(env.ctx(), CloudNodeConfig::default())
        .unwrap()
        .unwrap();
    tokio::spawn(controller.run());
    for name in ["n1", "n2"] {
        env.create_node(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "taints": [{
                "key": "node.cloudprovider.kubernetes.io/uninitialized",
                "value": "true",
                "effect": "NoSchedule",
            }] },
        }))
        .await;
    }
    let api = Api::<Node>::all(env.client.clone());
    for _ in 0..100 {
        let nodes = api.list(&Default::default()).await.unwrap().items;
        if nodes.iter().all(|n| !has_taint(n)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes = api.list(&Default::default()).await.unwrap().items;
    assert!(nodes.iter().all(|n| !has_taint(n)), "both initialized");
    for histogram in [
        "node_controller_cloud_provider_taint_removal_delay_seconds",
        "node_controller_initial_node_sync_delay_seconds",
    ] {
        assert_eq!(
            env.sample(&format!("{histogram}_count")),
            2.0,
            "{histogram}"
        );
        // The paused clock does not move the wall clock: seconds of real time at most.
        let sum = env.sample(&format!("{histogram}_sum"));
        assert!((0.0..60.0).contains(&sum), "{histogram}: {sum}");
    }
    let q = "{name=\"Nodes\"}";
    assert!(env.sample(&format!("workqueue_retries_total{q}")) >= 1.0);
    let adds = env.sample(&format!("workqueue_adds_total{q}"));
    assert!(adds >= 3.0, "two Nodes and a retry: {adds}");
    assert_eq!(env.sample(&format!("workqueue_depth{q}")), 0.0);
    assert_eq!(
        env.sample(&format!("workqueue_work_duration_seconds_count{q}")),
        adds,
        "every key taken was processed"
    );
    assert_eq!(
        env.sample(&format!("workqueue_queue_duration_seconds_count{q}")),
        adds
    );
    assert_eq!(
        env.sample(&format!("workqueue_unfinished_work_seconds{q}")),
        0.0
    );
}

/// Upstream's service controller (controllers/service/metrics.go and the `service` and `node`
/// queues): a Node joining updates the load balancer's hosts, counted in
/// `service_controller_loadbalancer_sync_total` and timed in
/// `service_controller_update_loadbalancer_host_latency_seconds` and
/// `service_controller_nodesync_latency_seconds`; a failed update counts in
/// `service_controller_nodesync_error_total`.
#[tokio::test(start_paused = true)]
async fn service_controller_counts_host_updates_and_their_errors() {
    let env = Env::new(&["n1", "n2", "n3"]).await;
    let node = |name: &str| {
        serde_json::json!({
            "metadata": { "name": name },
            "spec": { "providerID": format!("fake://i-{name}") },
        })
    };
    env.create_node(node("n1")).await;
    let controller = ServiceController::new(env.ctx(), ServiceConfig::default())
        .unwrap()
        .unwrap();
    tokio::spawn(controller.run());
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web" },
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
    }))
    .unwrap();
    let svc = Api::<Service>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(env.cloud.load_balancer_of(&svc).is_some(), "ensured");
    let service_q = "{name=\"service\"}";
    assert!(env.sample(&format!("workqueue_adds_total{service_q}")) >= 1.0);
    assert_eq!(env.sample(&format!("workqueue_depth{service_q}")), 0.0);
    assert!(env.sample(&format!("workqueue_work_duration_seconds_count{service_q}")) >= 1.0);
    assert_eq!(
        env.sample("service_controller_loadbalancer_sync_total"),
        0.0
    );

    // A Node joins: one UpdateLoadBalancer, taking 3 s.
    env.cloud
        .set_method_latency(Method::UpdateLoadBalancer, Duration::from_secs(3));
    env.create_node(node("n2")).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 1);
    assert_eq!(
        env.sample("service_controller_loadbalancer_sync_total"),
        1.0
    );
    let host = "service_controller_update_loadbalancer_host_latency_seconds";
    assert_eq!(env.sample(&format!("{host}_count")), 1.0);
    assert_eq!(env.sample(&format!("{host}_sum")), 3.0);
    assert_eq!(env.sample(&format!("{host}_bucket{{le=\"2.0\"}}")), 0.0);
    assert_eq!(env.sample(&format!("{host}_bucket{{le=\"4.0\"}}")), 1.0);
    let nodesync = "service_controller_nodesync_latency_seconds";
    assert!(env.sample(&format!("{nodesync}_count")) >= 1.0);
    assert!(
        env.sample(&format!("{nodesync}_sum")) >= 3.0,
        "the sync waited for the update"
    );
    let node_q = "{name=\"node\"}";
    assert!(env.sample(&format!("workqueue_adds_total{node_q}")) >= 1.0);
    assert_eq!(env.sample(&format!("workqueue_depth{node_q}")), 0.0);
    assert_eq!(env.sample("service_controller_nodesync_error_total"), 0.0);

    // The next update fails: an error, and the Service is queued again.
    env.cloud
        .set_method_latency(Method::UpdateLoadBalancer, Duration::ZERO);
    env.cloud.inject(
        FaultRule::always(Fault::Error("quota".into()))
            .on(Method::UpdateLoadBalancer)
            .times(1),
    );
    env.create_node(node("n3")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        env.sample("service_controller_loadbalancer_sync_total"),
        2.0
    );
    assert_eq!(env.sample("service_controller_nodesync_error_total"), 1.0);
}

/// Upstream's route controller (controllers/route/metrics.go): every reconcile counts in
/// `route_controller_route_sync_total`, the periodic one every 10 s; the watch-based mode's
/// reconciles go through the `Routes` queue, a failed create being a retry.
#[tokio::test(start_paused = true)]
async fn route_controller_counts_every_sync() {
    let env = Env::new(&["n1", "n2"]).await;
    env.create_node(serde_json::json!({
        "metadata": { "name": "n1" },
        "spec": { "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"] },
    }))
    .await;
    let cidrs = vec!["10.244.0.0/16".parse().unwrap()];
    let periodic = RouteController::new(env.ctx(), RouteConfig::new(cidrs.clone()))
        .unwrap()
        .unwrap();
    let stop = env.stop.child_token();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            tokio::select! {
                () = periodic.run() => {}
                () = stop.cancelled() => {}
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(25_000)).await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(
        env.sample("route_controller_route_sync_total"),
        3.0,
        "0, 10, 20 s"
    );
    let text = env.scrape();
    assert!(
        !text.contains("name=\"Routes\""),
        "upstream's periodic mode has no queue:\n{text}"
    );

    let watch = RouteController::new(env.ctx(), RouteConfig::new(cidrs).with_watch_based(true))
        .unwrap()
        .unwrap();
    tokio::spawn(watch.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.sample("route_controller_route_sync_total"), 4.0);
    assert_eq!(env.sample("workqueue_adds_total{name=\"Routes\"}"), 1.0);
    env.cloud.inject(
        FaultRule::always(Fault::Error("boom".into()))
            .on(Method::CreateRoute)
            .times(1),
    );
    env.create_node(serde_json::json!({
        "metadata": { "name": "n2" },
        "spec": { "podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"] },
    }))
    .await;
    // Reconciled a period after the last one, then retried a period later.
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(env.cloud.routes(CLUSTER).len(), 2, "retried");
    assert_eq!(env.sample("route_controller_route_sync_total"), 6.0);
    assert_eq!(env.sample("workqueue_retries_total{name=\"Routes\"}"), 1.0);
    assert_eq!(env.sample("workqueue_adds_total{name=\"Routes\"}"), 3.0);
    assert_eq!(env.sample("workqueue_depth{name=\"Routes\"}"), 0.0);
}
