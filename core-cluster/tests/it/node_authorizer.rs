//! The Node authorizer's graph and NodeRestriction against the attacks a node's credentials
//! allow, through the real HTTP API over TLS: node identities are client certificates
//! (`CN=system:node:<name>, O=system:nodes`) from the cluster CA, or kubectl's
//! `--as=system:node:n1 --as-group=system:nodes`. Each test names the upstream rule
//! (`plugin/pkg/auth/authorizer/node/node_authorizer.go`, `graph.go`,
//! `graph_populator.go`, `plugin/pkg/admission/noderestriction/admission.go`).

use std::sync::Arc;

use std::sync::atomic::{AtomicUsize, Ordering};

use ccm_testkit::TestServer;
use core_cluster::{
    ApiServer, ApiServerConfig,
    auth::node::node_user,
    store::{KeyValue, ListResult, MemoryStore, Store, StoreError, WatchStream},
};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenReview},
    authorization::v1::SubjectAccessReview,
    core::v1::{ConfigMap, Node, Pod, Secret, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use ccm_testkit::kubectl::{kubectl, require_kubectl};

async fn start() -> TestServer {
    let api = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("API server");
    TestServer::start(api).await.expect("TLS server")
}

/// A kube-rs client presenting a client certificate of the kubelet of `node`.
async fn node_client(server: &TestServer, node: &str) -> Client {
    let config = server
        .kubeconfig_for(&format!("system:node:{node}"), &["system:nodes"])
        .unwrap();
    server.client(&config).await.unwrap()
}

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A pod with one container, `extra` merged into its spec.
fn pod(name: &str, node: Option<&str>, extra: Value) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    from(json!({"metadata": {"name": name}, "spec": spec}))
}

async fn create_pod(client: &Client, ns: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), pod)
        .await
        .unwrap()
}

async fn create_service_account(client: &Client, ns: &str, name: &str) {
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": name}})),
        )
        .await
        .unwrap();
}

/// Deletes at once, as a kubelet confirms the end of a pod (grace period 0).
async fn delete_now(client: &Client, ns: &str, name: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

/// A TokenRequest for `ns/sa` with `bound` as `spec.boundObjectRef`: the token, or the
/// error's (code, message).
async fn mint(client: &Client, ns: &str, sa: &str, bound: Value) -> Result<String, (u16, String)> {
    let request: TokenRequest = from(json!({"spec": {"audiences": [], "boundObjectRef": bound}}));
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .map(|t| t.status.unwrap().token)
        .map_err(api_error)
}

/// `boundObjectRef` for `pod`, as kubelet sends it.
fn bound_to(pod: &Pod) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "name": pod.metadata.name, "uid": pod.metadata.uid})
}

