//! `ccm controller-manager`: core-cluster's share of kube-controller-manager and the
//! scheduler against any API server, by kubeconfig, as kube-controller-manager and
//! kube-scheduler run: the same controllers, under the same Leases, the embedded default
//! runs ([`crate::control_plane`]), and the namespace controller, whose work the embedded
//! default's API server does itself.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;
use core_cluster::controllers::{csr_signing::SigningCa, supervisor::Supervisor};
use tokio_util::sync::CancellationToken;

use crate::{
    attach::ClusterArgs,
    control_plane::{ControlPlane, ControllerArgs},
    flags::parse_duration,
    nodeipam::NodeIpamArgs,
};

/// Flags of `ccm controller-manager`: kube-controller-manager's names and defaults.
#[derive(Debug, clap::Args)]
pub(crate) struct ControllerManagerArgs {
    #[command(flatten)]
    cluster: ClusterArgs,
    #[command(flatten)]
    controllers: ControllerArgs,
    /// `--node-monitor-period`: how often the node lifecycle controller checks the Nodes'
    /// heartbeats.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    node_monitor_period: Duration,
    /// `--cluster-cidr`: the pods' CIDR range (one, or one per IP family), from which the
    /// node IPAM controller gives each Node its `spec.podCIDRs`.
    #[arg(long, default_value = "")]
    cluster_cidr: String,
    /// `--allocate-node-cidrs`: run the node IPAM controller (a range allocator over
    /// `--cluster-cidr`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    allocate_node_cidrs: bool,
    /// `--cidr-allocator-type`: `RangeAllocator`, the only one.
    #[arg(long, default_value = "RangeAllocator")]
    cidr_allocator_type: String,
    #[command(flatten)]
    ipam: NodeIpamArgs,
    /// `--root-ca-file`: the CA the root CA publisher puts in every namespace's
    /// `kube-root-ca.crt` ConfigMap. Default: the kubeconfig's certificate authority; with
    /// neither, the publisher does not run.
    #[arg(long, value_name = "FILE")]
    root_ca_file: Option<PathBuf>,
    /// `--cluster-signing-cert-file`: the CA certificate (PEM) the
    /// `kubernetes.io/kubelet-serving` signer issues from; with `--cluster-signing-key-file`
    /// it turns the CSR signer on.
    #[arg(long, value_name = "FILE", requires = "cluster_signing_key_file")]
    cluster_signing_cert_file: Option<PathBuf>,
    /// `--cluster-signing-key-file`: that CA's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cluster_signing_cert_file")]
    cluster_signing_key_file: Option<PathBuf>,
    /// `--leader-elect`: act only while holding the Leases `kube-system/kube-controller-manager`
    /// (the controllers) and `kube-system/kube-scheduler` (the scheduler), so that only one
    /// of several replicas, or of this and an embedded control plane, acts.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    leader_elect: bool,
}

/// Reads `path` for `flag`.
fn read(flag: &str, path: &std::path::Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("--{flag}: reading {}", path.display()))
}

/// Runs the controllers and the scheduler against the cluster until SIGTERM or Ctrl-C.
pub(crate) async fn run(args: ControllerManagerArgs) -> anyhow::Result<()> {
    let lifecycle = args
        .controllers
        .lifecycle_config(args.node_monitor_period)?;
    let ipam = crate::nodeipam::setup_from(
        &args.ipam,
        &args.cluster_cidr,
        args.allocate_node_cidrs,
        Some(&args.cidr_allocator_type),
    )
    .map_err(anyhow::Error::msg)?;
    let signing_ca = match (
        &args.cluster_signing_cert_file,
        &args.cluster_signing_key_file,
    ) {
        (Some(cert), Some(key)) => Some(SigningCa {
            cert_pem: read("cluster-signing-cert-file", cert)?,
            key_pem: read("cluster-signing-key-file", key)?,
        }),
        _ => None,
    };
    let file_ca = args
        .root_ca_file
        .as_deref()
        .map(|path| read("root-ca-file", path))
        .transpose()?;
    let (client, kubeconfig_ca) = crate::attach::connect(&args.cluster).await?;
    // Fail now, not in every controller's retries, when the cluster does not answer.
    let version = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .map_err(|_| anyhow::anyhow!("the API server did not answer within 10 s"))?
        .context("asking the API server for its version")?;
    let root_ca = file_ca.or(kubeconfig_ca);
    if root_ca.is_none() {
        eprintln!(
            "warning: no --root-ca-file and no certificate authority in the kubeconfig: the root CA publisher (kube-root-ca.crt) does not run"
        );
    }
    let plan = ControlPlane {
        client,
        lifecycle,
        args: args.controllers,
        root_ca,
        signing_ca,
        ipam: ipam.config.allocate_node_cidrs.then_some(ipam),
        leader_identity: args
            .leader_elect
            .then(crate::control_plane::new_leader_identity),
        namespace_controller: true,
    };
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let supervisor = Supervisor::default();
    let names = crate::control_plane::spawn(plan, &supervisor, &mut tasks, &shutdown)?;
    eprintln!(
        "controller-manager: against Kubernetes {}.{} ({}): {}",
        version.major,
        version.minor,
        version.git_version,
        names.join(", ")
    );
    // Each group releases its Lease once its controllers have stopped.
    crate::signals::stop_on_termination(&shutdown, &mut tasks).await;
    Ok(())
}
