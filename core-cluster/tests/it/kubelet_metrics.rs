//! Resource usage from the simulated kubelets: `/stats/summary` (the Summary API,
//! `pkg/kubelet/server/stats`) and `/metrics/resource` (`pkg/kubelet/metrics/collectors/
//! resource_metrics.go`), and the `metrics.k8s.io/v1beta1` API metrics-server would serve
//! from them (`sigs.k8s.io/metrics-server/pkg/api`), driven by kubectl v1.32's `top`.

use ccm_testkit::{
    eventually,
    kubectl::{kubectl, require_kubectl},
};
use core_cluster::sim::{CPU_USAGE_ANNOTATION, KubeletApiConfig, MEMORY_USAGE_ANNOTATION};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::PostParams};
use serde_json::{Value, json};

use crate::kubelet_api::{internal_ip_first, start};

/// A pod on `node` whose container uses 250m CPU and 64 MiB, running.
async fn busy_pod(client: &Client, name: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}, "annotations": {
            CPU_USAGE_ANNOTATION: "250m", MEMORY_USAGE_ANNOTATION: "64Mi"}},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx"}]},
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

async fn raw(c: &crate::kubelet_api::Cluster, path: &str) -> String {
    let out = kubectl(c.dir.path(), &c.kubeconfig, &["get", "--raw", path]).await;
    assert!(out.success, "{path}: {out:?}");
    out.stdout
}

/// kubelet's Summary API and resource metrics through `nodes/proxy`: the node's usage is
/// its pods' plus its own, each container's as the pod declares it, the cumulative CPU
/// counters growing with time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_reports_the_simulated_usage_in_its_summary_and_resource_metrics() {
    require_kubectl("it runs `kubectl get --raw …/proxy/stats/summary`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["km-s"]).await;
    busy_pod(&c.client, "web", "km-s").await;
    let summary: Value =
        serde_json::from_str(&raw(&c, "/api/v1/nodes/km-s/proxy/stats/summary").await).unwrap();
    assert_eq!(summary["node"]["nodeName"], "km-s");
    let pod = &summary["pods"][0];
    assert_eq!(pod["podRef"]["name"], "web");
    let container = &pod["containers"][0];
    assert_eq!(container["name"], "app");
    assert_eq!(container["cpu"]["usageNanoCores"], 250_000_000);
    assert_eq!(container["memory"]["workingSetBytes"], 64 << 20);
    // The node: 50m and 256 MiB of its own, plus the pod.
    assert_eq!(summary["node"]["cpu"]["usageNanoCores"], 300_000_000);
    assert_eq!(summary["node"]["memory"]["workingSetBytes"], 320 << 20);
    let first = container["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let again: Value =
        serde_json::from_str(&raw(&c, "/api/v1/nodes/km-s/proxy/stats/summary").await).unwrap();
    let later = again["pods"][0]["containers"][0]["cpu"]["usageCoreNanoSeconds"]
        .as_u64()
        .unwrap();
    // At least 1 s more at 0.25 cores.
    assert!(later >= first + 250_000_000, "{first} then {later}");

    let metrics = raw(&c, "/api/v1/nodes/km-s/proxy/metrics/resource").await;
    assert!(
        metrics.contains(
            "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 67108864 "
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("node_memory_working_set_bytes 335544320 "),
        "{metrics}"
    );
    assert!(metrics.contains("# TYPE container_cpu_usage_seconds_total counter"));
}

/// kubectl v1.32 `top node` and `top pod` (`staging/src/k8s.io/kubectl/pkg/cmd/top`: the
/// group is found by discovery, then NodeMetrics and PodMetrics are listed), and the
/// metrics API's get and NotFound as metrics-server answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_shows_the_usage_of_nodes_and_pods() {
    require_kubectl("it runs `kubectl top node` and `kubectl top pod`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["km-t"]).await;
    busy_pod(&c.client, "web", "km-t").await;

    let pods = kubectl(c.dir.path(), &c.kubeconfig, &["top", "pod", "--containers"]).await;
    assert!(pods.success, "{pods:?}");
    let row: Vec<&str> = pods
        .stdout
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_else(|| panic!("{pods:?}"))
        .split_whitespace()
        .collect();
    assert_eq!(row, ["web", "app", "250m", "64Mi"], "{pods:?}");

    let nodes = kubectl(c.dir.path(), &c.kubeconfig, &["top", "node", "km-t"]).await;
    assert!(nodes.success, "{nodes:?}");
    let row: Vec<&str> = nodes
        .stdout
        .lines()
        .find(|l| l.starts_with("km-t "))
        .unwrap_or_else(|| panic!("{nodes:?}"))
        .split_whitespace()
        .collect();
    assert_eq!((row[1], row[3]), ("300m", "320Mi"), "{nodes:?}");

    let one: Value = serde_json::from_str(
        &raw(
            &c,
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web",
        )
        .await,
    )
    .unwrap();
    assert_eq!(one["kind"], "PodMetrics");
    assert_eq!(
        one["containers"][0]["usage"],
        json!({"cpu": "250000000n", "memory": "65536Ki"})
    );
    let by_label: Value = serde_json::from_str(
        &raw(
            &c,
            "/apis/metrics.k8s.io/v1beta1/pods?labelSelector=app%3Dother",
        )
        .await,
    )
    .unwrap();
    assert_eq!(by_label["items"], json!([]));
    let missing = kubectl(
        c.dir.path(),
        &c.kubeconfig,
        &[
            "get",
            "--raw",
            "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope",
        ],
    )
    .await;
    assert!(!missing.success);
    assert!(
        missing
            .stderr
            .contains("podmetrics.metrics.k8s.io \\\"default/nope\\\" not found")
            || missing
                .stderr
                .contains("podmetrics.metrics.k8s.io \"default/nope\" not found"),
        "{missing:?}"
    );
}
