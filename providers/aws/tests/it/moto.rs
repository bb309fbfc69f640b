//! The provider against moto's server mode with the real SDK clients. Each test starts its own
//! moto on a free loopback port (killed on drop) and seeds its own VPC. Without moto the tests
//! fail, saying to run ./scripts/test.

use std::{collections::BTreeSet, sync::Arc};

use anyhow::{Context, bail, ensure};
use cloud_provider::{
    CloudProvider, ErrorKind, Route,
    conformance::{ConformanceKit, Fixture, Outcome},
};
use cloud_provider_aws::{
    AwsCloud,
    lb::plan::{self, ANNOTATION_TYPE, security_group_name},
    test_util::{self as moto, MotoServer, Seed, SeedSpec},
};
use k8s_openapi::{
    api::core::v1::{Node, Service, ServicePort},
    apimachinery::pkg::util::intstr::IntOrString,
};

const CLUSTER: &str = "kubernetes";

/// A fresh moto with a seeded VPC of `instances` instances, and a provider for it.
async fn setup(cluster_id: &str, instances: usize) -> anyhow::Result<(MotoServer, Seed, AwsCloud)> {
    let moto = MotoServer::start().await?;
    let seed = moto.seed(&SeedSpec::new(cluster_id, instances)).await?;
    let cloud = AwsCloud::from_config_text_with(&seed.cloud_config(&moto), moto.options())?;
    Ok((moto, seed, cloud))
}

/// A cloud for the same moto with more [Global] keys.
fn cloud_with(moto: &MotoServer, seed: &Seed, global: &str) -> anyhow::Result<AwsCloud> {
    let text = seed
        .cloud_config(moto)
        .replacen("[Global]\n", &format!("[Global]\n{global}\n"), 1);
    Ok(AwsCloud::from_config_text_with(&text, moto.options())?)
}

fn node(name: &str) -> Node {
    Fixture::node(name, None)
}

