//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`): the definition's own resource
//! ([`CUSTOM_RESOURCE_DEFINITIONS`]) with upstream's validation
//! (`apiextensions-apiserver/pkg/apis/apiextensions/validation`), and the
//! [`ResourceDef`]s a definition serves ([`served_defs`]), one per served version.
//!
//! How a custom resource is served, and how long what serves it lives: the `served`
//! module's docs ([`served_defs`], [`Served`], [`custom`]). Which groups a definition may
//! claim: [`groups`]. How a schema's `pattern` is compiled: [`pattern`].

pub mod cel;
pub mod groups;
pub mod pattern;
pub mod schema;
mod served;

pub use served::{
    Custom, MergeSchema, PATCH_TYPES, PrinterColumn, ScalePaths, Served, custom, is_custom,
    merge_node, merge_schema, served_defs,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

use crate::registry::{
    Column, FieldError, NameRule, ResourceDef, meta, no_defaults,
    table::{AGE, NAME},
    typed,
};

/// The group of custom resource definitions.
pub const GROUP: &str = "apiextensions.k8s.io";

/// The finalizer that makes deleting a definition delete its objects first (upstream's
/// `apiextensionsv1.CustomResourceCleanupFinalizer`).
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

fn identity(v: Value) -> Value {
    v
}

fn no_fields(_: &Value, _: &str) -> Option<String> {
    None
}

/// `apiextensions.k8s.io/v1` customresourcedefinitions.
pub static CUSTOM_RESOURCE_DEFINITIONS: ResourceDef = ResourceDef {
    group: GROUP,
    version: "v1",
    kind: "CustomResourceDefinition",
    plural: "customresourcedefinitions",
    singular: "customresourcedefinition",
    short_names: &["crd", "crds"],
    categories: &["api-extensions"],
    namespaced: false,
    status: true,
    generation: true,
    extra_subresources: &[],
    storage: "apiextensions.k8s.io/customresourcedefinitions",
    name_rule: NameRule::Subdomain,
    typed: typed::<CustomResourceDefinition>,
    columns: &[
        NAME,
        Column {
            name: "Created At",
            type_: "date",
            format: "",
            description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
            priority: 0,
            cell: |o, _| o["metadata"]["creationTimestamp"].clone(),
        },
    ],
    field: no_fields,
    field_paths: &[],
    prepare_create: prepare_crd,
    prepare_update: no_defaults,
    validate: validate_crd,
    to_storage: identity,
    from_storage: identity,
};

/// `customresourcedefinition/strategy.go PrepareForCreate`: the status is the server's
/// (no conditions yet, the storage version recorded), and the cleanup finalizer is set so
/// that a deletion removes the objects first.
fn prepare_crd(o: &mut Value) {
    let storage = storage_version(o).unwrap_or_default();
    o["status"] = json!({
        "conditions": [],
        "acceptedNames": {"plural": "", "kind": ""},
        "storedVersions": [storage],
    });
    let meta = meta::meta_mut(o);
    let finalizers = meta.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(list) = finalizers.as_array_mut()
        && !list.iter().any(|f| f == CLEANUP_FINALIZER)
    {
        list.push(json!(CLEANUP_FINALIZER));
    }
}

/// The name of the version marked `storage: true`.
pub fn storage_version(crd: &Value) -> Option<String> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["storage"] == true)
        .and_then(|v| v["name"].as_str())
        .map(str::to_owned)
}

