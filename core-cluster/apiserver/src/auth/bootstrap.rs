//! The default RBAC policy, reconciled at every start as kube-apiserver's bootstrap policy
//! (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`), aggregation-free and
//! limited to the resources served here plus the well-known ones kubectl asks about.
//!
//! Every object carries `kubernetes.io/bootstrapping: rbac-defaults` and
//! `rbac.authorization.kubernetes.io/autoupdate: "true"`. At start a missing object is
//! created; an existing one with `autoupdate: "true"` gets the rules and subjects it lacks
//! (what an operator added stays); one with `autoupdate: "false"` is left alone.

use serde_json::{Value, json};

use super::{
    GROUP_AUTHENTICATED, GROUP_MASTERS, GROUP_UNAUTHENTICATED, node::node_rules, rbac::Rule,
};
use crate::{
    registry::{
        ResourceDef,
        authorization::{CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, RBAC_GROUP},
    },
    storage::{
        ObjectKey, Storage, WriteContext, create::create_object, status::ApiError,
        update::update_object,
    },
};

/// The annotation that lets the server reconcile a default object.
pub const AUTOUPDATE_ANNOTATION: &str = "rbac.authorization.kubernetes.io/autoupdate";
/// The label of every default object.
pub const BOOTSTRAPPING_LABEL: &str = "kubernetes.io/bootstrapping";

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Value {
    json!({"verbs": verbs, "apiGroups": groups, "resources": resources})
}

fn urls(verbs: &[&str], urls: &[&str]) -> Value {
    json!({"verbs": verbs, "nonResourceURLs": urls})
}

fn metadata(name: &str) -> Value {
    json!({
        "name": name,
        "labels": {BOOTSTRAPPING_LABEL: "rbac-defaults"},
        "annotations": {AUTOUPDATE_ANNOTATION: "true"},
    })
}

fn cluster_role(name: &str, rules: Vec<Value>) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
           "metadata": metadata(name), "rules": rules})
}

fn binding_to_groups(name: &str, groups: &[&str]) -> Value {
    let subjects: Vec<Value> = groups
        .iter()
        .map(|g| json!({"kind": "Group", "apiGroup": RBAC_GROUP, "name": g}))
        .collect();
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": metadata(name),
           "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": name},
           "subjects": subjects})
}

fn view_rules() -> Vec<Value> {
    vec![
        rule(
            READ,
            &[""],
            &[
                "pods",
                "pods/status",
                "services",
                "services/status",
                "endpoints",
                "configmaps",
                "serviceaccounts",
                "events",
                "namespaces",
                "namespaces/status",
            ],
        ),
        rule(READ, &["discovery.k8s.io"], &["endpointslices"]),
        rule(READ, &["events.k8s.io"], &["events"]),
    ]
}

fn edit_rules() -> Vec<Value> {
    let mut rules = view_rules();
    rules.extend([
        rule(
            WRITE,
            &[""],
            &[
                "pods",
                "services",
                "endpoints",
                "configmaps",
                "secrets",
                "serviceaccounts",
                "events",
            ],
        ),
        rule(
            &["create"],
            &[""],
            &["pods/eviction", "serviceaccounts/token"],
        ),
        rule(READ, &[""], &["secrets"]),
        rule(WRITE, &["discovery.k8s.io"], &["endpointslices"]),
    ]);
    rules
}

fn admin_rules() -> Vec<Value> {
    let mut rules = edit_rules();
    let all: Vec<&str> = READ.iter().chain(WRITE).copied().collect();
    rules.extend([
        rule(&all, &[RBAC_GROUP], &["roles", "rolebindings"]),
        rule(
            &["create"],
            &["authorization.k8s.io"],
            &["localsubjectaccessreviews"],
        ),
    ]);
    rules
}

