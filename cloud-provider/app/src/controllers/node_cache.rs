//! One watch-based Node cache shared by every controller (upstream's shared informer factory).
//!
//! A single `watch` on Nodes fills a map of *trimmed* Nodes (only what the controllers read:
//! metadata without `managedFields`, the spec, the addresses and the `Ready` and
//! `NetworkUnavailable` conditions; no images, volumes, node info or capacity). Controllers
//! read it with [`NodeCache::get`] / [`NodeCache::list`] instead of listing Nodes from the API
//! server, and [`NodeCache::subscribe`] hands each one its own stream of [`NodeEvent`]s.
//!
//! A relist after a watch gap (an expired resource version, a cut connection) is reconciled:
//! Nodes that disappeared during the gap are reported as [`NodeEvent::Deleted`], as an
//! informer's `Replace` does.
//!
//! The watch starts on the first `subscribe`, `list`, `get` or `wait_synced` and stops when
//! the cache's shutdown token is cancelled.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// The Node conditions any controller reads; the others are dropped from the cache.
const KEPT_CONDITIONS: [&str; 3] = ["Ready", "NetworkUnavailable", "MaintenancePlanned"];

/// A change seen by the shared Node watch.
#[derive(Debug, Clone)]
pub enum NodeEvent {
    /// A Node was added (`old` is `None`) or changed.
    Applied {
        /// The Node as cached before this change.
        old: Option<Arc<Node>>,
        /// The Node now.
        new: Arc<Node>,
    },
    /// A Node was deleted (seen directly, or missing from a relist).
    Deleted(Arc<Node>),
    /// The initial list (or a relist) is complete: the cache holds every Node.
    Synced,
}

/// A subscriber's stream of [`NodeEvent`]s. A new subscriber first receives every cached Node
/// as `Applied { old: None }` and, if the cache is synced, `Synced`.
pub type NodeEvents = mpsc::UnboundedReceiver<NodeEvent>;

/// The shared Node cache. Cloning is cheap: clones share one watch and one map.
#[derive(Clone)]
pub struct NodeCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.state.lock();
        f.debug_struct("NodeCache")
            .field("nodes", &state.nodes.len())
            .field("synced", &state.synced)
            .finish_non_exhaustive()
    }
}

struct Inner {
    client: kube::Client,
    shutdown: CancellationToken,
    started: AtomicBool,
    state: Mutex<State>,
    synced: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    nodes: HashMap<String, Arc<Node>>,
    /// Bumped on every change of `nodes`.
    generation: u64,
    synced: bool,
    /// The names seen during the list in progress, to find Nodes deleted during a gap.
    relisting: Option<HashSet<String>>,
    subscribers: Vec<mpsc::UnboundedSender<NodeEvent>>,
}

impl State {
    fn send(&mut self, event: NodeEvent) {
        self.subscribers
            .retain(|subscriber| subscriber.send(event.clone()).is_ok());
    }

    fn apply(&mut self, node: Node) {
        let node = trim(node);
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        if let Some(seen) = self.relisting.as_mut() {
            seen.insert(name.clone());
        }
        let new = Arc::new(node);
        let old = self.nodes.insert(name, new.clone());
        if old.as_deref() == Some(&*new) {
            return;
        }
        self.generation += 1;
        self.send(NodeEvent::Applied { old, new });
    }

    fn delete(&mut self, node: &Node) {
        let Some(name) = node.metadata.name.as_deref() else {
            return;
        };
        if let Some(old) = self.nodes.remove(name) {
            self.generation += 1;
            self.send(NodeEvent::Deleted(old));
        }
    }

    fn list_done(&mut self) {
        if let Some(seen) = self.relisting.take() {
            let gone: Vec<String> = self
                .nodes
                .keys()
                .filter(|name| !seen.contains(*name))
                .cloned()
                .collect();
            for name in gone {
                if let Some(old) = self.nodes.remove(&name) {
                    self.generation += 1;
                    self.send(NodeEvent::Deleted(old));
                }
            }
        }
        self.synced = true;
        self.send(NodeEvent::Synced);
    }
}

impl NodeCache {
    /// A cache of the Nodes `client` sees; its watch stops when `shutdown` is cancelled.
    pub fn new(client: kube::Client, shutdown: CancellationToken) -> Self {
        NodeCache {
            inner: Arc::new(Inner {
                client,
                shutdown,
                started: AtomicBool::new(false),
                state: Mutex::default(),
                synced: watch::Sender::new(false),
            }),
        }
    }