const DNS1035_MESSAGE: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && (b[b.len() - 1].is_ascii_lowercase() || b[b.len() - 1].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn check_label(field: String, value: &Value, errors: &mut Vec<FieldError>) {
    let s = value.as_str().unwrap_or("");
    if !is_dns1035_label(s) {
        errors.push(FieldError::invalid(field, value, DNS1035_MESSAGE));
    }
}

/// `validation.ValidateCustomResourceDefinitionNames`.
fn validate_names(names: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let plural = names["plural"].as_str().unwrap_or("");
    if plural.is_empty() {
        errors.push(FieldError::required(format!("{path}.plural"), ""));
    } else {
        check_label(format!("{path}.plural"), &names["plural"], errors);
    }
    if let Some(singular) = names["singular"].as_str().filter(|s| !s.is_empty()) {
        check_label(format!("{path}.singular"), &json!(singular), errors);
    }
    let kind = names["kind"].as_str().unwrap_or("");
    if kind.is_empty() {
        errors.push(FieldError::required(format!("{path}.kind"), ""));
    } else if !is_dns1035_label(&kind.to_lowercase()) {
        errors.push(FieldError::invalid(
            format!("{path}.kind"),
            &names["kind"],
            "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
        ));
    }
    if let Some(list_kind) = names["listKind"].as_str().filter(|s| !s.is_empty()) {
        if !is_dns1035_label(&list_kind.to_lowercase()) {
            errors.push(FieldError::invalid(
                format!("{path}.listKind"),
                &names["listKind"],
                "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
            ));
        }
        if list_kind == kind {
            errors.push(FieldError::invalid(
                format!("{path}.listKind"),
                &names["listKind"],
                "kind and listKind may not be the same or parsing become ambiguous",
            ));
        }
    }
    for (key, _) in [("shortNames", ()), ("categories", ())] {
        if let Some(list) = names[key].as_array() {
            for (i, s) in list.iter().enumerate() {
                check_label(format!("{path}.{key}[{i}]"), s, errors);
            }
        }
    }
}

/// `validation.ValidateCustomResourceDefinition` (and `...Update`): the definition's
/// [`spec_errors`], then its API approval ([`groups::approval_errors`]) and, on update, the
/// immutable fields.
///
/// An update that leaves the name and `spec` as they are (status, finalizers, labels) is
/// not judged on its spec again: a definition stored before a newer check (see
/// [`served_defs`]) can still have its cleanup finalizer removed, and so be deleted.
pub fn validate_crd(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    if let Some(old) = old
        && old["spec"] == new["spec"]
        && old["metadata"]["name"] == new["metadata"]["name"]
    {
        return groups::approval_errors(new, Some(old));
    }
    let unchanged = old
        .map(unchanged_schemas)
        .map_or_else(Default::default, |f| f(new));
    let mut errors = spec_errors_with(new, &unchanged);
    errors.extend(groups::approval_errors(new, old));
    if let Some(old) = old {
        for field in ["group", "scope"] {
            if old["spec"][field] != new["spec"][field] {
                errors.push(FieldError::invalid(
                    format!("spec.{field}"),
                    &new["spec"][field],
                    "field is immutable",
                ));
            }
        }
    }
    errors
}

/// What makes a definition servable, as `ValidateCustomResourceDefinitionSpec` checks it:
/// the name is `<plural>.<group>`, the group has a dot and is not a built-in one
/// ([`groups::builtin_group_error`]), the names are DNS-1035 labels, the scope is known,
/// exactly one served version is the storage one, every version has a structural schema
/// whose patterns and rules compile, and the conversion is `None` (a webhook conversion is
/// refused: this server does not call webhooks).
pub fn spec_errors(new: &Value) -> Vec<FieldError> {
    spec_errors_with(new, &std::collections::HashSet::new())
}

/// Upstream's `findVersionsWithUnchangedSchemas`: the versions of `new` whose schema is the
/// one `old` has for the same version.
fn unchanged_schemas(old: &Value) -> impl Fn(&Value) -> std::collections::HashSet<String> + '_ {
    move |new: &Value| {
        let schema_of = |crd: &Value, name: &str| {
            crd["spec"]["versions"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["name"] == name))
                .map(|v| v["schema"].clone())
        };
        new["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v["name"].as_str())
            .filter(|name| {
                let mine = schema_of(new, name);
                mine.is_some() && mine == schema_of(old, name)
            })
            .map(str::to_owned)
            .collect()
    }
}

/// The versions of `crd`, all of them (a stored definition, judged as if unchanged).
pub fn all_versions(crd: &Value) -> std::collections::HashSet<String> {
    crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect()
}

