//! `metrics.k8s.io/v1beta1`: NodeMetrics and PodMetrics (list and get, and discovery), as
//! metrics-server serves them behind its APIService (`sigs.k8s.io/metrics-server`
//! `pkg/api`), answered here in process from the kubelets' Summary API
//! (`/stats/summary`), so that `kubectl top node` and `kubectl top pod` work.
//!
//! Each request scrapes the kubelets it needs, through the same client as `nodes/proxy`
//! (the node's advertised endpoint, `--kubelet-certificate-authority`,
//! `--kubelet-client-certificate`), at most [`MAX_CONCURRENT_SCRAPES`] at once, each
//! bounded by `--kubelet-timeout` (headers and body). As metrics-server, a node or pod whose
//! kubelet does not answer is left out of a list and is a 404 when asked for by name. CPU is
//! given in nano-cores (`250000000n`) and memory as the working set in `Ki`, as
//! metrics-server formats them.

use std::{collections::HashMap, sync::Arc};

use axum::{
    body::Body,
    extract::Request,
    http::{Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt;
use serde_json::{Value, json};

use super::{ServerState, status::ApiError};
use crate::{
    registry::{resources, selectors::LabelSelector},
    storage::{get_list::get_object, get_list::list_all, status::Qualified},
};

/// The group.
pub(crate) const GROUP: &str = "metrics.k8s.io";
/// Its one version.
pub(crate) const VERSION: &str = "v1beta1";
/// Kubelets scraped at once by one request.
const MAX_CONCURRENT_SCRAPES: usize = 16;
/// The largest Summary read from a kubelet.
const MAX_SUMMARY_BYTES: usize = 16 << 20;
/// The window the usage is measured over (metrics-server's default `--metric-resolution`).
const WINDOW: &str = "10s";

/// Whether `path` is under `/apis/metrics.k8s.io`.
pub(crate) fn serves(path: &str) -> bool {
    path.strip_prefix("/apis/metrics.k8s.io")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn group_version() -> Value {
    json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION})
}

/// `/apis/metrics.k8s.io` (`APIGroup`).
fn api_group() -> Value {
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
           "versions": [group_version()], "preferredVersion": group_version()})
}

/// `/apis/metrics.k8s.io/v1beta1` (`APIResourceList`).
fn resource_list() -> Value {
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{VERSION}"),
        "resources": [
            {"name": "nodes", "singularName": "", "namespaced": false, "kind": "NodeMetrics",
             "verbs": ["get", "list"]},
            {"name": "pods", "singularName": "", "namespaced": true, "kind": "PodMetrics",
             "verbs": ["get", "list"]},
        ],
    })
}

/// Adds the group to `/apis` (legacy `APIGroupList`).
pub(crate) fn add_to_group_list(list: &mut Value) {
    if let Some(groups) = list["groups"].as_array_mut() {
        let mut group = api_group();
        if let Some(g) = group.as_object_mut() {
            g.remove("kind");
            g.remove("apiVersion");
        }
        groups.push(group);
    }
}

/// Adds the group to the aggregated discovery of `/apis` (`apidiscovery.k8s.io/v2`).
pub(crate) fn add_to_aggregated(list: &mut Value) {
    let resource = |name: &str, kind: &str, scope: &str| {
        json!({"resource": name, "responseKind": {"group": GROUP, "version": VERSION, "kind": kind},
               "scope": scope, "singularResource": "", "verbs": ["get", "list"]})
    };
    if let Some(items) = list["items"].as_array_mut() {
        items.push(json!({
            "metadata": {"name": GROUP, "creationTimestamp": null},
            "versions": [{"version": VERSION, "freshness": "Current", "resources": [
                resource("nodes", "NodeMetrics", "Cluster"),
                resource("pods", "PodMetrics", "Namespaced"),
            ]}],
        }));
    }
}

