//! core-cluster's controllers and scheduler, assembled once for every way `ccm` runs them:
//! the embedded default (over in-process clients of its own API server) and
//! `ccm controller-manager` (over a client of any API server, from a kubeconfig). Both call
//! [`spawn`] with a [`ControlPlane`]; only the client and where the inputs come from differ.
//!
//! The controllers run under a [`Supervisor`] (a panic restarts one after a backoff) and,
//! with leader election, only while this process holds the Lease kube-controller-manager
//! leads by (`kube-system/kube-controller-manager`); the scheduler likewise under
//! kube-scheduler's (`kube-system/kube-scheduler`), so that several control planes on one
//! cluster never both act.

use std::{sync::Arc, time::Duration};

use anyhow::bail;
use cloud_provider_app::{LeaderElectionConfig, LeaderElector};
use core_cluster::controllers::{
    csr_approving::KubeletServingApprover,
    csr_signing::{CsrSigner, SigningCa},
    daemonset::DaemonSetController,
    deployment::DeploymentController,
    disruption::DisruptionController,
    endpoints::EndpointsController,
    endpointslice::EndpointSliceController,
    endpointslice_mirroring::EndpointSliceMirroringController,
    garbage_collector::GarbageCollector,
    job::JobController,
    namespace::NamespaceController,
    node_lifecycle::{NodeLifecycleConfig, NodeLifecycleController},
    pod_gc::{PodGcConfig, PodGcController},
    replicaset::ReplicaSetController,
    root_ca_publisher::RootCaPublisher,
    scheduler::{Scheduler, SchedulerConfig},
    serviceaccounts::ServiceAccountsController,
    supervisor::Supervisor,
    taint_eviction::TaintEvictionController,
    ttl_after_finished::TtlAfterFinishedController,
};
use tokio_util::sync::CancellationToken;

use crate::{flags::parse_duration, nodeipam::NodeIpamSetup};

/// kube-controller-manager's flags for the controllers both the embedded default and
/// `ccm controller-manager` run, with kube-controller-manager's names and defaults.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ControllerArgs {
    /// `--terminated-pod-gc-threshold`: terminated pods kept before pod GC deletes the
    /// oldest (0: keep them all).
    #[arg(long, default_value_t = 12_500)]
    pub(crate) terminated_pod_gc_threshold: usize,
    /// `--node-monitor-grace-period`.
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    pub(crate) node_monitor_grace_period: Duration,
    /// `--node-startup-grace-period`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub(crate) node_startup_grace_period: Duration,
    /// `--node-eviction-rate` (NoExecute taints per second per zone).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) node_eviction_rate: f64,
    /// `--secondary-node-eviction-rate`.
    #[arg(long, default_value_t = 0.01)]
    pub(crate) secondary_node_eviction_rate: f64,
    /// `--large-cluster-size-threshold`.
    #[arg(long, default_value_t = 50)]
    pub(crate) large_cluster_size_threshold: usize,
    /// `--unhealthy-zone-threshold`.
    #[arg(long, default_value_t = 0.55)]
    pub(crate) unhealthy_zone_threshold: f64,
    /// kube-controller-manager's `--cluster-signing-duration`: how long the certificates the
    /// `kubernetes.io/kubelet-serving` signer issues (for approved
    /// CertificateSigningRequests) last, unless a request asks for less.
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    pub(crate) cluster_signing_duration: Duration,
    /// Approve `kubernetes.io/kubelet-serving` CertificateSigningRequests that a node makes
    /// for its own name and addresses (as the Node shows them), so nodes with
    /// `serverTLSBootstrap` serve without `kubectl certificate approve`. Off by default, as
    /// upstream leaves these requests to the administrator or a third-party approver. Only
    /// with a signer (the embedded cluster's, or `--cluster-signing-cert-file`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) approve_kubelet_serving_certificates: bool,
}

