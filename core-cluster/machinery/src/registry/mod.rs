//! The resources the API server serves: one [`ResourceDef`] per resource, each a few lines
//! of identity plus its strategy (defaulting, validation, table columns, field selectors).
//! The API server's HTTP layer runs every verb generically over these definitions.

pub mod allocator;
pub mod authorization;
pub mod certificates;
pub mod events;
mod field;
pub mod meta;
pub(crate) mod pod_spec;
pub mod policy;
pub mod quantity;
pub mod resources;
pub mod selectors;
pub mod table;
pub mod workloads;
mod zero;

use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::crd::Served;

pub use field::FieldError;

/// Every served resource, in discovery order.
pub static ALL: &[&ResourceDef] = &[
    &resources::NAMESPACES,
    &resources::NODES,
    &resources::PODS,
    &resources::SERVICES,
    &resources::ENDPOINTS,
    &resources::EVENTS,
    &resources::SERVICE_ACCOUNTS,
    &resources::CONFIG_MAPS,
    &resources::SECRETS,
    &resources::LEASES,
    &resources::ENDPOINT_SLICES,
    &resources::EVENTS_V1,
    &resources::TOKEN_REVIEWS,
    &resources::SELF_SUBJECT_REVIEWS,
    &authorization::ROLES,
    &authorization::CLUSTER_ROLES,
    &authorization::ROLE_BINDINGS,
    &authorization::CLUSTER_ROLE_BINDINGS,
    &authorization::SUBJECT_ACCESS_REVIEWS,
    &authorization::LOCAL_SUBJECT_ACCESS_REVIEWS,
    &authorization::SELF_SUBJECT_ACCESS_REVIEWS,
    &authorization::SELF_SUBJECT_RULES_REVIEWS,
    &workloads::DEPLOYMENTS,
    &workloads::REPLICA_SETS,
    &workloads::DAEMON_SETS,
    &workloads::JOBS,
    &policy::POD_DISRUPTION_BUDGETS,
    &certificates::CERTIFICATE_SIGNING_REQUESTS,
    &crate::crd::CUSTOM_RESOURCE_DEFINITIONS,
    &crate::apiservice::API_SERVICES,
];

pub use meta::NameRule;
pub use pod_spec::add_default_tolerations;
pub use table::Column;

/// A served resource and its strategy.
#[derive(Debug)]
pub struct ResourceDef {
    /// API group; empty for core.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Plural name, used in URLs.
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Short names (`no`, `po`, `svc`).
    pub short_names: &'static [&'static str],
    /// Categories (`all`).
    pub categories: &'static [&'static str],
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether it has a `status` subresource (the main resource then ignores status
    /// changes, and the subresource ignores everything else).
    pub status: bool,
    /// Whether `metadata.generation` counts spec changes. Upstream sets it for workloads and
    /// pods, not for Nodes, Services and the other core objects served here.
    pub generation: bool,
    /// Other subresources (`binding`, `eviction`).
    pub extra_subresources: &'static [&'static str],
    /// Storage location, `<group or core>/<plural>`. Two versions of one resource (core and
    /// `events.k8s.io` events) share it.
    pub storage: &'static str,
    /// The name rule.
    pub name_rule: NameRule,
    /// Round-trips an object through its k8s-openapi type: a decode error means a malformed
    /// object; keys missing from the result are unknown fields.
    pub typed: fn(&Value) -> Result<Value, String>,
    /// Table columns for `kubectl get`.
    pub columns: &'static [Column],
    /// Resource-specific field-selector values (beyond `metadata.name`/`namespace`).
    pub field: fn(&Value, &str) -> Option<String>,
    /// The field-selector paths supported beyond `metadata.name` and `metadata.namespace`.
    pub field_paths: &'static [&'static str],
    /// Defaulting and system fields on create (not run for status writes).
    pub prepare_create: fn(&mut Value),
    /// Defaulting on updates and patches of the object (not of its status): what upstream's
    /// defaulting, which runs on every decoded write, adds that `prepare_create` also adds.
    /// [`no_defaults`] for most kinds.
    pub prepare_update: fn(&mut Value),
    /// Validation of a new object, or of an update (with the old object).
    pub validate: fn(&Value, Option<&Value>) -> Vec<FieldError>,
    /// Converts an object of this version to its storage form.
    pub to_storage: fn(Value) -> Value,
    /// Converts a stored object to this version.
    pub from_storage: fn(Value) -> Value,
}

