//! The embedded default's kubelet serving certificates by CertificateSigningRequest: a node
//! with `serverTLSBootstrap` (kubelet's serving certificate manager) asks for its
//! certificate; with `--approve-kubelet-serving-certificates` the request for the node's own
//! name and addresses is approved and the `kubernetes.io/kubelet-serving` signer
//! (`pkg/controller/certificates/signer`) issues it, so `kubectl logs` reaches the node.

use std::time::Duration;

use crate::{
    embedded::Embedded,
    support::{require_kubectl, wait_until},
};

/// Without anyone running `kubectl certificate approve`, the bootstrapping node's request
/// is approved (`AutoApproved`), issued, and its kubelet serves: `kubectl logs` to its pod
/// works, and its `/configz` says `serverTLSBootstrap: true`.
#[test]
fn a_bootstrapping_node_is_approved_and_served_in_the_embedded_default() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sim.yaml");
    std::fs::write(
        &file,
        "apiVersion: sim.ccm-rs.io/v1alpha1\nkind: NodeSimulatorConfiguration\nnodes:\n  - name: sim-node-1\n    kubelet: {serverTLSBootstrap: true}\n",
    )
    .unwrap();
    let log = dir.path().join("ccm.log");
    let cluster = Embedded::start_logging_to(
        &log,
        &[
            "--sim-config",
            file.to_str().unwrap(),
            "--approve-kubelet-serving-certificates=true",
        ],
    );
    let issued = wait_until(Duration::from_secs(60), || {
        let csrs = cluster.kubectl(&["get", "csr", "--no-headers"]);
        csrs.contains("system:node:sim-node-1") && csrs.contains("Approved,Issued")
    });
    assert!(
        issued,
        "{}\n{}",
        cluster.kubectl(&["get", "csr", "-o", "yaml"]),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    cluster.apply(
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"boot","namespace":"default"},
        "spec":{"nodeName":"sim-node-1","containers":[{"name":"c","image":"nginx"}]}}"#,
    );
    assert!(
        wait_until(Duration::from_secs(60), || {
            cluster
                .kubectl(&["logs", "boot"])
                .starts_with("Started container c")
        }),
        "kubectl logs boot never worked: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let configz = cluster.kubectl(&["get", "--raw", "/api/v1/nodes/sim-node-1/proxy/configz"]);
    assert!(configz.contains("\"serverTLSBootstrap\":true"), "{configz}");
    // Only that node asked.
    let csrs = cluster.kubectl(&["get", "csr", "--no-headers"]);
    assert_eq!(csrs.lines().count(), 1, "{csrs}");
}
