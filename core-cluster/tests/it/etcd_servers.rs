//! Several API servers on one etcd keep what they cache in step with writes made through
//! another: kube-apiserver's authorizers are fed by informers over its watch cache
//! (`plugin/pkg/auth/authorizer/rbac/rbac.go` on the RBAC listers), so a Role written through
//! one server of an HA control plane is enforced by every server; the custom resources a
//! server serves follow the definitions' informer
//! (`apiextensions-apiserver/pkg/apiserver/customresource_discovery_controller.go`), and a
//! namespace's deletion is finished by the namespace controller whichever server took it
//! (`pkg/controller/namespace/namespace_controller.go`).

use std::sync::Arc;

use ccm_testkit::etcd::Etcd;
use core_cluster::{
    ApiServer, ApiServerConfig,
    auth::UserInfo,
    store::{EtcdOptions, EtcdStore, Store},
};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace},
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        PostParams,
    },
};
use serde_json::json;

async fn etcd_server(etcd: &Etcd) -> ApiServer {
    etcd_server_with(etcd.endpoints(), ApiServerConfig::default()).await
}

async fn etcd_server_with(endpoints: Vec<String>, config: ApiServerConfig) -> ApiServer {
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(EtcdOptions {
            endpoints,
            ..EtcdOptions::default()
        })
        .await
        .expect("etcd"),
    );
    ApiServer::new(store, config).await.unwrap()
}

/// Whether the client's user may list ConfigMaps in `default`: allowed, or forbidden (403).
async fn may_list(client: &Client) -> bool {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    match api.list(&ListParams::default()).await {
        Ok(_) => true,
        Err(kube::Error::Api(status)) if status.code == 403 => false,
        Err(e) => panic!("neither allowed nor forbidden: {e}"),
    }
}

/// RBAC follows writes made through another server (`rbac.go`'s listers on the shared
/// store): a Role and RoleBinding created through server A let alice list ConfigMaps through
/// server B, and deleting the binding through A takes that away on B again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_written_through_one_api_server_is_enforced_by_another() {
    let etcd = Etcd::start().await;
    let a = etcd_server(&etcd).await;
    let b = etcd_server(&etcd).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    b.spawn_store_follower(shutdown.clone());
    let alice_on_b = Client::new(b.router_as(UserInfo::new("alice", ["dev"])), "default");
    assert!(!may_list(&alice_on_b).await, "alice starts with no grant");

    let admin_a = Client::new(a.router(), "default");
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "cm-reader", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "alice-reads", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin_a.clone(), "default")
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let bindings = Api::<RoleBinding>::namespaced(admin_a.clone(), "default");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    ccm_testkit::eventually(20, "B enforces the Role written through A", || async {
        may_list(&alice_on_b).await.then_some(())
    })
    .await;

    bindings
        .delete("alice-reads", &DeleteParams::default())
        .await
        .unwrap();
    ccm_testkit::eventually(20, "B drops the binding deleted through A", || async {
        (!may_list(&alice_on_b).await).then_some(())
    })
    .await;
    shutdown.cancel();
}

fn gadget_crd() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {"type": "object", "properties": {
                        "size": {"type": "integer"},
                    }}},
                }},
            }],
        },
    }))
    .unwrap()
}

fn api_of(gvk: (&str, &str, &str), plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(gvk.0, gvk.1, gvk.2), plural)
}

/// What a GET of `path` through `router` answers: its status and body.
async fn get(router: &axum::Router, path: &str) -> (u16, serde_json::Value) {
    use tower::ServiceExt as _;
    let response = router
        .clone()
        .oneshot(
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or_default())
}

