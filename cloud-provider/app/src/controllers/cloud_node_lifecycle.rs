//! The cloud-node-lifecycle controller (upstream
//! `controllers/nodelifecycle/node_lifecycle_controller.go`).
//!
//! Every [`CloudNodeLifecycleConfig::node_monitor_period`] it looks at every Node (from the
//! shared Node cache, no LIST per period):
//!
//! - a Ready Node loses the [`TAINT_SHUTDOWN`] taint, without any cloud call;
//! - a NotReady or Unknown Node (no Ready condition counts as Unknown) is checked in the cloud:
//!   gone → event `Normal DeletingNode` and DELETE (`Warning DeletingNodeFailed` on failure);
//!   exists and shut down → the `node.cloudprovider.kubernetes.io/shutdown:NoSchedule` taint.
//!
//! Beyond upstream:
//!
//! - [`CloudNodeLifecycleConfig::out_of_service_after`] (off by default): a Node seen
//!   NotReady with its instance shut down for that long gets
//!   `node.kubernetes.io/out-of-service:NoExecute`, the taint of a non-graceful node
//!   shutdown (upstream `pkg/controller/podgc/gc_controller.go` `gcTerminating` then
//!   force-deletes its terminating pods); the taint goes when the Node is Ready again;
//!
//! - [`CloudError::InstanceNotFound`] from the existence or
//!   the shutdown check (wrapped or not) counts as gone; upstream treats it as an unknown
//!   answer and the dead Node lingers;
//! - [`CloudNodeLifecycleConfig::delete_grace_period`]: a Node is deleted only once the cloud
//!   has said "gone" for that long, at least twice, without saying "exists" in between
//!   (0 = upstream: at once). The default, 60 s, is safe
//!   against an eventually-consistent cloud: kubernetes#127424 ("EKS has seen … delete a Node
//!   that does exist") came from a single "not found" answer about a new instance. It costs
//!   one minute before a dead Node goes, well inside the 5 minutes the taint-eviction of a
//!   NotReady Node already waits.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{Instrument, debug, info, info_span, warn};

use super::CloudPriority;
use super::ControllerContext;
use super::events::EventType;
use super::maintenance::{self, MaintenanceConfig};
use super::node::{CloudNodeConfigError, has_taint, node_name, provider_id_of, supports_instances};
use cloud_provider::well_known::TAINT_SHUTDOWN;
use cloud_provider::{CloudError, instance_provider_id};

/// The default of [`CloudNodeLifecycleConfig::delete_grace_period`] and of
/// `--node-deletion-grace-period`: one minute of "gone" answers before a Node is deleted.
pub(crate) const DEFAULT_DELETE_GRACE_PERIOD: Duration = Duration::from_secs(60);

/// The event source component of this controller.
pub(crate) const COMPONENT: &str = "cloud-node-lifecycle-controller";

/// Settings of the cloud-node-lifecycle controller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudNodeLifecycleConfig {
    /// How often every Node is checked (`--node-monitor-period`, default 5 s).
    pub node_monitor_period: Duration,
    /// How long the cloud must keep saying "gone" (at least twice) before the Node is deleted
    /// (beyond upstream; default 60 s; 0 is upstream's immediate
    /// deletion on the first answer).
    pub delete_grace_period: Duration,
    /// Put the cloud's scheduled events on the Nodes (beyond upstream; `None` = never).
    pub maintenance: Option<MaintenanceConfig>,
    /// Add the out-of-service taint to a Node NotReady and shut down for this long (beyond
    /// upstream; `None` = never, the default).
    pub out_of_service_after: Option<Duration>,
}

impl Default for CloudNodeLifecycleConfig {
    fn default() -> Self {
        CloudNodeLifecycleConfig {
            node_monitor_period: Duration::from_secs(5),
            delete_grace_period: DEFAULT_DELETE_GRACE_PERIOD,
            maintenance: None,
            out_of_service_after: None,
        }
    }
}

