//! Listing this cluster's load balancers by their tags, so the service controller can collect
//! those whose Service is gone (beyond upstream). Only NLBs tagged
//! `kubernetes.io/cluster/<id>=owned` with a `kubernetes.io/service-name` tag are listed, and
//! only those are ever deleted: a load balancer this cluster merely shares, or one without the
//! tags, is never touched.

use aws_sdk_elasticloadbalancingv2::types::TagDescription;
use cloud_provider::{CloudResult, ClusterLoadBalancer};
use k8s_openapi::api::core::v1::Service;

use super::SERVICE_NAME_TAG;
use crate::{Inner, client::aws_error};

/// ARNs per DescribeTags call (the ELBv2 limit).
const ARNS_PER_DESCRIBE_TAGS: usize = 20;

impl Inner {
    /// The `namespace/name` a tag description says its load balancer serves, when it carries
    /// this cluster's `owned` tag.
    fn owned_service(&self, description: &TagDescription, cluster_key: &str) -> Option<String> {
        let tags = description.tags();
        let owned = tags
            .iter()
            .any(|t| t.key() == Some(cluster_key) && t.value() == Some("owned"));
        let service = tags
            .iter()
            .find(|t| t.key() == Some(SERVICE_NAME_TAG))
            .and_then(|t| t.value());
        owned.then_some(service).flatten().map(str::to_owned)
    }

    /// Every NLB this cluster owns, with the Service its tag names.
    pub(crate) async fn list_owned_lbs(&self) -> CloudResult<Vec<ClusterLoadBalancer>> {
        let clients = self.clients().await?;
        let cluster_key = self.cluster_tag_key("load balancers")?;
        let mut pages = clients
            .elb
            .describe_load_balancers()
            .into_paginator()
            .send();
        let mut lbs: Vec<(String, String)> = Vec::new();
        while let Some(page) = pages.next().await {
            let page =
                page.map_err(|e| aws_error("elasticloadbalancing:DescribeLoadBalancers", e))?;
            lbs.extend(page.load_balancers().iter().filter_map(|lb| {
                Some((
                    lb.load_balancer_arn()?.to_owned(),
                    lb.load_balancer_name()?.to_owned(),
                ))
            }));
        }
        let mut owned = Vec::new();
        for chunk in lbs.chunks(ARNS_PER_DESCRIBE_TAGS) {
            let out = clients
                .elb
                .describe_tags()
                .set_resource_arns(Some(chunk.iter().map(|(arn, _)| arn.clone()).collect()))
                .send()
                .await
                .map_err(|e| aws_error("elasticloadbalancing:DescribeTags", e))?;
            for description in out.tag_descriptions() {
                let Some(service) = self.owned_service(description, &cluster_key) else {
                    continue;
                };
                let Some((_, name)) = chunk
                    .iter()
                    .find(|(arn, _)| Some(arn.as_str()) == description.resource_arn())
                else {
                    continue;
                };
                let (namespace, service) = service.split_once('/').unwrap_or(("", &service));
                owned.push(ClusterLoadBalancer::new(name.clone(), namespace, service));
            }
        }
        Ok(owned)
    }

    /// Deletes a listed NLB (with its target groups, node rules and security group) if this
    /// cluster still owns it; one that is gone, or not owned, is left alone.
    pub(crate) async fn delete_listed_lb(&self, lb: &ClusterLoadBalancer) -> CloudResult<()> {
        let Some(found) = self.find_lb(&lb.name).await? else {
            return Ok(());
        };
        let clients = self.clients().await?;
        let cluster_key = self.cluster_tag_key("load balancers")?;
        let out = clients
            .elb
            .describe_tags()
            .resource_arns(found.load_balancer_arn().unwrap_or_default())
            .send()
            .await
            .map_err(|e| aws_error("elasticloadbalancing:DescribeTags", e))?;
        let owned = out
            .tag_descriptions()
            .iter()
            .any(|d| self.owned_service(d, &cluster_key).is_some());
        if !owned {
            tracing::warn!(load_balancer = %lb.name, "not deleting a load balancer this cluster does not own");
            return Ok(());
        }
        // The Service is gone: a stub names it; the listeners find the target groups.
        let mut service = Service::default();
        service.metadata.namespace = Some(lb.service_namespace.clone());
        service.metadata.name = Some(lb.service_name.clone());
        self.delete_nlb(&lb.name, &service).await
    }
}
