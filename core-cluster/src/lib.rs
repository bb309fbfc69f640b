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
//! - [`controllers`]: the built-in controllers, each a kube-rs client of the server;
//! - [`sim`]: a kubelet stand-in simulating many nodes (registration, leases, pods,
//!   graceful shutdown, fault injection), in the spirit of kwok;
//! - [`tunnel`]: the node agents' tunnel (Konnectivity's model): agents dial out, the API
//!   server reaches their kubelets over those connections.
//!
//! - [`openapi`]: the OpenAPI v3 documents (`/openapi/v3`) kubectl needs for `apply`
//!   validation and `explain`.
//!
//! In-process use, with no TCP: kube 5's `Client::new(server.router(), "default")`.
//!
//! # Layers
//!
//! This crate only re-exports; the code lives in one crate per layer, so Cargo refuses any
//! dependency cycle between them:
//!
//! - `core-cluster-store` ([`store`]) and `core-cluster-machinery` ([`registry`],
//!   [`patch`], [`openapi`], [`clock`]) at the bottom, neither knowing the other;
//! - `core-cluster-apiserver` ([`api`], [`auth`], [`serve`]) on both;
//! - `core-cluster-controllers` ([`controllers`]) and `core-cluster-sim` ([`sim`]) on the
//!   machinery only: they talk to the server over its API, like any client;
//! - `core-cluster-tunnel` ([`tunnel`]) on neither: the API server and the simulated nodes'
//!   agents speak it at its two ends.

pub use core_cluster_apiserver::{
    ApiServer, ApiServerConfig, DEFAULT_PREFERRED_ADDRESS_TYPES, KUBELET_API_ADMIN_ROLE,
    KUBELET_CLIENT_USER, KubeletClientConfig, NodeEgress, WatchLimits, api, auth,
    kubelet_api_admin_binding, serve,
};
pub use core_cluster_controllers as controllers;
pub use core_cluster_machinery::{clock, openapi, patch, registry};
pub use core_cluster_sim as sim;
pub use core_cluster_store as store;
pub use core_cluster_tunnel as tunnel;
