//! The fake cloud's resources: instances, load balancers and routes.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use cloud_provider::node_address;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeAddress;

/// The life state of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InstanceState {
    /// Running: exists, not shut down.
    #[default]
    Running,
    /// Stopped: exists and is shut down.
    Stopped,
    /// Terminated: does not exist any more (InstanceNotFound), as on real clouds.
    Terminated,
}

impl InstanceState {
    /// Whether the cloud still reports the instance.
    pub fn exists(self) -> bool {
        self != InstanceState::Terminated
    }
}

/// One instance of the fake cloud.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeInstance {
    /// The cloud's ID, e.g. `i-0001`. The provider ID is `fake://<id>`.
    pub id: String,
    /// The Node name it backs.
    pub name: String,
    /// Its zone.
    pub zone: String,
    /// Its region.
    pub region: String,
    /// Its type.
    pub instance_type: String,
    /// Its addresses, in the order the cloud reports them.
    pub addresses: Vec<NodeAddress>,
    /// Running, stopped or terminated.
    pub state: InstanceState,
    /// Extra labels reported in the metadata.
    pub labels: BTreeMap<String, String>,
}

impl FakeInstance {
    /// A running instance in `fake-zone-a` of `fake-region-1`, type `fake.medium`, with a
    /// Hostname address and no IP yet.
    pub fn new(id: impl Into<String>, name: impl Into<String>) -> Self {
        let name = name.into();
        FakeInstance {
            id: id.into(),
            addresses: vec![node_address("Hostname", name.clone())],
            name,
            zone: "fake-zone-a".to_owned(),
            region: "fake-region-1".to_owned(),
            instance_type: "fake.medium".to_owned(),
            state: InstanceState::Running,
            labels: BTreeMap::new(),
        }
    }

    /// Sets zone and region.
    pub fn in_zone(mut self, zone: impl Into<String>, region: impl Into<String>) -> Self {
        self.zone = zone.into();
        self.region = region.into();
        self
    }

    /// Sets the instance type.
    pub fn with_type(mut self, instance_type: impl Into<String>) -> Self {
        self.instance_type = instance_type.into();
        self
    }

    /// Adds an InternalIP (IPv4 or IPv6), placed before the other addresses of later types.
    pub fn with_internal_ip(mut self, ip: IpAddr) -> Self {
        self.addresses
            .push(node_address("InternalIP", ip.to_string()));
        self
    }

    /// Adds an ExternalIP.
    pub fn with_external_ip(mut self, ip: IpAddr) -> Self {
        self.addresses
            .push(node_address("ExternalIP", ip.to_string()));
        self
    }

    /// Adds any address.
    pub fn with_address(mut self, address: NodeAddress) -> Self {
        self.addresses.push(address);
        self
    }

    /// Sets the state.
    pub fn with_state(mut self, state: InstanceState) -> Self {
        self.state = state;
        self
    }

    /// Adds a label.
    pub fn with_label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The provider ID, `fake://<id>`.
    pub fn provider_id(&self) -> String {
        format!("{}{}", crate::PROVIDER_ID_PREFIX, self.id)
    }
}

/// A port a fake load balancer listens on, forwarding to a node port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeListener {
    /// The Service port.
    pub port: i32,
    /// TCP, UDP or SCTP.
    pub protocol: String,
    /// The node port traffic goes to.
    pub node_port: i32,
}

/// A load balancer of the fake cloud.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeLoadBalancer {
    /// Its cloud name.
    pub name: String,
    /// The cluster it belongs to.
    pub cluster: String,
    /// `namespace/name` of the Service it serves.
    pub service: String,
    /// Its ingress IP.
    pub ip: IpAddr,
    /// Its listeners.
    pub listeners: Vec<FakeListener>,
    /// The Nodes it forwards to, by name, sorted and without duplicates. Load balancers with
    /// the same Nodes share one list (the fake keeps one copy per distinct set, so 1,000 load
    /// balancers over 10,000 Nodes hold the names once); read it with [`hosts`](Self::hosts).
    pub hosts: Arc<[String]>,
    /// Client CIDRs allowed in.
    pub source_ranges: Vec<IpNet>,
    /// The health-check path and node port, for `externalTrafficPolicy: Local`.
    pub health_check: Option<(String, i32)>,
}

impl FakeLoadBalancer {
    /// The Nodes it forwards to, by name, sorted and without duplicates.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }
}

/// A route of the fake cloud.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FakeRoute {
    /// Its name, `<cluster>-<hint>-<cidr>`.
    pub name: String,
    /// The cluster it belongs to.
    pub cluster: String,
    /// The destination.
    pub cidr: IpNet,
    /// The Node it targets.
    pub target_node: String,
    /// Seeded as a blackhole (routes to removed instances are reported as blackholes too).
    pub blackhole: bool,
}

impl FakeRoute {
    /// A route, named as `create_route` would name it.
    pub fn new(cluster: &str, name_hint: &str, cidr: IpNet, target_node: &str) -> Self {
        let cidr_part: String = cidr
            .to_string()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        FakeRoute {
            name: format!("{cluster}-{name_hint}-{cidr_part}"),
            cluster: cluster.to_owned(),
            cidr,
            target_node: target_node.to_owned(),
            blackhole: false,
        }
    }
}
