//! # core-cluster-sim: a kubelet stand-in simulating many nodes in one process (in the spirit of kwok)
//!
//! [`NodeSimulator`] plays the kubelet of every node added with
//! [`add_nodes`](NodeSimulator::add_nodes), through kube-rs only:
//!
//! - **registration** as kubelet does: the Node with kubelet's labels, `--node-labels`,
//!   `--register-with-taints`, capacity, nodeInfo, addresses and the conditions
//!   (`Ready=True`/`KubeletReady`, the three pressure conditions `False`), then its Lease
//!   `kube-node-lease/<node>` (holder = node, `leaseDurationSeconds`, an ownerReference to the
//!   Node);
//! - **heartbeats**: the Lease renewed every `node_lease_duration / 4` (10 s, 4 % jitter) by
//!   a PUT of the cached Lease, a GET on conflict, backoff from 200 ms doubling to 7 s when
//!   the API fails; node status computed every 10 s and posted when it differs from what
//!   the API shows or every 5 minutes;
//! - **pods** bound to its nodes go `Running` (podIP, ready containers, `Ready` and
//!   `ContainersReady` conditions); a terminating pod is finished with a delete of grace 0;
//!   a pod annotated `sim.ccm-rs.io/run-duration` (`30s`) exits after that long with
//!   `sim.ccm-rs.io/exit-code` (default 0): `Succeeded`/`Failed` under `restartPolicy:
//!   Never`, a counted container restart under `Always` (and `OnFailure` when it failed);
//!   a running pod whose `Ready` condition someone else set to False (the node lifecycle
//!   controller's `MarkPodsNotReady` while the node was unreachable) gets `Ready=True` back
//!   while its containers are ready, as kubelet's status manager reconciles;
//!   how long containers run and how they exit follows kwok-style rules ([`RunRule`],
//!   [`run_plan`]): Job pods, `helm test` pods and `restartPolicy: Never` pods given a
//!   command end, servers run until deleted;
//! - **graceful node shutdown** by pod priority ([`shutdown_node`](NodeSimulator::shutdown_node),
//!   or the Node annotation `sim.ccm-rs.io/shutdown=true` from kubectl).
//!
//! Timers are tokio timers (one task per node, sleeping), so tests run with paused time;
//! timestamps written to the API (`renewTime`, `lastHeartbeatTime`, `startTime`) follow the
//! tokio clock from the wall-clock time the simulator was created
//! ([`WallClock`]).
//!
//! The simulator stands on `core-cluster-machinery` only (the clock) and reaches the API
//! server through its API, as a kubelet does: it may not depend on the API server, the
//! store or the controllers.
//!
//! ## Fault injection with kubectl
//!
//! A simulated node whose heartbeats are stopped behaves like a node whose kubelet is
//! unreachable: no Lease renewals, no status posts, and its pods are left as they are
//! (pods are not started nor finished) until heartbeats resume.
//!
//! - Per node, the annotation `sim.ccm-rs.io/heartbeat` on the Node:
//!   - `stopped`: heartbeats stop;
//!   - `running` (or no annotation): heartbeats run;
//!   - `flapping`: alternately stopped and running, each for `sim.ccm-rs.io/flap-period`
//!     seconds (default 30), starting stopped.
//!
//!   ```sh
//!   kubectl annotate node sim-0001 sim.ccm-rs.io/heartbeat=stopped --overwrite
//!   kubectl annotate node sim-0001 sim.ccm-rs.io/heartbeat=flapping sim.ccm-rs.io/flap-period=20 --overwrite
//!   kubectl annotate node sim-0001 sim.ccm-rs.io/heartbeat-   # running again
//!   ```
//!
//! - A whole zone (nodes added with that zone): the ConfigMap `kube-system/node-simulator`
//!   with `data.stopped-zones`, a comma-separated list:
//!
//!   ```sh
//!   kubectl -n kube-system apply -f - <<EOF
//!   apiVersion: v1
//!   kind: ConfigMap
//!   metadata: {name: node-simulator}
//!   data: {stopped-zones: "zone-a,zone-b"}
//!   EOF
//!   ```
//!
//! Tests use the same controls directly: [`stop_heartbeats`](NodeSimulator::stop_heartbeats),
//! [`resume_heartbeats`](NodeSimulator::resume_heartbeats). A node's heartbeats run only when
//! none of the controls stops them.

mod agent_tunnel;
mod config;
mod container_gc;
mod ephemeral;
mod eviction;
mod identity;
mod images;
mod kubelet_api;
mod node;
mod node_config;
mod pods;
mod registration;
mod service_proxy;
mod shutdown;
mod stages;
mod swap;
mod topology;

