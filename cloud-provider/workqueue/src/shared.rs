//! The queue shared by concurrent workers: a [`Queue`] behind a lock, and a wake-up for
//! workers waiting in [`WorkQueue::get`]. No background task: a waiting worker sleeps until
//! the next delayed key is due.

use std::hash::Hash;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::{Queue, QueueMetrics, RateLimiter};

/// A work queue shared by concurrent workers (wrap it in an `Arc`). See the
/// [crate docs](crate).
#[derive(Debug)]
pub struct WorkQueue<K> {
    inner: Mutex<Queue<K>>,
    changed: Notify,
}

impl<K: Hash + Eq + Clone> WorkQueue<K> {
    /// An empty queue whose rate-limited requeues wait as `limiter` says.
    pub fn new(limiter: RateLimiter<K>) -> Self {
        WorkQueue {
            inner: Mutex::new(Queue::new(limiter)),
            changed: Notify::new(),
        }
    }

    /// Reports client-go's workqueue metrics into `metrics`.
    pub fn with_metrics(self, metrics: QueueMetrics) -> Self {
        WorkQueue {
            inner: Mutex::new(self.inner.into_inner().with_metrics(metrics)),
            changed: self.changed,
        }
    }

    /// [`Queue::add`].
    pub fn add(&self, key: K) {
        self.inner.lock().add(key);
        self.changed.notify_waiters();
    }

    /// [`Queue::add_after`].
    pub fn add_after(&self, key: K, delay: Duration) {
        self.inner.lock().add_after(key, delay);
        // A worker asleep until a later deadline must look again.
        self.changed.notify_waiters();
    }

    /// [`Queue::add_rate_limited`].
    pub fn add_rate_limited(&self, key: K) -> Duration {
        let delay = self.inner.lock().add_rate_limited(key);
        self.changed.notify_waiters();
        delay
    }

    /// [`Queue::forget`].
    pub fn forget(&self, key: &K) {
        self.inner.lock().forget(key);
    }

    /// [`Queue::num_requeues`].
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.inner.lock().num_requeues(key)
    }

    /// client-go's `Get`: waits for the next key to process, or returns `None` once the queue
    /// is shut down and nothing is left in it. The key is processing until
    /// [`done`](Self::done). Cancel-safe: a key is taken only when this returns it.
    pub async fn get(&self) -> Option<K> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let deadline = {
                let mut queue = self.inner.lock();
                if let Some(key) = queue.try_get() {
                    return Some(key);
                }
                if queue.is_shutting_down() {
                    return None;
                }
                queue.next_deadline()
            };
            tokio::select! {
                () = changed => {}
                () = crate::sleep_until(deadline) => {}
            }
        }
    }

    /// [`Queue::try_get`]: the next key if one is ready, without waiting.
    pub fn try_get(&self) -> Option<K> {
        self.inner.lock().try_get()
    }

    /// Waits until a key is ready for a worker, without taking it (a worker that must wait
    /// for something else before it takes the key). Cancel-safe.
    pub async fn ready(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let deadline = {
                let queue = self.inner.lock();
                if !queue.is_empty() {
                    return;
                }
                queue.next_deadline()
            };
            tokio::select! {
                () = changed => {}
                () = crate::sleep_until(deadline) => {}
            }
        }
    }

    /// [`Queue::done`]: wakes a worker when the key was added meanwhile.
    pub fn done(&self, key: &K) {
        self.inner.lock().done(key);
        self.changed.notify_waiters();
    }

    /// [`Queue::len`].
    pub fn len(&self) -> usize {
        self.inner.lock().len()
    }

    /// [`Queue::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.inner.lock().is_empty()
    }

    /// client-go's `ShutDown`: new and waiting adds are dropped, and workers get `None` once
    /// what is queued is taken.
    pub fn shut_down(&self) {
        self.inner.lock().shut_down();
        self.changed.notify_waiters();
    }

    /// Whether [`shut_down`](Self::shut_down) was called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.lock().is_shutting_down()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn queue() -> Arc<WorkQueue<&'static str>> {
        Arc::new(WorkQueue::new(RateLimiter::exponential(
            Duration::from_secs(5),
            Duration::from_secs(300),
        )))
    }

    /// client-go's `TestMultiProducerMultiConsumer` in small: two workers never hold one key
    /// at once, and an add during processing is processed after it.
    #[tokio::test(start_paused = true)]
    async fn concurrent_workers_never_share_a_key() {
        let q = queue();
        q.add("svc");
        let first = q.get().await.unwrap();
        let second = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        q.add("svc");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !second.is_finished(),
            "svc is processing: the second worker waits"
        );
        q.done(&first);
        let again = tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .expect("queued again at done")
            .unwrap();
        assert_eq!(again, Some("svc"));
    }

    /// A waiting worker wakes when a delayed key comes due, and when an earlier one is added
    /// while it sleeps.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_worker_wakes_at_each_deadline() {
        let q = queue();
        let start = tokio::time::Instant::now();
        q.add_rate_limited("slow");
        let worker = tokio::spawn({
            let q = q.clone();
            async move {
                let key = q.get().await;
                (key, start.elapsed())
            }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        q.add_after("quick", Duration::from_secs(1));
        let (key, took) = worker.await.unwrap();
        assert_eq!(key, Some("quick"));
        assert_eq!(took, Duration::from_secs(2));
        assert_eq!(q.get().await, Some("slow"));
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(5),
            "at its backoff, 5 s"
        );
    }

    /// `ready` waits without taking; shutdown ends the workers once the queue is drained.
    #[tokio::test(start_paused = true)]
    async fn ready_waits_without_taking_and_shutdown_ends_workers() {
        let q = queue();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.ready().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        q.add("sync");
        waiter.await.unwrap();
        assert_eq!(q.len(), 1, "ready took nothing");
        let worker = tokio::spawn({
            let q = q.clone();
            async move { (q.get().await, q.get().await) }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(worker.await.unwrap(), (Some("sync"), None));
        q.add("late");
        assert_eq!(q.try_get(), None, "adds after shutdown are dropped");
    }
}
