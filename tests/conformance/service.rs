//! The service controller against FakeCloud and the in-process API server, checked against
//! upstream's `k8s.io/cloud-provider/controllers/service/controller.go`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use cloud_provider::well_known::FINALIZER_LOAD_BALANCER_CLEANUP;
use cloud_provider::{CloudError, CloudProvider, CloudResult, LoadBalancer};
use cloud_provider_app::controllers::service::{ServiceConfig, ServiceController};
use cloud_provider_app::controllers::{ControllerContext, OrphanedLbConfig};
use cloud_provider_fake::{Call, FakeCloud, FakeInstance, Fault, FaultRule, Method};
use k8s_openapi::api::core::v1::{Event, LoadBalancerStatus, Node, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "kubernetes";

struct Env {
    /// The in-process API server, for more clients.
    server: core_cluster::ApiServer,
    client: Client,
    /// Every request of `client` (the controller's and the test's), see [`crate::tap`].
    tap: Arc<crate::tap::Tap>,
    cloud: FakeCloud,
    token: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Env {
    async fn new(nodes: &[&str]) -> Env {
        let server = ccm_testkit::memory_server().await;
        let (client, tap) = crate::tap::Tap::client(&server);
        let cloud = FakeCloud::builder()
            .instances(
                nodes
                    .iter()
                    .map(|n| FakeInstance::new(format!("i-{n}"), *n)),
            )
            .build();
        let env = Env {
            server,
            client,
            tap,
            cloud,
            token: CancellationToken::new(),
            task: None,
        };
        for n in nodes {
            env.add_node(n, serde_json::json!({})).await;
        }
        env
    }

    async fn add_node(&self, name: &str, labels: serde_json::Value) {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": labels },
            "spec": { "providerID": format!("fake://i-{name}") },
        }))
        .unwrap();
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    fn start(&mut self) {
        let cloud: Arc<dyn CloudProvider> = Arc::new(self.cloud.clone());
        self.start_with(cloud, ServiceConfig::default());
    }

    fn start_with(&mut self, cloud: Arc<dyn CloudProvider>, config: ServiceConfig) {
        let ctx = ControllerContext::new(self.client.clone(), cloud, CLUSTER, self.token.clone());
        let sc = ServiceController::new(ctx, config).unwrap().unwrap();
        self.task = Some(tokio::spawn(sc.run()));
    }

    async fn stop(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.client.clone(), "default")
    }

    async fn create_service(&self, name: &str, extra: serde_json::Value) -> Service {
        let mut svc = serde_json::json!({
            "metadata": { "name": name },
            "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP" }] },
        });
        merge(&mut svc, extra);
        let svc: Service = serde_json::from_value(svc).unwrap();
        self.services()
            .create(&PostParams::default(), &svc)
            .await
            .unwrap()
    }

    async fn get(&self, name: &str) -> Option<Service> {
        self.services().get_opt(name).await.unwrap()
    }

    async fn reasons(&self) -> Vec<String> {
        let mut events = Api::<Event>::namespaced(self.client.clone(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        events.sort_by_key(|e| {
            e.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        });
        events.into_iter().filter_map(|e| e.reason).collect()
    }
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn finalized(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER_LOAD_BALANCER_CLEANUP))
}

fn ingress_ip(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .clone()
}

async fn settle() {
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Ensuring → finalizer → Ensure → Ensured → status; a resync patches nothing.
#[tokio::test(start_paused = true)]
async fn ensuring_adds_the_finalizer_before_ensure_and_a_resync_patches_nothing() {
    let mut env = Env::new(&["n1", "n2"]).await;
    env.start();
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    let got = env.get("web").await.unwrap();
    assert!(finalized(&got));
    let lb = env
        .cloud
        .load_balancer_of(&svc)
        .expect("load balancer created");
    assert_eq!(lb.hosts(), vec!["n1".to_owned(), "n2".to_owned()]);
    assert_eq!(ingress_ip(&got), Some(lb.ip.to_string()));
    let reasons = env.reasons().await;
    assert_eq!(reasons, vec!["EnsuringLoadBalancer", "EnsuredLoadBalancer"]);
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    env.stop().await;
}

/// A sync reads the Service as its watch delivered it, as upstream's controller reads its
/// lister (`serviceLister.Services(ns).Get`): neither the first ensure nor the one after a
/// spec change GETs the Service.
#[tokio::test(start_paused = true)]
async fn a_sync_reads_the_watched_service_and_does_not_get_it() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    let patch = serde_json::json!({"spec": {"ports": [
        { "name": "http", "port": 80, "protocol": "TCP" },
        { "name": "https", "port": 443, "protocol": "TCP" },
    ]}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 2);
    let ports: Vec<i32> = env
        .cloud
        .load_balancer_of(&svc)
        .expect("load balancer created")
        .listeners
        .iter()
        .map(|l| l.port)
        .collect();
    assert_eq!(ports, [80, 443], "the second ensure had the patched spec");
    let gets: Vec<String> = env
        .tap
        .seen()
        .into_iter()
        .filter(|s| {
            s.method == axum::http::Method::GET
                && s.path
                    .starts_with("/api/v1/namespaces/default/services/web")
        })
        .map(|s| s.path)
        .collect();
    assert!(
        gets.is_empty(),
        "the controller read the Service with {gets:?}"
    );
    env.stop().await;
}

/// A Service with a loadBalancerClass is not ours.
#[tokio::test(start_paused = true)]
async fn a_service_with_a_load_balancer_class_is_ignored() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    env.create_service(
        "classy",
        serde_json::json!({"spec": {"loadBalancerClass": "example.com/lb"}}),
    )
    .await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 0);
    assert!(!finalized(&env.get("classy").await.unwrap()));
    env.stop().await;
}

