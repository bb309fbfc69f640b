//! The embedded default uses the whole node side: simulated nodes register, get pod CIDRs
//! and go Ready; a node whose heartbeats are stopped through kubectl turns Unknown and gets
//! the unreachable taints, seen with `kubectl get node -o yaml`; resumed, its taints go.
//! (node-lifecycle.md §7: Unknown after the grace period, taints, recovery.)

mod support;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use support::{require_kubectl, wait_until};

struct Embedded {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Embedded {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--sim-nodes",
                "3",
                "--sim-zones",
                "zone-a",
            ])
            .args([
                "--node-monitor-period",
                "500ms",
                "--node-monitor-grace-period",
                "4s",
            ])
            .args([
                "--sim-node-lease-duration",
                "2s",
                "--sim-node-status-update-frequency",
                "1s",
            ])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .arg("--write-kubeconfig")
            .arg(dir.path().join("kubeconfig"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ccm");
        let stdout = child.stdout.take().unwrap();
        let mut reader = BufReader::new(stdout);
        let mut first = String::new();
        reader.read_line(&mut first).unwrap();
        assert!(
            first.starts_with("embedded cluster: API server on http://"),
            "{first}"
        );
        // Keep reading the progress lines so the pipe never fills or closes.
        std::thread::spawn(move || for _ in reader.lines() {});
        Embedded { child, dir }
    }

    fn kubectl(&self, args: &[&str]) -> String {
        let out = Command::new("kubectl")
            .env("KUBECONFIG", self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[test]
fn a_node_whose_heartbeats_stop_turns_unknown_and_is_tainted() {
    require_kubectl();
    let cluster = Embedded::start();
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("Ready"))
            .count()
            == 3
    });
    assert!(
        ready,
        "3 simulated nodes never went Ready: {}",
        cluster.kubectl(&["get", "nodes"])
    );
    let cidrs = cluster.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}"]);
    assert_eq!(
        cidrs.split_whitespace().count(),
        3,
        "IPAM gives every node a pod CIDR: {cidrs}"
    );

    cluster.kubectl(&[
        "annotate",
        "node",
        "sim-node-1",
        "sim.ccm-rs.io/heartbeat=stopped",
    ]);
    let tainted = wait_until(Duration::from_secs(30), || {
        let yaml = cluster.kubectl(&["get", "node", "sim-node-1", "-o", "yaml"]);
        yaml.contains("reason: NodeStatusUnknown")
            && yaml.contains("key: node.kubernetes.io/unreachable")
            && yaml.contains("effect: NoExecute")
            && yaml.contains("effect: NoSchedule")
    });
    assert!(
        tainted,
        "{}",
        cluster.kubectl(&["get", "node", "sim-node-1", "-o", "yaml"])
    );
    // The other nodes are untouched.
    let others = cluster.kubectl(&[
        "get",
        "node",
        "sim-node-0",
        "sim-node-2",
        "-o",
        "jsonpath={.items[*].spec.taints}",
    ]);
    assert!(!others.contains("unreachable"), "{others}");

    cluster.kubectl(&[
        "annotate",
        "--overwrite",
        "node",
        "sim-node-1",
        "sim.ccm-rs.io/heartbeat=running",
    ]);
    let recovered = wait_until(Duration::from_secs(30), || {
        let taints =
            cluster.kubectl(&["get", "node", "sim-node-1", "-o", "jsonpath={.spec.taints}"]);
        let ready = cluster.kubectl(&[
            "get",
            "node",
            "sim-node-1",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ]);
        !taints.contains("unreachable") && ready == "True"
    });
    assert!(
        recovered,
        "{}",
        cluster.kubectl(&["get", "node", "sim-node-1", "-o", "yaml"])
    );
}
