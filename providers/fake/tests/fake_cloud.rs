//! Behaviour of the fake cloud, through the provider traits as the controllers use them.

use std::{sync::Arc, time::Duration};

use cloud_provider::{
    CloudConfig, CloudProvider, ErrorKind, InstancesV2, LoadBalancer, Registry, Route, Routes,
    conformance::ConformanceKit,
};
use cloud_provider_fake::{
    Call, FakeCloud, FakeInstance, FakeRoute, Fault, FaultRule, InstanceState, Method,
};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service, ServicePort, ServiceSpec};

fn node(name: &str) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n
}

/// A Node as the service controller passes it to a load balancer: shared.
fn lb_node(name: &str) -> Arc<Node> {
    Arc::new(node(name))
}

fn node_with_provider_id(name: &str, provider_id: &str) -> Node {
    let mut n = node(name);
    n.spec = Some(NodeSpec {
        provider_id: Some(provider_id.into()),
        ..Default::default()
    });
    n
}

fn service(uid: &str, node_port: Option<i32>) -> Service {
    let mut s = Service::default();
    s.metadata.name = Some("web".into());
    s.metadata.namespace = Some("shop".into());
    s.metadata.uid = Some(uid.into());
    s.spec = Some(ServiceSpec {
        type_: Some("LoadBalancer".into()),
        ports: Some(vec![ServicePort {
            port: 443,
            protocol: Some("TCP".into()),
            node_port,
            ..Default::default()
        }]),
        ..Default::default()
    });
    s
}

fn three_instances() -> FakeCloud {
    FakeCloud::builder()
        .instance(FakeInstance::new("i-a", "node-a").with_internal_ip("10.0.0.1".parse().unwrap()))
        .instance(
            FakeInstance::new("i-b", "node-b")
                .with_internal_ip("10.0.0.2".parse().unwrap())
                .with_state(InstanceState::Stopped),
        )
        .instance(
            FakeInstance::new("i-c", "node-c")
                .in_zone("fake-zone-c", "fake-region-1")
                .with_internal_ip("fd00::3".parse().unwrap()),
        )
        .build()
}

#[tokio::test]
async fn fake_passes_the_conformance_kit() {
    let cloud = three_instances();
    let fixture = cloud.conformance_fixture("kubernetes");
    let report = ConformanceKit::new(Arc::new(cloud.clone()), fixture)
        .run()
        .await;
    assert!(report.is_success(), "{report}");
    // Nothing the kit created is left behind.
    assert!(cloud.load_balancers().is_empty());
    assert!(cloud.routes("kubernetes").is_empty());
}

#[tokio::test]
async fn instance_states_follow_cloud_semantics() {
    let cloud = three_instances();
    let v2 = cloud.instances_v2().unwrap();
    // Running: exists, not shut down; found by name without a provider ID.
    assert!(v2.instance_exists(&node("node-a")).await.unwrap());
    assert!(!v2.instance_shutdown(&node("node-a")).await.unwrap());
    // Stopped: exists and shut down.
    assert!(v2.instance_exists(&node("node-b")).await.unwrap());
    assert!(v2.instance_shutdown(&node("node-b")).await.unwrap());
    // Terminated while running: gone, and metadata says InstanceNotFound.
    assert!(cloud.terminate_instance("i-c"));
    assert!(!v2.instance_exists(&node("node-c")).await.unwrap());
    let err = v2.instance_metadata(&node("node-c")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InstanceNotFound);
    // Provider ID lookups win over names.
    let by_id = node_with_provider_id("renamed", "fake://i-a");
    let meta = v2.instance_metadata(&by_id).await.unwrap().unwrap();
    assert_eq!(meta.provider_id, "fake://i-a");
    // A malformed provider ID is a clear error, not "not found".
    let bad = node_with_provider_id("x", "aws:///us-east-1a/i-1");
    let err = v2.instance_exists(&bad).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Other);
    assert!(err.to_string().contains("invalid provider ID"), "{err}");
}

