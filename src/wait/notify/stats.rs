//! The queue strategy's live counters (their snapshot is `crate::stats::WakeStats`).

use crate::stats::WakeStats;
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
