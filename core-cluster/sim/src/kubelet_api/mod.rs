//! The simulated kubelet's HTTPS API, one server per node, as kubelet's
//! `pkg/kubelet/server/server.go` serves it on `--port` (10250): `/healthz`, `/pods` and
//! `/containerLogs/{namespace}/{pod}/{container}` over what the simulated pods write
//! ([`logs`]).
//!
//! Each node listens on its own IP (a loopback address when the simulator picks the IPs,
//! see [`KubeletApiConfig`]) and advertises the port in its Node's
//! `status.daemonEndpoints.kubeletEndpoint.Port`, as kubelet's `setNodeStatus` does. The
//! serving certificate is issued by [`KubeletApiConfig::serving_ca`] when given, else
//! self-signed per node (kubelet without `serverTLSBootstrap` generates one in `--cert-dir`
//! the same way: a CA and a leaf for the node's name and IPs); a node with
//! `serverTLSBootstrap` asks for it by CertificateSigningRequest ([`bootstrap`]).

mod auth;
mod bootstrap;
mod configz;
mod exec;
mod logs;
mod port_forward;
pub(crate) mod responder;
mod run;
mod spdy;
mod stats;
mod websocket;

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use axum::{
    Router,
    body::Body,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::{any, get},
};
use ccm_serving::{HandshakeLimit, Timeouts};
use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use parking_lot::RwLock;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use exec::Container;

pub use auth::{KubeletAuthConfig, KubeletAuthorizationMode};
pub use logs::{DEFAULT_LOG_INTERVAL, LOG_INTERVAL_ANNOTATION, LOG_TEMPLATE_ANNOTATION};
pub use stats::{CPU_USAGE_ANNOTATION, MEMORY_USAGE_ANNOTATION};

use self::logs::{ContainerLog, LogOptions};
use super::{NodeState, Shared};

/// kubelet's default `--port`.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;
/// The most TLS handshakes one simulated kubelet runs at once.
const MAX_HANDSHAKES: usize = 64;

/// Settings of the simulated kubelets' HTTPS API (the module's documentation says what each path does).
#[derive(Debug, Clone, Default)]
pub struct KubeletApiConfig {
    /// The port every node listens on; 0 (the default): a free port per node, so that
    /// simulators sharing one machine never collide. kubelet's own default is
    /// [`DEFAULT_KUBELET_PORT`].
    pub port: u16,
    /// The CA that issues every node's serving certificate (for the node's name and IP, as
    /// the `kubernetes.io/kubelet-serving` signer issues them); `None`: each node signs
    /// its own, as kubelet does without `serverTLSBootstrap`.
    pub serving_ca: Option<ServingCa>,
    /// Who may use the API: client certificates, bearer tokens by TokenReview, each
    /// request authorized by SubjectAccessReview (see [`KubeletAuthConfig`]).
    pub auth: KubeletAuthConfig,
}

/// A CA certificate and its key, in PEM.
#[derive(Clone)]
pub struct ServingCa {
    /// The CA certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl ServingCa {
    /// A new CA named `name` (ECDSA P-256, ten years), to issue the kubelets' serving
    /// certificates and to be given to the API server as `--kubelet-certificate-authority`.
    pub fn generate(name: &str) -> Result<Self, String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let now = time::OffsetDateTime::now_utc();
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        (params.not_before, params.not_after) = (
            now - time::Duration::hours(1),
            now + time::Duration::days(3650),
        );
        let key = KeyPair::generate().map_err(|e| format!("CA key: {e}"))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("CA certificate: {e}"))?;
        Ok(ServingCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl std::fmt::Debug for ServingCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCa").finish_non_exhaustive()
    }
}

/// The kubelet API of every node: the settings and the endpoint each node listens on.
#[derive(Debug, Default)]
pub(crate) struct KubeletApi {
    config: std::sync::OnceLock<KubeletApiConfig>,
    endpoints: RwLock<HashMap<String, SocketAddr>>,
    /// Each node's authenticator and authorizer.
    auths: RwLock<HashMap<String, Arc<auth::KubeletAuth>>>,
    /// Log streams open now, all nodes together.
    open_log_streams: Arc<std::sync::atomic::AtomicUsize>,
}

