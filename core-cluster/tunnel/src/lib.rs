//! # core-cluster-tunnel: the node agents' tunnel
//!
//! Konnectivity's model (upstream's `apiserver-network-proxy`, which kube-apiserver uses for
//! its `cluster` egress when an `EgressSelectorConfiguration` names it): every node runs an
//! agent that dials **out** to the control plane, and the API server's traffic to that
//! node's kubelet (`kubectl logs`, `exec`, `attach`, port-forward, the node, pod and service
//! proxies) rides the agent's connection. A node behind NAT, or behind a firewall that
//! refuses inbound connections, then still answers.
//!
//! Upstream runs `konnectivity-server` beside kube-apiserver and speaks gRPC to it over a
//! Unix socket; here the API server is the proxy server itself, and the protocol is plain
//! HTTP:
//!
//! 1. The agent opens a TLS connection to the API server's secure port and sends
//!    `GET` [`PATH`] with `Connection: Upgrade` and `Upgrade:` [`PROTOCOL`], authenticated as
//!    its node (`system:node:<name>` in `system:nodes`, a client certificate). The API
//!    server answers `101 Switching Protocols` and keeps the connection as that node's
//!    tunnel ([`Tunnels::serve_agent`]); a later connection of the same node replaces it.
//! 2. Over the upgraded connection the API server is the HTTP/2 **client** and the agent
//!    the HTTP/2 server. Each dial ([`Tunnels::dial`]) is one HTTP/2 request; its request
//!    and response bodies are the two directions of a byte stream ([`TunnelStream`]) that
//!    the agent splices to its kubelet's TCP port ([`run_agent`]). HTTP/2 gives every
//!    stream its own flow-control window, so a slow reader holds back its own stream and
//!    nothing else, and a dropped stream is reset at both ends.
//! 3. TLS to the kubelet runs inside the stream, end to end: the API server verifies the
//!    kubelet's serving certificate exactly as it does on a direct connection, and the
//!    agent sees only ciphertext.

mod agent;
mod stream;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use bytes::Bytes;
use hyper::{Method, Request};
use parking_lot::RwLock;
use tokio::io::{AsyncRead, AsyncWrite};

pub use agent::{AgentConfig, client_tls, run_agent};
pub use stream::TunnelStream;

/// The API server's path an agent upgrades to open its tunnel.
pub const PATH: &str = "/agent-tunnel";

/// The `Upgrade` protocol token of a tunnel connection.
pub const PROTOCOL: &str = "core-cluster-agent-tunnel/1";

/// The largest HTTP/2 flow-control window of one stream, and of the whole connection: what
/// one side may send ahead of the other's reading.
const STREAM_WINDOW: u32 = 256 * 1024;
const CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;

/// Why a tunnel could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// No agent of this node is connected: its kubelet cannot be reached (konnectivity's
    /// "No agent available").
    #[error("no agent connected for node {0:?}")]
    NoAgent(String),
    /// The HTTP/2 connection or stream failed.
    #[error("agent tunnel: {0}")]
    Http2(#[from] h2::Error),
    /// The agent answered the dial with an error: its kubelet did not accept the connection.
    #[error("the agent of node {node:?} could not reach its kubelet (HTTP {status})")]
    Refused {
        /// The node whose agent answered.
        node: String,
        /// The status it answered.
        status: u16,
    },
    /// Connecting to the API server or its handshake failed (the agent's side).
    #[error("{0}")]
    Connect(String),
    /// A certificate or key could not be read (the agent's side).
    #[error("agent credentials: {0}")]
    Credentials(String),
}

/// One node's connected agent.
struct Agent {
    /// Told apart from a later connection of the same node.
    id: u64,
    sender: h2::client::SendRequest<Bytes>,
}

/// The API server's side: the agents connected now, by node name.
#[derive(Default)]
pub struct Tunnels {
    agents: RwLock<HashMap<String, Agent>>,
    next_id: AtomicU64,
    dials: AtomicU64,
}

impl std::fmt::Debug for Tunnels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnels")
            .field("agents", &self.agents.read().len())
            .field("dials", &self.dials())
            .finish()
    }
}

impl Tunnels {
    /// No agent connected yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The nodes whose agents are connected now, sorted.
    pub fn connected(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self.agents.read().keys().cloned().collect();
        nodes.sort();
        nodes
    }

