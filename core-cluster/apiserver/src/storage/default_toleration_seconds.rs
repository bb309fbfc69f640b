//! The DefaultTolerationSeconds admission plugin
//! (`plugin/pkg/admission/defaulttolerationseconds/admission.go`): on a create or update
//! of a pod (not of its subresources), a pod that does not tolerate the NoExecute taints
//! `node.kubernetes.io/not-ready` and `node.kubernetes.io/unreachable` gets `Exists`
//! tolerations of them for `--default-not-ready-toleration-seconds` and
//! `--default-unreachable-toleration-seconds` (300 each), so the taint eviction controller
//! evicts its pods that long after a node stops being ready or reachable.

use futures::future::BoxFuture;
use serde_json::Value;

use super::{
    admission::{Admission, AdmissionAttributes, Operation},
    status::ApiError,
};
use crate::registry::{ResourceDef, add_default_tolerations};

/// kube-apiserver's default for both flags.
pub(crate) const DEFAULT_TOLERATION_SECONDS: i64 = 300;

/// The plugin, with its two flags' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DefaultTolerationSeconds {
    not_ready_seconds: i64,
    unreachable_seconds: i64,
}

impl DefaultTolerationSeconds {
    /// The plugin adding tolerations of these seconds.
    pub(crate) fn new(not_ready_seconds: i64, unreachable_seconds: i64) -> Self {
        Self {
            not_ready_seconds,
            unreachable_seconds,
        }
    }
}

impl Admission for DefaultTolerationSeconds {
    fn name(&self) -> &'static str {
        "DefaultTolerationSeconds"
    }

    fn admit<'a>(
        &'a self,
        _attrs: &'a AdmissionAttributes<'a>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async { Ok(()) })
    }

    fn mutate<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
        object: &'a mut Value,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        if matches!(attrs.operation, Operation::Create | Operation::Update)
            && is_pod(attrs.resource)
            && attrs.subresource.is_none()
            && object["spec"].is_object()
        {
            add_default_tolerations(
                &mut object["spec"],
                self.not_ready_seconds,
                self.unreachable_seconds,
            );
        }
        Box::pin(async { Ok(()) })
    }
}

fn is_pod(resource: &ResourceDef) -> bool {
    resource.group.is_empty() && resource.plural == "pods"
}
