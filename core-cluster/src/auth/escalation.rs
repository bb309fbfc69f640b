//! RBAC privilege-escalation prevention, as kube-apiserver's RBAC storage does it
//! (`pkg/registry/rbac/*/policybased` and `pkg/registry/rbac/validation`):
//!
//! - a Role or ClusterRole may be created or updated only by a user who already holds every
//!   permission it grants (`ConfirmNoEscalation`), or who may `escalate` roles
//!   (`RoleEscalationAuthorized`);
//! - a RoleBinding or ClusterRoleBinding only by a user who holds every permission of the role
//!   it references, in the binding's namespace, or who may `bind` that role
//!   (`BindingAuthorized`);
//! - `system:masters` is exempt (`EscalationAllowed`), and so are the server's own writes (the
//!   bootstrap policy); an update that changes only garbage-collection fields is not checked
//!   (`IsOnlyMutatingGCFields`).
//!
//! A refusal is a 403 worded as upstream's: `user "alice" (groups=["dev"
//! "system:authenticated"]) is attempting to grant RBAC permissions not currently held:` and
//! the missing rules in upstream's compact form, one per line.

use serde_json::Value;

use super::{
    GROUP_MASTERS, UserInfo,
    authz::{Attributes, Decision},
    rbac::{Rule, rules_of},
};
use crate::{
    api::{
        ServerState,
        status::{ApiError, Qualified},
    },
    registry::{
        ResourceDef,
        authorization::{CLUSTER_ROLES, RBAC_GROUP, ROLES},
    },
};

/// Checks a create (`old` is `None`) or update of an RBAC object by the request's user.
pub(crate) async fn admit(
    state: &ServerState,
    def: &ResourceDef,
    namespace: Option<&str>,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if def.group != RBAC_GROUP {
        return Ok(());
    }
    // The server's own writes (no request) and the superuser group (`EscalationAllowed`).
    let Some(user) = super::with_request_user(UserInfo::clone) else {
        return Ok(());
    };
    if user.in_group(GROUP_MASTERS) || old.is_some_and(|old| only_gc_fields_change(new, old)) {
        return Ok(());
    }
    let namespace = namespace.unwrap_or("");
    let name = new["metadata"]["name"].as_str().unwrap_or("");
    let span = tracing::debug_span!("rbac_escalation", kind = def.kind, namespace, name);
    let _entered = span.enter();
    let rules: Vec<Rule> = match def.kind {
        "Role" | "ClusterRole" => {
            // `RoleEscalationAuthorized`: the request's own attributes with the `escalate`
            // verb (no name on a create, as the request has none).
            let target = if old.is_some() { name } else { "" };
            let escalate = Attributes::resource(
                user.clone(),
                "escalate",
                RBAC_GROUP,
                def.plural,
                namespace,
                target,
            );
            if allowed(state, &escalate).await {
                return Ok(());
            }
            rules_of(new).to_vec()
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let role_ref = &new["roleRef"];
            let role_name = role_ref["name"].as_str().unwrap_or("");
            let role_def = match role_ref["kind"].as_str() {
                Some("Role") => &ROLES,
                Some("ClusterRole") => &CLUSTER_ROLES,
                // Validation refuses other kinds.
                _ => return Ok(()),
            };
            // `BindingAuthorized`: `bind` on the referenced role, in the binding's namespace.
            let group = role_ref["apiGroup"].as_str().unwrap_or("");
            let bind = Attributes::resource(
                user.clone(),
                "bind",
                group,
                role_def.plural,
                namespace,
                role_name,
            );
            if allowed(state, &bind).await {
                return Ok(());
            }
            let role_ns = role_def.namespaced.then_some(namespace);
            let role = crate::api::get_stored(state, role_def, role_ns, role_name).await?;
            rules_of(&role).to_vec()
        }
        _ => return Ok(()),
    };
    let held = state
        .authorizer
        .rbac
        .index(state)
        .await
        .rules_for(&user, namespace);
    let missing = uncovered(&held, &rules);
    if missing.is_empty() {
        return Ok(());
    }
    tracing::debug!(missing = missing.len(), "refused: RBAC escalation");
    Err(ApiError::forbidden(
        &Qualified::new(def.group, def.plural, name),
        &not_held_message(&user, &missing),
    ))
}

async fn allowed(state: &ServerState, attrs: &Attributes) -> bool {
    matches!(
        state.authorizer.authorize(state, attrs).await,
        Decision::Allow
    )
}