/// Type change to ClusterIP cleans up; deletion then completes.
#[tokio::test(start_paused = true)]
async fn a_type_change_to_cluster_ip_cleans_up_and_deletion_completes() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert!(env.cloud.load_balancer_of(&svc).is_some());
    let patch = serde_json::json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "protocol": "TCP", "nodePort": null}]}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    settle().await;
    let got = env.get("web").await.unwrap();
    assert!(env.cloud.load_balancer_of(&svc).is_none(), "LB deleted");
    assert!(!finalized(&got), "finalizer removed");
    assert_eq!(ingress_ip(&got), None, "status cleared");
    assert!(
        env.reasons()
            .await
            .contains(&"DeletedLoadBalancer".to_owned())
    );

    // A LoadBalancer Service deleted while finalized is cleaned up and goes away.
    let svc2 = env.create_service("web2", serde_json::json!({})).await;
    settle().await;
    assert!(env.cloud.load_balancer_of(&svc2).is_some());
    env.services()
        .delete("web2", &DeleteParams::default())
        .await
        .unwrap();
    settle().await;
    assert!(env.cloud.load_balancer_of(&svc2).is_none());
    assert!(env.get("web2").await.is_none(), "garbage-collected");
    env.stop().await;
}

/// Cleanup when no load balancer exists (a ClusterIP Service still carrying the
/// finalizer, as a crashed ccm can leave it): no delete call and no DeletingLoadBalancer, but
/// the finalizer is removed and DeletedLoadBalancer is still emitted.
#[tokio::test(start_paused = true)]
async fn cleanup_without_a_load_balancer_removes_the_finalizer_without_a_delete_call() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    env.create_service(
        "leftover",
        serde_json::json!({
            "metadata": {"finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]},
            "spec": {"type": "ClusterIP"},
        }),
    )
    .await;
    settle().await;
    assert!(
        !finalized(&env.get("leftover").await.unwrap()),
        "finalizer removed"
    );
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancerDeleted), 0);
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 0);
    assert_eq!(env.reasons().await, vec!["DeletedLoadBalancer"]);
    env.stop().await;
}

/// `--concurrent-service-syncs` workers ensure that many Services at once. With a
/// 10 s EnsureLoadBalancer, one worker has ensured one of four Services after 12 s; two
/// workers have ensured two, and all four after 22 s.
#[tokio::test(start_paused = true)]
async fn service_workers_ensure_that_many_services_at_once() {
    for (workers, after_12s, after_22s) in [(1, 1, 2), (2, 2, 4)] {
        let mut env = Env::new(&["n1"]).await;
        env.cloud
            .set_method_latency(Method::EnsureLoadBalancer, Duration::from_secs(10));
        let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
        env.start_with(
            cloud,
            ServiceConfig::default().with_concurrent_service_syncs(workers),
        );
        for name in ["a", "b", "c", "d"] {
            env.create_service(name, serde_json::json!({})).await;
        }
        let ensured = |env: &Env| env.cloud.load_balancers().len();
        tokio::time::sleep(Duration::from_secs(12)).await;
        assert_eq!(ensured(&env), after_12s, "{workers} worker(s) after 12 s");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(ensured(&env), after_22s, "{workers} worker(s) after 22 s");
        env.stop().await;
    }
}

/// Beyond upstream (cloud-provider-gcp #981): a Service being deleted without our finalizer is
/// not re-finalized, and no load balancer is created for it.
#[tokio::test(start_paused = true)]
async fn deleting_service_without_finalizer_is_not_refinalized() {
    let mut env = Env::new(&["n1"]).await;
    env.create_service(
        "held",
        serde_json::json!({"metadata": {"finalizers": ["example.com/hold"]}}),
    )
    .await;
    env.services()
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let held = env.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    env.start();
    settle().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let held = env.get("held").await.unwrap();
    assert!(!finalized(&held));
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 0);
    assert!(
        !env.reasons()
            .await
            .contains(&"SyncLoadBalancerFailed".to_owned())
    );
    env.stop().await;
}

