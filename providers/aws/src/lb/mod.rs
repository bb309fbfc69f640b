//! Network Load Balancers through ELBv2.
//!
//! For each `type: LoadBalancer` Service: an NLB named as upstream (`a` + the UID without dashes,
//! 32 characters), internet-facing or internal (`aws-load-balancer-internal`), dual-stack when
//! the Service has an IPv6 family, in one subnet per zone found by the cluster and role tags (or
//! `aws-load-balancer-subnets`); per Service port a target group (TCP, UDP, TCP_UDP, or TLS with
//! `backend-protocol: ssl`) of the *running* node instances on the NodePort, registered and
//! deregistered 100 at a time, and a listener forwarding to it (TLS with `ssl-cert`,
//! `ssl-ports` and `ssl-negotiation-policy`); health checks on the traffic port, or HTTP on
//! `healthCheckNodePort` with `externalTrafficPolicy: Local`. A target group that must change
//! (NodePort, protocol, health-check protocol or interval) is replaced and the listener switched
//! to it with ModifyListener: the listener is never dropped. Node security-group rules for the
//! clients (`loadBalancerSourceRanges`), the health checks and path-MTU discovery go onto each
//! target instance's own group (`lb/rules.rs`), and are cleaned off every other group by their
//! description; with `NLBSecurityGroupMode = Managed` the load balancer gets a group of its own.
//! Everything created carries `kubernetes.io/cluster/<id>=owned`, `kubernetes.io/service-name`
//! and the additional tags.
//!
//! Differences from upstream: no Classic ELB is created: a Service without
//! `aws-load-balancer-type` gets an NLB (upstream: a CLB), unless cloud-provider-aws already made
//! it a Classic ELB, which is then refused, reported and deleted with the Service (`lb/classic.rs`);
//! `aws-load-balancer-type` values other than `nlb` are refused, and CLB-only annotations are
//! refused with why. Bring-your-own security groups, EIP and private-IP subnet mappings and
//! access logs are not supported (refused with why). Target-group names use FNV-1a instead of
//! SHA-1 for their hash.

mod classic;
mod orphans;
pub mod plan;
mod rules;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance, ResourceType, SecurityGroup, Subnet, TagSpecification};
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, IpAddressType, Listener, LoadBalancer as Elb,
    LoadBalancerAttribute, LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum,
    Tag as ElbTag, TargetDescription, TargetGroup, TargetGroupAttribute, TargetHealthReasonEnum,
    TargetTypeEnum,
};
use cloud_provider::{CloudError, CloudResult, ClusterLoadBalancer, LoadBalancer};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::{
    AwsCloud, Inner, LEGACY_CLUSTER_TAG,
    client::{aws_error, error_code},
    config::NlbSecurityGroupMode,
    ids,
    instances::{NodeKey, node_key},
};
use plan::{HealthPort, NlbPlan, PortPlan};

/// Targets per RegisterTargets / DeregisterTargets call.
pub const TARGETS_PER_CALL: usize = 100;

/// The tag naming the Service a resource was created for.
pub const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";

fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `dualstack` for Services with an IPv6 family, else `ipv4`.
fn ip_address_type(plan: &NlbPlan) -> IpAddressType {
    if plan.dual_stack {
        IpAddressType::Dualstack
    } else {
        IpAddressType::Ipv4
    }
}

/// A forward action to a target group.
fn forward(tg_arn: &str) -> Action {
    Action::builder()
        .r#type(ActionTypeEnum::Forward)
        .target_group_arn(tg_arn)
        .build()
}

/// The listener certificate of a TLS port.
fn certificates(port: &PortPlan) -> Option<Vec<Certificate>> {
    port.tls.as_ref().map(|t| {
        vec![
            Certificate::builder()
                .certificate_arn(&t.certificate)
                .build(),
        ]
    })
}

/// Whether listener `l` already is what `port` asks for: protocol, target group and, for TLS,
/// certificate and (when given) security policy.
fn listener_matches(l: &Listener, port: &PortPlan, tg_arn: &str) -> bool {
    let protocol = l.protocol().map(|p| p.as_str()) == Some(port.listener_protocol());
    let target = l
        .default_actions()
        .iter()
        .any(|a| a.target_group_arn() == Some(tg_arn));
    let tls = match &port.tls {
        None => true,
        Some(t) => {
            l.certificates().first().and_then(|c| c.certificate_arn())
                == Some(t.certificate.as_str())
                && t.policy
                    .as_deref()
                    .is_none_or(|p| l.ssl_policy() == Some(p))
        }
    };
    protocol && target && tls
}

