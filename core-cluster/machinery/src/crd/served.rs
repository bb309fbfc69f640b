//! What a served definition is made of, and how long it lives.
//!
//! A custom resource is served by [`ResourceDef`]s as a built-in one is: the generic storage
//! layer takes `&'static ResourceDef` everywhere. Each served version's `ResourceDef` is a
//! small *shell* (its names, scope and subresources), leaked to be `'static`; what the fixed
//! `fn` strategy of a `ResourceDef` cannot carry (the schema with its compiled patterns and
//! rules, the printer columns, the merge shape) is its [`Custom`], found from the shell with
//! [`custom`].
//!
//! How long each part lives:
//! - [`served_defs`] builds a definition's shells and `Custom`s once per distinct content
//!   (name and `spec`) and hands out an [`Arc<Served>`]; asking again while it is alive
//!   returns the same one, so reconciling an unchanged definition costs one lookup.
//! - The [`Registry`](crate::registry::Registry) holds the `Served` of each definition it
//!   serves. When the last holder lets it go (the definition was deleted or changed), its
//!   `Custom`s are freed and its shells go back to a pool, taken again by the next
//!   definition with the same names, scope and subresources. A shell is never freed, but
//!   the leak is bounded by the distinct names ever served, a few hundred bytes each,
//!   however often definitions are created and deleted; the names themselves are interned.
//! - A definition that cannot be served gets the reason instead ([`served_defs`]'s `Err`),
//!   remembered for a while so that a reconcile of a stored definition does not compile its
//!   schema again.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, LazyLock, Weak,
        atomic::{AtomicU64, Ordering},
    },
};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;

use super::{cel, schema};
use crate::patch::{ListStrategy, TypeNode};
use crate::registry::{
    FieldError, NameRule, ResourceDef, no_defaults,
    table::{AGE, NAME},
};

/// A printer column of a custom resource (`additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    /// The header.
    pub name: String,
    /// `string`, `integer`, `number`, `boolean` or `date`.
    pub type_: String,
    /// Format hint.
    pub format: String,
    /// Description.
    pub description: String,
    /// 0 always shown; more only with `-o wide`.
    pub priority: i64,
    /// The simple JSONPath of the value (`.spec.replicas`).
    pub json_path: String,
}

/// The `scale` subresource's paths.
#[derive(Debug, Clone)]
pub struct ScalePaths {
    /// `.spec.replicas`.
    pub spec_replicas: String,
    /// `.status.replicas`.
    pub status_replicas: String,
    /// `.status.selector`, if any.
    pub label_selector: Option<String>,
}

/// What a served custom resource version carries beyond its [`ResourceDef`].
#[derive(Debug)]
pub struct Custom {
    /// Unique among every `Custom` ever built: a cache keyed by it (the OpenAPI documents)
    /// never mistakes a rebuilt definition for the one it replaced.
    pub id: u64,
    /// The definition's name (`<plural>.<group>`).
    pub crd_name: String,
    /// The version's `openAPIV3Schema`.
    pub schema: Value,
    /// The schema's `pattern`s, compiled once.
    pub patterns: schema::Patterns,
    /// The storage version's `apiVersion` (`<group>/<version>`).
    pub storage_api_version: String,
    /// The `deprecationWarning`, or upstream's default one, when the version is deprecated.
    pub deprecation: Option<String>,
    /// `additionalPrinterColumns`.
    pub columns: Vec<PrinterColumn>,
    /// The `scale` subresource.
    pub scale: Option<ScalePaths>,
    /// `selectableFields`: the field-selector paths (`spec.color`) beyond the metadata ones.
    pub selectable: Vec<String>,
    /// The list semantics server-side apply merges by, from the schema's
    /// `x-kubernetes-list-type` and `x-kubernetes-list-map-keys` (see [`merge_node`]).
    pub merge: TypeNode,
    /// The schema's compiled `x-kubernetes-validations` rules, if it has any.
    pub rules: Option<cel::Rules>,
}

impl Custom {
    /// A written object's schema work before validation: unknown fields pruned
    /// (the result is what the object keeps) and defaults set.
    pub fn normalize(&self, obj: &Value) -> Value {
        let mut out = obj.clone();
        schema::prune(&mut out, &self.schema);
        schema::default(&mut out, &self.schema);
        out
    }

