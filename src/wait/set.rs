//! A set of keys on one node (a single server, or one Cluster slot) taken in one script
//! (`lua/take_set.lua`), all or none: the atomic path of `Locker::acquire_many` on both
//! lockers and of a polling locker's `acquire_many_wait`. A set larger than one call's bound
//! ([`TAKE_SET_MAX`]) is taken in calls of that many keys, in order, each all or none; the
//! first that finds a key held gives back what the calls before it took.
//!
//! It never holds a key while it waits, and never takes a key whose queue may have waiters
//! (they come first, as for one key).

use super::{Request, Waiting};
use crate::error::{Error, Result};
use crate::hold::guard::{release_many, LockGuard};
use crate::hold::lease::Hold;
use crate::hold::refresh::Refreshing;
use crate::keys::Names;
use crate::limits::TAKE_SET_MAX;
use crate::options::LockOptions;
use crate::redis::{Engine, ResidueGuard, SetAttempt};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The requests of a set, one per key (in the order given), sharing one generated token: all
/// of the set's calls then go through one client, in order (a give-back after a call whose
/// outcome is unknown runs after that call, never before it).
pub(crate) fn requests(
    holding: (&Engine, &Arc<Refreshing>),
    keys: &[String],
    opts: &LockOptions,
    pid: &str,
) -> Result<Vec<Request>> {
    let mut reqs: Vec<Request> = Vec::with_capacity(keys.len());
    for key in keys {
        let mut req = Request::attempt(holding, key, opts, pid)?;
        if let Some(first) = reqs.first() {
            req.token = Arc::clone(&first.token);
        }
        reqs.push(req);
    }
    Ok(reqs)
}

/// The requests of a set that a queued locker of process `pid` waits for at once (see
/// [`SetRequest`]): as [`requests`] makes them, but each sent as the waiting process's (its
/// queueing calls name it).
pub(crate) fn queued_requests(
    holding: (&Engine, &Arc<Refreshing>),
    keys: &[String],
    opts: &LockOptions,
    pid: &str,
) -> Result<Vec<Request>> {
    let mut reqs = requests(holding, keys, opts, pid)?;
    for req in &mut reqs {
        req.pid = pid.to_owned();
    }
    Ok(reqs)
}

/// What one attempt at a set gives a wait loop.
pub(crate) enum SetStep {
    /// Every key, kept alive, in order.
    Won(Vec<LockGuard>),
    /// The key at `index` is held (or has waiters queued: `remaining` is then `None`).
    Held {
        index: usize,
        remaining: Option<Duration>,
    },
    /// A connection error or timeout; worth retrying until the deadline.
    Failed,
}

