//! Authorization as kube-apiserver's `--authorization-mode=Node,RBAC` with NodeRestriction:
//! RBAC served and enforced, the default bootstrap policy, the Node authorizer, the
//! access reviews and impersonation. Every client acts as a user through
//! `ApiServer::router_as` (in-process, no TLS).

use std::sync::Arc;

use axum::{Router, body::Body};
use core_cluster::{
    ApiServer, ApiServerConfig,
    auth::{UserInfo, node::node_user},
    store::MemoryStore,
};
use http_body_util::BodyExt;
use k8s_openapi::api::{
    authorization::v1::{SelfSubjectAccessReview, SelfSubjectRulesReview},
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tower::ServiceExt;

async fn server() -> ApiServer {
    ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap()
}

fn client_as(server: &ApiServer, user: UserInfo) -> Client {
    Client::new(server.router_as(user), "default")
}

fn admin(server: &ApiServer) -> Client {
    Client::new(server.router(), "default")
}

fn alice() -> UserInfo {
    UserInfo::new("alice", ["dev"])
}

/// A raw request: (status, JSON body).
async fn raw(
    router: &Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Value,
) -> (u16, Value) {
    let mut builder = axum::http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let body = if body.is_null() {
        Body::empty()
    } else {
        builder = builder.header("content-type", "application/json");
        Body::from(body.to_string())
    };
    let response = router
        .clone()
        .oneshot(builder.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn kube_status(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    }
}

fn node(name: &str) -> Node {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}),
    )
    .unwrap()
}

async fn can_i(client: &Client, verb: &str, resource: &str, ns: &str) -> bool {
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({
        "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "namespace": ns}}
    }))
    .unwrap();
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    api.create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
        .allowed
}

/// Upstream: a user with no bindings is forbidden, with `forbiddenMessage`'s wording, and
/// `kubectl auth can-i` (a SelfSubjectAccessReview, allowed by system:basic-user) says no.
#[tokio::test]
async fn user_without_bindings_gets_403_and_can_i_says_no() {
    let server = server().await;
    let alice = client_as(&server, alice());
    let nodes: Api<Node> = Api::all(alice.clone());
    let (code, message) = kube_status(nodes.get("n1").await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes "n1" is forbidden: User "alice" cannot get resource "nodes" in API group "" at the cluster scope"#
    );
    let (code, message) = kube_status(nodes.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope"#
    );
    let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
    let (_, message) = kube_status(cms.list(&ListParams::default()).await.unwrap_err());
    assert!(
        message.ends_with(
            r#"cannot list resource "configmaps" in API group "" in the namespace "default""#
        ),
        "{message}"
    );
    assert!(!can_i(&alice, "get", "nodes", "").await);
    // system:discovery and system:public-info-viewer: authenticated users read discovery.
    let router = server.router_as(UserInfo::new("alice", ["dev"]));
    assert_eq!(raw(&router, "GET", "/api", &[], Value::Null).await.0, 200);
    assert_eq!(
        raw(&router, "GET", "/version", &[], Value::Null).await.0,
        200
    );
    let (code, body) = raw(&router, "GET", "/metrics", &[], Value::Null).await;
    assert_eq!(code, 403);
    assert_eq!(
        body["message"],
        r#"forbidden: User "alice" cannot get path "/metrics""#
    );
    // Anonymous: public info only.
    let anon = server.router_as(UserInfo::anonymous());
    assert_eq!(raw(&anon, "GET", "/healthz", &[], Value::Null).await.0, 200);
    assert_eq!(raw(&anon, "GET", "/api", &[], Value::Null).await.0, 403);
}

