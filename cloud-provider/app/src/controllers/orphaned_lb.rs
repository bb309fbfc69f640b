//! Beyond upstream: collection of leaked load balancers. Upstream deletes a load balancer only
//! when it sees its Service change or go (the finalizer path); one whose Service disappeared
//! while the ccm was down, or whose finalizer was removed by hand, stays in the cloud and is
//! billed forever.
//!
//! Every period the collector asks the provider for the load balancers it made for this
//! cluster ([`LoadBalancer::list_load_balancers`]) and lists the Services. A load balancer is
//! orphaned when its Service is gone, no longer wants a load balancer (and holds no cleanup
//! finalizer, which the service controller's own path honours), or was recreated (a new UID,
//! so another load balancer name). One that stays orphaned for the grace period is deleted
//! ([`LoadBalancer::ensure_listed_load_balancer_deleted`]), or only reported in dry-run mode.
//! Nothing is deleted on a failed list of either side, nor when the cluster lists no Service
//! at all while the cloud holds load balancers (an empty answer is more likely a wrong
//! cluster or a broken cache than a cluster whose every Service went at once).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use cloud_provider::helpers::service::{has_load_balancer_finalizer, wants_load_balancer};
use cloud_provider::{ClusterLoadBalancer, LoadBalancer};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{CloudPriority, ControllerContext};

/// How leaked load balancers are collected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OrphanedLbConfig {
    /// How often to look (`--orphaned-lb-gc-period`).
    pub period: Duration,
    /// How long a load balancer must stay orphaned before it is deleted
    /// (`--orphaned-lb-gc-grace-period`).
    pub grace: Duration,
    /// Only report what would be deleted (`--orphaned-lb-gc-dry-run`).
    pub dry_run: bool,
}

impl OrphanedLbConfig {
    /// Look every `period`, delete after `grace`, for real unless `dry_run`.
    pub fn new(period: Duration, grace: Duration, dry_run: bool) -> Self {
        OrphanedLbConfig {
            period,
            grace,
            dry_run,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PassReport {
    /// Load balancers the provider listed.
    pub listed: usize,
    /// Orphaned ones still inside their grace period.
    pub waiting: Vec<String>,
    /// Deleted (or, in dry-run mode, that would have been).
    pub deleted: Vec<String>,
    /// Why the pass deleted nothing, when it was skipped.
    pub skipped: Option<&'static str>,
}

/// The collector's memory: when each orphaned load balancer was first seen orphaned.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    first_seen: Mutex<HashMap<String, Instant>>,
}

/// Why `lb` is orphaned, or `None` when its Service still owns it.
fn orphaned_because(
    lb: &ClusterLoadBalancer,
    services: &HashMap<(String, String), Service>,
    cloud: &dyn LoadBalancer,
    cluster_name: &str,
) -> Option<&'static str> {
    let key = (lb.service_namespace.clone(), lb.service_name.clone());
    let Some(svc) = services.get(&key) else {
        return Some("its Service is gone");
    };
    if svc.metadata.deletion_timestamp.is_some() || has_load_balancer_finalizer(svc) {
        // The service controller's cleanup path owns it.
        return None;
    }
    if !wants_load_balancer(svc) {
        return Some("its Service no longer wants a load balancer");
    }
    if cloud.get_load_balancer_name(cluster_name, svc) != lb.name {
        return Some("its Service was recreated and has another load balancer");
    }
    None
}

impl Collector {
    /// One pass: list, find the orphaned, delete those past their grace period.
    pub(crate) async fn pass(
        &self,
        ctx: &ControllerContext,
        cloud: &dyn LoadBalancer,
        config: &OrphanedLbConfig,
    ) -> PassReport {
        let mut report = PassReport::default();
        let cluster = ctx.cluster_name.as_str();
        let listed = match ctx
            .cloud_limiter
            .call(CloudPriority::Status, cloud.list_load_balancers(cluster))
            .await
        {
            Ok(listed) => listed,
            Err(err) if err.is_not_implemented() => {
                report.skipped = Some("the provider cannot list its load balancers");
                return report;
            }
            Err(err) => {
                tracing::warn!(%err, "orphaned load balancers: listing the cloud's failed; deleting nothing");
                report.skipped = Some("listing the cloud's load balancers failed");
                return report;
            }
        };
        report.listed = listed.len();
        if listed.is_empty() {
            self.first_seen.lock().clear();
            return report;
        }
        let api: Api<Service> = Api::all(ctx.client.clone());
        let services = match api.list(&Default::default()).await {
            Ok(list) => list.items,
            Err(err) => {
                tracing::warn!(%err, "orphaned load balancers: listing Services failed; deleting nothing");
                report.skipped = Some("listing Services failed");
                return report;
            }
        };
        if services.is_empty() {
            tracing::warn!(
                load_balancers = listed.len(),
                "orphaned load balancers: the cluster lists no Service at all; deleting nothing"
            );
            report.skipped = Some("the cluster lists no Service");
            return report;
        }
        let services: HashMap<(String, String), Service> = services
            .into_iter()
            .map(|s| {
                let key = (
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default(),
                );
                (key, s)
            })
            .collect();
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut first_seen = self.first_seen.lock();
            let mut orphaned = HashSet::new();
            for lb in &listed {
                let Some(reason) = orphaned_because(lb, &services, cloud, cluster) else {
                    continue;
                };
                orphaned.insert(lb.name.clone());
                let since = *first_seen.entry(lb.name.clone()).or_insert(now);
                if now.saturating_duration_since(since) >= config.grace {
                    due.push((lb, reason));
                } else {
                    report.waiting.push(lb.name.clone());
                }
            }
            first_seen.retain(|name, _| orphaned.contains(name));
        }
        for (lb, reason) in due {
            let service = format!("{}/{}", lb.service_namespace, lb.service_name);
            if config.dry_run {
                tracing::info!(load_balancer = %lb.name, %service, reason, "orphaned load balancer (dry run: not deleted)");
                report.deleted.push(lb.name.clone());
                continue;
            }
            let deleted = ctx
                .cloud_limiter
                .call(
                    CloudPriority::LoadBalancer,
                    cloud.ensure_listed_load_balancer_deleted(cluster, lb),
                )
                .await;
            match deleted {
                Ok(()) => {
                    tracing::info!(load_balancer = %lb.name, %service, reason, "deleted orphaned load balancer");
                    self.first_seen.lock().remove(&lb.name);
                    report.deleted.push(lb.name.clone());
                }
                Err(err) => {
                    tracing::warn!(load_balancer = %lb.name, %service, %err, "could not delete orphaned load balancer");
                }
            }
        }
        report
    }

    /// Passes every `config.period` until the provider says it cannot list.
    pub(crate) async fn run(
        &self,
        ctx: &ControllerContext,
        cloud: &dyn LoadBalancer,
        config: OrphanedLbConfig,
    ) {
        let mut tick = tokio::time::interval_at(Instant::now() + config.period, config.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let report = self.pass(ctx, cloud, &config).await;
            if report.skipped == Some("the provider cannot list its load balancers") {
                tracing::warn!(
                    "the cloud provider cannot list its load balancers; orphaned load-balancer collection stops"
                );
                return std::future::pending().await;
            }
        }
    }
}
