//! `policy/v1` PodDisruptionBudgets: upstream's `pkg/apis/policy/validation`
//! (`ValidatePodDisruptionBudget`, `ValidatePodDisruptionBudgetSpec`,
//! `ValidatePodDisruptionBudgetStatusUpdate`), `pkg/registry/policy/poddisruptionbudget`
//! (the status starts empty, spec changes count generations) and kubectl's columns.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{Value, json};

use super::{
    Column, NameRule, ResourceDef,
    events::identity,
    meta::validate_conditions,
    table::{AGE, NAME},
    typed_with_conditions,
    zero::{object_at, omit_zero_counts, status_counts},
};
use crate::registry::FieldError;

/// `spec.unhealthyPodEvictionPolicy` values (upstream `policy.UnhealthyPodEvictionPolicyType`).
pub const UNHEALTHY_POD_EVICTION_POLICIES: &[&str] = &["AlwaysAllow", "IfHealthyBudget"];

/// An int-or-string cell as kubectl prints it: the value, or `N/A` when unset.
fn int_or_string_cell(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.to_string()),
        Value::String(s) => json!(s),
        _ => json!("N/A"),
    }
}

/// Upstream `ValidatePositiveIntOrPercent` + `IsNotMoreThan100Percent`.
fn int_or_percent_errors(v: &Value, field: &str, errors: &mut Vec<FieldError>) {
    match v {
        Value::Null => {}
        Value::Number(n) => {
            if n.as_i64().is_none_or(|n| n < 0) {
                errors.push(FieldError::invalid(
                    field,
                    v,
                    "must be greater than or equal to 0",
                ));
            }
        }
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<u64>().ok()) {
            None => errors.push(FieldError::invalid(
                field,
                v,
                "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            )),
            Some(p) if p > 100 => errors.push(FieldError::invalid(
                field,
                v,
                "must not be greater than 100%",
            )),
            Some(_) => {}
        },
        _ => errors.push(FieldError::invalid(
            field,
            v,
            "must be an integer or percentage (e.g '5%')",
        )),
    }
}

/// Round-trips a budget through its type, its status conditions (`metav1.Condition`) decoded
/// as upstream's decoder does (see [`typed_with_conditions`]); their validation is
/// [`validate_pdb`]'s.
fn typed_pdb(o: &Value) -> Result<Value, String> {
    typed_with_conditions::<PodDisruptionBudget>(o, &["/status/conditions"])
}

/// Upstream `ValidatePodDisruptionBudgetSpec` (and the status rules of
/// `ValidatePodDisruptionBudgetStatusUpdate`: valid conditions, no negative counts).
fn validate_pdb(new: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let spec = &new["spec"];
    if !spec["minAvailable"].is_null() && !spec["maxUnavailable"].is_null() {
        errors.push(FieldError::invalid(
            "spec",
            spec,
            "minAvailable and maxUnavailable cannot be both set",
        ));
    }
    int_or_percent_errors(&spec["minAvailable"], "spec.minAvailable", &mut errors);
    int_or_percent_errors(&spec["maxUnavailable"], "spec.maxUnavailable", &mut errors);
    if let Some(policy) = spec
        .get("unhealthyPodEvictionPolicy")
        .filter(|p| !p.is_null())
        && !policy
            .as_str()
            .is_some_and(|p| UNHEALTHY_POD_EVICTION_POLICIES.contains(&p))
    {
        errors.push(FieldError::not_supported(
            "spec.unhealthyPodEvictionPolicy",
            policy,
            UNHEALTHY_POD_EVICTION_POLICIES,
        ));
    }
    errors.extend(validate_conditions(
        &new["status"]["conditions"],
        "status.conditions",
    ));
    for f in [
        "disruptionsAllowed",
        "currentHealthy",
        "desiredHealthy",
        "expectedPods",
    ] {
        if let Some(n) = new["status"][f].as_i64()
            && n < 0
        {
            errors.push(FieldError::invalid(
                format!("status.{f}"),
                &json!(n),
                "must be greater than or equal to 0",
            ));
        }
    }
    errors
}

/// The counts of a budget's status without `omitempty` (`PodDisruptionBudgetStatus`).
const PDB_STATUS_COUNTS: &[&str] = &[
    "disruptionsAllowed",
    "currentHealthy",
    "desiredHealthy",
    "expectedPods",
];

/// What Go writes of a budget whatever is set (`k8s.io/api/policy/v1/types.go`): the `spec`
/// (a non-pointer struct) and the status with its counts, on every write (the disruption
/// controller's status writes included).
fn pdb_fields(o: &mut Value) {
    if !o.is_object() {
        return;
    }
    object_at(o, "spec");
    status_counts(o, PDB_STATUS_COUNTS);
    // `observedGeneration` is a non-pointer integer tagged `omitempty`: left out when 0.
    omit_zero_counts(o, &["observedGeneration"]);
}

/// policy/v1 poddisruptionbudgets.
pub static POD_DISRUPTION_BUDGETS: ResourceDef = ResourceDef {
    group: "policy",
    version: "v1",
    kind: "PodDisruptionBudget",
    plural: "poddisruptionbudgets",
    singular: "poddisruptionbudget",
    short_names: &["pdb"],
    categories: &[],
    namespaced: true,
    status: true,
    generation: true,
    extra_subresources: &[],
    storage: "policy/poddisruptionbudgets",
    name_rule: NameRule::PathSegment,
    typed: typed_pdb,
    columns: &[
        NAME,
        Column {
            name: "Min Available",
            type_: "string",
            format: "",
            description: "The minimum number or percentage of available pods this budget requires.",
            priority: 0,
            cell: |o, _| int_or_string_cell(&o["spec"]["minAvailable"]),
        },
        Column {
            name: "Max Unavailable",
            type_: "string",
            format: "",
            description: "The maximum number or percentage of unavailable pods this budget requires.",
            priority: 0,
            cell: |o, _| int_or_string_cell(&o["spec"]["maxUnavailable"]),
        },
        Column {
            name: "Allowed Disruptions",
            type_: "integer",
            format: "",
            description: "Number of pod disruptions that are currently allowed.",
            priority: 0,
            cell: |o, _| json!(o["status"]["disruptionsAllowed"].as_i64().unwrap_or(0)),
        },
        AGE,
    ],
    field: |_, _| None,
    field_paths: &[],
    prepare_update: pdb_fields,
    // Upstream's `PrepareForCreate`: the status starts empty (the zero status, as Go
    // writes it).
    prepare_create: |o| {
        if o.is_object() {
            o["status"] = json!({});
        }
        pdb_fields(o);
    },
    validate: validate_pdb,
    to_storage: identity,
    from_storage: identity,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `ValidatePodDisruptionBudgetSpec`: both bounds at once, a negative or
    /// over-100% bound and an unknown eviction policy are refused.
    /// Upstream `podDisruptionBudgetStrategy.PrepareForCreate` starts from the zero
    /// status, which Go writes with its four counts (no `omitempty`); a status write
    /// without them reads the same.
    #[test]
    fn budget_statuses_carry_the_counts_go_always_writes() {
        let mut created = json!({"spec": {"minAvailable": 1}, "status": {"expectedPods": 3}});
        (POD_DISRUPTION_BUDGETS.prepare_create)(&mut created);
        assert_eq!(
            created["status"],
            json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0})
        );
        let mut written = json!({"status": {"observedGeneration": 1, "expectedPods": 2}});
        (POD_DISRUPTION_BUDGETS.prepare_update)(&mut written);
        assert_eq!(
            written,
            json!({"spec": {}, "status": {"observedGeneration": 1, "disruptionsAllowed": 0,
                "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 2}})
        );
    }

    #[test]
    fn validate_pod_disruption_budget_spec_refuses_what_upstream_refuses() {
        let fields = |spec: Value| -> Vec<String> {
            validate_pdb(&json!({"spec": spec}), None)
                .into_iter()
                .map(|e| e.field)
                .collect()
        };
        assert!(fields(json!({"minAvailable": 2})).is_empty());
        assert!(fields(json!({"maxUnavailable": "50%"})).is_empty());
        assert_eq!(
            fields(json!({"minAvailable": 1, "maxUnavailable": 1})),
            ["spec"]
        );
        assert_eq!(fields(json!({"minAvailable": -1})), ["spec.minAvailable"]);
        assert_eq!(
            fields(json!({"maxUnavailable": "101%"})),
            ["spec.maxUnavailable"]
        );
        assert_eq!(
            fields(json!({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Sometimes"})),
            ["spec.unhealthyPodEvictionPolicy"]
        );
    }
}
