//! The Warning Events of upstream's Service range repair loops
//! (`pkg/registry/core/service/ipallocator/controller/repair.go` and
//! `portallocator/controller/repair.go` `runOnce`): a ClusterIP or NodePort held by more
//! than one Service (`ClusterIPAlreadyAllocated`, `PortAlreadyAllocated`, on each Service
//! after the first that holds it, in list order), outside the configured ranges
//! (`ClusterIPOutOfRange`, `PortOutOfRange`), or held but not marked in its range
//! (`ClusterIPNotAllocated`, `PortNotAllocated`, marked by the repair), recorded on the
//! Service as `ipallocator-repair-controller` / `portallocator-repair-controller`. The same
//! finding in a later pass counts up the Event it made, as client-go's recorder aggregates.

use std::collections::HashSet;

use serde_json::{Value, json};

use super::{
    MAX_WRITE_ATTEMPTS, ObjectKey, Storage, WriteContext, create::create_object,
    get_list::get_object, update::commit_update,
};
use crate::registry::{
    ResourceDef,
    allocator::{Item, RepairOutcome, service_items},
    meta::{now_micro, now_rfc3339, str_at},
};

/// One finding of a repair pass on one Service.
#[derive(Debug, PartialEq, Eq)]
struct Finding {
    reason: &'static str,
    message: String,
    controller: &'static str,
    action: &'static str,
}

