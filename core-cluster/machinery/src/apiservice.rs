//! `apiregistration.k8s.io/v1` APIServices, as kube-aggregator's autoregister controller
//! keeps them (`cmd/kube-apiserver/app/aggregator.go` and `pkg/controller/autoregister`):
//! one `Local` APIService (`spec.service` null, `Available=True`) per group-version the
//! server serves, its custom resources' included. An APIService for a remote service is
//! refused: core-cluster does not proxy to aggregated API servers.

use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use serde_json::{Value, json};

use crate::registry::{
    Column, FieldError, NameRule, ResourceDef, meta, no_defaults,
    table::{AGE, NAME},
    typed,
};

/// The group of APIServices.
pub const GROUP: &str = "apiregistration.k8s.io";

fn identity(v: Value) -> Value {
    v
}

fn no_fields(_: &Value, _: &str) -> Option<String> {
    None
}

/// `apiregistration/validation.ValidateAPIService`, and the refusal of a remote service.
fn validate(new: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    let group = spec["group"].as_str().unwrap_or("");
    let version = spec["version"].as_str().unwrap_or("");
    let name = meta::str_at(new, &["metadata", "name"]).unwrap_or("");
    let want = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{version}.{group}")
    };
    if name != want {
        errors.push(FieldError::invalid(
            "metadata.name",
            &json!(name),
            format!("must be `spec.version+\".\"+spec.group`: {want:?}"),
        ));
    }
    if version.is_empty() {
        errors.push(FieldError::required("spec.version", ""));
    }
    if !spec["service"].is_null() {
        errors.push(FieldError::forbidden(
            "spec.service",
            "core-cluster serves Local APIServices only: it has no aggregation proxy to a remote API server",
        ));
    }
    errors
}

/// `apiregistration.k8s.io/v1` apiservices.
pub static API_SERVICES: ResourceDef = ResourceDef {
    group: GROUP,
    version: "v1",
    kind: "APIService",
    plural: "apiservices",
    singular: "apiservice",
    short_names: &[],
    categories: &["api-extensions"],
    namespaced: false,
    status: true,
    generation: false,
    extra_subresources: &[],
    storage: "apiregistration.k8s.io/apiservices",
    name_rule: NameRule::Subdomain,
    typed: typed::<APIService>,
    columns: &[
        NAME,
        Column {
            name: "Service",
            type_: "string",
            format: "",
            description: "The reference to the service that hosts this API endpoint.",
            priority: 0,
            cell: |o, _| match o["spec"]["service"].as_object() {
                Some(s) => json!(format!(
                    "{}/{}",
                    s.get("namespace").and_then(Value::as_str).unwrap_or(""),
                    s.get("name").and_then(Value::as_str).unwrap_or("")
                )),
                None => json!("Local"),
            },
        },
        Column {
            name: "Available",
            type_: "string",
            format: "",
            description: "Whether this service is available.",
            priority: 0,
            cell: |o, _| {
                let c = o["status"]["conditions"]
                    .as_array()
                    .and_then(|c| c.iter().find(|c| c["type"] == "Available"));
                match c {
                    Some(c) if c["status"] == "True" => json!("True"),
                    Some(c) => json!(format!(
                        "{} ({})",
                        c["status"].as_str().unwrap_or(""),
                        c["reason"].as_str().unwrap_or("")
                    )),
                    None => json!("Unknown"),
                }
            },
        },
        AGE,
    ],
    field: no_fields,
    field_paths: &[],
    prepare_create: no_defaults,
    prepare_update: no_defaults,
    validate,
    to_storage: identity,
    from_storage: identity,
};

/// The Local APIService of `group`/`version` (core: `v1`), with kube-apiserver's priorities
/// for the built-in groups (`aggregator.go apiVersionPriorities`) and the CRD defaults
/// (1000, 100) for others.
pub fn local(group: &str, version: &str, now: &str) -> Value {
    let (group_priority, version_priority) = match group {
        "" => (18000, 1),
        "events.k8s.io" => (17750, 15),
        "authentication.k8s.io" => (17700, 15),
        "authorization.k8s.io" => (17600, 15),
        "apps" => (17800, 15),
        "batch" => (17400, 15),
        "policy" => (17100, 15),
        "rbac.authorization.k8s.io" => (17000, 15),
        "apiextensions.k8s.io" => (16700, 15),
        "coordination.k8s.io" => (16500, 15),
        "discovery.k8s.io" => (16200, 15),
        "apiregistration.k8s.io" => (18100, 15),
        _ => (1000, 100),
    };
    let name = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{version}.{group}")
    };
    json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": name, "labels": {"kube-aggregator.kubernetes.io/automanaged": "onstart"}},
        "spec": {"group": group, "version": version, "groupPriorityMinimum": group_priority,
                 "versionPriority": version_priority},
        "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Local",
                                   "message": "Local APIServices are always available",
                                   "lastTransitionTime": now}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ValidateAPIService` and the refusal of a remote service.
    #[test]
    fn a_remote_service_is_refused_and_a_local_one_is_valid() {
        let ok = local("example.com", "v1", "2026-01-01T00:00:00Z");
        assert!(validate(&ok, None).is_empty());
        let mut remote = ok.clone();
        remote["spec"]["service"] = json!({"namespace": "kube-system", "name": "metrics"});
        let errors = validate(&remote, None);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "spec.service");
        assert!(errors[0].message.contains("no aggregation proxy"));
    }
}
