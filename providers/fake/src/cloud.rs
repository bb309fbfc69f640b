//! [`FakeCloud`]: the in-memory cloud, its controls, and its provider implementation.

use std::{
    collections::{BTreeMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::Duration,
};

use async_trait::async_trait;
use cloud_provider::{
    CloudError, CloudProvider, CloudResult, ClusterLoadBalancer, Clusters, InstanceMetadata,
    Instances, InstancesV2, LoadBalancer, Route, Routes, ScheduledEvent, Zone, Zones,
    helpers::service::{health_check_path_port, load_balancer_source_ranges},
};
use futures::future::BoxFuture;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, PortStatus, Service,
};
use parking_lot::Mutex;

use crate::{
    Call, FakeInstance, FakeListener, FakeLoadBalancer, FakeRoute, FaultRule, InstanceState,
    Method, PROVIDER_ID_PREFIX, faults::FaultPlan, quota::Quota,
};

/// Which parts of the provider surface the fake reports as supported. All are on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Parts {
    /// Legacy `Instances`.
    pub instances: bool,
    /// `InstancesV2`.
    pub instances_v2: bool,
    /// Legacy `Zones`.
    pub zones: bool,
    /// `LoadBalancer`.
    pub load_balancer: bool,
    /// `Routes`.
    pub routes: bool,
    /// `Clusters`.
    pub clusters: bool,
}

impl Default for Parts {
    fn default() -> Self {
        Parts {
            instances: true,
            instances_v2: true,
            zones: true,
            load_balancer: true,
            routes: true,
            clusters: true,
        }
    }
}

/// A hook awaited on every call, after it is recorded and before it is answered: tests use it
/// to hold a call until they are ready (the async form of upstream's blocking callbacks).
pub type CallHook = Arc<dyn Fn(Call) -> BoxFuture<'static, ()> + Send + Sync>;

#[derive(Debug, Default)]
struct State {
    instances: BTreeMap<String, FakeInstance>,
    load_balancers: BTreeMap<String, FakeLoadBalancer>,
    routes: BTreeMap<(String, IpNet), FakeRoute>,
    next_lb_address: u32,
    /// One shared copy of every distinct load-balancer host list in use.
    host_lists: HostLists,
}

/// Interned load-balancer host lists: load balancers with the same Nodes share one
/// `Arc<[String]>`, so many load balancers over many Nodes do not each hold every name.
#[derive(Debug, Default)]
struct HostLists(HashSet<Arc<[String]>>);

impl HostLists {
    /// The shared list equal to `hosts` (sorted and deduplicated by [`CallHosts::of`]), made
    /// if new. Lists no load balancer holds any more (replaced or deleted since the last call)
    /// are dropped first.
    fn intern(&mut self, hosts: Vec<String>) -> Arc<[String]> {
        self.0.retain(|list| Arc::strong_count(list) > 1);
        if let Some(list) = self.0.get(hosts.as_slice()) {
            return list.clone();
        }
        let list: Arc<[String]> = hosts.into();
        self.0.insert(list.clone());
        list
    }

    /// For a call given `hosts`: the list to log (in the order given) and the shared list.
    /// Hosts given sorted, as the service controller gives them, are logged as the shared
    /// list itself: a call log of load-balancer calls over 10,000 Nodes then holds no copies.
    fn for_call(&mut self, hosts: CallHosts) -> (Arc<[String]>, Arc<[String]>) {
        match hosts.as_given {
            None => {
                let list = self.intern(hosts.sorted);
                (list.clone(), list)
            }
            Some(given) => (given.into(), self.intern(hosts.sorted)),
        }
    }
}

/// A load-balancer call's host names, made before the cloud's state is locked (10,000 names
/// per call, with up to 16 calls at once): sorted and deduplicated for the load balancer, and
/// as given when that differs, for the call log.
struct CallHosts {
    sorted: Vec<String>,
    as_given: Option<Vec<String>>,
}

impl CallHosts {
    fn of(nodes: &[Arc<Node>]) -> Self {
        let given: Vec<String> = nodes.iter().map(|n| name_of(n).to_owned()).collect();
        if given.windows(2).all(|pair| pair[0] < pair[1]) {
            return CallHosts {
                sorted: given,
                as_given: None,
            };
        }
        let mut sorted = given.clone();
        sorted.sort();
        sorted.dedup();
        CallHosts {
            sorted,
            as_given: Some(given),
        }
    }
}

struct Inner {
    state: Mutex<State>,
    calls: Mutex<Vec<Call>>,
    faults: Mutex<FaultPlan>,
    latency: Mutex<(Duration, BTreeMap<Method, Duration>)>,
    hook: Mutex<Option<CallHook>>,
    quota: Mutex<Option<Quota>>,
    events: Mutex<Vec<ScheduledEvent>>,
    parts: Parts,
    batching: bool,
    default_zone: String,
    clusters: BTreeMap<String, String>,
    /// What `supported_platforms` answers.
    platforms: Vec<String>,
    /// Load balancers that carry traffic on loopback addresses, when asked for.
    data_plane: Option<crate::data_plane::DataPlane>,
}

