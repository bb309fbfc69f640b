//! The `cloud-controller-manager` application: flags ([`options`]), leader election
//! ([`leader`]), the health and metrics endpoints ([`serve`]) and the entry point a vendor's
//! `main` calls ([`run()`]). Upstream's `k8s.io/cloud-provider/app` and `options`.

pub mod configz;
pub mod controllers;
pub mod delegated;
pub mod kube_client;
pub mod leader;
pub mod options;
pub mod run;
pub mod secure_serving;
pub mod serve;
pub mod upstream_flags;

pub use controllers::default_registry;
pub use leader::{LeaderElectionConfig, LeaderElector, LeaderError, LeaderHealth};
pub use options::{CloudControllerManagerOptions, LogFormat, OptionsError};
pub use run::{
    API_SERVER_WAIT, AppError, ControllerConstructor, ControllerFuture, ControllerRegistry,
    init_logging, init_logging_for, run, run_with, wait_for_api_server,
};
pub use serve::{HealthCheck, HealthChecks, Metrics};
