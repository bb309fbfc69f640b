//! API server benchmark over real HTTPS (TLS, client certificate) on loopback, on the
//! durable SQLite store: durable create and update (Lease renewal) throughput with 1 and 64
//! concurrent clients, and watch fan-out to 100 watchers. Not a test: figures go to
//! BENCHMARKS.md.
//!
//! Renewals run three ways with 64 clients: the admin (`system:masters`, the authorizer's
//! shortcut) multiplexing one connection, the admin with one connection per client, and 64
//! node identities (`system:node:<name>` client certificates, one connection each, so the
//! Node authorizer and NodeRestriction are on every request, as for real kubelets).
//!
//! `cargo bench -p core-cluster --bench apiserver` (optionally `-- --seconds 3 --runs 3`;
//! `--nodes-only 1` runs only the renewals of the 64 node identities and of their
//! one-connection-per-client admin baseline).

#![allow(missing_docs, clippy::disallowed_types)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ccm_testkit::{TestServer, bench::arg};
use core_cluster::{
    ApiServer, ApiServerConfig,
    store::{SqliteOptions, SqliteStore, Store},
};
use futures::StreamExt;
use k8s_openapi::{api::coordination::v1::Lease, apimachinery::pkg::apis::meta::v1::MicroTime};
use kube::{
    Api,
    api::{PostParams, WatchEvent, WatchParams},
};
use serde_json::json;

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}
    }))
    .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Creates as many Leases as it can in `seconds`, with `clients` concurrent tasks.
async fn creates(api: &Api<Lease>, clients: usize, seconds: u64, run: usize) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (api, stop, done) = (api.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    api.create(
                        &PostParams::default(),
                        &lease(&format!("c{clients}-r{run}-{c}-{i}")),
                    )
                    .await
                    .unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Each client renews its own Lease (as a kubelet does: PUT with the cached object) as fast
/// as possible for `seconds`; a client is the `Api` it talks through and its Lease's name.
async fn renewals(clients: &[(Api<Lease>, String)], seconds: u64) -> (f64, Vec<f64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .cloned()
        .map(|(api, name)| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut current = match api.get_opt(&name).await.unwrap() {
                    Some(l) => l,
                    None => api
                        .create(&PostParams::default(), &lease(&name))
                        .await
                        .unwrap(),
                };
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    current.spec.as_mut().unwrap().renew_time =
                        Some(MicroTime(jiff::Timestamp::now()));
                    let t = Instant::now();
                    current = api
                        .replace(&name, &PostParams::default(), &current)
                        .await
                        .unwrap();
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let rate = all.len() as f64 / start.elapsed().as_secs_f64();
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (rate, all)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p) as usize]
}

/// `clients` renewers sharing one `api` (one connection), Leases `renew-<i>`.
fn shared(api: &Api<Lease>, clients: usize) -> Vec<(Api<Lease>, String)> {
    (0..clients)
        .map(|c| (api.clone(), format!("renew-{c}")))
        .collect()
}

/// 64 renewers, each with its own client (connection): as the admin, Leases `conn-<i>`, or
/// as the node `bench-node-<i>` (its client certificate, its own Lease).
async fn own_connections(served: &TestServer, as_nodes: bool) -> Vec<(Api<Lease>, String)> {
    let mut clients = Vec::new();
    for c in 0..64 {
        let (kubeconfig, name) = if as_nodes {
            let name = format!("bench-node-{c}");
            let user = format!("system:node:{name}");
            (
                served.kubeconfig_for(&user, &["system:nodes"]).unwrap(),
                name,
            )
        } else {
            (served.admin_kubeconfig(), format!("conn-{c}"))
        };
        let client = served.client(&kubeconfig).await.unwrap();
        clients.push((Api::namespaced(client, "kube-node-lease"), name));
    }
    clients
}

