//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics
//! (`k8s.io/client-go/tools/leaderelection`):
//!
//! - a candidate acquires the Lease when it is absent, or when its record has not changed for
//!   `leaseDurationSeconds`, measured on our own (tokio) clock from when we last saw the record
//!   change, so clock skew between replicas does not matter;
//! - the leader renews every retry period, and gives up leadership when no renewal succeeds
//!   within the renew deadline;
//! - every write is a GET then a PUT carrying the `resourceVersion`, so of two candidates only
//!   one wins (the other gets 409 Conflict and retries later); `leaseTransitions` is
//!   incremented when the holder changes.
//!
//! As upstream's CCM and kube-controller-manager, the Lease is not released on shutdown
//! unless [`LeaderElector::with_release_on_cancel`] asks for it (client-go's
//! `ReleaseOnCancel`, which kube-scheduler sets): then, once the leader's work has returned,
//! the Lease is written with an empty holder and `leaseDurationSeconds: 1`, so a standby
//! takes over at its next retry instead of after the lease duration.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Where and how to elect a leader.
#[derive(Debug, Clone)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease (`kube-system`).
    pub namespace: String,
    /// Name of the Lease (`cloud-controller-manager`).
    pub name: String,
    /// This candidate's identity, written as `holderIdentity`.
    pub identity: String,
    /// How long the Lease is valid after its last observed change.
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a renewal before stepping down.
    pub renew_deadline: Duration,
    /// Wait between attempts.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// Upstream's defaults (15 s, 10 s, 2 s) for the Lease `namespace/name`, with the
    /// identity `hostname_uuid` (unique per process even on one host).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        LeaderElectionConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// The same config with another identity.
    pub fn with_identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// The config the `--leader-elect-*` flags describe.
    pub(crate) fn from_options(options: &crate::options::CloudControllerManagerOptions) -> Self {
        LeaderElectionConfig {
            lease_duration: options.leader_elect_lease_duration.value,
            renew_deadline: options.leader_elect_renew_deadline.value,
            retry_period: options.leader_elect_retry_period.value,
            ..LeaderElectionConfig::new(
                &options.leader_elect_resource_namespace,
                &options.leader_elect_resource_name,
            )
        }
    }
}

/// `hostname_uuid`, as upstream's CCM: unique per process even on one host.
pub(crate) fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// Why [`LeaderElector::run`] returned.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// This process was the leader and could not renew within the renew deadline. Upstream
    /// exits with status 1.
    #[error("leaderelection lost: lease {lease} could not be renewed within {renew_deadline:?}")]
    Lost {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The renew deadline that passed.
        renew_deadline: Duration,
    },
    /// The leader's work ended by itself with an error.
    #[error("the leader's work failed: {0}")]
    Work(String),
}

/// What the elector has seen, shared with health checks.
#[derive(Debug, Default)]
struct State {
    /// The last Lease spec we read or wrote, and when (our clock) we saw it change.
    observed: Option<(LeaseSpec, Instant)>,
    /// When we last renewed successfully while leading.
    last_renew: Option<Instant>,
    leading: bool,
}

/// A handle on an elector's state for the `leaderElection` health check.
#[derive(Debug, Clone)]
pub(crate) struct LeaderHealth {
    state: Arc<Mutex<State>>,
    lease_duration: Duration,
}

impl LeaderHealth {
    /// Upstream's check: fails when we lead and our last renewal is older than the lease
    /// duration plus `tolerance` (20 s upstream).
    pub(crate) fn check(&self, tolerance: Duration) -> Result<(), String> {
        let state = self.state.lock();
        match (state.leading, state.last_renew) {
            (true, Some(at)) if at.elapsed() > self.lease_duration + tolerance => Err(format!(
                "failed election to renew leadership on lease: last renewal {:?} ago",
                at.elapsed()
            )),
            _ => Ok(()),
        }
    }
}

/// One candidate for leadership. See the module docs.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    state: Arc<Mutex<State>>,
    shutdown: CancellationToken,
    release_on_cancel: bool,
}

