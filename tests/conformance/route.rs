//! The route controller against FakeCloud and the in-process API server, checked against
//! upstream's `k8s.io/cloud-provider/controllers/route/route_controller.go`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_testkit::{client, eventually};
use cloud_provider::{CloudProvider, CloudResult, Route, Routes};
use cloud_provider_app::controllers::ControllerContext;
use cloud_provider_app::controllers::route::{RouteConfig, RouteController};
use cloud_provider_fake::{Call, FakeCloud, FakeInstance, FakeRoute, Fault, FaultRule, Method};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "kubernetes";

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

async fn add_node(client: &Client, name: &str, cidrs: &[&str]) -> Node {
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": { "podCIDRs": cidrs, "podCIDR": cidrs.first() },
    }))
    .unwrap();
    let api: Api<Node> = Api::all(client.clone());
    let created = api.create(&PostParams::default(), &node).await.unwrap();
    let status = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": format!("192.168.0.{}", name.len())}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let _ = created;
    api.get(name).await.unwrap()
}

/// A controller context on `client` and `cloud`, with its own Node cache and shutdown token.
fn context(client: &Client, cloud: Arc<dyn CloudProvider>) -> ControllerContext {
    ControllerContext::new(client.clone(), cloud, CLUSTER, CancellationToken::new())
}

fn controller(client: &Client, cloud: &FakeCloud, cidrs: &[&str]) -> RouteController {
    let ctx = context(client, Arc::new(cloud.clone()));
    RouteController::new(
        ctx,
        RouteConfig::new(cidrs.iter().map(|c| net(c)).collect()),
    )
    .unwrap()
    .unwrap()
}

fn cloud(nodes: &[&str]) -> FakeCloud {
    FakeCloud::builder()
        .instances(
            nodes
                .iter()
                .map(|n| FakeInstance::new(format!("i-{n}"), *n)),
        )
        .build()
}

async fn condition(client: &Client, name: &str) -> Option<(String, String)> {
    let node = Api::<Node>::all(client.clone()).get(name).await.unwrap();
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "NetworkUnavailable")
        .map(|c| (c.status, c.reason.unwrap_or_default()))
}

/// Upstream `k8s.io/cloud-provider/app/core.go` `startRouteController`: no Routes → not
/// started; empty cluster CIDR → error.
#[tokio::test(start_paused = true)]
async fn the_route_controller_needs_routes_and_a_cluster_cidr_to_start() {
    let client = client().await;
    let ctx = context(&client, Arc::new(cloud(&[])));
    assert!(RouteController::new(ctx, RouteConfig::new(vec![])).is_err());
}

/// Upstream `k8s.io/cloud-provider/controllers/route/route_controller.go` `reconcile`: one route
/// per pod CIDR, same name hint (Node UID), condition RouteCreated.
#[tokio::test(start_paused = true)]
async fn each_pod_cidr_gets_a_route_and_the_node_gets_route_created() {
    let client = client().await;
    let cloud = cloud(&["n1"]);
    let node = add_node(&client, "n1", &["10.244.1.0/24", "fd00:1::/64"]).await;
    let rc = controller(&client, &cloud, &["10.244.0.0/16", "fd00::/48"]);
    let report = rc.reconcile().await.unwrap();
    assert_eq!(report.created, 2);
    let uid = node.metadata.uid.unwrap();
    let hints: Vec<String> = cloud
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::CreateRoute {
                name_hint,
                target_node,
                ..
            } => {
                assert_eq!(target_node, "n1");
                Some(name_hint)
            }
            _ => None,
        })
        .collect();
    assert_eq!(hints, vec![uid.clone(), uid]);
    assert_eq!(cloud.routes(CLUSTER).len(), 2);
    assert_eq!(
        condition(&client, "n1").await,
        Some(("False".into(), "RouteCreated".into()))
    );
    // Second reconcile: nothing to create, condition unchanged (`updateNetworkingCondition`: no patch).
    let report = rc.reconcile().await.unwrap();
    assert_eq!(
        (report.created, report.deleted, report.conditions_patched),
        (0, 0, 0)
    );
}

