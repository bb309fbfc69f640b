//! The cloud-node controller (upstream `controllers/node/node_controller.go`).
//!
//! It initializes Nodes that carry the [`TAINT_UNINITIALIZED`] taint from the cloud's instance
//! metadata (providerID, addresses, zone/region/instance-type labels, additional labels), then
//! removes the taint; it mirrors beta labels to GA labels on initialized Nodes without any cloud
//! call; and it refreshes the addresses of initialized Nodes every
//! [`CloudNodeConfig::node_status_update_frequency`].
//!
//! Beyond upstream: with [`CloudNodeConfig::batch`] (the default) every Node waiting at one
//! moment is looked up with one
//! [`InstancesV2::instance_metadata_batch`](cloud_provider::InstancesV2::instance_metadata_batch) call
//! (in chunks of 500 Nodes), so a provider that batches makes one cloud call per sync instead of one per
//! Node. A cloud answer that makes no sense (no providerID anywhere, an address that is not an
//! IP) keeps the taint, emits a `Warning` event and is retried with backoff.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ccm_workqueue::{Queue, QueueMetrics, RateLimiter};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::time::Instant;
use tracing::{Instrument, debug, info, info_span, warn};

use super::events::EventType;
use super::metrics::{QUEUE_NODES, seconds_since_creation};
use super::{CloudPriority, ControllerContext, NodeEvent};
use cloud_provider::helpers::node_address::node_addresses_from_node_ip;
use cloud_provider::helpers::parse_ip_sloppy;
use cloud_provider::well_known::{
    ANNOTATION_PROVIDED_NODE_IP, LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE,
    LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_STABLE, LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE,
    TAINT_UNINITIALIZED,
};
use cloud_provider::{CloudError, CloudProvider, InstanceMetadata, instance_provider_id};

/// The largest number of Nodes passed to one [`InstancesV2::instance_metadata_batch`] call.
///
/// [`InstancesV2::instance_metadata_batch`]: cloud_provider::InstancesV2::instance_metadata_batch
pub(crate) const BATCH_CHUNK: usize = 500;

/// The event source component of this controller.
pub(crate) const COMPONENT: &str = "cloud-node-controller";

const UPDATE_CONFLICT_STEPS: usize = 20;

/// Settings of the cloud-node controller.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CloudNodeConfig {
    /// How often the addresses of initialized Nodes are refreshed (`--node-status-update-frequency`,
    /// default 5 minutes).
    pub node_status_update_frequency: Duration,
    /// How many Node writes (and, without batching, cloud lookups) run at once
    /// (`--concurrent-node-syncs`, default 1). Must be greater than 0.
    pub concurrent_node_syncs: usize,
    /// Look up all waiting Nodes with one batched metadata call (default `true`, beyond
    /// upstream); `false` makes one call per Node, as upstream does.
    pub batch: bool,
    /// How many address refreshes run at once (`--concurrent-node-status-updates`; 0, the
    /// default, means `concurrent_node_syncs`, as upstream).
    pub concurrent_node_status_updates: usize,
}

impl Default for CloudNodeConfig {
    fn default() -> Self {
        CloudNodeConfig {
            node_status_update_frequency: Duration::from_secs(300),
            concurrent_node_syncs: 1,
            batch: true,
            concurrent_node_status_updates: 0,
        }
    }
}

impl CloudNodeConfig {
    /// Sets [`node_status_update_frequency`](Self::node_status_update_frequency).
    pub fn with_node_status_update_frequency(mut self, frequency: Duration) -> Self {
        self.node_status_update_frequency = frequency;
        self
    }

    /// Sets [`concurrent_node_syncs`](Self::concurrent_node_syncs).
    pub fn with_concurrent_node_syncs(mut self, syncs: usize) -> Self {
        self.concurrent_node_syncs = syncs;
        self
    }

    /// Sets [`concurrent_node_status_updates`](Self::concurrent_node_status_updates).
    pub fn with_concurrent_node_status_updates(mut self, workers: usize) -> Self {
        self.concurrent_node_status_updates = workers;
        self
    }

    fn status_update_workers(&self) -> usize {
        match self.concurrent_node_status_updates {
            0 => self.concurrent_node_syncs.max(1),
            n => n,
        }
    }

    /// Sets [`batch`](Self::batch).
    pub fn with_batch(mut self, batch: bool) -> Self {
        self.batch = batch;
        self
    }
}

