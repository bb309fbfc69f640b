//! Wall-clock time read through tokio's clock.
//!
//! Timestamps the controllers and the simulator write (`startTime`, condition transitions,
//! lease renewals) must agree with the timers that drive them, and every timer goes through
//! tokio time. A [`WallClock`] takes the wall-clock time once, when it is made, and moves it
//! on by the tokio clock: in production the two are the same, under paused tokio time (tests)
//! the timestamps advance with the paused clock.

use jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

/// Wall-clock time that advances with the tokio clock.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    wall: Timestamp,
    mono: Instant,
}

impl WallClock {
    /// A clock that reads the wall-clock time now and follows tokio's clock from here.
    pub fn new() -> Self {
        Self {
            wall: Timestamp::now(),
            mono: Instant::now(),
        }
    }

    /// The current time: the starting wall-clock time plus the tokio time elapsed since.
    pub fn now(&self) -> Timestamp {
        let elapsed = SignedDuration::try_from(self.mono.elapsed()).unwrap_or_default();
        self.wall.checked_add(elapsed).unwrap_or(self.wall)
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Under paused tokio time the clock moves with `tokio::time::advance`, not the wall.
    #[tokio::test(start_paused = true)]
    async fn follows_paused_tokio_time() {
        let clock = WallClock::new();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_secs(300)).await;
        let elapsed = clock.now().duration_since(t0);
        assert!(
            elapsed >= SignedDuration::from_secs(300) && elapsed < SignedDuration::from_secs(301),
            "{elapsed:?}"
        );
    }
}
