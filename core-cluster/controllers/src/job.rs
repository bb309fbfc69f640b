//! The Job controller: runs a Job's pods to `completions` successes, `parallelism` at a
//! time, or fails it.
//!
//! # What upstream does (`pkg/controller/job/job_controller.go`, v1.33)
//!
//! - Pods come from the template, named `<job>-<random>`, with the Job's controllerRef; the
//!   selector and the `batch.kubernetes.io/controller-uid` / `job-name` labels are set by
//!   the API server on create.
//! - Active pods wanted (NonIndexed): `min(parallelism, completions - succeeded)`; without
//!   `completions`, `parallelism` until one pod succeeds.
//! - A failed pod is replaced after a backoff of 10 s doubling per failure up to 6 minutes
//!   (`DefaultJobPodFailureBackOff`, `MaxJobPodFailureBackOff`).
//! - More failures than `backoffLimit` (pod failures, plus container restarts under
//!   `restartPolicy: OnFailure`) fail the Job: reason `BackoffLimitExceeded`, "Job has
//!   reached the specified backoff limit"; running longer than `activeDeadlineSeconds`
//!   fails it with `DeadlineExceeded`, "Job was active longer than specified deadline".
//!   The active pods are deleted; the `FailureTarget` condition comes at once and `Failed`
//!   once no pod is left running or terminating.
//! - Enough successes add `SuccessCriteriaMet`, then `Complete` with `completionTime` once
//!   no pod is active, and the event `Completed` "Job completed".
//! - `suspend: true` deletes the active pods and sets `Suspended`; a suspended Job has no
//!   `startTime` (its `activeDeadlineSeconds` does not run), and resuming it sets
//!   `startTime` anew and turns `Suspended` False with reason `JobResumed`.
//! - Status: `active`, `ready`, `succeeded`, `failed`, `terminating`, `startTime`,
//!   `completionTime`, `conditions`.
//!
//! # Where we differ
//!
//! - Counts come from the pods present (no `batch.kubernetes.io/job-tracking` finalizer
//!   and `uncountedTerminatedPods`): deleting finished pods of a running Job lowers them.
//! - No Indexed completion mode, pod failure policy, success policy or `backoffLimitPerIndex`.
//! - The backoff is measured from when this controller saw the failure.
//! - Time (`startTime`, the `activeDeadlineSeconds` check and its requeue, condition
//!   timestamps) is read through tokio's clock ([`WallClock`]), as every timer here.

use std::{collections::HashMap, time::Duration};

use async_trait::async_trait;
use k8s_openapi::api::{batch::v1::Job, core::v1::Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::WallClock;

use super::{
    replicaset::slow_start_create,
    workload::{
        EventSink, Expectations, Reconcile, controlled_by, controller_key, controller_ref,
        counts_differ, delete_pod, drive, is_active, is_ready, key_of, patch_status, phase,
        pod_from_template, select, watch,
    },
};

/// First delay before a failed pod is replaced (upstream `DefaultJobPodFailureBackOff`).
pub const POD_FAILURE_BACKOFF: Duration = Duration::from_secs(10);
/// Longest delay (upstream `MaxJobPodFailureBackOff`).
pub const MAX_POD_FAILURE_BACKOFF: Duration = Duration::from_secs(360);

/// The replacement delay after `failures` failures: 10 s, 20 s, 40 s … 6 min.
pub fn failure_backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    POD_FAILURE_BACKOFF
        .saturating_mul(1u32.checked_shl(failures - 1).unwrap_or(u32::MAX))
        .min(MAX_POD_FAILURE_BACKOFF)
}

/// The Job controller.
pub struct JobController {
    client: Client,
}

impl std::fmt::Debug for JobController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobController").finish_non_exhaustive()
    }
}

