//! Service traffic in the embedded default, as the README's walkthrough sends it: `curl` to
//! the LoadBalancer's EXTERNAL-IP from `kubectl get svc` reaches the Deployment's pods.

use std::{collections::BTreeSet, process::Command, time::Duration};

use crate::{
    embedded::Embedded,
    support::{require_kubectl, wait_until},
};

/// `curl` (the real one) against `url`: its stdout, or `None` when it fails (a refused or
/// reset connection).
fn curl(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", url])
        .output()
        .expect("curl runs");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The fake cloud's load balancer forwards to the nodes' node ports and each node, in
/// kube-proxy's place (`pkg/proxy/iptables/proxier.go`, endpoints from the Service's
/// EndpointSlices, `pkg/proxy/topology.go` `CategorizeEndpoints`), to a ready pod: `curl`
/// to the EXTERNAL-IP gets answers from each of the three replicas; once the Service is
/// deleted (`ensure_load_balancer_deleted`) the address no longer answers.
#[test]
fn curl_to_the_load_balancer_reaches_every_replica() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let created = cluster.kubectl_stdin(
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=3",
            "--port=80",
        ],
        "",
    );
    assert!(created.contains("deployment.apps/web created"), "{created}");
    let exposed = cluster.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--type=LoadBalancer",
        "--port=80",
    ]);
    assert!(exposed.contains("service/web exposed"), "{exposed}");
    let mut ip = String::new();
    let ensured = wait_until(Duration::from_secs(60), || {
        ip = cluster.kubectl(&[
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].ip}",
        ]);
        ip.parse::<std::net::IpAddr>().is_ok()
    });
    assert!(
        ensured,
        "{}",
        cluster.kubectl(&["get", "service", "web", "-o", "yaml"])
    );
    let ip: std::net::IpAddr = ip.parse().unwrap();
    assert!(ip.is_loopback(), "{ip}");
    let url = format!("http://{ip}:80/");
    let ready = wait_until(Duration::from_secs(60), || {
        cluster
            .kubectl(&[
                "get",
                "endpointslices",
                "-l",
                "kubernetes.io/service-name=web",
                "-o",
                "jsonpath={.items[*].endpoints[?(@.conditions.ready==true)].targetRef.name}",
            ])
            .split_whitespace()
            .count()
            == 3
    });
    assert!(
        ready,
        "{}",
        cluster.kubectl(&["get", "endpointslices", "-o", "yaml"])
    );
    let pods: BTreeSet<String> = cluster
        .kubectl(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(pods.len(), 3, "{pods:?}");
    let mut answered = BTreeSet::new();
    let spread = wait_until(Duration::from_secs(60), || {
        if let Some(name) = curl(&url) {
            assert!(pods.contains(&name), "{name:?} is not one of {pods:?}");
            answered.insert(name);
        }
        answered == pods
    });
    assert!(spread, "answers from {answered:?} of {pods:?}");

    let deleted = cluster.kubectl(&["delete", "service", "web", "--timeout=30s"]);
    assert!(deleted.contains("deleted"), "{deleted}");
    let closed = wait_until(Duration::from_secs(30), || curl(&url).is_none());
    assert!(closed, "{url} still answers");
}
