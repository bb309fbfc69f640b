//! Security-group ingress rules for Network Load Balancers: which group of a node gets them
//! (upstream's `findSecurityGroupForInstance`), which rules (clients, health checks, path-MTU
//! discovery) and their reconciliation by description.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{Filter, Instance, IpPermission, IpRange, Ipv6Range, SecurityGroup};
use cloud_provider::{CloudError, CloudResult};

use super::{
    SERVICE_NAME_TAG,
    plan::{HealthPort, NlbPlan, PortPlan},
};
use crate::{
    Inner,
    client::{aws_error, error_code},
};

/// A security-group ingress rule, as compared when reconciling.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rule {
    pub(crate) protocol: String,
    /// The port, or the ICMP type.
    pub(crate) from: i32,
    /// The port, or the ICMP code.
    pub(crate) to: i32,
    /// An IPv4 or IPv6 CIDR.
    pub(crate) cidr: String,
    pub(crate) description: String,
}

impl Rule {
    fn is_v6(&self) -> bool {
        self.cidr.contains(':')
    }
}

/// The description of the client rules of `lb_name` (upstream's).
pub(crate) fn client_description(lb_name: &str) -> String {
    format!("kubernetes.io/rule/nlb/client={lb_name}")
}

/// The description of the health-check rules of `lb_name` (upstream's).
pub(crate) fn health_description(lb_name: &str) -> String {
    format!("kubernetes.io/rule/nlb/health={lb_name}")
}

/// The description of the path-MTU discovery rules of `lb_name` (upstream's).
pub(crate) fn mtu_description(lb_name: &str) -> String {
    format!("kubernetes.io/rule/nlb/mtu={lb_name}")
}

/// Every description this provider puts on node rules for `lb_name`.
pub(crate) fn node_descriptions(lb_name: &str) -> [String; 3] {
    [
        client_description(lb_name),
        health_description(lb_name),
        mtu_description(lb_name),
    ]
}

/// The rules of `group` that carry one of `descriptions`.
pub(crate) fn rules_of(group: &SecurityGroup, descriptions: &[String]) -> BTreeSet<Rule> {
    let mut out = BTreeSet::new();
    for perm in group.ip_permissions() {
        let protocol = perm.ip_protocol().unwrap_or_default().to_owned();
        let mut add = |cidr: Option<&str>, desc: Option<&str>| {
            let desc = desc.unwrap_or_default();
            if descriptions.iter().any(|d| d == desc) {
                out.insert(Rule {
                    protocol: protocol.clone(),
                    from: perm.from_port().unwrap_or(-1),
                    to: perm.to_port().unwrap_or(-1),
                    cidr: cidr.unwrap_or_default().to_owned(),
                    description: desc.to_owned(),
                });
            }
        };
        for range in perm.ip_ranges() {
            add(range.cidr_ip(), range.description());
        }
        for range in perm.ipv6_ranges() {
            add(range.cidr_ipv6(), range.description());
        }
    }
    out
}

/// The EC2 permissions for `rules`, one per rule.
pub(crate) fn permissions(rules: &BTreeSet<Rule>) -> Vec<IpPermission> {
    rules
        .iter()
        .map(|r| {
            let perm = IpPermission::builder()
                .ip_protocol(&r.protocol)
                .from_port(r.from)
                .to_port(r.to);
            if r.is_v6() {
                perm.ipv6_ranges(
                    Ipv6Range::builder()
                        .cidr_ipv6(&r.cidr)
                        .description(&r.description)
                        .build(),
                )
            } else {
                perm.ip_ranges(
                    IpRange::builder()
                        .cidr_ip(&r.cidr)
                        .description(&r.description)
                        .build(),
                )
            }
            .build()
        })
        .collect()
}

