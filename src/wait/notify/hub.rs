//! The shared subscriber connection, the per-key registry of waiters, and the dispatcher that
//! hands each grant to its waiter.
//!
//! One ordered path changes subscriptions: waiters only mark a channel dirty; the manager task
//! reads the registry and subscribes channels that have waiters and unsubscribes those that
//! have none. Since it always acts on the registry's current state, a subscribe and an
//! unsubscribe of one channel can never land in the wrong final order. A channel is
//! *confirmed* once Redis has processed its subscription (SSUBSCRIBE's reply; for classic
//! SUBSCRIBE, the reply of a PING sent after it): only then may a waiter queue in Redis, since
//! a release skips (as dead) a waiter nobody listens for.

use super::stats::{Counters, WakeReason};
use crate::error::{Error, Result};
use crate::keys::Names;
use crate::redis::protocol::{self, Grant, LeaveFlag, Message};
use crate::redis::Engine;
use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, PubsubInterface};
use fred::types::{ClusterStateChange, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::{broadcast::error::RecvError, watch, Notify};
use tokio::task::JoinHandle;

/// How this server's pub/sub is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// SSUBSCRIBE / SPUBLISH (Redis >= 7.0): the subscribe reply confirms it.
    Sharded,
    /// SUBSCRIBE / PUBLISH, confirmed by a PING after it.
    Classic,
}