/// `customresource_discovery_controller.go` and the CRD handler follow the definitions'
/// informer in every kube-apiserver: a definition created through server A is served by
/// server B (its discovery, the create and list of its objects, its OpenAPI v3 document,
/// its Local APIService), and once it is deleted through A, B serves it no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_created_through_one_api_server_is_served_by_another_until_deleted() {
    let etcd = Etcd::start().await;
    let a = etcd_server(&etcd).await;
    let b = etcd_server(&etcd).await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    b.spawn_store_follower(shutdown.clone());
    let (admin_a, admin_b) = (
        Client::new(a.router(), "default"),
        Client::new(b.router(), "default"),
    );
    let definitions = api_of(
        ("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
        "customresourcedefinitions",
    );
    let crds_a: Api<DynamicObject> = Api::all_with(admin_a.clone(), &definitions);
    crds_a
        .create(&PostParams::default(), &gadget_crd())
        .await
        .unwrap();

    let router_b = b.router();
    ccm_testkit::eventually(30, "B discovers example.com/v1 gadgets", || async {
        let (status, body) = get(&router_b, "/apis/example.com/v1").await;
        (status == 200
            && body["resources"]
                .as_array()?
                .iter()
                .any(|r| r["name"] == "gadgets"))
        .then_some(())
    })
    .await;
    let gadgets = api_of(("example.com", "v1", "Gadget"), "gadgets");
    let gadgets_b: Api<DynamicObject> = Api::namespaced_with(admin_b.clone(), "default", &gadgets);
    let gadget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Gadget",
        "metadata": {"name": "g1"}, "spec": {"size": 3},
    }))
    .unwrap();
    gadgets_b
        .create(&PostParams::default(), &gadget)
        .await
        .expect("B creates a Gadget of the definition made through A");
    let listed = gadgets_b.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].data["spec"]["size"], 3);
    let (status, index) = get(&router_b, "/openapi/v3").await;
    assert_eq!(status, 200);
    assert!(
        index["paths"].get("apis/example.com/v1").is_some(),
        "B's OpenAPI v3 index lists the custom group-version: {index}"
    );
    let (status, doc) = get(&router_b, "/openapi/v3/apis/example.com/v1").await;
    assert_eq!(status, 200);
    assert!(
        doc["components"]["schemas"]
            .as_object()
            .is_some_and(|s| s.keys().any(|k| k.ends_with("Gadget"))),
        "B's document has the Gadget schema"
    );
    let (status, apiservice) = get(
        &router_b,
        "/apis/apiregistration.k8s.io/v1/apiservices/v1.example.com",
    )
    .await;
    assert_eq!(status, 200, "{apiservice}");

    crds_a
        .delete("gadgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    ccm_testkit::eventually(30, "B stops serving gadgets deleted through A", || async {
        let (status, _) = get(&router_b, "/apis/example.com/v1/namespaces/default/gadgets").await;
        let (index_status, index) = get(&router_b, "/openapi/v3").await;
        (status == 404
            && index_status == 200
            && index["paths"].get("apis/example.com/v1").is_none())
        .then_some(())
    })
    .await;
    let (status, _) = get(&router_b, "/apis/example.com/v1").await;
    assert_eq!(status, 404, "example.com/v1 is gone from B's discovery");
    shutdown.cancel();
}

/// `namespace_controller.go` runs once per cluster, in the kube-controller-manager that
/// holds its Lease, whichever API server took the deletion: here the server that commits
/// a namespace's deletion cleans it up, and when it stops mid-way (its objects are held by
/// a finalizer), another server following the store takes the cleanup over, deletes what
/// is left and finalizes the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_whose_deleting_api_server_stopped_is_finalized_by_another() {
    let etcd = Etcd::start().await;
    let b = etcd_server_with(
        etcd.endpoints(),
        ApiServerConfig {
            namespace_takeover_after: std::time::Duration::from_secs(1),
            ..ApiServerConfig::default()
        },
    )
    .await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    b.spawn_store_follower(shutdown.clone());
    let admin_b = Client::new(b.router(), "default");
    let namespaces: Api<Namespace> = Api::all(admin_b.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
        )
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(admin_b.clone(), "doomed");
    for (name, finalizers) in [("held", json!(["example.com/hold"])), ("plain", json!([]))] {
        let cm = serde_json::from_value(json!({
            "metadata": {"name": name, "finalizers": finalizers}, "data": {"k": "v"},
        }))
        .unwrap();
        configmaps
            .create(&PostParams::default(), &cm)
            .await
            .unwrap();
    }

    // Server A, in a runtime of its own: it takes the deletion, starts the cleanup
    // (which marks "held" deleted and waits on its finalizer), and is stopped, its tasks
    // with its runtime.
    let endpoints = etcd.endpoints();
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let a = etcd_server_with(endpoints, ApiServerConfig::default()).await;
            let admin_a = Client::new(a.router(), "default");
            Api::<Namespace>::all(admin_a.clone())
                .delete("doomed", &DeleteParams::default())
                .await
                .unwrap();
            let held: Api<ConfigMap> = Api::namespaced(admin_a, "doomed");
            ccm_testkit::eventually(20, "A's cleanup marks 'held' deleted", || async {
                let cm = held.get("held").await.ok()?;
                cm.metadata.deletion_timestamp.map(|_| ())
            })
            .await;
        });
        runtime.shutdown_background();
    })
    .await
    .unwrap();

    let ns = namespaces.get("doomed").await.unwrap();
    assert!(
        ns.metadata.deletion_timestamp.is_some(),
        "still terminating when A stops"
    );
    // The finalizer is released: only B is left to finish the namespace.
    configmaps
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    ccm_testkit::eventually(30, "B finalizes the namespace A began deleting", || async {
        match namespaces.get("doomed").await {
            Err(kube::Error::Api(status)) if status.code == 404 => Some(()),
            _ => None,
        }
    })
    .await;
    let left = Api::<ConfigMap>::namespaced(admin_b, "doomed")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(left.items.is_empty(), "the namespace's contents are gone");
    shutdown.cancel();
}

