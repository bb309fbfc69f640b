//! The ReplicaSet controller: keeps `spec.replicas` pods that carry the ReplicaSet's
//! controllerRef.
//!
//! # What upstream does (`pkg/controller/replicaset/replica_set.go`)
//!
//! - The active pods (not Succeeded/Failed, not being deleted) controlled by the ReplicaSet
//!   are counted; missing ones are created from the template in slow-start batches (1, 2,
//!   4, … up to `burstReplicas` = 500 per sync), extra ones deleted, ranked so that
//!   unassigned pods go before pending, pending before unknown, unknown before running, not
//!   ready before ready, and then the most recently created first.
//! - Expectations: after creating or deleting, the controller waits to observe those pods
//!   before it counts again (5 minute timeout).
//! - Events `SuccessfulCreate` "Created pod: x", `SuccessfulDelete` "Deleted pod: x".
//! - A ReplicaSet being deleted is not managed; its status is still written.
//! - Status: `replicas`, `fullyLabeledReplicas`, `readyReplicas`, `availableReplicas`
//!   (ready for `minReadySeconds`), `observedGeneration`.
//!
//! # Where we differ
//!
//! - Orphan pods matching the selector are not adopted, nor are owned pods that stop
//!   matching released.
//! - No `ReplicaFailure` condition.

use std::{cmp::Reverse, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::clock::WallClock;

use super::workload::{
    EventSink, Expectations, Reconcile, availability, controlled_by, controller_key,
    controller_ref, counts_differ, create_pod, delete_pod, drive, is_active, is_ready, key_of,
    patch_status, phase, pod_from_template, select, watch,
};

/// Most pods created or deleted in one sync (upstream `BurstReplicas`).
pub const BURST_REPLICAS: usize = 500;

/// The ReplicaSet controller.
pub struct ReplicaSetController {
    client: Client,
}

impl std::fmt::Debug for ReplicaSetController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaSetController")
            .finish_non_exhaustive()
    }
}

impl ReplicaSetController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (sets, set_events) = watch(Api::<ReplicaSet>::all(self.client.clone()), |rs| {
            vec![key_of(rs)]
        });
        let (pods, pod_events) = watch(Api::<Pod>::all(self.client.clone()), |p| {
            controller_key(p, "ReplicaSet")
        });
        let events = EventSink::spawn(
            self.client.clone(),
            "replicaset-controller",
            shutdown.clone(),
        );
        let sync = Sync {
            client: self.client,
            sets,
            pods,
            events,
            expectations: Expectations::default(),
            clock: WallClock::new(),
        };
        drive(sync, vec![set_events, pod_events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    sets: Store<ReplicaSet>,
    pods: Store<Pod>,
    events: EventSink,
    expectations: Expectations,
    clock: WallClock,
}

/// Upstream's `ActivePods` ordering for deletion: the first pods of the result go first.
fn deletion_rank(pod: &Pod) -> (bool, u8, bool, Reverse<Option<jiff::Timestamp>>) {
    let assigned = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let phase_rank: u8 = match phase(pod) {
        "Pending" => 0,
        "Unknown" => 1,
        "Running" => 2,
        _ => 3,
    };
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (assigned, phase_rank, is_ready(pod), Reverse(created))
}

/// Creates `count` pods in slow-start batches (1, 2, 4, …), stopping at the first error.
pub(crate) async fn slow_start_create(
    client: &Client,
    events: &EventSink,
    expectations: &mut Expectations,
    key: &str,
    owner: &k8s_openapi::api::core::v1::ObjectReference,
    pod: &Pod,
    count: usize,
) -> Result<(), kube::Error> {
    let mut remaining = count;
    let mut batch = 1;
    while remaining > 0 {
        let n = batch.min(remaining);
        let results =
            futures::future::join_all((0..n).map(|_| create_pod(client, events, owner, pod))).await;
        let mut error = None;
        for r in results {
            match r {
                Ok(name) => expectations.expect(key, name, true),
                Err(e) => error = Some(e),
            }
        }
        if let Some(e) = error {
            return Err(e);
        }
        remaining -= n;
        batch *= 2;
    }
    Ok(())
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "replicaset"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(rs) = self.sets.get(&ObjectRef::new(name).within(ns)) else {
            self.expectations.forget(key);
            return Ok(None);
        };
        let uid = rs.uid().unwrap_or_default();
        let spec = rs.spec.clone().unwrap_or_default();
        let want = spec.replicas.unwrap_or(1).max(0) as usize;
        let mut active: Vec<_> = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && controlled_by(p, &uid) && is_active(p)
        });
        let owner = rs.object_ref(&());
        if self.expectations.satisfied(key, &self.pods, ns)
            && rs.metadata.deletion_timestamp.is_none()
        {
            if active.len() < want {
                let Some(template) = spec.template.as_ref() else {
                    return Ok(None);
                };
                let pod = pod_from_template(template, controller_ref(&*rs), ns, name, &[]);
                let count = (want - active.len()).min(BURST_REPLICAS);
                debug!(count, "creating pods");
                slow_start_create(
                    &self.client,
                    &self.events,
                    &mut self.expectations,
                    key,
                    &owner,
                    &pod,
                    count,
                )
                .await?;
            } else if active.len() > want {
                let count = (active.len() - want).min(BURST_REPLICAS);
                active.sort_by_cached_key(|p| deletion_rank(p));
                debug!(count, "deleting pods");
                for pod in active.iter().take(count) {
                    self.expectations.expect(key, pod.name_any(), false);
                    if let Err(e) = delete_pod(&self.client, &self.events, &owner, pod).await {
                        self.expectations.forget(key);
                        return Err(e);
                    }
                }
            }
        }
        self.write_status(&rs, ns, &uid).await
    }
}

