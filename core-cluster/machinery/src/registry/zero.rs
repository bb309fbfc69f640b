//! The fields upstream always writes, set or not: Go's `encoding/json` writes a field with
//! no `omitempty` (a string as `""`, a number as `0`, a `metav1.Time` or `MicroTime` as
//! `null`), and a non-pointer struct even with `omitempty` (as `{}` when it is empty). An
//! object kube-apiserver has decoded and encoded again carries them whatever the client
//! sent; these helpers put them into ours where a kind's defaulting runs (see
//! `k8s.io/api` `types.go` for each kind's tags).

use serde_json::{Value, json};

use super::pod_spec::{child, default_ptr};

/// `obj[field]` as an object, made an empty one when it is absent or null (a non-pointer
/// struct field): `None` when `obj` is not an object or the field holds something else.
pub(super) fn object_at<'a>(obj: &'a mut Value, field: &str) -> Option<&'a mut Value> {
    default_ptr(obj, field, json!({}));
    child(obj, field)
}

/// Each of `fields` of `obj` set to `zero` where absent or null: fields written whatever
/// their value (`json:"name"`).
pub(super) fn always(obj: &mut Value, fields: &[&str], zero: &Value) {
    for field in fields {
        default_ptr(obj, field, zero.clone());
    }
}

/// The `metav1.Time` fields `times` of each of `obj.status.conditions` written as `null`
/// when unset: the condition types of the core API groups (`PodCondition`,
/// `NodeCondition`, `JobCondition`, ...) hold their times as non-pointer structs.
pub(super) fn condition_times(obj: &mut Value, times: &[&str]) {
    let Some(conditions) = obj
        .pointer_mut("/status/conditions")
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for condition in conditions.iter_mut().filter(|c| c.is_object()) {
        always(condition, times, &Value::Null);
    }
}

/// `obj.status` as an object (made `{}` when absent or null) with each of the integer
/// `fields` that have no `omitempty` set to 0 where unset.
pub(super) fn status_counts(obj: &mut Value, fields: &[&str]) {
    if let Some(status) = object_at(obj, "status") {
        always(status, fields, &json!(0));
    }
}

/// Each of the integer `fields` of `obj.status` removed where it is 0 (or null): Go leaves
/// out a non-pointer integer tagged `omitempty` when it is zero, so a status written with
/// explicit zeros reads back without them.
pub(super) fn omit_zero_counts(obj: &mut Value, fields: &[&str]) {
    let Some(status) = obj.get_mut("status").and_then(Value::as_object_mut) else {
        return;
    };
    for field in fields {
        if status
            .get(*field)
            .is_some_and(|v| v.is_null() || v.as_f64() == Some(0.0))
        {
            status.remove(*field);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's `encoding/json`: a field without `omitempty` is written as its zero value, a
    /// struct as `{}`; what is set stays.
    #[test]
    fn unset_fields_read_as_go_writes_them() {
        let mut o = json!({"status": {"replicas": 3, "conditions": [
            {"type": "Ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}, "junk"]}});
        status_counts(&mut o, &["replicas", "readyReplicas"]);
        condition_times(&mut o, &["lastProbeTime", "lastTransitionTime"]);
        assert_eq!(
            o,
            json!({"status": {"replicas": 3, "readyReplicas": 0, "conditions": [
                {"type": "Ready", "lastProbeTime": null, "lastTransitionTime": "2026-01-01T00:00:00Z"},
                "junk"]}})
        );
        let mut none = json!({"spec": null});
        assert!(object_at(&mut none, "spec").is_some());
        assert_eq!(none, json!({"spec": {}}));
        let mut not_object = json!({"spec": 1});
        assert!(object_at(&mut not_object, "spec").is_none());
    }

    /// Go's `encoding/json`: a non-pointer integer tagged `omitempty` is left out when 0.
    #[test]
    fn zero_counts_tagged_omitempty_are_left_out() {
        let mut o = json!({"status": {"replicas": 0, "readyReplicas": 2, "observedGeneration": null, "other": 0}});
        omit_zero_counts(&mut o, &["replicas", "readyReplicas", "observedGeneration"]);
        assert_eq!(o, json!({"status": {"readyReplicas": 2, "other": 0}}));
    }
}
