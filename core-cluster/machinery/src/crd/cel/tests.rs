//! The rules end to end: what the existing rules did before metering, and the attacks of
//! `security-findings-crds.md` (sections 2 and 4).

use super::*;

fn rules(schema: Value) -> Rules {
    assert!(definition_errors(&schema, "s").is_empty(), "{schema}");
    Rules::build(&schema).expect("the schema has rules")
}

fn messages(errors: &[FieldError]) -> Vec<String> {
    errors.iter().map(FieldError::full).collect()
}

fn spec_schema(spec: Value) -> Value {
    json!({"type": "object", "properties": {"spec": spec}})
}

/// `validation.go Validate`: `self` is the value at the rule's node; a failed rule is
/// `Invalid value: "<type>": <message>` at the node's path.
#[test]
fn a_rule_sees_self_at_its_node_and_fails_with_its_message() {
    let r = rules(spec_schema(json!({
        "type": "object",
        "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
        "x-kubernetes-validations": [
            {"rule": "self.min <= self.max", "message": "min must not exceed max"},
        ],
    })));
    assert!(
        r.validate(&json!({"spec": {"min": 1, "max": 2}}), None)
            .is_empty()
    );
    assert_eq!(
        messages(&r.validate(&json!({"spec": {"min": 3, "max": 2}}), None)),
        ["spec: Invalid value: \"object\": min must not exceed max"]
    );
}

/// `ruleMessageOrDefault` and `messageExpression`: without a message the rule is
/// quoted; a messageExpression is evaluated with `self`.
#[test]
fn the_message_is_the_expression_the_message_or_the_rule() {
    let r = rules(spec_schema(json!({
        "type": "object",
        "properties": {"n": {"type": "integer",
            "x-kubernetes-validations": [
                {"rule": "self < 10"},
                {"rule": "self % 2 == 0", "messageExpression": "'n is ' + string(self) + ', not even'"},
            ]}},
    })));
    assert_eq!(
        messages(&r.validate(&json!({"spec": {"n": 11}}), None)),
        [
            "spec.n: Invalid value: \"integer\": failed rule: self < 10",
            "spec.n: Invalid value: \"integer\": n is 11, not even",
        ]
    );
}

/// `fieldErrorForReason` and `fieldPath`: the error is at the rule's field path below
/// its node, of the kind its reason names.
#[test]
fn reason_and_field_path_shape_the_error() {
    let r = rules(spec_schema(json!({
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "x-kubernetes-validations": [
            {"rule": "has(self.a) || has(self.b)", "message": "a or b is required",
             "reason": "FieldValueRequired", "fieldPath": ".a"},
            {"rule": "!has(self.b) || self.b != 'x'", "message": "b may not be x",
             "reason": "FieldValueForbidden", "fieldPath": ".b"},
        ],
    })));
    assert_eq!(
        messages(&r.validate(&json!({"spec": {}}), None)),
        ["spec.a: Required value: a or b is required"]
    );
    let errors = r.validate(&json!({"spec": {"b": "x"}}), None);
    assert_eq!(messages(&errors), ["spec.b: Forbidden: b may not be x"]);
    assert_eq!(errors[0].reason, "FieldValueForbidden");
}

/// Transition rules (`oldSelf`): skipped on create, run on update against the
/// correlated old value.
#[test]
fn a_transition_rule_runs_on_update_only() {
    let r = rules(spec_schema(json!({
        "type": "object",
        "properties": {"zone": {"type": "string",
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "zone is immutable"}]}},
    })));
    let a = json!({"spec": {"zone": "a"}});
    let b = json!({"spec": {"zone": "b"}});
    assert!(r.validate(&a, None).is_empty(), "skipped on create");
    assert!(r.validate(&a, Some(&a)).is_empty());
    assert_eq!(
        messages(&r.validate(&b, Some(&a))),
        ["spec.zone: Invalid value: \"string\": zone is immutable"]
    );
    // A field added on update has no old value: the rule is not run.
    assert!(
        r.validate(&a, Some(&json!({"spec": {}}))).is_empty(),
        "no old value, no transition rule"
    );
}