/// Upstream `route_controller.go` `reconcile`: stale and blackhole routes inside the cluster
/// CIDR are deleted; foreign ones kept.
#[tokio::test(start_paused = true)]
async fn stale_and_blackhole_routes_in_the_cluster_cidr_are_deleted_and_foreign_ones_kept() {
    let client = client().await;
    let cloud = cloud(&["n1", "gone"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    cloud.add_route(FakeRoute::new(CLUSTER, "x", net("10.244.9.0/24"), "gone"));
    cloud.add_route(FakeRoute::new(CLUSTER, "y", net("172.16.0.0/24"), "gone"));
    let mut hole = FakeRoute::new(CLUSTER, "z", net("10.244.1.0/24"), "n1");
    hole.blackhole = true;
    cloud.add_route(hole);
    let rc = controller(&client, &cloud, &["10.244.0.0/16"]);
    rc.reconcile().await.unwrap();
    let deleted: Vec<IpNet> = cloud
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::DeleteRoute { cidr, .. } => Some(cidr),
            _ => None,
        })
        .collect();
    assert!(
        deleted.contains(&net("10.244.9.0/24")),
        "stale route deleted"
    );
    assert!(deleted.contains(&net("10.244.1.0/24")), "blackhole deleted");
    assert!(
        !deleted.contains(&net("172.16.0.0/24")),
        "foreign route kept"
    );
    assert!(
        cloud
            .routes(CLUSTER)
            .iter()
            .any(|r| r.cidr == net("172.16.0.0/24"))
    );
}

/// Upstream `route_controller.go` `reconcile`: a Node without pod CIDR is skipped and gets no
/// condition.
#[tokio::test(start_paused = true)]
async fn a_node_without_pod_cidr_gets_no_route_and_no_condition() {
    let client = client().await;
    let cloud = cloud(&["n1"]);
    add_node(&client, "n1", &[]).await;
    let rc = controller(&client, &cloud, &["10.244.0.0/16"]);
    let report = rc.reconcile().await.unwrap();
    assert_eq!(report.created, 0);
    assert_eq!(cloud.call_count(Method::CreateRoute), 0);
    assert_eq!(condition(&client, "n1").await, None);
}

/// Upstream `route_controller.go` `reconcile`: a failed create → NetworkUnavailable=True/
/// NoRouteCreated and Warning FailedToCreateRoute.
#[tokio::test(start_paused = true)]
async fn a_failed_create_sets_no_route_created_and_warns() {
    let client = client().await;
    let cloud = cloud(&["n1"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    cloud.inject(FaultRule::always(Fault::Error("quota".into())).on(Method::CreateRoute));
    let rc = controller(&client, &cloud, &["10.244.0.0/16"]);
    let report = rc.reconcile().await.unwrap();
    assert_eq!(report.failed_creates, 1);
    assert_eq!(
        condition(&client, "n1").await,
        Some(("True".into(), "NoRouteCreated".into()))
    );
    let events = Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedToCreateRoute")
                && e.type_.as_deref() == Some("Warning")
                && e.involved_object.name.as_deref() == Some("n1"))
    );
}

