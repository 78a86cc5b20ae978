//! The queue strategy: a waiter queues in Redis and the release hands it the lock.
//!
//! 1. **Fast path.** Unless waiters of this process already wait on the key, one plain
//!    attempt (an uncontended acquire costs one call and subscribes nothing).
//! 2. **Listen.** Register in the hub; the key's grant channel for this process
//!    (`{pk}:w:<hub id>`) is subscribed, and Redis confirms it.
//! 3. **Queue.** An attempt that finds the lock held puts the waiter in the key's Redis queue
//!    in the same script call.
//! 4. **Wait** for the grant (the release made this waiter the holder and published the
//!    grant, with its lease, on its channel). Two waiters of the queue, of two processes, watch
//!    the holder's lease (they look when it ends: a holder that crashed, a short grant that
//!    lapsed); Redis appoints them (a watch message, or the queueing reply) and keeps them
//!    while they stay queued and fresh. The others sleep until their grant, a watch message, a
//!    wake-up (reconnect, lost messages, the process was frozen) or the deadline.
//! 5. **At the deadline** the wait ends at once; its queue entry is taken out in the
//!    background (giving back a grant that raced the deadline).
//!
//! A dropped waiter leaves the queue in the background and gives back a grant it may have
//! been sent, so the next waiter is served at once.
//!
//! Model: the waiter's steps (`Waiter::attempt`, `sleep`, `grant`, `wake`) and `take_grant`
//! are mirrored by `System::start`, `attempt`, `on_attempt`, `wake` and `take_grant` in
//! model/src/waiter.rs, its loop state `Turn` by `Wt` (change both together).

pub(crate) mod hub;
pub(crate) mod stats;

use super::{Request, Step, Waiting};
use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::lease::{validity_deadline, Hold};
use crate::redis::protocol::{self, Flag, Grant};
use crate::redis::Engine;
use fred::clients::Client;
use hub::{Hub, Registration, SubState};
use stats::WakeReason;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// What a queued wait waits for: one key ([`Request`]: a lock, or permits) or a set of keys
/// on one node ([`SetRequest`]: one member in every key's queue, one grant for all). The wait
/// loop ([`wait`]) is the same; these are the parts that differ.
pub(crate) trait Target: Sync {
    /// What the wait gives: a guard, or one per key of a set.
    type Out: Send;

    /// The request whose key's channel carries this waiter's messages (a set's first key's):
    /// its names, token, plan and process; what metrics and traces name.
    fn head(&self) -> &Request;

    /// One attempt on `client`, queueing `member` unless it is empty.
    fn attempt<'a>(
        &'a self,
        w: &'a mut Waiting,
        engine: &'a Arc<Engine>,
        client: &'a Client,
        member: &'a str,
    ) -> impl Future<Output = Result<Step<Self::Out>>> + Send + 'a;

    /// A wait of zero: one attempt.
    fn once<'a>(
        &'a self,
        engine: &'a Arc<Engine>,
    ) -> impl Future<Output = Result<Self::Out>> + Send + 'a;

    /// The member this waiter queues, as the scripts store it.
    fn member(&self, pid: &str) -> String;

    /// Whether `grant` hands over what this waits for (a set's grant has a fence per key).
    fn fits(&self, grant: &Grant) -> bool;

    /// What `grant` hands over, with its whole TTL (`hold`: the head's lease as the grant
    /// said, or one to confirm first, already past). `None`: it lapsed before it could be
    /// confirmed.
    fn granted<'a>(
        &'a self,
        engine: &'a Arc<Engine>,
        client: &'a Client,
        hold: Hold,
        grant: &'a Grant,
        limit: Duration,
    ) -> impl Future<Output = Result<Option<Self::Out>>> + Send + 'a;

    /// Leaves the queue (or, a set, every queue) in the background, giving back whatever its
    /// token holds.
    fn leave_in_background(&self, engine: &Arc<Engine>, pid: &str);

    /// The error of a wait that ran out (see [`Waiting::give_up`]).
    fn give_up(&self, w: &mut Waiting) -> Error;
}

impl Target for Request {
    type Out = LockGuard;

    fn head(&self) -> &Request {
        self
    }

