//! What follows the committed writes: the RBAC index and the Node authorizer's graph, told
//! of every write [`super::Storage`] commits, whatever made it. The interface is an object
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
