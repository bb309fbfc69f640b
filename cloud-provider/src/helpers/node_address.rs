//! Node addresses: the strict `provided-node-ip` annotation and the address order it imposes.

use std::{collections::HashSet, net::IpAddr};

use k8s_openapi::api::core::v1::NodeAddress;

use super::parse_ip_sloppy;

/// Why a `provided-node-ip` annotation, or the addresses it is checked against, was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeIpError {
    /// A part of the annotation is not an IP address.
    #[error("failed to parse node IP {annotation:?}: could not parse {part:?}")]
    Unparsable {
        /// The whole annotation.
        annotation: String,
        /// The part that is not an IP.
        part: String,
    },
    /// More than two IPs, or two of the same family.
    #[error(
        "failed to parse node IP {annotation:?}: must contain either a single IP or a dual-stack pair of IPs"
    )]
    NotSingleOrDualStack {
        /// The whole annotation.
        annotation: String,
    },
    /// A dual-stack pair containing `0.0.0.0` or `::`.
    #[error(
        "failed to parse node IP {annotation:?}: dual-stack node IP cannot include '0.0.0.0' or '::'"
    )]
    UnspecifiedInPair {
        /// The whole annotation.
        annotation: String,
    },
    /// A provided IP is not among the cloud's addresses for the instance.
    #[error("failed to get node address from cloud provider that matches ip: {0}")]
    NoMatchingCloudAddress(IpAddr),
}

