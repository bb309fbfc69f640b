//! Server-side apply (`application/apply-patch+yaml`) and the `metadata.managedFields`
//! bookkeeping behind it.
//!
//! Ownership is tracked per field path in the upstream FieldsV1 format:
//! `{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:taints":{}}}`, with elements
//! of keyed lists as `k:{"type":"Ready"}` (the element itself marked by `".":{}`) and
//! members of sets as `v:"value"`. Each `managedFields` entry names a manager, an
//! operation (`Apply` or `Update`), the `apiVersion` it used, a time and its fields.
//!
//! [`apply`] merges an applied configuration into the live object: maps and structs
//! merge field by field, keyed lists element by element, sets by value, and atomic
//! lists and scalars are replaced. Fields the manager applied last time but no longer
//! applies are removed unless another manager owns them (or something beneath them).
//! Changing a field another manager owns is a conflict unless `force` is set, in
//! which case the applier takes the field over. [`record_update`] keeps the same
//! bookkeeping for ordinary writes (create, update, the other patch types), so
//! applies see those owners.
//!
//! Simplified compared with upstream (structured-merge-diff):
//!
//! * One schema serves both strategic merge and apply: list semantics follow the
//!   `patchStrategy`/`patchMergeKey` tags, with a single merge key. Upstream apply reads
//!   `listType`/`listMapKey`, which sometimes name more keys (container ports are keyed
//!   by `containerPort` and `protocol` there, so the `k:` elements differ) or make a
//!   list a set where strategic merge replaces it.
//! * No defaulting, conversion or validation happens here; managers are identified by
//!   name and operation only (not by `apiVersion`, not by subresource), and conflict
//!   messages name the manager without the ` using <apiVersion>` suffix.
//! * `status` gets no special treatment: the caller decides which fields of a request
//!   to a subresource are kept before calling in.
//! * Merged keyed lists keep the live order and append new elements in applied order;
//!   upstream orders them by the applied configuration.
//! * `null` in an applied configuration means "not specified".
//! * Maps left empty by the removal of fields are kept as `{}`.
//! * An object without `managedFields` that is applied to is first attributed whole to
//!   the `before-first-apply` manager (operation `Update`), as upstream does.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Map, Value};

use super::{
    id_key,
    schema::{ListStrategy, TypeNode},
};

/// One step of a field path, spelled as in FieldsV1: `f:name`, `k:{"type":"Ready"}`,
/// `v:"value"` or `i:3`.
type Path = Vec<String>;

/// Why an apply was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The applied configuration changes fields other managers own, and `force` was
    /// not set. HTTP 409; each cause becomes a `FieldManagerConflict` status cause with
    /// message `conflict with "<manager>"` and field `<field_path>`.
    #[error("{}", conflict_message(causes))]
    Conflict {
        /// `(field_path, other_manager)` for each conflicting field, with paths such as
        /// `.metadata.labels.app` or `.status.conditions[type="Ready"].status`.
        causes: Vec<(String, String)>,
    },
    /// The applied configuration is not acceptable: not an object, it sets
    /// `metadata.managedFields`, or an element of a keyed list lacks its key. HTTP 400.
    #[error("invalid apply configuration: {0}")]
    Invalid(String),
}

impl ApplyError {
    /// The HTTP status the API server answers with for this error.
    pub fn http_status(&self) -> u16 {
        match self {
            ApplyError::Conflict { .. } => 409,
            ApplyError::Invalid(_) => 400,
        }
    }
}

/// The upstream wording: `Apply failed with 1 conflict: conflict with "m": .a.b`, or
/// for several, `Apply failed with 2 conflicts: conflicts with "m":\n- .a\n- .b`.
fn conflict_message(causes: &[(String, String)]) -> String {
    if let [(path, manager)] = causes {
        return format!("Apply failed with 1 conflict: conflict with {manager:?}: {path}");
    }
    let managers: BTreeSet<&str> = causes.iter().map(|(_, m)| m.as_str()).collect();
    let mut lines = Vec::new();
    for manager in managers {
        lines.push(format!("conflicts with {manager:?}:"));
        lines.extend(
            causes
                .iter()
                .filter(|(_, m)| m == manager)
                .map(|(p, _)| format!("- {p}")),
        );
    }
    format!(
        "Apply failed with {} conflicts: {}",
        causes.len(),
        lines.join("\n")
    )
}

/// A set of owned field paths, convertible to and from FieldsV1 JSON.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    /// Reads a FieldsV1 value (`{"f:spec":{"f:replicas":{}}}`).
    pub fn from_fields_v1(value: &Value) -> Option<FieldSet> {
        fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) -> Option<()> {
            let m = v.as_object()?;
            if m.is_empty() && !path.is_empty() {
                out.insert(path.clone());
            }
            for (k, child) in m {
                if k == "." {
                    out.insert(path.clone());
                    continue;
                }
                path.push(k.clone());
                walk(child, path, out)?;
                path.pop();
            }
            Some(())
        }
        let mut out = BTreeSet::new();
        walk(value, &mut Vec::new(), &mut out)?;
        out.remove(&Vec::new());
        Some(FieldSet(out))
    }

    /// Writes the set as FieldsV1.
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        for path in &self.0 {
            let mut node = &mut root;
            for seg in path {
                node = node
                    .entry(seg.clone())
                    .or_insert_with(|| Value::Object(Map::new()))
                    .as_object_mut()
                    .expect("only objects are inserted");
            }
        }
        for path in &self.0 {
            let mut node = &mut root;
            for seg in path {
                node = node[seg]
                    .as_object_mut()
                    .expect("only objects are inserted");
            }
            if !node.is_empty() {
                node.insert(".".into(), Value::Object(Map::new()));
            }
        }
        Value::Object(root)
    }

    /// The fields set in `object`, as `schema` describes them, leaving out the
    /// fields the server manages itself (`apiVersion`, `kind`, `metadata.name`,
    /// `metadata.uid`, `metadata.resourceVersion`, `metadata.managedFields`, ...).
    pub fn of_object(object: &Value, schema: &TypeNode) -> Result<FieldSet, ApplyError> {
        let mut out = BTreeSet::new();
        collect(object, schema, &mut Vec::new(), &mut out)?;
        out.retain(|p| !is_server_field(p));
        Ok(FieldSet(out))
    }

    /// Whether the set has no fields.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `path` or anything beneath it is in the set.
    fn covers(&self, path: &[String]) -> bool {
        self.0
            .range(path.to_vec()..)
            .next()
            .is_some_and(|p| p.starts_with(path))
    }
}

const SERVER_FIELDS: &[&[&str]] = &[
    &["f:apiVersion"],
    &["f:kind"],
    &["f:metadata", "f:name"],
    &["f:metadata", "f:namespace"],
    &["f:metadata", "f:uid"],
    &["f:metadata", "f:resourceVersion"],
    &["f:metadata", "f:generation"],
    &["f:metadata", "f:creationTimestamp"],
    &["f:metadata", "f:selfLink"],
    &["f:metadata", "f:managedFields"],
];

fn is_server_field(path: &[String]) -> bool {
    SERVER_FIELDS
        .iter()
        .any(|s| path.len() >= s.len() && s.iter().zip(path).all(|(a, b)| a == b))
}

