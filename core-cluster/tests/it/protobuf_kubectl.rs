//! kubectl v1.32's typed subcommands against the API server over TLS. They send
//! `Content-Type: application/vnd.kubernetes.protobuf` and `Accept:
//! application/vnd.kubernetes.protobuf, */*` (client-go's protobuf content config), as
//! kube-apiserver expects: each test checks kubectl's message and then reads the object back
//! through kube-rs (JSON, unchanged) to check what was stored, defaulted and allocated.

use std::sync::Arc;

use ccm_testkit::kubectl::{Output, require_kubectl};

use ccm_testkit::TestServer;
use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};
use k8s_openapi::api::{
    apps::v1::Deployment,
    batch::v1::Job,
    core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount},
};
use kube::Api;

struct Cluster {
    server: TestServer,
    dir: tempfile::TempDir,
}

async fn cluster() -> Cluster {
    require_kubectl("it runs kubectl's typed subcommands, which speak protobuf");
    let api = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .expect("start the API server");
    let server = TestServer::start(api).await.expect("serve over TLS");
    let dir = tempfile::tempdir().expect("kubectl's home");
    std::fs::write(dir.path().join("admin"), server.admin_kubeconfig()).expect("kubeconfig");
    Cluster { server, dir }
}

impl Cluster {
    /// kube-rs through the in-process router (JSON).
    fn client(&self) -> kube::Client {
        kube::Client::new(self.server.api().router(), "default")
    }

    /// Runs kubectl as the admin.
    async fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_with("admin", args).await
    }

    /// Runs kubectl with the kubeconfig file `config` in the test's directory.
    async fn kubectl_with(&self, config: &str, args: &[&str]) -> Output {
        let dir = self.dir.path();
        ccm_testkit::kubectl::kubectl(dir, &dir.join(config), args).await
    }

    /// Runs kubectl and insists it succeeded with `expected` on stdout.
    async fn ok(&self, args: &[&str], expected: &str) -> Output {
        let out = self.kubectl(args).await;
        assert!(
            out.success && out.stdout.contains(expected),
            "kubectl {args:?}: expected {expected:?}\nstdout: {}\nstderr: {}",
            out.stdout,
            out.stderr
        );
        out
    }
}

/// `kubectl create namespace` posts a protobuf Namespace and decodes our protobuf answer
/// (upstream: kube-apiserver serves every built-in kind in protobuf); `-v=8` shows the
/// media types kubectl used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_namespace_sends_and_receives_protobuf() {
    let c = cluster().await;
    let out = c
        .ok(
            &["create", "namespace", "shop", "-v=8"],
            "namespace/shop created",
        )
        .await;
    assert!(
        out.stderr
            .contains("Content-Type: application/vnd.kubernetes.protobuf"),
        "kubectl sent protobuf: {}",
        out.stderr
    );
    // kubectl -v=8 logs `"Response" status="201 Created" headers=<` and then the headers.
    let response = out
        .stderr
        .split("\"Response\" status=\"201 Created\"")
        .nth(1)
        .expect("kubectl logged the response");
    assert!(
        response
            .lines()
            .take(8)
            .any(|l| l.trim() == "Content-Type: application/vnd.kubernetes.protobuf"),
        "the answer was protobuf: {response}"
    );
    let ns = Api::<Namespace>::all(c.client()).get("shop").await.unwrap();
    assert_eq!(
        ns.status.and_then(|s| s.phase).as_deref(),
        Some("Active"),
        "defaulted as upstream's namespace strategy does"
    );
    // A second create is a protobuf Status 409 that kubectl reads as AlreadyExists.
    let again = c.kubectl(&["create", "namespace", "shop"]).await;
    assert!(!again.success);
    assert!(
        again.stderr.contains("namespaces \"shop\" already exists"),
        "{}",
        again.stderr
    );
}