/// Parses the `alpha.kubernetes.io/provided-node-ip` annotation strictly, as upstream's
/// `ParseNodeIPAnnotation`: one IP, or two IPs of different families, no spaces, and no
/// `0.0.0.0` or `::` in a pair.
///
/// ```
/// use cloud_provider::helpers::node_address::parse_node_ip_annotation;
///
/// assert_eq!(parse_node_ip_annotation("10.0.0.1,fd00::1").unwrap().len(), 2);
/// assert!(parse_node_ip_annotation("10.0.0.1,10.0.0.2").is_err());
/// assert!(parse_node_ip_annotation("10.0.0.1, fd00::1").is_err());
/// ```
pub fn parse_node_ip_annotation(annotation: &str) -> Result<Vec<IpAddr>, NodeIpError> {
    let ips = annotation
        .split(',')
        .map(|part| {
            parse_ip_sloppy(part).ok_or_else(|| NodeIpError::Unparsable {
                annotation: annotation.to_owned(),
                part: part.to_owned(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ips.as_slice() {
        [_] => Ok(ips),
        [a, b] if a.is_ipv6() == b.is_ipv6() => Err(NodeIpError::NotSingleOrDualStack {
            annotation: annotation.to_owned(),
        }),
        [a, b] if a.is_unspecified() || b.is_unspecified() => Err(NodeIpError::UnspecifiedInPair {
            annotation: annotation.to_owned(),
        }),
        [_, _] => Ok(ips),
        _ => Err(NodeIpError::NotSingleOrDualStack {
            annotation: annotation.to_owned(),
        }),
    }
}

/// Appends each address not already in `list` (same type and value), keeping order.
pub fn add_to_node_addresses(
    list: &mut Vec<NodeAddress>,
    addresses: impl IntoIterator<Item = NodeAddress>,
) {
    for address in addresses {
        if !list
            .iter()
            .any(|a| a.type_ == address.type_ && a.address == address.address)
        {
            list.push(address);
        }
    }
}

/// Orders the cloud's addresses under the `provided-node-ip` annotation, as upstream's
/// `GetNodeAddressesFromNodeIP`: for each provided IP, every cloud address with that IP comes
/// first (keeping its type); then the other cloud addresses follow, **except** those of a type
/// that a provided IP already matched. Every provided IP must match some cloud address.
///
/// ```
/// use cloud_provider::{helpers::node_address::node_addresses_from_node_ip, node_address};
///
/// let cloud = vec![
///     node_address("InternalIP", "10.0.0.1"),
///     node_address("InternalIP", "10.0.0.2"),
///     node_address("ExternalIP", "203.0.113.5"),
/// ];
/// let ordered = node_addresses_from_node_ip("10.0.0.2", &cloud).unwrap();
/// // 10.0.0.2 first; the other InternalIP is dropped; the ExternalIP stays.
/// assert_eq!(ordered, vec![
///     node_address("InternalIP", "10.0.0.2"),
///     node_address("ExternalIP", "203.0.113.5"),
/// ]);
/// ```
pub fn node_addresses_from_node_ip(
    annotation: &str,
    cloud_addresses: &[NodeAddress],
) -> Result<Vec<NodeAddress>, NodeIpError> {
    let provided = parse_node_ip_annotation(annotation)?;
    let mut ordered = Vec::with_capacity(cloud_addresses.len());
    let mut matched_types: HashSet<&str> = HashSet::new();
    for ip in provided {
        let mut matched = false;
        for address in cloud_addresses {
            if parse_ip_sloppy(&address.address) == Some(ip) {
                ordered.push(address.clone());
                matched_types.insert(address.type_.as_str());
                matched = true;
            }
        }
        if !matched {
            return Err(NodeIpError::NoMatchingCloudAddress(ip));
        }
    }
    ordered.extend(
        cloud_addresses
            .iter()
            .filter(|a| !matched_types.contains(a.type_.as_str()))
            .cloned(),
    );
    Ok(ordered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_address;

    // Upstream `k8s.io/component-helpers/node/util/ips.go` `ParseNodeIPAnnotation`: three IPs,
    // two of one family, or an unspecified address in a pair are parse errors.
    #[test]
    fn malformed_node_ip_annotations_are_rejected() {
        for bad in [
            "10.0.0.1,fd00::1,10.0.0.2",
            "10.0.0.1,10.0.0.2",
            "fd00::1,fd00::2",
            "0.0.0.0,fd00::1",
            "10.0.0.1,::",
            "",
            "not-an-ip",
            " 10.0.0.1",
            "10.0.0.1,",
        ] {
            assert!(
                parse_node_ip_annotation(bad).is_err(),
                "{bad:?} must be rejected"
            );
        }
    }

    #[test]
    fn good_annotations_parse() {
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1").unwrap(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            parse_node_ip_annotation("fd00::1,10.0.0.1").unwrap(),
            vec![
                "fd00::1".parse::<IpAddr>().unwrap(),
                "10.0.0.1".parse::<IpAddr>().unwrap()
            ]
        );
        // A single unspecified address is allowed (only pairs forbid it).
        assert!(parse_node_ip_annotation("0.0.0.0").is_ok());
        // IPv4-mapped IPv6 counts as IPv4, so this pair is two IPv4s.
        assert!(parse_node_ip_annotation("::ffff:10.0.0.1,10.0.0.2").is_err());
    }

    // Upstream `k8s.io/cloud-provider/node/helpers/address.go` `GetNodeAddressesFromNodeIPs`:
    // the matching address is placed first; others of the same type are dropped.
    #[test]
    fn the_provided_node_ip_comes_first_and_others_of_its_type_are_dropped() {
        let cloud = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("ExternalIP", "203.0.113.1"),
            node_address("InternalIP", "10.0.0.2"),
            node_address("InternalIP", "fd00::2"),
            node_address("Hostname", "node-a"),
        ];
        let got = node_addresses_from_node_ip("10.0.0.2,fd00::2", &cloud).unwrap();
        assert_eq!(
            got,
            vec![
                node_address("InternalIP", "10.0.0.2"),
                node_address("InternalIP", "fd00::2"),
                node_address("ExternalIP", "203.0.113.1"),
                node_address("Hostname", "node-a"),
            ]
        );
    }

    #[test]
    fn matching_ip_keeps_every_type_it_has() {
        let cloud = vec![
            node_address("InternalIP", "10.0.0.1"),
            node_address("ExternalIP", "10.0.0.1"),
            node_address("ExternalIP", "203.0.113.1"),
        ];
        let got = node_addresses_from_node_ip("10.0.0.1", &cloud).unwrap();
        assert_eq!(
            got,
            vec![
                node_address("InternalIP", "10.0.0.1"),
                node_address("ExternalIP", "10.0.0.1"),
            ]
        );
    }

    // Upstream `GetNodeAddressesFromNodeIPs`: a provided IP that the cloud does not report is
    // an error.
    #[test]
    fn a_provided_node_ip_the_cloud_does_not_report_is_an_error() {
        let cloud = vec![node_address("InternalIP", "10.0.0.1")];
        let err = node_addresses_from_node_ip("10.0.0.9", &cloud).unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to get node address from cloud provider that matches ip: 10.0.0.9"
        );
        // Both halves of a pair must match.
        assert!(node_addresses_from_node_ip("10.0.0.1,fd00::9", &cloud).is_err());
    }

    #[test]
    fn add_deduplicates_on_type_and_value() {
        let mut list = vec![node_address("InternalIP", "10.0.0.1")];
        add_to_node_addresses(
            &mut list,
            [
                node_address("InternalIP", "10.0.0.1"),
                node_address("ExternalIP", "10.0.0.1"),
                node_address("ExternalIP", "10.0.0.1"),
            ],
        );
        assert_eq!(
            list,
            vec![
                node_address("InternalIP", "10.0.0.1"),
                node_address("ExternalIP", "10.0.0.1")
            ]
        );
    }
}
