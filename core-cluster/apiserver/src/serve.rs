//! Serving the API on a socket over TLS with authentication, and the kubeconfig clients use
//! to reach it.
//!
//! One code path: [`secure_router`] is [`ApiServer::router`] behind the authentication layer
//! ([`crate::auth::authn`]); [`serve_tls`] accepts TCP connections, completes the TLS
//! handshake (client certificates optional, verified against the cluster CA), and serves
//! HTTP/2 or HTTP/1.1 as ALPN chose, with the client certificate's identity in every
//! request's extensions.
//!
//! Slow or idle clients are closed as kube-apiserver's Go server closes them
//! (`staging/src/k8s.io/apiserver/pkg/server/secure_serving.go`: `IdleTimeout` 90 s,
//! `ReadHeaderTimeout` 32 s), plus a TLS handshake timeout and HTTP/2 keep-alive pings. At
//! most [`ServeOptions::max_connections`] are served at once; connections without
//! credentials hold at most a share of them and a per-source number, and give their slot
//! up to newcomers when idle (the `limits` module). The workspace's test kit
//! (`ccm_testkit::TestServer`) starts all of it in a temporary directory for tests and
//! benchmarks.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use axum::{
    Router,
    extract::Request,
    middleware::{self, Next},
    response::Response,
};
use ccm_serving::{ConnectionAuth, Timeouts};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    api::ApiServer,
    auth::{
        GROUP_AUTHENTICATED, UserInfo,
        authn::{self, Authenticator},
        pki::{ClusterIdentity, Pki, PkiError},
        token::{Clock, TokenAuthenticator, TokenError},
    },
    store::StoreError,
};