/// Upstream's `IsOnlyMutatingGCFields`: the update differs from the stored object only in
/// owner references, finalizers and the deletion fields (server-kept fields ignored).
fn only_gc_fields_change(new: &Value, old: &Value) -> bool {
    const IGNORED: [&str; 7] = [
        "ownerReferences",
        "finalizers",
        "selfLink",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "managedFields",
    ];
    let strip = |obj: &Value| {
        let mut obj = obj.clone();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| !IGNORED.contains(&k.as_str()));
        }
        obj
    };
    strip(new) == strip(old)
}

/// Upstream's `Covers`: the parts of `wanted` (broken down to one group, resource, verb and
/// name each, `BreakdownRule`) that no rule of `held` covers.
pub(crate) fn uncovered(held: &[Rule], wanted: &[Rule]) -> Vec<Rule> {
    wanted
        .iter()
        .flat_map(breakdown)
        .filter(|part| !held.iter().any(|owner| covers(owner, part)))
        .collect()
}

fn breakdown(rule: &Rule) -> Vec<Rule> {
    let one = |s: &String| vec![s.clone()];
    let mut parts = Vec::new();
    for group in &rule.api_groups {
        for resource in &rule.resources {
            for verb in &rule.verbs {
                let part = Rule {
                    verbs: one(verb),
                    api_groups: one(group),
                    resources: one(resource),
                    ..Rule::default()
                };
                if rule.resource_names.is_empty() {
                    parts.push(part);
                } else {
                    parts.extend(rule.resource_names.iter().map(|n| Rule {
                        resource_names: one(n),
                        ..part.clone()
                    }));
                }
            }
        }
    }
    for url in &rule.non_resource_urls {
        parts.extend(rule.verbs.iter().map(|verb| Rule {
            verbs: one(verb),
            non_resource_urls: one(url),
            ..Rule::default()
        }));
    }
    parts
}

fn has_all(set: &[String], wanted: &[String]) -> bool {
    wanted.iter().all(|w| set.contains(w))
}

fn has_star_or_all(set: &[String], wanted: &[String]) -> bool {
    set.iter().any(|s| s == "*") || has_all(set, wanted)
}

/// Upstream's `ruleCovers`, with `resourceCoversAll` (`*`, exact, `*/<subresource>`) and
/// `nonResourceURLsCoversAll` (exact or a `prefix*`).
fn covers(owner: &Rule, part: &Rule) -> bool {
    let resources = has_star_or_all(&owner.resources, &part.resources)
        || part.resources.iter().all(|r| {
            owner.resources.contains(r)
                || r.split_once('/')
                    .is_some_and(|(_, sub)| owner.resources.contains(&format!("*/{sub}")))
        });
    let urls = part.non_resource_urls.iter().all(|url| {
        owner.non_resource_urls.iter().any(|o| {
            o == url
                || o.strip_suffix('*')
                    .is_some_and(|prefix| url.starts_with(prefix.trim_end_matches('*')))
        })
    });
    let names = if part.resource_names.is_empty() {
        owner.resource_names.is_empty()
    } else {
        owner.resource_names.is_empty() || has_all(&owner.resource_names, &part.resource_names)
    };
    has_star_or_all(&owner.verbs, &part.verbs)
        && has_star_or_all(&owner.api_groups, &part.api_groups)
        && resources
        && urls
        && names
}

/// Upstream's `CompactRules`: rules of one group and one resource (and at most one name)
/// that differ only by verb become one rule with those verbs.
fn compact(rules: &[Rule]) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    let mut simple: Vec<Rule> = Vec::new();
    for rule in rules {
        let is_simple = rule.resource_names.len() <= 1
            && rule.non_resource_urls.is_empty()
            && rule.api_groups.len() == 1
            && rule.resources.len() == 1;
        if !is_simple {
            out.push(rule.clone());
            continue;
        }
        let same = simple.iter_mut().find(|s| {
            s.api_groups == rule.api_groups
                && s.resources == rule.resources
                && s.resource_names == rule.resource_names
        });
        match same {
            Some(s) => s.verbs.extend(rule.verbs.iter().cloned()),
            None => simple.push(rule.clone()),
        }
    }
    out.extend(simple);
    out
}

/// Go's `%q` of a `[]string`: `["a" "b"]`.
fn quoted(list: &[String]) -> String {
    let items: Vec<String> = list.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", items.join(" "))
}

