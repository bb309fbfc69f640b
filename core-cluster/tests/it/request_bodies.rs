//! What the server makes of request bodies, as kube-apiserver does: a body names the object
//! its URL names (`checkName`, `EnsureObjectNamespaceMatchesRequestNamespace`, the field
//! manager's version check), YAML apply bodies cost what their length allows, Secrets'
//! `stringData` lands in `data`, eviction bodies are checked, the reviews serve `create`
//! alone, `managedFields` keeps at most ten updaters, and `kubectl auth whoami` works.
//! Each test goes through HTTP (the in-process router; kubectl over TLS for `whoami`).

use std::{sync::Arc, time::Duration};

use axum::Router;
use ccm_testkit::TestServer;
use core_cluster::{ApiServer, ApiServerConfig, auth::UserInfo, store::MemoryStore};
use serde_json::{Value, json};

async fn api() -> ApiServer {
    ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap()
}

/// One request: status and JSON body (`Null` if not JSON).
async fn call(
    router: &Router,
    method: &str,
    uri: &str,
    content_type: &str,
    body: &str,
) -> (u16, Value) {
    let headers: Vec<(&str, &str)> = if body.is_empty() {
        Vec::new()
    } else {
        vec![("content-type", content_type)]
    };
    let (code, _, bytes) = ccm_testkit::send(router, method, uri, &headers, body.to_owned()).await;
    (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn get(router: &Router, uri: &str) -> (u16, Value) {
    call(router, "GET", uri, "", "").await
}

async fn post(router: &Router, uri: &str, body: &Value) -> (u16, Value) {
    call(router, "POST", uri, JSON, &body.to_string()).await
}

const JSON: &str = "application/json";
const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
}

async fn namespace(router: &Router, name: &str) {
    let (code, body) = post(
        router,
        "/api/v1/namespaces",
        &json!({"metadata": {"name": name}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
}

/// `mallory`, who may get, patch, update and create the ConfigMap `mine` in `t1` and nothing
/// else (a Role with `resourceNames`), plus `patcher`, who may only patch it.
async fn restricted(api: &ApiServer) -> (Router, Router) {
    let admin = api.router();
    namespace(&admin, "t1").await;
    for (role, verbs) in [
        ("mine", json!(["get", "patch", "update", "create"])),
        ("patch-mine", json!(["patch"])),
    ] {
        let (code, body) = post(
            &admin,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/t1/roles",
            &json!({"metadata": {"name": role}, "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                     "resourceNames": ["mine"], "verbs": verbs}]}),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    for (user, role) in [("mallory", "mine"), ("patcher", "patch-mine")] {
        let (code, body) = post(
            &admin,
            "/apis/rbac.authorization.k8s.io/v1/namespaces/t1/rolebindings",
            &json!({"metadata": {"name": user},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                    "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": user}]}),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    (
        api.router_as(UserInfo::new("mallory", ["dev"])),
        api.router_as(UserInfo::new("patcher", ["dev"])),
    )
}

const T1_CONFIGMAPS: &str = "/api/v1/namespaces/t1/configmaps";

/// Upstream's `checkName` (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go`),
/// run by `patcher.applyPatch` on the object an apply creates: the body's name must be the
/// URL's. Otherwise a Role's `resourceNames` would not hold for creation, and a 409 on an
/// existing object would tell a user about an object it may not read.
#[tokio::test]
async fn an_apply_cannot_create_an_object_under_another_name_than_the_urls() {
    let api = api().await;
    let (mallory, _) = restricted(&api).await;
    let admin = api.router();
    let (code, body) = post(&admin, T1_CONFIGMAPS, &configmap("victim")).await;
    assert_eq!(code, 201, "{body}");

    let mine = format!("{T1_CONFIGMAPS}/mine?fieldManager=m");
    for (body_name, shown) in [("fresh", "fresh"), ("victim", "victim")] {
        let (code, body) = call(
            &mallory,
            "PATCH",
            &mine,
            APPLY,
            &configmap(body_name).to_string(),
        )
        .await;
        assert_eq!(code, 400, "{body}");
        assert_eq!(
            body["message"],
            format!("the name of the object ({shown}) does not match the name on the URL (mine)")
        );
        assert_eq!(body["reason"], "BadRequest");
    }
    assert_eq!(
        get(&admin, &format!("{T1_CONFIGMAPS}/fresh")).await.0,
        404,
        "nothing was created"
    );
    assert_eq!(
        get(&admin, &format!("{T1_CONFIGMAPS}/victim")).await.1["data"],
        json!({"k": "v"})
    );
    // A body without a name names no object either.
    let unnamed = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}});
    let (code, body) = call(&mallory, "PATCH", &mine, APPLY, &unnamed.to_string()).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        body["message"],
        "the name of the object () does not match the name on the URL (mine)"
    );
    // The URL's own name is created.
    let (code, body) = call(
        &mallory,
        "PATCH",
        &mine,
        APPLY,
        &configmap("mine").to_string(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["metadata"]["namespace"], "t1");
}

/// Upstream's `PatchResource` wraps an apply's create in `withAuthorization` (verb `create`
/// on the URL's name): `patch` alone creates nothing.
#[tokio::test]
async fn an_apply_that_creates_needs_the_create_verb_as_well() {
    let api = api().await;
    let (_, patcher) = restricted(&api).await;
    let uri = format!("{T1_CONFIGMAPS}/mine?fieldManager=m");
    let (code, body) = call(
        &patcher,
        "PATCH",
        &uri,
        APPLY,
        &configmap("mine").to_string(),
    )
    .await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("cannot create resource \"configmaps\""),
        "{body}"
    );
    assert_eq!(
        get(&api.router(), &format!("{T1_CONFIGMAPS}/mine")).await.0,
        404
    );
    // Once it exists, patching it is what the Role allows.
    let (code, _) = post(&api.router(), T1_CONFIGMAPS, &configmap("mine")).await;
    assert_eq!(code, 201);
    let (code, body) = call(
        &patcher,
        "PATCH",
        &uri,
        APPLY,
        &configmap("mine").to_string(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
}

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

/// Upstream's field manager checks the applied object's type first (`versionCheckManager`:
/// "invalid object type: <gvk>"), and `patcher.applyPatch` then its namespace
/// (`rest.EnsureObjectNamespaceMatchesRequestNamespace`) and name (`checkName`): applying a
/// body of another kind, version, namespace or name to an existing object is a 400, and the
/// object is unchanged.
#[tokio::test]
async fn applying_another_kind_namespace_or_name_to_an_object_is_a_400() {
    let router = api().await.router();
    let uri = format!("{CONFIGMAPS}/c?fieldManager=m");
    let (code, created) = call(&router, "PATCH", &uri, APPLY, &configmap("c").to_string()).await;
    assert_eq!(code, 201, "{created}");
    // The creating apply is its manager's one entry (an `Update` entry of its own beside it
    // would make its next apply conflict with itself).
    let owners: Vec<(&Value, &Value)> = created["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (&e["manager"], &e["operation"]))
        .collect();
    assert_eq!(owners, [(&json!("m"), &json!("Apply"))]);
    let cases = [
        (
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c"}}),
            "invalid object type: /v1, Kind=Secret",
        ),
        (
            json!({"apiVersion": "apps/v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            "invalid object type: apps/v1, Kind=ConfigMap",
        ),
        (
            json!({"metadata": {"name": "c"}, "data": {"k": "x"}}),
            "invalid object type: /, Kind=",
        ),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}}),
            "the name of the object (other) does not match the name on the URL (c)",
        ),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "kube-system"}}),
            "the namespace of the provided object does not match the namespace sent on the request",
        ),
    ];
    for (applied, message) in cases {
        let (code, body) = call(&router, "PATCH", &uri, APPLY, &applied.to_string()).await;
        assert_eq!(code, 400, "{applied}: {body}");
        assert_eq!(body["message"], message, "{applied}");
    }
    let (_, stored) = get(&router, &format!("{CONFIGMAPS}/c")).await;
    assert_eq!(
        stored["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
        "unchanged"
    );
    assert_eq!(stored["data"], json!({"k": "v"}));
    // The namespace may be given when it is the URL's, or left out.
    let ok = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}, "data": {"k": "x"}});
    let (code, body) = call(&router, "PATCH", &uri, APPLY, &ok.to_string()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["data"]["k"], "x");
}

