//! `/configz`: the component configuration as JSON, as upstream registers
//! `CloudControllerManagerConfiguration` under the name `cloudcontrollermanager`. Upstream
//! marshals its internal configuration type, whose fields have no JSON tags: the keys are
//! Go's field names (`KubeCloudShared`, `ConcurrentServiceSyncs`…) and durations are Go
//! duration strings (`5m0s`). Served behind authorization (it is not an always-allowed path).

use std::time::Duration;

use serde_json::{Value, json};

use crate::options::{CloudControllerManagerOptions, GoDuration};

/// The name `/configz` lists the configuration under.
pub(crate) const CONFIGZ_NAME: &str = "cloudcontrollermanager";

/// Formats a duration as Go's `time.Duration.String()`: `0s`, `1.5s`, `300ms`, `5m0s`,
/// `12h0m0s`.
pub(crate) fn go_duration_string(duration: Duration) -> String {
    if duration.is_zero() {
        return "0s".to_owned();
    }
    if duration < Duration::from_secs(1) {
        let nanos = duration.as_nanos();
        return if nanos.is_multiple_of(1_000_000) {
            format!("{}ms", nanos / 1_000_000)
        } else if nanos.is_multiple_of(1_000) {
            format!("{}µs", nanos / 1_000)
        } else {
            format!("{nanos}ns")
        };
    }
    let total = duration.as_secs();
    let (hours, minutes, seconds) = (total / 3600, (total % 3600) / 60, total % 60);
    let nanos = duration.subsec_nanos();
    let mut secs = seconds.to_string();
    if nanos != 0 {
        let fraction = format!("{nanos:09}");
        secs.push('.');
        secs.push_str(fraction.trim_end_matches('0'));
    }
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

fn d(value: GoDuration) -> Value {
    let text = go_duration_string(value.value);
    Value::String(if value.negative && !value.value.is_zero() {
        format!("-{text}")
    } else {
        text
    })
}

/// The component configuration `options` make, in upstream's shape.
pub(crate) fn component_config(options: &CloudControllerManagerOptions) -> Value {
    let o = options;
    json!({
        CONFIGZ_NAME: {
            "Generic": {
                "Port": o.secure_port,
                "Address": o.bind_address.to_string(),
                "MinResyncPeriod": d(o.min_resync_period),
                "ClientConnection": {
                    "Kubeconfig": o.kubeconfig.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                    "AcceptContentTypes": "",
                    "ContentType": o.kube_api_content_type,
                    "QPS": o.kube_api_qps,
                    "Burst": o.kube_api_burst,
                },
                "ControllerStartInterval": d(o.controller_start_interval),
                "LeaderElection": {
                    "LeaderElect": o.leader_elect,
                    "LeaseDuration": d(o.leader_elect_lease_duration),
                    "RenewDeadline": d(o.leader_elect_renew_deadline),
                    "RetryPeriod": d(o.leader_elect_retry_period),
                    "ResourceLock": o.leader_elect_resource_lock,
                    "ResourceName": o.leader_elect_resource_name,
                    "ResourceNamespace": o.leader_elect_resource_namespace,
                },
                "Controllers": o.controllers,
            },
            "KubeCloudShared": {
                "CloudProvider": {
                    "Name": o.cloud_provider,
                    "CloudConfigFile": o.cloud_config.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                },
                "ExternalCloudVolumePlugin": "",
                "UseServiceAccountCredentials": o.use_service_account_credentials,
                "AllowUntaggedCloud": o.allow_untagged_cloud,
                "RouteReconciliationPeriod": d(o.route_reconciliation_period),
                "NodeMonitorPeriod": d(o.node_monitor_period),
                "ClusterName": o.cluster_name,
                "ClusterCIDR": o.cluster_cidr,
                "AllocateNodeCIDRs": o.allocate_node_cidrs,
                "CIDRAllocatorType": o.accepted.cidr_allocator_type.clone().unwrap_or_else(|| "RangeAllocator".into()),
                "ConfigureCloudRoutes": o.configure_cloud_routes,
                "NodeSyncPeriod": "0s",
            },
            "ServiceController": {
                "ConcurrentServiceSyncs": o.concurrent_service_syncs,
            },
            "NodeController": {
                "ConcurrentNodeSyncs": o.concurrent_node_syncs,
                "ConcurrentNodeStatusUpdates": o.concurrent_node_status_updates,
            },
            "NodeStatusUpdateFrequency": d(o.node_status_update_frequency),
            "Webhook": {
                "Webhooks": o.accepted.webhooks.as_deref().map(|w| w.split(',').map(str::to_owned).collect::<Vec<_>>()).unwrap_or_default(),
            },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_as_go() {
        assert_eq!(go_duration_string(Duration::ZERO), "0s");
        assert_eq!(go_duration_string(Duration::from_secs(10)), "10s");
        assert_eq!(go_duration_string(Duration::from_secs(300)), "5m0s");
        assert_eq!(
            go_duration_string(Duration::from_secs(12 * 3600)),
            "12h0m0s"
        );
        assert_eq!(go_duration_string(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration_string(Duration::from_millis(300)), "300ms");
        assert_eq!(go_duration_string(Duration::from_secs(3725)), "1h2m5s");
    }

    /// Upstream's `/configz` shape: `{"cloudcontrollermanager": {...}}` with Go field names.
    #[test]
    fn configz_has_upstream_shape() {
        let options = CloudControllerManagerOptions::try_parse_from([
            "ccm",
            "--cloud-provider=fake",
            "--kube-api-qps=50",
            "--concurrent-service-syncs=3",
        ])
        .unwrap();
        let config = component_config(&options);
        let c = &config[CONFIGZ_NAME];
        assert_eq!(c["Generic"]["ClientConnection"]["QPS"], 50.0);
        assert_eq!(c["Generic"]["ClientConnection"]["Burst"], 30);
        assert_eq!(c["Generic"]["MinResyncPeriod"], "12h0m0s");
        assert_eq!(c["Generic"]["LeaderElection"]["LeaseDuration"], "15s");
        assert_eq!(c["KubeCloudShared"]["CloudProvider"]["Name"], "fake");
        assert_eq!(c["ServiceController"]["ConcurrentServiceSyncs"], 3);
        assert_eq!(c["NodeStatusUpdateFrequency"], "5m0s");
    }
}
