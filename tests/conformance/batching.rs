//! The batched instance-metadata call: one cloud call per sync for a provider that batches,
//! and a bounded fan-out of single calls for one that does not.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use async_trait::async_trait;
use cloud_provider::{
    CloudResult, InstanceMetadata, InstancesV2, provider::DEFAULT_BATCH_CONCURRENCY,
};
use cloud_provider_fake::{FakeCloud, FakeInstance, Method};
use k8s_openapi::api::core::v1::Node;

fn nodes(n: usize) -> Vec<Node> {
    (0..n)
        .map(|i| {
            let mut node = Node::default();
            node.metadata.name = Some(format!("node-{i}"));
            node
        })
        .collect()
}

#[tokio::test]
async fn a_batching_provider_makes_one_call_for_a_thousand_nodes() {
    let cloud = FakeCloud::builder()
        .instances((0..1000).map(|i| FakeInstance::new(format!("i-{i}"), format!("node-{i}"))))
        .build();
    let nodes = nodes(1000);
    let refs: Vec<&Node> = nodes.iter().collect();
    let results = cloud.instance_metadata_batch(&refs).await;
    assert_eq!(results.len(), 1000);
    for (i, result) in results.iter().enumerate() {
        let meta = result.as_ref().unwrap().as_ref().unwrap();
        assert_eq!(
            meta.provider_id,
            format!("fake://i-{i}"),
            "results keep the input order"
        );
    }
    assert_eq!(cloud.total_calls(), 1);
    assert_eq!(cloud.call_count(Method::InstanceMetadataBatch), 1);
}

/// A provider without a batch override; it counts the single calls in flight.
#[derive(Default)]
struct Unbatched {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    calls: AtomicUsize,
}

#[async_trait]
impl InstancesV2 for Unbatched {
    async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let name = node.metadata.name.clone().unwrap_or_default();
        Ok(Some(InstanceMetadata::new(format!("u://{name}"))))
    }
}

#[tokio::test(start_paused = true)]
async fn the_default_batch_calls_each_node_with_bounded_concurrency() {
    let provider = Arc::new(Unbatched::default());
    let nodes = nodes(100);
    let refs: Vec<&Node> = nodes.iter().collect();
    let start = tokio::time::Instant::now();
    let results = provider.instance_metadata_batch(&refs).await;
    assert_eq!(results.len(), 100);
    assert_eq!(
        results[42].as_ref().unwrap().as_ref().unwrap().provider_id,
        "u://node-42"
    );
    assert_eq!(provider.calls.load(Ordering::SeqCst), 100);
    assert_eq!(
        provider.peak.load(Ordering::SeqCst),
        DEFAULT_BATCH_CONCURRENCY
    );
    // 100 calls of 10 ms, 16 at a time: 7 rounds.
    assert_eq!(start.elapsed(), std::time::Duration::from_millis(70));
}
