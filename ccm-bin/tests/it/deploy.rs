//! `deploy/ccm-daemonset.yaml`, the DaemonSet operators start from: it parses as Kubernetes
//! objects, the container's flags pass `ccm`'s own validation, it runs on the host network
//! with the tolerations a cluster that is still coming up needs, and the ClusterRole grants
//! every API call the four controllers and leader election make.

use std::collections::BTreeSet;

use cloud_provider_app::CloudControllerManagerOptions;
use k8s_openapi::api::{apps::v1::DaemonSet, rbac::v1::ClusterRole};
use serde::Deserialize;

const MANIFEST: &str = include_str!("../../../deploy/ccm-daemonset.yaml");

fn documents() -> Vec<serde_json::Value> {
    serde_norway::Deserializer::from_str(MANIFEST)
        .map(|doc| serde_json::Value::deserialize(doc).expect("each document parses"))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn object<T: serde::de::DeserializeOwned>(kind: &str) -> T {
    let doc = documents()
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("a {kind} in the manifest"));
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

#[test]
fn the_daemonset_runs_ccm_with_valid_flags_on_the_host_network() {
    let kinds: Vec<String> = documents()
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );
    let ds: DaemonSet = object("DaemonSet");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.host_network,
        Some(true),
        "the CCM runs before the pod network"
    );
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("cloud-controller-manager")
    );
    let tolerated: BTreeSet<String> = pod
        .tolerations
        .unwrap_or_default()
        .into_iter()
        .filter_map(|t| t.key)
        .collect();
    assert!(tolerated.contains("node.cloudprovider.kubernetes.io/uninitialized"));
    let container = &pod.containers[0];
    let mut argv = vec!["ccm".to_owned()];
    argv.extend(container.args.clone().unwrap_or_default());
    let options = CloudControllerManagerOptions::try_parse_from(&argv).expect("flags parse");
    options.validate().expect("flags pass validation");
    assert_eq!(
        options.cloud_config.as_deref(),
        Some("/etc/ccm/cloud.conf".as_ref())
    );
    let probe_port = container
        .liveness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .map(|g| g.port.clone());
    assert_eq!(
        probe_port,
        Some(
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
                options.secure_port
            ))
        ),
        "the probes hit the port ccm serves /livez on"
    );
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let scheme = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|g| g.scheme.clone());
        assert_eq!(
            scheme.as_deref(),
            Some("HTTPS"),
            "the secure port serves HTTPS"
        );
    }
}

#[test]
fn the_cluster_role_grants_every_call_the_controllers_make() {
    let role: ClusterRole = object("ClusterRole");
    let granted = |group: &str, resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|rule| {
            rule.api_groups.iter().flatten().any(|g| g == group)
                && rule.resources.iter().flatten().any(|r| r == resource)
                && rule.verbs.iter().any(|v| v == verb)
        })
    };
    // What the controllers send (see tests/conformance/tap.rs for the recorded requests).
    let needed = [
        (
            "",
            "nodes",
            ["get", "list", "watch", "update", "patch", "delete"].as_slice(),
        ),
        ("", "nodes/status", &["patch", "update"]),
        ("", "services", &["get", "list", "watch"]),
        ("", "services/status", &["patch"]),
        ("", "events", &["create", "patch"]),
        (
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
        ),
        // The secure port's delegated authentication and authorization, and its client-CA
        // lookup (upstream's system:auth-delegator and extension-apiserver-authentication-reader).
        ("authentication.k8s.io", "tokenreviews", &["create"]),
        ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
        ("", "configmaps", &["get"]),
    ];
    for (group, resource, verbs) in needed {
        for verb in verbs {
            assert!(
                granted(group, resource, verb),
                "{verb} {resource} in group {group:?}"
            );
        }
    }
}
