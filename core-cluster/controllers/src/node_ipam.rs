//! Node IPAM: the range allocator that gives every Node its pod CIDRs.
//!
//! # What upstream does (`pkg/controller/nodeipam`)
//!
//! With `--allocate-node-cidrs`, kube-controller-manager's `RangeAllocator` keeps one
//! `CidrSet` (a bitmap of node-sized blocks) per cluster CIDR (one, or two for dual-stack,
//! one per family). On start it lists every Node and *occupies* the CIDRs in their
//! `spec.podCIDRs` (index 0 into set 0, index 1 into set 1); state lives nowhere else. Each
//! Node without pod CIDRs gets the next free block of every set (a round-robin cursor, so a
//! released block is reused only after the cursor wraps), written with the strategic merge
//! patch `{"spec":{"podCIDR":c0,"podCIDRs":[c0,c1]}}` (3 tries, then a
//! `CIDRAssignmentFailed` event). A full range gives the Warning event `CIDRNotAvailable`
//! ("Node X status is now: CIDRNotAvailable") and the Node is requeued with backoff. A
//! deleted Node (or one with a `deletionTimestamp`) has its blocks released.
//!
//! # Where we differ
//!
//! - Recovery comes from the watcher's initial list (every Node is occupied before any is
//!   allocated) instead of a separate polled list with a 10-minute startup limit, and a
//!   relist releases the blocks of Nodes that vanished while the watch was down.
//! - A pod CIDR that does not parse, lies outside the cluster CIDR or has no matching set is
//!   logged and skipped; upstream makes that fatal at start.
//! - No service-CIDR reservation (`--service-cluster-ip-range` overlap): the configuration
//!   has no service range.
//! - One worker instead of 30; no metrics yet.

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    time::Duration,
};

use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        watcher,
    },
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use ccm_workqueue::{Queue, RateLimiter, sleep_until};

/// Upstream's default node mask for IPv4 (`defaultNodeMaskCIDRIPv4`).
pub const DEFAULT_NODE_CIDR_MASK_SIZE_IPV4: u8 = 24;
/// Upstream's default node mask for IPv6 (`defaultNodeMaskCIDRIPv6`).
pub const DEFAULT_NODE_CIDR_MASK_SIZE_IPV6: u8 = 64;
/// Upstream's limit on `node mask - cluster mask` for IPv6 (`clusterSubnetMaxDiff`).
pub const IPV6_MAX_MASK_DIFF: u8 = 16;
/// How many times the pod-CIDR patch is tried before giving up (`cidrUpdateRetries`).
const CIDR_UPDATE_RETRIES: usize = 3;

/// Configuration of the node IPAM controller (kube-controller-manager's
/// `--allocate-node-cidrs`, `--cluster-cidr`, `--node-cidr-mask-size-ipv4/-ipv6`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIpamConfig {
    /// Whether the controller allocates at all; when false `run` only waits for shutdown.
    pub allocate_node_cidrs: bool,
    /// One cluster CIDR, or two for dual-stack (one per IP family), in order: a Node's
    /// `podCIDRs[i]` comes from `cluster_cidrs[i]`.
    pub cluster_cidrs: Vec<IpNet>,
    /// Prefix length of each Node's IPv4 pod CIDR (default 24).
    pub node_cidr_mask_size_ipv4: u8,
    /// Prefix length of each Node's IPv6 pod CIDR (default 64).
    pub node_cidr_mask_size_ipv6: u8,
}

impl Default for NodeIpamConfig {
    fn default() -> Self {
        Self {
            allocate_node_cidrs: false,
            cluster_cidrs: Vec::new(),
            node_cidr_mask_size_ipv4: DEFAULT_NODE_CIDR_MASK_SIZE_IPV4,
            node_cidr_mask_size_ipv6: DEFAULT_NODE_CIDR_MASK_SIZE_IPV6,
        }
    }
}

