//! The library entry point a vendor's `main` calls (upstream's
//! `k8s.io/cloud-provider/app/controllermanager.go` `Run` sequence), the
//! registry of controller constructors, and logging setup.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::controllers::{
    CloudRateLimiter, ControllerContext, ControllerMetrics, EventRecorder, NodeCache, NodeOwnership,
};
use crate::delegated::{AccessReviewer, DelegatedAuth, TokenReviewer};
use crate::kube_client::ControllerClients;
use crate::leader::{LeaderElectionConfig, LeaderElector, LeaderError};
use crate::options::{
    CloudControllerManagerOptions, LogFormat, OptionsError, is_controller_enabled,
};
use crate::serve::{self, HealthChecks, ManagerMetrics};
use cloud_provider::{BoxError, CloudError, CloudProvider, InitContext, RegistryError};

/// A running controller: ends when the context's `shutdown` token is cancelled.
pub type ControllerFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;

/// Starts one controller, as upstream's `InitFunc`: `Ok(Some(future))` = started,
/// `Ok(None)` = skipped (e.g. the provider lacks the interface), `Err` = fatal.
pub type ControllerConstructor = fn(
    ControllerContext,
    &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError>;

/// The controllers the manager can start, by canonical name, in start order. Adding a
/// controller is one line: `.with("my-controller", my_controller::start)`.
#[derive(Clone, Default)]
pub struct ControllerRegistry {
    entries: Vec<(&'static str, ControllerConstructor, bool)>,
}

impl std::fmt::Debug for ControllerRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl ControllerRegistry {
    /// No controllers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a controller that `*` enables.
    pub fn with(mut self, name: &'static str, start: ControllerConstructor) -> Self {
        self.entries.retain(|(n, _, _)| *n != name);
        self.entries.push((name, start, true));
        self
    }

    /// Adds (or replaces) a controller that runs only when named in `--controllers`.
    pub fn with_disabled_by_default(
        mut self,
        name: &'static str,
        start: ControllerConstructor,
    ) -> Self {
        self.entries.retain(|(n, _, _)| *n != name);
        self.entries.push((name, start, false));
        self
    }

    /// Removes a controller (upstream's `delete(DefaultInitFuncConstructors, name)`).
    pub fn without(mut self, name: &str) -> Self {
        self.entries.retain(|(n, _, _)| *n != name);
        self
    }

    /// The registered names, in start order.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|(n, _, _)| *n).collect()
    }

    fn disabled_by_default(&self) -> Vec<&'static str> {
        self.entries
            .iter()
            .filter(|(_, _, on)| !on)
            .map(|(n, _, _)| *n)
            .collect()
    }
}