impl CloudNodeLifecycleConfig {
    /// Sets [`node_monitor_period`](Self::node_monitor_period).
    pub fn with_node_monitor_period(mut self, period: Duration) -> Self {
        self.node_monitor_period = period;
        self
    }

    /// Sets [`maintenance`](Self::maintenance).
    pub fn with_maintenance(mut self, maintenance: Option<MaintenanceConfig>) -> Self {
        self.maintenance = maintenance;
        self
    }

    /// Sets [`out_of_service_after`](Self::out_of_service_after).
    pub fn with_out_of_service_after(mut self, after: Option<Duration>) -> Self {
        self.out_of_service_after = after;
        self
    }

    /// Sets [`delete_grace_period`](Self::delete_grace_period).
    pub fn with_delete_grace_period(mut self, grace: Duration) -> Self {
        self.delete_grace_period = grace;
        self
    }
}

/// The cloud's answer about one Node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Existence {
    Exists,
    Gone,
}

/// The cloud-node-lifecycle controller. Build it with [`new`](Self::new), then
/// [`run`](Self::run) it.
pub struct CloudNodeLifecycleController {
    ctx: ControllerContext,
    config: CloudNodeLifecycleConfig,
    /// When the cloud first said "gone" for each Node, and how many times since, for the
    /// grace period.
    gone_since: HashMap<String, (Instant, u32)>,
    /// When each Node was first seen NotReady with its instance shut down.
    shut_down_since: HashMap<String, Instant>,
}

