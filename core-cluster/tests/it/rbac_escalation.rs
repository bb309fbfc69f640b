//! RBAC privilege-escalation prevention as kube-apiserver's RBAC storage
//! (`pkg/registry/rbac/*/policybased`): creating or updating a Role or ClusterRole needs every
//! permission it grants (`ConfirmNoEscalation`) or the `escalate` verb
//! (`RoleEscalationAuthorized`); a RoleBinding or ClusterRoleBinding needs the referenced role's
//! permissions in the binding's namespace or the `bind` verb on that role
//! (`BindingAuthorized`); `system:masters` is exempt (`EscalationAllowed`). Clients act as
//! users through `ApiServer::router_as` (in-process, no TLS).

use std::sync::Arc;

use core_cluster::{ApiServer, ApiServerConfig, auth::UserInfo, store::MemoryStore};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const RBAC: &str = "rbac.authorization.k8s.io";
const NS: &str = "team";

async fn server() -> ApiServer {
    ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap()
}

fn object<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn alice() -> UserInfo {
    UserInfo::new("alice", ["dev"])
}

fn role(name: &str, rules: Value) -> Role {
    object(json!({"metadata": {"name": name}, "rules": rules}))
}

fn binding(name: &str, kind: &str, role: &str, user: &str) -> RoleBinding {
    object(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC, "kind": kind, "name": role},
        "subjects": [{"kind": "User", "name": user}]
    }))
}

/// The code and message of a refused request.
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(s)) => (s.code, s.message),
        other => panic!("not refused by the API: {other:?}"),
    }
}

/// The message of a request refused with 403.
fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    let (code, message) = refused(result);
    assert_eq!(code, 403, "{message}");
    message
}

/// The 403 upstream's `ConfirmNoEscalation` gives alice, for `missing` (one rule per line).
fn not_held(resource: &str, name: &str, missing: &[&str]) -> String {
    format!(
        "{resource}.{RBAC} \"{name}\" is forbidden: user \"alice\" (groups=[\"dev\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{}",
        missing.join("\n")
    )
}

/// The admin creates namespace `team`'s "manager" Role for alice (RBAC writes, pods read)
/// plus `extra` rules, and binds it to her.
async fn manager(server: &ApiServer, extra: Value) {
    let admin = Client::new(server.router(), "default");
    let mut rules = json!([
        {"apiGroups": [RBAC], "resources": ["roles", "rolebindings"], "verbs": ["create", "update", "patch", "get"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    ]);
    rules
        .as_array_mut()
        .unwrap()
        .extend(extra.as_array().cloned().unwrap_or_default());
    let roles: Api<Role> = Api::namespaced(admin.clone(), NS);
    roles
        .create(&PostParams::default(), &role("manager", rules))
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin, NS);
    bindings
        .create(
            &PostParams::default(),
            &binding("manager", "Role", "manager", "alice"),
        )
        .await
        .unwrap();
}

async fn with_namespace() -> ApiServer {
    let server = server().await;
    let admin = Client::new(server.router(), "default");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin);
    namespaces
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": NS}})),
        )
        .await
        .unwrap();
    server
}

/// Upstream `ConfirmNoEscalation`: a Role may grant only what its creator holds; a refused
/// Role is not stored, and the 403 lists the missing rules in `CompactString` form.
#[tokio::test]
async fn a_role_may_grant_only_permissions_its_creator_holds() {
    let server = with_namespace().await;
    manager(&server, json!([])).await;
    let roles: Api<Role> = Api::namespaced(Client::new(server.router_as(alice()), "default"), NS);

    let reader = role(
        "pod-reader",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
    );
    roles.create(&PostParams::default(), &reader).await.unwrap();

    let deleter = role(
        "pod-deleter",
        json!([{"apiGroups": [""], "resources": ["pods", "secrets"], "verbs": ["get", "delete"]}]),
    );
    let message = forbidden(roles.create(&PostParams::default(), &deleter).await);
    assert_eq!(
        message,
        not_held(
            "roles",
            "pod-deleter",
            &[
                r#"{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}"#,
                r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get" "delete"]}"#,
            ]
        )
    );
    let admin_roles: Api<Role> = Api::namespaced(Client::new(server.router(), "default"), NS);
    assert!(admin_roles.get_opt("pod-deleter").await.unwrap().is_none());

    // Updates too: adding a rule alice lacks to her own Role is refused, by patch or PUT.
    let message = forbidden(roles
            .patch(
                "pod-reader",
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]}]})),
            )
            .await);
    assert_eq!(
        message,
        not_held(
            "roles",
            "pod-reader",
            &[r#"{APIGroups:["apps"], Resources:["deployments"], Verbs:["get"]}"#]
        )
    );
    let stored = admin_roles.get("pod-reader").await.unwrap();
    assert_eq!(
        stored.rules.unwrap()[0].resources.as_deref(),
        Some(&["pods".to_owned()][..])
    );

    // The superuser group is exempt (`EscalationAllowed`).
    admin_roles
        .create(&PostParams::default(), &deleter)
        .await
        .unwrap();
}

