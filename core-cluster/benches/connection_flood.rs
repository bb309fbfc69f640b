//! Idle HTTP/2 connections without credentials against a running API server, and the
//! latency of an authenticated client meanwhile: the attack that once held every
//! connection slot. Loopback only.
//!
//! ```sh
//! ccm apiserver --in-memory --listen 127.0.0.1:16443 --write-kubeconfig /tmp/flood.kubeconfig &
//! FLOOD_KUBECONFIG=/tmp/flood.kubeconfig cargo bench -p core-cluster --bench connection_flood
//! ```
//!
//! Without `FLOOD_KUBECONFIG` it serves an in-process server with the default limits.
//! `FLOOD_CONNECTIONS` (4200), `FLOOD_SECONDS` (75), `FLOOD_SOURCES` (1: all from
//! 127.0.0.1; n: from 127.0.0.2 onwards), `FLOOD_PROBE_EVERY` (seconds, 5). Each attacking
//! connection completes TLS without a client certificate, negotiates HTTP/2, answers the
//! server's pings and sends nothing; when the server closes it, it connects again
//! (`FLOOD_RECONNECT=0`: it does not, and makes one attempt only). The
//! connections are opened first (until their number stops growing), then held for
//! `FLOOD_SECONDS` while every probe lists namespaces as the admin on a new connection.

use std::{
    net::{IpAddr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, api::ListParams};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::{net::TcpSocket, time::Instant};
use tokio_rustls::TlsConnector;
use tokio_util::sync::CancellationToken;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    live: AtomicUsize,
    connected: AtomicU64,
    closed_by_server: AtomicU64,
    failed: AtomicU64,
}

