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
//! start instant (one entry per batch or worker, never per Node). The two in-flight gauges are
//! computed when scraped instead of by upstream's 500 ms loop.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

type QueueLabel = [(&'static str, &'static str); 1];
type HistogramFamily = Family<QueueLabel, Histogram, fn() -> Histogram>;
/// Each queue's in-flight work, by queue name, for the collector.
type InFlightByQueue = Arc<Mutex<BTreeMap<&'static str, Arc<Mutex<InFlight>>>>>;

/// client-go's workqueue latency buckets: `ExponentialBuckets(10e-9, 10, 10)`, 10 ns to 10 s.
fn workqueue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10.0, 10))
}

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
    workqueues: Workqueues,
    pub(crate) node: NodeMetrics,
    pub(crate) route: RouteMetrics,
    pub(crate) service: ServiceMetrics,
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
            workqueues: Workqueues::default(),
            node: NodeMetrics {
                taint_removal_delay: node_delay_histogram(),
                initial_sync_delay: node_delay_histogram(),
            },
            route: RouteMetrics::default(),
            service: ServiceMetrics {
                loadbalancer_sync: Counter::default(),
                nodesync_error: Counter::default(),
                nodesync_latency: service_latency_histogram(),
                update_loadbalancer_host_latency: service_latency_histogram(),
            },
        }
    }

    /// Adds every metric to `registry` under upstream's names. Call it once per registry.
    pub fn register(&self, registry: &mut Registry) {
        let q = &self.workqueues;
        // prometheus_client appends `_total` to counters.
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            q.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            q.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            q.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            q.work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            q.retries.clone(),
        );
        registry.register_collector(Box::new(InFlightCollector(q.in_flight.clone())));

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
    }

    /// The handle of the queue called `name` (one of the `QUEUE_*` names); the same name
    /// always gives the same series.
    pub fn queue(&self, name: &'static str) -> QueueMetrics {
        let q = &self.workqueues;
        let label = [("name", name)];
        let in_flight = q.in_flight.lock().entry(name).or_default().clone();
        QueueMetrics {
            depth: q.depth.get_or_create_owned(&label),
            adds: q.adds.get_or_create_owned(&label),
            queue_duration: q.queue_duration.get_or_create_owned(&label),
            work_duration: q.work_duration.get_or_create_owned(&label),
            retries: q.retries.get_or_create_owned(&label),
            in_flight,
        }
    }
}

/// The workqueue families, one label set per queue.
#[derive(Clone)]
struct Workqueues {
    depth: Family<QueueLabel, Gauge>,
    adds: Family<QueueLabel, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    retries: Family<QueueLabel, Counter>,
    in_flight: InFlightByQueue,
}

impl Default for Workqueues {
    fn default() -> Self {
        Workqueues {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(workqueue_histogram),
            work_duration: Family::new_with_constructor(workqueue_histogram),
            retries: Family::default(),
            in_flight: Arc::default(),
        }
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
#[derive(Clone, Default)]
pub(crate) struct RouteMetrics {
    /// `route_controller_route_sync_total`.
    pub(crate) route_sync: Counter,
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

/// One queue's workqueue metrics, as client-go's `queueMetrics`: call [`added`](Self::added)
/// when a key enters the queue, [`taken`](Self::taken) when a worker gets it,
/// [`start`](Self::start) around its processing and [`retried`](Self::retried) for a
/// rate-limited requeue.
#[derive(Clone)]
pub struct QueueMetrics {
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
    in_flight: Arc<Mutex<InFlight>>,
}

impl fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueMetrics")
            .field("depth", &self.depth.get())
            .field("adds", &self.adds.get())
            .finish_non_exhaustive()
    }
}

impl QueueMetrics {
    /// A key entered the queue (`adds_total` and `depth` up).
    pub fn added(&self) {
        self.adds.inc();
        self.depth.inc();
    }

    /// A key that entered the queue at `queued_at` was handed to a worker (`depth` down, its
    /// wait observed in `queue_duration_seconds`).
    pub fn taken(&self, queued_at: Instant) {
        self.depth.dec();
        self.queue_duration.observe(seconds_since(queued_at));
    }

    /// A key was put back with rate limiting (`retries_total` up).
    pub fn retried(&self) {
        self.retries.inc();
    }

    /// `items` keys are being processed together from now until the returned guard drops;
    /// each is then observed in `work_duration_seconds`. Meanwhile they count in
    /// `unfinished_work_seconds` and `longest_running_processor_seconds`.
    pub fn start(&self, items: usize) -> Work {
        let started = Instant::now();
        if items > 0 {
            *self.in_flight.lock().by_start.entry(started).or_default() += items;
        }
        Work {
            metrics: self.clone(),
            started,
            items,
        }
    }

    /// How many keys are in the queue now.
    pub fn depth(&self) -> i64 {
        self.depth.get()
    }
}

/// Keys being processed (see [`QueueMetrics::start`]); dropping it ends their processing.
#[must_use = "the work ends when this guard is dropped"]
pub struct Work {
    metrics: QueueMetrics,
    started: Instant,
    items: usize,
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("items", &self.items)
            .finish_non_exhaustive()
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if self.items == 0 {
            return;
        }
        let seconds = seconds_since(self.started);
        for _ in 0..self.items {
            self.metrics.work_duration.observe(seconds);
        }
        let mut in_flight = self.metrics.in_flight.lock();
        if let Some(count) = in_flight.by_start.get_mut(&self.started) {
            *count = count.saturating_sub(self.items);
            if *count == 0 {
                in_flight.by_start.remove(&self.started);
            }
        }
    }
}

