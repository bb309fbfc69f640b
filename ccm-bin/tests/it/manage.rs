//! `ccm` managing a cluster it did not start: `ccm apiserver` runs as its own process, the
//! test plays kube-controller-manager and kubelet with kubectl, and `ccm --kubeconfig`
//! initializes the Nodes and ensures load balancers with the fake provider, serves its
//! health and metrics endpoints, and stops cleanly on SIGTERM. Bad input (flags upstream's
//! `k8s.io/cloud-provider/options` `Validate` refuses) gets a clear message and exit code 1.

use std::{
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use ccm_testkit::free_port;

use crate::support::{ApiServerProcess, https_get, require_kubectl, wait_until};

const CLOUD: &str = r#"
region = "test-region"

[[instances]]
id = "i-a"
name = "node-a"
zone = "test-zone-a"
instance_type = "t.small"
internal_ips = ["10.1.0.10"]

[[instances]]
id = "i-b"
name = "node-b"
zone = "test-zone-b"
instance_type = "t.large"
internal_ips = ["10.1.0.11"]
"#;

/// A Node as kubelet with `--cloud-provider=external` registers it.
fn node_manifest(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: {name}
spec:
  taints:
  - key: node.cloudprovider.kubernetes.io/uninitialized
    value: "true"
    effect: NoSchedule
"#
    )
}

const LB_SERVICE: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: default
spec:
  type: LoadBalancer
  selector: {app: web}
  ports:
  - port: 80
    targetPort: 8080
"#;

fn ccm(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ccm"));
    cmd.args(args);
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run ccm")
}

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// The cloud-node and service controllers through the binary: providerID, labels and addresses from
/// the cloud, the taint removed, an LB for the Service; `/healthz` names the controllers,
/// `/metrics` is Prometheus text, read with the admin's client certificate, which the ccm
/// verifies against the CA `ccm apiserver` publishes in
/// `kube-system/extension-apiserver-authentication` (no `--client-ca-file`); SIGTERM ends
/// the process with exit code 0.
#[test]
fn ccm_with_a_kubeconfig_manages_that_cluster() {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    for name in ["node-a", "node-b"] {
        let out = server.kubectl_stdin(&["apply", "-f", "-"], &node_manifest(name));
        assert!(out.status.success(), "{out:?}");
    }
    let cloud = write(dir.path(), "cloud.toml", CLOUD);
    let port = free_port();
    let kubeconfig = server.kubeconfig();
    let manager = Manager(
        ccm(&[
            "--cloud-provider",
            "fake",
            "--cloud-config",
            &cloud,
            "--cluster-cidr",
            "10.244.0.0/16",
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &port.to_string(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let initialized = wait_until(Duration::from_secs(30), || {
        let ids =
            server.kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"]);
        ids == "fake://i-a fake://i-b"
    });
    assert!(
        initialized,
        "{}",
        server.kubectl_ok(&["get", "nodes", "-o", "yaml"])
    );
    let node = server.kubectl_ok(&["get", "node", "node-b", "-o", "json"]);
    for expected in [
        "\"topology.kubernetes.io/zone\": \"test-zone-b\"",
        "\"topology.kubernetes.io/region\": \"test-region\"",
        "\"node.kubernetes.io/instance-type\": \"t.large\"",
        "\"address\": \"10.1.0.11\"",
    ] {
        assert!(node.contains(expected), "{expected} in {node}");
    }
    let taints = server.kubectl_ok(&["get", "node", "node-b", "-o", "jsonpath={.spec.taints}"]);
    assert!(
        !taints.contains("node.cloudprovider.kubernetes.io/uninitialized"),
        "{taints}"
    );

    let out = server.kubectl_stdin(&["apply", "-f", "-"], LB_SERVICE);
    assert!(out.status.success(), "{out:?}");
    let ensured = wait_until(Duration::from_secs(30), || {
        !server
            .kubectl_ok(&[
                "get",
                "service",
                "web",
                "-o",
                "jsonpath={.status.loadBalancer.ingress[0].ip}",
            ])
            .is_empty()
    });
    assert!(
        ensured,
        "{}",
        server.kubectl_ok(&["get", "service", "web", "-o", "yaml"])
    );

    let (code, healthz) = https_get(port, "/healthz?verbose", &kubeconfig).unwrap_or_default();
    assert_eq!(code, 200, "{healthz}");
    for check in [
        "leaderElection",
        "cloud-node-controller",
        "service-lb-controller",
        "node-route-controller",
    ] {
        assert!(healthz.contains(check), "{check} in {healthz}");
    }
    let (code, metrics) = https_get(port, "/metrics", &kubeconfig).unwrap_or_default();
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains("running_managed_controllers{"),
        "{metrics}"
    );
    let lease = server.kubectl_ok(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "cloud-controller-manager",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(!lease.is_empty(), "the ccm holds the leader Lease");

    let mut manager = manager;
    let pid = manager.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut status = None;
    wait_until(Duration::from_secs(15), || {
        status = manager.0.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "SIGTERM stops cleanly"
    );
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Bad input against a cluster: each gets a clear message and exit code 1 before anything
/// runs, never a hang or a crash loop of half-started controllers.
#[test]
fn bad_input_against_a_cluster_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // A kubeconfig whose server nobody listens on.
    let port = free_port();
    let kubeconfig = write(
        dir.path(),
        "kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:{port}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    );
    let cloud = write(dir.path(), "cloud.toml", CLOUD);
    let base = |extra: &[&str]| {
        let mut args = vec!["--kubeconfig", kubeconfig.as_str(), "--secure-port", "0"];
        args.extend_from_slice(extra);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (base(&[]), "--cloud-provider cannot be empty"),
        (
            base(&["--cloud-provider", "nope"]),
            "unknown cloud provider \"nope\"; registered providers:",
        ),
        (
            base(&[
                "--cloud-provider",
                "fake",
                "--cloud-config",
                "/nonexistent/cloud.toml",
            ]),
            "could not read cloud config /nonexistent/cloud.toml",
        ),
        (
            base(&["--cloud-provider", "fake", "--cluster-cidr", "10.0.0.0/33"]),
            "--cluster-cidr: \"10.0.0.0/33\" is not a CIDR",
        ),
        (
            base(&["--cloud-provider", "fake", "--concurrent-node-syncs", "0"]),
            "--concurrent-node-syncs must be at least 1",
        ),
        (
            base(&["--cloud-provider", "fake", "--sim-nodes", "3"]),
            "--sim-nodes only apply to the embedded cluster",
        ),
        (
            base(&[
                "--cloud-provider",
                "fake",
                "--cloud-config",
                &cloud,
                "--cluster-cidr",
                "10.244.0.0/16",
            ]),
            "the API server did not answer within 10s",
        ),
    ];
    for (args, expected) in cases {
        let out = run(ccm(&[]).args(&args));
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(expected),
            "{args:?}: {expected:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
