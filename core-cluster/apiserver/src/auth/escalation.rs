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
//! the missing rules in upstream's compact form, one per line. Unlike upstream, the check
//! never builds the rules' parts one by one, and the message is bounded: it names the first
//! [`LISTED_MISSING`] missing parts and ends with `and <n> more` for the rest.

use std::{
    collections::{HashMap, HashSet},
    rc::Rc,
    sync::Arc,
};

use futures::future::BoxFuture;
use serde_json::Value;
use tracing::Instrument;

use super::{
    GROUP_MASTERS, UserInfo,
    authz::{Attributes, Decision},
    chain::Authorizer,
    rbac::{Rule, rules_of},
};
use crate::{
    registry::{
        ResourceDef,
        authorization::{CLUSTER_ROLES, RBAC_GROUP, ROLES},
    },
    storage::{
        ObjectReader,
        admission::{Admission, AdmissionAttributes, Operation},
        status::{ApiError, Qualified},
    },
};

/// The escalation check of RBAC's storage as an admission plugin: creates and updates of
/// RBAC objects by users who do not hold what they grant are refused.
#[derive(Debug, Clone)]
pub(crate) struct RbacEscalation {
    /// Decides `escalate` and `bind`, and holds the RBAC rules of each user.
    authorizer: Arc<Authorizer>,
    /// Reads the role a binding references.
    reader: ObjectReader,
}

impl RbacEscalation {
    /// The check, deciding with `authorizer` and reading roles through `reader`.
    pub(crate) fn new(authorizer: Arc<Authorizer>, reader: ObjectReader) -> Self {
        RbacEscalation { authorizer, reader }
    }
}

impl Admission for RbacEscalation {
    fn name(&self) -> &'static str {
        "RBACEscalation"
    }

    fn admit<'a>(
        &'a self,
        attrs: &'a AdmissionAttributes<'a>,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let (Operation::Create | Operation::Update, Some(new)) =
                (attrs.operation, attrs.object)
            else {
                return Ok(());
            };
            self.admit_write(
                attrs.user,
                attrs.resource,
                attrs.namespace,
                new,
                attrs.old_object,
            )
            .await
        })
    }
}

impl RbacEscalation {
    /// Checks a create (`old` is `None`) or update of an RBAC object by `user`.
    async fn admit_write(
        &self,
        user: &UserInfo,
        def: &ResourceDef,
        namespace: Option<&str>,
        new: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if def.group != RBAC_GROUP {
            return Ok(());
        }
        // The superuser group (`EscalationAllowed`), the server's own writes included.
        if user.in_group(GROUP_MASTERS) || old.is_some_and(|old| only_gc_fields_change(new, old)) {
            return Ok(());
        }
        let namespace = namespace.unwrap_or("");
        let name = new["metadata"]["name"].as_str().unwrap_or("");
        let span = tracing::debug_span!("rbac_escalation", kind = def.kind, namespace, name);
        confirm(self, def, user, namespace, name, new, old.is_some())
            .instrument(span)
            .await
    }
}

/// `RoleEscalationAuthorized`/`BindingAuthorized`, then `ConfirmNoEscalation`.
async fn confirm(
    state: &RbacEscalation,
    def: &ResourceDef,
    user: &UserInfo,
    namespace: &str,
    name: &str,
    new: &Value,
    update: bool,
) -> Result<(), ApiError> {
    let rules: Vec<Rule> = match def.kind {
        "Role" | "ClusterRole" => {
            // `RoleEscalationAuthorized`: the request's own attributes with the `escalate`
            // verb (no name on a create, as the request has none).
            let target = if update { name } else { "" };
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
            let role = state.reader.get(role_def, role_ns, role_name).await?;
            rules_of(&role).to_vec()
        }
        _ => return Ok(()),
    };
    let held = state.authorizer.rbac.rules_for(user, namespace);
    let missing = uncovered(&held, &rules);
    if missing.total == 0 {
        return Ok(());
    }
    tracing::debug!(missing = %missing.total, "refused: RBAC escalation");
    Err(ApiError::forbidden(
        &Qualified::new(def.group, def.plural, name),
        &not_held_message(user, &missing),
    ))
}