/// A RoleBinding grants exactly its Role's verbs, in its namespace only; removing the
/// binding takes the access away at once.
#[tokio::test]
async fn role_binding_grants_exactly_its_verbs() {
    let server = server().await;
    let admin = admin(&server);
    let roles: Api<Role> = Api::namespaced(admin.clone(), "default");
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]
    }))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "default");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "alice-reads"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"kind": "User", "name": "alice"}]
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}})).unwrap();
    admin_cms.create(&PostParams::default(), &cm).await.unwrap();

    let alice = client_as(&server, alice());
    let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
    assert_eq!(cms.get("c").await.unwrap().data.unwrap()["k"], "v");
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let (code, message) = kube_status(cms.delete("c", &Default::default()).await.unwrap_err());
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"configmaps "c" is forbidden: User "alice" cannot delete resource "configmaps" in API group "" in the namespace "default""#
    );
    let (code, _) = kube_status(
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 403);
    let other: Api<ConfigMap> = Api::namespaced(alice.clone(), "kube-system");
    assert_eq!(
        kube_status(other.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    assert!(can_i(&alice, "list", "configmaps", "default").await);
    assert!(!can_i(&alice, "list", "configmaps", "kube-system").await);
    assert!(!can_i(&alice, "update", "configmaps", "default").await);

    bindings
        .delete("alice-reads", &Default::default())
        .await
        .unwrap();
    assert_eq!(kube_status(cms.get("c").await.unwrap_err()).0, 403);
}

/// Upstream RBAC validation: a rule without verbs is Invalid, roleRef cannot change.
#[tokio::test]
async fn rbac_objects_are_validated() {
    let server = server().await;
    let admin = admin(&server);
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let bad: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "bad"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": []}]
    }))
    .unwrap();
    let (code, message) = kube_status(
        roles
            .create(&PostParams::default(), &bad)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("rules[0].verbs: Required value: verbs must contain at least one value"),
        "{message}"
    );
    let crbs: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "ops-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "Group", "name": "ops", "apiGroup": "rbac.authorization.k8s.io"}]
    }))
    .unwrap();
    crbs.create(&PostParams::default(), &crb).await.unwrap();
    let (code, message) = kube_status(
        crbs.patch(
            "ops-view",
            &PatchParams::default(),
            &Patch::Merge(json!({"roleRef": {"name": "edit"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(message.contains("cannot change roleRef"), "{message}");
    // The default policy is there, labelled as upstream's.
    let view = roles.get("view").await.unwrap();
    assert_eq!(
        view.metadata.labels.unwrap()["kubernetes.io/bootstrapping"],
        "rbac-defaults"
    );
    let admin_binding = crbs.get("cluster-admin").await.unwrap();
    assert_eq!(admin_binding.subjects.unwrap()[0].name, "system:masters");
    // The group bound to view reads pods everywhere but does not write them.
    let bob = client_as(&server, UserInfo::new("bob", ["ops"]));
    let pods: Api<Pod> = Api::all(bob.clone());
    pods.list(&ListParams::default()).await.unwrap();
    assert!(!can_i(&bob, "delete", "pods", "default").await);
}

/// Upstream's `SetDefaults_Subject` (rbac/v1 defaults) runs on every decoded write, so a
/// subject without `apiGroup` is defaulted on an update or a patch as on a create: User and
/// Group get `rbac.authorization.k8s.io`, ServiceAccount `""`.
#[tokio::test]
async fn binding_subjects_get_their_api_group_defaulted_on_update_and_patch() {
    let server = server().await;
    let admin = admin(&server);
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "default");
    let binding = |subjects: Value| -> RoleBinding {
        serde_json::from_value(json!({
            "metadata": {"name": "devs"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": subjects,
        }))
        .unwrap()
    };
    let groups = |b: &RoleBinding| -> Vec<(String, String)> {
        b.subjects
            .iter()
            .flatten()
            .map(|s| {
                (
                    s.name.clone(),
                    s.api_group.clone().unwrap_or_else(|| "<none>".into()),
                )
            })
            .collect()
    };
    let created = bindings
        .create(
            &PostParams::default(),
            &binding(json!([{"kind": "User", "name": "alice"}])),
        )
        .await
        .unwrap();
    assert_eq!(
        groups(&created),
        [("alice".into(), "rbac.authorization.k8s.io".into())]
    );

    // PUT with a new Group subject and no apiGroup.
    let mut replaced = binding(json!([
        {"kind": "User", "name": "alice"},
        {"kind": "Group", "name": "dev"},
    ]));
    replaced.metadata.resource_version = created.metadata.resource_version.clone();
    let replaced = bindings
        .replace("devs", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(
        groups(&replaced),
        [
            ("alice".into(), "rbac.authorization.k8s.io".into()),
            ("dev".into(), "rbac.authorization.k8s.io".into()),
        ]
    );

    // A merge patch adding a ServiceAccount and a User, neither with an apiGroup.
    let patched = bindings
        .patch(
            "devs",
            &PatchParams::default(),
            &Patch::Merge(json!({"subjects": [
                {"kind": "User", "name": "bob"},
                {"kind": "ServiceAccount", "name": "builder", "namespace": "default"},
            ]})),
        )
        .await
        .unwrap();
    assert_eq!(
        groups(&patched),
        [
            ("bob".into(), "rbac.authorization.k8s.io".into()),
            ("builder".into(), "".into()),
        ]
    );
    // The defaulted subject grants what it says: bob reads pods in default.
    let bob = client_as(&server, UserInfo::new("bob", Vec::<String>::new()));
    assert!(can_i(&bob, "list", "pods", "default").await);
}

/// Upstream's Node authorizer (`authorizeLease`) and NodeRestriction (`admitNode`): a node
/// writes its own Node and Lease, not another node's, and sets no
/// `node-restriction.kubernetes.io/` labels.
#[tokio::test]
async fn a_node_cannot_patch_another_node_or_its_lease() {
    let server = server().await;
    let n1 = client_as(&server, node_user("n1"));
    let n2 = client_as(&server, node_user("n2"));
    let nodes1: Api<Node> = Api::all(n1.clone());
    let nodes2: Api<Node> = Api::all(n2.clone());
    nodes1
        .create(&PostParams::default(), &node("n1"))
        .await
        .unwrap();
    nodes2
        .create(&PostParams::default(), &node("n2"))
        .await
        .unwrap();
    let (code, message) = kube_status(
        nodes1
            .create(&PostParams::default(), &node("n3"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            r#"nodes "n3" is forbidden: node "n1" is not allowed to modify node "n3""#
        )
    );
    let patch = Patch::Merge(json!({"metadata": {"labels": {"example.com/x": "y"}}}));
    nodes1
        .patch("n1", &PatchParams::default(), &patch)
        .await
        .unwrap();
    let (code, message) = kube_status(
        nodes1
            .patch("n2", &PatchParams::default(), &patch)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            r#"nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2""#
        )
    );
    let status = Patch::Merge(json!({"status": {"phase": "Running"}}));
    assert_eq!(
        kube_status(
            nodes1
                .patch_status("n2", &PatchParams::default(), &status)
                .await
                .unwrap_err()
        )
        .0,
        403
    );
    nodes1
        .patch_status("n1", &PatchParams::default(), &status)
        .await
        .unwrap();
    let restricted = Patch::Merge(
        json!({"metadata": {"labels": {"node-restriction.kubernetes.io/pool": "db"}}}),
    );
    let (code, message) = kube_status(
        nodes1
            .patch("n1", &PatchParams::default(), &restricted)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            r#"nodes "n1" is forbidden: is not allowed to modify labels: node-restriction.kubernetes.io/pool"#
        )
    );
    // Nodes may not delete Nodes at all (not in NodeRules).
    assert_eq!(
        kube_status(nodes1.delete("n1", &Default::default()).await.unwrap_err()).0,
        403
    );

    let lease = |name: &str| -> Lease {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}})).unwrap()
    };
    let leases1: Api<Lease> = Api::namespaced(n1.clone(), "kube-node-lease");
    let leases2: Api<Lease> = Api::namespaced(n2.clone(), "kube-node-lease");
    leases1
        .create(&PostParams::default(), &lease("n1"))
        .await
        .unwrap();
    leases2
        .create(&PostParams::default(), &lease("n2"))
        .await
        .unwrap();
    let (code, message) = kube_status(
        leases1
            .create(&PostParams::default(), &lease("n9"))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(
        message.ends_with("can only access node lease with the same name as the requesting node"),
        "{message}"
    );
    let renew = Patch::Merge(json!({"spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}}));
    leases1
        .patch("n1", &PatchParams::default(), &renew)
        .await
        .unwrap();
    let (code, message) = kube_status(
        leases1
            .patch("n2", &PatchParams::default(), &renew)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert_eq!(
        message,
        r#"leases.coordination.k8s.io "n2" is forbidden: User "system:node:n1" cannot patch resource "leases" in API group "coordination.k8s.io" in the namespace "kube-node-lease": can only access node lease with the same name as the requesting node"#
    );
    let elsewhere: Api<Lease> = Api::namespaced(n1.clone(), "default");
    assert_eq!(kube_status(elsewhere.get("n1").await.unwrap_err()).0, 403);
}

/// NodeRestriction `admitPodStatus`/`admitPod`: a node updates the status of pods bound to
/// it only, and creates only mirror pods.
#[tokio::test]
async fn a_node_updates_only_pods_bound_to_it() {
    let server = server().await;
    let admin_pods: Api<Pod> = Api::namespaced(admin(&server), "default");
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        admin_pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
    let pods: Api<Pod> = Api::namespaced(client_as(&server, node_user("n1")), "default");
    let status = Patch::Merge(json!({"status": {"phase": "Running"}}));
    pods.patch_status("p1", &PatchParams::default(), &status)
        .await
        .unwrap();
    let (code, message) = kube_status(
        pods.patch_status("p2", &PatchParams::default(), &status)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (
            403,
            r#"pods "p2" is forbidden: node "n1" can only update pod status for pods with spec.nodeName set to itself"#
        )
    );
    let (code, _) = kube_status(pods.delete("p2", &Default::default()).await.unwrap_err());
    assert_eq!(code, 403);
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p3"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}
    }))
    .unwrap();
    let (code, message) = kube_status(
        pods.create(&PostParams::default(), &plain)
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 403);
    assert!(message.contains("can only create mirror pods"), "{message}");
}

/// `kubectl auth can-i --as`: SubjectAccessReview for another user, and impersonation
/// allowed only with the `impersonate` verb.
#[tokio::test]
async fn reviews_and_impersonation() {
    let server = server().await;
    let root = server.router();
    let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": "alice", "groups": ["dev"],
                 "resourceAttributes": {"verb": "get", "resource": "nodes"}}});
    let (code, body) = raw(
        &root,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        &[],
        sar.clone(),
    )
    .await;
    assert_eq!(code, 201);
    assert_eq!(body["status"]["allowed"], false);
    let mut sar_admin = sar.clone();
    sar_admin["spec"]["groups"] = json!(["system:masters"]);
    let (_, body) = raw(
        &root,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        &[],
        sar_admin,
    )
    .await;
    assert_eq!(body["status"]["allowed"], true);
    // alice may not create SubjectAccessReviews herself.
    let alice_router = server.router_as(alice());
    let (code, _) = raw(
        &alice_router,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        &[],
        sar,
    )
    .await;
    assert_eq!(code, 403);
    // The superuser impersonates alice: she cannot get nodes.
    let (code, body) = raw(
        &root,
        "GET",
        "/api/v1/nodes",
        &[("Impersonate-User", "alice")],
        Value::Null,
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        body["message"],
        r#"nodes is forbidden: User "alice" cannot list resource "nodes" in API group "" at the cluster scope"#
    );
    // alice may not impersonate anyone.
    let (code, body) = raw(
        &alice_router,
        "GET",
        "/api/v1/nodes",
        &[("Impersonate-User", "bob")],
        Value::Null,
    )
    .await;
    assert_eq!(code, 403);
    assert_eq!(
        body["message"],
        r#"users "bob" is forbidden: User "alice" cannot impersonate resource "users" in API group "" at the cluster scope"#
    );
    // Rules review: alice has the basic-user rules and discovery URLs.
    let rules: Api<SelfSubjectRulesReview> = Api::all(client_as(&server, alice()));
    let review: SelfSubjectRulesReview =
        serde_json::from_value(json!({"spec": {"namespace": "default"}})).unwrap();
    let status = rules
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(status.resource_rules.iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|r| r.contains(&"selfsubjectaccessreviews".to_owned()))
    }));
    assert!(status.non_resource_rules.iter().any(|r| {
        r.non_resource_urls
            .as_ref()
            .is_some_and(|u| u.contains(&"/api".to_owned()))
    }));
    assert!(!status.resource_rules.iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|r| r.contains(&"nodes".to_owned()))
    }));
}

