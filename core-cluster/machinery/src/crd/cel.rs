//! Validation rules (`x-kubernetes-validations`, CEL) of a structural schema, after
//! upstream's `staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go`
//! (evaluation) and `pkg/apis/apiextensions/validation/validation.go` (the checks when a
//! definition is written).
//!
//! The CEL language and the Kubernetes CEL libraries (strings, lists, sets, regex, URLs,
//! IP/CIDR, quantities, semver, named formats, ...) are kube-rs' `kube-cel`, over the `cel`
//! crate; this module walks the schema and the object as upstream does:
//!
//! - every rule runs with `self` bound to the value at its schema node (absent or `null`
//!   values are not validated);
//! - a transition rule (one that uses `oldSelf`) runs only on update, and only where the old
//!   value is correlatable: object properties, map values, and the items of an
//!   `x-kubernetes-list-type: map` list matched by their `x-kubernetes-list-map-keys`
//!   (never by position); `optionalOldSelf: true` runs it on create with `oldSelf` null;
//! - a failed rule is `<path>: Invalid value: "<schema type>": <message>` (or the error of
//!   its `reason`), the message from `messageExpression`, `message` or `failed rule: <rule>`,
//!   at the rule's `fieldPath` when it has one;
//! - cost: the `cel` crate does not meter evaluation, so cost here is an upper-bound
//!   estimate in the same units for both of upstream's checks. A rule costs the number of
//!   nodes of its expression times `n^d`, where `d` is how deeply its comprehensions
//!   (`all`, `exists`, `map`, `filter`, ...) nest and `n` the largest list or map they can
//!   iterate. When a definition is written, `n` comes from the schema's `maxItems` and
//!   `maxProperties` (unbounded counts as [`UNBOUNDED_CARDINALITY`]) and a rule above
//!   [`PER_CALL_LIMIT`] is refused (`estimated rule cost exceeds budget by factor of ...`);
//!   on every write, `n` is the largest collection actually under `self`, a rule above
//!   [`PER_CALL_LIMIT`] fails with `call cost exceeds limit for rule`, and once the rules
//!   of one object have spent [`RUNTIME_COST_BUDGET`] the rest are not run (`validation
//!   failed due to running out of cost budget, no further validation rules will be run`).
//!   Both are charged before the rule runs, so an expensive rule never runs.
//!
//! Not as upstream: rules are parsed but not type-checked, so a rule naming a field the
//! schema lacks or returning a non-boolean is refused when it runs, not when the definition
//! is written; the macros `cel` lacks (`sortBy`, `cel.bind`, two-variable comprehensions)
//! fail when they run.

use std::collections::BTreeMap;

use kube_cel::cel::{
    Program,
    common::ast::{EntryExpr, Expr},
};
use kube_cel::{CompiledSchema, ErrorKind, ValidationError, compile_schema};
use serde_json::{Value, json};

use crate::registry::FieldError;

/// Upstream's `celconfig.PerCallLimit`: the most one rule may cost, estimated when the
/// definition is written and counted when the rule runs.
pub const PER_CALL_LIMIT: u64 = 1_000_000;

/// Upstream's `celconfig.RuntimeCELCostBudget`: the most all rules of one object may cost.
pub const RUNTIME_COST_BUDGET: u64 = 10_000_000;

/// The size an unbounded list or map is estimated at: upstream derives it from the largest
/// request (3 MiB) over the smallest element; this is 1 Mi elements.
pub const UNBOUNDED_CARDINALITY: u64 = 1 << 20;

const KEY: &str = "x-kubernetes-validations";

/// A rule's shape for the cost estimate.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// The expression's node count.
    nodes: u64,
    /// How deeply its comprehensions nest.
    depth: u32,
}

