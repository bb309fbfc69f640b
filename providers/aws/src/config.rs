//! The cloud-config file: upstream's INI format (gcfg, git-config style) with the `[Global]`
//! keys that apply to this provider and `[ServiceOverride "N"]` endpoint overrides.
//!
//! ```ini
//! [Global]
//! Region = us-east-1
//! VPC = vpc-0123
//! KubernetesClusterID = my-cluster
//! NodeIPFamilies = ipv4
//! NodeIPFamilies = ipv6
//!
//! [ServiceOverride "1"]
//! Service = ec2
//! URL = http://127.0.0.1:5000
//! ```
//!
//! Keys and section names are case-insensitive, values may be double-quoted, `;` and `#` start
//! comments, and a repeated key makes a list (only `NodeIPFamilies` takes one). An unknown
//! section or key, or a value that does not parse, is an error that names the key.

use std::fmt;

/// A cloud-config that could not be used: which line and key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A line that is neither a section header, a `key = value` pair, a comment nor blank.
    #[error("cloud-config line {line}: cannot parse {text:?}")]
    Syntax {
        /// The 1-based line number.
        line: usize,
        /// The offending text.
        text: String,
    },
    /// A section this provider does not know.
    #[error("cloud-config line {line}: unknown section [{section}]")]
    UnknownSection {
        /// The 1-based line number.
        line: usize,
        /// The section as written.
        section: String,
    },
    /// A key this provider does not know (or an upstream key it does not support).
    #[error("cloud-config line {line}: unknown key {key:?} in [{section}]{hint}")]
    UnknownKey {
        /// The 1-based line number.
        line: usize,
        /// The section the key is in.
        section: String,
        /// The key as written.
        key: String,
        /// Why, when the key is upstream's but not supported here.
        hint: String,
    },
    /// A key whose value is wrong.
    #[error("cloud-config key {key}: {why} (got {value:?})")]
    InvalidValue {
        /// The key, e.g. `Global.NodeIPFamilies`.
        key: String,
        /// The value as written.
        value: String,
        /// What is expected.
        why: String,
    },
}

/// An IP family for node addresses (`NodeIPFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    /// `ipv4`.
    V4,
    /// `ipv6`.
    V6,
}

/// How security groups are handled for Network Load Balancers (`NLBSecurityGroupMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NlbSecurityGroupMode {
    /// No security group on the NLB (upstream's default): rules go on the nodes' groups only.
    #[default]
    Unmanaged,
    /// `Managed`: a dedicated security group per NLB, with the client rules, deleted with it.
    Managed,
}

/// The services whose endpoint can be overridden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AwsService {
    /// EC2 (`ec2`).
    Ec2,
    /// Elastic Load Balancing v2 (`elasticloadbalancing`, `elasticloadbalancingv2`, `elbv2`).
    ElbV2,
    /// STS (`sts`), used for `RoleARN`.
    Sts,
}

impl AwsService {
    fn parse(value: &str) -> Option<AwsService> {
        let v: String = value
            .chars()
            .filter(|c| !c.is_whitespace() && *c != '-' && *c != '_')
            .collect::<String>()
            .to_ascii_lowercase();
        match v.as_str() {
            "ec2" => Some(AwsService::Ec2),
            "elasticloadbalancing" | "elasticloadbalancingv2" | "elbv2" => Some(AwsService::ElbV2),
            "sts" => Some(AwsService::Sts),
            _ => None,
        }
    }
}

impl fmt::Display for AwsService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AwsService::Ec2 => "ec2",
            AwsService::ElbV2 => "elasticloadbalancing",
            AwsService::Sts => "sts",
        })
    }
}

/// One `[ServiceOverride "N"]` section: send `service`'s calls in `region` to `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOverride {
    /// The section's name (the `N`).
    pub name: String,
    /// Which service.
    pub service: AwsService,
    /// The region it applies to; `None` means every region.
    pub region: Option<String>,
    /// The endpoint, e.g. `http://127.0.0.1:5000`.
    pub url: String,
    /// The region to sign requests for, when it differs from the client's.
    pub signing_region: Option<String>,
}

