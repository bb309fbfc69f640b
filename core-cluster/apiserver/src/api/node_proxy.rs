//! The API server → kubelet paths: `pods/{name}/log`, `pods/{name}/exec`,
//! `pods/{name}/attach` and `nodes/{name}/proxy/…`, as
//! kube-apiserver serves them (`pkg/registry/core/pod/rest/log.go`,
//! `pkg/registry/core/pod/strategy.go LogLocation`, `pkg/registry/core/node/rest/proxy.go`).
//!
//! The kubelet dialled is always the one the Node advertises: the first of its
//! `status.addresses` of a type in `--kubelet-preferred-address-types`, on the port of
//! `status.daemonEndpoints.kubeletEndpoint.Port` (`pkg/kubelet/client/kubelet_client.go
//! NodeConnectionInfoGetter`); nothing of the request chooses the host. Its serving
//! certificate is verified against `--kubelet-certificate-authority` when set (upstream
//! skips verification otherwise), and the API server presents
//! `--kubelet-client-certificate`/`--kubelet-client-key` when set. Dialling, the TLS
//! handshake and the answer's headers are bounded by `--kubelet-timeout`; a log stream is
//! not, and ends when its client goes away.

use std::{sync::Arc, time::Duration};

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use core_cluster_tunnel::{TunnelStream, Tunnels};
use hyper_util::rt::TokioIo;
use rustls::{
    DigitallySignedStruct, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime, pem::PemObject},
};
use serde_json::{Value, json};
use tokio_util::either::Either;

use super::{ServerState, Target, status::ApiError};
use crate::{
    registry::{FieldError, resources},
    storage::get_list::get_object,
};

/// kube-apiserver's default `--kubelet-preferred-address-types`.
pub const DEFAULT_PREFERRED_ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];
/// The user of the client certificate kubeadm issues for kube-apiserver's
/// `--kubelet-client-certificate` (`apiserver-kubelet-client.crt`).
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";
/// Upstream's bootstrap ClusterRole for full use of the kubelet API (`nodes/proxy`,
/// `nodes/stats`, `nodes/metrics`, `nodes/log`).
pub const KUBELET_API_ADMIN_ROLE: &str = "system:kubelet-api-admin";

/// A ClusterRoleBinding (JSON, which is YAML) of [`KUBELET_API_ADMIN_ROLE`] to the user
/// `user`, named after it: how an installer lets the API server's kubelet client
/// certificate through the kubelets' SubjectAccessReviews.
pub fn kubelet_api_admin_binding(user: &str) -> String {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": KUBELET_API_ADMIN_ROLE},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })
    .to_string()
}

/// kube-apiserver's `--kubelet-port`: the port dialled when a Node advertises none.
pub const DEFAULT_KUBELET_PORT: u16 = 10250;
/// How much of a kubelet's error answer is read into the Status message (upstream's
/// `maxReadLength` of `GenericHttpResponseChecker`).
const MAX_ERROR_BODY: usize = 50_000;
/// The `PodLogOptions` query parameters handed on to the kubelet.
const LOG_PARAMETERS: [&str; 7] = [
    "follow",
    "previous",
    "timestamps",
    "sinceSeconds",
    "sinceTime",
    "tailLines",
    "limitBytes",
];

/// How the API server reaches kubelets (kube-apiserver's `--kubelet-*` flags).
#[derive(Clone)]
pub struct KubeletClientConfig {
    /// `--kubelet-preferred-address-types`: the Node address types tried in order.
    pub preferred_address_types: Vec<String>,
    /// `--kubelet-certificate-authority`: PEM CA bundle the kubelets' serving certificates
    /// are verified against; `None`: not verified, as upstream without the flag.
    pub certificate_authority: Option<String>,
    /// `--kubelet-client-certificate`: PEM certificate (chain) presented to kubelets.
    pub client_certificate: Option<String>,
    /// `--kubelet-client-key`: its PEM private key.
    pub client_key: Option<String>,
    /// `--kubelet-timeout`: dialling, the TLS handshake and the answer's headers.
    pub timeout: Duration,
    /// `--kubelet-port`: dialled when a Node advertises no port.
    pub default_port: u16,
    /// How kubelets are reached: directly, or only through their nodes' agent tunnels.
    pub egress: NodeEgress,
}

