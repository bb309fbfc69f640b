//! kubectl v1.32 against the OpenAPI v3 documents of [`core_cluster::openapi`].
//!
//! A tiny axum server serves `/version`, legacy discovery (`/api`, `/api/v1`, `/apis`,
//! `/apis/<group>/<version>`) and `/openapi/v3`, and the machine's `kubectl` runs
//! `explain` (which reads schemas from `/openapi/v3`) and `apply` (which, with the default
//! validation, must find the PATCH operation's GVK and `fieldValidation` parameter there to
//! leave validation to the server instead of asking for `/openapi/v2`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use core_cluster::openapi::{OpenApiDocuments, OpenApiResource, served_resources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
    ServerAddressByClientCIDR,
};
use k8s_openapi::apimachinery::pkg::version::Info;
use parking_lot::Mutex;
use serde_json::{Value, json};

/// What the fake server serves, and what it saw.
struct Server {
    addr: SocketAddr,
    resources: Vec<OpenApiResource>,
    documents: OpenApiDocuments,
    /// Every request, as `METHOD path?query`.
    requests: Mutex<Vec<String>>,
    /// The objects kubectl created, by path.
    created: Mutex<BTreeMap<String, Value>>,
    /// The `Content-Type` of every PATCH request.
    patch_content_types: Mutex<Vec<String>>,
}

type Shared = Arc<Server>;

fn json_response(status: StatusCode, value: &impl k8s_openapi::serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).expect("serializable");
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn not_found(what: &str) -> Response {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": format!("{what} not found"),
            "reason": "NotFound",
            "code": 404,
        }),
    )
}

fn resource_list(server: &Server, group: &str, version: &str) -> Option<APIResourceList> {
    let mut resources = Vec::new();
    for resource in server
        .resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs = [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ];
        resources.push(APIResource {
            name: resource.plural.to_owned(),
            singular_name: resource.kind.to_lowercase(),
            namespaced: resource.namespaced,
            kind: resource.kind.to_owned(),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..Default::default()
        });
        for subresource in resource.subresources {
            let (kind, group, version, verbs): (&str, Option<&str>, Option<&str>, &[&str]) =
                match *subresource {
                    "binding" => ("Binding", None, None, &["create"]),
                    "eviction" => ("Eviction", Some("policy"), Some("v1"), &["create"]),
                    _ => (resource.kind, None, None, &["get", "patch", "update"]),
                };
            resources.push(APIResource {
                name: format!("{}/{subresource}", resource.plural),
                namespaced: resource.namespaced,
                kind: kind.to_owned(),
                group: group.map(str::to_owned),
                version: version.map(str::to_owned),
                verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
                ..Default::default()
            });
        }
    }
    (!resources.is_empty()).then(|| APIResourceList {
        group_version: if group.is_empty() {
            version.to_owned()
        } else {
            format!("{group}/{version}")
        },
        resources,
    })
}

async fn version() -> Response {
    json_response(
        StatusCode::OK,
        &Info {
            git_version: "v1.33.0".to_owned(),
            major: "1".to_owned(),
            minor: "33".to_owned(),
            platform: "linux/amd64".to_owned(),
            ..Default::default()
        },
    )
}

async fn api(State(server): State<Shared>) -> Response {
    json_response(
        StatusCode::OK,
        &APIVersions {
            versions: vec!["v1".to_owned()],
            server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
                client_cidr: "0.0.0.0/0".to_owned(),
                server_address: server.addr.to_string(),
            }],
        },
    )
}

async fn api_v1(State(server): State<Shared>) -> Response {
    match resource_list(&server, "", "v1") {
        Some(list) => json_response(StatusCode::OK, &list),
        None => not_found("v1"),
    }
}

async fn apis(State(server): State<Shared>) -> Response {
    let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for resource in server.resources.iter().filter(|r| !r.group.is_empty()) {
        let versions = groups.entry(resource.group).or_default();
        if !versions.contains(&resource.version) {
            versions.push(resource.version);
        }
    }
    let groups = groups
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<GroupVersionForDiscovery> = versions
                .into_iter()
                .map(|version| GroupVersionForDiscovery {
                    group_version: format!("{name}/{version}"),
                    version: version.to_owned(),
                })
                .collect();
            APIGroup {
                name: name.to_owned(),
                preferred_version: versions.first().cloned(),
                server_address_by_client_cidrs: None,
                versions,
            }
        })
        .collect();
    json_response(StatusCode::OK, &APIGroupList { groups })
}

