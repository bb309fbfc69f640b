//! What the core-cluster benchmarks share.

/// The value after `name` on the command line (`--nodes 10000`), else `default`.
pub(crate) fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