/// How the API server reaches kubelets: the `cluster` egress of upstream's
/// `EgressSelectorConfiguration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeEgress {
    /// A TCP connection to the address the Node advertises (upstream's default, `Direct`).
    #[default]
    Direct,
    /// Only over the connection the node's agent opened to the API server (Konnectivity's
    /// model, see `core_cluster_tunnel`): a node whose agent is not connected cannot be
    /// reached, and the advertised address is used only to verify the kubelet's certificate.
    AgentTunnel,
}

impl Default for KubeletClientConfig {
    fn default() -> Self {
        KubeletClientConfig {
            preferred_address_types: DEFAULT_PREFERRED_ADDRESS_TYPES
                .iter()
                .map(|t| (*t).to_owned())
                .collect(),
            certificate_authority: None,
            client_certificate: None,
            client_key: None,
            timeout: Duration::from_secs(5),
            default_port: DEFAULT_KUBELET_PORT,
            egress: NodeEgress::Direct,
        }
    }
}

impl std::fmt::Debug for KubeletClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletClientConfig")
            .field("preferred_address_types", &self.preferred_address_types)
            .field(
                "certificate_authority",
                &self.certificate_authority.is_some(),
            )
            .field("client_certificate", &self.client_certificate.is_some())
            .field("timeout", &self.timeout)
            .field("default_port", &self.default_port)
            .field("egress", &self.egress)
            .finish_non_exhaustive()
    }
}

/// The client of kubelets: the settings and the TLS connector built from them.
pub(crate) struct KubeletClient {
    config: KubeletClientConfig,
    tls: tokio_rustls::TlsConnector,
    /// The nodes' agent tunnels (used when [`KubeletClientConfig::egress`] says so).
    tunnels: Arc<Tunnels>,
}

/// Accepts any serving certificate (kube-apiserver without
/// `--kubelet-certificate-authority` sets `InsecureSkipVerify`), still checking that the
/// handshake is signed by the key of the certificate presented.
#[derive(Debug)]
struct UnverifiedKubelet(Arc<CryptoProvider>);

