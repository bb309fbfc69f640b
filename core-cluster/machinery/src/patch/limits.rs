//! Bounds on what a write may produce: nesting depth and size.
//!
//! Every stored object is read back with `serde_json`, whose decoder refuses documents nested
//! deeper than [`MAX_DEPTH`] containers. An object the decoder cannot read must never be
//! stored, so every write is checked against the same bound ([`check_depth`]), and patches
//! check it while they run, before an operation can nest a value deeper. Sizes follow
//! kube-apiserver: a JSON patch may copy at most [`MAX_COPY_BYTES`] in total (its
//! `AccumulatedCopySizeLimit`, the request limit) and hold at most [`MAX_OPERATIONS`]
//! operations; the stored object is bounded by the server's `max_object_bytes` (etcd's
//! 1.5 MiB request limit upstream).
//!
//! Every function here is iterative: a value nested far deeper than the limit (built in
//! memory by a patch) is measured without recursion, so it cannot overflow the stack.

use serde_json::Value;

/// The deepest nesting of arrays and objects `serde_json` decodes (its recursion limit of
/// 128 counts the container that hits it): the limit for every stored object.
pub const MAX_DEPTH: usize = 127;

/// The most bytes one JSON patch may copy in total (kube-apiserver sets the json-patch
/// library's `AccumulatedCopySizeLimit` to its 3 MiB request limit).
pub const MAX_COPY_BYTES: usize = 3 * 1024 * 1024;

/// The most operations in one JSON patch (kube-apiserver's `maxJSONPatchOperations`).
pub const MAX_OPERATIONS: usize = 10_000;

/// The nesting depth of `value`: 0 for a scalar, 1 for `{}` or `[]`, one more per level.
/// Stops counting once past `limit` (returns `limit + 1`), so its cost is bounded by the
/// part of the value within the limit.
pub fn depth_capped(value: &Value, limit: usize) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((v, d)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(m) => Box::new(m.values()),
            _ => continue,
        };
        let here = d + 1;
        deepest = deepest.max(here);
        if deepest > limit {
            return limit + 1;
        }
        stack.extend(children.map(|c| (c, here)));
    }
    deepest
}

/// The nesting depth of `value` (see [`depth_capped`]).
pub fn depth(value: &Value) -> usize {
    depth_capped(value, usize::MAX - 1)
}

/// Whether `value` nests deeper than [`MAX_DEPTH`].
pub fn too_deep(value: &Value) -> bool {
    depth_capped(value, MAX_DEPTH) > MAX_DEPTH
}

/// An error message if `value` nests deeper than [`MAX_DEPTH`].
pub fn check_depth(value: &Value) -> Result<(), String> {
    if too_deep(value) {
        return Err(format!(
            "the object nests deeper than {MAX_DEPTH} levels of arrays and objects"
        ));
    }
    Ok(())
}

/// The length of `value` as compact JSON, not counting string escapes (so never more than
/// the real length); stops once past `limit` and returns `limit + 1`.
pub fn encoded_len_capped(value: &Value, limit: usize) -> usize {
    let mut total = 0usize;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        total = total.saturating_add(match v {
            Value::Null => 4,
            Value::Bool(b) => 4 + usize::from(!b),
            Value::Number(n) => n.to_string().len(),
            Value::String(s) => s.len() + 2,
            Value::Array(a) => {
                stack.extend(a.iter());
                2 + a.len().saturating_sub(1)
            }
            Value::Object(m) => {
                stack.extend(m.values());
                // `"key":` per member, commas between them.
                2 + m.keys().map(|k| k.len() + 3).sum::<usize>() + m.len().saturating_sub(1)
            }
        });
        if total > limit {
            return limit + 1;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn nested_arrays(n: usize) -> String {
        format!("{}{}", "[".repeat(n), "]".repeat(n))
    }

    /// MAX_DEPTH is exactly what the read path's decoder accepts.
    #[test]
    fn max_depth_matches_the_decoder() {
        let ok: Value = serde_json::from_str(&nested_arrays(MAX_DEPTH)).unwrap();
        assert_eq!(depth(&ok), MAX_DEPTH);
        assert!(!too_deep(&ok));
        assert!(serde_json::from_str::<Value>(&nested_arrays(MAX_DEPTH + 1)).is_err());
        let mut deeper = ok;
        deeper = Value::Array(vec![deeper]);
        assert!(too_deep(&deeper));
        assert!(check_depth(&deeper).is_err());
    }

    #[test]
    fn depth_of_values() {
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!({})), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": []}], "c": 2})), 4);
        assert_eq!(depth_capped(&json!([[[[]]]]), 2), 3);
    }

    /// A value far deeper than any decoder allows is measured (and dropped) without
    /// overflowing the stack.
    #[test]
    fn very_deep_values_are_measured_without_recursion() {
        let mut v = json!(null);
        for _ in 0..200_000 {
            v = Value::Array(vec![v]);
        }
        assert!(too_deep(&v));
        assert_eq!(depth(&v), 200_000);
        assert!(encoded_len_capped(&v, 1_000) > 1_000);
        // Dropping it recursively would overflow the stack; take it apart first.
        let mut cur = v;
        while let Value::Array(mut a) = cur {
            cur = a.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn encoded_len_is_the_compact_json_length_without_escapes() {
        for v in [
            json!(null),
            json!(true),
            json!(false),
            json!(-12.5),
            json!("abc"),
            json!([]),
            json!({}),
            json!({"a": [1, 2, {"b": "c"}], "dd": null, "e": false}),
        ] {
            let real = serde_json::to_string(&v).unwrap().len();
            assert_eq!(encoded_len_capped(&v, usize::MAX - 1), real, "{v}");
        }
        assert_eq!(encoded_len_capped(&json!("x".repeat(100)), 10), 11);
    }
}