    fn attempt<'a>(
        &'a self,
        w: &'a mut Waiting,
        engine: &'a Arc<Engine>,
        client: &'a Client,
        member: &'a str,
    ) -> impl Future<Output = Result<Step>> + Send + 'a {
        w.attempt(engine, self, client, member)
    }

    fn once<'a>(
        &'a self,
        engine: &'a Arc<Engine>,
    ) -> impl Future<Output = Result<LockGuard>> + Send + 'a {
        super::once(engine, self)
    }

    fn member(&self, pid: &str) -> String {
        protocol::member(pid, self.plan.ttl_ms, &self.token)
    }

    fn fits(&self, grant: &Grant) -> bool {
        grant.others.is_empty()
    }

    fn granted<'a>(
        &'a self,
        engine: &'a Arc<Engine>,
        client: &'a Client,
        hold: Hold,
        _: &'a Grant,
        limit: Duration,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send + 'a {
        self.full_lease(engine, client, hold, false, limit)
    }

    fn leave_in_background(&self, engine: &Arc<Engine>, pid: &str) {
        engine.leave_in_background(
            self.names.clone(),
            self.token.to_string(),
            self.member(pid),
            pid.to_owned(),
            Flag::GiveBack,
        );
    }

    fn give_up(&self, w: &mut Waiting) -> Error {
        w.give_up(self)
    }
}

/// A waiter's place in the Redis queue(s): when dropped armed (the waiter's future was
/// dropped, its wait ran out, or it failed after queueing), it leaves in the background and
/// gives back a grant it may have been sent, so the next waiter is served at once.
struct Departure<'a, T: Target> {
    engine: &'a Arc<Engine>,
    target: &'a T,
    pid: &'a str,
    armed: bool,
}

impl<T: Target> Drop for Departure<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            self.target.leave_in_background(self.engine, self.pid);
        }
    }
}

/// How long a queued waiter that does not watch the lock sleeps when nothing wakes it
/// (jittered by ±25%): a last resort for a queue entry that vanished without a word (the queue
/// key deleted by hand). Everything else wakes it: its grant, a watch message when it becomes
/// a watcher, a reconnect, lost messages, the process resuming from a freeze.
pub(crate) const SAFETY_INTERVAL: Duration = Duration::from_secs(100);

/// `d` × [0.75, 1.25): spreads timers that would otherwise fire together.
fn spread(d: Duration) -> Duration {
    d.mul_f64(0.75 + super::jitter::unit() / 2.0)
}

/// The last attempt that left a waiter queued: when it was sent, Redis' clock when it ran, and
/// the latest fence then. Redis ran it before any grant to the waiter with a higher fence.
#[derive(Clone, Copy)]
struct Anchor {
    sent_at: Instant,
    redis_us: u64,
    fence: u64,
}

/// The wait loop's state, field for field the model's waiter (`Wt` in `model/src/system.rs`;
/// the deadline is `Waiting`'s, the mail, the stored wake-up and `hub_woke` are the cell's).
struct Turn {
    /// The last attempt that left this waiter queued (`Wt::anchor`).
    anchor: Option<Anchor>,
    /// When this waiter looks at the lock next, if it is one of the lock's watchers
    /// (`Wt::watch`).
    watch: Option<Instant>,
    /// How long it sleeps when nothing wakes it: a backoff, the last resort, or until its
    /// subscription is confirmed (`Wt::timer`).
    timer: Duration,
    /// It attempts next (`Wt::check`).
    check: bool,
    /// Queueing attempts in a row that found its subscription gone (a Cluster slot moved; the
    /// model has no slots).
    deaf: u32,
}

impl Default for Turn {
    fn default() -> Turn {
        Turn {
            anchor: None,
            watch: None,
            timer: Duration::ZERO,
            check: true,
            deaf: 0,
        }
    }
}