impl Shape {
    fn of(program: &Program) -> Shape {
        fn walk(e: &Expr) -> (u64, u32) {
            let mut nodes = 1;
            let mut depth = 0;
            let mut add = |(n, d): (u64, u32)| {
                nodes += n;
                depth = depth.max(d);
            };
            match e {
                Expr::Call(c) => {
                    if let Some(t) = &c.target {
                        add(walk(&t.expr));
                    }
                    for a in &c.args {
                        add(walk(&a.expr));
                    }
                }
                Expr::Comprehension(c) => {
                    let (n, d) = walk(&c.iter_range.expr);
                    nodes += n;
                    depth = depth.max(d);
                    let mut inner = 0;
                    for part in [&c.accu_init, &c.loop_cond, &c.loop_step, &c.result] {
                        let (n, d) = walk(&part.expr);
                        nodes += n;
                        inner = inner.max(d);
                    }
                    depth = depth.max(inner + 1);
                }
                Expr::List(l) => {
                    for x in &l.elements {
                        add(walk(&x.expr));
                    }
                }
                Expr::Map(m) => {
                    for entry in &m.entries {
                        if let EntryExpr::MapEntry(me) = &entry.expr {
                            add(walk(&me.key.expr));
                            add(walk(&me.value.expr));
                        }
                    }
                }
                Expr::Struct(s) => {
                    for entry in &s.entries {
                        if let EntryExpr::StructField(f) = &entry.expr {
                            add(walk(&f.value.expr));
                        }
                    }
                }
                Expr::Select(s) => add(walk(&s.operand.expr)),
                Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
            }
            (nodes, depth)
        }
        let (nodes, depth) = walk(&program.expression().expr);
        Shape { nodes, depth }
    }

    /// The cost with collections of at most `n` elements.
    fn cost(self, n: u64) -> u64 {
        (0..self.depth).fold(self.nodes, |c, _| c.saturating_mul(n.max(1)))
    }
}

/// The largest collection the schema allows under `schema` (for the estimate when a
/// definition is written).
fn schema_cardinality(schema: &Value) -> u64 {
    let mut n = 1;
    if schema["type"] == "array" {
        n = schema["maxItems"].as_u64().unwrap_or(UNBOUNDED_CARDINALITY);
    }
    if schema["type"] == "object"
        && (schema["additionalProperties"].is_object()
            || schema["x-kubernetes-preserve-unknown-fields"] == true)
    {
        n = n.max(
            schema["maxProperties"]
                .as_u64()
                .unwrap_or(UNBOUNDED_CARDINALITY),
        );
    }
    for child in children(schema) {
        n = n.max(schema_cardinality(child));
    }
    n
}

/// The largest list or map actually under `value` (for the cost of a running rule).
fn value_cardinality(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items
            .iter()
            .map(value_cardinality)
            .fold(items.len() as u64, u64::max),
        Value::Object(map) => map
            .values()
            .map(value_cardinality)
            .fold(map.len() as u64, u64::max),
        _ => 1,
    }
}

fn children(schema: &Value) -> impl Iterator<Item = &Value> {
    let props = schema["properties"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.values());
    let items = schema.get("items").filter(|i| i.is_object());
    let more = schema.get("additionalProperties").filter(|a| a.is_object());
    props.chain(items).chain(more)
}

/// `schema` with the rules of every node below it removed, so that one node's rules are
/// evaluated alone (the walk here visits each node).
fn without_nested_rules(schema: &Value) -> Value {
    fn strip(v: &mut Value) {
        if let Some(o) = v.as_object_mut() {
            o.remove(KEY);
        }
        for_each_child(v, strip);
    }
    fn for_each_child(v: &mut Value, f: fn(&mut Value)) {
        if let Some(props) = v.get_mut("properties").and_then(Value::as_object_mut) {
            props.values_mut().for_each(f);
        }
        if let Some(items) = v.get_mut("items").filter(|i| i.is_object()) {
            f(items);
        }
        if let Some(more) = v.get_mut("additionalProperties").filter(|a| a.is_object()) {
            f(more);
        }
    }
    let mut out = schema.clone();
    for_each_child(&mut out, strip);
    out
}

/// One rule, compiled alone at its node.
#[derive(Debug)]
struct Rule {
    /// Upstream's `ruleErrorString`: the rule's message if it has one, else the rule.
    error_string: String,
    compiled: CompiledSchema,
    shape: Shape,
}

/// A schema node that has rules, or has nodes with rules below it.
#[derive(Debug, Default)]
struct Node {
    type_: String,
    rules: Vec<Rule>,
    properties: BTreeMap<String, Node>,
    items: Option<Box<Node>>,
    additional: Option<Box<Node>>,
    /// The `x-kubernetes-list-map-keys` of a `map` list, by which old items correlate.
    map_keys: Option<Vec<String>>,
}

