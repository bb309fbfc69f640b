//! One event store, two APIs: core/v1 `Event` (what `kubectl describe` reads) and
//! `events.k8s.io/v1` `Event` (what kube-runtime's recorder writes). Events are stored in the
//! core form and converted field by field, as kube-apiserver's conversion does.

use serde_json::{Map, Value, json};

use super::{
    FieldError,
    meta::{NameRule, is_zero_time, qualified_name_errors, str_at, validate_name},
};

/// (core/v1 field, events.k8s.io/v1 field) pairs that differ only by name.
const RENAMES: [(&str, &str); 7] = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

fn rename(obj: Value, from_new: bool, api_version: &str) -> Value {
    let Value::Object(mut map) = obj else {
        return obj;
    };
    let mut out = Map::with_capacity(map.len());
    for (core, new) in RENAMES {
        let (from, to) = if from_new { (new, core) } else { (core, new) };
        if let Some(v) = map.remove(from) {
            out.insert(to.to_owned(), v);
        }
    }
    out.extend(map);
    out.insert("apiVersion".into(), json!(api_version));
    out.insert("kind".into(), json!("Event"));
    Value::Object(out)
}

/// events.k8s.io/v1 → stored (core/v1) form: upstream's conversion
/// (`Convert_v1_Event_To_core_Event`, `pkg/apis/events/v1/conversion.go`) renames the
/// fields and fills in nothing (an event of the new API has no `count` nor `lastTimestamp`
/// in core/v1 either); the result carries what core/v1 always writes
/// ([`core_event_fields`]).
pub fn to_core(obj: Value) -> Value {
    let mut core = rename(obj, true, "v1");
    core_event_fields(&mut core);
    core
}

/// Stored (core/v1) form → events.k8s.io/v1 (`Convert_core_Event_To_v1_Event`: the same
/// renames), with what events.k8s.io/v1 writes ([`events_v1_fields`]).
pub fn to_events_v1(obj: Value) -> Value {
    let mut event = rename(obj, false, "events.k8s.io/v1");
    events_v1_fields(&mut event);
    event
}

/// What Go writes of a core/v1 Event whatever is set (`k8s.io/api/core/v1/types.go`):
/// `involvedObject` and `source` (non-pointer structs, `{}`), `firstTimestamp`,
/// `lastTimestamp` and `eventTime` (`metav1.Time`, `MicroTime`: `null`),
/// `reportingComponent` and `reportingInstance` (no `omitempty`: `""`), and a series's
/// `lastObservedTime`.
pub fn core_event_fields(o: &mut Value) {
    let Some(map) = o.as_object_mut() else {
        return;
    };
    for (field, zero) in [
        ("involvedObject", json!({})),
        ("source", json!({})),
        ("firstTimestamp", Value::Null),
        ("lastTimestamp", Value::Null),
        ("eventTime", Value::Null),
        ("reportingComponent", json!("")),
        ("reportingInstance", json!("")),
    ] {
        map.entry(field).or_insert(zero);
    }
    if let Some(series) = map.get_mut("series").and_then(Value::as_object_mut) {
        series.entry("lastObservedTime").or_insert(Value::Null);
    }
}

/// What Go writes of an events.k8s.io/v1 Event whatever is set
/// (`k8s.io/api/events/v1/types.go`): `eventTime` and the deprecated times (`null`),
/// `regarding` and `deprecatedSource` (`{}`); and what it leaves out when empty, which the
/// core form writes: `reportingController` and `reportingInstance` when `""`,
/// `deprecatedCount` when 0.
pub fn events_v1_fields(o: &mut Value) {
    let Some(map) = o.as_object_mut() else {
        return;
    };
    for (field, zero) in [
        ("eventTime", Value::Null),
        ("regarding", json!({})),
        ("deprecatedSource", json!({})),
        ("deprecatedFirstTimestamp", Value::Null),
        ("deprecatedLastTimestamp", Value::Null),
    ] {
        map.entry(field).or_insert(zero);
    }
    for field in ["reportingController", "reportingInstance"] {
        if map.get(field).is_some_and(|v| v.is_null() || v == "") {
            map.remove(field);
        }
    }
    if map
        .get("deprecatedCount")
        .is_some_and(|v| v.is_null() || v.as_i64() == Some(0))
    {
        map.remove("deprecatedCount");
    }
}

