//! Waiting for a lock: one set of rules, two strategies.
//!
//! What both lockers share lives here once: the validated request, the deadline, the time
//! limit of each attempt, how an attempt's outcome is classified, the give-up rule, "wait 0
//! means try once", and the lease at return. The strategies differ only in what a waiter does
//! between attempts: [`poll`] sleeps a backoff delay; [`notify`] queues in Redis and is handed
//! the lock by the release (see `notify`'s docs).

pub(crate) mod jitter;
pub(crate) mod notify;

pub mod strategy;

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::lease::{margin, Hold};
use crate::hold::refresh::Refreshing;
use crate::keys::Names;
use crate::options::{LockOptions, Plan};
use crate::redis::scripts::Call;
use crate::redis::{Attempt, Engine, Extended, Queued, ResidueGuard};
use fred::clients::Client;
use jitter::Delays;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// When a wait deadline is this close, the last attempt still gets this long to answer. If it
/// does not, the wait ends with `WaitTimeout` (Redis was answering; the deadline came first).
const LAST_ATTEMPT_GRACE: Duration = Duration::from_millis(5);

/// tokio's timer resolution: a sleep ends on the tick after its deadline.
pub(crate) const TIMER_TICK: Duration = Duration::from_millis(1);

/// Waits until `deadline` exactly (to scheduling): a wait's deadline is a promise to the
/// caller, and a timer alone overshoots it by up to a tick. Called in the last tick before it,
/// so it yields for at most a millisecond.
pub(crate) async fn until(deadline: Instant) {
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

/// A fresh random lock token.
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A token generated for a caller in process `pid`: a queued locker's start with its process
/// id (`"<pid>/<uuid>"`), so that the scripts know the holder's process (they keep the two
/// watchers out of it; see queue.lua's header); a polling locker's are a bare uuid.
pub(crate) fn own_token(pid: &str) -> String {
    if pid.is_empty() {
        new_token()
    } else {
        format!("{pid}/{}", new_token())
    }
}

/// One acquisition request, validated.
pub(crate) struct Request {
    pub(crate) names: Names,
    /// Shared with the hub's registry (one copy per waiter, not two).
    pub(crate) token: Arc<str>,
    /// The token was generated for this call (only this call knows it).
    pub(crate) own_token: bool,
    pub(crate) plan: Plan,
    /// The waiting process's id (a queued locker's), empty for a polling locker.
    pub(crate) pid: String,
    /// The locker's refresher, which keeps the guard alive when asked.
    refresher: Arc<Refreshing>,
}

impl Request {
    pub(crate) fn new(
        (engine, refresher): (&Engine, &Arc<Refreshing>),
        key: &str,
        opts: &LockOptions,
        pid: &str,
    ) -> Result<Request> {
        Self::with_token_of((engine, refresher), key, opts, pid, pid)
    }

    /// A queued locker's one attempt, which does not queue: the call sends no process id, but
    /// a token generated for it names process `pid` (its holder is then named in `status`,
    /// and the scripts know the holder's process as they do for a queued waiter's).
    pub(crate) fn attempt(
        (engine, refresher): (&Engine, &Arc<Refreshing>),
        key: &str,
        opts: &LockOptions,
        pid: &str,
    ) -> Result<Request> {
        Self::with_token_of((engine, refresher), key, opts, pid, "")
    }

    /// A request sent with process id `pid` whose generated token names `token_pid`.
    fn with_token_of(
        (engine, refresher): (&Engine, &Arc<Refreshing>),
        key: &str,
        opts: &LockOptions,
        token_pid: &str,
        pid: &str,
    ) -> Result<Request> {
        let plan = opts.validate(key)?;
        let names = engine.names(key)?;
        let (token, own_token) = match opts.token() {
            Some(t) => (Arc::from(t), false),
            None => (Arc::from(own_token(token_pid)), true),
        };
        Ok(Request {
            names,
            token,
            own_token,
            plan,
            pid: pid.to_owned(),
            refresher: Arc::clone(refresher),
        })
    }

    /// A request for `weight` of the `limit` permits on `key` (a semaphore's or a read-write
    /// lock's). Its token is generated and says its weight: `w<weight>:<id>`.
    pub(crate) fn permits(
        (engine, refresher): (&Engine, &Arc<Refreshing>),
        key: &str,
        opts: &LockOptions,
        pid: &str,
        limit: u32,
        weight: u32,
    ) -> Result<Request> {
        let plan = opts.validate(key)?;
        let invalid =
            |field, value: String, reason| Error::invalid_option(key, field, value, reason);
        if opts.token().is_some() {
            return Err(invalid(
                "token",
                "fixed".to_owned(),
                "a permit's token is generated (it carries its weight)",
            ));
        }
        if weight == 0 || weight > limit {
            return Err(invalid(
                "permits",
                weight.to_string(),
                "must be at least 1 and at most the semaphore's permits",
            ));
        }
        let names = Names::permits(&engine.settings.prefix, key, limit)?;
        Ok(Request {
            names,
            token: Arc::from(format!("w{weight}:{}", own_token(pid))),
            own_token: true,
            plan,
            pid: pid.to_owned(),
            refresher: Arc::clone(refresher),
        })
    }

    /// The client every call of this request goes through (see `Backend::client_for`).
    pub(crate) fn client<'e>(&self, engine: &'e Engine) -> &'e Client {
        engine.backend.client_for(&self.token)
    }

    /// A guard for a lock this request now holds.
    pub(crate) fn guard(&self, engine: &Arc<Engine>, hold: Hold) -> LockGuard {
        tracing::debug!(key = %self.names.key, fence = hold.fence, "acquired");
        LockGuard::new(
            (Arc::clone(engine), Arc::clone(&self.refresher)),
            self.names.clone(),
            self.token.to_string(),
            self.pid.clone(),
            self.plan.ttl(),
            self.plan.refresh,
            hold,
        )
    }

    /// The request's guard for `hold`, after making sure the lease is the whole TTL asked for
    /// (less the drift margin and the reply's or the grant's delivery, at most another
    /// margin): a shorter one (a lock found held by our token since earlier) is extended first,
    /// one round trip. With required replicas, the lease counts only once enough replicas
    /// acknowledged a write of ours (the grant was written by another client): then it is
    /// always extended and waited for (within `limit`). `None`: the token no longer holds the
    /// lock.
    pub(crate) async fn full_lease(
        &self,
        engine: &Arc<Engine>,
        client: &Client,
        hold: Hold,
        written_by_us: bool,
        limit: Duration,
    ) -> Result<Option<LockGuard>> {
        let ttl = self.plan.ttl();
        let enough = Instant::now() + ttl.saturating_sub(margin(ttl) * 2);
        if hold.valid_until >= enough && (written_by_us || engine.settings.replicas.is_none()) {
            if written_by_us && engine.settings.replicas.is_some() {
                if let Err(e) = engine.replicated(client, &self.names).await {
                    self.give_back(engine, client).await;
                    return Err(e);
                }
            }
            return Ok(Some(self.guard(engine, hold)));
        }
        let call = Call {
            ttl_ms: self.plan.ttl_ms,
            pid: &self.pid,
            ..Call::new(&self.names, &self.token)
        };
        let sent_at = Instant::now();
        match engine.extend_on(client, &call, limit).await {
            Ok(Extended::NotHeld) => Ok(None),
            // The fence of the hold as Redis has it now: the copy in hand (a grant message's,
            // an attempt's) may be older, if the token was handed the lock again since.
            Ok(Extended::Renewed { fence }) => Ok(Some(self.guard(
                engine,
                Hold::sent(fence.unwrap_or(hold.fence), sent_at, ttl),
            ))),
            Ok(Extended::Confirmed { fence }) => {
                Ok(Some(self.guard(engine, Hold::sent(fence, sent_at, ttl))))
            }
            Err(e @ Error::NotReplicated { .. }) => {
                self.give_back(engine, client).await;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases a lock the request will not return (now, not in the background: the caller
    /// learns of a lock that is gone, not of one that lingers).
    async fn give_back(&self, engine: &Arc<Engine>, client: &Client) {
        let _ = engine
            .release_on(
                client,
                &self.names,
                &self.token,
                &self.pid,
                engine.settings.command_timeout,
            )
            .await;
    }
}

/// What one attempt gives a wait loop (`T`: what it waits for, a guard or a set's guards).
pub(crate) enum Step<T = LockGuard> {
    Won(T),
    /// Another token holds it. `queued`: our member is in the Redis queue, as of an attempt
    /// sent at `sent_at` (which Redis therefore ran before any grant to us).
    Held {
        remaining: Option<Duration>,
        queued: Option<Queued>,
        sent_at: Instant,
    },
    /// A connection error or timeout; worth retrying until the deadline.
    Failed,
}

/// A wait in progress: its clock, its attempts and the give-up rule.
pub(crate) struct Waiting {
    pub(crate) start: Instant,
    pub(crate) deadline: Instant,
    pub(crate) attempts: u32,
    /// The error of the last attempt, when it failed for a reason worth reporting instead of
    /// `WaitTimeout` (a connection error, or a timeout of the full command timeout).
    /// (Boxed: it is rare, and an `Error` inline would size every waiting future.)
    pub(crate) last_error: Option<Box<Error>>,
    /// Made on first use: a queued waiter never needs it (and every waiting future would
    /// carry it).
    delays: Option<Box<Delays>>,
    backoff: crate::options::Backoff,
}

impl Waiting {
    pub(crate) fn new(plan: &Plan) -> Waiting {
        let start = Instant::now();
        Waiting {
            start,
            deadline: start + plan.wait,
            attempts: 0,
            last_error: None,
            delays: None,
            backoff: plan.backoff,
        }
    }

    /// Wait 0: one attempt (the deadline is the start; not stored twice, as every waiting
    /// future carries this).
    fn try_once(&self) -> bool {
        self.deadline == self.start
    }

    /// The time limit of an attempt sent at `now`, and whether the wait deadline cut it.
    pub(crate) fn limit(&self, command_timeout: Duration, now: Instant) -> (Duration, bool) {
        if self.try_once() {
            return (command_timeout, false);
        }
        let left = self
            .deadline
            .saturating_duration_since(now)
            .max(LAST_ATTEMPT_GRACE);
        if left < command_timeout {
            (left, true)
        } else {
            (command_timeout, false)
        }
    }

    /// One attempt on the request's client, queueing `member` unless it is empty, classified.
    ///
    /// Errors that retrying cannot fix (bad key, wrong type, a fixed token that already holds
    /// the lock) are returned; connection errors and timeouts give `Step::Failed` and are
    /// remembered for the give-up rule, except a timeout that only the wait deadline caused.
    pub(crate) async fn attempt(
        &mut self,
        engine: &Arc<Engine>,
        req: &Request,
        client: &Client,
        member: &str,
    ) -> Result<Step> {
        let sent_at = Instant::now();
        let (limit, cut) = self.limit(engine.settings.command_timeout, sent_at);
        let first = self.attempts == 0;
        self.attempts += 1;
        let call = Call {
            ttl_ms: req.plan.ttl_ms,
            member,
            pid: if member.is_empty() { "" } else { &req.pid },
            ..Call::new(&req.names, &req.token)
        };
        // An attempt whose outcome is unknown (dropped, or timed out: it may still run), or a
        // hold it took that is not handed to the caller, is given back, in order before the
        // request's next call. A queued waiter's own residue does that for its attempts. The
        // first attempt of a fixed token is left alone: the token may have held the lock before
        // this request.
        let mut residue = ResidueGuard {
            engine,
            names: &req.names,
            token: &req.token,
            armed: member.is_empty() && (req.own_token || !first),
        };
        let reply = engine.attempt_on(client, &call, limit).await;
        if matches!(&reply, Ok(Attempt::Locked { .. }))
            || matches!(&reply, Err(e) if !e.is_transient())
        {
            residue.armed = false;
        }
        let ttl = req.plan.ttl();
        let hold = match reply {
            Ok(Attempt::Acquired { fence }) => Hold::sent(fence, sent_at, ttl).taken(),
            // A grant of ours (its message was lost, or crossed this check), or our own
            // attempt sent twice by fred. Only the first attempt of a fixed token can find a
            // hold made before this request: every later hold of the token is this request's
            // (an attempt with an unknown outcome gave back what it took before the next one).
            Ok(Attempt::Granted { fence }) => Hold::sent(fence, sent_at, ttl),
            Ok(Attempt::AlreadyHeld { fence, remaining }) if req.own_token || !first => {
                Hold::sent(fence, sent_at, remaining.unwrap_or(ttl))
            }
            Ok(Attempt::AlreadyHeld { remaining, .. }) => {
                residue.armed = false;
                return Err(Error::AlreadyHeld {
                    key: req.names.key.clone(),
                    remaining_ttl: remaining,
                });
            }
            Ok(Attempt::Locked {
                remaining,
                queued,
                behind_queue,
            }) => {
                self.last_error = None;
                if behind_queue && req.pid.is_empty() {
                    behind_the_queue(engine, req);
                }
                return Ok(Step::Held {
                    remaining,
                    queued,
                    sent_at,
                });
            }
            Err(e) => return self.failed(e, cut),
        };
        match req.full_lease(engine, client, hold, true, limit).await {
            Ok(Some(g)) => {
                residue.armed = false;
                Ok(Step::Won(g))
            }
            // Held by our token a moment ago, gone now (it expired): try again.
            Ok(None) => Ok(Step::Failed),
            Err(e) => self.failed(e, cut),
        }
    }

    /// An attempt that failed: a connection error or timeout is worth retrying until the
    /// deadline (and is remembered for the give-up rule, except a timeout that only the wait
    /// deadline caused); others end the wait.
    pub(crate) fn failed<T>(&mut self, e: Error, cut: bool) -> Result<Step<T>> {
        if !e.is_transient() || self.try_once() {
            return Err(e);
        }
        // A timeout that only the wait deadline caused says nothing about Redis: the earlier
        // attempts' outcome stands (none: `WaitTimeout`).
        if !(cut && matches!(e, Error::Timeout { .. })) {
            self.last_error = Some(Box::new(e));
        }
        Ok(Step::Failed)
    }

    /// The error of a wait that ran out: the last attempt's connection error, if it failed
    /// that way (it says more), else `WaitTimeout`.
    pub(crate) fn give_up(&mut self, req: &Request) -> Error {
        self.last_error
            .take()
            .map(|e| *e)
            .unwrap_or_else(|| Error::WaitTimeout {
                key: req.names.key.clone(),
                waited: self.start.elapsed(),
                attempts: self.attempts,
            })
    }

    /// A backoff delay, cut to the holder's remaining TTL (plus 1 ms, as PTTL rounds down) and
    /// to the deadline.
    pub(crate) fn backoff(&mut self, now: Instant, remaining: Option<Duration>) -> Duration {
        let b = self.backoff;
        let delays = self
            .delays
            .get_or_insert_with(|| Box::new(Delays::new(b.base(), b.cap())));
        let mut d = delays.next_delay(b.cap());
        if let Some(r) = remaining {
            d = d.min(r + Duration::from_millis(1));
        }
        d.min(self.deadline.saturating_duration_since(now))
    }
}

/// A polling caller found waiters of a queued locker ahead of it: counted, and said once per
/// locker (a polling caller waits until such a queue drains; see `LockerStats::behind_queue`).
fn behind_the_queue(engine: &Engine, req: &Request) {
    use std::sync::atomic::Ordering;
    engine.meter.behind_queue.fetch_add(1, Ordering::Relaxed);
    crate::metrics::behind_queue(engine.meter.subject(&req.names.key));
    if !engine
        .meter
        .warned_behind_queue
        .swap(true, Ordering::Relaxed)
    {
        tracing::warn!(
            key = %req.names.key,
            "a polling caller found waiters of a queued locker ahead of it: they come first, so \
             it waits until their queue drains; use one kind of locker per contended key \
             (reported once per locker; see LockerStats::behind_queue)"
        );
    }
}

/// One attempt, no waiting: the lock, or `Locked` with the holder's remaining TTL. Never jumps
/// a queue: a free lock with live waiters queued goes to the oldest of them.
pub(crate) async fn once(engine: &Arc<Engine>, req: &Request) -> Result<LockGuard> {
    let mut w = Waiting::new(&Plan {
        wait: Duration::ZERO,
        ..req.plan
    });
    let client = req.client(engine).clone();
    match Box::pin(w.attempt(engine, req, &client, "")).await? {
        Step::Won(g) => Ok(g),
        Step::Held { remaining, .. } => Err(Error::Locked {
            key: req.names.key.clone(),
            remaining_ttl: remaining,
        }),
        Step::Failed => Err(w.give_up(req)),
    }
}

/// The polling strategy: attempt; if held, sleep `min(backoff, holder's TTL, deadline)`.
pub(crate) async fn poll(engine: &Arc<Engine>, req: &Request) -> Result<LockGuard> {
    if req.plan.wait.is_zero() {
        return once(engine, req).await;
    }
    let mut w = Waiting::new(&req.plan);
    let client = req.client(engine).clone();
    loop {
        // Boxed: the attempt's state (~0.9 KiB) would otherwise stay in the future while it
        // sleeps, for every waiter.
        let remaining = match Box::pin(w.attempt(engine, req, &client, "")).await? {
            Step::Won(g) => return Ok(g),
            Step::Held { remaining, .. } => remaining,
            Step::Failed => None,
        };
        if !w.pause(&req.names.key, remaining).await {
            return Err(w.give_up(req));
        }
    }
}

impl Waiting {
    /// A polling wait's pause before its next attempt: `min(backoff, the holder's
    /// `remaining` TTL, the deadline)`, on `key`'s behalf. False (and no sleep) once the
    /// deadline has passed.
    pub(crate) async fn pause(&mut self, key: &str, remaining: Option<Duration>) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        let sleep = self.backoff(now, remaining);
        tracing::debug!(key = %key, attempts = self.attempts, ?sleep, "waiting (timer)");
        if now + sleep >= self.deadline {
            // The deadline is kept to the tick (tokio's timers fire on the millisecond after).
            tokio::time::sleep(sleep.saturating_sub(TIMER_TICK)).await;
            until(self.deadline).await;
        } else {
            tokio::time::sleep(sleep).await;
        }
        true
    }
}

/// The wait rules on a paused clock, without Redis.
#[cfg(test)]
mod tests;