/// Each simulated kubelet acts through its own client: with node identities the nodes
/// register and renew their own Leases; a kubelet given another node's identity is refused
/// (NodeRestriction) and its node never appears.
#[tokio::test(start_paused = true)]
async fn simulated_kubelets_act_as_their_own_nodes() {
    use core_cluster::sim::{NodeSimulator, SimConfig};
    let server = server().await;
    let per_node = server.clone();
    let sim = NodeSimulator::new(
        admin(&server),
        SimConfig::default().external_cloud_provider(),
    )
    .with_node_clients(Arc::new(move |name: &str| {
        // "impostor" runs with n1's identity.
        let identity = if name == "impostor" { "n1" } else { name };
        Client::new(per_node.router_as(node_user(identity)), "default")
    }));
    sim.add_nodes(["n1", "n2", "impostor"]);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    for _ in 0..100 {
        if sim.stats().registered >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    let nodes: Api<Node> = Api::all(admin(&server));
    let mut names: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    names.sort();
    assert_eq!(names, ["n1", "n2"], "stats: {:?}", sim.stats());
    let leases: Api<Lease> = Api::namespaced(admin(&server), "kube-node-lease");
    for n in ["n1", "n2"] {
        let lease = leases.get(n).await.unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(n));
    }
    stop.cancel();
}

