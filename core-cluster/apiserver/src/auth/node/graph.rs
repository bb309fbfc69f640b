//! The Node authorizer's graph (upstream's `plugin/pkg/auth/authorizer/node/graph.go`):
//! which objects each node may reach through the pods bound to it.
//!
//! Upstream keeps a directed graph whose edges all point toward nodes:
//!
//! ```text
//! node <- pod <- secret, configmap, pvc, serviceaccount
//! ```
//!
//! (PersistentVolumes, VolumeAttachments and ResourceClaims add longer chains; this server
//! serves none of them.) With paths at most two edges long, "is there a path from this
//! secret to node n1" is "does some pod bound to n1 reference this secret", so the graph
//! is kept as upstream's destination-edge index: for every referenced object, the nodes
//! it reaches with how many pods reach each. A decision is a few hash lookups and a
//! binary search, whatever the size of the cluster; a pod write touches only that pod's
//! references.
//!
//! The edges of a pod are derived as upstream's `AddPod`: a pod without `spec.nodeName`
//! is not in the graph; a mirror pod (`kubernetes.io/config.mirror`) gets only its
//! edge to the node (a node must never be able to create a pod that grants it access to
//! other objects); any other pod links its service account and every secret, configmap
//! and claim its spec names (`podutil.VisitPodSecretNames`, `VisitPodConfigmapNames`,
//! `persistentVolumeClaim` and generic ephemeral volumes), in all containers, init and
//! ephemeral ones included.

use std::collections::HashMap;

use serde_json::Value;

use super::MIRROR_POD_ANNOTATION;

/// The kinds of objects a node reaches through its pods (upstream's vertex types other
/// than pods and nodes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Vertex {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
    /// A PersistentVolumeClaim (named directly or by a generic ephemeral volume).
    PersistentVolumeClaim,
    /// A ServiceAccount (the pod's `spec.serviceAccountName`).
    ServiceAccount,
}

impl Vertex {
    const COUNT: usize = 4;

    fn index(self) -> usize {
        self as usize
    }

    /// Upstream's name of the vertex type (`vertexTypes`), used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Vertex::Secret => "secret",
            Vertex::ConfigMap => "configmap",
            Vertex::PersistentVolumeClaim => "pvc",
            Vertex::ServiceAccount => "serviceAccount",
        }
    }
}

/// What a pod contributes to the graph: its node and the objects it references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEdges {
    /// `spec.nodeName`.
    pub node: String,
    /// The objects the pod references (none for a mirror pod), sorted, without duplicates.
    pub refs: Vec<(Vertex, String)>,
}

impl PodEdges {
    /// The edges of a pod object; `None` when the pod is not bound to a node.
    pub fn of(pod: &Value) -> Option<PodEdges> {
        let node = pod["spec"]["nodeName"]
            .as_str()
            .filter(|n| !n.is_empty())?
            .to_owned();
        let mut refs = Vec::new();
        if !is_mirror_pod(pod) {
            if let Some(sa) = service_account_name(pod) {
                refs.push((Vertex::ServiceAccount, sa.to_owned()));
            }
            visit_secret_names(pod, &mut |n| refs.push((Vertex::Secret, n.to_owned())));
            visit_configmap_names(pod, &mut |n| refs.push((Vertex::ConfigMap, n.to_owned())));
            visit_claim_names(pod, &mut |n| {
                refs.push((Vertex::PersistentVolumeClaim, n.to_owned()))
            });
            refs.sort();
            refs.dedup();
        }
        Some(PodEdges { node, refs })
    }
}

/// Whether `pod` carries the mirror-pod annotation (any value).
pub fn is_mirror_pod(pod: &Value) -> bool {
    pod["metadata"]["annotations"]
        .as_object()
        .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
}

/// `spec.serviceAccountName`, when set.
pub(crate) fn service_account_name(pod: &Value) -> Option<&str> {
    pod["spec"]["serviceAccountName"]
        .as_str()
        .filter(|n| !n.is_empty())
}

fn items(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// Every container of the pod: init, regular and ephemeral (upstream's `AllContainers`).
fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    let spec = &pod["spec"];
    items(&spec["initContainers"])
        .chain(items(&spec["containers"]))
        .chain(items(&spec["ephemeralContainers"]))
}

fn name_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(v, |v, key| v.get(key))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
}

