//! What a Service asks for, validated: ports, protocols, health check and annotations. Pure, so
//! every rule is unit-tested without AWS.

use std::collections::BTreeMap;

use cloud_provider::{CloudError, helpers::service as svc_helpers};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

/// The prefix of every annotation this provider reads.
pub const ANNOTATION_PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

/// `aws-load-balancer-type`.
pub const ANNOTATION_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// `aws-load-balancer-internal`.
pub const ANNOTATION_INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
/// `aws-load-balancer-subnets`.
pub const ANNOTATION_SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
/// `aws-load-balancer-additional-resource-tags`.
pub const ANNOTATION_ADDITIONAL_TAGS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
/// `aws-load-balancer-cross-zone-load-balancing-enabled`.
pub const ANNOTATION_CROSS_ZONE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
/// `aws-load-balancer-target-node-labels`.
pub const ANNOTATION_TARGET_NODE_LABELS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
/// `aws-load-balancer-target-group-attributes`.
pub const ANNOTATION_TARGET_GROUP_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";

/// `aws-load-balancer-ssl-cert`: the ACM (or IAM) certificate ARN of TLS listeners.
pub const ANNOTATION_SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
/// `aws-load-balancer-ssl-ports`: the ports (numbers or names, `*` for all) that get TLS.
pub const ANNOTATION_SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
/// `aws-load-balancer-ssl-negotiation-policy`: the TLS listeners' security policy.
pub const ANNOTATION_SSL_NEGOTIATION_POLICY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
/// `aws-load-balancer-backend-protocol`: `ssl` makes the target groups of TLS ports TLS.
pub const ANNOTATION_BACKEND_PROTOCOL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";

const HC: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-";

/// Annotations with our prefix that are upstream's but cannot be honoured here, and why.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "proxy-protocol",
        "it applies to Classic ELBs, which are not supported",
    ),
    (
        "extra-security-groups",
        "upstream rejects it for Network Load Balancers",
    ),
    (
        "security-groups",
        "bring-your-own security groups are not supported",
    ),
    (
        "eip-allocations",
        "Elastic IP subnet mappings are not supported",
    ),
    (
        "private-ipv4-addresses",
        "private IP subnet mappings are not supported",
    ),
    ("access-log-enabled", "access logs are not supported"),
    ("access-log-emit-interval", "access logs are not supported"),
    ("access-log-s3-bucket-name", "access logs are not supported"),
    (
        "access-log-s3-bucket-prefix",
        "access logs are not supported",
    ),
    (
        "connection-draining-enabled",
        "it applies to Classic ELBs, which are not supported",
    ),
    (
        "connection-draining-timeout",
        "it applies to Classic ELBs, which are not supported",
    ),
    (
        "connection-idle-timeout",
        "it applies to Classic ELBs, which are not supported",
    ),
    (
        "scheme",
        "it belongs to the AWS Load Balancer Controller (use aws-load-balancer-internal)",
    ),
    (
        "nlb-target-type",
        "it belongs to the AWS Load Balancer Controller",
    ),
    (
        "target-type",
        "it belongs to the AWS Load Balancer Controller",
    ),
];

/// A listener and target-group protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// TCP and UDP on the same port.
    TcpUdp,
}

impl Protocol {
    /// The ELBv2 name: `TCP`, `UDP`, `TCP_UDP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::TcpUdp => "TCP_UDP",
        }
    }

    /// The security-group protocols that carry it.
    pub fn ip_protocols(self) -> &'static [&'static str] {
        match self {
            Protocol::Tcp => &["tcp"],
            Protocol::Udp => &["udp"],
            Protocol::TcpUdp => &["tcp", "udp"],
        }
    }
}

/// One listener and its target group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortPlan {
    /// The Service port (listener port).
    pub port: i32,
    /// The NodePort (target port).
    pub node_port: i32,
    /// The protocol of the traffic (what the security groups open).
    pub protocol: Protocol,
    /// TLS termination at the listener, for ports named by `aws-load-balancer-ssl-ports`.
    pub tls: Option<TlsListener>,
}

