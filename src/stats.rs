//! What a locker counts for dashboards and the command-line tool: outcomes of acquisitions,
//! a wait-time summary, lost locks, and (for a queued locker) why waiters woke.

use crate::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of one locker's counters (shared by its clones) since it was built.
///
/// Read it with [`Locker::stats`](crate::Locker::stats) or
/// [`Locker::stats`](crate::Locker::stats) and export the fields to whatever
/// metrics system you use; every counter only grows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockerStats {
    /// Locks taken by `acquire`, `acquire_wait` or `run`.
    pub acquisitions: u64,
    /// Waits that ended with [`Error::WaitTimeout`].
    pub wait_timeouts: u64,
    /// One-shot acquires that found the lock held ([`Error::Locked`]).
    pub locked: u64,
    /// Held locks judged lost (a refresh or confirmation found the token gone, Redis stayed
    /// unreachable until the validity deadline, or the TTL elapsed with refresh off).
    pub locks_lost: u64,
    /// Acquisitions that failed for another reason (Redis errors, timeouts, bad input).
    pub errors: u64,
    /// Critical sections (`run`) that ended while their lock was valid, whose release then
    /// found the lock gone (it reached Redis after the lease: a stalled server or a slow
    /// network). `run` returned the section's value: the lock was held throughout.
    pub late_releases: u64,
    /// Attempts without queueing (a polling locker's, or one-shot `acquire`) that found waiters
    /// of a queued locker on the key: they come first (FIFO), so a polling caller on a key
    /// that queued lockers keep busy waits until the queue drains. Use one kind of locker per
    /// contended key (see the crate docs, "Mixing lockers on one key").
    pub behind_queue: u64,
    /// How long successful `acquire_wait` / `run` calls waited for the lock.
    pub wait: WaitSummary,
    /// Why a queued locker's waiters woke (all zero for a polling one).
    pub wakes: WakeStats,
}

/// A summary of wait times: how many, the median, the 99th percentile and the longest.
/// Percentiles come from a log-scale histogram (within 10% of the true value).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitSummary {
    /// Waits recorded.
    pub count: u64,
    /// Median wait.
    pub p50: Duration,
    /// 99th percentile wait.
    pub p99: Duration,
    /// Longest wait.
    pub max: Duration,
}

/// A snapshot of a queued locker's ([`Locker<Queue>`](crate::Locker)) counters since it
/// was built; all zero for a polling locker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WakeStats {
    /// Acquire attempts sent by `acquire_wait` (the first, unqueued one; queueing ones; checks).
    pub attempts: u64,
    /// Waits ended by a grant: the release handed this waiter the lock.
    pub by_notification: u64,
    /// Waits ended by a timer (the first waiter's look when the holder's lease ends, the
    /// deadline, the backoff delay while the subscription is down, or the long safety
    /// interval).
    pub by_timer: u64,
    /// Waits ended because the subscriber connection came back (messages may have been lost).
    pub by_reconnect: u64,
    /// Waits ended because the message stream lagged (messages were dropped).
    pub by_lagged: u64,
    /// Waits ended because the key's subscription was confirmed again after it was lost or
    /// had failed.
    pub by_resubscribe: u64,
    /// Watch messages: a waiter became the first of its queue and watches the holder's lease.
    pub by_watch: u64,
    /// Waits woken because the process resumed from a freeze, or a grant of this process
    /// lapsed (its waiters look again: the queue may have dropped them).
    pub by_resume: u64,
    /// Times the process was found to have been frozen (its timers fired a second or more
    /// late).
    pub freezes: u64,
    /// Health probes of the subscriber connection that got no answer in time (each forces a
    /// reconnection).
    pub probe_failures: u64,
    /// Reconnections of the subscriber connection seen.
    pub reconnects: u64,
    /// Times the message stream reported lost messages.
    pub lagged: u64,
    /// Channels subscribed (counted per channel).
    pub subscribes: u64,
    /// Channels unsubscribed (counted per channel).
    pub unsubscribes: u64,
    /// Grants confirmed (one round trip) before `acquire_wait` returned: a short grant (the
    /// waiter's process had not been seen on the key lately), a grant that arrived late, or
    /// one from an older version that did not say its lease.
    pub confirmed_on_arrival: u64,
    /// Grants that arrived for a waiter that had already left, and were given back at once.
    pub orphan_grants: u64,
    /// Subscriptions Redis had dropped without a word (a Cluster slot moved), found by a
    /// queued waiter's check and made again.
    pub lost_subscriptions: u64,
}

/// How much the per-key registry holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegistrySize {
    /// Keys with at least one waiter in this process (each has one subscribed channel).
    pub keys: usize,
    /// Waiters in this process.
    pub waiters: usize,
}

/// Sub-buckets per power of two: 8 keeps every bucket within ~9% of its value.
const SUB: usize = 8;
const BUCKETS: usize = 64 * SUB;

/// The live counters behind [`LockerStats`].
pub(crate) struct Meter {
    acquisitions: AtomicU64,
    wait_timeouts: AtomicU64,
    locked: AtomicU64,
    pub(crate) locks_lost: AtomicU64,
    errors: AtomicU64,
    pub(crate) late_releases: AtomicU64,
    pub(crate) behind_queue: AtomicU64,
    /// The locker is a queued one (the `locker` label of its metrics).
    queued: std::sync::atomic::AtomicBool,
    /// Its metrics carry the key as a label (`LockerBuilder::metrics_key_label`).
    key_label: std::sync::atomic::AtomicBool,
    /// A polling caller was warned (once per locker) that it waits behind a queue.
    pub(crate) warned_behind_queue: std::sync::atomic::AtomicBool,
    waits: Box<[AtomicU64]>,
    wait_count: AtomicU64,
    wait_max_us: AtomicU64,
}

