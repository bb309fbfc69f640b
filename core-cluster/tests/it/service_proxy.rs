//! The simulated nodes' data path in kube-proxy's place, on loopback addresses: Services'
//! node ports and health-check ports served from their EndpointSlices (the in-process API
//! server, the EndpointSlice controller and the simulator, through kube-rs), reached here
//! over real TCP as `curl` reaches them.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use ccm_testkit::eventually;
use core_cluster::{
    controllers::endpointslice::EndpointSliceController,
    sim::{NodeSimulator, SimConfig, SimNode},
};
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::{CancellationToken, DropGuard};

struct Net {
    client: Client,
    sim: NodeSimulator,
    /// The nodes' loopback IPs, by index.
    ips: Vec<IpAddr>,
    _stop: DropGuard,
}

/// An API server, the EndpointSlice controller and `nodes` simulated nodes on loopback
/// addresses of their own (`127.<net>.<pid>.<i>`, so that tests and processes running at
/// once never share a node address) carrying Service traffic.
async fn start(net: u8, nodes: usize) -> Net {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let stop = CancellationToken::new();
    tokio::spawn(EndpointSliceController::new(client.clone()).run(stop.clone()));
    let sim = NodeSimulator::new(client.clone(), SimConfig::default()).with_service_proxy();
    let third = (std::process::id() % 250) as u8 + 1;
    let ips: Vec<IpAddr> = (0..nodes)
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, net, third, i as u8 + 1)))
        .collect();
    sim.add_nodes(
        ips.iter()
            .enumerate()
            .map(|(i, ip)| SimNode::new(format!("dp-{i}")).ip(*ip)),
    );
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await }
    });
    Net {
        client,
        sim,
        ips,
        _stop: stop.drop_guard(),
    }
}

async fn web_pod(pods: &Api<Pod>, name: &str, node: usize) {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"nodeName": format!("dp-{node}"), "containers": [{"name": "app", "image": "nginx",
            "ports": [{"name": "http", "containerPort": 8080}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
}

async fn web_service(services: &Api<Service>, spec: serde_json::Value) -> Service {
    let mut spec = spec;
    spec["selector"] = json!({"app": "web"});
    spec["ports"] = json!([{"name": "http", "port": 80, "targetPort": "http"}]);
    let svc: Service =
        serde_json::from_value(json!({"metadata": {"name": "web"}, "spec": spec})).unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap()
}

/// Waits until the Service's slices hold `ready` ready and `unready` unready endpoints.
async fn slices_show(client: &Client, ready: usize, unready: usize) {
    let slices: Api<EndpointSlice> = Api::default_namespaced(client.clone());
    eventually(30, "the slices show the pods", || {
        let slices = slices.clone();
        async move {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
                .await
                .ok()?;
            let eps: Vec<bool> = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .map(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .collect();
            let r = eps.iter().filter(|r| **r).count();
            (r == ready && eps.len() - r == unready).then_some(())
        }
    })
    .await;
}

/// One HTTP/1.1 GET over a fresh connection: `(status, headers and body)`, or the error a
/// reset or refused connection gives.
async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut out = String::new();
    stream.read_to_string(&mut out).await?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP status in {out:?}")))?;
    Ok((status, out))
}

fn body(response: &str) -> &str {
    response.split("\r\n\r\n").nth(1).unwrap_or_default().trim()
}

fn node_port(svc: &Service) -> u16 {
    let port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port;
    u16::try_from(port.expect("a node port is allocated")).unwrap()
}

/// The pods answering `n` connections to `addr`.
async fn answers(addr: SocketAddr, n: usize) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let (status, response) = get(addr, "/").await.unwrap();
        assert_eq!(status, 200, "{response}");
        seen.insert(body(&response).to_owned());
    }
    seen
}

/// kube-proxy's iptables proxier (`pkg/proxy/iptables/proxier.go`: one random-probability
/// rule per endpoint) over `pkg/proxy/topology.go` `CategorizeEndpoints`: connections to a
/// NodePort on any node spread over the three ready endpoints and never reach the running
/// but unready pod; the request path reaches the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_port_reaches_each_ready_endpoint_and_never_an_unready_one() {
    let net = start(61, 2).await;
    let pods: Api<Pod> = Api::default_namespaced(net.client.clone());
    for (name, node) in [("web-0", 0), ("web-1", 1), ("web-2", 1), ("web-3", 0)] {
        web_pod(&pods, name, node).await;
    }
    let services: Api<Service> = Api::default_namespaced(net.client.clone());
    let svc = web_service(&services, json!({"type": "NodePort"})).await;
    slices_show(&net.client, 4, 0).await;
    // web-3's container is no longer ready (as a failing readiness probe leaves it).
    pods.patch_status(
        "web-3",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "conditions": [{"type": "Ready", "status": "False"}, {"type": "ContainersReady", "status": "False"}],
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"running": {}}}],
        }})),
    )
    .await
    .unwrap();
    slices_show(&net.client, 3, 1).await;

    let port = node_port(&svc);
    let expected: BTreeSet<String> = ["web-0", "web-1", "web-2"].map(String::from).into();
    for ip in &net.ips {
        let addr = SocketAddr::new(*ip, port);
        eventually(10, "the node port listens", || async move {
            get(addr, "/").await.ok()
        })
        .await;
        assert_eq!(answers(addr, 60).await, expected, "through {addr}");
    }
    let (status, response) = get(SocketAddr::new(net.ips[0], port), "/some/path?q=1")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(
        response
            .to_ascii_lowercase()
            .contains("x-sim-path: /some/path?q=1"),
        "{response}"
    );
    let (forwarded, _) = net.sim.service_proxy_connections();
    assert!(forwarded >= 121, "{forwarded}");
}

