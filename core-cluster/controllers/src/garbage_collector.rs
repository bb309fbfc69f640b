//! The garbage collector: `metadata.ownerReferences` with background, foreground and orphan
//! propagation.
//!
//! # What upstream does (`pkg/controller/garbagecollector`)
//!
//! Metadata informers on every resource that supports list/watch/delete (core and
//! `events.k8s.io` events excluded) feed an owner→dependent graph. For each item,
//! `attemptToDeleteItem`:
//!
//! - an item being deleted that is not deleting its dependents is left alone;
//! - an owner with `foregroundDeletion` and a `deletionTimestamp` has its dependents deleted
//!   and keeps the finalizer until no dependent with `blockOwnerDeletion: true` remains,
//!   then the finalizer is removed;
//! - an owner with `orphan` and a `deletionTimestamp` has its ownerReference removed from
//!   every dependent, then loses the `orphan` finalizer;
//! - a dependent's references are classified: *dangling* (owner absent, or its UID differs),
//!   *waiting* (owner has `foregroundDeletion` and a `deletionTimestamp`) or *solid*. With a
//!   solid owner the dangling and waiting references are patched out; if owners are waiting
//!   and the item has dependents of its own it is deleted with Foreground; otherwise it is
//!   deleted with preconditions (uid + resourceVersion) and the policy its own finalizers
//!   ask for (Orphan, Foreground, else Background);
//! - a namespaced dependent is only owned by objects of its own namespace (or cluster-scoped
//!   ones); a reference to an owner that lives in another namespace is dangling, and the
//!   Warning event `OwnerRefInvalidNamespace` ("ownerRef [apiVersion/kind, namespace: ns,
//!   name: n, uid: u] does not exist in namespace "ns"") is recorded on the dependent. A
//!   cluster-scoped dependent referring to a namespaced kind gets the same event and is not
//!   retried (the error is permanent).
//!
//! # Where we differ
//!
//! - Full-object watches (`DynamicObject`) rather than metadata-only ones, on the resources
//!   discovery reports at start (no rediscovery of resources added later).
//! - One worker instead of `--concurrent-gc-syncs` (20).
//! - Owners are looked up with a live GET each time (no `absentOwnerCache`); an ownerReference
//!   to a kind the server does not serve is treated as solid and logged (upstream retries).
//! - A foreground-deleting dependent's references are not first patched to
//!   `blockOwnerDeletion=false` to break cycles.
//! - References are patched out with a JSON merge patch carrying `resourceVersion` (409 and
//!   retry on a race) instead of a strategic merge patch keyed by uid.
//! - The cross-namespace event is recorded when the owner's UID is known to live in another
//!   namespace (upstream infers it from its graph in the same way).

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use futures::{StreamExt, stream::BoxStream};
use k8s_openapi::{
    api::core::v1::ObjectReference, apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions,
        PropagationPolicy,
    },
    discovery::{Discovery, Scope, verbs},
    runtime::{
        WatchStreamExt,
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        watcher,
    },
};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use ccm_workqueue::{Queue, RateLimiter, sleep_until};

/// The finalizer that makes a DELETE wait for blocking dependents.
pub const FOREGROUND_FINALIZER: &str = "foregroundDeletion";
/// The finalizer that makes a DELETE orphan the dependents.
pub const ORPHAN_FINALIZER: &str = "orphan";

/// Errors of one garbage-collection attempt (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// The API server refused or failed a request.
    #[error("kube API: {0}")]
    Kube(#[from] kube::Error),
    /// A foreground-deleting owner still has blocking dependents.
    #[error("{0} blocking dependents remain")]
    Blocked(usize),
}

/// A served kind the collector watches.
#[derive(Clone, Debug)]
struct Kind {
    ar: ApiResource,
    namespaced: bool,
}

/// An object's place: kind index, namespace, name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    kind: usize,
    namespace: Option<String>,
    name: String,
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{}/{}#{}", ns, self.name, self.kind),
            None => write!(f, "{}#{}", self.name, self.kind),
        }
    }
}

/// What the graph keeps about an object.
#[derive(Clone, Debug)]
struct Meta {
    uid: String,
    owners: Vec<OwnerReference>,
    /// Has a deletionTimestamp (as last seen).
    deleting: bool,
}

