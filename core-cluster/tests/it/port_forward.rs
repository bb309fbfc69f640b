//! `pods/portforward` end to end: kubectl v1.32 `port-forward` (SPDY/3.1 tunnelled over
//! WebSocket, `SPDY/3.1+portforward.k8s.io`, translated by the API server as upstream's
//! `streamtunnel.go TunnelingHandler`) to a simulated kubelet's `/portForward`
//! (`pkg/kubelet/cri/streaming/portforward/httpstream.go`), and a local HTTP client through
//! it to the pod's declared port. Also `pods/log` over a WebSocket, which shares this
//! module's WebSocket client frames.

use std::{process::Stdio, time::Duration};

use ccm_testkit::{eventually, free_port, kubectl::require_kubectl};
use core_cluster::sim::KubeletApiConfig;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{Api, api::PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::kubelet_api::{Cluster, internal_ip_first, start, user_with_role};

/// A running pod `name` on `node` labelled `app: web`, declaring containerPort 80 (`http`).
async fn web_pod(c: &Cluster, name: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx",
            "ports": [{"name": "http", "containerPort": 80}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually(10, "the pod runs", || {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
}

/// A running `kubectl port-forward`.
struct Forward {
    child: std::process::Child,
    stderr: tokio::task::JoinHandle<String>,
}

impl Forward {
    /// `kubectl port-forward {target} {local}:{remote}`, once it says it is forwarding.
    async fn start(c: &Cluster, kubeconfig: &std::path::Path, target: &str, ports: &str) -> Self {
        use std::io::{BufRead, Read};
        let mut child = ccm_testkit::kubectl::command(c.dir.path(), kubeconfig)
            .args(["port-forward", target, ports])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let stderr = tokio::task::spawn_blocking(move || {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text);
            text
        });
        let (tx, rx) = tokio::sync::oneshot::channel();
        // Reads stdout to its end, so kubectl never blocks on it; the first line is sent.
        tokio::task::spawn_blocking(move || {
            let mut lines = std::io::BufReader::new(stdout).lines();
            let _ = tx.send(lines.next().and_then(Result::ok).unwrap_or_default());
            for _ in lines {}
        });
        let line = tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("kubectl port-forward starts")
            .unwrap_or_default();
        if !line.starts_with("Forwarding from 127.0.0.1:") {
            let _ = child.kill();
            let _ = child.wait();
            let err = stderr.await.unwrap();
            panic!("kubectl port-forward said {line:?}; stderr: {err}");
        }
        Forward { child, stderr }
    }

    /// Stops kubectl; what it wrote on stderr.
    async fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        tokio::time::timeout(Duration::from_secs(10), self.stderr)
            .await
            .expect("stderr ends")
            .unwrap()
    }
}

/// `GET {path}` to 127.0.0.1:`port`: the whole answer (empty when the connection closes
/// without one).
async fn http_get(port: u16, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut answer))
        .await
        .expect("the forwarded connection answers or closes")
        .unwrap_or_default();
    String::from_utf8_lossy(&answer).into_owned()
}

