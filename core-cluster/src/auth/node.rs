//! What a kubelet may do: upstream's Node authorizer
//! (`plugin/pkg/auth/authorizer/node/node_authorizer.go`, with the bootstrap policy's
//! `NodeRules`) and the NodeRestriction admission plugin
//! (`plugin/pkg/admission/noderestriction/admission.go`).
//!
//! A node identity is `system:node:<name>` in `system:nodes`. The authorizer gives it the
//! node rules, and narrows leases to its own in `kube-node-lease`; the admission check,
//! run where writes are admitted, narrows writes to its own Node (no
//! `node-restriction.kubernetes.io/` labels, no taint changes), its own Lease and the pods
//! bound to it.

use serde_json::Value;

use super::{
    NODE_USER_PREFIX, UserInfo,
    authz::{Attributes, Decision},
    rbac::Rule,
};
use crate::{
    api::status::{ApiError, Qualified},
    registry::ResourceDef,
};

/// The namespace of node leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The label prefix only the control plane may set on Nodes.
pub const NODE_RESTRICTION_LABEL_PREFIX: &str = "node-restriction.kubernetes.io/";

/// The mirror-pod annotation: the only pods a node may create.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

fn rule(verbs: &[&str], group: &str, resources: &[&str]) -> Rule {
    Rule {
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        api_groups: vec![group.to_owned()],
        resources: resources.iter().map(|r| (*r).to_owned()).collect(),
        ..Rule::default()
    }
}

/// Upstream's bootstrap `NodeRules`, for the resources this server serves (plus the
/// access reviews a kubelet makes); the `system:node` ClusterRole carries the same rules.
pub fn node_rules() -> Vec<Rule> {
    const READ: &[&str] = &["get", "list", "watch"];
    vec![
        rule(
            &["create"],
            "authorization.k8s.io",
            &["subjectaccessreviews", "localsubjectaccessreviews"],
        ),
        rule(READ, "", &["services"]),
        rule(&["create", "get", "list", "watch"], "", &["nodes"]),
        rule(&["update", "patch"], "", &["nodes/status"]),
        rule(&["update", "patch"], "", &["nodes"]),
        rule(&["create", "update", "patch"], "", &["events"]),
        rule(&["create", "update", "patch"], "events.k8s.io", &["events"]),
        rule(READ, "", &["pods"]),
        rule(&["create", "delete"], "", &["pods"]),
        rule(&["update", "patch"], "", &["pods/status"]),
        rule(&["create"], "", &["pods/eviction"]),
        rule(READ, "", &["secrets", "configmaps"]),
        rule(&["create"], "", &["serviceaccounts/token"]),
        rule(
            &["get", "create", "update", "patch", "delete"],
            "coordination.k8s.io",
            &["leases"],
        ),
    ]
}

/// The Node authorizer. Not a node: no opinion. A node's leases are its own lease in
/// `kube-node-lease`; everything else is decided by the node rules. Refusals are "no
/// opinion" with upstream's reason, so RBAC may still allow.
pub fn authorize(attrs: &Attributes) -> Decision {
    let Some(node) = node_identity(&attrs.user) else {
        return Decision::NoOpinion(String::new());
    };
    if node.is_empty() {
        return Decision::NoOpinion(format!("unknown node for user {:?}", attrs.user.name));
    }
    if attrs.resource_request
        && attrs.api_group == "coordination.k8s.io"
        && attrs.resource == "leases"
    {
        return authorize_lease(node, attrs);
    }
    if attrs.resource_request && attrs.api_group.is_empty() {
        match attrs.resource.as_str() {
            // Upstream decides secrets and configmaps on its graph of pods bound to the
            // node; no volumes are simulated here, so a node reads none (`get` only).
            "secrets" | "configmaps" => {
                return Decision::NoOpinion(if attrs.verb == "get" {
                    format!("no relationship found between node '{node}' and this object")
                } else {
                    "can only get individual resources of this type".to_owned()
                });
            }
            _ => {}
        }
    }
    if node_rules().iter().any(|r| r.allows(attrs)) {
        Decision::Allow
    } else {
        Decision::NoOpinion(String::new())
    }
}

/// Upstream's `authorizeLease`.
fn authorize_lease(node: &str, attrs: &Attributes) -> Decision {
    if !matches!(
        attrs.verb.as_str(),
        "get" | "create" | "update" | "patch" | "delete"
    ) {
        return Decision::NoOpinion(
            "can only get, create, update, patch, or delete a node lease".to_owned(),
        );
    }
    if attrs.namespace != NODE_LEASE_NAMESPACE {
        return Decision::NoOpinion(format!(
            "can only access leases in the {NODE_LEASE_NAMESPACE:?} system namespace"
        ));
    }
    // The name of a created lease is in the body: NodeRestriction checks it.
    if attrs.verb != "create" && attrs.name != node {
        return Decision::NoOpinion(
            "can only access node lease with the same name as the requesting node".to_owned(),
        );
    }
    Decision::Allow
}

