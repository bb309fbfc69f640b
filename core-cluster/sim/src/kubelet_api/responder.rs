//! The simulated pod network as the kubelet reaches it: every declared TCP `containerPort`
//! of a running pod answers HTTP with the pod's name (declared behaviour, no process runs),
//! and any other port refuses as a closed port does.
//!
//! Simulated pod IPs are not routable on this machine, so the API server's `pods/proxy` and
//! `services/proxy` reach a pod's port through its node's kubelet, on
//! `/podPort/{namespace}/{pod}/{port}/{path}` (authorized as `nodes/proxy`, like every
//! path kubelet does not name otherwise).

use axum::{
    extract::{Path, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{NodeCtx, pod_here, text_error};

/// The header naming the path a responder was asked for (tests read it back).
pub(crate) const PATH_HEADER: &str = "x-sim-path";

/// Whether `pod` runs and declares `port` (TCP) on a running container.
pub(crate) fn listens(pod: &Pod, port: u16) -> bool {
    let running = |name: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|statuses| {
                statuses.iter().any(|c| {
                    c.name == name && c.state.as_ref().is_some_and(|st| st.running.is_some())
                })
            })
    };
    pod.spec.as_ref().is_some_and(|spec| {
        spec.containers.iter().any(|c| {
            running(&c.name)
                && c.ports.iter().flatten().any(|p| {
                    p.container_port == i32::from(port)
                        && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
                })
        })
    })
}

/// `/podPort/{namespace}/{pod}/{port}[/{path}]`.
pub(super) async fn pod_port(
    State(ctx): State<NodeCtx>,
    Path(params): Path<Vec<(String, String)>>,
) -> Response {
    let get = |k: &str| {
        params
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let (namespace, name, port, rest) = (get("namespace"), get("pod"), get("port"), get("rest"));
    let Ok(port) = port.parse::<u16>() else {
        return text_error(StatusCode::BAD_REQUEST, format!("invalid port {port:?}"));
    };
    let pod = match pod_here(&ctx, &namespace, &name).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default();
    if !listens(&pod, port) {
        return text_error(
            StatusCode::BAD_GATEWAY,
            format!("dial tcp {ip}:{port}: connect: connection refused"),
        );
    }
    answer(&pod, &format!("/{rest}"))
}

/// What a listening port of `pod` answers to a request for `path`: its name, the path
/// echoed in [`PATH_HEADER`]. The kubelet's `/podPort` and the simulated data path
/// (`service_proxy`) both reach a pod through this.
pub(crate) fn answer(pod: &Pod, path: &str) -> Response {
    let mut response = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!("{}\n", pod.name_any()),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(path) {
        response.headers_mut().insert(PATH_HEADER, v);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a declared TCP port of a running container answers.
    #[test]
    fn declared_ports_of_running_containers_listen() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"containers": [
                {"name": "app", "ports": [{"containerPort": 80}, {"containerPort": 53, "protocol": "UDP"}]},
                {"name": "side", "ports": [{"containerPort": 9000}]}]},
            "status": {"containerStatuses": [
                {"name": "app", "image": "x", "imageID": "", "ready": true, "restartCount": 0,
                 "state": {"running": {}}},
                {"name": "side", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}}]},
        }))
        .unwrap();
        assert!(listens(&pod, 80));
        assert!(!listens(&pod, 53));
        assert!(!listens(&pod, 9000));
        assert!(!listens(&pod, 81));
    }
}
