//! The disruption controller: keeps each PodDisruptionBudget's `status`, which the
//! Eviction subresource reads to allow or refuse an eviction.
//!
//! # What upstream does (`pkg/controller/disruption/disruption.go`)
//!
//! - The pods of a budget are those of its namespace its selector selects (a null selector
//!   selects none, an empty one all).
//! - `getExpectedPodCount`: with an integer `minAvailable`, `expectedPods` is the number of
//!   those pods and `desiredHealthy` the integer; with a percentage `minAvailable` or with
//!   `maxUnavailable`, `expectedPods` is the sum of the scales of the pods' controllers
//!   (ReplicaSets, the Deployment of a ReplicaSet, …) and the percentage is resolved
//!   against it rounding up; `desiredHealthy = expectedPods - maxUnavailable` (not below 0).
//!   A pod whose controller has no scale fails the sync: `failSafe` sets
//!   `disruptionsAllowed` to 0 and the `DisruptionAllowed` condition to False, `SyncFailed`.
//! - `buildDisruptedPodMap`: an entry of `status.disruptedPods` (written by evictions) is
//!   kept while its pod exists, is not being deleted and was evicted less than
//!   `DeletionTimeout` (2 minutes) ago; the budget is checked again when the oldest expires.
//! - `countHealthyPods`: pods not being deleted, not in that map, and Ready.
//! - `disruptionsAllowed = max(currentHealthy - desiredHealthy, 0)`, `observedGeneration`
//!   and the `DisruptionAllowed` condition (`SufficientPods` / `InsufficientPods`).
//!
//! # Where we differ
//!
//! - The scale finders know ReplicaSets and the Deployments that own them (no
//!   ReplicationControllers, StatefulSets or arbitrary `scale` subresources: those are not
//!   served here).
//! - No `UnmanagedPods` or `CalculateExpectedPodCountFailed` events.
//! - No stale-`DisruptionTarget`-condition cleanup of pods.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::Pod,
        policy::v1::PodDisruptionBudget,
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, Time},
        util::intstr::IntOrString,
    },
};
use kube::{
    Api, Client, ResourceExt,
    api::PostParams,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::{clock::WallClock, registry::workloads::selector_matches};

use super::workload::{controller_of, drive, is_ready, key_of, select, watch};

/// Upstream `DeletionTimeout`: how long an eviction recorded in `disruptedPods` is waited
/// for before the pod counts as healthy again.
pub const DELETION_TIMEOUT: Duration = Duration::from_secs(120);

/// The disruption controller.
pub struct DisruptionController {
    client: Client,
}

impl std::fmt::Debug for DisruptionController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisruptionController")
            .finish_non_exhaustive()
    }
}

/// Whether a budget's selector selects `labels` (the controller's sense: null selects
/// nothing, empty everything).
fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(selector) = selector else {
        return false;
    };
    let selector = serde_json::to_value(selector).unwrap_or(Value::Null);
    let labels = serde_json::to_value(labels).unwrap_or(Value::Null);
    selector_matches(&selector, &labels)
}

impl DisruptionController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (budgets, budget_events) = watch(
            Api::<PodDisruptionBudget>::all(self.client.clone()),
            |pdb| vec![key_of(pdb)],
        );
        let of_pod = budgets.clone();
        let (pods, pod_events) = watch(Api::<Pod>::all(self.client.clone()), move |pod| {
            let ns = pod.namespace();
            of_pod
                .state()
                .iter()
                .filter(|pdb| pdb.namespace() == ns)
                .filter(|pdb| {
                    selects(
                        pdb.spec.as_ref().and_then(|s| s.selector.as_ref()),
                        pod.labels(),
                    )
                })
                .map(|pdb| key_of(&**pdb))
                .collect()
        });
        let (sets, set_events) = watch(Api::<ReplicaSet>::all(self.client.clone()), |_| Vec::new());
        let (deployments, deployment_events) =
            watch(Api::<Deployment>::all(self.client.clone()), |_| Vec::new());
        let sync = Sync {
            client: self.client,
            budgets,
            pods,
            sets,
            deployments,
            clock: WallClock::new(),
        };
        drive(
            sync,
            vec![budget_events, pod_events, set_events, deployment_events],
            shutdown,
        )
        .await;
    }
}

