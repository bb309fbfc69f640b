//! No request input can panic the API server. Property tests over every
//! decoder and the name, selector and patch paths, then whole requests through the router.
//!
//! CI runs a bounded number of cases (`PROPTEST_CASES`, default 64 per property, a few
//! seconds in all); a longer run (`PROPTEST_CASES=5000`) is recorded in BENCHMARKS.md.

use std::sync::Arc;

use axum::{Router, body::Body};
use core_cluster::{
    ApiServer, ApiServerConfig,
    patch::{self, PatchType, limits},
    registry::{
        NameRule, meta,
        selectors::{FieldSelector, LabelSelector},
    },
    store::MemoryStore,
};
use http_body_util::BodyExt;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tower::ServiceExt;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

/// Strings that stress byte/character boundaries: ASCII name characters, separators,
/// selector and pointer syntax, multibyte and escape characters.
fn tricky_string(max: usize) -> impl Strategy<Value = String> {
    let chars = prop_oneof![
        8 => prop::sample::select(vec!['a', 'z', '0', '9', '-', '.']),
        2 => prop::sample::select(vec![
            '/', '~', '=', '!', ',', '(', ')', '<', '>', ' ', '\\', '$', ':', '"', '{', '}',
        ]),
        2 => prop::sample::select(vec!['é', '€', '𝄞', 'ß', '\u{0}', '\u{200b}', 'A']),
    ];
    prop::collection::vec(chars, 0..max).prop_map(|c| c.into_iter().collect())
}

/// Names of exactly 60 to 70 bytes with a multibyte character placed anywhere: the
/// reported panic had one across byte 63.
fn names_near_63_bytes() -> impl Strategy<Value = String> {
    (
        58usize..66,
        prop::sample::select(vec!["é", "€", "𝄞"]),
        0usize..4,
    )
        .prop_map(|(prefix, wide, suffix)| {
            format!("{}{wide}{}", "a".repeat(prefix), "b".repeat(suffix))
        })
}

/// Arbitrary JSON, nested a few levels, keys drawn from Kubernetes-like and hostile ones.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        tricky_string(12).prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "metadata",
            "name",
            "labels",
            "annotations",
            "finalizers",
            "spec",
            "status",
            "conditions",
            "type",
            "ports",
            "port",
            "protocol",
            "nodePort",
            "taints",
            "key",
            "containers",
            "$patch",
            "$retainKeys",
            "$setElementOrder/conditions",
            "$deleteFromPrimitiveList/finalizers",
            "managedFields",
            "fieldsV1",
            "0",
            "-",
        ])
        .prop_map(str::to_owned),
        tricky_string(8),
    ]
}

/// A JSON pointer into a Node-like object, sometimes malformed.
fn pointer() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::collection::vec(
            prop_oneof![key(), (0usize..4).prop_map(|i| i.to_string()), Just("-".to_owned())],
            0..5
        )
        .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect::<String>()),
        1 => tricky_string(10),
    ]
}

/// A JSON patch document, mostly well formed.
fn json_patch_doc() -> impl Strategy<Value = Value> {
    let op = (
        prop::sample::select(vec![
            "add", "remove", "replace", "move", "copy", "test", "frob",
        ]),
        pointer(),
        pointer(),
        json_value(),
    )
        .prop_map(
            |(op, path, from, value)| json!({"op": op, "path": path, "from": from, "value": value}),
        );
    prop_oneof![
        9 => prop::collection::vec(op, 0..8).prop_map(Value::Array),
        1 => json_value(),
    ]
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "b"},
           "finalizers": ["x"], "managedFields": [{"manager": "m", "operation": "Update",
           "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}]},
           "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
           "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X", "status": "False"}]}})
}

/// Every patch result must be readable back; if it is not, the server refuses it.
fn readable_or_refused(out: &Value) {
    if !limits::too_deep(out) {
        let text = serde_json::to_vec(out).unwrap();
        serde_json::from_slice::<Value>(&text).unwrap();
    }
}

