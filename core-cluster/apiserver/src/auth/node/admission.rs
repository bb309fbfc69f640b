//! NodeRestriction (upstream's `plugin/pkg/admission/noderestriction/admission.go`): what a
//! node identity may write, checked where the API server admits writes. A node writes its
//! own Node (no `node-restriction.kubernetes.io/` labels, no taint changes), its own
//! Lease, the status of pods bound to it (not their labels), mirror pods bound to it that
//! reference no other objects, and tokens only for pods bound to it.

use futures::future::BoxFuture;
use serde_json::Value;

use super::{
    MIRROR_POD_ANNOTATION,
    graph::{is_mirror_pod, service_account_name, visit_configmap_names, visit_secret_names},
    node_identity,
};
use crate::{
    registry::{
        ResourceDef,
        resources::{NODES, PODS, SERVICE_ACCOUNTS},
    },
    storage::{
        ObjectReader,
        admission::{Admission, AdmissionAttributes, Operation},
        status::{ApiError, Qualified},
    },
};

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

fn labels(v: &Value) -> serde_json::Map<String, Value> {
    v["metadata"]["labels"]
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// Labels added or changed from `old` to `new` that a node may not set, sorted.
fn forbidden_labels(new: &Value, old: Option<&Value>) -> Vec<String> {
    let (new, old) = (labels(new), old.map(labels).unwrap_or_default());
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

/// The NodeRestriction admission plugin: checks the writes of node identities to Nodes,
/// Leases, Pods and service-account tokens. Everyone but a node passes.
#[derive(Debug, Clone)]
pub(crate) struct NodeRestriction {
    /// Looks up the Node a mirror pod's owner reference names, and a token's pod.
    reader: ObjectReader,
}

impl NodeRestriction {
    /// The plugin, reading objects through `reader`.
    pub(crate) fn new(reader: ObjectReader) -> Self {
        NodeRestriction { reader }
    }
}

impl Admission for NodeRestriction {
    fn name(&self) -> &'static str {
        "NodeRestriction"
    }

    fn admit<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let Some(node) = node_identity(attrs.user) else {
                return Ok(());
            };
            let def = attrs.resource;
            if std::ptr::eq(def, &SERVICE_ACCOUNTS) && attrs.subresource == Some("token") {
                let bound = attrs
                    .object
                    .map_or(&Value::Null, |request| &request["spec"]["boundObjectRef"]);
                let ns = attrs.namespace.unwrap_or("");
                return admit_token_request(&self.reader, node, ns, attrs.name, bound).await;
            }
            let write = match (attrs.operation, attrs.object, attrs.old_object) {
                (Operation::Create, Some(new), _) => Write::Create { new },
                (Operation::Update, Some(new), Some(old)) => Write::Update {
                    sub: attrs.subresource,
                    old,
                    new,
                },
                (Operation::Delete, _, Some(old)) => Write::Delete { old },
                _ => return Ok(()),
            };
            admit_node_write(Some(&self.reader), node, def, write).await
        })
    }
}

/// The checks of [`NodeRestriction`] for a write by `node`. `reader` looks up the Node a mirror pod's
/// owner reference names (tests of the other rules pass none).
async fn admit_node_write(
    reader: Option<&ObjectReader>,
    node: &str,
    def: &ResourceDef,
    write: Write<'_>,
) -> Result<(), ApiError> {
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
        ("", "pods") => match write {
            Write::Create { new } => match admit_pod_create(reader, node, new).await? {
                Some(why) => forbid(why),
                None => Ok(()),
            },
            Write::Update { sub, old, new } => match admit_pod_update(node, sub, old, new) {
                Some(why) => forbid(why),
                None => Ok(()),
            },
            Write::Delete { old } => {
                if old["spec"]["nodeName"].as_str() != Some(node) {
                    return forbid(format!(
                        "node {node:?} can only delete pods with spec.nodeName set to itself"
                    ));
                }
                Ok(())
            }
        },
        _ => Ok(()),
    }
}