impl Node {
    fn build(schema: &Value) -> Option<Node> {
        let mut node = Node {
            type_: schema["type"].as_str().unwrap_or("").to_owned(),
            ..Node::default()
        };
        let here = without_nested_rules(schema);
        for raw in schema[KEY].as_array().into_iter().flatten() {
            let Some(text) = raw["rule"].as_str() else {
                continue;
            };
            let Ok(program) = Program::compile(text) else {
                continue;
            };
            let mut alone = here.clone();
            alone[KEY] = json!([raw]);
            let message = raw["message"].as_str().map(str::trim).unwrap_or("");
            node.rules.push(Rule {
                error_string: if message.is_empty() {
                    text.trim().to_owned()
                } else {
                    message.to_owned()
                },
                compiled: compile_schema(&alone),
                shape: Shape::of(&program),
            });
        }
        if let Some(props) = schema["properties"].as_object() {
            for (k, child) in props {
                if let Some(n) = Node::build(child) {
                    node.properties.insert(k.clone(), n);
                }
            }
        }
        node.items = schema
            .get("items")
            .filter(|i| i.is_object())
            .and_then(Node::build)
            .map(Box::new);
        node.additional = schema
            .get("additionalProperties")
            .filter(|a| a.is_object())
            .and_then(Node::build)
            .map(Box::new);
        if schema["x-kubernetes-list-type"] == "map" {
            node.map_keys = schema["x-kubernetes-list-map-keys"].as_array().map(|keys| {
                keys.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            });
        }
        let empty = node.rules.is_empty()
            && node.properties.is_empty()
            && node.items.is_none()
            && node.additional.is_none();
        (!empty).then_some(node)
    }
}

/// The compiled validation rules of one schema, ready to run on every write.
#[derive(Debug)]
pub struct Rules {
    root: Node,
}

/// What one object's validation has spent and found.
struct Run {
    budget: u64,
    exhausted: bool,
    errors: Vec<FieldError>,
}

impl Rules {
    /// The rules of `schema`, or `None` if it has none (most schemas: nothing is run).
    pub fn build(schema: &Value) -> Option<Rules> {
        Node::build(schema).map(|root| Rules { root })
    }

    /// The errors of the rules for `new` (an update's `old` enables transition rules).
    pub fn validate(&self, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
        let mut run = Run {
            budget: RUNTIME_COST_BUDGET,
            exhausted: false,
            errors: Vec::new(),
        };
        walk(&self.root, new, old, "", &mut run);
        run.errors
    }
}

