//! The RBAC index follows every committed write of the generic store, whatever path made
//! it, as upstream's RBAC authorizer follows its informers: a RoleBinding written by the
//! server itself (`ApiServer::apply_manifest`) or removed by the namespace's cleanup
//! (upstream's `NamespacedResourcesDeleter`) decides the very next request, with no
//! refresh in between.

use std::{sync::Arc, time::Duration};

use axum::{Router, body::Body};
use core_cluster::{ApiServer, ApiServerConfig, auth::UserInfo, store::MemoryStore};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// A raw request: (status, JSON body).
async fn request(router: &Router, method: &str, uri: &str, body: Value) -> (u16, Value) {
    let builder = axum::http::Request::builder().method(method).uri(uri);
    let (builder, body) = if body.is_null() {
        (builder, Body::empty())
    } else {
        let builder = builder.header("content-type", "application/json");
        (builder, Body::from(body.to_string()))
    };
    let response = router
        .clone()
        .oneshot(builder.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// A ClusterRole that reads ConfigMaps, and a RoleBinding granting it to alice in `team`.
/// The role is cluster-scoped, so only the binding lives and dies with the namespace.
const MANIFEST: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: configmap-reader
rules:
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: alice-reads
  namespace: team
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: configmap-reader
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: alice
"#;

const ALICE_LISTS: &str = "/api/v1/namespaces/team/configmaps";
const BINDING: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/team/rolebindings/alice-reads";

/// `plugin/pkg/auth/authorizer/rbac/rbac.go`: the authorizer reads the current bindings.
/// One written by `apply_manifest` grants on the next request; one deleted by the
/// namespace's cleanup grants nothing on the next request after it is gone.
#[tokio::test]
async fn a_rolebinding_written_or_removed_by_the_server_decides_the_next_request() {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let admin = server.router();
    let alice = server.router_as(UserInfo::new("alice", ["dev"]));
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}});
    let (code, _) = request(&admin, "POST", "/api/v1/namespaces", namespace).await;
    assert_eq!(code, 201);
    let (code, _) = request(&alice, "GET", ALICE_LISTS, Value::Null).await;
    assert_eq!(code, 403, "alice holds nothing yet");

    let written = server
        .apply_manifest(MANIFEST, &["ClusterRole", "RoleBinding"])
        .await
        .unwrap();
    assert_eq!(written, 2);
    let (code, body) = request(&alice, "GET", ALICE_LISTS, Value::Null).await;
    assert_eq!(
        code, 200,
        "the binding the server wrote grants at once: {body}"
    );

    let (code, _) = request(&admin, "DELETE", "/api/v1/namespaces/team", Value::Null).await;
    assert_eq!(code, 200);
    // The cleanup runs in the background: wait until it has deleted the binding, then ask
    // at once.
    let mut gone = false;
    for _ in 0..200 {
        if request(&admin, "GET", BINDING, Value::Null).await.0 == 404 {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the namespace's cleanup deletes its RoleBinding");
    let (code, _) = request(&alice, "GET", ALICE_LISTS, Value::Null).await;
    assert_eq!(code, 403, "a binding the cleanup deleted grants nothing");
    // The ClusterRole was not in the namespace and is still there.
    let (code, _) = request(
        &admin,
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/configmap-reader",
        Value::Null,
    )
    .await;
    assert_eq!(code, 200);
}
