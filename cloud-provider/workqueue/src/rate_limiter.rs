//! client-go's rate limiters (`util/workqueue/default_rate_limiters.go`): per-key exponential
//! backoff (`ItemExponentialFailureRateLimiter`), optionally combined by maximum
//! (`MaxOfRateLimiter`) with one token bucket for every key (`BucketRateLimiter`).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

/// How long a key waits before it is retried: see the module docs.
#[derive(Debug, Clone)]
pub struct RateLimiter<K> {
    base: Duration,
    max: Duration,
    failures: HashMap<K, u32>,
    bucket: Option<Bucket>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// client-go's `NewTypedItemExponentialFailureRateLimiter(base, max)`: a key's n-th
    /// consecutive failure waits `base × 2ⁿ`, at most `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        RateLimiter {
            base,
            max,
            failures: HashMap::new(),
            bucket: None,
        }
    }

    /// client-go's `DefaultTypedControllerRateLimiter`: the larger of a per-key exponential
    /// backoff from 5 ms to 1000 s and an overall bucket of 10 retries per second with bursts
    /// of 100.
    pub fn default_controller() -> Self {
        Self::exponential(Duration::from_millis(5), Duration::from_secs(1000))
            .with_bucket(10.0, 100)
    }

    /// Also waits for a token of one bucket every key shares (client-go's `MaxOfRateLimiter`
    /// over a `BucketRateLimiter` of `qps` tokens per second and `burst` at most): a retry
    /// waits for the longer of its backoff and its token.
    pub fn with_bucket(mut self, qps: f64, burst: u32) -> Self {
        self.bucket = Some(Bucket::new(qps, burst));
        self
    }

    /// client-go's `When`: the delay before `key`'s retry. Counts one failure of `key`, and
    /// takes one token of the bucket, if any.
    pub fn when(&mut self, key: &K) -> Duration {
        let failures = match self.failures.get_mut(key) {
            Some(n) => n,
            None => self.failures.entry(key.clone()).or_insert(0),
        };
        let exponent = *failures;
        *failures = failures.saturating_add(1);
        // base × 2ⁿ, capped: 2ⁿ beyond u32 is past any useful cap.
        let backoff = 1u32
            .checked_shl(exponent)
            .map_or(self.max, |factor| self.base.saturating_mul(factor))
            .min(self.max);
        match &mut self.bucket {
            Some(bucket) => backoff.max(bucket.reserve(Instant::now())),
            None => backoff,
        }
    }

    /// client-go's `Forget`: `key` succeeded; its next failure starts at the base delay again.
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// client-go's `NumRequeues`: how many times `key` failed since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }
}

/// A token bucket that lends: a reservation always succeeds and says how long to wait for
/// its token, as Go's `rate.Limiter.Reserve().Delay()`.
#[derive(Debug, Clone)]
struct Bucket {
    qps: f64,
    burst: f64,
    /// Tokens at `at`; negative when reservations are ahead of the refill.
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Bucket {
            qps,
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    fn reserve(&mut self, now: Instant) -> Duration {
        if self.qps <= 0.0 || !self.qps.is_finite() {
            return Duration::ZERO;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst) - 1.0;
        self.at = now;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// client-go's `TestItemExponentialFailureRateLimiter`: 1 ms, 2 ms, 4 ms, … up to the cap;
    /// `NumRequeues` counts; `Forget` starts over.
    #[tokio::test(start_paused = true)]
    async fn exponential_backoff_doubles_to_the_cap_until_forgotten() {
        let mut limiter =
            RateLimiter::exponential(Duration::from_millis(1), Duration::from_secs(1));
        let delays: Vec<u128> = (0..5).map(|_| limiter.when(&"one").as_millis()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16]);
        assert_eq!(limiter.num_requeues(&"one"), 5);
        assert_eq!(limiter.when(&"two").as_millis(), 1, "per key");
        for _ in 0..40 {
            limiter.when(&"one");
        }
        assert_eq!(
            limiter.when(&"one"),
            Duration::from_secs(1),
            "capped, no overflow"
        );
        limiter.forget(&"one");
        assert_eq!(limiter.num_requeues(&"one"), 0);
        assert_eq!(limiter.when(&"one").as_millis(), 1);
    }

    /// client-go's `DefaultTypedControllerRateLimiter`: 5 ms per key to 1000 s, but past the
    /// burst of 100 retries the overall bucket (10 per second) decides.
    #[tokio::test(start_paused = true)]
    async fn the_default_limiter_adds_an_overall_bucket() {
        let mut limiter = RateLimiter::default_controller();
        for key in 0..100 {
            assert_eq!(limiter.when(&key), Duration::from_millis(5), "key {key}");
        }
        assert_eq!(
            limiter.when(&100),
            Duration::from_millis(100),
            "the 101st token"
        );
        assert_eq!(limiter.when(&101), Duration::from_millis(200));
        tokio::time::advance(Duration::from_secs(1)).await;
        // Ten tokens came back; two were lent already.
        assert_eq!(limiter.when(&102), Duration::from_millis(5));
        let mut slow = RateLimiter::default_controller();
        for _ in 0..30 {
            slow.when(&"k");
        }
        assert_eq!(slow.when(&"k"), Duration::from_secs(1000));
    }
}