/// The parsed cloud-config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AwsConfig {
    /// `Region`.
    pub region: Option<String>,
    /// `Zone` (legacy): when set, the region is derived from it.
    pub zone: Option<String>,
    /// `VPC`: the cluster's VPC; without it the VPC comes from IMDS.
    pub vpc: Option<String>,
    /// `SubnetID`: the fallback subnet for load balancers.
    pub subnet_id: Option<String>,
    /// `RouteTableID`: pins the route table used for routes.
    pub route_table_id: Option<String>,
    /// `KubernetesClusterID`: tags `kubernetes.io/cluster/<id>`.
    pub kubernetes_cluster_id: Option<String>,
    /// `KubernetesClusterTag` (legacy): tag `KubernetesCluster=<id>`.
    pub kubernetes_cluster_tag: Option<String>,
    /// `RoleARN`: assume this role (STS) for every call.
    pub role_arn: Option<String>,
    /// `DisableSecurityGroupIngress`: leave the nodes' security groups alone.
    pub disable_security_group_ingress: bool,
    /// `ElbSecurityGroup`: a security group to attach to every load balancer instead of creating
    /// one (it is never modified nor deleted).
    pub elb_security_group: Option<String>,
    /// `NodeIPFamilies`, in order; `[V4]` when not given.
    pub node_ip_families: Vec<IpFamily>,
    /// `NLBSecurityGroupMode`.
    pub nlb_security_group_mode: NlbSecurityGroupMode,
    /// `SupportedTopologyInstanceTypePattern`: a regular expression of the instance types whose
    /// network topology labels are asked of DescribeInstanceTopology; `None` means upstream's
    /// default, [`DEFAULT_TOPOLOGY_INSTANCE_TYPE_PATTERN`]. Validated when parsed.
    pub supported_topology_instance_type_pattern: Option<String>,
    /// `[ServiceOverride "N"]` sections.
    pub service_overrides: Vec<ServiceOverride>,
}

/// Upstream's default `SupportedTopologyInstanceTypePattern`: the p*, trn* and hpc* families,
/// the ones EC2 gives an instance topology (`topology.go`).
pub const DEFAULT_TOPOLOGY_INSTANCE_TYPE_PATTERN: &str =
    r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$";

/// Upstream keys that exist but are not supported here, with why.
const UNSUPPORTED_GLOBAL: &[(&str, &str)] = &[
    (
        "sourcearn",
        "SourceARN (confused-deputy headers) is not supported",
    ),
    (
        "clusterserviceloadbalancerhealthprobemode",
        "only the ServiceNodePort health-probe mode is supported",
    ),
    (
        "clusterservicesharedloadbalancerhealthprobeport",
        "only the ServiceNodePort health-probe mode is supported",
    ),
    (
        "clusterservicesharedloadbalancerhealthprobepath",
        "only the ServiceNodePort health-probe mode is supported",
    ),
];

fn unquote(value: &str) -> String {
    let v = value.trim();
    if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        v[1..v.len() - 1]
            .replace("\\\"", "\"")
            .replace("\\\\", "\\")
    } else {
        // An unquoted value ends at an inline comment.
        let cut = v.find([';', '#']).unwrap_or(v.len());
        v[..cut].trim().to_owned()
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" | "" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(ConfigError::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            why: "expected true or false".to_owned(),
        }),
    }
}

fn non_empty(key: &str, value: String) -> Result<Option<String>, ConfigError> {
    if value.is_empty() {
        return Ok(None);
    }
    if value.chars().any(char::is_whitespace) {
        return Err(ConfigError::InvalidValue {
            key: key.to_owned(),
            value,
            why: "must not contain whitespace".to_owned(),
        });
    }
    Ok(Some(value))
}

fn prefixed(key: &str, value: String, prefix: &str) -> Result<Option<String>, ConfigError> {
    let v = non_empty(key, value)?;
    match v {
        Some(id) if !id.starts_with(prefix) => Err(ConfigError::InvalidValue {
            key: key.to_owned(),
            value: id,
            why: format!("expected an ID starting with {prefix:?}"),
        }),
        other => Ok(other),
    }
}

/// The `key = value` lines of one section: (line, key, value).
type Pairs = Vec<(usize, String, String)>;

