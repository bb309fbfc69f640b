//! # cloud-provider-app: the cloud-controller-manager application
//!
//! What a vendor's `main` runs on top of its [`cloud_provider::CloudProvider`]: upstream's
//! flags ([`options`]), leader election ([`leader`]), the health and metrics endpoints
//! ([`serve`]), the shared controllers ([`controllers`]) and the entry point ([`run()`]).
//! Upstream's `k8s.io/cloud-provider/app`, `options` and `controllers`.
//!
//! A provider crate depends on `cloud-provider` only; the binary that links it depends on
//! this crate as well.

pub mod configz;
pub mod controllers;
pub mod default_controllers;
pub mod delegated;
pub mod kube_client;
pub mod leader;
pub mod options;
pub mod run;
pub mod secure_serving;
pub mod serve;
pub mod upstream_flags;

pub use default_controllers::default_registry;
pub use leader::{LeaderElectionConfig, LeaderElector, LeaderError, LeaderHealth};
pub use options::{CloudControllerManagerOptions, LogFormat, OptionsError};
pub use run::{
    API_SERVER_WAIT, AppError, ControllerConstructor, ControllerFuture, ControllerRegistry,
    init_logging, init_logging_for, run, run_with, wait_for_api_server,
};
pub use serve::{HealthCheck, HealthChecks, Metrics};

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
