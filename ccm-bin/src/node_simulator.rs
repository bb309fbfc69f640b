//! `ccm node-simulator`: core-cluster's node simulator attached to any API server by
//! kubeconfig, as kwok attaches: the nodes the `--sim-*` flags describe register (with the
//! cloud provider's uninitialized taint under `--sim-cloud-provider external`), renew their
//! Leases, post their status and run the pods bound to them, all through the one client.
//! The same flags and the same assembly as the embedded default ([`crate::simulation`]),
//! without what needs the embedded API server: each kubelet as its own `system:node:<name>`
//! user, the kubelet API (logs, exec, the node proxy), the Service data path and the agent
//! tunnel.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::{
    attach::ClusterArgs,
    simulation::{Fleet, InProcess, SimArgs},
};

/// Flags of `ccm node-simulator`.
#[derive(Debug, clap::Args)]
pub(crate) struct NodeSimulatorArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    sim: SimArgs,
    /// Write the fake cloud of the simulated nodes to FILE (one running instance per node,
    /// named as the node, in its zone, with its address): the `--cloud-config` of
    /// `ccm --kubeconfig ... --cloud-provider fake`, which then initializes these nodes.
    #[arg(long, value_name = "FILE")]
    write_fake_cloud_config: Option<PathBuf>,
}

/// Runs the simulated nodes against the cluster until SIGTERM or Ctrl-C.
pub(crate) async fn run(args: NodeSimulatorArgs) -> anyhow::Result<()> {
    let fleet = Fleet::from_args(&args.sim, false)?;
    if let Some(path) = &args.write_fake_cloud_config {
        std::fs::write(path, crate::simulation::fake_cloud_config(&fleet.nodes))
            .with_context(|| format!("--write-fake-cloud-config: writing {}", path.display()))?;
    }
    let (client, _) = crate::attach::connect(&args.cluster).await?;
    tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("the API server did not answer within 10 s"))?
        .context("asking the API server for its version")?;
    let zones = fleet.zones.join(", ");
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let count =
        crate::simulation::spawn(client, fleet, InProcess::default(), &mut tasks, &shutdown);
    eprintln!("node-simulator: {count} simulated nodes across {zones}");
    // Each group releases its Lease once its controllers have stopped.
    crate::signals::stop_on_termination(&shutdown, &mut tasks).await;
    Ok(())
}
