//! Strict decoding of a request body: its duplicate fields next to its unknown ones, in
//! upstream's order and words.
//!
//! kube-apiserver decodes bodies with `sigs.k8s.io/json`'s strict options
//! (`DisallowUnknownFields`, `DisallowDuplicateFields`): as it decodes, it notes an
//! `unknown field "a.b"` for a member the type does not have (and does not look inside it)
//! and a `duplicate field "a.b"` for a member seen before in the same object, each noted once
//! and at most [`MAX_FINDINGS`] in all; `runtime.NewStrictDecodingError` joins them in the
//! order met, `strict decoding error: unknown field "spec.foo", duplicate field
//! "spec.replicas"`. A custom resource is decoded as unstructured JSON first (every
//! duplicate, in order), then pruned (its unknown fields after them).
//!
//! `serde_json` keeps the last of duplicate members silently, so duplicates are found by a
//! pass over the raw body ([`typed_findings`], [`duplicate_fields`]). The pass is
//! iterative, linear in the body (each member's key is hashed once, the current path is
//! grown and cut back, never rebuilt), and runs only on a body `serde_json` has already
//! parsed (so nested at most 128 deep); anything it does not expect ends it quietly.
//! Its one blind spot: an unknown field only in an earlier copy of a duplicated object
//! (which the decoded value no longer holds) is not reported.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// The most findings reported (`saveStrictError` stops accumulating at 100).
pub(crate) const MAX_FINDINGS: usize = 100;
/// The most bytes of paths reported in all: a body of long keys nested deep cannot make
/// an answer (or warnings) of hundreds of megabytes.
const MAX_FINDING_BYTES: usize = 256 * 1024;

/// The unknown members of a decoded body, as a tree of its paths.
#[derive(Debug, Default)]
struct Unknown {
    /// Whether this member is itself unknown.
    here: bool,
    /// Members below, by key.
    keys: HashMap<String, Unknown>,
    /// Items below, by index.
    items: HashMap<usize, Unknown>,
}

impl Unknown {
    /// The members of `given` that its typed round trip `known` lost (not counting explicit
    /// nulls, which carry no data): the rule of `registry::unknown_fields`.
    fn of(given: &Value, known: &Value) -> Option<Unknown> {
        let mut tree = Unknown::default();
        match (given, known) {
            (Value::Object(g), Value::Object(k)) => {
                for (key, value) in g {
                    let child = match k.get(key) {
                        Some(known) => Unknown::of(value, known),
                        None if value.is_null() => None,
                        None => Some(Unknown {
                            here: true,
                            ..Unknown::default()
                        }),
                    };
                    if let Some(child) = child {
                        tree.keys.insert(key.clone(), child);
                    }
                }
            }
            (Value::Array(g), Value::Array(k)) => {
                for (i, (g, k)) in g.iter().zip(k).enumerate() {
                    if let Some(child) = Unknown::of(g, k) {
                        tree.items.insert(i, child);
                    }
                }
            }
            _ => {}
        }
        (!tree.keys.is_empty() || !tree.items.is_empty()).then_some(tree)
    }
}

/// The findings of a typed (built-in) object's strict decoding, in upstream's order: a
/// pass over `raw`, the body `given` was decoded from, reporting its unknown members (the
/// members `known`, `given`'s typed round trip, lacks) where they stand, without looking
/// inside them, and its duplicate members where they repeat. Each is `unknown field "…"`
/// or `duplicate field "…"`.
pub(crate) fn typed_findings(raw: &[u8], given: &Value, known: &Value) -> Vec<String> {
    let tree = Unknown::of(given, known);
    let mut findings = Findings::default();
    scan(raw, tree.as_ref(), true, &mut findings);
    // Whatever the pass did not meet (a member the decoded value got elsewhere than from
    // the body) is reported after, as the unknown fields were before duplicates counted.
    for path in core_cluster_machinery::registry::unknown_fields(given, known) {
        findings.add(Kind::Unknown, &path);
    }
    findings.list
}

/// The duplicate members of `raw` anywhere, in order (a custom resource's unstructured
/// decoding), each `duplicate field "…"`.
pub(crate) fn duplicate_fields(raw: &[u8]) -> Vec<String> {
    let mut findings = Findings::default();
    scan(raw, None, false, &mut findings);
    findings.list
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Unknown,
    Duplicate,
}

/// What was found: each finding once, in order, within the bounds.
#[derive(Default)]
struct Findings {
    list: Vec<String>,
    seen: HashSet<(Kind, String)>,
    bytes: usize,
}

impl Findings {
    /// Whether no more findings are taken.
    fn full(&self) -> bool {
        self.list.len() >= MAX_FINDINGS || self.bytes >= MAX_FINDING_BYTES
    }

    fn add(&mut self, kind: Kind, path: &str) {
        if self.full() || self.seen.contains(&(kind, path.to_owned())) {
            return;
        }
        self.seen.insert((kind, path.to_owned()));
        self.bytes += path.len();
        self.list.push(match kind {
            Kind::Unknown => format!("unknown field {}", quote(path)),
            Kind::Duplicate => format!("duplicate field {}", quote(path)),
        });
    }
}