impl ServerCertVerifier for UnverifiedKubelet {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl KubeletClient {
    /// The client for `config`; an error names the unusable flag.
    pub(crate) fn new(config: &KubeletClientConfig) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("kubelet client TLS: {e}"))?;
        let builder = match &config.certificate_authority {
            Some(pem) => {
                let mut roots = rustls::RootCertStore::empty();
                for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let der = der.map_err(|e| format!("--kubelet-certificate-authority: {e}"))?;
                    roots
                        .add(der)
                        .map_err(|e| format!("--kubelet-certificate-authority: {e}"))?;
                }
                if roots.is_empty() {
                    return Err("--kubelet-certificate-authority: no certificate found".into());
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(UnverifiedKubelet(provider))),
        };
        let mut tls = match (&config.client_certificate, &config.client_key) {
            (Some(cert), Some(key)) => {
                let chain: Vec<CertificateDer<'static>> =
                    CertificateDer::pem_slice_iter(cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("--kubelet-client-certificate: {e}"))?;
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
                    .map_err(|e| format!("--kubelet-client-key: {e}"))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    format!("--kubelet-client-certificate/--kubelet-client-key: {e}")
                })?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(
                    "--kubelet-client-certificate and --kubelet-client-key go together".into(),
                );
            }
        };
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(KubeletClient {
            config: config.clone(),
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            tunnels: Arc::new(Tunnels::new()),
        })
    }

    /// The nodes' agent tunnels.
    pub(crate) fn tunnels(&self) -> &Arc<Tunnels> {
        &self.tunnels
    }

    /// How kubelets are reached.
    pub(crate) fn egress(&self) -> NodeEgress {
        self.config.egress
    }

    /// A connection to `node`'s kubelet at `host:port`: TCP, or a stream through the node's
    /// agent tunnel (the host then only names the certificate to verify).
    async fn dial(
        &self,
        node: &Value,
        host: &str,
        port: u16,
        authority: &str,
    ) -> Result<Either<tokio::net::TcpStream, TunnelStream>, String> {
        if self.config.egress == NodeEgress::AgentTunnel {
            let name = node["metadata"]["name"].as_str().unwrap_or_default();
            return self
                .tunnels
                .dial(name)
                .await
                .map(Either::Right)
                .map_err(|e| e.to_string());
        }
        let tcp = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("dial tcp {authority}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        Ok(Either::Left(tcp))
    }

    /// `--kubelet-timeout`.
    pub(crate) fn timeout(&self) -> Duration {
        self.config.timeout
    }

    /// Where `node`'s kubelet listens: host and port, as `NodeConnectionInfoGetter`.
    fn endpoint(&self, node: &Value) -> Result<(String, u16), String> {
        let addresses = node["status"]["addresses"].as_array();
        let found = self.config.preferred_address_types.iter().find_map(|t| {
            addresses?
                .iter()
                .find(|a| a["type"] == t.as_str())
                .and_then(|a| a["address"].as_str())
                .filter(|a| !a.is_empty())
        });
        let Some(host) = found else {
            let known: Vec<String> = addresses
                .into_iter()
                .flatten()
                .map(|a| {
                    format!(
                        "{{{} {}}}",
                        a["type"].as_str().unwrap_or(""),
                        a["address"].as_str().unwrap_or("")
                    )
                })
                .collect();
            return Err(format!(
                "no preferred addresses found; known addresses: [{}]",
                known.join(" ")
            ));
        };
        let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0)
            .unwrap_or(self.config.default_port);
        Ok((host.to_owned(), port))
    }

    /// Sends one request to `node`'s kubelet; the answer's headers within the timeout, or
    /// the error as Go's HTTP client words it (`Get "https://…": …`).
    pub(crate) async fn send(
        &self,
        node: &Value,
        method: Method,
        path_and_query: &str,
        headers: &[(header::HeaderName, HeaderValue)],
        body: Body,
    ) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let (host, port) = self.endpoint(node)?;
        let authority = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let url = format!("https://{authority}{path_and_query}");
        let verb = method_word(&method);
        let attempt = async {
            let tcp = self.dial(node, &host, port, &authority).await?;
            let name = ServerName::try_from(host.clone())
                .map_err(|e| format!("invalid kubelet host {host:?}: {e}"))?;
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| format!("tls: failed to verify certificate: {e}"))?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                // Upgrades (exec over WebSocket) take the connection over once answered.
                if let Err(error) = connection.with_upgrades().await {
                    tracing::debug!(%error, "kubelet connection ended");
                }
            });
            let mut request = hyper::Request::builder()
                .method(method.clone())
                .uri(path_and_query)
                .header(header::HOST, authority.as_str());
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let request = request.body(body).map_err(|e| e.to_string())?;
            sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(self.config.timeout, attempt).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(format!("{verb} {url:?}: {e}")),
            Err(_) => Err(format!(
                "{verb} {url:?}: net/http: request canceled (Client.Timeout exceeded while awaiting headers)"
            )),
        }
    }
}

fn method_word(method: &Method) -> String {
    let s = method.as_str();
    let mut w = s[..1].to_owned();
    w.push_str(&s[1..].to_ascii_lowercase());
    w
}

/// A kubelet's error answer as a Status (`GenericHttpResponseChecker`).
pub(crate) async fn backend_error(response: hyper::Response<hyper::body::Incoming>) -> ApiError {
    let code = response.status().as_u16();
    let body = axum::body::to_bytes(Body::new(response.into_body()), MAX_ERROR_BODY)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_owned();
    ApiError::from_backend(code, text)
}

/// A streamed answer: the kubelet's body handed on as it comes.
pub(crate) fn streamed(
    response: hyper::Response<hyper::body::Incoming>,
    default_type: &str,
) -> Response {
    let (parts, body) = response.into_parts();
    let mut out = Response::new(Body::new(body));
    *out.status_mut() = parts.status;
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(default_type).unwrap_or(HeaderValue::from_static("text/plain"))
        });
    out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    out
}