/// Why a [`NodeIpamConfig`] was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeIpamConfigError {
    /// `allocate_node_cidrs` without any cluster CIDR.
    #[error("allocate_node_cidrs is set but no cluster CIDR is configured")]
    NoClusterCidr,
    /// More than two cluster CIDRs.
    #[error("at most two cluster CIDRs may be configured (one per IP family), got {0}")]
    TooManyClusterCidrs(usize),
    /// Two cluster CIDRs of the same family.
    #[error("cluster CIDRs {0} and {1} are not configured as dual stack (one IPv4 and one IPv6)")]
    NotDualStack(IpNet, IpNet),
    /// A node mask longer than the address.
    #[error("node CIDR mask size {mask} is invalid for {family} (at most {max})")]
    MaskTooLong {
        /// The configured mask.
        mask: u8,
        /// "IPv4" or "IPv6".
        family: &'static str,
        /// The address length.
        max: u8,
    },
    /// The cluster CIDR is narrower than a node CIDR.
    #[error(
        "mask size of cluster CIDR {cluster} must be less than or equal to the node CIDR mask size {node_mask}"
    )]
    ClusterMaskTooLong {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask for its family.
        node_mask: u8,
    },
    /// IPv6 with more than 2^16 node CIDRs (upstream `ErrCIDRSetSubNetTooBig`).
    #[error(
        "the node CIDR size is too big: node mask {node_mask} minus the mask of cluster CIDR {cluster} must be at most {IPV6_MAX_MASK_DIFF}"
    )]
    SubnetTooBig {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask.
        node_mask: u8,
    },
}

impl NodeIpamConfig {
    /// Checks the configuration as kube-controller-manager does (`validateCIDRs`,
    /// `setNodeCIDRMaskSizes`, `NewNodeIpamController`, `cidrset.NewCIDRSet`).
    pub fn validate(&self) -> Result<(), NodeIpamConfigError> {
        if !self.allocate_node_cidrs {
            return Ok(());
        }
        match self.cluster_cidrs.as_slice() {
            [] => return Err(NodeIpamConfigError::NoClusterCidr),
            [a, b] if a.max_prefix_len() == b.max_prefix_len() => {
                return Err(NodeIpamConfigError::NotDualStack(*a, *b));
            }
            [_] | [_, _] => {}
            more => return Err(NodeIpamConfigError::TooManyClusterCidrs(more.len())),
        }
        for cluster in &self.cluster_cidrs {
            check_mask(cluster, self.node_mask_for(cluster))?;
        }
        Ok(())
    }

    fn node_mask_for(&self, cluster: &IpNet) -> u8 {
        match cluster {
            IpNet::V4(_) => self.node_cidr_mask_size_ipv4,
            IpNet::V6(_) => self.node_cidr_mask_size_ipv6,
        }
    }
}

/// Errors of the node IPAM controller.
#[derive(Debug, thiserror::Error)]
pub enum NodeIpamError {
    /// The configuration was refused.
    #[error("invalid node IPAM configuration: {0}")]
    Config(#[from] NodeIpamConfigError),
    /// A cluster CIDR has no free node CIDR left.
    #[error(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range {0}"
    )]
    NoCidrsRemaining(IpNet),
    /// A CIDR outside the cluster CIDR (or of the other family).
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfRange {
        /// The CIDR.
        cidr: IpNet,
        /// The cluster CIDR.
        cluster: IpNet,
    },
    /// The API server refused or failed a request.
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
    /// The pod-CIDR patch kept failing.
    #[error(
        "failed to update node {node} PodCIDR to {cidrs:?} after {CIDR_UPDATE_RETRIES} tries: {source}"
    )]
    UpdateFailed {
        /// The Node.
        node: String,
        /// The CIDRs we tried to write.
        cidrs: Vec<String>,
        /// The last error.
        source: kube::Error,
    },
}

/// The node-sized blocks of one cluster CIDR (upstream `cidrset.CidrSet`), with upstream's
/// round-robin allocation.
#[derive(Clone, Debug)]
pub struct CidrSet {
    cluster: IpNet,
    node_mask: u8,
    max_cidrs: u64,
    used: BTreeSet<u64>,
    next_candidate: u64,
}

