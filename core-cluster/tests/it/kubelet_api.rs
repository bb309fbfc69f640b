//! The API server → kubelet paths end to end: simulated kubelets serving their HTTPS API
//! (`pkg/kubelet/server/server.go`), the API server's `pods/log` and `nodes/proxy`
//! (`pkg/registry/core/pod/rest/log.go`, `pkg/registry/core/node/rest/proxy.go`) over TLS,
//! driven by kube-rs and by kubectl v1.32.

use std::{
    io::{BufRead, BufReader},
    process::Stdio,
    sync::Arc,
    time::Duration,
};

use ccm_testkit::{TestServer, eventually, free_port, kubectl::require_kubectl};
use core_cluster::{
    ApiServer, ApiServerConfig, KUBELET_CLIENT_USER, KubeletClientConfig,
    auth::pki::{CertAndKey, Pki},
    kubelet_api_admin_binding,
    serve::{Security, ServeOptions},
    sim::{
        KubeletApiConfig, LOG_INTERVAL_ANNOTATION, LOG_TEMPLATE_ANNOTATION, NodeSimulator,
        ServingCa, SimConfig,
    },
    store::MemoryStore,
};
use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::{Node, Pod, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::{LogParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub(crate) struct Cluster {
    pub(crate) server: TestServer,
    pub(crate) client: Client,
    pub(crate) sim: NodeSimulator,
    pub(crate) stop: CancellationToken,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) kubeconfig: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The API server over TLS (dialling kubelets by InternalIP, as kubeadm configures
/// `--kubelet-preferred-address-types`) and a simulator whose nodes serve the kubelet API.
/// As kubeadm sets it up, the API server presents a client certificate of the cluster CA for
/// `kube-apiserver-kubelet-client` (bound to `system:kubelet-api-admin`) and the kubelets
/// trust that CA for client certificates, unless the settings name others.
pub(crate) async fn start(
    kubelet: KubeletClientConfig,
    sim_api: KubeletApiConfig,
    nodes: &[&str],
) -> Cluster {
    start_with(kubelet, sim_api, nodes, true).await
}

/// The API server of `config` over TLS on a memory store, set up for its kubelets as kubeadm
/// does: when `identity` and `config` names no kubelet client certificate, it presents one of
/// the cluster CA for `kube-apiserver-kubelet-client` (bound to `system:kubelet-api-admin`),
/// and `sim_api`'s kubelets trust that CA for client certificates unless they name another.
pub(crate) async fn serve_with_kubelet_identity(
    mut config: ApiServerConfig,
    sim_api: &mut KubeletApiConfig,
    identity: bool,
) -> TestServer {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = Pki::load_or_create(pki_dir.path(), &[]).unwrap();
    if identity && config.kubelet.client_certificate.is_none() {
        let cert = pki.issue_client(KUBELET_CLIENT_USER, &[]).unwrap();
        config.kubelet.client_certificate = Some(cert.cert_pem.clone());
        config.kubelet.client_key = Some(cert.key_pem.clone());
    }
    if sim_api.auth.client_ca.is_none() {
        sim_api.auth.client_ca = Some(pki.ca_pem().to_owned());
    }
    let api = ApiServer::new(Arc::new(MemoryStore::new()), config)
        .await
        .unwrap();
    api.apply_manifest(
        &kubelet_api_admin_binding(KUBELET_CLIENT_USER),
        &["ClusterRoleBinding"],
    )
    .await
    .unwrap();
    let security = Security::from_pki(&api, pki).unwrap();
    TestServer::start_secured(api, security, ServeOptions::default(), pki_dir)
        .await
        .unwrap()
}

/// [`start`], the API server presenting no client certificate unless `identity`.
pub(crate) async fn start_with(
    kubelet: KubeletClientConfig,
    mut sim_api: KubeletApiConfig,
    nodes: &[&str],
    identity: bool,
) -> Cluster {
    let config = ApiServerConfig {
        kubelet,
        ..ApiServerConfig::default()
    };
    let server = serve_with_kubelet_identity(config, &mut sim_api, identity).await;
    let client = server.admin_client().await.unwrap();
    let sim = NodeSimulator::new(client.clone(), SimConfig::default()).with_kubelet_api(sim_api);
    sim.add_nodes(nodes.iter().copied());
    let stop = CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await }
    });
    for node in nodes {
        let api: Api<Node> = Api::all(client.clone());
        eventually(10, "the node advertises its kubelet port", || {
            let api = api.clone();
            async move {
                let n = api.get_opt(node).await.ok()??;
                let port = n.status?.daemon_endpoints?.kubelet_endpoint?.port;
                (port > 0).then_some(())
            }
        })
        .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.admin_kubeconfig()).unwrap();
    Cluster {
        server,
        client,
        sim,
        stop,
        dir,
        kubeconfig,
    }
}

