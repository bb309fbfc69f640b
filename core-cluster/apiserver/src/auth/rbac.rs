//! RBAC: rules of Roles and ClusterRoles granted to subjects by RoleBindings and
//! ClusterRoleBindings (upstream's `plugin/pkg/auth/authorizer/rbac`, aggregation-free).
//!
//! Requests are decided against an [`RbacIndex`]: roles by namespace, bindings by subject
//! (user name, group) and namespace. It is loaded once from the store when the server starts
//! and then kept current one object at a time: the generic store tells its observers
//! (`storage::observe`) of every committed write to the RBAC group, whoever makes
//! it (a request, `ApiServer::apply_manifest`, namespace cleanup, the bootstrap policy),
//! and the index takes it before the write returns. A client reads its own grants at once,
//! and a decision never waits for a rebuild (upstream keeps informer-fed indexes the same
//! way).

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use k8s_openapi::api::rbac::v1::{PolicyRule, RoleRef, Subject};
use parking_lot::RwLock;
use serde_json::Value;

use super::{UserInfo, authz::Attributes};
use crate::{
    registry::{
        ResourceDef,
        authorization::{CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, RBAC_GROUP, ROLE_BINDINGS, ROLES},
    },
    storage::{ObjectReader, observe::ObjectChange},
    store::StoreError,
};

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
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
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

/// The rules of a Role or ClusterRole object (none when malformed).
pub(crate) fn rules_of(obj: &Value) -> Arc<[Rule]> {
    let rules: Vec<PolicyRule> = serde_json::from_value(obj["rules"].clone()).unwrap_or_default();
    rules.into_iter().map(Rule::from).collect()
}

/// The role a binding grants.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RoleName {
    /// A Role of the binding's namespace.
    Role(String),
    ClusterRole(String),
}

/// A binding as the index keeps it: its role and the subjects it names, as user names
/// (service accounts by their user name) and groups.
#[derive(Debug)]
struct Binding {
    role: RoleName,
    users: Vec<String>,
    groups: Vec<String>,
}

impl Binding {
    /// A RoleBinding (`namespace` set) or ClusterRoleBinding object; `None` when its
    /// `roleRef` is malformed or of an unknown kind (it grants nothing). Subjects of an
    /// unknown kind are skipped.
    fn parse(obj: &Value, namespace: Option<&str>) -> Option<Self> {
        let role_ref = serde_json::from_value::<RoleRef>(obj["roleRef"].clone()).ok()?;
        let role = match role_ref.kind.as_str() {
            "ClusterRole" => RoleName::ClusterRole(role_ref.name),
            "Role" => RoleName::Role(role_ref.name),
            _ => return None,
        };
        let subjects: Vec<Subject> =
            serde_json::from_value(obj["subjects"].clone()).unwrap_or_default();
        let mut binding = Binding {
            role,
            users: Vec::new(),
            groups: Vec::new(),
        };
        for subject in subjects {
            match subject.kind.as_str() {
                "User" => binding.users.push(subject.name),
                "Group" => binding.groups.push(subject.name),
                "ServiceAccount" => {
                    let ns = subject
                        .namespace
                        .or_else(|| namespace.map(str::to_owned))
                        .unwrap_or_default();
                    binding
                        .users
                        .push(format!("{SERVICE_ACCOUNT_PREFIX}{ns}:{}", subject.name));
                }
                _ => {}
            }
        }
        Some(binding)
    }
}

/// The bindings that name one subject: ClusterRoleBindings, and RoleBindings by namespace
/// (each by name, in name order).
#[derive(Debug, Default)]
struct Bound {
    cluster: BTreeSet<String>,
    by_namespace: HashMap<String, BTreeSet<String>>,
}

impl Bound {
    fn is_empty(&self) -> bool {
        self.cluster.is_empty() && self.by_namespace.is_empty()
    }
}

