//! Watch-window memory benchmark (plain `main`, no harness): how much memory the durable
//! store holds after large objects were created and deleted, with the watch window bounded
//! by event count only (the old behaviour) and by count and bytes (the default).
//!
//! Run: `cargo bench -p core-cluster --bench watch_memory`. Each configuration runs in a
//! child process of its own (so freed memory of one run cannot hide the other's), which
//! reports its resident set size (`VmRSS`) growth. Run without `--bench` (as
//! `cargo test --all-targets` does) it does one tiny pass as a smoke test.

use std::sync::Arc;

use anyhow::{Context, bail};
use bytes::Bytes;
use core_cluster::store::{SqliteOptions, SqliteStore, Store, WatchConfig};

const MODE_ENV: &str = "WATCH_MEMORY_MODE";
const WRITERS: usize = 64;

/// The process's resident set size in bytes.
fn rss_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}

/// One run in this process: create `objects` values of `size` bytes, delete them all,
/// and report how much the resident set grew.
async fn child(mode: &str, objects: usize, size: usize) -> anyhow::Result<()> {
    let watch = match mode {
        "count" => WatchConfig {
            window_bytes: usize::MAX,
            watcher_buffer_bytes: usize::MAX,
            ..WatchConfig::default()
        },
        "bytes" => WatchConfig::default(),
        other => bail!("unknown mode {other}"),
    };
    let dir = tempfile::tempdir()?;
    let options = SqliteOptions {
        watch,
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open(dir.path(), options).await?);
    let before = rss_bytes()?;
    let value = Bytes::from(vec![b'x'; size]);
    for phase in ["create", "delete"] {
        let tasks: Vec<_> = (0..WRITERS)
            .map(|w| {
                let store = store.clone();
                let value = value.clone();
                tokio::spawn(async move {
                    for i in (w..objects).step_by(WRITERS) {
                        let key = format!("/registry/configmaps/default/big-{i}");
                        match phase {
                            "create" => store.create(&key, value.clone()).await.map(drop),
                            _ => store.delete(&key, None).await.map(drop),
                        }?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        for task in tasks {
            task.await??;
        }
    }
    let after = rss_bytes()?;
    println!("{}", after.saturating_sub(before));
    store.close().await?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let bench = ccm_testkit::bench::full_run();
    let (objects, size) = if bench {
        (4_000, 64 * 1024)
    } else {
        (50, 1024)
    };
    if let Ok(mode) = std::env::var(MODE_ENV) {
        return runtime.block_on(child(&mode, objects, size));
    }
    let runs = if bench { 3 } else { 1 };
    println!(
        "{objects} objects of {} KiB created then deleted (every event holds its object); resident set growth, median of {runs}:",
        size / 1024
    );
    for (mode, label) in [
        ("count", "window bounded by 10,000 events only"),
        (
            "bytes",
            "window bounded by 10,000 events and 128 MiB (default)",
        ),
    ] {
        let mut samples = Vec::new();
        for _ in 0..runs {
            let mut command = std::process::Command::new(std::env::current_exe()?);
            if bench {
                command.arg("--bench");
            }
            let output = command.env(MODE_ENV, mode).output()?;
            if !output.status.success() {
                bail!(
                    "{mode} run failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            let bytes: u64 = String::from_utf8(output.stdout)?.trim().parse()?;
            samples.push(bytes);
        }
        samples.sort_unstable();
        let median = samples[samples.len() / 2];
        println!(
            "{label:<56} {:>8.1} MiB   (runs: {})",
            median as f64 / 1048576.0,
            samples
                .iter()
                .map(|b| format!("{:.1}", *b as f64 / 1048576.0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