impl PortPlan {
    /// The listener's ELBv2 protocol: `TLS` when terminating TLS, else the traffic's.
    pub fn listener_protocol(&self) -> &'static str {
        match &self.tls {
            Some(_) => "TLS",
            None => self.protocol.as_str(),
        }
    }

    /// The target group's ELBv2 protocol: `TLS` with `backend-protocol: ssl`, else the
    /// traffic's.
    pub fn target_protocol(&self) -> &'static str {
        match &self.tls {
            Some(tls) if tls.backend_tls => "TLS",
            _ => self.protocol.as_str(),
        }
    }
}

/// A TLS listener (upstream: `ssl-cert` on a port matching `ssl-ports`; UDP ports excluded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListener {
    /// The certificate ARN (`aws-load-balancer-ssl-cert`).
    pub certificate: String,
    /// The security policy (`aws-load-balancer-ssl-negotiation-policy`); AWS's default if
    /// `None`.
    pub policy: Option<String>,
    /// Re-encrypt to the targets (`aws-load-balancer-backend-protocol: ssl`).
    pub backend_tls: bool,
}

/// The health-check port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthPort {
    /// The target's own port (`traffic-port`).
    Traffic,
    /// A fixed port.
    Port(i32),
}

/// The target groups' health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP` or `HTTPS`.
    pub protocol: String,
    /// The port.
    pub port: HealthPort,
    /// The path (HTTP and HTTPS only).
    pub path: Option<String>,
    /// Seconds between checks.
    pub interval: i32,
    /// Successes before healthy.
    pub healthy_threshold: i32,
    /// Failures before unhealthy.
    pub unhealthy_threshold: i32,
}

/// What a Service asks of its Network Load Balancer.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NlbPlan {
    /// `Scheme=internal`.
    pub internal: bool,
    /// Subnet IDs or Name tags from the annotation; discovery when `None`.
    pub subnets: Option<Vec<String>>,
    /// Listeners, one per port (TCP and UDP on one port merged into TCP_UDP).
    pub ports: Vec<PortPlan>,
    /// The health check of every target group.
    pub health: HealthCheck,
    /// `load_balancing.cross_zone.enabled`, when annotated.
    pub cross_zone: Option<bool>,
    /// Target-group attributes, when annotated.
    pub target_group_attributes: BTreeMap<String, String>,
    /// Additional tags for everything created.
    pub extra_tags: BTreeMap<String, String>,
    /// Node label selector for targets: key and, when given, the value.
    pub node_labels: Vec<(String, Option<String>)>,
    /// Client CIDRs.
    pub source_ranges: Vec<IpNet>,
    /// `IpAddressType=dualstack`: the Service's `ipFamilies` include IPv6
    /// (cloud-provider-aws#1219). Targets stay IPv4 instance targets.
    pub dual_stack: bool,
}

fn svc_name(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn invalid(service: &Service, why: impl std::fmt::Display) -> CloudError {
    CloudError::message(format!("service {}: {why}", svc_name(service)))
}

fn parse_bool(service: &Service, key: &str, value: &str) -> Result<bool, CloudError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(
            service,
            format!("annotation {key}: expected true or false, got {value:?}"),
        )),
    }
}

fn parse_int(
    service: &Service,
    key: &str,
    value: &str,
    range: std::ops::RangeInclusive<i32>,
) -> Result<i32, CloudError> {
    value
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|v| range.contains(v))
        .ok_or_else(|| {
            invalid(
                service,
                format!(
                    "annotation {key}: expected a number from {} to {}, got {value:?}",
                    range.start(),
                    range.end()
                ),
            )
        })
}

/// `k1=v1,k2=,k3` as pairs (`k3` has no value).
fn parse_pairs(
    service: &Service,
    key: &str,
    value: &str,
) -> Result<Vec<(String, Option<String>)>, CloudError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim().to_owned())),
            None => (item, None),
        };
        if k.is_empty() {
            return Err(invalid(
                service,
                format!("annotation {key}: empty key in {item:?}"),
            ));
        }
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

/// Whether the Service is for the AWS Load Balancer Controller (`nlb-ip` or `external`).
pub fn implemented_elsewhere(service: &Service) -> bool {
    let ty = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_TYPE))
        .map(|s| s.trim().to_ascii_lowercase());
    matches!(ty.as_deref(), Some("nlb-ip" | "external"))
}