/// Upstream's `CompactString`: `{APIGroups:[""], Resources:["pods"], Verbs:["get"]}`.
fn compact_string(rule: &Rule) -> String {
    let parts: Vec<String> = [
        ("APIGroups", &rule.api_groups),
        ("Resources", &rule.resources),
        ("NonResourceURLs", &rule.non_resource_urls),
        ("ResourceNames", &rule.resource_names),
        ("Verbs", &rule.verbs),
    ]
    .into_iter()
    .filter(|(_, list)| !list.is_empty())
    .map(|(key, list)| format!("{key}:{}", quoted(list)))
    .collect();
    format!("{{{}}}", parts.join(", "))
}

/// Upstream's `ConfirmNoEscalation` message: the user, then each missing rule, compacted,
/// sorted and unique, one per line.
fn not_held_message(user: &UserInfo, missing: &[Rule]) -> String {
    let mut lines: Vec<String> = compact(missing).iter().map(compact_string).collect();
    lines.sort();
    lines.dedup();
    format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        user.name,
        quoted(&user.groups),
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str]) -> Rule {
        let v = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
        Rule {
            verbs: v(verbs),
            api_groups: v(groups),
            resources: v(resources),
            ..Rule::default()
        }
    }

    /// Upstream `ruleCovers`: stars, `*/subresource`, resource names, URL prefixes.
    #[test]
    fn coverage_as_upstream() {
        let held = [
            rule(&["get", "list"], &[""], &["pods", "*/status"]),
            rule(&["*"], &["apps"], &["deployments"]),
            Rule {
                resource_names: vec!["cm1".into()],
                ..rule(&["get"], &[""], &["configmaps"])
            },
            Rule {
                verbs: vec!["get".into()],
                non_resource_urls: vec!["/healthz/*".into()],
                ..Rule::default()
            },
        ];
        assert!(uncovered(&held, &[rule(&["get"], &[""], &["pods", "nodes/status"])]).is_empty());
        assert!(
            uncovered(
                &held,
                &[rule(&["delete", "patch"], &["apps"], &["deployments"])]
            )
            .is_empty()
        );
        let named = Rule {
            resource_names: vec!["cm1".into()],
            ..rule(&["get"], &[""], &["configmaps"])
        };
        assert!(uncovered(&held, &[named]).is_empty());
        // A rule for every ConfigMap is more than one named ConfigMap.
        assert_eq!(
            uncovered(&held, &[rule(&["get"], &[""], &["configmaps"])]).len(),
            1
        );
        let url = |u: &str| Rule {
            verbs: vec!["get".into()],
            non_resource_urls: vec![u.into()],
            ..Rule::default()
        };
        assert!(uncovered(&held, &[url("/healthz/etcd")]).is_empty());
        assert_eq!(uncovered(&held, &[url("/metrics")]).len(), 1);
        // A star asked for is covered only by a star held.
        assert_eq!(uncovered(&held, &[rule(&["*"], &[""], &["pods"])]).len(), 1);
    }

    /// Upstream `ConfirmNoEscalation`'s message, with `CompactRules` and `CompactString`.
    #[test]
    fn message_lists_the_missing_rules_compactly() {
        let user = UserInfo::new("alice", ["dev"]);
        let missing = uncovered(
            &[rule(&["get"], &[""], &["pods"])],
            &[
                rule(&["get", "list", "delete"], &[""], &["pods", "secrets"]),
                Rule {
                    resource_names: vec!["a".into()],
                    ..rule(&["get"], &["apps"], &["deployments"])
                },
            ],
        );
        assert_eq!(
            not_held_message(&user, &missing),
            "user \"alice\" (groups=[\"dev\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"\"], Resources:[\"pods\"], Verbs:[\"list\" \"delete\"]}\n\
             {APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\" \"delete\"]}\n\
             {APIGroups:[\"apps\"], Resources:[\"deployments\"], ResourceNames:[\"a\"], Verbs:[\"get\"]}"
        );
    }

    #[test]
    fn garbage_collection_fields_alone_are_not_checked() {
        let old =
            serde_json::json!({"metadata": {"name": "b", "resourceVersion": "3"}, "subjects": []});
        let mut new = old.clone();
        new["metadata"]["finalizers"] = serde_json::json!(["x"]);
        new["metadata"]["resourceVersion"] = serde_json::json!("4");
        assert!(only_gc_fields_change(&new, &old));
        new["metadata"]["labels"] = serde_json::json!({"a": "b"});
        assert!(!only_gc_fields_change(&new, &old));
    }
}