impl KubeletApi {
    /// Turns the API on (once).
    pub(crate) fn enable(&self, config: KubeletApiConfig) -> bool {
        self.config.set(config).is_ok()
    }

    /// Whether nodes serve the API.
    pub(crate) fn enabled(&self) -> bool {
        self.config.get().is_some()
    }

    /// Log streams open now.
    pub(crate) fn open_log_streams(&self) -> usize {
        self.open_log_streams
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The TokenReviews and SubjectAccessReviews `node`'s kubelet has sent.
    pub(crate) fn reviews(&self, node: &str) -> Option<u64> {
        self.auths.read().get(node).map(|a| a.reviews())
    }

    /// Where `node`'s kubelet API listens, once it does.
    pub(crate) fn endpoint(&self, node: &str) -> Option<SocketAddr> {
        self.endpoints.read().get(node).copied()
    }
}

/// Why a node's kubelet API could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeletApiError {
    #[error("listening on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving certificate: {0}")]
    Certificate(String),
}

/// Starts `node`'s kubelet API (when enabled and not yet started); its port, or `None`
/// when the API is off. The server stops with `shutdown`.
pub(crate) async fn start(
    shared: &Arc<Shared>,
    node: &Arc<NodeState>,
    shutdown: &CancellationToken,
) -> Result<Option<u16>, KubeletApiError> {
    let Some(config) = shared.kubelet_api.config.get() else {
        return Ok(None);
    };
    if let Some(addr) = shared.kubelet_api.endpoint(&node.name) {
        return Ok(Some(addr.port()));
    }
    let addr = SocketAddr::new(node.ip, config.port);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| KubeletApiError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| KubeletApiError::Bind { addr, source })?;
    let tls = if node.config.server_tls_bootstrap {
        // The certificate comes from a CertificateSigningRequest; until it is signed every
        // handshake fails.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cert = Arc::new(bootstrap::BootstrapCert::new(provider.clone()));
        tokio::spawn(bootstrap::bootstrap(
            shared.client_for(&node.name),
            node.name.clone(),
            node.ip,
            cert.clone(),
            shutdown.clone(),
        ));
        tls_config(provider, config.auth.client_ca.as_deref(), |b| {
            Ok(b.with_cert_resolver(cert))
        })?
    } else {
        serving_config(
            &node.name,
            node.ip,
            config.serving_ca.as_ref(),
            config.auth.client_ca.as_deref(),
        )?
    };
    let auth = Arc::new(auth::KubeletAuth::new(
        config.auth.clone(),
        node.name.clone(),
        shared.client_for(&node.name),
    ));
    shared
        .kubelet_api
        .auths
        .write()
        .insert(node.name.clone(), auth.clone());
    let router = router(NodeCtx {
        shared: shared.clone(),
        node: node.clone(),
        auth,
        started: shared.clock.now(),
    });
    tokio::spawn(ccm_serving::serve(
        router,
        listener,
        tls,
        HandshakeLimit::new(MAX_HANDSHAKES),
        Timeouts::default(),
        shutdown.clone(),
    ));
    shared
        .kubelet_api
        .endpoints
        .write()
        .insert(node.name.clone(), local);
    tracing::debug!(node = %node.name, %local, "kubelet API listening");
    Ok(Some(local.port()))
}

/// The `daemonEndpoints` of a node status, when its API listens.
pub(crate) fn daemon_endpoints(shared: &Shared, node: &str) -> Option<serde_json::Value> {
    shared
        .kubelet_api
        .endpoint(node)
        .map(|a| json!({"kubeletEndpoint": {"Port": a.port()}}))
}

