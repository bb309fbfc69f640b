//! CustomResourceDefinitions against the attacks of `security-findings-crds.md` (issue 39):
//! what a user who may create definitions or custom resources cannot do, each test naming the
//! upstream rule it follows.

use std::sync::Arc;

use ccm_testkit::{eventually, send};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{MemoryStore, Store},
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams},
};
use serde_json::{Value, json};

fn crd_api(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "customresourcedefinitions"),
    )
}

/// A definition of `plural.group` at `version` whose schema keeps any field.
fn open_crd(group: &str, plural: &str, kind: &str, version: &str, scope: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group, "scope": scope,
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind,
                      "listKind": format!("{kind}List")},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                                               "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    })
}

async fn create(client: &Client, crd: Value) -> Result<DynamicObject, kube::core::Status> {
    let obj: DynamicObject = serde_json::from_value(crd).unwrap();
    match crd_api(client).create(&PostParams::default(), &obj).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(status)) => Err(*status),
        Err(other) => panic!("{other}"),
    }
}

fn condition(crd: &DynamicObject, type_: &str) -> Option<Value> {
    crd.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

async fn cluster_role_binding_names(router: &axum::Router) -> Vec<String> {
    let (code, _, body) = send(
        router,
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        &[],
        axum::body::Body::empty(),
    )
    .await;
    assert_eq!(code, 200);
    let list: Value = serde_json::from_slice(&body).unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Built-in objects are out of a custom resource's reach (upstream keeps them under keys a
/// custom resource never has; here a definition cannot claim a built-in group): the
/// finding's definitions for ClusterRoleBindings, Leases and CustomResourceDefinitions
/// themselves are refused, so nothing is listed, written or deleted through them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_cannot_claim_a_built_in_group() {
    let server = ccm_testkit::memory_server().await;
    let router = server.router();
    let client = Client::new(router.clone(), "default");
    let before = cluster_role_binding_names(&router).await;
    assert!(before.iter().any(|n| n == "cluster-admin"), "{before:?}");
    for (group, plural, kind, scope) in [
        (
            "rbac.authorization.k8s.io",
            "clusterrolebindings",
            "ClusterRoleBinding",
            "Cluster",
        ),
        ("coordination.k8s.io", "leases", "Lease", "Namespaced"),
        (
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            "Cluster",
        ),
        // Approval does not open a built-in group either.
        ("storage.k8s.io", "widgets", "Widget", "Cluster"),
    ] {
        let mut crd = open_crd(group, plural, kind, "v9", scope);
        crd["metadata"]["annotations"] = json!({"api-approved.kubernetes.io": "https://github.com/kubernetes/kubernetes/pull/1"});
        let status = create(&client, crd).await.unwrap_err();
        assert_eq!(status.code, 422, "{group}: {status:?}");
        assert!(
            status.message.contains(&format!(
                "spec.group: Invalid value: \"{group}\": is an API group this server serves itself: a CustomResourceDefinition cannot claim a built-in group"
            )),
            "{}",
            status.message
        );
    }
    let (code, _, _) = send(
        &router,
        "GET",
        "/apis/rbac.authorization.k8s.io/v9/clusterrolebindings",
        &[],
        axum::body::Body::empty(),
    )
    .await;
    assert_eq!(code, 404);
    assert_eq!(cluster_role_binding_names(&router).await, before);
}

/// KEP-1111 (`validateAPIApproval`, the `apiapproval` controller): a definition in a
/// `*.k8s.io` or `*.kubernetes.io` group needs the `api-approved.kubernetes.io` annotation,
/// and reports it in its `KubernetesAPIApprovalPolicyConformant` condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protected_group_needs_the_approval_annotation() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let status = create(
        &client,
        open_crd("apps.k8s.io", "gizmos", "Gizmo", "v1", "Namespaced"),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code, 422);
    assert!(
        status.message.contains("metadata.annotations[api-approved.kubernetes.io]: Required value: protected groups must have approval annotation \"api-approved.kubernetes.io\", see https://github.com/kubernetes/enhancements/pull/1111"),
        "{}",
        status.message
    );
    for (group, annotation, wanted_status, reason) in [
        (
            "sigs.k8s.io",
            "unapproved, an experiment",
            "False",
            "UnapprovedAnnotation",
        ),
        (
            "x.kubernetes.io",
            "https://github.com/kubernetes/enhancements/pull/1111",
            "True",
            "ApprovedAnnotation",
        ),
    ] {
        let mut crd = open_crd(group, "gizmos", "Gizmo", "v1", "Namespaced");
        crd["metadata"]["annotations"] = json!({"api-approved.kubernetes.io": annotation});
        create(&client, crd).await.unwrap();
        let name = format!("gizmos.{group}");
        let cond = eventually(30, "the approval condition", || {
            let api = crd_api(&client);
            let name = name.clone();
            async move {
                let crd = api.get(&name).await.ok()?;
                condition(&crd, "KubernetesAPIApprovalPolicyConformant")
            }
        })
        .await;
        assert_eq!(cond["status"], wanted_status, "{cond}");
        assert_eq!(cond["reason"], reason, "{cond}");
    }
    // Any other group needs nothing and gets no condition.
    create(
        &client,
        open_crd("example.com", "gizmos", "Gizmo", "v1", "Namespaced"),
    )
    .await
    .unwrap();
}