impl Inner {
    fn elb_tags(&self, service: &Service, plan: Option<&NlbPlan>) -> CloudResult<Vec<ElbTag>> {
        self.tag_pairs(service, plan)?
            .into_iter()
            .map(|(k, v)| Ok(ElbTag::builder().key(k).value(v).build()))
            .collect()
    }

    fn tag_pairs(
        &self,
        service: &Service,
        plan: Option<&NlbPlan>,
    ) -> CloudResult<Vec<(String, String)>> {
        let mut tags: BTreeMap<String, String> =
            plan.map(|p| p.extra_tags.clone()).unwrap_or_default();
        tags.insert(SERVICE_NAME_TAG.to_owned(), service_key(service));
        tags.insert(self.cluster_tag_key("load balancers")?, "owned".to_owned());
        if self.config.kubernetes_cluster_id.is_none()
            && let Some(legacy) = &self.config.kubernetes_cluster_tag
        {
            tags.insert(LEGACY_CLUSTER_TAG.to_owned(), legacy.clone());
        }
        Ok(tags.into_iter().collect())
    }

    async fn find_lb(&self, name: &str) -> CloudResult<Option<Elb>> {
        let clients = self.clients().await?;
        match clients
            .elb
            .describe_load_balancers()
            .names(name)
            .send()
            .await
        {
            Ok(out) => Ok(out.load_balancers().first().cloned()),
            Err(e) if error_code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(aws_error("elasticloadbalancing:DescribeLoadBalancers", e)),
        }
    }

    async fn find_target_group(&self, name: &str) -> CloudResult<Option<TargetGroup>> {
        let clients = self.clients().await?;
        match clients
            .elb
            .describe_target_groups()
            .names(name)
            .send()
            .await
        {
            Ok(out) => Ok(out.target_groups().first().cloned()),
            Err(e) if error_code(&e) == Some("TargetGroupNotFound") => Ok(None),
            Err(e) => Err(aws_error("elasticloadbalancing:DescribeTargetGroups", e)),
        }
    }