impl Waiting {
    /// One attempt at the whole set `reqs` (see the [module](self) docs): every key taken and
    /// kept alive, or none held when it returns. A call whose outcome is unknown (dropped, or
    /// timed out: it may still run) gives back its keys in the background, after it.
    /// `blocked`: the index of the key the last attempt found held; a set of several calls
    /// first looks at that key's call's keys (one read, nothing written), so that a retry
    /// that would stop there takes and gives back nothing before it.
    pub(crate) async fn attempt_set(
        &mut self,
        engine: &Arc<Engine>,
        reqs: &[Request],
        blocked: usize,
    ) -> Result<SetStep> {
        let Some(first) = reqs.first() else {
            return Ok(SetStep::Won(Vec::new()));
        };
        let client = first.client(engine).clone();
        let ttl = first.plan.ttl();
        let call = blocked / TAKE_SET_MAX;
        if call > 0 {
            if let Some(chunk) = reqs.chunks(TAKE_SET_MAX).nth(call) {
                let sent_at = Instant::now();
                let (limit, cut) = self.limit(engine.settings.command_timeout, sent_at);
                self.attempts += 1;
                let locks: Vec<(&Names, &str)> =
                    chunk.iter().map(|r| (&r.names, &*r.token)).collect();
                match engine
                    .take_set_on(&client, &locks, first.plan.ttl_ms, true, limit)
                    .await
                {
                    Ok(SetAttempt::Taken { .. }) => {}
                    Ok(SetAttempt::Held { index, remaining }) => {
                        self.last_error = None;
                        return Ok(SetStep::Held {
                            index: call * TAKE_SET_MAX + index,
                            remaining,
                        });
                    }
                    // (The take that follows serves its queue.)
                    Ok(SetAttempt::Queued { .. }) => {}
                    Err(e) => return self.failed::<()>(e, cut).map(|_| SetStep::Failed),
                }
            }
        }
        let mut guards: Vec<LockGuard> = Vec::with_capacity(reqs.len());
        for (n, chunk) in reqs.chunks(TAKE_SET_MAX).enumerate() {
            let offset = n * TAKE_SET_MAX;
            let sent_at = Instant::now();
            let (limit, cut) = self.limit(engine.settings.command_timeout, sent_at);
            self.attempts += 1;
            // Armed until the reply says what the call did.
            let mut residues: Vec<ResidueGuard<'_>> = chunk
                .iter()
                .map(|r| ResidueGuard {
                    engine,
                    names: &r.names,
                    token: &r.token,
                    armed: true,
                })
                .collect();
            let locks: Vec<(&Names, &str)> = chunk.iter().map(|r| (&r.names, &*r.token)).collect();
            let reply = engine
                .take_set_on(&client, &locks, first.plan.ttl_ms, false, limit)
                .await;
            if !matches!(&reply, Err(e) if e.is_transient()) {
                residues.iter_mut().for_each(|r| r.armed = false);
            }
            let held = match reply {
                Ok(SetAttempt::Taken { fences }) => {
                    if let Err(e) = engine.replicated(&client, &first.names).await {
                        // (This call's keys are given back by their residues, in the
                        // background.)
                        residues.iter_mut().for_each(|r| r.armed = true);
                        drop(residues);
                        release_many(guards).await;
                        return self.failed::<()>(e, cut).map(|_| SetStep::Failed);
                    }
                    drop(residues);
                    for (req, fence) in chunk.iter().zip(fences) {
                        let mut guard = req.guard(engine, Hold::sent(fence, sent_at, ttl));
                        guard.keep_alive();
                        guards.push(guard);
                    }
                    continue;
                }
                Ok(SetAttempt::Held { index, remaining }) => (offset + index, remaining),
                Ok(SetAttempt::Queued { index }) => {
                    // Its waiters come first: served now (as a polling attempt at that key
                    // alone would), in case their watchers are gone.
                    let req = &chunk[index];
                    let _ = engine
                        .release_on(&client, &req.names, &req.token, "", limit)
                        .await;
                    (offset + index, None)
                }
                Err(e) => {
                    drop(residues);
                    release_many(guards).await;
                    return self.failed::<()>(e, cut).map(|_| SetStep::Failed);
                }
            };
            drop(residues);
            release_many(guards).await;
            self.last_error = None;
            return Ok(SetStep::Held {
                index: held.0,
                remaining: held.1,
            });
        }
        Ok(SetStep::Won(guards))
    }
}

/// One attempt at a set, no waiting: every key, or `Locked` naming the key found held.
pub(crate) async fn once(engine: &Arc<Engine>, reqs: &[Request]) -> Result<Vec<LockGuard>> {
    let Some(first) = reqs.first() else {
        return Ok(Vec::new());
    };
    let mut w = Waiting::new(&crate::options::Plan {
        wait: Duration::ZERO,
        ..first.plan
    });
    match Box::pin(w.attempt_set(engine, reqs, 0)).await? {
        SetStep::Won(guards) => Ok(guards),
        SetStep::Held { index, remaining } => Err(Error::Locked {
            key: reqs[index].names.key.clone(),
            remaining_ttl: remaining,
        }),
        SetStep::Failed => Err(w.give_up(first)),
    }
}

