//! The embedded default's control plane → node paths, as a newcomer runs them after
//! `kubectl run web`: the simulated kubelets authenticate and authorize every request
//! (kubelet's `InstallAuthFilter` in `pkg/kubelet/server/server.go`, Webhook mode), the API
//! server reaching them with kubeadm's `kube-apiserver-kubelet-client` certificate.

use std::time::Duration;

use crate::{
    embedded::Embedded,
    support::{https_get_anonymous_at, require_kubectl, wait_until},
};

/// `kubectl get --raw …/proxy/healthz`, `logs` and `top` work through the API server (its
/// kubelet client certificate bound to `system:kubelet-api-admin`; the kubelets, acting as
/// `system:node:<name>`, make their SubjectAccessReviews under the Node authorizer), while
/// a request straight to a kubelet without credentials is a 401 (`anonymous-auth=false`).
#[test]
fn the_embedded_kubelets_serve_the_api_server_and_refuse_anonymous_requests() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let healthz = "/api/v1/nodes/sim-node-0/proxy/healthz";
    assert!(
        wait_until(Duration::from_secs(60), || {
            cluster.kubectl(&["get", "--raw", healthz]) == "ok"
        }),
        "the API server never reached sim-node-0's kubelet"
    );
    let endpoint = cluster.kubectl(&[
        "get",
        "node",
        "sim-node-0",
        "-o",
        "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}:{.status.daemonEndpoints.kubeletEndpoint.Port}",
    ]);
    let (code, body) = https_get_anonymous_at(&endpoint, "/healthz").expect("the kubelet answers");
    assert_eq!((code, body.as_str()), (401, "Unauthorized"), "{endpoint}");

    cluster.kubectl(&["run", "web", "--image=nginx"]);
    assert!(
        wait_until(Duration::from_secs(60), || {
            cluster
                .kubectl(&["logs", "web"])
                .starts_with("Started container web")
        }),
        "kubectl logs web never showed the container's start"
    );
    assert!(
        wait_until(Duration::from_secs(30), || {
            cluster.kubectl(&["top", "pod", "web"]).contains("web ")
        }),
        "kubectl top pod never showed web"
    );
    assert!(cluster.kubectl(&["top", "node"]).contains("sim-node-0 "));
}

/// `ccm --sim-agent-tunnel`: every simulated node's agent dials out to the API server, which
/// then reaches kubelets only over those connections (Konnectivity's model, the `cluster`
/// egress of upstream's `EgressSelectorConfiguration`): `kubectl logs` and `exec` work as
/// before, and the server's log shows the agents connecting.
#[test]
fn with_agent_tunnels_kubectl_logs_and_exec_reach_the_nodes_through_their_agents() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("ccm.log");
    let cluster = Embedded::start_logging_to(&log, &["--sim-agent-tunnel"]);
    cluster.kubectl(&["run", "web", "--image=nginx"]);
    assert!(
        wait_until(Duration::from_secs(60), || {
            cluster
                .kubectl(&["logs", "web"])
                .starts_with("Started container web")
        }),
        "kubectl logs web never showed the container's start"
    );
    assert_eq!(
        cluster.kubectl(&["exec", "web", "--", "hostname"]).trim(),
        "web"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("node agent connected"),
        "no agent connected to the API server:\n{logged}"
    );
}
