//! What the Node authorizer's graph costs: decisions per second and memory at 10,000 pods on
//! 1,000 nodes, the time to build it, and what a pod write adds to the API server.
//! Measurements, not timed tests: run by hand, one at a time, on an optimized build of the
//! crate:
//!
//! `cargo test -p core-cluster --config 'profile.dev.package.core-cluster.opt-level=3'
//! --test it node_graph_cost -- --ignored --nocapture --test-threads=1`
//!
//! The memory figure is the process's resident set: another test running at the same time in
//! this binary skews it (and may shrink it below the starting point, which reads as zero).

use std::sync::Arc;

use core_cluster::{
    ApiServer, ApiServerConfig,
    auth::{
        authz::{Attributes, Decision},
        node::{
            self,
            graph::{NodeGraph, PodEdges},
            node_user,
        },
    },
    store::MemoryStore,
};
use serde_json::{Value, json};
use tokio::time::Instant;

/// The process's resident set size in bytes.
fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// How many copies of the graph the memory figure is the average of (so memory the
/// allocator reuses from earlier frees hides little of it).
const COPIES: usize = 10;

const NAMESPACES: usize = 100;
const DEPLOYMENTS: usize = 10;
const PODS_PER_DEPLOYMENT: usize = 10;
const NODES: usize = 1_000;