async fn allowed(state: &RbacEscalation, attrs: &Attributes) -> bool {
    matches!(state.authorizer.authorize(attrs).await, Decision::Allow)
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

/// How many missing permissions (one group, resource, verb and name each, or one URL and
/// verb) a refusal names at most; the rest are counted.
const LISTED_MISSING: usize = 100;

/// How many bytes of missing rules a refusal's message holds at most (the lines that do not
/// fit are counted in its last line).
const LISTED_BYTES: usize = 8 * 1024;

/// What [`uncovered`] found: the first missing permissions, each one group, resource, verb
/// and name (or one URL and verb) as upstream's `BreakdownRule` makes them, in its order,
/// and how many there are in all.
#[derive(Debug, Default)]
pub(crate) struct Missing {
    /// At most [`LISTED_MISSING`] of them.
    pub(crate) first: Vec<Rule>,
    /// All of them (a part that two wanted rules grant counts twice, as in upstream's
    /// `Covers`).
    pub(crate) total: u128,
}

/// Upstream's `Covers`: the parts of `wanted` (broken down to one group, resource, verb and
/// name each, `BreakdownRule`) that no rule of `held` covers (`ruleCovers`).
///
/// The parts are never materialized: a rule with G groups, R resources, V verbs and N names
/// has G·R·V·N of them, 10^8 for a 3 KB Role. The check walks the four lists in that order
/// and narrows, at each step, the held rules that still match the part so far (looked up by
/// value, not tried one by one). Where none matches, every part below is missing and only
/// counted; where one covers all the remaining values, every part below is covered. What
/// lies below a step depends only on the held rules still matching, so each such set is
/// worked out once. Values listed twice are checked once (the outcome and upstream's
/// message are the same).
pub(crate) fn uncovered(held: &[Rule], wanted: &[Rule]) -> Missing {
    let owners = Owners::new(held);
    let mut missing = Missing::default();
    for rule in wanted {
        let verbs = Dim::new(Axis::Verb, &rule.verbs);
        let no_name = Dim {
            axis: Axis::Name,
            values: vec![None],
        };
        let names = if rule.resource_names.is_empty() {
            no_name.clone()
        } else {
            Dim::new(Axis::Name, &rule.resource_names)
        };
        let resource_parts = vec![
            Dim::new(Axis::Group, &rule.api_groups),
            Dim::new(Axis::Resource, &rule.resources),
            verbs.clone(),
            names,
        ];
        // A part of a URL has no names, and only a held rule without names covers it.
        let url_parts = vec![Dim::new(Axis::Url, &rule.non_resource_urls), verbs, no_name];
        for dims in [resource_parts, url_parts] {
            let below = Walk::new(&owners, &dims).below(0, owners.all());
            missing.total += below.total;
            for part in &below.first {
                if missing.first.len() >= LISTED_MISSING {
                    break;
                }
                missing.first.push(part_rule(&dims, part));
            }
        }
    }
    missing
}

/// The list a value of a part comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Axis {
    Group,
    Resource,
    Verb,
    /// `None` is a part without a name (of a rule without names).
    Name,
    Url,
}

/// One list of a wanted rule, without repeats.
#[derive(Debug, Clone)]
struct Dim<'a> {
    axis: Axis,
    values: Vec<Option<&'a str>>,
}

impl<'a> Dim<'a> {
    fn new(axis: Axis, list: &'a [String]) -> Self {
        let mut seen = HashSet::new();
        let values = list
            .iter()
            .map(String::as_str)
            .filter(|v| seen.insert(*v))
            .map(Some)
            .collect();
        Dim { axis, values }
    }
}

/// A held list: `*` or the values it names.
struct Held<'a> {
    star: bool,
    values: HashSet<&'a str>,
}

impl<'a> Held<'a> {
    fn new(list: &'a [String]) -> Self {
        Held {
            star: list.iter().any(|v| v == "*"),
            values: list.iter().map(String::as_str).collect(),
        }
    }

    fn has(&self, value: &str) -> bool {
        self.star || self.values.contains(value)
    }
}