/// Upstream `RoleEscalationAuthorized`: the `escalate` verb on roles lets a user grant what
/// they do not hold.
#[tokio::test]
async fn the_escalate_verb_allows_granting_more() {
    let server = with_namespace().await;
    manager(
        &server,
        json!([{"apiGroups": [RBAC], "resources": ["roles"], "verbs": ["escalate"]}]),
    )
    .await;
    let roles: Api<Role> = Api::namespaced(Client::new(server.router_as(alice()), "default"), NS);
    let secrets = role(
        "secret-admin",
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]),
    );
    let created = roles
        .create(&PostParams::default(), &secrets)
        .await
        .unwrap();
    assert_eq!(created.rules.unwrap()[0].verbs, ["*"]);
}

/// Upstream `BindingAuthorized` and the rolebinding storage: binding a role needs its
/// permissions in the binding's namespace, or `bind` on that role by name; a binding to a
/// missing role is a 404 for a user who may not bind it.
#[tokio::test]
async fn a_binding_needs_the_roles_permissions_or_the_bind_verb() {
    let server = with_namespace().await;
    manager(
        &server,
        json!([{"apiGroups": [RBAC], "resources": ["clusterroles"], "verbs": ["bind"], "resourceNames": ["view"]}]),
    )
    .await;
    let admin = Client::new(server.router(), "default");
    let admin_roles: Api<Role> = Api::namespaced(admin.clone(), NS);
    admin_roles
        .create(
            &PostParams::default(),
            &role(
                "pod-reader",
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]),
            ),
        )
        .await
        .unwrap();
    admin_roles
        .create(
            &PostParams::default(),
            &role(
                "secret-reader",
                json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
            ),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> =
        Api::namespaced(Client::new(server.router_as(alice()), "default"), NS);
    let create = |b: RoleBinding| {
        let bindings = bindings.clone();
        async move { bindings.create(&PostParams::default(), &b).await }
    };

    // Alice holds `list pods` in the namespace: she may hand it on.
    create(binding("bob-pods", "Role", "pod-reader", "bob"))
        .await
        .unwrap();
    // Not `get secrets`.
    let message = forbidden(create(binding("bob-secrets", "Role", "secret-reader", "bob")).await);
    assert_eq!(
        message,
        not_held(
            "rolebindings",
            "bob-secrets",
            &[r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}"#]
        )
    );
    // `bind` on the ClusterRole "view" by name: allowed without holding its rules…
    create(binding("bob-view", "ClusterRole", "view", "bob"))
        .await
        .unwrap();
    // …and only that one.
    let message = forbidden(create(binding("bob-edit", "ClusterRole", "edit", "bob")).await);
    assert!(
        message.starts_with(
            "rolebindings.rbac.authorization.k8s.io \"bob-edit\" is forbidden: user \"alice\" (groups=[\"dev\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n"
        ),
        "{message}"
    );
    let (code, _) = refused(create(binding("bob-ghost", "Role", "no-such-role", "bob")).await);
    assert_eq!(code, 404);
    let admin_bindings: Api<RoleBinding> = Api::namespaced(admin, NS);
    for refused in ["bob-secrets", "bob-edit", "bob-ghost"] {
        assert!(
            admin_bindings.get_opt(refused).await.unwrap().is_none(),
            "{refused} stored"
        );
    }

    // An update is checked again (upstream checks every update but one of garbage-collection
    // fields only): `bind view` still holds, so alice may change the subjects.
    let patched = bindings
        .patch(
            "bob-view",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"subjects": [{"apiGroup": RBAC, "kind": "User", "name": "carol"}]}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.subjects.unwrap()[0].name, "carol");
}

