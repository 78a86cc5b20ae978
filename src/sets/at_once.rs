//! A set of keys on one node (a single server, or one Cluster slot) taken in one script
//! (`lua/take_set.lua`), all or none: the atomic path of `Locker::acquire_many` on both
//! lockers and of a polling locker's `acquire_many_wait`. A set larger than one call's bound
//! ([`TAKE_SET_MAX`]) is taken in calls of that many keys, in order, each all or none; the
//! first that finds a key held gives back what the calls before it took.
//!
//! It never holds a key while it waits, and never takes a key whose queue may have waiters
//! (they come first, as for one key).

use super::guard::{release_all, LockSetGuard};
use crate::error::{Error, Op, Result};
use crate::hold::guard::{release_many, LockGuard};
use crate::hold::lease::Hold;
use crate::hold::refresh::Refreshing;
use crate::keys::Names;
use crate::limits::TAKE_SET_MAX;
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::redis::{Engine, ResidueGuard, SetAttempt};
use crate::wait::strategy::Strategy;
use crate::wait::{Request, Waiting};
use std::future::Future;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

impl<S: Strategy> Locker<S> {
    /// The set a path took (`taken`, after `waited` if it waited), counted in the locker's
    /// stats for each key: each key kept alive with the set's shared loss token, or, when one
    /// was lost already, every key released and `Expired` naming it.
    pub(super) async fn held_set(
        &self,
        keys: &[String],
        taken: Result<Vec<LockGuard>>,
        waited: Option<Duration>,
    ) -> Result<LockSetGuard> {
        for key in keys {
            self.engine.meter.record(key, &taken, waited);
        }
        let mut guards = taken?;
        let lost = CancellationToken::new();
        for guard in &mut guards {
            guard.share_loss(&lost);
        }
        if let Some((key, reason)) = guards
            .iter()
            .find_map(|g| g.loss().map(|r| (g.key().to_owned(), r)))
        {
            release_all(guards, false).await;
            return Err(Error::Expired { key, reason });
        }
        Ok(LockSetGuard { guards, lost })
    }

    /// Takes `keys` (on one node) at once: every key in one script, or none (one attempt, or,
    /// waiting, a polling wait that holds nothing between attempts), each kept alive from the
    /// moment it is taken, with the set's shared loss token. Calls of at most
    /// `TAKE_SET_MAX` (256) keys each, in order: the first that finds a key held gives back
    /// what the ones before it took.
    pub(super) async fn take_at_once(
        &self,
        keys: &[String],
        opts: &LockOptions,
        wait: bool,
    ) -> Result<LockSetGuard> {
        let start = Instant::now();
        let pid = self.strategy.process_id();
        let mut reqs = requests(self.holding(), keys, opts, pid)?;
        let taken = if wait {
            poll(&self.engine, &mut reqs, pid).await
        } else {
            once(&self.engine, &reqs).await
        };
        self.held_set(keys, taken, wait.then(|| start.elapsed()))
            .await
    }

