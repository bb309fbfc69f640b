//! Pod garbage collection: pods bound to Nodes that no longer exist.
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
//! - `gcTerminated` (pods beyond `--terminated-pod-gc-threshold`) and `gcTerminating` (pods
//!   on NotReady Nodes with the `out-of-service` taint) also run.
//!
//! A terminating pod on a missing Node falls under `gcOrphaned`, so it is force-deleted: no
//! kubelet will ever finish its graceful deletion.
//!
//! # Where we differ
//!
//! - Nodes and pods are listed each period instead of being read from informers.
//! - `gcTerminated` and `gcTerminating` (out-of-service taint) are not implemented.

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

/// Configuration of the pod GC controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodGcConfig {
    /// How often a pass runs (upstream `gcCheckPeriod`, 20s).
    pub gc_check_period: Duration,
    /// How long a Node must be seen absent before its pods go (upstream `quarantineTime`, 40s).
    pub quarantine: Duration,
}

impl Default for PodGcConfig {
    fn default() -> Self {
        Self {
            gc_check_period: Duration::from_secs(20),
            quarantine: Duration::from_secs(40),
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

    /// One pass: orphaned pods and unscheduled terminating pods.
    pub async fn gc_once(&mut self) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let present: HashSet<String> = nodes
            .list_metadata(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|n| n.name_any())
            .collect();
        let all = pods.list(&ListParams::default()).await?.items;
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
                self.mark_failed(pod).await;
                self.force_delete(pod).await;
            }
            .instrument(span)
            .await;
        }
        self.absent_since.retain(|n, _| missing_seen.contains(n));
        Ok(())
    }

    /// Marks a non-terminal pod Failed with the `DisruptionTarget` condition (best effort).
    async fn mark_failed(&self, pod: &Pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return;
        }
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let now = self.clock.now().to_string();
        let patch = json!({"status": {
            "phase": "Failed",
            "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                "message": "PodGC: node no longer exists", "lastTransitionTime": now,
            }],
        }});
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
