//! The etcd backend beside SQLite, in one run on the same disk (both data directories in
//! the system's temporary directory): durable Lease renewals per second at 64 concurrent
//! clients through the API server on SQLite and on etcd, and raw etcd writes at 64 clients
//! (etcd-client directly, values of the stored Lease's size: plain puts, and the
//! compare-on-mod-revision transaction the etcd store makes per update, alone and while a
//! watch with previous values follows it), and each store's own updates at 64 writers
//! without the API server (what the API path costs apart); the latency of a list of 10,000
//! Nodes on each backend; watch fan-out (watchers × events: delivered events per second and
//! the slowest watcher's lag behind the last write). Not a test: figures go to
//! BENCHMARKS.md.
//!
//! The API server is driven in-process (its router, kube-rs as the client, no TLS), so the
//! figures are the server's and the store's, not the network's. Needs etcd (`$CCM_ETCD`,
//! `scripts/etcd.sh`).
//!
//! `cargo bench -p core-cluster --bench etcd_scale` (optionally `-- --runs 3 --renewals 50
//! --nodes 10000 --watchers 100 --events 1000`).

#![allow(missing_docs, clippy::disallowed_types)]

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use ccm_testkit::{
    bench::{arg, full_run},
    etcd::Etcd,
};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{EtcdOptions, EtcdStore, SqliteOptions, SqliteStore, Store},
};
use k8s_openapi::{
    api::{coordination::v1::Lease, core::v1::Node},
    apimachinery::pkg::apis::meta::v1::MicroTime,
};
use kube::{
    Api, Client,
    api::{PostParams, WatchParams},
};
use serde_json::json;
use tower::ServiceExt as _;

const CLIENTS: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct Backend {
    name: &'static str,
    server: ApiServer,
    store: Arc<dyn Store>,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite_backend() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap(),
    );
    Backend {
        name: "SQLite",
        server: ApiServer::new(store.clone(), ApiServerConfig::default())
            .await
            .unwrap(),
        store,
        _dir: Some(dir),
    }
}

/// The etcd store, with its copies of recently written keys for updates' first read, or
/// (`recent_writes` 0) without: every update then reads the key before its transaction.
async fn etcd_backend(etcd: &Etcd, recent_writes: usize) -> Backend {
    let store: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(EtcdOptions {
            endpoints: etcd.endpoints(),
            recent_writes,
            ..EtcdOptions::default()
        })
        .await
        .unwrap(),
    );
    Backend {
        name: if recent_writes == 0 {
            "etcd, no recent copies"
        } else {
            "etcd"
        },
        server: ApiServer::new(store.clone(), ApiServerConfig::default())
            .await
            .unwrap(),
        store,
        _dir: None,
    }
}

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                 "renewTime": MicroTime(jiff::Timestamp::now())}
    }))
    .unwrap()
}

/// Creates 64 Leases named after `tag` and returns the stored size of one.
async fn create_leases(backend: &Backend, tag: &str) -> (Api<Lease>, usize) {
    let api: Api<Lease> = Api::namespaced(
        Client::new(backend.server.router(), "default"),
        "kube-node-lease",
    );
    for c in 0..CLIENTS {
        api.create(&PostParams::default(), &lease(&format!("{tag}-c{c}")))
            .await
            .unwrap();
    }
    let stored = backend
        .store
        .get(&format!(
            "/registry/coordination.k8s.io/leases/kube-node-lease/{tag}-c0"
        ))
        .await
        .unwrap()
        .map_or(0, |kv| kv.value.len());
    (api, stored)
}

