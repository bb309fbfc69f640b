//! One event store, two APIs: core/v1 `Event` (what `kubectl describe` reads) and
//! `events.k8s.io/v1` `Event` (what kube-runtime's recorder writes). Events are stored in the
//! core form and converted field by field, as kube-apiserver's conversion does.

use serde_json::{Map, Value, json};

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

/// events.k8s.io/v1 → stored (core/v1) form.
pub fn to_core(obj: Value) -> Value {
    let mut core = rename(obj, true, "v1");
    // core/v1 readers (kubectl describe) look at lastTimestamp/count; fill them from the
    // series or eventTime when the new API left them out, as upstream's conversion does.
    if core.get("lastTimestamp").is_none_or(Value::is_null)
        && let Some(t) = core
            .pointer("/series/lastObservedTime")
            .or_else(|| core.get("eventTime"))
            .and_then(Value::as_str)
    {
        let seconds = t.split('.').next().unwrap_or(t).trim_end_matches('Z');
        core["lastTimestamp"] = json!(format!("{seconds}Z"));
    }
    if core.get("count").is_none_or(Value::is_null) {
        let count = core
            .pointer("/series/count")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        core["count"] = json!(count);
    }
    core
}

/// Stored (core/v1) form → events.k8s.io/v1.
pub fn to_events_v1(obj: Value) -> Value {
    rename(obj, false, "events.k8s.io/v1")
}

/// Identity conversion for resources stored as served.
pub fn identity(obj: Value) -> Value {
    obj
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_events_read_as_core_events_and_back() {
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
        assert_eq!(core["lastTimestamp"], "2026-11-22T01:02:03Z");
        assert_eq!(core["count"], 1);
        let back = to_events_v1(core);
        assert_eq!(back["regarding"], new["regarding"]);
        assert_eq!(back["note"], new["note"]);
        assert_eq!(back["apiVersion"], "events.k8s.io/v1");
    }
}
