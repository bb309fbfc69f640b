//! The HTTP API: kube-apiserver's REST surface over the [`store`](crate::store) and the
//! [`registry`](crate::registry) of resources.
//!
//! [`ApiServer::router`] is an axum `Router`. Serve it on a socket ([`crate::serve`]), or hand
//! it to kube 5's `Client::new(router, "default")` for an in-process API server with no TCP.

mod agent_tunnel;
pub mod discovery;
pub mod endpoint_reconciler;
mod handlers;
pub mod metrics;
mod metrics_api;
pub mod negotiate;
mod node_proxy;
mod pod_proxy;
mod port_forward;
pub mod protobuf;
mod scale;
pub mod status;
mod strict;
mod tokens;
mod type_meta;
mod watch;
mod websocket;
mod yaml;

use std::{net::IpAddr, ops::RangeInclusive, sync::Arc, time::Duration};

use axum::{
    Router,
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, Method, StatusCode, header},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use ccm_serving::healthz;
use ipnet::IpNet;
use serde_json::{Value, json};
use tracing::Instrument;

pub(crate) use crate::auth::authz::watch_requested;
pub use crate::storage::SYSTEM_NAMESPACES;
use crate::{
    auth::{
        GROUP_MASTERS, UserInfo,
        authz::{Attributes, Decision},
        chain::Authorizer,
        escalation::RbacEscalation,
        impersonation,
        node::NodeRestriction,
    },
    registry::{
        Registry, ResourceDef, allocator::ServiceAllocator, authorization, meta, resources,
    },
    storage::{
        ObjectKey, ObjectReader, Storage, WriteContext,
        admission::Admission,
        default_toleration_seconds::{DEFAULT_TOLERATION_SECONDS, DefaultTolerationSeconds},
        get_list::quarantine_unreadable,
        namespace::spawn_namespace_cleanup,
        observe::WriteObserver,
        service_account::ServiceAccountAdmission,
    },
    store::Store,
};
pub use core_cluster_machinery::health::HealthChecker;
pub use node_proxy::{
    DEFAULT_KUBELET_PORT, DEFAULT_PREFERRED_ADDRESS_TYPES, KUBELET_API_ADMIN_ROLE,
    KUBELET_CLIENT_USER, KubeletClientConfig, NodeEgress, kubelet_api_admin_binding,
};
use status::ApiError;
pub use watch::WatchLimits;