impl std::fmt::Debug for CloudNodeLifecycleController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudNodeLifecycleController")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl CloudNodeLifecycleController {
    /// A controller, or `Ok(None)` when the provider supports neither `InstancesV2` nor
    /// `Instances` (skipped, as upstream). Errors when the monitor period is zero.
    pub fn new(
        ctx: ControllerContext,
        config: CloudNodeLifecycleConfig,
    ) -> Result<Option<Self>, CloudNodeConfigError> {
        if config.node_monitor_period.is_zero() {
            return Err(CloudNodeConfigError::ZeroPeriod("node-monitor-period"));
        }
        if !supports_instances(ctx.cloud.as_ref()) {
            warn!(
                "cloud provider supports neither InstancesV2 nor Instances: cloud-node-lifecycle controller skipped"
            );
            return Ok(None);
        }
        Ok(Some(CloudNodeLifecycleController {
            ctx,
            config,
            gone_since: HashMap::new(),
            shut_down_since: HashMap::new(),
        }))
    }

    /// Runs until the context's shutdown token is cancelled.
    pub async fn run(mut self) {
        let shutdown = self.ctx.shutdown.clone();
        let ctx = self.ctx.clone();
        let maintenance = self.config.maintenance.filter(|m| !m.period.is_zero());
        let planned = async {
            match maintenance {
                Some(config) => maintenance::run(&ctx, config).await,
                None => std::future::pending().await,
            }
        };
        let monitor = async {
            self.ctx.nodes.wait_synced().await;
            let mut ticker = tokio::time::interval(self.config.node_monitor_period);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                self.monitor_nodes().await;
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = monitor => {}
            () = planned => {}
        }
    }

    /// Upstream's `MonitorNodes`: one pass over every Node of the shared cache.
    async fn monitor_nodes(&mut self) {
        let nodes = self.ctx.nodes.list();
        let names: HashSet<&str> = nodes.iter().map(|n| node_name(n)).collect();
        self.gone_since
            .retain(|name, _| names.contains(name.as_str()));
        self.shut_down_since
            .retain(|name, _| names.contains(name.as_str()));
        // Another ccm's Nodes (several ccms in one cluster) are neither tainted nor deleted.
        let ctx = self.ctx.clone();
        for node in nodes.iter().filter(|n| ctx.owns(COMPONENT, n)) {
            let span = info_span!("monitor_node", node = %node_name(node));
            self.monitor_node(node).instrument(span).await;
        }
    }

    async fn monitor_node(&mut self, node: &Node) {
        let name = node_name(node).to_owned();
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        if ready_status(node) == "True" {
            self.gone_since.remove(&name);
            self.shut_down_since.remove(&name);
            let out_of_service =
                self.config.out_of_service_after.is_some() && has_taint(node, TAINT_OUT_OF_SERVICE);
            if (has_taint(node, TAINT_SHUTDOWN) || out_of_service)
                && let Err(err) = set_shutdown_taint(&api, node, false, false).await
            {
                warn!(error = %err, "failed to remove the shutdown taint");
            }
            return;
        }
        let existence = match self.exists(node).await {
            Ok(existence) => existence,
            Err(err) => {
                warn!(error = %err, "error checking if node exists in the cloud; skipping it");
                return;
            }
        };
        if existence == Existence::Exists {
            match self.shutdown(node).await {
                Ok(Some(true)) => {
                    self.gone_since.remove(&name);
                    let since = *self
                        .shut_down_since
                        .entry(name.clone())
                        .or_insert_with(Instant::now);
                    let out_of_service = self
                        .config
                        .out_of_service_after
                        .is_some_and(|after| since.elapsed() >= after);
                    let missing = !has_taint(node, TAINT_SHUTDOWN)
                        || (out_of_service && !has_taint(node, TAINT_OUT_OF_SERVICE));
                    if missing
                        && let Err(err) = set_shutdown_taint(&api, node, true, out_of_service).await
                    {
                        warn!(error = %err, "failed to add the shutdown taint");
                    }
                    return;
                }
                Ok(Some(false)) => {
                    self.gone_since.remove(&name);
                    self.shut_down_since.remove(&name);
                    return;
                }
                // The shutdown check said "instance not found": gone (beyond upstream).
                Ok(None) => {}
                Err(err) => {
                    warn!(error = %err, "error checking if node is shut down");
                    return;
                }
            }
        }
        let now = Instant::now();
        let (first, answers) = {
            let entry = self.gone_since.entry(name.clone()).or_insert((now, 0));
            entry.1 += 1;
            *entry
        };
        let grace = self.config.delete_grace_period;
        if !grace.is_zero() && (now.duration_since(first) < grace || answers < 2) {
            debug!("the cloud says the node is gone; waiting out the grace period");
            return;
        }
        self.gone_since.remove(&name);
        info!("deleting node because it does not exist in the cloud provider");
        self.ctx
            .events
            .record(
                COMPONENT,
                node,
                EventType::Normal,
                "DeletingNode",
                &format!("Deleting node {name} because it does not exist in the cloud provider"),
            )
            .await;
        if let Err(err) = api.delete(&name, &DeleteParams::default()).await {
            warn!(error = %err, "unable to delete node");
            self.ctx
                .events
                .record(
                    COMPONENT,
                    node,
                    EventType::Warning,
                    "DeletingNodeFailed",
                    &format!("Error deleting node {name}: {err}"),
                )
                .await;
        }
    }

    /// The existence check: V2 `instance_exists`, or V1 by provider ID (looked up by name when
    /// the Node has none). `InstanceNotFound` anywhere means gone.
    async fn exists(&self, node: &Node) -> Result<Existence, CloudError> {
        let cloud = self.ctx.cloud.as_ref();
        let answer = if let Some(v2) = cloud.instances_v2() {
            self.ctx
                .cloud_limiter
                .call(CloudPriority::NodeLifecycle, v2.instance_exists(node))
                .await
        } else if let Some(instances) = cloud.instances() {
            let provider_id = match self.provider_id(node, CloudPriority::NodeLifecycle).await {
                Ok(id) => id,
                Err(err) if err.is_instance_not_found() => return Ok(Existence::Gone),
                Err(err) => return Err(err),
            };
            let exists = instances.instance_exists_by_provider_id(&provider_id);
            self.ctx
                .cloud_limiter
                .call(CloudPriority::NodeLifecycle, exists)
                .await
        } else {
            return Ok(Existence::Exists);
        };
        match answer {
            Ok(true) => Ok(Existence::Exists),
            Ok(false) => Ok(Existence::Gone),
            Err(err) if err.is_instance_not_found() => Ok(Existence::Gone),
            Err(err) => Err(err),
        }
    }

    /// The shutdown check: `Some(shut down)`, or `None` when the cloud says the instance is not
    /// found. V1 `NotImplemented` is "not shut down".
    async fn shutdown(&self, node: &Node) -> Result<Option<bool>, CloudError> {
        let cloud = self.ctx.cloud.as_ref();
        let answer = if let Some(v2) = cloud.instances_v2() {
            self.ctx
                .cloud_limiter
                .call(CloudPriority::Status, v2.instance_shutdown(node))
                .await
        } else if let Some(instances) = cloud.instances() {
            let provider_id = match self.provider_id(node, CloudPriority::Status).await {
                Ok(id) => id,
                // Upstream: not found while looking up the provider ID → not shut down.
                Err(err) if err.is_instance_not_found() => return Ok(Some(false)),
                Err(err) => return Err(err),
            };
            let shutdown = instances.instance_shutdown_by_provider_id(&provider_id);
            match self
                .ctx
                .cloud_limiter
                .call(CloudPriority::Status, shutdown)
                .await
            {
                Err(err) if err.is_not_implemented() => Ok(false),
                other => other,
            }
        } else {
            return Ok(Some(false));
        };
        match answer {
            Ok(shut_down) => Ok(Some(shut_down)),
            Err(err) if err.is_instance_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }

    async fn provider_id(
        &self,
        node: &Node,
        priority: CloudPriority,
    ) -> Result<String, CloudError> {
        let provider_id = provider_id_of(node);
        if !provider_id.is_empty() {
            return Ok(provider_id.to_owned());
        }
        self.ctx
            .cloud_limiter
            .call(
                priority,
                instance_provider_id(self.ctx.cloud.as_ref(), node_name(node)),
            )
            .await
    }
}

