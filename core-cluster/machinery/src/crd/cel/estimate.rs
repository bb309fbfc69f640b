//! The static cost estimate that decides whether a rule may be written, after cel-go's
//! `checker/cost.go` with the Kubernetes library's estimates (`apiserver/pkg/cel/library/
//! cost.go`) and the size bounds of apiextensions' schemas (`apiserver/pkg/cel/common/
//! schemas.go`, `SchemaDeclType`):
//!
//! - a string under `maxLength: n` holds at most `4n` bytes (a code point is up to four),
//!   one without it the largest request (3 MiB); `format: byte` counts bytes; timestamps and
//!   durations are scalars;
//! - a list has at most `maxItems` items, a map `maxProperties` entries, unbounded ones
//!   [`UNBOUNDED_CARDINALITY`](super::UNBOUNDED_CARDINALITY);
//! - a field selection and a variable cost 1, a call 1 plus its own cost: string functions
//!   0.1 per byte they traverse (`size()` 1, `==` the shorter side, `contains` the product,
//!   `matches` the text times a quarter of the pattern, `split` and `replace` 0.2 per byte),
//!   a list literal 10, a map literal 30;
//! - a comprehension costs its range's size times its body: `split` of a string of `n`
//!   bytes gives at most `n` parts of `n` bytes, so iterating it is bounded by the string,
//!   while `self.items.all(i, i.name.size() < 10)` costs its items times a few units,
//!   whatever the names' length.
//!
//! Without a type checker, values of unknown type (under
//! `x-kubernetes-preserve-unknown-fields`, or from functions whose result is not tracked)
//! are assumed as large as a request.

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};
use serde_json::Value;

use super::UNBOUNDED_CARDINALITY;
use super::values::unescape;

/// celconfig's `MaxRequestSizeBytes`.
const MAX_REQUEST: u64 = 3 * 1024 * 1024;
/// The longest string of a request (`estimateMaxStringLengthPerRequest`: without quotes).
const UNBOUNDED_STRING: u64 = MAX_REQUEST - 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Bytes,
    List,
    Map,
    Object,
    Scalar,
    Unknown,
}

/// What the estimate knows of a value.
#[derive(Debug, Clone)]
struct Info<'s> {
    kind: Kind,
    /// The largest `size()`: bytes of a string, items of a list or map; 1 for a scalar.
    size: u64,
    /// Whether `size` is exact (a literal's).
    exact: bool,
    /// A list's items, a map's values.
    elem: Option<Box<Info<'s>>>,
    /// The schema of an object (for selecting its fields).
    schema: Option<&'s Value>,
}

