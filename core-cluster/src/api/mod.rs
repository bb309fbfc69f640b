//! The HTTP API: kube-apiserver's REST surface over the [`store`](crate::store) and the
//! [`registry`](crate::registry) of resources.
//!
//! [`ApiServer::router`] is an axum `Router`. Serve it on a socket ([`crate::serve`]), or hand
//! it to kube 5's `Client::new(router, "default")` for an in-process API server with no TCP.

pub mod discovery;
mod handlers;
pub mod metrics;
pub mod negotiate;
mod scale;
pub mod status;
mod watch;

use std::{collections::HashMap, net::IpAddr, ops::RangeInclusive, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use ipnet::IpNet;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::{
    auth::UserInfo,
    registry::{Registry, ResourceDef, allocator::ServiceAllocator, meta},
    store::Store,
};
use status::ApiError;

/// Settings of the API server.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// `--service-cluster-ip-range`: one CIDR, or one per family for dual stack.
    pub service_cluster_ip_ranges: Vec<IpNet>,
    /// `--service-node-port-range`.
    pub service_node_port_range: RangeInclusive<u16>,
    /// The largest request body accepted (kube-apiserver: 3 MiB).
    pub max_request_bytes: usize,
    /// How often a watch with `allowWatchBookmarks` gets a bookmark (upstream: about 1 min).
    pub bookmark_interval: Duration,
    /// The watch timeout when the client gives none (upstream: 30–60 min).
    pub default_watch_timeout: Duration,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        ApiServerConfig {
            service_cluster_ip_ranges: vec!["10.96.0.0/12".parse().expect("valid CIDR")],
            service_node_port_range: 30000..=32767,
            max_request_bytes: 3 * 1024 * 1024,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store failed while bootstrapping.
    #[error("bootstrapping the API server: {0}")]
    Bootstrap(#[from] ApiError),
}

pub(crate) struct ServerState {
    /// Lets background work (namespace cleanup) hold the state.
    pub(crate) self_ref: std::sync::Weak<ServerState>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Registry,
    pub(crate) allocator: Mutex<ServiceAllocator>,
    pub(crate) config: ApiServerConfig,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) openapi: crate::openapi::OpenApiDocuments,
    pub(crate) event_cache: watch::EventCache,
}

/// A Kubernetes-compatible API server over a [`Store`].
#[derive(Clone)]
pub struct ApiServer {
    state: Arc<ServerState>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("config", &self.state.config)
            .finish_non_exhaustive()
    }
}

/// The namespaces every cluster has.
pub const SYSTEM_NAMESPACES: [&str; 4] =
    ["default", "kube-system", "kube-public", "kube-node-lease"];

impl ApiServer {
    /// A server over `store`: creates the system namespaces and the `kubernetes` Service if
    /// missing, and recovers the Service IP and port allocations from the stored Services.
    pub async fn new(store: Arc<dyn Store>, config: ApiServerConfig) -> Result<Self, StartError> {
        let allocator = ServiceAllocator::new(
            config.service_cluster_ip_ranges.clone(),
            config.service_node_port_range.clone(),
        );
        let state = Arc::new_cyclic(|self_ref| ServerState {
            self_ref: self_ref.clone(),
            store,
            registry: Registry::standard(),
            allocator: Mutex::new(allocator),
            config,
            metrics: metrics::Metrics::default(),
            openapi: crate::openapi::OpenApiDocuments::new(&crate::openapi::served_resources()),
            event_cache: watch::EventCache::default(),
        });
        let server = ApiServer { state };
        server.bootstrap().await?;
        Ok(server)
    }

    async fn bootstrap(&self) -> Result<(), ApiError> {
        let services = self.def("", "services");
        let listed = handlers::list_all(&self.state, services, None).await?;
        {
            let mut allocator = self.state.allocator.lock();
            for svc in &listed {
                allocator.recover(svc);
            }
        }
        let namespaces = self.def("", "namespaces");
        for ns in SYSTEM_NAMESPACES {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            match handlers::create_object(&self.state, namespaces, None, body, &HashMap::new())
                .await
            {
                Ok(_) => {}
                Err(e) if e.reason == "AlreadyExists" => {}
                Err(e) => return Err(e),
            }
        }
        let first_ip: Option<IpAddr> = self.state.allocator.lock().first_ip();
        if let Some(ip) = first_ip {
            let body = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "namespace": "default",
                             "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": ip.to_string(), "type": "ClusterIP",
                         "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
            });
            match handlers::create_object(
                &self.state,
                services,
                Some("default"),
                body,
                &HashMap::new(),
            )
            .await
            {
                Ok(_) => {}
                Err(e) if e.reason == "AlreadyExists" || e.reason == "Invalid" => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn def(&self, group: &str, plural: &str) -> &'static ResourceDef {
        self.state
            .registry
            .all()
            .iter()
            .copied()
            .find(|d| d.group == group && d.plural == plural)
            .expect("standard resource")
    }

