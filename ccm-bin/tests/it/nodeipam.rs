//! `ccm --controllers=*,nodeipam` against a cluster with no IPAM of its own (`ccm
//! apiserver`): every Node gets pod CIDRs from `--cluster-cidr`, never inside
//! `--service-cluster-ip-range`, one per family with dual stack, and the route controller then
//! creates the routes (each Node's `NetworkUnavailable` turns False with `RouteCreated`).
//! Bad IPAM flags stop the ccm with upstream's messages.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::support::{ApiServerProcess, require_kubectl, wait_until};

const CLOUD: &str = r#"
region = "test-region"

[[instances]]
id = "i-a"
name = "node-a"
zone = "test-zone-a"
internal_ips = ["10.1.0.10"]

[[instances]]
id = "i-b"
name = "node-b"
zone = "test-zone-b"
internal_ips = ["10.1.0.11"]

[[instances]]
id = "i-c"
name = "node-c"
zone = "test-zone-a"
internal_ips = ["10.1.0.12"]
"#;

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_ccm(dir: &Path, kubeconfig: &Path, flags: &[&str]) -> Manager {
    let cloud = dir.join("cloud.toml");
    std::fs::write(&cloud, CLOUD).unwrap();
    let log = std::fs::File::create(dir.join("ccm.log")).unwrap();
    Manager(
        Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args(["--cloud-provider=fake", "--cloud-config"])
            .arg(&cloud)
            .args(["--secure-port=0", "--leader-elect=false", "--kubeconfig"])
            .arg(kubeconfig)
            .args(flags)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn register_nodes(server: &ApiServerProcess) {
    for name in NODES {
        // As kubelet with --cloud-provider=external registers it.
        let node = format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\nspec:\n  taints:\n  - key: node.cloudprovider.kubernetes.io/uninitialized\n    value: \"true\"\n    effect: NoSchedule\n"
        );
        let out = server.kubectl_stdin(&["apply", "-f", "-"], &node);
        assert!(out.status.success(), "{out:?}");
    }
}

/// The Nodes' `spec.podCIDRs`, one line per Node, in name order.
fn pod_cidrs(server: &ApiServerProcess) -> Vec<String> {
    server
        .kubectl_ok(&[
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.podCIDRs}{"\n"}{end}"#,
        ])
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Upstream's sample `nodeipamcontroller.go` with the range allocator
/// (`pkg/controller/nodeipam/ipam/range_allocator.go`): a /24 per Node from the cluster CIDR,
/// the service range (`filterOutServiceRange`) skipped; then upstream's route controller
/// (`cloud-provider/controllers/route/route_controller.go`) creates a route per pod CIDR and
/// marks the Node `NetworkUnavailable=False, RouteCreated`.
#[test]
fn the_ccm_gives_every_node_a_pod_cidr_and_the_routes_follow() {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    register_nodes(&server);
    let _ccm = start_ccm(
        dir.path(),
        &server.kubeconfig(),
        &[
            "--controllers=*,nodeipam",
            "--allocate-node-cidrs=true",
            "--cidr-allocator-type=RangeAllocator",
            "--cluster-cidr=10.244.0.0/22",
            "--node-cidr-mask-size=24",
            // The first half of the cluster CIDR is the Services': nodes get the second half
            // (and the third Node none, as upstream's allocator runs out).
            "--service-cluster-ip-range=10.244.0.0/23",
            "--configure-cloud-routes=true",
        ],
    );
    let log = || std::fs::read_to_string(dir.path().join("ccm.log")).unwrap_or_default();
    let allocated = wait_until(Duration::from_secs(30), || {
        pod_cidrs(&server).iter().filter(|c| !c.is_empty()).count() == 2
    });
    assert!(allocated, "{:?}\n{}", pod_cidrs(&server), log());
    let mut given: Vec<String> = pod_cidrs(&server)
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    given.sort();
    assert_eq!(given, [r#"["10.244.2.0/24"]"#, r#"["10.244.3.0/24"]"#]);

    let routed = wait_until(Duration::from_secs(30), || {
        let reasons = server.kubectl_ok(&[
            "get",
            "nodes",
            "-o",
            r#"jsonpath={range .items[*]}{.spec.podCIDR}={.status.conditions[?(@.type=="NetworkUnavailable")].reason}{"\n"}{end}"#,
        ]);
        reasons
            .lines()
            .filter(|l| l.starts_with("10.244."))
            .filter(|l| l.ends_with("=RouteCreated"))
            .count()
            == 2
    });
    assert!(
        routed,
        "{}\n{}",
        server.kubectl_ok(&["get", "nodes", "-o", "yaml"]),
        log()
    );
}

/// Dual stack: one pod CIDR per family, IPv4 first as `--cluster-cidr` lists them, of the
/// per-family mask sizes (upstream's `setNodeCIDRMaskSizes`).
#[test]
fn a_dual_stack_ccm_gives_every_node_one_pod_cidr_per_family() {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    register_nodes(&server);
    let _ccm = start_ccm(
        dir.path(),
        &server.kubeconfig(),
        &[
            "--controllers=*,nodeipam",
            "--allocate-node-cidrs",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--node-cidr-mask-size-ipv4=24",
            "--node-cidr-mask-size-ipv6=64",
            "--configure-cloud-routes=false",
        ],
    );
    let done = wait_until(Duration::from_secs(30), || {
        pod_cidrs(&server)
            .iter()
            .filter(|c| c.contains(','))
            .count()
            == NODES.len()
    });
    let log = std::fs::read_to_string(dir.path().join("ccm.log")).unwrap_or_default();
    assert!(done, "{:?}\n{log}", pod_cidrs(&server));
    for cidrs in pod_cidrs(&server) {
        let list: Vec<String> = serde_json::from_str(&cidrs).unwrap();
        assert!(
            list[0].starts_with("10.244.") && list[0].ends_with("/24"),
            "{list:?}"
        );
        assert!(
            list[1].starts_with("fd00:10:244:") && list[1].ends_with("/64"),
            "{list:?}"
        );
    }
}

/// `nodeipam` is off by default, as in upstream's sample: the Nodes stay without a pod CIDR
/// while the other controllers initialize them.
#[test]
fn without_naming_nodeipam_no_pod_cidr_is_given() {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    register_nodes(&server);
    let _ccm = start_ccm(
        dir.path(),
        &server.kubeconfig(),
        &[
            "--allocate-node-cidrs",
            "--cluster-cidr=10.244.0.0/16",
            "--configure-cloud-routes=false",
        ],
    );
    let initialized = wait_until(Duration::from_secs(30), || {
        server
            .kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"])
            .split(' ')
            .filter(|p| p.starts_with("fake://"))
            .count()
            == NODES.len()
    });
    assert!(
        initialized,
        "{}",
        std::fs::read_to_string(dir.path().join("ccm.log")).unwrap_or_default()
    );
    // Had nodeipam run, the Nodes would have had their CIDRs by now (the first test sees
    // them within a second of the ccm starting); watch for one that long again.
    let allocated = wait_until(Duration::from_secs(2), || {
        pod_cidrs(&server).iter().any(|c| !c.is_empty())
    });
    assert!(!allocated, "{:?}", pod_cidrs(&server));
}

/// Upstream's `setNodeCIDRMaskSizes` refusal, as the ccm's exit message (code 1), before it
/// contacts the cluster.
#[test]
fn bad_nodeipam_flags_stop_the_ccm_with_upstreams_message() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://127.0.0.1:1}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--cloud-provider=fake",
            "--controllers=*,nodeipam",
            "--allocate-node-cidrs",
            "--cluster-cidr=10.244.0.0/16,fd00::/56",
            "--node-cidr-mask-size=24",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("usage of --node-cidr-mask-size is not allowed with dual-stack clusters"),
        "{stderr}"
    );
}
