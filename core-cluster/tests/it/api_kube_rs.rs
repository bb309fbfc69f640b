//! The API server through kube-rs, in-process (kube's `Client` takes the axum router directly,
//! no TCP), plus raw requests for what a typed client cannot send.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::{Router, body::Body};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{MemoryStore, Store, WatchConfig},
};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::{
    core::v1::{ConfigMap, Event, Namespace, Node, Pod, Service},
    events::v1::Event as NewEvent,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::{Value, json};
use tower::ServiceExt;

async fn server_with(store: Arc<dyn Store>) -> (Router, Client, Arc<dyn Store>) {
    let server = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let router = server.router();
    let client = Client::new(router.clone(), "default");
    (router, client, store)
}

async fn server() -> (Router, Client, Arc<dyn Store>) {
    server_with(Arc::new(MemoryStore::new())).await
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"zone": "a"}},
        "status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "ok"}
        ]}
    }))
    .unwrap()
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

/// A raw request through the router: (status, JSON body).
async fn raw(
    router: &Router,
    method: &str,
    uri: &str,
    content_type: &str,
    body: impl Into<Body>,
) -> (u16, Value) {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .body(body.into())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn api_code(err: kube::Error) -> u16 {
    match err {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_list_with_selectors_and_pages() {
    let (_, client, _) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..25 {
        let mut n = node(&format!("n{i:02}"));
        if i % 5 == 0 {
            n.labels_mut().insert("zone".into(), "b".into());
        }
        let created = nodes.create(&PostParams::default(), &n).await.unwrap();
        assert!(created.uid().is_some());
        assert!(created.creation_timestamp().is_some());
        assert!(created.resource_version().unwrap().parse::<u64>().unwrap() > 0);
    }
    assert_eq!(nodes.get("n07").await.unwrap().name_any(), "n07");
    assert_eq!(
        nodes
            .list(&ListParams::default().labels("zone=b"))
            .await
            .unwrap()
            .items
            .len(),
        5
    );
    assert_eq!(
        nodes
            .list(&ListParams::default().labels("zone!=b,zone"))
            .await
            .unwrap()
            .items
            .len(),
        20
    );
    assert_eq!(
        nodes
            .list(&ListParams::default().fields("metadata.name=n03"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Pagination: 10 + 10 + 5, every page at the first page's revision, even while writing.
    let first = nodes.list(&ListParams::default().limit(10)).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    nodes
        .create(&PostParams::default(), &node("zz-late"))
        .await
        .unwrap();
    let mut names: Vec<String> = first.items.iter().map(|n| n.name_any()).collect();
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = nodes
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()));
        names.extend(page.items.iter().map(|n| n.name_any()));
        token = page.metadata.continue_.clone();
    }
    assert_eq!(names.len(), 25, "the late node is not in the snapshot");
    assert!(!names.contains(&"zz-late".to_owned()));
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted);
}

#[tokio::test]
async fn resource_versions_come_from_one_monotonic_revision() {
    let (_, client, store) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let a: u64 = nodes
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    let b: u64 = cms
        .create(&PostParams::default(), &configmap("b"))
        .await
        .unwrap()
        .resource_version()
        .unwrap()
        .parse()
        .unwrap();
    assert!(b > a);
    assert_eq!(store.current_revision().await.unwrap(), b);
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_is_a_409_with_upstreams_message() {
    let (_, client, _) = server().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let created = cms
        .create(&PostParams::default(), &configmap("c"))
        .await
        .unwrap();
    let mut first = created.clone();
    first.data = Some(BTreeMap::from([("k".into(), "first".into())]));
    cms.replace("c", &PostParams::default(), &first)
        .await
        .unwrap();
    let mut stale = created.clone();
    stale.data = Some(BTreeMap::from([("k".into(), "stale".into())]));
    match cms
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
            assert_eq!(
                s.message,
                "Operation cannot be fulfilled on configmaps \"c\": the object has been modified; please apply your changes to the latest version and try again"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["k"], "first");
}

#[tokio::test]
async fn patches_merge_strategic_json_and_apply() {
    let (_, client, _) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();

    // Merge patch: labels, null deletes.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"zone": null, "tier": "web"}}})),
        )
        .await
        .unwrap();
    let n = nodes.get("n1").await.unwrap();
    assert_eq!(n.labels().get("tier").map(String::as_str), Some("web"));
    assert!(!n.labels().contains_key("zone"));

    // Strategic merge on status: conditions merge by type, the other condition stays.
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."}]}});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .unwrap();
    let conditions = nodes
        .get("n1")
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions
        .unwrap();
    assert_eq!(conditions.len(), 2);
    let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_deref()),
        ("Unknown", Some("NodeStatusUnknown"))
    );

    // Strategic merge on spec.taints replaces the whole list (taints have no merge key).
    let taint = |k: &str| json!({"key": k, "effect": "NoSchedule"});
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": [taint("a"), taint("b")]}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"taints": [taint("c")]}})),
        )
        .await
        .unwrap();
    let taints = nodes.get("n1").await.unwrap().spec.unwrap().taints.unwrap();
    assert_eq!(
        taints.iter().map(|t| t.key.as_str()).collect::<Vec<_>>(),
        ["c"]
    );

    // JSON patch with a failing test changes nothing (422).
    let failing: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/tier", "value": "db"},
        {"op": "replace", "path": "/metadata/labels/tier", "value": "x"}
    ]))
    .unwrap();
    assert_eq!(
        api_code(
            nodes
                .patch("n1", &PatchParams::default(), &Patch::<()>::Json(failing))
                .await
                .unwrap_err()
        ),
        422
    );

    // Server-side apply: creates, records the manager, and conflicts with another owner.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"owner": "alice"}});
    let created = cms
        .patch("ssa", &PatchParams::apply("alice"), &Patch::Apply(&applied))
        .await
        .unwrap();
    assert!(
        created
            .metadata
            .managed_fields
            .unwrap()
            .iter()
            .any(|m| m.manager.as_deref() == Some("alice"))
    );
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"owner": "bob"}});
    match cms
        .patch("ssa", &PatchParams::apply("bob"), &Patch::Apply(&other))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.contains("conflict with \"alice\""),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    let forced = cms
        .patch(
            "ssa",
            &PatchParams::apply("bob").force(),
            &Patch::Apply(&other),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.unwrap()["owner"], "bob");
}

