//! One token bucket in front of the cloud API, shared by every controller, with counts of
//! what it let through and how long callers waited. Upstream has none (each provider builds
//! its own, or gets throttled).

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use parking_lot::Mutex;
use tokio::time::Instant;

/// A token bucket: `qps` tokens per second, at most `burst` saved up. Every timer is tokio
/// time, so it works under paused time.
#[derive(Debug)]
pub struct CloudRateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
    granted: AtomicU64,
    waited_micros: AtomicU64,
}

/// What the limiter has done so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateLimiterStats {
    /// Calls let through.
    pub granted: u64,
    /// Total time callers waited.
    pub waited: Duration,
}

impl CloudRateLimiter {
    /// `qps` calls per second on average, bursts of up to `burst`. `qps <= 0` is unlimited.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        CloudRateLimiter {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
            granted: AtomicU64::new(0),
            waited_micros: AtomicU64::new(0),
        }
    }

    /// No limit; still counts calls.
    pub fn unlimited() -> Self {
        CloudRateLimiter::new(0.0, 1)
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        self.granted.fetch_add(1, Ordering::Relaxed);
        if self.qps <= 0.0 {
            return;
        }
        let wait = {
            let mut state = self.state.lock();
            let now = Instant::now();
            let (tokens, last) = *state;
            let refilled =
                (tokens + now.duration_since(last).as_secs_f64() * self.qps).min(self.burst);
            let after = refilled - 1.0;
            *state = (after, now);
            if after >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-after / self.qps)
            }
        };
        if !wait.is_zero() {
            self.waited_micros
                .fetch_add(wait.as_micros() as u64, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
        }
    }

    /// Counts so far.
    pub(crate) fn stats(&self) -> RateLimiterStats {
        RateLimiterStats {
            granted: self.granted.load(Ordering::Relaxed),
            waited: Duration::from_micros(self.waited_micros.load(Ordering::Relaxed)),
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
}
