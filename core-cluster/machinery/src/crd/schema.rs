//! Structural schemas (`openAPIV3Schema` of a custom resource definition's version), after
//! upstream's `staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema`: the
//! structural check a definition's schema must pass (`structural/validation.go`), and what
//! a custom resource goes through on every write: pruning of unknown fields
//! (`pruning/algorithm.go`), defaulting (`defaulting/algorithm.go`) and validation
//! (`k8s.io/kube-openapi/pkg/validation/validate`, with its field paths and messages).

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value, json};

use crate::registry::FieldError;

/// The `pattern`s of a schema, each compiled once when the schema is served (go-openapi's
/// validator caches each compiled pattern likewise), rather than for every string validated.
#[derive(Debug, Default)]
pub struct Patterns(HashMap<String, regex::Regex>);

impl Patterns {
    /// Every `pattern` in `schema` compiled (see [`super::pattern::compile`]), or the
    /// problems of those that do not compile, as [`pattern_errors`] gives them.
    pub fn compile(schema: &Value) -> Result<Patterns, Vec<FieldError>> {
        let mut compiled = HashMap::new();
        let mut errors = Vec::new();
        each_pattern(schema, String::new(), &mut |pattern, path| {
            if compiled.contains_key(pattern) {
                return;
            }
            match super::pattern::compile(pattern) {
                Ok(re) => {
                    compiled.insert(pattern.to_owned(), re);
                }
                Err(e) => errors.push(pattern_error(path, pattern, &e)),
            }
        });
        if errors.is_empty() {
            Ok(Patterns(compiled))
        } else {
            Err(errors)
        }
    }

    /// How many distinct patterns were compiled.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the schema has no pattern.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn pattern_error(path: String, pattern: &str, why: &str) -> FieldError {
    FieldError::invalid(
        path,
        &json!(pattern),
        format!("must be a valid regular expression, but isn't: {why}"),
    )
}

/// The problems of every `pattern` in `schema` (at `path`), as upstream's schema check
/// refuses them (`apiserver/schema/validation.go`: `<path>.pattern: Invalid value: "(":
/// must be a valid regular expression, but isn't: error parsing regexp: …`).
pub fn pattern_errors(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut seen = HashSet::new();
    each_pattern(schema, path.to_owned(), &mut |pattern, at| {
        if seen.insert(pattern.to_owned())
            && let Err(e) = super::pattern::compile(pattern)
        {
            errors.push(pattern_error(at, pattern, &e));
        }
    });
    errors
}

