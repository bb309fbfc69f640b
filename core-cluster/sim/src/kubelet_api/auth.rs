//! Authentication and authorization of every request to a simulated kubelet, as kubelet
//! does with `authentication.anonymous.enabled=false`, `authentication.webhook.enabled=true`,
//! `authentication.x509.clientCAFile` and `authorization.mode=Webhook` (the
//! `KubeletConfiguration` defaults; `pkg/kubelet/server/auth.go`, `server.go
//! InstallAuthFilter`):
//!
//! 1. a client certificate verified against the client CA in the TLS handshake names the
//!    user (CN) and groups (O), `staging/src/k8s.io/apiserver/pkg/authentication/request/x509`;
//! 2. else a bearer token is checked with a `TokenReview` to the API server, the answer
//!    cached for `authentication.webhook.cacheTTL` (2 min) by the token's SHA-256;
//! 3. else the request is anonymous: a 401 `Unauthorized` unless anonymous requests are
//!    enabled.
//!
//! Every authenticated user also gets `system:authenticated` (`AuthenticatedGroupAdder`).
//! The request is then authorized by a `SubjectAccessReview` on the node: resource `nodes`,
//! name the node, the verb from the HTTP method and the subresource from the path
//! (`NodeAuthorizerAttributesGetter`: `/stats` → `stats`, `/metrics` → `metrics`, `/logs` →
//! `log`, `/checkpoint` → `checkpoint`, everything else → `proxy`). Allowed answers are
//! cached for `cacheAuthorizedTTL` (5 min), denied ones for `cacheUnauthorizedTTL` (30 s).
//! A denial is a 403 with kubelet's text, `Forbidden (user=…, verb=…, resource=nodes,
//! subresource=…)`; a review that cannot be made is a 500 `Authorization error (…)`.

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    sync::Arc,
    time::Duration,
};

use axum::{
    extract::{Request, State},
    http::{Method, StatusCode},
    middleware::Next,
    response::Response,
};
use ccm_serving::Peer;
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{NodeCtx, text_error};

/// The group every authenticated user is in.
const GROUP_AUTHENTICATED: &str = "system:authenticated";
/// The user of requests without credentials.
const USER_ANONYMOUS: &str = "system:anonymous";
/// The group of requests without credentials.
const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";
/// How long one TokenReview or SubjectAccessReview may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// The most answers a cache keeps (beyond that, expired ones go, then all).
const MAX_CACHED: usize = 4096;

/// How a kubelet authorizes the requests it authenticated (`authorization.mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KubeletAuthorizationMode {
    /// A `SubjectAccessReview` to the API server for each request (cached); the
    /// `KubeletConfiguration` default.
    #[default]
    Webhook,
    /// Every authenticated request is allowed (kubelet's command-line default).
    AlwaysAllow,
}

/// The kubelet's `authentication` and `authorization` settings; the default is the
/// `KubeletConfiguration` default (no anonymous requests, tokens by TokenReview, the
/// Webhook mode), with no client CA: set [`client_ca`](Self::client_ca) so that the API
/// server's `--kubelet-client-certificate` is accepted.
#[derive(Clone)]
pub struct KubeletAuthConfig {
    /// `authentication.x509.clientCAFile`: the PEM bundle client certificates are verified
    /// against; `None`: client certificates are not accepted.
    pub client_ca: Option<String>,
    /// `authentication.anonymous.enabled`: requests without credentials are served as
    /// `system:anonymous` (then authorized) instead of refused with a 401.
    pub anonymous: bool,
    /// `authentication.webhook.enabled`: bearer tokens are checked by TokenReview.
    pub webhook_authentication: bool,
    /// `authentication.webhook.cacheTTL`.
    pub authentication_cache_ttl: Duration,
    /// `authorization.mode`.
    pub authorization: KubeletAuthorizationMode,
    /// `authorization.webhook.cacheAuthorizedTTL`.
    pub authorized_cache_ttl: Duration,
    /// `authorization.webhook.cacheUnauthorizedTTL`.
    pub unauthorized_cache_ttl: Duration,
}

impl Default for KubeletAuthConfig {
    fn default() -> Self {
        KubeletAuthConfig {
            client_ca: None,
            anonymous: false,
            webhook_authentication: true,
            authentication_cache_ttl: Duration::from_secs(120),
            authorization: KubeletAuthorizationMode::Webhook,
            authorized_cache_ttl: Duration::from_secs(300),
            unauthorized_cache_ttl: Duration::from_secs(30),
        }
    }
}