impl ControllerArgs {
    /// The node lifecycle controller's configuration, checked as kube-controller-manager
    /// checks it; `node_monitor_period` is `--node-monitor-period`.
    pub(crate) fn lifecycle_config(
        &self,
        node_monitor_period: Duration,
    ) -> anyhow::Result<NodeLifecycleConfig> {
        if node_monitor_period.is_zero() {
            bail!("--node-monitor-period must be greater than 0");
        }
        if self.node_monitor_grace_period <= node_monitor_period {
            bail!("--node-monitor-grace-period must be longer than --node-monitor-period");
        }
        for (name, rate) in [
            ("--node-eviction-rate", self.node_eviction_rate),
            (
                "--secondary-node-eviction-rate",
                self.secondary_node_eviction_rate,
            ),
        ] {
            if !(rate.is_finite() && rate >= 0.0) {
                bail!("{name} must be a number of at least 0, got {rate}");
            }
        }
        if !(self.unhealthy_zone_threshold > 0.0 && self.unhealthy_zone_threshold <= 1.0) {
            bail!(
                "--unhealthy-zone-threshold must be in (0, 1], got {}",
                self.unhealthy_zone_threshold
            );
        }
        Ok(NodeLifecycleConfig {
            node_monitor_period,
            node_monitor_grace_period: self.node_monitor_grace_period,
            node_startup_grace_period: self.node_startup_grace_period,
            unhealthy_zone_threshold: self.unhealthy_zone_threshold,
            large_cluster_size_threshold: self.large_cluster_size_threshold,
            node_eviction_rate: self.node_eviction_rate,
            secondary_node_eviction_rate: self.secondary_node_eviction_rate,
        })
    }
}

/// What [`spawn`] runs, and against which cluster.
pub(crate) struct ControlPlane {
    /// The client every controller and the scheduler use (in-process for the embedded
    /// default, from a kubeconfig otherwise).
    pub(crate) client: kube::Client,
    /// The node lifecycle controller's configuration ([`ControllerArgs::lifecycle_config`]).
    pub(crate) lifecycle: NodeLifecycleConfig,
    /// `--terminated-pod-gc-threshold` and the rest of the kube-controller-manager flags.
    pub(crate) args: ControllerArgs,
    /// The CA the root CA publisher puts in every namespace's `kube-root-ca.crt`
    /// (kube-controller-manager's `--root-ca-file`, else its kubeconfig's CA); `None` leaves
    /// the publisher off.
    pub(crate) root_ca: Option<String>,
    /// The CA of the `kubernetes.io/kubelet-serving` signer
    /// (`--cluster-signing-cert-file`/`--cluster-signing-key-file`); `None` leaves the CSR
    /// signer, and the approver, off.
    pub(crate) signing_ca: Option<SigningCa>,
    /// The node IPAM controller's setup, when it allocates node CIDRs
    /// (`--allocate-node-cidrs`).
    pub(crate) ipam: Option<NodeIpamSetup>,
    /// Leader election (`--leader-elect`): this process's identity in the Leases, or `None`
    /// to act without them.
    pub(crate) leader_identity: Option<String>,
    /// Whether the namespace controller runs: `ccm controller-manager` runs it (an API
    /// server such as kube-apiserver leaves a deleted namespace `Terminating` until a
    /// namespace controller empties and finalizes it); the embedded default does not, since
    /// its API server does that work itself (running both converges, but does it twice).
    pub(crate) namespace_controller: bool,
}

/// Starts one run of a supervised controller (see [`Supervisor::run`]).
type BoxedStart =
    Box<dyn FnMut(CancellationToken) -> futures::future::BoxFuture<'static, ()> + Send + 'static>;

