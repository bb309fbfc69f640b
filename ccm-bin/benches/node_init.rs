//! Node-initialization benchmark: N simulated nodes join at once while the fake
//! cloud adds 20 ms to every call. Not a test.
//!
//! The cluster (API server, node-side controllers, simulated kubelets registering with the
//! uninitialized taint) is a `ccm` child process in embedded mode with its own cloud
//! controllers off; this process is the cloud-controller-manager alone (`app::run_with`,
//! every default controller, leader election) on the fake cloud, talking to the child over
//! HTTP on loopback. So this process's peak RSS (`VmHWM`) is the ccm's plus the fake
//! cloud's N instances and load balancers: `bench_rss_before_ccm` is this process's RSS just
//! before the ccm starts (fake instances, runtime, the client that created the Services), and
//! `fake_lb_host_names_held` the names the fake's load balancers hold at the end (load
//! balancers with the same Nodes share one list). The fake's call log is exactly the cloud
//! calls made. The bench drains that log every 100 ms into counts by method: each logged
//! load-balancer call holds its host list (10,000 names), which is the test double's
//! memory, not the ccm's.
//!
//! `cluster_writes` counts the cluster's writes over the whole run by verb and resource (its
//! `apiserver_request_total`), the ccm's and the simulated kubelets' together.
//!
//! Times are from the bench's start, which creates the Services (`ccm_started_after`: how
//! long those creates took while the Nodes registered) and then starts the ccm.
//! Reports the time until the child counts every node initialized
//! (providerID set, uninitialized taint gone), the cloud calls by method, and peak RSS then
//! (`ccm_peak_rss`). The run then goes on until the fake cloud holds a load balancer for
//! every Service with every Node behind it (`all_lbs_ready_after`), and reports the peak RSS
//! over the whole run (`ccm_peak_rss_settled`): the service controller's ensures and node
//! syncs over 10,000 Nodes mostly happen after initialization.
//!
//! `cargo bench -p ccm-bin --no-default-features --bench node_init -- [--nodes 10000]
//! [--latency-ms 20] [--concurrent-node-syncs 1] [--services 1000] [--upstream] [--trace]`
//! (`--no-default-features` leaves the AWS provider, and its SDK's long release build, out).
//!
//! `--services N` LoadBalancer Services exist before the ccm starts (default 1,000), so the
//! service controller holds N load balancers over every Node while the Nodes join: the peak
//! RSS goal is measured with them.
//! (`--upstream`: `--concurrent-node-syncs=1 --batch-instance-metadata=false`, upstream's
//! behaviour). `--concurrent-service-syncs N` and `--concurrent-lb-host-updates N` are passed
//! to the ccm as they are (default: the ccm's, 1 and 0 = the service workers).
//!
//! The cloud API budget: `--quota N` gives the fake cloud a quota of N calls per second (bursts
//! of N), refusing calls over it as throttled; `--cloud-api-qps Q` puts the ccm's shared
//! limiter at Q calls per second (bursts of Q) and `--adaptive` lets it adapt to throttling
//! (`--cloud-api-adaptive`). The line then reports `throttled_calls`, the calls the quota
//! refused. `--nodes 2000 --services 500 --quota 20` with no limiter, `--cloud-api-qps 40`
//! and `--cloud-api-qps 40 --adaptive` compares the three.

#![allow(missing_docs, clippy::disallowed_types)]

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    net::{IpAddr, Ipv4Addr},
    process::{Command, Stdio},
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use anyhow::Context;
use ccm_testkit::bench::{arg, flag};
use cloud_provider_app::{CloudControllerManagerOptions, HealthChecks, default_registry, run_with};
use cloud_provider_fake::{FakeCloud, FakeInstance};
use tokio_util::sync::CancellationToken;

/// The `ccm` binary's allocator (see its `main.rs`), so that the ccm in this process uses
/// memory and CPU as the shipped binary does.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A `/proc/<pid>/status` field (`VmHWM`: peak RSS, `VmRSS`: RSS now) of `self` or a pid.
fn status_field(pid: &str, field: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| "?".to_owned())
}

fn peak_rss(pid: &str) -> String {
    status_field(pid, "VmHWM")
}

/// CPU seconds (user + system) a process has used so far, from `/proc/<pid>/stat`.
fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3;
    // utime and stime are fields 14 and 15, in clock ticks (100 per second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// `(registered, initialized)` out of a progress line of the embedded cluster.
