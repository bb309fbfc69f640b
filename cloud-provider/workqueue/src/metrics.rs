//! client-go's workqueue metrics (`k8s.io/component-base/metrics/prometheus/workqueue`), under
//! their names, types and buckets, labelled `name` with the queue's name.
//!
//! The cost does not grow with what is queued: a sample is an atomic add or a histogram
//! bucket, and keys in processing are counted by the instant their processing began (a batch
//! of 10,000 keys taken at once is one entry). The two in-flight gauges are computed when
//! scraped instead of by client-go's 500 ms loop.

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

type QueueLabel = [(&'static str, &'static str); 1];
type HistogramFamily = Family<QueueLabel, Histogram, fn() -> Histogram>;
/// Each queue's in-flight work, by queue name, for the collector.
type InFlightByQueue = Arc<Mutex<BTreeMap<&'static str, Arc<Mutex<InFlight>>>>>;

/// client-go's workqueue latency buckets: `ExponentialBuckets(10e-9, 10, 10)`, 10 ns to 10 s.
fn workqueue_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10.0, 10))
}

/// Every queue's metrics, one label set per queue name. Cheap to clone: clones share the
/// values. Made once per process and [registered](Self::register) once.
#[derive(Clone)]
pub struct WorkqueueMetrics {
    depth: Family<QueueLabel, Gauge>,
    adds: Family<QueueLabel, Counter>,
    queue_duration: HistogramFamily,
    work_duration: HistogramFamily,
    retries: Family<QueueLabel, Counter>,
    in_flight: InFlightByQueue,
}

impl fmt::Debug for WorkqueueMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkqueueMetrics").finish_non_exhaustive()
    }
}

impl Default for WorkqueueMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkqueueMetrics {
    /// Fresh metrics, all zero.
    pub fn new() -> Self {
        WorkqueueMetrics {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(workqueue_histogram),
            work_duration: Family::new_with_constructor(workqueue_histogram),
            retries: Family::default(),
            in_flight: Arc::default(),
        }
    }

    /// Adds every workqueue metric to `registry` under client-go's names. Call it once per
    /// registry.
    pub fn register(&self, registry: &mut Registry) {
        // prometheus_client appends `_total` to counters.
        registry.register(
            "workqueue_depth",
            "Current depth of workqueue",
            self.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "Total number of adds handled by workqueue",
            self.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            self.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            self.work_duration.clone(),
        );
        registry.register(
            "workqueue_retries",
            "Total number of retries handled by workqueue",
            self.retries.clone(),
        );
        registry.register_collector(Box::new(InFlightCollector(self.in_flight.clone())));
    }

    /// The handle of the queue called `name`; the same name always gives the same series.
    pub fn queue(&self, name: &'static str) -> QueueMetrics {
        let label = [("name", name)];
        let in_flight = self.in_flight.lock().entry(name).or_default().clone();
        QueueMetrics {
            depth: self.depth.get_or_create_owned(&label),
            adds: self.adds.get_or_create_owned(&label),
            queue_duration: self.queue_duration.get_or_create_owned(&label),
            work_duration: self.work_duration.get_or_create_owned(&label),
            retries: self.retries.get_or_create_owned(&label),
            in_flight,
        }
    }
}

/// One queue's series, as client-go's `queueMetrics`; give it to
/// [`Queue::with_metrics`](crate::Queue::with_metrics) or
/// [`WorkQueue::with_metrics`](crate::WorkQueue::with_metrics).
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
    /// How many keys are in the queue now (`workqueue_depth`).
    pub fn depth(&self) -> i64 {
        self.depth.get()
    }

    /// A key entered the queue (`adds_total` and `depth` up).
    pub(crate) fn added(&self) {
        self.adds.inc();
        self.depth.inc();
    }

    /// A key that entered the queue at `queued_at` was handed to a worker at `now`: `depth`
    /// down, its wait observed in `queue_duration_seconds`, its processing counted in flight.
    pub(crate) fn taken(&self, queued_at: Instant, now: Instant) {
        self.depth.dec();
        self.queue_duration
            .observe(now.saturating_duration_since(queued_at).as_secs_f64());
        *self.in_flight.lock().by_start.entry(now).or_default() += 1;
    }

    /// The processing of a key that began at `started` ended: observed in
    /// `work_duration_seconds`, no longer in flight.
    pub(crate) fn done(&self, started: Instant) {
        self.work_duration.observe(
            Instant::now()
                .saturating_duration_since(started)
                .as_secs_f64(),
        );
        let mut in_flight = self.in_flight.lock();
        if let Some(count) = in_flight.by_start.get_mut(&started) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                in_flight.by_start.remove(&started);
            }
        }
    }

    /// A key was put back with a delay (`retries_total` up), as client-go's `AddAfter`.
    pub(crate) fn retried(&self) {
        self.retries.inc();
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
    use crate::{Queue, RateLimiter};
    use std::time::Duration;

    fn scrape(metrics: &WorkqueueMetrics) -> String {
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

    fn queue(metrics: &WorkqueueMetrics, name: &'static str) -> Queue<u32> {
        Queue::new(RateLimiter::exponential(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        ))
        .with_metrics(metrics.queue(name))
    }

    /// client-go's queue metrics: adds and depth on add, the wait on get, the work on done,
    /// the in-flight gauges while a key is processed, retries on a delayed requeue.
    #[tokio::test(start_paused = true)]
    async fn workqueue_metrics_follow_client_go() {
        let metrics = WorkqueueMetrics::new();
        let mut q = queue(&metrics, "service");
        q.add(1);
        q.add(2);
        assert_eq!(metrics.queue("service").depth(), 2);
        tokio::time::advance(Duration::from_millis(30)).await;
        let key = q.try_get().unwrap();
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
        q.done(&key);
        q.add_rate_limited(key);
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
        let metrics = WorkqueueMetrics::new();
        let mut q = queue(&metrics, "Nodes");
        (0..1_000).for_each(|k| q.add(k));
        let first = q.drain();
        assert_eq!(first.len(), 1_000);
        assert_eq!(
            metrics.in_flight.lock()["Nodes"].lock().by_start.len(),
            1,
            "one entry for the batch"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        (1_000..1_010).for_each(|k| q.add(k));
        let second = q.drain();
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
        first.iter().chain(&second).for_each(|k| q.done(k));
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

    /// client-go's names, types and buckets (10 ns to 10 s).
    #[test]
    fn workqueue_metrics_have_client_gos_names_and_buckets() {
        let metrics = WorkqueueMetrics::new();
        metrics.queue("Routes");
        let text = scrape(&metrics);
        for line in [
            "# TYPE workqueue_depth gauge",
            "# TYPE workqueue_adds counter",
            "# TYPE workqueue_retries counter",
            "# TYPE workqueue_queue_duration_seconds histogram",
            "# TYPE workqueue_unfinished_work_seconds gauge",
            "# TYPE workqueue_longest_running_processor_seconds gauge",
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
