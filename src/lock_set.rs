//! Several keys at once: `acquire_many`, `acquire_many_wait` and `run_many` on both lockers.
//!
//! Three paths, chosen per call (docs/design.md, "Several keys at once"):
//!
//! - **At once** (keys on one node: a single server, or one Cluster slot; for one attempt on
//!   either locker, and for a polling locker's wait): every key in one script
//!   (`lua/take_set.lua`, at most `TAKE_SET_MAX` = 256 keys a call; a larger set is taken in
//!   calls of 256, in order, each all or none, the first that finds a key held giving back
//!   what the ones before it took), or none. A key whose queue may have waiters counts as held
//!   (they come first). A polling wait holds nothing between attempts. No opt-in.
//! - **Queued at once** (a queued locker's wait for keys on one node, at most
//!   [`QUEUED_SET_MAX`] = 64): the set's member in every key's queue, holding nothing; the call
//!   that frees its last key hands it every key in one step and one message, when it heads
//!   each of those queues and each key is free (`lua/set_acquire.lua`, the wait loop of
//!   `wait::notify`, one for one key or a set). Sets that share a key are served in the order
//!   they queued; no deadlock. No opt-in.
//! - **Ordered acquisition** (keys in several slots, or a queued locker's wait for more than
//!   64 keys; only when the caller opts in with [`LockOptions::with_ordered_sets`]): the keys,
//!   made a set (duplicates merged), are sorted by hash slot and then by key, and taken in that
//!   order a run (the keys of one slot) at a time, each kept alive from the moment it is
//!   taken, under one deadline. Waiting, a run is waited for as a whole (queued at once, or by
//!   polling at once) only when a key of it was found held; the runs after it are tried all at
//!   once (in bursts of [`BURST`] keys), keeping those taken from the first and releasing
//!   those after the first that failed. Every caller sorts the same way, so a waiter only ever
//!   waits for a run of a slot greater than every key it holds, and holds nothing of that
//!   slot: no cycle of waiters, also beside sets waiting at once, and no rollback-and-retry
//!   livelock (it never gives back a key to let another set through). What it does not give:
//!   a waiter holds the earlier slots' keys while it waits, and FIFO holds per slot, not per
//!   set.
//!
//! Anything that ends a call early (its deadline, an error, a dropped future) releases every
//! key taken and leaves every queue. The keys share one loss token: any key lost cancels it.