#[tokio::test]
async fn status_subresource_and_main_resource_ignore_each_other() {
    let (_, client, _) = server().await;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    let mut n = nodes.get("n1").await.unwrap();
    n.spec.get_or_insert_default().unschedulable = Some(true);
    n.status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .clear();
    // PUT on the main resource: spec changes, status does not.
    let after_main = nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert_eq!(after_main.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(
        after_main
            .status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .len(),
        2
    );
    // PUT on /status: status changes, spec does not.
    let mut s = after_main.clone();
    s.spec.as_mut().unwrap().unschedulable = Some(false);
    s.status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .truncate(1);
    // Upstream's node and service status strategies keep the spec but take the metadata
    // (the service controller's finalizer travels this way).
    s.metadata
        .labels
        .get_or_insert_default()
        .insert("via-status".into(), "yes".into());
    let after_status = nodes
        .replace_status("n1", &PostParams::default(), &s)
        .await
        .unwrap();
    assert_eq!(
        after_status.spec.as_ref().unwrap().unschedulable,
        Some(true)
    );
    assert_eq!(
        after_status.metadata.labels.as_ref().unwrap()["via-status"],
        "yes"
    );
    assert_eq!(after_status.status.unwrap().conditions.unwrap().len(), 1);
}

#[tokio::test]
async fn delete_with_finalizers_waits_for_them() {
    let (_, client, _) = server().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut cm = configmap("held");
    cm.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let deleting = cms.delete("held", &DeleteParams::default()).await.unwrap();
    let obj = deleting
        .left()
        .expect("an object being deleted comes back, not a Status");
    assert!(obj.metadata.deletion_timestamp.is_some());
    // No new finalizers may be added while deleting (422).
    let add = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}});
    assert_eq!(
        api_code(
            cms.patch("held", &PatchParams::default(), &Patch::Merge(add))
                .await
                .unwrap_err()
        ),
        422
    );
    // kube-runtime's finalizer removal: a JSON patch with a test.
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/hold"},
        {"op": "remove", "path": "/metadata/finalizers/0"}
    ]))
    .unwrap();
    cms.patch("held", &PatchParams::default(), &Patch::<()>::Json(remove))
        .await
        .unwrap();
    assert_eq!(api_code(cms.get("held").await.unwrap_err()), 404);

    // Without finalizers DELETE answers a Status; preconditions are checked.
    cms.create(&PostParams::default(), &configmap("plain"))
        .await
        .unwrap();
    let bad_uid = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        api_code(cms.delete("plain", &bad_uid).await.unwrap_err()),
        409
    );
    let status = cms
        .delete("plain", &DeleteParams::default())
        .await
        .unwrap()
        .right()
        .unwrap();
    assert_eq!(
        status.status,
        Some(kube::core::response::StatusSummary::Success)
    );
}