/// The RBAC state compiled for decisions: roles by namespace, bindings by subject and
/// namespace. Bindings refer to roles by name, so a role written after its binding takes
/// effect as it is written, and one write changes one entry.
#[derive(Debug, Default)]
pub struct RbacIndex {
    /// Roles' rules by namespace and name.
    roles: HashMap<String, HashMap<String, Arc<[Rule]>>>,
    cluster_roles: HashMap<String, Arc<[Rule]>>,
    /// RoleBindings by namespace and name.
    role_bindings: HashMap<String, HashMap<String, Binding>>,
    cluster_role_bindings: HashMap<String, Binding>,
    /// The bindings naming each user name, and each group.
    users: HashMap<String, Bound>,
    groups: HashMap<String, Bound>,
}

/// Which of the four kinds a stored object is, from its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Role,
    ClusterRole,
    RoleBinding,
    ClusterRoleBinding,
}

/// Where the four kinds are stored, under one prefix.
fn rbac_key_prefix() -> String {
    let roles = ROLES.key_prefix(None);
    let group_prefix = roles
        .strip_suffix(&format!("{}/", ROLES.plural))
        .unwrap_or(&roles);
    group_prefix.to_owned()
}

/// The kind, namespace and name stored at `key`, if it is an RBAC object's key.
fn parse_key(key: &str) -> Option<(Kind, Option<&str>, &str)> {
    for (def, kind) in [
        (&ROLES, Kind::Role),
        (&CLUSTER_ROLES, Kind::ClusterRole),
        (&ROLE_BINDINGS, Kind::RoleBinding),
        (&CLUSTER_ROLE_BINDINGS, Kind::ClusterRoleBinding),
    ] {
        let Some(rest) = key.strip_prefix(&def.key_prefix(None)) else {
            continue;
        };
        return if def.namespaced {
            let (ns, name) = rest.split_once('/')?;
            Some((kind, Some(ns), name))
        } else {
            Some((kind, None, rest))
        };
    }
    None
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
        let mut index = RbacIndex::default();
        for (kind, objects) in [
            (Kind::Role, roles),
            (Kind::ClusterRole, cluster_roles),
            (Kind::RoleBinding, role_bindings),
            (Kind::ClusterRoleBinding, cluster_role_bindings),
        ] {
            for obj in objects {
                let meta = &obj["metadata"];
                let ns = meta["namespace"].as_str().unwrap_or("");
                let name = meta["name"].as_str().unwrap_or("");
                let ns = matches!(kind, Kind::Role | Kind::RoleBinding).then_some(ns);
                index.put(kind, ns, name, Some(obj));
            }
        }
        index
    }

    /// Applies a write to the store: the object now at `key` (`None` when deleted).
    /// Keys outside the RBAC group are ignored; a stored value that is not JSON counts as
    /// deleted (the read path refuses it too).
    fn apply(&mut self, key: &str, value: Option<&[u8]>) {
        let Some((kind, ns, name)) = parse_key(key) else {
            return;
        };
        let obj = value.and_then(|v| match serde_json::from_slice::<Value>(v) {
            Ok(obj) => Some(obj),
            Err(e) => {
                tracing::warn!(key, error = %e, "an RBAC object is not JSON; it grants nothing");
                None
            }
        });
        self.put(kind, ns, name, obj.as_ref());
    }

    /// Sets (or, with `None`, removes) one object.
    fn put(&mut self, kind: Kind, ns: Option<&str>, name: &str, obj: Option<&Value>) {
        match (kind, ns) {
            (Kind::Role, Some(ns)) => match obj {
                Some(obj) => {
                    self.roles
                        .entry(ns.to_owned())
                        .or_default()
                        .insert(name.to_owned(), rules_of(obj));
                }
                None => {
                    if let Some(roles) = self.roles.get_mut(ns) {
                        roles.remove(name);
                        if roles.is_empty() {
                            self.roles.remove(ns);
                        }
                    }
                }
            },
            (Kind::ClusterRole, _) => match obj {
                Some(obj) => {
                    self.cluster_roles.insert(name.to_owned(), rules_of(obj));
                }
                None => {
                    self.cluster_roles.remove(name);
                }
            },
            (Kind::RoleBinding, Some(_)) | (Kind::ClusterRoleBinding, _) => {
                let ns = ns.filter(|_| kind == Kind::RoleBinding);
                self.unbind(ns, name);
                if let Some(binding) = obj.and_then(|obj| Binding::parse(obj, ns)) {
                    self.bind(ns, name, binding);
                }
            }
            _ => {}
        }
    }

    fn bind(&mut self, ns: Option<&str>, name: &str, binding: Binding) {
        let subjects = [
            (&mut self.users, &binding.users),
            (&mut self.groups, &binding.groups),
        ];
        for (map, subjects) in subjects {
            for subject in subjects {
                let bound = map.entry(subject.clone()).or_default();
                let names = match ns {
                    Some(ns) => bound.by_namespace.entry(ns.to_owned()).or_default(),
                    None => &mut bound.cluster,
                };
                names.insert(name.to_owned());
            }
        }
        match ns {
            Some(ns) => {
                self.role_bindings
                    .entry(ns.to_owned())
                    .or_default()
                    .insert(name.to_owned(), binding);
            }
            None => {
                self.cluster_role_bindings.insert(name.to_owned(), binding);
            }
        }
    }

    fn unbind(&mut self, ns: Option<&str>, name: &str) {
        let removed = match ns {
            Some(ns) => {
                let bindings = self.role_bindings.get_mut(ns);
                let removed = bindings.and_then(|bindings| {
                    let removed = bindings.remove(name);
                    Some((removed?, bindings.is_empty()))
                });
                removed.map(|(binding, now_empty)| {
                    if now_empty {
                        self.role_bindings.remove(ns);
                    }
                    binding
                })
            }
            None => self.cluster_role_bindings.remove(name),
        };
        let Some(binding) = removed else {
            return;
        };
        let subjects = [
            (&mut self.users, &binding.users),
            (&mut self.groups, &binding.groups),
        ];
        for (map, subjects) in subjects {
            for subject in subjects {
                let Some(bound) = map.get_mut(subject) else {
                    continue;
                };
                match ns {
                    Some(ns) => {
                        if let Some(names) = bound.by_namespace.get_mut(ns) {
                            names.remove(name);
                            if names.is_empty() {
                                bound.by_namespace.remove(ns);
                            }
                        }
                    }
                    None => {
                        bound.cluster.remove(name);
                    }
                }
                if bound.is_empty() {
                    map.remove(subject);
                }
            }
        }
    }

    /// The rules of the binding `name` (a RoleBinding of `ns`, or a ClusterRoleBinding),
    /// if its role exists.
    fn granted_by(&self, ns: Option<&str>, name: &str) -> Option<&[Rule]> {
        let binding = match ns {
            Some(ns) => self.role_bindings.get(ns)?.get(name)?,
            None => self.cluster_role_bindings.get(name)?,
        };
        let rules = match (&binding.role, ns) {
            (RoleName::ClusterRole(role), _) => self.cluster_roles.get(role)?,
            (RoleName::Role(role), Some(ns)) => self.roles.get(ns)?.get(role)?,
            (RoleName::Role(_), None) => return None,
        };
        Some(rules)
    }

    /// The rule lists bound to `user` (by name, then by each group): in `namespace` if
    /// given, then cluster-wide.
    fn granted<'a>(
        &'a self,
        user: &'a UserInfo,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = &'a [Rule]> + 'a {
        self.users
            .get(&user.name)
            .into_iter()
            .chain(user.groups.iter().filter_map(|g| self.groups.get(g)))
            .flat_map(move |bound| {
                let local = namespace
                    .and_then(|ns| Some((ns, bound.by_namespace.get(ns)?)))
                    .into_iter()
                    .flat_map(move |(ns, names)| {
                        names
                            .iter()
                            .filter_map(move |n| self.granted_by(Some(ns), n))
                    });
                let cluster = bound
                    .cluster
                    .iter()
                    .filter_map(move |n| self.granted_by(None, n));
                local.chain(cluster)
            })
    }

    /// Whether some rule bound to the user (by name or group) allows `attrs`: cluster-wide
    /// grants apply everywhere, a RoleBinding's only in its namespace.
    pub fn allows(&self, attrs: &Attributes) -> bool {
        let namespace = attrs.resource_request.then_some(attrs.namespace.as_str());
        self.granted(&attrs.user, namespace)
            .any(|rules| rules.iter().any(|r| r.allows(attrs)))
    }

    /// Every rule that applies to `user` in `namespace` (cluster-wide grants included), each
    /// once, for `SelfSubjectRulesReview` and the escalation check.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Rule> {
        let mut seen: HashSet<&Rule> = HashSet::new();
        let mut out = Vec::new();
        for rules in self.granted(user, Some(namespace)) {
            for rule in rules {
                if seen.insert(rule) {
                    out.push(rule.clone());
                }
            }
        }
        out
    }
}