/// `create configmap --from-literal`, `create secret generic` (bytes in a protobuf map,
/// `type` defaulted to Opaque by upstream's defaulting when "" arrives) and `create
/// serviceaccount`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_configmap_secret_and_serviceaccount() {
    let c = cluster().await;
    c.ok(
        &[
            "create",
            "configmap",
            "foo",
            "--from-literal=a=b",
            "--from-literal=c=d",
        ],
        "configmap/foo created",
    )
    .await;
    let cm = Api::<ConfigMap>::default_namespaced(c.client())
        .get("foo")
        .await
        .unwrap();
    let data = cm.data.unwrap_or_default();
    assert_eq!((data["a"].as_str(), data["c"].as_str()), ("b", "d"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("default"));

    c.ok(
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "--from-literal=password=hunter2",
        ],
        "secret/creds created",
    )
    .await;
    let secret = Api::<Secret>::default_namespaced(c.client())
        .get("creds")
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(secret.data.unwrap_or_default()["password"].0, b"hunter2");

    c.ok(
        &["create", "serviceaccount", "robot"],
        "serviceaccount/robot created",
    )
    .await;
    Api::<ServiceAccount>::default_namespaced(c.client())
        .get("robot")
        .await
        .unwrap();
    // `kubectl get` of the new objects reads them back (as a Table, in JSON).
    c.ok(&["get", "configmap", "foo"], "foo").await;
}

/// `create service clusterip|nodeport|loadbalancer|externalname`: Go writes `nodePort: 0`
/// and `clusterIP: ""`, which upstream treats as unset (allocate); ExternalName gets no
/// cluster IP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_service_of_all_four_types() {
    let c = cluster().await;
    c.ok(
        &["create", "service", "clusterip", "web", "--tcp=80:8080"],
        "service/web created",
    )
    .await;
    c.ok(
        &["create", "service", "nodeport", "np", "--tcp=80:8080"],
        "service/np created",
    )
    .await;
    c.ok(
        &["create", "service", "loadbalancer", "lb", "--tcp=443:8443"],
        "service/lb created",
    )
    .await;
    c.ok(
        &[
            "create",
            "service",
            "externalname",
            "ext",
            "--external-name=db.example.com",
        ],
        "service/ext created",
    )
    .await;
    let services = Api::<Service>::default_namespaced(c.client());
    let web = services.get("web").await.unwrap().spec.unwrap();
    assert_eq!(web.type_.as_deref(), Some("ClusterIP"));
    assert!(
        web.cluster_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10."))
    );
    let port = &web.ports.unwrap()[0];
    assert_eq!(port.port, 80);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080))
    );
    assert_eq!(port.node_port, None, "a ClusterIP Service has no node port");
    for name in ["np", "lb"] {
        let spec = services.get(name).await.unwrap().spec.unwrap();
        let node_port = spec.ports.unwrap()[0].node_port.unwrap_or(0);
        assert!(
            (30000..=32767).contains(&node_port),
            "{name}: node port {node_port} allocated from the range"
        );
    }
    let ext = services.get("ext").await.unwrap().spec.unwrap();
    assert_eq!(ext.type_.as_deref(), Some("ExternalName"));
    assert_eq!(ext.external_name.as_deref(), Some("db.example.com"));
    assert_eq!(ext.cluster_ip, None);
}

/// `create deployment`, `create job`, `run` and `expose`: pod templates with probes-free
/// containers, `replicas` (a pointer field) kept, the Job's `restartPolicy: Never`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_deployment_job_run_and_expose() {
    let c = cluster().await;
    c.ok(
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx",
            "--replicas=2",
            "--port=80",
        ],
        "deployment.apps/web created",
    )
    .await;
    let deployment = Api::<Deployment>::default_namespaced(c.client())
        .get("web")
        .await
        .unwrap();
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    assert_eq!(spec.selector.match_labels.unwrap_or_default()["app"], "web");
    let container = &spec.template.spec.unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some("nginx"));
    assert_eq!(
        container.image_pull_policy.as_deref(),
        Some("Always"),
        "defaulted for an untagged image, as upstream"
    );

    c.ok(
        &["create", "job", "pi", "--image=perl"],
        "job.batch/pi created",
    )
    .await;
    let job = Api::<Job>::default_namespaced(c.client())
        .get("pi")
        .await
        .unwrap();
    let template = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(template.restart_policy.as_deref(), Some("Never"));

    c.ok(
        &["run", "solo", "--image=nginx", "--port=80"],
        "pod/solo created",
    )
    .await;
    let pod = Api::<Pod>::default_namespaced(c.client())
        .get("solo")
        .await
        .unwrap();
    assert_eq!(
        pod.metadata.labels.unwrap_or_default()["run"],
        "solo",
        "kubectl run labels the pod"
    );

    c.ok(
        &[
            "expose",
            "pod",
            "solo",
            "--port=80",
            "--target-port=80",
            "--name=solo",
        ],
        "service/solo exposed",
    )
    .await;
    let svc = Api::<Service>::default_namespaced(c.client())
        .get("solo")
        .await
        .unwrap();
    assert_eq!(
        svc.spec.unwrap().selector.unwrap_or_default()["run"],
        "solo"
    );
}

