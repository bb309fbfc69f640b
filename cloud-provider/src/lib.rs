//! # cloud-provider: the cloud-controller-manager SDK
//!
//! Everything a cloud vendor needs to run Kubernetes' cloud controllers on its cloud, in Rust.
//! It is upstream `k8s.io/cloud-provider` as async Rust, with what upstream's users asked for:
//! typed errors that survive wrapping, a batched instance-metadata call, and a conformance kit.
//!
//! ## Writing a provider
//!
//! 1. Implement [`CloudProvider`] and the parts your cloud supports ([`InstancesV2`],
//!    [`LoadBalancer`], [`Routes`]; the legacy [`Instances`], [`Zones`] and [`Clusters`] exist
//!    for ports of older providers). Return `None` from the accessors of the parts you don't
//!    support: the controller that needs them is skipped.
//! 2. Register it once with [`register_cloud_provider!`]. The factory receives the
//!    `--cloud-config` file's contents, or `None` when the flag is absent.
//! 3. In the binary, which depends on `cloud-provider-app` and calls its `run`, reference the
//!    provider crate (`use my_provider as _;`): a crate that is only listed in `Cargo.toml` is
//!    not linked, and its registration never runs.
//! 4. Run the [`conformance`] kit against your provider in your tests.
//!
//! ## Errors
//!
//! Every call returns [`CloudError`]. Match on [`CloudError::kind`], which looks through any
//! wrapping, so `CloudError::context("describe", CloudError::InstanceNotFound)` is still
//! "instance not found" to the controllers.
//!
//! ## Map
//!
//! | module | what |
//! |---|---|
//! | [`provider`] | [`CloudProvider`] and its parts |
//! | [`types`] | [`InstanceMetadata`], [`Route`], [`Zone`] |
//! | [`error`] | [`CloudError`], [`ErrorKind`] |
//! | [`registry`] | [`register_cloud_provider!`], [`Registry`] |
//! | [`well_known`] | taints, labels, annotations, the finalizer, ports |
//! | [`helpers`] | provided-node-ip parsing and address order, Service source ranges, LB names |
//! | [`conformance`] | the provider conformance kit |
//!
//! The cloud-controller-manager application (flags, leader election, endpoints, the shared
//! controllers, `run`) is the `cloud-provider-app` crate: the binary depends on it, the
//! provider crate does not.

pub mod conformance;
pub mod error;
pub mod helpers;
pub mod provider;
pub mod registry;
pub mod types;
pub mod well_known;

pub use error::{BoxError, CloudError, ErrorKind};
/// The metrics library of [`CloudProvider::register_metrics`], re-exported so providers
/// register on the same version.
pub use prometheus_client;
pub use provider::{
    ClientBuilder, CloudProvider, CloudResult, Clusters, InitContext, Instances, InstancesV2,
    LoadBalancer, Routes, SharedClient, Zones, instance_provider_id,
};
pub use registry::{CloudConfig, ProviderFactory, Registry, RegistryError, init_cloud_provider};
pub use types::{
    ClusterLoadBalancer, InstanceMetadata, Route, ScheduledEvent, ScheduledEventKind, Zone,
    node_address,
};

/// Re-exports for the macros. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use inventory;
}
