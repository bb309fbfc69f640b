//! Strategic merge patch, `application/strategic-merge-patch+json`.
//!
//! A JSON merge patch whose lists merge according to the field's schema
//! ([`TypeNode`]): lists with a merge key merge element by element, lists of
//! primitives with the merge strategy behave as sets, other lists are replaced whole.
//!
//! Directives understood:
//!
//! * `"$patch": "replace"` in a map replaces the map with the rest of the patch map;
//!   `"$patch": "delete"` in a map empties it. As a list element,
//!   `{"$patch": "replace"}` replaces the list with the other patch elements, and
//!   `{"$patch": "delete", <key>: <value>}` removes the element with that key.
//! * `"$retainKeys": [..]` keeps only the listed keys of the original map (the patch
//!   may only set listed keys).
//! * `"$deleteFromPrimitiveList/<field>": [..]` removes those values from the list
//!   of primitives in `<field>`.
//! * `"$setElementOrder/<field>": [..]` orders the merged list `<field>`: by merge key
//!   (`[{"type": "Ready"}, ...]`) for keyed lists, by value for sets.
//!
//! Any other key starting with `$`, and any other `$patch` value, is an error.
//!
//! Merged lists are ordered as upstream orders them: the elements the patch names
//! (or `$setElementOrder` names) in that order, the other elements in their server
//! order, the two interleaved by server position. An element new to the server is
//! therefore placed before the server-only elements that follow it: patching
//! `[{"type": "New"}]` into `[A, B]` gives `[New, A, B]`.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use super::schema::{ListStrategy, TypeNode};
use super::{PatchError, id_key};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";
const SET_ELEMENT_ORDER: &str = "$setElementOrder/";

/// Applies a strategic merge patch to `original` following `schema`.
///
/// The patch must be a JSON object. Errors in the patch's own structure (unknown
/// directives, directive values of the wrong type) are [`PatchError::Malformed`];
/// elements of a keyed list without their merge key are [`PatchError::Unprocessable`].
pub fn strategic_merge(
    original: &Value,
    patch: &Value,
    schema: &TypeNode,
) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Malformed(
            "a strategic merge patch must be a JSON object".into(),
        ));
    };
    let original = match original {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    Ok(Value::Object(merge_map(original, patch, schema)?))
}

fn malformed(msg: impl Into<String>) -> PatchError {
    PatchError::Malformed(msg.into())
}

fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    schema: &TypeNode,
) -> Result<Map<String, Value>, PatchError> {
    if let Some(directive) = patch.get(PATCH) {
        return match directive.as_str() {
            Some("replace") => {
                let mut rest = patch.clone();
                rest.remove(PATCH);
                merge_map(Map::new(), &rest, schema)
            }
            Some("delete") => Ok(Map::new()),
            _ => Err(malformed(format!(
                "unknown $patch directive {directive} in a map"
            ))),
        };
    }

    if let Some(retain) = patch.get(RETAIN_KEYS) {
        let Value::Array(retain) = retain else {
            return Err(malformed("$retainKeys must be a list of strings"));
        };
        let keys = retain
            .iter()
            .map(|k| {
                k.as_str()
                    .ok_or_else(|| malformed("$retainKeys must be a list of strings"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(k) = patch
            .iter()
            .find(|(k, v)| !k.starts_with('$') && !v.is_null() && !keys.contains(&k.as_str()))
            .map(|(k, _)| k)
        {
            return Err(malformed(format!(
                "the patch sets {k:?}, which is not in $retainKeys"
            )));
        }
        original.retain(|k, _| keys.contains(&k.as_str()));
    }

    let mut orders = Vec::new();
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            let Value::Array(remove) = value else {
                return Err(malformed(format!("{key} must be a list")));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|v| !remove.contains(v));
            }
        } else if let Some(field) = key.strip_prefix(SET_ELEMENT_ORDER) {
            let Value::Array(order) = value else {
                return Err(malformed(format!("{key} must be a list")));
            };
            let server = match original.get(field) {
                Some(Value::Array(list)) => list.clone(),
                _ => Vec::new(),
            };
            orders.push((field, order, server));
        } else if key.starts_with('$') && key != PATCH && key != RETAIN_KEYS {
            return Err(malformed(format!(
                "unknown strategic merge patch directive {key:?}"
            )));
        }
    }

    for (key, value) in patch {
        if key.starts_with('$') {
            continue;
        }
        if value.is_null() {
            original.remove(key);
            continue;
        }
        let field = schema.field(key);
        let slot = original.entry(key.clone()).or_insert(Value::Null);
        *slot = merge_value(std::mem::take(slot), value, field)?;
    }

    for (field, order, server) in orders {
        let strategy = schema.field(field).list().0;
        if strategy == ListStrategy::Replace {
            continue;
        }
        let order = order_identities(order, strategy, field)?;
        if let Some(Value::Array(patch_list)) = patch.get(field) {
            check_patch_follows_order(patch_list, &order, strategy, field)?;
        }
        if let Some(Value::Array(list)) = original.get_mut(field) {
            let server = server
                .iter()
                .filter_map(|v| identity(v, strategy))
                .collect::<Vec<_>>();
            *list = normalize_order(std::mem::take(list), &order, &server, strategy);
        }
    }
    Ok(original)
}

fn merge_value(existing: Value, patch: &Value, schema: &TypeNode) -> Result<Value, PatchError> {
    Ok(match (existing, patch) {
        (Value::Object(o), Value::Object(p)) => Value::Object(merge_map(o, p, schema)?),
        (Value::Array(o), Value::Array(p)) => Value::Array(merge_list(o, p, schema)?),
        (_, Value::Object(p)) => Value::Object(merge_map(Map::new(), p, schema)?),
        (_, Value::Array(p)) => Value::Array(merge_list(Vec::new(), p, schema)?),
        (_, p) => p.clone(),
    })
}

/// Splits the `$patch` elements out of a patch list: whether one asked to replace the
/// list, and the remaining elements (including `delete` ones when `keyed`).
fn special_elements(patch: &[Value], keyed: bool) -> Result<(bool, Vec<&Value>), PatchError> {
    let mut replace = false;
    let mut rest = Vec::with_capacity(patch.len());
    for element in patch {
        match element.get(PATCH) {
            None => rest.push(element),
            Some(d) if d == "replace" => replace = true,
            Some(d) if d == "delete" && keyed => rest.push(element),
            Some(d) if d == "delete" => {
                return Err(malformed(
                    "$patch: delete in a list needs a merge key; use $deleteFromPrimitiveList",
                ));
            }
            Some(d) => return Err(malformed(format!("unknown $patch directive {d} in a list"))),
        }
    }
    Ok((replace, rest))
}

fn merge_list(
    original: Vec<Value>,
    patch: &[Value],
    schema: &TypeNode,
) -> Result<Vec<Value>, PatchError> {
    let (strategy, item) = schema.list();
    match strategy {
        ListStrategy::Replace => Ok(patch.to_vec()),
        ListStrategy::Set => {
            let (replace, rest) = special_elements(patch, false)?;
            let mut out = if replace { Vec::new() } else { original };
            let server = out.clone();
            let mut present: HashSet<String> = out.iter().map(id_key).collect();
            for v in &rest {
                if present.insert(id_key(v)) {
                    out.push((*v).clone());
                }
            }
            let order: Vec<Value> = rest.into_iter().cloned().collect();
            Ok(normalize_order(out, &order, &server, ListStrategy::Set))
        }
        ListStrategy::MergeByKey(_) | ListStrategy::MergeByKeys(_) => {
            let key = strategy.keys().join(", ");
            let (replace, rest) = special_elements(patch, true)?;
            let mut out = if replace { Vec::new() } else { original };
            // Deletions first, so that the server order is that of what remains.
            let mut deleted = HashSet::new();
            for element in &rest {
                if element.get(PATCH).is_some() && !replace {
                    let id = strategy
                        .element_key(element)
                        .ok_or_else(|| missing_key(element, &key))?;
                    deleted.insert(id_key(&id));
                }
            }
            if !deleted.is_empty() {
                out.retain(|o| {
                    strategy
                        .element_key(o)
                        .is_none_or(|id| !deleted.contains(&id_key(&id)))
                });
            }
            let server: Vec<Value> = out.iter().filter_map(|v| strategy.element_key(v)).collect();
            // Elements by merge key (the first of equal keys, as a scan would find).
            let mut positions: HashMap<String, usize> = HashMap::with_capacity(out.len());
            for (i, o) in out.iter().enumerate() {
                if let Some(id) = strategy.element_key(o) {
                    positions.entry(id_key(&id)).or_insert(i);
                }
            }
            let mut order = Vec::new();
            for element in rest {
                let Value::Object(element) = element else {
                    return Err(PatchError::Unprocessable(format!(
                        "list element {element} is not an object; the list merges on key {key:?}"
                    )));
                };
                if element.get(PATCH).is_some() {
                    // A delete (the only directive `special_elements` lets through),
                    // done above.
                    continue;
                }
                let Some(id) = strategy.element_key(&Value::Object(element.clone())) else {
                    return Err(missing_key(&Value::Object(element.clone()), &key));
                };
                order.push(id.clone());
                match positions.get(&id_key(&id)) {
                    Some(&i) => {
                        let existing = match std::mem::take(&mut out[i]) {
                            Value::Object(m) => m,
                            _ => Map::new(),
                        };
                        out[i] = Value::Object(merge_map(existing, element, item)?);
                    }
                    None => {
                        positions.insert(id_key(&id), out.len());
                        out.push(Value::Object(merge_map(Map::new(), element, item)?));
                    }
                }
            }
            Ok(normalize_order(out, &order, &server, strategy))
        }
    }
}

fn missing_key(element: &Value, key: &str) -> PatchError {
    PatchError::Unprocessable(format!(
        "list element {element} does not contain the merge key {key:?}"
    ))
}

/// What identifies a list element for ordering: its merge key's value, or for sets
/// the element itself.
fn identity(element: &Value, strategy: ListStrategy) -> Option<Value> {
    match strategy {
        ListStrategy::MergeByKey(_) | ListStrategy::MergeByKeys(_) => strategy.element_key(element),
        _ => Some(element.clone()),
    }
}

/// The identities a `$setElementOrder` list names.
fn order_identities(
    order: &[Value],
    strategy: ListStrategy,
    field: &str,
) -> Result<Vec<Value>, PatchError> {
    order
        .iter()
        .map(|o| {
            identity(o, strategy).ok_or_else(|| {
                malformed(format!(
                    "$setElementOrder/{field}: element {o} does not contain the merge key"
                ))
            })
        })
        .collect()
}

/// The elements the patch sets must appear in `$setElementOrder`, in the same order.
fn check_patch_follows_order(
    patch: &[Value],
    order: &[Value],
    strategy: ListStrategy,
    field: &str,
) -> Result<(), PatchError> {
    let mut rest = order.iter();
    for element in patch.iter().filter(|e| e.get(PATCH).is_none()) {
        let Some(id) = identity(element, strategy) else {
            continue;
        };
        if !rest.any(|o| *o == id) {
            return Err(malformed(format!(
                "the order of {field} in the patch does not match $setElementOrder/{field}"
            )));
        }
    }
    Ok(())
}

/// Orders a merged list as the upstream API server does: the elements named by
/// `order` (the patch list, or `$setElementOrder`) come in that order, the others
/// keep the order they had on the server (`server`, identities of the list before the
/// merge), and the two sequences are interleaved by their positions on the server.
/// An element new to the server goes before the server-only elements that follow.
fn normalize_order(
    merged: Vec<Value>,
    order: &[Value],
    server: &[Value],
    strategy: ListStrategy,
) -> Vec<Value> {
    // Positions by identity, looked up in maps (first occurrence, as a scan finds):
    // linear in the list, where scanning for each element was quadratic.
    let first_positions = |list: &[Value]| {
        let mut map: HashMap<String, usize> = HashMap::with_capacity(list.len());
        for (i, id) in list.iter().enumerate() {
            map.entry(id_key(id)).or_insert(i);
        }
        map
    };
    let in_order = first_positions(order);
    let on_server = first_positions(server);
    // Each element with its position in `order` and on the server.
    let mut named: Vec<(Option<usize>, Option<usize>, Value)> = Vec::new();
    let mut server_only = Vec::new();
    for v in merged {
        let id = identity(&v, strategy).map(|id| id_key(&id));
        let positions = id.map_or((None, None), |id| {
            (in_order.get(&id).copied(), on_server.get(&id).copied())
        });
        match positions {
            (Some(o), s) => named.push((Some(o), s, v)),
            (None, s) => server_only.push((None, s, v)),
        }
    }
    named.sort_by_key(|(o, _, _)| *o);
    server_only.sort_by_key(|(_, s, _)| s.unwrap_or(usize::MAX));

    let mut out = Vec::with_capacity(named.len() + server_only.len());
    let mut named = named.into_iter().peekable();
    let mut server_only = server_only.into_iter().peekable();
    loop {
        let take_server_only = match (server_only.peek(), named.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some((_, s, _)), Some((_, n, _))) => matches!((s, n), (Some(a), Some(b)) if a < b),
        };
        let next = if take_server_only {
            server_only.next()
        } else {
            named.next()
        };
        out.extend(next.map(|(_, _, v)| v));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::patch::schema::schema_for;
    use serde_json::json;

    fn node() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}, "finalizers": ["f1"]},
            "spec": {
                "podCIDRs": ["10.0.0.0/24"],
                "taints": [{"key": "k1", "effect": "NoSchedule"}, {"key": "k2", "effect": "NoExecute"}]
            },
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "ok"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                    {"type": "DiskPressure", "status": "False"}
                ],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]
            }
        })
    }

    fn smp(original: &Value, patch: Value) -> Value {
        strategic_merge(
            original,
            &patch,
            schema_for("", original["kind"].as_str().unwrap_or("")),
        )
        .unwrap_or_else(|e| panic!("{patch}: {e}"))
    }

    #[test]
    fn cordon_and_uncordon() {
        let cordoned = smp(&node(), json!({"spec": {"unschedulable": true}}));
        assert_eq!(cordoned["spec"]["unschedulable"], json!(true));
        assert_eq!(cordoned["spec"]["taints"], node()["spec"]["taints"]);
        let uncordoned = smp(&cordoned, json!({"spec": {"unschedulable": null}}));
        assert_eq!(uncordoned, node());
    }

    #[test]
    fn taints_have_no_patch_strategy_so_the_list_is_replaced() {
        let out = smp(
            &node(),
            json!({"spec": {"taints": [{"key": "k3", "effect": "NoSchedule"}]}}),
        );
        assert_eq!(
            out["spec"]["taints"],
            json!([{"key": "k3", "effect": "NoSchedule"}])
        );
        let out = smp(&node(), json!({"spec": {"taints": []}}));
        assert_eq!(out["spec"]["taints"], json!([]));
    }

    #[test]
    fn one_condition_is_merged_and_the_others_kept() {
        let out = smp(
            &node(),
            json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady"}]}}),
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "MemoryPressure", "status": "False", "reason": "ok"},
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
                {"type": "DiskPressure", "status": "False"}
            ])
        );
        // A new condition; a null field inside an element is removed. As upstream
        // orders it, patch elements keep patch order and are interleaved with the
        // others by their server positions, so the new one goes first.
        let out = smp(
            &node(),
            json!({"status": {"conditions": [
                {"type": "PIDPressure", "status": "False"},
                {"type": "MemoryPressure", "reason": null}
            ]}}),
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "PIDPressure", "status": "False"},
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "DiskPressure", "status": "False"}
            ])
        );
    }

    #[test]
    fn patch_delete_removes_one_condition() {
        let out = smp(
            &node(),
            json!({"status": {"conditions": [{"$patch": "delete", "type": "Ready"}]}}),
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([
                {"type": "MemoryPressure", "status": "False", "reason": "ok"},
                {"type": "DiskPressure", "status": "False"}
            ])
        );
    }

    #[test]
    fn list_replace_directive() {
        let out = smp(
            &node(),
            json!({"status": {"conditions": [{"$patch": "replace"}, {"type": "Ready", "status": "Unknown"}]}}),
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "Unknown"}])
        );
    }

    #[test]
    fn map_replace_and_delete_directives() {
        let out = smp(
            &node(),
            json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"c": "3"}));
        assert_eq!(out["metadata"]["name"], json!("n1"));
        let out = smp(
            &node(),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({}));
    }

    #[test]
    fn labels_merge_and_null_deletes() {
        let out = smp(
            &node(),
            json!({"metadata": {"labels": {"a": null, "c": "3"}}}),
        );
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
    }

    #[test]
    fn primitive_sets_merge_and_delete_from_primitive_list() {
        let out = smp(
            &node(),
            json!({"metadata": {"finalizers": ["f2", "f1"]}, "spec": {"podCIDRs": ["fd00::/64"]}}),
        );
        // Patch order wins for the elements the patch names.
        assert_eq!(out["metadata"]["finalizers"], json!(["f2", "f1"]));
        assert_eq!(out["spec"]["podCIDRs"], json!(["fd00::/64", "10.0.0.0/24"]));
        let out = smp(
            &out,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["f2"]));
    }

    #[test]
    fn set_element_order_orders_the_merged_list() {
        let out = smp(
            &node(),
            json!({"status": {
                "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "PIDPressure"}, {"type": "MemoryPressure"}],
                "conditions": [{"type": "PIDPressure", "status": "False"}]
            }}),
        );
        let types: Vec<_> = out["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        // DiskPressure, unnamed by the order, comes after MemoryPressure, which
        // preceded it on the server.
        assert_eq!(
            types,
            ["Ready", "PIDPressure", "MemoryPressure", "DiskPressure"]
        );

        let out = smp(
            &node(),
            json!({"metadata": {"$setElementOrder/finalizers": ["f0", "f1"], "finalizers": ["f0"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["f0", "f1"]));
    }

    fn list(types: &[&str]) -> Value {
        Value::Array(types.iter().map(|t| json!({"type": t})).collect())
    }

    fn conditions_after(current: &[&str], patch: Value) -> Vec<String> {
        let node = json!({"kind": "Node", "status": {"conditions": list(current)}});
        let out = smp(&node, json!({"status": patch}));
        out["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Cases from upstream's strategic merge patch tests, on our own schema.
    #[test]
    fn ordering_matches_upstream() {
        // "preserve the order from the patch in a merging list 2"
        assert_eq!(
            conditions_after(&["1", "2", "3"], json!({"conditions": list(&["3", "1"])})),
            ["2", "3", "1"]
        );
        // Without $setElementOrder a new element goes before the server-only ones.
        assert_eq!(
            conditions_after(&["A", "B"], json!({"conditions": list(&["New"])})),
            ["New", "A", "B"]
        );
        // "set elements order in a list with server-only items"
        assert_eq!(
            conditions_after(
                &["1", "3", "4", "2", "9"],
                json!({"$setElementOrder/conditions": list(&["4", "2", "3", "1"])})
            ),
            ["4", "2", "3", "1", "9"]
        );
        // "set elements order in a list with server-only items 2"
        assert_eq!(
            conditions_after(
                &["1", "2", "9", "3", "4"],
                json!({"$setElementOrder/conditions": list(&["2", "1", "4", "3"])})
            ),
            ["2", "1", "9", "4", "3"]
        );
        // "add an item in a list and preserve order"
        assert_eq!(
            conditions_after(
                &["1", "2"],
                json!({"$setElementOrder/conditions": list(&["3", "1", "2"]), "conditions": list(&["3"])})
            ),
            ["3", "1", "2"]
        );
        // "merge lists of scalars", on a set
        let node = json!({"kind": "Node", "metadata": {"finalizers": ["1", "2", "4"]}});
        let out = smp(
            &node,
            json!({"metadata": {"$setElementOrder/finalizers": ["1", "2", "3"], "finalizers": ["3"]}}),
        );
        assert_eq!(out["metadata"]["finalizers"], json!(["1", "2", "3", "4"]));
        // The patch list must follow $setElementOrder.
        let err = strategic_merge(
            &node,
            &json!({"metadata": {"$setElementOrder/finalizers": ["1", "3"], "finalizers": ["3", "1"]}}),
            schema_for("", "Node"),
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)), "{err}");
    }

    #[test]
    fn retain_keys_drops_unlisted_original_keys() {
        let pod = json!({"kind": "Pod", "spec": {"volumes": [
            {"name": "v", "hostPath": {"path": "/x"}}
        ]}});
        let out = smp(
            &pod,
            json!({"spec": {"volumes": [{"name": "v", "$retainKeys": ["name", "emptyDir"], "emptyDir": {}}]}}),
        );
        assert_eq!(
            out["spec"]["volumes"],
            json!([{"name": "v", "emptyDir": {}}])
        );
        // Null values (deletions) need not be listed.
        let with_host = json!({"kind": "Pod", "spec": {"hostname": "h0", "subdomain": "s"}});
        let out = smp(
            &with_host,
            json!({"spec": {"$retainKeys": ["hostname"], "hostname": "h1", "dnsPolicy": null}}),
        );
        assert_eq!(out, json!({"kind": "Pod", "spec": {"hostname": "h1"}}));
        let err = strategic_merge(
            &pod,
            &json!({"spec": {"$retainKeys": ["volumes"], "hostname": "h"}}),
            schema_for("", "Pod"),
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)), "{err}");
    }

    #[test]
    fn pod_lists_merge_by_their_keys() {
        let pod = json!({"kind": "Pod", "spec": {
            "containers": [{
                "name": "app", "image": "app:1",
                "ports": [{"containerPort": 80, "name": "http"}],
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                "volumeMounts": [{"mountPath": "/data", "name": "data"}]
            }],
            "tolerations": [{"key": "t1", "operator": "Exists"}]
        }});
        let out = smp(
            &pod,
            json!({"spec": {
                "containers": [
                    {"name": "app", "image": "app:2",
                     "ports": [{"containerPort": 443, "name": "https"}],
                     "env": [{"name": "B", "value": "3"}],
                     "volumeMounts": [{"mountPath": "/data", "readOnly": true}]},
                    {"name": "sidecar", "image": "side:1"}
                ],
                "tolerations": [{"key": "t2", "operator": "Exists"}]
            }}),
        );
        assert_eq!(
            out["spec"],
            json!({
                "containers": [
                    {"name": "app", "image": "app:2",
                     "ports": [{"containerPort": 443, "name": "https"}, {"containerPort": 80, "name": "http"}],
                     "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "3"}],
                     "volumeMounts": [{"mountPath": "/data", "name": "data", "readOnly": true}]},
                    {"name": "sidecar", "image": "side:1"}
                ],
                "tolerations": [{"key": "t2", "operator": "Exists"}]
            })
        );
    }

    /// A `helm upgrade` that changes one env var of a Deployment sends a three-way patch
    /// with `$setElementOrder` for the containers and their env (helm's
    /// `CreateThreeWayMergePatch` on the apps/v1 Go type): containers merge by `name`, so
    /// the container keeps its image. Before workloads had a schema here the containers
    /// list was replaced whole and the image was lost.
    #[test]
    fn a_deployments_pod_template_merges_containers_by_name_as_helm_upgrade_needs() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "1"}]}
        ]}}}});
        let patch = json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "web"}],
            "containers": [{"$setElementOrder/env": [{"name": "A"}, {"name": "B"}],
                            "env": [{"name": "A", "value": "2"}], "name": "web"}]
        }}}});
        let out = strategic_merge(&deployment, &patch, schema_for("apps", "Deployment"))
            .expect("patch applies");
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "web", "image": "nginx:1",
                    "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "1"}]}])
        );
        for (group, kind) in [
            ("apps", "ReplicaSet"),
            ("apps", "DaemonSet"),
            ("apps", "StatefulSet"),
            ("batch", "Job"),
            ("", "ReplicationController"),
        ] {
            let mut object = deployment.clone();
            object["kind"] = json!(kind);
            let out =
                strategic_merge(&object, &patch, schema_for(group, kind)).expect("patch applies");
            assert_eq!(
                out["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:1",
                "{group}/{kind}"
            );
        }
        let cron = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template":
            {"spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}}});
        let out = strategic_merge(
            &cron,
            &json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers":
                [{"name": "c", "args": ["date"]}]}}}}}}),
            schema_for("batch", "CronJob"),
        )
        .expect("patch applies");
        assert_eq!(
            out["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"],
            json!([{"name": "c", "image": "busybox", "args": ["date"]}])
        );
    }

    /// Workload and budget status conditions merge by `type`
    /// (`DeploymentStatus.Conditions` `patchMergeKey:"type"`).
    #[test]
    fn workload_and_budget_conditions_merge_by_type() {
        for (group, kind) in [("apps", "Deployment"), ("policy", "PodDisruptionBudget")] {
            let object = json!({"kind": kind, "status": {"conditions": [
                {"type": "Available", "status": "True"}, {"type": "Progressing", "status": "True"}
            ]}});
            let out = strategic_merge(
                &object,
                &json!({"status": {"conditions": [{"type": "Available", "status": "False"}]}}),
                schema_for(group, kind),
            )
            .expect("patch applies");
            assert_eq!(
                out["status"]["conditions"],
                json!([{"type": "Available", "status": "False"}, {"type": "Progressing", "status": "True"}]),
                "{kind}"
            );
        }
    }

    #[test]
    fn service_ports_merge_by_port() {
        let svc = json!({"kind": "Service", "spec": {"ports": [{"port": 80, "targetPort": 8080}]}});
        let out = smp(
            &svc,
            json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 443}]}}),
        );
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 80, "targetPort": 9090}, {"port": 443}])
        );
    }

    #[test]
    fn unknown_kinds_replace_lists_and_merge_maps() {
        let obj = json!({"kind": "Widget", "spec": {"items": [1, 2], "m": {"a": 1}}});
        let out = smp(&obj, json!({"spec": {"items": [3], "m": {"b": 2}}}));
        assert_eq!(
            out,
            json!({"kind": "Widget", "spec": {"items": [3], "m": {"a": 1, "b": 2}}})
        );
    }

    #[test]
    fn new_values_are_cleaned_of_directives_and_nulls() {
        let out = smp(
            &json!({"kind": "Node"}),
            json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": null}]},
                   "metadata": {"labels": {"a": "1", "b": null}}}),
        );
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}])
        );
        assert_eq!(out["metadata"]["labels"], json!({"a": "1"}));
    }

    #[test]
    fn bad_directives_and_missing_merge_keys_are_errors() {
        let schema = schema_for("", "Node");
        let err = strategic_merge(&node(), &json!({"spec": {"$frob": 1}}), schema).unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)), "{err}");
        assert!(err.to_string().contains("$frob"), "{err}");
        let err = strategic_merge(
            &node(),
            &json!({"metadata": {"labels": {"$patch": "merge"}}}),
            schema,
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)));
        let err = strategic_merge(
            &node(),
            &json!({"status": {"conditions": [{"$patch": "explode"}]}}),
            schema,
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)));
        let err = strategic_merge(
            &node(),
            &json!({"status": {"conditions": [{"status": "True"}]}}),
            schema,
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)));
        assert!(err.to_string().contains("merge key \"type\""), "{err}");
        let err = strategic_merge(&node(), &json!([]), schema).unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)));
    }
}