fn counts_of(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("nodes: ")?;
    let (registered, after) = rest.split_once(" registered, ")?;
    Some((
        registered.parse().ok()?,
        after.split_whitespace().next()?.parse().ok()?,
    ))
}

/// Moves the fake's call log into counts by method; the total counted so far.
fn drain(cloud: &FakeCloud, by_method: &mut BTreeMap<&'static str, usize>) -> usize {
    for call in cloud.take_calls() {
        *by_method.entry(call.method().as_str()).or_default() += 1;
    }
    by_method.values().sum()
}

/// The host names the fake cloud's load balancers hold: `(held, referenced)`, where load
/// balancers with the same Nodes share one list, counted once in `held`.
fn fake_host_names(cloud: &FakeCloud) -> (usize, usize) {
    let lbs = cloud.load_balancers();
    let mut lists: Vec<&Arc<[String]>> = lbs.iter().map(|lb| &lb.hosts).collect();
    lists.sort_by_key(|list| Arc::as_ptr(list).cast::<String>());
    lists.dedup_by(|a, b| Arc::ptr_eq(a, b));
    (
        lists.iter().map(|list| list.len()).sum(),
        lbs.iter().map(|lb| lb.hosts().len()).sum(),
    )
}

/// Waits until the fake cloud holds `services` load balancers, each with all `nodes` Nodes
/// behind it, and returns when that was first seen (polled every 100 ms, 30 minutes at most).
async fn all_load_balancers_ready(
    cloud: &FakeCloud,
    services: u64,
    nodes: u64,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let lbs = cloud.load_balancers();
        let ready = lbs
            .iter()
            .filter(|lb| lb.hosts().len() as u64 == nodes)
            .count() as u64;
        if ready == services {
            return Ok(Instant::now());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "after 30 minutes {ready} of {services} load balancers have all {nodes} nodes ({} exist)",
            lbs.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `count` LoadBalancer Services in `default`, 64 creates in flight.
async fn create_services(client: &kube::Client, count: u64) -> anyhow::Result<()> {
    use futures::{StreamExt, TryStreamExt};
    use k8s_openapi::api::core::v1::Service;
    let api: kube::Api<Service> = kube::Api::namespaced(client.clone(), "default");
    futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let svc: Service = serde_json::from_value(serde_json::json!({
                    "metadata": { "name": format!("lb-{i}") },
                    "spec": {
                        "type": "LoadBalancer",
                        "ports": [{ "port": 80, "protocol": "TCP" }],
                    },
                }))?;
                match api.create(&Default::default(), &svc).await {
                    // A create retried over a new connection under load finds the first one
                    // done: the Service exists, which is all this needs.
                    Err(kube::Error::Api(status)) if status.code == 409 => {}
                    created => drop(created?),
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(64)
        .try_collect::<()>()
        .await
}

/// The cluster's writes so far by verb and resource, most first (`PATCH nodes/status=10000`),
/// from its `/metrics` (`apiserver_request_total`): what the run asked of the API server.
async fn cluster_writes(client: &kube::Client) -> String {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a GET of /metrics");
    let Ok(text) = client.request_text(request).await else {
        return "?".to_owned();
    };
    let mut writes = BTreeMap::<String, f64>::new();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = labels.split_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(name)?.strip_prefix("=\""))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let verb = label("verb");
        if matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE") {
            *writes
                .entry(format!("{verb} {}", label("resource")))
                .or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    let mut writes: Vec<(String, f64)> = writes.into_iter().collect();
    writes.sort_by(|a, b| b.1.total_cmp(&a.1));
    writes
        .iter()
        .take(12)
        .map(|(what, n)| format!("{what}={n}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn main() -> anyhow::Result<()> {
    let nodes = arg::<u64>("--nodes", 10_000);
    let latency = Duration::from_millis(arg("--latency-ms", 20));
    let upstream = flag("--upstream");
    // `--trace`: every progress line of the cluster, with the time since the bench's start, on
    // stderr (where the time goes).
    let trace = flag("--trace");
    let services = arg::<u64>("--services", 1_000);
    let quota = arg::<f64>("--quota", 0.0);
    let cloud_api_qps = arg::<f64>("--cloud-api-qps", 0.0);
    let adaptive = flag("--adaptive");
    let zones = ["zone-a", "zone-b", "zone-c"];
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");

    // The cluster, with its own cloud controllers off (no `*` in --controllers).
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--secure-port",
            "0",
            "--leader-elect=false",
        ])
        .arg("--controllers=-cloud-node-controller")
        // The simulated kubelets as the figures in BENCHMARKS.md were measured: no kubelet
        // HTTPS API (on by default since; 10,000 TLS listeners on loopback addresses in the
        // cluster process, and nodes at 127.1.0.x that the instances below do not report).
        .arg("--sim-kubelet-api=false")
        .args([
            "--sim-nodes",
            &nodes.to_string(),
            "--sim-zones",
            &zones.join(","),
        ])
        // 16,384 /24 pod CIDRs: room for every node.
        .args(["--cluster-cidr", "100.64.0.0/10"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--write-kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // A heap profiler preloaded into the bench (heaptrack) profiles the ccm, not the
        // cluster.
        .env_remove("LD_PRELOAD")
        .spawn()
        .context("starting the embedded cluster")?;
    let mut stdout = BufReader::new(child.stdout.take().context("stdout")?);
    let mut first = String::new();
    stdout.read_line(&mut first)?;
    anyhow::ensure!(first.starts_with("embedded cluster"), "unexpected: {first}");
    let (done_tx, done_rx) = mpsc::channel::<(Instant, Instant)>();
    let (start_tx, start_rx) = mpsc::channel::<Instant>();
    std::thread::spawn(move || {
        let (mut registered_at, mut sent) = (None, false);
        let mut started = None;
        for line in stdout.lines().map_while(Result::ok) {
            let Some((registered, initialized)) = counts_of(&line) else {
                continue;
            };
            if trace {
                started = started.or_else(|| start_rx.try_recv().ok());
                let at = started.map_or(0.0, |s: Instant| s.elapsed().as_secs_f64());
                eprintln!("{at:6.1}s ccm_rss={} {line}", status_field("self", "VmRSS"));
            }
            if registered == nodes && registered_at.is_none() {
                registered_at = Some(Instant::now());
            }
            if !sent && initialized == nodes {
                let now = Instant::now();
                let _ = done_tx.send((registered_at.unwrap_or(now), now));
                sent = true;
            }
        }
    });

    // The fake cloud: one instance per simulated node, as the embedded cluster names and
    // addresses them (sim-node-<i>, 10.0.0.1 + i, zones round-robin).
    let mut builder = FakeCloud::builder();
    if quota > 0.0 {
        builder = builder.quota(quota, quota.ceil() as u32);
    }
    let cloud = builder
        .latency(latency)
        .batching(!upstream)
        .instances((0..nodes).map(|i| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 1)) + i as u32);
            FakeInstance::new(format!("i-{i:08x}"), format!("sim-node-{i}"))
                .in_zone(zones[i as usize % zones.len()], "fake-region-1")
                .with_type("fake.medium")
                .with_internal_ip(IpAddr::V4(ip))
        }))
        .build();

    let mut flags = vec![
        "ccm",
        "--cloud-provider",
        "fake",
        "--secure-port",
        "0",
        "--cluster-cidr",
        "100.64.0.0/10",
        // No client-side API limit (upstream's default of 20 QPS per client would measure
        // the limiter, not the controllers); as before --kube-api-qps was honoured.
        "--kube-api-qps=-1",
    ];
    let syncs = arg::<u64>("--concurrent-node-syncs", 1).to_string();
    let service_syncs = arg::<u64>("--concurrent-service-syncs", 1).to_string();
    let lb_host_updates = arg::<u64>("--concurrent-lb-host-updates", 0).to_string();
    flags.extend([
        "--concurrent-service-syncs",
        &service_syncs,
        "--concurrent-lb-host-updates",
        &lb_host_updates,
    ]);
    let qps_flag = format!("--cloud-api-qps={cloud_api_qps}");
    let burst_flag = format!("--cloud-api-burst={}", cloud_api_qps.ceil() as u32);
    if cloud_api_qps > 0.0 {
        flags.extend([qps_flag.as_str(), burst_flag.as_str()]);
        if adaptive {
            flags.push("--cloud-api-adaptive");
        }
    }
    if upstream {
        flags.extend([
            "--concurrent-node-syncs",
            "1",
            "--batch-instance-metadata=false",
        ]);
    } else {
        flags.extend(["--concurrent-node-syncs", &syncs]);
    }
    let options = CloudControllerManagerOptions::try_parse_from(&flags)?;
    if std::env::var_os("RUST_LOG").is_some() {
        cloud_provider_app::init_logging(options.log_format);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let shutdown = CancellationToken::new();
    let by_method = Arc::new(parking_lot::Mutex::new(
        BTreeMap::<&'static str, usize>::new(),
    ));
    let started = Instant::now();
    let _ = start_tx.send(started);
    let result = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        let client_for_metrics = client.clone();
        create_services(&client, services).await?;
        let drainer = tokio::spawn({
            let (cloud, by_method) = (cloud.clone(), by_method.clone());
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    drain(&cloud, &mut by_method.lock());
                }
            }
        });
        // What this process holds before the ccm starts: the fake cloud's instances, the
        // runtime and the client that created the Services (test harness, not the ccm).
        let rss_before_ccm = status_field("self", "VmRSS");
        let ccm_started = Instant::now();
        let manager = tokio::spawn(run_with(
            options,
            default_registry(),
            Arc::new(cloud.clone()),
            client,
            shutdown.clone(),
            HealthChecks::new(),
        ));
        let done =
            tokio::task::spawn_blocking(move || done_rx.recv_timeout(Duration::from_secs(1800)))
                .await?
                .context("not every node was initialized within 30 minutes")?;
        let calls = drain(&cloud, &mut by_method.lock());
        let fake_hosts = fake_host_names(&cloud);
        let peak_at_init = peak_rss("self");
        let settled = all_load_balancers_ready(&cloud, services, nodes).await?;
        let writes = cluster_writes(&client_for_metrics).await;
        drainer.abort();
        shutdown.cancel();
        let _ = manager.await;
        anyhow::Ok((
            done,
            ccm_started,
            calls,
            rss_before_ccm,
            fake_hosts,
            peak_at_init,
            settled,
            writes,
        ))
    });
    let child_peak_rss = peak_rss(&child.id().to_string());
    let (ccm_cpu, cluster_cpu) = (cpu_seconds("self"), cpu_seconds(&child.id().to_string()));
    let throttled = cloud.throttled_calls();
    let _ = child.kill();
    let _ = child.wait();
    let (
        (registered, done),
        ccm_started,
        calls,
        rss_before_ccm,
        (names_held, names_referenced),
        peak_at_init,
        settled,
        writes,
    ) = result?;
    let by_method = by_method.lock().clone();
    let mode = if upstream {
        "upstream(concurrent-node-syncs=1,batching=off)".to_owned()
    } else {
        format!("batched,concurrent-node-syncs={syncs}")
    };
    let mode = format!(
        "{mode},concurrent-service-syncs={service_syncs},concurrent-lb-host-updates={lb_host_updates}"
    );
    let limiter = match (cloud_api_qps > 0.0, adaptive) {
        (false, _) => "none".to_owned(),
        (true, false) => format!("fixed({cloud_api_qps}/s)"),
        (true, true) => format!("adaptive(max {cloud_api_qps}/s)"),
    };
    println!(
        "node_init nodes={nodes} services={services} latency={latency:?} mode={mode} quota={quota}/s limiter={limiter} throttled_calls={throttled} ccm_started_after={:.1}s all_registered_after={:.1}s all_initialized_after={:.1}s all_lbs_ready_after={:.1}s lbs_ready_after_last_init={:.1}s cloud_calls={} by_method={by_method:?} ccm_peak_rss={peak_at_init} ccm_peak_rss_settled={} cluster_peak_rss={child_peak_rss} ccm_cpu={ccm_cpu:.1}s cluster_cpu={cluster_cpu:.1}s bench_rss_before_ccm={rss_before_ccm} fake_lb_host_names_held={names_held} (of {names_referenced} referenced) cluster_writes={writes}",
        (ccm_started - started).as_secs_f64(),
        (registered - started).as_secs_f64(),
        (done - started).as_secs_f64(),
        (settled - started).as_secs_f64(),
        (settled - done).as_secs_f64(),
        calls,
        peak_rss("self"),
    );
    Ok(())
}
