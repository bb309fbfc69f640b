//! What the controller metrics cost at 10,000 Nodes: every Node's key through the `Nodes`
//! queue with its metrics (added, taken in one batch, done), and a scrape of every metric.
//!
//! `cargo bench -p cloud-provider-app --bench queue_metrics` (or `cargo test --bench
//! queue_metrics` for a debug build, an upper bound). Prints the median of 21 rounds.

use std::time::Duration;

use tokio::time::Instant;

use ccm_workqueue::{Queue, RateLimiter};
use cloud_provider_app::controllers::ControllerMetrics;
use cloud_provider_app::controllers::metrics::{
    QUEUE_NODE, QUEUE_NODES, QUEUE_ROUTES, QUEUE_SERVICE,
};
use prometheus_client::registry::Registry;

const NODES: usize = 10_000;
const ROUNDS: usize = 21;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let metrics = ControllerMetrics::new();
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    let mut nodes =
        Queue::new(RateLimiter::default_controller()).with_metrics(metrics.queue(QUEUE_NODES));
    for queue in [QUEUE_SERVICE, QUEUE_NODE, QUEUE_ROUTES] {
        metrics.queue(queue);
    }
    let names: Vec<String> = (0..NODES).map(|n| format!("node-{n}")).collect();

    let sync = median(
        (0..ROUNDS)
            .map(|_| {
                let start = Instant::now();
                for name in &names {
                    nodes.add(name.clone());
                }
                let batch = nodes.drain();
                assert_eq!(batch.len(), NODES);
                for name in &batch {
                    nodes.done(name);
                }
                start.elapsed()
            })
            .collect(),
    );
    let mut text = String::new();
    let scrape = median(
        (0..ROUNDS)
            .map(|_| {
                text.clear();
                let start = Instant::now();
                prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
                start.elapsed()
            })
            .collect(),
    );
    println!(
        "{NODES} keys added, taken and processed: {sync:?} ({:?} per key); scrape: {scrape:?}, {} bytes",
        sync / NODES as u32,
        text.len()
    );
}