/// Posts the node's `daemonEndpoints` (a re-registered node may show an old port).
pub(crate) async fn advertise(shared: &Shared, node: &str) {
    let Some(endpoints) = daemon_endpoints(shared, node) else {
        return;
    };
    let api: Api<Node> = Api::all(shared.client_for(node));
    let patch = json!({"status": {"daemonEndpoints": endpoints}});
    if let Err(e) = api
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(node, error = %e, "advertising the kubelet endpoint failed");
    }
}

/// A serving certificate for the node's name and IP issued by `ca`: the leaf, then the CA.
fn issued_by(ca: &ServingCa, name: &str, ip: IpAddr) -> Result<ccm_serving::CertKey, String> {
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
        KeyUsagePurpose, SanType,
    };
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|e| format!("CA key: {e}"))?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key)
        .map_err(|e| format!("CA certificate: {e}"))?;
    let now = time::OffsetDateTime::now_utc();
    let mut leaf = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    // kubelet-serving certificates name `system:node:<name>` in group `system:nodes`.
    dn.push(DnType::CommonName, format!("system:node:{name}"));
    dn.push(DnType::OrganizationName, "system:nodes");
    leaf.distinguished_name = dn;
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    (leaf.not_before, leaf.not_after) = (
        now - time::Duration::hours(1),
        now + time::Duration::days(365),
    );
    let dns = name
        .to_owned()
        .try_into()
        .map_err(|e| format!("node name {name:?}: {e}"))?;
    leaf.subject_alt_names = vec![SanType::DnsName(dns), SanType::IpAddress(ip)];
    let key = KeyPair::generate().map_err(|e| format!("serving key: {e}"))?;
    let cert = leaf
        .signed_by(&key, &issuer)
        .map_err(|e| format!("serving certificate: {e}"))?;
    Ok(ccm_serving::CertKey {
        cert_pem: format!("{}{}", cert.pem(), ca.cert_pem),
        key_pem: key.serialize_pem(),
    })
}

fn serving_config(
    name: &str,
    ip: IpAddr,
    ca: Option<&ServingCa>,
    client_ca: Option<&str>,
) -> Result<Arc<rustls::ServerConfig>, KubeletApiError> {
    let cert = match ca {
        Some(ca) => issued_by(ca, name, ip).map_err(KubeletApiError::Certificate)?,
        None => ccm_serving::self_signed(name, &[ip], &[name])
            .map_err(|e| KubeletApiError::Certificate(e.to_string()))?,
    };
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| KubeletApiError::Certificate(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())
        .map_err(|e| KubeletApiError::Certificate(e.to_string()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    tls_config(provider, client_ca, |b| b.with_single_cert(chain, key))
}

/// The kubelet API's TLS settings: client certificates verified against `client_ca` when
/// given, the serving certificate from `cert`, HTTP/2 and HTTP/1.1.
fn tls_config(
    provider: Arc<rustls::crypto::CryptoProvider>,
    client_ca: Option<&str>,
    cert: impl FnOnce(
        rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>,
    ) -> Result<rustls::ServerConfig, rustls::Error>,
) -> Result<Arc<rustls::ServerConfig>, KubeletApiError> {
    let verifier =
        auth::client_verifier(client_ca, provider.clone()).map_err(KubeletApiError::Certificate)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeletApiError::Certificate(e.to_string()))?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = cert(builder).map_err(|e| KubeletApiError::Certificate(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[derive(Clone)]
struct NodeCtx {
    shared: Arc<Shared>,
    node: Arc<NodeState>,
    auth: Arc<auth::KubeletAuth>,
    /// When this kubelet started serving (the node's `startTime` in its stats).
    started: jiff::Timestamp,
}

fn router(ctx: NodeCtx) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/configz", get(configz_handler))
        .route(
            "/run/{namespace}/{pod}/{container}",
            axum::routing::post(run::run_handler),
        )
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(resource_metrics))
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(exec_handler).post(exec_handler),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach_handler).post(attach_handler),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            any(port_forward::port_forward),
        )
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            any(port_forward::port_forward),
        )
        .route(
            "/podPort/{namespace}/{pod}/{port}",
            any(responder::pod_port),
        )
        .route(
            "/podPort/{namespace}/{pod}/{port}/",
            any(responder::pod_port),
        )
        .route(
            "/podPort/{namespace}/{pod}/{port}/{*rest}",
            any(responder::pod_port),
        )
        // Unknown paths too: a 404 only once authorized, as kubelet's filter runs first.
        .fallback(|| async { text_error(StatusCode::NOT_FOUND, "404 page not found") })
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            auth::filter,
        ))
        .with_state(ctx)
}