/// An in-memory cloud of instances, load balancers and routes, registered as `fake`.
///
/// Cheap to clone: clones share the same cloud, so a test keeps one handle while the
/// controllers use another. Safe to use from many tasks at once.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use cloud_provider::{CloudProvider, InstancesV2};
/// use cloud_provider_fake::{Call, FakeCloud, FakeInstance};
///
/// let cloud = FakeCloud::builder()
///     .instance(FakeInstance::new("i-1", "node-a").with_internal_ip("10.0.0.1".parse().unwrap()))
///     .build();
/// let mut node = k8s_openapi::api::core::v1::Node::default();
/// node.metadata.name = Some("node-a".into());
/// let meta = cloud.instances_v2().unwrap().instance_metadata(&node).await.unwrap().unwrap();
/// assert_eq!(meta.provider_id, "fake://i-1");
/// assert_eq!(cloud.calls(), vec![Call::InstanceMetadata { node: "node-a".into() }]);
/// # }
/// ```
#[derive(Clone)]
pub struct FakeCloud {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for FakeCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.state.lock();
        f.debug_struct("FakeCloud")
            .field("instances", &state.instances.len())
            .field("load_balancers", &state.load_balancers.len())
            .field("routes", &state.routes.len())
            .finish()
    }
}

/// Builds a [`FakeCloud`].
#[derive(Debug)]
pub struct FakeCloudBuilder {
    seed: u64,
    latency: Duration,
    parts: Parts,
    batching: bool,
    default_zone: String,
    clusters: BTreeMap<String, String>,
    instances: Vec<FakeInstance>,
    routes: Vec<FakeRoute>,
    faults: Vec<FaultRule>,
    quota: Option<(f64, u32)>,
    platforms: Vec<String>,
    serve_load_balancers: Option<Ipv4Addr>,
    load_balancer_limits: Option<crate::LoadBalancerLimits>,
}

impl Default for FakeCloudBuilder {
    fn default() -> Self {
        FakeCloudBuilder {
            seed: 0,
            latency: Duration::ZERO,
            parts: Parts::default(),
            batching: true,
            default_zone: "fake-zone-a".to_owned(),
            clusters: BTreeMap::new(),
            instances: Vec::new(),
            routes: Vec::new(),
            faults: Vec::new(),
            quota: None,
            platforms: Vec::new(),
            serve_load_balancers: None,
            load_balancer_limits: None,
        }
    }
}

impl FakeCloudBuilder {
    /// The seed for fault decisions (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Latency added to every call.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Which parts are supported.
    pub fn parts(mut self, parts: Parts) -> Self {
        self.parts = parts;
        self
    }

    /// Whether `instance_metadata_batch` is one cloud call (default) or one call per Node, as
    /// a provider without batching would behave.
    pub fn batching(mut self, batching: bool) -> Self {
        self.batching = batching;
        self
    }

    /// The zone `get_zone` reports.
    pub fn default_zone(mut self, zone: impl Into<String>) -> Self {
        self.default_zone = zone.into();
        self
    }

    /// Clusters and their master addresses, for `Clusters`.
    pub fn clusters(mut self, clusters: BTreeMap<String, String>) -> Self {
        self.clusters = clusters;
        self
    }

    /// Adds an instance.
    pub fn instance(mut self, instance: FakeInstance) -> Self {
        self.instances.push(instance);
        self
    }

    /// Adds instances.
    pub fn instances(mut self, instances: impl IntoIterator<Item = FakeInstance>) -> Self {
        self.instances.extend(instances);
        self
    }

    /// Adds routes.
    pub fn routes(mut self, routes: impl IntoIterator<Item = FakeRoute>) -> Self {
        self.routes.extend(routes);
        self
    }

    /// A cloud-side API quota: `calls_per_second` on average, bursts of `burst`; calls over
    /// it are refused as throttled with a retry-after (see [`FakeCloud::set_quota`]).
    pub fn quota(mut self, calls_per_second: f64, burst: u32) -> Self {
        self.quota = Some((calls_per_second, burst));
        self
    }

    /// The platforms whose Nodes this cloud's controller manager owns
    /// ([`CloudProvider::supported_platforms`]); none (the default) owns every Node. Two fake
    /// clouds under two platform names stand for two clouds in one cluster.
    pub fn platforms<I, S>(mut self, platforms: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.platforms = platforms.into_iter().map(Into::into).collect();
        self
    }

