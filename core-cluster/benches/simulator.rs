//! Node simulator benchmark: 10,000 simulated kubelets against the API server over HTTPS on
//! loopback, on the durable SQLite store, in one process. Not a test.
//!
//! Reports the registration time, Lease renewals/s achieved against the expected
//! nodes / 10 s (and the spread per second), and CPU (utime+stime from `/proc/self/stat`,
//! split per runtime from `/proc/self/task/*/stat` by thread name) over the measurement
//! window, and peak RSS (`VmHWM`).
//!
//! `cargo bench -p core-cluster --bench simulator` (optionally
//! `-- --nodes 10000 --seconds 60`). With `--images`, the nodes simulate images and image GC
//! (every `--image-gc-period` seconds, 30 by default so that passes fall in the window; kubelet's
//! is 5 minutes) and container GC runs (every minute, as kubelet's); `--pods-per-node N`
//! (1 with `--images`, else 0) pods bound to each node, each with one of 20 images, are
//! started before the window.

#![allow(missing_docs, clippy::disallowed_types)]

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use core_cluster::{
    ApiServer, ApiServerConfig,
    sim::{NodeSimulator, SimConfig, SimNode},
    store::{SqliteOptions, SqliteStore, Store},
};
use kube::Client;
use tokio_util::sync::CancellationToken;

use ccm_testkit::bench::{arg, flag};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;

fn clock_ticks() -> f64 {
    // USER_HZ; 100 on every Linux this runs on.
    100.0
}

/// utime + stime (clock ticks) of a `stat` file's contents.
fn cpu_ticks(stat: &str) -> u64 {
    // Fields after the parenthesised comm; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 2)..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn process_ticks() -> u64 {
    cpu_ticks(&std::fs::read_to_string("/proc/self/stat").unwrap())
}

/// CPU ticks per thread-name group: "sim" (the simulator's runtime), "apisrv" (the API
/// server's runtime), everything else (SQLite writer, main) as "other".
fn ticks_by_group() -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let p = entry.path();
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(p.join("comm")),
            std::fs::read_to_string(p.join("stat")),
        ) else {
            continue;
        };
        let group = if comm.starts_with("sim") {
            "simulator"
        } else if comm.starts_with("apisrv") {
            "apiserver"
        } else {
            "other (sqlite writer, main)"
        };
        *out.entry(group).or_default() += cpu_ticks(&stat);
    }
    out
}

fn vm_hwm() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .map(|l| l.trim_start_matches("VmHWM:").trim().to_owned())
        .unwrap_or_default()
}

fn main() {
    let nodes: usize = arg("--nodes", 10_000);
    let seconds: u64 = arg("--seconds", 60);
    let images = flag("--images");
    let image_gc_period: u64 = arg("--image-gc-period", 30);
    let pods_per_node: usize = arg("--pods-per-node", usize::from(images));
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("apisrv")
        .enable_all()
        .build()
        .unwrap();
    let sim_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sim")
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let served = server_rt.block_on(async {
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.path(), SqliteOptions::default())
                .await
                .unwrap(),
        );
        let server = ApiServer::new(store, ApiServerConfig::default())
            .await
            .unwrap();
        ccm_testkit::TestServer::start(server).await.unwrap()
    });

    sim_rt.block_on(async {
        let kubeconfig = served.admin_kubeconfig();
        let client =
            Client::try_from(core_cluster::serve::client_config(&kubeconfig).await.unwrap())
                .unwrap();
        let mut config = SimConfig::default().external_cloud_provider();
        if images {
            config.image_gc.enabled = true;
            config.image_gc.period = Duration::from_secs(image_gc_period);
        }
        let sim = NodeSimulator::new(client.clone(), config);
        sim.add_nodes((0..nodes).map(|i| {
            SimNode::new(format!("sim-{i:05}")).zone(["zone-a", "zone-b", "zone-c"][i % 3])
        }));
        let run = tokio::spawn({
            let (sim, shutdown) = (sim.clone(), shutdown.clone());
            async move { sim.run(shutdown).await }
        });
        println!(
            "node simulator benchmark: {nodes} nodes, API server on HTTPS loopback in the same process, SqliteStore (WAL, synchronous=FULL, group commit); {} CPUs",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let start = Instant::now();
        while (sim.stats().registered as usize) < nodes {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let registration = start.elapsed();
        println!(
            "registration: {nodes} nodes (Node + Lease) in {:.2} s = {:.0} nodes/s",
            registration.as_secs_f64(),
            nodes as f64 / registration.as_secs_f64()
        );
        if pods_per_node > 0 {
            let start = Instant::now();
            let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), "default");
            let total = nodes * pods_per_node;
            futures::stream::iter(0..total)
                .map(|i| {
                    let pods = pods.clone();
                    async move {
                        let pod: Pod = serde_json::from_value(serde_json::json!({
                            "metadata": {"name": format!("app-{i:06}")},
                            "spec": {
                                "nodeName": format!("sim-{:05}", i % nodes),
                                "containers": [{"name": "app", "image": format!("registry.example/app-{}:v1", i % 20)}],
                            },
                        }))
                        .unwrap();
                        pods.create(&Default::default(), &pod).await.unwrap();
                    }
                })
                .buffer_unordered(64)
                .collect::<Vec<()>>()
                .await;
            while (sim.stats().pods_started as usize) < total {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!(
                "pods: {total} created and Running in {:.2} s (images: {images}, image GC every {image_gc_period} s)",
                start.elapsed().as_secs_f64()
            );
        }
        // Let the renewal phases settle past the first interval.
        tokio::time::sleep(Duration::from_secs(10)).await;

        let s0 = sim.stats();
        let cpu0 = process_ticks();
        let groups0 = ticks_by_group();
        let t0 = Instant::now();
        let mut per_second = Vec::new();
        let mut last = s0.lease_renewals;
        for _ in 0..seconds {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let r = sim.stats().lease_renewals;
            per_second.push(r - last);
            last = r;
        }
        let window = t0.elapsed().as_secs_f64();
        let s1 = sim.stats();
        let cpu = (process_ticks() - cpu0) as f64 / clock_ticks();
        let groups1 = ticks_by_group();

        let renewals = s1.lease_renewals - s0.lease_renewals;
        let expected = nodes as f64 / 10.0;
        println!("renewals per second: {per_second:?}");
        per_second.sort_unstable();
        println!(
            "lease renewals over {window:.1} s: {renewals} = {:.0}/s (expected {expected:.0}/s, {:.1} %); per second min {} / median {} / max {}",
            renewals as f64 / window,
            100.0 * renewals as f64 / window / expected,
            per_second[0],
            per_second[per_second.len() / 2],
            per_second[per_second.len() - 1],
        );
        println!(
            "lease errors in window: {}, status posts: {}",
            s1.lease_errors - s0.lease_errors,
            s1.status_posts - s0.status_posts
        );
        println!(
            "CPU over the window: {cpu:.1} s in {window:.1} s = {:.0} % of one core (process)",
            100.0 * cpu / window
        );
        for (group, t1) in &groups1 {
            let d = (t1 - groups0.get(group).copied().unwrap_or(0)) as f64 / clock_ticks();
            println!("  {group}: {:.0} % of one core", 100.0 * d / window);
        }
        println!("peak RSS (VmHWM): {}", vm_hwm());
        shutdown.cancel();
        let _ = run.await;
    });
}
