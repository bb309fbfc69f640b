//! Routes in the cluster's VPC route table, one per pod CIDR, to the Node's instance.

use async_trait::async_trait;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState, RouteTable};
use cloud_provider::{CloudError, CloudResult, Route, Routes};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::{AwsCloud, Inner, client::aws_error, ids};

impl Inner {
    /// The cluster's route table: `RouteTableID`, else the one table carrying the cluster tag.
    pub(crate) async fn route_table(&self) -> CloudResult<RouteTable> {
        let clients = self.clients().await?;
        let mut req = clients.ec2.describe_route_tables();
        let what = match &self.config.route_table_id {
            Some(id) => {
                req = req.route_table_ids(id);
                format!("route table {id} (RouteTableID)")
            }
            None => {
                let key = self.cluster_tag_key("finding the route table")?;
                req = req.filters(Filter::builder().name("tag-key").values(&key).build());
                format!("a route table tagged {key}")
            }
        };
        let mut tables: Vec<RouteTable> = Vec::new();
        let mut pages = req.into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| aws_error("ec2:DescribeRouteTables", e))?;
            tables.extend(
                page.route_tables()
                    .iter()
                    .filter(|t| {
                        self.config.route_table_id.is_some() || self.has_cluster_tag(t.tags())
                    })
                    .cloned(),
            );
        }
        match tables.len() {
            1 => Ok(tables.remove(0)),
            0 => Err(CloudError::message(format!("unable to find {what}"))),
            n => Err(CloudError::message(format!(
                "found {n} route tables for the cluster, expected exactly one ({}); set RouteTableID \
                 or tag only one table",
                tables
                    .iter()
                    .filter_map(|t| t.route_table_id())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    async fn resolve_target(self: &std::sync::Arc<Self>, node_name: &str) -> CloudResult<String> {
        let mut node = Node::default();
        node.metadata.name = Some(node_name.to_owned());
        match self.instance_for_node(&node).await? {
            Some(i) => i
                .instance_id()
                .map(str::to_owned)
                .ok_or_else(|| CloudError::message("EC2 returned an instance without an ID")),
            None => Err(CloudError::context(
                format!("route target node {node_name}"),
                CloudError::InstanceNotFound,
            )),
        }
    }
}

fn route_cidr(route: &aws_sdk_ec2::types::Route) -> Option<IpNet> {
    route
        .destination_cidr_block()
        .or(route.destination_ipv6_cidr_block())
        .and_then(|c| c.parse().ok())
}

/// A route to an instance as (CIDR, instance ID, blackhole); `None` for routes that are not to
/// an instance (gateways, the local route). A route is a blackhole when AWS says so, or when its
/// instance is gone (terminated or unknown; moto never sets the state).
fn instance_route(
    route: &aws_sdk_ec2::types::Route,
    alive: impl Fn(&str) -> bool,
) -> Option<(IpNet, String, bool)> {
    let cidr = route_cidr(route)?;
    let id = route.instance_id()?;
    let blackhole = route.state() == Some(&RouteState::Blackhole) || !alive(id);
    Some((cidr, id.to_owned(), blackhole))
}

#[async_trait]
impl Routes for AwsCloud {
    #[tracing::instrument(skip_all)]
    async fn list_routes(&self, cluster_name: &str) -> CloudResult<Vec<Route>> {
        let inner = &self.inner;
        let table = inner.route_table().await?;
        let instance_ids: Vec<String> = table
            .routes()
            .iter()
            .filter_map(|r| r.instance_id().map(str::to_owned))
            .collect();
        let instances = inner.cached_instances(&instance_ids).await?;
        let index = inner.cluster_node_names().await?;
        let mut out = Vec::new();
        for r in table.routes() {
            let alive = |id: &str| {
                instances
                    .get(id)
                    .is_some_and(|i| ids::lifecycle(i) != ids::Lifecycle::Gone)
            };
            let Some((cidr, id, blackhole)) = instance_route(r, alive) else {
                continue;
            };
            let target = if blackhole {
                String::new()
            } else {
                inner.node_name_of(&id, instances.get(&id), index.as_ref())
            };
            out.push(
                Route::new(target, cidr)
                    .with_name(format!("{cluster_name}-{cidr}"))
                    .with_blackhole(blackhole),
            );
        }
        Ok(out)
    }

    #[tracing::instrument(skip_all, fields(cidr = %route.destination_cidr, node = %route.target_node))]
    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> CloudResult<()> {
        let inner = &self.inner;
        let clients = inner.clients().await?;
        let instance_id = inner.resolve_target(&route.target_node).await?;
        clients
            .ec2
            .modify_instance_attribute()
            .instance_id(&instance_id)
            .source_dest_check(AttributeBooleanValue::builder().value(false).build())
            .send()
            .await
            .map_err(|e| aws_error("ec2:ModifyInstanceAttribute", e))?;
        let table = inner.route_table().await?;
        let table_id = table.route_table_id().unwrap_or_default().to_owned();
        let cidr = route.destination_cidr;
        if let Some(existing) = table.routes().iter().find(|r| route_cidr(r) == Some(cidr)) {
            if existing.instance_id() == Some(instance_id.as_str())
                && existing.state() != Some(&RouteState::Blackhole)
            {
                return Ok(());
            }
            // An old route for this CIDR (a blackhole, or to another instance) goes first.
            tracing::info!(table = %table_id, %cidr, "deleting the old route for this CIDR");
            let mut del = clients.ec2.delete_route().route_table_id(&table_id);
            del = if cidr.addr().is_ipv6() {
                del.destination_ipv6_cidr_block(cidr.to_string())
            } else {
                del.destination_cidr_block(cidr.to_string())
            };
            del.send()
                .await
                .map_err(|e| aws_error("ec2:DeleteRoute", e))?;
        }
        let mut req = clients
            .ec2
            .create_route()
            .route_table_id(&table_id)
            .instance_id(&instance_id);
        req = if cidr.addr().is_ipv6() {
            req.destination_ipv6_cidr_block(cidr.to_string())
        } else {
            req.destination_cidr_block(cidr.to_string())
        };
        req.send()
            .await
            .map_err(|e| aws_error("ec2:CreateRoute", e))?;
        Ok(())
    }

    #[tracing::instrument(skip_all, fields(cidr = %route.destination_cidr))]
    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> CloudResult<()> {
        let inner = &self.inner;
        let clients = inner.clients().await?;
        let table = inner.route_table().await?;
        let cidr = route.destination_cidr;
        if !table.routes().iter().any(|r| route_cidr(r) == Some(cidr)) {
            return Ok(());
        }
        let mut del = clients
            .ec2
            .delete_route()
            .route_table_id(table.route_table_id().unwrap_or_default());
        del = if cidr.addr().is_ipv6() {
            del.destination_ipv6_cidr_block(cidr.to_string())
        } else {
            del.destination_cidr_block(cidr.to_string())
        };
        match del.send().await {
            Ok(_) => Ok(()),
            Err(e) if crate::client::error_code(&e) == Some("InvalidRoute.NotFound") => Ok(()),
            Err(e) => Err(aws_error("ec2:DeleteRoute", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_ec2::types::Route as Ec2Route;

    use super::*;

    #[test]
    fn blackholes_and_foreign_routes() {
        let to = |id: &str, state: RouteState| {
            Ec2Route::builder()
                .destination_cidr_block("10.244.1.0/24")
                .instance_id(id)
                .state(state)
                .build()
        };
        let cidr: IpNet = "10.244.1.0/24".parse().unwrap();
        let alive = |id: &str| id == "i-1";
        assert_eq!(
            instance_route(&to("i-1", RouteState::Active), alive),
            Some((cidr, "i-1".to_owned(), false))
        );
        // AWS's blackhole state, even if the instance still shows up.
        assert_eq!(
            instance_route(&to("i-1", RouteState::Blackhole), alive),
            Some((cidr, "i-1".to_owned(), true))
        );
        // An instance that is gone.
        assert_eq!(
            instance_route(&to("i-2", RouteState::Active), alive),
            Some((cidr, "i-2".to_owned(), true))
        );
        let gateway = Ec2Route::builder()
            .destination_cidr_block("0.0.0.0/0")
            .gateway_id("igw-1")
            .build();
        assert_eq!(instance_route(&gateway, alive), None);
        let v6 = Ec2Route::builder()
            .destination_ipv6_cidr_block("fd00::/64")
            .instance_id("i-1")
            .build();
        assert_eq!(
            instance_route(&v6, alive).map(|r| r.0),
            Some("fd00::/64".parse().unwrap())
        );
    }
}
