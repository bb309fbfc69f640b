//! Writes through `ccm apiserver` on a three-member etcd when a member is lost (issue 47).
//! Not a test: figures go to BENCHMARKS.md.
//!
//! Each run starts a fresh three-member etcd on loopback (`$CCM_ETCD`) and a `ccm apiserver
//! --etcd-servers` child process given all three, and drives it over HTTPS with kube-rs
//! (the admin kubeconfig the server writes), `--writers` concurrent writers creating
//! ConfigMaps, one create after another, nothing retried:
//!
//! - **one member down**: `--secs` seconds with every member up (the baseline), then a
//!   follower is killed (SIGKILL) and `--secs` seconds more: for each phase the creates
//!   acknowledged and failed, the success rate, and the p50, p99 and slowest latency;
//! - **leader loss**: writes run, the leader is killed 3 s in, and `--secs` seconds more:
//!   the stall (the longest time after the kill in which no create completed), the
//!   failed creates, and the slowest create.
//!
//! Before a run's figures are kept, every acknowledged create is listed back (none lost).
//! Prints each run and then the median of the runs.
//!
//! `cargo bench -p ccm-bin --no-default-features --bench etcd_member_loss -- [--runs 3]
//! [--secs 30] [--writers 8] [--ccm PATH]` (`--ccm` runs another build of `ccm`, such as
//! one from before a change; by default the one this build makes). `cargo test --benches`
//! runs a one-second smoke version.

#![allow(missing_docs, clippy::disallowed_types)]

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use ccm_testkit::{
    bench::{arg, full_run},
    etcd::Etcd,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client, Config,
    api::{ListParams, PostParams},
};

/// Whether etcd's member at `url` (`http://127.0.0.1:port`) leads, from its `/metrics`
/// (`etcd_server_is_leader 1`).
fn is_leader(url: &str) -> bool {
    let Some(addr) = url.strip_prefix("http://") else {
        return false;
    };
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body.lines().any(|l| l.trim() == "etcd_server_is_leader 1")
}