/// The controllers of one Lease, by the names the supervisor and `/livez` know them by.
type Group = Vec<(&'static str, BoxedStart)>;

/// The Lease kube-controller-manager leads by (`cmd/kube-controller-manager/app/options`
/// `LeaderElection.ResourceName`), in `kube-system`.
pub(crate) const CONTROLLER_MANAGER_LEASE: &str = "kube-controller-manager";
/// The Lease kube-scheduler leads by, in `kube-system`.
pub(crate) const SCHEDULER_LEASE: &str = "kube-scheduler";

/// Starts every controller of `plan` and the scheduler under `supervisor`, in `tasks`, until
/// `shutdown`: with leader election, each group only while this process leads its Lease.
/// Checks the configuration first (the node IPAM controller's), so that a bad one fails here
/// rather than at a restart. Returns the names of what was started, controllers first and
/// the scheduler last.
pub(crate) fn spawn(
    plan: ControlPlane,
    supervisor: &Supervisor,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Vec<&'static str>> {
    let (controller_manager, scheduler) = groups(&plan)?;
    let names: Vec<&'static str> = controller_manager
        .iter()
        .chain(&scheduler)
        .map(|(name, _)| *name)
        .collect();
    for name in &names {
        supervisor.register(name);
    }
    for (lease, group) in [
        (CONTROLLER_MANAGER_LEASE, controller_manager),
        (SCHEDULER_LEASE, scheduler),
    ] {
        match &plan.leader_identity {
            Some(identity) => {
                tasks.spawn(run_while_leading(
                    plan.client.clone(),
                    lease,
                    identity.clone(),
                    supervisor.clone(),
                    group,
                    shutdown.clone(),
                ));
            }
            None => {
                for (name, start) in group {
                    tasks.spawn(supervisor.run(name, shutdown.clone(), start));
                }
            }
        }
    }
    Ok(names)
}

/// The two groups: kube-controller-manager's controllers, and the scheduler.
fn groups(plan: &ControlPlane) -> anyhow::Result<(Group, Group)> {
    let client = &plan.client;
    let mut cm: Group = Vec::new();
    let lifecycle = plan.lifecycle.clone();
    let c = client.clone();
    cm.push((
        "node-lifecycle-controller",
        Box::new(move |s| {
            let controller = NodeLifecycleController::new(c.clone(), lifecycle.clone());
            Box::pin(async move {
                if let Err(e) = controller.run(s).await {
                    eprintln!("node lifecycle controller stopped: {e}");
                }
            })
        }),
    ));
    let c = client.clone();
    cm.push((
        "taint-eviction-controller",
        Box::new(move |s| Box::pin(TaintEvictionController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    cm.push((
        "garbage-collector-controller",
        Box::new(move |s| Box::pin(GarbageCollector::new(c.clone()).run(s))),
    ));
    // Deleted namespaces emptied, then finalized.
    if plan.namespace_controller {
        let c = client.clone();
        cm.push((
            "namespace-controller",
            Box::new(move |s| Box::pin(NamespaceController::new(c.clone()).run(s))),
        ));
    }
    let c = client.clone();
    let pod_gc = PodGcConfig {
        terminated_pod_gc_threshold: plan.args.terminated_pod_gc_threshold,
        ..PodGcConfig::default()
    };
    cm.push((
        "pod-garbage-collector-controller",
        Box::new(move |s| Box::pin(PodGcController::new(c.clone(), pod_gc.clone()).run(s))),
    ));
    // A pod's identity: the `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap
    // (the CA the API server's serving certificate chains to) in every namespace.
    let c = client.clone();
    cm.push((
        "serviceaccount-controller",
        Box::new(move |s| Box::pin(ServiceAccountsController::new(c.clone()).run(s))),
    ));
    if let Some(root_ca) = plan.root_ca.clone() {
        let c = client.clone();
        cm.push((
            "root-ca-cert-publisher",
            Box::new(move |s| Box::pin(RootCaPublisher::new(c.clone(), root_ca.clone()).run(s))),
        ));
    }
    // The kubelet-serving signer (kube-controller-manager's csrsigning controller), and the
    // opt-in approver of nodes' own serving requests.
    if let Some(signing) = plan.signing_ca.clone() {
        let duration = plan.args.cluster_signing_duration;
        let c = client.clone();
        cm.push((
            "certificatesigningrequest-signing-controller",
            Box::new(move |s| {
                Box::pin(CsrSigner::new(c.clone(), signing.clone(), duration).run(s))
            }),
        ));
        if plan.args.approve_kubelet_serving_certificates {
            let c = client.clone();
            cm.push((
                "kubelet-serving-certificate-approver",
                Box::new(move |s| Box::pin(KubeletServingApprover::new(c.clone()).run(s))),
            ));
        }
    }
    let c = client.clone();
    cm.push((
        "ttl-after-finished-controller",
        Box::new(move |s| Box::pin(TtlAfterFinishedController::new(c.clone()).run(s))),
    ));
    if let Some(ipam) = plan.ipam.clone() {
        // Checked once here, so a restart cannot fail on the configuration.
        ipam.controller(client.clone())
            .map_err(|e| anyhow::anyhow!("node IPAM controller: {e}"))?;
        let c = client.clone();
        cm.push((
            "node-ipam-controller",
            Box::new(move |s| match ipam.controller(c.clone()) {
                Ok(controller) => Box::pin(controller.run(s)),
                Err(e) => Box::pin(async move { eprintln!("node IPAM controller: {e}") }),
            }),
        ));
    }
    // Pods run: the workload controllers make them, the scheduler binds them.
    let c = client.clone();
    cm.push((
        "replicaset-controller",
        Box::new(move |s| Box::pin(ReplicaSetController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    cm.push((
        "deployment-controller",
        Box::new(move |s| Box::pin(DeploymentController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    cm.push((
        "daemonset-controller",
        Box::new(move |s| Box::pin(DaemonSetController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    cm.push((
        "job-controller",
        Box::new(move |s| Box::pin(JobController::new(c.clone()).run(s))),
    ));
    // Services' endpoints: EndpointSlices, Endpoints, and selectorless Services' Endpoints
    // mirrored as slices.
    let c = client.clone();
    cm.push((
        "endpointslice-controller",
        Box::new(move |s| Box::pin(EndpointSliceController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    cm.push((
        "endpoints-controller",
        Box::new(move |s| Box::pin(EndpointsController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    cm.push((
        "endpointslice-mirroring-controller",
        Box::new(move |s| Box::pin(EndpointSliceMirroringController::new(c.clone()).run(s))),
    ));
    // PodDisruptionBudgets' status, which evictions (`kubectl drain`) honour.
    let c = client.clone();
    cm.push((
        "disruption-controller",
        Box::new(move |s| Box::pin(DisruptionController::new(c.clone()).run(s))),
    ));
    let c = client.clone();
    let scheduler: Group = vec![(
        "scheduler",
        Box::new(move |s| Box::pin(Scheduler::new(c.clone(), SchedulerConfig::default()).run(s))),
    )];
    Ok((cm, scheduler))
}

/// A new identity in the Leases, as client-go makes one: `hostname_<random>`.
pub(crate) fn new_leader_identity() -> String {
    use std::hash::BuildHasher;
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    let random = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    format!("{host}_{random:016x}")
}

/// Runs `group` under `supervisor` while this process holds the Lease `kube-system/<lease>`
/// (client-go's `leaderelection` with upstream's 15 s lease, 10 s renew deadline and 2 s
/// retry period): campaigns, starts the group on acquiring, stops it when leadership is
/// lost and campaigns again, until `shutdown`. On shutdown the Lease is released once the
/// group has stopped (client-go's `ReleaseOnCancel`, which kube-scheduler sets; here
/// kube-controller-manager's Lease too), so another control plane takes over at its next
/// retry rather than after the 15 s lease.
async fn run_while_leading(
    client: kube::Client,
    lease: &'static str,
    identity: String,
    supervisor: Supervisor,
    group: Group,
    shutdown: CancellationToken,
) {
    type Shared = Arc<tokio::sync::Mutex<BoxedStart>>;
    let group: Vec<(&'static str, Shared)> = group
        .into_iter()
        .map(|(name, start)| (name, Arc::new(tokio::sync::Mutex::new(start))))
        .collect();
    loop {
        let elector = LeaderElector::new(
            client.clone(),
            LeaderElectionConfig::new("kube-system", lease).with_identity(identity.clone()),
        )
        .with_shutdown(shutdown.clone())
        .with_release_on_cancel(true);
        let (group, supervisor) = (group.clone(), supervisor.clone());
        let me = identity.clone();
        let led = elector
            .run(move |leading: CancellationToken| async move {
                eprintln!("leader election: leading kube-system/{lease} as {me}");
                let mut runs = tokio::task::JoinSet::new();
                for (name, start) in group {
                    runs.spawn(supervisor.run(name, leading.clone(), move |t| {
                        let start = start.clone();
                        async move {
                            let run = (start.lock().await)(t);
                            run.await;
                        }
                    }));
                }
                while runs.join_next().await.is_some() {}
                Ok::<(), std::convert::Infallible>(())
            })
            .await;
        if shutdown.is_cancelled() {
            return;
        }
        if let Err(e) = led {
            eprintln!("leader election: {e}; kube-system/{lease} campaigning again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn parse(extra: &[&str]) -> ControllerArgs {
        let mut argv = vec!["ccm"];
        argv.extend_from_slice(extra);
        <Flags as clap::Parser>::parse_from(argv).args
    }

    /// kube-controller-manager's checks of the node lifecycle flags, naming the flag.
    #[test]
    fn lifecycle_flags_are_checked_naming_the_flag() {
        let ok = parse(&[]).lifecycle_config(Duration::from_secs(5)).unwrap();
        assert_eq!(ok.node_monitor_grace_period, Duration::from_secs(50));
        for (extra, period, needle) in [
            (&[][..], Duration::ZERO, "--node-monitor-period"),
            (
                &["--node-monitor-grace-period", "5s"][..],
                Duration::from_secs(5),
                "--node-monitor-grace-period",
            ),
            (
                &["--node-eviction-rate=-1"][..],
                Duration::from_secs(5),
                "--node-eviction-rate",
            ),
            (
                &["--unhealthy-zone-threshold", "2"][..],
                Duration::from_secs(5),
                "--unhealthy-zone-threshold",
            ),
        ] {
            let e = parse(extra).lifecycle_config(period).unwrap_err();
            assert!(e.to_string().starts_with(needle), "{extra:?}: {e}");
        }
    }
}
