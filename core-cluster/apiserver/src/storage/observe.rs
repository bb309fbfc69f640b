//! What follows the committed writes: the RBAC index, the Node authorizer's graph, the
//! custom resource definitions' controller and the namespace finalizer, told of every write
//! [`super::Storage`] commits, whatever made it. The interface is an object
//! change (its resource, old and new object, revision), as a watch of the store would give
//! it, so a store that is written by others (etcd) can feed the same observers from a watch.

use futures::future::BoxFuture;
use serde_json::Value;

use crate::registry::ResourceDef;

/// One committed change of a stored object.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObjectChange<'a> {
    /// The resource (its kind and key).
    pub(crate) def: &'static ResourceDef,
    /// The namespace, none at the cluster scope.
    pub(crate) namespace: Option<&'a str>,
    /// The object's name.
    pub(crate) name: &'a str,
    /// The object before the change; none for a create.
    pub(crate) old: Option<&'a Value>,
    /// The object after the change; none for a delete.
    pub(crate) new: Option<&'a Value>,
    /// The store's revision of the change.
    pub(crate) revision: u64,
}

/// Follows committed writes (see the [module docs](self)).
pub(crate) trait WriteObserver: Send + Sync {
    /// Whether it follows the objects of `def` (others are never told).
    fn observes(&self, def: &ResourceDef) -> bool;

    /// `change` was committed. Changes of one object may be told out of order when writes
    /// race: an observer that keeps state reads the store back for the last word.
    fn changed<'a>(&'a self, change: &'a ObjectChange<'a>) -> BoxFuture<'a, ()>;

    /// A write of `def` may or may not have been committed (the store failed mid-way), or
    /// a watch missed changes: what the observer holds of `def` must be read again.
    fn lost<'a>(&'a self, def: &'a ResourceDef) -> BoxFuture<'a, ()>;
}

/// Tells `observers` of every committed write read from a watch of `store` of the
/// resources they follow (each resource's storage watched once), so that what other API
/// servers sharing the store write (etcd) reaches them as this server's own writes do
/// (kube-apiserver's informers on its watch cache). This server's writes are told a second
/// time; observers read the store back, so that is harmless. Whenever a watch (re)starts,
/// the observers are told they may have missed writes ([`WriteObserver::lost`]) and read
/// their resource again. Runs until `shutdown`.
pub(crate) async fn follow_store(
    store: std::sync::Arc<dyn crate::store::Store>,
    observers: Vec<std::sync::Arc<dyn WriteObserver>>,
    defs: &[&'static ResourceDef],
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut followers = tokio::task::JoinSet::new();
    let mut watched: Vec<&'static ResourceDef> = Vec::new();
    for &def in defs {
        if watched.iter().any(|d| d.storage == def.storage) {
            continue;
        }
        let told: Vec<_> = observers
            .iter()
            .filter(|o| o.observes(def))
            .cloned()
            .collect();
        if told.is_empty() {
            continue;
        }
        watched.push(def);
        followers.spawn(follow_resource(
            store.clone(),
            Fanout(told),
            def,
            shutdown.clone(),
        ));
    }
    while followers.join_next().await.is_some() {}
}

/// The observers of one resource, told in turn.
struct Fanout(Vec<std::sync::Arc<dyn WriteObserver>>);

impl Fanout {
    async fn changed(&self, change: &ObjectChange<'_>) {
        for observer in &self.0 {
            observer.changed(change).await;
        }
    }

    async fn lost(&self, def: &ResourceDef) {
        for observer in &self.0 {
            observer.lost(def).await;
        }
    }
}

/// The namespace and name of the object stored at `key` under `def`.
fn object_of<'k>(def: &ResourceDef, key: &'k str) -> Option<(Option<&'k str>, &'k str)> {
    let rest = key.strip_prefix(def.key_prefix(None).as_str())?;
    if def.namespaced {
        let (ns, name) = rest.split_once('/')?;
        Some((Some(ns), name))
    } else {
        Some((None, rest))
    }
}

async fn follow_resource(
    store: std::sync::Arc<dyn crate::store::Store>,
    observer: Fanout,
    def: &'static ResourceDef,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use futures::StreamExt;
    let prefix = def.key_prefix(None);
    let pause = std::time::Duration::from_secs(1);
    loop {
        let watch = match store.current_revision().await {
            Ok(from) => store.watch(&prefix, from).await,
            Err(e) => Err(e),
        };
        match watch {
            Ok(mut watch) => {
                // What was written before the watch began is read again.
                observer.lost(def).await;
                loop {
                    let event = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        event = watch.next() => event,
                    };
                    let event = match event {
                        Some(Ok(event)) => event,
                        Some(Err(e)) => {
                            tracing::debug!(resource = def.plural, error = %e, "the store watch ended: watching again");
                            break;
                        }
                        None => break,
                    };
                    let Some((namespace, name)) = object_of(def, &event.key) else {
                        continue;
                    };
                    let new = event
                        .value
                        .as_ref()
                        .map(|v| super::decode(def, v, event.revision))
                        .transpose();
                    let old = event
                        .prev_value
                        .as_ref()
                        .map(|kv| super::decode_kv(def, kv))
                        .transpose();
                    let (Ok(new), Ok(old)) = (new, old) else {
                        observer.lost(def).await;
                        continue;
                    };
                    observer
                        .changed(&ObjectChange {
                            def,
                            namespace,
                            name,
                            old: old.as_ref(),
                            new: new.as_ref(),
                            revision: event.revision,
                        })
                        .await;
                }
            }
            Err(e) => {
                tracing::warn!(resource = def.plural, error = %e, "watching the store failed: retrying");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
