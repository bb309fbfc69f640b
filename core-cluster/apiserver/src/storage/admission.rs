//! Admission (upstream's `k8s.io/apiserver/pkg/admission`): the checks a write passes after
//! validation and before it is stored, each given the write's [`AdmissionAttributes`]. The
//! plugins (NodeRestriction, RBAC's escalation check) live in [`crate::auth`] and are wired
//! where the server is built; [`super::Storage`] runs them on every create, update and
//! delete, and the handlers of subresources that are not stored (a service account's
//! `token`) run them too. A plugin may also change what is written
//! ([`Admission::mutate`], upstream's mutating admission, as the ServiceAccount plugin in
//! [`super::service_account`] does), before the object is validated.

use futures::future::BoxFuture;
use serde_json::Value;

use super::{status::ApiError, user::UserInfo};
use crate::registry::ResourceDef;

/// What a write does (upstream's `admission.Operation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// A create, of an object or of a subresource (a TokenRequest, an eviction).
    Create,
    /// An update (PUT, PATCH) of an object or a subresource (`status`, `binding`).
    Update,
    /// A delete.
    Delete,
    /// A connect to a subresource (`exec`, `attach`, `proxy`).
    #[allow(dead_code)]
    Connect,
}

/// The write being admitted (upstream's `admission.Attributes`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdmissionAttributes<'a> {
    /// Who writes.
    pub(crate) user: &'a UserInfo,
    /// What the write does.
    pub(crate) operation: Operation,
    /// The resource written.
    pub(crate) resource: &'static ResourceDef,
    /// The subresource (`status`, `token`), if any.
    pub(crate) subresource: Option<&'a str>,
    /// The namespace (none at the cluster scope).
    pub(crate) namespace: Option<&'a str>,
    /// The object's name.
    pub(crate) name: &'a str,
    /// The object as it will be stored (create, update), or the subresource's body.
    pub(crate) object: Option<&'a Value>,
    /// The stored object (update, delete).
    pub(crate) old_object: Option<&'a Value>,
}

/// One admission plugin (upstream's `admission.ValidationInterface`): `Err` refuses the
/// write with that answer.
pub(crate) trait Admission: Send + Sync {
    /// The plugin's name, as upstream's `--enable-admission-plugins` names it.
    fn name(&self) -> &'static str;

    /// Admits or refuses the write `attrs`.
    fn admit<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
    ) -> BoxFuture<'a, Result<(), ApiError>>;

    /// Mutating admission (upstream's `admission.MutationInterface`): may change `object`,
    /// the object of a create or update, before the resource's validation and [`admit`]
    /// see it; `Err` refuses the write. `attrs.object` is `None` here (the object is
    /// `object`). The default changes nothing.
    ///
    /// [`admit`]: Admission::admit
    fn mutate<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
        object: &'a mut Value,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        let _ = (attrs, object);
        Box::pin(async { Ok(()) })
    }
}
