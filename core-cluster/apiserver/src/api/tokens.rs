//! The token APIs: the `serviceaccounts/<name>/token` subresource (TokenRequest) and
//! `authentication.k8s.io/v1` TokenReview. Neither is stored. They use the
//! [`TokenAuthenticator`] the serving layer puts into each request's extensions
//! ([`crate::serve::secure_router`]); without one (a bare in-process router) they answer 503.

use std::sync::Arc;

use axum::{
    body::Body,
    extract::Request,
    http::Method,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

use super::{
    ServerState, Target,
    status::{ApiError, FieldError},
};
use crate::{
    auth::{
        UserInfo,
        token::{ObjectRef, PodBinding, TokenAuthenticator},
    },
    registry::{meta, resources},
    storage::{
        admission::{AdmissionAttributes, Operation},
        get_list::get_object,
    },
};

/// kube-apiserver's default `expirationSeconds` of a TokenRequest (1 hour).
pub(crate) const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// The group-version of TokenRequest bodies.
const TOKEN_REQUEST_VERSION: &str = "authentication.k8s.io/v1";
/// The shortest token a TokenRequest may ask for (`MinTokenAgeSec`, 10 minutes).
pub(crate) const MIN_EXPIRATION_SECONDS: i64 = 600;
/// The longest: 2^32 seconds, as upstream's validation.
pub(crate) const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

/// Answers `request` if it is a TokenRequest or a TokenReview (returning the verb for
/// metrics and the response); hands it back otherwise.
pub(crate) async fn route(
    state: &Arc<ServerState>,
    target: &Target,
    request: Request<Body>,
) -> Result<(String, Response), Request<Body>> {
    let def = target.def;
    let is_token_request = std::ptr::eq(def, &resources::SERVICE_ACCOUNTS)
        && target.subresource.as_deref() == Some("token");
    let is_review = std::ptr::eq(def, &resources::TOKEN_REVIEWS);
    if !is_token_request && !is_review {
        return Err(request);
    }
    let method = request.method().clone();
    let verb = method.to_string();
    if is_review && (target.name.is_some() || target.subresource.is_some()) {
        let path = request.uri().path().to_owned();
        return Ok((verb, ApiError::no_route(&path).into_response()));
    }
    if method != Method::POST {
        // Upstream installs a POST route alone for both.
        return Ok((verb, ApiError::method_not_served().into_response()));
    }
    // Neither has a table convertor: a Table alone is a 406, before the body is read.
    let repr = match super::negotiate::representation(request.headers(), false) {
        Ok(repr) => repr,
        Err(e) => return Ok((verb, e.into_response())),
    };
    let tokens = request
        .extensions()
        .get::<Arc<TokenAuthenticator>>()
        .cloned();
    let user = request
        .extensions()
        .get::<UserInfo>()
        .cloned()
        .unwrap_or_else(UserInfo::loopback);
    // Bodies are JSON, as everywhere on this server: protobuf gets 415.
    let content_type = request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let limit = state.config.max_request_bytes;
    let result = async {
        let tokens = tokens.ok_or_else(|| ApiError {
            code: 503,
            reason: "ServiceUnavailable",
            message: "service-account tokens are not configured on this server".into(),
            details: None,
        })?;
        if !matches!(
            super::negotiate::media_type(&content_type).as_str(),
            "application/json" | "" | "*/*"
        ) {
            return Err(ApiError::unsupported_media_type(&content_type));
        }
        let body = axum::body::to_bytes(request.into_body(), limit)
            .await
            .map_err(|_| ApiError::too_large(limit))?;
        let mut body: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
        if is_review {
            super::type_meta::default_from_path(&mut body, &def.api_version(), def.kind)?;
            review(&tokens, body).await
        } else {
            super::type_meta::default_from_path(&mut body, TOKEN_REQUEST_VERSION, "TokenRequest")?;
            let ns = target.namespace.as_deref().unwrap_or_default();
            let name = target.name.as_deref().unwrap_or_default();
            token_request(state, &tokens, &user, ns, name, body).await
        }
    }
    .await;
    Ok((
        "POST".into(),
        match result {
            Ok(value) => super::created(&value, repr),
            Err(e) => e.into_response(),
        },
    ))
}

/// `POST serviceaccounts/<name>/token`: a token for the account, bound to a pod if asked.
async fn token_request(
    state: &Arc<ServerState>,
    tokens: &TokenAuthenticator,
    user: &UserInfo,
    ns: &str,
    name: &str,
    mut body: Value,
) -> Result<Value, ApiError> {
    let invalid = |errors| ApiError::invalid("TokenRequest", "authentication.k8s.io", "", errors);
    let spec = &body["spec"];
    let expiration = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION_SECONDS,
        v => v.as_i64().ok_or_else(|| {
            invalid(vec![FieldError::invalid(
                "spec.expirationSeconds",
                v,
                "must be an integer",
            )])
        })?,
    };
    if expiration < MIN_EXPIRATION_SECONDS {
        return Err(invalid(vec![FieldError::invalid(
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration less than 10 minutes",
        )]));
    }
    if expiration > MAX_EXPIRATION_SECONDS {
        return Err(invalid(vec![FieldError::invalid(
            "spec.expirationSeconds",
            &json!(expiration),
            "may not specify a duration larger than 2^32 seconds",
        )]));
    }
    let audiences: Vec<String> = match spec["audiences"].as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => tokens.audiences().to_vec(),
    };
    let (_, account) =
        get_object(&*state.store, &resources::SERVICE_ACCOUNTS, Some(ns), name).await?;
    let account = ObjectRef {
        name: name.to_owned(),
        uid: meta::str_at(&account, &["metadata", "uid"])
            .unwrap_or("")
            .to_owned(),
    };
    // NodeRestriction (`admitServiceAccount`): a node's token is bound to a pod on it.
    state
        .storage
        .admit(&AdmissionAttributes {
            user,
            operation: Operation::Create,
            resource: &resources::SERVICE_ACCOUNTS,
            subresource: Some("token"),
            namespace: Some(ns),
            name,
            object: Some(&body),
            old_object: None,
        })
        .await?;
    let pod = match &spec["boundObjectRef"] {
        Value::Null => None,
        bound => Some(bound_pod(state, ns, bound).await?),
    };
    let (token, exp) = tokens
        .issue(ns, account, pod, audiences.clone(), expiration)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let expires = jiff::Timestamp::from_second(exp)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default();
    body["metadata"] =
        json!({"name": name, "namespace": ns, "creationTimestamp": meta::now_rfc3339()});
    body["spec"]["audiences"] = json!(audiences);
    body["spec"]["expirationSeconds"] = json!(expiration);
    body["status"] = json!({"token": token, "expirationTimestamp": expires});
    Ok(body)
}

