//! # cloud-provider-app: the cloud-controller-manager application
//!
//! What a vendor's `main` runs on top of its [`cloud_provider::CloudProvider`]: upstream's
//! flags ([`CloudControllerManagerOptions`]), Lease leader election ([`LeaderElector`]),
//! `/healthz`, `/readyz`, `/livez`, `/metrics` and `/configz` over HTTPS with delegated
//! authentication and authorization ([`HealthChecks`]), the shared controllers
//! ([`controllers`], [`default_registry`]) and the entry point ([`run()`], [`run_with`]).
//! Upstream's `k8s.io/cloud-provider/app`, `options` and `controllers`.
//!
//! A provider crate depends on `cloud-provider` only; the binary that links it depends on
//! this crate as well.

mod configz;
pub mod controllers;
mod default_controllers;
mod delegated;
mod kube_client;
mod leader;
mod options;
mod run;
mod secure_serving;
mod serve;
mod upstream_flags;

pub use default_controllers::{
    CLOUD_NODE_CONTROLLER, CLOUD_NODE_LIFECYCLE_CONTROLLER, ROUTE_CONTROLLER, SERVICE_CONTROLLER,
    default_registry,
};
pub use kube_client::{ClientError, ControllerClients};
pub use leader::{LeaderElectionConfig, LeaderElector, LeaderError};
pub use options::{
    CloudControllerManagerOptions, ClusterCidrError, GoDuration, GoDurationError, LogFormat,
    OptionsError, parse_go_duration,
};
pub use run::{
    AppError, ControllerConstructor, ControllerFuture, ControllerRegistry, init_logging,
    init_logging_for, run, run_with,
};
pub use serve::{HealthCheck, HealthChecks};
pub use upstream_flags::AcceptedFlags;

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