pub(crate) fn internal_ip_first() -> KubeletClientConfig {
    KubeletClientConfig {
        preferred_address_types: vec!["InternalIP".into(), "Hostname".into()],
        timeout: Duration::from_secs(2),
        ..KubeletClientConfig::default()
    }
}

/// A kubeconfig file for `user` (no groups), bound in `default` to a new Role `role` that
/// allows `verbs` on the core group's `resources`.
pub(crate) async fn user_with_role(
    c: &Cluster,
    user: &str,
    role: &str,
    resources: &[&str],
    verbs: &[&str],
) -> std::path::PathBuf {
    let path = c.dir.path().join(user);
    std::fs::write(&path, c.server.kubeconfig_for(user, &[]).unwrap()).unwrap();
    let role_object: Role = serde_json::from_value(json!({
        "metadata": {"name": role, "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": resources, "verbs": verbs}]}))
    .unwrap();
    Api::<Role>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &role_object)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": [{"kind": "User", "name": user}]}))
    .unwrap();
    Api::<RoleBinding>::namespaced(c.client.clone(), "default")
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    path
}

/// Creates a pod bound to `node` writing `tick {n}` every 100 ms, and waits until it runs.
pub(crate) async fn running_pod(client: &Client, name: &str, node: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            LOG_TEMPLATE_ANNOTATION: "tick {n} from {pod} on {node}",
            LOG_INTERVAL_ANNOTATION: "100ms",
        }},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "nginx",
            "env": [{"name": "GREETING", "value": "hello"}]}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually(10, "the pod runs", || {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
}

async fn log_error(client: &Client, pod: &str, params: &LogParams) -> kube::core::Status {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    match pods.logs(pod, params).await {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// `LogREST.Get` through `LogLocation`: the log of the node the pod is bound to, with
/// `tailLines`, `timestamps` and `limitBytes` handed on to its kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_log_comes_from_the_kubelet_of_its_node() {
    let c = start(
        internal_ip_first(),
        KubeletApiConfig::default(),
        &["kl-a", "kl-b"],
    )
    .await;
    running_pod(&c.client, "web-b", "kl-b").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let log = pods.logs("web-b", &LogParams::default()).await.unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert!(
        lines[0].starts_with("Started container app (image nginx) in pod web-b"),
        "{log}"
    );
    assert_eq!(lines[1], "tick 1 from web-b on kl-b", "{log}");
    let tail = pods
        .logs(
            "web-b",
            &LogParams {
                tail_lines: Some(1),
                timestamps: true,
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(tail.lines().count(), 1, "{tail}");
    let (stamp, text) = tail.trim_end().split_once(' ').unwrap();
    assert!(stamp.parse::<jiff::Timestamp>().is_ok(), "{tail}");
    assert!(text.starts_with("tick "), "{tail}");
    let limited = pods
        .logs(
            "web-b",
            &LogParams {
                limit_bytes: Some(7),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(limited, "Started");
    // The kubelet API of each node is its own server on its own address.
    let (a, b) = (
        c.sim.kubelet_endpoint("kl-a").unwrap(),
        c.sim.kubelet_endpoint("kl-b").unwrap(),
    );
    assert_ne!(a.ip(), b.ip());
}

/// `strategy.go validateContainer` and kubelet's `validateContainerLogStatus`: upstream's
/// 400 messages; `ValidatePodLogOptions`: 422; an unbound pod has an empty log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_log_requests_get_upstreams_errors() {
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["kl-e"]).await;
    running_pod(&c.client, "web", "kl-e").await;
    let s = log_error(
        &c.client,
        "web",
        &LogParams {
            container: Some("nope".into()),
            ..LogParams::default()
        },
    )
    .await;
    assert_eq!(
        (s.code, s.message.as_str()),
        (400, "container nope is not valid for pod web")
    );
    let s = log_error(
        &c.client,
        "web",
        &LogParams {
            previous: true,
            ..LogParams::default()
        },
    )
    .await;
    assert_eq!(s.code, 400);
    assert_eq!(
        s.message,
        "previous terminated container \"app\" in pod \"web\" not found"
    );
    let s = log_error(
        &c.client,
        "web",
        &LogParams {
            since_seconds: Some(-1),
            ..LogParams::default()
        },
    )
    .await;
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    // Not bound yet: `LogLocation` has no location, the log is empty.
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    let pending: Pod = serde_json::from_value(
        json!({"metadata": {"name": "pending"}, "spec": {"containers": [{"name": "app", "image": "x"}]}}),
    )
    .unwrap();
    pods.create(&PostParams::default(), &pending).await.unwrap();
    assert_eq!(
        pods.logs("pending", &LogParams::default()).await.unwrap(),
        ""
    );
    let s = log_error(&c.client, "absent", &LogParams::default()).await;
    assert_eq!(s.code, 404);
}

/// A node whose kubelet refuses connections, or accepts and never answers, costs a 5xx
/// within `--kubelet-timeout`, never a hang; a node with no address of a preferred type is
/// refused with `GetPreferredNodeAddress`'s message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_kubelet_is_a_server_error_within_the_kubelet_timeout() {
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &[]).await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), "default");
    // Accepts TCP connections (the backlog) and never speaks TLS.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let cases = [
        (
            "refusing",
            json!([{"type": "InternalIP", "address": "127.0.0.1"}]),
            free_port(),
        ),
        (
            "silent",
            json!([{"type": "InternalIP", "address": "127.0.0.1"}]),
            silent_port,
        ),
        (
            "addressless",
            json!([{"type": "ExternalIP", "address": "192.0.2.1"}]),
            10250,
        ),
    ];
    for (name, addresses, port) in cases {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
        let status = json!({"status": {"addresses": addresses,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": name, "containers": [{"name": "app", "image": "x"}]}}))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let started = tokio::time::Instant::now();
        let s = log_error(&c.client, name, &LogParams::default()).await;
        let took = started.elapsed();
        assert!(s.code >= 500, "{name}: {s:?}");
        assert!(took < Duration::from_secs(4), "{name}: took {took:?}");
        match name {
            "refusing" => assert!(s.message.contains("dial tcp 127.0.0.1:"), "{s:?}"),
            "silent" => assert!(s.message.contains("Timeout exceeded"), "{s:?}"),
            _ => assert_eq!(
                s.message,
                "no preferred addresses found; known addresses: [{ExternalIP 192.0.2.1}]"
            ),
        }
    }
    drop(silent);
}

/// `--kubelet-certificate-authority`: a kubelet whose serving certificate that CA issued
/// is reached; one presenting another certificate is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_are_verified_against_the_kubelet_certificate_authority() {
    let ca = ServingCa::generate("kubelet-serving-ca").unwrap();
    let mut kubelet = internal_ip_first();
    kubelet.certificate_authority = Some(ca.cert_pem.clone());
    let trusted = start(
        kubelet.clone(),
        KubeletApiConfig {
            serving_ca: Some(ca),
            ..KubeletApiConfig::default()
        },
        &["kl-ca"],
    )
    .await;
    running_pod(&trusted.client, "web", "kl-ca").await;
    let pods: Api<Pod> = Api::namespaced(trusted.client.clone(), "default");
    let log = pods.logs("web", &LogParams::default()).await.unwrap();
    assert!(log.starts_with("Started container app"), "{log}");

    // Self-signed kubelets (no serving CA) are not trusted by that CA.
    let untrusted = start(kubelet, KubeletApiConfig::default(), &["kl-self"]).await;
    running_pod(&untrusted.client, "web", "kl-self").await;
    let s = log_error(&untrusted.client, "web", &LogParams::default()).await;
    assert_eq!(s.code, 500, "{s:?}");
    assert!(s.message.contains("failed to verify certificate"), "{s:?}");
}

/// `nodes/{name}/proxy/healthz` reaches the node's kubelet (`kubectl get --raw`); a path
/// that would leave the kubelet's tree or a port that is not the kubelet's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_proxy_reaches_the_nodes_kubelet_and_nothing_else() {
    require_kubectl("it runs `kubectl get --raw /api/v1/nodes/N/proxy/healthz`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["kl-p"]).await;
    let out = ccm_testkit::kubectl::kubectl(
        c.dir.path(),
        &c.kubeconfig,
        &["get", "--raw", "/api/v1/nodes/kl-p/proxy/healthz"],
    )
    .await;
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout, "ok");
    let pods = ccm_testkit::kubectl::kubectl(
        c.dir.path(),
        &c.kubeconfig,
        &["get", "--raw", "/api/v1/nodes/kl-p/proxy/pods"],
    )
    .await;
    assert!(pods.stdout.contains("\"kind\":\"PodList\""), "{pods:?}");
    for path in [
        "/api/v1/nodes/kl-p/proxy/..%2f..%2fapi",
        "/api/v1/nodes/kl-p/proxy/%2e%2e/x",
        "/api/v1/nodes/kl-p:1/proxy/healthz",
        "/api/v1/nodes/http:kl-p:1/proxy/healthz",
    ] {
        let request = axum::http::Request::get(path).body(Vec::new()).unwrap();
        match c.client.request_text(request).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 400, "{path}: {s:?}"),
            other => panic!("{path}: {other:?}"),
        }
    }
}