/// `kubectl create token` posts a protobuf TokenRequest to `serviceaccounts/NAME/token` and
/// prints the token from the protobuf answer; `kubectl auth can-i` posts a protobuf
/// SelfSubjectAccessReview (upstream's RBAC: the admin may, a user with no bindings may not,
/// until `kubectl create role` and `create rolebinding` grant it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_token_and_auth_can_i() {
    let c = cluster().await;
    c.ok(
        &["create", "serviceaccount", "robot"],
        "serviceaccount/robot created",
    )
    .await;
    let token = c.ok(&["create", "token", "robot"], "").await.stdout;
    let parts: Vec<&str> = token.trim().split('.').collect();
    assert_eq!(parts.len(), 3, "a JWT: {token}");

    c.ok(&["auth", "can-i", "create", "pods"], "yes").await;
    std::fs::write(
        c.dir.path().join("nobody"),
        c.server
            .kubeconfig_for("nobody", &[])
            .expect("a user certificate"),
    )
    .unwrap();
    let no = c
        .kubectl_with("nobody", &["auth", "can-i", "create", "pods"])
        .await;
    assert!(!no.success, "can-i exits 1 for no");
    assert_eq!(no.stdout.trim(), "no", "stderr: {}", no.stderr);

    // `create role` and `create rolebinding` (RBAC objects in protobuf) grant it.
    c.ok(
        &[
            "create",
            "role",
            "pod-reader",
            "--verb=get",
            "--verb=list",
            "--resource=pods",
        ],
        "role.rbac.authorization.k8s.io/pod-reader created",
    )
    .await;
    c.ok(
        &[
            "create",
            "rolebinding",
            "nobody-reads",
            "--role=pod-reader",
            "--user=nobody",
        ],
        "rolebinding.rbac.authorization.k8s.io/nobody-reads created",
    )
    .await;
    let yes = c
        .kubectl_with("nobody", &["auth", "can-i", "list", "pods"])
        .await;
    assert_eq!(yes.stdout.trim(), "yes", "stderr: {}", yes.stderr);
    let still_no = c
        .kubectl_with("nobody", &["auth", "can-i", "delete", "pods"])
        .await;
    assert_eq!(still_no.stdout.trim(), "no", "stderr: {}", still_no.stderr);
}

/// `kubectl get --raw` has no flag for the Accept header, so the same request goes through
/// a raw HTTPS client with the admin kubeconfig: a list with `Accept:
/// application/vnd.kubernetes.protobuf` comes back as a protobuf NamespaceList (upstream
/// serves every built-in list in protobuf).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_raw_with_a_protobuf_accept_over_tls() {
    use k8s_pb::apimachinery::pkg::runtime::Unknown;
    use prost::Message;

    let c = cluster().await;
    c.ok(&["create", "namespace", "shop"], "namespace/shop created")
        .await;
    let config = core_cluster::serve::client_config(&c.server.admin_kubeconfig())
        .await
        .expect("kubeconfig");
    let client = kube::Client::try_from(config).expect("an HTTPS client");
    let request = axum::http::Request::get("/api/v1/namespaces")
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(Vec::new())
        .unwrap();
    let response = client
        .send(request.map(Into::into))
        .await
        .expect("answered");
    assert_eq!(
        response.headers()["content-type"],
        "application/vnd.kubernetes.protobuf"
    );
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..4], b"k8s\0");
    let unknown = Unknown::decode(&body[4..]).unwrap();
    assert_eq!(
        unknown.type_meta.and_then(|t| t.kind).as_deref(),
        Some("NamespaceList")
    );
    let list =
        k8s_pb::api::core::v1::NamespaceList::decode(unknown.raw.unwrap_or_default().as_slice())
            .unwrap();
    let names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|ns| ns.metadata.and_then(|m| m.name))
        .collect();
    assert!(names.contains(&"shop".to_owned()), "{names:?}");
    assert!(names.contains(&"kube-system".to_owned()), "{names:?}");
}