    /// Load balancers carry traffic: each gets a loopback ingress address, `base + 1`
    /// onwards within its /16 (the next free one when another process holds one), listens
    /// there on its Service's TCP ports and splices each connection to a backend node's
    /// node port, only to nodes whose health-check port answers 200 when the Service has
    /// one (`externalTrafficPolicy: Local`). For a cluster whose nodes' addresses are
    /// reachable on this machine, such as simulated nodes on loopback addresses. The
    /// connections are bounded by [`load_balancer_limits`](Self::load_balancer_limits).
    pub fn serve_load_balancers(mut self, base: Ipv4Addr) -> Self {
        self.serve_load_balancers = Some(base);
        self
    }

    /// The bounds of the served load balancers' connections (see
    /// [`serve_load_balancers`](Self::serve_load_balancers)): their idle timeout, their cap
    /// per listener and the descriptor budget they draw on. Default:
    /// [`LoadBalancerLimits::default`](crate::LoadBalancerLimits::default), 60 s idle (an
    /// AWS Classic or Application Load Balancer's default), 1,024 connections per listener,
    /// the process's descriptor budget.
    pub fn load_balancer_limits(mut self, limits: crate::LoadBalancerLimits) -> Self {
        self.load_balancer_limits = Some(limits);
        self
    }

    /// Adds a fault rule.
    pub fn fault(mut self, rule: FaultRule) -> Self {
        self.faults.push(rule);
        self
    }

    /// The cloud.
    pub fn build(self) -> FakeCloud {
        let mut plan = FaultPlan::new(self.seed);
        for rule in self.faults {
            plan.add(rule);
        }
        let state = State {
            instances: self
                .instances
                .into_iter()
                .map(|i| (i.id.clone(), i))
                .collect(),
            routes: self
                .routes
                .into_iter()
                .map(|r| ((r.cluster.clone(), r.cidr), r))
                .collect(),
            ..State::default()
        };
        FakeCloud {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                calls: Mutex::new(Vec::new()),
                faults: Mutex::new(plan),
                latency: Mutex::new((self.latency, BTreeMap::new())),
                hook: Mutex::new(None),
                quota: Mutex::new(self.quota.map(|(rate, burst)| Quota::new(rate, burst))),
                events: Mutex::new(Vec::new()),
                parts: self.parts,
                batching: self.batching,
                default_zone: self.default_zone,
                clusters: self.clusters,
                platforms: self.platforms,
                data_plane: self.serve_load_balancers.map(|base| {
                    crate::data_plane::DataPlane::new(
                        base,
                        self.load_balancer_limits.unwrap_or_default(),
                    )
                }),
            }),
        }
    }
}

fn name_of(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn key_of(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn instance_id_from_provider_id(provider_id: &str) -> CloudResult<&str> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|id| !id.is_empty() && !id.contains('/'))
        .ok_or_else(|| {
            CloudError::message(format!(
                "invalid provider ID {provider_id:?}: want {PROVIDER_ID_PREFIX}<instance-id>"
            ))
        })
}

impl FakeCloud {
    /// A builder.
    pub fn builder() -> FakeCloudBuilder {
        FakeCloudBuilder::default()
    }

    /// An empty cloud with every part supported.
    pub fn new() -> Self {
        FakeCloud::builder().build()
    }

    /// Builds a cloud from a TOML config (see the [`config`](crate::config) module). `path`
    /// names the file in error messages.
    pub fn from_config(text: &str, path: &str) -> Result<FakeCloud, crate::FakeConfigError> {
        crate::config::parse(text, path)
    }

    // ----- instances -----

    /// Adds (or replaces) an instance while the cloud runs.
    pub fn add_instance(&self, instance: FakeInstance) {
        self.inner
            .state
            .lock()
            .instances
            .insert(instance.id.clone(), instance);
    }

    /// Sets an instance's state. Returns false if there is no such instance.
    pub fn set_instance_state(&self, id: &str, state: InstanceState) -> bool {
        match self.inner.state.lock().instances.get_mut(id) {
            Some(instance) => {
                instance.state = state;
                true
            }
            None => false,
        }
    }

    /// Stops an instance (it still exists, shut down).
    pub fn stop_instance(&self, id: &str) -> bool {
        self.set_instance_state(id, InstanceState::Stopped)
    }

    /// Starts a stopped instance.
    pub fn start_instance(&self, id: &str) -> bool {
        self.set_instance_state(id, InstanceState::Running)
    }

    /// Terminates an instance: the cloud reports it as not found from now on.
    pub fn terminate_instance(&self, id: &str) -> bool {
        self.set_instance_state(id, InstanceState::Terminated)
    }

    /// Removes an instance entirely. Returns it, if it existed.
    pub fn remove_instance(&self, id: &str) -> Option<FakeInstance> {
        self.inner.state.lock().instances.remove(id)
    }

    /// One instance, by ID.
    pub fn instance(&self, id: &str) -> Option<FakeInstance> {
        self.inner.state.lock().instances.get(id).cloned()
    }

