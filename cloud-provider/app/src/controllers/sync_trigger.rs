//! A work queue of one key: a whole-cluster sync (the service controller's node sync, the
//! watch-based route reconcile), with client-go's workqueue metrics.
//!
//! Upstream queues a key per event (`nodeQueue.Add(nodeKey)`, `workqueue.AddRateLimited("routes")`)
//! and each key runs the same whole-cluster sync. Here every event asks for that one sync:
//! events that arrive while it is queued coalesce, as client-go's dirty set coalesces a key
//! added twice, and one that arrives while it runs queues the next one.

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::metrics::{QueueMetrics, Work};

/// A queue of one key; see the module docs.
pub(crate) struct SyncTrigger {
    /// When the sync was queued, if it is.
    queued: Mutex<Option<Instant>>,
    notify: Notify,
    metrics: QueueMetrics,
}

impl SyncTrigger {
    /// An empty queue reporting as `metrics`.
    pub(crate) fn new(metrics: QueueMetrics) -> Self {
        SyncTrigger {
            queued: Mutex::new(None),
            notify: Notify::new(),
            metrics,
        }
    }

    /// Queues the sync unless it is queued already.
    pub(crate) fn add(&self) {
        {
            let mut queued = self.queued.lock();
            if queued.is_some() {
                return;
            }
            *queued = Some(Instant::now());
            self.metrics.added();
        }
        self.notify.notify_one();
    }

    /// Queues the sync again after a failure (`retries_total` up).
    pub(crate) fn add_rate_limited(&self) {
        self.metrics.retried();
        self.add();
    }

    /// Waits until the sync is queued, without taking it. Cancel-safe.
    pub(crate) async fn queued(&self) {
        loop {
            if self.queued.lock().is_some() {
                return;
            }
            self.notify.notified().await;
        }
    }

    /// Takes the queued sync, if any: the returned guard spans its processing.
    pub(crate) fn take(&self) -> Option<Work> {
        let at = self.queued.lock().take()?;
        self.metrics.taken(at);
        Some(self.metrics.start(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::metrics::{ControllerMetrics, QUEUE_ROUTES};
    use std::time::Duration;

    /// Adds coalesce while queued; an add during the sync queues the next one.
    #[tokio::test(start_paused = true)]
    async fn adds_coalesce_until_taken() {
        let metrics = ControllerMetrics::new();
        let trigger = SyncTrigger::new(metrics.queue(QUEUE_ROUTES));
        assert!(trigger.take().is_none());
        trigger.add();
        trigger.add();
        assert_eq!(metrics.queue(QUEUE_ROUTES).depth(), 1);
        tokio::time::timeout(Duration::from_secs(1), trigger.queued())
            .await
            .expect("queued");
        let work = trigger.take().expect("one sync queued");
        assert_eq!(metrics.queue(QUEUE_ROUTES).depth(), 0);
        assert!(trigger.take().is_none(), "the two adds made one sync");
        trigger.add_rate_limited();
        drop(work);
        assert!(
            trigger.take().is_some(),
            "an add while syncing queues the next"
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(1), trigger.queued())
                .await
                .is_err(),
            "nothing queued"
        );
    }
}
