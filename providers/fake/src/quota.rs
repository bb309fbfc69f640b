//! The cloud side of an API quota: a token bucket the fake spends one token from per call,
//! refusing calls over it with [`CloudError::Throttled`] and a retry-after, as a real cloud
//! answers HTTP 429 / `RequestLimitExceeded`.

use std::time::Duration;

use cloud_provider::CloudError;
use tokio::time::Instant;

/// `rate` calls per second, at most `burst` saved up.
#[derive(Debug, Clone)]
pub(crate) struct Quota {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    refused: u64,
}

impl Quota {
    /// A full bucket. A rate of 0 or less refuses nothing.
    pub(crate) fn new(rate: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Quota {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
            refused: 0,
        }
    }

    /// Spends a token for one call, or refuses it with the time until the next token.
    pub(crate) fn admit(&mut self) -> Result<(), CloudError> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        self.refused += 1;
        let retry_after = Duration::from_secs_f64((1.0 - self.tokens) / self.rate);
        Err(CloudError::throttled(
            Some(retry_after),
            format!("fake cloud: API quota of {} calls/s exceeded", self.rate),
        ))
    }

    /// Calls refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quota lets the burst through, then `rate` calls per second; a refused call says
    /// when the next token comes.
    #[tokio::test(start_paused = true)]
    async fn refuses_calls_over_the_rate_with_a_retry_after() {
        let mut quota = Quota::new(10.0, 2);
        assert!(quota.admit().is_ok());
        assert!(quota.admit().is_ok());
        let refused = quota.admit().expect_err("the burst is spent");
        assert!(refused.is_throttled(), "{refused}");
        let after = refused.retry_after_delay().expect("a retry-after");
        assert!((after.as_secs_f64() - 0.1).abs() < 1e-6, "{after:?}");
        tokio::time::sleep(after).await;
        assert!(quota.admit().is_ok());
        assert_eq!(quota.refused(), 1);
        assert!(Quota::new(0.0, 1).admit().is_ok(), "no quota");
    }
}
