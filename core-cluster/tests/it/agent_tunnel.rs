//! The API server reaching kubelets only through the connections their nodes' agents
//! opened (Konnectivity's model: upstream's `EgressSelectorConfiguration` with the
//! `cluster` egress through `konnectivity-server`, built into our API server; the
//! `core_cluster_tunnel` crate describes the protocol), end to end over TLS.

use std::{sync::Arc, time::Duration};

use ccm_testkit::{TestServer, eventually};
use core_cluster::{
    ApiServerConfig, KubeletClientConfig, NodeEgress,
    auth::pki::Pki,
    sim::{AgentTunnelConfig, KubeletApiConfig, NodeSimulator, ServingCa, SimConfig},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, api::LogParams};
use tokio_util::sync::CancellationToken;

use crate::kubelet_api::{internal_ip_first, running_pod, serve_with_kubelet_identity};

struct TunnelCluster {
    server: TestServer,
    client: Client,
    stop: CancellationToken,
}

impl Drop for TunnelCluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An API server that reaches kubelets through agents only, verifying their serving
/// certificates against the kubelet-serving CA, and simulated nodes whose agents dial it
/// as `system:node:<name>`; the nodes in `without_credentials` get no client certificate,
/// so their agents never connect.
async fn start(nodes: &[&str], without_credentials: &[&str]) -> TunnelCluster {
    let ca = ServingCa::generate("kubelet-serving-ca").unwrap();
    let kubelet = KubeletClientConfig {
        certificate_authority: Some(ca.cert_pem.clone()),
        egress: NodeEgress::AgentTunnel,
        ..internal_ip_first()
    };
    let mut sim_api = KubeletApiConfig {
        serving_ca: Some(ca),
        ..KubeletApiConfig::default()
    };
    let config = ApiServerConfig {
        kubelet,
        ..ApiServerConfig::default()
    };
    let server = serve_with_kubelet_identity(config, &mut sim_api, true).await;
    let client = server.admin_client().await.unwrap();
    let pki = Arc::new(Pki::load_or_create(&server.dir(), &[]).unwrap());
    let refused: Vec<String> = without_credentials.iter().map(|n| n.to_string()).collect();
    let issuer = pki.clone();
    let agents = AgentTunnelConfig {
        server: server.addr(),
        server_name: server.addr().ip().to_string(),
        server_ca: pki.ca_pem().to_owned(),
        credentials: Arc::new(move |node: &str| {
            if refused.iter().any(|r| r == node) {
                return Err(format!("no certificate for {node}"));
            }
            issuer
                .issue_client(&format!("system:node:{node}"), &["system:nodes"])
                .map(|c| (c.cert_pem, c.key_pem))
                .map_err(|e| e.to_string())
        }),
    };
    let sim = NodeSimulator::new(client.clone(), SimConfig::default())
        .with_kubelet_api(sim_api)
        .with_agent_tunnel(agents);
    sim.add_nodes(nodes.iter().copied());
    let stop = CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await }
    });
    let api: Api<Node> = Api::all(client.clone());
    for node in nodes {
        eventually(10, "the node advertises its kubelet port", || {
            let api = api.clone();
            async move {
                let n = api.get_opt(node).await.ok()??;
                let port = n.status?.daemon_endpoints?.kubelet_endpoint?.port;
                (port > 0).then_some(())
            }
        })
        .await;
    }
    TunnelCluster {
        server,
        client,
        stop,
    }
}

/// A raw GET through the API server: the body, or the API error.
async fn get_raw(client: &Client, path: &str) -> Result<String, kube::core::Status> {
    let request = axum::http::Request::get(path).body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(body) => Ok(body),
        Err(kube::Error::Api(s)) => Err(*s),
        Err(other) => panic!("{path}: {other:?}"),
    }
}

/// `pods/log` and `nodes/proxy` (`pkg/registry/core/pod/rest/log.go`,
/// `pkg/registry/core/node/rest/proxy.go`) reach the kubelet through its node's agent when
/// the `cluster` egress goes through agents, with the kubelet's serving certificate still
/// verified end to end; a node whose agent is not connected is not dialled directly but
/// answered at once with konnectivity's "no agent" error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_are_reached_through_their_nodes_agents_and_never_dialled() {
    let c = start(&["tun-a", "tun-b", "tun-lost"], &["tun-lost"]).await;
    let tunnels = c.server.api().agent_tunnels();
    eventually(10, "both agents connect", || {
        let connected = tunnels.connected();
        async move { (connected == ["tun-a", "tun-b"]).then_some(()) }
    })
    .await;
    let before = tunnels.dials();
    assert_eq!(
        get_raw(&c.client, "/api/v1/nodes/tun-a/proxy/healthz").await,
        Ok("ok".to_owned())
    );
    running_pod(&c.client, "web", "tun-b").await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let log = pods.logs("web", &LogParams::default()).await.unwrap();
    assert!(log.starts_with("Started container app"), "{log}");
    assert!(
        tunnels.dials() >= before + 2,
        "the requests did not ride the tunnels: {} dials",
        tunnels.dials() - before
    );

    // Its kubelet listens on loopback, a direct dial would succeed: the egress refuses it.
    // (The pod's log, a 500 on failure as upstream's: the node proxy's 503 is retried by
    // kube-rs's client.)
    running_pod(&c.client, "lost", "tun-lost").await;
    let started = tokio::time::Instant::now();
    let lost = match pods.logs("lost", &LogParams::default()).await {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    };
    assert_eq!(lost.code, 500, "{lost:?}");
    assert!(
        lost.message
            .contains("no agent connected for node \"tun-lost\""),
        "{lost:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The tunnel path serves nodes only, each for itself: any other user (even a cluster
/// admin) is refused by the handler, and a server that dials kubelets directly does not
/// serve the path at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_node_opens_a_tunnel_and_only_when_agents_are_used() {
    let c = start(&[], &[]).await;
    let upgrade = |client: Client| async move {
        let request = axum::http::Request::get(core_cluster::tunnel::PATH)
            .header("Connection", "Upgrade")
            .header("Upgrade", core_cluster::tunnel::PROTOCOL)
            .body(Vec::new())
            .unwrap();
        match client.request_text(request).await {
            Err(kube::Error::Api(s)) => *s,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    let admin = upgrade(c.client.clone()).await;
    assert_eq!(admin.code, 403, "{admin:?}");
    assert!(admin.message.contains("opened by nodes only"), "{admin:?}");

    let direct =
        crate::kubelet_api::start(internal_ip_first(), KubeletApiConfig::default(), &[]).await;
    let node_client = direct
        .server
        .client(
            &direct
                .server
                .kubeconfig_for("system:node:n1", &["system:nodes"])
                .unwrap(),
        )
        .await
        .unwrap();
    let off = upgrade(node_client).await;
    assert_eq!(off.code, 404, "{off:?}");
}
