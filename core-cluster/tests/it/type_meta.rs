//! `apiVersion` and `kind` of request bodies over HTTPS, as kube-apiserver reads them: the
//! decoder takes the endpoint's group, version and kind as defaults
//! (`handlers/create.go`/`update.go`: `decoder.Decode(body, &defaultGVK, original)`, the JSON
//! serializer's `gvkWithDefaults`), so a body without them is accepted (the official Python
//! client sends none); a body naming another kind or version is refused with upstream's
//! messages (`transformDecodeError`, "the API version in the data … does not match …").

use std::sync::Arc;

use ccm_testkit::TestServer;
use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{Api, Client};
use serde_json::{Value, json};

async fn start() -> (TestServer, Client) {
    let api = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let server = TestServer::start(api).await.unwrap();
    let client = server.admin_client().await.unwrap();
    (server, client)
}

/// Sends `body` with `method` to `path`: the decoded answer, or (code, message).
async fn send(
    client: &Client,
    method: &str,
    path: &str,
    body: Value,
) -> Result<Value, (u16, String)> {
    let request = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(body.to_string().into_bytes())
        .unwrap();
    client.request::<Value>(request).await.map_err(|e| match e {
        kube::Error::Api(s) => (s.code, s.message),
        other => panic!("not an API error: {other}"),
    })
}

/// Upstream `gvkWithDefaults`: a create without `kind`/`apiVersion` takes the URL's, and the
/// object is stored and served with them.
#[tokio::test]
async fn create_without_kind_or_api_version_defaults_them_from_the_url() {
    let (_server, client) = start().await;
    let created = send(
        &client,
        "POST",
        "/api/v1/nodes",
        json!({"metadata": {"name": "n1"}}),
    )
    .await
    .unwrap();
    assert_eq!(
        (&created["kind"], &created["apiVersion"]),
        (&json!("Node"), &json!("v1"))
    );
    let node = Api::<Node>::all(client.clone()).get("n1").await.unwrap();
    assert_eq!(node.metadata.name.as_deref(), Some("n1"));

    // Only one of the two given: the other is defaulted.
    let created = send(
        &client,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        json!({"kind": "Lease", "metadata": {"name": "l1"}}),
    )
    .await
    .unwrap();
    assert_eq!(created["apiVersion"], "coordination.k8s.io/v1");
    let created = send(
        &client,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "metadata": {"name": "r1"}, "rules": []}),
    )
    .await
    .unwrap();
    assert_eq!(created["kind"], "ClusterRole");
}

/// Upstream `update.go` decodes with the same defaults: a PUT without them replaces.
#[tokio::test]
async fn update_without_kind_or_api_version_defaults_them_from_the_url() {
    let (_server, client) = start().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    send(
        &client,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        json!({"metadata": {"name": "c1"}, "data": {"a": "1"}}),
    )
    .await
    .unwrap();
    let current = config_maps.get("c1").await.unwrap();
    let replaced = send(
        &client,
        "PUT",
        "/api/v1/namespaces/default/configmaps/c1",
        json!({"metadata": {"name": "c1", "resourceVersion": current.metadata.resource_version}, "data": {"a": "2"}}),
    )
    .await
    .unwrap();
    assert_eq!(replaced["kind"], "ConfigMap");
    let data = config_maps.get("c1").await.unwrap().data.unwrap();
    assert_eq!(data["a"], "2");
}