/// The managed-fields segment of a keyed list's element: `k:{"name":"a"}`, or with
/// several keys all of them (`k:{"name":"a","protocol":"TCP"}`, in key order as
/// structured-merge-diff writes them).
fn key_segment(element: &Value, keys: &[&str]) -> Option<String> {
    let mut m = Map::new();
    for key in keys {
        let id = element.get(*key).filter(|v| !v.is_null())?;
        m.insert((*key).to_owned(), id.clone());
    }
    Some(format!("k:{}", Value::Object(m)))
}

fn collect(
    value: &Value,
    schema: &TypeNode,
    path: &mut Path,
    out: &mut BTreeSet<Path>,
) -> Result<(), ApplyError> {
    let structured = !matches!(
        schema,
        TypeNode::Scalar | TypeNode::Atomic | TypeNode::List { .. }
    );
    match value {
        Value::Object(m) if structured => {
            if m.is_empty() && !path.is_empty() {
                out.insert(path.clone());
            }
            for (k, v) in m {
                if v.is_null() {
                    continue;
                }
                path.push(format!("f:{k}"));
                collect(v, schema.field(k), path, out)?;
                path.pop();
            }
        }
        Value::Array(items) => {
            let (strategy, item) = schema.list();
            if items.is_empty() || strategy == ListStrategy::Replace {
                out.insert(path.clone());
                return Ok(());
            }
            for element in items {
                let seg = if strategy.is_keyed() {
                    key_segment(element, strategy.keys()).ok_or_else(|| {
                        ApplyError::Invalid(format!(
                            "element {element} of {} lacks its key field {:?}",
                            render_path(path),
                            strategy.keys().join(", ")
                        ))
                    })?
                } else {
                    format!("v:{element}")
                };
                path.push(seg);
                out.insert(path.clone());
                if strategy.is_keyed() {
                    collect(element, item, path, out)?;
                }
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
    Ok(())
}

/// Renders a path the way upstream conflict messages do:
/// `.status.conditions[type="Ready"].status`, `.metadata.finalizers[="x"]`.
fn render_path(path: &[String]) -> String {
    let mut out = String::new();
    for seg in path {
        if let Some(name) = seg.strip_prefix("f:") {
            out.push('.');
            out.push_str(name);
        } else if let Some(key) = seg.strip_prefix("k:") {
            let fields = match serde_json::from_str::<Value>(key) {
                Ok(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
                _ => key.to_owned(),
            };
            out.push_str(&format!("[{fields}]"));
        } else if let Some(v) = seg.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        } else if let Some(i) = seg.strip_prefix("i:") {
            out.push_str(&format!("[{i}]"));
        }
    }
    out
}

/// Whether `path` names a key field of a keyed list element (`...k:{"type":"X"}, f:type`).
fn is_key_field(path: &[String]) -> bool {
    match path {
        [.., element, field] => match (element.strip_prefix("k:"), field.strip_prefix("f:")) {
            (Some(key), Some(name)) => {
                serde_json::from_str::<Value>(key).is_ok_and(|k| k.get(name).is_some())
            }
            _ => false,
        },
        _ => false,
    }
}

/// A list-element path segment, parsed once (not once per element it is compared with).
enum ElementSeg {
    /// `k:{"type":"Ready"}`: the element whose fields have these values.
    Key(Map<String, Value>),
    /// `v:"x"`: the element equal to this value.
    Value(Value),
    /// `i:3`: the element at this index.
    Index(usize),
    /// Anything else matches nothing.
    Invalid,
}

impl ElementSeg {
    fn parse(seg: &str) -> Self {
        if let Some(key) = seg.strip_prefix("k:") {
            match serde_json::from_str::<Value>(key) {
                Ok(Value::Object(m)) => ElementSeg::Key(m),
                _ => ElementSeg::Invalid,
            }
        } else if let Some(v) = seg.strip_prefix("v:") {
            serde_json::from_str(v).map_or(ElementSeg::Invalid, ElementSeg::Value)
        } else if let Some(i) = seg.strip_prefix("i:") {
            i.parse().map_or(ElementSeg::Invalid, ElementSeg::Index)
        } else {
            ElementSeg::Invalid
        }
    }

    fn matches(&self, index: usize, element: &Value) -> bool {
        match self {
            ElementSeg::Key(m) => m.iter().all(|(k, v)| element.get(k) == Some(v)),
            ElementSeg::Value(v) => v == element,
            ElementSeg::Index(i) => *i == index,
            ElementSeg::Invalid => false,
        }
    }

    /// The map key this segment looks an element up by in its list's index, and which
    /// index (`k:` with the key's field names, or `v:`); `None` for `i:` and invalid.
    fn lookup_key(&self) -> Option<(String, String)> {
        match self {
            ElementSeg::Key(m) => {
                let names: Vec<&str> = m.keys().map(String::as_str).collect();
                Some((
                    format!("k:{}", names.join("\0")),
                    id_key(&Value::Object(m.clone())),
                ))
            }
            ElementSeg::Value(v) => Some(("v:".to_owned(), id_key(v))),
            ElementSeg::Index(_) | ElementSeg::Invalid => None,
        }
    }
}

/// The identity of `element` under an index kind from [`ElementSeg::lookup_key`].
fn element_id(kind: &str, element: &Value) -> Option<String> {
    match kind.strip_prefix("k:") {
        Some(names) => {
            let mut m = Map::new();
            for name in names.split('\0').filter(|n| !n.is_empty()) {
                m.insert(name.to_owned(), element.get(name)?.clone());
            }
            Some(id_key(&Value::Object(m)))
        }
        None => Some(id_key(element)),
    }
}

/// Finds values by managed-fields path in one object. Each list a lookup goes through is
/// indexed (by the key fields or value the path names) the first time, so looking up every
/// field of an object costs about its size, not its size squared.
struct Lookup<'a> {
    root: &'a Value,
    /// (address of the list, index kind) → element identity → first index.
    lists: std::cell::RefCell<HashMap<(usize, String), HashMap<String, usize>>>,
}

impl<'a> Lookup<'a> {
    fn new(root: &'a Value) -> Self {
        Lookup {
            root,
            lists: Default::default(),
        }
    }

    fn get(&self, path: &[String]) -> Option<&'a Value> {
        let mut cur = self.root;
        for seg in path {
            cur = match (cur, seg.strip_prefix("f:")) {
                (Value::Object(m), Some(name)) => m.get(name)?,
                (Value::Array(items), None) => self.element(items, seg)?,
                _ => return None,
            };
        }
        Some(cur)
    }

    fn element(&self, items: &'a [Value], seg: &str) -> Option<&'a Value> {
        let parsed = ElementSeg::parse(seg);
        if let ElementSeg::Index(i) = parsed {
            return items.get(i);
        }
        let (kind, id) = parsed.lookup_key()?;
        let mut lists = self.lists.borrow_mut();
        let index = lists
            .entry((items.as_ptr() as usize, kind))
            .or_insert_with_key(|(_, kind)| {
                let mut index = HashMap::with_capacity(items.len());
                for (i, element) in items.iter().enumerate() {
                    if let Some(id) = element_id(kind, element) {
                        index.entry(id).or_insert(i);
                    }
                }
                index
            });
        index.get(&id).map(|&i| &items[i])
    }
}

fn remove_at(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = value;
    for seg in parents {
        let next = match (cur, seg.strip_prefix("f:")) {
            (Value::Object(m), Some(name)) => m.get_mut(name),
            (Value::Array(items), None) => {
                let seg = ElementSeg::parse(seg);
                items
                    .iter_mut()
                    .enumerate()
                    .find(|(i, e)| seg.matches(*i, e))
                    .map(|(_, e)| e)
            }
            _ => None,
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    match (cur, last.strip_prefix("f:")) {
        (Value::Object(m), Some(name)) => {
            m.remove(name);
        }
        (Value::Array(items), None) => {
            let last = ElementSeg::parse(last);
            let mut i = 0;
            items.retain(|e| {
                i += 1;
                !last.matches(i - 1, e)
            });
        }
        _ => {}
    }
}

/// Whether the value at `path` differs between two objects. For list elements (the
/// path ends in `k:`/`v:`/`i:`) only presence counts: their fields are paths of their own.
fn differs(before: &Lookup<'_>, after: &Lookup<'_>, path: &[String]) -> bool {
    let element = path.last().is_some_and(|s| !s.starts_with("f:"));
    match (before.get(path), after.get(path)) {
        (Some(_), Some(_)) if element => false,
        (a, b) => a != b,
    }
}

fn strip_nulls(value: &Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

/// Merges an applied configuration into the live object, following `schema`.
fn merge_applied(live: &mut Value, applied: &Value, schema: &TypeNode) {
    let structured = !matches!(
        schema,
        TypeNode::Scalar | TypeNode::Atomic | TypeNode::List { .. }
    );
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) if structured => {
            for (k, v) in a {
                if v.is_null() {
                    continue;
                }
                match l.get_mut(k) {
                    Some(lv) => merge_applied(lv, v, schema.field(k)),
                    None => {
                        l.insert(k.clone(), strip_nulls(v));
                    }
                }
            }
        }
        (Value::Array(l), Value::Array(a)) if schema.list().0 != ListStrategy::Replace => {
            let (strategy, item) = schema.list();
            // Elements by merge key (or value, for sets) in a map: the first of equal
            // identities, as a scan would find it.
            let identity = |e: &Value| {
                if strategy.is_keyed() {
                    strategy.element_key(e).map(|id| id_key(&id))
                } else {
                    Some(id_key(e))
                }
            };
            let mut positions: HashMap<Option<String>, usize> = HashMap::with_capacity(l.len());
            for (i, e) in l.iter().enumerate() {
                positions.entry(identity(e)).or_insert(i);
            }
            for element in a {
                match positions.get(&identity(element)) {
                    Some(&i) => merge_applied(&mut l[i], element, item),
                    None => {
                        positions.insert(identity(element), l.len());
                        l.push(strip_nulls(element));
                    }
                }
            }
        }
        (live, applied) => *live = strip_nulls(applied),
    }
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: Option<Value>,
    time: Option<Value>,
    /// Other members (`subresource`, ...) kept as they were.
    extra: Map<String, Value>,
    fields: FieldSet,
}

impl Entry {
    fn is(&self, manager: &str, operation: &str) -> bool {
        self.manager == manager && self.operation == operation
    }

    fn to_json(&self) -> Value {
        let mut m = self.extra.clone();
        m.insert("manager".into(), Value::String(self.manager.clone()));
        m.insert("operation".into(), Value::String(self.operation.clone()));
        if let Some(v) = &self.api_version {
            m.insert("apiVersion".into(), v.clone());
        }
        if let Some(t) = &self.time {
            m.insert("time".into(), t.clone());
        }
        m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        Value::Object(m)
    }
}

/// Reads `metadata.managedFields`; entries that are not FieldsV1 or cannot be read
/// are dropped (upstream resets unreadable managed fields too).
fn read_entries(object: &Value) -> Vec<Entry> {
    let Some(Value::Array(entries)) = object.pointer("/metadata/managedFields") else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|e| {
            let m = e.as_object()?;
            if m.get("fieldsType").and_then(Value::as_str) != Some("FieldsV1") {
                return None;
            }
            let fields = FieldSet::from_fields_v1(m.get("fieldsV1")?)?;
            let mut extra = m.clone();
            for k in [
                "manager",
                "operation",
                "apiVersion",
                "time",
                "fieldsType",
                "fieldsV1",
            ] {
                extra.remove(k);
            }
            Some(Entry {
                manager: m.get("manager")?.as_str()?.to_owned(),
                operation: m.get("operation")?.as_str()?.to_owned(),
                api_version: m.get("apiVersion").cloned(),
                time: m.get("time").cloned(),
                extra,
                fields,
            })
        })
        .collect()
}

/// Writes the non-empty entries in upstream's order (`sortEncodedManagedFields`): by
/// operation (`Apply` first), then time in seconds, manager, API version and subresource.
fn write_entries(object: &mut Value, entries: &[Entry]) {
    let Value::Object(obj) = object else {
        return;
    };
    let mut kept: Vec<&Entry> = entries.iter().filter(|e| !e.fields.is_empty()).collect();
    kept.sort_by_cached_key(|e| {
        (
            e.operation.clone(),
            entry_seconds(e),
            e.manager.clone(),
            entry_version(e),
            e.extra
                .get("subresource")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        )
    });
    let entries: Vec<Value> = kept.into_iter().map(Entry::to_json).collect();
    if entries.is_empty() {
        if let Some(Value::Object(meta)) = obj.get_mut("metadata") {
            meta.remove("managedFields");
        }
        return;
    }
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        meta.insert("managedFields".into(), Value::Array(entries));
    }
}

const APPLY: &str = "Apply";
const UPDATE: &str = "Update";
const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// The most `Update` entries `managedFields` keeps (upstream's `DefaultMaxUpdateManagers`);
/// past it the oldest are merged into [`ANCIENT_CHANGES`] entries.
pub const MAX_UPDATE_MANAGERS: usize = 10;

/// The manager name of the entries that hold the fields of merged old updaters (upstream's
/// `capManagersManager.oldUpdatesManagerName`), one per API version.
pub const ANCIENT_CHANGES: &str = "ancient-changes";

/// The seconds of an entry's `time`, 0 when it has none (as upstream compares them).
fn entry_seconds(entry: &Entry) -> i64 {
    entry
        .time
        .as_ref()
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second())
}

