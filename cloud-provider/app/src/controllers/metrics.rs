//! The controllers' metrics, under upstream's fully-qualified names, types, labels and buckets,
//! for `/metrics` (the provider's own metrics sit beside them through
//! [`CloudProvider::register_metrics`](cloud_provider::CloudProvider::register_metrics)).
//!
//! - client-go's workqueue metrics (`k8s.io/component-base/metrics/prometheus/workqueue`),
//!   labelled `name` with upstream's queue names: [`QUEUE_NODES`], [`QUEUE_SERVICE`],
//!   [`QUEUE_NODE`], [`QUEUE_ROUTES`];
//! - the cloud-node controller's (`controllers/node/metrics.go`);
//! - the route controller's (`controllers/route/metrics.go`);
//! - the service controller's (`controllers/service/metrics.go`).
//!
//! The cost does not grow with the cluster: the only label is the queue's name (four label
//! sets), a sample is an atomic add or a histogram bucket, and the in-flight work is kept by
//! start instant (one entry per batch or worker, never per Node); see
//! [`ccm_workqueue::WorkqueueMetrics`].

use std::fmt;

use ccm_workqueue::{QueueMetrics, WorkqueueMetrics};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::time::Instant;

/// The cloud-node controller's queue (upstream `Name: "Nodes"`).
pub const QUEUE_NODES: &str = "Nodes";
/// The service controller's Service queue (upstream `Name: "service"`).
pub const QUEUE_SERVICE: &str = "service";
/// The service controller's node-sync queue (upstream `Name: "node"`).
pub const QUEUE_NODE: &str = "node";
/// The watch-based route controller's queue (upstream `Name: "Routes"`).
pub const QUEUE_ROUTES: &str = "Routes";

/// Upstream's cloud-node buckets: `ExponentialBuckets(1, 4, 6)`, 1 s to about 17 min.
fn node_delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 4.0, 6))
}

/// Upstream's service-controller buckets: `ExponentialBuckets(1, 2, 15)`, 1 s to 16,384 s.
fn service_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

/// Every controller's metrics. Cheap to clone: clones share the values. Made once per
/// process and [registered](Self::register) once; a [`ControllerContext`] built without one
/// counts into its own, unregistered set.
///
/// [`ControllerContext`]: super::ControllerContext
#[derive(Clone)]
pub struct ControllerMetrics {
    workqueues: WorkqueueMetrics,
    pub(crate) node: NodeMetrics,
    pub(crate) route: RouteMetrics,
    pub(crate) service: ServiceMetrics,
    /// `cloudprovider_node_ownership_skipped_total{controller}` (beyond upstream).
    pub(crate) ownership_skipped: super::ownership::SkipCounter,
}

impl fmt::Debug for ControllerMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerMetrics").finish_non_exhaustive()
    }
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    /// Fresh metrics, all zero.
    pub fn new() -> Self {
        ControllerMetrics {
            workqueues: WorkqueueMetrics::new(),
            node: NodeMetrics {
                taint_removal_delay: node_delay_histogram(),
                initial_sync_delay: node_delay_histogram(),
            },
            route: RouteMetrics {
                route_sync: Counter::default(),
                node_routes_delay: node_delay_histogram(),
            },
            service: ServiceMetrics {
                loadbalancer_sync: Counter::default(),
                nodesync_error: Counter::default(),
                nodesync_latency: service_latency_histogram(),
                update_loadbalancer_host_latency: service_latency_histogram(),
            },
            ownership_skipped: Default::default(),
        }
    }

    /// Adds every metric to `registry` under upstream's names. Call it once per registry.
    pub fn register(&self, registry: &mut Registry) {
        self.workqueues.register(registry);

        let node = &self.node;
        registry.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node",
            node.taint_removal_delay.clone(),
        );
        registry.register(
            "node_controller_initial_node_sync_delay_seconds",
            "Number of seconds after node creation when NodeController finished the initial synchronization of a single node",
            node.initial_sync_delay.clone(),
        );

        registry.register(
            "route_controller_route_sync",
            "A metric counting the amount of times routes have been synced with the cloud provider",
            self.route.route_sync.clone(),
        );
        registry.register(
            "route_controller_node_routes_delay_seconds",
            "Number of seconds after node creation when RouteController had created every route of a single node",
            self.route.node_routes_delay.clone(),
        );

        let service = &self.service;
        registry.register(
            "service_controller_loadbalancer_sync",
            "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            service.loadbalancer_sync.clone(),
        );
        registry.register(
            "service_controller_nodesync_error",
            "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            service.nodesync_error.clone(),
        );
        registry.register(
            "service_controller_nodesync_latency_seconds",
            "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates",
            service.nodesync_latency.clone(),
        );
        registry.register(
            "service_controller_update_loadbalancer_host_latency_seconds",
            "A metric measuring the latency for updating each load balancer hosts",
            service.update_loadbalancer_host_latency.clone(),
        );
        registry.register(
            "cloudprovider_node_ownership_skipped",
            "Nodes a controller left alone because another cloud controller manager's platform owns them",
            self.ownership_skipped.clone(),
        );
    }

    /// How many times `controller` skipped a Node it does not own.
    pub fn ownership_skips(&self, controller: &'static str) -> u64 {
        self.ownership_skipped
            .get_or_create(&[("controller", controller)])
            .get()
    }

    /// The handle of the queue called `name` (one of the `QUEUE_*` names); the same name
    /// always gives the same series.
    pub fn queue(&self, name: &'static str) -> QueueMetrics {
        self.workqueues.queue(name)
    }
}

