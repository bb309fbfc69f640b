//! The etcd store when etcd members fail: upstream runs kube-apiserver on a three-member etcd
//! so that losing one member loses nothing (etcd's raft quorum, `etcd3/store.go` retrying
//! through the client's balancer).

use std::time::Duration;

use bytes::Bytes;
use ccm_testkit::etcd::Etcd;
use core_cluster::store::{EtcdOptions, EtcdStore, Store, StoreError};

/// Writes `key`, retrying what the lost member's connection failed (an unacknowledged write
/// may be retried; an acknowledged one is never lost).
async fn create_retrying(store: &EtcdStore, key: &str) -> u64 {
    for _ in 0..100 {
        match store.create(key, Bytes::from_static(b"v")).await {
            Ok(revision) => return revision,
            // A retry of a write that did commit before its answer was lost.
            Err(StoreError::AlreadyExists { .. }) => {
                return store.get(key).await.unwrap().expect("present").mod_revision;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("{key} could not be written within 10 s of losing one member of three");
}

/// A three-member etcd loses one member in the middle of a burst of writes: every
/// acknowledged write reads back, revisions keep increasing, and watches go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_member_of_three_loses_no_acknowledged_write() {
    let mut etcd = Etcd::cluster(3).await;
    // The members listen before they have elected a leader: retry until they serve.
    let store = ccm_testkit::eventually(30, "the three-member etcd serves", || async {
        EtcdStore::connect(EtcdOptions {
            endpoints: etcd.endpoints(),
            request_timeout: Duration::from_secs(2),
            ..EtcdOptions::default()
        })
        .await
        .ok()
    })
    .await;
    let base = store.current_revision().await.unwrap();
    let mut watch = store.watch("/k/", base).await.unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..50 {
        acknowledged.push((
            format!("/k/{i:03}"),
            create_retrying(&store, &format!("/k/{i:03}")).await,
        ));
    }
    etcd.members[0].stop();
    for i in 50..100 {
        acknowledged.push((
            format!("/k/{i:03}"),
            create_retrying(&store, &format!("/k/{i:03}")).await,
        ));
    }
    let revisions: Vec<u64> = acknowledged.iter().map(|(_, r)| *r).collect();
    assert!(
        revisions.windows(2).all(|w| w[0] < w[1]),
        "revisions increase: {revisions:?}"
    );
    let listed = store.list("/k/", None, None, None).await.unwrap();
    let listed: Vec<(String, u64)> = listed
        .items
        .into_iter()
        .map(|kv| (kv.key, kv.mod_revision))
        .collect();
    assert_eq!(
        listed, acknowledged,
        "every acknowledged write, as acknowledged"
    );
    // The watch saw every write, in order, across the member's loss.
    let mut seen = Vec::new();
    while seen.len() < acknowledged.len() {
        let event = tokio::time::timeout(
            Duration::from_secs(10),
            futures::StreamExt::next(&mut watch),
        )
        .await
        .expect("the watch goes on")
        .expect("not ended")
        .expect("no error");
        seen.push((event.key, event.revision));
    }
    assert_eq!(seen, acknowledged);
}
