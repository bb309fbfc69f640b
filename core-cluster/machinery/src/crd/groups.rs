//! Which API groups a CustomResourceDefinition may claim.
//!
//! - **Built-in groups** ([`BUILTIN_GROUPS`]): the groups kube-apiserver 1.35 itself serves
//!   or reserves, and `metrics.k8s.io`, which this server serves itself. A definition cannot
//!   claim one. Upstream lets a definition name one (at a version the built-in group does not
//!   serve) because its built-in objects live under keys a custom resource can never reach
//!   (`/registry/clusterrolebindings/…` against `/registry/<group>/<plural>/…`); here both
//!   kinds of keys are `/registry/<group>/<plural>/…`, so refusing the group is what keeps
//!   a custom resource from ever sharing a key with a built-in one (the README's table of
//!   differences says so).
//! - **Protected groups** (`k8s.io`, `kubernetes.io` and their subdomains): upstream's
//!   KEP-1111 (`apihelpers.IsProtectedCommunityGroup`, `validateAPIApproval` and the
//!   `apiapproval` controller): a definition in one needs the `api-approved.kubernetes.io`
//!   annotation, a URL or a reason starting with `unapproved`, and reports it in its
//!   `KubernetesAPIApprovalPolicyConformant` condition.

use serde_json::{Value, json};

use crate::registry::FieldError;

/// Every API group kube-apiserver 1.35 serves or reserves (k8s.io/api's groups, the
/// aggregator's and apiextensions'), and `metrics.k8s.io`, which this server serves itself.
pub const BUILTIN_GROUPS: &[&str] = &[
    "",
    "admission.k8s.io",
    "admissionregistration.k8s.io",
    "apidiscovery.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "extensions",
    "flowcontrol.apiserver.k8s.io",
    "imagepolicy.k8s.io",
    "internal.apiserver.k8s.io",
    "metrics.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "storagemigration.k8s.io",
];

/// Whether `group` is one of the [`BUILTIN_GROUPS`].
pub fn is_builtin(group: &str) -> bool {
    BUILTIN_GROUPS.contains(&group)
}

/// The annotation a definition in a protected group must carry (`KubeAPIApprovedAnnotation`).
pub const APPROVAL_ANNOTATION: &str = "api-approved.kubernetes.io";

/// The condition type upstream's `apiapproval` controller sets on definitions of protected
/// groups.
pub const APPROVAL_CONDITION: &str = "KubernetesAPIApprovalPolicyConformant";

/// `apihelpers.IsProtectedCommunityGroup`: `k8s.io`, `kubernetes.io` and their subdomains.
pub fn is_protected(group: &str) -> bool {
    group == "k8s.io"
        || group.ends_with(".k8s.io")
        || group == "kubernetes.io"
        || group.ends_with(".kubernetes.io")
}

/// `apihelpers.APIApprovalState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval {
    /// A URL: approved in that review.
    Approved,
    /// A reason starting with `unapproved`: knowingly not approved.
    Bypassed,
    /// Neither a URL nor `unapproved…`.
    Invalid,
    /// No annotation.
    Missing,
}

/// `apihelpers.GetAPIApprovalState`: the state of `annotations`' approval, and upstream's
/// words for it.
pub fn approval(annotations: &Value) -> (Approval, String) {
    let value = annotations[APPROVAL_ANNOTATION].as_str().unwrap_or("");
    if value.is_empty() {
        return (
            Approval::Missing,
            format!(
                "protected groups must have approval annotation {APPROVAL_ANNOTATION:?}, see https://github.com/kubernetes/enhancements/pull/1111"
            ),
        );
    }
    if value.starts_with("unapproved") {
        return (Approval::Bypassed, format!("not approved: {value:?}"));
    }
    if is_request_uri_with_host(value) {
        return (Approval::Approved, format!("approved in {value}"));
    }
    (
        Approval::Invalid,
        format!(
            "protected groups must have approval annotation {APPROVAL_ANNOTATION:?} with either a URL or a reason starting with \"unapproved\", see https://github.com/kubernetes/enhancements/pull/1111"
        ),
    )
}

