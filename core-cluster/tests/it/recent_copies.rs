//! An update starts from the store's recent copy of the object when the store keeps one
//! (etcd, from its watch), as kube-apiserver's `GuaranteedUpdate` starts from the watch
//! cache's object (`staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`,
//! `origStateIsCurrent`): the write is compared on the copy's revision, so a stale copy
//! (another server wrote since) costs a read and a retry, never a wrong answer.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{KeyValue, ListResult, MemoryStore, Store, StoreError, WatchStream},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client, api::PostParams};
use serde_json::json;

const KEY: &str = "/registry/core/configmaps/default/settings";

/// A memory store that offers `copy` as its recent copy of [`KEY`] and counts the reads
/// of that key.
#[derive(Default)]
struct CopyingStore {
    inner: MemoryStore,
    copy: parking_lot::Mutex<Option<KeyValue>>,
    reads: AtomicUsize,
}

#[async_trait::async_trait]
impl Store for CopyingStore {
    fn recent(&self, key: &str) -> Option<KeyValue> {
        (key == KEY).then(|| self.copy.lock().clone()).flatten()
    }
    async fn get(&self, key: &str) -> Result<Option<KeyValue>, StoreError> {
        if key == KEY {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.get(key).await
    }
    async fn list(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        limit: Option<usize>,
        at_revision: Option<u64>,
    ) -> Result<ListResult, StoreError> {
        self.inner
            .list(prefix, start_after, limit, at_revision)
            .await
    }
    async fn create(&self, key: &str, value: bytes::Bytes) -> Result<u64, StoreError> {
        self.inner.create(key, value).await
    }
    async fn update(
        &self,
        key: &str,
        value: bytes::Bytes,
        expected_mod_revision: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.inner.update(key, value, expected_mod_revision).await
    }
    async fn delete(
        &self,
        key: &str,
        expected_mod_revision: Option<u64>,
    ) -> Result<(u64, KeyValue), StoreError> {
        self.inner.delete(key, expected_mod_revision).await
    }
    async fn current_revision(&self) -> Result<u64, StoreError> {
        self.inner.current_revision().await
    }
    async fn health(&self) -> Result<(), StoreError> {
        self.inner.health().await
    }
    async fn watch(&self, prefix: &str, from_revision: u64) -> Result<WatchStream, StoreError> {
        self.inner.watch(prefix, from_revision).await
    }
    async fn compact(&self, revision: u64) -> Result<(), StoreError> {
        self.inner.compact(revision).await
    }
}

async fn setup() -> (Arc<CopyingStore>, Api<ConfigMap>, ConfigMap) {
    let store = Arc::new(CopyingStore::default());
    let server = ApiServer::new(store.clone(), ApiServerConfig::default())
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(Client::new(server.router(), "default"), "default");
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "settings"}, "data": {"v": "0"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    (store, api, created)
}

fn with_value(cm: &ConfigMap, v: &str) -> ConfigMap {
    let mut cm = cm.clone();
    cm.data = Some([("v".to_owned(), v.to_owned())].into());
    cm
}

/// With a current copy, the update is one compare-and-put: the key is not read first.
#[tokio::test]
async fn an_update_starts_from_the_stores_recent_copy_without_reading_the_key() {
    let (store, api, created) = setup().await;
    *store.copy.lock() = store.inner.get(KEY).await.unwrap();
    store.reads.store(0, Ordering::SeqCst);
    let updated = api
        .replace(
            "settings",
            &PostParams::default(),
            &with_value(&created, "1"),
        )
        .await
        .unwrap();
    assert_eq!(updated.data.unwrap()["v"], "1");
    assert_eq!(
        store.reads.load(Ordering::SeqCst),
        0,
        "no read before the write"
    );
}

/// `origStateIsCurrent`: a copy behind the last write neither refuses a client that holds
/// the current resourceVersion (409 only after a read confirms it) nor lets a stale one
/// through.
#[tokio::test]
async fn an_update_from_a_stale_copy_reads_the_key_and_answers_as_from_the_store() {
    let (store, api, created) = setup().await;
    let stale = store.inner.get(KEY).await.unwrap();
    let second = api
        .replace(
            "settings",
            &PostParams::default(),
            &with_value(&created, "1"),
        )
        .await
        .unwrap();
    *store.copy.lock() = stale;

    let third = api
        .replace(
            "settings",
            &PostParams::default(),
            &with_value(&second, "2"),
        )
        .await
        .expect("the current resourceVersion is accepted despite the stale copy");
    assert_eq!(third.data.clone().unwrap()["v"], "2");
    assert!(store.reads.load(Ordering::SeqCst) > 0, "the key was read");

    match api
        .replace(
            "settings",
            &PostParams::default(),
            &with_value(&second, "3"),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("an outdated resourceVersion must get 409: {other:?}"),
    }
    // No precondition: the write lands on the current object, not the stale copy.
    let mut unconditional = with_value(&third, "4");
    unconditional.metadata.resource_version = None;
    let fourth = api
        .replace("settings", &PostParams::default(), &unconditional)
        .await
        .unwrap();
    assert_eq!(fourth.data.unwrap()["v"], "4");
    let stored: serde_json::Value =
        serde_json::from_slice(&store.inner.get(KEY).await.unwrap().unwrap().value).unwrap();
    assert_eq!(stored["data"]["v"], "4");
}