/// Renewals per second: each of 64 clients renews its own Lease `renewals` times (a PUT of
/// the Lease it last got back, as kubelet's lease controller does).
async fn renewals(api: &Api<Lease>, tag: &str, renewals: usize) -> f64 {
    let start = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let api = api.clone();
            let name = format!("{tag}-c{c}");
            tokio::spawn(async move {
                let mut held = api.get(&name).await.unwrap();
                for _ in 0..renewals {
                    held.spec.as_mut().unwrap().renew_time =
                        Some(MicroTime(jiff::Timestamp::now()));
                    held = api
                        .replace(&name, &PostParams::default(), &held)
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    writes_per_second(start, tasks, renewals).await
}

/// Awaits the 64 clients' tasks, each of which made `writes` writes, and returns their
/// writes per second since `start`.
async fn writes_per_second(
    start: Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    writes: usize,
) -> f64 {
    for t in tasks {
        t.await.unwrap();
    }
    (CLIENTS * writes) as f64 / start.elapsed().as_secs_f64()
}

/// The store's own updates per second at 64 writers, below the API server: each writer
/// updates its own key `writes` times with a value of `size` bytes, compared on the mod
/// revision its last write returned (what the API server's update asks of the store).
async fn store_updates(store: &Arc<dyn Store>, tag: &str, writes: usize, size: usize) -> f64 {
    let value = bytes::Bytes::from(vec![b'x'; size]);
    let mut keys = Vec::with_capacity(CLIENTS);
    for c in 0..CLIENTS {
        let key = format!("/registry/bench-store/{tag}-c{c}");
        let revision = store.create(&key, value.clone()).await.unwrap();
        keys.push((key, revision));
    }
    let start = Instant::now();
    let tasks: Vec<_> = keys
        .into_iter()
        .map(|(key, mut revision)| {
            let (store, value) = (store.clone(), value.clone());
            tokio::spawn(async move {
                for _ in 0..writes {
                    revision = store
                        .update(&key, value.clone(), Some(revision))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    writes_per_second(start, tasks, writes).await
}

/// Raw etcd writes per second at 64 clients on one connection, each client writing its own
/// key `writes` times with a value of `size` bytes: plain puts, or (`txn`) the transaction
/// the etcd store makes per update (put if the key's mod revision is the last one written).
/// With `watched`, a watch with previous values (as the etcd store's feed, and upstream's
/// cacher, keep) follows the writes and only counts them: the floor of what any store with
/// Kubernetes' semantics asks of etcd.
async fn raw_etcd(
    etcd: &Etcd,
    run: usize,
    writes: usize,
    size: usize,
    txn: bool,
    watched: bool,
) -> f64 {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp, WatchOptions};
    let client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .unwrap();
    let value = vec![b'x'; size];
    let prefix = format!(
        "/raw/{}{}/r{run}-",
        if txn { "txn" } else { "put" },
        if watched { "-watched" } else { "" }
    );
    let follower = if watched {
        let mut stream = client
            .watch_client()
            .watch(
                prefix.clone(),
                Some(WatchOptions::new().with_prefix().with_prev_key()),
            )
            .await
            .unwrap();
        let expected = CLIENTS * (writes + 1);
        Some(tokio::spawn(async move {
            let mut seen = 0;
            while seen < expected {
                let Some(response) = stream.message().await.unwrap() else {
                    break;
                };
                seen += response.events().len();
            }
        }))
    } else {
        None
    };
    let start = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (mut kv, value) = (client.kv_client(), value.clone());
            let key = format!("{prefix}c{c}");
            tokio::spawn(async move {
                let mut revision = kv
                    .put(key.clone(), value.clone(), None)
                    .await
                    .unwrap()
                    .header()
                    .unwrap()
                    .revision();
                for _ in 0..writes {
                    if txn {
                        let t = Txn::new()
                            .when([Compare::mod_revision(
                                key.clone(),
                                CompareOp::Equal,
                                revision,
                            )])
                            .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                            .or_else([TxnOp::get(key.clone(), None)]);
                        let response = kv.txn(t).await.unwrap();
                        assert!(response.succeeded());
                        revision = response.header().unwrap().revision();
                    } else {
                        kv.put(key.clone(), value.clone(), None).await.unwrap();
                    }
                }
            })
        })
        .collect();
    let rate = writes_per_second(start, tasks, writes).await;
    if let Some(follower) = follower {
        follower.await.unwrap();
    }
    rate
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m5.large",
            "topology.kubernetes.io/zone": "fake-region-1a",
        }},
        "spec": {"providerID": format!("fake://{name}"), "podCIDR": "10.244.0.0/24"},
        "status": {
            "capacity": {"cpu": "2", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "2", "memory": "7Gi", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"machineID": "m", "systemUUID": "u", "bootID": "b",
                         "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12",
                         "containerRuntimeVersion": "containerd://1.7.0",
                         "kubeletVersion": "v1.33.0", "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64"},
        },
    }))
    .unwrap()
}