/// RetryAfter requeues after exactly the delay, without backoff.
#[tokio::test(start_paused = true)]
async fn a_retry_after_error_requeues_after_exactly_its_delay() {
    let mut env = Env::new(&["n1"]).await;
    env.cloud.inject(
        FaultRule::always(Fault::RetryAfter {
            after: Duration::from_secs(42),
            message: "busy".into(),
        })
        .on(Method::EnsureLoadBalancer)
        .times(3),
    );
    env.start();
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    for n in 2..=4 {
        tokio::time::sleep(Duration::from_secs(40)).await;
        assert_eq!(
            env.cloud.call_count(Method::EnsureLoadBalancer),
            n - 1,
            "not before 42 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            env.cloud.call_count(Method::EnsureLoadBalancer),
            n,
            "after exactly 42 s"
        );
    }
    assert!(env.get("web").await.unwrap().status.is_some());
    env.stop().await;
}

/// Other errors back off 5 s, 10 s, …; each failure records SyncLoadBalancerFailed.
#[tokio::test(start_paused = true)]
async fn other_errors_back_off_exponentially_and_warn() {
    let mut env = Env::new(&["n1"]).await;
    env.cloud.inject(
        FaultRule::always(Fault::Error("quota".into()))
            .on(Method::EnsureLoadBalancer)
            .times(2),
    );
    env.start();
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        env.cloud.call_count(Method::EnsureLoadBalancer),
        2,
        "after 5 s"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        env.cloud.call_count(Method::EnsureLoadBalancer),
        2,
        "not before 10 s more"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 3);
    // Two warnings: one Event with count 2 (client-go's correlator).
    let failed: i32 = Api::<Event>::namespaced(env.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
        .map(|e| e.count.unwrap_or(1))
        .sum();
    assert_eq!(failed, 2);
    env.stop().await;
}

/// An excluded node joins nothing; an unrelated label change triggers no
/// update; an added node updates the hosts with `UpdatedLoadBalancer`.
#[tokio::test(start_paused = true)]
async fn only_eligible_node_changes_update_load_balancer_hosts() {
    let mut env = Env::new(&["n1"]).await;
    env.add_node(
        "ex",
        serde_json::json!({"node.kubernetes.io/exclude-from-external-load-balancers": "true"}),
    )
    .await;
    env.start();
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert_eq!(
        env.cloud.load_balancer_of(&svc).unwrap().hosts(),
        vec!["n1".to_owned()]
    );
    // Unrelated label change: no update.
    let patch = serde_json::json!({"metadata": {"labels": {"team": "a"}}});
    Api::<Node>::all(env.client.clone())
        .patch("n1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    settle().await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 0);
    // A new node: hosts updated.
    env.cloud.add_instance(FakeInstance::new("i-n2", "n2"));
    env.add_node("n2", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 1);
    assert_eq!(
        env.cloud.load_balancer_of(&svc).unwrap().hosts(),
        vec!["n1".to_owned(), "n2".to_owned()]
    );
    assert!(
        env.reasons()
            .await
            .contains(&"UpdatedLoadBalancer".to_owned())
    );
    // The periodic node sync (100 s) finds no change: no further update.
    tokio::time::sleep(Duration::from_secs(101)).await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 1);
    env.stop().await;
}

/// Zero eligible nodes → Warning UnAvailableLoadBalancer, Ensure still called.
#[tokio::test(start_paused = true)]
async fn without_eligible_nodes_ensure_is_still_called_and_warns() {
    let mut env = Env::new(&[]).await;
    env.start();
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    assert!(
        env.reasons()
            .await
            .contains(&"UnAvailableLoadBalancer".to_owned())
    );
    env.stop().await;
}

/// A Service deleted without the finalizer → EnsureLoadBalancerDeleted from the cache,
/// events DeletingLoadBalancer and DeletedLoadBalancer.
#[tokio::test(start_paused = true)]
async fn a_service_deleted_without_the_finalizer_is_cleaned_up_from_the_cache() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert!(env.cloud.load_balancer_of(&svc).is_some());
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    settle().await;
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    settle().await;
    assert!(env.get("web").await.is_none());
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancerDeleted), 1);
    assert!(env.cloud.load_balancer_of(&svc).is_none());
    let reasons = env.reasons().await;
    assert!(reasons.contains(&"DeletingLoadBalancer".to_owned()));
    assert!(reasons.contains(&"DeletedLoadBalancer".to_owned()));
    env.stop().await;
}

/// A cloud whose load balancers are implemented elsewhere (delegates the rest to FakeCloud).
struct Elsewhere(FakeCloud);

#[async_trait]
impl LoadBalancer for Elsewhere {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.0
            .load_balancer()
            .unwrap()
            .get_load_balancer(cluster_name, service)
            .await
            .map(|_| Some(LoadBalancerStatus::default()))
    }
    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        Err(CloudError::context(
            "ensure",
            CloudError::ImplementedElsewhere,
        ))
    }
    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        _service: &Service,
        _nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        Err(CloudError::ImplementedElsewhere)
    }
    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        _service: &Service,
    ) -> CloudResult<()> {
        Err(CloudError::ImplementedElsewhere)
    }
}