impl<'s> Info<'s> {
    fn new(kind: Kind, size: u64) -> Info<'s> {
        Info {
            kind,
            size,
            exact: false,
            elem: None,
            schema: None,
        }
    }

    fn scalar() -> Info<'s> {
        Info::new(Kind::Scalar, 1)
    }

    fn unknown() -> Info<'s> {
        Info::new(Kind::Unknown, UNBOUNDED_STRING)
    }

    fn exact(kind: Kind, size: u64) -> Info<'s> {
        Info {
            exact: true,
            ..Info::new(kind, size)
        }
    }

    fn with_elem(mut self, elem: Info<'s>) -> Info<'s> {
        self.elem = Some(Box::new(elem));
        self
    }

    /// The values under `schema`, as `SchemaDeclType` bounds them.
    fn of(schema: &'s Value) -> Info<'s> {
        let max = |key: &str| schema[key].as_u64();
        if schema["x-kubernetes-int-or-string"] == true {
            let size = max("maxLength").map_or(UNBOUNDED_STRING, |n| n.saturating_mul(4));
            return Info::new(Kind::Unknown, size);
        }
        match schema["type"].as_str() {
            Some("string") => match schema["format"].as_str() {
                Some("byte") => {
                    Info::new(Kind::Bytes, max("maxLength").unwrap_or(UNBOUNDED_STRING))
                }
                Some("duration" | "date" | "date-time") => Info::scalar(),
                _ => {
                    let size = match (max("maxLength"), schema["enum"].as_array()) {
                        (Some(n), _) => n.saturating_mul(4),
                        (None, Some(values)) if !values.is_empty() => values
                            .iter()
                            .filter_map(Value::as_str)
                            .map(|s| s.len() as u64)
                            .max()
                            .unwrap_or(0),
                        _ => UNBOUNDED_STRING,
                    };
                    Info::new(Kind::Str, size)
                }
            },
            Some("integer" | "number" | "boolean") => Info::scalar(),
            Some("array") => {
                let items = schema
                    .get("items")
                    .filter(|i| i.is_object())
                    .map_or_else(Info::unknown, Info::of);
                Info::new(Kind::List, max("maxItems").unwrap_or(UNBOUNDED_CARDINALITY))
                    .with_elem(items)
            }
            _ => {
                if let Some(values) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                    return Info::new(
                        Kind::Map,
                        max("maxProperties").unwrap_or(UNBOUNDED_CARDINALITY),
                    )
                    .with_elem(Info::of(values));
                }
                if schema["properties"].is_object() || schema["type"] == "object" {
                    let fields = schema["properties"]
                        .as_object()
                        .map_or(0, |p| p.len() as u64);
                    return Info {
                        schema: Some(schema),
                        ..Info::new(Kind::Object, fields.max(1))
                    };
                }
                Info::unknown()
            }
        }
    }

    /// The field `name` of this value.
    fn field(&self, name: &str) -> Info<'s> {
        match self.kind {
            Kind::Object => {
                let props = self.schema.and_then(|s| s["properties"].as_object());
                props
                    .and_then(|p| p.get(name).or_else(|| p.get(&unescape(name))))
                    .map_or_else(Info::unknown, Info::of)
            }
            Kind::Map => self.item(),
            _ => Info::unknown(),
        }
    }

    /// An item of this list, a value of this map.
    fn item(&self) -> Info<'s> {
        self.elem.as_deref().cloned().unwrap_or_else(Info::unknown)
    }

    /// How many times a comprehension over this value iterates.
    fn count(&self) -> u64 {
        match self.kind {
            Kind::List | Kind::Map => self.size,
            Kind::Object => self.size,
            _ => UNBOUNDED_CARDINALITY,
        }
    }

    /// A comprehension variable over this value: list items, map keys.
    fn iteration(&self) -> Info<'s> {
        match self.kind {
            Kind::List => self.item(),
            Kind::Map | Kind::Object => Info::new(Kind::Str, UNBOUNDED_STRING),
            _ => Info::unknown(),
        }
    }

    /// Whether this may be a string or bytes.
    fn stringy(&self) -> bool {
        matches!(self.kind, Kind::Str | Kind::Bytes | Kind::Unknown)
    }

    /// Either of two values.
    fn union(self, other: Info<'s>) -> Info<'s> {
        let kind = if self.kind == other.kind {
            self.kind
        } else {
            Kind::Unknown
        };
        Info {
            kind,
            size: self.size.max(other.size),
            exact: self.exact && other.exact && self.size == other.size,
            elem: match (self.elem, other.elem) {
                (Some(a), Some(b)) => Some(Box::new(a.union(*b))),
                (a, b) => a.or(b),
            },
            schema: self.schema.or(other.schema),
        }
    }
}

/// cel-go's `MultiplyByCostFactor`: `ceil(x * f)`.
fn factor(x: u64, f: f64) -> u64 {
    let v = (x as f64 * f).ceil();
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v as u64
    }
}

/// The estimated cost of the parsed rule `e` at the schema node `schema` (where `self` and
/// `oldSelf` are). Recursive over the tree: call it on the parse's stack.
pub(super) fn cost(e: &IdedExpr, schema: &Value) -> u64 {
    let this = Info::of(schema);
    let mut estimator = Estimator {
        scope: vec![
            ("self".to_owned(), this.clone()),
            ("oldSelf".to_owned(), this),
        ],
    };
    estimator.expr(e).0
}

struct Estimator<'s> {
    scope: Vec<(String, Info<'s>)>,
}

