//! Service-account tokens: JWTs signed ES256 (ECDSA P-256, with ring) by the key in the
//! data directory, with upstream's claims (`iss`, `sub`, `aud`, `exp`, `iat`, `nbf`,
//! `jti`, and `kubernetes.io` {namespace, serviceaccount {name, uid}, pod when bound, and
//! the node that pod runs on}).
//!
//! A token authenticates as `system:serviceaccount:<ns>:<name>` in `system:serviceaccounts`,
//! `system:serviceaccounts:<ns>` and `system:authenticated`, only while its service account
//! (and bound pod) still exists with the UID the token names: a deleted or recreated
//! account's tokens are refused, as kube-apiserver's legacy-lookup-free bound-token
//! validator does (`pkg/serviceaccount/claims.go`); one being deleted still backs them
//! until a minute past its deletion time (the JWT leeway), so a terminating pod keeps its
//! identity through its grace period.

use std::sync::Arc;

use base64::{Engine, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::{
    rand::SystemRandom,
    signature::{
        ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
        UnparsedPublicKey,
    },
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::UserInfo;
use crate::{registry::resources, store::Store};

/// The issuer of the tokens and the API server's default audience
/// (kube-apiserver's `--service-account-issuer` as kubeadm and k3s set it).
pub const DEFAULT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The group of every service account.
pub const GROUP_SERVICE_ACCOUNTS: &str = "system:serviceaccounts";
/// The prefix of a service account's user name.
pub const SERVICE_ACCOUNT_USER_PREFIX: &str = "system:serviceaccount:";
/// The `extra` key naming the pod a token is bound to.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// The `extra` key holding the bound pod's UID.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// The `extra` key holding the token's ID.
pub const EXTRA_CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";
/// The `extra` key naming the node of the pod a token is bound to.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";
/// The `extra` key holding the UID of that node.
pub const EXTRA_NODE_UID: &str = "authentication.kubernetes.io/node-uid";

/// How long after its deletion time an account or bound pod still backs its tokens
/// (`jwt.DefaultLeeway`, which `pkg/serviceaccount/claims.go` uses).
pub const DELETION_LEEWAY_SECONDS: i64 = 60;

/// The clock tokens are checked against, in Unix seconds (tests move it).
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Why a token could not be issued or was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The signing key could not be loaded.
    #[error("service-account key: {0}")]
    Key(String),
    /// The token is not a well-formed ES256 JWT of ours.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// The signature does not verify.
    #[error("invalid signature")]
    Signature,
    /// The issuer is not ours.
    #[error("token issuer {0:?} is not accepted")]
    Issuer(String),
    /// The token has expired or is not valid yet.
    #[error("token has expired or is not yet valid")]
    Expired,
    /// None of the token's audiences is accepted.
    #[error("token audiences {0:?} are invalid for the target audiences")]
    Audience(Vec<String>),
    /// The service account or bound pod is gone, or was recreated.
    #[error("{0}")]
    Revoked(String),
    /// The store failed while checking the account.
    #[error("checking the service account: {0}")]
    Store(String),
}

/// An object a token names (its service account, bound pod, that pod's node): upstream's
/// `ref` of `pkg/serviceaccount/claims.go`, both fields `omitempty`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Name.
    pub name: String,
    /// UID (empty for a node that was not found when the token was issued).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
}

/// The pod a token is bound to, and the node that pod is scheduled to if any (upstream's
/// `ServiceAccountTokenPodNodeInfo`, on by default: the `kubernetes.io.node` claim of a
/// pod-bound token, `pkg/registry/core/serviceaccount/storage/token.go`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodBinding {
    /// The pod: its deletion or recreation invalidates the token.
    pub pod: ObjectRef,
    /// Its node: recorded and reported as the user's `node-name`/`node-uid` extras, not
    /// checked (upstream validates the node only of node-bound tokens).
    pub node: Option<ObjectRef>,
}

/// The `kubernetes.io` private claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub serviceaccount: ObjectRef,
    /// The pod the token is bound to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    /// The node of the bound pod, if it was scheduled when the token was issued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
}

/// The claims of a service-account token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer.
    pub iss: String,
    /// Subject: `system:serviceaccount:<ns>:<name>`.
    pub sub: String,
    /// Audiences.
    pub aud: Vec<String>,
    /// Expiry, Unix seconds.
    pub exp: i64,
    /// Issued at.
    pub iat: i64,
    /// Not before.
    pub nbf: i64,
    /// Token ID.
    pub jti: String,
    /// Kubernetes' claims.
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

