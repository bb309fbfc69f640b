//! The embedded default: with no cluster to manage, `ccm` starts one: core-cluster's API
//! server on a durable store, the node-side controllers (node lifecycle, taint eviction,
//! node IPAM, garbage collection, pod GC), and simulated nodes, and prints their progress.
//! `kubectl` works against it through the kubeconfig it writes.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use core_cluster::{
    ApiServer,
    controllers::{
        garbage_collector::GarbageCollector,
        node_ipam::{NodeIpamConfig, NodeIpamController},
        node_lifecycle::{NodeLifecycleConfig, NodeLifecycleController},
        pod_gc::{PodGcConfig, PodGcController},
        taint_eviction::TaintEvictionController,
    },
    sim::{NodeSimulator, SimConfig, SimNode},
    store::{SqliteOptions, SqliteStore, Store},
};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};
use tokio_util::sync::CancellationToken;

use crate::flags::parse_duration;

/// Flags of the embedded default. The node-lifecycle and IPAM flags keep
/// kube-controller-manager's names and defaults.
#[derive(Debug, clap::Args)]
pub(crate) struct EmbeddedArgs {
    /// Address of the API server (loopback; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// Directory of the durable store. Default: a fresh temporary directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Where to write the kubeconfig for kubectl.
    #[arg(long, value_name = "FILE", default_value = "ccm.kubeconfig")]
    write_kubeconfig: PathBuf,
    /// How many simulated nodes to run.
    #[arg(long, default_value_t = 3)]
    sim_nodes: usize,
    /// Zones the simulated nodes are spread over, comma-separated.
    #[arg(long, default_value = "zone-a,zone-b,zone-c")]
    sim_zones: String,
    /// The simulated kubelets' `nodeLeaseDurationSeconds`; they renew at a quarter of it.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    sim_node_lease_duration: Duration,
    /// The simulated kubelets' `nodeStatusUpdateFrequency`.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    sim_node_status_update_frequency: Duration,
    /// `--node-monitor-period`.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    node_monitor_period: Duration,
    /// `--node-monitor-grace-period`.
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    node_monitor_grace_period: Duration,
    /// `--node-startup-grace-period`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    node_startup_grace_period: Duration,
    /// `--node-eviction-rate` (NoExecute taints per second per zone).
    #[arg(long, default_value_t = 0.1)]
    node_eviction_rate: f64,
    /// `--secondary-node-eviction-rate`.
    #[arg(long, default_value_t = 0.01)]
    secondary_node_eviction_rate: f64,
    /// `--large-cluster-size-threshold`.
    #[arg(long, default_value_t = 50)]
    large_cluster_size_threshold: usize,
    /// `--unhealthy-zone-threshold`.
    #[arg(long, default_value_t = 0.55)]
    unhealthy_zone_threshold: f64,
    /// `--allocate-node-cidrs`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    allocate_node_cidrs: bool,
    /// `--cluster-cidr` (one, or one per family, comma-separated).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// `--node-cidr-mask-size-ipv4`.
    #[arg(long, default_value_t = 24)]
    node_cidr_mask_size_ipv4: u8,
    /// `--node-cidr-mask-size-ipv6`.
    #[arg(long, default_value_t = 64)]
    node_cidr_mask_size_ipv6: u8,
    /// `--service-cluster-ip-range`.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
}

fn lifecycle_config(args: &EmbeddedArgs) -> anyhow::Result<NodeLifecycleConfig> {
    if args.node_monitor_period.is_zero() {
        bail!("--node-monitor-period must be greater than 0");
    }
    if args.node_monitor_grace_period <= args.node_monitor_period {
        bail!("--node-monitor-grace-period must be longer than --node-monitor-period");
    }
    for (name, rate) in [
        ("--node-eviction-rate", args.node_eviction_rate),
        (
            "--secondary-node-eviction-rate",
            args.secondary_node_eviction_rate,
        ),
    ] {
        if !(rate.is_finite() && rate >= 0.0) {
            bail!("{name} must be a number of at least 0, got {rate}");
        }
    }
    if !(args.unhealthy_zone_threshold > 0.0 && args.unhealthy_zone_threshold <= 1.0) {
        bail!(
            "--unhealthy-zone-threshold must be in (0, 1], got {}",
            args.unhealthy_zone_threshold
        );
    }
    Ok(NodeLifecycleConfig {
        node_monitor_period: args.node_monitor_period,
        node_monitor_grace_period: args.node_monitor_grace_period,
        node_startup_grace_period: args.node_startup_grace_period,
        unhealthy_zone_threshold: args.unhealthy_zone_threshold,
        large_cluster_size_threshold: args.large_cluster_size_threshold,
        node_eviction_rate: args.node_eviction_rate,
        secondary_node_eviction_rate: args.secondary_node_eviction_rate,
    })
}

