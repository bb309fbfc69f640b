//! Command-line parsing and the subcommands.

use std::{net::Ipv4Addr, path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::{Context, bail};
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand, parser::ValueSource};
use cloud_provider::{
    CloudProvider, Registry,
    conformance::{ConformanceKit, Fixture},
};
use cloud_provider_app::CloudControllerManagerOptions;
use cloud_provider_fake::FakeCloud;

/// The demo cloud `ccm conformance` uses with the fake provider when no config is given.
const DEMO_CLOUD: &str = include_str!("demo-cloud.toml");
const DEMO_RUNNING_NODES: [&str; 2] = ["node-a", "node-b"];
const DEMO_STOPPED_NODE: &str = "node-c";

/// `ccm --version`: the crate's version and the git commit it was built from (`build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CCM_GIT_COMMIT"),
    ")"
);

/// The cloud-controller-manager.
#[derive(Debug, Parser)]
#[command(
    name = "ccm",
    version = VERSION,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand: the cloud-controller-manager's flags (upstream's names and
    /// defaults).
    #[command(flatten)]
    ccm: CloudControllerManagerOptions,
    /// With no subcommand and no cluster to manage: the embedded cluster's flags.
    #[command(flatten)]
    embedded: crate::embedded::EmbeddedArgs,
    /// With no subcommand: the node IPAM flags (the `nodeipam` controller against a
    /// cluster, the embedded cluster's own IPAM otherwise).
    #[command(flatten)]
    ipam: crate::nodeipam::NodeIpamArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run core-cluster's Kubernetes API server (kubectl and kube-rs work against it).
    Apiserver(Box<crate::apiserver::ApiServerArgs>),
    /// Run core-cluster's controllers and scheduler against any API server, by kubeconfig.
    ///
    /// kube-controller-manager's share (node lifecycle and taint eviction, garbage
    /// collector, namespace, pod GC, service accounts, root CA publisher,
    /// TTL-after-finished, node IPAM with --allocate-node-cidrs, ReplicaSet, Deployment,
    /// DaemonSet, Job, EndpointSlice, Endpoints, EndpointSlice mirroring, disruption, and
    /// the CSR signer with --cluster-signing-cert-file/--cluster-signing-key-file) and
    /// kube-scheduler's, with kube-controller-manager's flags, under the Leases
    /// kube-controller-manager and kube-scheduler lead by
    /// (kube-system/kube-controller-manager, kube-system/kube-scheduler) unless
    /// --leader-elect=false.
    ControllerManager(Box<crate::controller_manager::ControllerManagerArgs>),
    /// Run simulated nodes against any API server, by kubeconfig, as kwok does.
    ///
    /// The nodes register as kubelets (with --sim-cloud-provider external, the default: with
    /// the node.cloudprovider.kubernetes.io/uninitialized taint, for a
    /// cloud-controller-manager to initialize), renew their Leases, post their status and
    /// run the pods bound to them. Every kubelet acts through the kubeconfig's user (not as
    /// system:node:<name>). What needs the embedded API server is off: the kubelet API
    /// (logs, exec, port-forward, the node proxy, serving certificates), the Service data
    /// path and the agent tunnel. --write-fake-cloud-config FILE writes the fake cloud of
    /// these nodes for `ccm --kubeconfig ... --cloud-provider fake --cloud-config FILE`.
    NodeSimulator(Box<crate::node_simulator::NodeSimulatorArgs>),
    /// List the cloud providers linked into this binary.
    Providers,
    /// Run the provider conformance kit against a cloud provider and print the report.
    ///
    /// With `--cloud-provider fake` and no `--cloud-config`, it runs against a built-in demo
    /// cloud of three instances (node-a and node-b running, node-c stopped).
    Conformance(ConformanceArgs),
}

#[derive(Debug, clap::Args)]
struct ConformanceArgs {
    /// The provider, by its registered name.
    #[arg(long, default_value = "fake")]
    cloud_provider: String,
    /// The provider's config file.
    #[arg(long)]
    cloud_config: Option<PathBuf>,
    /// The cluster name passed to load-balancer and route calls.
    #[arg(long, default_value = "kubernetes")]
    cluster_name: String,
    /// A Node backed by a running instance (repeat; two are needed for the backend check).
    #[arg(long = "running-node", value_name = "NAME")]
    running_nodes: Vec<String>,
    /// A Node backed by a stopped instance.
    #[arg(long, value_name = "NAME")]
    stopped_node: Option<String>,
}