/// Upstream `IsOnlyMutatingGCFields`: a user who cannot grant a binding's role may still
/// change only its finalizers or owner references, but not its labels.
#[tokio::test]
async fn updates_of_garbage_collection_fields_alone_are_not_checked() {
    let server = with_namespace().await;
    manager(&server, json!([])).await;
    let admin = Client::new(server.router(), "default");
    Api::<RoleBinding>::namespaced(admin, NS)
        .create(
            &PostParams::default(),
            &binding("admins", "ClusterRole", "admin", "bob"),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> =
        Api::namespaced(Client::new(server.router_as(alice()), "default"), NS);
    bindings
        .patch(
            "admins",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/keep"]}})),
        )
        .await
        .unwrap();
    let message = forbidden(
        bindings
            .patch(
                "admins",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
            )
            .await,
    );
    assert!(
        message.contains("is attempting to grant RBAC permissions not currently held"),
        "{message}"
    );
}

/// ClusterRoles and ClusterRoleBindings: only cluster-wide grants count (upstream resolves the
/// owner's rules with no namespace).
#[tokio::test]
async fn cluster_roles_count_only_cluster_wide_grants() {
    let server = with_namespace().await;
    let admin = Client::new(server.router(), "default");
    // Alice may write ClusterRoles and ClusterRoleBindings, list nodes cluster-wide, and get
    // secrets in `team` only.
    let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
    cluster_roles
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "rbac-writer"}, "rules": [
                {"apiGroups": [RBAC], "resources": ["clusterroles", "clusterrolebindings"], "verbs": ["create"]},
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
            ]})),
        )
        .await
        .unwrap();
    let crb: ClusterRoleBinding = object(json!({
        "metadata": {"name": "alice-rbac-writer"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "rbac-writer"},
        "subjects": [{"kind": "User", "name": "alice"}]
    }));
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    manager(
        &server,
        json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
    )
    .await;

    let alice = Client::new(server.router_as(alice()), "default");
    let alice_cluster_roles: Api<ClusterRole> = Api::all(alice.clone());
    alice_cluster_roles
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "node-lister"}, "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}
            ]})),
        )
        .await
        .unwrap();
    // `get secrets` is hers in `team` only, not cluster-wide.
    let message = forbidden(
        alice_cluster_roles
            .create(
                &PostParams::default(),
                &object(json!({"metadata": {"name": "secret-getter"}, "rules": [
                    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
                    {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}
                ]})),
            )
            .await,
    );
    assert_eq!(
        message,
        not_held(
            "clusterroles",
            "secret-getter",
            &[
                r#"{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}"#,
                r#"{NonResourceURLs:["/metrics"], Verbs:["get"]}"#,
            ]
        )
    );
    let bind_all: ClusterRoleBinding = object(json!({
        "metadata": {"name": "bob-cluster-admin"},
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "name": "bob"}]
    }));
    let message = forbidden(
        Api::<ClusterRoleBinding>::all(alice)
            .create(&PostParams::default(), &bind_all)
            .await,
    );
    assert_eq!(
        message,
        not_held(
            "clusterrolebindings",
            "bob-cluster-admin",
            &[
                r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#,
                r#"{NonResourceURLs:["*"], Verbs:["*"]}"#,
            ]
        )
    );
}

/// Namespace `t1` with alice bound to the default `admin` ClusterRole there by a RoleBinding:
/// the usual namespace-admin tenant, who may create Roles but not `escalate`.
async fn tenant() -> ApiServer {
    let server = server().await;
    let admin = Client::new(server.router(), "default");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &object(json!({"metadata": {"name": "t1"}})),
        )
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin, "t1")
        .create(
            &PostParams::default(),
            &binding("alice-admin", "ClusterRole", "admin", "alice"),
        )
        .await
        .unwrap();
    server
}