fn query_pairs(request: &Request<Body>) -> Result<Vec<(String, String)>, ApiError> {
    serde_urlencoded::from_str(request.uri().query().unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
}

/// `pkg/apis/core/validation ValidatePodLogOptions`.
fn validate_log_options(pod: &str, pairs: &[(String, String)]) -> Result<(), ApiError> {
    let get = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let int = |k: &str| -> Result<Option<i64>, ApiError> {
        get(k)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!("{k}: invalid value {v:?}: must be an integer"))
                })
            })
            .transpose()
    };
    let mut errors = Vec::new();
    if let Some(n) = int("tailLines")?
        && n < 0
    {
        errors.push(FieldError::invalid(
            "tailLines",
            &json!(n),
            "must be greater than or equal to 0",
        ));
    }
    if let Some(n) = int("limitBytes")?
        && n < 1
    {
        errors.push(FieldError::invalid(
            "limitBytes",
            &json!(n),
            "must be greater than 0",
        ));
    }
    let since_seconds = int("sinceSeconds")?;
    if let Some(n) = since_seconds
        && n < 1
    {
        errors.push(FieldError::invalid(
            "sinceSeconds",
            &json!(n),
            "must be greater than 0",
        ));
    }
    if since_seconds.is_some() && get("sinceTime").is_some() {
        errors.push(FieldError {
            reason: "FieldValueForbidden",
            field: String::new(),
            message: "Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified"
                .into(),
        });
    }
    if let Some(t) = get("sinceTime")
        && t.parse::<jiff::Timestamp>().is_err()
    {
        return Err(ApiError::bad_request(format!(
            "sinceTime: invalid time {t:?}: not RFC 3339"
        )));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("PodLogOptions", "", pod, errors))
    }
}

/// The container a log request is about (`pkg/registry/core/pod/strategy.go
/// validateContainer`): the one named, which the pod must have, or the pod's only one.
fn log_container(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let spec = &pod["spec"];
    let names = |key: &str| -> Vec<String> {
        spec[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_owned))
            .collect()
    };
    let containers = names("containers");
    match asked.filter(|c| !c.is_empty()) {
        Some(c) => {
            let all = [
                names("initContainers"),
                containers,
                names("ephemeralContainers"),
            ]
            .concat();
            if all.iter().any(|n| n == c) {
                Ok(c.to_owned())
            } else {
                Err(ApiError::bad_request(format!(
                    "container {c} is not valid for pod {name}"
                )))
            }
        }
        None => match containers.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}"
            ))),
            _ => {
                let all = [
                    names("initContainers"),
                    containers,
                    names("ephemeralContainers"),
                ]
                .concat();
                Err(ApiError::bad_request(format!(
                    "a container name must be specified for pod {name}, choose one of: [{}]",
                    all.join(" ")
                )))
            }
        },
    }
}