/// The default ClusterRoles (cluster-admin, admin, edit, view, system:basic-user,
/// system:discovery, system:public-info-viewer, system:node, system:kubelet-api-admin) and
/// ClusterRoleBindings.
pub fn default_policy() -> Vec<(&'static ResourceDef, Value)> {
    let node_rules: Vec<Value> = node_rules().iter().map(Rule::to_json).collect();
    let roles = [
        cluster_role(
            "cluster-admin",
            vec![rule(&["*"], &["*"], &["*"]), urls(&["*"], &["*"])],
        ),
        cluster_role("admin", admin_rules()),
        cluster_role("edit", edit_rules()),
        cluster_role("view", view_rules()),
        cluster_role(
            "system:basic-user",
            vec![
                rule(
                    &["create"],
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                ),
                rule(
                    &["create"],
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                ),
            ],
        ),
        cluster_role(
            "system:discovery",
            vec![urls(
                &["get"],
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
            )],
        ),
        cluster_role(
            "system:public-info-viewer",
            vec![urls(
                &["get"],
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
            )],
        ),
        cluster_role("system:node", node_rules),
        // Full use of the kubelet API: the role an API server's
        // `--kubelet-client-certificate` identity is bound to (bound by the installer, not
        // by default).
        cluster_role(
            "system:kubelet-api-admin",
            vec![
                rule(&["get", "list", "watch"], &[""], &["nodes"]),
                rule(&["proxy"], &[""], &["nodes"]),
                rule(
                    &["*"],
                    &[""],
                    &["nodes/proxy", "nodes/metrics", "nodes/stats", "nodes/log"],
                ),
            ],
        ),
    ];
    let bindings = [
        binding_to_groups("cluster-admin", &[GROUP_MASTERS]),
        binding_to_groups("system:basic-user", &[GROUP_AUTHENTICATED]),
        binding_to_groups("system:discovery", &[GROUP_AUTHENTICATED]),
        binding_to_groups(
            "system:public-info-viewer",
            &[GROUP_AUTHENTICATED, GROUP_UNAUTHENTICATED],
        ),
    ];
    roles
        .into_iter()
        .map(|r| (&CLUSTER_ROLES, r))
        .chain(bindings.into_iter().map(|b| (&CLUSTER_ROLE_BINDINGS, b)))
        .collect()
}

/// Appends the entries of `wanted[key]` missing from `current[key]`; whether any were.
fn add_missing(current: &mut Value, wanted: &Value, key: &str) -> bool {
    let missing: Vec<Value> = wanted[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| !current[key].as_array().is_some_and(|c| c.contains(w)))
        .cloned()
        .collect();
    if missing.is_empty() {
        return false;
    }
    match current[key].as_array_mut() {
        Some(list) => list.extend(missing),
        None => current[key] = Value::Array(missing),
    }
    true
}

/// Creates the default policy's missing objects and completes the auto-updated ones, as
/// the server itself, through the generic store's write path.
pub(crate) async fn reconcile(storage: &Storage) -> Result<(), ApiError> {
    let ctx = WriteContext::server();
    let reader = storage.reader();
    for (def, wanted) in default_policy() {
        let name = wanted["metadata"]["name"].as_str().unwrap_or("").to_owned();
        match reader.get(def, None, &name).await {
            Err(e) if e.code == 404 => {
                match create_object(storage, &ctx, def, None, wanted).await {
                    Ok(_) => tracing::debug!(%name, kind = def.kind, "created default RBAC"),
                    Err(e) if e.reason == "AlreadyExists" => {}
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
            Ok(mut current) => {
                if current["metadata"]["annotations"][AUTOUPDATE_ANNOTATION] != "true" {
                    continue;
                }
                let rules = add_missing(&mut current, &wanted, "rules");
                let subjects = add_missing(&mut current, &wanted, "subjects");
                if rules || subjects {
                    tracing::info!(%name, kind = def.kind, "reconciling default RBAC");
                    let key = ObjectKey::new(def, None, &name);
                    update_object(storage, &ctx, key, None, current).await?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream's bootstrap policy: the default roles exist, are labelled and bound to the
    /// system groups, and every rule passes RBAC validation.
    #[test]
    fn default_policy_is_valid_and_bound_as_upstream() {
        let policy = default_policy();
        let names: Vec<&str> = policy
            .iter()
            .filter(|(d, _)| d.kind == "ClusterRole")
            .map(|(_, o)| o["metadata"]["name"].as_str().unwrap())
            .collect();
        for want in [
            "cluster-admin",
            "admin",
            "edit",
            "view",
            "system:basic-user",
            "system:discovery",
            "system:public-info-viewer",
            "system:node",
            "system:kubelet-api-admin",
        ] {
            assert!(names.contains(&want), "{want} missing");
        }
        for (def, obj) in &policy {
            assert!((def.validate)(obj, None).is_empty(), "{obj}");
            assert_eq!(
                obj["metadata"]["labels"][BOOTSTRAPPING_LABEL],
                "rbac-defaults"
            );
            assert_eq!(
                obj["metadata"]["annotations"][AUTOUPDATE_ANNOTATION],
                "true"
            );
        }
        let public = policy
            .iter()
            .find(|(d, o)| {
                d.kind == "ClusterRoleBinding"
                    && o["metadata"]["name"] == "system:public-info-viewer"
            })
            .unwrap();
        assert_eq!(public.1["subjects"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn reconcile_adds_only_what_is_missing() {
        let mut current = json!({"rules": [{"verbs": ["x"]}]});
        let wanted = json!({"rules": [{"verbs": ["y"]}, {"verbs": ["x"]}]});
        assert!(add_missing(&mut current, &wanted, "rules"));
        assert_eq!(
            current["rules"],
            json!([{"verbs": ["x"]}, {"verbs": ["y"]}])
        );
        assert!(!add_missing(&mut current, &wanted, "rules"));
    }
}
