//! What the authorizers decide on (upstream's `k8s.io/apiserver/pkg/authorization/
//! authorizer`): the request's attributes (upstream's `RequestInfo`), the decision, and the
//! 403 Forbidden `Status` with upstream's wording. The chain of authorizers is
//! [`super::chain`].

use axum::http::{Method, Uri};
use serde_json::json;

use super::UserInfo;
use crate::storage::{query_bool, status::ApiError};

/// Whether a request is a watch: its last `watch` query parameter read by [`query_bool`]
/// (upstream's `ListOptions.Watch`, so `watch=True` and `watch=yes` are watches). The one
/// reading of the flag: the handlers, the authorizer and the codec all ask this.
pub(crate) fn watch_requested(uri: &Uri) -> bool {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(uri.query().unwrap_or("")).unwrap_or_default();
    let last = pairs.iter().rev().find(|(k, _)| k == "watch");
    query_bool(last.map(|(_, v)| v.as_str()))
}

/// What a request asks to do: upstream's `authorizer.Attributes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Who asks.
    pub user: UserInfo,
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`,
    /// `impersonate`…; for a non-resource request, the lowercase HTTP method.
    pub verb: String,
    /// Whether the request is about a resource (`/api/v1/nodes`) or a non-resource URL
    /// (`/healthz`, `/api`, `/version`).
    pub resource_request: bool,
    /// The URL path (non-resource requests).
    pub path: String,
    /// The API group, empty for core.
    pub api_group: String,
    /// The API version.
    pub api_version: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource (`status`), or empty.
    pub subresource: String,
    /// The namespace, or empty at the cluster scope.
    pub namespace: String,
    /// The object's name, or empty (list, create).
    pub name: String,
}

/// The namespace subresources: `/api/v1/namespaces/<ns>/status` is about the namespace.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl Attributes {
    /// A resource request's attributes (for reviews and tests).
    pub fn resource(
        user: UserInfo,
        verb: &str,
        api_group: &str,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Self {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Attributes {
            user,
            verb: verb.to_owned(),
            resource_request: true,
            api_group: api_group.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            ..Attributes::default()
        }
    }

    /// The attributes of an HTTP request, parsed from its method and URL as upstream's
    /// `RequestInfoFactory` does: `/api/v1/...` and `/apis/<group>/<version>/...` with at
    /// least a resource are resource requests, everything else (discovery included) is a
    /// non-resource URL.
    pub fn from_request(user: UserInfo, method: &Method, uri: &Uri) -> Self {
        let path = uri.path();
        let mut attrs = Attributes {
            user,
            verb: method.as_str().to_ascii_lowercase(),
            path: path.to_owned(),
            ..Attributes::default()
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let rest: &[&str] = match parts.as_slice() {
            ["api", version, rest @ ..] if !rest.is_empty() => {
                attrs.api_version = (*version).to_owned();
                rest
            }
            ["apis", group, version, rest @ ..] if !rest.is_empty() => {
                attrs.api_group = (*group).to_owned();
                attrs.api_version = (*version).to_owned();
                rest
            }
            _ => return attrs,
        };
        attrs.resource_request = true;
        let query = uri.query().unwrap_or("");
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).unwrap_or_default();
        let param = |key: &str| {
            pairs
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let mut rest = rest;
        let mut watch = watch_requested(uri);
        if rest.first() == Some(&"watch") {
            watch = true;
            rest = &rest[1..];
        }
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            attrs.namespace = rest[1].to_owned();
            if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
                rest = &rest[2..];
            }
        }
        attrs.resource = rest.first().copied().unwrap_or("").to_owned();
        attrs.name = rest.get(1).copied().unwrap_or("").to_owned();
        attrs.subresource = rest.get(2).copied().unwrap_or("").to_owned();
        attrs.verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD if watch => "watch",
            Method::GET | Method::HEAD if attrs.name.is_empty() => "list",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if attrs.name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_owned();
        // The WebSocket upgrade (a GET) of exec, attach and port-forward is authorized as
        // `create`, as the POST it replaces (`staging/src/k8s.io/apiserver/pkg/endpoints/
        // request/requestinfo.go NewRequestInfo`, AuthorizePodWebsocketUpgradeCreatePermission).
        if attrs.verb == "get"
            && attrs.resource == "pods"
            && matches!(
                attrs.subresource.as_str(),
                "exec" | "attach" | "portforward"
            )
        {
            attrs.verb = "create".to_owned();
        }
        // A list or watch of one object by `metadata.name` is about that object.
        if matches!(attrs.verb.as_str(), "list" | "watch")
            && let Some(name) = param("fieldSelector")
                .and_then(|s| s.strip_prefix("metadata.name="))
                .filter(|n| !n.contains(','))
        {
            attrs.name = name.to_owned();
        }
        attrs
    }

    /// `nodes/status` or `nodes`.
    pub fn full_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// An authorizer's answer (upstream's `authorizer.Decision` with its reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed.
    Allow,
    /// Denied, with why; no later authorizer is asked.
    Deny(String),
    /// No opinion (with an optional reason); the next authorizer decides.
    NoOpinion(String),
}