fn entry_version(entry: &Entry) -> String {
    entry
        .api_version
        .as_ref()
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// Upstream's `capManagersManager.capUpdateManagers`: while there are more than
/// [`MAX_UPDATE_MANAGERS`] `Update` entries, the oldest (by time, then by manager) are
/// merged, per API version, into one `ancient-changes` entry of that version (the first of a
/// version is left as it is until a second one comes; the bucket takes the time of the last
/// entry merged into it). Apply entries are never merged.
fn cap_update_managers(entries: &mut Vec<Entry>) {
    let mut updaters: Vec<usize> = (0..entries.len())
        .filter(|&i| entries[i].operation != APPLY)
        .collect();
    if updaters.len() <= MAX_UPDATE_MANAGERS {
        return;
    }
    updaters.sort_by(|&a, &b| {
        let key = |i: usize| {
            (
                entry_seconds(&entries[i]),
                entries[i].manager.clone(),
                entry_version(&entries[i]),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut first_of_version: HashMap<String, usize> = HashMap::new();
    let mut merged = vec![false; entries.len()];
    let mut remaining = updaters.len();
    for &i in &updaters {
        if remaining <= MAX_UPDATE_MANAGERS {
            break;
        }
        let version = entry_version(&entries[i]);
        let Some(&first) = first_of_version.get(&version) else {
            first_of_version.insert(version, i);
            continue;
        };
        let bucket = (0..entries.len()).find(|&b| {
            !merged[b]
                && entries[b].is(ANCIENT_CHANGES, UPDATE)
                && entry_version(&entries[b]) == version
        });
        let bucket = bucket.unwrap_or_else(|| {
            // The first updater of this version becomes the bucket.
            let entry = &mut entries[first];
            entry.manager = ANCIENT_CHANGES.into();
            entry.operation = UPDATE.into();
            entry.extra.clear();
            first
        });
        let fields = std::mem::take(&mut entries[i].fields);
        let time = entries[i].time.clone();
        entries[bucket].fields.0.extend(fields.0);
        entries[bucket].time = time;
        merged[i] = true;
        remaining -= 1;
    }
    let mut index = 0;
    entries.retain(|_| {
        index += 1;
        !merged[index - 1]
    });
}

/// Server-side apply of `applied` (the decoded body of an `apply-patch+yaml` request)
/// by field manager `manager`, onto `live` (`None` when the object does not exist yet).
///
/// Returns the new object, with `metadata.managedFields` updated: the applier's
/// `Apply` entry owns exactly the fields it applied, at time `now` (RFC 3339). On
/// conflicts with other managers it returns [`ApplyError::Conflict`] unless `force`
/// is set, in which case those managers lose the conflicting fields.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    schema: &TypeNode,
    now: &str,
) -> Result<Value, ApplyError> {
    if !applied.is_object() {
        return Err(ApplyError::Invalid(
            "the applied configuration must be an object".into(),
        ));
    }
    if applied
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".into(),
        ));
    }
    let applied_fields = FieldSet::of_object(applied, schema)?;
    let api_version = applied.get("apiVersion").cloned();
    let new_entry = Entry {
        manager: manager.to_owned(),
        operation: APPLY.into(),
        api_version,
        time: Some(Value::String(now.to_owned())),
        extra: Map::new(),
        fields: applied_fields.clone(),
    };

    let Some(live) = live else {
        let mut out = strip_nulls(applied);
        write_entries(&mut out, &[new_entry]);
        return Ok(out);
    };

    let mut entries = read_entries(live);
    if live.pointer("/metadata/managedFields").is_none() {
        let fields = FieldSet::of_object(live, schema).unwrap_or_default();
        entries.push(Entry {
            manager: BEFORE_FIRST_APPLY.into(),
            operation: UPDATE.into(),
            api_version: live.get("apiVersion").cloned(),
            time: Some(Value::String(now.to_owned())),
            extra: Map::new(),
            fields,
        });
    }

    // Conflicts: fields another manager owns to which this apply gives another value.
    let mut causes = Vec::new();
    let mut conflicting: Vec<(usize, Path)> = Vec::new();
    let (live_values, applied_values) = (Lookup::new(live), Lookup::new(applied));
    for (i, entry) in entries.iter().enumerate() {
        if entry.is(manager, APPLY) {
            continue;
        }
        for path in entry.fields.0.intersection(&applied_fields.0) {
            if differs(&live_values, &applied_values, path) {
                causes.push((render_path(path), entry.manager.clone()));
                conflicting.push((i, path.clone()));
            }
        }
    }
    if !causes.is_empty() && !force {
        return Err(ApplyError::Conflict { causes });
    }
    for (i, path) in conflicting {
        entries[i].fields.0.remove(&path);
    }

    // Fields this manager applied before and no longer applies go away, unless
    // someone else still owns them or something beneath them.
    let previous = entries
        .iter()
        .find(|e| e.is(manager, APPLY))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let others: Vec<&Entry> = entries.iter().filter(|e| !e.is(manager, APPLY)).collect();
    let mut out = live.clone();
    // Parents (list elements) sort before their fields: an element nobody else
    // needs goes whole, and the fields of one that stays never include its key.
    for path in previous.0.difference(&applied_fields.0) {
        if !is_key_field(path)
            && !applied_fields.covers(path)
            && !others.iter().any(|e| e.fields.covers(path))
        {
            remove_at(&mut out, path);
        }
    }
    merge_applied(&mut out, applied, schema);

    match entries.iter_mut().find(|e| e.is(manager, APPLY)) {
        Some(existing) => *existing = new_entry,
        None => entries.push(new_entry),
    }
    write_entries(&mut out, &entries);
    Ok(out)
}

/// Who made a non-apply write, as upstream's field manager identifies an `Update` entry:
/// the manager's name, the API version written (the new object's `apiVersion`) and the
/// subresource written through, so a write of `status` never merges into the entry of a
/// write of the object.
#[derive(Debug, Clone, Copy)]
pub struct Updater<'a> {
    /// The manager: the request's `fieldManager`, else the User-Agent's prefix (see
    /// [`manager_from_user_agent`]), else `unknown`.
    pub manager: &'a str,
    /// The subresource written (`status`), none for the object itself.
    pub subresource: Option<&'a str>,
    /// Fields, dotted (`status`, `spec.finalizers`), that the write's strategy resets or
    /// sets itself after upstream's field manager has run (upstream's `GetResetFields`,
    /// such as `status` for a write of the object of a kind with a status subresource, and
    /// what `PrepareForCreate` and admission add): never attributed to this writer.
    pub reset: &'a [&'a str],
}

