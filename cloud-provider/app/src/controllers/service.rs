//! The service controller (upstream `service-lb-controller`): cloud load balancers for
//! `type: LoadBalancer` Services without a `loadBalancerClass`.
//!
//! Ensure: event `EnsuringLoadBalancer` → finalizer → `EnsureLoadBalancer` → event
//! `EnsuredLoadBalancer` → status patch if changed. Cleanup (type change, deletion): the load
//! balancer is deleted if it exists, the finalizer removed, the status cleared and
//! `DeletedLoadBalancer` recorded. `RetryAfter` errors requeue after exactly their delay;
//! others back off from 5 s to 300 s.
//!
//! Beyond upstream: the finalizer is never added to a Service that is being deleted (the
//! Service takes the cleanup path instead); a node change calls `UpdateLoadBalancer` only for
//! the Services whose eligible node set changed; an optional periodic drift re-ensure.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use ccm_workqueue::{RateLimiter, WorkQueue};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use parking_lot::Mutex;
use tracing::Instrument;

use super::CloudPriority;
use super::events::EventType;
use super::metrics::{QUEUE_NODE, QUEUE_SERVICE, seconds_since};
use super::orphaned_lb::{Collector, OrphanedLbConfig};
use super::{ControllerContext, NodeEvent};
use cloud_provider::helpers::service::{
    has_load_balancer_finalizer, load_balancer_status_equal, wants_load_balancer,
};
use cloud_provider::well_known::{
    FINALIZER_LOAD_BALANCER_CLEANUP, LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS,
    TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER,
};
use cloud_provider::{CloudError, LoadBalancer};

const COMPONENT: &str = "service-controller";
const BACKOFF_BASE: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The service controller's settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServiceConfig {
    /// `--concurrent-service-syncs` (default 1, must be > 0).
    pub concurrent_service_syncs: usize,
    /// `--concurrent-lb-host-updates`: `UpdateLoadBalancer` calls in flight during a node
    /// sync (beyond upstream); 0 (the default) means `concurrent_service_syncs`, as upstream's
    /// `nodeSyncLoop`, which updates with that many workers.
    pub concurrent_lb_host_updates: usize,
    /// The full node sync period (upstream's 100 s node resync).
    pub node_sync_period: Duration,
    /// Re-ensure every load balancer this often (beyond upstream; `None` = never).
    pub lb_drift_reensure_period: Option<Duration>,
    /// Collect leaked load balancers (beyond upstream; `None` = never).
    pub orphaned_lb_gc: Option<OrphanedLbConfig>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            concurrent_service_syncs: 1,
            concurrent_lb_host_updates: 0,
            node_sync_period: Duration::from_secs(100),
            lb_drift_reensure_period: None,
            orphaned_lb_gc: None,
        }
    }
}

impl ServiceConfig {
    /// Sets `concurrent_service_syncs`.
    pub fn with_concurrent_service_syncs(mut self, n: usize) -> Self {
        self.concurrent_service_syncs = n;
        self
    }

    /// Sets `concurrent_lb_host_updates` (0 = `concurrent_service_syncs`).
    pub fn with_concurrent_lb_host_updates(mut self, n: usize) -> Self {
        self.concurrent_lb_host_updates = n;
        self
    }

    /// The `UpdateLoadBalancer` calls a node sync keeps in flight.
    fn lb_host_updates(&self) -> usize {
        match self.concurrent_lb_host_updates {
            0 => self.concurrent_service_syncs,
            n => n,
        }
    }

    /// Sets how leaked load balancers are collected (`None` = never).
    pub fn with_orphaned_lb_gc(mut self, gc: Option<OrphanedLbConfig>) -> Self {
        self.orphaned_lb_gc = gc;
        self
    }

    /// Sets the drift re-ensure period.
    pub fn with_lb_drift_reensure_period(mut self, period: Option<Duration>) -> Self {
        self.lb_drift_reensure_period = period;
        self
    }
}

/// An invalid [`ServiceConfig`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServiceConfigError {
    /// `concurrent_service_syncs` is 0.
    #[error("concurrent-service-syncs must be greater than 0")]
    NoWorkers,
}

/// Why a Service sync failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ServiceSyncError {
    /// A cloud call failed.
    #[error("{0}")]
    Cloud(#[from] CloudError),
    /// An API call failed.
    #[error("{0}")]
    Api(#[from] kube::Error),
}

impl ServiceSyncError {
    /// The delay a `RetryAfter` error asks for.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            ServiceSyncError::Cloud(err) => err.retry_after_delay(),
            ServiceSyncError::Api(_) => None,
        }
    }
}

