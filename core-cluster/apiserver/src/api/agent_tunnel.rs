//! `GET /agent-tunnel` upgraded to `core-cluster-agent-tunnel/1`: a node's agent opening
//! the connection its kubelet is then reached over (`core_cluster_tunnel` describes the
//! protocol). Served only when kubelets are reached through agents
//! ([`NodeEgress::AgentTunnel`](super::node_proxy::NodeEgress)); the Node authorizer lets
//! node identities `get` the path, and the connection serves the requesting node alone:
//! an agent cannot carry another node's traffic, whatever it asks.

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use core_cluster_tunnel::{PATH, PROTOCOL};
use hyper_util::rt::TokioIo;

use super::{ServerState, node_proxy::NodeEgress, status::ApiError};
use crate::auth::{GROUP_NODES, NODE_USER_PREFIX, UserInfo};

/// Takes a node agent's tunnel connection: 101 and the connection kept as the node's
/// tunnel, or the error (404 when tunnels are off, 403 for a user that is not a node,
/// 400 without the upgrade).
pub(super) async fn accept(state: &ServerState, mut request: Request) -> Response {
    if state.kubelet.egress() != NodeEgress::AgentTunnel {
        return ApiError::no_route(PATH).into_response();
    }
    let user = request
        .extensions()
        .get::<UserInfo>()
        .cloned()
        .unwrap_or_default();
    let node = match user.name.strip_prefix(NODE_USER_PREFIX) {
        Some(node) if !node.is_empty() && user.in_group(GROUP_NODES) => node.to_owned(),
        _ => {
            return ApiError {
                code: 403,
                reason: "Forbidden",
                message: format!(
                    "agent tunnels are opened by nodes only: user {:?} is not a node",
                    user.name
                ),
                details: None,
            }
            .into_response();
        }
    };
    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !upgrade.eq_ignore_ascii_case(PROTOCOL) {
        return ApiError::bad_request(format!(
            "an agent tunnel is opened with \"Upgrade: {PROTOCOL}\""
        ))
        .into_response();
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    let tunnels = state.kubelet.tunnels().clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                if let Err(error) = tunnels
                    .serve_agent(node.clone(), TokioIo::new(upgraded))
                    .await
                {
                    tracing::debug!(node, %error, "agent tunnel ended");
                }
            }
            Err(error) => tracing::debug!(node, %error, "agent tunnel upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(PROTOCOL));
    response
}
