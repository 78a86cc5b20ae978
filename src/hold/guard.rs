//! A held lock.

use super::lease::{Hold, Lease};
use super::refresh::{Held, Refreshing};
use crate::error::{Error, LossReason, Result};
use crate::keys::Names;
use crate::options::{check_ttl, Refresh};
use crate::redis::scripts::{Call, Via};
use crate::redis::{Engine, Extended, GivenBack, Released};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One guard's keep-alive: its place in the locker's refresher (`None`: nothing refreshes it,
/// as outside a tokio runtime or once lost), and its loss token.
struct Task {
    id: Option<u64>,
    lost: CancellationToken,
}

/// A held lock. Release it with [`release`](LockGuard::release); dropping it releases the lock
/// in a background task instead (never blocking the thread), and outside a tokio runtime lets it
/// expire by its TTL.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    engine: Arc<Engine>,
    /// The locker's refresher (see [`keep_alive`](Self::keep_alive)).
    refresher: Arc<Refreshing>,
    names: Names,
    token: String,
    /// The locker's process id (a queued locker's; empty for a polling one).
    pid: String,
    fence: u64,
    refresh: Refresh,
    lease: Arc<Lease>,
    task: Option<Task>,
    released: bool,
    /// Taken free (see [`Hold`]): released with one compare-and-delete where the server has
    /// one and nobody queued since.
    taken: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.names.key)
            .field("fence", &self.fence)
            .field("lost", &self.loss())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// A guard for a lock taken with `hold`: Redis keeps it until `hold.valid_until` (and
    /// longer) with no further step from the holder.
    pub(crate) fn new(
        (engine, refresher): (Arc<Engine>, Arc<Refreshing>),
        names: Names,
        token: String,
        pid: String,
        ttl: Duration,
        refresh: Refresh,
        hold: Hold,
    ) -> Self {
        LockGuard {
            lease: Arc::new(Lease::new(ttl, &hold)),
            engine,
            refresher,
            names,
            token,
            pid,
            fence: hold.fence,
            refresh,
            task: None,
            released: false,
            taken: hold.taken,
        }
    }

    /// The user's key (without prefix).
    pub fn key(&self) -> &str {
        &self.names.key
    }

    /// The token that holds the lock.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The fencing token: strictly greater than the fence of every earlier acquisition of this
    /// key, also across expiry, eviction and Redis restarts (see `docs/design.md`). Pass it to
    /// the storage you protect and have it refuse writes with a lower fence than it has seen.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The last instant at which this holder may assume no one else holds the lock: when the
    /// lease Redis holds the lock for started, at the latest, by our clock (the send time of
    /// the command that set it; for a lock handed over by a grant, the grant's time in Redis
    /// carried over to our clock from the waiter's own last queueing call), plus that lease,
    /// minus a drift margin of 1% of it plus 2 ms. When `acquire_wait` returns it is the TTL
    /// asked for, less that margin and the time the call's reply (or the grant) took to
    /// arrive: see `docs/design.md`, "The lease at return". It follows every refresh and
    /// [`extend`](Self::extend), and never exceeds what Redis was last told for the token
    /// (a call whose outcome is unknown counts as sent).
    ///
    /// It is a `tokio::time::Instant` (the monotonic clock): a host suspended to RAM, or a VM
    /// paused, does not advance it, so after such a pause the guard still reads valid for the
    /// rest of its lease while Redis' own clock went on. Only the fence protects a resource
    /// across that (see `docs/design.md`, "Failure model").
    pub fn valid_until(&self) -> Instant {
        self.lease.lock().valid_until
    }

    /// Why the lock was judged lost, if it was (only known while a keep-alive runs, or after
    /// `extend` found it gone).
    pub fn loss(&self) -> Option<LossReason> {
        self.lease.lock().lost
    }

    /// Sets the lock's remaining TTL to `ttl`, shorter or longer than before, if this guard's
    /// token still holds it; the keep-alive (if running) refreshes with `ttl` from then on.
    ///
    /// [`valid_until`](Self::valid_until) follows: from the moment the call is sent it is cut
    /// to what `ttl` gives (the send time plus `ttl`, less the drift margin), and once Redis
    /// confirms, it is exactly that, earlier or later than before. A call that fails or times
    /// out may still run later, so its cut stays until a later call is confirmed. Calls that
    /// set the lease (this and the keep-alive's refreshes) go out one at a time: `extend`
    /// waits for a refresh in flight.
    ///
    /// Errors: [`Error::NotHeld`] when the token no longer holds the key (it is then marked
    /// lost), [`Error::InvalidOptions`] for a bad TTL, or a Redis error.
    ///
    /// # Cancel safety
    /// Cancel safe: the extend script is idempotent; a dropped call leaves the TTL either set
    /// or as it was, and the guard's validity counts it as possibly set.
    #[tracing::instrument(name = "extend", level = "debug", skip_all, fields(key = %self.names.key))]
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl_ms = check_ttl(&self.names.key, ttl)?;
        let ttl = Duration::from_millis(ttl_ms);
        let call = Call {
            ttl_ms,
            pid: &self.pid,
            ..Call::new(&self.names, &self.token)
        };
        let client = self.engine.backend.client_for(&self.token);
        let lease = Arc::clone(&self.lease);
        let _turn = lease.turn().await;
        let sent_at = lease.sending(ttl, true);
        self.touch();
        let extended = self
            .engine
            .extend_on(client, &call, self.engine.settings.command_timeout)
            .await?;
        if extended != Extended::NotHeld {
            lease.renewed(sent_at, ttl);
            self.touch();
            Ok(())
        } else {
            if self.loss().is_none() {
                self.engine
                    .meter
                    .locks_lost
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.lease.mark_lost(LossReason::TokenGone);
            self.stop_task();
            if let Some(t) = &self.task {
                t.lost.cancel();
            }
            Err(Error::NotHeld {
                key: self.names.key.clone(),
            })
        }
    }

    /// Releases the lock: hands it to the oldest live waiter queued for it, or deletes it.
    /// Stops the keep-alive first, so no refresh is sent after this call starts.
    ///
    /// Errors: [`Error::NotHeld`] when the token no longer held the key (it expired or was
    /// taken), or a Redis error: when Redis could not be reached (a timeout, a dropped
    /// connection, a Cluster slot that is moving), the release is tried again in the
    /// background until the lease ends, and the lock expires by its TTL if none gets through.
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, the guard's drop sends the release in the
    /// background.
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(key = %self.names.key))]
    pub async fn release(mut self) -> Result<()> {
        self.stop_task();
        let client = self.engine.backend.client_for(&self.token);
        let timeout = self.engine.settings.command_timeout;
        let released = if self.taken {
            self.engine
                .release_taken(client, &self.names, &self.token, &self.pid, timeout)
                .await
        } else {
            self.engine
                .release_on(client, &self.names, &self.token, &self.pid, timeout)
                .await
        };
        self.released = true;
        match released {
            Ok(Released::Deleted | Released::HandedOver) => Ok(()),
            Ok(Released::NotHeld) => Err(Error::NotHeld {
                key: self.names.key.clone(),
            }),
            Err(e) => {
                if e.is_transient() {
                    self.engine.release_in_background(
                        self.names.clone(),
                        std::mem::take(&mut self.token),
                        std::mem::take(&mut self.pid),
                        self.lease_end(),
                    );
                }
                Err(e)
            }
        }
    }

    /// Ends a critical section: releases the lock and says whether it was held throughout, by
    /// what this holder could know when the section ended (called then). `Ok(())`: no loss was
    /// seen, and the release found the lock still this token's or the section ended before the
    /// lease's validity deadline: a release that then finds the lock gone *after* that
    /// deadline only reached Redis late (a stalled server, a
    /// slow network, a re-send after a reconnect) and is counted in
    /// [`LockerStats::late_releases`](crate::LockerStats::late_releases). Errors:
    /// [`Error::Expired`] when the lock was, or may have been, lost while the section ran: a
    /// loss the keep-alive saw, or a release that found the lock gone when the section had
    /// ended after the deadline or when it answered *before* the deadline (it vanished: a restart, a failover, a
    /// hand-made `DEL`; with refresh off, the TTL elapsed: [`LossReason::TtlElapsed`]); a Redis
    /// error of the release (the section itself was covered: the lock expires by its TTL).
    /// [`run`](crate::Locker::run) ends with this; so does the `waitlock` command.
    ///
    /// # Cancel safety
    /// As [`release`](Self::release).
    pub async fn release_after_section(self) -> Result<()> {
        let end = self.section_end();
        let released = self.release().await;
        end.judge(released)
    }

    /// What [`release_after_section`](Self::release_after_section) knows of the section
    /// before it releases (now: when the section ended).
    pub(crate) fn section_end(&self) -> SectionEnd {
        let loss = self.loss();
        let valid_until = self.valid_until();
        SectionEnd {
            ended_valid: loss.is_none() && valid_until > Instant::now(),
            loss,
            valid_until,
            key: self.names.key.clone(),
            engine: self.engine(),
        }
    }

    /// Starts refreshing the lock in the background every `ratio × TTL` (the
    /// [`Refresh`](crate::Refresh) of the options it was acquired with) and returns a token that is cancelled the moment the
    /// lock is judged lost:
    /// - a refresh finds the token gone ([`LossReason::TokenGone`]);
    /// - no refresh succeeded before [`valid_until`](Self::valid_until)
    ///   ([`LossReason::Unreachable`]): cancelled at that deadline, before Redis lets another
    ///   client in;
    /// - with [`Refresh::Off`](crate::Refresh::Off), nothing is refreshed and the token is
    ///   cancelled at the validity deadline ([`LossReason::TtlElapsed`]).
    ///
    /// The task stops when the guard is released or dropped, and holds only a weak reference
    /// to the locker. Calling it again returns the same token.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(locker: waitlock::Locker) -> waitlock::Result<()> {
    /// let mut guard = locker.acquire_wait("migration", &waitlock::LockOptions::new()).await?;
    /// let lost = guard.keep_alive();
    /// tokio::select! {
    ///     _ = lost.cancelled() => eprintln!("lost the lock: {:?}", guard.loss()),
    ///     _ = async { /* long work */ } => {}
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn keep_alive(&mut self) -> CancellationToken {
        if let Some(t) = &self.task {
            return t.lost.clone();
        }
        self.keep_alive_with(CancellationToken::new())
    }

    /// Moves this guard's keep-alive (started with its own token) to `lost`, a set's shared
    /// token: the lease stays where it was (the refresher reads it again); a loss already
    /// seen cancels `lost` at once.
    pub(crate) fn share_loss(&mut self, lost: &CancellationToken) {
        if self.task.as_ref().is_some_and(|t| t.lost.is_cancelled()) {
            lost.cancel();
        }
        self.stop_task();
        self.task = None;
        self.keep_alive_with(lost.clone());
    }

    /// As [`keep_alive`](Self::keep_alive), with `lost` as the loss token (a set's guards
    /// share one: any key lost cancels it). A guard already kept alive keeps its own.
    pub(crate) fn keep_alive_with(&mut self, lost: CancellationToken) -> CancellationToken {
        if let Some(t) = &self.task {
            return t.lost.clone();
        }
        let id = if self.loss().is_some() {
            lost.cancel();
            None
        } else {
            self.refresher.add(
                &self.engine,
                Held {
                    names: self.names.clone(),
                    token: self.token.clone(),
                    pid: self.pid.clone(),
                    lease: Arc::clone(&self.lease),
                    refresh: self.refresh,
                    lost: lost.clone(),
                },
            )
        };
        self.task = Some(Task {
            id,
            lost: lost.clone(),
        });
        lost
    }

    /// Leaves the refresher: nothing is sent for this guard after this.
    fn stop_task(&mut self) {
        if let Some(id) = self.task.as_mut().and_then(|t| t.id.take()) {
            self.refresher.remove(id);
        }
    }

    /// The lease changed under this guard's own call: the refresher reads its times again.
    fn touch(&self) {
        if let Some(id) = self.task.as_ref().and_then(|t| t.id) {
            self.refresher.touch(id);
        }
    }

    /// When Redis lets the lock go by itself at the latest, as this guard knows it: its
    /// validity plus the margin it kept (a release tried after that finds nothing to do).
    fn lease_end(&self) -> Instant {
        let s = self.lease.lock();
        s.valid_until + crate::hold::lease::margin(s.ttl) * 2
    }

    pub(crate) fn lease(&self) -> Arc<Lease> {
        Arc::clone(&self.lease)
    }

    pub(crate) fn engine(&self) -> Arc<Engine> {
        Arc::clone(&self.engine)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_task();
        if !self.released {
            let until = self.lease_end();
            self.engine.release_in_background(
                self.names.clone(),
                std::mem::take(&mut self.token),
                std::mem::take(&mut self.pid),
                until,
            );
        }
    }
}