/// kubectl v1.32 `logs`, `logs -f` (a follower sees each new line as it is written) and
/// RBAC on `get pods/log` (`plugin/pkg/auth/authorizer/rbac`): reading the pod is not
/// enough. A follower that goes away frees its stream on the kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_and_logs_follow_work_and_need_get_pods_log() {
    require_kubectl("it runs `kubectl logs` and `kubectl logs -f`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["kl-k"]).await;
    running_pod(&c.client, "web", "kl-k").await;
    let out =
        ccm_testkit::kubectl::kubectl(c.dir.path(), &c.kubeconfig, &["logs", "web", "--tail=2"])
            .await;
    assert!(out.success, "{out:?}");
    assert_eq!(out.stdout.lines().count(), 2, "{out:?}");

    // logs -f: lines arrive as they are written, the stream stays open.
    let mut child = ccm_testkit::kubectl::command(c.dir.path(), &c.kubeconfig)
        .args(["logs", "-f", "web", "--tail=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(4)
            .collect::<Result<Vec<String>, _>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(10), lines)
        .await
        .expect("logs -f shows new lines")
        .unwrap()
        .unwrap();
    let numbers: Vec<u64> = lines
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{lines:?}");
    assert_eq!(c.sim.open_log_streams(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    eventually(10, "the kubelet frees the follower's stream", || async {
        (c.sim.open_log_streams() == 0).then_some(())
    })
    .await;

    // RBAC: get pods without get pods/log is refused.
    let alice = c.server.kubeconfig_for("alice", &[]).unwrap();
    let alice_path = c.dir.path().join("alice");
    std::fs::write(&alice_path, alice).unwrap();
    let rbac = |rules: serde_json::Value| {
        json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "reader", "namespace": "default"}, "rules": rules})
    };
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(c.client.clone(), "default");
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(rbac(
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]),
    ))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(c.client.clone(), "default");
    let binding = serde_json::from_value(json!({"metadata": {"name": "alice"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "User", "name": "alice"}]}))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let refused = ccm_testkit::kubectl::kubectl(c.dir.path(), &alice_path, &["logs", "web"]).await;
    assert!(!refused.success, "{refused:?}");
    assert!(
        refused.stderr.contains(
            "cannot get resource \"pods/log\" in API group \"\" in the namespace \"default\""
        ),
        "{refused:?}"
    );
    let role: k8s_openapi::api::rbac::v1::Role = serde_json::from_value(rbac(json!([
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}
    ])))
    .unwrap();
    roles
        .replace("reader", &PostParams::default(), &role)
        .await
        .unwrap();
    let allowed = eventually(10, "alice may read the log", || {
        let (dir, path) = (c.dir.path().to_owned(), alice_path.clone());
        async move {
            let out = ccm_testkit::kubectl::kubectl(&dir, &path, &["logs", "web"]).await;
            out.success.then_some(out)
        }
    })
    .await;
    assert!(
        allowed.stdout.starts_with("Started container app"),
        "{allowed:?}"
    );
}