/// The index of the member leading `etcd`, waiting up to 30 s for an election.
async fn leader(etcd: &Etcd) -> anyhow::Result<usize> {
    for _ in 0..300 {
        if let Some(index) = etcd
            .members
            .iter()
            .position(|m| m.running() && is_leader(&m.url()))
        {
            return Ok(index);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("etcd elected no leader within 30 s")
}

/// A `ccm apiserver` child process on `etcd`, and a kube-rs client of its admin.
struct Server {
    child: Child,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_server(ccm: &Path, etcd: &Etcd) -> anyhow::Result<Server> {
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(ccm)
        .args(["apiserver", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--write-kubeconfig")
        .arg(&kubeconfig)
        .arg(format!("--etcd-servers={}", etcd.servers_flag()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", ccm.display()))?;
    let stdout = child.stdout.take().context("the child's stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if !line.contains("https://") {
        let _ = child.kill();
        bail!("ccm apiserver did not start: {line:?}");
    }
    let config = Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &Default::default(),
    )
    .await?;
    Ok(Server {
        child,
        client: Client::try_from(config)?,
        _dir: dir,
    })
}

/// One create: when it ended (from the phase's start), how long it took, and whether it
/// was acknowledged.
struct Create {
    ended: Duration,
    took: Duration,
    name: Option<String>,
}

/// Runs `writers` writers creating ConfigMaps named `<prefix>-<writer>-<i>` until `stop`.
async fn write_until(
    api: Api<ConfigMap>,
    prefix: &str,
    writers: usize,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<Create> {
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let (api, stop, prefix) = (api.clone(), stop.clone(), prefix.to_owned());
            tokio::spawn(async move {
                let mut creates = Vec::new();
                for i in 0.. {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let name = format!("{prefix}-{writer}-{i}");
                    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                        "metadata": {"name": name}, "data": {"k": "v"},
                    }))
                    .expect("a ConfigMap");
                    let began = Instant::now();
                    let result = api.create(&PostParams::default(), &cm).await;
                    creates.push(Create {
                        ended: start.elapsed(),
                        took: began.elapsed(),
                        name: result.ok().map(|_| name),
                    });
                }
                creates
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    all
}

/// `q` (0–1) of `values`, sorted.
fn quantile(values: &mut [Duration], q: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort_unstable();
    let index = ((values.len() as f64 - 1.0) * q).round() as usize;
    values[index.min(values.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What one phase of writes saw.
#[derive(Debug, Clone, Copy)]
struct Phase {
    ok: usize,
    failed: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Phase {
    fn of(creates: &[Create]) -> Self {
        let mut took: Vec<Duration> = creates.iter().map(|c| c.took).collect();
        let ok = creates.iter().filter(|c| c.name.is_some()).count();
        Phase {
            ok,
            failed: creates.len() - ok,
            p50_ms: ms(quantile(&mut took, 0.50)),
            p99_ms: ms(quantile(&mut took, 0.99)),
            max_ms: ms(quantile(&mut took, 1.0)),
        }
    }

    fn success_percent(&self) -> f64 {
        100.0 * self.ok as f64 / (self.ok + self.failed).max(1) as f64
    }

    fn line(&self, name: &str) -> String {
        format!(
            "{name}: {} acknowledged, {} failed ({:.2} % succeeded), p50 {:.1} ms, p99 {:.1} ms, slowest {:.0} ms",
            self.ok,
            self.failed,
            self.success_percent(),
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        )
    }
}

/// Fails unless every acknowledged create in `creates` is listed by `api`.
async fn none_lost(api: &Api<ConfigMap>, creates: &[Create]) -> anyhow::Result<()> {
    let listed: BTreeSet<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    let lost = creates
        .iter()
        .filter_map(|c| c.name.as_ref())
        .filter(|n| !listed.contains(*n))
        .count();
    if lost > 0 {
        bail!("{lost} acknowledged creates are missing");
    }
    Ok(())
}

/// The baseline and one-member-down phases of one run.
async fn one_member_down(ccm: &Path, secs: u64, writers: usize) -> anyhow::Result<(Phase, Phase)> {
    let mut etcd = Etcd::cluster(3).await;
    let lead = leader(&etcd).await?;
    let server = start_server(ccm, &etcd).await?;
    let api: Api<ConfigMap> = Api::namespaced(server.client.clone(), "default");
    let mut phases = Vec::new();
    for (prefix, kill) in [("up", false), ("down", true)] {
        if kill {
            // A follower: the phase measures a lost member, not an election.
            etcd.members[(lead + 1) % 3].stop();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let writes = tokio::spawn({
            let (api, stop) = (api.clone(), stop.clone());
            let prefix = prefix.to_owned();
            async move { write_until(api, &prefix, writers, start, stop).await }
        });
        tokio::time::sleep(Duration::from_secs(secs)).await;
        stop.store(true, Ordering::Release);
        let creates = writes.await?;
        none_lost(&api, &creates).await?;
        phases.push(Phase::of(&creates));
    }
    Ok((phases[0], phases[1]))
}

/// What killing the leader did to writes.
#[derive(Debug, Clone, Copy)]
struct LeaderLoss {
    stall_ms: f64,
    failed: usize,
    ok: usize,
    max_ms: f64,
}

async fn leader_loss(ccm: &Path, secs: u64, writers: usize) -> anyhow::Result<LeaderLoss> {
    let mut etcd = Etcd::cluster(3).await;
    leader(&etcd).await?;
    let server = start_server(ccm, &etcd).await?;
    let api: Api<ConfigMap> = Api::namespaced(server.client.clone(), "default");
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let writes = tokio::spawn({
        let (api, stop) = (api.clone(), stop.clone());
        async move { write_until(api, "lead", writers, start, stop).await }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lead = leader(&etcd).await?;
    let killed = start.elapsed();
    etcd.members[lead].stop();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.store(true, Ordering::Release);
    let creates = writes.await?;
    none_lost(&api, &creates).await?;
    // Acknowledged completions after the kill; the stall is the longest gap between the
    // kill and the first of them, or between two of them.
    let mut ended: Vec<Duration> = creates
        .iter()
        .filter(|c| c.name.is_some() && c.ended > killed)
        .map(|c| c.ended)
        .collect();
    ended.sort_unstable();
    let mut stall = Duration::ZERO;
    let mut previous = killed;
    for at in &ended {
        stall = stall.max(*at - previous);
        previous = *at;
    }
    let end = start.elapsed();
    stall = stall.max(end - previous);
    let all = Phase::of(&creates);
    Ok(LeaderLoss {
        stall_ms: ms(stall),
        failed: all.failed,
        ok: all.ok,
        max_ms: all.max_ms,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let full = full_run();
    let ccm = PathBuf::from(arg("--ccm", env!("CARGO_BIN_EXE_ccm").to_owned()));
    let runs: usize = arg("--runs", if full { 3 } else { 1 });
    let secs: u64 = arg("--secs", if full { 30 } else { 1 });
    let writers: usize = arg("--writers", 8);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "etcd_member_loss: {} ({runs} runs, {secs} s per phase, {writers} writers)",
        ccm.display()
    );
    let mut up = Vec::new();
    let mut down = Vec::new();
    let mut losses = Vec::new();
    for run in 1..=runs {
        let (baseline, lost) = runtime.block_on(one_member_down(&ccm, secs, writers))?;
        println!("run {run}: {}", baseline.line("all three members up"));
        println!("run {run}: {}", lost.line("one member of three down"));
        let loss = runtime.block_on(leader_loss(&ccm, secs, writers))?;
        println!(
            "run {run}: leader killed: stall {:.0} ms, {} acknowledged, {} failed, slowest create {:.0} ms",
            loss.stall_ms, loss.ok, loss.failed, loss.max_ms
        );
        up.push(baseline);
        down.push(lost);
        losses.push(loss);
    }
    for (name, phases) in [
        ("all three members up", &up),
        ("one member of three down", &down),
    ] {
        println!(
            "median of {runs}: {name}: {:.2} % succeeded ({} failed in the median run), p50 {:.1} ms, p99 {:.1} ms",
            median(phases.iter().map(Phase::success_percent).collect()),
            median(phases.iter().map(|p| p.failed as f64).collect()),
            median(phases.iter().map(|p| p.p50_ms).collect()),
            median(phases.iter().map(|p| p.p99_ms).collect()),
        );
    }
    println!(
        "median of {runs}: leader killed: stall {:.0} ms, {} failed, slowest create {:.0} ms",
        median(losses.iter().map(|l| l.stall_ms).collect()),
        median(losses.iter().map(|l| l.failed as f64).collect()),
        median(losses.iter().map(|l| l.max_ms).collect()),
    );
    Ok(())
}
