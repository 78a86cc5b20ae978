//! The hub: one subscriber connection per queued locker, the registry of its waiters, and the
//! tasks that keep both in line with Redis. By role:
//! - `registry.rs`: the waiters by grant channel, as plain data (no I/O; its rules are tested
//!   on a paused clock), and each waiter's mailbox (`Cell`) and channel state (`Slot`);
//! - `subscriber.rs`: the subscriber connection: opening it, (un)subscribing what the registry
//!   says, reconnects, and the cluster audit of lost shard channels;
//! - `tasks.rs`: the background tasks: the manager (the one ordered path that changes
//!   subscriptions), the dispatcher (messages and connection events) and the housekeeper
//!   (freezes, idle subscriptions, probes);
//! - here: the hub itself, a waiter's registration, and the delivery of a message to the
//!   waiter it names.
//!
//! One ordered path changes subscriptions: waiters only mark a channel dirty; the manager task
//! reads the registry and subscribes channels that have waiters and unsubscribes those that
//! have none. Since it always acts on the registry's current state, a subscribe and an
//! unsubscribe of one channel can never land in the wrong final order. A channel is
//! *confirmed* once Redis has processed its subscription (SSUBSCRIBE's reply; for classic
//! SUBSCRIBE, the reply of a PING sent after it): only then may a waiter queue in Redis, since
//! a release skips (as dead) a waiter nobody listens for.

mod registry;
mod subscriber;
mod tasks;

use registry::Registry;
pub(crate) use registry::{Cell, Slot, SubState};
pub(crate) use subscriber::{open, Mode};
pub(crate) use tasks::Events;
use tasks::{dispatch, housekeep, manage};