/// The identity of the kubelet of `node`: `system:node:<node>` in `system:nodes`.
pub fn node_user(node: &str) -> UserInfo {
    UserInfo::new(format!("{NODE_USER_PREFIX}{node}"), [super::GROUP_NODES])
}

/// `Some(name)` for a node identity (`Some("")` for `system:node:` with no name), `None`
/// for everyone else.
fn node_identity(user: &UserInfo) -> Option<&str> {
    if !user.in_group(super::GROUP_NODES) {
        return None;
    }
    Some(user.name.strip_prefix(NODE_USER_PREFIX).unwrap_or(""))
}

/// A write being admitted.
#[derive(Debug, Clone, Copy)]
pub enum Write<'a> {
    /// A create of `new`.
    Create {
        /// The object to create.
        new: &'a Value,
    },
    /// An update (PUT, PATCH) of `old` into `new`, of the object or a subresource.
    Update {
        /// The subresource (`status`) or none.
        sub: Option<&'a str>,
        /// The stored object.
        old: &'a Value,
        /// The object as it will be stored.
        new: &'a Value,
    },
    /// A delete (or eviction) of `old`.
    Delete {
        /// The stored object.
        old: &'a Value,
    },
}

fn name_of(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

/// Whether a kubelet may set the label `key` on its Node: not `node-restriction…` labels
/// nor others in the `kubernetes.io`/`k8s.io` namespaces, except kubelet's own
/// (upstream's `getForbiddenLabels` with `kubeletapis.IsKubeletLabel`).
pub fn node_may_set_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    let in_domain = |d: &str| prefix == d || prefix.ends_with(&format!(".{d}"));
    if in_domain("node-restriction.kubernetes.io") {
        return false;
    }
    if !in_domain("kubernetes.io") && !in_domain("k8s.io") {
        return true;
    }
    const KUBELET_LABELS: [&str; 11] = [
        "kubernetes.io/hostname",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    KUBELET_LABELS.contains(&key)
        || in_domain("kubelet.kubernetes.io")
        || in_domain("node.kubernetes.io")
}

/// Labels added or changed from `old` to `new` that a node may not set, sorted.
fn forbidden_labels(new: &Value, old: Option<&Value>) -> Vec<String> {
    let empty = serde_json::Map::new();
    let labels = |v: Option<&Value>| {
        v.and_then(|v| v["metadata"]["labels"].as_object())
            .unwrap_or(&empty)
            .clone()
    };
    let (new, old) = (labels(Some(new)), labels(old));
    let mut keys: Vec<String> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(old.keys().filter(|k| !new.contains_key(*k)).cloned())
        .filter(|k| !node_may_set_label(k))
        .collect();
    keys.sort();
    keys
}

/// NodeRestriction: checks a write by the request's user (scoped by the API server)
/// to Nodes, Leases and Pods. Everyone but a node passes.
pub fn admit(def: &ResourceDef, write: Write<'_>) -> Result<(), ApiError> {
    super::with_request_user(|user| match node_identity(user) {
        Some(node) => admit_node_write(node, def, write),
        None => Ok(()),
    })
    .unwrap_or(Ok(()))
}

fn admit_node_write(node: &str, def: &ResourceDef, write: Write<'_>) -> Result<(), ApiError> {
    let object = match write {
        Write::Create { new } | Write::Update { new, .. } => new,
        Write::Delete { old } => old,
    };
    let name = name_of(object);
    let forbid = |why: String| {
        Err(ApiError::forbidden(
            &Qualified::new(def.group, def.plural, name),
            &why,
        ))
    };
    match (def.group, def.plural) {
        ("", "nodes") => {
            if name != node {
                return forbid(format!(
                    "node {node:?} is not allowed to modify node {name:?}"
                ));
            }
            match write {
                Write::Create { new } => {
                    let labels = forbidden_labels(new, None);
                    if !labels.is_empty() {
                        return forbid(format!(
                            "node {node:?} is not allowed to set the following labels: {}",
                            labels.join(", ")
                        ));
                    }
                }
                Write::Update { old, new, .. } => {
                    if new["spec"]["taints"] != old["spec"]["taints"] {
                        return forbid(format!("node {node:?} is not allowed to modify taints"));
                    }
                    let labels = forbidden_labels(new, Some(old));
                    if !labels.is_empty() {
                        return forbid(format!(
                            "is not allowed to modify labels: {}",
                            labels.join(", ")
                        ));
                    }
                }
                Write::Delete { .. } => {}
            }
            Ok(())
        }
        ("coordination.k8s.io", "leases") => {
            if name != node {
                return forbid(
                    "can only access node lease with the same name as the requesting node"
                        .to_owned(),
                );
            }
            Ok(())
        }
        ("", "pods") => {
            let bound = object["spec"]["nodeName"].as_str() == Some(node);
            match write {
                Write::Create { new } => {
                    if new["metadata"]["annotations"][MIRROR_POD_ANNOTATION].is_null() {
                        return forbid(format!(
                            "pod does not have \"{MIRROR_POD_ANNOTATION}\" annotation, node {node:?} can only create mirror pods"
                        ));
                    }
                    if !bound {
                        return forbid(format!(
                            "node {node:?} can only create pods with spec.nodeName set to itself"
                        ));
                    }
                }
                Write::Update { old, .. } => {
                    if old["spec"]["nodeName"].as_str() != Some(node) {
                        return forbid(format!(
                            "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
                        ));
                    }
                }
                Write::Delete { .. } => {
                    if !bound {
                        return forbid(format!(
                            "node {node:?} can only delete pods with spec.nodeName set to itself"
                        ));
                    }
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry::resources::{LEASES, NODES};

    /// Upstream `authorizeLease`: own lease, in kube-node-lease, only the five verbs.
    #[test]
    fn a_node_gets_only_its_own_lease() {
        let n1 = node_user("n1");
        let lease = |verb: &str, ns: &str, name: &str| {
            authorize(&Attributes::resource(
                n1.clone(),
                verb,
                "coordination.k8s.io",
                "leases",
                ns,
                name,
            ))
        };
        assert_eq!(lease("update", NODE_LEASE_NAMESPACE, "n1"), Decision::Allow);
        assert_eq!(lease("create", NODE_LEASE_NAMESPACE, ""), Decision::Allow);
        assert_eq!(
            lease("patch", NODE_LEASE_NAMESPACE, "n2"),
            Decision::NoOpinion(
                "can only access node lease with the same name as the requesting node".into()
            )
        );
        assert!(
            matches!(lease("get", "default", "n1"), Decision::NoOpinion(r) if r.contains("kube-node-lease"))
        );
        assert!(
            matches!(lease("list", NODE_LEASE_NAMESPACE, ""), Decision::NoOpinion(r) if r.starts_with("can only get"))
        );
        // Not a node: no opinion, RBAC decides.
        let alice = UserInfo::new("alice", ["dev"]);
        assert_eq!(
            authorize(&Attributes::resource(alice, "get", "", "nodes", "", "n1")),
            Decision::NoOpinion(String::new())
        );
    }

    /// Upstream NodeRestriction `admitNode`: own Node only, no `node-restriction…` or
    /// foreign `kubernetes.io` labels, no taint changes.
    #[test]
    fn node_restriction_on_nodes() {
        let n1 = json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}});
        let n2 = json!({"metadata": {"name": "n2"}});
        assert!(admit_node_write("n1", &NODES, Write::Create { new: &n1 }).is_ok());
        let e = admit_node_write(
            "n1",
            &NODES,
            Write::Update {
                sub: None,
                old: &n2,
                new: &n2,
            },
        )
        .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            r#"nodes "n2" is forbidden: node "n1" is not allowed to modify node "n2""#
        );
        let mut labelled = n1.clone();
        labelled["metadata"]["labels"]["node-restriction.kubernetes.io/role"] = json!("db");
        labelled["metadata"]["labels"]["node-role.kubernetes.io/master"] = json!("");
        labelled["metadata"]["labels"]["example.com/ok"] = json!("x");
        let e = admit_node_write(
            "n1",
            &NODES,
            Write::Update {
                sub: None,
                old: &n1,
                new: &labelled,
            },
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            r#"nodes "n1" is forbidden: is not allowed to modify labels: node-restriction.kubernetes.io/role, node-role.kubernetes.io/master"#
        );
        let mut tainted = n1.clone();
        tainted["spec"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
        assert!(
            admit_node_write(
                "n1",
                &NODES,
                Write::Update {
                    sub: None,
                    old: &n1,
                    new: &tainted
                }
            )
            .unwrap_err()
            .message
            .ends_with("is not allowed to modify taints")
        );
        let lease = json!({"metadata": {"name": "n2", "namespace": NODE_LEASE_NAMESPACE}});
        assert!(admit_node_write("n1", &LEASES, Write::Create { new: &lease }).is_err());
        assert!(node_may_set_label("node.kubernetes.io/instance-type"));
        assert!(node_may_set_label("beta.kubernetes.io/os"));
        assert!(!node_may_set_label("a.node-restriction.kubernetes.io/x"));
    }
}
