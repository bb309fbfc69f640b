//! The cloud-node and cloud-node-lifecycle controllers end to end: FakeCloud, the in-process
//! core-cluster API server and paused time, checked against upstream's
//! `k8s.io/cloud-provider/controllers/node/node_controller.go` and
//! `controllers/nodelifecycle/node_lifecycle_controller.go`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use ccm_testkit::{client, eventually};
use cloud_provider::well_known::{
    ANNOTATION_PROVIDED_NODE_IP, CONDITION_MAINTENANCE_PLANNED, LABEL_FAILURE_DOMAIN_BETA_REGION,
    LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_STABLE,
    LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE, TAINT_MAINTENANCE_PLANNED, TAINT_SHUTDOWN,
    TAINT_UNINITIALIZED,
};
use cloud_provider::{
    CloudProvider, CloudResult, InstanceMetadata, InstancesV2, ScheduledEvent, ScheduledEventKind,
    node_address,
};
use cloud_provider_app::controllers::cloud_node_lifecycle::{
    CloudNodeLifecycleConfig, CloudNodeLifecycleController,
};
use cloud_provider_app::controllers::node::{
    CloudNodeConfig, CloudNodeConfigError, CloudNodeController,
};
use cloud_provider_app::controllers::{ControllerContext, MaintenanceConfig};
use cloud_provider_fake::{FakeCloud, FakeInstance, Fault, FaultRule, Method, Parts};
use k8s_openapi::api::core::v1::{
    Event, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

fn ctx(
    client: &kube::Client,
    cloud: Arc<dyn CloudProvider>,
) -> (ControllerContext, CancellationToken) {
    let token = CancellationToken::new();
    (
        ControllerContext::new(client.clone(), cloud, "kubernetes", token.clone()),
        token,
    )
}

/// Starts a cloud-node controller; the returned guard stops it.
fn start_node(
    client: &kube::Client,
    cloud: Arc<dyn CloudProvider>,
    config: CloudNodeConfig,
) -> Stop {
    let (ctx, token) = ctx(client, cloud);
    let controller = CloudNodeController::new(ctx, config).unwrap().unwrap();
    tokio::spawn(controller.run());
    Stop(token)
}

fn start_lifecycle(
    client: &kube::Client,
    cloud: Arc<dyn CloudProvider>,
    config: CloudNodeLifecycleConfig,
) -> Stop {
    let (ctx, token) = ctx(client, cloud);
    let controller = CloudNodeLifecycleController::new(ctx, config)
        .unwrap()
        .unwrap();
    tokio::spawn(controller.run());
    Stop(token)
}

/// Upstream's deletion on the first "gone" answer (`--node-deletion-grace-period 0`), the
/// mode upstream's deletion tests describe, while our default waits a minute.
fn upstream_deletion() -> CloudNodeLifecycleConfig {
    CloudNodeLifecycleConfig::default().with_delete_grace_period(Duration::ZERO)
}

struct Stop(CancellationToken);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

fn taint(key: &str, effect: &str) -> Taint {
    Taint {
        key: key.into(),
        effect: effect.into(),
        ..Default::default()
    }
}

fn tainted_node(name: &str) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    node.spec = Some(NodeSpec {
        taints: Some(vec![taint(TAINT_UNINITIALIZED, "NoSchedule")]),
        ..Default::default()
    });
    node
}

async fn create(client: &kube::Client, node: Node) -> Node {
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap()
}

async fn get(client: &kube::Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref().and_then(|s| s.provider_id.clone())
}

fn addresses(node: &Node) -> Vec<NodeAddress> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
}

/// Waits until the Node has lost the uninitialized taint.
async fn initialized(client: &kube::Client, name: &str) -> Node {
    eventually(10, "node initialized", || async {
        get(client, name)
            .await
            .filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
    })
    .await
}

/// The core/v1 events about `node` with `reason`.
async fn events(client: &kube::Client, node: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(node) && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// How many times these events were emitted: client-go's correlator (and ours) records a
/// repeat as `count` on the first Event.
fn times(events: &[Event]) -> i32 {
    events.iter().map(|e| e.count.unwrap_or(1)).sum()
}

fn ip(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

fn fake(instances: impl IntoIterator<Item = FakeInstance>) -> Arc<FakeCloud> {
    Arc::new(FakeCloud::builder().instances(instances).build())
}

fn v1_parts() -> Parts {
    let mut parts = Parts::default();
    parts.instances_v2 = false;
    parts
}

// ---------------------------------------------------------------------------------------------
// cloud-node controller
// ---------------------------------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_tainted_node_is_initialized_from_instance_metadata() {
    // V2 path
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")
        .in_zone("zone-a", "region-1")
        .with_type("fake.large")
        .with_internal_ip(ip("10.0.0.1"))]);
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());

    let node = initialized(&client, "node-1").await;
    assert_eq!(provider_id(&node).as_deref(), Some("fake://i-1"));
    let labels = labels(&node);
    for (key, value) in [
        (LABEL_TOPOLOGY_ZONE, "zone-a"),
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, "zone-a"),
        (LABEL_TOPOLOGY_REGION, "region-1"),
        (LABEL_FAILURE_DOMAIN_BETA_REGION, "region-1"),
        (LABEL_INSTANCE_TYPE_STABLE, "fake.large"),
        (LABEL_INSTANCE_TYPE, "fake.large"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }
    let node = eventually(5, "addresses", || async {
        get(&client, "node-1")
            .await
            .filter(|n| !addresses(n).is_empty())
    })
    .await;
    // The fake reports the instance's hostname too.
    assert_eq!(
        addresses(&node),
        vec![
            node_address("Hostname", "node-1"),
            node_address("InternalIP", "10.0.0.1"),
        ]
    );
    let synced = eventually(5, "Synced event", || async {
        Some(events(&client, "node-1", "Synced").await).filter(|e| !e.is_empty())
    })
    .await;
    assert_eq!(synced[0].type_.as_deref(), Some("Normal"));
    assert_eq!(
        synced[0].message.as_deref(),
        Some("Node synced successfully")
    );
    // With InstancesV2, Zones is never consulted.
    assert_eq!(cloud.call_count(Method::GetZone), 0);
    assert_eq!(cloud.call_count(Method::GetZoneByProviderId), 0);
    assert_eq!(cloud.call_count(Method::GetZoneByNodeName), 0);
}

