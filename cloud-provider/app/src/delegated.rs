//! Delegated authentication and authorization of the secure port, as upstream's
//! `DelegatingAuthenticationOptions` and `DelegatingAuthorizationOptions`.
//!
//! Authentication, in upstream's order (a union that fails on error, then anonymous):
//! 1. a client certificate verified against the client CA during the TLS handshake
//!    (`--client-ca-file`, else the `client-ca-file` key of the ConfigMap
//!    `kube-system/extension-apiserver-authentication` unless `--authentication-skip-lookup`);
//! 2. a bearer token, checked with a `TokenReview` against the cluster
//!    (`--authentication-kubeconfig`, else the manager's own connection); answers are
//!    cached for `--authentication-token-webhook-cache-ttl` (10 s), keyed by the token's
//!    SHA-256. A token that does not authenticate is a 401, wherever it is sent;
//! 3. no credentials: `system:anonymous` in `system:unauthenticated` (upstream enables
//!    anonymous authentication on the delegated port).
//!
//! Authorization: `--authorization-always-allow-paths` (default `/healthz,/readyz,/livez`;
//! exact paths, or prefixes ending in `*`) and the group `system:masters` are allowed
//! without asking; everything else is a `SubjectAccessReview` for the non-resource path and
//! the lower-cased method (`get /metrics`) against the cluster
//! (`--authorization-kubeconfig`, else the manager's connection), cached for
//! `--authorization-webhook-cache-authorized-ttl` / `-unauthorized-ttl` (10 s each). A
//! denial is a 403 `Status` with upstream's message (`forbidden: User "system:anonymous"
//! cannot get path "/metrics"`); a review that cannot be made is a 500.
//!
//! Beyond upstream, which falls back to the in-cluster configuration: without the
//! kubeconfig flags the reviews go through the manager's own connection, which is the
//! in-cluster one inside a pod and also works with `--kubeconfig`.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::secure_serving::Peer;
use ccm_serving::bearer_token;

/// The ConfigMap a delegating server reads its client CA from when `--client-ca-file` is not
/// given (upstream's `extension-apiserver-authentication` in `kube-system`).
pub(crate) const AUTHENTICATION_CONFIGMAP: (&str, &str) =
    ("kube-system", "extension-apiserver-authentication");
/// The always-allowed group (`system:masters`).
pub(crate) const GROUP_MASTERS: &str = "system:masters";
/// The group every authenticated user is in.
pub(crate) const GROUP_AUTHENTICATED: &str = "system:authenticated";
/// How long a TokenReview or SubjectAccessReview may take (upstream's `TokenRequestTimeout`
/// and `ClientTimeout`, 10 s each).
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// The user of requests without credentials.
pub(crate) const USER_ANONYMOUS: &str = "system:anonymous";
/// The group of requests without credentials.
pub(crate) const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct User {
    /// The user name.
    pub name: String,
    /// The UID, when the authenticator gives one.
    pub uid: String,
    /// The groups.
    pub groups: Vec<String>,
    /// Extra attributes (a service-account token's pod name, …).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    /// `system:anonymous` in `system:unauthenticated`.
    pub(crate) fn anonymous() -> User {
        User {
            name: USER_ANONYMOUS.into(),
            groups: vec![GROUP_UNAUTHENTICATED.into()],
            ..User::default()
        }
    }

    /// Adds `system:authenticated` when missing (upstream's `AuthenticatedGroupAdder`).
    fn authenticated(mut self) -> User {
        if !self.groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
            self.groups.push(GROUP_AUTHENTICATED.into());
        }
        self
    }
}

/// Why authentication could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum DelegationError {
    /// The client CA ConfigMap could not be read and the failure is not tolerated.
    #[error(
        "unable to load configmap based request-header-client-ca-file: {0} (--authentication-tolerate-lookup-failure to start anyway)"
    )]
    Lookup(String),
}

/// A small TTL cache on tokio time (so paused-time tests see expiry).
#[derive(Debug)]
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    const MAX: usize = 4096;

    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock();
        entries
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
        if entries.len() >= Self::MAX {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= Self::MAX {
                entries.clear();
            }
        }
        entries.insert(key, (value, now + ttl));
    }
}

