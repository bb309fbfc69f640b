//! `ccm apiserver`: core-cluster's API server as a process, on a durable data directory.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::{Context, bail};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{MemoryStore, SqliteOptions, SqliteStore, Store},
};
use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

/// Flags of `ccm apiserver`.
#[derive(Debug, clap::Args)]
pub(crate) struct ApiServerArgs {
    /// Address to listen on (loopback by default; port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: String,
    /// Directory of the durable store (SQLite, WAL). Created if missing.
    #[arg(long, required_unless_present = "in_memory")]
    data_dir: Option<PathBuf>,
    /// Keep everything in memory instead (lost on exit; for experiments).
    #[arg(long, conflicts_with = "data_dir")]
    in_memory: bool,
    /// Write a kubeconfig for this server to FILE.
    #[arg(long, value_name = "FILE")]
    write_kubeconfig: Option<PathBuf>,
    /// CIDRs for Service ClusterIPs (one, or one per family, comma-separated).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// Port range for NodePorts, `LOW-HIGH`.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
}

pub(crate) fn parse_config(args: &ApiServerArgs) -> anyhow::Result<ApiServerConfig> {
    parse_config_from(
        &args.service_cluster_ip_range,
        &args.service_node_port_range,
    )
}

/// The API server settings from `--service-cluster-ip-range` and `--service-node-port-range`.
pub(crate) fn parse_config_from(
    ip_range: &str,
    port_range: &str,
) -> anyhow::Result<ApiServerConfig> {
    let ranges: Vec<IpNet> = ip_range
        .split(',')
        .map(|r| {
            r.trim()
                .parse::<IpNet>()
                .map(|n| n.trunc())
                .with_context(|| format!("--service-cluster-ip-range: {r:?} is not a CIDR"))
        })
        .collect::<Result<_, _>>()?;
    if ranges.is_empty()
        || ranges.len() > 2
        || (ranges.len() == 2 && ranges[0].addr().is_ipv6() == ranges[1].addr().is_ipv6())
    {
        bail!("--service-cluster-ip-range takes one CIDR, or one IPv4 and one IPv6 CIDR");
    }
    let (low, high) = port_range
        .split_once('-')
        .context("--service-node-port-range must be LOW-HIGH, e.g. 30000-32767")?;
    let low: u16 = low
        .trim()
        .parse()
        .context("--service-node-port-range: LOW is not a port")?;
    let high: u16 = high
        .trim()
        .parse()
        .context("--service-node-port-range: HIGH is not a port")?;
    if low == 0 || low > high {
        bail!("--service-node-port-range: {low}-{high} is empty or starts at 0");
    }
    Ok(ApiServerConfig {
        service_cluster_ip_ranges: ranges,
        service_node_port_range: low..=high,
        ..ApiServerConfig::default()
    })
}

/// Runs the API server until SIGTERM or Ctrl-C.
pub(crate) async fn run(args: ApiServerArgs) -> anyhow::Result<()> {
    let config = parse_config(&args)?;
    let store: Arc<dyn Store> = match &args.data_dir {
        Some(dir) => Arc::new(
            SqliteStore::open(dir, SqliteOptions::default())
                .await
                .with_context(|| format!("opening the store in {}", dir.display()))?,
        ),
        None => Arc::new(MemoryStore::new()),
    };
    let server = ApiServer::new(store, config).await?;
    let shutdown = CancellationToken::new();
    server.spawn_compactor(std::time::Duration::from_secs(300), shutdown.clone());
    let (listener, addr): (_, SocketAddr) = core_cluster::serve::bind(&args.listen).await?;
    if let Some(path) = &args.write_kubeconfig {
        core_cluster::serve::write_kubeconfig(path, addr)?;
    }
    println!("serving the Kubernetes API on http://{addr}");
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            crate::signals::terminated().await;
            shutdown.cancel();
        }
    });
    core_cluster::serve::serve(server, listener, shutdown).await?;
    eprintln!("shut down");
    Ok(())
}
