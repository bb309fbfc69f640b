//! Validation rules (`x-kubernetes-validations`, CEL) of a structural schema, after
//! upstream's `staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go`
//! (evaluation) and `pkg/apis/apiextensions/validation/validation.go` (the checks when a
//! definition is written).
//!
//! The CEL language is the `cel` crate's, and the Kubernetes CEL libraries (strings, lists,
//! sets, regex, URLs, IP/CIDR, quantities, semver, named formats, ...) kube-rs' `kube-cel`;
//! this module compiles, meters and runs the rules as upstream does:
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
//! - compiling (`compile`): cel-go's limits (100,000 code points, recursion depth 250) are
//!   applied before parsing, and the parse runs on a stack sized for them, so no rule can
//!   overflow the stack, at startup or on a write; what the interpreter cannot evaluate
//!   (message construction `Foo{...}`) is refused;
//! - cost: when a definition is written, each rule's cost is estimated from the schema's
//!   bounds (`estimate`: `maxLength`, `maxItems`, `maxProperties`) and a rule whose
//!   estimate times the times it can run per object (the `maxItems`/`maxProperties` above
//!   it) exceeds [`STATIC_ESTIMATED_COST_LIMIT`] is refused (`estimated rule cost exceeds
//!   budget by factor of ...`), as is a schema whose rules together exceed
//!   [`STATIC_ESTIMATED_CRD_COST_LIMIT`], except rules an update keeps; on every write, each rule runs metered (`meter`): past [`PER_CALL_LIMIT`] it stops
//!   with `operation cancelled: actual cost limit exceeded`, and once the rules of one
//!   object have spent [`RUNTIME_COST_BUDGET`] the rest are not run (`validation failed due
//!   to running out of cost budget, no further validation rules will be run`); an
//!   [`Interrupt`] stops it too (`operation interrupted`), as a request's context does
//!   upstream.
//!
//! Not as upstream: rules are parsed but not type-checked, so a rule naming a field the
//! schema lacks or returning a non-boolean is refused when it runs, not when the definition
//! is written; the macros `cel` lacks (`sortBy`, `cel.bind`, two-variable comprehensions)
//! fail when they run; `optionalOldSelf` binds `oldSelf` to null, not to an optional.

mod compile;
mod estimate;
mod meter;
mod values;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube_cel::cel::ExecutionError;
use kube_cel::cel::Value as Cel;
use kube_cel::cel::common::ast::{Expr, IdedExpr};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::registry::FieldError;
use meter::{Outcome, Program, Trip};
use values::Conv;

/// Upstream's `celconfig.PerCallLimit`: the most one rule may cost when it runs.
pub const PER_CALL_LIMIT: u64 = 1_000_000;

/// Upstream's `celconfig.RuntimeCELCostBudget`: the most all rules of one object may cost.
pub const RUNTIME_COST_BUDGET: u64 = 10_000_000;

/// The size an unbounded list or map is estimated at: upstream derives it from the largest
/// request (3 MiB) over the smallest element; this is 1 Mi elements.
pub const UNBOUNDED_CARDINALITY: u64 = 1 << 20;

/// upstream's `celconfig.MaxEvaluatedMessageExpressionSizeBytes`.
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

const KEY: &str = "x-kubernetes-validations";