/// Upstream `transformDecodeError` and `create.go`'s version check: a body naming another
/// kind or version is refused, and nothing is written.
#[tokio::test]
async fn a_present_but_different_kind_or_version_is_refused_as_upstream() {
    let (_server, client) = start().await;
    let refused = |path: &'static str, body: Value| {
        let client = client.clone();
        async move { send(&client, "POST", path, body).await.unwrap_err() }
    };
    assert_eq!(
        refused("/api/v1/nodes", json!({"kind": "Pod", "metadata": {"name": "n1"}})).await,
        (
            400,
            "Pod in version \"v1\" cannot be handled as a Node: converting (v1.Pod) to (core.Node): unknown conversion".into()
        )
    );
    assert_eq!(
        refused(
            "/api/v1/nodes",
            json!({"apiVersion": "apps/v1", "kind": "Node", "metadata": {"name": "n1"}})
        )
        .await,
        (
            400,
            "Node in version \"v1\" cannot be handled as a Node: no kind \"Node\" is registered for version \"apps/v1\" in scheme \"pkg/api/legacyscheme/scheme.go:30\"".into()
        )
    );
    assert_eq!(
        refused(
            "/api/v1/namespaces/default/events",
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"}})
        )
        .await,
        (
            400,
            "the API version in the data (events.k8s.io/v1) does not match the expected API version (v1)".into()
        )
    );
    let (code, message) = refused("/api/v1/nodes", json!({"kind": ["Node"]})).await;
    assert_eq!(code, 400, "{message}");
    assert!(
        Api::<Node>::all(client.clone())
            .get_opt("n1")
            .await
            .unwrap()
            .is_none(),
        "a refused body wrote nothing"
    );
    // Updates too.
    send(
        &client,
        "POST",
        "/api/v1/nodes",
        json!({"metadata": {"name": "n2"}}),
    )
    .await
    .unwrap();
    let (code, message) = send(
        &client,
        "PUT",
        "/api/v1/nodes/n2",
        json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "n2"}}),
    )
    .await
    .unwrap_err();
    assert_eq!(code, 400);
    assert!(
        message.starts_with("Namespace in version \"v1\" cannot be handled as a Node"),
        "{message}"
    );
}

/// The bodies that are never stored decode the same way: access reviews, TokenRequest and
/// TokenReview default their kind from the URL and refuse another.
#[tokio::test]
async fn reviews_and_token_requests_default_kind_from_the_url() {
    let (_server, client) = start().await;
    let review = send(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json!({"spec": {"resourceAttributes": {"verb": "get", "resource": "nodes"}}}),
    )
    .await
    .unwrap();
    assert_eq!(
        (&review["kind"], &review["apiVersion"]),
        (
            &json!("SelfSubjectAccessReview"),
            &json!("authorization.k8s.io/v1")
        )
    );
    assert_eq!(review["status"]["allowed"], true);
    let (code, message) = send(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json!({"kind": "SubjectAccessReview", "spec": {"resourceAttributes": {"verb": "get", "resource": "nodes"}}}),
    )
    .await
    .unwrap_err();
    assert_eq!(code, 400);
    assert!(
        message.contains("cannot be handled as a SelfSubjectAccessReview"),
        "{message}"
    );

    send(
        &client,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        json!({"metadata": {"name": "sa"}}),
    )
    .await
    .unwrap();
    let token = send(
        &client,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/sa/token",
        json!({"spec": {}}),
    )
    .await
    .unwrap();
    assert_eq!(
        (&token["kind"], &token["apiVersion"]),
        (&json!("TokenRequest"), &json!("authentication.k8s.io/v1"))
    );
    let jwt = token["status"]["token"].as_str().unwrap().to_owned();
    let review = send(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        json!({"spec": {"token": jwt}}),
    )
    .await
    .unwrap();
    assert_eq!(review["kind"], "TokenReview");
    assert_eq!(
        review["status"]["user"]["username"],
        "system:serviceaccount:default:sa"
    );
    let (code, message) = send(
        &client,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/sa/token",
        json!({"apiVersion": "authentication.k8s.io/v2", "spec": {}}),
    )
    .await
    .unwrap_err();
    assert_eq!(code, 400);
    assert!(
        message.contains(
            "no kind \"TokenRequest\" is registered for version \"authentication.k8s.io/v2\""
        ),
        "{message}"
    );
}
