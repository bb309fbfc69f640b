//! The manager's API clients, as upstream's controller-manager builds them:
//!
//! - every client has its own client-side token bucket (`--kube-api-qps`, `--kube-api-burst`;
//!   client-go makes one limiter per client) and a user agent naming the controller
//!   (`cloud-controller-manager/<version> (<os>/<arch>) ccm-rs/<controller>`, as client-go's
//!   `AddUserAgent` appends the name);
//! - with `--use-service-account-credentials`, each controller's client authenticates as its
//!   own service account in `kube-system` (upstream's `DynamicControllerControllerClients`): the
//!   account is created when missing, a token is asked for with the TokenRequest API
//!   (one hour) and renewed when 80 % of its life has passed.
//!
//! Requests are JSON (`--kube-api-content-type` protobuf is not spoken here).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{HeaderValue, Request, Response, header};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use crate::controllers::CloudRateLimiter;

/// The namespace of the controllers' service accounts.
pub(crate) const SERVICE_ACCOUNT_NAMESPACE: &str = "kube-system";
/// How long a controller's token is asked for (upstream's `defaultExpirationSeconds`).
pub(crate) const TOKEN_EXPIRATION: Duration = Duration::from_secs(3600);

/// The service account (and user-agent suffix) of a controller, by upstream's
/// `DefaultInitFuncConstructors` client names; other controllers use their own name.
pub(crate) fn client_name(controller: &str) -> &str {
    match controller {
        "cloud-node-controller" => "cloud-node-controller",
        "cloud-node-lifecycle-controller" => "node-controller",
        "service-lb-controller" => "service-controller",
        "node-route-controller" => "route-controller",
        other => other,
    }
}

/// The user agent of the manager's clients; `name` is appended as client-go's `AddUserAgent`
/// does.
pub(crate) fn user_agent(name: Option<&str>) -> String {
    let base = format!(
        "cloud-controller-manager/v{} ({}/{}) ccm-rs",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    match name {
        Some(name) => format!("{base}/{name}"),
        None => base,
    }
}

/// A bearer token that a background task keeps fresh.
type SharedToken = Arc<RwLock<HeaderValue>>;

/// A `kube::Client` service in front of another client: waits for the token bucket, sets
/// the user agent (and a bearer token when it has one), then sends.
#[derive(Clone)]
struct Limited {
    inner: kube::Client,
    limiter: Arc<CloudRateLimiter>,
    user_agent: Option<HeaderValue>,
    token: Option<SharedToken>,
}

type ResponseFuture =
    Pin<Box<dyn Future<Output = Result<Response<kube::client::Body>, kube::Error>> + Send>>;

impl tower_service::Service<Request<kube::client::Body>> for Limited {
    type Response = Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<kube::client::Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            this.limiter.acquire().await;
            if let Some(agent) = &this.user_agent {
                request
                    .headers_mut()
                    .insert(header::USER_AGENT, agent.clone());
            }
            if let Some(token) = &this.token {
                let value = token.read().clone();
                request.headers_mut().insert(header::AUTHORIZATION, value);
            }
            this.inner.send(request).await
        })
    }
}

/// client-go's `DefaultQPS`, used when `--kube-api-qps` is 0.
pub(crate) const DEFAULT_QPS: f32 = 5.0;
/// client-go's `DefaultBurst`, used when `--kube-api-burst` is 0.
pub(crate) const DEFAULT_BURST: i32 = 10;

/// The token bucket of a client, as client-go's `RESTClientFor` makes it: a QPS of 0 means
/// [`DEFAULT_QPS`], a burst of 0 [`DEFAULT_BURST`], a negative QPS no limit.
pub(crate) fn token_bucket(qps: f32, burst: i32) -> CloudRateLimiter {
    let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
    let burst = if burst == 0 { DEFAULT_BURST } else { burst };
    if qps < 0.0 {
        CloudRateLimiter::unlimited()
    } else {
        CloudRateLimiter::new(f64::from(qps), u32::try_from(burst).unwrap_or(1))
    }
}

/// `client` behind a [`token_bucket`] of `qps` requests per second and bursts of `burst`
/// (client-go's `--kube-api-qps`/`--kube-api-burst`), sending `user_agent` when given.
#[cfg(test)]
fn rate_limited(
    client: kube::Client,
    qps: f32,
    burst: i32,
    user_agent: Option<&str>,
) -> kube::Client {
    wrap(client, Arc::new(token_bucket(qps, burst)), user_agent, None)
}