/// Runs kubectl with `args`, `stdin` fed to it; (exit code, stdout, stderr). A kubectl
/// still running after 60 s fails the test.
pub(crate) async fn kubectl_with_input(
    c: &Cluster,
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    let mut command = ccm_testkit::kubectl::command(c.dir.path(), kubeconfig);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let input = stdin.to_owned();
    let run = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = command.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input.as_bytes()).unwrap();
        drop(pipe);
        let out = child.wait_with_output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    });
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("kubectl ends")
        .unwrap()
}

/// kubectl v1.32 `exec` over WebSocket (`v5.channel.k8s.io`, client-go's
/// `tools/remotecommand/websocket.go`, the API server splicing the upgrade to the kubelet as
/// `UpgradeAwareHandler`): the built-in commands see the pod's hostname, files and
/// environment, stdin reaches the command, exit codes come back through the status channel
/// (`NonZeroExitCode`), and the WebSocket GET needs `create pods/exec`
/// (`requestinfo.go`, AuthorizePodWebsocketUpgradeCreatePermission).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_runs_built_in_commands_over_websocket() {
    require_kubectl("it runs `kubectl exec`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["kl-x"]).await;
    running_pod(&c.client, "web", "kl-x").await;
    let admin = c.kubeconfig.clone();
    let run = |args: &'static [&'static str], input: &'static str| {
        let (c, admin) = (&c, admin.clone());
        async move { kubectl_with_input(c, &admin, args, input).await }
    };
    assert_eq!(
        run(&["exec", "web", "--", "hostname"], "").await,
        (0, "web\n".into(), String::new())
    );
    let (code, out, _) = run(&["exec", "web", "--", "cat", "/etc/hostname"], "").await;
    assert_eq!((code, out.as_str()), (0, "web\n"));
    let (code, out, _) = run(&["exec", "web", "--", "env"], "").await;
    assert_eq!(code, 0);
    assert!(
        out.contains("GREETING=hello\n") && out.contains("HOSTNAME=web\n"),
        "{out}"
    );
    let (code, out, err) = run(
        &["exec", "web", "--", "sh", "-c", "echo hi $GREETING; exit 3"],
        "",
    )
    .await;
    assert_eq!((code, out.as_str()), (3, "hi hello\n"), "{err}");
    assert!(err.contains("command terminated with exit code 3"), "{err}");
    let (code, out, err) = run(&["exec", "-i", "web", "--", "cat"], "typed in\n").await;
    assert_eq!((code, out.as_str()), (0, "typed in\n"), "{err}");
    let (code, _, err) = run(&["exec", "web", "--", "cat", "/nope"], "").await;
    assert_eq!(code, 1);
    assert!(
        err.contains("cat: /nope: No such file or directory"),
        "{err}"
    );
    let (code, _, err) = run(&["exec", "web", "-c", "nope", "--", "hostname"], "").await;
    assert_ne!(code, 0);
    assert!(
        err.contains("container nope is not valid for pod web"),
        "{err}"
    );

    // RBAC: `get pods/exec` is not enough for the WebSocket GET.
    let bob_path = user_with_role(&c, "bob", "exec-get", &["pods", "pods/exec"], &["get"]).await;
    let (code, _, err) =
        kubectl_with_input(&c, &bob_path, &["exec", "web", "--", "hostname"], "").await;
    assert_ne!(code, 0);
    assert!(
        err.contains("cannot create resource \"pods/exec\""),
        "{err}"
    );
}