impl CidrSet {
    /// A set of `node_mask`-sized blocks of `cluster`, refused as
    /// [`NodeIpamConfig::validate`] would refuse it.
    pub fn new(cluster: IpNet, node_mask: u8) -> Result<Self, NodeIpamConfigError> {
        let cluster = cluster.trunc();
        check_mask(&cluster, node_mask)?;
        let diff = u32::from(node_mask - cluster.prefix_len());
        Ok(Self {
            cluster,
            node_mask,
            max_cidrs: 1u64.checked_shl(diff).unwrap_or(u64::MAX),
            used: BTreeSet::new(),
            next_candidate: 0,
        })
    }

    /// The cluster CIDR.
    pub fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// How many node CIDRs are taken.
    pub fn allocated(&self) -> u64 {
        self.used.len() as u64
    }

    /// How many node CIDRs the cluster CIDR holds.
    pub fn capacity(&self) -> u64 {
        self.max_cidrs
    }

    fn bits(&self) -> u32 {
        u32::from(self.cluster.max_prefix_len())
    }

    fn shift(&self) -> u32 {
        self.bits() - u32::from(self.node_mask)
    }

    fn base(&self) -> u128 {
        ip_to_u128(self.cluster.network())
    }

    fn index_to_cidr(&self, index: u64) -> IpNet {
        let addr = self.base() + (u128::from(index).checked_shl(self.shift()).unwrap_or(0));
        let ip = match self.cluster {
            IpNet::V4(_) => IpAddr::V4((addr as u32).into()),
            IpNet::V6(_) => IpAddr::V6(addr.into()),
        };
        IpNet::new(ip, self.node_mask).expect("node mask validated against the family")
    }

    /// Takes the next free node CIDR after the cursor (wrapping round), as upstream's
    /// `AllocateNext`.
    pub fn allocate_next(&mut self) -> Result<IpNet, NodeIpamError> {
        if self.allocated() >= self.max_cidrs {
            return Err(NodeIpamError::NoCidrsRemaining(self.cluster));
        }
        let mut candidate = self.next_candidate % self.max_cidrs;
        // The set is not full, so a free slot exists; walk the taken slots from the cursor.
        let mut taken = self.used.range(candidate..);
        loop {
            match taken.next() {
                Some(&t) if t == candidate => {
                    candidate += 1;
                    if candidate >= self.max_cidrs {
                        candidate = 0;
                        taken = self.used.range(0..);
                    }
                }
                _ => break,
            }
        }
        self.used.insert(candidate);
        self.next_candidate = (candidate + 1) % self.max_cidrs;
        Ok(self.index_to_cidr(candidate))
    }

    fn indices(&self, cidr: &IpNet) -> Result<(u64, u64), NodeIpamError> {
        let out = || NodeIpamError::OutOfRange {
            cidr: *cidr,
            cluster: self.cluster,
        };
        if cidr.max_prefix_len() != self.cluster.max_prefix_len()
            || cidr.prefix_len() < self.cluster.prefix_len()
            || !self.cluster.contains(&cidr.network())
        {
            return Err(out());
        }
        let base = self.base();
        let first = (ip_to_u128(cidr.network()) - base)
            .checked_shr(self.shift())
            .unwrap_or(0);
        let last = (ip_to_u128(cidr.broadcast()) - base)
            .checked_shr(self.shift())
            .unwrap_or(0);
        Ok((first as u64, last as u64))
    }

    /// Marks every node block covered by `cidr` as taken (idempotent), as upstream's
    /// `Occupy`.
    pub fn occupy(&mut self, cidr: &IpNet) -> Result<(), NodeIpamError> {
        let (first, last) = self.indices(cidr)?;
        self.used.extend(first..=last);
        Ok(())
    }