    /// A new stream of changes, starting with the cached Nodes (see [`NodeEvents`]).
    pub fn subscribe(&self) -> NodeEvents {
        self.start();
        let (tx, rx) = mpsc::unbounded_channel();
        let mut state = self.inner.state.lock();
        for node in state.nodes.values() {
            let _ = tx.send(NodeEvent::Applied {
                old: None,
                new: node.clone(),
            });
        }
        if state.synced {
            let _ = tx.send(NodeEvent::Synced);
        }
        state.subscribers.push(tx);
        rx
    }

    /// The cached Node called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.start();
        self.inner.state.lock().nodes.get(name).cloned()
    }

    /// Every cached Node, in no particular order.
    pub fn list(&self) -> Vec<Arc<Node>> {
        self.start();
        self.inner.state.lock().nodes.values().cloned().collect()
    }

    /// A number that changes whenever a cached Node does: a reader's derived data is stale
    /// once it differs.
    pub fn generation(&self) -> u64 {
        self.inner.state.lock().generation
    }

    /// Whether the initial list has completed.
    pub fn is_synced(&self) -> bool {
        self.inner.state.lock().synced
    }

    /// Waits until the initial list has completed (or forever once shut down before that).
    pub async fn wait_synced(&self) {
        self.start();
        let mut synced = self.inner.synced.subscribe();
        let _ = synced.wait_for(|synced| *synced).await;
    }

    fn start(&self) {
        if self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let shutdown = inner.shutdown.clone();
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = drive(&inner) => {}
            }
        });
    }
}

async fn drive(inner: &Inner) {
    let api: Api<Node> = Api::all(inner.client.clone());
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                warn!(%error, "node watch failed");
                continue;
            }
        };
        let synced = {
            let mut state = inner.state.lock();
            match event {
                watcher::Event::Init => {
                    state.relisting = Some(HashSet::new());
                    false
                }
                watcher::Event::InitApply(node) | watcher::Event::Apply(node) => {
                    state.apply(node);
                    false
                }
                watcher::Event::Delete(node) => {
                    state.delete(&node);
                    false
                }
                watcher::Event::InitDone => {
                    state.list_done();
                    true
                }
            }
        };
        if synced {
            inner.synced.send_replace(true);
        }
    }
}

