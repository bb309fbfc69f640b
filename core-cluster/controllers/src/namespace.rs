//! The namespace controller: a deleted namespace's contents are deleted, then its
//! `kubernetes` finalizer is removed, and the API server deletes the namespace.
//!
//! # What upstream does (`pkg/controller/namespace`)
//!
//! `namespace_controller.go`: namespaces added or updated with a `deletionTimestamp` are
//! queued after `namespaceDeletionGracePeriod` (5 s, so that every API server has seen the
//! deletion and no create slips in behind the cleanup). A failed sync is retried with
//! `nsControllerRateLimiter` (per key 5 ms doubling to 60 s, and 10 retries a second with
//! bursts of 100 over all keys); a sync that left content whose removal takes time
//! (`ResourcesRemainingError`) is requeued after `estimate / 2 + 1` seconds.
//!
//! `deletion/namespaced_resources_deleter.go` `Delete`, for one namespace:
//!
//! - reads it live; gone, or not being deleted: nothing to do;
//! - sets `status.phase: Terminating` when it is not (`updateNamespaceStatusFunc`, retried
//!   on conflict with a fresh read that must keep the uid);
//! - with `spec.finalizers` empty it is finalized already: nothing to do;
//! - `deleteAllContent`: discovers every namespaced resource of the server's preferred
//!   versions that supports `delete` (`ServerPreferredNamespacedResources`), deletes the
//!   Pods first and stops there while any remain (`OrderedNamespaceDeletion`, GA and locked
//!   on in 1.34), then every other resource. Per resource
//!   (`deleteAllContentForGroupVersionResource`): an estimate of the time the remaining
//!   objects need (for Pods the longest `terminationGracePeriodSeconds` of the non-terminal
//!   ones, 0 once that much time has passed since the namespace's `deletionTimestamp`);
//!   `deletecollection` with `propagationPolicy: Background` and no grace period (each
//!   object's own) where served, else a list and a DELETE of each; then a list: nothing
//!   left is done, something left with an estimate is waited for, something left with
//!   finalizers is waited for 15 s (`finalizerEstimateSeconds`), anything else is an error
//!   ("unexpected items still remain in namespace"). A resource that answers 404 or 405 to
//!   `deletecollection` or list is skipped as not supporting it;
//! - the namespace's status conditions say how it went (`status_condition_utils.go`):
//!   `NamespaceDeletionDiscoveryFailure`, `NamespaceDeletionGroupVersionParsingFailure`,
//!   `NamespaceDeletionContentFailure`, `NamespaceContentRemaining`,
//!   `NamespaceFinalizersRemaining`, each `True` with the failure or `False` with its "ok"
//!   reason and message, written only when one changed;
//! - an error beats the estimate; an estimate above 0 is `ResourcesRemainingError`;
//! - with nothing left, `kubernetes` is removed from `spec.finalizers` through the
//!   `finalize` subresource (the remaining finalizers sorted, as Go's string set lists
//!   them), retried on conflict; the API server deletes the namespace once none is left.
//!   NotFound at any step means another deleter finished first: success.
//!
//! # Where we differ
//!
//! - One worker (upstream: `--concurrent-namespace-syncs`, 10).
//! - Discovery is the aggregated kind (two requests) where the server serves it, else the
//!   legacy one; a failure of either fails the sync (upstream goes on with the groups it
//!   could discover). No `NamespaceDeletionGroupVersionParsingFailure` is ever `True`:
//!   kube-rs has parsed the group versions already.
//! - A conflict while updating the namespace is retried at most [`MAX_CONFLICT_RETRIES`]
//!   times in a sync (upstream: until it stops conflicting); the sync then fails and is
//!   retried with the rate limiter.
//! - Time is tokio's clock mapped to wall time ([`WallClock`]), so paused-time tests
//!   advance it.
//!
//! core-cluster's own API server deletes a namespace's contents itself (its storage's
//! `namespace` module) and finalizes it: run against it, this controller does the same work
//! again, which converges (deleting what is gone is NotFound, and a namespace finalized or
//! deleted meanwhile is a conflict, then NotFound).

use std::{collections::BTreeMap, time::Duration};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::{Namespace, NamespaceCondition, NamespaceSpec, Pod},
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, PropagationPolicy},
    discovery::{Discovery, Scope, verbs},
    runtime::{WatchStreamExt, watcher},
};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use ccm_workqueue::{Queue, RateLimiter, sleep_until};

