//! The TTL-after-finished controller: deletes finished Jobs once their
//! `spec.ttlSecondsAfterFinished` has passed.
//!
//! # What upstream does (`pkg/controller/ttlafterfinished/ttlafterfinished_controller.go`)
//!
//! A Job with `ttlSecondsAfterFinished` set that has finished (its `Complete` or `Failed`
//! condition `True`) expires at the condition's `lastTransitionTime` plus the TTL
//! (`jobFinishTime`, `timeLeft`). Until then it is requeued for the time left; once expired
//! the controller reads the Job again from the API server (`processTTL`: the TTL may have
//! been changed or removed meanwhile) and, if it is still expired, deletes it with
//! `propagationPolicy: Foreground` and the Job's uid as precondition, so its pods go
//! first. A TTL of 0 deletes the Job as soon as it finishes.
//!
//! # Where we differ
//!
//! Time is tokio's clock mapped to wall time ([`WallClock`]), so paused-time tests
//! advance it; upstream reads the system clock.

use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Preconditions, PropagationPolicy},
    runtime::reflector::{ObjectRef, Store},
};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::clock::WallClock;

use super::workload::{Reconcile, drive, key_of, watch};

/// The TTL-after-finished controller.
pub struct TtlAfterFinishedController {
    client: Client,
}

impl std::fmt::Debug for TtlAfterFinishedController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtlAfterFinishedController")
            .finish_non_exhaustive()
    }
}

impl TtlAfterFinishedController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let (jobs, events) = watch(Api::<Job>::all(self.client.clone()), |j| {
            // Only Jobs with a TTL concern this controller (`needsCleanup`).
            if ttl(j).is_some() {
                vec![key_of(j)]
            } else {
                Vec::new()
            }
        });
        let sync = Sync {
            client: self.client,
            jobs,
            clock: WallClock::new(),
        };
        drive(sync, vec![events], shutdown).await;
    }
}

struct Sync {
    client: Client,
    jobs: Store<Job>,
    clock: WallClock,
}

fn ttl(job: &Job) -> Option<i64> {
    job.spec.as_ref()?.ttl_seconds_after_finished.map(i64::from)
}

/// When the Job finished: the `lastTransitionTime` of its `Complete` or `Failed`
/// condition that is `True` (`jobFinishTime`). `None` while it runs.
pub fn finish_time(job: &Job) -> Option<jiff::Timestamp> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0)
}

/// How long until `job` expires at `now`: `None` when it has no TTL or has not finished;
/// zero when it has expired (`timeLeft`).
pub fn time_left(job: &Job, now: jiff::Timestamp) -> Option<Duration> {
    let ttl = ttl(job)?;
    let finished = finish_time(job)?;
    let expire_at = finished.checked_add(jiff::SignedDuration::from_secs(ttl.max(0)));
    let Ok(expire_at) = expire_at else {
        // Past the end of time: never.
        return None;
    };
    let left = expire_at.duration_since(now);
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

#[async_trait]
impl Reconcile for Sync {
    fn name(&self) -> &'static str {
        "ttl-after-finished"
    }

    async fn reconcile(&mut self, key: &str) -> Result<Option<Duration>, kube::Error> {
        let (ns, name) = key.split_once('/').unwrap_or(("", key));
        let Some(cached) = self.jobs.get(&ObjectRef::new(name).within(ns)) else {
            return Ok(None);
        };
        if cached.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        match time_left(&cached, self.clock.now()) {
            None => return Ok(None),
            Some(left) if !left.is_zero() => return Ok(Some(left)),
            Some(_) => {}
        }
        // Expired in the cache: check the live object, whose TTL may have changed.
        let api: Api<Job> = Api::namespaced(self.client.clone(), ns);
        let Some(fresh) = api.get_opt(name).await? else {
            return Ok(None);
        };
        if fresh.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        match time_left(&fresh, self.clock.now()) {
            None => return Ok(None),
            Some(left) if !left.is_zero() => return Ok(Some(left)),
            Some(_) => {}
        }
        info!(job = %key, "deleting the finished Job: its ttlSecondsAfterFinished has passed");
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            preconditions: Some(Preconditions {
                uid: fresh.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(ttl: Option<i32>, condition: Option<(&str, &str)>) -> Job {
        let conditions: Vec<_> = condition
            .map(|(t, s)| json!({"type": t, "status": s, "lastTransitionTime": "2026-01-01T00:00:00Z"}))
            .into_iter()
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": "j", "namespace": "default"},
            "spec": {"ttlSecondsAfterFinished": ttl, "template": {"spec": {"containers": []}}},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    /// `timeLeft`: expiry = finish time (the Complete/Failed condition's
    /// lastTransitionTime) + TTL; unfinished Jobs and Jobs without a TTL never expire.
    #[test]
    fn time_left_counts_from_the_finish_condition() {
        let done = job(Some(100), Some(("Complete", "True")));
        assert_eq!(
            time_left(&done, at("2026-01-01T00:00:40Z")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            time_left(&done, at("2026-01-01T00:05:00Z")),
            Some(Duration::ZERO)
        );
        let failed = job(Some(0), Some(("Failed", "True")));
        assert_eq!(
            time_left(&failed, at("2026-01-01T00:00:00Z")),
            Some(Duration::ZERO)
        );
        assert_eq!(
            time_left(
                &job(Some(10), Some(("Complete", "False"))),
                at("2026-01-02T00:00:00Z")
            ),
            None
        );
        assert_eq!(
            time_left(
                &job(None, Some(("Complete", "True"))),
                at("2026-01-02T00:00:00Z")
            ),
            None
        );
    }
}