use std::{
    collections::{BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    Api, Client, ResourceExt,
    runtime::{WatchStreamExt, watcher},
};
use parking_lot::{Mutex, RwLock};
use tokio::{
    sync::{Notify, Semaphore, mpsc},
    task::JoinSet,
    time::Instant,
};
use tokio_util::sync::CancellationToken;

// The clock under the path this code has always used (`crate::clock::…`).
pub(crate) use core_cluster_machinery::clock;

use crate::clock::WallClock;

pub use agent_tunnel::{AgentCredentials, AgentTunnelConfig};
pub use config::{
    NodeInfo, NodeResources, PROVIDED_NODE_IP_ANNOTATION, SimConfig, SimConfigError,
    UNINITIALIZED_TAINT_KEY, uninitialized_taint,
};
pub use container_gc::{ContainerGcConfig, ContainerStore, DeadContainer};
pub use eviction::{
    ActivePod, DEFAULT_EVICTION_HARD, DISK_USAGE_ANNOTATION, EVICTED_REASON, EvictionConfig,
    FsObservation, IMAGEFS_FILL_ANNOTATION, NODEFS_FILL_ANNOTATION, Signal, Threshold,
    ThresholdValue, eviction_message, format_binary_si, parse_eviction_hard, rank_disk_pressure,
};
pub use images::{GcOutcome, ImageGcConfig, ImageStore, NODE_STATUS_MAX_IMAGES, image_size};
pub use kubelet_api::{
    CPU_USAGE_ANNOTATION, DEFAULT_KUBELET_PORT, DEFAULT_LOG_INTERVAL, KubeletApiConfig,
    KubeletAuthConfig, KubeletAuthorizationMode, LOG_INTERVAL_ANNOTATION, LOG_TEMPLATE_ANNOTATION,
    MEMORY_USAGE_ANNOTATION, ServingCa,
};
pub use node_config::{
    KUBELET_CONFIG_API_VERSION, KubeletConfiguration, MachineSpec, MemorySwap,
    NODE_CONFIG_API_VERSION, NODE_CONFIG_KIND, NodeConfigError, NodeConfigFile, NodeEntry,
    PriorityGracePeriod, parse_go_duration, parse_node_ip,
};
pub use registration::{
    KUBELET_LABEL_NAMESPACES, KUBELET_LABELS, allocatable, is_qualified_name, is_valid_label_value,
    parse_node_labels, parse_register_with_taints, parse_reserved,
};
pub use service_proxy::{
    ServiceProxyLimits, ServiceProxyLimitsError,
    process_descriptor_budget as service_proxy_descriptor_budget,
};
pub use shutdown::{
    SYSTEM_CRITICAL_PRIORITY, ShutdownPriorityGroup, group_by_priority, pod_priority,
    shutdown_groups,
};
pub use stages::{
    EXIT_CODE_ANNOTATION, HELM_HOOK_ANNOTATION, RUN_DURATION_ANNOTATION, RunPlan, RunRule,
    RunSelector, default_plan, parse_run_duration, plan as run_plan,
};
pub use swap::{
    CGROUP_V1_REASON, CGROUP_V1_WARNING, CgroupVersion, ContainerSwap, FAIL_CGROUP_V1_MESSAGE,
    FAIL_SWAP_ON_MESSAGE, SWAP_LIMIT_ANNOTATION, SwapBehavior, SwapConfig, calc_swap_for_burstable,
    container_limits as swap_container_limits, limit_annotation as swap_limit_annotation, pod_qos,
};
pub use topology::{
    MAX_NUMA_NODES, TOPOLOGY_AFFINITY_ERROR, TOPOLOGY_AFFINITY_MESSAGE, TopologyConfig,
    TopologyPolicy, TopologyScope,
};

/// Node annotation controlling a node's heartbeats: `stopped`, `running` or `flapping`.
pub const HEARTBEAT_ANNOTATION: &str = "sim.ccm-rs.io/heartbeat";
/// Node annotation: seconds of each stopped and running phase when flapping (default 30).
pub const FLAP_PERIOD_ANNOTATION: &str = "sim.ccm-rs.io/flap-period";
/// Node annotation: `true` shuts the node down as [`NodeSimulator::shutdown_node`] does
/// (graceful when a grace period is configured), once; the node then stays powered off.
pub const SHUTDOWN_ANNOTATION: &str = "sim.ccm-rs.io/shutdown";
/// Namespace of the simulator's ConfigMap.
pub const CONTROL_CONFIGMAP_NAMESPACE: &str = "kube-system";
/// Name of the simulator's ConfigMap.
pub const CONTROL_CONFIGMAP_NAME: &str = "node-simulator";
/// ConfigMap key: comma-separated zones whose nodes' heartbeats are stopped.
pub const STOPPED_ZONES_KEY: &str = "stopped-zones";
/// Flap period when `sim.ccm-rs.io/flap-period` is absent or invalid.
pub const DEFAULT_FLAP_PERIOD: Duration = Duration::from_secs(30);

/// Errors of the simulator's control methods.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The node is not simulated by this simulator.
    #[error("node {0:?} is not simulated here")]
    UnknownNode(String),
    /// `run` was called twice.
    #[error("the simulator is already running")]
    AlreadyRunning,
    /// An API call failed.
    #[error("API call failed: {0}")]
    Kube(#[from] kube::Error),
}

/// A node to simulate: its name, and optionally its zone, IP and own configuration.
#[derive(Debug, Clone)]
pub struct SimNode {
    /// Node name (also the hostname).
    pub name: String,
    /// `topology.kubernetes.io/zone` label; the unit of zone-wide fault injection.
    pub zone: Option<String>,
    /// The node IP as given with kubelet's `--node-ip`; when absent an InternalIP is taken
    /// from 10.0.0.0/9 by the node's order of addition.
    pub ip: Option<IpAddr>,
    /// The node's own kubelet configuration (from a simulator config file,
    /// [`NodeConfigFile`]); `None`: the simulator's.
    pub config: Option<Arc<SimConfig>>,
}

impl SimNode {
    /// A node with this name, no zone, no explicit IP, the simulator's configuration.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            zone: None,
            ip: None,
            config: None,
        }
    }

    /// Gives the node its own configuration.
    pub fn with_config(mut self, config: Arc<SimConfig>) -> Self {
        self.config = Some(config);
        self
    }

    /// Sets the zone.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// Sets the node IP (`--node-ip`).
    pub fn ip(mut self, ip: IpAddr) -> Self {
        self.ip = Some(ip);
        self
    }
}