#[tokio::test(start_paused = true)]
async fn empty_metadata_values_set_no_labels() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")
        .in_zone("", "")
        .with_type("")
        .with_internal_ip(ip("10.0.0.1"))]);
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    let node = initialized(&client, "node-1").await;
    let labels = labels(&node);
    for key in [
        LABEL_TOPOLOGY_ZONE,
        LABEL_FAILURE_DOMAIN_BETA_ZONE,
        LABEL_TOPOLOGY_REGION,
        LABEL_FAILURE_DOMAIN_BETA_REGION,
        LABEL_INSTANCE_TYPE_STABLE,
        LABEL_INSTANCE_TYPE,
    ] {
        assert!(!labels.contains_key(key), "{key} set: {labels:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn additional_labels_are_filtered_and_never_overwrite() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")
        .with_internal_ip(ip("10.0.0.1"))
        .with_label("example.com/team", "blue")
        .with_label("example.com/owner", "cloud")
        .with_label("kubernetes.io/hostname", "evil")
        .with_label("node.kubernetes.io/foo", "evil")
        .with_label("x.k8s.io/bar", "evil")]);
    let mut node = tainted_node("node-1");
    node.metadata.labels = Some(BTreeMap::from([(
        "example.com/owner".to_owned(),
        "operator".to_owned(),
    )]));
    create(&client, node).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    let labels = labels(&initialized(&client, "node-1").await);
    assert_eq!(labels["example.com/team"], "blue");
    assert_eq!(labels["example.com/owner"], "operator");
    assert!(!labels.contains_key("kubernetes.io/hostname"));
    assert!(!labels.contains_key("node.kubernetes.io/foo"));
    assert!(!labels.contains_key("x.k8s.io/bar"));
}

/// A provider whose metadata is whatever the test says.
struct Scripted {
    meta: Option<InstanceMetadata>,
}

#[async_trait]
impl InstancesV2 for Scripted {
    async fn instance_exists(&self, _node: &Node) -> CloudResult<bool> {
        Ok(true)
    }
    async fn instance_shutdown(&self, _node: &Node) -> CloudResult<bool> {
        Ok(false)
    }
    async fn instance_metadata(&self, _node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        Ok(self.meta.clone())
    }
}

impl CloudProvider for Scripted {
    fn provider_name(&self) -> &str {
        "scripted"
    }
    fn instances_v2(&self) -> Option<&dyn InstancesV2> {
        Some(self)
    }
}

