//! # core-cluster: the node side of a Kubernetes control plane
//!
//! A Kubernetes-compatible API server core that kubectl and kube-rs use unchanged:
//!
//! - [`store`]: the versioned key-value store (one global revision = resourceVersion,
//!   optimistic concurrency, consistent paging, watch from a revision with 410 when too old),
//!   durable on SQLite (WAL, group commit) or in memory for tests;
//! - [`registry`]: the served resources, one definition each (scope, subresources,
//!   defaulting, validation, table columns, field selectors), Service IP/port allocation;
//! - [`patch`]: JSON, merge, strategic-merge patches and server-side apply;
//! - [`api`]: the REST surface (discovery, CRUD, watch, tables, Status errors, metrics);
//! - [`auth`]: the identity of a request ([`auth::UserInfo`]);
//! - [`clock`]: wall-clock time that follows tokio's clock (paused in tests);
//! - [`serve`]: serving on a socket and writing a kubeconfig;
//! - [`sim`]: a kubelet stand-in simulating many nodes (registration, leases, pods,
//!   graceful shutdown, fault injection), in the spirit of kwok.
//!
//! - [`openapi`]: the OpenAPI v3 documents (`/openapi/v3`) kubectl needs for `apply`
//!   validation and `explain`.
//!
//! In-process use, with no TCP: kube 5's `Client::new(server.router(), "default")`.

pub mod api;
pub mod auth;
pub mod clock;
pub mod controllers;
pub mod openapi;
pub mod patch;
pub mod registry;
pub mod serve;
pub mod sim;
pub(crate) mod storage;

#[cfg(test)]
mod layering;
pub mod store;

pub use api::{ApiServer, ApiServerConfig, WatchLimits};