/// `optionalOldSelf`: the transition rule runs on create too, with `oldSelf` null.
#[test]
fn optional_old_self_runs_on_create_with_a_null_old_self() {
    let r = rules(spec_schema(json!({
        "type": "object",
        "properties": {"zone": {"type": "string",
            "x-kubernetes-validations": [{"rule": "oldSelf == null || self == oldSelf",
                "optionalOldSelf": true, "message": "zone is immutable"}]}},
    })));
    assert!(r.validate(&json!({"spec": {"zone": "a"}}), None).is_empty());
    assert_eq!(
        r.validate(
            &json!({"spec": {"zone": "b"}}),
            Some(&json!({"spec": {"zone": "a"}}))
        )
        .len(),
        1
    );
}

/// Correlation (`common/equality.go CorrelatedObject`): items of a `map` list are matched
/// by their keys, so reordering them is no change; items of an atomic list never are.
#[test]
fn old_items_correlate_by_map_keys_not_by_position() {
    let item = json!({"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "port": {"type": "integer",
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "port is immutable"}]}}});
    let mut list = json!({"type": "array", "items": item,
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]});
    let r = rules(spec_schema(
        json!({"type": "object", "properties": {"ports": list.clone()}}),
    ));
    let old = json!({"spec": {"ports": [{"name": "a", "port": 1}, {"name": "b", "port": 2}]}});
    let reordered =
        json!({"spec": {"ports": [{"name": "b", "port": 2}, {"name": "a", "port": 1}]}});
    assert!(r.validate(&reordered, Some(&old)).is_empty());
    let changed = json!({"spec": {"ports": [{"name": "b", "port": 2}, {"name": "a", "port": 5}]}});
    assert_eq!(
        messages(&r.validate(&changed, Some(&old))),
        ["spec.ports[1].port: Invalid value: \"integer\": port is immutable"]
    );
    // Under an atomic list, a transition rule is refused when the definition is written.
    list.as_object_mut()
        .unwrap()
        .remove("x-kubernetes-list-type");
    let errors = definition_errors(
        &spec_schema(json!({"type": "object", "properties": {"ports": list}})),
        "s",
    );
    assert_eq!(
        messages(&errors),
        [
            "s.properties[spec].properties[ports].items.properties[port].x-kubernetes-validations[0].rule: Invalid value: \"self == oldSelf\": oldSelf cannot be used on the uncorrelatable portion of the schema within s.properties[spec].properties[ports]"
        ]
    );
}

/// `validation.go validateOpenAPISchema`: a rule or messageExpression that does not
/// compile, or an empty rule, refuses the definition with cel's `ERROR: <input>:l:c:`.
#[test]
fn rules_that_do_not_compile_refuse_the_definition() {
    let schema = spec_schema(json!({"type": "object", "x-kubernetes-validations": [
        {"rule": "self.a >"},
        {"rule": "true", "messageExpression": "'a' +"},
        {"rule": ""},
    ]}));
    let errors = definition_errors(&schema, "spec.versions[0].schema.openAPIV3Schema");
    let at = "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations";
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert_eq!(errors[0].field, format!("{at}[0].rule"));
    assert!(
        errors[0]
            .message
            .contains(": compilation failed: ERROR: <input>:1:"),
        "{}",
        errors[0].message
    );
    assert_eq!(errors[1].field, format!("{at}[1].messageExpression"));
    assert!(
        errors[1]
            .message
            .contains("messageExpression compilation failed: ERROR: <input>:1:")
    );
    assert_eq!(
        errors[2].full(),
        format!("{at}[2].rule: Required value: rule is not specified")
    );
}

/// The estimated cost (`getExpressionCost` against `StaticEstimatedCostLimit`): iterating an
/// unbounded list is refused with upstream's advice; so is comparing its unbounded strings
/// in a loop (`checker/cost.go`: `==` traverses the shorter string at 0.1 per byte); under
/// `maxItems` and the items' `maxLength` the same rule is accepted.
#[test]
fn a_rule_too_costly_for_its_schema_is_refused_until_bounded() {
    let mut list = json!({"type": "array", "items": {"type": "string"},
        "x-kubernetes-validations": [{"rule": "self.all(x, self.exists(y, y == x))"}]});
    // The rule, then the schema's total (upstream's `StaticEstimatedCRDCostLimit`), which
    // the rule alone is over too: upstream names the costliest rules and the total.
    let refused = [
        "s.x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
        "s.x-kubernetes-validations[0].rule: Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
        "s: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
    ];
    assert_eq!(messages(&definition_errors(&list, "s")), refused);
    list["maxItems"] = json!(100);
    let bounded = messages(&definition_errors(&list, "s"));
    assert_eq!(bounded.len(), 3, "{bounded:?}");
    assert_eq!(bounded[0], refused[0]);
    list["items"]["maxLength"] = json!(10);
    assert!(definition_errors(&list, "s").is_empty());
}