/// The queue strategy's wait (see the module docs), for one key or a set.
pub(crate) async fn wait<T: Target>(
    engine: &Arc<Engine>,
    hub: &Arc<Hub>,
    target: &T,
) -> Result<T::Out> {
    let req = target.head();
    if req.plan.wait.is_zero() {
        return target.once(engine).await;
    }
    let mut w = Waiting::new(&req.plan);
    // Every call of the request on one client, so Redis runs them in order.
    let client = req.client(engine).clone();
    let channel = req.names.channel(&hub.pid);
    // This process listens on the key already (its waiters wait there, or did a moment ago):
    // the queueing attempt below takes a free lock as a plain attempt would, so that one
    // would be a wasted call.
    if !hub.listening(&channel) {
        hub.counters.attempts.fetch_add(1, Ordering::Relaxed);
        // Boxed (as every attempt below): its state would otherwise stay in every waiting
        // future.
        if let Step::Won(g) = Box::pin(target.attempt(&mut w, engine, &client, "")).await? {
            return Ok(g);
        }
    }
    let registration = hub.register(&req.names.key, &channel, &req.token)?;
    drop(channel);
    let mut waiter = Waiter {
        engine,
        hub,
        target,
        client,
        w,
        t: Turn::default(),
        queue: Departure {
            engine,
            target,
            pid: &hub.pid,
            armed: false,
        },
        registration,
    };
    loop {
        if waiter.t.check {
            match waiter.attempt().await? {
                Next::Done(out) => return Ok(out),
                Next::Again => continue,
                Next::On => {}
            }
        }
        let reason = waiter.sleep().await;
        match waiter.grant().await? {
            Next::Done(out) => return Ok(out),
            Next::Again => continue,
            Next::On => {}
        }
        waiter.wake(reason);
        if Instant::now() >= waiter.w.deadline {
            // The departure takes us out of the queue in the background.
            return Err(target.give_up(&mut waiter.w));
        }
        let attempts = waiter.w.attempts;
        tracing::debug!(key = %req.names.key, attempts, ?reason, "woke (None = timer)");
    }
}

/// What a step of the wait loop leads to.
enum Next<O> {
    /// The wait ends with this.
    Done(O),
    /// Back to the loop's top (look again, or sleep again).
    Again,
    /// On to the loop's next step.
    On,
}

/// A queued waiter: the wait loop's state ([`Turn`], the model's `Wt`) and what it waits
/// with. Its steps are the model's: [`attempt`](Self::attempt) (`attempt`, `on_attempt`),
/// [`sleep`](Self::sleep), [`grant`](Self::grant) (`take_grant`) and [`wake`](Self::wake)
/// (`wake`).
struct Waiter<'a, T: Target> {
    engine: &'a Arc<Engine>,
    hub: &'a Arc<Hub>,
    target: &'a T,
    client: Client,
    w: Waiting,
    t: Turn,
    /// Dropped before the registration (fields drop in order): the waiter leaves the queue,
    /// then stops listening.
    queue: Departure<'a, T>,
    registration: Registration,
}

