//! Several cloud controller managers in one cluster (beyond upstream; the shape of the
//! provisional KEP-5778): two `ccm` processes, each with the fake provider under its own
//! platform (`platforms` in its cloud config) and its own leader Lease, manage one
//! `ccm apiserver`. Nodes of both platforms join (named by the
//! `cloudprovider.kubernetes.io/platform` annotation) and some leave their cloud: each ccm
//! initializes only its own Nodes, deletes only its own Nodes whose instance is gone, and
//! counts the other's Nodes as skipped on `/metrics`.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use ccm_testkit::free_port;

use crate::support::{ApiServerProcess, https_get, require_kubectl, wait_until};

/// A cloud of `platform` with one running instance `i-<node>` per node name.
fn cloud(platform: &str, nodes: &[&str]) -> String {
    let mut text = format!("platforms = [\"{platform}\"]\nregion = \"{platform}-region\"\n");
    for node in nodes {
        text.push_str(&format!(
            "\n[[instances]]\nid = \"i-{node}\"\nname = \"{node}\"\ninternal_ips = [\"10.0.0.1\"]\n"
        ));
    }
    text
}

/// A Node as kubelet with `--cloud-provider=external` registers it, on `platform`.
fn node_manifest(name: &str, platform: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Node
metadata:
  name: {name}
  annotations:
    cloudprovider.kubernetes.io/platform: {platform}
spec:
  taints:
  - key: node.cloudprovider.kubernetes.io/uninitialized
    value: "true"
    effect: NoSchedule
"#
    )
}

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ccm --kubeconfig` with the fake provider from `config`, its own Lease, metrics on `port`;
/// Nodes whose instance is gone are deleted at the first pass, every second.
fn start_ccm(
    dir: &Path,
    server: &ApiServerProcess,
    name: &str,
    config: &str,
    port: u16,
) -> Manager {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    Manager(
        Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args(["--cloud-provider", "fake", "--cloud-config"])
            .arg(&path)
            .args(["--leader-elect-resource-name", name])
            .args([
                "--node-monitor-period",
                "1s",
                "--node-deletion-grace-period",
                "0s",
            ])
            .args([
                "--cluster-cidr",
                "10.244.0.0/16",
                "--bind-address",
                "127.0.0.1",
            ])
            .args([
                "--secure-port",
                &port.to_string(),
                "--webhook-secure-port",
                "0",
            ])
            .arg("--kubeconfig")
            .arg(server.kubeconfig())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn provider_id(server: &ApiServerProcess, node: &str) -> String {
    server.kubectl_ok(&[
        "get",
        "node",
        node,
        "--ignore-not-found",
        "-o",
        "jsonpath={.spec.providerID}",
    ])
}

fn node_names(server: &ApiServerProcess) -> Vec<String> {
    let mut names: Vec<String> = server
        .kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"])
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// The value of `cloudprovider_node_ownership_skipped_total{controller="<controller>"}`.
fn skipped(metrics: &str, controller: &str) -> u64 {
    let prefix =
        format!("cloudprovider_node_ownership_skipped_total{{controller=\"{controller}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Each ccm initializes only the Nodes of its platform and deletes only its own Nodes whose
/// instance is gone (upstream `cloud-provider/controllers/nodelifecycle`
/// `MonitorNodes` deletes any Node its cloud does not know, which in a cluster of two clouds
/// is every Node of the other); Nodes joining later are handled the same way.
#[test]
fn two_ccms_each_initialize_and_delete_only_the_nodes_of_their_platform() {
    require_kubectl("it drives `ccm apiserver` with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    // node-a3 and node-b3 are in no cloud: they leave at once, each through its own ccm.
    for (name, platform) in [
        ("node-a1", "onprem"),
        ("node-a3", "onprem"),
        ("node-b1", "edge"),
        ("node-b3", "edge"),
    ] {
        let out = server.kubectl_stdin(&["apply", "-f", "-"], &node_manifest(name, platform));
        assert!(out.status.success(), "{out:?}");
    }
    let (port_a, port_b) = (free_port(), free_port());
    let _onprem = start_ccm(
        dir.path(),
        &server,
        "ccm-onprem",
        &cloud("onprem", &["node-a1", "node-a2"]),
        port_a,
    );
    let _edge = start_ccm(
        dir.path(),
        &server,
        "ccm-edge",
        &cloud("edge", &["node-b1", "node-b2"]),
        port_b,
    );

    let settled = wait_until(Duration::from_secs(60), || {
        provider_id(&server, "node-a1") == "fake://i-node-a1"
            && provider_id(&server, "node-b1") == "fake://i-node-b1"
            && node_names(&server) == ["node-a1", "node-b1"]
    });
    assert!(
        settled,
        "{}",
        server.kubectl_ok(&["get", "nodes", "-o", "yaml"])
    );

    // Nodes of both kinds join later.
    for (name, platform) in [("node-a2", "onprem"), ("node-b2", "edge")] {
        let out = server.kubectl_stdin(&["apply", "-f", "-"], &node_manifest(name, platform));
        assert!(out.status.success(), "{out:?}");
    }
    let joined = wait_until(Duration::from_secs(60), || {
        provider_id(&server, "node-a2") == "fake://i-node-a2"
            && provider_id(&server, "node-b2") == "fake://i-node-b2"
    });
    assert!(
        joined,
        "{}",
        server.kubectl_ok(&["get", "nodes", "-o", "yaml"])
    );
    // Several more monitor passes of both ccms: neither deletes the other's Nodes, which
    // its own cloud does not know.
    let lost = wait_until(Duration::from_secs(4), || node_names(&server).len() != 4);
    assert!(!lost, "every owned Node stays: {:?}", node_names(&server));
    assert_eq!(
        node_names(&server),
        ["node-a1", "node-a2", "node-b1", "node-b2"]
    );
    let region = |node: &str| {
        server.kubectl_ok(&[
            "get",
            "node",
            node,
            "-o",
            "jsonpath={.metadata.labels.topology\\.kubernetes\\.io/region}",
        ])
    };
    assert_eq!(region("node-a2"), "onprem-region");
    assert_eq!(region("node-b2"), "edge-region");

    let kubeconfig = server.kubeconfig();
    for (port, name) in [(port_a, "onprem"), (port_b, "edge")] {
        let (code, metrics) = https_get(port, "/metrics", &kubeconfig).unwrap_or_default();
        assert_eq!(code, 200, "{name}: {metrics}");
        for controller in ["cloud-node-controller", "cloud-node-lifecycle-controller"] {
            assert!(
                skipped(&metrics, controller) > 0,
                "{name}'s {controller} skips the other's Nodes:\n{metrics}"
            );
        }
    }
}
