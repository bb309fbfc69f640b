//! An object's JSON as the CEL values a rule sees, as kube-cel converts it
//! (`validation/values.rs`, `json_to_cel_with_compiled`), from the schema:
//!
//! - a string of `format: date-time` is a timestamp, of `format: duration` a duration and
//!   of `format: byte` the bytes it encodes (each falling back to the string when it does
//!   not parse); `x-kubernetes-int-or-string` keeps strings as strings;
//! - numbers are `int` when they fit, then `uint`, else `double`;
//! - an object's property names are escaped as upstream's `model.Escape` (`__dash__`, ...),
//!   but not the keys of a map (`additionalProperties`), which are data;
//! - an `x-kubernetes-embedded-resource` object always has `apiVersion`, `kind` and
//!   `metadata`.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use kube_cel::cel::Value as Cel;
use kube_cel::cel::objects::{Key, Map};
use serde_json::Value;

/// How the values under one schema node convert (the part of kube-cel's `CompiledSchema`
/// the conversion reads).
#[derive(Debug, Default)]
pub(super) struct Conv {
    format: Format,
    properties: HashMap<String, Conv>,
    items: Option<Box<Conv>>,
    additional: Option<Box<Conv>>,
    /// `additionalProperties` is present and not `false`: keys are data, not escaped.
    is_map: bool,
    embedded: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Format {
    DateTime,
    Duration,
    Byte,
    #[default]
    None,
}

/// Deeper schemas are converted without their formats (kube-cel's `MAX_SCHEMA_DEPTH`).
const MAX_DEPTH: usize = 64;

impl Conv {
    /// The conversion for values under `schema`.
    pub(super) fn of(schema: &Value) -> Conv {
        Conv::at(schema, 0)
    }

    fn at(schema: &Value, depth: usize) -> Conv {
        if depth > MAX_DEPTH {
            return Conv::default();
        }
        let format = if schema["x-kubernetes-int-or-string"] == true {
            Format::None
        } else {
            match schema["format"].as_str() {
                Some("date-time") => Format::DateTime,
                Some("duration") => Format::Duration,
                Some("byte") => Format::Byte,
                _ => Format::None,
            }
        };
        let additional = schema.get("additionalProperties");
        Conv {
            format,
            properties: schema["properties"]
                .as_object()
                .map(|p| {
                    p.iter()
                        .map(|(k, v)| (k.clone(), Conv::at(v, depth + 1)))
                        .collect()
                })
                .unwrap_or_default(),
            items: schema
                .get("items")
                .map(|i| Box::new(Conv::at(i, depth + 1))),
            additional: additional
                .filter(|a| a.is_object())
                .map(|a| Box::new(Conv::at(a, depth + 1))),
            is_map: !matches!(additional, None | Some(Value::Bool(false))),
            embedded: schema["x-kubernetes-embedded-resource"] == true,
        }
    }
}

/// `value` as CEL sees it under `conv`. Recursion follows the JSON's nesting, which
/// `serde_json` bounds (128 levels) when it parses a request.
pub(super) fn to_cel(value: &Value, conv: Option<&Conv>) -> Cel {
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => number(n),
        Value::String(s) => string(s, conv.map_or(Format::None, |c| c.format)),
        Value::Array(items) => Cel::List(Arc::new(
            items
                .iter()
                .map(|item| to_cel(item, conv.and_then(|c| c.items.as_deref())))
                .collect(),
        )),
        Value::Object(map) => {
            let mut out = HashMap::with_capacity(map.len());
            for (k, v) in map {
                let child = conv.and_then(|c| c.properties.get(k).or(c.additional.as_deref()));
                let key = if conv.is_some_and(|c| c.is_map) {
                    k.clone()
                } else {
                    escape(k)
                };
                out.insert(Key::String(Arc::new(key)), to_cel(v, child));
            }
            if conv.is_some_and(|c| c.embedded) {
                for field in ["apiVersion", "kind"] {
                    out.entry(Key::String(Arc::new(field.to_owned())))
                        .or_insert_with(|| Cel::String(Arc::new(String::new())));
                }
                out.entry(Key::String(Arc::new("metadata".to_owned())))
                    .or_insert_with(|| {
                        Cel::Map(Map {
                            map: Arc::new(HashMap::new()),
                        })
                    });
            }
            Cel::Map(Map { map: Arc::new(out) })
        }
    }
}

fn number(n: &serde_json::Number) -> Cel {
    if let Some(i) = n.as_i64() {
        Cel::Int(i)
    } else if let Some(u) = n.as_u64() {
        Cel::UInt(u)
    } else {
        Cel::Float(n.as_f64().unwrap_or(f64::NAN))
    }
}

fn string(s: &str, format: Format) -> Cel {
    let parsed = match format {
        Format::DateTime => chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(Cel::Timestamp),
        Format::Duration => go_duration(s).map(Cel::Duration),
        Format::Byte => base64::engine::general_purpose::STANDARD
            .decode(s)
            .ok()
            .map(|b| Cel::Bytes(Arc::new(b))),
        Format::None => None,
    };
    parsed.unwrap_or_else(|| Cel::String(Arc::new(s.to_owned())))
}

