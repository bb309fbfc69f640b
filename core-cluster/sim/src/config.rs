//! [`SimConfig`]: the simulated kubelets' flags, with kubelet's defaults.

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::core::v1::Taint;

use crate::{
    container_gc::ContainerGcConfig, eviction::EvictionConfig, images::ImageGcConfig,
    shutdown::ShutdownPriorityGroup, stages::RunRule, swap::SwapConfig, topology::TopologyConfig,
};

/// The taint kubelet registers with under `--cloud-provider=external`, until the cloud
/// controller manager has initialised the node.
pub const UNINITIALIZED_TAINT_KEY: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// The annotation kubelet writes with `--node-ip` and an external cloud provider.
pub const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

/// Capacity (and allocatable) of each simulated node, as Kubernetes quantities.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeResources {
    /// `cpu`, e.g. `"4"`.
    pub cpu: String,
    /// `memory`, e.g. `"16Gi"`.
    pub memory: String,
    /// `pods`, kubelet's `--max-pods` (110).
    pub pods: String,
    /// `ephemeral-storage`, e.g. `"100Gi"`.
    pub ephemeral_storage: String,
}

/// What the node reports in `status.nodeInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// `kubeletVersion` (and `kubeProxyVersion`).
    pub kubelet_version: String,
    /// `osImage`.
    pub os_image: String,
    /// `kernelVersion`.
    pub kernel_version: String,
    /// `containerRuntimeVersion`.
    pub container_runtime_version: String,
    /// `operatingSystem`, also the `kubernetes.io/os` label.
    pub operating_system: String,
    /// `architecture`, also the `kubernetes.io/arch` label.
    pub architecture: String,
}

impl Default for NodeInfo {
    fn default() -> Self {
        Self {
            kubelet_version: "v1.33.0".into(),
            os_image: "Ubuntu 24.04.2 LTS".into(),
            kernel_version: "6.8.0-60-generic".into(),
            container_runtime_version: "containerd://2.0.5".into(),
            operating_system: "linux".into(),
            architecture: "amd64".into(),
        }
    }
}

