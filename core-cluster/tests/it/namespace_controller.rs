//! The namespace controller (`core_cluster::controllers::namespace`), as upstream's
//! `pkg/controller/namespace/deletion/namespaced_resources_deleter.go`:
//!
//! - against a fake API that, like kube-apiserver, leaves a deleted namespace to its
//!   controller (core-cluster's server cleans namespaces up itself): Pods first, the rest once
//!   they are gone, `deletecollection` where served and DELETE of each item elsewhere, all
//!   with `propagationPolicy: Background` and each object's own grace period; content left
//!   is waited for; the status conditions say what is left; the `finalize` subresource drops
//!   only `kubernetes`;
//! - against core-cluster's own server, which does the same work: both converge.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use axum::http::{Request, Response, StatusCode};
use ccm_testkit::{client, eventually};
use core_cluster::controllers::namespace::{
    FINALIZER_ESTIMATE_SECONDS, NamespaceController, NamespaceDeletionError,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// The fake cluster: one terminating namespace `doomed` and its content, by resource.
#[derive(Default)]
struct Fake {
    namespace: Option<Value>,
    /// `plural → name → object` (core `pods`, `configmaps`; apps `deployments`).
    objects: BTreeMap<&'static str, BTreeMap<String, Value>>,
    resource_version: u64,
    /// Every write: `METHOD path` and its body.
    writes: Vec<(String, Value)>,
}

impl Fake {
    fn bump(&mut self) -> String {
        self.resource_version += 1;
        self.resource_version.to_string()
    }
}

fn list(kind: &str, items: Vec<Value>, rv: &str) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": rv}, "items": items})
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
           "reason": reason, "message": message})
}

fn resource(name: &str, kind: &str, scope: &str, verbs: &[&str]) -> Value {
    json!({"resource": name, "responseKind": {"group": "", "version": "v1", "kind": kind},
           "scope": scope, "verbs": verbs})
}

/// Aggregated discovery (`apidiscovery.k8s.io/v2`) of `/api` or `/apis`: core pods and
/// configmaps (with deletecollection), namespaces (cluster-scoped), bindings (create only);
/// apps deployments without deletecollection.
fn discovery(core: bool) -> Value {
    let all = [
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ];
    let item = if core {
        json!({"metadata": {"name": ""}, "versions": [{"version": "v1", "freshness": "Current",
        "resources": [
            resource("pods", "Pod", "Namespaced", &all),
            resource("configmaps", "ConfigMap", "Namespaced", &all),
            resource("namespaces", "Namespace", "Cluster", &all),
            resource("bindings", "Binding", "Namespaced", &["create"]),
        ]}]})
    } else {
        json!({"metadata": {"name": "apps"}, "versions": [{"version": "v1", "freshness": "Current",
            "resources": [resource("deployments", "Deployment", "Namespaced",
                &["create", "delete", "get", "list", "patch", "update", "watch"])]}]})
    };
    json!({"apiVersion": "apidiscovery.k8s.io/v2", "kind": "APIGroupDiscoveryList",
           "metadata": {}, "items": [item]})
}