struct Sync {
    client: Client,
    budgets: Store<PodDisruptionBudget>,
    pods: Store<Pod>,
    sets: Store<ReplicaSet>,
    deployments: Store<Deployment>,
    clock: WallClock,
}

/// Upstream `intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)`.
fn scaled(value: &IntOrString, total: i32) -> Result<i32, String> {
    match value {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let percent: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("invalid value for IntOrString: invalid value {s:?}"))?;
            let scaled = (percent * i64::from(total) + 99) / 100;
            Ok(i32::try_from(scaled).unwrap_or(i32::MAX))
        }
    }
}

impl Sync {
    /// Upstream `getExpectedScale`: the sum of the scales of the pods' controllers.
    fn expected_scale(&self, pods: &[Arc<Pod>]) -> Result<i32, String> {
        let mut scales: BTreeMap<String, i32> = BTreeMap::new();
        for pod in pods {
            let Some(owner) = controller_of(&**pod) else {
                // Unmanaged pods are left out, as upstream.
                continue;
            };
            if scales.contains_key(&owner.uid) {
                continue;
            }
            let ns = pod.namespace().unwrap_or_default();
            let found = match owner.kind.as_str() {
                "ReplicaSet" => self
                    .sets
                    .get(&ObjectRef::new(&owner.name).within(&ns))
                    .filter(|rs| rs.uid().as_deref() == Some(owner.uid.as_str()))
                    .map(|rs| {
                        // A ReplicaSet of a Deployment scales with its Deployment.
                        let deployment = controller_of(&*rs)
                            .filter(|r| r.kind == "Deployment")
                            .and_then(|r| {
                                self.deployments
                                    .get(&ObjectRef::new(&r.name).within(&ns))
                                    .filter(|d| d.uid().as_deref() == Some(r.uid.as_str()))
                            });
                        match deployment {
                            Some(d) => (
                                d.uid().unwrap_or_default(),
                                d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                            ),
                            None => (
                                owner.uid.clone(),
                                rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                            ),
                        }
                    }),
                "Deployment" => self
                    .deployments
                    .get(&ObjectRef::new(&owner.name).within(&ns))
                    .filter(|d| d.uid().as_deref() == Some(owner.uid.as_str()))
                    .map(|d| {
                        (
                            owner.uid.clone(),
                            d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
                        )
                    }),
                _ => None,
            };
            let Some((uid, scale)) = found else {
                return Err(format!("found no controllers for pod {:?}", pod.name_any()));
            };
            scales.insert(owner.uid.clone(), 0);
            scales.insert(uid, scale);
        }
        Ok(scales.values().sum())
    }

    /// Upstream `getExpectedPodCount`: `(expectedPods, desiredHealthy)`.
    fn expected_pod_count(
        &self,
        pdb: &PodDisruptionBudget,
        pods: &[Arc<Pod>],
    ) -> Result<(i32, i32), String> {
        let spec = pdb.spec.clone().unwrap_or_default();
        if let Some(max_unavailable) = &spec.max_unavailable {
            let expected = self.expected_scale(pods)?;
            let max_unavailable = scaled(max_unavailable, expected)?;
            return Ok((expected, (expected - max_unavailable).max(0)));
        }
        match &spec.min_available {
            Some(IntOrString::Int(n)) => Ok((pods.len() as i32, *n)),
            Some(percent) => {
                let expected = self.expected_scale(pods)?;
                Ok((expected, scaled(percent, expected)?))
            }
            None => Ok((0, 0)),
        }
    }
}

/// The `DisruptionAllowed` condition, its transition time kept when nothing changed.
fn condition(old: &Value, allowed: bool, reason: &str, message: &str, generation: i64) -> Value {
    let status = if allowed { "True" } else { "False" };
    let previous = old["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "DisruptionAllowed");
    let since = previous
        .filter(|c| c["status"] == status)
        .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_owned))
        .unwrap_or_else(crate::registry::meta::now_rfc3339);
    json!({
        "type": "DisruptionAllowed",
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
        "lastTransitionTime": since,
    })
}