/// A polling wait for a set: attempt the whole set; if a key is held, sleep
/// `min(backoff, its holder's TTL, deadline)` holding nothing, and try again, with a new
/// token (`token_pid`'s, as [`requests`] makes them): what an attempt gave back late (a
/// release retried in the background, a give-back after an unknown outcome) can then never
/// hit what a later attempt took.
pub(crate) async fn poll(
    engine: &Arc<Engine>,
    reqs: &mut [Request],
    token_pid: &str,
) -> Result<Vec<LockGuard>> {
    let Some(first) = reqs.first() else {
        return Ok(Vec::new());
    };
    if first.plan.wait.is_zero() {
        return once(engine, reqs).await;
    }
    let mut w = Waiting::new(&first.plan);
    // The key the last attempt found held: what a timeout names.
    let mut blocked = 0;
    loop {
        if w.attempts > 0 {
            let token: Arc<str> = Arc::from(super::own_token(token_pid));
            for req in reqs.iter_mut() {
                req.token = Arc::clone(&token);
            }
        }
        let remaining = match Box::pin(w.attempt_set(engine, reqs, blocked)).await? {
            SetStep::Won(guards) => return Ok(guards),
            SetStep::Held { index, remaining } => {
                blocked = index;
                remaining
            }
            SetStep::Failed => None,
        };
        if !w.pause(&reqs[blocked].names.key, remaining).await {
            return Err(w.give_up(&reqs[blocked]));
        }
    }
}

/// A queued locker's wait for a set on one node, all of its keys at once: its requests (one
/// per key, in the one order: by hash slot, then by key; sharing one generated token), waited
/// for as one ([`notify::Target`](super::notify::Target)): its member in every key's queue,
/// holding nothing, granted every key in one step and one message (`lua/set_acquire.lua`).
pub(crate) struct SetRequest {
    pub(crate) reqs: Vec<Request>,
    /// The key the last attempt found held (an index into `reqs`): what a timeout names.
    pub(crate) blocked: std::sync::atomic::AtomicUsize,
}

