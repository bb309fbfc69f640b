//! The etcd store when etcd members fail: upstream runs kube-apiserver on a three-member etcd
//! so that losing one member costs nothing, through etcd's Go client (clientv3): its
//! balancer picks only connections that are READY, and its retry interceptor
//! (`client/v3/retry_interceptor.go`) sends a request that never reached etcd to another
//! member (`isSafeRetryMutableRPC`), a read on any `Unavailable` (`isSafeRetryImmutableRPC`).
//! No test here retries anything itself: every failure the store or an API client sees is
//! counted.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use bytes::Bytes;
use ccm_testkit::{TestServer, etcd::Etcd};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{EtcdOptions, EtcdStore, Store},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{ListParams, PostParams},
};

/// A store on `etcd`, once its members have elected a leader (they listen before).
async fn store_on(etcd: &Etcd) -> EtcdStore {
    ccm_testkit::eventually(30, "the three-member etcd serves", || async {
        EtcdStore::connect(EtcdOptions {
            endpoints: etcd.endpoints(),
            ..EtcdOptions::default()
        })
        .await
        .ok()
    })
    .await
}

/// The index of the member that leads `etcd` now (etcd's Maintenance Status: `leader` is the
/// asked member's own ID on the leader).
async fn leader(etcd: &Etcd) -> usize {
    ccm_testkit::eventually(30, "etcd has a leader", || async {
        for (index, member) in etcd.members.iter().enumerate() {
            if !member.running() {
                continue;
            }
            let Ok(mut client) = etcd_client::Client::connect([member.url()], None).await else {
                continue;
            };
            let Ok(status) = client.status().await else {
                continue;
            };
            if status.header().map(|h| h.member_id()) == Some(status.leader()) {
                return Some(index);
            }
        }
        None
    })
    .await
}

/// A three-member etcd loses one member in the middle of a burst of writes through the
/// store: no write fails (clientv3's retry interceptor: a request that never reached etcd
/// goes to another member; its balancer drops the refused member), every acknowledged write
/// reads back at its revision, revisions keep increasing, and the watch goes on. The member
/// restarted rejoins the balance set once it answers (clientv3's balancer: its connection
/// is READY again), and with another member down then, writes go on through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_one_member_of_three_fails_no_store_write_and_loses_none() {
    let mut etcd = Etcd::cluster(3).await;
    let store = store_on(&etcd).await;
    let base = store.current_revision().await.unwrap();
    let mut watch = store.watch("/k/", base).await.unwrap();
    let mut acknowledged = Vec::new();
    let all = etcd.endpoints();
    let burst = async {
        for i in 0..250 {
            if i == 50 {
                etcd.members[0].stop();
            }
            if i == 150 {
                // Member 0 back; once it is in the set again, member 1 goes.
                etcd.members[0].restart().await;
                ccm_testkit::eventually(30, "the restarted member rejoins", || async {
                    (store.available_members() == all).then_some(())
                })
                .await;
                etcd.members[1].stop();
            }
            let key = format!("/k/{i:03}");
            let revision = store
                .create(&key, Bytes::from_static(b"v"))
                .await
                .unwrap_or_else(|e| panic!("{key} failed with one member of three down: {e}"));
            acknowledged.push((key, revision));
            if i == 149 {
                assert_eq!(
                    store.available_members(),
                    all[1..],
                    "the stopped member is out of the balance set"
                );
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(90), burst)
        .await
        .expect("250 writes within 90 s");
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

/// What a burst of creates through the API server saw.
#[derive(Default)]
struct Burst {
    /// The names created (201).
    acknowledged: Vec<String>,
    /// Every failed create: its name and error.
    failed: Vec<(String, String)>,
    /// The slowest create.
    slowest: Duration,
}

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "data": {"k": "v"},
    }))
    .unwrap()
}

/// Creates ConfigMaps through `api` from `writers` concurrent writers until `stop`.
async fn burst(api: Api<ConfigMap>, writers: usize, stop: Arc<AtomicBool>) -> Burst {
    let tasks: Vec<_> = (0..writers)
        .map(|writer| {
            let (api, stop) = (api.clone(), stop.clone());
            tokio::spawn(async move {
                let mut seen = Burst::default();
                for i in 0.. {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let name = format!("w{writer}-{i}");
                    let started = Instant::now();
                    match api.create(&PostParams::default(), &config_map(&name)).await {
                        Ok(_) => seen.acknowledged.push(name),
                        Err(error) => seen.failed.push((name, error.to_string())),
                    }
                    seen.slowest = seen.slowest.max(started.elapsed());
                }
                seen
            })
        })
        .collect();
    let mut all = Burst::default();
    for task in tasks {
        let seen = task.await.expect("a writer");
        all.acknowledged.extend(seen.acknowledged);
        all.failed.extend(seen.failed);
        all.slowest = all.slowest.max(seen.slowest);
    }
    all
}