    /// Every instance, sorted by ID.
    pub fn instances(&self) -> Vec<FakeInstance> {
        self.inner
            .state
            .lock()
            .instances
            .values()
            .cloned()
            .collect()
    }

    // ----- load balancers and routes -----

    /// Every load balancer, sorted by name.
    pub fn load_balancers(&self) -> Vec<FakeLoadBalancer> {
        self.inner
            .state
            .lock()
            .load_balancers
            .values()
            .cloned()
            .collect()
    }

    /// The load balancer of a Service, if it exists.
    pub fn load_balancer_of(&self, service: &Service) -> Option<FakeLoadBalancer> {
        let name = cloud_provider::helpers::service::default_load_balancer_name(service);
        self.inner.state.lock().load_balancers.get(&name).cloned()
    }

    /// The routes of a cluster, sorted by CIDR.
    pub fn routes(&self, cluster: &str) -> Vec<FakeRoute> {
        self.inner
            .state
            .lock()
            .routes
            .values()
            .filter(|r| r.cluster == cluster)
            .cloned()
            .collect()
    }

    /// Adds a route directly (for example a stale or blackhole one), bypassing `create_route`.
    pub fn add_route(&self, route: FakeRoute) {
        self.inner
            .state
            .lock()
            .routes
            .insert((route.cluster.clone(), route.cidr), route);
    }

    // ----- calls, faults, latency, hooks -----

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.calls.lock().clone()
    }

    /// Every call so far, clearing the record.
    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.inner.calls.lock())
    }

    /// Clears the call record.
    pub fn clear_calls(&self) {
        self.inner.calls.lock().clear();
    }

    /// How many calls were made to `method`.
    pub fn call_count(&self, method: Method) -> usize {
        self.inner
            .calls
            .lock()
            .iter()
            .filter(|c| c.method() == method)
            .count()
    }

    /// How many calls were made in all.
    pub fn total_calls(&self) -> usize {
        self.inner.calls.lock().len()
    }

    /// Adds a fault rule.
    pub fn inject(&self, rule: FaultRule) {
        self.inner.faults.lock().add(rule);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.inner.faults.lock().clear();
    }

    /// Schedules an event (maintenance, reboot, retirement, spot interruption) for an
    /// instance; [`InstancesV2::scheduled_events`] reports it until it is cleared.
    pub fn schedule_event(&self, event: ScheduledEvent) {
        self.inner.events.lock().push(event);
    }

    /// Clears the scheduled events of the instance with this provider ID (the event passed).
    pub fn clear_scheduled_events(&self, provider_id: &str) {
        self.inner
            .events
            .lock()
            .retain(|e| e.provider_id != provider_id);
    }

    /// Sets (or with `None` removes) the cloud-side API quota: `(calls per second, burst)`.
    /// Every call, whatever its method, spends one token; a call over the quota is recorded,
    /// waits its latency and fails with [`CloudError::Throttled`] carrying the time until the
    /// next token, as a real cloud's HTTP 429 does.
    pub fn set_quota(&self, quota: Option<(f64, u32)>) {
        *self.inner.quota.lock() = quota.map(|(rate, burst)| Quota::new(rate, burst));
    }

    /// How many calls the quota refused since it was set.
    pub fn throttled_calls(&self) -> u64 {
        self.inner.quota.lock().as_ref().map_or(0, Quota::refused)
    }

    /// Sets the latency of every call.
    pub fn set_latency(&self, latency: Duration) {
        self.inner.latency.lock().0 = latency;
    }

    /// Sets the latency of one method, overriding the general latency.
    pub fn set_method_latency(&self, method: Method, latency: Duration) {
        self.inner.latency.lock().1.insert(method, latency);
    }

    /// The general latency.
    pub fn latency(&self) -> Duration {
        self.inner.latency.lock().0
    }

    /// Sets a hook awaited on every call. See [`CallHook`].
    pub fn set_call_hook(&self, hook: Option<CallHook>) {
        *self.inner.hook.lock() = hook;
    }

    /// Which parts are supported.
    pub fn parts(&self) -> Parts {
        self.inner.parts
    }

    /// Records a call, waits its latency and hook, then decides its fault.
    async fn call(&self, call: Call) -> CloudResult<()> {
        let method = call.method();
        self.inner.calls.lock().push(call.clone());
        let admitted = self
            .inner
            .quota
            .lock()
            .as_mut()
            .map_or(Ok(()), Quota::admit);
        let latency = {
            let latency = self.inner.latency.lock();
            latency.1.get(&method).copied().unwrap_or(latency.0)
        };
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let hook = self.inner.hook.lock().clone();
        if let Some(hook) = hook {
            hook(call).await;
        }
        if let Err(throttled) = admitted {
            tracing::debug!(%method, "fake cloud: over the API quota");
            return Err(throttled);
        }
        let fault = self.inner.faults.lock().decide(method);
        match fault {
            Some(fault) => {
                tracing::debug!(%method, ?fault, "fake cloud: injected fault");
                Err(fault.to_error(method))
            }
            None => Ok(()),
        }
    }

    /// The instance behind a Node: by `spec.providerID` if set, else by name.
    fn find_for_node(&self, node: &Node) -> CloudResult<FakeInstance> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .filter(|p| !p.is_empty());
        match provider_id {
            Some(pid) => self.find_by_provider_id(pid),
            None => self.find_by_name(name_of(node)),
        }
    }

    fn find_by_provider_id(&self, provider_id: &str) -> CloudResult<FakeInstance> {
        let id = instance_id_from_provider_id(provider_id)?;
        self.inner
            .state
            .lock()
            .instances
            .get(id)
            .filter(|i| i.state.exists())
            .cloned()
            .ok_or(CloudError::InstanceNotFound)
    }

    fn find_by_name(&self, name: &str) -> CloudResult<FakeInstance> {
        self.inner
            .state
            .lock()
            .instances
            .values()
            .find(|i| i.name == name && i.state.exists())
            .cloned()
            .ok_or(CloudError::InstanceNotFound)
    }

    fn metadata_of(instance: &FakeInstance) -> InstanceMetadata {
        let mut meta = InstanceMetadata::new(instance.provider_id())
            .with_instance_type(instance.instance_type.clone())
            .with_zone(instance.zone.clone(), instance.region.clone())
            .with_addresses(instance.addresses.clone());
        meta.additional_labels = instance.labels.clone();
        meta
    }

    fn lookup_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.find_for_node(node)
            .map(|i| Some(Self::metadata_of(&i)))
    }

    /// A new ingress address: a loopback one when load balancers are served (IPv4), else
    /// [`allocate_address`](Self::allocate_address)'s.
    fn next_address(&self, state: &mut State, ipv6: bool) -> IpAddr {
        match &self.inner.data_plane {
            Some(plane) if !ipv6 => {
                state.next_lb_address += 1;
                plane.address(state.next_lb_address)
            }
            _ => Self::allocate_address(state, ipv6),
        }
    }

    fn allocate_address(state: &mut State, ipv6: bool) -> IpAddr {
        state.next_lb_address += 1;
        let n = state.next_lb_address;
        if ipv6 {
            // fd00:198:18::/64, a unique-local range.
            IpAddr::V6(Ipv6Addr::new(
                0xfd00,
                0x198,
                0x18,
                0,
                0,
                0,
                (n >> 16) as u16,
                n as u16,
            ))
        } else {
            // 198.18.0.0/15, the benchmarking range: 131,070 load balancers before it wraps.
            let offset = n % 131_070;
            IpAddr::V4(Ipv4Addr::from(
                u32::from(Ipv4Addr::new(198, 18, 0, 0)) + offset,
            ))
        }
    }
}