proptest! {
    #![proptest_config(config())]

    /// Names of any bytes, including a multibyte character across byte 63 (the report).
    #[test]
    fn names_never_panic(name in prop_oneof![tricky_string(300), names_near_63_bytes()]) {
        for rule in [NameRule::Label, NameRule::Subdomain] {
            let errors = meta::validate_name(&name, rule);
            if name.bytes().any(|b| !b.is_ascii()) {
                prop_assert!(!errors.is_empty());
            }
        }
        meta::is_qualified_name(&name);
        meta::is_label_value(&name);
        prop_assert!(meta::generate_name(&name).chars().count() <= 63);
    }

    /// Label and field selectors of any text parse or fail with an error.
    #[test]
    fn selectors_never_panic(text in tricky_string(60)) {
        if let Ok(selector) = LabelSelector::parse(&text) {
            selector.matches(&node());
        }
        if let Ok(selector) = FieldSelector::parse(&text) {
            selector.matches(|_| Some(String::new()));
        }
    }

    /// Body decoders, for every patch type, on arbitrary bytes (YAML included).
    #[test]
    fn patch_bodies_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200),
                                yaml in tricky_string(80)) {
        for t in [PatchType::JsonPatch, PatchType::MergePatch,
                  PatchType::StrategicMergePatch, PatchType::ApplyPatch] {
            let _ = patch::decode_body(t, &bytes);
            let _ = patch::decode_body(t, yaml.as_bytes());
        }
        let _ = patch::json_patch::parse_pointer(&yaml);
    }

    /// JSON patches of every op on a Node: an error or a readable object.
    #[test]
    fn json_patches_never_panic(doc in json_patch_doc()) {
        if let Ok(out) = patch::json_patch::json_patch(&node(), &doc) {
            prop_assert!(!limits::too_deep(&out));
            readable_or_refused(&out);
        }
    }

    /// Merge, strategic merge and server-side apply of arbitrary JSON on a Node.
    #[test]
    fn merge_strategic_and_apply_never_panic(doc in json_value(), force in any::<bool>()) {
        let schema = patch::schema_for("", "Node");
        for t in [PatchType::MergePatch, PatchType::StrategicMergePatch] {
            if let Ok(out) = patch::patch_object(&node(), t, &doc, schema) {
                readable_or_refused(&out);
            }
        }
        let _ = patch::apply(Some(&node()), &doc, "fuzz", force, schema, "2026-01-01T00:00:00Z");
        let _ = patch::apply(None, &doc, "fuzz", force, schema, "2026-01-01T00:00:00Z");
        let _ = patch::record_update(Some(&node()), &doc, "fuzz", schema, "2026-01-01T00:00:00Z");
    }
}

// ------------------------------------------------------------------ whole requests

/// One request from the generators below.
#[derive(Debug, Clone)]
struct FuzzRequest {
    method: String,
    path: String,
    query: String,
    content_type: String,
    accept: String,
    body: Vec<u8>,
}

