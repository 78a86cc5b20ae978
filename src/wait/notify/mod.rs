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
//! Model: `wait` and `take_grant` are mirrored by `System::start`, `attempt`, `on_attempt`,
//! `wake` and `take_grant` in model/src/waiter.rs, its loop state `Turn` by `Wt` (change
//! both together).

pub(crate) mod hub;
pub(crate) mod stats;

use super::{Request, Step, Waiting};
use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::lease::{validity_deadline, Hold};
use crate::redis::protocol::{self, Flag, Grant};
use crate::redis::Engine;
use fred::clients::Client;
use hub::{Hub, SubState};
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
    let counters = &hub.counters;
    let mut w = Waiting::new(&req.plan);
    // Every call of the request on one client, so Redis runs them in order.
    let client = req.client(engine).clone();
    let channel = req.names.channel(&hub.pid);
    // This process listens on the key already (its waiters wait there, or did a moment ago):
    // the queueing attempt below takes a free lock as a plain attempt would, so that one
    // would be a wasted call.
    if !hub.listening(&channel) {
        counters.attempts.fetch_add(1, Ordering::Relaxed);
        // Boxed (as every attempt below): its state would otherwise stay in every waiting
        // future.
        if let Step::Won(g) = Box::pin(target.attempt(&mut w, engine, &client, "")).await? {
            return Ok(g);
        }
    }
    let registration = hub.register(&req.names.key, &channel, &req.token)?;
    drop(channel);
    let cell = &registration.cell;
    let mut queue = Departure {
        engine,
        target,
        pid: &hub.pid,
        armed: false,
    };
    let slot = &registration.slot;
    let mut t = Turn::default();
    loop {
        let now = Instant::now();
        if t.check {
            // Queue only on a subscription Redis has confirmed: a release skips (and drops) a
            // queued waiter that nobody listens for. While it is pending (first subscription,
            // or after a reconnect) wait for the hub's wake-up at its confirmation; while it
            // has failed, poll without queueing.
            t.timer = match slot.state() {
                SubState::Pending => {
                    // No look until Redis confirms the subscription (the hub wakes us then): a
                    // watch time that has passed must not make this loop spin.
                    t.watch = None;
                    w.deadline.saturating_duration_since(now)
                }
                state => {
                    let listening = state == SubState::Confirmed;
                    queue.armed |= listening;
                    counters.attempts.fetch_add(1, Ordering::Relaxed);
                    let step = {
                        // Built per attempt: a waiting future keeps no copy of it.
                        let member = if listening {
                            target.member(&hub.pid)
                        } else {
                            String::new()
                        };
                        Box::pin(target.attempt(&mut w, engine, &client, &member)).await?
                    };
                    let now = Instant::now();
                    match step {
                        Step::Won(g) => {
                            queue.armed = false;
                            crate::metrics::handoff(engine.meter.subject(&req.names.key), false);
                            return Ok(g);
                        }
                        Step::Held {
                            remaining,
                            queued: Some(q),
                            sent_at,
                        } if listening => {
                            t.anchor = Some(Anchor {
                                sent_at,
                                redis_us: q.redis_us,
                                fence: q.fence,
                            });
                            crate::metrics::queue_depth(
                                engine.meter.subject(&req.names.key),
                                q.depth,
                            );
                            if q.deaf {
                                // Redis dropped our subscription without telling fred (a
                                // Cluster slot moved): subscribe again, then check. While a
                                // slot migrates, scripts run on the importing node (ASK) and
                                // the subscription on the source: wait a growing delay, not
                                // spin.
                                hub.lost_subscription(slot);
                                t.deaf = t.deaf.saturating_add(1);
                                let pause = Duration::from_millis(10 << t.deaf.min(7))
                                    .min(w.deadline.saturating_duration_since(now));
                                sleep(pause).await;
                                continue;
                            }
                            t.deaf = 0;
                            // A watcher looks when the holder's lease ends (plus a little:
                            // PTTL rounds down); the others wait to be told.
                            // (From the attempt's send: Redis ran it no earlier, so the lease
                            // ends no earlier than that; a late reply does not make us late.)
                            t.watch = q.watcher.then(|| {
                                sent_at
                                    + remaining
                                        .map(|r| r + Duration::from_millis(1))
                                        .unwrap_or(SAFETY_INTERVAL)
                            });
                            spread(SAFETY_INTERVAL)
                        }
                        Step::Held { remaining, .. } => {
                            t.anchor = None;
                            w.backoff(now, remaining)
                        }
                        Step::Failed => w.backoff(now, None),
                    }
                }
            };
        }
        let now = Instant::now();
        let mut sleep_for = t.timer.min(w.deadline.saturating_duration_since(now));
        if let Some(at) = t.watch {
            sleep_for = sleep_for.min(at.saturating_duration_since(now));
        }
        let started = now;
        // The deadline is kept to the tick (tokio's timers fire on the millisecond after).
        let at_deadline = now + sleep_for >= w.deadline;
        if at_deadline {
            sleep_for = sleep_for.saturating_sub(super::TIMER_TICK);
        }
        // Wait for the grant, a watch message, a wake-up (reconnect, lost messages, a
        // confirmed subscription, a resumed process) or the timer.
        let reason = tokio::select! {
            _ = cell.wake.notified() => Some(cell.reason()),
            _ = sleep(sleep_for) => None,
        };
        if reason.is_none() && at_deadline {
            super::until(w.deadline).await;
        }
        t.timer = t.timer.saturating_sub(started.elapsed());
        // A grant published before our last queueing attempt ran (its fence is not above the
        // fence that attempt saw) had lapsed by then: the attempt found the lock not ours and
        // queued us again. Its message may still arrive after the reply; it must not be used.
        // (A grant that does not fit, a set's to one key or one key's to a set, is no
        // version's: ignored, as a message nobody knows.)
        if let Some(grant) = cell
            .take_grant()
            .filter(|g| t.anchor.is_none_or(|a| g.fence > a.fence) && target.fits(g))
        {
            counters.woke(Some(WakeReason::Notification));
            // Boxed (as the attempts): its call state would otherwise size every waiting
            // future.
            // Its confirmation (if it needs one) ends by the wait's deadline too.
            let (limit, _) = w.limit(engine.settings.command_timeout, Instant::now());
            match Box::pin(take_grant(
                engine, hub, target, &client, t.anchor, grant, limit,
            ))
            .await
            {
                Ok(Some(g)) => {
                    queue.armed = false;
                    crate::metrics::handoff(engine.meter.subject(&req.names.key), true);
                    return Ok(g);
                }
                // The grant lapsed before we could confirm it: this process may have been
                // judged frozen, and its other waiters on the key skipped. They all look again.
                Ok(None) => hub.wake_channel(&slot.channel, WakeReason::Resumed),
                // Its confirmation got no answer (it may still run): look again; a hold of ours
                // is then ours to keep, or given back by the queue residue.
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            }
            t.check = true;
            continue;
        }
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
            if let Some(at) = look_at(t.anchor, px, at_us) {
                t.watch = Some(at + Duration::from_millis(1));
            }
            t.check = hub_woke;
        } else if hub_woke || !matches!(reason, Some(WakeReason::Notification | WakeReason::Watch))
        {
            if reason != Some(WakeReason::Notification) {
                counters.woke(reason);
            }
            t.check = true;
        } else {
            // Woken by a message with nothing in the mail: a permit left over (two messages
            // came before the waiter ran; the first wake took both mails), or a grant from
            // before our last queueing attempt, which that attempt saw. Nothing new to look
            // at, and a look now can cross our own grant and take it as a look. A timer that
            // is due fires at the next select.
            t.check = false;
        }
        if Instant::now() >= w.deadline {
            // The departure takes us out of the queue in the background.
            return Err(target.give_up(&mut w));
        }
        tracing::debug!(key = %req.names.key, attempts = w.attempts, ?reason, "woke (None = timer)");
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
