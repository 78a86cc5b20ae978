//! Waiting for a lock: one engine, two strategies.
//!
//! What both lockers share lives here once: the validated request, the deadline, the time
//! limit of each attempt, how an attempt's outcome is classified, the give-up rule, and
//! "wait 0 means try once". The strategies differ only in what a waiter does between
//! attempts: [`poll`] sleeps a backoff delay; [`notify`] queues in Redis and is handed the lock
//! by the release (see `notify`'s docs).

mod jitter;
pub(crate) mod notify;

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::lease::Hold;
use crate::keys::Names;
use crate::options::{LockOptions, Plan};
use crate::redis::scripts::Call;
use crate::redis::{new_token, Attempt, Engine, ResidueGuard};
use fred::clients::Client;
use jitter::Delays;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// When a wait deadline is this close, the last attempt still gets this long to answer. If it
/// does not, the wait ends with `WaitTimeout` (Redis was answering; the deadline came first).
const LAST_ATTEMPT_GRACE: Duration = Duration::from_millis(5);

/// One acquisition request, validated.
pub(crate) struct Request {
    pub(crate) names: Names,
    pub(crate) token: String,
    /// The token was generated for this call (only this call knows it).
    pub(crate) own_token: bool,
    pub(crate) plan: Plan,
}

impl Request {
    pub(crate) fn new(engine: &Engine, key: &str, opts: &LockOptions) -> Result<Request> {
        let plan = opts.validate(key)?;
        let names = engine.names(key)?;
        let (token, own_token) = match opts.token() {
            Some(t) => (t.to_owned(), false),
            None => (new_token(), true),
        };
        Ok(Request {
            names,
            token,
            own_token,
            plan,
        })
    }

    /// A guard for a lock this request now holds.
    pub(crate) fn guard(&self, engine: &Arc<Engine>, hold: Hold) -> LockGuard {
        tracing::debug!(key = %self.names.key, fence = hold.fence, confirmed = hold.confirmed, "acquired");
        LockGuard::new(
            Arc::clone(engine),
            self.names.clone(),
            self.token.clone(),
            self.plan.ttl(),
            self.plan.refresh_ratio,
            hold,
        )
    }
}

/// What one attempt gives a wait loop.
pub(crate) enum Step {
    Won(LockGuard),
    /// Another token holds it. `queued`: our member is in the Redis queue, as of an attempt
    /// sent at `sent_at` (which Redis therefore ran before any grant to us).
    Held {
        remaining: Option<Duration>,
        queued: bool,
        /// Queued, but Redis has no subscription for our grants (see `Attempt::Locked`).
        deaf: bool,
        /// The latest fence when the attempt ran: only a grant with a higher one is new.
        fence: u64,
        sent_at: Instant,
    },
    /// A connection error or timeout; worth retrying until the deadline.
    Failed,
}