/// `RuntimeCELCostBudget`: once one object's rules have spent the budget the rest are
/// not run, with upstream's message. (Each rule is charged about 58,000 units for a
/// search kube-cel does in the worst case character by character; the search finds its
/// match at once, so the test runs fast.) The rules are built without the definition check,
/// which refuses this schema (its estimate is 922,000 per rule, times 200), as a definition
/// stored by an older server could hold them.
#[test]
fn an_object_whose_rules_spend_the_budget_stops_being_validated() {
    let r = Rules::build(&spec_schema(
        json!({"type": "object", "properties": {"groups": {
            "type": "array", "maxItems": 200,
            "items": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 2400}},
                "x-kubernetes-validations": [{"rule": "self.s.indexOf(self.s) == 0"}]},
        }}}),
    ))
    .expect("the schema has rules");
    let group = json!({"s": "a".repeat(2400)});
    let few = json!({"spec": {"groups": vec![group.clone(); 5]}});
    assert!(r.validate(&few, None).is_empty());
    let many = json!({"spec": {"groups": vec![group; 200]}});
    let errors = r.validate(&many, None);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].field.starts_with("spec.groups["));
    assert!(
        errors[0].message.ends_with(
            "validation failed due to running out of cost budget, no further validation rules will be run"
        ),
        "{}",
        errors[0].message
    );
}

/// The Kubernetes CEL libraries are there (`k8s.io/apiserver/pkg/cel/library`):
/// quantities, named formats, URL and IP helpers. (A named format's `validate` costs 3.2
/// units per byte, `library/cost.go`: on an unbounded string upstream refuses it too.)
#[test]
fn the_kubernetes_cel_libraries_are_available() {
    let r = rules(spec_schema(json!({"type": "object", "properties": {
        "memory": {"type": "string", "x-kubernetes-validations": [
            {"rule": "quantity(self).isLessThan(quantity('1Gi'))", "message": "at most 1Gi"}]},
        "host": {"type": "string", "maxLength": 63, "x-kubernetes-validations": [
            {"rule": "!format.dns1123Label().validate(self).hasValue()", "message": "not a label"}]},
    }})));
    assert!(
        r.validate(&json!({"spec": {"memory": "512Mi", "host": "web-1"}}), None)
            .is_empty()
    );
    assert_eq!(
        messages(&r.validate(&json!({"spec": {"memory": "2Gi", "host": "Web_1"}}), None)),
        [
            "spec.host: Invalid value: \"string\": not a label",
            "spec.memory: Invalid value: \"string\": at most 1Gi",
        ]
    );
}

/// `validateExpressions`: a rule that fails to evaluate is an error naming the rule; a
/// rule at the root reports upstream's nil path.
#[test]
fn an_evaluation_error_and_a_root_rule_are_reported_as_upstream() {
    let r = rules(json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "has(self.spec)", "message": "spec is required"}],
        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
            "x-kubernetes-validations": [{"rule": "self.count > 0"}]}}}));
    assert_eq!(
        messages(&r.validate(&json!({}), None)),
        ["<nil>: Invalid value: \"object\": spec is required"]
    );
    let errors = r.validate(&json!({"spec": {}}), None);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].message.starts_with("Invalid value: \"object\": ")
            && errors[0]
                .message
                .ends_with(" evaluating rule: self.count > 0"),
        "{}",
        errors[0].message
    );
    assert_eq!(errors[0].field, "spec");
}

/// A schema without rules builds nothing: no cost on writes.
#[test]
fn a_schema_without_rules_has_nothing_to_run() {
    assert!(Rules::build(&spec_schema(json!({"type": "object"}))).is_none());
}

/// The finding's split rule (`security-findings-crds.md` §4).
const SPLIT: &str = "self.s.split('').all(x, self.s.split('').all(y, y.size() < 5))";

fn split_schema(max_length: u64) -> Value {
    spec_schema(json!({"type": "object",
        "x-kubernetes-validations": [{"rule": SPLIT}],
        "properties": {"s": {"type": "string", "maxLength": max_length}}}))
}

