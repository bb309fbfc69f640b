//! # cloud-provider-aws: an AWS provider on the official AWS SDK for Rust
//!
//! [`AwsCloud`] implements [`cloud_provider::InstancesV2`],
//! [`cloud_provider::Routes`] and [`cloud_provider::LoadBalancer`] with
//! `aws-sdk-ec2` (instances, routes, security groups) and `aws-sdk-elasticloadbalancingv2`
//! (Network Load Balancers). It is registered as `aws`, so
//! `ccm --cloud-provider aws --cloud-config aws.conf` uses it; code builds it from the config
//! text with [`AwsCloud::from_config_text`] or [`AwsCloud::builder`].
//!
//! - **Config**: upstream's INI cloud-config ([`config`]): `[Global]` keys and
//!   `[ServiceOverride "N"]` endpoints. Unknown keys and bad values are errors naming the key.
//! - **Credentials**: the SDK's default chain, wrapped in STS AssumeRole for `RoleARN`. IMDS is
//!   asked for the region only when neither `Region` nor `Zone` is configured, and for the VPC
//!   only when `VPC` is not.
//! - **Instances**: provider ID `aws:///<az>/<instance-id>`; one DescribeInstances per 1,000
//!   Nodes in a batch; single lookups arriving within 20 ms share one call; a 10 s cache feeds
//!   load balancers and routes.
//! - **Throttling**: adaptive retry (client-side rate limiting per service and region), metrics
//!   of attempts and throttles by operation ([`AwsCloud::metrics`]), and a
//!   [`CloudError::Throttled`] error (with the response's `Retry-After`, if any) once the
//!   retries are spent, so the controller manager's shared cloud limiter lowers its rate.
//! - **Scheduled events**: `InstancesV2::scheduled_events` from EC2 DescribeInstanceStatus
//!   events (maintenance, reboots, retirement), for the Node's `MaintenancePlanned` condition.
//! - **Load balancers**: Network Load Balancers ([`lb`] says what differs from upstream); a
//!   Classic ELB left by cloud-provider-aws is refused, reported and deleted, never duplicated.
//! - **Labels**: `topology.k8s.aws/zone-id` from a cached DescribeAvailabilityZones, and
//!   `topology.k8s.aws/network-node-layer-N` from a cached DescribeInstanceTopology (100
//!   instances a call) for the types of `SupportedTopologyInstanceTypePattern`; best effort.
//! - **Node names** of route targets and backends come from the cluster's Nodes by instance ID
//!   (after [`CloudProvider::initialize`]), so they survive a restart.
//! - **Metrics**: AWS call durations, errors and throttles on the ccm's `/metrics` under
//!   upstream's `cloudprovider_aws_api_*` names.
//!
//! [`test_util`] (feature `test-util`) starts a local moto server on a free loopback port and
//! seeds a VPC for tests, here and in other crates (vendors' tests, the ccm's).

pub mod client;
pub mod config;
mod events;
pub mod ids;
mod instances;
pub mod lb;
mod routes;
#[cfg(feature = "test-util")]
pub mod test_util;
mod topology;
mod zones;

pub use topology::NETWORK_NODE_LABEL_PREFIX;
pub use zones::ZONE_ID_LABEL;

use std::{collections::BTreeSet, sync::Arc};

use async_trait::async_trait;
use aws_sdk_ec2::types::Tag;
use cloud_provider::{
    CloudConfig, CloudError, CloudProvider, CloudResult, InitContext, InstancesV2, LoadBalancer,
    Routes, conformance::BackendProbe, register_cloud_provider,
};
use k8s_openapi::api::core::v1::Service;
use tokio::sync::OnceCell;

pub use client::{AwsOptions, CallMetrics, OperationStats};
pub use config::{AwsConfig, ConfigError};

/// The name the provider is registered under.
pub const PROVIDER_NAME: &str = "aws";

/// The prefix of the cluster tag: `kubernetes.io/cluster/<cluster-id>`.
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";

