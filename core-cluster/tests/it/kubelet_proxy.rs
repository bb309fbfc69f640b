//! `pods/{name}/proxy` and `services/{name}/proxy` (`pkg/registry/core/pod/rest/
//! subresources.go ProxyREST`, `strategy.go ResourceLocation`, the Service registry's
//! `ResourceLocation`), reaching the simulated responder of a pod's declared
//! `containerPort` through its node's kubelet, driven by kubectl v1.32 and kube-rs.

use ccm_testkit::{
    eventually,
    kubectl::{kubectl, require_kubectl},
};
use core_cluster::sim::KubeletApiConfig;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{Api, api::PostParams};
use serde_json::json;

use crate::kubelet_api::{Cluster, internal_ip_first, start};

async fn raw(c: &Cluster, path: &str) -> String {
    let out = kubectl(c.dir.path(), &c.kubeconfig, &["get", "--raw", path]).await;
    assert!(out.success, "{path}: {out:?}");
    out.stdout
}

/// The status code of a GET of `path` through kube-rs (200 when it succeeds).
async fn code_of(c: &Cluster, path: &str) -> (u16, String) {
    let request = axum::http::Request::get(path).body(Vec::new()).unwrap();
    match c.client.request_text(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(s)) => (s.code, s.message),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// Through the pod's name, `name:port`, `scheme:name:port`, and a Service's port by name or
/// number (its `targetPort` named on the container), the request reaches the pod's
/// responder with the path under `proxy`; an undeclared port is refused as a closed port,
/// a smuggled path or a bad scheme is a 400, a Service without ready endpoints upstream's
/// 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_and_service_proxies_reach_the_pods_declared_ports() {
    require_kubectl("it runs `kubectl get --raw …/proxy/`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["kp-a"]).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {"nodeName": "kp-a", "containers": [{"name": "app", "image": "nginx",
            "ports": [{"name": "http", "containerPort": 80}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let services: Api<Service> = Api::namespaced(c.client.clone(), "default");
    for (name, app) in [("web", "web"), ("empty", "none")] {
        let service: Service = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selector": {"app": app},
                "ports": [{"name": "api", "port": 8080, "targetPort": "http"}]},
        }))
        .unwrap();
        services
            .create(&PostParams::default(), &service)
            .await
            .unwrap();
    }
    eventually(10, "the pod is ready", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("web").await.ok()?;
            let ready = p
                .status?
                .conditions?
                .into_iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            ready.then_some(())
        }
    })
    .await;

    for path in [
        "/api/v1/namespaces/default/pods/web/proxy/",
        "/api/v1/namespaces/default/pods/web:80/proxy/a",
        "/api/v1/namespaces/default/pods/http:web:80/proxy/a?b=c",
        "/api/v1/namespaces/default/pods/https:web:80/proxy/",
        "/api/v1/namespaces/default/services/web/proxy/",
        "/api/v1/namespaces/default/services/web:api/proxy/x/y",
        "/api/v1/namespaces/default/services/https:web:8080/proxy/",
    ] {
        assert_eq!(raw(&c, path).await, "web\n", "{path}");
    }
    // The path under `proxy` is the path the pod sees.
    let request = axum::http::Request::get("/api/v1/namespaces/default/services/web:api/proxy/x/y")
        .body(Vec::new())
        .unwrap();
    let response = c.client.send(request.map(Into::into)).await.unwrap();
    assert_eq!(response.headers()["x-sim-path"], "/x/y");

    let (code, message) = code_of(&c, "/api/v1/namespaces/default/pods/web:81/proxy/").await;
    assert_eq!(code, 502, "{message}");
    assert!(
        message.contains(":81: connect: connection refused"),
        "{message}"
    );
    for path in [
        "/api/v1/namespaces/default/pods/web:80/proxy/..%2f..%2fhealthz",
        "/api/v1/namespaces/default/pods/web:80/proxy/%2e%2e/x",
        "/api/v1/namespaces/default/pods/ftp:web:80/proxy/",
        "/api/v1/namespaces/default/pods/web:eighty/proxy/",
    ] {
        assert_eq!(code_of(&c, path).await.0, 400, "{path}");
    }
    assert_eq!(
        code_of(&c, "/api/v1/namespaces/default/services/nope/proxy/")
            .await
            .0,
        404
    );
    // kubectl, not kube-rs: kube-rs retries a 503 with backoff for minutes.
    let empty = kubectl(
        c.dir.path(),
        &c.kubeconfig,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/services/empty/proxy/",
        ],
    )
    .await;
    assert!(!empty.success);
    assert!(
        empty.stderr.contains("ServiceUnavailable")
            && empty.stderr.contains("no endpoints available for service"),
        "{empty:?}"
    );
}
