//! Per-call lock options.

use crate::error::{Error, Result};
use crate::limits::MAX_TOKEN_LEN;
use std::time::Duration;

/// The largest TTL accepted: its milliseconds must fit an `i64` for Redis' `PX`.
const MAX_TTL_MS: u128 = i64::MAX as u128;

/// The retry delay policy: full jitter, `rand(0, min(base * 2^attempt, cap))`.
///
/// A polling `Locker` sleeps it between attempts. A queued locker (`Locker<Queue>`) uses it only
/// while its subscription is down (its queued waiters are handed the lock, and otherwise look
/// again when a watch message or their process's housekeeper wakes them). A
/// sleep never passes the holder's remaining TTL or the wait deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
}

impl Backoff {
    /// Exponential backoff with full jitter from `base`, capped at `cap`.
    /// `base` must be non-zero and `cap >= base` (checked when the options are used).
    #[must_use]
    pub const fn exponential(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap }
    }

    /// The first attempt's upper bound.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }
}

impl Default for Backoff {
    /// Base 1 s, cap 1 min.
    fn default() -> Self {
        Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60))
    }
}

/// How one lock is taken and held.
///
/// ```
/// use std::time::Duration;
/// let opts = waitlock::LockOptions::new()
///     .with_ttl(Duration::from_secs(10))
///     .with_wait(Duration::from_secs(2));
/// assert_eq!(opts.ttl(), Duration::from_secs(10));
/// ```
/// Its `Debug` shows a fixed token as `<N bytes>`: tokens are secrets (anyone who has one can
/// release the lock).
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct LockOptions {
    ttl: Duration,
    wait: Duration,
    refresh: Refresh,
    token: Option<String>,
    backoff: Backoff,
    ordered_sets: bool,
}

/// When a held lock is refreshed, in `run` or after `LockGuard::keep_alive`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refresh {
    /// Never: the section gets the TTL and no more, and its loss token is cancelled when the
    /// TTL's validity deadline passes
    /// ([`LossReason::TtlElapsed`](crate::LossReason::TtlElapsed)).
    Off,
    /// Every `ratio × TTL` after the last refresh; `ratio` in `(0, 1)` (checked when the
    /// options are used, like every option).
    Every(f64),
}

impl Refresh {
    /// The ratio of the TTL after which a refresh is due; `None` when refresh is off.
    pub fn ratio(self) -> Option<f64> {
        match self {
            Refresh::Off => None,
            Refresh::Every(r) => Some(r),
        }
    }
}

impl std::fmt::Debug for LockOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockOptions")
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("refresh", &self.refresh)
            .field(
                "token",
                &self.token.as_ref().map(|t| format!("<{} bytes>", t.len())),
            )
            .field("backoff", &self.backoff)
            .field("ordered_sets", &self.ordered_sets)
            .finish()
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: Duration::from_secs(5),
            refresh: Refresh::Every(0.8),
            token: None,
            backoff: Backoff::default(),
            ordered_sets: false,
        }
    }
}

impl LockOptions {
    /// The defaults: TTL 30 s, wait 5 s, refresh ratio 0.8, a fresh UUID v4 token per
    /// acquisition, [`Backoff::default`].
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// How long Redis keeps the lock unless it is extended. Must be at least 1 ms and fit
    /// `i64` milliseconds; sub-millisecond parts are dropped. Defaults to 30 s.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long `acquire_wait` (and `run`) may wait for the lock. Zero means "try once".
    /// Defaults to 5 s.
    #[must_use]
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// When to refresh a held lock in `run` or after `LockGuard::keep_alive`, as a fraction
    /// of the TTL: [`Refresh::Every`]`(ratio)`, `ratio` in `(0, 1)`; 0 is the same as
    /// [`without_refresh`](Self::without_refresh). Defaults to 0.8.
    #[must_use]
    pub fn with_refresh_ratio(self, ratio: f64) -> Self {
        self.with_refresh(if ratio == 0.0 {
            Refresh::Off
        } else {
            Refresh::Every(ratio)
        })
    }

    /// Never refresh the lock ([`Refresh::Off`]): `run`'s section (or a guard's `keep_alive`)
    /// gets the TTL and no more, and its loss token is cancelled when the TTL's validity
    /// deadline passes ([`LossReason::TtlElapsed`](crate::LossReason::TtlElapsed)).
    #[must_use]
    pub fn without_refresh(self) -> Self {
        self.with_refresh(Refresh::Off)
    }

    /// When to refresh a held lock: [`Refresh::Off`] or [`Refresh::Every`]. Defaults to
    /// `Every(0.8)`.
    #[must_use]
    pub fn with_refresh(mut self, refresh: Refresh) -> Self {
        self.refresh = refresh;
        self
    }

    /// A fixed token instead of a fresh UUID v4 per acquisition. With a fixed token, acquiring
    /// a lock this token already holds gives [`Error::AlreadyHeld`]. Must be non-empty and at
    /// most 1,024 bytes. Defaults to none (a fresh UUID v4 each time).
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The retry delay policy. Defaults to [`Backoff::default`] (base 1 s, cap 1 min).
    #[must_use]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Lets [`Locker::acquire_many`](crate::Locker::acquire_many), `acquire_many_wait` and
    /// `run_many` take a set of keys **in order**: sorted by hash slot and then by key, the
    /// keys of one slot after those of the slot before, each slot's held (and refreshed) while
    /// the next slot's are waited for together, under one shared deadline. Every caller sorts
    /// the same way, so two sets that overlap cannot deadlock; but a waiter holds the keys of
    /// earlier slots while it waits, and FIFO holds per slot only (a set may be passed by a
    /// later one that does not need the slot it waits for).
    /// See `docs/design.md`, "Several keys at once". Needed only where a set cannot be taken
    /// at once: keys in several Cluster slots, and a queued locker's wait for more than 64
    /// keys. Keys on one node are taken at once whether it is set or not: by one attempt
    /// ([`Locker::acquire_many`](crate::Locker::acquire_many)), by a polling locker's wait, and
    /// by a queued locker's wait for up to 64 keys (in every key's queue at once, FIFO among
    /// overlapping sets). Off by default: without it, the calls that would take the set in
    /// order refuse it ([`Error::InvalidOptions`](crate::Error::InvalidOptions), field
    /// `ordered_sets`).
    #[must_use]
    pub fn with_ordered_sets(mut self) -> Self {
        self.ordered_sets = true;
        self
    }

