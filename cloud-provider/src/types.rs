//! Values that providers return: instance metadata, routes and zones, built on k8s-openapi types.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeAddress;

/// What the cloud knows about the instance behind a Node, as returned by
/// [`InstancesV2::instance_metadata`](crate::InstancesV2::instance_metadata).
///
/// The cloud-node controller maps it onto the Node: `spec.providerID`, `status.addresses`, and
/// the GA and beta labels for instance type, zone and region. Empty strings mean "unknown" and
/// set no label.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct InstanceMetadata {
    /// The provider ID, `<provider-name>://<instance identity>`.
    pub provider_id: String,
    /// The instance type, e.g. `m5.large`.
    pub instance_type: String,
    /// The instance's addresses (InternalIP, ExternalIP, InternalDNS, ExternalDNS, Hostname).
    pub node_addresses: Vec<NodeAddress>,
    /// The zone (failure domain), e.g. `us-east-1a`.
    pub zone: String,
    /// The region, e.g. `us-east-1`.
    pub region: String,
    /// Extra labels for the Node. Keys under `kubernetes.io` and `k8s.io` are dropped by the
    /// controller, and labels already on the Node are never overwritten.
    pub additional_labels: BTreeMap<String, String>,
}

impl InstanceMetadata {
    /// Metadata with a provider ID and nothing else; fill the rest with the `with_*` builders.
    ///
    /// ```
    /// use cloud_provider::{node_address, InstanceMetadata};
    ///
    /// let meta = InstanceMetadata::new("fake://i-1")
    ///     .with_instance_type("fake.large")
    ///     .with_zone("zone-a", "region-1")
    ///     .with_addresses(vec![node_address("InternalIP", "10.0.0.1")]);
    /// assert_eq!(meta.region, "region-1");
    /// ```
    pub fn new(provider_id: impl Into<String>) -> Self {
        InstanceMetadata {
            provider_id: provider_id.into(),
            ..Default::default()
        }
    }

    /// Sets the instance type.
    pub fn with_instance_type(mut self, instance_type: impl Into<String>) -> Self {
        self.instance_type = instance_type.into();
        self
    }

    /// Sets the zone and region.
    pub fn with_zone(mut self, zone: impl Into<String>, region: impl Into<String>) -> Self {
        self.zone = zone.into();
        self.region = region.into();
        self
    }

    /// Sets the addresses.
    pub fn with_addresses(mut self, addresses: Vec<NodeAddress>) -> Self {
        self.node_addresses = addresses;
        self
    }

    /// Adds one additional label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.additional_labels.insert(key.into(), value.into());
        self
    }
}

/// A route in the cloud's route table: traffic for `destination_cidr` goes to `target_node`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Route {
    /// The provider's name for the route. Ignored by [`Routes::create_route`](crate::Routes::create_route),
    /// which names it from the hint.
    pub name: String,
    /// The Node the traffic goes to. Empty when the cloud no longer knows the target.
    pub target_node: String,
    /// Set by the provider when it fills `target_node_addresses`: the route controller then
    /// compares them with the Node's addresses and recreates the route when they differ.
    pub enable_node_addresses: bool,
    /// The target Node's addresses, when `enable_node_addresses` is set.
    pub target_node_addresses: Vec<NodeAddress>,
    /// The pod CIDR this route serves.
    pub destination_cidr: IpNet,
    /// The route points at a target that no longer exists.
    pub blackhole: bool,
}

impl Route {
    /// A route for `destination_cidr` to `target_node`.
    pub fn new(target_node: impl Into<String>, destination_cidr: IpNet) -> Self {
        Route {
            name: String::new(),
            target_node: target_node.into(),
            enable_node_addresses: false,
            target_node_addresses: Vec::new(),
            destination_cidr,
            blackhole: false,
        }
    }

    /// Sets the provider's name.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Marks the route as a blackhole.
    pub fn with_blackhole(mut self, blackhole: bool) -> Self {
        self.blackhole = blackhole;
        self
    }