/// Issues and verifies service-account tokens.
pub struct TokenAuthenticator {
    key: EcdsaKeyPair,
    key_id: String,
    issuer: String,
    audiences: Vec<String>,
    store: Arc<dyn Store>,
    clock: Clock,
    rng: SystemRandom,
}

impl std::fmt::Debug for TokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAuthenticator")
            .field("key_id", &self.key_id)
            .field("issuer", &self.issuer)
            .field("audiences", &self.audiences)
            .finish_non_exhaustive()
    }
}

/// The current Unix time from the system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| jiff::Timestamp::now().as_second())
}

impl TokenAuthenticator {
    /// An authenticator signing with `key_pem` (PKCS#8 ECDSA P-256, as
    /// [`Pki::service_account_key_pem`](super::pki::Pki::service_account_key_pem)),
    /// checking accounts in `store`; issuer and audience [`DEFAULT_ISSUER`].
    pub fn new(key_pem: &str, store: Arc<dyn Store>) -> Result<Self, TokenError> {
        use rustls::pki_types::{PrivatePkcs8KeyDer, pem::PemObject};
        let der = PrivatePkcs8KeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| TokenError::Key(e.to_string()))?;
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            der.secret_pkcs8_der(),
            &rng,
        )
        .map_err(|e| TokenError::Key(e.to_string()))?;
        let digest = ring::digest::digest(&ring::digest::SHA256, key.public_key().as_ref());
        Ok(TokenAuthenticator {
            key_id: URL_SAFE_NO_PAD.encode(digest.as_ref()),
            key,
            issuer: DEFAULT_ISSUER.to_owned(),
            audiences: vec![DEFAULT_ISSUER.to_owned()],
            store,
            clock: system_clock(),
            rng,
        })
    }

    /// Checks expiry against `clock` instead of the system clock.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The API server's own audiences (what a token must be for unless a TokenReview names
    /// others), and the default audiences of a TokenRequest.
    pub fn audiences(&self) -> &[String] {
        &self.audiences
    }

    /// The current time of the authenticator's clock.
    pub fn now(&self) -> i64 {
        (self.clock)()
    }

    /// Signs a token for the service account `namespace/account` (bound to `pod` and its
    /// node if given), valid for `expiration_seconds` from now, for `audiences`. Returns the
    /// token and its expiry (Unix seconds).
    pub fn issue(
        &self,
        namespace: &str,
        account: ObjectRef,
        pod: Option<PodBinding>,
        audiences: Vec<String>,
        expiration_seconds: i64,
    ) -> Result<(String, i64), TokenError> {
        let now = self.now();
        let (pod, node) = match pod {
            Some(PodBinding { pod, node }) => (Some(pod), node),
            None => (None, None),
        };
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: format!("{SERVICE_ACCOUNT_USER_PREFIX}{namespace}:{}", account.name),
            aud: audiences,
            exp: now + expiration_seconds,
            iat: now,
            nbf: now,
            jti: uuid::Uuid::new_v4().to_string(),
            kubernetes: KubernetesClaims {
                namespace: namespace.to_owned(),
                serviceaccount: account,
                pod,
                node,
            },
        };
        let header = serde_json::json!({"alg": "ES256", "kid": self.key_id});
        let signing_input = format!("{}.{}", b64_json(&header), b64_json(&claims));
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| TokenError::Key("signing failed".into()))?;
        let exp = claims.exp;
        Ok((
            format!(
                "{signing_input}.{}",
                URL_SAFE_NO_PAD.encode(signature.as_ref())
            ),
            exp,
        ))
    }

    /// Verifies `token` (signature, issuer, time) and returns its claims, without checking
    /// audiences or the account.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("not a JWS compact serialization"));
        };
        let decode = |part: &str| {
            URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| TokenError::Malformed("invalid base64url"))
        };
        let header: Value = serde_json::from_slice(&decode(header)?)
            .map_err(|_| TokenError::Malformed("invalid header"))?;
        if header["alg"] != "ES256" {
            return Err(TokenError::Malformed("unsupported algorithm"));
        }
        let public = UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, self.key.public_key());
        let signing_input_len = token.len() - signature.len() - 1;
        public
            .verify(&token.as_bytes()[..signing_input_len], &decode(signature)?)
            .map_err(|_| TokenError::Signature)?;
        let claims: Claims = serde_json::from_slice(&decode(payload)?)
            .map_err(|_| TokenError::Malformed("invalid claims"))?;
        if claims.iss != self.issuer {
            return Err(TokenError::Issuer(claims.iss));
        }
        let now = self.now();
        if now >= claims.exp || now < claims.nbf {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }

    /// Authenticates `token` for `audiences` (the API server's own when `None`): returns the
    /// user and the audiences of the token that matched.
    pub async fn authenticate(
        &self,
        token: &str,
        audiences: Option<&[String]>,
    ) -> Result<(UserInfo, Vec<String>), TokenError> {
        let claims = self.verify(token)?;
        let wanted = audiences.unwrap_or(&self.audiences);
        let matched: Vec<String> = wanted
            .iter()
            .filter(|a| claims.aud.contains(a))
            .cloned()
            .collect();
        if matched.is_empty() {
            return Err(TokenError::Audience(claims.aud));
        }
        let k = &claims.kubernetes;
        let account = &k.serviceaccount;
        self.check_alive(
            &resources::SERVICE_ACCOUNTS.key(Some(&k.namespace), &account.name),
            &format!("service account {}/{}", k.namespace, account.name),
            &account.uid,
        )
        .await?;
        let mut user = UserInfo::new(
            format!(
                "{SERVICE_ACCOUNT_USER_PREFIX}{}:{}",
                k.namespace, account.name
            ),
            [
                GROUP_SERVICE_ACCOUNTS.to_owned(),
                format!("{GROUP_SERVICE_ACCOUNTS}:{}", k.namespace),
            ],
        );
        user.uid = account.uid.clone();
        if let Some(pod) = &k.pod {
            self.check_alive(
                &resources::PODS.key(Some(&k.namespace), &pod.name),
                &format!("pod {}/{}", k.namespace, pod.name),
                &pod.uid,
            )
            .await?;
            user.extra
                .insert(EXTRA_POD_NAME.to_owned(), vec![pod.name.clone()]);
            user.extra
                .insert(EXTRA_POD_UID.to_owned(), vec![pod.uid.clone()]);
            // `claims.go`: the node claims of a pod-bound token are taken as they are;
            // `ServiceAccountInfo.UserInfo` reports the UID only with the name.
            if let Some(node) = k.node.as_ref().filter(|n| !n.name.is_empty()) {
                user.extra
                    .insert(EXTRA_NODE_NAME.to_owned(), vec![node.name.clone()]);
                if !node.uid.is_empty() {
                    user.extra
                        .insert(EXTRA_NODE_UID.to_owned(), vec![node.uid.clone()]);
                }
            }
        }
        user.extra.insert(
            EXTRA_CREDENTIAL_ID.to_owned(),
            vec![format!("JTI={}", claims.jti)],
        );
        Ok((user, matched))
    }

    /// Refuses the token unless the object at `key` exists, is not being deleted and has
    /// `uid` (upstream: "service account UID (…) does not match claim (…)").
    async fn check_alive(&self, key: &str, what: &str, uid: &str) -> Result<(), TokenError> {
        let kv = self
            .store
            .get(key)
            .await
            .map_err(|e| TokenError::Store(e.to_string()))?
            .ok_or_else(|| TokenError::Revoked(format!("{what} has been deleted")))?;
        let obj: Value =
            serde_json::from_slice(&kv.value).map_err(|e| TokenError::Store(e.to_string()))?;
        let actual = obj["metadata"]["uid"].as_str().unwrap_or("");
        if actual != uid {
            return Err(TokenError::Revoked(format!(
                "{what} UID ({actual}) does not match claim ({uid})"
            )));
        }
        // `claims.go`: things deleted before now minus the JWT leeway (1 min) are invalid,
        // so a pod's own token works through its graceful termination and a minute more
        // (its `deletionTimestamp` is the end of its grace period).
        if let Some(deleted) = obj["metadata"]["deletionTimestamp"].as_str() {
            let deleted_at = deleted
                .parse::<jiff::Timestamp>()
                .map(|t| t.as_second())
                .unwrap_or(i64::MIN);
            if deleted_at < self.now() - DELETION_LEEWAY_SECONDS {
                return Err(TokenError::Revoked(
                    "service account token has been invalidated".into(),
                ));
            }
        }
        Ok(())
    }
}