impl<'a> From<&'a str> for Updater<'a> {
    fn from(manager: &'a str) -> Self {
        Updater {
            manager,
            subresource: None,
            reset: &[],
        }
    }
}

impl Updater<'_> {
    fn owns(&self, entry: &Entry, api_version: Option<&Value>) -> bool {
        entry.is(self.manager, UPDATE)
            && entry.api_version.as_ref() == api_version
            && entry.extra.get("subresource").and_then(Value::as_str) == self.subresource
    }

    fn resets(&self, path: &Path) -> bool {
        self.reset.iter().any(|reset| {
            let fields: Vec<&str> = reset.split('.').collect();
            path.len() >= fields.len()
                && fields
                    .iter()
                    .zip(path)
                    .all(|(field, seg)| seg.strip_prefix("f:") == Some(*field))
        })
    }
}

/// Upstream's `prefixFromUserAgent`: the User-Agent up to its first `/`, without
/// unprintable characters, cut at [`FIELD_MANAGER_MAX_LENGTH`] bytes; `unknown` when
/// nothing is left (as `buildManagerInfo` names an empty manager).
pub fn manager_from_user_agent(user_agent: &str) -> String {
    let prefix = user_agent.split('/').next().unwrap_or("");
    let mut out = String::new();
    for c in prefix.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX_LENGTH {
            break;
        }
        out.push(c);
    }
    if out.is_empty() {
        out.push_str("unknown");
    }
    out
}

/// The longest field manager name (upstream's `validation.FieldManagerMaxLength`).
pub const FIELD_MANAGER_MAX_LENGTH: usize = 128;

