//! Helpers that providers and controllers share: node addresses and Service load-balancer
//! settings, with upstream's exact rules.

pub mod node_address;
pub mod service;

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

/// Parses an IP address the way Kubernetes does (`netutils.ParseIPSloppy`): IPv4 octets may have
/// leading zeros (read as decimal), and an IPv4-mapped IPv6 address is the IPv4 address.
///
/// ```
/// use cloud_provider::helpers::parse_ip_sloppy;
///
/// assert_eq!(parse_ip_sloppy("010.000.000.001"), Some("10.0.0.1".parse().unwrap()));
/// assert_eq!(parse_ip_sloppy("::ffff:10.0.0.1"), Some("10.0.0.1".parse().unwrap()));
/// assert_eq!(parse_ip_sloppy(" 10.0.0.1"), None);
/// ```
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(IpAddr::V4(Ipv4Addr::from(octets)))
}

/// Parses a CIDR the way Kubernetes does (`netutils.ParseCIDRSloppy`), returning the network
/// (host bits cleared).
///
/// ```
/// use cloud_provider::helpers::parse_cidr_sloppy;
///
/// assert_eq!(parse_cidr_sloppy("10.0.0.7/24").unwrap().to_string(), "10.0.0.0/24");
/// assert!(parse_cidr_sloppy("10.0.0.0/33").is_none());
/// ```
pub fn parse_cidr_sloppy(s: &str) -> Option<IpNet> {
    let (addr, prefix) = s.split_once('/')?;
    let addr = parse_ip_sloppy(addr)?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix: u8 = prefix.parse().ok()?;
    IpNet::new(addr, prefix).ok().map(|net| net.trunc())
}