/// A typical workload pod: its service account, a secret volume, a configmap in its env
/// and the projected `kube-root-ca.crt` every pod gets.
fn workload_pod(ns: usize, deployment: usize, replica: usize, node: usize) -> Value {
    json!({
        "metadata": {"name": format!("app-{deployment}-{replica}"), "namespace": format!("ns-{ns}")},
        "spec": {
            "nodeName": format!("node-{node}"),
            "serviceAccountName": format!("sa-{deployment}"),
            "containers": [{"name": "app", "image": "app:1", "env": [{"name": "CONFIG",
                "valueFrom": {"configMapKeyRef": {"name": format!("config-{deployment}"), "key": "k"}}}]}],
            "volumes": [
                {"name": "tls", "secret": {"secretName": format!("tls-{deployment}")}},
                {"name": "token", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt"}}]}}
            ]
        }
    })
}

/// Every pod of the cluster, spread round-robin over the nodes.
fn cluster() -> Vec<Value> {
    let mut pods = Vec::new();
    for ns in 0..NAMESPACES {
        for d in 0..DEPLOYMENTS {
            for r in 0..PODS_PER_DEPLOYMENT {
                pods.push(workload_pod(ns, d, r, pods.len() % NODES));
            }
        }
    }
    pods
}

fn ns_name(pod: &Value) -> (&str, &str) {
    (
        pod["metadata"]["namespace"].as_str().unwrap(),
        pod["metadata"]["name"].as_str().unwrap(),
    )
}

fn per_second(n: usize, secs: f64) -> String {
    format!(
        "{:.0}/s ({:.0} ns each)",
        n as f64 / secs,
        secs * 1e9 / n as f64
    )
}

/// 10,000 pods on 1,000 nodes: memory of the graph, the time to build it, decisions per
/// second (a mix of allowed and refused secret reads, token requests and configmap reads),
/// and the cost of moving a pod. Checks every sampled decision while timing it.
#[test]
#[ignore = "a measurement; run by hand"]
fn graph_cost_at_10000_pods_on_1000_nodes() {
    let pods = cluster();
    let edges: Vec<(String, String, PodEdges)> = pods
        .iter()
        .map(|p| {
            let (ns, name) = ns_name(p);
            (ns.to_owned(), name.to_owned(), PodEdges::of(p).unwrap())
        })
        .collect();
    let started = Instant::now();
    for p in &pods {
        std::hint::black_box(PodEdges::of(p));
    }
    let derive = started.elapsed().as_secs_f64();

    let started = Instant::now();
    let mut graph = NodeGraph::new();
    for (ns, name, e) in &edges {
        graph.set_pod(ns, name, Some(e));
    }
    let build = started.elapsed().as_secs_f64();
    let before = rss_bytes();
    let copies: Vec<NodeGraph> = (0..COPIES)
        .map(|_| {
            let mut copy = NodeGraph::new();
            for (ns, name, e) in &edges {
                copy.set_pod(ns, name, Some(e));
            }
            copy
        })
        .collect();
    let bytes = rss_bytes().saturating_sub(before) / COPIES;
    assert!(copies.iter().all(|c| c.path_count() == graph.path_count()));
    drop(copies);
    assert_eq!(graph.pod_count(), pods.len());
    assert_eq!(graph.node_count(), NODES);

    // The decisions: for a sample of pods, its node reading its secret (allowed), minting
    // its service account's token (allowed), reading kube-root-ca.crt (allowed), and
    // a node with no pod of that namespace reading the same secret (refused).
    let mut cases: Vec<(Attributes, bool)> = Vec::new();
    for (i, p) in pods.iter().enumerate().step_by(37) {
        let (ns, _) = ns_name(p);
        let node = p["spec"]["nodeName"].as_str().unwrap();
        let d = (i / PODS_PER_DEPLOYMENT) % DEPLOYMENTS;
        let user = node_user(node);
        // 500 pods away: another namespace's pods only.
        let other = node_user(&format!("node-{}", (i + 500) % NODES));
        let tls = format!("tls-{d}");
        cases.push((
            Attributes::resource(user.clone(), "get", "", "secrets", ns, &tls),
            true,
        ));
        cases.push((
            Attributes::resource(
                user.clone(),
                "create",
                "",
                "serviceaccounts/token",
                ns,
                &format!("sa-{d}"),
            ),
            true,
        ));
        cases.push((
            Attributes::resource(user, "get", "", "configmaps", ns, "kube-root-ca.crt"),
            true,
        ));
        cases.push((
            Attributes::resource(other, "get", "", "secrets", ns, &tls),
            false,
        ));
    }
    const DECISIONS: usize = 1_000_000;
    let started = Instant::now();
    for k in 0..DECISIONS {
        let (attrs, allowed) = &cases[k % cases.len()];
        let decision = node::authorize(&graph, std::hint::black_box(attrs));
        assert_eq!(decision == Decision::Allow, *allowed, "{attrs:?}");
    }
    let decide = started.elapsed().as_secs_f64();

    // The rule-list check every node request not decided on the graph pays (a lease-free
    // `get nodes`), for comparison with the graph's lookups.
    let rules_case = Attributes::resource(node_user("node-1"), "get", "", "nodes", "", "node-1");
    let started = Instant::now();
    for _ in 0..DECISIONS {
        assert_eq!(
            node::authorize(&graph, std::hint::black_box(&rules_case)),
            Decision::Allow
        );
    }
    let rules = started.elapsed().as_secs_f64();
    // What a token request cost before the graph: the node rules built and matched per
    // decision.
    let token_case = &cases[1].0;
    let started = Instant::now();
    for _ in 0..DECISIONS / 10 {
        let rules = node::node_rules();
        assert!(
            rules
                .iter()
                .any(|r| r.allows(std::hint::black_box(token_case)))
        );
    }
    let old_token = started.elapsed().as_secs_f64();

    // A pod write that changes the graph: the pod moves to another node and back.
    const MOVES: usize = 100_000;
    let started = Instant::now();
    for k in 0..MOVES {
        let (ns, name, e) = &edges[k % edges.len()];
        let mut moved = e.clone();
        moved.node = format!("node-{}", (k * 7) % NODES);
        graph.set_pod(ns, name, Some(&moved));
        graph.set_pod(ns, name, Some(e));
    }
    let moves = started.elapsed().as_secs_f64();

    println!(
        "pods {}, nodes {}, paths {}",
        graph.pod_count(),
        graph.node_count(),
        graph.path_count()
    );
    println!(
        "graph memory (resident set growth per copy, {COPIES} copies): {bytes} bytes ({:.1} MiB, {} bytes per pod)",
        bytes as f64 / (1 << 20) as f64,
        bytes / pods.len()
    );
    println!(
        "edges from 10,000 pod objects: {:.1} ms; graph built from them: {:.1} ms",
        derive * 1e3,
        build * 1e3
    );
    println!(
        "graph decisions ({} cases): {}",
        cases.len(),
        per_second(DECISIONS, decide)
    );
    println!("rule-list decisions: {}", per_second(DECISIONS, rules));
    println!(
        "token decision as before the graph (rules built per call): {}",
        per_second(DECISIONS / 10, old_token)
    );
    println!("pod moved and moved back: {}", per_second(2 * MOVES, moves));
}

/// What the graph adds to the API server's pod writes: creating 2,000 pods through the
/// in-process router, bound to nodes (each create reads the pod back and updates the
/// graph) against unbound (no graph work), then deleting them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn pod_write_cost_with_the_graph() {
    use kube::api::{Api, DeleteParams, PostParams};
    const PODS: usize = 2_000;
    for bound in [false, true, false, true] {
        let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
            .await
            .unwrap();
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(kube::Client::new(server.router(), "default"), "default");
        let started = Instant::now();
        for i in 0..PODS {
            let mut pod = workload_pod(0, i % DEPLOYMENTS, i, i % NODES);
            pod["metadata"]["namespace"] = json!("default");
            if !bound {
                pod["spec"].as_object_mut().unwrap().remove("nodeName");
            }
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap();
        }
        let create = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for i in 0..PODS {
            pods.delete(
                &format!("app-{}-{i}", i % DEPLOYMENTS),
                &DeleteParams::default().grace_period(0),
            )
            .await
            .unwrap();
        }
        let delete = started.elapsed().as_secs_f64();
        println!(
            "{}: creates {}, deletes {}",
            if bound { "bound  " } else { "unbound" },
            per_second(PODS, create),
            per_second(PODS, delete)
        );
    }
}
