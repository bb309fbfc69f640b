//! The simulated nodes' data path, in kube-proxy's place (see
//! [`NodeSimulator::with_service_proxy`](crate::NodeSimulator::with_service_proxy)).
//!
//! For every Service of type `NodePort` or `LoadBalancer`, each simulated node whose IP is
//! a loopback address listens on `<node IP>:<nodePort>` (TCP) and hands each connection to
//! one endpoint, chosen at random per connection as kube-proxy's iptables mode does
//! (`pkg/proxy/iptables/proxier.go`, one `statistic --mode random` rule per endpoint), from
//! the Service's EndpointSlices (kube-proxy's source), filtered as `pkg/proxy/topology.go`
//! `CategorizeEndpoints` does: the ready endpoints, else the serving terminating ones; with
//! `externalTrafficPolicy: Local` only this node's. No endpoint to send to: the connection
//! is reset (kube-proxy rejects it, or drops it under `Local`). The chosen pod answers as its
//! declared TCP `containerPort` answers through the kubelet
//! ([`responder`](crate::kubelet_api::responder): its name), on this same connection, so the
//! requests of one keep-alive connection reach one pod, as a conntrack entry keeps them.
//!
//! A `LoadBalancer` Service with `externalTrafficPolicy: Local` also gets its
//! `healthCheckNodePort` served on each node, answering any path with kube-proxy's JSON
//! (`pkg/proxy/healthcheck/service_health.go`): 200 when the node has local ready
//! endpoints, 503 when it has none, the count in `X-Load-Balancing-Endpoint-Weight`.
//!
//! Services and EndpointSlices come from two watches (kube-rs reflectors); listeners follow
//! the Services and close when their Service goes. No host commands, no iptables: only
//! sockets on addresses the simulator owns. Not done: UDP and SCTP ports, ClusterIPs,
//! session affinity, topology hints (`trafficDistribution`), `internalTrafficPolicy`.
//!
//! kube-proxy forwards in the kernel and holds no descriptor per connection; here every
//! connection is a socket of the process that also runs the API server, so connections are
//! bounded ([`ServiceProxyLimits`]): closed after 60 s without a byte either way (an AWS
//! Classic or Application Load Balancer's default idle timeout), at most so many per
//! listener, and within a budget of the process's file descriptors; a connection beyond a
//! bound is reset at accept. The bounds are ccm-serving's ([`ccm_serving::connections`]),
//! shared with a fake cloud's load balancers.

pub use ccm_serving::connections::process_descriptor_budget;

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use ccm_serving::connections::{self, ConnectionLimits, ConnectionLimitsError, Ended, IdleTracked};
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use parking_lot::{Mutex, RwLock};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::{Shared, kubelet_api::responder};

/// The label naming an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The descriptors one connection holds: its socket (the simulated pod answers on it).
const DESCRIPTORS_PER_CONNECTION: u32 = 1;

/// How the simulated nodes' data path (see
/// [`NodeSimulator::with_service_proxy`](crate::NodeSimulator::with_service_proxy)) bounds
/// the connections to its node ports and health-check ports: an idle timeout (60 s by
/// default, an AWS Classic or Application Load Balancer's, so that a load balancer in front
/// closes its side no later than the node does), a cap per listener, a budget of
/// descriptors ([`ConnectionLimits`] says how). Each connection takes one descriptor of the
/// budget, its socket. Give the same budget to a fake cloud's load balancers in the same
/// process so that the data path as a whole stays within it.
pub type ServiceProxyLimits = ConnectionLimits;

/// A configuration of [`ServiceProxyLimits`] that cannot be used.
pub type ServiceProxyLimitsError = ConnectionLimitsError;

/// What a listener serves.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A Service's node port on a node.
    NodePort {
        service: ObjectRef<Service>,
        node: String,
    },
    /// A Service's `healthCheckNodePort` on a node.
    HealthCheck {
        service: ObjectRef<Service>,
        node: String,
    },
}

struct Listener {
    target: Target,
    cancel: CancellationToken,
}