/// The Node with only what the controllers read: no `managedFields`; of the status only the
/// addresses and the [`KEPT_CONDITIONS`]. Metadata and spec stay whole, so a PUT of a cached
/// Node (which ignores status) loses nothing.
///
/// The lists kept hold no spare capacity. Decoding grows a list by doubling, and keeping 3 of
/// 5 conditions reuses the 8-condition buffer, so a cached Node carried about 1 KB of unused
/// list space: over 10 MB at 10,000 Nodes with the older versions still held.
pub(super) fn trim(mut node: Node) -> Node {
    fn fit<T>(list: &mut Option<Vec<T>>) {
        if let Some(list) = list {
            list.shrink_to_fit();
        }
    }
    node.metadata.managed_fields = None;
    fit(&mut node.metadata.finalizers);
    fit(&mut node.metadata.owner_references);
    if let Some(spec) = node.spec.as_mut() {
        fit(&mut spec.pod_cidrs);
        fit(&mut spec.taints);
    }
    if let Some(status) = node.status.take() {
        let mut addresses = status.addresses;
        fit(&mut addresses);
        node.status = Some(NodeStatus {
            addresses,
            conditions: status.conditions.map(|conditions| {
                let mut kept: Vec<_> = conditions
                    .into_iter()
                    .filter(|c| KEPT_CONDITIONS.contains(&c.type_.as_str()))
                    .collect();
                kept.shrink_to_fit();
                kept
            }),
            ..Default::default()
        });
    }
    node
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "managedFields": [{ "manager": "kubelet" }] },
            "spec": { "providerID": "fake://1" },
            "status": {
                "addresses": [{ "type": "InternalIP", "address": "10.0.0.1" }],
                "conditions": [
                    { "type": "Ready", "status": "True" },
                    { "type": "MemoryPressure", "status": "False" },
                ],
                "images": [{ "names": ["nginx"], "sizeBytes": 1 }],
                "capacity": { "cpu": "2" },
            },
        }))
        .unwrap()
    }

    #[test]
    fn trim_keeps_what_controllers_read() {
        let trimmed = trim(node("a"));
        assert!(trimmed.metadata.managed_fields.is_none());
        assert_eq!(
            trimmed.spec.unwrap().provider_id.as_deref(),
            Some("fake://1")
        );
        let status = trimmed.status.unwrap();
        assert_eq!(status.addresses.unwrap().len(), 1);
        let conditions: Vec<String> = status
            .conditions
            .unwrap()
            .into_iter()
            .map(|c| c.type_)
            .collect();
        assert_eq!(conditions, ["Ready"]);
        assert!(status.images.is_none() && status.capacity.is_none());
    }

    /// A Node decoded from JSON, as the watch decodes it, is cached without the spare list
    /// capacity decoding leaves (lists grow by doubling; filtering keeps the buffer).
    #[test]
    fn trimmed_lists_hold_no_spare_capacity() {
        let conditions: Vec<_> = ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure"]
            .iter()
            .map(|t| serde_json::json!({ "type": t, "status": "False" }))
            .collect();
        let json = serde_json::json!({
            "metadata": { "name": "a", "finalizers": ["f"] },
            "spec": {
                "podCIDRs": ["10.0.0.0/24"],
                "taints": [{ "key": "k", "effect": "NoSchedule" }],
            },
            "status": {
                "addresses": [
                    { "type": "InternalIP", "address": "10.0.0.1" },
                    { "type": "Hostname", "address": "a" },
                    { "type": "ExternalIP", "address": "192.0.2.1" },
                ],
                "conditions": conditions,
            },
        });
        let decoded: Node = serde_json::from_slice(&serde_json::to_vec(&json).unwrap()).unwrap();
        let spare = |len: usize, capacity: usize| capacity - len;
        let untrimmed = decoded.status.as_ref().unwrap().addresses.as_ref().unwrap();
        assert!(
            spare(untrimmed.len(), untrimmed.capacity()) > 0,
            "decoding leaves spare capacity (else this test shows nothing)"
        );
        let node = trim(decoded);
        let status = node.status.as_ref().unwrap();
        let addresses = status.addresses.as_ref().unwrap();
        let kept = status.conditions.as_ref().unwrap();
        let spec = node.spec.as_ref().unwrap();
        let (cidrs, taints) = (
            spec.pod_cidrs.as_ref().unwrap(),
            spec.taints.as_ref().unwrap(),
        );
        let finalizers = node.metadata.finalizers.as_ref().unwrap();
        assert_eq!((addresses.len(), kept.len()), (3, 1));
        assert_eq!(spare(addresses.len(), addresses.capacity()), 0);
        assert_eq!(spare(kept.len(), kept.capacity()), 0);
        assert_eq!(spare(cidrs.len(), cidrs.capacity()), 0);
        assert_eq!(spare(taints.len(), taints.capacity()), 0);
        assert_eq!(spare(finalizers.len(), finalizers.capacity()), 0);
    }

    /// An informer's `Replace`: a Node missing from a relist is reported deleted.
    #[test]
    fn relist_reports_nodes_deleted_during_a_gap() {
        let mut state = State::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        state.subscribers.push(tx);
        state.relisting = Some(HashSet::new());
        state.apply(node("a"));
        state.apply(node("b"));
        state.list_done();
        state.relisting = Some(HashSet::new());
        state.apply(node("a"));
        state.list_done();
        let mut events = Vec::new();
        while let Ok(event) = rx.try_recv() {
            events.push(match event {
                NodeEvent::Applied { old, new } => {
                    format!(
                        "apply {} {}",
                        new.metadata.name.as_deref().unwrap(),
                        old.is_some()
                    )
                }
                NodeEvent::Deleted(node) => {
                    format!("delete {}", node.metadata.name.as_deref().unwrap())
                }
                NodeEvent::Synced => "synced".to_owned(),
            });
        }
        // The unchanged "a" of the relist is no event; "b" is gone.
        assert_eq!(
            events,
            [
                "apply a false",
                "apply b false",
                "synced",
                "delete b",
                "synced"
            ]
        );
        assert_eq!(state.nodes.len(), 1);
    }
}
