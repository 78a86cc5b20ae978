//! The shared subscriber connection and the per-key registry of waiters.
//!
//! One ordered path changes subscriptions: waiters only mark a channel dirty; the manager task
//! reads the registry and sends SUBSCRIBE for channels that have waiters and UNSUBSCRIBE for
//! those that have none, then PINGs so that Redis has processed them before any waiter relies
//! on them. Since the manager always acts on the registry's current state, a SUBSCRIBE and an
//! UNSUBSCRIBE of one channel can never land in the wrong final order.

use crate::pubsub::stats::{Counters, WakeReason};
use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, PubsubInterface};
use fred::types::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::{broadcast::error::RecvError, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Whether Redis has confirmed a channel's subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubState {
    Pending,
    Confirmed,
    /// The last try failed; the manager retries. Waiters fall back to their timers.
    Failed,
}

/// Per-key waiting state, shared by the key's waiters in this process.
pub(crate) struct Slot {
    pub(crate) sub: watch::Sender<SubState>,
    pub(crate) notify: Notify,
    epoch: AtomicU64,
    reason: AtomicU8,
    /// The local queue: only the waiter holding it contends in Redis. tokio's mutex is FIFO.
    pub(crate) gate: tokio::sync::Mutex<()>,
    /// Set by a local waiter that took the lock: the epoch it saw before its winning attempt,
    /// and when that lock expires at the latest.
    hint: Mutex<Option<Hint>>,
    /// How many processes subscribed to the channel, as the last release message said.
    subscribers: AtomicU64,
    /// Release messages seen, and how many had been seen when a head of this process last won.
    releases: AtomicU64,
    won_at: Mutex<Option<u64>>,
}

/// What the local waiter that took the lock left for the next head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hint {
    pub(crate) epoch: u64,
    pub(crate) expires: Instant,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            sub: watch::Sender::new(SubState::Pending),
            notify: Notify::new(),
            epoch: AtomicU64::new(0),
            reason: AtomicU8::new(WakeReason::Notification as u8),
            gate: tokio::sync::Mutex::new(()),
            hint: Mutex::new(None),
            subscribers: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            won_at: Mutex::new(None),
        }
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    pub(crate) fn reason(&self) -> WakeReason {
        WakeReason::from_u8(self.reason.load(Ordering::SeqCst))
    }

    fn wake(&self, reason: WakeReason) {
        self.reason.store(reason as u8, Ordering::SeqCst);
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn set_hint(&self, hint: Hint) {
        *lock(&self.hint) = Some(hint);
    }

    pub(crate) fn hint(&self) -> Option<Hint> {
        *lock(&self.hint)
    }

    /// A head of this process took the lock.
    pub(crate) fn won(&self) {
        *lock(&self.won_at) = Some(self.releases.load(Ordering::SeqCst));
    }

    /// Whether a head woken by a release message should let other processes go first.
    ///
    /// Round robin across processes: the message says how many processes wait (subscribers,
    /// ours included); a process that won defers until that many releases have passed since
    /// its win (its own release counts as the first). In steady contention exactly one process
    /// (the one that won longest ago) attempts on each release; a process that never won, or
    /// whose count is stale, never defers. Without this, the releasing process, whose threads
    /// are awake, would win nearly every race against parked ones.
    pub(crate) fn should_defer(&self) -> bool {
        let subscribers = self.subscribers.load(Ordering::SeqCst);
        let Some(won_at) = *lock(&self.won_at) else {
            return false;
        };
        let since = self.releases.load(Ordering::SeqCst).saturating_sub(won_at);
        subscribers > 1 && since < subscribers
    }
}

struct Entry {
    slot: Arc<Slot>,
    waiters: usize,
}

