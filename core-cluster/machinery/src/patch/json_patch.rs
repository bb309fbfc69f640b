//! JSON patch (RFC 6902), `application/json-patch+json`, with RFC 6901 pointers.
//!
//! The whole patch is applied to a copy: either every operation succeeds or the
//! target is left as it was.
//!
//! One deliberate departure from the letter of RFC 6902, shared with the Kubernetes
//! API server (which uses the evanphx/json-patch library): a `test` whose value is
//! `null` succeeds when the target location does not exist, as long as its parent
//! does. kube-runtime's finalizer helper relies on it (`test /metadata/finalizers
//! null` before adding the first finalizer).

use serde_json::Value;

use super::{
    PatchError,
    limits::{self, MAX_COPY_BYTES, MAX_DEPTH, MAX_OPERATIONS},
};

/// Parses an RFC 6901 JSON pointer into its unescaped reference tokens.
///
/// `""` is the whole document; otherwise the pointer must start with `/`, and in each
/// token `~1` stands for `/` and `~0` for `~`; any other `~` sequence is an error.
pub fn parse_pointer(pointer: &str) -> Result<Vec<String>, PatchError> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(PatchError::Malformed(format!(
            "invalid JSON pointer {pointer:?}: it must be empty or start with '/'"
        )));
    };
    rest.split('/')
        .map(|token| {
            let mut out = String::with_capacity(token.len());
            let mut chars = token.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    out.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => out.push('~'),
                    Some('1') => out.push('/'),
                    _ => {
                        return Err(PatchError::Malformed(format!(
                            "invalid JSON pointer {pointer:?}: '~' must be followed by '0' or '1'"
                        )));
                    }
                }
            }
            Ok(out)
        })
        .collect()
}

/// Parses an array index token: digits without leading zeros.
fn array_index(token: &str, pointer: &str) -> Result<usize, PatchError> {
    let valid = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    if !valid {
        return Err(PatchError::Unprocessable(format!(
            "invalid array index {token:?} in path {pointer:?}"
        )));
    }
    token.parse().map_err(|_| {
        PatchError::Unprocessable(format!(
            "array index {token:?} in path {pointer:?} is too large"
        ))
    })
}

/// The value at `tokens`, if it exists.
fn get<'a>(doc: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    tokens.iter().try_fold(doc, |v, t| match v {
        Value::Object(m) => m.get(t),
        Value::Array(a) => array_index(t, "").ok().and_then(|i| a.get(i)),
        _ => None,
    })
}

/// The container holding the last token of `tokens` (which must not be empty).
fn parent_mut<'a>(
    doc: &'a mut Value,
    tokens: &[String],
    pointer: &str,
) -> Result<&'a mut Value, PatchError> {
    let (_, parents) = tokens
        .split_last()
        .expect("callers pass a non-empty pointer");
    let mut cur = doc;
    for t in parents {
        cur = match cur {
            Value::Object(m) => m.get_mut(t),
            Value::Array(a) => {
                let i = array_index(t, pointer)?;
                a.get_mut(i)
            }
            _ => None,
        }
        .ok_or_else(|| missing(pointer))?;
    }
    Ok(cur)
}

fn missing(pointer: &str) -> PatchError {
    PatchError::Unprocessable(format!("path {pointer:?} does not exist in the object"))
}

fn add(doc: &mut Value, pointer: &str, value: Value) -> Result<(), PatchError> {
    let tokens = parse_pointer(pointer)?;
    // The value lands `tokens.len()` levels down: refuse before nesting past what the
    // decoder reads back (an object that deep could never be read again).
    if limits::depth_capped(&value, MAX_DEPTH) + tokens.len() > MAX_DEPTH {
        return Err(PatchError::Unprocessable(format!(
            "adding at {pointer:?} would nest the object deeper than {MAX_DEPTH} levels"
        )));
    }
    let Some(last) = tokens.last() else {
        *doc = value;
        return Ok(());
    };
    match parent_mut(doc, &tokens, pointer)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            let i = if last == "-" {
                a.len()
            } else {
                array_index(last, pointer)?
            };
            if i > a.len() {
                return Err(PatchError::Unprocessable(format!(
                    "index {i} in path {pointer:?} is out of bounds (length {})",
                    a.len()
                )));
            }
            a.insert(i, value);
        }
        _ => return Err(missing(pointer)),
    }
    Ok(())
}