/// Validates the Service and works out its load balancer. [`CloudError::ImplementedElsewhere`]
/// for the AWS Load Balancer Controller's Services; a clear error for anything not honoured.
pub fn plan(service: &Service) -> Result<NlbPlan, CloudError> {
    if implemented_elsewhere(service) {
        return Err(CloudError::ImplementedElsewhere);
    }
    let empty = BTreeMap::new();
    let ann = service.metadata.annotations.as_ref().unwrap_or(&empty);
    for key in ann.keys() {
        let Some(suffix) = key.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        if let Some((_, why)) = UNSUPPORTED.iter().find(|(k, _)| *k == suffix) {
            return Err(invalid(
                service,
                format!("annotation {key} cannot be honoured: {why}"),
            ));
        }
        let known = [
            ANNOTATION_SSL_CERT,
            ANNOTATION_SSL_PORTS,
            ANNOTATION_SSL_NEGOTIATION_POLICY,
            ANNOTATION_BACKEND_PROTOCOL,
            ANNOTATION_TYPE,
            ANNOTATION_INTERNAL,
            ANNOTATION_SUBNETS,
            ANNOTATION_ADDITIONAL_TAGS,
            ANNOTATION_CROSS_ZONE,
            ANNOTATION_TARGET_NODE_LABELS,
            ANNOTATION_TARGET_GROUP_ATTRIBUTES,
        ];
        if !known.contains(&key.as_str()) && !key.starts_with(HC) {
            return Err(invalid(
                service,
                format!("annotation {key} is not known to the aws provider"),
            ));
        }
    }
    if let Some(ty) = ann.get(ANNOTATION_TYPE) {
        match ty.trim().to_ascii_lowercase().as_str() {
            "nlb" => {}
            other => {
                return Err(invalid(
                    service,
                    format!(
                        "annotation {ANNOTATION_TYPE}: {other:?} is not supported; this provider \
                         creates Network Load Balancers only (nlb), the Classic ELB is not supported"
                    ),
                ));
            }
        }
    }
    let spec = service
        .spec
        .as_ref()
        .ok_or_else(|| invalid(service, "has no spec"))?;
    if spec
        .session_affinity
        .as_deref()
        .is_some_and(|a| a != "None")
    {
        return Err(invalid(
            service,
            "sessionAffinity ClientIP is not supported by Network Load Balancers",
        ));
    }
    if spec
        .load_balancer_ip
        .as_deref()
        .is_some_and(|ip| !ip.is_empty())
    {
        return Err(invalid(
            service,
            "spec.loadBalancerIP is not supported on AWS (the NLB gets a DNS name)",
        ));
    }

    // Ports: TCP and UDP on the same port become one TCP_UDP listener.
    let mut by_port: BTreeMap<i32, PortPlan> = BTreeMap::new();
    for p in spec.ports.as_deref().unwrap_or_default() {
        let proto = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            other => {
                return Err(invalid(
                    service,
                    format!(
                        "port {}: protocol {other} is not supported (TCP or UDP)",
                        p.port
                    ),
                ));
            }
        };
        let Some(node_port) = p.node_port.filter(|n| *n > 0) else {
            return Err(invalid(
                service,
                format!(
                    "port {} has no nodePort yet; the NLB targets node ports",
                    p.port
                ),
            ));
        };
        match by_port.get_mut(&p.port) {
            None => {
                by_port.insert(
                    p.port,
                    PortPlan {
                        port: p.port,
                        node_port,
                        protocol: proto,
                        tls: None,
                    },
                );
            }
            Some(existing) if existing.protocol != proto && existing.node_port == node_port => {
                existing.protocol = Protocol::TcpUdp;
            }
            Some(existing) => {
                return Err(invalid(
                    service,
                    format!(
                        "port {} is given twice ({} on node port {} and {} on node port {}); \
                         TCP and UDP on one port need the same node port",
                        p.port,
                        existing.protocol.as_str(),
                        existing.node_port,
                        proto.as_str(),
                        node_port
                    ),
                ));
            }
        }
    }
    let mut ports: Vec<PortPlan> = by_port.into_values().collect();
    if ports.is_empty() {
        return Err(invalid(service, "has no ports"));
    }
    tls_listeners(service, ann, &mut ports)?;
    let single: Vec<Protocol> = ports
        .iter()
        .filter(|p| p.protocol != Protocol::TcpUdp)
        .map(|p| p.protocol)
        .collect();
    if single.contains(&Protocol::Tcp) && single.contains(&Protocol::Udp) {
        return Err(invalid(
            service,
            "mixed protocols on different ports (TCP and UDP) are not supported; use the same \
             port for both (a TCP_UDP listener) or one Service per protocol",
        ));
    }

    let internal = ann
        .get(ANNOTATION_INTERNAL)
        .is_some_and(|v| !v.is_empty() && v.trim() != "false");
    let subnets = ann
        .get(ANNOTATION_SUBNETS)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty());
    let cross_zone = ann
        .get(ANNOTATION_CROSS_ZONE)
        .map(|v| parse_bool(service, ANNOTATION_CROSS_ZONE, v))
        .transpose()?;

    let mut target_group_attributes = BTreeMap::new();
    if let Some(v) = ann.get(ANNOTATION_TARGET_GROUP_ATTRIBUTES) {
        for (k, val) in parse_pairs(service, ANNOTATION_TARGET_GROUP_ATTRIBUTES, v)? {
            if k != "preserve_client_ip.enabled" && k != "proxy_protocol_v2.enabled" {
                return Err(invalid(
                    service,
                    format!(
                        "annotation {ANNOTATION_TARGET_GROUP_ATTRIBUTES}: attribute {k} is not \
                         supported (preserve_client_ip.enabled, proxy_protocol_v2.enabled)"
                    ),
                ));
            }
            let val = val.unwrap_or_default();
            parse_bool(service, ANNOTATION_TARGET_GROUP_ATTRIBUTES, &val)?;
            target_group_attributes.insert(k, val);
        }
    }
    let mut extra_tags = BTreeMap::new();
    if let Some(v) = ann.get(ANNOTATION_ADDITIONAL_TAGS) {
        for (k, val) in parse_pairs(service, ANNOTATION_ADDITIONAL_TAGS, v)? {
            if k.starts_with("kubernetes.io/cluster/") || k == "kubernetes.io/service-name" {
                return Err(invalid(
                    service,
                    format!("annotation {ANNOTATION_ADDITIONAL_TAGS}: tag {k} is reserved"),
                ));
            }
            extra_tags.insert(k, val.unwrap_or_default());
        }
    }
    let node_labels = match ann.get(ANNOTATION_TARGET_NODE_LABELS) {
        Some(v) => parse_pairs(service, ANNOTATION_TARGET_NODE_LABELS, v)?
            .into_iter()
            .map(|(k, v)| (k, v.filter(|v| !v.is_empty())))
            .collect(),
        None => Vec::new(),
    };
    let mut source_ranges =
        svc_helpers::load_balancer_source_ranges(service).map_err(|e| invalid(service, e))?;
    let dual_stack = spec
        .ip_families
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|f| f == "IPv6");
    let explicit_ranges = spec
        .load_balancer_source_ranges
        .as_ref()
        .is_some_and(|r| !r.is_empty())
        || ann.contains_key(cloud_provider::well_known::ANNOTATION_LOAD_BALANCER_SOURCE_RANGES);
    if dual_stack && !explicit_ranges {
        // The default "from anywhere" covers IPv6 clients too.
        source_ranges.push(IpNet::V6(ipnet::Ipv6Net::default()));
    }

    let health = health_check(service, ann)?;
    Ok(NlbPlan {
        internal,
        subnets,
        ports,
        health,
        cross_zone,
        target_group_attributes,
        extra_tags,
        node_labels,
        source_ranges,
        dual_stack,
    })
}

