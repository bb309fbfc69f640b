//! Services' endpoints in the embedded default, as a newcomer reads them with kubectl.

use std::time::Duration;

use crate::{
    embedded::Embedded,
    support::{require_kubectl, wait_until},
};

/// kube-controller-manager's EndpointSlice and Endpoints controllers
/// (`pkg/controller/endpointslice`, `pkg/controller/endpoint`) give an exposed Deployment's
/// Service one endpoint per pod IP, and kube-apiserver's endpoint reconciler
/// (`pkg/controlplane/reconcilers`) makes `default/kubernetes` name the API server's own
/// address and secure port, the one in the kubeconfig.
#[test]
fn an_exposed_deployment_has_endpoints_and_kubernetes_names_the_api_server() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let kubeconfig = std::fs::read_to_string(cluster.dir.path().join("kubeconfig")).unwrap();
    let server = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("the kubeconfig names the server")
        .to_owned();
    let named = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&[
            "get",
            "endpoints",
            "kubernetes",
            "-o",
            "jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}",
        ]) == server
    });
    assert!(
        named,
        "{} vs {server}",
        cluster.kubectl(&["get", "endpoints", "kubernetes", "-o", "yaml"])
    );
    let created = cluster.kubectl_stdin(
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
        ],
        "",
    );
    assert!(created.contains("deployment.apps/web created"), "{created}");
    let exposed = cluster.kubectl_stdin(
        &[
            "expose",
            "deployment",
            "web",
            "--port=80",
            "--target-port=8080",
        ],
        "",
    );
    assert!(exposed.contains("service/web exposed"), "{exposed}");
    let ready = wait_until(Duration::from_secs(60), || {
        let pod_ips = cluster.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].status.podIP}",
        ]);
        let mut pod_ips: Vec<&str> = pod_ips.split_whitespace().collect();
        pod_ips.sort_unstable();
        let sliced = cluster.kubectl(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "jsonpath={.items[*].endpoints[?(@.conditions.ready==true)].addresses[0]}",
        ]);
        let mut sliced: Vec<&str> = sliced.split_whitespace().collect();
        sliced.sort_unstable();
        let endpoints = cluster.kubectl(&["get", "endpoints", "web", "--no-headers"]);
        pod_ips.len() == 2 && sliced == pod_ips && endpoints.contains(":8080")
    });
    assert!(
        ready,
        "{}{}",
        cluster.kubectl(&["get", "pods", "-o", "wide"]),
        cluster.kubectl(&["get", "endpointslices,endpoints", "-o", "yaml"])
    );
}
