//! core-cluster's node simulator, assembled once for every way `ccm` runs it: the embedded
//! default (in-process clients of its own API server, and the features only that server
//! makes possible: each kubelet as its own node user, the kubelet API, the data path, the
//! agent tunnel) and `ccm node-simulator` (a client of any API server, from a kubeconfig,
//! as kwok attaches). Both read the `--sim-*` flags of [`SimArgs`] into a [`Fleet`] and
//! start it with [`spawn`].
//!
//! The fake cloud of the simulated nodes is made here too: the embedded default builds it
//! ([`fake_cloud_builder`]), `ccm node-simulator --write-fake-cloud-config` writes it as a
//! `--cloud-config` for `ccm --cloud-provider fake` ([`fake_cloud_config`]); both list the
//! same instances.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, bail};
use cloud_provider_fake::{FakeCloud, FakeCloudBuilder, FakeInstance};
use core_cluster::sim::{
    AgentTunnelConfig, KubeletApiConfig, NodeClientFactory, NodeSimulator, ServiceProxyLimits,
    SimConfig, SimNode,
};
use tokio_util::sync::CancellationToken;

use crate::flags::parse_duration;

/// The simulated kubelets' flags, kubelet's names behind `--sim-`: shared by the embedded
/// default and `ccm node-simulator`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SimArgs {
    /// How many simulated nodes to run.
    #[arg(long, default_value_t = 3)]
    pub(crate) sim_nodes: usize,
    /// Zones the simulated nodes are spread over, comma-separated.
    #[arg(long, default_value = "zone-a,zone-b,zone-c")]
    pub(crate) sim_zones: String,
    /// Names of the simulated nodes, comma-separated, instead of `sim-node-<i>` (for a
    /// cloud whose instances already exist, such as `--cloud-provider aws`). Overrides
    /// `--sim-nodes`.
    #[arg(long, value_delimiter = ',')]
    pub(crate) sim_node_names: Vec<String>,
    /// The simulated kubelets' `--cloud-provider`: `external` (a cluster whose
    /// cloud-controller-manager initializes the Nodes: they register with the
    /// `node.cloudprovider.kubernetes.io/uninitialized` taint and their node IP in the
    /// `alpha.kubernetes.io/provided-node-ip` annotation) or `none` (they register
    /// initialized, as kubelet without a cloud provider).
    #[arg(long, default_value = "external", value_parser = ["external", "none"])]
    pub(crate) sim_cloud_provider: String,
    /// The simulated kubelets' `nodeLeaseDurationSeconds`; they renew at a quarter of it.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    pub(crate) sim_node_lease_duration: Duration,
    /// The simulated kubelets' `nodeStatusUpdateFrequency`.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) sim_node_status_update_frequency: Duration,
    /// The simulated kubelets' `shutdownGracePeriod` for a graceful node shutdown (0: off,
    /// as kubelet's default: a node shut down just powers off).
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) sim_shutdown_grace_period: Duration,
    /// The simulated kubelets' `shutdownGracePeriodCriticalPods`: the part of
    /// `--sim-shutdown-grace-period` kept for critical pods, stopped last.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub(crate) sim_shutdown_grace_period_critical_pods: Duration,
    /// The simulated kubelets' `--register-with-taints`: `key=value:Effect`,
    /// comma-separated, put on each Node at registration (beside the cloud provider's
    /// uninitialized taint).
    #[arg(long, default_value = "")]
    pub(crate) sim_register_with_taints: String,
    /// The simulated kubelets' `--node-labels`: `key=value`, comma-separated; labels in
    /// the `kubernetes.io`/`k8s.io` namespaces must be ones kubelet may set.
    #[arg(long, default_value = "")]
    pub(crate) sim_node_labels: String,
    /// The simulated kubelets' `--register-node`: false leaves creating the Nodes to an
    /// administrator; each simulated kubelet waits for its Node, then heartbeats.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) sim_register_node: bool,
    /// The simulated kubelets' `--kube-reserved` (`cpu=100m,memory=1Gi,...`), taken from
    /// allocatable.
    #[arg(long, default_value = "")]
    pub(crate) sim_kube_reserved: String,
    /// The simulated kubelets' `--system-reserved`, taken from allocatable.
    #[arg(long, default_value = "")]
    pub(crate) sim_system_reserved: String,
    /// The simulated kubelets' `--eviction-hard` (`signal<value`, comma-separated):
    /// `nodefs.available`/`imagefs.available` drive disk-pressure eviction, and
    /// `memory.available`/`nodefs.available` are taken from allocatable.
    #[arg(long, default_value = core_cluster::sim::DEFAULT_EVICTION_HARD)]
    pub(crate) sim_eviction_hard: String,
    /// The simulated kubelets' `--eviction-pressure-transition-period`: how long
    /// `DiskPressure` stays True after the last threshold met.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) sim_eviction_pressure_transition_period: Duration,
    /// A simulator config file (YAML, `kind: NodeSimulatorConfiguration`): each node's or
    /// group's KubeletConfiguration (failSwapOn, memorySwap, topologyManagerPolicy, image GC
    /// thresholds, reservations, taints...) over the `--sim-*` flags, its machine (CPUs,
    /// memory, swap, NUMA nodes) and the per-node flags `--node-ip`, `--hostname-override`
    /// and `--node-labels`. Nodes it names beyond `--sim-nodes` are added. A malformed file
    /// stops `ccm` at start, naming the node and the field.
    #[arg(long = "sim-config", value_name = "FILE")]
    pub(crate) sim_config_file: Option<PathBuf>,
}