/// Identity conversion for resources stored as served.
pub fn identity(obj: Value) -> Value {
    obj
}

/// The API an event write came through: upstream validates events by the request's version
/// (`requestVersion` of `ValidateEventCreate`/`ValidateEventUpdate`), and the fields have
/// their version's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventApi {
    /// core/v1.
    Core,
    /// events.k8s.io/v1.
    EventsV1,
}

impl EventApi {
    /// The name in this version of the core/v1 field `core`.
    fn name(self, core: &'static str) -> &'static str {
        match self {
            EventApi::Core => core,
            EventApi::EventsV1 => RENAMES
                .iter()
                .find(|(c, _)| *c == core)
                .map_or(core, |(_, new)| new),
        }
    }
}

/// Upstream's length limits of event fields (`pkg/apis/core/validation/events.go`).
const REPORTING_INSTANCE_LENGTH_LIMIT: usize = 128;
const ACTION_LENGTH_LIMIT: usize = 128;
const REASON_LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;

/// Upstream `legacyValidateEvent`, which every event write passes: an event with no
/// `eventTime` (one of the old API) only needs its involved object's namespace to match its
/// own (an empty one for events in `default` or with no namespace); a new one needs a
/// reporting controller (a qualified name) and instance, an action and a reason within
/// their lengths, a note within 1024 characters, and an involved object's namespace unless
/// the event is in `default` or `kube-system`. The namespace must be a DNS subdomain.
fn legacy_validate_event(o: &Value, api: EventApi) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let text = |core: &'static str| o[api.name(core)].as_str().unwrap_or("");
    let namespace = str_at(o, &["metadata", "namespace"]).unwrap_or("");
    let involved_namespace = o[api.name("involvedObject")]["namespace"]
        .as_str()
        .unwrap_or("");
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            &json!(involved_namespace),
            "does not match event.namespace",
        )
    };
    if is_zero_time(&o["eventTime"]) {
        let matches = if involved_namespace.is_empty() {
            namespace.is_empty() || namespace == "default"
        } else {
            namespace == involved_namespace
        };
        if !matches {
            errors.push(mismatch());
        }
    } else {
        if involved_namespace.is_empty() && namespace != "default" && namespace != "kube-system" {
            errors.push(mismatch());
        }
        let controller_field = api.name("reportingComponent");
        let controller = text("reportingComponent");
        if controller.is_empty() {
            errors.push(FieldError::required(controller_field, ""));
        }
        for message in qualified_name_errors(controller) {
            errors.push(FieldError::invalid(
                controller_field,
                &json!(controller),
                message,
            ));
        }
        for (field, limit) in [
            ("reportingInstance", REPORTING_INSTANCE_LENGTH_LIMIT),
            ("action", ACTION_LENGTH_LIMIT),
            ("reason", REASON_LENGTH_LIMIT),
        ] {
            let value = text(field);
            if value.is_empty() {
                errors.push(FieldError::required(field, ""));
            }
            if value.len() > limit {
                errors.push(FieldError::invalid(
                    field,
                    &json!(""),
                    format!("can have at most {limit} characters"),
                ));
            }
        }
        if text("message").len() > NOTE_LENGTH_LIMIT {
            errors.push(FieldError::invalid(
                "message",
                &json!(""),
                format!("can have at most {NOTE_LENGTH_LIMIT} characters"),
            ));
        }
    }
    for message in validate_name(namespace, NameRule::Subdomain) {
        errors.push(FieldError::invalid("namespace", &json!(namespace), message));
    }
    errors
}

/// Upstream `validateV1EventSeries`: a series counts at least 2 and has a last observed
/// time.
fn validate_series(o: &Value, errors: &mut Vec<FieldError>) {
    let series = &o["series"];
    if !series.is_object() {
        return;
    }
    if series["count"].as_i64().unwrap_or(0) < 2 {
        errors.push(FieldError::invalid(
            "series.count",
            &json!(""),
            "should be at least 2",
        ));
    }
    if is_zero_time(&series["lastObservedTime"]) {
        errors.push(FieldError::required("series.lastObservedTime", ""));
    }
}

