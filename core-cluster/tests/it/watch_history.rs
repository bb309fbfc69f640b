//! The SQLite store's watch history survives a restart, as kine's does (`pkg/logstructured/
//! sqllog`: the table is the event log): a client whose watch broke when the API server
//! restarted resumes from its last resourceVersion and misses nothing.

use std::{sync::Arc, time::Duration};

use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{SqliteOptions, SqliteStore, Store},
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams, WatchEvent, WatchParams},
};

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": "1"}
    }))
    .unwrap()
}

/// Writes made before a restart, after the watcher's last resourceVersion, are replayed to a
/// watch resumed from it on the restarted server (ADDED, MODIFIED, DELETED, in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_after_a_restart_from_a_recent_resource_version_gets_every_event() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Arc::new(
        SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap(),
    );
    let store: Arc<dyn Store> = sqlite.clone();
    let server = ApiServer::new(store, ApiServerConfig::default())
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(Client::new(server.router(), "default"), "default");
    let seen = api
        .create(&PostParams::default(), &config_map("seen"))
        .await
        .unwrap();
    let last_seen = seen.metadata.resource_version.unwrap();
    api.create(&PostParams::default(), &config_map("missed"))
        .await
        .unwrap();
    let mut changed = api.get("missed").await.unwrap();
    changed.data = Some([("v".to_owned(), "2".to_owned())].into());
    api.replace("missed", &PostParams::default(), &changed)
        .await
        .unwrap();
    api.delete("seen", &DeleteParams::default()).await.unwrap();
    drop((api, server));
    sqlite.close().await.unwrap();
    let store = SqliteStore::open(dir.path(), SqliteOptions::default())
        .await
        .expect("the closed store reopens");
    let server = ApiServer::new(Arc::new(store), ApiServerConfig::default())
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(Client::new(server.router(), "default"), "default");
    let mut watch = Box::pin(
        api.watch(&WatchParams::default(), &last_seen)
            .await
            .expect("a recent resourceVersion is still watchable after the restart"),
    );
    let mut events = Vec::new();
    while events.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("replayed at once")
            .expect("the watch goes on")
            .unwrap();
        match event {
            WatchEvent::Added(cm) => events.push(("ADDED", cm.metadata.name.unwrap())),
            WatchEvent::Modified(cm) => events.push(("MODIFIED", cm.metadata.name.unwrap())),
            WatchEvent::Deleted(cm) => events.push(("DELETED", cm.metadata.name.unwrap())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(
        events,
        [
            ("ADDED", "missed".to_owned()),
            ("MODIFIED", "missed".to_owned()),
            ("DELETED", "seen".to_owned()),
        ]
    );
}