impl LeaderElector {
    /// A candidate using `client` and `config`.
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            state: Arc::default(),
            shutdown: CancellationToken::new(),
            release_on_cancel: false,
        }
    }

    /// Release the Lease on shutdown, once the leader's work has returned (client-go's
    /// `ReleaseOnCancel`, which kube-scheduler sets; off by default, as in client-go and
    /// upstream's CCM and kube-controller-manager), so that a standby takes over at its next
    /// retry instead of after the lease duration.
    pub fn with_release_on_cancel(mut self, release: bool) -> Self {
        self.release_on_cancel = release;
        self
    }

    /// Stop campaigning (and leading) when `shutdown` is cancelled; [`Self::run`] then
    /// returns `Ok(())` once the leader's work has returned.
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// A handle for the `leaderElection` health check.
    pub(crate) fn health(&self) -> LeaderHealth {
        LeaderHealth {
            state: self.state.clone(),
            lease_duration: self.config.lease_duration,
        }
    }

    /// Campaigns until this candidate leads, then calls `on_started_leading` with a token that
    /// is cancelled when leadership is lost or on shutdown, and keeps renewing.
    ///
    /// Returns `Err(LeaderError::Lost)` when leadership is lost (after the work returned),
    /// `Ok(())` on shutdown or when the work ends by itself with `Ok`.
    pub async fn run<F, Fut, E>(self, on_started_leading: F) -> Result<(), LeaderError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        // Campaign.
        loop {
            if self.try_acquire_or_renew().await {
                break;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
        tracing::info!(identity = %self.config.identity, lease = %self.lease_name(), "successfully acquired lease");
        {
            let mut state = self.state.lock();
            state.leading = true;
            state.last_renew = Some(Instant::now());
        }
        let token = self.shutdown.child_token();
        let mut work = tokio::spawn(on_started_leading(token.clone()));
        // Renew every retry period; a round fails when no attempt succeeds within the deadline.
        let lost = loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => break false,
                result = &mut work => {
                    self.state.lock().leading = false;
                    // The work may see the shutdown (its token is a child) before we do.
                    if self.shutdown.is_cancelled() && self.release_on_cancel {
                        self.release().await;
                    }
                    return match result {
                        Ok(Ok(())) => Ok(()),
                        Ok(Err(error)) => Err(LeaderError::Work(error.to_string())),
                        Err(join) => Err(LeaderError::Work(join.to_string())),
                    };
                }
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            if !self.renew_within_deadline().await {
                break true;
            }
        };
        self.state.lock().leading = false;
        token.cancel();
        let _ = work.await;
        // client-go's `renew` ends with `release()` under ReleaseOnCancel; only after the
        // work returned, so that no two processes act at once.
        if !lost && self.release_on_cancel {
            self.release().await;
        }
        if lost {
            tracing::error!(identity = %self.config.identity, lease = %self.lease_name(), "leaderelection lost");
            Err(LeaderError::Lost {
                lease: self.lease_name(),
                renew_deadline: self.config.renew_deadline,
            })
        } else {
            Ok(())
        }
    }

    fn lease_name(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    /// client-go's `renew`: retry every retry period until one succeeds or the deadline
    /// passes.
    async fn renew_within_deadline(&self) -> bool {
        let deadline = Instant::now() + self.config.renew_deadline;
        loop {
            let attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await;
            if attempt == Ok(true) {
                self.state.lock().last_renew = Some(Instant::now());
                return true;
            }
            if Instant::now() + self.config.retry_period >= deadline {
                return false;
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return true,
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
        }
    }

    fn desired_spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let ours = previous
            .and_then(|p| p.holder_identity.as_deref())
            .is_some_and(|holder| holder == self.config.identity);
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.config.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        }
    }

    /// client-go's `release` (`tools/leaderelection/leaderelection.go`): if we still hold the
    /// Lease, write it with an empty holder, `leaseDurationSeconds: 1`, and acquire and renew
    /// times of now, keeping `leaseTransitions`. Bounded by the renew deadline; the write
    /// carries the `resourceVersion` read, so a Lease another candidate took is left alone.
    async fn release(&self) -> bool {
        let attempt = async {
            let mut lease = match self.api.get_opt(&self.config.name).await {
                Ok(Some(lease)) => lease,
                Ok(None) => {
                    tracing::info!(lease = %self.lease_name(), "lease lock not found");
                    return false;
                }
                Err(error) => {
                    tracing::error!(%error, lease = %self.lease_name(), "error retrieving lease");
                    return false;
                }
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
                return true;
            }
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            let released = LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: spec.lease_transitions,
                ..LeaseSpec::default()
            };
            lease.spec = Some(released.clone());
            match self
                .api
                .replace(&self.config.name, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => {
                    let spec = written.spec.unwrap_or(released);
                    self.state.lock().observed = Some((spec, Instant::now()));
                    tracing::info!(identity = %self.config.identity, lease = %self.lease_name(), "released lease");
                    true
                }
                Err(error) => {
                    tracing::error!(%error, lease = %self.lease_name(), "failed to release lease");
                    false
                }
            }
        };
        tokio::time::timeout(self.config.renew_deadline, attempt)
            .await
            .unwrap_or(false)
    }

    /// client-go's `tryAcquireOrRenew`: one GET and at most one write.
    async fn try_acquire_or_renew(&self) -> bool {
        let current = match self.api.get_opt(&self.config.name).await {
            Ok(current) => current,
            Err(error) => {
                tracing::warn!(%error, lease = %self.lease_name(), "error retrieving lease");
                return false;
            }
        };
        let Some(mut lease) = current else {
            let spec = self.desired_spec(None);
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec.clone()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => {
                    let spec = written.spec.unwrap_or(spec);
                    self.state.lock().observed = Some((spec, Instant::now()));
                    true
                }
                Err(error) => {
                    tracing::debug!(%error, "error initially creating lease");
                    false
                }
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let now = Instant::now();
        let observed_at = {
            let mut state = self.state.lock();
            match &state.observed {
                Some((seen, at)) if *seen == spec => *at,
                _ => {
                    state.observed = Some((spec.clone(), now));
                    now
                }
            }
        };
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.config.lease_duration, Duration::from_secs);
        if !holder.is_empty() && holder != self.config.identity && observed_at + duration > now {
            tracing::trace!(
                holder,
                "lease is held by another candidate and has not yet expired"
            );
            return false;
        }
        let desired = self.desired_spec(Some(&spec));
        lease.spec = Some(desired.clone());
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                let spec = written.spec.unwrap_or(desired);
                self.state.lock().observed = Some((spec, Instant::now()));
                true
            }
            Err(error) => {
                tracing::debug!(%error, lease = %self.lease_name(), "failed to update lease");
                false
            }
        }
    }
}