/// Parses the command line, runs the subcommand, and turns errors into a message and exit
/// code 1 (2 for a failed conformance report is not an error: it is exit code 1 with the
/// report on stdout).
pub(crate) fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(error) => error.exit(),
    };
    cloud_provider_app::init_logging_for(&cli.ccm);
    let result = match cli.command {
        None => manage(cli.ccm, cli.embedded, cli.ipam, &matches),
        Some(Command::Apiserver(args)) => apiserver(*args),
        Some(Command::ControllerManager(args)) => block_on(crate::controller_manager::run(*args)),
        Some(Command::NodeSimulator(args)) => block_on(crate::node_simulator::run(*args)),
        Some(Command::Providers) => providers(),
        Some(Command::Conformance(args)) => conformance(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Whether a flag was given (on the command line or through its environment variable)
/// rather than left at its default.
fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// Whether `ccm` has a cluster to manage: `--kubeconfig`, `--master`, or the in-cluster
/// config of a pod (the service-account environment kubelet sets).
fn cluster_given(ccm: &CloudControllerManagerOptions) -> bool {
    ccm.kubeconfig.is_some()
        || ccm.master.as_deref().is_some_and(|m| !m.is_empty())
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|h| !h.is_empty())
}

/// With a cluster, runs the cloud-controller-manager against it (upstream's command, the
/// same flags and defaults). Without one, starts the embedded default, whose defaults differ
/// where a cluster of its own needs them: `--cloud-provider fake`, `--cluster-cidr
/// 10.244.0.0/16`, `--allocate-node-cidrs=true` and `--bind-address 127.0.0.1`, each unless
/// given.
fn manage(
    mut ccm: CloudControllerManagerOptions,
    embedded: crate::embedded::EmbeddedArgs,
    ipam: crate::nodeipam::NodeIpamArgs,
    matches: &ArgMatches,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    if cluster_given(&ccm) {
        let stray: Vec<String> = crate::embedded::embedded_only_flags()
            .into_iter()
            .filter(|id| given(matches, id))
            .map(|id| format!("--{}", id.replace('_', "-")))
            .collect();
        if !stray.is_empty() {
            bail!(
                "{} only apply to the embedded cluster, which runs when there is no --kubeconfig, --master or in-cluster config",
                stray.join(", ")
            );
        }
        // The SDK's four controllers and `nodeipam`, off unless named (upstream's sample
        // `main` adds it so).
        let controllers = crate::nodeipam::registry(&ipam, &mut ccm).map_err(anyhow::Error::msg)?;
        runtime.block_on(cloud_provider_app::run(ccm, controllers))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !given(matches, "cloud_provider") {
        ccm.cloud_provider = cloud_provider_fake::PROVIDER_NAME.to_owned();
    }
    if !given(matches, "cluster_cidr") {
        ccm.cluster_cidr = "10.244.0.0/16".to_owned();
    }
    if !given(matches, "allocate_node_cidrs") {
        ccm.allocate_node_cidrs = true;
    }
    if !given(matches, "bind_address") {
        ccm.bind_address = Ipv4Addr::LOCALHOST.into();
    }
    runtime.block_on(crate::embedded::run(embedded, ipam, ccm))?;
    Ok(ExitCode::SUCCESS)
}

fn apiserver(args: crate::apiserver::ApiServerArgs) -> anyhow::Result<ExitCode> {
    block_on(crate::apiserver::run(args))
}

/// Runs a subcommand on a multi-threaded runtime: exit code 0 once it returns.
fn block_on(run: impl Future<Output = anyhow::Result<()>>) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run)?;
    Ok(ExitCode::SUCCESS)
}

fn providers() -> anyhow::Result<ExitCode> {
    let registry = Registry::global()?;
    for name in registry.names() {
        println!("{name}");
    }
    Ok(ExitCode::SUCCESS)
}

fn conformance(args: ConformanceArgs) -> anyhow::Result<ExitCode> {
    let registry = Registry::global()?;
    let use_demo = args.cloud_provider == cloud_provider_fake::PROVIDER_NAME
        && args.cloud_config.is_none()
        && args.running_nodes.is_empty();
    // The demo cloud is built directly (not through the registry) so that the kit can also
    // observe load-balancer backends through the fake's own view of them.
    let mut demo_probe = None;
    let cloud: Arc<dyn CloudProvider> = if use_demo {
        let fake = FakeCloud::from_config(DEMO_CLOUD, "<built-in demo cloud>")?;
        demo_probe = Some(Arc::new(fake.clone()));
        Arc::new(fake)
    } else {
        match registry.init_cloud_provider(&args.cloud_provider, args.cloud_config.as_deref())? {
            Some(cloud) => cloud,
            None => bail!(
                "--cloud-provider {:?} means no provider in this process; name a registered provider: {}",
                args.cloud_provider,
                registry.names().join(", ")
            ),
        }
    };

    let (running, stopped) = if use_demo {
        (
            DEMO_RUNNING_NODES.map(str::to_owned).to_vec(),
            Some(DEMO_STOPPED_NODE.to_owned()),
        )
    } else {
        (args.running_nodes, args.stopped_node)
    };
    let mut fixture = Fixture::new(&args.cluster_name);
    for name in &running {
        fixture = fixture.with_running_node(Fixture::node(name, None));
    }
    if let Some(name) = &stopped {
        fixture = fixture.with_stopped_node(Fixture::node(name, None));
    }
    if let Some(probe) = demo_probe {
        fixture = fixture.with_backend_probe(probe);
    }

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(ConformanceKit::new(cloud, fixture).run());
    println!("{report}");
    Ok(if report.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