impl Default for FakeCloud {
    fn default() -> Self {
        FakeCloud::new()
    }
}

#[async_trait]
impl CloudProvider for FakeCloud {
    fn provider_name(&self) -> &str {
        crate::PROVIDER_NAME
    }

    fn supported_platforms(&self) -> Vec<String> {
        self.inner.platforms.clone()
    }

    fn load_balancer(&self) -> Option<&dyn LoadBalancer> {
        self.inner
            .parts
            .load_balancer
            .then_some(self as &dyn LoadBalancer)
    }

    fn instances(&self) -> Option<&dyn Instances> {
        self.inner.parts.instances.then_some(self as &dyn Instances)
    }

    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        self.inner
            .parts
            .instances_v2
            .then_some(self as &dyn InstancesV2)
    }

    fn zones(&self) -> Option<&dyn Zones> {
        self.inner.parts.zones.then_some(self as &dyn Zones)
    }

    fn clusters(&self) -> Option<&dyn Clusters> {
        self.inner.parts.clusters.then_some(self as &dyn Clusters)
    }

    fn routes(&self) -> Option<&dyn Routes> {
        self.inner.parts.routes.then_some(self as &dyn Routes)
    }
}

#[async_trait]
impl InstancesV2 for FakeCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        self.call(Call::InstanceExists {
            node: name_of(node).to_owned(),
        })
        .await?;
        match self.find_for_node(node) {
            Ok(_) => Ok(true),
            Err(e) if e.is_instance_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        self.call(Call::InstanceShutdown {
            node: name_of(node).to_owned(),
        })
        .await?;
        Ok(self.find_for_node(node)?.state == InstanceState::Stopped)
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        self.call(Call::InstanceMetadata {
            node: name_of(node).to_owned(),
        })
        .await?;
        self.lookup_metadata(node)
    }

    async fn scheduled_events(&self) -> CloudResult<Vec<ScheduledEvent>> {
        self.call(Call::ScheduledEvents).await?;
        Ok(self.inner.events.lock().clone())
    }

    /// One recorded call (and one latency) for the whole batch, unless batching is off.
    async fn instance_metadata_batch(
        &self,
        nodes: &[&Node],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        if !self.inner.batching {
            let mut results = Vec::with_capacity(nodes.len());
            for node in nodes {
                results.push(self.instance_metadata(node).await);
            }
            return results;
        }
        let call = Call::InstanceMetadataBatch {
            nodes: nodes.iter().map(|n| name_of(n).to_owned()).collect(),
        };
        if let Err(e) = self.call(call).await {
            // A failed bulk call fails every lookup in it, as a real bulk API would.
            let message = e.to_string();
            return nodes
                .iter()
                .map(|_| {
                    Err(match e.kind() {
                        cloud_provider::ErrorKind::InstanceNotFound => CloudError::InstanceNotFound,
                        _ => match e.retry_after_delay() {
                            Some(after) => CloudError::retry_after(after, message.clone()),
                            None => CloudError::message(message.clone()),
                        },
                    })
                })
                .collect();
        }
        nodes
            .iter()
            .map(|node| self.lookup_metadata(node))
            .collect()
    }
}