impl Default for Meter {
    fn default() -> Self {
        Meter {
            acquisitions: AtomicU64::new(0),
            wait_timeouts: AtomicU64::new(0),
            locked: AtomicU64::new(0),
            locks_lost: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            late_releases: AtomicU64::new(0),
            behind_queue: AtomicU64::new(0),
            queued: std::sync::atomic::AtomicBool::new(false),
            key_label: std::sync::atomic::AtomicBool::new(false),
            warned_behind_queue: std::sync::atomic::AtomicBool::new(false),
            waits: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            wait_count: AtomicU64::new(0),
            wait_max_us: AtomicU64::new(0),
        }
    }
}

/// The bucket of `us` microseconds: its power of two, then `SUB` linear steps within it.
fn bucket(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let power = 63 - us.leading_zeros() as usize; // >= 3
    let shift = power - SUB.trailing_zeros() as usize;
    let sub = ((us >> shift) as usize) & (SUB - 1);
    ((power - 2) * SUB + sub).min(BUCKETS - 1)
}

/// The largest value of bucket `b` (inverse of `bucket`).
fn bucket_top(b: usize) -> u64 {
    if b < SUB {
        return b as u64;
    }
    let power = b / SUB + 2;
    let sub = (b % SUB) as u64;
    let shift = power - SUB.trailing_zeros() as usize;
    ((SUB as u64 + sub + 1) << shift).saturating_sub(1)
}

impl Meter {
    /// Marks the locker as a queued one (for its metrics' `locker` label).
    pub(crate) fn set_queued(&self) {
        self.queued.store(true, Ordering::Relaxed);
    }

    /// Has its metrics carry the key as a label.
    pub(crate) fn set_key_label(&self, on: bool) {
        self.key_label.store(on, Ordering::Relaxed);
    }

    /// Whom a metric about `key` is about: the locker's kind (`poll` or `queue`), and the key
    /// when the locker opted in to the key label (an empty key is never a label).
    pub(crate) fn subject<'a>(&self, key: &'a str) -> crate::metrics::Subject<'a> {
        crate::metrics::Subject {
            locker: if self.queued.load(Ordering::Relaxed) {
                "queue"
            } else {
                "poll"
            },
            key: (self.key_label.load(Ordering::Relaxed) && !key.is_empty()).then_some(key),
        }
    }

    /// Counts the outcome of one acquisition on `key`; `waited` for a waiting one.
    pub(crate) fn record<T>(&self, key: &str, result: &Result<T, Error>, waited: Option<Duration>) {
        crate::metrics::acquisition(self.subject(key), result, waited);
        let c = match result {
            Ok(_) => {
                if let Some(w) = waited {
                    let us = w.as_micros().min(u64::MAX as u128) as u64;
                    self.waits[bucket(us)].fetch_add(1, Ordering::Relaxed);
                    self.wait_count.fetch_add(1, Ordering::Relaxed);
                    self.wait_max_us.fetch_max(us, Ordering::Relaxed);
                }
                &self.acquisitions
            }
            Err(Error::WaitTimeout { .. }) => &self.wait_timeouts,
            Err(Error::Locked { .. }) => &self.locked,
            Err(_) => &self.errors,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, wakes: WakeStats) -> LockerStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let counts: Vec<u64> = self.waits.iter().map(g).collect();
        let total: u64 = counts.iter().sum();
        let max = g(&self.wait_max_us);
        let pct = |q: f64| {
            if total == 0 {
                return Duration::ZERO;
            }
            let rank = ((total as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (b, n) in counts.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return Duration::from_micros(bucket_top(b).min(max));
                }
            }
            Duration::from_micros(max)
        };
        LockerStats {
            acquisitions: g(&self.acquisitions),
            wait_timeouts: g(&self.wait_timeouts),
            locked: g(&self.locked),
            locks_lost: g(&self.locks_lost),
            errors: g(&self.errors),
            late_releases: g(&self.late_releases),
            behind_queue: g(&self.behind_queue),
            wait: WaitSummary {
                count: g(&self.wait_count),
                p50: pct(0.5),
                p99: pct(0.99),
                max: Duration::from_micros(max),
            },
            wakes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_tight() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            100,
            1_000,
            12_345,
            1 << 40,
            u64::MAX / 2,
        ] {
            let b = bucket(us);
            assert!(b >= last, "{us}");
            last = b;
            let top = bucket_top(b);
            assert!(top >= us, "{us}: top {top}");
            assert!(top as f64 <= us as f64 * 1.13 + 1.0, "{us}: top {top}");
        }
    }

    #[test]
    fn percentiles_of_known_waits() {
        let m = Meter::default();
        for ms in 1..=100u64 {
            m.record("k", &Ok::<(), Error>(()), Some(Duration::from_millis(ms)));
        }
        let s = m.snapshot(WakeStats::default());
        assert_eq!(s.acquisitions, 100);
        assert_eq!(s.wait.count, 100);
        assert_eq!(s.wait.max, Duration::from_millis(100));
        let near = |d: Duration, ms: f64| (d.as_secs_f64() * 1e3 - ms).abs() <= ms * 0.1;
        assert!(near(s.wait.p50, 50.0), "{:?}", s.wait.p50);
        assert!(near(s.wait.p99, 99.0), "{:?}", s.wait.p99);
    }
}