    async fn listeners(&self, lb_arn: &str) -> CloudResult<Vec<Listener>> {
        let clients = self.clients().await?;
        let mut out = Vec::new();
        let mut pages = clients
            .elb
            .describe_listeners()
            .load_balancer_arn(lb_arn)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| aws_error("elasticloadbalancing:DescribeListeners", e))?;
            out.extend(page.listeners().iter().cloned());
        }
        Ok(out)
    }

    /// The subnets of the load balancer: the annotation's, else one per zone by the cluster and
    /// role tags (internet-facing ones must route to an internet gateway).
    async fn lb_subnets(&self, plan: &NlbPlan) -> CloudResult<Vec<Subnet>> {
        let clients = self.clients().await?;
        let vpc = self.vpc_id().await?.to_owned();
        if let Some(wanted) = &plan.subnets {
            let resp = clients
                .ec2
                .describe_subnets()
                .filters(Filter::builder().name("vpc-id").values(&vpc).build())
                .send()
                .await
                .map_err(|e| aws_error("ec2:DescribeSubnets", e))?;
            let mut out = Vec::new();
            for w in wanted {
                let found = resp.subnets().iter().find(|s| {
                    s.subnet_id() == Some(w.as_str())
                        || s.tags()
                            .iter()
                            .any(|t| t.key() == Some("Name") && t.value() == Some(w.as_str()))
                });
                match found {
                    Some(s) => out.push(s.clone()),
                    None => {
                        return Err(CloudError::message(format!(
                            "annotation {}: subnet {w} is not in VPC {vpc}",
                            plan::ANNOTATION_SUBNETS
                        )));
                    }
                }
            }
            return Ok(out);
        }
        let subnets = clients
            .ec2
            .describe_subnets()
            .filters(Filter::builder().name("vpc-id").values(&vpc).build())
            .send()
            .await
            .map_err(|e| aws_error("ec2:DescribeSubnets", e))?;
        let cluster_key = self.cluster_tag_key("subnet discovery")?;
        let role = if plan.internal {
            "kubernetes.io/role/internal-elb"
        } else {
            "kubernetes.io/role/elb"
        };
        let public: Option<BTreeSet<String>> = if plan.internal {
            None
        } else {
            Some(self.public_subnets(&vpc, subnets.subnets()).await?)
        };
        let mut by_zone: BTreeMap<String, (i32, Subnet)> = BTreeMap::new();
        for s in subnets.subnets() {
            let tags = s.tags();
            let ours = tags.iter().any(|t| t.key() == Some(cluster_key.as_str()));
            let other_cluster = tags.iter().any(|t| {
                t.key()
                    .is_some_and(|k| k.starts_with(crate::CLUSTER_TAG_PREFIX) && k != cluster_key)
            });
            if other_cluster && !ours {
                continue;
            }
            let id = s.subnet_id().unwrap_or_default();
            if let Some(public) = &public
                && !public.contains(id)
            {
                continue;
            }
            let score = i32::from(tags.iter().any(|t| t.key() == Some(role))) * 2 + i32::from(ours);
            let zone = s.availability_zone().unwrap_or_default().to_owned();
            let better = match by_zone.get(&zone) {
                None => true,
                Some((best, b)) => {
                    score > *best || (score == *best && id < b.subnet_id().unwrap_or_default())
                }
            };
            if better {
                by_zone.insert(zone, (score, s.clone()));
            }
        }
        let mut out: Vec<Subnet> = by_zone.into_values().map(|(_, s)| s).collect();
        if out.is_empty()
            && let Some(fallback) = &self.config.subnet_id
            && let Some(s) = subnets
                .subnets()
                .iter()
                .find(|s| s.subnet_id() == Some(fallback.as_str()))
        {
            out.push(s.clone());
        }
        if out.is_empty() {
            return Err(CloudError::message(format!(
                "no {} subnets found in VPC {vpc}: tag them {role}=1 and {cluster_key}, or use \
                 the {} annotation",
                if plan.internal {
                    "internal"
                } else {
                    "public (internet gateway)"
                },
                plan::ANNOTATION_SUBNETS
            )));
        }
        Ok(out)
    }

    /// Subnets whose route table (explicit, else the VPC's main one) routes to an internet gateway.
    async fn public_subnets(&self, vpc: &str, subnets: &[Subnet]) -> CloudResult<BTreeSet<String>> {
        let clients = self.clients().await?;
        let tables = clients
            .ec2
            .describe_route_tables()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(|e| aws_error("ec2:DescribeRouteTables", e))?;
        let has_igw = |t: &aws_sdk_ec2::types::RouteTable| {
            t.routes()
                .iter()
                .any(|r| r.gateway_id().is_some_and(|g| g.starts_with("igw")))
        };
        let main_public = tables
            .route_tables()
            .iter()
            .find(|t| t.associations().iter().any(|a| a.main() == Some(true)))
            .is_some_and(has_igw);
        let mut out = BTreeSet::new();
        for s in subnets {
            let id = s.subnet_id().unwrap_or_default();
            let explicit = tables
                .route_tables()
                .iter()
                .find(|t| t.associations().iter().any(|a| a.subnet_id() == Some(id)));
            let public = match explicit {
                Some(t) => has_igw(t),
                None => main_public,
            };
            if public {
                out.insert(id.to_owned());
            }
        }
        Ok(out)
    }

    /// The instance IDs to target: the Nodes matching the label selector whose instances are
    /// running (kubernetes#94966: pending, stopping and shutting-down ones are not registered).
    async fn target_instances(
        &self,
        plan: &NlbPlan,
        nodes: &[Arc<Node>],
    ) -> CloudResult<BTreeMap<String, Instance>> {
        let mut ids_wanted = Vec::new();
        let mut dns_wanted = Vec::new();
        for node in nodes {
            let label = |k: &String| node.metadata.labels.as_ref().and_then(|l| l.get(k));
            let selected = plan.node_labels.iter().all(|(k, v)| match v {
                Some(v) => label(k) == Some(v),
                None => label(k).is_some(),
            });
            if !selected {
                continue;
            }
            match node_key(node) {
                Ok(NodeKey::Id(id)) => ids_wanted.push((id, node)),
                Ok(NodeKey::Dns(name)) => dns_wanted.push(name),
                Err(e) => tracing::warn!(error = %e, "skipping a node that names no instance"),
            }
        }
        let mut out = BTreeMap::new();
        let ids_only: Vec<String> = ids_wanted.iter().map(|(id, _)| id.clone()).collect();
        let mut found = self.cached_instances(&ids_only).await?;
        for (id, node) in &ids_wanted {
            match found.remove(id) {
                Some(i) if ids::is_running(&i) => {
                    if let Some(name) = node.metadata.name.as_deref() {
                        self.remember_node_name(&i, name);
                    }
                    out.insert(id.clone(), i);
                }
                _ => tracing::info!(instance = %id, "not a target: instance not running"),
            }
        }
        if !dns_wanted.is_empty() {
            for (name, i) in self.by_dns_names(&dns_wanted).await? {
                if ids::is_running(&i)
                    && let Some(id) = i.instance_id()
                {
                    self.remember_node_name(&i, &name);
                    out.insert(id.to_owned(), i);
                }
            }
        }
        Ok(out)
    }

    async fn find_security_group(&self, name: &str) -> CloudResult<Option<SecurityGroup>> {
        let clients = self.clients().await?;
        let vpc = self.vpc_id().await?;
        let out = clients
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("group-name").values(name).build())
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(|e| aws_error("ec2:DescribeSecurityGroups", e))?;
        Ok(out.security_groups().first().cloned())
    }

    /// The security groups to attach to the NLB: `ElbSecurityGroup`, else (Managed mode) the
    /// load balancer's own, created with its client rules.
    async fn ensure_lb_security_group(
        &self,
        lb_name: &str,
        service: &Service,
        plan: &NlbPlan,
    ) -> CloudResult<Vec<String>> {
        if let Some(sg) = &self.config.elb_security_group {
            return Ok(vec![sg.clone()]);
        }
        if self.config.nlb_security_group_mode != NlbSecurityGroupMode::Managed {
            return Ok(Vec::new());
        }
        let clients = self.clients().await?;
        let name = plan::security_group_name(lb_name);
        let group = match self.find_security_group(&name).await? {
            Some(g) => g,
            None => {
                let tags: Vec<aws_sdk_ec2::types::Tag> = self
                    .tag_pairs(service, Some(plan))?
                    .into_iter()
                    .map(|(k, v)| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build())
                    .collect();
                clients
                    .ec2
                    .create_security_group()
                    .group_name(&name)
                    .description("[k8s] Managed SecurityGroup for LoadBalancer")
                    .vpc_id(self.vpc_id().await?)
                    .tag_specifications(
                        TagSpecification::builder()
                            .resource_type(ResourceType::SecurityGroup)
                            .set_tags(Some(tags))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| aws_error("ec2:CreateSecurityGroup", e))?;
                self.find_security_group(&name).await?.ok_or_else(|| {
                    CloudError::message(format!("security group {name} vanished after creation"))
                })?
            }
        };
        let want = rules::frontend_rules(lb_name, plan);
        let descriptions = [
            rules::client_description(lb_name),
            rules::mtu_description(lb_name),
        ];
        self.reconcile_rules(&group, &want, &descriptions).await?;
        Ok(group.group_id().map(str::to_owned).into_iter().collect())
    }

    /// Creates or finds the target group for `port`, and brings its health check up to date.
    async fn ensure_target_group(
        &self,
        cluster_id: &str,
        service: &Service,
        plan: &NlbPlan,
        port: &PortPlan,
        vpc: &str,
    ) -> CloudResult<TargetGroup> {
        let clients = self.clients().await?;
        let name = plan::target_group_name(cluster_id, service, port, &plan.health);
        let hc = &plan.health;
        let hc_port = match hc.port {
            HealthPort::Traffic => "traffic-port".to_owned(),
            HealthPort::Port(p) => p.to_string(),
        };
        let tg = match self.find_target_group(&name).await? {
            Some(tg) => {
                let differs = tg.health_check_port() != Some(hc_port.as_str())
                    || tg.health_check_path() != hc.path.as_deref()
                    || tg.healthy_threshold_count() != Some(hc.healthy_threshold)
                    || tg.unhealthy_threshold_count() != Some(hc.unhealthy_threshold);
                if differs {
                    clients
                        .elb
                        .modify_target_group()
                        .target_group_arn(tg.target_group_arn().unwrap_or_default())
                        .health_check_port(&hc_port)
                        .set_health_check_path(hc.path.clone())
                        .healthy_threshold_count(hc.healthy_threshold)
                        .unhealthy_threshold_count(hc.unhealthy_threshold)
                        .send()
                        .await
                        .map_err(|e| aws_error("elasticloadbalancing:ModifyTargetGroup", e))?;
                }
                tg
            }
            None => {
                let out = clients
                    .elb
                    .create_target_group()
                    .name(&name)
                    .protocol(ProtocolEnum::from(port.target_protocol()))
                    .port(port.node_port)
                    .vpc_id(vpc)
                    .target_type(TargetTypeEnum::Instance)
                    .health_check_protocol(ProtocolEnum::from(hc.protocol.as_str()))
                    .health_check_port(&hc_port)
                    .set_health_check_path(hc.path.clone())
                    .health_check_interval_seconds(hc.interval)
                    .healthy_threshold_count(hc.healthy_threshold)
                    .unhealthy_threshold_count(hc.unhealthy_threshold)
                    .set_tags(Some(self.elb_tags(service, Some(plan))?))
                    .send()
                    .await
                    .map_err(|e| aws_error("elasticloadbalancing:CreateTargetGroup", e))?;
                out.target_groups().first().cloned().ok_or_else(|| {
                    CloudError::message(format!("CreateTargetGroup {name} returned nothing"))
                })?
            }
        };
        if !plan.target_group_attributes.is_empty() {
            let attrs: Vec<TargetGroupAttribute> = plan
                .target_group_attributes
                .iter()
                .map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build())
                .collect();
            clients
                .elb
                .modify_target_group_attributes()
                .target_group_arn(tg.target_group_arn().unwrap_or_default())
                .set_attributes(Some(attrs))
                .send()
                .await
                .map_err(|e| aws_error("elasticloadbalancing:ModifyTargetGroupAttributes", e))?;
        }
        Ok(tg)
    }

    /// Registered instance IDs of a target group (deregistering ones excluded).
    async fn registered(&self, tg_arn: &str) -> CloudResult<BTreeSet<String>> {
        let clients = self.clients().await?;
        let out = clients
            .elb
            .describe_target_health()
            .target_group_arn(tg_arn)
            .send()
            .await
            .map_err(|e| aws_error("elasticloadbalancing:DescribeTargetHealth", e))?;
        Ok(out
            .target_health_descriptions()
            .iter()
            .filter(|d| {
                d.target_health().and_then(|h| h.reason())
                    != Some(&TargetHealthReasonEnum::DeregistrationInProgress)
            })
            .filter_map(|d| d.target().and_then(|t| t.id()).map(str::to_owned))
            .collect())
    }

    /// Deregisters the extra targets, then registers the missing ones, 100 per call.
    async fn ensure_targets(
        &self,
        tg_arn: &str,
        node_port: i32,
        want: &[String],
    ) -> CloudResult<()> {
        let clients = self.clients().await?;
        let have = self.registered(tg_arn).await?;
        let want: BTreeSet<String> = want.iter().cloned().collect();
        let target = |id: &String| TargetDescription::builder().id(id).port(node_port).build();
        let extra: Vec<&String> = have.difference(&want).collect();
        for chunk in extra.chunks(TARGETS_PER_CALL) {
            let targets: Vec<TargetDescription> = chunk.iter().map(|id| target(id)).collect();
            clients
                .elb
                .deregister_targets()
                .target_group_arn(tg_arn)
                .set_targets(Some(targets))
                .send()
                .await
                .map_err(|e| aws_error("elasticloadbalancing:DeregisterTargets", e))?;
        }
        let missing: Vec<&String> = want.difference(&have).collect();
        for chunk in missing.chunks(TARGETS_PER_CALL) {
            let targets: Vec<TargetDescription> = chunk.iter().map(|id| target(id)).collect();
            clients
                .elb
                .register_targets()
                .target_group_arn(tg_arn)
                .set_targets(Some(targets))
                .send()
                .await
                .map_err(|e| aws_error("elasticloadbalancing:RegisterTargets", e))?;
        }
        Ok(())
    }

    async fn delete_target_group(&self, arn: &str) -> CloudResult<()> {
        let clients = self.clients().await?;
        match clients
            .elb
            .delete_target_group()
            .target_group_arn(arn)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if error_code(&e) == Some("TargetGroupNotFound") => Ok(()),
            Err(e) => Err(aws_error("elasticloadbalancing:DeleteTargetGroup", e)),
        }
    }

    async fn ensure_cross_zone(&self, lb_arn: &str, enabled: bool) -> CloudResult<()> {
        let clients = self.clients().await?;
        const KEY: &str = "load_balancing.cross_zone.enabled";
        let current = clients
            .elb
            .describe_load_balancer_attributes()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .map_err(|e| aws_error("elasticloadbalancing:DescribeLoadBalancerAttributes", e))?;
        let value = enabled.to_string();
        if current
            .attributes()
            .iter()
            .any(|a| a.key() == Some(KEY) && a.value() == Some(value.as_str()))
        {
            return Ok(());
        }
        clients
            .elb
            .modify_load_balancer_attributes()
            .load_balancer_arn(lb_arn)
            .attributes(
                LoadBalancerAttribute::builder()
                    .key(KEY)
                    .value(value)
                    .build(),
            )
            .send()
            .await
            .map_err(|e| aws_error("elasticloadbalancing:ModifyLoadBalancerAttributes", e))?;
        Ok(())
    }

    async fn ensure_nlb(
        &self,
        lb_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let plan = plan::plan(service)?;
        let clients = self.clients().await?;
        let cluster_id = self.cluster_id("load balancers")?.to_owned();
        let vpc = self.vpc_id().await?.to_owned();
        let existing = self.find_lb(lb_name).await?;
        if existing.is_none()
            && let Some(clb) = self.find_classic(lb_name).await?
        {
            return Err(Self::classic_refusal(&service_key(service), &clb));
        }
        let instances = self.target_instances(&plan, nodes).await?;
        let targets: Vec<String> = instances.keys().cloned().collect();
        let subnets = self.lb_subnets(&plan).await?;
        let subnet_cidrs: Vec<String> = subnets
            .iter()
            .filter_map(|s| s.cidr_block().map(str::to_owned))
            .collect();
        let security_groups = self
            .ensure_lb_security_group(lb_name, service, &plan)
            .await?;

        let lb = match existing {
            Some(lb) => lb,
            None => {
                let scheme = if plan.internal {
                    LoadBalancerSchemeEnum::Internal
                } else {
                    LoadBalancerSchemeEnum::InternetFacing
                };
                let out = clients
                    .elb
                    .create_load_balancer()
                    .name(lb_name)
                    .r#type(LoadBalancerTypeEnum::Network)
                    .scheme(scheme)
                    .set_subnets(Some(
                        subnets
                            .iter()
                            .filter_map(|s| s.subnet_id().map(str::to_owned))
                            .collect(),
                    ))
                    .set_security_groups((!security_groups.is_empty()).then_some(security_groups))
                    .ip_address_type(ip_address_type(&plan))
                    .set_tags(Some(self.elb_tags(service, Some(&plan))?))
                    .send()
                    .await
                    .map_err(|e| aws_error("elasticloadbalancing:CreateLoadBalancer", e))?;
                out.load_balancers().first().cloned().ok_or_else(|| {
                    CloudError::message(format!("CreateLoadBalancer {lb_name} returned nothing"))
                })?
            }
        };
        let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
        if lb.ip_address_type() != Some(&ip_address_type(&plan)) {
            clients
                .elb
                .set_ip_address_type()
                .load_balancer_arn(&lb_arn)
                .ip_address_type(ip_address_type(&plan))
                .send()
                .await
                .map_err(|e| aws_error("elasticloadbalancing:SetIpAddressType", e))?;
        }
        let want_internal = plan.internal;
        if lb
            .scheme()
            .is_some_and(|s| (*s == LoadBalancerSchemeEnum::Internal) != want_internal)
        {
            return Err(CloudError::message(format!(
                "service {}: the load balancer {lb_name} is {}, and the scheme of an existing \
                 NLB cannot change; delete and recreate the Service",
                service_key(service),
                lb.scheme().map(|s| s.as_str()).unwrap_or_default()
            )));
        }

        // Listeners and target groups, one per port.
        let listeners = self.listeners(&lb_arn).await?;
        let mut kept_listeners = BTreeSet::new();
        for port in &plan.ports {
            let tg = self
                .ensure_target_group(&cluster_id, service, &plan, port, &vpc)
                .await?;
            let tg_arn = tg.target_group_arn().unwrap_or_default().to_owned();
            self.ensure_targets(&tg_arn, port.node_port, &targets)
                .await?;
            let existing = listeners.iter().find(|l| l.port() == Some(port.port));
            let arn = match existing {
                Some(l) if listener_matches(l, port, &tg_arn) => {
                    l.listener_arn().unwrap_or_default().to_owned()
                }
                // Switched in place, never dropped: no outage on this port.
                Some(l) => self.modify_listener(l, port, &tg_arn).await?,
                None => {
                    let out = clients
                        .elb
                        .create_listener()
                        .load_balancer_arn(&lb_arn)
                        .port(port.port)
                        .protocol(ProtocolEnum::from(port.listener_protocol()))
                        .default_actions(forward(&tg_arn))
                        .set_certificates(certificates(port))
                        .set_ssl_policy(port.tls.as_ref().and_then(|t| t.policy.clone()))
                        .set_tags(Some(self.elb_tags(service, Some(&plan))?))
                        .send()
                        .await
                        .map_err(|e| aws_error("elasticloadbalancing:CreateListener", e))?;
                    out.listeners()
                        .first()
                        .and_then(|l| l.listener_arn())
                        .unwrap_or_default()
                        .to_owned()
                }
            };
            kept_listeners.insert(arn);
        }
        // Ports that are gone: their listeners and target groups go too.
        for l in &listeners {
            if let Some(arn) = l.listener_arn()
                && !kept_listeners.contains(arn)
                && !plan.ports.iter().any(|p| Some(p.port) == l.port())
            {
                self.delete_listener_and_groups(l).await?;
            }
        }
        if let Some(enabled) = plan.cross_zone {
            self.ensure_cross_zone(&lb_arn, enabled).await?;
        }
        let want = rules::node_rules(lb_name, &plan, &subnet_cidrs);
        self.sync_node_rules(lb_name, &want, &instances.values().collect::<Vec<_>>())
            .await?;
        Ok(status_of(&lb))
    }

    /// Points an existing listener at `tg_arn` (and updates its protocol, certificate and policy)
    /// with ModifyListener, then deletes the target groups it forwarded to before. The listener
    /// stays up throughout (upstream: new target group, ModifyListener, delete the old one).
    /// The protocol is sent only when it changes (moto refuses TLS, UDP and TCP_UDP there).
    async fn modify_listener(
        &self,
        l: &Listener,
        port: &PortPlan,
        tg_arn: &str,
    ) -> CloudResult<String> {
        let clients = self.clients().await?;
        let arn = l.listener_arn().unwrap_or_default().to_owned();
        let protocol_changes = l.protocol().map(|p| p.as_str()) != Some(port.listener_protocol());
        tracing::info!(listener = %arn, port = port.port, target_group = %tg_arn, "modifying listener");
        clients
            .elb
            .modify_listener()
            .listener_arn(&arn)
            .default_actions(forward(tg_arn))
            .set_protocol(protocol_changes.then(|| ProtocolEnum::from(port.listener_protocol())))
            .set_certificates(certificates(port))
            .set_ssl_policy(port.tls.as_ref().and_then(|t| t.policy.clone()))
            .send()
            .await
            .map_err(|e| aws_error("elasticloadbalancing:ModifyListener", e))?;
        for a in l.default_actions() {
            if let Some(old) = a.target_group_arn()
                && old != tg_arn
            {
                self.delete_target_group(old).await?;
            }
        }
        Ok(arn)
    }

    /// Deletes a listener, then the target groups it forwarded to.
    async fn delete_listener_and_groups(&self, l: &Listener) -> CloudResult<()> {
        let clients = self.clients().await?;
        if let Some(arn) = l.listener_arn() {
            match clients.elb.delete_listener().listener_arn(arn).send().await {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("ListenerNotFound") => {}
                Err(e) => return Err(aws_error("elasticloadbalancing:DeleteListener", e)),
            }
        }
        for a in l.default_actions() {
            if let Some(tg) = a.target_group_arn() {
                self.delete_target_group(tg).await?;
            }
        }
        Ok(())
    }

    async fn delete_nlb(&self, lb_name: &str, service: &Service) -> CloudResult<()> {
        let clients = self.clients().await?;
        let cluster_id = self.cluster_id("load balancers")?.to_owned();
        let mut target_groups: BTreeSet<String> = BTreeSet::new();
        if let Some(lb) = self.find_lb(lb_name).await? {
            let arn = lb.load_balancer_arn().unwrap_or_default().to_owned();
            for l in self.listeners(&arn).await? {
                for a in l.default_actions() {
                    if let Some(tg) = a.target_group_arn() {
                        target_groups.insert(tg.to_owned());
                    }
                }
            }
            match clients
                .elb
                .describe_target_groups()
                .load_balancer_arn(&arn)
                .send()
                .await
            {
                Ok(out) => target_groups.extend(
                    out.target_groups()
                        .iter()
                        .filter_map(|t| t.target_group_arn().map(str::to_owned)),
                ),
                // moto answers TargetGroupNotFound where AWS answers an empty list.
                Err(e) if error_code(&e) == Some("TargetGroupNotFound") => {}
                Err(e) => return Err(aws_error("elasticloadbalancing:DescribeTargetGroups", e)),
            }
            match clients
                .elb
                .delete_load_balancer()
                .load_balancer_arn(&arn)
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("LoadBalancerNotFound") => {}
                Err(e) => return Err(aws_error("elasticloadbalancing:DeleteLoadBalancer", e)),
            }
        }
        // Target groups of the current ports, even if a failed ensure never attached them.
        if let Ok(plan) = plan::plan(service) {
            for port in &plan.ports {
                let name = plan::target_group_name(&cluster_id, service, port, &plan.health);
                if let Some(tg) = self.find_target_group(&name).await?
                    && let Some(arn) = tg.target_group_arn()
                {
                    target_groups.insert(arn.to_owned());
                }
            }
        }
        for tg in &target_groups {
            self.delete_target_group(tg).await?;
        }
        self.sync_node_rules(lb_name, &BTreeSet::new(), &[]).await?;
        // A Classic ELB that cloud-provider-aws made for this Service goes too: no leak.
        self.delete_classic(lb_name).await?;
        self.delete_lb_security_group(lb_name).await
    }

    /// Deletes the load balancer's own security group, if this cluster owns it, retrying while
    /// AWS still sees it in use.
    async fn delete_lb_security_group(&self, lb_name: &str) -> CloudResult<()> {
        let name = plan::security_group_name(lb_name);
        let Some(group) = self.find_security_group(&name).await? else {
            return Ok(());
        };
        let key = self.cluster_tag_key("load balancers")?;
        let owned = group
            .tags()
            .iter()
            .any(|t| t.key() == Some(key.as_str()) && t.value() == Some("owned"));
        if !owned {
            tracing::warn!(group = %name, "not deleting a security group this cluster does not own");
            return Ok(());
        }
        let clients = self.clients().await?;
        let id = group.group_id().unwrap_or_default();
        let deadline = tokio::time::Instant::now() + self.options.security_group_delete_timeout;
        loop {
            match clients
                .ec2
                .delete_security_group()
                .group_id(id)
                .send()
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if error_code(&e) == Some("InvalidGroup.NotFound") => return Ok(()),
                Err(e) if error_code(&e) == Some("DependencyViolation") => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(CloudError::retry_after(
                            std::time::Duration::from_secs(30),
                            format!(
                                "security group {id} ({name}) is still in use after the load \
                                 balancer was deleted; will retry"
                            ),
                        ));
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                }
                Err(e) => return Err(aws_error("ec2:DeleteSecurityGroup", e)),
            }
        }
    }
}

