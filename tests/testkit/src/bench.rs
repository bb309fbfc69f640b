//! The benchmarks' command-line arguments: `cargo bench --bench <name> -- --nodes 10000`.
//!
//! Benchmarks run with `harness = false`, so they read their own arguments. `cargo bench`
//! passes `--bench`; `cargo test --benches` does not, which the benchmarks use to run a
//! small smoke version.

/// The value after `name` on the command line (`--nodes 10000`), else `default` (also when
/// the value does not parse).
pub fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether the flag `name` (`--upstream`) is on the command line.
pub fn flag(name: &str) -> bool {
    std::env::args().any(|a| a == name)
}

/// Whether `cargo bench` ran this benchmark (it passes `--bench`), rather than `cargo test
/// --benches` (a quick smoke run).
pub fn full_run() -> bool {
    flag("--bench")
}
