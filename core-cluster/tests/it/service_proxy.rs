//! The simulated nodes' data path in kube-proxy's place, on loopback addresses: Services'
//! node ports and health-check ports served from their EndpointSlices (the in-process API
//! server, the EndpointSlice controller and the simulator, through kube-rs), reached here
//! over real TCP as `curl` reaches them.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use ccm_testkit::eventually;
use core_cluster::{
    controllers::endpointslice::EndpointSliceController,
    sim::{NodeSimulator, ServiceProxyLimits, SimConfig, SimNode},
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
    start_with(net, nodes, ServiceProxyLimits::default()).await
}

/// [`start`] with these bounds on the data path's connections.
async fn start_with(net: u8, nodes: usize, limits: ServiceProxyLimits) -> Net {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let stop = CancellationToken::new();
    tokio::spawn(EndpointSliceController::new(client.clone()).run(stop.clone()));
    let sim =
        NodeSimulator::new(client.clone(), SimConfig::default()).with_service_proxy_limits(limits);
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

/// A NodePort Service `web` over one ready pod on node 0; its node port, once node 0
/// answers on it.
async fn one_pod_node_port(net: &Net) -> u16 {
    let pods: Api<Pod> = Api::default_namespaced(net.client.clone());
    web_pod(&pods, "web-0", 0).await;
    let services: Api<Service> = Api::default_namespaced(net.client.clone());
    let svc = web_service(&services, json!({"type": "NodePort"})).await;
    slices_show(&net.client, 1, 0).await;
    let port = node_port(&svc);
    for ip in &net.ips {
        let addr = SocketAddr::new(*ip, port);
        eventually(10, "the node port answers", || async move {
            get(addr, "/").await.ok().filter(|(s, _)| *s == 200)
        })
        .await;
    }
    port
}

/// One keep-alive HTTP/1.1 GET on `stream`: the status, once the whole response is read;
/// `None` when the connection fails or closes.
async fn keep_alive_get(stream: &mut tokio::net::TcpStream) -> Option<u16> {
    let exchange = async {
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: sim\r\n\r\n")
            .await
            .ok()?;
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).ok()?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.ok()?;
        head.split_whitespace().nth(1)?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

/// A kept-alive connection to `addr` that has had one answer.
async fn kept_alive(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        keep_alive_get(&mut stream).await,
        Some(200),
        "through {addr}"
    );
    stream
}

/// Whether `stream` is closed or reset by the other side within `within`.
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Whether a new connection to `addr` is reset (at connect or right after it).
async fn reset(addr: SocketAddr) -> bool {
    match tokio::net::TcpStream::connect(addr).await {
        Err(_) => true,
        Ok(mut s) => closed_within(&mut s, Duration::from_secs(5)).await,
    }
}

/// A new kept-alive connection to `addr` once one is answered (a slot may take a moment
/// to be given back).
async fn eventually_kept_alive(addr: SocketAddr) -> Option<tokio::net::TcpStream> {
    for _ in 0..50 {
        if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await
            && keep_alive_get(&mut s).await == Some(200)
        {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// kube-proxy holds no socket for a Service connection, and the cloud load balancer in front
/// closes one idle for its idle timeout (an AWS Classic or Application Load Balancer: 60 s by
/// default; 1 s here, on real sockets): a node port connection without a byte either way
/// for the idle timeout is closed, while a kept-alive connection with requests flowing stays
/// open however long it lasts. The default is those 60 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_port_closes_idle_connections_and_keeps_active_ones() {
    assert_eq!(
        ServiceProxyLimits::default().idle_timeout(),
        Duration::from_secs(60)
    );
    let idle_timeout = Duration::from_secs(1);
    let net = start_with(64, 1, ServiceProxyLimits::new(idle_timeout, 16).unwrap()).await;
    let addr = SocketAddr::new(net.ips[0], one_pod_node_port(&net).await);
    let since = tokio::time::Instant::now();
    let mut idle = kept_alive(addr).await;
    let mut active = kept_alive(addr).await;
    // A request every 150 ms on `active` for 3 s: three idle timeouts.
    let keep_busy = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            assert_eq!(keep_alive_get(&mut active).await, Some(200), "still open");
        }
        active
    });
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)).await,
        "the idle connection is closed"
    );
    assert!(since.elapsed() >= idle_timeout, "{:?}", since.elapsed());
    let mut active = keep_busy.await.unwrap();
    assert!(
        closed_within(&mut active, Duration::from_secs(5)).await,
        "idle in turn, it is closed too"
    );
}

/// A node port at its connection limit resets new connections (as a load balancer at its
/// limit does) and keeps serving the ones it has; a connection that ends gives its slot to
/// the next. The default limit is 1,024 per listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_port_at_its_connection_limit_resets_new_connections() {
    assert_eq!(ServiceProxyLimits::default().max_connections(), 1024);
    let limits = ServiceProxyLimits::new(Duration::from_secs(60), 2).unwrap();
    let net = start_with(65, 1, limits).await;
    let addr = SocketAddr::new(net.ips[0], one_pod_node_port(&net).await);
    let mut first = kept_alive(addr).await;
    let mut second = kept_alive(addr).await;
    for _ in 0..3 {
        assert!(reset(addr).await, "a third connection is reset");
    }
    assert_eq!(keep_alive_get(&mut first).await, Some(200));
    assert_eq!(keep_alive_get(&mut second).await, Some(200));
    drop(first);
    assert!(
        eventually_kept_alive(addr).await.is_some(),
        "the closed connection's slot is free again"
    );
    assert_eq!(keep_alive_get(&mut second).await, Some(200));
}

/// The data path's share of the process's file descriptors (kube-proxy takes none of the
/// API server's): every node's listeners draw on one budget, one descriptor per
/// connection, and once it is spent new connections are reset on any node; a connection
/// that ends gives its descriptor back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ports_stop_taking_descriptors_when_their_budget_is_spent() {
    let budget = Arc::new(tokio::sync::Semaphore::new(2));
    let limits = ServiceProxyLimits::new(Duration::from_secs(60), 1024)
        .unwrap()
        .with_descriptors(budget.clone());
    let net = start_with(66, 2, limits).await;
    let port = one_pod_node_port(&net).await;
    let at = |i: usize| SocketAddr::new(net.ips[i], port);
    eventually(10, "the probes' descriptors are given back", || {
        let budget = budget.clone();
        async move { (budget.available_permits() == 2).then_some(()) }
    })
    .await;
    let mut first = kept_alive(at(0)).await;
    let mut second = kept_alive(at(1)).await;
    assert_eq!(budget.available_permits(), 0);
    for i in [0, 1] {
        assert!(
            reset(at(i)).await,
            "node {i} resets a connection beyond the budget"
        );
    }
    assert_eq!(keep_alive_get(&mut first).await, Some(200));
    assert_eq!(keep_alive_get(&mut second).await, Some(200));
    drop(first);
    assert!(
        eventually_kept_alive(at(1)).await.is_some(),
        "the ended connection's descriptor is free again"
    );
}