fn json_ok(body: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// A request under `/apis/metrics.k8s.io` (already authorized as any resource request:
/// `get`/`list` of `nodes` or `pods` in the group).
pub(crate) async fn serve(state: &Arc<ServerState>, request: Request<Body>) -> Response {
    match serve_inner(state, request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn serve_inner(
    state: &Arc<ServerState>,
    request: Request<Body>,
) -> Result<Response, ApiError> {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["apis", GROUP] => return get_only(&request).map(|()| json_ok(&api_group())),
        ["apis", GROUP, VERSION] => return get_only(&request).map(|()| json_ok(&resource_list())),
        ["apis", GROUP, VERSION, rest @ ..] => rest,
        _ => return Err(ApiError::no_route(&path)),
    };
    get_only(&request)?;
    let query: HashMap<String, String> =
        serde_urlencoded::from_str(request.uri().query().unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?;
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
    match rest {
        ["nodes"] => node_list(state, &labels).await,
        ["nodes", name] => node_get(state, name).await,
        ["pods"] => pod_list(state, None, &labels).await,
        ["namespaces", ns, "pods"] => pod_list(state, Some(ns), &labels).await,
        ["namespaces", ns, "pods", name] => pod_get(state, ns, name).await,
        _ => Err(ApiError::no_route(&path)),
    }
}

fn get_only(request: &Request<Body>) -> Result<(), ApiError> {
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        Ok(())
    } else {
        Err(ApiError::method_not_served())
    }
}

/// `node`'s Summary, or why there is none.
async fn summary(state: &ServerState, node: &Value) -> Result<Value, String> {
    let timeout = state.kubelet.timeout();
    let response = state
        .kubelet
        .send(node, Method::GET, "/stats/summary", &[], Body::empty())
        .await?;
    let status = response.status();
    let body = tokio::time::timeout(
        timeout,
        axum::body::to_bytes(Body::new(response.into_body()), MAX_SUMMARY_BYTES),
    )
    .await
    .map_err(|_| "reading the summary timed out".to_owned())?
    .map_err(|e| format!("reading the summary: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "kubelet answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("the summary is not JSON: {e}"))
}

/// The Summaries of `nodes`, by node name; nodes whose kubelet did not answer are missing.
async fn summaries(state: &ServerState, nodes: Vec<Value>) -> HashMap<String, Value> {
    futures::stream::iter(nodes)
        .map(|node| async move {
            let name = node["metadata"]["name"].as_str().unwrap_or("").to_owned();
            match summary(state, &node).await {
                Ok(s) => Some((name, s)),
                Err(error) => {
                    tracing::debug!(node = %name, %error, "no metrics from the kubelet");
                    None
                }
            }
        })
        .buffer_unordered(MAX_CONCURRENT_SCRAPES)
        .filter_map(|x| async move { x })
        .collect()
        .await
}

/// A CPU quantity from nano-cores, as metrics-server writes it.
fn cpu(nanocores: &Value) -> String {
    format!("{}n", nanocores.as_u64().unwrap_or(0))
}

/// A memory quantity from bytes (binary SI: `Ki` when whole).
fn memory(bytes: &Value) -> String {
    let bytes = bytes.as_u64().unwrap_or(0);
    if bytes.is_multiple_of(1024) {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

fn usage(stats: &Value) -> Value {
    json!({"cpu": cpu(&stats["cpu"]["usageNanoCores"]),
           "memory": memory(&stats["memory"]["workingSetBytes"])})
}

fn metadata_of(obj: &Value) -> Value {
    let mut meta = json!({
        "name": obj["metadata"]["name"],
        "creationTimestamp": crate::registry::meta::now_rfc3339(),
    });
    if let Some(ns) = obj["metadata"]["namespace"].as_str() {
        meta["namespace"] = json!(ns);
    }
    if obj["metadata"]["labels"].is_object() {
        meta["labels"] = obj["metadata"]["labels"].clone();
    }
    meta
}

fn node_metrics(node: &Value, summary: &Value) -> Value {
    json!({
        "kind": "NodeMetrics",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": metadata_of(node),
        "timestamp": summary["node"]["cpu"]["time"],
        "window": WINDOW,
        "usage": usage(&summary["node"]),
    })
}

fn list_of(kind: &str, items: Vec<Value>) -> Response {
    json_ok(&json!({
        "kind": kind,
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {},
        "items": items,
    }))
}

async fn node_list(state: &ServerState, labels: &LabelSelector) -> Result<Response, ApiError> {
    let nodes: Vec<Value> = list_all(&*state.store, &resources::NODES, None)
        .await?
        .into_iter()
        .filter(|n| labels.matches(n))
        .collect();
    let scraped = summaries(state, nodes.clone()).await;
    let items = nodes
        .iter()
        .filter_map(|n| {
            let name = n["metadata"]["name"].as_str()?;
            scraped.get(name).map(|s| node_metrics(n, s))
        })
        .collect();
    Ok(list_of("NodeMetricsList", items))
}

async fn node_get(state: &ServerState, name: &str) -> Result<Response, ApiError> {
    let not_found = || ApiError::not_found(&Qualified::new(GROUP, "nodemetrics", name));
    let node = match get_object(&*state.store, &resources::NODES, None, name).await {
        Ok((_, node)) => node,
        Err(e) if e.code == 404 => return Err(not_found()),
        Err(e) => return Err(e),
    };
    let scraped = summaries(state, vec![node.clone()]).await;
    let summary = scraped.get(name).ok_or_else(not_found)?;
    Ok(json_ok(&node_metrics(&node, summary)))
}

/// The PodMetrics of `pod` from its node's Summary, when the kubelet reports it.
fn pod_metrics(pod: &Value, summary: &Value) -> Option<Value> {
    let (ns, name) = (
        pod["metadata"]["namespace"].as_str()?,
        pod["metadata"]["name"].as_str()?,
    );
    let stats = summary["pods"].as_array()?.iter().find(|p| {
        p["podRef"]["namespace"] == ns
            && p["podRef"]["name"] == name
            && (p["podRef"]["uid"] == pod["metadata"]["uid"] || !pod["metadata"]["uid"].is_string())
    })?;
    let containers: Vec<Value> = stats["containers"]
        .as_array()?
        .iter()
        .map(|c| json!({"name": c["name"], "usage": usage(c)}))
        .collect();
    Some(json!({
        "kind": "PodMetrics",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": metadata_of(pod),
        "timestamp": stats["cpu"]["time"],
        "window": WINDOW,
        "containers": containers,
    }))
}

/// The Summaries of the nodes `pods` are bound to.
async fn summaries_of_pods(
    state: &ServerState,
    pods: &[Value],
) -> Result<HashMap<String, Value>, ApiError> {
    let mut names: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["spec"]["nodeName"].as_str())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut nodes = Vec::new();
    for name in names {
        match get_object(&*state.store, &resources::NODES, None, name).await {
            Ok((_, node)) => nodes.push(node),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(summaries(state, nodes).await)
}

async fn pod_list(
    state: &ServerState,
    namespace: Option<&str>,
    labels: &LabelSelector,
) -> Result<Response, ApiError> {
    let pods: Vec<Value> = list_all(&*state.store, &resources::PODS, namespace)
        .await?
        .into_iter()
        .filter(|p| labels.matches(p))
        .collect();
    let scraped = summaries_of_pods(state, &pods).await?;
    let items = pods
        .iter()
        .filter_map(|p| pod_metrics(p, scraped.get(p["spec"]["nodeName"].as_str()?)?))
        .collect();
    Ok(list_of("PodMetricsList", items))
}

async fn pod_get(state: &ServerState, ns: &str, name: &str) -> Result<Response, ApiError> {
    let not_found = || {
        ApiError::not_found(&Qualified::new(
            GROUP,
            "podmetrics",
            &format!("{ns}/{name}"),
        ))
    };
    let pod = match get_object(&*state.store, &resources::PODS, Some(ns), name).await {
        Ok((_, pod)) => pod,
        Err(e) if e.code == 404 => return Err(not_found()),
        Err(e) => return Err(e),
    };
    let scraped = summaries_of_pods(state, std::slice::from_ref(&pod)).await?;
    pod["spec"]["nodeName"]
        .as_str()
        .and_then(|n| scraped.get(n))
        .and_then(|s| pod_metrics(&pod, s))
        .map(|m| json_ok(&m))
        .ok_or_else(not_found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// metrics-server's quantities: nano-cores, and the working set in `Ki`.
    #[test]
    fn usage_is_written_as_metrics_server_writes_it() {
        let stats = json!({"cpu": {"usageNanoCores": 251000000u64},
                           "memory": {"workingSetBytes": 2_097_152u64}});
        assert_eq!(
            usage(&stats),
            json!({"cpu": "251000000n", "memory": "2048Ki"})
        );
        assert_eq!(memory(&json!(1000)), "1000");
    }

    /// A pod's metrics are its own entry of the node's Summary (by namespace, name, UID).
    #[test]
    fn pod_metrics_come_from_the_pods_own_summary_entry() {
        let pod = json!({"metadata": {"name": "web", "namespace": "default", "uid": "u2"}});
        let summary = json!({"pods": [
            {"podRef": {"name": "web", "namespace": "default", "uid": "u1"}, "containers": []},
            {"podRef": {"name": "web", "namespace": "default", "uid": "u2"},
             "cpu": {"time": "2026-01-01T00:00:00Z"},
             "containers": [{"name": "app", "cpu": {"usageNanoCores": 5}, "memory": {"workingSetBytes": 4096}}]},
        ]});
        let m = pod_metrics(&pod, &summary).unwrap();
        assert_eq!(
            m["containers"][0]["usage"],
            json!({"cpu": "5n", "memory": "4Ki"})
        );
        assert_eq!(m["metadata"]["namespace"], "default");
        let other = json!({"metadata": {"name": "db", "namespace": "default", "uid": "u3"}});
        assert!(pod_metrics(&other, &summary).is_none());
    }

    #[test]
    fn only_the_metrics_group_is_served_here() {
        assert!(serves("/apis/metrics.k8s.io"));
        assert!(serves("/apis/metrics.k8s.io/v1beta1/nodes"));
        assert!(!serves("/apis/metrics.k8s.io.evil/v1"));
        assert!(!serves("/apis/apps/v1"));
    }
}