    /// Whether a set of keys may be taken in order ([`with_ordered_sets`](Self::with_ordered_sets)).
    pub fn ordered_sets(&self) -> bool {
        self.ordered_sets
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait limit.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// When a held lock is refreshed.
    pub fn refresh(&self) -> Refresh {
        self.refresh
    }

    /// The fixed token, if one was set.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The retry delay policy.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// Checks every option (`key` only names the lock in errors); gives the validated plan.
    pub(crate) fn validate(&self, key: &str) -> Result<Plan> {
        let bad = |field, value: String, reason| Error::invalid_option(key, field, value, reason);
        let ttl_ms = check_ttl(key, self.ttl)?;
        if let Refresh::Every(ratio) = self.refresh {
            if !(ratio > 0.0 && ratio < 1.0) {
                return Err(bad(
                    "refresh_ratio",
                    ratio.to_string(),
                    "must be in (0, 1), or refresh off",
                ));
            }
        }
        if let Some(token) = &self.token {
            check_token(key, token)?;
        }
        if self.backoff.base.is_zero() {
            return Err(bad(
                "backoff.base",
                format!("{:?}", self.backoff.base),
                "must be non-zero",
            ));
        }
        if self.backoff.cap < self.backoff.base {
            return Err(bad(
                "backoff.cap",
                format!("{:?}", self.backoff.cap),
                "must be at least backoff.base",
            ));
        }
        if tokio::time::Instant::now().checked_add(self.wait).is_none() {
            return Err(bad(
                "wait",
                format!("{:?}", self.wait),
                "too large to form a deadline",
            ));
        }
        Ok(Plan {
            ttl_ms,
            refresh: self.refresh,
            wait: self.wait,
            backoff: self.backoff,
        })
    }
}

/// Validated options: what one acquisition will do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    /// The TTL in whole milliseconds (1 ..= i64::MAX).
    pub(crate) ttl_ms: u64,
    /// Its ratio, if any, in `(0, 1)`.
    pub(crate) refresh: Refresh,
    pub(crate) wait: Duration,
    pub(crate) backoff: Backoff,
}

impl Plan {
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }
}

/// A TTL in whole milliseconds, at least 1 and at most `i64::MAX`.
pub(crate) fn check_ttl(key: &str, ttl: Duration) -> Result<u64> {
    let ms = ttl.as_millis();
    if ms == 0 || ms > MAX_TTL_MS {
        return Err(Error::invalid_option(
            key,
            "ttl",
            format!("{ttl:?}"),
            "must be at least 1 ms and at most i64::MAX milliseconds",
        ));
    }
    Ok(ms as u64)
}

/// A token must be non-empty and at most [`MAX_TOKEN_LEN`] bytes.
pub(crate) fn check_token(key: &str, token: &str) -> Result<()> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(Error::invalid_option(
            key,
            "token",
            format!("<{} bytes>", token.len()),
            "must be non-empty and at most 1024 bytes",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_docs() {
        let o = LockOptions::new();
        assert_eq!(o.ttl(), Duration::from_secs(30));
        assert_eq!(o.wait(), Duration::from_secs(5));
        assert_eq!(o.refresh(), Refresh::Every(0.8));
        assert_eq!(o.clone().with_refresh_ratio(0.0).refresh(), Refresh::Off);
        assert_eq!(o.token(), None);
        assert_eq!(
            o.backoff(),
            Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60))
        );
        assert!(o.validate("k").is_ok());
    }

    #[test]
    fn each_bad_option_is_named() {
        let cases: Vec<(LockOptions, &str)> = vec![
            (LockOptions::new().with_ttl(Duration::ZERO), "ttl"),
            (
                LockOptions::new().with_ttl(Duration::from_micros(999)),
                "ttl",
            ),
            (LockOptions::new().with_ttl(Duration::MAX), "ttl"),
            (LockOptions::new().with_refresh_ratio(1.0), "refresh_ratio"),
            (LockOptions::new().with_refresh_ratio(-0.1), "refresh_ratio"),
            (
                LockOptions::new().with_refresh_ratio(f64::NAN),
                "refresh_ratio",
            ),
            (LockOptions::new().with_token(""), "token"),
            (LockOptions::new().with_token("x".repeat(1025)), "token"),
            (LockOptions::new().with_wait(Duration::MAX), "wait"),
            (
                LockOptions::new()
                    .with_backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO)),
                "backoff.base",
            ),
            (
                LockOptions::new().with_backoff(Backoff::exponential(
                    Duration::from_secs(2),
                    Duration::from_secs(1),
                )),
                "backoff.cap",
            ),
        ];
        for (opts, field) in cases {
            match opts.validate("job") {
                Err(Error::InvalidOptions { field: f, key, .. }) => {
                    assert_eq!(f, field);
                    assert_eq!(key, "job");
                }
                other => panic!("{field}: expected InvalidOptions, got {other:?}"),
            }
        }
    }
}