/// etcd's Go client takes responses up to `math.MaxInt32` bytes (clientv3's
/// `MaxCallRecvMsgSize`, which kube-apiserver keeps): a list larger than gRPC's 4 MiB
/// default is answered whole, not with a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_larger_than_four_mib_is_answered_whole_on_etcd() {
    let etcd = Etcd::start().await;
    let server = etcd_server(&etcd).await;
    let api: Api<ConfigMap> = Api::namespaced(Client::new(server.router(), "default"), "default");
    let big = "x".repeat(900 * 1024);
    for i in 0..6 {
        let cm = serde_json::from_value(json!({
            "metadata": {"name": format!("big-{i}")}, "data": {"k": big},
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let listed = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 6, "about 5.4 MB listed in one answer");
}

/// Copies the files every API server of one cluster shares (kubeadm copies them to each
/// control-plane node) from the PKI of `from` into `to`: `pki/ca.crt`, `ca.key`, `sa.key`.
fn copy_shared_pki(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to.join("pki")).unwrap();
    for file in ["ca.crt", "ca.key", "sa.key"] {
        std::fs::copy(from.join("pki").join(file), to.join("pki").join(file)).unwrap();
    }
}

/// kube-apiserver's HA control plane shares one CA and service-account key among its
/// servers (kubeadm's `--upload-certs` copies `ca.crt`, `ca.key`, `sa.key` to every
/// control-plane node), so a client of one is a client of all. The first server on an etcd
/// records its PKI's fingerprints there; a second with a PKI of its own is refused, with an
/// error naming the files to copy and where; with copies of the first's files it joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_api_server_joins_an_etcd_only_with_the_first_servers_pki() {
    use core_cluster::serve::{Security, ServeError};
    let etcd = Etcd::start().await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = etcd_server(&etcd).await;
    let security_a = Security::load(&a, dir_a.path(), &[]).unwrap();
    security_a.check_cluster_identity(&a).await.unwrap();
    security_a
        .check_cluster_identity(&a)
        .await
        .expect("the first server again, on its next start");

    let b = etcd_server(&etcd).await;
    let own = Security::load(&b, dir_b.path(), &[]).unwrap();
    let error = own.check_cluster_identity(&b).await.unwrap_err();
    assert!(matches!(error, ServeError::ForeignPki { .. }), "{error:?}");
    let message = error.to_string();
    for named in [
        "copy ca.crt, ca.key, sa.key",
        &dir_b.path().join("pki").display().to_string(),
        &security_a.pki.identity().unwrap().ca_certificate_sha256,
    ] {
        assert!(message.contains(named), "{named:?} not in: {message}");
    }

    copy_shared_pki(dir_a.path(), dir_b.path());
    let shared = Security::load(&b, dir_b.path(), &[]).unwrap();
    shared
        .check_cluster_identity(&b)
        .await
        .expect("with the first server's files, the second joins");
    assert_eq!(shared.pki.ca_pem(), security_a.pki.ca_pem());
}

/// Creates ConfigMaps `w<writer>-<i>` through `primary` until `stop`; when `primary` stops
/// answering (a transport error, not an API status), sends the same create and the ones
/// after it to `secondary`, as a client behind a load balancer of an HA control plane does.
/// A create the first server committed before it died is 409 there, and counted as written.
/// Returns the names written and the failures answered by an API server.
async fn create_failing_over(
    primary: Client,
    secondary: Client,
    writers: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> (Vec<String>, Vec<(String, String)>) {
    use std::sync::atomic::Ordering;
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let (primary, secondary, stop) = (primary.clone(), secondary.clone(), stop.clone());
            tokio::spawn(async move {
                let mut api: Api<ConfigMap> = Api::namespaced(primary, "default");
                let mut failed_over = false;
                let (mut written, mut failed) = (Vec::new(), Vec::new());
                for i in 0.. {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let name = format!("w{writer}-{i}");
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": {"name": name}, "data": {"k": "v"},
                    }))
                    .unwrap();
                    loop {
                        match api.create(&PostParams::default(), &cm).await {
                            Ok(_) => written.push(name.clone()),
                            Err(kube::Error::Api(status)) if failed_over && status.code == 409 => {
                                written.push(name.clone());
                            }
                            Err(kube::Error::Api(status)) => {
                                failed.push((name.clone(), status.message));
                            }
                            Err(_) if !failed_over => {
                                failed_over = true;
                                api = Api::namespaced(secondary.clone(), "default");
                                continue;
                            }
                            Err(error) => failed.push((name.clone(), error.to_string())),
                        }
                        break;
                    }
                }
                (written, failed)
            })
        })
        .collect();
    let (mut written, mut failed) = (Vec::new(), Vec::new());
    for task in tasks {
        let (w, f) = task.await.unwrap();
        written.extend(w);
        failed.extend(f);
    }
    (written, failed)
}