#[tokio::test]
async fn foreground_and_orphan_deletion_add_their_finalizers() {
    let (_, client, _) = server().await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &configmap("fg"))
        .await
        .unwrap();
    let obj = cms
        .delete("fg", &DeleteParams::foreground())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(obj.finalizers(), ["foregroundDeletion"]);
    cms.create(&PostParams::default(), &configmap("or"))
        .await
        .unwrap();
    let obj = cms
        .delete("or", &DeleteParams::orphan())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(obj.finalizers(), ["orphan"]);
}

#[tokio::test]
async fn watcher_and_reflector_follow_changes() {
    let (_, client, _) = server().await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("before"))
        .await
        .unwrap();
    let (reader, writer) = reflector::store();
    let stream =
        reflector(writer, watcher(nodes.clone(), watcher::Config::default())).applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.try_next().await.unwrap().is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.len(), 1);
    nodes
        .create(&PostParams::default(), &node("after"))
        .await
        .unwrap();
    nodes
        .patch(
            "before",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"seen": "yes"}}})),
        )
        .await
        .unwrap();
    nodes
        .delete("after", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let before = reader.get(&kube::runtime::reflector::ObjectRef::new("before"));
        if reader.len() == 1 && before.is_some_and(|n| n.labels().get("seen").is_some()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "reflector did not converge: {:?}",
            reader.state()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();

    // Streaming lists (sendInitialEvents) are supported too.
    let mut initial = watcher(nodes, watcher::Config::default().streaming_lists()).boxed();
    let mut names = Vec::new();
    while let Some(event) = initial.try_next().await.unwrap() {
        match event {
            watcher::Event::InitApply(n) => names.push(n.name_any()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(names, ["before"]);
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_a_410_error_event() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_watch_config(WatchConfig {
        window_capacity: 4,
        watcher_buffer: 16,
        ..WatchConfig::default()
    }));
    let (_, client, _) = server_with(store).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    for i in 0..10 {
        cms.create(&PostParams::default(), &configmap(&format!("c{i}")))
            .await
            .unwrap();
    }
    let mut stream = cms
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // Live events after a list's resource version.
    let list = cms.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &configmap("live"))
        .await
        .unwrap();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Added(cm)) => assert_eq!(cm.name_any(), "live"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn events_written_as_events_k8s_io_read_as_core_events() {
    let (_, client, _) = server().await;
    let new_events: Api<NewEvent> = Api::namespaced(client.clone(), "default");
    let event: NewEvent = serde_json::from_value(json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "n1.synced"},
        "eventTime": "2026-11-22T01:02:03.000000Z",
        "reason": "Synced", "note": "Node synced successfully", "type": "Normal", "action": "Sync",
        "reportingController": "cloud-node-controller", "reportingInstance": "ccm-0",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u1"}
    }))
    .unwrap();
    new_events
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
    let core: Api<Event> = Api::all(client);
    let found = core
        .list(
            &ListParams::default().fields(
                "involvedObject.name=n1,involvedObject.kind=Node,involvedObject.namespace=",
            ),
        )
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    let e = &found.items[0];
    assert_eq!(e.message.as_deref(), Some("Node synced successfully"));
    assert_eq!(
        e.reporting_component.as_deref(),
        Some("cloud-node-controller")
    );
    // Upstream's conversion only renames: `deprecatedCount` unset is `count` 0, which Go
    // omits (`pkg/apis/events/v1/conversion.go`; no default of 1 anywhere).
    assert_eq!(e.count, None);
}