#[async_trait]
impl super::workload::Reconcile for Sync {
    fn name(&self) -> &'static str {
        "disruption"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(pdb) = self.budgets.get(&ObjectRef::new(name).within(ns)) else {
            return Ok(None);
        };
        let selector = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
        let pods = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && selects(selector, p.labels())
        });
        let old = serde_json::to_value(pdb.status.clone().unwrap_or_default()).unwrap_or_default();
        let generation = pdb.metadata.generation.unwrap_or(0);
        let now = self.clock.now();
        let mut again: Option<Duration> = None;
        let mut status = old.clone();
        match self.expected_pod_count(&pdb, &pods) {
            Ok((expected, desired)) => {
                // buildDisruptedPodMap
                let mut disrupted = serde_json::Map::new();
                for (pod_name, at) in old["disruptedPods"].as_object().into_iter().flatten() {
                    let Some(pod) = pods.iter().find(|p| p.name_any() == *pod_name) else {
                        continue;
                    };
                    if pod.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let Some(at_time) = at
                        .as_str()
                        .and_then(|t| serde_json::from_value::<Time>(json!(t)).ok())
                    else {
                        continue;
                    };
                    let expires = at_time.0 + DELETION_TIMEOUT;
                    if expires <= now {
                        debug!(pod = %pod_name, "evicted pod was not deleted in time; counting it again");
                        continue;
                    }
                    let left = Duration::try_from(expires.duration_since(now)).unwrap_or_default();
                    again = Some(again.map_or(left, |a| a.min(left)));
                    disrupted.insert(pod_name.clone(), at.clone());
                }
                let healthy = pods
                    .iter()
                    .filter(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && !disrupted.contains_key(&p.name_any())
                            && is_ready(p)
                    })
                    .count() as i32;
                let allowed = (healthy - desired).max(0);
                let reason = if allowed > 0 {
                    "SufficientPods"
                } else {
                    "InsufficientPods"
                };
                status["currentHealthy"] = json!(healthy);
                status["desiredHealthy"] = json!(desired);
                status["expectedPods"] = json!(expected);
                status["disruptionsAllowed"] = json!(allowed);
                status["observedGeneration"] = json!(generation);
                status["disruptedPods"] = Value::Object(disrupted);
                status["conditions"] =
                    json!([condition(&old, allowed > 0, reason, "", generation)]);
            }
            Err(message) => {
                // failSafe
                debug!(%message, "cannot compute the budget; allowing no disruption");
                status["disruptionsAllowed"] = json!(0);
                status["conditions"] =
                    json!([condition(&old, false, "SyncFailed", &message, generation)]);
                again = Some(Duration::from_secs(5));
            }
        }
        let drop_empty_map = |v: &mut Value| {
            if v["disruptedPods"]
                .as_object()
                .is_some_and(serde_json::Map::is_empty)
                && let Some(o) = v.as_object_mut()
            {
                o.remove("disruptedPods");
            }
        };
        drop_empty_map(&mut status);
        let mut old_cmp = old.clone();
        drop_empty_map(&mut old_cmp);
        if status == old_cmp {
            return Ok(again);
        }
        let mut updated = serde_json::to_value(&*pdb).unwrap_or_default();
        updated["status"] = status;
        let api: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), ns);
        let body: PodDisruptionBudget =
            serde_json::from_value(updated).map_err(kube::Error::SerdeError)?;
        match api
            .replace_status(name, &PostParams::default(), &body)
            .await
        {
            Ok(_) => Ok(again),
            // An eviction (or a newer spec) got there first: the watch brings it back.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                Ok(Some(Duration::from_millis(100)))
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `GetScaledValueFromIntOrPercent(..., roundUp=true)`, as
    /// `disruption.go getExpectedPodCount` resolves percentages.
    #[test]
    fn percentages_resolve_rounding_up_as_get_expected_pod_count() {
        assert_eq!(scaled(&IntOrString::String("50%".into()), 3), Ok(2));
        assert_eq!(scaled(&IntOrString::String("100%".into()), 7), Ok(7));
        assert_eq!(scaled(&IntOrString::String("0%".into()), 7), Ok(0));
        assert_eq!(scaled(&IntOrString::Int(4), 7), Ok(4));
        assert!(scaled(&IntOrString::String("half".into()), 7).is_err());
    }

    /// The controller's selector: null selects nothing, empty selects everything.
    #[test]
    fn a_null_budget_selector_selects_nothing_and_an_empty_one_everything() {
        let labels: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        assert!(!selects(None, &labels));
        assert!(selects(Some(&LabelSelector::default()), &labels));
        let other = LabelSelector {
            match_labels: Some([("app".to_owned(), "db".to_owned())].into()),
            ..LabelSelector::default()
        };
        assert!(!selects(Some(&other), &labels));
    }
}