/// Calls `f` with every `pattern` under `schema` and its field path (`….pattern`), through
/// `properties`, `items`, `additionalProperties`, `allOf`, `anyOf`, `oneOf` and `not`.
fn each_pattern(schema: &Value, path: String, f: &mut dyn FnMut(&str, String)) {
    if !schema.is_object() {
        return;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    if let Some(pattern) = schema["pattern"].as_str() {
        f(pattern, join("pattern"));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, child) in props {
            each_pattern(child, join(&format!("properties[{name}]")), f);
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(child) = schema.get(key) {
            each_pattern(child, join(key), f);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        for (i, child) in schema[key].as_array().into_iter().flatten().enumerate() {
            each_pattern(child, join(&format!("{key}[{i}]")), f);
        }
    }
}

fn type_of(schema: &Value) -> &str {
    schema["type"].as_str().unwrap_or("")
}

fn flag(schema: &Value, key: &str) -> bool {
    schema[key].as_bool() == Some(true)
}

fn preserves_unknown(schema: &Value) -> bool {
    flag(schema, "x-kubernetes-preserve-unknown-fields")
}

fn int_or_string(schema: &Value) -> bool {
    flag(schema, "x-kubernetes-int-or-string")
}

fn embedded(schema: &Value) -> bool {
    flag(schema, "x-kubernetes-embedded-resource")
}

/// The problems that make `schema` (at `path`) not structural, in upstream's words
/// (`structural/validation.go validateStructuralInvariants` and `validateStructural`): every
/// specified field has a `type` (unless `x-kubernetes-int-or-string` or
/// `x-kubernetes-preserve-unknown-fields` says what it holds), the root is an object, and
/// `metadata` at the root restricts `name` and `generateName` only.
pub fn structural_errors(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    match type_of(schema) {
        "" => errors.push(FieldError::required(
            format!("{path}.type"),
            "must not be empty at the root",
        )),
        "object" => {}
        other => errors.push(FieldError::invalid(
            format!("{path}.type"),
            &json!(other),
            "must be object at the root",
        )),
    }
    if let Some(meta) = schema["properties"].get("metadata") {
        let allowed = meta["properties"]
            .as_object()
            .is_none_or(|p| p.keys().all(|k| k == "name" || k == "generateName"));
        if type_of(meta) != "object" && !meta["type"].is_null() {
            errors.push(FieldError::invalid(
                format!("{path}.properties[metadata].type"),
                &meta["type"],
                "must be object",
            ));
        }
        if !allowed {
            errors.push(FieldError::forbidden(
                format!("{path}.properties[metadata]"),
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    walk_structural(schema, path, true, &mut errors);
    errors
}

fn walk_structural(schema: &Value, path: &str, root: bool, errors: &mut Vec<FieldError>) {
    if !schema.is_object() {
        return;
    }
    if int_or_string(schema) && !schema["type"].is_null() {
        errors.push(FieldError::invalid(
            format!("{path}.type"),
            &schema["type"],
            "must be empty if x-kubernetes-int-or-string is true",
        ));
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, child) in props {
            let child_path = format!("{path}.properties[{name}]");
            if !root || name != "metadata" {
                require_type(
                    child,
                    &child_path,
                    "must not be empty for specified object fields",
                    errors,
                );
            }
            walk_structural(child, &child_path, false, errors);
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        let child_path = format!("{path}.items");
        require_type(
            items,
            &child_path,
            "must not be empty for specified array items",
            errors,
        );
        walk_structural(items, &child_path, false, errors);
    }
    if let Some(more) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        if schema
            .get("properties")
            .is_some_and(|p| p.as_object().is_some_and(|p| !p.is_empty()))
        {
            errors.push(FieldError::forbidden(
                format!("{path}.additionalProperties"),
                "additionalProperties and properties are mutual exclusive",
            ));
        }
        let child_path = format!("{path}.additionalProperties");
        require_type(
            more,
            &child_path,
            "must not be empty for specified object fields",
            errors,
        );
        walk_structural(more, &child_path, false, errors);
    }
}

fn require_type(schema: &Value, path: &str, why: &str, errors: &mut Vec<FieldError>) {
    if schema["type"].is_null() && !int_or_string(schema) && !preserves_unknown(schema) {
        errors.push(FieldError::required(format!("{path}.type"), why));
    }
}

/// Removes from `value` the fields `schema` does not specify (upstream's
/// `pruning.PruneWithOptions`), unless `x-kubernetes-preserve-unknown-fields` keeps them. At
/// the root, and in `x-kubernetes-embedded-resource` objects, `apiVersion`, `kind` and
/// `metadata` are kept.
pub fn prune(value: &mut Value, schema: &Value) {
    prune_at(value, schema, true);
}

fn prune_at(value: &mut Value, schema: &Value, root: bool) {
    match value {
        Value::Object(map) => {
            let keep_meta = root || embedded(schema);
            let props = schema["properties"].as_object();
            let more = schema.get("additionalProperties").filter(|a| a.is_object());
            let keep_all = preserves_unknown(schema) || schema["additionalProperties"] == true;
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if keep_meta && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (props.and_then(|p| p.get(&key)), more) {
                    (Some(child), _) | (None, Some(child)) => {
                        if let Some(v) = map.get_mut(&key) {
                            prune_at(v, child, false);
                        }
                    }
                    (None, None) if keep_all => {}
                    (None, None) => {
                        map.remove(&key);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for item in items {
                    prune_at(item, item_schema, false);
                }
            }
        }
        _ => {}
    }
}

/// Sets the `default` of every specified field that is absent (upstream's
/// `defaulting.Default`), at any depth, objects in arrays and maps included.
pub fn default(value: &mut Value, schema: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                for (key, child) in props {
                    if !map.contains_key(key)
                        && let Some(d) = child.get("default")
                    {
                        map.insert(key.clone(), d.clone());
                    }
                    if let Some(v) = map.get_mut(key) {
                        default(v, child);
                    }
                }
            }
            if let Some(more) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for v in map.values_mut() {
                    default(v, more);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for item in items {
                    default(item, item_schema);
                }
            }
        }
        _ => {}
    }
}

/// The validation errors of `value` against `schema` (kube-openapi's
/// `validate.SchemaValidator` as the custom resource strategy runs it), with upstream's
/// field paths (`spec.replicas`, `spec.list[0].name`) and messages.
///
/// `patterns` holds the schema's compiled patterns ([`Patterns::compile`]).
pub fn validate(value: &Value, schema: &Value, patterns: &Patterns) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Value::Object(map) = value {
        let mut v = Validation {
            patterns,
            errors: &mut errors,
        };
        v.object(map, schema, "");
    }
    errors
}

/// One object's validation: the schema's compiled patterns and the errors found.
struct Validation<'a> {
    patterns: &'a Patterns,
    errors: &'a mut Vec<FieldError>,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_error(path: &str, value: &Value, want: &str) -> FieldError {
    let got = json_type(value);
    FieldError::invalid(
        path,
        &json!(got),
        format!("{path} in body must be of type {want}: \"{got}\""),
    )
}

impl Validation<'_> {
    fn value(&mut self, value: &Value, schema: &Value, path: &str) {
        if !schema.is_object() {
            return;
        }
        if value.is_null() {
            if !flag(schema, "nullable") && !schema["type"].is_null() {
                self.errors.push(type_error(path, value, type_of(schema)));
            }
            return;
        }
        if int_or_string(schema) {
            if !matches!(json_type(value), "integer" | "string") {
                self.errors.push(type_error(path, value, "integer,string"));
                return;
            }
        } else {
            let want = type_of(schema);
            let ok = match want {
                "" => true,
                "number" => value.is_number(),
                other => json_type(value) == other,
            };
            if !ok {
                self.errors.push(type_error(path, value, want));
                return;
            }
        }
        if let Some(allowed) = schema["enum"].as_array()
            && !allowed.contains(value)
        {
            let quoted: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
            self.errors.push(FieldError {
                reason: "FieldValueNotSupported",
                field: path.to_owned(),
                message: format!(
                    "Unsupported value: {value}: supported values: {}",
                    quoted.join(", ")
                ),
            });
        }
        match value {
            Value::Number(n) => self.number(n.as_f64().unwrap_or(0.0), value, schema, path),
            Value::String(s) => self.string(s, value, schema, path),
            Value::Array(items) => self.array(items, schema, path),
            Value::Object(map) => self.object(map, schema, path),
            _ => {}
        }
    }

    fn array(&mut self, items: &[Value], schema: &Value, path: &str) {
        let n = items.len() as u64;
        if let Some(max) = schema["maxItems"].as_u64()
            && n > max
        {
            self.errors.push(FieldError {
                reason: "FieldValueTooMany",
                field: path.to_owned(),
                message: format!("Too many: {n}: must have at most {max} items"),
            });
        }
        if let Some(min) = schema["minItems"].as_u64()
            && n < min
        {
            self.errors.push(FieldError::invalid(
                path,
                &json!(n),
                format!("{path} in body should have at least {min} items"),
            ));
        }
        if flag(schema, "uniqueItems") || schema["x-kubernetes-list-type"] == "set" {
            // One pass with a set of each item's canonical form: a list of many items
            // costs linear time, not quadratic.
            let mut seen = HashSet::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                if !seen.insert(canonical(item)) {
                    self.errors
                        .push(FieldError::duplicate(format!("{path}[{i}]"), item));
                }
            }
        }
        if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
            for (i, item) in items.iter().enumerate() {
                self.value(item, item_schema, &format!("{path}[{i}]"));
            }
        }
    }

    fn object(&mut self, map: &Map<String, Value>, schema: &Value, path: &str) {
        if let Some(required) = schema["required"].as_array() {
            for r in required.iter().filter_map(Value::as_str) {
                if !map.contains_key(r) {
                    self.errors.push(FieldError::required(join(path, r), ""));
                }
            }
        }
        let n = map.len() as u64;
        if let Some(max) = schema["maxProperties"].as_u64()
            && n > max
        {
            self.errors.push(FieldError {
                reason: "FieldValueTooMany",
                field: path.to_owned(),
                message: format!("Too many: {n}: must have at most {max} items"),
            });
        }
        if let Some(min) = schema["minProperties"].as_u64()
            && n < min
        {
            self.errors.push(FieldError::invalid(
                path,
                &json!(n),
                format!("{path} in body should have at least {min} properties"),
            ));
        }
        let root = path.is_empty();
        let props = schema["properties"].as_object();
        let more = schema.get("additionalProperties").filter(|a| a.is_object());
        for (key, v) in map {
            if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(child) = props.and_then(|p| p.get(key)) {
                self.value(v, child, &join(path, key));
            } else if let Some(child) = more {
                self.value(v, child, &format!("{path}[{key}]"));
            }
        }
    }

    fn number(&mut self, n: f64, value: &Value, schema: &Value, path: &str) {
        if let Some(min) = schema["minimum"].as_f64() {
            let exclusive = flag(schema, "exclusiveMinimum");
            if (exclusive && n <= min) || (!exclusive && n < min) {
                let how = if exclusive {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                self.errors.push(FieldError::invalid(
                    path,
                    value,
                    format!("{path} in body should be {how} {}", schema["minimum"]),
                ));
            }
        }
        if let Some(max) = schema["maximum"].as_f64() {
            let exclusive = flag(schema, "exclusiveMaximum");
            if (exclusive && n >= max) || (!exclusive && n > max) {
                let how = if exclusive {
                    "less than"
                } else {
                    "less than or equal to"
                };
                self.errors.push(FieldError::invalid(
                    path,
                    value,
                    format!("{path} in body should be {how} {}", schema["maximum"]),
                ));
            }
        }
        if let Some(m) = schema["multipleOf"].as_f64()
            && m > 0.0
            && (n / m).fract() != 0.0
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                format!(
                    "{path} in body should be a multiple of {}",
                    schema["multipleOf"]
                ),
            ));
        }
    }

    fn string(&mut self, s: &str, value: &Value, schema: &Value, path: &str) {
        let chars = s.chars().count() as u64;
        if let Some(max) = schema["maxLength"].as_u64()
            && chars > max
        {
            self.errors.push(FieldError {
                reason: "FieldValueTooLong",
                field: path.to_owned(),
                message: format!("Too long: may not be more than {max} bytes"),
            });
        }
        if let Some(min) = schema["minLength"].as_u64()
            && chars < min
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                format!("{path} in body should be at least {min} chars long"),
            ));
        }
        if let Some(pattern) = schema["pattern"].as_str() {
            // Compiled with the schema; one missing is a pattern that never compiled,
            // which fails every value rather than passing any.
            let matched = self
                .patterns
                .0
                .get(pattern)
                .is_some_and(|re| re.is_match(s));
            if !matched {
                self.errors.push(FieldError::invalid(
                    path,
                    value,
                    format!("{path} in body should match '{pattern}'"),
                ));
            }
        }
        if let Some(format) = schema["format"].as_str()
            && !format_ok(format, s)
        {
            self.errors.push(FieldError::invalid(
                path,
                value,
                format!("{path} in body must be of type {format}: {value}"),
            ));
        }
    }
}