/// A Go duration (`1h30m`, `-1.5s`, `300ms`, `0`), as kube-cel's `parse_go_duration`, but
/// `None` where that would overflow (kube-cel's sum overflows `i64`).
fn go_duration(input: &str) -> Option<chrono::Duration> {
    let (negative, mut rest) = match input.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, input),
    };
    if rest == "0" {
        return Some(chrono::Duration::zero());
    }
    let mut nanos: i64 = 0;
    let mut any = false;
    while !rest.is_empty() {
        let end = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        if end == 0 {
            return None;
        }
        let number: f64 = rest[..end].parse().ok()?;
        rest = &rest[end..];
        let (unit, len) = [
            ("ms", 1_000_000i64),
            ("us", 1_000),
            ("ns", 1),
            ("h", 3_600_000_000_000),
            ("m", 60_000_000_000),
            ("s", 1_000_000_000),
        ]
        .into_iter()
        .find_map(|(suffix, unit)| rest.starts_with(suffix).then_some((unit, suffix.len())))?;
        rest = &rest[len..];
        let part = (number * unit as f64).trunc();
        if !part.is_finite() || part.abs() >= i64::MAX as f64 {
            return None;
        }
        nanos = nanos.checked_add(part as i64)?;
        any = true;
    }
    if !any {
        return None;
    }
    Some(chrono::Duration::nanoseconds(if negative {
        nanos.checked_neg()?
    } else {
        nanos
    }))
}

/// Upstream's property-name escaping (`apiserver/pkg/cel/escaping.go`), as kube-cel's
/// `escape_field_name`.
fn escape(name: &str) -> String {
    const RESERVED: [&str; 21] = [
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if RESERVED.contains(&name) {
        return format!("__{name}__");
    }
    if !name.contains(['_', '.', '-', '/']) {
        return name.to_owned();
    }
    let mut out = String::with_capacity(name.len() * 2);
    for c in name.chars() {
        match c {
            '_' => out.push_str("__"),
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
    }
    out
}

/// A property name as the schema spells it, from its escaped form in a rule (`__dash__`
/// back to `-`, ...): for the cost estimate's walk of the schema.
pub(super) fn unescape(name: &str) -> String {
    if let Some(inner) = name
        .strip_prefix("__")
        .and_then(|n| n.strip_suffix("__"))
        .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_lowercase()))
    {
        return inner.to_owned();
    }
    name.replace("__dot__", ".")
        .replace("__dash__", "-")
        .replace("__slash__", "/")
        .replace("__", "_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(s: &str) -> Key {
        Key::String(Arc::new(s.to_owned()))
    }

    /// kube-cel's conversions: formats, escaping of properties but not of map keys,
    /// embedded resources.
    #[test]
    fn objects_convert_as_kube_cel_converts_them() {
        let schema = json!({"type": "object", "properties": {
            "at": {"type": "string", "format": "date-time"},
            "for": {"type": "string", "format": "duration"},
            "raw": {"type": "string", "format": "byte"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "embedded": {"type": "object", "x-kubernetes-embedded-resource": true},
        }});
        let conv = Conv::of(&schema);
        let v = to_cel(
            &json!({"at": "2024-01-02T03:04:05Z", "for": "1h30m", "raw": "aGk=",
                "labels": {"a-b": "c"}, "embedded": {}, "x-y": 1}),
            Some(&conv),
        );
        let Cel::Map(m) = v else { panic!("{v:?}") };
        assert!(matches!(m.map[&key("at")], Cel::Timestamp(_)));
        assert_eq!(
            m.map[&key("__for__")],
            Cel::Duration(chrono::Duration::minutes(90))
        );
        assert_eq!(m.map[&key("raw")], Cel::Bytes(Arc::new(b"hi".to_vec())));
        let Cel::Map(labels) = &m.map[&key("labels")] else {
            panic!()
        };
        assert!(labels.map.contains_key(&key("a-b")));
        assert!(m.map.contains_key(&key("x__dash__y")));
        let Cel::Map(embedded) = &m.map[&key("embedded")] else {
            panic!()
        };
        assert_eq!(embedded.map.len(), 3);
    }

    /// A duration that does not parse, or would overflow, stays a string.
    #[test]
    fn a_bad_duration_stays_a_string() {
        assert_eq!(
            go_duration("-1.5s"),
            Some(chrono::Duration::milliseconds(-1500))
        );
        assert_eq!(go_duration("0"), Some(chrono::Duration::zero()));
        assert_eq!(go_duration("1x"), None);
        assert_eq!(go_duration("99999999999999999h"), None);
        assert_eq!(go_duration("2000000h2000000h"), None);
    }

    /// Escaping round-trips for the estimate's schema walk.
    #[test]
    fn escaped_names_unescape() {
        for name in ["namespace", "a-b", "a.b/c", "x_y", "plain"] {
            assert_eq!(unescape(&escape(name)), name);
        }
    }
}