/// Settings of the API server.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// `--service-cluster-ip-range`: one CIDR, or one per family for dual stack.
    pub service_cluster_ip_ranges: Vec<IpNet>,
    /// `--service-node-port-range`.
    pub service_node_port_range: RangeInclusive<u16>,
    /// The largest request body accepted (kube-apiserver: 3 MiB).
    pub max_request_bytes: usize,
    /// The largest object stored, checked after every create, update and patch (etcd's
    /// 1.5 MiB request limit upstream); larger writes get 413.
    pub max_object_bytes: usize,
    /// How often a watch with `allowWatchBookmarks` gets a bookmark (upstream: about 1 min).
    pub bookmark_interval: Duration,
    /// The watch timeout when the client gives none (upstream: 30–60 min).
    pub default_watch_timeout: Duration,
    /// What watches may hold for clients that do not read.
    pub watch_limits: WatchLimits,
    /// How long a request that is not long-running may take before it is answered 504
    /// (kube-apiserver's `--request-timeout`, 60 s); watches, logs, exec, attach,
    /// port-forward and proxy are not bounded.
    pub request_timeout: Duration,
    /// How the server reaches kubelets for logs and the node proxy (`--kubelet-*`).
    pub kubelet: KubeletClientConfig,
    /// `--default-not-ready-toleration-seconds` (300): the `tolerationSeconds` of the
    /// `node.kubernetes.io/not-ready:NoExecute` toleration the DefaultTolerationSeconds
    /// admission plugin adds to pods.
    pub default_not_ready_toleration_seconds: i64,
    /// `--default-unreachable-toleration-seconds` (300): likewise for
    /// `node.kubernetes.io/unreachable:NoExecute`.
    pub default_unreachable_toleration_seconds: i64,
    /// Whether the ServiceAccount admission plugin runs (kube-apiserver's
    /// `--enable-admission-plugins=ServiceAccount`, on upstream by default): pods get the
    /// `default` service account and a projected token volume, and are refused when their
    /// account does not exist. Off by default here, since an API server without the
    /// serviceaccounts controller beside it (a bare in-process server) has no `default`
    /// accounts; the embedded cluster, which runs that controller, turns it on.
    pub service_account_admission: bool,
    /// How long a namespace another API server sharing the store started deleting must
    /// stay terminating before this server's store follower
    /// ([`ApiServer::spawn_store_follower`]) cleans it up itself: the server that took the
    /// deletion does it otherwise. 15 s, kube-controller-manager's Lease duration, after
    /// which a new leader's namespace controller would pick it up.
    pub namespace_takeover_after: Duration,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        ApiServerConfig {
            service_cluster_ip_ranges: vec!["10.96.0.0/12".parse().expect("valid CIDR")],
            service_node_port_range: 30000..=32767,
            max_request_bytes: 3 * 1024 * 1024,
            max_object_bytes: 3 * 512 * 1024,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
            watch_limits: WatchLimits::default(),
            request_timeout: Duration::from_secs(60),
            kubelet: KubeletClientConfig::default(),
            default_not_ready_toleration_seconds: DEFAULT_TOLERATION_SECONDS,
            default_unreachable_toleration_seconds: DEFAULT_TOLERATION_SECONDS,
            service_account_admission: false,
            namespace_takeover_after: Duration::from_secs(15),
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store failed while bootstrapping.
    #[error("bootstrapping the API server: {0}")]
    Bootstrap(#[from] ApiError),
    /// The `--kubelet-*` settings are unusable.
    #[error("{0}")]
    KubeletClient(String),
}

pub(crate) struct ServerState {
    /// The key-value store (reads, watches, health, compaction).
    pub(crate) store: Arc<dyn Store>,
    /// The generic object store over it: every write goes through it.
    pub(crate) storage: Arc<Storage>,
    pub(crate) registry: Registry,
    pub(crate) config: ApiServerConfig,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) openapi: crate::openapi::OpenApiDocuments,
    pub(crate) event_cache: watch::EventCache,
    /// Every open watch's backlog, and what they hold together.
    pub(crate) watchers: Arc<watch::Watchers>,
    /// Node, RBAC: decides every request.
    pub(crate) authorizer: Arc<Authorizer>,
    /// Checks of `/livez` added with [`ApiServer::add_livez_checks`].
    pub(crate) livez_checks: parking_lot::RwLock<Vec<Arc<dyn HealthChecker>>>,
    /// The client of kubelets (logs, node proxy).
    pub(crate) kubelet: node_proxy::KubeletClient,
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

impl ApiServer {
    /// A server over `store`: creates the system namespaces and the `kubernetes` Service if
    /// missing, and recovers the Service IP and port allocations from the stored Services.
    pub async fn new(store: Arc<dyn Store>, config: ApiServerConfig) -> Result<Self, StartError> {
        let allocator = ServiceAllocator::new(
            config.service_cluster_ip_ranges.clone(),
            config.service_node_port_range.clone(),
        );
        // The layers, bottom up: the store, reads of it, the authorizers built from them,
        // the admission chain, and the generic store that runs admission on every write and
        // tells the authorizers (RBAC index, Node graph) of every committed one.
        let reader = ObjectReader::new(store.clone());
        let authorizer = Arc::new(Authorizer::new(reader.clone()));
        // Upstream's order (`AllOrderedPlugins`): ServiceAccount, NodeRestriction, …,
        // DefaultTolerationSeconds.
        let mut admission: Vec<Arc<dyn Admission>> = Vec::new();
        if config.service_account_admission {
            admission.push(Arc::new(ServiceAccountAdmission::new(reader.clone())));
        }
        admission.push(Arc::new(NodeRestriction::new(reader.clone())));
        admission.push(Arc::new(RbacEscalation::new(authorizer.clone(), reader)));
        admission.push(Arc::new(
            crate::auth::certificates::CertificateAdmission::new(authorizer.clone()),
        ));
        admission.push(Arc::new(DefaultTolerationSeconds::new(
            config.default_not_ready_toleration_seconds,
            config.default_unreachable_toleration_seconds,
        )));
        let observers: Vec<Arc<dyn WriteObserver>> = vec![authorizer.clone()];
        let storage = Storage::new(
            store.clone(),
            allocator,
            config.max_object_bytes,
            admission,
            observers,
        );
        let kubelet =
            node_proxy::KubeletClient::new(&config.kubelet).map_err(StartError::KubeletClient)?;
        let metrics = metrics::Metrics::default();
        let watchers = Arc::new(watch::Watchers::new(config.watch_limits, &metrics));
        let state = Arc::new(ServerState {
            store,
            registry: storage.registry.clone(),
            storage,
            config,
            metrics,
            openapi: crate::openapi::OpenApiDocuments::new(&crate::openapi::served_resources()),
            event_cache: watch::EventCache::default(),
            watchers,
            authorizer,
            livez_checks: parking_lot::RwLock::default(),
            kubelet,
        });
        let server = ApiServer { state };
        server.bootstrap().await?;
        Ok(server)
    }

    async fn bootstrap(&self) -> Result<(), ApiError> {
        let storage = &self.state.storage;
        quarantine_unreadable(storage).await?;
        // The custom resources of the stored definitions are served from the start.
        crate::storage::crd::reconcile(storage).await;
        // Built after the quarantine, from what the server can read.
        self.state.authorizer.load().await?;
        let reader = storage.reader();
        let services = self.def("", "services");
        // The Service ranges in the store, created or repaired from the stored Services
        // before anything allocates (upstream runs the repair once before serving). Another
        // server writing a range meanwhile makes a pass fail: it is redone.
        let mut attempts = 0;
        let outcome = loop {
            match storage.ranges.repair(&reader, services).await {
                Ok(outcome) => break outcome,
                Err(e) => {
                    attempts += 1;
                    if attempts >= 10 {
                        return Err(e);
                    }
                    tracing::debug!(error = %e.message, "repairing the service ranges again");
                }
            }
        };
        let ctx = WriteContext::server();
        let namespaces = self.def("", "namespaces");
        for ns in SYSTEM_NAMESPACES {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            match handlers::create_object(&self.state, &ctx, namespaces, None, body).await {
                Ok(_) => {}
                Err(e) if e.reason == "AlreadyExists" => {}
                Err(e) => return Err(e),
            }
        }
        // Namespaces that were Terminating when the server stopped: their cleanup died with
        // the process. Upstream's namespace controller picks them up from its initial list.
        for ns in reader.list(namespaces, None).await? {
            if let Some(name) = ns["metadata"]["name"].as_str()
                && !ns["metadata"]["deletionTimestamp"].is_null()
            {
                tracing::info!(
                    namespace = name,
                    "resuming the finalization of a terminating namespace"
                );
                spawn_namespace_cleanup(storage, name.to_owned());
            }
        }
        let first_ip: Option<IpAddr> = storage.ranges.first_ip();
        if let Some(ip) = first_ip {
            let body = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kubernetes", "namespace": "default",
                             "labels": {"component": "apiserver", "provider": "kubernetes"}},
                "spec": {"clusterIP": ip.to_string(), "type": "ClusterIP",
                         "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]},
            });
            match handlers::create_object(&self.state, &ctx, services, Some("default"), body).await
            {
                Ok(_) => {}
                Err(e) if e.reason == "AlreadyExists" || e.reason == "Invalid" => {}
                Err(e) => return Err(e),
            }
        }
        crate::auth::bootstrap::reconcile(storage).await?;
        // Once the namespaces exist: the repair's findings as Events on their Services.
        crate::storage::repair_events::record(storage, services, &outcome).await;
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

    /// Follows the writes that other API servers sharing this server's store (etcd) make,
    /// from a watch of the store, as it follows its own: the RBAC index and the Node
    /// authorizer's graph (a Role written through another server is enforced here), the
    /// custom resource definitions (served, in discovery and OpenAPI, APIServices, from
    /// their establishment to their removal, as upstream's informer-driven
    /// `customresource_discovery_controller.go` in every server), and namespace deletions
    /// (taken over after [`ApiServerConfig::namespace_takeover_after`] if the server that
    /// took one has not finished it). Stops when `shutdown` is cancelled.
    pub fn spawn_store_follower(
        &self,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let observers = self
            .state
            .storage
            .followers(self.state.config.namespace_takeover_after);
        let store = self.state.store.clone();
        let registry = self.state.registry.clone();
        tokio::spawn(async move {
            crate::storage::observe::follow_store(store, observers, &registry.all(), shutdown)
                .await;
        })
    }

    /// Runs upstream's Service IP and port repair loops every `interval` (kube-apiserver:
    /// every 3 minutes, `pkg/registry/core/service/ipallocator/controller/repair.go` and
    /// `portallocator/controller/repair.go`): marks what Services hold and their ranges
    /// lack, and releases what no Service has held for three passes (left by a crash
    /// between an allocation and its Service's write, or a deletion and its release); what
    /// it finds wrong is recorded as Warning Events on the Services, as upstream's
    /// (`ClusterIPAlreadyAllocated`, `PortAlreadyAllocated`, …). Stops when `shutdown` is
    /// cancelled.
    pub fn spawn_service_repair(
        &self,
        interval: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let storage = self.state.storage.clone();
        let services = self.def("", "services");
        tokio::spawn(async move {
            let reader = storage.reader();
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = ticker.tick() => {}
                }
                match storage.ranges.repair(&reader, services).await {
                    Ok(outcome) => {
                        tracing::debug!(
                            missing = outcome.missing.len(),
                            released = outcome.released.len(),
                            "repaired the service ranges"
                        );
                        crate::storage::repair_events::record(&storage, services, &outcome).await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e.message, "the service range repair failed; it runs again next interval")
                    }
                }
            }
        })
    }

    /// Creates (or replaces) the objects of the kinds in `kinds` found in a multi-document
    /// YAML manifest, as the server itself: how an embedded cluster installs the RBAC of a
    /// deploy manifest (`deploy/ccm-daemonset.yaml`) without writing it twice. Returns how
    /// many objects it wrote; documents of other kinds are skipped.
    pub async fn apply_manifest(&self, yaml: &str, kinds: &[&str]) -> Result<usize, ApiError> {
        use serde::Deserialize;
        let mut written = 0;
        for document in serde_norway::Deserializer::from_str(yaml) {
            let obj = Value::deserialize(document)
                .map_err(|e| ApiError::bad_request(format!("the manifest is not YAML: {e}")))?;
            let kind = obj["kind"].as_str().unwrap_or("");
            if !kinds.contains(&kind) {
                continue;
            }
            let api_version = obj["apiVersion"].as_str().unwrap_or("");
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let def = self
                .state
                .registry
                .all()
                .iter()
                .copied()
                .find(|d| d.group == group && d.version == version && d.kind == kind)
                .ok_or_else(|| {
                    ApiError::bad_request(format!("{api_version} {kind} is not served"))
                })?;
            let ns = obj["metadata"]["namespace"].as_str().map(str::to_owned);
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let ctx = WriteContext::server();
            match handlers::create_object(&self.state, &ctx, def, ns.as_deref(), obj.clone()).await
            {
                Ok(_) => {}
                Err(e) if e.reason == "AlreadyExists" => {
                    let key = ObjectKey::new(def, ns.as_deref(), &name);
                    handlers::update_object(&self.state, &ctx, key, None, obj).await?;
                }
                Err(e) => return Err(e),
            }
            written += 1;
        }
        Ok(written)
    }

    /// Adds checks to `/livez` (upstream `AddLivezChecks`): a failing one makes `/livez`
    /// 500 with `[-]<name> failed`, so whatever watches the process restarts it.
    pub fn add_livez_checks(&self, checks: impl IntoIterator<Item = Arc<dyn HealthChecker>>) {
        self.state.livez_checks.write().extend(checks);
    }

    /// Adds a metric of the process to `/metrics`.
    pub fn register_metric(
        &self,
        name: &str,
        help: &str,
        metric: impl prometheus_client::registry::Metric,
    ) {
        self.state.metrics.register(name, help, metric);
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

    /// The node agents' tunnels: which nodes are connected, and the streams opened through
    /// them (used when [`KubeletClientConfig::egress`] is [`NodeEgress::AgentTunnel`]).
    pub fn agent_tunnels(&self) -> Arc<core_cluster_tunnel::Tunnels> {
        self.state.kubelet.tunnels().clone()
    }

    fn routes(&self) -> Router {
        Router::new()
            .route("/version", get(version))
            // go-restful serves its web services' root paths with a trailing slash too.
            .route("/version/", get(version))
            .route("/healthz", get(health))
            .route("/healthz/{check}", get(health))
            .route("/livez", get(health))
            .route("/livez/{check}", get(health))
            .route("/readyz", get(health))
            .route("/readyz/{check}", get(health))
            .route("/metrics", get(metrics_endpoint))
            .route("/api", get(api_root))
            .route("/api/", get(api_root))
            .route("/apis", get(apis_root))
            .route("/apis/", get(apis_group_list))
            .route("/openapi/v3", get(openapi_index))
            .route("/openapi/v3/{*path}", get(openapi_group_version))
            .route(core_cluster_tunnel::PATH, get(agent_tunnel))
            .fallback(dispatch)
            // Protobuf bodies are decoded after authorization, and only for paths that name
            // a served resource: anything else is answered (403, 404) whatever the body.
            .layer(middleware::from_fn_with_state(
                self.state.clone(),
                protobuf::decode,
            ))
            .layer(middleware::from_fn_with_state(
                self.state.clone(),
                authorize,
            ))
            // Outermost, so errors of authorization are encoded as the client asked too.
            .layer(middleware::from_fn_with_state(
                self.state.clone(),
                protobuf::codec,
            ))
            .layer(middleware::from_fn_with_state(
                self.state.clone(),
                yaml::codec,
            ))
            // Around everything, the codec's reading of the body included.
            .layer(middleware::from_fn_with_state(
                self.state.clone(),
                bound_request,
            ))
            .layer(middleware::from_fn(audit_id))
            .with_state(self.state.clone())
    }
}

