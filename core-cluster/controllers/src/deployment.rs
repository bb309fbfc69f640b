//! The Deployment controller: rolls a Deployment's pods through ReplicaSets.
//!
//! # What upstream does (`pkg/controller/deployment`)
//!
//! - The ReplicaSet whose template equals the Deployment's (ignoring the
//!   `pod-template-hash` label) is the *new* one; the others are *old*. A missing new
//!   ReplicaSet is created as `<deployment>-<hash>`, its selector and template carrying
//!   `pod-template-hash=<hash>`, the hash being the FNV-32a of the template written with
//!   `SafeEncodeString`'s alphabet, and `deployment.kubernetes.io/revision` one above the
//!   old ones'.
//! - **RollingUpdate**: the new ReplicaSet grows while all ReplicaSets together stay within
//!   `replicas + maxSurge` (a percentage rounded up); old ones shrink while the available
//!   pods stay at least `replicas - maxUnavailable` (rounded down; both 0 means 1
//!   unavailable), unhealthy old pods first. **Recreate**: old ReplicaSets go to 0 and their
//!   pods must be gone before the new one is scaled up.
//! - A change of `replicas` alone (no rollout under way) scales the new ReplicaSet.
//! - Events `ScalingReplicaSet` "Scaled up replica set web-abc from 0 to 3" / "Scaled
//!   down …"; old ReplicaSets beyond `revisionHistoryLimit` with no replicas are deleted.
//! - Status: `replicas`, `updatedReplicas`, `readyReplicas`, `availableReplicas`,
//!   `unavailableReplicas`, `observedGeneration` and the conditions `Available`
//!   (`MinimumReplicasAvailable` / `MinimumReplicasUnavailable`) and `Progressing`
//!   (`NewReplicaSetCreated`, `ReplicaSetUpdated`, `NewReplicaSetAvailable`), which is what
//!   `kubectl rollout status` reads.
//!
//! # Where we differ
//!
//! - No proportional scaling of several live ReplicaSets during a rollout (the surplus
//!   goes to the new ReplicaSet), no `progressDeadlineSeconds` timeout condition, no
//!   rollback annotation, no adoption of orphan ReplicaSets, no `paused` handling beyond
//!   not rolling.

use std::{collections::BTreeMap, time::Duration};

use async_trait::async_trait;
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet},
        core::v1::PodTemplateSpec,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{clock::WallClock, registry::workloads::defaulted_template};

use super::workload::{
    EventSink, Reconcile, controlled_by, controller_key, controller_ref, counts_differ, drive,
    key_of, patch_status, select, watch,
};

/// The label that tells a Deployment's ReplicaSets (and their pods) apart.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The revision annotation on Deployments and their ReplicaSets.
pub const REVISION: &str = "deployment.kubernetes.io/revision";

/// `rand.SafeEncodeString`'s alphabet (no vowels, no confusable characters).
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The pod-template-hash of a template (upstream `ComputeHash`: FNV-32a over the template,
/// then the decimal digits mapped onto the safe alphabet).
pub fn pod_template_hash(template: &PodTemplateSpec, collision_count: Option<i32>) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u32::from(*b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    feed(
        serde_json::to_string(template)
            .unwrap_or_default()
            .as_bytes(),
    );
    if let Some(c) = collision_count {
        feed(c.to_string().as_bytes());
    }
    hash.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// Resolves an int-or-percent against `total` (upstream `GetScaledValueFromIntOrPercent`).
fn scaled(v: Option<&IntOrString>, total: i32, round_up: bool, default: &str) -> i32 {
    let owned;
    let v = match v {
        Some(v) => v,
        None => {
            owned = IntOrString::String(default.to_owned());
            &owned
        }
    };
    match v {
        IntOrString::Int(i) => *i,
        IntOrString::String(s) => {
            let p: f64 = s.trim_end_matches('%').parse().unwrap_or(0.0);
            let x = p * f64::from(total) / 100.0;
            (if round_up { x.ceil() } else { x.floor() }) as i32
        }
    }
}

/// `maxSurge` and `maxUnavailable` resolved for `replicas` (upstream `ResolveFenceposts`).
pub fn fenceposts(d: &Deployment) -> (i32, i32) {
    let spec = d.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
    let ru = spec
        .and_then(|s| s.strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref());
    let surge = scaled(ru.and_then(|r| r.max_surge.as_ref()), replicas, true, "25%");
    let unavailable = scaled(
        ru.and_then(|r| r.max_unavailable.as_ref()),
        replicas,
        false,
        "25%",
    );
    if surge == 0 && unavailable == 0 {
        (0, 1)
    } else {
        (surge, unavailable)
    }
}

/// The Deployment controller.
pub struct DeploymentController {
    client: Client,
}

impl std::fmt::Debug for DeploymentController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeploymentController")
            .finish_non_exhaustive()
    }
}