/// The data path of every node: on or off, and the listeners open now.
#[derive(Default)]
pub(crate) struct ServiceProxy {
    enabled: AtomicBool,
    /// The bounds of its connections.
    limits: RwLock<ServiceProxyLimits>,
    listeners: Mutex<HashMap<SocketAddr, Listener>>,
    /// Woken when nodes are added, to give them listeners.
    nodes_changed: Notify,
    forwarded: AtomicU64,
    refused: AtomicU64,
}

impl std::fmt::Debug for ServiceProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceProxy")
            .field("enabled", &self.enabled())
            .field("limits", &*self.limits.read())
            .field("listeners", &self.listeners.lock().len())
            .finish_non_exhaustive()
    }
}

impl ServiceProxy {
    /// Turns the data path on, within `limits` (before the simulator runs).
    pub(crate) fn enable(&self, limits: ServiceProxyLimits) {
        *self.limits.write() = limits;
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Nodes were added: they get listeners.
    pub(crate) fn nodes_added(&self) {
        self.nodes_changed.notify_one();
    }

    /// The addresses listened on now, sorted.
    pub(crate) fn listening(&self) -> Vec<SocketAddr> {
        let mut addrs: Vec<SocketAddr> = self.listeners.lock().keys().copied().collect();
        addrs.sort();
        addrs
    }

    /// (connections handed to a pod, connections reset for want of one).
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.forwarded.load(Ordering::Relaxed),
            self.refused.load(Ordering::Relaxed),
        )
    }

    fn close_all(&self) {
        for (_, l) in self.listeners.lock().drain() {
            l.cancel.cancel();
        }
    }
}

/// What the connections of a running data path share.
struct Ctx {
    shared: Arc<Shared>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    shutdown: CancellationToken,
}

/// Runs the data path until `shutdown` (nothing when it is off).
pub(crate) async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    if !shared.service_proxy.enabled() {
        return;
    }
    let (services, svc_writer) = reflector::store();
    let (slices, slice_writer) = reflector::store();
    let mut svc_events = watcher(
        Api::<Service>::all(shared.client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(svc_writer)
    .boxed();
    let mut slice_events = watcher(
        Api::<EndpointSlice>::all(shared.client.clone()),
        watcher::Config::default().labels(SERVICE_NAME_LABEL),
    )
    .default_backoff()
    .reflect(slice_writer)
    .boxed();
    let ctx = Arc::new(Ctx {
        shared: shared.clone(),
        services,
        slices,
        shutdown: shutdown.clone(),
    });
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            () = shared.service_proxy.nodes_changed.notified() => reconcile(&ctx).await,
            event = svc_events.next() => match event {
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => {
                    reconcile(&ctx).await;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::debug!(error = %e, "service proxy: service watch error"),
                None => break,
            },
            event = slice_events.next() => {
                if let Some(Err(e)) = event {
                    tracing::debug!(error = %e, "service proxy: endpointslice watch error");
                }
            }
        }
    }
    shared.service_proxy.close_all();
}

/// The listeners the Services ask for on the loopback nodes.
fn desired(ctx: &Ctx) -> HashMap<SocketAddr, Target> {
    let nodes: Vec<(String, std::net::IpAddr)> = ctx
        .shared
        .nodes
        .read()
        .values()
        .filter(|n| n.ip.is_loopback())
        .map(|n| (n.name.clone(), n.ip))
        .collect();
    let mut want = HashMap::new();
    for svc in ctx.services.state() {
        let Some(spec) = svc.spec.as_ref() else {
            continue;
        };
        let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
        if kind != "NodePort" && kind != "LoadBalancer" {
            continue;
        }
        let service = ObjectRef::from_obj(&*svc);
        let ports: BTreeSet<u16> = spec
            .ports
            .iter()
            .flatten()
            .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
            .filter_map(|p| p.node_port.and_then(|n| u16::try_from(n).ok()))
            .filter(|p| *p > 0)
            .collect();
        let health = (kind == "LoadBalancer" && local_policy(&svc))
            .then_some(spec.health_check_node_port)
            .flatten()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0);
        for (node, ip) in &nodes {
            for port in &ports {
                want.insert(
                    SocketAddr::new(*ip, *port),
                    Target::NodePort {
                        service: service.clone(),
                        node: node.clone(),
                    },
                );
            }
            if let Some(port) = health {
                want.insert(
                    SocketAddr::new(*ip, port),
                    Target::HealthCheck {
                        service: service.clone(),
                        node: node.clone(),
                    },
                );
            }
        }
    }
    want
}