fn wrap(
    client: kube::Client,
    limiter: Arc<CloudRateLimiter>,
    user_agent: Option<&str>,
    token: Option<SharedToken>,
) -> kube::Client {
    let namespace = client.default_namespace().to_owned();
    kube::Client::new(
        Limited {
            inner: client,
            limiter,
            user_agent: user_agent.and_then(|a| HeaderValue::from_str(a).ok()),
            token,
        },
        namespace,
    )
}

/// Why a controller's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The client could not be built from the configuration.
    #[error("building the client of {name}: {source}")]
    Build {
        /// The client name.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The TokenRequest answer carried no usable token.
    #[error("service account kube-system/{name}: the TokenRequest answer has no usable token")]
    Token {
        /// The service account.
        name: String,
    },
    /// The service account or its token could not be had.
    #[error("service account kube-system/{name}: {source}")]
    ServiceAccount {
        /// The service account.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Builds the manager's clients: the root one (shared informers, events, leader election)
/// and one per controller, as upstream's controller-manager `ClientBuilder`. It is also the
/// [`cloud_provider::ClientBuilder`] the provider's `initialize` receives, so a provider's
/// `clients.client("my-informer")` gets its own user agent, its own token bucket and, with
/// `--use-service-account-credentials`, its own service account.
#[derive(Clone)]
pub struct ControllerClients {
    root: kube::Client,
    config: Option<kube::Config>,
    qps: f32,
    burst: i32,
    service_accounts: bool,
    /// Ends the token renewals of the clients built through [`cloud_provider::ClientBuilder`].
    shutdown: CancellationToken,
}

impl std::fmt::Debug for ControllerClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerClients")
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .field("service_accounts", &self.service_accounts)
            .finish_non_exhaustive()
    }
}

impl ControllerClients {
    /// Clients over `root`, the manager's own connection, without limit; `config`, when
    /// known, lets controllers connect as their own service accounts.
    pub fn new(root: kube::Client, config: Option<kube::Config>) -> Self {
        ControllerClients {
            root,
            config,
            qps: -1.0,
            burst: 0,
            service_accounts: false,
            shutdown: CancellationToken::new(),
        }
    }

    /// The clients handed out through [`cloud_provider::ClientBuilder`] renew their
    /// service-account tokens until `shutdown` is cancelled (by default, for the process's
    /// life).
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Each client gets a token bucket of `qps`/`burst`.
    pub fn with_rate_limit(mut self, qps: f32, burst: i32) -> Self {
        self.qps = qps;
        self.burst = burst;
        self
    }

    /// Controllers authenticate as their own service accounts
    /// (`--use-service-account-credentials`). Needs the cluster configuration: over a ready
    /// client only, the controllers keep the manager's identity (with a warning).
    pub fn with_service_account_credentials(mut self, on: bool) -> Self {
        if on && self.config.is_none() {
            tracing::warn!(
                "--use-service-account-credentials: the manager was given a client, not a cluster configuration; the controllers share its credentials"
            );
        }
        self.service_accounts = on;
        self
    }

    /// The manager's own connection, without limiter.
    pub(crate) fn root(&self) -> &kube::Client {
        &self.root
    }

    fn limiter(&self) -> Arc<CloudRateLimiter> {
        Arc::new(token_bucket(self.qps, self.burst))
    }

    /// A client with the manager's identity, its own limiter and `name` in its user agent.
    pub(crate) fn manager_client(&self, name: &str) -> kube::Client {
        wrap(
            self.root.clone(),
            self.limiter(),
            Some(&user_agent(Some(name))),
            None,
        )
    }

    /// A client with the manager's identity and `name` in its user agent, without limiter.
    pub(crate) fn unthrottled(&self, name: &str) -> kube::Client {
        wrap(
            self.root.clone(),
            Arc::new(CloudRateLimiter::unlimited()),
            Some(&user_agent(Some(name))),
            None,
        )
    }