/// `apiserver/schema/validation.go`: a `pattern` that does not compile is refused, naming
/// the field, rather than accepted and then never enforced (finding 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_pattern_is_refused_naming_its_field() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    for (pattern, why) in [
        ("(", "error parsing regexp: missing closing ): `(`"),
        (
            "(?<=a)b",
            "error parsing regexp: invalid or unsupported Perl syntax",
        ),
        ("a{2,1}", "error parsing regexp: invalid repeat count"),
        (
            r"\w{1000}{1000}",
            "error parsing regexp: expression too large",
        ),
    ] {
        let mut crd = open_crd("example.com", "bads", "Bad", "v1", "Namespaced");
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object",
            "properties": {"spec": {"type": "object",
                "properties": {"s": {"type": "string", "pattern": pattern}}}}});
        let status = create(&client, crd).await.unwrap_err();
        assert_eq!(status.code, 422, "{pattern}");
        let field = format!(
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[s].pattern: Invalid value: {}: must be a valid regular expression, but isn't: {why}",
            json!(pattern)
        );
        assert!(
            status.message.contains(&field),
            "{}\nwanted: {field}",
            status.message
        );
    }
}

/// What an older server (or a hand-edited store) may hold and must not bring this one down:
/// a definition in a built-in group with a finalizer, a "definition" written raw through a
/// definition of definitions (`spec: 5`), and one whose pattern never compiles. The server
/// starts, serves the built-in objects, serves none of these (saying why in their
/// `Established` condition), and deleting them deletes no built-in object (a definition's
/// cleanup deletes only its own objects, as upstream's `crd_finalizer`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_with_definitions_written_past_validation_starts_and_skips_them() {
    let store = Arc::new(MemoryStore::new());
    // The first start writes the defaults (ClusterRoleBindings among them).
    drop(
        ApiServer::new(store.clone(), ApiServerConfig::default())
            .await
            .unwrap(),
    );
    let crd_key =
        |name: &str| format!("/registry/apiextensions.k8s.io/customresourcedefinitions/{name}");
    let mut crb = open_crd(
        "rbac.authorization.k8s.io",
        "clusterrolebindings",
        "ClusterRoleBinding",
        "v9",
        "Cluster",
    );
    crb["metadata"]["finalizers"] = json!(["customresourcecleanup.apiextensions.k8s.io"]);
    crb["metadata"]["uid"] = json!("0000-crb");
    crb["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    let mut bad_pattern = open_crd("example.com", "bads", "Bad", "v1", "Namespaced");
    bad_pattern["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object",
        "properties": {"s": {"type": "string", "pattern": "("}}});
    bad_pattern["metadata"]["uid"] = json!("0000-bad");
    bad_pattern["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    // A rule nested past cel-go's limits, written raw: it used to overflow the parser's stack
    // at every start.
    let mut deep = open_crd("example.com", "deeps", "Deep", "v1", "Namespaced");
    deep["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object",
        "x-kubernetes-validations": [{"rule": format!("{}true{}", "(".repeat(400), ")".repeat(400))}]});
    deep["metadata"]["uid"] = json!("0000-deep");
    deep["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    let raw = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                     "metadata": {"name": "raw.example.com", "uid": "0000-raw",
                                  "creationTimestamp": "2026-01-01T00:00:00Z"},
                     "spec": 5});
    for (name, obj) in [
        ("clusterrolebindings.rbac.authorization.k8s.io", &crb),
        ("bads.example.com", &bad_pattern),
        ("deeps.example.com", &deep),
        ("raw.example.com", &raw),
    ] {
        store
            .create(&crd_key(name), serde_json::to_vec(obj).unwrap().into())
            .await
            .unwrap();
    }
    let server = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .expect("the server starts over a store holding unservable definitions");
    let router = server.router();
    let client = Client::new(router.clone(), "default");
    let bindings = cluster_role_binding_names(&router).await;
    assert!(
        bindings.iter().any(|n| n == "cluster-admin"),
        "{bindings:?}"
    );
    for path in [
        "/apis/rbac.authorization.k8s.io/v9/clusterrolebindings",
        "/apis/example.com/v1/namespaces/default/bads",
        "/apis/example.com/v1/namespaces/default/deeps",
    ] {
        let (code, _, _) = send(&router, "GET", path, &[], axum::body::Body::empty()).await;
        assert_eq!(code, 404, "{path} is not served");
    }
    let crb = eventually(30, "the condition says why it is not served", || {
        let api = crd_api(&client);
        async move {
            let crd = api
                .get("clusterrolebindings.rbac.authorization.k8s.io")
                .await
                .ok()?;
            let established = condition(&crd, "Established")?;
            (established["status"] == "False").then_some(established)
        }
    })
    .await;
    assert_eq!(crb["reason"], "NotServed");
    assert!(
        crb["message"]
            .as_str()
            .unwrap()
            .contains("\"rbac.authorization.k8s.io\" is an API group this server serves itself"),
        "{crb}"
    );
    crd_api(&client)
        .delete(
            "clusterrolebindings.rbac.authorization.k8s.io",
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    eventually(30, "the definition is deleted", || {
        let api = crd_api(&client);
        async move {
            api.get_opt("clusterrolebindings.rbac.authorization.k8s.io")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    assert_eq!(cluster_role_binding_names(&router).await, bindings);
}

/// cel-go's parser limits and cost estimate, as apiextensions applies them when a definition
/// is written (`TestCELMaxRecursionDepth`, `StaticEstimatedCostLimit`): a rule nested or
/// chained past 250 levels is refused with cel-go's message, one of 249 is served and runs,
/// the finding's `split` rule over a 100,000-character string is refused for its estimated
/// cost, and a message construction (`Foo{…}`, which the `cel` crate cannot evaluate) is an
/// undeclared reference as in cel-go. None of them takes the server down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cel_rules_past_upstreams_limits_are_refused_with_its_messages() {
    let client = Client::new(ccm_testkit::memory_server().await.router(), "default");
    let with_rule = |plural: &str, kind: &str, rule: String, spec: Value| {
        let mut crd = open_crd("cel.example.com", plural, kind, "v1", "Namespaced");
        let mut spec = spec;
        spec["x-kubernetes-validations"] = json!([{"rule": rule}]);
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] =
            json!({"type": "object", "properties": {"spec": spec}});
        crd
    };
    let chain = |n: usize| format!("{}self.a", "self.a == ".repeat(n));
    let spec = json!({"type": "object", "properties": {"a": {"type": "boolean"}}});
    for (plural, rule, why) in [
        ("chains", chain(250), "max recursion depth exceeded"),
        (
            "nests",
            format!("{}true{}", "(".repeat(260), ")".repeat(260)),
            "expression recursion limit exceeded: 250",
        ),
        (
            "structs",
            "Foo{a: 1} == Foo{a: 1}".to_owned(),
            "undeclared reference to 'Foo'",
        ),
    ] {
        let kind = format!("K{plural}");
        let status = create(&client, with_rule(plural, &kind, rule, spec.clone()))
            .await
            .unwrap_err();
        assert_eq!(status.code, 422, "{plural}");
        assert!(
            status.message.contains("compilation failed"),
            "{plural}: {}",
            status.message
        );
        assert!(status.message.contains(why), "{plural}: {}", status.message);
    }
    let split = with_rule(
        "splits",
        "Split",
        "self.s.split('').all(x, self.s.split('').all(y, y.size() < 5))".to_owned(),
        json!({"type": "object", "properties": {"s": {"type": "string", "maxLength": 100000}}}),
    );
    let status = create(&client, split).await.unwrap_err();
    assert_eq!(status.code, 422);
    assert!(
        status
            .message
            .contains("Forbidden: estimated rule cost exceeds budget by factor of more than 100x"),
        "{}",
        status.message
    );
    // 249 levels: served, and the rule runs. `a != a != … != a` (left to right) is false
    // for either value of `a`, so every object fails it: proof that it was evaluated.
    let unequal = format!("{}self.a", "self.a != ".repeat(249));
    create(&client, with_rule("longs", "Long", unequal, spec.clone()))
        .await
        .unwrap();
    let gvk = GroupVersionKind::gvk("cel.example.com", "v1", "Long");
    let longs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(&gvk, "longs"),
    );
    let refused = eventually(30, "longs are served and their rule refuses", || {
        let longs = longs.clone();
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "cel.example.com/v1",
            "kind": "Long", "metadata": {"name": "l"}, "spec": {"a": true}}))
        .unwrap();
        async move {
            match longs.create(&PostParams::default(), &obj).await {
                Err(kube::Error::Api(status)) if status.code == 422 => Some(status),
                _ => None,
            }
        }
    })
    .await;
    assert!(
        refused
            .message
            .contains("spec: Invalid value: \"object\": failed rule: self.a != self.a"),
        "{}",
        refused.message
    );
}