#[tokio::test]
async fn instances_can_be_added_stopped_and_removed_while_running() {
    let cloud = FakeCloud::new();
    let handle: Arc<dyn CloudProvider> = Arc::new(cloud.clone());
    let v2 = handle.instances_v2().unwrap();
    assert!(!v2.instance_exists(&node("late")).await.unwrap());
    cloud.add_instance(FakeInstance::new("i-late", "late"));
    assert!(v2.instance_exists(&node("late")).await.unwrap());
    cloud.stop_instance("i-late");
    assert!(v2.instance_shutdown(&node("late")).await.unwrap());
    cloud.start_instance("i-late");
    assert!(!v2.instance_shutdown(&node("late")).await.unwrap());
    assert!(cloud.remove_instance("i-late").is_some());
    assert!(!v2.instance_exists(&node("late")).await.unwrap());
    assert!(!cloud.stop_instance("i-late"));
}

#[tokio::test]
async fn metadata_carries_everything_the_instance_has() {
    let cloud = FakeCloud::builder()
        .instance(
            FakeInstance::new("i-1", "node-1")
                .in_zone("z1", "r1")
                .with_type("fake.xlarge")
                .with_internal_ip("10.1.0.1".parse().unwrap())
                .with_internal_ip("fd00:1::1".parse().unwrap())
                .with_external_ip("203.0.113.9".parse().unwrap())
                .with_label("example.com/rack", "r7"),
        )
        .build();
    let meta = cloud
        .instance_metadata(&node("node-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(meta.instance_type, "fake.xlarge");
    assert_eq!((meta.zone.as_str(), meta.region.as_str()), ("z1", "r1"));
    let addresses: Vec<(&str, &str)> = meta
        .node_addresses
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    assert_eq!(
        addresses,
        [
            ("Hostname", "node-1"),
            ("InternalIP", "10.1.0.1"),
            ("InternalIP", "fd00:1::1"),
            ("ExternalIP", "203.0.113.9"),
        ]
    );
    assert_eq!(meta.additional_labels["example.com/rack"], "r7");
}

#[tokio::test]
async fn batched_metadata_is_one_call_and_unbatched_is_one_per_node() {
    let nodes: Vec<Node> = (0..50).map(|i| node(&format!("n{i}"))).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    let instances = (0..49).map(|i| FakeInstance::new(format!("i-{i}"), format!("n{i}")));

    let batched = FakeCloud::builder().instances(instances.clone()).build();
    let results = batched.instance_metadata_batch(&refs).await;
    assert_eq!(results.len(), 50);
    assert!(results[..49].iter().all(|r| r.as_ref().unwrap().is_some()));
    // The one node without an instance fails alone.
    assert_eq!(
        results[49].as_ref().unwrap_err().kind(),
        ErrorKind::InstanceNotFound
    );
    assert_eq!(batched.total_calls(), 1);
    assert_eq!(batched.call_count(Method::InstanceMetadataBatch), 1);

    let unbatched = FakeCloud::builder()
        .instances(instances)
        .batching(false)
        .build();
    let results = unbatched.instance_metadata_batch(&refs).await;
    assert_eq!(results.len(), 50);
    assert_eq!(unbatched.call_count(Method::InstanceMetadata), 50);
}

/// Hosts given sorted by name (as the service controller gives them) are logged as the load
/// balancer's own shared list: a log of calls over many Nodes holds no copy of the names.
#[tokio::test]
async fn a_logged_load_balancer_call_shares_the_host_list_given_sorted() {
    let cloud = three_instances();
    let svc = service("11111111-2222-3333-4444-555555555555", Some(30443));
    let sorted = [lb_node("node-a"), lb_node("node-b")];
    cloud
        .ensure_load_balancer("k", &svc, &sorted)
        .await
        .unwrap();
    cloud
        .update_load_balancer("k", &svc, &sorted)
        .await
        .unwrap();
    let lb = cloud.load_balancer_of(&svc).unwrap();
    let logged: Vec<Arc<[String]>> = cloud
        .take_calls()
        .into_iter()
        .filter_map(|call| match call {
            Call::EnsureLoadBalancer { hosts, .. } | Call::UpdateLoadBalancer { hosts, .. } => {
                Some(hosts)
            }
            _ => None,
        })
        .collect();
    assert_eq!(logged.len(), 2);
    for hosts in &logged {
        assert!(Arc::ptr_eq(hosts, &lb.hosts), "{hosts:?}");
    }
    assert_eq!(lb.hosts(), ["node-a", "node-b"]);
}

#[tokio::test]
async fn calls_are_recorded_with_their_arguments() {
    let cloud = three_instances();
    let svc = service("11111111-2222-3333-4444-555555555555", Some(30443));
    cloud.instance_exists(&node("node-a")).await.unwrap();
    cloud
        .ensure_load_balancer("k", &svc, &[lb_node("node-b"), lb_node("node-a")])
        .await
        .unwrap();
    cloud.list_routes("k").await.unwrap();
    assert_eq!(
        cloud.take_calls(),
        vec![
            Call::InstanceExists {
                node: "node-a".into()
            },
            Call::EnsureLoadBalancer {
                cluster: "k".into(),
                service: "shop/web".into(),
                hosts: vec!["node-b".into(), "node-a".into()].into(),
            },
            Call::ListRoutes {
                cluster: "k".into()
            },
        ]
    );
    assert!(cloud.calls().is_empty());
}

#[tokio::test]
async fn injected_faults_return_the_given_errors() {
    let cloud = three_instances();
    cloud.inject(
        FaultRule::always(Fault::InstanceNotFound)
            .on(Method::InstanceMetadata)
            .times(1),
    );
    cloud.inject(
        FaultRule::always(Fault::RetryAfter {
            after: Duration::from_secs(42),
            message: "quota".into(),
        })
        .on(Method::EnsureLoadBalancer),
    );
    cloud.inject(FaultRule::always(Fault::Error("boom".into())).on(Method::ListRoutes));
    cloud.inject(FaultRule::always(Fault::NotImplemented).on(Method::InstanceShutdown));

    let err = cloud.instance_metadata(&node("node-a")).await.unwrap_err();
    assert!(err.is_instance_not_found());
    // `times(1)`: the next call succeeds.
    assert!(
        cloud
            .instance_metadata(&node("node-a"))
            .await
            .unwrap()
            .is_some()
    );

    let svc = service("u1", Some(30000));
    let err = cloud
        .ensure_load_balancer("k", &svc, &[])
        .await
        .unwrap_err();
    assert_eq!(err.retry_after_delay(), Some(Duration::from_secs(42)));
    assert!(
        cloud.load_balancers().is_empty(),
        "a failed ensure creates nothing"
    );

    let err = cloud.list_routes("k").await.unwrap_err();
    assert_eq!(err.to_string(), "injected fault in list-routes: boom");
    assert!(
        cloud
            .instance_shutdown(&node("node-a"))
            .await
            .unwrap_err()
            .is_not_implemented()
    );

    cloud.clear_faults();
    assert!(cloud.list_routes("k").await.is_ok());
}

#[tokio::test]
async fn error_rate_is_deterministic_for_a_seed() {
    async fn run(seed: u64) -> Vec<bool> {
        let cloud = FakeCloud::builder()
            .seed(seed)
            .fault(FaultRule::always(Fault::Error("flaky".into())).with_probability(0.3))
            .build();
        let mut failures = Vec::new();
        for _ in 0..500 {
            failures.push(cloud.list_routes("k").await.is_err());
        }
        failures
    }
    let a = run(99).await;
    assert_eq!(a, run(99).await);
    assert_ne!(a, run(100).await);
    let rate = a.iter().filter(|f| **f).count() as f64 / a.len() as f64;
    assert!((0.22..0.38).contains(&rate), "error rate {rate}");
}

#[tokio::test(start_paused = true)]
async fn latency_is_added_in_tokio_time() {
    let cloud = three_instances();
    cloud.set_latency(Duration::from_millis(20));
    cloud.set_method_latency(Method::ListRoutes, Duration::from_secs(3));
    let start = tokio::time::Instant::now();
    cloud.instance_exists(&node("node-a")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(20));
    cloud.list_routes("k").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(3020));
    // A batch pays the latency once.
    let nodes: Vec<Node> = (0..100).map(|i| node(&format!("n{i}"))).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    cloud.instance_metadata_batch(&refs).await;
    assert_eq!(start.elapsed(), Duration::from_millis(3040));
}

#[tokio::test]
async fn a_call_hook_can_hold_a_call() {
    let cloud = three_instances();
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    cloud.set_call_hook(Some(Arc::new(move |call: Call| {
        let mut rx = release_rx.clone();
        Box::pin(async move {
            if call.method() == Method::ListRoutes {
                let _ = rx.wait_for(|released| *released).await;
            }
        })
    })));
    let held = tokio::spawn({
        let cloud = cloud.clone();
        async move { cloud.list_routes("k").await }
    });
    tokio::task::yield_now().await;
    // Other calls go through while one is held.
    assert!(cloud.instance_exists(&node("node-a")).await.unwrap());
    assert!(!held.is_finished());
    release_tx.send(true).unwrap();
    assert!(held.await.unwrap().is_ok());
}

/// Load balancers with the same Nodes share one host list (memory: 1,000 load balancers over
/// 10,000 Nodes must not hold 10 million names); a changed set gets its own list, equal
/// content in any order and with duplicates is the same set.
#[tokio::test]
async fn load_balancers_with_the_same_nodes_share_one_host_list() {
    let cloud = three_instances();
    let a = service("aaaaaaa1-0000-0000-0000-000000000000", Some(31001));
    let b = service("aaaaaaa2-0000-0000-0000-000000000000", Some(31002));
    cloud
        .ensure_load_balancer("k", &a, &[lb_node("node-a"), lb_node("node-c")])
        .await
        .unwrap();
    cloud
        .ensure_load_balancer(
            "k",
            &b,
            &[lb_node("node-c"), lb_node("node-a"), lb_node("node-c")],
        )
        .await
        .unwrap();
    let (lb_a, lb_b) = (
        cloud.load_balancer_of(&a).unwrap(),
        cloud.load_balancer_of(&b).unwrap(),
    );
    assert_eq!(lb_b.hosts(), ["node-a", "node-c"]);
    assert!(Arc::ptr_eq(&lb_a.hosts, &lb_b.hosts), "one shared list");

    cloud
        .update_load_balancer("k", &b, &[lb_node("node-a")])
        .await
        .unwrap();
    let lb_b = cloud.load_balancer_of(&b).unwrap();
    assert_eq!(lb_b.hosts(), ["node-a"]);
    assert_eq!(
        cloud.load_balancer_of(&a).unwrap().hosts(),
        ["node-a", "node-c"]
    );
    assert!(!Arc::ptr_eq(&lb_a.hosts, &lb_b.hosts));

    // Back to the first set: shared again.
    cloud
        .update_load_balancer("k", &b, &[lb_node("node-c"), lb_node("node-a")])
        .await
        .unwrap();
    let lb_b = cloud.load_balancer_of(&b).unwrap();
    assert!(Arc::ptr_eq(&lb_a.hosts, &lb_b.hosts));
}

#[tokio::test]
async fn load_balancer_lifecycle() {
    let cloud = three_instances();
    let mut svc = service("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", Some(31443));
    svc.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
    svc.spec.as_mut().unwrap().health_check_node_port = Some(32000);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into()]);

    assert!(cloud.get_load_balancer("k", &svc).await.unwrap().is_none());
    let status = cloud
        .ensure_load_balancer("k", &svc, &[lb_node("node-a"), lb_node("node-c")])
        .await
        .unwrap();
    let ingress = &status.ingress.as_ref().unwrap()[0];
    let ip = ingress.ip.clone().unwrap();
    assert!(ip.starts_with("198.18."), "{ip}");

    let lb = cloud.load_balancer_of(&svc).unwrap();
    assert_eq!(lb.name, "aaaaaaaaabbbbccccddddeeeeeeeeeee"); // "a" + UID without dashes, 32 chars
    assert_eq!(lb.service, "shop/web");
    assert_eq!(lb.hosts(), ["node-a", "node-c"]);
    assert_eq!(
        (lb.listeners[0].port, lb.listeners[0].node_port),
        (443, 31443)
    );
    assert_eq!(lb.health_check, Some(("/healthz".into(), 32000)));
    assert_eq!(lb.source_ranges[0].to_string(), "10.0.0.0/8");

    // Idempotent: same IP on re-ensure.
    let again = cloud
        .ensure_load_balancer("k", &svc, &[lb_node("node-a")])
        .await
        .unwrap();
    assert_eq!(again, status);
    cloud
        .update_load_balancer("k", &svc, &[lb_node("node-c")])
        .await
        .unwrap();
    assert_eq!(cloud.load_balancer_of(&svc).unwrap().hosts(), ["node-c"]);

    cloud.ensure_load_balancer_deleted("k", &svc).await.unwrap();
    assert!(cloud.load_balancer_of(&svc).is_none());
    // Deleting an absent load balancer succeeds; updating one fails.
    cloud.ensure_load_balancer_deleted("k", &svc).await.unwrap();
    assert!(cloud.update_load_balancer("k", &svc, &[]).await.is_err());
}