/// `externalTrafficPolicy: Local` (`CategorizeEndpoints` keeps the node's own endpoints;
/// with none the connection is not forwarded) and kube-proxy's health check
/// (`pkg/proxy/healthcheck/service_health.go` `hcHandler.ServeHTTP`): each node's
/// `healthCheckNodePort` answers 200 and `localEndpoints: N` when it has N local ready
/// endpoints, 503 and 0 when it has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_policy_keeps_to_the_nodes_endpoints_and_the_health_check_reports_them() {
    let net = start(62, 3).await;
    let pods: Api<Pod> = Api::default_namespaced(net.client.clone());
    for (name, node) in [("web-0", 0), ("web-1", 0), ("web-2", 2)] {
        web_pod(&pods, name, node).await;
    }
    let services: Api<Service> = Api::default_namespaced(net.client.clone());
    let svc = web_service(
        &services,
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local"}),
    )
    .await;
    slices_show(&net.client, 3, 0).await;
    let port = node_port(&svc);
    let health = u16::try_from(svc.spec.as_ref().unwrap().health_check_node_port.unwrap()).unwrap();

    let hc = |i: usize| SocketAddr::new(net.ips[i], health);
    let (status, response) = eventually(10, "the health check answers 200", || async move {
        get(hc(0), "/healthz").await.ok().filter(|(s, _)| *s == 200)
    })
    .await;
    assert_eq!(status, 200);
    let report: serde_json::Value = serde_json::from_str(body(&response)).unwrap();
    assert_eq!(
        report,
        json!({"service": {"namespace": "default", "name": "web"}, "localEndpoints": 2, "serviceProxyHealthy": true})
    );
    assert!(
        response
            .to_ascii_lowercase()
            .contains("x-load-balancing-endpoint-weight: 2"),
        "{response}"
    );
    let (status, response) = get(hc(1), "/healthz").await.unwrap();
    assert_eq!(status, 503, "{response}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body(&response)).unwrap()["localEndpoints"],
        0
    );
    let (status, _) = get(hc(2), "/").await.unwrap();
    assert_eq!(status, 200);

    let at = |i: usize| SocketAddr::new(net.ips[i], port);
    assert_eq!(
        answers(at(0), 30).await,
        ["web-0", "web-1"].map(String::from).into()
    );
    assert_eq!(answers(at(2), 10).await, ["web-2"].map(String::from).into());
    // Node 1 has no local endpoint: nothing answers there.
    for _ in 0..5 {
        let outcome = get(at(1), "/").await;
        assert!(outcome.is_err(), "{outcome:?}");
    }
}

/// kube-proxy removes a Service's rules when the Service goes: its node ports and
/// health-check port stop answering on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_service_closes_its_node_ports_and_health_check_port() {
    let net = start(63, 2).await;
    let pods: Api<Pod> = Api::default_namespaced(net.client.clone());
    web_pod(&pods, "web-0", 0).await;
    let services: Api<Service> = Api::default_namespaced(net.client.clone());
    let svc = web_service(
        &services,
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local"}),
    )
    .await;
    slices_show(&net.client, 1, 0).await;
    let port = node_port(&svc);
    let health = u16::try_from(svc.spec.as_ref().unwrap().health_check_node_port.unwrap()).unwrap();
    let node_port_0 = SocketAddr::new(net.ips[0], port);
    eventually(10, "the node port answers", || async move {
        get(node_port_0, "/").await.ok()
    })
    .await;
    assert_eq!(net.sim.service_proxy_listeners().len(), 4);

    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually(10, "every listener closes", || {
        let sim = net.sim.clone();
        async move { sim.service_proxy_listeners().is_empty().then_some(()) }
    })
    .await;
    for ip in &net.ips {
        for p in [port, health] {
            let addr = SocketAddr::new(*ip, p);
            eventually(10, "the port refuses connections", || async move {
                match tokio::net::TcpStream::connect(addr).await {
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Some(()),
                    _ => None,
                }
            })
            .await;
        }
    }
}
