//! Hand-written descriptions of the shapes of the kinds this server serves, with the
//! per-field list semantics that strategic merge patch and server-side apply need.
//!
//! Only what changes merge behaviour is described: which fields are maps, which lists
//! merge by a key, which lists are sets of primitives, and which lists are atomic.
//! Fields not described fall back to [`TypeNode::Any`] (objects merge recursively,
//! lists are replaced whole), which is also what unknown kinds get.
//!
//! The list strategies follow the `patchStrategy` / `patchMergeKey` struct tags of the
//! upstream Go types (`k8s.io/api`), since those are what strategic merge patch reads.
//! A list without a `patchStrategy` tag is replaced whole, even where the Go type
//! declares `+listType=set` or `+listType=map` for server-side apply (for example the
//! `addresses` of an EndpointSlice endpoint); server-side apply here uses the same
//! description, which is one of its documented simplifications.

use std::collections::BTreeMap;
use std::sync::LazyLock;

/// How a list field is merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// The list is atomic: a patch or an apply replaces it whole.
    Replace,
    /// `patchStrategy:"merge"` with `patchMergeKey`: elements are objects identified by
    /// the value of this field and merged one by one.
    MergeByKey(&'static str),
    /// A custom resource's `x-kubernetes-list-type: map` with several
    /// `x-kubernetes-list-map-keys`: elements are objects identified by the values of all
    /// these fields together (structured-merge-diff's associative list keys).
    MergeByKeys(&'static [&'static str]),
    /// `patchStrategy:"merge"` on a list of primitives: the list behaves as a set.
    Set,
}

impl ListStrategy {
    /// Whether elements are objects merged one by one by their key fields.
    pub fn is_keyed(&self) -> bool {
        matches!(
            self,
            ListStrategy::MergeByKey(_) | ListStrategy::MergeByKeys(_)
        )
    }

    /// The key fields of a keyed list (none for the others).
    pub fn keys(&self) -> &[&'static str] {
        match self {
            ListStrategy::MergeByKey(key) => std::slice::from_ref(key),
            ListStrategy::MergeByKeys(keys) => keys,
            _ => &[],
        }
    }

    /// What identifies `element` in a keyed list: the value of its key, or with several
    /// keys the object of their values; `None` if a key is missing (or null).
    pub fn element_key(&self, element: &serde_json::Value) -> Option<serde_json::Value> {
        match self {
            ListStrategy::MergeByKey(key) => element.get(key).cloned(),
            ListStrategy::MergeByKeys(keys) => {
                let mut id = serde_json::Map::new();
                for key in keys.iter() {
                    let v = element.get(key).filter(|v| !v.is_null())?;
                    id.insert((*key).to_owned(), v.clone());
                }
                Some(serde_json::Value::Object(id))
            }
            _ => None,
        }
    }
}

/// The shape of a value, as far as merging is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum TypeNode {
    /// A struct with known fields; fields not listed are treated as [`TypeNode::Any`].
    Object(BTreeMap<&'static str, TypeNode>),
    /// A map from arbitrary string keys to values of one shape (labels, `data`, ...).
    Map(Box<TypeNode>),
    /// A list with its merge strategy and the shape of its items.
    List {
        /// How the list is merged.
        strategy: ListStrategy,
        /// The shape of each item.
        item: Box<TypeNode>,
    },
    /// A string, number, boolean or other value replaced whole.
    Scalar,
    /// A struct that server-side apply owns and replaces whole (`+structType=atomic` in
    /// the Go types: `LabelSelector`, `ObjectReference`, `OwnerReference`, `RoleRef`, the
    /// key selectors of `env[].valueFrom`): its fields are never owned one by one.
    /// Strategic merge patch, which reads only the patch tags, still merges it field by
    /// field.
    Atomic,
    /// Unknown structure: objects merge recursively field by field, lists are atomic.
    Any,
}

static ANY: TypeNode = TypeNode::Any;

