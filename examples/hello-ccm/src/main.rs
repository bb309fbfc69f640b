//! A vendor's binary: links the hello provider, finds it by name, and runs the SDK's
//! conformance kit against it.
//!
//! `hello-ccm --cloud-config FILE NODE...` prints the registered providers and the report, and
//! exits non-zero if a check failed.

// Without this line the provider crate is not linked and "hello" is not registered.
use hello_cloud_provider as _;

use cloud_provider::{
    Registry,
    conformance::{ConformanceKit, Fixture},
};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (config, nodes) = match args.as_slice() {
        [flag, path, nodes @ ..] if flag == "--cloud-config" => (Some(path.clone()), nodes),
        nodes => (None, nodes),
    };
    let registry = match Registry::global() {
        Ok(registry) => registry,
        Err(e) => fail(&e),
    };
    println!("registered providers: {}", registry.names().join(", "));
    let cloud =
        match registry.init_cloud_provider("hello", config.as_deref().map(std::path::Path::new)) {
            Ok(Some(cloud)) => cloud,
            Ok(None) => fail(&"no provider"),
            Err(e) => fail(&e),
        };
    let fixture = nodes.iter().fold(Fixture::new("hello-cluster"), |f, n| {
        f.with_running_node(Fixture::node(n, None))
    });
    let report = ConformanceKit::new(cloud, fixture).run().await;
    println!("{report}");
    std::process::exit(if report.is_success() { 0 } else { 1 });
}

fn fail(err: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {err}");
    std::process::exit(2);
}
