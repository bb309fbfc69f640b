//! Beyond upstream: cloud maintenance on the Node (the shape KEP-5683 proposes). Planned
//! maintenance, reboots, retirements and spot interruptions otherwise reach Kubernetes only as
//! a sudden NotReady Node.
//!
//! Every period the cloud-node-lifecycle controller asks the provider for the scheduled events
//! of this cluster's instances ([`InstancesV2::scheduled_events`], one call) and sets, on each
//! Node whose instance has one, the [`CONDITION_MAINTENANCE_PLANNED`] condition (`True`, the
//! event's kind as reason, its time window and description as message), and optionally the
//! [`TAINT_MAINTENANCE_PLANNED`] `PreferNoSchedule` taint. When the event passes (the cloud
//! no longer reports it, or its end is past) the condition turns `False` and the taint goes.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use cloud_provider::well_known::{CONDITION_MAINTENANCE_PLANNED, TAINT_MAINTENANCE_PLANNED};
use cloud_provider::{InstancesV2, ScheduledEvent};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use tracing::warn;

use super::cloud_node_lifecycle::COMPONENT;
use super::node::{has_taint, node_name, provider_id_of};
use super::{CloudPriority, ControllerContext};

/// How scheduled cloud events are put on Nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MaintenanceConfig {
    /// How often to ask the cloud (`--node-maintenance-period`).
    pub period: Duration,
    /// Whether to add the `PreferNoSchedule` taint too (`--node-maintenance-taint`).
    pub taint: bool,
}

impl MaintenanceConfig {
    /// Ask every `period`; with `taint`, taint the Nodes too.
    pub fn new(period: Duration, taint: bool) -> Self {
        MaintenanceConfig { period, taint }
    }
}

fn rfc3339(time: SystemTime) -> String {
    Timestamp::try_from(time).map_or_else(|_| "?".to_owned(), |t| t.to_string())
}

/// The message of the condition for `event`.
fn message_of(event: &ScheduledEvent) -> String {
    let mut message = format!(
        "{} scheduled from {}",
        event.kind.as_str(),
        rfc3339(event.not_before)
    );
    if let Some(until) = event.not_after {
        message.push_str(&format!(" until {}", rfc3339(until)));
    }
    if !event.description.is_empty() {
        message.push_str(": ");
        message.push_str(&event.description);
    }
    message
}

/// The Node's `MaintenancePlanned` condition: `(status, reason, message)`.
fn current(node: &Node) -> Option<(&str, &str, &str)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_MAINTENANCE_PLANNED)
        .map(|c| {
            (
                c.status.as_str(),
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default(),
            )
        })
}

/// One pass: asks the cloud once and brings every Node's condition (and taint) in line.
/// Returns `false` when the provider cannot report events.
pub(crate) async fn pass(
    ctx: &ControllerContext,
    cloud: &dyn InstancesV2,
    config: &MaintenanceConfig,
) -> bool {
    let events = match ctx
        .cloud_limiter
        .call(CloudPriority::Status, cloud.scheduled_events())
        .await
    {
        Ok(events) => events,
        Err(err) if err.is_not_implemented() => return false,
        Err(err) => {
            warn!(%err, "could not list the cloud's scheduled events");
            return true;
        }
    };
    let now = SystemTime::now();
    // The earliest event still ahead or under way, per instance.
    let mut planned: HashMap<&str, &ScheduledEvent> = HashMap::new();
    for event in events
        .iter()
        .filter(|e| e.not_after.is_none_or(|end| end > now))
    {
        planned
            .entry(event.provider_id.as_str())
            .and_modify(|e| {
                if event.not_before < e.not_before {
                    *e = event;
                }
            })
            .or_insert(event);
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let owned = ctx
        .nodes
        .list()
        .into_iter()
        .filter(|n| ctx.owns(COMPONENT, n));
    for node in owned {
        let event = planned.get(provider_id_of(&node)).copied();
        let name = node_name(&node);
        let (status, reason, message) = match event {
            Some(event) => ("True", event.kind.as_str().to_owned(), message_of(event)),
            None => (
                "False",
                "NoMaintenancePlanned".to_owned(),
                "The cloud reports no scheduled event for the instance".to_owned(),
            ),
        };
        match current(&node) {
            // Never marked and nothing planned: leave the Node alone.
            None if event.is_none() => {}
            Some((s, r, m)) if s == status && r == reason && m == message => {}
            _ => {
                let now = Time(Timestamp::now());
                let patch = serde_json::json!({
                    "status": { "conditions": [{
                        "type": CONDITION_MAINTENANCE_PLANNED,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                        "lastHeartbeatTime": now,
                    }]}
                });
                if let Err(err) = api
                    .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                {
                    warn!(node = %name, %err, "could not set the MaintenancePlanned condition");
                }
            }
        }
        let want_taint = config.taint && event.is_some();
        if want_taint != has_taint(&node, TAINT_MAINTENANCE_PLANNED)
            && let Err(err) = set_taint(&api, &node, want_taint).await
        {
            warn!(node = %name, %err, "could not update the maintenance taint");
        }
    }
    true
}

/// Adds or removes the `PreferNoSchedule` maintenance taint, guarded by the Node's
/// resourceVersion (a conflict is retried on the next pass).
async fn set_taint(api: &Api<Node>, node: &Node, add: bool) -> Result<(), kube::Error> {
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key != TAINT_MAINTENANCE_PLANNED)
        .collect();
    if add {
        taints.push(Taint {
            key: TAINT_MAINTENANCE_PLANNED.to_owned(),
            effect: "PreferNoSchedule".to_owned(),
            time_added: Some(Time(Timestamp::now())),
            value: None,
        });
    }
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": node.metadata.resource_version },
        "spec": { "taints": taints },
    });
    api.patch(
        node_name(node),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Passes every `config.period` until the provider says it cannot report events.
pub(crate) async fn run(ctx: &ControllerContext, config: MaintenanceConfig) {
    let Some(cloud) = ctx.cloud.instances_v2() else {
        return std::future::pending().await;
    };
    ctx.nodes.wait_synced().await;
    let mut tick = tokio::time::interval(config.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !pass(ctx, cloud, &config).await {
            warn!(
                "the cloud provider does not report scheduled events; MaintenancePlanned is not set"
            );
            return std::future::pending().await;
        }
    }
}
