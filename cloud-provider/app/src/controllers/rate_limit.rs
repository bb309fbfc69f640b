//! One token bucket in front of the cloud API, shared by every controller, with counts of
//! what it let through and how long callers waited. Upstream has none (each provider builds
//! its own, or gets throttled).
//!
//! Beyond a plain bucket:
//! - **Priorities.** Callers wait in the order of [`CloudPriority`] (node initialization and
//!   deletion, then load-balancer changes, then route reconciles, then status refreshes), and
//!   in arrival order within one priority, so bulk load-balancer updates never hold back a
//!   joining Node.
//! - **Adaptation** (opt-in, [`CloudRateLimiter::adaptive`]). When the cloud reports throttling
//!   ([`cloud_provider::ErrorKind::Throttled`]), the rate halves (at most once per second, so
//!   the throttled answers of calls already in flight count once), every caller is held back
//!   for the cloud's retry-after when it gave one, and the rate then climbs back by a twentieth
//!   of the configured rate per second (additive increase, multiplicative decrease).

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use cloud_provider::CloudError;
use parking_lot::Mutex;
use tokio::{sync::Notify, time::Instant};

/// Who asks for a cloud call, in the order the shared limiter serves waiting callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CloudPriority {
    /// Node initialization and deletion: a joining Node cannot run pods until it is served.
    NodeLifecycle,
    /// Load-balancer changes (ensure, update hosts, delete).
    LoadBalancer,
    /// Route reconciles.
    Route,
    /// Periodic status refreshes (Node addresses, shutdown checks).
    Status,
}

impl CloudPriority {
    /// Every priority, highest first.
    pub const ALL: [CloudPriority; 4] = [
        CloudPriority::NodeLifecycle,
        CloudPriority::LoadBalancer,
        CloudPriority::Route,
        CloudPriority::Status,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            CloudPriority::NodeLifecycle => "node_lifecycle",
            CloudPriority::LoadBalancer => "load_balancer",
            CloudPriority::Route => "route",
            CloudPriority::Status => "status",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The lowest rate adaptation goes down to, as a fraction of the configured rate.
const MIN_RATE_FRACTION: f64 = 0.02;
/// How much of the configured rate adaptation climbs back per second.
const INCREASE_FRACTION_PER_SECOND: f64 = 0.05;
/// At most one decrease in this long: the throttled answers of calls already in flight when
/// the cloud started refusing are one signal, not many.
const DECREASE_COOLDOWN: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct State {
    /// The current rate, calls per second (the configured one unless adaptation lowered it).
    rate: f64,
    tokens: f64,
    last: Instant,
    /// No call is let through before this (the cloud's retry-after).
    hold_until: Option<Instant>,
    last_decrease: Option<Instant>,
    /// Callers waiting, in the order they are served.
    waiters: BTreeMap<(CloudPriority, u64), Arc<Notify>>,
    next_seq: u64,
}

impl State {
    /// Adds the tokens (and, adapting, the rate) earned since the last look.
    fn refill(&mut self, now: Instant, max: f64, burst: f64, adaptive: bool) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        if adaptive && self.rate < max {
            self.rate = (self.rate + max * INCREASE_FRACTION_PER_SECOND * elapsed).min(max);
        }
        self.tokens = (self.tokens + elapsed * self.rate).min(burst);
    }

    /// Wakes the caller now first in line, if any.
    fn wake_head(&self) {
        if let Some(notify) = self.waiters.values().next() {
            notify.notify_one();
        }
    }
}

#[derive(Debug, Default)]
struct PriorityCounters {
    granted: AtomicU64,
    waited_micros: AtomicU64,
    throttled: AtomicU64,
}

/// A token bucket: `qps` tokens per second, at most `burst` saved up, waiting callers served
/// by [`CloudPriority`]. Every timer is tokio time, so it works under paused time.
#[derive(Debug)]
pub struct CloudRateLimiter {
    qps: f64,
    burst: f64,
    adaptive: bool,
    state: Mutex<State>,
    granted: AtomicU64,
    waited_micros: AtomicU64,
    by_priority: [PriorityCounters; 4],
}

/// What the limiter has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimiterStats {
    /// Calls let through.
    pub granted: u64,
    /// Total time callers waited.
    pub waited: Duration,
}