/// Which section a line belongs to.
enum Section {
    Global,
    Override(usize),
}

impl AwsConfig {
    /// Parses the cloud-config text. An empty text is a valid, empty config.
    pub fn parse(text: &str) -> Result<AwsConfig, ConfigError> {
        let mut cfg = AwsConfig::default();
        let mut families_seen = false;
        // Override sections as (name, line, key/value pairs), validated at the end.
        let mut overrides: Vec<(String, usize, Pairs)> = Vec::new();
        let mut section: Option<Section> = None;

        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
                continue;
            }
            if let Some(header) = trimmed.strip_prefix('[') {
                let Some(header) = header.strip_suffix(']') else {
                    return Err(ConfigError::Syntax {
                        line,
                        text: trimmed.to_owned(),
                    });
                };
                let header = header.trim();
                let (name, sub) = match header.split_once(char::is_whitespace) {
                    Some((n, s)) => (n, Some(s.trim().trim_matches('"').to_owned())),
                    None => (header, None),
                };
                section = match (name.to_ascii_lowercase().as_str(), sub) {
                    ("global", None) => Some(Section::Global),
                    ("serviceoverride", Some(sub)) => {
                        if let Some(pos) = overrides.iter().position(|(n, _, _)| *n == sub) {
                            Some(Section::Override(pos))
                        } else {
                            overrides.push((sub, line, Vec::new()));
                            Some(Section::Override(overrides.len() - 1))
                        }
                    }
                    _ => {
                        return Err(ConfigError::UnknownSection {
                            line,
                            section: header.to_owned(),
                        });
                    }
                };
                continue;
            }
            let (key, value) = match trimmed.split_once('=') {
                Some((k, v)) => (k.trim(), unquote(v)),
                // gcfg: a bare key is a boolean true.
                None => (trimmed, String::new()),
            };
            if key.is_empty()
                || key
                    .chars()
                    .any(|c| !(c.is_ascii_alphanumeric() || c == '-'))
            {
                return Err(ConfigError::Syntax {
                    line,
                    text: trimmed.to_owned(),
                });
            }
            match &section {
                None => {
                    return Err(ConfigError::Syntax {
                        line,
                        text: format!("{trimmed} (a key outside of any section)"),
                    });
                }
                Some(Section::Override(pos)) => {
                    overrides[*pos].2.push((line, key.to_owned(), value));
                }
                Some(Section::Global) => {
                    let lower = key.to_ascii_lowercase();
                    let full = format!("Global.{key}");
                    match lower.as_str() {
                        "region" => cfg.region = non_empty(&full, value)?,
                        "zone" => cfg.zone = non_empty(&full, value)?,
                        "vpc" => cfg.vpc = prefixed(&full, value, "vpc-")?,
                        "subnetid" => cfg.subnet_id = prefixed(&full, value, "subnet-")?,
                        "routetableid" => cfg.route_table_id = prefixed(&full, value, "rtb-")?,
                        "kubernetesclusterid" => {
                            cfg.kubernetes_cluster_id = non_empty(&full, value)?
                        }
                        "kubernetesclustertag" => {
                            cfg.kubernetes_cluster_tag = non_empty(&full, value)?
                        }
                        "rolearn" => {
                            cfg.role_arn = non_empty(&full, value)?;
                            if let Some(arn) = &cfg.role_arn
                                && !arn.starts_with("arn:")
                            {
                                return Err(ConfigError::InvalidValue {
                                    key: full,
                                    value: arn.clone(),
                                    why: "expected an IAM role ARN (arn:aws:iam::…:role/…)"
                                        .to_owned(),
                                });
                            }
                        }
                        "disablesecuritygroupingress" => {
                            cfg.disable_security_group_ingress = parse_bool(&full, &value)?
                        }
                        "elbsecuritygroup" => {
                            cfg.elb_security_group = prefixed(&full, value, "sg-")?
                        }
                        "nodeipfamilies" => {
                            if !families_seen {
                                cfg.node_ip_families.clear();
                                families_seen = true;
                            }
                            let family = match value.to_ascii_lowercase().as_str() {
                                "ipv4" => IpFamily::V4,
                                "ipv6" => IpFamily::V6,
                                _ => {
                                    return Err(ConfigError::InvalidValue {
                                        key: full,
                                        value,
                                        why: "expected ipv4 or ipv6".to_owned(),
                                    });
                                }
                            };
                            if cfg.node_ip_families.contains(&family) {
                                return Err(ConfigError::InvalidValue {
                                    key: full,
                                    value,
                                    why: "family given twice".to_owned(),
                                });
                            }
                            cfg.node_ip_families.push(family);
                        }
                        "supportedtopologyinstancetypepattern" => {
                            if let Err(err) = regex_lite::Regex::new(&value) {
                                return Err(ConfigError::InvalidValue {
                                    key: full,
                                    value,
                                    why: format!("not a regular expression: {err}"),
                                });
                            }
                            cfg.supported_topology_instance_type_pattern =
                                (!value.is_empty()).then_some(value);
                        }
                        "nlbsecuritygroupmode" => {
                            cfg.nlb_security_group_mode = match value.to_ascii_lowercase().as_str()
                            {
                                "" => NlbSecurityGroupMode::Unmanaged,
                                "managed" => NlbSecurityGroupMode::Managed,
                                _ => {
                                    return Err(ConfigError::InvalidValue {
                                        key: full,
                                        value,
                                        why: "expected Managed or empty".to_owned(),
                                    });
                                }
                            }
                        }
                        other => {
                            let hint = UNSUPPORTED_GLOBAL
                                .iter()
                                .find(|(k, _)| *k == other)
                                .map(|(_, why)| format!(": {why}"))
                                .unwrap_or_default();
                            return Err(ConfigError::UnknownKey {
                                line,
                                section: "Global".to_owned(),
                                key: key.to_owned(),
                                hint,
                            });
                        }
                    }
                }
            }
        }
        if !families_seen {
            cfg.node_ip_families = vec![IpFamily::V4];
        }
        for (name, line, pairs) in overrides {
            cfg.service_overrides
                .push(parse_override(&name, line, pairs)?);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if let (Some(id), Some(tag)) = (&self.kubernetes_cluster_id, &self.kubernetes_cluster_tag)
            && id != tag
        {
            return Err(ConfigError::InvalidValue {
                key: "Global.KubernetesClusterTag".to_owned(),
                value: tag.clone(),
                why: format!("must equal KubernetesClusterID ({id}) when both are set"),
            });
        }
        if let Some(zone) = &self.zone {
            let derived = zone_to_region(zone);
            if let Some(region) = &self.region
                && *region != derived
            {
                return Err(ConfigError::InvalidValue {
                    key: "Global.Zone".to_owned(),
                    value: zone.clone(),
                    why: format!("is not in Region {region}"),
                });
            }
        }
        Ok(())
    }

    /// The region: from `Zone`, else `Region`; `None` means "ask IMDS".
    pub fn configured_region(&self) -> Option<String> {
        self.zone
            .as_deref()
            .map(zone_to_region)
            .or_else(|| self.region.clone())
    }

    /// The cluster ID, from `KubernetesClusterID` or the legacy `KubernetesClusterTag`.
    pub fn cluster_id(&self) -> Option<&str> {
        self.kubernetes_cluster_id
            .as_deref()
            .or(self.kubernetes_cluster_tag.as_deref())
    }

    /// The endpoint override for `service` in `region`, if any.
    pub fn endpoint_for(&self, service: AwsService, region: &str) -> Option<&ServiceOverride> {
        self.service_overrides
            .iter()
            .find(|o| o.service == service && o.region.as_deref().is_none_or(|r| r == region))
    }
}

