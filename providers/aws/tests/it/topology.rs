//! Network topology labels (upstream `topology.go`) against a loopback fake EC2, since moto does
//! not implement DescribeInstanceTopology: the fake answers DescribeInstances,
//! DescribeAvailabilityZones and DescribeInstanceTopology and records the topology calls.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, ensure};
use cloud_provider::{CloudProvider, InstanceMetadata, conformance::Fixture};
use cloud_provider_aws::{AwsCloud, AwsOptions, NETWORK_NODE_LABEL_PREFIX, ZONE_ID_LABEL};
use k8s_openapi::api::core::v1::Node;
use parking_lot::Mutex;

use crate::common;

const NS: &str = "xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"";

/// The fake EC2: instance types by ID, and the instance IDs of each DescribeInstanceTopology.
#[derive(Default)]
struct FakeEc2 {
    types: HashMap<String, String>,
    /// An error DescribeInstanceTopology answers with (HTTP status, code) instead of topologies.
    topology_error: Mutex<Option<(u16, &'static str)>>,
    topology_calls: Mutex<Vec<Vec<String>>>,
}

/// The network nodes the fake gives `id`: three layers named after it.
fn nodes_of(id: &str) -> [String; 3] {
    [
        "nn-spine".to_owned(),
        format!("nn-agg-{id}"),
        format!("nn-leaf-{id}"),
    ]
}

impl FakeEc2 {
    fn answer(&self, body: &str) -> common::Answer {
        let form = common::form(body);
        let action = form
            .iter()
            .find(|(k, _)| k == "Action")
            .map(|(_, v)| v.as_str())
            .unwrap_or_default();
        let ids: Vec<String> = form
            .iter()
            .filter(|(k, _)| k.starts_with("InstanceId."))
            .map(|(_, v)| v.clone())
            .collect();
        let item = |id: &String| -> Option<(&String, &String)> { self.types.get_key_value(id) };
        let xml = match action {
            "DescribeInstances" => {
                let items: String = ids
                    .iter()
                    .filter_map(item)
                    .map(|(id, ty)| {
                        format!(
                            "<item><instanceId>{id}</instanceId><instanceType>{ty}</instanceType>\
                             <placement><availabilityZone>us-east-1a</availabilityZone></placement>\
                             <instanceState><code>16</code><name>running</name></instanceState>\
                             <privateDnsName>ip-{id}.ec2.internal</privateDnsName></item>"
                        )
                    })
                    .collect();
                format!(
                    "<DescribeInstancesResponse {NS}><requestId>r</requestId><reservationSet>\
                     <item><reservationId>r-1</reservationId><ownerId>1</ownerId>\
                     <instancesSet>{items}</instancesSet></item></reservationSet>\
                     </DescribeInstancesResponse>"
                )
            }
            "DescribeAvailabilityZones" => format!(
                "<DescribeAvailabilityZonesResponse {NS}><requestId>r</requestId>\
                 <availabilityZoneInfo><item><zoneName>us-east-1a</zoneName>\
                 <zoneId>use1-az4</zoneId><zoneState>available</zoneState></item>\
                 </availabilityZoneInfo></DescribeAvailabilityZonesResponse>"
            ),
            "DescribeInstanceTopology" => {
                self.topology_calls.lock().push(ids.clone());
                if let Some((status, code)) = *self.topology_error.lock() {
                    return (
                        status,
                        format!(
                            "<Response><Errors><Error><Code>{code}</Code><Message>no</Message>\
                             </Error></Errors><RequestID>r</RequestID></Response>"
                        ),
                    );
                }
                let items: String = ids
                    .iter()
                    .filter_map(item)
                    .map(|(id, ty)| {
                        let nodes: String = nodes_of(id)
                            .iter()
                            .map(|n| format!("<item>{n}</item>"))
                            .collect();
                        format!(
                            "<item><instanceId>{id}</instanceId><instanceType>{ty}</instanceType>\
                             <networkNodeSet>{nodes}</networkNodeSet>\
                             <availabilityZone>us-east-1a</availabilityZone>\
                             <zoneId>use1-az4</zoneId></item>"
                        )
                    })
                    .collect();
                format!(
                    "<DescribeInstanceTopologyResponse {NS}><requestId>r</requestId>\
                     <instanceSet>{items}</instanceSet></DescribeInstanceTopologyResponse>"
                )
            }
            other => return (400, format!("<Response>unexpected {other}</Response>")),
        };
        (200, xml)
    }
}

fn instance_id(n: usize) -> String {
    format!("i-{n:017x}")
}

/// A provider for a fake EC2 running `types`.
async fn fake(types: &[(String, &str)]) -> anyhow::Result<(Arc<FakeEc2>, AwsCloud)> {
    fake_failing(types, None, AwsOptions::default()).await
}

/// A provider (with `options`) for a fake EC2 running `types` whose DescribeInstanceTopology
/// fails with `topology_error` (HTTP status, code).
async fn fake_failing(
    types: &[(String, &str)],
    topology_error: Option<(u16, &'static str)>,
    options: AwsOptions,
) -> anyhow::Result<(Arc<FakeEc2>, AwsCloud)> {
    let ec2 = Arc::new(FakeEc2 {
        types: types
            .iter()
            .map(|(id, ty)| (id.clone(), ty.to_string()))
            .collect(),
        topology_error: Mutex::new(topology_error),
        ..Default::default()
    });
    let handler = ec2.clone();
    let endpoint = common::serve(Arc::new(move |body: &str| handler.answer(body))).await?;
    // Three attempts, so a test shows DescribeInstanceTopology is never retried.
    let options = options
        .with_static_credentials("testing", "testing")
        .with_max_attempts(3)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5));
    let cloud = AwsCloud::from_config_text_with(&common::config(&endpoint, ""), options)?;
    Ok((ec2, cloud))
}

