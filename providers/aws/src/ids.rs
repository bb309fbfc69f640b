//! Provider IDs, node names and node addresses: pure functions over EC2's types.

use aws_sdk_ec2::types::{Instance, InstanceNetworkInterface, InstanceStateName};
use cloud_provider::node_address;
use k8s_openapi::api::core::v1::NodeAddress;

use crate::config::IpFamily;

/// The provider ID of an instance: `aws:///<az>/<instance-id>` (`aws:////<id>` without a zone).
pub fn provider_id(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

/// The instance ID in a provider ID. Accepts upstream's forms: `aws:///<az>/<id>`,
/// `aws:////<id>`, `aws://<az>/<id>` and a bare `i-…`. `None` if it names no EC2 instance
/// (another provider's ID, or a Fargate `fargate-<ip>` target).
pub fn instance_id_from_provider_id(provider_id: &str) -> Option<String> {
    let rest = match provider_id.strip_prefix("aws://") {
        Some(rest) => rest,
        None if provider_id.contains("://") => return None,
        None => provider_id,
    };
    let last = rest.rsplit('/').next().unwrap_or_default();
    valid_instance_id(last).then(|| last.to_owned())
}

/// The instance ID in a node name under resource-based naming: `i-0123…` or
/// `i-0123….<region>.compute.internal`.
pub fn instance_id_from_node_name(node_name: &str) -> Option<String> {
    let first = node_name.split('.').next().unwrap_or_default();
    valid_instance_id(first).then(|| first.to_owned())
}

/// `i-` followed by hex digits.
pub fn valid_instance_id(id: &str) -> bool {
    id.strip_prefix("i-")
        .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What a lookup found about an instance's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Pending, running, stopping, shutting down: exists, not shut down.
    Up,
    /// Stopped: exists and is shut down.
    Stopped,
    /// Terminated, or no state: treated as not found.
    Gone,
}

/// The lifecycle of an instance (upstream: only `stopped` is shut down; `terminated` is gone).
pub fn lifecycle(instance: &Instance) -> Lifecycle {
    match instance.state().and_then(|s| s.name()) {
        Some(InstanceStateName::Stopped) => Lifecycle::Stopped,
        Some(InstanceStateName::Terminated) | None => Lifecycle::Gone,
        Some(_) => Lifecycle::Up,
    }
}

/// Whether an instance can be a load-balancer target: only `running` ones (kubernetes#94966:
/// registering a pending, stopping or shutting-down instance fails the whole RegisterTargets
/// call with `InvalidTarget`).
pub fn is_running(instance: &Instance) -> bool {
    matches!(
        instance.state().and_then(|s| s.name()),
        Some(InstanceStateName::Running)
    )
}

fn in_use_interfaces(instance: &Instance) -> Vec<&InstanceNetworkInterface> {
    let mut enis: Vec<&InstanceNetworkInterface> = instance
        .network_interfaces()
        .iter()
        .filter(|eni| {
            eni.status()
                .is_some_and(|s| s.as_str().eq_ignore_ascii_case("in-use"))
        })
        .collect();
    // By device index; interfaces without an attachment last.
    enis.sort_by_key(|eni| {
        eni.attachment()
            .and_then(|a| a.device_index())
            .unwrap_or(i32::MAX)
    });
    enis
}

/// The node addresses of an instance in upstream's order, per family in `families` order:
/// IPv4 gives every private IP of every in-use interface (InternalIP), the public IP
/// (ExternalIP), the private DNS name (InternalDNS and Hostname) and the public DNS name
/// (ExternalDNS); IPv6 gives the first IPv6 address of each in-use interface (InternalIP).
/// Duplicates are dropped.
pub fn node_addresses(instance: &Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |type_: &str, value: &str| {
        if value.is_empty() || out.iter().any(|a| a.type_ == type_ && a.address == value) {
            return;
        }
        out.push(node_address(type_, value));
    };
    let enis = in_use_interfaces(instance);
    for family in families {
        match family {
            IpFamily::V4 => {
                if enis.is_empty() {
                    // Instances without interface details still have a primary private IP.
                    if let Some(ip) = instance.private_ip_address() {
                        push("InternalIP", ip);
                    }
                }
                for eni in &enis {
                    for ip in eni.private_ip_addresses() {
                        if let Some(ip) = ip.private_ip_address() {
                            push("InternalIP", ip);
                        }
                    }
                }
                if let Some(ip) = instance.public_ip_address() {
                    push("ExternalIP", ip);
                }
                if let Some(dns) = instance.private_dns_name() {
                    push("InternalDNS", dns);
                    push("Hostname", dns);
                }
                if let Some(dns) = instance.public_dns_name() {
                    push("ExternalDNS", dns);
                }
            }
            IpFamily::V6 => {
                for eni in &enis {
                    if let Some(ip) = eni.ipv6_addresses().iter().find_map(|a| a.ipv6_address()) {
                        push("InternalIP", ip);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterfaceAttachment, InstancePrivateIpAddress,
        InstanceState, NetworkInterfaceStatus,
    };

    use super::*;

    #[test]
    fn provider_id_forms() {
        assert_eq!(
            provider_id("us-east-1a", "i-0abc"),
            "aws:///us-east-1a/i-0abc"
        );
        for form in [
            "aws:///us-east-1a/i-0abc",
            "aws:////i-0abc",
            "aws://us-east-1a/i-0abc",
            "i-0abc",
        ] {
            assert_eq!(
                instance_id_from_provider_id(form).as_deref(),
                Some("i-0abc"),
                "{form}"
            );
        }
        for bad in [
            "gce://p/z/i-0abc",
            "aws:///us-east-1a/fargate-10.0.0.1",
            "aws:///us-east-1a/",
            "aws:///us-east-1a/i-xyz",
            "",
        ] {
            assert_eq!(instance_id_from_provider_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn node_name_forms() {
        assert_eq!(
            instance_id_from_node_name("i-0abc").as_deref(),
            Some("i-0abc")
        );
        assert_eq!(
            instance_id_from_node_name("i-0abc.us-west-2.compute.internal").as_deref(),
            Some("i-0abc")
        );
        assert_eq!(instance_id_from_node_name("ip-10-0-0-1.ec2.internal"), None);
    }

    fn eni(index: i32, ips: &[&str], v6: Option<&str>, status: &str) -> InstanceNetworkInterface {
        let mut b = InstanceNetworkInterface::builder()
            .status(NetworkInterfaceStatus::from(status))
            .attachment(
                InstanceNetworkInterfaceAttachment::builder()
                    .device_index(index)
                    .build(),
            );
        for ip in ips {
            b = b.private_ip_addresses(
                InstancePrivateIpAddress::builder()
                    .private_ip_address(*ip)
                    .build(),
            );
        }
        if let Some(v6) = v6 {
            b = b.ipv6_addresses(InstanceIpv6Address::builder().ipv6_address(v6).build());
        }
        b.build()
    }

    fn instance() -> Instance {
        Instance::builder()
            .instance_id("i-1")
            .private_ip_address("10.0.0.1")
            .public_ip_address("54.1.2.3")
            .private_dns_name("ip-10-0-0-1.ec2.internal")
            .public_dns_name("ec2-54-1-2-3.compute-1.amazonaws.com")
            // Listed out of order: sorted by device index.
            .network_interfaces(eni(1, &["10.0.1.5"], Some("2600::5"), "in-use"))
            .network_interfaces(eni(0, &["10.0.0.1", "10.0.0.2"], Some("2600::1"), "in-use"))
            .network_interfaces(eni(2, &["10.0.2.9"], None, "detaching"))
            .build()
    }

    fn pairs(addrs: &[NodeAddress]) -> Vec<(String, String)> {
        addrs
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect()
    }

    #[test]
    fn addresses_in_upstream_order() {
        let got = pairs(&node_addresses(&instance(), &[IpFamily::V4]));
        let want: Vec<(String, String)> = [
            ("InternalIP", "10.0.0.1"),
            ("InternalIP", "10.0.0.2"),
            ("InternalIP", "10.0.1.5"),
            ("ExternalIP", "54.1.2.3"),
            ("InternalDNS", "ip-10-0-0-1.ec2.internal"),
            ("Hostname", "ip-10-0-0-1.ec2.internal"),
            ("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
        ]
        .iter()
        .map(|(t, a)| (t.to_string(), a.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn ipv6_follows_node_ip_families() {
        let v6_first = pairs(&node_addresses(&instance(), &[IpFamily::V6, IpFamily::V4]));
        assert_eq!(v6_first[0], ("InternalIP".into(), "2600::1".into()));
        assert_eq!(v6_first[1], ("InternalIP".into(), "2600::5".into()));
        assert_eq!(v6_first[2], ("InternalIP".into(), "10.0.0.1".into()));
        let v6_only = pairs(&node_addresses(&instance(), &[IpFamily::V6]));
        assert_eq!(v6_only.len(), 2);
    }

    #[test]
    fn lifecycle_states() {
        let with = |s: InstanceStateName| {
            Instance::builder()
                .state(InstanceState::builder().name(s).build())
                .build()
        };
        assert_eq!(lifecycle(&with(InstanceStateName::Running)), Lifecycle::Up);
        assert_eq!(lifecycle(&with(InstanceStateName::Stopping)), Lifecycle::Up);
        assert_eq!(
            lifecycle(&with(InstanceStateName::Stopped)),
            Lifecycle::Stopped
        );
        assert_eq!(
            lifecycle(&with(InstanceStateName::Terminated)),
            Lifecycle::Gone
        );
        assert_eq!(lifecycle(&Instance::builder().build()), Lifecycle::Gone);
    }

    /// kubernetes#94966: only running instances become load-balancer targets.
    #[test]
    fn only_running_instances_are_targets() {
        let with = |s: InstanceStateName| {
            Instance::builder()
                .state(InstanceState::builder().name(s).build())
                .build()
        };
        assert!(is_running(&with(InstanceStateName::Running)));
        for state in [
            InstanceStateName::Pending,
            InstanceStateName::Stopping,
            InstanceStateName::ShuttingDown,
            InstanceStateName::Stopped,
            InstanceStateName::Terminated,
        ] {
            assert!(!is_running(&with(state.clone())), "{state:?}");
        }
        assert!(!is_running(&Instance::builder().build()));
    }
}
