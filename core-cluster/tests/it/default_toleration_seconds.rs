//! The DefaultTolerationSeconds admission plugin
//! (`plugin/pkg/admission/defaulttolerationseconds/admission.go`, `Admit`) with
//! kube-apiserver's `--default-not-ready-toleration-seconds` and
//! `--default-unreachable-toleration-seconds`.

use std::sync::Arc;

use core_cluster::{ApiServer, ApiServerConfig, store::MemoryStore};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use kube::{Api, Client, api::PostParams};
use serde_json::json;

async fn client(not_ready: i64, unreachable: i64) -> Client {
    let config = ApiServerConfig {
        default_not_ready_toleration_seconds: not_ready,
        default_unreachable_toleration_seconds: unreachable,
        ..ApiServerConfig::default()
    };
    let server = ApiServer::new(Arc::new(MemoryStore::new()), config)
        .await
        .unwrap();
    Client::new(server.router(), "default")
}

fn pod(name: &str, tolerations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "nginx"}], "tolerations": tolerations},
    }))
    .unwrap()
}

fn seconds(tolerations: &[Toleration], key: &str) -> Option<i64> {
    tolerations
        .iter()
        .find(|t| t.key.as_deref() == Some(key))
        .and_then(|t| t.toleration_seconds)
}

/// A pod with no NoExecute toleration gets both, with the flags' seconds; a pod that
/// tolerates one of the taints already keeps its own and gets only the other.
#[tokio::test]
async fn pods_get_the_not_ready_and_unreachable_tolerations_of_the_flags() {
    let client = client(30, 120).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let plain = pods
        .create(&PostParams::default(), &pod("plain", json!([])))
        .await
        .unwrap();
    let t = plain.spec.unwrap().tolerations.unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(seconds(&t, "node.kubernetes.io/not-ready"), Some(30));
    assert_eq!(seconds(&t, "node.kubernetes.io/unreachable"), Some(120));
    assert!(t.iter().all(
        |t| t.operator.as_deref() == Some("Exists") && t.effect.as_deref() == Some("NoExecute")
    ));

    let own = pods
        .create(
            &PostParams::default(),
            &pod(
                "own",
                json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                        "effect": "NoExecute", "tolerationSeconds": 5}]),
            ),
        )
        .await
        .unwrap();
    let t = own.spec.unwrap().tolerations.unwrap();
    assert_eq!(t.len(), 2);
    assert_eq!(seconds(&t, "node.kubernetes.io/unreachable"), Some(5));
    assert_eq!(seconds(&t, "node.kubernetes.io/not-ready"), Some(30));
}

/// Kube-apiserver's defaults: 300 seconds each.
#[tokio::test]
async fn the_default_is_three_hundred_seconds() {
    let client = client(300, 300).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let p = pods
        .create(&PostParams::default(), &pod("p", json!([])))
        .await
        .unwrap();
    let t = p.spec.unwrap().tolerations.unwrap();
    assert_eq!(seconds(&t, "node.kubernetes.io/not-ready"), Some(300));
    assert_eq!(seconds(&t, "node.kubernetes.io/unreachable"), Some(300));
    assert_eq!(
        ApiServerConfig::default().default_unreachable_toleration_seconds,
        300
    );
}