#[async_trait]
impl Instances for FakeCloud {
    async fn node_addresses(&self, node_name: &str) -> CloudResult<Vec<NodeAddress>> {
        self.call(Call::NodeAddresses {
            node_name: node_name.to_owned(),
        })
        .await?;
        Ok(self.find_by_name(node_name)?.addresses)
    }

    async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> CloudResult<Vec<NodeAddress>> {
        self.call(Call::NodeAddressesByProviderId {
            provider_id: provider_id.to_owned(),
        })
        .await?;
        Ok(self.find_by_provider_id(provider_id)?.addresses)
    }

    async fn instance_id(&self, node_name: &str) -> CloudResult<String> {
        self.call(Call::InstanceId {
            node_name: node_name.to_owned(),
        })
        .await?;
        Ok(self.find_by_name(node_name)?.id)
    }

    async fn instance_type(&self, node_name: &str) -> CloudResult<String> {
        self.call(Call::InstanceType {
            node_name: node_name.to_owned(),
        })
        .await?;
        Ok(self.find_by_name(node_name)?.instance_type)
    }

    async fn instance_type_by_provider_id(&self, provider_id: &str) -> CloudResult<String> {
        self.call(Call::InstanceTypeByProviderId {
            provider_id: provider_id.to_owned(),
        })
        .await?;
        Ok(self.find_by_provider_id(provider_id)?.instance_type)
    }

    async fn add_ssh_key_to_all_instances(&self, user: &str, _key_data: &[u8]) -> CloudResult<()> {
        self.call(Call::AddSshKeyToAllInstances {
            user: user.to_owned(),
        })
        .await?;
        Err(CloudError::NotImplemented)
    }

    async fn current_node_name(&self, hostname: &str) -> CloudResult<String> {
        self.call(Call::CurrentNodeName {
            hostname: hostname.to_owned(),
        })
        .await?;
        Ok(hostname.to_owned())
    }

    async fn instance_exists_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        self.call(Call::InstanceExistsByProviderId {
            provider_id: provider_id.to_owned(),
        })
        .await?;
        match self.find_by_provider_id(provider_id) {
            Ok(_) => Ok(true),
            Err(e) if e.is_instance_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn instance_shutdown_by_provider_id(&self, provider_id: &str) -> CloudResult<bool> {
        self.call(Call::InstanceShutdownByProviderId {
            provider_id: provider_id.to_owned(),
        })
        .await?;
        Ok(self.find_by_provider_id(provider_id)?.state == InstanceState::Stopped)
    }
}

#[async_trait]
impl Zones for FakeCloud {
    async fn get_zone(&self) -> CloudResult<Zone> {
        self.call(Call::GetZone).await?;
        let region = self
            .inner
            .state
            .lock()
            .instances
            .values()
            .next()
            .map_or_else(|| "fake-region-1".to_owned(), |i| i.region.clone());
        Ok(Zone::new(self.inner.default_zone.clone(), region))
    }

    async fn get_zone_by_provider_id(&self, provider_id: &str) -> CloudResult<Zone> {
        self.call(Call::GetZoneByProviderId {
            provider_id: provider_id.to_owned(),
        })
        .await?;
        let i = self.find_by_provider_id(provider_id)?;
        Ok(Zone::new(i.zone, i.region))
    }