impl std::fmt::Debug for KubeletAuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletAuthConfig")
            .field("client_ca", &self.client_ca.is_some())
            .field("anonymous", &self.anonymous)
            .field("webhook_authentication", &self.webhook_authentication)
            .field("authorization", &self.authorization)
            .finish_non_exhaustive()
    }
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) groups: Vec<String>,
    pub(crate) extra: BTreeMap<String, Vec<String>>,
}

impl User {
    fn authenticated(mut self) -> User {
        if !self.groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
            self.groups.push(GROUP_AUTHENTICATED.into());
        }
        self
    }
}

/// A small cache with a time to live per entry, on tokio time.
#[derive(Debug)]
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        self.entries
            .lock()
            .get(key)
            .filter(|(_, expires)| *expires > Instant::now())
            .map(|(v, _)| v.clone())
    }

    fn put(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock();
        if entries.len() >= MAX_CACHED {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= MAX_CACHED {
                entries.clear();
            }
        }
        entries.insert(key, (value, now + ttl));
    }
}

/// What a SubjectAccessReview asks: the user, the verb and the `nodes` subresource.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct AccessKey {
    user: User,
    verb: &'static str,
    subresource: &'static str,
}

/// One kubelet's authenticator and authorizer, shared by its requests.
pub(crate) struct KubeletAuth {
    config: KubeletAuthConfig,
    node: String,
    /// The client the kubelet makes its reviews through (its own identity).
    client: Client,
    tokens: TtlCache<[u8; 32], Result<User, String>>,
    access: TtlCache<AccessKey, bool>,
    /// Reviews sent to the API server (TokenReviews and SubjectAccessReviews), for tests
    /// of the caches.
    reviews: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for KubeletAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletAuth")
            .field("node", &self.node)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KubeletAuth {
    pub(crate) fn new(config: KubeletAuthConfig, node: String, client: Client) -> Self {
        KubeletAuth {
            config,
            node,
            client,
            tokens: TtlCache::new(),
            access: TtlCache::new(),
            reviews: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Reviews sent so far.
    pub(crate) fn reviews(&self) -> u64 {
        self.reviews.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count_review(&self) {
        self.reviews
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The user a verified client certificate names (with `system:authenticated`).
    fn certificate_user(&self, request: &Request) -> Option<User> {
        let identity = request
            .extensions()
            .get::<Peer>()
            .and_then(|p| p.certificate.as_ref())?;
        Some(
            User {
                name: identity.user.clone(),
                groups: identity.groups.clone(),
                ..User::default()
            }
            .authenticated(),
        )
    }

    /// The user of a request without a client certificate: its bearer token's by
    /// TokenReview, else anonymous when allowed; `Err` is a 401.
    async fn authenticate_token(&self, token: Option<String>) -> Result<User, ()> {
        if let Some(token) = token.as_deref() {
            if !self.config.webhook_authentication {
                return Err(());
            }
            return self.review_token(token).await.map_err(|reason| {
                tracing::debug!(node = %self.node, %reason, "bearer token refused");
            });
        }
        if self.config.anonymous {
            return Ok(User {
                name: USER_ANONYMOUS.into(),
                groups: vec![GROUP_UNAUTHENTICATED.into()],
                ..User::default()
            });
        }
        Err(())
    }

    /// A TokenReview of `token` (cached by its SHA-256, failures to review excepted).
    async fn review_token(&self, token: &str) -> Result<User, String> {
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        if let Some(cached) = self.tokens.get(&key) {
            return cached;
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        self.count_review();
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("TokenReview timed out after {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| format!("TokenReview failed: {e}"))?;
        let status = answer.status.unwrap_or_default();
        let result = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Ok(User {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }
            .authenticated()),
            _ => Err(status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "invalid bearer token".into())),
        };
        self.tokens
            .put(key, result.clone(), self.config.authentication_cache_ttl);
        result
    }

    /// Whether `user` may `verb` the node's `subresource`: `Err` when the review could not
    /// be made.
    async fn authorize(
        &self,
        user: &User,
        verb: &'static str,
        subresource: &'static str,
    ) -> Result<bool, String> {
        if self.config.authorization == KubeletAuthorizationMode::AlwaysAllow {
            return Ok(true);
        }
        let key = AccessKey {
            user: user.clone(),
            verb,
            subresource,
        };
        if let Some(allowed) = self.access.get(&key) {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(subresource.into()),
                    name: Some(self.node.clone()),
                    ..ResourceAttributes::default()
                }),
                non_resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        self.count_review();
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("SubjectAccessReview timed out after {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let ttl = if allowed {
            self.config.authorized_cache_ttl
        } else {
            self.config.unauthorized_cache_ttl
        };
        self.access.put(key, allowed, ttl);
        Ok(allowed)
    }
}

/// The API verb of an HTTP method (`GetRequestAttributes`); empty for a method kubelet
/// maps to no verb (no rule allows it).
pub(crate) fn verb_of(method: &Method) -> &'static str {
    match *method {
        Method::POST => "create",
        Method::GET => "get",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// `isSubpath`: `path` is `prefix` or under it.
fn is_subpath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|r| r.starts_with('/'))
}

/// The `nodes` subresource a kubelet path is authorized as (`NodeAuthorizerAttributesGetter`
/// with `KubeletFineGrainedAuthz` off, kubelet v1.32's default).
pub(crate) fn subresource_of(path: &str) -> &'static str {
    if is_subpath(path, "/stats") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs") {
        "log"
    } else if is_subpath(path, "/checkpoint") {
        "checkpoint"
    } else {
        "proxy"
    }
}

/// The filter in front of every path (`InstallAuthFilter`).
pub(crate) async fn filter(State(ctx): State<NodeCtx>, request: Request, next: Next) -> Response {
    let auth = &ctx.auth;
    let authenticated = match auth.certificate_user(&request) {
        Some(user) => Ok(user),
        None => {
            let token = ccm_serving::bearer_token(request.headers()).map(str::to_owned);
            auth.authenticate_token(token).await
        }
    };
    let Ok(user) = authenticated else {
        return text_error(StatusCode::UNAUTHORIZED, "Unauthorized");
    };
    let verb = verb_of(request.method());
    let subresource = subresource_of(request.uri().path());
    let describe = || {
        format!(
            "(user={}, verb={verb}, resource=nodes, subresource={subresource})",
            user.name
        )
    };
    match auth.authorize(&user, verb, subresource).await {
        Ok(true) => next.run(request).await,
        Ok(false) => {
            tracing::debug!(node = %auth.node, user = %user.name, verb, subresource, "forbidden");
            text_error(StatusCode::FORBIDDEN, format!("Forbidden {}", describe()))
        }
        Err(error) => {
            tracing::warn!(node = %auth.node, %error, "authorization error");
            text_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Authorization error {}", describe()),
            )
        }
    }
}