impl From<&str> for SimNode {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<String> for SimNode {
    fn from(name: String) -> Self {
        Self::new(name)
    }
}

/// Counters of what the simulator has done, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Nodes registered (Node created or found, and Lease in place).
    pub registered: u64,
    /// Successful Lease renewals (PUTs).
    pub lease_renewals: u64,
    /// Leases created (at registration or after one was deleted).
    pub lease_creates: u64,
    /// Failed Lease API calls (PUT, GET or create).
    pub lease_errors: u64,
    /// Node status posts.
    pub status_posts: u64,
    /// Pods set Running.
    pub pods_started: u64,
    /// Terminating pods finished (deleted with grace 0).
    pub pods_finished: u64,
    /// Pods set Failed by a graceful node shutdown.
    pub pods_shut_down: u64,
    /// Pods evicted by the eviction manager.
    pub pods_evicted: u64,
}

#[derive(Default)]
struct Counters {
    registered: AtomicU64,
    lease_renewals: AtomicU64,
    lease_creates: AtomicU64,
    lease_errors: AtomicU64,
    status_posts: AtomicU64,
    pods_started: AtomicU64,
    pods_finished: AtomicU64,
    pods_shut_down: AtomicU64,
    pods_evicted: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// How the node annotation sets a node's heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeartbeatMode {
    Running,
    Stopped,
    Flapping { period: Duration, since: Instant },
}

/// The controls and observed state of one node.
#[derive(Debug)]
struct Control {
    manual_stopped: bool,
    annotation: HeartbeatMode,
    /// Graceful shutdown under way: Ready=False, new pods rejected.
    shutting_down: bool,
    /// Powered off: heartbeats stopped for good.
    powered_off: bool,
    /// A shutdown was asked for (by [`SHUTDOWN_ANNOTATION`] or
    /// [`NodeSimulator::shutdown_node`]): it runs once.
    shutdown_requested: bool,
    /// Why the node's kubelet refused to start (`failSwapOn`), if it did.
    startup_error: Option<String>,
    /// `(type, status)` of the conditions the API shows, from the Node watch.
    observed_conditions: Option<Vec<(String, String)>>,
}

/// One simulated node.
#[derive(Debug)]
struct NodeState {
    name: String,
    zone: Option<String>,
    ip: IpAddr,
    explicit_ip: bool,
    /// The node's configuration (its own, or the simulator's).
    config: Arc<SimConfig>,
    ctl: Mutex<Control>,
    /// Woken when a control changes.
    notify: Notify,
    /// The node's images (when [`SimConfig::image_gc`] is enabled).
    images: Mutex<images::ImageStore>,
    /// The node's running and dead containers.
    containers: Mutex<container_gc::ContainerStore>,
    /// The node's eviction manager.
    eviction: Mutex<eviction::EvictionState>,
    /// The node's NUMA nodes, under its TopologyManager.
    numa: Mutex<topology::NumaState>,
}

impl NodeState {
    /// Whether heartbeats are stopped now, and when the flapping state changes next.
    fn stopped(&self, zone_stopped: bool, now: Instant) -> (bool, Option<Instant>) {
        let c = self.ctl.lock();
        if c.powered_off || c.manual_stopped || zone_stopped {
            return (true, None);
        }
        match c.annotation {
            HeartbeatMode::Running => (false, None),
            HeartbeatMode::Stopped => (true, None),
            HeartbeatMode::Flapping { period, since } => {
                let period = period.max(Duration::from_millis(1));
                let phase = now.saturating_duration_since(since).as_nanos() / period.as_nanos();
                let next = since + period * u32::try_from(phase + 1).unwrap_or(u32::MAX);
                (phase.is_multiple_of(2), Some(next))
            }
        }
    }
}

/// Makes the client a node's kubelet uses, from the node's name: each kubelet then acts as
/// its own identity (`system:node:<name>`), through `ApiServer::router_as` in process or a
/// per-node client certificate over TLS.
pub type NodeClientFactory = Arc<dyn Fn(&str) -> Client + Send + Sync>;