/// What Go's `url.ParseRequestURI` accepts with a scheme and a host: `scheme://host…`, the
/// scheme a letter then letters, digits, `+`, `-` or `.`, the host not empty, and no
/// whitespace or control character anywhere.
fn is_request_uri_with_host(s: &str) -> bool {
    let Some((scheme, rest)) = s.split_once("://") else {
        return false;
    };
    let scheme_ok = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    scheme_ok && !host.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// The error of a definition in a built-in group (see the [module docs](self)), if it is
/// in one.
pub fn builtin_group_error(group: &str) -> Option<FieldError> {
    (!group.is_empty() && is_builtin(group)).then(|| {
        FieldError::invalid(
            "spec.group",
            &json!(group),
            "is an API group this server serves itself: a CustomResourceDefinition cannot claim a built-in group",
        )
    })
}

/// Upstream's `validateAPIApproval`: a definition in a protected group needs a valid
/// approval on create, and whenever an update changes the approval's state (an update that
/// keeps the state never fails on it, even an invalid one).
pub fn approval_errors(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let group = new["spec"]["group"].as_str().unwrap_or("");
    let mut errors = Vec::new();
    if !is_protected(group) {
        return errors;
    }
    let (state, reason) = approval(&new["metadata"]["annotations"]);
    if let Some(old) = old
        && approval(&old["metadata"]["annotations"]).0 == state
    {
        return errors;
    }
    let field = format!("metadata.annotations[{APPROVAL_ANNOTATION}]");
    match state {
        Approval::Invalid => errors.push(FieldError::invalid(
            field,
            &new["metadata"]["annotations"][APPROVAL_ANNOTATION],
            reason,
        )),
        Approval::Missing => errors.push(FieldError::required(field, &reason)),
        Approval::Approved | Approval::Bypassed => {}
    }
    errors
}

/// `apiapproval_controller.go calculateCondition`: the approval condition of a definition in
/// a protected group, `None` for any other group.
pub fn approval_condition(crd: &Value) -> Option<Value> {
    if !is_protected(crd["spec"]["group"].as_str().unwrap_or("")) {
        return None;
    }
    let (state, message) = approval(&crd["metadata"]["annotations"]);
    let (status, reason) = match state {
        Approval::Invalid => ("False", "InvalidAnnotation"),
        Approval::Missing => ("False", "MissingAnnotation"),
        Approval::Approved => ("True", "ApprovedAnnotation"),
        Approval::Bypassed => ("False", "UnapprovedAnnotation"),
    };
    Some(
        json!({"type": APPROVAL_CONDITION, "status": status, "reason": reason, "message": message}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(group: &str, annotation: Option<&str>) -> Value {
        let mut annotations = json!({});
        if let Some(a) = annotation {
            annotations[APPROVAL_ANNOTATION] = json!(a);
        }
        json!({"metadata": {"annotations": annotations}, "spec": {"group": group}})
    }

    fn messages(errors: &[FieldError]) -> Vec<String> {
        errors.iter().map(FieldError::full).collect()
    }

    /// `apihelpers.IsProtectedCommunityGroup`.
    #[test]
    fn k8s_io_and_kubernetes_io_and_their_subdomains_are_protected() {
        for g in ["k8s.io", "sigs.k8s.io", "kubernetes.io", "x.kubernetes.io"] {
            assert!(is_protected(g), "{g}");
        }
        for g in ["example.com", "notk8s.io", "k8s.io.example.com"] {
            assert!(!is_protected(g), "{g}");
        }
    }

    /// `validation_test.go TestValidateAPIApproval`: on create, a protected group needs the
    /// annotation, as a URL or a reason starting with "unapproved".
    #[test]
    fn a_protected_group_needs_the_approval_annotation_on_create() {
        assert_eq!(
            messages(&approval_errors(&crd("sigs.k8s.io", None), None)),
            [
                "metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111"
            ]
        );
        assert_eq!(
            messages(&approval_errors(&crd("sigs.k8s.io", Some("invalid")), None)),
            [
                "metadata.annotations[api-approved.kubernetes.io]: Invalid value: \"invalid\": protected groups must have approval annotation \"api-approved.kubernetes.io\" with either a URL or a reason starting with \"unapproved\", see https://github.com/kubernetes/enhancements/pull/1111"
            ]
        );
        let approved = crd(
            "sigs.k8s.io",
            Some("https://github.com/kubernetes/kubernetes/pull/78458"),
        );
        assert!(approval_errors(&approved, None).is_empty());
        assert!(
            approval_errors(&crd("sigs.k8s.io", Some("unapproved, experimental")), None).is_empty()
        );
        assert!(approval_errors(&crd("other.io", Some("invalid")), None).is_empty());
        // An update that keeps the state never fails on it, even an invalid one.
        let invalid = crd("sigs.k8s.io", Some("invalid"));
        assert!(approval_errors(&invalid, Some(&invalid)).is_empty());
        // One that changes it to missing does.
        assert_eq!(
            approval_errors(&crd("sigs.k8s.io", None), Some(&invalid)).len(),
            1
        );
    }

    /// Built-in groups are never a custom resource's, whatever the approval.
    #[test]
    fn a_built_in_group_is_refused() {
        assert_eq!(
            builtin_group_error("rbac.authorization.k8s.io")
                .map(|e| e.full())
                .as_deref(),
            Some(
                "spec.group: Invalid value: \"rbac.authorization.k8s.io\": is an API group this server serves itself: a CustomResourceDefinition cannot claim a built-in group"
            )
        );
        for g in [
            "coordination.k8s.io",
            "apiextensions.k8s.io",
            "apps",
            "storage.k8s.io",
        ] {
            assert!(builtin_group_error(g).is_some(), "{g}");
        }
        // A group under a built-in one's domain is not the built-in group.
        assert!(builtin_group_error("snapshot.storage.k8s.io").is_none());
        assert!(builtin_group_error("example.com").is_none());
        // No group at all is another error (required), not this one.
        assert!(builtin_group_error("").is_none());
    }

    /// `apiapproval_controller_test.go TestCalculateCondition`.
    #[test]
    fn the_approval_condition_says_what_the_annotation_is() {
        let cond = |group, a| approval_condition(&crd(group, a));
        assert_eq!(cond("other.io", None), None);
        let missing = cond("sigs.k8s.io", None).unwrap();
        assert_eq!(
            (&missing["status"], &missing["reason"]),
            (&json!("False"), &json!("MissingAnnotation"))
        );
        let invalid = cond("sigs.k8s.io", Some("bad value")).unwrap();
        assert_eq!(invalid["reason"], "InvalidAnnotation");
        let approved = cond(
            "sigs.k8s.io",
            Some("https://github.com/kubernetes/kubernetes/pull/79724"),
        )
        .unwrap();
        assert_eq!(approved["status"], "True");
        assert_eq!(
            approved["message"],
            "approved in https://github.com/kubernetes/kubernetes/pull/79724"
        );
        let bypassed = cond("sigs.k8s.io", Some("unapproved, temporarily squatting")).unwrap();
        assert_eq!(bypassed["reason"], "UnapprovedAnnotation");
        assert_eq!(
            bypassed["message"],
            "not approved: \"unapproved, temporarily squatting\""
        );
    }
}