/// Whether Redis has confirmed a channel's subscription.
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
    fn new() -> Cell {
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

    pub(crate) fn reason(&self) -> WakeReason {
        WakeReason::from_u8(self.reason.load(Ordering::SeqCst))
    }

    fn wake(&self, reason: WakeReason) {
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
    fn set(&self, s: SubState) -> SubState {
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
const LINGER: Duration = Duration::from_secs(2);

/// The waiters of this process by grant channel: plain data, no I/O, so its rules (one
/// subscription per channel however many waiters, a channel kept while it has waiters or
/// lingers, a token at most once per channel) are tested without Redis.
#[derive(Default)]
struct Registry {
    map: HashMap<String, Entry>,
}

impl Registry {
    /// Joins `token`'s `cell` to `channel`'s waiters. Returns its slot, and whether the channel
    /// is new (it must be subscribed).
    fn join(
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
            return Err(Error::InvalidOptions {
                key: key.to_owned(),
                field: "token",
                value: format!("<{} bytes>", token.len()),
                reason: "another waiter of this locker waits on this key with the same token",
            });
        }
        entry.idle_since = None;
        entry.waiters.insert(Arc::clone(token), Arc::clone(cell));
        Ok((Arc::clone(&entry.slot), new))
    }

    /// `token` leaves `channel`; the channel lingers from `now` when it was the last.
    fn leave(&mut self, channel: &str, token: &str, now: tokio::time::Instant) {
        if let Some(e) = self.map.get_mut(channel) {
            e.waiters.remove(token);
            if e.waiters.is_empty() && e.idle_since.is_none() {
                e.idle_since = Some(now);
            }
        }
    }

    /// Removes and returns the channels nobody has waited on for `LINGER` (every idle one
    /// with `all`).
    fn take_idle(&mut self, now: tokio::time::Instant, all: bool) -> Vec<String> {
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
    fn size(&self) -> (usize, usize) {
        let waiting = self.map.values().filter(|e| !e.waiters.is_empty());
        (
            waiting.clone().count(),
            waiting.map(|e| e.waiters.len()).sum(),
        )
    }

    /// Whether `channel` has waiters, or a confirmed subscription that lingers.
    fn listening(&self, channel: &str) -> bool {
        self.map
            .get(channel)
            .is_some_and(|e| !e.waiters.is_empty() || e.slot.state() == SubState::Confirmed)
    }
}

pub(crate) struct Hub {
    /// This process's id in queue members and grant channels.
    pub(crate) id: String,
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
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let hub = Arc::new(Hub {
            id,
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
        lock(&hub.tasks).extend([manager, dispatcher, housekeeper]);
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
        let (slot, new) = lock(&self.registry).join(key, channel, &token, &cell)?;
        if new {
            self.mark_dirty(channel.to_owned());
        }
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
        let cell = lock(&self.registry)
            .map
            .get(channel)
            .and_then(|e| e.waiters.get(token).cloned());
        match (message, cell) {
            (Message::Grant { grant, .. }, Some(cell)) => {
                lock(&cell.mail).grant = Some(grant);
                cell.wake(WakeReason::Notification);
            }
            (Message::Watch { px, at_us, .. }, Some(cell)) => {
                lock(&cell.mail).watch = Some((px, at_us));
                cell.wake(WakeReason::Watch);
            }
            // The waiter has left (its departure crossed the grant, or failed): give the lock
            // back at once so the next waiter is served now. Only this grant (by its fence): a
            // newer grant to the same token is kept.
            (Message::Grant { grant, .. }, None) => {
                let (Some(lock_name), Some(engine)) = (
                    protocol::lock_of_channel(channel, &self.id),
                    self.engine.upgrade(),
                ) else {
                    return;
                };
                self.counters.orphan_grants.fetch_add(1, Ordering::Relaxed);
                engine.leave_in_background(
                    Names::from_lock(lock_name),
                    token.to_owned(),
                    String::new(),
                    self.id.clone(),
                    LeaveFlag::Orphan(grant.fence),
                );
            }
            // A departed first waiter's leave told the next one already.
            (Message::Watch { .. }, None) => {}
            (Message::Dropped, _) => {}
        }
    }

    fn cells(&self) -> Vec<Arc<Cell>> {
        lock(&self.registry)
            .map
            .values()
            .flat_map(|e| e.waiters.values().cloned())
            .collect()
    }

    /// Wakes every waiter of `channel` in this process.
    pub(crate) fn wake_channel(&self, channel: &str, reason: WakeReason) {
        let cells: Vec<Arc<Cell>> = lock(&self.registry)
            .map
            .get(channel)
            .map(|e| e.waiters.values().cloned().collect())
            .unwrap_or_default();
        for c in cells {
            c.wake(reason);
        }
    }

    fn wake_all(&self, reason: WakeReason) {
        for c in self.cells() {
            c.wake(reason);
        }
    }

    /// A queued waiter learned that Redis has no subscription on its channel although the
    /// slot is confirmed (Redis drops shard channels of a slot that moves, and fred does not
    /// say so): subscribe again; the slot's waiters wait for the confirmation, then check.
    pub(crate) fn lost_subscription(&self, slot: &Slot) {
        if slot.set(SubState::Pending) == SubState::Confirmed {
            tracing::debug!(channel = %slot.channel, "subscription dropped by Redis; subscribing again");
            self.counters
                .lost_subscriptions
                .fetch_add(1, Ordering::Relaxed);
            self.mark_dirty(slot.channel.clone());
        }
    }

    /// After a reconnect every subscription is gone and messages may have been lost: every
    /// channel goes back to pending (so woken waiters wait for Redis to confirm the new
    /// subscription before they check the lock), then every waiter is woken.
    /// (Also after a Cluster topology change, `reconnected` false: subscriptions of moved slots
    /// may be gone.)
    fn on_reconnect(&self, reconnected: bool) {
        self.connection_epoch.fetch_add(1, Ordering::SeqCst);
        let channels: Vec<String> = {
            let reg = lock(&self.registry);
            for e in reg.map.values() {
                e.slot.set(SubState::Pending);
            }
            reg.map.keys().cloned().collect()
        };
        tracing::debug!(
            channels = channels.len(),
            "subscriber reconnected; resubscribing and waking every waiter"
        );
        let n = channels.len() as u64;
        lock(&self.dirty).extend(channels);
        self.requested.fetch_add(n, Ordering::SeqCst);
        self.manager_wake.notify_one();
        if reconnected {
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            if let Some(engine) = self.engine.upgrade() {
                crate::metrics::subscriber_reconnect(&engine.meter);
            }
        }
        self.wake_all(WakeReason::Reconnect);
    }

    /// Shard channels grouped so that one (S)SUBSCRIBE names one slot only (a cluster refuses
    /// cross-slot ones); on a single server, one group.
    fn by_slot(&self, channels: Vec<String>) -> Vec<Vec<String>> {
        if !self.subscriber.is_clustered() {
            return vec![channels];
        }
        let mut groups: HashMap<u16, Vec<String>> = HashMap::new();
        for c in channels {
            groups
                .entry(fred::util::redis_keyslot(c.as_bytes()))
                .or_default()
                .push(c);
        }
        groups.into_values().collect()
    }

    /// Subscribes `channels`, one (S)SUBSCRIBE per slot group, all at once (fred queues them
    /// per connection, so a few thousand slots take a few round trips per node, not one each
    /// in turn), each group bounded by the command timeout on its own. Returns the channels
    /// that failed: a slow or failing slot delays only its own waiters.
    async fn subscribe(&self, channels: Vec<String>) -> Vec<String> {
        match self.mode {
            // SSUBSCRIBE waits for its reply (from the slot's primary, following MOVED).
            Mode::Sharded => {
                let limit = self.command_timeout;
                let mut set = tokio::task::JoinSet::new();
                for group in self.by_slot(channels) {
                    let subscriber = self.subscriber.clone();
                    set.spawn(async move {
                        let ok = matches!(
                            tokio::time::timeout(limit, subscriber.ssubscribe(group.clone())).await,
                            Ok(Ok(_))
                        );
                        (group, ok)
                    });
                }
                let mut failed = Vec::new();
                while let Some(done) = set.join_next().await {
                    match done {
                        Ok((_, true)) => {}
                        Ok((group, false)) => failed.extend(group),
                        Err(_) => {}
                    }
                }
                failed
            }
            Mode::Classic => {
                let done = tokio::time::timeout(self.command_timeout, async {
                    self.subscriber.subscribe(channels.clone()).await?;
                    // SUBSCRIBE resolves when written; PING's reply comes after Redis
                    // processed it.
                    self.subscriber.ping::<Value>(None).await.map(|_| ())
                })
                .await;
                match done {
                    Ok(Ok(())) => Vec::new(),
                    _ => channels,
                }
            }
        }
    }

    /// Unsubscribes `channels` (they resolve when written; `settled` PINGs after them).
    /// Returns the channels that failed.
    async fn unsubscribe(&self, channels: Vec<String>) -> Vec<String> {
        self.unconfirmed_unsubscribe.store(true, Ordering::SeqCst);
        let limit = self.command_timeout;
        match self.mode {
            Mode::Sharded => {
                let mut failed = Vec::new();
                for group in self.by_slot(channels) {
                    let done =
                        tokio::time::timeout(limit, self.subscriber.sunsubscribe(group.clone()))
                            .await;
                    if !matches!(done, Ok(Ok(_))) {
                        failed.extend(group);
                    }
                }
                failed
            }
            Mode::Classic => {
                match tokio::time::timeout(limit, self.subscriber.unsubscribe(channels.clone()))
                    .await
                {
                    Ok(Ok(())) => Vec::new(),
                    _ => channels,
                }
            }
        }
    }

    /// Brings Redis' subscriptions in line with the registry. Returns false when some failed
    /// (those channels stay dirty and are tried again; the others are confirmed now).
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
                match reg.map.get(ch) {
                    Some(e) => subs.push((ch.clone(), Arc::clone(&e.slot))),
                    None => unsubs.push(ch.clone()),
                }
            }
        }
        let epoch = self.connection_epoch.load(Ordering::SeqCst);
        // Never an empty list: fred would clear everything, or Redis answer an arity error.
        let mut failed = if unsubs.is_empty() {
            Vec::new()
        } else {
            self.unsubscribe(unsubs.clone()).await
        };
        let sub_failed = if subs.is_empty() {
            Vec::new()
        } else {
            self.subscribe(subs.iter().map(|(c, _)| c.clone()).collect())
                .await
        };
        self.counters
            .subscribes
            .fetch_add((subs.len() - sub_failed.len()) as u64, Ordering::Relaxed);
        self.counters
            .unsubscribes
            .fetch_add((unsubs.len() - failed.len()) as u64, Ordering::Relaxed);
        let bad: std::collections::HashSet<&String> = sub_failed.iter().collect();
        // A reconnect during the sync may have dropped what it subscribed: the channels are
        // dirty again, and only the next sync may confirm them.
        let same_connection = self.connection_epoch.load(Ordering::SeqCst) == epoch;
        for (channel, slot) in &subs {
            if bad.contains(channel) {
                if slot.set(SubState::Failed) == SubState::Pending {
                    // Waiting for a confirmation that will not come soon: poll meanwhile.
                    self.wake_channel(channel, WakeReason::Resubscribed);
                }
            } else if same_connection && slot.set(SubState::Confirmed) != SubState::Confirmed {
                // Its waiters wait for this (or poll, after a failure): they look at the lock
                // now that grants can reach them.
                self.wake_channel(channel, WakeReason::Resubscribed);
            }
        }
        failed.extend(sub_failed);
        if failed.is_empty() {
            self.applied
                .send_if_modified(|a| std::mem::replace(a, requested) != requested);
            return true;
        }
        tracing::warn!(
            failed = failed.len(),
            of = channels.len(),
            "some subscription changes failed; those waiters poll until they succeed"
        );
        lock(&self.dirty).extend(failed);
        false
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

impl Hub {
    /// On a cluster: asks every primary which of this process's grant channels it still has
    /// (Redis drops the shard channels of a slot that moves to another node, and fred does not
    /// say so), and subscribes again those it lost; their waiters look again once Redis
    /// confirms. `PUBSUB SHARDNUMSUB` with this process's own channels (at most
    /// [`AUDIT_BATCH`] per call), so that a call costs Redis a lookup per channel asked about:
    /// `PUBSUB SHARDCHANNELS <pattern>` matched every shard channel of the node, so its cost
    /// grew with the whole fleet's waiters (1.35 ms a call with 8 processes on 1,000 keys).
    async fn audit(&self) {
        let confirmed: Vec<Arc<Slot>> = lock(&self.registry)
            .map
            .values()
            .filter(|e| e.slot.state() == SubState::Confirmed)
            .map(|e| Arc::clone(&e.slot))
            .collect();
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        if confirmed.is_empty() {
            return;
        }
        let client = engine.backend.next_client();
        let mut present = std::collections::HashSet::new();
        for server in client.active_connections() {
            let node = client.with_cluster_node(server);
            for batch in confirmed.chunks(AUDIT_BATCH) {
                let mut args = Vec::with_capacity(batch.len() + 1);
                args.push("SHARDNUMSUB".to_owned());
                args.extend(batch.iter().map(|slot| slot.channel.clone()));
                let ask = node.custom::<Vec<fred::types::Value>, _>(
                    fred::types::CustomCommand::new_static("PUBSUB", None, false),
                    args,
                );
                match tokio::time::timeout(self.command_timeout, ask).await {
                    // [channel, subscribers, channel, subscribers, ...]
                    Ok(Ok(reply)) => {
                        present.extend(reply.chunks(2).filter_map(|pair| match pair {
                            [channel, n] if n.as_i64().is_some_and(|n| n > 0) => {
                                channel.as_string()
                            }
                            _ => None,
                        }))
                    }
                    // Cannot tell now: the next audit will.
                    _ => return,
                }
            }
        }
        for slot in confirmed {
            if !present.contains(&slot.channel) {
                self.lost_subscription(&slot);
            }
        }
    }
}

/// Channels asked about per `PUBSUB SHARDNUMSUB` call of the cluster audit: one call stays
/// well under a millisecond of Redis' time.
const AUDIT_BATCH: usize = 1000;

/// How often the housekeeper looks.
const TICK: Duration = Duration::from_millis(250);
/// A tick this late means the process was frozen (SIGSTOP, a long pause): the queue may have
/// skipped its waiters meanwhile.
const FROZEN: Duration = Duration::from_secs(1);
/// How often the subscriber connection is probed while waiters wait.
const PROBE: Duration = Duration::from_secs(1);

/// Every quarter second: notices that the process was frozen (a tick a second or more late)
/// and has every waiter look again (the queue skips the waiters of a process whose short
/// grant lapsed); every second while waiters wait, probes the subscriber connection with a
/// PING and forces a reconnection when a connection that says it is up does not answer (a
/// half-open connection loses grants without a word; the reconnection has every waiter look).
async fn housekeep(hub: Weak<Hub>) {
    let mut last = tokio::time::Instant::now();
    let mut next_probe = last + PROBE;
    loop {
        tokio::time::sleep(TICK).await;
        let now = tokio::time::Instant::now();
        let Some(h) = hub.upgrade() else { return };
        h.prune(false);
        if now.saturating_duration_since(last) >= TICK + FROZEN {
            tracing::warn!(late = ?now.saturating_duration_since(last) - TICK, "the process was frozen; every waiter looks again");
            h.counters.freezes.fetch_add(1, Ordering::Relaxed);
            h.wake_all(WakeReason::Resumed);
        }
        last = now;
        if now < next_probe {
            continue;
        }
        next_probe = now + PROBE;
        if h.size().1 == 0 || !h.subscriber.is_connected() {
            continue;
        }
        if h.subscriber.is_clustered() {
            h.audit().await;
        }
        let subscriber = h.subscriber.clone();
        let limit = h.command_timeout.min(Duration::from_secs(2));
        drop(h);
        let answered = matches!(
            tokio::time::timeout(limit, subscriber.ping::<Value>(None)).await,
            Ok(Ok(_))
        );
        if !answered && subscriber.is_connected() {
            tracing::warn!(
                ?limit,
                "the subscriber connection did not answer a PING; reconnecting"
            );
            if let Some(h) = hub.upgrade() {
                h.counters.probe_failures.fetch_add(1, Ordering::Relaxed);
            }
            tokio::spawn(async move {
                let _ = subscriber.force_reconnection().await;
            });
        }
        last = tokio::time::Instant::now();
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

/// What the dispatcher listens to.
pub(crate) struct Events {
    /// Grants (and anything else published on the subscribed channels).
    pub(crate) messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    /// The subscriber's (re)connections.
    pub(crate) reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
    /// Cluster topology changes seen by the locker's client (clustered configs only).
    pub(crate) topology: Option<tokio::sync::broadcast::Receiver<Vec<ClusterStateChange>>>,
    /// A sentinel announced a new primary.
    pub(crate) switched: Option<tokio::sync::broadcast::Receiver<()>>,
}

async fn dispatch(hub: Weak<Hub>, events: Events) {
    let Events {
        mut messages,
        mut reconnects,
        mut topology,
        mut switched,
    } = events;
    loop {
        tokio::select! {
            s = async {
                match switched.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(h) = hub.upgrade() else { return };
                match s {
                    // A sentinel named a new primary: reconnect the subscriber (to it); the
                    // reconnect event then re-subscribes and has every waiter check.
                    Ok(()) | Err(RecvError::Lagged(_)) => {
                        let subscriber = h.subscriber.clone();
                        tokio::spawn(async move {
                            let _ = subscriber.force_reconnection().await;
                        });
                    }
                    Err(RecvError::Closed) => switched = None,
                }
            }
            r = async {
                match topology.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(h) = hub.upgrade() else { return };
                match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => h.on_reconnect(false),
                    Err(RecvError::Closed) => topology = None,
                }
            }
            m = messages.recv() => {
                let Some(h) = hub.upgrade() else { return };
                match m {
                    Ok(msg) => {
                        if let Some(text) = msg.value.as_str() {
                            h.deliver(&msg.channel, &text);
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "subscriber lagged; every waiter checks its lock");
                        h.counters.lagged.fetch_add(1, Ordering::Relaxed);
                        h.wake_all(WakeReason::Lagged);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
            r = reconnects.recv() => {
                let Some(h) = hub.upgrade() else { return };
                match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => h.on_reconnect(true),
                    Err(RecvError::Closed) => return,
                }
            }
        }
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