/// The rules every node security group of `lb_name` needs, as upstream's
/// `updateInstanceSecurityGroupsForNLB`: per NodePort and client CIDR a client rule; per
/// health-check port and load-balancer subnet CIDR a health rule (unless a client rule from
/// `0.0.0.0/0` already covers it); per client CIDR an ICMP "fragmentation needed" rule
/// (type 3 code 4; ICMPv6 "packet too big", type 2 code 0) so path-MTU discovery works.
pub(crate) fn node_rules(lb_name: &str, plan: &NlbPlan, subnet_cidrs: &[String]) -> BTreeSet<Rule> {
    let mut want = client_rules(lb_name, plan, |p| p.node_port);
    let health = health_description(lb_name);
    let health_ports: BTreeSet<i32> = plan
        .ports
        .iter()
        .map(|p| match plan.health.port {
            HealthPort::Traffic => p.node_port,
            HealthPort::Port(port) => port,
        })
        .collect();
    for port in health_ports {
        let covered = want
            .iter()
            .any(|r| r.protocol == "tcp" && r.from == port && r.cidr == "0.0.0.0/0");
        if covered {
            continue;
        }
        for cidr in subnet_cidrs {
            want.insert(Rule {
                protocol: "tcp".to_owned(),
                from: port,
                to: port,
                cidr: cidr.clone(),
                description: health.clone(),
            });
        }
    }
    want.extend(mtu_rules(lb_name, plan));
    want
}

/// The rules of a load balancer's own security group (`NLBSecurityGroupMode = Managed`): per
/// listener port and client CIDR a client rule, and the path-MTU discovery rules.
pub(crate) fn frontend_rules(lb_name: &str, plan: &NlbPlan) -> BTreeSet<Rule> {
    let mut want = client_rules(lb_name, plan, |p| p.port);
    want.extend(mtu_rules(lb_name, plan));
    want
}

/// A client rule per port (`port_of` picks the listener or the node port), protocol and client
/// CIDR.
fn client_rules(
    lb_name: &str,
    plan: &NlbPlan,
    port_of: impl Fn(&PortPlan) -> i32,
) -> BTreeSet<Rule> {
    let client = client_description(lb_name);
    let mut want = BTreeSet::new();
    for p in &plan.ports {
        for proto in p.protocol.ip_protocols() {
            for cidr in &plan.source_ranges {
                want.insert(Rule {
                    protocol: (*proto).to_owned(),
                    from: port_of(p),
                    to: port_of(p),
                    cidr: cidr.to_string(),
                    description: client.clone(),
                });
            }
        }
    }
    want
}

/// Per client CIDR an ICMP "fragmentation needed" rule (type 3 code 4), or for IPv6 ICMPv6
/// "packet too big" (type 2 code 0).
fn mtu_rules<'a>(lb_name: &str, plan: &'a NlbPlan) -> impl Iterator<Item = Rule> + 'a {
    let mtu = mtu_description(lb_name);
    plan.source_ranges.iter().map(move |cidr| {
        let (protocol, from, to) = match cidr {
            ipnet::IpNet::V4(_) => ("icmp", 3, 4),
            ipnet::IpNet::V6(_) => ("icmpv6", 2, 0),
        };
        Rule {
            protocol: protocol.to_owned(),
            from,
            to,
            cidr: cidr.to_string(),
            description: mtu.clone(),
        }
    })
}

/// The security group of `instance` that gets a load balancer's rules (upstream's
/// `findSecurityGroupForInstance`): the one of its groups tagged for the cluster; if none is
/// tagged, its single untagged one. Several tagged (or, with none tagged, several untagged)
/// groups are an error naming them; an instance without groups has none.
pub(crate) fn instance_security_group(
    instance: &Instance,
    tagged: &BTreeSet<String>,
) -> CloudResult<Option<String>> {
    let id = instance.instance_id().unwrap_or_default();
    let groups: Vec<&str> = instance
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id())
        .filter(|g| !g.is_empty())
        .collect();
    let (with_tag, without): (Vec<&str>, Vec<&str>) =
        groups.iter().partition(|g| tagged.contains(**g));
    match (with_tag.as_slice(), without.as_slice()) {
        ([one], _) => Ok(Some((*one).to_owned())),
        ([], [one]) => Ok(Some((*one).to_owned())),
        ([], []) => {
            tracing::warn!(instance = %id, "no security group found for the instance");
            Ok(None)
        }
        ([], many) => Err(CloudError::message(format!(
            "multiple untagged security groups found for instance {id} ({}); ensure the k8s \
             security group is tagged with the cluster tag",
            many.join(", ")
        ))),
        (many, _) => Err(CloudError::message(format!(
            "multiple tagged security groups found for instance {id} ({}); ensure only the k8s \
             security group is tagged",
            many.join(", ")
        ))),
    }
}

