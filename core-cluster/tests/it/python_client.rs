//! The official Kubernetes Python client (PyPI `kubernetes`) against the API server over TLS,
//! through the kubeconfig the server generates (the admin's client certificate): bodies
//! without `kind`/`apiVersion` (kube-apiserver defaults them from the URL), and the Python
//! client keeps working through the generated kubeconfig.
//!
//! `scripts/test` installs the client (`scripts/python-client.sh`) and exports
//! `CCM_KUBE_PYTHON`; without it the test looks in that script's default venv and fails,
//! saying to run `./scripts/test`, when the client is not there.

use std::{
    path::PathBuf,
    process::{Command, Output, Stdio},
    sync::Arc,
    time::Duration,
};

use ccm_testkit::TestServer;
use core_cluster::{ApiServer, ApiServerConfig, serve::write_kubeconfig, store::MemoryStore};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ServiceAccount};
use kube::Api;

/// The environment variable naming a python with the client (set by `scripts/test`).
const PYTHON_ENV: &str = "CCM_KUBE_PYTHON";
/// The script, beside this file.
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/client_crud.py");
/// What the script prints, one line per step, when every expectation held.
const STEPS: &[&str] = &[
    "ok create node without kind",
    "ok merge patch node",
    "ok strategic merge patch node",
    "ok list nodes",
    "ok delete node",
    "ok watch nodes",
    "ok create configmap without kind",
    "ok merge patch configmap",
    "ok strategic merge patch configmap",
    "ok replace configmap without kind",
    "ok list configmaps",
    "ok delete configmap",
    "ok watch configmaps",
    "ok leave configmap for kube-rs",
    "ok token request without kind",
    "ok token review without kind",
    "ok self subject access review without kind",
    "PASS",
];

/// How long the script may take (it takes seconds; its watches time out after 20 s).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs `command` to completion off the runtime's threads, killing it after `limit`.
async fn run(mut command: Command, limit: Duration) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?} did not start: {e}"));
    let deadline = tokio::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{command:?} did not finish within {limit:?}; its output:\n{}\n{}",
                std::fs::read_to_string(&out_path).unwrap_or_default(),
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    Output {
        status,
        stdout: std::fs::read(&out_path).unwrap(),
        stderr: std::fs::read(&err_path).unwrap(),
    }
}

/// A python that imports `kubernetes`: `$CCM_KUBE_PYTHON`, else the default venv of
/// `scripts/python-client.sh`. Panics, saying to run `./scripts/test`, when there is none.
fn python() -> PathBuf {
    let python = match std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("KUBE_PYTHON_VENV")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(".cache/ccm-rs/kubernetes-venv"))
            })
            .unwrap_or_default()
            .join("bin/python"),
    };
    let imports = Command::new(&python)
        .args([
            "-c",
            "import kubernetes.client, kubernetes.config, kubernetes.watch",
        ])
        .stdin(Stdio::null())
        .output();
    match imports {
        Ok(out) if out.status.success() => python,
        other => panic!(
            "the Kubernetes Python client is not installed: run ./scripts/test (which runs \
             scripts/python-client.sh and exports {PYTHON_ENV}), or set {PYTHON_ENV} to a python \
             with PyPI `kubernetes` ({} could not import it: {})",
            python.display(),
            match other {
                Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                Err(e) => e.to_string(),
            }
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_creates_patches_watches_and_deletes_without_kind_through_the_generated_kubeconfig()
 {
    let python = python();
    let api = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let server = TestServer::start(api).await.unwrap();
    let kubeconfig = server.dir().join("admin.kubeconfig");
    write_kubeconfig(&kubeconfig, &server.admin_kubeconfig()).unwrap();

    let started = tokio::time::Instant::now();
    let mut script = Command::new(&python);
    script.arg(SCRIPT).arg(&kubeconfig).arg("default");
    let out = run(script, SCRIPT_TIMEOUT).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("python client script: {:?}", started.elapsed());
    assert!(
        out.status.success(),
        "the script failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines, STEPS, "stderr:\n{stderr}");

    // What the script did, seen through kube-rs over the same TLS endpoint.
    let client = server.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(nodes.get_opt("python-node").await.unwrap().is_none());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    assert!(
        config_maps
            .get_opt("python-config")
            .await
            .unwrap()
            .is_none()
    );
    let kept = config_maps.get("python-kept").await.unwrap();
    assert_eq!(
        kept.data
            .unwrap_or_default()
            .get("from")
            .map(String::as_str),
        Some("python")
    );
    assert_eq!(
        kept.metadata
            .labels
            .unwrap_or_default()
            .get("client")
            .map(String::as_str),
        Some("python")
    );
    let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
    assert!(accounts.get_opt("python-sa").await.unwrap().is_some());
}
