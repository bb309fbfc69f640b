//! A pod spec's defaulting and validation (upstream's `SetDefaults_PodSpec` and
//! `ValidatePodSpec`, in the parts served here): one place for pods and for the pod
//! templates of workloads.

use serde_json::{Value, json};

use super::quantity::quantity_of;
use crate::registry::FieldError;

/// The tolerations upstream's DefaultTolerationSeconds admission
/// (`plugin/pkg/admission/defaulttolerationseconds`) adds to a pod spec that does not
/// tolerate the NoExecute taints `node.kubernetes.io/not-ready` and
/// `node.kubernetes.io/unreachable` already: `Exists` tolerations of these seconds
/// (`--default-not-ready-toleration-seconds`, `--default-unreachable-toleration-seconds`,
/// 300 each by default).
pub fn add_default_tolerations(spec: &mut Value, not_ready_seconds: i64, unreachable_seconds: i64) {
    if !spec["tolerations"].is_array() {
        spec["tolerations"] = json!([]);
    }
    let tolerations = spec["tolerations"].as_array_mut().expect("array");
    for (key, seconds) in [
        ("node.kubernetes.io/not-ready", not_ready_seconds),
        ("node.kubernetes.io/unreachable", unreachable_seconds),
    ] {
        // Upstream: a toleration of this key, or of every key (an empty key), with the
        // NoExecute or every effect (an empty effect) already covers it.
        let tolerated = tolerations.iter().any(|t| {
            let effect = t["effect"].as_str().unwrap_or("");
            let k = t["key"].as_str().unwrap_or("");
            (k == key || k.is_empty()) && (effect.is_empty() || effect == "NoExecute")
        });
        if !tolerated {
            tolerations.push(json!({
                "key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds
            }));
        }
    }
}

/// The defaults upstream gives a pod spec (`SetDefaults_PodSpec`, `SetDefaults_Container`),
/// also applied to the pod templates of workloads.
pub(super) fn default_pod_spec(spec: &mut Value) {
    if !spec.is_object() {
        return;
    }
    for (field, value) in [
        ("restartPolicy", json!("Always")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("securityContext", json!({})),
    ] {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
    if let Some(containers) = spec["containers"].as_array_mut() {
        for c in containers {
            let image = c["image"].as_str().unwrap_or("").to_owned();
            if c["imagePullPolicy"].is_null() {
                let latest = image.ends_with(":latest")
                    || !image.rsplit('/').next().unwrap_or("").contains(':');
                c["imagePullPolicy"] = json!(if latest { "Always" } else { "IfNotPresent" });
            }
            if c["terminationMessagePath"].is_null() {
                c["terminationMessagePath"] = json!("/dev/termination-log");
            }
            if c["terminationMessagePolicy"].is_null() {
                c["terminationMessagePolicy"] = json!("File");
            }
        }
    }
}

/// Upstream `ValidateResourceRequirements` (with `ValidateResourceQuantityValue` →
/// `ValidateNonnegativeQuantity`) for the `resources` of the container at `path`: no
/// negative request or limit, and no request above its limit.
fn validate_resource_requirements(c: &Value, path: &str, errors: &mut Vec<FieldError>) {
    let requirements = &c["resources"];
    let limits = requirements["limits"].as_object();
    for (kind, map) in [
        ("limits", limits),
        ("requests", requirements["requests"].as_object()),
    ] {
        for (name, value) in map.into_iter().flatten() {
            let Some(q) = quantity_of(value) else {
                continue;
            };
            if q.is_negative() {
                errors.push(FieldError::invalid(
                    format!("{path}.{kind}[{name}]"),
                    value,
                    "must be greater than or equal to 0",
                ));
            }
            let limit = limits.and_then(|l| l.get(name));
            if kind == "requests"
                && let Some(limit) = limit
                && quantity_of(limit).is_some_and(|l| q > l)
            {
                errors.push(FieldError::invalid(
                    format!("{path}.requests"),
                    value,
                    format!(
                        "must be less than or equal to {name} limit of {}",
                        limit.as_str().unwrap_or("")
                    ),
                ));
            }
        }
    }
}

/// The container rules of a pod spec at `prefix` (`spec`, `spec.template.spec`).
pub(super) fn validate_pod_spec(spec: &Value, prefix: &str) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for list in ["containers", "initContainers"] {
        for (i, c) in spec[list].as_array().into_iter().flatten().enumerate() {
            let path = format!("{prefix}.{list}[{i}].resources");
            validate_resource_requirements(c, &path, &mut errors);
        }
    }
    // Upstream `validateOverhead`.
    for (name, value) in spec["overhead"].as_object().into_iter().flatten() {
        if quantity_of(value).is_some_and(|q| q.is_negative()) {
            errors.push(FieldError::invalid(
                format!("{prefix}.overhead[{name}]"),
                value,
                "must be greater than or equal to 0",
            ));
        }
    }
    match spec["containers"].as_array() {
        Some(cs) if !cs.is_empty() => {
            for (i, c) in cs.iter().enumerate() {
                if c["name"].as_str().unwrap_or("").is_empty() {
                    errors.push(FieldError::required(
                        format!("{prefix}.containers[{i}].name"),
                        "",
                    ));
                }
                if c["image"].as_str().unwrap_or("").is_empty() {
                    errors.push(FieldError::required(
                        format!("{prefix}.containers[{i}].image"),
                        "",
                    ));
                }
            }
        }
        _ => errors.push(FieldError::required(format!("{prefix}.containers"), "")),
    }
    errors
}
