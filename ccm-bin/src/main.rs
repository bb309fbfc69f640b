//! `ccm`: the cloud-controller-manager binary, with the `aws` and `fake` providers linked in
//! (`aws` through the default cargo feature of the same name).
//!
//! With no subcommand, `ccm` is the cloud-controller-manager (upstream's flags, through
//! `cloud_provider_app`):
//! - with `--kubeconfig`, `--master` or inside a pod, it manages that cluster;
//! - with none of them, it starts the embedded default: core-cluster's API server, the
//!   node-side controllers, simulated nodes and the fake cloud, and manages that.
//!
//! Subcommands:
//! - `ccm apiserver`: core-cluster's Kubernetes API server on a durable data directory;
//! - `ccm controller-manager`: core-cluster's controllers and scheduler against any API
//!   server, by kubeconfig (the embedded default runs the same ones);
//! - `ccm node-simulator`: core-cluster's simulated nodes against any API server, by
//!   kubeconfig (the embedded default runs the same simulator);
//! - `ccm providers`: the providers linked into this binary;
//! - `ccm conformance`: the provider conformance kit against a provider, by default the fake
//!   on a built-in demo cloud.

mod apiserver;
mod attach;
mod cli;
mod control_plane;
mod controller_manager;
mod embedded;
mod flags;
mod node_simulator;
mod nodeipam;
mod signals;
mod simulation;

// Link the providers so that their registrations run (a crate only listed in Cargo.toml is
// not linked; see the README). `cli` uses the fake directly too, but this line states the
// intent and keeps the registration if that use goes away.
#[cfg(feature = "aws")]
use cloud_provider_aws as _;
use cloud_provider_fake as _;

/// mimalloc, not glibc's malloc. At 10,000 simulated Nodes the embedded control plane spent
/// about a third of its CPU in glibc's malloc and free (perf); with mimalloc it registers them
/// in 6 s instead of 10 s with a third less CPU, and the ccm initializes them with a third less
/// CPU too (BENCHMARKS.md, "the allocator"). Transparent huge pages are off (`no_thp`): with
/// them the ccm's peak RSS was about 30 MB higher; without them it is about 7 % above glibc's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    // The soft limit on open files (`RLIMIT_NOFILE`) raised to the hard limit, as every Go
    // program does at start since Go 1.19, kube-apiserver among them: this process serves API
    // clients, simulated nodes and their data path, which may take at most a quarter of the
    // raised limit (`ccm_serving::connections::process_descriptor_budget`, read later). Not
    // allowed: the limit stays as it is. No child process is started, so none inherits it.
    let _ = ccm_serving::connections::raise_open_files_limit();
    cli::main()
}
