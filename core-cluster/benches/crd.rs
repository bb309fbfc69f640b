//! Custom resources against a built-in of the same size: create, list and watch rates of a
//! namespaced custom resource (a definition with a structural schema: pruning, defaulting
//! and validation on every write) and of ConfigMaps, each object carrying the same 256-byte
//! payload. In-process (kube-rs over the router, no TLS) on the memory store, so the
//! figures compare the two write and read paths rather than the transport. Not a test:
//! figures go to BENCHMARKS.md.
//!
//! `cargo bench -p core-cluster --bench crd` (optionally `-- --objects 500 --runs 3`).

#![allow(missing_docs)]

use ccm_testkit::{bench::arg, eventually, memory_server};
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client,
    api::{
        ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, WatchEvent,
        WatchParams,
    },
};
use serde_json::{Value, json};
use tokio::time::Instant;

const PAYLOAD: usize = 256;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.bench.example.com"},
        "spec": {"group": "bench.example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "kind": "Widget"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                   "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                     "data": {"type": "object", "properties": {
                       "payload": {"type": "string", "maxLength": 1024},
                       "size": {"type": "integer", "minimum": 0, "default": 1}}}}}}}]},
    })
}

struct Rates {
    create: f64,
    list: f64,
    watch: f64,
}

/// Creates `n` objects one after another, lists them all 10 times, and watches them all
/// from resourceVersion 0: objects per second of each.
async fn measure(api: &Api<DynamicObject>, make: impl Fn(usize) -> Value, n: usize) -> Rates {
    let start = Instant::now();
    for i in 0..n {
        let obj: DynamicObject = serde_json::from_value(make(i)).unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
    let create = n as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    for _ in 0..10 {
        assert_eq!(
            api.list(&ListParams::default()).await.unwrap().items.len(),
            n
        );
    }
    let list = (10 * n) as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let stream = api
        .watch(&WatchParams::default().timeout(60), "0")
        .await
        .unwrap()
        .boxed();
    let mut seen = 0;
    let mut stream = stream;
    while let Some(event) = stream.try_next().await.unwrap() {
        if matches!(event, WatchEvent::Added(_)) {
            seen += 1;
            if seen == n {
                break;
            }
        }
    }
    let watch = n as f64 / start.elapsed().as_secs_f64();
    Rates {
        create,
        list,
        watch,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = arg("objects", 500);
    let runs: usize = arg("runs", 3);
    let payload = "x".repeat(PAYLOAD);
    let mut custom = (Vec::new(), Vec::new(), Vec::new());
    let mut builtin = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let client = Client::new(memory_server().await.router(), "default");
        let crds: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
                "customresourcedefinitions",
            ),
        );
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(crd()).unwrap(),
        )
        .await
        .unwrap();
        let widgets: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            "default",
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("bench.example.com", "v1", "Widget"),
                "widgets",
            ),
        );
        eventually(30, "the definition is served", || {
            let w = widgets.clone();
            async move { w.list(&ListParams::default()).await.ok().map(|_| ()) }
        })
        .await;
        let cms: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            "default",
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("", "v1", "ConfigMap"),
                "configmaps",
            ),
        );
        let p = payload.clone();
        let c = measure(
            &widgets,
            |i| {
                json!({"apiVersion": "bench.example.com/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i}")}, "data": {"payload": p, "size": 1}})
            },
            n,
        )
        .await;
        let p = payload.clone();
        // kube-root-ca.crt-like objects may exist in the namespace: none here (no controllers).
        let b = measure(
            &cms,
            |i| {
                json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("c{i}")}, "data": {"payload": p, "size": "1"}})
            },
            n,
        )
        .await;
        println!(
            "run {run}: custom resource create {:.0}/s list {:.0}/s watch {:.0}/s; configmap create {:.0}/s list {:.0}/s watch {:.0}/s",
            c.create, c.list, c.watch, b.create, b.list, b.watch
        );
        custom.0.push(c.create);
        custom.1.push(c.list);
        custom.2.push(c.watch);
        builtin.0.push(b.create);
        builtin.1.push(b.list);
        builtin.2.push(b.watch);
    }
    println!(
        "median of {runs} runs, {n} objects of {PAYLOAD} bytes: custom resource create {:.0}/s, list {:.0} objects/s, watch {:.0} events/s; configmap create {:.0}/s, list {:.0} objects/s, watch {:.0} events/s",
        median(custom.0),
        median(custom.1),
        median(custom.2),
        median(builtin.0),
        median(builtin.1),
        median(builtin.2)
    );
}