async fn apis_group_version(
    State(server): State<Shared>,
    Path((group, version)): Path<(String, String)>,
) -> Response {
    match resource_list(&server, &group, &version) {
        Some(list) => json_response(StatusCode::OK, &list),
        None => not_found(&format!("{group}/{version}")),
    }
}

fn raw_json(body: &[u8]) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_vec(),
    )
        .into_response()
}

async fn openapi_index(State(server): State<Shared>) -> Response {
    raw_json(server.documents.index())
}

async fn openapi_document(State(server): State<Shared>, Path(path): Path<String>) -> Response {
    match server.documents.group_version(&path) {
        Some(body) => raw_json(body),
        None => not_found(&path),
    }
}

/// `kubectl apply` of a ConfigMap: the GET finds nothing, the POST creates it.
async fn configmap(
    State(server): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let path = format!("/api/v1/namespaces/{namespace}/configmaps/{name}");
    match server.created.lock().get(&path) {
        Some(object) => json_response(StatusCode::OK, object),
        None => not_found(&format!("configmaps \"{name}\"")),
    }
}

async fn create_configmap(
    State(server): State<Shared>,
    Path(namespace): Path<String>,
    body: Bytes,
) -> Response {
    let mut object: Value = match serde_json::from_slice(&body) {
        Ok(object) => object,
        Err(error) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &json!({ "error": error.to_string() }),
            );
        }
    };
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    object["metadata"]["namespace"] = json!(namespace);
    object["metadata"]["resourceVersion"] = json!("1");
    object["metadata"]["uid"] = json!("6a1c0d3e-0000-4000-8000-000000000001");
    server.created.lock().insert(
        format!("/api/v1/namespaces/{namespace}/configmaps/{name}"),
        object.clone(),
    );
    json_response(StatusCode::CREATED, &object)
}

/// RFC 7386 merge of `patch` into `target`; for a ConfigMap's `data` and `metadata` this is
/// also what a strategic merge patch does.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// The PATCH of a second `kubectl apply`.
async fn patch_configmap(
    State(server): State<Shared>,
    Path((namespace, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    server
        .patch_content_types
        .lock()
        .push(content_type.to_owned());
    let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
        return json_response(StatusCode::BAD_REQUEST, &json!({ "error": "not JSON" }));
    };
    let path = format!("/api/v1/namespaces/{namespace}/configmaps/{name}");
    let mut created = server.created.lock();
    let Some(object) = created.get_mut(&path) else {
        return not_found(&format!("configmaps \"{name}\""));
    };
    merge(object, &patch);
    object["metadata"]["resourceVersion"] = json!("2");
    json_response(StatusCode::OK, object)
}

async fn fallback(uri: Uri) -> Response {
    not_found(&uri.to_string())
}

/// Starts the server on 127.0.0.1 (port 0) and returns its shared state.
async fn start() -> Shared {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    let resources = served_resources();
    let documents = OpenApiDocuments::new(&resources);
    let server = Arc::new(Server {
        addr,
        resources,
        documents,
        requests: Mutex::new(Vec::new()),
        created: Mutex::new(BTreeMap::new()),
        patch_content_types: Mutex::new(Vec::new()),
    });
    let log = Arc::clone(&server);
    let router = Router::new()
        .route("/version", get(version))
        .route("/api", get(api))
        .route("/api/v1", get(api_v1))
        .route("/apis", get(apis))
        .route("/apis/{group}/{version}", get(apis_group_version))
        .route("/openapi/v3", get(openapi_index))
        .route("/openapi/v3/{*path}", get(openapi_document))
        .route(
            "/api/v1/namespaces/{namespace}/configmaps",
            axum::routing::post(create_configmap),
        )
        .route(
            "/api/v1/namespaces/{namespace}/configmaps/{name}",
            get(configmap).patch(patch_configmap),
        )
        .fallback(fallback)
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let log = Arc::clone(&log);
                async move {
                    log.requests
                        .lock()
                        .push(format!("{} {}", request.method(), request.uri()));
                    next.run(request).await
                }
            },
        ))
        .with_state(Arc::clone(&server));
    tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serve");
    });
    server
}