struct Shared {
    /// The fleet-wide client: the pod watch, the control ConfigMap and annotation watches.
    client: Client,
    /// Per-node clients (see [`NodeSimulator::with_node_clients`]); none: `client` for all.
    node_clients: std::sync::OnceLock<NodeClientFactory>,
    node_client_cache: RwLock<HashMap<String, Client>>,
    config: SimConfig,
    /// [`config`](Self::config), shared by the nodes without their own.
    node_config: Arc<SimConfig>,
    clock: WallClock,
    nodes: RwLock<HashMap<String, Arc<NodeState>>>,
    stopped_zones: RwLock<BTreeSet<String>>,
    new_nodes: mpsc::UnboundedSender<Arc<NodeState>>,
    new_nodes_rx: Mutex<Option<mpsc::UnboundedReceiver<Arc<NodeState>>>>,
    /// Nodes whose heartbeats resumed: their pods are looked at again.
    resumed_tx: mpsc::UnboundedSender<String>,
    resumed_rx: Mutex<Option<mpsc::UnboundedReceiver<String>>>,
    registrations: Semaphore,
    pod_writes: Semaphore,
    heartbeats: Semaphore,
    counters: Counters,
    node_seq: AtomicU64,
    pod_seq: AtomicU64,
    pods: pods::PodTracker,
    /// The nodes' kubelet API (see [`NodeSimulator::with_kubelet_api`]).
    kubelet_api: kubelet_api::KubeletApi,
    /// The service-account tokens of the pods' projected volumes.
    tokens: identity::TokenCache,
    /// The nodes' data path (see [`NodeSimulator::with_service_proxy`]).
    service_proxy: service_proxy::ServiceProxy,
    /// The nodes' agents (see [`NodeSimulator::with_agent_tunnel`]).
    agent_tunnels: agent_tunnel::AgentTunnels,
}

impl Shared {
    /// The client the kubelet of `node` acts through.
    fn client_for(&self, node: &str) -> Client {
        let Some(factory) = self.node_clients.get() else {
            return self.client.clone();
        };
        if let Some(client) = self.node_client_cache.read().get(node) {
            return client.clone();
        }
        self.node_client_cache
            .write()
            .entry(node.to_owned())
            .or_insert_with(|| factory(node))
            .clone()
    }

    fn node(&self, name: &str) -> Result<Arc<NodeState>, SimError> {
        self.nodes
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| SimError::UnknownNode(name.to_owned()))
    }

    fn zone_stopped(&self, node: &NodeState) -> bool {
        node.zone
            .as_ref()
            .is_some_and(|z| self.stopped_zones.read().contains(z))
    }

    fn heartbeat_stopped(&self, node: &NodeState) -> bool {
        self.stopped_now(node).0
    }

    fn stopped_now(&self, node: &NodeState) -> (bool, Option<Instant>) {
        node.stopped(self.zone_stopped(node), Instant::now())
    }

    /// Applies a control change to a node and wakes it (and its pods if it resumed).
    fn change(&self, node: &NodeState, f: impl FnOnce(&mut Control)) {
        let before = self.heartbeat_stopped(node);
        f(&mut node.ctl.lock());
        let after = self.heartbeat_stopped(node);
        node.notify.notify_one();
        if before && !after {
            let _ = self.resumed_tx.send(node.name.clone());
        }
    }
}

/// Simulates the kubelets of many nodes; see the [module documentation](self).
///
/// Cheap to clone (all clones drive the same simulation).
#[derive(Clone)]
pub struct NodeSimulator {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for NodeSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSimulator")
            .field("nodes", &self.shared.nodes.read().len())
            .field("stats", &self.stats())
            .finish()
    }
}

impl NodeSimulator {
    /// A simulator talking to the API server through `client`.
    pub fn new(client: Client, config: SimConfig) -> Self {
        let (new_nodes, new_nodes_rx) = mpsc::unbounded_channel();
        let (resumed_tx, resumed_rx) = mpsc::unbounded_channel();
        let registrations = Semaphore::new(config.max_concurrent_registrations.max(1));
        let pod_writes = Semaphore::new(config.max_concurrent_pod_writes.max(1));
        let heartbeats = Semaphore::new(config.max_concurrent_heartbeats.max(1));
        Self {
            shared: Arc::new(Shared {
                client,
                node_clients: std::sync::OnceLock::new(),
                node_client_cache: RwLock::new(HashMap::new()),
                node_config: Arc::new(config.clone()),
                config,
                clock: WallClock::new(),
                nodes: RwLock::new(HashMap::new()),
                stopped_zones: RwLock::new(BTreeSet::new()),
                new_nodes,
                new_nodes_rx: Mutex::new(Some(new_nodes_rx)),
                resumed_tx,
                resumed_rx: Mutex::new(Some(resumed_rx)),
                registrations,
                pod_writes,
                heartbeats,
                counters: Counters::default(),
                node_seq: AtomicU64::new(0),
                pod_seq: AtomicU64::new(0),
                pods: pods::PodTracker::default(),
                kubelet_api: kubelet_api::KubeletApi::default(),
                tokens: identity::TokenCache::default(),
                service_proxy: service_proxy::ServiceProxy::default(),
                agent_tunnels: agent_tunnel::AgentTunnels::default(),
            }),
        }
    }