pub(crate) struct Hub {
    pub(crate) subscriber: SubscriberClient,
    registry: Mutex<HashMap<String, Entry>>,
    dirty: Mutex<Vec<String>>,
    manager_wake: Arc<Notify>,
    /// Changes requested so far, and changes the manager has applied (confirmed by Redis).
    requested: AtomicU64,
    applied: watch::Sender<u64>,
    pub(crate) counters: Counters,
    command_timeout: Duration,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a few map operations that cannot panic halfway.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hub {
    /// Starts the manager and dispatcher over a subscriber that is already connected.
    pub(crate) fn start(
        subscriber: SubscriberClient,
        messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
        reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
        command_timeout: Duration,
    ) -> Arc<Hub> {
        let hub = Arc::new(Hub {
            subscriber,
            registry: Mutex::default(),
            dirty: Mutex::default(),
            manager_wake: Arc::new(Notify::new()),
            requested: AtomicU64::new(0),
            applied: watch::Sender::new(0),
            counters: Counters::default(),
            command_timeout,
            tasks: Mutex::default(),
        });
        let manager = tokio::spawn(manage(Arc::downgrade(&hub), Arc::clone(&hub.manager_wake)));
        let dispatcher = tokio::spawn(dispatch(Arc::downgrade(&hub), messages, reconnects));
        lock(&hub.tasks).extend([manager, dispatcher]);
        hub
    }

    /// Keys with waiters, and waiters, in this process.
    pub(crate) fn size(&self) -> (usize, usize) {
        let reg = lock(&self.registry);
        (reg.len(), reg.values().map(|e| e.waiters).sum())
    }

    pub(crate) fn has_waiters(&self, channel: &str) -> bool {
        lock(&self.registry).contains_key(channel)
    }

    /// Joins the waiters of `channel`; the first one has it subscribed.
    pub(crate) fn register(self: &Arc<Self>, channel: &str) -> Registration {
        let slot = {
            let mut reg = lock(&self.registry);
            match reg.get_mut(channel) {
                Some(e) => {
                    e.waiters += 1;
                    Arc::clone(&e.slot)
                }
                None => {
                    let slot = Arc::new(Slot::new());
                    reg.insert(
                        channel.to_owned(),
                        Entry {
                            slot: Arc::clone(&slot),
                            waiters: 1,
                        },
                    );
                    self.mark_dirty(channel.to_owned());
                    slot
                }
            }
        };
        Registration {
            hub: Arc::clone(self),
            channel: channel.to_owned(),
            slot,
        }
    }

    fn leave(&self, channel: &str) {
        let mut reg = lock(&self.registry);
        if let Some(e) = reg.get_mut(channel) {
            e.waiters -= 1;
            if e.waiters == 0 {
                reg.remove(channel);
                self.mark_dirty(channel.to_owned());
            }
        }
    }

    fn mark_dirty(&self, channel: String) {
        let mut dirty = lock(&self.dirty);
        dirty.push(channel);
        self.requested.fetch_add(1, Ordering::SeqCst);
        drop(dirty);
        self.manager_wake.notify_one();
    }

    /// Resolves once Redis has confirmed every subscription change requested before the call.
    pub(crate) async fn settled(&self) {
        let target = self.requested.load(Ordering::SeqCst);
        let mut rx = self.applied.subscribe();
        let _ = rx.wait_for(|applied| *applied >= target).await;
    }

    fn slot(&self, channel: &str) -> Option<Arc<Slot>> {
        lock(&self.registry)
            .get(channel)
            .map(|e| Arc::clone(&e.slot))
    }

    fn wake_all(&self, reason: WakeReason) {
        let slots: Vec<Arc<Slot>> = lock(&self.registry)
            .values()
            .map(|e| Arc::clone(&e.slot))
            .collect();
        for s in slots {
            s.wake(reason);
        }
    }

    /// After a reconnect: every subscription is gone and messages may have been lost.
    fn on_reconnect(&self) {
        let channels: Vec<String> = lock(&self.registry).keys().cloned().collect();
        tracing::debug!(
            channels = channels.len(),
            "subscriber reconnected; resubscribing and waking every waiter"
        );
        lock(&self.dirty).extend(channels);
        self.manager_wake.notify_one();
        self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        self.wake_all(WakeReason::Reconnect);
    }

    /// Brings Redis' subscriptions in line with the registry. Returns false when it failed
    /// (the channels stay dirty).
    async fn sync(&self) -> bool {
        let (mut channels, requested) = {
            let mut dirty = lock(&self.dirty);
            (
                std::mem::take(&mut *dirty),
                self.requested.load(Ordering::SeqCst),
            )
        };
        if channels.is_empty() {
            self.applied
                .send_if_modified(|a| std::mem::replace(a, requested) != requested);
            return true;
        }
        channels.sort_unstable();
        channels.dedup();
        let mut subs = Vec::new();
        let mut unsubs = Vec::new();
        {
            let reg = lock(&self.registry);
            for ch in channels.iter() {
                match reg.get(ch) {
                    Some(e) => subs.push((ch.clone(), Arc::clone(&e.slot))),
                    None => unsubs.push(ch.clone()),
                }
            }
        }
        let sub_names: Vec<String> = subs.iter().map(|(c, _)| c.clone()).collect();
        let result = tokio::time::timeout(self.command_timeout, async {
            if !unsubs.is_empty() {
                self.subscriber.unsubscribe(unsubs.clone()).await?;
            }
            if !sub_names.is_empty() {
                self.subscriber.subscribe(sub_names.clone()).await?;
            }
            if !sub_names.is_empty() {
                // SUBSCRIBE resolves when written; PING's reply comes after Redis processed it.
                self.subscriber.ping::<Value>(None).await?;
            }
            Ok::<(), fred::error::Error>(())
        })
        .await;
        match result {
            Ok(Ok(())) => {
                self.counters
                    .subscribes
                    .fetch_add(sub_names.len() as u64, Ordering::Relaxed);
                self.counters
                    .unsubscribes
                    .fetch_add(unsubs.len() as u64, Ordering::Relaxed);
                for (_, slot) in subs {
                    if slot.sub.send_replace(SubState::Confirmed) == SubState::Failed {
                        // Waiters polled on timers meanwhile and may have missed a release.
                        slot.wake(WakeReason::Resubscribed);
                    }
                }
                self.applied
                    .send_if_modified(|a| std::mem::replace(a, requested) != requested);
                true
            }
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {:?}", self.command_timeout),
                };
                tracing::warn!(%error, channels = channels.len(), "subscription sync failed; waiters fall back to timers until it succeeds");
                for (_, slot) in &subs {
                    slot.sub.send_if_modified(|s| {
                        let changed = *s == SubState::Pending;
                        if changed {
                            *s = SubState::Failed;
                        }
                        changed
                    });
                }
                lock(&self.dirty).extend(channels);
                false
            }
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let subscriber = self.subscriber.clone();
            handle.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), subscriber.quit()).await;
            });
        }
    }
}