/// The output of one kubectl run.
struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Fails (rather than skips) when kubectl is missing or older than v1.32.
fn require_kubectl() {
    const REQUIRED: &str = "kubectl v1.32 is required on PATH for this test (it checks what \
                            kubectl's explain and apply make of the OpenAPI v3 documents)";
    let output = Command::new("kubectl")
        .args(["version", "--client", "-o", "json"])
        .output()
        .unwrap_or_else(|error| panic!("{REQUIRED}: running `kubectl` failed: {error}"));
    let version: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{REQUIRED}: unreadable `kubectl version`: {error}"));
    let minor: u32 = version["clientVersion"]["minor"]
        .as_str()
        .and_then(|minor| minor.trim_end_matches('+').parse().ok())
        .unwrap_or(0);
    assert!(
        version["clientVersion"]["major"] == "1" && minor >= 32,
        "{REQUIRED}; found {}",
        version["clientVersion"]
    );
}

async fn kubectl(server: &Shared, dir: &std::path::Path, args: &[&str]) -> Output {
    let mut command = Command::new("kubectl");
    command
        .arg(format!("--server=http://{}", server.addr))
        .arg(format!("--cache-dir={}", dir.join("cache").display()))
        .args(args)
        // No kubeconfig or home-directory state of the machine leaks in.
        .env("KUBECONFIG", dir.join("no-kubeconfig"))
        .env("HOME", dir);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("kubectl thread")
        .expect("kubectl runs");
    Output {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `kubectl explain <what>` and returns its output, failing with the server's log.
async fn explain(server: &Shared, dir: &std::path::Path, what: &str) -> String {
    let mut args = vec!["explain"];
    args.extend(what.split_whitespace());
    let output = kubectl(server, dir, &args).await;
    assert!(
        output.success,
        "kubectl explain {what} failed:\nstderr: {}\nstdout: {}\nrequests: {:#?}",
        output.stderr,
        output.stdout,
        server.requests.lock()
    );
    output.stdout
}

/// The lines of `output` with runs of whitespace collapsed, for content checks that do not
/// depend on kubectl's column alignment.
fn normalized(output: &str) -> String {
    output
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_and_apply_use_openapi_v3() {
    require_kubectl();
    let server = start().await;
    let dir = tempfile::tempdir().expect("temp dir");

    let node_spec = normalized(&explain(&server, dir.path(), "node.spec").await);
    println!("{node_spec}");
    for expected in [
        "KIND: Node",
        "VERSION: v1",
        "FIELD: spec <NodeSpec>",
        "NodeSpec describes the attributes that a node is created with.",
        "podCIDRs <[]string>",
        "podCIDRs represents the IP ranges assigned to the node",
        "providerID <string>",
        "ID of the node assigned by the cloud provider",
        "taints <[]Taint>",
        "If specified, the node's taints.",
    ] {
        assert!(
            node_spec.contains(expected),
            "`explain node.spec` lacks {expected:?}:\n{node_spec}"
        );
    }

    let containers = normalized(&explain(&server, dir.path(), "pods.spec.containers").await);
    println!("{containers}");
    for expected in [
        "KIND: Pod",
        "FIELD: containers <[]Container>",
        "A single application container that you want to run within a pod.",
        "image <string>",
        "name <string> -required-",
        "resources <ResourceRequirements>",
    ] {
        assert!(
            containers.contains(expected),
            "`explain pods.spec.containers` lacks {expected:?}:\n{containers}"
        );
    }

    let lease_spec = normalized(&explain(&server, dir.path(), "leases.spec").await);
    println!("{lease_spec}");
    for expected in [
        "GROUP: coordination.k8s.io",
        "KIND: Lease",
        "FIELD: spec <LeaseSpec>",
        "holderIdentity <string>",
        "leaseDurationSeconds <integer>",
        "renewTime <string>",
    ] {
        assert!(
            lease_spec.contains(expected),
            "`explain leases.spec` lacks {expected:?}:\n{lease_spec}"
        );
    }

    let node = normalized(&explain(&server, dir.path(), "node --recursive").await);
    for expected in [
        "DESCRIPTION:\nNode is a worker node in Kubernetes.",
        "metadata <ObjectMeta> -required-",
        "taints <[]Taint>\neffect <string> -required-\nkey <string> -required-",
        "conditions <[]NodeCondition>",
    ] {
        assert!(
            node.contains(expected),
            "`explain node --recursive` lacks {expected:?}:\n{node}"
        );
    }

    let events =
        normalized(&explain(&server, dir.path(), "events --api-version=events.k8s.io/v1").await);
    for expected in [
        "GROUP: events.k8s.io",
        "KIND: Event",
        "eventTime <string>\neventTime is the time when this Event was first observed.",
        "regarding <ObjectReference>",
    ] {
        assert!(
            events.contains(expected),
            "`explain events --api-version=events.k8s.io/v1` lacks {expected:?}:\n{events}"
        );
    }

    let endpoints = normalized(&explain(&server, dir.path(), "endpointslices.endpoints").await);
    for expected in [
        "GROUP: discovery.k8s.io",
        "KIND: EndpointSlice",
        "FIELD: endpoints <[]Endpoint>",
        "addresses <[]string> -required-",
    ] {
        assert!(
            endpoints.contains(expected),
            "`explain endpointslices.endpoints` lacks {expected:?}:\n{endpoints}"
        );
    }

    // With default validation, kubectl apply asks the v3 document of api/v1 whether the
    // server validates fields; it must then send fieldValidation=Strict instead of asking
    // for /openapi/v2 and telling the user to turn validation off.
    let before_apply = server.requests.lock().len();
    let manifest = dir.path().join("configmap.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello\ndata:\n  greeting: hi\n",
    )
    .expect("write manifest");
    let apply = kubectl(
        &server,
        dir.path(),
        &["apply", "-f", manifest.to_str().expect("UTF-8 path")],
    )
    .await;
    let requests = server.requests.lock()[before_apply..].to_vec();
    assert!(
        apply.success,
        "kubectl apply failed:\nstderr: {}\nstdout: {}\nrequests: {requests:#?}",
        apply.stderr, apply.stdout
    );
    assert!(
        apply.stdout.contains("configmap/hello created"),
        "unexpected apply output: {}",
        apply.stdout
    );
    let create = requests
        .iter()
        .find(|request| request.starts_with("POST /api/v1/namespaces/default/configmaps"))
        .unwrap_or_else(|| panic!("no create request in {requests:#?}"));
    assert!(
        create.contains("fieldValidation=Strict"),
        "apply did not leave validation to the server: {create}"
    );
    assert!(
        requests
            .iter()
            .any(|request| request.starts_with("GET /openapi/v3/api/v1?hash=")),
        "apply did not read the api/v1 document: {requests:#?}"
    );
    assert!(
        !requests
            .iter()
            .any(|request| request.contains("/openapi/v2")),
        "kubectl fell back to /openapi/v2: {requests:#?}"
    );
    assert_eq!(
        server.created.lock()["/api/v1/namespaces/default/configmaps/hello"]["data"]["greeting"],
        "hi"
    );

    // Applying a change patches the object; the PATCH also leaves validation to the server.
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello\ndata:\n  greeting: hello\n",
    )
    .expect("write manifest");
    let before_patch = server.requests.lock().len();
    let apply = kubectl(
        &server,
        dir.path(),
        &["apply", "-f", manifest.to_str().expect("UTF-8 path")],
    )
    .await;
    let requests = server.requests.lock()[before_patch..].to_vec();
    assert!(
        apply.success && apply.stdout.contains("configmap/hello configured"),
        "second kubectl apply failed:\nstderr: {}\nstdout: {}\nrequests: {requests:#?}",
        apply.stderr,
        apply.stdout
    );
    let patch = requests
        .iter()
        .find(|request| request.starts_with("PATCH /api/v1/namespaces/default/configmaps/hello"))
        .unwrap_or_else(|| panic!("no PATCH request in {requests:#?}"));
    assert!(
        patch.contains("fieldValidation=Strict"),
        "the PATCH did not leave validation to the server: {patch}"
    );
    assert_eq!(
        server.patch_content_types.lock().as_slice(),
        ["application/strategic-merge-patch+json"]
    );
    assert_eq!(
        server.created.lock()["/api/v1/namespaces/default/configmaps/hello"]["data"]["greeting"],
        "hello"
    );
}
