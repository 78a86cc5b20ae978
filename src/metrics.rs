//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`).
//!
//! The library only emits; the application chooses the recorder (Prometheus, StatsD, ...), and
//! with none installed every call here costs a relaxed atomic load. Without the feature these
//! functions are empty. Names, units and labels are in README.md, "Metrics"; labels have
//! bounded values, and the key is a label only when the locker was built with
//! [`LockerBuilder::metrics_key_label`](crate::LockerBuilder::metrics_key_label).

use crate::error::{Error, LossReason};
use std::time::Duration;

/// Whom a metric is about, as plain values (`Meter::subject` makes it): the locker's kind
/// (`poll`, `queue`), and the key when the locker opted in to the key label.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Subject<'a> {
    pub(crate) locker: &'static str,
    pub(crate) key: Option<&'a str>,
}

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
    fn labels(s: Subject<'_>, extra: &[(&'static str, &'static str)]) -> Vec<Label> {
        let mut l = Vec::with_capacity(extra.len() + 2);
        l.push(Label::from_static_parts("locker", s.locker));
        l.extend(extra.iter().map(|(k, v)| Label::from_static_parts(k, v)));
        if let Some(key) = s.key {
            l.push(Label::new("key", key.to_owned()));
        }
        l
    }

    pub(crate) fn acquisition<T>(
        s: Subject<'_>,
        result: &Result<T, Error>,
        waited: Option<Duration>,
    ) {
        let outcome = match result {
            Ok(_) => "acquired",
            Err(Error::Locked { .. }) => "locked",
            Err(Error::WaitTimeout { .. }) => "wait_timeout",
            Err(_) => "error",
        };
        metrics::counter!(names::ACQUISITIONS, labels(s, &[("outcome", outcome)])).increment(1);
        if let (Ok(_), Some(w)) = (result, waited) {
            metrics::histogram!(names::WAIT_SECONDS, labels(s, &[])).record(w);
        }
    }

    pub(crate) fn handoff(s: Subject<'_>, by_grant: bool) {
        let via = if by_grant { "grant" } else { "look" };
        metrics::counter!(names::HANDOFFS, labels(s, &[("via", via)])).increment(1);
    }

    pub(crate) fn lost(s: Subject<'_>, reason: LossReason) {
        let reason = match reason {
            LossReason::TokenGone => "token_gone",
            LossReason::Unreachable => "unreachable",
            LossReason::TtlElapsed => "ttl_elapsed",
            LossReason::NotReplicated => "not_replicated",
        };
        metrics::counter!(names::LOCKS_LOST, labels(s, &[("reason", reason)])).increment(1);
    }

    pub(crate) fn refresh_failed(s: Subject<'_>) {
        metrics::counter!(names::REFRESH_FAILURES, labels(s, &[])).increment(1);
    }

    pub(crate) fn queue_depth(s: Subject<'_>, depth: u64) {
        metrics::histogram!(names::QUEUE_DEPTH, labels(s, &[])).record(depth as f64);
    }

    pub(crate) fn subscriber_reconnect(s: Subject<'_>) {
        metrics::counter!(names::SUBSCRIBER_RECONNECTS, labels(s, &[])).increment(1);
    }

    pub(crate) fn late_release(s: Subject<'_>) {
        metrics::counter!(names::LATE_RELEASES, labels(s, &[])).increment(1);
    }

    pub(crate) fn behind_queue(s: Subject<'_>) {
        metrics::counter!(names::BEHIND_QUEUE, labels(s, &[])).increment(1);
    }
}

#[cfg(not(feature = "metrics"))]
mod emit {
    use super::*;

    pub(crate) fn acquisition<T>(_: Subject<'_>, _: &Result<T, Error>, _: Option<Duration>) {}
    pub(crate) fn handoff(_: Subject<'_>, _: bool) {}
    pub(crate) fn lost(_: Subject<'_>, _: LossReason) {}
    pub(crate) fn refresh_failed(_: Subject<'_>) {}
    pub(crate) fn queue_depth(_: Subject<'_>, _: u64) {}
    pub(crate) fn subscriber_reconnect(_: Subject<'_>) {}
    pub(crate) fn late_release(_: Subject<'_>) {}
    pub(crate) fn behind_queue(_: Subject<'_>) {}
}

pub(crate) use emit::*;
