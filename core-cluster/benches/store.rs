//! Store benchmark (plain `main`, no harness): durable create and update throughput of
//! `SqliteStore` with 1 and 64 concurrent writers, and watch fan-out to 100 watchers.
//!
//! Run: `cargo bench -p core-cluster --bench store`. Set `STORE_BENCH_DIR` to put the
//! data directories somewhere else than the system temp dir (it must be a real disk:
//! on tmpfs the fsyncs cost nothing and the figures mean nothing). Run without
//! `--bench` (as `cargo test --all-targets` does) it does one tiny pass as a smoke test.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use core_cluster::store::{
    MemoryStore, SqliteOptions, SqliteStore, Store, StoreError, WatchConfig,
};
use futures::StreamExt;
use tokio::time::Instant;

/// A Kubernetes object is typically a few KiB of JSON; use 1 KiB values.
const VALUE_SIZE: usize = 1_024;
const WATCHERS: usize = 100;

struct Scale {
    runs: usize,
    single_ops: usize,
    per_task_ops: usize,
    fanout_events: usize,
}

struct Sample {
    ops_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn value() -> Bytes {
    Bytes::from(vec![b'x'; VALUE_SIZE])
}

async fn open_sqlite(
    root: &std::path::Path,
    watch: WatchConfig,
) -> anyhow::Result<(SqliteStore, tempfile::TempDir)> {
    let dir = tempfile::tempdir_in(root)?;
    let options = SqliteOptions {
        watch,
        ..SqliteOptions::default()
    };
    Ok((SqliteStore::open(dir.path(), options).await?, dir))
}

/// Runs `tasks` concurrent writers doing `per_task` writes each; `write(task, i)`.
async fn drive<F, Fut>(tasks: usize, per_task: usize, write: F) -> anyhow::Result<Sample>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<u64, StoreError>> + Send,
{
    let write = Arc::new(write);
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let write = write.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let begin = Instant::now();
                    write(t, i).await?;
                    latencies.push(begin.elapsed());
                }
                anyhow::Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::with_capacity(tasks * per_task);
    for handle in handles {
        latencies.extend(handle.await??);
    }
    let elapsed = start.elapsed();
    latencies.sort();
    Ok(Sample {
        ops_per_sec: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
    })
}

async fn bench_creates(
    root: &std::path::Path,
    tasks: usize,
    per_task: usize,
) -> anyhow::Result<Sample> {
    let (store, _dir) = open_sqlite(root, WatchConfig::default()).await?;
    let writer = store.clone();
    let sample = drive(tasks, per_task, move |t, i| {
        let store = writer.clone();
        async move {
            store
                .create(&format!("/registry/bench/t{t}/{i}"), value())
                .await
        }
    })
    .await?;
    store.close().await?;
    Ok(sample)
}

async fn bench_updates(
    root: &std::path::Path,
    tasks: usize,
    per_task: usize,
) -> anyhow::Result<Sample> {
    let (store, _dir) = open_sqlite(root, WatchConfig::default()).await?;
    // Each writer updates its own object, checking its mod_revision like the API
    // server's optimistic concurrency does.
    let mut revisions = Vec::new();
    for t in 0..tasks {
        revisions.push(
            store
                .create(&format!("/registry/bench/obj-{t}"), value())
                .await?,
        );
    }
    let revisions: Arc<Vec<parking_lot::Mutex<u64>>> =
        Arc::new(revisions.into_iter().map(parking_lot::Mutex::new).collect());
    let writer = store.clone();
    let sample = drive(tasks, per_task, move |t, _| {
        let store = writer.clone();
        let revisions = revisions.clone();
        async move {
            let expected = *revisions[t].lock();
            let revision = store
                .update(&format!("/registry/bench/obj-{t}"), value(), Some(expected))
                .await?;
            *revisions[t].lock() = revision;
            Ok(revision)
        }
    })
    .await?;
    store.close().await?;
    Ok(sample)
}

struct Fanout {
    /// Events delivered per second, summed over the watchers that kept up.
    delivered_per_sec: f64,
    /// Writes per second while the watchers were attached.
    writes_per_sec: f64,
    /// Watchers ended with `WatcherLagged`.
    lagged: usize,
}

