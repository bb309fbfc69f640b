//! A small work queue shared by the controllers: deduplicated keys, per-key exponential
//! backoff on failure (like client-go's rate-limited workqueue), every timer on tokio time.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    hash::Hash,
    time::Duration,
};

use tokio::time::Instant;

/// Keys waiting for a worker, deduplicated, with delayed re-adds after failures.
#[derive(Debug)]
pub(crate) struct WorkQueue<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    delayed: BTreeMap<(Instant, u64), K>,
    seq: u64,
    failures: HashMap<K, u32>,
    base: Duration,
    max: Duration,
}

impl<K: Hash + Eq + Clone> WorkQueue<K> {
    /// A queue whose retry delay starts at `base` and doubles up to `max`.
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self {
            ready: VecDeque::new(),
            queued: HashSet::new(),
            delayed: BTreeMap::new(),
            seq: 0,
            failures: HashMap::new(),
            base,
            max,
        }
    }

    /// Queues `key` now unless it is already waiting.
    pub(crate) fn add(&mut self, key: K) {
        if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    /// Queues `key` after its backoff delay (which doubles with each consecutive failure).
    pub(crate) fn add_rate_limited(&mut self, key: K) -> Duration {
        let n = self.failures.entry(key.clone()).or_insert(0);
        let delay = self
            .base
            .saturating_mul(1u32.checked_shl(*n).unwrap_or(u32::MAX))
            .min(self.max);
        *n = n.saturating_add(1);
        self.seq += 1;
        self.delayed.insert((Instant::now() + delay, self.seq), key);
        delay
    }

    /// Queues `key` after `delay` (a requeue the work asked for; not a failure).
    pub(crate) fn add_after(&mut self, key: K, delay: Duration) {
        self.seq += 1;
        self.delayed.insert((Instant::now() + delay, self.seq), key);
    }

    /// Clears `key`'s failure count (it succeeded).
    pub(crate) fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// The next key to work on, moving due delayed keys to the ready list first.
    pub(crate) fn pop(&mut self) -> Option<K> {
        let now = Instant::now();
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.add(key);
        }
        let key = self.ready.pop_front()?;
        self.queued.remove(&key);
        Some(key)
    }

    /// When the earliest delayed key becomes due, if any.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.delayed.keys().next().map(|(at, _)| *at)
    }
}

/// Sleeps until `deadline`, or forever when there is none.
pub(crate) async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn dedup_and_backoff() {
        let mut q = WorkQueue::new(Duration::from_millis(100), Duration::from_secs(1));
        q.add("a");
        q.add("a");
        assert_eq!(q.pop(), Some("a"));
        assert_eq!(q.pop(), None);
        assert_eq!(q.add_rate_limited("a"), Duration::from_millis(100));
        assert_eq!(q.pop(), None);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(q.pop(), Some("a"));
        assert_eq!(q.add_rate_limited("a"), Duration::from_millis(200));
        for _ in 0..10 {
            q.add_rate_limited("a");
        }
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(1));
        q.forget(&"a");
        assert_eq!(q.add_rate_limited("a"), Duration::from_millis(100));
    }
}
