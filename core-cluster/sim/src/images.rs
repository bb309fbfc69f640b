//! Simulated images and kubelet's image garbage collection
//! (`pkg/kubelet/images/image_gc_manager.go`).
//!
//! Each node has an image filesystem of [`ImageGcConfig::imagefs_capacity`] bytes. A
//! pod's images are pulled when it starts (a size derived from the image name, 10–500 MB,
//! the same on every node) and are in use while a pod using them runs on the node. Every
//! [`ImageGcConfig::period`] (kubelet's `ImageGCPeriod`, 5 minutes) the node collects:
//!
//! - images unused for longer than `imageMaximumGCAge` (0: never) are removed
//!   (`freeOldImages`);
//! - when usage is at or above `imageGCHighThresholdPercent` (85), unused images are removed,
//!   least recently used first, until usage is at `imageGCLowThresholdPercent` (80)
//!   (`freeSpace`); images detected less than `imageMinimumGCAge` (2 minutes) ago and images
//!   in use are never removed. When that cannot free enough, the node records the warning
//!   Event `FreeDiskSpaceFailed` ("Failed to garbage collect required amount of images.
//!   Attempted to free N bytes, but only found M bytes eligible to free."), and
//!   `ImageGCFailed` when collection failed twice in a row, as kubelet does.
//!
//! The node reports its images in `status.images`, largest first, at most
//! `nodeStatusMaxImages` (50).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::ContainerImage;
use tokio::time::Instant;

/// kubelet's `nodeStatusMaxImages` default.
pub const NODE_STATUS_MAX_IMAGES: usize = 50;

/// Image GC settings (KubeletConfiguration names and defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageGcConfig {
    /// Simulate images at all (pulls, `status.images`, GC). Off by default.
    pub enabled: bool,
    /// Size of each node's image filesystem, bytes (default 20 GiB).
    pub imagefs_capacity: u64,
    /// `imageGCHighThresholdPercent` (85).
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent` (80).
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge` (2 min).
    pub minimum_gc_age: Duration,
    /// `imageMaximumGCAge` (0: off).
    pub maximum_gc_age: Duration,
    /// kubelet's `ImageGCPeriod` (5 min).
    pub period: Duration,
    /// `nodeStatusMaxImages` (50).
    pub node_status_max_images: usize,
}

impl Default for ImageGcConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            imagefs_capacity: 20 << 30,
            high_threshold_percent: 85,
            low_threshold_percent: 80,
            minimum_gc_age: Duration::from_secs(120),
            maximum_gc_age: Duration::ZERO,
            period: Duration::from_secs(300),
            node_status_max_images: NODE_STATUS_MAX_IMAGES,
        }
    }
}

/// The simulated size of an image: 10–500 MB, from its name (FNV-1a), so every node
/// agrees.
pub fn image_size(image: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in image.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    10_000_000 + h % 490_000_000
}

#[derive(Debug, Clone)]
struct Record {
    size: u64,
    first_detected: Instant,
    last_used: Instant,
}

/// What one collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcOutcome {
    /// The images removed, in removal order.
    pub removed: Vec<String>,
    /// Bytes freed.
    pub freed: u64,
    /// `Some(message)` when the high threshold was crossed and not enough could be freed.
    pub failure: Option<String>,
}

/// One node's images.
#[derive(Debug, Default)]
pub struct ImageStore {
    images: BTreeMap<String, Record>,
    /// Images of the pods running here, by pod uid.
    pods: HashMap<String, Vec<String>>,
    /// Bumped on every change of the image list.
    version: u64,
}

impl ImageStore {
    /// Pulls (or touches) a pod's images and marks them in use by it.
    pub fn start_pod(&mut self, uid: &str, images: Vec<String>, now: Instant) {
        for image in &images {
            match self.images.get_mut(image) {
                Some(r) => r.last_used = now,
                None => {
                    self.images.insert(
                        image.clone(),
                        Record {
                            size: image_size(image),
                            first_detected: now,
                            last_used: now,
                        },
                    );
                    self.version += 1;
                }
            }
        }
        self.pods.insert(uid.to_owned(), images);
    }

