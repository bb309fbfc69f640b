//! Simulated containers and kubelet's container garbage collection
//! (`pkg/kubelet/container/container_gc.go`, `pkg/kubelet/kuberuntime/kuberuntime_gc.go`).
//!
//! Each node keeps the containers of its pods: running ones, and dead ones left by
//! container restarts (the previous instance), by pods that finished and by pods that were
//! deleted. Every [`ContainerGcConfig::period`] (kubelet's `ContainerGCPeriod`, one minute)
//! the node collects dead containers as `evictContainers` does:
//!
//! - only dead containers created at least `MinAge` ago are *evictable*
//!   (`evictableContainers`); they are grouped in *evict units*, one per pod uid and
//!   container name, newest first;
//! - every evictable container of a deleted pod is removed (`ShouldPodContentBeRemoved`),
//!   so a deleted pod's dead containers go once they are older than `MinAge`;
//! - each unit keeps at most `MaxPerPodContainer` (`enforceMaxContainersPerEvictUnit`);
//! - when more than `MaxContainers` remain, each unit is cut to `MaxContainers / units`,
//!   **lowered down to 1** when that conflicts (fewer containers allowed than units), and
//!   then the oldest containers overall go until `MaxContainers` remain.
//!
//! A negative `MaxPerPodContainer` or `MaxContainers` means no limit (kubelet's
//! `--maximum-dead-containers-per-container` 1, `--maximum-dead-containers` -1,
//! `--minimum-container-ttl-duration` 0 are the defaults). Each dead container takes
//! [`ContainerGcConfig::dead_container_bytes`] of the node filesystem (its writable layer
//! and logs), which the eviction manager's `nodefs.available` signal counts.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;

/// Container GC settings (kubelet's `GCPolicy` and flags, with their defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerGcConfig {
    /// `--minimum-container-ttl-duration` (`MinAge`, 0): a dead container younger than
    /// this is never collected.
    pub min_age: Duration,
    /// `--maximum-dead-containers-per-container` (`MaxPerPodContainer`, 1); negative: no
    /// limit.
    pub max_per_pod_container: i32,
    /// `--maximum-dead-containers` (`MaxContainers`, -1 = no limit).
    pub max_containers: i32,
    /// kubelet's `ContainerGCPeriod` (1 minute).
    pub period: Duration,
    /// Bytes of the node filesystem a dead container takes (writable layer and logs,
    /// 10 MB).
    pub dead_container_bytes: u64,
}

impl Default for ContainerGcConfig {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
            period: Duration::from_secs(60),
            dead_container_bytes: 10_000_000,
        }
    }
}

/// A dead container of the simulated runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadContainer {
    /// The pod's uid.
    pub pod_uid: String,
    /// The container's name in the pod.
    pub name: String,
    /// Which instance it was: 0 for the first run, then one more per restart.
    pub attempt: u32,
    /// When the instance was created.
    pub created: Instant,
}

/// One node's containers.
#[derive(Debug, Default)]
pub struct ContainerStore {
    /// Running containers, by pod uid: (name, attempt, created).
    running: HashMap<String, Vec<(String, u32, Instant)>>,
    dead: Vec<DeadContainer>,
    /// Pods deleted from the API: their content is to be removed.
    deleted: HashSet<String>,
    /// Pods in a terminal phase (their containers will not run again).
    finished: HashSet<String>,
}

impl ContainerStore {
    /// A pod's containers start (first attempt).
    pub fn start_pod(&mut self, uid: &str, names: impl IntoIterator<Item = String>, now: Instant) {
        let list = names.into_iter().map(|n| (n, 0, now)).collect();
        self.running.insert(uid.to_owned(), list);
    }