    async fn get_zone_by_node_name(&self, node_name: &str) -> CloudResult<Zone> {
        self.call(Call::GetZoneByNodeName {
            node_name: node_name.to_owned(),
        })
        .await?;
        let i = self.find_by_name(node_name)?;
        Ok(Zone::new(i.zone, i.region))
    }
}

fn listeners_of(service: &Service) -> CloudResult<Vec<FakeListener>> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    if ports.is_empty() {
        return Err(CloudError::message(format!(
            "service {} has no ports",
            key_of(service)
        )));
    }
    ports
        .iter()
        .map(|p| match p.node_port {
            Some(node_port) if node_port > 0 => Ok(FakeListener {
                port: p.port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                node_port,
            }),
            _ => Err(CloudError::message(format!(
                "service {} port {} has no node port to forward to",
                key_of(service),
                p.port
            ))),
        })
        .collect()
}

fn status_of(lb: &FakeLoadBalancer) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress {
            ip: Some(lb.ip.to_string()),
            ip_mode: Some("VIP".to_owned()),
            ports: Some(
                lb.listeners
                    .iter()
                    .map(|l| PortStatus {
                        port: l.port,
                        protocol: l.protocol.clone(),
                        error: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        }]),
    }
}

#[async_trait]
impl LoadBalancer for FakeCloud {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        self.call(Call::GetLoadBalancer {
            cluster: cluster_name.to_owned(),
            service: key_of(service),
        })
        .await?;
        let name = self.get_load_balancer_name(cluster_name, service);
        Ok(self
            .inner
            .state
            .lock()
            .load_balancers
            .get(&name)
            .map(status_of))
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let call_hosts = CallHosts::of(nodes);
        let (logged, hosts) = self.inner.state.lock().host_lists.for_call(call_hosts);
        self.call(Call::EnsureLoadBalancer {
            cluster: cluster_name.to_owned(),
            service: key_of(service),
            hosts: logged,
        })
        .await?;
        let listeners = listeners_of(service)?;
        let source_ranges = load_balancer_source_ranges(service).map_err(CloudError::other)?;
        let spec = service.spec.as_ref();
        let requested_ip = spec
            .and_then(|s| s.load_balancer_ip.as_deref())
            .filter(|ip| !ip.is_empty())
            .map(|ip| {
                ip.parse::<IpAddr>().map_err(|_| {
                    CloudError::message(format!(
                        "service {} asks for load balancer IP {ip:?}, which is not an IP",
                        key_of(service)
                    ))
                })
            })
            .transpose()?;
        let ipv6 = spec
            .and_then(|s| s.ip_families.as_ref())
            .and_then(|f| f.first())
            .is_some_and(|f| f == "IPv6");
        let name = self.get_load_balancer_name(cluster_name, service);