    /// Each kubelet acts through its own client, made by `factory` from the node's name
    /// (its Node, Lease, status and pod writes); the simulator's own watches keep the client
    /// given to [`new`](Self::new). Set once, before [`run`](Self::run).
    pub fn with_node_clients(self, factory: NodeClientFactory) -> Self {
        if self.shared.node_clients.set(factory).is_err() {
            tracing::warn!("node clients were already set; keeping the first factory");
        }
        self
    }

    /// Every node serves kubelet's HTTPS API (`/healthz`, `/pods`, `/containerLogs`) on its
    /// own IP and advertises it in its Node's `status.daemonEndpoints`. Nodes added without
    /// an IP then get a loopback address of their own (127.1.0.0/16 onwards) instead of one
    /// of 10.0.0.0/9, so that a request for a node reaches that node's server on this
    /// machine. Set once, before [`add_nodes`](Self::add_nodes).
    pub fn with_kubelet_api(self, config: KubeletApiConfig) -> Self {
        if !self.shared.kubelet_api.enable(config) {
            tracing::warn!("the kubelet API was already enabled; keeping the first settings");
        }
        self
    }

    /// Every node whose IP is a loopback address (the ones the simulator picks with
    /// [`with_kubelet_api`](Self::with_kubelet_api), or given so) carries Service traffic
    /// as kube-proxy would: it listens on each `NodePort`/`LoadBalancer` Service's TCP node
    /// ports and hands each connection to a ready endpoint's pod, which answers with its
    /// name; `externalTrafficPolicy: Local` keeps to the node's own endpoints and serves
    /// the `healthCheckNodePort` (the `service_proxy` module's documentation says what is
    /// and is not simulated). Set before [`run`](Self::run).
    ///
    /// Its connections are bounded by [`ServiceProxyLimits::default`]: closed after 60 s
    /// idle, 1,024 per listener, within the process's descriptor budget; see
    /// [`with_service_proxy_limits`](Self::with_service_proxy_limits).
    pub fn with_service_proxy(self) -> Self {
        self.with_service_proxy_limits(ServiceProxyLimits::default())
    }

    /// [`with_service_proxy`](Self::with_service_proxy) with these bounds on its
    /// connections: their idle timeout, their cap per listener and the descriptor budget
    /// they draw on (give the one a fake cloud's load balancers in the same process draw
    /// on, so that the whole data path stays within one budget). Set before
    /// [`run`](Self::run).
    pub fn with_service_proxy_limits(self, limits: ServiceProxyLimits) -> Self {
        self.shared.service_proxy.enable(limits);
        self
    }

    /// Every node whose kubelet API listens (see [`with_kubelet_api`](Self::with_kubelet_api))
    /// also runs an agent that dials out to the API server and carries the API server's
    /// connections to its kubelet, Konnectivity's model (the `agent_tunnel` module's
    /// documentation says more). Set before [`run`](Self::run).
    pub fn with_agent_tunnel(self, config: AgentTunnelConfig) -> Self {
        if !self.shared.agent_tunnels.enable(config) {
            tracing::warn!("the agent tunnel was already set; keeping the first settings");
        }
        self
    }

    /// The addresses the data path listens on now (node ports and health-check ports),
    /// sorted; empty without [`with_service_proxy`](Self::with_service_proxy).
    pub fn service_proxy_listeners(&self) -> Vec<std::net::SocketAddr> {
        self.shared.service_proxy.listening()
    }

    /// Connections the data path has handed to a pod, and connections it reset for want
    /// of an endpoint (or because the chosen pod's port was closed).
    pub fn service_proxy_connections(&self) -> (u64, u64) {
        self.shared.service_proxy.counts()
    }

    /// Where a node's kubelet API listens, once it does.
    pub fn kubelet_endpoint(&self, node: &str) -> Option<std::net::SocketAddr> {
        self.shared.kubelet_api.endpoint(node)
    }

    /// The TokenReviews and SubjectAccessReviews a node's kubelet API has sent to the API
    /// server (answers are cached, see [`KubeletAuthConfig`]); `None` before it serves.
    pub fn kubelet_reviews(&self, node: &str) -> Option<u64> {
        self.shared.kubelet_api.reviews(node)
    }

    /// Container log streams the kubelet APIs hold open now (a stream ends when its
    /// reader has it all or goes away).
    pub fn open_log_streams(&self) -> usize {
        self.shared.kubelet_api.open_log_streams()
    }