/// `GET …/pods/{name}/log`: the container's log from the kubelet of the pod's node,
/// streamed (`pkg/registry/core/pod/rest/log.go LogREST.Get`), over a WebSocket when the
/// request asks for one (`responsewriters.StreamObject`, see [`super::websocket`]).
pub(crate) async fn pod_log(
    state: &Arc<ServerState>,
    target: &Target,
    request: Request<Body>,
) -> Response {
    match pod_log_inner(state, target, request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn pod_log_inner(
    state: &Arc<ServerState>,
    target: &Target,
    mut request: Request<Body>,
) -> Result<Response, ApiError> {
    if request.method() != Method::GET {
        return Err(ApiError::method_not_served());
    }
    let (Some(ns), Some(name)) = (target.namespace.as_deref(), target.name.as_deref()) else {
        return Err(ApiError::no_route(request.uri().path()));
    };
    let pairs = query_pairs(&request)?;
    validate_log_options(name, &pairs)?;
    let pod = get_object(&*state.store, &resources::PODS, Some(ns), name)
        .await?
        .1;
    let asked = pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.as_str());
    let container = log_container(&pod, name, asked)?;
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if node_name.is_empty() {
        // Upstream's `LogLocation` gives no location for a pod not yet bound, and
        // `StreamObject` answers a stream without output 204, WebSocket or not.
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let node = get_object(&*state.store, &resources::NODES, None, node_name)
        .await?
        .1;
    let forwarded: Vec<(&str, &str)> = pairs
        .iter()
        .filter(|(k, _)| LOG_PARAMETERS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut path = format!("/containerLogs/{ns}/{name}/{container}");
    if !forwarded.is_empty() {
        let query = serde_urlencoded::to_string(&forwarded).unwrap_or_default();
        path = format!("{path}?{query}");
    }
    let response = state
        .kubelet
        .send(&node, Method::GET, &path, &[], Body::empty())
        .await
        .map_err(ApiError::internal)?;
    if !response.status().is_success() {
        return Err(backend_error(response).await);
    }
    if super::websocket::requested(request.headers()) {
        let body = Body::new(response.into_body());
        return Ok(super::websocket::stream(&mut request, body));
    }
    Ok(streamed(response, "text/plain"))
}

/// `…/pods/{name}/exec`: a WebSocket upgrade handed to the kubelet of the pod's node
/// (`/exec/{namespace}/{pod}/{container}` with kubelet's `input`/`output`/`error`/`tty`
/// parameters, `pkg/registry/core/pod/strategy.go ExecLocation`), the two upgraded
/// connections then spliced (`UpgradeAwareHandler`).
pub(crate) async fn pod_exec(
    state: &Arc<ServerState>,
    target: &Target,
    request: Request<Body>,
) -> Response {
    match pod_stream(state, target, request, "exec").await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// `…/pods/{name}/attach`: as [`pod_exec`], to kubelet's `/attach/{namespace}/{pod}/
/// {container}` (`strategy.go AttachLocation`), joining the container's main process.
pub(crate) async fn pod_attach(
    state: &Arc<ServerState>,
    target: &Target,
    request: Request<Body>,
) -> Response {
    match pod_stream(state, target, request, "attach").await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

/// An exec or attach (`kind`) session handed to the kubelet.
async fn pod_stream(
    state: &Arc<ServerState>,
    target: &Target,
    mut request: Request<Body>,
    kind: &'static str,
) -> Result<Response, ApiError> {
    if !matches!(*request.method(), Method::GET | Method::POST) {
        return Err(ApiError::method_not_served());
    }
    let (Some(ns), Some(name)) = (target.namespace.as_deref(), target.name.as_deref()) else {
        return Err(ApiError::no_route(request.uri().path()));
    };
    let pairs = query_pairs(&request)?;
    let pod = get_object(&*state.store, &resources::PODS, Some(ns), name)
        .await?
        .1;
    let asked = pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "container")
        .map(|(_, v)| v.as_str());
    let container = log_container(&pod, name, asked)?;
    let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("");
    if node_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    }
    if let Some(phase @ ("Succeeded" | "Failed")) = pod["status"]["phase"].as_str() {
        return Err(ApiError::bad_request(format!(
            "{} a container in a completed pod; current phase is {phase}",
            if kind == "exec" {
                "cannot exec into"
            } else {
                "cannot attach to"
            }
        )));
    }
    let is_upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !is_upgrade {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let node = get_object(&*state.store, &resources::NODES, None, node_name)
        .await?
        .1;
    let mut query: Vec<(&str, &str)> = Vec::new();
    for (k, v) in &pairs {
        let kubelet_name = match k.as_str() {
            "command" if kind == "exec" => "command",
            "stdin" => "input",
            "stdout" => "output",
            "stderr" => "error",
            "tty" => "tty",
            _ => continue,
        };
        let value = if kubelet_name == "command" {
            v.as_str()
        } else if matches!(v.as_str(), "1" | "true") {
            "1"
        } else {
            continue;
        };
        query.push((kubelet_name, value));
    }
    let path = format!(
        "/{kind}/{ns}/{name}/{container}?{}",
        serde_urlencoded::to_string(&query).unwrap_or_default()
    );
    let mut headers = vec![
        (header::CONNECTION, HeaderValue::from_static("Upgrade")),
        (header::UPGRADE, HeaderValue::from_static("websocket")),
    ];
    for h in [
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_VERSION,
        header::SEC_WEBSOCKET_PROTOCOL,
    ] {
        if let Some(v) = request.headers().get(&h) {
            headers.push((h, v.clone()));
        }
    }
    let client_upgrade = hyper::upgrade::on(&mut request);
    let mut response = state
        .kubelet
        .send(&node, Method::GET, &path, &headers, Body::empty())
        .await
        .map_err(ApiError::internal)?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return Err(backend_error(response).await);
    }
    let kubelet_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        let (client, kubelet) = match (client_upgrade.await, kubelet_upgrade.await) {
            (Ok(c), Ok(k)) => (c, k),
            (c, k) => {
                tracing::debug!(
                    client = c.is_ok(),
                    kubelet = k.is_ok(),
                    kind,
                    "upgrade failed"
                );
                return;
            }
        };
        let (mut client, mut kubelet) = (TokioIo::new(client), TokioIo::new(kubelet));
        if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut kubelet).await {
            tracing::debug!(%error, kind, "stream ended");
        }
    });
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for h in [
        header::CONNECTION,
        header::UPGRADE,
        header::SEC_WEBSOCKET_ACCEPT,
        header::SEC_WEBSOCKET_PROTOCOL,
    ] {
        if let Some(v) = response.headers().get(&h) {
            out.headers_mut().insert(h, v.clone());
        }
    }
    Ok(out)
}