/// [`spec_errors`], the versions in `unchanged` not judged on their rules' own estimated
/// cost (upstream's `suppressPerExpressionCost`, for an update that leaves a version's
/// schema as it was).
pub fn spec_errors_with(
    new: &Value,
    unchanged: &std::collections::HashSet<String>,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let plural = spec["names"]["plural"].as_str().unwrap_or("");
    errors.extend(groups::builtin_group_error(group));
    let name = meta::str_at(new, &["metadata", "name"]).unwrap_or("");
    if name != format!("{plural}.{group}") {
        errors.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    if group.is_empty() {
        errors.push(FieldError::required("spec.group", ""));
    } else {
        for e in meta::validate_name(group, NameRule::Subdomain) {
            errors.push(FieldError::invalid("spec.group", &json!(group), e));
        }
        if !group.contains('.') {
            errors.push(FieldError::invalid(
                "spec.group",
                &json!(group),
                "should be a domain with at least one dot",
            ));
        }
    }
    validate_names(&spec["names"], "spec.names", &mut errors);
    match spec["scope"].as_str() {
        Some("Cluster" | "Namespaced") => {}
        Some(_) => errors.push(FieldError::not_supported(
            "spec.scope",
            &spec["scope"],
            &["Cluster", "Namespaced"],
        )),
        None => errors.push(FieldError::required("spec.scope", "")),
    }
    let versions = spec["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        errors.push(FieldError::invalid(
            "spec.versions",
            &json!(null),
            "must have exactly one version marked as storage version",
        ));
    }
    let storage = versions.iter().filter(|v| v["storage"] == true).count();
    if !versions.is_empty() && storage != 1 {
        errors.push(FieldError::invalid(
            "spec.versions",
            &spec["versions"],
            "must have exactly one version marked as storage version",
        ));
    }
    if !versions.is_empty() && !versions.iter().any(|v| v["served"] == true) {
        errors.push(FieldError::invalid(
            "spec.versions",
            &spec["versions"],
            "must have at least one version marked as served",
        ));
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let path = format!("spec.versions[{i}]");
        let vname = v["name"].as_str().unwrap_or("");
        check_label(format!("{path}.name"), &v["name"], &mut errors);
        if seen.contains(&vname) {
            errors.push(FieldError::duplicate(format!("{path}.name"), &v["name"]));
        }
        seen.push(vname);
        let schema = &v["schema"]["openAPIV3Schema"];
        if schema.is_null() {
            errors.push(FieldError::required(
                format!("{path}.schema.openAPIV3Schema"),
                "schemas are required",
            ));
        } else {
            let schema_path = format!("{path}.schema.openAPIV3Schema");
            let structural = schema::structural_errors(schema, &schema_path);
            // As upstream, the rules are checked only on a structural schema.
            if structural.is_empty() {
                errors.extend(schema::pattern_errors(schema, &schema_path));
                errors.extend(cel::definition_errors_with(
                    schema,
                    &schema_path,
                    unchanged.contains(vname),
                ));
            }
            errors.extend(structural);
        }
        if let Some(scale) = v["subresources"].get("scale").filter(|s| s.is_object()) {
            for key in ["specReplicasPath", "statusReplicasPath"] {
                if scale[key].as_str().is_none_or(|p| !p.starts_with('.')) {
                    errors.push(FieldError::invalid(
                        format!("{path}.subresources.scale.{key}"),
                        &scale[key],
                        "should be a json path under either .spec or .status",
                    ));
                }
            }
        }
    }
    if spec["conversion"]["strategy"] == "Webhook" {
        errors.push(FieldError::forbidden(
            "spec.conversion.strategy",
            "Webhook conversion is not supported by core-cluster, which does not call webhooks: use None (every version then holds the same fields)",
        ));
    }
    errors
}