/// The flags and configuration of a simulated kubelet, with kubelet's defaults
/// (`pkg/kubelet/apis/config/v1beta1/defaults.go`): the simulator's default for every
/// node, which a node may replace with its own ([`SimNode::config`](super::SimNode::config),
/// from a simulator config file, [`NodeConfigFile`](super::NodeConfigFile)).
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// `--register-node` (true): create the Node object. When false the Node must already
    /// exist; the simulator waits for it and then only heartbeats.
    pub register_node: bool,
    /// `--register-with-taints`, put on the Node when it is created.
    pub register_with_taints: Vec<Taint>,
    /// `--node-labels`, added to kubelet's own labels (`kubernetes.io/hostname`, `…/os`,
    /// `…/arch`, `topology.kubernetes.io/zone`).
    pub node_labels: BTreeMap<String, String>,
    /// `--cloud-provider=external`: the node IP is written as the
    /// [`PROVIDED_NODE_IP_ANNOTATION`] annotation when the node has an explicit IP
    /// (`--node-ip`, [`SimNode::ip`](super::SimNode::ip)).
    pub external_cloud_provider: bool,
    /// `--provider-id` prefix: when set, `spec.providerID` = prefix + node name (kwok
    /// advises a dummy one, e.g. `kwok://`, so cloud controllers leave the node alone).
    pub provider_id_prefix: Option<String>,
    /// `kubeReserved` (`--kube-reserved`), already taken from [`allocatable`](Self::allocatable).
    pub kube_reserved: BTreeMap<String, String>,
    /// `systemReserved` (`--system-reserved`), already taken from
    /// [`allocatable`](Self::allocatable).
    pub system_reserved: BTreeMap<String, String>,
    /// Capacity, reported in `status.capacity`.
    pub capacity: NodeResources,
    /// Allocatable, reported in `status.allocatable`.
    pub allocatable: NodeResources,
    /// `status.nodeInfo`.
    pub node_info: NodeInfo,
    /// `nodeLeaseDurationSeconds` (40 s), the Lease's `leaseDurationSeconds`.
    pub node_lease_duration: Duration,
    /// `nodeStatusUpdateFrequency` (10 s): how often status is computed (and posted if it
    /// changed).
    pub node_status_update_frequency: Duration,
    /// `nodeStatusReportFrequency` (5 min): status is posted at least this often.
    pub node_status_report_frequency: Duration,
    /// `shutdownGracePeriod` (0 s = graceful node shutdown off, as in kubelet): total time
    /// given to pods when a node shuts down.
    pub shutdown_grace_period: Duration,
    /// `shutdownGracePeriodCriticalPods` (0 s): the part of `shutdown_grace_period`
    /// reserved for critical pods, which are terminated after the regular ones.
    pub shutdown_grace_period_critical_pods: Duration,
    /// `shutdownGracePeriodByPodPriority`: when not empty, the groups of a graceful
    /// shutdown by pod priority, replacing the two periods above (kubelet refuses both).
    pub shutdown_grace_period_by_pod_priority: Vec<ShutdownPriorityGroup>,
    /// Wait a terminating pod's grace period (`deletionGracePeriodSeconds`, counted from
    /// when the simulator sees the deletion) before finishing it, as if its containers used
    /// all of it (true); or finish it at once, as if they exited on SIGTERM (false, the
    /// default, what kwok does).
    pub wait_pod_grace_period: bool,
    /// Rules deciding how long pods' containers run and how they exit, tried in order
    /// after the pod's own annotations and before the defaults (see [`RunRule`]).
    pub run_rules: Vec<RunRule>,
    /// How long a container meant to end runs when its command says nothing of time
    /// (`true`, `wget …`) (1 s).
    pub default_run_duration: Duration,
    /// Simulated images and image garbage collection (off by default).
    pub image_gc: ImageGcConfig,
    /// Container garbage collection (kubelet's `GCPolicy`; always on, as in kubelet).
    pub container_gc: ContainerGcConfig,
    /// The eviction manager (`--eviction-hard`, the pressure transition period).
    pub eviction: EvictionConfig,
    /// Swap: the machine's swap, `failSwapOn` and `memorySwap.swapBehavior`.
    pub swap: SwapConfig,
    /// The TopologyManager: policy, scope and the machine's NUMA nodes.
    pub topology: TopologyConfig,
    /// At most this many registrations (Node + Lease creates) in flight at once (64).
    pub max_concurrent_registrations: usize,
    /// At most this many pod status writes and deletions in flight at once (32).
    pub max_concurrent_pod_writes: usize,
    /// At most this many heartbeat API calls (Lease GET/PUT/create, status posts) in flight
    /// at once across all nodes (128). Bounds connections and memory when the API server
    /// stalls; at 10,000 nodes the steady load is about 1,000 calls/s of a few ms each.
    pub max_concurrent_heartbeats: usize,
    /// `serverTLSBootstrap` (false): the kubelet API's serving certificate comes from a
    /// CertificateSigningRequest for `kubernetes.io/kubelet-serving`, and the API is not
    /// served until it is approved and signed.
    pub server_tls_bootstrap: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        let resources = NodeResources {
            cpu: "4".into(),
            memory: "16Gi".into(),
            pods: "110".into(),
            ephemeral_storage: "100Gi".into(),
        };
        Self {
            register_node: true,
            register_with_taints: Vec::new(),
            node_labels: BTreeMap::new(),
            kube_reserved: BTreeMap::new(),
            system_reserved: BTreeMap::new(),
            external_cloud_provider: false,
            provider_id_prefix: None,
            capacity: resources.clone(),
            allocatable: resources,
            node_info: NodeInfo::default(),
            node_lease_duration: Duration::from_secs(40),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            shutdown_grace_period: Duration::ZERO,
            shutdown_grace_period_critical_pods: Duration::ZERO,
            shutdown_grace_period_by_pod_priority: Vec::new(),
            wait_pod_grace_period: false,
            run_rules: Vec::new(),
            image_gc: ImageGcConfig::default(),
            container_gc: ContainerGcConfig::default(),
            eviction: EvictionConfig::default(),
            swap: SwapConfig::default(),
            topology: TopologyConfig::default(),
            default_run_duration: Duration::from_secs(1),
            max_concurrent_registrations: 64,
            max_concurrent_pod_writes: 32,
            max_concurrent_heartbeats: 128,
            server_tls_bootstrap: false,
        }
    }
}