#[tokio::test]
async fn services_get_cluster_ips_and_node_ports_never_two_alike() {
    let (_, client, _) = server().await;
    let svcs: Api<Service> = Api::namespaced(client, "default");
    let lb = |name: &str| -> Service {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": name},
                     "ports": [{"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}]}})).unwrap()
    };
    let mut ports = Vec::new();
    let mut ips = Vec::new();
    for name in ["a", "b", "c"] {
        let s = svcs
            .create(&PostParams::default(), &lb(name))
            .await
            .unwrap();
        let spec = s.spec.unwrap();
        let ip: std::net::IpAddr = spec.cluster_ip.clone().unwrap().parse().unwrap();
        assert!(
            "10.96.0.0/12"
                .parse::<ipnet::IpNet>()
                .unwrap()
                .contains(&ip)
        );
        ips.push(ip);
        for p in spec.ports.unwrap() {
            let np = p.node_port.unwrap();
            assert!((30000..=32767).contains(&np));
            assert_eq!(
                p.target_port,
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p.port)),
                "targetPort defaults to port"
            );
            ports.push(np);
        }
        ports.push(
            spec.health_check_node_port
                .expect("ETP Local gets a health-check port"),
        );
    }
    let mut unique = ports.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ports.len(), "node ports collide: {ports:?}");
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3);
    // A taken node port is refused with a field error; released on delete, it can be had.
    let taken = ports[0];
    let mut clash = lb("d");
    clash.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(taken);
    match svcs
        .create(&PostParams::default(), &clash)
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert!(
                s.message.contains("provided port is already allocated"),
                "{}",
                s.message
            );
        }
        other => panic!("{other:?}"),
    }
    svcs.delete("a", &DeleteParams::default()).await.unwrap();
    svcs.create(&PostParams::default(), &clash).await.unwrap();
}

#[tokio::test]
async fn generate_name_and_namespace_rules() {
    let (_, client, _) = server().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut cm = configmap("");
    cm.metadata.name = None;
    cm.metadata.generate_name = Some("gen-".into());
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    assert!(created.name_any().starts_with("gen-") && created.name_any().len() == 9);
    // A namespace that does not exist: 404 on the namespace.
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    match elsewhere
        .create(&PostParams::default(), &configmap("x"))
        .await
        .unwrap_err()
    {
        kube::Error::Api(s) => assert_eq!(
            (s.code, s.message.as_str()),
            (404, "namespaces \"nowhere\" not found")
        ),
        other => panic!("{other:?}"),
    }
    // Deleting a namespace deletes what is in it, then the namespace.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scratch"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let scratch: Api<ConfigMap> = Api::namespaced(client.clone(), "scratch");
    scratch
        .create(&PostParams::default(), &configmap("inside"))
        .await
        .unwrap();
    namespaces
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while namespaces.get_opt("scratch").await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "namespace was not finalized"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(scratch.get_opt("inside").await.unwrap().is_none());
    assert_eq!(
        api_code(
            namespaces
                .delete("kube-system", &DeleteParams::default())
                .await
                .unwrap_err()
        ),
        403
    );
}