mod limits;

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kubeconfig could not be written.
    #[error("could not write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The PKI could not be loaded or created.
    #[error("PKI: {0}")]
    Pki(#[from] PkiError),
    /// The service-account token key could not be loaded.
    #[error("service-account tokens: {0}")]
    Token(#[from] TokenError),
    /// An object the server publishes about itself could not be written.
    #[error("publishing {what}: {source}")]
    Publish {
        /// What was being published.
        what: &'static str,
        /// Why.
        #[source]
        source: crate::api::status::ApiError,
    },
    /// This server's PKI is not the one the API servers already serving its store have
    /// ([`Security::check_cluster_identity`]).
    #[error("{}", foreign_pki(.pki_dir, .recorded, .own))]
    ForeignPki {
        /// This server's PKI directory (`<data dir>/pki`).
        pki_dir: String,
        /// The identity recorded in the store by the first server.
        recorded: ClusterIdentity,
        /// This server's.
        own: ClusterIdentity,
    },
    /// The store could not be read or written.
    #[error("{what}: {source}")]
    Store {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The cluster identity could not be encoded or settled.
    #[error("cluster identity: {0}")]
    Identity(String),
    /// A client configuration could not be built.
    #[error("client configuration: {0}")]
    Client(String),
    /// The server failed.
    #[error("serving: {0}")]
    Io(#[from] std::io::Error),
}

/// The message of [`ServeError::ForeignPki`]: what differs, and which files to copy.
fn foreign_pki(pki_dir: &str, recorded: &ClusterIdentity, own: &ClusterIdentity) -> String {
    let mut differs = Vec::new();
    let mut files = Vec::new();
    if recorded.ca_certificate_sha256 != own.ca_certificate_sha256 {
        differs.push(format!(
            "CA certificate SHA-256 {} (this server's: {})",
            recorded.ca_certificate_sha256, own.ca_certificate_sha256
        ));
        files.extend(["ca.crt", "ca.key"]);
    }
    if recorded.service_account_key_sha256 != own.service_account_key_sha256 {
        differs.push(format!(
            "service-account key SHA-256 {} (this server's: {})",
            recorded.service_account_key_sha256, own.service_account_key_sha256
        ));
        files.push("sa.key");
    }
    format!(
        "this API server's PKI in {pki_dir} is not the cluster's: the API servers already \
         serving this store have {}, so the certificates and service-account tokens of their \
         clients would be refused here, and this server's there. Every API server of one etcd \
         needs the same PKI: copy {} from the pki/ directory of the --data-dir of a server \
         already serving this cluster into {pki_dir} and start again (this server's serving \
         and admin certificates are then issued again from the copied CA), or start this \
         server with that --data-dir",
        differs.join(" and "),
        files.join(", "),
    )
}

/// The store key, outside `/registry` (so no API serves it), where the first API server of
/// a shared store records its PKI's [`ClusterIdentity`]: public fingerprints only, as JSON.
pub const CLUSTER_IDENTITY_KEY: &str = "/ccm-rs/cluster-identity";

/// Limits of the server's connections.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How long a client has to complete the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long an HTTP/1 client has to send a request's headers, from when the connection
    /// is ready for the next request: also closes kept-alive HTTP/1 connections idle that
    /// long (kube-apiserver: `ReadHeaderTimeout` 32 s).
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight is kept: HTTP/2 with no open
    /// stream, HTTP/1 between requests (kube-apiserver: Go's `IdleTimeout`, 90 s, for both).
    /// An HTTP/2 connection that answers pings is closed too.
    pub idle_timeout: Duration,
    /// HTTP/2: how often an idle connection is pinged, and how long the answer may take
    /// before the connection is closed.
    pub http2_keep_alive: Duration,
    /// The most connections served at once. When all are taken, the oldest idle
    /// connection without credentials is closed to make room for a new one; when none is
    /// idle the new one is closed at once.
    pub max_connections: usize,
    /// The most connections whose TLS handshake completed without a client certificate
    /// and that have not authenticated a request since (a bearer token authenticates its
    /// connection); `None`: three quarters of [`max_connections`](Self::max_connections),
    /// so the rest is kept for authenticated clients. Past it, the oldest idle one is
    /// closed, or the newcomer when none is idle.
    pub max_unauthenticated_connections: Option<usize>,
    /// The most unauthenticated connections (handshaking or without credentials) from one
    /// source address; a new one from that address replaces its oldest idle one (or a
    /// handshake stalled for a second), or is closed when there is none. Authenticated
    /// connections are not counted.
    pub max_connections_per_source: usize,
    /// On shutdown, how long open requests (watches) may run before their connections are
    /// dropped.
    pub shutdown_grace: Duration,
}

impl ServeOptions {
    fn timeouts(&self) -> Timeouts {
        Timeouts {
            handshake: self.handshake_timeout,
            header_read: self.header_read_timeout,
            idle: self.idle_timeout,
            http2_keep_alive: self.http2_keep_alive,
            shutdown_grace: self.shutdown_grace,
        }
    }

    fn caps(&self) -> limits::Caps {
        let max = self.max_connections.max(1);
        limits::Caps {
            max,
            anonymous: self
                .max_unauthenticated_connections
                .unwrap_or(max - max / 4)
                .clamp(1, max),
            per_source: self.max_connections_per_source.max(1),
        }
    }
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(32),
            idle_timeout: Duration::from_secs(90),
            http2_keep_alive: Duration::from_secs(30),
            max_connections: 4096,
            max_unauthenticated_connections: None,
            max_connections_per_source: 512,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Binds `addr` (port 0 picks a free port) and returns the listener and its address.
pub async fn bind(addr: &str) -> Result<(TcpListener, SocketAddr), ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.to_owned(),
            source,
        })?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// The ConfigMap in `kube-system` where the server publishes its client CA
/// ([`Security::publish_client_ca`]).
pub const EXTENSION_APISERVER_AUTHENTICATION: &str = "extension-apiserver-authentication";

/// What a secure API server needs besides its [`ApiServer`]: the PKI, the TLS configuration
/// and the authenticator.
#[derive(Debug, Clone)]
pub struct Security {
    /// The cluster CA and certificates.
    pub pki: Arc<Pki>,
    /// The TLS server configuration.
    pub tls: Arc<rustls::ServerConfig>,
    /// Client certificates and service-account tokens.
    pub authenticator: Authenticator,
}

impl Security {
    /// Loads (or creates, or renews) the PKI under `data_dir` with `serving_names` in the
    /// serving certificate, and sets up authentication against `server`'s store.
    pub fn load(
        server: &ApiServer,
        data_dir: &Path,
        serving_names: &[String],
    ) -> Result<Security, ServeError> {
        let pki = Pki::load_or_create(data_dir, serving_names)?;
        let report = pki.report();
        if report.ca_created || report.ca_renewed || !report.issued.is_empty() {
            tracing::info!(dir = %pki.dir().display(), ?report, "PKI ready");
        }
        Self::from_pki(server, pki)
    }

    /// Authentication and TLS over an already loaded `pki`.
    pub fn from_pki(server: &ApiServer, pki: Pki) -> Result<Security, ServeError> {
        let tokens = TokenAuthenticator::new(pki.service_account_key_pem(), server.store())?;
        Ok(Security {
            tls: pki.server_config()?,
            pki: Arc::new(pki),
            authenticator: Authenticator::new().with_tokens(Arc::new(tokens)),
        })
    }

    /// Records this server's PKI identity ([`Pki::identity`]) in `server`'s store, or checks
    /// it against the one recorded there by the first API server on that store. Several API
    /// servers on one etcd serve one cluster only if they share the CA and the
    /// service-account key, as kube-apiserver's control-plane nodes do (kubeadm copies
    /// `ca.crt`, `ca.key`, `sa.key` to each): otherwise the clients of one are refused by
    /// another. Call it before the server publishes its CA or serves.
    ///
    /// Fails with [`ServeError::ForeignPki`], naming the files to copy, when they differ;
    /// except right after this server renewed its CA ([`PkiReport::ca_renewed`](crate::auth::pki::PkiReport)):
    /// then its identity replaces the recorded one, with a warning that the other servers
    /// need the renewed files.
    pub async fn check_cluster_identity(&self, server: &ApiServer) -> Result<(), ServeError> {
        let store = server.store();
        let own = self.pki.identity()?;
        let value = bytes::Bytes::from(
            serde_json::to_vec(&own).map_err(|e| ServeError::Identity(e.to_string()))?,
        );
        let store_error = |what| move |source| ServeError::Store { what, source };
        // Two servers may start at once: a lost race for the creation reads the winner's.
        for _ in 0..3 {
            let recorded = store
                .get(CLUSTER_IDENTITY_KEY)
                .await
                .map_err(store_error("reading the cluster identity"))?;
            let Some(recorded) = recorded else {
                match store.create(CLUSTER_IDENTITY_KEY, value.clone()).await {
                    Ok(_) => {
                        tracing::info!(
                            ca = %own.ca_certificate_sha256,
                            "recorded this PKI as the cluster's identity in the store"
                        );
                        return Ok(());
                    }
                    Err(StoreError::AlreadyExists { .. }) => continue,
                    Err(source) => {
                        return Err(ServeError::Store {
                            what: "recording the cluster identity",
                            source,
                        });
                    }
                }
            };
            let theirs: Option<ClusterIdentity> = serde_json::from_slice(&recorded.value).ok();
            if theirs.as_ref() == Some(&own) {
                return Ok(());
            }
            let renewed = self.pki.report().ca_renewed;
            if renewed || theirs.is_none() {
                match store
                    .update(
                        CLUSTER_IDENTITY_KEY,
                        value.clone(),
                        Some(recorded.mod_revision),
                    )
                    .await
                {
                    Ok(_) if renewed => {
                        tracing::warn!(
                            ca = %own.ca_certificate_sha256,
                            "this server's renewed CA is now the cluster's identity: every other \
                             API server on this store needs the renewed ca.crt and ca.key"
                        );
                        return Ok(());
                    }
                    Ok(_) => {
                        tracing::warn!(
                            ca = %own.ca_certificate_sha256,
                            "the cluster identity in the store was unreadable; recorded this PKI's"
                        );
                        return Ok(());
                    }
                    Err(StoreError::Conflict { .. }) => continue,
                    Err(source) => {
                        return Err(ServeError::Store {
                            what: "recording the cluster identity",
                            source,
                        });
                    }
                }
            }
            let Some(recorded) = theirs else {
                continue;
            };
            return Err(ServeError::ForeignPki {
                pki_dir: self.pki.dir().display().to_string(),
                recorded,
                own,
            });
        }
        Err(ServeError::Identity(
            "the record in the store kept changing while it was read".into(),
        ))
    }

    /// Checks service-account token times against `clock` (tests of expiry).
    pub fn with_token_clock(
        mut self,
        server: &ApiServer,
        clock: Clock,
    ) -> Result<Self, ServeError> {
        let tokens = TokenAuthenticator::new(self.pki.service_account_key_pem(), server.store())?
            .with_clock(clock);
        self.authenticator = Authenticator::new().with_tokens(Arc::new(tokens));
        Ok(self)
    }

    /// Publishes the cluster CA for delegated authentication, as kube-apiserver does: the
    /// ConfigMap `kube-system/extension-apiserver-authentication` with key `client-ca-file`,
    /// which components with delegated authn (the ccm's secure port, extension API servers)
    /// read to verify client certificates. Created or brought up to date on every start, so
    /// a renewed CA is published too.
    pub async fn publish_client_ca(&self, server: &ApiServer) -> Result<(), ServeError> {
        let configmap = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": EXTENSION_APISERVER_AUTHENTICATION, "namespace": "kube-system"},
            "data": {"client-ca-file": self.pki.ca_pem()},
        });
        // JSON is YAML: one document.
        server
            .apply_manifest(&configmap.to_string(), &["ConfigMap"])
            .await
            .map(|_| ())
            .map_err(|source| ServeError::Publish {
                what: "kube-system/extension-apiserver-authentication",
                source,
            })
    }

    /// The kubeconfig of the admin (`system:masters`) for `addr`, as YAML text.
    pub fn admin_kubeconfig(&self, addr: SocketAddr) -> String {
        self.pki.kubeconfig(&https_url(addr), self.pki.admin())
    }
}

