//! The waiters of one process by grant channel: plain data, no I/O. Each waiter has a mailbox
//! (`Cell`: the grant or watch message the dispatcher found for it, and a wake-up); each
//! channel a `Slot` (whether Redis confirmed its subscription) shared by its waiters.

use super::lock;
use crate::error::{Error, Result};
use crate::redis::protocol::Grant;
use crate::wait::notify::stats::WakeReason;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SubState {
    Pending = 0,
    Confirmed = 1,
    /// The last try failed; the manager retries. Waiters poll meanwhile.
    Failed = 2,
}

/// One waiter's mailbox: the grant or watch message the dispatcher found for it, and a
/// wake-up.
pub(crate) struct Cell {
    mail: Mutex<Mail>,
    pub(crate) wake: Notify,
    reason: AtomicU8,
    /// A wake-up from the hub (reconnect, lost messages, resubscribed, resumed, dropped) came
    /// since the waiter last looked: it must look at the lock, whatever else it was told.
    hub_woke: AtomicBool,
}

#[derive(Default)]
struct Mail {
    grant: Option<Grant>,
    /// A watch message: the holder's lease ends in this long, from this Redis time (µs; `None`
    /// from an older release, which did not say).
    watch: Option<(Duration, Option<u64>)>,
}

impl Cell {
    pub(super) fn new() -> Cell {
        Cell {
            mail: Mutex::default(),
            wake: Notify::new(),
            reason: AtomicU8::new(WakeReason::Notification as u8),
            hub_woke: AtomicBool::new(false),
        }
    }

    /// Whether the hub woke this waiter since the last call (see `hub_woke`).
    pub(crate) fn take_hub_wake(&self) -> bool {
        self.hub_woke.swap(false, Ordering::SeqCst)
    }

    /// A grant delivered to this waiter, if one was.
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        lock(&self.mail).grant.take()
    }

    /// A watch message delivered to this waiter, if one was: the holder's remaining lease, and
    /// Redis' time when it was that (µs).
    pub(crate) fn take_watch(&self) -> Option<(Duration, Option<u64>)> {
        lock(&self.mail).watch.take()
    }

    /// Leaves `grant` in the mailbox and wakes the waiter.
    pub(super) fn put_grant(&self, grant: Grant) {
        lock(&self.mail).grant = Some(grant);
        self.wake(WakeReason::Notification);
    }

    /// Leaves a watch message in the mailbox and wakes the waiter.
    pub(super) fn put_watch(&self, px: Duration, at_us: Option<u64>) {
        lock(&self.mail).watch = Some((px, at_us));
        self.wake(WakeReason::Watch);
    }

    pub(crate) fn reason(&self) -> WakeReason {
        WakeReason::from_u8(self.reason.load(Ordering::SeqCst))
    }

    pub(super) fn wake(&self, reason: WakeReason) {
        if !matches!(reason, WakeReason::Notification | WakeReason::Watch) {
            self.hub_woke.store(true, Ordering::SeqCst);
        }
        self.reason.store(reason as u8, Ordering::SeqCst);
        // A stored permit: a waiter that is not parked yet still sees it.
        self.wake.notify_one();
    }
}

/// Per-key state shared by the key's waiters in this process. Its waiters are woken
/// (`Resubscribed`) whenever it becomes confirmed after being pending or failed.
pub(crate) struct Slot {
    sub: AtomicU8,
    pub(crate) channel: String,
}

impl Slot {
    pub(crate) fn state(&self) -> SubState {
        match self.sub.load(Ordering::SeqCst) {
            1 => SubState::Confirmed,
            2 => SubState::Failed,
            _ => SubState::Pending,
        }
    }

    /// Sets the state; returns the previous one.
    pub(super) fn set(&self, s: SubState) -> SubState {
        match self.sub.swap(s as u8, Ordering::SeqCst) {
            1 => SubState::Confirmed,
            2 => SubState::Failed,
            _ => SubState::Pending,
        }
    }
}