/// One of two API servers on one etcd, sharing one PKI, dies (its runtime, connections and
/// all, is dropped) in the middle of a burst of creates through it: kube-apiserver answers a
/// create only once etcd committed it (`etcd3/store.go` `Create`), so every acknowledged
/// create is listed by the other server, and the writers, sent on to the other server with
/// the same credentials, go on without a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_api_servers_mid_burst_loses_no_write_and_the_other_takes_its_clients() {
    use ccm_testkit::TestServer;
    use core_cluster::serve::{Security, ServeOptions};
    use std::sync::atomic::{AtomicBool, Ordering};
    let etcd = Etcd::start().await;

    // Server A, in a runtime of its own, so that it can die with every task and connection.
    let (ready, started) = tokio::sync::oneshot::channel();
    let (kill, killed) = tokio::sync::oneshot::channel::<()>();
    let endpoints = etcd.endpoints();
    let a = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let held = runtime.block_on(async move {
            let server = etcd_server_with(endpoints, ApiServerConfig::default()).await;
            let dir = tempfile::tempdir().unwrap();
            let security = Security::load(&server, dir.path(), &[]).unwrap();
            security.check_cluster_identity(&server).await.unwrap();
            let tls = TestServer::start_secured(server, security, ServeOptions::default(), dir)
                .await
                .unwrap();
            let shared = tempfile::tempdir().unwrap();
            copy_shared_pki(&tls.dir(), shared.path());
            ready
                .send((tls.admin_kubeconfig(), tls.url(), shared))
                .unwrap();
            let _ = killed.await;
            tls
        });
        runtime.shutdown_background();
        drop(held);
    });
    let (kubeconfig_a, url_a, shared) = started.await.unwrap();

    // Server B, with copies of A's CA and service-account key; A's admin kubeconfig is
    // pointed at it unchanged but for the URL.
    let b = etcd_server(&etcd).await;
    let security = Security::load(&b, shared.path(), &[]).unwrap();
    security.check_cluster_identity(&b).await.unwrap();
    let b = TestServer::start_secured(b, security, ServeOptions::default(), shared)
        .await
        .unwrap();
    let on_a = b.client(&kubeconfig_a).await.unwrap();
    let on_b = b
        .client(&kubeconfig_a.replace(&url_a, &b.url()))
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(on_b.clone(), "default");
    configmaps
        .list(&ListParams::default())
        .await
        .expect("A's admin credentials work on B");

    let stop = Arc::new(AtomicBool::new(false));
    let writes = tokio::spawn(create_failing_over(on_a, on_b, 8, stop.clone()));
    let count = || async {
        configmaps
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .ok()
    };
    ccm_testkit::eventually(60, "100 creates through A", || async {
        count().await.filter(|&n| n >= 100)
    })
    .await;
    kill.send(()).unwrap();
    tokio::task::spawn_blocking(move || a.join().unwrap())
        .await
        .unwrap();
    ccm_testkit::eventually(60, "200 more creates through B", || async {
        count().await.filter(|&n| n >= 300)
    })
    .await;
    stop.store(true, Ordering::Release);
    let (written, failed) = tokio::time::timeout(std::time::Duration::from_secs(60), writes)
        .await
        .expect("the writers stop within 60 s")
        .unwrap();
    assert!(failed.is_empty(), "failed creates: {failed:?}");
    let listed: std::collections::BTreeSet<String> = configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|name| name.starts_with('w'))
        .collect();
    let written: std::collections::BTreeSet<String> = written.into_iter().collect();
    let lost: Vec<&String> = written.difference(&listed).collect();
    assert!(lost.is_empty(), "written, then missing: {lost:?}");
    assert_eq!(listed, written, "B lists exactly what was written");
}
