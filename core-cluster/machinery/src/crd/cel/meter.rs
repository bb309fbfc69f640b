//! Metered evaluation: what cel-go's `CostTracker` and `ContextEval` do, over the `cel`
//! crate's interpreter, which has neither.
//!
//! Each compiled rule is rewritten once ([`Program::new`]) so that its work goes through
//! functions registered here, which charge a per-evaluation meter (a thread-local, set for
//! the evaluation of one expression) and stop the evaluation with cel-go's errors: `operation
//! cancelled: actual cost limit exceeded` past the limit, `operation interrupted` when the
//! [`Interrupt`] is cancelled or its deadline has passed.
//!
//! The units are cel-go's (about one per operation; strings 0.1 per byte), charged for what
//! *this* interpreter does, which copies values where cel-go shares them: evaluating a
//! variable or a field as a function's argument or a list's item converts the whole value.
//! So a value is charged by its deep size ([`weight`]) wherever the interpreter copies it:
//!
//! - every call but the lazy ones (`&&`, `||`, `?:`, `!`, `@not_strictly_false`) becomes
//!   `@ccm.call(<the call on fresh identifiers>, <target>, <args>...)`: the target and
//!   arguments are evaluated here and charged by weight, then the function's own cost is
//!   charged ([`extra`]: cel-go's and the Kubernetes library's `CallCost`, and the
//!   worst-case output of the functions that can amplify, such as `replace`, `split` and
//!   `lists.range`, *before* they run), the original call is evaluated in a scope binding
//!   the values, and its result is charged by weight;
//! - a field selection that is not directly a call's argument, and a variable or a field
//!   that is a list or map item or a comprehension's range, becomes `@ccm.val(...)`,
//!   charged by the weight of its value;
//! - every comprehension step becomes `@ccm.step(...)`: one unit, and the interrupt check;
//! - `map` and `filter` become `@ccm.map(...)`, evaluated here in linear time (the
//!   interpreter copies the growing result list at every step).
//!
//! Counting a weight stops at the meter's remaining budget, so counting never costs more
//! than it charges. What the interpreter does between two charges is bounded by the sizes
//! charged around it, so the CPU a rule can spend is proportional to its limit.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube_cel::KubeCelExt;
use kube_cel::cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedEntryExpr, IdedExpr, ListExpr, LiteralValue,
    MapEntryExpr, MapExpr, SelectExpr,
};
use kube_cel::cel::objects::Key;
use kube_cel::cel::{Context, ExecutionError, FunctionContext, ResolveResult, Value};
use tokio::time::Instant;

use super::Interrupt;

/// cel-go's error when the meter passes its limit.
pub(super) const COST_LIMIT: &str = "operation cancelled: actual cost limit exceeded";
/// cel-go's error when the evaluation's context ends.
pub(super) const INTERRUPTED: &str = "operation interrupted";

const CALL: &str = "@ccm.call";
const VAL: &str = "@ccm.val";
const STEP: &str = "@ccm.step";
const MAP: &str = "@ccm.map";
const TARGET: &str = "@t";
const ARGS: [&str; 8] = ["@a0", "@a1", "@a2", "@a3", "@a4", "@a5", "@a6", "@a7"];

/// The stack an evaluation needs per level of the rewritten tree. Measured in a debug
/// build (the worst; `the_stack_estimate_covers_the_deepest_rules`): 36-39 KiB per level
/// for the deepest rules the limits accept (249 chained `==`, selections, method calls,
/// indexes; 248 nested lists, calls, conditionals; 120 nested `all`), the interpreter's
/// `resolve_val` frame being large without optimisation; a release build needs a tenth.
const STACK_PER_LEVEL: usize = 48 << 10;
/// The stack any evaluation needs besides its levels.
const STACK_BASE: usize = 256 << 10;
/// The smallest stack segment worth allocating when the caller's stack is short.
const MIN_SEGMENT: usize = 4 << 20;

/// Why a metered evaluation stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Trip {
    /// The meter passed its limit.
    CostLimit,
    /// The interrupt was cancelled or its deadline passed.
    Interrupted,
}

#[derive(Default)]
struct Meter {
    active: Cell<bool>,
    spent: Cell<u64>,
    limit: Cell<u64>,
    trip: Cell<Option<Trip>>,
    ticks: Cell<u32>,
    deadline: Cell<Option<Instant>>,
    cancelled: RefCell<Option<Arc<AtomicBool>>>,
}

thread_local! {
    static METER: Meter = Meter::default();
    /// The functions (cel's standard ones, kube-cel's Kubernetes libraries and the meter's),
    /// registered once per thread as kube-cel's own validator does.
    static BASE: Context<'static> = base_context();
}

fn trip_error(trip: Trip) -> ExecutionError {
    let message = match trip {
        Trip::CostLimit => COST_LIMIT,
        Trip::Interrupted => INTERRUPTED,
    };
    ExecutionError::function_error("@ccm", message)
}

