//! Durability of `ccm apiserver`: SIGKILL in the middle of a burst of writes, restart on the
//! same data directory, and every acknowledged write is there with resourceVersions still
//! increasing; a full store (`--quota-backend-bytes`) is reported and loses nothing.

use std::{sync::Arc, time::Duration};

use crate::support::ApiServerProcess;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, Config, api::PostParams};
use parking_lot::Mutex;

async fn client(server: &ApiServerProcess) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig()).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ApiServerProcess::start(dir.path());
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    let acked: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..16 {
        let cms = cms.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let name = format!("w{w}-{i}");
                let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"i": i.to_string()}
                })).unwrap();
                match cms.create(&PostParams::default(), &cm).await {
                    Ok(created) => {
                        let rv = created.metadata.resource_version.unwrap().parse().unwrap();
                        acked.lock().push((name, rv));
                    }
                    Err(_) => break,
                }
            }
        }));
    }
    // Let the burst run, then kill the server mid-flight.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while acked.lock().len() < 400 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes too slow: {}",
            acked.lock().len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    server.kill();
    for w in writers {
        let _ = w.await;
    }
    let acked = acked.lock().clone();
    let max_rv = acked.iter().map(|(_, rv)| *rv).max().unwrap();

    let restarted = ApiServerProcess::start(dir.path());
    let cms: Api<ConfigMap> = Api::namespaced(client(&restarted).await, "default");
    let mut missing = Vec::new();
    for (name, rv) in &acked {
        match cms.get_opt(name).await.unwrap() {
            Some(cm) => assert_eq!(
                cm.metadata
                    .resource_version
                    .unwrap()
                    .parse::<u64>()
                    .unwrap(),
                *rv,
                "{name}"
            ),
            None => missing.push(name.clone()),
        }
    }
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let after: ConfigMap = serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after-restart"}})).unwrap();
    let rv: u64 = cms
        .create(&PostParams::default(), &after)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv > max_rv, "resourceVersion went back: {rv} <= {max_rv}");
    assert!(acked.len() >= 400);
}

/// `--quota-backend-bytes` (etcd's flag) bounds the store: once it is full, writes fail,
/// `/readyz` reports `[-]etcd failed` as kube-apiserver does with a dead etcd, and every
/// acknowledged write is still readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_quota_is_reported_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = ApiServerProcess::start_with(dir.path(), &["--quota-backend-bytes=1048576"]);
    assert_eq!(server.kubectl_ok(&["get", "--raw", "/readyz"]), "ok");
    let cms: Api<ConfigMap> = Api::namespaced(client(&server).await, "default");
    let data = "x".repeat(64 * 1024);
    let mut acknowledged = Vec::new();
    let refused = loop {
        let name = format!("c{}", acknowledged.len());
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"d": data}
        }))
        .unwrap();
        match cms.create(&PostParams::default(), &cm).await {
            Ok(_) => acknowledged.push(name),
            Err(kube::Error::Api(status)) => break status,
            Err(other) => panic!("unexpected error: {other}"),
        }
        assert!(acknowledged.len() < 64, "1 MiB was never full");
    };
    assert_eq!(refused.code, 500);
    assert!(refused.message.contains("full"), "{}", refused.message);
    assert!(!acknowledged.is_empty());

    let readyz = server.kubectl(&["get", "--raw", "/readyz?verbose"]);
    assert!(!readyz.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&readyz.stdout),
        String::from_utf8_lossy(&readyz.stderr)
    );
    assert!(said.contains("[-]etcd failed"), "{said}");
    for name in &acknowledged {
        let cm = cms.get(name).await.unwrap();
        assert_eq!(cm.data.unwrap()["d"].len(), 64 * 1024, "{name}");
    }
}
