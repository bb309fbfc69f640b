//! The Helm chart `deploy/chart`: `helm lint --strict` is clean; its default render is
//! deploy/ (the DaemonSet, the shared RBAC and the seed's role) object for object, and with
//! `rbac.role=least-privilege` it is deploy/ with the least-privilege role; and
//! `helm install --wait`, `helm upgrade --wait` and `helm uninstall` work against
//! core-cluster (`ccm apiserver`, with core-cluster's DaemonSet controller playing
//! kube-controller-manager, so `--wait` sees the rollout observed).
//!
//! helm v3 comes from PATH (scripts/test puts the one scripts/helm.sh installs there); the
//! tests fail, never skip, without it.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::support::{ApiServerProcess, require_kubectl, wait_until};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn chart() -> String {
    deploy_dir().join("chart").to_str().unwrap().to_owned()
}

/// helm v3 on PATH, or a failure that says how to get it.
fn require_helm() {
    let out = Command::new("helm").args(["version", "--short"]).output();
    let version = out
        .as_ref()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(
        version.starts_with("v3."),
        "helm v3 is required on PATH for this test; scripts/helm.sh installs it \
         (scripts/test puts it on PATH); found {version:?} ({:?})",
        out.err()
    );
}

/// helm with its configuration, cache and data in `home`, and `kubeconfig` if given.
fn helm(home: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new("helm");
    cmd.env("HOME", home)
        .env("HELM_CONFIG_HOME", home.join("helm-config"))
        .env("HELM_CACHE_HOME", home.join("helm-cache"))
        .env("HELM_DATA_HOME", home.join("helm-data"))
        .args(args);
    match kubeconfig {
        Some(k) => cmd.env("KUBECONFIG", k),
        None => cmd.env_remove("KUBECONFIG"),
    };
    cmd.output().expect("run helm")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The objects of YAML streams, by kind and name.
fn objects(streams: &[String]) -> BTreeMap<(String, String), serde_json::Value> {
    streams
        .iter()
        .flat_map(|s| {
            serde_norway::Deserializer::from_str(s)
                .map(|doc| serde_json::Value::deserialize(doc).expect("each document parses"))
                .filter(|doc| !doc.is_null())
                .collect::<Vec<_>>()
        })
        .map(|o| {
            let key = (
                o["kind"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            );
            (key, o)
        })
        .collect()
}

fn deploy_files(role: &str) -> Vec<String> {
    let dir = deploy_dir();
    [
        dir.join("ccm-daemonset.yaml"),
        dir.join("rbac-common.yaml"),
        dir.join("rbac").join(role),
    ]
    .iter()
    .map(|p| std::fs::read_to_string(p).unwrap())
    .collect()
}

/// Helm's own linter (`helm lint --strict`: warnings fail too).
#[test]
fn the_chart_lints_clean() {
    require_helm();
    let home = tempfile::tempdir().unwrap();
    let out = ok(
        helm(home.path(), None, &["lint", "--strict", &chart()]),
        "helm lint",
    );
    assert!(out.contains("0 chart(s) failed"), "{out}");
    assert!(
        !out.contains("[WARNING]") && !out.contains("[ERROR]"),
        "{out}"
    );
}

/// `helm template` with the default values renders exactly deploy/ (with the seed's role),
/// and with `rbac.role=least-privilege` exactly deploy/ with that role: an operator gets the
/// same cluster either way, and the chart cannot drift from the manifests the other tests
/// apply.
#[test]
fn the_charts_default_render_is_deploy() {
    require_helm();
    let home = tempfile::tempdir().unwrap();
    for (role, set) in [
        ("seed.yaml", None),
        ("least-privilege.yaml", Some("rbac.role=least-privilege")),
    ] {
        let mut args = vec!["template", "ccm", &*chart(), "--namespace", "kube-system"]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        if let Some(set) = set {
            args.extend(["--set".to_owned(), set.to_owned()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let rendered = ok(helm(home.path(), None, &args), "helm template");
        let rendered = objects(&[rendered]);
        let deployed = objects(&deploy_files(role));
        assert_eq!(
            rendered.keys().collect::<Vec<_>>(),
            deployed.keys().collect::<Vec<_>>(),
            "{role}"
        );
        for (key, object) in &deployed {
            assert_eq!(&rendered[key], object, "{role}: {key:?}");
        }
    }
    // A value the chart does not know is refused, not rendered into a broken role.
    let out = helm(
        home.path(),
        None,
        &["template", "ccm", &chart(), "--set", "rbac.role=admin"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rbac.role must be seed or least-privilege"),
        "{out:?}"
    );
}

/// `helm install --wait`, `helm upgrade --wait` (a new flag rolls the DaemonSet: generation
/// 2, observed by the DaemonSet controller) and `helm uninstall` against `ccm apiserver`.
#[test]
fn helm_installs_upgrades_and_uninstalls_the_chart_in_core_cluster() {
    require_helm();
    require_kubectl("it checks what helm installed");
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start(dir.path());
    let kubeconfig = server.kubeconfig();
    // core-cluster's DaemonSet controller, as kube-controller-manager runs it.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let kubeconfig = kubeconfig.clone();
        let stop = stop.clone();
        runtime.spawn(async move {
            let config = kube::Config::from_custom_kubeconfig(
                kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
                &Default::default(),
            )
            .await
            .unwrap();
            let client = kube::Client::try_from(config).unwrap();
            core_cluster::controllers::daemonset::DaemonSetController::new(client)
                .run(stop)
                .await;
        });
    }
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let k = Some(kubeconfig.as_path());
    ok(
        helm(
            &home,
            k,
            &[
                "install",
                "ccm",
                &chart(),
                "--namespace",
                "kube-system",
                "--wait",
                "--timeout",
                "60s",
            ],
        ),
        "helm install",
    );
    for (kind, name) in [
        ("daemonset", "cloud-controller-manager"),
        ("serviceaccount", "cloud-controller-manager"),
        ("secret", "cloud-config"),
        ("role", "cloud-controller-manager:leader-election"),
    ] {
        server.kubectl_ok(&["get", "-n", "kube-system", kind, name]);
    }
    server.kubectl_ok(&["get", "clusterrole", "cloud-controller-manager"]);

    // A new cloud config and the other role: the Secret changes, the pod template's checksum
    // annotation rolls the DaemonSet (generation 2), the roles are swapped.
    let values = dir.path().join("values.yaml");
    std::fs::write(
        &values,
        "rbac:\n  role: least-privilege\ncloudConfig:\n  content: |\n    [Global]\n    Region = eu-west-1\n",
    )
    .unwrap();
    ok(
        helm(
            &home,
            k,
            &[
                "upgrade",
                "ccm",
                &chart(),
                "--namespace",
                "kube-system",
                "--values",
                values.to_str().unwrap(),
                "--wait",
                "--timeout",
                "60s",
            ],
        ),
        "helm upgrade",
    );
    let rolled = server.kubectl_ok(&[
        "get",
        "-n",
        "kube-system",
        "daemonset",
        "cloud-controller-manager",
        "-o",
        r#"jsonpath={.metadata.generation}/{.status.observedGeneration}/{.spec.template.metadata.annotations.checksum\/cloud-config}"#,
    ]);
    let parts: Vec<&str> = rolled.split('/').collect();
    assert_eq!(parts[..2], ["2", "2"], "{rolled}");
    assert_eq!(parts[2].len(), 64, "a sha256 checksum: {rolled}");
    let config = server.kubectl_ok(&[
        "get",
        "-n",
        "kube-system",
        "secret",
        "cloud-config",
        "-o",
        r#"jsonpath={.data.cloud\.conf}"#,
    ]);
    assert_eq!(
        config, "W0dsb2JhbF0KUmVnaW9uID0gZXUtd2VzdC0xCg==",
        "base64 of the new config"
    );
    // The upgrade swapped the role: the seed's is gone, the least-privilege one is there.
    assert!(
        !server
            .kubectl(&["get", "clusterrole", "cloud-controller-manager"])
            .status
            .success()
    );
    server.kubectl_ok(&[
        "get",
        "clusterrole",
        "cloud-controller-manager:least-privilege",
    ]);
    let history = ok(
        helm(&home, k, &["history", "ccm", "--namespace", "kube-system"]),
        "helm history",
    );
    assert!(history.contains("Upgrade complete"), "{history}");

    ok(
        helm(
            &home,
            k,
            &["uninstall", "ccm", "--namespace", "kube-system", "--wait"],
        ),
        "helm uninstall",
    );
    let gone = wait_until(Duration::from_secs(30), || {
        !server
            .kubectl(&[
                "get",
                "-n",
                "kube-system",
                "daemonset",
                "cloud-controller-manager",
            ])
            .status
            .success()
    });
    assert!(gone, "the DaemonSet is deleted");
    assert!(
        !server
            .kubectl(&[
                "get",
                "clusterrole",
                "cloud-controller-manager:least-privilege"
            ])
            .status
            .success()
    );
    stop.cancel();
}