/// Charges `units` to the running evaluation's meter (nothing when none runs), and checks
/// the interrupt (its deadline every 16 charges).
fn charge(units: u64) -> Result<(), ExecutionError> {
    #[cfg(test)]
    tests::LOW_WATER.with(|low| {
        if let Some(left) = stacker::remaining_stack() {
            low.set(low.get().min(left));
        }
    });
    METER.with(|m| {
        if !m.active.get() {
            return Ok(());
        }
        if let Some(trip) = m.trip.get() {
            return Err(trip_error(trip));
        }
        let spent = m.spent.get().saturating_add(units);
        m.spent.set(spent);
        let trip = if spent > m.limit.get() {
            Some(Trip::CostLimit)
        } else {
            let ticks = m.ticks.get().wrapping_add(1);
            m.ticks.set(ticks);
            let cancelled = m
                .cancelled
                .borrow()
                .as_ref()
                .is_some_and(|c| c.load(Ordering::Relaxed));
            let late = ticks % 16 == 0 && m.deadline.get().is_some_and(|d| Instant::now() >= d);
            (cancelled || late).then_some(Trip::Interrupted)
        };
        match trip {
            Some(trip) => {
                m.trip.set(Some(trip));
                Err(trip_error(trip))
            }
            None => Ok(()),
        }
    })
}

/// What the running evaluation may still spend before it trips (plus one, so that a
/// capped count still trips it); unbounded when none runs.
fn remaining() -> u64 {
    METER.with(|m| {
        if m.active.get() {
            m.limit
                .get()
                .saturating_sub(m.spent.get())
                .saturating_add(1)
        } else {
            u64::MAX
        }
    })
}

/// Ends the meter's session even when the evaluation panics.
struct Session;

impl Session {
    fn start(limit: u64, interrupt: &Interrupt) -> Session {
        METER.with(|m| {
            m.active.set(true);
            m.spent.set(0);
            m.limit.set(limit);
            m.ticks.set(0);
            m.trip
                .set(interrupt.is_interrupted().then_some(Trip::Interrupted));
            m.deadline.set(interrupt.deadline);
            *m.cancelled.borrow_mut() = Some(interrupt.cancelled.clone());
        });
        Session
    }

    fn spent(&self) -> (u64, Option<Trip>) {
        METER.with(|m| (m.spent.get(), m.trip.get()))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        METER.with(|m| {
            m.active.set(false);
            *m.cancelled.borrow_mut() = None;
        });
    }
}

/// cel-go's `StringTraversalCostFactor` (0.1 per byte), at least 1.
fn bytes_units(len: usize) -> u64 {
    (len as u64).div_ceil(10).max(1)
}

/// What copying or converting `v` costs: one per scalar, list, map and map key, 0.1 per
/// byte of strings and bytes; counting stops past `cap`.
pub(super) fn weight(v: &Value, cap: u64) -> u64 {
    enum Items<'a> {
        List(std::slice::Iter<'a, Value>),
        Map(std::collections::hash_map::Iter<'a, Key, Value>),
    }
    fn one(v: &Value) -> u64 {
        match v {
            Value::String(s) => bytes_units(s.len()),
            Value::Bytes(b) => bytes_units(b.len()),
            _ => 1,
        }
    }
    fn push_items<'a>(v: &'a Value, stack: &mut Vec<Items<'a>>) {
        match v {
            Value::List(l) => stack.push(Items::List(l.iter())),
            Value::Map(m) => stack.push(Items::Map(m.map.iter())),
            _ => {}
        }
    }
    let mut total = one(v);
    let mut stack = Vec::new();
    push_items(v, &mut stack);
    while total <= cap {
        let next = match stack.last_mut() {
            None => break,
            Some(Items::List(items)) => items.next().map(|v| (0, v)),
            Some(Items::Map(entries)) => entries.next().map(|(k, v)| {
                let key = match k {
                    Key::String(s) => bytes_units(s.len()),
                    _ => 1,
                };
                (key, v)
            }),
        };
        match next {
            None => {
                stack.pop();
            }
            Some((key, v)) => {
                total = total.saturating_add(key).saturating_add(one(v));
                push_items(v, &mut stack);
            }
        }
    }
    total
}

fn str_len(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::String(s)) => s.len() as u64,
        Some(Value::Bytes(b)) => b.len() as u64,
        _ => 0,
    }
}

fn list_len(v: Option<&Value>) -> u64 {
    match v {
        Some(Value::List(l)) => l.len() as u64,
        Some(Value::Map(m)) => m.map.len() as u64,
        _ => 0,
    }
}

/// cel-go's `ceil(x * factor)`.
fn factor(x: u64, f: f64) -> u64 {
    (x as f64 * f).ceil() as u64
}