/// The request's `Audit-ID` header, given by the client or a new UUID, echoed on every
/// response, errors of authentication and authorization included (upstream's
/// `WithAuditInit`, `k8s.io/apiserver/pkg/endpoints/filters/audit_init.go`); clients log it
/// to find the request in the server's audit log. A response that carries one already (from
/// whatever answered behind a proxy) keeps it.
async fn audit_id(request: Request, next: Next) -> Response {
    const AUDIT_ID: &str = "audit-id";
    let id = request
        .headers()
        .get(AUDIT_ID)
        .filter(|v| !v.is_empty())
        .cloned()
        .or_else(|| axum::http::HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()).ok());
    let mut response = next.run(request).await;
    if let Some(id) = id {
        response.headers_mut().entry(AUDIT_ID).or_insert(id);
    }
    response
}

/// The authorization step of every request, resource and non-resource URLs alike:
/// impersonation, then the authorizer chain (`system:masters`, Node, RBAC), a 403 with
/// upstream's message when nothing allows. The handler then runs as the effective user,
/// which it finds in the request's extensions and hands on to admission explicitly, in a
/// `request` span with the verb, path and user.
async fn authorize(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let requester = request
        .extensions()
        .get::<UserInfo>()
        .cloned()
        .unwrap_or_else(UserInfo::loopback);
    // One span per request, around its authorization and everything the handler does
    // (upstream's request log names the same: the verb of the request's attributes, the
    // path and the user, and the impersonated user if any).
    let verb = Attributes::from_request(UserInfo::default(), request.method(), request.uri()).verb;
    let span = tracing::info_span!(
        "request",
        verb = %verb,
        path = %request.uri().path(),
        user = %requester.name,
        impersonated = tracing::field::Empty,
    );
    authorized(state, requester, request, next)
        .instrument(span)
        .await
}