    /// Fills the target addresses and sets `enable_node_addresses`.
    pub fn with_target_addresses(mut self, addresses: Vec<NodeAddress>) -> Self {
        self.enable_node_addresses = true;
        self.target_node_addresses = addresses;
        self
    }
}

/// Where an instance runs: its failure domain (zone) and region.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Zone {
    /// The zone, e.g. `us-east-1a`.
    pub failure_domain: String,
    /// The region, e.g. `us-east-1`.
    pub region: String,
}

impl Zone {
    /// A zone in a region.
    pub fn new(failure_domain: impl Into<String>, region: impl Into<String>) -> Self {
        Zone {
            failure_domain: failure_domain.into(),
            region: region.into(),
        }
    }
}

/// A [`NodeAddress`] from its type (`InternalIP`, `ExternalIP`, `InternalDNS`, `ExternalDNS`,
/// `Hostname`) and value.
pub fn node_address(type_: &str, address: impl Into<String>) -> NodeAddress {
    NodeAddress {
        type_: type_.to_owned(),
        address: address.into(),
    }
}

/// A load balancer the provider made for this cluster, as
/// [`LoadBalancer::list_load_balancers`](crate::LoadBalancer::list_load_balancers) reports it:
/// its cloud name and the Service it was made for (from the provider's own record, such as a
/// tag), so the service controller can find load balancers whose Service is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterLoadBalancer {
    /// The cloud name, as [`get_load_balancer_name`](crate::LoadBalancer::get_load_balancer_name)
    /// gave it for its Service.
    pub name: String,
    /// The namespace of the Service it was made for.
    pub service_namespace: String,
    /// The name of the Service it was made for.
    pub service_name: String,
}

impl ClusterLoadBalancer {
    /// The load balancer `name`, made for the Service `namespace/service`.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        service: impl Into<String>,
    ) -> Self {
        ClusterLoadBalancer {
            name: name.into(),
            service_namespace: namespace.into(),
            service_name: service.into(),
        }
    }
}

/// What a cloud plans for an instance, as
/// [`InstancesV2::scheduled_events`](crate::InstancesV2::scheduled_events) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScheduledEventKind {
    /// Maintenance of the host or the instance.
    Maintenance,
    /// A reboot of the instance or its host.
    Reboot,
    /// The instance is retired (stopped or terminated for good).
    Retirement,
    /// A spot (preemptible) instance is being reclaimed.
    SpotInterruption,
    /// Anything else, by the cloud's name.
    Other(String),
}

impl ScheduledEventKind {
    /// The condition reason: `Maintenance`, `Reboot`, `Retirement`, `SpotInterruption`, or
    /// the cloud's name.
    pub fn as_str(&self) -> &str {
        match self {
            ScheduledEventKind::Maintenance => "Maintenance",
            ScheduledEventKind::Reboot => "Reboot",
            ScheduledEventKind::Retirement => "Retirement",
            ScheduledEventKind::SpotInterruption => "SpotInterruption",
            ScheduledEventKind::Other(name) => name,
        }
    }
}

/// An event a cloud has scheduled for one instance (maintenance, reboot, retirement, spot
/// interruption).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduledEvent {
    /// The instance, by the provider ID its Node carries.
    pub provider_id: String,
    /// What is planned.
    pub kind: ScheduledEventKind,
    /// When it starts at the earliest.
    pub not_before: std::time::SystemTime,
    /// When it ends at the latest, if the cloud says; past it the event no longer applies.
    pub not_after: Option<std::time::SystemTime>,
    /// The cloud's description.
    pub description: String,
}

impl ScheduledEvent {
    /// An event of `kind` for the instance `provider_id`, starting at `not_before`.
    pub fn new(
        provider_id: impl Into<String>,
        kind: ScheduledEventKind,
        not_before: std::time::SystemTime,
    ) -> Self {
        ScheduledEvent {
            provider_id: provider_id.into(),
            kind,
            not_before,
            not_after: None,
            description: String::new(),
        }
    }

    /// Sets when it ends at the latest.
    pub fn until(mut self, not_after: std::time::SystemTime) -> Self {
        self.not_after = Some(not_after);
        self
    }

    /// Sets the cloud's description.
    pub fn with_description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }
}