/// An upper bound of what compiling `pattern` costs: its regex's size with bounded
/// repetitions expanded (`\w{1000}{1000}` is a million classes), classes counted 100.
fn regex_units(pattern: &str) -> u64 {
    use regex_syntax::ast::{Ast, RepetitionKind, RepetitionRange};
    fn size(ast: &Ast) -> u64 {
        match ast {
            Ast::Empty(_) | Ast::Flags(_) | Ast::Assertion(_) | Ast::Literal(_) => 1,
            Ast::Dot(_) | Ast::ClassUnicode(_) | Ast::ClassPerl(_) | Ast::ClassBracketed(_) => 100,
            Ast::Repetition(r) => {
                let times = match &r.op.kind {
                    RepetitionKind::ZeroOrOne
                    | RepetitionKind::ZeroOrMore
                    | RepetitionKind::OneOrMore => 2,
                    RepetitionKind::Range(RepetitionRange::Exactly(n)) => u64::from(*n),
                    RepetitionKind::Range(RepetitionRange::AtLeast(n)) => u64::from(*n) + 1,
                    RepetitionKind::Range(RepetitionRange::Bounded(_, n)) => u64::from(*n),
                };
                size(&r.ast).saturating_mul(times.max(1))
            }
            Ast::Group(g) => size(&g.ast),
            Ast::Alternation(a) => a.asts.iter().map(size).fold(1, u64::saturating_add),
            Ast::Concat(c) => c.asts.iter().map(size).fold(1, u64::saturating_add),
        }
    }
    // The parser's own nesting limit (250) bounds the walk's recursion.
    match regex_syntax::ast::parse::Parser::new().parse(pattern) {
        Ok(ast) => size(&ast).max(pattern.len() as u64),
        Err(_) => pattern.len() as u64,
    }
}

/// What function `name` costs beyond copying its arguments (`values`: the target first,
/// when there is one), charged before it runs: cel-go's and the Kubernetes library's
/// `CallCost`, and the worst-case size of what it builds.
fn extra(name: &str, values: &[Value]) -> u64 {
    let s = str_len(values.first());
    match name {
        "matches" | "find" | "findAll" => {
            let pattern = match values.get(1) {
                Some(Value::String(p)) => regex_units(p),
                _ => 0,
            };
            let matching = factor(1 + s, 0.1).saturating_mul(factor(str_len(values.get(1)), 0.25));
            pattern.saturating_add(matching)
        }
        // kube-cel searches character by character: O(n·m).
        "contains" | "indexOf" | "lastIndexOf"
            if matches!(values.first(), Some(Value::String(_))) =>
        {
            factor(s, 0.1).saturating_mul(factor(str_len(values.get(1)), 0.1))
        }
        "replace" => {
            let (old, new) = (str_len(values.get(1)), str_len(values.get(2)));
            let mut count = match values.first() {
                Some(Value::String(text)) if old == 0 => text.chars().count() as u64 + 1,
                _ => s.checked_div(old).unwrap_or(0),
            };
            if let Some(Value::Int(n)) = values.get(3)
                && *n >= 0
            {
                count = count.min(*n as u64);
            }
            let output = s.saturating_add(count.saturating_mul(new));
            factor(s, 0.2).saturating_add(factor(output, 0.1))
        }
        "split" => {
            let sep = str_len(values.get(1));
            let mut parts = match values.first() {
                Some(Value::String(text)) if sep == 0 => text.chars().count() as u64,
                _ => s.checked_div(sep).unwrap_or(0) + 1,
            };
            if let Some(Value::Int(n)) = values.get(2)
                && *n >= 0
            {
                parts = parts.min(*n as u64);
            }
            factor(s, 0.2).saturating_add(parts)
        }
        "join" => {
            let bytes: u64 = match values.first() {
                Some(Value::List(items)) => items.iter().map(|i| str_len(Some(i))).sum(),
                _ => 0,
            };
            let seps = list_len(values.first())
                .saturating_sub(1)
                .saturating_mul(str_len(values.get(1)));
            factor(bytes.saturating_add(seps), 0.1)
        }
        "format" => {
            // Each conversion prints an argument (`%s` of a list prints it all) or a
            // number padded to its precision (`%.60000f`).
            let (mut percents, mut precisions) = (0u64, 0u64);
            if let Some(Value::String(f)) = values.first() {
                for (i, _) in f.match_indices('%') {
                    percents += 1;
                    let digits: String = f[i + 1..]
                        .strip_prefix('.')
                        .unwrap_or("")
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .collect();
                    let precision = match digits.as_str() {
                        "" => 0,
                        n => n.parse().unwrap_or(u64::MAX),
                    };
                    precisions = precisions.saturating_add(precision);
                }
            }
            let args = values
                .get(1)
                .map_or(0, |a| weight(a, remaining()).saturating_mul(24));
            let output = s
                .saturating_add(percents.saturating_mul(args))
                .saturating_add(precisions);
            factor(output, 0.1)
        }
        "lists.range" => match values.first() {
            Some(Value::Int(n)) => (*n).max(0) as u64,
            _ => 0,
        },
        "sets.contains" | "sets.intersects" => {
            list_len(values.first()).saturating_mul(list_len(values.get(1)))
        }
        "sets.equivalent" => list_len(values.first())
            .saturating_mul(list_len(values.get(1)))
            .saturating_mul(2),
        "distinct" => {
            let n = list_len(values.first());
            n.saturating_mul(n).saturating_mul(2)
        }
        "sort" => {
            let n = list_len(values.first());
            n.saturating_mul(u64::from(n.max(1).ilog2() + 1))
                .saturating_mul(2)
        }
        "url"
        | "lowerAscii"
        | "upperAscii"
        | "substring"
        | "trim"
        | "jsonpatch.escapeKey"
        | "cidr"
        | "isIP"
        | "isCIDR"
        | "ip"
        | "quantity"
        | "isQuantity"
        | "semver"
        | "isSemver"
        | "startsWith"
        | "endsWith"
        | "reverse"
        | "charAt" => factor(s, 0.1),
        "ip.isCanonical" => factor(s, 0.2),
        "validate" => factor(1 + str_len(values.get(1)), 0.1).saturating_mul(32),
        _ => 0,
    }
}