/// Upstream's `forbiddenMessage`: `User "x" cannot get resource "nodes" in API group "" at
/// the cluster scope`, `... in the namespace "ns"`, or `User "x" cannot get path "/version"`.
pub fn forbidden_message(attrs: &Attributes) -> String {
    let user = &attrs.user.name;
    if !attrs.resource_request {
        return format!("User {user:?} cannot {} path {:?}", attrs.verb, attrs.path);
    }
    let resource = attrs.full_resource();
    if attrs.namespace.is_empty() {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            attrs.verb, attrs.api_group
        )
    } else {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            attrs.verb, attrs.api_group, attrs.namespace
        )
    }
}

/// The 403 answer (upstream's `ForbiddenStatusError` over `NewForbidden`):
/// `nodes "n1" is forbidden: User "x" cannot ...[: reason]`, with `details` naming the
/// group, resource and name.
pub fn forbidden(attrs: &Attributes, reason: &str) -> ApiError {
    let mut why = forbidden_message(attrs);
    if !reason.is_empty() {
        why.push_str(": ");
        why.push_str(reason);
    }
    if !attrs.resource_request {
        return ApiError {
            code: 403,
            reason: "Forbidden",
            message: format!("forbidden: {why}"),
            details: Some(json!({})),
        };
    }
    let qualified = if attrs.api_group.is_empty() {
        attrs.resource.clone()
    } else {
        format!("{}.{}", attrs.resource, attrs.api_group)
    };
    let message = if attrs.name.is_empty() {
        format!("{qualified} is forbidden: {why}")
    } else {
        format!("{qualified} {:?} is forbidden: {why}", attrs.name)
    };
    let mut details = json!({"name": attrs.name, "kind": attrs.resource});
    if !attrs.api_group.is_empty() {
        details["group"] = json!(attrs.api_group);
    }
    ApiError {
        code: 403,
        reason: "Forbidden",
        message,
        details: Some(details),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: Method, uri: &str) -> Attributes {
        Attributes::from_request(
            UserInfo::new("alice", ["dev"]),
            &method,
            &uri.parse().unwrap(),
        )
    }

    /// Upstream `RequestInfoFactory`: discovery is non-resource, `/api/v1/namespaces/ns`
    /// is the namespace itself, list/watch by `metadata.name` name the object.
    #[test]
    fn request_info_as_upstream() {
        let a = attrs(Method::GET, "/api/v1/nodes");
        assert_eq!(
            (a.verb.as_str(), a.resource.as_str(), a.resource_request),
            ("list", "nodes", true)
        );
        let a = attrs(
            Method::GET,
            "/api/v1/nodes?watch=true&fieldSelector=metadata.name%3Dn1",
        );
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "n1"));
        // Upstream's query booleans: the Python client's `True` is a watch, `false`/`0` not.
        assert_eq!(attrs(Method::GET, "/api/v1/nodes?watch=True").verb, "watch");
        assert_eq!(attrs(Method::GET, "/api/v1/nodes?watch=False").verb, "list");
        assert_eq!(attrs(Method::GET, "/api/v1/nodes?watch=0").verb, "list");
        let a = attrs(
            Method::PATCH,
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
        );
        assert_eq!(
            (
                a.verb.as_str(),
                a.api_group.as_str(),
                a.namespace.as_str(),
                a.name.as_str()
            ),
            ("patch", "coordination.k8s.io", "kube-node-lease", "n1")
        );
        let a = attrs(Method::PUT, "/api/v1/namespaces/ns1/finalize");
        assert_eq!(
            (
                a.resource.as_str(),
                a.name.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str()
            ),
            ("namespaces", "ns1", "finalize", "ns1")
        );
        let a = attrs(Method::DELETE, "/api/v1/namespaces/ns1/pods");
        assert_eq!(a.verb, "deletecollection");
        for path in [
            "/api",
            "/api/v1",
            "/apis/apps/v1",
            "/version",
            "/openapi/v3",
        ] {
            let a = attrs(Method::GET, path);
            assert!(!a.resource_request, "{path}");
            assert_eq!(a.verb, "get");
        }
    }

    /// Upstream `forbiddenMessage` and `NewForbidden`.
    #[test]
    fn forbidden_messages_as_upstream() {
        let a = attrs(Method::GET, "/api/v1/nodes/n1");
        assert_eq!(
            forbidden(&a, "").message,
            r#"nodes "n1" is forbidden: User "alice" cannot get resource "nodes" in API group "" at the cluster scope"#
        );
        let a = attrs(
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/x/leases",
        );
        assert_eq!(
            forbidden(&a, "why").message,
            r#"leases.coordination.k8s.io is forbidden: User "alice" cannot list resource "leases" in API group "coordination.k8s.io" in the namespace "x": why"#
        );
        let a = attrs(Method::GET, "/version");
        assert_eq!(
            forbidden(&a, "").message,
            r#"forbidden: User "alice" cannot get path "/version""#
        );
    }
}
