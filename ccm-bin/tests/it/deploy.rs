//! deploy/, the manifests operators start from: the DaemonSet (`deploy/ccm-daemonset.yaml`)
//! parses as Kubernetes objects, its flags pass `ccm`'s own validation and it is hardened as
//! the Pod Security Standards' `restricted` profile asks; the seed's ClusterRole is there
//! rule for rule; both roles (`deploy/rbac/seed.yaml`, `deploy/rbac/least-privilege.yaml`)
//! with the shared RBAC (`deploy/rbac-common.yaml`) grant every call the controllers make;
//! and applied to a real cluster, a ccm authenticated as the ServiceAccount's token
//! initializes Nodes and gives a LoadBalancer Service its address under each role.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use ccm_testkit::free_port;
use cloud_provider_app::CloudControllerManagerOptions;
use k8s_openapi::api::{apps::v1::DaemonSet, rbac::v1::PolicyRule};
use serde::Deserialize;

use crate::support::{ApiServerProcess, require_kubectl, wait_until};

const DAEMONSET: &str = include_str!("../../../deploy/ccm-daemonset.yaml");
const COMMON: &str = include_str!("../../../deploy/rbac-common.yaml");
const SEED: &str = include_str!("../../../deploy/rbac/seed.yaml");
const LEAST_PRIVILEGE: &str = include_str!("../../../deploy/rbac/least-privilege.yaml");

fn documents(manifest: &str) -> Vec<serde_json::Value> {
    serde_norway::Deserializer::from_str(manifest)
        .map(|doc| serde_json::Value::deserialize(doc).expect("each document parses"))
        .filter(|doc| !doc.is_null())
        .collect()
}

fn object<T: serde::de::DeserializeOwned>(manifest: &str, kind: &str, name: &str) -> T {
    let doc = documents(manifest)
        .into_iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("a {kind} {name} in the manifest"));
    serde_json::from_value(doc).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

fn kinds(manifest: &str) -> Vec<String> {
    documents(manifest)
        .iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn the_daemonset_runs_ccm_with_valid_flags_on_the_host_network() {
    assert_eq!(kinds(DAEMONSET), ["ServiceAccount", "Secret", "DaemonSet"]);
    let ds: DaemonSet = object(DAEMONSET, "DaemonSet", "cloud-controller-manager");
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

/// The Pod Security Standards' `restricted` profile (upstream's
/// `staging/src/k8s.io/pod-security-admission/policy`: `runAsNonRoot`,
/// `allowPrivilegeEscalation`, `capabilities_restricted`, `seccompProfile_restricted`), a
/// read-only root filesystem, and what a critical control-plane add-on carries: the
/// `system-node-critical` priority and a NoExecute toleration of `not-ready`, so a node
/// whose network is not up yet does not evict the pod that would bring it up.
#[test]
fn the_daemonset_is_hardened_as_the_restricted_pod_security_profile_asks() {
    let ds: DaemonSet = object(DAEMONSET, "DaemonSet", "cloud-controller-manager");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| {
            t.key.as_deref() == Some("node.kubernetes.io/not-ready")
                && t.effect.as_deref() == Some("NoExecute")
                && t.operator.as_deref() == Some("Exists")
        }),
        "{tolerations:?}"
    );
    let pod_context = pod.security_context.clone().expect("a pod securityContext");
    assert_eq!(pod_context.run_as_non_root, Some(true));
    assert_eq!(pod_context.run_as_user, Some(65532), "distroless' nonroot");
    assert_eq!(
        pod_context.seccomp_profile.map(|s| s.type_),
        Some("RuntimeDefault".to_owned())
    );
    for container in &pod.containers {
        let context = container
            .security_context
            .clone()
            .expect("a container securityContext");
        assert_eq!(context.allow_privilege_escalation, Some(false));
        assert_eq!(context.read_only_root_filesystem, Some(true));
        assert_eq!(
            context.capabilities.and_then(|c| c.drop),
            Some(vec!["ALL".to_owned()])
        );
        assert_ne!(context.privileged, Some(true));
    }
}