impl CloudProvider for Elsewhere {
    fn provider_name(&self) -> &str {
        "elsewhere"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

/// ImplementedElsewhere (even wrapped) on ensure → success, finalizer kept, no
/// status and no EnsuredLoadBalancer; on delete → ignored, finalizer removed.
#[tokio::test(start_paused = true)]
async fn implemented_elsewhere_keeps_the_finalizer_on_ensure_and_drops_it_on_delete() {
    let mut env = Env::new(&["n1"]).await;
    let cloud = Arc::new(Elsewhere(env.cloud.clone()));
    env.start_with(cloud, ServiceConfig::default());
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let got = env.get("web").await.unwrap();
    assert!(finalized(&got));
    assert_eq!(ingress_ip(&got), None);
    let reasons = env.reasons().await;
    assert_eq!(
        reasons,
        vec!["EnsuringLoadBalancer"],
        "one sync, no retry, no Ensured"
    );
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    settle().await;
    assert!(env.get("web").await.is_none(), "finalizer removed");
    assert!(
        env.reasons()
            .await
            .contains(&"DeletedLoadBalancer".to_owned())
    );
    env.stop().await;
}

/// Beyond upstream: the optional drift re-ensure re-runs EnsureLoadBalancer every period.
#[tokio::test(start_paused = true)]
async fn drift_reensure_period() {
    let mut env = Env::new(&["n1"]).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
    env.start_with(
        cloud,
        ServiceConfig::default().with_lb_drift_reensure_period(Some(Duration::from_secs(60))),
    );
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 2);
    env.stop().await;
}

/// Upstream's `nodeSyncService`, and beyond upstream (only Services whose node set changed
/// are updated):
/// an excluded node joining changes no set → no UpdateLoadBalancer; excluding the only node
/// updates with 0 hosts → Warning UnAvailableLoadBalancer; `=false` re-includes it.
#[tokio::test(start_paused = true)]
async fn exclusion_flips_update_only_services_whose_node_set_changed() {
    let label = "node.kubernetes.io/exclude-from-external-load-balancers";
    let mut env = Env::new(&["n1"]).await;
    env.start();
    let a = env.create_service("a", serde_json::json!({})).await;
    let b = env.create_service("b", serde_json::json!({})).await;
    settle().await;
    env.cloud.add_instance(FakeInstance::new("i-ex", "ex"));
    env.add_node("ex", serde_json::json!({ label: "true" }))
        .await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 0);

    let nodes: Api<Node> = Api::all(env.client.clone());
    let exclude = serde_json::json!({"metadata": {"labels": { label: "true" }}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&exclude))
        .await
        .unwrap();
    settle().await;
    assert_eq!(
        env.cloud.call_count(Method::UpdateLoadBalancer),
        2,
        "a and b"
    );
    assert!(env.cloud.load_balancer_of(&a).unwrap().hosts().is_empty());
    assert!(env.cloud.load_balancer_of(&b).unwrap().hosts().is_empty());
    let reasons = env.reasons().await;
    assert_eq!(
        reasons
            .iter()
            .filter(|r| *r == "UnAvailableLoadBalancer")
            .count(),
        2
    );

    let include = serde_json::json!({"metadata": {"labels": { label: "false" }}});
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&include))
        .await
        .unwrap();
    settle().await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 4);
    assert_eq!(
        env.cloud.load_balancer_of(&a).unwrap().hosts(),
        vec!["n1".to_owned()]
    );
    env.stop().await;
}

/// Upstream's `updateLoadBalancerHosts` (controllers/service/controller.go) updates the
/// load balancers of a node sync with `--concurrent-service-syncs` workers; beyond upstream,
/// `--concurrent-lb-host-updates` keeps that many `UpdateLoadBalancer` calls in flight
/// instead. With a 10 s `UpdateLoadBalancer` and one service worker, a Node joining reaches
/// one of four load balancers in 11 s by default, and all four with four updates in flight.
#[tokio::test(start_paused = true)]
async fn a_node_sync_keeps_concurrent_lb_host_updates_in_flight() {
    for (updates, holding_after_11s) in [(0, 1), (4, 4)] {
        let mut env = Env::new(&["n1"]).await;
        let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
        env.start_with(
            cloud,
            ServiceConfig::default().with_concurrent_lb_host_updates(updates),
        );
        let mut services = Vec::new();
        for name in ["a", "b", "c", "d"] {
            services.push(env.create_service(name, serde_json::json!({})).await);
        }
        settle().await;
        assert_eq!(env.cloud.load_balancers().len(), 4);
        env.cloud
            .set_method_latency(Method::UpdateLoadBalancer, Duration::from_secs(10));
        env.cloud.add_instance(FakeInstance::new("i-n2", "n2"));
        env.add_node("n2", serde_json::json!({})).await;
        tokio::time::sleep(Duration::from_secs(11)).await;
        let holding = |env: &Env| {
            services
                .iter()
                .filter(|svc| env.cloud.load_balancer_of(svc).unwrap().hosts().len() == 2)
                .count()
        };
        assert_eq!(
            holding(&env),
            holding_after_11s,
            "{updates} update(s) in flight"
        );
        tokio::time::sleep(Duration::from_secs(40)).await;
        assert_eq!(
            holding(&env),
            4,
            "{updates} update(s) in flight, in the end"
        );
        assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 4);
        env.stop().await;
    }
}