fn service(name: &str, uid: &str, ports: &[(&str, i32, i32)]) -> Service {
    let mut svc = Fixture::load_balancer_service();
    svc.metadata.name = Some(name.to_owned());
    svc.metadata.uid = Some(uid.to_owned());
    let spec = svc.spec.as_mut().expect("spec");
    spec.ports = Some(
        ports
            .iter()
            .map(|(proto, port, node_port)| ServicePort {
                name: Some(format!("{}-{port}", proto.to_ascii_lowercase())),
                protocol: Some((*proto).to_owned()),
                port: *port,
                node_port: Some(*node_port),
                target_port: Some(IntOrString::Int(8080)),
                ..Default::default()
            })
            .collect(),
    );
    svc
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_kit_passes_against_moto() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("conformance", 3).await?;
    let ec2 = moto.ec2().await;
    moto::stop_instances(&ec2, &seed.instance_ids[2..3]).await?;

    let cloud = Arc::new(cloud);
    // Node names: one by instance ID (resource naming), one by private DNS name (IP naming),
    // the stopped one with a full provider ID.
    let stopped_zone = "us-east-1b";
    let fixture = Fixture::new(CLUSTER)
        .with_running_node(node(&seed.instance_ids[0]))
        .with_running_node(node(&seed.private_dns_names[1]))
        .with_stopped_node(Fixture::node(
            "stopped",
            Some(&format!("aws:///{stopped_zone}/{}", seed.instance_ids[2])),
        ))
        .with_backend_probe(cloud.clone());
    let kit = ConformanceKit::new(cloud.clone() as Arc<dyn CloudProvider>, fixture);
    let report = kit.run().await;
    println!("{report}");
    ensure!(report.is_success(), "{report}");
    for check in [
        "instances-v2/metadata",
        "instances-v2/metadata-batch",
        "instances-v2/stopped",
        "instances-v2/unknown",
        "load-balancer/ensure",
        "load-balancer/update-backends",
        "load-balancer/delete",
        "routes/round-trip",
    ] {
        ensure!(
            matches!(report.outcome(check), Some(Outcome::Passed(_))),
            "{check} did not pass: {report}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_matches_ec2() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("meta", 2).await?;
    let instances = cloud.instances_v2().context("instances")?;
    let by_id = instances
        .instance_metadata(&node(&seed.instance_ids[0]))
        .await?
        .context("metadata")?;
    ensure!(
        by_id.provider_id.starts_with("aws:///us-east-1a/"),
        "{by_id:?}"
    );
    ensure!(
        by_id.provider_id.ends_with(&seed.instance_ids[0]),
        "{by_id:?}"
    );
    ensure!(by_id.instance_type == "m5.large", "{by_id:?}");
    ensure!((by_id.zone.as_str(), by_id.region.as_str()) == ("us-east-1a", "us-east-1"));
    let types: Vec<&str> = by_id
        .node_addresses
        .iter()
        .map(|a| a.type_.as_str())
        .collect();
    ensure!(types.first() == Some(&"InternalIP"), "{types:?}");
    ensure!(
        types.contains(&"InternalDNS") && types.contains(&"Hostname"),
        "{types:?}"
    );
    let dns = by_id
        .node_addresses
        .iter()
        .find(|a| a.type_ == "InternalDNS")
        .context("dns")?;
    ensure!(dns.address == seed.private_dns_names[0]);

    // The same instance through every provider ID form and its DNS name.
    for pid in [
        format!("aws:///us-east-1a/{}", seed.instance_ids[0]),
        format!("aws:////{}", seed.instance_ids[0]),
    ] {
        let m = instances
            .instance_metadata(&Fixture::node("whatever", Some(&pid)))
            .await?
            .context("metadata")?;
        ensure!(m == by_id, "{pid}: {m:?}");
    }
    let m = instances
        .instance_metadata(&node(&seed.private_dns_names[0]))
        .await?
        .context("metadata")?;
    ensure!(m == by_id);

    // The zone-ID label, from DescribeAvailabilityZones (cached: one call for
    // every later lookup, batched or not).
    let ec2 = moto.ec2().await;
    let azs = ec2.describe_availability_zones().send().await?;
    let zone_id = azs
        .availability_zones()
        .iter()
        .find(|z| z.zone_name() == Some("us-east-1a"))
        .and_then(|z| z.zone_id())
        .context("us-east-1a has a zone ID")?;
    ensure!(
        by_id
            .additional_labels
            .get(cloud_provider_aws::ZONE_ID_LABEL)
            .map(String::as_str)
            == Some(zone_id),
        "{:?}",
        by_id.additional_labels
    );
    let batch = instances
        .instance_metadata_batch(&[&node(&seed.instance_ids[0])])
        .await;
    let batched = batch[0].as_ref().ok().cloned().flatten().context("batch")?;
    ensure!(batched == by_id, "{batched:?}");
    ensure!(cloud.metrics().attempts_of("DescribeAvailabilityZones") == 1);

    // An instance that vanished: terminated means not found, never a panic.
    moto::terminate_instances(&ec2, &seed.instance_ids[1..2]).await?;
    let gone = node(&seed.instance_ids[1]);
    ensure!(!instances.instance_exists(&gone).await?);
    ensure!(!instances.instance_shutdown(&gone).await?);
    let err = instances
        .instance_metadata(&gone)
        .await
        .err()
        .context("gone")?;
    ensure!(err.kind() == ErrorKind::InstanceNotFound, "{err}");
    // A provider ID of another cloud is a clear error.
    let err = instances
        .instance_metadata(&Fixture::node("x", Some("gce://p/z/vm")))
        .await
        .err()
        .context("foreign provider id")?;
    ensure!(
        err.to_string().contains("does not name an EC2 instance"),
        "{err}"
    );
    Ok(())
}

/// Upstream `topology.go`: moto answers DescribeInstanceTopology with a 500.
/// Topology labels are best effort, so node metadata still comes back with its other labels and
/// zone ID; the failing call is sent once (no SDK retries) and remembered, so the next sync makes
/// no new call within the remembered-failure period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_describe_instance_topology_never_blocks_metadata() -> anyhow::Result<()> {
    let (moto, seed, _) = setup("topology", 2).await?;
    // Make the seeded m5.large a type that must be asked about.
    let cloud = cloud_with(
        &moto,
        &seed,
        "SupportedTopologyInstanceTypePattern = ^m5\\.large$",
    )?;
    let instances = cloud.instances_v2().context("instances")?;
    let nodes: Vec<Node> = seed.instance_ids.iter().map(|id| node(id)).collect();
    let refs: Vec<&Node> = nodes.iter().collect();
    for sync in 0..2 {
        let batch = instances.instance_metadata_batch(&refs).await;
        for result in &batch {
            let meta = result
                .as_ref()
                .map_err(|e| anyhow::anyhow!("sync {sync}: {e}"))?
                .clone()
                .context("metadata")?;
            ensure!(meta.instance_type == "m5.large", "{meta:?}");
            ensure!(
                meta.additional_labels
                    .get(cloud_provider_aws::ZONE_ID_LABEL)
                    .is_some_and(|z| z.starts_with("use1-az")),
                "{meta:?}"
            );
            ensure!(
                !meta
                    .additional_labels
                    .keys()
                    .any(|k| k.starts_with(cloud_provider_aws::NETWORK_NODE_LABEL_PREFIX)),
                "{meta:?}"
            );
        }
        let single = instances
            .instance_metadata(&nodes[0])
            .await?
            .context("single")?;
        ensure!(
            single
                .additional_labels
                .contains_key(cloud_provider_aws::ZONE_ID_LABEL),
            "{single:?}"
        );
    }
    let stats = cloud.metrics().snapshot();
    ensure!(
        cloud.metrics().attempts_of("DescribeInstanceTopology") == 1,
        "one attempt in all, neither retried nor repeated: {stats:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_lookups_close_together_share_one_call() -> anyhow::Result<()> {
    let (_moto, seed, cloud) = setup("coalesce", 12).await?;
    let instances = cloud.instances_v2().context("instances")?;
    let nodes: Vec<Node> = seed.instance_ids.iter().map(|id| node(id)).collect();
    cloud.connect().await?;
    let before = cloud.metrics().attempts_of("DescribeInstances");
    let results =
        futures::future::join_all(nodes.iter().map(|n| instances.instance_metadata(n))).await;
    let calls = cloud.metrics().attempts_of("DescribeInstances") - before;
    for r in results {
        ensure!(r?.is_some());
    }
    ensure!(
        calls == 1,
        "12 concurrent lookups made {calls} DescribeInstances calls"
    );
    Ok(())
}

/// Cloud calls of one node-initialization sync (one batch over every Node) at `sizes`.
async fn batch_calls(sizes: &[usize]) -> anyhow::Result<Vec<(usize, u64, std::time::Duration)>> {
    let moto = MotoServer::start().await?;
    let ec2 = moto.ec2().await;
    let spec = SeedSpec::new("scale", 0);
    let mut seed = moto::seed(&ec2, &spec).await?;
    let cloud = AwsCloud::from_config_text_with(&seed.cloud_config(&moto), moto.options())?;
    let instances = cloud.instances_v2().context("instances")?;
    let mut out = Vec::new();
    for &n in sizes {
        let more = n - seed.instance_ids.len();
        moto::run_instances(&ec2, &spec, &mut seed, more).await?;
        let nodes: Vec<Node> = seed.instance_ids.iter().map(|id| node(id)).collect();
        let refs: Vec<&Node> = nodes.iter().collect();
        let before = cloud.metrics().total_attempts();
        let started = tokio::time::Instant::now();
        let results = instances.instance_metadata_batch(&refs).await;
        let took = started.elapsed();
        let calls = cloud.metrics().total_attempts() - before;
        ensure!(results.len() == n);
        for r in &results {
            ensure!(r.as_ref().is_ok_and(|m| m.is_some()), "{r:?}");
        }
        println!("instance_metadata_batch over {n} nodes: {calls} AWS calls in {took:?}");
        out.push((n, calls, took));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_batch_calls_stay_flat() -> anyhow::Result<()> {
    // CCM_AWS_SCALE=1000 adds the 1,000-instance point (slow on moto: about a minute).
    let mut sizes = vec![10, 100];
    if let Ok(max) = std::env::var("CCM_AWS_SCALE") {
        sizes.push(max.parse().context("CCM_AWS_SCALE")?);
    }
    let points = batch_calls(&sizes).await?;
    for (i, (n, calls, _)) in points.iter().enumerate() {
        // One DescribeInstances per 1,000 Nodes, and on the first sync only, the one
        // DescribeAvailabilityZones that fills the zone-ID cache.
        let want = n.div_ceil(1000) as u64 + u64::from(i == 0);
        ensure!(*calls == want, "{n} nodes took {calls} calls, want {want}");
    }
    Ok(())
}

/// The NLB, its target groups, listeners and targets, read back through ELBv2.
struct Observed {
    lb_type: String,
    scheme: String,
    listeners: BTreeSet<(i32, String)>,
    groups: BTreeSet<(i32, String, String)>,
    targets: BTreeSet<String>,
}

async fn observe(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    name: &str,
) -> anyhow::Result<Option<Observed>> {
    let lbs = match elb.describe_load_balancers().names(name).send().await {
        Ok(out) => out,
        Err(e) if format!("{e:?}").contains("LoadBalancerNotFound") => return Ok(None),
        Err(e) => bail!("describe load balancers: {e:?}"),
    };
    let Some(lb) = lbs.load_balancers().first() else {
        return Ok(None);
    };
    let arn = lb.load_balancer_arn().context("arn")?;
    let listeners = elb
        .describe_listeners()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let mut obs = Observed {
        lb_type: lb
            .r#type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        scheme: lb
            .scheme()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
        listeners: BTreeSet::new(),
        groups: BTreeSet::new(),
        targets: BTreeSet::new(),
    };
    for l in listeners.listeners() {
        obs.listeners.insert((
            l.port().unwrap_or_default(),
            l.protocol()
                .map(|p| p.as_str().to_owned())
                .unwrap_or_default(),
        ));
        for a in l.default_actions() {
            let tg_arn = a.target_group_arn().context("forward")?;
            let tgs = elb
                .describe_target_groups()
                .target_group_arns(tg_arn)
                .send()
                .await?;
            let tg = tgs.target_groups().first().context("tg")?;
            obs.groups.insert((
                tg.port().unwrap_or_default(),
                tg.protocol()
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_default(),
                tg.target_type()
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_default(),
            ));
            let health = elb
                .describe_target_health()
                .target_group_arn(tg_arn)
                .send()
                .await?;
            for d in health.target_health_descriptions() {
                let t = d.target().context("target")?;
                ensure!(
                    t.port() == tg.port(),
                    "target on port {:?}, group on {:?}",
                    t.port(),
                    tg.port()
                );
                obs.targets.insert(t.id().unwrap_or_default().to_owned());
            }
        }
    }
    Ok(Some(obs))
}

fn ids(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nlb_follows_nodes_and_leaves_nothing_behind() -> anyhow::Result<()> {
    let (moto, mut seed, _) = setup("nlbtest", 2).await?;
    let cloud = cloud_with(&moto, &seed, "NLBSecurityGroupMode = Managed")?;
    let elb = moto.elbv2().await;
    let ec2 = moto.ec2().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let mut svc = service(
        "web",
        "5a1e0000-0000-4000-8000-000000000001",
        &[("TCP", 80, 30080), ("TCP", 443, 30443)],
    );
    svc.spec
        .as_mut()
        .context("spec")?
        .load_balancer_source_ranges = Some(vec!["203.0.113.0/24".to_owned()]);
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);

    let mut nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    let status = lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;
    let obs = observe(&elb, &name).await?.context("no NLB after ensure")?;
    let hostname = status
        .ingress
        .as_deref()
        .and_then(|i| i.first())
        .and_then(|i| i.hostname.clone());
    ensure!(
        hostname.as_deref().is_some_and(|h| h.contains(".elb.")),
        "{status:?}"
    );
    ensure!(
        obs.lb_type == "network" && obs.scheme == "internet-facing",
        "{} {}",
        obs.lb_type,
        obs.scheme
    );
    ensure!(obs.listeners == BTreeSet::from([(80, "TCP".into()), (443, "TCP".into())]));
    ensure!(
        obs.groups
            == BTreeSet::from([
                (30080, "TCP".into(), "instance".into()),
                (30443, "TCP".into(), "instance".into())
            ]),
        "{:?}",
        obs.groups
    );
    ensure!(obs.targets == ids(&seed.instance_ids), "{:?}", obs.targets);

    // Security groups: the NLB's own with the client rule, and the nodes' client rules.
    let sgs = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(&seed.vpc_id)
                .build(),
        )
        .send()
        .await?;
    let own = sgs
        .security_groups()
        .iter()
        .find(|g| g.group_name() == Some(security_group_name(&name).as_str()))
        .context("managed security group")?;
    ensure!(
        own.tags().iter().any(|t| t.key() == Some("kubernetes.io/cluster/nlbtest") && t.value() == Some("owned")),
        "{:?}",
        own.tags()
    );
    // Its client rules (listener ports from the source ranges) and the path-MTU rule stay
    // after the node rules are reconciled.
    let own_rules: BTreeSet<(String, i32, String)> = own
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges().iter().map(move |r| {
                (
                    p.ip_protocol().unwrap_or_default().to_owned(),
                    p.from_port().unwrap_or(-1),
                    r.cidr_ip().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect();
    for rule in [("tcp", 80), ("tcp", 443), ("icmp", 3)] {
        ensure!(
            own_rules.contains(&(rule.0.to_owned(), rule.1, "203.0.113.0/24".to_owned())),
            "{rule:?} missing from the load balancer's group: {own_rules:?}"
        );
    }
    let nodes_sg = sgs
        .security_groups()
        .iter()
        .find(|g| g.group_id() == Some(seed.node_security_group_id.as_str()))
        .context("node group")?;
    let client_rules: Vec<(i32, String)> = nodes_sg
        .ip_permissions()
        .iter()
        .flat_map(|p| {
            p.ip_ranges()
                .iter()
                .filter(|r| {
                    r.description()
                        .is_some_and(|d| d.starts_with("kubernetes.io/rule/nlb/"))
                })
                .map(move |r| {
                    (
                        p.from_port().unwrap_or_default(),
                        r.cidr_ip().unwrap_or_default().to_owned(),
                    )
                })
        })
        .collect();
    ensure!(
        client_rules.contains(&(30080, "203.0.113.0/24".into())),
        "{client_rules:?}"
    );
    ensure!(
        client_rules.contains(&(30443, "203.0.113.0/24".into())),
        "{client_rules:?}"
    );
    ensure!(
        client_rules
            .iter()
            .any(|(p, c)| *p == 30080 && c.starts_with("10.0.")),
        "health rule: {client_rules:?}"
    );

    // Idempotent: a second ensure changes nothing and creates nothing.
    let again = lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;
    ensure!(again == status);
    let all_lbs = elb.describe_load_balancers().send().await?;
    ensure!(all_lbs.load_balancers().len() == 1);
    let all_tgs = elb.describe_target_groups().send().await?;
    ensure!(all_tgs.target_groups().len() == 2);

    // Scale up by three nodes, then down to one.
    let spec = SeedSpec::new("nlbtest", 0);
    moto::run_instances(&ec2, &spec, &mut seed, 3).await?;
    nodes = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    let before = cloud.metrics().attempts_of("DescribeInstances");
    lbs.update_load_balancer(CLUSTER, &svc, &nodes).await?;
    let calls = cloud.metrics().attempts_of("DescribeInstances") - before;
    // The two known nodes come from the cache; the three new ones take one call together.
    ensure!(
        calls == 1,
        "update over 5 nodes made {calls} DescribeInstances calls"
    );
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(
        obs.targets == ids(&seed.instance_ids),
        "after scale up: {:?}",
        obs.targets
    );
    lbs.update_load_balancer(CLUSTER, &svc, &nodes[..1]).await?;
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(
        obs.targets == ids(&seed.instance_ids[..1]),
        "after scale down: {:?}",
        obs.targets
    );

    // A port goes away: its listener and target group go too.
    let smaller = service(
        "web",
        "5a1e0000-0000-4000-8000-000000000001",
        &[("TCP", 80, 30080)],
    );
    lbs.ensure_load_balancer(CLUSTER, &smaller, &nodes).await?;
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(
        obs.listeners == BTreeSet::from([(80, "TCP".into())]),
        "{:?}",
        obs.listeners
    );
    ensure!(
        elb.describe_target_groups()
            .send()
            .await?
            .target_groups()
            .len()
            == 1
    );

    // Delete: no load balancer, target group, managed security group or rule is left.
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    ensure!(observe(&elb, &name).await?.is_none());
    ensure!(lbs.get_load_balancer(CLUSTER, &svc).await?.is_none());
    ensure!(
        elb.describe_load_balancers()
            .send()
            .await?
            .load_balancers()
            .is_empty()
    );
    ensure!(
        elb.describe_target_groups()
            .send()
            .await?
            .target_groups()
            .is_empty()
    );
    let sgs = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(&seed.vpc_id)
                .build(),
        )
        .send()
        .await?;
    ensure!(
        !sgs.security_groups()
            .iter()
            .any(|g| g.group_name() == Some(security_group_name(&name).as_str())),
        "managed security group left behind"
    );
    let leftover = sgs
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| p.ip_ranges())
        .filter(|r| r.description().is_some_and(|d| d.contains(&name)))
        .count();
    ensure!(leftover == 0, "{leftover} rules left behind");
    // Deleting again succeeds.
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_local_traffic_and_annotations() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("udp", 2).await?;
    let elb = moto.elbv2().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();

    // TCP and UDP on one port: one TCP_UDP listener; ETP Local: HTTP health on the node port.
    let mut dns = service(
        "dns",
        "5a1e0000-0000-4000-8000-000000000002",
        &[("TCP", 53, 30053), ("UDP", 53, 30053)],
    );
    {
        let spec = dns.spec.as_mut().context("spec")?;
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32053);
    }
    dns.metadata.annotations = Some(
        [
            (
                "service.beta.kubernetes.io/aws-load-balancer-internal",
                "true",
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled",
                "true",
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags",
                "team=dns",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    );
    let name = lbs.get_load_balancer_name(CLUSTER, &dns);
    lbs.ensure_load_balancer(CLUSTER, &dns, &nodes).await?;
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(obs.scheme == "internal");
    ensure!(
        obs.listeners == BTreeSet::from([(53, "TCP_UDP".into())]),
        "{:?}",
        obs.listeners
    );
    let tgs = elb.describe_target_groups().send().await?;
    let tg = tgs.target_groups().first().context("tg")?;
    ensure!(
        tg.health_check_port() == Some("32053"),
        "{:?}",
        tg.health_check_port()
    );
    ensure!(tg.health_check_path() == Some("/healthz"));
    ensure!(tg.health_check_protocol().map(|p| p.as_str()) == Some("HTTP"));
    let lb = elb.describe_load_balancers().names(&name).send().await?;
    let arn = lb
        .load_balancers()
        .first()
        .and_then(|l| l.load_balancer_arn())
        .context("arn")?;
    let attrs = elb
        .describe_load_balancer_attributes()
        .load_balancer_arn(arn)
        .send()
        .await?;
    ensure!(
        attrs
            .attributes()
            .iter()
            .any(|a| a.key() == Some("load_balancing.cross_zone.enabled")
                && a.value() == Some("true"))
    );
    let tags = elb.describe_tags().resource_arns(arn).send().await?;
    let tag_pairs: Vec<(String, String)> = tags
        .tag_descriptions()
        .iter()
        .flat_map(|d| d.tags())
        .map(|t| {
            (
                t.key().unwrap_or_default().to_owned(),
                t.value().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    for want in [
        ("kubernetes.io/cluster/udp", "owned"),
        ("team", "dns"),
        ("kubernetes.io/service-name", "default/dns"),
    ] {
        ensure!(
            tag_pairs.contains(&(want.0.into(), want.1.into())),
            "{tag_pairs:?}"
        );
    }
    lbs.ensure_load_balancer_deleted(CLUSTER, &dns).await?;
    ensure!(
        elb.describe_target_groups()
            .send()
            .await?
            .target_groups()
            .is_empty()
    );

    // Bad input: clear errors, nothing created.
    let mixed = service(
        "mixed",
        "5a1e0000-0000-4000-8000-000000000003",
        &[("TCP", 80, 30080), ("UDP", 53, 30053)],
    );
    let err = lbs
        .ensure_load_balancer(CLUSTER, &mixed, &nodes)
        .await
        .err()
        .context("mixed")?;
    ensure!(err.to_string().contains("mixed protocols"), "{err}");
    // TLS settings without a certificate: refused before anything is created.
    let mut tls = service(
        "tls",
        "5a1e0000-0000-4000-8000-000000000004",
        &[("TCP", 443, 30443)],
    );
    tls.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/aws-load-balancer-ssl-ports".to_owned(),
            "443".to_owned(),
        )]
        .into(),
    );
    let err = lbs
        .ensure_load_balancer(CLUSTER, &tls, &nodes)
        .await
        .err()
        .context("tls")?;
    ensure!(
        err.to_string().contains("aws-load-balancer-ssl-ports")
            && err.to_string().contains("aws-load-balancer-ssl-cert"),
        "{err}"
    );
    let mut lbc = service(
        "lbc",
        "5a1e0000-0000-4000-8000-000000000005",
        &[("TCP", 80, 30080)],
    );
    lbc.metadata.annotations = Some([(ANNOTATION_TYPE.to_owned(), "external".to_owned())].into());
    let err = lbs
        .ensure_load_balancer(CLUSTER, &lbc, &nodes)
        .await
        .err()
        .context("lbc")?;
    ensure!(err.is_implemented_elsewhere(), "{err}");
    // Get and delete answer plainly for it, so the controller can drop its finalizer.
    ensure!(lbs.get_load_balancer(CLUSTER, &lbc).await?.is_none());
    lbs.ensure_load_balancer_deleted(CLUSTER, &lbc).await?;
    ensure!(
        elb.describe_load_balancers()
            .send()
            .await?
            .load_balancers()
            .is_empty()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_to_instances_with_blackholes() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("routes", 2).await?;
    let ec2 = moto.ec2().await;
    let routes = cloud.routes().context("routes")?;
    let cidr: ipnet::IpNet = "10.244.1.0/24".parse()?;
    // By private DNS name (upstream's default node naming).
    let target = seed.private_dns_names[0].clone();
    routes
        .create_route(CLUSTER, "uid-a", &Route::new(target.clone(), cidr))
        .await?;
    ensure!(moto::source_dest_check(&ec2, &seed.instance_ids[0]).await? == Some(false));
    let listed = routes.list_routes(CLUSTER).await?;
    let r = listed
        .iter()
        .find(|r| r.destination_cidr == cidr)
        .context("route listed")?;
    ensure!(r.target_node == target && !r.blackhole, "{r:?}");
    // Only instance routes are listed (the default route to the gateway is not ours).
    ensure!(listed.len() == 1, "{listed:?}");
    // Creating it again is a no-op.
    routes
        .create_route(CLUSTER, "uid-a", &Route::new(target.clone(), cidr))
        .await?;

    // The instance goes away: the route is a blackhole, and a new route for the CIDR replaces it.
    moto::terminate_instances(&ec2, &seed.instance_ids[..1]).await?;
    cloud.clear_instance_cache();
    let listed = routes.list_routes(CLUSTER).await?;
    let r = listed
        .iter()
        .find(|r| r.destination_cidr == cidr)
        .context("route listed")?;
    ensure!(r.blackhole && r.target_node.is_empty(), "{r:?}");
    let second = seed.instance_ids[1].clone();
    routes
        .create_route(CLUSTER, "uid-b", &Route::new(second.clone(), cidr))
        .await?;
    let listed = routes.list_routes(CLUSTER).await?;
    let r = listed
        .iter()
        .find(|r| r.destination_cidr == cidr)
        .context("route listed")?;
    ensure!(r.target_node == second && !r.blackhole, "{r:?}");

    // A route to a node with no instance is InstanceNotFound.
    let err = routes
        .create_route(
            CLUSTER,
            "uid-c",
            &Route::new("ip-10-9-9-9.ec2.internal", "10.244.9.0/24".parse()?),
        )
        .await
        .err()
        .context("unknown node")?;
    ensure!(err.is_instance_not_found(), "{err}");

    routes.delete_route(CLUSTER, r).await?;
    ensure!(routes.list_routes(CLUSTER).await?.is_empty());
    // Deleting a route that is gone succeeds.
    routes.delete_route(CLUSTER, r).await?;

    // Two tables carrying the cluster tag: a clear error.
    ec2.create_route_table()
        .vpc_id(&seed.vpc_id)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::RouteTable)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("kubernetes.io/cluster/routes")
                        .value("owned")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    let err = routes
        .list_routes(CLUSTER)
        .await
        .err()
        .context("two tables")?;
    ensure!(err.to_string().contains("expected exactly one"), "{err}");
    // RouteTableID pins the table.
    let pinned = cloud_with(
        &moto,
        &seed,
        &format!("RouteTableID = {}", seed.route_table_id),
    )?;
    ensure!(
        pinned
            .routes()
            .context("routes")?
            .list_routes(CLUSTER)
            .await?
            .is_empty()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_arn_assumes_the_role_through_sts() -> anyhow::Result<()> {
    let (moto, seed, _) = setup("role", 1).await?;
    // moto's STS hands out credentials for any role; EC2 then works with them.
    let cloud = cloud_with(
        &moto,
        &seed,
        "RoleARN = arn:aws:iam::123456789012:role/ccm-rs",
    )?;
    let meta = cloud
        .instances_v2()
        .context("instances")?
        .instance_metadata(&node(&seed.instance_ids[0]))
        .await?
        .context("metadata")?;
    ensure!(meta.provider_id.ends_with(&seed.instance_ids[0]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_change_100_at_a_time() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("chunks", 150).await?;
    let elb = moto.elbv2().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let mut svc = service(
        "bulk",
        "5a1e0000-0000-4000-8000-000000000006",
        &[("TCP", 80, 30080)],
    );
    svc.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes".to_owned(),
            "preserve_client_ip.enabled=false".to_owned(),
        )]
        .into(),
    );
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();

    lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;
    let registers = cloud.metrics().attempts_of("RegisterTargets");
    ensure!(
        registers == 2,
        "150 targets took {registers} RegisterTargets calls"
    );
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(
        obs.targets == ids(&seed.instance_ids),
        "{} targets",
        obs.targets.len()
    );
    let tgs = elb.describe_target_groups().send().await?;
    let tg_arn = tgs
        .target_groups()
        .first()
        .and_then(|t| t.target_group_arn())
        .context("tg")?;
    let attrs = elb
        .describe_target_group_attributes()
        .target_group_arn(tg_arn)
        .send()
        .await?;
    ensure!(
        attrs
            .attributes()
            .iter()
            .any(|a| a.key() == Some("preserve_client_ip.enabled") && a.value() == Some("false")),
        "{:?}",
        attrs.attributes()
    );

    lbs.update_load_balancer(CLUSTER, &svc, &nodes[..10])
        .await?;
    let deregisters = cloud.metrics().attempts_of("DeregisterTargets");
    ensure!(
        deregisters == 2,
        "140 removals took {deregisters} DeregisterTargets calls"
    );
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(
        obs.targets == ids(&seed.instance_ids[..10]),
        "{} targets",
        obs.targets.len()
    );
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    ensure!(
        elb.describe_target_groups()
            .send()
            .await?
            .target_groups()
            .is_empty()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elb_security_group_and_disabled_ingress() -> anyhow::Result<()> {
    let (moto, seed, _) = setup("sgopts", 2).await?;
    let ec2 = moto.ec2().await;
    let elb = moto.elbv2().await;
    let shared = ec2
        .create_security_group()
        .group_name("shared-elb")
        .description("shared")
        .vpc_id(&seed.vpc_id)
        .send()
        .await?;
    let shared_id = shared.group_id().context("group id")?.to_owned();
    let cloud = cloud_with(
        &moto,
        &seed,
        &format!("DisableSecurityGroupIngress = true\nElbSecurityGroup = {shared_id}"),
    )?;
    let lbs = cloud.load_balancer().context("lb")?;
    let svc = service(
        "plain",
        "5a1e0000-0000-4000-8000-000000000007",
        &[("TCP", 80, 30080)],
    );
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);
    lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;
    let lb = elb.describe_load_balancers().names(&name).send().await?;
    let groups = lb
        .load_balancers()
        .first()
        .map(|l| l.security_groups().to_vec())
        .unwrap_or_default();
    ensure!(groups == vec![shared_id.clone()], "{groups:?}");
    let sgs = ec2
        .describe_security_groups()
        .group_ids(&seed.node_security_group_id)
        .send()
        .await?;
    let rules = sgs
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| p.ip_ranges())
        .filter(|r| {
            r.description()
                .is_some_and(|d| d.contains("kubernetes.io/rule/nlb"))
        })
        .count();
    ensure!(
        rules == 0,
        "DisableSecurityGroupIngress still added {rules} rules"
    );
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    // The shared group is never deleted.
    let still = ec2
        .describe_security_groups()
        .group_ids(&shared_id)
        .send()
        .await?;
    ensure!(still.security_groups().len() == 1);
    Ok(())
}

/// A security group in the seeded VPC, cluster-tagged or not.
async fn security_group(
    ec2: &aws_sdk_ec2::Client,
    seed: &Seed,
    name: &str,
    cluster_tagged: bool,
) -> anyhow::Result<String> {
    let mut req = ec2
        .create_security_group()
        .group_name(name)
        .description(name)
        .vpc_id(&seed.vpc_id);
    if cluster_tagged {
        req = req.tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key(format!("kubernetes.io/cluster/{}", seed.cluster_id))
                        .value("owned")
                        .build(),
                )
                .build(),
        );
    }
    Ok(req.send().await?.group_id().context("group id")?.to_owned())
}

/// One instance in the first subnet with exactly `groups`.
async fn instance_in(
    ec2: &aws_sdk_ec2::Client,
    seed: &Seed,
    groups: &[&str],
) -> anyhow::Result<String> {
    let out = ec2
        .run_instances()
        .image_id(moto::MOTO_AMI)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(&seed.subnet_ids[0])
        .set_security_group_ids(Some(groups.iter().map(|g| g.to_string()).collect()))
        .send()
        .await?;
    Ok(out
        .instances()
        .first()
        .and_then(|i| i.instance_id())
        .context("instance id")?
        .to_owned())
}

/// The rules of `group` whose description mentions `lb_name`: (protocol, from, to, CIDR,
/// description kind).
async fn lb_rules(
    ec2: &aws_sdk_ec2::Client,
    group: &str,
    lb_name: &str,
) -> anyhow::Result<BTreeSet<(String, i32, i32, String, String)>> {
    let out = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    let mut rules = BTreeSet::new();
    for p in out
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
    {
        for r in p.ip_ranges() {
            let Some(kind) = r.description().and_then(|d| {
                d.strip_prefix("kubernetes.io/rule/nlb/")
                    .and_then(|d| d.strip_suffix(&format!("={lb_name}")))
            }) else {
                continue;
            };
            rules.insert((
                p.ip_protocol().unwrap_or_default().to_owned(),
                p.from_port().unwrap_or(-1),
                p.to_port().unwrap_or(-1),
                r.cidr_ip().unwrap_or_default().to_owned(),
                kind.to_owned(),
            ));
        }
    }
    Ok(rules)
}

/// Upstream's node security-group choice (`findSecurityGroupForInstance`):
/// the rules go onto each target instance's own group (the cluster-tagged one among its groups,
/// else its single untagged one), never onto other cluster-tagged groups, with the ICMP
/// type 3 code 4 path-MTU rule; several tagged or untagged groups on one instance are an error.
/// kubernetes#94966: a stopped instance is not registered as a target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_rules_go_onto_each_instances_own_group_and_only_running_ones_are_targets()
-> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("sgpick", 3).await?;
    let ec2 = moto.ec2().await;
    let elb = moto.elbv2().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let stray = security_group(&ec2, &seed, "stray-tagged", true).await?;
    let plain = security_group(&ec2, &seed, "plain-untagged", false).await?;
    let plain2 = security_group(&ec2, &seed, "plain-untagged-2", false).await?;
    let untagged_node = instance_in(&ec2, &seed, &[&plain]).await?;
    moto::stop_instances(&ec2, &seed.instance_ids[2..3]).await?;

    let mut svc = service(
        "sgpick",
        "5a1e0000-0000-4000-8000-000000000010",
        &[("TCP", 80, 30080)],
    );
    svc.spec
        .as_mut()
        .context("spec")?
        .load_balancer_source_ranges = Some(vec!["198.51.100.0/24".to_owned()]);
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);
    let mut nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    nodes.push(Arc::new(node(&untagged_node)));
    lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;

    let obs = observe(&elb, &name).await?.context("nlb")?;
    let running = BTreeSet::from([
        seed.instance_ids[0].clone(),
        seed.instance_ids[1].clone(),
        untagged_node.clone(),
    ]);
    ensure!(
        obs.targets == running,
        "stopped instance registered: {:?}",
        obs.targets
    );

    let node_rules = lb_rules(&ec2, &seed.node_security_group_id, &name).await?;
    for rule in [
        ("tcp", 30080, 30080, "198.51.100.0/24", "client"),
        ("icmp", 3, 4, "198.51.100.0/24", "mtu"),
    ] {
        let rule = (
            rule.0.to_owned(),
            rule.1,
            rule.2,
            rule.3.to_owned(),
            rule.4.to_owned(),
        );
        ensure!(
            node_rules.contains(&rule),
            "{rule:?} missing: {node_rules:?}"
        );
    }
    ensure!(
        node_rules
            .iter()
            .any(|r| r.4 == "health" && r.3.starts_with("10.0.")),
        "{node_rules:?}"
    );
    // The instance whose only group is untagged gets the same rules on that group.
    ensure!(lb_rules(&ec2, &plain, &name).await? == node_rules);
    // A cluster-tagged group no target instance uses gets nothing.
    ensure!(lb_rules(&ec2, &stray, &name).await?.is_empty());

    // Two untagged groups on one instance (none tagged): an error naming them, nothing torn down.
    let ambiguous = instance_in(&ec2, &seed, &[&plain, &plain2]).await?;
    let mut with_ambiguous = nodes.clone();
    with_ambiguous.push(Arc::new(node(&ambiguous)));
    let err = lbs
        .update_load_balancer(CLUSTER, &svc, &with_ambiguous)
        .await
        .expect_err("two untagged groups must be refused");
    ensure!(
        err.to_string()
            .contains("multiple untagged security groups")
            && err.to_string().contains(&ambiguous),
        "{err}"
    );
    // Two tagged groups on one instance: an error too.
    let doubly = instance_in(&ec2, &seed, &[&seed.node_security_group_id, &stray]).await?;
    let mut with_doubly = nodes.clone();
    with_doubly.push(Arc::new(node(&doubly)));
    let err = lbs
        .update_load_balancer(CLUSTER, &svc, &with_doubly)
        .await
        .expect_err("two tagged groups must be refused");
    ensure!(
        err.to_string().contains("multiple tagged security groups"),
        "{err}"
    );
    ensure!(lb_rules(&ec2, &seed.node_security_group_id, &name).await? == node_rules);

    // The untagged node leaves: its group's rules go; the tagged group keeps them.
    nodes.pop();
    lbs.update_load_balancer(CLUSTER, &svc, &nodes).await?;
    ensure!(lb_rules(&ec2, &plain, &name).await?.is_empty());
    ensure!(lb_rules(&ec2, &seed.node_security_group_id, &name).await? == node_rules);

    // Deleted: no rule of this load balancer is left on any group.
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    for group in [&seed.node_security_group_id, &plain, &stray] {
        ensure!(lb_rules(&ec2, group, &name).await?.is_empty(), "{group}");
    }
    Ok(())
}

/// The listeners of a load balancer by port: (ARN, protocol, certificate, SSL policy, target
/// group ARN).
async fn listeners_by_port(
    elb: &aws_sdk_elasticloadbalancingv2::Client,
    name: &str,
) -> anyhow::Result<std::collections::BTreeMap<i32, (String, String, String, String, String)>> {
    let lbs = elb.describe_load_balancers().names(name).send().await?;
    let arn = lbs
        .load_balancers()
        .first()
        .and_then(|l| l.load_balancer_arn())
        .context("load balancer")?;
    let out = elb
        .describe_listeners()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let mut map = std::collections::BTreeMap::new();
    for l in out.listeners() {
        map.insert(
            l.port().unwrap_or_default(),
            (
                l.listener_arn().unwrap_or_default().to_owned(),
                l.protocol()
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_default(),
                l.certificates()
                    .first()
                    .and_then(|c| c.certificate_arn())
                    .unwrap_or_default()
                    .to_owned(),
                l.ssl_policy().unwrap_or_default().to_owned(),
                l.default_actions()
                    .first()
                    .and_then(|a| a.target_group_arn())
                    .unwrap_or_default()
                    .to_owned(),
            ),
        );
    }
    Ok(map)
}

/// TLS listeners from `ssl-cert`, `ssl-ports` and
/// `ssl-negotiation-policy` (upstream's NLB rule), and a health-check or NodePort change
/// switches the listener to a new target group with ModifyListener (upstream's sequence) instead
/// of deleting the listener: its ARN survives, and the old target group is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_listeners_and_target_group_changes_keep_the_listener() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("tls", 2).await?;
    let elb = moto.elbv2().await;
    let cert = moto.acm_certificate("web.example.com").await?;
    let lbs = cloud.load_balancer().context("lb")?;
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    let uid = "5a1e0000-0000-4000-8000-000000000011";
    let annotated = |ports: &[(&str, i32, i32)], extra: &[(&str, &str)]| {
        let mut svc = service("tlsweb", uid, ports);
        let ann = svc
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        for (k, v) in [
            (plan::ANNOTATION_SSL_CERT, cert.as_str()),
            (plan::ANNOTATION_SSL_PORTS, "443"),
            (
                plan::ANNOTATION_SSL_NEGOTIATION_POLICY,
                "ELBSecurityPolicy-2016-08",
            ),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        {
            ann.insert(k.to_owned(), v.to_owned());
        }
        svc
    };
    let svc = annotated(&[("TCP", 80, 30080), ("TCP", 443, 30443)], &[]);
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);
    lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;
    let before = listeners_by_port(&elb, &name).await?;
    let (_, proto, cert_of_443, policy, _) = &before[&443];
    ensure!(proto == "TLS" && *cert_of_443 == cert, "{before:?}");
    ensure!(policy == "ELBSecurityPolicy-2016-08", "{before:?}");
    ensure!(
        before[&80].1 == "TCP" && before[&80].2.is_empty(),
        "{before:?}"
    );

    // A new health check: new target groups, the same listeners.
    let hc = annotated(
        &[("TCP", 80, 30080), ("TCP", 443, 30443)],
        &[
            (
                "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol",
                "http",
            ),
            (
                "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval",
                "10",
            ),
        ],
    );
    lbs.update_load_balancer(CLUSTER, &hc, &nodes).await?;
    let after = listeners_by_port(&elb, &name).await?;
    for port in [80, 443] {
        ensure!(
            after[&port].0 == before[&port].0,
            "listener {port} was recreated"
        );
        ensure!(
            after[&port].4 != before[&port].4,
            "listener {port} kept its target group"
        );
    }
    ensure!(after[&443].1 == "TLS" && after[&443].2 == cert, "{after:?}");
    let groups = elb.describe_target_groups().send().await?;
    ensure!(
        groups.target_groups().len() == 2,
        "old target groups left behind"
    );
    let tg80 = elb
        .describe_target_groups()
        .target_group_arns(&after[&80].4)
        .send()
        .await?;
    let tg80 = tg80.target_groups().first().context("tg 80")?;
    ensure!(
        tg80.health_check_protocol().map(|p| p.as_str()) == Some("HTTP")
            && tg80.health_check_interval_seconds() == Some(10),
        "{tg80:?}"
    );
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(obs.targets == ids(&seed.instance_ids), "{:?}", obs.targets);

    // A new NodePort: the listener on 80 forwards to a target group on the new port.
    let moved = annotated(&[("TCP", 80, 30081), ("TCP", 443, 30443)], &[]);
    lbs.update_load_balancer(CLUSTER, &moved, &nodes).await?;
    let last = listeners_by_port(&elb, &name).await?;
    ensure!(last[&80].0 == before[&80].0, "listener 80 was recreated");
    let obs = observe(&elb, &name).await?.context("nlb")?;
    ensure!(obs.groups.iter().any(|g| g.0 == 30081), "{:?}", obs.groups);
    ensure!(!obs.groups.iter().any(|g| g.0 == 30080), "{:?}", obs.groups);
    ensure!(
        elb.describe_target_groups()
            .send()
            .await?
            .target_groups()
            .len()
            == 2
    );

    lbs.ensure_load_balancer_deleted(CLUSTER, &moved).await?;
    ensure!(
        elb.describe_target_groups()
            .send()
            .await?
            .target_groups()
            .is_empty()
    );
    Ok(())
}

/// A loopback API server that answers every request with `body` (a NodeList), and a kube
/// client for it.
async fn fake_cluster(body: String) -> anyhow::Result<kube::Client> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let _ = conn.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(response.as_bytes()).await;
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse()?);
    Ok(kube::Client::try_from(config)?)
}