/// Upstream's NLB TLS rule: with `ssl-cert`, the TCP ports that `ssl-ports` names (by number or
/// name; all of them when absent or `*`) get TLS listeners with that certificate and the
/// `ssl-negotiation-policy`; `backend-protocol: ssl` makes their target groups TLS too.
fn tls_listeners(
    service: &Service,
    ann: &BTreeMap<String, String>,
    ports: &mut [PortPlan],
) -> Result<(), CloudError> {
    let backend = ann
        .get(ANNOTATION_BACKEND_PROTOCOL)
        .map(|v| v.trim().to_ascii_lowercase());
    let backend_tls = match backend.as_deref() {
        None | Some("" | "tcp") => false,
        Some("ssl") => true,
        Some(other) => {
            return Err(invalid(
                service,
                format!(
                    "annotation {ANNOTATION_BACKEND_PROTOCOL}: {other:?} is not supported by \
                     Network Load Balancers (ssl or tcp; http and https need a Classic ELB)"
                ),
            ));
        }
    };
    let cert = ann
        .get(ANNOTATION_SSL_CERT)
        .map(|c| c.trim())
        .filter(|c| !c.is_empty());
    let Some(cert) = cert else {
        for key in [ANNOTATION_SSL_PORTS, ANNOTATION_SSL_NEGOTIATION_POLICY] {
            if ann.contains_key(key) {
                return Err(invalid(
                    service,
                    format!("annotation {key} needs {ANNOTATION_SSL_CERT}"),
                ));
            }
        }
        if backend_tls {
            return Err(invalid(
                service,
                format!(
                    "annotation {ANNOTATION_BACKEND_PROTOCOL}: ssl needs {ANNOTATION_SSL_CERT}"
                ),
            ));
        }
        return Ok(());
    };
    if !cert.starts_with("arn:") {
        return Err(invalid(
            service,
            format!("annotation {ANNOTATION_SSL_CERT}: {cert:?} is not a certificate ARN"),
        ));
    }
    let policy = ann
        .get(ANNOTATION_SSL_NEGOTIATION_POLICY)
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty());
    let selected: Option<Vec<String>> = ann
        .get(ANNOTATION_SSL_PORTS)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.iter().any(|p| p == "*"));
    let spec_ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    if let Some(selected) = &selected {
        for wanted in selected {
            let exists = spec_ports.iter().any(|p| {
                p.port.to_string() == *wanted || p.name.as_deref() == Some(wanted.as_str())
            });
            if !exists {
                return Err(invalid(
                    service,
                    format!("annotation {ANNOTATION_SSL_PORTS}: no port {wanted:?}"),
                ));
            }
        }
    }
    for port in ports.iter_mut() {
        if port.protocol != Protocol::Tcp {
            continue;
        }
        let named = |wanted: &String| {
            *wanted == port.port.to_string()
                || spec_ports
                    .iter()
                    .any(|p| p.port == port.port && p.name.as_deref() == Some(wanted.as_str()))
        };
        if selected.as_ref().is_none_or(|s| s.iter().any(named)) {
            port.tls = Some(TlsListener {
                certificate: cert.to_owned(),
                policy: policy.clone(),
                backend_tls,
            });
        }
    }
    Ok(())
}

