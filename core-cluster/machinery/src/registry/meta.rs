//! Object metadata rules shared by every resource: names, system fields, timestamps,
//! finalizers and owner references, as kube-apiserver enforces them.

use serde_json::{Value, json};

use crate::registry::FieldError;

/// The largest DNS-1123 subdomain.
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;
/// The largest DNS-1123 label.
pub const DNS1123_LABEL_MAX: usize = 63;

/// Which name rule a resource's names follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain (most resources, Node names included).
    Subdomain,
    /// DNS-1123 label (namespaces, services).
    Label,
    /// Any path segment: not `.` or `..`, no `/` or `%` (RBAC roles and bindings, whose names
    /// are `system:node` and the like; upstream's `path.IsValidPathSegmentName`).
    PathSegment,
}

fn is_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_label_bytes(b: &[u8]) -> bool {
    !b.is_empty()
        && b.len() <= DNS1123_LABEL_MAX
        && is_alnum(b[0])
        && is_alnum(b[b.len() - 1])
        && b.iter().all(|c| is_alnum(*c) || *c == b'-')
}

/// The problems with `name` under `rule`, worded as upstream does.
pub fn validate_name(name: &str, rule: NameRule) -> Vec<String> {
    let mut errors = Vec::new();
    match rule {
        NameRule::Subdomain => {
            if name.len() > DNS1123_SUBDOMAIN_MAX {
                errors.push(format!(
                    "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
                ));
            }
            if !is_subdomain_chars(name) {
                errors.push("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_owned());
            }
        }
        NameRule::Label => {
            if name.len() > DNS1123_LABEL_MAX {
                errors.push(format!(
                    "must be no more than {DNS1123_LABEL_MAX} characters"
                ));
            }
            // The characters are checked on the first 63 bytes (the length error covers the
            // rest); bytes, not a `str` slice, so a multibyte character across byte 63
            // cannot split a character.
            let head = &name.as_bytes()[..name.len().min(DNS1123_LABEL_MAX)];
            if !is_label_bytes(head) || name.contains('.') {
                errors.push("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_owned());
            }
        }
        NameRule::PathSegment => {
            if name == "." || name == ".." {
                errors.push(format!("may not be '{name}'"));
            }
            for bad in ["/", "%"] {
                if name.contains(bad) {
                    errors.push(format!("may not contain '{bad}'"));
                }
            }
        }
    }
    errors
}

/// Whether `s` is a qualified name (`[prefix/]name`), as label keys and finalizers must be
/// ([`qualified_name_errors`] finds nothing).
pub fn is_qualified_name(s: &str) -> bool {
    qualified_name_errors(s).is_empty()
}

/// Whether `b` matches a qualified name's name part, `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_qualified_name_part(b: &[u8]) -> bool {
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Upstream's `RegexError`: `msg (e.g. 'a',  or 'b', regex used for validation is 'fmt')`.
pub fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let quoted: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{fmt}')",
        quoted.join(" or ")
    )
}

/// Whether `s` matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`.
fn is_subdomain_chars(s: &str) -> bool {
    s.split('.').all(|part| {
        let b = part.as_bytes();
        !b.is_empty()
            && is_alnum(b[0])
            && is_alnum(b[b.len() - 1])
            && b.iter().all(|c| is_alnum(*c) || *c == b'-')
    })
}