/// The other patch types go through `patcher.applyPatch` too: a patch that renames or moves
/// the object is a 400 (`checkName`, `EnsureObjectNamespaceMatchesRequestNamespace`), as a
/// PUT whose body names another object is (`UpdateResource`).
#[tokio::test]
async fn patches_and_updates_cannot_rename_or_move_an_object() {
    let router = api().await.router();
    let (code, _) = post(&router, CONFIGMAPS, &configmap("c")).await;
    assert_eq!(code, 201);
    let uri = format!("{CONFIGMAPS}/c");
    let rename = "the name of the object (other) does not match the name on the URL (c)";
    let moved =
        "the namespace of the provided object does not match the namespace sent on the request";
    let cases = [
        (MERGE, json!({"metadata": {"name": "other"}}), rename),
        (STRATEGIC, json!({"metadata": {"name": "other"}}), rename),
        (
            JSON_PATCH,
            json!([{"op": "replace", "path": "/metadata/name", "value": "other"}]),
            rename,
        ),
        (
            MERGE,
            json!({"metadata": {"name": null}}),
            "the name of the object () does not match the name on the URL (c)",
        ),
        (
            MERGE,
            json!({"metadata": {"namespace": "kube-system"}}),
            moved,
        ),
        (
            STRATEGIC,
            json!({"metadata": {"namespace": "kube-system"}}),
            moved,
        ),
    ];
    for (content_type, patch, message) in cases {
        let (code, body) = call(&router, "PATCH", &uri, content_type, &patch.to_string()).await;
        assert_eq!(code, 400, "{content_type} {patch}: {body}");
        assert_eq!(body["message"], message, "{content_type} {patch}");
    }
    // A patch that drops the namespace keeps the URL's.
    let (code, body) = call(
        &router,
        "PATCH",
        &uri,
        MERGE,
        &json!({"metadata": {"namespace": null}, "data": {"k": "w"}}).to_string(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["metadata"]["namespace"], "default");
    for (put, message) in [
        (configmap("other"), rename),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "kube-system"}}),
            moved,
        ),
    ] {
        let (code, body) = call(&router, "PUT", &uri, JSON, &put.to_string()).await;
        assert_eq!(code, 400, "{put}: {body}");
        assert_eq!(body["message"], message);
    }
    assert_eq!(get(&router, &format!("{CONFIGMAPS}/other")).await.0, 404);
    assert_eq!(
        get(&router, "/api/v1/namespaces/kube-system/configmaps/c")
            .await
            .0,
        404
    );
    assert_eq!(get(&router, &uri).await.1["data"], json!({"k": "w"}));
}