/// client-go's EventCorrelator: a route failing every reconcile (every 10 s
/// for 5 minutes) bumps `count` and `lastTimestamp` of one Event instead of writing 30.
#[tokio::test(start_paused = true)]
async fn a_failing_route_writes_one_event_with_a_count() {
    let client = client().await;
    let cloud = cloud(&["n1"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    cloud.inject(FaultRule::always(Fault::Error("quota".into())).on(Method::CreateRoute));
    let rc = controller(&client, &cloud, &["10.244.0.0/16"]);
    for _ in 0..30 {
        assert_eq!(rc.reconcile().await.unwrap().failed_creates, 1);
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedToCreateRoute"))
        .collect();
    assert_eq!(events.len(), 1, "one Event, not one per reconcile");
    let count = events[0].count.unwrap_or(0);
    // 25 from the spam filter's burst, then one token per 5 minutes.
    assert!((25..=27).contains(&count), "count {count}");
}

/// Upstream `route_controller.go` `updateNetworkingCondition`: the same status with a foreign
/// reason (CalicoIsUp) is overwritten.
#[tokio::test(start_paused = true)]
async fn a_network_unavailable_condition_with_a_foreign_reason_is_overwritten() {
    let client = client().await;
    let cloud = cloud(&["n1"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    let patch = serde_json::json!({"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp", "message": "calico"}]}});
    Api::<Node>::all(client.clone())
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let rc = controller(&client, &cloud, &["10.244.0.0/16"]);
    let report = rc.reconcile().await.unwrap();
    assert_eq!(report.conditions_patched, 1);
    assert_eq!(
        condition(&client, "n1").await,
        Some(("False".into(), "RouteCreated".into()))
    );
}

/// Upstream `route_controller.go` `Run`: periodic mode lists routes every 10 s
/// (`--route-reconciliation-period`).
#[tokio::test(start_paused = true)]
async fn periodic_mode_lists_routes_every_ten_seconds() {
    let client = client().await;
    let cloud = cloud(&["n1"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    let rc = controller(&client, &cloud, &["10.244.0.0/16"]);
    let shutdown = CancellationToken::new();
    let ctx_token = shutdown.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            () = rc.run() => {}
            () = ctx_token.cancelled() => {}
        }
    });
    tokio::time::sleep(Duration::from_millis(35_000)).await;
    shutdown.cancel();
    task.await.unwrap();
    assert_eq!(
        cloud.call_count(Method::ListRoutes),
        4,
        "at 0, 10, 20 and 30 s"
    );
}

/// Beyond upstream (failed creates are retried): watch mode reconciles on a new Node, at most
/// once per period, and retries a failed create.
#[tokio::test(start_paused = true)]
async fn watch_mode_reconciles_on_a_new_node_and_retries_a_failed_create() {
    let client = client().await;
    let cloud = cloud(&["n1", "n2"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    let ctx = context(&client, Arc::new(cloud.clone()));
    let rc = RouteController::new(
        ctx,
        RouteConfig::new(vec![net("10.244.0.0/16")]).with_watch_based(true),
    )
    .unwrap()
    .unwrap();
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move {
        tokio::select! {
            () = rc.run() => {}
            () = t.cancelled() => {}
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cloud.call_count(Method::ListRoutes), 1);
    // Nothing changes: no further reconcile.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(cloud.call_count(Method::ListRoutes), 1);
    // A new Node whose first create fails: reconciled, then retried a period later.
    cloud.inject(
        FaultRule::always(Fault::Error("boom".into()))
            .on(Method::CreateRoute)
            .times(1),
    );
    add_node(&client, "n2", &["10.244.2.0/24"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cloud.call_count(Method::ListRoutes), 2);
    assert_eq!(cloud.routes(CLUSTER).len(), 1, "first create failed");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(cloud.call_count(Method::ListRoutes), 3);
    assert_eq!(cloud.routes(CLUSTER).len(), 2, "retried");
    token.cancel();
    task.await.unwrap();
}

/// Upstream `route_controller.go` `maxConcurrentRouteOperations`: at most 200 create/delete
/// calls in flight.
#[tokio::test(start_paused = true)]
async fn at_most_200_route_calls_are_in_flight() {
    let client = client().await;
    let names: Vec<String> = (0..250).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let cloud = cloud(&refs);
    for (i, name) in names.iter().enumerate() {
        add_node(
            &client,
            name,
            &[&format!("10.{}.{}.0/24", 100 + i / 256, i % 256)],
        )
        .await;
    }
    cloud.set_method_latency(Method::CreateRoute, Duration::from_secs(10));
    let rc = controller(&client, &cloud, &["10.0.0.0/8"]);
    let task = tokio::spawn(async move { rc.reconcile().await.unwrap() });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(cloud.call_count(Method::CreateRoute), 200, "capped at 200");
    let report = task.await.unwrap();
    assert_eq!(report.created, 250);
}

/// A Routes provider that reports target addresses (`enable_node_addresses`) and logs calls;
/// deletes are slow, so an unsequenced create would finish first.
struct AddressRoutes {
    routes: parking_lot::Mutex<Vec<Route>>,
    log: parking_lot::Mutex<Vec<String>>,
}

#[async_trait]
impl Routes for AddressRoutes {
    async fn list_routes(&self, _cluster_name: &str) -> CloudResult<Vec<Route>> {
        Ok(self.routes.lock().clone())
    }
    async fn create_route(&self, _cluster: &str, _hint: &str, route: &Route) -> CloudResult<()> {
        self.log
            .lock()
            .push(format!("create {}", route.destination_cidr));
        Ok(())
    }
    async fn delete_route(&self, _cluster: &str, route: &Route) -> CloudResult<()> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.log
            .lock()
            .push(format!("delete {}", route.destination_cidr));
        Ok(())
    }
}

impl CloudProvider for AddressRoutes {
    fn provider_name(&self) -> &str {
        "address-routes"
    }
    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }
}

/// Upstream `route_controller.go` `reconcile` with node addresses in routes: different
/// addresses → delete, then create (sequenced); equal addresses → kept.
#[tokio::test(start_paused = true)]
async fn a_node_address_change_deletes_then_recreates_its_route() {
    let client = client().await;
    let node = add_node(&client, "n1", &["10.244.1.0/24"]).await;
    let current = node.status.unwrap().addresses.unwrap();
    let stale = Route::new("n1", net("10.244.1.0/24"))
        .with_target_addresses(vec![cloud_provider::node_address("InternalIP", "10.9.9.9")]);
    let cloud = Arc::new(AddressRoutes {
        routes: parking_lot::Mutex::new(vec![stale]),
        log: parking_lot::Mutex::default(),
    });
    let ctx = context(&client, cloud.clone());
    let rc = RouteController::new(ctx, RouteConfig::new(vec![net("10.244.0.0/16")]))
        .unwrap()
        .unwrap();
    rc.reconcile().await.unwrap();
    assert_eq!(
        *cloud.log.lock(),
        vec!["delete 10.244.1.0/24", "create 10.244.1.0/24"]
    );
    // Same addresses: nothing to do.
    *cloud.routes.lock() =
        vec![Route::new("n1", net("10.244.1.0/24")).with_target_addresses(current)];
    cloud.log.lock().clear();
    rc.reconcile().await.unwrap();
    assert!(cloud.log.lock().is_empty());
}

/// Ours, not upstream's (whose goroutine per Node has no cap): one reconcile keeps at most 64
/// `NetworkUnavailable` patches in flight, even when every Node's condition changes at once
/// (here 200 new routes; at 10,000 Nodes, the first pass after a restart).
#[tokio::test(start_paused = true)]
async fn condition_patches_are_bounded_in_flight() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let server = ccm_testkit::memory_server().await;
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let router = server.router().layer(axum::middleware::from_fn({
        let (in_flight, most) = (in_flight.clone(), most.clone());
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let (in_flight, most) = (in_flight.clone(), most.clone());
            async move {
                let status_patch = request.method() == axum::http::Method::PATCH
                    && request.uri().path().ends_with("/status");
                if !status_patch {
                    return next.run(request).await;
                }
                most.fetch_max(in_flight.fetch_add(1, SeqCst) + 1, SeqCst);
                // Each patch takes a while, so the ones sent together overlap.
                tokio::time::sleep(Duration::from_millis(100)).await;
                let response = next.run(request).await;
                in_flight.fetch_sub(1, SeqCst);
                response
            }
        }
    }));
    let client = Client::new(router, "default");
    let names: Vec<String> = (0..200).map(|i| format!("n{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let cloud = cloud(&refs);
    for (i, name) in names.iter().enumerate() {
        add_node(&client, name, &[&format!("10.100.{i}.0/24")]).await;
    }
    most.store(0, SeqCst);
    let rc = controller(&client, &cloud, &["10.0.0.0/8"]);
    let report = rc.reconcile().await.unwrap();
    assert_eq!((report.created, report.conditions_patched), (200, 200));
    assert_eq!(most.load(SeqCst), 64, "condition patches in flight at once");
}

/// A reconcile lets its list of Nodes go once it has decided: each condition patch reads its
/// Node from the cache when it is made. Held through the patches, the list kept alive the
/// version of every Node a patch had already replaced: two versions of every Node at the
/// ccm's memory peak at 10,000 Nodes (BENCHMARKS.md, issue 26).
#[tokio::test(start_paused = true)]
async fn a_reconcile_holds_no_replaced_node_version_through_its_condition_patches() {
    let server = ccm_testkit::memory_server().await;
    // n2's condition patch takes 10 s, so the reconcile is still patching when n1's is done.
    let router = server.router().layer(axum::middleware::from_fn(
        |request: axum::extract::Request, next: axum::middleware::Next| async move {
            if request.method() == axum::http::Method::PATCH
                && request.uri().path() == "/api/v1/nodes/n2/status"
            {
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
            next.run(request).await
        },
    ));
    let client = Client::new(router, "default");
    let cloud = cloud(&["n1", "n2"]);
    add_node(&client, "n1", &["10.100.1.0/24"]).await;
    add_node(&client, "n2", &["10.100.2.0/24"]).await;
    let ctx = context(&client, Arc::new(cloud.clone()));
    let nodes = ctx.nodes.clone();
    let rc = RouteController::new(ctx, RouteConfig::new(vec![net("10.0.0.0/8")]))
        .unwrap()
        .unwrap();
    nodes.wait_synced().await;
    // The version of n1 the reconcile will list.
    let listed = Arc::downgrade(&nodes.get("n1").unwrap());
    let reconcile = tokio::spawn(async move { rc.reconcile().await.unwrap() });
    eventually(5, "n1's patched version in the cache", || {
        let current = nodes.get("n1");
        async move {
            current
                .and_then(|n| n.status.clone()?.conditions)
                .filter(|c| c.iter().any(|c| c.type_ == "NetworkUnavailable"))
                .map(|_| ())
        }
    })
    .await;
    assert!(!reconcile.is_finished(), "n2's patch is still in flight");
    assert!(
        listed.upgrade().is_none(),
        "the reconcile no longer holds the version of n1 it listed"
    );
    let report = reconcile.await.unwrap();
    assert_eq!((report.created, report.conditions_patched), (2, 2));
}

/// Beyond upstream (the measure KEP-5237's review asks for):
/// `route_controller_node_routes_delay_seconds` gets one sample per Node when all its routes
/// exist, from the Node's creation; a reconcile with nothing new adds none.
#[tokio::test]
async fn a_node_with_all_its_routes_is_one_sample_of_the_creation_to_routes_delay() {
    let client = client().await;
    let cloud = cloud(&["n1", "n2"]);
    add_node(&client, "n1", &["10.244.1.0/24"]).await;
    add_node(&client, "n2", &["10.244.2.0/24"]).await;
    let ctx = context(&client, Arc::new(cloud.clone()));
    let metrics = ctx.metrics.clone();
    let cache = ctx.nodes.clone();
    let rc = RouteController::new(ctx, RouteConfig::new(vec![net("10.244.0.0/16")]))
        .unwrap()
        .unwrap();
    let scrape = || {
        let mut registry = cloud_provider::prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        cloud_provider::prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    assert!(scrape().contains("route_controller_node_routes_delay_seconds_count 0"));
    assert_eq!(rc.reconcile().await.unwrap().created, 2);
    let text = scrape();
    assert!(
        text.contains("route_controller_node_routes_delay_seconds_count 2"),
        "{text}"
    );
    // Created just now: both samples in the first bucket (1 s).
    assert!(
        text.contains("route_controller_node_routes_delay_seconds_bucket{le=\"1.0\"} 2"),
        "{text}"
    );
    // Once the shared Node cache has seen both conditions, a reconcile patches nothing and
    // observes nothing more.
    ccm_testkit::eventually(30, "the Node cache sees both conditions", || {
        let seen = ["n1", "n2"].iter().all(|n| {
            cache.get(n).is_some_and(|node| {
                node.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "NetworkUnavailable"))
            })
        });
        async move { seen.then_some(()) }
    })
    .await;
    assert_eq!(rc.reconcile().await.unwrap().conditions_patched, 0);
    assert!(scrape().contains("route_controller_node_routes_delay_seconds_count 2"));
}