fn family(ip: std::net::IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn finding(item: Item, kind: Kind) -> Finding {
    match item {
        Item::Ip(ip) => {
            let (reason, message) = match kind {
                Kind::Duplicate => (
                    "ClusterIPAlreadyAllocated",
                    format!(
                        "Cluster IP [{}]:{ip} was assigned to multiple services; please recreate service",
                        family(ip)
                    ),
                ),
                Kind::OutOfRange => (
                    "ClusterIPOutOfRange",
                    format!(
                        "Cluster IP [{}]:{ip} is not within the configured Service CIDR; please recreate service",
                        family(ip)
                    ),
                ),
                Kind::Missing => (
                    "ClusterIPNotAllocated",
                    format!(
                        "Cluster IP [{}]:{ip} is not allocated; repairing",
                        family(ip)
                    ),
                ),
            };
            Finding {
                reason,
                message,
                controller: "ipallocator-repair-controller",
                action: "ClusterIPAllocation",
            }
        }
        Item::Port(port) => {
            let (reason, message) = match kind {
                Kind::Duplicate => (
                    "PortAlreadyAllocated",
                    format!(
                        "Port {port} was assigned to multiple services; please recreate service"
                    ),
                ),
                Kind::OutOfRange => (
                    "PortOutOfRange",
                    format!("Port {port} is not within the port range; please recreate service"),
                ),
                Kind::Missing => (
                    "PortNotAllocated",
                    format!("Port {port} is not allocated; repairing"),
                ),
            };
            Finding {
                reason,
                message,
                controller: "portallocator-repair-controller",
                action: "PortAllocation",
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Duplicate,
    OutOfRange,
    Missing,
}

/// Which Service each finding of `outcome` is recorded on, walking `services` in order as
/// the repair did.
fn findings<'s>(outcome: &RepairOutcome, services: &'s [Value]) -> Vec<(&'s Value, Finding)> {
    let duplicates: HashSet<Item> = outcome.duplicates.iter().copied().collect();
    let out_of_range: HashSet<Item> = outcome.out_of_range.iter().copied().collect();
    let mut missing: HashSet<Item> = outcome.missing.iter().copied().collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for service in services {
        for item in service_items(service) {
            if out_of_range.contains(&item) {
                out.push((service, finding(item, Kind::OutOfRange)));
            } else if !seen.insert(item) {
                if duplicates.contains(&item) {
                    out.push((service, finding(item, Kind::Duplicate)));
                }
            } else if missing.remove(&item) {
                out.push((service, finding(item, Kind::Missing)));
            }
        }
    }
    out
}

/// FNV-1a, 64 bits: a stable name for the Event of one finding.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Records the Events of one repair pass's `outcome` (see the [module docs](self)).
pub(crate) async fn record(
    storage: &Storage,
    services: &'static ResourceDef,
    outcome: &RepairOutcome,
) {
    if outcome.duplicates.is_empty()
        && outcome.out_of_range.is_empty()
        && outcome.missing.is_empty()
    {
        return;
    }
    let Some(events) = storage.registry.find("", "v1", "events") else {
        return;
    };
    let Ok(listed) = storage.reader().list(services, None).await else {
        return;
    };
    for (service, finding) in findings(outcome, &listed) {
        if let Err(e) = record_one(storage, events, service, &finding).await {
            tracing::warn!(reason = finding.reason, error = %e, "recording a repair Event failed");
        }
    }
}

async fn record_one(
    storage: &Storage,
    events: &'static ResourceDef,
    service: &Value,
    finding: &Finding,
) -> Result<(), super::status::ApiError> {
    let ns = str_at(service, &["metadata", "namespace"]).unwrap_or("default");
    let name = str_at(service, &["metadata", "name"]).unwrap_or("");
    let uid = str_at(service, &["metadata", "uid"]).unwrap_or("");
    // One Event per Service and finding, counted up by later passes.
    let digest = fnv1a64(format!("{uid}/{}/{}", finding.reason, finding.message).as_bytes());
    let event_name = format!("{name}.{digest:016x}");
    let now = now_rfc3339();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name, "namespace": ns},
        "involvedObject": {
            "apiVersion": "v1", "kind": "Service", "namespace": ns, "name": name, "uid": uid,
            "resourceVersion": service["metadata"]["resourceVersion"],
        },
        "reason": finding.reason,
        "message": finding.message,
        "type": "Warning",
        "action": finding.action,
        "source": {"component": finding.controller},
        "reportingComponent": finding.controller,
        // client-go's events recorder names the instance after the controller (and its
        // host); `legacyValidateEvent` requires one on an event with an eventTime.
        "reportingInstance": finding.controller,
        "eventTime": now_micro(),
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    });
    let ctx = WriteContext::server();
    match create_object(storage, &ctx, events, Some(ns), event).await {
        Err(e) if e.reason == "AlreadyExists" => {}
        other => return other.map(|_| ()),
    }
    for _ in 0..MAX_WRITE_ATTEMPTS {
        let (kv, current) = get_object(&*storage.store, events, Some(ns), &event_name).await?;
        let mut counted = current.clone();
        counted["count"] = json!(current["count"].as_i64().unwrap_or(1) + 1);
        counted["lastTimestamp"] = json!(now);
        let key = ObjectKey::new(events, Some(ns), &event_name);
        match commit_update(storage, &ctx, key, None, &kv, &current, counted).await {
            Err(e) if e.reason == "Conflict" => continue,
            other => return other.map(|_| ()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::allocator::ServiceAllocator;

    fn service(name: &str, ip: &str, node_port: Option<u16>) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "uid": name},
               "spec": {"clusterIPs": [ip],
                        "ports": [{"port": 80, "nodePort": node_port}]}})
    }

    /// `repair.go`: the Service that finds its IP or port already marked gets
    /// `…AlreadyAllocated`, the first holder nothing; one outside the ranges
    /// `…OutOfRange`; one whose item was not marked `…NotAllocated`.
    #[test]
    fn each_finding_is_recorded_on_the_service_the_repair_found_it_on() {
        let allocator = ServiceAllocator::new(vec!["10.96.0.0/24".parse().unwrap()], 30000..=30010);
        let services = vec![
            service("first", "10.96.0.10", Some(30001)),
            service("second", "10.96.0.10", Some(30001)),
            service("outside", "192.168.0.1", None),
        ];
        let mut stored = allocator.clone();
        stored.mark(Item::Ip("10.96.0.10".parse().unwrap()));
        let outcome = crate::registry::allocator::Repair::default().run(&stored, &services);
        let found: Vec<(&str, &str)> = findings(&outcome, &services)
            .iter()
            .map(|(s, f)| (s["metadata"]["name"].as_str().unwrap(), f.reason))
            .collect();
        assert_eq!(
            found,
            [
                ("first", "PortNotAllocated"),
                ("second", "ClusterIPAlreadyAllocated"),
                ("second", "PortAlreadyAllocated"),
                ("outside", "ClusterIPOutOfRange"),
            ]
        );
    }
}
