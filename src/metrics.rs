//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! The library only emits; the application chooses the recorder (Prometheus, StatsD, ...), and
//! with none installed every call here costs a relaxed atomic load. Without the feature these
//! functions are empty. Names, units and labels are in README.md, "Metrics"; labels have
//! bounded values, and the key is a label only when the locker was built with
//! [`LockerBuilder::metrics_key_label`](crate::LockerBuilder::metrics_key_label).

use crate::error::{Error, LossReason};
use crate::stats::Meter;
use std::time::Duration;

/// Every metric's name, as the README's table has it.
pub mod names {
    /// Counter: acquisitions by outcome (`outcome` = `acquired`, `locked`, `wait_timeout`,
    /// `error`) and locker kind (`locker` = `poll`, `queue`).
    pub const ACQUISITIONS: &str = "waitlock_acquisitions_total";
    /// Histogram, seconds: how long successful waits (`acquire_wait`, `run`) waited.
    pub const WAIT_SECONDS: &str = "waitlock_wait_seconds";
    /// Counter: queued waiters that acquired, by how (`via` = `grant`: handed the lock by a
    /// release; `look`: by their own attempt, a watcher's look or a check after a wake-up).
    pub const HANDOFFS: &str = "waitlock_handoffs_total";
    /// Counter: held locks judged lost, by `reason` (`token_gone`, `unreachable`,
    /// `ttl_elapsed`, `not_replicated`).
    pub const LOCKS_LOST: &str = "waitlock_locks_lost_total";
    /// Counter: refreshes that could not reach Redis (each is retried until the deadline).
    pub const REFRESH_FAILURES: &str = "waitlock_refresh_failures_total";
    /// Histogram, waiters: the length of the key's queue when a waiter queued (itself
    /// included).
    pub const QUEUE_DEPTH: &str = "waitlock_queue_depth";
    /// Counter: reconnections of a queued locker's subscriber connection.
    pub const SUBSCRIBER_RECONNECTS: &str = "waitlock_subscriber_reconnects_total";
    /// Counter: critical sections whose release found the lock gone after the section ended
    /// within its lease (see `LockerStats::late_releases`).
    pub const LATE_RELEASES: &str = "waitlock_late_releases_total";
    /// Counter: attempts of polling callers that found waiters of a queued locker ahead of
    /// them (see `LockerStats::behind_queue`).
    pub const BEHIND_QUEUE: &str = "waitlock_behind_queue_total";

    /// Every name, for documentation and tests.
    pub const ALL: [&str; 9] = [
        ACQUISITIONS,
        WAIT_SECONDS,
        HANDOFFS,
        LOCKS_LOST,
        REFRESH_FAILURES,
        QUEUE_DEPTH,
        SUBSCRIBER_RECONNECTS,
        LATE_RELEASES,
        BEHIND_QUEUE,
    ];
}

#[cfg(feature = "metrics")]
mod emit {
    use super::*;
    use metrics::Label;

    /// The locker kind, then `extra`, then the key when the locker opted in.
    fn labels(meter: &Meter, key: &str, extra: &[(&'static str, &'static str)]) -> Vec<Label> {
        let mut l = Vec::with_capacity(extra.len() + 2);
        l.push(Label::from_static_parts("locker", meter.kind()));
        l.extend(extra.iter().map(|(k, v)| Label::from_static_parts(k, v)));
        if meter.key_label() && !key.is_empty() {
            l.push(Label::new("key", key.to_owned()));
        }
        l
    }

    pub(crate) fn acquisition<T>(
        meter: &Meter,
        key: &str,
        result: &Result<T, Error>,
        waited: Option<Duration>,
    ) {
        let outcome = match result {
            Ok(_) => "acquired",
            Err(Error::Locked { .. }) => "locked",
            Err(Error::WaitTimeout { .. }) => "wait_timeout",
            Err(_) => "error",
        };
        metrics::counter!(
            names::ACQUISITIONS,
            labels(meter, key, &[("outcome", outcome)])
        )
        .increment(1);
        if let (Ok(_), Some(w)) = (result, waited) {
            metrics::histogram!(names::WAIT_SECONDS, labels(meter, key, &[])).record(w);
        }
    }

    pub(crate) fn handoff(meter: &Meter, key: &str, by_grant: bool) {
        let via = if by_grant { "grant" } else { "look" };
        metrics::counter!(names::HANDOFFS, labels(meter, key, &[("via", via)])).increment(1);
    }

    pub(crate) fn lost(meter: &Meter, key: &str, reason: LossReason) {
        let reason = match reason {
            LossReason::TokenGone => "token_gone",
            LossReason::Unreachable => "unreachable",
            LossReason::TtlElapsed => "ttl_elapsed",
            LossReason::NotReplicated => "not_replicated",
        };
        metrics::counter!(names::LOCKS_LOST, labels(meter, key, &[("reason", reason)]))
            .increment(1);
    }

    pub(crate) fn refresh_failed(meter: &Meter, key: &str) {
        metrics::counter!(names::REFRESH_FAILURES, labels(meter, key, &[])).increment(1);
    }

    pub(crate) fn queue_depth(meter: &Meter, key: &str, depth: u64) {
        metrics::histogram!(names::QUEUE_DEPTH, labels(meter, key, &[])).record(depth as f64);
    }

    pub(crate) fn subscriber_reconnect(meter: &Meter) {
        metrics::counter!(names::SUBSCRIBER_RECONNECTS, labels(meter, "", &[])).increment(1);
    }

    pub(crate) fn late_release(meter: &Meter, key: &str) {
        metrics::counter!(names::LATE_RELEASES, labels(meter, key, &[])).increment(1);
    }

    pub(crate) fn behind_queue(meter: &Meter, key: &str) {
        metrics::counter!(names::BEHIND_QUEUE, labels(meter, key, &[])).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod emit {
    use super::*;

    pub(crate) fn acquisition<T>(_: &Meter, _: &str, _: &Result<T, Error>, _: Option<Duration>) {}
    pub(crate) fn handoff(_: &Meter, _: &str, _: bool) {}
    pub(crate) fn lost(_: &Meter, _: &str, _: LossReason) {}
    pub(crate) fn refresh_failed(_: &Meter, _: &str) {}
    pub(crate) fn queue_depth(_: &Meter, _: &str, _: u64) {}
    pub(crate) fn subscriber_reconnect(_: &Meter) {}
    pub(crate) fn late_release(_: &Meter, _: &str) {}
    pub(crate) fn behind_queue(_: &Meter, _: &str) {}
}

pub(crate) use emit::*;