/// The legacy cluster tag key (`KubernetesCluster=<cluster-id>`).
pub const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";

/// The AWS provider. Cheap to clone; clones share clients, cache and metrics.
#[derive(Clone)]
pub struct AwsCloud {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: AwsConfig,
    pub(crate) options: AwsOptions,
    pub(crate) metrics: Arc<CallMetrics>,
    clients: OnceCell<client::Clients>,
    vpc: OnceCell<String>,
    pub(crate) instances: instances::InstanceState,
    pub(crate) zones: zones::ZoneCache,
    pub(crate) topology: topology::TopologyCache,
    /// The cluster, from [`CloudProvider::initialize`]: its Nodes name route targets.
    pub(crate) cluster: std::sync::OnceLock<kube::Client>,
}

/// Builds an [`AwsCloud`] from a parsed config and options.
#[derive(Debug, Clone, Default)]
pub struct AwsCloudBuilder {
    config: AwsConfig,
    options: AwsOptions,
}

impl AwsCloudBuilder {
    /// Replaces the options (retries, credentials, cache lifetime).
    pub fn options(mut self, options: AwsOptions) -> Self {
        self.options = options;
        self
    }

    /// The provider. No AWS call is made until the first use (or
    /// [`CloudProvider::initialize`]).
    pub fn build(self) -> AwsCloud {
        let topology = topology::TopologyCache::new(
            self.config
                .supported_topology_instance_type_pattern
                .as_deref(),
        );
        AwsCloud {
            inner: Arc::new(Inner {
                config: self.config,
                options: self.options,
                metrics: Arc::default(),
                clients: OnceCell::new(),
                vpc: OnceCell::new(),
                instances: instances::InstanceState::default(),
                zones: zones::ZoneCache::default(),
                topology,
                cluster: std::sync::OnceLock::new(),
            }),
        }
    }
}

impl AwsCloud {
    /// A builder for the parsed `config`.
    pub fn builder(config: AwsConfig) -> AwsCloudBuilder {
        AwsCloudBuilder {
            config,
            options: AwsOptions::default(),
        }
    }

    /// The provider for a cloud-config text, with default options. Config errors name the key.
    pub fn from_config_text(text: &str) -> Result<AwsCloud, ConfigError> {
        Ok(AwsCloud::builder(AwsConfig::parse(text)?).build())
    }

    /// The provider for a cloud-config text with `options`.
    pub fn from_config_text_with(text: &str, options: AwsOptions) -> Result<AwsCloud, ConfigError> {
        Ok(AwsCloud::builder(AwsConfig::parse(text)?)
            .options(options)
            .build())
    }

    /// The parsed config.
    pub fn config(&self) -> &AwsConfig {
        &self.inner.config
    }

    /// Attempts and throttles by AWS operation, since the provider was built.
    pub fn metrics(&self) -> &CallMetrics {
        &self.inner.metrics
    }

    /// Builds the SDK clients now (region, credentials), instead of at the first call.
    pub async fn connect(&self) -> CloudResult<()> {
        self.inner.clients().await.map(|_| ())
    }

    /// The region the provider works in.
    pub async fn region(&self) -> CloudResult<String> {
        Ok(self.inner.clients().await?.region.clone())
    }

    /// Drops every cached instance lookup.
    pub fn clear_instance_cache(&self) {
        self.inner.instances.cache.lock().clear();
    }
}

impl Inner {
    pub(crate) async fn clients(&self) -> CloudResult<&client::Clients> {
        self.clients
            .get_or_try_init(|| client::build_clients(&self.config, &self.options, &self.metrics))
            .await
    }

    /// The cluster ID, or an error saying the config needs one for `what`.
    pub(crate) fn cluster_id(&self, what: &str) -> CloudResult<&str> {
        self.config.cluster_id().ok_or_else(|| {
            CloudError::message(format!(
                "{what} needs the cluster ID: set KubernetesClusterID in the cloud-config [Global] section"
            ))
        })
    }