fn remove(doc: &mut Value, pointer: &str) -> Result<Value, PatchError> {
    let tokens = parse_pointer(pointer)?;
    let Some(last) = tokens.last() else {
        return Err(PatchError::Unprocessable(
            "cannot remove the whole object".into(),
        ));
    };
    match parent_mut(doc, &tokens, pointer)? {
        Value::Object(m) => m.remove(last).ok_or_else(|| missing(pointer)),
        Value::Array(a) => {
            let i = array_index(last, pointer)?;
            if i >= a.len() {
                return Err(missing(pointer));
            }
            Ok(a.remove(i))
        }
        _ => Err(missing(pointer)),
    }
}

/// Equality as RFC 6902 `test` defines it: numbers compare by value (`1` equals
/// `1.0`), objects ignore member order, arrays compare element by element.
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_equal(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

fn field<'a>(
    op: &'a serde_json::Map<String, Value>,
    name: &str,
    index: usize,
) -> Result<&'a Value, PatchError> {
    op.get(name)
        .ok_or_else(|| PatchError::Malformed(format!("operation {index} has no {name:?} member")))
}

fn str_field<'a>(
    op: &'a serde_json::Map<String, Value>,
    name: &str,
    index: usize,
) -> Result<&'a str, PatchError> {
    field(op, name, index)?.as_str().ok_or_else(|| {
        PatchError::Malformed(format!("operation {index}: {name:?} must be a string"))
    })
}

/// Applies one operation; `copied` counts the bytes every `copy` has duplicated so far.
fn apply_op(
    doc: &mut Value,
    op: &Value,
    index: usize,
    copied: &mut usize,
) -> Result<(), PatchError> {
    let Value::Object(op) = op else {
        return Err(PatchError::Malformed(format!(
            "operation {index} is not an object"
        )));
    };
    let name = str_field(op, "op", index)?;
    let path = str_field(op, "path", index)?;
    match name {
        "add" => add(doc, path, field(op, "value", index)?.clone()),
        "remove" => remove(doc, path).map(drop),
        "replace" => {
            let value = field(op, "value", index)?.clone();
            let tokens = parse_pointer(path)?;
            if tokens.is_empty() {
                *doc = value;
                return Ok(());
            }
            remove(doc, path)?;
            add(doc, path, value)
        }
        "move" => {
            let from = str_field(op, "from", index)?;
            let from_tokens = parse_pointer(from)?;
            let to_tokens = parse_pointer(path)?;
            if to_tokens.len() > from_tokens.len() && to_tokens.starts_with(&from_tokens) {
                return Err(PatchError::Unprocessable(format!(
                    "cannot move {from:?} into its own child {path:?}"
                )));
            }
            if from_tokens == to_tokens {
                return get(doc, &from_tokens)
                    .map(drop)
                    .ok_or_else(|| missing(from));
            }
            let value = remove(doc, from)?;
            add(doc, path, value)
        }
        "copy" => {
            let from = str_field(op, "from", index)?;
            let source = get(doc, &parse_pointer(from)?).ok_or_else(|| missing(from))?;
            // Measured before cloning: doubling copies grow an object exponentially.
            let budget = MAX_COPY_BYTES - *copied;
            let size = limits::encoded_len_capped(source, budget);
            if size > budget {
                return Err(PatchError::Unprocessable(format!(
                    "operation {index}: the patch copies more than the accumulated copy size limit of {MAX_COPY_BYTES} bytes"
                )));
            }
            *copied += size;
            let value = source.clone();
            add(doc, path, value)
        }
        "test" => {
            let expected = field(op, "value", index)?;
            let tokens = parse_pointer(path)?;
            match get(doc, &tokens) {
                Some(actual) if json_equal(actual, expected) => Ok(()),
                None if expected.is_null()
                    && (tokens.is_empty() || get(doc, &tokens[..tokens.len() - 1]).is_some()) =>
                {
                    Ok(())
                }
                Some(_) => Err(PatchError::Unprocessable(format!(
                    "test operation {index} failed: the value at {path:?} is not {expected}"
                ))),
                None => Err(PatchError::Unprocessable(format!(
                    "test operation {index} failed: path {path:?} does not exist in the object"
                ))),
            }
        }
        other => Err(PatchError::Malformed(format!(
            "operation {index} has unknown op {other:?}"
        ))),
    }
}