/// The value at a simple JSONPath (`.spec.replicas`, `.status.conditions[0].type`,
/// `.metadata.labels.app`), as printer columns and the scale subresource use them.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    let path = path.trim_start_matches('{').trim_end_matches('}');
    for part in path
        .trim_start_matches('.')
        .split('.')
        .filter(|p| !p.is_empty())
    {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

/// The value of a `selectableFields` path of a custom resource for a field selector
/// (upstream's `customresource` `GetAttrs`: a string as is, a number or boolean printed,
/// absent as empty), or `None` if `path` is not selectable.
pub fn selectable_value(custom: &Custom, obj: &Value, path: &str) -> Option<String> {
    if !custom.selectable.iter().any(|p| p == path) {
        return None;
    }
    Some(match json_path(obj, path) {
        Some(Value::String(s)) => s.clone(),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
        _ => String::new(),
    })
}

/// The Table column definitions and cells of a custom resource with printer columns
/// (upstream's `tableconvertor.New`): `Name`, then each column, then `Age` if no column
/// is named `Age`.
pub fn table_columns(custom: &Custom) -> Vec<Value> {
    let mut out = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": NAME.description, "priority": 0})];
    for c in &custom.columns {
        out.push(json!({"name": c.name, "type": c.type_, "format": c.format,
            "description": c.description, "priority": c.priority}));
    }
    if custom.columns.is_empty() {
        out.push(json!({"name": "Age", "type": "date", "format": "",
            "description": AGE.description, "priority": 0}));
    }
    out
}

/// One row's cells (see [`table_columns`]).
pub fn table_cells(custom: &Custom, obj: &Value, now: i64) -> Vec<Value> {
    let mut cells = vec![json!(
        meta::str_at(obj, &["metadata", "name"]).unwrap_or("")
    )];
    for c in &custom.columns {
        let v = json_path(obj, &c.json_path).cloned().unwrap_or(Value::Null);
        let cell = match (c.type_.as_str(), &v) {
            (_, Value::Null) => Value::Null,
            ("date", Value::String(_)) => {
                json!(crate::registry::table::age(&json!({"t": v}), &["t"], now))
            }
            (_, Value::Array(_) | Value::Object(_)) => json!(v.to_string()),
            _ => v,
        };
        cells.push(cell);
    }
    if custom.columns.is_empty() {
        cells.push((AGE.cell)(obj, now));
    }
    cells
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::{ListStrategy, TypeNode};

    pub(super) fn crd(group: &str, plural: &str, kind: &str) -> Value {
        json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group, "scope": "Namespaced",
                "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind,
                          "listKind": format!("{kind}List"), "shortNames": ["wd"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": {"type": "object"}}}],
            },
        })
    }

    /// `validation.ValidateCustomResourceDefinition`: the name must be `<plural>.<group>`
    /// and the group a domain.
    #[test]
    fn a_definition_is_named_plural_dot_group() {
        assert!(validate_crd(&crd("example.com", "widgets", "Widget"), None).is_empty());
        let mut bad = crd("example", "widgets", "Widget");
        bad["metadata"]["name"] = json!("widget.example");
        let errors: Vec<String> = validate_crd(&bad, None)
            .iter()
            .map(FieldError::full)
            .collect();
        assert_eq!(
            errors,
            [
                "metadata.name: Invalid value: \"widget.example\": must be spec.names.plural+\".\"+spec.group",
                "spec.group: Invalid value: \"example\": should be a domain with at least one dot",
            ]
        );
    }

    /// `ValidateCustomResourceDefinitionSpec`: one storage version, and no webhook
    /// conversion here.
    #[test]
    fn one_storage_version_and_no_webhook_conversion() {
        let mut two = crd("example.com", "widgets", "Widget");
        two["spec"]["versions"] = json!([
            {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}},
            {"name": "v2", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}},
        ]);
        two["spec"]["conversion"] = json!({"strategy": "Webhook"});
        let errors: Vec<String> = validate_crd(&two, None)
            .iter()
            .map(|e| e.field.clone())
            .collect();
        assert_eq!(errors, ["spec.versions", "spec.conversion.strategy"]);
    }

    /// `validation.go`'s `suppressPerExpressionCost`: a rule over the static cost limit is
    /// refused on create, but an update that leaves its version's schema as it was (while
    /// changing something else) is not refused for it.
    #[test]
    fn an_update_keeping_a_costly_rule_is_not_refused_for_it() {
        let mut c = crd("cost.example.com", "lists", "List");
        c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object",
            "properties": {"l": {"type": "array", "maxItems": 300,
                "items": {"type": "string", "maxLength": 1000},
                "x-kubernetes-validations": [{"rule": "self.all(x, self.exists(y, y == x))"}]}}});
        let created = validate_crd(&c, None);
        assert!(
            created
                .iter()
                .any(|e| e.message.contains("estimated rule cost exceeds budget")),
            "{created:?}"
        );
        let mut updated = c.clone();
        updated["spec"]["names"]["shortNames"] = json!(["ls"]);
        assert!(validate_crd(&updated, Some(&c)).is_empty());
        // A new costly rule in the same update is refused.
        updated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["l"]["x-kubernetes-validations"]
            [0]["rule"] = json!("self.all(x, self.exists(y, x == y))");
        assert!(!validate_crd(&updated, Some(&c)).is_empty());
    }

    #[test]
    fn served_definitions_are_built_once_per_content() {
        let c = crd("cache.example.com", "gadgets", "Gadget");
        let a = served_defs(&c).unwrap();
        let b = served_defs(&c).unwrap();
        assert_eq!(a.defs().len(), 1);
        assert!(std::ptr::eq(a.defs()[0], b.defs()[0]));
        assert_eq!(a.defs()[0].storage, "cache.example.com/gadgets");
        assert_eq!(
            custom(a.defs()[0]).unwrap().crd_name,
            "gadgets.cache.example.com"
        );
        assert!(custom(&CUSTOM_RESOURCE_DEFINITIONS).is_none());
    }

    /// `x-kubernetes-list-type`: `set` and `map` (by the first map key) lists merge by
    /// element, others (`atomic` or none) are replaced whole.
    #[test]
    fn list_types_give_the_merge_strategy() {
        let node = merge_node(&json!({"type": "object", "properties": {
            "m": {"type": "array", "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object"}},
            "s": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "a": {"type": "array", "items": {"type": "string"}},
        }}));
        assert_eq!(node.field("m").list().0, ListStrategy::MergeByKey("name"));
        assert_eq!(node.field("s").list().0, ListStrategy::Set);
        assert_eq!(node.field("a").list().0, ListStrategy::Replace);
    }

    /// `customresource/strategy.go GetAttrs` with `selectableFields`: the declared paths
    /// are field-selector paths, others are not.
    /// structured-merge-diff's associative lists (`typed/helpers.go
    /// keyedAssociativeListItemToPathElement`): a `map` list with two keys identifies an
    /// element by both, in server-side apply (and its managed fields) and in a strategic
    /// merge patch.
    #[test]
    fn a_map_list_with_two_keys_merges_by_both() {
        use crate::patch::{PatchType, apply, patch_object};
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"ports": {"type": "array", "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["port", "protocol"],
                "items": {"type": "object", "properties": {"port": {"type": "integer"},
                    "protocol": {"type": "string"}, "name": {"type": "string"}}}}}}}});
        let node: &'static TypeNode = Box::leak(Box::new(merge_node(&schema)));
        assert_eq!(
            node.field("spec").field("ports").list().0,
            ListStrategy::MergeByKeys(&["port", "protocol"])
        );
        let doc = |ports: Value| {
            json!({"apiVersion": "example.com/v1", "kind": "Svc", "metadata": {"name": "a"},
                   "spec": {"ports": ports}})
        };
        let now = "2026-01-01T00:00:00Z";
        let live = apply(
            None,
            &doc(json!([{"port": 53, "protocol": "TCP", "name": "dns-tcp"}])),
            "a",
            false,
            node,
            now,
        )
        .unwrap();
        // Same port, other protocol: another element, owned by its applier.
        let udp = json!([{"port": 53, "protocol": "UDP", "name": "dns-udp"}]);
        let both = apply(Some(&live), &doc(udp), "b", false, node, now).unwrap();
        assert_eq!(
            both["spec"]["ports"],
            json!([{"port": 53, "protocol": "TCP", "name": "dns-tcp"},
                   {"port": 53, "protocol": "UDP", "name": "dns-udp"}])
        );
        let b = both["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == "b")
            .unwrap();
        assert!(
            b["fieldsV1"]["f:spec"]["f:ports"]
                .get(r#"k:{"port":53,"protocol":"UDP"}"#)
                .is_some(),
            "{b}"
        );
        // A strategic merge patch names one element by both keys and leaves the other.
        let patched = patch_object(
            &both,
            PatchType::StrategicMergePatch,
            &json!({"spec": {"ports": [{"port": 53, "protocol": "TCP", "name": "dns"}]}}),
            node,
        )
        .unwrap();
        assert_eq!(
            patched["spec"]["ports"],
            json!([{"port": 53, "protocol": "TCP", "name": "dns"},
                   {"port": 53, "protocol": "UDP", "name": "dns-udp"}])
        );
        // An element without one of its keys is refused.
        let err = apply(
            Some(&both),
            &doc(json!([{"port": 80, "name": "http"}])),
            "c",
            false,
            node,
            now,
        )
        .unwrap_err();
        assert!(err.to_string().contains("port, protocol"), "{err}");
    }

    #[test]
    fn selectable_fields_are_field_selector_paths() {
        let mut c = crd("select.example.com", "tools", "Tool");
        c["spec"]["versions"][0]["selectableFields"] = json!([{"jsonPath": ".spec.color"}]);
        let served = served_defs(&c).unwrap();
        let def = served.defs()[0];
        assert!(def.supports_field("spec.color"));
        assert!(!def.supports_field("spec.size"));
        let obj = json!({"spec": {"color": "red", "size": 3}});
        assert_eq!(def.field_value(&obj, "spec.color").as_deref(), Some("red"));
        assert_eq!(def.field_value(&obj, "spec.size"), None);
    }
}