fn topology_labels(meta: &InstanceMetadata) -> BTreeMap<String, String> {
    meta.additional_labels
        .iter()
        .filter(|(k, _)| k.starts_with(NETWORK_NODE_LABEL_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn expected_labels(id: &str) -> BTreeMap<String, String> {
    nodes_of(id)
        .into_iter()
        .enumerate()
        .map(|(i, n)| (format!("topology.k8s.aws/network-node-layer-{}", i + 1), n))
        .collect()
}

/// Upstream `topology.go`: only types matching the default `SupportedTopologyInstanceTypePattern`
/// (p*, trn*, hpc*) are asked about; their layers become `network-node-layer-1..N`, in order.
#[tokio::test]
async fn supported_types_get_network_node_layers_and_others_are_not_asked() -> anyhow::Result<()> {
    let p4d = instance_id(1);
    let t3 = instance_id(2);
    let (ec2, cloud) = fake(&[(p4d.clone(), "p4d.24xlarge"), (t3.clone(), "t3.large")]).await?;
    let instances = cloud.instances_v2().context("instances")?;

    let single = instances
        .instance_metadata(&Fixture::node(&p4d, None))
        .await?
        .context("p4d metadata")?;
    ensure!(
        topology_labels(&single) == expected_labels(&p4d),
        "{single:?}"
    );
    ensure!(
        single
            .additional_labels
            .get(ZONE_ID_LABEL)
            .map(String::as_str)
            == Some("use1-az4"),
        "{single:?}"
    );

    let nodes: Vec<Node> = [&p4d, &t3]
        .iter()
        .map(|id| Fixture::node(id, None))
        .collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    let batch = instances.instance_metadata_batch(&refs).await;
    let p4d_meta = batch[0]
        .as_ref()
        .ok()
        .cloned()
        .flatten()
        .context("p4d batch")?;
    let t3_meta = batch[1]
        .as_ref()
        .ok()
        .cloned()
        .flatten()
        .context("t3 batch")?;
    ensure!(p4d_meta == single, "{p4d_meta:?}");
    ensure!(topology_labels(&t3_meta).is_empty(), "{t3_meta:?}");
    ensure!(
        t3_meta
            .additional_labels
            .get(ZONE_ID_LABEL)
            .map(String::as_str)
            == Some("use1-az4"),
        "{t3_meta:?}"
    );
    // One call, for the p4d only; the batch reused its cached answer.
    let calls = ec2.topology_calls.lock().clone();
    ensure!(calls == vec![vec![p4d.clone()]], "{calls:?}");
    Ok(())
}

/// DescribeInstanceTopology takes at most 100 instance IDs: 250 nodes cost three calls, and a
/// second sync none (the answers are cached).
#[tokio::test]
async fn many_nodes_take_one_topology_call_per_100() -> anyhow::Result<()> {
    let types: Vec<(String, &str)> = (0..250)
        .map(|n| (instance_id(0x100 + n), "trn1.32xlarge"))
        .collect();
    let (ec2, cloud) = fake(&types).await?;
    let instances = cloud.instances_v2().context("instances")?;
    let nodes: Vec<Node> = types
        .iter()
        .map(|(id, _)| Fixture::node(id, None))
        .collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    for sync in 0..2 {
        let batch = instances.instance_metadata_batch(&refs).await;
        for ((id, _), result) in types.iter().zip(&batch) {
            let meta = result
                .as_ref()
                .ok()
                .cloned()
                .flatten()
                .context("metadata")?;
            ensure!(
                topology_labels(&meta) == expected_labels(id),
                "sync {sync} {id}: {meta:?}"
            );
        }
    }
    let calls = ec2.topology_calls.lock().clone();
    let sizes: Vec<usize> = calls.iter().map(Vec::len).collect();
    ensure!(sizes == vec![100, 100, 50], "{sizes:?}");
    ensure!(
        cloud.metrics().attempts_of("DescribeInstanceTopology") == 3,
        "{:?}",
        cloud.metrics().snapshot()
    );
    Ok(())
}

/// Upstream `topology.go`: `UnauthorizedOperation` (the IAM permission is missing) and
/// `UnsupportedOperation` mark the region unsupported (24 h). Unlike upstream, where a required
/// type would fail its sync, the node's metadata comes back without the labels.
#[tokio::test]
async fn an_unauthorized_region_is_not_asked_again_and_metadata_still_comes_back()
-> anyhow::Result<()> {
    for code in ["UnauthorizedOperation", "UnsupportedOperation"] {
        let id = instance_id(7);
        let (ec2, cloud) = fake_failing(
            &[(id.clone(), "p5.48xlarge")],
            Some((400, code)),
            AwsOptions::default(),
        )
        .await?;
        let instances = cloud.instances_v2().context("instances")?;
        let node = Fixture::node(&id, None);
        for _ in 0..3 {
            let meta = instances
                .instance_metadata(&node)
                .await?
                .context("metadata")?;
            ensure!(topology_labels(&meta).is_empty(), "{code}: {meta:?}");
            ensure!(meta.instance_type == "p5.48xlarge", "{meta:?}");
            ensure!(
                meta.additional_labels
                    .get(ZONE_ID_LABEL)
                    .map(String::as_str)
                    == Some("use1-az4"),
                "{meta:?}"
            );
        }
        let calls = ec2.topology_calls.lock().len();
        ensure!(calls == 1, "{code}: {calls} calls");
    }
    Ok(())
}

/// Any other failure (a 500 here, as moto gives) is sent once, not retried, and remembered for
/// `topology_failure_backoff`: syncs within it make no call; the first after it asks again.
#[tokio::test]
async fn a_failure_is_remembered_for_the_backoff_then_asked_again() -> anyhow::Result<()> {
    let id = instance_id(9);
    // The fake EC2 answers over a real socket, so this is wall-clock time (paused time cannot
    // apply): the backoff is long enough that three syncs fit in it on a loaded CI machine,
    // where 2 s was once too short.
    let backoff = Duration::from_secs(10);
    let (ec2, cloud) = fake_failing(
        &[(id.clone(), "hpc7g.16xlarge")],
        Some((500, "InternalError")),
        AwsOptions::default().with_topology_failure_backoff(backoff),
    )
    .await?;
    let instances = cloud.instances_v2().context("instances")?;
    let node = Fixture::node(&id, None);
    let started = tokio::time::Instant::now();
    for _ in 0..3 {
        let meta = instances
            .instance_metadata(&node)
            .await?
            .context("metadata")?;
        ensure!(topology_labels(&meta).is_empty(), "{meta:?}");
        ensure!(
            meta.additional_labels.contains_key(ZONE_ID_LABEL),
            "{meta:?}"
        );
    }
    ensure!(
        started.elapsed() < backoff,
        "the syncs took longer than the backoff"
    );
    ensure!(
        ec2.topology_calls.lock().len() == 1,
        "one attempt, no retries"
    );

    *ec2.topology_error.lock() = None;
    tokio::time::sleep(backoff + Duration::from_millis(100)).await;
    let meta = instances
        .instance_metadata(&node)
        .await?
        .context("metadata")?;
    ensure!(topology_labels(&meta) == expected_labels(&id), "{meta:?}");
    ensure!(ec2.topology_calls.lock().len() == 2);
    Ok(())
}