fn api_error(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

fn no_relationship(ns: &str, node: &str, verb: &str, resource: &str, name: &str) -> String {
    let plural = resource.split('/').next().unwrap();
    format!(
        r#"{plural} "{name}" is forbidden: User "system:node:{node}" cannot {verb} resource "{resource}" in API group "" in the namespace "{ns}": no relationship found between node '{node}' and this object"#
    )
}

/// `node_authorizer.go` `authorizeCreateToken`: the attack as kubectl makes it. A node asks
/// for a token of `kube-system/powerful`, bound to cluster-admin, which no pod of it uses:
/// 403 for kubectl's impersonated node and for a node's client certificate, with any
/// audience.
#[tokio::test]
async fn a_node_cannot_mint_a_token_for_a_service_account_its_pods_do_not_use() {
    require_kubectl("it runs `kubectl --as=system:node:n1 create token` as an attacker would");
    let server = start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("admin.kubeconfig");
    std::fs::write(&kubeconfig, server.admin_kubeconfig()).unwrap();
    for args in [
        &["-n", "kube-system", "create", "serviceaccount", "powerful"][..],
        &[
            "create",
            "clusterrolebinding",
            "powerful-admin",
            "--clusterrole=cluster-admin",
            "--serviceaccount=kube-system:powerful",
        ],
    ] {
        let out = kubectl(dir.path(), &kubeconfig, args).await;
        assert!(out.success, "{args:?}: {}", out.stderr);
    }
    let attack = kubectl(
        dir.path(),
        &kubeconfig,
        &[
            "--as=system:node:n1",
            "--as-group=system:nodes",
            "-n",
            "kube-system",
            "create",
            "token",
            "powerful",
        ],
    )
    .await;
    assert!(!attack.success, "a node minted {:?}", attack.stdout);
    assert!(attack.stdout.is_empty());
    let expected = no_relationship(
        "kube-system",
        "n1",
        "create",
        "serviceaccounts/token",
        "powerful",
    );
    assert!(
        attack.stderr.contains(&expected),
        "{}\nwanted: {expected}",
        attack.stderr
    );
    let can_i = kubectl(
        dir.path(),
        &kubeconfig,
        &[
            "--as=system:node:n1",
            "--as-group=system:nodes",
            "-n",
            "kube-system",
            "auth",
            "can-i",
            "create",
            "serviceaccounts/powerful",
            "--subresource=token",
        ],
    )
    .await;
    assert_eq!(
        can_i.stdout.trim(),
        "no - no relationship found between node 'n1' and this object",
        "{}",
        can_i.stderr
    );

    // The same with the node's own certificate, for another audience.
    let n1 = node_client(&server, "n1").await;
    let request: TokenRequest = from(json!({"spec": {"audiences": ["vault"]}}));
    let refused = Api::<ServiceAccount>::namespaced(n1, "kube-system")
        .create_token_request("powerful", &PostParams::default(), &request)
        .await
        .map_err(api_error)
        .unwrap_err();
    assert_eq!(refused, (403, expected));
}

/// `node_authorizer.go` `authorizeCreateToken` with NodeRestriction `admitServiceAccount`:
/// a kubelet mints the token of a pod bound to it (bound to that pod, by name and UID).
/// Another node, an unbound token, a missing or wrong UID and a pod on another node are
/// refused with upstream's messages.
#[tokio::test]
async fn a_node_mints_a_token_only_bound_to_a_pod_it_runs() {
    let server = start().await;
    let admin = server.admin_client().await.unwrap();
    create_service_account(&admin, "default", "app").await;
    let web = create_pod(
        &admin,
        "default",
        &pod("web", Some("n1"), json!({"serviceAccountName": "app"})),
    )
    .await;
    let elsewhere = create_pod(
        &admin,
        "default",
        &pod(
            "elsewhere",
            Some("n2"),
            json!({"serviceAccountName": "app"}),
        ),
    )
    .await;
    let (n1, n2, n3) = (
        node_client(&server, "n1").await,
        node_client(&server, "n2").await,
        node_client(&server, "n3").await,
    );

    let token = mint(&n1, "default", "app", bound_to(&web)).await.unwrap();
    let review: TokenReview = Api::all(admin.clone())
        .create(
            &PostParams::default(),
            &from(json!({"spec": {"token": token}})),
        )
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:default:app")
    );
    assert_eq!(
        user.extra.unwrap()["authentication.kubernetes.io/pod-name"],
        ["web"]
    );

    // n3 runs no pod of `app`: the authorizer refuses.
    assert_eq!(
        mint(&n3, "default", "app", bound_to(&web)).await,
        Err((
            403,
            no_relationship("default", "n3", "create", "serviceaccounts/token", "app")
        ))
    );
    // n2 runs a pod of `app`, but the token names n1's pod: NodeRestriction refuses.
    let forbidden = |why: &str| Err((403, format!(r#"serviceaccounts "app" is forbidden: {why}"#)));
    assert_eq!(
        mint(&n2, "default", "app", bound_to(&web)).await,
        forbidden("node requested token bound to a pod scheduled on a different node")
    );
    mint(&n2, "default", "app", bound_to(&elsewhere))
        .await
        .unwrap();
    assert_eq!(
        mint(&n1, "default", "app", Value::Null).await,
        forbidden("node requested token not bound to a pod")
    );
    assert_eq!(
        mint(
            &n1,
            "default",
            "app",
            json!({"apiVersion": "v1", "kind": "Secret", "name": "web", "uid": web.metadata.uid})
        )
        .await,
        forbidden("node requested token not bound to a pod")
    );
    assert_eq!(
        mint(
            &n1,
            "default",
            "app",
            json!({"apiVersion": "v1", "kind": "Pod", "name": "web"})
        )
        .await,
        forbidden("node requested token with a pod binding without a uid")
    );
    assert_eq!(
        mint(
            &n1,
            "default",
            "app",
            json!({"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "0000"})
        )
        .await,
        forbidden(
            "the UID in the bound object reference (0000) does not match the UID in record. The object might have been deleted and then recreated"
        )
    );
    assert_eq!(
        mint(
            &n1,
            "default",
            "app",
            json!({"apiVersion": "v1", "kind": "Pod", "name": "gone", "uid": "1"})
        )
        .await,
        Err((404, r#"pods "gone" not found"#.to_owned()))
    );
    // The admin is no node: NodeRestriction leaves it alone.
    mint(&admin, "default", "app", Value::Null).await.unwrap();
}

/// `graph_populator.go` `deletePod`/`updatePod` and `graph.go` `AddPod`: the permission
/// follows the pod. Deleted, the node loses it; recreated on another node, that node gains
/// it (and a token bound to the old UID is refused); bound later through `pods/binding`,
/// the node gains it then.
#[tokio::test]
async fn a_nodes_token_permission_ends_when_its_pod_is_deleted_or_moves() {
    let server = start().await;
    let admin = server.admin_client().await.unwrap();
    create_service_account(&admin, "default", "app").await;
    let (n1, n2) = (
        node_client(&server, "n1").await,
        node_client(&server, "n2").await,
    );
    let spec = json!({"serviceAccountName": "app"});
    let first = create_pod(&admin, "default", &pod("web", Some("n1"), spec.clone())).await;
    mint(&n1, "default", "app", bound_to(&first)).await.unwrap();

    delete_now(&admin, "default", "web").await;
    let refused = Err((
        403,
        no_relationship("default", "n1", "create", "serviceaccounts/token", "app"),
    ));
    assert_eq!(mint(&n1, "default", "app", bound_to(&first)).await, refused);

    let moved = create_pod(&admin, "default", &pod("web", Some("n2"), spec.clone())).await;
    assert_eq!(mint(&n1, "default", "app", bound_to(&moved)).await, refused);
    mint(&n2, "default", "app", bound_to(&moved)).await.unwrap();
    let (code, message) = mint(&n2, "default", "app", bound_to(&first))
        .await
        .unwrap_err();
    assert_eq!(code, 403);
    assert!(
        message.contains("does not match the UID in record"),
        "{message}"
    );

    // Scheduled later: the binding adds the edge.
    create_service_account(&admin, "default", "late").await;
    let pending = create_pod(
        &admin,
        "default",
        &pod("pending", None, json!({"serviceAccountName": "late"})),
    )
    .await;
    assert_eq!(
        mint(&n1, "default", "late", bound_to(&pending)).await,
        Err((
            403,
            no_relationship("default", "n1", "create", "serviceaccounts/token", "late")
        ))
    );
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pending"},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}});
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create_subresource::<Value, Value>("binding", "pending", &PostParams::default(), &binding)
        .await
        .unwrap();
    mint(&n1, "default", "late", bound_to(&pending))
        .await
        .unwrap();
}

/// `node_authorizer.go` `authorizeReadNamespacedObject`: a node gets (or lists and watches
/// by `metadata.name`) the secrets and configmaps its pods reference, and nothing else:
/// no other secret, no list of all, nothing once the pod is gone, nothing for another node.
#[tokio::test]
async fn a_node_reads_only_the_secrets_and_configmaps_its_pods_reference() {
    let server = start().await;
    let admin = server.admin_client().await.unwrap();
    let secrets = Api::<Secret>::namespaced(admin.clone(), "default");
    let configmaps = Api::<ConfigMap>::namespaced(admin.clone(), "default");
    for name in ["mounted", "other"] {
        secrets
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": name}, "stringData": {"k": "v"}})),
            )
            .await
            .unwrap();
        configmaps
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": format!("{name}-cm")}, "data": {"k": "v"}})),
            )
            .await
            .unwrap();
    }
    create_pod(
        &admin,
        "default",
        &pod(
            "web",
            Some("n1"),
            json!({
                "volumes": [{"name": "s", "secret": {"secretName": "mounted"}}],
                "containers": [{"name": "c", "image": "busybox", "env": [{"name": "K",
                    "valueFrom": {"configMapKeyRef": {"name": "mounted-cm", "key": "k"}}}]}],
            }),
        ),
    )
    .await;
    let n1 = node_client(&server, "n1").await;
    let n1_secrets = Api::<Secret>::namespaced(n1.clone(), "default");
    let n1_configmaps = Api::<ConfigMap>::namespaced(n1.clone(), "default");

    n1_secrets.get("mounted").await.unwrap();
    n1_configmaps.get("mounted-cm").await.unwrap();
    assert_eq!(
        n1_secrets
            .get("other")
            .await
            .map_err(api_error)
            .unwrap_err(),
        (
            403,
            no_relationship("default", "n1", "get", "secrets", "other")
        )
    );
    assert_eq!(
        n1_configmaps
            .get("other-cm")
            .await
            .map_err(api_error)
            .unwrap_err(),
        (
            403,
            no_relationship("default", "n1", "get", "configmaps", "other-cm")
        )
    );
    let (code, message) = n1_secrets
        .list(&ListParams::default())
        .await
        .map_err(api_error)
        .unwrap_err();
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            r#"secrets is forbidden: User "system:node:n1" cannot list resource "secrets" in API group "" in the namespace "default": No Object name found"#
        )
    );
    let one = n1_secrets
        .list(&ListParams::default().fields("metadata.name=mounted"))
        .await
        .unwrap();
    assert_eq!(one.items.len(), 1);
    assert_eq!(one.items[0].metadata.name.as_deref(), Some("mounted"));
    assert_eq!(
        n1_secrets
            .list(&ListParams::default().fields("metadata.name=other"))
            .await
            .map_err(api_error)
            .unwrap_err()
            .0,
        403
    );
    let n2 = Api::<Secret>::namespaced(node_client(&server, "n2").await, "default");
    assert_eq!(
        n2.get("mounted").await.map_err(api_error).unwrap_err(),
        (
            403,
            no_relationship("default", "n2", "get", "secrets", "mounted")
        )
    );

    delete_now(&admin, "default", "web").await;
    assert_eq!(
        n1_secrets
            .get("mounted")
            .await
            .map_err(api_error)
            .unwrap_err(),
        (
            403,
            no_relationship("default", "n1", "get", "secrets", "mounted")
        )
    );
}

/// NodeRestriction `admitPodCreate` and `graph.go` `AddPod` (mirror pods reach only their
/// node): a node may not create a mirror pod that references a service account, a secret
/// or a claim, nor one owned by another object or by a Node of another UID; and a mirror
/// pod that does reference a service account (created by someone else) gives the node no
/// token for it.
#[tokio::test]
async fn a_node_cannot_use_a_mirror_pod_to_reach_a_service_account_or_secret() {
    let server = start().await;
    let admin = server.admin_client().await.unwrap();
    create_service_account(&admin, "kube-system", "powerful").await;
    let n1 = node_client(&server, "n1").await;
    let node: Node = Api::all(n1.clone())
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "n1"}})),
        )
        .await
        .unwrap();
    let node_uid = node.metadata.uid.unwrap();
    let mirror = |name: &str, extra: Value, owner_uid: &str| -> Pod {
        let mut p = serde_json::to_value(pod(name, Some("n1"), extra)).unwrap();
        p["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "hash"});
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Node",
            "name": "n1", "uid": owner_uid, "controller": true}]);
        from(p)
    };
    let n1_pods = Api::<Pod>::namespaced(n1.clone(), "kube-system");
    let refused = |name: &str, why: &str| {
        (
            403,
            format!(r#"pods "{name}" is forbidden: node "n1" {why}"#),
        )
    };
    for (name, extra, why) in [
        (
            "with-sa",
            json!({"serviceAccountName": "powerful"}),
            "can not create pods that reference a service account",
        ),
        (
            "with-secret",
            json!({"volumes": [{"name": "v", "secret": {"secretName": "powerful-token"}}]}),
            "can not create pods that reference secrets",
        ),
        (
            "with-claim",
            json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}),
            "can not create pods that reference persistentvolumeclaims",
        ),
    ] {
        let e = n1_pods
            .create(&PostParams::default(), &mirror(name, extra, &node_uid))
            .await
            .map_err(api_error)
            .unwrap_err();
        assert_eq!(e, refused(name, why));
    }
    let e = n1_pods
        .create(
            &PostParams::default(),
            &mirror("spoofed", json!({}), "not-n1"),
        )
        .await
        .map_err(api_error)
        .unwrap_err();
    assert_eq!(
        e,
        (
            403,
            format!(
                r#"pods "spoofed" is forbidden: node n1 UID mismatch: expected not-n1 got {node_uid}"#
            )
        )
    );
    let mut owned = serde_json::to_value(mirror("owned", json!({}), &node_uid)).unwrap();
    owned["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1",
        "kind": "DaemonSet", "name": "ds", "uid": "1", "controller": true}]);
    assert_eq!(
        n1_pods
            .create(&PostParams::default(), &from(owned))
            .await
            .map_err(api_error)
            .unwrap_err(),
        refused(
            "owned",
            "can only create pods with an owner reference set to itself"
        )
    );
    // A mirror pod that references nothing is the kubelet's business.
    n1_pods
        .create(
            &PostParams::default(),
            &mirror("static-web", json!({}), &node_uid),
        )
        .await
        .unwrap();

    // A mirror pod with a service account (written by the admin) adds no edge to it.
    let planted = create_pod(
        &admin,
        "kube-system",
        &mirror(
            "planted",
            json!({"serviceAccountName": "powerful"}),
            &node_uid,
        ),
    )
    .await;
    assert_eq!(
        mint(&n1, "kube-system", "powerful", bound_to(&planted)).await,
        Err((
            403,
            no_relationship(
                "kube-system",
                "n1",
                "create",
                "serviceaccounts/token",
                "powerful"
            )
        ))
    );
}

