//! A pod's service-account identity in the embedded default, as a newcomer tries it:
//! ServiceAccount admission (`plugin/pkg/admission/serviceaccount/admission.go`), the
//! serviceaccounts controller and the root-CA publisher of kube-controller-manager, and
//! the simulated kubelet's projected token (`pkg/kubelet/token/token_manager.go`), checked
//! with kubectl against the bound-token validation of `pkg/serviceaccount/claims.go`.

use std::time::Duration;

use crate::{
    embedded::Embedded,
    support::{require_kubectl, wait_until},
};

const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// A kubeconfig for this cluster's server and CA that authenticates with `token` alone.
fn token_kubeconfig(cluster: &Embedded, token: &str) -> std::path::PathBuf {
    let admin = std::fs::read_to_string(cluster.dir.path().join("kubeconfig")).unwrap();
    let server = admin
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("the admin kubeconfig names its server")
        .trim_matches('"')
        .to_owned();
    let ca = cluster.dir.path().join("data").join("pki").join("ca.crt");
    let path = cluster.dir.path().join("token-kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
        ca.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `kubectl run` in the embedded default gives the pod the `default` account and its
/// projected `kube-api-access-*` volume; `kubectl exec … cat` of the token in the running
/// container authenticates as `system:serviceaccount:default:default` (`kubectl auth
/// whoami`), and is refused (Unauthorized) once the pod is deleted.
#[test]
fn a_pods_token_in_the_embedded_default_is_its_service_account() {
    require_kubectl("it drives the embedded cluster with kubectl");
    let cluster = Embedded::start();
    let ready = wait_until(Duration::from_secs(30), || {
        let out = cluster.kubectl(&["get", "nodes", "--no-headers"]);
        out.lines().count() == 3 && out.lines().all(|l| l.contains(" Ready "))
    });
    assert!(ready, "{}", cluster.kubectl(&["get", "nodes"]));
    let ran = cluster.kubectl(&["run", "web", "--image=nginx"]);
    assert!(ran.contains("pod/web created"), "{ran}");
    let account = cluster.kubectl(&[
        "get",
        "pod",
        "web",
        "-o",
        "jsonpath={.spec.serviceAccountName} {.spec.volumes[0].name}",
    ]);
    assert!(account.starts_with("default kube-api-access-"), "{account}");
    let running = wait_until(Duration::from_secs(30), || {
        cluster.kubectl(&["get", "pod", "web", "-o", "jsonpath={.status.phase}"]) == "Running"
    });
    assert!(
        running,
        "{}",
        cluster.kubectl(&["get", "pod", "web", "-o", "yaml"])
    );
    let roots = cluster.kubectl(&[
        "get",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "kube-public",
        "-o",
        "name",
    ]);
    assert_eq!(roots.trim(), "configmap/kube-root-ca.crt");
    let mut token = String::new();
    let minted = wait_until(Duration::from_secs(20), || {
        token = cluster.kubectl(&["exec", "web", "--", "cat", TOKEN_PATH]);
        token.split('.').count() == 3
    });
    assert!(minted, "no token in the container: {token:?}");
    let with_token = token_kubeconfig(&cluster, &token);
    let mut whoami = cluster.command();
    let out = whoami
        .env("KUBECONFIG", &with_token)
        .args([
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "system:serviceaccount:default:default",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cluster.kubectl(&["delete", "pod", "web", "--wait=true"]);
    let out = cluster
        .command()
        .env("KUBECONFIG", &with_token)
        .args(["auth", "whoami"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Unauthorized"), "{err}");
}
