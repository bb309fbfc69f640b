//! A pod's `eviction` subresource (upstream's `EvictionREST.Create`,
//! `pkg/registry/core/pod/storage/eviction.go`): a delete that honours the pod's
//! PodDisruptionBudget.
//!
//! - A pod that is terminal, pending or already being deleted is deleted at once
//!   (`canIgnorePDB`).
//! - The budgets of the pod's namespace whose selector (neither null nor empty) selects
//!   the pod are found; more than one is a 500, none means a plain delete.
//! - An unready pod is deleted without touching the budget when the budget says
//!   `unhealthyPodEvictionPolicy: AlwaysAllow`, or when it is already healthy enough
//!   (`currentHealthy >= desiredHealthy > 0`).
//! - Otherwise `checkAndDecrement`: a budget the disruption controller has not caught up
//!   with (`observedGeneration < generation`) or that allows no disruption is a 429 with
//!   upstream's message and a `DisruptionBudget` cause; else `disruptionsAllowed` is
//!   decremented and the pod recorded in `disruptedPods` (one conditional write, retried on
//!   a conflict), and the pod deleted.

use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, WriteContext,
    delete::{DeleteOptions, delete_object},
    get_list::{get_object, list_all},
    qualified,
    status::ApiError,
    update::update_object,
};
use crate::registry::{meta, policy::POD_DISRUPTION_BUDGETS, workloads::selector_matches};

/// Upstream `MaxDisruptedPodSize`: evictions not yet confirmed by the disruption controller.
pub(crate) const MAX_DISRUPTED_POD_SIZE: usize = 2000;

/// The message of the 429 answer when a budget would be violated.
pub(crate) const EVICTION_REFUSED: &str =
    "Cannot evict pod as it would violate the pod's disruption budget.";

/// Whether a pod is Ready (upstream `podutil.IsPodReady`).
fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Upstream `canIgnorePDB`: a pod that is terminal, pending or being deleted.
fn can_ignore_pdb(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed" | "Pending")
    ) || !pod["metadata"]["deletionTimestamp"].is_null()
}

/// Whether a budget's selector selects `pod` in the eviction's sense: a null or empty
/// selector selects nothing here.
fn selects(pdb: &Value, pod: &Value) -> bool {
    let selector = &pdb["spec"]["selector"];
    let empty = selector["matchLabels"]
        .as_object()
        .is_none_or(|m| m.is_empty())
        && selector["matchExpressions"]
            .as_array()
            .is_none_or(|m| m.is_empty());
    !selector.is_null() && !empty && selector_matches(selector, &pod["metadata"]["labels"])
}

/// 429 `TooManyRequests` with one `DisruptionBudget` cause (upstream
/// `errors.NewTooManyRequests` plus the cause `checkAndDecrement` appends).
fn too_many_requests(cause: String) -> ApiError {
    ApiError {
        code: 429,
        reason: "TooManyRequests",
        message: EVICTION_REFUSED.to_owned(),
        details: Some(json!({"causes": [{"reason": "DisruptionBudget", "message": cause}]})),
    }
}

