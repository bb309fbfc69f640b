//! `/configz` of the simulated kubelets (`pkg/kubelet/server/server.go` installing
//! `component-base/configz`'s handler, `{"kubeletconfig": <v1beta1 KubeletConfiguration>}`),
//! read through the API server's `nodes/{name}/proxy/configz` with kubectl v1.32, each node
//! showing its own settings from a simulator config file; and `/run`, kubelet's
//! non-streaming exec.

use ccm_testkit::{
    eventually,
    kubectl::{kubectl, require_kubectl},
};
use core_cluster::{
    ApiServerConfig,
    sim::{KubeletApiConfig, NodeConfigFile, NodeSimulator, ServingCa, SimConfig, SimNode},
};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::kubelet_api::{
    grant_nodes, internal_ip_first, kubelet_request, serve_with_kubelet_identity,
    service_account_token,
};

const FILE: &str = r#"
apiVersion: sim.ccm-rs.io/v1alpha1
kind: NodeSimulatorConfiguration
kubelet:
  imageGCHighThresholdPercent: 90
  imageMinimumGCAge: 5m
nodes:
  - name: cz-swap
    machine: {swap: 4Gi}
    kubelet:
      failSwapOn: false
      memorySwap: {swapBehavior: LimitedSwap}
      evictionHard: {memory.available: 200Mi, nodefs.available: 15%}
      registerWithTaints: [{key: swap, value: "on", effect: PreferNoSchedule}]
  - name: cz-numa
    machine: {numaNodes: 2}
    kubelet:
      cpuManagerPolicy: static
      topologyManagerPolicy: single-numa-node
      topologyManagerScope: pod
      maxPods: 30
      kubeReserved: {cpu: 500m}
      shutdownGracePeriod: 30s
      shutdownGracePeriodCriticalPods: 10s
"#;

