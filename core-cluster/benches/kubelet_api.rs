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
    ApiServer, ApiServerConfig, KUBELET_CLIENT_USER, KubeletClientConfig,
    auth::pki::Pki,
    kubelet_api_admin_binding,
    serve::{Security, ServeOptions},
    sim::{KubeletApiConfig, KubeletAuthConfig, NodeSimulator, SimConfig},
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

/// One `exec -- echo hi` through the API server: TLS with the admin's certificate, the
/// WebSocket upgrade (`v5.channel.k8s.io`), the command's output and its exit status on the
/// error channel; the time from connecting to reading that status.
async fn exec_round_trip(server: &TestServer) -> anyhow::Result<Duration> {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = &server.security().pki;
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(pki.ca_pem().as_bytes()) {
        roots.add(der?)?;
    }
    let admin = pki.admin();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(admin.cert_der()?, admin.key_der()?)?;
    let started = tokio::time::Instant::now();
    let tcp = tokio::net::TcpStream::connect(server.addr()).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::from(server.addr().ip()), tcp)
        .await?;
    let request = format!(
        "GET /api/v1/namespaces/default/pods/web/exec?command=echo&command=hi&stdout=true HTTP/1.1\r\n\
         Host: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n",
        server.addr()
    );
    tls.write_all(request.as_bytes()).await?;
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = tls.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "connection closed before the upgrade");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    anyhow::ensure!(head.starts_with("HTTP/1.1 101"), "no upgrade: {head}");
    let mut rest = buf.split_off(head_end);
    let mut output = Vec::new();
    // Server frames are unmasked: opcode, length (7, 16 or 64 bits), payload.
    loop {
        while rest.len() < 2 {
            let mut chunk = [0u8; 4096];
            let n = tls.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "connection closed before the status");
            rest.extend_from_slice(&chunk[..n]);
        }
        let (opcode, short) = (rest[0] & 0x0f, usize::from(rest[1] & 0x7f));
        let (len, offset) = match short {
            126 if rest.len() >= 4 => (usize::from(u16::from_be_bytes([rest[2], rest[3]])), 4),
            127 if rest.len() >= 10 => (
                usize::try_from(u64::from_be_bytes(rest[2..10].try_into()?))?,
                10,
            ),
            126 | 127 => (usize::MAX, 0),
            n => (n, 2),
        };
        if len == usize::MAX || rest.len() < offset + len {
            let mut chunk = [0u8; 4096];
            let n = tls.read(&mut chunk).await?;
            anyhow::ensure!(n > 0, "connection closed mid-frame");
            rest.extend_from_slice(&chunk[..n]);
            continue;
        }
        let payload: Vec<u8> = rest[offset..offset + len].to_vec();
        rest.drain(..offset + len);
        match (opcode, payload.first()) {
            (8, _) => anyhow::bail!("closed before the status"),
            (_, Some(1)) => output.extend_from_slice(&payload[1..]),
            (_, Some(3)) => {
                let elapsed = started.elapsed();
                anyhow::ensure!(
                    output == b"hi\n",
                    "output {:?}",
                    String::from_utf8_lossy(&output)
                );
                let status = String::from_utf8_lossy(&payload[1..]).into_owned();
                anyhow::ensure!(status.contains("Success"), "status {status}");
                return Ok(elapsed);
            }
            _ => {}
        }
    }
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
    // As kubeadm: the API server presents a kubelet client certificate of the cluster CA
    // (bound to system:kubelet-api-admin), which the kubelets trust.
    let dir = tempfile::tempdir()?;
    let pki = Pki::load_or_create(dir.path(), &[])?;
    let identity = pki.issue_client(KUBELET_CLIENT_USER, &[])?;
    let config = ApiServerConfig {
        kubelet: KubeletClientConfig {
            preferred_address_types: vec!["InternalIP".into()],
            client_certificate: Some(identity.cert_pem.clone()),
            client_key: Some(identity.key_pem.clone()),
            ..KubeletClientConfig::default()
        },
        ..ApiServerConfig::default()
    };
    let api = ApiServer::new(Arc::new(MemoryStore::new()), config).await?;
    api.apply_manifest(
        &kubelet_api_admin_binding(KUBELET_CLIENT_USER),
        &["ClusterRoleBinding"],
    )
    .await?;
    let client_ca = pki.ca_pem().to_owned();
    let security = Security::from_pki(&api, pki)?;
    let server = TestServer::start_secured(api, security, ServeOptions::default(), dir).await?;
    let client = server.admin_client().await?;
    let sim = NodeSimulator::new(client.clone(), SimConfig::default()).with_kubelet_api(
        KubeletApiConfig {
            auth: KubeletAuthConfig {
                client_ca: Some(client_ca),
                ..KubeletAuthConfig::default()
            },
            ..KubeletApiConfig::default()
        },
    );
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
    // The node advertises its kubelet's port once that listens.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    loop {
        let node = nodes.get_opt("bench-node").await?;
        let port = node
            .and_then(|n| n.status?.daemon_endpoints?.kubelet_endpoint?.port.into())
            .unwrap_or(0);
        if port > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

    // 2. exec round trips, and the kubelet's reviews they cost (its webhook caches).
    let rounds = if full { 3 } else { 1 };
    let per_round = if full { 50 } else { 5 };
    exec_round_trip(&server).await?;
    let reviews_before = sim.kubelet_reviews("bench-node").unwrap_or(0);
    for round in 1..=rounds {
        let mut trips = Vec::new();
        for _ in 0..per_round {
            trips.push(exec_round_trip(&server).await?);
        }
        println!(
            "exec round trip (connect, upgrade, `echo hi`, exit status) round {round}: median {:?}, max {:?} over {per_round}",
            median(trips.clone()),
            trips.iter().max().copied().unwrap_or_default()
        );
    }
    println!(
        "kubelet TokenReviews + SubjectAccessReviews for {} execs after the first: {}",
        rounds * per_round,
        sim.kubelet_reviews("bench-node").unwrap_or(0) - reviews_before
    );

    // 3. Many followers at once.
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
    // A client per hundred followers, as that many `kubectl logs -f` would hold several
    // connections: one HTTP/2 connection carries at most the server's concurrent-stream
    // limit (hyper's 200; Go's 250 for kube-apiserver), and hyper's client then queues
    // further streams on it where Go's transport would open another connection.
    const FOLLOWERS_PER_CLIENT: usize = 100;
    let mut follower_pods = pods.clone();
    for i in 0..streams {
        if i % FOLLOWERS_PER_CLIENT == 0 {
            follower_pods = Api::namespaced(server.admin_client().await?, "default");
        }
        let s = follower_pods
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
        "{streams} followers on {} connections ({open} open on the kubelet): RSS +{:.1} MiB = {:.1} KiB per stream \
         (API server, kubelet and clients in one process); /readyz median {:?} idle, {:?} with the followers",
        streams.div_ceil(FOLLOWERS_PER_CLIENT),
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
