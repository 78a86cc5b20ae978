//! The only place that touches the `backoff` crate (RUSTSEC-2025-0012: unmaintained), so it can
//! be swapped here alone.
//!
//! `backoff` samples `interval * [1 - f, 1 + f]`. With `f = 1`, an initial interval of `base / 2`,
//! a multiplier of 2 and a max interval of `cap / 2`, each sample is uniform in
//! `[0, min(base * 2^attempt, cap)]`: "full jitter".

use backoff::backoff::Backoff as _;
use std::time::Duration;

/// A uniform sample in `[0, 1)`, from the operating system's random source (via a UUID v4):
/// timers that must not fire together are spread with it.
pub(crate) fn unit() -> f64 {
    (uuid::Uuid::new_v4().as_u128() % 1_000_000) as f64 / 1_000_000.0
}

/// An endless sequence of full-jitter delays.
pub(crate) struct Delays(backoff::ExponentialBackoff);

impl Delays {
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Delays(backoff::ExponentialBackoff {
            current_interval: base / 2,
            initial_interval: base / 2,
            randomization_factor: 1.0,
            multiplier: 2.0,
            max_interval: cap / 2,
            max_elapsed_time: None,
            ..backoff::ExponentialBackoff::default()
        })
    }

    /// The next delay; never above `cap` (the crate's jitter can exceed its max interval, so
    /// the result is clamped).
    pub(crate) fn next_delay(&mut self, cap: Duration) -> Duration {
        self.0.next_backoff().unwrap_or(cap).min(cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_stay_within_full_jitter_bounds() {
        let base = Duration::from_millis(10);
        let cap = Duration::from_millis(100);
        let mut d = Delays::new(base, cap);
        let mut max_seen = Duration::ZERO;
        for attempt in 0..200u32 {
            let bound = (base * 2u32.saturating_pow(attempt.min(20))).min(cap);
            let x = d.next_delay(cap);
            assert!(
                x <= bound + Duration::from_millis(1),
                "attempt {attempt}: {x:?} > {bound:?}"
            );
            max_seen = max_seen.max(x);
        }
        assert!(
            max_seen > Duration::from_millis(50),
            "jitter never approached the cap: {max_seen:?}"
        );
    }
}
