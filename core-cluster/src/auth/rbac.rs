//! RBAC: rules of Roles and ClusterRoles granted to subjects by RoleBindings and
//! ClusterRoleBindings (upstream's `plugin/pkg/auth/authorizer/rbac`, aggregation-free).
//!
//! Requests are decided against an [`RbacIndex`] by subject (user name, group), built from the
//! four kinds in the store. The index is rebuilt when a write to the RBAC group went through
//! the API server (so a client reads its own grants at once) and at least every
//! [`REFRESH_INTERVAL`] otherwise (bindings removed by namespace deletion), never per
//! request.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};
use parking_lot::RwLock;
use serde_json::Value;

use super::{UserInfo, authz::Attributes};
use crate::{
    api::ServerState,
    registry::authorization::{CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, ROLE_BINDINGS, ROLES},
};

/// How stale the index may get when nothing wrote RBAC objects through this server.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// The service-account user name prefix: `system:serviceaccount:<ns>:<name>`.
pub const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// The identity of a service account as the token authenticator gives it:
/// `system:serviceaccount:<ns>:<name>` in `system:serviceaccounts`,
/// `system:serviceaccounts:<ns>` and `system:authenticated`.
pub fn service_account_user(namespace: &str, name: &str) -> UserInfo {
    UserInfo::new(
        format!("{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"),
        [
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace}"),
        ],
    )
}

/// One policy rule, as upstream's `rbacv1.PolicyRule`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// Verbs, `*` for all.
    pub verbs: Vec<String>,
    /// API groups, `*` for all.
    pub api_groups: Vec<String>,
    /// Resources (`pods`, `pods/status`, `*`, `*/status`).
    pub resources: Vec<String>,
    /// Object names; empty for all.
    pub resource_names: Vec<String>,
    /// Non-resource URLs (`/healthz`, `/apis/*`, `*`).
    pub non_resource_urls: Vec<String>,
}

impl From<PolicyRule> for Rule {
    fn from(r: PolicyRule) -> Self {
        Rule {
            verbs: r.verbs,
            api_groups: r.api_groups.unwrap_or_default(),
            resources: r.resources.unwrap_or_default(),
            resource_names: r.resource_names.unwrap_or_default(),
            non_resource_urls: r.non_resource_urls.unwrap_or_default(),
        }
    }
}

fn has_or_star(list: &[String], want: &str) -> bool {
    list.iter().any(|v| v == "*" || v == want)
}

impl Rule {
    /// The rule as a `PolicyRule` object (empty lists left out).
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::Map::new();
        for (key, list) in [
            ("verbs", &self.verbs),
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !list.is_empty() || key == "verbs" {
                out.insert(key.to_owned(), serde_json::json!(list));
            }
        }
        Value::Object(out)
    }

    /// Upstream's `RuleAllows`: verb, group, resource (with `*/sub` for any resource's
    /// subresource) and name for resource requests; verb and URL (exact, `*`, or a
    /// `prefix*`) for the others.
    pub fn allows(&self, attrs: &Attributes) -> bool {
        if !has_or_star(&self.verbs, &attrs.verb) {
            return false;
        }
        if !attrs.resource_request {
            return self.non_resource_urls.iter().any(|url| {
                url == "*"
                    || *url == attrs.path
                    || url
                        .strip_suffix('*')
                        .is_some_and(|prefix| attrs.path.starts_with(prefix))
            });
        }
        if !has_or_star(&self.api_groups, &attrs.api_group) {
            return false;
        }
        let combined = attrs.full_resource();
        let resource_ok = self.resources.iter().any(|r| {
            r == "*"
                || *r == combined
                || (!attrs.subresource.is_empty()
                    && r.strip_prefix("*/") == Some(attrs.subresource.as_str()))
        });
        resource_ok && (self.resource_names.is_empty() || self.resource_names.contains(&attrs.name))
    }
}

/// Rules granted in one namespace, or everywhere (`None`).
#[derive(Debug, Clone)]
struct Grant {
    namespace: Option<String>,
    rules: Arc<[Rule]>,
}

/// The RBAC state compiled by subject.
#[derive(Debug, Default)]
pub struct RbacIndex {
    by_user: HashMap<String, Vec<Grant>>,
    by_group: HashMap<String, Vec<Grant>>,
}

/// The rules of a Role or ClusterRole object (none when malformed).
pub(crate) fn rules_of(obj: &Value) -> Arc<[Rule]> {
    let rules: Vec<PolicyRule> = serde_json::from_value(obj["rules"].clone()).unwrap_or_default();
    rules.into_iter().map(Rule::from).collect()
}