impl TypeNode {
    /// The shape of the field (for objects) or value (for maps) named `name`; anything
    /// not described is [`TypeNode::Any`].
    pub fn field(&self, name: &str) -> &TypeNode {
        match self {
            TypeNode::Object(fields) => fields.get(name).unwrap_or(&ANY),
            TypeNode::Map(item) => item,
            _ => &ANY,
        }
    }

    /// The list strategy and item shape if this node is a list; `Any` and other nodes
    /// holding a list value treat it as atomic.
    pub fn list(&self) -> (ListStrategy, &TypeNode) {
        match self {
            TypeNode::List { strategy, item } => (*strategy, item),
            _ => (ListStrategy::Replace, &ANY),
        }
    }
}

fn obj<const N: usize>(fields: [(&'static str, TypeNode); N]) -> TypeNode {
    TypeNode::Object(fields.into_iter().collect())
}

fn map(item: TypeNode) -> TypeNode {
    TypeNode::Map(Box::new(item))
}

fn string_map() -> TypeNode {
    map(TypeNode::Scalar)
}

fn keyed(key: &'static str, item: TypeNode) -> TypeNode {
    TypeNode::List {
        strategy: ListStrategy::MergeByKey(key),
        item: Box::new(item),
    }
}

fn atomic(item: TypeNode) -> TypeNode {
    TypeNode::List {
        strategy: ListStrategy::Replace,
        item: Box::new(item),
    }
}

fn set() -> TypeNode {
    TypeNode::List {
        strategy: ListStrategy::Set,
        item: Box::new(TypeNode::Scalar),
    }
}

/// Wraps a kind's own top-level fields with `apiVersion`, `kind` and `metadata`.
fn kind<const N: usize>(fields: [(&'static str, TypeNode); N]) -> TypeNode {
    let mut all: BTreeMap<_, _> = fields.into_iter().collect();
    all.insert("apiVersion", TypeNode::Scalar);
    all.insert("kind", TypeNode::Scalar);
    all.insert("metadata", object_meta());
    TypeNode::Object(all)
}

fn object_meta() -> TypeNode {
    obj([
        ("labels", string_map()),
        ("annotations", string_map()),
        ("finalizers", set()),
        ("ownerReferences", keyed("uid", TypeNode::Atomic)),
        ("managedFields", atomic(TypeNode::Any)),
    ])
}

fn conditions() -> TypeNode {
    keyed("type", TypeNode::Any)
}

fn local_object_references() -> TypeNode {
    keyed("name", obj([("name", TypeNode::Scalar)]))
}

fn container() -> TypeNode {
    obj([
        ("name", TypeNode::Scalar),
        ("command", atomic(TypeNode::Scalar)),
        ("args", atomic(TypeNode::Scalar)),
        ("ports", keyed("containerPort", TypeNode::Any)),
        ("envFrom", atomic(TypeNode::Any)),
        (
            "env",
            keyed(
                "name",
                obj([(
                    "valueFrom",
                    obj([
                        ("configMapKeyRef", TypeNode::Atomic),
                        ("secretKeyRef", TypeNode::Atomic),
                        ("fieldRef", TypeNode::Atomic),
                        ("resourceFieldRef", TypeNode::Atomic),
                        ("fileKeyRef", TypeNode::Atomic),
                    ]),
                )]),
            ),
        ),
        (
            "resources",
            obj([
                ("limits", map(TypeNode::Scalar)),
                ("requests", map(TypeNode::Scalar)),
            ]),
        ),
        ("resizePolicy", atomic(TypeNode::Any)),
        ("volumeMounts", keyed("mountPath", TypeNode::Any)),
        ("volumeDevices", keyed("devicePath", TypeNode::Any)),
    ])
}

fn pod_spec() -> TypeNode {
    obj([
        ("volumes", keyed("name", TypeNode::Any)),
        ("initContainers", keyed("name", container())),
        ("containers", keyed("name", container())),
        ("ephemeralContainers", keyed("name", container())),
        ("nodeSelector", string_map()),
        ("imagePullSecrets", local_object_references()),
        ("tolerations", atomic(TypeNode::Any)),
        ("hostAliases", keyed("ip", TypeNode::Any)),
        ("readinessGates", atomic(TypeNode::Any)),
        ("overhead", map(TypeNode::Scalar)),
        (
            "topologySpreadConstraints",
            keyed("topologyKey", TypeNode::Any),
        ),
        ("schedulingGates", keyed("name", TypeNode::Any)),
        ("resourceClaims", keyed("name", TypeNode::Any)),
        ("evictionResponders", keyed("name", TypeNode::Any)),
    ])
}

fn pod_status() -> TypeNode {
    obj([
        ("conditions", conditions()),
        ("hostIPs", keyed("ip", TypeNode::Any)),
        ("podIPs", keyed("ip", TypeNode::Any)),
        ("initContainerStatuses", atomic(TypeNode::Any)),
        ("containerStatuses", atomic(TypeNode::Any)),
        ("ephemeralContainerStatuses", atomic(TypeNode::Any)),
        ("resourceClaimStatuses", keyed("name", TypeNode::Any)),
        (
            "nodeAllocatableResourceClaimStatuses",
            keyed("resourceClaimName", TypeNode::Any),
        ),
    ])
}

fn node() -> TypeNode {
    kind([
        (
            "spec",
            obj([("podCIDRs", set()), ("taints", atomic(TypeNode::Any))]),
        ),
        (
            "status",
            obj([
                ("capacity", map(TypeNode::Scalar)),
                ("allocatable", map(TypeNode::Scalar)),
                ("conditions", conditions()),
                ("addresses", keyed("type", TypeNode::Any)),
                ("images", atomic(TypeNode::Any)),
                ("volumesInUse", atomic(TypeNode::Scalar)),
                ("volumesAttached", atomic(TypeNode::Any)),
            ]),
        ),
    ])
}

fn pod() -> TypeNode {
    kind([("spec", pod_spec()), ("status", pod_status())])
}

/// A `PodTemplateSpec`: the metadata and spec of the pods a workload creates.
fn pod_template() -> TypeNode {
    obj([("metadata", object_meta()), ("spec", pod_spec())])
}

/// A workload kind (Deployment, ReplicaSet, DaemonSet, StatefulSet, Job,
/// ReplicationController): `spec.template` is a pod template and `status.conditions`
/// merge by `type`, as their Go types' tags say.
fn workload(extra_spec: TypeNode) -> TypeNode {
    let TypeNode::Object(mut spec) = extra_spec else {
        unreachable!("workload specs are objects")
    };
    spec.insert("template", pod_template());
    spec.insert("selector", TypeNode::Atomic);
    kind([
        ("spec", TypeNode::Object(spec)),
        ("status", obj([("conditions", conditions())])),
    ])
}

fn stateful_set() -> TypeNode {
    // `volumeClaimTemplates` carries no patch strategy: replaced whole.
    workload(obj([("volumeClaimTemplates", atomic(TypeNode::Any))]))
}

fn cron_job() -> TypeNode {
    kind([
        (
            "spec",
            obj([(
                "jobTemplate",
                obj([
                    ("metadata", object_meta()),
                    ("spec", obj([("template", pod_template())])),
                ]),
            )]),
        ),
        ("status", obj([("active", atomic(TypeNode::Any))])),
    ])
}

fn pod_template_kind() -> TypeNode {
    kind([("template", pod_template())])
}

fn pod_disruption_budget() -> TypeNode {
    kind([
        ("spec", obj([("selector", TypeNode::Atomic)])),
        ("status", obj([("conditions", conditions())])),
    ])
}

fn service() -> TypeNode {
    kind([
        (
            "spec",
            obj([
                ("ports", keyed("port", TypeNode::Any)),
                ("selector", string_map()),
                ("clusterIPs", atomic(TypeNode::Scalar)),
                ("externalIPs", atomic(TypeNode::Scalar)),
                ("loadBalancerSourceRanges", atomic(TypeNode::Scalar)),
                ("ipFamilies", atomic(TypeNode::Scalar)),
            ]),
        ),
        (
            "status",
            obj([
                ("loadBalancer", obj([("ingress", atomic(TypeNode::Any))])),
                ("conditions", conditions()),
            ]),
        ),
    ])
}

fn endpoints() -> TypeNode {
    // EndpointSubset and its lists carry no patch strategy: everything is atomic.
    kind([("subsets", atomic(TypeNode::Any))])
}

fn core_event() -> TypeNode {
    kind([
        ("involvedObject", TypeNode::Atomic),
        ("related", TypeNode::Atomic),
    ])
}

fn role_binding() -> TypeNode {
    kind([("roleRef", TypeNode::Atomic)])
}

fn namespace() -> TypeNode {
    kind([
        ("spec", obj([("finalizers", atomic(TypeNode::Scalar))])),
        ("status", obj([("conditions", conditions())])),
    ])
}

fn config_map() -> TypeNode {
    kind([("data", string_map()), ("binaryData", string_map())])
}

fn secret() -> TypeNode {
    kind([("data", string_map()), ("stringData", string_map())])
}

fn service_account() -> TypeNode {
    kind([
        ("secrets", keyed("name", TypeNode::Any)),
        ("imagePullSecrets", atomic(TypeNode::Any)),
    ])
}

fn lease() -> TypeNode {
    kind([("spec", obj([]))])
}

fn endpoint_slice() -> TypeNode {
    kind([
        ("endpoints", atomic(TypeNode::Any)),
        ("ports", atomic(TypeNode::Any)),
    ])
}

fn events_event() -> TypeNode {
    kind([
        ("regarding", TypeNode::Atomic),
        ("related", TypeNode::Atomic),
    ])
}

fn generic() -> TypeNode {
    kind([])
}

static NODE: LazyLock<TypeNode> = LazyLock::new(node);
static POD: LazyLock<TypeNode> = LazyLock::new(pod);
static SERVICE: LazyLock<TypeNode> = LazyLock::new(service);
static ENDPOINTS: LazyLock<TypeNode> = LazyLock::new(endpoints);
static CORE_EVENT: LazyLock<TypeNode> = LazyLock::new(core_event);
static NAMESPACE: LazyLock<TypeNode> = LazyLock::new(namespace);
static CONFIG_MAP: LazyLock<TypeNode> = LazyLock::new(config_map);
static SECRET: LazyLock<TypeNode> = LazyLock::new(secret);
static SERVICE_ACCOUNT: LazyLock<TypeNode> = LazyLock::new(service_account);
static LEASE: LazyLock<TypeNode> = LazyLock::new(lease);
static ENDPOINT_SLICE: LazyLock<TypeNode> = LazyLock::new(endpoint_slice);
static EVENTS_EVENT: LazyLock<TypeNode> = LazyLock::new(events_event);
static GENERIC: LazyLock<TypeNode> = LazyLock::new(generic);
static ROLE_BINDING: LazyLock<TypeNode> = LazyLock::new(role_binding);
static WORKLOAD: LazyLock<TypeNode> = LazyLock::new(|| workload(obj([])));
static STATEFUL_SET: LazyLock<TypeNode> = LazyLock::new(stateful_set);
static CRON_JOB: LazyLock<TypeNode> = LazyLock::new(cron_job);
static POD_TEMPLATE: LazyLock<TypeNode> = LazyLock::new(pod_template_kind);
static POD_DISRUPTION_BUDGET: LazyLock<TypeNode> = LazyLock::new(pod_disruption_budget);

/// The schema of a kind, by API group (`""` for core) and kind name.
///
/// Unknown kinds get a generic object schema: `metadata` is described as for every
/// kind, other objects merge recursively and other lists are replaced whole.
pub fn schema_for(group: &str, kind: &str) -> &'static TypeNode {
    match (group, kind) {
        ("", "Node") => &NODE,
        ("", "Pod") => &POD,
        ("", "Service") => &SERVICE,
        ("", "Endpoints") => &ENDPOINTS,
        ("", "Event") => &CORE_EVENT,
        ("", "Namespace") => &NAMESPACE,
        ("", "ConfigMap") => &CONFIG_MAP,
        ("", "Secret") => &SECRET,
        ("", "ServiceAccount") => &SERVICE_ACCOUNT,
        ("coordination.k8s.io", "Lease") => &LEASE,
        ("discovery.k8s.io", "EndpointSlice") => &ENDPOINT_SLICE,
        ("events.k8s.io", "Event") => &EVENTS_EVENT,
        ("apps", "Deployment" | "ReplicaSet" | "DaemonSet")
        | ("batch", "Job")
        | ("", "ReplicationController") => &WORKLOAD,
        ("apps", "StatefulSet") => &STATEFUL_SET,
        ("batch", "CronJob") => &CRON_JOB,
        ("", "PodTemplate") => &POD_TEMPLATE,
        ("policy", "PodDisruptionBudget") => &POD_DISRUPTION_BUDGET,
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => &ROLE_BINDING,
        _ => &GENERIC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(node: &TypeNode, path: &[&str]) -> ListStrategy {
        let leaf = path.iter().fold(node, |n, p| match n {
            TypeNode::List { item, .. } => item.field(p),
            other => other.field(p),
        });
        leaf.list().0
    }

    #[test]
    fn node_lists_follow_the_go_tags() {
        let node = schema_for("", "Node");
        assert_eq!(
            strategy(node, &["status", "conditions"]),
            ListStrategy::MergeByKey("type")
        );
        assert_eq!(
            strategy(node, &["status", "addresses"]),
            ListStrategy::MergeByKey("type")
        );
        assert_eq!(strategy(node, &["spec", "taints"]), ListStrategy::Replace);
        assert_eq!(strategy(node, &["spec", "podCIDRs"]), ListStrategy::Set);
        assert_eq!(
            strategy(node, &["metadata", "finalizers"]),
            ListStrategy::Set
        );
        assert_eq!(
            strategy(node, &["metadata", "ownerReferences"]),
            ListStrategy::MergeByKey("uid")
        );
        assert_eq!(
            strategy(node, &["metadata", "managedFields"]),
            ListStrategy::Replace
        );
    }

    #[test]
    fn pod_and_service_lists_follow_the_go_tags() {
        let pod = schema_for("", "Pod");
        assert_eq!(
            strategy(pod, &["spec", "containers"]),
            ListStrategy::MergeByKey("name")
        );
        assert_eq!(
            strategy(pod, &["spec", "containers", "ports"]),
            ListStrategy::MergeByKey("containerPort")
        );
        assert_eq!(
            strategy(pod, &["spec", "initContainers", "volumeMounts"]),
            ListStrategy::MergeByKey("mountPath")
        );
        assert_eq!(
            strategy(pod, &["spec", "containers", "env"]),
            ListStrategy::MergeByKey("name")
        );
        assert_eq!(
            strategy(pod, &["spec", "tolerations"]),
            ListStrategy::Replace
        );
        assert_eq!(
            strategy(pod, &["status", "conditions"]),
            ListStrategy::MergeByKey("type")
        );
        let svc = schema_for("", "Service");
        assert_eq!(
            strategy(svc, &["spec", "ports"]),
            ListStrategy::MergeByKey("port")
        );
    }

    #[test]
    fn unknown_kinds_get_the_generic_schema() {
        let s = schema_for("example.com", "Widget");
        assert_eq!(strategy(s, &["spec", "items"]), ListStrategy::Replace);
        assert_eq!(strategy(s, &["metadata", "finalizers"]), ListStrategy::Set);
        assert!(std::ptr::eq(s, schema_for("", "NoSuchKind")));
    }
}
