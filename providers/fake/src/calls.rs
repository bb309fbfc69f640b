//! Every call the fake receives, recorded as a structured value.

use std::{fmt, str::FromStr, sync::Arc};

use ipnet::IpNet;

/// One recorded call, with its arguments. Nodes and Services are named by `name` and
/// `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Call {
    /// `InstancesV2::instance_exists`.
    InstanceExists {
        /// The Node's name.
        node: String,
    },
    /// `InstancesV2::instance_shutdown`.
    InstanceShutdown {
        /// The Node's name.
        node: String,
    },
    /// `InstancesV2::instance_metadata`.
    InstanceMetadata {
        /// The Node's name.
        node: String,
    },
    /// `InstancesV2::instance_metadata_batch`: one call for many Nodes.
    InstanceMetadataBatch {
        /// The Nodes' names, in order.
        nodes: Vec<String>,
    },
    /// `Instances::node_addresses`.
    NodeAddresses {
        /// The Node's name.
        node_name: String,
    },
    /// `Instances::node_addresses_by_provider_id`.
    NodeAddressesByProviderId {
        /// The provider ID.
        provider_id: String,
    },
    /// `Instances::instance_id`.
    InstanceId {
        /// The Node's name.
        node_name: String,
    },
    /// `Instances::instance_type`.
    InstanceType {
        /// The Node's name.
        node_name: String,
    },
    /// `Instances::instance_type_by_provider_id`.
    InstanceTypeByProviderId {
        /// The provider ID.
        provider_id: String,
    },
    /// `Instances::add_ssh_key_to_all_instances`.
    AddSshKeyToAllInstances {
        /// The user.
        user: String,
    },
    /// `Instances::current_node_name`.
    CurrentNodeName {
        /// The hostname.
        hostname: String,
    },
    /// `Instances::instance_exists_by_provider_id`.
    InstanceExistsByProviderId {
        /// The provider ID.
        provider_id: String,
    },
    /// `Instances::instance_shutdown_by_provider_id`.
    InstanceShutdownByProviderId {
        /// The provider ID.
        provider_id: String,
    },
    /// `Zones::get_zone`.
    GetZone,
    /// `Zones::get_zone_by_provider_id`.
    GetZoneByProviderId {
        /// The provider ID.
        provider_id: String,
    },
    /// `Zones::get_zone_by_node_name`.
    GetZoneByNodeName {
        /// The Node's name.
        node_name: String,
    },
    /// `LoadBalancer::get_load_balancer`.
    GetLoadBalancer {
        /// The cluster name.
        cluster: String,
        /// `namespace/name` of the Service.
        service: String,
    },
    /// `LoadBalancer::ensure_load_balancer`.
    EnsureLoadBalancer {
        /// The cluster name.
        cluster: String,
        /// `namespace/name` of the Service.
        service: String,
        /// The Nodes' names, in the order given (shared with the load balancer's list when
        /// given sorted, so a logged call holds no copy of 10,000 names).
        hosts: Arc<[String]>,
    },
    /// `LoadBalancer::update_load_balancer`.
    UpdateLoadBalancer {
        /// The cluster name.
        cluster: String,
        /// `namespace/name` of the Service.
        service: String,
        /// The Nodes' names, in the order given (shared with the load balancer's list when
        /// given sorted, so a logged call holds no copy of 10,000 names).
        hosts: Arc<[String]>,
    },
    /// `LoadBalancer::ensure_load_balancer_deleted`.
    EnsureLoadBalancerDeleted {
        /// The cluster name.
        cluster: String,
        /// `namespace/name` of the Service.
        service: String,
    },
    /// `LoadBalancer::list_load_balancers`.
    ListLoadBalancers {
        /// The cluster name.
        cluster: String,
    },
    /// `LoadBalancer::ensure_listed_load_balancer_deleted`.
    EnsureListedLoadBalancerDeleted {
        /// The cluster name.
        cluster: String,
        /// The load balancer's cloud name.
        name: String,
    },
    /// `InstancesV2::scheduled_events`.
    ScheduledEvents,
    /// `Routes::list_routes`.
    ListRoutes {
        /// The cluster name.
        cluster: String,
    },
    /// `Routes::create_route`.
    CreateRoute {
        /// The cluster name.
        cluster: String,
        /// The name hint (the Node's UID).
        name_hint: String,
        /// The destination.
        cidr: IpNet,
        /// The target Node.
        target_node: String,
    },
    /// `Routes::delete_route`.
    DeleteRoute {
        /// The cluster name.
        cluster: String,
        /// The destination.
        cidr: IpNet,
        /// The target Node.
        target_node: String,
    },
    /// `Clusters::list_clusters`.
    ListClusters,
    /// `Clusters::master`.
    Master {
        /// The cluster name.
        cluster: String,
    },
}