impl<'s> Estimator<'s> {
    fn expr(&mut self, e: &IdedExpr) -> (u64, Info<'s>) {
        match &e.expr {
            Expr::Literal(l) => (
                0,
                match l {
                    LiteralValue::String(s) => Info::exact(Kind::Str, s.inner().len() as u64),
                    LiteralValue::Bytes(b) => Info::exact(Kind::Bytes, b.inner().len() as u64),
                    _ => Info::scalar(),
                },
            ),
            Expr::Ident(name) => (
                1,
                self.scope
                    .iter()
                    .rev()
                    .find(|(n, _)| n == name)
                    .map_or_else(Info::unknown, |(_, i)| i.clone()),
            ),
            Expr::Select(s) => {
                let (c, operand) = self.expr(&s.operand);
                let info = if s.test {
                    Info::scalar()
                } else {
                    operand.field(&s.field)
                };
                (c.saturating_add(1), info)
            }
            Expr::List(l) => {
                let mut total: u64 = 10;
                let mut elem: Option<Info<'s>> = None;
                for x in &l.elements {
                    let (c, i) = self.expr(x);
                    total = total.saturating_add(c);
                    elem = Some(match elem {
                        Some(e) => e.union(i),
                        None => i,
                    });
                }
                let info = Info::exact(Kind::List, l.elements.len() as u64);
                (total, elem.map_or(info.clone(), |e| info.with_elem(e)))
            }
            Expr::Map(m) => {
                let mut total: u64 = 30;
                let mut elem: Option<Info<'s>> = None;
                for entry in &m.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        let (ck, _) = self.expr(&me.key);
                        let (cv, v) = self.expr(&me.value);
                        total = total.saturating_add(ck).saturating_add(cv);
                        elem = Some(match elem {
                            Some(e) => e.union(v),
                            None => v,
                        });
                    }
                }
                let info = Info::exact(Kind::Map, m.entries.len() as u64);
                (total, elem.map_or(info.clone(), |e| info.with_elem(e)))
            }
            // Refused before the estimate; cel-go's `StructCreateBaseCost`.
            Expr::Struct(_) | Expr::Unspecified => (40, Info::unknown()),
            Expr::Comprehension(c) => {
                let (c_range, range) = self.expr(&c.iter_range);
                let (c_init, init) = self.expr(&c.accu_init);
                let n = range.count();
                self.scope.push((c.accu_var.clone(), init.clone()));
                self.scope.push((c.iter_var.clone(), range.iteration()));
                let (c_cond, _) = self.expr(&c.loop_cond);
                let (c_step, step) = self.expr(&c.loop_step);
                let (c_result, result) = self.expr(&c.result);
                self.scope.truncate(self.scope.len() - 2);
                // `map` and `filter` build a list as long as the range.
                let result = if init.kind == Kind::List && result.kind == Kind::List {
                    Info::new(Kind::List, n).with_elem(step.item())
                } else {
                    result
                };
                let per_item = c_cond.saturating_add(c_step);
                let total = c_range
                    .saturating_add(c_init)
                    .saturating_add(c_result)
                    .saturating_add(n.saturating_mul(per_item));
                (total, result)
            }
            Expr::Call(call) => {
                let target = call.target.as_deref().map(|t| self.expr(t));
                let args: Vec<(u64, Info<'s>)> = call.args.iter().map(|a| self.expr(a)).collect();
                let arg_costs = target
                    .iter()
                    .chain(&args)
                    .map(|(c, _)| *c)
                    .fold(0u64, u64::saturating_add);
                let infos: Vec<&Info<'s>> = args.iter().map(|(_, i)| i).collect();
                match call.func_name.as_str() {
                    "_&&_" | "_||_" => (arg_costs, Info::scalar()),
                    "_?_:_" if args.len() == 3 => (
                        args[0].0.saturating_add(args[1].0.max(args[2].0)),
                        args[1].1.clone().union(args[2].1.clone()),
                    ),
                    name => {
                        let (own, info) =
                            function(name, target.as_ref().map(|(_, i)| i), &infos, &call.args);
                        (arg_costs.saturating_add(own), info)
                    }
                }
            }
        }
    }
}

/// The literal integer `e`, if it is one.
fn literal_int(e: Option<&IdedExpr>) -> Option<u64> {
    match e.map(|e| &e.expr) {
        Some(Expr::Literal(LiteralValue::Int(i))) => u64::try_from(*i.inner()).ok(),
        Some(Expr::Literal(LiteralValue::UInt(u))) => Some(*u.inner()),
        _ => None,
    }
}