/// Records a non-apply write (create, update, JSON/merge/strategic patch) by
/// `updater` in `new`'s `metadata.managedFields` and returns the object to store.
///
/// As upstream's `managedFieldsUpdater` over structured-merge-diff's `Updater.Update`:
/// the fields this write added or changed (but those the strategy resets) are taken from
/// every other manager and added to the updater's `Update` entry, whose time is set
/// whenever it gains or changes a field; every entry loses the fields the write removed;
/// entries left empty are dropped. If the request itself changed
/// `metadata.managedFields` (relative to `old`), those entries are the starting point, as
/// upstream honours them.
pub fn record_update<'a>(
    old: Option<&Value>,
    new: &Value,
    updater: impl Into<Updater<'a>>,
    schema: &TypeNode,
    now: &str,
) -> Value {
    let updater = updater.into();
    let fields_of =
        |v: &Value| FieldSet::of_object(v, schema).unwrap_or_else(|_| lenient_fields(v, schema));
    let new_fields = fields_of(new);
    let old_fields = old.map(fields_of).unwrap_or_default();
    let sent = new.pointer("/metadata/managedFields");
    let mut entries = match old {
        Some(old) if sent.is_none() || sent == old.pointer("/metadata/managedFields") => {
            read_entries(old)
        }
        _ => read_entries(new),
    };
    let empty = Value::Object(Map::new());
    let (before, after) = (Lookup::new(old.unwrap_or(&empty)), Lookup::new(new));
    let changed: BTreeSet<Path> = new_fields
        .0
        .iter()
        .filter(|p| !updater.resets(p))
        .filter(|p| differs(&before, &after, p) || !old_fields.0.contains(*p))
        .cloned()
        .collect();

    let changed = with_new_parents(changed, &before, &after, old.is_none(), schema);
    let api_version = new.get("apiVersion");
    for entry in entries.iter_mut() {
        // A member stays while it is in the object: a leaf of its field set, or a map or
        // list an earlier write brought into being (`"."`) that is still there.
        entry.fields.0.retain(|p| {
            new_fields.0.contains(p) || after.get(p).is_some_and(|v| v.is_object() || v.is_array())
        });
        if !updater.owns(entry, api_version) {
            entry.fields.0.retain(|p| !changed.contains(p));
        }
    }
    if !changed.is_empty() {
        let now = Value::String(now.to_owned());
        match entries.iter_mut().find(|e| updater.owns(e, api_version)) {
            Some(entry) => {
                entry.fields.0.extend(changed);
                entry.time = Some(now);
            }
            None => {
                let mut extra = Map::new();
                if let Some(sub) = updater.subresource {
                    extra.insert("subresource".into(), Value::String(sub.to_owned()));
                }
                entries.push(Entry {
                    manager: updater.manager.to_owned(),
                    operation: UPDATE.into(),
                    api_version: api_version.cloned(),
                    time: Some(now),
                    extra,
                    fields: FieldSet(changed),
                });
            }
        }
    }
    cap_update_managers(&mut entries);
    let mut out = new.clone();
    write_entries(&mut out, &entries);
    out
}

/// Adds to a write's changed fields the maps and structs the write brought into being, as
/// structured-merge-diff's comparison of the old and new objects counts them (`Added`): they
/// show as `".": {}` beside their fields. Lists themselves never count (their elements do).
/// A create compares with Go's zero value of the kind, in which the non-pointer structs
/// (`spec`, `spec.template`, ...) exist already; without the Go types to tell them from
/// pointer structs, a create counts only maps (labels, annotations, `data`, selectors' maps)
/// and lists (but a pod spec's `containers`, which Go writes even empty).
fn with_new_parents(
    mut changed: BTreeSet<Path>,
    before: &Lookup<'_>,
    after: &Lookup<'_>,
    create: bool,
    schema: &TypeNode,
) -> BTreeSet<Path> {
    let mut parents = BTreeSet::new();
    for path in &changed {
        for end in 1..path.len() {
            let prefix = &path[..end];
            if !prefix[end - 1].starts_with("f:") || parents.contains(prefix) {
                continue;
            }
            let Some(value) = after.get(prefix).filter(|v| v.is_object() || v.is_array()) else {
                continue;
            };
            if before.get(prefix).is_some_and(|v| !v.is_null()) {
                continue;
            }
            // Go's zero value has the non-pointer structs, and the one list of the served
            // kinds merged by key that has no `omitempty` (`PodSpec.containers`).
            let zero_present = match value {
                Value::Array(_) => prefix[end - 1] == "f:containers",
                _ => !matches!(schema_at(schema, prefix), TypeNode::Map(_)),
            };
            if create && zero_present {
                continue;
            }
            parents.insert(prefix.to_vec());
        }
    }
    changed.extend(parents);
    changed
}

/// The schema node at `path` (`f:` fields and list elements).
fn schema_at<'s>(schema: &'s TypeNode, path: &[String]) -> &'s TypeNode {
    path.iter()
        .fold(schema, |node, seg| match seg.strip_prefix("f:") {
            Some(name) => node.field(name),
            None => node.list().1,
        })
}

/// Field set of an object that does not fit its schema (a keyed list element without
/// its key, written by a plain update): such lists are owned whole.
fn lenient_fields(object: &Value, schema: &TypeNode) -> FieldSet {
    let mut out = BTreeSet::new();
    collect_lenient(object, schema, &mut Vec::new(), &mut out);
    out.retain(|p| !is_server_field(p));
    FieldSet(out)
}

