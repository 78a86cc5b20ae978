//! A queued locker's wait for a set on one node, all of its keys at once: its member in
//! every key's queue, holding nothing, granted every key in one step and one message
//! (`lua/set_acquire.lua`).

use super::at_once::requests;
use super::guard::LockSetGuard;
use crate::error::{Error, Result};
use crate::hold::guard::{release_many, LockGuard};
use crate::hold::lease::Hold;
use crate::hold::refresh::Refreshing;
use crate::keys::Names;
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::redis::protocol::Grant;
use crate::redis::Engine;
use crate::tasks::join_all;
use crate::wait::notify::{self, Target};
use crate::wait::strategy::Strategy;
use crate::wait::Step;
use crate::wait::{Request, Waiting};
use fred::clients::Client;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

impl<S: Strategy> Locker<S> {
    /// A queued locker's wait for `keys` (on one node, at most `QUEUED_SET_MAX`) at once: the
    /// set's member in every key's queue, holding nothing, granted every key in one step and
    /// one message when it heads each of those queues and each key is free (FIFO among sets
    /// that overlap: `lua/set_acquire.lua`, docs/design.md). Each key is kept alive from the
    /// moment the set is held, with the set's shared loss token.
    pub(super) async fn take_queued(
        &self,
        keys: &[String],
        opts: &LockOptions,
    ) -> Result<LockSetGuard> {
        let start = Instant::now();
        let pid = self.strategy.process_id();
        let reqs = queued_requests(self.holding(), keys, opts, pid)?;
        let taken = match self.strategy.hub() {
            Some(hub) => notify::wait(&self.engine, hub, &SetRequest::new(reqs)).await,
            None => super::at_once::once(&self.engine, &reqs).await,
        };
        self.held_set(keys, taken, Some(start.elapsed())).await
    }
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

impl Target for SetRequest {
    type Out = Vec<LockGuard>;

    fn head(&self) -> &Request {
        &self.reqs[0]
    }

    fn attempt<'a>(
        &'a self,
        w: &'a mut Waiting,
        engine: &'a Arc<Engine>,
        client: &'a Client,
        member: &'a str,
    ) -> impl Future<Output = Result<Step<Vec<LockGuard>>>> + Send + 'a {
        w.attempt_queued_set(engine, self, client, member)
    }

    async fn once<'a>(&'a self, engine: &'a Arc<Engine>) -> Result<Vec<LockGuard>> {
        super::at_once::once(engine, &self.reqs).await
    }

    fn member(&self, pid: &str) -> String {
        SetRequest::member(self, pid)
    }

    fn fits(&self, grant: &Grant) -> bool {
        grant.others.len() + 1 == self.reqs.len()
    }

    async fn granted<'a>(
        &'a self,
        engine: &'a Arc<Engine>,
        client: &'a Client,
        hold: Hold,
        grant: &'a Grant,
        limit: Duration,
    ) -> Result<Option<Vec<LockGuard>>> {
        let holds = grant.fences().map(|fence| Hold { fence, ..hold }).collect();
        self.full_leases(engine, client, holds, false, limit).await
    }

    fn leave_in_background(&self, engine: &Arc<Engine>, pid: &str) {
        SetRequest::leave_in_background(self, engine, self.member(pid), pid.to_owned());
    }

    fn give_up(&self, w: &mut Waiting) -> Error {
        let blocked = self.blocked.load(Ordering::Relaxed);
        w.give_up(self.reqs.get(blocked).unwrap_or(&self.reqs[0]))
    }
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
    ) -> Result<Step<Vec<LockGuard>>> {
        use crate::redis::scripts::Call;
        use crate::redis::SetTry;
        use crate::wait::Step;
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