/// Upstream names a route's target from the Node whose provider ID holds the route's instance
/// (the informer's provider-ID index, aws_routes.go ListRoutes): after a restart, a route to
/// the Node `i-…` is still listed with that Node, not with the instance's DNS name, so the
/// route controller does not recreate it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_targets_come_from_the_clusters_nodes_after_a_restart() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("restart", 1).await?;
    let id = seed.instance_ids[0].clone();
    let cidr: ipnet::IpNet = "10.244.3.0/24".parse()?;
    cloud
        .routes()
        .context("routes")?
        .create_route(CLUSTER, "uid", &Route::new(id.clone(), cidr))
        .await?;

    // A new process: without the cluster it can only guess the instance's DNS name.
    let restarted = AwsCloud::from_config_text_with(&seed.cloud_config(&moto), moto.options())?;
    let guessed = restarted
        .routes()
        .context("routes")?
        .list_routes(CLUSTER)
        .await?;
    ensure!(
        guessed[0].target_node == seed.private_dns_names[0],
        "{guessed:?}"
    );

    // Initialized with the cluster, whose Node `i-…` carries the instance's provider ID.
    let nodes = serde_json::json!({
        "apiVersion": "v1",
        "kind": "NodeList",
        "metadata": {"resourceVersion": "1"},
        "items": [
            {"metadata": {"name": id}, "spec": {"providerID": format!("aws:///us-east-1a/{id}")}},
            {"metadata": {"name": "not-on-aws"}, "spec": {"providerID": "gce://p/z/vm"}},
        ],
    });
    let client = fake_cluster(nodes.to_string()).await?;
    let restarted = AwsCloud::from_config_text_with(&seed.cloud_config(&moto), moto.options())?;
    restarted
        .initialize(cloud_provider::InitContext::new(
            Arc::new(cloud_provider::SharedClient(client)),
            tokio_util::sync::CancellationToken::new(),
        ))
        .await?;
    let listed = restarted
        .routes()
        .context("routes")?
        .list_routes(CLUSTER)
        .await?;
    ensure!(listed.len() == 1, "{listed:?}");
    ensure!(
        listed[0].target_node == id && !listed[0].blackhole,
        "{listed:?}"
    );
    Ok(())
}

