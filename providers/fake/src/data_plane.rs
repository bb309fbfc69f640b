//! Load balancers that carry traffic, on this machine's loopback addresses (see
//! [`FakeCloudBuilder::serve_load_balancers`](crate::FakeCloudBuilder::serve_load_balancers)).
//!
//! Each load balancer gets a loopback ingress address (from the configured base, the next
//! free one when another process holds an address) and listens on it for every TCP
//! listener. A connection is spliced, byte for byte, to one of its backends' node port
//! (`<node IP>:<nodePort>`), the backends taken in turn (round robin) and the next one tried
//! when one does not accept. With a health check (`externalTrafficPolicy: Local`) a backend
//! is used only when `GET <path>` on its health-check node port answers 200, asked for each
//! new connection rather than on an interval. `loadBalancerSourceRanges` are enforced on
//! the client's address. Not served: UDP and SCTP listeners, and addresses that are not
//! loopback (a Service asking for `loadBalancerIP` elsewhere gets its load balancer
//! recorded, not served).
//!
//! Connections are bounded as a cloud's load balancer bounds them ([`LoadBalancerLimits`]):
//! closed when idle (60 s by default, an AWS Classic or Application Load Balancer's idle
//! timeout), at most so many per listener, and within a budget of the process's file
//! descriptors, beyond which new connections are reset. The bounds are ccm-serving's
//! ([`ccm_serving::connections`]), shared with the simulated nodes' node ports.

pub use ccm_serving::connections::process_descriptor_budget;

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use ccm_serving::connections::{self, ConnectionLimits, ConnectionLimitsError, Ended};
use ipnet::IpNet;
use parking_lot::{Mutex, RwLock};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// How long a backend has to accept a connection or answer its health check.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(2);
/// Addresses tried for a new load balancer before giving up.
const ADDRESS_ATTEMPTS: u32 = 64;
/// The descriptors one carried connection holds: the client's socket and the socket to the
/// node port.
const DESCRIPTORS_PER_CONNECTION: u32 = 2;

/// How the served load balancers (see
/// [`FakeCloudBuilder::serve_load_balancers`](crate::FakeCloudBuilder::serve_load_balancers))
/// bound the connections they carry, as a cloud's load balancer bounds them outside the
/// control plane: an idle timeout, a cap per listener, a budget of descriptors
/// ([`ConnectionLimits`] says how). Each carried connection takes two descriptors of the
/// budget: the client's socket and the socket to the node port. Give the same budget to the
/// simulated nodes' node ports in the same process so that the data path as a whole stays
/// within it.
pub type LoadBalancerLimits = ConnectionLimits;

/// A configuration of [`LoadBalancerLimits`] that cannot be used.
pub type LoadBalancerLimitsError = ConnectionLimitsError;

/// Where one load balancer sends traffic: read by its connections, updated in place.
#[derive(Debug, Default)]
pub(crate) struct Backends {
    /// The nodes' addresses.
    pub(crate) nodes: Vec<IpAddr>,
    /// The health check: path and node port.
    pub(crate) health_check: Option<(String, u16)>,
    /// Client CIDRs allowed in (empty: all).
    pub(crate) source_ranges: Vec<IpNet>,
}

struct Served {
    ip: IpAddr,
    backends: Arc<RwLock<Backends>>,
    next: Arc<AtomicUsize>,
    /// Service port → (node port, accept task).
    listeners: HashMap<u16, (Arc<AtomicUsize>, JoinHandle<()>)>,
}

impl Drop for Served {
    fn drop(&mut self) {
        for (_, (_, task)) in self.listeners.drain() {
            task.abort();
        }
    }
}

/// The served load balancers, by name.
pub(crate) struct DataPlane {
    base: Ipv4Addr,
    limits: LoadBalancerLimits,
    served: Mutex<HashMap<String, Served>>,
}

impl std::fmt::Debug for DataPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataPlane")
            .field("base", &self.base)
            .field("limits", &self.limits)
            .field("served", &self.served.lock().len())
            .finish()
    }
}

impl DataPlane {
    pub(crate) fn new(base: Ipv4Addr, limits: LoadBalancerLimits) -> Self {
        Self {
            base,
            limits,
            served: Mutex::new(HashMap::new()),
        }
    }

    /// The `n`th ingress address (n from 1): `base + n`, within its /16.
    pub(crate) fn address(&self, n: u32) -> IpAddr {
        let base = u32::from(self.base);
        IpAddr::V4(Ipv4Addr::from(
            (base & 0xffff_0000) | ((base & 0xffff).wrapping_add(n) & 0xffff),
        ))
    }