/// Upstream's node sync (controllers/service/controller.go `nodeSyncLoop`, triggered through
/// a one-slot channel) coalesces Node changes: the Nodes that join while a node sync's
/// updates are in flight reach every load balancer in one more pass, from one list of the
/// Nodes, not in a pass per change.
#[tokio::test(start_paused = true)]
async fn nodes_joining_during_a_node_sync_are_brought_in_by_one_more_pass() {
    let mut env = Env::new(&["n1"]).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
    env.start_with(
        cloud,
        ServiceConfig::default().with_concurrent_lb_host_updates(2),
    );
    let a = env.create_service("a", serde_json::json!({})).await;
    let b = env.create_service("b", serde_json::json!({})).await;
    settle().await;
    env.cloud
        .set_method_latency(Method::UpdateLoadBalancer, Duration::from_secs(10));
    env.cloud.add_instance(FakeInstance::new("i-n2", "n2"));
    env.add_node("n2", serde_json::json!({})).await;
    // The first pass's two updates are in flight; three more Nodes join meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.cloud.call_count(Method::UpdateLoadBalancer), 2);
    for n in ["n3", "n4", "n5"] {
        env.cloud
            .add_instance(FakeInstance::new(format!("i-{n}"), n));
        env.add_node(n, serde_json::json!({})).await;
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let all: Vec<String> = ["n1", "n2", "n3", "n4", "n5"].map(str::to_owned).into();
    assert_eq!(env.cloud.load_balancer_of(&a).unwrap().hosts(), all);
    assert_eq!(env.cloud.load_balancer_of(&b).unwrap().hosts(), all);
    assert_eq!(
        env.cloud.call_count(Method::UpdateLoadBalancer),
        4,
        "two passes of two updates"
    );
    env.stop().await;
}

/// A node sync never updates a load balancer while its ensure is in the cloud: an update
/// beside the ensure that creates the load balancer could create it twice where creation is
/// not idempotent (moto's ELBv2). The node sync passes it over, and one more pass after the
/// ensure brings in the Nodes that joined meanwhile.
#[tokio::test(start_paused = true)]
async fn a_node_sync_leaves_a_load_balancer_to_its_ensure_in_flight() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    env.cloud
        .set_method_latency(Method::EnsureLoadBalancer, Duration::from_secs(10));
    let a = env.create_service("a", serde_json::json!({})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.cloud.call_count(Method::EnsureLoadBalancer),
        1,
        "in flight"
    );
    env.cloud.add_instance(FakeInstance::new("i-n2", "n2"));
    env.add_node("n2", serde_json::json!({})).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        env.cloud.call_count(Method::UpdateLoadBalancer),
        0,
        "no update while the ensure is in the cloud"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    assert_eq!(
        env.cloud.call_count(Method::UpdateLoadBalancer),
        1,
        "one pass after the ensure"
    );
    let all: Vec<String> = ["n1", "n2"].map(str::to_owned).into();
    assert_eq!(env.cloud.load_balancer_of(&a).unwrap().hosts(), all);
    env.stop().await;
}

/// A failed host update on an existing LB → Warning UpdateLoadBalancerFailed and a full
/// re-ensure through the service queue.
#[tokio::test(start_paused = true)]
async fn a_failed_host_update_warns_and_requeues_a_full_ensure() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 1);
    env.cloud.inject(
        FaultRule::always(Fault::Error("backend api down".into()))
            .on(Method::UpdateLoadBalancer)
            .times(1),
    );
    env.cloud.add_instance(FakeInstance::new("i-n2", "n2"));
    env.add_node("n2", serde_json::json!({})).await;
    settle().await;
    assert!(
        env.reasons()
            .await
            .contains(&"UpdateLoadBalancerFailed".to_owned())
    );
    assert_eq!(
        env.cloud.call_count(Method::EnsureLoadBalancer),
        2,
        "re-ensured"
    );
    assert_eq!(
        env.cloud.load_balancer_of(&svc).unwrap().hosts(),
        vec!["n1".to_owned(), "n2".to_owned()]
    );
    env.stop().await;
}

/// A Service that already has the finalizer and an up-to-date status is not patched
/// again on a later re-ensure (same resourceVersion).
#[tokio::test(start_paused = true)]
async fn an_up_to_date_service_is_not_patched_again() {
    let mut env = Env::new(&["n1"]).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
    env.start_with(
        cloud,
        ServiceConfig::default().with_lb_drift_reensure_period(Some(Duration::from_secs(60))),
    );
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    let before = env.get("web").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 2);
    let after = env.get("web").await.unwrap().metadata.resource_version;
    assert_eq!(before, after, "neither finalizer nor status patched");
    env.stop().await;
}