/// A function's own cost and its result, from its target and arguments.
fn function<'s>(
    name: &str,
    target: Option<&Info<'s>>,
    args: &[&Info<'s>],
    exprs: &[IdedExpr],
) -> (u64, Info<'s>) {
    let unknown = Info::unknown;
    let scalar = Info::scalar;
    // The value a string function works on: its target, or its first argument.
    let subject = target
        .or(args.first().copied())
        .cloned()
        .unwrap_or_else(unknown);
    let s = subject.size;
    let arg = |i: usize| args.get(i).map_or(0, |a| a.size);
    // The argument after the subject (the pattern of `matches(s, p)` and `s.matches(p)`).
    let second = if target.is_some() { arg(0) } else { arg(1) };
    match name {
        "@not_strictly_false" | "!_" | "-_" | "_-_" | "_*_" | "_/_" | "_%_" | "size" => {
            (1, scalar())
        }
        "_==_" | "_!=_" => {
            let smallest = arg(0).min(arg(1));
            (factor(smallest, 0.1), scalar())
        }
        "_<_" | "_<=_" | "_>_" | "_>=_" => {
            let cost = if args.len() == 2 && args[0].stringy() && args[1].stringy() {
                factor(arg(0).min(arg(1)), 0.1)
            } else {
                1
            };
            (cost, scalar())
        }
        "_+_" if args.len() == 2 => {
            let (l, r) = (args[0], args[1]);
            let size = l.size.saturating_add(r.size);
            if l.kind == Kind::List || r.kind == Kind::List {
                let elem = l.item().union(r.item());
                (1, Info::new(Kind::List, size).with_elem(elem))
            } else if l.stringy() && r.stringy() {
                let kind = if l.kind == Kind::Unknown {
                    r.kind
                } else {
                    l.kind
                };
                (factor(size, 0.1), Info::new(kind, size))
            } else {
                (1, scalar())
            }
        }
        "@in" => {
            let cost = match args.get(1).map(|a| a.kind) {
                Some(Kind::Map | Kind::Object) => 1,
                _ => arg(1),
            };
            (cost.max(1), scalar())
        }
        "_[_]" => {
            let container = args.first().copied().cloned().unwrap_or_else(unknown);
            let info = match container.kind {
                Kind::List | Kind::Map => container.item(),
                Kind::Object => match exprs.get(1).map(|e| &e.expr) {
                    Some(Expr::Literal(LiteralValue::String(f))) => container.field(f.inner()),
                    _ => unknown(),
                },
                _ => unknown(),
            };
            (1, info)
        }
        "startsWith" | "endsWith" => (factor(second, 0.1), scalar()),
        "contains" => match subject.kind {
            Kind::List => (s.max(1), scalar()),
            Kind::Map | Kind::Object => (1, scalar()),
            _ => (factor(s, 0.1).saturating_mul(factor(second, 0.1)), scalar()),
        },
        "matches" => (
            factor(s.saturating_add(1), 0.1).saturating_mul(factor(second, 0.25)),
            scalar(),
        ),
        "find" | "findAll" => {
            let cost = factor(s.saturating_add(1), 0.1).saturating_mul(factor(second, 0.25));
            let found = Info::new(Kind::Str, s);
            if name == "find" {
                (cost, found)
            } else {
                (cost, Info::new(Kind::List, s).with_elem(found))
            }
        }
        "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" if target.is_some() => {
            match subject.kind {
                Kind::List => {
                    let item = subject.item();
                    let per = if matches!(item.kind, Kind::Str | Kind::Bytes) {
                        1 + factor(item.size, 0.1)
                    } else {
                        1
                    };
                    let result = if matches!(name, "max" | "min") {
                        item
                    } else {
                        scalar()
                    };
                    (s.saturating_mul(per), result)
                }
                _ => (
                    factor(s, 0.1).saturating_mul(factor(arg(0), 0.1)).max(1),
                    scalar(),
                ),
            }
        }
        "url" | "jsonpatch.escapeKey" => (factor(arg(0), 0.1), Info::new(Kind::Str, arg(0))),
        "lowerAscii" | "upperAscii" | "substring" | "trim" | "charAt" | "strings.quote"
        | "base64.encode" | "base64.decode" => {
            let size = match name {
                "strings.quote" => s.saturating_mul(2).saturating_add(2),
                "base64.encode" => s.saturating_mul(4).div_ceil(3).saturating_add(4),
                "charAt" => 4,
                _ => s,
            };
            let kind = if name == "base64.decode" {
                Kind::Bytes
            } else {
                Kind::Str
            };
            (factor(s, 0.1), Info::new(kind, size))
        }
        "reverse" if subject.kind == Kind::List => (
            s.saturating_add(11),
            Info::new(Kind::List, s).with_elem(subject.item()),
        ),
        "reverse" => (factor(s, 0.1), Info::new(Kind::Str, s)),
        "replace" if target.is_some() && args.len() >= 2 => {
            let (old, new) = (args[0], args[1]);
            let old_min = if old.exact { old.size } else { 0 };
            let (count, retained) = if old_min == 0 {
                (s.saturating_add(1), s)
            } else if new.size <= old_min {
                (0, s)
            } else {
                (s.div_ceil(old_min), 0)
            };
            let size = count.saturating_mul(new.size).saturating_add(retained);
            (factor(s, 0.2), Info::new(Kind::Str, size))
        }
        "split" if target.is_some() => {
            let parts = literal_int(exprs.get(1)).unwrap_or(s);
            (
                factor(s, 0.2),
                Info::new(Kind::List, parts).with_elem(Info::new(Kind::Str, s)),
            )
        }
        "join" if target.is_some() => {
            let item = subject.item();
            let seps = s.saturating_sub(1).saturating_mul(arg(0));
            let size = s.saturating_mul(item.size).saturating_add(seps);
            (factor(size, 0.1), Info::new(Kind::Str, size))
        }
        "cidr" | "isIP" | "isCIDR" | "quantity" | "isQuantity" | "semver" | "isSemver" => {
            (factor(arg(0), 0.1), scalar())
        }
        "ip" if target.is_some() => (1, scalar()),
        "ip" => (factor(arg(0), 0.1), scalar()),
        "ip.isCanonical" => (factor(arg(0), 0.2), scalar()),
        "containsIP" | "containsCIDR" => {
            let parse = if args.first().is_some_and(|a| a.stringy()) {
                factor(arg(0), 0.1)
            } else {
                0
            };
            (6u64.saturating_add(parse), scalar())
        }
        "validate" => (factor(factor(arg(0), 0.1), 32.0), unknown()),
        "sets.contains" | "sets.intersects" => {
            (arg(0).saturating_mul(arg(1)).saturating_add(1), scalar())
        }
        "sets.equivalent" => (
            arg(0)
                .saturating_mul(arg(1))
                .saturating_mul(2)
                .saturating_add(1),
            scalar(),
        ),
        "lists.range" => {
            let n = literal_int(exprs.first()).unwrap_or(UNBOUNDED_CARDINALITY);
            (
                n.saturating_add(11),
                Info::new(Kind::List, n).with_elem(scalar()),
            )
        }
        "distinct" | "sort" => (
            s.saturating_mul(s).saturating_mul(2).saturating_add(11),
            Info::new(Kind::List, s).with_elem(subject.item()),
        ),
        "flatten" | "slice" => (
            s.saturating_add(11),
            Info::new(Kind::List, s).with_elem(unknown()),
        ),
        "first" | "last" => (1, subject.item()),
        "format" if target.is_some() => (factor(s, 0.1), unknown()),
        "string" => match args.first().map(|a| a.kind) {
            Some(Kind::Str | Kind::Bytes | Kind::Unknown) => {
                (factor(arg(0), 0.1), Info::new(Kind::Str, arg(0)))
            }
            _ => (1, Info::new(Kind::Str, 32)),
        },
        "bytes" => (factor(arg(0), 0.1), Info::new(Kind::Bytes, arg(0))),
        "dyn" => (1, args.first().copied().cloned().unwrap_or_else(unknown)),
        "int" | "uint" | "double" | "bool" | "timestamp" | "duration" | "type" => (1, scalar()),
        _ => (1, unknown()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::cel::compile;
    use serde_json::json;

    fn estimate(rule: &str, schema: Value) -> u64 {
        compile::parse(rule, |e| cost(e, &schema)).expect("compiles")
    }

    /// `library/cost.go`: `size()` is O(1) and a comparison with a short literal costs 1,
    /// so iterating named items costs the items, not the names' length.
    #[test]
    fn ordinary_rules_cost_little() {
        let items = json!({"type": "object", "properties": {"items": {"type": "array",
            "maxItems": 100, "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}});
        let c = estimate("self.items.all(i, i.name.size() < 10)", items.clone());
        assert!((500..2_000).contains(&c), "{c}");
        assert!(estimate("self.items.all(i, i.name == 'a')", items) < 2_000);
        let range = json!({"type": "object", "properties": {
            "min": {"type": "integer"}, "max": {"type": "integer"}}});
        assert!(estimate("self.min <= self.max", range) < 10);
    }

    /// `checker/cost.go`: comparing two unbounded strings traverses 3 MiB at 0.1 per byte.
    #[test]
    fn unbounded_strings_cost_their_traversal() {
        let s = json!({"type": "object", "properties": {
            "a": {"type": "string"}, "b": {"type": "string", "maxLength": 10}}});
        assert_eq!(estimate("self.a == self.a", s.clone()), 4 + 314_573);
        assert_eq!(estimate("self.a == self.b", s), 2 + 2 + 4);
    }

    /// `split` of a string of `n` bytes yields up to `n` parts: iterating the parts of a
    /// long string inside a loop over them is quadratic in its length.
    #[test]
    fn iterating_a_split_string_costs_its_length_squared() {
        let rule = "self.s.split('').all(x, self.s.split('').all(y, y.size() < 5))";
        let schema = |n: u64| json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": n}}});
        assert!(estimate(rule, schema(100_000)) > 1_000_000_000);
        let small = estimate(rule, schema(50));
        assert!((100_000..1_000_000).contains(&small), "{small}");
    }
}