impl SetRequest {
    pub(crate) fn new(reqs: Vec<Request>) -> SetRequest {
        SetRequest {
            reqs,
            blocked: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Leaves every queue of the set (`member`, unless empty, of process `pid`) and gives back
    /// whatever its token holds, in the background.
    pub(crate) fn leave_in_background(&self, engine: &Arc<Engine>, member: String, pid: String) {
        engine.set_leave_in_background(
            self.reqs.iter().map(|r| r.names.clone()).collect(),
            self.reqs[0].token.to_string(),
            member,
            pid,
            None,
        );
    }

    /// The keys' names, in order.
    pub(crate) fn names(&self) -> Vec<&Names> {
        self.reqs.iter().map(|r| &r.names).collect()
    }

    /// The set's member in its keys' queues (see `protocol::set_member`).
    pub(crate) fn member(&self, pid: &str) -> String {
        let head = &self.reqs[0];
        crate::redis::protocol::set_member(
            pid,
            head.plan.ttl_ms,
            &head.token,
            self.reqs.iter().map(|r| r.names.lock.as_str()),
        )
    }

    /// The set's guards for `holds` (one per key, in order), each with its whole TTL asked
    /// for, as [`Request::full_lease`] makes one key's (the keys whose lease is short are
    /// extended, all at once). `None`: a key is no longer held by the set (the others are
    /// given back before this returns).
    pub(crate) async fn full_leases(
        &self,
        engine: &Arc<Engine>,
        client: &fred::clients::Client,
        holds: Vec<Hold>,
        written_by_us: bool,
        limit: Duration,
    ) -> Result<Option<Vec<LockGuard>>> {
        let leases = self
            .reqs
            .iter()
            .zip(holds)
            .map(|(req, hold)| req.full_lease(engine, client, hold, written_by_us, limit));
        let outcomes = join_all(leases.collect()).await;
        let mut guards = Vec::with_capacity(outcomes.len());
        let mut failed: Option<Result<Option<Vec<LockGuard>>>> = None;
        for outcome in outcomes {
            match outcome {
                Ok(Some(g)) => guards.push(g),
                Ok(None) => failed = failed.or(Some(Ok(None))),
                Err(e) => failed = Some(Err(e)),
            }
        }
        match failed {
            None => Ok(Some(guards)),
            Some(outcome) => {
                release_many(guards).await;
                outcome
            }
        }
    }
}

/// Polls `futures` together (they share the caller's task: one token's calls on one client
/// go out together); their outputs in order.
pub(crate) async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

impl Waiting {
    /// One attempt at the queued set `set` on `client` (`lua/set_acquire.lua`), queueing
    /// `member` in every key's queue unless it is empty: every key held and kept to its full
    /// lease, or held by others (and queued). An attempt without a member whose outcome is
    /// unknown (dropped, or timed out: it may still run) gives back what it may have taken,
    /// in the background after it; a queued waiter's departure does that for its attempts.
    pub(crate) async fn attempt_queued_set(
        &mut self,
        engine: &Arc<Engine>,
        set: &SetRequest,
        client: &fred::clients::Client,
        member: &str,
    ) -> Result<super::Step<Vec<LockGuard>>> {
        use super::Step;
        use crate::redis::scripts::Call;
        use crate::redis::SetTry;
        let head = &set.reqs[0];
        let sent_at = Instant::now();
        let (limit, cut) = self.limit(engine.settings.command_timeout, sent_at);
        self.attempts += 1;
        let call = Call {
            ttl_ms: head.plan.ttl_ms,
            member,
            pid: if member.is_empty() { "" } else { &head.pid },
            ..Call::new(&head.names, &head.token)
        };
        let names = set.names();
        let mut residue = SetResidue {
            engine,
            set,
            armed: member.is_empty(),
        };
        let reply = engine.set_attempt_on(client, &names, &call, limit).await;
        if matches!(&reply, Ok(SetTry::Locked { .. }))
            || matches!(&reply, Err(e) if !e.is_transient())
        {
            residue.armed = false;
        }
        let ttl = head.plan.ttl();
        let holds: Vec<Hold> = match reply {
            Ok(SetTry::Acquired { fences }) | Ok(SetTry::Granted { fences }) => fences
                .into_iter()
                .map(|f| Hold::sent(f, sent_at, ttl))
                .collect(),
            // (The set's token is generated: a hold of it is this wait's.)
            Ok(SetTry::AlreadyHeld { fences, remaining }) => fences
                .into_iter()
                .map(|f| Hold::sent(f, sent_at, remaining.unwrap_or(ttl)))
                .collect(),
            Ok(SetTry::Locked {
                index,
                remaining,
                queued,
            }) => {
                self.last_error = None;
                set.blocked
                    .store(index, std::sync::atomic::Ordering::Relaxed);
                return Ok(Step::Held {
                    remaining,
                    queued,
                    sent_at,
                });
            }
            Err(e) => return self.failed(e, cut),
        };
        match set.full_leases(engine, client, holds, true, limit).await {
            Ok(Some(g)) => {
                residue.armed = false;
                Ok(Step::Won(g))
            }
            // Held by our token a moment ago, gone now (it expired): try again.
            Ok(None) => Ok(Step::Failed),
            Err(e) => self.failed(e, cut),
        }
    }
}

/// Gives back whatever a set's token may have taken by an attempt whose outcome is unknown,
/// when dropped armed.
struct SetResidue<'a> {
    engine: &'a Arc<Engine>,
    set: &'a SetRequest,
    armed: bool,
}

impl Drop for SetResidue<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.set
                .leave_in_background(self.engine, String::new(), String::new());
        }
    }
}
