//! The queue's core, owned by one task: client-go's `Type` (queue, dirty and processing
//! sets), `delayingType` (keys waiting for their deadline) and `rateLimitingType` in one
//! structure without locks or background tasks; due keys are moved in whenever the queue is
//! read.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::{QueueMetrics, RateLimiter};

/// A work queue owned by one task. See the [crate docs](crate).
#[derive(Debug)]
pub struct Queue<K> {
    /// The order keys are handed out in. Every key here is dirty and not processing.
    queue: VecDeque<K>,
    /// Keys that need processing, with when each was added (client-go's dirty set).
    dirty: HashMap<K, Instant>,
    /// Keys handed to a worker and not yet done, with when that was.
    processing: HashMap<K, Instant>,
    /// Keys waiting for their deadline, in deadline order (the sequence number keeps equal
    /// deadlines apart), and each key's entry.
    waiting: BTreeMap<(Instant, u64), K>,
    waiting_at: HashMap<K, (Instant, u64)>,
    seq: u64,
    limiter: RateLimiter<K>,
    metrics: Option<QueueMetrics>,
    shutting_down: bool,
}

impl<K: Hash + Eq + Clone> Queue<K> {
    /// An empty queue whose rate-limited requeues wait as `limiter` says.
    pub fn new(limiter: RateLimiter<K>) -> Self {
        Queue {
            queue: VecDeque::new(),
            dirty: HashMap::new(),
            processing: HashMap::new(),
            waiting: BTreeMap::new(),
            waiting_at: HashMap::new(),
            seq: 0,
            limiter,
            metrics: None,
            shutting_down: false,
        }
    }

    /// Reports client-go's workqueue metrics into `metrics`.
    pub fn with_metrics(mut self, metrics: QueueMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// client-go's `Add`: marks `key` as needing processing. A key already queued stays queued
    /// once; a key being processed is queued again when its worker calls [`done`](Self::done).
    /// Ignored after [`shut_down`](Self::shut_down).
    pub fn add(&mut self, key: K) {
        if self.shutting_down || self.dirty.contains_key(&key) {
            return;
        }
        if let Some(metrics) = &self.metrics {
            metrics.added();
        }
        let processing = self.processing.contains_key(&key);
        self.dirty.insert(key.clone(), Instant::now());
        if !processing {
            self.queue.push_back(key);
        }
    }

    /// client-go's `AddAfter`: adds `key` once `delay` has passed (at once when it is zero).
    /// A key already waiting keeps the earlier deadline. Counts a retry.
    pub fn add_after(&mut self, key: K, delay: Duration) {
        if self.shutting_down {
            return;
        }
        if let Some(metrics) = &self.metrics {
            metrics.retried();
        }
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let at = Instant::now() + delay;
        if let Some(&(existing, seq)) = self.waiting_at.get(&key) {
            if existing <= at {
                return;
            }
            self.waiting.remove(&(existing, seq));
        }
        self.seq += 1;
        self.waiting.insert((at, self.seq), key.clone());
        self.waiting_at.insert(key, (at, self.seq));
    }

    /// client-go's `AddRateLimited`: adds `key` after the rate limiter's delay for it, and
    /// returns that delay.
    pub fn add_rate_limited(&mut self, key: K) -> Duration {
        let delay = self.limiter.when(&key);
        self.add_after(key, delay);
        delay
    }

    /// client-go's `Forget`: `key` succeeded; its backoff starts over. It is not removed
    /// from the queue.
    pub fn forget(&mut self, key: &K) {
        self.limiter.forget(key);
    }

    /// client-go's `NumRequeues`: how many rate-limited requeues `key` had since it was last
    /// forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.limiter.num_requeues(key)
    }

    /// The rate limiter, for a delay combined with another (e.g. at least a cloud's
    /// `Retry-After`: `queue.add_after(key, queue.rate_limiter().when(&key).max(after))`).
    pub fn rate_limiter(&mut self) -> &mut RateLimiter<K> {
        &mut self.limiter
    }

    /// client-go's `Get` without the wait: the next key to process, if one is ready. The key
    /// is processing until [`done`](Self::done).
    pub fn try_get(&mut self) -> Option<K> {
        let now = Instant::now();
        self.move_due(now);
        let key = self.queue.pop_front()?;
        self.take(&key, now);
        Some(key)
    }

    /// Every ready key at once, in queue order, as one batch; each is processing until
    /// [`done`](Self::done).
    pub fn drain(&mut self) -> Vec<K> {
        let now = Instant::now();
        self.move_due(now);
        let keys: Vec<K> = self.queue.drain(..).collect();
        for key in &keys {
            self.take(key, now);
        }
        keys
    }

    /// client-go's `Done`: the worker finished `key`. If it was added meanwhile, it is queued
    /// again now.
    pub fn done(&mut self, key: &K) {
        let Some(started) = self.processing.remove(key) else {
            return;
        };
        if let Some(metrics) = &self.metrics {
            metrics.done(started);
        }
        if self.dirty.contains_key(key) {
            self.queue.push_back(key.clone());
        }
    }