#[tokio::test]
async fn load_balancer_rejects_what_a_cloud_cannot_serve() {
    let cloud = three_instances();
    let err = cloud
        .ensure_load_balancer("k", &service("u-noport", None), &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no node port"), "{err}");

    let mut bad_range = service("u-range", Some(30001));
    bad_range.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/99".into()]);
    let err = cloud
        .ensure_load_balancer("k", &bad_range, &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("10.0.0.0/99"), "{err}");

    let mut pinned = service("u-pinned", Some(30002));
    pinned.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.10".into());
    let status = cloud.ensure_load_balancer("k", &pinned, &[]).await.unwrap();
    assert_eq!(status.ingress.unwrap()[0].ip.as_deref(), Some("192.0.2.10"));
    assert_eq!(
        cloud.load_balancers().len(),
        1,
        "failed ensures created nothing"
    );
}

#[tokio::test]
async fn routes_lifecycle_and_blackholes() {
    let cloud = three_instances();
    let v4: ipnet::IpNet = "10.244.1.0/24".parse().unwrap();
    let v6: ipnet::IpNet = "fd00:244:1::/64".parse().unwrap();
    cloud
        .create_route("k", "uid-a", &Route::new("node-a", v4))
        .await
        .unwrap();
    cloud
        .create_route("k", "uid-a", &Route::new("node-a", v6))
        .await
        .unwrap();
    let names: Vec<String> = cloud.routes("k").iter().map(|r| r.name.clone()).collect();
    assert_eq!(names.len(), 2);
    assert_ne!(
        names[0], names[1],
        "dual-stack routes with one hint get distinct names"
    );

    let err = cloud
        .create_route("k", "uid-a", &Route::new("node-a", v4))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    let err = cloud
        .create_route(
            "k",
            "uid-x",
            &Route::new("no-such-node", "10.244.9.0/24".parse().unwrap()),
        )
        .await
        .unwrap_err();
    assert!(err.is_instance_not_found(), "{err}");

    // Other clusters' routes are invisible.
    cloud.add_route(FakeRoute::new(
        "other",
        "h",
        "10.9.0.0/24".parse().unwrap(),
        "node-a",
    ));
    assert_eq!(cloud.list_routes("k").await.unwrap().len(), 2);

    // The target's instance goes away: its routes become blackholes.
    cloud.terminate_instance("i-a");
    let listed = cloud.list_routes("k").await.unwrap();
    assert!(listed.iter().all(|r| r.blackhole), "{listed:?}");

    for route in &listed {
        cloud.delete_route("k", route).await.unwrap();
    }
    assert!(cloud.list_routes("k").await.unwrap().is_empty());
    assert!(cloud.delete_route("k", &listed[0]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safe_under_concurrency() {
    let cloud = FakeCloud::builder()
        .instances((0..64).map(|i| FakeInstance::new(format!("i-{i}"), format!("n{i}"))))
        .build();
    let mut tasks = Vec::new();
    for i in 0..64u8 {
        let cloud = cloud.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("n{i}");
            let cidr = format!("10.100.{i}.0/24").parse().unwrap();
            cloud
                .create_route("k", &name, &Route::new(name.clone(), cidr))
                .await
                .unwrap();
            for _ in 0..10 {
                cloud
                    .instance_metadata(&node(&name))
                    .await
                    .unwrap()
                    .unwrap();
            }
            if i % 2 == 0 {
                cloud.stop_instance(&format!("i-{i}"));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(cloud.routes("k").len(), 64);
    assert_eq!(cloud.call_count(Method::InstanceMetadata), 640);
    assert_eq!(cloud.call_count(Method::CreateRoute), 64);
    let stopped = cloud
        .instances()
        .iter()
        .filter(|i| i.state == InstanceState::Stopped)
        .count();
    assert_eq!(stopped, 32);
}

#[test]
fn registered_as_fake_and_built_from_a_config_file() {
    let registry = Registry::global().unwrap();
    assert!(registry.contains("fake"), "{:?}", registry.names());
    let cloud = registry.create("fake", None).unwrap();
    assert_eq!(cloud.provider_name(), "fake");

    let config = CloudConfig::new(
        "/etc/fake.toml",
        "[[instances]]\nid = \"i-1\"\nname = \"node-1\"\ninternal_ips = [\"10.0.0.1\"]\n",
    );
    assert!(registry.create("fake", Some(&config)).is_ok());

    // A malformed config: the error names the provider, the path, the line and the column.
    let config = CloudConfig::new("/etc/fake.toml", "seed = 1\n[[instances]]\nid = 7\n");
    let err = registry
        .create("fake", Some(&config))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("\"fake\""), "{err}");
    assert!(err.contains("/etc/fake.toml:3:6"), "{err}");
}

/// A cloud-side quota: every method spends from one bucket; calls over it fail as
/// `Throttled` with the time until the next token, are counted, and stop once tokens return.
#[tokio::test(start_paused = true)]
async fn a_quota_throttles_calls_over_its_rate() {
    let cloud = three_instances();
    cloud.set_quota(Some((10.0, 2)));
    let v2 = cloud.instances_v2().expect("instances v2");
    let lb = cloud.load_balancer().expect("load balancer");
    let a = node("node-a");
    assert!(v2.instance_exists(&a).await.is_ok());
    assert!(
        lb.get_load_balancer("c", &service("u1", Some(30080)))
            .await
            .is_ok()
    );
    let err = v2.instance_exists(&a).await.expect_err("over the quota");
    assert_eq!(err.kind(), ErrorKind::Throttled, "{err}");
    let after = err
        .retry_after_delay()
        .expect("the cloud says when to retry");
    assert!(after <= Duration::from_millis(100), "{after:?}");
    assert_eq!(cloud.throttled_calls(), 1);
    tokio::time::sleep(after).await;
    assert!(v2.instance_exists(&a).await.is_ok());
    cloud.set_quota(None);
    for _ in 0..50 {
        assert!(v2.instance_exists(&a).await.is_ok(), "no quota, no refusal");
    }
    assert_eq!(cloud.throttled_calls(), 0);
}

/// A stand-in node on `ip`: its node port answers with `name`, its health-check port with
/// `health` (an HTTP status).
async fn stand_in_node(
    ip: std::net::IpAddr,
    node_port: u16,
    health_port: u16,
    name: &'static str,
    health: u16,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let traffic = tokio::net::TcpListener::bind((ip, node_port))
        .await
        .unwrap();
    let checks = tokio::net::TcpListener::bind((ip, health_port))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = traffic.accept().await {
            let _ = s.write_all(format!("{name}\n").as_bytes()).await;
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = checks.accept().await {
            let mut buf = [0u8; 512];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 {health} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
}

/// What a connection to `addr` reads until it closes, or `None` when it is refused or reset.
async fn read_from(addr: std::net::SocketAddr) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    (!out.is_empty()).then(|| out.trim().to_owned())
}

/// `serve_load_balancers`: the load balancer's loopback address listens on the Service's
/// port and splices each connection to a node's node port, in turn over the nodes; with a
/// health check (`externalTrafficPolicy: Local`, the path and port of
/// `cloud-provider/service/helpers` `GetServiceHealthCheckPathPort`) only to nodes whose
/// check answers 200; deleted, its address refuses connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_load_balancer_forwards_to_healthy_nodes_only() {
    let third = (std::process::id() % 250) as u8 + 1;
    let node_ip = |i: u8| std::net::IpAddr::from([127, 93, third, i]);
    let (node_port, health_port) = (31080, 31081);
    stand_in_node(node_ip(1), node_port, health_port, "node-1", 200).await;
    stand_in_node(node_ip(2), node_port, health_port, "node-2", 503).await;
    let nodes: Vec<Arc<Node>> = [1, 2]
        .map(|i| {
            let mut n = node(&format!("node-{i}"));
            n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
                addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                    type_: "InternalIP".into(),
                    address: node_ip(i).to_string(),
                }]),
                ..Default::default()
            });
            Arc::new(n)
        })
        .into();
    let cloud = FakeCloud::builder()
        .serve_load_balancers(std::net::Ipv4Addr::new(127, 94, third, 0))
        .build();
    let mut svc = service("uid-1", Some(i32::from(node_port)));
    let spec = svc.spec.as_mut().unwrap();
    spec.ports.as_mut().unwrap()[0].port = 8080;
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(i32::from(health_port));
    let status = cloud.ensure_load_balancer("c", &svc, &nodes).await.unwrap();
    let ip = first_ingress_ip(&status);
    assert!(ip.is_loopback(), "{ip}");
    let lb = std::net::SocketAddr::new(ip, 8080);
    for _ in 0..6 {
        assert_eq!(read_from(lb).await.as_deref(), Some("node-1"));
    }

    // Cluster policy: no health check, both nodes in turn.
    let spec = svc.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Cluster".into());
    spec.health_check_node_port = None;
    cloud.ensure_load_balancer("c", &svc, &nodes).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..4 {
        seen.insert(read_from(lb).await.unwrap());
    }
    assert_eq!(seen, ["node-1", "node-2"].map(String::from).into());

    cloud.ensure_load_balancer_deleted("c", &svc).await.unwrap();
    let mut refused = false;
    for _ in 0..50 {
        if tokio::net::TcpStream::connect(lb).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "{lb} still accepts connections");
}