/// Libyaml's scanner re-walks every open flow collection per token, so nested `[` cost
/// time quadratic in the depth (160,000 levels, 312 KB: 142 s of CPU). kube-apiserver's YAML
/// decoder refuses documents past its depth limit; here the limit is the stored objects'
/// (127), found by a linear pre-scan before the parser runs, for flow and block nesting
/// alike.
#[tokio::test]
async fn deeply_nested_yaml_apply_bodies_are_refused_at_once() {
    let router = api().await.router();
    let uri = format!("{CONFIGMAPS}/y?fieldManager=a");
    let n = 160_000;
    let flow = format!("a: {}{}", "[".repeat(n), "]".repeat(n));
    let block = format!("a:\n{}x\n", "- ".repeat(1_500_000));
    let mixed = format!(
        "a:\n{}{}{}\n",
        "- ".repeat(100),
        "{b: ".repeat(40),
        "}".repeat(40)
    );
    for body in [flow, block, mixed] {
        let started = tokio::time::Instant::now();
        let (code, answer) = call(&router, "PATCH", &uri, APPLY, &body).await;
        let took = started.elapsed();
        assert_eq!(code, 400, "{answer}");
        assert_eq!(
            answer["message"],
            "the body of the request could not be decoded: invalid YAML: the document nests deeper than 127 levels of collections"
        );
        assert!(
            took < Duration::from_secs(10),
            "{} bytes refused after {took:?}",
            body.len()
        );
    }
    assert_eq!(get(&router, &format!("{CONFIGMAPS}/y")).await.0, 404);
    // The limit is exact: a document 127 levels deep (the top mapping and 126 lists, in an
    // unknown field, which is then dropped) is read, one level more is not.
    let nested = |n: usize| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\nx: {}{}\n",
            "[".repeat(n),
            "]".repeat(n)
        )
    };
    let (code, body) = call(&router, "PATCH", &uri, APPLY, &nested(127)).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = call(&router, "PATCH", &uri, APPLY, &nested(126)).await;
    assert_eq!(code, 201, "{body}");
}