    /// The client of `controller`: its own service account's when service-account
    /// credentials are on (the token renewed until `shutdown`), else the manager's
    /// identity; its own limiter and user agent either way.
    pub async fn controller_client(
        &self,
        controller: &str,
        shutdown: CancellationToken,
    ) -> Result<kube::Client, ClientError> {
        let name = client_name(controller);
        let Some(config) = self.config.clone().filter(|_| self.service_accounts) else {
            return Ok(self.manager_client(name));
        };
        let token = service_account_token(&self.root, name).await?;
        let shared = Arc::new(RwLock::new(token.0));
        tokio::spawn(renew_token(
            self.root.clone(),
            name.to_owned(),
            shared.clone(),
            token.1,
            shutdown,
        ));
        // Upstream's `AnonymousClientConfig`: the server and its CA, none of the manager's
        // credentials.
        let mut anonymous = config;
        anonymous.auth_info = kube::config::AuthInfo::default();
        let client = kube::Client::try_from(anonymous).map_err(|source| ClientError::Build {
            name: name.to_owned(),
            source,
        })?;
        tracing::info!(
            controller,
            service_account = name,
            "using service-account credentials"
        );
        Ok(wrap(
            client,
            self.limiter(),
            Some(&user_agent(Some(name))),
            Some(shared),
        ))
    }
}

/// Upstream's `ClientBuilder.Client(name)`: the client of `name` (a controller's name, or
/// any name a provider picks), with its own limiter and user agent, and its own service
/// account when service-account credentials are on.
#[async_trait::async_trait]
impl cloud_provider::ClientBuilder for ControllerClients {
    async fn client(&self, name: &str) -> cloud_provider::CloudResult<kube::Client> {
        self.controller_client(name, self.shutdown.clone())
            .await
            .map_err(|e| cloud_provider::CloudError::context(format!("the client of {name}"), e))
    }
}

/// Creates `kube-system/<name>` when missing and asks a token for it: the header value and
/// how long it is valid.
async fn service_account_token(
    root: &kube::Client,
    name: &str,
) -> Result<(HeaderValue, Duration), ClientError> {
    let err = |source| ClientError::ServiceAccount {
        name: name.to_owned(),
        source,
    };
    let accounts = kube::Api::<ServiceAccount>::namespaced(root.clone(), SERVICE_ACCOUNT_NAMESPACE);
    if accounts.get_opt(name).await.map_err(err)?.is_none() {
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(SERVICE_ACCOUNT_NAMESPACE.to_owned()),
                ..Default::default()
            },
            ..ServiceAccount::default()
        };
        match accounts
            .create(&kube::api::PostParams::default(), &account)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => return Err(err(source)),
        }
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_EXPIRATION.as_secs() as i64),
            bound_object_ref: None,
        },
        ..TokenRequest::default()
    };
    let answer = accounts
        .create_token_request(name, &kube::api::PostParams::default(), &request)
        .await
        .map_err(err)?;
    let Some(status) = answer.status else {
        return Err(ClientError::Token {
            name: name.to_owned(),
        });
    };
    let remaining = status
        .expiration_timestamp
        .0
        .duration_since(jiff::Timestamp::now());
    let lifetime = Duration::try_from(remaining)
        .ok()
        .filter(|d| !d.is_zero())
        .unwrap_or(TOKEN_EXPIRATION);
    let value = HeaderValue::from_str(&format!("Bearer {}", status.token)).map_err(|_| {
        ClientError::Token {
            name: name.to_owned(),
        }
    })?;
    Ok((value, lifetime))
}

