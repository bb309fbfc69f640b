//! # core-cluster-machinery: what the API server knows, without doing any I/O
//!
//! The layer under the API server and the controllers: pure functions and data over JSON
//! values, no sockets, no files, no database.
//!
//! - [`registry`]: the served resources, one definition each (scope, subresources,
//!   defaulting, validation, table columns, field selectors), Service IP/port allocation,
//!   and [`FieldError`](registry::FieldError), upstream's `field.Error`;
//! - [`apiservice`]: `apiregistration.k8s.io/v1` APIServices (Local ones only);
//! - [`crd`]: custom resource definitions, the resources they serve and their structural
//!   schemas (pruning, defaulting, validation);
//! - [`patch`]: JSON, merge, strategic-merge patches and server-side apply;
//! - [`openapi`]: the OpenAPI v3 documents (`/openapi/v3`) kubectl needs for `apply`
//!   validation and `explain`;
//! - [`clock`]: wall-clock time that follows tokio's clock (paused in tests);
//! - [`health`]: the [`HealthChecker`](health::HealthChecker) trait of `/livez` checks.
//!
//! This crate may not depend on the store, the API server or any HTTP, TLS or storage
//! library (axum, hyper, rusqlite, rustls, tokio-rustls, rcgen, x509-parser); Cargo refuses
//! a dependency cycle, so nothing here can reach back up.

pub mod apiservice;
pub mod clock;
pub mod crd;
pub mod health;
pub mod openapi;
pub mod patch;
pub mod registry;