/// The Node's Ready condition status; `Unknown` when it has none.
fn ready_status(node: &Node) -> &str {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or("Unknown", |c| c.status.as_str())
}

/// The taint of a non-graceful node shutdown (`v1.TaintNodeOutOfService`).
pub(crate) const TAINT_OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";

/// Adds or removes the shutdown taint (and with `out_of_service` the out-of-service
/// NoExecute taint, removed whenever `present` is false) with a merge patch of the whole
/// taint list, guarded by the Node's resourceVersion (a conflict is retried on the next
/// period).
async fn set_shutdown_taint(
    api: &Api<Node>,
    node: &Node,
    present: bool,
    out_of_service: bool,
) -> Result<(), kube::Error> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.retain(|t| !(t.key == TAINT_SHUTDOWN && t.effect == "NoSchedule"));
    if !present || out_of_service {
        taints.retain(|t| !(t.key == TAINT_OUT_OF_SERVICE && t.effect == "NoExecute"));
    }
    if present {
        taints.push(Taint {
            key: TAINT_SHUTDOWN.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Default::default()
        });
    }
    if present && out_of_service {
        taints.push(Taint {
            key: TAINT_OUT_OF_SERVICE.to_owned(),
            value: Some("nodeshutdown".to_owned()),
            effect: "NoExecute".to_owned(),
            time_added: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::now(),
            )),
        });
    }
    let mut patch = Node::default();
    patch.metadata.resource_version = node.metadata.resource_version.clone();
    patch.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        taints: Some(taints),
        ..Default::default()
    });
    api.patch(
        node_name(node),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    #[test]
    fn a_node_without_ready_condition_is_unknown() {
        let mut node = Node::default();
        assert_eq!(ready_status(&node), "Unknown");
        node.status = Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "False".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(ready_status(&node), "False");
    }
}