/// kube-apiserver's answers to what the namespace controller asks, over `fake`.
fn answer(fake: &mut Fake, method: &str, path: &str, body: Value) -> (u16, Value) {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    if method != "GET" {
        fake.writes.push((format!("{method} {path}"), body.clone()));
    }
    match (method, segments.as_slice()) {
        ("GET", ["api"]) => (200, discovery(true)),
        ("GET", ["apis"]) => (200, discovery(false)),
        (_, ["api", "v1", "namespaces", "doomed", rest @ ..])
            if matches!(rest, [] | ["status" | "finalize"]) =>
        {
            let Some(ns) = fake.namespace.clone() else {
                return (
                    404,
                    status(404, "NotFound", "namespaces \"doomed\" not found"),
                );
            };
            match (method, rest) {
                ("GET", []) => (200, ns),
                ("PUT", [sub @ ("status" | "finalize")]) => {
                    if body["metadata"]["resourceVersion"] != ns["metadata"]["resourceVersion"] {
                        return (409, status(409, "Conflict", "the object has been modified"));
                    }
                    let mut updated = ns;
                    if *sub == "status" {
                        updated["status"] = body["status"].clone();
                    } else {
                        updated["spec"]["finalizers"] = body["spec"]["finalizers"].clone();
                    }
                    updated["metadata"]["resourceVersion"] = json!(fake.bump());
                    // kube-apiserver deletes a namespace once its finalizers are gone.
                    let done = updated["spec"]["finalizers"]
                        .as_array()
                        .is_some_and(|f| f.is_empty());
                    fake.namespace = (!done).then(|| updated.clone());
                    (200, updated)
                }
                _ => (405, status(405, "MethodNotAllowed", "not allowed")),
            }
        }
        (_, ["api", "v1", "namespaces", "doomed", plural, rest @ ..])
        | (
            _,
            [
                "apis",
                "apps",
                "v1",
                "namespaces",
                "doomed",
                plural,
                rest @ ..,
            ],
        ) => {
            let plural: &'static str = match *plural {
                "pods" => "pods",
                "configmaps" => "configmaps",
                "deployments" => "deployments",
                _ => return (404, status(404, "NotFound", "the server could not find it")),
            };
            let rv = fake.bump();
            let objects = fake.objects.entry(plural).or_default();
            match (method, rest) {
                ("GET", []) => (200, list("List", objects.values().cloned().collect(), &rv)),
                ("DELETE", []) => {
                    // Graceful for pods (their kubelet finishes them), at once for the
                    // rest unless a finalizer holds them.
                    let mut deleted = Vec::new();
                    objects.retain(|_, o| {
                        o["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
                        deleted.push(o.clone());
                        plural == "pods"
                            || o["metadata"]["finalizers"]
                                .as_array()
                                .is_some_and(|f| !f.is_empty())
                    });
                    (200, list("List", deleted, &rv))
                }
                ("DELETE", [name]) => match objects.remove(*name) {
                    Some(o) => (200, o),
                    None => (404, status(404, "NotFound", "not found")),
                },
                _ => (405, status(405, "MethodNotAllowed", "not allowed")),
            }
        }
        _ => (
            404,
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ),
        ),
    }
}

/// A client of the fake cluster, and the cluster.
fn fake_cluster(fake: Fake) -> (Client, Arc<Mutex<Fake>>) {
    let fake = Arc::new(Mutex::new(fake));
    let shared = fake.clone();
    let service = tower::service_fn(move |req: Request<kube::client::Body>| {
        let fake = shared.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let bytes = req.into_body().collect_bytes().await.unwrap();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let (code, answer) = answer(&mut fake.lock(), &method, &path, body);
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(answer.to_string().into_bytes()))
                    .unwrap(),
            )
        }
    });
    (Client::new(service, "default"), fake)
}

fn object(kind: &str, name: &str, extra: Value) -> Value {
    let mut o = json!({"apiVersion": "v1", "kind": kind,
        "metadata": {"name": name, "namespace": "doomed", "uid": format!("uid-{name}")}});
    if let (Some(o), Some(extra)) = (o.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            if k == "metadata" {
                for (mk, mv) in v.as_object().into_iter().flatten() {
                    o["metadata"][mk] = mv.clone();
                }
            } else {
                o.insert(k.clone(), v.clone());
            }
        }
    }
    o
}