#[tokio::test]
async fn pods_get_default_tolerations_bind_and_select_by_node() {
    let (_, client, _) = server().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.25"}]}}),
    )
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let tolerations = created.spec.unwrap().tolerations.unwrap();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let t = tolerations
            .iter()
            .find(|t| t.key.as_deref() == Some(key))
            .unwrap();
        assert_eq!(
            (t.effect.as_deref(), t.toleration_seconds),
            (Some("NoExecute"), Some(300))
        );
    }
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    pods.create_subresource::<Value, Value>("binding", "p", &PostParams::default(), &binding)
        .await
        .unwrap();
    let all: Api<Pod> = Api::all(client);
    assert_eq!(
        all.list(&ListParams::default().fields("spec.nodeName=n1"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        all.list(&ListParams::default().fields("spec.nodeName=n2"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
    // Bound to a node, the pod is deleted gracefully: it stays, marked, until its kubelet ends it.
    let deleting = pods
        .delete("p", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(deleting.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_none());
}

#[tokio::test]
async fn bad_input_gets_the_right_status_and_changes_nothing() {
    let (router, client, store) = server().await;
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node("keep"))
        .await
        .unwrap();
    let before = store.current_revision().await.unwrap();
    let cases: Vec<(&str, &str, &str, Body, u16, &str)> = vec![
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            Body::from("{not json"),
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            Body::from(r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"x"}}"#),
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            Body::from(r#"{"apiVersion":"apps/v1","kind":"Node","metadata":{"name":"x"}}"#),
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            Body::from(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"Upper"}}"#),
            422,
            "Invalid",
        ),
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            Body::from(format!(
                r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{}"}}}}"#,
                "a".repeat(254)
            )),
            422,
            "Invalid",
        ),
        (
            "POST",
            "/api/v1/nodes?fieldValidation=Strict",
            "application/json",
            Body::from(
                r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"x"},"spec":{"bogus":1}}"#,
            ),
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/api/v1/nodes",
            "application/json",
            Body::from(vec![b' '; 10 * 1024 * 1024]),
            413,
            "RequestEntityTooLarge",
        ),
        (
            "GET",
            "/api/v1/widgets",
            "application/json",
            Body::empty(),
            404,
            "NotFound",
        ),
        (
            "PATCH",
            "/api/v1/nodes/keep",
            "application/xml-patch",
            Body::from("<x/>"),
            415,
            "UnsupportedMediaType",
        ),
        (
            "PATCH",
            "/api/v1/nodes/keep",
            "application/merge-patch+json",
            Body::from("[1,"),
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/nodes?labelSelector=a%3D%3Db%3Dc",
            "application/json",
            Body::empty(),
            400,
            "BadRequest",
        ),
        (
            "GET",
            "/api/v1/nodes?fieldSelector=spec.bogus%3D1",
            "application/json",
            Body::empty(),
            400,
            "BadRequest",
        ),
        (
            "PUT",
            "/api/v1/nodes/keep",
            "application/json",
            Body::from(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"other"}}"#),
            400,
            "BadRequest",
        ),
        (
            "DELETE",
            "/api/v1/nodes/missing",
            "application/json",
            Body::empty(),
            404,
            "NotFound",
        ),
    ];
    for (method, uri, ct, body, code, reason) in cases {
        let (got, status) = raw(&router, method, uri, ct, body).await;
        assert_eq!(got, code, "{method} {uri}: {status}");
        assert_eq!(status["kind"], "Status", "{method} {uri}");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], reason, "{method} {uri}: {status}");
        assert_eq!(status["code"], code);
    }
    // The invalid-name answer names the field, as upstream.
    let (_, status) = raw(
        &router,
        "POST",
        "/api/v1/nodes",
        "application/json",
        Body::from(r#"{"apiVersion":"v1","kind":"Node","metadata":{"name":"Upper"}}"#),
    )
    .await;
    assert_eq!(status["details"]["causes"][0]["field"], "metadata.name");
    assert!(status["message"].as_str().unwrap().starts_with("Node \"Upper\" is invalid: metadata.name: Invalid value: \"Upper\": a lowercase RFC 1123 subdomain"));
    // Nothing was written, and the server still serves.
    assert_eq!(store.current_revision().await.unwrap(), before);
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}