#[tokio::test(start_paused = true)]
async fn an_empty_provider_id_keeps_the_taint_and_warns() {
    // Also "a cloud answer that makes no sense".
    let client = client().await;
    let cloud = Arc::new(Scripted {
        meta: Some(
            InstanceMetadata::new("").with_addresses(vec![node_address("InternalIP", "10.0.0.1")]),
        ),
    });
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    let warnings = eventually(10, "warning event", || async {
        Some(events(&client, "node-1", "FailedToInitializeNode").await).filter(|e| !e.is_empty())
    })
    .await;
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    assert!(
        warnings[0]
            .message
            .as_deref()
            .unwrap()
            .contains("does not set node provider ID")
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let node = get(&client, "node-1").await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(provider_id(&node), None);
    // Retried with backoff: more than one warning by now.
    assert!(times(&events(&client, "node-1", "FailedToInitializeNode").await) > 1);
}

#[tokio::test(start_paused = true)]
async fn an_invalid_ip_from_the_cloud_keeps_the_taint_and_warns() {
    // "a cloud answer that makes no sense": an InternalIP that is not an IP address.
    let client = client().await;
    let cloud =
        fake([FakeInstance::new("i-1", "node-1")
            .with_address(node_address("InternalIP", "10.0.0.999"))]);
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    let warnings = eventually(10, "warning event", || async {
        Some(events(&client, "node-1", "FailedToInitializeNode").await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(
        warnings[0]
            .message
            .as_deref()
            .unwrap()
            .contains("10.0.0.999")
    );
    let node = get(&client, "node-1").await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert!(addresses(&node).is_empty());
}

#[tokio::test(start_paused = true)]
async fn nil_metadata_leaves_the_node_tainted_without_retry() {
    let client = client().await;
    // A provider that answers "nothing to say yet" (the fake never does).
    let scripted = Arc::new(Scripted { meta: None });
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, scripted, CloudNodeConfig::default());
    tokio::time::sleep(Duration::from_secs(60)).await;
    let node = get(&client, "node-1").await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert!(
        events(&client, "node-1", "FailedToInitializeNode")
            .await
            .is_empty()
    );
    assert!(events(&client, "node-1", "Synced").await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn v1_not_implemented_instance_id_initializes_by_name() {
    let client = client().await;
    let cloud = Arc::new(
        FakeCloud::builder()
            .parts(v1_parts())
            .instance(FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1")))
            .fault(FaultRule::always(Fault::NotImplemented).on(Method::InstanceId))
            .build(),
    );
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    let node = initialized(&client, "node-1").await;
    assert_eq!(provider_id(&node), None);
    assert!(cloud.call_count(Method::NodeAddresses) >= 1);
}

#[tokio::test(start_paused = true)]
async fn v1_path_sets_provider_id_and_uses_zones() {
    // V1 path, zone fallback by name
    let client = client().await;
    let cloud = Arc::new(
        FakeCloud::builder()
            .parts(v1_parts())
            .instance(
                FakeInstance::new("i-1", "node-1")
                    .in_zone("zone-b", "region-2")
                    .with_internal_ip(ip("10.0.0.1")),
            )
            .fault(FaultRule::always(Fault::Error("boom".into())).on(Method::GetZoneByProviderId))
            .build(),
    );
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    let node = initialized(&client, "node-1").await;
    assert_eq!(provider_id(&node).as_deref(), Some("fake://i-1"));
    assert_eq!(labels(&node)[LABEL_TOPOLOGY_ZONE], "zone-b");
    assert!(cloud.call_count(Method::GetZoneByNodeName) >= 1);
}

#[tokio::test(start_paused = true)]
async fn v1_instance_id_error_keeps_the_taint_and_retries() {
    let client = client().await;
    let cloud = Arc::new(
        FakeCloud::builder()
            .parts(v1_parts())
            .instance(FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1")))
            .fault(FaultRule::always(Fault::Error("throttled".into())).on(Method::InstanceId))
            .build(),
    );
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(has_taint(
        &get(&client, "node-1").await.unwrap(),
        TAINT_UNINITIALIZED
    ));
    let calls = cloud.call_count(Method::InstanceId);
    assert!(calls > 2, "retried with backoff: {calls} calls");
    // Once the cloud recovers, the retry initializes the Node.
    cloud.clear_faults();
    let node = eventually(30, "initialized after recovery", || async {
        get(&client, "node-1")
            .await
            .filter(|n| !has_taint(n, TAINT_UNINITIALIZED))
    })
    .await;
    assert_eq!(provider_id(&node).as_deref(), Some("fake://i-1"));
}

#[tokio::test(start_paused = true)]
async fn provided_node_ip_orders_addresses() {
    // The cloud's Hostname wins
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")
        .with_internal_ip(ip("10.0.0.1"))
        .with_internal_ip(ip("10.0.0.2"))
        .with_external_ip(ip("203.0.113.5"))]);
    let mut node = tainted_node("node-1");
    node.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_PROVIDED_NODE_IP.to_owned(),
        "10.0.0.2".to_owned(),
    )]));
    create(&client, node).await;
    Api::<Node>::all(client.clone())
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(&Node {
                status: Some(NodeStatus {
                    addresses: Some(vec![node_address("Hostname", "node-1.local")]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    initialized(&client, "node-1").await;
    let node = eventually(5, "addresses", || async {
        get(&client, "node-1")
            .await
            .filter(|n| addresses(n).len() == 3)
    })
    .await;
    assert_eq!(
        addresses(&node),
        vec![
            node_address("InternalIP", "10.0.0.2"),
            node_address("Hostname", "node-1"),
            node_address("ExternalIP", "203.0.113.5"),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn provided_node_ip_not_in_the_cloud_keeps_the_taint() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1"))]);
    let mut node = tainted_node("node-1");
    node.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_PROVIDED_NODE_IP.to_owned(),
        "10.9.9.9".to_owned(),
    )]));
    create(&client, node).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    eventually(10, "warning event", || async {
        Some(events(&client, "node-1", "FailedToInitializeNode").await).filter(|e| !e.is_empty())
    })
    .await;
    let node = get(&client, "node-1").await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert_eq!(provider_id(&node), None);
}

#[tokio::test(start_paused = true)]
async fn initialized_nodes_get_label_mirroring_and_no_cloud_calls() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1"))]);
    let mut node = Node::default();
    node.metadata.name = Some("node-1".into());
    node.metadata.labels = Some(BTreeMap::from([
        (
            LABEL_FAILURE_DOMAIN_BETA_ZONE.to_owned(),
            "zone-a".to_owned(),
        ),
        (LABEL_TOPOLOGY_ZONE.to_owned(), "stale".to_owned()),
        (LABEL_TOPOLOGY_REGION.to_owned(), "only-ga".to_owned()),
    ]));
    create(&client, node).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    let node = eventually(5, "GA zone mirrored", || async {
        get(&client, "node-1")
            .await
            .filter(|n| labels(n).get(LABEL_TOPOLOGY_ZONE).map(String::as_str) == Some("zone-a"))
    })
    .await;
    assert_eq!(labels(&node)[LABEL_TOPOLOGY_REGION], "only-ga");
    assert!(!labels(&node).contains_key(LABEL_FAILURE_DOMAIN_BETA_REGION));
    assert_eq!(provider_id(&node), None, "providerID is never set later");
    assert_eq!(cloud.total_calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn addresses_are_refreshed_periodically_with_change_detection() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1"))]);
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    initialized(&client, "node-1").await;
    let first = eventually(5, "addresses", || async {
        get(&client, "node-1")
            .await
            .filter(|n| !addresses(n).is_empty())
    })
    .await;
    // Nothing changed in the cloud → no patch at the refresh.
    let calls_before = cloud.call_count(Method::InstanceMetadataBatch);
    tokio::time::sleep(Duration::from_secs(301)).await;
    assert!(
        cloud.call_count(Method::InstanceMetadataBatch) > calls_before,
        "refreshed"
    );
    let same = get(&client, "node-1").await.unwrap();
    assert_eq!(
        same.metadata.resource_version,
        first.metadata.resource_version
    );
    // The instance gets a new IP; the next refresh writes it.
    cloud.remove_instance("i-1");
    cloud.add_instance(FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.7")));
    let node = eventually(301, "new address", || async {
        get(&client, "node-1")
            .await
            .filter(|n| addresses(n).contains(&node_address("InternalIP", "10.0.0.7")))
    })
    .await;
    assert!(!has_taint(&node, TAINT_UNINITIALIZED));
    // An empty cloud address list → no patch.
    cloud.remove_instance("i-1");
    let mut bare = FakeInstance::new("i-1", "node-1");
    bare.addresses.clear();
    cloud.add_instance(bare);
    let before = get(&client, "node-1").await.unwrap();
    tokio::time::sleep(Duration::from_secs(301)).await;
    assert_eq!(
        addresses(&get(&client, "node-1").await.unwrap()),
        addresses(&before)
    );
}

#[tokio::test(start_paused = true)]
async fn no_instances_skips_and_zero_syncs_is_an_error() {
    // Also "concurrent-node-syncs > 0".
    let client = client().await;
    let mut parts = Parts::default();
    parts.instances = false;
    parts.instances_v2 = false;
    let cloud: Arc<dyn CloudProvider> = Arc::new(FakeCloud::builder().parts(parts).build());
    let (c, _t) = ctx(&client, cloud.clone());
    assert!(
        CloudNodeController::new(c, CloudNodeConfig::default())
            .unwrap()
            .is_none()
    );
    let (c, _t) = ctx(&client, cloud);
    assert!(
        CloudNodeLifecycleController::new(c, CloudNodeLifecycleConfig::default())
            .unwrap()
            .is_none()
    );
    let (c, _t) = ctx(&client, fake([]));
    let err = CloudNodeController::new(c, CloudNodeConfig::default().with_concurrent_node_syncs(0))
        .unwrap_err();
    assert_eq!(err, CloudNodeConfigError::ZeroConcurrentNodeSyncs);
}

async fn batching_calls(batch: bool) -> (usize, usize) {
    let client = client().await;
    let cloud = fake((0..50).map(|i| {
        FakeInstance::new(format!("i-{i}"), format!("node-{i}"))
            .with_internal_ip(ip(&format!("10.0.1.{i}")))
    }));
    for i in 0..50 {
        create(&client, tainted_node(&format!("node-{i}"))).await;
    }
    let _stop = start_node(
        &client,
        cloud.clone(),
        CloudNodeConfig::default().with_batch(batch),
    );
    for i in 0..50 {
        initialized(&client, &format!("node-{i}")).await;
    }
    (
        cloud.call_count(Method::InstanceMetadataBatch),
        cloud.call_count(Method::InstanceMetadata),
    )
}

#[tokio::test(start_paused = true)]
async fn fifty_waiting_nodes_take_one_batched_call() {
    // Beyond upstream: one cloud call per sync, not one per Node.
    assert_eq!(batching_calls(true).await, (1, 0));
    // Upstream's behaviour, with `batch: false`: one call per Node.
    assert_eq!(batching_calls(false).await, (0, 50));
}

/// A client whose requests are recorded (and can be failed) by a [`crate::tap::Tap`].
async fn tapped_client() -> (kube::Client, Arc<crate::tap::Tap>) {
    let server = ccm_testkit::memory_server().await;
    crate::tap::Tap::client(&server)
}

/// Upstream `controllers/node/node_controller.go` `syncNode`: the initializing write is a full
/// `Update` (PUT of the whole Node: providerID set, taint gone) retried on conflict after 50 ms
/// with a fresh read, then a separate strategic/merge patch of `nodes/<name>/status` for the
/// addresses. Same method as upstream. (Requests recorded at the API server; the first PUT is
/// answered 409 Conflict.)
#[tokio::test(start_paused = true)]
async fn initialization_is_a_put_retried_on_conflict_then_a_status_patch() {
    let (client, tap) = tapped_client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1"))]);
    create(&client, tainted_node("node-1")).await;
    tap.fail(
        axum::http::Method::PUT,
        "/api/v1/nodes/node-1",
        409,
        "Conflict",
        1,
    );
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    initialized(&client, "node-1").await;
    eventually(5, "addresses", || async {
        get(&client, "node-1")
            .await
            .filter(|n| !addresses(n).is_empty())
    })
    .await;

    let writes: Vec<crate::tap::Seen> = tap
        .writes()
        .into_iter()
        .filter(|w| w.path.starts_with("/api/v1/nodes/node-1"))
        .collect();
    let shape: Vec<(String, &str, Option<u16>)> = writes
        .iter()
        .map(|w| (w.method.to_string(), w.path.as_str(), w.failed_with))
        .collect();
    assert_eq!(
        shape,
        vec![
            ("PUT".to_owned(), "/api/v1/nodes/node-1", Some(409)),
            ("PUT".to_owned(), "/api/v1/nodes/node-1", None),
            ("PATCH".to_owned(), "/api/v1/nodes/node-1/status", None),
        ]
    );
    assert!(
        writes[1].at - writes[0].at >= Duration::from_millis(50),
        "retried after the 50 ms step"
    );
    // The retry re-read the Node between the two PUTs.
    let reread = tap.seen().into_iter().any(|s| {
        s.method == axum::http::Method::GET
            && s.path == "/api/v1/nodes/node-1"
            && s.at >= writes[0].at
            && s.at <= writes[1].at
    });
    assert!(reread, "a fresh GET before the second PUT");
    let put: Node = serde_json::from_value(writes[1].json()).unwrap();
    assert_eq!(provider_id(&put).as_deref(), Some("fake://i-1"));
    assert!(!has_taint(&put, TAINT_UNINITIALIZED));
    assert!(
        put.metadata.resource_version.is_some(),
        "a full object with its resourceVersion"
    );
    let patch = writes[2].json();
    assert!(patch["status"]["addresses"].is_array(), "{patch}");
    assert!(patch.get("spec").is_none(), "{patch}");
}

/// Upstream's `initializeNode` reads the Node from its lister when it writes, not the copy
/// the sync began with. A Node changed while its batch's cloud lookup runs is written from its
/// current version: one PUT, no conflict, and the change is kept. (The batch holds names, not
/// Nodes, so at 10,000 Nodes it no longer keeps every listed version alive beside the ones
/// its initializations make.)
#[tokio::test(start_paused = true)]
async fn a_node_changed_during_the_cloud_lookup_is_initialized_from_its_current_version() {
    let (client, tap) = tapped_client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1").with_internal_ip(ip("10.0.0.1"))]);
    cloud.set_method_latency(Method::InstanceMetadataBatch, Duration::from_secs(5));
    create(&client, tainted_node("node-1")).await;
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    // The lookup is in the cloud (a call is recorded when it starts) ...
    eventually(5, "the batched lookup began", || async {
        (cloud.call_count(Method::InstanceMetadataBatch) == 1).then_some(())
    })
    .await;
    // ... when another writer changes the Node.
    let patch = serde_json::json!({"metadata": {"labels": {"changed": "during-lookup"}}});
    Api::<Node>::all(client.clone())
        .patch("node-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let node = initialized(&client, "node-1").await;
    assert_eq!(
        labels(&node).get("changed").map(String::as_str),
        Some("during-lookup")
    );
    // From the version the batch began with, the PUT is answered 409 Conflict and retried.
    let puts = tap
        .writes()
        .into_iter()
        .filter(|w| w.method == axum::http::Method::PUT && w.path == "/api/v1/nodes/node-1")
        .count();
    assert_eq!(puts, 1, "one PUT, from the Node's current version");
}

// ---------------------------------------------------------------------------------------------
// cloud-node-lifecycle controller
// ---------------------------------------------------------------------------------------------

async fn node_with_ready(
    client: &kube::Client,
    name: &str,
    ready: Option<&str>,
    taints: Vec<Taint>,
    provider: Option<&str>,
) {
    let mut node = Node::default();
    node.metadata.name = Some(name.into());
    node.spec = Some(NodeSpec {
        taints: Some(taints),
        provider_id: provider.map(Into::into),
        ..Default::default()
    });
    create(client, node).await;
    if let Some(status) = ready {
        Api::<Node>::all(client.clone())
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&Node {
                    status: Some(NodeStatus {
                        conditions: Some(vec![NodeCondition {
                            type_: "Ready".into(),
                            status: status.into(),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            )
            .await
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_ready_node_loses_the_shutdown_taint_without_cloud_calls() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")]);
    node_with_ready(
        &client,
        "node-1",
        Some("True"),
        vec![taint(TAINT_SHUTDOWN, "NoSchedule")],
        Some("fake://i-1"),
    )
    .await;
    let _stop = start_lifecycle(&client, cloud.clone(), CloudNodeLifecycleConfig::default());
    eventually(10, "shutdown taint removed", || async {
        get(&client, "node-1")
            .await
            .filter(|n| !has_taint(n, TAINT_SHUTDOWN))
    })
    .await;
    assert_eq!(cloud.total_calls(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_not_ready_node_gone_from_the_cloud_is_deleted() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")]);
    node_with_ready(&client, "node-1", Some("False"), vec![], Some("fake://i-1")).await;
    let _stop = start_lifecycle(&client, cloud.clone(), upstream_deletion());
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(get(&client, "node-1").await.is_some());
    // Every 5 s: an existence check per period.
    let checks = cloud.call_count(Method::InstanceExists);
    assert!(
        (2..=4).contains(&checks),
        "{checks} existence checks in 12 s"
    );
    cloud.terminate_instance("i-1");
    eventually(10, "node deleted", || async {
        get(&client, "node-1").await.is_none().then_some(())
    })
    .await;
    let deleting = events(&client, "node-1", "DeletingNode").await;
    assert_eq!(deleting.len(), 1);
    assert_eq!(deleting[0].type_.as_deref(), Some("Normal"));
    assert_eq!(
        deleting[0].message.as_deref(),
        Some("Deleting node node-1 because it does not exist in the cloud provider")
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_without_ready_condition_is_checked() {
    let client = client().await;
    let cloud = fake([]);
    node_with_ready(&client, "node-1", None, vec![], Some("fake://i-gone")).await;
    let _stop = start_lifecycle(&client, cloud, upstream_deletion());
    eventually(10, "node deleted", || async {
        get(&client, "node-1").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn v1_instance_not_found_for_a_node_without_provider_id_deletes_it() {
    let client = client().await;
    let cloud = Arc::new(FakeCloud::builder().parts(v1_parts()).build());
    node_with_ready(&client, "node-1", Some("Unknown"), vec![], None).await;
    let _stop = start_lifecycle(&client, cloud.clone(), upstream_deletion());
    eventually(10, "node deleted", || async {
        get(&client, "node-1").await.is_none().then_some(())
    })
    .await;
    assert!(cloud.call_count(Method::InstanceId) >= 1);
}

#[tokio::test(start_paused = true)]
async fn an_existence_error_leaves_the_node_alone() {
    let client = client().await;
    let cloud = fake([]);
    cloud.inject(FaultRule::always(Fault::Error("api down".into())).on(Method::InstanceExists));
    node_with_ready(
        &client,
        "node-1",
        Some("False"),
        vec![],
        Some("fake://i-gone"),
    )
    .await;
    let _stop = start_lifecycle(&client, cloud.clone(), CloudNodeLifecycleConfig::default());
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(get(&client, "node-1").await.is_some());
    assert!(cloud.call_count(Method::InstanceExists) >= 5);
}

#[tokio::test(start_paused = true)]
async fn instance_not_found_from_the_existence_check_counts_as_gone() {
    // Beyond upstream: upstream would leave this Node forever.
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")]);
    cloud.inject(FaultRule::always(Fault::InstanceNotFound).on(Method::InstanceExists));
    node_with_ready(&client, "node-1", Some("False"), vec![], Some("fake://i-1")).await;
    let _stop = start_lifecycle(&client, cloud, upstream_deletion());
    eventually(10, "node deleted", || async {
        get(&client, "node-1").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_stopped_instance_gets_the_shutdown_taint() {
    // Removed again once Ready
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")]);
    cloud.stop_instance("i-1");
    node_with_ready(&client, "node-1", Some("False"), vec![], Some("fake://i-1")).await;
    let _stop = start_lifecycle(&client, cloud, CloudNodeLifecycleConfig::default());
    let node = eventually(10, "shutdown taint", || async {
        get(&client, "node-1")
            .await
            .filter(|n| has_taint(n, TAINT_SHUTDOWN))
    })
    .await;
    let taint = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .find(|t| t.key == TAINT_SHUTDOWN)
        .unwrap();
    assert_eq!(taint.effect, "NoSchedule");
    assert!(
        get(&client, "node-1").await.is_some(),
        "a stopped instance is not deleted"
    );
}

#[tokio::test(start_paused = true)]
async fn v1_shutdown_not_implemented_or_error_adds_no_taint() {
    let client = client().await;
    let cloud = Arc::new(
        FakeCloud::builder()
            .parts(v1_parts())
            .instance(FakeInstance::new("i-1", "node-1"))
            .instance(FakeInstance::new("i-2", "node-2"))
            .fault(
                FaultRule::always(Fault::NotImplemented).on(Method::InstanceShutdownByProviderId),
            )
            .build(),
    );
    cloud.stop_instance("i-1");
    node_with_ready(&client, "node-1", Some("False"), vec![], Some("fake://i-1")).await;
    let _stop = start_lifecycle(&client, cloud.clone(), CloudNodeLifecycleConfig::default());
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(cloud.call_count(Method::InstanceShutdownByProviderId) >= 2);
    let node = get(&client, "node-1").await.unwrap();
    assert!(!has_taint(&node, TAINT_SHUTDOWN));
    // A plain error from the shutdown check adds no taint either.
    let client2 = self::client().await;
    let cloud2 = fake([FakeInstance::new("i-2", "node-2")]);
    cloud2.stop_instance("i-2");
    cloud2.inject(FaultRule::always(Fault::Error("boom".into())).on(Method::InstanceShutdown));
    node_with_ready(
        &client2,
        "node-2",
        Some("False"),
        vec![],
        Some("fake://i-2"),
    )
    .await;
    let _stop2 = start_lifecycle(
        &client2,
        cloud2.clone(),
        CloudNodeLifecycleConfig::default(),
    );
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(cloud2.call_count(Method::InstanceShutdown) >= 2);
    let node = get(&client2, "node-2").await.unwrap();
    assert!(!has_taint(&node, TAINT_SHUTDOWN));
}

#[tokio::test(start_paused = true)]
async fn the_delete_grace_period_delays_deletion() {
    // Beyond upstream: wait `delete_grace_period` after the first "gone".
    let client = client().await;
    let cloud = fake([]);
    node_with_ready(
        &client,
        "node-1",
        Some("False"),
        vec![],
        Some("fake://i-gone"),
    )
    .await;
    let _stop = start_lifecycle(
        &client,
        cloud,
        CloudNodeLifecycleConfig::default().with_delete_grace_period(Duration::from_secs(60)),
    );
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert!(
        get(&client, "node-1").await.is_some(),
        "still within the grace period"
    );
    eventually(20, "node deleted after the grace period", || async {
        get(&client, "node-1").await.is_none().then_some(())
    })
    .await;
}

/// kubernetes#127424 ("EKS has seen … delete a Node that does exist"): by default one "gone"
/// answer from an eventually-consistent cloud deletes nothing. The instance is reported gone
/// for 30 s and then exists again: the Node stays; gone for good, it goes after the default
/// grace period (60 s of "gone" answers).
#[tokio::test(start_paused = true)]
async fn by_default_a_transient_gone_answer_deletes_no_node() {
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")]);
    node_with_ready(&client, "node-1", Some("False"), vec![], Some("fake://i-1")).await;
    cloud.remove_instance("i-1");
    let _stop = start_lifecycle(&client, cloud.clone(), CloudNodeLifecycleConfig::default());
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(cloud.call_count(Method::InstanceExists) >= 5);
    assert!(
        get(&client, "node-1").await.is_some(),
        "deleted on a transient answer"
    );
    cloud.add_instance(FakeInstance::new("i-1", "node-1"));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        get(&client, "node-1").await.is_some(),
        "the instance exists again"
    );
    cloud.remove_instance("i-1");
    tokio::time::sleep(Duration::from_secs(50)).await;
    assert!(
        get(&client, "node-1").await.is_some(),
        "the grace period starts again after an \"exists\""
    );
    eventually(
        20,
        "node deleted after the default grace period",
        || async { get(&client, "node-1").await.is_none().then_some(()) },
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_bad_provided_node_ip_annotation_keeps_the_taint() {
    // Two IPs of the same family is a parse error.
    let client = client().await;
    let cloud = fake([FakeInstance::new("i-1", "node-1")
        .with_internal_ip(ip("10.0.0.1"))
        .with_internal_ip(ip("10.0.0.2"))]);
    let mut node = tainted_node("node-1");
    node.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_PROVIDED_NODE_IP.to_owned(),
        "10.0.0.1,10.0.0.2".to_owned(),
    )]));
    create(&client, node).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    let warnings = eventually(10, "warning event", || async {
        Some(events(&client, "node-1", "FailedToInitializeNode").await).filter(|e| !e.is_empty())
    })
    .await;
    assert!(
        warnings[0]
            .message
            .as_deref()
            .unwrap()
            .contains("dual-stack")
    );
    let node = get(&client, "node-1").await.unwrap();
    assert!(has_taint(&node, TAINT_UNINITIALIZED));
    assert!(addresses(&node).is_empty());
}

/// Upstream `k8s.io/cloud-provider/controllers/nodelifecycle/node_lifecycle_controller.go`
/// `MonitorNodes`: when deleting a Node gone from the cloud fails, `Warning
/// DeletingNodeFailed` is recorded and the Node is deleted on a later period.
/// (The API server's answer to the first DELETE is a 500, injected.)
#[tokio::test(start_paused = true)]
async fn a_failed_delete_of_a_node_gone_from_the_cloud_warns_and_is_retried() {
    let (client, tap) = tapped_client().await;
    let cloud = fake([]);
    node_with_ready(
        &client,
        "node-1",
        Some("False"),
        vec![],
        Some("fake://i-gone"),
    )
    .await;
    tap.fail(
        axum::http::Method::DELETE,
        "/api/v1/nodes/node-1",
        500,
        "InternalError",
        1,
    );
    let _stop = start_lifecycle(&client, cloud, upstream_deletion());
    let failed = eventually(10, "DeletingNodeFailed", || async {
        Some(events(&client, "node-1", "DeletingNodeFailed").await).filter(|e| !e.is_empty())
    })
    .await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].type_.as_deref(), Some("Warning"));
    let message = failed[0].message.clone().unwrap_or_default();
    assert!(
        message.starts_with("Error deleting node node-1: "),
        "{message}"
    );
    eventually(10, "node deleted on a later period", || async {
        get(&client, "node-1").await.is_none().then_some(())
    })
    .await;
    let deletes: Vec<Option<u16>> = tap
        .seen()
        .into_iter()
        .filter(|s| s.method == axum::http::Method::DELETE && s.path == "/api/v1/nodes/node-1")
        .map(|s| s.failed_with)
        .collect();
    assert_eq!(deletes, vec![Some(500), None]);
    assert_eq!(times(&events(&client, "node-1", "DeletingNode").await), 2);
}

/// Beyond upstream, over a real socket: Nodes that register while a batched call
/// is in flight are taken together by the next sync. The watch must be read while the
/// controller syncs: an HTTP body read only between syncs hands over about one event per
/// sync, so with Nodes registering every 20 ms, another writer keeping the watch busy and
/// 100 ms calls, nearly every Node takes a call of its own (54 to 60 calls measured) instead
/// of sharing about one call per 100 ms (11 measured).
/// Real time on loopback over TLS (paused time would jump on a real socket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_arriving_during_a_sync_over_tls_share_the_next_batch() {
    let server = ccm_testkit::memory_server().await;
    let served = ccm_testkit::TestServer::start(server).await.unwrap();
    let client = served.admin_client().await.unwrap();
    let cloud = Arc::new(
        FakeCloud::builder()
            .instances((0..61).map(|i| {
                FakeInstance::new(format!("i-{i}"), format!("node-{i}"))
                    .with_internal_ip(ip(&format!("10.0.2.{i}")))
            }))
            .build(),
    );
    cloud.set_method_latency(
        Method::InstanceMetadataBatch,
        std::time::Duration::from_millis(100),
    );
    let _stop = start_node(&client, cloud.clone(), CloudNodeConfig::default());
    // Other writers keep the watch busy, as kubelets and IPAM do in a real cluster.
    create(&client, tainted_node("busy")).await;
    let noise = tokio::spawn({
        let nodes: Api<Node> = Api::all(client.clone());
        async move {
            for i in 0u64.. {
                let patch = serde_json::json!({"metadata": {"labels": {"beat": i.to_string()}}});
                if nodes
                    .patch("busy", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_err()
                {
                    return;
                }
                // A beat every millisecond; the sleep also yields, so the writer never starves the
                // runtime.
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
    });
    let _noise_guard = AbortOnDrop(noise.abort_handle());
    let mut every = tokio::time::interval(std::time::Duration::from_millis(20));
    for i in 0..61 {
        every.tick().await;
        create(&client, tainted_node(&format!("node-{i}"))).await;
    }
    for i in 0..61 {
        initialized(&client, &format!("node-{i}")).await;
    }
    let batches = cloud.call_count(Method::InstanceMetadataBatch);
    assert!(
        batches <= 30,
        "61 nodes took {batches} batched calls; nodes that arrive during a sync should share the next one"
    );
    served.stop().await.unwrap();
}

/// Aborts a task when dropped, so a failed assertion does not leave it running.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// client-go's rate-limited workqueue (5 ms doubling per failure, forgotten only on success):
/// a label mirror that keeps failing is retried about a dozen times in 10 s, not every 5 ms.
#[tokio::test(start_paused = true)]
async fn a_failing_label_mirror_backs_off_exponentially() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let server = ccm_testkit::memory_server().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let router = server.router().layer(axum::middleware::from_fn({
        let attempts = attempts.clone();
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let attempts = attempts.clone();
            async move {
                if request.method() == axum::http::Method::PATCH
                    && request.uri().path() == "/api/v1/nodes/node-1"
                {
                    attempts.fetch_add(1, SeqCst);
                    let status = serde_json::json!({"kind": "Status", "apiVersion": "v1",
                        "status": "Failure", "message": "injected", "reason": "InternalError",
                        "code": 500});
                    return axum::response::IntoResponse::into_response((
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        axum::Json(status),
                    ));
                }
                next.run(request).await
            }
        }
    }));
    let client = kube::Client::new(router, "default");
    let cloud = fake([FakeInstance::new("i-1", "node-1")]);
    let mut node = Node::default();
    node.metadata.name = Some("node-1".into());
    node.metadata.labels = Some(BTreeMap::from([(
        LABEL_FAILURE_DOMAIN_BETA_ZONE.to_owned(),
        "zone-a".to_owned(),
    )]));
    create(&client, node).await;
    let _stop = start_node(&client, cloud, CloudNodeConfig::default());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let attempts = attempts.load(SeqCst);
    // 5 ms · (2^n − 1) ≤ 10 s gives n = 10 retries after the first attempt.
    assert!((5..=16).contains(&attempts), "{attempts} attempts in 10 s");
}

fn maintenance_condition(node: &Node) -> Option<NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_MAINTENANCE_PLANNED)
        .cloned()
}

/// Beyond upstream (the Node condition KEP-5683 proposes): an event the cloud schedules for
/// a Node's instance sets `MaintenancePlanned=True` with its kind as reason and its time and
/// description in the message, plus the `PreferNoSchedule` taint when asked; when the event
/// passes the condition turns `False` and the taint goes. Other Nodes are left alone.
#[tokio::test(start_paused = true)]
async fn a_scheduled_cloud_event_sets_maintenance_planned_until_it_passes() {
    let client = client().await;
    let cloud = fake([
        FakeInstance::new("i-1", "node-1"),
        FakeInstance::new("i-2", "node-2"),
    ]);
    node_with_ready(&client, "node-1", Some("True"), vec![], Some("fake://i-1")).await;
    node_with_ready(&client, "node-2", Some("True"), vec![], Some("fake://i-2")).await;
    let at = std::time::UNIX_EPOCH + Duration::from_secs(4_102_444_800); // 2100-01-01
    cloud.schedule_event(
        ScheduledEvent::new("fake://i-1", ScheduledEventKind::Maintenance, at)
            .with_description("host maintenance"),
    );
    let config = CloudNodeLifecycleConfig::default()
        .with_maintenance(Some(MaintenanceConfig::new(Duration::from_secs(10), true)));
    let _stop = start_lifecycle(&client, cloud.clone(), config);
    let node = eventually(30, "MaintenancePlanned=True", || async {
        get(&client, "node-1")
            .await
            .filter(|n| maintenance_condition(n).is_some_and(|c| c.status == "True"))
            .filter(|n| has_taint(n, TAINT_MAINTENANCE_PLANNED))
    })
    .await;
    let condition = maintenance_condition(&node).unwrap();
    assert_eq!(condition.reason.as_deref(), Some("Maintenance"));
    assert_eq!(
        condition.message.as_deref(),
        Some("Maintenance scheduled from 2100-01-01T00:00:00Z: host maintenance")
    );
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|t| t.iter().find(|t| t.key == TAINT_MAINTENANCE_PLANNED))
        .cloned()
        .unwrap();
    assert_eq!(taint.effect, "PreferNoSchedule");
    let other = get(&client, "node-2").await.unwrap();
    assert!(
        maintenance_condition(&other).is_none(),
        "node-2 has nothing planned"
    );
    assert!(!has_taint(&other, TAINT_MAINTENANCE_PLANNED));

    cloud.clear_scheduled_events("fake://i-1");
    let node = eventually(30, "MaintenancePlanned=False", || async {
        get(&client, "node-1")
            .await
            .filter(|n| maintenance_condition(n).is_some_and(|c| c.status == "False"))
            .filter(|n| !has_taint(n, TAINT_MAINTENANCE_PLANNED))
    })
    .await;
    assert_eq!(
        maintenance_condition(&node).unwrap().reason.as_deref(),
        Some("NoMaintenancePlanned")
    );
    assert!(cloud.call_count(Method::ScheduledEvents) >= 2);
}

/// Non-graceful node shutdown opt-in (beyond upstream, where an administrator adds the
/// taint; pod GC's `gcTerminating` in `pkg/controller/podgc/gc_controller.go` acts on it):
/// a Node NotReady with its instance stopped gets the shutdown taint at once and
/// `node.kubernetes.io/out-of-service:NoExecute` only after `out_of_service_after`; both go
/// when the Node is Ready again. Off (the default), no out-of-service taint is added.
#[tokio::test(start_paused = true)]
async fn a_stopped_not_ready_node_gets_the_out_of_service_taint_after_the_configured_time() {
    const OUT_OF_SERVICE: &str = "node.kubernetes.io/out-of-service";
    let client = client().await;
    let cloud = fake([
        FakeInstance::new("i-1", "node-1"),
        FakeInstance::new("i-2", "node-2"),
    ]);
    cloud.stop_instance("i-1");
    cloud.stop_instance("i-2");
    node_with_ready(&client, "node-1", Some("False"), vec![], Some("fake://i-1")).await;
    let config = CloudNodeLifecycleConfig::default()
        .with_out_of_service_after(Some(Duration::from_secs(60)));
    let _stop = start_lifecycle(&client, cloud.clone(), config);
    eventually(10, "shutdown taint", || async {
        get(&client, "node-1")
            .await
            .filter(|n| has_taint(n, TAINT_SHUTDOWN))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        !has_taint(&get(&client, "node-1").await.unwrap(), OUT_OF_SERVICE),
        "not before the configured time"
    );
    let node = eventually(60, "out-of-service taint", || async {
        get(&client, "node-1")
            .await
            .filter(|n| has_taint(n, OUT_OF_SERVICE))
    })
    .await;
    let taint = node
        .spec
        .unwrap()
        .taints
        .unwrap()
        .into_iter()
        .find(|t| t.key == OUT_OF_SERVICE)
        .unwrap();
    assert_eq!(taint.effect, "NoExecute");
    assert!(has_taint(
        &get(&client, "node-1").await.unwrap(),
        TAINT_SHUTDOWN
    ));

    // Ready again: both taints go.
    Api::<Node>::all(client.clone())
        .patch_status(
            "node-1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"conditions": [
                {"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    eventually(20, "taints removed when Ready", || async {
        get(&client, "node-1")
            .await
            .filter(|n| !has_taint(n, OUT_OF_SERVICE) && !has_taint(n, TAINT_SHUTDOWN))
    })
    .await;

    // The default leaves the out-of-service taint to an administrator.
    let client = ccm_testkit::client().await;
    node_with_ready(&client, "node-2", Some("False"), vec![], Some("fake://i-2")).await;
    let _stop2 = start_lifecycle(&client, cloud, CloudNodeLifecycleConfig::default());
    tokio::time::sleep(Duration::from_secs(120)).await;
    let node = get(&client, "node-2").await.unwrap();
    assert!(has_taint(&node, TAINT_SHUTDOWN) && !has_taint(&node, OUT_OF_SERVICE));
}