/// Go's `%q` of a path, as `strictError.Error` quotes it (JSON's quoting, which agrees for
/// everything a JSON key can hold but control and non-ASCII characters).
pub(crate) fn quote(path: &str) -> String {
    serde_json::to_string(path).unwrap_or_else(|_| format!("\"{path}\""))
}

/// An open container of the pass.
struct Frame<'t> {
    /// Keys met so far (objects).
    seen: HashSet<String>,
    /// Whether this is an array (else an object).
    array: bool,
    /// The next item's index (arrays).
    index: usize,
    /// The unknown members under this container, if any.
    tree: Option<&'t Unknown>,
    /// Inside an unknown member: nothing is reported.
    quiet: bool,
    /// The path's length before the current member or item was appended.
    base: usize,
}

/// Where the pass stands.
enum Step {
    /// At a value.
    Value,
    /// After an object's `{` or a member's `,`: a key (or, first, the `}`).
    Key { first: bool },
    /// After an array's `[`: an item or the `]`.
    FirstItem,
    /// After a value: the `,` or the close of its container.
    After,
}

/// The pass over `raw` (see the [module](self) docs). `tree` holds the unknown members
/// and `typed` says whether they are skipped (a typed decoding) rather than looked into.
fn scan(raw: &[u8], tree: Option<&Unknown>, typed: bool, findings: &mut Findings) {
    let mut bytes = Cursor { raw, pos: 0 };
    let mut stack: Vec<Frame<'_>> = Vec::new();
    let mut path = String::new();
    // The unknown members and quietness of the value about to be read.
    let (mut here_tree, mut here_quiet) = (tree, false);
    let mut step = Step::Value;
    loop {
        if findings.full() {
            return;
        }
        match step {
            Step::Value => match bytes.next_non_space() {
                Some(b'{') => {
                    bytes.pos += 1;
                    stack.push(Frame {
                        seen: HashSet::new(),
                        array: false,
                        index: 0,
                        tree: here_tree,
                        quiet: here_quiet,
                        base: path.len(),
                    });
                    step = Step::Key { first: true };
                }
                Some(b'[') => {
                    bytes.pos += 1;
                    stack.push(Frame {
                        seen: HashSet::new(),
                        array: true,
                        index: 0,
                        tree: here_tree,
                        quiet: here_quiet,
                        base: path.len(),
                    });
                    step = Step::FirstItem;
                }
                Some(b'"') => {
                    if bytes.string().is_none() {
                        return;
                    }
                    step = Step::After;
                }
                Some(_) => {
                    bytes.scalar();
                    step = Step::After;
                }
                None => return,
            },
            Step::Key { first } => {
                match bytes.next_non_space() {
                    Some(b'}') if first => {
                        bytes.pos += 1;
                        stack.pop();
                        step = Step::After;
                        continue;
                    }
                    Some(b'"') => {}
                    _ => return,
                }
                let Some(key) = bytes.string() else {
                    return;
                };
                if bytes.next_non_space() != Some(b':') {
                    return;
                }
                bytes.pos += 1;
                let Some(frame) = stack.last_mut() else {
                    return;
                };
                frame.base = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(&key);
                let child = frame.tree.and_then(|t| t.keys.get(key.as_ref()));
                here_quiet = frame.quiet;
                here_tree = child;
                if frame.quiet {
                    // Inside an unknown member of a typed object: not looked at.
                } else if typed && child.is_some_and(|c| c.here) {
                    findings.add(Kind::Unknown, &path);
                    here_quiet = true;
                } else if !frame.seen.insert(key.into_owned()) {
                    findings.add(Kind::Duplicate, &path);
                }
                step = Step::Value;
            }
            Step::FirstItem => {
                if bytes.next_non_space() == Some(b']') {
                    bytes.pos += 1;
                    stack.pop();
                    step = Step::After;
                    continue;
                }
                let Some(frame) = stack.last_mut() else {
                    return;
                };
                enter_item(frame, &mut path, &mut here_tree, &mut here_quiet);
                step = Step::Value;
            }
            Step::After => {
                let Some(frame) = stack.last_mut() else {
                    return;
                };
                path.truncate(frame.base);
                match (bytes.next_non_space(), frame.array) {
                    (Some(b','), false) => {
                        bytes.pos += 1;
                        step = Step::Key { first: false };
                    }
                    (Some(b','), true) => {
                        bytes.pos += 1;
                        frame.index += 1;
                        enter_item(frame, &mut path, &mut here_tree, &mut here_quiet);
                        step = Step::Value;
                    }
                    (Some(b'}'), false) | (Some(b']'), true) => {
                        bytes.pos += 1;
                        stack.pop();
                        step = Step::After;
                    }
                    _ => return,
                }
            }
        }
    }
}

/// Appends the current item's index to the path and finds its unknown members.
fn enter_item<'t>(
    frame: &Frame<'t>,
    path: &mut String,
    here_tree: &mut Option<&'t Unknown>,
    here_quiet: &mut bool,
) {
    use std::fmt::Write as _;
    let _ = write!(path, "[{}]", frame.index);
    *here_tree = frame.tree.and_then(|t| t.items.get(&frame.index));
    *here_quiet = frame.quiet;
}

