//! `ccm --sim-config FILE`: the simulated kubelets configured per node from a simulator
//! config file in KubeletConfiguration's shape, seen with kubectl. Rules: kubelet's
//! `ValidateKubeletConfiguration` (a bad file stops the process naming the node and the
//! field), `pkg/kubelet/nodestatus/setters.go` `MachineInfo` (`status.nodeInfo.swap`) and
//! `pkg/kubelet/cm/topologymanager/topology_manager.go` `Admit` (`TopologyAffinityError`).

use std::{process::Command, time::Duration};

use crate::{
    embedded::Embedded,
    support::{require_kubectl, wait_until},
};

/// `ValidateKubeletConfiguration` at start: a malformed simulator config file stops `ccm`
/// with a non-zero exit and an error naming the file, the node and the field.
#[test]
fn a_malformed_simulator_config_stops_ccm_naming_the_node_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sim.yaml");
    std::fs::write(
        &file,
        "apiVersion: sim.ccm-rs.io/v1alpha1\nkind: NodeSimulatorConfiguration\nnodes:\n  - name: sim-node-1\n    kubelet: {imageGCHighThresholdPercent: 85, imageGCLowThresholdPercent: 90}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ccm"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--secure-port",
            "0",
            "--sim-config",
        ])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--write-kubeconfig")
        .arg(dir.path().join("kubeconfig"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--sim-config")
            && stderr.contains("node \"sim-node-1\": imageGCLowThresholdPercent: 90 must be less than imageGCHighThresholdPercent 85"),
        "{stderr}"
    );
}

/// The file's nodes as kubectl shows them: a node with swap and `failSwapOn: false`
/// reports it in `status.nodeInfo.swap.capacity` (`MachineInfo`), a node the file adds
/// registers, and under its `single-numa-node` policy a Guaranteed pod wider than a NUMA
/// node fails with `TopologyAffinityError`.
#[test]
fn the_simulator_config_file_shapes_each_node_as_kubectl_shows() {
    require_kubectl("it reads the nodes and pods with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sim.yaml");
    std::fs::write(
        &file,
        r#"apiVersion: sim.ccm-rs.io/v1alpha1
kind: NodeSimulatorConfiguration
nodes:
  - name: sim-node-1
    machine: {swap: 4Gi}
    kubelet: {failSwapOn: false, memorySwap: {swapBehavior: LimitedSwap}}
  - name: numa-0
    nodeLabels: {pool: numa}
    machine: {cpu: "8", memory: 16Gi, numaNodes: 2}
    kubelet: {cpuManagerPolicy: static, topologyManagerPolicy: single-numa-node}
"#,
    )
    .unwrap();
    let log = dir.path().join("ccm.log");
    let cluster = Embedded::start_logging_to(&log, &["--sim-config", file.to_str().unwrap()]);
    let registered = wait_until(Duration::from_secs(60), || {
        cluster
            .kubectl(&["get", "nodes", "--no-headers"])
            .lines()
            .count()
            == 4
    });
    assert!(registered, "{}", cluster.kubectl(&["get", "nodes"]));
    assert_eq!(
        cluster.kubectl(&[
            "get",
            "node",
            "sim-node-1",
            "-o",
            "jsonpath={.status.nodeInfo.swap.capacity}"
        ]),
        "4294967296"
    );
    assert_eq!(
        cluster.kubectl(&[
            "get",
            "node",
            "numa-0",
            "-o",
            "jsonpath={.metadata.labels.pool}"
        ]),
        "numa"
    );
    cluster.apply(
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"big","namespace":"default"},
        "spec":{"nodeName":"numa-0","containers":[{"name":"c","image":"nginx",
        "resources":{"limits":{"cpu":"6","memory":"1Gi"}}}]}}"#,
    );
    let refused = wait_until(Duration::from_secs(60), || {
        cluster.kubectl(&[
            "get",
            "pod",
            "big",
            "-o",
            "jsonpath={.status.phase} {.status.reason}",
        ]) == "Failed TopologyAffinityError"
    });
    assert!(
        refused,
        "{}",
        cluster.kubectl(&["get", "pod", "big", "-o", "yaml"])
    );
}