/// A stand-in node at `ip` whose node port `port` echoes what it reads, for as long as the
/// connection lasts.
async fn echo_node(ip: std::net::IpAddr, port: u16) {
    let listener = tokio::net::TcpListener::bind((ip, port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
}

/// A Node at `ip`, as the service controller hands it to a load balancer.
fn node_at(name: &str, ip: std::net::IpAddr) -> Arc<Node> {
    let mut n = node(name);
    n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
        addresses: Some(vec![k8s_openapi::api::core::v1::NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        }]),
        ..Default::default()
    });
    Arc::new(n)
}

/// A cloud serving load balancers on `127.<net>.<pid>.1` onwards with `limits`, and the
/// address of the load balancer of a Service `uid` forwarding port 8080 to an echoing
/// node port on `127.<net + 1>.<pid>.1`.
async fn echo_load_balancer(
    net: u8,
    limits: cloud_provider_fake::LoadBalancerLimits,
) -> (FakeCloud, Service, std::net::SocketAddr) {
    let third = (std::process::id() % 250) as u8 + 1;
    let node_ip = std::net::IpAddr::from([127, net + 1, third, 1]);
    let node_port = 31090;
    echo_node(node_ip, node_port).await;
    let cloud = FakeCloud::builder()
        .serve_load_balancers(std::net::Ipv4Addr::new(127, net, third, 0))
        .load_balancer_limits(limits)
        .build();
    let (svc, lb) = echo_service(&cloud, "uid-1", node_port, node_ip).await;
    (cloud, svc, lb)
}

