//! Authentication of requests from the network, as kube-apiserver's union authenticator:
//! a verified TLS client certificate (CN = user, O = groups), else a bearer token
//! (service-account JWTs), else anonymous. Anonymous requests are served only on
//! `/healthz`, `/livez`, `/readyz` and `/version` (KEP-4633: anonymous allowed on
//! configured endpoints) and get kube-apiserver's 401 `Status` everywhere else; a bearer
//! token that does not authenticate is a 401 wherever it is sent.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    http::HeaderMap,
    middleware::Next,
    response::{IntoResponse, Response},
};
use ccm_serving::Peer;
pub use ccm_serving::bearer_token;

use super::{UserInfo, token::TokenAuthenticator};
use crate::storage::status::ApiError;

/// The paths anonymous requests may reach (KEP-4633's `anonymous.conditions`, as
/// kube-apiserver's structured authentication configuration defaults them for health).
pub const ANONYMOUS_PATHS: [&str; 4] = ["/healthz", "/livez", "/readyz", "/version"];

/// Authenticates requests; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    tokens: Option<Arc<TokenAuthenticator>>,
}

/// Why a request's credentials were refused (its message is logged, not returned: the
/// client sees kube-apiserver's plain `Unauthorized`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    /// The request names no identity and the path is not open to anonymous requests.
    #[error("anonymous request to a path that needs authentication")]
    Anonymous,
    /// A bearer token was given but not accepted.
    #[error("invalid bearer token: {0}")]
    Token(String),
}

impl Authenticator {
    /// Client certificates only (bearer tokens are refused).
    pub fn new() -> Self {
        Authenticator::default()
    }

    /// Also accepts the bearer tokens `tokens` verifies.
    pub fn with_tokens(mut self, tokens: Arc<TokenAuthenticator>) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// The token authenticator, if any.
    pub fn tokens(&self) -> Option<&Arc<TokenAuthenticator>> {
        self.tokens.as_ref()
    }

    /// The identity of a request to `path` carrying `headers` on a connection whose client
    /// certificate said `peer`.
    pub async fn authenticate(
        &self,
        peer: Option<&UserInfo>,
        headers: &HeaderMap,
        path: &str,
    ) -> Result<UserInfo, AuthnError> {
        if let Some(user) = peer {
            return Ok(user.clone());
        }
        if let Some(token) = bearer_token(headers) {
            let Some(tokens) = &self.tokens else {
                return Err(AuthnError::Token(
                    "no token authenticator configured".into(),
                ));
            };
            return tokens
                .authenticate(token, None)
                .await
                .map(|(user, _)| user)
                .map_err(|e| AuthnError::Token(e.to_string()));
        }
        if ANONYMOUS_PATHS.contains(&path) {
            Ok(UserInfo::anonymous())
        } else {
            Err(AuthnError::Anonymous)
        }
    }
}

/// The axum middleware: authenticates each request, puts its [`UserInfo`] into the
/// extensions (for the authorizer), or answers 401 `Unauthorized`.
pub async fn layer(
    State(authenticator): State<Authenticator>,
    mut request: Request,
    next: Next,
) -> Response {
    // The verified client certificate of the connection, put into every request by the
    // server ([`crate::serve`]).
    let peer = request
        .extensions()
        .get::<Peer>()
        .and_then(|p| p.certificate.as_ref())
        .map(|c| UserInfo::new(c.user.clone(), c.groups.iter().cloned()));
    let path = request.uri().path().to_owned();
    match authenticator
        .authenticate(peer.as_ref(), request.headers(), &path)
        .await
    {
        Ok(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(error) => {
            tracing::debug!(%path, %error, "unauthorized request");
            ApiError::unauthorized().into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, header};

    use super::*;

    /// KEP-4633: anonymous requests are allowed only on the configured health and version
    /// endpoints; a client certificate's identity wins over everything else.
    #[tokio::test]
    async fn anonymous_only_on_the_configured_endpoints() {
        let authn = Authenticator::new();
        let headers = HeaderMap::new();
        for path in ANONYMOUS_PATHS {
            assert_eq!(
                authn.authenticate(None, &headers, path).await,
                Ok(UserInfo::anonymous())
            );
        }
        assert_eq!(
            authn.authenticate(None, &headers, "/api/v1/nodes").await,
            Err(AuthnError::Anonymous)
        );
        let alice = UserInfo::new("alice", ["dev"]);
        assert_eq!(
            authn
                .authenticate(Some(&alice), &headers, "/api/v1/nodes")
                .await,
            Ok(alice)
        );
        let mut with_token = HeaderMap::new();
        with_token.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert!(matches!(
            authn.authenticate(None, &with_token, "/healthz").await,
            Err(AuthnError::Token(_))
        ));
    }
}
