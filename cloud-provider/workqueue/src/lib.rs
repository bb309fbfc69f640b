//! # ccm-workqueue: client-go's work queue on tokio time
//!
//! The queue every controller of `k8s.io/client-go/util/workqueue` uses
//! (`NewTypedRateLimitingQueueWithConfig`), with its semantics:
//!
//! - **dedupe**: a key added twice before a worker takes it is processed once (the dirty set);
//! - **one worker per key**: a key added while a worker processes it is queued again only when
//!   that worker calls [`done`](Queue::done) (the processing set), so two workers never hold
//!   the same key;
//! - **rate-limited requeues**: [`add_rate_limited`](Queue::add_rate_limited) waits the
//!   [`RateLimiter`]'s delay for the key (per-key exponential backoff, optionally combined
//!   with an overall token bucket) until [`forget`](Queue::forget) resets it;
//!   [`num_requeues`](Queue::num_requeues) counts the failures;
//! - **delayed adds**: [`add_after`](Queue::add_after) queues a key once its delay has passed;
//!   a key already waiting keeps the earlier of its two deadlines;
//! - **shutdown**: [`shut_down`](Queue::shut_down) drops new and waiting adds; workers drain
//!   what is queued, then [`WorkQueue::get`] returns `None`;
//! - **metrics** under client-go's names (`workqueue_depth`, `workqueue_adds_total`,
//!   `workqueue_queue_duration_seconds`, `workqueue_work_duration_seconds`,
//!   `workqueue_retries_total`, `workqueue_unfinished_work_seconds`,
//!   `workqueue_longest_running_processor_seconds`, labelled `name`): see [`WorkqueueMetrics`].
//!
//! Two forms share that core: [`Queue`], owned by one task (`&mut self`, with
//! [`next_deadline`](Queue::next_deadline) for a `select!` loop, and
//! [`drain`](Queue::drain) to take every ready key as one batch), and [`WorkQueue`], shared by
//! concurrent workers (`&self`, an async [`get`](WorkQueue::get)). Every timer is tokio's, so
//! tests run on paused time.
//!
//! ```
//! use std::time::Duration;
//! use ccm_workqueue::{Queue, RateLimiter};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
//! let mut queue = Queue::new(RateLimiter::exponential(
//!     Duration::from_millis(5),
//!     Duration::from_secs(1000),
//! ));
//! queue.add("default/web");
//! queue.add("default/web");
//! let key = queue.try_get().expect("queued once");
//! assert_eq!(queue.try_get(), None);
//! // The sync failed: back off 5 ms, then 10 ms, … until it succeeds.
//! assert_eq!(queue.add_rate_limited(key), Duration::from_millis(5));
//! queue.done(&key);
//! tokio::time::sleep(Duration::from_millis(5)).await;
//! assert_eq!(queue.try_get(), Some("default/web"));
//! queue.forget(&"default/web");
//! queue.done(&"default/web");
//! # }
//! ```

mod metrics;
mod queue;
mod rate_limiter;
mod shared;

pub use metrics::{QueueMetrics, WorkqueueMetrics};
pub use queue::Queue;
pub use rate_limiter::RateLimiter;
pub use shared::WorkQueue;

use tokio::time::Instant;

/// Sleeps until `deadline`, or forever when there is none: the arm of a `select!` loop that
/// waits for a [`Queue`]'s [`next_deadline`](Queue::next_deadline).
pub async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
