//! Classic ELBs left by upstream's provider. A Service without `aws-load-balancer-type` gets a
//! Classic ELB from cloud-provider-aws, named like our NLB (`a` + the UID). After a migration
//! this provider must neither put a second load balancer beside it nor leak it: ensure refuses
//! with why (the service controller makes that a Warning event), get reports it, and delete
//! removes it (when it carries this cluster's tag) with its `k8s-elb-<name>` security group and
//! the node rules that refer to that group. Nothing here creates a Classic ELB.

use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription;
use cloud_provider::{CloudError, CloudResult};

use crate::{
    Inner,
    client::{aws_error, error_code},
};

impl Inner {
    /// The Classic ELB called `name`, if there is one.
    pub(crate) async fn find_classic(
        &self,
        name: &str,
    ) -> CloudResult<Option<LoadBalancerDescription>> {
        let clients = self.clients().await?;
        match clients
            .classic
            .describe_load_balancers()
            .load_balancer_names(name)
            .send()
            .await
        {
            Ok(out) => Ok(out.load_balancer_descriptions().first().cloned()),
            Err(e) if error_code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(aws_error(
                "elasticloadbalancing:DescribeLoadBalancers (classic)",
                e,
            )),
        }
    }

    /// The error for a Service whose Classic ELB exists: no second load balancer is made.
    pub(crate) fn classic_refusal(service: &str, clb: &LoadBalancerDescription) -> CloudError {
        CloudError::message(format!(
            "service {service}: Classic ELB {} ({}) already serves this Service (made by \
             cloud-provider-aws, whose default is a Classic ELB); this provider manages Network \
             Load Balancers only and will not create a second load balancer beside it. Deleting \
             the Service deletes the Classic ELB; to move to an NLB, delete the Classic ELB \
             (or recreate the Service)",
            clb.load_balancer_name().unwrap_or_default(),
            clb.dns_name().unwrap_or_default(),
        ))
    }

    /// Deletes the Classic ELB called `name` if this cluster's tag is on it, then the node
    /// rules that refer to its security group; the group itself goes with the load balancer's
    /// own ([`Inner::delete_lb_security_group`]). A Classic ELB without the tag is left alone.
    pub(crate) async fn delete_classic(&self, name: &str) -> CloudResult<()> {
        let Some(clb) = self.find_classic(name).await? else {
            return Ok(());
        };
        let clients = self.clients().await?;
        let tags = clients
            .classic
            .describe_tags()
            .load_balancer_names(name)
            .send()
            .await
            .map_err(|e| aws_error("elasticloadbalancing:DescribeTags (classic)", e))?;
        let tags: Vec<aws_sdk_ec2::types::Tag> = tags
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| {
                aws_sdk_ec2::types::Tag::builder()
                    .key(t.key())
                    .set_value(t.value().map(str::to_owned))
                    .build()
            })
            .collect();
        if self.config.cluster_id().is_none() || !self.has_cluster_tag(&tags) {
            tracing::warn!(load_balancer = %name, "not deleting a Classic ELB without this cluster's tag");
            return Ok(());
        }
        tracing::info!(load_balancer = %name, "deleting the Classic ELB cloud-provider-aws made");
        match clients
            .classic
            .delete_load_balancer()
            .load_balancer_name(name)
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if error_code(&e) == Some("LoadBalancerNotFound") => {}
            Err(e) => {
                return Err(aws_error(
                    "elasticloadbalancing:DeleteLoadBalancer (classic)",
                    e,
                ));
            }
        }
        for group in clb.security_groups() {
            self.revoke_references_to(group).await?;
        }
        Ok(())
    }
}
