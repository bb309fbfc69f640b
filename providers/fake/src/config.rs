//! The starting cloud, read from a TOML file (`--cloud-config` for `--cloud-provider fake`).
//!
//! ```toml
//! seed = 42                 # fault decisions repeat for a given seed
//! latency_ms = 20           # added to every call
//! region = "fake-region-1"  # default for instances that name none
//! zone = "fake-zone-a"      # default zone, also what get-zone answers
//! batching = true           # instance-metadata-batch is one call (false: one per node)
//! disable = ["routes"]      # parts to report as unsupported
//! platforms = ["onprem"]    # the Nodes' platforms this cloud's ccm owns (several ccms)
//!
//! [[instances]]
//! id = "i-0001"
//! name = "node-a"
//! zone = "fake-zone-b"
//! instance_type = "fake.large"
//! internal_ips = ["10.0.0.1", "fd00::1"]
//! external_ips = ["203.0.113.1"]
//! state = "running"         # running, stopped or terminated
//! labels = { "example.com/rack" = "r1" }
//!
//! [[routes]]
//! cluster = "kubernetes"
//! cidr = "10.244.1.0/24"
//! target_node = "node-a"
//! blackhole = false
//!
//! [[faults]]
//! methods = ["instance-metadata"]   # empty or absent: every method
//! kind = "error"                    # error, instance-not-found, not-implemented, retry-after
//! message = "injected"
//! probability = 0.3
//! times = 10                        # absent: unlimited
//! ```

use std::{collections::BTreeMap, net::IpAddr, ops::Range, time::Duration};

use cloud_provider::node_address;
use ipnet::IpNet;
use serde::Deserialize;
use toml::Spanned;

use crate::{FakeCloud, FakeInstance, FakeRoute, Fault, FaultRule, InstanceState, Method, Parts};

