//! Pod garbage collection: terminated pods beyond a threshold, terminating pods of
//! out-of-service Nodes, pods bound to Nodes that no longer exist, unscheduled terminating
//! pods.
//!
//! # What upstream does (`pkg/controller/podgc/gc_controller.go`)
//!
//! Every `gcCheckPeriod` (20s) the controller:
//!
//! - `gcOrphaned`: a pod whose `spec.nodeName` names a Node that is absent from the informer
//!   is a candidate; the Node must stay absent for a quarantine of 40s and be confirmed
//!   absent with a live GET. The pod is then, unless already terminal, marked `Failed` with
//!   the condition `DisruptionTarget=True` (reason `DeletionByPodGC`, message "PodGC: node no
//!   longer exists") and force-deleted (grace period 0);
//! - `gcUnscheduledTerminating`: a terminating pod (deletionTimestamp) that was never
//!   scheduled is force-deleted;
//! - `gcTerminated`: when more pods than `--terminated-pod-gc-threshold` (12500; 0 turns it
//!   off) are terminated (`Succeeded` or `Failed`), the excess is force-deleted, evicted
//!   pods first, then the oldest by creation time (`byEvictionAndCreationTimestamp`);
//! - `gcTerminating` (non-graceful node shutdown): a terminating pod on a Node that is not
//!   Ready and carries the `node.kubernetes.io/out-of-service` taint is marked `Failed` and
//!   force-deleted, so its workload recreates it elsewhere and its volumes detach.
//!
//! A terminating pod on a missing Node falls under `gcOrphaned`, so it is force-deleted: no
//! kubelet will ever finish its graceful deletion.
//!
//! # Where we differ
//!
//! - Nodes and pods are listed each period instead of being read from informers.

use crate::clock::WallClock;
use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

/// The taint an administrator puts on a Node that is shut down for good
/// (non-graceful node shutdown): its terminating pods are force-deleted.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

fn is_terminated(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Evicted by the kubelet (`status.reason: Evicted`).
fn is_evicted(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some("Evicted")
}

fn creation(pod: &Pod) -> Option<jiff::Timestamp> {
    pod.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

/// Configuration of the pod GC controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGcConfig {
    /// How often a pass runs (upstream `gcCheckPeriod`, 20s).
    pub gc_check_period: Duration,
    /// How long a Node must be seen absent before its pods go (upstream `quarantineTime`, 40s).
    pub quarantine: Duration,
    /// `--terminated-pod-gc-threshold` (12500): terminated pods kept before the oldest are
    /// deleted; 0 keeps them all.
    pub terminated_pod_gc_threshold: usize,
}

impl Default for PodGcConfig {
    fn default() -> Self {
        Self {
            gc_check_period: Duration::from_secs(20),
            quarantine: Duration::from_secs(40),
            terminated_pod_gc_threshold: 12_500,
        }
    }
}

/// The pod GC controller.
pub struct PodGcController {
    client: Client,
    config: PodGcConfig,
    /// When each missing Node was first seen missing.
    absent_since: HashMap<String, Instant>,
    /// The time written into conditions (follows tokio's clock).
    clock: WallClock,
}

impl std::fmt::Debug for PodGcController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodGcController")
            .field("config", &self.config)
            .field("absent_since", &self.absent_since)
            .finish_non_exhaustive()
    }
}

impl PodGcController {
    /// A controller with `config`.
    pub fn new(client: Client, config: PodGcConfig) -> Self {
        Self {
            client,
            config,
            absent_since: HashMap::new(),
            clock: WallClock::new(),
        }
    }