impl DeploymentController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (deployments, d_events) = watch(Api::<Deployment>::all(self.client.clone()), |d| {
            vec![key_of(d)]
        });
        let (sets, rs_events) = watch(Api::<ReplicaSet>::all(self.client.clone()), |rs| {
            controller_key(rs, "Deployment")
        });
        let events = EventSink::spawn(
            self.client.clone(),
            "deployment-controller",
            shutdown.clone(),
        );
        let sync = Sync {
            client: self.client,
            deployments,
            sets,
            events,
            clock: WallClock::new(),
        };
        drive(sync, vec![d_events, rs_events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    deployments: Store<Deployment>,
    sets: Store<ReplicaSet>,
    events: EventSink,
    /// The time written into conditions (follows tokio's clock).
    clock: WallClock,
}

/// `v` within the int32 range (a replica count to write).
fn clamp_i32(v: i64) -> i32 {
    v.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32
}

fn rs_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn rs_status(rs: &ReplicaSet) -> (i32, i32, i32) {
    let s = rs.status.clone().unwrap_or_default();
    (
        s.replicas,
        s.ready_replicas.unwrap_or(0),
        s.available_replicas.unwrap_or(0),
    )
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.annotations()
        .get(REVISION)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// A template as compared: with the API server's defaults (an update may have dropped
/// them) and without the pod-template-hash label.
fn comparable(t: &PodTemplateSpec) -> Value {
    let mut v = defaulted_template(&serde_json::to_value(t).unwrap_or_default());
    if let Some(labels) = v["metadata"]["labels"].as_object_mut() {
        labels.remove(POD_TEMPLATE_HASH);
        if labels.is_empty() {
            v["metadata"].as_object_mut().map(|m| m.remove("labels"));
        }
    }
    v
}

fn condition(now: &str, type_: &str, status: &str, reason: &str, message: String) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
        "lastUpdateTime": now, "lastTransitionTime": now})
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "deployment"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(d) = self.deployments.get(&ObjectRef::new(name).within(ns)) else {
            return Ok(None);
        };
        let uid = d.uid().unwrap_or_default();
        let spec = d.spec.clone().unwrap_or_default();
        let replicas = spec.replicas.unwrap_or(1);
        let mut sets: Vec<ReplicaSet> = select(&self.sets, |rs| {
            rs.namespace().as_deref() == Some(ns) && controlled_by(rs, &uid)
        })
        .into_iter()
        .map(|rs| (*rs).clone())
        .collect();
        sets.sort_by_key(|rs| {
            (
                revision(rs),
                rs.metadata.creation_timestamp.clone().map(|t| t.0),
            )
        });
        let template = comparable(&spec.template);
        let new_idx = sets.iter().position(|rs| {
            rs.spec
                .as_ref()
                .and_then(|s| s.template.as_ref())
                .is_some_and(|t| comparable(t) == template)
        });
        if d.metadata.deletion_timestamp.is_some() || spec.paused == Some(true) {
            let new = new_idx.map(|i| sets[i].clone());
            return self.write_status(&d, &sets, new.as_ref(), None).await;
        }
        let mut created = None;
        let new_idx = match new_idx {
            Some(i) => i,
            None => {
                let rs = self.create_new_set(&d, &sets).await?;
                created = Some(rs.name_any());
                sets.push(rs);
                sets.len() - 1
            }
        };
        let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
        let olds: Vec<usize> = (0..sets.len()).filter(|i| *i != new_idx).collect();
        // Counts are the users' int32s: summed and compared in i64, so they cannot overflow.
        let old_total: i64 = olds.iter().map(|i| i64::from(rs_replicas(&sets[*i]))).sum();
        let new_now = rs_replicas(&sets[new_idx]);
        if recreate {
            if old_total > 0 {
                for i in &olds {
                    self.scale(&d, &mut sets[*i], 0).await?;
                }
            } else if olds.iter().all(|i| rs_status(&sets[*i]).0 == 0) && new_now != replicas {
                self.scale(&d, &mut sets[new_idx], replicas).await?;
            }
        } else if old_total == 0 {
            // No rollout under way: a scaling event (or the first rollout) sizes the new set.
            if new_now != replicas {
                self.scale(&d, &mut sets[new_idx], replicas).await?;
            }
        } else {
            let (surge, max_unavailable) = fenceposts(&d);
            let (replicas, new_now) = (i64::from(replicas), i64::from(new_now));
            // Scale up the new set (upstream `NewRSNewReplicas`).
            let current: i64 = sets.iter().map(|rs| i64::from(rs_replicas(rs))).sum();
            let max_total = replicas + i64::from(surge);
            if current < max_total && new_now < replicas {
                let target = (new_now + max_total - current).min(replicas);
                self.scale(&d, &mut sets[new_idx], clamp_i32(target))
                    .await?;
            }
            // Scale down old sets (upstream `reconcileOldReplicaSets`).
            let min_available = replicas - i64::from(max_unavailable);
            let all_available: i64 = sets.iter().map(|rs| i64::from(rs_status(rs).2)).sum();
            let new_rs = &sets[new_idx];
            let new_unavailable = i64::from(rs_replicas(new_rs)) - i64::from(rs_status(new_rs).2);
            let mut budget = all_available - min_available - new_unavailable;
            // Unhealthy old pods first: they do not count as available anyway.
            for i in &olds {
                let rs = &mut sets[*i];
                let unhealthy = i64::from(rs_replicas(rs)) - i64::from(rs_status(rs).2);
                if unhealthy > 0 {
                    let target = i64::from(rs_replicas(rs)) - unhealthy;
                    self.scale(&d, rs, clamp_i32(target)).await?;
                }
            }
            for i in &olds {
                if budget <= 0 {
                    break;
                }
                let rs = &mut sets[*i];
                let down = i64::from(rs_replicas(rs)).min(budget);
                if down > 0 {
                    let target = i64::from(rs_replicas(rs)) - down;
                    self.scale(&d, rs, clamp_i32(target)).await?;
                    budget -= down;
                }
            }
        }
        self.cleanup(&d, &sets, new_idx).await?;
        let new = sets[new_idx].clone();
        self.write_status(&d, &sets, Some(&new), created).await
    }
}

