//! The route controller (upstream `node-route-controller`): one cloud route per Node pod CIDR.
//!
//! Every reconcile lists the cluster's routes and Nodes, then
//! - creates a route for each pod CIDR without one (`name_hint` = the Node's UID; a dual-stack
//!   Node gets two routes with the same hint);
//! - deletes routes inside the cluster CIDRs that are blackholes, or whose Node or CIDR is
//!   unknown; routes outside every cluster CIDR are never touched;
//! - recreates a route whose target addresses differ from the Node's when the provider sets
//!   [`Route::enable_node_addresses`] (deletes first, then creates);
//! - sets the Node's `NetworkUnavailable` condition (`RouteCreated` / `NoRouteCreated`).
//!
//! At most 200 create/delete calls are in flight. The
//! periodic mode reconciles every [`RouteConfig::reconcile_period`]; the watch-based mode
//! (beyond upstream's alpha) reconciles on Node add/delete/pod-CIDR/address changes, at most
//! once per period, and retries failed creates.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use ccm_workqueue::{RateLimiter, WorkQueue};
use futures::StreamExt;
use ipnet::IpNet;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::CloudPriority;
use super::events::EventType;
use super::metrics::{QUEUE_ROUTES, seconds_since_creation};
use super::{ControllerContext, NodeEvent, NodeEvents};
use cloud_provider::{CloudError, Route, Routes};

/// How many `NetworkUnavailable` condition patches one reconcile keeps in flight: at 10,000
/// Nodes all of them can change at once (the first pass after a restart, a cloud outage), and
/// upstream's goroutine per Node would put 10,000 requests on the connection together.
const CONDITION_PATCHES_IN_FLIGHT: usize = 64;

/// Upstream's cap on in-flight create/delete route calls.
pub(crate) const MAX_CONCURRENT_ROUTE_OPERATIONS: usize = 200;

/// The Node condition the controller writes.
pub(crate) const CONDITION_NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

const COMPONENT: &str = "route_controller";

/// The route controller's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RouteConfig {
    /// `--cluster-cidr`: one or two CIDRs, at most one per IP family.
    pub cluster_cidrs: Vec<IpNet>,
    /// `--route-reconciliation-period` (default 10 s). In watch mode, the minimum time
    /// between two reconciles.
    pub reconcile_period: Duration,
    /// Reconcile on Node changes instead of every period (beyond upstream).
    pub watch_based: bool,
}

impl RouteConfig {
    /// Periodic reconcile every 10 s of `cluster_cidrs`.
    pub fn new(cluster_cidrs: Vec<IpNet>) -> Self {
        RouteConfig {
            cluster_cidrs,
            reconcile_period: Duration::from_secs(10),
            watch_based: false,
        }
    }

    /// Sets the reconcile period.
    pub fn with_reconcile_period(mut self, period: Duration) -> Self {
        self.reconcile_period = period;
        self
    }

    /// Selects the watch-based mode.
    pub fn with_watch_based(mut self, watch_based: bool) -> Self {
        self.watch_based = watch_based;
        self
    }

    /// Checks the cluster CIDRs: not empty, at most two, at most one per family.
    pub fn validate(&self) -> Result<(), RouteConfigError> {
        match self.cluster_cidrs.as_slice() {
            [] => Err(RouteConfigError::NoClusterCidr),
            [_] => Ok(()),
            [a, b] => {
                if matches!(
                    (a, b),
                    (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
                ) {
                    Err(RouteConfigError::NotDualStack)
                } else {
                    Ok(())
                }
            }
            more => Err(RouteConfigError::TooMany(more.len())),
        }
    }
}

/// An invalid [`RouteConfig`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteConfigError {
    /// No cluster CIDR.
    #[error("the route controller needs at least one cluster CIDR")]
    NoClusterCidr,
    /// Two CIDRs of the same family.
    #[error("two cluster CIDRs must be dual-stack (one IPv4, one IPv6)")]
    NotDualStack,
    /// More than two CIDRs.
    #[error("at most two cluster CIDRs are supported, got {0}")]
    TooMany(usize),
}

/// A reconcile that could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// `list_routes` failed.
    #[error("listing routes: {0}")]
    ListRoutes(#[source] CloudError),
    /// Listing Nodes failed.
    #[error("listing nodes: {0}")]
    ListNodes(#[source] kube::Error),
}

/// What one reconcile did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteSyncReport {
    /// Routes created.
    pub created: usize,
    /// Routes deleted.
    pub deleted: usize,
    /// Creates that failed.
    pub failed_creates: usize,
    /// Deletes that failed.
    pub failed_deletes: usize,
    /// Node conditions patched.
    pub conditions_patched: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Keep,
    Add,
    Update,
}