impl Sync {
    /// Writes the counts when they changed; when a ready pod is not yet available, asks
    /// for a pass once it will be.
    async fn write_status(
        &self,
        rs: &ReplicaSet,
        ns: &str,
        uid: &str,
    ) -> Result<Option<Duration>, kube::Error> {
        let spec = rs.spec.clone().unwrap_or_default();
        let min_ready = i64::from(spec.min_ready_seconds.unwrap_or(0));
        let template_labels = spec
            .template
            .as_ref()
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        let pods = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && controlled_by(p, uid) && is_active(p)
        });
        let mut again: Option<Duration> = None;
        let now = self.clock.now();
        let (mut ready, mut available, mut labeled) = (0, 0, 0);
        for p in &pods {
            let labels = p.labels();
            if template_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
            {
                labeled += 1;
            }
            if is_ready(p) {
                ready += 1;
            }
            match availability(p, min_ready, now) {
                Ok(()) => available += 1,
                Err(Some(d)) => again = Some(again.map_or(d, |a| a.min(d))),
                Err(None) => {}
            }
        }
        let status = json!({
            "replicas": pods.len(),
            "fullyLabeledReplicas": labeled,
            "readyReplicas": ready,
            "availableReplicas": available,
            "observedGeneration": rs.metadata.generation,
        });
        let current =
            serde_json::to_value(rs.status.clone().unwrap_or_default()).unwrap_or_default();
        let changed = counts_differ(
            &current,
            &status,
            [
                "replicas",
                "fullyLabeledReplicas",
                "readyReplicas",
                "availableReplicas",
                "observedGeneration",
            ],
        );
        if changed {
            let api: Api<ReplicaSet> = Api::namespaced(self.client.clone(), ns);
            patch_status(&api, &rs.name_any(), status).await?;
        }
        Ok(again)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, node: Option<&str>, phase: &str, ready: bool, created: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
        .unwrap()
    }

    /// Upstream `ActivePods` ordering: unassigned < pending < running, not ready < ready,
    /// newer before older.
    #[test]
    fn deletion_order() {
        let mut pods = [
            pod(
                "old-ready",
                Some("n"),
                "Running",
                true,
                "2026-01-01T00:00:00Z",
            ),
            pod(
                "new-ready",
                Some("n"),
                "Running",
                true,
                "2026-01-02T00:00:00Z",
            ),
            pod(
                "not-ready",
                Some("n"),
                "Running",
                false,
                "2026-01-01T00:00:00Z",
            ),
            pod(
                "pending",
                Some("n"),
                "Pending",
                false,
                "2026-01-01T00:00:00Z",
            ),
            pod("unassigned", None, "Pending", false, "2026-01-01T00:00:00Z"),
        ];
        pods.sort_by_cached_key(deletion_rank);
        let names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
        assert_eq!(
            names,
            [
                "unassigned",
                "pending",
                "not-ready",
                "new-ready",
                "old-ready"
            ]
        );
    }
}