use crate::clock::WallClock;

/// The finalizer this controller removes once the namespace is empty
/// (`v1.FinalizerKubernetes`, kube-controller-manager's `finalizerToken`).
pub const FINALIZER_KUBERNETES: &str = "kubernetes";

/// How long after seeing a deleted namespace the controller starts on it
/// (`namespaceDeletionGracePeriod`).
pub const NAMESPACE_DELETION_GRACE_PERIOD: Duration = Duration::from_secs(5);

/// How long objects held by finalizers are given before the next look
/// (`finalizerEstimateSeconds`).
pub const FINALIZER_ESTIMATE_SECONDS: i64 = 15;

/// How many times one sync rereads the namespace after a conflicting update before it fails
/// (and is retried with the rate limiter).
pub const MAX_CONFLICT_RETRIES: usize = 10;

/// The condition types the deleter maintains, in upstream's order (`conditionTypes`).
pub const CONDITION_TYPES: [&str; 5] = [
    "NamespaceDeletionDiscoveryFailure",
    "NamespaceDeletionGroupVersionParsingFailure",
    "NamespaceDeletionContentFailure",
    "NamespaceContentRemaining",
    "NamespaceFinalizersRemaining",
];

/// Why one sync of a namespace did not finish it.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceDeletionError {
    /// The API server refused or failed a request.
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
    /// Content is left whose removal takes time (`ResourcesRemainingError`): the namespace is
    /// looked at again after `estimate / 2 + 1` seconds.
    #[error("some content remains in the namespace, estimate {0} seconds before it is removed")]
    ResourcesRemaining(i64),
    /// The namespace was deleted and recreated while it was being updated.
    #[error("namespace uid has changed across retries")]
    UidChanged,
    /// Updates of the namespace kept conflicting.
    #[error("the namespace's updates conflicted {0} times in a row")]
    Conflicts(usize),
    /// Discovery or deleting the content failed (Go's aggregate of the errors: one message,
    /// or several in brackets).
    #[error("{}", aggregate(.0))]
    Content(Vec<String>),
}

/// Go's `utilerrors.NewAggregate(errs).Error()`.
fn aggregate(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The message of an API error as Go's client prints it (the Status's message).
fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

fn is_not_found(e: &kube::Error) -> bool {
    is_status(e, &[404])
}

/// NotFound or MethodNotSupported: the server does not support the operation on that
/// resource (upstream's special case for both).
fn not_supported(e: &kube::Error) -> bool {
    is_status(e, &[404, 405])
}

/// The namespace controller.
pub struct NamespaceController {
    deleter: Deleter,
    grace_period: Duration,
}

impl std::fmt::Debug for NamespaceController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceController")
            .field("grace_period", &self.grace_period)
            .finish_non_exhaustive()
    }
}