/// The simulated nodes and their kubelets' configuration, from [`SimArgs`].
#[derive(Debug, Clone)]
pub(crate) struct Fleet {
    /// The simulator's configuration (each node's unless the config file gives its own).
    pub(crate) config: SimConfig,
    /// The nodes, each with a zone and (unless `--sim-node-names` names them) an address.
    pub(crate) nodes: Vec<SimNode>,
    /// `--sim-zones`.
    pub(crate) zones: Vec<String>,
}

impl Fleet {
    /// Reads the flags and the config file, checked as kubelet checks its own, so that a bad
    /// one stops `ccm` before anything starts. With `loopback`, nodes get 127.1.0.1 onwards
    /// (the kubelet API and the data path listen there), else 10.0.0.1 onwards.
    pub(crate) fn from_args(args: &SimArgs, loopback: bool) -> anyhow::Result<Fleet> {
        let zones: Vec<String> = args
            .sim_zones
            .split(',')
            .map(|z| z.trim().to_owned())
            .filter(|z| !z.is_empty())
            .collect();
        if zones.is_empty() {
            bail!("--sim-zones must name at least one zone");
        }
        let (config, nodes) = sim_fleet(args, &zones, loopback)?;
        Ok(Fleet {
            config,
            nodes,
            zones,
        })
    }
}

/// What the embedded default adds to the simulator, over its own API server: each kubelet
/// as its own node user, the kubelet API, the data path, the agent tunnel. All off for a
/// simulator attached by kubeconfig.
#[derive(Default)]
pub(crate) struct InProcess {
    /// Each kubelet's own client ([`NodeSimulator::with_node_clients`]).
    pub(crate) node_clients: Option<NodeClientFactory>,
    /// The kubelet API ([`NodeSimulator::with_kubelet_api`]).
    pub(crate) kubelet_api: Option<KubeletApiConfig>,
    /// The data path ([`NodeSimulator::with_service_proxy_limits`]).
    pub(crate) service_proxy: Option<ServiceProxyLimits>,
    /// The agent tunnel ([`NodeSimulator::with_agent_tunnel`]).
    pub(crate) agent_tunnel: Option<AgentTunnelConfig>,
}

/// Starts the simulator of `fleet` through `client` (its fleet-wide watches, and every
/// kubelet's writes unless `extras` gives them clients of their own) in `tasks`, until
/// `shutdown`. Returns how many nodes it runs.
pub(crate) fn spawn(
    client: kube::Client,
    fleet: Fleet,
    extras: InProcess,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> usize {
    let mut simulator = NodeSimulator::new(client, fleet.config);
    if let Some(factory) = extras.node_clients {
        simulator = simulator.with_node_clients(factory);
    }
    if let Some(config) = extras.kubelet_api {
        simulator = simulator.with_kubelet_api(config);
    }
    if let Some(limits) = extras.service_proxy {
        simulator = simulator.with_service_proxy_limits(limits);
    }
    if let Some(config) = extras.agent_tunnel {
        simulator = simulator.with_agent_tunnel(config);
    }
    let count = fleet.nodes.len();
    simulator.add_nodes(fleet.nodes);
    let shutdown = shutdown.clone();
    tasks.spawn(async move {
        if let Err(e) = simulator.run(shutdown).await {
            eprintln!("node simulator stopped: {e}");
        }
    });
    count
}

/// The `i`th node's address: 127.1.0.1 onwards with `loopback`, else 10.0.0.1 onwards (the
/// simulator's own default addresses).
fn node_ip(i: usize, loopback: bool) -> IpAddr {
    IpAddr::V4(if loopback {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 1, 0, 1)) + (i as u32 & 0xfe_ffff))
    } else {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 1)) + (i as u32 & 0x7f_ffff))
    })
}