/// The seed document's Authorization section (kubernetes.io "Cloud Controller Manager"),
/// every rule as written there, under the name it gives: `cloud-controller-manager`.
#[test]
fn the_seed_cluster_role_is_the_seed_documents_rule_for_rule() {
    let role: k8s_openapi::api::rbac::v1::ClusterRole =
        object(SEED, "ClusterRole", "cloud-controller-manager");
    let rules: Vec<(Vec<String>, Vec<String>, Vec<String>)> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            (
                r.api_groups.unwrap_or_default(),
                r.resources.unwrap_or_default(),
                r.verbs,
            )
        })
        .collect();
    let seed: &[(&str, &str, &[&str])] = &[
        ("", "events", &["create", "patch", "update"]),
        ("", "nodes", &["*"]),
        ("", "nodes/status", &["patch"]),
        ("", "services", &["list", "patch", "update", "watch"]),
        ("", "serviceaccounts", &["create"]),
        ("", "persistentvolumes", &["get", "list", "update", "watch"]),
        (
            "",
            "endpoints",
            &["create", "get", "list", "watch", "update"],
        ),
    ];
    let expected: Vec<(Vec<String>, Vec<String>, Vec<String>)> = seed
        .iter()
        .map(|(g, r, v)| {
            (
                vec![(*g).to_owned()],
                vec![(*r).to_owned()],
                v.iter().map(|v| (*v).to_owned()).collect(),
            )
        })
        .collect();
    assert_eq!(rules, expected);
}

/// Every rule that applies to `resource` in `group` for the `verb` (RBAC's
/// `plugin/pkg/auth/authorizer/rbac/rbac.go` `RuleAllows`: `*` matches any verb).
fn allows(rules: &[PolicyRule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|rule| {
        rule.api_groups
            .iter()
            .flatten()
            .any(|g| g == group || g == "*")
            && rule
                .resources
                .iter()
                .flatten()
                .any(|r| r == resource || r == "*")
            && rule.verbs.iter().any(|v| v == verb || v == "*")
    })
}

/// The rules of every Role and ClusterRole in `manifests`.
fn rules_of(manifests: &[&str]) -> Vec<PolicyRule> {
    manifests
        .iter()
        .flat_map(|m| documents(m))
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "Role")
        .flat_map(|d| serde_json::from_value::<Vec<PolicyRule>>(d["rules"].clone()).unwrap())
        .collect()
}

/// What the controllers, leader election and the secure port send (see
/// tests/conformance/tap.rs for the recorded requests).
const NEEDED: &[(&str, &str, &[&str])] = &[
    (
        "",
        "nodes",
        &["get", "list", "watch", "update", "patch", "delete"],
    ),
    ("", "nodes/status", &["patch"]),
    ("", "services", &["get", "list", "watch", "patch"]),
    ("", "services/status", &["patch"]),
    ("", "events", &["create", "patch"]),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
    ),
    ("authentication.k8s.io", "tokenreviews", &["create"]),
    ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
    ("", "configmaps", &["get"]),
    // --use-service-account-credentials.
    ("", "serviceaccounts", &["get", "create"]),
    ("", "serviceaccounts/token", &["create"]),
];

#[test]
fn each_role_with_the_shared_rbac_grants_every_call_the_controllers_make() {
    for (name, role) in [("seed", SEED), ("least-privilege", LEAST_PRIVILEGE)] {
        let rules = rules_of(&[COMMON, role]);
        for (group, resource, verbs) in NEEDED {
            for verb in *verbs {
                assert!(
                    allows(&rules, group, resource, verb),
                    "{name}: {verb} {resource} in group {group:?}"
                );
            }
        }
    }
    // The least-privilege role grants nothing the controllers do not use.
    let least = rules_of(&[LEAST_PRIVILEGE]);
    for (group, resource, verb) in [
        ("", "nodes", "create"),
        ("", "persistentvolumes", "list"),
        ("", "endpoints", "create"),
        ("", "serviceaccounts", "create"),
        ("", "services", "update"),
    ] {
        assert!(
            !allows(&least, group, resource, verb),
            "least-privilege grants {verb} {resource}"
        );
    }
}

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
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\nspec:\n  taints:\n  - key: node.cloudprovider.kubernetes.io/uninitialized\n    value: \"true\"\n    effect: NoSchedule\n"
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

struct Manager(Child);

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// A kubeconfig for the cluster of `server` that authenticates as
/// kube-system/cloud-controller-manager with a token from the TokenRequest API (what
/// `kubectl create token` asks for), as the DaemonSet's pod would.
fn service_account_kubeconfig(server: &ApiServerProcess) -> PathBuf {
    let token = server.kubectl_ok(&[
        "create",
        "token",
        "cloud-controller-manager",
        "-n",
        "kube-system",
        "--duration=1h",
    ]);
    let path = server.dir.join("ccm.kubeconfig");
    std::fs::copy(server.kubeconfig(), &path).unwrap();
    let config = |args: &[&str]| {
        let out = ccm_testkit::kubectl::command(&server.dir, &path)
            .arg("config")
            .args(args)
            .output()
            .expect("run kubectl config");
        assert!(out.status.success(), "kubectl config {args:?}: {out:?}");
    };
    config(&[
        "set-credentials",
        "cloud-controller-manager",
        &format!("--token={}", token.trim()),
    ]);
    config(&[
        "set-context",
        "--current",
        "--user=cloud-controller-manager",
    ]);
    path
}