/// A held rule, ready for upstream's `ruleCovers` one value at a time.
struct Owner<'a> {
    verbs: Held<'a>,
    groups: Held<'a>,
    resources: Held<'a>,
    /// The subresources of the held `*/<subresource>` resources.
    any_resource_subs: HashSet<&'a str>,
    /// `None` for a rule without names (all names, and the parts without one).
    names: Option<HashSet<&'a str>>,
    urls: HashSet<&'a str>,
    /// The held `prefix*` URLs, without their stars.
    url_prefixes: Vec<&'a str>,
}

impl<'a> Owner<'a> {
    fn new(rule: &'a Rule) -> Self {
        Owner {
            verbs: Held::new(&rule.verbs),
            groups: Held::new(&rule.api_groups),
            resources: Held::new(&rule.resources),
            any_resource_subs: rule
                .resources
                .iter()
                .filter_map(|r| r.strip_prefix("*/"))
                .collect(),
            names: (!rule.resource_names.is_empty())
                .then(|| rule.resource_names.iter().map(String::as_str).collect()),
            urls: rule.non_resource_urls.iter().map(String::as_str).collect(),
            url_prefixes: rule
                .non_resource_urls
                .iter()
                .filter(|u| u.ends_with('*'))
                .map(|u| u.trim_end_matches('*'))
                .collect(),
        }
    }

    /// Upstream's `ruleCovers` for one value of a part: `*` or the value for verbs and
    /// groups; `*`, the value or `*/<its subresource>` for resources (`resourceCoversAll`);
    /// any name or the value for names, and no names for a part without one; the URL or a
    /// `prefix*` of it (`nonResourceURLsCoversAll`).
    fn covers(&self, axis: Axis, value: Option<&str>) -> bool {
        let Some(value) = value else {
            return self.names.is_none();
        };
        match axis {
            Axis::Verb => self.verbs.has(value),
            Axis::Group => self.groups.has(value),
            Axis::Resource => {
                self.resources.has(value)
                    || value
                        .split_once('/')
                        .is_some_and(|(_, sub)| self.any_resource_subs.contains(sub))
            }
            Axis::Name => self.names.as_ref().is_none_or(|n| n.contains(value)),
            Axis::Url => {
                self.urls.contains(value) || self.url_prefixes.iter().any(|p| value.starts_with(p))
            }
        }
    }

    /// Whether the rule covers every value of `dim`. Without `*` (or, for names, without a
    /// list of names) a rule covers no more verbs, groups or names than it lists, which
    /// settles most rules at once.
    fn covers_all(&self, dim: &Dim<'_>) -> bool {
        let listed = match dim.axis {
            Axis::Verb if !self.verbs.star => Some(self.verbs.values.len()),
            Axis::Group if !self.groups.star => Some(self.groups.values.len()),
            Axis::Name => self.names.as_ref().map(HashSet::len),
            _ => None,
        };
        if listed.is_some_and(|n| n < dim.values.len()) {
            return false;
        }
        dim.values.iter().all(|v| self.covers(dim.axis, *v))
    }
}

/// The held rules, and per list the ones that may cover a value: those holding `*` (for
/// names: holding no names; for URLs: holding a `prefix*`) and those naming it.
struct Owners<'a> {
    rules: Vec<Owner<'a>>,
    any: HashMap<AxisKey, Vec<u32>>,
    by_value: HashMap<AxisKey, HashMap<&'a str, Vec<u32>>>,
}

/// An [`Axis`], or the `*/<subresource>` resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AxisKey {
    Group,
    Resource,
    AnyResourceSub,
    Verb,
    Name,
    Url,
}