    /// Adds nodes to simulate (names, or [`SimNode`]s with zones and IPs). Nodes added
    /// while [`run`](Self::run) is going start at once; names already simulated are
    /// ignored.
    pub fn add_nodes<N: Into<SimNode>>(&self, nodes: impl IntoIterator<Item = N>) {
        for n in nodes {
            let n: SimNode = n.into();
            let mut map = self.shared.nodes.write();
            if map.contains_key(&n.name) {
                continue;
            }
            let seq = self.shared.node_seq.fetch_add(1, Ordering::Relaxed);
            let ip = n.ip.unwrap_or_else(|| {
                if self.shared.kubelet_api.enabled() {
                    // 127.1.0.0/16 onwards, skipping .0: reachable on this machine.
                    let base = u32::from(Ipv4Addr::new(127, 1, 0, 1));
                    return IpAddr::V4(Ipv4Addr::from(base + (seq as u32 & 0xfe_ffff)));
                }
                // 10.0.0.0/9, skipping .0.
                let base = u32::from(Ipv4Addr::new(10, 0, 0, 1));
                IpAddr::V4(Ipv4Addr::from(base + (seq as u32 & 0x7f_ffff)))
            });
            let config = n.config.unwrap_or_else(|| self.shared.node_config.clone());
            let numa = topology::NumaState::new(
                config.topology.numa_nodes,
                quantity_in(&config.capacity.cpu, 1_000_000),
                quantity_in(&config.capacity.memory, 1_000_000_000),
            );
            let state = Arc::new(NodeState {
                name: n.name.clone(),
                zone: n.zone,
                ip,
                explicit_ip: n.ip.is_some(),
                config,
                ctl: Mutex::new(Control {
                    manual_stopped: false,
                    annotation: HeartbeatMode::Running,
                    shutting_down: false,
                    powered_off: false,
                    shutdown_requested: false,
                    startup_error: None,
                    observed_conditions: None,
                }),
                notify: Notify::new(),
                images: Mutex::new(images::ImageStore::default()),
                containers: Mutex::new(container_gc::ContainerStore::default()),
                eviction: Mutex::new(eviction::EvictionState::default()),
                numa: Mutex::new(numa),
            });
            map.insert(n.name, state.clone());
            drop(map);
            let _ = self.shared.new_nodes.send(state);
        }
        self.shared.service_proxy.nodes_added();
    }

    /// Names of the simulated nodes (unordered).
    pub fn node_names(&self) -> Vec<String> {
        self.shared.nodes.read().keys().cloned().collect()
    }

    /// What the simulator has done so far.
    pub fn stats(&self) -> SimStats {
        let c = &self.shared.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SimStats {
            registered: l(&c.registered),
            lease_renewals: l(&c.lease_renewals),
            lease_creates: l(&c.lease_creates),
            lease_errors: l(&c.lease_errors),
            status_posts: l(&c.status_posts),
            pods_started: l(&c.pods_started),
            pods_finished: l(&c.pods_finished),
            pods_shut_down: l(&c.pods_shut_down),
            pods_evicted: l(&c.pods_evicted),
        }
    }

    /// Why a node's kubelet refused to start (kubelet's error, e.g. [`FAIL_SWAP_ON_MESSAGE`]
    /// under `failSwapOn` on a machine with swap): such a node never registers.
    pub fn startup_error(&self, node: &str) -> Result<Option<String>, SimError> {
        let n = self.shared.node(node)?;
        Ok(n.ctl.lock().startup_error.clone())
    }

    /// A node's configuration (its own, or the simulator's).
    pub fn node_config(&self, node: &str) -> Result<Arc<SimConfig>, SimError> {
        Ok(self.shared.node(node)?.config.clone())
    }

    /// A node's free `(CPU millicores, memory bytes)` per NUMA node, as its
    /// TopologyManager has allocated them.
    pub fn numa_free(&self, node: &str) -> Result<Vec<(i64, i64)>, SimError> {
        Ok(self.shared.node(node)?.numa.lock().free())
    }

    /// A node's image filesystem: (bytes used by images, capacity), for `/stats/summary`'s
    /// `node.runtime.imageFs`. `(0, capacity)` when images are not simulated.
    pub fn image_fs_usage(&self, node: &str) -> Result<(u64, u64), SimError> {
        let n = self.shared.node(node)?;
        let used = n.images.lock().used_bytes();
        Ok((used, n.config.image_gc.imagefs_capacity))
    }

    /// The images a node reports (`status.images`, largest first, capped).
    pub fn node_images(
        &self,
        node: &str,
    ) -> Result<Vec<k8s_openapi::api::core::v1::ContainerImage>, SimError> {
        let n = self.shared.node(node)?;
        let max = n.config.image_gc.node_status_max_images;
        Ok(n.images.lock().status_images(max))
    }

    /// A node's dead containers (left by restarts, finished and deleted pods), oldest
    /// first, as container GC has left them.
    pub fn dead_containers(&self, node: &str) -> Result<Vec<DeadContainer>, SimError> {
        let n = self.shared.node(node)?;
        Ok(n.containers.lock().dead())
    }

    /// A node's filesystems as its eviction manager observes them: `[nodefs, imagefs]`.
    pub fn fs_observations(&self, node: &str) -> Result<[FsObservation; 2], SimError> {
        let n = self.shared.node(node)?;
        Ok(eviction::observe(&self.shared, &n))
    }