/// Upstream's `VisitPodSecretNames`: image pull secrets, `envFrom`/`env` secret references
/// of every container, and the secrets of volumes (secret, projected, and the plugins'
/// secret references). Every source of a volume is visited.
pub(crate) fn visit_secret_names<'a>(pod: &'a Value, visit: &mut dyn FnMut(&'a str)) {
    for reference in items(&pod["spec"]["imagePullSecrets"]) {
        visit_some(name_at(reference, &["name"]), visit);
    }
    for c in containers(pod) {
        for env in items(&c["envFrom"]) {
            visit_some(name_at(env, &["secretRef", "name"]), visit);
        }
        for env in items(&c["env"]) {
            visit_some(name_at(env, &["valueFrom", "secretKeyRef", "name"]), visit);
        }
    }
    const VOLUME_SECRETS: [&[&str]; 10] = [
        &["azureFile", "secretName"],
        &["cephfs", "secretRef", "name"],
        &["cinder", "secretRef", "name"],
        &["flexVolume", "secretRef", "name"],
        &["rbd", "secretRef", "name"],
        &["secret", "secretName"],
        &["scaleIO", "secretRef", "name"],
        &["iscsi", "secretRef", "name"],
        &["storageos", "secretRef", "name"],
        &["csi", "nodePublishSecretRef", "name"],
    ];
    for volume in items(&pod["spec"]["volumes"]) {
        for path in VOLUME_SECRETS {
            visit_some(name_at(volume, path), visit);
        }
        for source in items(&volume["projected"]["sources"]) {
            visit_some(name_at(source, &["secret", "name"]), visit);
        }
    }
}

/// Upstream's `VisitPodConfigmapNames`: `envFrom`/`env` configmap references of every
/// container, configMap volumes and projected configMap sources.
pub(crate) fn visit_configmap_names<'a>(pod: &'a Value, visit: &mut dyn FnMut(&'a str)) {
    for c in containers(pod) {
        for env in items(&c["envFrom"]) {
            visit_some(name_at(env, &["configMapRef", "name"]), visit);
        }
        for env in items(&c["env"]) {
            visit_some(
                name_at(env, &["valueFrom", "configMapKeyRef", "name"]),
                visit,
            );
        }
    }
    for volume in items(&pod["spec"]["volumes"]) {
        visit_some(name_at(volume, &["configMap", "name"]), visit);
        for source in items(&volume["projected"]["sources"]) {
            visit_some(name_at(source, &["configMap", "name"]), visit);
        }
    }
}

/// The claims of the pod's volumes: `persistentVolumeClaim.claimName`, and for a generic
/// ephemeral volume the claim `<pod>-<volume>` (upstream's `ephemeral.VolumeClaimName`).
fn visit_claim_names(pod: &Value, visit: &mut dyn FnMut(&str)) {
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or("");
    for volume in items(&pod["spec"]["volumes"]) {
        if let Some(claim) = name_at(volume, &["persistentVolumeClaim", "claimName"]) {
            visit(claim);
        } else if volume.get("ephemeral").is_some_and(Value::is_object) {
            let volume_name = volume["name"].as_str().unwrap_or("");
            visit(&format!("{pod_name}-{volume_name}"));
        }
    }
}

fn visit_some<'a>(name: Option<&'a str>, visit: &mut dyn FnMut(&'a str)) {
    if let Some(name) = name {
        visit(name);
    }
}

/// A pod in the graph: its node (interned) and what it references.
#[derive(Debug)]
struct PodVertex {
    node: u32,
    refs: Box<[(Vertex, Box<str>)]>,
}

/// An interned node name and how many pods are bound to it.
#[derive(Debug)]
struct NodeSlot {
    name: Box<str>,
    pods: u32,
}

/// The nodes an object reaches, sorted by node id, with the number of its pods on each.
type Reach = Vec<(u32, u32)>;

/// namespace -> name -> T.
type ByName<T> = HashMap<Box<str>, HashMap<Box<str>, T>>;

/// The graph of pods bound to nodes and the objects they reference (see the [module
/// docs](self)). Not synchronized: the API server keeps it behind a lock.
#[derive(Debug, Default)]
pub struct NodeGraph {
    node_ids: HashMap<Box<str>, u32>,
    nodes: Vec<NodeSlot>,
    free_node_ids: Vec<u32>,
    pods: ByName<PodVertex>,
    reach: [ByName<Reach>; Vertex::COUNT],
}

impl NodeGraph {
    /// An empty graph.
    pub fn new() -> Self {
        NodeGraph::default()
    }