/// One HTTP/1.1 request straight to a kubelet at `addr`, its serving certificate verified
/// against `serving_ca`, presenting `client` and `token` when given: (status, body).
pub(crate) async fn kubelet_request(
    addr: std::net::SocketAddr,
    serving_ca: &str,
    client: Option<&CertAndKey>,
    token: Option<&str>,
    method: &str,
    path: &str,
) -> (u16, String) {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_slice_iter(serving_ca.as_bytes()) {
        roots.add(der.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some(c) => builder
            .with_client_auth_cert(c.cert_der().unwrap(), c.key_der().unwrap())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    head.push_str("Content-Length: 0\r\n\r\n");
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}

/// A token of the service account `default/<name>` (created), from a TokenRequest.
pub(crate) async fn service_account_token(client: &Client, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

/// Binds a new ClusterRole allowing `verbs` on the `nodes` subresource `resource` to
/// `subject` (a `User` or a `ServiceAccount` of `default`).
pub(crate) async fn grant_nodes(
    client: &Client,
    name: &str,
    resource: &str,
    verbs: &[&str],
    subject: serde_json::Value,
) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let role: ClusterRole = serde_json::from_value(json!({"metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": [resource], "verbs": verbs}]}))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject]}))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// kubelet's `InstallAuthFilter` (`pkg/kubelet/server/server.go`) with
/// `--anonymous-auth=false --authorization-mode=Webhook --client-ca-file`: a request
/// without credentials is a 401; a bearer token is reviewed by TokenReview and a client
/// certificate verified against the client CA; each request is then a SubjectAccessReview
/// on `nodes/<subresource>` of the node (`auth.go GetRequestAttributes`: `/stats` → stats,
/// everything else → proxy; the verb from the method), a denial being a 403 with kubelet's
/// text; the answers are cached (`webhook.cacheTTL`, `cacheAuthorizedTTL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_authenticates_and_authorizes_every_request_by_webhook() {
    let ca = ServingCa::generate("kubelet-serving-ca").unwrap();
    let c = start(
        internal_ip_first(),
        KubeletApiConfig {
            serving_ca: Some(ca.clone()),
            ..KubeletApiConfig::default()
        },
        &["kl-auth"],
    )
    .await;
    let addr = c.sim.kubelet_endpoint("kl-auth").unwrap();
    let get = |cert: Option<CertAndKey>, tok: Option<String>, method, path| {
        let ca = ca.cert_pem.clone();
        async move { kubelet_request(addr, &ca, cert.as_ref(), tok.as_deref(), method, path).await }
    };

    // No credentials, or a token that does not authenticate: 401.
    assert_eq!(
        get(None, None, "GET", "/healthz").await,
        (401, "Unauthorized".into())
    );
    assert_eq!(
        get(None, Some("not-a-token".into()), "GET", "/pods").await,
        (401, "Unauthorized".into())
    );

    // A service account's token authenticates, but it may not use the node: 403.
    let viewer = service_account_token(&c.client, "viewer").await;
    let forbidden = |verb: &str, sub: &str| {
        format!(
            "Forbidden (user=system:serviceaccount:default:viewer, verb={verb}, \
             resource=nodes, subresource={sub})"
        )
    };
    assert_eq!(
        get(None, Some(viewer.clone()), "GET", "/healthz").await,
        (403, forbidden("get", "proxy"))
    );
    assert_eq!(
        get(None, Some(viewer.clone()), "GET", "/stats/summary").await,
        (403, forbidden("get", "stats"))
    );
    assert_eq!(
        get(None, Some(viewer.clone()), "POST", "/exec/default/x/y").await,
        (403, forbidden("create", "proxy"))
    );

    // A user of the client CA with `get nodes/proxy` reaches the kubelet directly, for
    // `get` only.
    let carol = c.server.security().pki.issue_client("carol", &[]).unwrap();
    grant_nodes(
        &c.client,
        "carol-nodes-proxy",
        "nodes/proxy",
        &["get"],
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}),
    )
    .await;
    assert_eq!(
        get(Some(carol.clone()), None, "GET", "/healthz").await,
        (200, "ok".into())
    );
    let (code, body) = get(Some(carol.clone()), None, "POST", "/healthz").await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("user=carol, verb=create"), "{body}");

    // A token allowed `get nodes/proxy`: the TokenReview and the SubjectAccessReview are
    // made once, then answered from the kubelet's caches.
    let prober = service_account_token(&c.client, "prober").await;
    grant_nodes(
        &c.client,
        "prober-nodes-proxy",
        "nodes/proxy",
        &["get"],
        json!({"kind": "ServiceAccount", "name": "prober", "namespace": "default"}),
    )
    .await;
    let before = c.sim.kubelet_reviews("kl-auth").unwrap();
    for _ in 0..3 {
        assert_eq!(
            get(None, Some(prober.clone()), "GET", "/healthz").await,
            (200, "ok".into())
        );
    }
    assert_eq!(c.sim.kubelet_reviews("kl-auth").unwrap() - before, 2);

    // The API server's own path, with its kubelet client certificate, still works.
    let out = ccm_testkit::kubectl::kubectl(
        c.dir.path(),
        &c.kubeconfig,
        &["get", "--raw", "/api/v1/nodes/kl-auth/proxy/healthz"],
    )
    .await;
    assert_eq!(out.stdout, "ok", "{out:?}");
}