/// A Service without `aws-load-balancer-type` gets a Classic ELB from
/// cloud-provider-aws. After a migration the Service's Classic ELB (as upstream makes it: named
/// `a` + UID, cluster-tagged, with its `k8s-elb-<name>` group and an all-traffic node rule from
/// that group) blocks a second load balancer with a clear error, is reported by get, and is
/// deleted with its group and node rule when the Service goes: no duplicate, no leak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_elb_from_cloud_provider_aws_is_neither_duplicated_nor_leaked()
-> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("classic", 2).await?;
    let ec2 = moto.ec2().await;
    let elb = moto.elbv2().await;
    let classic = moto.elb_classic().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let svc = service(
        "legacy",
        "5a1e0000-0000-4000-8000-000000000012",
        &[("TCP", 80, 30080)],
    );
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);
    // What cloud-provider-aws left: the group, the load balancer, the node rule.
    let group = security_group(&ec2, &seed, &security_group_name(&name), true).await?;
    let created = classic
        .create_load_balancer()
        .load_balancer_name(&name)
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_protocol("TCP")
                .instance_port(30080)
                .build()?,
        )
        .subnets(&seed.subnet_ids[0])
        .security_groups(&group)
        .tags(
            aws_sdk_elasticloadbalancing::types::Tag::builder()
                .key("kubernetes.io/cluster/classic")
                .value("owned")
                .build()?,
        )
        .send()
        .await?;
    let dns = created.dns_name().context("classic dns")?.to_owned();
    ec2.authorize_security_group_ingress()
        .group_id(&seed.node_security_group_id)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&group)
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();

    let err = lbs
        .ensure_load_balancer(CLUSTER, &svc, &nodes)
        .await
        .expect_err("a second load balancer must be refused");
    ensure!(
        err.to_string().contains("Classic ELB") && err.to_string().contains(&name),
        "{err}"
    );
    ensure!(
        elb.describe_load_balancers()
            .send()
            .await?
            .load_balancers()
            .is_empty(),
        "an NLB was created beside the Classic ELB"
    );
    let status = lbs.get_load_balancer(CLUSTER, &svc).await?.context("get")?;
    ensure!(
        status
            .ingress
            .as_deref()
            .and_then(|i| i[0].hostname.as_deref())
            == Some(dns.as_str()),
        "{status:?}"
    );

    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    let left = classic.describe_load_balancers().send().await?;
    ensure!(left.load_balancer_descriptions().is_empty(), "{left:?}");
    let groups = ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(&seed.vpc_id)
                .build(),
        )
        .send()
        .await?;
    ensure!(
        !groups
            .security_groups()
            .iter()
            .any(|g| g.group_id() == Some(group.as_str())),
        "the Classic ELB's group was left behind"
    );
    let references = groups
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| p.user_id_group_pairs())
        .filter(|p| p.group_id() == Some(group.as_str()))
        .count();
    ensure!(references == 0, "{references} node rules still refer to it");
    ensure!(lbs.get_load_balancer(CLUSTER, &svc).await?.is_none());
    Ok(())
}