/// Ensures a load balancer for Service `uid` (port 8080 to `node_port` on the node at
/// `node_ip`); its address.
async fn echo_service(
    cloud: &FakeCloud,
    uid: &str,
    node_port: u16,
    node_ip: std::net::IpAddr,
) -> (Service, std::net::SocketAddr) {
    let mut svc = service(uid, Some(i32::from(node_port)));
    svc.metadata.name = Some(format!("web-{uid}"));
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8080;
    let status = cloud
        .ensure_load_balancer("c", &svc, &[node_at("node-1", node_ip)])
        .await
        .unwrap();
    let ip = first_ingress_ip(&status);
    (svc, std::net::SocketAddr::new(ip, 8080))
}

/// The IP of a load balancer's first ingress point.
fn first_ingress_ip(status: &k8s_openapi::api::core::v1::LoadBalancerStatus) -> std::net::IpAddr {
    let ingress = status.ingress.as_deref().unwrap_or_default();
    let ip = ingress.first().and_then(|i| i.ip.as_deref());
    ip.expect("an ingress IP").parse().unwrap()
}

/// Whether `s` carries a round trip through the load balancer and the echoing node.
async fn echoes(s: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let round_trip = async {
        s.write_all(b"ping").await.ok()?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.ok()?;
        (&buf == b"ping").then_some(())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), round_trip).await,
        Ok(Some(()))
    )
}