    /// Sets the pod `ns/name` to `edges`, replacing what it contributed before; `None`
    /// removes it (deleted, or not bound to a node).
    pub fn set_pod(&mut self, ns: &str, name: &str, edges: Option<&PodEdges>) {
        if let (Some(new), Some(old)) = (edges, self.pods.get(ns).and_then(|p| p.get(name)))
            && self.nodes[old.node as usize].name.as_ref() == new.node
            && old.refs.len() == new.refs.len()
            && old
                .refs
                .iter()
                .zip(&new.refs)
                .all(|((k1, n1), (k2, n2))| k1 == k2 && n1.as_ref() == n2)
        {
            return;
        }
        self.remove_pod(ns, name);
        let Some(edges) = edges else {
            return;
        };
        let node = self.intern_node(&edges.node);
        for (kind, object) in &edges.refs {
            let reach = self.reach[kind.index()]
                .entry(ns.into())
                .or_default()
                .entry(object.as_str().into())
                .or_default();
            match reach.binary_search_by_key(&node, |(id, _)| *id) {
                Ok(i) => reach[i].1 += 1,
                Err(i) => reach.insert(i, (node, 1)),
            }
        }
        let refs = edges
            .refs
            .iter()
            .map(|(k, n)| (*k, n.as_str().into()))
            .collect();
        self.pods
            .entry(ns.into())
            .or_default()
            .insert(name.into(), PodVertex { node, refs });
    }

    fn remove_pod(&mut self, ns: &str, name: &str) {
        let Some(pods) = self.pods.get_mut(ns) else {
            return;
        };
        let Some(old) = pods.remove(name) else {
            return;
        };
        if pods.is_empty() {
            self.pods.remove(ns);
        }
        for (kind, object) in old.refs.iter() {
            let by_ns = &mut self.reach[kind.index()];
            let Some(objects) = by_ns.get_mut(ns) else {
                continue;
            };
            let Some(reach) = objects.get_mut(object.as_ref()) else {
                continue;
            };
            if let Ok(i) = reach.binary_search_by_key(&old.node, |(id, _)| *id) {
                reach[i].1 -= 1;
                if reach[i].1 == 0 {
                    reach.remove(i);
                }
            }
            if reach.is_empty() {
                objects.remove(object.as_ref());
                if objects.is_empty() {
                    by_ns.remove(ns);
                }
            }
        }
        self.release_node(old.node);
    }

    fn intern_node(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.node_ids.get(name) {
            self.nodes[id as usize].pods += 1;
            return id;
        }
        let slot = NodeSlot {
            name: name.into(),
            pods: 1,
        };
        let id = match self.free_node_ids.pop() {
            Some(id) => {
                self.nodes[id as usize] = slot;
                id
            }
            None => {
                self.nodes.push(slot);
                u32::try_from(self.nodes.len() - 1).expect("fewer than 2^32 nodes")
            }
        };
        self.node_ids.insert(name.into(), id);
        id
    }

    fn release_node(&mut self, id: u32) {
        let slot = &mut self.nodes[id as usize];
        slot.pods -= 1;
        if slot.pods == 0 {
            let name = std::mem::take(&mut slot.name);
            self.node_ids.remove(&name);
            self.free_node_ids.push(id);
        }
    }

    /// Upstream's `hasPathFrom`: whether the object `kind` `ns/name` reaches `node`
    /// through a pod bound to it.
    pub fn has_path(&self, kind: Vertex, ns: &str, name: &str, node: &str) -> bool {
        let Some(&node) = self.node_ids.get(node) else {
            return false;
        };
        self.reach[kind.index()]
            .get(ns)
            .and_then(|objects| objects.get(name))
            .is_some_and(|reach| reach.binary_search_by_key(&node, |(id, _)| *id).is_ok())
    }

    /// The node the pod `ns/name` is bound to, if it is in the graph.
    pub fn pod_node(&self, ns: &str, name: &str) -> Option<&str> {
        let pod = self.pods.get(ns)?.get(name)?;
        Some(&self.nodes[pod.node as usize].name)
    }

    /// How many pods are in the graph (bound to a node).
    pub fn pod_count(&self) -> usize {
        self.pods.values().map(HashMap::len).sum()
    }

    /// How many nodes have pods bound to them.
    pub fn node_count(&self) -> usize {
        self.node_ids.len()
    }

    /// How many (object, node) paths the graph holds.
    pub fn path_count(&self) -> usize {
        self.reach
            .iter()
            .flat_map(HashMap::values)
            .flat_map(HashMap::values)
            .map(Vec::len)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, node: &str, spec: Value) -> Value {
        let mut spec = spec;
        spec["nodeName"] = json!(node);
        json!({"metadata": {"name": name, "namespace": "ns"}, "spec": spec})
    }