/// Applies deploy/ (the DaemonSet and the shared RBAC) and `role` to a fresh `ccm apiserver`
/// as its admin, for real; runs `ccm --kubeconfig` as the ServiceAccount with leader
/// election on; the Nodes get their provider IDs and lose the uninitialized taint, and a
/// LoadBalancer Service gets an ingress address. `can_create_nodes` is what the role says
/// about a verb only the seed's grants (so the role applied is the one in force).
fn run_ccm_under(role: &str, extra: &[&str], can_create_nodes: bool) {
    require_kubectl("it applies deploy/ with kubectl");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    let deploy = deploy_dir();
    let role_file = deploy.join("rbac").join(role);
    server.kubectl_ok(&[
        "apply",
        "-f",
        deploy.to_str().unwrap(),
        "-f",
        role_file.to_str().unwrap(),
    ]);
    for name in ["node-a", "node-b"] {
        let out = server.kubectl_stdin(&["apply", "-f", "-"], &node_manifest(name));
        assert!(out.status.success(), "{out:?}");
    }
    let kubeconfig = service_account_kubeconfig(&server);
    let can_i = ccm_testkit::kubectl::command(dir.path(), &kubeconfig)
        .args(["auth", "can-i", "create", "nodes"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&can_i.stdout).trim(),
        if can_create_nodes { "yes" } else { "no" },
        "{role}: {can_i:?}"
    );
    let cloud = dir.path().join("cloud.toml");
    std::fs::write(&cloud, CLOUD).unwrap();
    let port = free_port().to_string();
    let log = std::fs::File::create(dir.path().join("ccm.log")).unwrap();
    let _manager = Manager(
        Command::new(env!("CARGO_BIN_EXE_ccm"))
            .args([
                "--cloud-provider=fake",
                "--cloud-config",
                cloud.to_str().unwrap(),
                "--cluster-cidr=10.244.0.0/16",
                "--leader-elect=true",
                "--bind-address=127.0.0.1",
                "--secure-port",
                &port,
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let ccm_log = || std::fs::read_to_string(dir.path().join("ccm.log")).unwrap_or_default();
    let initialized = wait_until(Duration::from_secs(30), || {
        let ids =
            server.kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"]);
        ids == "fake://i-a fake://i-b"
    });
    assert!(
        initialized,
        "{role}: {}\n{}",
        server.kubectl_ok(&["get", "nodes", "-o", "yaml"]),
        ccm_log()
    );
    let taints = server.kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].spec.taints}"]);
    assert!(
        !taints.contains("node.cloudprovider.kubernetes.io/uninitialized"),
        "{role}: {taints}"
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
        "{role}: {}\n{}",
        server.kubectl_ok(&["get", "service", "web", "-o", "yaml"]),
        ccm_log()
    );
    let holder = server.kubectl_ok(&[
        "get",
        "lease",
        "-n",
        "kube-system",
        "cloud-controller-manager",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    assert!(!holder.is_empty(), "{role}: the ccm holds the leader Lease");
    if extra.contains(&"--use-service-account-credentials") {
        // Each controller ran as its own account, which the manager created.
        let accounts = server.kubectl_ok(&[
            "get",
            "serviceaccounts",
            "-n",
            "kube-system",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ]);
        for account in ["cloud-node-controller", "service-controller"] {
            assert!(accounts.contains(account), "{account} in {accounts}");
        }
    }
}

/// The seed's ClusterRole (with deploy/'s shared RBAC) is enough for the ccm as its
/// ServiceAccount (upstream's `cmd/cloud-controller-manager` with a DaemonSet's in-cluster
/// credentials).
#[test]
fn deploy_applied_for_real_runs_the_ccm_under_the_seed_role() {
    run_ccm_under("seed.yaml", &[], true);
}

/// `--use-service-account-credentials` under the seed's role: the manager creates each
/// controller's account and asks a token for it (upstream's
/// `controller-manager/pkg/clientbuilder` `DynamicControllerClientBuilder`), and the
/// controllers, running as those accounts, still initialize Nodes and Services.
#[test]
fn deploy_applied_for_real_runs_the_ccm_with_service_account_credentials_under_the_seed_role() {
    run_ccm_under("seed.yaml", &["--use-service-account-credentials"], true);
}

/// The least-privilege role (which cannot create Nodes, read PersistentVolumes or write
/// Endpoints) is enough too, with and without per-controller accounts.
#[test]
fn deploy_applied_for_real_runs_the_ccm_under_the_least_privilege_role() {
    run_ccm_under("least-privilege.yaml", &[], false);
    run_ccm_under(
        "least-privilege.yaml",
        &["--use-service-account-credentials"],
        false,
    );
}