struct Entry {
    slot: Arc<Slot>,
    /// By token (shared with each waiter's registration).
    waiters: HashMap<Arc<str>, Arc<Cell>>,
    /// When its last waiter left: the subscription lingers a moment (a key waited on again
    /// soon costs no SUBSCRIBE and no UNSUBSCRIBE, and its next waiter queues at once).
    idle_since: Option<tokio::time::Instant>,
}

/// How long a key's subscription outlives its last waiter.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// The waiters of this process by grant channel: plain data, no I/O, so its rules (one
/// subscription per channel however many waiters, a channel kept while it has waiters or
/// lingers, a token at most once per channel) are tested without Redis.
#[derive(Default)]
pub(super) struct Registry {
    map: HashMap<String, Entry>,
}

impl Registry {
    /// Joins `token`'s `cell` to `channel`'s waiters. Returns its slot, and whether the channel
    /// is new (it must be subscribed).
    pub(super) fn join(
        &mut self,
        key: &str,
        channel: &str,
        token: &Arc<str>,
        cell: &Arc<Cell>,
    ) -> Result<(Arc<Slot>, bool)> {
        let mut new = false;
        let entry = self.map.entry(channel.to_owned()).or_insert_with(|| {
            new = true;
            Entry {
                slot: Arc::new(Slot {
                    sub: AtomicU8::new(SubState::Pending as u8),
                    channel: channel.to_owned(),
                }),
                waiters: HashMap::new(),
                idle_since: None,
            }
        });
        if entry.waiters.contains_key(token) {
            return Err(Error::invalid_option(
                key,
                "token",
                format!("<{} bytes>", token.len()),
                "another waiter of this locker waits on this key with the same token",
            ));
        }
        entry.idle_since = None;
        entry.waiters.insert(Arc::clone(token), Arc::clone(cell));
        Ok((Arc::clone(&entry.slot), new))
    }

    /// `token` leaves `channel`; the channel lingers from `now` when it was the last.
    pub(super) fn leave(&mut self, channel: &str, token: &str, now: tokio::time::Instant) {
        if let Some(e) = self.map.get_mut(channel) {
            e.waiters.remove(token);
            if e.waiters.is_empty() && e.idle_since.is_none() {
                e.idle_since = Some(now);
            }
        }
    }

    /// Removes and returns the channels nobody has waited on for `LINGER` (every idle one
    /// with `all`).
    pub(super) fn take_idle(&mut self, now: tokio::time::Instant, all: bool) -> Vec<String> {
        let idle: Vec<String> = self
            .map
            .iter()
            .filter(|(_, e)| {
                e.waiters.is_empty()
                    && e.idle_since
                        .is_some_and(|t| all || now.saturating_duration_since(t) >= LINGER)
            })
            .map(|(c, _)| c.clone())
            .collect();
        for channel in &idle {
            self.map.remove(channel);
        }
        idle
    }

    /// Channels with waiters, and waiters.
    pub(super) fn size(&self) -> (usize, usize) {
        let waiting = self.map.values().filter(|e| !e.waiters.is_empty());
        (
            waiting.clone().count(),
            waiting.map(|e| e.waiters.len()).sum(),
        )
    }

    /// The mailbox of `token`'s waiter on `channel`, if it waits there.
    pub(super) fn cell(&self, channel: &str, token: &str) -> Option<Arc<Cell>> {
        self.map.get(channel)?.waiters.get(token).cloned()
    }

    /// The mailboxes of `channel`'s waiters (of every channel's with `None`).
    pub(super) fn cells(&self, channel: Option<&str>) -> Vec<Arc<Cell>> {
        match channel {
            Some(c) => self
                .map
                .get(c)
                .map(|e| e.waiters.values().cloned().collect())
                .unwrap_or_default(),
            None => self
                .map
                .values()
                .flat_map(|e| e.waiters.values().cloned())
                .collect(),
        }
    }

    /// The slot of `channel`, if the channel is registered.
    pub(super) fn slot(&self, channel: &str) -> Option<&Arc<Slot>> {
        self.map.get(channel).map(|e| &e.slot)
    }

    /// Every registered channel's slot.
    pub(super) fn slots(&self) -> impl Iterator<Item = &Arc<Slot>> {
        self.map.values().map(|e| &e.slot)
    }