/// The RBAC authorizer: an [`RbacIndex`] kept current by the committed writes the generic
/// store tells it of (`RbacAuthorizer::changed`).
#[derive(Debug, Default)]
pub struct RbacAuthorizer {
    /// Updated in place, one object per write; decisions read it under the read lock.
    index: RwLock<RbacIndex>,
    /// Held across each index update, so that updates of one key apply in turn.
    writes: tokio::sync::Mutex<()>,
    /// Set when the index may miss a write (one failed mid-way, or the store could not be
    /// read back) and reloading it failed too: the next RBAC write reloads it first.
    reload: AtomicBool,
}

impl RbacAuthorizer {
    /// Whether RBAC allows `attrs`.
    pub(crate) fn allows(&self, attrs: &Attributes) -> bool {
        self.index.read().allows(attrs)
    }

    /// Every rule that applies to `user` in `namespace` (see [`RbacIndex::rules_for`]).
    pub(crate) fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<Rule> {
        self.index.read().rules_for(user, namespace)
    }

    /// Loads the index from the store: once, before the server serves (and writes).
    pub(crate) async fn load(&self, reader: &ObjectReader) -> Result<(), StoreError> {
        let _serial = self.writes.lock().await;
        self.reload(reader).await
    }

    /// Reads every RBAC object into a new index, then swaps it in. Call with `writes` held.
    async fn reload(&self, reader: &ObjectReader) -> Result<(), StoreError> {
        let listed = reader.list_raw(&rbac_key_prefix()).await?;
        let mut index = RbacIndex::default();
        for kv in &listed {
            index.apply(&kv.key, Some(&kv.value));
        }
        *self.index.write() = index;
        self.reload.store(false, Ordering::Release);
        Ok(())
    }