/// NodeRestriction `admitPodStatus`: a node updates the status of its pods but may not
/// relabel them through `pods/status` (which would steer a Service's traffic to them).
#[tokio::test]
async fn a_node_cannot_relabel_its_pods_through_pod_status() {
    let server = start().await;
    let admin = server.admin_client().await.unwrap();
    let mut on_n1 = pod("on-n1", Some("n1"), json!({}));
    on_n1.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
    create_pod(&admin, "default", &on_n1).await;
    let pods = Api::<Pod>::namespaced(node_client(&server, "n1").await, "default");

    for patch in [
        json!({"metadata": {"labels": {"app": "hijack"}}}),
        json!({"metadata": {"labels": {"extra": "x"}}, "status": {"phase": "Running"}}),
        json!({"metadata": {"labels": null}}),
    ] {
        let e = pods
            .patch_status("on-n1", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error)
            .unwrap_err();
        assert_eq!(
            e,
            (
                403,
                r#"pods "on-n1" is forbidden: node "n1" cannot update labels through pod status"#
                    .to_owned()
            ),
            "{patch}"
        );
    }
    let stored = Api::<Pod>::namespaced(admin, "default")
        .get("on-n1")
        .await
        .unwrap();
    assert_eq!(
        stored.metadata.labels,
        Some([("app".to_owned(), "web".to_owned())].into())
    );
    let running = pods
        .patch_status(
            "on-n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    assert_eq!(running.status.unwrap().phase.as_deref(), Some("Running"));
}

/// A SubjectAccessReview (as the admin) of `node` getting `ns/secret`: the decision of the
/// authorizer chain, graph included.
async fn node_may_get_secret(admin: &Client, node: &str, ns: &str, secret: &str) -> bool {
    let review: SubjectAccessReview = from(json!({"spec": {
        "user": format!("system:node:{node}"), "groups": ["system:nodes"],
        "resourceAttributes": {"verb": "get", "resource": "secrets",
                               "namespace": ns, "name": secret}}}));
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

/// `graph_populator.go` fed at startup: the graph is built from the pods in the store when
/// the server starts, so a restarted server decides as the one before it.
#[tokio::test]
async fn the_graph_is_rebuilt_from_the_store_when_the_server_starts() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let first = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let admin = Client::new(first.router(), "default");
    create_pod(
        &admin,
        "default",
        &pod(
            "web",
            Some("n1"),
            json!({"volumes": [{"name": "s", "secret": {"secretName": "mounted"}}]}),
        ),
    )
    .await;
    assert!(node_may_get_secret(&admin, "n1", "default", "mounted").await);
    drop(first);

    let restarted = ApiServer::new(store, ApiServerConfig::default())
        .await
        .unwrap();
    let admin = Client::new(restarted.router(), "default");
    assert!(node_may_get_secret(&admin, "n1", "default", "mounted").await);
    assert!(!node_may_get_secret(&admin, "n2", "default", "mounted").await);
    // The restarted server's requests as the node itself, too.
    let n1 = Api::<Secret>::namespaced(
        Client::new(restarted.router_as(node_user("n1")), "default"),
        "default",
    );
    assert_eq!(
        n1.get("mounted").await.map_err(api_error).unwrap_err().0,
        404,
        "allowed, and the secret does not exist"
    );
    assert_eq!(n1.get("other").await.map_err(api_error).unwrap_err().0, 403);
}

/// The graph under concurrent writes to the same pods: two writers keep creating and
/// deleting each pod, one on n1 and one on n2. Afterwards every decision matches what the
/// store holds: the node of a pod that exists reads its secret, the other node does not,
/// and nobody reads the secret of a pod that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pod_writes_leave_the_graph_as_the_store_says() {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let admin = Client::new(server.router(), "default");
    const PODS: usize = 12;
    const ROUNDS: usize = 15;
    let mut writers = tokio::task::JoinSet::new();
    for node in ["n1", "n2"] {
        for i in 0..PODS {
            let pods = Api::<Pod>::namespaced(admin.clone(), "default");
            writers.spawn(async move {
                let spec =
                    json!({"volumes": [{"name": "s", "secret": {"secretName": format!("s{i}")}}]});
                for _ in 0..ROUNDS {
                    let _ = pods
                        .create(
                            &PostParams::default(),
                            &pod(&format!("p{i}"), Some(node), spec.clone()),
                        )
                        .await;
                    tokio::task::yield_now().await;
                    let _ = pods
                        .delete(&format!("p{i}"), &DeleteParams::default().grace_period(0))
                        .await;
                }
                // Each writer leaves its pod in place half of the time.
                if i % 2 == usize::from(node == "n2") {
                    let _ = pods
                        .create(
                            &PostParams::default(),
                            &pod(&format!("p{i}"), Some(node), spec.clone()),
                        )
                        .await;
                }
            });
        }
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    let pods = Api::<Pod>::namespaced(admin.clone(), "default");
    // At least one pod to check, whatever the race left.
    let _ = pods
        .create(
            &PostParams::default(),
            &pod(
                "p0",
                Some("n1"),
                json!({"volumes": [{"name": "s", "secret": {"secretName": "s0"}}]}),
            ),
        )
        .await;
    let mut present = 0;
    for i in 0..PODS {
        let node = pods
            .get_opt(&format!("p{i}"))
            .await
            .unwrap()
            .and_then(|p| p.spec.unwrap().node_name);
        present += usize::from(node.is_some());
        for candidate in ["n1", "n2"] {
            assert_eq!(
                node_may_get_secret(&admin, candidate, "default", &format!("s{i}")).await,
                node.as_deref() == Some(candidate),
                "pod p{i} on {node:?}, asked for {candidate}"
            );
        }
    }
    assert!(present > 0, "the writers left no pod to check");
}

/// A store whose reads of pods fail on demand: the `n`th next `get` of a pod key, and every
/// list of pods while `fail_lists` is set.
#[derive(Default)]
struct FlakyStore {
    inner: MemoryStore,
    /// Fail the `get` of a pod key when this counts down to 1.
    fail_get_in: AtomicUsize,
    fail_lists: std::sync::atomic::AtomicBool,
}

const POD_KEYS: &str = "/registry/core/pods/";

fn flaky(context: &str) -> StoreError {
    StoreError::backend(context, std::io::Error::other("injected failure"))
}

#[async_trait::async_trait]
impl Store for FlakyStore {
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        if key.starts_with(POD_KEYS)
            && self
                .fail_get_in
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                == Ok(1)
        {
            return Err(flaky("get"));
        }
        self.inner.get(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at_revision: Option<u64>,
    ) -> Result<ListResult, StoreError> {
        if prefix.starts_with(POD_KEYS) && self.fail_lists.load(Ordering::SeqCst) {
            return Err(flaky("list"));
        }
        self.inner
            .list(prefix, start_after, limit, at_revision)
            .await
    }
    async fn create(&self, key: &str, value: bytes::Bytes) -> Result<u64, StoreError> {
        self.inner.create(key, value).await
    }
    async fn update(
        &self,
        key: &str,
        value: bytes::Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.inner.update(key, value, expected_mod_revision).await
    }
    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<(u64, KeyValue), StoreError> {
        self.inner.delete(key, expected_mod_revision).await
    }
    async fn current_revision(&self) -> Result<u64, StoreError> {
        self.inner.current_revision().await
    }
    async fn health(&self) -> Result<(), StoreError> {
        self.inner.health().await
    }
    async fn watch(&self, prefix: &str, from_revision: u64) -> Result<WatchStream, StoreError> {
        self.inner.watch(prefix, from_revision).await
    }
    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        self.inner.compact(revision).await
    }
}