    /// Serves load balancer `name`: its `(port, node port)` TCP listeners on `ip` (a fresh
    /// address when `fresh` and `ip` is taken: `next_ip` gives another), sending to
    /// `backends`. Returns the address it listens on; addresses that are not loopback are
    /// not served and returned as they are.
    pub(crate) async fn serve(
        &self,
        name: &str,
        mut ip: IpAddr,
        fresh: bool,
        listeners: &[(u16, u16)],
        backends: Backends,
        mut next_ip: impl FnMut() -> IpAddr,
    ) -> Result<IpAddr, String> {
        if !ip.is_loopback() {
            self.remove(name);
            return Ok(ip);
        }
        let current = self.served.lock().remove(name);
        let mut served = match current {
            Some(s) if s.ip == ip => {
                *s.backends.write() = backends;
                s
            }
            _ => Served {
                ip,
                backends: Arc::new(RwLock::new(backends)),
                next: Arc::new(AtomicUsize::new(0)),
                listeners: HashMap::new(),
            },
        };
        served.listeners.retain(|port, (node_port, task)| {
            match listeners.iter().find(|(p, _)| p == port) {
                Some((_, np)) => {
                    node_port.store(usize::from(*np), Ordering::Relaxed);
                    true
                }
                None => {
                    task.abort();
                    false
                }
            }
        });
        let mut attempts = 0;
        let mut bound = Vec::new();
        let mut i = 0;
        while i < listeners.len() {
            let (port, node_port) = listeners[i];
            i += 1;
            if served.listeners.contains_key(&port) {
                continue;
            }
            let addr = SocketAddr::new(ip, port);
            match TcpListener::bind(addr).await {
                Ok(l) => bound.push((port, node_port, l)),
                Err(e) if fresh && e.kind() == std::io::ErrorKind::AddrInUse => {
                    attempts += 1;
                    if attempts >= ADDRESS_ATTEMPTS {
                        return Err(format!("no free loopback address for {name}: {e}"));
                    }
                    // Another process holds this address: start over on the next one.
                    bound.clear();
                    ip = next_ip();
                    served.ip = ip;
                    i = 0;
                }
                Err(e) => return Err(format!("listening on {addr}: {e}")),
            }
        }
        for (port, node_port, listener) in bound {
            let node_port = Arc::new(AtomicUsize::new(usize::from(node_port)));
            let task = tokio::spawn(accept(
                listener,
                served.backends.clone(),
                served.next.clone(),
                node_port.clone(),
                self.limits.clone(),
            ));
            served.listeners.insert(port, (node_port, task));
        }
        self.served.lock().insert(name.to_owned(), served);
        Ok(ip)
    }

    /// New backends for `name`, if it is served.
    pub(crate) fn set_nodes(&self, name: &str, nodes: Vec<IpAddr>) {
        if let Some(s) = self.served.lock().get(name) {
            s.backends.write().nodes = nodes;
        }
    }

    /// Stops serving `name`: its listeners close.
    pub(crate) fn remove(&self, name: &str) {
        self.served.lock().remove(name);
    }
}

/// Accepts the listener's connections and forwards each, within `limits`: a connection
/// beyond the listener's cap or the descriptor budget is reset at once (the listener keeps
/// accepting, so its backlog never fills), with a warning at most once a minute.
async fn accept(
    listener: TcpListener,
    backends: Arc<RwLock<Backends>>,
    next: Arc<AtomicUsize>,
    node_port: Arc<AtomicUsize>,
    limits: LoadBalancerLimits,
) {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)));
    let admission = limits.listener("load balancer", addr);
    loop {
        let (client, peer, permits) = admission
            .accept(&listener, DESCRIPTORS_PER_CONNECTION)
            .await;
        let (backends, next, node_port) = (backends.clone(), next.clone(), node_port.clone());
        let idle_timeout = limits.idle_timeout();
        tokio::spawn(async move {
            let _permits = permits;
            let port = u16::try_from(node_port.load(Ordering::Relaxed)).unwrap_or_default();
            forward(client, peer.ip(), &backends, &next, port, idle_timeout).await;
        });
    }
}

async fn forward(
    client: TcpStream,
    peer: IpAddr,
    backends: &RwLock<Backends>,
    next: &AtomicUsize,
    node_port: u16,
    idle_timeout: Duration,
) {
    let (nodes, health_check, allowed) = {
        let b = backends.read();
        let allowed =
            b.source_ranges.is_empty() || b.source_ranges.iter().any(|r| r.contains(&peer));
        (b.nodes.clone(), b.health_check.clone(), allowed)
    };
    if !allowed || nodes.is_empty() {
        let _ = client.set_zero_linger();
        return;
    }
    let start = next.fetch_add(1, Ordering::Relaxed);
    for k in 0..nodes.len() {
        let node = nodes[(start + k) % nodes.len()];
        if let Some((path, port)) = &health_check
            && !healthy(SocketAddr::new(node, *port), path).await
        {
            continue;
        }
        let connect = TcpStream::connect(SocketAddr::new(node, node_port));
        let Ok(Ok(backend)) = tokio::time::timeout(BACKEND_TIMEOUT, connect).await else {
            continue;
        };
        if connections::splice(client, backend, idle_timeout).await == Ended::Idle {
            tracing::debug!(%peer, %node, node_port, ?idle_timeout, "load balancer: closed an idle connection");
        }
        return;
    }
    let _ = client.set_zero_linger();
}

/// Whether `GET path` at `addr` answers 200 (a cloud's HTTP health check).
async fn healthy(addr: SocketAddr, path: &str) -> bool {
    let probe = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 16];
        let mut read = 0;
        while read < 12 {
            let n = stream.read(&mut head[read..]).await.ok()?;
            if n == 0 {
                break;
            }
            read += n;
        }
        let status = std::str::from_utf8(&head[..read]).ok()?;
        Some(status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200"))
    };
    tokio::time::timeout(BACKEND_TIMEOUT, probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

/// The address a node is reached at: its first `InternalIP`, else `ExternalIP`.
pub(crate) fn node_address(node: &k8s_openapi::api::core::v1::Node) -> Option<IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    ["InternalIP", "ExternalIP"].iter().find_map(|t| {
        addresses
            .iter()
            .filter(|a| a.type_ == *t)
            .find_map(|a| a.address.parse().ok())
    })
}