impl<'a> Owners<'a> {
    fn new(held: &'a [Rule]) -> Self {
        let mut owners = Owners {
            rules: held.iter().map(Owner::new).collect(),
            any: HashMap::new(),
            by_value: HashMap::new(),
        };
        for (i, rule) in held.iter().enumerate() {
            let i = i as u32;
            let lists = [
                (AxisKey::Verb, &rule.verbs),
                (AxisKey::Group, &rule.api_groups),
                (AxisKey::Resource, &rule.resources),
                (AxisKey::Name, &rule.resource_names),
                (AxisKey::Url, &rule.non_resource_urls),
            ];
            for (key, list) in lists {
                let any = match key {
                    AxisKey::Name => list.is_empty(),
                    AxisKey::Url => list.iter().any(|u| u.ends_with('*')),
                    _ => list.iter().any(|v| v == "*"),
                };
                if any {
                    owners.any.entry(key).or_default().push(i);
                }
                for value in list {
                    owners
                        .by_value
                        .entry(key)
                        .or_default()
                        .entry(value.as_str())
                        .or_default()
                        .push(i);
                }
            }
            for sub in rule.resources.iter().filter_map(|r| r.strip_prefix("*/")) {
                owners
                    .by_value
                    .entry(AxisKey::AnyResourceSub)
                    .or_default()
                    .entry(sub)
                    .or_default()
                    .push(i);
            }
        }
        owners
    }

    /// The rules whose list `key` names `value`.
    fn naming(&self, key: AxisKey, value: &str) -> &[u32] {
        self.by_value
            .get(&key)
            .and_then(|values| values.get(value))
            .map_or(&[], Vec::as_slice)
    }

    fn all(&self) -> Vec<u32> {
        (0..self.rules.len() as u32).collect()
    }

    /// The rules of `matching` (sorted) that cover `value`, sorted: tried one by one, or
    /// looked up by value when that finds fewer.
    fn narrow(&self, matching: &[u32], axis: Axis, value: Option<&str>) -> Vec<u32> {
        let key = match axis {
            Axis::Group => AxisKey::Group,
            Axis::Resource => AxisKey::Resource,
            Axis::Verb => AxisKey::Verb,
            Axis::Name => AxisKey::Name,
            Axis::Url => AxisKey::Url,
        };
        let sources: [&[u32]; 3] = [
            self.any.get(&key).map_or(&[], Vec::as_slice),
            value.map_or(&[], |v| self.naming(key, v)),
            match (axis, value.and_then(|v| v.split_once('/'))) {
                (Axis::Resource, Some((_, sub))) => self.naming(AxisKey::AnyResourceSub, sub),
                _ => &[],
            },
        ];
        let covers = |i: &u32| self.rules[*i as usize].covers(axis, value);
        if matching.len() <= sources.iter().map(|s| s.len()).sum() {
            return matching.iter().copied().filter(covers).collect();
        }
        let mut out: Vec<u32> = sources
            .iter()
            .flat_map(|s| s.iter().copied())
            .filter(|i| matching.binary_search(i).is_ok() && covers(i))
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// What lies below one step of the walk: how many parts are missing, and the first of them
/// (as indices into the remaining lists).
#[derive(Debug, Default)]
struct Below {
    total: u128,
    first: Vec<Vec<u32>>,
}

/// The walk of one wanted rule's parts against the held rules.
struct Walk<'o, 'a> {
    owners: &'o Owners<'a>,
    dims: &'o [Dim<'a>],
    /// `whole[level][owner]`: the held rule covers every value of every list from `level`.
    whole: Vec<Vec<bool>>,
    /// What lies below a step, by the step and the held rules still matching.
    known: HashMap<(usize, Vec<u32>), Rc<Below>>,
}

impl<'o, 'a> Walk<'o, 'a> {
    fn new(owners: &'o Owners<'a>, dims: &'o [Dim<'a>]) -> Self {
        let count = owners.rules.len();
        let mut whole = vec![vec![true; count]; dims.len() + 1];
        for level in (0..dims.len()).rev() {
            for (i, owner) in owners.rules.iter().enumerate() {
                whole[level][i] = whole[level + 1][i] && owner.covers_all(&dims[level]);
            }
        }
        Walk {
            owners,
            dims,
            whole,
            known: HashMap::new(),
        }
    }