/// kube-apiserver's YAML decoder refuses "excessive aliasing"; a 20 KB body of nested aliases
/// over a 10,000-item list would otherwise expand to 10^9 values.
#[tokio::test]
async fn yaml_alias_expansion_is_bounded_by_the_body() {
    let router = api().await.router();
    let mut yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb\nx0: &a0 [{}]\n",
        vec!["lol"; 10_000].join(",")
    );
    for i in 1..6 {
        let p = i - 1;
        yaml.push_str(&format!(
            "x{i}: &a{i} [{}]\n",
            vec![format!("*a{p}"); 10].join(",")
        ));
    }
    let started = tokio::time::Instant::now();
    let (code, body) = call(
        &router,
        "PATCH",
        &format!("{CONFIGMAPS}/bomb?fieldManager=m"),
        APPLY,
        &yaml,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        body["message"],
        "the body of the request could not be decoded: invalid YAML: the document contains excessive aliasing"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(get(&router, &format!("{CONFIGMAPS}/bomb")).await.0, 404);
}

const SECRETS: &str = "/api/v1/namespaces/default/secrets";

/// Upstream's `Convert_v1_Secret_To_core_Secret` (`pkg/apis/core/v1/conversion.go`): on
/// every write `stringData` is merged into `data` (base64, winning over `data`'s entry of
/// the same key) and is neither stored nor returned.
#[tokio::test]
async fn secret_string_data_is_merged_into_data_and_never_kept() {
    let router = api().await.router();
    let uri = format!("{SECRETS}/sd");
    let (code, created) = post(
        &router,
        SECRETS,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sd"},
                "data": {"k": "b2xk", "keep": "eA=="}, "stringData": {"k": "v"}}),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["data"], json!({"k": "dg==", "keep": "eA=="}));
    assert!(created.get("stringData").is_none(), "{created}");
    let (_, stored) = get(&router, &uri).await;
    assert_eq!(stored["data"], json!({"k": "dg==", "keep": "eA=="}));
    assert!(stored.get("stringData").is_none());

    // PUT, merge patch and apply merge it too.
    let mut put = stored.clone();
    put["stringData"] = json!({"p": "put"});
    let (code, body) = call(&router, "PUT", &uri, JSON, &put.to_string()).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["data"]["p"], "cHV0");
    let (code, body) = call(
        &router,
        "PATCH",
        &uri,
        MERGE,
        &json!({"stringData": {"m": "merged"}}).to_string(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["data"]["m"], "bWVyZ2Vk");
    let applied = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sd"}, "stringData": {"a": "applied"}});
    let (code, body) = call(
        &router,
        "PATCH",
        &format!("{uri}?fieldManager=m"),
        APPLY,
        &applied.to_string(),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["data"]["a"], "YXBwbGllZA==");
    let (_, stored) = get(&router, &uri).await;
    assert_eq!(
        stored["data"],
        json!({"k": "dg==", "keep": "eA==", "p": "cHV0", "m": "bWVyZ2Vk", "a": "YXBwbGllZA=="})
    );
    assert!(stored.get("stringData").is_none(), "{stored}");
    // A list shows no stringData either.
    let (_, list) = get(&router, SECRETS).await;
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s.get("stringData").is_none())
    );
}