/// Whether `v` is what Go decodes as a zero value: absent or null, `""`, 0, false, or an
/// object or list of nothing else.
fn zeroish(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.values().all(zeroish),
    }
}

/// Upstream's `Semantic.DeepEqual` of decoded values: unset and zero are alike.
pub(super) fn semantic_eq(a: &Value, b: &Value) -> bool {
    if zeroish(a) && zeroish(b) {
        return true;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.keys().chain(y.keys()).all(|k| {
            semantic_eq(
                x.get(k).unwrap_or(&Value::Null),
                y.get(k).unwrap_or(&Value::Null),
            )
        }),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| semantic_eq(a, b))
        }
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

/// A time as the instant it names, truncated to `unit` seconds' fractions (1 for
/// `metav1.Time`, 1,000,000 for `metav1.MicroTime`); `None` when unset.
fn instant(v: &Value, per_second: i128) -> Option<i128> {
    if is_zero_time(v) {
        return None;
    }
    let t: jiff::Timestamp = v.as_str()?.parse().ok()?;
    Some(t.as_nanosecond() / (1_000_000_000 / per_second))
}

/// Upstream `ValidateEventCreate` for an events.k8s.io/v1 write: the legacy rules, then the
/// new API's (a series of at least 2 with its time, an `eventTime`, a `type` of `Normal` or
/// `Warning`, and none of the deprecated fields).
fn validate_new_event_create(o: &Value, errors: &mut Vec<FieldError>) {
    validate_series(o, errors);
    if is_zero_time(&o["eventTime"]) {
        errors.push(FieldError::required("eventTime", ""));
    }
    let type_ = o["type"].as_str().unwrap_or("");
    if type_ != "Normal" && type_ != "Warning" {
        errors.push(FieldError::invalid(
            "type",
            &json!(""),
            format!("has invalid value: {type_}"),
        ));
    }
    let api = EventApi::EventsV1;
    for field in ["firstTimestamp", "lastTimestamp"] {
        if !is_zero_time(&o[api.name(field)]) {
            errors.push(FieldError::invalid(field, &json!(""), "needs to be unset"));
        }
    }
    if o[api.name("count")].as_i64().unwrap_or(0) != 0 {
        errors.push(FieldError::invalid(
            "count",
            &json!(""),
            "needs to be unset",
        ));
    }
    let source = &o[api.name("source")];
    if ["component", "host"]
        .iter()
        .any(|f| !source[*f].as_str().unwrap_or("").is_empty())
    {
        errors.push(FieldError::invalid(
            "source",
            &json!(""),
            "needs to be unset",
        ));
    }
}

/// Upstream `ValidateEventUpdate` for an events.k8s.io/v1 write, after the legacy rules: a
/// changed series is checked, and what the event says is immutable.
fn validate_new_event_update(new: &Value, old: &Value, errors: &mut Vec<FieldError>) {
    if !semantic_eq(&new["series"], &old["series"]) {
        validate_series(new, errors);
    }
    let api = EventApi::EventsV1;
    for field in [
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "lastTimestamp",
        "count",
        "type",
        "eventTime",
        "action",
        "related",
        "reportingComponent",
        "reportingInstance",
    ] {
        let name = api.name(field);
        let (is, was) = (&new[name], &old[name]);
        let same = match field {
            "firstTimestamp" | "lastTimestamp" => instant(is, 1) == instant(was, 1),
            "eventTime" => instant(is, 1_000_000) == instant(was, 1_000_000),
            _ => semantic_eq(is, was),
        };
        if !same {
            let path = if field == "reportingComponent" {
                "reportingController"
            } else {
                field
            };
            errors.push(FieldError::invalid(path, is, "field is immutable"));
        }
    }
}

/// Validation of a core/v1 event write (upstream `ValidateEventCreate` and
/// `ValidateEventUpdate` with the core version: the legacy rules alone).
pub fn validate_core_event(new: &Value, _old: Option<&Value>) -> Vec<FieldError> {
    legacy_validate_event(new, EventApi::Core)
}