/// Upstream `ConfirmNoEscalation` (`Covers` over `BreakdownRule`'s parts, `CompactRules`): a
/// 3 KB Role whose one rule lists 100 groups, resources, verbs and names has 10^8 parts. It
/// is refused with a 403 of bounded size that names the first 100 missing parts and counts
/// the rest, without building the parts; the server goes on serving.
#[tokio::test]
async fn a_role_with_a_hundred_of_everything_is_refused_with_a_bounded_message() {
    let server = tenant().await;
    let roles: Api<Role> = Api::namespaced(Client::new(server.router_as(alice()), "default"), "t1");
    let list = |p: &str| (0..100).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
    let bomb = role(
        "bomb",
        json!([{"apiGroups": list("g"), "resources": list("r"), "verbs": list("v"),
                "resourceNames": list("n")}]),
    );
    assert!(serde_json::to_vec(&bomb).unwrap().len() < 3_000);
    let message = forbidden(roles.create(&PostParams::default(), &bomb).await);
    assert!(message.len() < 10_000, "{} bytes", message.len());
    let lines: Vec<&str> = message.lines().collect();
    assert_eq!(lines.len(), 102, "{message}");
    assert_eq!(lines[0], not_held("roles", "bomb", &[]).trim_end());
    assert_eq!(
        lines[1],
        r#"{APIGroups:["g0"], Resources:["r0"], ResourceNames:["n0"], Verbs:["v0"]}"#
    );
    assert_eq!(lines[101], "and 99999900 more");

    // Still serving: the Role was not stored, and alice may create one she holds.
    let admin_roles: Api<Role> = Api::namespaced(Client::new(server.router(), "default"), "t1");
    assert!(admin_roles.get_opt("bomb").await.unwrap().is_none());
    roles
        .create(
            &PostParams::default(),
            &role(
                "reader",
                json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]),
            ),
        )
        .await
        .unwrap();
}

/// Upstream's RBAC authorizer reads informer-fed indexes updated one object at a time, so
/// many Roles cost a constant amount each. Alice creates 200 Roles of 40 rules (about 5 KB
/// each) in a row, every one checked by `ConfirmNoEscalation` against her current grants;
/// each is stored, and a binding to any one of them grants exactly its rules at once.
#[tokio::test]
async fn a_tenant_creates_many_roles_and_each_grants_exactly_its_rules() {
    const ROLES_CREATED: usize = 200;
    let server = tenant().await;
    let alice_client = Client::new(server.router_as(alice()), "default");
    let roles: Api<Role> = Api::namespaced(alice_client.clone(), "t1");
    let rules = |i: usize| {
        let rules: Vec<Value> = (0..40)
            .map(|j| {
                json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                       "resourceNames": [format!("cm-{i}-{j}")]})
            })
            .collect();
        Value::Array(rules)
    };
    for i in 0..ROLES_CREATED {
        roles
            .create(
                &PostParams::default(),
                &role(&format!("role-{i}"), rules(i)),
            )
            .await
            .unwrap();
    }
    let admin_roles: Api<Role> = Api::namespaced(Client::new(server.router(), "default"), "t1");
    let stored = admin_roles
        .list(&kube::api::ListParams::default())
        .await
        .unwrap();
    assert_eq!(stored.items.len(), ROLES_CREATED);

    let bindings: Api<RoleBinding> = Api::namespaced(alice_client, "t1");
    bindings
        .create(
            &PostParams::default(),
            &binding("bob-137", "Role", "role-137", "bob"),
        )
        .await
        .unwrap();
    let bob: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(
        Client::new(server.router_as(UserInfo::new("bob", ["dev"])), "default"),
        "t1",
    );
    // Authorized (the ConfigMap does not exist) for role-137's names, refused for others'.
    let (code, _) = refused(bob.get("cm-137-39").await);
    assert_eq!(code, 404);
    let (code, _) = refused(bob.get("cm-136-39").await);
    assert_eq!(code, 403);
}