/// Upstream's rule resolver (`pkg/registry/rbac/validation/rule.go VisitRulesFor`) decides
/// against the bindings and roles as they are now, whoever wrote them: a RoleBinding and a
/// Role written by `ApiServer::apply_manifest` (which no request carries) take effect on the
/// very next request, as does their replacement. Time is paused and never advanced.
#[tokio::test(start_paused = true)]
async fn rbac_written_by_apply_manifest_takes_effect_on_the_next_request() {
    let server = server().await;
    let started = tokio::time::Instant::now();
    let alice = client_as(&server, alice());
    let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
    assert_eq!(
        kube_status(cms.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    let manifest = |verbs: &str, user: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n\
             metadata: {{name: cm-reader, namespace: default}}\n\
             rules: [{{apiGroups: [''], resources: [configmaps], verbs: [{verbs}]}}]\n\
             ---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
             metadata: {{name: cm-readers, namespace: default}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}}\n\
             subjects: [{{kind: User, name: {user}}}]\n"
        )
    };
    let kinds = ["Role", "RoleBinding"];
    assert_eq!(
        server
            .apply_manifest(&manifest("list", "alice"), &kinds)
            .await
            .unwrap(),
        2
    );
    assert!(cms.list(&ListParams::default()).await.is_ok());
    // Replaced: the Role no longer grants `list`…
    server
        .apply_manifest(&manifest("get", "alice"), &kinds)
        .await
        .unwrap();
    assert_eq!(
        kube_status(cms.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    // …and the binding names bob instead of alice.
    server
        .apply_manifest(&manifest("list", "bob"), &kinds)
        .await
        .unwrap();
    assert_eq!(
        kube_status(cms.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    let bob = client_as(&server, UserInfo::new("bob", ["dev"]));
    let bob_cms: Api<ConfigMap> = Api::namespaced(bob, "default");
    assert!(bob_cms.list(&ListParams::default()).await.is_ok());
    assert_eq!(started.elapsed(), std::time::Duration::ZERO);
}

/// Upstream's namespace controller (`pkg/controller/namespace/deletion`) deletes the
/// RoleBindings of a deleted namespace, and `VisitRulesFor` stops granting them: the
/// binding no longer grants on the first request after it is gone, without waiting for a
/// refresh. Time is paused; only the cleanup's own one-second retry advances it.
#[tokio::test(start_paused = true)]
async fn a_role_binding_removed_by_namespace_deletion_stops_granting_at_once() {
    use k8s_openapi::api::core::v1::Namespace;
    let server = server().await;
    let admin = admin(&server);
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "t2"}})).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), "t2");
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "alice-views"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "User", "name": "alice"}]
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let alice_pods: Api<Pod> = Api::namespaced(client_as(&server, alice()), "t2");
    assert!(alice_pods.list(&ListParams::default()).await.is_ok());

    let started = tokio::time::Instant::now();
    namespaces.delete("t2", &Default::default()).await.unwrap();
    while bindings.get_opt("alice-views").await.unwrap().is_some() {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        kube_status(alice_pods.list(&ListParams::default()).await.unwrap_err()).0,
        403
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