impl NamespaceController {
    /// A controller talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            deleter: Deleter::new(client),
            grace_period: NAMESPACE_DELETION_GRACE_PERIOD,
        }
    }

    /// Waits `grace_period` rather than [`NAMESPACE_DELETION_GRACE_PERIOD`] after seeing a
    /// deleted namespace before starting on it.
    pub fn with_grace_period(mut self, grace_period: Duration) -> Self {
        self.grace_period = grace_period;
        self
    }

    /// One sync of the namespace `name` (`syncNamespaceFromKey`, then the deleter's
    /// `Delete`): what [`run`](Self::run) does each time the namespace's turn comes. `Ok`
    /// when there is nothing (more) to do; [`NamespaceDeletionError::ResourcesRemaining`]
    /// when content is left that takes time to go.
    pub async fn sync(&self, name: &str) -> Result<(), NamespaceDeletionError> {
        self.deleter.delete(name).await
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut events = watcher(self.deleter.namespaces.clone(), watcher::Config::default())
            .default_backoff()
            .boxed();
        // `nsControllerRateLimiter`.
        let mut queue: Queue<String> = Queue::new(
            RateLimiter::exponential(Duration::from_millis(5), Duration::from_secs(60))
                .with_bucket(10.0, 100),
        );
        loop {
            if let Some(name) = queue.try_get() {
                let span = info_span!("reconcile", controller = "namespace", key = %name);
                let result = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = self.sync(&name).instrument(span.clone()) => r,
                };
                match result {
                    Ok(()) => queue.forget(&name),
                    Err(NamespaceDeletionError::ResourcesRemaining(estimate)) => {
                        let after = requeue_after(estimate);
                        span.in_scope(|| debug!(?after, "content remaining in the namespace"));
                        queue.add_after(name.clone(), after);
                    }
                    Err(e) => {
                        let after = queue.add_rate_limited(name.clone());
                        span.in_scope(
                            || warn!(error = %e, retry_in = ?after, "deletion of the namespace failed"),
                        );
                    }
                }
                queue.done(&name);
                continue;
            }
            let deadline = queue.next_deadline();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sleep_until(deadline) => {}
                event = events.next() => match event {
                    None => return,
                    Some(Err(e)) => warn!(error = %e, "namespace watch failed; retrying"),
                    Some(Ok(watcher::Event::Apply(ns) | watcher::Event::InitApply(ns))) => {
                        // `enqueueNamespace`: only namespaces being deleted, after the grace
                        // period.
                        if ns.metadata.deletion_timestamp.is_some() {
                            queue.add_after(ns.name_any(), self.grace_period);
                        }
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    }
}

/// When a namespace with content left is looked at again (the worker's `estimate/2 + 1`
/// seconds).
pub fn requeue_after(estimate: i64) -> Duration {
    Duration::from_secs(u64::try_from(estimate / 2 + 1).unwrap_or(1))
}

/// A namespaced resource the server serves with `delete`, and whether it serves `list` and
/// `deletecollection`.
#[derive(Debug, Clone)]
struct Deletable {
    ar: ApiResource,
    list: bool,
    delete_collection: bool,
}

impl Deletable {
    fn is_pods(&self) -> bool {
        self.ar.group.is_empty() && self.ar.plural == "pods"
    }

    /// `schema.GroupVersionResource` as Go's `%v` prints it.
    fn gvr(&self) -> String {
        format!(
            "{{{} {} {}}}",
            self.ar.group, self.ar.version, self.ar.plural
        )
    }

    /// `resource.group`, as the `NamespaceContentRemaining` message names it.
    fn resource_group(&self) -> String {
        format!("{}.{}", self.ar.plural, self.ar.group)
    }
}

/// What is left of one resource after deleting it (`gvrDeletionMetadata`).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Remaining {
    /// How much longer to wait, in seconds; 0 says nothing of whether all is gone.
    pub estimate: i64,
    /// How many objects are left.
    pub count: usize,
    /// How many of them each finalizer holds.
    pub finalizers: BTreeMap<String, usize>,
}

/// `deleteAllContentForGroupVersionResource`'s verdict on the objects `left` after the
/// deletion, given the resource's time `estimate`.
pub fn remaining(
    estimate: i64,
    left: &[Vec<String>],
    namespace: &str,
    gvr: &str,
) -> Result<Remaining, (Remaining, String)> {
    if left.is_empty() {
        return Ok(Remaining::default());
    }
    let mut finalizers = BTreeMap::new();
    for item in left {
        for f in item {
            *finalizers.entry(f.clone()).or_insert(0) += 1;
        }
    }
    let count = left.len();
    if estimate != 0 {
        return Ok(Remaining {
            estimate,
            count,
            finalizers,
        });
    }
    if !finalizers.is_empty() {
        return Ok(Remaining {
            estimate: FINALIZER_ESTIMATE_SECONDS,
            count,
            finalizers,
        });
    }
    Err((
        Remaining {
            estimate,
            count,
            finalizers,
        },
        format!("unexpected items still remain in namespace: {namespace} for gvr: {gvr}"),
    ))
}

/// `estimateGracefulTerminationForPods`, then `estimateGracefulTermination`'s cut: the longest
/// `terminationGracePeriodSeconds` of the pods that are not `Succeeded` or `Failed`, or 0
/// once that long has passed since `deleted_at`.
pub fn pods_estimate(pods: &[Pod], deleted_at: jiff::Timestamp, now: jiff::Timestamp) -> i64 {
    let estimate = pods
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|p| p.spec.as_ref()?.termination_grace_period_seconds)
        .fold(0, i64::max);
    let elapsed = now.duration_since(deleted_at);
    if elapsed >= jiff::SignedDuration::from_secs(estimate) {
        0
    } else {
        estimate
    }
}