/// What the limiter has done so far for one priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PriorityStats {
    /// Calls let through.
    pub granted: u64,
    /// Total time callers waited.
    pub waited: Duration,
    /// Calls the cloud answered with a throttling error.
    pub throttled: u64,
}

impl CloudRateLimiter {
    /// `qps` calls per second on average, bursts of up to `burst`. `qps <= 0` is unlimited.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        CloudRateLimiter {
            qps,
            burst,
            adaptive: false,
            state: Mutex::new(State {
                rate: qps.max(0.0),
                tokens: burst,
                last: Instant::now(),
                hold_until: None,
                last_decrease: None,
                waiters: BTreeMap::new(),
                next_seq: 0,
            }),
            granted: AtomicU64::new(0),
            waited_micros: AtomicU64::new(0),
            by_priority: Default::default(),
        }
    }

    /// No limit; still counts calls.
    pub fn unlimited() -> Self {
        CloudRateLimiter::new(0.0, 1)
    }

    /// Makes the limiter adapt to the cloud's throttling (see the module docs). Has no effect
    /// on an unlimited limiter, which has no rate to lower.
    pub fn adaptive(mut self, adaptive: bool) -> Self {
        self.adaptive = adaptive;
        self
    }

    /// Waits for a token as a status refresh, the lowest priority (callers that are not
    /// controllers, such as a client's own requests, all wait alike).
    pub async fn acquire(&self) {
        self.acquire_at(CloudPriority::Status).await;
    }

    /// Waits for a token; callers of a higher priority waiting at the same time go first.
    pub async fn acquire_at(&self, priority: CloudPriority) {
        self.granted.fetch_add(1, Ordering::Relaxed);
        self.by_priority[priority.index()]
            .granted
            .fetch_add(1, Ordering::Relaxed);
        if self.qps <= 0.0 {
            return;
        }
        let started = Instant::now();
        let (key, notify) = {
            let mut state = self.state.lock();
            state.refill(started, self.qps, self.burst, self.adaptive);
            let held = state.hold_until.is_some_and(|until| until > started);
            if state.waiters.is_empty() && !held && state.tokens >= 1.0 {
                state.tokens -= 1.0;
                return;
            }
            let key = (priority, state.next_seq);
            state.next_seq += 1;
            let notify = Arc::new(Notify::new());
            state.waiters.insert(key, notify.clone());
            (key, notify)
        };
        // Leaves the line if the caller gives up (a cancelled reconcile), so it never blocks
        // the callers behind it.
        let mut waiting = Waiting {
            limiter: self,
            key: Some(key),
        };
        loop {
            let wake_at = {
                let mut state = self.state.lock();
                let now = Instant::now();
                state.refill(now, self.qps, self.burst, self.adaptive);
                let first = state.waiters.keys().next() == Some(&key);
                match state.hold_until.filter(|until| *until > now) {
                    _ if !first => None,
                    Some(until) => Some(until),
                    None if state.tokens >= 1.0 => {
                        state.tokens -= 1.0;
                        state.waiters.remove(&key);
                        state.wake_head();
                        waiting.key = None;
                        break;
                    }
                    None => Some(now + Duration::from_secs_f64((1.0 - state.tokens) / state.rate)),
                }
            };
            match wake_at {
                None => notify.notified().await,
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = notify.notified() => {}
                    }
                }
            }
        }
        let waited = started.elapsed().as_micros() as u64;
        self.waited_micros.fetch_add(waited, Ordering::Relaxed);
        self.by_priority[priority.index()]
            .waited_micros
            .fetch_add(waited, Ordering::Relaxed);
    }

    /// Tells the limiter how a call it let through ended: a throttling error counts for
    /// `priority` and, adapting, lowers the rate and holds callers for the cloud's retry-after.
    pub fn observe(&self, priority: CloudPriority, error: &CloudError) {
        if !error.is_throttled() {
            return;
        }
        self.by_priority[priority.index()]
            .throttled
            .fetch_add(1, Ordering::Relaxed);
        if !self.adaptive || self.qps <= 0.0 {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        state.refill(now, self.qps, self.burst, self.adaptive);
        let cooled = state
            .last_decrease
            .is_none_or(|at| now.saturating_duration_since(at) >= DECREASE_COOLDOWN);
        if cooled {
            state.rate = (state.rate / 2.0).max(self.qps * MIN_RATE_FRACTION);
            state.last_decrease = Some(now);
            // The saved-up burst is what the cloud just refused.
            state.tokens = state.tokens.min(0.0);
        }
        if let Some(after) = error.retry_after_delay() {
            let until = now + after;
            state.hold_until = Some(state.hold_until.map_or(until, |held| held.max(until)));
        }
    }

    /// Runs one cloud call at `priority`: waits for a token, calls, and reports a throttling
    /// answer to [`observe`](Self::observe).
    pub async fn call<T>(
        &self,
        priority: CloudPriority,
        call: impl Future<Output = Result<T, CloudError>>,
    ) -> Result<T, CloudError> {
        self.acquire_at(priority).await;
        let result = call.await;
        if let Err(err) = &result {
            self.observe(priority, err);
        }
        result
    }

    /// The rate the limiter lets calls through at now, calls per second (0 = unlimited).
    pub fn current_rate(&self) -> f64 {
        if self.qps <= 0.0 {
            return 0.0;
        }
        let mut state = self.state.lock();
        state.refill(Instant::now(), self.qps, self.burst, self.adaptive);
        state.rate
    }

    /// Counts so far.
    pub(crate) fn stats(&self) -> RateLimiterStats {
        RateLimiterStats {
            granted: self.granted.load(Ordering::Relaxed),
            waited: Duration::from_micros(self.waited_micros.load(Ordering::Relaxed)),
        }
    }

    /// Counts so far for one priority.
    pub(crate) fn priority_stats(&self, priority: CloudPriority) -> PriorityStats {
        let counters = &self.by_priority[priority.index()];
        PriorityStats {
            granted: counters.granted.load(Ordering::Relaxed),
            waited: Duration::from_micros(counters.waited_micros.load(Ordering::Relaxed)),
            throttled: counters.throttled.load(Ordering::Relaxed),
        }
    }
}