    /// Frees every node block covered by `cidr`, as upstream's `Release`.
    pub fn release(&mut self, cidr: &IpNet) -> Result<(), NodeIpamError> {
        let (first, last) = self.indices(cidr)?;
        for i in first..=last {
            self.used.remove(&i);
        }
        Ok(())
    }
}

/// The mask rules of one cluster CIDR: node mask within the address, not shorter than the
/// cluster mask, and for IPv6 at most [`IPV6_MAX_MASK_DIFF`] bits longer.
fn check_mask(cluster: &IpNet, node_mask: u8) -> Result<(), NodeIpamConfigError> {
    let (family, max) = match cluster {
        IpNet::V4(_) => ("IPv4", 32),
        IpNet::V6(_) => ("IPv6", 128),
    };
    if node_mask > max {
        return Err(NodeIpamConfigError::MaskTooLong {
            mask: node_mask,
            family,
            max,
        });
    }
    if cluster.prefix_len() > node_mask {
        return Err(NodeIpamConfigError::ClusterMaskTooLong {
            cluster: *cluster,
            node_mask,
        });
    }
    if matches!(cluster, IpNet::V6(_)) && node_mask - cluster.prefix_len() > IPV6_MAX_MASK_DIFF {
        return Err(NodeIpamConfigError::SubnetTooBig {
            cluster: *cluster,
            node_mask,
        });
    }
    Ok(())
}

fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The node IPAM range allocator: watches Nodes and writes `spec.podCIDR(s)`.
pub struct NodeIpamController {
    client: Client,
    config: NodeIpamConfig,
    sets: Vec<CidrSet>,
    /// The CIDRs we hold for each Node (occupied or allocated by us).
    held: HashMap<String, Vec<IpNet>>,
    recorder: Recorder,
}