fn parse_override(name: &str, line: usize, pairs: Pairs) -> Result<ServiceOverride, ConfigError> {
    let section = format!("ServiceOverride \"{name}\"");
    let mut service = None;
    let mut region = None;
    let mut url = None;
    let mut signing_region = None;
    for (line, key, value) in pairs {
        let full = format!("{section}.{key}");
        match key.to_ascii_lowercase().as_str() {
            "service" => {
                service =
                    Some(
                        AwsService::parse(&value).ok_or_else(|| ConfigError::InvalidValue {
                            key: full,
                            value: value.clone(),
                            why: "expected ec2, elasticloadbalancing or sts".to_owned(),
                        })?,
                    )
            }
            "region" => region = non_empty(&full, value)?,
            "url" => {
                if !(value.starts_with("http://") || value.starts_with("https://")) {
                    return Err(ConfigError::InvalidValue {
                        key: full,
                        value,
                        why: "expected an http:// or https:// URL".to_owned(),
                    });
                }
                url = Some(value);
            }
            "signingregion" => signing_region = non_empty(&full, value)?,
            "signingmethod" | "signingname" => {
                return Err(ConfigError::UnknownKey {
                    line,
                    section,
                    key,
                    hint: ": custom signing is not supported (SigV4 with the service's own name)"
                        .to_owned(),
                });
            }
            _ => {
                return Err(ConfigError::UnknownKey {
                    line,
                    section,
                    key,
                    hint: String::new(),
                });
            }
        }
    }
    let missing = |what: &str| ConfigError::InvalidValue {
        key: format!("{section}.{what}"),
        value: String::new(),
        why: format!("is required (section at line {line})"),
    };
    Ok(ServiceOverride {
        name: name.to_owned(),
        service: service.ok_or_else(|| missing("Service"))?,
        region,
        url: url.ok_or_else(|| missing("URL"))?,
        signing_region,
    })
}