/// Runs `f` on a thread with a 256 KiB stack: nothing may depend on the caller's stack.
fn on_small_stack<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(f)
        .expect("a thread")
        .join()
        .expect("no panic")
}

/// The one rule's compile error in `definition_errors`.
fn compile_error(rule: &str) -> String {
    let schema = json!({"type": "object", "x-kubernetes-validations": [{"rule": rule}]});
    let errors = definition_errors(&schema, "s");
    assert_eq!(errors.len(), 1, "{errors:?}");
    let prefix = format!(
        "s.x-kubernetes-validations[0].rule: Invalid value: {}: compilation failed: ",
        json!({"rule": rule})
    );
    errors[0]
        .full()
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{}", errors[0].full()))
        .to_owned()
}

fn validate_on_small_stack(rule: String, object: Value) -> Vec<String> {
    on_small_stack(move || {
        let r = Rules::build(&json!({"type": "object",
            "properties": {"val1": {"type": "boolean"}},
            "x-kubernetes-validations": [{"rule": rule}]}))
        .expect("rules");
        messages(&r.validate(&object, None))
    })
}

/// cel-go's parser limits (`parser/parser.go`) and apiextensions' `TestCELMaxRecursionDepth`:
/// `self.val1 == ` repeated 249 times then `self.val1` compiles and runs; 250 times is
/// refused with `max recursion depth exceeded`; nesting (the finding's ten parentheses are
/// fine) is refused past 250 with `expression recursion limit exceeded: 250`, and more
/// than 100,000 code points with `expression code point size exceeds limit`. Nothing
/// overflows, even on a 256 KiB stack.
#[test]
fn deep_rules_are_refused_at_cel_gos_limits_and_never_overflow() {
    let ok = |rule: String| {
        let schema = json!({"type": "object", "x-kubernetes-validations": [{"rule": rule}]});
        assert!(definition_errors(&schema, "s").is_empty(), "{rule:.80}");
        assert!(
            validate_on_small_stack(rule.clone(), json!({"val1": true})).is_empty(),
            "{rule:.80}"
        );
    };
    ok("((((((((((true))))))))))".to_owned());
    ok(format!("{}1 > 0", "1 + ".repeat(49)));
    ok(format!("{}self.val1", "self.val1 == ".repeat(249)));
    ok(format!("{}true{}", "(".repeat(249), ")".repeat(249)));
    assert_eq!(
        compile_error(&format!("{}self.val1", "self.val1 == ".repeat(250))),
        "ERROR: <input>:-1:0: max recursion depth exceeded"
    );
    assert_eq!(
        compile_error(&format!("{}true{}", "(".repeat(250), ")".repeat(250))),
        "ERROR: <input>:-1:0: expression recursion limit exceeded: 250"
    );
    assert_eq!(
        compile_error(&format!("{}1 > 0", "1 + ".repeat(300))),
        "ERROR: <input>:-1:0: max recursion depth exceeded"
    );
    assert_eq!(
        compile_error(&format!("'{}' != ''", "a".repeat(100_000))),
        "ERROR: <input>:-1:0: expression code point size exceeds limit: size: 100008, limit 100000"
    );
}

/// A definition stored before these limits (or written around them) is loaded at startup
/// without overflowing: the rule is reported by `compile_errors` and fails its objects with
/// upstream's `rule compile error` (`validation.go`), never silently passing them.
#[test]
fn a_stored_rule_past_the_limits_is_reported_not_fatal() {
    let rule = format!("{}true{}", "(".repeat(40_000), ")".repeat(40_000));
    let (compile_errors, validated) = on_small_stack(move || {
        let r = Rules::build(&spec_schema(json!({"type": "object",
            "x-kubernetes-validations": [{"rule": rule}]})))
        .expect("rules");
        (
            r.compile_errors("spec.versions[0].schema.openAPIV3Schema")
                .iter()
                .map(|e| e.field.clone() + ": " + &e.message[e.message.len() - 61..])
                .collect::<Vec<_>>(),
            messages(&r.validate(&json!({"spec": {}}), None)),
        )
    });
    assert_eq!(
        compile_errors,
        [
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: ERROR: <input>:-1:0: expression recursion limit exceeded: 250"
        ]
    );
    assert_eq!(
        validated,
        [
            "spec: Invalid value: \"object\": rule compile error: compilation failed: ERROR: <input>:-1:0: expression recursion limit exceeded: 250"
        ]
    );
}