impl JobController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (jobs, job_events) = watch(Api::<Job>::all(self.client.clone()), |j| vec![key_of(j)]);
        let (pods, pod_events) = watch(Api::<Pod>::all(self.client.clone()), |p| {
            controller_key(p, "Job")
        });
        let events = EventSink::spawn(self.client.clone(), "job-controller", shutdown.clone());
        let sync = Sync {
            client: self.client,
            jobs,
            pods,
            events,
            expectations: Expectations::default(),
            failures: HashMap::new(),
            clock: WallClock::new(),
        };
        drive(sync, vec![job_events, pod_events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    jobs: Store<Job>,
    pods: Store<Pod>,
    events: EventSink,
    expectations: Expectations,
    /// Per Job: failures last seen and when that count was first seen.
    failures: HashMap<String, (u32, Instant)>,
    clock: WallClock,
}

fn has_condition(job: &Job, type_: &str) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

fn condition(now: jiff::Timestamp, type_: &str, reason: &str, message: &str) -> Value {
    let now = now.to_string();
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now})
}

/// Sets condition `type_` to `status` (upstream `ensureJobConditionStatus`): a condition of
/// that type whose status differs is updated with the reason, message and transition time,
/// a missing one is added. Whether anything changed.
fn set_condition(
    conditions: &mut Vec<Value>,
    now: jiff::Timestamp,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
) -> bool {
    let mut new = condition(now, type_, reason, message);
    new["status"] = json!(status);
    match conditions.iter_mut().find(|c| c["type"] == type_) {
        Some(c) if c["status"] == status => false,
        Some(c) => {
            *c = new;
            true
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

fn restarts(pod: &Pod) -> u32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |cs| {
            cs.iter()
                .map(|c| c.restart_count.max(0).unsigned_abs())
                .fold(0, u32::saturating_add)
        })
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "job"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(job) = self.jobs.get(&ObjectRef::new(name).within(ns)) else {
            self.expectations.forget(key);
            self.failures.remove(key);
            return Ok(None);
        };
        if has_condition(&job, "Complete") || has_condition(&job, "Failed") {
            return Ok(None);
        }
        let uid = job.uid().unwrap_or_default();
        let spec = job.spec.clone().unwrap_or_default();
        let owner = job.object_ref(&());
        let pods = select(&self.pods, |p| {
            p.namespace().as_deref() == Some(ns) && controlled_by(p, &uid)
        });
        let active: Vec<_> = pods.iter().filter(|p| is_active(p)).cloned().collect();
        let succeeded = pods.iter().filter(|p| phase(p) == "Succeeded").count() as i32;
        let failed = pods.iter().filter(|p| phase(p) == "Failed").count() as i32;
        let terminating = pods
            .iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_some()
                    && !matches!(phase(p), "Succeeded" | "Failed")
            })
            .count() as i32;
        let on_failure = spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            == Some("OnFailure");
        let restart_failures: u32 = if on_failure {
            active
                .iter()
                .map(|p| restarts(p))
                .fold(0, u32::saturating_add)
        } else {
            0
        };
        let failures = failed.unsigned_abs().saturating_add(restart_failures);
        let status = job.status.clone().unwrap_or_default();
        let now = self.clock.now();
        let mut conditions: Vec<Value> = status
            .conditions
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| serde_json::to_value(c).ok())
            .collect();
        let has =
            |cs: &[Value], t: &str| cs.iter().any(|c| c["type"] == t && c["status"] == "True");
        let suspended = spec.suspend == Some(true);
        // JobSpec.suspend, JobStatus.startTime: no startTime while suspended, and a resumed
        // Job starts again now, its activeDeadlineSeconds with it.
        let start = if suspended {
            None
        } else if has(&conditions, "Suspended") {
            set_condition(
                &mut conditions,
                now,
                "Suspended",
                "False",
                "JobResumed",
                "Job resumed",
            );
            self.events
                .normal(&owner, "Resumed", "Resume", "Job resumed".into());
            Some(now)
        } else {
            Some(status.start_time.as_ref().map_or(now, |t| t.0))
        };
        let mut again = None;
        let mut completion_time = None;

        let backoff_limit = spec.backoff_limit.unwrap_or(6);
        let deadline = spec.active_deadline_seconds;
        let failure = if has(&conditions, "FailureTarget") {
            None
        } else if i64::from(failures) > i64::from(backoff_limit) {
            Some((
                "BackoffLimitExceeded",
                "Job has reached the specified backoff limit",
            ))
        } else if let Some((d, start)) = deadline.zip(start) {
            let left = deadline_left(d, start, now);
            if left.is_zero() {
                Some((
                    "DeadlineExceeded",
                    "Job was active longer than specified deadline",
                ))
            } else {
                again = Some(left);
                None
            }
        } else {
            None
        };
        if let Some((reason, message)) = failure {
            conditions.push(condition(now, "FailureTarget", reason, message));
            self.events
                .warning(&owner, reason, "Fail", message.to_owned());
        }
        let completions = spec.completions;
        let success = match completions {
            Some(c) => succeeded >= c,
            None => succeeded >= 1,
        };
        if has(&conditions, "FailureTarget") {
            for p in &active {
                delete_pod(&self.client, &self.events, &owner, p).await?;
            }
            if active.is_empty() && terminating == 0 && !has(&conditions, "Failed") {
                let target = conditions
                    .iter()
                    .find(|c| c["type"] == "FailureTarget")
                    .cloned()
                    .unwrap_or_default();
                conditions.push(condition(
                    now,
                    "Failed",
                    target["reason"].as_str().unwrap_or(""),
                    target["message"].as_str().unwrap_or(""),
                ));
            }
        } else if success && (completions.is_some() || active.is_empty()) {
            if !has(&conditions, "SuccessCriteriaMet") {
                conditions.push(condition(
                    now,
                    "SuccessCriteriaMet",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ));
            }
            for p in &active {
                delete_pod(&self.client, &self.events, &owner, p).await?;
            }
            if active.is_empty() && terminating == 0 {
                conditions.push(condition(
                    now,
                    "Complete",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                ));
                completion_time = Some(now.to_string());
                self.events
                    .normal(&owner, "Completed", "Complete", "Job completed".into());
            }
        } else if spec.suspend == Some(true) {
            for p in &active {
                delete_pod(&self.client, &self.events, &owner, p).await?;
            }
            if set_condition(
                &mut conditions,
                now,
                "Suspended",
                "True",
                "JobSuspended",
                "Job suspended",
            ) {
                self.events
                    .normal(&owner, "Suspended", "Suspend", "Job suspended".into());
            }
        } else if self.expectations.satisfied(key, &self.pods, ns) {
            let parallelism = spec.parallelism.unwrap_or(1).max(0);
            let wanted = match completions {
                Some(c) => parallelism.min(c - succeeded).max(0),
                None if succeeded > 0 => 0,
                None => parallelism,
            } as usize;
            if active.len() < wanted {
                // Failed pods are replaced only after their backoff.
                let seen = self
                    .failures
                    .entry(key.to_owned())
                    .or_insert((0, Instant::now()));
                if seen.0 != failures {
                    *seen = (failures, Instant::now());
                }
                let ready_at = seen.1 + failure_backoff(failures);
                if Instant::now() < ready_at {
                    let wait = ready_at - Instant::now();
                    again = Some(again.map_or(wait, |a: Duration| a.min(wait)));
                } else {
                    let pod =
                        pod_from_template(&spec.template, controller_ref(&*job), ns, name, &[]);
                    slow_start_create(
                        &self.client,
                        &self.events,
                        &mut self.expectations,
                        key,
                        &owner,
                        &pod,
                        wanted - active.len(),
                    )
                    .await?;
                }
            } else if active.len() > wanted {
                for p in active.iter().take(active.len() - wanted) {
                    self.expectations.expect(key, p.name_any(), false);
                    delete_pod(&self.client, &self.events, &owner, p).await?;
                }
            }
        }
        let ready = active.iter().filter(|p| is_ready(p)).count();
        let mut new_status = json!({
            "active": active.len(),
            "ready": ready,
            "succeeded": succeeded,
            "failed": failed,
            "terminating": terminating,
            "startTime": start.map(|t| t.to_string()),
            "conditions": conditions,
            "uncountedTerminatedPods": {},
        });
        if let Some(t) = completion_time {
            new_status["completionTime"] = json!(t);
        }
        let before = serde_json::to_value(&status).unwrap_or_default();
        let condition_states = |cs: &[Value]| -> Vec<(String, String)> {
            cs.iter()
                .map(|c| (c["type"].to_string(), c["status"].to_string()))
                .collect()
        };
        let changed = status.start_time.as_ref().map(|t| t.0) != start
            || new_status.get("completionTime").is_some()
            || counts_differ(
                &before,
                &new_status,
                ["active", "ready", "succeeded", "failed", "terminating"],
            )
            || condition_states(before["conditions"].as_array().map_or(&[], Vec::as_slice))
                != condition_states(&conditions);
        if changed {
            let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
            patch_status(&api, name, new_status).await?;
        }
        Ok(again)
    }
}