fn doomed() -> Fake {
    let mut fake = Fake {
        namespace: Some(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": "doomed", "uid": "uid-ns", "resourceVersion": "1",
                         "deletionTimestamp": jiff::Timestamp::now().to_string()},
            "spec": {"finalizers": ["kubernetes", "example.com/hold"]},
            "status": {"phase": "Active"},
        })),
        resource_version: 1,
        ..Fake::default()
    };
    let pod = object(
        "Pod",
        "web",
        json!({"spec": {"containers": [{"name": "c", "image": "i"}],
                        "terminationGracePeriodSeconds": 30},
               "status": {"phase": "Running"}}),
    );
    fake.objects
        .insert("pods", BTreeMap::from([("web".to_owned(), pod)]));
    fake.objects.insert(
        "configmaps",
        BTreeMap::from([
            ("plain".to_owned(), object("ConfigMap", "plain", json!({}))),
            (
                "held".to_owned(),
                object(
                    "ConfigMap",
                    "held",
                    json!({"metadata": {"finalizers": ["example.com/cm"]}}),
                ),
            ),
        ]),
    );
    let mut deployment = object("Deployment", "web", json!({}));
    deployment["apiVersion"] = json!("apps/v1");
    fake.objects.insert(
        "deployments",
        BTreeMap::from([("web".to_owned(), deployment)]),
    );
    fake
}

fn writes_since(fake: &Mutex<Fake>, from: usize) -> Vec<(String, Value)> {
    fake.lock().writes[from..].to_vec()
}

fn condition(fake: &Mutex<Fake>, kind: &str) -> (String, String, String) {
    let ns = fake
        .lock()
        .namespace
        .clone()
        .expect("the namespace is there");
    let c = ns["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind).cloned())
        .unwrap_or_else(|| panic!("no condition {kind}: {ns}"));
    let s = |f: &str| c[f].as_str().unwrap_or_default().to_owned();
    (s("status"), s("reason"), s("message"))
}

/// `namespaced_resources_deleter.go` `Delete`: the namespace is marked `Terminating`; the
/// Pods are deleted first (`OrderedNamespaceDeletion`) and nothing else while one is left
/// within its grace period (`ResourcesRemainingError` with its `terminationGracePeriodSeconds`);
/// then `deletecollection` where served, a DELETE of each item where not (deployments), all
/// with `propagationPolicy: Background` and no grace period of the controller's own; content
/// held by a finalizer is waited for `finalizerEstimateSeconds`, and the conditions
/// `NamespaceContentRemaining` / `NamespaceFinalizersRemaining` say so; once nothing is left
/// the `finalize` subresource drops `kubernetes` and keeps the other finalizers.
#[tokio::test(start_paused = true)]
async fn the_namespace_is_emptied_pods_first_then_finalized() {
    let (client, fake) = fake_cluster(doomed());
    let controller = NamespaceController::new(client);

    // 1: the Pod is deleted and terminating on its node; nothing else is touched.
    let e = controller.sync("doomed").await.unwrap_err();
    assert!(
        matches!(e, NamespaceDeletionError::ResourcesRemaining(30)),
        "{e}"
    );
    let writes = writes_since(&fake, 0);
    let paths: Vec<&str> = writes.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "PUT /api/v1/namespaces/doomed/status",
            "DELETE /api/v1/namespaces/doomed/pods",
            "PUT /api/v1/namespaces/doomed/status",
        ],
        "pods first, nothing else while they remain"
    );
    assert_eq!(writes[0].1["status"]["phase"], "Terminating");
    let delete = &writes[1].1;
    assert_eq!(delete["propagationPolicy"], "Background", "{delete}");
    assert!(delete.get("gracePeriodSeconds").is_none(), "{delete}");

    // 2: the kubelet finished the Pod; the rest goes, but for a ConfigMap a finalizer holds.
    fake.lock().objects.get_mut("pods").unwrap().clear();
    let seen = fake.lock().writes.len();
    let e = controller.sync("doomed").await.unwrap_err();
    assert!(
        matches!(
            e,
            NamespaceDeletionError::ResourcesRemaining(FINALIZER_ESTIMATE_SECONDS)
        ),
        "{e}"
    );
    let writes = writes_since(&fake, seen);
    let paths: Vec<&str> = writes.iter().map(|(p, _)| p.as_str()).collect();
    for expected in [
        "DELETE /api/v1/namespaces/doomed/configmaps",
        "DELETE /apis/apps/v1/namespaces/doomed/deployments/web",
    ] {
        assert!(paths.contains(&expected), "{expected} not in {paths:?}");
    }
    assert!(
        writes
            .iter()
            .filter(|(p, _)| p.starts_with("DELETE"))
            .all(|(_, b)| b["propagationPolicy"] == "Background"),
        "{writes:?}"
    );
    assert!(fake.lock().objects["deployments"].is_empty());
    assert_eq!(
        condition(&fake, "NamespaceContentRemaining"),
        (
            "True".to_owned(),
            "SomeResourcesRemain".to_owned(),
            "Some resources are remaining: configmaps. has 1 resource instances".to_owned()
        )
    );
    assert_eq!(
        condition(&fake, "NamespaceFinalizersRemaining").2,
        "Some content in the namespace has finalizers remaining: example.com/cm in 1 resource instances"
    );

    // 3: the finalizer is gone; the namespace is finalized, keeping its other finalizer.
    fake.lock().objects.get_mut("configmaps").unwrap().clear();
    let seen = fake.lock().writes.len();
    controller.sync("doomed").await.unwrap();
    let writes = writes_since(&fake, seen);
    let (path, body) = writes.last().unwrap();
    assert_eq!(path, "PUT /api/v1/namespaces/doomed/finalize");
    assert_eq!(body["spec"]["finalizers"], json!(["example.com/hold"]));
    assert_eq!(
        condition(&fake, "NamespaceContentRemaining"),
        (
            "False".to_owned(),
            "ContentRemoved".to_owned(),
            "All content successfully removed".to_owned()
        )
    );
    let ns = fake.lock().namespace.clone().unwrap();
    assert_eq!(ns["spec"]["finalizers"], json!(["example.com/hold"]));
}

