//! A store that fails loudly and watches that stay honest: a dead SQLite writer is reported
//! by `/livez`, `/readyz` and `/healthz` (kube-apiserver's `[-]etcd failed`), a write lock
//! held by another connection is waited out, a namespace Terminating at restart is
//! finalized, and bookmarks carry the current revision.

use std::{sync::Arc, time::Duration};

use axum::{Router, body::Body};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{MemoryStore, SqliteOptions, SqliteStore, Store, StoreError, WatchConfig},
};
use futures::StreamExt;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tower::ServiceExt;

/// The database file inside a SQLite store's data directory.
const DB_FILE: &str = "store.sqlite";

async fn server(store: Arc<dyn Store>, config: ApiServerConfig) -> (Router, Client) {
    let server = ApiServer::new(store, config).await.unwrap();
    let router = server.router();
    let client = Client::new(router.clone(), "default");
    (router, client)
}

/// GET `uri`: (status, body as text).
async fn get(router: &Router, uri: &str) -> (u16, String) {
    let request = axum::http::Request::builder()
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

fn configmap(name: &str, data: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"k": data}
    }))
    .unwrap()
}

fn api_error(err: kube::Error) -> kube::core::Status {
    match err {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Upstream: kube-apiserver's `/livez` and `/readyz` include the `etcd` check (and
/// `/readyz` `etcd-readiness`); a failed check makes the endpoint 500 with
/// `[-]etcd failed: reason withheld`, which is what makes a kubelet or supervisor restart
/// it. The realistic trigger is a full database: the quota (`max_db_bytes`, SQLite's
/// `max_page_count`) makes SQLite fail the write with `SQLITE_FULL`, as a full disk does.
#[tokio::test]
async fn a_dead_writer_fails_livez_readyz_and_healthz_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        max_db_bytes: Some(512 * 1024),
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(dir.path(), options).await.unwrap();
    let (router, client) = server(Arc::new(store.clone()), ApiServerConfig::default()).await;

    for endpoint in [
        "/livez",
        "/readyz",
        "/healthz",
        "/livez/etcd",
        "/readyz/ping",
    ] {
        assert_eq!(
            get(&router, endpoint).await,
            (200, "ok".into()),
            "{endpoint}"
        );
    }
    let (code, body) = get(&router, "/readyz?verbose").await;
    assert_eq!(code, 200);
    assert_eq!(
        body,
        "[+]ping ok\n[+]etcd ok\n[+]etcd-readiness ok\nreadyz check passed\n"
    );

    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut watch = cms
        .watch(&kube::api::WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();

    // Fill the quota: every acknowledged write must survive, the failing one is refused.
    let data = "x".repeat(64 * 1024);
    let mut acknowledged = Vec::new();
    let failure = loop {
        let name = format!("c{}", acknowledged.len());
        match cms
            .create(&PostParams::default(), &configmap(&name, &data))
            .await
        {
            Ok(_) => acknowledged.push(name),
            Err(e) => break api_error(e),
        }
        assert!(acknowledged.len() < 64, "the quota was never reached");
    };
    assert!(!acknowledged.is_empty());
    assert_eq!(failure.code, 500);
    assert!(failure.message.contains("full"), "{}", failure.message);

    // Later writes say why, not just "closed".
    let later = api_error(
        cms.create(&PostParams::default(), &configmap("later", "small"))
            .await
            .unwrap_err(),
    );
    assert_eq!(later.code, 500);
    assert!(
        later
            .message
            .contains("stopped writing after a failed commit")
            && later.message.contains("full"),
        "{}",
        later.message
    );

    // The health endpoints no longer lie.
    let (code, body) = get(&router, "/livez").await;
    assert_eq!(code, 500);
    assert_eq!(
        body,
        "[+]ping ok\n[-]etcd failed: reason withheld\nlivez check failed\n"
    );
    let (code, body) = get(&router, "/readyz").await;
    assert_eq!(code, 500);
    assert!(body.contains("[-]etcd failed: reason withheld\n"), "{body}");
    assert!(
        body.contains("[-]etcd-readiness failed: reason withheld\n"),
        "{body}"
    );
    assert!(body.ends_with("readyz check failed\n"), "{body}");
    assert_eq!(get(&router, "/healthz").await.0, 500);
    let (code, body) = get(&router, "/livez/etcd").await;
    assert_eq!(code, 500);
    assert!(body.starts_with("internal server error: "), "{body}");
    assert!(body.contains("full"), "{body}");
    // `exclude` skips a check, as upstream.
    let (code, body) = get(&router, "/livez?exclude=etcd&verbose").await;
    assert_eq!(
        (code, body.as_str()),
        (
            200,
            "[+]ping ok\n[+]etcd excluded: ok\nlivez check passed\n"
        )
    );
    assert!(matches!(
        store.health().await,
        Err(StoreError::Backend { .. })
    ));

    // Reads still serve what was committed; the watch saw exactly the acknowledged
    // writes and then ended.
    assert_eq!(names(&cms).await, sorted(&acknowledged));
    let mut watched = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .expect("the watch ends when the writer dies")
    {
        if let Ok(kube::api::WatchEvent::Added(cm)) = event {
            watched.push(cm.name_any());
        }
    }
    assert_eq!(watched, acknowledged);

    // A restart (what the supervisor does) reopens it with everything acknowledged.
    store.close().await.unwrap();
    let store = SqliteStore::open(dir.path(), SqliteOptions::default())
        .await
        .unwrap();
    let (router, client) = server(Arc::new(store.clone()), ApiServerConfig::default()).await;
    assert_eq!(get(&router, "/livez").await, (200, "ok".into()));
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    assert_eq!(names(&cms).await, sorted(&acknowledged));
    cms.create(&PostParams::default(), &configmap("after-restart", "v"))
        .await
        .unwrap();
    store.close().await.unwrap();
}

/// The names of the listed ConfigMaps, in the list's (name) order.
async fn names(cms: &Api<ConfigMap>) -> Vec<String> {
    let list = cms.list(&Default::default()).await.unwrap();
    list.items.iter().map(|cm| cm.name_any()).collect()
}

fn sorted(names: &[String]) -> Vec<String> {
    let mut names = names.to_vec();
    names.sort();
    names
}

/// Another connection holding the write lock (a backup tool, an operator's `sqlite3`) is
/// waited out: the batch is retried, the write lands once the lock is released, and the
/// store stays healthy throughout.
#[tokio::test]
async fn a_write_lock_held_elsewhere_is_waited_out() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(20),
        busy_attempts: 10_000,
        ..SqliteOptions::default()
    };
    let store = Arc::new(SqliteStore::open(dir.path(), options).await.unwrap());
    store.create("/k/before", "v".into()).await.unwrap();

    let other = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let writer = store.clone();
    let write = tokio::spawn(async move { writer.create("/k/during", "v".into()).await });
    // Far longer than one attempt (20 ms): a single attempt would have failed by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!write.is_finished(), "the write waits for the lock");
    assert!(
        store.health().await.is_ok(),
        "waiting for a lock is not a failure"
    );
    other.execute_batch("COMMIT").unwrap();
    assert_eq!(write.await.unwrap().unwrap(), 2);
    assert_eq!(store.create("/k/after", "v".into()).await.unwrap(), 3);
    store.close().await.unwrap();
}

