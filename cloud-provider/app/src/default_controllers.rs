//! The four shared controllers, wired to the flags: [`default_registry`] is what a vendor's
//! `main` passes to [`run`](crate::run()) unless it adds or removes controllers.

use crate::controllers::{
    ControllerContext, MaintenanceConfig, OrphanedLbConfig,
    cloud_node_lifecycle::{CloudNodeLifecycleConfig, CloudNodeLifecycleController},
    node::{CloudNodeConfig, CloudNodeController},
    route::{RouteConfig, RouteController},
    service::{ServiceConfig, ServiceController},
};
use crate::{
    options::CloudControllerManagerOptions,
    run::{ControllerFuture, ControllerRegistry},
};
use cloud_provider::BoxError;

/// The canonical name of the cloud-node controller.
pub const CLOUD_NODE_CONTROLLER: &str = "cloud-node-controller";
/// The canonical name of the cloud-node-lifecycle controller.
pub const CLOUD_NODE_LIFECYCLE_CONTROLLER: &str = "cloud-node-lifecycle-controller";
/// The canonical name of the route controller.
pub const ROUTE_CONTROLLER: &str = "node-route-controller";
/// The canonical name of the service controller.
pub const SERVICE_CONTROLLER: &str = "service-lb-controller";

/// Every shared controller, in upstream's start order.
pub fn default_registry() -> ControllerRegistry {
    ControllerRegistry::new()
        .with(CLOUD_NODE_CONTROLLER, start_cloud_node)
        .with(CLOUD_NODE_LIFECYCLE_CONTROLLER, start_cloud_node_lifecycle)
        .with(SERVICE_CONTROLLER, start_service)
        .with(ROUTE_CONTROLLER, start_route)
}

fn start_cloud_node(
    ctx: ControllerContext,
    options: &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError> {
    let config = CloudNodeConfig::default()
        .with_node_status_update_frequency(options.node_status_update_frequency.value)
        .with_concurrent_node_syncs(usize::try_from(options.concurrent_node_syncs).unwrap_or(0))
        .with_batch(options.batch_instance_metadata)
        .with_concurrent_node_status_updates(
            usize::try_from(options.concurrent_node_status_updates).unwrap_or(0),
        );
    Ok(CloudNodeController::new(ctx, config)?.map(|c| {
        Box::pin(async move {
            c.run().await;
            Ok(())
        }) as ControllerFuture
    }))
}

fn start_cloud_node_lifecycle(
    ctx: ControllerContext,
    options: &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError> {
    let config = CloudNodeLifecycleConfig::default()
        .with_node_monitor_period(options.node_monitor_period.value)
        .with_delete_grace_period(options.node_deletion_grace_period.value)
        .with_out_of_service_after(
            Some(options.node_out_of_service_after.value).filter(|d| !d.is_zero()),
        )
        .with_maintenance({
            let period = options.node_maintenance_period.value;
            (!period.is_zero())
                .then(|| MaintenanceConfig::new(period, options.node_maintenance_taint))
        });
    Ok(CloudNodeLifecycleController::new(ctx, config)?.map(|c| {
        Box::pin(async move {
            c.run().await;
            Ok(())
        }) as ControllerFuture
    }))
}

fn start_route(
    ctx: ControllerContext,
    options: &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError> {
    if !options.configure_cloud_routes || ctx.cloud.routes().is_none() {
        return Ok(None);
    }
    // Upstream: an empty or invalid --cluster-cidr is fatal once routes are configured.
    let cidrs = options.cluster_cidrs().map_err(BoxError::from)?;
    let config = RouteConfig::new(cidrs)
        .with_reconcile_period(options.route_reconciliation_period.value)
        .with_watch_based(options.watch_based_routes_enabled());
    Ok(RouteController::new(ctx, config)?.map(|c| {
        Box::pin(async move {
            c.run().await;
            Ok(())
        }) as ControllerFuture
    }))
}

/// `--orphaned-lb-gc-*`, or `None` when the period is 0.
fn orphaned_lb_gc(options: &CloudControllerManagerOptions) -> Option<OrphanedLbConfig> {
    let period = options.orphaned_lb_gc_period.value;
    (!period.is_zero()).then(|| {
        OrphanedLbConfig::new(
            period,
            options.orphaned_lb_gc_grace_period.value,
            options.orphaned_lb_gc_dry_run,
        )
    })
}

fn start_service(
    ctx: ControllerContext,
    options: &CloudControllerManagerOptions,
) -> Result<Option<ControllerFuture>, BoxError> {
    let drift = options.lb_drift_reensure_period.value;
    let config = ServiceConfig::default()
        .with_concurrent_service_syncs(
            usize::try_from(options.concurrent_service_syncs).unwrap_or(0),
        )
        .with_concurrent_lb_host_updates(
            usize::try_from(options.concurrent_lb_host_updates).unwrap_or(0),
        )
        .with_lb_drift_reensure_period((!drift.is_zero()).then_some(drift))
        .with_orphaned_lb_gc(orphaned_lb_gc(options));
    Ok(ServiceController::new(ctx, config)?.map(|c| {
        Box::pin(async move {
            c.run().await;
            Ok(())
        }) as ControllerFuture
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_controller_is_registered_under_its_canonical_name() {
        let names = default_registry().names();
        assert_eq!(
            names,
            [
                CLOUD_NODE_CONTROLLER,
                CLOUD_NODE_LIFECYCLE_CONTROLLER,
                SERVICE_CONTROLLER,
                ROUTE_CONTROLLER
            ]
        );
        // Upstream's controller aliases (`cloud-node-controller` for `cloud-node`, ...) resolve
        // to these names.
        for alias in ["cloud-node", "cloud-node-lifecycle", "service", "route"] {
            let canonical = crate::options::canonical_controller_name(alias);
            assert!(names.contains(&canonical), "{alias} -> {canonical}");
        }
    }
}