/// How long a Job started at `start` may still run under `activeDeadlineSeconds` =
/// `deadline` at `now` (upstream `pastActiveDeadline`: past once the time since `startTime`
/// is at least the deadline); zero once it is past.
fn deadline_left(deadline: i64, start: jiff::Timestamp, now: jiff::Timestamp) -> Duration {
    let allowed = jiff::SignedDuration::from_secs(deadline);
    // Saturating: a deadline near i64::MAX seconds and a `startTime` in the future must
    // not overflow.
    let left = allowed.saturating_sub(now.duration_since(start));
    if left.is_positive() {
        Duration::try_from(left).unwrap_or(Duration::ZERO)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Upstream `pastActiveDeadline`: `time.Since(startTime) >= activeDeadlineSeconds`.
    #[test]
    fn deadline_is_reached_at_active_deadline_seconds() {
        let start: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let at = |secs: i64| start + jiff::SignedDuration::from_millis(secs);
        assert_eq!(deadline_left(30, start, at(0)), Duration::from_secs(30));
        assert_eq!(
            deadline_left(30, start, at(29_500)),
            Duration::from_millis(500)
        );
        assert_eq!(deadline_left(30, start, at(30_000)), Duration::ZERO);
        assert_eq!(deadline_left(30, start, at(90_000)), Duration::ZERO);
        assert_eq!(deadline_left(0, start, at(0)), Duration::ZERO);
    }

    /// Upstream `pastActiveDeadline` with `activeDeadlineSeconds` at the int64 maximum and
    /// a `startTime` in the future (a status any writer of jobs/status can set): no
    /// overflow, the deadline is simply far away.
    #[test]
    fn the_largest_active_deadline_does_not_overflow() {
        let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
        let future_start = jiff::Timestamp::MAX;
        let far = Duration::from_secs(1 << 62);
        assert!(deadline_left(i64::MAX, future_start, now) > far);
        assert!(deadline_left(i64::MAX, jiff::Timestamp::MIN, now) > far);
        assert!(deadline_left(30, future_start, now) > Duration::from_secs(30));
    }

    /// Upstream's pod failure backoff: 10 s doubling, capped at 6 minutes.
    #[test]
    fn backoff_doubles_to_six_minutes() {
        assert_eq!(failure_backoff(0), Duration::ZERO);
        assert_eq!(failure_backoff(1), Duration::from_secs(10));
        assert_eq!(failure_backoff(3), Duration::from_secs(40));
        assert_eq!(failure_backoff(6), Duration::from_secs(320));
        assert_eq!(failure_backoff(7), Duration::from_secs(360));
        assert_eq!(failure_backoff(40), Duration::from_secs(360));
    }
}
