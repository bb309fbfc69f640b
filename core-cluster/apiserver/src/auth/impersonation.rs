//! User impersonation (`kubectl --as alice --as-group dev`), as upstream's
//! `WithImpersonation` filter: the `Impersonate-User`, `Impersonate-Group`,
//! `Impersonate-Uid` and `Impersonate-Extra-<key>` headers replace the requester's identity,
//! each only if the requester may `impersonate` it (`users`, `groups`, `serviceaccounts`,
//! `uids` and `userextras/<key>`).

use axum::http::HeaderMap;

use super::{
    GROUP_AUTHENTICATED, USER_ANONYMOUS, UserInfo,
    authz::{Attributes, Decision, forbidden},
    chain::Authorizer,
    rbac::SERVICE_ACCOUNT_PREFIX,
};
use crate::storage::status::ApiError;

/// `Impersonate-User`.
pub const USER_HEADER: &str = "impersonate-user";
/// `Impersonate-Group` (repeated).
pub const GROUP_HEADER: &str = "impersonate-group";
/// `Impersonate-Uid`.
pub const UID_HEADER: &str = "impersonate-uid";
/// `Impersonate-Extra-<key>` (repeated).
pub const EXTRA_HEADER_PREFIX: &str = "impersonate-extra-";

/// Whether the request asks to impersonate anyone.
pub fn requested(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().starts_with("impersonate-"))
}

fn values(headers: &HeaderMap, name: &str) -> Vec<String> {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect()
}

/// The identity the request acts as: `requester`, or the impersonated user when the headers
/// ask for one and every part of it is allowed (403 with upstream's message otherwise).
pub(crate) async fn impersonate(
    authorizer: &Authorizer,
    requester: UserInfo,
    headers: &HeaderMap,
) -> Result<UserInfo, ApiError> {
    if !requested(headers) {
        return Ok(requester);
    }
    let users = values(headers, USER_HEADER);
    let [name] = users.as_slice() else {
        return Err(ApiError::bad_request(
            "requested impersonation without impersonating exactly one user",
        ));
    };
    let groups = values(headers, GROUP_HEADER);
    let uid = values(headers, UID_HEADER)
        .into_iter()
        .next()
        .unwrap_or_default();
    let mut extra = std::collections::BTreeMap::new();
    let mut checks: Vec<Attributes> = Vec::new();
    let check = |verb_group: &str, resource: &str, namespace: &str, object: &str| {
        let mut a = Attributes::resource(
            requester.clone(),
            "impersonate",
            verb_group,
            resource,
            namespace,
            object,
        );
        a.api_version = "v1".to_owned();
        a
    };
    let service_account = name
        .strip_prefix(SERVICE_ACCOUNT_PREFIX)
        .and_then(|rest| rest.split_once(':'));
    match service_account {
        Some((ns, sa)) => checks.push(check("", "serviceaccounts", ns, sa)),
        None => checks.push(check("", "users", "", name)),
    }
    for g in &groups {
        checks.push(check("", "groups", "", g));
    }
    if !uid.is_empty() {
        checks.push(check("authentication.k8s.io", "uids", "", &uid));
    }
    for key in headers.keys() {
        if let Some(extra_key) = key.as_str().strip_prefix(EXTRA_HEADER_PREFIX) {
            let vals = values(headers, key.as_str());
            for v in &vals {
                checks.push(check(
                    "authentication.k8s.io",
                    &format!("userextras/{extra_key}"),
                    "",
                    v,
                ));
            }
            extra.insert(extra_key.to_owned(), vals);
        }
    }
    for attrs in &checks {
        match authorizer.authorize(attrs).await {
            Decision::Allow => {}
            Decision::Deny(reason) | Decision::NoOpinion(reason) => {
                tracing::debug!(requester = %requester.name, target = %name, "impersonation refused");
                return Err(forbidden(attrs, &reason));
            }
        }
    }
    let mut user = UserInfo {
        name: name.clone(),
        uid,
        groups,
        extra,
    };
    if let Some((ns, _)) = service_account
        && user.groups.is_empty()
    {
        user.groups = vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{ns}"),
        ];
    }
    if user.name != USER_ANONYMOUS && !user.in_group(GROUP_AUTHENTICATED) {
        user.groups.push(GROUP_AUTHENTICATED.to_owned());
    }
    Ok(user)
}