fn join(path: &str, key: &str) -> String {
    if key.is_empty() {
        path.to_owned()
    } else if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn walk(node: &Node, value: &Value, old: Option<&Value>, path: &str, run: &mut Run) {
    if run.exhausted || value.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    if !node.rules.is_empty() {
        let n = value_cardinality(value).max(old.map_or(1, value_cardinality));
        for rule in &node.rules {
            let cost = rule.shape.cost(n);
            if cost > PER_CALL_LIMIT {
                run.errors.push(FieldError::invalid(
                    at(path),
                    &json!(node.type_),
                    format!(
                        "'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                        rule.error_string
                    ),
                ));
                run.exhausted = true;
                return;
            }
            if cost > run.budget {
                run.errors.push(FieldError::invalid(
                    at(path),
                    &json!(node.type_),
                    "validation failed due to running out of cost budget, no further validation rules will be run",
                ));
                run.exhausted = true;
                return;
            }
            run.budget -= cost;
            if let Err(errors) = kube_cel::validate_compiled(&rule.compiled, value, old) {
                run.errors.extend(
                    errors
                        .iter()
                        .map(|e| field_error(e, rule, path, &node.type_)),
                );
            }
        }
    }
    if let Some(map) = value.as_object() {
        for (key, child) in &node.properties {
            if let Some(v) = map.get(key) {
                walk(
                    child,
                    v,
                    old.and_then(|o| o.get(key)),
                    &join(path, key),
                    run,
                );
            }
        }
        if let Some(more) = &node.additional {
            for (key, v) in map {
                walk(
                    more,
                    v,
                    old.and_then(|o| o.get(key)),
                    &format!("{path}[{key}]"),
                    run,
                );
            }
        }
    }
    if let (Some(items), Some(list)) = (&node.items, value.as_array()) {
        let old_list = old.and_then(Value::as_array);
        for (i, item) in list.iter().enumerate() {
            // Only a map list's items correlate, by their keys (never by position).
            let old_item = match (&node.map_keys, old_list) {
                (Some(keys), Some(olds)) => olds
                    .iter()
                    .find(|o| keys.iter().all(|k| o.get(k) == item.get(k))),
                _ => None,
            };
            walk(items, item, old_item, &format!("{path}[{i}]"), run);
        }
    }
}

/// The field of an error at `path`: upstream validates from a nil `field.Path`, which a
/// rule at the root reports as `<nil>`.
fn at(path: &str) -> String {
    if path.is_empty() {
        "<nil>".to_owned()
    } else {
        path.to_owned()
    }
}

/// A failed rule as upstream reports it (`validation.go validateExpressions` and
/// `fieldErrorForReason`), at the rule's node (`path`) or its `fieldPath` below it.
fn field_error(e: &ValidationError, rule: &Rule, path: &str, type_: &str) -> FieldError {
    let relative = e.field_path.trim_start_matches('.');
    let value = json!(type_);
    match e.kind {
        ErrorKind::ValidationFailure => {
            let field = at(&join(path, relative));
            match e.reason.as_deref() {
                Some("FieldValueForbidden") => FieldError::forbidden(field, &e.message),
                Some("FieldValueRequired") => FieldError::required(field, &e.message),
                Some("FieldValueDuplicate") => FieldError::duplicate(field, &value),
                _ => FieldError::invalid(field, &value, &e.message),
            }
        }
        // `no such key: x evaluating rule: ...`, as upstream words a runtime error.
        _ => {
            let cause =
                std::error::Error::source(e).map_or_else(|| e.message.clone(), |s| s.to_string());
            FieldError::invalid(
                at(path),
                &value,
                format!("{cause} evaluating rule: {}", rule.error_string),
            )
        }
    }
}

/// The problems of the rules in a definition's `schema` (at `path`), as upstream refuses
/// them when the definition is written (`validation.go validateOpenAPISchema`'s CEL part): a
/// rule that is empty or does not compile, a `messageExpression` that does not compile, a
/// transition rule where the old value cannot be correlated (under a list that is not a
/// `map` list), and a rule whose estimated cost is above [`PER_CALL_LIMIT`].
pub fn definition_errors(schema: &Value, path: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check(schema, path, None, &mut errors);
    errors
}

fn check(schema: &Value, path: &str, uncorrelatable: Option<&str>, errors: &mut Vec<FieldError>) {
    if !schema.is_object() {
        return;
    }
    let n = schema_cardinality(schema);
    for (i, raw) in schema[KEY].as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}.{KEY}[{i}]");
        let text = raw["rule"].as_str().unwrap_or("");
        if text.trim().is_empty() {
            errors.push(FieldError::required(
                format!("{at}.rule"),
                "rule is not specified",
            ));
            continue;
        }
        match Program::compile(text) {
            Err(e) => errors.push(FieldError::invalid(
                format!("{at}.rule"),
                raw,
                format!("compilation failed: {e}"),
            )),
            Ok(program) => {
                let cost = Shape::of(&program).cost(n);
                if cost > PER_CALL_LIMIT {
                    errors.push(FieldError::forbidden(
                        format!("{at}.rule"),
                        &cost_error("estimated rule cost", cost, PER_CALL_LIMIT),
                    ));
                }
                if let Some(within) = uncorrelatable
                    && program.references().has_variable("oldSelf")
                {
                    errors.push(FieldError::invalid(
                        format!("{at}.rule"),
                        &json!(text),
                        format!(
                            "oldSelf cannot be used on the uncorrelatable portion of the schema within {within}"
                        ),
                    ));
                }
            }
        }
        if let Some(expr) = raw["messageExpression"].as_str()
            && let Err(e) = Program::compile(expr)
        {
            errors.push(FieldError::invalid(
                format!("{at}.messageExpression"),
                raw,
                format!("messageExpression compilation failed: {e}"),
            ));
        }
    }
    if let Some(props) = schema["properties"].as_object() {
        for (k, child) in props {
            check(
                child,
                &format!("{path}.properties[{k}]"),
                uncorrelatable,
                errors,
            );
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        let items_path = format!("{path}.items");
        let within = if schema["x-kubernetes-list-type"] == "map" {
            uncorrelatable
        } else {
            Some(uncorrelatable.unwrap_or(path))
        };
        check(items, &items_path, within, errors);
    }
    if let Some(more) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        check(
            more,
            &format!("{path}.additionalProperties"),
            uncorrelatable,
            errors,
        );
    }
}

