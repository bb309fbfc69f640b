//! # core-cluster-apiserver: the Kubernetes-compatible API server
//!
//! - [`api`]: the REST surface (discovery, CRUD, watch, tables, Status errors, metrics,
//!   admission) and [`ApiServer`];
//! - [`auth`]: who a request is (client certificates, tokens, impersonation) and whether it
//!   may (Node authorizer, RBAC);
//! - [`serve`]: serving on a socket over TLS and writing a kubeconfig.
//!
//! It stands on [`core_cluster_store`] (the versioned key-value store) and
//! [`core_cluster_machinery`] (resources, patches, OpenAPI, clock). It may not depend on
//! the controllers or the simulator: they are clients of this server, never the reverse.

// The lower layers under the paths this code has always used (`crate::registry::…`).
pub(crate) use core_cluster_machinery::{apiservice, crd, openapi, patch, registry};
pub(crate) use core_cluster_store as store;

pub mod api;
pub mod auth;
pub mod serve;
pub(crate) mod storage;

#[cfg(test)]
mod layering;

pub use api::{
    ApiServer, ApiServerConfig, DEFAULT_KUBELET_PORT, DEFAULT_PREFERRED_ADDRESS_TYPES,
    KUBELET_API_ADMIN_ROLE, KUBELET_CLIENT_USER, KubeletClientConfig, NodeEgress, WatchLimits,
    kubelet_api_admin_binding,
};