    /// Whether writes of `def` change the index: the four kinds of the RBAC group.
    pub(crate) fn observes(def: &ResourceDef) -> bool {
        def.group == RBAC_GROUP
    }

    /// After a committed write of an RBAC object: the index takes what the store holds at
    /// its key now. Reading it back, rather than taking the change's object, keeps the
    /// index right when two writes of one object are told in the other order.
    pub(crate) async fn changed(&self, reader: &ObjectReader, change: &ObjectChange<'_>) {
        let _serial = self.writes.lock().await;
        if self.reload.load(Ordering::Acquire) {
            if let Err(e) = self.reload(reader).await {
                tracing::warn!(error = %e, "reloading RBAC failed");
            }
            return;
        }
        let def = change.def;
        match reader.raw(def, change.namespace, change.name).await {
            Ok(value) => {
                let key = def.key(change.namespace, change.name);
                self.index.write().apply(&key, value.as_deref());
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading a written RBAC object back failed; reloading RBAC");
                self.reload_or_mark(reader).await;
            }
        }
    }

    /// The index may miss a write: it is read again now, or at the next RBAC write if that
    /// fails.
    pub(crate) async fn lost(&self, reader: &ObjectReader) {
        let _serial = self.writes.lock().await;
        self.reload_or_mark(reader).await;
    }