/// cel-go's parser refuses `Foo{a: 1}` for want of a declared type (`undeclared
/// reference`); the `cel` crate's interpreter would `todo!()` on it. Refused at definition,
/// and a stored one fails its objects instead of panicking.
#[test]
fn message_construction_is_refused_and_never_evaluated() {
    assert_eq!(
        compile_error("Foo{a: 1}"),
        "ERROR: <input>:1:4: undeclared reference to 'Foo' (in container '')\n| Foo{a: 1}\n| ...^"
    );
    assert!(compile_error("[1, {'a': x.y.Z{}}]").contains("undeclared reference to 'x.y.Z'"));
    let r = Rules::build(&json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "Foo{a: 1} == Foo{a: 1}"}]}))
    .expect("rules");
    assert_eq!(r.compile_errors("s").len(), 1);
    let errors = messages(&r.validate(&json!({}), None));
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("rule compile error: compilation failed: ERROR: <input>:1:4: undeclared reference to 'Foo'"), "{errors:?}");
}

/// `library/cost.go`'s `split` (a string of n bytes splits into up to n parts) and
/// `checker/cost.go`'s comprehensions: the finding's rule is refused when its string may be
/// 100,000 characters long, accepted at 50.
#[test]
fn the_split_rule_is_refused_for_long_strings() {
    assert_eq!(
        messages(&definition_errors(&split_schema(100_000), "s")),
        [
            "s.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
            "s.properties[spec].x-kubernetes-validations[0].rule: Forbidden: contributed to estimated rule cost total exceeding cost limit for entire OpenAPIv3 schema",
            "s: Forbidden: x-kubernetes-validations estimated rule cost total for entire OpenAPIv3 schema exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)",
        ]
    );
    assert!(definition_errors(&split_schema(50), "s").is_empty());
}

/// cel-go's `CostTracker` with `PerCallLimit`: the finding's rule on 2,000 characters, in a
/// definition that skipped the estimate (stored before it), stops at the limit with
/// upstream's error (`validation.go`: `'operation cancelled: actual cost limit exceeded':
/// no further validation rules will be run due to call cost exceeds limit for rule`).
/// Before metering it ran 32 s of CPU.
#[test]
fn the_split_rule_stops_at_the_call_cost_limit() {
    let r = Rules::build(&split_schema(100_000)).expect("rules");
    let started = tokio::time::Instant::now();
    let errors = r.validate(&json!({"spec": {"s": "a".repeat(2000)}}), None);
    assert_eq!(
        messages(&errors),
        [format!(
            "spec: Invalid value: \"object\": 'operation cancelled: actual cost limit exceeded': no further validation rules will be run due to call cost exceeds limit for rule: {SPLIT}"
        )]
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// `s.replace('', s)` on 3 MiB would build 9 TB: upstream's estimate accepts it (`replace`
/// costs its traversal), so the meter charges its worst-case output before it runs.
#[test]
fn a_replace_that_would_build_terabytes_is_stopped_before_it_runs() {
    let r = rules(spec_schema(json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "self.s.replace('', self.s) != ''"}],
        "properties": {"s": {"type": "string"}}})));
    let errors = r.validate(&json!({"spec": {"s": "a".repeat(3 << 20)}}), None);
    assert_eq!(errors.len(), 1);
    assert!(
        errors[0]
            .message
            .contains("'operation cancelled: actual cost limit exceeded'"),
        "{}",
        errors[0].message
    );
}

/// cel-go's `ContextEval`: a cancelled request stops its evaluation (`operation
/// interrupted`) and no further rule runs; so does a passed deadline.
#[test]
fn an_interrupt_stops_the_evaluation() {
    let schema = spec_schema(json!({"type": "object", "properties": {"items": {
        "type": "array", "items": {"type": "object",
            "x-kubernetes-validations": [{"rule": SPLIT}],
            "properties": {"s": {"type": "string"}}}}}}));
    let r = Rules::build(&schema).expect("rules");
    let item = json!({"s": "a".repeat(2000)});
    let object = json!({"spec": {"items": vec![item; 50]}});
    let interrupted = format!(
        "spec.items[0]: Invalid value: \"object\": operation interrupted evaluating rule: {SPLIT}"
    );
    // Cancelled while it runs (all 50 items would take ten times the call limit).
    let interrupt = Interrupt::new();
    let canceller = {
        let interrupt = interrupt.clone();
        std::thread::spawn(move || {
            std::thread::park_timeout(std::time::Duration::from_millis(20));
            interrupt.cancel();
        })
    };
    let started = tokio::time::Instant::now();
    let errors = r.validate_with(&object, None, &interrupt);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    canceller.join().expect("cancelled");
    assert_eq!(messages(&errors), std::slice::from_ref(&interrupted));
    // Cancelled before, or past its deadline: no rule runs.
    assert_eq!(
        messages(&r.validate_with(&object, None, &interrupt)),
        std::slice::from_ref(&interrupted)
    );
    let late = Interrupt::until(tokio::time::Instant::now());
    assert_eq!(
        messages(&r.validate_with(&object, None, &late)),
        [interrupted]
    );
}