/// `finalizeNamespace`'s new `spec.finalizers`: all but [`FINALIZER_KUBERNETES`], sorted
/// and without duplicates (Go's `sets.String.List()`).
pub fn finalizers_after_finalize(finalizers: &[String]) -> Vec<String> {
    let set: std::collections::BTreeSet<&String> = finalizers
        .iter()
        .filter(|f| *f != FINALIZER_KUBERNETES)
        .collect();
    set.into_iter().cloned().collect()
}

/// What `namespaceConditionUpdater` gathered in one `deleteAllContent`.
#[derive(Debug, Default)]
pub struct ConditionUpdate {
    /// The failing conditions: (type, reason, message).
    failing: Vec<(&'static str, &'static str, String)>,
    /// The errors of deleting content.
    content_errors: Vec<String>,
}

impl ConditionUpdate {
    /// `ProcessDiscoverResourcesErr`.
    pub fn discovery_failed(&mut self, message: String) {
        self.failing.push((
            "NamespaceDeletionDiscoveryFailure",
            "DiscoveryFailed",
            message,
        ));
    }

    /// `ProcessDeleteContentErr`.
    pub fn content_failed(&mut self, message: String) {
        self.content_errors.push(message);
    }

    /// `ProcessContentTotals`: the resources and finalizers content is left of.
    pub fn content_totals(
        &mut self,
        by_resource: &BTreeMap<String, usize>,
        by_finalizer: &BTreeMap<String, usize>,
    ) {
        let mut resources: Vec<String> = by_resource
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r} has {n} resource instances"))
            .collect();
        if !by_resource.is_empty() {
            resources.sort();
            self.failing.push((
                "NamespaceContentRemaining",
                "SomeResourcesRemain",
                format!("Some resources are remaining: {}", resources.join(", ")),
            ));
        }
        let mut finalizers: Vec<String> = by_finalizer
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(f, n)| format!("{f} in {n} resource instances"))
            .collect();
        if !by_finalizer.is_empty() {
            finalizers.sort();
            self.failing.push((
                "NamespaceFinalizersRemaining",
                "SomeFinalizersRemain",
                format!(
                    "Some content in the namespace has finalizers remaining: {}",
                    finalizers.join(", ")
                ),
            ));
        }
    }

    /// `Update`: brings `conditions` to what was gathered (the "ok" variant of every type
    /// that did not fail); whether anything changed. A changed status moves the condition's
    /// `lastTransitionTime` to `now`.
    pub fn apply(mut self, conditions: &mut Vec<NamespaceCondition>, now: Time) -> bool {
        if !self
            .failing
            .iter()
            .any(|(t, _, _)| *t == "NamespaceDeletionContentFailure")
            && !self.content_errors.is_empty()
        {
            self.content_errors.sort();
            self.failing.push((
                "NamespaceDeletionContentFailure",
                "ContentDeletionFailed",
                format!(
                    "Failed to delete all resource types, {} remaining: {}",
                    self.content_errors.len(),
                    self.content_errors.join(", ")
                ),
            ));
        }
        let mut changed = false;
        for kind in CONDITION_TYPES {
            let (status, reason, message) = match self.failing.iter().find(|(t, _, _)| *t == kind) {
                Some((_, reason, message)) => ("True", *reason, message.clone()),
                None => {
                    let (reason, message) = ok_condition(kind);
                    ("False", reason, message.to_owned())
                }
            };
            match conditions.iter_mut().find(|c| c.type_ == kind) {
                None => {
                    conditions.push(NamespaceCondition {
                        type_: kind.to_owned(),
                        status: status.to_owned(),
                        reason: Some(reason.to_owned()),
                        message: Some(message),
                        last_transition_time: Some(now.clone()),
                    });
                    changed = true;
                }
                Some(old) => {
                    if old.status != status
                        || old.message.as_deref() != Some(message.as_str())
                        || old.reason.as_deref() != Some(reason)
                    {
                        if old.status != status {
                            old.last_transition_time = Some(now.clone());
                        }
                        old.status = status.to_owned();
                        old.reason = Some(reason.to_owned());
                        old.message = Some(message);
                        changed = true;
                    }
                }
            }
        }
        changed
    }
}