/// kubelet's plain-text error answer (`response.WriteError`).
fn text_error(code: StatusCode, message: impl Into<String>) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// `/pods`: the pods bound to this node, as a `PodList`.
async fn pods(State(ctx): State<NodeCtx>) -> Response {
    let api: Api<Pod> = Api::all(ctx.shared.client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={}", ctx.node.name));
    match api.list(&params).await {
        Ok(list) => {
            let body =
                json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list.items});
            axum::Json(body).into_response()
        }
        Err(e) => text_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The usage of the pods running on this node.
async fn usage_here(ctx: &NodeCtx) -> Result<Vec<stats::PodUsage>, Response> {
    let api: Api<Pod> = Api::all(ctx.shared.client.clone());
    let params = ListParams::default().fields(&format!("spec.nodeName={}", ctx.node.name));
    let now = ctx.shared.clock.now();
    match api.list(&params).await {
        Ok(list) => Ok(list
            .items
            .iter()
            .filter_map(|p| stats::pod_usage(p, now))
            .collect()),
        Err(e) => Err(text_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// `/configz`: the node's effective KubeletConfiguration ([`configz`]).
async fn configz_handler(State(ctx): State<NodeCtx>) -> Response {
    let port = ctx
        .shared
        .kubelet_api
        .endpoint(&ctx.node.name)
        .map_or(0, |a| a.port());
    axum::Json(configz::configz(&ctx.node.config, port)).into_response()
}

/// `/stats/summary`: the Summary API of the node and its pods ([`stats`]).
async fn stats_summary(State(ctx): State<NodeCtx>) -> Response {
    match usage_here(&ctx).await {
        Ok(pods) => axum::Json(stats::summary(
            &ctx.node.name,
            ctx.started,
            &pods,
            ctx.shared.clock.now(),
        ))
        .into_response(),
        Err(r) => r,
    }
}

/// `/metrics/resource`: the resource metrics in the Prometheus text format ([`stats`]).
async fn resource_metrics(State(ctx): State<NodeCtx>) -> Response {
    match usage_here(&ctx).await {
        Ok(pods) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            stats::resource_metrics(ctx.started, &pods, ctx.shared.clock.now()),
        )
            .into_response(),
        Err(r) => r,
    }
}

fn parse_time(
    value: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Option<jiff::Timestamp> {
    value.map(|t| t.0)
}

/// `/containerLogs/{namespace}/{pod}/{container}`, as kubelet's `getContainerLogs` and
/// `validateContainerLogStatus` (`pkg/kubelet/kubelet_pods.go`) answer it.
async fn container_logs(
    State(ctx): State<NodeCtx>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let now = ctx.shared.clock.now();
    let options = match LogOptions::parse(&query, now) {
        Ok(o) => o,
        Err(e) => return text_error(StatusCode::BAD_REQUEST, e),
    };
    let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), &namespace);
    let pod = match api.get_opt(&pod_name).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return text_error(
                StatusCode::NOT_FOUND,
                format!("pod {pod_name:?} does not exist"),
            );
        }
        Err(e) => return text_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.node_name.as_deref()) != Some(ctx.node.name.as_str()) {
        return text_error(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    }
    let declared = spec.and_then(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == container)
    });
    let Some(declared) = declared else {
        return text_error(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    };
    let status = pod.status.as_ref().and_then(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.init_container_statuses.iter().flatten())
            .find(|c| c.name == container)
            .cloned()
    });
    let image = declared.image.clone().unwrap_or_default();
    let log = match instance(
        &ctx,
        &pod,
        &container,
        &image,
        status.as_ref(),
        options.previous,
    ) {
        Ok(log) => log,
        Err(message) => return text_error(StatusCode::BAD_REQUEST, message),
    };
    let guard = logs::StreamGuard::new(&ctx.shared.kubelet_api.open_log_streams);
    let body = Body::from_stream(log.stream(&options, now, ctx.shared.clock, guard));
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

