//! Service ClusterIPs and NodePorts allocated in the store, as kube-apiserver allocates them:
//! RangeAllocation bitmaps at `/registry/ranges/serviceips` and `servicenodeports` changed
//! under compare-and-swap (`pkg/registry/core/service/allocator/storage/storage.go`), so API
//! servers sharing one store never hand out one IP or port twice, and the repair loops
//! (`ipallocator/controller/repair.go`, `portallocator/controller/repair.go`) that fix what
//! a crash leaves behind.

use std::{collections::HashSet, sync::Arc, time::Duration};

use bytes::Bytes;
use ccm_testkit::etcd::Etcd;
use core_cluster::{
    ApiServer, ApiServerConfig,
    registry::allocator::{Item, RangeId, RangeSnapshot, ServiceAllocator},
    store::{EtcdOptions, EtcdStore, MemoryStore, SqliteOptions, SqliteStore, Store},
};
use futures::future::join_all;
use k8s_openapi::api::core::v1::Service;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};

fn node_port_service(name: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name},
        "spec": {"type": "NodePort", "selector": {"app": name},
                 "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap()
}

/// What the stored ranges mark, read back with the default configuration's ranges.
async fn stored_items(store: &dyn Store) -> HashSet<Item> {
    let config = ApiServerConfig::default();
    let mut allocator = ServiceAllocator::new(
        config.service_cluster_ip_ranges.clone(),
        config.service_node_port_range.clone(),
    );
    for id in [RangeId::Ips(0), RangeId::Ports] {
        let kv = store
            .get(&format!("/registry/ranges/{}", id.name()))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("the {} range is stored", id.name()));
        let snapshot = RangeSnapshot::from_json(&kv.value).unwrap();
        assert!(allocator.restore(id, &snapshot), "{snapshot:?}");
    }
    allocator.items()
}

/// Creates `count` NodePort Services at once, spread round-robin over `clients`, and
/// returns every ClusterIP and NodePort handed out (asserting each create succeeded).
async fn create_concurrently(clients: &[Client], count: usize) -> (Vec<String>, Vec<i32>) {
    let creates = (0..count).map(|i| {
        let api: Api<Service> = Api::namespaced(clients[i % clients.len()].clone(), "default");
        async move {
            api.create(
                &PostParams::default(),
                &node_port_service(&format!("svc-{i}")),
            )
            .await
            .unwrap_or_else(|e| panic!("svc-{i}: {e}"))
        }
    });
    let created = join_all(creates).await;
    let ips = created
        .iter()
        .map(|s| s.spec.as_ref().unwrap().cluster_ip.clone().unwrap())
        .collect();
    let ports = created
        .iter()
        .map(|s| {
            s.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
                .node_port
                .unwrap()
        })
        .collect();
    (ips, ports)
}

fn assert_distinct<T: std::hash::Hash + Eq + std::fmt::Debug>(what: &str, values: &[T]) {
    let unique: HashSet<&T> = values.iter().collect();
    assert_eq!(
        unique.len(),
        values.len(),
        "{what} handed out twice: {values:?}"
    );
}

async fn etcd_store(etcd: &Etcd) -> Arc<dyn Store> {
    Arc::new(
        EtcdStore::connect(EtcdOptions {
            endpoints: etcd.endpoints(),
            ..EtcdOptions::default()
        })
        .await
        .expect("etcd"),
    )
}