/// [`authorize`] in the request's span.
async fn authorized(
    state: Arc<ServerState>,
    requester: UserInfo,
    mut request: Request,
    next: Next,
) -> Response {
    let user = if requester.in_group(GROUP_MASTERS) && !impersonation::requested(request.headers())
    {
        // The fast path: the superuser group is allowed everything.
        requester
    } else {
        let (method, uri, headers) = (request.method(), request.uri(), request.headers());
        let requester_name = requester.name.clone();
        match authorize_as(&state, requester, method, uri, headers).await {
            Ok(user) => {
                if user.name != requester_name {
                    tracing::Span::current().record("impersonated", user.name.as_str());
                }
                user
            }
            Err(e) => return e.into_response(),
        }
    };
    request.extensions_mut().insert(user);
    next.run(request).await
}

/// The bounds of every request, before anything reads its body:
///
/// - A `Content-Length` above [`ApiServerConfig::max_request_bytes`] is answered 413 at once,
///   with the message of `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go
///   limitedReadBody`, instead of reading that much first. Bodies without a length are cut
///   at the limit by the readers.
/// - A request that is not long-running ([`long_running`]) is answered 504 after
///   [`ApiServerConfig::request_timeout`], as `staging/src/k8s.io/apiserver/pkg/server/
///   filters/timeout.go WithTimeoutForNonLongRunningRequests` does; a body trickled in is
///   cut by it too. The work in progress is dropped, as when the client goes away. An
///   answer still being sent at the deadline is cut (the HTTP/2 stream reset, the HTTP/1
///   connection closed), as upstream aborts its handler then.
async fn bound_request(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let limit = state.config.max_request_bytes;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return ApiError::too_large(limit).into_response();
    }
    if long_running(request.method(), request.uri()) {
        return next.run(request).await;
    }
    let mut deadline = Box::pin(tokio::time::sleep(state.config.request_timeout));
    tokio::select! {
        response = next.run(request) => response.map(|body| {
            Body::new(UntilDeadline::new(body, deadline))
        }),
        () = deadline.as_mut() => request_timed_out().into_response(),
    }
}