/// A section's end as its guard saw it before the release ([`LockGuard::section_end`]).
pub(crate) struct SectionEnd {
    loss: Option<LossReason>,
    valid_until: Instant,
    ended_valid: bool,
    key: String,
    engine: Arc<Engine>,
}

impl SectionEnd {
    /// Whether the lock was held throughout, given what its release said (see
    /// [`LockGuard::release_after_section`]).
    pub(crate) fn judge(self, released: Result<()>) -> Result<()> {
        let SectionEnd {
            loss,
            valid_until,
            ended_valid,
            key,
            engine,
        } = self;
        if let Some(reason) = loss {
            return Err(Error::Expired { key, reason });
        }
        match released {
            // Its token still held the lock: nobody else did meanwhile.
            Ok(()) => Ok(()),
            // Answered after the lease: it only came late; the section ended while the lock
            // was valid.
            Err(Error::NotHeld { .. }) if ended_valid && Instant::now() >= valid_until => {
                engine
                    .meter
                    .late_releases
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                crate::metrics::late_release(engine.meter.subject(&key));
                tracing::warn!(key = %key, "the release found the lock gone, but the section ended while it was valid");
                Ok(())
            }
            // Answered within the lease: the lock vanished while the section ran.
            Err(Error::NotHeld { key }) => Err(Error::Expired {
                key,
                reason: LossReason::TokenGone,
            }),
            Err(e) => Err(e),
        }
    }
}