fn status_of(lb: &Elb) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: lb.dns_name().map(|dns| {
            vec![LoadBalancerIngress {
                hostname: Some(dns.to_owned()),
                ..Default::default()
            }]
        }),
    }
}

impl AwsCloud {
    /// The instance IDs registered in the target groups of the Service's load balancer.
    pub async fn registered_targets(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<BTreeSet<String>> {
        let inner = &self.inner;
        let name = self.get_load_balancer_name(cluster_name, service);
        let lb = inner
            .find_lb(&name)
            .await?
            .ok_or_else(|| CloudError::message(format!("no load balancer {name}")))?;
        let mut out = BTreeSet::new();
        let listeners = inner
            .listeners(lb.load_balancer_arn().unwrap_or_default())
            .await?;
        let mut seen: HashMap<String, ()> = HashMap::new();
        for l in listeners {
            for a in l.default_actions() {
                if let Some(tg) = a.target_group_arn()
                    && seen.insert(tg.to_owned(), ()).is_none()
                {
                    out.extend(inner.registered(tg).await?);
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl LoadBalancer for AwsCloud {
    #[tracing::instrument(skip_all, fields(service = %service_key(service)))]
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<Option<LoadBalancerStatus>> {
        // Also for the AWS Load Balancer Controller's Services: an NLB we made before the
        // Service changed hands is still found (and deleted), as upstream does.
        let name = self.get_load_balancer_name(cluster_name, service);
        if let Some(lb) = self.inner.find_lb(&name).await? {
            return Ok(Some(status_of(&lb)));
        }
        // A Classic ELB left by cloud-provider-aws exists too, and delete removes it.
        Ok(self
            .inner
            .find_classic(&name)
            .await?
            .map(|clb| LoadBalancerStatus {
                ingress: clb.dns_name().map(|dns| {
                    vec![LoadBalancerIngress {
                        hostname: Some(dns.to_owned()),
                        ..Default::default()
                    }]
                }),
            }))
    }

    #[tracing::instrument(skip_all, fields(service = %service_key(service), nodes = nodes.len()))]
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<LoadBalancerStatus> {
        let name = self.get_load_balancer_name(cluster_name, service);
        self.inner.ensure_nlb(&name, service, nodes).await
    }

    #[tracing::instrument(skip_all, fields(service = %service_key(service), nodes = nodes.len()))]
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Arc<Node>],
    ) -> CloudResult<()> {
        let name = self.get_load_balancer_name(cluster_name, service);
        self.inner
            .ensure_nlb(&name, service, nodes)
            .await
            .map(|_| ())
    }

    #[tracing::instrument(skip_all, fields(service = %service_key(service)))]
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> CloudResult<()> {
        let name = self.get_load_balancer_name(cluster_name, service);
        self.inner.delete_nlb(&name, service).await
    }

    /// The NLBs tagged `kubernetes.io/cluster/<id>=owned`, with the Service their
    /// `kubernetes.io/service-name` tag names.
    async fn list_load_balancers(
        &self,
        _cluster_name: &str,
    ) -> CloudResult<Vec<ClusterLoadBalancer>> {
        self.inner.list_owned_lbs().await
    }

    #[tracing::instrument(skip_all, fields(load_balancer = %load_balancer.name))]
    async fn ensure_listed_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        load_balancer: &ClusterLoadBalancer,
    ) -> CloudResult<()> {
        self.inner.delete_listed_lb(load_balancer).await
    }
}
