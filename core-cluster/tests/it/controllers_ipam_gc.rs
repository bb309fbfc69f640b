//! Node IPAM, garbage collector and pod GC controllers against the in-process API server
//! (kube-rs over the axum router, paused tokio time). Rules: upstream's
//! `pkg/controller/nodeipam`, `garbagecollector` and `podgc`.

use std::{sync::Arc, time::Duration};

use ccm_testkit::{client, eventually};

use core_cluster::controllers::{
    garbage_collector::GarbageCollector,
    node_ipam::{NodeIpamConfig, NodeIpamController},
    pod_gc::PodGcController,
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Namespace, Node, Pod},
    events::v1::Event,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        .unwrap()
}

fn node_with_cidrs(name: &str, cidrs: &[&str]) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}
    }))
    .unwrap()
}

fn ipam_config(cidrs: &[&str]) -> NodeIpamConfig {
    NodeIpamConfig {
        allocate_node_cidrs: true,
        cluster_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
        ..NodeIpamConfig::default()
    }
}

fn start_ipam(client: &Client, config: NodeIpamConfig) -> CancellationToken {
    let token = CancellationToken::new();
    let ctrl = NodeIpamController::new(client.clone(), config).unwrap();
    tokio::spawn(ctrl.run(token.clone()));
    token
}

async fn pod_cidrs(nodes: &Api<Node>, name: &str) -> Vec<String> {
    nodes
        .get(name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.pod_cidrs)
        .unwrap_or_default()
}