impl ResourceDef {
    /// `v1` or `coordination.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The storage key prefix of the resource, or of one namespace of it.
    pub fn key_prefix(&self, namespace: Option<&str>) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("/registry/{}/{}/", self.storage, ns),
            _ => format!("/registry/{}/", self.storage),
        }
    }

    /// The storage key of one object.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        format!(
            "{}{}",
            self.key_prefix(namespace.filter(|_| self.namespaced)),
            name
        )
    }

    /// The value of a field-selector path on an object, or `None` if the path is not
    /// supported for this resource.
    pub fn field_value(&self, obj: &Value, path: &str) -> Option<String> {
        match path {
            "metadata.name" => Some(
                meta::str_at(obj, &["metadata", "name"])
                    .unwrap_or("")
                    .to_owned(),
            ),
            "metadata.namespace" => Some(
                meta::str_at(obj, &["metadata", "namespace"])
                    .unwrap_or("")
                    .to_owned(),
            ),
            other => match crate::crd::custom(self) {
                Some(custom) => crate::crd::selectable_value(&custom, obj, other),
                None => (self.field)(obj, other),
            },
        }
    }

    /// Whether `DELETE` on the collection (`deletecollection`) is served: see
    /// [`serves_deletecollection`].
    pub fn deletecollection(&self) -> bool {
        serves_deletecollection(self.group, self.plural)
    }

    /// Whether a field-selector path is supported.
    pub fn supports_field(&self, path: &str) -> bool {
        matches!(path, "metadata.name" | "metadata.namespace")
            || self.field_paths.contains(&path)
            || crate::crd::custom(self).is_some_and(|c| c.selectable.iter().any(|p| p == path))
    }
}

/// Whether `DELETE` on the collection of `plural` in `group` (`deletecollection`) is served:
/// not for namespaces, as upstream (discovery does not list it, the OpenAPI document has no
/// such operation, and the request is a 405).
pub fn serves_deletecollection(group: &str, plural: &str) -> bool {
    !(group.is_empty() && plural == "namespaces")
}

/// No defaulting (a [`ResourceDef::prepare_create`] or [`ResourceDef::prepare_update`]).
pub fn no_defaults(_: &mut Value) {}

/// What upstream's `PrepareForUpdate` of some kinds derives from the stored object, for a
/// write of `def` (of its `subresource`, if any), to run right after
/// [`ResourceDef::prepare_update`] (and before the managed fields are recorded, which own
/// what it sets, as upstream's do): `new` is the object to store, with the system metadata
/// of `old`, the stored one.
///
/// - DaemonSets: the template-generation annotation is the old one, one more when the
///   template changed (`pkg/registry/apps/daemonset/strategy.go`).
/// - EndpointSlices: the generation counts any change but of the metadata, and a change of
///   the labels (`pkg/registry/discovery/endpointslice/strategy.go`).
/// - CertificateSigningRequests, through `status` and `approval`: the conditions' unset
///   times are now, a condition's transition time the old one of the same type and status
///   (`populateConditionTimestamps`, `pkg/registry/certificates/certificates/strategy.go`).
pub fn prepare_update_from_old(
    def: &ResourceDef,
    new: &mut Value,
    old: &Value,
    subresource: Option<&str>,
) {
    match (def.group, def.plural) {
        ("apps", "daemonsets") => workloads::update_daemon_set(new, old),
        ("discovery.k8s.io", "endpointslices") => resources::update_endpoint_slice(new, old),
        ("certificates.k8s.io", "certificatesigningrequests")
            if matches!(subresource, Some("status" | "approval")) =>
        {
            certificates::populate_condition_timestamps(new, old, &meta::now_rfc3339());
        }
        _ => {}
    }
}

/// Round-trips through the k8s-openapi type `K` (see [`ResourceDef::typed`]).
pub fn typed<K: DeserializeOwned + Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: K = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