use super::stats::{Counters, WakeReason};
use crate::error::Result;
use crate::keys::Names;
use crate::redis::protocol::{self, Flag, Message};
use crate::redis::Engine;
use fred::clients::SubscriberClient;
use fred::interfaces::ClientLike;
use fred::types::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub(crate) struct Hub {
    /// This process's id in queue members and grant channels.
    pub(crate) pid: String,
    /// To give back grants whose waiter has left (weak: the engine owns nothing of the hub,
    /// and the hub must not keep the engine alive).
    engine: Weak<Engine>,
    pub(crate) mode: Mode,
    pub(crate) subscriber: SubscriberClient,
    registry: Mutex<Registry>,
    dirty: Mutex<Vec<String>>,
    manager_wake: Arc<Notify>,
    /// Changes requested so far, and changes the manager has applied.
    requested: AtomicU64,
    applied: watch::Sender<u64>,
    /// An unsubscribe was written since the last PING (fred resolves it when written).
    unconfirmed_unsubscribe: AtomicBool,
    /// Bumped on every reconnect: a sync that started before one confirms nothing.
    connection_epoch: AtomicU64,
    pub(crate) counters: Counters,
    command_timeout: Duration,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Writes the label again every third of the retention (5 s after a failure), so it lives
/// while the process does and the retention after; the first write is `build`'s. Off every
/// acquisition's path: one command per third of the retention.
async fn keep_label(engine: Weak<Engine>, pid: String) {
    let mut next = match engine.upgrade() {
        Some(e) => e.settings.retention / 3,
        None => return,
    };
    loop {
        tokio::time::sleep(next).await;
        let Some(e) = engine.upgrade() else {
            return;
        };
        let every = e.settings.retention / 3;
        next = if e.write_label(&pid).await {
            every
        } else {
            every.min(Duration::from_secs(5))
        };
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a few map operations that cannot panic halfway.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hub {
    /// Starts the manager and dispatcher over a subscriber that is already connected.
    pub(crate) fn start(
        engine: Weak<Engine>,
        subscriber: SubscriberClient,
        mode: Mode,
        events: Events,
        command_timeout: Duration,
    ) -> Arc<Hub> {
        let pid = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let hub = Arc::new(Hub {
            pid,
            engine,
            mode,
            subscriber,
            registry: Mutex::default(),
            dirty: Mutex::default(),
            manager_wake: Arc::new(Notify::new()),
            requested: AtomicU64::new(0),
            applied: watch::Sender::new(0),
            unconfirmed_unsubscribe: AtomicBool::new(false),
            connection_epoch: AtomicU64::new(0),
            counters: Counters::default(),
            command_timeout,
            tasks: Mutex::default(),
        });
        let manager = tokio::spawn(manage(Arc::downgrade(&hub), Arc::clone(&hub.manager_wake)));
        let dispatcher = tokio::spawn(dispatch(Arc::downgrade(&hub), events));
        let housekeeper = tokio::spawn(housekeep(Arc::downgrade(&hub)));
        let label = tokio::spawn(keep_label(hub.engine.clone(), hub.pid.clone()));
        lock(&hub.tasks).extend([manager, dispatcher, housekeeper, label]);
        hub
    }

    /// Keys with waiters, and waiters, in this process.
    pub(crate) fn size(&self) -> (usize, usize) {
        lock(&self.registry).size()
    }

    /// Whether this process listens on `channel` already (its waiters wait there, or did a
    /// moment ago): a new waiter then queues at once.
    pub(crate) fn listening(&self, channel: &str) -> bool {
        lock(&self.registry).listening(channel)
    }

    /// Drops the subscriptions nobody has waited on for `LINGER` (all of them with `all`).
    fn prune(&self, all: bool) {
        let idle = lock(&self.registry).take_idle(tokio::time::Instant::now(), all);
        for channel in idle {
            self.mark_dirty(channel);
        }
    }

    /// Joins the waiters of `channel` under `token`; the first one has it subscribed.
    pub(crate) fn register(
        self: &Arc<Self>,
        key: &str,
        channel: &str,
        token: &Arc<str>,
    ) -> Result<Registration> {
        let cell = Arc::new(Cell::new());
        let token = Arc::clone(token);
        // The subscription is requested before the registry lock goes: whoever sees this
        // waiter registered and then asks `settled()` waits for its subscription too (lock
        // order: registry, then dirty; nothing takes them the other way round).
        let mut registry = lock(&self.registry);
        let (slot, new) = registry.join(key, channel, &token, &cell)?;
        if new {
            self.mark_dirty(channel.to_owned());
        }
        drop(registry);
        Ok(Registration {
            hub: Arc::clone(self),
            token,
            slot,
            cell,
        })
    }

    fn leave(&self, channel: &str, token: &str) {
        lock(&self.registry).leave(channel, token, tokio::time::Instant::now());
    }

    fn mark_dirty(&self, channel: String) {
        let mut dirty = lock(&self.dirty);
        dirty.push(channel);
        self.requested.fetch_add(1, Ordering::SeqCst);
        drop(dirty);
        self.manager_wake.notify_one();
    }

    /// Resolves once Redis has processed every subscription change requested before the call.
    pub(crate) async fn settled(&self) {
        // Subscriptions that only linger go now.
        self.prune(true);
        let target = self.requested.load(Ordering::SeqCst);
        let mut rx = self.applied.subscribe();
        let _ = rx.wait_for(|applied| *applied >= target).await;
        // UNSUBSCRIBE and SUNSUBSCRIBE resolve when written: a PING's reply comes after Redis
        // processed them (sent here, not after every unsubscribe, to keep it off the hot path).
        if self.unconfirmed_unsubscribe.swap(false, Ordering::SeqCst) {
            let ping = self.subscriber.ping::<Value>(None);
            if !matches!(
                tokio::time::timeout(self.command_timeout, ping).await,
                Ok(Ok(_))
            ) {
                self.unconfirmed_unsubscribe.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Hands a grant or a watch message to the waiter of `channel` whose token it names.
    fn deliver(&self, channel: &str, text: &str) {
        let Some(message) = Message::parse(text) else {
            return;
        };
        let token = match message {
            Message::Grant { token, .. } | Message::Watch { token, .. } => token,
            Message::Dropped => {
                self.wake_channel(channel, WakeReason::Resumed);
                return;
            }
        };
        let cell = lock(&self.registry).cell(channel, token);
        match (message, cell) {
            (Message::Grant { grant, .. }, Some(cell)) => cell.put_grant(grant),
            (Message::Watch { px, at_us, .. }, Some(cell)) => cell.put_watch(px, at_us),
            // A set's waiter has left: every key of its grant given back, as for one key.
            (
                Message::Grant {
                    grant,
                    set: Some(locks),
                    ..
                },
                None,
            ) => {
                let (Some(locks), Some(engine)) =
                    (protocol::set_locks(locks), self.engine.upgrade())
                else {
                    return;
                };
                self.counters.orphan_grants.fetch_add(1, Ordering::Relaxed);
                engine.set_leave_in_background(
                    locks.into_iter().map(Names::from_lock).collect(),
                    token.to_owned(),
                    String::new(),
                    self.pid.clone(),
                    Some(grant.fences().collect()),
                );
            }
            // The waiter has left (its departure crossed the grant, or failed): give the lock
            // back at once so the next waiter is served now. Only this grant (by its fence): a
            // newer grant to the same token is kept.
            (Message::Grant { grant, .. }, None) => {
                let (Some(lock_name), Some(engine)) = (
                    protocol::lock_of_channel(channel, &self.pid),
                    self.engine.upgrade(),
                ) else {
                    return;
                };
                self.counters.orphan_grants.fetch_add(1, Ordering::Relaxed);
                engine.leave_in_background(
                    Names::from_lock(lock_name),
                    token.to_owned(),
                    String::new(),
                    self.pid.clone(),
                    Flag::Orphan(grant.fence),
                );
            }
            // A departed first waiter's leave told the next one already.
            (Message::Watch { .. }, None) => {}
            (Message::Dropped, _) => {}
        }
    }

    /// Wakes every waiter of `channel` in this process.
    pub(crate) fn wake_channel(&self, channel: &str, reason: WakeReason) {
        let cells = lock(&self.registry).cells(Some(channel));
        for c in cells {
            c.wake(reason);
        }
    }

    fn wake_all(&self, reason: WakeReason) {
        let cells = lock(&self.registry).cells(None);
        for c in cells {
            c.wake(reason);
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
    token: Arc<str>,
    pub(crate) slot: Arc<Slot>,
    pub(crate) cell: Arc<Cell>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.leave(&self.slot.channel, &self.token);
    }
}
