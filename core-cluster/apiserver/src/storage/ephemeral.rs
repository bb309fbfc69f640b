//! A pod's `ephemeralcontainers` subresource (upstream's `EphemeralContainersREST`, used by
//! `kubectl debug`): a write takes only `spec.ephemeralContainers` from the request
//! (`pkg/registry/core/pod/strategy.go dropNonEphemeralContainerUpdates`), and existing
//! ephemeral containers may be neither removed nor changed
//! (`pkg/apis/core/validation/validation.go ValidatePodEphemeralContainersUpdate`), each new
//! one validated as `validateEphemeralContainers` does.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::registry::FieldError;

/// The subresource's name.
pub(crate) const SUBRESOURCE: &str = "ephemeralcontainers";

/// The fields an ephemeral container may not set (everything outside upstream's
/// `allowedEphemeralContainerFields`: ports, probes, lifecycle, resources).
const FORBIDDEN_FIELDS: [&str; 8] = [
    "ports",
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "lifecycle",
    "resources",
    "resizePolicy",
    "restartPolicy",
];

/// The stored pod `current` with the written object's ephemeral containers, and nothing
/// else of it (`dropNonEphemeralContainerUpdates`).
pub(crate) fn merge(current: &Value, new: &Value) -> Value {
    let mut merged = current.clone();
    match new["spec"].get("ephemeralContainers") {
        Some(list) if !list.is_null() => merged["spec"]["ephemeralContainers"] = list.clone(),
        _ => {
            if let Some(spec) = merged["spec"].as_object_mut() {
                spec.remove("ephemeralContainers");
            }
        }
    }
    merged
}

fn names(spec: &Value, key: &str) -> Vec<String> {
    spec[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// `ValidatePodEphemeralContainersUpdate` with `validateEphemeralContainers`.
pub(crate) fn validate_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if old["metadata"]["annotations"]
        .get("kubernetes.io/config.mirror")
        .is_some()
    {
        return vec![FieldError::forbidden(
            "",
            "static pods do not support ephemeral containers",
        )];
    }
    let path = "spec.ephemeralContainers";
    let empty = Vec::new();
    let new_list = new["spec"]["ephemeralContainers"]
        .as_array()
        .unwrap_or(&empty);
    let old_list = old["spec"]["ephemeralContainers"]
        .as_array()
        .unwrap_or(&empty);
    for existing in old_list {
        let name = existing["name"].as_str().unwrap_or("");
        match new_list.iter().find(|c| c["name"].as_str() == Some(name)) {
            None => errors.push(FieldError::forbidden(
                path,
                &format!("existing ephemeral containers {name:?} may not be removed\n"),
            )),
            Some(c) if c != existing => errors.push(FieldError::forbidden(
                path,
                &format!("existing ephemeral containers {name:?} may not be changed\n"),
            )),
            Some(_) => {}
        }
    }
    let spec = &new["spec"];
    let others: HashSet<String> = names(spec, "containers")
        .into_iter()
        .chain(names(spec, "initContainers"))
        .collect();
    let mut all = others.clone();
    for (i, c) in new_list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let name = c["name"].as_str().unwrap_or("");
        if name.is_empty() {
            errors.push(FieldError::required(format!("{at}.name"), ""));
        } else if !is_dns1123_label(name) {
            errors.push(FieldError::invalid(
                format!("{at}.name"),
                &json!(name),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ));
        } else if !all.insert(name.to_owned()) {
            errors.push(FieldError::duplicate(format!("{at}.name"), &json!(name)));
        }
        if c["image"].as_str().unwrap_or("").trim().is_empty() {
            errors.push(FieldError::required(format!("{at}.image"), ""));
        }
        if let Some(target) = c["targetContainerName"].as_str()
            && !target.is_empty()
            && !others.contains(target)
        {
            errors.push(FieldError {
                reason: "FieldValueNotFound",
                field: format!("{at}.targetContainerName"),
                message: format!("Not found: {}", json!(target)),
            });
        }
        for field in FORBIDDEN_FIELDS {
            // Upstream's allow list looks at non-zero fields: kubectl sends `resources: {}`.
            if c.get(field).is_some_and(is_set) {
                errors.push(FieldError::forbidden(
                    format!("{at}.{field}"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
        for (j, m) in c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if m["subPath"].as_str().is_some_and(|s| !s.is_empty()) {
                errors.push(FieldError::forbidden(
                    format!("{at}.volumeMounts[{j}].subPath"),
                    "cannot be set for an Ephemeral Container",
                ));
            }
        }
    }
    errors
}

/// Whether a field holds a non-zero value (not null, not an empty object, list or string).
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Object(m) => !m.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ephemeral: Value) -> Value {
        json!({"metadata": {"name": "web"},
               "spec": {"containers": [{"name": "app", "image": "nginx"}],
                        "ephemeralContainers": ephemeral}})
    }

    /// `dropNonEphemeralContainerUpdates`: only the ephemeral containers are taken.
    #[test]
    fn a_write_takes_only_the_ephemeral_containers() {
        let current = pod(json!(null));
        let mut new = pod(json!([{"name": "debug", "image": "busybox"}]));
        new["spec"]["containers"][0]["image"] = json!("evil");
        new["metadata"]["labels"] = json!({"x": "y"});
        let merged = merge(&current, &new);
        assert_eq!(merged["spec"]["containers"][0]["image"], "nginx");
        assert_eq!(merged["metadata"].get("labels"), None);
        assert_eq!(merged["spec"]["ephemeralContainers"][0]["name"], "debug");
    }

    /// `ValidatePodEphemeralContainersUpdate` and `validateEphemeralContainers`: additions
    /// only, each a valid, uniquely named container without ports, probes or resources,
    /// targeting a container of the pod.
    #[test]
    fn ephemeral_containers_are_only_added_and_validated_as_upstream() {
        let old = pod(json!([{"name": "debug", "image": "busybox"}]));
        let full = |new: &Value| -> Vec<String> {
            validate_update(new, &old)
                .iter()
                .map(FieldError::full)
                .collect()
        };
        let ok = pod(json!([{"name": "debug", "image": "busybox"},
                            {"name": "debug2", "image": "busybox", "targetContainerName": "app"}]));
        assert_eq!(full(&ok), Vec::<String>::new());
        assert_eq!(
            full(&pod(json!([]))),
            [
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debug\" may not be removed\n"
            ]
        );
        assert_eq!(
            full(&pod(json!([{"name": "debug", "image": "alpine"}]))),
            [
                "spec.ephemeralContainers: Forbidden: existing ephemeral containers \"debug\" may not be changed\n"
            ]
        );
        let bad = pod(json!([{"name": "debug", "image": "busybox"},
            {"name": "app", "image": "busybox"},
            {"name": "x", "image": "", "targetContainerName": "nope", "resources": {},
             "ports": [{"containerPort": 80}], "readinessProbe": {"exec": {"command": ["true"]}}}]));
        assert_eq!(
            full(&bad),
            [
                "spec.ephemeralContainers[1].name: Duplicate value: \"app\"",
                "spec.ephemeralContainers[2].image: Required value",
                "spec.ephemeralContainers[2].targetContainerName: Not found: \"nope\"",
                "spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container",
                "spec.ephemeralContainers[2].readinessProbe: Forbidden: cannot be set for an Ephemeral Container",
            ]
        );
        let mut mirror = old.clone();
        mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
        assert_eq!(validate_update(&ok, &mirror).len(), 1);
    }
}