impl RbacIndex {
    /// Compiles Roles, ClusterRoles and their bindings. A binding to a missing role grants
    /// nothing (upstream logs it); subjects of an unknown kind are skipped.
    pub fn build(
        roles: &[Value],
        cluster_roles: &[Value],
        role_bindings: &[Value],
        cluster_role_bindings: &[Value],
    ) -> Self {
        let key = |o: &Value| {
            (
                o["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
                o["metadata"]["name"].as_str().unwrap_or("").to_owned(),
            )
        };
        let roles: HashMap<(String, String), Arc<[Rule]>> =
            roles.iter().map(|r| (key(r), rules_of(r))).collect();
        let cluster_roles: HashMap<String, Arc<[Rule]>> = cluster_roles
            .iter()
            .map(|r| (key(r).1, rules_of(r)))
            .collect();
        let mut index = RbacIndex::default();
        let bindings = role_bindings
            .iter()
            .map(|b| (Some(key(b).0), b))
            .chain(cluster_role_bindings.iter().map(|b| (None, b)));
        for (namespace, binding) in bindings {
            let Ok(role_ref) = serde_json::from_value::<RoleRef>(binding["roleRef"].clone()) else {
                continue;
            };
            let rules = match (role_ref.kind.as_str(), &namespace) {
                ("ClusterRole", _) => cluster_roles.get(&role_ref.name),
                ("Role", Some(ns)) => roles.get(&(ns.clone(), role_ref.name.clone())),
                _ => None,
            };
            let Some(rules) = rules.cloned() else {
                continue;
            };
            let subjects: Vec<Subject> =
                serde_json::from_value(binding["subjects"].clone()).unwrap_or_default();
            for subject in subjects {
                let grant = Grant {
                    namespace: namespace.clone(),
                    rules: rules.clone(),
                };
                let (map, name) = match subject.kind.as_str() {
                    "User" => (&mut index.by_user, subject.name),
                    "Group" => (&mut index.by_group, subject.name),
                    "ServiceAccount" => {
                        let ns = subject
                            .namespace
                            .or_else(|| namespace.clone())
                            .unwrap_or_default();
                        (
                            &mut index.by_user,
                            format!("{SERVICE_ACCOUNT_PREFIX}{ns}:{}", subject.name),
                        )
                    }
                    _ => continue,
                };
                map.entry(name).or_default().push(grant);
            }
        }
        index
    }

    fn grants<'a>(&'a self, user: &'a UserInfo) -> impl Iterator<Item = &'a Grant> + 'a {
        self.by_user
            .get(&user.name)
            .into_iter()
            .chain(user.groups.iter().filter_map(|g| self.by_group.get(g)))
            .flatten()
    }

    /// Whether some rule bound to the user (by name or group) allows `attrs`: cluster-wide
    /// grants apply everywhere, a RoleBinding's only in its namespace.
    pub fn allows(&self, attrs: &Attributes) -> bool {
        self.grants(&attrs.user).any(|g| {
            g.namespace
                .as_ref()
                .is_none_or(|ns| attrs.resource_request && *ns == attrs.namespace)
                && g.rules.iter().any(|r| r.allows(attrs))
        })
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide grants included), for
    /// `SelfSubjectRulesReview`.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Rule> {
        let mut out: Vec<Rule> = Vec::new();
        for g in self.grants(user) {
            if g.namespace.as_ref().is_none_or(|ns| ns == namespace) {
                for r in g.rules.iter() {
                    if !out.contains(r) {
                        out.push(r.clone());
                    }
                }
            }
        }
        out
    }
}

/// The RBAC authorizer: an [`RbacIndex`] kept fresh from the store.
#[derive(Debug)]
pub struct RbacAuthorizer {
    index: RwLock<Arc<RbacIndex>>,
    /// Set when an RBAC object was written; the next decision rebuilds first.
    dirty: AtomicBool,
    loaded_at: RwLock<Option<tokio::time::Instant>>,
    reload: tokio::sync::Mutex<()>,
}

impl Default for RbacAuthorizer {
    fn default() -> Self {
        RbacAuthorizer {
            index: RwLock::default(),
            dirty: AtomicBool::new(true),
            loaded_at: RwLock::new(None),
            reload: tokio::sync::Mutex::new(()),
        }
    }
}