fn health_check(
    service: &Service,
    ann: &BTreeMap<String, String>,
) -> Result<HealthCheck, CloudError> {
    let mut hc = match svc_helpers::health_check_path_port(service) {
        // externalTrafficPolicy: Local: kube-proxy answers on the health-check node port.
        Some((path, port)) => HealthCheck {
            protocol: "HTTP".to_owned(),
            port: HealthPort::Port(port),
            path: Some(path.to_owned()),
            interval: 10,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        },
        None => HealthCheck {
            protocol: "TCP".to_owned(),
            port: HealthPort::Traffic,
            path: None,
            interval: 30,
            healthy_threshold: 3,
            unhealthy_threshold: 3,
        },
    };
    for (key, value) in ann.iter().filter(|(k, _)| k.starts_with(HC)) {
        let suffix = &key[HC.len()..];
        match suffix {
            "protocol" => {
                let p = value.trim().to_ascii_uppercase();
                if !["TCP", "HTTP", "HTTPS"].contains(&p.as_str()) {
                    return Err(invalid(
                        service,
                        format!("annotation {key}: expected tcp, http or https, got {value:?}"),
                    ));
                }
                hc.protocol = p;
            }
            "port" => {
                hc.port = if value.trim() == "traffic-port" {
                    HealthPort::Traffic
                } else {
                    HealthPort::Port(parse_int(service, key, value, 1..=65535)?)
                }
            }
            "path" => hc.path = Some(value.trim().to_owned()),
            "interval" => hc.interval = parse_int(service, key, value, 5..=300)?,
            // Upstream parses the timeout and does not send it for NLBs; so do we.
            "timeout" => {
                parse_int(service, key, value, 2..=120)?;
            }
            "healthy-threshold" => hc.healthy_threshold = parse_int(service, key, value, 2..=10)?,
            "unhealthy-threshold" => {
                hc.unhealthy_threshold = parse_int(service, key, value, 2..=10)?
            }
            _ => {
                return Err(invalid(
                    service,
                    format!("annotation {key} is not known to the aws provider"),
                ));
            }
        }
    }
    if hc.protocol == "TCP" {
        hc.path = None;
    } else if hc.path.is_none() {
        hc.path = Some("/".to_owned());
    }
    Ok(hc)
}