    /// The cluster tag key, `kubernetes.io/cluster/<id>`.
    pub(crate) fn cluster_tag_key(&self, what: &str) -> CloudResult<String> {
        Ok(format!("{CLUSTER_TAG_PREFIX}{}", self.cluster_id(what)?))
    }

    /// Whether `tags` carry this cluster's tag (either form, any value). True when no cluster ID
    /// is configured.
    pub(crate) fn has_cluster_tag(&self, tags: &[Tag]) -> bool {
        let Some(id) = self.config.cluster_id() else {
            return true;
        };
        let key = format!("{CLUSTER_TAG_PREFIX}{id}");
        tags.iter().any(|t| {
            t.key() == Some(key.as_str())
                || (t.key() == Some(LEGACY_CLUSTER_TAG) && t.value() == Some(id))
        })
    }

    /// The cluster's VPC: `VPC` from the config, else the VPC of the instance IMDS says we run on.
    pub(crate) async fn vpc_id(&self) -> CloudResult<&str> {
        self.vpc
            .get_or_try_init(|| async {
                if let Some(vpc) = &self.config.vpc {
                    return Ok(vpc.clone());
                }
                let imds = aws_config::imds::Client::builder()
                    .configure(&client::imds_provider_config())
                    .build();
                let fail = |e: &dyn std::fmt::Display| {
                    CloudError::message(format!(
                        "no VPC in the cloud-config [Global] section, and the instance metadata \
                         service could not say which VPC this runs in: {e}"
                    ))
                };
                let mac = imds
                    .get("/latest/meta-data/mac")
                    .await
                    .map_err(|e| fail(&e))?;
                let mac: String = mac.into();
                let vpc = imds
                    .get(format!(
                        "/latest/meta-data/network/interfaces/macs/{mac}/vpc-id"
                    ))
                    .await
                    .map_err(|e| fail(&e))?;
                Ok(vpc.into())
            })
            .await
            .map(String::as_str)
    }
}

#[async_trait]
impl CloudProvider for AwsCloud {
    /// Keeps a client of the cluster (its Nodes name route targets and load-balancer backends
    /// by instance ID, as upstream's provider-ID index does), and builds the SDK clients.
    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        let client = ctx.clients.client("aws-cloud-provider").await?;
        let _ = self.inner.cluster.set(client);
        self.connect().await
    }

    fn provider_name(&self) -> &str {
        PROVIDER_NAME
    }

    /// AWS call durations, errors and throttles by operation, under upstream's names
    /// ([`CallMetrics::register`]).
    fn register_metrics(
        &self,
        registry: &mut cloud_provider::prometheus_client::registry::Registry,
    ) {
        self.inner.metrics.register(registry);
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.config.cluster_id().is_some()
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        Some(self)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        Some(self)
    }
}

fn new_aws_cloud(config: Option<&CloudConfig>) -> CloudResult<Arc<dyn CloudProvider>> {
    let text = match config {
        Some(config) => config.as_str()?.to_owned(),
        None => String::new(),
    };
    let cloud = AwsCloud::from_config_text(&text).map_err(|e| {
        CloudError::context(
            match config {
                Some(c) => format!("aws cloud-config {}", c.path().display()),
                None => "aws cloud-config".to_owned(),
            },
            e,
        )
    })?;
    Ok(Arc::new(cloud))
}

register_cloud_provider!(PROVIDER_NAME, new_aws_cloud);

#[async_trait]
impl BackendProbe for AwsCloud {
    /// The Node names registered as targets of the Service's load balancer.
    async fn backends(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<BTreeSet<String>> {
        let ids = self.registered_targets(cluster_name, service).await?;
        let instances = self
            .inner
            .cached_instances(&ids.iter().cloned().collect::<Vec<_>>())
            .await?;
        let index = self.inner.cluster_node_names().await?;
        Ok(ids
            .into_iter()
            .map(|id| {
                self.inner
                    .node_name_of(&id, instances.get(&id), index.as_ref())
            })
            .collect())
    }
}