    /// Upstream `VisitPodSecretNames`/`VisitPodConfigmapNames`, `AddPod`'s claims and
    /// service account, across all container kinds.
    #[test]
    fn pod_edges_cover_every_reference_of_upstream_add_pod() {
        let p = pod(
            "web",
            "n1",
            json!({
                "serviceAccountName": "sa",
                "imagePullSecrets": [{"name": "pull"}],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-env"}}]}],
                "containers": [{"name": "c",
                    "envFrom": [{"configMapRef": {"name": "cm-env"}}],
                    "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "k"}}},
                            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "k"}}}]}],
                "ephemeralContainers": [{"name": "debug", "env": [{"name": "C", "valueFrom": {"secretKeyRef": {"name": "eph", "key": "k"}}}]}],
                "volumes": [
                    {"name": "v1", "secret": {"secretName": "vol"}},
                    {"name": "v2", "configMap": {"name": "cm-vol"}},
                    {"name": "v3", "projected": {"sources": [{"secret": {"name": "proj"}}, {"configMap": {"name": "cm-proj"}}]}},
                    {"name": "v4", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi"}}},
                    {"name": "v5", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                    {"name": "v7", "secret": {"secretName": "vol"}}
                ]
            }),
        );
        let edges = PodEdges::of(&p).unwrap();
        assert_eq!(edges.node, "n1");
        let names = |kind: Vertex| -> Vec<&str> {
            edges
                .refs
                .iter()
                .filter(|(k, _)| *k == kind)
                .map(|(_, n)| n.as_str())
                .collect()
        };
        assert_eq!(
            names(Vertex::Secret),
            ["csi", "eph", "init-env", "proj", "pull", "s-key", "vol"]
        );
        assert_eq!(
            names(Vertex::ConfigMap),
            ["cm-env", "cm-key", "cm-proj", "cm-vol"]
        );
        assert_eq!(
            names(Vertex::PersistentVolumeClaim),
            ["data", "web-scratch"]
        );
        assert_eq!(names(Vertex::ServiceAccount), ["sa"]);
        // Unbound pods are not in the graph; mirror pods reach only their node.
        assert_eq!(
            PodEdges::of(&json!({"spec": {"serviceAccountName": "sa"}})),
            None
        );
        let mut mirror = p.clone();
        mirror["metadata"]["annotations"] = json!({MIRROR_POD_ANNOTATION: "x"});
        assert_eq!(PodEdges::of(&mirror).unwrap().refs, []);
    }

    /// Upstream `AddPod`/`DeletePod`/`hasPathFrom`: a path exists while some pod bound to
    /// the node references the object; moving or deleting the pod removes it, and a node
    /// with no pods is forgotten.
    #[test]
    fn paths_follow_pods_as_they_are_added_moved_and_deleted() {
        let mut g = NodeGraph::new();
        let spec = json!({"serviceAccountName": "sa", "volumes": [{"name": "v", "secret": {"secretName": "s"}}]});
        let a = PodEdges::of(&pod("a", "n1", spec.clone())).unwrap();
        let b = PodEdges::of(&pod("b", "n1", spec.clone())).unwrap();
        g.set_pod("ns", "a", Some(&a));
        g.set_pod("ns", "b", Some(&b));
        assert!(g.has_path(Vertex::Secret, "ns", "s", "n1"));
        assert!(g.has_path(Vertex::ServiceAccount, "ns", "sa", "n1"));
        assert!(!g.has_path(Vertex::Secret, "ns", "s", "n2"));
        assert!(!g.has_path(Vertex::Secret, "other", "s", "n1"));
        assert!(!g.has_path(Vertex::ConfigMap, "ns", "s", "n1"));
        assert_eq!(g.pod_node("ns", "a"), Some("n1"));
        // One of two pods goes: the path stays.
        g.set_pod("ns", "a", None);
        assert!(g.has_path(Vertex::Secret, "ns", "s", "n1"));
        // The other moves to n2 (recreated under the same name).
        let moved = PodEdges::of(&pod("b", "n2", spec)).unwrap();
        g.set_pod("ns", "b", Some(&moved));
        assert!(!g.has_path(Vertex::Secret, "ns", "s", "n1"));
        assert!(g.has_path(Vertex::Secret, "ns", "s", "n2"));
        assert_eq!(g.node_count(), 1);
        g.set_pod("ns", "b", None);
        assert!(!g.has_path(Vertex::ServiceAccount, "ns", "sa", "n2"));
        assert_eq!((g.pod_count(), g.node_count(), g.path_count()), (0, 0, 0));
        assert!(g.pods.is_empty() && g.reach.iter().all(HashMap::is_empty));
    }
}