    /// The pod stopped: its images are no longer in use by it (last used now).
    pub fn stop_pod(&mut self, uid: &str, now: Instant) {
        for image in self.pods.remove(uid).unwrap_or_default() {
            if let Some(r) = self.images.get_mut(&image) {
                r.last_used = now;
            }
        }
    }

    fn in_use(&self, image: &str) -> bool {
        self.pods
            .values()
            .any(|imgs| imgs.iter().any(|i| i == image))
    }

    /// Bytes the images take.
    pub fn used_bytes(&self) -> u64 {
        self.images.values().map(|r| r.size).sum()
    }

    /// A counter that changes whenever the image list does.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Whether `image` is present.
    pub fn has(&self, image: &str) -> bool {
        self.images.contains_key(image)
    }

    /// `status.images`: largest first, at most `max` (0: none reported).
    pub fn status_images(&self, max: usize) -> Vec<ContainerImage> {
        let mut all: Vec<(&String, &Record)> = self.images.iter().collect();
        all.sort_by(|a, b| b.1.size.cmp(&a.1.size).then(a.0.cmp(b.0)));
        all.into_iter()
            .take(max)
            .map(|(name, r)| ContainerImage {
                names: Some(vec![name.clone()]),
                size_bytes: Some(r.size as i64),
            })
            .collect()
    }

    fn remove(&mut self, name: &str, out: &mut GcOutcome) {
        if let Some(r) = self.images.remove(name) {
            out.freed += r.size;
            out.removed.push(name.to_owned());
            self.version += 1;
        }
    }

    /// One collection (`GarbageCollect`): old images, then space down to the low
    /// threshold.
    pub fn collect(&mut self, config: &ImageGcConfig, now: Instant) -> GcOutcome {
        let mut out = GcOutcome::default();
        // freeOldImages: unused for longer than imageMaximumGCAge.
        if !config.maximum_gc_age.is_zero() {
            let old: Vec<String> = self
                .images
                .iter()
                .filter(|(name, r)| {
                    !self.in_use(name)
                        && now.saturating_duration_since(r.last_used) > config.maximum_gc_age
                })
                .map(|(name, _)| name.clone())
                .collect();
            for name in old {
                self.remove(&name, &mut out);
            }
        }
        let capacity = config.imagefs_capacity.max(1);
        let used = self.used_bytes();
        let usage_percent = used.saturating_mul(100) / capacity;
        if usage_percent < u64::from(config.high_threshold_percent) {
            return out;
        }
        let target = capacity.saturating_mul(u64::from(config.low_threshold_percent)) / 100;
        let amount = used.saturating_sub(target);
        // freeSpace: unused images, least recently used first (then first detected), old
        // enough.
        let mut candidates: Vec<(String, Instant, Instant)> = self
            .images
            .iter()
            .filter(|(name, r)| {
                !self.in_use(name)
                    && now.saturating_duration_since(r.first_detected) >= config.minimum_gc_age
            })
            .map(|(name, r)| (name.clone(), r.last_used, r.first_detected))
            .collect();
        candidates.sort_by(|a, b| (a.1, a.2, &a.0).cmp(&(b.1, b.2, &b.0)));
        let mut freed = 0;
        for (name, _, _) in candidates {
            if freed >= amount {
                break;
            }
            let before = out.freed;
            self.remove(&name, &mut out);
            freed += out.freed - before;
        }
        if freed < amount {
            out.failure = Some(format!(
                "Failed to garbage collect required amount of images. Attempted to free {amount} bytes, but only found {freed} bytes eligible to free."
            ));
        }
        out
    }
}