/// 64 writers update objects while `WATCHERS` watchers each receive every event.
async fn bench_fanout(store: Arc<dyn Store>, events: usize) -> anyhow::Result<Fanout> {
    const TASKS: usize = 64;
    let per_task = events.div_ceil(TASKS);
    let total = per_task * TASKS;
    for t in 0..TASKS {
        store
            .create(&format!("/registry/fan/obj-{t}"), value())
            .await?;
    }
    let from = store.current_revision().await?;
    let mut watchers = Vec::new();
    for _ in 0..WATCHERS {
        let mut stream = store.watch("/registry/fan/", from).await?;
        watchers.push(tokio::spawn(async move {
            let mut seen = 0;
            while seen < total {
                match stream.next().await {
                    Some(Ok(_)) => seen += 1,
                    Some(Err(StoreError::WatcherLagged { .. })) => return Ok((None, seen)),
                    Some(Err(e)) => bail!("watcher ended after {seen} events: {e}"),
                    None => bail!("watch ended after {seen} events"),
                }
            }
            anyhow::Ok((Some(Instant::now()), seen))
        }));
    }
    let start = Instant::now();
    let writer = store.clone();
    drive(TASKS, per_task, move |t, _| {
        let store = writer.clone();
        async move {
            store
                .update(&format!("/registry/fan/obj-{t}"), value(), None)
                .await
        }
    })
    .await?;
    let writes_done = start.elapsed();
    let mut last = start;
    let mut delivered = 0;
    let mut lagged = 0;
    for watcher in watchers {
        match watcher.await?? {
            (Some(done), seen) => {
                last = last.max(done);
                delivered += seen;
            }
            (None, _) => lagged += 1,
        }
    }
    Ok(Fanout {
        delivered_per_sec: if delivered == 0 {
            0.0
        } else {
            delivered as f64 / (last - start).as_secs_f64()
        },
        writes_per_sec: total as f64 / writes_done.as_secs_f64(),
        lagged,
    })
}

async fn run(scale: Scale, root: &std::path::Path) -> anyhow::Result<()> {
    println!(
        "value size {VALUE_SIZE} B; {} runs per figure, median reported",
        scale.runs
    );
    type Bench<'a> = (&'a str, usize, usize, bool);
    let cases: [Bench<'_>; 4] = [
        ("durable creates, 1 writer", 1, scale.single_ops, false),
        ("durable creates, 64 writers", 64, scale.per_task_ops, false),
        ("durable updates (CAS), 1 writer", 1, scale.single_ops, true),
        (
            "durable updates (CAS), 64 writers",
            64,
            scale.per_task_ops,
            true,
        ),
    ];
    for (name, tasks, per_task, update) in cases {
        let mut samples = Vec::new();
        for _ in 0..scale.runs {
            samples.push(if update {
                bench_updates(root, tasks, per_task).await?
            } else {
                bench_creates(root, tasks, per_task).await?
            });
        }
        let rates: Vec<f64> = samples.iter().map(|s| s.ops_per_sec).collect();
        let all: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        let p50 = median(samples.iter().map(|s| s.p50.as_secs_f64() * 1e3).collect());
        let p99 = median(samples.iter().map(|s| s.p99.as_secs_f64() * 1e3).collect());
        println!(
            "{name:<36} {:>8.0} ops/s   latency p50 {p50:.2} ms p99 {p99:.2} ms   (runs: {})",
            median(rates),
            all.join(", ")
        );
    }

    // Fan-out with buffers big enough to hold a whole run: how fast the window
    // delivers. Then the same load with the default buffer: how many watchers keep up.
    let roomy = WatchConfig {
        window_capacity: 10_000,
        watcher_buffer: scale.fanout_events * 2,
        ..WatchConfig::default()
    };
    let mut durable = Vec::new();
    let mut memory = Vec::new();
    let mut default_buffer = Vec::new();
    for _ in 0..scale.runs {
        let (store, _dir) = open_sqlite(root, roomy).await?;
        let store = Arc::new(store);
        durable.push(bench_fanout(store.clone(), scale.fanout_events).await?);
        store.close().await?;
        let store = Arc::new(MemoryStore::with_watch_config(roomy));
        memory.push(bench_fanout(store, scale.fanout_events).await?);
        let (store, _dir) = open_sqlite(root, WatchConfig::default()).await?;
        let store = Arc::new(store);
        default_buffer.push(bench_fanout(store.clone(), scale.fanout_events).await?);
        store.close().await?;
    }
    for (name, results) in [
        ("SqliteStore, roomy buffers", durable),
        ("MemoryStore, roomy buffers", memory),
        ("SqliteStore, default 1024 buffer", default_buffer),
    ] {
        let lagged: Vec<String> = results.iter().map(|r| r.lagged.to_string()).collect();
        println!(
            "watch fan-out, {WATCHERS} watchers, {name:<33} {:>10.0} events/s delivered, {:>7.0} writes/s, watchers lagged per run: {}",
            median(results.iter().map(|r| r.delivered_per_sec).collect()),
            median(results.iter().map(|r| r.writes_per_sec).collect()),
            lagged.join(", ")
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let full = ccm_testkit::bench::full_run();
    let scale = if full {
        Scale {
            runs: 5,
            single_ops: 1_000,
            per_task_ops: 300,
            fanout_events: 12_800,
        }
    } else {
        Scale {
            runs: 1,
            single_ops: 20,
            per_task_ops: 4,
            fanout_events: 256,
        }
    };
    let root = std::env::var_os("STORE_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    println!("data directories under {}", root.display());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(run(scale, &root))
}