/// The finalizer (added and removed) and the status both go out as strategic-merge
/// patches to `services/<name>/status`, never to the Service itself, and carry no spec. The
/// finalizer is added before the status is written. (Requests recorded at the API server.)
#[tokio::test(start_paused = true)]
async fn the_finalizer_and_the_status_patch_the_status_subresource() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert!(finalized(&env.get("web").await.unwrap()));
    let patch = serde_json::json!({"spec": {"type": "ClusterIP", "ports": [{"port": 80, "protocol": "TCP", "nodePort": null}]}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    settle().await;
    let got = env.get("web").await.unwrap();
    assert!(!finalized(&got));

    let main = "/api/v1/namespaces/default/services/web";
    let status = format!("{main}/status");
    let writes: Vec<crate::tap::Seen> = env
        .tap
        .writes()
        .into_iter()
        .filter(|w| w.path.starts_with(main))
        .collect();
    // The only write to the Service itself is this test's own type change.
    let to_main: Vec<_> = writes.iter().filter(|w| w.path == main).collect();
    assert_eq!(to_main.len(), 1, "{to_main:?}");
    assert_eq!(
        to_main[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let controller: Vec<_> = writes.iter().filter(|w| w.path != main).collect();
    for w in &controller {
        assert_eq!(w.path, status, "{w:?}");
        assert_eq!(w.method, axum::http::Method::PATCH, "{w:?}");
        assert_eq!(
            w.content_type.as_deref(),
            Some("application/strategic-merge-patch+json"),
            "{w:?}"
        );
        assert!(w.json().get("spec").is_none(), "no spec in {}", w.json());
    }
    let bodies: Vec<serde_json::Value> = controller.iter().map(|w| w.json()).collect();
    let add = bodies
        .iter()
        .position(|b| {
            b["metadata"]["finalizers"] == serde_json::json!([FINALIZER_LOAD_BALANCER_CLEANUP])
        })
        .expect("the finalizer is added through status");
    let ingress = bodies
        .iter()
        .position(|b| b["status"]["loadBalancer"]["ingress"].is_array())
        .expect("the ingress is written through status");
    assert!(add < ingress, "finalizer before status: {bodies:?}");
    let remove = bodies
        .iter()
        .position(|b| {
            b["metadata"]["$deleteFromPrimitiveList/finalizers"]
                == serde_json::json!([FINALIZER_LOAD_BALANCER_CLEANUP])
        })
        .expect("the finalizer is removed through status");
    assert!(ingress < remove, "{bodies:?}");
    env.stop().await;
}

/// A load balancer that reports an empty status (no ingress) for every Service it ensures.
struct EmptyStatus(FakeCloud);

#[async_trait]
impl LoadBalancer for EmptyStatus {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.0
            .load_balancer()
            .unwrap()
            .get_load_balancer(cluster_name, service)
            .await
    }
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        self.0
            .load_balancer()
            .unwrap()
            .ensure_load_balancer(cluster_name, service, nodes)
            .await?;
        Ok(LoadBalancerStatus::default())
    }
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        self.0
            .load_balancer()
            .unwrap()
            .update_load_balancer(cluster_name, service, nodes)
            .await
    }
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.0
            .load_balancer()
            .unwrap()
            .ensure_load_balancer_deleted(cluster_name, service)
            .await
    }
}

impl CloudProvider for EmptyStatus {
    fn provider_name(&self) -> &str {
        "empty-status"
    }
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }
}

/// A documented difference: upstream's `EnsureLoadBalancer` returns a pointer and a
/// nil status is the error "service status returned by EnsureLoadBalancer is nil". Our
/// `ensure_load_balancer` returns `CloudResult<LoadBalancerStatus>`, so "nil" cannot be
/// returned at all; what a provider can return is an *empty* status, which upstream (a non-nil
/// `&LoadBalancerStatus{}`) accepts, and so do we: Ensured, finalizer kept, no ingress, no
/// status write, no Warning and no retry.
#[tokio::test(start_paused = true)]
async fn an_empty_load_balancer_status_is_not_an_error() {
    let mut env = Env::new(&["n1"]).await;
    env.start_with(
        Arc::new(EmptyStatus(env.cloud.clone())),
        ServiceConfig::default(),
    );
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(env.cloud.load_balancer_of(&svc).is_some());
    let got = env.get("web").await.unwrap();
    assert!(finalized(&got));
    assert_eq!(ingress_ip(&got), None);
    assert_eq!(
        env.reasons().await,
        vec!["EnsuringLoadBalancer", "EnsuredLoadBalancer"]
    );
    assert_eq!(
        env.cloud.call_count(Method::EnsureLoadBalancer),
        1,
        "no retry"
    );
    let status_writes = env
        .tap
        .writes()
        .into_iter()
        .filter(|w| w.json()["status"].is_object())
        .count();
    assert_eq!(status_writes, 0, "nothing to write for an empty status");
    env.stop().await;
}