/// The pod a token is bound to: it must exist, and have the given UID if one is given; with
/// the node it is scheduled to, if any, whose name and UID the token records
/// (`pkg/registry/core/serviceaccount/storage/token.go`, `TokenREST.Create` with
/// `ServiceAccountTokenPodNodeInfo`: a node that cannot be found is recorded by name alone).
async fn bound_pod(
    state: &Arc<ServerState>,
    ns: &str,
    bound: &Value,
) -> Result<PodBinding, ApiError> {
    let kind = bound["kind"].as_str().unwrap_or("");
    if kind != "Pod" {
        return Err(ApiError::bad_request(format!(
            "cannot bind token to object of type {kind:?}: only Pod is supported"
        )));
    }
    let name = bound["name"].as_str().unwrap_or("");
    let (_, pod) = get_object(&*state.store, &resources::PODS, Some(ns), name).await?;
    let uid = meta::str_at(&pod, &["metadata", "uid"])
        .unwrap_or("")
        .to_owned();
    if let Some(wanted) = bound["uid"].as_str().filter(|u| !u.is_empty())
        && wanted != uid
    {
        return Err(ApiError::conflict(
            &super::status::Qualified::new("", "pods", name),
            &format!(
                "the UID in the bound object reference ({wanted}) does not match the UID in record. The object might have been deleted and then recreated"
            ),
        ));
    }
    let node = match meta::str_at(&pod, &["spec", "nodeName"]).filter(|n| !n.is_empty()) {
        None => None,
        Some(node_name) => {
            let uid = match get_object(&*state.store, &resources::NODES, None, node_name).await {
                Ok((_, node)) => meta::str_at(&node, &["metadata", "uid"])
                    .unwrap_or("")
                    .to_owned(),
                Err(e) if e.code == 404 => String::new(),
                Err(e) => return Err(ApiError::internal(e.message)),
            };
            Some(ObjectRef {
                name: node_name.to_owned(),
                uid,
            })
        }
    };
    Ok(PodBinding {
        pod: ObjectRef {
            name: name.to_owned(),
            uid,
        },
        node,
    })
}

/// `POST tokenreviews`: whether a token authenticates, and as whom.
async fn review(tokens: &TokenAuthenticator, mut body: Value) -> Result<Value, ApiError> {
    let token = body["spec"]["token"].as_str().unwrap_or("").to_owned();
    let audiences: Option<Vec<String>> = body["spec"]["audiences"]
        .as_array()
        .filter(|a| !a.is_empty())
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        });
    let status = if token.is_empty() {
        json!({"authenticated": false, "user": {}, "error": "token is empty"})
    } else {
        match tokens.authenticate(&token, audiences.as_deref()).await {
            Ok((user, matched)) => json!({
                "authenticated": true,
                "user": {"username": user.name, "uid": user.uid, "groups": user.groups, "extra": user.extra},
                "audiences": matched,
            }),
            Err(e) => {
                json!({"authenticated": false, "user": {}, "error": format!("[invalid bearer token, {e}]")})
            }
        }
    };
    if !body["metadata"].is_object() {
        body["metadata"] = json!({});
    }
    body["metadata"]["creationTimestamp"] = Value::Null;
    body["status"] = status;
    Ok(body)
}