/// A caller's place in line; dropping it before it is served gives the place up.
struct Waiting<'a> {
    limiter: &'a CloudRateLimiter,
    key: Option<(CloudPriority, u64)>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            let mut state = self.limiter.state.lock();
            state.waiters.remove(&key);
            state.wake_head();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bursts_then_paces() {
        let limiter = CloudRateLimiter::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            limiter.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        for _ in 0..10 {
            limiter.acquire().await;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(990) && elapsed <= Duration::from_millis(1010),
            "{elapsed:?}"
        );
        assert_eq!(limiter.stats().granted, 15);
    }

    #[tokio::test(start_paused = true)]
    async fn shared_between_tasks() {
        let limiter = std::sync::Arc::new(CloudRateLimiter::new(100.0, 1));
        let start = Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let l = limiter.clone();
                tokio::spawn(async move {
                    for _ in 0..25 {
                        l.acquire().await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        // 100 calls at 100/s with a burst of 1: about 0.99 s however they are spread.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(980) && elapsed <= Duration::from_millis(1010),
            "{elapsed:?}"
        );
    }

    #[tokio::test]
    async fn unlimited_never_waits() {
        let limiter = CloudRateLimiter::unlimited();
        for _ in 0..1000 {
            limiter.acquire().await;
        }
        assert_eq!(
            limiter.stats(),
            RateLimiterStats {
                granted: 1000,
                waited: Duration::ZERO
            }
        );
    }

    /// Finish order of `callers` (priority, name), all waiting on one drained limiter.
    async fn finish_order(callers: Vec<(CloudPriority, &'static str)>) -> Vec<&'static str> {
        let limiter = Arc::new(CloudRateLimiter::new(10.0, 1));
        limiter.acquire().await; // spends the burst: everyone below waits
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (priority, name) in callers {
            let (limiter, order) = (limiter.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                limiter.acquire_at(priority).await;
                order.lock().push(name);
            }));
            // Every caller is in line before the first token comes.
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.await.unwrap();
        }
        Arc::try_unwrap(order).unwrap().into_inner()
    }

    /// A Node joining behind a queue of load-balancer updates and route reconciles is served
    /// first: the limiter serves by priority, then by arrival.
    #[tokio::test(start_paused = true)]
    async fn waiting_callers_are_served_by_priority_then_arrival() {
        let order = finish_order(vec![
            (CloudPriority::Status, "status"),
            (CloudPriority::Route, "route"),
            (CloudPriority::LoadBalancer, "lb-1"),
            (CloudPriority::LoadBalancer, "lb-2"),
            (CloudPriority::NodeLifecycle, "node-init"),
        ])
        .await;
        assert_eq!(order, ["node-init", "lb-1", "lb-2", "route", "status"]);
    }

    /// A caller that gives up while waiting leaves the line: the callers behind it are still
    /// served at the configured rate.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_waiter_does_not_block_the_line() {
        let limiter = Arc::new(CloudRateLimiter::new(10.0, 1));
        limiter.acquire().await;
        let first = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.acquire_at(CloudPriority::NodeLifecycle).await }
        });
        tokio::task::yield_now().await;
        let second = tokio::spawn({
            let limiter = limiter.clone();
            async move { limiter.acquire_at(CloudPriority::Status).await }
        });
        tokio::task::yield_now().await;
        first.abort();
        let start = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("the caller behind a cancelled one is served")
            .unwrap();
        assert!(
            start.elapsed() <= Duration::from_millis(101),
            "{:?}",
            start.elapsed()
        );
        assert!(limiter.state.lock().waiters.is_empty());
    }

    /// Adapting, a throttling answer halves the rate once per cooldown, holds everyone for
    /// the cloud's retry-after, and the rate then climbs back to the configured one.
    #[tokio::test(start_paused = true)]
    async fn throttling_halves_the_rate_then_it_climbs_back() {
        let limiter = CloudRateLimiter::new(20.0, 1).adaptive(true);
        let throttled = CloudError::throttled(Some(Duration::from_secs(2)), "quota");
        limiter.observe(CloudPriority::LoadBalancer, &throttled);
        // Calls in flight answer throttled too: one decrease, not three.
        limiter.observe(CloudPriority::LoadBalancer, &throttled);
        limiter.observe(CloudPriority::Route, &throttled);
        assert!((limiter.current_rate() - 10.0).abs() < 0.01);
        let start = Instant::now();
        limiter.acquire_at(CloudPriority::NodeLifecycle).await;
        assert!(
            start.elapsed() >= Duration::from_secs(2),
            "held for the retry-after: {:?}",
            start.elapsed()
        );
        let stats = limiter.priority_stats(CloudPriority::LoadBalancer);
        assert_eq!(stats.throttled, 2);
        assert_eq!(limiter.priority_stats(CloudPriority::Route).throttled, 1);
        // 2 s later the rate has climbed by 2 × 5% × 20 = 2 calls/s.
        assert!(
            (limiter.current_rate() - 12.0).abs() < 0.1,
            "{}",
            limiter.current_rate()
        );
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!((limiter.current_rate() - 20.0).abs() < 1e-9);
        // Non-throttling errors change nothing.
        limiter.observe(CloudPriority::Route, &CloudError::message("boom"));
        assert!((limiter.current_rate() - 20.0).abs() < 1e-9);
    }

    /// Paced at a rate above the cloud's quota, the adaptive limiter settles near the quota:
    /// far fewer calls are refused than at the fixed rate.
    #[tokio::test(start_paused = true)]
    async fn adaptive_rate_settles_near_a_cloud_quota() {
        async fn refused(limiter: CloudRateLimiter) -> u64 {
            // The cloud: 10 calls per second, a bucket of 10.
            let mut cloud = (10.0_f64, Instant::now());
            let mut refused = 0;
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(60) {
                limiter.acquire_at(CloudPriority::LoadBalancer).await;
                let now = Instant::now();
                cloud.0 = (cloud.0 + now.duration_since(cloud.1).as_secs_f64() * 10.0).min(10.0);
                cloud.1 = now;
                if cloud.0 >= 1.0 {
                    cloud.0 -= 1.0;
                } else {
                    refused += 1;
                    limiter.observe(
                        CloudPriority::LoadBalancer,
                        &CloudError::throttled(None, "quota"),
                    );
                }
            }
            refused
        }
        let fixed = refused(CloudRateLimiter::new(40.0, 1)).await;
        let adaptive = refused(CloudRateLimiter::new(40.0, 1).adaptive(true)).await;
        assert!(fixed > 1500, "fixed at 4× the quota: {fixed} refused");
        assert!(adaptive * 5 < fixed, "adaptive {adaptive} vs fixed {fixed}");
    }
}
