//! `authorization.k8s.io/v1` access reviews, answered by the authorizer chain and never
//! stored (upstream's `pkg/registry/authorization`): `SubjectAccessReview` (any user, for
//! webhooks and `kubectl auth can-i --as`), `LocalSubjectAccessReview` (one namespace),
//! `SelfSubjectAccessReview` (`kubectl auth can-i`) and `SelfSubjectRulesReview`
//! (`kubectl auth can-i --list`); and `authentication.k8s.io/v1` `SelfSubjectReview`
//! (`kubectl auth whoami`).

use serde_json::{Value, json};

use super::{
    UserInfo,
    authz::{Attributes, Decision},
    chain::Authorizer,
    node,
};
use crate::{registry::FieldError, registry::ResourceDef, storage::status::ApiError};

fn invalid(def: &ResourceDef, errors: Vec<FieldError>) -> ApiError {
    ApiError::invalid(def.kind, def.group, "", errors)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

/// The attributes a review's spec asks about, for `user`.
fn attributes_of(def: &ResourceDef, spec: &Value, user: UserInfo) -> Result<Attributes, ApiError> {
    let resource = &spec["resourceAttributes"];
    let non_resource = &spec["nonResourceAttributes"];
    match (resource.is_object(), non_resource.is_object()) {
        (true, false) => {
            let mut attrs = Attributes::resource(
                user,
                &text(&resource["verb"]),
                &text(&resource["group"]),
                &text(&resource["resource"]),
                &text(&resource["namespace"]),
                &text(&resource["name"]),
            );
            attrs.api_version = text(&resource["version"]);
            let sub = text(&resource["subresource"]);
            if !sub.is_empty() {
                attrs.subresource = sub;
            }
            Ok(attrs)
        }
        (false, true) => Ok(Attributes {
            user,
            verb: text(&non_resource["verb"]),
            path: text(&non_resource["path"]),
            ..Attributes::default()
        }),
        _ => Err(invalid(
            def,
            vec![FieldError::invalid(
                "spec.resourceAttributes",
                resource,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        )),
    }
}

/// The user a `SubjectAccessReview` asks about: exactly the given name, groups, UID and
/// extra (no group is added).
fn spec_user(def: &ResourceDef, spec: &Value) -> Result<UserInfo, ApiError> {
    let user = UserInfo {
        name: text(&spec["user"]),
        uid: text(&spec["uid"]),
        groups: strings(&spec["groups"]),
        extra: spec["extra"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
            .unwrap_or_default(),
    };
    if user.name.is_empty() && user.groups.is_empty() {
        return Err(invalid(
            def,
            vec![FieldError::invalid(
                "spec.user",
                &json!(""),
                "at least one of user or group must be specified",
            )],
        ));
    }
    Ok(user)
}

/// Answers a review created by `requester` (in `namespace` for the local kind): the object
/// as sent, with its `status` filled in.
pub(crate) async fn create(
    authorizer: &Authorizer,
    def: &'static ResourceDef,
    namespace: Option<&str>,
    requester: &UserInfo,
    mut body: Value,
) -> Result<Value, ApiError> {
    if def.kind == "SelfSubjectReview" {
        return Ok(self_subject_review(requester));
    }
    let spec = body["spec"].clone();
    if def.kind == "SelfSubjectRulesReview" {
        body["status"] = rules_review(authorizer, requester, &text(&spec["namespace"])).await;
        return Ok(body);
    }
    let user = match def.kind {
        "SelfSubjectAccessReview" => requester.clone(),
        _ => spec_user(def, &spec)?,
    };
    let attrs = attributes_of(def, &spec, user)?;
    if let Some(ns) = namespace {
        if !attrs.resource_request {
            return Err(invalid(
                def,
                vec![FieldError::invalid(
                    "spec.nonResourceAttributes",
                    &spec["nonResourceAttributes"],
                    "disallowed on this kind of request",
                )],
            ));
        }
        if attrs.namespace != ns {
            return Err(invalid(
                def,
                vec![FieldError::invalid(
                    "spec.resourceAttributes.namespace",
                    &json!(attrs.namespace),
                    "must match metadata.namespace",
                )],
            ));
        }
    }
    let decision = authorizer.authorize(&attrs).await;
    tracing::debug!(user = %attrs.user.name, verb = %attrs.verb, resource = %attrs.full_resource(), ?decision, "access review");
    body["status"] = match decision {
        Decision::Allow => json!({"allowed": true}),
        Decision::Deny(reason) => json!({"allowed": false, "denied": true, "reason": reason}),
        Decision::NoOpinion(reason) if reason.is_empty() => json!({"allowed": false}),
        Decision::NoOpinion(reason) => json!({"allowed": false, "reason": reason}),
    };
    Ok(body)
}

/// Upstream's `selfsubjectreview` REST `Create`: a new object (nothing of the request's is
/// echoed) with the requester's user name, UID, groups and extra, stamped now.
fn self_subject_review(requester: &UserInfo) -> Value {
    let mut user = json!({"username": requester.name});
    if !requester.uid.is_empty() {
        user["uid"] = json!(requester.uid);
    }
    if !requester.groups.is_empty() {
        user["groups"] = json!(requester.groups);
    }
    if !requester.extra.is_empty() {
        user["extra"] = json!(requester.extra);
    }
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": crate::registry::meta::now_rfc3339()},
        "status": {"userInfo": user},
    })
}

/// The rules `user` has in `namespace`: RBAC's (cluster-wide and the namespace's) and, for a
/// node, the node rules. `incomplete` when the Node authorizer narrows some of them further.
async fn rules_review(authorizer: &Authorizer, user: &UserInfo, namespace: &str) -> Value {
    let mut rules = authorizer.rbac.rules_for(user, namespace);
    let is_node = user.in_group(super::GROUP_NODES);
    if is_node {
        rules.extend(node::node_rules());
    }
    let (resource, non_resource): (Vec<_>, Vec<_>) =
        rules.iter().partition(|r| r.non_resource_urls.is_empty());
    let resource: Vec<Value> = resource
        .iter()
        .map(|r| {
            json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources,
                   "resourceNames": r.resource_names})
        })
        .collect();
    let non_resource: Vec<Value> = non_resource
        .iter()
        .map(|r| json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
        .collect();
    json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": is_node})
}