/// Upstream's `getCostErrorMessage`.
fn cost_error(name: &str, cost: u64, limit: u64) -> String {
    let factor = cost as f64 / limit as f64;
    let factor = if factor > 100.0 {
        "more than 100x".to_owned()
    } else if factor < 1.5 {
        format!("{factor:.6}x")
    } else {
        format!("{factor:.1}x")
    };
    format!(
        "{name} exceeds budget by factor of {factor} (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(schema: Value) -> Rules {
        assert!(definition_errors(&schema, "s").is_empty(), "{schema}");
        Rules::build(&schema).expect("the schema has rules")
    }

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(FieldError::full).collect()
    }

    fn spec_schema(spec: Value) -> Value {
        json!({"type": "object", "properties": {"spec": spec}})
    }

    /// `validation.go Validate`: `self` is the value at the rule's node; a failed rule is
    /// `Invalid value: "<type>": <message>` at the node's path.
    #[test]
    fn a_rule_sees_self_at_its_node_and_fails_with_its_message() {
        let r = rules(spec_schema(json!({
            "type": "object",
            "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
            "x-kubernetes-validations": [
                {"rule": "self.min <= self.max", "message": "min must not exceed max"},
            ],
        })));
        assert!(
            r.validate(&json!({"spec": {"min": 1, "max": 2}}), None)
                .is_empty()
        );
        assert_eq!(
            messages(&r.validate(&json!({"spec": {"min": 3, "max": 2}}), None)),
            ["spec: Invalid value: \"object\": min must not exceed max"]
        );
    }

    /// `ruleMessageOrDefault` and `messageExpression`: without a message the rule is
    /// quoted; a messageExpression is evaluated with `self`.
    #[test]
    fn the_message_is_the_expression_the_message_or_the_rule() {
        let r = rules(spec_schema(json!({
            "type": "object",
            "properties": {"n": {"type": "integer",
                "x-kubernetes-validations": [
                    {"rule": "self < 10"},
                    {"rule": "self % 2 == 0", "messageExpression": "'n is ' + string(self) + ', not even'"},
                ]}},
        })));
        assert_eq!(
            messages(&r.validate(&json!({"spec": {"n": 11}}), None)),
            [
                "spec.n: Invalid value: \"integer\": failed rule: self < 10",
                "spec.n: Invalid value: \"integer\": n is 11, not even",
            ]
        );
    }

    /// `fieldErrorForReason` and `fieldPath`: the error is at the rule's field path below
    /// its node, of the kind its reason names.
    #[test]
    fn reason_and_field_path_shape_the_error() {
        let r = rules(spec_schema(json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "x-kubernetes-validations": [
                {"rule": "has(self.a) || has(self.b)", "message": "a or b is required",
                 "reason": "FieldValueRequired", "fieldPath": ".a"},
                {"rule": "!has(self.b) || self.b != 'x'", "message": "b may not be x",
                 "reason": "FieldValueForbidden", "fieldPath": ".b"},
            ],
        })));
        assert_eq!(
            messages(&r.validate(&json!({"spec": {}}), None)),
            ["spec.a: Required value: a or b is required"]
        );
        let errors = r.validate(&json!({"spec": {"b": "x"}}), None);
        assert_eq!(messages(&errors), ["spec.b: Forbidden: b may not be x"]);
        assert_eq!(errors[0].reason, "FieldValueForbidden");
    }

    /// Transition rules (`oldSelf`): skipped on create, run on update against the
    /// correlated old value.
    #[test]
    fn a_transition_rule_runs_on_update_only() {
        let r = rules(spec_schema(json!({
            "type": "object",
            "properties": {"zone": {"type": "string",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "zone is immutable"}]}},
        })));
        let a = json!({"spec": {"zone": "a"}});
        let b = json!({"spec": {"zone": "b"}});
        assert!(r.validate(&a, None).is_empty(), "skipped on create");
        assert!(r.validate(&a, Some(&a)).is_empty());
        assert_eq!(
            messages(&r.validate(&b, Some(&a))),
            ["spec.zone: Invalid value: \"string\": zone is immutable"]
        );
        // A field added on update has no old value: the rule is not run.
        assert!(
            r.validate(&a, Some(&json!({"spec": {}}))).is_empty(),
            "no old value, no transition rule"
        );
    }

    /// `optionalOldSelf`: the transition rule runs on create too, with `oldSelf` null.
    #[test]
    fn optional_old_self_runs_on_create_with_a_null_old_self() {
        let r = rules(spec_schema(json!({
            "type": "object",
            "properties": {"zone": {"type": "string",
                "x-kubernetes-validations": [{"rule": "oldSelf == null || self == oldSelf",
                    "optionalOldSelf": true, "message": "zone is immutable"}]}},
        })));
        assert!(r.validate(&json!({"spec": {"zone": "a"}}), None).is_empty());
        assert_eq!(
            r.validate(
                &json!({"spec": {"zone": "b"}}),
                Some(&json!({"spec": {"zone": "a"}}))
            )
            .len(),
            1
        );
    }

    /// Correlation (`common/equality.go CorrelatedObject`): items of a `map` list are matched
    /// by their keys, so reordering them is no change; items of an atomic list never are.
    #[test]
    fn old_items_correlate_by_map_keys_not_by_position() {
        let item = json!({"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "port": {"type": "integer",
                "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "port is immutable"}]}}});
        let mut list = json!({"type": "array", "items": item,
            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]});
        let r = rules(spec_schema(
            json!({"type": "object", "properties": {"ports": list.clone()}}),
        ));
        let old = json!({"spec": {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}]}});
        let reordered =
            json!({"spec": {"ports": [{"name": "b", "port": 2}, {"name": "a", "port": 1}]}});
        assert!(r.validate(&reordered, Some(&old)).is_empty());
        let changed =
            json!({"spec": {"ports": [{"name": "b", "port": 2}, {"name": "a", "port": 5}]}});
        assert_eq!(
            messages(&r.validate(&changed, Some(&old))),
            ["spec.ports[1].port: Invalid value: \"integer\": port is immutable"]
        );
        // Under an atomic list, a transition rule is refused when the definition is written.
        list.as_object_mut()
            .unwrap()
            .remove("x-kubernetes-list-type");
        let errors = definition_errors(
            &spec_schema(json!({"type": "object", "properties": {"ports": list}})),
            "s",
        );
        assert_eq!(
            messages(&errors),
            [
                "s.properties[spec].properties[ports].items.properties[port].x-kubernetes-validations[0].rule: Invalid value: \"self == oldSelf\": oldSelf cannot be used on the uncorrelatable portion of the schema within s.properties[spec].properties[ports]"
            ]
        );
    }

    /// `validation.go validateOpenAPISchema`: a rule or messageExpression that does not
    /// compile, or an empty rule, refuses the definition with cel's `ERROR: <input>:l:c:`.
    #[test]
    fn rules_that_do_not_compile_refuse_the_definition() {
        let schema = spec_schema(json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "self.a >"},
            {"rule": "true", "messageExpression": "'a' +"},
            {"rule": ""},
        ]}));
        let errors = definition_errors(&schema, "spec.versions[0].schema.openAPIV3Schema");
        let at =
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations";
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert_eq!(errors[0].field, format!("{at}[0].rule"));
        assert!(
            errors[0]
                .message
                .contains(": compilation failed: ERROR: <input>:1:"),
            "{}",
            errors[0].message
        );
        assert_eq!(errors[1].field, format!("{at}[1].messageExpression"));
        assert!(
            errors[1]
                .message
                .contains("messageExpression compilation failed: ERROR: <input>:1:")
        );
        assert_eq!(
            errors[2].full(),
            format!("{at}[2].rule: Required value: rule is not specified")
        );
    }

    /// The estimated cost (`getExpressionCost` against `PerCallLimit`): iterating an
    /// unbounded list is refused with upstream's advice; the same rule under `maxItems`
    /// is accepted.
    #[test]
    fn a_rule_too_costly_for_its_schema_is_refused_until_bounded() {
        let mut list = json!({"type": "array", "items": {"type": "string"},
            "x-kubernetes-validations": [{"rule": "self.all(x, self.exists(y, y == x))"}]});
        let errors = definition_errors(&list, "s");
        assert_eq!(
            messages(&errors),
            [
                "s.x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"
            ]
        );
        list["maxItems"] = json!(100);
        assert!(definition_errors(&list, "s").is_empty());
    }

    /// `RuntimeCELCostBudget`: once one object's rules have spent the budget the rest are
    /// not run, with upstream's message. (The rule short-circuits, so the cost is the
    /// estimate's upper bound and the test runs fast.)
    #[test]
    fn an_object_whose_rules_spend_the_budget_stops_being_validated() {
        let r = rules(spec_schema(
            json!({"type": "object", "properties": {"groups": {
                "type": "array", "maxItems": 200,
                "items": {"type": "object", "properties": {"members": {
                    "type": "array", "maxItems": 100, "items": {"type": "integer"}}},
                    "x-kubernetes-validations": [{"rule":
                        "true || self.members.all(x, self.members.all(y, x == y))"}]},
            }}}),
        ));
        let members: Vec<u64> = (0..100).collect();
        let few = json!({"spec": {"groups": vec![json!({"members": members}); 5]}});
        assert!(r.validate(&few, None).is_empty());
        let many = json!({"spec": {"groups": vec![json!({"members": members}); 200]}});
        let errors = r.validate(&many, None);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].field.starts_with("spec.groups["));
        assert!(
            errors[0].message.ends_with(
                "validation failed due to running out of cost budget, no further validation rules will be run"
            ),
            "{}",
            errors[0].message
        );
    }

    /// The Kubernetes CEL libraries are there (`k8s.io/apiserver/pkg/cel/library`):
    /// quantities, named formats, URL and IP helpers.
    #[test]
    fn the_kubernetes_cel_libraries_are_available() {
        let r = rules(spec_schema(json!({"type": "object", "properties": {
            "memory": {"type": "string", "x-kubernetes-validations": [
                {"rule": "quantity(self).isLessThan(quantity('1Gi'))", "message": "at most 1Gi"}]},
            "host": {"type": "string", "x-kubernetes-validations": [
                {"rule": "!format.dns1123Label().validate(self).hasValue()", "message": "not a label"}]},
        }})));
        assert!(
            r.validate(&json!({"spec": {"memory": "512Mi", "host": "web-1"}}), None)
                .is_empty()
        );
        assert_eq!(
            messages(&r.validate(&json!({"spec": {"memory": "2Gi", "host": "Web_1"}}), None)),
            [
                "spec.host: Invalid value: \"string\": not a label",
                "spec.memory: Invalid value: \"string\": at most 1Gi",
            ]
        );
    }

    /// `validateExpressions`: a rule that fails to evaluate is an error naming the rule; a
    /// rule at the root reports upstream's nil path.
    #[test]
    fn an_evaluation_error_and_a_root_rule_are_reported_as_upstream() {
        let r = rules(json!({"type": "object",
            "x-kubernetes-validations": [{"rule": "has(self.spec)", "message": "spec is required"}],
            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "x-kubernetes-validations": [{"rule": "self.count > 0"}]}}}));
        assert_eq!(
            messages(&r.validate(&json!({}), None)),
            ["<nil>: Invalid value: \"object\": spec is required"]
        );
        let errors = r.validate(&json!({"spec": {}}), None);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].message.starts_with("Invalid value: \"object\": ")
                && errors[0]
                    .message
                    .ends_with(" evaluating rule: self.count > 0"),
            "{}",
            errors[0].message
        );
        assert_eq!(errors[0].field, "spec");
    }

    /// A schema without rules builds nothing: no cost on writes.
    #[test]
    fn a_schema_without_rules_has_nothing_to_run() {
        assert!(Rules::build(&spec_schema(json!({"type": "object"}))).is_none());
    }
}