/// A lock held longer than every attempt fails that write with a clear error and nothing
/// else: no revision is consumed, the writer carries on and health stays ok.
#[tokio::test]
async fn a_write_lock_held_past_every_attempt_fails_only_that_write() {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(20),
        busy_attempts: 3,
        ..SqliteOptions::default()
    };
    let store = SqliteStore::open(dir.path(), options).await.unwrap();
    let (router, client) = server(Arc::new(store.clone()), ApiServerConfig::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let before = store.current_revision().await.unwrap();

    let other = rusqlite::Connection::open(dir.path().join(DB_FILE)).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = api_error(
        cms.create(&PostParams::default(), &configmap("locked", "v"))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 500);
    assert!(
        err.message
            .contains("locked by another connection for 3 attempts"),
        "{}",
        err.message
    );
    assert_eq!(get(&router, "/livez").await, (200, "ok".into()));
    other.execute_batch("COMMIT").unwrap();

    let created = cms
        .create(&PostParams::default(), &configmap("unlocked", "v"))
        .await
        .unwrap();
    assert_eq!(created.resource_version(), Some((before + 1).to_string()));
    store.close().await.unwrap();
}

/// Upstream: the namespace controller finalizes every namespace with a
/// `deletionTimestamp` it finds, including those its initial list returns after a
/// restart; a namespace Terminating when the server stopped must not stay so forever.
#[tokio::test]
async fn a_namespace_terminating_at_restart_is_finalized() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path(), SqliteOptions::default())
        .await
        .unwrap();
    let (_, client) = server(Arc::new(store.clone()), ApiServerConfig::default()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "doomed"}})).unwrap(),
        )
        .await
        .unwrap();
    // A finalizer holds the namespace's content, so it is still Terminating at the stop.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    let mut held = configmap("held", "v");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &held).await.unwrap();
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get("doomed").await.unwrap();
    assert_eq!(
        terminating.status.and_then(|s| s.phase).as_deref(),
        Some("Terminating")
    );
    store.close().await.unwrap();

    let store = SqliteStore::open(dir.path(), SqliteOptions::default())
        .await
        .unwrap();
    let (_, client) = server(Arc::new(store.clone()), ApiServerConfig::default()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "doomed");
    // The finalizer's owner lets go; the resumed cleanup then finishes the namespace.
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match namespaces.get_opt("doomed").await.unwrap() {
                None => break,
                Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the namespace stayed Terminating after the restart"
    );
    assert!(cms.get_opt("held").await.unwrap().is_none());
    store.close().await.unwrap();
}

