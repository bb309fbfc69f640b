//! `/metrics` in Prometheus text format: request counts and latencies by verb and resource,
//! open watches, what watches hold and how many were closed for not reading, and stored
//! objects per resource.

use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry as PromRegistry},
};

/// Labels of a per-resource watch metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The resource, with its group after a dot for named groups (`leases.coordination.k8s.io`).
    pub resource: String,
}

/// Labels of the watch-encoding metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FormatLabels {
    /// `json`, `protobuf`, `table` or `partial`.
    pub format: String,
}

/// The watch metrics, shared with the watches themselves.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchMetrics {
    /// Upstream's `apiserver_terminated_watchers_total`: watchers closed because their
    /// client did not read.
    pub(crate) terminated: Family<ResourceLabels, Counter>,
    /// How many times a watch event was serialized, by format: once per event and format
    /// however many watchers receive it.
    pub(crate) encodings: Family<FormatLabels, Counter>,
    /// Bytes encoded for watch clients and not yet taken by their connections.
    pub(crate) pending_bytes: Gauge,
}

/// Labels of a request metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `GET`, `LIST`, `WATCH`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub verb: String,
    /// The resource (plural), with its subresource after a slash; empty for non-resource paths.
    pub resource: String,
    /// The HTTP status code.
    pub code: String,
}

/// Labels of a latency metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// The verb.
    pub verb: String,
    /// The resource.
    pub resource: String,
}

/// The API server's metrics.
pub struct Metrics {
    registry: Mutex<PromRegistry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<LatencyLabels, Histogram>,
    watches: AtomicI64,
    watch: WatchMetrics,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = PromRegistry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<LatencyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0])
        });
        registry.register(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, resource and HTTP response code.",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Response latency distribution in seconds for each verb and resource.",
            latency.clone(),
        );
        let watch = WatchMetrics::default();
        registry.register(
            "apiserver_terminated_watchers",
            "Counter of watchers closed due to unresponsiveness broken by resource type.",
            watch.terminated.clone(),
        );
        registry.register(
            "apiserver_watch_event_encodings",
            "Counter of watch events serialized, by format: each event once per format, shared by every watcher.",
            watch.encodings.clone(),
        );
        registry.register(
            "apiserver_watch_pending_bytes",
            "Bytes encoded for watch clients and not yet taken by their connections.",
            watch.pending_bytes.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            requests,
            latency,
            watches: AtomicI64::new(0),
            watch,
        }
    }
}

/// The verbs that become a label of their own; any other HTTP method is counted as
/// `other`, as kube-apiserver's request metrics do, so made-up methods cannot grow the label
/// set (and `/metrics`) without bound.
const KNOWN_VERBS: &[&str] = &[
    "GET",
    "LIST",
    "WATCH",
    "POST",
    "PUT",
    "PATCH",
    "DELETE",
    "DELETECOLLECTION",
    "HEAD",
    "OPTIONS",
    "CONNECT",
];

/// The label of `verb`: itself if known, else `other`.
pub fn verb_label(verb: &str) -> &'static str {
    KNOWN_VERBS
        .iter()
        .copied()
        .find(|known| *known == verb)
        .unwrap_or("other")
}

impl Metrics {
    /// Records one finished request. `verb` is reduced to [`verb_label`]; `resource` must
    /// come from a bounded set (a served resource and subresource, or empty).
    pub fn observe(&self, verb: &str, resource: &str, code: u16, seconds: f64) {
        let verb = verb_label(verb);
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                code: code.to_string(),
            })
            .inc();
        self.latency
            .get_or_create(&LatencyLabels {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
            })
            .observe(seconds);
    }

    /// Adds a metric of the process (a controller's, say) to the exposition.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        self.registry.lock().register(name, help, metric);
    }

    /// A watch opened (+1) or closed (-1).
    pub fn watch_delta(&self, delta: i64) {
        self.watches.fetch_add(delta, Ordering::Relaxed);
    }

    /// Open watches now.
    pub fn open_watches(&self) -> i64 {
        self.watches.load(Ordering::Relaxed)
    }

    /// The watch metrics (handles onto the same series).
    pub(crate) fn watch(&self) -> &WatchMetrics {
        &self.watch
    }

    /// The text exposition, with the store's object counts appended.
    pub fn render(&self, objects: &[(String, usize)], revision: u64) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry.lock());
        let body = out.trim_end().trim_end_matches("# EOF").to_owned();
        let mut text = body.trim_end().to_owned();
        text.push_str("\n# HELP apiserver_longrunning_requests Gauge of all active long-running apiserver requests.\n# TYPE apiserver_longrunning_requests gauge\n");
        text.push_str(&format!(
            "apiserver_longrunning_requests{{verb=\"WATCH\"}} {}\n",
            self.open_watches()
        ));
        text.push_str("# HELP apiserver_storage_objects Number of stored objects at the time of last check split by kind.\n# TYPE apiserver_storage_objects gauge\n");
        for (resource, count) in objects {
            text.push_str(&format!(
                "apiserver_storage_objects{{resource=\"{resource}\"}} {count}\n"
            ));
        }
        text.push_str("# HELP apiserver_storage_revision The store's current revision.\n# TYPE apiserver_storage_revision gauge\n");
        text.push_str(&format!("apiserver_storage_revision {revision}\n"));
        text.push_str("# EOF\n");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made-up HTTP methods share one label.
    #[test]
    fn unknown_verbs_share_one_label() {
        let m = Metrics::default();
        for i in 0..1000 {
            m.observe(&format!("FROB{i}"), "", 404, 0.0);
        }
        m.observe("PATCH", "nodes", 200, 0.0);
        let text = m.render(&[], 1);
        assert!(
            text.contains(
                "apiserver_request_total{verb=\"other\",resource=\"\",code=\"404\"} 1000"
            ),
            "{text}"
        );
        assert!(!text.contains("FROB"));
        assert!(text.contains("verb=\"PATCH\""));
        assert!(text.len() < 4096, "{} bytes", text.len());
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.observe("GET", "nodes", 200, 0.01);
        m.observe("GET", "nodes", 200, 0.02);
        m.watch_delta(1);
        let text = m.render(&[("nodes".into(), 3)], 42);
        assert!(
            text.contains(
                "apiserver_request_total{verb=\"GET\",resource=\"nodes\",code=\"200\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "apiserver_request_duration_seconds_count{verb=\"GET\",resource=\"nodes\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("apiserver_longrunning_requests{verb=\"WATCH\"} 1"));
        assert!(text.contains("apiserver_storage_objects{resource=\"nodes\"} 3"));
        assert!(text.ends_with("# EOF\n"));
    }
}