/// Checks bearer tokens with `TokenReview`s, caching the answers.
pub(crate) struct TokenReviewer {
    client: kube::Client,
    ttl: Duration,
    cache: TtlCache<[u8; 32], Result<User, String>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// Reviews through `client`; answers are kept for `ttl` (0 = not cached).
    pub(crate) fn new(client: kube::Client, ttl: Duration) -> Self {
        TokenReviewer {
            client,
            ttl,
            cache: TtlCache::new(),
        }
    }

    /// The user `token` authenticates as, or why not (a review that cannot be made is not
    /// cached).
    pub(crate) async fn review(&self, token: &str) -> Result<User, String> {
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        if let Some(cached) = self.cache.get(&key) {
            return cached;
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api = kube::Api::<TokenReview>::all(self.client.clone());
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            api.create(&kube::api::PostParams::default(), &review),
        )
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
        self.cache.put(key, result.clone(), self.ttl);
        result
    }
}

/// What a request is asking for: a non-resource path and a verb.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Attributes {
    user: String,
    uid: String,
    groups: Vec<String>,
    extra: Vec<(String, Vec<String>)>,
    verb: String,
    path: String,
}

/// Authorizes non-resource requests with `SubjectAccessReview`s, caching the answers.
pub(crate) struct AccessReviewer {
    client: kube::Client,
    allowed_ttl: Duration,
    denied_ttl: Duration,
    cache: TtlCache<Attributes, (bool, String)>,
}

impl std::fmt::Debug for AccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessReviewer")
            .field("allowed_ttl", &self.allowed_ttl)
            .field("denied_ttl", &self.denied_ttl)
            .finish_non_exhaustive()
    }
}

impl AccessReviewer {
    /// Reviews through `client`; allowed answers are kept `allowed_ttl`, denied ones
    /// `denied_ttl`.
    pub(crate) fn new(client: kube::Client, allowed_ttl: Duration, denied_ttl: Duration) -> Self {
        AccessReviewer {
            client,
            allowed_ttl,
            denied_ttl,
            cache: TtlCache::new(),
        }
    }

    async fn review(&self, attributes: Attributes) -> Result<(bool, String), String> {
        if let Some(cached) = self.cache.get(&attributes) {
            return Ok(cached);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(attributes.user.clone()),
                uid: Some(attributes.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(attributes.groups.clone()),
                extra: Some(attributes.extra.iter().cloned().collect())
                    .filter(|e: &BTreeMap<_, _>| !e.is_empty()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(attributes.path.clone()),
                    verb: Some(attributes.verb.clone()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let api = kube::Api::<SubjectAccessReview>::all(self.client.clone());
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            api.create(&kube::api::PostParams::default(), &review),
        )
        .await
        .map_err(|_| format!("SubjectAccessReview timed out after {REVIEW_TIMEOUT:?}"))?
        .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
        let status = answer.status.unwrap_or_default();
        let decision = (status.allowed, status.reason.unwrap_or_default());
        let ttl = if decision.0 {
            self.allowed_ttl
        } else {
            self.denied_ttl
        };
        self.cache.put(attributes, decision.clone(), ttl);
        Ok(decision)
    }
}

/// The secure port's authentication and authorization; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct DelegatedAuth {
    tokens: Option<Arc<TokenReviewer>>,
    access: Option<Arc<AccessReviewer>>,
    always_allow_paths: Arc<Vec<String>>,
    always_allow_groups: Arc<Vec<String>>,
}

/// How a request fared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AccessDecision {
    /// Serve it.
    Allow,
    /// 401: credentials given but not accepted.
    Unauthorized(String),
    /// 403: authenticated, not allowed.
    Forbidden(String),
    /// 500: the authorization review failed.
    Error(String),
}

impl DelegatedAuth {
    /// Authentication by `tokens`, authorization by `access`, `always_allow_paths` open to
    /// all and `system:masters` allowed everything. Without a reviewer, tokens are refused
    /// and only the always-allowed paths and groups are served.
    pub(crate) fn new(
        tokens: Option<TokenReviewer>,
        access: Option<AccessReviewer>,
        always_allow_paths: Vec<String>,
    ) -> Self {
        DelegatedAuth {
            tokens: tokens.map(Arc::new),
            access: access.map(Arc::new),
            always_allow_paths: Arc::new(always_allow_paths),
            always_allow_groups: Arc::new(vec![GROUP_MASTERS.to_owned()]),
        }
    }

