//! Each node's agent of the control plane's tunnel, Konnectivity's model
//! (`core_cluster_tunnel` describes the protocol): with
//! [`NodeSimulator::with_agent_tunnel`](crate::NodeSimulator::with_agent_tunnel), every
//! node whose kubelet API listens also dials out to the API server as
//! `system:node:<name>` and splices the streams the API server opens to its kubelet's
//! port, so an API server that reaches kubelets only through agents
//! (`--node-egress=agent-tunnel`) still serves `kubectl logs`, `exec` and the proxies. The
//! agent stops with its node.

use std::{collections::HashSet, net::SocketAddr, sync::Arc};

use core_cluster_tunnel::{AgentConfig, client_tls, run_agent};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::Shared;

/// A node's client certificate and key (PEM), from its name: the identity its agent
/// presents (`system:node:<name>` in `system:nodes`).
pub type AgentCredentials = Arc<dyn Fn(&str) -> Result<(String, String), String> + Send + Sync>;

/// Where the nodes' agents dial, and as whom.
#[derive(Clone)]
pub struct AgentTunnelConfig {
    /// The API server's secure address.
    pub server: SocketAddr,
    /// The name its serving certificate is verified for (an IP address or DNS name).
    pub server_name: String,
    /// The CA bundle (PEM) its serving certificate is verified against.
    pub server_ca: String,
    /// Each node's client certificate.
    pub credentials: AgentCredentials,
}

impl std::fmt::Debug for AgentTunnelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTunnelConfig")
            .field("server", &self.server)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// The agents: their settings, and the nodes whose agent runs.
#[derive(Debug, Default)]
pub(crate) struct AgentTunnels {
    config: std::sync::OnceLock<AgentTunnelConfig>,
    running: Mutex<HashSet<String>>,
}

impl AgentTunnels {
    /// Turns the agents on (once); false when they were on already.
    pub(crate) fn enable(&self, config: AgentTunnelConfig) -> bool {
        self.config.set(config).is_ok()
    }
}

/// Starts `node`'s agent when agents are on and its kubelet API listens (once per node);
/// it runs until `shutdown`.
pub(crate) fn start(shared: &Arc<Shared>, node: &str, shutdown: &CancellationToken) {
    let agents = &shared.agent_tunnels;
    let Some(config) = agents.config.get() else {
        return;
    };
    let Some(kubelet) = shared.kubelet_api.endpoint(node) else {
        return;
    };
    if !agents.running.lock().insert(node.to_owned()) {
        return;
    }
    let tls = (config.credentials)(node).and_then(|(cert, key)| {
        client_tls(&config.server_ca, &cert, &key).map_err(|e| e.to_string())
    });
    let tls = match tls {
        Ok(tls) => tls,
        Err(error) => {
            tracing::warn!(node, %error, "the node's agent has no credentials; it does not dial");
            agents.running.lock().remove(node);
            return;
        }
    };
    let agent = AgentConfig {
        server: config.server,
        server_name: config.server_name.clone(),
        tls,
    };
    let (shared, node, shutdown) = (shared.clone(), node.to_owned(), shutdown.clone());
    tokio::spawn(async move {
        run_agent(agent, node.clone(), kubelet, shutdown).await;
        shared.agent_tunnels.running.lock().remove(&node);
    });
}