/// Validation of an events.k8s.io/v1 event write (upstream `ValidateEventCreate` and
/// `ValidateEventUpdate`): the legacy rules with the new names, then the new API's.
pub fn validate_events_v1_event(new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = legacy_validate_event(new, EventApi::EventsV1);
    match old {
        None => validate_new_event_create(new, &mut errors),
        Some(old) => validate_new_event_update(new, old, &mut errors),
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `Convert_v1_Event_To_core_Event` / `Convert_core_Event_To_v1_Event`
    /// (`pkg/apis/events/v1/conversion.go`): the fields are renamed and nothing is filled
    /// in, so an event of the new API has neither `count` nor a `lastTimestamp` in core/v1,
    /// nor a `deprecatedCount` back in events.k8s.io/v1.
    #[test]
    fn new_events_convert_to_core_by_renaming_alone() {
        let new = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e1", "namespace": "default"},
            "eventTime": "2026-11-22T01:02:03.456789Z",
            "reason": "Synced", "note": "Node synced successfully", "type": "Normal",
            "regarding": {"kind": "Node", "name": "n1", "apiVersion": "v1"},
            "reportingController": "cloud-node-controller", "reportingInstance": "ccm-0",
            "action": "Sync",
        });
        let core = to_core(new.clone());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "n1");
        assert_eq!(core["message"], "Node synced successfully");
        assert_eq!(core["reportingComponent"], "cloud-node-controller");
        assert_eq!(core.get("lastTimestamp"), Some(&Value::Null));
        assert_eq!(core.get("count"), None);
        let back = to_events_v1(core);
        assert_eq!(back["regarding"], new["regarding"]);
        assert_eq!(back["note"], new["note"]);
        assert_eq!(back["apiVersion"], "events.k8s.io/v1");
        assert_eq!(back.get("deprecatedCount"), None);
        assert_eq!(back.get("deprecatedLastTimestamp"), Some(&Value::Null));
    }

    /// `k8s.io/api/core/v1/types.go` `Event`: `involvedObject` and `source` are non-pointer
    /// structs, the times `metav1.Time`/`MicroTime` (`null` when unset), and
    /// `reportingComponent`/`reportingInstance` have no `omitempty`; nothing sets `count`
    /// (the core event strategy's `PrepareForCreate` is empty).
    #[test]
    fn core_events_carry_the_fields_go_always_writes() {
        let mut e = json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod"},
            "reason": "R", "lastTimestamp": "2026-01-01T00:00:00Z", "series": {"count": 2}});
        core_event_fields(&mut e);
        assert_eq!(
            e,
            json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod"}, "reason": "R",
                "source": {}, "firstTimestamp": null, "lastTimestamp": "2026-01-01T00:00:00Z",
                "eventTime": null, "reportingComponent": "", "reportingInstance": "",
                "series": {"count": 2, "lastObservedTime": null}})
        );
    }

    /// `k8s.io/api/events/v1/types.go` `Event`: `regarding` and `deprecatedSource` are
    /// non-pointer structs, `eventTime` and the deprecated times are written as `null`;
    /// `reportingController`, `reportingInstance` and `deprecatedCount` are `omitempty`, so
    /// a core event read through events.k8s.io/v1 has none of them when empty.
    #[test]
    fn events_v1_carry_the_fields_go_always_writes() {
        let core = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "p"}, "message": "m",
            "reportingComponent": "", "reportingInstance": "", "count": 0});
        let v1 = to_events_v1(core);
        assert_eq!(
            v1,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": "e", "namespace": "default"},
                "regarding": {"kind": "Pod", "name": "p"}, "note": "m", "eventTime": null,
                "deprecatedSource": {}, "deprecatedFirstTimestamp": null,
                "deprecatedLastTimestamp": null})
        );
        let mut created = json!({"metadata": {"name": "e"}, "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "c", "reportingInstance": "i", "deprecatedCount": 3});
        events_v1_fields(&mut created);
        assert_eq!(created["reportingController"], "c");
        assert_eq!(created["deprecatedCount"], 3);
        assert_eq!(created["deprecatedSource"], json!({}));
    }
}
