//! Who is asking: the authenticated identity of a request, as kube-apiserver's `user.Info`.
//!
//! Authentication (TLS client certificates, service-account tokens) puts a [`UserInfo`] into
//! each request's extensions; authorization and admission read it. A request that reaches the
//! router with no [`UserInfo`] came through the in-process transport
//! ([`ApiServer::router`](crate::ApiServer::router)) and is the privileged loopback client
//! ([`UserInfo::loopback`]), as kube-apiserver's own loopback client is. Over the network
//! every request carries the identity the authenticator gave it, `system:anonymous` included.

pub mod authz;
pub mod bootstrap;
pub(crate) mod certificates;
pub mod chain;
pub(crate) mod escalation;
pub mod impersonation;
pub mod node;
pub mod rbac;
pub mod review;

pub mod authn;
pub mod pki;
pub mod token;

pub use crate::storage::user::{
    GROUP_AUTHENTICATED, GROUP_MASTERS, GROUP_NODES, GROUP_UNAUTHENTICATED, NODE_USER_PREFIX,
    USER_ANONYMOUS, UserInfo,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_identity_needs_the_group() {
        let node = UserInfo::new("system:node:n1", [GROUP_NODES]);
        assert_eq!(node.node_name(), Some("n1"));
        let impostor = UserInfo::new("system:node:n1", ["dev"]);
        assert_eq!(impostor.node_name(), None);
        assert!(!UserInfo::anonymous().in_group(GROUP_AUTHENTICATED));
    }
}