/// `pkg/registry/core/pod/storage/eviction.go` (`EvictionREST.Create`) and the create
/// handler in front of it: an eviction body must be a decodable `Eviction` of the URL's
/// pod, in the URL's namespace, or nothing is evicted.
#[tokio::test]
async fn eviction_bodies_are_checked_before_anything_is_evicted() {
    let router = api().await.router();
    let pods = "/api/v1/namespaces/default/pods";
    let (code, body) = post(
        &router,
        pods,
        &json!({"metadata": {"name": "ev"}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let uri = format!("{pods}/ev/eviction");
    let eviction = |extra: Value| {
        let mut e = json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "ev", "namespace": "default"}});
        if let (Some(e), Some(extra)) = (e.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                e.insert(k.clone(), v.clone());
            }
        }
        e
    };
    let cases = [
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ev"}}),
            "ConfigMap in version \"v1\" cannot be handled as a Eviction: converting (v1.ConfigMap) to (policy.Eviction): unknown conversion",
        ),
        (
            eviction(json!({"metadata": {"name": "other"}})),
            "name in URL does not match name in Eviction object",
        ),
        (
            eviction(json!({"metadata": {}})),
            "name in URL does not match name in Eviction object",
        ),
        (
            eviction(json!({"metadata": {"name": "ev", "namespace": "kube-system"}})),
            "the namespace of the provided object does not match the namespace sent on the request",
        ),
    ];
    for (body, message) in cases {
        let (code, answer) = post(&router, &uri, &body).await;
        assert_eq!(code, 400, "{body}: {answer}");
        assert_eq!(answer["message"], message, "{body}");
    }
    let (code, answer) = post(
        &router,
        &uri,
        &eviction(json!({"deleteOptions": {"gracePeriodSeconds": "x"}})),
    )
    .await;
    assert_eq!(code, 400, "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(
        message.starts_with("Eviction in version \"v1\" cannot be handled as a Eviction: "),
        "{message}"
    );
    assert_eq!(
        get(&router, &format!("{pods}/ev")).await.0,
        200,
        "the pod was not evicted"
    );
    // A well-formed eviction (policy/v1beta1 is taken too) evicts it.
    let mut good = eviction(json!({}));
    good["apiVersion"] = json!("policy/v1beta1");
    let (code, answer) = post(&router, &uri, &good).await;
    assert_eq!(code, 201, "{answer}");
    assert_eq!(get(&router, &format!("{pods}/ev")).await.0, 404);
}