/// When the graph cannot follow a pod write (the store fails to read the pod back), the
/// next node decision rebuilds it from the store; while that fails too, a node reaches
/// nothing through the graph rather than what a stale graph says.
#[tokio::test]
async fn a_write_the_graph_missed_is_caught_up_before_the_next_node_decision() {
    let store = Arc::new(FlakyStore::default());
    let server = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let admin = Client::new(server.router(), "default");
    let spec = json!({"volumes": [{"name": "s", "secret": {"secretName": "mounted"}}]});
    create_pod(&admin, "default", &pod("web", Some("n1"), spec.clone())).await;
    create_pod(&admin, "default", &pod("db", Some("n2"), spec.clone())).await;
    assert!(node_may_get_secret(&admin, "n1", "default", "mounted").await);

    // The delete reads the pod (1st get), deletes it, and the graph's read-back (2nd)
    // fails: the graph still holds the pod until the decision below rebuilds it.
    store.fail_get_in.store(2, Ordering::SeqCst);
    delete_now(&admin, "default", "web").await;
    assert_eq!(
        store.fail_get_in.load(Ordering::SeqCst),
        0,
        "the read-back failed"
    );
    assert!(!node_may_get_secret(&admin, "n1", "default", "mounted").await);
    assert!(node_may_get_secret(&admin, "n2", "default", "mounted").await);

    // Another missed write (a new pod on n3, whose read-back is the first pod get), and the
    // rebuild fails as well: until the store heals no node reaches anything through the
    // graph, n2 (whose pod is still there) included.
    store.fail_get_in.store(1, Ordering::SeqCst);
    store.fail_lists.store(true, Ordering::SeqCst);
    create_pod(&admin, "default", &pod("cache", Some("n3"), spec)).await;
    assert_eq!(
        store.fail_get_in.load(Ordering::SeqCst),
        0,
        "the read-back failed"
    );
    assert!(!node_may_get_secret(&admin, "n2", "default", "mounted").await);
    assert!(!node_may_get_secret(&admin, "n3", "default", "mounted").await);
    store.fail_lists.store(false, Ordering::SeqCst);
    assert!(node_may_get_secret(&admin, "n2", "default", "mounted").await);
    assert!(node_may_get_secret(&admin, "n3", "default", "mounted").await);
    assert!(!node_may_get_secret(&admin, "n1", "default", "mounted").await);
}