    /// One attempt at each of `keys` (in order), all at once: the keys of one hash slot (all
    /// of them on a single server) in one call per 256 keys, all or none, each key kept alive
    /// from the moment it is taken. Keeps the run of keys taken from the first (their
    /// keep-alives moved to `lost`) and releases those taken after the first that failed
    /// (holding them while waiting for it could deadlock); gives that failure. (A call that
    /// fails takes none of its keys, so the run kept ends before that call's first key.)
    pub(super) async fn attempt_all(
        &self,
        keys: &[String],
        opts: &LockOptions,
        lost: &CancellationToken,
    ) -> (Vec<LockGuard>, Option<Error>) {
        // Runs of keys in one slot (the keys are sorted by slot), at most 256 each.
        let mut groups: Vec<&[String]> = Vec::new();
        let mut from = 0;
        while from < keys.len() {
            let end = self.run_end(keys, from);
            groups.extend(keys[from..end].chunks(TAKE_SET_MAX));
            from = end;
        }
        // A dropped call aborts the attempts, and each attempt's own cancel safety (or a
        // finished one's guards dropping) releases its keys.
        let outcomes = all_at_once(groups.iter().map(|group| {
            let engine = Arc::clone(&self.engine);
            let reqs = requests(self.holding(), group, opts, self.strategy.process_id());
            async move {
                let reqs = reqs?;
                let taken = once(&engine, &reqs).await;
                // (each key counts as one attempt in the locker's stats, as a key's `acquire`)
                for req in &reqs {
                    engine.meter.record(&req.names.key, &taken, None);
                }
                taken
            }
        }))
        .await;
        let (mut kept, mut extra, mut failed) = (Vec::new(), Vec::new(), None);
        for (i, outcome) in outcomes.into_iter().enumerate() {
            match outcome {
                Some(Ok(guards)) if failed.is_none() => {
                    for mut guard in guards {
                        guard.share_loss(lost);
                        kept.push(guard);
                    }
                }
                Some(Ok(guards)) => extra.extend(guards),
                Some(Err(e)) if failed.is_none() => failed = Some(e),
                // Its task was cancelled: the runtime is shutting down.
                None if failed.is_none() => {
                    failed = Some(Error::Redis {
                        key: groups[i][0].clone(),
                        op: Op::Acquire,
                        source: fred::error::Error::new(
                            fred::error::ErrorKind::Canceled,
                            "the attempt's task was cancelled (the runtime is shutting down)",
                        ),
                    })
                }
                _ => {}
            }
        }
        release_all(extra, false).await;
        (kept, failed)
    }
}

/// Runs `calls` as tasks, so they all go out together; their outcomes in `calls`' order
/// (`None` for a task cancelled by the runtime shutting down). A panic in one resumes here
/// (a bug: what the task held was dropped with it). A dropped call aborts the tasks.
pub(super) async fn all_at_once<T, F>(calls: impl Iterator<Item = F>) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let mut outcomes = Vec::new();
    for (i, call) in calls.enumerate() {
        tasks.spawn(async move { (i, call.await) });
        outcomes.push(None);
    }
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, outcome)) => outcomes[i] = Some(outcome),
            Err(e) if e.is_panic() => resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    outcomes
}

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
    /// `blocked`: the index of the key the last attempt found held (see
    /// [`look_first`](Self::look_first)).
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
        if let Some(step) = self.look_first(engine, &client, reqs, blocked).await? {
            return Ok(step);
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

    /// A set of several calls first looks at the call of `blocked`, the key the last attempt
    /// found held (one read, nothing written): `Some` when it is still held (or the look
    /// failed), so that a retry that would stop there takes and gives back nothing before it.
    async fn look_first(
        &mut self,
        engine: &Arc<Engine>,
        client: &fred::clients::Client,
        reqs: &[Request],
        blocked: usize,
    ) -> Result<Option<SetStep>> {
        let call = blocked / TAKE_SET_MAX;
        let Some(chunk) = reqs.chunks(TAKE_SET_MAX).nth(call).filter(|_| call > 0) else {
            return Ok(None);
        };
        let sent_at = Instant::now();
        let (limit, cut) = self.limit(engine.settings.command_timeout, sent_at);
        self.attempts += 1;
        let locks: Vec<(&Names, &str)> = chunk.iter().map(|r| (&r.names, &*r.token)).collect();
        let ttl_ms = reqs[0].plan.ttl_ms;
        match engine
            .take_set_on(client, &locks, ttl_ms, true, limit)
            .await
        {
            // (A queue is served by the take that follows.)
            Ok(SetAttempt::Taken { .. } | SetAttempt::Queued { .. }) => Ok(None),
            Ok(SetAttempt::Held { index, remaining }) => {
                self.last_error = None;
                Ok(Some(SetStep::Held {
                    index: call * TAKE_SET_MAX + index,
                    remaining,
                }))
            }
            Err(e) => self.failed::<()>(e, cut).map(|_| Some(SetStep::Failed)),
        }
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
            let token: Arc<str> = Arc::from(crate::wait::own_token(token_pid));
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