/// A Service deleted and recreated under the same name while the controller is busy
/// (so it sees only the new one, with a new UID): the old load balancer, known from the
/// cache, is deleted before the new one is ensured (order from the fake's call record), and
/// only the new one is left.
#[tokio::test(start_paused = true)]
async fn a_recreated_service_deletes_the_old_load_balancer_first() {
    let mut env = Env::new(&["n1"]).await;
    env.start();
    let old = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert!(env.cloud.load_balancer_of(&old).is_some());

    // Keep the single service worker busy with another Service until released.
    let gate = Arc::new(tokio::sync::Notify::new());
    let hold = gate.clone();
    env.cloud.set_call_hook(Some(Arc::new(move |call: Call| {
        let hold = hold.clone();
        let blocked = matches!(&call, Call::EnsureLoadBalancer { service, .. } if service == "default/blocker");
        Box::pin(async move {
            if blocked {
                hold.notified().await;
            }
        })
    })));
    env.create_service("blocker", serde_json::json!({})).await;
    settle().await;
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancer), 2);

    // Delete "web" (without the finalizer, so it goes at once) and create it again.
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let new = env.create_service("web", serde_json::json!({})).await;
    assert_ne!(old.metadata.uid, new.metadata.uid);
    settle().await;
    let released_at = env.cloud.calls().len();
    gate.notify_one();
    settle().await;

    let after: Vec<Call> = env.cloud.calls()[released_at..].to_vec();
    let deleted = after
        .iter()
        .position(|c| matches!(c, Call::EnsureLoadBalancerDeleted { service, .. } if service == "default/web"))
        .unwrap_or_else(|| panic!("the old LB is deleted: {after:?}"));
    let ensured = after
        .iter()
        .position(
            |c| matches!(c, Call::EnsureLoadBalancer { service, .. } if service == "default/web"),
        )
        .unwrap_or_else(|| panic!("the new LB is ensured: {after:?}"));
    assert!(deleted < ensured, "delete before ensure: {after:?}");
    assert!(env.cloud.load_balancer_of(&old).is_none(), "old LB gone");
    let lb = env.cloud.load_balancer_of(&new).expect("new LB");
    assert_eq!(
        ingress_ip(&env.get("web").await.unwrap()),
        Some(lb.ip.to_string())
    );
    assert_eq!(env.cloud.load_balancers().len(), 2, "web and blocker");
    env.cloud.set_call_hook(None);
    env.stop().await;
}

/// Upstream's informer `Replace` semantics: a relist after a watch gap
/// reports what disappeared. The controller's connections are cut; meanwhile the Service's
/// finalizer is removed out of band and the Service deleted, so no event will ever say so.
/// After the relist the controller deletes the load balancer instead of leaking it.
#[tokio::test(start_paused = true)]
async fn a_service_deleted_during_a_watch_gap_has_its_lb_deleted_after_the_relist() {
    let env = Env::new(&["n1"]).await;
    // The controller gets its own tapped client, so its connections can be cut alone.
    let (controller_client, controller_tap) = crate::tap::Tap::client(&env.server);
    let ctx = ControllerContext::new(
        controller_client,
        Arc::new(env.cloud.clone()),
        CLUSTER,
        env.token.clone(),
    );
    let task = tokio::spawn(
        ServiceController::new(ctx, ServiceConfig::default())
            .unwrap()
            .unwrap()
            .run(),
    );
    let svc = env.create_service("web", serde_json::json!({})).await;
    settle().await;
    assert!(env.cloud.load_balancer_of(&svc).is_some());
    assert!(finalized(&env.get("web").await.unwrap()));

    controller_tap.cut();
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    env.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    assert!(env.get("web").await.is_none());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        env.cloud.load_balancer_of(&svc).is_some(),
        "nothing can happen while the controller is cut off"
    );

    // The watch comes back to an expired resource version: 410 Gone, then a relist.
    controller_tap.expire_next_watch("/api/v1/services");
    controller_tap.restore();
    for _ in 0..60 {
        if env.cloud.load_balancer_of(&svc).is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        env.cloud.load_balancer_of(&svc).is_none(),
        "the load balancer leaked"
    );
    assert_eq!(env.cloud.call_count(Method::EnsureLoadBalancerDeleted), 1);
    env.token.cancel();
    task.await.unwrap();
}

/// A load balancer as the provider made it for `default/name` in `cluster`, with no
/// controller having seen it (leaked while the ccm was down, or by a finalizer removed by
/// hand).
async fn leak_load_balancer(cloud: &FakeCloud, cluster: &str, name: &str, uid: &str) -> String {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "default", "uid": uid },
        "spec": { "type": "LoadBalancer", "ports": [{ "port": 80, "protocol": "TCP", "nodePort": 30080 }] },
    }))
    .unwrap();
    let lb = cloud.load_balancer().unwrap();
    lb.ensure_load_balancer(cluster, &svc, &[]).await.unwrap();
    lb.get_load_balancer_name(cluster, &svc)
}

fn lb_names(cloud: &FakeCloud) -> Vec<String> {
    let mut names: Vec<String> = cloud
        .load_balancers()
        .into_iter()
        .map(|lb| lb.name)
        .collect();
    names.sort();
    names
}

/// Collection every 100 ms after `grace_ms`.
fn gc(grace_ms: u64, dry_run: bool) -> ServiceConfig {
    ServiceConfig::default().with_orphaned_lb_gc(Some(OrphanedLbConfig::new(
        Duration::from_millis(100),
        Duration::from_millis(grace_ms),
        dry_run,
    )))
}