/// Whether `s` is closed (or reset) by the other side within `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(within, s.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Whether a new connection to `addr` is reset (at connect or right after it).
async fn reset(addr: std::net::SocketAddr) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Err(_) => true,
        Ok(mut s) => closed_within(&mut s, Duration::from_secs(5)).await,
    }
}

/// A new connection to `addr` that echoes, once one does (a slot may take a moment to be
/// given back).
async fn eventually_connected(addr: std::net::SocketAddr) -> Option<tokio::net::TcpStream> {
    for _ in 0..50 {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await
            && echoes(&mut s).await
        {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// A connection through a load balancer to its echoing node that echoes.
async fn connected(lb: std::net::SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(lb).await.unwrap();
    assert!(echoes(&mut s).await, "a connection through {lb} echoes");
    s
}

/// An AWS Classic or Application Load Balancer closes a connection on which no byte has
/// been sent or received for its idle timeout (60 s by default, `idle_timeout.timeout_seconds`;
/// 1 s here, on real sockets), while a connection with bytes flowing stays open however
/// long it lasts. The default is that 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_load_balancer_closes_idle_connections_and_keeps_active_ones() {
    use cloud_provider_fake::LoadBalancerLimits;
    assert_eq!(
        LoadBalancerLimits::default().idle_timeout(),
        Duration::from_secs(60)
    );
    let idle_timeout = Duration::from_secs(1);
    let limits = LoadBalancerLimits::new(idle_timeout, 16).unwrap();
    let (_cloud, _svc, lb) = echo_load_balancer(95, limits).await;
    let since = tokio::time::Instant::now();
    let mut idle = connected(lb).await;
    let mut active = connected(lb).await;
    // Bytes every 150 ms on `active` for 3 s: three idle timeouts.
    let keep_busy = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert!(
                echoes(&mut active).await,
                "the active connection stays open"
            );
        }
        active
    });
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "the idle connection is closed"
    );
    assert!(since.elapsed() >= idle_timeout, "{:?}", since.elapsed());
    let mut active = keep_busy.await.unwrap();
    assert!(echoes(&mut active).await);
    assert!(
        closed_within(&mut active, Duration::from_secs(5)).await,
        "idle in turn, it is closed too"
    );
}

