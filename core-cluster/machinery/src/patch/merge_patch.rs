//! JSON merge patch (RFC 7386), `application/merge-patch+json`.

use serde_json::Value;

/// Applies a JSON merge patch to `target` in place.
///
/// An object patch merges into an object target key by key, recursively; a `null`
/// value removes the key. Any other patch (an array, a scalar, `null`) replaces the
/// target whole. This cannot fail: every JSON value is a valid merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let Value::Object(target) = target else {
        unreachable!("target was just made an object");
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(target: Value, patch: Value) -> Value {
        let mut t = target;
        merge_patch(&mut t, &patch);
        t
    }

    #[test]
    fn rfc7386_appendix_examples() {
        let cases = [
            (json!({"a":"b"}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"b"}), json!({"b":"c"}), json!({"a":"b","b":"c"})),
            (json!({"a":"b"}), json!({"a":null}), json!({})),
            (
                json!({"a":"b","b":"c"}),
                json!({"a":null}),
                json!({"b":"c"}),
            ),
            (json!({"a":["b"]}), json!({"a":"c"}), json!({"a":"c"})),
            (json!({"a":"c"}), json!({"a":["b"]}), json!({"a":["b"]})),
            (
                json!({"a":{"b":"c"}}),
                json!({"a":{"b":"d","c":null}}),
                json!({"a":{"b":"d"}}),
            ),
            (json!({"a":[{"b":"c"}]}), json!({"a":[1]}), json!({"a":[1]})),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a":"b"}), json!(["c"]), json!(["c"])),
            (json!({"a":"foo"}), json!(null), json!(null)),
            (json!({"a":"foo"}), json!("bar"), json!("bar")),
            (json!({"e":null}), json!({"a":1}), json!({"e":null,"a":1})),
            (json!([1, 2]), json!({"a":"b","c":null}), json!({"a":"b"})),
            (
                json!({}),
                json!({"a":{"bb":{"ccc":null}}}),
                json!({"a":{"bb":{}}}),
            ),
        ];
        for (target, patch, want) in cases {
            assert_eq!(
                merged(target.clone(), patch.clone()),
                want,
                "{target} + {patch}"
            );
        }
    }

    #[test]
    fn null_label_deletes_the_label_and_keeps_the_others() {
        let node = json!({"metadata":{"name":"n1","labels":{"a":"1","b":"2"}},"spec":{}});
        let out = merged(node, json!({"metadata":{"labels":{"a":null,"c":"3"}}}));
        assert_eq!(
            out,
            json!({"metadata":{"name":"n1","labels":{"b":"2","c":"3"}},"spec":{}})
        );
    }

    #[test]
    fn lists_are_replaced_whole() {
        let node = json!({"spec":{"taints":[{"key":"a","effect":"NoSchedule"}]}});
        let out = merged(
            node,
            json!({"spec":{"taints":[{"key":"b","effect":"NoExecute"}]}}),
        );
        assert_eq!(
            out,
            json!({"spec":{"taints":[{"key":"b","effect":"NoExecute"}]}})
        );
    }
}