    /// A pod's running containers exited. With `restart` each is replaced by a new
    /// instance (the exited one is left dead, as a restart does); without, the pod is
    /// finished and all its containers are dead.
    pub fn containers_exited(&mut self, uid: &str, restart: bool, now: Instant) {
        let Some(list) = self.running.remove(uid) else {
            return;
        };
        let mut next = Vec::new();
        for (name, attempt, created) in list {
            self.dead.push(DeadContainer {
                pod_uid: uid.to_owned(),
                name: name.clone(),
                attempt,
                created,
            });
            if restart {
                next.push((name, attempt + 1, now));
            }
        }
        if restart {
            self.running.insert(uid.to_owned(), next);
        } else {
            self.finished.insert(uid.to_owned());
        }
    }

    /// The pod was deleted from the API: its running containers are killed (left dead)
    /// and all its dead containers become collectable once older than `MinAge`.
    pub fn pod_deleted(&mut self, uid: &str, now: Instant) {
        self.containers_exited(uid, false, now);
        self.finished.remove(uid);
        if self.dead.iter().any(|d| d.pod_uid == uid) {
            self.deleted.insert(uid.to_owned());
        }
    }

    /// The dead containers, oldest first.
    pub fn dead(&self) -> Vec<DeadContainer> {
        let mut all = self.dead.clone();
        all.sort_by_key(|d| d.created);
        all
    }

    /// How many containers are running.
    pub fn running_count(&self) -> usize {
        self.running.values().map(Vec::len).sum()
    }

    /// Bytes the dead containers take.
    pub fn dead_bytes(&self, config: &ContainerGcConfig) -> u64 {
        (self.dead.len() as u64).saturating_mul(config.dead_container_bytes)
    }

    /// One collection (`GarbageCollect` → `evictContainers`); returns what was removed.
    /// `evict_finished_pods` also removes every evictable container of finished pods
    /// (`DeleteAllUnusedContainers`, the eviction manager's reclaim).
    pub fn collect(
        &mut self,
        policy: &ContainerGcConfig,
        evict_finished_pods: bool,
        now: Instant,
    ) -> Vec<DeadContainer> {
        // evictableContainers: dead, created before now - MinAge; by (uid, name), newest
        // first.
        let mut units: HashMap<(String, String), Vec<DeadContainer>> = HashMap::new();
        let mut keep = Vec::new();
        for d in self.dead.drain(..) {
            if now.saturating_duration_since(d.created) >= policy.min_age {
                units
                    .entry((d.pod_uid.clone(), d.name.clone()))
                    .or_default()
                    .push(d);
            } else {
                keep.push(d);
            }
        }
        for unit in units.values_mut() {
            unit.sort_by(|a, b| b.created.cmp(&a.created).then(b.attempt.cmp(&a.attempt)));
        }
        let mut removed = Vec::new();
        // Content of deleted pods (and of finished ones, when reclaiming) goes whole.
        units.retain(|(uid, _), unit| {
            let remove =
                self.deleted.contains(uid) || (evict_finished_pods && self.finished.contains(uid));
            if remove {
                removed.append(unit);
            }
            !remove
        });
        if policy.max_per_pod_container >= 0 {
            enforce_per_unit(
                &mut units,
                policy.max_per_pod_container as usize,
                &mut removed,
            );
        }
        let count = |units: &HashMap<_, Vec<DeadContainer>>| units.values().map(Vec::len).sum();
        if policy.max_containers >= 0 && count(&units) > policy.max_containers as usize {
            let max = policy.max_containers as usize;
            // Leave an equal number of containers per evict unit, lowered to 1 at least.
            let per_unit = (max / units.len().max(1)).max(1);
            enforce_per_unit(&mut units, per_unit, &mut removed);
            let left: usize = count(&units);
            if left > max {
                let mut flattened: Vec<DeadContainer> =
                    units.drain().flat_map(|(_, u)| u).collect();
                flattened.sort_by_key(|b| std::cmp::Reverse(b.created));
                removed.extend(flattened.split_off(max));
                keep.extend(flattened);
            }
        }
        keep.extend(units.into_values().flatten());
        self.dead = keep;
        // A deleted pod whose every dead container is gone is forgotten.
        let dead_pods: HashSet<&str> = self.dead.iter().map(|d| d.pod_uid.as_str()).collect();
        self.deleted.retain(|uid| dead_pods.contains(uid.as_str()));
        self.finished
            .retain(|uid| dead_pods.contains(uid.as_str()) || self.running.contains_key(uid));
        removed.sort_by_key(|d| d.created);
        removed
    }
}