/// cloud-provider-aws#1219 (dual-stack NLBs, open upstream): a Service whose `ipFamilies`
/// include IPv6 gets `IpAddressType=dualstack`, node rules open to `::/0` as well (with the
/// ICMPv6 path-MTU rule), and back to `ipv4` when the family goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_families_get_a_dual_stack_nlb() -> anyhow::Result<()> {
    let (moto, seed, cloud) = setup("dualstack", 2).await?;
    let ec2 = moto.ec2().await;
    let elb = moto.elbv2().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let mut svc = service(
        "dual",
        "5a1e0000-0000-4000-8000-000000000013",
        &[("TCP", 80, 30080)],
    );
    svc.spec.as_mut().context("spec")?.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    let name = lbs.get_load_balancer_name(CLUSTER, &svc);
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    lbs.ensure_load_balancer(CLUSTER, &svc, &nodes).await?;
    let ip_type = |elb: aws_sdk_elasticloadbalancingv2::Client, name: String| async move {
        let out = elb.describe_load_balancers().names(name).send().await?;
        anyhow::Ok(
            out.load_balancers()
                .first()
                .and_then(|l| l.ip_address_type())
                .map(|t| t.as_str().to_owned())
                .unwrap_or_default(),
        )
    };
    ensure!(ip_type(elb.clone(), name.clone()).await? == "dualstack");
    let group = ec2
        .describe_security_groups()
        .group_ids(&seed.node_security_group_id)
        .send()
        .await?;
    let v6: BTreeSet<(String, i32, String)> = group
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| {
            p.ipv6_ranges().iter().map(move |r| {
                (
                    p.ip_protocol().unwrap_or_default().to_owned(),
                    p.from_port().unwrap_or(-1),
                    r.cidr_ipv6().unwrap_or_default().to_owned(),
                )
            })
        })
        .collect();
    ensure!(v6.contains(&("tcp".into(), 30080, "::/0".into())), "{v6:?}");
    ensure!(v6.contains(&("icmpv6".into(), 2, "::/0".into())), "{v6:?}");

    svc.spec.as_mut().context("spec")?.ip_families = Some(vec!["IPv4".into()]);
    lbs.update_load_balancer(CLUSTER, &svc, &nodes).await?;
    ensure!(ip_type(elb.clone(), name.clone()).await? == "ipv4");
    lbs.ensure_load_balancer_deleted(CLUSTER, &svc).await?;
    let left = ec2
        .describe_security_groups()
        .group_ids(&seed.node_security_group_id)
        .send()
        .await?;
    let rules: usize = left
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .map(|p| p.ipv6_ranges().len() + p.ip_ranges().len())
        .sum();
    ensure!(rules == 0, "{rules} rules left");
    Ok(())
}

