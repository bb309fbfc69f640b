//! `pods/{name}/proxy` and `services/{name}/proxy`, as kube-apiserver serves them
//! (`pkg/registry/core/pod/rest/subresources.go ProxyREST`, `strategy.go ResourceLocation`;
//! `pkg/registry/core/service/storage/storage.go ResourceLocation`): the name may carry a
//! port and a scheme (`name`, `name:port`, `scheme:name:port`, `utilnet.SplitSchemeNamePort`),
//! a pod's port defaulting to its first declared `containerPort`, a service's resolved by
//! number or name to a ready endpoint's `targetPort`.
//!
//! Simulated pod IPs are not routable on this machine: the request reaches the pod's port
//! through its node's kubelet (`/podPort/{namespace}/{pod}/{port}/{path}`), with the same
//! dialling, certificate checks and timeout as `nodes/proxy`. The `https` scheme is
//! accepted as upstream does (the pod would be dialled over TLS, unverified); the simulated
//! responders answer the same either way. As for nodes, a path with dot segments or
//! encoded separators is refused, and nothing of the request chooses the host.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::Request,
    http::header,
    response::{IntoResponse, Response},
};
use serde_json::Value;

use super::{
    ServerState,
    node_proxy::{check_proxied_path, forward_to_kubelet, split_scheme_name_port, streamed},
    status::ApiError,
};
use crate::{
    registry::{resources, selectors::LabelSelector},
    storage::get_list::{get_object, list_all},
};

/// What a proxy path names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ProxyPath<'a> {
    /// `pods` or `services`.
    pub(crate) resource: &'a str,
    pub(crate) namespace: &'a str,
    /// `name`, `name:port` or `scheme:name:port`.
    pub(crate) id: &'a str,
    /// The path under `proxy`, empty or starting with `/`.
    pub(crate) tail: &'a str,
}

/// A `…/namespaces/{ns}/{pods|services}/{id}/proxy[/{path}]` path.
pub(crate) fn proxy_path(path: &str) -> Option<ProxyPath<'_>> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, rest) = rest.split_once('/')?;
    let (resource, rest) = rest.split_once('/')?;
    if !matches!(resource, "pods" | "services") || namespace.is_empty() {
        return None;
    }
    let (id, rest) = rest.split_once('/')?;
    let tail = rest.strip_prefix("proxy")?;
    if id.is_empty() || !(tail.is_empty() || tail.starts_with('/')) {
        return None;
    }
    Some(ProxyPath {
        resource,
        namespace,
        id,
        tail,
    })
}