/// A `nodes/{name}/proxy[/{path}]` request: the node's name (with an optional
/// `scheme:name:port` form) and the path under it.
pub(crate) fn node_proxy_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/api/v1/nodes/")?;
    let (name, rest) = rest.split_once('/')?;
    let tail = rest.strip_prefix("proxy")?;
    if !(tail.is_empty() || tail.starts_with('/')) || name.is_empty() {
        return None;
    }
    Some((name, tail))
}

/// The path stays under its target: no dot segments, no encoded slashes, dots or
/// backslashes that the target would decode into some other path.
pub(crate) fn check_proxied_path(tail: &str) -> Result<(), ApiError> {
    let lowered = tail.to_ascii_lowercase();
    if tail.split('/').any(|s| s == ".." || s == ".")
        || lowered.contains("%2f")
        || lowered.contains("%2e")
        || lowered.contains("%5c")
        || tail.contains('\\')
    {
        return Err(ApiError::bad_request(format!(
            "the proxied path {tail:?} may not hold dot segments or encoded separators"
        )));
    }
    Ok(())
}

/// `…/nodes/{name}/proxy/{path}`: the request handed to the node's kubelet, its answer
/// streamed back (`pkg/registry/core/node/rest/proxy.go`, `node.ResourceLocation`).
pub(crate) async fn node_proxy(
    state: &Arc<ServerState>,
    id: &str,
    tail: &str,
    request: Request<Body>,
) -> Response {
    match node_proxy_inner(state, id, tail, request).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn node_proxy_inner(
    state: &Arc<ServerState>,
    id: &str,
    tail: &str,
    request: Request<Body>,
) -> Result<Response, ApiError> {
    let Some((scheme, name, port)) = split_scheme_name_port(id) else {
        return Err(ApiError::bad_request(format!(
            "invalid node request {id:?}"
        )));
    };
    let node = get_object(&*state.store, &resources::NODES, None, name)
        .await?
        .1;
    let kubelet_port = state.kubelet.endpoint(&node).map(|(_, p)| p).ok();
    if !port.is_empty() && port.parse::<u16>().ok() != kubelet_port || scheme == "http" {
        return Err(ApiError::bad_request(format!(
            "only the kubelet port{} over https is proxied to node {name:?}",
            kubelet_port.map(|p| format!(" ({p})")).unwrap_or_default()
        )));
    }
    check_proxied_path(tail)?;
    let path = if tail.is_empty() { "/" } else { tail };
    let response = forward_to_kubelet(state, &node, path, request).await?;
    Ok(streamed(response, "application/octet-stream"))
}

/// `utilnet.SplitSchemeNamePort`: `name`, `name:port` or `scheme:name:port` as (scheme,
/// name, port); `None` for an empty name or a scheme other than http or https.
pub(crate) fn split_scheme_name_port(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    if name.is_empty() || !matches!(scheme, "" | "http" | "https") {
        return None;
    }
    Some((scheme, name, port))
}

/// Sends `request` to `path` on `node`'s kubelet, as the node, pod and service proxies do:
/// its method, query, `Accept` and `Content-Type`, and its body up to the server's limit. A
/// kubelet that cannot be reached is a 503 with the proxy's wording.
pub(crate) async fn forward_to_kubelet(
    state: &Arc<ServerState>,
    node: &Value,
    path: &str,
    request: Request<Body>,
) -> Result<hyper::Response<hyper::body::Incoming>, ApiError> {
    let path = match request.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    let method = request.method().clone();
    let mut headers = Vec::new();
    for name in [header::ACCEPT, header::CONTENT_TYPE] {
        if let Some(v) = request.headers().get(&name) {
            headers.push((name, v.clone()));
        }
    }
    let limit = state.config.max_request_bytes;
    let body = axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|_| ApiError::too_large(limit))?;
    state
        .kubelet
        .send(node, method, &path, &headers, Body::from(body))
        .await
        .map_err(|e| ApiError::service_unavailable(format!("error trying to reach service: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(addresses: Value, port: Value) -> Value {
        json!({"status": {"addresses": addresses, "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}})
    }

    /// `pkg/kubelet/client/kubelet_client.go NodeConnectionInfoGetter`: the first address
    /// of the first preferred type, the advertised port or `--kubelet-port`.
    #[test]
    fn the_kubelet_dialled_is_the_nodes_preferred_address_and_advertised_port() {
        let config = KubeletClientConfig {
            preferred_address_types: vec!["InternalIP".into(), "Hostname".into()],
            ..KubeletClientConfig::default()
        };
        let client = KubeletClient::new(&config).unwrap();
        let n = node(
            json!([{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "127.1.0.7"}]),
            json!(4321),
        );
        assert_eq!(client.endpoint(&n).unwrap(), ("127.1.0.7".to_owned(), 4321));
        let no_port = node(json!([{"type": "Hostname", "address": "n1"}]), json!(0));
        assert_eq!(client.endpoint(&no_port).unwrap(), ("n1".to_owned(), 10250));
        let none = node(
            json!([{"type": "ExternalIP", "address": "1.2.3.4"}]),
            json!(1),
        );
        let err = client.endpoint(&none).unwrap_err();
        assert_eq!(
            err,
            "no preferred addresses found; known addresses: [{ExternalIP 1.2.3.4}]"
        );
    }

    /// `strategy.go validateContainer`: upstream's 400 messages.
    #[test]
    fn a_log_request_names_a_container_of_the_pod_or_the_pod_has_only_one() {
        let pod = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}], "initContainers": [{"name": "i"}]}});
        let e = log_container(&pod, "p", None).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(
            e.message,
            "a container name must be specified for pod p, choose one of: [i a b]"
        );
        let e = log_container(&pod, "p", Some("zz")).unwrap_err();
        assert_eq!(e.message, "container zz is not valid for pod p");
        assert_eq!(log_container(&pod, "p", Some("i")).unwrap(), "i");
        let one = json!({"spec": {"containers": [{"name": "only"}]}});
        assert_eq!(log_container(&one, "p", None).unwrap(), "only");
    }

    /// `ValidatePodLogOptions`: 422 Invalid for negative numbers and both since forms.
    #[test]
    fn invalid_log_options_are_refused_as_upstream_validates_them() {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert_eq!(
            validate_log_options("p", &q(&[("tailLines", "-1")]))
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            validate_log_options("p", &q(&[("limitBytes", "0")]))
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(
            validate_log_options("p", &q(&[("tailLines", "x")]))
                .unwrap_err()
                .code,
            400
        );
        let both = q(&[("sinceSeconds", "3"), ("sinceTime", "2026-01-01T00:00:00Z")]);
        assert_eq!(validate_log_options("p", &both).unwrap_err().code, 422);
        validate_log_options("p", &q(&[("follow", "true"), ("tailLines", "3")])).unwrap();
    }

    #[test]
    fn node_proxy_paths_split_into_the_node_and_the_path_under_it() {
        assert_eq!(
            node_proxy_path("/api/v1/nodes/n1/proxy/healthz"),
            Some(("n1", "/healthz"))
        );
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxy"), Some(("n1", "")));
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/proxyx"), None);
        assert_eq!(node_proxy_path("/api/v1/nodes/n1/status"), None);
    }
}