impl RbacAuthorizer {
    /// Marks the index stale (an RBAC object was written).
    pub(crate) fn invalidate(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    fn stale(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
            || self
                .loaded_at
                .read()
                .is_none_or(|t| t.elapsed() >= REFRESH_INTERVAL)
    }

    /// The current index, rebuilt first if stale. A store error keeps the previous index.
    pub(crate) async fn index(&self, state: &ServerState) -> Arc<RbacIndex> {
        if self.stale() {
            let _single = self.reload.lock().await;
            if self.stale() {
                self.dirty.store(false, Ordering::Release);
                match load(state).await {
                    Ok(index) => {
                        *self.index.write() = Arc::new(index);
                        *self.loaded_at.write() = Some(tokio::time::Instant::now());
                    }
                    Err(e) => {
                        self.dirty.store(true, Ordering::Release);
                        tracing::warn!(error = %e, "reloading RBAC failed; using the last index");
                    }
                }
            }
        }
        self.index.read().clone()
    }

    /// Whether RBAC allows `attrs`.
    pub(crate) async fn allows(&self, state: &ServerState, attrs: &Attributes) -> bool {
        self.index(state).await.allows(attrs)
    }
}

async fn load(state: &ServerState) -> Result<RbacIndex, crate::api::status::ApiError> {
    let list = |def| crate::api::list_all_objects(state, def);
    Ok(RbacIndex::build(
        &list(&ROLES).await?,
        &list(&CLUSTER_ROLES).await?,
        &list(&ROLE_BINDINGS).await?,
        &list(&CLUSTER_ROLE_BINDINGS).await?,
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry::authorization::RBAC_GROUP;

    fn get(user: &UserInfo, resource: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(user.clone(), "get", "", resource, ns, name)
    }

    /// Upstream `ResourceMatches`/`NonResourceURLMatches`: `*/status`, resourceNames,
    /// `prefix*` URLs.
    #[test]
    fn rules_match_as_upstream() {
        let alice = UserInfo::new("alice", ["dev"]);
        let rule: Rule = serde_json::from_value::<PolicyRule>(json!({
            "verbs": ["get"], "apiGroups": [""], "resources": ["*/status", "pods"],
            "resourceNames": ["p1", "n1"]
        }))
        .unwrap()
        .into();
        assert!(rule.allows(&get(&alice, "nodes/status", "", "n1")));
        assert!(!rule.allows(&get(&alice, "nodes", "", "n1")));
        assert!(rule.allows(&get(&alice, "pods", "ns", "p1")));
        assert!(!rule.allows(&get(&alice, "pods", "ns", "p2")));
        let urls = Rule {
            verbs: vec!["get".into()],
            non_resource_urls: vec!["/apis/*".into(), "/version".into()],
            ..Rule::default()
        };
        let path = |p: &str| Attributes {
            user: alice.clone(),
            verb: "get".into(),
            path: p.into(),
            ..Attributes::default()
        };
        assert!(urls.allows(&path("/apis/apps/v1")));
        assert!(urls.allows(&path("/version")));
        assert!(!urls.allows(&path("/versionx")));
        assert!(!urls.allows(&path("/api")));
    }

    /// A RoleBinding grants in its namespace only; groups and service accounts bind.
    #[test]
    fn bindings_grant_by_subject_and_namespace() {
        let role = json!({"metadata": {"namespace": "a", "name": "reader"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]});
        let binding = json!({"metadata": {"namespace": "a", "name": "b"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "reader"},
            "subjects": [{"kind": "User", "name": "alice"},
                         {"kind": "ServiceAccount", "name": "sa"}]});
        let cr = json!({"metadata": {"name": "nodes"},
            "rules": [{"verbs": ["list"], "apiGroups": [""], "resources": ["nodes"]}]});
        let crb = json!({"metadata": {"name": "nodes"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "nodes"},
            "subjects": [{"kind": "Group", "name": "ops"}]});
        let index = RbacIndex::build(&[role], &[cr], &[binding], &[crb]);
        let alice = UserInfo::new("alice", ["dev"]);
        assert!(index.allows(&get(&alice, "pods", "a", "p")));
        assert!(!index.allows(&get(&alice, "pods", "b", "p")));
        let sa = UserInfo::new("system:serviceaccount:a:sa", ["system:serviceaccounts"]);
        assert!(index.allows(&get(&sa, "pods", "a", "p")));
        let ops = UserInfo::new("bob", ["ops"]);
        let list = Attributes::resource(ops.clone(), "list", "", "nodes", "", "");
        assert!(index.allows(&list));
        assert!(!index.allows(&Attributes::resource(ops, "delete", "", "nodes", "", "n")));
        assert_eq!(index.rules_for(&alice, "a").len(), 1);
        assert!(index.rules_for(&alice, "b").is_empty());
    }
}