/// A `pods/…/proxy` or `services/…/proxy` request.
pub(crate) async fn proxy(
    state: &Arc<ServerState>,
    p: ProxyPath<'_>,
    request: Request<Body>,
) -> Response {
    match proxy_inner(state, p, request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn proxy_inner(
    state: &Arc<ServerState>,
    p: ProxyPath<'_>,
    request: Request<Body>,
) -> Result<Response, ApiError> {
    let Some((_, name, port)) = split_scheme_name_port(p.id) else {
        return Err(ApiError::bad_request(format!(
            "invalid {} request {:?}",
            p.resource.trim_end_matches('s'),
            p.id
        )));
    };
    check_proxied_path(p.tail)?;
    let (pod, port) = if p.resource == "pods" {
        let pod = get_object(&*state.store, &resources::PODS, Some(p.namespace), name)
            .await?
            .1;
        let port = if port.is_empty() {
            first_container_port(&pod).ok_or_else(|| {
                ApiError::service_unavailable(format!(
                    "error trying to reach service: pod {name} declares no port"
                ))
            })?
        } else {
            port.parse::<u16>().map_err(|_| {
                ApiError::bad_request(format!("invalid port {port:?} for pod {name}"))
            })?
        };
        (pod, port)
    } else {
        service_endpoint(state, p.namespace, name, port).await?
    };
    let pod_name = pod["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if node_name.is_empty() || pod["status"]["podIP"].as_str().unwrap_or("").is_empty() {
        return Err(ApiError::service_unavailable(format!(
            "error trying to reach service: pod {pod_name} has no IP yet"
        )));
    }
    let node = get_object(&*state.store, &resources::NODES, None, node_name)
        .await?
        .1;
    let mut path = format!("/podPort/{}/{pod_name}/{port}{}", p.namespace, p.tail);
    if p.tail.is_empty() {
        path.push('/');
    }
    let response = forward_to_kubelet(state, &node, &path, request).await?;
    // The target's headers too, as a reverse proxy hands them on, but the hop-by-hop ones.
    let headers = response.headers().clone();
    let mut out = streamed(response, "application/octet-stream");
    for (name, value) in &headers {
        if !HOP_BY_HOP.contains(&name.as_str()) && name != header::CONTENT_TYPE {
            out.headers_mut().append(name.clone(), value.clone());
        }
    }
    Ok(out)
}

/// Headers that belong to one connection (RFC 9110 7.6.1), not handed on by a proxy.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The first declared `containerPort` of the pod's containers (`ResourceLocation`).
fn first_container_port(pod: &Value) -> Option<u16> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .find_map(|c| c["ports"].as_array()?.first()?["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
}

/// The target of a Service port: a ready pod the selector picks (in name order) and the
/// port its `targetPort` names; upstream's 503 when there is none.
async fn service_endpoint(
    state: &ServerState,
    namespace: &str,
    name: &str,
    port: &str,
) -> Result<(Value, u16), ApiError> {
    let service = get_object(&*state.store, &resources::SERVICES, Some(namespace), name)
        .await?
        .1;
    let ports = service["spec"]["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let chosen = if port.is_empty() {
        ports.first()
    } else {
        ports.iter().find(|p| {
            p["name"].as_str() == Some(port)
                || p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(port)
        })
    };
    let Some(service_port) = chosen else {
        return Err(ApiError::service_unavailable(format!(
            "no endpoints available for service \"{name}\""
        )));
    };
    let selector = service["spec"]["selector"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let unavailable =
        || ApiError::service_unavailable(format!("no endpoints available for service \"{name}\""));
    if selector.is_empty() {
        return Err(unavailable());
    }
    let selector_text: Vec<String> = selector
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    let labels = LabelSelector::parse(&selector_text.join(","))
        .map_err(|e| ApiError::internal(format!("the service's selector: {e}")))?;
    let mut pods: Vec<Value> = list_all(&*state.store, &resources::PODS, Some(namespace))
        .await?
        .into_iter()
        .filter(|p| labels.matches(p) && ready(p))
        .collect();
    pods.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    let target = &service_port["targetPort"];
    for pod in pods {
        let port = match target {
            Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
            Value::String(port_name) => named_port(&pod, port_name),
            _ => service_port["port"]
                .as_u64()
                .and_then(|n| u16::try_from(n).ok()),
        };
        if let Some(port) = port {
            return Ok((pod, port));
        }
    }
    Err(unavailable())
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The number of the container port `name` of `pod`.
fn named_port(pod: &Value, name: &str) -> Option<u16> {
    pod["spec"]["containers"]
        .as_array()?
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .and_then(|p| u16::try_from(p).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn proxy_paths_name_the_object_and_the_path_under_it() {
        assert_eq!(
            proxy_path("/api/v1/namespaces/default/pods/web:80/proxy/a/b"),
            Some(ProxyPath {
                resource: "pods",
                namespace: "default",
                id: "web:80",
                tail: "/a/b"
            })
        );
        assert_eq!(
            proxy_path("/api/v1/namespaces/ns/services/https:web:api/proxy")
                .map(|p| (p.resource, p.id, p.tail)),
            Some(("services", "https:web:api", ""))
        );
        assert_eq!(proxy_path("/api/v1/namespaces/ns/pods/web/proxyx"), None);
        assert_eq!(proxy_path("/api/v1/namespaces/ns/pods/web/log"), None);
        assert_eq!(proxy_path("/api/v1/namespaces/ns/secrets/s/proxy"), None);
    }

    /// `utilnet.SplitSchemeNamePort`: one to three parts, the scheme http or https.
    #[test]
    fn names_split_into_scheme_name_and_port_as_upstream() {
        assert_eq!(split_scheme_name_port("web"), Some(("", "web", "")));
        assert_eq!(split_scheme_name_port("web:80"), Some(("", "web", "80")));
        assert_eq!(
            split_scheme_name_port("https:web:http"),
            Some(("https", "web", "http"))
        );
        assert_eq!(split_scheme_name_port("ftp:web:21"), None);
        assert_eq!(split_scheme_name_port("a:b:c:d"), None);
        assert_eq!(split_scheme_name_port(":80"), None);
    }

    /// `ResourceLocation`: a pod's default port is its first declared one; a service's
    /// `targetPort` name resolves through the pod's container ports.
    #[test]
    fn ports_default_and_resolve_as_upstream() {
        let pod = json!({"spec": {"containers": [
            {"name": "a"},
            {"name": "b", "ports": [{"name": "http", "containerPort": 8080}, {"containerPort": 9090}]}]}});
        assert_eq!(first_container_port(&pod), Some(8080));
        assert_eq!(named_port(&pod, "http"), Some(8080));
        assert_eq!(named_port(&pod, "grpc"), None);
        assert_eq!(
            first_container_port(&json!({"spec": {"containers": [{"name": "a"}]}})),
            None
        );
    }
}