/// A fake cloud config that could not be used. The message starts with `path:line:column`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}:{line}:{column}: {message}")]
pub struct FakeConfigError {
    /// The config file.
    pub path: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    seed: Option<u64>,
    latency_ms: Option<u64>,
    region: Option<String>,
    zone: Option<String>,
    #[serde(default = "yes")]
    batching: bool,
    #[serde(default)]
    disable: Vec<Spanned<String>>,
    #[serde(default)]
    platforms: Vec<String>,
    #[serde(default)]
    clusters: BTreeMap<String, String>,
    #[serde(default)]
    instances: Vec<Spanned<InstanceConfig>>,
    #[serde(default)]
    routes: Vec<Spanned<RouteConfig>>,
    #[serde(default)]
    faults: Vec<Spanned<FaultConfig>>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceConfig {
    id: String,
    name: String,
    zone: Option<String>,
    region: Option<String>,
    instance_type: Option<String>,
    #[serde(default)]
    internal_ips: Vec<IpAddr>,
    #[serde(default)]
    external_ips: Vec<IpAddr>,
    hostname: Option<String>,
    #[serde(default)]
    internal_dns: Vec<String>,
    #[serde(default)]
    external_dns: Vec<String>,
    #[serde(default)]
    state: StateConfig,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StateConfig {
    #[default]
    Running,
    Stopped,
    Terminated,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteConfig {
    #[serde(default = "default_cluster")]
    cluster: String,
    cidr: IpNet,
    target_node: String,
    #[serde(default)]
    name_hint: Option<String>,
    #[serde(default)]
    blackhole: bool,
}

fn default_cluster() -> String {
    "kubernetes".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum FaultKind {
    Error,
    InstanceNotFound,
    NotImplemented,
    RetryAfter,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultConfig {
    #[serde(default)]
    methods: Vec<Spanned<String>>,
    kind: FaultKind,
    message: Option<String>,
    retry_after_ms: Option<u64>,
    #[serde(default = "certain")]
    probability: Spanned<f64>,
    times: Option<u64>,
}

fn certain() -> Spanned<f64> {
    Spanned::new(0..0, 1.0)
}

/// Maps byte offsets in the config text to line and column.
struct Locator<'a> {
    path: &'a str,
    text: &'a str,
}

impl Locator<'_> {
    fn error(&self, span: Option<Range<usize>>, message: impl Into<String>) -> FakeConfigError {
        let offset = span.map_or(0, |s| s.start).min(self.text.len());
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        FakeConfigError {
            path: self.path.to_owned(),
            line,
            column,
            message: message.into(),
        }
    }
}

/// Builds a fake cloud from TOML text. `path` is only used in error messages.
pub fn parse(text: &str, path: &str) -> Result<FakeCloud, FakeConfigError> {
    let at = Locator { path, text };
    let file: ConfigFile =
        toml::from_str(text).map_err(|e| at.error(e.span(), e.message().trim()))?;

    let mut parts = Parts::default();
    for part in &file.disable {
        match part.get_ref().as_str() {
            "instances" => parts.instances = false,
            "instances-v2" => parts.instances_v2 = false,
            "zones" => parts.zones = false,
            "load-balancer" => parts.load_balancer = false,
            "routes" => parts.routes = false,
            "clusters" => parts.clusters = false,
            other => {
                return Err(at.error(
                    Some(part.span()),
                    format!(
                        "unknown part {other:?}; known parts: instances, instances-v2, zones, load-balancer, routes, clusters"
                    ),
                ));
            }
        }
    }

    let mut builder = FakeCloud::builder()
        .parts(parts)
        .batching(file.batching)
        .platforms(file.platforms)
        .clusters(file.clusters);
    if let Some(seed) = file.seed {
        builder = builder.seed(seed);
    }
    if let Some(ms) = file.latency_ms {
        builder = builder.latency(Duration::from_millis(ms));
    }
    if let Some(zone) = &file.zone {
        builder = builder.default_zone(zone.clone());
    }
    let region = file
        .region
        .clone()
        .unwrap_or_else(|| "fake-region-1".to_owned());
    let default_zone = file
        .zone
        .clone()
        .unwrap_or_else(|| "fake-zone-a".to_owned());

    let mut seen_ids = BTreeMap::new();
    let mut seen_names = BTreeMap::new();
    let mut instances = Vec::with_capacity(file.instances.len());
    for spanned in &file.instances {
        let span = spanned.span();
        let cfg = spanned.get_ref();
        if cfg.id.is_empty() || cfg.name.is_empty() {
            return Err(at.error(Some(span), "instance id and name must not be empty"));
        }
        if seen_ids.insert(cfg.id.clone(), ()).is_some() {
            return Err(at.error(Some(span), format!("duplicate instance id {:?}", cfg.id)));
        }
        if seen_names.insert(cfg.name.clone(), ()).is_some() {
            return Err(at.error(
                Some(span),
                format!("duplicate instance name {:?}", cfg.name),
            ));
        }
        let mut instance = FakeInstance::new(cfg.id.clone(), cfg.name.clone())
            .in_zone(
                cfg.zone.clone().unwrap_or_else(|| default_zone.clone()),
                cfg.region.clone().unwrap_or_else(|| region.clone()),
            )
            .with_state(match cfg.state {
                StateConfig::Running => InstanceState::Running,
                StateConfig::Stopped => InstanceState::Stopped,
                StateConfig::Terminated => InstanceState::Terminated,
            });
        if let Some(t) = &cfg.instance_type {
            instance = instance.with_type(t.clone());
        }
        // Address order as clouds report it: IPs first, then DNS names, then the hostname.
        instance.addresses.clear();
        let typed = [
            (
                "InternalIP",
                cfg.internal_ips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>(),
            ),
            (
                "ExternalIP",
                cfg.external_ips.iter().map(ToString::to_string).collect(),
            ),
            ("InternalDNS", cfg.internal_dns.clone()),
            ("ExternalDNS", cfg.external_dns.clone()),
            (
                "Hostname",
                vec![cfg.hostname.clone().unwrap_or_else(|| cfg.name.clone())],
            ),
        ];
        for (type_, values) in typed {
            for value in values {
                if value.is_empty() {
                    return Err(at.error(Some(span.clone()), format!("empty {type_} address")));
                }
                instance.addresses.push(node_address(type_, value));
            }
        }
        instance.labels = cfg.labels.clone();
        instances.push(instance);
    }
    builder = builder.instances(instances);

    let mut routes = Vec::with_capacity(file.routes.len());
    for spanned in &file.routes {
        let cfg = spanned.get_ref();
        let hint = cfg
            .name_hint
            .clone()
            .unwrap_or_else(|| cfg.target_node.clone());
        let mut route = FakeRoute::new(&cfg.cluster, &hint, cfg.cidr.trunc(), &cfg.target_node);
        route.blackhole = cfg.blackhole;
        if routes
            .iter()
            .any(|r: &FakeRoute| r.cluster == route.cluster && r.cidr == route.cidr)
        {
            return Err(at.error(
                Some(spanned.span()),
                format!(
                    "duplicate route for {} in cluster {:?}",
                    route.cidr, route.cluster
                ),
            ));
        }
        routes.push(route);
    }
    builder = builder.routes(routes);

    for spanned in &file.faults {
        let cfg = spanned.get_ref();
        let mut methods = Vec::new();
        for name in &cfg.methods {
            let method: Method = name
                .get_ref()
                .parse()
                .map_err(|e: crate::UnknownMethod| at.error(Some(name.span()), e.to_string()))?;
            methods.push(method);
        }
        let probability = *cfg.probability.get_ref();
        if !(0.0..=1.0).contains(&probability) {
            return Err(at.error(
                Some(cfg.probability.span()),
                format!("probability {probability} is not between 0 and 1"),
            ));
        }
        let message = cfg
            .message
            .clone()
            .unwrap_or_else(|| "injected fault".to_owned());
        let fault = match cfg.kind {
            FaultKind::Error => Fault::Error(message),
            FaultKind::InstanceNotFound => Fault::InstanceNotFound,
            FaultKind::NotImplemented => Fault::NotImplemented,
            FaultKind::RetryAfter => Fault::RetryAfter {
                after: Duration::from_millis(cfg.retry_after_ms.ok_or_else(|| {
                    at.error(
                        Some(spanned.span()),
                        "a retry-after fault needs retry_after_ms",
                    )
                })?),
                message,
            },
        };
        builder = builder.fault(FaultRule {
            methods,
            fault,
            probability,
            remaining: cfg.times,
        });
    }
    Ok(builder.build())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloud_provider::CloudProvider;

    fn err(text: &str) -> FakeConfigError {
        parse(text, "fake.toml").expect_err("config must be rejected")
    }

    #[test]
    fn full_config_parses() {
        let cloud = parse(
            r#"
seed = 3
latency_ms = 5
region = "r1"
disable = ["clusters"]

[[instances]]
id = "i-1"
name = "node-a"
internal_ips = ["10.0.0.1", "fd00::1"]
external_ips = ["203.0.113.1"]
state = "stopped"
labels = { "example.com/rack" = "r1" }

[[routes]]
cidr = "10.244.1.0/24"
target_node = "node-a"

[[faults]]
methods = ["list-routes"]
kind = "retry-after"
retry_after_ms = 1500
times = 1
"#,
            "fake.toml",
        )
        .unwrap();
        let instance = cloud.instance("i-1").unwrap();
        assert_eq!(instance.state, InstanceState::Stopped);
        assert_eq!(instance.region, "r1");
        assert_eq!(instance.zone, "fake-zone-a");
        let types: Vec<_> = instance
            .addresses
            .iter()
            .map(|a| a.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["InternalIP", "InternalIP", "ExternalIP", "Hostname"]
        );
        assert_eq!(cloud.routes("kubernetes").len(), 1);
        assert_eq!(cloud.latency(), Duration::from_millis(5));
        assert!(!cloud.parts().clusters);
    }

    #[test]
    fn syntax_error_has_line_and_column() {
        let e = err("seed = 1\n[[instances]\nid = \"x\"\n");
        assert_eq!((e.path.as_str(), e.line), ("fake.toml", 2), "{e}");
        assert!(e.to_string().starts_with("fake.toml:2:"), "{e}");
    }

    #[test]
    fn unknown_field_has_line_and_column() {
        let e = err("seed = 1\n\n[[instances]]\nid = \"i-1\"\nname = \"a\"\nzoen = \"z\"\n");
        assert_eq!((e.line, e.column), (6, 1), "{e}");
        assert!(e.message.contains("zoen"), "{e}");
    }

    #[test]
    fn bad_ip_has_line_and_column() {
        let e = err("[[instances]]\nid = \"i-1\"\nname = \"a\"\ninternal_ips = [\"10.0.0.300\"]\n");
        assert_eq!(e.line, 4, "{e}");
        assert!(e.column > 1, "{e}");
    }

    #[test]
    fn semantic_errors_point_at_the_entry() {
        let e = err(
            "[[instances]]\nid = \"i-1\"\nname = \"a\"\n\n[[instances]]\nid = \"i-1\"\nname = \"b\"\n",
        );
        assert!(e.message.contains("duplicate instance id"), "{e}");
        assert_eq!(e.line, 5, "{e}"); // the `[[instances]]` header of the second entry

        let e = err("[[faults]]\nkind = \"error\"\nprobability = 1.5\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("1.5"), "{e}");

        let e = err("[[faults]]\nkind = \"error\"\nmethods = [\"instance-metdata\"]\n");
        assert_eq!(e.line, 3, "{e}");
        assert!(e.message.contains("instance-metadata"), "{e}");

        let e = err("disable = [\"route\"]\n");
        assert!(e.message.contains("unknown part"), "{e}");

        let e = err("[[faults]]\nkind = \"retry-after\"\n");
        assert!(e.message.contains("retry_after_ms"), "{e}");
    }

    #[test]
    fn empty_config_is_an_empty_cloud() {
        let cloud = parse("", "fake.toml").unwrap();
        assert!(cloud.instances().is_empty());
        assert!(cloud.supported_platforms().is_empty());
    }

    /// `platforms` is what the provider's `supported_platforms` answers (several ccms in one
    /// cluster).
    #[test]
    fn platforms_are_the_supported_platforms() {
        let cloud = parse("platforms = [\"onprem\", \"edge\"]\n", "fake.toml").unwrap();
        assert_eq!(cloud.supported_platforms(), ["onprem", "edge"]);
    }
}