/// `runs` renewal runs of each set of clients, the sets taking turns so that they share
/// the machine's load alike; per set, the median rate, p50 and p99.
async fn renewal_runs(
    sets: &[Vec<(Api<Lease>, String)>],
    seconds: u64,
    runs: usize,
) -> Vec<(f64, f64, f64)> {
    let mut samples = vec![(Vec::new(), Vec::new(), Vec::new()); sets.len()];
    for _ in 0..runs {
        for (clients, (rates, p50, p99)) in sets.iter().zip(samples.iter_mut()) {
            let (rate, lat) = renewals(clients, seconds).await;
            rates.push(rate);
            p50.push(pct(&lat, 0.5));
            p99.push(pct(&lat, 0.99));
        }
    }
    samples
        .into_iter()
        .map(|(rates, p50, p99)| (median(rates), median(p50), median(p99)))
        .collect()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let seconds: u64 = arg("--seconds", 3);
    let runs: usize = arg("--runs", 3);
    let nodes_only = arg::<u64>("--nodes-only", 0) != 0;
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path(), SqliteOptions::default())
            .await
            .unwrap(),
    );
    let server = ApiServer::new(store, ApiServerConfig::default())
        .await
        .unwrap();
    // Over TLS with the admin's client certificate, as every client of the cluster talks.
    let served = TestServer::start(server).await.unwrap();
    let client = served.admin_client().await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");

    println!(
        "durable API server benchmark: HTTPS (TLS 1.3, client certificate) on loopback, SqliteStore (WAL, synchronous=FULL, group commit), {runs} runs of {seconds}s, median"
    );
    for clients in [1usize, 64] {
        if nodes_only {
            break;
        }
        let mut rates = Vec::new();
        for run in 0..runs {
            rates.push(creates(&api, clients, seconds, run).await);
        }
        println!(
            "create  clients={clients:>2}  {:>8.0} objects/s",
            median(rates)
        );
    }
    for clients in [1usize, 64] {
        if nodes_only {
            break;
        }
        let (rate, p50, p99) = renewal_runs(&[shared(&api, clients)], seconds, runs).await[0];
        println!(
            "update  clients={clients:>2}  {rate:>8.0} lease renewals/s  (p50 {p50:.2} ms, p99 {p99:.2} ms)"
        );
    }
    let sets = [
        own_connections(&served, false).await,
        own_connections(&served, true).await,
    ];
    let results = renewal_runs(&sets, seconds, runs).await;
    for (who, (rate, p50, p99)) in [
        "admin, one connection each  ",
        "node identities (Node authz)",
    ]
    .iter()
    .zip(results)
    {
        println!(
            "update  clients=64 {who} {rate:>8.0} lease renewals/s  (p50 {p50:.2} ms, p99 {p99:.2} ms)"
        );
    }
    if nodes_only {
        served.stop().await.unwrap();
        return;
    }

    // Watch fan-out: 100 watchers on all Leases while 64 clients renew.
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let received = Arc::new(AtomicU64::new(0));
    let mut watchers = Vec::new();
    for _ in 0..100 {
        let (api, received, rv) = (api.clone(), received.clone(), rv.clone());
        watchers.push(tokio::spawn(async move {
            let mut stream = api
                .watch(&WatchParams::default().timeout(120), &rv)
                .await
                .unwrap()
                .boxed();
            while let Some(Ok(event)) = stream.next().await {
                if matches!(event, WatchEvent::Modified(_) | WatchEvent::Added(_)) {
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let before = received.load(Ordering::Relaxed);
    let (rate, _) = renewals(&shared(&api, 64), seconds).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered = received.load(Ordering::Relaxed) - before;
    println!(
        "watch   100 watchers, 64 writers: {rate:.0} writes/s, {:.0} events/s delivered in all ({:.1}% of writes x watchers)",
        delivered as f64 / start.elapsed().as_secs_f64(),
        100.0 * delivered as f64 / (rate * seconds as f64 * 100.0)
    );
    for w in watchers {
        w.abort();
    }
    served.stop().await.unwrap();
}