    /// Streams opened through agents since the start.
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// Runs `node`'s agent connection, already upgraded to [`PROTOCOL`]: HTTP/2 over it with
    /// the API server as the client, kept as the node's tunnel (replacing an earlier one)
    /// until the connection ends, which this waits for.
    pub async fn serve_agent<I>(self: &Arc<Self>, node: String, io: I) -> Result<(), TunnelError>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(io)
            .await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.agents
            .write()
            .insert(node.clone(), Agent { id, sender });
        tracing::info!(node, "node agent connected");
        let ended = connection.await;
        let mut agents = self.agents.write();
        if agents.get(&node).is_some_and(|a| a.id == id) {
            agents.remove(&node);
        }
        drop(agents);
        tracing::info!(node, "node agent disconnected");
        ended.map_err(TunnelError::from)
    }

    /// A byte stream to `node`'s kubelet through its agent.
    pub async fn dial(&self, node: &str) -> Result<TunnelStream, TunnelError> {
        let sender = self
            .agents
            .read()
            .get(node)
            .map(|a| a.sender.clone())
            .ok_or_else(|| TunnelError::NoAgent(node.to_owned()))?;
        let mut sender = sender.ready().await?;
        let request = Request::builder()
            .method(Method::POST)
            .uri("https://agent/kubelet")
            .body(())
            .expect("a static request is valid");
        let (response, send) = sender.send_request(request, false)?;
        let response = response.await?;
        if !response.status().is_success() {
            return Err(TunnelError::Refused {
                node: node.to_owned(),
                status: response.status().as_u16(),
            });
        }
        self.dials.fetch_add(1, Ordering::Relaxed);
        Ok(TunnelStream::new(send, response.into_body()))
    }
}

#[cfg(test)]
mod tests {
    use std::{net::SocketAddr, sync::Arc, time::Duration};

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };
    use tokio_util::sync::CancellationToken;

    use super::{TunnelError, Tunnels, agent::serve_streams};

    /// A kubelet stand-in that echoes what it reads, one connection at a time.
    async fn echo_kubelet() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = tcp.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// An agent of `node` connected to `tunnels` over an in-memory pipe, splicing to `kubelet`.
    async fn connect_agent(
        tunnels: &Arc<Tunnels>,
        node: &str,
        kubelet: SocketAddr,
    ) -> CancellationToken {
        let (server_side, agent_side) = tokio::io::duplex(64 * 1024);
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move { serve_streams(agent_side, kubelet, &stop).await });
        let (tunnels2, node2) = (tunnels.clone(), node.to_owned());
        tokio::spawn(async move { tunnels2.serve_agent(node2, server_side).await });
        for _ in 0..200 {
            if tunnels.connected().iter().any(|n| n == node) {
                return shutdown;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the agent of {node} never connected");
    }

    #[tokio::test]
    async fn a_dialled_stream_reaches_the_kubelets_port_and_carries_both_directions() {
        let tunnels = Arc::new(Tunnels::new());
        let kubelet = echo_kubelet().await;
        let _agent = connect_agent(&tunnels, "n1", kubelet).await;
        let mut stream = tunnels.dial("n1").await.unwrap();
        // More than one stream window, so flow control has to give capacity back.
        let sent: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let to_send = sent.clone();
        let (mut r, mut w) = tokio::io::split(stream);
        let writer = tokio::spawn(async move {
            w.write_all(&to_send).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut received = Vec::new();
        r.read_to_end(&mut received).await.unwrap();
        writer.await.unwrap();
        assert_eq!(received.len(), sent.len());
        assert!(received == sent, "the echoed bytes differ");
        assert_eq!(tunnels.dials(), 1);
        stream = tunnels.dial("n1").await.unwrap();
        stream.write_all(b"again").await.unwrap();
        let mut back = [0u8; 5];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"again");
    }

    #[tokio::test]
    async fn a_node_whose_agent_is_not_connected_is_refused_without_dialling() {
        let tunnels = Arc::new(Tunnels::new());
        let kubelet = echo_kubelet().await;
        let _agent = connect_agent(&tunnels, "n1", kubelet).await;
        let error = tunnels.dial("n2").await.unwrap_err();
        assert!(
            matches!(&error, TunnelError::NoAgent(n) if n == "n2"),
            "{error}"
        );
        assert_eq!(error.to_string(), "no agent connected for node \"n2\"");
        assert_eq!(tunnels.dials(), 0);
    }

    #[tokio::test]
    async fn a_kubelet_that_refuses_the_connection_is_answered_bad_gateway() {
        let closed = {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            listener.local_addr().unwrap()
        };
        let tunnels = Arc::new(Tunnels::new());
        let _agent = connect_agent(&tunnels, "n1", closed).await;
        let error = tunnels.dial("n1").await.unwrap_err();
        assert!(
            matches!(&error, TunnelError::Refused { node, status: 502 } if node == "n1"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn an_agent_that_goes_away_is_forgotten_and_a_new_connection_serves_the_node() {
        let tunnels = Arc::new(Tunnels::new());
        let kubelet = echo_kubelet().await;
        let first = connect_agent(&tunnels, "n1", kubelet).await;
        first.cancel();
        for _ in 0..200 {
            if tunnels.connected().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            tunnels.connected().is_empty(),
            "the closed agent is still listed"
        );
        assert!(matches!(
            tunnels.dial("n1").await,
            Err(TunnelError::NoAgent(_))
        ));
        let _second = connect_agent(&tunnels, "n1", kubelet).await;
        let mut stream = tunnels.dial("n1").await.unwrap();
        stream.write_all(b"x").await.unwrap();
        let mut back = [0u8; 1];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"x");
    }
}