impl std::fmt::Debug for NodeIpamController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIpamController")
            .field("config", &self.config)
            .field("sets", &self.sets)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl NodeIpamController {
    /// A controller for `config`, which is validated here.
    pub fn new(client: Client, config: NodeIpamConfig) -> Result<Self, NodeIpamError> {
        config.validate()?;
        let sets = if config.allocate_node_cidrs {
            config
                .cluster_cidrs
                .iter()
                .map(|c| CidrSet::new(*c, config.node_mask_for(c)))
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "node-ipam-controller".into(),
                instance: None,
            },
        );
        Ok(Self {
            client,
            config,
            sets,
            held: HashMap::new(),
            recorder,
        })
    }

    /// Never allocates a node CIDR that overlaps `cidr` (upstream's range allocator
    /// `filterOutServiceRange`, for `--service-cluster-ip-range`): the node blocks it covers
    /// in a cluster CIDR of its family are taken up front; a `cidr` holding a whole cluster
    /// CIDR takes all of it; one outside every cluster CIDR changes nothing.
    pub fn exclude(&mut self, cidr: &IpNet) {
        let cidr = cidr.trunc();
        for set in &mut self.sets {
            let cluster = set.cluster();
            if cidr.max_prefix_len() != cluster.max_prefix_len() {
                continue;
            }
            let covered = if cidr.contains(&cluster) {
                cluster
            } else if cluster.contains(&cidr.network()) {
                cidr
            } else {
                continue;
            };
            if let Err(error) = set.occupy(&covered) {
                warn!(%cidr, %error, "could not exclude the range from node CIDRs");
            }
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(mut self, shutdown: CancellationToken) {
        if !self.config.allocate_node_cidrs {
            info!("node IPAM disabled (allocate_node_cidrs=false)");
            shutdown.cancelled().await;
            return;
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        let mut queue: Queue<String> = Queue::new(RateLimiter::exponential(
            Duration::from_millis(100),
            Duration::from_secs(60),
        ));
        // Nodes of the current (re)list, held back until it is complete.
        let mut initial: Vec<Node> = Vec::new();
        let mut synced = false;
        loop {
            if synced && let Some(name) = queue.try_get() {
                let span = info_span!("node_ipam_sync", node = %name);
                let result = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = self.sync_node(&name).instrument(span.clone()) => r,
                };
                match result {
                    Ok(()) => queue.forget(&name),
                    Err(e) => {
                        let delay = queue.add_rate_limited(name.clone());
                        span.in_scope(
                            || warn!(error = %e, retry_in = ?delay, "node CIDR sync failed"),
                        );
                    }
                }
                queue.done(&name);
                continue;
            }
            let deadline = queue.next_deadline();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sleep_until(deadline), if synced => {}
                ev = events.next() => match ev {
                    None => return,
                    Some(Err(e)) => warn!(error = %e, "node watch failed; retrying"),
                    Some(Ok(watcher::Event::Init)) => initial.clear(),
                    Some(Ok(watcher::Event::InitApply(node))) => initial.push(node),
                    Some(Ok(watcher::Event::InitDone)) => {
                        let nodes = std::mem::take(&mut initial);
                        self.recover(&nodes, &mut queue);
                        synced = true;
                    }
                    Some(Ok(watcher::Event::Apply(node))) => self.observe(&node, &mut queue),
                    Some(Ok(watcher::Event::Delete(node))) => {
                        let name = node.name_any();
                        info_span!("node_ipam_delete", node = %name).in_scope(|| {
                            self.release_node(&name, &node);
                        });
                    }
                },
            }
        }
    }

    /// Rebuilds the allocation map from a complete list of Nodes: occupy every Node's
    /// `spec.podCIDRs` first, then queue the Nodes that need CIDRs, and release the CIDRs of
    /// Nodes that are gone.
    fn recover(&mut self, nodes: &[Node], queue: &mut Queue<String>) {
        let present: std::collections::HashSet<String> =
            nodes.iter().map(|n| n.name_any()).collect();
        let gone: Vec<String> = self
            .held
            .keys()
            .filter(|n| !present.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            let cidrs = self.held.remove(&name).unwrap_or_default();
            self.release_cidrs(&name, &cidrs);
        }
        for node in nodes {
            if !pod_cidrs(node).is_empty() {
                self.observe(node, queue);
            }
        }
        for node in nodes {
            if pod_cidrs(node).is_empty() {
                self.observe(node, queue);
            }
        }
        info!(
            nodes = nodes.len(),
            allocated = ?self.sets.iter().map(CidrSet::allocated).collect::<Vec<_>>(),
            "node CIDR map recovered"
        );
    }

    /// Reacts to a Node seen by the watcher.
    fn observe(&mut self, node: &Node, queue: &mut Queue<String>) {
        let name = node.name_any();
        let _span = info_span!("node_ipam_observe", node = %name).entered();
        if node.meta().deletion_timestamp.is_some() {
            self.release_node(&name, node);
            return;
        }
        let cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            queue.add(name);
        } else if !self.held.contains_key(&name) {
            self.occupy_node(&name, &cidrs);
        }
    }

    /// Occupies a Node's existing pod CIDRs; bad entries are logged and skipped.
    fn occupy_node(&mut self, name: &str, cidrs: &[String]) {
        let mut held = Vec::new();
        for (i, text) in cidrs.iter().enumerate() {
            let Ok(cidr) = text.parse::<IpNet>() else {
                warn!(node = name, pod_cidr = %text, "node has a podCIDR that is not a CIDR; skipped");
                continue;
            };
            let Some(set) = self.sets.get_mut(i) else {
                warn!(node = name, pod_cidr = %cidr, index = i, "node has more podCIDRs than cluster CIDRs; skipped");
                continue;
            };
            match set.occupy(&cidr) {
                Ok(()) => held.push(cidr),
                Err(e) => warn!(node = name, error = %e, "cannot occupy node podCIDR; skipped"),
            }
        }
        debug!(node = name, cidrs = ?held, "occupied");
        self.held.insert(name.to_owned(), held);
    }

    fn release_node(&mut self, name: &str, node: &Node) {
        // Only blocks we hold for this Node are freed: an untracked Node's podCIDRs (out of
        // range, or never occupied) may belong to another Node we do track.
        match self.held.remove(name) {
            Some(cidrs) => self.release_cidrs(name, &cidrs),
            None => {
                debug!(node = name, podcidrs = ?pod_cidrs(node), "node was not tracked; nothing to release")
            }
        }
    }

    fn release_cidrs(&mut self, name: &str, cidrs: &[IpNet]) {
        for cidr in cidrs {
            for set in &mut self.sets {
                if set.cluster().max_prefix_len() == cidr.max_prefix_len()
                    && let Ok(()) = set.release(cidr)
                {
                    info!(node = name, cidr = %cidr, "released node CIDR");
                    break;
                }
            }
        }
    }

    /// Gives the Node its CIDRs if it still has none (upstream `syncNode` /
    /// `AllocateOrOccupyCIDR` / `updateCIDRsAllocation`).
    async fn sync_node(&mut self, name: &str) -> Result<(), NodeIpamError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let Some(node) = api.get_opt(name).await? else {
            return Ok(());
        };
        if node.meta().deletion_timestamp.is_some() {
            self.release_node(name, &node);
            return Ok(());
        }
        let existing = pod_cidrs(&node);
        if !existing.is_empty() {
            if !self.held.contains_key(name) {
                self.occupy_node(name, &existing);
            }
            return Ok(());
        }
        if let Some(stale) = self.held.remove(name) {
            // We allocated before but the Node shows none (say, recreated under the same
            // name): free the old blocks before taking new ones.
            self.release_cidrs(name, &stale);
        }
        let mut proposal = Vec::with_capacity(self.sets.len());
        for i in 0..self.sets.len() {
            match self.sets[i].allocate_next() {
                Ok(cidr) => proposal.push(cidr),
                Err(e) => {
                    for (j, c) in proposal.iter().enumerate() {
                        let _ = self.sets[j].release(c);
                    }
                    self.event(
                        &node,
                        "CIDRNotAvailable",
                        format!("Node {name} status is now: CIDRNotAvailable"),
                    )
                    .await;
                    return Err(e);
                }
            }
        }
        let strings: Vec<String> = proposal.iter().map(ToString::to_string).collect();
        let mut last_err = None;
        for attempt in 0..CIDR_UPDATE_RETRIES {
            let current = match api.get_opt(name).await {
                Ok(Some(n)) => n,
                Ok(None) => {
                    self.release_cidrs(name, &proposal);
                    return Ok(());
                }
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let now = pod_cidrs(&current);
            if now == strings {
                info!(cidrs = ?strings, "node CIDRs already set");
                self.held.insert(name.to_owned(), proposal);
                return Ok(());
            }
            if !now.is_empty() {
                info!(cidrs = ?now, "node got CIDRs from elsewhere; releasing ours");
                self.release_cidrs(name, &proposal);
                self.occupy_node(name, &now);
                return Ok(());
            }
            let patch = serde_json::json!({"spec": {"podCIDR": strings[0], "podCIDRs": strings}});
            match api
                .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await
            {
                Ok(_) => {
                    info!(cidrs = ?strings, "allocated node CIDRs");
                    self.held.insert(name.to_owned(), proposal);
                    return Ok(());
                }
                Err(e) => {
                    debug!(attempt, error = %e, "pod CIDR patch failed");
                    last_err = Some(e);
                }
            }
        }
        self.release_cidrs(name, &proposal);
        let source = last_err.expect("at least one try failed");
        self.event(
            &node,
            "CIDRAssignmentFailed",
            format!("Node {name} status is now: CIDRAssignmentFailed"),
        )
        .await;
        Err(NodeIpamError::UpdateFailed {
            node: name.to_owned(),
            cidrs: strings,
            source,
        })
    }

    async fn event(&self, node: &Node, reason: &str, note: String) {
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "AllocateNodeCIDR".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &node.object_ref(&())).await {
            warn!(error = %e, reason, "failed to record event");
        }
    }
}