/// Applies a JSON patch document (an array of operations) to `target`.
///
/// Supports `add`, `remove`, `replace`, `move`, `copy` and `test`. On error `target`
/// is unchanged. A malformed document (not an array, unknown op, missing member,
/// bad pointer syntax) is [`PatchError::Malformed`]; an operation that does not apply
/// to this object (missing path, failed test, nesting past [`MAX_DEPTH`], copying more
/// than [`MAX_COPY_BYTES`] in all) is [`PatchError::Unprocessable`]; more than
/// [`MAX_OPERATIONS`] operations is [`PatchError::TooLarge`].
pub fn json_patch(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Value::Array(ops) = patch else {
        return Err(PatchError::Malformed(
            "a JSON patch must be an array of operations".into(),
        ));
    };
    if ops.len() > MAX_OPERATIONS {
        return Err(PatchError::TooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_OPERATIONS}, got {}",
            ops.len()
        )));
    }
    let mut doc = target.clone();
    let mut copied = 0;
    for (index, op) in ops.iter().enumerate() {
        apply_op(&mut doc, op, index, &mut copied)?;
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(target: Value, patch: Value) -> Value {
        json_patch(&target, &patch).unwrap_or_else(|e| panic!("{patch}: {e}"))
    }

    #[test]
    fn pointers_unescape_tilde_sequences() {
        assert_eq!(parse_pointer("").unwrap(), Vec::<String>::new());
        assert_eq!(
            parse_pointer("/a~1b/c~0d/~01").unwrap(),
            vec!["a/b", "c~d", "~1"]
        );
        assert_eq!(parse_pointer("/").unwrap(), vec![""]);
        assert!(matches!(parse_pointer("a"), Err(PatchError::Malformed(_))));
        assert!(matches!(
            parse_pointer("/a~2"),
            Err(PatchError::Malformed(_))
        ));
        assert!(matches!(
            parse_pointer("/a~"),
            Err(PatchError::Malformed(_))
        ));
    }

    #[test]
    fn escaped_annotation_keys() {
        let obj = json!({"metadata":{"annotations":{"example.com/x":"1","a~b":"2"}}});
        let out = ok(
            obj,
            json!([
                {"op":"replace","path":"/metadata/annotations/example.com~1x","value":"9"},
                {"op":"remove","path":"/metadata/annotations/a~0b"}
            ]),
        );
        assert_eq!(
            out,
            json!({"metadata":{"annotations":{"example.com/x":"9"}}})
        );
    }

    #[test]
    fn add_remove_replace_move_copy() {
        let doc = json!({"a":[1,2,3],"b":{"c":"d"}});
        let out = ok(
            doc,
            json!([
                {"op":"add","path":"/a/1","value":9},
                {"op":"add","path":"/a/-","value":4},
                {"op":"remove","path":"/a/0"},
                {"op":"replace","path":"/b/c","value":"e"},
                {"op":"copy","from":"/b","path":"/f"},
                {"op":"move","from":"/b/c","path":"/g"},
            ]),
        );
        assert_eq!(out, json!({"a":[9,2,3,4],"b":{},"f":{"c":"e"},"g":"e"}));
    }

    #[test]
    fn errors_leave_the_target_unchanged_and_say_why() {
        let doc = json!({"a":{"b":1}});
        let err = json_patch(&doc, &json!([{"op":"replace","path":"/a/x","value":1}])).unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)), "{err:?}");
        assert!(err.to_string().contains("/a/x"), "{err}");
        let err = json_patch(&doc, &json!([{"op":"add","path":"/x/y","value":1}])).unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)));
        let err =
            json_patch(&doc, &json!([{"op":"move","from":"/a","path":"/a/b/c"}])).unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)));
        let err = json_patch(&doc, &json!([{"op":"frob","path":"/a"}])).unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)));
        let err = json_patch(&doc, &json!({"op":"add"})).unwrap_err();
        assert!(matches!(err, PatchError::Malformed(_)));
        let err = json_patch(
            &json!({"a":[1]}),
            &json!([{"op":"add","path":"/a/2","value":1}]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("out of bounds"), "{err}");
        let err =
            json_patch(&json!({"a":[1]}), &json!([{"op":"remove","path":"/a/01"}])).unwrap_err();
        assert!(err.to_string().contains("invalid array index"), "{err}");
    }

    #[test]
    fn failing_test_aborts_the_whole_patch() {
        let node = json!({"metadata":{"labels":{"a":"1"}}});
        let err = json_patch(
            &node,
            &json!([
                {"op":"add","path":"/metadata/labels/b","value":"2"},
                {"op":"test","path":"/metadata/labels/a","value":"2"}
            ]),
        )
        .unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)));
        assert!(err.to_string().contains("test operation 1 failed"), "{err}");
        // A passing test, numbers compared by value.
        let out = ok(
            json!({"n":1}),
            json!([{"op":"test","path":"/n","value":1.0}]),
        );
        assert_eq!(out, json!({"n":1}));
        // A non-null test on a missing path fails.
        let err = json_patch(&node, &json!([{"op":"test","path":"/spec","value":{}}])).unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)));
    }

    #[test]
    fn kube_runtime_finalizer_add_and_remove() {
        let obj = json!({"metadata":{"name":"x"}});
        let add_first = json!([
            {"op":"test","path":"/metadata/finalizers","value":null},
            {"op":"add","path":"/metadata/finalizers","value":["x"]}
        ]);
        let with = ok(obj.clone(), add_first.clone());
        assert_eq!(with, json!({"metadata":{"name":"x","finalizers":["x"]}}));
        // The same patch again must fail: the finalizers are no longer null.
        assert!(json_patch(&with, &add_first).is_err());

        // Adding to an existing list: test the whole list, then append.
        let appended = ok(
            with.clone(),
            json!([
                {"op":"test","path":"/metadata/finalizers","value":["x"]},
                {"op":"add","path":"/metadata/finalizers/-","value":"y"}
            ]),
        );
        assert_eq!(appended["metadata"]["finalizers"], json!(["x", "y"]));

        let two = json!({"metadata":{"name":"x","finalizers":["a","x"]}});
        let remove_x = json!([
            {"op":"test","path":"/metadata/finalizers/1","value":"x"},
            {"op":"remove","path":"/metadata/finalizers/1"}
        ]);
        assert_eq!(
            ok(two, remove_x.clone()),
            json!({"metadata":{"name":"x","finalizers":["a"]}})
        );
        // If someone reordered the list the test protects the wrong element.
        let moved = json!({"metadata":{"name":"x","finalizers":["x","a"]}});
        assert!(json_patch(&moved, &remove_x).is_err());
        // The null test does not pass when the parent itself is missing.
        let err = json_patch(
            &json!({}),
            &json!([{"op":"test","path":"/metadata/finalizers","value":null}]),
        );
        assert!(err.is_err());
    }

    /// An `add` at a deep path may not nest the object past what the
    /// decoder reads back.
    #[test]
    fn adds_may_not_nest_past_the_decoder_limit() {
        let deep: Value =
            serde_json::from_str(&format!("{}{}", "[".repeat(100), "]".repeat(100))).unwrap();
        let mut path = String::from("/a");
        let mut doc = json!({"a": {}});
        let mut cur = &mut doc["a"];
        for i in 0..40 {
            cur[format!("k{i}")] = json!({});
            cur = &mut cur[format!("k{i}")];
            path.push_str(&format!("/k{i}"));
        }
        path.push_str("/x");
        let err =
            json_patch(&doc, &json!([{"op": "add", "path": path, "value": deep}])).unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)), "{err:?}");
        assert!(err.to_string().contains("deeper than"), "{err}");
        // Moving a subtree under itself repeatedly is refused the same way.
        let mut ops = Vec::new();
        for i in 0..200 {
            ops.push(json!({"op": "copy", "from": "/a", "path": format!("/b{i}")}));
            ops.push(json!({"op": "move", "from": format!("/b{i}"), "path": "/a/k0/x"}));
        }
        assert!(json_patch(&doc, &Value::Array(ops)).is_err());
    }

    /// Doubling copies are stopped by the accumulated copy size limit, as
    /// kube-apiserver's json-patch `AccumulatedCopySizeLimit`.
    #[test]
    fn doubling_copies_hit_the_accumulated_copy_limit() {
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": ["x".repeat(1000)]})];
        for _ in 0..40 {
            ops.push(json!({"op": "copy", "from": "/a", "path": "/a/-"}));
        }
        let err = json_patch(&json!({}), &Value::Array(ops)).unwrap_err();
        assert!(matches!(err, PatchError::Unprocessable(_)), "{err:?}");
        assert!(err.to_string().contains("copy size limit"), "{err}");
    }

    /// kube-apiserver's `maxJSONPatchOperations`: more than 10,000 operations is a 413.
    #[test]
    fn too_many_operations_is_413() {
        let ops = vec![json!({"op": "test", "path": "", "value": {}}); MAX_OPERATIONS + 1];
        let err = json_patch(&json!({}), &Value::Array(ops)).unwrap_err();
        assert_eq!(err.http_status(), 413);
    }
}