async fn wait_cidrs(nodes: &Api<Node>, name: &str) -> Vec<String> {
    eventually(30, &format!("podCIDRs on {name}"), || async {
        Some(pod_cidrs(nodes, name).await).filter(|c| !c.is_empty())
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn ipam_dual_stack_assignment() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let stop = start_ipam(&client, ipam_config(&["10.0.0.0/16", "fd00::/48"]));
    nodes
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    let a = wait_cidrs(&nodes, "a").await;
    let b = wait_cidrs(&nodes, "b").await;
    assert_eq!(a.len(), 2);
    assert_eq!(b.len(), 2);
    let mut v4 = vec![a[0].clone(), b[0].clone()];
    v4.sort();
    assert_eq!(v4, vec!["10.0.0.0/24", "10.0.1.0/24"]);
    let mut v6 = vec![a[1].clone(), b[1].clone()];
    v6.sort();
    // (string order)
    assert_eq!(v6, vec!["fd00:0:0:1::/64", "fd00::/64"]);
    // The first entry is from the first cluster CIDR (IPv4), the second IPv6.
    assert!(a[0].starts_with("10.") && a[1].starts_with("fd00:"));
    // podCIDR mirrors podCIDRs[0].
    let spec = nodes.get("a").await.unwrap().spec.unwrap();
    assert_eq!(spec.pod_cidr.as_deref(), Some(a[0].as_str()));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn ipam_recovery_on_restart() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    // Nodes written before the controller starts: one by a previous controller, one bad.
    nodes
        .create(
            &PostParams::default(),
            &node_with_cidrs("old", &["10.0.0.0/24"]),
        )
        .await
        .unwrap();
    let stop = start_ipam(&client, ipam_config(&["10.0.0.0/22"]));
    nodes
        .create(&PostParams::default(), &node("x"))
        .await
        .unwrap();
    assert_eq!(wait_cidrs(&nodes, "x").await, vec!["10.0.1.0/24"]);
    stop.cancel();
    // A fresh controller (empty memory) must not hand out 10.0.0.0/24 or 10.0.1.0/24 again.
    let stop = start_ipam(&client, ipam_config(&["10.0.0.0/22"]));
    nodes
        .create(&PostParams::default(), &node("y"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("z"))
        .await
        .unwrap();
    let mut got = vec![
        wait_cidrs(&nodes, "y").await[0].clone(),
        wait_cidrs(&nodes, "z").await[0].clone(),
    ];
    got.sort();
    assert_eq!(got, vec!["10.0.2.0/24", "10.0.3.0/24"]);
    assert_eq!(pod_cidrs(&nodes, "old").await, vec!["10.0.0.0/24"]);
    stop.cancel();
}

async fn events_for(client: &Client, name: &str, reason: &str) -> Vec<Event> {
    let all: Api<Event> = Api::all(client.clone());
    all.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn ipam_exhaustion_event_then_release_and_reuse() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let stop = start_ipam(&client, ipam_config(&["10.0.0.0/23"]));
    nodes
        .create(&PostParams::default(), &node("a"))
        .await
        .unwrap();
    assert_eq!(wait_cidrs(&nodes, "a").await, vec!["10.0.0.0/24"]);
    nodes
        .create(&PostParams::default(), &node("b"))
        .await
        .unwrap();
    assert_eq!(wait_cidrs(&nodes, "b").await, vec!["10.0.1.0/24"]);
    // The range is full: c gets a Warning CIDRNotAvailable and no CIDR.
    nodes
        .create(&PostParams::default(), &node("c"))
        .await
        .unwrap();
    let evs = eventually(30, "CIDRNotAvailable event", || async {
        Some(events_for(&client, "c", "CIDRNotAvailable").await).filter(|e| !e.is_empty())
    })
    .await;
    assert_eq!(evs[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        evs[0].note.as_deref(),
        Some("Node c status is now: CIDRNotAvailable")
    );
    assert!(pod_cidrs(&nodes, "c").await.is_empty());
    // Deleting a frees its CIDR; c (retried with backoff) gets it.
    nodes.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(wait_cidrs(&nodes, "c").await, vec!["10.0.0.0/24"]);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn ipam_leaves_node_with_cidrs_alone_and_skips_bad_ones() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    // Outside the cluster range: kept as is, not occupied, no panic.
    nodes
        .create(
            &PostParams::default(),
            &node_with_cidrs("foreign", &["192.168.5.0/24"]),
        )
        .await
        .unwrap();
    let stop = start_ipam(&client, ipam_config(&["10.0.0.0/16"]));
    nodes
        .create(
            &PostParams::default(),
            &node_with_cidrs("set", &["10.0.7.0/24"]),
        )
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &node("new"))
        .await
        .unwrap();
    assert_eq!(wait_cidrs(&nodes, "new").await, vec!["10.0.0.0/24"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(pod_cidrs(&nodes, "set").await, vec!["10.0.7.0/24"]);
    assert_eq!(pod_cidrs(&nodes, "foreign").await, vec!["192.168.5.0/24"]);
    stop.cancel();
}

// ---------------------------------------------------------------- garbage collector

fn start_gc(client: &Client) -> CancellationToken {
    let token = CancellationToken::new();
    tokio::spawn(GarbageCollector::new(client.clone()).run(token.clone()));
    token
}

fn owner_ref(
    kind: &str,
    api_version: &str,
    name: &str,
    uid: &str,
    block: bool,
) -> serde_json::Value {
    json!({"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "blockOwnerDeletion": block})
}

fn cm_owned(name: &str, owners: Vec<serde_json::Value>) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "ownerReferences": owners},
        "data": {"k": "v"}
    }))
    .unwrap()
}

fn cm(name: &str) -> ConfigMap {
    cm_owned(name, vec![])
}

async fn gone<K>(api: &Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.unwrap().is_none()
}

async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(60, &format!("{name} deleted"), || async {
        gone(api, name).await.then_some(())
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn gc_background_deletes_dependents_of_a_deleted_owner() {
    let client = client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stop = start_gc(&client);
    let owner = cms
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let other = cms
        .create(&PostParams::default(), &cm("other"))
        .await
        .unwrap();
    let uid = owner.uid().unwrap();
    let r = owner_ref("ConfigMap", "v1", "owner", &uid, false);
    cms.create(&PostParams::default(), &cm_owned("dep", vec![r.clone()]))
        .await
        .unwrap();
    // Two owners, one of which stays: kept, the dangling reference patched out.
    let r2 = owner_ref("ConfigMap", "v1", "other", &other.uid().unwrap(), false);
    cms.create(
        &PostParams::default(),
        &cm_owned("shared", vec![r.clone(), r2]),
    )
    .await
    .unwrap();
    // An owner reference whose uid does not match the live owner is dangling too.
    let wrong = owner_ref(
        "ConfigMap",
        "v1",
        "other",
        "00000000-0000-0000-0000-000000000000",
        false,
    );
    cms.create(&PostParams::default(), &cm_owned("stale", vec![wrong]))
        .await
        .unwrap();
    wait_gone(&cms, "stale").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !gone(&cms, "dep").await,
        "dependent of a live owner must stay"
    );

    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    wait_gone(&cms, "dep").await;
    let shared = eventually(60, "dangling ref removed", || async {
        let s = cms.get("shared").await.unwrap();
        (s.owner_references().len() == 1).then_some(s)
    })
    .await;
    assert_eq!(shared.owner_references()[0].name, "other");
    assert!(!gone(&cms, "other").await);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn gc_foreground_waits_for_blocking_dependent() {
    let client = client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stop = start_gc(&client);
    let owner = cms
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let uid = owner.uid().unwrap();
    // The blocking dependent carries its own finalizer, so it lingers while deleting.
    let mut blocker = cm_owned(
        "blocker",
        vec![owner_ref("ConfigMap", "v1", "owner", &uid, true)],
    );
    blocker.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &blocker).await.unwrap();
    cms.create(
        &PostParams::default(),
        &cm_owned(
            "loose",
            vec![owner_ref("ConfigMap", "v1", "owner", &uid, false)],
        ),
    )
    .await
    .unwrap();

    cms.delete("owner", &DeleteParams::foreground())
        .await
        .unwrap();
    // Both dependents are deleted; the non-blocking one goes entirely.
    wait_gone(&cms, "loose").await;
    eventually(60, "blocker marked deleting", || async {
        cms.get("blocker")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    // The owner stays, deleting, while the blocking dependent exists.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let o = cms.get("owner").await.unwrap();
    assert!(o.metadata.deletion_timestamp.is_some());
    assert!(o.finalizers().iter().any(|f| f == "foregroundDeletion"));
    // Release the blocker: then the owner goes.
    cms.patch(
        "blocker",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&cms, "blocker").await;
    wait_gone(&cms, "owner").await;
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn gc_orphan_removes_owner_references() {
    let client = client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stop = start_gc(&client);
    let owner = cms
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let uid = owner.uid().unwrap();
    for name in ["d1", "d2"] {
        cms.create(
            &PostParams::default(),
            &cm_owned(
                name,
                vec![owner_ref("ConfigMap", "v1", "owner", &uid, true)],
            ),
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    cms.delete(
        "owner",
        &DeleteParams {
            propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    wait_gone(&cms, "owner").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    for name in ["d1", "d2"] {
        let d = cms.get(name).await.unwrap();
        assert!(d.owner_references().is_empty(), "{name} still owned");
        assert!(d.metadata.deletion_timestamp.is_none());
    }
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn gc_node_lease_goes_with_its_node() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-node-lease"}}),
    )
    .unwrap();
    if namespaces
        .get_opt("kube-node-lease")
        .await
        .unwrap()
        .is_none()
    {
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let stop = start_gc(&client);
    for name in ["n1", "n2"] {
        let n = nodes
            .create(&PostParams::default(), &node(name))
            .await
            .unwrap();
        let lease: Lease = serde_json::from_value(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": n.uid().unwrap()}
            ]},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}
        }))
        .unwrap();
        leases.create(&PostParams::default(), &lease).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    wait_gone(&leases, "n1").await;
    assert!(!gone(&leases, "n2").await);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn gc_owner_in_another_namespace_is_invalid() {
    let client = client().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}),
    )
    .unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let here: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let there: Api<ConfigMap> = Api::namespaced(client.clone(), "other");
    let stop = start_gc(&client);
    let owner = there
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let uid = owner.uid().unwrap();
    let dep = here
        .create(
            &PostParams::default(),
            &cm_owned(
                "dep",
                vec![owner_ref("ConfigMap", "v1", "owner", &uid, false)],
            ),
        )
        .await
        .unwrap();
    // The owner is looked up in the dependent's namespace: absent, so the dependent goes.
    wait_gone(&here, "dep").await;
    let evs = eventually(30, "OwnerRefInvalidNamespace event", || async {
        let all: Api<Event> = Api::namespaced(client.clone(), "default");
        let evs: Vec<Event> = all
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("OwnerRefInvalidNamespace"))
            .collect();
        (!evs.is_empty()).then_some(evs)
    })
    .await;
    let regarding = evs[0].regarding.clone().unwrap();
    assert_eq!(regarding.name.as_deref(), Some("dep"));
    assert_eq!(regarding.uid, dep.uid());
    assert_eq!(evs[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        evs[0].note.as_deref(),
        Some(format!("ownerRef [v1/ConfigMap, namespace: default, name: owner, uid: {uid}] does not exist in namespace \"default\"").as_str())
    );
    // The owner in the other namespace is untouched.
    assert!(!gone(&there, "owner").await);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn gc_keeps_dependents_of_unserved_owner_kinds() {
    let client = client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stop = start_gc(&client);
    let uid = "11111111-1111-1111-1111-111111111111";
    cms.create(
        &PostParams::default(),
        &cm_owned(
            "by-statefulset",
            vec![owner_ref("StatefulSet", "apps/v1", "web", uid, true)],
        ),
    )
    .await
    .unwrap();
    // Control: the same reference to a served kind that is absent is collected.
    cms.create(
        &PostParams::default(),
        &cm_owned(
            "by-cm",
            vec![owner_ref("ConfigMap", "v1", "web", uid, true)],
        ),
    )
    .await
    .unwrap();
    wait_gone(&cms, "by-cm").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!gone(&cms, "by-statefulset").await);
    stop.cancel();
}

// A chain: the middle dependent is itself deleted Foreground
#[tokio::test(start_paused = true)]
async fn gc_foreground_chain_deletes_dependents_first() {
    let client = client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stop = start_gc(&client);
    let top = cms
        .create(&PostParams::default(), &cm("top"))
        .await
        .unwrap();
    let mid = cms
        .create(
            &PostParams::default(),
            &cm_owned(
                "mid",
                vec![owner_ref(
                    "ConfigMap",
                    "v1",
                    "top",
                    &top.uid().unwrap(),
                    true,
                )],
            ),
        )
        .await
        .unwrap();
    let mut leaf = cm_owned(
        "leaf",
        vec![owner_ref(
            "ConfigMap",
            "v1",
            "mid",
            &mid.uid().unwrap(),
            true,
        )],
    );
    leaf.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    cms.create(&PostParams::default(), &leaf).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    cms.delete("top", &DeleteParams::foreground())
        .await
        .unwrap();
    // mid is deleted in the foreground too, so it waits for leaf, and top waits for mid.
    let m = eventually(60, "mid deleting in foreground", || async {
        let m = cms.get("mid").await.unwrap();
        m.metadata.deletion_timestamp.is_some().then_some(m)
    })
    .await;
    assert!(m.finalizers().iter().any(|f| f == "foregroundDeletion"));
    eventually(60, "leaf deleting", || async {
        cms.get("leaf")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!gone(&cms, "top").await && !gone(&cms, "mid").await);
    cms.patch(
        "leaf",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&cms, "mid").await;
    wait_gone(&cms, "top").await;
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn gc_cluster_scoped_dependent_of_namespaced_owner_is_reported_not_deleted() {
    let client = client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let stop = start_gc(&client);
    let owner = cms
        .create(&PostParams::default(), &cm("owner"))
        .await
        .unwrap();
    let uid = owner.uid().unwrap();
    let mut n = node("n");
    n.metadata.owner_references = Some(vec![
        serde_json::from_value(owner_ref("ConfigMap", "v1", "owner", &uid, false)).unwrap(),
    ]);
    nodes.create(&PostParams::default(), &n).await.unwrap();
    let ev = eventually(30, "OwnerRefInvalidNamespace event", || async {
        events_for(&client, "n", "OwnerRefInvalidNamespace")
            .await
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(
        ev.note.as_deref(),
        Some(format!("ownerRef [v1/ConfigMap, namespace: , name: owner, uid: {uid}] does not exist in namespace \"\"").as_str())
    );
    // A permanent error: the Node stays.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!gone(&nodes, "n").await);
    stop.cancel();
}

// ---------------------------------------------------------------- pod GC

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut spec = json!({"containers": [{"name": "c", "image": "busybox"}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

#[tokio::test(start_paused = true)]
async fn pod_gc_deletes_pods_of_missing_nodes() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    nodes
        .create(&PostParams::default(), &node("here"))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("on-here", Some("here")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("on-gone", Some("gone")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("unscheduled", None))
        .await
        .unwrap();
    // A terminating pod on the missing node: its graceful deletion would never finish.
    pods.create(&PostParams::default(), &pod("terminating", Some("gone")))
        .await
        .unwrap();
    pods.delete("terminating", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        pods.get("terminating")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );

    // Record what happens to on-gone: upstream marks it Failed before deleting it.
    let seen = Arc::new(parking_lot::Mutex::new(Vec::<Pod>::new()));
    {
        let seen = seen.clone();
        let stream = kube::runtime::watcher(
            pods.clone(),
            kube::runtime::watcher::Config::default().fields("metadata.name=on-gone"),
        );
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = futures::StreamExt::next(&mut stream).await {
                if let Ok(kube::runtime::watcher::Event::Apply(p)) = ev {
                    seen.lock().push(p);
                }
            }
        });
    }

    let token = CancellationToken::new();
    let ctrl = PodGcController::new(client.clone(), Default::default());
    tokio::spawn(ctrl.run(token.clone()));
    // Quarantine: the node must be missing for 40s first.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        !gone(&pods, "on-gone").await,
        "deleted before the quarantine ended"
    );
    wait_gone(&pods, "on-gone").await;
    wait_gone(&pods, "terminating").await;
    let failed = seen
        .lock()
        .iter()
        .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        .cloned()
        .expect("on-gone was marked Failed before deletion");
    let cond = failed
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget condition");
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("True", Some("DeletionByPodGC"))
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!gone(&pods, "on-here").await);
    assert!(!gone(&pods, "unscheduled").await);
    token.cancel();
}