/// `@ccm.call(inner, values...)`: see the module documentation.
fn call(ftx: &FunctionContext<'_, '_>) -> ResolveResult {
    let Some(Expr::Call(inner)) = ftx.args.first().map(|a| &a.expr) else {
        return Err(ExecutionError::function_error(CALL, "malformed call"));
    };
    let mut values = Vec::with_capacity(ftx.args.len() - 1);
    for arg in &ftx.args[1..] {
        let v = Value::resolve(arg, ftx.ptx)?;
        charge(weight(&v, remaining()))?;
        values.push(v);
    }
    charge(1u64.saturating_add(extra(&inner.func_name, &values)))?;
    let with_target = matches!(
        inner.target.as_deref(),
        Some(IdedExpr { expr: Expr::Ident(name), .. }) if name == TARGET
    );
    let mut scope = ftx.ptx.new_inner_scope();
    let mut names = ARGS
        .iter()
        .map(|n| (*n).to_owned())
        .chain((ARGS.len()..).map(|i| format!("@a{i}")));
    for (i, v) in values.into_iter().enumerate() {
        if matches!(v, Value::Function(..)) {
            return Err(ExecutionError::UnsupportedTargetType { target: v });
        }
        let name = if with_target && i == 0 {
            TARGET.to_owned()
        } else {
            names.next().unwrap_or_default()
        };
        scope.add_variable_from_value(name, v);
    }
    let result = Value::resolve(&ftx.args[0], &scope)?;
    charge(weight(&result, remaining()))?;
    Ok(result)
}

/// `@ccm.val(e)`: `e`, charged by its weight.
fn val(ftx: &FunctionContext<'_, '_>) -> ResolveResult {
    let v = Value::resolve(&ftx.args[0], ftx.ptx)?;
    charge(weight(&v, remaining()))?;
    Ok(v)
}

/// `@ccm.step(step)`: one unit (and the interrupt check) per comprehension iteration.
fn step(ftx: &FunctionContext<'_, '_>) -> ResolveResult {
    charge(1)?;
    Value::resolve(&ftx.args[0], ftx.ptx)
}

/// `@ccm.map(range, 'x', transform[, filter])`: the `map` and `filter` macros.
fn map(ftx: &FunctionContext<'_, '_>) -> ResolveResult {
    let range = Value::resolve(&ftx.args[0], ftx.ptx)?;
    charge(weight(&range, remaining()))?;
    let Value::String(var) = Value::resolve(&ftx.args[1], ftx.ptx)? else {
        return Err(ExecutionError::function_error(MAP, "malformed map"));
    };
    let items: Vec<Value> = match &range {
        Value::List(items) => items.iter().cloned().collect(),
        Value::Map(m) => m
            .map
            .keys()
            .map(|k| match k {
                Key::Int(i) => Value::Int(*i),
                Key::Uint(u) => Value::UInt(*u),
                Key::Bool(b) => Value::Bool(*b),
                Key::String(s) => Value::String(s.clone()),
            })
            .collect(),
        _ => return Err(ExecutionError::NoSuchOverload),
    };
    let mut out = Vec::new();
    for item in items {
        charge(1)?;
        let mut scope = ftx.ptx.new_inner_scope();
        scope.add_variable_from_value(var.as_str(), item);
        if let Some(filter) = ftx.args.get(3) {
            match Value::resolve(filter, &scope)? {
                Value::Bool(true) => {}
                Value::Bool(false) => continue,
                _ => return Err(ExecutionError::NoSuchOverload),
            }
        }
        let v = Value::resolve(&ftx.args[2], &scope)?;
        charge(weight(&v, remaining()))?;
        out.push(v);
    }
    Ok(Value::List(Arc::new(out)))
}

fn base_context() -> Context<'static> {
    let mut ctx = Context::default();
    ctx.register_all();
    ctx.add_function(CALL, call);
    ctx.add_function(VAL, val);
    ctx.add_function(STEP, step);
    ctx.add_function(MAP, map);
    ctx
}

fn ident(name: &str) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Ident(name.to_owned()),
    }
}

fn wrap(function: &str, args: Vec<IdedExpr>) -> IdedExpr {
    IdedExpr {
        id: 0,
        expr: Expr::Call(CallExpr {
            func_name: function.to_owned(),
            target: None,
            args,
        }),
    }
}

/// The calls evaluated lazily (or cheaply) by the interpreter itself.
fn is_lazy(c: &CallExpr) -> bool {
    c.target.is_none()
        && matches!(
            c.func_name.as_str(),
            "_&&_" | "_||_" | "_?_:_" | "!_" | "@not_strictly_false"
        )
}