fn b64_json<T: Serialize>(value: &T) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use bytes::Bytes;
    use serde_json::json;

    use super::*;
    use crate::store::MemoryStore;

    fn key_pem() -> String {
        rcgen::KeyPair::generate().unwrap().serialize_pem()
    }

    async fn account(store: &Arc<dyn Store>, uid: &str) {
        let key = resources::SERVICE_ACCOUNTS.key(Some("ns"), "sa");
        let _ = store.delete(&key, None).await;
        let obj = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "sa", "namespace": "ns", "uid": uid}});
        store
            .create(&key, Bytes::from(serde_json::to_vec(&obj).unwrap()))
            .await
            .unwrap();
    }

    fn sa(uid: &str) -> ObjectRef {
        ObjectRef {
            name: "sa".into(),
            uid: uid.into(),
        }
    }

    #[tokio::test]
    async fn tokens_authenticate_as_the_service_account_until_they_expire() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        account(&store, "u1").await;
        let now = Arc::new(AtomicI64::new(1_000_000));
        let clock = now.clone();
        let tokens = TokenAuthenticator::new(&key_pem(), store.clone())
            .unwrap()
            .with_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
        let (token, exp) = tokens
            .issue("ns", sa("u1"), None, vec![DEFAULT_ISSUER.into()], 3600)
            .unwrap();
        assert_eq!(exp, 1_003_600);
        let (user, audiences) = tokens.authenticate(&token, None).await.unwrap();
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "u1");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:ns",
                "system:authenticated"
            ]
        );
        assert_eq!(audiences, [DEFAULT_ISSUER]);
        now.store(exp, Ordering::SeqCst);
        assert_eq!(
            tokens.authenticate(&token, None).await.unwrap_err(),
            TokenError::Expired
        );
    }

    /// `claims.go`: a token bound to a pod being deleted works until a minute past the
    /// pod's deletion time (`jwt.DefaultLeeway`), then says it has been invalidated; once
    /// the pod is gone, it is refused.
    #[tokio::test]
    async fn a_bound_token_outlives_its_pods_deletion_time_by_the_leeway_only() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        account(&store, "u1").await;
        let now = Arc::new(AtomicI64::new(1_800_000_000));
        let clock = now.clone();
        let tokens = TokenAuthenticator::new(&key_pem(), store.clone())
            .unwrap()
            .with_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
        let key = resources::PODS.key(Some("ns"), "p");
        let deleting_at = jiff::Timestamp::from_second(1_800_000_030).unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1",
                         "deletionTimestamp": deleting_at.to_string()}});
        store
            .create(&key, Bytes::from(serde_json::to_vec(&pod).unwrap()))
            .await
            .unwrap();
        let bound = PodBinding {
            pod: ObjectRef {
                name: "p".into(),
                uid: "pod-1".into(),
            },
            node: None,
        };
        let (token, _) = tokens
            .issue(
                "ns",
                sa("u1"),
                Some(bound),
                vec![DEFAULT_ISSUER.into()],
                3600,
            )
            .unwrap();
        let (user, _) = tokens.authenticate(&token, None).await.unwrap();
        assert_eq!(user.extra[EXTRA_POD_NAME], ["p"]);
        now.store(1_800_000_090, Ordering::SeqCst);
        assert!(tokens.authenticate(&token, None).await.is_ok());
        now.store(1_800_000_091, Ordering::SeqCst);
        assert_eq!(
            tokens.authenticate(&token, None).await.unwrap_err(),
            TokenError::Revoked("service account token has been invalidated".into())
        );
        store.delete(&key, None).await.unwrap();
        assert_eq!(
            tokens.authenticate(&token, None).await.unwrap_err(),
            TokenError::Revoked("pod ns/p has been deleted".into())
        );
    }

    /// `pkg/serviceaccount/claims.go`: a pod-bound token carries the pod's node as the
    /// `kubernetes.io.node` claim (`Claims`), and authenticates with the node's name and UID
    /// as `authentication.kubernetes.io/node-name` and `node-uid` extras
    /// (`k8s.io/apiserver/pkg/authentication/serviceaccount/util.go`
    /// `ServiceAccountInfo.UserInfo`: the UID only with the name, and a node not found when
    /// the token was issued has no UID).
    #[tokio::test]
    async fn a_pod_bound_tokens_node_claim_becomes_the_node_extras() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        account(&store, "u1").await;
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "pod-1"}});
        store
            .create(
                &resources::PODS.key(Some("ns"), "p"),
                Bytes::from(serde_json::to_vec(&pod).unwrap()),
            )
            .await
            .unwrap();
        let tokens = TokenAuthenticator::new(&key_pem(), store.clone()).unwrap();
        let bound = |node: Option<ObjectRef>| PodBinding {
            pod: ObjectRef {
                name: "p".into(),
                uid: "pod-1".into(),
            },
            node,
        };
        let node = ObjectRef {
            name: "n1".into(),
            uid: "node-1".into(),
        };
        let (token, _) = tokens
            .issue(
                "ns",
                sa("u1"),
                Some(bound(Some(node))),
                vec![DEFAULT_ISSUER.into()],
                600,
            )
            .unwrap();
        let payload = token.split('.').nth(1).unwrap();
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        assert_eq!(
            claims["kubernetes.io"]["node"],
            json!({"name": "n1", "uid": "node-1"})
        );
        let (user, _) = tokens.authenticate(&token, None).await.unwrap();
        assert_eq!(user.extra[EXTRA_NODE_NAME], ["n1"]);
        assert_eq!(user.extra[EXTRA_NODE_UID], ["node-1"]);
        assert_eq!(user.extra[EXTRA_POD_UID], ["pod-1"]);

        let unknown_node = ObjectRef {
            name: "gone".into(),
            uid: String::new(),
        };
        let (token, _) = tokens
            .issue(
                "ns",
                sa("u1"),
                Some(bound(Some(unknown_node))),
                vec![DEFAULT_ISSUER.into()],
                600,
            )
            .unwrap();
        let (user, _) = tokens.authenticate(&token, None).await.unwrap();
        assert_eq!(user.extra[EXTRA_NODE_NAME], ["gone"]);
        assert!(!user.extra.contains_key(EXTRA_NODE_UID));

        let (unscheduled, _) = tokens
            .issue(
                "ns",
                sa("u1"),
                Some(bound(None)),
                vec![DEFAULT_ISSUER.into()],
                600,
            )
            .unwrap();
        let (user, _) = tokens.authenticate(&unscheduled, None).await.unwrap();
        assert!(!user.extra.contains_key(EXTRA_NODE_NAME));
        assert_eq!(user.extra[EXTRA_POD_NAME], ["p"]);
    }

    #[tokio::test]
    async fn wrong_audience_tampering_and_recreated_accounts_are_refused() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        account(&store, "u1").await;
        let tokens = TokenAuthenticator::new(&key_pem(), store.clone()).unwrap();
        let (other, _) = tokens
            .issue("ns", sa("u1"), None, vec!["vault".into()], 600)
            .unwrap();
        assert!(matches!(
            tokens.authenticate(&other, None).await,
            Err(TokenError::Audience(_))
        ));
        let vault = ["vault".to_owned()];
        assert!(tokens.authenticate(&other, Some(&vault)).await.is_ok());
        // Another key's token does not verify.
        let stranger = TokenAuthenticator::new(&key_pem(), store.clone()).unwrap();
        let (forged, _) = stranger
            .issue("ns", sa("u1"), None, vec![DEFAULT_ISSUER.into()], 600)
            .unwrap();
        assert_eq!(
            tokens.authenticate(&forged, None).await.unwrap_err(),
            TokenError::Signature
        );
        assert!(matches!(
            tokens.authenticate("a.b", None).await,
            Err(TokenError::Malformed(_))
        ));
        let (token, _) = tokens
            .issue("ns", sa("u1"), None, vec![DEFAULT_ISSUER.into()], 600)
            .unwrap();
        account(&store, "u2").await;
        assert!(matches!(
            tokens.authenticate(&token, None).await,
            Err(TokenError::Revoked(_))
        ));
        store
            .delete(&resources::SERVICE_ACCOUNTS.key(Some("ns"), "sa"), None)
            .await
            .unwrap();
        let (fresh, _) = tokens
            .issue("ns", sa("u2"), None, vec![DEFAULT_ISSUER.into()], 600)
            .unwrap();
        assert!(matches!(
            tokens.authenticate(&fresh, None).await,
            Err(TokenError::Revoked(_))
        ));
    }
}