/// Why the manager stopped with an error. The binary exits 1 on any of them.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The flags are invalid.
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// The provider could not be built.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// `--cloud-provider` is `external` (or the registry built nothing).
    #[error("cloud provider is nil")]
    NoCloud,
    /// The cloud has no cluster ID and `--allow-untagged-cloud` is off.
    #[error(
        "no ClusterID found; a ClusterID is required for the cloud provider to function properly (--allow-untagged-cloud to run anyway)"
    )]
    NoClusterId,
    /// No way to reach the cluster, or the client could not be built.
    #[error("cluster access: {0}")]
    Cluster(String),
    /// The endpoints could not be served.
    #[error("serving endpoints: {0}")]
    Serve(#[from] std::io::Error),
    /// Secure serving could not be set up (certificates, TLS flags, the port).
    #[error("secure serving: {0}")]
    SecureServing(#[from] crate::secure_serving::ServingError),
    /// Delegated authentication could not be set up.
    #[error(transparent)]
    Delegation(#[from] crate::delegated::DelegationError),
    /// Leadership was lost (upstream exits 1).
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// The provider's `initialize` failed.
    #[error("initializing the cloud provider: {0}")]
    Initialize(#[source] CloudError),
    /// Initializing the cloud or starting the controllers failed while leading.
    #[error("while leading: {0}")]
    Leading(String),
    /// A controller failed to start.
    #[error("starting controller {name}: {source}")]
    Controller {
        /// The controller's canonical name.
        name: String,
        /// What went wrong.
        #[source]
        source: BoxError,
    },
}

/// Installs the global `tracing` subscriber: `RUST_LOG` filter (default `info`), text or JSON
/// lines on stderr. A second call does nothing.
pub fn init_logging(format: LogFormat) {
    install_logging("info", format);
}

fn install_logging(default_level: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// [`init_logging`] as the flags say: `--logging-format` (else `--log-format`), and `-v`
/// mapped to a level when `RUST_LOG` is unset.
pub fn init_logging_for(options: &CloudControllerManagerOptions) {
    install_logging(
        crate::upstream_flags::level_for_verbosity(options.verbosity),
        options.effective_log_format(),
    );
}

/// The cluster configuration `--kubeconfig` / `--master` describe, else the in-cluster one.
pub(crate) async fn cluster_config(
    options: &CloudControllerManagerOptions,
) -> Result<kube::Config, AppError> {
    let cluster = |e: &dyn std::fmt::Display| AppError::Cluster(e.to_string());
    let master = options
        .master
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| m.parse::<axum::http::Uri>())
        .transpose()
        .map_err(|e| cluster(&e))?;
    match (&options.kubeconfig, master) {
        (Some(path), master) => {
            let mut config = kubeconfig_file(path).await?;
            if let Some(master) = master {
                config.cluster_url = master;
            }
            Ok(config)
        }
        (None, Some(master)) => Ok(kube::Config::new(master)),
        (None, None) => kube::Config::incluster().map_err(|e| {
            AppError::Cluster(format!(
                "no --kubeconfig or --master and not running in a cluster: {e}"
            ))
        }),
    }
}

/// The configuration a kubeconfig file describes (its current context).
async fn kubeconfig_file(path: &std::path::Path) -> Result<kube::Config, AppError> {
    let cluster = |e: &dyn std::fmt::Display| AppError::Cluster(format!("{}: {e}", path.display()));
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| cluster(&e))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| cluster(&e))
}

/// The cluster client `--kubeconfig` / `--master` describe, else the in-cluster config.
#[cfg(test)]
pub(crate) async fn cluster_client(
    options: &CloudControllerManagerOptions,
) -> Result<kube::Client, AppError> {
    let config = cluster_config(options).await?;
    kube::Client::try_from(config).map_err(|e| AppError::Cluster(e.to_string()))
}

/// The client of a delegated-auth kubeconfig flag, else `root`.
async fn review_client(
    flag: Option<&std::path::Path>,
    root: &kube::Client,
) -> Result<kube::Client, AppError> {
    match flag.filter(|p| !p.as_os_str().is_empty()) {
        None => Ok(root.clone()),
        Some(path) => kube::Client::try_from(kubeconfig_file(path).await?)
            .map_err(|e| AppError::Cluster(e.to_string())),
    }
}

/// Delegated authentication and authorization as the flags say, and the client CA to
/// verify client certificates with (`--client-ca-file`, else the cluster's ConfigMap unless
/// `--authentication-skip-lookup`).
async fn delegated_auth(
    options: &CloudControllerManagerOptions,
    root: &kube::Client,
) -> Result<(DelegatedAuth, Option<String>), AppError> {
    let authn = review_client(options.authentication_kubeconfig.as_deref(), root).await?;
    let authz = review_client(options.authorization_kubeconfig.as_deref(), root).await?;
    let client_ca = match options
        .client_ca_file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
    {
        Some(path) => Some(crate::secure_serving::read(path)?),
        None if options.authentication_skip_lookup => None,
        None => {
            crate::delegated::lookup_client_ca(
                &authn,
                options.authentication_tolerate_lookup_failure,
            )
            .await?
        }
    };
    let paths = options
        .authorization_always_allow_paths
        .iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    let auth = DelegatedAuth::new(
        Some(TokenReviewer::new(
            authn,
            options.authentication_token_webhook_cache_ttl.value,
        )),
        Some(AccessReviewer::new(
            authz,
            options.authorization_webhook_cache_authorized_ttl.value,
            options.authorization_webhook_cache_unauthorized_ttl.value,
        )),
        paths,
    );
    Ok((auth, client_ca))
}

/// Starts HTTPS with delegated auth on `--bind-address:--secure-port` (upstream's secure
/// serving): returns the serving task and the bound address.
async fn start_secure_serving(
    options: &CloudControllerManagerOptions,
    root: &kube::Client,
    router: axum::Router,
    shutdown: CancellationToken,
) -> Result<
    (
        tokio::task::JoinHandle<std::io::Result<()>>,
        std::net::SocketAddr,
    ),
    AppError,
> {
    let addr = std::net::SocketAddr::new(options.bind_address, options.secure_port);
    let cert = crate::secure_serving::serving_cert(&options.cert_source(), options.bind_address)?;
    let (auth, client_ca) = delegated_auth(options, root).await?;
    let tls = options
        .tls_settings()
        .server_config(&cert, client_ca.as_deref())?;
    let (listener, local) = crate::secure_serving::bind(addr).await?;
    let router = serve::secured(
        serve::with_configz(router, crate::configz::component_config(options)),
        auth,
    );
    tracing::info!(
        address = %local,
        client_certificates = client_ca.is_some(),
        "serving /healthz, /readyz, /livez, /metrics, /configz over HTTPS"
    );
    Ok((
        tokio::spawn(serve::serve_tls(listener, tls, router, shutdown)),
        local,
    ))
}

/// How long [`run`] waits for the API server to answer before giving up (upstream's
/// `WaitForAPIServer` timeout).
pub(crate) const API_SERVER_WAIT: Duration = Duration::from_secs(10);

/// Waits until the API server answers `/version`, asking every second, for at most `wait`.
/// An unreachable server is a clear error (the binary exits 1) instead of controllers
/// retrying in silence.
pub(crate) async fn wait_for_api_server(
    client: &kube::Client,
    wait: Duration,
) -> Result<(), AppError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match client.apiserver_version().await {
            Ok(version) => {
                tracing::info!(version = %version.git_version, "API server is reachable");
                return Ok(());
            }
            Err(error) if tokio::time::Instant::now() + Duration::from_secs(1) >= deadline => {
                return Err(AppError::Cluster(format!(
                    "the API server did not answer within {wait:?}: {error}"
                )));
            }
            Err(error) => {
                tracing::warn!(%error, "waiting for the API server");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Runs the cloud-controller-manager until SIGTERM / Ctrl-C (`Ok`) or a fatal error
/// (leadership lost included): validate, build the cloud from the registry, reach the
/// cluster, serve the endpoints, elect a leader, then initialize the cloud and start the
/// enabled controllers.
pub async fn run(
    options: CloudControllerManagerOptions,
    controllers: ControllerRegistry,
) -> Result<(), AppError> {
    options.validate_with(&controllers.names())?;
    let cloud = cloud_provider::init_cloud_provider(
        &options.cloud_provider,
        options.cloud_config.as_deref(),
    )?
    .ok_or(AppError::NoCloud)?;
    let config = cluster_config(&options).await?;
    let client =
        kube::Client::try_from(config.clone()).map_err(|e| AppError::Cluster(e.to_string()))?;
    wait_for_api_server(&client, API_SERVER_WAIT).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    let clients = ControllerClients::new(client, Some(config));
    run_clients(
        options,
        controllers,
        cloud,
        clients,
        shutdown,
        HealthChecks::new(),
    )
    .await
}

async fn stop_on_signal(shutdown: CancellationToken) {
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
    tracing::info!("signal received, shutting down");
    shutdown.cancel();
}

/// [`run`] with the cloud and the client already built (tests, embedders): validates the
/// flags and the cluster ID, serves the endpoints unless `--secure-port 0`, and runs until
/// `shutdown` is cancelled. `checks` receives `leaderElection` and one check per started
/// controller.
pub async fn run_with(
    options: CloudControllerManagerOptions,
    controllers: ControllerRegistry,
    cloud: Arc<dyn CloudProvider>,
    client: kube::Client,
    shutdown: CancellationToken,
    checks: HealthChecks,
) -> Result<(), AppError> {
    let clients = ControllerClients::new(client, None);
    run_clients(options, controllers, cloud, clients, shutdown, checks).await
}

/// [`run_with`] over [`ControllerClients`] (which knows the cluster configuration when [`run`]
/// made it, so controllers can use their own service accounts).
async fn run_clients(
    options: CloudControllerManagerOptions,
    controllers: ControllerRegistry,
    cloud: Arc<dyn CloudProvider>,
    clients: ControllerClients,
    shutdown: CancellationToken,
    checks: HealthChecks,
) -> Result<(), AppError> {
    options.validate_with(&controllers.names())?;
    if options.kube_api_content_type != "application/json" {
        tracing::info!(
            content_type = %options.kube_api_content_type,
            "--kube-api-content-type: requests are sent as application/json"
        );
    }
    let clients = clients
        .with_rate_limit(options.kube_api_qps, options.kube_api_burst)
        .with_service_account_credentials(options.use_service_account_credentials);
    // The shared caches, events and cloud initialization: the manager's identity, one
    // limiter (client-go's "shared-informers" client).
    let client = clients.manager_client("shared-informers");
    for warning in options.compatibility_warnings() {
        tracing::warn!("{warning}");
    }
    if !cloud.has_cluster_id() {
        if options.allow_untagged_cloud {
            tracing::warn!("detected a cluster without a ClusterID; running anyway");
        } else {
            return Err(AppError::NoClusterId);
        }
    }
    let limiter = Arc::new(
        CloudRateLimiter::new(options.cloud_api_qps, options.cloud_api_burst)
            .adaptive(options.cloud_api_adaptive),
    );
    let metrics = ManagerMetrics::new(limiter.clone());
    cloud.register_metrics(&mut metrics.registry().lock());
    let controller_metrics = ControllerMetrics::new();
    controller_metrics.register(&mut metrics.registry().lock());
    let server = if options.secure_port != 0 {
        let router = serve::router(checks.clone(), metrics.clone());
        let (task, _) =
            start_secure_serving(&options, clients.root(), router, shutdown.clone()).await?;
        Some(task)
    } else {
        None
    };
    let start = Starter {
        options: Arc::new(options.clone()),
        controllers,
        cloud,
        client,
        clients: clients.clone(),
        checks: checks.clone(),
        metrics,
        controller_metrics,
        limiter,
    };
    let result = if options.leader_elect {
        let elector = LeaderElector::new(
            clients.manager_client("leader-election"),
            LeaderElectionConfig::from_options(&options),
        )
        .with_shutdown(shutdown.clone());
        let health = elector.health();
        checks.add(
            "leaderElection",
            Arc::new(move || health.check(Duration::from_secs(20))),
        );
        match elector.run(move |token| start.run(token)).await {
            Ok(()) => Ok(()),
            Err(LeaderError::Work(message)) => Err(AppError::Leading(message)),
            Err(lost) => Err(AppError::Leader(lost)),
        }
    } else {
        start.run(shutdown.clone()).await.map_err(|e| *e)
    };
    shutdown.cancel();
    if let Some(server) = server {
        let _ = server.await;
    }
    result
}

struct Starter {
    options: Arc<CloudControllerManagerOptions>,
    controllers: ControllerRegistry,
    cloud: Arc<dyn CloudProvider>,
    client: kube::Client,
    clients: ControllerClients,
    checks: HealthChecks,
    metrics: ManagerMetrics,
    controller_metrics: ControllerMetrics,
    limiter: Arc<CloudRateLimiter>,
}

impl Starter {
    async fn run(self, token: CancellationToken) -> Result<(), Box<AppError>> {
        self.start(token).await.map_err(Box::new)
    }

    async fn start(self, token: CancellationToken) -> Result<(), AppError> {
        // Upstream's `cloud.Initialize(c.ClientBuilder, stop)`: the provider's clients are
        // built as the controllers' are (own user agent, own token bucket, own service
        // account with --use-service-account-credentials), and renew until leadership ends.
        let clients = Arc::new(self.clients.clone().with_shutdown(token.clone()));
        self.cloud
            .initialize(InitContext::new(clients, token.clone()))
            .await
            .map_err(AppError::Initialize)?;
        let disabled = self.controllers.disabled_by_default();
        // One Node watch for every controller (upstream's shared informer factory).
        let nodes = NodeCache::new(self.client.clone(), token.clone());
        // Which Nodes this ccm owns: the flag's platforms, else the provider's.
        let ownership = if self.options.cloud_provider_platforms.is_empty() {
            NodeOwnership::of(self.cloud.supported_platforms())
        } else {
            NodeOwnership::of(self.options.cloud_provider_platforms.iter().cloned())
        };
        if let Some(platforms) = ownership.platforms() {
            tracing::info!(?platforms, "acting only on the Nodes of these platforms");
        }
        // Events go through client-go's correlator (spam filter) but, unlike upstream's
        // asynchronous broadcaster, are written inline by the controllers: their writes are
        // not held by --kube-api-qps, so a controller never waits on an Event.
        let events = EventRecorder::new(self.clients.unthrottled("event-broadcaster"));
        let mut running = Vec::new();
        let interval = self.options.controller_start_interval.value;
        let mut first = true;
        for (name, construct, _) in &self.controllers.entries {
            if !is_controller_enabled(&self.options.controllers, name, &disabled) {
                tracing::warn!(controller = name, "controller is disabled");
                continue;
            }
            // Upstream's `--controller-start-interval`: a wait in [d, 2d) between starts.
            if !std::mem::take(&mut first) && !interval.is_zero() {
                let jitter =
                    interval.mul_f64(f64::from(uuid::Uuid::new_v4().as_u128() as u16) / 65536.0);
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tokio::time::sleep(interval + jitter) => {}
                }
            }
            let client = self
                .clients
                .controller_client(name, token.clone())
                .await
                .map_err(|e| AppError::Controller {
                    name: (*name).to_owned(),
                    source: Box::new(e),
                })?;
            let ctx = ControllerContext::new(
                client,
                self.cloud.clone(),
                &self.options.cluster_name,
                token.child_token(),
            )
            .with_cloud_limiter(self.limiter.clone())
            .with_node_cache(nodes.clone())
            .with_event_recorder(events.clone())
            .with_metrics(self.controller_metrics.clone())
            .with_ownership(ownership.clone());
            match construct(ctx, &self.options) {
                Err(source) => {
                    return Err(AppError::Controller {
                        name: (*name).to_owned(),
                        source,
                    });
                }
                Ok(None) => tracing::info!(controller = name, "Skipping controller"),
                Ok(Some(future)) => {
                    tracing::info!(controller = name, "started controller");
                    self.checks.add_ping(*name);
                    self.metrics.set_controller_running(name, true);
                    let name = *name;
                    let metrics = self.metrics.clone();
                    running.push(tokio::spawn(async move {
                        if let Err(error) = future.await {
                            tracing::error!(controller = name, %error, "controller failed");
                        }
                        metrics.set_controller_running(name, false);
                    }));
                }
            }
        }
        token.cancelled().await;
        for task in running {
            let _ = task.await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> CloudControllerManagerOptions {
        let mut all = vec!["ccm"];
        all.extend_from_slice(args);
        CloudControllerManagerOptions::try_parse_from(all).unwrap()
    }

    /// `external` builds no cloud, and the manager refuses to run.
    #[tokio::test]
    async fn external_provider_is_nil() {
        let err = run(
            options(&["--cloud-provider", "external"]),
            ControllerRegistry::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AppError::NoCloud), "{err}");
        assert_eq!(err.to_string(), "cloud provider is nil");
    }

    /// Flags are validated first: nothing is built from invalid options.
    #[tokio::test]
    async fn invalid_options_fail_first() {
        let err = run(options(&[]), ControllerRegistry::new())
            .await
            .unwrap_err();
        assert!(matches!(err, AppError::Options(_)), "{err}");
        assert!(err.to_string().contains("--cloud-provider cannot be empty"));
        let err = run(
            options(&["--cloud-provider", "no-such-cloud"]),
            ControllerRegistry::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, AppError::Registry(_)), "{err}");
    }

    /// `--master` alone is enough to build a client; neither flag outside a cluster is an
    /// error naming both flags.
    #[tokio::test]
    async fn cluster_access() {
        assert!(
            cluster_client(&options(&["--master", "http://127.0.0.1:6443"]))
                .await
                .is_ok()
        );
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            let err = cluster_client(&options(&[]))
                .await
                .err()
                .expect("no cluster access");
            assert!(err.to_string().contains("--kubeconfig"), "{err}");
        }
        let err = cluster_client(&options(&["--kubeconfig", "/nonexistent/kubeconfig"]))
            .await
            .err()
            .expect("unreadable kubeconfig");
        assert!(matches!(err, AppError::Cluster(_)), "{err}");
    }

    /// The registry keeps start order, and `with` replaces a name instead of duplicating it.
    #[test]
    fn controller_registry() {
        fn start(
            _: ControllerContext,
            _: &CloudControllerManagerOptions,
        ) -> Result<Option<ControllerFuture>, BoxError> {
            Ok(None)
        }
        let registry = ControllerRegistry::new()
            .with("b", start)
            .with("a", start)
            .with("b", start)
            .with_disabled_by_default("c", start);
        assert_eq!(registry.names(), vec!["a", "b", "c"]);
        assert_eq!(registry.disabled_by_default(), vec!["c"]);
        assert_eq!(registry.without("a").names(), vec!["b", "c"]);
    }
}