/// Go's zero `metav1.Time`, put in for an unset condition time while the object goes
/// through its k8s-openapi type (which requires one) and taken out again after.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Round-trips through `K` as [`typed`] does, decoding the `metav1.Condition` lists at the
/// JSON pointers `lists` (`/status/conditions`) as upstream's decoder does: a condition
/// without `lastTransitionTime`, or with a null one, is a zero time there (its validation,
/// where a kind has one, decides whether that is allowed), where k8s-openapi's `Condition`
/// requires the field. The result keeps such a time as it was given: absent or null.
pub fn typed_with_conditions<K: DeserializeOwned + Serialize>(
    obj: &Value,
    lists: &[&str],
) -> Result<Value, String> {
    let mut filled = obj.clone();
    // (list, entry, whether the time was an explicit null)
    let mut unset: Vec<(&str, usize, bool)> = Vec::new();
    for list in lists {
        let Some(entries) = filled.pointer_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for (i, entry) in entries.iter_mut().enumerate() {
            let Some(condition) = entry.as_object_mut() else {
                continue;
            };
            let explicit_null = match condition.get("lastTransitionTime") {
                None => false,
                Some(Value::Null) => true,
                Some(_) => continue,
            };
            unset.push((list, i, explicit_null));
            condition.insert("lastTransitionTime".into(), Value::from(ZERO_TIME));
        }
    }
    let mut normalized = typed::<K>(&filled)?;
    for (list, i, explicit_null) in unset {
        let Some(condition) = normalized
            .pointer_mut(list)
            .and_then(Value::as_array_mut)
            .and_then(|entries| entries.get_mut(i))
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        if explicit_null {
            condition.insert("lastTransitionTime".into(), Value::Null);
        } else {
            condition.remove("lastTransitionTime");
        }
    }
    Ok(normalized)
}

/// The paths of keys present (and not null) in `given` but absent from `known`: the unknown
/// fields of a write, for `fieldValidation=Strict`.
pub fn unknown_fields(given: &Value, known: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_unknown(given, known, String::new(), &mut out);
    out
}