/// The log of the container instance asked for, or kubelet's reason why there is none.
fn instance(
    ctx: &NodeCtx,
    pod: &Pod,
    container: &str,
    image: &str,
    status: Option<&ContainerStatus>,
    previous: bool,
) -> Result<ContainerLog, String> {
    let pod_name = pod.name_any();
    let waiting = |reason: &str| {
        format!("container {container:?} in pod {pod_name:?} is waiting to start: {reason}")
    };
    let Some(status) = status else {
        return Err(waiting("ContainerCreating"));
    };
    let annotations = pod.annotations();
    let template = annotations.get(LOG_TEMPLATE_ANNOTATION).map(|t| {
        t.replace("{pod}", &pod_name)
            .replace("{namespace}", &pod.namespace().unwrap_or_default())
            .replace("{container}", container)
            .replace("{node}", &ctx.node.name)
    });
    let interval = annotations
        .get(LOG_INTERVAL_ANNOTATION)
        .and_then(|v| logs::parse_interval(v))
        .unwrap_or(DEFAULT_LOG_INTERVAL);
    let first = format!("Started container {container} (image {image}) in pod {pod_name}");
    let terminated_log = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
        let finished = parse_time(t.finished_at.as_ref());
        let started = parse_time(t.started_at.as_ref()).or(finished)?;
        Some(ContainerLog {
            started,
            first: first.clone(),
            template: template.clone(),
            interval,
            ended: Some((
                finished.unwrap_or(started),
                format!("Container {container} exited with code {}", t.exit_code),
            )),
        })
    };
    if previous {
        return status
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .and_then(terminated_log)
            .ok_or_else(|| {
                format!("previous terminated container {container:?} in pod {pod_name:?} not found")
            });
    }
    let state = status.state.as_ref();
    if let Some(running) = state.and_then(|s| s.running.as_ref()) {
        let started =
            parse_time(running.started_at.as_ref()).unwrap_or_else(|| ctx.shared.clock.now());
        return Ok(ContainerLog {
            started,
            first,
            template,
            interval,
            ended: None,
        });
    }
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        return terminated_log(t).ok_or_else(|| waiting("ContainerCreating"));
    }
    let reason = state
        .and_then(|s| s.waiting.as_ref())
        .and_then(|w| w.reason.clone())
        .unwrap_or_else(|| "ContainerCreating".into());
    Err(waiting(&reason))
}

/// The pod `namespace/name` if it runs on this node, with kubelet's 404 otherwise.
async fn pod_here(ctx: &NodeCtx, namespace: &str, name: &str) -> Result<Pod, Response> {
    let api: Api<Pod> = Api::namespaced(ctx.shared.client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(p))
            if p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                == Some(ctx.node.name.as_str()) =>
        {
            Ok(p)
        }
        Ok(_) => Err(text_error(
            StatusCode::NOT_FOUND,
            format!("pod {name:?} does not exist"),
        )),
        Err(e) => Err(text_error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// The log lines `container` writes from now on, followed, as its main process's output.
fn main_output(
    ctx: &NodeCtx,
    pod: &Pod,
    container: &str,
    status: Option<&ContainerStatus>,
) -> Option<futures::stream::BoxStream<'static, bytes::Bytes>> {
    use futures::StreamExt as _;
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == container))
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let log = instance(ctx, pod, container, &image, status, false).ok()?;
    let options = LogOptions {
        follow: true,
        tail_lines: Some(0),
        ..LogOptions::default()
    };
    let now = ctx.shared.clock.now();
    let guard = logs::StreamGuard::new(&ctx.shared.kubelet_api.open_log_streams);
    Some(
        log.stream(&options, now, ctx.shared.clock, guard)
            .map(|chunk| chunk.unwrap_or_default())
            .boxed(),
    )
}