/// The route controller.
pub struct RouteController {
    ctx: ControllerContext,
    config: RouteConfig,
    ops: Arc<Semaphore>,
}

impl std::fmt::Debug for RouteController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteController")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RouteController {
    /// A route controller, or `Ok(None)` when the provider has no [`Routes`].
    pub fn new(
        ctx: ControllerContext,
        config: RouteConfig,
    ) -> Result<Option<Self>, RouteConfigError> {
        config.validate()?;
        if ctx.cloud.routes().is_none() {
            tracing::warn!(
                "the cloud provider does not support routes; route controller not started"
            );
            return Ok(None);
        }
        Ok(Some(RouteController {
            ctx,
            config,
            ops: Arc::new(Semaphore::new(MAX_CONCURRENT_ROUTE_OPERATIONS)),
        }))
    }

    fn routes(&self) -> &dyn Routes {
        self.ctx.cloud.routes().expect("checked in new")
    }

    /// Runs until the context's shutdown token is cancelled.
    pub async fn run(self) {
        let shutdown = self.ctx.shutdown.clone();
        if self.config.watch_based {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = self.run_watch_based() => {}
            }
        } else {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = self.run_periodic() => {}
            }
        }
    }

    async fn run_periodic(&self) {
        let mut tick = tokio::time::interval(self.config.reconcile_period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(err) = self.reconcile().await {
                tracing::warn!(%err, "route reconcile failed");
            }
        }
    }

    async fn run_watch_based(&self) {
        // Upstream's `Routes` queue, rate limited to one reconcile per period.
        let queue = routes_queue(self.ctx.metrics.queue(QUEUE_ROUTES));
        let watch = watch_nodes(self.ctx.nodes.subscribe(), &queue);
        let reconciles = async {
            let mut last: Option<tokio::time::Instant> = None;
            loop {
                queue.ready().await;
                if let Some(last) = last {
                    tokio::time::sleep_until(last + self.config.reconcile_period).await;
                }
                let Some(()) = queue.try_get() else {
                    continue;
                };
                last = Some(tokio::time::Instant::now());
                match self.reconcile().await {
                    Ok(report) if report.failed_creates > 0 || report.failed_deletes > 0 => {
                        queue.add_rate_limited(());
                    }
                    Ok(_) => queue.forget(&()),
                    Err(err) => {
                        tracing::warn!(%err, "route reconcile failed");
                        queue.add_rate_limited(());
                    }
                }
                queue.done(&());
            }
        };
        tokio::join!(watch, reconciles);
    }

    /// One full reconcile: list routes and Nodes, delete, create, write conditions.
    pub async fn reconcile(&self) -> Result<RouteSyncReport, RouteError> {
        // Upstream counts every reconcile, before it lists anything.
        self.ctx.metrics.route.route_sync.inc();
        let routes = self
            .ctx
            .cloud_limiter
            .call(
                CloudPriority::Route,
                self.routes().list_routes(&self.ctx.cluster_name),
            )
            .await
            .map_err(RouteError::ListRoutes)?;
        // The shared Node cache, never a LIST of every Node per reconcile.
        self.ctx.nodes.wait_synced().await;
        // Only this ccm's Nodes get routes (several ccms in one cluster): the route table
        // is its cloud's.
        let nodes: Vec<Arc<Node>> = self
            .ctx
            .nodes
            .list()
            .into_iter()
            .filter(|n| self.ctx.owns(COMPONENT, n))
            .collect();
        Ok(self.reconcile_with(nodes, routes).await)
    }

    /// Decides from one list of the Nodes, then lets the list go: the creates hold only the
    /// Nodes they make routes for, and each condition patch reads its Node from the cache when
    /// it is made. Holding the list through the patches, each of which makes a new version of
    /// its Node, kept two versions of every Node alive at the ccm's peak.
    async fn reconcile_with(&self, nodes: Vec<Arc<Node>>, routes: Vec<Route>) -> RouteSyncReport {
        let mut report = RouteSyncReport::default();
        let sequenced = routes.first().is_some_and(|r| r.enable_node_addresses);

        // Node name -> its routes (the entry exists for every Node with pod CIDRs too).
        let mut route_map: HashMap<&str, Vec<&Route>> = HashMap::new();
        for route in &routes {
            if !route.target_node.is_empty() {
                route_map
                    .entry(route.target_node.as_str())
                    .or_default()
                    .push(route);
            }
        }
        let mut actions: HashMap<(String, IpNet), Action> = HashMap::new();
        for node in &nodes {
            let name = node.name_any();
            let cidrs = pod_cidrs(node);
            if cidrs.is_empty() {
                continue;
            }
            let existing = route_map.get(name.as_str()).cloned().unwrap_or_default();
            let addresses = node_addresses(node);
            for cidr in cidrs {
                let action = match existing.iter().find(|r| r.destination_cidr == cidr) {
                    Some(r) if !r.enable_node_addresses => Action::Keep,
                    Some(r) if address_set(&r.target_node_addresses) == address_set(&addresses) => {
                        Action::Keep
                    }
                    Some(_) => Action::Update,
                    None => Action::Add,
                };
                actions.insert((name.clone(), cidr), action);
            }
        }

        // Deletes. Owned items: a stream over a closure taking references is not `Send` for
        // every lifetime.
        let to_delete: Vec<Route> = routes
            .iter()
            .filter(|r| self.is_responsible_for(&r.destination_cidr))
            .filter(|r| {
                r.blackhole
                    || !matches!(
                        actions.get(&(r.target_node.clone(), r.destination_cidr)),
                        Some(Action::Keep | Action::Add)
                    )
            })
            .cloned()
            .collect();
        // Streams of at most MAX_CONCURRENT_ROUTE_OPERATIONS futures each, not a future per
        // route built up front: 10,000 pending create futures held 32 MB while the cloud
        // worked through them 200 at a time.
        let deletes = futures::stream::iter(to_delete)
            .map(|route| async move { self.delete_route(&route).await })
            .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
            .collect::<Vec<bool>>();

        // Creates.
        let to_create: Vec<(Arc<Node>, IpNet)> = nodes
            .iter()
            .flat_map(|node| {
                pod_cidrs(node)
                    .into_iter()
                    .map(move |cidr| (node.clone(), cidr))
            })
            .filter(|(node, cidr)| {
                matches!(
                    actions.get(&(node.name_any(), *cidr)),
                    Some(Action::Add | Action::Update)
                )
            })
            .collect();
        // The Nodes whose NetworkUnavailable condition this reconcile writes.
        let conditioned: Vec<String> = nodes
            .iter()
            .filter_map(|node| {
                let name = node.name_any();
                (route_map.contains_key(name.as_str()) || !pod_cidrs(node).is_empty())
                    .then_some(name)
            })
            .collect();
        drop(nodes);
        let creates = futures::stream::iter(to_create)
            .map(|(node, cidr)| async move {
                (node.name_any(), cidr, self.create_route(&node, cidr).await)
            })
            .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
            .collect::<Vec<_>>();
        let (delete_results, create_results) = if sequenced {
            let d = deletes.await;
            (d, creates.await)
        } else {
            futures::join!(deletes, creates)
        };
        for ok in delete_results {
            if ok {
                report.deleted += 1;
            } else {
                report.failed_deletes += 1;
            }
        }
        for (name, cidr, ok) in create_results {
            if ok {
                report.created += 1;
                actions.insert((name, cidr), Action::Keep);
            } else {
                report.failed_creates += 1;
            }
        }

        // Conditions. The actions grouped by Node once: a scan of every action per Node is
        // quadratic, 200 million comparisons per reconcile at 10,000 Nodes.
        let mut by_node: HashMap<&str, Vec<Action>> = HashMap::new();
        for ((name, _), action) in &actions {
            by_node.entry(name.as_str()).or_default().push(*action);
        }
        // The decisions are collected first, owned (see the deletes); the futures are made as
        // the stream needs them.
        let patches: Vec<(String, bool)> = conditioned
            .into_iter()
            .map(|name| {
                let node_actions = by_node.get(name.as_str()).map_or(&[][..], Vec::as_slice);
                let unavailable =
                    node_actions.is_empty() || node_actions.iter().any(|a| *a != Action::Keep);
                (name, unavailable)
            })
            .collect();
        report.conditions_patched = futures::stream::iter(patches)
            .map(|(name, unavailable)| async move {
                // Deleted since the list: no condition to write.
                let Some(node) = self.ctx.nodes.get(&name) else {
                    return false;
                };
                self.update_network_condition(&node, unavailable).await
            })
            .buffer_unordered(CONDITION_PATCHES_IN_FLIGHT)
            .filter(|patched| std::future::ready(*patched))
            .count()
            .await;
        report
    }

    fn is_responsible_for(&self, cidr: &IpNet) -> bool {
        let (first, last) = (cidr.network(), cidr.broadcast());
        self.config
            .cluster_cidrs
            .iter()
            .any(|c| c.contains(&first) || c.contains(&last))
    }

    async fn delete_route(&self, route: &Route) -> bool {
        let span = tracing::info_span!("delete_route", node = %route.target_node, cidr = %route.destination_cidr);
        async {
            let _permit = self.ops.acquire().await.expect("never closed");
            let delete = self.routes().delete_route(&self.ctx.cluster_name, route);
            match self
                .ctx
                .cloud_limiter
                .call(CloudPriority::Route, delete)
                .await
            {
                Ok(()) => {
                    tracing::info!("deleted route");
                    true
                }
                Err(err) => {
                    tracing::warn!(%err, "could not delete route");
                    false
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn create_route(&self, node: &Node, cidr: IpNet) -> bool {
        let name = node.name_any();
        let hint = node.uid().unwrap_or_default();
        let span = tracing::info_span!("create_route", node = %name, cidr = %cidr);
        async {
            let mut route = Route::new(name.clone(), cidr);
            route.target_node_addresses = node_addresses(node);
            let started = tokio::time::Instant::now();
            let result = {
                let _permit = self.ops.acquire().await.expect("never closed");
                let create = self
                    .routes()
                    .create_route(&self.ctx.cluster_name, &hint, &route);
                self.ctx
                    .cloud_limiter
                    .call(CloudPriority::Route, create)
                    .await
            };
            match result {
                Ok(()) => {
                    tracing::info!("created route");
                    true
                }
                Err(err) => {
                    let message = format!(
                        "Could not create route {hint} {cidr} for node {name} after {:?}: {err}",
                        started.elapsed()
                    );
                    tracing::warn!("{message}");
                    self.ctx
                        .events
                        .record(
                            COMPONENT,
                            node,
                            EventType::Warning,
                            "FailedToCreateRoute",
                            &message,
                        )
                        .await;
                    false
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Writes `NetworkUnavailable` unless the status and reason already match; true if patched.
    async fn update_network_condition(&self, node: &Node, unavailable: bool) -> bool {
        let (status, reason, message) = if unavailable {
            (
                "True",
                "NoRouteCreated",
                "RouteController failed to create a route",
            )
        } else {
            ("False", "RouteCreated", "RouteController created a route")
        };
        let current = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == CONDITION_NETWORK_UNAVAILABLE));
        if current.is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason)) {
            return false;
        }
        let now = Time(Timestamp::now());
        let patch = serde_json::json!({
            "status": { "conditions": [{
                "type": CONDITION_NETWORK_UNAVAILABLE,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "lastHeartbeatTime": now,
            }]}
        });
        let name = node.name_any();
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                if !unavailable {
                    // The Node's routes are all in place: how long since it was created.
                    self.ctx
                        .metrics
                        .route
                        .node_routes_delay
                        .observe(seconds_since_creation(node));
                }
                true
            }
            Err(err) => {
                tracing::warn!(node = %name, %err, "could not update the NetworkUnavailable condition");
                false
            }
        }
    }
}

/// The Node's parsed pod CIDRs (`spec.podCIDRs`, else `spec.podCIDR`).
fn pod_cidrs(node: &Node) -> Vec<IpNet> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let raw: Vec<&String> = match spec.pod_cidrs.as_ref() {
        Some(list) if !list.is_empty() => list.iter().collect(),
        _ => spec.pod_cidr.iter().collect(),
    };
    raw.into_iter()
        .filter_map(|s| match s.parse::<IpNet>() {
            Ok(net) => Some(net),
            Err(err) => {
                tracing::warn!(node = %node.name_any(), cidr = %s, %err, "invalid pod CIDR");
                None
            }
        })
        .collect()
}