/// A wait in progress: its clock, its attempts and the give-up rule.
pub(crate) struct Waiting {
    pub(crate) start: Instant,
    pub(crate) deadline: Instant,
    wait: Duration,
    pub(crate) attempts: u32,
    /// The error of the last attempt, when it failed for a reason worth reporting instead of
    /// `WaitTimeout` (a connection error, or a timeout of the full command timeout).
    last_error: Option<Error>,
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
            wait: plan.wait,
            attempts: 0,
            last_error: None,
            delays: None,
            backoff: plan.backoff,
        }
    }

    /// The time limit of an attempt sent at `now`, and whether the wait deadline cut it.
    fn limit(&self, engine: &Engine, now: Instant) -> (Duration, bool) {
        if self.wait.is_zero() {
            return (engine.command_timeout, false);
        }
        let left = self
            .deadline
            .saturating_duration_since(now)
            .max(LAST_ATTEMPT_GRACE);
        if left < engine.command_timeout {
            (left, true)
        } else {
            (engine.command_timeout, false)
        }
    }

    /// One attempt on `client`, queueing `member` unless it is empty, classified.
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
        let (limit, cut) = self.limit(engine, sent_at);
        self.attempts += 1;
        let call = Call {
            names: &req.names,
            token: &req.token,
            ttl_ms: req.plan.ttl_ms,
            member,
            flag: "",
        };
        // A queued waiter's own residue guard gives back whatever this attempt may take; an
        // unqueued attempt with a generated token releases it if the outcome is unknown.
        let mut residue = ResidueGuard {
            engine,
            client,
            names: &req.names,
            token: &req.token,
            armed: req.own_token && member.is_empty(),
        };
        let reply = engine.attempt_on(client, &call, limit).await;
        residue.armed &= matches!(&reply, Err(e) if e.is_transient());
        let ttl = req.plan.ttl();
        let held = |fence, px| {
            Step::Won(req.guard(
                engine,
                Hold {
                    fence,
                    sent_at,
                    px,
                    confirmed: true,
                },
            ))
        };
        match reply {
            Ok(Attempt::Acquired { fence } | Attempt::Granted { fence }) => {
                let step = held(fence, ttl);
                self.replicated(engine, req, client, step).await
            }
            // Our own fresh token can only be there because fred re-sent the script.
            Ok(Attempt::AlreadyHeld { fence, remaining }) if req.own_token => {
                let step = held(fence, remaining.unwrap_or(ttl));
                self.replicated(engine, req, client, step).await
            }
            Ok(Attempt::AlreadyHeld { remaining, .. }) => Err(Error::AlreadyHeld {
                key: req.names.key.clone(),
                remaining_ttl: remaining,
            }),
            Ok(Attempt::Locked {
                remaining,
                queued,
                deaf,
                fence,
            }) => {
                self.last_error = None;
                Ok(Step::Held {
                    remaining,
                    queued,
                    deaf,
                    fence,
                    sent_at,
                })
            }
            Err(e) if e.is_transient() && !self.wait.is_zero() => {
                // A timeout that only the wait deadline caused says nothing about Redis: the
                // earlier attempts' outcome stands (none: `WaitTimeout`).
                if !(cut && matches!(e, Error::Timeout { .. })) {
                    self.last_error = Some(e);
                }
                Ok(Step::Failed)
            }
            Err(e) => Err(e),
        }
    }

    /// With required replicas, a lock just taken counts only once enough replicas acknowledged
    /// it (`WAIT` on the client that took it); otherwise it is released and the attempt fails
    /// with `Error::NotReplicated`.
    async fn replicated(
        &mut self,
        engine: &Arc<Engine>,
        req: &Request,
        client: &Client,
        step: Step,
    ) -> Result<Step> {
        if engine.replicas.is_none() {
            return Ok(step);
        }
        match engine.replicated(client, &req.names).await {
            Ok(()) => Ok(step),
            Err(e) => {
                if let Step::Won(guard) = step {
                    // Released now (not in the background): the caller learns of a lock that
                    // is gone, not of one that lingers.
                    let _ = guard.release().await;
                }
                Err(e)
            }
        }
    }

    /// The error of a wait that ran out: the last attempt's connection error, if it failed
    /// that way (it says more), else `WaitTimeout`.
    pub(crate) fn give_up(&mut self, req: &Request) -> Error {
        self.last_error
            .take()
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

/// One attempt, no waiting: the lock, or `Locked` with the holder's remaining TTL. Never jumps
/// a queue: a free lock with live waiters queued goes to the oldest of them.
pub(crate) async fn once(engine: &Arc<Engine>, req: &Request) -> Result<LockGuard> {
    let mut w = Waiting::new(&Plan {
        wait: Duration::ZERO,
        ..req.plan
    });
    let client = engine.backend.next_client().clone();
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
    loop {
        let client = engine.backend.next_client().clone();
        // Boxed: the attempt's state (~0.9 KiB) would otherwise stay in the future while it
        // sleeps, for every waiter.
        let remaining = match Box::pin(w.attempt(engine, req, &client, "")).await? {
            Step::Won(g) => return Ok(g),
            Step::Held { remaining, .. } => remaining,
            Step::Failed => None,
        };
        let now = Instant::now();
        if now >= w.deadline {
            return Err(w.give_up(req));
        }
        let sleep = w.backoff(now, remaining);
        tracing::debug!(key = %req.names.key, attempts = w.attempts, ?sleep, "waiting (timer)");
        tokio::time::sleep(sleep).await;
    }
}