/// `enforceMaxContainersPerEvictUnit`: each unit keeps its `max` newest.
fn enforce_per_unit(
    units: &mut HashMap<(String, String), Vec<DeadContainer>>,
    max: usize,
    removed: &mut Vec<DeadContainer>,
) {
    for unit in units.values_mut() {
        if unit.len() > max {
            removed.extend(unit.split_off(max));
        }
    }
    units.retain(|_, u| !u.is_empty());
}

/// Runs container GC on every node each period.
pub(crate) async fn run_container_gc(
    shared: Arc<crate::Shared>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let config = shared.config.container_gc.clone();
    if config.period.is_zero() {
        return;
    }
    let mut tick = tokio::time::interval_at(Instant::now() + config.period, config.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let nodes: Vec<Arc<crate::NodeState>> = shared.nodes.read().values().cloned().collect();
        for node in nodes {
            if shared.heartbeat_stopped(&node) {
                continue;
            }
            let removed = node
                .containers
                .lock()
                .collect(&config, false, Instant::now());
            if !removed.is_empty() {
                tracing::debug!(node = %node.name, removed = removed.len(), "container GC");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min_age: u64, per_pod: i32, max: i32) -> ContainerGcConfig {
        ContainerGcConfig {
            min_age: Duration::from_secs(min_age),
            max_per_pod_container: per_pod,
            max_containers: max,
            ..ContainerGcConfig::default()
        }
    }

    /// A pod whose container restarted `restarts` times, one second apart.
    async fn restarting(s: &mut ContainerStore, uid: &str, restarts: u32) {
        s.start_pod(uid, ["c".to_owned()], Instant::now());
        for _ in 0..restarts {
            tokio::time::advance(Duration::from_secs(1)).await;
            s.containers_exited(uid, true, Instant::now());
        }
    }

    fn attempts(removed: &[DeadContainer], uid: &str) -> Vec<u32> {
        let mut a: Vec<u32> = removed
            .iter()
            .filter(|d| d.pod_uid == uid)
            .map(|d| d.attempt)
            .collect();
        a.sort_unstable();
        a
    }

    /// `kuberuntime_gc.go` `enforceMaxContainersPerEvictUnit`: each (pod, container) keeps
    /// its `MaxPerPodContainer` newest dead instances (default 1); the running one is
    /// never touched.
    #[tokio::test(start_paused = true)]
    async fn max_per_pod_container_keeps_the_newest_dead_instances_of_each_container() {
        let mut s = ContainerStore::default();
        restarting(&mut s, "p", 4).await; // dead attempts 0..=3, attempt 4 running.
        let removed = s.collect(&policy(0, 1, -1), false, Instant::now());
        assert_eq!(attempts(&removed, "p"), [0, 1, 2]);
        assert_eq!(s.dead().iter().map(|d| d.attempt).collect::<Vec<_>>(), [3]);
        assert_eq!(s.running_count(), 1);
        // A negative MaxPerPodContainer keeps them all.
        let mut s = ContainerStore::default();
        restarting(&mut s, "p", 4).await;
        assert!(
            s.collect(&policy(0, -1, -1), false, Instant::now())
                .is_empty()
        );
        assert_eq!(s.dead().len(), 4);
    }

    /// `evictableContainers`: a dead container created less than `MinAge` ago is not
    /// evictable, whatever the limits.
    #[tokio::test(start_paused = true)]
    async fn dead_containers_younger_than_min_age_are_kept() {
        let mut s = ContainerStore::default();
        restarting(&mut s, "p", 3).await; // created at t0, t0+1, t0+2.
        let removed = s.collect(&policy(2, 0, 0), false, Instant::now()); // now = t0+3
        assert_eq!(
            attempts(&removed, "p"),
            [0, 1],
            "created at least MinAge ago"
        );
        assert_eq!(s.dead().len(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            attempts(&s.collect(&policy(2, 0, 0), false, Instant::now()), "p"),
            [2]
        );
    }

    /// `evictContainers`: when `MaxContainers / evict units` is below
    /// `MaxPerPodContainer`, each unit is cut to that share, and to 1 at least when there
    /// are more units than `MaxContainers` allows; then the oldest go until `MaxContainers`
    /// remain.
    #[tokio::test(start_paused = true)]
    async fn max_per_pod_container_is_lowered_down_to_one_when_it_conflicts_with_max_containers() {
        // Two units of 4 dead each, MaxPerPodContainer 3, MaxContainers 4: 3+3 > 4, so
        // each unit keeps 4 / 2 = 2.
        let mut s = ContainerStore::default();
        restarting(&mut s, "a", 4).await;
        restarting(&mut s, "b", 4).await;
        let removed = s.collect(&policy(0, 3, 4), false, Instant::now());
        assert_eq!(attempts(&removed, "a"), [0, 1]);
        assert_eq!(attempts(&removed, "b"), [0, 1]);
        assert_eq!(s.dead().len(), 4);

        // Three units of 2 dead each, MaxContainers 2: 2 / 3 = 0, lowered to 1 per unit;
        // 3 > 2 still, so the oldest remaining one (a's newest) goes too.
        let mut s = ContainerStore::default();
        restarting(&mut s, "a", 2).await;
        restarting(&mut s, "b", 2).await;
        restarting(&mut s, "c", 2).await;
        let removed = s.collect(&policy(0, 5, 2), false, Instant::now());
        assert_eq!(attempts(&removed, "a"), [0, 1]);
        assert_eq!(attempts(&removed, "b"), [0]);
        assert_eq!(attempts(&removed, "c"), [0]);
        let left: Vec<(String, u32)> = s
            .dead()
            .into_iter()
            .map(|d| (d.pod_uid, d.attempt))
            .collect();
        assert_eq!(left, [("b".to_owned(), 1), ("c".to_owned(), 1)]);
    }

    /// `ShouldPodContentBeRemoved`: every dead container of a deleted pod goes, once older
    /// than `MinAge`; a finished pod that still exists keeps `MaxPerPodContainer`.
    #[tokio::test(start_paused = true)]
    async fn dead_containers_of_deleted_pods_go_once_older_than_min_age() {
        let mut s = ContainerStore::default();
        s.start_pod("done", ["c".to_owned()], Instant::now());
        s.start_pod(
            "gone",
            ["c".to_owned(), "sidecar".to_owned()],
            Instant::now(),
        );
        tokio::time::advance(Duration::from_secs(5)).await;
        s.containers_exited("done", false, Instant::now());
        s.pod_deleted("gone", Instant::now());
        let p = policy(60, 1, -1);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(
            s.collect(&p, false, Instant::now()).is_empty(),
            "younger than MinAge"
        );
        tokio::time::advance(Duration::from_secs(30)).await;
        let removed = s.collect(&p, false, Instant::now());
        assert_eq!(removed.len(), 2);
        assert!(removed.iter().all(|d| d.pod_uid == "gone"));
        assert_eq!(s.dead().len(), 1, "the finished pod keeps its container");
        // The eviction manager's DeleteAllUnusedContainers takes finished pods' too.
        assert_eq!(s.collect(&p, true, Instant::now()).len(), 1);
        assert!(s.dead().is_empty());
    }
}