    /// Compacts the store's history every `interval`, keeping about one interval of it, as
    /// kube-apiserver compacts etcd every 5 minutes. Watches and continue tokens older than
    /// that get 410 Expired and relist. Stops when `shutdown` is cancelled.
    pub fn spawn_compactor(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let store = self.state.store.clone();
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            let mut previous: Option<u64> = None;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = ticker.tick() => {}
                }
                let Ok(current) = store.current_revision().await else {
                    continue;
                };
                if let Some(revision) = previous.filter(|r| *r > 0) {
                    match store.compact(revision).await {
                        Ok(()) => tracing::debug!(revision, "compacted the store"),
                        Err(e) => tracing::warn!(revision, error = %e, "compaction failed"),
                    }
                }
                previous = Some(current);
            }
        })
    }

    /// The store behind the server.
    pub fn store(&self) -> Arc<dyn Store> {
        self.state.store.clone()
    }

    /// The HTTP API as an axum router for in-process use: requests carry no identity of their
    /// own and act as the privileged loopback client ([`UserInfo::loopback`]).
    pub fn router(&self) -> Router {
        self.routes()
    }

    /// The HTTP API as an axum router whose every request acts as `user` (tests of
    /// authorization use it in-process, with no TLS).
    pub fn router_as(&self, user: UserInfo) -> Router {
        self.routes().layer(axum::Extension(user))
    }

    fn routes(&self) -> Router {
        Router::new()
            .route("/version", get(version))
            .route("/healthz", get(health))
            .route("/livez", get(health))
            .route("/readyz", get(health))
            .route("/metrics", get(metrics_endpoint))
            .route("/api", get(api_root))
            .route("/apis", get(apis_root))
            .route("/openapi/v3", get(openapi_index))
            .route("/openapi/v3/{*path}", get(openapi_group_version))
            .fallback(dispatch)
            .with_state(self.state.clone())
    }
}

fn json_response(code: StatusCode, value: &Value, content_type: &'static str) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn version(State(state): State<Arc<ServerState>>) -> Response {
    let started = tokio::time::Instant::now();
    let r = json_response(StatusCode::OK, &discovery::version(), "application/json");
    state
        .metrics
        .observe("GET", "", 200, started.elapsed().as_secs_f64());
    r
}

async fn health(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    let verbose = request.uri().query().is_some_and(|q| q.contains("verbose"));
    match state.store.current_revision().await {
        Ok(_) if verbose => (
            StatusCode::OK,
            "[+]ping ok\n[+]store ok\nhealthz check passed\n",
        )
            .into_response(),
        Ok(_) => (StatusCode::OK, "ok").into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("[+]ping ok\n[-]store failed: {e}\nhealthz check failed\n"),
        )
            .into_response(),
    }
}

async fn metrics_endpoint(State(state): State<Arc<ServerState>>) -> Response {
    let mut counts = Vec::new();
    let mut seen = Vec::new();
    for def in state.registry.all() {
        if seen.contains(&def.storage) {
            continue;
        }
        seen.push(def.storage);
        let mut count = 0;
        let mut start: Option<String> = None;
        while let Ok(page) = state
            .store
            .list(&def.key_prefix(None), start.as_deref(), Some(1000), None)
            .await
        {
            count += page.items.len();
            start = page.items.last().map(|kv| kv.key.clone());
            if !page.more {
                break;
            }
        }
        counts.push((def.plural.to_owned(), count));
    }
    let revision = state.store.current_revision().await.unwrap_or(0);
    let text = state.metrics.render(&counts, revision);
    let mut response = (StatusCode::OK, text).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

async fn openapi_index(State(state): State<Arc<ServerState>>) -> Response {
    let mut r = (StatusCode::OK, state.openapi.index().to_vec()).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn openapi_group_version(
    State(state): State<Arc<ServerState>>,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Response {
    match state.openapi.group_version(&path) {
        Some(doc) => {
            let mut r = (StatusCode::OK, doc.to_vec()).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        None => ApiError::no_route(&format!("/openapi/v3/{path}")).into_response(),
    }
}

async fn api_root(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    if negotiate::wants_aggregated_discovery(request.headers()) {
        json_response(
            StatusCode::OK,
            &discovery::aggregated(&state.registry, true),
            negotiate::AGGREGATED_DISCOVERY_CONTENT_TYPE,
        )
    } else {
        json_response(
            StatusCode::OK,
            &discovery::core_versions(),
            "application/json",
        )
    }
}

async fn apis_root(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    if negotiate::wants_aggregated_discovery(request.headers()) {
        json_response(
            StatusCode::OK,
            &discovery::aggregated(&state.registry, false),
            negotiate::AGGREGATED_DISCOVERY_CONTENT_TYPE,
        )
    } else {
        json_response(
            StatusCode::OK,
            &discovery::group_list(&state.registry),
            "application/json",
        )
    }
}

/// A parsed resource path.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) def: &'static ResourceDef,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) subresource: Option<String>,
}

enum Parsed {
    Resource(Target),
    Discovery(Value),
    NotFound,
}

fn parse_path(registry: &Registry, path: &str) -> Parsed {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segments.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", group] => {
            return discovery::group(registry, group).map_or(Parsed::NotFound, Parsed::Discovery);
        }
        ["apis", group, version, rest @ ..] => (group, version, rest),
        _ => return Parsed::NotFound,
    };
    if rest.is_empty() {
        return discovery::resource_list(registry, group, version)
            .map_or(Parsed::NotFound, Parsed::Discovery);
    }
    let find = |plural: &str| registry.find(group, version, plural);
    let target = |def: &'static ResourceDef, ns: Option<&str>, tail: &[&str]| -> Option<Target> {
        if def.namespaced != ns.is_some() && !(def.namespaced && ns.is_none() && tail.is_empty()) {
            return None;
        }
        let (name, sub) = match tail {
            [] => (None, None),
            [name] => (Some(*name), None),
            [name, sub] => (Some(*name), Some(*sub)),
            _ => return None,
        };
        Some(Target {
            def,
            namespace: ns.map(str::to_owned),
            name: name.map(str::to_owned),
            subresource: sub.map(str::to_owned),
        })
    };
    let parsed = match rest {
        // /api/v1/namespaces/{ns}/{plural}[/{name}[/{sub}]]
        ["namespaces", ns, plural, tail @ ..]
            if find(plural).is_some_and(|d| d.namespaced)
                && group_has_namespaces(registry, group, version, plural) =>
        {
            find(plural).and_then(|d| target(d, Some(ns), tail))
        }
        [plural, tail @ ..] => find(plural).and_then(|d| target(d, None, tail)),
        [] => None,
    };
    parsed.map_or(Parsed::NotFound, Parsed::Resource)
}