/// A short stable hash (FNV-1a, 64 bits) as hex.
fn short_hash(parts: &[&str]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.bytes().chain(std::iter::once(0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

fn cut(s: &str, n: usize) -> String {
    s.chars()
        .take(n)
        .collect::<String>()
        .trim_matches('-')
        .to_owned()
}

/// The target group's name, `k8s-<ns≤8>-<name≤8>-<hash10>` (at most 32 characters, as upstream).
/// The hash covers what upstream's does (cluster, Service, port, node port, target protocol,
/// health-check protocol and interval), so a change makes a new target group, which the
/// listener is switched to without being dropped.
pub fn target_group_name(
    cluster_id: &str,
    service: &Service,
    port: &PortPlan,
    health: &HealthCheck,
) -> String {
    let ns = service.metadata.namespace.as_deref().unwrap_or("default");
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let hash = short_hash(&[
        cluster_id,
        ns,
        name,
        &port.port.to_string(),
        &port.node_port.to_string(),
        port.target_protocol(),
        "instance",
        &health.protocol,
        &health.interval.to_string(),
    ]);
    format!("k8s-{}-{}-{}", cut(ns, 8), cut(name, 8), &hash[..10])
}

/// The managed security group's name for a load balancer.
pub fn security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    use super::*;

    fn service(ports: &[(&str, i32, i32)], ann: &[(&str, &str)]) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("web-frontend-service".into());
        s.metadata.namespace = Some("production".into());
        s.metadata.uid = Some("11111111-2222-3333-4444-555555555555".into());
        s.metadata.annotations = Some(
            ann.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(proto, port, np)| ServicePort {
                        name: Some(format!("{}-{port}", proto.to_ascii_lowercase())),
                        protocol: Some(proto.to_string()),
                        port: *port,
                        node_port: Some(*np),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        s
    }

    #[test]
    fn defaults_are_tcp_health_on_traffic_port() {
        let p = plan(&service(&[("TCP", 80, 30080)], &[])).unwrap();
        assert!(!p.internal);
        assert_eq!(
            p.ports,
            vec![PortPlan {
                port: 80,
                node_port: 30080,
                protocol: Protocol::Tcp,
                tls: None,
            }]
        );
        assert_eq!(p.health.protocol, "TCP");
        assert_eq!(p.health.port, HealthPort::Traffic);
        assert_eq!(p.health.path, None);
        assert_eq!((p.health.interval, p.health.healthy_threshold), (30, 3));
        assert_eq!(p.source_ranges, vec!["0.0.0.0/0".parse::<IpNet>().unwrap()]);
    }

    #[test]
    fn local_traffic_policy_checks_the_health_node_port() {
        let mut s = service(&[("TCP", 80, 30080)], &[]);
        let spec = s.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000);
        let p = plan(&s).unwrap();
        assert_eq!(p.health.protocol, "HTTP");
        assert_eq!(p.health.port, HealthPort::Port(32000));
        assert_eq!(p.health.path.as_deref(), Some("/healthz"));
        assert_eq!(p.health.interval, 10);
    }

    /// cloud-provider-aws#1219: a Service with an IPv6 family gets a dual-stack NLB, open to
    /// `::/0` as well by default.
    #[test]
    fn ipv6_families_make_a_dual_stack_load_balancer() {
        let mut s = service(&[("TCP", 80, 30080)], &[]);
        assert!(!plan(&s).unwrap().dual_stack);
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        let p = plan(&s).unwrap();
        assert!(p.dual_stack);
        assert_eq!(
            p.source_ranges,
            vec![
                "0.0.0.0/0".parse::<IpNet>().unwrap(),
                "::/0".parse().unwrap()
            ]
        );
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["2001:db8::/32".into()]);
        assert_eq!(
            plan(&s).unwrap().source_ranges,
            vec!["2001:db8::/32".parse::<IpNet>().unwrap()]
        );
    }

    #[test]
    fn tcp_and_udp_on_one_port_merge() {
        let p = plan(&service(&[("TCP", 53, 30053), ("UDP", 53, 30053)], &[])).unwrap();
        assert_eq!(p.ports.len(), 1);
        assert_eq!(p.ports[0].protocol, Protocol::TcpUdp);
        let udp = plan(&service(&[("UDP", 53, 30053)], &[])).unwrap();
        assert_eq!(udp.ports[0].protocol, Protocol::Udp);
    }

    #[test]
    fn mixed_protocols_are_refused_with_why() {
        let err = plan(&service(&[("TCP", 80, 30080), ("UDP", 53, 30053)], &[])).unwrap_err();
        assert!(err.to_string().contains("mixed protocols"), "{err}");
        assert!(
            err.to_string().contains("production/web-frontend-service"),
            "{err}"
        );
        let err = plan(&service(&[("SCTP", 80, 30080)], &[])).unwrap_err();
        assert!(err.to_string().contains("SCTP"), "{err}");
    }

    #[test]
    fn load_balancer_controller_services_are_elsewhere() {
        for ty in ["nlb-ip", "external"] {
            let err = plan(&service(&[("TCP", 80, 30080)], &[(ANNOTATION_TYPE, ty)])).unwrap_err();
            assert!(err.is_implemented_elsewhere());
        }
        assert!(plan(&service(&[("TCP", 80, 30080)], &[(ANNOTATION_TYPE, "nlb")])).is_ok());
        let err = plan(&service(
            &[("TCP", 80, 30080)],
            &[(ANNOTATION_TYPE, "classic")],
        ))
        .unwrap_err();
        assert!(err.to_string().contains("Classic ELB"), "{err}");
    }

    /// Upstream's NLB TLS listeners: `ssl-cert` on the ports `ssl-ports` names
    /// (UDP excluded), `ssl-negotiation-policy` as SslPolicy, `backend-protocol: ssl` for TLS
    /// target groups.
    #[test]
    fn tls_listeners_follow_ssl_cert_and_ssl_ports() {
        let cert = "arn:aws:acm:us-east-1:123456789012:certificate/abc";
        let all = plan(&service(
            &[("TCP", 80, 30080), ("TCP", 443, 30443)],
            &[(ANNOTATION_SSL_CERT, cert)],
        ))
        .unwrap();
        assert!(all.ports.iter().all(|p| p.listener_protocol() == "TLS"));
        assert!(all.ports.iter().all(|p| p.target_protocol() == "TCP"));
        let some = plan(&service(
            &[("TCP", 80, 30080), ("TCP", 443, 30443)],
            &[
                (ANNOTATION_SSL_CERT, cert),
                (ANNOTATION_SSL_PORTS, "tcp-443"),
                (
                    ANNOTATION_SSL_NEGOTIATION_POLICY,
                    "ELBSecurityPolicy-TLS13-1-2-2021-06",
                ),
                (ANNOTATION_BACKEND_PROTOCOL, "ssl"),
            ],
        ))
        .unwrap();
        assert_eq!(some.ports[0].listener_protocol(), "TCP");
        assert_eq!(some.ports[1].listener_protocol(), "TLS");
        assert_eq!(some.ports[1].target_protocol(), "TLS");
        let tls = some.ports[1].tls.as_ref().unwrap();
        assert_eq!(tls.certificate, cert);
        assert_eq!(
            tls.policy.as_deref(),
            Some("ELBSecurityPolicy-TLS13-1-2-2021-06")
        );
        // By number too; UDP ports never get TLS.
        let udp = plan(&service(
            &[("UDP", 53, 30053)],
            &[(ANNOTATION_SSL_CERT, cert), (ANNOTATION_SSL_PORTS, "53")],
        ))
        .unwrap();
        assert_eq!(udp.ports[0].listener_protocol(), "UDP");
        // Bad input is named.
        for (ann, needle) in [
            (vec![(ANNOTATION_SSL_PORTS, "443")], "needs"),
            (vec![(ANNOTATION_SSL_CERT, "not-an-arn")], "certificate ARN"),
            (
                vec![(ANNOTATION_SSL_CERT, cert), (ANNOTATION_SSL_PORTS, "8443")],
                "no port",
            ),
            (vec![(ANNOTATION_BACKEND_PROTOCOL, "http")], "Classic ELB"),
        ] {
            let err = plan(&service(&[("TCP", 443, 30443)], &ann)).unwrap_err();
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn annotations_we_cannot_honour_are_named() {
        let key = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
        let err = plan(&service(&[("TCP", 443, 30443)], &[(key, "eipalloc-1")])).unwrap_err();
        assert!(
            err.to_string().contains(key) && err.to_string().contains("Elastic IP"),
            "{err}"
        );
        let typo = "service.beta.kubernetes.io/aws-load-balancer-internl";
        let err = plan(&service(&[("TCP", 80, 30080)], &[(typo, "true")])).unwrap_err();
        assert!(err.to_string().contains(typo), "{err}");
        let err = plan(&service(
            &[("TCP", 80, 30080)],
            &[(ANNOTATION_CROSS_ZONE, "yes")],
        ))
        .unwrap_err();
        assert!(err.to_string().contains(ANNOTATION_CROSS_ZONE), "{err}");
        let hc = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
        let err = plan(&service(&[("TCP", 80, 30080)], &[(hc, "1")])).unwrap_err();
        assert!(err.to_string().contains(hc), "{err}");
    }

    #[test]
    fn supported_annotations() {
        let p = plan(&service(
            &[("TCP", 80, 30080)],
            &[
                (ANNOTATION_INTERNAL, "true"),
                (ANNOTATION_SUBNETS, "subnet-1, subnet-2"),
                (ANNOTATION_CROSS_ZONE, "true"),
                (ANNOTATION_ADDITIONAL_TAGS, "team=web,cost-center=,flag"),
                (ANNOTATION_TARGET_NODE_LABELS, "pool=edge,gpu"),
                (
                    ANNOTATION_TARGET_GROUP_ATTRIBUTES,
                    "preserve_client_ip.enabled=false",
                ),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol",
                    "http",
                ),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port",
                    "10256",
                ),
            ],
        ))
        .unwrap();
        assert!(p.internal);
        assert_eq!(p.subnets, Some(vec!["subnet-1".into(), "subnet-2".into()]));
        assert_eq!(p.cross_zone, Some(true));
        assert_eq!(p.extra_tags.get("team").map(String::as_str), Some("web"));
        assert_eq!(p.extra_tags.get("flag").map(String::as_str), Some(""));
        assert_eq!(
            p.node_labels,
            vec![("pool".into(), Some("edge".into())), ("gpu".into(), None)]
        );
        assert_eq!(p.health.protocol, "HTTP");
        assert_eq!(p.health.port, HealthPort::Port(10256));
        assert_eq!(p.health.path.as_deref(), Some("/"));
        assert!(
            !plan(&service(
                &[("TCP", 80, 30080)],
                &[(ANNOTATION_INTERNAL, "false")]
            ))
            .unwrap()
            .internal
        );
    }

    #[test]
    fn target_group_names_are_short_and_stable() {
        let s = service(&[("TCP", 80, 30080)], &[]);
        let p = plan(&s).unwrap();
        let a = target_group_name("c1", &s, &p.ports[0], &p.health);
        assert!(a.len() <= 32, "{a}");
        assert!(a.starts_with("k8s-producti-web-fron-"), "{a}");
        assert_eq!(a, target_group_name("c1", &s, &p.ports[0], &p.health));
        assert_ne!(a, target_group_name("c2", &s, &p.ports[0], &p.health));
        let mut other = p.ports[0].clone();
        other.node_port = 30081;
        assert_ne!(a, target_group_name("c1", &s, &other, &p.health));
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    }
}