/// Two API servers on one etcd (upstream's HA control plane): 200 Services created at once,
/// half through each, get 200 distinct ClusterIPs and 200 distinct NodePorts, the stored
/// ranges mark exactly those (and the `kubernetes` Service's IP), and deleting the Services,
/// again through both servers, releases them in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_on_two_api_servers_on_one_etcd_get_distinct_ips_and_node_ports() {
    let etcd = Etcd::start().await;
    let store_a = etcd_store(&etcd).await;
    let a = ApiServer::new(store_a.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let b = ApiServer::new(etcd_store(&etcd).await, ApiServerConfig::default())
        .await
        .unwrap();
    let clients = [
        Client::new(a.router(), "default"),
        Client::new(b.router(), "default"),
    ];
    let (ips, ports) = create_concurrently(&clients, 200).await;
    assert_distinct("ClusterIPs", &ips);
    assert_distinct("NodePorts", &ports);
    let kubernetes_ip = "10.96.0.1";
    assert!(!ips.iter().any(|ip| ip == kubernetes_ip), "{ips:?}");

    let mut expected: HashSet<Item> = ips
        .iter()
        .map(|ip| Item::Ip(ip.parse().unwrap()))
        .chain(ports.iter().map(|p| Item::Port(*p as u16)))
        .collect();
    expected.insert(Item::Ip(kubernetes_ip.parse().unwrap()));
    assert_eq!(stored_items(&*store_a).await, expected);

    let deletes = (0..200).map(|i| {
        let api: Api<Service> = Api::namespaced(clients[i % 2].clone(), "default");
        async move {
            api.delete(&format!("svc-{i}"), &DeleteParams::default())
                .await
                .unwrap()
        }
    });
    join_all(deletes).await;
    assert_eq!(
        stored_items(&*store_a).await,
        HashSet::from([Item::Ip(kubernetes_ip.parse().unwrap())]),
        "every deleted Service's IP and port is released"
    );
}

/// The same on one API server over SQLite: concurrent creates never share an IP or port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_on_one_sqlite_api_server_get_distinct_ips_and_node_ports() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap(),
    );
    let server = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let (ips, ports) = create_concurrently(&[Client::new(server.router(), "default")], 200).await;
    assert_distinct("ClusterIPs", &ips);
    assert_distinct("NodePorts", &ports);
    assert_eq!(stored_items(&*store).await.len(), 200 + 200 + 1);
}

/// What a crash leaves behind, repaired as upstream's repair loops do (`repair.go`
/// `runOnce`): a Service whose IP its range lost is marked again when the server starts, so
/// the IP is not handed out twice; an IP allocated for a Service never written (the process
/// died in between) is released after three repair passes (`numRepairsBeforeLeakCleanup`),
/// not before.
#[tokio::test(start_paused = true)]
async fn the_repair_marks_what_services_hold_and_releases_leaks_after_three_passes() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let first = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(Client::new(first.router(), "default"), "default");
    let held = services
        .create(&PostParams::default(), &node_port_service("held"))
        .await
        .unwrap();
    let held_ip: std::net::IpAddr = held.spec.unwrap().cluster_ip.unwrap().parse().unwrap();
    drop(first);

    // The crash: the range lost `held`'s IP, and holds one no Service has.
    let leaked: std::net::IpAddr = "10.96.3.3".parse().unwrap();
    let key = "/registry/ranges/serviceips";
    let kv = store.get(key).await.unwrap().unwrap();
    let config = ApiServerConfig::default();
    let mut allocator = ServiceAllocator::new(
        config.service_cluster_ip_ranges.clone(),
        config.service_node_port_range.clone(),
    );
    allocator.restore(
        RangeId::Ips(0),
        &RangeSnapshot::from_json(&kv.value).unwrap(),
    );
    allocator.unmark(Item::Ip(held_ip));
    allocator.mark(Item::Ip(leaked));
    let bytes = allocator.snapshot(RangeId::Ips(0)).to_json().to_string();
    store
        .update(key, Bytes::from(bytes), Some(kv.mod_revision))
        .await
        .unwrap();

    let restarted = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let items = stored_items(&*store).await;
    assert!(
        items.contains(&Item::Ip(held_ip)),
        "the held IP is marked again at startup"
    );
    assert!(
        items.contains(&Item::Ip(leaked)),
        "a leak is kept for a grace period"
    );
    let services: Api<Service> =
        Api::namespaced(Client::new(restarted.router(), "default"), "default");
    let mut chosen = node_port_service("clash");
    chosen.spec.as_mut().unwrap().cluster_ip = Some(held_ip.to_string());
    match services.create(&PostParams::default(), &chosen).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(status.message.contains("already allocated"), "{status:?}");
        }
        other => panic!("the held IP must not be handed out again: {other:?}"),
    }

    let shutdown = tokio_util::sync::CancellationToken::new();
    restarted.spawn_service_repair(Duration::from_secs(180), shutdown.clone());
    // The startup pass was the first; the second, 180 s on, still keeps the leak.
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert!(stored_items(&*store).await.contains(&Item::Ip(leaked)));
    ccm_testkit::eventually(400, "the third pass releases the leak", || async {
        (!stored_items(&*store).await.contains(&Item::Ip(leaked))).then_some(())
    })
    .await;
    assert!(stored_items(&*store).await.contains(&Item::Ip(held_ip)));
    shutdown.cancel();
}