/// `https://<addr>`, with `localhost`'s and unspecified addresses as `127.0.0.1`.
pub fn https_url(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        addr.ip()
    };
    format!("https://{}", SocketAddr::new(ip, addr.port()))
}

/// `server`'s router behind authentication: every request gets the [`UserInfo`] of its
/// client certificate or token, anonymous ones only on the health and version endpoints.
/// Token requests and reviews use the authenticator's tokens. A request that authenticates
/// takes its connection out of the unauthenticated connections' share ([`ServeOptions`]).
pub fn secure_router(server: &ApiServer, authenticator: Authenticator) -> Router {
    let mut router = server.router();
    if let Some(tokens) = authenticator.tokens() {
        router = router.layer(axum::Extension(tokens.clone()));
    }
    router
        .layer(middleware::from_fn(connection_authenticated))
        .layer(middleware::from_fn_with_state(authenticator, authn::layer))
}

/// Inside authentication: an authenticated request (a bearer token on a connection without
/// a client certificate) makes its connection count as authenticated.
async fn connection_authenticated(request: Request, next: Next) -> Response {
    if let Some(connection) = request.extensions().get::<ConnectionAuth>()
        && request
            .extensions()
            .get::<UserInfo>()
            .is_some_and(|user| user.in_group(GROUP_AUTHENTICATED))
    {
        connection.authenticated();
    }
    next.run(request).await
}