/// The reviews are create-only upstream: discovery (aggregated and per group-version) lists
/// `create` alone for them, and since kube-apiserver installs a POST route only, any other
/// method on their collection is go-restful's 405 ("the server does not allow this method
/// on the requested resource") and a named path a 404.
#[tokio::test]
async fn the_reviews_serve_and_advertise_create_alone() {
    let router = api().await.router();
    let reviews = [
        ("authentication.k8s.io", "tokenreviews"),
        ("authentication.k8s.io", "selfsubjectreviews"),
        ("authorization.k8s.io", "subjectaccessreviews"),
        ("authorization.k8s.io", "localsubjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectaccessreviews"),
        ("authorization.k8s.io", "selfsubjectrulesreviews"),
    ];
    let (code, _, bytes) = ccm_testkit::send(
        &router,
        "GET",
        "/apis",
        &[(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )],
        "",
    )
    .await;
    assert_eq!(code, 200);
    let aggregated: Value = serde_json::from_slice(&bytes).unwrap();
    for (group, plural) in reviews {
        let (code, list) = get(&router, &format!("/apis/{group}/v1")).await;
        assert_eq!(code, 200);
        let entry = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == plural);
        assert_eq!(
            entry.map(|r| &r["verbs"]),
            Some(&json!(["create"])),
            "{group} {plural}: {list}"
        );
        let versions = aggregated["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == group)
            .unwrap();
        let entry = versions["versions"][0]["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == plural);
        assert_eq!(
            entry.map(|r| &r["verbs"]),
            Some(&json!(["create"])),
            "aggregated {group} {plural}"
        );

        let namespaced = plural == "localsubjectaccessreviews";
        let collection = if namespaced {
            format!("/apis/{group}/v1/namespaces/default/{plural}")
        } else {
            format!("/apis/{group}/v1/{plural}")
        };
        for (method, uri) in [
            ("GET", collection.clone()),
            ("GET", format!("{collection}?watch=1")),
            ("DELETE", collection.clone()),
        ] {
            let (code, body) = call(&router, method, &uri, "", "").await;
            assert_eq!(code, 405, "{method} {uri}: {body}");
            assert_eq!(body["reason"], "MethodNotAllowed");
            assert_eq!(
                body["message"],
                "the server does not allow this method on the requested resource"
            );
        }
        let (code, body) = get(&router, &format!("{collection}/x")).await;
        assert_eq!(code, 404, "{body}");
    }
    // POST still answers.
    let (code, body) = post(
        &router,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        &json!({"spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"]["allowed"], true);
}

/// Upstream's `capManagersManager` (`k8s.io/apimachinery/pkg/util/managedfields/internal/
/// capmanagers.go`): writes by many field managers leave at most ten `Update` entries; the
/// oldest are folded into `ancient-changes`, whose fields still count as owned.
#[tokio::test]
async fn managed_fields_keep_at_most_ten_updaters() {
    let router = api().await.router();
    let (code, _) = post(&router, CONFIGMAPS, &configmap("many")).await;
    assert_eq!(code, 201);
    let uri = format!("{CONFIGMAPS}/many");
    for i in 0..40 {
        let patch = json!({"data": {format!("k{i}"): "v"}});
        let (code, body) = call(
            &router,
            "PATCH",
            &format!("{uri}?fieldManager=writer-{i}"),
            MERGE,
            &patch.to_string(),
        )
        .await;
        assert_eq!(code, 200, "{body}");
    }
    let (_, stored) = get(&router, &uri).await;
    let entries = stored["metadata"]["managedFields"].as_array().unwrap();
    let updaters: Vec<&str> = entries
        .iter()
        .filter(|e| e["operation"] == "Update")
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(updaters.len(), 10, "{updaters:?}");
    assert!(updaters.contains(&"ancient-changes"), "{updaters:?}");
    assert!(updaters.contains(&"writer-39"), "{updaters:?}");
    let ancient = entries
        .iter()
        .find(|e| e["manager"] == "ancient-changes")
        .unwrap();
    assert!(
        ancient["fieldsV1"]["f:data"].get("f:k0").is_some(),
        "{ancient}"
    );
}

/// Upstream's `selfsubjectreview` REST (`pkg/registry/authentication/selfsubjectreview`):
/// `POST authentication.k8s.io/v1 selfsubjectreviews` answers the requester's own user
/// name, UID, groups and extra, whatever the body says.
#[tokio::test]
async fn a_self_subject_review_answers_the_requesters_identity() {
    let api = api().await;
    let mut alice = UserInfo::new("alice", ["dev"]);
    alice.uid = "u-1".into();
    alice
        .extra
        .insert("scopes".into(), vec!["a".into(), "b".into()]);
    let router = api.router_as(alice);
    let (code, body) = post(
        &router,
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                "status": {"userInfo": {"username": "admin"}}}),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["kind"], "SelfSubjectReview");
    assert_eq!(body["apiVersion"], "authentication.k8s.io/v1");
    assert_eq!(
        body["status"]["userInfo"],
        json!({"username": "alice", "uid": "u-1", "groups": ["dev", "system:authenticated"],
               "extra": {"scopes": ["a", "b"]}})
    );
    assert!(body["metadata"]["creationTimestamp"].is_string());
}

/// `kubectl auth whoami` (kubectl v1.32: protobuf `SelfSubjectReview` to
/// `authentication.k8s.io/v1`), which `system:basic-user` allows every authenticated user,
/// as upstream's bootstrap policy does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_auth_whoami_shows_the_user() {
    ccm_testkit::kubectl::require_kubectl("it runs `kubectl auth whoami`");
    let server = TestServer::start(api().await).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("alice");
    std::fs::write(&config, server.kubeconfig_for("alice", &["dev"]).unwrap()).unwrap();
    let out =
        ccm_testkit::kubectl::kubectl(dir.path(), &config, &["auth", "whoami", "-o", "json"]).await;
    assert!(
        out.success,
        "stdout: {}\nstderr: {}",
        out.stdout, out.stderr
    );
    let review: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(review["kind"], "SelfSubjectReview");
    assert_eq!(review["status"]["userInfo"]["username"], "alice");
    assert_eq!(
        review["status"]["userInfo"]["groups"],
        json!(["dev", "system:authenticated"])
    );
    let table = ccm_testkit::kubectl::kubectl(dir.path(), &config, &["auth", "whoami"]).await;
    assert!(table.success, "{}", table.stderr);
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("Username") && l.trim_end().ends_with("alice")),
        "{}",
        table.stdout
    );
}