impl ImageStore {
    /// `DeleteUnusedImages` (the eviction manager's reclaim): every unused image detected
    /// at least `imageMinimumGCAge` ago goes, whatever the usage.
    pub fn free_unused(&mut self, config: &ImageGcConfig, now: Instant) -> GcOutcome {
        let mut out = GcOutcome::default();
        let unused: Vec<String> = self
            .images
            .iter()
            .filter(|(name, r)| {
                !self.in_use(name)
                    && now.saturating_duration_since(r.first_detected) >= config.minimum_gc_age
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in unused {
            self.remove(&name, &mut out);
        }
        out
    }
}

/// Runs image GC on every node each period; posts the Events kubelet posts.
pub(crate) async fn run_image_gc(
    shared: Arc<crate::Shared>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let config = shared.config.image_gc.clone();
    if !config.enabled {
        return;
    }
    let mut failed_before: HashMap<String, bool> = HashMap::new();
    let mut tick = tokio::time::interval_at(Instant::now() + config.period, config.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let nodes: Vec<Arc<crate::NodeState>> = shared.nodes.read().values().cloned().collect();
        for node in nodes {
            if shared.heartbeat_stopped(&node) {
                continue;
            }
            // The node's own thresholds and ages (the period is the simulator's).
            let outcome = node
                .images
                .lock()
                .collect(&node.config.image_gc, Instant::now());
            if !outcome.removed.is_empty() {
                tracing::info!(node = %node.name, removed = ?outcome.removed, freed = outcome.freed, "image GC");
                node.notify.notify_one();
            }
            let prev = failed_before.insert(node.name.clone(), outcome.failure.is_some());
            if let Some(message) = outcome.failure {
                post_event(&shared, &node.name, "FreeDiskSpaceFailed", &message).await;
                if prev == Some(true) {
                    post_event(&shared, &node.name, "ImageGCFailed", &message).await;
                }
            }
        }
    }
}

/// A warning Event about the node, from the kubelet, as its recorder writes them.
pub(crate) async fn post_event(shared: &crate::Shared, node: &str, reason: &str, message: &str) {
    let object = k8s_openapi::api::core::v1::ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..Default::default()
    };
    post_object_event(shared, node, object, reason, message).await;
}

/// A warning Event about `object` (in its namespace, `default` for a Node), from the
/// kubelet of `node`.
pub(crate) async fn post_object_event(
    shared: &crate::Shared,
    node: &str,
    object: k8s_openapi::api::core::v1::ObjectReference,
    reason: &str,
    message: &str,
) {
    use k8s_openapi::api::core::v1::{Event, EventSource};
    use kube::api::{ObjectMeta, PostParams};
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(shared.clock.now());
    let namespace = object.namespace.clone().unwrap_or_else(|| "default".into());
    let prefix = object.name.clone().unwrap_or_else(|| node.to_owned());
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{prefix}.")),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        involved_object: object,
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some("kubelet".into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    };
    let api: kube::Api<Event> = kube::Api::namespaced(shared.client.clone(), &namespace);
    if let Err(e) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(node, reason, error = %e, "event not recorded");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn store_with(images: &[(&str, u64)], now: Instant) -> ImageStore {
        let mut s = ImageStore::default();
        for (name, size) in images {
            s.images.insert(
                (*name).to_owned(),
                Record {
                    size: *size * MB,
                    first_detected: now,
                    last_used: now,
                },
            );
        }
        s
    }

    fn config(capacity_mb: u64) -> ImageGcConfig {
        ImageGcConfig {
            enabled: true,
            imagefs_capacity: capacity_mb * MB,
            ..ImageGcConfig::default()
        }
    }

    /// `freeSpace`: at or above the high threshold (85 %), unused images go, least recently
    /// used first, until usage is at the low threshold (80 %); below it nothing goes.
    #[tokio::test(start_paused = true)]
    async fn above_the_high_threshold_lru_images_are_freed_down_to_the_low_threshold() {
        let t0 = Instant::now();
        let mut s = store_with(&[("a", 300), ("b", 300), ("c", 300)], t0);
        tokio::time::advance(Duration::from_secs(600)).await;
        s.start_pod("p-a", vec!["a".into()], Instant::now());
        s.stop_pod("p-a", Instant::now()); // a: used most recently.
        tokio::time::advance(Duration::from_secs(1)).await;
        s.start_pod("p-c", vec!["c".into()], Instant::now());
        s.stop_pod("p-c", Instant::now());
        // 900 of 1000 MB = 90 % ≥ 85 %: free down to 800 MB, i.e. 100 MB: b (LRU) goes.
        let out = s.collect(&config(1000), Instant::now());
        assert_eq!(out.removed, ["b"]);
        assert_eq!(out.freed, 300 * MB);
        assert_eq!(out.failure, None);
        // 600 of 1000 MB: below the high threshold, nothing more.
        assert_eq!(
            s.collect(&config(1000), Instant::now()),
            GcOutcome::default()
        );
    }

    /// In-use images are never removed, nor images younger than `imageMinimumGCAge`; when
    /// that leaves too little to free, GC reports kubelet's FreeDiskSpaceFailed message.
    #[tokio::test(start_paused = true)]
    async fn in_use_and_young_images_are_kept_and_the_shortfall_is_reported() {
        let t0 = Instant::now();
        let mut s = store_with(&[("old-in-use", 500), ("old", 10)], t0);
        s.start_pod("p", vec!["old-in-use".into()], t0);
        tokio::time::advance(Duration::from_secs(600)).await;
        s.start_pod("q", vec!["young".into()], Instant::now());
        s.stop_pod("q", Instant::now());
        let young = image_size("young");
        let used = 510 * MB + young;
        let capacity = used * 100 / 90; // 90 % full.
        let cfg = ImageGcConfig {
            imagefs_capacity: capacity,
            ..config(0)
        };
        let out = s.collect(&cfg, Instant::now());
        assert_eq!(out.removed, ["old"], "in-use and young images stay");
        let amount = used - capacity * 80 / 100;
        assert_eq!(
            out.failure.as_deref(),
            Some(
                format!(
                    "Failed to garbage collect required amount of images. Attempted to free {amount} bytes, but only found {} bytes eligible to free.",
                    10 * MB
                )
                .as_str()
            )
        );
        assert!(s.has("old-in-use") && s.has("young"));
    }

    /// `imageMaximumGCAge`: unused images older than it go whatever the usage.
    #[tokio::test(start_paused = true)]
    async fn images_unused_longer_than_the_maximum_age_are_removed() {
        let t0 = Instant::now();
        let mut s = store_with(&[("stale", 10), ("kept", 10)], t0);
        s.start_pod("p", vec!["kept".into()], t0);
        tokio::time::advance(Duration::from_secs(3601)).await;
        let cfg = ImageGcConfig {
            maximum_gc_age: Duration::from_secs(3600),
            ..config(100_000)
        };
        assert_eq!(s.collect(&cfg, Instant::now()).removed, ["stale"]);
    }

    /// `nodeStatusMaxImages`: status.images lists the largest images first, at most 50.
    #[tokio::test(start_paused = true)]
    async fn status_images_are_the_largest_fifty() {
        let now = Instant::now();
        let mut s = ImageStore::default();
        let names: Vec<String> = (0..60)
            .map(|i| format!("registry.local/img-{i}:v1"))
            .collect();
        s.start_pod("p", names.clone(), now);
        let reported = s.status_images(NODE_STATUS_MAX_IMAGES);
        assert_eq!(reported.len(), 50);
        let sizes: Vec<i64> = reported.iter().map(|i| i.size_bytes.unwrap()).collect();
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "largest first");
        let smallest_kept = *sizes.last().unwrap() as u64;
        let left_out = names
            .iter()
            .filter(|n| !reported.iter().any(|r| r.names.as_ref().unwrap()[0] == **n));
        assert!(
            left_out
                .map(|n| image_size(n))
                .all(|sz| sz <= smallest_kept)
        );
    }
}