#[tokio::test]
async fn discovery_tables_and_metrics() {
    let (router, client, _) = server().await;
    let discovery = kube::Discovery::new(client.clone())
        .run_aggregated()
        .await
        .unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_owned()).collect();
    for want in [
        "",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
    ] {
        assert!(
            groups.iter().any(|g| g == want),
            "{want:?} not in {groups:?}"
        );
    }
    let nodes: Api<Node> = Api::all(client);
    nodes
        .create(&PostParams::default(), &node("t1"))
        .await
        .unwrap();
    let request = axum::http::Request::builder()
        .uri("/api/v1/nodes")
        .header(
            "accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    // kube-apiserver writes the serializer's media type, without the `as=` asked for: the
    // body says it is a Table.
    assert_eq!(response.headers()["content-type"], "application/json");
    let table: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 0)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Status", "Roles", "Age", "Version"]);
    assert_eq!(table["rows"][0]["cells"][1], "Ready");
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");

    let request = axum::http::Request::builder()
        .uri("/metrics")
        .body(Body::empty())
        .unwrap();
    let text = String::from_utf8(
        router
            .oneshot(request)
            .await
            .unwrap()
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains("apiserver_request_total{verb=\"POST\",resource=\"nodes\",code=\"201\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("apiserver_storage_objects{resource=\"nodes\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("apiserver_request_duration_seconds_bucket"),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_compactor_keeps_one_interval_of_history() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let server = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    server.spawn_compactor(Duration::from_secs(300), shutdown.clone());
    let client = Client::new(server.router(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &configmap("old"))
        .await
        .unwrap();
    let early = store.current_revision().await.unwrap();
    tokio::time::sleep(Duration::from_secs(301)).await;
    cms.create(&PostParams::default(), &configmap("new"))
        .await
        .unwrap();
    // One interval later the history up to the first tick is compacted.
    tokio::time::sleep(Duration::from_secs(300)).await;
    let err = store
        .list("/registry/core/configmaps/", None, None, Some(early - 1))
        .await
        .unwrap_err();
    assert!(
        matches!(err, core_cluster::store::StoreError::Expired { .. }),
        "{err:?}"
    );
    // Current data is untouched.
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    shutdown.cancel();
}

#[tokio::test(start_paused = true)]
async fn bookmarks_carry_only_the_resource_version_of_what_was_sent() {
    let config = ApiServerConfig {
        bookmark_interval: Duration::from_secs(5),
        ..ApiServerConfig::default()
    };
    let server = ApiServer::new(Arc::new(MemoryStore::new()), config)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(Client::new(server.router(), "default"), "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = cms
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    let created = cms
        .create(&PostParams::default(), &configmap("b1"))
        .await
        .unwrap();
    assert!(matches!(
        stream.try_next().await.unwrap(),
        Some(WatchEvent::Added(_))
    ));
    tokio::time::sleep(Duration::from_secs(6)).await;
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Bookmark(b)) => {
            assert_eq!(
                b.metadata.resource_version,
                created.resource_version().unwrap()
            );
            assert_eq!(b.types.kind, "ConfigMap");
        }
        other => panic!("expected a bookmark, got {other:?}"),
    }
    // The watch ends at its timeout, so clients re-watch.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let rest: Vec<_> = stream.collect().await;
    assert!(
        rest.iter()
            .all(|e| matches!(e, Ok(WatchEvent::Bookmark(_)))),
        "{rest:?}"
    );
}