/// Each node's `/configz` (through `kubectl get --raw /api/v1/nodes/N/proxy/configz`) shows
/// its effective KubeletConfiguration in its v1beta1 JSON names, the file's settings for
/// all nodes merged with the node's own; the kubelet authorizes the path as `nodes/proxy`
/// (`pkg/kubelet/server/auth.go GetRequestAttributes`): `get nodes/stats` is not enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configz_shows_each_nodes_own_kubelet_configuration() {
    require_kubectl("it runs `kubectl get --raw /api/v1/nodes/N/proxy/configz`");
    let ca = ServingCa::generate("kubelet-serving-ca").unwrap();
    let mut sim_api = KubeletApiConfig {
        serving_ca: Some(ca.clone()),
        ..KubeletApiConfig::default()
    };
    let config = ApiServerConfig {
        kubelet: internal_ip_first(),
        ..ApiServerConfig::default()
    };
    let server = serve_with_kubelet_identity(config, &mut sim_api, true).await;
    let client = server.admin_client().await.unwrap();
    let file = NodeConfigFile::parse(FILE).unwrap();
    let (config, nodes) = file
        .apply(&SimConfig::default(), Vec::<SimNode>::new())
        .unwrap();
    let sim = NodeSimulator::new(client.clone(), config).with_kubelet_api(sim_api);
    sim.add_nodes(nodes);
    let stop = CancellationToken::new();
    let _stop_guard = stop.clone().drop_guard();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await }
    });
    let api: Api<Node> = Api::all(client.clone());
    for node in ["cz-swap", "cz-numa"] {
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
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.admin_kubeconfig()).unwrap();
    let configz = |node: &'static str| {
        let (dir, kubeconfig) = (dir.path().to_owned(), kubeconfig.clone());
        async move {
            let path = format!("/api/v1/nodes/{node}/proxy/configz");
            let out = kubectl(&dir, &kubeconfig, &["get", "--raw", &path]).await;
            assert!(out.success, "{path}: {out:?}");
            let doc: Value = serde_json::from_str(&out.stdout).unwrap();
            doc["kubeletconfig"].clone()
        }
    };

    let swap = configz("cz-swap").await;
    assert_eq!(swap["failSwapOn"], false, "{swap}");
    assert_eq!(swap["memorySwap"]["swapBehavior"], "LimitedSwap");
    assert_eq!(swap["topologyManagerPolicy"], "none");
    assert_eq!(
        swap["evictionHard"],
        json!({"memory.available": "200Mi", "nodefs.available": "15%"})
    );
    assert_eq!(
        swap["registerWithTaints"],
        json!([{"key": "swap", "value": "on", "effect": "PreferNoSchedule"}])
    );
    assert_eq!(swap["imageGCHighThresholdPercent"], 90);
    assert_eq!(swap["imageMinimumGCAge"], "5m0s");
    assert_eq!(swap["maxPods"], 110);
    let port = sim.kubelet_endpoint("cz-swap").unwrap().port();
    assert_eq!(swap["port"], port);

    let numa = configz("cz-numa").await;
    assert_eq!(numa["failSwapOn"], true, "{numa}");
    assert_eq!(numa["memorySwap"]["swapBehavior"], "NoSwap");
    assert_eq!(numa["topologyManagerPolicy"], "single-numa-node");
    assert_eq!(numa["topologyManagerScope"], "pod");
    assert_eq!(numa["cpuManagerPolicy"], "static");
    assert_eq!(numa["maxPods"], 30);
    assert_eq!(numa["kubeReserved"], json!({"cpu": "500m"}));
    assert_eq!(numa["shutdownGracePeriod"], "30s");
    assert_eq!(numa["shutdownGracePeriodCriticalPods"], "10s");
    assert_eq!(numa["imageGCHighThresholdPercent"], 90);
    assert_eq!(numa["serverTLSBootstrap"], false);

    // Straight to the kubelet: `get nodes/stats` does not open /configz, `get nodes/proxy`
    // does (two accounts: the kubelet caches a denial for `cacheUnauthorizedTTL`).
    let addr = sim.kubelet_endpoint("cz-numa").unwrap();
    let stats = service_account_token(&client, "stats-reader").await;
    let account =
        |name: &str| json!({"kind": "ServiceAccount", "name": name, "namespace": "default"});
    grant_nodes(
        &client,
        "cz-stats",
        "nodes/stats",
        &["get"],
        account("stats-reader"),
    )
    .await;
    let (code, body) =
        kubelet_request(addr, &ca.cert_pem, None, Some(&stats), "GET", "/configz").await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("subresource=proxy"), "{body}");
    let proxy = service_account_token(&client, "proxy-reader").await;
    grant_nodes(
        &client,
        "cz-proxy",
        "nodes/proxy",
        &["get"],
        account("proxy-reader"),
    )
    .await;
    let (code, body) =
        kubelet_request(addr, &ca.cert_pem, None, Some(&proxy), "GET", "/configz").await;
    assert_eq!(code, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["kubeletconfig"]["topologyManagerPolicy"],
        "single-numa-node"
    );
}

/// `POST /run/{namespace}/{pod}/{container}?cmd=…` (kubelet's non-streaming exec,
/// `pkg/kubelet/server/server.go getRun`), through `nodes/{name}/proxy`: the command's
/// output, with the pod's environment; a command exiting non-zero is a 500 with the
/// runtime's `command '…' exited with N` error; a pod that is not on the node a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_executes_a_command_and_answers_its_output() {
    use crate::kubelet_api::{running_pod, start};
    let c = start(
        internal_ip_first(),
        KubeletApiConfig::default(),
        &["cz-run"],
    )
    .await;
    running_pod(&c.client, "web", "cz-run").await;
    let post = |path: &str| {
        let client = c.client.clone();
        let request = axum::http::Request::post(format!("/api/v1/nodes/cz-run/proxy/run/{path}"))
            .body(Vec::new())
            .unwrap();
        async move {
            match client.request_text(request).await {
                Ok(body) => (200, body),
                Err(kube::Error::Api(s)) => (s.code, s.message),
                Err(e) => panic!("{e}"),
            }
        }
    };
    assert_eq!(
        post("default/web/app?cmd=hostname").await,
        (200, "web\n".to_owned())
    );
    let (code, env) = post("default/web/app?cmd=printenv").await;
    assert_eq!(code, 200, "{env}");
    assert!(env.contains("GREETING=hello"), "{env}");
    let (code, message) = post("default/web/app?cmd=cat%20/nope").await;
    assert_eq!(code, 500, "{message}");
    assert!(
        message
            .contains("command 'cat /nope' exited with 1: cat: /nope: No such file or directory"),
        "{message}"
    );
    let (code, message) = post("default/absent/app?cmd=hostname").await;
    assert_eq!(code, 404, "{message}");
}