/// A simulator configuration kubelet would refuse: the field (by its
/// KubeletConfiguration name) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SimConfigError {
    /// The field, as KubeletConfiguration names it.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

impl SimConfig {
    /// Checks the configuration as kubelet's `ValidateKubeletConfiguration` does for the
    /// fields the simulator has.
    pub fn validate(&self) -> Result<(), SimConfigError> {
        let err = |field, message: String| Err(SimConfigError { field, message });
        if self.shutdown_grace_period_critical_pods > self.shutdown_grace_period {
            return err(
                "shutdownGracePeriodCriticalPods",
                format!(
                    "{:?} must be <= shutdownGracePeriod {:?}",
                    self.shutdown_grace_period_critical_pods, self.shutdown_grace_period
                ),
            );
        }
        if !self.shutdown_grace_period_by_pod_priority.is_empty()
            && !self.shutdown_grace_period.is_zero()
        {
            return err(
                "shutdownGracePeriodByPodPriority",
                "cannot be set with shutdownGracePeriod or shutdownGracePeriodCriticalPods".into(),
            );
        }
        let mut priorities: Vec<i32> = self
            .shutdown_grace_period_by_pod_priority
            .iter()
            .map(|g| g.priority)
            .collect();
        priorities.sort_unstable();
        if let Some(w) = priorities.windows(2).find(|w| w[0] == w[1]) {
            return err(
                "shutdownGracePeriodByPodPriority",
                format!("priority {} appears twice", w[0]),
            );
        }
        let gc = &self.image_gc;
        if gc.high_threshold_percent > 100 {
            return err(
                "imageGCHighThresholdPercent",
                format!("{} must be between 0 and 100", gc.high_threshold_percent),
            );
        }
        if gc.low_threshold_percent >= gc.high_threshold_percent {
            return err(
                "imageGCLowThresholdPercent",
                format!(
                    "{} must be less than imageGCHighThresholdPercent {}",
                    gc.low_threshold_percent, gc.high_threshold_percent
                ),
            );
        }
        if !gc.maximum_gc_age.is_zero() && gc.maximum_gc_age < gc.minimum_gc_age {
            return err(
                "imageMaximumGCAge",
                format!(
                    "{:?} must not be less than imageMinimumGCAge {:?}",
                    gc.maximum_gc_age, gc.minimum_gc_age
                ),
            );
        }
        if self.node_lease_duration.is_zero() {
            return err("nodeLeaseDurationSeconds", "must be greater than 0".into());
        }
        self.topology.validate()?;
        Ok(())
    }

    /// Recomputes [`allocatable`](Self::allocatable) from capacity, the reservations and the
    /// hard eviction thresholds (`GetNodeAllocatableReservation`).
    pub fn recompute_allocatable(&mut self) -> Result<(), SimConfigError> {
        self.allocatable = crate::registration::allocatable(
            &self.capacity,
            &self.kube_reserved,
            &self.system_reserved,
            &self.eviction.hard,
        )
        .map_err(|message| SimConfigError {
            field: "kubeReserved",
            message,
        })?;
        Ok(())
    }

    /// The kubelet of a cluster with an external cloud controller manager
    /// (`--cloud-provider=external`): registers with the
    /// `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule` taint and writes
    /// the provided node IP annotation.
    pub fn external_cloud_provider(mut self) -> Self {
        self.external_cloud_provider = true;
        if !self
            .register_with_taints
            .iter()
            .any(|t| t.key == UNINITIALIZED_TAINT_KEY)
        {
            self.register_with_taints.push(uninitialized_taint());
        }
        self
    }

    /// Lease renew interval: 0.25 × `node_lease_duration` (10 s), as kubelet
    /// (`nodeLeaseRenewIntervalFraction`).
    pub fn lease_renew_interval(&self) -> Duration {
        self.node_lease_duration / 4
    }
}

/// `node.cloudprovider.kubernetes.io/uninitialized=true:NoSchedule`.
pub fn uninitialized_taint() -> Taint {
    Taint {
        key: UNINITIALIZED_TAINT_KEY.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}