/// Why a node controller could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CloudNodeConfigError {
    /// `concurrent_node_syncs` was 0.
    #[error("concurrent-node-syncs must be greater than 0")]
    ZeroConcurrentNodeSyncs,
    /// A period was zero.
    #[error("{0} must be greater than 0")]
    ZeroPeriod(&'static str),
}

/// Why one Node could not be synced. Kept on the key until its retry.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum SyncError {
    /// The cloud call failed.
    #[error("cloud: {0}")]
    Cloud(#[from] CloudError),
    /// The cloud's answer makes no sense for this Node.
    #[error("{0}")]
    BadCloudAnswer(String),
    /// The API server call failed.
    #[error("api: {0}")]
    Api(#[from] kube::Error),
}

/// The cloud-node controller. Build it with [`new`](Self::new), then [`run`](Self::run) it.
pub struct CloudNodeController {
    ctx: ControllerContext,
    config: CloudNodeConfig,
}

impl std::fmt::Debug for CloudNodeController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudNodeController")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Whether the provider has what the node controllers need.
pub(crate) fn supports_instances(cloud: &dyn CloudProvider) -> bool {
    cloud.instances_v2().is_some() || cloud.instances().is_some()
}

impl CloudNodeController {
    /// A controller, or `Ok(None)` when the provider supports neither `InstancesV2` nor
    /// `Instances` (the controller is skipped, as upstream). Errors when
    /// `concurrent_node_syncs` is 0 or the refresh period is zero.
    pub fn new(
        ctx: ControllerContext,
        config: CloudNodeConfig,
    ) -> Result<Option<Self>, CloudNodeConfigError> {
        if config.concurrent_node_syncs == 0 {
            return Err(CloudNodeConfigError::ZeroConcurrentNodeSyncs);
        }
        if config.node_status_update_frequency.is_zero() {
            return Err(CloudNodeConfigError::ZeroPeriod(
                "node-status-update-frequency",
            ));
        }
        if !supports_instances(ctx.cloud.as_ref()) {
            warn!(
                "cloud provider supports neither InstancesV2 nor Instances: cloud-node controller skipped"
            );
            return Ok(None);
        }
        Ok(Some(CloudNodeController { ctx, config }))
    }

    /// Runs until the context's shutdown token is cancelled.
    pub async fn run(self) {
        // The shared Node cache's events (one watch for every controller, polled by its own
        // task, so a batch holds every Node that arrived while the previous sync ran).
        let mut intake = self.ctx.nodes.subscribe();
        let shutdown = self.ctx.shutdown.clone();
        let initialize = async {
            let mut queue = node_queue(self.ctx.metrics.queue(QUEUE_NODES));
            let mut ready = false;
            loop {
                tokio::select! {
                    event = intake.recv() => match event {
                        Some(event) => take(event, &mut queue, &mut ready),
                        None => break,
                    },
                    _ = ccm_workqueue::sleep_until(queue.next_deadline()) => {}
                }
                if !ready {
                    continue;
                }
                // Take whatever else the watch has delivered, so one sync sees every Node
                // waiting at this moment.
                while let Ok(more) = intake.try_recv() {
                    take(more, &mut queue, &mut ready);
                }
                let due = queue.drain();
                if due.is_empty() {
                    continue;
                }
                // The watch's events are read while the sync runs and queued as names: a
                // Node that changes meanwhile is dirty and synced again once this sync is
                // done (client-go's processing set). Left in the channel, each event held
                // two versions of its Node, and a sync of 500 Nodes under load let tens of
                // thousands pile up (50 MB at 10,000 Nodes).
                let outcomes = {
                    let sync = self.sync_nodes(&due);
                    tokio::pin!(sync);
                    loop {
                        tokio::select! {
                            outcomes = &mut sync => break outcomes,
                            Some(event) = intake.recv() => take(event, &mut queue, &mut ready),
                        }
                    }
                };
                // Forget the failures only on success, so repeated failures back off
                // exponentially as a rate-limited workqueue does.
                for (name, outcome) in outcomes {
                    match outcome {
                        Outcome::Synced => queue.forget(&name),
                        Outcome::Retry {
                            at_least,
                            throttled,
                        } => retry(&mut queue, name, at_least, throttled),
                    }
                }
                for name in &due {
                    queue.done(name);
                }
            }
        };
        // The address refresh runs beside initialization, never in its way (upstream's
        // separate `--concurrent-node-status-updates` workers).
        let refresh = async {
            let period = self.config.node_status_update_frequency;
            let mut refresh = tokio::time::interval_at(Instant::now() + period, period);
            refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                refresh.tick().await;
                if self.ctx.nodes.is_synced() {
                    self.update_node_status().await;
                }
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = initialize => {}
            _ = refresh => {}
        }
    }

    /// Syncs the Nodes called `names`: initializes the tainted ones (one batched metadata
    /// lookup) and mirrors the labels of the others. The outcome of each.
    async fn sync_nodes(&self, names: &[String]) -> Vec<(String, Outcome)> {
        let mut outcomes = Vec::with_capacity(names.len());
        let mut waiting = Vec::new();
        for name in names {
            let Some(node) = self.ctx.nodes.get(name) else {
                outcomes.push((name.clone(), Outcome::Synced));
                continue;
            };
            // Another ccm's Node (several ccms in one cluster): neither initialized nor
            // relabelled here.
            if !self.ctx.owns(COMPONENT, &node) {
                outcomes.push((name.clone(), Outcome::Synced));
                continue;
            }
            if has_taint(&node, TAINT_UNINITIALIZED) {
                waiting.push(node);
            } else {
                match self.reconcile_node_labels(&node).await {
                    Ok(()) => outcomes.push((name.clone(), Outcome::Synced)),
                    Err(err) => {
                        warn!(node = %name, error = %err, "failed to mirror node labels");
                        outcomes.push((
                            name.clone(),
                            Outcome::Retry {
                                at_least: None,
                                throttled: false,
                            },
                        ));
                    }
                }
            }
        }
        if waiting.is_empty() {
            return outcomes;
        }
        debug!(waiting = waiting.len(), "initializing waiting nodes");
        let metas = {
            let nodes: Vec<&Node> = waiting.iter().map(|n| n.as_ref()).collect();
            self.instance_metadata(&nodes, CloudPriority::NodeLifecycle)
                .await
        };
        // The batch keeps the names, not the Nodes: each sync reads its Node from the cache
        // when its turn comes. Holding the listed versions while their initializations make
        // new ones kept two versions of every Node alive until the batch ended (24 MB of peak
        // RSS at 10,000 Nodes), and each PUT was made from a version older than the cache's
        // (about 700 of 10,000 met a conflict and were retried).
        let names: Vec<String> = waiting.iter().map(|n| node_name(n).to_owned()).collect();
        drop(waiting);
        // At most `concurrent_node_syncs` syncs exist at once: each is built when a slot
        // frees, so a batch of 10,000 Nodes is never 10,000 futures (each holds a whole
        // request's state) in memory.
        let mut pending = names.into_iter().zip(metas);
        let mut in_flight = futures::stream::FuturesUnordered::new();
        let mut results = Vec::new();
        loop {
            while in_flight.len() < self.config.concurrent_node_syncs
                && let Some((name, meta)) = pending.next()
            {
                in_flight.push(self.sync_one(name, meta));
            }
            match in_flight.next().await {
                Some(result) => results.push(result),
                None => break,
            }
        }
        for (name, result) in results {
            match result {
                Ok(()) => outcomes.push((name, Outcome::Synced)),
                Err(err) => {
                    warn!(node = %name, error = %err, "failed to initialize node");
                    if let Some(node) = self.ctx.nodes.get(&name) {
                        self.ctx
                            .events
                            .record(
                                COMPONENT,
                                &*node,
                                EventType::Warning,
                                "FailedToInitializeNode",
                                &format!("failed to initialize node {name}: {err}"),
                            )
                            .await;
                    }
                    let (at_least, throttled) = match &err {
                        SyncError::Cloud(err) => (err.retry_after_delay(), err.is_throttled()),
                        _ => (None, false),
                    };
                    outcomes.push((
                        name,
                        Outcome::Retry {
                            at_least,
                            throttled,
                        },
                    ));
                }
            }
        }
        outcomes
    }

    /// Initializes one waiting Node from its metadata lookup; the Node's name and the outcome.
    ///
    /// The Node is read from the cache now, as upstream's `initializeNode` reads its lister: a
    /// Node deleted or initialized since the lookup began needs nothing more.
    async fn sync_one(
        &self,
        name: String,
        meta: Result<Option<InstanceMetadata>, SyncError>,
    ) -> (String, Result<(), SyncError>) {
        let span = info_span!("sync_node", node = %name);
        let result = async {
            let Some(node) = self
                .ctx
                .nodes
                .get(&name)
                .filter(|node| has_taint(node, TAINT_UNINITIALIZED))
            else {
                return Ok(());
            };
            match meta {
                Ok(Some(meta)) => self.initialize_node(&node, meta).await,
                Ok(None) => {
                    info!("skip sync node: the cloud has no metadata for it yet");
                    Ok(())
                }
                Err(err) => Err(err),
            }
        }
        .instrument(span)
        .await;
        (name, result)
    }

    /// The metadata of each Node, in order: batched or one call per Node (V2), or the legacy
    /// `Instances` and `Zones` calls.
    async fn instance_metadata(
        &self,
        nodes: &[&Node],
        priority: CloudPriority,
    ) -> Vec<Result<Option<InstanceMetadata>, SyncError>> {
        let cloud = self.ctx.cloud.as_ref();
        let results: Vec<Result<Option<InstanceMetadata>, SyncError>> = if let Some(v2) =
            cloud.instances_v2()
        {
            if self.config.batch {
                let mut out = Vec::with_capacity(nodes.len());
                for chunk in nodes.chunks(BATCH_CHUNK) {
                    self.ctx.cloud_limiter.acquire_at(priority).await;
                    let answers = v2.instance_metadata_batch(chunk).await;
                    for err in answers.iter().filter_map(|a| a.as_ref().err()) {
                        self.ctx.cloud_limiter.observe(priority, err);
                    }
                    if answers.len() != chunk.len() {
                        let msg = format!(
                            "the cloud answered {} results for {} nodes",
                            answers.len(),
                            chunk.len()
                        );
                        out.extend(
                            chunk
                                .iter()
                                .map(|_| Err(SyncError::BadCloudAnswer(msg.clone()))),
                        );
                    } else {
                        out.extend(answers.into_iter().map(|a| a.map_err(SyncError::from)));
                    }
                }
                out
            } else {
                let mut lookups = Vec::with_capacity(nodes.len());
                for node in nodes.iter().copied() {
                    lookups.push(async move {
                        self.ctx
                            .cloud_limiter
                            .call(priority, v2.instance_metadata(node))
                            .await
                            .map_err(SyncError::from)
                    });
                }
                futures::stream::iter(lookups)
                    .buffered(self.config.concurrent_node_syncs)
                    .collect()
                    .await
            }
        } else {
            let mut lookups = Vec::with_capacity(nodes.len());
            for node in nodes.iter().copied() {
                lookups
                    .push(async move { self.instance_metadata_v1(node, priority).await.map(Some) });
            }
            futures::stream::iter(lookups)
                .buffered(self.config.concurrent_node_syncs)
                .collect()
                .await
        };
        // Check what the cloud said against the Node, as upstream's providerID rule does.
        nodes
            .iter()
            .zip(results)
            .map(|(node, result)| match result {
                Ok(Some(mut meta)) => {
                    if meta.provider_id.is_empty() {
                        meta.provider_id = provider_id_of(node).to_owned();
                    }
                    if meta.provider_id.is_empty() && cloud.instances_v2().is_some() {
                        return Err(SyncError::BadCloudAnswer(format!(
                            "cloud provider does not set node provider ID for node {}",
                            node_name(node)
                        )));
                    }
                    validate_addresses(&meta.node_addresses)?;
                    Ok(Some(meta))
                }
                other => other,
            })
            .collect()
    }

    /// Upstream's `Instances` path: providerID, addresses, instance type and (with `Zones`) the
    /// zone, each by provider ID with the by-name fallback.
    async fn instance_metadata_v1(
        &self,
        node: &Node,
        priority: CloudPriority,
    ) -> Result<InstanceMetadata, SyncError> {
        let cloud = self.ctx.cloud.as_ref();
        let instances = cloud
            .instances()
            .ok_or_else(|| SyncError::BadCloudAnswer("cloud provider has no Instances".into()))?;
        let name = node_name(node);
        let mut provider_id = provider_id_of(node).to_owned();
        if provider_id.is_empty() {
            match self
                .ctx
                .cloud_limiter
                .call(priority, instance_provider_id(cloud, name))
                .await
            {
                Ok(id) => provider_id = id,
                Err(err) if err.is_not_implemented() => {
                    warn!(node = %name, "the cloud does not implement instance IDs: continuing by node name");
                }
                Err(err) => return Err(err.into()),
            }
        }
        let mut meta = InstanceMetadata::new(provider_id.clone());
        let by_id = if provider_id.is_empty() {
            None
        } else {
            self.ctx
                .cloud_limiter
                .call(
                    priority,
                    instances.node_addresses_by_provider_id(&provider_id),
                )
                .await
                .ok()
        };
        meta.node_addresses = match by_id {
            Some(addresses) => addresses,
            None => {
                self.ctx
                    .cloud_limiter
                    .call(priority, instances.node_addresses(name))
                    .await?
            }
        };
        let by_id = if provider_id.is_empty() {
            None
        } else {
            self.ctx
                .cloud_limiter
                .call(
                    priority,
                    instances.instance_type_by_provider_id(&provider_id),
                )
                .await
                .ok()
        };
        meta.instance_type = match by_id {
            Some(t) => t,
            None => {
                self.ctx
                    .cloud_limiter
                    .call(priority, instances.instance_type(name))
                    .await?
            }
        };
        if let Some(zones) = cloud.zones() {
            let by_id = if provider_id.is_empty() {
                None
            } else {
                self.ctx
                    .cloud_limiter
                    .call(priority, zones.get_zone_by_provider_id(&provider_id))
                    .await
                    .ok()
            };
            let zone = match by_id {
                Some(zone) => zone,
                None => {
                    self.ctx
                        .cloud_limiter
                        .call(priority, zones.get_zone_by_node_name(name))
                        .await?
                }
            };
            meta.zone = zone.failure_domain;
            meta.region = zone.region;
        }
        Ok(meta)
    }

    /// Applies the metadata to a tainted Node with a PUT (retried on conflict), then patches
    /// its addresses and emits `Normal Synced` (written in the background).
    async fn initialize_node(&self, node: &Node, meta: InstanceMetadata) -> Result<(), SyncError> {
        let name = node_name(node).to_owned();
        // Validate the provided node IP before any write: the taint stays on failure.
        let addresses = desired_addresses(node, &meta.node_addresses)?;
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let mut current = node.clone();
        let mut attempt = 0;
        let updated = loop {
            let mut desired = current.clone();
            apply_metadata(&mut desired, &meta);
            if desired == current {
                break current;
            }
            match api.replace(&name, &PostParams::default(), &desired).await {
                Ok(updated) => {
                    self.ctx
                        .metrics
                        .node
                        .taint_removal_delay
                        .observe(seconds_since_creation(&updated));
                    break updated;
                }
                Err(kube::Error::Api(status))
                    if status.code == 409 && attempt + 1 < UPDATE_CONFLICT_STEPS =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    current = api.get(&name).await?;
                    if !has_taint(&current, TAINT_UNINITIALIZED) {
                        return Ok(());
                    }
                }
                Err(err) => return Err(err.into()),
            }
        };
        if let Some(addresses) = addresses
            && !has_taint(&updated, TAINT_UNINITIALIZED)
        {
            patch_addresses(&api, &updated, addresses).await?;
        }
        info!("successfully initialized node");
        // In the background, as client-go's recorder: the next Node's writes do not wait
        // for this Event.
        self.ctx.events.record_in_background(
            COMPONENT,
            &updated,
            EventType::Normal,
            "Synced",
            "Node synced successfully".to_owned(),
        );
        self.ctx
            .metrics
            .node
            .initial_sync_delay
            .observe(seconds_since_creation(&updated));
        Ok(())
    }

    /// Upstream's `reconcileNodeLabels`: the beta labels are the source of truth for the GA ones.
    async fn reconcile_node_labels(&self, node: &Node) -> Result<(), kube::Error> {
        let missing = mirrored_labels(node);
        if missing.is_empty() {
            return Ok(());
        }
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let mut patch = Node::default();
        patch.metadata.labels = Some(missing);
        api.patch(
            node_name(node),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }

    /// Upstream's `UpdateNodeStatus`: refreshes the addresses of every initialized Node.
    async fn update_node_status(&self) {
        let nodes: Vec<_> = self
            .ctx
            .nodes
            .list()
            .into_iter()
            .filter(|n| !has_taint(n, TAINT_UNINITIALIZED) && self.ctx.owns(COMPONENT, n))
            .collect();
        if nodes.is_empty() {
            return;
        }
        let refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        let metas = if self.ctx.cloud.instances_v2().is_some() {
            self.instance_metadata(&refs, CloudPriority::Status).await
        } else {
            let mut lookups = Vec::with_capacity(refs.len());
            for node in refs.iter().copied() {
                lookups.push(self.node_addresses_v1(node));
            }
            futures::stream::iter(lookups)
                .buffered(self.config.status_update_workers())
                .collect()
                .await
        };
        let api = &Api::<Node>::all(self.ctx.client.clone());
        let mut patches = Vec::with_capacity(refs.len());
        for (node, meta) in refs.into_iter().zip(metas) {
            let name = node_name(node);
            let meta = match meta {
                Ok(Some(meta)) => meta,
                Ok(None) => continue,
                Err(err) => {
                    warn!(node = %name, error = %err, "failed to refresh node addresses");
                    continue;
                }
            };
            match desired_addresses(node, &meta.node_addresses) {
                Ok(Some(addresses)) => patches.push(async move {
                    if let Err(err) = patch_addresses(api, node, addresses).await {
                        warn!(node = %name, error = %err, "failed to patch node addresses");
                    }
                }),
                Ok(None) => {}
                Err(err) => warn!(node = %name, error = %err, "skipping address update"),
            }
        }
        futures::stream::iter(patches)
            .for_each_concurrent(self.config.status_update_workers(), |patch| patch)
            .await;
    }

    async fn node_addresses_v1(&self, node: &Node) -> Result<Option<InstanceMetadata>, SyncError> {
        let Some(instances) = self.ctx.cloud.instances() else {
            return Ok(None);
        };
        let provider_id = provider_id_of(node);
        if !provider_id.is_empty() {
            let by_id = instances.node_addresses_by_provider_id(provider_id);
            if let Ok(addresses) = self
                .ctx
                .cloud_limiter
                .call(CloudPriority::Status, by_id)
                .await
            {
                return Ok(Some(
                    InstanceMetadata::new(provider_id).with_addresses(addresses),
                ));
            }
        }
        let addresses = self
            .ctx
            .cloud_limiter
            .call(
                CloudPriority::Status,
                instances.node_addresses(node_name(node)),
            )
            .await?;
        validate_addresses(&addresses)?;
        Ok(Some(
            InstanceMetadata::new(provider_id).with_addresses(addresses),
        ))
    }
}

async fn patch_addresses(
    api: &Api<Node>,
    node: &Node,
    addresses: Vec<NodeAddress>,
) -> Result<(), kube::Error> {
    let current = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or(&[]);
    if !addresses_changed(current, &addresses) {
        return Ok(());
    }
    let patch = Node {
        status: Some(NodeStatus {
            addresses: Some(addresses),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.patch_status(
        node_name(node),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// The addresses the Node should have: the cloud's, plus the kubelet's Hostname if the cloud
/// has none, ordered by the provided-node-ip annotation. `None` when the cloud gave none.
fn desired_addresses(
    node: &Node,
    cloud: &[NodeAddress],
) -> Result<Option<Vec<NodeAddress>>, SyncError> {
    if cloud.is_empty() {
        return Ok(None);
    }
    let mut addresses = cloud.to_vec();
    if !addresses.iter().any(|a| a.type_ == "Hostname") {
        let kubelet = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or(&[]);
        addresses.extend(kubelet.iter().filter(|a| a.type_ == "Hostname").cloned());
    }
    if let Some(annotation) = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_PROVIDED_NODE_IP))
    {
        addresses = node_addresses_from_node_ip(annotation, &addresses).map_err(|err| {
            SyncError::BadCloudAnswer(format!(
                "failed to get node address from cloud provider that matches ip: {err}"
            ))
        })?;
    }
    Ok(Some(addresses))
}

/// Every InternalIP and ExternalIP must be an IP address.
fn validate_addresses(addresses: &[NodeAddress]) -> Result<(), SyncError> {
    for a in addresses {
        if (a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            && parse_ip_sloppy(&a.address).is_none()
        {
            return Err(SyncError::BadCloudAnswer(format!(
                "the cloud returned {} {:?}, which is not an IP address",
                a.type_, a.address
            )));
        }
    }
    Ok(())
}

/// Upstream's `nodeAddressesChangeDetected`: a different length, or a different type→address map.
pub(crate) fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if old.len() != new.len() {
        return true;
    }
    let map: HashMap<&str, &str> = old
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    new.iter()
        .any(|a| map.get(a.type_.as_str()) != Some(&a.address.as_str()))
}

/// The node-modifiers of upstream's `syncNode`, applied to a copy of the Node.
fn apply_metadata(node: &mut Node, meta: &InstanceMetadata) {
    let spec = node.spec.get_or_insert_with(Default::default);
    if spec.provider_id.as_deref().unwrap_or("").is_empty() && !meta.provider_id.is_empty() {
        spec.provider_id = Some(meta.provider_id.clone());
    }
    let labels = node.metadata.labels.get_or_insert_with(Default::default);
    let mut set = |keys: [&str; 2], value: &str| {
        if !value.is_empty() {
            for key in keys {
                labels.insert(key.to_owned(), value.to_owned());
            }
        }
    };
    set(
        [LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_STABLE],
        &meta.instance_type,
    );
    set(
        [LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_ZONE],
        &meta.zone,
    );
    set(
        [LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_TOPOLOGY_REGION],
        &meta.region,
    );
    for (key, value) in &meta.additional_labels {
        if is_kubernetes_label(key) {
            warn!(label = %key, "discarding an additional label under kubernetes.io or k8s.io");
            continue;
        }
        match labels.get(key) {
            Some(existing) if existing != value => {
                warn!(label = %key, "not overwriting an existing label with the cloud's value");
            }
            Some(_) => {}
            None => {
                labels.insert(key.clone(), value.clone());
            }
        }
    }
    if let Some(taints) = spec.taints.as_mut() {
        taints.retain(|t| t.key != TAINT_UNINITIALIZED);
    }
}

/// Upstream's regex `(^|\.)(kubernetes|k8s)\.io/`.
pub(crate) fn is_kubernetes_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")))
}

/// Queues a changed Node; `Synced` opens the gate (no sync before the first full list).
fn take(event: NodeEvent, queue: &mut Queue<String>, ready: &mut bool) {
    if let Some(name) = arrived_name(event, ready) {
        queue.add(name);
    }
}

/// The Node to look at for a watch event, if any; `Synced` sets `ready`.
fn arrived_name(event: NodeEvent, ready: &mut bool) -> Option<String> {
    match event {
        NodeEvent::Applied { new, .. } => new.metadata.name.clone(),
        NodeEvent::Deleted(_) => None,
        NodeEvent::Synced => {
            *ready = true;
            None
        }
    }
}

/// The GA labels that must be set to mirror their beta labels.
pub(crate) fn mirrored_labels(node: &Node) -> BTreeMap<String, String> {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    [
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_TOPOLOGY_ZONE),
        (LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_TOPOLOGY_REGION),
        (LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_STABLE),
    ]
    .into_iter()
    .filter_map(|(beta, ga)| {
        let value = labels.get(beta)?;
        (labels.get(ga) != Some(value)).then(|| (ga.to_owned(), value.clone()))
    })
    .collect()
}

pub(crate) fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

pub(crate) fn provider_id_of(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or("")
}

pub(crate) fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// The `Nodes` queue, as upstream's cloud-node controller makes it:
/// `DefaultTypedControllerRateLimiter` (5 ms to 1000 s per Node, 10 retries per second
/// overall).
fn node_queue(metrics: QueueMetrics) -> Queue<String> {
    Queue::new(RateLimiter::default_controller()).with_metrics(metrics)
}

/// What became of one Node's sync.
#[derive(Debug)]
enum Outcome {
    /// Done; its failures are forgotten.
    Synced,
    /// Failed: requeued after its backoff, and not before `at_least` (a cloud's
    /// `Retry-After`).
    Retry {
        at_least: Option<Duration>,
        /// The cloud refused the call over its quota: the Node did nothing wrong.
        throttled: bool,
    },
}

/// When a Node whose lookup the cloud throttled without a retry-after is tried again.
const THROTTLED_RETRY: Duration = Duration::from_secs(1);

/// Requeues a failed Node after its backoff, or after `at_least` when that is longer. A
/// throttled lookup (beyond upstream) is no failure of the Node: its backoff is not grown
/// and it comes back after the cloud's retry-after, with the others throttled alike, so they
/// are looked up again together in one batch instead of one by one as their backoffs expire.
fn retry(queue: &mut Queue<String>, name: String, at_least: Option<Duration>, throttled: bool) {
    if throttled {
        queue.forget(&name);
        queue.add_after(name, at_least.unwrap_or(THROTTLED_RETRY));
        return;
    }
    let backoff = queue.rate_limiter().when(&name);
    queue.add_after(name, at_least.map_or(backoff, |after| after.max(backoff)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_provider::node_address;

    #[test]
    fn kubernetes_labels_are_recognized() {
        assert!(is_kubernetes_label("kubernetes.io/foo"));
        assert!(is_kubernetes_label("node.kubernetes.io/foo"));
        assert!(is_kubernetes_label("x.k8s.io/foo"));
        assert!(!is_kubernetes_label("example.com/kubernetes.io"));
        assert!(!is_kubernetes_label("mykubernetes.io/foo"));
        assert!(!is_kubernetes_label("team"));
    }

    #[test]
    fn address_change_detection_ignores_order() {
        let a = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("Hostname", "h"),
        ];
        let b = vec![
            node_address("Hostname", "h"),
            node_address("InternalIP", "10.0.0.1"),
        ];
        assert!(!addresses_changed(&a, &b));
        assert!(addresses_changed(&a, &b[..1]));
        let c = vec![
            node_address("Hostname", "h"),
            node_address("InternalIP", "10.0.0.2"),
        ];
        assert!(addresses_changed(&a, &c));
    }

    #[test]
    fn beta_labels_are_mirrored_to_ga() {
        let mut node = Node::default();
        node.metadata.labels = Some(BTreeMap::from([
            (LABEL_FAILURE_DOMAIN_BETA_ZONE.to_owned(), "z1".to_owned()),
            (LABEL_TOPOLOGY_ZONE.to_owned(), "other".to_owned()),
            (LABEL_TOPOLOGY_REGION.to_owned(), "r".to_owned()),
        ]));
        let mirrored = mirrored_labels(&node);
        assert_eq!(mirrored.len(), 1);
        assert_eq!(mirrored[LABEL_TOPOLOGY_ZONE], "z1");
    }

    /// client-go's rate-limited workqueue: each failure doubles the key's delay until the
    /// key is forgotten after a success, which starts it again at the base delay (5 ms,
    /// upstream's `DefaultTypedControllerRateLimiter`); a cloud's `Retry-After` is a floor.
    #[tokio::test(start_paused = true)]
    async fn retries_back_off_exponentially_until_forgotten() {
        const BACKOFF_BASE: Duration = Duration::from_millis(5);
        let n = || "n".to_owned();
        let mut queue = node_queue(crate::controllers::ControllerMetrics::new().queue(QUEUE_NODES));
        let delay = |queue: &Queue<String>| queue.next_deadline().unwrap() - Instant::now();
        retry(&mut queue, n(), None, false);
        assert_eq!(delay(&queue), BACKOFF_BASE);
        tokio::time::advance(BACKOFF_BASE).await;
        assert_eq!(queue.drain(), [n()]);
        retry(&mut queue, n(), None, false);
        assert_eq!(delay(&queue), BACKOFF_BASE * 2);
        tokio::time::advance(BACKOFF_BASE * 2).await;
        assert!(queue.drain().is_empty(), "n is still processing");
        queue.done(&n());
        assert_eq!(queue.drain(), [n()], "queued again once done");
        retry(&mut queue, n(), None, false);
        assert_eq!(delay(&queue), BACKOFF_BASE * 4);
        assert_eq!(queue.num_requeues(&n()), 3);
        queue.forget(&n());
        queue.done(&n());
        tokio::time::advance(BACKOFF_BASE * 4).await;
        assert_eq!(queue.drain(), [n()]);
        queue.done(&n());
        retry(&mut queue, n(), None, false);
        assert_eq!(
            delay(&queue),
            BACKOFF_BASE,
            "forgotten: the base delay again"
        );
        tokio::time::advance(BACKOFF_BASE).await;
        assert_eq!(queue.drain(), [n()]);
        queue.done(&n());
        retry(&mut queue, n(), Some(Duration::from_secs(2)), false);
        assert_eq!(
            delay(&queue),
            Duration::from_secs(2),
            "Retry-After is a floor"
        );
    }

    /// Beyond upstream: a lookup the cloud throttled is no failure of the Node. Its backoff
    /// does not grow (nor count as a requeue) and it comes back after the cloud's retry-after
    /// (1 s without one), so every Node throttled together is looked up together again.
    #[tokio::test(start_paused = true)]
    async fn a_throttled_lookup_retries_after_the_cloud_asks_without_growing_the_backoff() {
        let n = || "n".to_owned();
        let mut queue = node_queue(crate::controllers::ControllerMetrics::new().queue(QUEUE_NODES));
        let delay = |queue: &Queue<String>| queue.next_deadline().unwrap() - Instant::now();
        for _ in 0..5 {
            retry(&mut queue, n(), Some(Duration::from_millis(300)), true);
            assert_eq!(delay(&queue), Duration::from_millis(300));
            tokio::time::advance(Duration::from_millis(300)).await;
            assert_eq!(queue.drain(), [n()]);
            queue.done(&n());
        }
        assert_eq!(queue.num_requeues(&n()), 0, "throttling is no failure");
        retry(&mut queue, n(), None, true);
        assert_eq!(delay(&queue), THROTTLED_RETRY);
    }

    #[test]
    fn invalid_ip_addresses_are_rejected() {
        assert!(validate_addresses(&[node_address("InternalIP", "not-an-ip")]).is_err());
        assert!(validate_addresses(&[node_address("Hostname", "not-an-ip")]).is_ok());
    }
}