    /// The missing parts from `level` on, given the held rules `matching` the part so far.
    fn below(&mut self, level: usize, matching: Vec<u32>) -> Rc<Below> {
        if matching.iter().any(|&i| self.whole[level][i as usize]) {
            // One held rule covers everything from here (at the last level: the part).
            return Rc::new(Below::default());
        }
        let key = (level, matching);
        if let Some(known) = self.known.get(&key) {
            return known.clone();
        }
        let below = Rc::new(if key.1.is_empty() {
            self.all_missing(level)
        } else {
            let dims: &'o [Dim<'a>] = self.dims;
            let dim = &dims[level];
            let mut below = Below::default();
            for (index, value) in dim.values.iter().enumerate() {
                let narrowed = self.owners.narrow(&key.1, dim.axis, *value);
                let next = self.below(level + 1, narrowed);
                below.total += next.total;
                for rest in &next.first {
                    if below.first.len() >= LISTED_MISSING {
                        break;
                    }
                    let mut part = Vec::with_capacity(rest.len() + 1);
                    part.push(index as u32);
                    part.extend_from_slice(rest);
                    below.first.push(part);
                }
            }
            below
        });
        self.known.insert(key, below.clone());
        below
    }

    /// Every part from `level` on: counted, and the first ones listed in order.
    fn all_missing(&self, level: usize) -> Below {
        let sizes: Vec<usize> = self.dims[level..].iter().map(|d| d.values.len()).collect();
        let total = sizes.iter().map(|&n| n as u128).product();
        let mut first = Vec::new();
        if total > 0 {
            let mut part = vec![0u32; sizes.len()];
            'odometer: while first.len() < LISTED_MISSING {
                first.push(part.clone());
                for at in (0..part.len()).rev() {
                    part[at] += 1;
                    if (part[at] as usize) < sizes[at] {
                        continue 'odometer;
                    }
                    part[at] = 0;
                }
                break;
            }
        }
        Below { total, first }
    }
}