/// The simulated nodes: `--sim-node-names`, else `sim-node-<i>` with an IP of its own that
/// the fake cloud's instance reports too (so the provided node IP matches).
pub(crate) fn sim_nodes(args: &SimArgs, zones: &[String], loopback: bool) -> Vec<SimNode> {
    if !args.sim_node_names.is_empty() {
        return args
            .sim_node_names
            .iter()
            .map(|n| n.trim())
            .filter(|n| !n.is_empty())
            .enumerate()
            .map(|(i, name)| SimNode::new(name).zone(zones[i % zones.len()].clone()))
            .collect();
    }
    (0..args.sim_nodes)
        .map(|i| {
            SimNode::new(format!("sim-node-{i}"))
                .zone(zones[i % zones.len()].clone())
                .ip(node_ip(i, loopback))
        })
        .collect()
}

/// The simulated kubelets' configuration from the `--sim-*` flags, checked as kubelet
/// checks its own: a bad one stops `ccm` before anything starts.
pub(crate) fn sim_config(args: &SimArgs) -> anyhow::Result<SimConfig> {
    use core_cluster::sim;
    let flag = |name: &'static str| move |e: String| anyhow::anyhow!("--{name}: {e}");
    let register_with_taints = sim::parse_register_with_taints(&args.sim_register_with_taints)
        .map_err(flag("sim-register-with-taints"))?;
    let node_labels =
        sim::parse_node_labels(&args.sim_node_labels).map_err(flag("sim-node-labels"))?;
    let kube_reserved =
        sim::parse_reserved(&args.sim_kube_reserved).map_err(flag("sim-kube-reserved"))?;
    let system_reserved =
        sim::parse_reserved(&args.sim_system_reserved).map_err(flag("sim-system-reserved"))?;
    let hard =
        sim::parse_eviction_hard(&args.sim_eviction_hard).map_err(flag("sim-eviction-hard"))?;
    let defaults = SimConfig::default();
    let allocatable = sim::allocatable(&defaults.capacity, &kube_reserved, &system_reserved, &hard)
        .map_err(flag("sim-kube-reserved"))?;
    let mut config = SimConfig {
        kube_reserved,
        system_reserved,
        node_lease_duration: args.sim_node_lease_duration,
        node_status_update_frequency: args.sim_node_status_update_frequency,
        shutdown_grace_period: args.sim_shutdown_grace_period,
        shutdown_grace_period_critical_pods: args.sim_shutdown_grace_period_critical_pods,
        register_node: args.sim_register_node,
        register_with_taints,
        node_labels,
        allocatable,
        eviction: sim::EvictionConfig {
            hard,
            pressure_transition_period: args.sim_eviction_pressure_transition_period,
            ..sim::EvictionConfig::default()
        },
        ..defaults
    };
    if args.sim_cloud_provider == "external" {
        config = config.external_cloud_provider();
    }
    config
        .validate()
        .context("the simulated kubelets' configuration (--sim-* flags)")?;
    Ok(config)
}

/// The simulated nodes and the simulator's configuration: the flags', then the simulator
/// config file's (`--sim-config`) over them, per node. Nodes the file adds get a zone of
/// `--sim-zones` and an address (as `sim-node-<i>`s do) unless it gives theirs.
pub(crate) fn sim_fleet(
    args: &SimArgs,
    zones: &[String],
    loopback: bool,
) -> anyhow::Result<(SimConfig, Vec<SimNode>)> {
    let nodes = sim_nodes(args, zones, loopback);
    let config = sim_config(args)?;
    let Some(path) = &args.sim_config_file else {
        return Ok((config, nodes));
    };
    let context = || format!("--sim-config {}", path.display());
    let text = std::fs::read_to_string(path).with_context(context)?;
    let file = core_cluster::sim::NodeConfigFile::parse(&text).with_context(context)?;
    let (config, mut nodes) = file.apply(&config, nodes).with_context(context)?;
    for (i, node) in nodes.iter_mut().enumerate() {
        if node.zone.is_none() {
            node.zone = Some(zones[i % zones.len()].clone());
        }
        if node.ip.is_none() && args.sim_node_names.is_empty() {
            node.ip = Some(node_ip(i, loopback));
        }
    }
    Ok((config, nodes))
}

/// The region of the simulated nodes' fake cloud.
pub(crate) const FAKE_REGION: &str = "fake-region-1";
/// The simulated nodes' instance type in their fake cloud.
const FAKE_INSTANCE_TYPE: &str = "fake.medium";

