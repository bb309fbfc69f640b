//! What a kubelet may do: upstream's Node authorizer
//! (`plugin/pkg/auth/authorizer/node/node_authorizer.go`, with the bootstrap policy's
//! `NodeRules`) and the NodeRestriction admission plugin ([`admission`]).
//!
//! A node identity is `system:node:<name>` in `system:nodes`. The authorizer decides
//! secrets, configmaps, persistentvolumeclaims and service-account tokens on its
//! [graph] of the pods bound to each node: a node reads a secret or mints a token
//! only for objects its pods reference. It narrows leases to the node's own in
//! `kube-node-lease`, and gives every other request the node rules. The API server keeps
//! the graph current from its own writes (`graph_populator.rs`).

pub mod admission;
pub mod graph;
pub(crate) mod graph_populator;

use std::sync::LazyLock;

pub(crate) use admission::NodeRestriction;
pub use admission::{Write, node_may_set_label};
use graph::{NodeGraph, Vertex};
pub(crate) use graph_populator::NodeAuthorizer;

use super::{
    NODE_USER_PREFIX, UserInfo,
    authz::{Attributes, Decision},
    rbac::Rule,
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
        rule(&["create"], "authentication.k8s.io", &["tokenreviews"]),
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
        // The kubelet's certificate requests (serverTLSBootstrap, client rotation).
        rule(
            &["create", "get", "list", "watch"],
            "certificates.k8s.io",
            &["certificatesigningrequests"],
        ),
        rule(
            &["get", "create", "update", "patch", "delete"],
            "coordination.k8s.io",
            &["leases"],
        ),
    ]
}

/// The node rules, built once.
static NODE_RULES: LazyLock<Vec<Rule>> = LazyLock::new(node_rules);

/// The Node authorizer's decision on `graph` (upstream's `NodeAuthorizer.Authorize`). Not
/// a node: no opinion. Secrets and configmaps are read, persistentvolumeclaims got and
/// service-account tokens created only along a path of the graph; a node's leases are its
/// own lease in `kube-node-lease`; everything else is decided by the node rules. Refusals
/// are "no opinion" with upstream's reason, so RBAC may still allow.
pub fn authorize(graph: &NodeGraph, attrs: &Attributes) -> Decision {
    let Some(node) = node_identity(&attrs.user) else {
        return Decision::NoOpinion(String::new());
    };
    if node.is_empty() {
        return Decision::NoOpinion(format!("unknown node for user {:?}", attrs.user.name));
    }
    if !attrs.resource_request && attrs.verb == "get" && attrs.path == core_cluster_tunnel::PATH {
        // A node's agent opening its tunnel (not upstream's: its agents authenticate to
        // konnectivity-server, outside the API server). The tunnel serves the node that
        // opened it and no other.
        return Decision::Allow;
    }
    if attrs.resource_request {
        match (attrs.api_group.as_str(), attrs.resource.as_str()) {
            ("", "secrets") => {
                return authorize_read_namespaced_object(graph, node, Vertex::Secret, attrs);
            }
            ("", "configmaps") => {
                return authorize_read_namespaced_object(graph, node, Vertex::ConfigMap, attrs);
            }
            ("", "persistentvolumeclaims") if attrs.subresource == "status" => {
                return authorize_status_update(graph, node, Vertex::PersistentVolumeClaim, attrs);
            }
            ("", "persistentvolumeclaims") => {
                return authorize_get(graph, node, Vertex::PersistentVolumeClaim, attrs);
            }
            ("", "serviceaccounts") => return authorize_create_token(graph, node, attrs),
            ("coordination.k8s.io", "leases") => return authorize_lease(node, attrs),
            _ => {}
        }
    }
    if NODE_RULES.iter().any(|r| r.allows(attrs)) {
        Decision::Allow
    } else {
        Decision::NoOpinion(String::new())
    }
}

/// Upstream's `authorizeReadNamespacedObject`: `get`, `list` or `watch` of one named object
/// (a list or watch names it with the field selector `metadata.name=`) in a namespace.
fn authorize_read_namespaced_object(
    graph: &NodeGraph,
    node: &str,
    kind: Vertex,
    attrs: &Attributes,
) -> Decision {
    if !matches!(attrs.verb.as_str(), "get" | "list" | "watch") {
        return Decision::NoOpinion("can only read resources of this type".to_owned());
    }
    if !attrs.subresource.is_empty() {
        return Decision::NoOpinion("cannot read subresource".to_owned());
    }
    if attrs.namespace.is_empty() {
        return Decision::NoOpinion("can only read namespaced object of this type".to_owned());
    }
    authorize_path(graph, node, kind, attrs)
}

/// Upstream's `authorizeGet`.
fn authorize_get(graph: &NodeGraph, node: &str, kind: Vertex, attrs: &Attributes) -> Decision {
    if attrs.verb != "get" {
        return Decision::NoOpinion("can only get individual resources of this type".to_owned());
    }
    if !attrs.subresource.is_empty() {
        return Decision::NoOpinion("cannot get subresource".to_owned());
    }
    authorize_path(graph, node, kind, attrs)
}