/// Renews the token of `name` when 80 % of its life has passed, until `shutdown`; a failed
/// renewal is retried every 10 s while the old token lasts.
async fn renew_token(
    root: kube::Client,
    name: String,
    token: SharedToken,
    mut lifetime: Duration,
    shutdown: CancellationToken,
) {
    loop {
        let wait = lifetime.mul_f64(0.8);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match service_account_token(&root, &name).await {
            Ok((value, life)) => {
                *token.write() = value;
                lifetime = life;
            }
            Err(error) => {
                tracing::warn!(service_account = %name, %error, "renewing the token failed");
                lifetime = Duration::from_secs(12).min(lifetime);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    /// An in-memory API that counts requests and records their user agents.
    fn api() -> (kube::Client, Arc<parking_lot::Mutex<Vec<String>>>) {
        let agents = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = agents.clone();
        let router = axum::Router::new().route(
            "/version",
            get(move |headers: axum::http::HeaderMap| {
                let seen = seen.clone();
                async move {
                    let agent = headers
                        .get(header::USER_AGENT)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    seen.lock().push(agent);
                    "{}"
                }
            }),
        );
        (kube::Client::new(router, "default"), agents)
    }

    async fn get_version(client: &kube::Client) {
        client
            .request_text(Request::get("/version").body(Vec::new()).unwrap())
            .await
            .expect("the in-memory API answers");
    }

    /// client-go's client-side limiter (`--kube-api-qps 20 --kube-api-burst 30`): 100
    /// requests let 30 through at once, then one per 50 ms: at least 3.5 s (virtual time).
    #[tokio::test(start_paused = true)]
    async fn kube_api_qps_limits_requests() {
        let (inner, agents) = api();
        let client = rate_limited(inner, 20.0, 30, Some("cloud-controller-manager/test"));
        let start = tokio::time::Instant::now();
        for _ in 0..100 {
            get_version(&client).await;
        }
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(3500), "took {took:?}");
        assert!(
            took < Duration::from_millis(3600),
            "took {took:?}: over-limited"
        );
        assert_eq!(agents.lock().len(), 100);
        assert!(
            agents
                .lock()
                .iter()
                .all(|a| a == "cloud-controller-manager/test")
        );
        // Concurrent callers share the bucket too.
        let (inner, _) = api();
        let client = rate_limited(inner, 20.0, 30, None);
        let start = tokio::time::Instant::now();
        let all = (0..100).map(|_| get_version(&client));
        futures::future::join_all(all).await;
        assert!(start.elapsed() >= Duration::from_millis(3500));
        // client-go: a negative QPS is no limit; 0 is its defaults, 5 QPS and bursts of 10.
        let (inner, _) = api();
        let client = rate_limited(inner, -1.0, 0, None);
        let start = tokio::time::Instant::now();
        for _ in 0..100 {
            get_version(&client).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        let (inner, _) = api();
        let client = rate_limited(inner, 0.0, 0, None);
        let start = tokio::time::Instant::now();
        for _ in 0..20 {
            get_version(&client).await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(2),
            "10 at once, then 5 per second"
        );
    }

    /// Upstream's `AddUserAgent`: each controller's client names it; each has its own
    /// bucket (client-go makes one limiter per client).
    #[tokio::test(start_paused = true)]
    async fn controller_clients_have_their_own_agent_and_bucket() {
        let (root, agents) = api();
        let clients = ControllerClients::new(root, None).with_rate_limit(1.0, 1);
        let shutdown = CancellationToken::new();
        let route = clients
            .controller_client("node-route-controller", shutdown.clone())
            .await
            .unwrap();
        let service = clients
            .controller_client("service-lb-controller", shutdown.clone())
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        get_version(&route).await;
        get_version(&service).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "separate buckets");
        get_version(&route).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "one per second");
        let agents = agents.lock().clone();
        assert!(agents[0].ends_with("ccm-rs/route-controller"), "{agents:?}");
        assert!(
            agents[1].ends_with("ccm-rs/service-controller"),
            "{agents:?}"
        );
    }

    /// Upstream's `cloud.Initialize(c.ClientBuilder, stop)` (`app/controllermanager.go`):
    /// the builder a provider receives is the manager's, so each name a provider asks for
    /// gets its own user agent and its own `--kube-api-qps` bucket, as a controller's does.
    #[tokio::test(start_paused = true)]
    async fn a_provider_gets_clients_with_their_own_agent_and_bucket() {
        let (root, agents) = api();
        let clients: Arc<dyn cloud_provider::ClientBuilder> =
            Arc::new(ControllerClients::new(root, None).with_rate_limit(1.0, 1));
        let informer = clients.client("my-informer").await.unwrap();
        let writer = clients.client("my-writer").await.unwrap();
        let start = tokio::time::Instant::now();
        get_version(&informer).await;
        get_version(&writer).await;
        assert_eq!(start.elapsed(), Duration::ZERO, "separate buckets");
        get_version(&informer).await;
        assert_eq!(start.elapsed(), Duration::from_secs(1), "one per second");
        let agents = agents.lock().clone();
        assert!(agents[0].ends_with("ccm-rs/my-informer"), "{agents:?}");
        assert!(agents[1].ends_with("ccm-rs/my-writer"), "{agents:?}");
    }

    #[test]
    fn controllers_use_upstream_client_names() {
        assert_eq!(
            client_name("cloud-node-lifecycle-controller"),
            "node-controller"
        );
        assert_eq!(client_name("service-lb-controller"), "service-controller");
        assert_eq!(client_name("node-route-controller"), "route-controller");
        assert_eq!(
            client_name("cloud-node-controller"),
            "cloud-node-controller"
        );
        assert_eq!(client_name("my-controller"), "my-controller");
        assert!(user_agent(Some("route-controller")).starts_with("cloud-controller-manager/v"));
        assert!(user_agent(Some("route-controller")).ends_with("/route-controller"));
    }
}
