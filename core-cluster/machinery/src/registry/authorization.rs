//! `rbac.authorization.k8s.io/v1` (Role, ClusterRole, RoleBinding, ClusterRoleBinding, with
//! upstream's validation) and `authorization.k8s.io/v1` (the four access reviews: created,
//! answered, never stored; the API server's `auth::review` answers them).

use k8s_openapi::api::{
    authorization::v1::{
        LocalSubjectAccessReview, SelfSubjectAccessReview, SelfSubjectRulesReview,
        SubjectAccessReview,
    },
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use serde_json::{Value, json};

use super::{
    Column, NameRule, ResourceDef,
    events::identity,
    no_defaults,
    table::{AGE, NAME},
    typed,
};
use crate::registry::FieldError;

/// The RBAC API group.
pub const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// The access-review API group.
pub const AUTHORIZATION_GROUP: &str = "authorization.k8s.io";

fn no_fields(_: &Value, _: &str) -> Option<String> {
    None
}

fn no_rules(_: &Value, _: Option<&Value>) -> Vec<FieldError> {
    Vec::new()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Upstream's `ValidatePolicyRule`: verbs are required; a rule is either about resources
/// (with API groups and resources) or about non-resource URLs (cluster roles only).
fn validate_rules(obj: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let Some(rules) = obj["rules"].as_array() else {
        return errors;
    };
    for (i, rule) in rules.iter().enumerate() {
        let path = format!("rules[{i}]");
        if strings(&rule["verbs"]).is_empty() {
            errors.push(FieldError::required(
                format!("{path}.verbs"),
                "verbs must contain at least one value",
            ));
        }
        let urls = &rule["nonResourceURLs"];
        if !strings(urls).is_empty() {
            if namespaced {
                errors.push(FieldError::invalid(
                    format!("{path}.nonResourceURLs"),
                    urls,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if !strings(&rule["apiGroups"]).is_empty() || !strings(&rule["resources"]).is_empty() {
                errors.push(FieldError::invalid(
                    format!("{path}.nonResourceURLs"),
                    urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if rule["apiGroups"].as_array().is_none_or(Vec::is_empty) {
            errors.push(FieldError::required(
                format!("{path}.apiGroups"),
                "resource rules must supply at least one api group",
            ));
        }
        if strings(&rule["resources"]).is_empty() {
            errors.push(FieldError::required(
                format!("{path}.resources"),
                "resource rules must supply at least one resource",
            ));
        }
    }
    errors
}

/// Upstream's `ValidateRoleBinding`/`ValidateClusterRoleBinding` (+ `…Update`): the roleRef
/// names a Role or ClusterRole of the RBAC group and never changes; subjects are
/// ServiceAccounts, Users or Groups with names.
fn validate_binding(obj: &Value, old: Option<&Value>, kinds: &[&str]) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let role_ref = &obj["roleRef"];
    if role_ref["apiGroup"].as_str() != Some(RBAC_GROUP) {
        errors.push(FieldError::not_supported(
            "roleRef.apiGroup",
            &role_ref["apiGroup"],
            &[RBAC_GROUP],
        ));
    }
    if !kinds.contains(&role_ref["kind"].as_str().unwrap_or("")) {
        errors.push(FieldError::not_supported(
            "roleRef.kind",
            &role_ref["kind"],
            kinds,
        ));
    }
    if role_ref["name"].as_str().unwrap_or("").is_empty() {
        errors.push(FieldError::required("roleRef.name", ""));
    }
    let cluster = kinds.len() == 1;
    for (i, subject) in obj["subjects"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let path = format!("subjects[{i}]");
        if subject["name"].as_str().unwrap_or("").is_empty() {
            errors.push(FieldError::required(format!("{path}.name"), ""));
        }
        let group = subject["apiGroup"].as_str().unwrap_or("");
        match subject["kind"].as_str().unwrap_or("") {
            "ServiceAccount" => {
                if !group.is_empty() {
                    errors.push(FieldError::not_supported(
                        format!("{path}.apiGroup"),
                        &subject["apiGroup"],
                        &[""],
                    ));
                }
                if cluster && subject["namespace"].as_str().unwrap_or("").is_empty() {
                    errors.push(FieldError::required(format!("{path}.namespace"), ""));
                }
            }
            "User" | "Group" => {
                if group != RBAC_GROUP {
                    errors.push(FieldError::not_supported(
                        format!("{path}.apiGroup"),
                        &subject["apiGroup"],
                        &[RBAC_GROUP],
                    ));
                }
            }
            _ => errors.push(FieldError::not_supported(
                format!("{path}.kind"),
                &subject["kind"],
                &["ServiceAccount", "User", "Group"],
            )),
        }
    }
    if let Some(old) = old
        && old["roleRef"] != *role_ref
    {
        errors.push(FieldError::invalid(
            "roleRef",
            role_ref,
            "cannot change roleRef",
        ));
    }
    errors
}

/// `pkg/apis/rbac/v1/defaults.go`: a binding's `roleRef.apiGroup` and each subject's
/// `apiGroup`, when empty or absent, default to `rbac.authorization.k8s.io` (`""` for a
/// ServiceAccount subject).
fn default_subjects(obj: &mut Value) {
    if let Some(role_ref) = obj.get_mut("roleRef").and_then(Value::as_object_mut)
        && role_ref
            .get("apiGroup")
            .is_none_or(|g| g.is_null() || g == "")
    {
        role_ref.insert("apiGroup".into(), json!(RBAC_GROUP));
    }
    if let Some(subjects) = obj["subjects"].as_array_mut() {
        for s in subjects {
            let Some(subject) = s.as_object_mut() else {
                continue;
            };
            if subject
                .get("apiGroup")
                .is_some_and(|g| !g.is_null() && g != "")
            {
                continue;
            }
            match subject.get("kind").and_then(Value::as_str) {
                Some("User" | "Group") => {
                    subject.insert("apiGroup".into(), json!(RBAC_GROUP));
                }
                Some("ServiceAccount") => {
                    subject.insert("apiGroup".into(), json!(""));
                }
                _ => {}
            }
        }
    }
}

fn role_column(o: &Value) -> String {
    format!(
        "{}/{}",
        o["roleRef"]["kind"].as_str().unwrap_or(""),
        o["roleRef"]["name"].as_str().unwrap_or("")
    )
}

fn subjects_of(o: &Value, kind: &str) -> String {
    let names: Vec<String> = o["subjects"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|s| s["kind"] == kind)
                .map(|s| match (kind, s["namespace"].as_str()) {
                    ("ServiceAccount", Some(ns)) => {
                        format!("{ns}/{}", s["name"].as_str().unwrap_or(""))
                    }
                    _ => s["name"].as_str().unwrap_or("").to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    names.join(", ")
}

const CREATED_AT: Column = Column {
    name: "Created At",
    type_: "string",
    format: "date",
    description: "The time the role was created",
    priority: 0,
    cell: |o, _| json!(o["metadata"]["creationTimestamp"].as_str().unwrap_or("")),
};

const BINDING_COLUMNS: &[Column] = &[
    NAME,
    Column {
        name: "Role",
        type_: "string",
        format: "",
        description: "The role of the binding",
        priority: 0,
        cell: |o, _| json!(role_column(o)),
    },
    AGE,
    Column {
        name: "Users",
        type_: "string",
        format: "",
        description: "The users bound",
        priority: 1,
        cell: |o, _| json!(subjects_of(o, "User")),
    },
    Column {
        name: "Groups",
        type_: "string",
        format: "",
        description: "The groups bound",
        priority: 1,
        cell: |o, _| json!(subjects_of(o, "Group")),
    },
    Column {
        name: "ServiceAccounts",
        type_: "string",
        format: "",
        description: "The service accounts bound",
        priority: 1,
        cell: |o, _| json!(subjects_of(o, "ServiceAccount")),
    },
];

/// A definition of the RBAC group; only identity and rules differ between the four.
macro_rules! rbac_def {
    ($kind:literal, $plural:literal, $singular:literal, $namespaced:expr, $ty:ty,
     $columns:expr, $defaults:expr, $validate:expr) => {
        ResourceDef {
            group: RBAC_GROUP,
            version: "v1",
            kind: $kind,
            plural: $plural,
            singular: $singular,
            short_names: &[],
            categories: &[],
            namespaced: $namespaced,
            status: false,
            generation: false,
            extra_subresources: &[],
            storage: concat!("rbac.authorization.k8s.io/", $plural),
            name_rule: NameRule::PathSegment,
            typed: typed::<$ty>,
            columns: $columns,
            field: no_fields,
            field_paths: &[],
            prepare_update: $defaults,
            prepare_create: $defaults,
            validate: $validate,
            to_storage: identity,
            from_storage: identity,
        }
    };
}

/// rbac.authorization.k8s.io/v1 roles.
pub static ROLES: ResourceDef = rbac_def!(
    "Role",
    "roles",
    "role",
    true,
    Role,
    &[NAME, CREATED_AT],
    no_defaults,
    |o, _| validate_rules(o, true)
);

/// rbac.authorization.k8s.io/v1 clusterroles.
pub static CLUSTER_ROLES: ResourceDef = rbac_def!(
    "ClusterRole",
    "clusterroles",
    "clusterrole",
    false,
    ClusterRole,
    &[NAME, CREATED_AT],
    no_defaults,
    |o, _| validate_rules(o, false)
);

/// rbac.authorization.k8s.io/v1 rolebindings.
pub static ROLE_BINDINGS: ResourceDef = rbac_def!(
    "RoleBinding",
    "rolebindings",
    "rolebinding",
    true,
    RoleBinding,
    BINDING_COLUMNS,
    default_subjects,
    |o, old| validate_binding(o, old, &["Role", "ClusterRole"])
);

/// rbac.authorization.k8s.io/v1 clusterrolebindings.
pub static CLUSTER_ROLE_BINDINGS: ResourceDef = rbac_def!(
    "ClusterRoleBinding",
    "clusterrolebindings",
    "clusterrolebinding",
    false,
    ClusterRoleBinding,
    BINDING_COLUMNS,
    default_subjects,
    |o, old| validate_binding(o, old, &["ClusterRole"])
);

/// An access review: create-only, answered by the authorizer and never stored.
macro_rules! review_def {
    ($kind:literal, $plural:literal, $singular:literal, $namespaced:expr, $ty:ty) => {
        ResourceDef {
            group: AUTHORIZATION_GROUP,
            version: "v1",
            kind: $kind,
            plural: $plural,
            singular: $singular,
            short_names: &[],
            categories: &[],
            namespaced: $namespaced,
            status: false,
            generation: false,
            extra_subresources: &[],
            storage: concat!("authorization.k8s.io/", $plural),
            name_rule: NameRule::Subdomain,
            typed: typed::<$ty>,
            columns: &[NAME],
            field: no_fields,
            field_paths: &[],
            prepare_update: no_defaults,
            prepare_create: no_defaults,
            validate: no_rules,
            to_storage: identity,
            from_storage: identity,
        }
    };
}

/// authorization.k8s.io/v1 subjectaccessreviews.
pub static SUBJECT_ACCESS_REVIEWS: ResourceDef = review_def!(
    "SubjectAccessReview",
    "subjectaccessreviews",
    "subjectaccessreview",
    false,
    SubjectAccessReview
);

/// authorization.k8s.io/v1 localsubjectaccessreviews.
pub static LOCAL_SUBJECT_ACCESS_REVIEWS: ResourceDef = review_def!(
    "LocalSubjectAccessReview",
    "localsubjectaccessreviews",
    "localsubjectaccessreview",
    true,
    LocalSubjectAccessReview
);

/// authorization.k8s.io/v1 selfsubjectaccessreviews.
pub static SELF_SUBJECT_ACCESS_REVIEWS: ResourceDef = review_def!(
    "SelfSubjectAccessReview",
    "selfsubjectaccessreviews",
    "selfsubjectaccessreview",
    false,
    SelfSubjectAccessReview
);

/// authorization.k8s.io/v1 selfsubjectrulesreviews.
pub static SELF_SUBJECT_RULES_REVIEWS: ResourceDef = review_def!(
    "SelfSubjectRulesReview",
    "selfsubjectrulesreviews",
    "selfsubjectrulesreview",
    false,
    SelfSubjectRulesReview
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `ValidatePolicyRule`: verbs required, resource rules need groups and
    /// resources, non-resource URLs only in cluster roles.
    #[test]
    fn policy_rules_validate_as_upstream() {
        let role = json!({"rules": [
            {"apiGroups": [""], "resources": ["pods"]},
            {"verbs": ["get"], "nonResourceURLs": ["/healthz"]},
            {"verbs": ["get"], "apiGroups": [""]},
        ]});
        let errors = (ROLES.validate)(&role, None);
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "rules[0].verbs",
                "rules[1].nonResourceURLs",
                "rules[2].resources"
            ]
        );
        assert!(
            errors[0]
                .message
                .contains("verbs must contain at least one value")
        );
        assert!((CLUSTER_ROLES.validate)(&json!({"rules": [role["rules"][1]]}), None).is_empty());
    }

    /// `pkg/apis/rbac/v1/defaults.go`: an empty or absent `roleRef.apiGroup` is the RBAC
    /// group, as are User and Group subjects' groups; a ServiceAccount's is `""`. (The
    /// conformance suite's webhook specs bind a role without `apiGroup`.)
    #[test]
    fn role_ref_and_subject_groups_default_as_upstream() {
        for mut binding in [
            json!({"roleRef": {"kind": "ClusterRole", "name": "a"},
                   "subjects": [{"kind": "User", "name": "u"}, {"kind": "Group", "name": "g", "apiGroup": ""},
                                {"kind": "ServiceAccount", "name": "s", "namespace": "n"}]}),
            json!({"roleRef": {"apiGroup": "", "kind": "ClusterRole", "name": "a"},
                   "subjects": [{"kind": "User", "name": "u"}, {"kind": "Group", "name": "g"},
                                {"kind": "ServiceAccount", "name": "s", "namespace": "n"}]}),
        ] {
            (CLUSTER_ROLE_BINDINGS.prepare_create)(&mut binding);
            assert_eq!(binding["roleRef"]["apiGroup"], RBAC_GROUP);
            assert_eq!(binding["subjects"][0]["apiGroup"], RBAC_GROUP);
            assert_eq!(binding["subjects"][1]["apiGroup"], RBAC_GROUP);
            assert_eq!(binding["subjects"][2]["apiGroup"], "");
            assert!((CLUSTER_ROLE_BINDINGS.validate)(&binding, None).is_empty());
        }
    }

    /// Upstream `ValidateRoleBindingUpdate`: "cannot change roleRef"; a ClusterRoleBinding
    /// refers only to a ClusterRole.
    #[test]
    fn role_ref_is_immutable_and_of_the_right_kind() {
        let mut binding = json!({
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "Role", "name": "a"},
            "subjects": [{"kind": "User", "name": "alice"}],
        });
        (ROLE_BINDINGS.prepare_create)(&mut binding);
        assert!((ROLE_BINDINGS.validate)(&binding, None).is_empty());
        let mut changed = binding.clone();
        changed["roleRef"]["name"] = json!("b");
        let errors = (ROLE_BINDINGS.validate)(&changed, Some(&binding));
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].field, "roleRef");
        assert!(errors[0].message.ends_with("cannot change roleRef"));
        let errors = (CLUSTER_ROLE_BINDINGS.validate)(&binding, None);
        assert_eq!(errors[0].field, "roleRef.kind");
        let sa = json!({
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": "a"},
            "subjects": [{"kind": "ServiceAccount", "name": "ccm"}],
        });
        let errors = (CLUSTER_ROLE_BINDINGS.validate)(&sa, None);
        assert_eq!(errors[0].field, "subjects[0].namespace");
    }
}