/// Upstream's `authorizeStatusUpdate`.
fn authorize_status_update(
    graph: &NodeGraph,
    node: &str,
    kind: Vertex,
    attrs: &Attributes,
) -> Decision {
    if !matches!(attrs.verb.as_str(), "update" | "patch") {
        return Decision::NoOpinion("can only get/update/patch this type".to_owned());
    }
    if attrs.subresource != "status" {
        return Decision::NoOpinion("can only update status subresource".to_owned());
    }
    authorize_path(graph, node, kind, attrs)
}

/// Upstream's `authorizeCreateToken`: `create serviceaccounts/<name>/token` for a service
/// account of a pod bound to the node; nothing else on service accounts.
fn authorize_create_token(graph: &NodeGraph, node: &str, attrs: &Attributes) -> Decision {
    if attrs.verb != "create" || attrs.name.is_empty() {
        return Decision::NoOpinion(
            "can only create tokens for individual service accounts".to_owned(),
        );
    }
    if attrs.subresource != "token" {
        return Decision::NoOpinion(
            "can only create token subresource of serviceaccount".to_owned(),
        );
    }
    authorize_path(graph, node, Vertex::ServiceAccount, attrs)
}

/// Upstream's `authorize`: allowed when the named object has a path to the node.
fn authorize_path(graph: &NodeGraph, node: &str, kind: Vertex, attrs: &Attributes) -> Decision {
    if attrs.name.is_empty() {
        return Decision::NoOpinion("No Object name found".to_owned());
    }
    if graph.has_path(kind, &attrs.namespace, &attrs.name, node) {
        Decision::Allow
    } else {
        tracing::debug!(
            node,
            kind = kind.name(),
            namespace = %attrs.namespace,
            name = %attrs.name,
            "node authorizer: no path to the node"
        );
        Decision::NoOpinion(format!(
            "no relationship found between node '{node}' and this object"
        ))
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use graph::PodEdges;

    /// Upstream `authorizeLease`: own lease, in kube-node-lease, only the five verbs.
    #[test]
    fn a_node_gets_only_its_own_lease() {
        let n1 = node_user("n1");
        let lease = |verb: &str, ns: &str, name: &str| {
            authorize(
                &NodeGraph::new(),
                &Attributes::resource(n1.clone(), verb, "coordination.k8s.io", "leases", ns, name),
            )
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
            authorize(
                &NodeGraph::new(),
                &Attributes::resource(alice, "get", "", "nodes", "", "n1")
            ),
            Decision::NoOpinion(String::new())
        );
    }

    /// Upstream `authorizeReadNamespacedObject` and `authorizeCreateToken` on the graph: a
    /// node reads the secret and mints a token for the service account of a pod bound to it,
    /// one object at a time, and nothing of another node's pod.
    #[test]
    fn secrets_and_tokens_follow_the_graph() {
        let mut graph = NodeGraph::new();
        let pod = json!({"metadata": {"name": "web", "namespace": "ns"},
            "spec": {"nodeName": "n1", "serviceAccountName": "sa",
                     "volumes": [{"name": "v", "secret": {"secretName": "s"}}]}});
        graph.set_pod("ns", "web", PodEdges::of(&pod).as_ref());
        let decide = |node: &str, verb: &str, resource: &str, name: &str| {
            authorize(
                &graph,
                &Attributes::resource(node_user(node), verb, "", resource, "ns", name),
            )
        };
        let no_path = |node: &str| {
            Decision::NoOpinion(format!(
                "no relationship found between node '{node}' and this object"
            ))
        };
        assert_eq!(decide("n1", "get", "secrets", "s"), Decision::Allow);
        assert_eq!(decide("n1", "watch", "secrets", "s"), Decision::Allow);
        assert_eq!(decide("n1", "get", "secrets", "other"), no_path("n1"));
        assert_eq!(decide("n2", "get", "secrets", "s"), no_path("n2"));
        assert_eq!(
            decide("n1", "list", "secrets", ""),
            Decision::NoOpinion("No Object name found".into())
        );
        assert_eq!(
            decide("n1", "delete", "secrets", "s"),
            Decision::NoOpinion("can only read resources of this type".into())
        );
        assert_eq!(decide("n1", "get", "configmaps", "s"), no_path("n1"));
        assert_eq!(
            decide("n1", "create", "serviceaccounts/token", "sa"),
            Decision::Allow
        );
        assert_eq!(
            decide("n2", "create", "serviceaccounts/token", "sa"),
            no_path("n2")
        );
        assert_eq!(
            decide("n1", "create", "serviceaccounts/token", "default"),
            no_path("n1")
        );
        assert_eq!(
            decide("n1", "get", "serviceaccounts", "sa"),
            Decision::NoOpinion("can only create tokens for individual service accounts".into())
        );
        // Pods are still decided by the node rules.
        assert_eq!(decide("n1", "list", "pods", ""), Decision::Allow);
    }
}
