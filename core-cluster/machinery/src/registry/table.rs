//! `meta.k8s.io/v1 Table` rendering, so that `kubectl get` prints the same columns as on a
//! real cluster.

use serde_json::{Value, json};

use super::{ResourceDef, meta};

/// One column: its definition and how to compute a row's cell.
#[derive(Clone, Copy)]
pub struct Column {
    /// Header, e.g. `STATUS` is written `Status` (kubectl upper-cases).
    pub name: &'static str,
    /// `string`, `integer`, `date`.
    pub type_: &'static str,
    /// `name` for the name column, else empty.
    pub format: &'static str,
    /// Description.
    pub description: &'static str,
    /// 0 always shown; 1 only with `-o wide`.
    pub priority: u32,
    /// The cell for an object, given now (seconds since the epoch).
    pub cell: fn(&Value, i64) -> Value,
}

impl std::fmt::Debug for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Column").field("name", &self.name).finish()
    }
}

/// The `Name` column.
pub const NAME: Column = Column {
    name: "Name",
    type_: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
    cell: |o, _| json!(meta::str_at(o, &["metadata", "name"]).unwrap_or("")),
};

/// The `Age` column.
pub const AGE: Column = Column {
    name: "Age",
    type_: "string",
    format: "",
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    priority: 0,
    cell: |o, now| json!(age(o, &["metadata", "creationTimestamp"], now)),
};

/// The age of the timestamp at `path`, as kubectl prints it (`<unknown>` if absent).
pub fn age(obj: &Value, path: &[&str], now: i64) -> String {
    meta::str_at(obj, path)
        .and_then(meta::parse_time)
        .map_or_else(|| "<unknown>".to_owned(), |t| human_duration(now - t))
}

/// Upstream's `duration.HumanDuration`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    let s = seconds.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{}h", h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        format!("{}y{}d", d / 365, d % 365)
    } else {
        format!("{}y", d / 365)
    }
}

/// The object as `PartialObjectMetadata`.
///
/// kube-apiserver takes the metadata of its internal object, before conversion to the
/// version served: a DaemonSet's `deprecated.daemonset.template.generation` annotation,
/// which only the apps/v1 conversion writes (from `spec.templateGeneration`), is not there.
pub fn partial_metadata(obj: &Value) -> Value {
    let mut metadata = obj.get("metadata").cloned().unwrap_or_else(|| json!({}));
    if obj["kind"] == "DaemonSet"
        && let Some(annotations) = metadata["annotations"].as_object_mut()
    {
        annotations.remove("deprecated.daemonset.template.generation");
    }
    if metadata["annotations"]
        .as_object()
        .is_some_and(|a| a.is_empty())
        && let Some(m) = metadata.as_object_mut()
    {
        m.remove("annotations");
    }
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
    })
}

/// A Table of `objects`, with `metadata.resourceVersion` and `continue` set.
pub fn table(
    def: &ResourceDef,
    objects: &[Value],
    resource_version: &str,
    continue_token: Option<&str>,
    include_columns: bool,
) -> Value {
    let now = jiff::Timestamp::now().as_second();
    if let Some(custom) = crate::crd::custom(def) {
        let rows: Vec<Value> = objects
            .iter()
            .map(|o| json!({"cells": crate::crd::table_cells(&custom, o, now), "object": partial_metadata(o)}))
            .collect();
        let columns = crate::crd::table_columns(&custom);
        return finish_table(
            rows,
            columns,
            resource_version,
            continue_token,
            include_columns,
        );
    }
    let columns: Vec<Value> = def
        .columns
        .iter()
        .map(|c| {
            json!({"name": c.name, "type": c.type_, "format": c.format,
                   "description": c.description, "priority": c.priority})
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            json!({
                "cells": def.columns.iter().map(|c| (c.cell)(o, now)).collect::<Vec<_>>(),
                "object": partial_metadata(o),
            })
        })
        .collect();
    finish_table(
        rows,
        columns,
        resource_version,
        continue_token,
        include_columns,
    )
}

fn finish_table(
    rows: Vec<Value>,
    columns: Vec<Value>,
    resource_version: &str,
    continue_token: Option<&str>,
    include_columns: bool,
) -> Value {
    let mut metadata = json!({ "resourceVersion": resource_version });
    if let Some(token) = continue_token {
        metadata["continue"] = json!(token);
    }
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "rows": rows,
    });
    // Go's nil slice: a watch's Tables after the first carry `columnDefinitions: null`.
    t["columnDefinitions"] = if include_columns {
        Value::Array(columns)
    } else {
        Value::Null
    };
    t
}

/// A string at `path` of `v`, or empty.
pub(super) fn s(v: &Value, path: &[&str]) -> String {
    meta::str_at(v, path).unwrap_or("").to_owned()
}

/// `s`, or `<none>` when empty (kubectl's empty cell).
pub(super) fn none_if_empty(s: String) -> Value {
    json!(if s.is_empty() { "<none>".to_owned() } else { s })
}

/// A string map as a table cell, `k1=v1,k2=v2` (kubectl's selector columns), or `<none>`.
pub(super) fn key_values_cell(map: &Value) -> Value {
    let pairs: Vec<String> = map
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    none_if_empty(pairs.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kubectl() {
        for (s, want) in [
            (5, "5s"),
            (119, "119s"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (10 * 3600, "10h"),
            (3 * 86_400 + 3600, "3d1h"),
            (40 * 86_400, "40d"),
            (3 * 365 * 86_400, "3y0d"),
            (-5, "<invalid>"),
        ] {
            assert_eq!(human_duration(s), want, "{s}");
        }
    }
}