    /// Whether `channel` has waiters, or a confirmed subscription that lingers.
    pub(super) fn listening(&self, channel: &str) -> bool {
        self.map
            .get(channel)
            .is_some_and(|e| !e.waiters.is_empty() || e.slot.state() == SubState::Confirmed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    fn waiter(reg: &mut Registry, channel: &str, token: &str) -> Result<(Arc<Slot>, bool)> {
        reg.join("k", channel, &Arc::from(token), &Arc::new(Cell::new()))
    }

    #[tokio::test(start_paused = true)]
    async fn one_subscription_per_channel_however_many_waiters() {
        let mut reg = Registry::default();
        let (a, new_a) = waiter(&mut reg, "c", "t1").expect("join");
        let (b, new_b) = waiter(&mut reg, "c", "t2").expect("join");
        assert!(new_a && !new_b, "only the first waiter subscribes");
        assert!(
            Arc::ptr_eq(&a, &b),
            "the waiters of a channel share its slot"
        );
        assert_eq!(reg.size(), (1, 2));
        let (_, new_d) = waiter(&mut reg, "d", "t1").expect("the same token on another key");
        assert!(new_d);
        assert_eq!(reg.size(), (2, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_waits_at_most_once_per_channel() {
        let mut reg = Registry::default();
        waiter(&mut reg, "c", "t").expect("join");
        let e = waiter(&mut reg, "c", "t").err().expect("refused");
        assert!(
            matches!(e, Error::InvalidOptions { field: "token", .. }),
            "{e:?}"
        );
        assert_eq!(reg.size(), (1, 1), "the refusal changed nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_channel_lingers_after_its_last_waiter_then_goes() {
        let mut reg = Registry::default();
        waiter(&mut reg, "c", "t1").expect("join");
        waiter(&mut reg, "c", "t2").expect("join");
        reg.leave("c", "t1", Instant::now());
        assert!(reg.listening("c"), "one waiter is left");
        assert!(reg.take_idle(Instant::now(), false).is_empty());
        reg.leave("c", "t2", Instant::now());
        assert_eq!(reg.size(), (0, 0));
        // Pending, no waiter: a new waiter must not queue before Redis confirms again.
        assert!(!reg.listening("c"));
        tokio::time::advance(LINGER - Duration::from_millis(1)).await;
        assert!(
            reg.take_idle(Instant::now(), false).is_empty(),
            "kept within the linger"
        );
        // A waiter that comes back within the linger reuses the subscription.
        let (_, new) = waiter(&mut reg, "c", "t3").expect("join");
        assert!(!new, "no second SUBSCRIBE within the linger");
        reg.leave("c", "t3", Instant::now());
        tokio::time::advance(LINGER).await;
        assert_eq!(reg.take_idle(Instant::now(), false), vec!["c".to_owned()]);
        let (_, new) = waiter(&mut reg, "c", "t4").expect("join");
        assert!(new, "after the linger the channel is subscribed again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_confirmed_lingering_channel_still_listens_and_settling_drops_it() {
        let mut reg = Registry::default();
        let (slot, _) = waiter(&mut reg, "c", "t").expect("join");
        slot.set(SubState::Confirmed);
        reg.leave("c", "t", Instant::now());
        assert!(reg.listening("c"), "a confirmed subscription lingers");
        // Leaving twice, or a token that never joined, does not restart the linger.
        tokio::time::advance(LINGER / 2).await;
        reg.leave("c", "t", Instant::now());
        reg.leave("c", "never", Instant::now());
        tokio::time::advance(LINGER / 2).await;
        assert_eq!(reg.take_idle(Instant::now(), false), vec!["c".to_owned()]);
        // `all` (settling) drops every idle channel at once, and only idle ones.
        waiter(&mut reg, "d", "t").expect("join");
        waiter(&mut reg, "e", "t").expect("join");
        reg.leave("e", "t", Instant::now());
        assert_eq!(reg.take_idle(Instant::now(), true), vec!["e".to_owned()]);
        assert_eq!(reg.size(), (1, 1));
    }
}