/// `--kubelet-client-certificate` is how the API server authenticates to kubelets that,
/// as upstream's defaults, take no anonymous requests: without it, the kubelet's 401
/// comes back through `nodes/proxy` and `pods/log` (`GenericHttpResponseChecker`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_without_a_kubelet_client_certificate_is_refused_by_the_kubelet() {
    let c = start_with(
        internal_ip_first(),
        KubeletApiConfig::default(),
        &["kl-noid"],
        false,
    )
    .await;
    let request = axum::http::Request::get("/api/v1/nodes/kl-noid/proxy/healthz")
        .body(Vec::new())
        .unwrap();
    match c.client.request_text(request).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 401, "{s:?}"),
        other => panic!("{other:?}"),
    }
    running_pod(&c.client, "web", "kl-noid").await;
    let s = log_error(&c.client, "web", &LogParams::default()).await;
    assert_eq!(s.code, 401, "{s:?}");
}

/// kubectl v1.32 `attach` (`staging/src/k8s.io/kubectl/pkg/cmd/attach`, the API server's
/// `AttachLocation` and kubelet's `getAttach`, over WebSocket `v5.channel.k8s.io`): with
/// `-i` what is typed reaches the container's main process, which echoes it; without, the
/// process's output from now on (its log lines as written) streams until the client
/// detaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_attach_joins_the_containers_main_process() {
    require_kubectl("it runs `kubectl attach`");
    let c = start(internal_ip_first(), KubeletApiConfig::default(), &["kl-at"]).await;
    running_pod(&c.client, "web", "kl-at").await;
    let (code, out, err) = kubectl_with_input(
        &c,
        &c.kubeconfig,
        &["attach", "-i", "web", "-c", "app"],
        "hello\nworld\n",
    )
    .await;
    assert_eq!((code, out.as_str()), (0, "hello\nworld\n"), "{err}");

    let mut child = ccm_testkit::kubectl::command(c.dir.path(), &c.kubeconfig)
        .args(["attach", "web"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .take(2)
            .collect::<Result<Vec<String>, _>>()
    });
    let lines = tokio::time::timeout(Duration::from_secs(20), lines)
        .await
        .expect("attach shows the process's output")
        .unwrap()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    for line in &lines {
        assert!(
            line.starts_with("tick ") && line.ends_with(" from web on kl-at"),
            "{lines:?}"
        );
    }
    eventually(10, "the kubelet frees the attached output", || async {
        (c.sim.open_log_streams() == 0).then_some(())
    })
    .await;
}