/// The owner→dependent graph, built from the watches.
#[derive(Debug, Default)]
struct Graph {
    objects: HashMap<Key, Meta>,
    by_uid: HashMap<String, Key>,
    dependents: HashMap<String, HashSet<Key>>,
}

impl Graph {
    /// Records `key`; returns the previous entry.
    fn upsert(&mut self, key: Key, meta: Meta) -> Option<Meta> {
        let old = self.remove(&key);
        self.by_uid.insert(meta.uid.clone(), key.clone());
        for r in &meta.owners {
            self.dependents
                .entry(r.uid.clone())
                .or_default()
                .insert(key.clone());
        }
        self.objects.insert(key, meta);
        old
    }

    fn remove(&mut self, key: &Key) -> Option<Meta> {
        let old = self.objects.remove(key)?;
        if self.by_uid.get(&old.uid) == Some(key) {
            self.by_uid.remove(&old.uid);
        }
        for r in &old.owners {
            if let Some(set) = self.dependents.get_mut(&r.uid) {
                set.remove(key);
                if set.is_empty() {
                    self.dependents.remove(&r.uid);
                }
            }
        }
        Some(old)
    }

    fn dependents_of(&self, uid: &str) -> Vec<Key> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// The garbage collector: watches every served kind but events and deletes, orphans or
/// waits for dependents as their owners' DELETE asked.
pub struct GarbageCollector {
    client: Client,
    recorder: Recorder,
    kinds: Vec<Kind>,
    graph: Graph,
}

impl std::fmt::Debug for GarbageCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GarbageCollector")
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

impl GarbageCollector {
    /// A collector talking to the API server through `client`.
    pub fn new(client: Client) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "garbage-collector-controller".into(),
                instance: None,
            },
        );
        Self {
            client,
            recorder,
            kinds: Vec::new(),
            graph: Graph::default(),
        }
    }

    /// Runs until `shutdown` is cancelled.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(200);
        loop {
            match Discovery::new(self.client.clone()).run().await {
                Ok(d) => {
                    self.kinds = collectable_kinds(&d);
                    break;
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff, "GC discovery failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        info!(
            kinds = ?self.kinds.iter().map(|k| format!("{}/{}", k.ar.api_version, k.ar.kind)).collect::<Vec<_>>(),
            "garbage collector watching"
        );
        let streams: Vec<
            BoxStream<'static, (usize, watcher::Result<watcher::Event<DynamicObject>>)>,
        > = self
            .kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &k.ar);
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .map(move |e| (i, e))
                    .boxed()
            })
            .collect();
        let mut events = futures::stream::select_all(streams);
        let mut queue: Queue<Key> = Queue::new(RateLimiter::exponential(
            Duration::from_millis(50),
            Duration::from_secs(60),
        ));
        let mut relisting: HashMap<usize, HashSet<Key>> = HashMap::new();
        loop {
            if let Some(key) = queue.try_get() {
                let span =
                    info_span!("gc_attempt", object = %key, kind = %self.kinds[key.kind].ar.kind);
                let result = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = self.attempt(&key, &mut queue).instrument(span.clone()) => r,
                };
                match result {
                    Ok(()) => queue.forget(&key),
                    Err(e) => {
                        let delay = queue.add_rate_limited(key.clone());
                        span.in_scope(
                            || debug!(error = %e, retry_in = ?delay, "GC attempt will be retried"),
                        );
                    }
                }
                queue.done(&key);
                continue;
            }
            let deadline = queue.next_deadline();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = sleep_until(deadline) => {}
                ev = events.next() => match ev {
                    None => return,
                    Some((_, Err(e))) => warn!(error = %e, "GC watch failed; retrying"),
                    Some((i, Ok(watcher::Event::Init))) => {
                        relisting.insert(i, HashSet::new());
                    }
                    Some((i, Ok(watcher::Event::InitApply(obj)))) => {
                        if let Some(key) = self.observe(i, &obj, &mut queue) {
                            relisting.entry(i).or_default().insert(key);
                        }
                    }
                    Some((i, Ok(watcher::Event::InitDone))) => {
                        let seen = relisting.remove(&i).unwrap_or_default();
                        let gone: Vec<Key> = self
                            .graph
                            .objects
                            .keys()
                            .filter(|k| k.kind == i && !seen.contains(*k))
                            .cloned()
                            .collect();
                        for key in gone {
                            self.forget_object(&key, &mut queue);
                        }
                    }
                    Some((i, Ok(watcher::Event::Apply(obj)))) => {
                        self.observe(i, &obj, &mut queue);
                    }
                    Some((i, Ok(watcher::Event::Delete(obj)))) => {
                        let key = key_of(i, &self.kinds[i], &obj);
                        self.forget_object(&key, &mut queue);
                    }
                },
            }
        }
    }

    /// Records an object seen by a watch and queues what it may affect.
    fn observe(&mut self, kind: usize, obj: &DynamicObject, queue: &mut Queue<Key>) -> Option<Key> {
        let key = key_of(kind, &self.kinds[kind], obj);
        let uid = obj.metadata.uid.clone()?;
        let owners = obj.metadata.owner_references.clone().unwrap_or_default();
        let deleting = obj.metadata.deletion_timestamp.is_some();
        let finalizers = obj.finalizers();
        let has_gc_finalizer = finalizers
            .iter()
            .any(|f| f == FOREGROUND_FINALIZER || f == ORPHAN_FINALIZER);
        let old = self.graph.upsert(
            key.clone(),
            Meta {
                uid: uid.clone(),
                owners: owners.clone(),
                deleting,
            },
        );
        // Like upstream's graph builder, react to changes only: a new object, changed owner
        // references, or a change of deletion state (status updates of pods and the like
        // cost nothing).
        let changed = match &old {
            None => true,
            Some(m) => m.uid != uid || m.owners != owners || m.deleting != deleting,
        };
        if !changed {
            return Some(key);
        }
        if let Some(m) = &old
            && m.uid != uid
        {
            // Recreated under the same name: the old object's dependents lost their owner.
            for dep in self.graph.dependents_of(&m.uid) {
                queue.add(dep);
            }
        }
        if !owners.is_empty() || (deleting && has_gc_finalizer) {
            queue.add(key.clone());
        }
        // Owners being deleted (waiting on their dependents) re-check when a dependent's
        // references change.
        let old_owners = old.map(|m| m.owners).unwrap_or_default();
        for r in owners.iter().chain(old_owners.iter()) {
            self.requeue_deleting_owner(&r.uid, queue);
        }
        Some(key)
    }

    /// Drops an object that is gone and queues its dependents and owners.
    fn forget_object(&mut self, key: &Key, queue: &mut Queue<Key>) {
        let Some(old) = self.graph.remove(key) else {
            return;
        };
        for dep in self.graph.dependents_of(&old.uid) {
            queue.add(dep);
        }
        for r in &old.owners {
            self.requeue_deleting_owner(&r.uid, queue);
        }
    }

    fn requeue_deleting_owner(&self, uid: &str, queue: &mut Queue<Key>) {
        if let Some(owner) = self.graph.by_uid.get(uid)
            && self.graph.objects.get(owner).is_some_and(|m| m.deleting)
        {
            queue.add(owner.clone());
        }
    }

    fn api(&self, kind: usize, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = &self.kinds[kind].ar;
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, ar),
            None => Api::all_with(self.client.clone(), ar),
        }
    }

    /// upstream `attemptToDeleteItem`.
    async fn attempt(&mut self, key: &Key, queue: &mut Queue<Key>) -> Result<(), GcError> {
        let api = self.api(key.kind, key.namespace.as_deref());
        let Some(obj) = api.get_opt(&key.name).await? else {
            self.forget_object(key, queue);
            return Ok(());
        };
        let finalizers = obj.finalizers().to_vec();
        if obj.metadata.deletion_timestamp.is_some() {
            if finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
                return self.process_deleting_dependents(key, &obj, queue).await;
            }
            if finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
                return self.orphan_dependents(key, &obj).await;
            }
            return Ok(());
        }
        let refs = obj.metadata.owner_references.clone().unwrap_or_default();
        if refs.is_empty() {
            return Ok(());
        }
        let mut solid = Vec::new();
        let mut dangling = Vec::new();
        let mut waiting = Vec::new();
        for r in &refs {
            match self.classify(key, &obj, r).await? {
                Class::Solid => solid.push(r.uid.clone()),
                Class::Dangling => dangling.push(r.uid.clone()),
                Class::Waiting => waiting.push(r.uid.clone()),
                Class::Invalid => return Ok(()),
            }
        }
        debug!(?solid, ?dangling, ?waiting, "classified owner references");
        if !solid.is_empty() {
            if dangling.is_empty() && waiting.is_empty() {
                return Ok(());
            }
            let keep: Vec<&OwnerReference> = refs
                .iter()
                .filter(|r| !dangling.contains(&r.uid) && !waiting.contains(&r.uid))
                .collect();
            info!(removed = ?dangling.iter().chain(&waiting).collect::<Vec<_>>(), "removing dangling owner references");
            let patch = json!({"metadata": {
                "resourceVersion": obj.resource_version(),
                "ownerReferences": keep,
            }});
            ignore_not_found(
                api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
            return Ok(());
        }
        let uid = obj.uid().unwrap_or_default();
        let policy = if !waiting.is_empty() && !self.graph.dependents_of(&uid).is_empty() {
            PropagationPolicy::Foreground
        } else if finalizers.iter().any(|f| f == ORPHAN_FINALIZER) {
            PropagationPolicy::Orphan
        } else if finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
            PropagationPolicy::Foreground
        } else {
            PropagationPolicy::Background
        };
        info!(
            ?policy,
            "deleting object whose owners are gone or being deleted"
        );
        let dp = DeleteParams {
            propagation_policy: Some(policy),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: obj.resource_version(),
            }),
            ..DeleteParams::default()
        };
        ignore_not_found(api.delete(&key.name, &dp).await.map(|_| ()))?;
        Ok(())
    }

    async fn classify(
        &self,
        key: &Key,
        obj: &DynamicObject,
        r: &OwnerReference,
    ) -> Result<Class, GcError> {
        let group = r.api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let Some(owner_kind) = self
            .kinds
            .iter()
            .position(|k| k.ar.group == group && k.ar.kind == r.kind)
        else {
            warn!(owner_api_version = %r.api_version, owner_kind = %r.kind, owner = %r.name, "owner kind not served; reference kept");
            return Ok(Class::Solid);
        };
        if r.name.is_empty() || r.uid.is_empty() {
            warn!(owner = %r.name, uid = %r.uid, "malformed owner reference; kept");
            return Ok(Class::Solid);
        }
        let owner_namespaced = self.kinds[owner_kind].namespaced;
        if owner_namespaced && key.namespace.is_none() {
            warn!(owner_kind = %r.kind, owner = %r.name, "cluster-scoped object refers to a namespaced owner");
            self.invalid_namespace_event(key, obj, r).await;
            return Ok(Class::Invalid);
        }
        let ns = if owner_namespaced {
            key.namespace.as_deref()
        } else {
            None
        };
        let owner = self.api(owner_kind, ns).get_opt(&r.name).await?;
        let class = match owner {
            Some(o) if o.uid().as_deref() == Some(r.uid.as_str()) => {
                if o.metadata.deletion_timestamp.is_some()
                    && o.finalizers().iter().any(|f| f == FOREGROUND_FINALIZER)
                {
                    Class::Waiting
                } else {
                    Class::Solid
                }
            }
            _ => Class::Dangling,
        };
        if class == Class::Dangling && owner_namespaced {
            // The UID lives in another namespace: a cross-namespace reference.
            let elsewhere = self
                .graph
                .by_uid
                .get(&r.uid)
                .is_some_and(|k| k.namespace != key.namespace);
            if elsewhere {
                self.invalid_namespace_event(key, obj, r).await;
            }
        }
        Ok(class)
    }

    async fn invalid_namespace_event(&self, key: &Key, obj: &DynamicObject, r: &OwnerReference) {
        let ns = key.namespace.clone().unwrap_or_default();
        let note = format!(
            "ownerRef [{}/{}, namespace: {}, name: {}, uid: {}] does not exist in namespace {:?}",
            r.api_version, r.kind, ns, r.name, r.uid, ns
        );
        let ar = &self.kinds[key.kind].ar;
        let reference = ObjectReference {
            api_version: Some(ar.api_version.clone()),
            kind: Some(ar.kind.clone()),
            namespace: key.namespace.clone(),
            name: Some(key.name.clone()),
            uid: obj.uid(),
            ..ObjectReference::default()
        };
        let ev = KubeEvent {
            type_: EventType::Warning,
            reason: "OwnerRefInvalidNamespace".into(),
            note: Some(note),
            action: "GarbageCollect".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            warn!(error = %e, "failed to record OwnerRefInvalidNamespace event");
        }
    }

    /// upstream `processDeletingDependentsItem`: delete the dependents, drop the finalizer
    /// once no blocking dependent is left.
    async fn process_deleting_dependents(
        &mut self,
        key: &Key,
        owner: &DynamicObject,
        queue: &mut Queue<Key>,
    ) -> Result<(), GcError> {
        let uid = owner.uid().unwrap_or_default();
        let deps = self.graph.dependents_of(&uid);
        let blocking = deps
            .iter()
            .filter(|d| {
                self.graph.objects.get(*d).is_some_and(|m| {
                    m.owners
                        .iter()
                        .any(|r| r.uid == uid && r.block_owner_deletion == Some(true))
                })
            })
            .count();
        if blocking == 0 {
            info!("no blocking dependents left; removing the foregroundDeletion finalizer");
            return self
                .remove_finalizer(key, owner, FOREGROUND_FINALIZER)
                .await;
        }
        for dep in deps {
            queue.add(dep);
        }
        Err(GcError::Blocked(blocking))
    }

    /// upstream `orphanDependents` + `removeFinalizer(orphan)`.
    async fn orphan_dependents(&mut self, key: &Key, owner: &DynamicObject) -> Result<(), GcError> {
        let uid = owner.uid().unwrap_or_default();
        for dep in self.graph.dependents_of(&uid) {
            let api = self.api(dep.kind, dep.namespace.as_deref());
            let Some(obj) = api.get_opt(&dep.name).await? else {
                continue;
            };
            let refs = obj.metadata.owner_references.clone().unwrap_or_default();
            if !refs.iter().any(|r| r.uid == uid) {
                continue;
            }
            let keep: Vec<&OwnerReference> = refs.iter().filter(|r| r.uid != uid).collect();
            let patch = json!({"metadata": {
                "resourceVersion": obj.resource_version(),
                "ownerReferences": keep,
            }});
            info!(dependent = %dep, "orphaning dependent");
            ignore_not_found(
                api.patch(&dep.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await,
            )?;
        }
        self.remove_finalizer(key, owner, ORPHAN_FINALIZER).await
    }

    async fn remove_finalizer(
        &self,
        key: &Key,
        obj: &DynamicObject,
        finalizer: &str,
    ) -> Result<(), GcError> {
        let rest: Vec<&String> = obj
            .finalizers()
            .iter()
            .filter(|f| *f != finalizer)
            .collect();
        let patch = json!({"metadata": {
            "resourceVersion": obj.resource_version(),
            "finalizers": rest,
        }});
        let api = self.api(key.kind, key.namespace.as_deref());
        ignore_not_found(
            api.patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        )?;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Solid,
    Dangling,
    Waiting,
    /// A permanent error (cluster-scoped dependent, namespaced owner): leave the item.
    Invalid,
}

fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

fn key_of(kind: usize, k: &Kind, obj: &DynamicObject) -> Key {
    Key {
        kind,
        namespace: if k.namespaced { obj.namespace() } else { None },
        name: obj.name_any(),
    }
}

/// Every served kind that supports list, watch and delete, except events.
fn collectable_kinds(d: &Discovery) -> Vec<Kind> {
    let mut kinds = Vec::new();
    for group in d.groups() {
        for (ar, caps) in group.recommended_resources() {
            let is_event =
                ar.kind == "Event" && (ar.group.is_empty() || ar.group == "events.k8s.io");
            if is_event
                || !caps.supports_operation(verbs::LIST)
                || !caps.supports_operation(verbs::WATCH)
                || !caps.supports_operation(verbs::DELETE)
            {
                continue;
            }
            kinds.push(Kind {
                namespaced: caps.scope == Scope::Namespaced,
                ar,
            });
        }
    }
    kinds
}
