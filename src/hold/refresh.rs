//! One refresher per locker for every lease it keeps alive (`LockGuard::keep_alive`, `run`, the
//! command): a schedule of plain data, one task, and batched calls.
//!
//! **Schedule.** Each lease has three instants: when its refresh is due (`ratio × TTL` after
//! the last confirmed one, or a retry's time), the earliest it may be refreshed to ride along
//! with others (a quarter of that interval before it is due), and its validity deadline. The
//! task sleeps until the first due refresh or the first deadline, whichever comes first; then
//! it judges every lease whose deadline passed lost ([`LossReason::Unreachable`], or
//! [`LossReason::TtlElapsed`] with refresh off) and, when a refresh is due, takes every lease
//! whose earliest time has come. So mixed TTLs work (each lease keeps its own times), and
//! leases that come due close together share calls: after a few rounds they fall into step.
//!
//! **Calls.** The leases taken are grouped by the client of their token (the one that carries
//! all of that token's calls, so Redis runs them in the order sent: see `Lease`) and, on a
//! cluster, by hash slot; each group goes in calls of at most [`BATCH`] locks
//! (`lua/refresh.lua`), every call its own task, so calls to several primaries run at once and
//! one failed call touches only its own leases (each tried again after a quarter of what is
//! left of its validity, between 1 ms and 1 s, as a single refresh was). A lock the batch
//! left alone (a queue formed behind it) and every permit lease are refreshed by their own
//! extend script, still scheduled here. Each lease's answer reaches its guard at once:
//! renewed, or lost with its reason, its loss token cancelled; none is dropped silently.
//!
//! **Turns.** A call takes each lease's turn (`Lease::turn`) without waiting: a lease whose
//! turn a user's `extend` holds is left out of this call and tried again 5 ms later; the
//! turns are given back as each lease's outcome is known.

use super::lease::Lease;
use crate::error::{Error, LossReason};
use crate::keys::{Kind, Names};
use crate::limits::BATCH;
use crate::options::Refresh;
use crate::redis::scripts::{Batched, Call};
use crate::redis::{Engine, Extended};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::sync::{Notify, OwnedMutexGuard};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

/// How much of its refresh interval a lease may be refreshed early, to share a call.
const EARLY: f64 = 0.25;

/// A lease whose turn was taken (a user's `extend` in flight) is tried again this much later.
const BUSY: Duration = Duration::from_millis(5);

/// What the refresher keeps of one guard.
pub(crate) struct Held {
    pub(crate) names: Names,
    pub(crate) token: String,
    /// The locker's process id (a queued locker's), for the scripts' records.
    pub(crate) pid: String,
    pub(crate) lease: Arc<Lease>,
    pub(crate) refresh: Refresh,
    /// Cancelled when the lease is judged lost.
    pub(crate) lost: CancellationToken,
}

impl Held {
    fn deadline_reason(&self) -> LossReason {
        if self.refresh == Refresh::Off {
            LossReason::TtlElapsed
        } else {
            LossReason::Unreachable
        }
    }
}

/// Which calls a lease can share: its token's client (index in the pool) and hash slot, and
/// whether it is a lock (batched) or permits (one call each).
type Group = (usize, u16, bool);

struct Entry {
    held: Arc<Held>,
    group: Group,
    /// A failed or skipped refresh is tried again then (its own time, not the schedule's).
    retry_at: Option<Instant>,
    /// A call that refreshes it is out: no other is sent until its outcome is known.
    in_flight: bool,
    /// Its places in the schedules (`None`: not in that one).
    early: Option<Instant>,
    due: Option<Instant>,
    deadline: Option<Instant>,
}

/// The schedule: plain data, driven by the task and tested on a paused clock.
#[derive(Default)]
struct Registry {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    by_early: BTreeSet<(Instant, u64)>,
    by_due: BTreeSet<(Instant, u64)>,
    by_deadline: BTreeSet<(Instant, u64)>,
    /// The task is running (or about to): a new entry only wakes it.
    running: bool,
}

/// How a refresh call ended for one lease that is still held.
enum Outcome {
    Renewed,
    RetryAt(Instant),
}