fn request() -> impl Strategy<Value = FuzzRequest> {
    let method = prop::sample::select(vec![
        "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "FROB",
    ]);
    let path = prop_oneof![
        prop::sample::select(vec![
            "/api/v1/nodes",
            "/api/v1/nodes/n1",
            "/api/v1/nodes/n1/status",
            "/api/v1/namespaces",
            "/api/v1/namespaces/default",
            "/api/v1/namespaces/default/finalize",
            "/api/v1/namespaces/default/pods",
            "/api/v1/namespaces/default/pods/p",
            "/api/v1/namespaces/default/pods/p/eviction",
            "/api/v1/namespaces/default/pods/p/binding",
            "/api/v1/namespaces/default/services/s",
            "/api/v1/namespaces/default/configmaps/c",
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
            "/apis",
            "/api",
        ])
        .prop_map(str::to_owned),
        (tricky_string(20), names_near_63_bytes()).prop_map(|(a, b)| format!(
            "/api/v1/namespaces/default/configmaps/{}{b}",
            urlencode(&a)
        )),
    ];
    let query = prop::collection::vec(
        (
            prop::sample::select(vec![
                "labelSelector",
                "fieldSelector",
                "limit",
                "continue",
                "resourceVersion",
                "resourceVersionMatch",
                "watch",
                "gracePeriodSeconds",
                "propagationPolicy",
                "dryRun",
                "fieldManager",
                "fieldValidation",
                "force",
                "timeoutSeconds",
            ]),
            prop_oneof![
                tricky_string(16),
                any::<i64>().prop_map(|n| n.to_string()),
                Just(i64::MAX.to_string()),
                Just("9223372036854775808".to_owned()),
            ],
        ),
        0..4,
    )
    .prop_map(|pairs| {
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", urlencode(v)))
            .collect::<Vec<_>>()
            .join("&")
    });
    let content_type = prop::sample::select(vec![
        "application/json",
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
        "application/apply-patch+yaml",
        "application/vnd.kubernetes.protobuf",
        "",
    ]);
    let accept = prop::sample::select(vec![
        "",
        "application/json",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
        "application/vnd.kubernetes.protobuf",
        "*/*",
        "text/html,application/json;q=0.1",
    ]);
    let body = prop_oneof![
        3 => json_value().prop_map(|v| v.to_string().into_bytes()),
        3 => json_patch_doc().prop_map(|v| v.to_string().into_bytes()),
        2 => json_value().prop_map(|mut v| {
            // An object of the right kind with hostile content.
            let mut obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
            if let Value::Object(m) = &mut v {
                for (k, x) in std::mem::take(m) {
                    obj[k] = x;
                }
            }
            obj.to_string().into_bytes()
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
        1 => tricky_string(64).prop_map(String::into_bytes),
    ];
    (method, path, query, content_type, accept, body).prop_map(
        |(method, path, query, content_type, accept, body)| FuzzRequest {
            method: method.to_owned(),
            path,
            query,
            content_type: content_type.to_owned(),
            accept: accept.to_owned(),
            body,
        },
    )
}

/// Percent-encodes everything but unreserved characters.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn seeded_router() -> Router {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let router = server.router();
    for (uri, body) in [
        ("/api/v1/nodes", node()),
        (
            "/api/v1/namespaces/default/pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                   "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}),
        ),
        (
            "/api/v1/namespaces/default/services",
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "finalizers": ["a/b"]},
                   "spec": {"type": "NodePort", "ports": [{"port": 80}]}}),
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        ),
    ] {
        let request = axum::http::Request::post(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let code = router.clone().oneshot(request).await.unwrap().status();
        assert_eq!(code.as_u16(), 201, "{uri}");
    }
    router
}

proptest! {
    #![proptest_config(config())]

    /// Whole requests, any verb, path, query, content type, Accept and body: never a panic
    /// and never a 500, and the server answers normally afterwards.
    #[test]
    fn requests_never_panic_or_fail_the_server(requests in prop::collection::vec(request(), 1..6)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            let router = seeded_router().await;
            for r in &requests {
                let uri = if r.query.is_empty() { r.path.clone() } else { format!("{}?{}", r.path, r.query) };
                let mut builder = axum::http::Request::builder().method(r.method.as_str()).uri(uri.as_str());
                if !r.content_type.is_empty() {
                    builder = builder.header("content-type", r.content_type.as_str());
                }
                if !r.accept.is_empty() {
                    builder = builder.header("accept", r.accept.as_str());
                }
                let Ok(request) = builder.body(Body::from(r.body.clone())) else {
                    continue;
                };
                let watch = uri.contains("watch=");
                let response = router.clone().oneshot(request).await.unwrap();
                let code = response.status().as_u16();
                prop_assert!(code != 500, "{} {uri}: 500 {:?}", r.method, response);
                if !watch {
                    response.into_body().collect().await.unwrap();
                }
            }
            let health = router
                .clone()
                .oneshot(axum::http::Request::get("/api/v1/namespaces/default/configmaps").body(Body::empty()).unwrap())
                .await
                .unwrap();
            prop_assert_eq!(health.status().as_u16(), 200);
            Ok(())
        })?;
    }
}
