//! The shared cloud controllers every provider gets: cloud-node, cloud-node-lifecycle, route
//! and service. Each is a kube-rs client of the API server (any API server: a real cluster or
//! core-cluster) and calls the provider through a [`ControllerContext`].

pub mod cloud_node_lifecycle;
mod events;
mod maintenance;
pub mod metrics;
pub mod node;
mod node_cache;
mod orphaned_lb;
pub mod ownership;
mod rate_limit;
pub mod route;
pub mod service;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use cloud_provider::CloudProvider;
pub use events::EventRecorder;
use k8s_openapi::api::core::v1::Node;
pub use maintenance::MaintenanceConfig;
pub use metrics::ControllerMetrics;
pub use node_cache::{NodeCache, NodeEvent, NodeEvents};
pub use orphaned_lb::OrphanedLbConfig;
pub use ownership::{NodeOwnership, PLATFORM_ANNOTATION};
pub use rate_limit::{CloudPriority, CloudRateLimiter};

/// What every controller gets: the cluster, the cloud, and the shared limits.
#[derive(Clone)]
#[non_exhaustive]
pub struct ControllerContext {
    /// A client of the cluster's API server.
    pub client: kube::Client,
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// `--cluster-name`, passed to load-balancer and route calls.
    pub cluster_name: String,
    /// One cloud-API rate limiter shared by every controller (beyond upstream).
    pub cloud_limiter: Arc<CloudRateLimiter>,
    /// Cancelled when the controllers must stop (shutdown or lost leadership).
    pub shutdown: CancellationToken,
    /// The Node cache every controller shares (one watch, trimmed Nodes).
    pub nodes: NodeCache,
    /// The Event recorder every controller shares (client-go's correlator caches).
    pub events: EventRecorder,
    /// The controllers' metrics (upstream's names), shared by every controller.
    pub metrics: ControllerMetrics,
    /// Which Nodes this ccm owns (beyond upstream: several ccms in one cluster).
    pub ownership: NodeOwnership,
}

impl ControllerContext {
    /// A context with an unlimited cloud rate limiter, its own Node cache and its own
    /// (unregistered) metrics.
    pub fn new(
        client: kube::Client,
        cloud: Arc<dyn CloudProvider>,
        cluster_name: impl Into<String>,
        shutdown: CancellationToken,
    ) -> Self {
        ControllerContext {
            nodes: NodeCache::new(client.clone(), shutdown.clone()),
            events: EventRecorder::new(client.clone()),
            metrics: ControllerMetrics::new(),
            client,
            cloud,
            cluster_name: cluster_name.into(),
            cloud_limiter: Arc::new(CloudRateLimiter::unlimited()),
            shutdown,
            ownership: NodeOwnership::all(),
        }
    }

    /// Sets which Nodes this ccm owns.
    pub fn with_ownership(mut self, ownership: NodeOwnership) -> Self {
        self.ownership = ownership;
        self
    }

    /// Whether this ccm owns `node`; a Node it does not own is counted as skipped by
    /// `controller` (`cloudprovider_node_ownership_skipped_total`).
    pub fn owns(&self, controller: &'static str, node: &Node) -> bool {
        let owned = self.ownership.owns(node);
        if !owned {
            self.metrics
                .ownership_skipped
                .get_or_create(&[("controller", controller)])
                .inc();
        }
        owned
    }

    /// Replaces the Node cache, so several controllers share one watch.
    pub fn with_node_cache(mut self, nodes: NodeCache) -> Self {
        self.nodes = nodes;
        self
    }

    /// Replaces the Event recorder, so several controllers share its caches.
    pub fn with_event_recorder(mut self, events: EventRecorder) -> Self {
        self.events = events;
        self
    }

    /// Replaces the metrics, so every controller counts into the registered ones.
    pub fn with_metrics(mut self, metrics: ControllerMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Replaces the shared cloud rate limiter.
    pub fn with_cloud_limiter(mut self, limiter: Arc<CloudRateLimiter>) -> Self {
        self.cloud_limiter = limiter;
        self
    }
}