    /// Whether a node reports `DiskPressure=True`.
    pub fn disk_pressure(&self, node: &str) -> Result<bool, SimError> {
        let n = self.shared.node(node)?;
        Ok(n.eviction.lock().disk_pressure)
    }

    /// Stops a node's heartbeats (Lease renewals, status posts, pod handling), as if its
    /// kubelet became unreachable.
    pub fn stop_heartbeats(&self, node: &str) -> Result<(), SimError> {
        let n = self.shared.node(node)?;
        self.shared.change(&n, |c| c.manual_stopped = true);
        Ok(())
    }

    /// Undoes [`stop_heartbeats`](Self::stop_heartbeats). The node heartbeats again unless
    /// its annotation, its zone or a shutdown keeps it stopped.
    pub fn resume_heartbeats(&self, node: &str) -> Result<(), SimError> {
        let n = self.shared.node(node)?;
        self.shared.change(&n, |c| c.manual_stopped = false);
        Ok(())
    }

    /// Whether a node's heartbeats are stopped now, by any control.
    pub fn heartbeats_stopped(&self, node: &str) -> Result<bool, SimError> {
        let n = self.shared.node(node)?;
        Ok(self.shared.heartbeat_stopped(&n))
    }

    /// Shuts a node down as kubelet's graceful node shutdown does, then powers it off
    /// (also asked from kubectl with the [`SHUTDOWN_ANNOTATION`] `true` on the Node).
    ///
    /// With a grace period (`shutdown_grace_period` > 0 or
    /// `shutdown_grace_period_by_pod_priority`): the node posts `Ready=False` (reason
    /// `KubeletNotReady`, "node is shutting down") while its Lease keeps renewing, rejects
    /// new pods (`NodeShutdown`), marks its running pods `Failed` (reason `Terminated`,
    /// message "Pod was terminated in response to imminent node shutdown.", condition
    /// `DisruptionTarget`) group by group, lowest priority first, each within its grace
    /// period ([`shutdown_groups`]: regular pods within `shutdown_grace_period -
    /// shutdown_grace_period_critical_pods`, then critical pods, priority ≥ 2000000000).
    /// With none (kubelet's default) the node just powers off. Either way its heartbeats
    /// then stop for good. A node is shut down once; later calls do nothing.
    pub async fn shutdown_node(&self, node: &str) -> Result<(), SimError> {
        let n = self.shared.node(node)?;
        shutdown_node(&self.shared, &n).await
    }

    /// Runs the simulation until `shutdown` is cancelled: registers and heartbeats every
    /// node, runs their pods, obeys the fault-injection controls.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), SimError> {
        let shared = &self.shared;
        let (Some(mut new_nodes), Some(resumed)) = (
            shared.new_nodes_rx.lock().take(),
            shared.resumed_rx.lock().take(),
        ) else {
            return Err(SimError::AlreadyRunning);
        };
        let mut tasks = JoinSet::new();
        tasks.spawn(watch_nodes(shared.clone(), shutdown.clone()));
        tasks.spawn(watch_configmap(shared.clone(), shutdown.clone()));
        tasks.spawn(pods::run_pods(shared.clone(), resumed, shutdown.clone()));
        tasks.spawn(images::run_image_gc(shared.clone(), shutdown.clone()));
        tasks.spawn(eviction::run_eviction(shared.clone(), shutdown.clone()));
        tasks.spawn(service_proxy::run(shared.clone(), shutdown.clone()));
        tasks.spawn(container_gc::run_container_gc(
            shared.clone(),
            shutdown.clone(),
        ));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(n) = new_nodes.recv() => {
                    tasks.spawn(node::run_node(shared.clone(), n, shutdown.clone()));
                }
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
        Ok(())
    }
}

/// Shuts `node` down once (see [`NodeSimulator::shutdown_node`]); a second request while
/// or after it runs does nothing.
async fn shutdown_node(shared: &Arc<Shared>, node: &Arc<NodeState>) -> Result<(), SimError> {
    if std::mem::replace(&mut node.ctl.lock().shutdown_requested, true) {
        return Ok(());
    }
    let result = if shutdown::shutdown_groups(&node.config).is_empty() {
        Ok(())
    } else {
        pods::graceful_shutdown(shared, node).await
    };
    shared.change(node, |c| c.powered_off = true);
    result
}

/// A quantity in units of `unit` nanos (1e6: millis; 1e9: whole units, bytes), 0 when it
/// does not parse (the loader has checked it).
fn quantity_in(s: &str, unit: i128) -> i64 {
    core_cluster_machinery::registry::quantity::parse_quantity(s)
        .map_or(0, |q| i64::try_from(q.nanos() / unit).unwrap_or(i64::MAX))
}