/// A custom resource's validation runs off the async workers (upstream validates in the
/// request's own goroutine): on a runtime with a single worker, a request that arrives while
/// a large custom resource is being validated is answered before that validation ends.
#[tokio::test(flavor = "current_thread")]
async fn validation_does_not_hold_an_async_worker() {
    let server = ccm_testkit::memory_server().await;
    let router = server.router();
    let client = Client::new(router.clone(), "default");
    let mut crd = open_crd("example.com", "hostlists", "HostList", "v1", "Namespaced");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object",
        "properties": {"spec": {"type": "object", "properties": {"hosts": {"type": "array",
            "items": {"type": "string", "maxLength": 253,
                      "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}}}}}});
    create(&client, crd).await.unwrap();
    eventually(30, "hostlists are served", || {
        let router = router.clone();
        async move {
            let (code, _, _) = send(
                &router,
                "GET",
                "/apis/example.com/v1/namespaces/default/hostlists",
                &[],
                axum::body::Body::empty(),
            )
            .await;
            (code == 200).then_some(())
        }
    })
    .await;
    // About 1.2 MB of hosts (under the 1.5 MB an object may be): validating them takes a while in a debug build.
    let hosts: Vec<String> = (0..60_000).map(|i| format!("host-{i}.example")).collect();
    let body = serde_json::to_vec(&json!({"apiVersion": "example.com/v1", "kind": "HostList",
        "metadata": {"name": "big"}, "spec": {"hosts": hosts}}))
    .unwrap();
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let big = {
        let (router, order) = (router.clone(), order.clone());
        tokio::spawn(async move {
            let (code, _, body) = send(
                &router,
                "POST",
                "/apis/example.com/v1/namespaces/default/hostlists?dryRun=All",
                &[("content-type", "application/json")],
                body,
            )
            .await;
            order.lock().push("big");
            (code, body)
        })
    };
    // Let the big request reach its validation.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let (code, _, _) = send(
        &router,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        &[],
        axum::body::Body::empty(),
    )
    .await;
    order.lock().push("small");
    assert_eq!(code, 200);
    let (code, body) = big.await.unwrap();
    assert_eq!(code, 201, "{}", String::from_utf8_lossy(&body));
    assert_eq!(*order.lock(), ["small", "big"]);
}