fn ipam_config(args: &EmbeddedArgs) -> anyhow::Result<NodeIpamConfig> {
    let cluster_cidrs = args
        .cluster_cidr
        .split(',')
        .map(|c| {
            c.trim()
                .parse::<IpNet>()
                .with_context(|| format!("--cluster-cidr: {c:?} is not a CIDR"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let config = NodeIpamConfig {
        allocate_node_cidrs: args.allocate_node_cidrs,
        cluster_cidrs,
        node_cidr_mask_size_ipv4: args.node_cidr_mask_size_ipv4,
        node_cidr_mask_size_ipv6: args.node_cidr_mask_size_ipv6,
    };
    config
        .validate()
        .context("--cluster-cidr / --node-cidr-mask-size")?;
    Ok(config)
}

/// Prints a progress line. A closed stdout (a pipe whose reader went away) must not stop
/// the cluster, so write errors are ignored instead of panicking as `println!` would.
fn say(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// What the progress line reports.
#[derive(Debug, Default, PartialEq, Eq, Clone)]
struct Progress {
    registered: usize,
    ready: usize,
    with_pod_cidr: usize,
    not_ready_or_unknown: usize,
    tainted_no_execute: usize,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nodes: {} registered, {} Ready, {} with a pod CIDR, {} NotReady/Unknown, {} tainted NoExecute",
            self.registered,
            self.ready,
            self.with_pod_cidr,
            self.not_ready_or_unknown,
            self.tainted_no_execute
        )
    }
}

fn progress_of(nodes: &[Node]) -> Progress {
    let mut p = Progress {
        registered: nodes.len(),
        ..Progress::default()
    };
    for node in nodes {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.as_str());
        if ready == Some("True") {
            p.ready += 1;
        } else {
            p.not_ready_or_unknown += 1;
        }
        let spec = node.spec.as_ref();
        if spec
            .and_then(|s| s.pod_cidrs.as_ref())
            .is_some_and(|c| !c.is_empty())
        {
            p.with_pod_cidr += 1;
        }
        if spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.effect == "NoExecute"))
        {
            p.tainted_no_execute += 1;
        }
    }
    p
}

/// Runs the embedded cluster until SIGTERM or Ctrl-C.
pub(crate) async fn run(args: EmbeddedArgs) -> anyhow::Result<()> {
    let lifecycle = lifecycle_config(&args)?;
    let ipam = ipam_config(&args)?;
    let apiserver_args =
        crate::apiserver::parse_config_from(&args.service_cluster_ip_range, "30000-32767")?;
    let zones: Vec<String> = args
        .sim_zones
        .split(',')
        .map(|z| z.trim().to_owned())
        .filter(|z| !z.is_empty())
        .collect();
    if zones.is_empty() {
        bail!("--sim-zones must name at least one zone");
    }

    let temp;
    let data_dir = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => {
            temp = tempfile::tempdir().context("creating a temporary data directory")?;
            temp.path().to_owned()
        }
    };
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(&data_dir, SqliteOptions::default())
            .await
            .with_context(|| format!("opening the store in {}", data_dir.display()))?,
    );
    let server = ApiServer::new(store, apiserver_args).await?;
    let shutdown = CancellationToken::new();
    server.spawn_compactor(Duration::from_secs(300), shutdown.clone());
    let (listener, addr): (_, SocketAddr) = core_cluster::serve::bind(&args.listen).await?;
    core_cluster::serve::write_kubeconfig(&args.write_kubeconfig, addr)?;
    tokio::spawn(core_cluster::serve::serve(
        server.clone(),
        listener,
        shutdown.clone(),
    ));
    say(format_args!(
        "embedded cluster: API server on http://{addr}, store in {}",
        data_dir.display()
    ));
    say(format_args!(
        "  kubectl --kubeconfig {} get nodes",
        args.write_kubeconfig.display()
    ));

    // The controllers are API clients like any other; in-process they skip TCP.
    let client = kube::Client::new(server.router(), "default");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn({
        let c = NodeLifecycleController::new(client.clone(), lifecycle);
        let s = shutdown.clone();
        async move {
            if let Err(e) = c.run(s).await {
                eprintln!("node lifecycle controller stopped: {e}");
            }
        }
    });
    tasks.spawn(TaintEvictionController::new(client.clone()).run(shutdown.clone()));
    tasks.spawn(GarbageCollector::new(client.clone()).run(shutdown.clone()));
    tasks.spawn(PodGcController::new(client.clone(), PodGcConfig::default()).run(shutdown.clone()));
    if ipam.allocate_node_cidrs {
        tasks.spawn(NodeIpamController::new(client.clone(), ipam)?.run(shutdown.clone()));
    }

    if args.sim_node_lease_duration / 4 >= args.node_monitor_grace_period {
        eprintln!(
            "warning: simulated nodes renew every {:?}, longer than --node-monitor-grace-period {:?}: healthy nodes will flap to Unknown",
            args.sim_node_lease_duration / 4,
            args.node_monitor_grace_period
        );
    }
    let sim_config = SimConfig {
        node_lease_duration: args.sim_node_lease_duration,
        node_status_update_frequency: args.sim_node_status_update_frequency,
        ..SimConfig::default()
    };
    let simulator = NodeSimulator::new(client.clone(), sim_config);
    simulator.add_nodes(
        (0..args.sim_nodes)
            .map(|i| SimNode::new(format!("sim-node-{i}")).zone(zones[i % zones.len()].clone())),
    );
    tasks.spawn({
        let s = shutdown.clone();
        async move {
            if let Err(e) = simulator.run(s).await {
                eprintln!("node simulator stopped: {e}");
            }
        }
    });
    say(format_args!(
        "  {} simulated nodes across {}",
        args.sim_nodes,
        zones.join(", ")
    ));

    let nodes: Api<Node> = Api::all(client);
    let mut last = Progress::default();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let terminated = crate::signals::terminated();
    tokio::pin!(terminated);
    loop {
        tokio::select! {
            _ = &mut terminated => break,
            _ = ticker.tick() => {
                if let Ok(list) = nodes.list(&ListParams::default()).await {
                    let now = progress_of(&list.items);
                    if now != last {
                        say(&now);
                        last = now;
                    }
                }
            }
        }
    }
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    say(format_args!("summary: {last}"));
    Ok(())
}
