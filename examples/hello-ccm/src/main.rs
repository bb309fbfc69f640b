//! A vendor's binary for the hello provider: the README's vendor `main` (upstream's flags, the
//! four shared controllers, leader election, the secure endpoints, through
//! `cloud_provider_app::run`), with the provider linked, and the SDK's conformance kit as a
//! subcommand.
//!
//! - `hello-ccm --cloud-provider hello --cloud-config FILE --kubeconfig KUBECONFIG` runs the
//!   cloud-controller-manager against a cluster (any flag of upstream's);
//! - `hello-ccm conformance [--cloud-config FILE] NODE...` prints the registered providers and
//!   the kit's report, and exits non-zero if a check failed.

// Without this line the provider crate is not linked and "hello" is not registered.
use hello_cloud_provider as _;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use cloud_provider::{
    Registry,
    conformance::{ConformanceKit, Fixture},
};
use cloud_provider_app::{self as app, CloudControllerManagerOptions};

/// The hello cloud's cloud-controller-manager: upstream's flags, or a subcommand.
#[derive(Parser)]
#[command(args_conflicts_with_subcommands = true)]
struct Flags {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    ccm: CloudControllerManagerOptions,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the SDK's provider conformance kit against the hello provider.
    Conformance {
        /// The hello provider's config: one `name zone ip` per line.
        #[arg(long)]
        cloud_config: Option<PathBuf>,
        /// The Nodes the config lists as running instances.
        nodes: Vec<String>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let flags = Flags::parse();
    if let Some(Command::Conformance {
        cloud_config,
        nodes,
    }) = flags.command
    {
        return conformance(cloud_config, &nodes).await;
    }
    app::init_logging(flags.ccm.log_format);
    match app::run(flags.ccm, app::default_registry()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Finds the hello provider by name, as the manager does, and runs the kit against it.
async fn conformance(config: Option<PathBuf>, nodes: &[String]) -> ExitCode {
    let registry = match Registry::global() {
        Ok(registry) => registry,
        Err(e) => return fail(&e),
    };
    println!("registered providers: {}", registry.names().join(", "));
    let cloud = match registry.init_cloud_provider("hello", config.as_deref()) {
        Ok(Some(cloud)) => cloud,
        Ok(None) => return fail(&"no provider"),
        Err(e) => return fail(&e),
    };
    let fixture = nodes.iter().fold(Fixture::new("hello-cluster"), |f, n| {
        f.with_running_node(Fixture::node(n, None))
    });
    let report = ConformanceKit::new(cloud, fixture).run().await;
    println!("{report}");
    if report.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn fail(err: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::from(2)
}