macro_rules! methods {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// A provider method, for counting calls and aiming faults. Its string form is
        /// upstream's recorded call name where one exists (`instance-metadata`, `create-route`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Method {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
        }

        impl Method {
            /// Every method.
            pub const ALL: &'static [Method] = &[$(Method::$variant),*];

            /// The method's name, e.g. `instance-metadata`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Method::$variant => $name,)*
                }
            }
        }

        impl Call {
            /// The method this call was made to.
            pub fn method(&self) -> Method {
                match self {
                    $(Call::$variant { .. } => Method::$variant,)*
                }
            }
        }
    };
}

methods! {
    InstanceExists => "instance-exists",
    InstanceShutdown => "instance-shutdown",
    InstanceMetadata => "instance-metadata",
    InstanceMetadataBatch => "instance-metadata-batch",
    NodeAddresses => "node-addresses",
    NodeAddressesByProviderId => "node-addresses-by-provider-id",
    InstanceId => "instance-id",
    InstanceType => "instance-type",
    InstanceTypeByProviderId => "instance-type-by-provider-id",
    AddSshKeyToAllInstances => "add-ssh-key-to-all-instances",
    CurrentNodeName => "current-node-name",
    InstanceExistsByProviderId => "instance-exists-by-provider-id",
    InstanceShutdownByProviderId => "instance-shutdown-by-provider-id",
    GetZone => "get-zone",
    GetZoneByProviderId => "get-zone-by-provider-id",
    GetZoneByNodeName => "get-zone-by-node-name",
    GetLoadBalancer => "get-load-balancer",
    EnsureLoadBalancer => "ensure-load-balancer",
    UpdateLoadBalancer => "update-load-balancer",
    EnsureLoadBalancerDeleted => "ensure-load-balancer-deleted",
    ListLoadBalancers => "list-load-balancers",
    ScheduledEvents => "scheduled-events",
    EnsureListedLoadBalancerDeleted => "ensure-listed-load-balancer-deleted",
    ListRoutes => "list-routes",
    CreateRoute => "create-route",
    DeleteRoute => "delete-route",
    ListClusters => "list-clusters",
    Master => "master",
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A method name that is not one of [`Method::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown method {name:?}; known methods: {known}", name = .0, known = known_methods())]
pub struct UnknownMethod(pub String);

fn known_methods() -> String {
    Method::ALL
        .iter()
        .map(|m| m.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Method {
    type Err = UnknownMethod;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::ALL
            .iter()
            .copied()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownMethod(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_round_trip() {
        for method in Method::ALL {
            assert_eq!(method.as_str().parse::<Method>().unwrap(), *method);
        }
        let err = "instance-metdata".parse::<Method>().unwrap_err();
        assert!(err.to_string().contains("instance-metadata"), "{err}");
    }

    #[test]
    fn call_knows_its_method() {
        let call = Call::CreateRoute {
            cluster: "c".into(),
            name_hint: "uid".into(),
            cidr: "10.0.0.0/24".parse().unwrap(),
            target_node: "n".into(),
        };
        assert_eq!(call.method(), Method::CreateRoute);
        assert_eq!(Call::GetZone.method().as_str(), "get-zone");
    }
}
