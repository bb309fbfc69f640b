//! The provider surface: [`CloudProvider`] and its optional parts.
//!
//! This is upstream's `k8s.io/cloud-provider` `Interface` in async Rust. Every part is optional:
//! a provider returns `None` from an accessor it does not support, and the controller that needs
//! that part is skipped. Implement the parts on the provider type itself and return
//! `Some(self)`, or on separate types it owns.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use tokio_util::sync::CancellationToken;

use crate::{CloudError, ClusterLoadBalancer, InstanceMetadata, Route, ScheduledEvent, Zone};

/// The result type of every provider call.
pub type CloudResult<T> = Result<T, CloudError>;

/// How many single lookups the default
/// [`InstancesV2::instance_metadata_batch`] runs at once.
pub const DEFAULT_BATCH_CONCURRENCY: usize = 16;

/// Builds Kubernetes clients for a provider, one per purpose, as upstream's
/// `ControllerClientBuilder` (`k8s.io/controller-manager/pkg/clientbuilder`) does: the name
/// identifies the caller in the API server's logs (its user agent), and the controller
/// manager's builder gives each name its own client-side rate limit and, with
/// `--use-service-account-credentials`, its own service account in `kube-system`.
///
/// Async because a service-account client needs the account and a token from the API server
/// before it can be handed out (upstream's `DynamicControllerClientBuilder`).
#[async_trait]
pub trait ClientBuilder: Send + Sync {
    /// A client for the component called `name`.
    async fn client(&self, name: &str) -> CloudResult<kube::Client>;
}

/// A [`ClientBuilder`] that hands out clones of one client, whatever the name (tests, and
/// embedders that manage their own identity).
#[derive(Clone)]
pub struct SharedClient(pub kube::Client);

#[async_trait]
impl ClientBuilder for SharedClient {
    async fn client(&self, _name: &str) -> CloudResult<kube::Client> {
        Ok(self.0.clone())
    }
}

/// What [`CloudProvider::initialize`] receives: the controller manager's client builder (as
/// upstream's `cloud.Initialize(c.ClientBuilder, stop)` in `app/controllermanager.go`) and a
/// token that is cancelled when the controller manager stops (or loses leadership).
/// Background tasks the provider starts must end when `shutdown` is cancelled.
#[derive(Clone)]
#[non_exhaustive]
pub struct InitContext {
    /// Builds clients for the cluster the controllers manage.
    pub clients: Arc<dyn ClientBuilder>,
    /// Cancelled when the provider must stop its background work.
    pub shutdown: CancellationToken,
}

impl InitContext {
    /// A context from a client builder and a shutdown token.
    pub fn new(clients: Arc<dyn ClientBuilder>, shutdown: CancellationToken) -> Self {
        InitContext { clients, shutdown }
    }
}

/// A cloud provider: the entry point the controllers talk to.
///
/// ```
/// use async_trait::async_trait;
/// use cloud_provider::{CloudProvider, CloudResult, InstanceMetadata, InstancesV2};
/// use k8s_openapi::api::core::v1::Node;
///
/// struct Tiny;
///
/// #[async_trait]
/// impl InstancesV2 for Tiny {
///     async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> { Ok(true) }
///     async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> { Ok(false) }
///     async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
///         let name = node.metadata.name.clone().unwrap_or_default();
///         Ok(Some(InstanceMetadata::new(format!("tiny://{name}"))))
///     }
/// }
///
/// impl CloudProvider for Tiny {
///     fn provider_name(&self) -> &str { "tiny" }
///     fn instances_v2(&self) -> Option<&dyn InstancesV2> { Some(self) }
/// }
///
/// let cloud: std::sync::Arc<dyn CloudProvider> = std::sync::Arc::new(Tiny);
/// assert!(cloud.instances_v2().is_some());
/// assert!(cloud.load_balancer().is_none());
/// ```
#[async_trait]
pub trait CloudProvider: Send + Sync + 'static {
    /// Called once, after leadership is won and before the controllers start. May start
    /// background tasks, which must stop when `ctx.shutdown` is cancelled. An error stops the
    /// controller manager.
    async fn initialize(&self, ctx: InitContext) -> CloudResult<()> {
        let _ = ctx;
        Ok(())
    }

    /// The provider's name, e.g. `aws`. Provider IDs start with `<name>://`.
    fn provider_name(&self) -> &str;

    /// Whether the provider knows which cluster it serves (a cluster ID or tag). The controller
    /// manager refuses to start without one unless `--allow-untagged-cloud` is given.
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// Beyond upstream, optional (the shape of the provisional KEP-5778, several cloud
    /// controller managers in one cluster): the platforms whose Nodes this provider owns. A
    /// Node's platform is its `cloudprovider.kubernetes.io/platform` annotation, else its
    /// provider ID's scheme. The controllers then act only on those Nodes (and never delete
    /// another platform's). `--cloud-provider-platforms` overrides it. The default, no
    /// platform, owns every Node, as upstream does.
    fn supported_platforms(&self) -> Vec<String> {
        Vec::new()
    }

    /// Load balancers, for the service controller.
    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        None
    }

    /// Legacy per-name instance lookups. Prefer [`instances_v2`](Self::instances_v2).
    fn instances(&self) -> Option<&dyn Instances> {
        None
    }

    /// Instance lookups by Node, for the cloud-node and cloud-node-lifecycle controllers. When
    /// this is supported, [`zones`](Self::zones) is never called.
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        None
    }

    /// Legacy zone lookups, used only with [`instances`](Self::instances).
    fn zones(&self) -> Option<&dyn Zones> {
        None
    }

    /// Cluster listing. No controller uses it; kept for parity with upstream.
    fn clusters(&self) -> Option<&dyn Clusters> {
        None
    }

    /// Routes, for the route controller.
    fn routes(&self) -> Option<&dyn Routes> {
        None
    }

    /// Registers the provider's own metrics (cloud API calls, throttling, caches…) on the
    /// controller manager's `/metrics`, beside the controllers' metrics. Called once at start.
    /// Register under a sub-registry or with a provider prefix to keep names apart.
    ///
    /// ```
    /// use cloud_provider::prometheus_client::{metrics::counter::Counter, registry::Registry};
    /// # use cloud_provider::CloudProvider;
    /// struct Counted { calls: Counter }
    /// impl CloudProvider for Counted {
    ///     fn provider_name(&self) -> &str { "counted" }
    ///     fn register_metrics(&self, registry: &mut Registry) {
    ///         registry.sub_registry_with_prefix("counted")
    ///             .register("cloud_calls", "Calls to the cloud API", self.calls.clone());
    ///     }
    /// }
    /// let mut registry = Registry::default();
    /// Counted { calls: Counter::default() }.register_metrics(&mut registry);
    /// ```
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }
}

