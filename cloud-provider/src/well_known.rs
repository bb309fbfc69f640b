//! The well-known keys (taints, labels, annotations, finalizer) and ports, in one place.

/// Taint that kubelet `--cloud-provider=external` puts on a new Node (value `true`,
/// `NoSchedule`). The cloud-node controller removes it once the Node is initialized.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// Taint (`NoSchedule`, no value) that the cloud-node-lifecycle controller puts on a Node whose
/// instance is shut down.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";

/// Taint that the cluster autoscaler puts on Nodes it is about to delete. Such Nodes are not
/// load-balancer backends.
pub const TAINT_TO_BE_DELETED_BY_CLUSTER_AUTOSCALER: &str = "ToBeDeletedByClusterAutoscaler";

/// Node annotation written by kubelet `--node-ip`: one IP, or a dual-stack pair `"v4,v6"`.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// Service annotation with load-balancer source ranges, used when
/// `spec.loadBalancerSourceRanges` is empty.
pub const ANNOTATION_LOAD_BALANCER_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Finalizer the service controller puts on LoadBalancer Services before creating their load
/// balancer, so that the load balancer is deleted before the Service.
pub const FINALIZER_LOAD_BALANCER_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

/// GA zone label.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Deprecated beta zone label; the source of truth when both are present.
pub const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
/// GA region label.
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// Deprecated beta region label.
pub const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// GA instance-type label.
pub const LABEL_INSTANCE_TYPE_STABLE: &str = "node.kubernetes.io/instance-type";
/// Deprecated beta instance-type label.
pub const LABEL_INSTANCE_TYPE: &str = "beta.kubernetes.io/instance-type";

/// Node label that removes the Node from external load balancers unless its value parses as
/// `false`.
pub const LABEL_EXCLUDE_FROM_EXTERNAL_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";

/// The cloud-controller-manager's secure port.
pub const CLOUD_CONTROLLER_MANAGER_PORT: u16 = 10258;

/// The cloud-controller-manager's webhook port.
pub const CLOUD_CONTROLLER_MANAGER_WEBHOOK_PORT: u16 = 10260;

/// The provider names that mean "no provider in this process" (`--cloud-provider` empty or
/// `external`).
pub const NO_PROVIDER_NAMES: [&str; 2] = ["", "external"];

/// Beyond upstream: the Node condition set while the cloud has maintenance, a reboot, a
/// retirement or a spot interruption scheduled for the instance (the shape KEP-5683 proposes).
pub const CONDITION_MAINTENANCE_PLANNED: &str = "MaintenancePlanned";

/// Beyond upstream: the `PreferNoSchedule` taint optionally put on a Node while
/// [`CONDITION_MAINTENANCE_PLANNED`] is true.
pub const TAINT_MAINTENANCE_PLANNED: &str = "node.cloudprovider.kubernetes.io/maintenance-planned";