/// Releases `guards` (each as [`LockGuard::release`] does) in as few calls as it can: the locks
/// of one token in one hash slot together, a set's of at most `QUEUED_SET_MAX` (64) in one call
/// that lets each go and serves each one's queue (`lua/set_release.lua`: a set waiting for
/// several of them is granted at once), more of them in one call per 256 for those taken free
/// (state `p`, nobody queued behind them: `lua/give_back.lua`) and every other alone. Every
/// call goes out at once: a lock released alone from the start (most often one with waiters
/// behind it, whose release hands it on) does not wait for a batch. Outcomes in `guards`'
/// order.
///
/// Cancel safe: a dropped call leaves every guard not yet released to its drop (a background
/// release).
pub(crate) async fn release_many(guards: Vec<LockGuard>) -> Vec<Result<()>> {
    let n = guards.len();
    let mut outcomes: Vec<Option<Result<()>>> = (0..n).map(|_| None).collect();
    // By (token, slot): a token's calls go through its one client, and a call's keys are in
    // one slot.
    let mut groups: std::collections::BTreeMap<(String, u16), Vec<(usize, LockGuard)>> =
        Default::default();
    for (i, mut guard) in guards.into_iter().enumerate() {
        guard.stop_task();
        let slot = guard.engine.node_slot(&guard.names.lock);
        groups
            .entry((guard.token.clone(), slot))
            .or_default()
            .push((i, guard));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for ((token, _), mut members) in groups {
        while !members.is_empty() {
            let rest = members.split_off(members.len().min(crate::limits::TAKE_SET_MAX));
            let chunk = std::mem::replace(&mut members, rest);
            tasks.spawn(release_chunk(token.clone(), chunk));
        }
    }
    // The locks a batch left alone, released together once their batch answered.
    let mut alone = tokio::task::JoinSet::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((done, left)) = joined else { continue };
        for (i, outcome) in done {
            outcomes[i] = Some(outcome);
        }
        for (i, guard) in left {
            alone.spawn(async move { (i, guard.release().await) });
        }
    }
    while let Some(joined) = alone.join_next().await {
        if let Ok((i, outcome)) = joined {
            outcomes[i] = Some(outcome);
        }
    }
    // (A release whose task the runtime cancelled was handed to the guard's drop: a
    // background release.)
    outcomes.into_iter().map(|o| o.unwrap_or(Ok(()))).collect()
}

