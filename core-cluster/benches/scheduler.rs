//! Scheduler benchmark (plain `main`, no harness): pods bound per second at 10,000 nodes.
//!
//! - `core`: the scheduling decision alone (`SchedulerCore::schedule`: filters over up to
//!   `numFeasibleNodesToFind` = 500 of the 10,000 nodes, LeastAllocated, assume), no I/O;
//! - `api`: end to end in one process: 10,000 Nodes in the API server (in-memory store),
//!   the `Scheduler` controller watching them, then pods created and timed until every one
//!   is bound through `pods/binding` (watch, decision, bind, event).
//!
//! Run: `cargo bench -p core-cluster --bench scheduler`. Without `--bench` (as `cargo test
//! --all-targets` does) it runs 200 nodes and 100 pods once as a smoke test.

use std::{sync::Arc, time::Duration};

use core_cluster::{
    ApiServer, ApiServerConfig,
    controllers::scheduler::{Decision, Scheduler, SchedulerConfig, SchedulerCore},
    store::MemoryStore,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn node(i: usize) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": format!("node-{i:05}"), "labels": {"topology.kubernetes.io/zone": format!("z{}", i % 10)}},
        "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }))
    .unwrap()
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pod-{i:06}"), "namespace": "default", "uid": format!("uid-{i}")},
        "spec": {"schedulerName": "default-scheduler",
            "containers": [{"name": "c", "image": "nginx", "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
    }))
    .unwrap()
}

fn bench_core(nodes: usize, pods: usize) {
    let mut core = SchedulerCore::new(&SchedulerConfig::default());
    for i in 0..nodes {
        core.node_applied(node(i));
    }
    for i in 0..pods {
        core.pod_applied(pod(i));
    }
    let start = Instant::now();
    let mut bound = 0;
    while let Some(p) = core.next_pod() {
        if let Decision::Bind(_) = core.schedule(&p) {
            bound += 1;
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(bound, pods);
    println!(
        "core: {nodes} nodes, {pods} pods in {elapsed:.2?}: {:.0} pods/s",
        pods as f64 / elapsed.as_secs_f64()
    );
}

async fn bench_api(nodes: usize, pods: usize) {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let node_api: Api<Node> = Api::all(client.clone());
    let setup = Instant::now();
    futures::stream::iter(0..nodes)
        .for_each_concurrent(64, |i| {
            let api = node_api.clone();
            async move {
                let n = node(i);
                let name = format!("node-{i:05}");
                api.create(&PostParams::default(), &n).await.unwrap();
                let status = json!({"status": n.status});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap();
            }
        })
        .await;
    println!("api: {nodes} nodes created in {:.2?}", setup.elapsed());
    let stop = CancellationToken::new();
    tokio::spawn(Scheduler::new(client.clone(), SchedulerConfig::default()).run(stop.clone()));
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut bound_watch = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
        .applied_objects()
        .boxed();
    let start = Instant::now();
    let creator = tokio::spawn({
        let pod_api = pod_api.clone();
        async move {
            futures::stream::iter(0..pods)
                .for_each_concurrent(16, |i| {
                    let api = pod_api.clone();
                    async move {
                        let mut p = pod(i);
                        p.metadata.uid = None;
                        api.create(&PostParams::default(), &p).await.unwrap();
                    }
                })
                .await;
        }
    });
    let mut bound = std::collections::HashSet::new();
    while bound.len() < pods {
        let next = tokio::time::timeout(Duration::from_secs(120), bound_watch.next())
            .await
            .expect("pods bound in time");
        let Some(Ok(p)) = next else { continue };
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            bound.insert(p.metadata.name.clone().unwrap_or_default());
        }
    }
    let elapsed = start.elapsed();
    creator.await.unwrap();
    stop.cancel();
    println!(
        "api: {nodes} nodes, {pods} pods created and bound in {elapsed:.2?}: {:.0} pods/s",
        pods as f64 / elapsed.as_secs_f64()
    );
}

fn main() {
    let full = ccm_testkit::bench::full_run();
    let (nodes, core_pods, api_pods) = if full {
        (10_000, 5_000, 2_000)
    } else {
        (200, 100, 100)
    };
    bench_core(nodes, core_pods);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench_api(nodes, api_pods));
}