fn local_policy(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.external_traffic_policy.as_deref())
        == Some("Local")
}

/// Opens the listeners the Services ask for and closes the others.
async fn reconcile(ctx: &Arc<Ctx>) {
    let mut want = desired(ctx);
    {
        let mut listeners = ctx.shared.service_proxy.listeners.lock();
        listeners.retain(|addr, l| match want.remove(addr) {
            Some(target) => {
                l.target = target;
                true
            }
            None => {
                tracing::debug!(%addr, "service proxy: closing");
                l.cancel.cancel();
                false
            }
        });
    }
    for (addr, target) in want {
        let listener = match TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(error) => {
                tracing::warn!(%addr, ?target, %error, "service proxy: cannot listen");
                continue;
            }
        };
        tracing::debug!(%addr, ?target, "service proxy: listening");
        let cancel = ctx.shutdown.child_token();
        ctx.shared.service_proxy.listeners.lock().insert(
            addr,
            Listener {
                target,
                cancel: cancel.clone(),
            },
        );
        tokio::spawn(accept(ctx.clone(), listener, addr, cancel));
    }
}

/// Accepts the listener's connections and serves each, within the data path's limits: a
/// connection beyond the listener's cap or the descriptor budget is reset at once (the
/// listener keeps accepting, so its backlog never fills), with a warning at most once a
/// minute; a connection idle for the idle timeout is closed.
async fn accept(ctx: Arc<Ctx>, listener: TcpListener, addr: SocketAddr, cancel: CancellationToken) {
    let limits = ctx.shared.service_proxy.limits.read().clone();
    let admission = limits.listener("service proxy", addr);
    loop {
        let (stream, peer, admitted) = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = admission.accept(&listener, DESCRIPTORS_PER_CONNECTION) => accepted,
        };
        let target = ctx
            .shared
            .service_proxy
            .listeners
            .lock()
            .get(&addr)
            .map(|l| l.target.clone());
        let Some(target) = target else { return };
        let ctx = ctx.clone();
        let idle_timeout = limits.idle_timeout();
        tokio::spawn(async move {
            let _admitted = admitted;
            let ended = connections::serve_until_idle(stream, idle_timeout, |stream| async move {
                match target {
                    Target::NodePort { service, node } => {
                        node_port(&ctx, stream, addr.port(), &service, &node).await;
                    }
                    Target::HealthCheck { service, node } => {
                        health_check(&ctx, stream, service, node).await;
                    }
                }
            })
            .await;
            if ended == Ended::Idle {
                tracing::debug!(%addr, %peer, ?idle_timeout, "service proxy: closed an idle connection");
            }
        });
    }
}

/// One endpoint of a Service port, as kube-proxy's endpoint slice cache keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Endpoint {
    /// The pod behind it (`targetRef`), as `(namespace, name)`.
    pub(crate) pod: (String, String),
    /// `nodeName`.
    pub(crate) node: Option<String>,
    /// The port on the pod.
    pub(crate) port: u16,
    /// `conditions.ready` (unset means ready).
    pub(crate) ready: bool,
    /// `conditions.serving` (unset means ready).
    pub(crate) serving: bool,
    /// `conditions.terminating` (unset means false).
    pub(crate) terminating: bool,
}

/// The endpoints of `service`'s port named `port_name` (`""` for an unnamed one), TCP, from
/// its EndpointSlices; each pod and port once.
fn endpoints_of(
    slices: &Store<EndpointSlice>,
    service: &ObjectRef<Service>,
    port_name: &str,
) -> Vec<Endpoint> {
    let namespace = service.namespace.as_deref().unwrap_or_default();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for slice in slices.state() {
        if slice.namespace().as_deref() != Some(namespace)
            || slice.labels().get(SERVICE_NAME_LABEL) != Some(&service.name)
            || slice.address_type == "FQDN"
        {
            continue;
        }
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|p| {
                p.name.as_deref().unwrap_or_default() == port_name
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            })
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for ep in &slice.endpoints {
            let Some(target) = ep
                .target_ref
                .as_ref()
                .filter(|t| t.kind.as_deref().unwrap_or("Pod") == "Pod" && t.name.is_some())
            else {
                continue;
            };
            let conditions = ep.conditions.clone().unwrap_or_default();
            let ready = conditions.ready.unwrap_or(true);
            let endpoint = Endpoint {
                pod: (
                    target
                        .namespace
                        .clone()
                        .unwrap_or_else(|| namespace.to_owned()),
                    target.name.clone().unwrap_or_default(),
                ),
                node: ep.node_name.clone(),
                port,
                ready,
                serving: conditions.serving.unwrap_or(ready),
                terminating: conditions.terminating.unwrap_or(false),
            };
            if seen.insert((endpoint.pod.clone(), port)) {
                out.push(endpoint);
            }
        }
    }
    out
}