/// Instance lookups by Node. Implementations should use `node.spec.providerID` first and may
/// fall back to the name, labels or annotations.
#[async_trait]
pub trait InstancesV2: Send + Sync {
    /// Whether the instance behind `node` exists. Must be `true` for stopped instances.
    ///
    /// `Ok(false)` makes the cloud-node-lifecycle controller delete the Node.
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool>;

    /// Whether the instance is shut down (stopped, but still existing).
    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool>;

    /// The instance's metadata. `Ok(None)` means "nothing to say yet": the Node stays
    /// uninitialized until its next event. Return [`CloudError::InstanceNotFound`] if there is
    /// no such instance.
    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>>;

    /// The metadata of many Nodes at once: one result per Node, in the same order.
    ///
    /// This is how the SDK cuts cloud calls from one per Node to one per sync: the controllers
    /// call it with every Node waiting at that moment. The default runs
    /// [`instance_metadata`](Self::instance_metadata) for each Node, at most
    /// [`DEFAULT_BATCH_CONCURRENCY`] at a time; a provider overrides it with one bulk cloud
    /// call (for example one `DescribeInstances` per 1,000 instances). One Node's failure must
    /// not fail the others.
    async fn instance_metadata_batch(
        &self,
        nodes: &[&Node],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let mut lookups = Vec::with_capacity(nodes.len());
        for node in nodes.iter().copied() {
            lookups.push(self.instance_metadata(node));
        }
        futures::stream::iter(lookups)
            .buffered(DEFAULT_BATCH_CONCURRENCY)
            .collect()
            .await
    }
    /// Beyond upstream, optional: every event the cloud has scheduled for this cluster's
    /// instances (maintenance, reboot, retirement, spot interruption), in one call. The
    /// cloud-node-lifecycle controller marks the Nodes with the `MaintenancePlanned`
    /// condition. The default is [`CloudError::NotImplemented`].
    async fn scheduled_events(&self) -> CloudResult<Vec<ScheduledEvent>> {
        Err(CloudError::NotImplemented)
    }
}

/// Legacy instance lookups by name and provider ID (upstream's `Instances`), for vendors porting
/// older providers. The `*_by_provider_id` calls run in the control plane and must not use
/// local metadata.
#[async_trait]
pub trait Instances: Send + Sync {
    /// The addresses of the instance called `node_name`.
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>>;

    /// The addresses of the instance with this provider ID.
    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>>;

    /// The cloud's ID of the instance called `node_name`; [`CloudError::InstanceNotFound`] if
    /// it does not exist (but not for stopped instances).
    async fn instance_id(&self, node_name: &str) -> CloudResult<String>;

    /// The instance type of the instance called `node_name`.
    async fn instance_type(&self, node_name: &str) -> CloudResult<String>;

    /// The instance type of the instance with this provider ID.
    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String>;