/// The "ok" reason and message of each condition type (`okReasons`, `okMessages`).
fn ok_condition(kind: &str) -> (&'static str, &'static str) {
    match kind {
        "NamespaceDeletionDiscoveryFailure" => (
            "ResourcesDiscovered",
            "All resources successfully discovered",
        ),
        "NamespaceDeletionGroupVersionParsingFailure" => (
            "ParsedGroupVersions",
            "All legacy kube types successfully parsed",
        ),
        "NamespaceDeletionContentFailure" => (
            "ContentDeleted",
            "All content successfully deleted, may be waiting on finalization",
        ),
        "NamespaceContentRemaining" => ("ContentRemoved", "All content successfully removed"),
        _ => (
            "ContentHasNoFinalizers",
            "All content-preserving finalizers finished",
        ),
    }
}

/// `namespacedResourcesDeleter`.
struct Deleter {
    client: Client,
    namespaces: Api<Namespace>,
    clock: WallClock,
}

impl Deleter {
    fn new(client: Client) -> Self {
        Self {
            namespaces: Api::all(client.clone()),
            client,
            clock: WallClock::new(),
        }
    }

    fn now(&self) -> Time {
        Time(self.clock.now())
    }

    /// `Delete`: one sync of the namespace `name`.
    async fn delete(&self, name: &str) -> Result<(), NamespaceDeletionError> {
        let namespace = match self.namespaces.get_opt(name).await? {
            Some(ns) if ns.metadata.deletion_timestamp.is_some() => ns,
            _ => return Ok(()),
        };
        let namespace = match self.mark_terminating(namespace).await {
            Err(NamespaceDeletionError::Kube(e)) if is_not_found(&e) => return Ok(()),
            other => other?,
        };
        if namespace.metadata.deletion_timestamp.is_none() {
            return Ok(());
        }
        let finalizers = namespace
            .spec
            .as_ref()
            .and_then(|s| s.finalizers.clone())
            .unwrap_or_default();
        if finalizers.is_empty() {
            return Ok(());
        }
        let (namespace, estimate, errors) = self.delete_all_content(namespace).await;
        if !errors.is_empty() {
            return Err(NamespaceDeletionError::Content(errors));
        }
        if estimate > 0 {
            return Err(NamespaceDeletionError::ResourcesRemaining(estimate));
        }
        match self.finalize(namespace).await {
            Err(NamespaceDeletionError::Kube(e)) if is_not_found(&e) => Ok(()),
            other => other,
        }
    }