/// The problems with a qualified name (a label key: `[prefix/]name`), worded as upstream's
/// `IsQualifiedName` (`k8s.io/apimachinery/pkg/api/validate/content`, `IsLabelKey`).
pub fn qualified_name_errors(value: &str) -> Vec<String> {
    const NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
    const NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
    const EXAMPLES: [&str; 3] = ["MyName", "my.name", "123-abc"];
    let mut errors = Vec::new();
    let mut parts = value.splitn(3, '/');
    let name = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, _) => name,
        (Some(prefix), Some(name), None) => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                if prefix.len() > DNS1123_SUBDOMAIN_MAX {
                    errors.push(format!(
                        "prefix part must be no more than {DNS1123_SUBDOMAIN_MAX} bytes"
                    ));
                }
                if !is_subdomain_chars(prefix) {
                    errors.push(format!(
                        "prefix part {}",
                        regex_error(
                            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
                            "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                            &["example.com"],
                        )
                    ));
                }
            }
            name
        }
        _ => {
            return vec![format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(NAME_MSG, NAME_FMT, &EXAMPLES)
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > DNS1123_LABEL_MAX {
        errors.push(format!(
            "name part must be no more than {DNS1123_LABEL_MAX} bytes"
        ));
    }
    if !is_qualified_name_part(name.as_bytes()) {
        errors.push(format!(
            "name part {}",
            regex_error(NAME_MSG, NAME_FMT, &EXAMPLES)
        ));
    }
    errors
}

/// The problems with a ConfigMap or Secret key, worded as upstream's `IsConfigMapKey`: at
/// most 253 characters of `[-._a-zA-Z0-9]`, and not `.`, `..` or anything starting `..`.
pub fn config_map_key_errors(key: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if key.len() > DNS1123_SUBDOMAIN_MAX {
        errors.push(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters"
        ));
    }
    let valid = !key.is_empty()
        && key
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if !valid {
        errors.push(regex_error(
            "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
            "[-._a-zA-Z0-9]+",
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if key == "." {
        errors.push("must not be '.'".to_owned());
    } else if key == ".." {
        errors.push("must not be '..'".to_owned());
    } else if key.starts_with("..") {
        errors.push("must not start with '..'".to_owned());
    }
    errors
}

/// Upstream `metav1validation.ValidateConditions` of a `metav1.Condition` list at `path`:
/// types are unique qualified names, statuses `True`, `False` or `Unknown`, a
/// non-negative observed generation, a transition time, a reason of
/// `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?` up to 1024 bytes and a message up to 32 KiB.
pub fn validate_conditions(conditions: &Value, path: &str) -> Vec<FieldError> {
    const MAX_REASON: usize = 1024;
    const MAX_MESSAGE: usize = 32 * 1024;
    let mut errors = Vec::new();
    let mut types: Vec<&str> = Vec::new();
    for (i, c) in conditions.as_array().into_iter().flatten().enumerate() {
        let at = |field: &str| format!("{path}[{i}].{field}");
        let type_ = c["type"].as_str().unwrap_or("");
        if types.contains(&type_) {
            errors.push(FieldError::duplicate(at("type"), &json!(type_)));
        } else {
            types.push(type_);
        }
        for message in qualified_name_errors(type_) {
            errors.push(FieldError::invalid(at("type"), &json!(type_), message));
        }
        let status = c["status"].as_str().unwrap_or("");
        if !matches!(status, "True" | "False" | "Unknown") {
            errors.push(FieldError::not_supported(
                at("status"),
                &json!(status),
                &["False", "True", "Unknown"],
            ));
        }
        if let Some(generation) = c["observedGeneration"].as_i64()
            && generation < 0
        {
            errors.push(FieldError::invalid(
                at("observedGeneration"),
                &json!(generation),
                "must be greater than or equal to zero",
            ));
        }
        if is_zero_time(&c["lastTransitionTime"]) {
            errors.push(FieldError::required(at("lastTransitionTime"), ""));
        }
        let reason = c["reason"].as_str().unwrap_or("");
        if reason.is_empty() {
            errors.push(FieldError::required(at("reason"), ""));
        } else {
            let b = reason.as_bytes();
            let valid = b[0].is_ascii_alphabetic()
                && (b.len() == 1
                    || ((b[b.len() - 1].is_ascii_alphanumeric() || b[b.len() - 1] == b'_')
                        && b.iter().all(|c| {
                            c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':')
                        })));
            if !valid {
                errors.push(FieldError::invalid(
                    at("reason"),
                    &json!(reason),
                    regex_error(
                        "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_'",
                        "[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?",
                        &["my_name", "MY_NAME", "MyName", "ReasonA,ReasonB", "ReasonA:ReasonB"],
                    ),
                ));
            }
            if reason.len() > MAX_REASON {
                errors.push(FieldError::too_long(at("reason"), MAX_REASON));
            }
        }
        if c["message"].as_str().map_or(0, str::len) > MAX_MESSAGE {
            errors.push(FieldError::too_long(at("message"), MAX_MESSAGE));
        }
    }
    errors
}

/// Whether a time is Go's zero time: unset, or written as the year 1.
pub fn is_zero_time(v: &Value) -> bool {
    match v.as_str() {
        None => true,
        Some(t) => t.is_empty() || t.starts_with("0001-01-01T00:00:00"),
    }
}

/// Whether `s` is a valid label value (empty, or up to 63 characters of `[A-Za-z0-9_.-]`,
/// starting and ending alphanumeric).
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

/// Now, as an RFC 3339 timestamp with second precision (`metav1.Time`).
pub fn now_rfc3339() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}

/// Now, with microseconds (`metav1.MicroTime`).
pub fn now_micro() -> String {
    let now = jiff::Timestamp::now();
    now.strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string()
}

/// Seconds since the epoch of an RFC 3339 timestamp.
pub fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// A new UID.
pub fn new_uid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `generateName` + 5 random characters from upstream's alphabet, cut to 63.
pub fn generate_name(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let prefix: String = prefix.chars().take(58).collect();
    let suffix: String = (0..5)
        .map(|_| ALPHABET[fastrand::usize(..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{suffix}")
}

/// The string at a dotted path (`metadata.name`), if present.
pub fn str_at<'a>(obj: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(obj, |v, k| v.get(k))
        .and_then(Value::as_str)
}

/// The object's `metadata` as a mutable map, created if absent.
pub fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("metadata is an object")
}

/// Checks the metadata rules that apply to every write: label keys and values, annotation
/// size, finalizer names, owner references.
pub fn validate_object_meta(obj: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let meta = &obj["metadata"];
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        // `ValidateLabels`: every message of `IsQualifiedName` and `IsValidLabelValue`, with
        // the examples and the regex upstream's messages carry.
        for (k, v) in labels {
            for message in qualified_name_errors(k) {
                errors.push(FieldError::invalid("metadata.labels", &json!(k), message));
            }
            match v.as_str() {
                Some(v) if is_label_value(v) => {}
                _ => errors.push(FieldError::invalid(
                    "metadata.labels",
                    v,
                    regex_error(
                        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                        "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
                        &["MyValue", "my_value", "12345"],
                    ),
                )),
            }
        }
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        let total: usize = annotations
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum();
        if total > 256 * 1024 {
            errors.push(FieldError {
                reason: "FieldValueTooLong",
                field: "metadata.annotations".into(),
                message: "Too long: must have at most 262144 bytes".into(),
            });
        }
        for k in annotations.keys() {
            for message in qualified_name_errors(k) {
                errors.push(FieldError::invalid(
                    "metadata.annotations",
                    &json!(k),
                    message,
                ));
            }
        }
    }
    if let Some(finalizers) = meta.get("finalizers").and_then(Value::as_array) {
        let names: Vec<&str> = finalizers.iter().filter_map(Value::as_str).collect();
        for (i, f) in names.iter().enumerate() {
            if !is_qualified_name(f) {
                errors.push(FieldError::invalid(
                    format!("metadata.finalizers[{i}]"),
                    &json!(f),
                    "name part must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
        }
        if names.contains(&"orphan") && names.contains(&"foregroundDeletion") {
            errors.push(FieldError::invalid(
                "metadata.finalizers",
                &json!(names),
                "finalizer orphan and foregroundDeletion cannot be both set",
            ));
        }
    }
    if let Some(owners) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for (i, owner) in owners.iter().enumerate() {
            for field in ["apiVersion", "kind", "name", "uid"] {
                if owner
                    .get(field)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                {
                    errors.push(FieldError::required(
                        format!("metadata.ownerReferences[{i}].{field}"),
                        "",
                    ));
                }
            }
            if owner["apiVersion"] == "v1" && owner["kind"] == "Event" {
                errors.push(FieldError::invalid(
                    format!("metadata.ownerReferences[{i}]"),
                    owner,
                    "v1/Event may not be an owner",
                ));
            }
            if owner.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errors.push(FieldError::invalid(
                "metadata.ownerReferences",
                &Value::Array(owners.clone()),
                "Only one reference can have Controller set to true",
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subdomain_names() {
        assert!(validate_name("node-1.example.com", NameRule::Subdomain).is_empty());
        assert!(!validate_name("Node-1", NameRule::Subdomain).is_empty());
        assert!(!validate_name("-a", NameRule::Subdomain).is_empty());
        assert!(!validate_name("a..b", NameRule::Subdomain).is_empty());
        assert!(!validate_name(&"a".repeat(254), NameRule::Subdomain).is_empty());
        assert!(validate_name(&"a".repeat(253), NameRule::Subdomain).is_empty());
    }

    #[test]
    fn label_names() {
        assert!(validate_name("kube-system", NameRule::Label).is_empty());
        assert!(validate_name("system:node", NameRule::PathSegment).is_empty());
        assert_eq!(
            validate_name("a/b", NameRule::PathSegment),
            ["may not contain '/'"]
        );
        assert!(!validate_name("a.b", NameRule::Label).is_empty());
        assert!(!validate_name(&"a".repeat(64), NameRule::Label).is_empty());
    }

    /// A multibyte character across byte 63 is an error, not a panic.
    #[test]
    fn multibyte_characters_across_the_label_limit() {
        for prefix in 60..64 {
            let name = format!("{}é", "a".repeat(prefix));
            assert!(!validate_name(&name, NameRule::Label).is_empty(), "{name}");
            assert!(
                !validate_name(&name, NameRule::Subdomain).is_empty(),
                "{name}"
            );
        }
    }

    #[test]
    fn qualified_names() {
        assert!(is_qualified_name("kubernetes.io/hostname"));
        assert!(is_qualified_name("app"));
        assert!(!is_qualified_name("/app"));
        assert!(!is_qualified_name("Bad Prefix/app"));
        assert!(is_label_value(""));
        assert!(!is_label_value("-x"));
    }

    #[test]
    fn generated_names_have_five_random_characters() {
        let name = generate_name("web-");
        assert_eq!(name.len(), 9);
        assert!(name.starts_with("web-"));
        assert_eq!(generate_name(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn owner_reference_rules() {
        let obj = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "a", "uid": "1", "controller": true},
            {"apiVersion": "v1", "kind": "Node", "name": "b", "uid": "", "controller": true}
        ]}});
        let errors = validate_object_meta(&obj);
        assert!(
            errors
                .iter()
                .any(|e| e.field == "metadata.ownerReferences[1].uid")
        );
        assert!(
            errors
                .iter()
                .any(|e| e.message.contains("Only one reference"))
        );
    }

    #[test]
    fn timestamps_have_second_precision() {
        let t = now_rfc3339();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
        assert!(parse_time(&t).is_some());
    }
}
