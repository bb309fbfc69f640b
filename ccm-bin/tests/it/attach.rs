//! core-cluster's control plane in pieces, each attached by kubeconfig to an API server it
//! did not start, as kube-controller-manager, kube-scheduler and kwok attach: `ccm apiserver
//! --in-memory` alone (no controllers), then `ccm controller-manager`, `ccm node-simulator`
//! and `ccm --kubeconfig --cloud-provider fake` as separate processes. Together they make
//! the cluster the embedded default is: nodes registered, initialized by the cloud and
//! Ready, a Deployment's pods Running, a load balancer's ingress IP, namespaces deleted. Bad
//! flags of the new subcommands get a clear message, not a panic.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use crate::support::{ApiServerProcess, require_kubectl, wait_until};

/// The fake cloud of `ccm node-simulator --sim-nodes 2 --sim-zones zone-a,zone-b`: an
/// instance named as each simulated node, with the address the simulator gives it
/// (10.0.0.1 onwards, as `--write-fake-cloud-config` writes it), which the node announces as
/// its provided node IP.
const CLOUD: &str = r#"
region = "test-region"

[[instances]]
id = "i-0"
name = "sim-node-0"
zone = "zone-a"
instance_type = "t.small"
internal_ips = ["10.0.0.1"]

[[instances]]
id = "i-1"
name = "sim-node-1"
zone = "zone-b"
instance_type = "t.small"
internal_ips = ["10.0.0.2"]
"#;

const DEPLOYMENT: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: nginx}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  selector: {app: web}
  ports: [{port: 80, targetPort: 80}]
"#;

