//! Durability of `ccm apiserver`: SIGKILL in the middle of a burst of writes, restart on the
//! same data directory, and every acknowledged write is there with resourceVersions still
//! increasing.

mod support;

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, Config, api::PostParams};
use parking_lot::Mutex;
use support::ApiServerProcess;

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
