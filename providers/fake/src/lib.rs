//! # cloud-provider-fake: an in-memory cloud for tests
//!
//! [`FakeCloud`] implements every part of the [`cloud_provider`] surface over an in-memory
//! cloud of instances, load balancers and routes. It is registered as `fake`, so
//! `ccm --cloud-provider fake --cloud-config fake.toml` runs against it, and tests build it
//! directly with [`FakeCloud::builder`] and keep a handle to drive it.
//!
//! - **Call recording**: every call is kept as a [`Call`] with its arguments
//!   ([`FakeCloud::calls`], [`FakeCloud::call_count`]).
//! - **Faults**: [`FaultRule`]s return a given error, `InstanceNotFound`, `NotImplemented` or
//!   retry-after, always, a number of times, or at a rate decided by a seeded generator, so a
//!   run repeats exactly for a seed (given the same order of calls).
//! - **API quota** ([`FakeCloudBuilder::quota`], [`FakeCloud::set_quota`]): calls over a
//!   cloud-side rate are refused as [`Throttled`](cloud_provider::ErrorKind::Throttled) with
//!   a retry-after, and counted ([`FakeCloud::throttled_calls`]).
//! - **Latency** on every call or per method, through tokio time (paused-time friendly).
//! - **Live changes**: add, stop, start, terminate and remove instances while controllers run.
//! - **Batching**: [`InstancesV2::instance_metadata_batch`](cloud_provider::InstancesV2::instance_metadata_batch)
//!   is one recorded call for many Nodes, so tests can count what batching saves.
//! - **Load balancers that carry traffic** ([`FakeCloudBuilder::serve_load_balancers`]) on
//!   loopback addresses, their connections bounded as a cloud bounds them
//!   ([`LoadBalancerLimits`]: 60 s idle timeout, a cap per listener, a share of the
//!   process's file descriptors).
//!
//! Upstream's fake has one sticky global error and defaults "exists" to false. Here faults are
//! per method and instances exist until a test terminates them.
//!
//! Semantics, matching real clouds: the provider ID is `fake://<instance-id>`; a Node is found
//! by its provider ID, else by its name; a stopped instance exists and is shut down; a
//! terminated one is not found; routes to instances that are gone are listed as blackholes;
//! a load balancer forwards to the Service's node ports, so every port needs one.

mod calls;
mod cloud;
pub mod config;
mod data_plane;
mod faults;
mod model;
mod quota;

use std::{collections::BTreeSet, sync::Arc};

use async_trait::async_trait;
use cloud_provider::{
    CloudConfig, CloudProvider, CloudResult, LoadBalancer,
    conformance::{BackendProbe, Fixture},
    register_cloud_provider,
};
use k8s_openapi::api::core::v1::Service;

pub use calls::{Call, Method, UnknownMethod};
pub use cloud::{CallHook, FakeCloud, FakeCloudBuilder, Parts};
pub use config::FakeConfigError;
pub use data_plane::{LoadBalancerLimits, LoadBalancerLimitsError, process_descriptor_budget};
pub use faults::{Fault, FaultRule};
pub use model::{FakeInstance, FakeListener, FakeLoadBalancer, FakeRoute, InstanceState};

/// The name the fake is registered under.
pub const PROVIDER_NAME: &str = "fake";

/// The prefix of the fake's provider IDs.
pub const PROVIDER_ID_PREFIX: &str = "fake://";

fn new_fake_cloud(config: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
    let cloud = match config {
        None => FakeCloud::new(),
        Some(config) => {
            FakeCloud::from_config(config.as_str()?, &config.path().display().to_string())
                .map_err(cloud_provider::CloudError::other)?
        }
    };
    Ok(Arc::new(cloud))
}

register_cloud_provider!(PROVIDER_NAME, new_fake_cloud);

#[async_trait]
impl BackendProbe for FakeCloud {
    async fn backends(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<BTreeSet<String>> {
        let name = self.get_load_balancer_name(cluster_name, service);
        self.load_balancers()
            .into_iter()
            .find(|lb| lb.name == name)
            .map(|lb| lb.hosts().iter().cloned().collect())
            .ok_or_else(|| cloud_provider::CloudError::message(format!("no load balancer {name}")))
    }
}

impl FakeCloud {
    /// A conformance [`Fixture`] for this cloud: two running instances, a stopped one, and
    /// this cloud as the backend probe. Instances named `conformance-*` are added for what the
    /// cloud lacks.
    pub fn conformance_fixture(&self, cluster_name: &str) -> Fixture {
        let mut running: Vec<FakeInstance> = self
            .instances()
            .into_iter()
            .filter(|i| i.state == InstanceState::Running)
            .take(2)
            .collect();
        for n in running.len()..2 {
            let instance =
                FakeInstance::new(format!("i-conformance-{n}"), format!("conformance-{n}"))
                    .with_internal_ip(std::net::IpAddr::from([10, 255, 0, n as u8 + 1]))
                    .with_internal_ip(format!("fd00:255::{}", n + 1).parse().expect("valid IPv6"));
            self.add_instance(instance.clone());
            running.push(instance);
        }
        let stopped = match self
            .instances()
            .into_iter()
            .find(|i| i.state == InstanceState::Stopped)
        {
            Some(instance) => instance,
            None => {
                let instance = FakeInstance::new("i-conformance-stopped", "conformance-stopped")
                    .with_internal_ip(std::net::IpAddr::from([10, 255, 0, 99]))
                    .with_state(InstanceState::Stopped);
                self.add_instance(instance.clone());
                instance
            }
        };
        let mut fixture = Fixture::new(cluster_name)
            .with_stopped_node(Fixture::node(&stopped.name, None))
            .with_backend_probe(Arc::new(self.clone()));
        for instance in running {
            fixture = fixture.with_running_node(Fixture::node(&instance.name, None));
        }
        fixture
    }
}