/// The endpoints traffic may go to (`pkg/proxy/topology.go` `CategorizeEndpoints`, without
/// topology hints): the ready ones, else the serving terminating ones; with `local_node`
/// (`externalTrafficPolicy: Local`), only that node's, by the same rule.
pub(crate) fn usable<'a>(endpoints: &'a [Endpoint], local_node: Option<&str>) -> Vec<&'a Endpoint> {
    let candidates: Vec<&Endpoint> = endpoints
        .iter()
        .filter(|e| local_node.is_none_or(|n| e.node.as_deref() == Some(n)))
        .collect();
    let ready: Vec<&Endpoint> = candidates.iter().copied().filter(|e| e.ready).collect();
    if !ready.is_empty() {
        return ready;
    }
    candidates
        .into_iter()
        .filter(|e| e.serving && e.terminating)
        .collect()
}

/// The ready endpoints on `node` of every port of `service`, counted per port as
/// kube-proxy's `EndpointsMap.LocalReadyEndpoints` counts them.
fn local_ready(slices: &Store<EndpointSlice>, service: &ObjectRef<Service>, node: &str) -> usize {
    let namespace = service.namespace.as_deref().unwrap_or_default();
    let mut seen = HashSet::new();
    for slice in slices.state() {
        if slice.namespace().as_deref() != Some(namespace)
            || slice.labels().get(SERVICE_NAME_LABEL) != Some(&service.name)
        {
            continue;
        }
        for port in slice.ports.iter().flatten() {
            for ep in &slice.endpoints {
                let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
                if ready && ep.node_name.as_deref() == Some(node) {
                    seen.insert((
                        port.name.clone().unwrap_or_default(),
                        port.protocol.clone().unwrap_or_default(),
                        ep.addresses.first().cloned().unwrap_or_default(),
                    ));
                }
            }
        }
    }
    seen.len()
}

/// Resets a connection (an RST, as a rejected or dropped connection shows to the client).
fn reset(ctx: &Ctx, stream: IdleTracked<TcpStream>) {
    ctx.shared
        .service_proxy
        .refused
        .fetch_add(1, Ordering::Relaxed);
    let _ = stream.get_ref().set_zero_linger();
    drop(stream);
}

async fn node_port(
    ctx: &Arc<Ctx>,
    stream: IdleTracked<TcpStream>,
    node_port: u16,
    service: &ObjectRef<Service>,
    node: &str,
) {
    let up = ctx
        .shared
        .node(node)
        .is_ok_and(|n| !n.ctl.lock().powered_off);
    let Some(svc) = ctx.services.get(service).filter(|_| up) else {
        return reset(ctx, stream);
    };
    let Some(port_name) = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .and_then(|ports| {
            ports.iter().find(|p| {
                p.node_port == Some(i32::from(node_port))
                    && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
            })
        })
        .map(|p| p.name.clone().unwrap_or_default())
    else {
        return reset(ctx, stream);
    };
    let endpoints = endpoints_of(&ctx.slices, service, &port_name);
    let local = local_policy(&svc).then_some(node);
    let usable = usable(&endpoints, local);
    if usable.is_empty() {
        tracing::debug!(service = %service, node, "service proxy: no endpoint");
        return reset(ctx, stream);
    }
    let endpoint = usable[fastrand::usize(..usable.len())].clone();
    let (namespace, name) = &endpoint.pod;
    let pod = Api::<Pod>::namespaced(ctx.shared.client.clone(), namespace)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .is_some_and(|n| ctx.shared.node(n).is_ok())
                && responder::listens(p, endpoint.port)
        });
    let Some(pod) = pod else {
        // The pod's port is closed: the client sees the refusal.
        return reset(ctx, stream);
    };
    ctx.shared
        .service_proxy
        .forwarded
        .fetch_add(1, Ordering::Relaxed);
    let pod = Arc::new(pod);
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let pod = pod.clone();
            async move {
                let path = request
                    .uri()
                    .path_and_query()
                    .map_or("/", |p| p.as_str())
                    .to_owned();
                Ok::<_, Infallible>(responder::answer(&pod, &path))
            }
        });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = ctx.shutdown.cancelled() => {}
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "service proxy: connection ended");
            }
        }
    }
}