/// Upstream `checkAndDecrement` on the budget `pdb`: the budget with one disruption spent
/// and `pod` recorded, or the refusal.
fn check_and_decrement(pod: &str, pdb: &Value) -> Result<Value, ApiError> {
    let name = pdb["metadata"]["name"].as_str().unwrap_or("");
    let status = &pdb["status"];
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    let generation = pdb["metadata"]["generation"].as_i64().unwrap_or(0);
    if observed < generation {
        return Err(too_many_requests(format!(
            "The disruption budget {name} is still being processed by the server."
        )));
    }
    let q = qualified(&POD_DISRUPTION_BUDGETS, name);
    let allowed = status["disruptionsAllowed"].as_i64().unwrap_or(0);
    if allowed < 0 {
        return Err(ApiError::forbidden(
            &q,
            "pdb disruptions allowed is negative",
        ));
    }
    let disrupted = status["disruptedPods"]
        .as_object()
        .map_or(0, serde_json::Map::len);
    if disrupted > MAX_DISRUPTED_POD_SIZE {
        return Err(ApiError::forbidden(
            &q,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Err(too_many_requests(format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            status["desiredHealthy"].as_i64().unwrap_or(0),
            status["currentHealthy"].as_i64().unwrap_or(0)
        )));
    }
    let mut updated = pdb.clone();
    let s = &mut updated["status"];
    s["disruptionsAllowed"] = json!(allowed - 1);
    if !s["disruptedPods"].is_object() {
        s["disruptedPods"] = json!({});
    }
    s["disruptedPods"][pod] = json!(meta::now_rfc3339());
    if allowed - 1 == 0 {
        set_disruption_allowed(s, false);
    }
    Ok(updated)
}

/// Upstream `UpdateDisruptionAllowedCondition`: `DisruptionAllowed` True with
/// `SufficientPods`, or False with `InsufficientPods`.
fn set_disruption_allowed(status: &mut Value, allowed: bool) {
    let (value, reason) = if allowed {
        ("True", "SufficientPods")
    } else {
        ("False", "InsufficientPods")
    };
    let mut conditions: Vec<Value> = status["conditions"].as_array().cloned().unwrap_or_default();
    match conditions
        .iter_mut()
        .find(|c| c["type"] == "DisruptionAllowed")
    {
        Some(c) if c["status"] == value && c["reason"] == reason => {}
        Some(c) => {
            c["status"] = json!(value);
            c["reason"] = json!(reason);
            c["lastTransitionTime"] = json!(meta::now_rfc3339());
        }
        None => conditions.push(json!({
            "type": "DisruptionAllowed",
            "status": value,
            "reason": reason,
            "message": "",
            "lastTransitionTime": meta::now_rfc3339(),
        })),
    }
    status["conditions"] = json!(conditions);
}

/// Evicts the pod `key` with the eviction's delete `options` (see the module docs).
pub(crate) async fn evict_pod(
    state: &Storage,
    ctx: &WriteContext,
    key: ObjectKey<'_>,
    options: DeleteOptions,
) -> Result<(), ApiError> {
    for _ in 0..MAX_WRITE_ATTEMPTS {
        if admit_eviction(state, key, options.dry_run).await? {
            delete_object(state, ctx, key, options).await?;
            return Ok(());
        }
    }
    Err(ApiError::modified(&qualified(key.def, key.name)))
}

/// One attempt at the budget side of an eviction: `Ok(true)` when the pod may be deleted
/// (a disruption was spent if one had to be), `Ok(false)` when the budget changed under
/// us (the controller, another eviction) and the attempt must start over.
async fn admit_eviction(
    state: &Storage,
    key: ObjectKey<'_>,
    dry_run: bool,
) -> Result<bool, ApiError> {
    let ns = key.namespace.unwrap_or("");
    let pod = get_object(&*state.store, key.def, key.namespace, key.name)
        .await?
        .1;
    if can_ignore_pdb(&pod) {
        return Ok(true);
    }
    let budgets: Vec<Value> = list_all(&*state.store, &POD_DISRUPTION_BUDGETS, Some(ns))
        .await?
        .into_iter()
        .filter(|pdb| selects(pdb, &pod))
        .collect();
    let pdb = match budgets.as_slice() {
        [] => return Ok(true),
        [pdb] => pdb,
        _ => {
            return Err(ApiError::internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    if !is_ready(&pod) {
        let always = pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        let current = pdb["status"]["currentHealthy"].as_i64().unwrap_or(0);
        let desired = pdb["status"]["desiredHealthy"].as_i64().unwrap_or(0);
        if always || (current >= desired && desired > 0) {
            return Ok(true);
        }
    }
    let updated = check_and_decrement(key.name, pdb)?;
    if dry_run {
        return Ok(true);
    }
    let pdb_name = pdb["metadata"]["name"].as_str().unwrap_or("");
    let pdb_key = ObjectKey::new(&POD_DISRUPTION_BUDGETS, Some(ns), pdb_name);
    match update_object(
        state,
        &WriteContext::server(),
        pdb_key,
        Some("status"),
        updated,
    )
    .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.reason == "Conflict" => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pdb(generation: i64, observed: i64, allowed: i64) -> Value {
        json!({
            "metadata": {"name": "web", "generation": generation},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
            "status": {
                "observedGeneration": observed,
                "disruptionsAllowed": allowed,
                "desiredHealthy": 2,
                "currentHealthy": 2 + allowed,
            },
        })
    }

    /// `eviction.go checkAndDecrement`: no disruption allowed is a 429 naming the budget's
    /// needs; a budget not yet observed is a 429 too; otherwise one disruption is spent and
    /// the pod recorded.
    #[test]
    fn check_and_decrement_refuses_with_429_and_spends_one_disruption() {
        let e = check_and_decrement("web-1", &pdb(1, 1, 0)).unwrap_err();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert_eq!(e.message, EVICTION_REFUSED);
        assert_eq!(
            e.details.unwrap()["causes"][0]["message"],
            "The disruption budget web needs 2 healthy pods and has 2 currently"
        );
        let e = check_and_decrement("web-1", &pdb(2, 1, 1)).unwrap_err();
        assert_eq!(e.code, 429);
        assert!(
            e.details.unwrap()["causes"][0]["message"]
                .as_str()
                .unwrap()
                .contains("still being processed")
        );
        let spent = check_and_decrement("web-1", &pdb(1, 1, 1)).unwrap();
        assert_eq!(spent["status"]["disruptionsAllowed"], 0);
        assert!(spent["status"]["disruptedPods"]["web-1"].is_string());
        assert_eq!(
            spent["status"]["conditions"][0]["reason"],
            "InsufficientPods"
        );
    }

    /// `eviction.go getPodDisruptionBudgets`: a null or empty selector selects nothing.
    #[test]
    fn an_empty_budget_selector_selects_no_pod_for_eviction() {
        let pod = json!({"metadata": {"labels": {"app": "web"}}});
        assert!(selects(&pdb(1, 1, 1), &pod));
        assert!(!selects(&json!({"spec": {"selector": {}}}), &pod));
        assert!(!selects(&json!({"spec": {}}), &pod));
    }
}