fn node_addresses(node: &Node) -> Vec<NodeAddress> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
}

fn address_set(addresses: &[NodeAddress]) -> BTreeSet<(&str, &str)> {
    addresses
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect()
}

/// Upstream's watch-mode trigger for a Node update: pod CIDRs or addresses changed, or a
/// resync (same resource version).
fn triggers(old: &Node, new: &Node) -> bool {
    pod_cidrs(old) != pod_cidrs(new)
        || node_addresses(old) != node_addresses(new)
        || old.metadata.resource_version == new.metadata.resource_version
}

/// The watch-based mode's `Routes` queue: every trigger asks for the same whole reconcile, so
/// its one key is `()` (triggers that arrive while it is queued coalesce, one that arrives
/// while it runs queues the next); retries back off as upstream's default controller rate
/// limiter says, and never come sooner than a period after the last reconcile.
fn routes_queue(metrics: ccm_workqueue::QueueMetrics) -> WorkQueue<()> {
    WorkQueue::new(RateLimiter::default_controller()).with_metrics(metrics)
}

/// Upstream's watch-mode triggers, from the shared Node cache: an added or deleted Node, a
/// pod-CIDR or address change, and the first complete list.
async fn watch_nodes(mut events: NodeEvents, queue: &WorkQueue<()>) {
    let mut listed = false;
    while let Some(event) = events.recv().await {
        let fire = match event {
            NodeEvent::Applied { old: None, .. } => listed,
            NodeEvent::Applied {
                old: Some(old),
                new,
            } => listed && triggers(&old, &new),
            NodeEvent::Deleted(_) => true,
            NodeEvent::Synced => !std::mem::replace(&mut listed, true),
        };
        if fire {
            queue.add(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    /// The `Routes` queue has one key: adds coalesce while it is queued, an add while the
    /// reconcile runs queues the next one, and a failed reconcile is retried after its backoff
    /// (client-go's dirty and processing sets, one key).
    #[tokio::test(start_paused = true)]
    async fn the_routes_queue_coalesces_adds_until_taken() {
        use crate::controllers::ControllerMetrics;
        let metrics = ControllerMetrics::new();
        let queue = routes_queue(metrics.queue(QUEUE_ROUTES));
        assert!(queue.try_get().is_none());
        queue.add(());
        queue.add(());
        assert_eq!(metrics.queue(QUEUE_ROUTES).depth(), 1);
        tokio::time::timeout(Duration::from_secs(1), queue.ready())
            .await
            .expect("queued");
        queue.try_get().expect("one reconcile queued");
        assert_eq!(metrics.queue(QUEUE_ROUTES).depth(), 0);
        assert!(queue.try_get().is_none(), "the two adds made one reconcile");
        queue.add(());
        queue.done(&());
        assert!(
            queue.try_get().is_some(),
            "an add while reconciling queues the next"
        );
        let retry = queue.add_rate_limited(());
        queue.done(&());
        assert!(queue.try_get().is_none(), "not before its backoff");
        tokio::time::sleep(retry).await;
        assert!(queue.try_get().is_some(), "retried after its backoff");
        queue.done(&());
        assert!(
            tokio::time::timeout(Duration::from_secs(1), queue.ready())
                .await
                .is_err(),
            "nothing queued"
        );
    }

    /// Upstream `k8s.io/cloud-provider/app/core.go` `startRouteController`: at least one cluster
    /// CIDR, at most two, and two only as a dual-stack pair.
    #[test]
    fn cluster_cidrs_must_be_one_or_a_dual_stack_pair() {
        assert_eq!(
            RouteConfig::new(vec![]).validate(),
            Err(RouteConfigError::NoClusterCidr)
        );
        assert_eq!(
            RouteConfig::new(vec![net("10.0.0.0/8"), net("192.168.0.0/16")]).validate(),
            Err(RouteConfigError::NotDualStack)
        );
        assert_eq!(
            RouteConfig::new(vec![net("10.0.0.0/8"), net("fd00::/48"), net("fd01::/48")])
                .validate(),
            Err(RouteConfigError::TooMany(3))
        );
        assert_eq!(
            RouteConfig::new(vec![net("10.0.0.0/8"), net("fd00::/48")]).validate(),
            Ok(())
        );
        assert_eq!(RouteConfig::new(vec![net("10.0.0.0/8")]).validate(), Ok(()));
    }

    /// In watch mode a Node update reconciles on a resync or when its pod CIDRs or
    /// addresses change, not on other updates.
    #[test]
    fn a_node_update_triggers_routes_only_on_resync_or_cidr_and_address_changes() {
        let mut node = Node::default();
        node.metadata.resource_version = Some("1".into());
        let old = node.clone();
        // Resync: same resource version.
        assert!(triggers(&old, &node));
        // Another update (labels, say): new version, same CIDRs and addresses.
        node.metadata.resource_version = Some("2".into());
        assert!(!triggers(&old, &node));
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidrs: Some(vec!["10.1.0.0/24".into()]),
            ..Default::default()
        });
        assert!(triggers(&old, &node));
    }
}