/// Beyond upstream: the NLBs this cluster owns are listed by the cluster tag
/// (`kubernetes.io/cluster/<id>=owned`) with the Service their `kubernetes.io/service-name`
/// tag names, so the service controller can collect leaked ones; deleting a listed one takes
/// its target groups with it, and a load balancer without this cluster's tag is neither
/// listed nor deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_load_balancers_are_listed_by_the_cluster_tag_and_deleted_whole() -> anyhow::Result<()>
{
    let (moto, seed, cloud) = setup("gc", 2).await?;
    let elb = moto.elbv2().await;
    let lbs = cloud.load_balancer().context("lb")?;
    let nodes: Vec<Arc<Node>> = seed
        .instance_ids
        .iter()
        .map(|id| Arc::new(node(id)))
        .collect();
    // The load balancer's name is "a" + the uid without dashes, cut at 32 characters
    // (upstream's `GetLoadBalancerName`): the uids differ early, so the names differ.
    let kept = service(
        "kept",
        "5a1e00a1-0000-4000-8000-000000000000",
        &[("TCP", 80, 30080)],
    );
    let leaked = service(
        "leaked",
        "5a1e00a2-0000-4000-8000-000000000000",
        &[("TCP", 80, 30081)],
    );
    lbs.ensure_load_balancer(CLUSTER, &kept, &nodes).await?;
    lbs.ensure_load_balancer(CLUSTER, &leaked, &nodes).await?;
    let (kept_name, leaked_name) = (
        lbs.get_load_balancer_name(CLUSTER, &kept),
        lbs.get_load_balancer_name(CLUSTER, &leaked),
    );
    // Another cluster's (or a hand-made) NLB: no tag of ours.
    elb.create_load_balancer()
        .name("foreign")
        .r#type(aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum::Network)
        .subnets(&seed.subnet_ids[0])
        .send()
        .await?;

    let mut listed = lbs.list_load_balancers(CLUSTER).await?;
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    let mut want = vec![
        (kept_name.clone(), "kept".to_owned()),
        (leaked_name.clone(), "leaked".to_owned()),
    ];
    want.sort();
    ensure!(
        listed
            .iter()
            .map(|lb| (lb.name.clone(), lb.service_name.clone()))
            .collect::<Vec<_>>()
            == want,
        "{listed:?}"
    );
    let namespace = kept.metadata.namespace.clone().unwrap_or_default();
    ensure!(
        listed.iter().all(|lb| lb.service_namespace == namespace),
        "{listed:?}"
    );

    let leaked_lb = listed
        .iter()
        .find(|lb| lb.name == leaked_name)
        .context("leaked listed")?;
    lbs.ensure_listed_load_balancer_deleted(CLUSTER, leaked_lb)
        .await?;
    ensure!(
        observe(&elb, &leaked_name).await?.is_none(),
        "leaked NLB left"
    );
    ensure!(
        observe(&elb, &kept_name).await?.is_some(),
        "kept NLB deleted"
    );
    let groups = elb.describe_target_groups().send().await?;
    ensure!(
        groups.target_groups().len() == 1,
        "the leaked NLB's target group was left: {:?}",
        groups.target_groups()
    );
    // Asked to delete one it does not own, it leaves it.
    let foreign = cloud_provider::ClusterLoadBalancer::new("foreign", "default", "foreign");
    lbs.ensure_listed_load_balancer_deleted(CLUSTER, &foreign)
        .await?;
    let names: Vec<String> = elb
        .describe_load_balancers()
        .send()
        .await?
        .load_balancers()
        .iter()
        .filter_map(|lb| lb.load_balancer_name().map(str::to_owned))
        .collect();
    ensure!(names.contains(&"foreign".to_owned()), "{names:?}");
    // Listing again after the deletion is one load balancer.
    ensure!(lbs.list_load_balancers(CLUSTER).await?.len() == 1);
    Ok(())
}