impl Registry {
    fn insert(&mut self, held: Arc<Held>, group: Group) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.entries.insert(
            id,
            Entry {
                held,
                group,
                retry_at: None,
                in_flight: false,
                early: None,
                due: None,
                deadline: None,
            },
        );
        self.place(id);
        id
    }

    fn unplace(&mut self, id: u64) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        if let Some(t) = e.early.take() {
            self.by_early.remove(&(t, id));
        }
        if let Some(t) = e.due.take() {
            self.by_due.remove(&(t, id));
        }
        if let Some(t) = e.deadline.take() {
            self.by_deadline.remove(&(t, id));
        }
    }

    /// Puts `id` in the schedules again from its lease as it is now.
    fn place(&mut self, id: u64) {
        self.unplace(id);
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        let (deadline, next) = {
            let s = e.held.lease.lock();
            let next = e.held.refresh.ratio().map(|r| {
                let interval = s.ttl.mul_f64(r);
                (s.since + interval, interval)
            });
            (s.valid_until, next)
        };
        e.deadline = Some(deadline);
        self.by_deadline.insert((deadline, id));
        if e.in_flight {
            return;
        }
        let (early, due) = match (e.retry_at, next) {
            (Some(at), _) => (at, at),
            (None, Some((due, interval))) => {
                (due.checked_sub(interval.mul_f64(EARLY)).unwrap_or(due), due)
            }
            (None, None) => return,
        };
        e.early = Some(early);
        e.due = Some(due);
        self.by_early.insert((early, id));
        self.by_due.insert((due, id));
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Held>> {
        self.unplace(id);
        self.entries.remove(&id).map(|e| e.held)
    }

    /// When the task must look next: the first due refresh or deadline.
    fn next_wake(&self) -> Option<Instant> {
        let due = self.by_due.first().map(|(t, _)| *t);
        let deadline = self.by_deadline.first().map(|(t, _)| *t);
        match (due, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The leases whose validity deadline has passed at `now`, taken out (a lease whose
    /// validity moved meanwhile is placed again).
    fn expired(&mut self, now: Instant) -> Vec<Arc<Held>> {
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.by_deadline.first() {
            if t > now {
                break;
            }
            let valid_until = self
                .entries
                .get(&id)
                .map(|e| e.held.lease.lock().valid_until);
            match valid_until {
                Some(v) if v > now => self.place(id),
                _ => out.extend(self.remove(id)),
            }
        }
        out
    }

    /// When a refresh is due at `now`: every lease whose earliest time has come, marked in
    /// flight, with its group.
    fn take(&mut self, now: Instant) -> Vec<(Group, u64, Arc<Held>)> {
        if self.by_due.first().is_none_or(|(t, _)| *t > now) {
            return Vec::new();
        }
        let mut out = Vec::new();
        while let Some(&(t, id)) = self.by_early.first() {
            if t > now {
                break;
            }
            if let Some(e) = self.entries.get_mut(&id) {
                e.in_flight = true;
                e.retry_at = None;
                out.push((e.group, id, Arc::clone(&e.held)));
            }
            self.place(id);
        }
        out
    }

    /// A call's outcome for `id` (if it is still registered).
    fn finish(&mut self, id: u64, outcome: Outcome) {
        let Some(e) = self.entries.get_mut(&id) else {
            return;
        };
        e.in_flight = false;
        e.retry_at = match outcome {
            Outcome::Renewed => None,
            Outcome::RetryAt(at) => Some(at),
        };
        self.place(id);
    }
}

/// The refresher of one locker (its `Engine`): the schedule, and a wake-up for its task.
#[derive(Default)]
pub(crate) struct Refreshing {
    registry: Mutex<Registry>,
    wake: Notify,
}

impl Refreshing {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        // Plain data, consistent between statements: a panic elsewhere cannot break it.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `held`'s lease alive from now on; returns its id, or `None` outside a tokio
    /// runtime (nothing can run the task: nothing refreshes the lease).
    pub(crate) fn add(self: &Arc<Self>, engine: &Arc<Engine>, held: Held) -> Option<u64> {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %held.names.key, "no tokio runtime: nothing refreshes the lock");
            return None;
        };
        let slot = engine.node_slot(&held.names.lock);
        let group = (
            engine.backend.index_for(&held.token),
            slot,
            held.names.kind == Kind::Lock,
        );
        let (id, start) = {
            let mut reg = self.lock();
            let id = reg.insert(Arc::new(held), group);
            (id, !std::mem::replace(&mut reg.running, true))
        };
        if start {
            let ticket = engine.tasks.ticket();
            let me = Arc::clone(self);
            let engine = Arc::downgrade(engine);
            handle.spawn(async move {
                let _ticket = ticket;
                me.run(engine).await
            });
        } else {
            self.wake.notify_one();
        }
        Some(id)
    }

    /// Stops keeping `id` alive (its guard is released or dropped): no call for it is sent
    /// after this, and no loss is reported for it.
    pub(crate) fn remove(&self, id: u64) {
        self.lock().remove(id);
        self.wake.notify_one();
    }

    /// `id`'s lease changed (a user's `extend`): its times are read again.
    pub(crate) fn touch(&self, id: u64) {
        self.lock().place(id);
        self.wake.notify_one();
    }

    /// How many leases it keeps alive.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Reports `held` lost for `reason`: its guard reads it, its loss token fires.
    fn report(&self, engine: &Weak<Engine>, held: &Held, reason: LossReason) {
        if let Some(engine) = engine.upgrade() {
            engine.meter.locks_lost.fetch_add(1, Ordering::Relaxed);
            crate::metrics::lost(engine.meter.subject(&held.names.key), reason);
        }
        held.lease.mark_lost(reason);
        held.lost.cancel();
        tracing::warn!(key = %held.names.key, %reason, "lock lost");
    }

    /// `id` is lost, if it is still kept alive (a released guard's is not reported).
    fn lose(&self, engine: &Weak<Engine>, id: u64, reason: LossReason) {
        let held = self.lock().remove(id);
        if let Some(held) = held {
            self.report(engine, &held, reason);
        }
    }

    /// The task: sleeps until the schedule's next instant (or a change), judges deadlines,
    /// sends the refreshes that are due. Ends when it keeps nothing alive, or the locker is
    /// gone.
    async fn run(self: Arc<Self>, engine: Weak<Engine>) {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wake = {
                let mut reg = self.lock();
                if reg.entries.is_empty() {
                    reg.running = false;
                    return;
                }
                reg.next_wake()
            };
            match wake {
                Some(at) => {
                    tokio::select! {
                        biased;
                        _ = sleep_until(at) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
            let now = Instant::now();
            let expired = self.lock().expired(now);
            for held in expired {
                self.report(&engine, &held, held.deadline_reason());
            }
            let due = self.lock().take(now);
            if due.is_empty() {
                continue;
            }
            let Some(strong) = engine.upgrade() else {
                self.lock().running = false;
                return;
            };
            let mut groups: BTreeMap<Group, Vec<(u64, Arc<Held>)>> = BTreeMap::new();
            for (group, id, held) in due {
                groups.entry(group).or_default().push((id, held));
            }
            for (group, leases) in groups {
                let size = if group.2 { BATCH } else { 1 };
                let mut leases = leases.into_iter().peekable();
                while leases.peek().is_some() {
                    let chunk: Vec<_> = leases.by_ref().take(size).collect();
                    let (me, engine) = (Arc::clone(&self), Arc::clone(&strong));
                    let ticket = strong.tasks.ticket();
                    tokio::spawn(async move {
                        let _ticket = ticket;
                        me.send(engine, group.0, chunk).await
                    });
                }
            }
        }
    }

    /// One call for `chunk` (locks of one group, or one permit lease) on the pool's client
    /// `client`, and each lease's outcome.
    async fn send(
        self: Arc<Self>,
        engine: Arc<Engine>,
        client: usize,
        chunk: Vec<(u64, Arc<Held>)>,
    ) {
        let weak = Arc::downgrade(&engine);
        let now = Instant::now();
        let mut leases = Vec::with_capacity(chunk.len());
        {
            let mut reg = self.lock();
            for (id, held) in chunk {
                match held.lease.try_turn() {
                    Some(turn) => leases.push(Sent::new(id, held, turn)),
                    None => reg.finish(id, Outcome::RetryAt(now + BUSY)),
                }
            }
            // Sending may cut a validity (see `Lease::sending`): its deadline is read again.
            for s in &leases {
                reg.place(s.id);
            }
        }
        if leases.is_empty() {
            self.wake.notify_one();
            return;
        }
        let until = leases
            .iter()
            .map(|s| s.held.lease.lock().valid_until)
            .min()
            .unwrap_or(now);
        let limit = engine
            .settings
            .command_timeout
            .min(until.saturating_duration_since(now))
            .max(Duration::from_millis(1));
        let client = engine.backend.client_at(client);
        let answers = if leases[0].held.names.kind == Kind::Lock {
            let locks: Vec<(&Names, &str, u64)> = leases
                .iter()
                .map(|s| {
                    (
                        &s.held.names,
                        s.held.token.as_str(),
                        s.ttl.as_millis() as u64,
                    )
                })
                .collect();
            let span = tracing::debug_span!("refresh", locks = locks.len(), key = %locks[0].0.key);
            tracing::Instrument::instrument(engine.refresh_many_on(client, &locks, limit), span)
                .await
        } else {
            Ok(vec![Batched::Alone; leases.len()])
        };
        match answers {
            Ok(answers) => {
                let mut alone = Vec::new();
                for (s, answer) in leases.into_iter().zip(answers) {
                    match answer {
                        Batched::Renewed => self.renewed(s),
                        Batched::NotHeld => self.lose(&weak, s.id, LossReason::TokenGone),
                        Batched::Alone => alone.push(s),
                    }
                }
                // Together: one after another, the last would go out a round trip (or, behind
                // a stalled call, a command timeout) per lease later, and could be judged lost
                // at its deadline while it waited its turn (review 3, finding 4). They share
                // one client, which keeps their order.
                let extends = alone.into_iter().map(|s| self.alone(&engine, client, s));
                crate::tasks::join_all(extends.collect()).await;
            }
            Err(e) => {
                let n = leases.len();
                for s in leases {
                    self.failed(&weak, s, &e);
                }
                tracing::warn!(error = %e, leases = n, "refresh failed; retrying");
            }
        }
        self.wake.notify_one();
    }

    /// Refreshes one lease with its own extend script (a queued lock's, a permit lease's).
    async fn alone(&self, engine: &Arc<Engine>, client: &fred::clients::Client, s: Sent) {
        let limit = engine
            .settings
            .command_timeout
            .min(
                s.held
                    .lease
                    .lock()
                    .valid_until
                    .saturating_duration_since(Instant::now()),
            )
            .max(Duration::from_millis(1));
        let call = Call {
            ttl_ms: s.ttl.as_millis() as u64,
            pid: &s.held.pid,
            ..Call::new(&s.held.names, &s.held.token)
        };
        let span = tracing::debug_span!("refresh", key = %s.held.names.key);
        let result =
            tracing::Instrument::instrument(engine.extend_on(client, &call, limit), span).await;
        match result {
            Ok(Extended::Renewed { .. } | Extended::Confirmed { .. }) => self.renewed(s),
            Ok(Extended::NotHeld) => {
                self.lose(&Arc::downgrade(engine), s.id, LossReason::TokenGone)
            }
            Err(e) => {
                tracing::warn!(key = %s.held.names.key, error = %e, "refresh failed; retrying");
                self.failed(&Arc::downgrade(engine), s, &e);
            }
        }
    }

    fn renewed(&self, s: Sent) {
        tracing::debug!(key = %s.held.names.key, "refreshed");
        s.held.lease.renewed(s.sent_at, s.ttl);
        self.lock().finish(s.id, Outcome::Renewed);
    }

    /// A call for `s` failed with `e`: lost when too few replicas acknowledged it, else tried
    /// again after a quarter of what is left of its validity (1 ms to 1 s).
    fn failed(&self, engine: &Weak<Engine>, s: Sent, e: &Error) {
        if let Error::NotReplicated { .. } = e {
            return self.lose(engine, s.id, LossReason::NotReplicated);
        }
        if let Some(engine) = engine.upgrade() {
            crate::metrics::refresh_failed(engine.meter.subject(&s.held.names.key));
        }
        let now = Instant::now();
        let left = s
            .held
            .lease
            .lock()
            .valid_until
            .saturating_duration_since(now);
        let retry = (left / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
        self.lock().finish(s.id, Outcome::RetryAt(now + retry));
    }
}

/// A lease in a call: its turn (held until its outcome is known), the TTL sent, the send time.
struct Sent {
    id: u64,
    held: Arc<Held>,
    ttl: Duration,
    sent_at: Instant,
    _turn: OwnedMutexGuard<()>,
}

impl Sent {
    fn new(id: u64, held: Arc<Held>, turn: OwnedMutexGuard<()>) -> Sent {
        let ttl = held.lease.lock().ttl;
        let sent_at = held.lease.sending(ttl, false);
        Sent {
            id,
            held,
            ttl,
            sent_at,
            _turn: turn,
        }
    }
}

/// The schedule and the task's deadlines on a paused clock, without Redis.
#[cfg(test)]
mod tests;