/// Whether the Node passes the exclusion-label predicate: no label, or a value that parses
/// (as Go's `strconv.ParseBool`) to false.
pub(crate) fn node_included(node: &Node) -> bool {
    match node
        .labels()
        .get(LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS)
    {
        None => true,
        Some(v) => matches!(v.as_str(), "0" | "f" | "F" | "false" | "FALSE" | "False"),
    }
}

/// Upstream's stable node-set predicates: not being deleted, included, and without the
/// cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint. Readiness is not checked.
pub(crate) fn node_eligible(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && node_included(node)
        && !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| {
                ts.iter()
                    .any(|t| t.key == TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER)
            })
}

/// Whether a Node update triggers a node sync: the exclusion predicate flipped or the
/// `providerID` changed.
pub(crate) fn should_sync_updated_node(old: &Node, new: &Node) -> bool {
    node_included(old) != node_included(new) || provider_id(old) != provider_id(new)
}

fn provider_id(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref())
}

/// The identity of a load balancer's hosts: a 128-bit digest of the eligible Nodes' names and
/// providerIDs (upstream compares the Node lists themselves). Each Service keeps this digest of
/// the set it was last given, 16 bytes instead of a copy of the set: 1,000 Services that saw
/// 10,000 joining Nodes at different moments held up to 1,000 different 10,000-entry sets.
type NodeSet = u128;

/// The [`NodeSet`] of `nodes`, which must be sorted by name.
fn node_set(nodes: &[Arc<Node>]) -> NodeSet {
    // Two independent 64-bit SipHash digests (different leading keys): a false "unchanged"
    // needs both to collide.
    let digest = |seed: u8| {
        let mut hasher = std::hash::DefaultHasher::new();
        seed.hash(&mut hasher);
        for node in nodes {
            node.metadata.name.hash(&mut hasher);
            provider_id(node).hash(&mut hasher);
        }
        hasher.finish()
    };
    (u128::from(digest(1)) << 64) | u128::from(digest(2))
}

/// Whether the Service has the finalizer and is being deleted or no longer a LoadBalancer.
pub(crate) fn needs_cleanup(service: &Service) -> bool {
    has_load_balancer_finalizer(service)
        && (service.metadata.deletion_timestamp.is_some()
            || service.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer"))
}

/// Upstream's `needsUpdate`: whether a Service update concerns its load balancer.
pub(crate) fn needs_update(old: &Service, new: &Service) -> bool {
    let (ow, nw) = (wants_load_balancer(old), wants_load_balancer(new));
    if !ow && !nw {
        return false;
    }
    if ow != nw {
        return true;
    }
    let default = Default::default();
    let os = old.spec.as_ref().unwrap_or(&default);
    let ns = new.spec.as_ref().unwrap_or(&default);
    let ports_equal = {
        let (a, b) = (
            os.ports.as_deref().unwrap_or_default(),
            ns.ports.as_deref().unwrap_or_default(),
        );
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                x.name == y.name
                    && x.protocol == y.protocol
                    && x.port == y.port
                    && x.node_port == y.node_port
                    && x.target_port == y.target_port
                    && x.app_protocol == y.app_protocol
            })
    };
    os.load_balancer_source_ranges != ns.load_balancer_source_ranges
        || !ports_equal
        || os.session_affinity != ns.session_affinity
        || os.session_affinity_config != ns.session_affinity_config
        || os.load_balancer_ip != ns.load_balancer_ip
        || os.external_ips.as_deref().unwrap_or_default()
            != ns.external_ips.as_deref().unwrap_or_default()
        || old.metadata.annotations != new.metadata.annotations
        || old.metadata.uid != new.metadata.uid
        || os.external_traffic_policy != ns.external_traffic_policy
        || os.health_check_node_port != ns.health_check_node_port
        || os.ip_families.as_ref().map_or(0, Vec::len)
            != ns.ip_families.as_ref().map_or(0, Vec::len)
}

fn key_of(service: &Service) -> String {
    format!(
        "{}/{}",
        service.namespace().unwrap_or_default(),
        service.name_any()
    )
}

/// Upstream's service-controller queues (`service` and `node`):
/// `NewTypedItemExponentialFailureRateLimiter(minRetryDelay, maxRetryDelay)`, 5 s to 300 s.
fn service_rate_limiter<K: std::hash::Hash + Eq + Clone>() -> RateLimiter<K> {
    RateLimiter::exponential(BACKOFF_BASE, BACKOFF_MAX)
}