/// One part of a wanted rule as a rule, from its value indices.
fn part_rule(dims: &[Dim<'_>], part: &[u32]) -> Rule {
    let mut rule = Rule::default();
    for (dim, &index) in dims.iter().zip(part) {
        let Some(value) = dim.values[index as usize] else {
            continue;
        };
        let list = match dim.axis {
            Axis::Group => &mut rule.api_groups,
            Axis::Resource => &mut rule.resources,
            Axis::Verb => &mut rule.verbs,
            Axis::Name => &mut rule.resource_names,
            Axis::Url => &mut rule.non_resource_urls,
        };
        list.push(value.to_owned());
    }
    rule
}

/// Upstream's `CompactRules`: rules of one group and one resource (and at most one name)
/// that differ only by verb become one rule with those verbs (each verb once). Each rule
/// comes with how many of `rules` it stands for.
fn compact(rules: &[Rule]) -> Vec<(Rule, usize)> {
    let mut out: Vec<(Rule, usize)> = Vec::new();
    let mut simple: HashMap<(&str, &str, Option<&str>), usize> = HashMap::new();
    for rule in rules {
        let is_simple = rule.resource_names.len() <= 1
            && rule.non_resource_urls.is_empty()
            && rule.api_groups.len() == 1
            && rule.resources.len() == 1;
        if !is_simple {
            out.push((rule.clone(), 1));
            continue;
        }
        let key = (
            rule.api_groups[0].as_str(),
            rule.resources[0].as_str(),
            rule.resource_names.first().map(String::as_str),
        );
        match simple.get(&key) {
            Some(&at) => {
                let (existing, count) = &mut out[at];
                for verb in &rule.verbs {
                    if !existing.verbs.contains(verb) {
                        existing.verbs.push(verb.clone());
                    }
                }
                *count += 1;
            }
            None => {
                simple.insert(key, out.len());
                out.push((rule.clone(), 1));
            }
        }
    }
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
/// sorted and unique, one per line. Bounded: past [`LISTED_MISSING`] parts or
/// [`LISTED_BYTES`] of lines, a last line `and <n> more` counts the parts not shown.
fn not_held_message(user: &UserInfo, missing: &Missing) -> String {
    let mut lines: Vec<(String, usize)> = compact(&missing.first)
        .iter()
        .map(|(rule, count)| (compact_string(rule), *count))
        .collect();
    lines.sort();
    lines.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 += later.1;
        }
        same
    });
    let mut shown = String::new();
    let mut shown_parts: u128 = 0;
    for (line, count) in &lines {
        if shown.len() + line.len() + 1 > LISTED_BYTES {
            break;
        }
        shown.push('\n');
        shown.push_str(line);
        shown_parts += *count as u128;
    }
    let mut message = format!(
        "user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:{shown}",
        user.name,
        quoted(&user.groups),
    );
    let more = missing.total.saturating_sub(shown_parts);
    if more > 0 {
        message.push_str(&format!("\nand {more} more"));
    }
    message
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
        let missing = |wanted: Rule| uncovered(&held, &[wanted]).total;
        assert_eq!(missing(rule(&["get"], &[""], &["pods", "nodes/status"])), 0);
        assert_eq!(
            missing(rule(&["delete", "patch"], &["apps"], &["deployments"])),
            0
        );
        let named = Rule {
            resource_names: vec!["cm1".into()],
            ..rule(&["get"], &[""], &["configmaps"])
        };
        assert_eq!(missing(named), 0);
        // A rule for every ConfigMap is more than one named ConfigMap.
        assert_eq!(missing(rule(&["get"], &[""], &["configmaps"])), 1);
        let url = |u: &str| Rule {
            verbs: vec!["get".into()],
            non_resource_urls: vec![u.into()],
            ..Rule::default()
        };
        assert_eq!(missing(url("/healthz/etcd")), 0);
        assert_eq!(missing(url("/metrics")), 1);
        // A star asked for is covered only by a star held.
        assert_eq!(missing(rule(&["*"], &[""], &["pods"])), 1);
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

    /// Upstream's `BreakdownRule`, materialized: the reference the lazy walk must agree with.
    fn breakdown_rule(rule: &Rule) -> Vec<Rule> {
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

    /// Upstream's `ruleCovers` (with `resourceCoversAll` and `nonResourceURLsCoversAll`),
    /// written out as upstream writes it.
    fn rule_covers(owner: &Rule, part: &Rule) -> bool {
        let has = |set: &[String], v: &str| set.iter().any(|s| s == v);
        let has_all = |set: &[String], want: &[String]| want.iter().all(|w| has(set, w));
        let verbs = has(&owner.verbs, "*") || has_all(&owner.verbs, &part.verbs);
        let groups = has(&owner.api_groups, "*") || has_all(&owner.api_groups, &part.api_groups);
        let resources = has(&owner.resources, "*")
            || has_all(&owner.resources, &part.resources)
            || part.resources.iter().all(|r| {
                has(&owner.resources, r)
                    || r.split_once('/')
                        .is_some_and(|(_, sub)| has(&owner.resources, &format!("*/{sub}")))
            });
        let urls = part.non_resource_urls.iter().all(|url| {
            owner
                .non_resource_urls
                .iter()
                .any(|o| o == url || (o.ends_with('*') && url.starts_with(o.trim_end_matches('*'))))
        });
        let names = if part.resource_names.is_empty() {
            owner.resource_names.is_empty()
        } else {
            owner.resource_names.is_empty() || has_all(&owner.resource_names, &part.resource_names)
        };
        verbs && groups && resources && urls && names
    }

    /// A small deterministic generator (xorshift) for the comparison below.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Up to `max` distinct values of `pool` (none, sometimes).
        fn pick(&mut self, pool: &[&str], max: usize) -> Vec<String> {
            let mut out: Vec<String> = Vec::new();
            for _ in 0..(self.next() as usize % (max + 1)) {
                let v = pool[self.next() as usize % pool.len()];
                if !out.iter().any(|o| o == v) {
                    out.push(v.to_owned());
                }
            }
            out
        }

        fn rule(&mut self) -> Rule {
            let verbs = ["get", "list", "delete", "*"];
            let groups = ["", "apps", "g1", "*"];
            let resources = [
                "pods",
                "pods/status",
                "nodes/status",
                "*/status",
                "secrets",
                "*",
            ];
            let names = ["a", "b", "c"];
            let urls = ["/healthz", "/healthz/etcd", "/healthz*", "/metrics", "*"];
            if self.next().is_multiple_of(5) {
                Rule {
                    verbs: self.pick(&verbs, 3),
                    non_resource_urls: self.pick(&urls, 3),
                    ..Rule::default()
                }
            } else {
                Rule {
                    verbs: self.pick(&verbs, 3),
                    api_groups: self.pick(&groups, 3),
                    resources: self.pick(&resources, 3),
                    resource_names: if self.next().is_multiple_of(2) {
                        Vec::new()
                    } else {
                        self.pick(&names, 2)
                    },
                    ..Rule::default()
                }
            }
        }
    }

    /// Upstream `Covers` = `BreakdownRule` + `ruleCovers` over every part: the walk that
    /// never materializes the parts finds the same missing parts, in the same order, and
    /// counts them all, over 3,000 generated cases.
    #[test]
    fn the_lazy_walk_agrees_with_upstreams_covers() {
        let mut generator = Gen(0x9e37_79b9_7f4a_7c15);
        let mut refused = 0;
        for _ in 0..3_000 {
            let held: Vec<Rule> = (0..generator.next() % 5)
                .map(|_| generator.rule())
                .collect();
            let wanted: Vec<Rule> = (0..1 + generator.next() % 3)
                .map(|_| generator.rule())
                .collect();
            let expected: Vec<Rule> = wanted
                .iter()
                .flat_map(breakdown_rule)
                .filter(|part| !held.iter().any(|owner| rule_covers(owner, part)))
                .collect();
            let missing = uncovered(&held, &wanted);
            assert_eq!(missing.total, expected.len() as u128, "{held:?} {wanted:?}");
            let listed = expected.len().min(LISTED_MISSING);
            assert_eq!(missing.first, expected[..listed], "{held:?} {wanted:?}");
            refused += usize::from(!expected.is_empty());
        }
        // Both outcomes were exercised.
        assert!((500..2_500).contains(&refused), "{refused}");
    }

    /// Upstream `ConfirmNoEscalation` on a Role of 100 groups, resources, verbs and names
    /// (10^8 parts of `BreakdownRule`, none held): counted without being built, and the
    /// message names the first 100 and counts the rest.
    #[test]
    fn a_hundred_of_everything_is_counted_not_built() {
        let list = |p: &str| (0..100).map(|i| format!("{p}{i}")).collect::<Vec<_>>();
        let bomb = Rule {
            api_groups: list("g"),
            resources: list("r"),
            verbs: list("v"),
            resource_names: list("n"),
            ..Rule::default()
        };
        let held = [rule(&["*"], &[""], &["*"])];
        let missing = uncovered(&held, &[bomb]);
        assert_eq!(missing.total, 100_000_000);
        assert_eq!(missing.first.len(), LISTED_MISSING);
        let message = not_held_message(&UserInfo::new("alice", ["dev"]), &missing);
        assert!(message.len() < LISTED_BYTES + 200, "{}", message.len());
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines.len(), 1 + LISTED_MISSING + 1);
        assert_eq!(
            lines[1],
            r#"{APIGroups:["g0"], Resources:["r0"], ResourceNames:["n0"], Verbs:["v0"]}"#
        );
        assert_eq!(lines[LISTED_MISSING + 1], "and 99999900 more");
    }

    /// `CompactRules` merges the verbs of one group, resource and name, each verb once; the
    /// message stops at its byte bound and counts what it leaves out.
    #[test]
    fn the_message_is_bounded_in_bytes() {
        let long = "x".repeat(3_000);
        let wanted = Rule {
            resource_names: vec![format!("{long}1"), format!("{long}2"), format!("{long}3")],
            ..rule(&["get", "get", "list"], &[""], &["pods"])
        };
        let missing = uncovered(&[], &[wanted]);
        assert_eq!(missing.total, 6);
        let message = not_held_message(&UserInfo::new("alice", ["dev"]), &missing);
        assert!(message.len() < LISTED_BYTES + 200, "{}", message.len());
        let lines: Vec<&str> = message.lines().collect();
        assert_eq!(lines.len(), 1 + 2 + 1, "{message}");
        assert!(lines[1].ends_with(r#"1"], Verbs:["get" "list"]}"#));
        assert_eq!(lines[3], "and 2 more");
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
