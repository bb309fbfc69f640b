//! kubectl v1.32 against the OpenAPI v3 documents of [`core_cluster::openapi`].
//!
//! The real API server serves discovery and `/openapi/v3` on loopback over TLS, and the machine's
//! `kubectl` runs
//! `explain` (which reads schemas from `/openapi/v3`) and `apply` (which, with the default
//! validation, must find the PATCH operation's GVK and `fieldValidation` parameter there to
//! leave validation to the server instead of asking for `/openapi/v2`).

use std::sync::Arc;

use ccm_testkit::kubectl::{Output, require_kubectl};

use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};
use parking_lot::Mutex;

/// The real API server on loopback, with a log of what kubectl asked.
struct Server {
    /// The admin kubeconfig (https, the cluster CA, a client certificate).
    kubeconfig: String,
    _pki_dir: tempfile::TempDir,
    api: ApiServer,
    /// Every request, as `METHOD path?query`.
    requests: Mutex<Vec<String>>,
    /// The `Content-Type` of every PATCH request.
    patch_content_types: Mutex<Vec<String>>,
}

type Shared = Arc<Server>;

async fn start() -> Shared {
    let api = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("start the API server");
    let (listener, addr) = core_cluster::serve::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let pki_dir = tempfile::tempdir().expect("PKI directory");
    let security =
        core_cluster::serve::Security::load(&api, pki_dir.path(), &[]).expect("PKI and TLS");
    let server = Arc::new(Server {
        kubeconfig: security.admin_kubeconfig(addr),
        _pki_dir: pki_dir,
        api: api.clone(),
        requests: Mutex::new(Vec::new()),
        patch_content_types: Mutex::new(Vec::new()),
    });
    let log = Arc::clone(&server);
    // Over TLS behind authentication, as kubectl talks to any cluster.
    let router = core_cluster::serve::secure_router(&api, security.authenticator.clone()).layer(
        axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let log = Arc::clone(&log);
                async move {
                    log.requests.lock().push(format!(
                        "{} {}",
                        request.method(),
                        // HTTP/2 requests carry the full URI; log the path as HTTP/1 has it.
                        request.uri().path_and_query().map_or("/", |p| p.as_str())
                    ));
                    if request.method() == axum::http::Method::PATCH {
                        let ct = request
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        log.patch_content_types.lock().push(ct);
                    }
                    next.run(request).await
                }
            },
        ),
    );
    tokio::spawn(core_cluster::serve::serve_tls(
        router,
        listener,
        security.tls.clone(),
        core_cluster::serve::ServeOptions::default(),
        tokio_util::sync::CancellationToken::new(),
    ));
    server
}

/// The `greeting` of ConfigMap `default/hello`, read through the API.
async fn greeting(server: &Server) -> String {
    let client = kube::Client::new(server.api.router(), "default");
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client, "default");
    cms.get("hello")
        .await
        .expect("the applied ConfigMap exists")
        .data
        .unwrap_or_default()["greeting"]
        .clone()
}

async fn kubectl(server: &Shared, dir: &std::path::Path, args: &[&str]) -> Output {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, &server.kubeconfig).expect("write the kubeconfig");
    ccm_testkit::kubectl::kubectl(dir, &kubeconfig, args).await
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
    require_kubectl("it checks what kubectl's explain and apply make of the OpenAPI v3 documents");
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
    assert_eq!(greeting(&server).await, "hi");

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
    assert_eq!(greeting(&server).await, "hello");
}