        let health_check = health_check_path_port(service).map(|(p, port)| (p.to_owned(), port));
        let (ip, fresh) = {
            let mut state = self.inner.state.lock();
            match (requested_ip, state.load_balancers.get(&name)) {
                (Some(ip), _) => (ip, false),
                (None, Some(existing)) => (existing.ip, false),
                (None, None) => (self.next_address(&mut state, ipv6), true),
            }
        };
        let ip = match &self.inner.data_plane {
            Some(plane) => {
                let backends = crate::data_plane::Backends {
                    nodes: nodes
                        .iter()
                        .filter_map(|n| crate::data_plane::node_address(n))
                        .collect(),
                    health_check: health_check
                        .as_ref()
                        .and_then(|(p, port)| Some((p.clone(), u16::try_from(*port).ok()?))),
                    source_ranges: source_ranges.clone(),
                };
                let tcp: Vec<(u16, u16)> = listeners
                    .iter()
                    .filter(|l| l.protocol == "TCP")
                    .filter_map(|l| {
                        Some((
                            u16::try_from(l.port).ok()?,
                            u16::try_from(l.node_port).ok()?,
                        ))
                    })
                    .collect();
                plane
                    .serve(&name, ip, fresh, &tcp, backends, || {
                        self.next_address(&mut self.inner.state.lock(), ipv6)
                    })
                    .await
                    .map_err(CloudError::message)?
            }
            None => ip,
        };
        let mut state = self.inner.state.lock();
        let lb = FakeLoadBalancer {
            name: name.clone(),
            cluster: cluster_name.to_owned(),
            service: key_of(service),
            ip,
            listeners,
            hosts,
            source_ranges,
            health_check,
        };
        let status = status_of(&lb);
        state.load_balancers.insert(name, lb);
        Ok(status)
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let call_hosts = CallHosts::of(nodes);
        let (logged, hosts) = self.inner.state.lock().host_lists.for_call(call_hosts);
        self.call(Call::UpdateLoadBalancer {
            cluster: cluster_name.to_owned(),
            service: key_of(service),
            hosts: logged,
        })
        .await?;
        let name = self.get_load_balancer_name(cluster_name, service);
        let mut state = self.inner.state.lock();
        let lb = state.load_balancers.get_mut(&name).ok_or_else(|| {
            CloudError::message(format!(
                "load balancer {name} for service {} not found",
                key_of(service)
            ))
        })?;
        lb.hosts = hosts;
        drop(state);
        if let Some(plane) = &self.inner.data_plane {
            plane.set_nodes(
                &name,
                nodes
                    .iter()
                    .filter_map(|n| crate::data_plane::node_address(n))
                    .collect(),
            );
        }
        Ok(())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        self.call(Call::EnsureLoadBalancerDeleted {
            cluster: cluster_name.to_owned(),
            service: key_of(service),
        })
        .await?;
        let name = self.get_load_balancer_name(cluster_name, service);
        self.inner.state.lock().load_balancers.remove(&name);
        if let Some(plane) = &self.inner.data_plane {
            plane.remove(&name);
        }
        Ok(())
    }

    /// The load balancers made for `cluster_name` (each remembers its cluster and Service).
    async fn list_load_balancers(
        &self,
        cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        self.call(Call::ListLoadBalancers {
            cluster: cluster_name.to_owned(),
        })
        .await?;
        let state = self.inner.state.lock();
        Ok(state
            .load_balancers
            .values()
            .filter(|lb| lb.cluster == cluster_name)
            .map(|lb| {
                let (namespace, service) = lb.service.split_once('/').unwrap_or(("", ""));
                ClusterLoadBalancer::new(lb.name.clone(), namespace, service)
            })
            .collect())
    }

    async fn ensure_listed_load_balancer_deleted(
        &self,
        cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        self.call(Call::EnsureListedLoadBalancerDeleted {
            cluster: cluster_name.to_owned(),
            name: load_balancer.name.clone(),
        })
        .await?;
        let mut state = self.inner.state.lock();
        if state
            .load_balancers
            .get(&load_balancer.name)
            .is_some_and(|lb| lb.cluster == cluster_name)
        {
            state.load_balancers.remove(&load_balancer.name);
            drop(state);
            if let Some(plane) = &self.inner.data_plane {
                plane.remove(&load_balancer.name);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Routes for FakeCloud {
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        self.call(Call::ListRoutes {
            cluster: cluster_name.to_owned(),
        })
        .await?;
        let state = self.inner.state.lock();
        Ok(state
            .routes
            .values()
            .filter(|r| r.cluster == cluster_name)
            .map(|r| {
                // A route to an instance that is gone is a blackhole, as on real clouds.
                let target_alive = state
                    .instances
                    .values()
                    .any(|i| i.name == r.target_node && i.state.exists());
                Route::new(r.target_node.clone(), r.cidr)
                    .with_name(r.name.clone())
                    .with_blackhole(r.blackhole || !target_alive)
            })
            .collect())
    }

    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        self.call(Call::CreateRoute {
            cluster: cluster_name.to_owned(),
            name_hint: name_hint.to_owned(),
            cidr: route.destination_cidr,
            target_node: route.target_node.clone(),
        })
        .await?;
        let mut state = self.inner.state.lock();
        if !state
            .instances
            .values()
            .any(|i| i.name == route.target_node && i.state.exists())
        {
            return Err(CloudError::context(
                format!(
                    "create route {} to node {:?}",
                    route.destination_cidr, route.target_node
                ),
                CloudError::InstanceNotFound,
            ));
        }
        let key = (cluster_name.to_owned(), route.destination_cidr);
        if state.routes.contains_key(&key) {
            return Err(CloudError::message(format!(
                "route for {} already exists in cluster {cluster_name:?}",
                route.destination_cidr
            )));
        }
        let created = FakeRoute::new(
            cluster_name,
            name_hint,
            route.destination_cidr,
            &route.target_node,
        );
        state.routes.insert(key, created);
        Ok(())
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> CloudResult<()> {
        self.call(Call::DeleteRoute {
            cluster: cluster_name.to_owned(),
            cidr: route.destination_cidr,
            target_node: route.target_node.clone(),
        })
        .await?;
        let key = (cluster_name.to_owned(), route.destination_cidr);
        match self.inner.state.lock().routes.remove(&key) {
            Some(_) => Ok(()),
            None => Err(CloudError::message(format!(
                "route for {} not found in cluster {cluster_name:?}",
                route.destination_cidr
            ))),
        }
    }
}

#[async_trait]
impl Clusters for FakeCloud {
    async fn list_clusters(&self) -> CloudResult<Vec<String>> {
        self.call(Call::ListClusters).await?;
        Ok(self.inner.clusters.keys().cloned().collect())
    }

    async fn master(&self, cluster_name: &str) -> CloudResult<String> {
        self.call(Call::Master {
            cluster: cluster_name.to_owned(),
        })
        .await?;
        self.inner
            .clusters
            .get(cluster_name)
            .cloned()
            .ok_or_else(|| CloudError::message(format!("unknown cluster {cluster_name:?}")))
    }
}