/// `Delete`: a namespace that is gone, or not being deleted, is left alone; one without
/// finalizers is finalized already (`finalized`).
#[tokio::test(start_paused = true)]
async fn only_deleted_namespaces_with_finalizers_are_worked_on() {
    let mut live = doomed();
    if let Some(ns) = live.namespace.as_mut() {
        ns["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("deletionTimestamp");
    }
    let (client, fake) = fake_cluster(live);
    NamespaceController::new(client)
        .sync("doomed")
        .await
        .unwrap();
    assert!(fake.lock().writes.is_empty());

    let mut finalized = doomed();
    if let Some(ns) = finalized.namespace.as_mut() {
        ns["spec"]["finalizers"] = json!([]);
        ns["status"]["phase"] = json!("Terminating");
    }
    let (client, fake) = fake_cluster(finalized);
    NamespaceController::new(client)
        .sync("doomed")
        .await
        .unwrap();
    assert!(fake.lock().writes.is_empty());

    let (client, fake) = fake_cluster(Fake::default());
    NamespaceController::new(client)
        .sync("doomed")
        .await
        .unwrap();
    assert!(fake.lock().writes.is_empty());
}

/// core-cluster's API server empties and finalizes a deleted namespace itself (its storage's
/// namespace cleanup); the controller running against it too (as `ccm controller-manager`
/// against `ccm apiserver`) converges with it: the namespace and its content go, and the
/// controller has nothing left to do.
#[tokio::test(start_paused = true)]
async fn against_core_clusters_own_cleanup_both_converge() {
    let client = client().await;
    let stop = CancellationToken::new();
    let controller = NamespaceController::new(client.clone());
    tokio::spawn(
        NamespaceController::new(client.clone())
            .with_grace_period(Duration::ZERO)
            .run(stop.clone()),
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
        )
        .await
        .unwrap();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "doomed");
    for i in 0..3 {
        configmaps
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}})).unwrap(),
            )
            .await
            .unwrap();
    }
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        .unwrap(),
    )
    .await
    .unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    eventually(60, "the namespace gone", || async {
        namespaces
            .get_opt("doomed")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    controller.sync("doomed").await.unwrap();
    stop.cancel();
}