fn heartbeat_mode(node: &Node, current: HeartbeatMode) -> HeartbeatMode {
    let ann = node.annotations();
    match ann.get(HEARTBEAT_ANNOTATION).map(|s| s.trim()) {
        Some("stopped") => HeartbeatMode::Stopped,
        Some("flapping") => {
            let period = ann
                .get(FLAP_PERIOD_ANNOTATION)
                .and_then(|p| p.trim().parse::<u64>().ok())
                .filter(|p| *p > 0)
                .map(Duration::from_secs)
                .unwrap_or(DEFAULT_FLAP_PERIOD);
            match current {
                HeartbeatMode::Flapping { period: p, since } if p == period => {
                    HeartbeatMode::Flapping { period, since }
                }
                _ => HeartbeatMode::Flapping {
                    period,
                    since: Instant::now(),
                },
            }
        }
        Some("running") | None => HeartbeatMode::Running,
        Some(other) => {
            tracing::warn!(node = %node.name_any(), value = other, "unknown {HEARTBEAT_ANNOTATION} value, treated as running");
            HeartbeatMode::Running
        }
    }
}

/// Watches Nodes: the heartbeat annotations and the conditions the API shows.
async fn watch_nodes(shared: Arc<Shared>, shutdown: CancellationToken) {
    let api: Api<Node> = Api::all(shared.client.clone());
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = stream.next() => match e { Some(e) => e, None => return },
        };
        let node = match event {
            Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => n,
            Ok(watcher::Event::Delete(n)) => {
                if let Ok(state) = shared.node(&n.name_any()) {
                    state.ctl.lock().observed_conditions = None;
                }
                continue;
            }
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "node watch error");
                continue;
            }
        };
        let Ok(state) = shared.node(&node.name_any()) else {
            continue;
        };
        let observed: Vec<(String, String)> = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .map(|c| (c.type_.clone(), c.status.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let shutdown_asked = node
            .annotations()
            .get(SHUTDOWN_ANNOTATION)
            .is_some_and(|v| v.trim() == "true");
        if shutdown_asked && !state.ctl.lock().shutdown_requested {
            tracing::info!(node = %state.name, "shutdown asked by annotation");
            let (shared, state) = (shared.clone(), state.clone());
            tokio::spawn(async move {
                if let Err(e) = shutdown_node(&shared, &state).await {
                    tracing::warn!(node = %state.name, error = %e, "shutdown failed");
                }
            });
        }
        {
            let fill = |key: &str| node.annotations().get(key).cloned();
            let mut ev = state.eviction.lock();
            ev.nodefs_fill = fill(NODEFS_FILL_ANNOTATION);
            ev.imagefs_fill = fill(IMAGEFS_FILL_ANNOTATION);
        }
        let current = state.ctl.lock().annotation;
        let mode = heartbeat_mode(&node, current);
        state.ctl.lock().observed_conditions = Some(observed);
        if mode != current {
            tracing::info!(node = %state.name, ?mode, "heartbeat mode from annotation");
            shared.change(&state, |c| c.annotation = mode);
        }
    }
}

/// Watches `kube-system/node-simulator` for `stopped-zones`.
async fn watch_configmap(shared: Arc<Shared>, shutdown: CancellationToken) {
    let api: Api<ConfigMap> = Api::namespaced(shared.client.clone(), CONTROL_CONFIGMAP_NAMESPACE);
    let config =
        watcher::Config::default().fields(&format!("metadata.name={CONTROL_CONFIGMAP_NAME}"));
    let mut stream = watcher(api, config).default_backoff().boxed();
    let mut seen_in_init = false;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => return,
            e = stream.next() => match e { Some(e) => e, None => return },
        };
        let zones: BTreeSet<String> = match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                seen_in_init = true;
                cm.data
                    .as_ref()
                    .and_then(|d| d.get(STOPPED_ZONES_KEY))
                    .map(|z| {
                        z.split(',')
                            .map(str::trim)
                            .filter(|z| !z.is_empty())
                            .map(str::to_owned)
                            .collect()
                    })
                    .unwrap_or_default()
            }
            Ok(watcher::Event::Delete(_)) => BTreeSet::new(),
            Ok(watcher::Event::Init) => {
                seen_in_init = false;
                continue;
            }
            // A relist that found no ConfigMap: no zone is stopped.
            Ok(watcher::Event::InitDone) if !seen_in_init => BTreeSet::new(),
            Ok(watcher::Event::InitDone) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "configmap watch error");
                continue;
            }
        };
        let old = shared.stopped_zones.read().clone();
        if old == zones {
            continue;
        }
        tracing::info!(?zones, "stopped zones");
        let changed: BTreeSet<String> = old.symmetric_difference(&zones).cloned().collect();
        let affected: Vec<Arc<NodeState>> = shared
            .nodes
            .read()
            .values()
            .filter(|n| n.zone.as_ref().is_some_and(|z| changed.contains(z)))
            .cloned()
            .collect();
        let before: Vec<bool> = affected
            .iter()
            .map(|n| shared.heartbeat_stopped(n))
            .collect();
        *shared.stopped_zones.write() = zones;
        for (n, was_stopped) in affected.iter().zip(before) {
            n.notify.notify_one();
            if was_stopped && !shared.heartbeat_stopped(n) {
                let _ = shared.resumed_tx.send(n.name.clone());
            }
        }
    }
}
