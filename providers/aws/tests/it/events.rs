//! Scheduled instance events from EC2 DescribeInstanceStatus, against a loopback fake EC2,
//! since moto answers DescribeInstanceStatus without any events. The fake pages its answer
//! and records what each call asked for.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::ensure;
use cloud_provider::{CloudProvider, ScheduledEventKind};
use cloud_provider_aws::{AwsCloud, AwsOptions};
use parking_lot::Mutex;

use crate::common;

const NS: &str = "xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"";

/// One `<item>` of `instanceStatusSet`: an instance in `zone` with `events`
/// (`(code, description, notBefore, notAfter)`).
fn status(id: &str, zone: &str, events: &[(&str, &str, &str, &str)]) -> String {
    let events: String = events
        .iter()
        .map(|(code, description, not_before, not_after)| {
            format!(
                "<item><instanceEventId>instance-event-{code}</instanceEventId>\
                 <code>{code}</code><description>{description}</description>\
                 <notBefore>{not_before}</notBefore><notAfter>{not_after}</notAfter></item>"
            )
        })
        .collect();
    format!(
        "<item><instanceId>{id}</instanceId><availabilityZone>{zone}</availabilityZone>\
         <eventsSet>{events}</eventsSet><instanceState><code>16</code><name>running</name>\
         </instanceState></item>"
    )
}

/// EC2's scheduled events (maintenance, reboot, retirement) reach the cloud-node-lifecycle
/// controller's `MaintenancePlanned` pass as [`cloud_provider::ScheduledEvent`]s keyed by the
/// provider ID the Node carries; events EC2 still lists as `[Completed]` or `[Canceled]` are
/// left out, every page is read, and the call asks only for event codes, stopped instances
/// included (EC2 API `DescribeInstanceStatus`, `IncludeAllInstances`, filter `event.code`).
#[tokio::test]
async fn describe_instance_status_events_become_scheduled_events() -> anyhow::Result<()> {
    let calls: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = calls.clone();
    let endpoint = common::serve(Arc::new(move |body: &str| {
        seen.lock().push(body.to_owned());
        let second_page = body.contains("NextToken=page-2");
        let (items, next) = if second_page {
            (
                status(
                    "i-0000000000000000c",
                    "us-east-1b",
                    &[(
                        "instance-retirement",
                        "The instance is running on degraded hardware",
                        "2030-01-03T00:00:00.000Z",
                        "2030-01-04T00:00:00.000Z",
                    )],
                ),
                String::new(),
            )
        } else {
            (
                status(
                    "i-0000000000000000a",
                    "us-east-1a",
                    &[
                        (
                            "system-maintenance",
                            "Scheduled host maintenance",
                            "2030-01-01T00:00:00.000Z",
                            "2030-01-01T06:00:00.000Z",
                        ),
                        (
                            "system-reboot",
                            "[Completed] The instance is scheduled for a reboot",
                            "2020-01-01T00:00:00.000Z",
                            "2020-01-01T06:00:00.000Z",
                        ),
                    ],
                ) + &status(
                    "i-0000000000000000b",
                    "us-east-1a",
                    &[(
                        "instance-reboot",
                        "[Canceled] The instance is scheduled for a reboot",
                        "2030-01-02T00:00:00.000Z",
                        "2030-01-02T06:00:00.000Z",
                    )],
                ),
                "<nextToken>page-2</nextToken>".to_owned(),
            )
        };
        (
            200,
            format!(
                "<DescribeInstanceStatusResponse {NS}><requestId>r</requestId>\
                 <instanceStatusSet>{items}</instanceStatusSet>{next}\
                 </DescribeInstanceStatusResponse>"
            ),
        )
    }))
    .await?;
    let options = AwsOptions::default()
        .with_static_credentials("testing", "testing")
        .with_max_attempts(1);
    let cloud = AwsCloud::from_config_text_with(&common::config(&endpoint, ""), options)?;
    let events = cloud
        .instances_v2()
        .expect("instances")
        .scheduled_events()
        .await?;

    let at = |secs: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
    ensure!(events.len() == 2, "two live events: {events:?}");
    let maintenance = &events[0];
    ensure!(maintenance.provider_id == "aws:///us-east-1a/i-0000000000000000a");
    ensure!(maintenance.kind == ScheduledEventKind::Maintenance);
    ensure!(maintenance.description == "Scheduled host maintenance");
    // 2030-01-01T00:00:00Z and six hours later.
    ensure!(maintenance.not_before == at(1_893_456_000));
    ensure!(maintenance.not_after == Some(at(1_893_456_000 + 6 * 3600)));
    let retirement = &events[1];
    ensure!(retirement.provider_id == "aws:///us-east-1b/i-0000000000000000c");
    ensure!(retirement.kind == ScheduledEventKind::Retirement);

    let calls = calls.lock();
    ensure!(calls.len() == 2, "one call per page: {calls:?}");
    for call in calls.iter() {
        ensure!(call.contains("Action=DescribeInstanceStatus"), "{call}");
        ensure!(call.contains("IncludeAllInstances=true"), "{call}");
        ensure!(call.contains("Filter.1.Name=event.code"), "{call}");
        ensure!(call.contains("Filter.1.Value.1=instance-reboot"), "{call}");
    }
    Ok(())
}

/// A throttled DescribeInstanceStatus is a throttling error for the shared limiter, not an
/// empty list that would clear every Node's `MaintenancePlanned` condition.
#[tokio::test]
async fn a_throttled_event_listing_is_an_error_not_an_empty_list() -> anyhow::Result<()> {
    let endpoint = common::serve(Arc::new(|_: &str| {
        (
            503,
            "<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>slow down\
             </Message></Error></Errors><RequestID>r</RequestID></Response>"
                .to_owned(),
        )
    }))
    .await?;
    let options = AwsOptions::default()
        .with_static_credentials("testing", "testing")
        .with_max_attempts(1);
    let cloud = AwsCloud::from_config_text_with(&common::config(&endpoint, ""), options)?;
    let err = cloud
        .instances_v2()
        .expect("instances")
        .scheduled_events()
        .await
        .expect_err("throttled");
    ensure!(err.is_throttled(), "{err}");
    ensure!(err.to_string().contains("DescribeInstanceStatus"), "{err}");
    Ok(())
}