    async fn reload_or_mark(&self, reader: &ObjectReader) {
        if let Err(e) = self.reload(reader).await {
            self.reload.store(true, Ordering::Release);
            tracing::warn!(error = %e, "reloading RBAC failed; retrying at the next RBAC write");
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::registry::{ResourceDef, authorization::RBAC_GROUP};

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

    /// Upstream's rule resolver (`pkg/registry/rbac/validation/rule.go VisitRulesFor`) reads
    /// the current bindings and roles: each write changes the index by one object, a binding
    /// may come before its role, and a changed or deleted binding stops granting its old
    /// subjects, in its namespace only.
    #[test]
    fn writes_update_the_index_one_object_at_a_time() {
        let key = |def: &ResourceDef, ns: Option<&str>, name: &str| def.key(ns, name);
        let bytes = |v: Value| serde_json::to_vec(&v).unwrap();
        let alice = UserInfo::new("alice", ["dev"]);
        let bob = UserInfo::new("bob", ["dev"]);
        let mut index = RbacIndex::default();
        let binding = |user: &str| {
            bytes(json!({"metadata": {"namespace": "a", "name": "b"},
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "reader"},
                "subjects": [{"kind": "User", "name": user}]}))
        };
        index.apply(
            &key(&ROLE_BINDINGS, Some("a"), "b"),
            Some(&binding("alice")),
        );
        // The role does not exist yet: nothing is granted.
        assert!(!index.allows(&get(&alice, "pods", "a", "p")));
        let role = bytes(json!({"metadata": {"namespace": "a", "name": "reader"},
            "rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}));
        index.apply(&key(&ROLES, Some("a"), "reader"), Some(&role));
        assert!(index.allows(&get(&alice, "pods", "a", "p")));
        // The same names in another namespace grant nothing in this one, and the reverse.
        index.apply(&key(&ROLES, Some("c"), "reader"), Some(&role));
        assert!(!index.allows(&get(&alice, "pods", "c", "p")));
        // A changed binding: bob now, alice no more.
        index.apply(&key(&ROLE_BINDINGS, Some("a"), "b"), Some(&binding("bob")));
        assert!(!index.allows(&get(&alice, "pods", "a", "p")));
        assert!(index.allows(&get(&bob, "pods", "a", "p")));
        // A changed role: its new rules, for every binding to it.
        let writer = bytes(json!({"metadata": {"namespace": "a", "name": "reader"},
            "rules": [{"verbs": ["delete"], "apiGroups": [""], "resources": ["pods"]}]}));
        index.apply(&key(&ROLES, Some("a"), "reader"), Some(&writer));
        assert!(!index.allows(&get(&bob, "pods", "a", "p")));
        let delete = Attributes::resource(bob.clone(), "delete", "", "pods", "a", "p");
        assert!(index.allows(&delete));
        // Deleted: the role, then the binding; nothing is left behind for bob.
        index.apply(&key(&ROLES, Some("a"), "reader"), None);
        assert!(!index.allows(&delete));
        index.apply(&key(&ROLE_BINDINGS, Some("a"), "b"), None);
        assert!(index.users.is_empty() && index.role_bindings.is_empty());
        // A ClusterRoleBinding to a ClusterRole, by group; other keys are ignored.
        let cr = bytes(json!({"metadata": {"name": "lister"},
            "rules": [{"verbs": ["list"], "apiGroups": [""], "resources": ["nodes"]}]}));
        let crb = bytes(json!({"metadata": {"name": "devs"},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "lister"},
            "subjects": [{"kind": "Group", "name": "dev"}]}));
        index.apply(&key(&CLUSTER_ROLES, None, "lister"), Some(&cr));
        index.apply(&key(&CLUSTER_ROLE_BINDINGS, None, "devs"), Some(&crb));
        index.apply("/registry/configmaps/a/x", Some(&crb));
        let list = Attributes::resource(alice.clone(), "list", "", "nodes", "", "");
        assert!(index.allows(&list));
        assert_eq!(index.rules_for(&alice, "a").len(), 1);
        index.apply(&key(&CLUSTER_ROLE_BINDINGS, None, "devs"), None);
        assert!(!index.allows(&list));
        assert!(index.groups.is_empty());
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