/// Upstream's `admitPodStatus` (and `admitPod`'s refusal of other updates): a node
/// updates only the status of pods bound to it, and not their labels (which would let it
/// steer a Service's traffic to its own pods) nor their resource claim statuses. The
/// reason of a refusal.
fn admit_pod_update(node: &str, sub: Option<&str>, old: &Value, new: &Value) -> Option<String> {
    if sub != Some("status") {
        return Some(format!(
            "unexpected operation \"UPDATE\", node {node:?} can only create and delete mirror pods"
        ));
    }
    if old["spec"]["nodeName"].as_str() != Some(node) {
        return Some(format!(
            "node {node:?} can only update pod status for pods with spec.nodeName set to itself"
        ));
    }
    // `labels.Equals`: no labels and empty labels are the same.
    if labels(old) != labels(new) {
        return Some(format!(
            "node {node:?} cannot update labels through pod status"
        ));
    }
    let claim_statuses = |v: &Value| -> Vec<(Value, Value)> {
        v["status"]["resourceClaimStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| (s["name"].clone(), s["resourceClaimName"].clone()))
            .collect()
    };
    if claim_statuses(old) != claim_statuses(new) {
        // Upstream's wording, typo included.
        return Some(format!(
            "node {node:?} cannot update resource claim statues"
        ));
    }
    None
}

/// Upstream's `admitPodCreate`: a node creates only mirror pods, bound to itself, owned by
/// nothing but its own Node (as a controller that does not block deletion), and
/// referencing no service account, secret, configmap, ClusterTrustBundle or claim: a pod
/// the node made up must not give it access to anything (the Node authorizer's graph
/// ignores such references of mirror pods too). The reason of a refusal; a missing Node
/// is 404, as upstream.
async fn admit_pod_create(
    reader: Option<&ObjectReader>,
    node: &str,
    pod: &Value,
) -> Result<Option<String>, ApiError> {
    if !is_mirror_pod(pod) {
        return Ok(Some(format!(
            "pod does not have \"{MIRROR_POD_ANNOTATION}\" annotation, node {node:?} can only create mirror pods"
        )));
    }
    if pod["spec"]["nodeName"].as_str() != Some(node) {
        return Ok(Some(format!(
            "node {node:?} can only create pods with spec.nodeName set to itself"
        )));
    }
    let owners = pod["metadata"]["ownerReferences"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if owners.len() > 1 {
        return Ok(Some(format!(
            "node {node:?} can only create pods with a single owner reference set to itself"
        )));
    }
    if let Some(owner) = owners.first() {
        if owner["apiVersion"] != "v1" || owner["kind"] != "Node" || owner["name"] != node {
            return Ok(Some(format!(
                "node {node:?} can only create pods with an owner reference set to itself"
            )));
        }
        if owner["controller"] != true {
            return Ok(Some(format!(
                "node {node:?} can only create pods with a controller owner reference set to itself"
            )));
        }
        if owner["blockOwnerDeletion"] == true {
            return Ok(Some(format!(
                "node {node:?} must not set blockOwnerDeletion on an owner reference"
            )));
        }
        if let Some(reader) = reader {
            let found = match reader.get(&NODES, None, node).await {
                Ok(found) => found,
                Err(e) if e.code == 404 => return Err(e),
                Err(e) => {
                    return Ok(Some(format!(
                        "error looking up node {node} to verify uid: {}",
                        e.message
                    )));
                }
            };
            let uid = found["metadata"]["uid"].as_str().unwrap_or("");
            let given = owner["uid"].as_str().unwrap_or("");
            if given != uid {
                return Ok(Some(format!(
                    "node {node} UID mismatch: expected {given} got {uid}"
                )));
            }
        }
    }
    if service_account_name(pod).is_some() {
        return Ok(Some(format!(
            "node {node:?} can not create pods that reference a service account"
        )));
    }
    let mut secrets = false;
    visit_secret_names(pod, &mut |_| secrets = true);
    if secrets {
        return Ok(Some(format!(
            "node {node:?} can not create pods that reference secrets"
        )));
    }
    let mut configmaps = false;
    visit_configmap_names(pod, &mut |_| configmaps = true);
    if configmaps {
        return Ok(Some(format!(
            "node {node:?} can not create pods that reference configmaps"
        )));
    }
    let volumes = || pod["spec"]["volumes"].as_array().into_iter().flatten();
    let trust_bundles = volumes().any(|v| {
        v["projected"]["sources"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| !s["clusterTrustBundle"].is_null())
    });
    if trust_bundles {
        return Ok(Some(format!(
            "node {node:?} can not create pods that reference clustertrustbundles"
        )));
    }
    if volumes().any(|v| !v["persistentVolumeClaim"].is_null()) {
        return Ok(Some(format!(
            "node {node:?} can not create pods that reference persistentvolumeclaims"
        )));
    }
    Ok(None)
}

/// Upstream's `admitServiceAccount`: a node's TokenRequest for the service account
/// `ns/name` must be bound (`spec.boundObjectRef`, here `bound`) to a Pod, by name and
/// UID, that exists and is bound to the node.
async fn admit_token_request(
    reader: &ObjectReader,
    node: &str,
    ns: &str,
    name: &str,
    bound: &Value,
) -> Result<(), ApiError> {
    let forbid = |why: &str| {
        Err(ApiError::forbidden(
            &Qualified::new("", "serviceaccounts", name),
            why,
        ))
    };
    let pod_name = bound["name"].as_str().unwrap_or("");
    if bound["apiVersion"] != "v1" || bound["kind"] != "Pod" || pod_name.is_empty() {
        return forbid("node requested token not bound to a pod");
    }
    let Some(uid) = bound["uid"].as_str().filter(|u| !u.is_empty()) else {
        return forbid("node requested token with a pod binding without a uid");
    };
    let pod = match reader.get(&PODS, Some(ns), pod_name).await {
        Ok(pod) => pod,
        Err(e) if e.code == 404 => return Err(e),
        Err(e) => return forbid(&e.message),
    };
    if pod["metadata"]["uid"].as_str() != Some(uid) {
        return forbid(&format!(
            "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
        ));
    }
    if pod["spec"]["nodeName"].as_str() != Some(node) {
        return forbid("node requested token bound to a pod scheduled on a different node");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry::resources::{LEASES, NODES, PODS};

    fn admit(node: &str, def: &ResourceDef, write: Write<'_>) -> Result<(), ApiError> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
            .block_on(admit_node_write(None, node, def, write))
    }

    /// Upstream NodeRestriction `admitNode`: own Node only, no `node-restriction…` or
    /// foreign `kubernetes.io` labels, no taint changes.
    #[test]
    fn node_restriction_on_nodes() {
        let n1 = json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}});
        let n2 = json!({"metadata": {"name": "n2"}});
        assert!(admit("n1", &NODES, Write::Create { new: &n1 }).is_ok());
        let e = admit(
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
        let e = admit(
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
            admit(
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
        let lease =
            json!({"metadata": {"name": "n2", "namespace": super::super::NODE_LEASE_NAMESPACE}});
        assert!(admit("n1", &LEASES, Write::Create { new: &lease }).is_err());
        assert!(node_may_set_label("node.kubernetes.io/instance-type"));
        assert!(node_may_set_label("beta.kubernetes.io/os"));
        assert!(!node_may_set_label("a.node-restriction.kubernetes.io/x"));
    }

    /// Upstream `admitPodCreate`: each reference a mirror pod may not make, in upstream's
    /// order and wording.
    #[test]
    fn admit_pod_create_refuses_mirror_pods_that_reference_other_objects() {
        let mirror = |spec: Value, meta: Value| {
            let mut pod = json!({"metadata": {"name": "m", "namespace": "ns",
                "annotations": {MIRROR_POD_ANNOTATION: "hash"}},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}});
            for (k, v) in spec.as_object().unwrap() {
                pod["spec"][k] = v.clone();
            }
            for (k, v) in meta.as_object().unwrap() {
                pod["metadata"][k] = v.clone();
            }
            pod
        };
        let why = |pod: &Value| {
            admit("n1", &PODS, Write::Create { new: pod })
                .err()
                .map(|e| e.message)
        };
        assert_eq!(why(&mirror(json!({}), json!({}))), None);
        let cases = [
            (
                json!({"nodeName": "n2"}),
                json!({}),
                "can only create pods with spec.nodeName set to itself",
            ),
            (
                json!({}),
                json!({"ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u", "controller": true},
                {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u", "controller": true}]}),
                "can only create pods with a single owner reference set to itself",
            ),
            (
                json!({}),
                json!({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]}),
                "can only create pods with an owner reference set to itself",
            ),
            (
                json!({}),
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u"}]}),
                "can only create pods with a controller owner reference set to itself",
            ),
            (
                json!({}),
                json!({"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "u", "controller": true, "blockOwnerDeletion": true}]}),
                "must not set blockOwnerDeletion on an owner reference",
            ),
            (
                json!({"serviceAccountName": "powerful"}),
                json!({}),
                "can not create pods that reference a service account",
            ),
            (
                json!({"imagePullSecrets": [{"name": "s"}]}),
                json!({}),
                "can not create pods that reference secrets",
            ),
            (
                json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]}),
                json!({}),
                "can not create pods that reference secrets",
            ),
            (
                json!({"containers": [{"name": "c", "image": "i", "envFrom": [{"configMapRef": {"name": "c"}}]}]}),
                json!({}),
                "can not create pods that reference configmaps",
            ),
            (
                json!({"volumes": [{"name": "v", "projected": {"sources": [{"clusterTrustBundle": {"name": "b", "path": "p"}}]}}]}),
                json!({}),
                "can not create pods that reference clustertrustbundles",
            ),
            (
                json!({"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}),
                json!({}),
                "can not create pods that reference persistentvolumeclaims",
            ),
        ];
        for (spec, meta, expected) in cases {
            let pod = mirror(spec, meta);
            let message = why(&pod).unwrap_or_default();
            assert!(
                message.starts_with(r#"pods "m" is forbidden: node "n1" "#)
                    && message.ends_with(expected),
                "{pod}: {message}"
            );
        }
    }

    /// Upstream `admitPodStatus`: status, yes; labels (added, changed or removed), no.
    #[test]
    fn admit_pod_status_refuses_label_changes() {
        let old = json!({"metadata": {"name": "p", "labels": {"app": "web"}},
                         "spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}});
        let status = |new: &Value| admit_pod_update("n1", Some("status"), &old, new);
        let mut running = old.clone();
        running["status"]["phase"] = json!("Running");
        assert_eq!(status(&running), None);
        let refusal = Some(r#"node "n1" cannot update labels through pod status"#.to_owned());
        for labels in [
            json!({"app": "hijack"}),
            json!({"app": "web", "x": "y"}),
            json!(null),
        ] {
            let mut relabelled = running.clone();
            relabelled["metadata"]["labels"] = labels;
            assert_eq!(status(&relabelled), refusal);
        }
        // No labels and empty labels are equal (`labels.Equals`).
        let bare = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}});
        let mut empty = bare.clone();
        empty["metadata"]["labels"] = json!({});
        assert_eq!(admit_pod_update("n1", Some("status"), &bare, &empty), None);
        assert!(admit_pod_update("n2", Some("status"), &old, &running).is_some());
    }
}