/// kubectl v1.32 `port-forward pod/web L:80`: an HTTP GET to the local port reaches the
/// pod's declared port (its responder answers with the pod's name), through the API
/// server's SPDY-over-WebSocket translation (`streamtunnel.go`) and the kubelet's stream
/// pairs (`httpstream.go`); several connections in a row each get their pair. A port the
/// pod does not listen on fails as kubelet's does: client-go's `portforward.go
/// handleConnection` reports the error stream's message (`an error occurred forwarding
/// L -> 81: …connection refused`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_reaches_the_pods_declared_port() {
    require_kubectl("it runs `kubectl port-forward`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["pf-a"]).await;
    web_pod(&c, "web", "pf-a").await;
    let local = free_port();
    let forward = Forward::start(&c, &c.kubeconfig, "pod/web", &format!("{local}:80")).await;
    for path in ["/", "/index.html"] {
        let answer = http_get(local, path).await;
        if answer.is_empty() {
            panic!("no answer; kubectl said: {}", forward.stop().await);
        }
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nweb\n"), "{answer}");
        assert!(
            answer
                .to_ascii_lowercase()
                .contains(&format!("x-sim-path: {path}\r\n")),
            "{answer}"
        );
    }
    let stderr = forward.stop().await;
    assert!(!stderr.contains("error"), "{stderr}");

    let closed = free_port();
    let forward = Forward::start(&c, &c.kubeconfig, "pod/web", &format!("{closed}:81")).await;
    assert_eq!(http_get(closed, "/").await, "");
    let stderr = forward.stop().await;
    assert!(
        stderr.contains(&format!(
            "an error occurred forwarding {closed} -> 81: error forwarding port 81 to pod"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("connect: connection refused"), "{stderr}");
}

/// `kubectl port-forward svc/web L:8080`: kubectl picks a pod of the Service's selector and
/// its targetPort by name (`translateServicePortToTargetPort`), and the connection reaches
/// that pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_port_forward_to_a_service_reaches_one_of_its_pods() {
    require_kubectl("it runs `kubectl port-forward svc/…`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["pf-s"]).await;
    web_pod(&c, "web-1", "pf-s").await;
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"},
                 "ports": [{"name": "api", "port": 8080, "targetPort": "http"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let local = free_port();
    let forward = Forward::start(&c, &c.kubeconfig, "svc/web", &format!("{local}:8080")).await;
    let answer = http_get(local, "/").await;
    assert!(answer.ends_with("\r\n\r\nweb-1\n"), "{answer}");
    forward.stop().await;
}

/// The API server's refusals (`strategy.go PortForwardLocation`, RBAC on the subresource):
/// a pod not bound to a node is a 400 with upstream's message; `get pods/portforward` is
/// not enough for the upgrade, which needs `create` (`requestinfo.go`,
/// AuthorizePodWebsocketUpgradeCreatePermission); kubectl itself refuses a pod that is not
/// Running (`portforward.go`'s phase check).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_refuses_unbound_pods_and_users_without_create() {
    require_kubectl("it runs `kubectl port-forward`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["pf-r"]).await;
    web_pod(&c, "web", "pf-r").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pending: Pod = serde_json::from_value(json!({
        "metadata": {"name": "pending"},
        "spec": {"containers": [{"name": "app", "image": "nginx"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pending).await.unwrap();
    let request = hyper::Request::post("/api/v1/namespaces/default/pods/pending/portforward")
        .header("connection", "Upgrade")
        .header("upgrade", "SPDY/3.1")
        .header("x-stream-protocol-version", "portforward.k8s.io")
        .body(Vec::new())
        .unwrap();
    let err = c.client.request_text(request).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected a Status, got {err:?}");
    };
    assert_eq!(status.code, 400);
    assert_eq!(status.message, "pod pending does not have a host assigned");

    let out = ccm_testkit::kubectl::kubectl(
        c.dir.path(),
        &c.kubeconfig,
        &[
            "port-forward",
            "pod/pending",
            &format!("{}:80", free_port()),
        ],
    )
    .await;
    assert!(!out.success);
    assert!(
        out.stderr
            .contains("unable to forward port because pod is not running. Current status=Pending"),
        "{out:?}"
    );

    // RBAC: reading the pod and `get pods/portforward` do not allow the upgrade.
    let bob_path =
        user_with_role(&c, "bob", "pf-get", &["pods", "pods/portforward"], &["get"]).await;
    let out = ccm_testkit::kubectl::kubectl(
        c.dir.path(),
        &bob_path,
        &["port-forward", "pod/web", &format!("{}:80", free_port())],
    )
    .await;
    assert!(!out.success, "{out:?}");
    assert!(
        out.stderr
            .contains("cannot create resource \"pods/portforward\""),
        "{out:?}"
    );
}

/// A client frame (masked, RFC 6455 section 5.3) with `payload`.
fn masked_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x5a, 0x11, 0x3c, 0x7e];
    let mut frame = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => frame.push(0x80 | n as u8),
        n => {
            frame.push(0x80 | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    frame
}

/// The server's messages until it closes: (opcode, payload) of each frame.
async fn server_frames<R: tokio::io::AsyncRead + Unpin>(mut io: R) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    loop {
        let mut head = [0u8; 2];
        if io.read_exact(&mut head).await.is_err() {
            return frames;
        }
        let len = match head[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                io.read_exact(&mut b).await.unwrap();
                usize::from(u16::from_be_bytes(b))
            }
            127 => {
                let mut b = [0u8; 8];
                io.read_exact(&mut b).await.unwrap();
                u64::from_be_bytes(b) as usize
            }
            n => usize::from(n),
        };
        let mut payload = vec![0u8; len];
        io.read_exact(&mut payload).await.unwrap();
        let opcode = head[0] & 0x0f;
        frames.push((opcode, payload));
        if opcode == 0x8 {
            return frames;
        }
    }
}

/// The channel WebSocket protocol kube-rs's `Api::portforward` speaks (`v4.channel.k8s.io`,
/// `?ports=80,81`), handed through the API server to the kubelet's `websocket.go
/// handleWebSocketStreams`: the port, 2 bytes little-endian, first on both channels of each
/// port; the pod's answer on channel 0; the closed port's refusal on channel 3; the
/// connection closed once both ports are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_websocket_client_forwards_through_the_api_server() {
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["pf-w"]).await;
    web_pod(&c, "web", "pf-w").await;
    let request =
        hyper::Request::get("/api/v1/namespaces/default/pods/web/portforward?ports=80%2C81")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header(
                "sec-websocket-protocol",
                "v5.channel.k8s.io, v4.channel.k8s.io",
            )
            .body(kube::client::Body::from(Vec::new()))
            .unwrap();
    let mut response = c.client.send(request).await.unwrap();
    assert_eq!(response.status().as_u16(), 101);
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "v4.channel.k8s.io"
    );
    assert_eq!(
        response.headers()["sec-websocket-accept"],
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    let upgraded = hyper::upgrade::on(&mut response).await.unwrap();
    let (r, mut w) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    let mut message = vec![0u8];
    message.extend_from_slice(b"GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    w.write_all(&masked_frame(0x2, &message)).await.unwrap();
    let frames = tokio::time::timeout(Duration::from_secs(30), server_frames(r))
        .await
        .expect("the kubelet closes once both ports are done");
    assert_eq!(frames.last().map(|f| f.0), Some(0x8), "{frames:?}");
    let on = |channel: u8| -> Vec<Vec<u8>> {
        frames
            .iter()
            .filter(|(op, p)| *op == 0x2 && p.first() == Some(&channel))
            .map(|(_, p)| p[1..].to_vec())
            .collect()
    };
    for (channel, port) in [(0u8, 80u16), (1, 80), (2, 81), (3, 81)] {
        assert_eq!(on(channel)[0], port.to_le_bytes(), "channel {channel}");
    }
    let answer = String::from_utf8(on(0)[1..].concat()).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.ends_with("\r\n\r\nweb\n"), "{answer}");
    assert_eq!(on(1).len(), 1, "no error on port 80");
    assert_eq!(on(2).len(), 1, "no data from port 81");
    let refusal = String::from_utf8(on(3)[1].clone()).unwrap();
    assert!(
        refusal.starts_with("error forwarding port 81 to pod ")
            && refusal.contains("connect: connection refused"),
        "{refusal}"
    );
}

/// Measures `kubectl port-forward` (BENCHMARKS.md, "Port forwarding"): the time from a new
/// local connection to the first byte of the pod's answer (each connection is a new
/// stream pair through the tunnel), and the answer bytes per second of 5,000 pipelined GETs
/// on one connection; 3 runs of each. Run with `--ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn measure_port_forward_first_byte_and_throughput() {
    require_kubectl("it runs `kubectl port-forward`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["pf-m"]).await;
    web_pod(&c, "web", "pf-m").await;
    let local = free_port();
    let forward = Forward::start(&c, &c.kubeconfig, "pod/web", &format!("{local}:80")).await;
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    for run in 0..3 {
        let mut firsts = Vec::new();
        for _ in 0..20 {
            let started = tokio::time::Instant::now();
            let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", local))
                .await
                .unwrap();
            tcp.write_all(b"GET / HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut byte = [0u8; 1];
            tcp.read_exact(&mut byte).await.unwrap();
            firsts.push(started.elapsed().as_secs_f64() * 1000.0);
            let mut rest = Vec::new();
            tcp.read_to_end(&mut rest).await.unwrap();
        }
        const REQUESTS: usize = 5_000;
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", local))
            .await
            .unwrap();
        let one = b"GET / HTTP/1.1\r\nHost: l\r\n\r\n";
        let mut all = one.repeat(REQUESTS - 1);
        all.extend_from_slice(b"GET / HTTP/1.1\r\nHost: l\r\nConnection: close\r\n\r\n");
        let started = tokio::time::Instant::now();
        let (mut r, mut w) = tcp.split();
        let (_, received) = tokio::join!(w.write_all(&all), async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        });
        let secs = started.elapsed().as_secs_f64();
        let answers = String::from_utf8_lossy(&received)
            .matches("\r\n\r\nweb\n")
            .count();
        assert_eq!(answers, REQUESTS);
        println!(
            "run {run}: first byte median {:.1} ms (20 connections); {REQUESTS} pipelined GETs: {} answer bytes in {secs:.2} s = {:.0} KB/s, {:.0} requests/s",
            median(firsts),
            received.len(),
            received.len() as f64 / secs / 1000.0,
            REQUESTS as f64 / secs
        );
    }
    forward.stop().await;
}

/// `pods/log` asked for with a WebSocket upgrade (`binary.k8s.io`), as kube-apiserver's
/// `StreamObject` answers it through `wsstream`: 101 with the chosen subprotocol, an empty
/// message first, then the log in binary messages (the same bytes a plain GET gives), then a
/// normal close; an offer of only unknown subprotocols is refused with 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_logs_stream_over_a_websocket_as_wsstream_sends_them() {
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["log-w"]).await;
    web_pod(&c, "web", "log-w").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let plain = pods.logs("web", &Default::default()).await.unwrap();
    assert!(!plain.is_empty(), "the simulated container logs its start");
    let upgrade = |protocols: &str| {
        hyper::Request::get("/api/v1/namespaces/default/pods/web/log")
            .header("connection", "Upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
            .header("sec-websocket-protocol", protocols)
            .body(kube::client::Body::from(Vec::new()))
            .unwrap()
    };
    let refused = c.client.send(upgrade("v4.channel.k8s.io")).await.unwrap();
    assert_eq!(refused.status().as_u16(), 403);

    let mut response = c
        .client
        .send(upgrade("v4.channel.k8s.io, binary.k8s.io"))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 101);
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "binary.k8s.io"
    );
    assert_eq!(
        response.headers()["sec-websocket-accept"],
        "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    );
    let upgraded = hyper::upgrade::on(&mut response).await.unwrap();
    let (r, _w) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    let frames = tokio::time::timeout(Duration::from_secs(30), server_frames(r))
        .await
        .expect("the stream ends with the log");
    assert_eq!(frames.first(), Some(&(0x2, Vec::new())), "{frames:?}");
    assert_eq!(
        frames.last(),
        Some(&(0x8, 1000u16.to_be_bytes().to_vec())),
        "{frames:?}"
    );
    let streamed: Vec<u8> = frames[1..frames.len() - 1]
        .iter()
        .inspect(|(opcode, _)| assert_eq!(*opcode, 0x2))
        .flat_map(|(_, payload)| payload.clone())
        .collect();
    assert_eq!(String::from_utf8(streamed).unwrap(), plain);
}