impl Inner {
    /// The VPC's security groups, by ID.
    async fn vpc_security_groups(&self) -> CloudResult<BTreeMap<String, SecurityGroup>> {
        let clients = self.clients().await?;
        let vpc = self.vpc_id().await?;
        let mut out = BTreeMap::new();
        let mut pages = clients
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| aws_error("ec2:DescribeSecurityGroups", e))?;
            for g in page.security_groups() {
                if let Some(id) = g.group_id() {
                    out.insert(id.to_owned(), g.clone());
                }
            }
        }
        Ok(out)
    }

    /// Revokes every ingress rule in the VPC whose source is the security group `group_id`
    /// (upstream's Classic ELB rule on the nodes: all traffic from the load balancer's group).
    pub(crate) async fn revoke_references_to(&self, group_id: &str) -> CloudResult<()> {
        let clients = self.clients().await?;
        for (id, group) in self.vpc_security_groups().await? {
            let refs: Vec<IpPermission> = group
                .ip_permissions()
                .iter()
                .filter(|p| {
                    p.user_id_group_pairs()
                        .iter()
                        .any(|g| g.group_id() == Some(group_id))
                })
                .map(|p| {
                    let mut perm = p.clone();
                    perm.ip_ranges = None;
                    perm.ipv6_ranges = None;
                    perm.prefix_list_ids = None;
                    perm.user_id_group_pairs = Some(
                        p.user_id_group_pairs()
                            .iter()
                            .filter(|g| g.group_id() == Some(group_id))
                            .cloned()
                            .collect(),
                    );
                    perm
                })
                .collect();
            if refs.is_empty() {
                continue;
            }
            match clients
                .ec2
                .revoke_security_group_ingress()
                .group_id(&id)
                .set_ip_permissions(Some(refs))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("InvalidPermission.NotFound") => {}
                Err(e) => return Err(aws_error("ec2:RevokeSecurityGroupIngress", e)),
            }
        }
        Ok(())
    }

    /// Grants the missing rules and revokes the extra ones carrying one of `descriptions`.
    pub(crate) async fn reconcile_rules(
        &self,
        group: &SecurityGroup,
        want: &BTreeSet<Rule>,
        descriptions: &[String],
    ) -> CloudResult<()> {
        let clients = self.clients().await?;
        let group_id = group.group_id().unwrap_or_default();
        let have = rules_of(group, descriptions);
        let missing: BTreeSet<Rule> = want.difference(&have).cloned().collect();
        let extra: BTreeSet<Rule> = have.difference(want).cloned().collect();
        if !extra.is_empty() {
            match clients
                .ec2
                .revoke_security_group_ingress()
                .group_id(group_id)
                .set_ip_permissions(Some(permissions(&extra)))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("InvalidPermission.NotFound") => {}
                Err(e) => return Err(aws_error("ec2:RevokeSecurityGroupIngress", e)),
            }
        }
        if !missing.is_empty() {
            match clients
                .ec2
                .authorize_security_group_ingress()
                .group_id(group_id)
                .set_ip_permissions(Some(permissions(&missing)))
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("InvalidPermission.Duplicate") => {}
                Err(e) => return Err(aws_error("ec2:AuthorizeSecurityGroupIngress", e)),
            }
        }
        Ok(())
    }

    /// Puts `lb_name`'s rules on the security group of each target instance (see
    /// [`instance_security_group`]), and takes them off every other group of the VPC that
    /// carries them (a node that left, a group that lost its tag). With `instances` empty,
    /// every rule of `lb_name` goes.
    pub(crate) async fn sync_node_rules(
        &self,
        lb_name: &str,
        want: &BTreeSet<Rule>,
        instances: &[&Instance],
    ) -> CloudResult<()> {
        if self.config.disable_security_group_ingress {
            return Ok(());
        }
        // Every group but the load balancers' own (whose client rules share the descriptions).
        let groups: BTreeMap<String, SecurityGroup> = self
            .vpc_security_groups()
            .await?
            .into_iter()
            .filter(|(_, g)| !g.tags().iter().any(|t| t.key() == Some(SERVICE_NAME_TAG)))
            .filter(|(id, _)| Some(id.as_str()) != self.config.elb_security_group.as_deref())
            .collect();
        // The cluster's node groups: cluster-tagged.
        let tagged: BTreeSet<String> = groups
            .iter()
            .filter(|(_, g)| self.has_cluster_tag(g.tags()))
            .map(|(id, _)| id.clone())
            .collect();
        let mut targets = BTreeSet::new();
        for instance in instances {
            if let Some(group) = instance_security_group(instance, &tagged)? {
                targets.insert(group);
            }
        }
        let descriptions = node_descriptions(lb_name);
        let empty = BTreeSet::new();
        for (id, group) in &groups {
            let rules = if targets.contains(id) { want } else { &empty };
            if rules.is_empty() && rules_of(group, &descriptions).is_empty() {
                continue;
            }
            self.reconcile_rules(group, rules, &descriptions).await?;
        }
        let missing: Vec<&String> = targets
            .iter()
            .filter(|t| !groups.contains_key(*t))
            .collect();
        if !missing.is_empty() {
            return Err(CloudError::message(format!(
                "security groups {missing:?} of the target instances are not in the VPC"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::GroupIdentifier;
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

    use super::*;

    fn instance(groups: &[&str]) -> Instance {
        Instance::builder()
            .instance_id("i-0abc")
            .set_security_groups(Some(
                groups
                    .iter()
                    .map(|g| GroupIdentifier::builder().group_id(*g).build())
                    .collect(),
            ))
            .build()
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    /// Upstream's `findSecurityGroupForInstance`: the tagged group wins; else
    /// the single untagged one; several tagged, or several untagged with none tagged, is an error.
    #[test]
    fn the_instance_group_is_the_tagged_one_else_the_single_untagged_one() {
        let tagged = set(&["sg-tagged", "sg-tagged2", "sg-elsewhere"]);
        assert_eq!(
            instance_security_group(&instance(&["sg-a", "sg-tagged"]), &tagged).unwrap(),
            Some("sg-tagged".to_owned())
        );
        assert_eq!(
            instance_security_group(&instance(&["sg-a"]), &tagged).unwrap(),
            Some("sg-a".to_owned())
        );
        assert_eq!(
            instance_security_group(&instance(&[]), &tagged).unwrap(),
            None
        );
        let err = instance_security_group(&instance(&["sg-a", "sg-b"]), &tagged).unwrap_err();
        assert!(
            err.to_string().contains("multiple untagged") && err.to_string().contains("sg-b"),
            "{err}"
        );
        let err =
            instance_security_group(&instance(&["sg-tagged", "sg-tagged2"]), &tagged).unwrap_err();
        assert!(
            err.to_string().contains("multiple tagged") && err.to_string().contains("i-0abc"),
            "{err}"
        );
    }

    #[test]
    fn nlb_node_rules_include_path_mtu_discovery() {
        let mut s = Service::default();
        s.metadata.name = Some("web".into());
        s.spec = Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_source_ranges: Some(vec![
                "203.0.113.0/24".into(),
                "2001:db8::/32".into(),
            ]),
            ports: Some(vec![ServicePort {
                port: 80,
                node_port: Some(30080),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let plan = super::super::plan::plan(&s).unwrap();
        let rules = node_rules("lb1", &plan, &["10.0.0.0/18".to_owned()]);
        let mtu: Vec<(&str, i32, i32, &str)> = rules
            .iter()
            .filter(|r| r.description == "kubernetes.io/rule/nlb/mtu=lb1")
            .map(|r| (r.protocol.as_str(), r.from, r.to, r.cidr.as_str()))
            .collect();
        assert_eq!(
            mtu,
            vec![
                ("icmp", 3, 4, "203.0.113.0/24"),
                ("icmpv6", 2, 0, "2001:db8::/32")
            ]
        );
        assert!(rules.iter().any(|r| r.protocol == "tcp"
            && r.from == 30080
            && r.cidr == "10.0.0.0/18"
            && r.description == "kubernetes.io/rule/nlb/health=lb1"));
        // IPv6 CIDRs go into Ipv6Ranges.
        let perms = permissions(&rules);
        assert!(perms.iter().any(|p| p.ipv6_ranges().len() == 1
            && p.ipv6_ranges()[0].cidr_ipv6() == Some("2001:db8::/32")));
    }
}