/// Beyond upstream (whose `controllers/service/controller.go` deletes a load balancer only
/// on seeing its Service change or go): a load balancer of this cluster whose Service is gone,
/// or no longer wants one and holds no cleanup finalizer, is deleted once it has stayed
/// orphaned for the grace period; a Service's own load balancer and another cluster's are
/// never touched.
#[tokio::test]
async fn a_leaked_load_balancer_is_deleted_after_the_grace_period() {
    let mut env = Env::new(&["n1"]).await;
    let web = env.create_service("web", serde_json::json!({})).await;
    let internal = env
        .create_service(
            "internal",
            serde_json::json!({ "spec": { "type": "ClusterIP" } }),
        )
        .await;
    let gone = leak_load_balancer(
        &env.cloud,
        CLUSTER,
        "gone",
        "11111111-2222-3333-4444-555555555555",
    )
    .await;
    let no_longer_wanted = leak_load_balancer(
        &env.cloud,
        CLUSTER,
        "internal",
        internal.metadata.uid.as_deref().unwrap(),
    )
    .await;
    let others = leak_load_balancer(
        &env.cloud,
        "other-cluster",
        "gone",
        "66666666-7777-8888-9999-000000000000",
    )
    .await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
    env.start_with(cloud, gc(1500, false));
    ccm_testkit::eventually(10, "web's load balancer", || async {
        env.cloud.load_balancer_of(&web).map(|_| ())
    })
    .await;
    ccm_testkit::eventually(10, "two listings", || async {
        (env.cloud.call_count(Method::ListLoadBalancers) >= 2).then_some(())
    })
    .await;
    let names = lb_names(&env.cloud);
    assert!(
        names.contains(&gone) && names.contains(&no_longer_wanted),
        "deleted inside the grace period: {names:?}"
    );
    ccm_testkit::eventually(10, "the leaked load balancers deleted", || async {
        let names = lb_names(&env.cloud);
        (!names.contains(&gone) && !names.contains(&no_longer_wanted)).then_some(())
    })
    .await;
    assert!(env.cloud.load_balancer_of(&web).is_some(), "web's kept");
    assert!(
        lb_names(&env.cloud).contains(&others),
        "another cluster's kept"
    );
    assert_eq!(
        env.cloud
            .call_count(Method::EnsureListedLoadBalancerDeleted),
        2
    );
    env.stop().await;
}

/// Dry run only reports: the leaked load balancer stays and no deletion is called.
#[tokio::test]
async fn dry_run_collection_deletes_nothing() {
    let mut env = Env::new(&["n1"]).await;
    env.create_service("web", serde_json::json!({})).await;
    let gone = leak_load_balancer(
        &env.cloud,
        CLUSTER,
        "gone",
        "11111111-2222-3333-4444-555555555555",
    )
    .await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
    env.start_with(cloud, gc(0, true));
    ccm_testkit::eventually(10, "five listings", || async {
        (env.cloud.call_count(Method::ListLoadBalancers) >= 5).then_some(())
    })
    .await;
    assert!(lb_names(&env.cloud).contains(&gone));
    assert_eq!(
        env.cloud
            .call_count(Method::EnsureListedLoadBalancerDeleted),
        0
    );
    env.stop().await;
}

/// Nothing is collected on a failed listing of the cloud's load balancers, nor while the
/// cluster lists no Service at all (a wrong cluster or a broken cache must not empty the
/// cloud).
#[tokio::test]
async fn no_collection_on_a_failed_listing_or_an_empty_cluster() {
    let mut env = Env::new(&["n1"]).await;
    // No Service at all: not even the API server's own `default/kubernetes`.
    env.services()
        .delete("kubernetes", &DeleteParams::default())
        .await
        .unwrap();
    let gone = leak_load_balancer(
        &env.cloud,
        CLUSTER,
        "gone",
        "11111111-2222-3333-4444-555555555555",
    )
    .await;
    env.cloud.inject(
        FaultRule::always(Fault::Error("EC2 is down".into())).on(Method::ListLoadBalancers),
    );
    let cloud: Arc<dyn CloudProvider> = Arc::new(env.cloud.clone());
    env.start_with(cloud, gc(0, false));
    ccm_testkit::eventually(10, "failed listings", || async {
        (env.cloud.call_count(Method::ListLoadBalancers) >= 3).then_some(())
    })
    .await;
    assert!(
        lb_names(&env.cloud).contains(&gone),
        "deleted on a failed listing"
    );
    // The listing works now, but the cluster has no Service at all.
    env.cloud.clear_faults();
    let listed = env.cloud.call_count(Method::ListLoadBalancers);
    ccm_testkit::eventually(10, "more listings", || async {
        (env.cloud.call_count(Method::ListLoadBalancers) >= listed + 3).then_some(())
    })
    .await;
    assert!(
        lb_names(&env.cloud).contains(&gone),
        "deleted with an empty Service list"
    );
    assert_eq!(
        env.cloud
            .call_count(Method::EnsureListedLoadBalancerDeleted),
        0
    );
    // One Service appears: the cluster is real, the leaked load balancer goes.
    env.create_service("web", serde_json::json!({})).await;
    ccm_testkit::eventually(10, "the leaked load balancer deleted", || async {
        (!lb_names(&env.cloud).contains(&gone)).then_some(())
    })
    .await;
    env.stop().await;
}