    /// The schema's validation errors of `obj`, then its rules' (an update's `old` enables
    /// the transition rules). As upstream's custom resource strategy, the rules run only
    /// on an object the schema accepts.
    pub fn validate(&self, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
        self.validate_with(obj, old, &cel::Interrupt::new())
    }

    /// [`Custom::validate`], its rules stopped by `interrupt` (the request went away).
    pub fn validate_with(
        &self,
        obj: &Value,
        old: Option<&Value>,
        interrupt: &cel::Interrupt,
    ) -> Vec<FieldError> {
        let errors = schema::validate(obj, &self.schema, &self.patterns);
        match &self.rules {
            Some(rules) if errors.is_empty() => rules.validate_with(obj, old, interrupt),
            _ => errors,
        }
    }
}

/// The shape server-side apply merges a custom resource by, from its structural schema
/// (upstream's `structural` schema → `managedfields` type converter): `properties` are
/// fields, `additionalProperties` a map, and a list is atomic unless
/// `x-kubernetes-list-type` says `set` (a set of scalars) or `map` (objects merged by the
/// values of all their `x-kubernetes-list-map-keys`, as structured-merge-diff keys an
/// associative list).
pub fn merge_node(schema: &Value) -> TypeNode {
    if let Some(props) = schema["properties"].as_object() {
        return TypeNode::Object(
            props
                .iter()
                .map(|(k, v)| (intern(k), merge_node(v)))
                .collect(),
        );
    }
    if schema["additionalProperties"].is_object() {
        return TypeNode::Map(Box::new(merge_node(&schema["additionalProperties"])));
    }
    if schema["type"] == "array" {
        let strategy = match schema["x-kubernetes-list-type"].as_str() {
            Some("set") => ListStrategy::Set,
            Some("map") => match intern_list(&schema["x-kubernetes-list-map-keys"]) {
                [] => ListStrategy::Replace,
                [key] => ListStrategy::MergeByKey(key),
                keys => ListStrategy::MergeByKeys(keys),
            },
            _ => ListStrategy::Replace,
        };
        return TypeNode::List {
            strategy,
            item: Box::new(merge_node(&schema["items"])),
        };
    }
    match schema["type"].as_str() {
        Some("object") | None => TypeNode::Any,
        Some(_) => TypeNode::Scalar,
    }
}

/// The served versions of one definition (see the module docs of `crd::served`); dropping the last
/// holder frees their [`Custom`]s and returns their shells to the pool.
#[derive(Debug)]
pub struct Served {
    /// The content these were built from, the key of [`State::built`].
    key: String,
    defs: Vec<&'static ResourceDef>,
}

impl Served {
    /// The served versions' definitions, in the definition's version order.
    pub fn defs(&self) -> &[&'static ResourceDef] {
        &self.defs
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let mut state = STATE.lock();
        if state
            .built
            .get(&self.key)
            .is_some_and(|w| w.strong_count() == 0)
        {
            state.built.remove(&self.key);
        }
        {
            let mut customs = CUSTOM.write();
            for def in &self.defs {
                customs.remove(&address(def));
            }
        }
        for def in &self.defs {
            state.pool.entry(shell_key(def)).or_default().push(def);
        }
    }
}

/// The shared bookkeeping of [`served_defs`] (one lock: a build installs, and a drop
/// removes, its entries and shells together).
#[derive(Default)]
struct State {
    /// Content → what it serves, while anything holds it.
    built: HashMap<String, Weak<Served>>,
    /// Shells no definition serves now, by [`shell_key`].
    pool: HashMap<String, Vec<&'static ResourceDef>>,
    /// Content → why it is not served (bounded: cleared when full).
    refused: HashMap<String, String>,
}

/// How many refusals [`State::refused`] remembers before it starts over.
const REFUSED_REMEMBERED: usize = 256;

static STATE: LazyLock<Mutex<State>> = LazyLock::new(Mutex::default);
static CUSTOM: LazyLock<RwLock<HashMap<usize, Arc<Custom>>>> = LazyLock::new(RwLock::default);
static INTERNED: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Mutex::default);
static INTERNED_LISTS: LazyLock<Mutex<HashSet<&'static [&'static str]>>> =
    LazyLock::new(Mutex::default);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn address(def: &ResourceDef) -> usize {
    def as *const ResourceDef as usize
}