    /// Adds an SSH key to every instance. Legacy; the default is [`CloudError::NotImplemented`].
    async fn add_ssh_key_to_all_instances(&self, user: &str, key_data: &[u8]) -> CloudResult<()> {
        let _ = (user, key_data);
        Err(CloudError::NotImplemented)
    }

    /// The Node name of the machine with this hostname.
    async fn current_node_name(&self, hostname: &str) -> CloudResult<String>;

    /// Whether the instance exists. Must be `true` for stopped instances; `Ok(false)` makes the
    /// lifecycle controller delete the Node.
    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;

    /// Whether the instance is shut down.
    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool>;
}

/// Legacy zone lookups (upstream's deprecated `Zones`).
#[async_trait]
pub trait Zones: Send + Sync {
    /// The zone of the machine this runs on (kubelet-era; from local metadata).
    async fn get_zone(&self) -> CloudResult<Zone>;

    /// The zone of the instance with this provider ID.
    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone>;

    /// The zone of the instance called `node_name`.
    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone>;
}

/// Load balancers for `type: LoadBalancer` Services. Services passed in are the controller's
/// copies; Nodes are the shared Node cache's own (`&[Arc<Node>]`, as upstream passes
/// `[]*v1.Node`), so 1,000 Services over 10,000 Nodes share one copy of each Node.
/// Implementations only read them.
#[async_trait]
pub trait LoadBalancer: Send + Sync {
    /// The status of the Service's load balancer, or `None` if it does not exist.
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>>;

    /// The cloud name of the Service's load balancer. The default is upstream's
    /// [`default_load_balancer_name`](crate::helpers::service::default_load_balancer_name).
    fn get_load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        let _ = cluster_name;
        crate::helpers::service::default_load_balancer_name(service)
    }

    /// Creates or updates the load balancer so that it serves `service` on `nodes`, and returns
    /// its status. May return [`CloudError::RetryAfter`] to ask for a fixed requeue delay, or
    /// [`CloudError::ImplementedElsewhere`] when another controller owns this Service.
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus>;

    /// Updates only the backends of an existing load balancer.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()>;

    /// Deletes the load balancer and everything created for it. Succeeds if it is already
    /// gone. Must not return [`CloudError::ImplementedElsewhere`].
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()>;

    /// Beyond upstream, optional: every load balancer this provider made for `cluster_name`
    /// (found by the provider's own record, such as a cluster tag), so the service controller
    /// can collect those whose Service is gone or no longer wants one. The default is
    /// [`CloudError::NotImplemented`]: no collection. A partial answer must be an error, never
    /// a shorter list.
    async fn list_load_balancers(
        &self,
        cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let _ = cluster_name;
        Err(CloudError::NotImplemented)
    }

    /// Beyond upstream, optional: deletes a load balancer [`list_load_balancers`] reported, and
    /// everything created for it, when its Service is gone. Succeeds if it is already gone.
    /// The default is [`CloudError::NotImplemented`].
    ///
    /// [`list_load_balancers`]: LoadBalancer::list_load_balancers
    async fn ensure_listed_load_balancer_deleted(
        &self,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        let _ = (cluster_name, load_balancer);
        Err(CloudError::NotImplemented)
    }
}

/// Routes in the cloud's route table, one per pod CIDR.
#[async_trait]
pub trait Routes: Send + Sync {
    /// Every route of the cluster.
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>>;

    /// Creates a route. `name_hint` is the Node's UID; a dual-stack Node gets two routes with
    /// the same hint, so the provider must derive unique names (from the CIDR, say).
    /// `route.name` is ignored.
    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()>;

    /// Deletes a route as returned by [`list_routes`](Self::list_routes).
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()>;
}

/// Cluster listing (upstream's `Clusters`).
#[async_trait]
pub trait Clusters: Send + Sync {
    /// The names of all clusters.
    async fn list_clusters(&self) -> CloudResult<Vec<String>>;

    /// The address of the cluster's control plane.
    async fn master(&self, cluster_name: &str) -> CloudResult<String>;
}

/// The provider ID of the instance called `node_name`, built as upstream does:
/// `<provider name>://<instance ID>`, for providers that only support [`Instances`].
///
/// [`CloudError::NotImplemented`] and [`CloudError::InstanceNotFound`] come back unwrapped (the
/// callers act on them); other errors are wrapped with the node name.
pub async fn instance_provider_id(
    cloud: &dyn CloudProvider,
    node_name: &str,
) -> CloudResult<String> {
    let instances = cloud
        .instances()
        .ok_or_else(|| CloudError::message("failed to get instances from cloud provider"))?;
    match instances.instance_id(node_name).await {
        Ok(id) => Ok(format!("{}://{}", cloud.provider_name(), id)),
        Err(err) if err.is_not_implemented() || err.is_instance_not_found() => Err(err),
        Err(err) => Err(CloudError::context(
            format!("failed to get instance ID from cloud provider for node {node_name}"),
            err,
        )),
    }
}