/// A waiter's membership in its key's slot; leaving is its drop, so a dropped future leaves.
pub(crate) struct Registration {
    hub: Arc<Hub>,
    channel: String,
    pub(crate) slot: Arc<Slot>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.leave(&self.channel);
    }
}

async fn manage(hub: Weak<Hub>, wake: Arc<Notify>) {
    let mut retry = Duration::from_millis(20);
    loop {
        wake.notified().await;
        loop {
            let Some(h) = hub.upgrade() else { return };
            if h.sync().await {
                retry = Duration::from_millis(20);
                break;
            }
            drop(h);
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(1));
        }
    }
}

async fn dispatch(
    hub: Weak<Hub>,
    mut messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    mut reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
) {
    loop {
        tokio::select! {
            m = messages.recv() => {
                let Some(h) = hub.upgrade() else { return };
                match m {
                    Ok(msg) => {
                        // A message on a channel nobody waits on any more is simply dropped.
                        if let Some(slot) = h.slot(&msg.channel) {
                            // "<fence> <subscribers>" (the fence is for people reading the
                            // channel); anything else (a stray PUBLISH) still wakes, counted as
                            // a release with no subscriber figure, so nobody defers on it.
                            let text = msg.value.as_string().unwrap_or_default();
                            let subscribers = text
                                .split(' ')
                                .nth(1)
                                .and_then(|n| n.parse::<u64>().ok())
                                .unwrap_or(0);
                            slot.subscribers.store(subscribers, Ordering::SeqCst);
                            slot.releases.fetch_add(1, Ordering::SeqCst);
                            slot.wake(WakeReason::Notification);
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "subscriber lagged; waking every waiter");
                        h.counters.lagged.fetch_add(1, Ordering::Relaxed);
                        h.wake_all(WakeReason::Lagged);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
            r = reconnects.recv() => {
                let Some(h) = hub.upgrade() else { return };
                match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => h.on_reconnect(),
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }
}