/// An answer's body that ends in an error if it is still being sent at the request's
/// deadline. Large frames are handed on in pieces of [`DEADLINE_PIECE`] bytes, so that an
/// answer the client reads slowly is still in this body, not in the connection's buffers,
/// when the deadline comes.
struct UntilDeadline {
    body: Body,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
    rest: bytes::Bytes,
}

const DEADLINE_PIECE: usize = 64 * 1024;

impl UntilDeadline {
    fn new(body: Body, deadline: std::pin::Pin<Box<tokio::time::Sleep>>) -> Self {
        UntilDeadline {
            body,
            deadline,
            rest: bytes::Bytes::new(),
        }
    }

    fn piece(&mut self, mut data: bytes::Bytes) -> hyper::body::Frame<bytes::Bytes> {
        if data.len() > DEADLINE_PIECE {
            self.rest = data.split_off(DEADLINE_PIECE);
        }
        hyper::body::Frame::data(data)
    }
}

impl hyper::body::Body for UntilDeadline {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, axum::Error>>> {
        use std::{future::Future, task::Poll};
        let timed_out = || {
            Poll::Ready(Some(Err(axum::Error::new(
                "the request timed out while its answer was sent",
            ))))
        };
        if !self.rest.is_empty() {
            if self.deadline.as_mut().poll(cx).is_ready() {
                return timed_out();
            }
            let rest = std::mem::take(&mut self.rest);
            return Poll::Ready(Some(Ok(self.piece(rest))));
        }
        match std::pin::Pin::new(&mut self.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_data() {
                Ok(data) => self.piece(data),
                Err(frame) => frame,
            }))),
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending if self.deadline.as_mut().poll(cx).is_ready() => timed_out(),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        let inner = self.body.size_hint();
        let rest = self.rest.len() as u64;
        let mut hint = hyper::body::SizeHint::new();
        hint.set_lower(inner.lower() + rest);
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

/// The subresources upstream's `BasicLongRunningRequestCheck` exempts from the request
/// timeout (kube-apiserver's `genericapiserver.DefaultLongRunningFunc`).
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "proxy", "log", "portforward"];

/// Upstream's `BasicLongRunningRequestCheck(watch, proxy; attach, exec, proxy, log,
/// portforward)` over the request's attributes as the authorizer reads them, so a request is
/// a watch here exactly when it is authorized as one (`watch` read as [`query_bool`], or the
/// `/watch/` path prefix).
fn long_running(method: &Method, uri: &axum::http::Uri) -> bool {
    if uri.path() == core_cluster_tunnel::PATH {
        // An agent's tunnel lasts as long as the node is connected.
        return true;
    }
    let attrs = Attributes::from_request(UserInfo::default(), method, uri);
    attrs.resource_request
        && (attrs.verb == "watch"
            // The deprecated `/api/v1/proxy/...` paths: upstream's `proxy` verb.
            || attrs.resource == "proxy"
            || LONG_RUNNING_SUBRESOURCES.contains(&attrs.subresource.as_str()))
}

/// The 504 of `WithTimeoutForNonLongRunningRequests`: `apierrors.NewTimeoutError("request
/// did not complete within the allotted timeout", 0)`.
fn request_timed_out() -> ApiError {
    ApiError {
        code: 504,
        reason: "Timeout",
        message: "Timeout: request did not complete within the allotted timeout".to_owned(),
        details: Some(json!({})),
    }
}

/// Impersonation and the authorizer chain: the effective user, or the 403.
async fn authorize_as(
    state: &ServerState,
    requester: UserInfo,
    method: &Method,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
) -> Result<UserInfo, ApiError> {
    let user = impersonation::impersonate(&state.authorizer, requester, headers).await?;
    let attrs = Attributes::from_request(user, method, uri);
    match state.authorizer.authorize(&attrs).await {
        Decision::Allow => Ok(attrs.user),
        Decision::Deny(reason) | Decision::NoOpinion(reason) => {
            tracing::debug!(user = %attrs.user.name, verb = %attrs.verb, path = %attrs.path, "forbidden");
            Err(crate::auth::authz::forbidden(&attrs, &reason))
        }
    }
}

/// An answer in JSON, or in protobuf when the client asked for it first (see [`protobuf`]).
/// A response whose whole body is in memory already (its length known), taken apart to be
/// written again in another form; a stream (a watch, a proxied body) comes back untouched in
/// `Err`, as does a failure to read, answered 500.
async fn buffered(
    response: Response,
) -> Result<(axum::http::response::Parts, axum::body::Bytes), Response> {
    use axum::body::HttpBody;
    let Some(len) = response
        .body()
        .size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok())
    else {
        return Err(response);
    };
    let (parts, body) = response.into_parts();
    match axum::body::to_bytes(body, len).await {
        Ok(bytes) => Ok((parts, bytes)),
        Err(_) => Err(ApiError::internal("reading the response failed").into_response()),
    }
}

