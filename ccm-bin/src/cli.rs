//! Command-line parsing and the subcommands.

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use cloud_provider::{
    CloudProvider, Registry,
    conformance::{ConformanceKit, Fixture},
};
use cloud_provider_fake::FakeCloud;

/// The demo cloud `ccm conformance` uses with the fake provider when no config is given.
const DEMO_CLOUD: &str = include_str!("demo-cloud.toml");
const DEMO_RUNNING_NODES: [&str; 2] = ["node-a", "node-b"];
const DEMO_STOPPED_NODE: &str = "node-c";

/// The cloud-controller-manager.
#[derive(Debug, Parser)]
#[command(name = "ccm", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand: the embedded cluster.
    #[command(flatten)]
    embedded: crate::embedded::EmbeddedArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run core-cluster's Kubernetes API server (kubectl and kube-rs work against it).
    Apiserver(crate::apiserver::ApiServerArgs),
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
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match cli.command {
        None => embedded(cli.embedded),
        Some(Command::Apiserver(args)) => apiserver(args),
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

fn embedded(args: crate::embedded::EmbeddedArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(crate::embedded::run(args))?;
    Ok(ExitCode::SUCCESS)
}

fn apiserver(args: crate::apiserver::ApiServerArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(crate::apiserver::run(args))?;
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
