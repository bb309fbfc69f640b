//! Keeping the Node authorizer's [graph](super::graph) current, as upstream's
//! `graph_populator.go` does from its pod informer; here from the committed writes the
//! generic store tells its observers of ([`crate::storage::observe`]), so a client that
//! wrote a pod is decided on that write at once.
//!
//! - Startup (and recovery): the graph is built from every pod in the store.
//! - Each successful pod write (create, update of any subresource, binding, delete, the
//!   delete that removes the last finalizer) calls [`NodeAuthorizer::changed`] with the
//!   object before and after and the write's revision. When the graph's view of the pod
//!   (node, mirror or not, references) did not change, as for every status update, nothing
//!   happens. Otherwise, under a lock striped by pod name, the pod's key is read back from
//!   the store and the graph set to what the store holds: the written object when the key
//!   is still at the write's revision (no decoding), nothing when it is gone, the decoded
//!   newer object otherwise. A write's graph update then never overtakes a later write's,
//!   since the last one to run sets what the store holds after both.
//! - A failed read marks the graph stale; the next node decision rebuilds it from the store,
//!   holding every stripe so no write's update interleaves. Until a rebuild succeeds,
//!   nodes reach nothing through the graph.

use std::{
    hash::{BuildHasher, RandomState},
    sync::atomic::{AtomicBool, Ordering},
};

use parking_lot::RwLock;

use super::{
    graph::{NodeGraph, PodEdges},
    node_identity,
};
use crate::{
    auth::authz::{Attributes, Decision},
    registry::resources::PODS,
    storage::{ObjectReader, observe::ObjectChange, status::ApiError},
};

/// How many locks the pod names are spread over.
const STRIPES: usize = 64;

/// The Node authorizer with its graph, fed by the API server (see the [module docs](self)).
#[derive(Debug)]
pub(crate) struct NodeAuthorizer {
    graph: RwLock<NodeGraph>,
    stripes: Box<[tokio::sync::Mutex<()>]>,
    hasher: RandomState,
    /// The graph misses writes: rebuild it before the next decision.
    stale: AtomicBool,
    rebuild: tokio::sync::Mutex<()>,
}

impl Default for NodeAuthorizer {
    fn default() -> Self {
        NodeAuthorizer {
            graph: RwLock::default(),
            stripes: (0..STRIPES).map(|_| tokio::sync::Mutex::new(())).collect(),
            hasher: RandomState::new(),
            stale: AtomicBool::new(true),
            rebuild: tokio::sync::Mutex::new(()),
        }
    }
}

impl NodeAuthorizer {
    /// Decides `attrs` (see [`super::authorize`]), rebuilding a stale graph first.
    pub(crate) async fn authorize(&self, reader: &ObjectReader, attrs: &Attributes) -> Decision {
        if node_identity(&attrs.user).is_none() {
            return Decision::NoOpinion(String::new());
        }
        if self.stale.load(Ordering::Acquire)
            && let Err(e) = self.refresh(reader).await
        {
            tracing::warn!(error = %e, "rebuilding the node authorizer graph failed");
            return super::authorize(&NodeGraph::new(), attrs);
        }
        super::authorize(&self.graph.read(), attrs)
    }

    /// Whether writes of `def` change the graph: pods only.
    pub(crate) fn observes(def: &crate::registry::ResourceDef) -> bool {
        def.group == PODS.group && def.plural == PODS.plural
    }

    /// Follows a committed write of a pod (see the [module docs](self)).
    pub(crate) async fn changed(&self, reader: &ObjectReader, change: &ObjectChange<'_>) {
        let ObjectChange {
            def,
            namespace: ns,
            name,
            old,
            new,
            revision,
        } = *change;
        if def.group != PODS.group || def.plural != PODS.plural {
            return;
        }
        let edges = new.and_then(PodEdges::of);
        if old.and_then(PodEdges::of) == edges {
            return;
        }
        let stripe = self.hasher.hash_one((ns, name)) as usize % STRIPES;
        let _stripe = self.stripes[stripe].lock().await;
        if self.stale.load(Ordering::Acquire) {
            // The rebuild to come reads this write.
            return;
        }
        let current = match reader.revision(&PODS, ns, name).await {
            Ok(None) => None,
            Ok(Some(stored)) if new.is_some() && stored == revision => edges,
            // Written again since: what the store holds now.
            Ok(Some(_)) => match reader.get(&PODS, ns, name).await {
                Ok(pod) => PodEdges::of(&pod),
                Err(e) if e.code == 404 => None,
                Err(e) => return self.lost(ns, name, &e.message),
            },
            Err(e) => return self.lost(ns, name, &e.to_string()),
        };
        self.graph
            .write()
            .set_pod(ns.unwrap_or(""), name, current.as_ref());
    }

    /// The graph may miss writes (one failed mid-way): rebuild it before the next decision.
    pub(crate) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Release);
    }

    /// A pod write the graph could not follow: rebuild it before the next decision.
    fn lost(&self, ns: Option<&str>, name: &str, error: &str) {
        tracing::warn!(
            namespace = ns.unwrap_or(""),
            pod = name,
            error,
            "reading a written pod back failed; the node authorizer graph will be rebuilt"
        );
        self.stale.store(true, Ordering::Release);
    }

    /// Builds the graph from the store if it is stale (at startup, after a failed read).
    pub(crate) async fn refresh(&self, reader: &ObjectReader) -> Result<(), ApiError> {
        let _single = self.rebuild.lock().await;
        if !self.stale.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut held = Vec::with_capacity(STRIPES);
        for stripe in self.stripes.iter() {
            held.push(stripe.lock().await);
        }
        // Writes acknowledged from here on are read by the list below, or update the
        // graph after it is swapped in (their stripe waits for `held`).
        self.stale.store(false, Ordering::Release);
        match reader.list(&PODS, None).await {
            Ok(pods) => {
                let mut graph = NodeGraph::new();
                for pod in &pods {
                    let meta = &pod["metadata"];
                    let (ns, name) = (
                        meta["namespace"].as_str().unwrap_or(""),
                        meta["name"].as_str().unwrap_or(""),
                    );
                    graph.set_pod(ns, name, PodEdges::of(pod).as_ref());
                }
                tracing::debug!(
                    pods = graph.pod_count(),
                    nodes = graph.node_count(),
                    paths = graph.path_count(),
                    "built the node authorizer graph"
                );
                *self.graph.write() = graph;
                Ok(())
            }
            Err(e) => {
                self.stale.store(true, Ordering::Release);
                Err(e)
            }
        }
    }
}
