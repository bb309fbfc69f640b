//! The namespace controller's work, in-process (upstream's `NamespacedResourcesDeleter`):
//! a terminating namespace's contents are deleted, then its `kubernetes` finalizer removed.
//! Its writes are the server's own ([`WriteContext::server`]) and go through the same write
//! path as a request's, observers included.

use std::time::Duration;

use serde_json::json;

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, WriteContext,
    delete::{DeleteOptions, delete_object},
    get_list::{get_object, list_all},
    update::commit_update,
};
use crate::registry::meta::str_at;

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