/// Creates `count` Nodes through the API server with 64 clients.
async fn create_nodes(backend: &Backend, count: usize) {
    let api: Api<Node> = Api::all(Client::new(backend.server.router(), "default"));
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let api = api.clone();
            tokio::spawn(async move {
                for i in (c..count).step_by(CLIENTS) {
                    api.create(&PostParams::default(), &node(&format!("node-{i:05}")))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// One `GET /api/v1/nodes` through the router, the whole body read: its duration and size.
async fn list_nodes(backend: &Backend, expected: usize) -> (Duration, usize) {
    let start = Instant::now();
    let response = backend
        .server
        .router()
        .oneshot(
            axum::http::Request::get("/api/v1/nodes")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let elapsed = start.elapsed();
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), expected);
    (elapsed, body.len())
}

/// `watchers` watches of ConfigMaps in `default`, then `events` ConfigMaps created by 16
/// writers: delivered events per second (from the first write to the last delivery) and
/// the slowest watcher's lag behind the last acknowledged write.
async fn fan_out(backend: &Backend, run: usize, watchers: usize, events: usize) -> (f64, Duration) {
    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::ConfigMap;
    let client = Client::new(backend.server.router(), "default");
    let ns = format!("fan-out-{run}");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(watchers);
    let mut watching = Vec::new();
    for _ in 0..watchers {
        let (api, rv, ready) = (api.clone(), rv.clone(), ready_tx.clone());
        watching.push(tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default().timeout(290), &rv)
                .await
                .unwrap()
                .boxed();
            ready.send(()).await.unwrap();
            let mut seen = 0;
            while seen < events {
                match stream.next().await {
                    Some(Ok(kube::api::WatchEvent::Added(_))) => seen += 1,
                    Some(Ok(_)) => {}
                    other => panic!("the watch ended after {seen} events: {other:?}"),
                }
            }
            Instant::now()
        }));
    }
    for _ in 0..watchers {
        ready_rx.recv().await.unwrap();
    }
    let start = Instant::now();
    let writers: Vec<_> = (0..16)
        .map(|w| {
            let api = api.clone();
            tokio::spawn(async move {
                for i in (w..events).step_by(16) {
                    let cm = serde_json::from_value(json!({
                        "metadata": {"name": format!("cm-{i:05}")}, "data": {"k": "v"},
                    }))
                    .unwrap();
                    api.create(&PostParams::default(), &cm).await.unwrap();
                }
                Instant::now()
            })
        })
        .collect();
    let mut last_write = start;
    for w in writers {
        last_write = last_write.max(w.await.unwrap());
    }
    let mut last_delivery = start;
    for w in watching {
        last_delivery = last_delivery.max(w.await.unwrap());
    }
    let rate = (watchers * events) as f64 / (last_delivery - start).as_secs_f64();
    (rate, last_delivery.saturating_duration_since(last_write))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let full = full_run();
    let runs: usize = arg("--runs", if full { 3 } else { 1 });
    let per_client: usize = arg("--renewals", if full { 50 } else { 2 });
    let nodes: usize = arg("--nodes", if full { 10_000 } else { 100 });
    let watchers: usize = arg("--watchers", if full { 100 } else { 4 });
    let events: usize = arg("--events", if full { 1000 } else { 20 });
    let etcd = Etcd::start().await;
    // Raw writes go to an etcd of their own, which no store's watch follows.
    let raw = Etcd::start().await;
    let backends = [sqlite_backend().await, etcd_backend(&etcd, 10_000).await];
    // The etcd store as it was before updates started from a recent copy, for the
    // renewals only, on an etcd of its own: on the same etcd its watch would double the
    // events etcd sends and decode while the other backend is measured.
    let before_etcd = Etcd::start().await;
    let before = etcd_backend(&before_etcd, 0).await;
    println!(
        "etcd_scale: {runs} runs; {CLIENTS} clients × {per_client} renewals; {nodes} Nodes; \
         {watchers} watchers × {events} events; data in {}",
        std::env::temp_dir().display()
    );

    // Renewals, the backends and raw etcd interleaved run by run.
    let renewing = [&backends[0], &backends[1], &before];
    let names = [
        "API server on SQLite",
        "API server on etcd",
        "API server on etcd, no recent copies",
        "raw etcd put",
        "raw etcd txn (compare-and-put)",
        "SQLite store alone (no API server)",
        "etcd store alone (no API server)",
        "raw etcd txn, watched with previous values",
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut size = 0;
    for run in 0..runs {
        for (i, backend) in renewing.iter().enumerate() {
            let tag = format!("b{i}-r{run}");
            let (api, stored) = create_leases(backend, &tag).await;
            if i == 1 {
                size = stored;
            }
            rates[i].push(renewals(&api, &tag, per_client).await);
        }
        rates[3].push(raw_etcd(&raw, run, per_client, size, false, false).await);
        rates[4].push(raw_etcd(&raw, run, per_client, size, true, false).await);
        rates[7].push(raw_etcd(&raw, run, per_client, size, true, true).await);
        for (i, backend) in backends.iter().enumerate() {
            let tag = format!("s{i}-r{run}");
            rates[5 + i].push(store_updates(&backend.store, &tag, per_client, size).await);
        }
        let line: Vec<String> = names
            .iter()
            .zip(&rates)
            .map(|(name, r)| format!("{name} {:.0}/s", r[run]))
            .collect();
        println!("  run {run}: {}", line.join(", "));
    }
    let medians: Vec<f64> = rates.iter().map(|r| median(r.clone())).collect();
    println!("Lease renewals at {CLIENTS} clients (median of {runs}), stored Lease {size} B:");
    for (name, rate) in names.iter().zip(&medians) {
        println!(
            "  {name:<44} {rate:>8.0}/s  ({:.0} % of raw put)",
            100.0 * rate / medians[3]
        );
    }

    // A list of many Nodes.
    for backend in &backends {
        let start = Instant::now();
        create_nodes(backend, nodes).await;
        let created = start.elapsed();
        let mut lists = Vec::new();
        let mut bytes = 0;
        for _ in 0..runs.max(3) {
            let (elapsed, size) = list_nodes(backend, nodes).await;
            lists.push(elapsed.as_secs_f64() * 1000.0);
            bytes = size;
        }
        println!(
            "{}: {nodes} Nodes created in {:.1} s ({:.0}/s); list: median {:.0} ms of {:?} ms, {} KiB",
            backend.name,
            created.as_secs_f64(),
            nodes as f64 / created.as_secs_f64(),
            median(lists.clone()),
            lists.iter().map(|l| l.round()).collect::<Vec<_>>(),
            bytes / 1024
        );
    }

    // Watch fan-out.
    for backend in &backends {
        let mut delivered = Vec::new();
        let mut lags = Vec::new();
        for run in 0..runs {
            let (rate, lag) = fan_out(backend, run, watchers, events).await;
            delivered.push(rate);
            lags.push(lag.as_secs_f64() * 1000.0);
        }
        println!(
            "{}: watch fan-out {watchers} × {events}: median {:.0} events/s delivered, slowest \
             watcher {:.0} ms behind the last write (runs: {:?} /s, {:?} ms)",
            backend.name,
            median(delivered.clone()),
            median(lags.clone()),
            delivered.iter().map(|d| d.round()).collect::<Vec<_>>(),
            lags.iter().map(|l| l.round()).collect::<Vec<_>>(),
        );
    }
}