/// `/exec/{namespace}/{pod}/{container}?command=…&input=1&output=1&error=1&tty=1`: a
/// WebSocket upgrade (the channel protocols of [`websocket::PROTOCOLS`]) running the
/// command in the simulated container ([`exec`]).
async fn exec_handler(
    State(ctx): State<NodeCtx>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    request: axum::extract::Request,
) -> Response {
    streaming(ctx, namespace, pod_name, container, query, request, false).await
}

/// `/attach/{namespace}/{pod}/{container}?input=1&output=1&error=1&tty=1`: a WebSocket
/// upgrade attached to the container's simulated main process ([`exec::Program::Main`]).
async fn attach_handler(
    State(ctx): State<NodeCtx>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    request: axum::extract::Request,
) -> Response {
    streaming(ctx, namespace, pod_name, container, query, request, true).await
}

/// An exec or attach session (kubelet's `getExec`/`getAttach` through the streaming
/// server's `remotecommand` handlers).
async fn streaming(
    ctx: NodeCtx,
    namespace: String,
    pod_name: String,
    container: String,
    query: Vec<(String, String)>,
    mut request: axum::extract::Request,
    attach: bool,
) -> Response {
    let flag = |names: &[&str]| {
        query
            .iter()
            .any(|(k, v)| names.contains(&k.as_str()) && matches!(v.as_str(), "1" | "true"))
    };
    let argv: Vec<String> = query
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let (stdin, stdout, stderr, tty) = (
        flag(&["input", "stdin"]),
        flag(&["output", "stdout"]),
        flag(&["error", "stderr"]),
        flag(&["tty"]),
    );
    if argv.is_empty() && !attach {
        return text_error(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 command",
        );
    }
    if !(stdin || stdout || stderr) {
        return text_error(
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        );
    }
    let pod = match pod_here(&ctx, &namespace, &pod_name).await {
        Ok(p) => p,
        Err(r) => return r,
    };
    let status = pod.status.as_ref().and_then(|s| {
        s.container_statuses
            .iter()
            .flatten()
            .chain(s.ephemeral_container_statuses.iter().flatten())
            .find(|c| c.name == container)
            .cloned()
    });
    let running = status
        .as_ref()
        .is_some_and(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()));
    if !running {
        return text_error(
            StatusCode::BAD_REQUEST,
            format!("container {container:?} in pod {pod_name:?} is not running"),
        );
    }
    let headers = request.headers();
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let offered = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let (true, Some(key)) = (upgrade, key) else {
        return text_error(
            StatusCode::BAD_REQUEST,
            "a WebSocket upgrade is required (SPDY is not served)",
        );
    };
    let Some(protocol) = websocket::choose_protocol(offered) else {
        return text_error(
            StatusCode::BAD_REQUEST,
            format!(
                "none of the offered subprotocols {offered:?} is served: {}",
                websocket::PROTOCOLS.join(", ")
            ),
        );
    };
    let program = if attach {
        // Without stdin, the main process's output from now on: its log lines as written.
        let output = (!stdin && stdout)
            .then(|| main_output(&ctx, &pod, &container, status.as_ref()))
            .flatten();
        exec::Program::Main(output)
    } else {
        exec::Program::Command(argv)
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    let mut container_view = exec::Container::of(&pod, &container);
    // The pod's identity: service env vars and its projected volumes (token, root CA).
    let client = ctx.shared.client_for(&ctx.node.name);
    crate::identity::extend(
        &client,
        &ctx.shared.tokens,
        &pod,
        &container,
        &mut container_view,
    )
    .await;
    let streams = exec::Streams {
        stdin,
        stdout,
        stderr,
        tty,
        protocol,
    };
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                exec::session(
                    hyper_util::rt::TokioIo::new(upgraded),
                    streams,
                    container_view,
                    program,
                )
                .await
            }
            Err(error) => tracing::debug!(%error, attach, "exec or attach upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header("sec-websocket-accept", websocket::accept_key(&key))
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
