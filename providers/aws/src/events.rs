//! Scheduled instance events (beyond upstream cloud-provider-aws, which does not read them):
//! EC2 `DescribeInstanceStatus` events become [`ScheduledEvent`]s, which the
//! cloud-node-lifecycle controller turns into the Node's `MaintenancePlanned` condition.

use std::time::SystemTime;

use aws_sdk_ec2::types::{EventCode, Filter, InstanceStatus, InstanceStatusEvent};
use cloud_provider::{CloudResult, ScheduledEvent, ScheduledEventKind};

use crate::{Inner, client::aws_error, ids};

/// The event codes asked for: every code EC2 schedules for an instance.
const EVENT_CODES: [&str; 5] = [
    "instance-reboot",
    "system-reboot",
    "system-maintenance",
    "instance-retirement",
    "instance-stop",
];

/// Statuses per DescribeInstanceStatus page (AWS allows 1,000).
const STATUSES_PER_CALL: i32 = 1000;

/// The kind of an EC2 event code: reboots (of the instance or its host) are `Reboot`,
/// `system-maintenance` is `Maintenance`, `instance-retirement` and `instance-stop` (the stop
/// that retires an EBS-backed instance) are `Retirement`.
fn kind_of(code: &EventCode) -> ScheduledEventKind {
    match code {
        EventCode::InstanceReboot | EventCode::SystemReboot => ScheduledEventKind::Reboot,
        EventCode::SystemMaintenance => ScheduledEventKind::Maintenance,
        EventCode::InstanceRetirement | EventCode::InstanceStop => ScheduledEventKind::Retirement,
        other => ScheduledEventKind::Other(other.as_str().to_owned()),
    }
}

/// Whether EC2 still lists an event that is over: it keeps completed and canceled events for a
/// while, with `[Completed]` or `[Canceled]` before the description.
fn is_over(event: &InstanceStatusEvent) -> bool {
    let description = event.description().unwrap_or_default();
    description.starts_with("[Completed]") || description.starts_with("[Canceled]")
}

/// The events of one instance status, under the provider ID its Node carries
/// (`aws:///<az>/<instance-id>`).
fn events_of(status: &InstanceStatus) -> Vec<ScheduledEvent> {
    let Some(id) = status.instance_id() else {
        return Vec::new();
    };
    let provider_id = ids::provider_id(status.availability_zone().unwrap_or_default(), id);
    status
        .events()
        .iter()
        .filter(|e| !is_over(e))
        .filter_map(|e| {
            let code = e.code()?;
            let not_before = e
                .not_before()
                .and_then(|t| SystemTime::try_from(*t).ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let mut event = ScheduledEvent::new(provider_id.clone(), kind_of(code), not_before)
                .with_description(e.description().unwrap_or(code.as_str()));
            if let Some(end) = e.not_after().and_then(|t| SystemTime::try_from(*t).ok()) {
                event = event.until(end);
            }
            Some(event)
        })
        .collect()
}

impl Inner {
    /// Every scheduled event in the region, from DescribeInstanceStatus filtered by event code
    /// (stopped instances included, since a retirement may be planned for one), paged. Events
    /// of instances outside the cluster match no Node, and the controller ignores them.
    pub(crate) async fn scheduled_events(&self) -> CloudResult<Vec<ScheduledEvent>> {
        let clients = self.clients().await?;
        let mut pages = clients
            .ec2
            .describe_instance_status()
            .include_all_instances(true)
            .filters(
                Filter::builder()
                    .name("event.code")
                    .set_values(Some(EVENT_CODES.iter().map(|c| c.to_string()).collect()))
                    .build(),
            )
            .max_results(STATUSES_PER_CALL)
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| aws_error("ec2:DescribeInstanceStatus", e))?;
            out.extend(page.instance_statuses().iter().flat_map(events_of));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_codes_map_to_kinds() {
        assert_eq!(
            kind_of(&EventCode::SystemMaintenance),
            ScheduledEventKind::Maintenance
        );
        assert_eq!(
            kind_of(&EventCode::InstanceReboot),
            ScheduledEventKind::Reboot
        );
        assert_eq!(
            kind_of(&EventCode::SystemReboot),
            ScheduledEventKind::Reboot
        );
        assert_eq!(
            kind_of(&EventCode::InstanceStop),
            ScheduledEventKind::Retirement
        );
        assert_eq!(
            kind_of(&EventCode::from("host-move")),
            ScheduledEventKind::Other("host-move".to_owned())
        );
    }

    #[test]
    fn completed_and_canceled_events_are_left_out() {
        let status = InstanceStatus::builder()
            .instance_id("i-0abc")
            .availability_zone("us-east-1a")
            .events(
                InstanceStatusEvent::builder()
                    .code(EventCode::SystemReboot)
                    .description("[Completed] The instance is scheduled for a reboot")
                    .build(),
            )
            .events(
                InstanceStatusEvent::builder()
                    .code(EventCode::InstanceRetirement)
                    .description("[Canceled] The instance is running on degraded hardware")
                    .build(),
            )
            .events(
                InstanceStatusEvent::builder()
                    .code(EventCode::SystemMaintenance)
                    .description("Host maintenance")
                    .not_before(aws_sdk_ec2::primitives::DateTime::from_secs(1_000))
                    .not_after(aws_sdk_ec2::primitives::DateTime::from_secs(2_000))
                    .build(),
            )
            .build();
        let events = events_of(&status);
        assert_eq!(events.len(), 1, "{events:?}");
        let e = &events[0];
        assert_eq!(e.provider_id, "aws:///us-east-1a/i-0abc");
        assert_eq!(e.kind, ScheduledEventKind::Maintenance);
        assert_eq!(
            e.not_before,
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000)
        );
        assert_eq!(
            e.not_after,
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(2_000))
        );
        assert_eq!(e.description, "Host maintenance");
    }
}