/// `s` as a `'static` string, one copy per distinct text ever interned.
fn intern(s: &str) -> &'static str {
    let mut set = INTERNED.lock();
    if let Some(found) = set.get(s) {
        return found;
    }
    let leaked: &'static str = Box::leak(s.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// The strings of the JSON array `v`, interned as one `'static` list.
fn intern_list(v: &Value) -> &'static [&'static str] {
    let list: Vec<&'static str> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).map(intern).collect())
        .unwrap_or_default();
    let mut set = INTERNED_LISTS.lock();
    if let Some(found) = set.get(list.as_slice()) {
        return found;
    }
    let leaked: &'static [&'static str] = Box::leak(list.into_boxed_slice());
    set.insert(leaked);
    leaked
}

/// What makes two shells interchangeable: every field a definition sets.
fn shell_key(def: &ResourceDef) -> String {
    format!(
        "{}|{}|{}|{}|{}|{:?}|{:?}|{}|{}|{:?}",
        def.group,
        def.version,
        def.kind,
        def.plural,
        def.singular,
        def.short_names,
        def.categories,
        def.namespaced,
        def.status,
        def.extra_subresources,
    )
}

/// The patch content types a custom resource takes, in upstream's order: a custom resource
/// has no patch strategies, so no strategic merge patch (apiextensions-apiserver
/// `customresource_handler.go` and `controller/openapi/builder/builder.go`, their supported
/// patch types). The API server refuses the others with 415; the custom groups' OpenAPI
/// offers only these.
pub const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

/// Whether `def` is a custom resource's definition (no lock taken).
pub fn is_custom(def: &ResourceDef) -> bool {
    std::ptr::fn_addr_eq(
        def.typed,
        custom_typed as fn(&Value) -> Result<Value, String>,
    )
}

/// The [`Custom`] of `def` if it is a custom resource's definition served now (`None` for
/// a built-in one, and for the shell of a definition no longer served).
pub fn custom(def: &ResourceDef) -> Option<Arc<Custom>> {
    // Built-in definitions never take the lock.
    if !is_custom(def) {
        return None;
    }
    CUSTOM.read().get(&address(def)).cloned()
}

/// The shape server-side apply and managed fields merge objects of `def` by (see
/// [`merge_schema`]): a built-in's, or a served custom resource's, which this keeps alive.
#[derive(Debug, Clone)]
pub enum MergeSchema {
    /// A built-in resource's, from [`schema_for`](crate::patch::schema_for).
    Builtin(&'static TypeNode),
    /// A custom resource's, from its schema ([`Custom::merge`]).
    Custom(Arc<Custom>),
}

impl std::ops::Deref for MergeSchema {
    type Target = TypeNode;

    fn deref(&self) -> &TypeNode {
        match self {
            MergeSchema::Builtin(node) => node,
            MergeSchema::Custom(custom) => &custom.merge,
        }
    }
}

/// The shape server-side apply and managed fields merge objects of `def` by: a custom
/// resource's from its schema ([`merge_node`]), a built-in's from
/// [`schema_for`](crate::patch::schema_for).
pub fn merge_schema(def: &ResourceDef) -> MergeSchema {
    match custom(def) {
        Some(c) => MergeSchema::Custom(c),
        None => MergeSchema::Builtin(crate::patch::schema_for(def.group, def.kind)),
    }
}

/// A custom resource decodes as any JSON object (the schema's work is [`Custom::normalize`]).
fn custom_typed(obj: &Value) -> Result<Value, String> {
    if obj.is_object() {
        Ok(obj.clone())
    } else {
        Err("the object is not a JSON object".to_owned())
    }
}

fn identity(v: Value) -> Value {
    v
}

fn no_fields(_: &Value, _: &str) -> Option<String> {
    None
}

fn no_rules(_: &Value, _: Option<&Value>) -> Vec<FieldError> {
    Vec::new()
}

/// One served version, built but not installed: its shell's fields and its [`Custom`].
struct Version {
    shell: ResourceDef,
    custom: Custom,
}

/// The served versions of the definition `crd`, built once per distinct content (see the
/// module docs of `crd::served`), or why it cannot be served:
/// - its group is a built-in one ([`super::groups::is_builtin`]), or its storage keys would
///   be a built-in resource's: a custom resource never shares a key with a built-in one;
/// - its spec is not valid ([`super::spec_errors`]): a definition written past validation
///   by an older server, or by hand (its API approval is not judged again);
/// - a pattern or rule of its schema does not compile.
pub fn served_defs(crd: &Value) -> Result<Arc<Served>, String> {
    let key = format!(
        "{}\n{}",
        crd["metadata"]["name"].as_str().unwrap_or(""),
        crd["spec"]
    );
    {
        let state = STATE.lock();
        if let Some(served) = state.built.get(&key).and_then(Weak::upgrade) {
            return Ok(served);
        }
        if let Some(why) = state.refused.get(&key) {
            return Err(why.clone());
        }
    }
    let versions = match build(crd) {
        Ok(versions) => versions,
        Err(why) => {
            let mut state = STATE.lock();
            if state.refused.len() >= REFUSED_REMEMBERED {
                state.refused.clear();
            }
            state.refused.insert(key, why.clone());
            return Err(why);
        }
    };
    let mut state = STATE.lock();
    // Another reconcile may have built the same content meanwhile: one copy is served.
    if let Some(served) = state.built.get(&key).and_then(Weak::upgrade) {
        return Ok(served);
    }
    let mut defs = Vec::with_capacity(versions.len());
    let mut customs = Vec::with_capacity(versions.len());
    for version in versions {
        let wanted = shell_key(&version.shell);
        let shell = state
            .pool
            .get_mut(&wanted)
            .and_then(Vec::pop)
            .unwrap_or_else(|| Box::leak(Box::new(version.shell)));
        defs.push(shell);
        customs.push((address(shell), Arc::new(version.custom)));
    }
    CUSTOM.write().extend(customs);
    let served = Arc::new(Served {
        key: key.clone(),
        defs,
    });
    state.built.insert(key, Arc::downgrade(&served));
    Ok(served)
}

fn build(crd: &Value) -> Result<Vec<Version>, String> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or("");
    if !group.is_empty() && super::groups::is_builtin(group) {
        return Err(format!(
            "its group {group:?} is an API group this server serves itself"
        ));
    }
    let storage = format!("{group}/{plural}");
    if crate::registry::ALL.iter().any(|d| d.storage == storage) {
        return Err(format!(
            "its objects would be stored with the built-in resource {storage}"
        ));
    }
    // The runtime meter bounds what a served rule costs: a stored definition is judged as an
    // update that changes nothing, not on each rule's estimate again.
    let errors = super::spec_errors_with(crd, &super::all_versions(crd));
    if !errors.is_empty() {
        let list: Vec<String> = errors.iter().map(FieldError::full).collect();
        return Err(format!("it is not valid: {}", list.join(", ")));
    }
    let kind = names["kind"].as_str().unwrap_or("");
    let singular = names["singular"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map_or_else(|| kind.to_lowercase(), str::to_owned);
    let storage_version = super::storage_version(crd).unwrap_or_default();
    let crd_name = format!("{plural}.{group}");
    let short_names = intern_list(&names["shortNames"]);
    let categories = intern_list(&names["categories"]);
    let mut out = Vec::new();
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"] != true {
            continue;
        }
        let version = v["name"].as_str().unwrap_or("");
        let subresources = &v["subresources"];
        let scale = subresources
            .get("scale")
            .filter(|s| s.is_object())
            .map(|s| ScalePaths {
                spec_replicas: s["specReplicasPath"].as_str().unwrap_or("").to_owned(),
                status_replicas: s["statusReplicasPath"].as_str().unwrap_or("").to_owned(),
                label_selector: s["labelSelectorPath"].as_str().map(str::to_owned),
            });
        let shell = ResourceDef {
            group: intern(group),
            version: intern(version),
            kind: intern(kind),
            plural: intern(plural),
            singular: intern(&singular),
            short_names,
            categories,
            namespaced: spec["scope"] == "Namespaced",
            status: subresources.get("status").is_some_and(|s| s.is_object()),
            generation: true,
            extra_subresources: if scale.is_some() { &["scale"] } else { &[] },
            storage: intern(&storage),
            name_rule: NameRule::Subdomain,
            typed: custom_typed,
            columns: &[NAME, AGE],
            field: no_fields,
            field_paths: &[],
            prepare_create: no_defaults,
            prepare_update: no_defaults,
            validate: no_rules,
            to_storage: identity,
            from_storage: identity,
        };
        let schema = v["schema"]["openAPIV3Schema"].clone();
        let patterns = schema::Patterns::compile(&schema).map_err(|errors| {
            let list: Vec<String> = errors.iter().map(FieldError::full).collect();
            format!("a pattern does not compile: {}", list.join(", "))
        })?;
        let columns = v["additionalPrinterColumns"]
            .as_array()
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: c["name"].as_str().unwrap_or("").to_owned(),
                        type_: c["type"].as_str().unwrap_or("string").to_owned(),
                        format: c["format"].as_str().unwrap_or("").to_owned(),
                        description: c["description"].as_str().unwrap_or("").to_owned(),
                        priority: c["priority"].as_i64().unwrap_or(0),
                        json_path: c["jsonPath"].as_str().unwrap_or("").to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let deprecation = (v["deprecated"] == true).then(|| {
            v["deprecationWarning"].as_str().map_or_else(
                || format!("{group}/{version} {kind} is deprecated"),
                str::to_owned,
            )
        });
        let custom = Custom {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            merge: merge_node(&schema),
            rules: cel::Rules::build(&schema),
            crd_name: crd_name.clone(),
            patterns,
            schema,
            storage_api_version: format!("{group}/{storage_version}"),
            deprecation,
            columns,
            scale,
            selectable: v["selectableFields"]
                .as_array()
                .map(|fields| {
                    fields
                        .iter()
                        .filter_map(|f| f["jsonPath"].as_str())
                        .map(|p| p.trim_start_matches('.').to_owned())
                        .collect()
                })
                .unwrap_or_default(),
        };
        out.push(Version { shell, custom });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn crd(group: &str, plural: &str, kind: &str, schema: Value) -> Value {
        json!({
            "metadata": {"name": format!("{plural}.{group}")},
            "spec": {
                "group": group, "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind},
                "versions": [{"name": "v1", "served": true, "storage": true,
                              "schema": {"openAPIV3Schema": schema}}],
            },
        })
    }

    /// A definition is built once per content while it is held; letting it go frees its
    /// `Custom`, and the next definition with the same names takes the same shell back,
    /// so creating and deleting definitions leaks nothing per cycle.
    #[test]
    fn a_definition_let_go_frees_its_schema_and_returns_its_shell() {
        let a = crd(
            "served.example.com",
            "boxes",
            "Box",
            json!({"type": "object"}),
        );
        let first = served_defs(&a).unwrap();
        let again = served_defs(&a).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let shell = first.defs()[0];
        let weak = Arc::downgrade(&custom(shell).unwrap());
        drop((first, again));
        assert!(custom(shell).is_none(), "no longer served");
        assert!(weak.upgrade().is_none(), "its Custom is freed");
        // The same names with another schema: the shell comes back, with the new Custom.
        let b = crd(
            "served.example.com",
            "boxes",
            "Box",
            json!({"type": "object", "properties": {"spec": {"type": "object"}}}),
        );
        let second = served_defs(&b).unwrap();
        assert!(std::ptr::eq(second.defs()[0], shell));
        assert!(custom(shell).unwrap().schema["properties"]["spec"].is_object());
    }

    /// A custom resource never shares a key with a built-in one: a definition in a built-in
    /// group is not served, whatever its plural.
    #[test]
    fn a_definition_in_a_built_in_group_is_not_served() {
        let mut crb = crd(
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "ClusterRoleBinding",
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        crb["spec"]["versions"][0]["name"] = json!("v9");
        let why = served_defs(&crb).unwrap_err();
        assert_eq!(
            why,
            "its group \"rbac.authorization.k8s.io\" is an API group this server serves itself"
        );
    }

    /// A stored definition that is not valid (written past validation) is not served, and
    /// building it does nothing worse than say why.
    #[test]
    fn an_invalid_stored_definition_is_not_served() {
        let garbage = json!({"metadata": {"name": "x.example.com"}, "spec": 5});
        assert!(
            served_defs(&garbage)
                .unwrap_err()
                .starts_with("it is not valid: ")
        );
        let bad_pattern = crd(
            "pattern.example.com",
            "bads",
            "Bad",
            json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "("}}}),
        );
        let why = served_defs(&bad_pattern).unwrap_err();
        assert!(why.contains("must be a valid regular expression"), "{why}");
    }
}
