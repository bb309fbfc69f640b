//! Graceful node shutdown's pod groups, as kubelet's shutdown manager forms them
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager.go`: `migrateConfig`, `groupByPriority`).
//!
//! With `shutdownGracePeriodByPodPriority` each group is a priority threshold with its own
//! grace period: a pod belongs to the group of the highest threshold not above its
//! priority (pods below every threshold go to the lowest group), and groups are stopped
//! from the lowest priority up, each within its own period. Without it the legacy pair
//! `shutdownGracePeriod`/`shutdownGracePeriodCriticalPods` is migrated to two groups:
//! priority 0 with `shutdownGracePeriod - shutdownGracePeriodCriticalPods`, and
//! `SystemCriticalPriority` (2000000000) with `shutdownGracePeriodCriticalPods`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::SimConfig;

/// Priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One entry of `shutdownGracePeriodByPodPriority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownPriorityGroup {
    /// The lowest pod priority of the group.
    pub priority: i32,
    /// How long the group's pods are given to stop.
    pub grace_period: Duration,
}

/// The groups of a shutdown, lowest priority first (`migrateConfig` for the legacy pair).
/// Empty when graceful shutdown is off.
pub fn shutdown_groups(config: &SimConfig) -> Vec<ShutdownPriorityGroup> {
    if !config.shutdown_grace_period_by_pod_priority.is_empty() {
        let mut groups = config.shutdown_grace_period_by_pod_priority.clone();
        groups.sort_by_key(|g| g.priority);
        return groups;
    }
    if config.shutdown_grace_period.is_zero() {
        return Vec::new();
    }
    let critical = config
        .shutdown_grace_period_critical_pods
        .min(config.shutdown_grace_period);
    vec![
        ShutdownPriorityGroup {
            priority: 0,
            grace_period: config.shutdown_grace_period - critical,
        },
        ShutdownPriorityGroup {
            priority: SYSTEM_CRITICAL_PRIORITY,
            grace_period: critical,
        },
    ]
}

/// A pod's priority: that of the system priority class it names (upstream's Priority
/// admission resolves the class into `spec.priority`; here `spec.priority` may be left at
/// its default 0), else `spec.priority`, else 0.
pub fn pod_priority(pod: &Pod) -> i32 {
    let spec = pod.spec.as_ref();
    match spec.and_then(|s| s.priority_class_name.as_deref()) {
        Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
        Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
        _ => spec.and_then(|s| s.priority).unwrap_or(0),
    }
}

/// `groupByPriority`: the pods of each group, in the order of `groups`.
pub fn group_by_priority(groups: &[ShutdownPriorityGroup], pods: Vec<Pod>) -> Vec<Vec<Pod>> {
    let mut out = vec![Vec::new(); groups.len()];
    if groups.is_empty() {
        return out;
    }
    for pod in pods {
        let p = pod_priority(&pod);
        let i = groups.iter().rposition(|g| g.priority <= p).unwrap_or(0);
        out[i].push(pod);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, priority: Option<i32>, class: Option<&str>) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"priority": priority, "priorityClassName": class, "containers": []}}))
        .unwrap()
    }

    fn names(groups: &[Vec<Pod>]) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| g.iter().map(|p| p.metadata.name.clone().unwrap()).collect())
            .collect()
    }

    /// `migrateConfig`: the legacy pair becomes a regular group (priority 0, the period
    /// less the critical part) and a critical one (SystemCriticalPriority).
    #[test]
    fn legacy_grace_periods_migrate_to_two_priority_groups() {
        let config = SimConfig {
            shutdown_grace_period: Duration::from_secs(30),
            shutdown_grace_period_critical_pods: Duration::from_secs(10),
            ..SimConfig::default()
        };
        let groups = shutdown_groups(&config);
        assert_eq!(
            groups,
            [
                ShutdownPriorityGroup {
                    priority: 0,
                    grace_period: Duration::from_secs(20)
                },
                ShutdownPriorityGroup {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    grace_period: Duration::from_secs(10)
                },
            ]
        );
        let pods = vec![
            pod("node-critical", Some(0), Some("system-node-critical")),
            pod("regular", None, None),
            pod("negative", Some(-5), None),
        ];
        assert_eq!(
            names(&group_by_priority(&groups, pods)),
            [vec!["regular", "negative"], vec!["node-critical"]]
        );
        assert!(
            shutdown_groups(&SimConfig::default()).is_empty(),
            "off by default"
        );
    }

    /// `groupByPriority`: a pod goes to the group of the highest priority not above its
    /// own; pods below every group go to the lowest.
    #[test]
    fn pods_join_the_highest_group_not_above_their_priority() {
        let g = |priority, secs| ShutdownPriorityGroup {
            priority,
            grace_period: Duration::from_secs(secs),
        };
        let config = SimConfig {
            shutdown_grace_period_by_pod_priority: vec![g(100000, 120), g(10000, 60), g(1000, 30)],
            ..SimConfig::default()
        };
        let groups = shutdown_groups(&config);
        assert_eq!(groups, [g(1000, 30), g(10000, 60), g(100000, 120)]);
        let pods = vec![
            pod("low", Some(0), None),
            pod("mid", Some(10000), None),
            pod("just-below-top", Some(99999), None),
            pod("top", Some(2_000_000_000), None),
        ];
        assert_eq!(
            names(&group_by_priority(&groups, pods)),
            [vec!["low"], vec!["mid", "just-below-top"], vec!["top"]]
        );
    }
}