/// The keys being processed, counted by the instant their processing started.
#[derive(Default)]
struct InFlight {
    by_start: BTreeMap<Instant, usize>,
}

impl InFlight {
    /// client-go's `unfinished_work_seconds` and `longest_running_processor_seconds` at `now`.
    fn gauges(&self, now: Instant) -> (f64, f64) {
        let unfinished = self.by_start.iter().fold(0.0, |sum, (start, n)| {
            sum + now.saturating_duration_since(*start).as_secs_f64() * *n as f64
        });
        let longest = self.by_start.keys().next().map_or(0.0, |start| {
            now.saturating_duration_since(*start).as_secs_f64()
        });
        (unfinished, longest)
    }
}

/// Encodes the two in-flight gauges of every queue when scraped.
struct InFlightCollector(InFlightByQueue);

impl fmt::Debug for InFlightCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlightCollector").finish_non_exhaustive()
    }
}

impl Collector for InFlightCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let now = Instant::now();
        let queues: Vec<(&'static str, (f64, f64))> = self
            .0
            .lock()
            .iter()
            .map(|(name, in_flight)| (*name, in_flight.lock().gauges(now)))
            .collect();
        type Pick = fn(&(f64, f64)) -> f64;
        let gauges: [(&str, &str, Pick); 2] = [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases",
                |g| g.0,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
                |g| g.1,
            ),
        ];
        for (name, help, pick) in gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (queue, values) in &queues {
                let label = [("name", *queue)];
                family.encode_family(&label)?.encode_gauge(&pick(values))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    /// client-go's queue metrics: adds and depth on add, the wait on get, the work on done,
    /// the in-flight gauges while a key is processed, retries on a rate-limited requeue.
    #[tokio::test(start_paused = true)]
    async fn workqueue_metrics_follow_client_go() {
        let metrics = ControllerMetrics::new();
        let queue = metrics.queue(QUEUE_SERVICE);
        queue.added();
        queue.added();
        assert_eq!(queue.depth(), 2);
        tokio::time::advance(Duration::from_millis(30)).await;
        let queued_at = Instant::now() - Duration::from_millis(30);
        queue.taken(queued_at);
        let work = queue.start(1);
        tokio::time::advance(Duration::from_secs(2)).await;
        let text = scrape(&metrics);
        for line in [
            "workqueue_depth{name=\"service\"} 1",
            "workqueue_adds_total{name=\"service\"} 2",
            "workqueue_queue_duration_seconds_count{name=\"service\"} 1",
            "workqueue_queue_duration_seconds_bucket{le=\"0.1\",name=\"service\"} 1",
            "workqueue_queue_duration_seconds_bucket{le=\"0.01\",name=\"service\"} 0",
            "workqueue_unfinished_work_seconds{name=\"service\"} 2.0",
            "workqueue_longest_running_processor_seconds{name=\"service\"} 2.0",
            "workqueue_work_duration_seconds_count{name=\"service\"} 0",
            "workqueue_retries_total{name=\"service\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        drop(work);
        queue.retried();
        let text = scrape(&metrics);
        for line in [
            "workqueue_work_duration_seconds_count{name=\"service\"} 1",
            "workqueue_work_duration_seconds_sum{name=\"service\"} 2.0",
            "workqueue_unfinished_work_seconds{name=\"service\"} 0.0",
            "workqueue_retries_total{name=\"service\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    /// A batch counts once per key in the work histogram but is one in-flight entry, and the
    /// longest processor is the oldest batch.
    #[tokio::test(start_paused = true)]
    async fn batches_count_every_key_in_one_entry() {
        let metrics = ControllerMetrics::new();
        let queue = metrics.queue(QUEUE_NODES);
        let first = queue.start(1_000);
        tokio::time::advance(Duration::from_secs(1)).await;
        let second = queue.start(10);
        tokio::time::advance(Duration::from_secs(1)).await;
        let text = scrape(&metrics);
        assert!(
            text.contains("workqueue_unfinished_work_seconds{name=\"Nodes\"} 2010.0"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_longest_running_processor_seconds{name=\"Nodes\"} 2.0"),
            "{text}"
        );
        drop(first);
        drop(second);
        let text = scrape(&metrics);
        assert!(
            text.contains("workqueue_work_duration_seconds_count{name=\"Nodes\"} 1010"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_longest_running_processor_seconds{name=\"Nodes\"} 0.0"),
            "{text}"
        );
    }

    /// Upstream's fully-qualified names and buckets (controllers/{node,route,service}/metrics.go).
    #[test]
    fn controller_metrics_have_upstream_names_and_buckets() {
        let metrics = ControllerMetrics::new();
        metrics.queue(QUEUE_ROUTES);
        let text = scrape(&metrics);
        for line in [
            "# TYPE node_controller_cloud_provider_taint_removal_delay_seconds histogram",
            "node_controller_cloud_provider_taint_removal_delay_seconds_bucket{le=\"1024.0\"} 0",
            "# TYPE node_controller_initial_node_sync_delay_seconds histogram",
            "route_controller_route_sync_total 0",
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