/// `spec.podCIDRs`, or `[spec.podCIDR]` for a Node written by an old client.
fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    match spec.and_then(|s| s.pod_cidrs.clone()) {
        Some(v) if !v.is_empty() => v,
        _ => spec
            .and_then(|s| s.pod_cidr.clone())
            .filter(|c| !c.is_empty())
            .into_iter()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn cfg(cidrs: &[&str], v4: u8, v6: u8) -> NodeIpamConfig {
        NodeIpamConfig {
            allocate_node_cidrs: true,
            cluster_cidrs: cidrs.iter().map(|c| net(c)).collect(),
            node_cidr_mask_size_ipv4: v4,
            node_cidr_mask_size_ipv6: v6,
        }
    }

    #[test]
    fn validate_rules() {
        let d = NodeIpamConfig::default();
        assert_eq!(
            (d.node_cidr_mask_size_ipv4, d.node_cidr_mask_size_ipv6),
            (24, 64)
        );
        assert_eq!(d.validate(), Ok(()));
        assert_eq!(
            cfg(&[], 24, 64).validate(),
            Err(NodeIpamConfigError::NoClusterCidr)
        );
        assert!(cfg(&["10.0.0.0/16"], 24, 64).validate().is_ok());
        assert!(
            cfg(&["10.0.0.0/16", "fd00::/48"], 24, 64)
                .validate()
                .is_ok()
        );
        assert!(matches!(
            cfg(&["10.0.0.0/16", "10.1.0.0/16"], 24, 64).validate(),
            Err(NodeIpamConfigError::NotDualStack(..))
        ));
        assert!(matches!(
            cfg(&["10.0.0.0/16", "fd00::/48", "10.1.0.0/16"], 24, 64).validate(),
            Err(NodeIpamConfigError::TooManyClusterCidrs(3))
        ));
        assert!(matches!(
            cfg(&["10.0.0.0/25"], 24, 64).validate(),
            Err(NodeIpamConfigError::ClusterMaskTooLong { .. })
        ));
        assert!(matches!(
            cfg(&["10.0.0.0/16"], 33, 64).validate(),
            Err(NodeIpamConfigError::MaskTooLong { .. })
        ));
        assert!(matches!(
            cfg(&["fd00::/47"], 24, 64).validate(),
            Err(NodeIpamConfigError::SubnetTooBig { .. })
        ));
        assert!(cfg(&["fd00::/48"], 24, 64).validate().is_ok());
        // The error text names the rule.
        let e = cfg(&["10.0.0.0/25"], 24, 64)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be less than or equal"), "{e}");
    }

    // Where we differ: bad CIDRs are skipped, not fatal
    #[tokio::test]
    async fn bad_pod_cidrs_are_skipped_not_fatal() {
        let server = core_cluster_apiserver::ApiServer::new(
            std::sync::Arc::new(core_cluster_store::MemoryStore::new()),
            core_cluster_apiserver::ApiServerConfig::default(),
        )
        .await
        .unwrap();
        let client = Client::new(server.router(), "default");
        let mut ctrl =
            NodeIpamController::new(client, cfg(&["10.0.0.0/16", "fd00::/48"], 24, 64)).unwrap();
        let mut queue = Queue::new(RateLimiter::exponential(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ));
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"podCIDR": "bogus", "podCIDRs": ["bogus", "fd00:0:0:5::/64", "10.9.0.0/24"]}
        }))
        .unwrap();
        ctrl.observe(&node, &mut queue);
        // Only the valid entry in the right slot is held; nothing queued, nothing panicked.
        assert_eq!(ctrl.held["n"], vec![net("fd00:0:0:5::/64")]);
        assert_eq!(ctrl.sets[0].allocated(), 0);
        assert_eq!(ctrl.sets[1].allocated(), 1);
        assert_eq!(queue.try_get(), None);
        ctrl.release_node("n", &node);
        assert_eq!(ctrl.sets[1].allocated(), 0);
    }

    /// Upstream's range allocator `filterOutServiceRange`: the node blocks a service range
    /// covers are never handed out; a range of the other family or outside the cluster
    /// CIDR changes nothing; one holding the whole cluster CIDR takes every block.
    #[tokio::test]
    async fn the_service_range_is_never_allocated_to_a_node() {
        let server = core_cluster_apiserver::ApiServer::new(
            std::sync::Arc::new(core_cluster_store::MemoryStore::new()),
            core_cluster_apiserver::ApiServerConfig::default(),
        )
        .await
        .unwrap();
        let client = Client::new(server.router(), "default");
        let mut ctrl =
            NodeIpamController::new(client.clone(), cfg(&["10.0.0.0/22", "fd00::/62"], 24, 64))
                .unwrap();
        ctrl.exclude(&net("10.0.0.0/23"));
        ctrl.exclude(&net("fd01::/64"));
        ctrl.exclude(&net("192.168.0.0/16"));
        assert_eq!(ctrl.sets[0].allocated(), 2);
        assert_eq!(ctrl.sets[1].allocated(), 0);
        assert_eq!(ctrl.sets[0].allocate_next().unwrap(), net("10.0.2.0/24"));
        assert_eq!(ctrl.sets[0].allocate_next().unwrap(), net("10.0.3.0/24"));
        assert!(ctrl.sets[0].allocate_next().is_err());
        let mut whole = NodeIpamController::new(client, cfg(&["10.0.0.0/22"], 24, 64)).unwrap();
        whole.exclude(&net("10.0.0.0/8"));
        assert_eq!(whole.sets[0].allocated(), 4);
    }

    #[test]
    fn cidrset_round_robin_and_capacity() {
        let mut s = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        assert_eq!(s.capacity(), 4);
        assert_eq!(
            CidrSet::new(net("10.0.0.0/16"), 24).unwrap().capacity(),
            256
        );
        let a: Vec<IpNet> = (0..3).map(|_| s.allocate_next().unwrap()).collect();
        assert_eq!(
            a,
            vec![net("10.0.0.0/24"), net("10.0.1.0/24"), net("10.0.2.0/24")]
        );
        s.release(&net("10.0.0.0/24")).unwrap();
        // Round robin: the freed block comes back only after the cursor wraps.
        assert_eq!(s.allocate_next().unwrap(), net("10.0.3.0/24"));
        assert_eq!(s.allocate_next().unwrap(), net("10.0.0.0/24"));
        assert!(matches!(
            s.allocate_next(),
            Err(NodeIpamError::NoCidrsRemaining(_))
        ));
        assert!(s.occupy(&net("10.1.0.0/24")).is_err());
        assert!(s.occupy(&net("fd00::/64")).is_err());
        let mut v6 = CidrSet::new(net("fd00::/48"), 64).unwrap();
        assert_eq!(v6.allocate_next().unwrap(), net("fd00::/64"));
        assert_eq!(v6.allocate_next().unwrap(), net("fd00:0:0:1::/64"));
        // Occupying a wider block takes every node block in it.
        let mut w = CidrSet::new(net("10.0.0.0/16"), 24).unwrap();
        w.occupy(&net("10.0.0.0/23")).unwrap();
        assert_eq!(w.allocated(), 2);
        assert_eq!(w.allocate_next().unwrap(), net("10.0.2.0/24"));
        // Bad masks are errors, not panics.
        assert!(CidrSet::new(net("10.0.0.0/16"), 40).is_err());
        assert!(CidrSet::new(net("10.0.0.0/16"), 8).is_err());
        assert!(CidrSet::new(net("fd00::/32"), 64).is_err());
        // A /32 node mask is fine (one address per node).
        let mut tiny = CidrSet::new(net("10.0.0.0/31"), 32).unwrap();
        assert_eq!(tiny.allocate_next().unwrap(), net("10.0.0.0/32"));
        assert_eq!(tiny.allocate_next().unwrap(), net("10.0.0.1/32"));
        assert!(tiny.allocate_next().is_err());
    }
}