/// The fake cloud's instances for `nodes`: one running instance per node (`i-<8 hex
/// digits>`, by the node's order), in the node's zone, with the node's IP.
fn fake_instances(nodes: &[SimNode]) -> impl Iterator<Item = FakeInstance> + '_ {
    nodes.iter().enumerate().map(|(i, n)| {
        let mut instance = FakeInstance::new(format!("i-{i:08x}"), n.name.clone())
            .in_zone(n.zone.clone().unwrap_or_default(), FAKE_REGION)
            .with_type(FAKE_INSTANCE_TYPE);
        if let Some(ip) = n.ip {
            instance = instance.with_internal_ip(ip);
        }
        instance
    })
}

/// The fake cloud of `nodes` ([`fake_instances`]), its default zone the first node's.
pub(crate) fn fake_cloud_builder(nodes: &[SimNode]) -> FakeCloudBuilder {
    FakeCloud::builder()
        .default_zone(
            nodes
                .first()
                .and_then(|n| n.zone.clone())
                .unwrap_or_default(),
        )
        .instances(fake_instances(nodes))
}

/// [`fake_cloud_builder`]'s cloud as a `--cloud-config` for `--cloud-provider fake` (TOML,
/// the fake provider's format): the same instances, so that `ccm --kubeconfig
/// --cloud-provider fake` initializes simulated nodes of another process.
pub(crate) fn fake_cloud_config(nodes: &[SimNode]) -> String {
    use std::fmt::Write;
    // TOML's basic strings escape as Rust's do for the characters names and zones have.
    let quoted = |s: &str| format!("{s:?}");
    let mut text = String::from(
        "# The fake cloud of `ccm node-simulator`'s nodes: one running instance per node.\n",
    );
    let _ = writeln!(text, "region = {}", quoted(FAKE_REGION));
    if let Some(zone) = nodes.first().and_then(|n| n.zone.as_deref()) {
        let _ = writeln!(text, "zone = {}", quoted(zone));
    }
    for instance in fake_instances(nodes) {
        let ips: Vec<String> = instance
            .addresses
            .iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| quoted(&a.address))
            .collect();
        let _ = write!(
            text,
            "\n[[instances]]\nid = {}\nname = {}\nzone = {}\nregion = {}\ninstance_type = {}\ninternal_ips = [{}]\n",
            quoted(&instance.id),
            quoted(&instance.name),
            quoted(&instance.zone),
            quoted(&instance.region),
            quoted(&instance.instance_type),
            ips.join(", "),
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        args: SimArgs,
    }

    fn parse(extra: &[&str]) -> SimArgs {
        let mut argv = vec!["ccm"];
        argv.extend_from_slice(extra);
        <Flags as clap::Parser>::parse_from(argv).args
    }

    /// The written `--cloud-config` is the cloud the embedded default builds: the same
    /// instances, names, zones and addresses, read back by the fake provider.
    #[test]
    fn the_written_fake_cloud_config_lists_the_embedded_defaults_instances() {
        for loopback in [false, true] {
            let fleet = Fleet::from_args(&parse(&["--sim-nodes", "3"]), loopback).unwrap();
            let text = fake_cloud_config(&fleet.nodes);
            // The same instances; the addresses in the cloud's order, which may differ.
            let sorted = |cloud: FakeCloud| {
                let mut instances = cloud.instances();
                for instance in &mut instances {
                    instance
                        .addresses
                        .sort_by(|a, b| (&a.type_, &a.address).cmp(&(&b.type_, &b.address)));
                }
                instances
            };
            let read = sorted(FakeCloud::from_config(&text, "<written>").unwrap());
            let built = sorted(fake_cloud_builder(&fleet.nodes).build());
            assert_eq!(read, built, "{text}");
            assert_eq!(read[2].zone, "zone-c");
        }
        let named = Fleet::from_args(&parse(&["--sim-node-names", "w1,w2"]), false).unwrap();
        let read = FakeCloud::from_config(&fake_cloud_config(&named.nodes), "<written>").unwrap();
        assert_eq!(
            read.instances()
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>(),
            ["w1", "w2"]
        );
    }

    /// `--sim-cloud-provider none` registers nodes as kubelet without a cloud provider: no
    /// uninitialized taint.
    #[test]
    fn the_uninitialized_taint_is_there_only_with_an_external_cloud_provider() {
        let has_taint = |config: &SimConfig| {
            config
                .register_with_taints
                .iter()
                .any(|t| t.key == core_cluster::sim::UNINITIALIZED_TAINT_KEY)
        };
        assert!(has_taint(&sim_config(&parse(&[])).unwrap()));
        let none = sim_config(&parse(&["--sim-cloud-provider", "none"])).unwrap();
        assert!(!has_taint(&none) && !none.external_cloud_provider);
    }
}
