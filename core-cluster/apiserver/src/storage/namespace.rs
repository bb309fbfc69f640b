//! The namespace controller's work, in-process (upstream's `NamespacedResourcesDeleter`):
//! a terminating namespace's contents are deleted, then its `kubernetes` finalizer removed.
//! It is started by a write observer ([`NamespaceFinalizer`]) when a namespace starts
//! terminating, as upstream's controller is by its watch, and at startup for namespaces
//! that were terminating. Its writes are the server's own ([`WriteContext::server`]) and go
//! through the same write path as a request's, observers included.

use std::{sync::Weak, time::Duration};

use futures::future::BoxFuture;
use serde_json::json;

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
}

impl WriteObserver for NamespaceFinalizer {
    fn observes(&self, def: &ResourceDef) -> bool {
        def.group.is_empty() && def.plural == "namespaces"
    }

    fn changed<'a>(&'a self, change: &'a ObjectChange<'a>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let terminating = |obj: Option<&serde_json::Value>| {
                obj.is_some_and(|o| !o["metadata"]["deletionTimestamp"].is_null())
            };
            if !terminating(change.old)
                && terminating(change.new)
                && let Some(storage) = self.storage.upgrade()
            {
                spawn_namespace_cleanup(&storage, change.name.to_owned());
            }
        })
    }

    fn lost<'a>(&'a self, _def: &'a ResourceDef) -> BoxFuture<'a, ()> {
        // A namespace whose deletion was lost is picked up at the next start.
        Box::pin(async {})
    }
}

/// The namespace controller's work, in-process: delete everything in a terminating
/// namespace, then the namespace itself.
pub(crate) fn spawn_namespace_cleanup(state: &Storage, namespace: String) {
    let Some(server) = state.self_ref.upgrade() else {
        return;
    };
    tokio::spawn(async move {
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
                        let options = DeleteOptions {
                            grace_period_seconds: Some(0),
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
            let mut finalized = current.clone();
            finalized["spec"]["finalizers"] = json!([]);
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