/// The `map` and `filter` macros' expansion: the transform and the filter.
fn map_shape(c: &ComprehensionExpr) -> Option<(&IdedExpr, Option<&IdedExpr>)> {
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if *n == c.accu_var);
    fn append<'e>(e: &'e IdedExpr, is_accu: &dyn Fn(&IdedExpr) -> bool) -> Option<&'e IdedExpr> {
        match &e.expr {
            Expr::Call(k)
                if k.func_name == "_+_"
                    && k.target.is_none()
                    && k.args.len() == 2
                    && is_accu(&k.args[0]) =>
            {
                match &k.args[1].expr {
                    Expr::List(l) if l.elements.len() == 1 && l.optional_indices.is_empty() => {
                        Some(&l.elements[0])
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }
    let empty_init = matches!(&c.accu_init.expr, Expr::List(l) if l.elements.is_empty());
    let always = c.loop_cond.expr == Expr::Literal(LiteralValue::Boolean(true.into()));
    if !empty_init || !always || !is_accu(&c.result) || c.iter_var2.is_some() {
        return None;
    }
    if let Some(transform) = append(&c.loop_step, &is_accu) {
        return Some((transform, None));
    }
    match &c.loop_step.expr {
        Expr::Call(k) if k.func_name == "_?_:_" && k.args.len() == 3 && is_accu(&k.args[2]) => {
            append(&k.args[1], &is_accu).map(|t| (t, Some(&k.args[0])))
        }
        _ => None,
    }
}

/// The rewrite of [`Program::new`]: `scope` holds the variables in scope (`self`,
/// `oldSelf`, comprehension variables), so that a call on any other identifier is a
/// namespaced function (`sets.contains`), whose target is not evaluated.
struct Rewriter {
    scope: Vec<String>,
}

impl Rewriter {
    fn expr(&mut self, e: &IdedExpr) -> IdedExpr {
        let expr = match &e.expr {
            Expr::Literal(_) | Expr::Ident(_) | Expr::Struct(_) | Expr::Unspecified => {
                return e.clone();
            }
            Expr::Select(s) => Expr::Select(SelectExpr {
                operand: Box::new(self.operand(&s.operand)),
                field: s.field.clone(),
                test: s.test,
            }),
            Expr::Call(c) if is_lazy(c) => Expr::Call(CallExpr {
                func_name: c.func_name.clone(),
                target: None,
                args: c.args.iter().map(|a| self.operand(a)).collect(),
            }),
            Expr::Call(c) => return self.call(c),
            Expr::List(l) => Expr::List(ListExpr {
                elements: l.elements.iter().map(|x| self.copied(x)).collect(),
                optional_indices: l.optional_indices.clone(),
            }),
            Expr::Map(m) => Expr::Map(MapExpr {
                entries: m
                    .entries
                    .iter()
                    .map(|entry| IdedEntryExpr {
                        id: entry.id,
                        expr: match &entry.expr {
                            EntryExpr::MapEntry(me) => EntryExpr::MapEntry(MapEntryExpr {
                                key: self.copied(&me.key),
                                value: self.copied(&me.value),
                                optional: me.optional,
                            }),
                            other => other.clone(),
                        },
                    })
                    .collect(),
            }),
            Expr::Comprehension(c) => return self.comprehension(c),
        };
        IdedExpr { id: e.id, expr }
    }

    /// `e` where the interpreter reads it in place: a field selection clones the field.
    fn operand(&mut self, e: &IdedExpr) -> IdedExpr {
        let out = self.expr(e);
        match &out.expr {
            Expr::Select(s) if !s.test => wrap(VAL, vec![out]),
            _ => out,
        }
    }

    /// `e` where the interpreter copies its value: a variable or a field.
    fn copied(&mut self, e: &IdedExpr) -> IdedExpr {
        let out = self.expr(e);
        match &out.expr {
            Expr::Ident(_) => wrap(VAL, vec![out]),
            Expr::Select(s) if !s.test => wrap(VAL, vec![out]),
            _ => out,
        }
    }

    fn call(&mut self, c: &CallExpr) -> IdedExpr {
        let mut values = vec![];
        let target = match c.target.as_deref() {
            None => None,
            Some(
                t @ IdedExpr {
                    expr: Expr::Ident(name),
                    ..
                },
            ) if !self.scope.contains(name) => Some(Box::new(t.clone())),
            Some(t) => {
                values.push(self.expr(t));
                Some(Box::new(ident(TARGET)))
            }
        };
        let mut names = ARGS
            .iter()
            .map(|n| (*n).to_owned())
            .chain((ARGS.len()..).map(|i| format!("@a{i}")));
        let mut args = Vec::with_capacity(c.args.len());
        for a in &c.args {
            values.push(self.expr(a));
            args.push(ident(&names.next().unwrap_or_default()));
        }
        let inner = IdedExpr {
            id: 0,
            expr: Expr::Call(CallExpr {
                func_name: c.func_name.clone(),
                target,
                args,
            }),
        };
        values.insert(0, inner);
        wrap(CALL, values)
    }

    fn comprehension(&mut self, c: &ComprehensionExpr) -> IdedExpr {
        if let Some((transform, filter)) = map_shape(c) {
            let range = self.expr(&c.iter_range);
            self.scope.push(c.iter_var.clone());
            let mut args = vec![
                range,
                IdedExpr {
                    id: 0,
                    expr: Expr::Literal(LiteralValue::String(c.iter_var.clone().into())),
                },
                self.expr(transform),
            ];
            if let Some(filter) = filter {
                args.push(self.operand(filter));
            }
            self.scope.pop();
            return wrap(MAP, args);
        }
        let iter_range = self.copied(&c.iter_range);
        let accu_init = self.expr(&c.accu_init);
        self.scope.push(c.accu_var.clone());
        self.scope.push(c.iter_var.clone());
        self.scope.extend(c.iter_var2.clone());
        let loop_cond = self.operand(&c.loop_cond);
        let loop_step = wrap(STEP, vec![self.operand(&c.loop_step)]);
        let result = self.operand(&c.result);
        self.scope
            .truncate(self.scope.len() - 2 - usize::from(c.iter_var2.is_some()));
        IdedExpr {
            id: 0,
            expr: Expr::Comprehension(Box::new(ComprehensionExpr {
                iter_range,
                iter_var: c.iter_var.clone(),
                iter_var2: c.iter_var2.clone(),
                accu_var: c.accu_var.clone(),
                accu_init,
                loop_cond,
                loop_step,
                result,
            })),
        }
    }
}

/// The height of `e`'s tree.
fn height(e: &IdedExpr) -> usize {
    let children: Vec<&IdedExpr> = match &e.expr {
        Expr::Literal(_) | Expr::Ident(_) | Expr::Unspecified => vec![],
        Expr::Select(s) => vec![&s.operand],
        Expr::Call(c) => c.target.as_deref().into_iter().chain(&c.args).collect(),
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|entry| match &entry.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .filter_map(|entry| match &entry.expr {
                EntryExpr::StructField(f) => Some(&f.value),
                EntryExpr::MapEntry(_) => None,
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
    };
    1 + children.into_iter().map(height).max().unwrap_or(0)
}

/// A rule (or message expression) ready for metered evaluation.
pub(super) struct Program {
    expr: IdedExpr,
    height: usize,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the tree: it may be deep, and formatting recurses.
        f.debug_struct("Program")
            .field("height", &self.height)
            .finish_non_exhaustive()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // Dropping the tree recurses over it too: not on whatever stack drops the rules.
        let expr = std::mem::take(&mut self.expr);
        let stack = self.stack();
        stacker::maybe_grow(stack, stack.max(MIN_SEGMENT), || drop(expr));
    }
}

impl Program {
    /// The metered form of the parsed `e`. Recursive over the tree: call it on the parse's
    /// stack ([`super::compile::parse`]).
    pub(super) fn new(e: &IdedExpr) -> Program {
        let mut rewriter = Rewriter {
            scope: vec!["self".to_owned(), "oldSelf".to_owned()],
        };
        let expr = rewriter.operand(e);
        let height = height(&expr);
        Program { expr, height }
    }

    /// The stack its evaluation needs.
    pub(super) fn stack(&self) -> usize {
        STACK_BASE.saturating_add(self.height.saturating_mul(STACK_PER_LEVEL))
    }
}

/// How one metered evaluation ended.
#[derive(Debug)]
pub(super) enum Outcome {
    /// It returned a value.
    Value(Value),
    /// It failed (`no such key`, ...).
    Error(ExecutionError),
    /// The meter stopped it.
    Tripped(Trip),
    /// It panicked (a bug of the interpreter or a library): caught, reported as an error.
    Panicked,
}

/// The scopes a node's rules run in: `self` and `oldSelf` bound, and the same with
/// `oldSelf` null (for `optionalOldSelf` rules on create).
pub(super) struct Scopes<'a> {
    /// `self`, and `oldSelf` when there is an old value.
    pub node: &'a Context<'a>,
    /// `self`, and `oldSelf` null.
    pub null_old: &'a Context<'a>,
}

/// Runs `f` with the scopes of a node whose value is `this` (and old value `old`), on a
/// stack of at least `stack` bytes (a new segment when the caller's is short).
pub(super) fn with_scopes<R>(
    this: Value,
    old: Option<Value>,
    stack: usize,
    f: impl FnOnce(&Scopes<'_>) -> R,
) -> R {
    stacker::maybe_grow(stack, stack.max(MIN_SEGMENT), || {
        BASE.with(|base| {
            let mut node = base.new_inner_scope();
            node.add_variable_from_value("self", this);
            if let Some(old) = old {
                node.add_variable_from_value("oldSelf", old);
            }
            let mut null_old = node.new_inner_scope();
            null_old.add_variable_from_value("oldSelf", Value::Null);
            f(&Scopes {
                node: &node,
                null_old: &null_old,
            })
        })
    })
}

/// Evaluates `program` in `scope` with a meter of `limit` units: how it ended, and what
/// it spent.
pub(super) fn run(
    program: &Program,
    scope: &Context<'_>,
    limit: u64,
    interrupt: &Interrupt,
) -> (Outcome, u64) {
    let session = Session::start(limit, interrupt);
    let result = if session.spent().1.is_some() {
        None
    } else {
        Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            || Value::resolve(&program.expr, scope),
        )))
    };
    let (spent, trip) = session.spent();
    drop(session);
    let outcome = match (trip, result) {
        (Some(trip), _) => Outcome::Tripped(trip),
        (None, Some(Ok(Ok(v)))) => Outcome::Value(v),
        (None, Some(Ok(Err(e)))) => Outcome::Error(e),
        (None, Some(Err(_)) | None) => Outcome::Panicked,
    };
    (outcome, spent)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::cel::compile;
    use std::sync::Arc;

    thread_local! {
        /// The least stack left at any charge (the evaluation's deepest point, to a frame
        /// or two).
        pub(super) static LOW_WATER: Cell<usize> = const { Cell::new(usize::MAX) };
    }

    fn program(src: &str) -> Program {
        compile::parse(src, Program::new).expect("compiles")
    }

    fn eval(src: &str, this: serde_json::Value, limit: u64) -> (Outcome, u64) {
        let p = program(src);
        let this = crate::crd::cel::values::to_cel(&this, None);
        with_scopes(this, None, p.stack(), |s| {
            run(&p, s.node, limit, &Interrupt::default())
        })
    }

    fn value(src: &str, this: serde_json::Value) -> Value {
        match eval(src, this, u64::MAX / 2) {
            (Outcome::Value(v), _) => v,
            other => panic!("{src}: {other:?}"),
        }
    }

    /// The rewrite keeps CEL's meaning: calls, namespaced functions, operators, macros,
    /// field selection and presence tests.
    #[test]
    fn rewritten_rules_mean_what_they_meant() {
        let this = serde_json::json!({"a": {"b": [1, 2, 3]}, "s": "x-y", "m": {"k": "v"}});
        for (src, want) in [
            ("self.a.b.size() == 3", true),
            ("self.a.b.all(x, x > 0) && self.a.b.exists(x, x == 2)", true),
            ("self.a.b.exists_one(x, x > 2)", true),
            ("self.a.b.map(x, x * 2) == [2, 4, 6]", true),
            ("self.a.b.filter(x, x % 2 == 1) == [1, 3]", true),
            ("self.a.b.map(x, x > 1, x) == [2, 3]", true),
            ("self.m.map(k, k) == ['k']", true),
            ("has(self.a.b) && !has(self.a.c)", true),
            ("sets.contains(self.a.b, [1, 2])", true),
            (
                "self.s.split('-') == ['x', 'y'] && self.s.replace('-', '+') == 'x+y'",
                true,
            ),
            ("'%s!'.format([self.s]) == 'x-y!'", true),
            (
                "self.s.matches('^x') && self.s.startsWith('x') && size(self.s) == 3",
                true,
            ),
            (
                "[self.s, self.m.k] == ['x-y', 'v'] && {'k': self.s}.k == 'x-y'",
                true,
            ),
            (
                "self.a.b[1] == 2 && 2 in self.a.b && self.m['k'] == 'v'",
                true,
            ),
            ("optional.none().orValue(self.s) == 'x-y'", true),
            ("quantity('1Gi').isGreaterThan(quantity('1Mi'))", true),
            (
                "self.a.b.map(x, self.a.b.map(y, x * y)) == [[1, 2, 3], [2, 4, 6], [3, 6, 9]]",
                true,
            ),
            ("(((((((((( true ))))))))))", true),
        ] {
            assert_eq!(value(src, this.clone()), Value::Bool(want), "{src}");
        }
    }

    /// Errors come out as the interpreter's (`no such key`).
    #[test]
    fn evaluation_errors_are_the_interpreters() {
        let (outcome, _) = eval("self.missing > 0", serde_json::json!({}), 1000);
        let Outcome::Error(e) = outcome else {
            panic!("{outcome:?}")
        };
        assert_eq!(e.to_string(), "No such key: missing");
    }

    /// The weight of a value: its elements, keys and 0.1 per byte; capped.
    #[test]
    fn values_weigh_their_deep_size() {
        let v = crate::crd::cel::values::to_cel(
            &serde_json::json!({"a": [1, 2, 3], "s": "x".repeat(100)}),
            None,
        );
        // The map 1, keys 2, the list 1 + 3, the string 10.
        assert_eq!(weight(&v, u64::MAX), 17);
        assert!(weight(&v, 3) <= 3 + 11, "one entry past the cap at most");
        let big = Value::List(Arc::new(vec![Value::Int(1); 1_000_000]));
        assert!(weight(&big, 10) <= 12, "counting stops at the cap");
    }

    /// Regexes cost what their expansion costs to compile.
    #[test]
    fn regexes_cost_their_expanded_size() {
        assert!(regex_units("^[a-z0-9]([-a-z0-9]*[a-z0-9])?$") < 1000);
        assert!(regex_units(r"\w{1000}{1000}") >= 100_000_000);
        assert_eq!(regex_units("("), 1);
    }

    /// Evaluation recursion never outgrows the stack [`Program::stack`] asks for: the
    /// deepest rules the compile limits accept (249 chained `==`, selections, method calls
    /// and indexes; 248 nested lists, global calls and conditionals; 120 nested `all`),
    /// measured at their deepest charge. Run with `--nocapture` to see the bytes per level.
    #[test]
    fn the_stack_estimate_covers_the_deepest_rules() {
        let nested = |open: &str, close: &str, n: usize| {
            format!("{}self.size(){} != null", open.repeat(n), close.repeat(n))
        };
        let mut macros = String::from("self.size() > 0");
        for i in 0..120 {
            macros = format!("[1].all(x{i}, {macros})");
        }
        let mut deep = serde_json::json!(1);
        for _ in 0..248 {
            deep = serde_json::json!({"a": deep});
        }
        let rules = [
            ("==", format!("{}self.val1", "self.val1 == ".repeat(249))),
            ("select", format!("self{} == 1", ".a".repeat(248))),
            (
                "methods",
                format!("'a'{} != ''", ".lowerAscii()".repeat(248)),
            ),
            ("index", format!("[1]{} == 1", "[0]".repeat(248))),
            ("lists", nested("[", "]", 248)),
            ("calls", nested("dyn(", ")", 248)),
            (
                "ternary",
                format!("{}self.size() > 0", "false ? false : ".repeat(248)),
            ),
            ("all", macros),
        ];
        for (kind, src) in rules {
            let p = program(&src);
            let this = if kind == "select" {
                deep.clone()
            } else {
                serde_json::json!({"val1": true})
            };
            let this = crate::crd::cel::values::to_cel(&this, None);
            let used = with_scopes(this, None, p.stack(), |s| {
                let start = stacker::remaining_stack().unwrap_or(0);
                LOW_WATER.with(|low| low.set(usize::MAX));
                let (outcome, _) = run(&p, s.node, u64::MAX / 2, &Interrupt::default());
                assert!(!matches!(outcome, Outcome::Panicked), "{kind}: {outcome:?}");
                start.saturating_sub(LOW_WATER.with(Cell::get))
            });
            println!(
                "{kind}: height {}, {} KiB used, {} bytes per level, {} KiB reserved",
                p.height,
                used >> 10,
                used / p.height,
                p.stack() >> 10
            );
            assert!(used > 0, "{kind}: no charge measured");
            assert!(
                used < p.stack(),
                "{kind}: {used} bytes used, {} reserved",
                p.stack()
            );
        }
    }

    /// A panic inside the interpreter (here its `todo!()` on a message) is caught and
    /// reported, never unwound into the caller.
    #[test]
    fn a_panicking_rule_is_caught() {
        let message = IdedExpr {
            id: 1,
            expr: Expr::Struct(kube_cel::cel::common::ast::StructExpr {
                type_name: "Foo".to_owned(),
                entries: vec![],
            }),
        };
        let p = Program::new(&message);
        let outcome = with_scopes(Value::Null, None, p.stack(), |s| {
            run(&p, s.node, 1000, &Interrupt::default()).0
        });
        assert!(matches!(outcome, Outcome::Panicked), "{outcome:?}");
    }

    /// The meter stops a runaway rule at its limit: the charges stop within one value's
    /// weight of it, and `replace` is refused before it builds its output.
    #[test]
    fn the_meter_stops_at_its_limit() {
        let s = serde_json::json!({"s": "a".repeat(2000)});
        let (outcome, spent) = eval(
            "self.s.split('').all(x, self.s.split('').all(y, y.size() < 5))",
            s.clone(),
            1_000_000,
        );
        assert!(
            matches!(outcome, Outcome::Tripped(Trip::CostLimit)),
            "{outcome:?}"
        );
        assert!((1_000_000..1_010_000).contains(&spent), "{spent}");
        let big = serde_json::json!({"s": "a".repeat(1 << 20)});
        let (outcome, spent) = eval("self.s.replace('', self.s) != ''", big, 1_000_000);
        assert!(
            matches!(outcome, Outcome::Tripped(Trip::CostLimit)),
            "{outcome:?}"
        );
        assert!(spent > 1_000_000_000, "pre-charged its output: {spent}");
    }

    /// Rules that build lists charge what they build; a string's length costs 0.1 per
    /// byte where it is copied.
    #[test]
    fn ordinary_rules_cost_a_few_units_per_operation() {
        let items: Vec<_> = (0..100)
            .map(|i| serde_json::json!({"name": format!("n{i}")}))
            .collect();
        let (outcome, spent) = eval(
            "self.items.all(i, i.name.size() < 10)",
            serde_json::json!({"items": items}),
            1_000_000,
        );
        assert!(
            matches!(outcome, Outcome::Value(Value::Bool(true))),
            "{outcome:?}"
        );
        assert!((500..3_000).contains(&spent), "{spent}");
        let (_, spent) = eval(
            "self.min <= self.max",
            serde_json::json!({"min": 1, "max": 2}),
            100,
        );
        assert!(spent < 10, "{spent}");
    }
}