impl<T: Target> Waiter<'_, T> {
    /// Looks at the lock: one attempt, queueing this waiter when Redis has confirmed its
    /// subscription; sets when it sleeps and whether it watches the lock.
    async fn attempt(&mut self) -> Result<Next<T::Out>> {
        let now = Instant::now();
        // Queue only on a subscription Redis has confirmed: a release skips (and drops) a
        // queued waiter that nobody listens for. While it is pending (first subscription, or
        // after a reconnect) wait for the hub's wake-up at its confirmation; while it has
        // failed, poll without queueing.
        let state = self.registration.slot.state();
        if state == SubState::Pending {
            // No look until Redis confirms the subscription (the hub wakes us then): a watch
            // time that has passed must not make this loop spin.
            self.t.watch = None;
            self.t.timer = self.w.deadline.saturating_duration_since(now);
            return Ok(Next::On);
        }
        let listening = state == SubState::Confirmed;
        self.queue.armed |= listening;
        self.hub.counters.attempts.fetch_add(1, Ordering::Relaxed);
        let step = {
            // Built per attempt: a waiting future keeps no copy of it.
            let member = if listening {
                self.target.member(&self.hub.pid)
            } else {
                String::new()
            };
            let attempt = self
                .target
                .attempt(&mut self.w, self.engine, &self.client, &member);
            Box::pin(attempt).await?
        };
        let now = Instant::now();
        let subject = || self.engine.meter.subject(&self.target.head().names.key);
        self.t.timer = match step {
            Step::Won(g) => {
                self.queue.armed = false;
                crate::metrics::handoff(subject(), false);
                return Ok(Next::Done(g));
            }
            Step::Held {
                remaining,
                queued: Some(q),
                sent_at,
            } if listening => {
                self.t.anchor = Some(Anchor {
                    sent_at,
                    redis_us: q.redis_us,
                    fence: q.fence,
                });
                crate::metrics::queue_depth(subject(), q.depth);
                if q.deaf {
                    // Redis dropped our subscription without telling fred (a Cluster slot
                    // moved): subscribe again, then check. While a slot migrates, scripts run
                    // on the importing node (ASK) and the subscription on the source: wait a
                    // growing delay, not spin.
                    self.hub.lost_subscription(&self.registration.slot);
                    self.t.deaf = self.t.deaf.saturating_add(1);
                    let pause = Duration::from_millis(10 << self.t.deaf.min(7))
                        .min(self.w.deadline.saturating_duration_since(now));
                    sleep(pause).await;
                    return Ok(Next::Again);
                }
                self.t.deaf = 0;
                // A watcher looks when the holder's lease ends (plus a little: PTTL rounds
                // down); the others wait to be told. (From the attempt's send: Redis ran it
                // no earlier, so the lease ends no earlier than that; a late reply does not
                // make us late.)
                self.t.watch = q.watcher.then(|| {
                    sent_at
                        + remaining
                            .map(|r| r + Duration::from_millis(1))
                            .unwrap_or(SAFETY_INTERVAL)
                });
                spread(SAFETY_INTERVAL)
            }
            Step::Held { remaining, .. } => {
                self.t.anchor = None;
                self.w.backoff(now, remaining)
            }
            Step::Failed => self.w.backoff(now, None),
        };
        Ok(Next::On)
    }

    /// Waits for the grant, a watch message, a wake-up (reconnect, lost messages, a confirmed
    /// subscription, a resumed process), the look of a watcher, the timer or the deadline;
    /// what woke it (`None`: a timer).
    async fn sleep(&mut self) -> Option<WakeReason> {
        let now = Instant::now();
        let deadline = self.w.deadline;
        let mut sleep_for = self.t.timer.min(deadline.saturating_duration_since(now));
        if let Some(at) = self.t.watch {
            sleep_for = sleep_for.min(at.saturating_duration_since(now));
        }
        // The deadline is kept to the tick (tokio's timers fire on the millisecond after).
        let at_deadline = now + sleep_for >= deadline;
        if at_deadline {
            sleep_for = sleep_for.saturating_sub(super::TIMER_TICK);
        }
        let cell = &self.registration.cell;
        let reason = tokio::select! {
            _ = cell.wake.notified() => Some(cell.reason()),
            _ = sleep(sleep_for) => None,
        };
        if reason.is_none() && at_deadline {
            super::until(deadline).await;
        }
        self.t.timer = self.t.timer.saturating_sub(now.elapsed());
        reason
    }

    /// Takes a grant from the mail, if one came: the lock (`Done`), or a look again
    /// (`Again`: it lapsed, or its confirmation got no answer); `On` when none came.
    ///
    /// A grant published before our last queueing attempt ran (its fence is not above the
    /// fence that attempt saw) had lapsed by then: the attempt found the lock not ours and
    /// queued us again. Its message may still arrive after the reply; it must not be used. (A
    /// grant that does not fit, a set's to one key or one key's to a set, is no version's:
    /// ignored, as a message nobody knows.)
    async fn grant(&mut self) -> Result<Next<T::Out>> {
        let anchor = self.t.anchor;
        let Some(grant) = self
            .registration
            .cell
            .take_grant()
            .filter(|g| anchor.is_none_or(|a| g.fence > a.fence) && self.target.fits(g))
        else {
            return Ok(Next::On);
        };
        self.hub.counters.woke(Some(WakeReason::Notification));
        // Its confirmation (if it needs one) ends by the wait's deadline too.
        let (limit, _) = self
            .w
            .limit(self.engine.settings.command_timeout, Instant::now());
        // Boxed (as the attempts): its call state would otherwise size every waiting future.
        let taken = take_grant(
            self.engine,
            self.hub,
            self.target,
            &self.client,
            anchor,
            grant,
            limit,
        );
        match Box::pin(taken).await {
            Ok(Some(g)) => {
                self.queue.armed = false;
                let key = &self.target.head().names.key;
                crate::metrics::handoff(self.engine.meter.subject(key), true);
                return Ok(Next::Done(g));
            }
            // The grant lapsed before we could confirm it: this process may have been judged
            // frozen, and its other waiters on the key skipped. They all look again.
            Ok(None) => self
                .hub
                .wake_channel(&self.registration.slot.channel, WakeReason::Resumed),
            // Its confirmation got no answer (it may still run): look again; a hold of ours is
            // then ours to keep, or given back by the queue residue.
            Err(e) if e.is_transient() => {}
            Err(e) => return Err(e),
        }
        self.t.check = true;
        Ok(Next::Again)
    }

    /// After a sleep that brought no grant: whether the waiter looks at the lock next, and
    /// when it looks as a watcher.
    fn wake(&mut self, reason: Option<WakeReason>) {
        let cell = &self.registration.cell;
        let counters = &self.hub.counters;
        // A wake-up from the hub (lost messages, a reconnect, a resumed process, dropped
        // waiters) always makes the waiter look, even when a watch message came with it.
        let hub_woke = cell.take_hub_wake();
        if let Some((px, at_us)) = cell.take_watch() {
            // We are one of the lock's watchers now: look when the holder's lease ends. The
            // message may be read late (this process was slow, or frozen too briefly for the
            // hub to notice): its Redis time, carried over to our clock from the anchor as a
            // grant's is, says when the lease ends at the latest, never later. One published
            // before our last queueing attempt ran is stale: that attempt's reply said more.
            counters.woke(Some(WakeReason::Watch));
            if let Some(at) = look_at(self.t.anchor, px, at_us) {
                self.t.watch = Some(at + Duration::from_millis(1));
            }
            self.t.check = hub_woke;
        } else if hub_woke || !matches!(reason, Some(WakeReason::Notification | WakeReason::Watch))
        {
            if reason != Some(WakeReason::Notification) {
                counters.woke(reason);
            }
            self.t.check = true;
        } else {
            // Woken by a message with nothing in the mail: a permit left over (two messages
            // came before the waiter ran; the first wake took both mails), or a grant from
            // before our last queueing attempt, which that attempt saw. Nothing new to look
            // at, and a look now can cross our own grant and take it as a look. A timer that
            // is due fires at the next select.
            self.t.check = false;
        }
    }
}