#[derive(Default)]
struct State {
    /// Every Service as the watch last delivered it, by key: what a sync reads (upstream's
    /// service lister), so a sync costs no GET.
    watched: HashMap<String, Service>,
    /// Last synced Service per key (for deletions without a finalizer and UID changes).
    cache: HashMap<String, Service>,
    /// The node set each Service's load balancer was last given, as a digest (1,000 Services
    /// × 10,000 Nodes would otherwise be up to 10 million entries).
    /// With the Node cache generation of the list it came from, so a node sync never
    /// replaces a set with one from an older list.
    last_synced_nodes: HashMap<String, (NodeSet, u64)>,
    /// The eligible Nodes and their set at a Node cache generation, reused until the cache
    /// changes (1,000 Services need not list and sort 10,000 Nodes each).
    eligible: Option<Eligible>,
    /// Services whose ensure is in the cloud now. A node sync leaves their load balancers
    /// to it: an update beside an ensure of the same load balancer could create it twice
    /// where creation is not idempotent, or interleave their changes.
    ensuring: HashSet<String>,
    /// Of those, the ones a node sync passed over: one more node sync follows their ensure.
    passed_over: HashSet<String>,
}

/// A Service's ensure, in [`State::ensuring`] until dropped (the call returned or was
/// cancelled); then queues the node sync that passed it over, if one did.
struct EnsureInFlight<'a> {
    controller: &'a ServiceController,
    key: String,
}

impl Drop for EnsureInFlight<'_> {
    fn drop(&mut self) {
        let passed_over = {
            let mut state = self.controller.state.lock();
            state.ensuring.remove(&self.key);
            state.passed_over.remove(&self.key)
        };
        if passed_over {
            self.controller.node_queue.add(());
        }
    }
}

/// The eligible Nodes at one Node cache generation.
#[derive(Clone)]
struct Eligible {
    generation: u64,
    /// When the list began (the cache was read after this).
    at: tokio::time::Instant,
    /// The cache's own Nodes, shared: a list is 8 bytes per Node, not a copy of each. A list
    /// keeps the versions it was made from alive until the last call using it ends.
    nodes: Arc<[Arc<Node>]>,
    set: NodeSet,
}

impl Eligible {
    /// Whether a load balancer last given `(set, generation)` needs this list: a different
    /// set, from a list at least as new.
    fn supersedes(&self, (set, generation): (NodeSet, u64)) -> bool {
        set != self.set && generation <= self.generation
    }
}

/// The least time between two lists of the eligible Nodes. While 10,000 Nodes join, the
/// cache changes every few milliseconds; without this, nearly every load-balancer call listed,
/// filtered, sorted and hashed every Node, and kept the Node versions of its own list alive.
const ELIGIBLE_LIST_INTERVAL: Duration = Duration::from_secs(1);

/// The service controller.
pub struct ServiceController {
    ctx: ControllerContext,
    config: ServiceConfig,
    queue: WorkQueue<String>,
    state: Mutex<State>,
    /// Upstream's `node` queue: the node syncs asked for by Node changes. Every Node change
    /// asks for the same whole-cluster sync, so its one key is `()`: changes that arrive while
    /// it is queued coalesce, and one that arrives while it runs queues the next one.
    node_queue: WorkQueue<()>,
}