    /// Who sent a request with `headers` over a connection from `peer`.
    pub(crate) async fn authenticate(
        &self,
        peer: Option<&Peer>,
        headers: &HeaderMap,
    ) -> Result<User, String> {
        if let Some(identity) = peer.and_then(|p| p.certificate.as_ref()) {
            return Ok(User {
                name: identity.user.clone(),
                groups: identity.groups.clone(),
                ..User::default()
            }
            .authenticated());
        }
        if let Some(token) = bearer_token(headers) {
            return match &self.tokens {
                Some(tokens) => tokens.review(token).await,
                None => Err("no token authenticator configured".into()),
            };
        }
        Ok(User::anonymous())
    }

    fn path_always_allowed(&self, path: &str) -> bool {
        self.always_allow_paths
            .iter()
            .any(|allowed| match allowed.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => allowed == path,
            })
    }

    /// Whether `user` may `verb` the non-resource `path`.
    pub(crate) async fn authorize(&self, user: &User, verb: &str, path: &str) -> AccessDecision {
        if self.path_always_allowed(path)
            || user
                .groups
                .iter()
                .any(|g| self.always_allow_groups.contains(g))
        {
            return AccessDecision::Allow;
        }
        let denied = |reason: &str| {
            let mut message = format!(
                "forbidden: User {:?} cannot {verb} path {:?}",
                user.name, path
            );
            if !reason.is_empty() {
                message.push_str(": ");
                message.push_str(reason);
            }
            AccessDecision::Forbidden(message)
        };
        let Some(access) = &self.access else {
            return denied("");
        };
        let attributes = Attributes {
            user: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user
                .extra
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            verb: verb.to_owned(),
            path: path.to_owned(),
        };
        match access.review(attributes).await {
            Ok((true, _)) => AccessDecision::Allow,
            Ok((false, reason)) => denied(&reason),
            Err(error) => AccessDecision::Error(error),
        }
    }

    /// Authenticates then authorizes a request.
    pub(crate) async fn decide(
        &self,
        peer: Option<&Peer>,
        headers: &HeaderMap,
        method: &str,
        path: &str,
    ) -> AccessDecision {
        let user = match self.authenticate(peer, headers).await {
            Ok(user) => user,
            Err(reason) => return AccessDecision::Unauthorized(reason),
        };
        self.authorize(&user, &method.to_ascii_lowercase(), path)
            .await
    }
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The axum middleware: serves the request when [`DelegatedAuth::decide`] allows it, else
/// answers upstream's 401, 403 or 500 `Status`.
pub(crate) async fn layer(
    State(auth): State<DelegatedAuth>,
    request: Request,
    next: Next,
) -> Response {
    // The connection's client, put into every request by the serving loop.
    let peer = request.extensions().get::<Peer>().cloned();
    let path = request.uri().path().to_owned();
    let method = request.method().as_str().to_owned();
    match auth
        .decide(peer.as_ref(), request.headers(), &method, &path)
        .await
    {
        AccessDecision::Allow => next.run(request).await,
        AccessDecision::Unauthorized(reason) => {
            tracing::debug!(%path, %reason, "unauthorized request");
            status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
        }
        AccessDecision::Forbidden(message) => {
            tracing::debug!(%path, %message, "forbidden request");
            status(StatusCode::FORBIDDEN, "Forbidden", &message)
        }
        AccessDecision::Error(error) => {
            tracing::warn!(%path, %error, "authorization failed");
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                &format!("Internal Server Error: {path:?}: {error}"),
            )
        }
    }
}