/// A `ccm` process with its stderr in a log file, killed on drop.
struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    fn start(dir: &Path, name: &str, args: &[&str]) -> Process {
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start ccm {name}: {e}"));
        Process { child, log }
    }

    /// The log so far, and whether the process has exited.
    fn report(&mut self) -> String {
        let exited = self.child.try_wait().ok().flatten();
        format!(
            "--- {} ({}):\n{}",
            self.log.display(),
            exited.map_or("running".to_owned(), |s| format!("exited: {s}")),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The three processes against one `ccm apiserver --in-memory`: the nodes registered by the
/// simulator, initialized by the ccm (providerID from the cloud config, the uninitialized
/// taint gone), Ready and given pod CIDRs by the controllers; a Deployment's pods scheduled
/// and Running; a LoadBalancer Service's ingress IP from the fake cloud; a namespace with
/// objects in it deleted; the Leases kube-controller-manager and kube-scheduler lead by held.
#[test]
fn controller_manager_node_simulator_and_ccm_attach_by_kubeconfig() {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start_in_memory(dir.path(), &[]);
    let kubeconfig = server.kubeconfig();
    let kubeconfig = kubeconfig.to_str().unwrap();
    let cloud = dir.path().join("cloud.toml");
    std::fs::write(&cloud, CLOUD).unwrap();
    let mut processes = [
        Process::start(
            dir.path(),
            "controller-manager",
            &[
                "controller-manager",
                "--kubeconfig",
                kubeconfig,
                "--cluster-cidr",
                "10.244.0.0/16",
                "--allocate-node-cidrs",
                "--node-monitor-period",
                "1s",
                "--node-monitor-grace-period",
                "20s",
            ],
        ),
        Process::start(
            dir.path(),
            "node-simulator",
            &[
                "node-simulator",
                "--kubeconfig",
                kubeconfig,
                "--sim-nodes",
                "2",
                "--sim-zones",
                "zone-a,zone-b",
                "--sim-node-lease-duration",
                "8s",
                "--sim-node-status-update-frequency",
                "1s",
            ],
        ),
        Process::start(
            dir.path(),
            "ccm",
            &[
                "--kubeconfig",
                kubeconfig,
                "--cloud-provider",
                "fake",
                "--cloud-config",
                cloud.to_str().unwrap(),
                // The route controller runs (upstream's default --configure-cloud-routes)
                // and needs the pods' range, as upstream's does.
                "--cluster-cidr",
                "10.244.0.0/16",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                "0",
            ],
        ),
    ];
    let mut logs = || {
        processes
            .iter_mut()
            .map(Process::report)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let jsonpath = |args: &[&str]| server.kubectl_ok(args);

    let initialized = wait_until(Duration::from_secs(60), || {
        let ids = jsonpath(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"]);
        let ready = jsonpath(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        let taints = jsonpath(&["get", "nodes", "-o", "jsonpath={.items[*].spec.taints}"]);
        let cidrs = jsonpath(&["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"]);
        ids == "fake://i-0 fake://i-1"
            && ready == "True True"
            && !taints.contains("node.cloudprovider.kubernetes.io/uninitialized")
            && cidrs
                .split(' ')
                .filter(|c| c.starts_with("10.244."))
                .count()
                == 2
    });
    assert!(
        initialized,
        "{}\n{}",
        server.kubectl_ok(&["get", "nodes", "-o", "yaml"]),
        logs()
    );
    let zone = jsonpath(&[
        "get",
        "node",
        "sim-node-1",
        "-o",
        "jsonpath={.metadata.labels.topology\\.kubernetes\\.io/region}",
    ]);
    assert_eq!(
        zone, "test-region",
        "the ccm labelled the node from the cloud"
    );

    let out = server.kubectl_stdin(&["apply", "-f", "-"], DEPLOYMENT);
    assert!(out.status.success(), "{out:?}");
    let running = wait_until(Duration::from_secs(60), || {
        let phases = jsonpath(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ]);
        phases == "Running Running"
    });
    assert!(
        running,
        "{}\n{}",
        server.kubectl_ok(&["get", "pods", "-o", "wide"]),
        logs()
    );
    let ingress = wait_until(Duration::from_secs(60), || {
        !jsonpath(&[
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].ip}",
        ])
        .is_empty()
    });
    assert!(
        ingress,
        "{}\n{}",
        server.kubectl_ok(&["get", "service", "web", "-o", "yaml"]),
        logs()
    );
    // The endpoints controllers saw the pods Ready.
    let endpoints = wait_until(Duration::from_secs(30), || {
        jsonpath(&[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[0]}",
        ])
        .split(' ')
        .filter(|a| !a.is_empty())
        .count()
            == 2
    });
    assert!(endpoints, "{}", logs());

    server.kubectl_ok(&["create", "namespace", "doomed"]);
    server.kubectl_ok(&[
        "create",
        "deployment",
        "doomed",
        "-n",
        "doomed",
        "--image=nginx",
    ]);
    server.kubectl_ok(&["delete", "namespace", "doomed", "--wait=false"]);
    let deleted = wait_until(Duration::from_secs(60), || {
        let out = server.kubectl(&["get", "namespace", "doomed"]);
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("NotFound")
    });
    assert!(
        deleted,
        "{}\n{}",
        server.kubectl_ok(&["get", "namespace", "doomed", "-o", "yaml"]),
        logs()
    );

    let holder_of = |lease: &str| {
        jsonpath(&[
            "get",
            "lease",
            "-n",
            "kube-system",
            lease,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
    };
    for lease in ["kube-controller-manager", "kube-scheduler"] {
        assert!(!holder_of(lease).is_empty(), "{lease} is held");
    }

    // SIGTERM stops the controller-manager cleanly, and it hands both Leases back
    // (client-go's ReleaseOnCancel): an empty holder, for another one to take at once.
    let controller_manager = &mut processes[0];
    let pid = controller_manager.child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status();
    assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
    let mut status = None;
    let stopped = wait_until(Duration::from_secs(20), || {
        status = controller_manager.child.try_wait().unwrap();
        status.is_some()
    });
    assert!(stopped && status.is_some_and(|s| s.success()), "{status:?}");
    for lease in ["kube-controller-manager", "kube-scheduler"] {
        let holder = holder_of(lease);
        assert!(holder.is_empty(), "{lease} released, held by {holder:?}");
    }
}

fn ccm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args(args)
        .output()
        .expect("run ccm")
}

/// Bad flags of `ccm controller-manager` and `ccm node-simulator` stop them at once with a
/// message naming the flag (exit code 1, or clap's 2 for what it refuses itself), never a
/// panic, and before any cluster is dialled.
#[test]
fn bad_flags_of_the_attached_subcommands_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.kubeconfig");
    let missing = missing.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["controller-manager", "--node-monitor-period", "0s"],
            "--node-monitor-period must be greater than 0",
        ),
        (
            &["controller-manager", "--node-monitor-grace-period", "1s"],
            "--node-monitor-grace-period must be longer than --node-monitor-period",
        ),
        (
            &["controller-manager", "--allocate-node-cidrs"],
            "Must specify --cluster-cidr if --allocate-node-cidrs is set",
        ),
        (
            &["controller-manager", "--cluster-cidr", "10.244.0.0/33"],
            "--cluster-cidr: invalid CIDR address",
        ),
        (
            &[
                "controller-manager",
                "--cluster-signing-cert-file",
                "ca.crt",
            ],
            "--cluster-signing-key-file",
        ),
        (
            &["controller-manager", "--kubeconfig", missing],
            "--kubeconfig",
        ),
        (&["controller-manager", "--leader-elect", "maybe"], "maybe"),
        (&["node-simulator", "--sim-nodes", "two"], "--sim-nodes"),
        (
            &["node-simulator", "--sim-zones", ","],
            "--sim-zones must name at least one zone",
        ),
        (
            &[
                "node-simulator",
                "--sim-register-with-taints",
                "a=b:Sometimes",
            ],
            "--sim-register-with-taints",
        ),
        (
            &["node-simulator", "--sim-cloud-provider", "aws"],
            "--sim-cloud-provider",
        ),
        (
            &["node-simulator", "--sim-data-path", "true"],
            "--sim-data-path",
        ),
        (&["node-simulator", "--kubeconfig", missing], "--kubeconfig"),
    ];
    for (args, needle) in cases {
        let out = ccm(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1 | 2)),
            "{args:?}: {:?} {stderr}",
            out.status
        );
        assert!(stderr.contains(needle), "{args:?}: {needle:?} in {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// `--help` says what each subcommand runs and what the simulator leaves off.
#[test]
fn the_attached_subcommands_say_what_they_run() {
    let out = ccm(&["controller-manager", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for flag in [
        "--kubeconfig",
        "--leader-elect",
        "--cluster-cidr",
        "--allocate-node-cidrs",
        "--service-cluster-ip-range",
        "--terminated-pod-gc-threshold",
        "--root-ca-file",
        "--cluster-signing-cert-file",
        "--node-monitor-grace-period",
    ] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
    let out = ccm(&["node-simulator", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for text in [
        "--kubeconfig",
        "--sim-nodes",
        "--sim-node-names",
        "--sim-zones",
        "--sim-cloud-provider",
        "--write-fake-cloud-config",
        "the kubelet API",
    ] {
        assert!(help.contains(text), "{text} in {help}");
    }
    assert!(!help.contains("--sim-data-path"), "{help}");
}

/// `--write-fake-cloud-config` writes the fake cloud of the simulated nodes before it dials
/// the cluster: an instance named as each node, with the node's zone and address.
#[test]
fn the_node_simulator_writes_the_fake_cloud_of_its_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = dir.path().join("cloud.toml");
    let out = ccm(&[
        "node-simulator",
        "--master",
        "https://127.0.0.1:1",
        "--sim-nodes",
        "2",
        "--sim-zones",
        "zone-a,zone-b",
        "--write-fake-cloud-config",
        cloud.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1), "nothing answers on port 1");
    let text = std::fs::read_to_string(&cloud).unwrap();
    for expected in [
        "name = \"sim-node-0\"\nzone = \"zone-a\"",
        "name = \"sim-node-1\"\nzone = \"zone-b\"",
        "internal_ips = [\"10.0.0.2\"]",
    ] {
        assert!(text.contains(expected), "{expected} in {text}");
    }
    let out = ccm(&[
        "conformance",
        "--cloud-config",
        cloud.to_str().unwrap(),
        "--running-node",
        "sim-node-0",
        "--running-node",
        "sim-node-1",
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