/// One attacker: connect, hold until closed, again, until `stop`.
async fn attacker(
    addr: SocketAddr,
    from: IpAddr,
    tls: TlsConnector,
    counts: Arc<Counts>,
    stop: CancellationToken,
    reconnect: bool,
) {
    while !stop.is_cancelled() {
        let connected = async {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(from, 0))?;
            let tcp = socket.connect(addr).await?;
            let stream = tls
                .connect(ServerName::try_from(addr.ip().to_string())?, tcp)
                .await?;
            let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
                .await?;
            anyhow::Ok((send, conn))
        };
        match tokio::time::timeout(Duration::from_secs(15), connected).await {
            Ok(Ok((send, conn))) => {
                counts.connected.fetch_add(1, Ordering::Relaxed);
                counts.live.fetch_add(1, Ordering::Relaxed);
                let closed = tokio::select! {
                    _ = conn => true,
                    () = stop.cancelled() => false,
                };
                counts.live.fetch_sub(1, Ordering::Relaxed);
                drop(send);
                if closed {
                    counts.closed_by_server.fetch_add(1, Ordering::Relaxed);
                }
            }
            _ => {
                counts.failed.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if !reconnect {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Probes on a thread and runtime of their own, so that the attackers' tasks do not delay
/// them.
fn prober(
    config: kube::Config,
) -> std::sync::mpsc::Sender<tokio::sync::oneshot::Sender<Result<Duration>>> {
    let (ask, asked) = std::sync::mpsc::channel::<tokio::sync::oneshot::Sender<Result<Duration>>>();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("probe runtime");
        while let Ok(answer) = asked.recv() {
            let _ = answer.send(runtime.block_on(probe(&config)));
        }
    });
    ask
}

async fn probe(config: &kube::Config) -> Result<Duration> {
    let started = Instant::now();
    // A new client each time: a new connection, as a new kubectl process makes.
    let client = kube::Client::try_from(config.clone())?;
    tokio::time::timeout(
        Duration::from_secs(15),
        Api::<Namespace>::all(client).list(&ListParams::default()),
    )
    .await
    .context("timed out after 15 s")??;
    Ok(started.elapsed())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let connections = env("FLOOD_CONNECTIONS", 4200) as usize;
    let seconds = env("FLOOD_SECONDS", 75);
    let sources = env("FLOOD_SOURCES", 1).max(1) as usize;
    let probe_every = Duration::from_secs(env("FLOOD_PROBE_EVERY", 5).max(1));
    let reconnect = env("FLOOD_RECONNECT", 1) != 0;
    let _in_process;
    let kubeconfig = match std::env::var("FLOOD_KUBECONFIG") {
        Ok(path) => std::fs::read_to_string(&path).with_context(|| path.clone())?,
        Err(_) => {
            let api = core_cluster::ApiServer::new(
                Arc::new(core_cluster::store::MemoryStore::new()),
                core_cluster::ApiServerConfig::default(),
            )
            .await?;
            let server = ccm_testkit::TestServer::start(api).await?;
            let kubeconfig = server.admin_kubeconfig();
            _in_process = server;
            kubeconfig
        }
    };
    let config = core_cluster::serve::client_config(&kubeconfig).await?;
    let url = config.cluster_url.clone();
    let addr: SocketAddr = format!(
        "{}:{}",
        url.host().context("server host")?,
        url.port_u16().unwrap_or(443)
    )
    .parse()?;
    let mut roots = rustls::RootCertStore::empty();
    for der in config.root_cert.clone().unwrap_or_default() {
        roots.add(CertificateDer::from(der))?;
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tls = TlsConnector::from(Arc::new(tls));

    let probes = prober(config.clone());
    let probe = || {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let asked = probes.send(answer);
        async move {
            asked.context("the prober ended")?;
            answered.await.context("the prober ended")?
        }
    };
    eprintln!("baseline probe: {:?}", probe().await);
    let started = Instant::now();
    let counts = Arc::new(Counts::default());
    let stop = CancellationToken::new();
    for i in 0..connections {
        let from = if sources == 1 {
            IpAddr::from([127, 0, 0, 1])
        } else {
            IpAddr::from([127, 0, 0, 2 + (i % sources) as u8])
        };
        tokio::spawn(attacker(
            addr,
            from,
            tls.clone(),
            counts.clone(),
            stop.clone(),
            reconnect,
        ));
    }
    let status = |counts: &Counts| {
        format!(
            "t={:>3}s live={:>5} connected={:>6} closed_by_server={:>6} failed={:>6}",
            started.elapsed().as_secs(),
            counts.live.load(Ordering::Relaxed),
            counts.connected.load(Ordering::Relaxed),
            counts.closed_by_server.load(Ordering::Relaxed),
            counts.failed.load(Ordering::Relaxed),
        )
    };
    // Open the connections: until their number stops growing for 5 s (or 5 min pass).
    let (mut most, mut since) = (0, Instant::now());
    while since.elapsed() < Duration::from_secs(5) && started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let live = counts.live.load(Ordering::Relaxed);
        if live > most {
            (most, since) = (live, Instant::now());
        }
    }
    eprintln!("{} opened; holding for {seconds} s", status(&counts));
    let until = Instant::now() + Duration::from_secs(seconds);
    let (mut ok, mut failed, mut worst) = (0, 0, Duration::ZERO);
    let mut latencies = Vec::new();
    while Instant::now() + probe_every <= until {
        tokio::time::sleep(probe_every).await;
        let result = probe().await;
        let line = status(&counts);
        match result {
            Ok(latency) => {
                ok += 1;
                worst = worst.max(latency);
                latencies.push(latency);
                eprintln!("{line} probe=ok {:.3}s", latency.as_secs_f64());
            }
            Err(e) => {
                failed += 1;
                eprintln!("{line} probe=FAILED {e:#}");
            }
        }
    }
    latencies.sort();
    let median = latencies.get(latencies.len() / 2).copied();
    eprintln!(
        "probes: {ok} ok, {failed} failed; median {median:?}, worst {worst:?}; connections made {}, closed by the server {}, failed {}",
        counts.connected.load(Ordering::Relaxed),
        counts.closed_by_server.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
    tokio::time::sleep_until(until).await;
    stop.cancel();
    Ok(())
}
