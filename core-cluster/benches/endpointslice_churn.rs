//! EndpointSlice churn benchmark (plain `main`, no harness): how many EndpointSlice writes
//! the slice controller makes, and how many per second, while the readiness of 10,000 pods
//! behind Services churns (upstream's `pkg/controller/endpointslice` reconciler, measured
//! by the counter `endpointslice::SLICE_WRITES`).
//!
//! In one process: the API server (in-memory store, no TCP), `--services` Services sharing
//! `--pods` running pods (an IP, `Ready=True`), the `EndpointSliceController`; once the
//! slices hold every pod, `--rounds` rounds each flip the readiness of `--batch` pods
//! (status patches, 16 at a time) and wait until the slices show the new ready count.
//! Printed: pod changes, slice writes, their ratio, and slice writes per second of churn.
//!
//! Run: `cargo bench -p core-cluster --bench endpointslice_churn -- --pods 10000`. Without
//! `--bench` (as `cargo test --all-targets` does) it runs 200 pods once as a smoke test.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use ccm_testkit::bench::{arg, full_run};
use core_cluster::{
    ApiServer, ApiServerConfig,
    controllers::endpointslice::{EndpointSliceController, SLICE_WRITES},
    store::MemoryStore,
};
use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256)
}

fn ready_status(i: usize, ready: bool) -> serde_json::Value {
    let status = if ready { "True" } else { "False" };
    json!({"status": {"phase": "Running", "podIP": ip(i), "podIPs": [{"ip": ip(i)}],
        "conditions": [{"type": "Ready", "status": status}, {"type": "ContainersReady", "status": status}]}})
}

/// Ready endpoints across the slices of every Service.
async fn ready_endpoints(slices: &Api<EndpointSlice>) -> usize {
    let list = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name"))
        .await
        .unwrap();
    list.items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        .count()
}

async fn settle(slices: &Api<EndpointSlice>, expected: usize) {
    let start = Instant::now();
    let mut said = start;
    loop {
        let ready = ready_endpoints(slices).await;
        if ready == expected {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "the slices never showed {expected} ready endpoints (they show {ready})"
        );
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            eprintln!(
                "  waiting {:.0?}: {ready} ready endpoints of {expected}, {} slice writes so far",
                start.elapsed(),
                SLICE_WRITES.load(Ordering::Relaxed)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn patch_ready(pods: &Api<Pod>, indices: Vec<usize>, ready: bool) {
    futures::stream::iter(indices)
        .for_each_concurrent(16, |i| {
            let pods = pods.clone();
            async move {
                pods.patch_status(
                    &format!("pod-{i:05}"),
                    &PatchParams::default(),
                    &Patch::Merge(ready_status(i, ready)),
                )
                .await
                .unwrap();
            }
        })
        .await;
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = full_run();
    let pods_n: usize = arg("--pods", if full { 10_000 } else { 200 });
    let services: usize = arg("--services", 1);
    let rounds: usize = arg("--rounds", if full { 10 } else { 2 });
    let batch: usize = arg("--batch", if full { 500 } else { 20 });
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let svc_api: Api<Service> = Api::namespaced(client.clone(), "default");
    for s in 0..services {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": format!("web-{s}")},
            "spec": {"selector": {"svc": format!("s{s}")}, "ports": [{"port": 80, "targetPort": 8080}]},
        }))
        .unwrap();
        svc_api.create(&PostParams::default(), &svc).await.unwrap();
    }
    let setup = Instant::now();
    futures::stream::iter(0..pods_n)
        .for_each_concurrent(16, |i| {
            let pods = pods.clone();
            async move {
                let p: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("pod-{i:05}"), "labels": {"svc": format!("s{}", i % services)}},
                    "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "nginx"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &p).await.unwrap();
                pods.patch_status(
                    &format!("pod-{i:05}"),
                    &PatchParams::default(),
                    &Patch::Merge(ready_status(i, true)),
                )
                .await
                .unwrap();
            }
        })
        .await;
    println!(
        "{pods_n} running pods behind {services} Service(s) in {:.2?}",
        setup.elapsed()
    );
    let stop = CancellationToken::new();
    tokio::spawn(EndpointSliceController::new(client.clone()).run(stop.clone()));
    let first = Instant::now();
    settle(&slices, pods_n).await;
    let initial = SLICE_WRITES.load(Ordering::Relaxed);
    println!(
        "initial sync: {initial} slice writes in {:.2?}",
        first.elapsed()
    );
    let mut ready = pods_n;
    let mut changes = 0;
    let before = SLICE_WRITES.load(Ordering::Relaxed);
    let churn = Instant::now();
    for round in 0..rounds {
        // Alternate: a batch goes unready, then back.
        let start = (round / 2 * batch * 7) % pods_n.saturating_sub(batch).max(1);
        let indices: Vec<usize> = (start..start + batch.min(pods_n)).collect();
        let to_ready = round % 2 == 1;
        patch_ready(&pods, indices, to_ready).await;
        changes += batch;
        ready = if to_ready {
            ready + batch
        } else {
            ready - batch
        };
        settle(&slices, ready).await;
    }
    let elapsed = churn.elapsed();
    let writes = SLICE_WRITES.load(Ordering::Relaxed) - before;
    stop.cancel();
    println!(
        "churn: {changes} pod readiness changes in {rounds} rounds of {batch}, {writes} slice writes in {elapsed:.2?}: {:.1} slice writes/s, {:.3} writes per pod change, {:.0} pod changes/s",
        writes as f64 / elapsed.as_secs_f64(),
        writes as f64 / changes as f64,
        changes as f64 / elapsed.as_secs_f64(),
    );
}
