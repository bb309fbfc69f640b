//! Label and field selectors, parsed and matched as kube-apiserver does.

use std::collections::BTreeSet;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
    GreaterThan(String, i64),
    LessThan(String, i64),
}

/// A parsed `labelSelector`: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// A selector that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {0}")]
pub struct SelectorError(pub String);

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_set(s: &str) -> Result<BTreeSet<String>, SelectorError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(format!("expected a parenthesised set, found {s:?}")))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect())
}

fn check_key(key: &str) -> Result<String, SelectorError> {
    let key = key.trim();
    if key.is_empty() || !super::meta::is_qualified_name(key) {
        return Err(SelectorError(format!("invalid label key {key:?}")));
    }
    Ok(key.to_owned())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h,i>3`.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(LabelSelector::default());
        }
        let mut reqs = Vec::new();
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(SelectorError(format!("empty requirement in {s:?}")));
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelRequirement::DoesNotExist(check_key(key)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelRequirement::NotEquals(check_key(k)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelRequirement::Equals(check_key(k)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelRequirement::Equals(check_key(k)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(check_key(k)?, parse_set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelRequirement::In(check_key(k)?, parse_set(v)?)
            } else if let Some((k, v)) = part.split_once('>') {
                let n = v
                    .trim()
                    .parse()
                    .map_err(|_| SelectorError(format!("{v:?} is not an integer")))?;
                LabelRequirement::GreaterThan(check_key(k)?, n)
            } else if let Some((k, v)) = part.split_once('<') {
                let n = v
                    .trim()
                    .parse()
                    .map_err(|_| SelectorError(format!("{v:?} is not an integer")))?;
                LabelRequirement::LessThan(check_key(k)?, n)
            } else {
                LabelRequirement::Exists(check_key(part)?)
            };
            if let LabelRequirement::Equals(_, v) | LabelRequirement::NotEquals(_, v) = &req
                && !super::meta::is_label_value(v)
            {
                return Err(SelectorError(format!("invalid label value {v:?}")));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|req| match req {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            LabelRequirement::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::DoesNotExist(k) => get(k).is_none(),
            LabelRequirement::GreaterThan(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            LabelRequirement::LessThan(k, n) => get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value` or `path!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses a field selector. `\,` `\=` and `\\` escape, as upstream.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(FieldSelector::default());
        }
        let mut terms = Vec::new();
        for part in split_escaped(s, ',') {
            let (path, equal, value) = if let Some((p, v)) = part.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = part.split_once("==") {
                (p, true, v)
            } else if let Some((p, v)) = part.split_once('=') {
                (p, true, v)
            } else {
                return Err(SelectorError(format!(
                    "invalid field selector {part:?}: expected path=value"
                )));
            };
            terms.push((path.trim().to_owned(), equal, unescape(value)));
        }
        Ok(FieldSelector(terms))
    }

    /// The paths the selector uses.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(p, _, _)| p.as_str())
    }

    /// Whether `value_of(path)` satisfies every term. An absent field reads as `""`.
    pub fn matches(&self, value_of: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|(path, equal, want)| {
            let got = value_of(path).unwrap_or_default();
            (got == *want) == *equal
        })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

fn split_escaped(s: &str, sep: char) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                parts.last_mut().expect("non-empty").push(c);
                if let Some(next) = chars.next() {
                    parts.last_mut().expect("non-empty").push(next);
                }
            }
            c if c == sep => parts.push(String::new()),
            c => parts.last_mut().expect("non-empty").push(c),
        }
    }
    parts
}

fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"zone": "a", "tier": "web", "n": "5"}));
        for (sel, want) in [
            ("zone=a", true),
            ("zone==a,tier=web", true),
            ("zone!=a", false),
            ("zone in (a,b)", true),
            ("zone notin (a)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("n>4", true),
            ("n<5", false),
            ("zone in (b, c),tier", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("a=b=c").is_err());
        assert!(LabelSelector::parse("zone in a").is_err());
        assert!(LabelSelector::parse(",").is_err());
    }

    #[test]
    fn field_selector_terms() {
        let sel =
            FieldSelector::parse("spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed")
                .unwrap();
        let value = |phase: &'static str| {
            move |p: &str| match p {
                "spec.nodeName" => Some("n1".to_owned()),
                "status.phase" => Some(phase.to_owned()),
                _ => None,
            }
        };
        assert!(sel.matches(value("Running")));
        assert!(!sel.matches(value("Failed")));
        // kubectl describe node asks for an empty namespace.
        let ns = FieldSelector::parse("involvedObject.namespace=").unwrap();
        assert!(ns.matches(|_| None));
        assert!(FieldSelector::parse("nonsense").is_err());
        let escaped = FieldSelector::parse(r"metadata.name=a\,b").unwrap();
        assert!(escaped.matches(|_| Some("a,b".into())));
    }
}