use crate::error::{Error, LossReason, Op, Result};
use crate::hold::guard::{release_many, LockGuard};
use crate::hold::lease::Lease;
use crate::hold::run::{section_result, CatchUnwind};
use crate::limits::{BURST, MAX_SET_KEYS, QUEUED_SET_MAX, TAKE_SET_MAX};
use crate::locker::Locker;
use crate::options::{LockOptions, Refresh};
use crate::wait::notify;
use crate::wait::set;
use crate::wait::strategy::Strategy;
use std::future::Future;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How a set is taken (see `Locker::set_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Keys on one node, in one script (one call per 256 keys), no queue.
    AtOnce,
    /// Keys on one node waited for by a queued locker: once in every key's queue.
    Queued,
    /// Keys taken one after another in the one order (opt-in).
    InOrder,
}

/// A set of held locks, taken together by
/// [`Locker::acquire_many`] or [`Locker::acquire_many_wait`]: one loss token for the whole
/// set, one release, a fence per key. Each key's lock is refreshed in the background from the
/// moment it was taken (the locker's refresher batches them; with [`Refresh::Off`] nothing
/// is refreshed and the token fires at the first key's validity deadline). Dropping it
/// releases every key in the background.
#[must_use = "dropping the set releases its locks at once"]
pub struct LockSetGuard {
    /// In the order taken (hash slot, then key).
    guards: Vec<LockGuard>,
    lost: CancellationToken,
}

impl std::fmt::Debug for LockSetGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSetGuard")
            .field(
                "keys",
                &self.guards.iter().map(LockGuard::key).collect::<Vec<_>>(),
            )
            .field("lost", &self.loss())
            .finish_non_exhaustive()
    }
}

impl LockSetGuard {
    /// The keys, in the order they were taken (by hash slot, then by key).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// Each key's guard, in the order taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The fencing token of `key` in this set (see [`LockGuard::fence`]), or `None` when the
    /// set does not hold `key`.
    pub fn fence(&self, key: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.key() == key)
            .map(LockGuard::fence)
    }

    /// The earliest of the keys' [`LockGuard::valid_until`]: the last instant this holder may
    /// assume no one else holds any of them.
    pub fn valid_until(&self) -> Instant {
        earliest(self.guards.iter().map(LockGuard::valid_until))
    }

    /// The first key judged lost, and why, if any was.
    pub fn loss(&self) -> Option<(&str, LossReason)> {
        self.guards
            .iter()
            .find_map(|g| g.loss().map(|reason| (g.key(), reason)))
    }

    /// The set's loss token: cancelled the moment any of its keys is judged lost (as
    /// [`LockGuard::keep_alive`]'s token is for one key). The keys are kept alive already.
    pub fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Sets every key's remaining TTL to `ttl` ([`LockGuard::extend`]), one key after
    /// another in the order taken; stops at the first that fails.
    ///
    /// Errors: [`Error::NotHeld`] naming the first key no longer held (it is marked lost and
    /// the set's token is cancelled), [`Error::InvalidOptions`], or a Redis error.
    ///
    /// # Cancel safety
    /// Cancel safe: as [`LockGuard::extend`] for each key; a dropped call leaves each key's
    /// TTL either set or as it was.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        for guard in &mut self.guards {
            guard.extend(ttl).await?;
        }
        Ok(())
    }

    /// Releases every key (all at once, each as [`LockGuard::release`] does).
    ///
    /// Errors: the first error in key order: [`Error::NotHeld`] for a key no longer held, or
    /// a Redis error (that key's release goes on in the background); the other keys are
    /// released either way.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call releases the keys not yet released in the background.
    pub async fn release(self) -> Result<()> {
        first_error(release_all(self.guards, false).await)
    }

    /// Ends a critical section over the set: releases every key and says whether each was
    /// held throughout ([`LockGuard::release_after_section`]). Errors: [`Error::Expired`]
    /// naming the first key that was, or may have been, lost; otherwise the first Redis error.
    ///
    /// # Cancel safety
    /// As [`release`](Self::release).
    pub async fn release_after_section(self) -> Result<()> {
        let mut ended = release_all(self.guards, true).await;
        if let Some(i) = ended
            .iter()
            .position(|r| matches!(r, Err(Error::Expired { .. })))
        {
            return ended.swap_remove(i);
        }
        first_error(ended)
    }

    /// The keys' guards, in the order taken, to hold or release one by one. They keep sharing
    /// the set's loss token.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}

/// What a critical section over a set gets ([`Locker::run_many`]).
#[derive(Clone)]
#[non_exhaustive]
pub struct LockSetContext {
    /// Cancelled the moment any key of the set is judged lost; stop touching the protected
    /// resources then.
    pub lost: CancellationToken,
    /// Each key with its fencing token, in the order taken (hash slot, then key).
    pub fences: Vec<(String, u64)>,
    leases: Vec<Arc<Lease>>,
}

impl LockSetContext {
    /// The fencing token of `key`, or `None` when the set does not hold it.
    pub fn fence(&self, key: &str) -> Option<u64> {
        self.fences.iter().find(|(k, _)| k == key).map(|(_, f)| *f)
    }

    /// The earliest validity deadline of the set's keys, as of their latest refreshes (see
    /// [`LockContext::valid_until`](crate::LockContext::valid_until)).
    pub fn valid_until(&self) -> Instant {
        earliest(self.leases.iter().map(|l| l.lock().valid_until))
    }
}

impl std::fmt::Debug for LockSetContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSetContext")
            .field("fences", &self.fences)
            .field("lost", &self.lost.is_cancelled())
            .field("valid_until", &self.valid_until())
            .finish()
    }
}

impl<S: Strategy> Locker<S> {
    /// One attempt at the set `keys`: all of them held, or none. On one node (a single server,
    /// or keys of one Cluster slot, e.g. hash-tagged `{acct}:1`, `{acct}:2`) every key is taken
    /// in one script (one per 256 keys), never a key whose queue has waiters; across slots,
    /// one attempt at each key in order, which needs [`LockOptions::with_ordered_sets`].
    ///
    /// Errors: [`Error::InvalidOptions`] (nothing sent) when the keys are in several slots
    /// and `opts` has not opted in to ordered sets (field `ordered_sets`; the value names the
    /// keys' hash slots), `keys` is
    /// empty or has more than [`MAX_SET_KEYS`] keys (field `keys`), `opts` has a fixed token
    /// (field `token`: each key gets a generated one, which a dropped attempt can give back),
    /// or an option is out of range (as for one key); [`Error::InvalidKey`] for
    /// a bad key; [`Error::Locked`] for the first key found held (the keys taken before it
    /// are released before this returns); [`Error::Expired`] when a key taken was lost
    /// before the last was taken; otherwise as [`acquire`](Self::acquire) for the key that
    /// failed.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future releases the keys it had taken in the background.
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<LockSetGuard> {
        let (keys, path) = self.set_order(keys, opts, false)?;
        match path {
            Path::AtOnce | Path::Queued => self.take_at_once(&keys, opts, false).await,
            Path::InOrder => self.take_in_order(&keys, opts, false).await,
        }
    }

    /// Takes every key of `keys`, waiting up to `opts.wait` for all of them: one deadline for
    /// the whole set.
    ///
    /// - A queued locker, keys on one node (a single server, or one Cluster slot), at most
    ///   64 of them: the set waits once in every key's queue, holding nothing, and is handed
    ///   every key in one step and one message when it is the oldest live waiter of each and
    ///   each is free. Sets that share a key are served in the order they queued (an older set
    ///   is never passed by a later one that overlaps it); a one-key waiter queued on one of
    ///   the keys is served in that order too. No opt-in needed.
    /// - A polling locker, keys on one node: the set at once, as
    ///   [`acquire_many`](Self::acquire_many) takes it, attempt after attempt with the backoff
    ///   of [`acquire_wait`](Self::acquire_wait), holding nothing between attempts (and in no
    ///   order: a polling waiter has no queue). No opt-in needed.
    /// - Otherwise (keys in several slots, or a queued locker's wait for more than 64 keys) in
    ///   order, which needs [`LockOptions::with_ordered_sets`]: the keys of each slot are
    ///   waited for together as above (at once in every key's queue, or by polling at once),
    ///   holding the keys of the slots before them. If a key already taken is lost
    /// meanwhile (Redis restarted, or stayed unreachable past its validity), every key is
    /// released and the set is taken again from the first, within the same deadline; with
    /// refresh off ([`Refresh::Off`]: the first keys' TTL elapsing while a later one is waited
    /// for is such a loss) it returns [`Error::Expired`] instead, so the set is never taken
    /// round after round.
    ///
    /// Errors: [`Error::WaitTimeout`] at the deadline (naming the key it was waiting for, the
    /// first its last attempt found held, `waited` the whole set's wait, `attempts` every
    /// attempt the set sent; the keys taken are released before it returns), or the
    /// connection error or timeout of the last attempt at that key when it failed so;
    /// [`Error::Locked`] when `wait` is zero; otherwise as
    /// [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future releases the keys it had taken in the background, and
    /// leaves every queue it waited in (giving back a grant that raced the drop), with no lock,
    /// queue entry or task left behind (as [`acquire_wait`](Self::acquire_wait)).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(locker: waitlock::Locker<waitlock::Queue>) -> waitlock::Result<()> {
    /// use std::time::Duration;
    /// let opts = waitlock::LockOptions::new().with_wait(Duration::from_secs(2));
    /// // One hash tag: one Cluster slot, so the set waits at once in both keys' queues.
    /// let set = locker.acquire_many_wait(&["{stock}:paris", "{stock}:lyon"], &opts).await?;
    /// let (paris, lyon) = (set.fence("{stock}:paris"), set.fence("{stock}:lyon"));
    /// // ... move stock, passing each store its own fence ...
    /// # let _ = (paris, lyon);
    /// set.release().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "acquire_many", level = "debug", skip_all, fields(keys = keys.len()))]
    pub async fn acquire_many_wait<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<LockSetGuard> {
        let wait = !opts.wait().is_zero();
        let (keys, path) = self.set_order(keys, opts, wait)?;
        match path {
            Path::AtOnce => self.take_at_once(&keys, opts, wait).await,
            Path::Queued => self.take_queued(&keys, opts).await,
            Path::InOrder => self.take_in_order(&keys, opts, wait).await,
        }
    }

    /// Runs `f` under the locks on every key of `keys`: takes them as
    /// [`acquire_many_wait`](Self::acquire_many_wait) does, refreshes them while `f` runs,
    /// releases them afterwards and returns `f`'s value. As [`run`](Self::run) for one key:
    /// [`Error::Expired`] (naming the first key lost) when any key was, or may have been,
    /// lost while `f` ran, whatever `f` returned; a panic in `f` releases the set, then
    /// resumes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops the refreshes and releases every key in the
    /// background.
    pub async fn run_many<K, F, Fut, T, E>(
        &self,
        keys: &[K],
        opts: &LockOptions,
        f: F,
    ) -> Result<T, E>
    where
        K: AsRef<str>,
        F: FnOnce(LockSetContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let set = self.acquire_many_wait(keys, opts).await?;
        let ctx = LockSetContext {
            lost: set.lost(),
            fences: set
                .guards
                .iter()
                .map(|g| (g.key().to_owned(), g.fence()))
                .collect(),
            leases: set.guards.iter().map(LockGuard::lease).collect(),
        };
        // If this future is dropped here, the guards' drops release them.
        let outcome = CatchUnwind(Box::pin(f(ctx))).await;
        let ended = set.release_after_section().await;
        section_result(outcome, ended)
    }

    /// The set's keys, checked (nothing sent), without duplicates, in the order every caller
    /// takes them: by hash slot, then by key; and how they are taken: at once (one node: see
    /// [`take_at_once`](Self::take_at_once)), waited for at once in every key's queue (a
    /// queued locker's wait on one node, at most `QUEUED_SET_MAX` keys: see
    /// [`take_queued`](Self::take_queued)), or in order (which needs the caller's opt-in).
    fn set_order<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
        wait: bool,
    ) -> Result<(Vec<String>, Path)> {
        let first = keys.first().map_or("", |k| k.as_ref());
        if keys.is_empty() {
            return Err(Error::invalid_option(
                first,
                "keys",
                "[]",
                "a set needs at least one key",
            ));
        }
        if keys.len() > MAX_SET_KEYS {
            return Err(Error::invalid_option(
                first,
                "keys",
                format!("{} keys", keys.len()),
                "a set has at most MAX_SET_KEYS (10,000) keys",
            ));
        }
        opts.validate(first)?;
        if opts.token().is_some() {
            return Err(Error::invalid_option(
                first,
                "token",
                "fixed",
                "a set's keys each get a generated token (a fixed one could not be given back \
                 when an attempt in flight is dropped)",
            ));
        }
        let mut order = Vec::with_capacity(keys.len());
        for key in keys {
            let names = self.engine.names(key.as_ref())?;
            order.push((fred::util::redis_keyslot(names.lock.as_bytes()), names.key));
        }
        order.sort_unstable();
        order.dedup();
        let one_node =
            !self.engine.clustered || order.first().map(|o| o.0) == order.last().map(|o| o.0);
        let queued_wait = wait && self.strategy.hub().is_some();
        let path = match (one_node, queued_wait) {
            (true, false) => Path::AtOnce,
            (true, true) if order.len() <= QUEUED_SET_MAX => Path::Queued,
            _ => Path::InOrder,
        };
        if path == Path::InOrder && !opts.ordered_sets() {
            let mut slots: Vec<u16> = order.iter().map(|(slot, _)| *slot).collect();
            slots.dedup();
            let shown: Vec<String> = slots.iter().take(8).map(u16::to_string).collect();
            let more = if slots.len() > 8 { ", ..." } else { "" };
            let reason = if one_node {
                "a queued locker waits for at most QUEUED_SET_MAX (64) keys at once; a larger \
                 set only in order (each key held while the next is waited for): opt in with \
                 LockOptions::with_ordered_sets, split the set, or take it at once with \
                 acquire_many or a polling locker"
            } else {
                "keys in several hash slots can only be taken in order (each key held while \
                 the next is waited for); opt in with LockOptions::with_ordered_sets, or give \
                 the keys one hash tag (\"{tag}:a\", \"{tag}:b\") to take them at once"
            };
            return Err(Error::invalid_option(
                &order[0].1,
                "ordered_sets",
                format!("off (keys in hash slots {}{more})", shown.join(", ")),
                reason,
            ));
        }
        Ok((order.into_iter().map(|(_, key)| key).collect(), path))
    }

    /// A queued locker's wait for `keys` (on one node, at most `QUEUED_SET_MAX`) at once: the
    /// set's member in every key's queue, holding nothing, granted every key in one step and
    /// one message when it heads each of those queues and each key is free (FIFO among sets
    /// that overlap: `lua/set_acquire.lua`, docs/design.md). Each key is kept alive from the
    /// moment the set is held, with the set's shared loss token.
    async fn take_queued(&self, keys: &[String], opts: &LockOptions) -> Result<LockSetGuard> {
        let start = Instant::now();
        let pid = self.strategy.process_id();
        let reqs = set::queued_requests(self.holding(), keys, opts, pid)?;
        let taken = match self.strategy.hub() {
            Some(hub) => notify::wait(&self.engine, hub, &set::SetRequest::new(reqs)).await,
            None => set::once(&self.engine, &reqs).await,
        };
        self.held_set(keys, taken, Some(start.elapsed())).await
    }

    /// The set a path took (`taken`, after `waited` if it waited), counted in the locker's
    /// stats for each key: each key kept alive with the set's shared loss token, or, when one
    /// was lost already, every key released and `Expired` naming it.
    async fn held_set(
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
    async fn take_at_once(
        &self,
        keys: &[String],
        opts: &LockOptions,
        wait: bool,
    ) -> Result<LockSetGuard> {
        let start = Instant::now();
        let pid = self.strategy.process_id();
        let mut reqs = set::requests(self.holding(), keys, opts, pid)?;
        let taken = if wait {
            set::poll(&self.engine, &mut reqs, pid).await
        } else {
            set::once(&self.engine, &reqs).await
        };
        self.held_set(keys, taken, wait.then(|| start.elapsed()))
            .await
    }

    /// Takes `keys` in order (one attempt each, or waiting until `opts`' deadline),
    /// each kept alive from the moment its attempt returns, with the set's shared loss token
    /// once it is known to be kept.
    async fn take_in_order(
        &self,
        keys: &[String],
        opts: &LockOptions,
        wait: bool,
    ) -> Result<LockSetGuard> {
        let start = Instant::now();
        // (`validate` checked that the deadline can be formed)
        let deadline = start + opts.wait();
        // Every attempt the set sent, for `WaitTimeout`.
        let mut attempts = 0u32;
        'set: loop {
            let lost = CancellationToken::new();
            let mut guards: Vec<LockGuard> = Vec::with_capacity(keys.len());
            // Waiting, the first key's run (its keys of one hash slot), and each run with a key
            // found held, is waited for as a whole, holding nothing of it; the runs after it are
            // tried all at once (a free set of 1,000 keys costs about one round trip's time,
            // not 1,000), keeping those taken from the first.
            let mut must_wait = wait;
            // The last burst's failure when it was a connection error or a timeout: what the
            // call ends with if the deadline passes before the run is waited for.
            let mut transient: Option<Error> = None;
            while guards.len() < keys.len() && !lost.is_cancelled() {
                let from = guards.len();
                if !must_wait {
                    let end = keys.len().min(from + BURST);
                    let burst = &keys[from..end];
                    attempts = attempts.saturating_add(burst.len() as u32);
                    let (taken, failed) = self.attempt_all(burst, opts, &lost).await;
                    guards.extend(taken);
                    match failed {
                        None => {}
                        Some(e) if wait => {
                            transient = e.is_transient().then_some(e);
                            must_wait = true;
                            // What is kept ends at a slot boundary: the keys taken of the run
                            // that failed (by an earlier call of a run over 256 keys, or an
                            // earlier burst) are given back, and the run is waited for whole.
                            // Kept, a set at once in that slot could need one of them while it
                            // heads the queue of a key this waiter waits for: each would wait
                            // for the other (review 3, finding 1).
                            let start = self.run_start(keys, guards.len());
                            if start < guards.len() {
                                release_all(guards.split_off(start), false).await;
                            }
                        }
                        Some(e) => {
                            release_all(guards, false).await;
                            return Err(e);
                        }
                    }
                    continue;
                }
                let run = &keys[from..self.run_end(keys, from)];
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    release_all(guards, false).await;
                    return Err(transient.unwrap_or_else(|| Error::WaitTimeout {
                        key: run[0].clone(),
                        waited: start.elapsed(),
                        attempts,
                    }));
                }
                let opts = opts.clone().with_wait(left);
                let taken = tokio::select! {
                    biased;
                    _ = lost.cancelled() => break,
                    taken = self.wait_run(run, &opts) => taken,
                };
                match taken {
                    Ok(run_guards) => {
                        for mut guard in run_guards {
                            guard.share_loss(&lost);
                            guards.push(guard);
                        }
                        must_wait = false;
                    }
                    Err(e) => {
                        release_all(guards, false).await;
                        return Err(match e {
                            Error::WaitTimeout {
                                key, attempts: a, ..
                            } => Error::WaitTimeout {
                                key,
                                waited: start.elapsed(),
                                attempts: attempts.saturating_add(a),
                            },
                            e => e,
                        });
                    }
                }
            }
            if lost.is_cancelled() {
                let (key, reason) = guards
                    .iter()
                    .find_map(|g| g.loss().map(|r| (g.key().to_owned(), r)))
                    .unwrap_or_else(|| (keys[0].clone(), LossReason::TokenGone));
                release_all(guards, false).await;
                // Taken again from the first: a key Redis lost (a restart, a failover). Not
                // when nothing refreshes the keys: the first keys' TTL would elapse again
                // while a later one is waited for, round after round.
                if wait && opts.refresh() != Refresh::Off {
                    continue 'set;
                }
                return Err(Error::Expired { key, reason });
            }
            return Ok(LockSetGuard { guards, lost });
        }
    }

    /// One attempt at each of `keys` (in order), all at once: the keys of one hash slot (all
    /// of them on a single server) in one call per 256 keys, all or none, each key kept alive
    /// from the moment it is taken. Keeps the run of keys taken from the first (their
    /// keep-alives moved to `lost`) and releases those taken after the first that failed
    /// (holding them while waiting for it could deadlock); gives that failure. (A call that
    /// fails takes none of its keys, so the run kept ends before that call's first key.)
    async fn attempt_all(
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
            let reqs = set::requests(self.holding(), group, opts, self.strategy.process_id());
            async move {
                let reqs = reqs?;
                let taken = set::once(&engine, &reqs).await;
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

    /// The end (exclusive) of the run of `keys` from `from` that share its hash slot (every key
    /// on a single server): what the in-order path waits for as a whole, and what its bursts
    /// take in calls of one slot.
    fn run_end(&self, keys: &[String], from: usize) -> usize {
        if !self.engine.clustered {
            return keys.len();
        }
        let slot = self.slot(&keys[from]);
        keys[from..]
            .iter()
            .position(|k| self.slot(k) != slot)
            .map_or(keys.len(), |p| from + p)
    }

    /// The start of the run of `keys` (see [`Self::run_end`]) that `at` is in.
    fn run_start(&self, keys: &[String], at: usize) -> usize {
        if !self.engine.clustered {
            return 0;
        }
        if at >= keys.len() {
            return at;
        }
        let slot = self.slot(&keys[at]);
        keys[..at]
            .iter()
            .rposition(|k| self.slot(k) != slot)
            .map_or(0, |p| p + 1)
    }

    /// Waits for `run` (keys of one node) as a whole, holding nothing of it while it waits: a
    /// queued locker's wait at once for up to `QUEUED_SET_MAX` keys, else a polling wait at
    /// once (holding nothing between attempts). So a waiter of the in-order path holds only
    /// keys of earlier slots while it waits: none that a set of this slot waiting at once
    /// could need (docs/design.md, "In order").
    async fn wait_run(&self, run: &[String], opts: &LockOptions) -> Result<Vec<LockGuard>> {
        let start = Instant::now();
        let pid = self.strategy.process_id();
        let taken = match self.strategy.hub() {
            Some(hub) if run.len() <= QUEUED_SET_MAX => {
                let reqs = set::queued_requests(self.holding(), run, opts, pid)?;
                notify::wait(&self.engine, hub, &set::SetRequest::new(reqs)).await
            }
            _ => {
                let mut reqs = set::requests(self.holding(), run, opts, pid)?;
                set::poll(&self.engine, &mut reqs, pid).await
            }
        };
        let waited = Some(start.elapsed());
        for key in run {
            self.engine.meter.record(key, &taken, waited);
        }
        taken
    }

    /// The hash slot of `key`'s lock (0 for a key the names refuse: `set_order` checked them).
    fn slot(&self, key: &str) -> u16 {
        self.engine
            .names(key)
            .map_or(0, |n| fred::util::redis_keyslot(n.lock.as_bytes()))
    }
}

/// Releases `guards` all at once (after a section: judged as `release_after_section` judges
/// one), the keys a token took free in one call per slot (`release_many`); each outcome in
/// `guards`' order. A dropped call leaves each guard not yet released to its drop (a
/// background release).
async fn release_all(guards: Vec<LockGuard>, after_section: bool) -> Vec<Result<()>> {
    if !after_section {
        return release_many(guards).await;
    }
    let ends: Vec<_> = guards.iter().map(LockGuard::section_end).collect();
    let released = release_many(guards).await;
    ends.into_iter()
        .zip(released)
        .map(|(end, released)| end.judge(released))
        .collect()
}

/// Runs `calls` as tasks, so they all go out together; their outcomes in `calls`' order
/// (`None` for a task cancelled by the runtime shutting down). A panic in one resumes here
/// (a bug: what the task held was dropped with it). A dropped call aborts the tasks.
async fn all_at_once<T, F>(calls: impl Iterator<Item = F>) -> Vec<Option<T>>
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

fn first_error(outcomes: Vec<Result<()>>) -> Result<()> {
    outcomes.into_iter().find(Result::is_err).unwrap_or(Ok(()))
}

fn earliest(instants: impl Iterator<Item = Instant>) -> Instant {
    instants.min().unwrap_or_else(Instant::now)
}
