//! The pub/sub locker's counters and the registry's size: public figures for dashboards and
//! tests.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why a waiter woke up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum WakeReason {
    Notification = 0,
    Reconnect = 1,
    Lagged = 2,
    Resubscribed = 3,
    /// A watch message: this waiter is now the first of its queue.
    Watch = 4,
    /// The process resumed from a freeze (or a grant of this process lapsed): waiters look
    /// again, since the queue may have dropped them.
    Resumed = 5,
}

impl WakeReason {
    pub(crate) fn from_u8(v: u8) -> WakeReason {
        match v {
            1 => WakeReason::Reconnect,
            2 => WakeReason::Lagged,
            3 => WakeReason::Resubscribed,
            4 => WakeReason::Watch,
            5 => WakeReason::Resumed,
            _ => WakeReason::Notification,
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) attempts: AtomicU64,
    pub(crate) by_notification: AtomicU64,
    pub(crate) by_timer: AtomicU64,
    pub(crate) by_reconnect: AtomicU64,
    pub(crate) by_lagged: AtomicU64,
    pub(crate) by_resubscribe: AtomicU64,
    pub(crate) by_watch: AtomicU64,
    pub(crate) by_resume: AtomicU64,
    pub(crate) freezes: AtomicU64,
    pub(crate) probe_failures: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) lagged: AtomicU64,
    pub(crate) subscribes: AtomicU64,
    pub(crate) unsubscribes: AtomicU64,
    pub(crate) confirmed_on_arrival: AtomicU64,
    pub(crate) orphan_grants: AtomicU64,
    pub(crate) lost_subscriptions: AtomicU64,
}

impl Counters {
    pub(crate) fn woke(&self, reason: Option<WakeReason>) {
        let c = match reason {
            None => &self.by_timer,
            Some(WakeReason::Notification) => &self.by_notification,
            Some(WakeReason::Reconnect) => &self.by_reconnect,
            Some(WakeReason::Lagged) => &self.by_lagged,
            Some(WakeReason::Resubscribed) => &self.by_resubscribe,
            Some(WakeReason::Watch) => &self.by_watch,
            Some(WakeReason::Resumed) => &self.by_resume,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WakeStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WakeStats {
            attempts: g(&self.attempts),
            by_notification: g(&self.by_notification),
            by_timer: g(&self.by_timer),
            by_reconnect: g(&self.by_reconnect),
            by_lagged: g(&self.by_lagged),
            by_resubscribe: g(&self.by_resubscribe),
            by_watch: g(&self.by_watch),
            by_resume: g(&self.by_resume),
            freezes: g(&self.freezes),
            probe_failures: g(&self.probe_failures),
            reconnects: g(&self.reconnects),
            lagged: g(&self.lagged),
            subscribes: g(&self.subscribes),
            unsubscribes: g(&self.unsubscribes),
            confirmed_on_arrival: g(&self.confirmed_on_arrival),
            orphan_grants: g(&self.orphan_grants),
            lost_subscriptions: g(&self.lost_subscriptions),
        }
    }
}

/// A snapshot of a [`PubSubLocker`](crate::PubSubLocker)'s counters since it was built.
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