/// A load balancer at its connection limit resets new connections and keeps carrying the
/// ones it has, as an AWS load balancer over its capacity does; a connection that ends gives
/// its slot to the next. The default limit is 1,024 per listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_at_its_connection_limit_resets_new_connections() {
    use cloud_provider_fake::LoadBalancerLimits;
    assert_eq!(LoadBalancerLimits::default().max_connections(), 1024);
    let limits = LoadBalancerLimits::new(Duration::from_secs(60), 2).unwrap();
    let (_cloud, _svc, lb) = echo_load_balancer(97, limits).await;
    let mut first = connected(lb).await;
    let mut second = connected(lb).await;
    for _ in 0..3 {
        assert!(reset(lb).await, "a third connection is reset");
    }
    assert!(echoes(&mut first).await && echoes(&mut second).await);
    drop(first);
    let next = eventually_connected(lb).await;
    assert!(next.is_some(), "the closed connection's slot is free again");
    assert!(echoes(&mut second).await);
}

/// The data path's share of the process's file descriptors (kube-proxy and a cloud's load
/// balancers hold none of the API server's): every load balancer draws on one budget, two
/// descriptors per connection, and once it is spent new connections are reset whatever
/// their listener; a connection that ends gives its descriptors back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancers_stop_taking_descriptors_when_their_budget_is_spent() {
    use cloud_provider_fake::LoadBalancerLimits;
    let budget = Arc::new(tokio::sync::Semaphore::new(4));
    let limits = LoadBalancerLimits::new(Duration::from_secs(60), 1024)
        .unwrap()
        .with_descriptors(budget.clone());
    let (cloud, _svc, lb) = echo_load_balancer(99, limits).await;
    let node_ip = std::net::IpAddr::from([127, 100, (std::process::id() % 250) as u8 + 1, 1]);
    let (_other_svc, other_lb) = echo_service(&cloud, "uid-2", 31090, node_ip).await;
    assert_ne!(lb, other_lb);
    let mut first = connected(lb).await;
    let mut second = connected(other_lb).await;
    assert_eq!(budget.available_permits(), 0, "two descriptors each");
    for addr in [lb, other_lb] {
        assert!(
            reset(addr).await,
            "{addr} resets a connection beyond the budget"
        );
    }
    assert_eq!(budget.available_permits(), 0);
    assert!(echoes(&mut first).await && echoes(&mut second).await);
    drop(first);
    let next = eventually_connected(other_lb).await;
    assert!(
        next.is_some(),
        "the ended connection's descriptors are free again"
    );
}