    /// Runs a pass every `gc_check_period` until `shutdown` is cancelled. A failed pass is
    /// logged and the next one retries (with the period as the backoff).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.gc_check_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let span = info_span!("pod_gc_pass");
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.gc_once().instrument(span) => r,
            };
            if let Err(e) = result {
                warn!(error = %e, "pod GC pass failed; retrying next period");
            }
        }
    }

    /// One pass, in upstream's order: terminated pods beyond the threshold, terminating
    /// pods of out-of-service nodes, orphaned pods, unscheduled terminating pods.
    pub async fn gc_once(&mut self) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let node_list = nodes.list(&ListParams::default()).await?.items;
        let present: HashSet<String> = node_list.iter().map(|n| n.name_any()).collect();
        let mut all = pods.list(&ListParams::default()).await?.items;
        let gone = self.gc_terminated(&all).await;
        let gone_too = self.gc_terminating(&all, &node_list).await;
        all.retain(|p| {
            let uid = p.uid().unwrap_or_default();
            !gone.contains(&uid) && !gone_too.contains(&uid)
        });
        let now = Instant::now();
        let mut missing_seen = HashSet::new();
        for pod in &all {
            let node_name = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            if node_name.is_empty() {
                if pod.metadata.deletion_timestamp.is_some() {
                    let span = info_span!("pod_gc", pod = %key);
                    async {
                        info!("force-deleting unscheduled terminating pod");
                        self.force_delete(pod).await;
                    }
                    .instrument(span)
                    .await;
                }
                continue;
            }
            if present.contains(&node_name) {
                continue;
            }
            missing_seen.insert(node_name.clone());
            let since = *self.absent_since.entry(node_name.clone()).or_insert(now);
            if now.duration_since(since) < self.config.quarantine {
                debug!(pod = %key, node = %node_name, "node missing; in quarantine");
                continue;
            }
            // Confirm with a live read: the list may be stale.
            if nodes.get_metadata_opt(&node_name).await?.is_some() {
                continue;
            }
            let span = info_span!("pod_gc", pod = %key, node = %node_name);
            async {
                info!("deleting pod bound to a node that no longer exists");
                self.mark_failed(pod, Some("PodGC: node no longer exists"))
                    .await;
                self.force_delete(pod).await;
            }
            .instrument(span)
            .await;
        }
        self.absent_since.retain(|n, _| missing_seen.contains(n));
        Ok(())
    }

    /// `gcTerminated`: force-deletes the terminated pods beyond the threshold, evicted
    /// ones first, then the oldest; returns their uids.
    async fn gc_terminated(&self, all: &[Pod]) -> HashSet<String> {
        let threshold = self.config.terminated_pod_gc_threshold;
        let mut terminated: Vec<&Pod> = all.iter().filter(|p| is_terminated(p)).collect();
        if threshold == 0 || terminated.len() <= threshold {
            return HashSet::new();
        }
        // `byEvictionAndCreationTimestamp`: evicted first, then by creation time, then name.
        terminated.sort_by(|a, b| {
            (!is_evicted(a), creation(a), a.name_any()).cmp(&(
                !is_evicted(b),
                creation(b),
                b.name_any(),
            ))
        });
        let excess = terminated.len() - threshold;
        info!(
            terminated = terminated.len(),
            threshold, excess, "garbage collecting terminated pods"
        );
        let mut gone = HashSet::new();
        for pod in terminated.into_iter().take(excess) {
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            self.force_delete(pod)
                .instrument(info_span!("pod_gc", pod = %key))
                .await;
            gone.insert(pod.uid().unwrap_or_default());
        }
        gone
    }

    /// `gcTerminating`: force-deletes the terminating pods of Nodes that are not Ready and
    /// carry the `node.kubernetes.io/out-of-service` taint; returns their uids.
    async fn gc_terminating(&self, all: &[Pod], nodes: &[Node]) -> HashSet<String> {
        let out_of_service: HashSet<String> = nodes
            .iter()
            .filter(|n| !node_ready(n) && has_taint(n, OUT_OF_SERVICE_TAINT))
            .map(|n| n.name_any())
            .collect();
        let mut gone = HashSet::new();
        if out_of_service.is_empty() {
            return gone;
        }
        for pod in all {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
            if pod.metadata.deletion_timestamp.is_none()
                || !node.is_some_and(|n| out_of_service.contains(n))
            {
                continue;
            }
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            async {
                info!("force-deleting terminating pod of an out-of-service node");
                self.mark_failed(pod, None).await;
                self.force_delete(pod).await;
            }
            .instrument(info_span!("pod_gc", pod = %key, node = node.unwrap_or_default()))
            .await;
            gone.insert(pod.uid().unwrap_or_default());
        }
        gone
    }

    /// Marks a non-terminal pod Failed, with the `DisruptionTarget` condition carrying
    /// `message` when given (best effort).
    async fn mark_failed(&self, pod: &Pod, disruption: Option<&str>) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return;
        }
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let now = self.clock.now().to_string();
        let patch = match disruption {
            Some(message) => json!({"status": {
                "phase": "Failed",
                "conditions": [{
                    "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                    "message": message, "lastTransitionTime": now,
                }],
            }}),
            None => json!({"status": {"phase": "Failed"}}),
        };
        if let Err(e) = api
            .patch_status(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            warn!(error = %e, "failed to mark pod Failed before deletion");
        }
    }

    /// DELETE with grace period 0 and the pod's uid as precondition.
    async fn force_delete(&self, pod: &Pod) {
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&pod.name_any(), &dp).await {
            Ok(_) => info!("pod force-deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => warn!(error = %e, "failed to delete pod"),
        }
    }
}