fn json_response(code: StatusCode, value: &Value, content_type: &'static str) -> Response {
    if content_type == "application/json"
        && let Some(response) = protobuf::encode_answer(code, value)
    {
        return response;
    }
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A node agent's tunnel (see [`agent_tunnel`]).
async fn agent_tunnel(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    agent_tunnel::accept(&state, request).await
}

async fn version(State(state): State<Arc<ServerState>>) -> Response {
    let started = tokio::time::Instant::now();
    let r = json_response(StatusCode::OK, &discovery::version(), "application/json");
    state
        .metrics
        .observe("GET", "", 200, started.elapsed().as_secs_f64());
    r
}

/// The checks each health endpoint runs, by kube-apiserver's names. `etcd` (and, for
/// readiness, `etcd-readiness`) is the store's own [`Store::health`]: it fails when the
/// store cannot commit writes (a durable store whose writer stopped after a failed commit)
/// or cannot be read.
fn health_checks(endpoint: &str) -> &'static [&'static str] {
    match endpoint {
        "readyz" => &["ping", "etcd", "etcd-readiness"],
        _ => &["ping", "etcd"],
    }
}

/// How long the store's health check may take before it counts as failed (kube-apiserver
/// gives etcd's 2 s).
const STORE_HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// `/healthz`, `/livez`, `/readyz` and their per-check paths (`/livez/etcd`), in
/// kube-apiserver's format: `ok`, or with `?verbose` one `[+]check ok` line per check and
/// `<endpoint> check passed`; any failed check makes it 500 with `[-]check failed: reason
/// withheld` (the reason is logged, and shown by the per-check path). `?exclude=check`
/// skips a check. The bodies are [`ccm_serving::healthz`]'s.
async fn health(State(state): State<Arc<ServerState>>, request: Request) -> Response {
    let mut segments = request.uri().path().trim_matches('/').split('/');
    let endpoint = segments.next().unwrap_or("healthz");
    let single = segments.next();
    let added: Vec<Arc<dyn HealthChecker>> = if endpoint == "livez" {
        state.livez_checks.read().clone()
    } else {
        Vec::new()
    };
    let checks: Vec<&str> = health_checks(endpoint)
        .iter()
        .copied()
        .chain(added.iter().map(|c| c.name()))
        .collect();
    let query = healthz::HealthQuery::parse(request.uri().query());

    let is_store = |check: &str| check != "ping" && health_checks(endpoint).contains(&check);
    let wants_store = match single {
        Some(check) => is_store(check),
        None => checks.iter().any(|c| is_store(c) && !query.is_excluded(c)),
    };
    let store = if wants_store {
        match tokio::time::timeout(STORE_HEALTH_TIMEOUT, state.store.health()).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(_) => Err(format!(
                "the store did not answer within {STORE_HEALTH_TIMEOUT:?}"
            )),
        }
    } else {
        Ok(())
    };
    let outcome = |check: &str| match added.iter().find(|c| c.name() == check) {
        Some(c) => c.check(),
        None if check == "ping" => Ok(()),
        None => store.clone(),
    };

    if let Some(check) = single {
        let result = checks.contains(&check).then(|| outcome(check));
        if let Some(Err(e)) = &result {
            tracing::warn!(endpoint, check, error = %e, "health check failed");
        }
        return healthz::single(result).into_response();
    }
    healthz::aggregate(endpoint, &query, checks.iter().copied(), outcome).into_response()
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

/// The custom resources served now, whose OpenAPI documents follow their definitions.
fn custom_resources(state: &ServerState) -> Vec<&'static ResourceDef> {
    let builtin = state.registry.builtin().len();
    state.registry.all().split_off(builtin)
}