/// Reads newline-delimited JSON watch lines from a response body.
struct Lines {
    body: axum::body::BodyDataStream,
    buffer: Vec<u8>,
}

impl Lines {
    async fn watch(router: &Router, uri: &str) -> Self {
        let request = axum::http::Request::builder()
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        Lines {
            body: response.into_body().into_data_stream(),
            buffer: Vec::new(),
        }
    }

    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return serde_json::from_slice(&line).unwrap();
            }
            let chunk = self.body.next().await.expect("the watch ended").unwrap();
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

fn rv(event: &Value) -> u64 {
    event["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// Upstream: kube-apiserver's bookmarks carry the storage's current revision (etcd
/// progress notifications reach the watch cache even when the watched resource is
/// quiet), so a client resuming from its last bookmark is not sent 410 while the window
/// still covers that revision; events before the bookmark's revision come before it.
#[tokio::test(start_paused = true)]
async fn bookmarks_on_a_quiet_resource_carry_the_current_revision() {
    let store: Arc<dyn Store> = Arc::new(MemoryStore::with_watch_config(WatchConfig {
        window_capacity: 20,
        ..WatchConfig::default()
    }));
    let config = ApiServerConfig {
        bookmark_interval: Duration::from_secs(60),
        ..ApiServerConfig::default()
    };
    let (router, client) = server(store.clone(), config).await;
    let quiet: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let busy: Api<ConfigMap> = Api::namespaced(client, "kube-system");
    let start = store.current_revision().await.unwrap();
    let mut lines = Lines::watch(
        &router,
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={start}"
        ),
    )
    .await;

    // Another resource churns past the window; the watched one changes once in between.
    for i in 0..30 {
        busy.create(&PostParams::default(), &configmap(&format!("b{i}"), "v"))
            .await
            .unwrap();
    }
    let late = quiet
        .create(&PostParams::default(), &configmap("late", "v"))
        .await
        .unwrap();
    for i in 30..60 {
        busy.create(&PostParams::default(), &configmap(&format!("b{i}"), "v"))
            .await
            .unwrap();
    }
    let current = store.current_revision().await.unwrap();

    let added = lines.next().await;
    assert_eq!(added["type"], "ADDED");
    assert_eq!(
        rv(&added),
        late.resource_version().unwrap().parse::<u64>().unwrap()
    );
    // The next bookmark (paused time jumps to it) carries the current revision, not the
    // revision of the last configmap in `default`.
    let bookmark = lines.next().await;
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(rv(&bookmark), current);

    // Resuming from the last event's revision is 410 by now; from the bookmark it is not.
    let mut stale = Lines::watch(
        &router,
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={}",
            rv(&added)
        ),
    )
    .await;
    let error = stale.next().await;
    assert_eq!(
        (error["type"].as_str(), error["object"]["code"].as_i64()),
        (Some("ERROR"), Some(410))
    );
    let mut resumed = Lines::watch(
        &router,
        &format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={}",
            rv(&bookmark)
        ),
    )
    .await;
    let next = quiet
        .create(&PostParams::default(), &configmap("next", "v"))
        .await
        .unwrap();
    let event = resumed.next().await;
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "next");
    assert_eq!(rv(&event).to_string(), next.resource_version().unwrap());
}