/// Runs a burst through the API server on a three-member etcd, stops the member `victim`
/// picks once 100 creates are acknowledged, and goes on for 200 more: what the burst saw,
/// and what the server lists afterwards.
async fn burst_losing_a_member(
    victim: impl AsyncFnOnce(&Etcd) -> usize,
) -> (Burst, BTreeSet<String>) {
    let mut etcd = Etcd::cluster(3).await;
    let store: Arc<dyn Store> = Arc::new(store_on(&etcd).await);
    let server = ApiServer::new(store, ApiServerConfig::default())
        .await
        .unwrap();
    let server = TestServer::start(server).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.admin_client().await.unwrap(), "default");
    let stop = Arc::new(AtomicBool::new(false));
    let writes = tokio::spawn(burst(api.clone(), 8, stop.clone()));
    let count = || async {
        api.list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .ok()
    };
    ccm_testkit::eventually(60, "100 creates acknowledged", || async {
        count().await.filter(|&n| n >= 100)
    })
    .await;
    let victim = victim(&etcd).await;
    etcd.members[victim].stop();
    ccm_testkit::eventually(60, "200 more creates acknowledged", || async {
        count().await.filter(|&n| n >= 300)
    })
    .await;
    stop.store(true, Ordering::Release);
    let seen = tokio::time::timeout(Duration::from_secs(60), writes)
        .await
        .expect("the writers stop within 60 s")
        .unwrap();
    let listed = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .filter(|name| name.starts_with('w'))
        .collect();
    (seen, listed)
}

/// Asserts that the burst saw no failure and that the server lists exactly what it
/// acknowledged.
fn assert_nothing_failed_or_lost(seen: &Burst, listed: &BTreeSet<String>) {
    assert!(
        seen.failed.is_empty(),
        "{} of {} creates failed, e.g. {:?}",
        seen.failed.len(),
        seen.failed.len() + seen.acknowledged.len(),
        &seen.failed[..seen.failed.len().min(3)]
    );
    let acknowledged: BTreeSet<String> = seen.acknowledged.iter().cloned().collect();
    let lost: Vec<&String> = acknowledged.difference(listed).collect();
    assert!(lost.is_empty(), "acknowledged, then missing: {lost:?}");
    assert_eq!(
        listed, &acknowledged,
        "the server lists exactly the acknowledged creates"
    );
}

/// One member of three (a follower) is killed during a burst of creates through the API
/// server over HTTPS: no create fails and none is lost. clientv3's rules: its retry
/// interceptor sends a request that never reached etcd (connection refused) to another
/// member, write or not (`isSafeRetryMutableRPC`), and its balancer stops picking the
/// refused member; one whose outcome is unknown (the connection broke under it) is settled
/// on its compared revision, never applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_follower_of_three_mid_burst_fails_no_write_through_the_api_server() {
    let (seen, listed) = tokio::time::timeout(
        Duration::from_secs(180),
        burst_losing_a_member(async |etcd: &Etcd| (leader(etcd).await + 1) % 3),
    )
    .await
    .expect("the burst ends within 180 s");
    assert_nothing_failed_or_lost(&seen, &listed);
}

/// The leader of three is killed during a burst of creates through the API server: writes
/// stall while etcd elects a new leader (requests the old leader held time out and are
/// settled; a member without a leader turns requests away, clientv3's require-leader,
/// and they go to another), and then go on; none fails and none is lost, and no create
/// waits longer than two request timeouts (10 s) plus etcd's election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_of_three_mid_burst_stalls_writes_but_fails_none() {
    let (seen, listed) = tokio::time::timeout(
        Duration::from_secs(180),
        burst_losing_a_member(async |etcd: &Etcd| leader(etcd).await),
    )
    .await
    .expect("the burst ends within 180 s");
    assert_nothing_failed_or_lost(&seen, &listed);
    assert!(
        seen.slowest < Duration::from_secs(15),
        "the slowest create took {:?}",
        seen.slowest
    );
}