async fn openapi_index(State(state): State<Arc<ServerState>>) -> Response {
    let index = state.openapi.index_with_custom(&custom_resources(&state));
    let mut r = (StatusCode::OK, index).into_response();
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
    match state
        .openapi
        .group_version_with_custom(&custom_resources(&state), &path)
    {
        Some(doc) => {
            let mut r = (StatusCode::OK, doc).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        // kube-openapi's v3 handler answers an unknown group version with a bare 404.
        None => StatusCode::NOT_FOUND.into_response(),
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
        let mut body = discovery::aggregated(&state.registry, false);
        metrics_api::add_to_aggregated(&mut body);
        json_response(
            StatusCode::OK,
            &body,
            negotiate::AGGREGATED_DISCOVERY_CONTENT_TYPE,
        )
    } else {
        apis_group_list(State(state)).await
    }
}

/// `/apis/`: the `APIGroupList`, whatever the Accept header asks. kube-apiserver's director
/// hands `/apis` and `/apis/` alike to the legacy group list (`k8s.io/apiserver/pkg/server/
/// handler.go`, `director.ServeHTTP`), and wraps only `/apis` in aggregated discovery, so
/// `/apis/` never answers an `APIGroupDiscoveryList`.
async fn apis_group_list(State(state): State<Arc<ServerState>>) -> Response {
    let mut body = discovery::group_list(&state.registry);
    metrics_api::add_to_group_list(&mut body);
    json_response(StatusCode::OK, &body, "application/json")
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

/// A path nothing serves. Inside a served group (`/api/v1/...`, `/apis/apps/v9`)
/// kube-apiserver answers a `Status` (its API installer's not-found handler); anywhere else
/// its mux answers go's plain `404 page not found`.
fn not_found(registry: &Registry, path: &str) -> Response {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let in_group_version = match segments.as_slice() {
        ["api", "v1", ..] => true,
        // Under a served group, any version: the group's own handler answers.
        ["apis", group, _, ..] => registry.group_versions().iter().any(|(g, _)| g == group),
        _ => false,
    };
    if in_group_version {
        return ApiError::no_route(path).into_response();
    }
    let mut response = (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn dispatch(State(state): State<Arc<ServerState>>, request: Request<Body>) -> Response {
    let started = tokio::time::Instant::now();
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if let Some((node, tail)) = node_proxy::node_proxy_path(&path) {
        let response = node_proxy::node_proxy(&state, node, tail, request).await;
        tracing::debug!(%method, %path, code = response.status().as_u16(), "request");
        return response;
    }
    if let Some(target) = pod_proxy::proxy_path(&path) {
        let response = pod_proxy::proxy(&state, target, request).await;
        tracing::debug!(%method, %path, code = response.status().as_u16(), "request");
        return response;
    }
    if metrics_api::serves(&path) {
        let response = metrics_api::serve(&state, request).await;
        tracing::debug!(%method, %path, code = response.status().as_u16(), "request");
        return response;
    }
    let (verb, resource, response) = match parse_path(&state.registry, &path) {
        Parsed::Discovery(body) if method == Method::GET => (
            "GET".to_owned(),
            String::new(),
            json_response(StatusCode::OK, &body, "application/json"),
        ),
        Parsed::Discovery(_) | Parsed::NotFound => (
            method.to_string(),
            String::new(),
            not_found(&state.registry, &path),
        ),
        Parsed::Resource(target)
            if target.def.group == authorization::AUTHORIZATION_GROUP
                || std::ptr::eq(target.def, &resources::SELF_SUBJECT_REVIEWS) =>
        {
            let resource = target.def.plural.to_owned();
            let (verb, response) = review(&state, target, request).await;
            (verb, resource, response)
        }
        Parsed::Resource(target)
            if std::ptr::eq(target.def, &resources::PODS)
                && target.subresource.as_deref() == Some("log") =>
        {
            let response = node_proxy::pod_log(&state, &target, request).await;
            ("CONNECT".to_owned(), "pods".to_owned(), response)
        }
        Parsed::Resource(target)
            if std::ptr::eq(target.def, &resources::PODS)
                && target.subresource.as_deref() == Some("exec") =>
        {
            let response = node_proxy::pod_exec(&state, &target, request).await;
            ("CONNECT".to_owned(), "pods".to_owned(), response)
        }
        Parsed::Resource(target)
            if std::ptr::eq(target.def, &resources::PODS)
                && target.subresource.as_deref() == Some("attach") =>
        {
            let response = node_proxy::pod_attach(&state, &target, request).await;
            ("CONNECT".to_owned(), "pods".to_owned(), response)
        }
        Parsed::Resource(target)
            if std::ptr::eq(target.def, &resources::PODS)
                && target.subresource.as_deref() == Some("portforward") =>
        {
            let response = port_forward::pod_port_forward(&state, &target, request).await;
            ("CONNECT".to_owned(), "pods".to_owned(), response)
        }
        Parsed::Resource(target) => {
            let resource = handlers::metric_resource(&target);
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

/// An access review or a SelfSubjectReview: POST only, answered and not stored. As upstream
/// installs a POST route alone for them, any other method is a 405 and a path with a name a
/// 404. Their storage has no table convertor: an Accept header that takes only a Table is a
/// 406 before the body is read ([`negotiate::representation`]).
async fn review(state: &ServerState, target: Target, request: Request<Body>) -> (String, Response) {
    let verb = request.method().to_string();
    if target.name.is_some() {
        let path = request.uri().path().to_owned();
        return (verb, ApiError::no_route(&path).into_response());
    }
    if request.method() != Method::POST {
        return (verb, ApiError::method_not_served().into_response());
    }
    let repr = match negotiate::representation(request.headers(), false) {
        Ok(repr) => repr,
        Err(e) => return (verb, e.into_response()),
    };
    let user = request
        .extensions()
        .get::<UserInfo>()
        .cloned()
        .unwrap_or_else(UserInfo::loopback);
    let body = match axum::body::to_bytes(request.into_body(), state.config.max_request_bytes).await
    {
        Ok(b) => b,
        Err(_) => {
            return (
                verb,
                ApiError::too_large(state.config.max_request_bytes).into_response(),
            );
        }
    };
    let parsed: Result<Value, ApiError> = serde_json::from_slice(&body)
        .map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })
        .and_then(|mut body| {
            let def = target.def;
            type_meta::default_from_path(&mut body, &def.api_version(), def.kind)?;
            Ok(body)
        });
    let result = match parsed {
        Ok(body) => {
            let ns = target.namespace.as_deref();
            crate::auth::review::create(&state.authorizer, target.def, ns, &user, body).await
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(obj) => (verb, created(&obj, repr)),
        Err(e) => (verb, e.into_response()),
    }
}

/// The 201 of an object that is answered and not stored (a review, a TokenRequest), in the
/// negotiated representation: the object, or its `PartialObjectMetadata` (a Table was
/// refused by the negotiation).
pub(crate) fn created(obj: &Value, repr: negotiate::Representation) -> Response {
    match repr {
        negotiate::Representation::PartialMetadata => json_response(
            StatusCode::CREATED,
            &crate::registry::table::partial_metadata(obj),
            negotiate::PARTIAL_CONTENT_TYPE,
        ),
        _ => json_response(StatusCode::CREATED, obj, "application/json"),
    }
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

    /// `staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go
    /// BasicLongRunningRequestCheck` with kube-apiserver's verbs (watch, proxy) and
    /// subresources (attach, exec, proxy, log, portforward); `watch` is read as
    /// `Convert_Slice_string_To_bool` reads it.
    #[test]
    fn long_running_requests_are_those_of_upstreams_check() {
        let check = |method: Method, uri: &str| long_running(&method, &uri.parse().unwrap());
        for uri in [
            "/api/v1/pods?watch=true",
            "/api/v1/pods?watch=1",
            "/api/v1/pods?watch=True",
            "/api/v1/pods?watch=yes",
            "/api/v1/watch/namespaces/default/pods",
            "/apis/apps/v1/namespaces/default/deployments?watch=true&resourceVersion=1",
            "/api/v1/namespaces/default/pods/p/log",
            "/api/v1/namespaces/default/pods/p/exec?command=sh",
            "/api/v1/namespaces/default/pods/p/attach",
            "/api/v1/namespaces/default/pods/p/portforward",
            "/api/v1/namespaces/default/services/s/proxy",
            "/api/v1/nodes/n1/proxy",
        ] {
            assert!(check(Method::GET, uri), "{uri} is long-running");
        }
        for uri in [
            "/api/v1/pods",
            "/api/v1/pods?watch=false",
            "/api/v1/pods?watch=0",
            "/api/v1/pods?watch=False",
            "/api/v1/namespaces/default/pods/p",
            "/api/v1/namespaces/default/pods/p/status",
            "/healthz",
            "/version",
            "/api",
            "/logs",
        ] {
            assert!(!check(Method::GET, uri), "{uri} is bounded");
        }
        assert!(!check(Method::POST, "/api/v1/namespaces/default/pods"));
        assert!(!check(
            Method::PUT,
            "/api/v1/namespaces/default/configmaps/c?watch=true"
        ));
    }

    /// `WithTimeoutForNonLongRunningRequests` once the handler began its answer: the answer
    /// is handed on in pieces, its exact size kept, and what is left at the deadline is cut.
    #[tokio::test(start_paused = true)]
    async fn answers_are_handed_on_in_pieces_until_the_deadline() {
        use http_body_util::BodyExt;
        use hyper::body::Body as _;
        let data = bytes::Bytes::from(vec![7u8; 3 * DEADLINE_PIECE + 10]);
        let deadline = Box::pin(tokio::time::sleep(Duration::from_secs(60)));
        let mut body = UntilDeadline::new(Body::from(data.clone()), deadline);
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        for sent in 1..=2 {
            let piece = body.frame().await.unwrap().unwrap().into_data().unwrap();
            assert_eq!(
                piece,
                data.slice((sent - 1) * DEADLINE_PIECE..sent * DEADLINE_PIECE)
            );
            let left = data.len() - sent * DEADLINE_PIECE;
            assert_eq!(body.size_hint().exact(), Some(left as u64));
            assert!(!body.is_end_stream());
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(body.frame().await.unwrap().is_err());
    }

    /// A span's name and its fields, as text.
    type RecordedSpan = (String, Vec<(String, String)>);

    /// Records the name and fields of every span created.
    #[derive(Default)]
    struct SpanRecorder(parking_lot::Mutex<Vec<RecordedSpan>>);

    struct Fields<'a>(&'a mut Vec<(String, String)>);

    impl tracing::field::Visit for Fields<'_> {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push((field.name().to_owned(), format!("{value:?}")));
        }
    }

    impl tracing::Subscriber for SpanRecorder {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut fields = Vec::new();
            span.record(&mut Fields(&mut fields));
            let mut spans = self.0.lock();
            spans.push((span.metadata().name().to_owned(), fields));
            tracing::span::Id::from_u64(spans.len() as u64)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// Upstream's request log (`endpoints/filters` `WithHTTPLogging`) names each request's
    /// verb, path and user: here one `request` span per request carries them.
    #[tokio::test]
    async fn each_request_runs_in_one_span_with_its_verb_path_and_user() {
        use tower::ServiceExt;
        let recorder = Arc::new(SpanRecorder::default());
        let _default = tracing::subscriber::set_default(recorder.clone());
        let store: Arc<dyn Store> = Arc::new(crate::store::MemoryStore::new());
        let server = ApiServer::new(store, ApiServerConfig::default())
            .await
            .unwrap();
        let alice = server.router_as(UserInfo::new("alice", ["dev"]));
        let request = Request::builder()
            .uri("/api/v1/namespaces/default/configmaps")
            .body(Body::empty())
            .unwrap();
        let response = alice.oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let spans = recorder.0.lock().clone();
        let requests: Vec<_> = spans.iter().filter(|(name, _)| name == "request").collect();
        assert_eq!(requests.len(), 1, "{spans:?}");
        let field = |key: &str| {
            requests[0]
                .1
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(field("verb"), Some("list"));
        assert_eq!(field("path"), Some("/api/v1/namespaces/default/configmaps"));
        assert_eq!(field("user"), Some("alice"));
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