/// One chunk of [`release_many`] (one token, one slot): a lone lock released alone, a set's
/// in one release call, else one give-back call. The outcomes it has, and the locks left to
/// release alone (another state, or the call failed: each release retries in the background
/// when it must).
async fn release_chunk(
    token: String,
    chunk: Vec<(usize, LockGuard)>,
) -> (Vec<(usize, Result<()>)>, Vec<(usize, LockGuard)>) {
    if chunk.len() == 1 {
        let mut done = Vec::with_capacity(1);
        for (i, guard) in chunk {
            done.push((i, guard.release().await));
        }
        return (done, Vec::new());
    }
    let engine = Arc::clone(&chunk[0].1.engine);
    if chunk.len() <= crate::limits::QUEUED_SET_MAX {
        let set: Vec<&Names> = chunk.iter().map(|(_, g)| &g.names).collect();
        let released = engine
            .set_release_on(
                engine.backend.client_for(&token),
                &set,
                &token,
                &chunk[0].1.pid,
                engine.settings.command_timeout,
                Via::Sha,
            )
            .await;
        let Ok(codes) = released else {
            return (Vec::new(), chunk);
        };
        let done = chunk
            .into_iter()
            .zip(codes)
            .map(|((i, mut guard), code)| {
                guard.released = true;
                let outcome = match code {
                    Released::NotHeld => Err(Error::NotHeld {
                        key: guard.names.key.clone(),
                    }),
                    Released::Deleted | Released::HandedOver => Ok(()),
                };
                (i, outcome)
            })
            .collect();
        return (done, Vec::new());
    }
    let locks: Vec<(&Names, &str)> = chunk
        .iter()
        .map(|(_, g)| (&g.names, token.as_str()))
        .collect();
    let given = engine
        .give_back_on(
            engine.backend.client_for(&token),
            &locks,
            engine.settings.command_timeout,
        )
        .await;
    let Ok(codes) = given else {
        return (Vec::new(), chunk);
    };
    let (mut done, mut left) = (Vec::new(), Vec::new());
    for ((i, mut guard), code) in chunk.into_iter().zip(codes) {
        match code {
            GivenBack::Deleted => {
                guard.released = true;
                done.push((i, Ok(())));
            }
            GivenBack::NotHeld => {
                guard.released = true;
                done.push((
                    i,
                    Err(Error::NotHeld {
                        key: guard.names.key.clone(),
                    }),
                ));
            }
            GivenBack::Alone => left.push((i, guard)),
        }
    }
    (done, left)
}