impl Sync {
    async fn create_new_set(
        &self,
        d: &Deployment,
        sets: &[ReplicaSet],
    ) -> Result<ReplicaSet, kube::Error> {
        let ns = d.namespace().unwrap_or_default();
        let spec = d.spec.clone().unwrap_or_default();
        let collision = d.status.as_ref().and_then(|s| s.collision_count);
        let defaulted: PodTemplateSpec =
            serde_json::from_value(comparable(&spec.template)).map_err(kube::Error::SerdeError)?;
        let hash = pod_template_hash(&defaulted, collision);
        let mut template = defaulted.clone();
        template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let mut selector = spec.selector.clone();
        selector
            .match_labels
            .get_or_insert_with(BTreeMap::new)
            .insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let next_revision = sets
            .iter()
            .map(revision)
            .max()
            .unwrap_or(0)
            .saturating_add(1);
        let (surge, _) = fenceposts(d);
        let replicas = spec.replicas.unwrap_or(1);
        let mut labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        labels.insert(POD_TEMPLATE_HASH.into(), hash.clone());
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {
                "name": format!("{}-{hash}", d.name_any()),
                "namespace": ns,
                "labels": labels,
                "annotations": {
                    REVISION: next_revision.to_string(),
                    "deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                    "deployment.kubernetes.io/max-replicas": (i64::from(replicas) + i64::from(surge)).to_string(),
                },
                "ownerReferences": [controller_ref(d)],
            },
            "spec": {
                "replicas": 0,
                "minReadySeconds": spec.min_ready_seconds.unwrap_or(0),
                "selector": selector,
                "template": template,
            },
        }))
        .map_err(kube::Error::SerdeError)?;
        let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), &ns);
        let created = match api.create(&PostParams::default(), &rs).await {
            Ok(rs) => rs,
            // Ours already (the cache lags): use it.
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(&rs.name_any()).await?;
                if !controlled_by(&existing, &d.uid().unwrap_or_default()) {
                    return Err(kube::Error::Api(s));
                }
                return Ok(existing);
            }
            Err(e) => return Err(e),
        };
        let api_d: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
        api_d
            .patch(
                &d.name_any(),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {REVISION: next_revision.to_string()}}}),
                ),
            )
            .await?;
        Ok(created)
    }

    /// Sets a ReplicaSet's replicas and records `ScalingReplicaSet`.
    async fn scale(&self, d: &Deployment, rs: &mut ReplicaSet, to: i32) -> Result<(), kube::Error> {
        let from = rs_replicas(rs);
        if from == to {
            return Ok(());
        }
        let api: Api<ReplicaSet> =
            Api::namespaced(self.client.clone(), &rs.namespace().unwrap_or_default());
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let (surge, _) = fenceposts(d);
        let patch = json!({
            "metadata": {"annotations": {
                "deployment.kubernetes.io/desired-replicas": replicas.to_string(),
                "deployment.kubernetes.io/max-replicas": (i64::from(replicas) + i64::from(surge)).to_string(),
            }},
            "spec": {"replicas": to},
        });
        *rs = api
            .patch(
                &rs.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        let direction = if to > from { "up" } else { "down" };
        self.events.normal(
            &d.object_ref(&()),
            "ScalingReplicaSet",
            "Scaling",
            format!(
                "Scaled {direction} replica set {} from {from} to {to}",
                rs.name_any()
            ),
        );
        Ok(())
    }

    /// Deletes old ReplicaSets with no replicas beyond `revisionHistoryLimit`.
    async fn cleanup(
        &self,
        d: &Deployment,
        sets: &[ReplicaSet],
        new_idx: usize,
    ) -> Result<(), kube::Error> {
        let limit = d
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(10)
            .max(0) as usize;
        let idle: Vec<&ReplicaSet> = sets
            .iter()
            .enumerate()
            .filter(|(i, rs)| *i != new_idx && rs_replicas(rs) == 0 && rs_status(rs).0 == 0)
            .map(|(_, rs)| rs)
            .collect();
        if idle.len() <= limit {
            return Ok(());
        }
        for rs in &idle[..idle.len() - limit] {
            let api: Api<ReplicaSet> =
                Api::namespaced(self.client.clone(), &rs.namespace().unwrap_or_default());
            match api.delete(&rs.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn write_status(
        &self,
        d: &Deployment,
        sets: &[ReplicaSet],
        new: Option<&ReplicaSet>,
        created: Option<String>,
    ) -> Result<Option<Duration>, kube::Error> {
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let (_, max_unavailable) = fenceposts(d);
        let total: i32 = sets.iter().map(|rs| rs_status(rs).0).sum();
        let ready: i32 = sets.iter().map(|rs| rs_status(rs).1).sum();
        let available: i32 = sets.iter().map(|rs| rs_status(rs).2).sum();
        let updated = new.map_or(0, |rs| rs_status(rs).0);
        let new_available = new.map_or(0, |rs| rs_status(rs).2);
        let old = d.status.clone().unwrap_or_default();
        let old_conditions = old.conditions.clone().unwrap_or_default();
        let now = self.clock.now().to_string();
        let find = |t: &str| old_conditions.iter().find(|c| c.type_ == t);
        let mut conditions = Vec::new();
        let (a_status, a_reason, a_message) = if available >= replicas - max_unavailable {
            (
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            )
        } else {
            (
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            )
        };
        conditions.push(keep_time(
            find("Available"),
            condition(&now, "Available", a_status, a_reason, a_message.into()),
        ));
        let rs_name = new.map(|rs| rs.name_any()).unwrap_or_default();
        let complete = updated == replicas && new_available == replicas && total == replicas;
        let progressing = if let Some(name) = created {
            condition(
                &now,
                "Progressing",
                "True",
                "NewReplicaSetCreated",
                format!("Created new replica set \"{name}\""),
            )
        } else if complete {
            condition(
                &now,
                "Progressing",
                "True",
                "NewReplicaSetAvailable",
                format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            )
        } else {
            condition(
                &now,
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                format!("ReplicaSet \"{rs_name}\" is progressing."),
            )
        };
        conditions.push(keep_time(find("Progressing"), progressing));
        let status = json!({
            "observedGeneration": d.metadata.generation,
            "replicas": total,
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            "unavailableReplicas": (replicas - available).max(0),
            "conditions": conditions,
        });
        let before = serde_json::to_value(&old).unwrap_or_default();
        let same_counts = !counts_differ(
            &before,
            &status,
            [
                "observedGeneration",
                "replicas",
                "updatedReplicas",
                "readyReplicas",
                "availableReplicas",
                "unavailableReplicas",
            ],
        );
        let same_conditions = conditions.iter().all(|c| {
            find(c["type"].as_str().unwrap_or("")).is_some_and(|o| {
                o.status == c["status"]
                    && o.reason.as_deref() == c["reason"].as_str()
                    && o.message.as_deref() == c["message"].as_str()
            })
        });
        if !(same_counts && same_conditions) {
            let api: Api<Deployment> =
                Api::namespaced(self.client.clone(), &d.namespace().unwrap_or_default());
            patch_status(&api, &d.name_any(), status).await?;
        }
        Ok(None)
    }
}

/// Keeps a condition's `lastTransitionTime` while its status does not change.
fn keep_time(
    old: Option<&k8s_openapi::api::apps::v1::DeploymentCondition>,
    mut new: Value,
) -> Value {
    if let Some(old) = old
        && old.status == new["status"]
        && let Some(t) = &old.last_transition_time
    {
        new["lastTransitionTime"] = json!(t.0.to_string());
    }
    new
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(replicas: i32, surge: Value, unavailable: Value) -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "d"}, "spec": {
            "replicas": replicas, "selector": {},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}},
            "template": {}}}))
        .unwrap()
    }

    /// Upstream `ResolveFenceposts`: surge rounds up, unavailable rounds down, both 0 is
    /// 0/1.
    #[test]
    fn fenceposts_round_as_upstream() {
        assert_eq!(
            fenceposts(&deployment(3, json!("25%"), json!("25%"))),
            (1, 0)
        );
        assert_eq!(
            fenceposts(&deployment(10, json!("25%"), json!("25%"))),
            (3, 2)
        );
        assert_eq!(fenceposts(&deployment(4, json!(0), json!("10%"))), (0, 1));
        assert_eq!(fenceposts(&deployment(4, json!(2), json!(1))), (2, 1));
    }

    /// The hash only uses `SafeEncodeString`'s alphabet and changes with the template.
    #[test]
    fn template_hash() {
        let a: PodTemplateSpec = serde_json::from_value(
            json!({"spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}),
        )
        .unwrap();
        let b: PodTemplateSpec = serde_json::from_value(
            json!({"spec": {"containers": [{"name": "c", "image": "nginx:2"}]}}),
        )
        .unwrap();
        let h = pod_template_hash(&a, None);
        assert!(h.bytes().all(|c| ALPHANUMS.contains(&c)) && !h.is_empty());
        assert_eq!(h, pod_template_hash(&a, None));
        assert_ne!(h, pod_template_hash(&b, None));
        assert_ne!(h, pod_template_hash(&a, Some(1)));
    }
}