/// A rule that panics inside a library (kube-cel's `format` with a precision Rust's
/// formatter refuses) is an error of that rule, and the others still run.
#[test]
fn a_panicking_rule_is_an_internal_error() {
    let r = rules(spec_schema(
        json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "'%.1000000f'.format([1.0]) != ''"},
            {"rule": "false", "message": "still run"},
        ]}),
    ));
    assert_eq!(
        messages(&r.validate(&json!({"spec": {}}), None)),
        [
            "spec: Invalid value: \"object\": internal error evaluating rule: '%.1000000f'.format([1.0]) != ''",
            "spec: Invalid value: \"object\": still run",
        ]
    );
}

/// A message expression is metered too; one that fails, is empty or spans lines falls
/// back to the message (`validation.go evalMessageExpression`).
#[test]
fn message_expressions_fall_back_as_upstream() {
    let r = rules(spec_schema(
        json!({"type": "object", "x-kubernetes-validations": [
            {"rule": "false", "messageExpression": "'  spaced  '"},
            {"rule": "false", "messageExpression": "''", "message": "empty"},
            {"rule": "false", "messageExpression": "'a\\nb'", "message": "lines"},
            {"rule": "false", "messageExpression": "self.missing", "message": "failed"},
        ]}),
    ));
    assert_eq!(
        messages(&r.validate(&json!({"spec": {}}), None)),
        [
            "spec: Invalid value: \"object\": spaced",
            "spec: Invalid value: \"object\": empty",
            "spec: Invalid value: \"object\": lines",
            "spec: Invalid value: \"object\": failed",
        ]
    );
}

/// The thread's CPU time, in seconds (Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// For BENCHMARKS.md: the CPU time of the finding's 2 KB split rule (stopped by the meter)
/// and of two typical rules. `cargo test [--release] -p core-cluster-machinery --lib
/// crd::cel::tests::measure -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure() {
    let r = Rules::build(&split_schema(100_000)).expect("rules");
    let object = json!({"spec": {"s": "a".repeat(2000)}});
    let (wall, cpu) = (tokio::time::Instant::now(), cpu_seconds());
    for _ in 0..10 {
        assert_eq!(r.validate(&object, None).len(), 1);
    }
    println!(
        "split 2 KB: wall {:.1} ms, cpu {:.1} ms per object",
        wall.elapsed().as_secs_f64() * 100.0,
        (cpu_seconds() - cpu) * 100.0
    );
    let typical = rules(spec_schema(json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
        "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}})));
    let items: Vec<_> = (0..100).map(|i| json!({"name": format!("n{i}")})).collect();
    let list = rules(spec_schema(json!({"type": "object",
        "x-kubernetes-validations": [{"rule": "self.items.all(i, i.name.size() < 10)"}],
        "properties": {"items": {"type": "array", "maxItems": 100, "items": {"type": "object",
            "properties": {"name": {"type": "string"}}}}}})));
    for (name, r, object, n) in [
        (
            "typical min <= max",
            &typical,
            json!({"spec": {"min": 1, "max": 2}}),
            20_000u32,
        ),
        (
            "list all, 100 items",
            &list,
            json!({"spec": {"items": items}}),
            2_000,
        ),
    ] {
        let (wall, cpu) = (tokio::time::Instant::now(), cpu_seconds());
        for _ in 0..n {
            assert!(r.validate(&object, None).is_empty());
        }
        println!(
            "{name}: wall {:.1} us, cpu {:.1} us per object",
            wall.elapsed().as_secs_f64() * 1e6 / f64::from(n),
            (cpu_seconds() - cpu) * 1e6 / f64::from(n)
        );
    }
}
