//! The authorizer chain, as kube-apiserver's `--authorization-mode=Node,RBAC`:
//! `system:masters`, then the [Node authorizer](super::node), then [RBAC](super::rbac)
//! (upstream's union authorizer). It observes the generic store's committed writes, which
//! keep the RBAC index and the Node authorizer's graph current.

use futures::future::BoxFuture;

use super::{
    GROUP_MASTERS,
    authz::{Attributes, Decision},
    node,
    rbac::RbacAuthorizer,
};
use crate::{
    registry::ResourceDef,
    storage::{
        ObjectReader,
        observe::{ObjectChange, WriteObserver},
        status::ApiError,
    },
};

/// The authorizer chain: `system:masters` is allowed everything, then the Node authorizer,
/// then RBAC; upstream's union authorizer joins the reasons of the ones with no opinion.
/// It observes the committed writes of the generic store, which keep the RBAC index and
/// the Node authorizer's graph current.
#[derive(Debug)]
pub struct Authorizer {
    /// The RBAC authorizer and its index.
    pub(crate) rbac: RbacAuthorizer,
    /// The Node authorizer and its graph.
    pub(crate) node: node::NodeAuthorizer,
    /// Reads what the index and graph are built from.
    reader: ObjectReader,
}

impl Authorizer {
    /// An authorizer whose index and graph are read through `reader` (empty until loaded).
    pub(crate) fn new(reader: ObjectReader) -> Self {
        Authorizer {
            rbac: RbacAuthorizer::default(),
            node: node::NodeAuthorizer::default(),
            reader,
        }
    }

    /// Builds the RBAC index and the Node authorizer's graph from the store.
    pub(crate) async fn load(&self) -> Result<(), ApiError> {
        self.rbac
            .load(&self.reader)
            .await
            .map_err(|e| ApiError::internal(format!("loading RBAC: {e}")))?;
        self.node.refresh(&self.reader).await
    }

    /// Decides `attrs`; the reason of a denial (possibly empty) goes after the 403 message.
    pub(crate) async fn authorize(&self, attrs: &Attributes) -> Decision {
        if attrs.user.in_group(GROUP_MASTERS) {
            return Decision::Allow;
        }
        let mut reasons = Vec::new();
        match self.node.authorize(&self.reader, attrs).await {
            Decision::NoOpinion(reason) => {
                if !reason.is_empty() {
                    reasons.push(reason);
                }
            }
            decided => return decided,
        }
        if self.rbac.allows(attrs) {
            return Decision::Allow;
        }
        Decision::NoOpinion(reasons.join(", "))
    }
}

impl WriteObserver for Authorizer {
    fn observes(&self, def: &ResourceDef) -> bool {
        RbacAuthorizer::observes(def) || node::NodeAuthorizer::observes(def)
    }

    fn changed<'a>(&'a self, change: &'a ObjectChange<'a>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if RbacAuthorizer::observes(change.def) {
                self.rbac.changed(&self.reader, change).await;
            }
            if node::NodeAuthorizer::observes(change.def) {
                self.node.changed(&self.reader, change).await;
            }
        })
    }

    fn lost<'a>(&'a self, def: &'a ResourceDef) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if RbacAuthorizer::observes(def) {
                self.rbac.lost(&self.reader).await;
            }
            if node::NodeAuthorizer::observes(def) {
                self.node.mark_stale();
            }
        })
    }
}