/// `repair.go` (`ipallocator/controller` and `portallocator/controller`) records what it
/// finds wrong as Warning Events on the Service: a ClusterIP and a NodePort held by two
/// Services (as a store written without the allocator could leave them) give the second
/// holder `ClusterIPAlreadyAllocated` and `PortAlreadyAllocated`, from the
/// `ipallocator-repair-controller` and `portallocator-repair-controller`; the first holder
/// gets none.
#[tokio::test]
async fn the_repair_records_a_clusterip_and_a_node_port_held_twice_as_warning_events() {
    use k8s_openapi::api::core::v1::Event;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let first = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(Client::new(first.router(), "default"), "default");
    let a = services
        .create(&PostParams::default(), &node_port_service("a"))
        .await
        .unwrap();
    services
        .create(&PostParams::default(), &node_port_service("b"))
        .await
        .unwrap();
    drop(first);
    // `b` rewritten in the store to hold `a`'s ClusterIP and NodePort.
    let a_spec = a.spec.unwrap();
    let (a_ip, a_port) = (
        a_spec.cluster_ip.clone().unwrap(),
        a_spec.ports.unwrap()[0].node_port.unwrap(),
    );
    let key = "/registry/core/services/default/b";
    let kv = store.get(key).await.unwrap().expect("b is stored");
    let mut b: serde_json::Value = serde_json::from_slice(&kv.value).unwrap();
    b["spec"]["clusterIP"] = serde_json::json!(a_ip);
    b["spec"]["clusterIPs"] = serde_json::json!([a_ip]);
    b["spec"]["ports"][0]["nodePort"] = serde_json::json!(a_port);
    store
        .update(key, Bytes::from(b.to_string()), Some(kv.mod_revision))
        .await
        .unwrap();

    // The restarted server's repair pass (upstream runs one before serving).
    let restarted = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(Client::new(restarted.router(), "default"), "default");
    let listed = events.list(&Default::default()).await.unwrap().items;
    let warnings: HashSet<(String, String, String, String)> = listed
        .iter()
        .map(|e| {
            (
                e.involved_object.name.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
                e.type_.clone().unwrap_or_default(),
                e.source
                    .as_ref()
                    .and_then(|s| s.component.clone())
                    .unwrap_or_default(),
            )
        })
        .collect();
    let expected: HashSet<(String, String, String, String)> = [
        (
            "b",
            "ClusterIPAlreadyAllocated",
            "Warning",
            "ipallocator-repair-controller",
        ),
        (
            "b",
            "PortAlreadyAllocated",
            "Warning",
            "portallocator-repair-controller",
        ),
    ]
    .into_iter()
    .map(|(a, b, c, d)| (a.into(), b.into(), c.into(), d.into()))
    .collect();
    assert_eq!(warnings, expected, "{listed:#?}");
    let ip_event = listed
        .iter()
        .find(|e| e.reason.as_deref() == Some("ClusterIPAlreadyAllocated"))
        .unwrap();
    assert_eq!(
        ip_event.message.as_deref(),
        Some(
            format!("Cluster IP [IPv4]:{a_ip} was assigned to multiple services; please recreate service")
                .as_str()
        )
    );
}
