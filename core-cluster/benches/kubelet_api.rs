//! The API server → kubelet paths (plain `main`, no harness): how long a container's log
//! line takes to reach a `logs -f` client, and what 1,000 concurrent followers cost (the
//! resident set per stream, the API server's `/readyz` latency meanwhile). The API server
//! is served over TLS on loopback with one simulated node; the followers are kube-rs
//! `log_stream`s through it.
//!
//! Run: `cargo bench -p core-cluster --bench kubelet_api` (`--streams N`, default 1,000).
//! Run without `--bench` (as `cargo test --all-targets` does) it does one tiny pass.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use ccm_testkit::{TestServer, bench};
use core_cluster::{
    ApiServer, ApiServerConfig, KubeletClientConfig,
    sim::{KubeletApiConfig, NodeSimulator, SimConfig},
    store::MemoryStore,
};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{LogParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

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

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let full = bench::full_run();
    let streams: usize = bench::arg("streams", if full { 1000 } else { 10 });
    let lines: usize = if full { 50 } else { 5 };
    let config = ApiServerConfig {
        kubelet: KubeletClientConfig {
            preferred_address_types: vec!["InternalIP".into()],
            ..KubeletClientConfig::default()
        },
        ..ApiServerConfig::default()
    };
    let api = ApiServer::new(Arc::new(MemoryStore::new()), config).await?;
    let server = TestServer::start(api).await?;
    let client = server.admin_client().await?;
    let sim = NodeSimulator::new(client.clone(), SimConfig::default())
        .with_kubelet_api(KubeletApiConfig::default());
    sim.add_nodes(["bench-node"]);
    let stop = CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "annotations": {
            "sim.ccm-rs.io/log-template": "line {n}", "sim.ccm-rs.io/log-interval": "100ms"}},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "app", "image": "nginx"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    loop {
        let p = pods.get("web").await?;
        if p.status.and_then(|s| s.phase).as_deref() == Some("Running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // 1. Write-to-follower latency: the line's timestamp (when the simulated container
    // wrote it) against the wall clock when the follower reads it.
    let follow = LogParams {
        follow: true,
        timestamps: true,
        tail_lines: Some(0),
        ..LogParams::default()
    };
    let mut stream = pods.log_stream("web", &follow).await?.lines();
    let mut latencies = Vec::new();
    while latencies.len() < lines {
        let line = stream.next().await.context("stream ended")??;
        let now = jiff::Timestamp::now();
        let stamp: jiff::Timestamp = line.split(' ').next().unwrap_or("").parse()?;
        latencies.push(now.duration_since(stamp).unsigned_abs());
    }
    drop(stream);
    println!(
        "log line → logs -f client: median {:?}, max {:?} over {} lines",
        median(latencies.clone()),
        latencies.iter().max().copied().unwrap_or_default(),
        latencies.len()
    );

    // 2. Many followers at once.
    let readyz = |client: kube::Client| async move {
        let started = tokio::time::Instant::now();
        let request = axum::http::Request::get("/readyz").body(Vec::new())?;
        client.request_text(request).await?;
        anyhow::Ok(started.elapsed())
    };
    let mut idle = Vec::new();
    for _ in 0..20 {
        idle.push(readyz(client.clone()).await?);
    }
    let before = rss_bytes()?;
    let mut followers = Vec::new();
    for _ in 0..streams {
        let s = pods
            .log_stream(
                "web",
                &LogParams {
                    follow: true,
                    tail_lines: Some(0),
                    ..LogParams::default()
                },
            )
            .await?;
        followers.push(tokio::spawn(async move {
            let mut lines = s.lines();
            while let Some(Ok(_)) = lines.next().await {}
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let open = sim.open_log_streams();
    let after = rss_bytes()?;
    let mut busy = Vec::new();
    for _ in 0..20 {
        busy.push(readyz(client.clone()).await?);
    }
    println!(
        "{streams} followers ({open} open on the kubelet): RSS +{:.1} MiB = {:.1} KiB per stream \
         (API server, kubelet and clients in one process); /readyz median {:?} idle, {:?} with the followers",
        (after.saturating_sub(before)) as f64 / 1048576.0,
        (after.saturating_sub(before)) as f64 / 1024.0 / streams as f64,
        median(idle),
        median(busy)
    );
    for f in &followers {
        f.abort();
    }
    stop.cancel();
    Ok(())
}