/// The region of an availability zone: `us-east-1a` → `us-east-1`, `us-west-2-lax-1a` →
/// `us-west-2-lax-1` (the trailing letter is dropped, as upstream does).
pub fn zone_to_region(zone: &str) -> String {
    let trimmed = zone.trim_end_matches(|c: char| c.is_ascii_lowercase());
    if trimmed.is_empty() || trimmed.len() == zone.len() {
        zone.to_owned()
    } else {
        zone[..zone.len() - 1].to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_config_parses() {
        let cfg = AwsConfig::parse(
            r#"
; a comment
[Global]
Region = us-east-1
vpc = vpc-123
SubnetID = "subnet-1"
RouteTableID = rtb-9
KubernetesClusterID = demo
KubernetesClusterTag = demo
RoleARN = arn:aws:iam::123456789012:role/ccm
DisableSecurityGroupIngress = true
ElbSecurityGroup = sg-1
NodeIPFamilies = ipv6
NodeIPFamilies = ipv4
NLBSecurityGroupMode = Managed

[ServiceOverride "1"]
Service = ec2
Region = us-east-1
URL = http://127.0.0.1:5000
SigningRegion = us-east-1

[ServiceOverride "2"]
Service = elasticloadbalancing
URL = http://127.0.0.1:5001 ; the load balancers
"#,
        )
        .unwrap();
        assert_eq!(cfg.region.as_deref(), Some("us-east-1"));
        assert_eq!(cfg.vpc.as_deref(), Some("vpc-123"));
        assert_eq!(cfg.subnet_id.as_deref(), Some("subnet-1"));
        assert_eq!(cfg.route_table_id.as_deref(), Some("rtb-9"));
        assert_eq!(cfg.cluster_id(), Some("demo"));
        assert!(cfg.disable_security_group_ingress);
        assert_eq!(cfg.elb_security_group.as_deref(), Some("sg-1"));
        assert_eq!(cfg.node_ip_families, vec![IpFamily::V6, IpFamily::V4]);
        assert_eq!(cfg.nlb_security_group_mode, NlbSecurityGroupMode::Managed);
        assert_eq!(
            cfg.endpoint_for(AwsService::Ec2, "us-east-1")
                .map(|o| o.url.as_str()),
            Some("http://127.0.0.1:5000")
        );
        assert!(cfg.endpoint_for(AwsService::Ec2, "eu-west-1").is_none());
        assert_eq!(
            cfg.endpoint_for(AwsService::ElbV2, "eu-west-1")
                .map(|o| o.url.as_str()),
            Some("http://127.0.0.1:5001")
        );
    }

    #[test]
    fn defaults() {
        let cfg = AwsConfig::parse("").unwrap();
        assert_eq!(cfg.node_ip_families, vec![IpFamily::V4]);
        assert_eq!(cfg.configured_region(), None);
        assert_eq!(cfg.cluster_id(), None);
        assert!(!cfg.disable_security_group_ingress);
    }

    #[test]
    fn unknown_key_is_named() {
        let err = AwsConfig::parse("[Global]\nRegion = us-east-1\nRegoin = x\n").unwrap_err();
        assert!(matches!(&err, ConfigError::UnknownKey { key, line: 3, .. } if key == "Regoin"));
        assert!(err.to_string().contains("\"Regoin\""), "{err}");
        let err = AwsConfig::parse("[Global]\nSourceARN = arn:x\n").unwrap_err();
        assert!(err.to_string().contains("SourceARN"), "{err}");
        let err =
            AwsConfig::parse("[ServiceOverride \"1\"]\nService = ec2\nURL = http://x\nFoo = 1\n")
                .unwrap_err();
        assert!(err.to_string().contains("\"Foo\""), "{err}");
    }

    #[test]
    fn wrong_values_are_named() {
        for (text, key) in [
            ("[Global]\nNodeIPFamilies = ipv5\n", "Global.NodeIPFamilies"),
            (
                "[Global]\nDisableSecurityGroupIngress = maybe\n",
                "Global.DisableSecurityGroupIngress",
            ),
            ("[Global]\nVPC = 123\n", "Global.VPC"),
            (
                "[Global]\nNLBSecurityGroupMode = Shared\n",
                "Global.NLBSecurityGroupMode",
            ),
            ("[Global]\nRoleARN = ccm\n", "Global.RoleARN"),
            (
                "[Global]\nKubernetesClusterID = a\nKubernetesClusterTag = b\n",
                "Global.KubernetesClusterTag",
            ),
            (
                "[Global]\nRegion = us-east-1\nZone = eu-west-1a\n",
                "Global.Zone",
            ),
            (
                "[ServiceOverride \"x\"]\nService = s3\nURL = http://x\n",
                "Service",
            ),
            (
                "[ServiceOverride \"x\"]\nService = ec2\nURL = ftp://x\n",
                "URL",
            ),
            ("[ServiceOverride \"x\"]\nService = ec2\n", "URL"),
        ] {
            let err = AwsConfig::parse(text).unwrap_err();
            assert!(
                matches!(&err, ConfigError::InvalidValue { key: k, .. } if k.ends_with(key)),
                "{text}: {err}"
            );
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn syntax_and_sections() {
        assert!(matches!(
            AwsConfig::parse("[Global\n").unwrap_err(),
            ConfigError::Syntax { line: 1, .. }
        ));
        assert!(matches!(
            AwsConfig::parse("[Other]\n").unwrap_err(),
            ConfigError::UnknownSection { .. }
        ));
        assert!(matches!(
            AwsConfig::parse("Region = x\n").unwrap_err(),
            ConfigError::Syntax { .. }
        ));
    }

    #[test]
    fn zone_gives_region() {
        assert_eq!(zone_to_region("us-east-1a"), "us-east-1");
        assert_eq!(zone_to_region("us-west-2-lax-1a"), "us-west-2-lax-1");
        let cfg = AwsConfig::parse("[Global]\nZone = eu-west-1b\n").unwrap();
        assert_eq!(cfg.configured_region().as_deref(), Some("eu-west-1"));
    }

    #[test]
    fn supported_topology_instance_type_pattern_is_a_checked_regex() {
        let cfg = AwsConfig::parse(
            "[Global]\nSupportedTopologyInstanceTypePattern = \"^(p|trn)[0-9]+\\.\"\n",
        )
        .unwrap();
        assert_eq!(
            cfg.supported_topology_instance_type_pattern.as_deref(),
            Some("^(p|trn)[0-9]+\\.")
        );
        // Unset means upstream's default.
        let cfg = AwsConfig::parse("[Global]\nRegion = us-east-1\n").unwrap();
        assert_eq!(cfg.supported_topology_instance_type_pattern, None);
        let err =
            AwsConfig::parse("[Global]\nSupportedTopologyInstanceTypePattern = (p\n").unwrap_err();
        assert!(
            err.to_string()
                .contains("Global.SupportedTopologyInstanceTypePattern"),
            "{err}"
        );
    }
}