/// The body and a position in it.
struct Cursor<'a> {
    raw: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    /// The next byte that is not JSON white space (not consumed).
    fn next_non_space(&mut self) -> Option<u8> {
        while let Some(&b) = self.raw.get(self.pos) {
            if !matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(b);
            }
            self.pos += 1;
        }
        None
    }

    /// The string starting at the position (its opening quote), unescaped; the position
    /// moves past it.
    fn string(&mut self) -> Option<std::borrow::Cow<'a, str>> {
        let start = self.pos;
        let mut i = start + 1;
        let mut escaped = false;
        loop {
            match self.raw.get(i)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    i += 2;
                }
                _ => i += 1,
            }
        }
        self.pos = i + 1;
        let quoted = self.raw.get(start..=i)?;
        if escaped {
            serde_json::from_slice::<String>(quoted)
                .ok()
                .map(std::borrow::Cow::Owned)
        } else {
            std::str::from_utf8(quoted.get(1..quoted.len() - 1)?)
                .ok()
                .map(std::borrow::Cow::Borrowed)
        }
    }

    /// Skips a number, `true`, `false` or `null`.
    fn scalar(&mut self) {
        while let Some(&b) = self.raw.get(self.pos) {
            if matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                return;
            }
            self.pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What a typed decoding reports for `body`, given the members its type knows.
    fn typed(body: &str, known: Value) -> Vec<String> {
        let given: Value = serde_json::from_str(body).unwrap();
        typed_findings(body.as_bytes(), &given, &known)
    }

    /// sigs.k8s.io/json (`DisallowUnknownFields`, `DisallowDuplicateFields`): the findings
    /// in the order the decoder meets them; an unknown member neither looked into nor
    /// counted as seen; each finding once; paths with `.key` and `[index]`.
    #[test]
    fn unknown_and_duplicate_fields_are_reported_as_met() {
        // The e2e spec's Deployment: `unknown field "spec.unknownField", duplicate field
        // "spec.replicas"`.
        let body = r#"{"spec": {"unknownField": "foo", "replicas": 2, "replicas": 3,
            "template": {"spec": {"containers": [{"name": "a", "name": "b", "x": {"y": 1, "y": 2}}]}}}}"#;
        let known = json!({"spec": {"replicas": 3,
            "template": {"spec": {"containers": [{"name": "b"}]}}}});
        assert_eq!(
            typed(body, known),
            [
                r#"unknown field "spec.unknownField""#,
                r#"duplicate field "spec.replicas""#,
                r#"duplicate field "spec.template.spec.containers[0].name""#,
                r#"unknown field "spec.template.spec.containers[0].x""#,
            ]
        );
        // An unknown member repeated is one unknown field, not a duplicate.
        let known = json!({"data": {"a": "2"}});
        assert_eq!(
            typed(
                r#"{"foo": 1, "foo": 2, "data": {"a": "1", "a": "2"}}"#,
                known
            ),
            [r#"unknown field "foo""#, r#"duplicate field "data.a""#]
        );
        // Escaped keys compare unescaped; nulls are not unknown.
        let known = json!({"kind": "ConfigMap"});
        assert_eq!(
            typed(
                r#"{"kind": "ConfigMap", "\u006bind": "ConfigMap", "gone": null}"#,
                known
            ),
            [r#"duplicate field "kind""#]
        );
        assert!(
            typed(
                r#"{"a": [1, {"b": 2}], "c": "}"}"#,
                json!({"a": [1, {"b": 2}], "c": "}"})
            )
            .is_empty()
        );
    }

    /// A custom resource's unstructured decoding finds duplicates everywhere, unknown
    /// members included (their pruning comes after).
    #[test]
    fn a_custom_resource_reports_every_duplicate() {
        let body = r#"{"spec": {"a": 1, "a": 2, "free": {"x": 1, "x": 2}, "zz": {"q": [{"r": 1, "r": 1}]}}}"#;
        assert_eq!(
            duplicate_fields(body.as_bytes()),
            [
                r#"duplicate field "spec.a""#,
                r#"duplicate field "spec.free.x""#,
                r#"duplicate field "spec.zz.q[0].r""#,
            ]
        );
    }

    /// At most a hundred findings, as `saveStrictError` keeps; a body that ends early or is
    /// not JSON ends the pass without a panic.
    #[test]
    fn findings_are_bounded_and_bad_input_is_harmless() {
        let members: Vec<String> = (0..300)
            .map(|i| format!("\"k{i}\": 1, \"k{i}\": 2"))
            .collect();
        let body = format!("{{{}}}", members.join(", "));
        assert_eq!(duplicate_fields(body.as_bytes()).len(), MAX_FINDINGS);
        for bad in [
            "",
            "{",
            "{\"a\"",
            "{\"a\": [1,",
            "]]]",
            "{\"a\\",
            "\u{7f}",
            "{\"a\":1}}}",
        ] {
            let _ = duplicate_fields(bad.as_bytes());
        }
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(duplicate_fields(deep.as_bytes()).is_empty());
    }
}