fn collect_lenient(value: &Value, schema: &TypeNode, path: &mut Path, out: &mut BTreeSet<Path>) {
    let mut attempt = BTreeSet::new();
    if collect(value, schema, &mut path.clone(), &mut attempt).is_ok() {
        out.extend(attempt);
        return;
    }
    match value {
        Value::Object(m)
            if !matches!(
                schema,
                TypeNode::Scalar | TypeNode::Atomic | TypeNode::List { .. }
            ) =>
        {
            for (k, v) in m {
                if v.is_null() {
                    continue;
                }
                path.push(format!("f:{k}"));
                collect_lenient(v, schema.field(k), path, out);
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::schema::schema_for;
    use serde_json::json;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:01:00Z";

    fn node_schema() -> &'static TypeNode {
        schema_for("", "Node")
    }

    fn cm_schema() -> &'static TypeNode {
        schema_for("", "ConfigMap")
    }

    fn entry<'a>(obj: &'a Value, manager: &str, operation: &str) -> Option<&'a Value> {
        obj["metadata"]["managedFields"]
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager && e["operation"] == operation)
    }

    fn without_managed_fields(obj: &Value) -> Value {
        let mut o = obj.clone();
        o["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        o
    }

    /// A ConfigMap configuration; empty label or data maps are left out, as a
    /// configuration that sets `labels: {}` owns the (empty) map itself.
    fn cm(labels: Value, data: Value) -> Value {
        let mut c = json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "c", "namespace": "default"}});
        if labels.as_object().is_some_and(|m| !m.is_empty()) {
            c["metadata"]["labels"] = labels;
        }
        if data.as_object().is_some_and(|m| !m.is_empty()) {
            c["data"] = data;
        }
        c
    }

    #[test]
    fn create_returns_the_applied_object_with_its_managed_fields() {
        let applied = cm(json!({"app": "web"}), json!({"a": "1"}));
        let out = apply(None, &applied, "kubectl", false, cm_schema(), T0).unwrap();
        assert_eq!(without_managed_fields(&out), applied);
        assert_eq!(
            out["metadata"]["managedFields"],
            json!([{
                "manager": "kubectl", "operation": "Apply", "apiVersion": "v1", "time": T0,
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}
            }])
        );
    }

    #[test]
    fn fields_v1_round_trips_keyed_elements_and_set_members() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "finalizers": ["x"]},
            "spec": {"taints": [{"key": "k"}], "podCIDRs": ["10.0.0.0/24"]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let fields = FieldSet::of_object(&node, node_schema()).unwrap();
        let v1 = fields.to_fields_v1();
        assert_eq!(
            v1,
            json!({
                "f:metadata": {"f:finalizers": {"v:\"x\"": {}}},
                "f:spec": {"f:podCIDRs": {"v:\"10.0.0.0/24\"": {}}, "f:taints": {}},
                "f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}
            })
        );
        assert_eq!(FieldSet::from_fields_v1(&v1), Some(fields));
        assert_eq!(FieldSet::from_fields_v1(&json!({"f:a": 1})), None);
    }

    #[test]
    fn reapply_updates_values_and_removes_fields_no_longer_applied() {
        let first = apply(
            None,
            &cm(
                json!({"app": "web", "tier": "fe"}),
                json!({"a": "1", "b": "2"}),
            ),
            "m",
            false,
            cm_schema(),
            T0,
        )
        .unwrap();
        let second = apply(
            Some(&first),
            &cm(json!({"app": "api"}), json!({"a": "1"})),
            "m",
            false,
            cm_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(second["metadata"]["labels"], json!({"app": "api"}));
        assert_eq!(second["data"], json!({"a": "1"}));
        assert_eq!(second["metadata"]["name"], json!("c"));
        let mf = second["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf.len(), 1);
        assert_eq!(mf[0]["time"], json!(T1));
        assert_eq!(
            mf[0]["fieldsV1"],
            json!({"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
        );
    }

    #[test]
    fn fields_owned_by_others_survive_their_removal_from_an_apply() {
        let first = apply(
            None,
            &cm(json!({"app": "web", "shared": "s"}), json!({})),
            "a",
            false,
            cm_schema(),
            T0,
        )
        .unwrap();
        // Manager b applies the same value for `shared` (no conflict: shared ownership)
        // and a label of its own.
        let second = apply(
            Some(&first),
            &cm(json!({"shared": "s", "b": "1"}), json!({})),
            "b",
            false,
            cm_schema(),
            T0,
        )
        .unwrap();
        // A plain update adds one more label, owned by "editor".
        let mut edited = second.clone();
        edited["metadata"]["labels"]["e"] = json!("1");
        let edited = record_update(Some(&second), &edited, "editor", cm_schema(), T0);
        // Manager a now applies only `app`: `shared` stays (b owns it), b and e stay.
        let third = apply(
            Some(&edited),
            &cm(json!({"app": "web"}), json!({})),
            "a",
            false,
            cm_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(
            third["metadata"]["labels"],
            json!({"app": "web", "shared": "s", "b": "1", "e": "1"})
        );
        // Manager b gives up both its labels: `shared` now goes, being nobody's.
        let fourth = apply(
            Some(&third),
            &cm(json!({}), json!({})),
            "b",
            false,
            cm_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(
            fourth["metadata"]["labels"],
            json!({"app": "web", "e": "1"})
        );
        assert!(
            entry(&fourth, "b", "Apply").is_none(),
            "an empty entry is dropped"
        );
    }

    #[test]
    fn conflict_with_an_updater_and_force() {
        let created = record_update(
            None,
            &cm(json!({"app": "web"}), json!({"a": "1"})),
            "creator",
            cm_schema(),
            T0,
        );
        let mut labelled = created.clone();
        labelled["metadata"]["labels"]["app"] = json!("x");
        let labelled = record_update(Some(&created), &labelled, "kubectl-label", cm_schema(), T0);

        // The same value as the owner's: no conflict, ownership shared.
        let same = apply(
            Some(&labelled),
            &cm(json!({"app": "x"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T1,
        );
        assert!(same.is_ok(), "{same:?}");

        let err = apply(
            Some(&labelled),
            &cm(json!({"app": "y"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T1,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ApplyError::Conflict {
                causes: vec![(".metadata.labels.app".into(), "kubectl-label".into())]
            }
        );
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-label\": .metadata.labels.app"
        );
        assert_eq!(err.http_status(), 409);

        let forced = apply(
            Some(&labelled),
            &cm(json!({"app": "y"}), json!({})),
            "kubectl",
            true,
            cm_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(forced["metadata"]["labels"]["app"], json!("y"));
        assert!(
            entry(&forced, "kubectl-label", "Update").is_none(),
            "kubectl-label owned only that label"
        );
        assert_eq!(
            entry(&forced, "kubectl", "Apply").unwrap()["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:app": {}}}})
        );
        // The creator keeps data.a, and the maps it brought into being.
        assert_eq!(
            entry(&forced, "creator", "Update").unwrap()["fieldsV1"],
            json!({"f:data": {".": {}, "f:a": {}}, "f:metadata": {"f:labels": {}}})
        );
        // Now the old owner is gone, applying again without force works.
        let again = apply(
            Some(&forced),
            &cm(json!({"app": "z"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T1,
        );
        assert_eq!(again.unwrap()["metadata"]["labels"]["app"], json!("z"));
    }

    #[test]
    fn an_owned_empty_map_filled_in_keeps_unowned_entries() {
        // The manager once applied `labels: {}`, owning the map itself.
        let mut empty = cm(json!({}), json!({}));
        empty["metadata"]["labels"] = json!({});
        let first = apply(None, &empty, "m", false, cm_schema(), T0).unwrap();
        // Someone adds a label without being tracked (the request dropped managedFields
        // handling); then m applies one label of its own.
        let mut live = first.clone();
        live["metadata"]["labels"]["untracked"] = json!("1");
        let out = apply(
            Some(&live),
            &cm(json!({"app": "web"}), json!({})),
            "m",
            false,
            cm_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["labels"],
            json!({"untracked": "1", "app": "web"})
        );
    }

    #[test]
    fn several_conflicts_are_grouped_by_manager() {
        let err = ApplyError::Conflict {
            causes: vec![
                (".spec.a".into(), "m1".into()),
                (".spec.b".into(), "m2".into()),
                (".spec.c".into(), "m1".into()),
            ],
        };
        assert_eq!(
            err.to_string(),
            "Apply failed with 3 conflicts: conflicts with \"m1\":\n- .spec.a\n- .spec.c\nconflicts with \"m2\":\n- .spec.b"
        );
    }

    fn node(conditions: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}, "status": {"conditions": conditions}})
    }

    #[test]
    fn keyed_lists_merge_by_key_across_managers() {
        let kubelet = apply(
            None,
            &node(json!([{"type": "Ready", "status": "True"}])),
            "kubelet",
            false,
            node_schema(),
            T0,
        )
        .unwrap();
        let npd = apply(
            Some(&kubelet),
            &node(json!([{"type": "KernelDeadlock", "status": "False"}])),
            "npd",
            false,
            node_schema(),
            T0,
        )
        .unwrap();
        assert_eq!(
            npd["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "KernelDeadlock", "status": "False"}])
        );
        // npd changing the kubelet's condition conflicts, with an upstream-style path.
        let err = apply(
            Some(&npd),
            &node(json!([{"type": "Ready", "status": "False"}])),
            "npd",
            false,
            node_schema(),
            T1,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ApplyError::Conflict {
                causes: vec![(
                    ".status.conditions[type=\"Ready\"].status".into(),
                    "kubelet".into()
                )]
            }
        );
        // The kubelet dropping its condition removes that element only.
        let dropped = apply(
            Some(&npd),
            &node(json!([])),
            "kubelet",
            false,
            node_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(
            dropped["status"]["conditions"],
            json!([{"type": "KernelDeadlock", "status": "False"}])
        );
        // The kubelet dropping one field of its element keeps the element and its key.
        let with_reason = apply(
            Some(&npd),
            &node(json!([{"type": "Ready", "status": "True", "reason": "KubeletReady"}])),
            "kubelet",
            false,
            node_schema(),
            T1,
        )
        .unwrap();
        let without = apply(
            Some(&with_reason),
            &node(json!([{"type": "Ready", "status": "True"}])),
            "kubelet",
            false,
            node_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(without["status"]["conditions"], npd["status"]["conditions"]);
    }

    #[test]
    fn an_element_another_manager_edited_is_kept_without_losing_its_key() {
        let kubelet = apply(
            None,
            &node(json!([{"type": "Ready", "status": "True"}])),
            "kubelet",
            false,
            node_schema(),
            T0,
        )
        .unwrap();
        let mut edited = kubelet.clone();
        edited["status"]["conditions"][0]["reason"] = json!("Manual");
        let edited = record_update(Some(&kubelet), &edited, "admin", node_schema(), T0);
        let dropped = apply(
            Some(&edited),
            &node(json!([])),
            "kubelet",
            false,
            node_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(
            dropped["status"]["conditions"],
            json!([{"type": "Ready", "reason": "Manual"}])
        );
    }

    #[test]
    fn atomic_lists_and_sets() {
        let spec = |taints: Value, cidrs: Value| {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                   "spec": {"taints": taints, "podCIDRs": cidrs}})
        };
        let first = apply(
            None,
            &spec(json!([{"key": "a"}, {"key": "b"}]), json!(["10.0.0.0/24"])),
            "m",
            false,
            node_schema(),
            T0,
        )
        .unwrap();
        let mut other = first.clone();
        other["spec"]["podCIDRs"] = json!(["10.0.0.0/24", "fd00::/64"]);
        let other = record_update(Some(&first), &other, "ipam", node_schema(), T0);
        let second = apply(
            Some(&other),
            &spec(json!([{"key": "c"}]), json!([])),
            "m",
            false,
            node_schema(),
            T1,
        )
        .unwrap();
        assert_eq!(second["spec"]["taints"], json!([{"key": "c"}]));
        // m gave up 10.0.0.0/24; ipam's member stays.
        assert_eq!(second["spec"]["podCIDRs"], json!(["fd00::/64"]));
        // A different atomic list owned by someone else is a conflict on the whole list.
        let only_taints = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
                                 "spec": {"taints": [{"key": "d"}]}});
        let err = apply(
            Some(&second),
            &only_taints,
            "other",
            false,
            node_schema(),
            T1,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ApplyError::Conflict {
                causes: vec![(".spec.taints".into(), "m".into())]
            }
        );
    }

    #[test]
    fn objects_without_managed_fields_belong_to_before_first_apply() {
        let live = cm(json!({"app": "web"}), json!({"a": "1"}));
        let err = apply(
            Some(&live),
            &cm(json!({"app": "api"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T0,
        )
        .unwrap_err();
        assert_eq!(
            err,
            ApplyError::Conflict {
                causes: vec![(".metadata.labels.app".into(), "before-first-apply".into())]
            }
        );
        let out = apply(
            Some(&live),
            &cm(json!({"tier": "fe"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T0,
        )
        .unwrap();
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "web", "tier": "fe"})
        );
        assert_eq!(out["data"], json!({"a": "1"}));
        assert!(entry(&out, "before-first-apply", "Update").is_some());
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let mut with_mf = cm(json!({}), json!({}));
        with_mf["metadata"]["managedFields"] = json!([]);
        assert!(matches!(
            apply(None, &with_mf, "m", false, cm_schema(), T0),
            Err(ApplyError::Invalid(_))
        ));
        let keyless = node(json!([{"status": "True"}]));
        let err = apply(None, &keyless, "m", false, node_schema(), T0).unwrap_err();
        assert!(matches!(err, ApplyError::Invalid(_)));
        assert!(err.to_string().contains(".status.conditions"), "{err}");
        assert_eq!(err.http_status(), 400);
        assert!(matches!(
            apply(None, &json!([1]), "m", false, cm_schema(), T0),
            Err(ApplyError::Invalid(_))
        ));
    }

    #[test]
    fn record_update_moves_ownership_and_forgets_removed_fields() {
        let created = record_update(
            None,
            &cm(json!({"app": "web"}), json!({"a": "1", "b": "2"})),
            "creator",
            cm_schema(),
            T0,
        );
        assert_eq!(
            entry(&created, "creator", "Update").unwrap(),
            &json!({"manager": "creator", "operation": "Update", "apiVersion": "v1", "time": T0,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:data": {".": {}, "f:a": {}, "f:b": {}},
                                 "f:metadata": {"f:labels": {".": {}, "f:app": {}}}}})
        );
        // An update that changes a, removes b and leaves the label: the editor owns a,
        // the creator keeps the label and the data map it made, b is nobody's.
        let mut edited = without_managed_fields(&created);
        edited["data"] = json!({"a": "9"});
        let edited = record_update(Some(&created), &edited, "editor", cm_schema(), T1);
        assert_eq!(
            entry(&edited, "creator", "Update").unwrap()["fieldsV1"],
            json!({"f:data": {}, "f:metadata": {"f:labels": {".": {}, "f:app": {}}}})
        );
        assert_eq!(
            entry(&edited, "editor", "Update").unwrap()["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
        assert_eq!(
            entry(&edited, "editor", "Update").unwrap()["time"],
            json!(T1)
        );
        // A no-op write changes nothing.
        let same = record_update(Some(&edited), &edited, "other", cm_schema(), T1);
        assert_eq!(same, edited);
        // An update taking a field an applier owns makes the applier conflict later.
        let applied = apply(
            Some(&edited),
            &cm(json!({"tier": "fe"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T1,
        )
        .unwrap();
        let mut relabel = applied.clone();
        relabel["metadata"]["labels"]["tier"] = json!("be");
        let relabel = record_update(Some(&applied), &relabel, "kubectl-label", cm_schema(), T1);
        assert!(entry(&relabel, "kubectl", "Apply").is_none());
        let err = apply(
            Some(&relabel),
            &cm(json!({"tier": "fe"}), json!({})),
            "kubectl",
            false,
            cm_schema(),
            T1,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-label\": .metadata.labels.tier"
        );
        // Clearing managedFields in the request starts over from the request.
        let mut cleared = relabel.clone();
        cleared["metadata"]["managedFields"] = json!([]);
        let cleared = record_update(Some(&relabel), &cleared, "resetter", cm_schema(), T1);
        assert!(cleared["metadata"].get("managedFields").is_none());
    }

    /// Upstream's `capmanagers.go`: at most ten `Update` managers; the oldest are folded,
    /// per API version, into one `ancient-changes` entry that keeps their fields.
    #[test]
    fn update_managers_are_capped_at_ten_with_the_oldest_in_ancient_changes() {
        let schema = cm_schema();
        let mut obj = cm(json!({}), json!({}));
        let mut applied = obj.clone();
        applied["data"] = json!({"applied": "x"});
        obj = apply(Some(&obj), &applied, "applier", false, schema, T0).unwrap();
        for i in 0..15 {
            let mut next = obj.clone();
            next["data"][format!("k{i}")] = json!("v");
            let now = format!("2026-01-01T00:{i:02}:00Z");
            obj = record_update(Some(&obj), &next, format!("m{i:02}").as_str(), schema, &now);
        }
        let entries = obj["metadata"]["managedFields"].as_array().unwrap();
        let updaters: Vec<&str> = entries
            .iter()
            .filter(|e| e["operation"] == "Update")
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(updaters.len(), MAX_UPDATE_MANAGERS, "{updaters:?}");
        assert!(entry(&obj, "applier", "Apply").is_some());
        let ancient = entry(&obj, ANCIENT_CHANGES, "Update").unwrap();
        // m00..m05 merged: the six oldest, so that ten updaters remain.
        for i in 0..6 {
            assert!(
                !updaters.contains(&format!("m{i:02}").as_str()),
                "{updaters:?}"
            );
            assert!(
                ancient["fieldsV1"]["f:data"]
                    .get(format!("f:k{i}"))
                    .is_some()
            );
        }
        for i in 6..15 {
            assert!(
                updaters.contains(&format!("m{i:02}").as_str()),
                "{updaters:?}"
            );
        }
        assert_eq!(ancient["time"], "2026-01-01T00:05:00Z");
        assert_eq!(ancient["apiVersion"], "v1");
    }

    #[test]
    fn record_update_tolerates_keyed_elements_without_their_key() {
        let bad = node(json!([{"status": "True"}]));
        let out = record_update(None, &bad, "m", node_schema(), T0);
        assert_eq!(
            entry(&out, "m", "Update").unwrap()["fieldsV1"],
            json!({"f:status": {"f:conditions": {}}})
        );
    }

    // Upstream's `managedFieldsUpdater` and `buildManagerInfoManager`: an Update entry is
    // one per manager, API version and subresource.
    #[test]
    fn writes_through_a_subresource_get_an_entry_of_their_own() {
        let mut registered = node(json!([]));
        registered["metadata"]["labels"] = json!({"zone": "a"});
        let created = record_update(None, &registered, "kubelet", node_schema(), T0);
        let mut next = created.clone();
        next["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        let status = Updater {
            manager: "kubelet",
            subresource: Some("status"),
            reset: &[],
        };
        let out = record_update(Some(&created), &next, status, node_schema(), T1);
        let entries = out["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(entries.len(), 2, "{entries:?}");
        let sub = entries
            .iter()
            .find(|e| e["subresource"] == "status")
            .expect("an entry of the status subresource");
        assert_eq!(sub["manager"], "kubelet");
        assert_eq!(sub["apiVersion"], "v1");
        assert_eq!(sub["time"], T1);
        assert_eq!(
            sub["fieldsV1"],
            json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {
                ".": {}, "f:status": {}, "f:type": {}}}}})
        );
    }

    // Upstream's `GetResetFields`: what the strategy resets is never the writer's.
    #[test]
    fn reset_fields_are_not_attributed() {
        let mut pod = node(json!([{"type": "Ready", "status": "True"}]));
        pod["metadata"]["labels"] = json!({"a": "1"});
        let writer = Updater {
            manager: "kubectl",
            subresource: None,
            reset: &["status"],
        };
        let out = record_update(None, &pod, writer, node_schema(), T0);
        assert_eq!(
            entry(&out, "kubectl", "Update").unwrap()["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
        );
    }

    // `managedFieldsUpdater`: the time moves whenever the write changed a field, even one
    // the manager owned already.
    #[test]
    fn the_time_moves_when_an_owned_field_changes() {
        let created = record_update(
            None,
            &cm(json!({"a": "1"}), json!({})),
            "m",
            cm_schema(),
            T0,
        );
        let changed = record_update(
            Some(&created),
            &cm(json!({"a": "2"}), json!({})),
            "m",
            cm_schema(),
            T1,
        );
        assert_eq!(entry(&changed, "m", "Update").unwrap()["time"], T1);
        let same = record_update(Some(&changed), &changed, "m", cm_schema(), T0);
        assert_eq!(entry(&same, "m", "Update").unwrap()["time"], T1);
    }

    // structured-merge-diff's `Updater.update`: a member goes only when the write removed
    // it; a map another write brought into being stays its creator's.
    #[test]
    fn a_map_brought_into_being_stays_with_its_creator() {
        let created = record_update(
            None,
            &cm(json!({"a": "1"}), json!({})),
            "creator",
            cm_schema(),
            T0,
        );
        let edited = record_update(
            Some(&created),
            &cm(json!({"a": "1", "b": "2"}), json!({})),
            "editor",
            cm_schema(),
            T1,
        );
        assert_eq!(
            entry(&edited, "creator", "Update").unwrap()["fieldsV1"],
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
        );
        assert_eq!(
            entry(&edited, "editor", "Update").unwrap()["fieldsV1"],
            json!({"f:metadata": {"f:labels": {"f:b": {}}}})
        );
    }

    // `sortEncodedManagedFields`: Apply before Update, then by time and manager.
    #[test]
    fn entries_are_written_in_upstreams_order() {
        let created = record_update(
            None,
            &cm(json!({"a": "1"}), json!({})),
            "zeta",
            cm_schema(),
            T1,
        );
        let edited = record_update(
            Some(&created),
            &cm(json!({"a": "1", "b": "2"}), json!({})),
            "alpha",
            cm_schema(),
            T1,
        );
        let applied = apply(
            Some(&edited),
            &cm(json!({"c": "3"}), json!({})),
            "applier",
            false,
            cm_schema(),
            T1,
        )
        .unwrap();
        let order: Vec<&str> = applied["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(order, ["applier", "alpha", "zeta"]);
    }

    // `+structType=atomic`: a label selector is owned whole, not field by field.
    #[test]
    fn atomic_structs_are_owned_whole() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u1"}]},
            "spec": {"selector": {"matchLabels": {"app": "web"}}}});
        let out = record_update(None, &deployment, "m", schema_for("apps", "Deployment"), T0);
        assert_eq!(
            entry(&out, "m", "Update").unwrap()["fieldsV1"],
            json!({"f:metadata": {"f:ownerReferences": {".": {}, "k:{\"uid\":\"u1\"}": {}}},
                   "f:spec": {"f:selector": {}}})
        );
    }

    // `prefixFromUserAgent` and `buildManagerInfo`.
    #[test]
    fn managers_are_named_after_the_user_agent() {
        assert_eq!(
            manager_from_user_agent("kubectl/v1.35.4 (linux/amd64) kubernetes/abc"),
            "kubectl"
        );
        assert_eq!(manager_from_user_agent("kube-\u{7}rs/2.0"), "kube-rs");
        assert_eq!(manager_from_user_agent(""), "unknown");
        assert_eq!(
            manager_from_user_agent(&"x".repeat(300)).len(),
            FIELD_MANAGER_MAX_LENGTH
        );
    }
}