/// Whether `plural` under `namespaces/{ns}/` is a namespaced resource rather than a
/// subresource of a namespace (`namespaces/{name}/status`).
fn group_has_namespaces(registry: &Registry, group: &str, version: &str, plural: &str) -> bool {
    registry
        .find(group, version, plural)
        .is_some_and(|d| d.namespaced)
}

async fn dispatch(State(state): State<Arc<ServerState>>, request: Request<Body>) -> Response {
    let started = tokio::time::Instant::now();
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let (verb, resource, response) = match parse_path(&state.registry, &path) {
        Parsed::Discovery(body) if method == Method::GET => (
            "GET".to_owned(),
            String::new(),
            json_response(StatusCode::OK, &body, "application/json"),
        ),
        Parsed::Discovery(_) | Parsed::NotFound => (
            method.to_string(),
            String::new(),
            ApiError::no_route(&path).into_response(),
        ),
        Parsed::Resource(target) => {
            let resource = match &target.subresource {
                Some(sub) => format!("{}/{}", target.def.plural, sub),
                None => target.def.plural.to_owned(),
            };
            let (verb, response) = handlers::handle(&state, target, request).await;
            (verb, resource, response)
        }
    };
    let code = response.status().as_u16();
    if verb != "WATCH" {
        state
            .metrics
            .observe(&verb, &resource, code, started.elapsed().as_secs_f64());
    }
    tracing::debug!(%method, %path, code, "request");
    response
}

/// The current time as the API server stamps it (re-exported for callers building objects).
pub fn now() -> String {
    meta::now_rfc3339()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (plural, namespace, name, subresource)
    type Parts = (String, Option<String>, Option<String>, Option<String>);

    fn parse(path: &str) -> Option<Parts> {
        match parse_path(&Registry::standard(), path) {
            Parsed::Resource(t) => {
                Some((t.def.plural.to_owned(), t.namespace, t.name, t.subresource))
            }
            _ => None,
        }
    }

    #[test]
    fn paths_resolve_to_resources() {
        assert_eq!(
            parse("/api/v1/nodes"),
            Some(("nodes".into(), None, None, None))
        );
        assert_eq!(
            parse("/api/v1/nodes/n1/status"),
            Some((
                "nodes".into(),
                None,
                Some("n1".into()),
                Some("status".into())
            ))
        );
        assert_eq!(
            parse("/api/v1/namespaces/default/pods/p"),
            Some((
                "pods".into(),
                Some("default".into()),
                Some("p".into()),
                None
            ))
        );
        assert_eq!(
            parse("/api/v1/pods"),
            Some(("pods".into(), None, None, None))
        );
        // A namespace's own subresource is not a namespaced resource.
        assert_eq!(
            parse("/api/v1/namespaces/ns1/status"),
            Some((
                "namespaces".into(),
                None,
                Some("ns1".into()),
                Some("status".into())
            ))
        );
        assert_eq!(
            parse("/api/v1/namespaces/ns1"),
            Some(("namespaces".into(), None, Some("ns1".into()), None))
        );
        assert_eq!(
            parse("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1"),
            Some((
                "leases".into(),
                Some("kube-node-lease".into()),
                Some("n1".into()),
                None
            ))
        );
        // A namespaced resource by name without a namespace is not a path.
        assert_eq!(parse("/api/v1/pods/p"), None);
        assert_eq!(parse("/api/v1/widgets"), None);
        assert_eq!(parse("/apis/apps/v1/statefulsets"), None);
        assert_eq!(
            parse("/apis/apps/v1/deployments"),
            Some(("deployments".into(), None, None, None))
        );
    }
}
