//! The node simulator's images and image garbage collection against the in-process API
//! server with paused tokio time. Rules: kubelet's `pkg/kubelet/images/image_gc_manager.go`
//! (`GarbageCollect`, `freeSpace`: least recently used unused images go when usage reaches
//! `imageGCHighThresholdPercent`, down to `imageGCLowThresholdPercent`; in-use images stay;
//! the `FreeDiskSpaceFailed` Event, and `ImageGCFailed` after two failed collections in
//! `kubelet.go` `StartGarbageCollection`) and `kubelet_node_status.go` (`status.images`).

use std::sync::Arc;

use ccm_testkit::eventually;
use core_cluster::{
    ApiServer, ApiServerConfig,
    sim::{EvictionConfig, ImageGcConfig, NodeSimulator, SimConfig, image_size},
    store::MemoryStore,
};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn pod(name: &str, image: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": image}]},
    }))
    .unwrap()
}

async fn node_images(nodes: &Api<Node>) -> Vec<String> {
    let n = nodes.get("n1").await.unwrap();
    let mut names: Vec<String> = n
        .status
        .and_then(|s| s.images)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|i| i.names.unwrap_or_default())
        .collect();
    names.sort();
    names
}

async fn event_reasons(client: &Client) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("n1"))
        .filter_map(|e| e.reason)
        .collect()
}

/// A node pulls its pods' images and reports them in `status.images`; at the 5-minute
/// collection above 85 % the unused image goes (usage back under 80 %) and the in-use one
/// stays; when only in-use images fill the disk, the node records `FreeDiskSpaceFailed`,
/// then `ImageGCFailed` at the second failed collection.
#[tokio::test(start_paused = true)]
async fn image_gc_frees_unused_images_and_reports_when_it_cannot() {
    // Image names whose simulated sizes make the thresholds land as described.
    let names: Vec<String> = (0..2000)
        .map(|i| format!("registry.local/img-{i}:v1"))
        .collect();
    let (a, c) = names
        .iter()
        .flat_map(|a| names.iter().map(move |c| (a, c)))
        .find(|(a, c)| a != c && image_size(a) * 2 >= image_size(c))
        .unwrap();
    let (sa, sc) = (image_size(a), image_size(c));
    // Freeing half of a is enough to get to 80 %.
    let capacity = (sa + sc - sa / 2) * 100 / 80;
    assert!((sa + sc) * 100 / capacity >= 85);
    let d = names
        .iter()
        .find(|d| *d != a && *d != c && (sc + image_size(d)) * 100 / capacity >= 90)
        .unwrap();

    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let config = SimConfig {
        image_gc: ImageGcConfig {
            enabled: true,
            imagefs_capacity: capacity,
            ..ImageGcConfig::default()
        },
        // Image GC alone: at 85 % of the image filesystem kubelet's eviction manager
        // (imagefs.available<15%) would evict pods too (sim_eviction tests that).
        eviction: EvictionConfig {
            monitoring_interval: std::time::Duration::ZERO,
            ..EvictionConfig::default()
        },
        ..SimConfig::default()
    };
    let sim = NodeSimulator::new(client.clone(), config);
    sim.add_nodes(["n1"]);
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    pods.create(&PostParams::default(), &pod("pa", a))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("pc", c))
        .await
        .unwrap();
    let mut both = vec![a.clone(), c.clone()];
    both.sort();
    eventually(30, "status.images lists both images", || async {
        (node_images(&nodes).await == both).then_some(())
    })
    .await;
    pods.delete("pa", &DeleteParams::default()).await.unwrap();
    eventually(10, "pa finished", || async {
        pods.get_opt("pa").await.unwrap().is_none().then_some(())
    })
    .await;
    assert_eq!(sim.image_fs_usage("n1").unwrap(), (sa + sc, capacity));

    // The first collection runs 5 minutes after start.
    eventually(320, "the unused image collected", || async {
        (node_images(&nodes).await == [c.clone()]).then_some(())
    })
    .await;
    assert_eq!(sim.image_fs_usage("n1").unwrap().0, sc);
    assert!(event_reasons(&client).await.is_empty(), "no failure");

    // Only in-use images above the threshold: nothing can be freed.
    pods.create(&PostParams::default(), &pod("pd", d))
        .await
        .unwrap();
    eventually(320, "FreeDiskSpaceFailed recorded", || async {
        event_reasons(&client)
            .await
            .contains(&"FreeDiskSpaceFailed".to_string())
            .then_some(())
    })
    .await;
    assert!(
        !event_reasons(&client)
            .await
            .contains(&"ImageGCFailed".to_string())
    );
    eventually(320, "ImageGCFailed at the second failure", || async {
        event_reasons(&client)
            .await
            .contains(&"ImageGCFailed".to_string())
            .then_some(())
    })
    .await;
    let mut kept = vec![c.clone(), d.clone()];
    kept.sort();
    assert_eq!(node_images(&nodes).await, kept, "in-use images stay");
}