/// Stops running rules: the request was cancelled, or its deadline passed (upstream's
/// `ContextEval` with the request's context). Cheap to clone; the clones share the
/// cancellation.
#[derive(Debug, Clone, Default)]
pub struct Interrupt {
    cancelled: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Interrupt {
    /// An interrupt that only [`cancel`](Interrupt::cancel) triggers.
    pub fn new() -> Interrupt {
        Interrupt::default()
    }

    /// An interrupt that also triggers at `deadline`.
    pub fn until(deadline: Instant) -> Interrupt {
        Interrupt {
            deadline: Some(deadline),
            ..Interrupt::default()
        }
    }

    /// Stops the evaluations using this interrupt (or a clone of it), at their next check.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether it was cancelled or its deadline has passed.
    pub fn is_interrupted(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// One rule, compiled alone at its node.
#[derive(Debug)]
struct Rule {
    /// Upstream's `ruleErrorString`: the rule's message if it has one, else the rule.
    error_string: String,
    /// The rule's text, trimmed.
    text: String,
    /// The rule, or what prevented compiling it (cel's `ERROR: ...`).
    program: Result<Program, String>,
    /// The `messageExpression` and its text, when it compiles.
    message_expression: Option<(Program, String)>,
    /// `message`, trimmed (upstream's `ruleMessageOrDefault`).
    message: String,
    reason: Option<String>,
    field_path: Option<String>,
    /// The rule uses `oldSelf`.
    transition: bool,
    optional_old_self: bool,
}

/// A schema node that has rules, or has nodes with rules below it.
#[derive(Debug, Default)]
struct Node {
    type_: String,
    rules: Vec<Rule>,
    /// How values at this node convert to CEL (for nodes with rules).
    conv: Option<Conv>,
    /// The stack its rules' evaluation needs.
    stack: usize,
    properties: BTreeMap<String, Node>,
    items: Option<Box<Node>>,
    additional: Option<Box<Node>>,
    /// The `x-kubernetes-list-map-keys` of a `map` list, by which old items correlate.
    map_keys: Option<Vec<String>>,
}

/// A rule (or message expression) whose compilation failed when the rules were built.
#[derive(Debug)]
struct Broken {
    /// Below the schema's root: `.properties[spec].x-kubernetes-validations[0].rule`.
    field: String,
    /// The rule as written.
    raw: Value,
    /// `compilation failed: ...`.
    detail: String,
}

/// Whether `e` reads `oldSelf` (upstream's `UsesOldSelf`).
fn uses_old_self(e: &IdedExpr) -> bool {
    compile::find_in(e, |e| {
        matches!(&e.expr, Expr::Ident(name) if name == "oldSelf").then_some(())
    })
    .is_some()
}

fn trimmed(raw: &Value, key: &str) -> String {
    raw[key].as_str().map(str::trim).unwrap_or("").to_owned()
}

impl Node {
    fn build(schema: &Value, at: &str, broken: &mut Vec<Broken>) -> Option<Node> {
        let mut node = Node {
            type_: schema["type"].as_str().unwrap_or("").to_owned(),
            ..Node::default()
        };
        for (i, raw) in schema[KEY].as_array().into_iter().flatten().enumerate() {
            let Some(text) = raw["rule"].as_str().filter(|t| !t.trim().is_empty()) else {
                continue;
            };
            let rule_at = format!("{at}.{KEY}[{i}]");
            let compiled = compile::parse(text, |e| (Program::new(e), uses_old_self(e)));
            let (program, transition) = match compiled {
                Ok((program, transition)) => (Ok(program), transition),
                Err(e) => {
                    broken.push(Broken {
                        field: format!("{rule_at}.rule"),
                        raw: raw.clone(),
                        detail: format!("compilation failed: {e}"),
                    });
                    (Err(e), false)
                }
            };
            let message_expression = raw["messageExpression"].as_str().and_then(|m| {
                match compile::parse(m, Program::new) {
                    Ok(program) => Some((program, m.to_owned())),
                    Err(e) => {
                        broken.push(Broken {
                            field: format!("{rule_at}.messageExpression"),
                            raw: raw.clone(),
                            detail: format!("messageExpression compilation failed: {e}"),
                        });
                        None
                    }
                }
            });
            let message = trimmed(raw, "message");
            let rule = Rule {
                error_string: if message.is_empty() {
                    text.trim().to_owned()
                } else {
                    message.clone()
                },
                text: text.trim().to_owned(),
                program,
                message_expression,
                message,
                reason: raw["reason"].as_str().map(str::to_owned),
                field_path: raw["fieldPath"].as_str().map(str::to_owned),
                transition,
                optional_old_self: raw["optionalOldSelf"] == true,
            };
            let stacks = rule
                .program
                .iter()
                .chain(rule.message_expression.iter().map(|(p, _)| p))
                .map(Program::stack);
            node.stack = stacks.fold(node.stack, usize::max);
            node.rules.push(rule);
        }
        if !node.rules.is_empty() {
            node.conv = Some(Conv::of(schema));
        }
        if let Some(props) = schema["properties"].as_object() {
            for (k, child) in props {
                if let Some(n) = Node::build(child, &format!("{at}.properties[{k}]"), broken) {
                    node.properties.insert(k.clone(), n);
                }
            }
        }
        node.items = schema
            .get("items")
            .filter(|i| i.is_object())
            .and_then(|i| Node::build(i, &format!("{at}.items"), broken))
            .map(Box::new);
        node.additional = schema
            .get("additionalProperties")
            .filter(|a| a.is_object())
            .and_then(|a| Node::build(a, &format!("{at}.additionalProperties"), broken))
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
    broken: Vec<Broken>,
}

/// What one object's validation has spent and found.
struct Run<'a> {
    budget: u64,
    /// No further rule runs: the budget or a call's limit was exceeded, or the evaluation
    /// was interrupted.
    stopped: bool,
    errors: Vec<FieldError>,
    interrupt: &'a Interrupt,
}

impl Rules {
    /// The rules of `schema`, or `None` if it has none (most schemas: nothing is run).
    ///
    /// Safe on any schema, also one stored before these checks existed: no rule can
    /// overflow the stack while it compiles. A rule that does not compile is kept and
    /// fails every object it would validate, as upstream does (`rule compile error: ...`);
    /// [`Rules::compile_errors`] lists them, so that the caller may rather not serve the
    /// definition.
    pub fn build(schema: &Value) -> Option<Rules> {
        let mut broken = Vec::new();
        Node::build(schema, "", &mut broken).map(|root| Rules { root, broken })
    }

    /// The rules (and message expressions) that did not compile, as the errors
    /// [`definition_errors`] gives for them, below `path` (the schema's path, e.g.
    /// `spec.versions[0].schema.openAPIV3Schema`). Empty for a definition accepted by
    /// [`definition_errors`] under the current limits.
    pub fn compile_errors(&self, path: &str) -> Vec<FieldError> {
        self.broken
            .iter()
            .map(|b| FieldError::invalid(format!("{path}{}", b.field), &b.raw, &b.detail))
            .collect()
    }

    /// The errors of the rules for `new` (an update's `old` enables transition rules),
    /// never interrupted: [`Rules::validate_with`] without a deadline.
    pub fn validate(&self, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
        self.validate_with(new, old, &Interrupt::default())
    }

    /// The errors of the rules for `new` (an update's `old` enables transition rules);
    /// `interrupt` stops the evaluation early (`operation interrupted evaluating rule: ...`,
    /// and no further rule runs). CPU-bound: run it where blocking is allowed.
    pub fn validate_with(
        &self,
        new: &Value,
        old: Option<&Value>,
        interrupt: &Interrupt,
    ) -> Vec<FieldError> {
        let mut run = Run {
            budget: RUNTIME_COST_BUDGET,
            stopped: false,
            errors: Vec::new(),
            interrupt,
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

fn walk(node: &Node, value: &Value, old: Option<&Value>, path: &str, run: &mut Run<'_>) {
    if run.stopped || value.is_null() {
        return;
    }
    let old = old.filter(|o| !o.is_null());
    if !node.rules.is_empty() {
        let conv = node.conv.as_ref();
        let this = values::to_cel(value, conv);
        let old_cel = old.map(|o| values::to_cel(o, conv));
        let has_old = old_cel.is_some();
        meter::with_scopes(this, old_cel, node.stack, |scopes| {
            for rule in &node.rules {
                if run.stopped {
                    break;
                }
                run_rule(rule, scopes, has_old, path, &node.type_, run);
            }
        });
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

/// Runs one rule at a node (`validation.go validateExpressions`' loop body).
fn run_rule(
    rule: &Rule,
    scopes: &meter::Scopes<'_>,
    has_old: bool,
    path: &str,
    type_: &str,
    run: &mut Run<'_>,
) {
    let value = json!(type_);
    let program = match &rule.program {
        Ok(program) => program,
        Err(e) => {
            run.errors.push(FieldError::invalid(
                at(path),
                &value,
                format!("rule compile error: compilation failed: {e}"),
            ));
            return;
        }
    };
    if rule.transition && !has_old && !rule.optional_old_self {
        return;
    }
    let scope = if !has_old && rule.optional_old_self {
        scopes.null_old
    } else {
        scopes.node
    };
    let limit = PER_CALL_LIMIT.min(run.budget);
    let (outcome, spent) = meter::run(program, scope, limit, run.interrupt);
    run.budget = run.budget.saturating_sub(spent);
    let error = |detail: String| FieldError::invalid(at(path), &value, detail);
    match outcome {
        Outcome::Tripped(Trip::CostLimit) if limit < PER_CALL_LIMIT => {
            run.errors.push(error(
                "validation failed due to running out of cost budget, no further validation rules will be run".to_owned(),
            ));
            run.stopped = true;
        }
        Outcome::Tripped(Trip::CostLimit) => {
            run.errors.push(error(format!(
                "'{}': no further validation rules will be run due to call cost exceeds limit for rule: {}",
                meter::COST_LIMIT,
                rule.error_string
            )));
            run.stopped = true;
        }
        Outcome::Tripped(Trip::Interrupted) => {
            run.errors.push(error(format!(
                "{} evaluating rule: {}",
                meter::INTERRUPTED,
                rule.error_string
            )));
            run.stopped = true;
        }
        Outcome::Panicked => run.errors.push(error(format!(
            "internal error evaluating rule: {}",
            rule.error_string
        ))),
        // `no such key: x evaluating rule: ...`, as upstream words a runtime error.
        Outcome::Error(e) => run.errors.push(error(format!(
            "{} evaluating rule: {}",
            cause(&e),
            rule.error_string
        ))),
        Outcome::Value(Cel::Bool(true)) => {}
        Outcome::Value(Cel::Bool(false)) => failed(rule, scope, path, &value, run),
        Outcome::Value(_) => run.errors.push(error(format!(
            "rule \"{}\" did not evaluate to bool evaluating rule: {}",
            rule.text, rule.error_string
        ))),
    }
}

/// An evaluation error as it reads in a field error.
fn cause(e: &ExecutionError) -> String {
    e.to_string()
}

/// A rule evaluated to false: its error, with the message of its `messageExpression`
/// (metered from what is left of the budget), `message` or `failed rule: <rule>`
/// (`validation.go`'s `evalMessageExpression` and `fieldErrorForReason`).
fn failed(
    rule: &Rule,
    scope: &kube_cel::cel::Context<'_>,
    path: &str,
    value: &Value,
    run: &mut Run<'_>,
) {
    let field = at(&join(
        path,
        rule.field_path
            .as_deref()
            .unwrap_or("")
            .trim_start_matches('.'),
    ));
    let mut detail = None;
    if let Some((program, source)) = &rule.message_expression {
        let limit = PER_CALL_LIMIT.min(run.budget);
        let (outcome, spent) = meter::run(program, scope, limit, run.interrupt);
        run.budget = run.budget.saturating_sub(spent);
        match outcome {
            Outcome::Tripped(Trip::CostLimit) => {
                let message = if limit < PER_CALL_LIMIT {
                    "messageExpression evaluation failed due to running out of cost budget, no further validation rules will be run".to_owned()
                } else {
                    format!(
                        "no further validation rules will be run due to call cost exceeds limit for messageExpression: {source:?}"
                    )
                };
                run.errors.push(FieldError::invalid(field, value, message));
                run.stopped = true;
                return;
            }
            Outcome::Tripped(Trip::Interrupted) => {
                run.errors.push(FieldError::invalid(
                    at(path),
                    value,
                    format!(
                        "{} evaluating rule: {}",
                        meter::INTERRUPTED,
                        rule.error_string
                    ),
                ));
                run.stopped = true;
                return;
            }
            Outcome::Value(Cel::String(s)) => {
                let s = s.trim();
                if !s.is_empty() && s.len() <= MAX_MESSAGE_BYTES && !s.contains('\n') {
                    detail = Some(s.to_owned());
                }
            }
            // Upstream logs the failure and falls back to the message.
            _ => {}
        }
    }
    let detail = detail.unwrap_or_else(|| {
        if rule.message.is_empty() {
            format!("failed rule: {}", rule.text)
        } else {
            rule.message.clone()
        }
    });
    run.errors.push(match rule.reason.as_deref() {
        Some("FieldValueForbidden") => FieldError::forbidden(field, &detail),
        Some("FieldValueRequired") => FieldError::required(field, &detail),
        Some("FieldValueDuplicate") => FieldError::duplicate(field, value),
        _ => FieldError::invalid(field, value, &detail),
    });
}

/// Upstream's `StaticEstimatedCostLimit`: the most one rule may cost when the definition is
/// written, its estimated cost times how many times it can run (the product of the
/// `maxItems`/`maxProperties` above it).
pub const STATIC_ESTIMATED_COST_LIMIT: u64 = 10_000_000;

/// Upstream's `StaticEstimatedCRDCostLimit`: the most all rules of one schema may cost,
/// each counted as for [`STATIC_ESTIMATED_COST_LIMIT`].
pub const STATIC_ESTIMATED_CRD_COST_LIMIT: u64 = 100_000_000;

/// The problems of the rules in a definition's `schema` (at `path`), as upstream refuses
/// them when the definition is written (`validation.go validateOpenAPISchema`'s CEL part):
/// - a rule that is empty or does not compile, a `messageExpression` that does not compile;
/// - a transition rule where the old value cannot be correlated (under a list that is not a
///   `map` list);
/// - a rule whose estimated cost times the most times it can run is above
///   [`STATIC_ESTIMATED_COST_LIMIT`], a `messageExpression` whose estimate is, and a schema
///   whose rules together are above [`STATIC_ESTIMATED_CRD_COST_LIMIT`].
pub fn definition_errors(schema: &Value, path: &str) -> Vec<FieldError> {
    definition_errors_with(schema, path, false)
}

/// [`definition_errors`]; with `unchanged` (an update that leaves this version's schema as it
/// was, upstream's `suppressPerExpressionCost`), no rule is refused for its own estimate,
/// while the schema's total still counts.
pub fn definition_errors_with(schema: &Value, path: &str, unchanged: bool) -> Vec<FieldError> {
    let mut check = Check {
        unchanged,
        total: 0,
        costs: Vec::new(),
        errors: Vec::new(),
    };
    check.node(schema, path, None, Some(1));
    if check.total > STATIC_ESTIMATED_CRD_COST_LIMIT {
        // Upstream's `TotalCost.MostExpensive`: the four costliest rules are named, of those
        // that take at least 1 % of the limit.
        check
            .costs
            .sort_by_key(|(_, cost)| std::cmp::Reverse(*cost));
        for (at, _) in check
            .costs
            .iter()
            .filter(|(_, cost)| *cost >= STATIC_ESTIMATED_CRD_COST_LIMIT / 100)
            .take(MOST_EXPENSIVE)
        {
            check.errors.push(FieldError::forbidden(
                at.clone(),
                "contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            ));
        }
        check.errors.push(FieldError::forbidden(
            path,
            &cost_error(
                "x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema",
                check.total,
                STATIC_ESTIMATED_CRD_COST_LIMIT,
            ),
        ));
    }
    check.errors
}

/// The smallest a value of this schema node serializes to (upstream's `MinSerializedSize`
/// of its declared type): what bounds how many of it a request can hold.
fn min_serialized_size(schema: &Value) -> u64 {
    match schema["type"].as_str() {
        Some("string" | "object" | "array") => 2,
        Some("boolean") => 4,
        _ => 1,
    }
}

/// Upstream's `maxCardinality`: how many values of `schema` the largest request holds, one
/// comma between each.
fn unbounded_cardinality(schema: &Value) -> u64 {
    (3 * 1024 * 1024) / (min_serialized_size(schema) + 1)
}

/// How many of the costliest rules an over-budget schema names (upstream's
/// `TotalCost.MostExpensive` keeps four).
const MOST_EXPENSIVE: usize = 4;

/// One definition schema's rule check (see [`definition_errors`]).
struct Check {
    /// Upstream's `suppressPerExpressionCost`.
    unchanged: bool,
    total: u64,
    /// Each rule's field and its cost times how many times it can run.
    costs: Vec<(String, u64)>,
    errors: Vec<FieldError>,
}

impl Check {
    /// Checks the rules at `schema` and below; `cardinality` is how many times a rule here
    /// can run (`None`: an unbounded list or map above it).
    fn node(
        &mut self,
        schema: &Value,
        path: &str,
        uncorrelatable: Option<&str>,
        cardinality: Option<u64>,
    ) {
        if !schema.is_object() {
            return;
        }
        let runs = cardinality.unwrap_or_else(|| unbounded_cardinality(schema));
        for (i, raw) in schema[KEY].as_array().into_iter().flatten().enumerate() {
            let at = format!("{path}.{KEY}[{i}]");
            let text = raw["rule"].as_str().unwrap_or("");
            if text.trim().is_empty() {
                self.errors.push(FieldError::required(
                    format!("{at}.rule"),
                    "rule is not specified",
                ));
                continue;
            }
            match compile::parse(text, |e| (estimate::cost(e, schema), uses_old_self(e))) {
                Err(e) => self.errors.push(FieldError::invalid(
                    format!("{at}.rule"),
                    raw,
                    format!("compilation failed: {e}"),
                )),
                Ok((cost, transition)) => {
                    let expression_cost = cost.saturating_mul(runs);
                    self.total = self.total.saturating_add(expression_cost);
                    self.costs.push((format!("{at}.rule"), expression_cost));
                    if expression_cost > STATIC_ESTIMATED_COST_LIMIT && !self.unchanged {
                        self.errors.push(FieldError::forbidden(
                            format!("{at}.rule"),
                            &cost_error(
                                "estimated rule cost",
                                expression_cost,
                                STATIC_ESTIMATED_COST_LIMIT,
                            ),
                        ));
                    }
                    if let Some(within) = uncorrelatable
                        && transition
                    {
                        self.errors.push(FieldError::invalid(
                            format!("{at}.rule"),
                            &json!(text),
                            format!(
                                "oldSelf cannot be used on the uncorrelatable portion of the schema within {within}"
                            ),
                        ));
                    }
                }
            }
            if let Some(expr) = raw["messageExpression"].as_str() {
                match compile::parse(expr, |e| estimate::cost(e, schema)) {
                    Err(e) => self.errors.push(FieldError::invalid(
                        format!("{at}.messageExpression"),
                        raw,
                        format!("messageExpression compilation failed: {e}"),
                    )),
                    Ok(cost) if cost > STATIC_ESTIMATED_COST_LIMIT && !self.unchanged => {
                        self.errors.push(FieldError::forbidden(
                            format!("{at}.messageExpression"),
                            &cost_error(
                                "estimated messageExpression cost",
                                cost,
                                STATIC_ESTIMATED_COST_LIMIT,
                            ),
                        ));
                    }
                    Ok(_) => {}
                }
            }
        }
        if let Some(props) = schema["properties"].as_object() {
            for (k, child) in props {
                self.node(
                    child,
                    &format!("{path}.properties[{k}]"),
                    uncorrelatable,
                    cardinality,
                );
            }
        }
        let times = |limit: &Value| match (cardinality, limit.as_u64()) {
            (Some(c), Some(n)) => Some(c.saturating_mul(n)),
            _ => None,
        };
        if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
            let items_path = format!("{path}.items");
            let within = if schema["x-kubernetes-list-type"] == "map" {
                uncorrelatable
            } else {
                Some(uncorrelatable.unwrap_or(path))
            };
            self.node(items, &items_path, within, times(&schema["maxItems"]));
        }
        if let Some(more) = schema.get("additionalProperties").filter(|a| a.is_object()) {
            self.node(
                more,
                &format!("{path}.additionalProperties"),
                uncorrelatable,
                times(&schema["maxProperties"]),
            );
        }
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