fn collect_unknown(given: &Value, known: &Value, path: String, out: &mut Vec<String>) {
    match (given, known) {
        (Value::Object(g), Value::Object(k)) => {
            for (key, value) in g {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match k.get(key) {
                    Some(known_value) => collect_unknown(value, known_value, child, out),
                    None if value.is_null() => {}
                    None => out.push(child),
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (i, (gv, kv)) in g.iter().zip(k).enumerate() {
                collect_unknown(gv, kv, format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// The set of served resources: the built-in ones ([`ALL`]) and those that custom resource
/// definitions add and remove at run time.
///
/// How it grows and shrinks: the built-in definitions are a plain slice, searched first
/// and without a lock, so a request for a built-in resource costs what it did. The custom
/// ones are a list of `(definition name, served versions)` behind a lock that only the
/// CRD controller writes (see [`Registry::set_custom`]); a request for a custom resource,
/// or one that matches nothing built in, takes a short read lock. Clones share the custom
/// list, so the API server's routing, discovery and its storage layer see one set.
///
/// The registry holds each custom definition's [`Served`]: what serves a definition lives
/// as long as a registry serves it (see [`crate::crd`]).
#[derive(Debug, Clone)]
pub struct Registry {
    defs: &'static [&'static ResourceDef],
    custom: Arc<RwLock<Vec<CustomEntry>>>,
}

/// One custom resource definition's name and the versions it serves.
type CustomEntry = (String, Arc<Served>);

impl Registry {
    /// The standard set (see [`ALL`]), with no custom resources yet.
    pub fn standard() -> Self {
        Registry {
            defs: ALL,
            custom: Arc::default(),
        }
    }

    /// Every resource: the built-in ones in discovery order, then the custom ones in the
    /// order their definitions were established.
    pub fn all(&self) -> Vec<&'static ResourceDef> {
        let mut out = self.defs.to_vec();
        for (_, served) in self.custom.read().iter() {
            out.extend(served.defs().iter().copied());
        }
        out
    }

    /// The built-in resources alone.
    pub fn builtin(&self) -> &'static [&'static ResourceDef] {
        self.defs
    }

    /// The resource at `group/version/plural`.
    pub fn find(&self, group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
        let matches =
            |d: &&ResourceDef| d.group == group && d.version == version && d.plural == plural;
        if let Some(d) = self.defs.iter().copied().find(matches) {
            return Some(d);
        }
        self.custom
            .read()
            .iter()
            .flat_map(|(_, served)| served.defs().iter().copied())
            .find(matches)
    }

    /// Serves `defs` (the versions of the custom resource definition `name`), replacing
    /// what that definition served before.
    pub fn set_custom(&self, name: &str, served: Arc<Served>) {
        let mut custom = self.custom.write();
        let replaced = match custom.iter_mut().find(|(n, _)| n == name) {
            Some((_, current)) => Some(std::mem::replace(current, served)),
            None => {
                custom.push((name.to_owned(), served));
                None
            }
        };
        // What it replaced is let go once the lock is released.
        drop(custom);
        drop(replaced);
    }

    /// Stops serving what the custom resource definition `name` served.
    pub fn remove_custom(&self, name: &str) {
        let removed: Vec<CustomEntry> = {
            let mut custom = self.custom.write();
            let (gone, kept) = std::mem::take(&mut *custom)
                .into_iter()
                .partition(|(n, _)| n == name);
            *custom = kept;
            gone
        };
        drop(removed);
    }

    /// The versions the custom resource definition `name` serves now.
    pub fn custom(&self, name: &str) -> Vec<&'static ResourceDef> {
        self.custom
            .read()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, served)| served.defs().to_vec())
            .unwrap_or_default()
    }

    /// The names of the custom resource definitions served now.
    pub fn custom_names(&self) -> Vec<String> {
        self.custom.read().iter().map(|(n, _)| n.clone()).collect()
    }

    /// The group-versions served, core first.
    pub fn group_versions(&self) -> Vec<(&'static str, &'static str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for d in self.all() {
            if !out.contains(&(d.group, d.version)) {
                out.push((d.group, d.version));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn unknown_fields_are_found_at_any_depth() {
        let given = json!({"spec": {"a": 1, "bogus": 2, "list": [{"x": 1, "y": 2}]}, "gone": null});
        let known = json!({"spec": {"a": 1, "list": [{"x": 1}]}});
        assert_eq!(
            unknown_fields(&given, &known),
            ["spec.bogus", "spec.list[0].y"]
        );
    }

    /// The stored object's part in an update, by kind: the DaemonSet's template generation
    /// (`daemonSetStrategy.PrepareForUpdate`), the EndpointSlice's generation
    /// (`endpointSliceStrategy.PrepareForUpdate`), a CSR's condition times through its
    /// `status` and `approval` subresources only (`populateConditionTimestamps`).
    #[test]
    fn updates_take_what_upstream_derives_from_the_stored_object() {
        let registry = Registry::standard();
        let ds = registry.find("apps", "v1", "daemonsets").unwrap();
        let old = json!({"metadata": {"annotations": {workloads::TEMPLATE_GENERATION: "2"}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "a"}]}}}});
        let mut new = json!({"metadata": {},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "b"}]}}}});
        prepare_update_from_old(ds, &mut new, &old, None);
        assert_eq!(
            new["metadata"]["annotations"][workloads::TEMPLATE_GENERATION],
            "3"
        );
        let slices = registry
            .find("discovery.k8s.io", "v1", "endpointslices")
            .unwrap();
        let old = json!({"metadata": {"generation": 1}, "addressType": "IPv4"});
        let mut new = json!({"metadata": {"generation": 1}, "addressType": "IPv6"});
        prepare_update_from_old(slices, &mut new, &old, None);
        assert_eq!(new["metadata"]["generation"], 2);
        let csrs = registry
            .find("certificates.k8s.io", "v1", "certificatesigningrequests")
            .unwrap();
        let old = json!({"status": {}});
        let conditions =
            json!({"status": {"conditions": [{"type": "Approved", "status": "True"}]}});
        let mut main = conditions.clone();
        prepare_update_from_old(csrs, &mut main, &old, None);
        assert_eq!(main, conditions);
        let mut approval = conditions.clone();
        prepare_update_from_old(csrs, &mut approval, &old, Some("approval"));
        assert!(approval["status"]["conditions"][0]["lastUpdateTime"].is_string());
        assert!(approval["status"]["conditions"][0]["lastTransitionTime"].is_string());
    }

    #[test]
    fn keys_are_isolated_by_namespace() {
        let pods = Registry::standard().find("", "v1", "pods").unwrap();
        assert_eq!(pods.key(Some("a"), "p"), "/registry/core/pods/a/p");
        assert_eq!(pods.key_prefix(Some("a")), "/registry/core/pods/a/");
        let nodes = Registry::standard().find("", "v1", "nodes").unwrap();
        assert_eq!(nodes.key(None, "n1"), "/registry/core/nodes/n1");
    }
}