/// When a watcher looks, told that the holder's lease ends `px` after Redis time `at_us`: that
/// moment by our clock at the latest (the anchor's send time is a lower bound of the moment
/// Redis' clock read its time, and the time between them counts 1% short), and never later than
/// `px` from now. `None`: the message was published before the anchor ran (stale).
fn look_at(anchor: Option<Anchor>, px: Duration, at_us: Option<u64>) -> Option<Instant> {
    let by_now = Instant::now() + px;
    match (anchor, at_us) {
        (Some(a), Some(at)) if at < a.redis_us => None,
        (Some(a), Some(at)) => {
            let since = a.sent_at + Duration::from_micros(at - a.redis_us).mul_f64(0.99);
            Some(by_now.min(since + px))
        }
        _ => Some(by_now),
    }
}

/// A grant arrived: the lock is ours for the lease it says, from the grant's time in Redis.
/// That time is carried over to our clock from the anchor (our last queueing attempt, which
/// Redis ran before the grant: its send time is a lower bound of the moment Redis' clock read
/// its time), counting the time between them 1% short (clock rates). A full lease that is
/// still worth the TTL is used at once; a short one (our process was not seen lately), one
/// that arrived late, or one of an older version that did not say its lease is confirmed
/// first (one round trip). `None`: it lapsed before we could confirm it.
#[tracing::instrument(
    name = "handoff",
    level = "debug",
    skip_all,
    fields(key = %target.head().names.key, fence = grant.fence, confirmed = tracing::field::Empty)
)]
async fn take_grant<T: Target>(
    engine: &Arc<Engine>,
    hub: &Hub,
    target: &T,
    client: &Client,
    anchor: Option<Anchor>,
    grant: Grant,
    limit: Duration,
) -> Result<Option<T::Out>> {
    let ttl = target.head().plan.ttl();
    if let (Some(lease), Some(a)) = (grant.lease, anchor) {
        if lease.px >= ttl && lease.at_us >= a.redis_us {
            let since = a.sent_at + Duration::from_micros(lease.at_us - a.redis_us).mul_f64(0.99);
            let hold = Hold {
                fence: grant.fence,
                valid_until: validity_deadline(since, lease.px),
                since,
                taken: false,
            };
            if hold.valid_until > Instant::now() {
                return target.granted(engine, client, hold, &grant, limit).await;
            }
        }
    }
    hub.counters
        .confirmed_on_arrival
        .fetch_add(1, Ordering::Relaxed);
    tracing::Span::current().record("confirmed", true);
    let now = Instant::now();
    let unconfirmed = Hold {
        fence: grant.fence,
        valid_until: now,
        since: now,
        taken: false,
    };
    target
        .granted(engine, client, unconfirmed, &grant, limit)
        .await
}