/// Serves `server` over TLS with `security` on `listener` until `shutdown` is cancelled.
pub async fn serve(
    server: ApiServer,
    security: &Security,
    listener: TcpListener,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let router = secure_router(&server, security.authenticator.clone());
    serve_tls(router, listener, security.tls.clone(), options, shutdown).await
}

/// Serves `router` over TLS on `listener` until `shutdown` is cancelled, then lets open
/// requests finish for [`ServeOptions::shutdown_grace`]: [`ccm_serving::serve`] with the
/// connection limits of `options`.
pub async fn serve_tls(
    router: Router,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    options: ServeOptions,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let limits = limits::Hook(limits::Limits::new(options.caps()));
    ccm_serving::serve(router, listener, tls, limits, options.timeouts(), shutdown).await;
    Ok(())
}

/// Writes `contents` to `path` atomically (write, then rename), readable by the owner only
/// as it holds a private key.
pub fn write_kubeconfig(path: &Path, contents: &str) -> Result<(), ServeError> {
    let err = |source| ServeError::Kubeconfig {
        path: path.display().to_string(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(&tmp).map_err(err)?;
        file.write_all(contents.as_bytes()).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)
}

/// A kube-rs configuration from kubeconfig YAML text.
pub async fn client_config(kubeconfig: &str) -> Result<kube::Config, ServeError> {
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig)
        .map_err(|e| ServeError::Client(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(parsed, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| ServeError::Client(e.to_string()))
}