    /// `retryOnConflictError(updateNamespaceStatusFunc)`: `status.phase: Terminating`.
    async fn mark_terminating(
        &self,
        mut namespace: Namespace,
    ) -> Result<Namespace, NamespaceDeletionError> {
        for _ in 0..MAX_CONFLICT_RETRIES {
            let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
            if namespace.metadata.deletion_timestamp.is_none() || phase == Some("Terminating") {
                return Ok(namespace);
            }
            let mut terminating = namespace.clone();
            terminating.status.get_or_insert_default().phase = Some("Terminating".to_owned());
            match self
                .namespaces
                .replace_status(&namespace.name_any(), &PostParams::default(), &terminating)
                .await
            {
                Ok(updated) => return Ok(updated),
                Err(e) if is_status(&e, &[409]) => namespace = self.reread(&namespace).await?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(NamespaceDeletionError::Conflicts(MAX_CONFLICT_RETRIES))
    }

    /// The namespace again after a conflict; it must be the same one (uid).
    async fn reread(&self, namespace: &Namespace) -> Result<Namespace, NamespaceDeletionError> {
        let latest = self.namespaces.get(&namespace.name_any()).await?;
        if latest.metadata.uid != namespace.metadata.uid {
            return Err(NamespaceDeletionError::UidChanged);
        }
        Ok(latest)
    }

    /// `retryOnConflictError(finalizeNamespace)`: PUT `namespaces/<name>/finalize` with
    /// `spec.finalizers` less `kubernetes`.
    async fn finalize(&self, mut namespace: Namespace) -> Result<(), NamespaceDeletionError> {
        for _ in 0..MAX_CONFLICT_RETRIES {
            let finalizers = namespace
                .spec
                .as_ref()
                .and_then(|s| s.finalizers.clone())
                .unwrap_or_default();
            let finalized = Namespace {
                metadata: namespace.metadata.clone(),
                spec: Some(NamespaceSpec {
                    finalizers: Some(finalizers_after_finalize(&finalizers)),
                }),
                status: None,
            };
            match self
                .namespaces
                .replace_subresource(
                    "finalize",
                    &namespace.name_any(),
                    &PostParams::default(),
                    &finalized,
                )
                .await
            {
                Ok(_) => {
                    info!("all content deleted: removed the kubernetes finalizer");
                    return Ok(());
                }
                Err(e) if is_status(&e, &[409]) => namespace = self.reread(&namespace).await?,
                Err(e) => return Err(e.into()),
            }
        }
        Err(NamespaceDeletionError::Conflicts(MAX_CONFLICT_RETRIES))
    }

    /// `ServerPreferredNamespacedResources`, filtered to those that support `delete`:
    /// aggregated discovery, else the legacy documents.
    async fn discover(&self) -> Result<Vec<Deletable>, kube::Error> {
        let discovery = match Discovery::new(self.client.clone()).run_aggregated().await {
            Ok(d) => d,
            Err(e) => {
                debug!(error = %e, "no aggregated discovery; asking each group");
                Discovery::new(self.client.clone()).run().await?
            }
        };
        let mut found = Vec::new();
        for group in discovery.groups() {
            for (ar, caps) in group.recommended_resources() {
                if caps.scope != Scope::Namespaced || !caps.supports_operation(verbs::DELETE) {
                    continue;
                }
                found.push(Deletable {
                    list: caps.supports_operation(verbs::LIST),
                    delete_collection: caps.supports_operation(verbs::DELETE_COLLECTION),
                    ar,
                });
            }
        }
        Ok(found)
    }

    /// `deleteAllContent`: the namespace (with its conditions brought up to date), the
    /// estimate of how long what is left needs, and the errors.
    async fn delete_all_content(&self, mut ns: Namespace) -> (Namespace, i64, Vec<String>) {
        let name = ns.name_any();
        let deleted_at = ns
            .metadata
            .deletion_timestamp
            .as_ref()
            .map_or_else(|| self.clock.now(), |t| t.0);
        let mut errors = Vec::new();
        let mut conditions = ConditionUpdate::default();
        let mut estimate = 0;
        let resources = match self.discover().await {
            Ok(r) => r,
            Err(e) => {
                let e = message(&e);
                conditions.discovery_failed(e.clone());
                errors.push(e);
                Vec::new()
            }
        };
        let mut by_resource = BTreeMap::new();
        let mut by_finalizer = BTreeMap::new();
        let mut tally = |r: &Deletable, left: Remaining, estimate: &mut i64| {
            *estimate = (*estimate).max(left.estimate);
            if left.count > 0 {
                by_resource.insert(r.resource_group(), left.count);
                for (f, n) in left.finalizers {
                    *by_finalizer.entry(f).or_insert(0) += n;
                }
            }
        };
        // `OrderedNamespaceDeletion`: the Pods first, and nothing else while any is left.
        let (pods, others): (Vec<_>, Vec<_>) = resources.into_iter().partition(|r| r.is_pods());
        let mut pods_left = false;
        for r in &pods {
            let (left, error) = self.delete_resource(r, &name, deleted_at).await;
            if let Some(e) = error {
                errors.push(format!(
                    "failed to delete pods for namespace: {name}, err: {e}"
                ));
                conditions.content_failed(e);
            }
            pods_left |= left.count > 0;
            tally(r, left, &mut estimate);
        }
        if !pods_left {
            for r in &others {
                let (left, error) = self.delete_resource(r, &name, deleted_at).await;
                if let Some(e) = error {
                    errors.push(e.clone());
                    conditions.content_failed(e);
                }
                tally(r, left, &mut estimate);
            }
            conditions.content_totals(&by_resource, &by_finalizer);
        } else {
            debug!("pods remain: the other resources wait");
        }
        let mut updated = ns.clone();
        let status = updated.status.get_or_insert_default();
        let mut list = status.conditions.take().unwrap_or_default();
        if conditions.apply(&mut list, self.now()) {
            status.conditions = Some(list);
            match self
                .namespaces
                .replace_status(&name, &PostParams::default(), &updated)
                .await
            {
                Ok(written) => ns = written,
                Err(e) => warn!(error = %e, "couldn't update the namespace's status conditions"),
            }
        }
        info!(
            estimate,
            errors = errors.len(),
            remaining = ?by_resource,
            "deleted the namespace's content"
        );
        (ns, estimate, errors)
    }

    /// `deleteAllContentForGroupVersionResource`: what is left of `r` in `namespace`, and the
    /// error if something failed.
    async fn delete_resource(
        &self,
        r: &Deletable,
        namespace: &str,
        deleted_at: jiff::Timestamp,
    ) -> (Remaining, Option<String>) {
        let fail = |estimate: i64, e: &kube::Error| {
            (
                Remaining {
                    estimate,
                    ..Remaining::default()
                },
                Some(message(e)),
            )
        };
        let estimate = if r.is_pods() {
            match Api::<Pod>::namespaced(self.client.clone(), namespace)
                .list(&ListParams::default())
                .await
            {
                Ok(pods) => pods_estimate(&pods.items, deleted_at, self.clock.now()),
                Err(e) => return fail(0, &e),
            }
        } else {
            0
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &r.ar);
        // The garbage collector is not to orphan dependents (it would add the `orphan`
        // finalizer): the namespace is to be emptied.
        let background = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        let mut collected = false;
        if r.delete_collection {
            match api
                .delete_collection(&background, &ListParams::default())
                .await
            {
                Ok(_) => collected = true,
                Err(e) if not_supported(&e) => {}
                Err(e) => return fail(estimate, &e),
            }
        }
        if !collected && r.list {
            match api.list_metadata(&ListParams::default()).await {
                Ok(list) => {
                    for item in list.items {
                        match api.delete(&item.name_any(), &background).await {
                            Ok(_) => {}
                            Err(e) if not_supported(&e) => {}
                            Err(e) => return fail(estimate, &e),
                        }
                    }
                }
                Err(e) if not_supported(&e) => {}
                Err(e) => return fail(estimate, &e),
            }
        }
        if !r.list {
            return (
                Remaining {
                    estimate,
                    ..Remaining::default()
                },
                None,
            );
        }
        let left = match api.list_metadata(&ListParams::default()).await {
            Ok(list) => list
                .items
                .iter()
                .map(|i| i.finalizers().to_vec())
                .collect::<Vec<_>>(),
            Err(e) if not_supported(&e) => Vec::new(),
            Err(e) => return fail(estimate, &e),
        };
        match remaining(estimate, &left, namespace, &r.gvr()) {
            Ok(left) => (left, None),
            Err((left, e)) => (left, Some(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn pod(grace: Option<i64>, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "terminationGracePeriodSeconds": grace},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    /// `estimateGracefulTerminationForPods`: the longest grace period of the pods that are
    /// not terminal; `estimateGracefulTermination`: 0 once that long has passed since the
    /// namespace's deletionTimestamp.
    #[test]
    fn pods_estimate_is_the_longest_grace_period_until_it_has_passed() {
        let pods = [
            pod(Some(30), "Running"),
            pod(Some(90), "Succeeded"),
            pod(Some(60), "Failed"),
            pod(None, "Pending"),
        ];
        let deleted = at("2026-01-01T00:00:00Z");
        assert_eq!(
            pods_estimate(&pods, deleted, at("2026-01-01T00:00:10Z")),
            30
        );
        assert_eq!(pods_estimate(&pods, deleted, at("2026-01-01T00:00:30Z")), 0);
        assert_eq!(pods_estimate(&[], deleted, deleted), 0);
    }

    /// `deleteAllContentForGroupVersionResource`: nothing left is done; what is left with an
    /// estimate is waited for; with finalizers, `finalizerEstimateSeconds` (15); anything
    /// else is "unexpected items still remain".
    #[test]
    fn what_is_left_is_waited_for_only_with_an_estimate_or_finalizers() {
        assert_eq!(
            remaining(30, &[], "ns", "{ v1 pods}"),
            Ok(Remaining::default())
        );
        let held = vec![vec!["example.com/hold".to_owned()], vec![]];
        let left = remaining(0, &held, "ns", "{ v1 configmaps}").unwrap();
        assert_eq!(left.estimate, FINALIZER_ESTIMATE_SECONDS);
        assert_eq!(left.count, 2);
        assert_eq!(left.finalizers["example.com/hold"], 1);
        let terminating = remaining(30, &[vec![]], "ns", "{ v1 pods}").unwrap();
        assert_eq!((terminating.estimate, terminating.count), (30, 1));
        let (left, e) = remaining(0, &[vec![]], "ns", "{apps v1 deployments}").unwrap_err();
        assert_eq!(left.count, 1);
        assert_eq!(
            e,
            "unexpected items still remain in namespace: ns for gvr: {apps v1 deployments}"
        );
    }

    /// The worker requeues a namespace with content left after `estimate/2 + 1` seconds.
    #[test]
    fn content_left_is_looked_at_again_after_half_the_estimate() {
        assert_eq!(requeue_after(0), Duration::from_secs(1));
        assert_eq!(requeue_after(15), Duration::from_secs(8));
        assert_eq!(requeue_after(30), Duration::from_secs(16));
    }

    /// `finalizeNamespace`: only `kubernetes` is removed; the rest is sorted and unique.
    #[test]
    fn finalize_removes_only_the_kubernetes_finalizer() {
        let finalizers: Vec<String> = [
            "kubernetes",
            "z.example.com/b",
            "a.example.com/a",
            "z.example.com/b",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            finalizers_after_finalize(&finalizers),
            ["a.example.com/a", "z.example.com/b"]
        );
        assert!(finalizers_after_finalize(&["kubernetes".to_owned()]).is_empty());
    }

    fn time(s: &str) -> Time {
        Time(at(s))
    }

    /// `namespaceConditionUpdater.Update`: every condition type is written, `True` with the
    /// failure or `False` with its ok reason; a status change moves lastTransitionTime, a
    /// message change alone does not; nothing changed is reported unchanged.
    #[test]
    fn conditions_say_what_is_left_and_what_failed() {
        let mut conditions = Vec::new();
        let mut update = ConditionUpdate::default();
        update.content_totals(&BTreeMap::from([("pods.".to_owned(), 2)]), &BTreeMap::new());
        assert!(update.apply(&mut conditions, time("2026-01-01T00:00:00Z")));
        let types: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, CONDITION_TYPES);
        let remaining = &conditions[3];
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.reason.as_deref(), Some("SomeResourcesRemain"));
        assert_eq!(
            remaining.message.as_deref(),
            Some("Some resources are remaining: pods. has 2 resource instances")
        );
        let discovered = &conditions[0];
        assert_eq!(
            (discovered.status.as_str(), discovered.reason.as_deref()),
            ("False", Some("ResourcesDiscovered"))
        );

        // Same again: unchanged.
        let mut update = ConditionUpdate::default();
        update.content_totals(&BTreeMap::from([("pods.".to_owned(), 2)]), &BTreeMap::new());
        assert!(!update.apply(&mut conditions, time("2026-01-01T00:00:05Z")));

        // A content failure; the pods gone.
        let mut update = ConditionUpdate::default();
        update.content_failed("b failed".to_owned());
        update.content_failed("a failed".to_owned());
        assert!(update.apply(&mut conditions, time("2026-01-01T00:00:10Z")));
        let failure = &conditions[2];
        assert_eq!(failure.status, "True");
        assert_eq!(
            failure.message.as_deref(),
            Some("Failed to delete all resource types, 2 remaining: a failed, b failed")
        );
        assert_eq!(
            failure.last_transition_time,
            Some(time("2026-01-01T00:00:10Z"))
        );
        let removed = &conditions[3];
        assert_eq!(
            (removed.status.as_str(), removed.reason.as_deref()),
            ("False", Some("ContentRemoved"))
        );
        assert_eq!(
            removed.last_transition_time,
            Some(time("2026-01-01T00:00:10Z"))
        );
        assert_eq!(
            conditions[0].last_transition_time,
            Some(time("2026-01-01T00:00:00Z"))
        );
    }

    /// Go's `utilerrors.NewAggregate(...).Error()`: one error is its message, several are
    /// bracketed.
    #[test]
    fn several_errors_read_as_go_aggregates_them() {
        let one = NamespaceDeletionError::Content(vec!["a".to_owned()]);
        assert_eq!(one.to_string(), "a");
        let two = NamespaceDeletionError::Content(vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(two.to_string(), "[a, b]");
    }
}