/// The client-certificate verifier of a kubelet's TLS server: certificates verified
/// against `client_ca` when one is given, optional (a request without one may carry a
/// bearer token); none accepted without a CA.
pub(crate) fn client_verifier(
    client_ca: Option<&str>,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let Some(pem) = client_ca else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let der = der.map_err(|e| format!("client CA: {e}"))?;
        roots.add(der).map_err(|e| format!("client CA: {e}"))?;
    }
    if roots.is_empty() {
        return Err("client CA: no certificate found".into());
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .allow_unauthenticated()
            .build()
            .map_err(|e| format!("client CA: {e}"))?;
    Ok(Some(verifier))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pkg/kubelet/server/auth.go GetRequestAttributes`: the subresource by path, the verb
    /// by method.
    #[test]
    fn kubelet_paths_map_to_node_subresources_as_upstream() {
        for (path, want) in [
            ("/stats/summary", "stats"),
            ("/stats", "stats"),
            ("/metrics/resource", "metrics"),
            ("/metrics", "metrics"),
            ("/logs/kubelet.log", "log"),
            ("/checkpoint/ns/pod/c", "checkpoint"),
            ("/healthz", "proxy"),
            ("/pods", "proxy"),
            ("/containerLogs/ns/pod/c", "proxy"),
            ("/exec/ns/pod/c", "proxy"),
            ("/statsx", "proxy"),
            ("/metricsfoo/x", "proxy"),
        ] {
            assert_eq!(subresource_of(path), want, "{path}");
        }
        assert_eq!(verb_of(&Method::GET), "get");
        assert_eq!(verb_of(&Method::POST), "create");
        assert_eq!(verb_of(&Method::PUT), "update");
        assert_eq!(verb_of(&Method::PATCH), "patch");
        assert_eq!(verb_of(&Method::DELETE), "delete");
        assert_eq!(verb_of(&Method::OPTIONS), "");
    }

    /// kubelet's webhook caches: an answer is reused until its TTL passes, and a zero TTL
    /// caches nothing.
    #[tokio::test(start_paused = true)]
    async fn review_answers_are_reused_until_their_ttl_passes() {
        let cache: TtlCache<&str, bool> = TtlCache::new();
        cache.put("a", true, Duration::from_secs(30));
        cache.put("z", true, Duration::ZERO);
        assert_eq!(cache.get(&"a"), Some(true));
        assert_eq!(cache.get(&"z"), None);
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(cache.get(&"a"), Some(true));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(cache.get(&"a"), None);
    }
}