impl std::fmt::Debug for ServiceController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceController")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ServiceController {
    /// A service controller, or `Ok(None)` when the provider has no [`LoadBalancer`].
    pub fn new(
        ctx: ControllerContext,
        config: ServiceConfig,
    ) -> Result<Option<Self>, ServiceConfigError> {
        if config.concurrent_service_syncs == 0 {
            return Err(ServiceConfigError::NoWorkers);
        }
        if ctx.cloud.load_balancer().is_none() {
            tracing::warn!(
                "the cloud provider does not support load balancers; service controller not started"
            );
            return Ok(None);
        }
        Ok(Some(ServiceController {
            queue: WorkQueue::new(service_rate_limiter())
                .with_metrics(ctx.metrics.queue(QUEUE_SERVICE)),
            node_queue: WorkQueue::new(service_rate_limiter())
                .with_metrics(ctx.metrics.queue(QUEUE_NODE)),
            ctx,
            config,
            state: Mutex::default(),
        }))
    }

    fn lb(&self) -> &dyn LoadBalancer {
        self.ctx.cloud.load_balancer().expect("checked in new")
    }

    /// Runs until the context's shutdown token is cancelled.
    pub async fn run(self) {
        let shutdown = self.ctx.shutdown.clone();
        let this = &self;
        let workers = futures::future::join_all(
            (0..self.config.concurrent_service_syncs).map(|_| this.service_worker()),
        );
        tokio::select! {
            () = shutdown.cancelled() => {}
            _ = futures::future::join(
                futures::future::join5(
                    workers,
                    this.watch_services(),
                    this.watch_nodes(),
                    this.node_worker(),
                    this.drift_reensure(),
                ),
                this.collect_orphaned_load_balancers(),
            ) => {}
        }
    }

    async fn service_worker(&self) {
        while let Some(key) = self.queue.get().await {
            let result = self
                .sync_service(&key)
                .instrument(tracing::info_span!("sync_service", service = %key))
                .await;
            match result {
                Ok(()) => self.queue.forget(&key),
                Err(err) => match err.retry_after() {
                    Some(delay) => {
                        tracing::info!(service = %key, ?delay, %err, "retrying after the delay asked for");
                        self.queue.forget(&key);
                        self.queue.add_after(key.clone(), delay);
                    }
                    None => {
                        tracing::warn!(service = %key, %err, "sync failed; backing off");
                        self.queue.add_rate_limited(key.clone());
                    }
                },
            }
            self.queue.done(&key);
        }
    }

    async fn watch_services(&self) {
        let api: Api<Service> = Api::all(self.ctx.client.clone());
        let mut relisting: Option<HashSet<String>> = None;
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Apply(svc)) | Ok(watcher::Event::InitApply(svc)) => {
                    let key = key_of(&svc);
                    if let Some(relisted) = relisting.as_mut() {
                        relisted.insert(key.clone());
                    }
                    let enqueue = {
                        let mut state = self.state.lock();
                        let enqueue = match state.watched.get(&key) {
                            None => wants_load_balancer(&svc) || needs_cleanup(&svc),
                            Some(old) => needs_update(old, &svc) || needs_cleanup(&svc),
                        };
                        state.watched.insert(key.clone(), svc);
                        enqueue
                    };
                    if enqueue {
                        self.queue.add(key.clone());
                    }
                }
                Ok(watcher::Event::Delete(svc)) => self.service_gone(&key_of(&svc)),
                // A relist after a watch gap (client-go's informer `Replace`): a Service deleted during the
                // gap never gets a Delete event, so whatever the relist lacks is gone, as an
                // informer's `Replace` reports it. Its load balancer must not leak even when
                // its finalizer was removed out of band.
                Ok(watcher::Event::Init) => relisting = Some(HashSet::new()),
                Ok(watcher::Event::InitDone) => {
                    if let Some(relisted) = relisting.take() {
                        let gone: Vec<String> = self
                            .state
                            .lock()
                            .watched
                            .keys()
                            .filter(|key| !relisted.contains(*key))
                            .cloned()
                            .collect();
                        for key in gone {
                            tracing::info!(service = %key, "service deleted while the watch was down");
                            self.service_gone(&key);
                        }
                    }
                }
                Err(err) => {
                    tracing::warn!(%err, "service watch failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// A Service left the cluster: clean up its load balancer if one was made for it.
    fn service_gone(&self, key: &str) {
        let synced = {
            let mut state = self.state.lock();
            state.watched.remove(key);
            state.cache.contains_key(key)
        };
        if synced {
            self.queue.add(key.to_owned());
        }
    }

    /// Node changes from the shared Node cache that can change a load balancer's hosts.
    async fn watch_nodes(&self) {
        let mut events = self.ctx.nodes.subscribe();
        let mut initialised = false;
        while let Some(event) = events.recv().await {
            let trigger = match event {
                NodeEvent::Applied { old: None, .. } => initialised,
                NodeEvent::Applied {
                    old: Some(old),
                    new,
                } => should_sync_updated_node(&old, &new),
                NodeEvent::Deleted(_) => true,
                NodeEvent::Synced => {
                    initialised = true;
                    false
                }
            };
            if trigger {
                self.node_queue.add(());
            }
        }
    }

    async fn node_worker(&self) {
        loop {
            tokio::select! {
                () = self.node_queue.ready() => {}
                () = tokio::time::sleep(self.config.node_sync_period) => self.node_queue.add(()),
            }
            let Some(()) = self.node_queue.try_get() else {
                continue;
            };
            if let Err(err) = self.sync_nodes().await {
                tracing::warn!(%err, "node sync failed");
            }
            self.node_queue.done(&());
        }
    }

    async fn collect_orphaned_load_balancers(&self) {
        let Some(config) = self.config.orphaned_lb_gc.filter(|c| !c.period.is_zero()) else {
            return std::future::pending().await;
        };
        Collector::default().run(&self.ctx, self.lb(), config).await;
    }

    async fn drift_reensure(&self) {
        let Some(period) = self.config.lb_drift_reensure_period else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tick.tick().await;
            let keys: Vec<String> = self
                .state
                .lock()
                .cache
                .iter()
                .filter(|(_, s)| wants_load_balancer(s))
                .map(|(k, _)| k.clone())
                .collect();
            for key in keys {
                self.queue.add(key.clone());
            }
        }
    }

    /// The eligible Nodes and their set, from the shared Node cache (never a LIST per sync),
    /// listed at most once per change of the cache and per [`ELIGIBLE_LIST_INTERVAL`].
    ///
    /// `current`: the Nodes as of after this call began (node syncs, which must not miss the
    /// last change). Otherwise a list at most [`ELIGIBLE_LIST_INTERVAL`] old will do (a
    /// Service's ensure: any Node change after that list triggers a node sync, which brings
    /// the load balancer up to date).
    async fn eligible_nodes(&self, current: bool) -> Eligible {
        self.ctx.nodes.wait_synced().await;
        // A list younger than ELIGIBLE_LIST_INTERVAL is never replaced: a caller that needs
        // the current Nodes and finds the cache changed since waits until a new list may be
        // made (at most that long), or takes one another caller began after it asked.
        let asked = tokio::time::Instant::now();
        let generation = loop {
            let generation = self.ctx.nodes.generation();
            let next_list = match &self.state.lock().eligible {
                Some(eligible)
                    if eligible.generation == generation
                        || eligible.at > asked
                        || (!current && eligible.at + ELIGIBLE_LIST_INTERVAL > asked) =>
                {
                    return eligible.clone();
                }
                Some(eligible) => eligible.at + ELIGIBLE_LIST_INTERVAL,
                None => break generation,
            };
            if next_list <= tokio::time::Instant::now() {
                break generation;
            }
            tokio::time::sleep_until(next_list).await;
        };
        let at = tokio::time::Instant::now();
        let mut nodes: Vec<Arc<Node>> = self
            .ctx
            .nodes
            .list()
            .into_iter()
            // A load balancer of this ccm's cloud serves only this ccm's Nodes (several ccms
            // in one cluster).
            .filter(|node| node_eligible(node) && self.ctx.owns(COMPONENT, node))
            .collect();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let set = node_set(&nodes);
        let mut state = self.state.lock();
        let eligible = Eligible {
            generation,
            at,
            nodes: nodes.into(),
            set,
        };
        state.eligible = Some(eligible.clone());
        eligible
    }

    /// Updates the hosts of every cached load balancer whose eligible node set changed.
    ///
    /// Upstream's `updateLoadBalancerHosts`: the eligible Nodes are listed once for the whole
    /// pass, and only the load balancers whose set differs from that list are updated,
    /// [`ServiceConfig::concurrent_lb_host_updates`] at a time (the shared cloud limiter
    /// still paces them). Node changes during the pass queue one more pass, which starts
    /// from a new list: changes coalesce into passes instead of each Service's turn waiting
    /// for a list newer than the changes.
    pub(crate) async fn sync_nodes(&self) -> Result<(), kube::Error> {
        let started = tokio::time::Instant::now();
        let eligible = self.eligible_nodes(true).await;
        let services: Vec<(String, Service)> = {
            let state = self.state.lock();
            state
                .cache
                .iter()
                .filter(|(k, s)| {
                    wants_load_balancer(s)
                        && state
                            .last_synced_nodes
                            .get(*k)
                            .is_some_and(|last| eligible.supersedes(*last))
                })
                .map(|(k, s)| (k.clone(), s.clone()))
                .collect()
        };
        let eligible = &eligible;
        futures::stream::iter(services)
            .for_each_concurrent(self.config.lb_host_updates(), |(key, svc)| async move {
                let span = tracing::info_span!("node_sync", service = %key);
                self.node_sync_service(&key, &svc, eligible)
                    .instrument(span)
                    .await;
            })
            .await;
        self.ctx
            .metrics
            .service
            .nodesync_latency
            .observe(seconds_since(started));
        Ok(())
    }

    async fn node_sync_service(&self, key: &str, svc: &Service, eligible: &Eligible) {
        let nodes = &eligible.nodes[..];
        let changed = {
            let mut state = self.state.lock();
            // Its ensure is in the cloud: left to it, and one more node sync follows.
            if state.ensuring.contains(key) {
                state.passed_over.insert(key.to_owned());
                return;
            }
            // Still cached (not deleted meanwhile) and still behind this pass's list (an
            // ensure may have given it these or newer Nodes since the pass began).
            match state.last_synced_nodes.get_mut(key) {
                Some(last) if eligible.supersedes(*last) => {
                    *last = (eligible.set, eligible.generation);
                    true
                }
                _ => false,
            }
        };
        if !changed {
            return;
        }
        self.ctx
            .cloud_limiter
            .acquire_at(CloudPriority::LoadBalancer)
            .await;
        let metrics = &self.ctx.metrics.service;
        metrics.loadbalancer_sync.inc();
        let started = tokio::time::Instant::now();
        let updated = self
            .lb()
            .update_load_balancer(&self.ctx.cluster_name, svc, nodes)
            .await;
        if let Err(err) = &updated {
            self.ctx
                .cloud_limiter
                .observe(CloudPriority::LoadBalancer, err);
        }
        metrics
            .update_loadbalancer_host_latency
            .observe(seconds_since(started));
        match updated {
            Ok(()) => {
                if nodes.is_empty() {
                    self.event(
                        svc,
                        EventType::Warning,
                        "UnAvailableLoadBalancer",
                        "There are no available nodes for LoadBalancer",
                    );
                } else {
                    self.event(
                        svc,
                        EventType::Normal,
                        "UpdatedLoadBalancer",
                        "Updated load balancer with new hosts",
                    );
                }
            }
            Err(err) if err.is_implemented_elsewhere() => {}
            Err(err) => {
                let get = self.lb().get_load_balancer(&self.ctx.cluster_name, svc);
                if let Ok(None) = self
                    .ctx
                    .cloud_limiter
                    .call(CloudPriority::LoadBalancer, get)
                    .await
                {
                    return;
                }
                let names: Vec<String> = nodes.iter().take(20).map(|n| n.name_any()).collect();
                let more = nodes.len().saturating_sub(20);
                let list = if more > 0 {
                    format!("{} and {more} more", names.join(", "))
                } else {
                    names.join(", ")
                };
                let message = format!(
                    "Error updating load balancer with new hosts {list} [node names limited, total number of nodes: {}], error: {err}",
                    nodes.len()
                );
                metrics.nodesync_error.inc();
                self.event(
                    svc,
                    EventType::Warning,
                    "UpdateLoadBalancerFailed",
                    &message,
                );
                self.queue.add(key.to_owned());
            }
        }
    }

    /// Records an event about `svc` in the background (client-go's recorder): a sync never
    /// waits for an Event's write, which under load costs as much as the sync's own calls.
    fn event(&self, svc: &Service, type_: EventType, reason: &'static str, message: &str) {
        self.ctx
            .events
            .record_in_background(COMPONENT, svc, type_, reason, message.to_owned());
    }

    /// Syncs one Service by key (`namespace/name`), as the watch last delivered it (upstream
    /// reads its lister). Only a key the watch does not hold (deleted, or not yet listed) is
    /// read from the API server, which then decides whether it still exists.
    pub(crate) async fn sync_service(&self, key: &str) -> Result<(), ServiceSyncError> {
        let watched = self.state.lock().watched.get(key).cloned();
        let current = match watched {
            Some(svc) => Some(svc),
            None => {
                let (ns, name) = key.split_once('/').unwrap_or(("default", key));
                let api: Api<Service> = Api::namespaced(self.ctx.client.clone(), ns);
                api.get_opt(name).await?
            }
        };
        match current {
            None => self.process_deletion(key).await,
            Some(svc) => self.process_create_or_update(key, svc).await,
        }
    }

    async fn process_deletion(&self, key: &str) -> Result<(), ServiceSyncError> {
        let cached = self.state.lock().cache.get(key).cloned();
        let Some(svc) = cached.filter(wants_load_balancer) else {
            self.forget_service(key);
            return Ok(());
        };
        self.event(
            &svc,
            EventType::Normal,
            "DeletingLoadBalancer",
            "Deleting load balancer",
        );
        let delete = self
            .lb()
            .ensure_load_balancer_deleted(&self.ctx.cluster_name, &svc);
        if let Err(err) = self
            .ctx
            .cloud_limiter
            .call(CloudPriority::LoadBalancer, delete)
            .await
        {
            let message = format!("Error deleting load balancer: {err}");
            self.event(
                &svc,
                EventType::Warning,
                "DeleteLoadBalancerFailed",
                &message,
            );
            return Err(err.into());
        }
        self.event(
            &svc,
            EventType::Normal,
            "DeletedLoadBalancer",
            "Deleted load balancer",
        );
        self.forget_service(key);
        Ok(())
    }

    fn forget_service(&self, key: &str) {
        let mut state = self.state.lock();
        state.cache.remove(key);
        state.last_synced_nodes.remove(key);
    }

    async fn process_create_or_update(
        &self,
        key: &str,
        svc: Service,
    ) -> Result<(), ServiceSyncError> {
        let cached = self.state.lock().cache.get(key).cloned();
        if let Some(old) =
            cached.filter(|old| old.metadata.uid != svc.metadata.uid && wants_load_balancer(old))
        {
            let delete = self
                .lb()
                .ensure_load_balancer_deleted(&self.ctx.cluster_name, &old);
            self.ctx
                .cloud_limiter
                .call(CloudPriority::LoadBalancer, delete)
                .await?;
        }
        self.state.lock().cache.insert(key.to_owned(), svc.clone());
        match self.sync_load_balancer_if_needed(&svc).await {
            Ok(deleted) => {
                if deleted {
                    self.forget_service(key);
                }
                Ok(())
            }
            Err(err) => {
                let message = format!("Error syncing load balancer: {err}");
                self.event(&svc, EventType::Warning, "SyncLoadBalancerFailed", &message);
                Err(err)
            }
        }
    }

    /// Returns whether the load balancer was deleted (the cleanup path).
    async fn sync_load_balancer_if_needed(&self, svc: &Service) -> Result<bool, ServiceSyncError> {
        let prev = svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.clone())
            .unwrap_or_default();
        // Beyond upstream: a Service being deleted is cleaned up, never re-finalized.
        let being_deleted = svc.metadata.deletion_timestamp.is_some();
        if !wants_load_balancer(svc) || needs_cleanup(svc) || being_deleted {
            let get = self.lb().get_load_balancer(&self.ctx.cluster_name, svc);
            let existing = self
                .ctx
                .cloud_limiter
                .call(CloudPriority::LoadBalancer, get)
                .await?;
            if existing.is_some() {
                self.event(
                    svc,
                    EventType::Normal,
                    "DeletingLoadBalancer",
                    "Deleting load balancer",
                );
                let delete = self
                    .lb()
                    .ensure_load_balancer_deleted(&self.ctx.cluster_name, svc);
                match self
                    .ctx
                    .cloud_limiter
                    .call(CloudPriority::LoadBalancer, delete)
                    .await
                {
                    Err(err) if !err.is_implemented_elsewhere() => return Err(err.into()),
                    _ => {}
                }
            }
            if has_load_balancer_finalizer(svc) {
                self.patch_finalizer(svc, false).await?;
            }
            self.event(
                svc,
                EventType::Normal,
                "DeletedLoadBalancer",
                "Deleted load balancer",
            );
            self.patch_status(svc, &prev, &LoadBalancerStatus::default())
                .await?;
            return Ok(true);
        }

        self.event(
            svc,
            EventType::Normal,
            "EnsuringLoadBalancer",
            "Ensuring load balancer",
        );
        if !has_load_balancer_finalizer(svc) {
            self.patch_finalizer(svc, true).await?;
        }
        let eligible = self.eligible_nodes(false).await;
        let nodes = &eligible.nodes[..];
        if nodes.is_empty() {
            self.event(
                svc,
                EventType::Warning,
                "UnAvailableLoadBalancer",
                "There are no available nodes for LoadBalancer",
            );
        }
        // Recorded with the ensure marked in flight, under one lock: a node sync that finds
        // this Service's set superseded from now on leaves it to this ensure.
        let in_flight = {
            let key = key_of(svc);
            let mut state = self.state.lock();
            state
                .last_synced_nodes
                .insert(key.clone(), (eligible.set, eligible.generation));
            state.ensuring.insert(key.clone());
            EnsureInFlight {
                controller: self,
                key,
            }
        };
        // The list may be up to ELIGIBLE_LIST_INTERVAL old, and a node sync that began before
        // this Service was recorded above skipped it: if the Nodes changed since the list, one
        // more node sync brings this load balancer up to date.
        if self.ctx.nodes.generation() != eligible.generation {
            self.node_queue.add(());
        }
        let ensure = self
            .lb()
            .ensure_load_balancer(&self.ctx.cluster_name, svc, nodes);
        let ensured = self
            .ctx
            .cloud_limiter
            .call(CloudPriority::LoadBalancer, ensure)
            .await;
        drop(in_flight);
        let status = match ensured {
            Ok(status) => status,
            Err(err) if err.is_implemented_elsewhere() => return Ok(false),
            Err(err) => return Err(err.into()),
        };
        self.event(
            svc,
            EventType::Normal,
            "EnsuredLoadBalancer",
            "Ensured load balancer",
        );
        self.patch_status(svc, &prev, &status).await?;
        Ok(false)
    }

    async fn patch_finalizer(&self, svc: &Service, add: bool) -> Result<(), kube::Error> {
        let patch = if add {
            serde_json::json!({"metadata": {"finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]}})
        } else {
            serde_json::json!({"metadata": {
                "$deleteFromPrimitiveList/finalizers": [FINALIZER_LOAD_BALANCER_CLEANUP]
            }})
        };
        // Upstream sends the finalizer to the `status` subresource too: a
        // status write cannot change the spec, so a stale copy never reverts a user's edit.
        self.api(svc)
            .patch_status(
                &svc.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map(drop)
    }

    async fn patch_status(
        &self,
        svc: &Service,
        prev: &LoadBalancerStatus,
        new: &LoadBalancerStatus,
    ) -> Result<(), kube::Error> {
        if load_balancer_status_equal(prev, new) {
            return Ok(());
        }
        let ingress = match new.ingress.as_ref() {
            Some(ingress) if !ingress.is_empty() => {
                serde_json::to_value(ingress).unwrap_or_default()
            }
            _ => serde_json::Value::Null,
        };
        let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": ingress}}});
        match self
            .api(svc)
            .patch_status(
                &svc.name_any(),
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        }
    }

    fn api(&self, svc: &Service) -> Api<Service> {
        Api::namespaced(
            self.ctx.client.clone(),
            &svc.namespace().unwrap_or_else(|| "default".to_owned()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, ServicePort, ServiceSpec, Taint};

    fn node(labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        n
    }

    /// The per-Service node-set digest changes with the set's names and providerIDs (what
    /// upstream's `nodesSufficientlyEqual`-style comparison looks at) and nothing else.
    #[test]
    fn node_set_digest_tracks_names_and_provider_ids() {
        let named = |name: &str, provider_id: Option<&str>| {
            let mut n = node(&[("zone", "a")]);
            n.metadata.name = Some(name.into());
            n.spec = Some(NodeSpec {
                provider_id: provider_id.map(str::to_owned),
                ..Default::default()
            });
            Arc::new(n)
        };
        let base = [named("a", Some("fake://1")), named("b", None)];
        assert_eq!(node_set(&base), node_set(&base.clone()));
        let mut relabelled = base.clone();
        Arc::make_mut(&mut relabelled[0]).metadata.labels = None;
        assert_eq!(node_set(&base), node_set(&relabelled));
        let initialized = [named("a", Some("fake://1")), named("b", Some("fake://2"))];
        assert_ne!(node_set(&base), node_set(&initialized));
        assert_ne!(node_set(&base), node_set(&base[..1]));
        let renamed = [named("a", Some("fake://1")), named("c", None)];
        assert_ne!(node_set(&base), node_set(&renamed));
        // A name ending where the next begins is not the same set.
        let split = [named("ab", None), named("c", None)];
        let joined = [named("a", None), named("bc", None)];
        assert_ne!(node_set(&split), node_set(&joined));
    }

    /// A node sync updates a load balancer only to a different set from a list at least as
    /// new as the one it was last given: an ensure that used a newer list during the pass is
    /// not taken back to the pass's older Nodes.
    #[test]
    fn a_node_sync_never_replaces_hosts_with_an_older_list() {
        let eligible = Eligible {
            generation: 7,
            at: tokio::time::Instant::now(),
            nodes: Vec::new().into(),
            set: 1,
        };
        assert!(eligible.supersedes((2, 5)), "older list, other set");
        assert!(
            eligible.supersedes((2, 7)),
            "same list generation, other set"
        );
        assert!(!eligible.supersedes((1, 5)), "same set");
        assert!(!eligible.supersedes((2, 9)), "a newer list");
    }

    /// Upstream `controllers/service/controller.go` `nodeIncludedPredicate` and
    /// `nodeUnTaintedPredicate`: the exclusion label (any value but false) and the autoscaler's
    /// deletion taint remove a Node from load balancers.
    #[test]
    fn excluded_or_autoscaler_tainted_nodes_are_not_load_balancer_targets() {
        let l = LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS;
        assert!(node_eligible(&node(&[])));
        assert!(node_eligible(&node(&[(l, "false")])));
        assert!(node_eligible(&node(&[(l, "0")])));
        assert!(!node_eligible(&node(&[(l, "true")])));
        assert!(!node_eligible(&node(&[(l, "")])));
        assert!(!node_eligible(&node(&[(l, "garbage")])));
        let mut tainted = node(&[]);
        tainted.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(!node_eligible(&tainted));
    }

    /// Upstream `controller.go` `shouldSyncUpdatedNode`: only an exclusion flip or a
    /// providerID change triggers.
    #[test]
    fn only_an_exclusion_flip_or_a_provider_id_change_resyncs_load_balancers() {
        let l = LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS;
        let old = node(&[]);
        assert!(!should_sync_updated_node(&old, &node(&[("other", "x")])));
        assert!(should_sync_updated_node(&old, &node(&[(l, "true")])));
        assert!(!should_sync_updated_node(&old, &node(&[(l, "false")])));
        let mut with_id = node(&[]);
        with_id.spec = Some(NodeSpec {
            provider_id: Some("fake://1".into()),
            ..Default::default()
        });
        assert!(should_sync_updated_node(&old, &with_id));
    }

    fn lb_service() -> Service {
        Service {
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Upstream `controller.go` `needsUpdate`: ports, annotations, traffic policy and type
    /// changes trigger; a resync or a label change does not.
    #[test]
    fn needs_update_follows_upstream_triggers() {
        let old = lb_service();
        assert!(!needs_update(&old, &old.clone()), "resync");
        let mut labels = old.clone();
        labels.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
        assert!(!needs_update(&old, &labels));
        let mut port = old.clone();
        port.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].app_protocol = Some("http".into());
        assert!(needs_update(&old, &port));
        let mut ann = old.clone();
        ann.metadata.annotations = Some([("a".to_owned(), "b".to_owned())].into());
        assert!(needs_update(&old, &ann));
        let mut etp = old.clone();
        etp.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
        assert!(needs_update(&old, &etp));
        let mut cip = old.clone();
        cip.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert!(needs_update(&old, &cip));
        assert!(!needs_update(&cip, &cip.clone()));
    }
}