    /// How many keys are ready for a worker (client-go's `Len`), counting the waiting keys
    /// that are due.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.queue.len()
            + self
                .waiting
                .iter()
                .take_while(|((at, _), _)| *at <= now)
                .filter(|(_, key)| !self.dirty.contains_key(*key))
                .count()
    }

    /// Whether no key is ready for a worker.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// When the earliest waiting key is due, if any: sleep until then
    /// ([`sleep_until`](crate::sleep_until)) and read the queue again.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.waiting.keys().next().map(|(at, _)| *at)
    }

    /// client-go's `ShutDown`: new and waiting adds are dropped; what is queued can still be
    /// taken.
    pub fn shut_down(&mut self) {
        self.shutting_down = true;
        self.waiting.clear();
        self.waiting_at.clear();
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Moves the waiting keys due at `now` into the queue, earliest first.
    fn move_due(&mut self, now: Instant) {
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.waiting_at.remove(&key);
            self.add(key);
        }
    }

    /// Hands `key`, just popped from the queue, to a worker at `now`.
    fn take(&mut self, key: &K, now: Instant) {
        let queued_at = self.dirty.remove(key).unwrap_or(now);
        if let Some(metrics) = &self.metrics {
            metrics.taken(queued_at, now);
        }
        self.processing.insert(key.clone(), now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Queue<&'static str> {
        Queue::new(RateLimiter::exponential(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ))
    }

    /// client-go's `TestBasic`/`TestAddWhileProcessing`: a key queued twice is handed out
    /// once; a key added while processing is not handed to a second worker, but queued again
    /// when the first is done.
    #[tokio::test(start_paused = true)]
    async fn dedupe_and_one_worker_per_key() {
        let mut q = queue();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.try_get(), Some("a"));
        q.add("a");
        assert_eq!(
            q.try_get(),
            Some("b"),
            "a is processing: not handed out twice"
        );
        assert_eq!(q.try_get(), None);
        q.add("a");
        q.done(&"a");
        assert_eq!(
            q.try_get(),
            Some("a"),
            "dirty while processing: queued at done"
        );
        q.done(&"a");
        q.done(&"b");
        assert_eq!(q.try_get(), None);
        assert!(q.is_empty());
    }

    /// The node controller's batch: every ready key at once, each processing until done.
    #[tokio::test(start_paused = true)]
    async fn drain_takes_every_ready_key_as_one_batch() {
        let mut q = queue();
        q.add("a");
        q.add("b");
        q.add_after("c", Duration::from_millis(10));
        assert_eq!(q.drain(), vec!["a", "b"]);
        tokio::time::advance(Duration::from_millis(10)).await;
        q.add("a");
        assert_eq!(q.drain(), vec!["c"], "a is still processing");
        q.done(&"a");
        assert_eq!(q.drain(), vec!["a"]);
    }

    /// client-go's `TestSimpleQueue`/`TestAddTwoFireEarly` (delaying queue): a delayed key
    /// enters at its deadline; adding it again with a shorter delay brings it forward, with a
    /// longer one does not push it back.
    #[tokio::test(start_paused = true)]
    async fn delayed_adds_keep_the_earliest_deadline() {
        let mut q = queue();
        q.add_after("a", Duration::from_secs(50));
        q.add_after("b", Duration::from_secs(1));
        q.add_after("a", Duration::from_secs(2));
        q.add_after("b", Duration::from_secs(60));
        assert_eq!(q.try_get(), None);
        assert_eq!(
            q.next_deadline(),
            Some(Instant::now() + Duration::from_secs(1))
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.try_get(), Some("b"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.try_get(), Some("a"));
        assert_eq!(q.next_deadline(), None, "each key waits once");
        q.add_after("c", Duration::ZERO);
        assert_eq!(q.try_get(), Some("c"), "no delay: added at once");
    }

    /// client-go's `TestRateLimitingQueue`: rate-limited requeues back off per key until
    /// forgotten; `NumRequeues` counts them.
    #[tokio::test(start_paused = true)]
    async fn rate_limited_requeues_back_off_until_forgotten() {
        let mut q = queue();
        assert_eq!(q.add_rate_limited("a"), Duration::from_millis(100));
        assert_eq!(q.try_get(), None);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(q.try_get(), Some("a"));
        q.done(&"a");
        assert_eq!(q.add_rate_limited("a"), Duration::from_millis(200));
        for _ in 0..10 {
            q.add_rate_limited("a");
        }
        assert_eq!(q.num_requeues(&"a"), 12);
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(1));
        q.forget(&"a");
        assert_eq!(q.num_requeues(&"a"), 0);
        assert_eq!(q.add_rate_limited("a"), Duration::from_millis(100));
    }

    /// client-go's `TestShutDown`: after shutdown, adds and waiting keys are dropped; what
    /// was queued is still handed out.
    #[tokio::test(start_paused = true)]
    async fn shutdown_drops_new_and_waiting_adds() {
        let mut q = queue();
        q.add("queued");
        q.add_after("waiting", Duration::from_secs(1));
        q.shut_down();
        assert!(q.is_shutting_down());
        q.add("late");
        q.add_after("later", Duration::ZERO);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.drain(), vec!["queued"]);
        assert_eq!(q.next_deadline(), None);
    }

    /// What core-cluster's controllers need: `add_rate_limited` tells the delay (for the
    /// log line), and `next_deadline` drives a `select!` loop with `sleep_until`.
    #[tokio::test(start_paused = true)]
    async fn a_select_loop_wakes_at_the_next_deadline() {
        let mut q = queue();
        let delay = q.add_rate_limited("pod");
        let start = Instant::now();
        crate::sleep_until(q.next_deadline()).await;
        assert_eq!(start.elapsed(), delay);
        assert_eq!(q.try_get(), Some("pod"));
        let forever = tokio::time::timeout(Duration::from_secs(3600), crate::sleep_until(None));
        assert!(
            forever.await.is_err(),
            "no deadline: sleeps until cancelled"
        );
    }
}
