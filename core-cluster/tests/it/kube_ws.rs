//! kube-rs's `ws` feature end to end through the API server to a simulated kubelet:
//! `Api::exec` (the `v5.channel.k8s.io`/`v4.channel.k8s.io` remote-command protocol, kubelet's
//! `pkg/kubelet/cri/streaming/remotecommand/websocket.go`) and `Api::portforward` (the channel
//! WebSocket port-forward protocol, `pkg/kubelet/cri/streaming/portforward/websocket.go`).

use ccm_testkit::eventually;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{AttachParams, PostParams},
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::kubelet_api::{internal_ip_first, running_pod, start};

/// `Api::exec` runs a built-in command in the container: its stdout comes back on the
/// stdout channel and its exit status on the error channel, as kubelet's remote-command
/// protocol sends them (a `Success` Status, or `NonZeroExitCode` with the code).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_exec_gets_the_commands_output_and_exit_status() {
    let c = start(
        internal_ip_first(),
        core_cluster::sim::KubeletApiConfig::default(),
        &["ws-a"],
    )
    .await;
    running_pod(&c.client, "web", "ws-a").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let params = AttachParams::default().stdout(true).stderr(false);
    let mut process = pods.exec("web", ["echo", "hi"], &params).await.unwrap();
    let mut stdout = process.stdout().expect("stdout was asked for");
    let status = process.take_status().expect("the status channel");
    let mut out = String::new();
    stdout.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "hi\n");
    let status = status.await.expect("a status");
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");

    let mut failing = pods
        .exec("web", ["sh", "-c", "exit 3"], &params)
        .await
        .unwrap();
    let status = failing.take_status().unwrap().await.expect("a status");
    assert_eq!(
        status.reason.as_deref(),
        Some("NonZeroExitCode"),
        "{status:?}"
    );
    let code = status
        .details
        .and_then(|d| d.causes)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message);
    assert_eq!(code.as_deref(), Some("3"));
}

/// `Api::portforward` reaches the responder behind the pod's declared containerPort: an
/// HTTP request written to the forwarded stream is answered with the pod's name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_portforward_reaches_the_pods_declared_port() {
    let c = start(
        internal_ip_first(),
        core_cluster::sim::KubeletApiConfig::default(),
        &["ws-b"],
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "served"},
        "spec": {"nodeName": "ws-b", "containers": [{"name": "app", "image": "nginx",
            "ports": [{"containerPort": 80}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually(10, "the pod runs", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("served").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
    let mut forwarder = pods.portforward("served", &[80]).await.unwrap();
    let mut stream = forwarder.take_stream(80).expect("the port's stream");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: served\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "no end of the answer: {answer}");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("served"), "{answer}");
}