/// A value's canonical text, equal for equal values whatever their objects' key order.
fn canonical(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for k in keys {
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&map[k], out);
                    out.push(',');
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for item in items {
                    write(item, out);
                    out.push(',');
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// The formats upstream checks (`apiextensions-apiserver` `supportedFormats`) that are
/// checked here; other formats are accepted as any string.
fn format_ok(format: &str, s: &str) -> bool {
    match format {
        "int32" | "int64" => s.parse::<i64>().is_ok(),
        "date-time" | "datetime" => s.parse::<jiff::Timestamp>().is_ok(),
        "date" => s.parse::<jiff::civil::Date>().is_ok(),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.parse::<ipnet::IpNet>().is_ok(),
        "uuid" => uuid::Uuid::parse_str(s).is_ok(),
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }
        "email" => s
            .split_once('@')
            .is_some_and(|(u, d)| !u.is_empty() && d.contains('.')),
        _ => true,
    }
}

/// Whether a patch or apply of a definition's version changes anything but `status`,
/// as the custom resource strategy counts a new generation (`metadata` and `status` are
/// not counted).
pub fn spec_changed(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    strip(old) != strip(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns() -> Patterns {
        Patterns::compile(&schema()).expect("the test schema's patterns compile")
    }

    /// `apiserver/schema/validation.go`: every pattern of a definition's schema, at any
    /// depth, must compile, and the error names its field.
    #[test]
    fn an_invalid_pattern_is_an_error_at_its_field() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"s": {"type": "string", "pattern": "("},
                           "l": {"type": "array", "items": {"type": "string", "pattern": "a{2,1}"}},
                           "ok": {"type": "string", "pattern": "^a+$"}}}}});
        let errors: Vec<String> =
            pattern_errors(&schema, "spec.versions[0].schema.openAPIV3Schema")
                .iter()
                .map(FieldError::full)
                .collect();
        assert_eq!(
            errors,
            [
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[l].items.pattern: Invalid value: \"a{2,1}\": must be a valid regular expression, but isn't: error parsing regexp: invalid repeat count: `{2,1}`",
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[s].pattern: Invalid value: \"(\": must be a valid regular expression, but isn't: error parsing regexp: missing closing ): `(`",
            ]
        );
        assert!(Patterns::compile(&schema).is_err());
    }

    /// A pattern is compiled once per schema (go-openapi's validator caches it): the
    /// schema's one pattern is compiled when the schema is, and 20,000 strings are matched
    /// against it (BENCHMARKS.md has the CPU time: compiling per string took 19 s).
    #[test]
    fn a_pattern_is_compiled_once_per_schema_not_per_string() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"hosts": {"type": "array", "items": {"type": "string",
                "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}}}}}});
        let patterns = Patterns::compile(&schema).unwrap();
        assert_eq!(patterns.len(), 1);
        let mut hosts = vec![json!("a"); 20_000];
        hosts.push(json!("-bad"));
        let obj = json!({"spec": {"hosts": hosts}});
        let errors = validate(&obj, &schema, &patterns);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.hosts[20000]");
    }

    /// kube-openapi's `uniqueItems` and `x-kubernetes-list-type: set`: each duplicate is
    /// reported (found in one pass over the list, not by comparing every pair).
    #[test]
    fn every_duplicate_of_a_set_is_found() {
        let schema = json!({"type": "object", "properties": {"s": {"type": "array",
            "x-kubernetes-list-type": "set", "items": {"type": "string"}}}});
        let mut items: Vec<Value> = (0..50_000).map(|i| json!(format!("v{i}"))).collect();
        items.push(json!("v7"));
        let errors = validate(&json!({"s": items}), &schema, &Patterns::default());
        assert_eq!(
            errors.iter().map(FieldError::full).collect::<Vec<_>>(),
            ["s[50000]: Duplicate value: \"v7\""]
        );
        // Objects are equal whatever their key order.
        let objs = json!({"s": [{"a": 1, "b": 2}, {"b": 2, "a": 1}]});
        let schema =
            json!({"type": "object", "properties": {"s": {"type": "array", "uniqueItems": true}}});
        assert_eq!(validate(&objs, &schema, &Patterns::default()).len(), 1);
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                        "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                        "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                        "port": {"x-kubernetes-int-or-string": true},
                        "list": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "inner": {"type": "object", "x-kubernetes-embedded-resource": true,
                                  "properties": {"spec": {"type": "string"}}},
                    },
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
            },
        })
    }

    /// `pruning/algorithm.go`: unknown fields go, except under
    /// `x-kubernetes-preserve-unknown-fields` and the type meta of embedded resources.
    #[test]
    fn pruning_keeps_only_specified_and_preserved_fields() {
        let mut obj = json!({
            "apiVersion": "x.io/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"size": 1, "bogus": 1, "free": {"any": {"thing": 1}},
                     "inner": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": "s", "x": 1}},
            "other": 1,
        });
        prune(&mut obj, &schema());
        assert_eq!(
            obj,
            json!({
                "apiVersion": "x.io/v1", "kind": "K", "metadata": {"name": "a"},
                "spec": {"size": 1, "free": {"any": {"thing": 1}},
                         "inner": {"apiVersion": "v1", "kind": "Pod", "metadata": {}, "spec": "s"}},
            })
        );
    }

    /// `defaulting/algorithm.go`: a missing field with a default gets it.
    #[test]
    fn defaulting_fills_missing_fields_only() {
        let mut obj = json!({"spec": {"size": 1}});
        default(&mut obj, &schema());
        assert_eq!(obj["spec"]["color"], "red");
        let mut obj = json!({"spec": {"size": 1, "color": "blue"}});
        default(&mut obj, &schema());
        assert_eq!(obj["spec"]["color"], "blue");
    }

    /// kube-openapi `validate`: paths and messages as kube-apiserver prints them.
    #[test]
    fn validation_errors_name_the_path_and_rule_as_upstream() {
        let obj = json!({"spec": {"size": "3", "color": "pink", "name": "ABCDEFG",
                                  "port": true, "list": ["a", "b", "c"]}});
        let errors: Vec<String> = validate(&obj, &schema(), &patterns())
            .iter()
            .map(FieldError::full)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\"",
                "spec.list: Too many: 3: must have at most 2 items",
                "spec.name: Too long: may not be more than 5 bytes",
                "spec.name: Invalid value: \"ABCDEFG\": spec.name in body should match '^[a-z]+$'",
                "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"",
                "spec.size: Invalid value: \"string\": spec.size in body must be of type integer: \"string\"",
            ]
        );
        let errors: Vec<String> = validate(&json!({"spec": {"size": 11}}), &schema(), &patterns())
            .iter()
            .map(FieldError::full)
            .collect();
        assert_eq!(
            errors,
            ["spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10"]
        );
        let errors: Vec<String> = validate(&json!({"spec": {}}), &schema(), &patterns())
            .iter()
            .map(FieldError::full)
            .collect();
        assert_eq!(errors, ["spec.size: Required value"]);
    }

    /// `structural/validation.go`: a field without a type is not structural.
    #[test]
    fn a_field_without_type_is_not_structural() {
        let errors: Vec<String> = structural_errors(
            &json!({"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}}}}),
            "spec.versions[0].schema.openAPIV3Schema",
        )
        .iter()
        .map(FieldError::full)
        .collect();
        assert_eq!(
            errors,
            [
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"
            ]
        );
        assert!(structural_errors(&schema(), "s").is_empty());
        let errors = structural_errors(&json!({"type": "string"}), "s");
        assert_eq!(
            errors[0].full(),
            "s.type: Invalid value: \"string\": must be object at the root"
        );
    }
}