/// Upstream's `controllers/node/metrics.go` (subsystem `node_controller`).
#[derive(Clone)]
pub(crate) struct NodeMetrics {
    /// `node_controller_cloud_provider_taint_removal_delay_seconds`.
    pub(crate) taint_removal_delay: Histogram,
    /// `node_controller_initial_node_sync_delay_seconds`.
    pub(crate) initial_sync_delay: Histogram,
}

/// Upstream's `controllers/route/metrics.go` (subsystem `route_controller`).
#[derive(Clone)]
pub(crate) struct RouteMetrics {
    /// `route_controller_route_sync_total`.
    pub(crate) route_sync: Counter,
    /// Beyond upstream (the measure KEP-5237's review asks for):
    /// `route_controller_node_routes_delay_seconds`, from a Node's creation until all its
    /// routes exist (its `NetworkUnavailable` turned `False`), in the cloud-node buckets.
    pub(crate) node_routes_delay: Histogram,
}

/// Upstream's `controllers/service/metrics.go` (subsystem `service_controller`).
#[derive(Clone)]
pub(crate) struct ServiceMetrics {
    /// `service_controller_loadbalancer_sync_total`: `UpdateLoadBalancer` calls of node syncs.
    pub(crate) loadbalancer_sync: Counter,
    /// `service_controller_nodesync_error_total`.
    pub(crate) nodesync_error: Counter,
    /// `service_controller_nodesync_latency_seconds`: one whole node sync.
    pub(crate) nodesync_latency: Histogram,
    /// `service_controller_update_loadbalancer_host_latency_seconds`: one `UpdateLoadBalancer`.
    pub(crate) update_loadbalancer_host_latency: Histogram,
}

/// Seconds from `since` to now, never negative.
pub(crate) fn seconds_since(since: Instant) -> f64 {
    Instant::now()
        .saturating_duration_since(since)
        .as_secs_f64()
}

/// Seconds from a Node's `creationTimestamp` to now by the wall clock (upstream's
/// `time.Since(node.CreationTimestamp)`), 0 when unknown or in the future.
pub(crate) fn seconds_since_creation(node: &k8s_openapi::api::core::v1::Node) -> f64 {
    node.metadata.creation_timestamp.as_ref().map_or(0.0, |t| {
        let elapsed = jiff::Timestamp::now().duration_since(t.0).as_secs_f64();
        elapsed.max(0.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(metrics: &ControllerMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            !out.contains(".."),
            "help texts end with one period:\n{out}"
        );
        out
    }

    /// Upstream's fully-qualified names and buckets (controllers/{node,route,service}/metrics.go).
    #[test]
    fn controller_metrics_have_upstream_names_and_buckets() {
        let metrics = ControllerMetrics::new();
        metrics.queue(QUEUE_ROUTES);
        metrics
            .ownership_skipped
            .get_or_create(&[("controller", "service-controller")])
            .inc();
        let text = scrape(&metrics);
        for line in [
            "# TYPE node_controller_cloud_provider_taint_removal_delay_seconds histogram",
            "node_controller_cloud_provider_taint_removal_delay_seconds_bucket{le=\"1024.0\"} 0",
            "# TYPE node_controller_initial_node_sync_delay_seconds histogram",
            "route_controller_route_sync_total 0",
            "route_controller_node_routes_delay_seconds_bucket{le=\"1024.0\"} 0",
            "cloudprovider_node_ownership_skipped_total{controller=\"service-controller\"} 1",
            "service_controller_loadbalancer_sync_total 0",
            "service_controller_nodesync_error_total 0",
            "service_controller_nodesync_latency_seconds_bucket{le=\"16384.0\"} 0",
            "service_controller_update_loadbalancer_host_latency_seconds_bucket{le=\"16384.0\"} 0",
            "workqueue_depth{name=\"Routes\"} 0",
            "workqueue_work_duration_seconds_bucket{le=\"1e-8\",name=\"Routes\"} 0",
            "workqueue_work_duration_seconds_bucket{le=\"10.0\",name=\"Routes\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(
            !text.contains("le=\"100.0\",name=\"Routes\""),
            "client-go's buckets stop at 10 s:\n{text}"
        );
    }
}