/// kube-proxy's health check body (`service_health.go` `hcHandler.ServeHTTP`).
pub(crate) fn health_body(namespace: &str, name: &str, local_endpoints: usize) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {local_endpoints},\n\t\"serviceProxyHealthy\": true\n}}",
        quote(namespace),
        quote(name)
    )
}

async fn health_check(
    ctx: &Arc<Ctx>,
    stream: IdleTracked<TcpStream>,
    service: ObjectRef<Service>,
    node: String,
) {
    let ctx2 = ctx.clone();
    let handler =
        hyper::service::service_fn(move |_request: hyper::Request<hyper::body::Incoming>| {
            let ctx = ctx2.clone();
            let (service, node) = (service.clone(), node.clone());
            async move {
                let count = local_ready(&ctx.slices, &service, &node);
                let body = health_body(
                    service.namespace.as_deref().unwrap_or_default(),
                    &service.name,
                    count,
                );
                let status = if count > 0 {
                    axum::http::StatusCode::OK
                } else {
                    axum::http::StatusCode::SERVICE_UNAVAILABLE
                };
                let response = axum::http::Response::builder()
                    .status(status)
                    .header("Content-Type", "application/json")
                    .header("X-Content-Type-Options", "nosniff")
                    .header("X-Load-Balancing-Endpoint-Weight", count.to_string())
                    .body(axum::body::Body::from(body))
                    .unwrap_or_default();
                Ok::<_, Infallible>(response)
            }
        });
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), handler);
    tokio::select! {
        _ = ctx.shutdown.cancelled() => {}
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "service proxy: health check connection ended");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(pod: &str, node: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            pod: ("default".into(), pod.into()),
            node: Some(node.into()),
            port: 80,
            ready,
            serving,
            terminating,
        }
    }

    fn names(eps: Vec<&Endpoint>) -> Vec<&str> {
        eps.into_iter().map(|e| e.pod.1.as_str()).collect()
    }

    /// `pkg/proxy/topology.go` `CategorizeEndpoints`: ready endpoints only while there are
    /// any; then the serving terminating ones, never the unready non-terminating ones.
    #[test]
    fn ready_endpoints_first_then_serving_terminating_ones() {
        let all = [
            ep("a", "n1", true, true, false),
            ep("b", "n2", false, false, false),
            ep("c", "n2", false, true, true),
        ];
        assert_eq!(names(usable(&all, None)), ["a"]);
        assert_eq!(names(usable(&all[1..], None)), ["c"]);
        assert!(usable(&all[1..2], None).is_empty());
    }

    /// `CategorizeEndpoints` with `externalTrafficPolicy: Local`: only the node's own
    /// endpoints, with the same fallback; none when the node has none.
    #[test]
    fn local_policy_keeps_the_nodes_own_endpoints() {
        let all = [
            ep("a", "n1", true, true, false),
            ep("b", "n2", true, true, false),
            ep("c", "n3", false, true, true),
        ];
        assert_eq!(names(usable(&all, Some("n2"))), ["b"]);
        assert_eq!(names(usable(&all, Some("n3"))), ["c"]);
        assert!(usable(&all, Some("n4")).is_empty());
    }

    /// `service_health.go` `hcHandler.ServeHTTP`'s body, dedented as upstream prints it.
    #[test]
    fn the_health_check_body_is_kube_proxys() {
        let body = health_body("default", "web", 2);
        assert_eq!(
            body,
            "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["service"]["name"], "web");
        assert_eq!(v["localEndpoints"], 2);
    }
}