/// The client CA from `kube-system/extension-apiserver-authentication` (key
/// `client-ca-file`), as upstream's `lookupMissingConfigInCluster`: a missing ConfigMap or
/// key is no CA (client certificates are then not accepted); any other failure is an error
/// unless `tolerate` (then a warning).
pub(crate) async fn lookup_client_ca(
    client: &kube::Client,
    tolerate: bool,
) -> Result<Option<String>, DelegationError> {
    let (namespace, name) = AUTHENTICATION_CONFIGMAP;
    let api = kube::Api::<ConfigMap>::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(found) => Ok(found
            .and_then(|cm| cm.data)
            .and_then(|mut data| data.remove("client-ca-file"))
            .filter(|ca| !ca.trim().is_empty())),
        Err(error) => {
            let message = format!("configmap/{name} in {namespace}: {error}");
            if tolerate {
                tracing::warn!(
                    "Error looking up in-cluster authentication configuration: {message}; continuing without client certificate authentication"
                );
                Ok(None)
            } else {
                Err(DelegationError::Lookup(message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secure_serving::CertificateIdentity;
    use axum::http::HeaderValue;

    fn peer(user: &str, groups: &[&str]) -> Peer {
        Peer {
            addr: "127.0.0.1:1".parse().unwrap(),
            certificate: Some(CertificateIdentity {
                user: user.into(),
                groups: groups.iter().map(|g| g.to_string()).collect(),
            }),
        }
    }

    fn defaults() -> Vec<String> {
        ["/healthz", "/readyz", "/livez"]
            .map(str::to_owned)
            .to_vec()
    }

    /// Upstream's delegated authorizer with no SubjectAccessReview client: always-allowed
    /// paths for everyone (anonymous included), `system:masters` everywhere, nothing else.
    #[tokio::test]
    async fn always_allowed_paths_and_masters_need_no_review() {
        let auth = DelegatedAuth::new(None, None, {
            let mut paths = defaults();
            paths.push("/debug/*".into());
            paths
        });
        let none = HeaderMap::new();
        for path in ["/healthz", "/readyz", "/livez", "/debug/flags/v"] {
            assert_eq!(
                auth.decide(None, &none, "GET", path).await,
                AccessDecision::Allow
            );
        }
        assert_eq!(
            auth.decide(None, &none, "GET", "/metrics").await,
            AccessDecision::Forbidden(
                "forbidden: User \"system:anonymous\" cannot get path \"/metrics\"".into()
            )
        );
        assert_eq!(
            auth.decide(None, &none, "GET", "/healthz/extra").await,
            AccessDecision::Forbidden(
                "forbidden: User \"system:anonymous\" cannot get path \"/healthz/extra\"".into()
            ),
            "always-allow paths are exact unless they end in *"
        );
        let admin = peer("admin", &[GROUP_MASTERS]);
        assert_eq!(
            auth.decide(Some(&admin), &none, "GET", "/metrics").await,
            AccessDecision::Allow
        );
        let alice = peer("alice", &["dev"]);
        assert!(matches!(
            auth.decide(Some(&alice), &none, "GET", "/configz").await,
            AccessDecision::Forbidden(_)
        ));
        // A bearer token with nobody to review it is refused (401), even on /healthz.
        let mut token = HeaderMap::new();
        token.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(matches!(
            auth.decide(None, &token, "GET", "/healthz").await,
            AccessDecision::Unauthorized(_)
        ));
    }

    #[test]
    fn certificate_users_are_authenticated() {
        let user = User {
            name: "a".into(),
            ..User::default()
        }
        .authenticated()
        .authenticated();
        assert_eq!(user.groups, vec![GROUP_AUTHENTICATED]);
    }

    /// An in-memory API answering reviews: tokens `good-*` authenticate as `alice`, the SAR
    /// allows `alice` only; counts the reviews it answers.
    fn review_api() -> (kube::Client, Arc<[std::sync::atomic::AtomicUsize; 2]>) {
        use axum::routing::post;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let counts = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
        let (tokens, access) = (counts.clone(), counts.clone());
        let router = axum::Router::new()
            .route(
                "/apis/authentication.k8s.io/v1/tokenreviews",
                post(move |axum::Json(review): axum::Json<serde_json::Value>| {
                    tokens[0].fetch_add(1, Ordering::SeqCst);
                    let good = review["spec"]["token"]
                        .as_str()
                        .is_some_and(|t| t.starts_with("good-"));
                    let status = if good {
                        serde_json::json!({"authenticated": true,
                            "user": {"username": "alice", "groups": ["dev"]}})
                    } else {
                        serde_json::json!({"authenticated": false, "error": "bad token"})
                    };
                    async move {
                        axum::Json(serde_json::json!({
                            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                            "spec": review["spec"], "status": status}))
                    }
                }),
            )
            .route(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                post(move |axum::Json(review): axum::Json<serde_json::Value>| {
                    access[1].fetch_add(1, Ordering::SeqCst);
                    let allowed = review["spec"]["user"] == "alice"
                        && review["spec"]["nonResourceAttributes"]
                            == serde_json::json!({"path": "/metrics", "verb": "get"});
                    async move {
                        axum::Json(serde_json::json!({
                            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                            "spec": review["spec"],
                            "status": {"allowed": allowed, "reason": if allowed { "" } else { "no RBAC rule" }}}))
                    }
                }),
            );
        (kube::Client::new(router, "default"), counts)
    }

    /// Upstream's caches: TokenReview answers (good and bad) for
    /// `--authentication-token-webhook-cache-ttl`, SubjectAccessReview answers for
    /// `--authorization-webhook-cache-authorized-ttl` / `-unauthorized-ttl`; a denied review
    /// gives upstream's 403 message with the reviewer's reason; a bad token is 401.
    #[tokio::test(start_paused = true)]
    async fn reviews_are_cached_for_their_ttl() {
        use std::sync::atomic::Ordering;
        let (client, counts) = review_api();
        let auth = DelegatedAuth::new(
            Some(TokenReviewer::new(client.clone(), Duration::from_secs(10))),
            Some(AccessReviewer::new(
                client,
                Duration::from_secs(10),
                Duration::from_secs(5),
            )),
            defaults(),
        );
        let bearer = |token: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            );
            headers
        };
        let reviews = || {
            (
                counts[0].load(Ordering::SeqCst),
                counts[1].load(Ordering::SeqCst),
            )
        };
        let good = bearer("good-1");
        assert_eq!(
            auth.decide(None, &good, "GET", "/metrics").await,
            AccessDecision::Allow
        );
        assert_eq!(
            auth.decide(None, &good, "GET", "/metrics").await,
            AccessDecision::Allow
        );
        assert_eq!(
            reviews(),
            (1, 1),
            "the second request is answered from the caches"
        );
        assert_eq!(
            auth.decide(None, &good, "GET", "/configz").await,
            AccessDecision::Forbidden(
                "forbidden: User \"alice\" cannot get path \"/configz\": no RBAC rule".into()
            )
        );
        assert_eq!(reviews(), (1, 2));
        let bad = bearer("forged");
        assert_eq!(
            auth.decide(None, &bad, "GET", "/healthz").await,
            AccessDecision::Unauthorized("bad token".into())
        );
        auth.decide(None, &bad, "GET", "/healthz").await;
        assert_eq!(reviews(), (2, 2), "refusals are cached too");
        // The denied answer expires first (5 s), then the rest (10 s).
        tokio::time::advance(Duration::from_secs(6)).await;
        auth.decide(None, &good, "GET", "/configz").await;
        auth.decide(None, &good, "GET", "/metrics").await;
        assert_eq!(reviews(), (2, 3));
        tokio::time::advance(Duration::from_secs(5)).await;
        auth.decide(None, &good, "GET", "/metrics").await;
        auth.decide(None, &bad, "GET", "/metrics").await;
        assert_eq!(reviews(), (4, 4));
    }

    /// The caches expire on tokio time.
    #[tokio::test(start_paused = true)]
    async fn ttl_cache_expires() {
        let cache = TtlCache::<u8, u8>::new();
        cache.put(1, 10, Duration::from_secs(10));
        cache.put(2, 20, Duration::ZERO);
        assert_eq!(cache.get(&1), Some(10));
        assert_eq!(cache.get(&2), None, "ttl 0 is not cached");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(cache.get(&1), None);
    }
}
