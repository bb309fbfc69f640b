//! The namespace controller's work, in-process (upstream's `NamespacedResourcesDeleter`):
//! a terminating namespace's contents are deleted, then its `kubernetes` finalizer removed.
//! It is started by a write observer ([`NamespaceFinalizer`]) when a namespace starts
//! terminating, as upstream's controller is by its watch, and at startup for namespaces
//! that were terminating. Its writes are the server's own ([`WriteContext::server`]) and go
//! through the same write path as a request's, observers included.
//!
//! Upstream runs the namespace controller once per cluster (in the kube-controller-manager
//! holding its Lease). Here the server that commits a namespace's deletion cleans it up at
//! once; API servers sharing the store (etcd) follow that write and take the cleanup over
//! only if the namespace is still terminating a while later (the server that took the
//! deletion stopped, as a new kube-controller-manager leader picks up a terminating
//! namespace once the old one's 15 s Lease lapses). One process runs one cleanup of a
//! namespace at a time. Should two servers both work on one (a slow cleanup outlasting the
//! takeover delay), the work is idempotent: an object already deleted is not found, and the
//! final write is compared on the namespace's revision.

use std::{
    sync::{Arc, Weak},
    time::Duration,
};

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, WriteContext,
    delete::{DeleteOptions, delete_object},
    get_list::{get_object, list_all},
    observe::{ObjectChange, WriteObserver},
    update::commit_update,
};
use crate::registry::{ResourceDef, meta::str_at};

/// Starts the cleanup of each namespace whose deletion was just committed.
pub(crate) struct NamespaceFinalizer {
    /// The storage the cleanup writes through (weak: the storage holds its observers).
    pub(crate) storage: Weak<Storage>,
    /// None for this server's own writes: the cleanup starts at once. For the writes of
    /// other servers sharing the store: how long a namespace must stay terminating before
    /// this server takes its cleanup over.
    pub(crate) takeover_after: Option<Duration>,
}

fn terminating(obj: Option<&serde_json::Value>) -> bool {
    obj.is_some_and(|o| !o["metadata"]["deletionTimestamp"].is_null())
}

impl WriteObserver for NamespaceFinalizer {
    fn observes(&self, def: &ResourceDef) -> bool {
        def.group.is_empty() && def.plural == "namespaces"
    }

    fn changed<'a>(&'a self, change: &'a ObjectChange<'a>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if !terminating(change.old)
                && terminating(change.new)
                && let Some(storage) = self.storage.upgrade()
            {
                match self.takeover_after {
                    None => spawn_namespace_cleanup(&storage, change.name.to_owned()),
                    Some(after) => spawn_takeover(storage, vec![change.name.to_owned()], after),
                }
            }
        })
    }

    fn lost<'a>(&'a self, _def: &'a ResourceDef) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // This server's own: a namespace whose deletion was lost is picked up at the
            // next start. Another server's: the namespaces terminating now are taken over
            // if they still are after the delay.
            let (Some(after), Some(storage)) = (self.takeover_after, self.storage.upgrade()) else {
                return;
            };
            let Some(def) = storage.registry.find("", "v1", "namespaces") else {
                return;
            };
            let Ok(namespaces) = list_all(&*storage.store, def, None).await else {
                return;
            };
            let names = namespaces
                .iter()
                .filter(|ns| terminating(Some(ns)))
                .filter_map(|ns| str_at(ns, &["metadata", "name"]).map(str::to_owned))
                .collect::<Vec<_>>();
            if !names.is_empty() {
                spawn_takeover(storage, names, after);
            }
        })
    }
}

/// After `after`, cleans up each of `namespaces` still terminating and not being cleaned
/// up in this process.
fn spawn_takeover(storage: Arc<Storage>, namespaces: Vec<String>, after: Duration) {
    let storage = Arc::downgrade(&storage);
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let Some(storage) = storage.upgrade() else {
            return;
        };
        let Some(def) = storage.registry.find("", "v1", "namespaces") else {
            return;
        };
        for namespace in namespaces {
            if storage.finalizing.lock().contains(&namespace) {
                continue;
            }
            if let Ok((_, ns)) = get_object(&*storage.store, def, None, &namespace).await
                && terminating(Some(&ns))
            {
                tracing::info!(
                    namespace,
                    "taking over the cleanup of a namespace another server started deleting"
                );
                spawn_namespace_cleanup(&storage, namespace);
            }
        }
    });
}

/// Removes its namespace from the ones being cleaned up when the cleanup ends.
struct Finalizing {
    storage: Arc<Storage>,
    namespace: String,
}

impl Drop for Finalizing {
    fn drop(&mut self) {
        self.storage.finalizing.lock().remove(&self.namespace);
    }
}

/// The namespace controller's work, in-process: delete everything in a terminating
/// namespace, then the namespace itself.
/// One cleanup of a namespace runs in a process at a time: another start is ignored.
pub(crate) fn spawn_namespace_cleanup(state: &Storage, namespace: String) {
    let Some(server) = state.self_ref.upgrade() else {
        return;
    };
    if !server.finalizing.lock().insert(namespace.clone()) {
        return;
    }
    let running = Finalizing {
        storage: server.clone(),
        namespace: namespace.clone(),
    };
    tokio::spawn(async move {
        let _running = running;
        let state = server;
        let ctx = WriteContext::server();
        loop {
            let mut remaining = 0usize;
            let mut seen = Vec::new();
            for def in state.registry.all() {
                if !def.namespaced || seen.contains(&def.storage) {
                    continue;
                }
                seen.push(def.storage);
                let Ok(items) = list_all(&*state.store, def, Some(&namespace)).await else {
                    continue;
                };
                for item in items {
                    remaining += 1;
                    if item["metadata"]["deletionTimestamp"].is_null() {
                        let name = str_at(&item, &["metadata", "name"])
                            .unwrap_or("")
                            .to_owned();
                        // As upstream's namespaced-resources deleter: in the background,
                        // each object with its own grace period, so a pod on a node is
                        // terminated by its kubelet (preStop, SIGTERM) before it goes.
                        let options = DeleteOptions {
                            propagation_policy: Some("Background".into()),
                            ..DeleteOptions::default()
                        };
                        let key = ObjectKey::new(def, Some(&namespace), &name);
                        let _ = delete_object(&state, &ctx, key, options).await;
                    }
                }
            }
            if remaining == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let namespaces = state
            .registry
            .find("", "v1", "namespaces")
            .expect("namespaces are served");
        for _ in 0..MAX_WRITE_ATTEMPTS {
            let Ok((kv, current)) = get_object(&*state.store, namespaces, None, &namespace).await
            else {
                return;
            };
            // Only this server's own finalizer goes (`kubernetes`); others' stay theirs.
            let mut finalized = current.clone();
            let kept: Vec<Value> = current["spec"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f.as_str() != Some("kubernetes"))
                .cloned()
                .collect();
            finalized["spec"]["finalizers"] = json!(kept);
            let key = ObjectKey::new(namespaces, None, &namespace);
            match commit_update(
                &state,
                &ctx,
                key,
                Some("finalize"),
                &kv,
                &current,
                finalized,
            )
            .await
            {
                Err(e) if e.reason == "Conflict" => continue,
                _ => return,
            }
        }
    });
}
