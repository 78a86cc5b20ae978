//! Leader election on the lock's queue: candidates wait in the queue (FIFO, woken, no polling),
//! the one that holds the election's lock leads, and resigning hands leadership to the next
//! candidate in one handoff. Observers follow leadership without polling: Redis tells them of
//! every change of the election's names (client tracking on one connection per locker).
//!
//! An election `name` is the lock `name` plus a record (`{<prefix><name>}:leader`:
//! `"<term> <token> <a|r> <value>"`) that the leader writes right after it takes the lock
//! (`lua/elect_announce.lua`), so the leader is the lock's holder *and* the record's author:
//! [`Election::leader`] reports a leader only when both agree (for the one round trip between
//! a new leader's acquisition and its announcement it reports none, and observers wait for
//! the announcement). The term is the acquisition's fence: it only grows.
//!
//! What a leader can rely on is what a lock holder can: its lease, until
//! [`Leadership::valid_until`], and its loss token. A leader that is paused (GC, SIGSTOP, a VM
//! migration) past its lease may still act when it resumes, before it reads the token: only
//! the term, checked by the storage it writes to, protects against that (`docs/design.md`).
//! The [lock delay](Election::with_lock_delay) narrows it: after a leader that did not resign
//! (its lease ran out), the next one waits that long more before it leads.

mod observe;

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::run::LockContext;
use crate::keys::Names;
use crate::limits::MAX_VALUE_LEN;
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::redis::Engine;
use crate::wait::strategy::Strategy;
use fred::interfaces::TrackingInterface;
pub(crate) use observe::Tracker;
use observe::{Reader, TrackerSlot};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// An election on one name: candidates wait in the lock's queue (FIFO, woken, no polling),
/// the one that holds the election's lock and has announced itself leads, and resigning hands
/// leadership to the next candidate in one handoff. The term is the acquisition's fence: it
/// only grows. A leader paused past its lease may still act when it resumes, before it reads
/// its loss token: only the term, checked by the storage it writes to, protects against that
/// (`docs/design.md`, "Elections"). Made by [`Locker::election`]; cheap to clone.
#[derive(Clone)]
pub struct Election<S> {
    locker: Locker<S>,
    names: Names,
    lock_delay: Duration,
}

impl<S> std::fmt::Debug for Election<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.names.key)
            .field("lock_delay", &self.lock_delay)
            .finish_non_exhaustive()
    }
}

/// The current leader of an election.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// What the leader campaigned with.
    pub value: String,
    /// Its term: the fence of its acquisition, greater than every earlier term.
    pub term: u64,
    /// How long it has led, by Redis' clock (the term is Redis' time in µs when it was taken;
    /// `None` when it is not a time of this clock).
    pub leading_for: Option<Duration>,
    /// What is left of its lease (`None`: no expiry).
    pub lease_left: Option<Duration>,
    /// The process id of its locker, for a queued locker (see `Locker::process_id`).
    pub process_id: Option<String>,
}

/// Leading an election: a guard, as a [`LockGuard`] is for a lock.
#[must_use = "dropping a leadership gives it up (the lock is released in the background)"]
pub struct Leadership {
    guard: LockGuard,
    value: String,
    names: Names,
    /// Stops the task that keeps the record alive (`keep_record`) when the leadership ends.
    _record: tokio_util::sync::DropGuard,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.names.key)
            .field("term", &self.term())
            .field("lost", &self.guard.loss())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// The term: strictly greater than every earlier leader's of this election. Pass it to the
    /// storage a leader writes to, and have it refuse a lower one.
    pub fn term(&self) -> u64 {
        self.guard.fence()
    }

    /// The value this leader campaigned with.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The last instant this leader may assume it leads (as [`LockGuard::valid_until`]).
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// Why leadership was judged lost, if it was (see [`LockGuard::loss`]).
    pub fn loss(&self) -> Option<crate::LossReason> {
        self.guard.loss()
    }

    /// Keeps the lease alive in the background and returns the token cancelled the moment
    /// leadership is judged lost, at the validity deadline at the latest (as
    /// [`LockGuard::keep_alive`]).
    pub fn keep_alive(&mut self) -> CancellationToken {
        self.guard.keep_alive()
    }

    /// The token of the lock under this leadership (whoever has it can release the lock).
    pub fn token(&self) -> &str {
        self.guard.token()
    }

    /// The lock guard under this leadership, for what a guard gives that a leadership does not
    /// repeat (e.g. [`LockGuard::extend`]).
    pub fn guard_mut(&mut self) -> &mut LockGuard {
        &mut self.guard
    }

    /// Ends a term as [`LockGuard::release_after_section`] ends a critical section (`Ok(())`:
    /// leadership was held throughout, by what this leader could know; [`Error::Expired`]:
    /// it was, or may have been, lost), after marking the record resigned, as
    /// [`resign`](Self::resign) does.
    ///
    /// # Cancel safety
    /// As [`resign`](Self::resign).
    pub async fn resign_after_term(self) -> Result<()> {
        self.resign_then(LockGuard::release_after_section).await
    }

    /// Gives leadership up: marks the record resigned (the next leader waits no lock delay)
    /// and releases the lock, which hands it to the next candidate in the queue at once.
    ///
    /// Errors: [`Error::NotHeld`] when leadership had been lost already, or a Redis error (the
    /// lock then expires by its TTL, as a lock's release does).
    ///
    /// # Cancel safety
    /// Cancel safe: if dropped, the guard's drop releases in the background (without the
    /// resigned mark, so the next leader may wait the lock delay).
    pub async fn resign(self) -> Result<()> {
        self.resign_then(LockGuard::release).await
    }

    /// Marks the record resigned and gives the guard to `release`, both sent at once on the
    /// token's one connection, the mark first: Redis runs them in that order, and the release
    /// does not wait a round trip for the mark. A failed mark is only logged.
    async fn resign_then<F, Fut>(self, release: F) -> Result<()>
    where
        F: FnOnce(LockGuard) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let engine = self.guard.engine();
        let (names, token) = (self.names, self.guard.token().to_owned());
        let (marked, released) =
            tokio::join!(engine.resign_record(&names, &token), release(self.guard));
        if let Err(e) = marked {
            tracing::warn!(name = %names.key, error = %e, "could not mark the leadership resigned");
        }
        released
    }
}

/// Parses a record `"<term> <token> <a|r> <value>"`: term, token, resigned, value.
fn record(text: &str) -> Option<(u64, &str, bool, &str)> {
    let mut parts = text.splitn(4, ' ');
    let term = parts.next()?.parse().ok()?;
    let token = parts.next()?;
    let resigned = parts.next()? == "r";
    Some((term, token, resigned, parts.next().unwrap_or("")))
}

/// Who leads, from the lock's value, PTTL, the record and Redis' time: `None` when nobody
/// holds the lock, or its holder has not announced itself yet.
fn leader_of(lock: &str, pttl: i64, rec: &str, now_us: u64) -> Option<Leader> {
    let holder = lock.get(1..).filter(|h| !h.is_empty())?;
    let (term, token, _, value) = record(rec)?;
    (token == holder).then(|| Leader {
        value: value.to_owned(),
        term,
        leading_for: now_us.checked_sub(term).map(Duration::from_micros),
        lease_left: (pttl >= 0).then(|| Duration::from_millis(pttl as u64)),
        process_id: crate::status::token_pid(holder).map(str::to_owned),
    })
}

impl<S: Strategy> Locker<S> {
    /// The election `name` (any key name). Candidates of a queued locker wait in the queue,
    /// woken when it is their turn; a polling locker's retry.
    ///
    /// Errors: [`Error::InvalidKey`] for a bad name.
    pub fn election(&self, name: &str) -> Result<Election<S>> {
        Ok(Election {
            names: self.engine.names(name)?,
            locker: self.clone(),
            lock_delay: Duration::ZERO,
        })
    }
}

impl<S: Strategy> Election<S> {
    /// After a leader whose lease ran out (it did not resign: it crashed, or is paused), the
    /// next leader waits `delay` more, holding the lock and refreshing it, before
    /// [`campaign`](Self::campaign) returns: a paused leader that resumes within it finds its
    /// loss token cancelled before anyone else leads (as Consul's lock-delay). Not after a
    /// clean [`resign`](Leadership::resign). Defaults to none.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// Waits until this candidate leads (up to `opts.wait`), announces `value` as the leader's,
    /// and returns the leadership (its lease refreshed in the background from then on).
    ///
    /// Errors: as [`Locker::acquire_wait`] (e.g. [`Error::WaitTimeout`]); [`Error::Expired`]
    /// when leadership was lost during the announcement or the lock delay;
    /// [`Error::InvalidOptions`] for a value over [`MAX_VALUE_LEN`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait leaves the queue (as `acquire_wait`); dropped after the lock
    /// was taken, it is released in the background.
    pub async fn campaign(&self, value: &str, opts: &LockOptions) -> Result<Leadership> {
        if value.len() > MAX_VALUE_LEN {
            return Err(Error::invalid_option(
                &self.names.key,
                "value",
                format!("<{} bytes>", value.len()),
                "must be at most 64 KiB",
            ));
        }
        let mut guard = self.locker.acquire_wait(&self.names.key, opts).await?;
        let lost = guard.keep_alive();
        let engine = guard.engine();
        let expired = |guard: &LockGuard| Error::Expired {
            key: self.names.key.clone(),
            reason: guard.loss().unwrap_or(crate::LossReason::TokenGone),
        };
        let life = record_life(&engine, opts);
        let announced = engine
            .announce(&self.names, guard.token(), guard.fence(), value, life)
            .await;
        let previous = match announced {
            Ok(Some(previous)) => previous,
            Ok(None) => return Err(expired(&guard)),
            Err(e) => {
                let _ = guard.release().await;
                return Err(e);
            }
        };
        let ran_out = record(&previous)
            .is_some_and(|(_, token, resigned, _)| !resigned && token != guard.token());
        if ran_out && !self.lock_delay.is_zero() {
            tokio::select! {
                _ = lost.cancelled() => return Err(expired(&guard)),
                _ = tokio::time::sleep(self.lock_delay) => {}
            }
        }
        // A leader stopped (SIGSTOP, a pause) past its lease before it got here is not one.
        if lost.is_cancelled() || guard.valid_until() <= Instant::now() {
            return Err(expired(&guard));
        }
        let stop = CancellationToken::new();
        tokio::spawn(keep_record(
            Arc::downgrade(&engine),
            self.names.clone(),
            guard.token().to_owned(),
            life,
            stop.clone(),
            lost,
        ));
        Ok(Leadership {
            guard,
            value: value.to_owned(),
            names: self.names.clone(),
            _record: stop.drop_guard(),
        })
    }

    /// Campaigns with `value`, runs `f` as leader with the loss token (a [`LockContext`]: the
    /// term is its fence), then resigns: the next candidate leads at once. Returns `f`'s value,
    /// or [`Error::Expired`] if leadership was, or may have been, lost while `f` ran (as
    /// [`Locker::run`]). To lead again after, call it again.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, the lease's refresh stops and the lock is released in the
    /// background.
    pub async fn run_as_leader<F, Fut, T, E>(
        &self,
        value: &str,
        opts: &LockOptions,
        f: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let leadership = self.campaign(value, opts).await?;
        let (engine, names, token) = (
            leadership.guard.engine(),
            leadership.names.clone(),
            leadership.guard.token().to_owned(),
        );
        crate::hold::run::run_under(leadership.guard, |ctx| async move {
            let out = f(ctx).await;
            // Resigned before the release that ends the section: the successor waits no
            // lock delay.
            if let Err(e) = engine.resign_record(&names, &token).await {
                tracing::warn!(name = %names.key, error = %e, "could not mark the leadership resigned");
            }
            out
        })
        .await
    }

    /// The current leader, or `None` (nobody leads, or a new leader has not announced itself
    /// yet: one round trip after it took the lock).
    ///
    /// Errors: [`Error::Timeout`] or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        let engine = &self.locker.engine;
        let (lock, pttl, rec, now) = engine.read_leader(&self.names).await?;
        Ok(leader_of(&lock, pttl, &rec, now))
    }

    /// Follows the leadership: a receiver whose value is the current leader (or `None`),
    /// changed at every new term and when nobody leads any more. Terms seen never go back: a
    /// reading older than one already shown is skipped. Redis tells the locker's one tracking
    /// connection of every write to the election's names and of the lock's expiry, so a change
    /// shows within a round trip of it (and of the expiry Redis notices, within its active
    /// expiry cycle, ~100 ms); as a backstop the observer also reads again when the leader's
    /// lease ends and every 30 s. All the receivers of one election in one locker share one
    /// reader (one read per change, however many observe); it stops when every receiver is
    /// dropped.
    ///
    /// Errors: [`Error::Connect`] when the tracking connection cannot be opened; Redis errors
    /// of the first reading.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    pub async fn observe(&self) -> Result<watch::Receiver<Option<Leader>>> {
        let engine = Arc::clone(&self.locker.engine);
        let slot = self.locker.extensions.get::<TrackerSlot>();
        let tracker = Tracker::of(&engine, &slot).await?;
        let prefix = self.names.lock.clone();
        tracker.track(&prefix).await?;
        // One reader per election and locker, however many receivers.
        if let Some(tx) = tracker.observed().get(&prefix) {
            return Ok(tx.subscribe());
        }
        let changes = tracker.client.invalidation_rx();
        let retracked = tracker.epoch.subscribe();
        let first = self.leader().await?;
        let (tx, rx) = {
            let mut observed = tracker.observed();
            if let Some(tx) = observed.get(&prefix) {
                return Ok(tx.subscribe());
            }
            let (tx, rx) = watch::channel(first.clone());
            observed.insert(prefix.clone(), tx.clone());
            (tx, rx)
        };
        let reader = Reader {
            election: self.clone(),
            tracker: Arc::downgrade(&tracker),
            prefix,
            record: self.names.leader(),
            tx,
        };
        tokio::spawn(reader.run(first, changes, retracked));
        Ok(rx)
    }
}

/// How long a leader's record lives past each renewal: its lease plus the retention (a record
/// of a leader that died goes then, as a fence counter does; review 3 found it kept forever).
fn record_life(engine: &Engine, opts: &LockOptions) -> Duration {
    engine.settings.retention + opts.ttl()
}

/// Keeps a leader's record alive while it leads: renewed every quarter of its life (between
/// 100 ms and a minute apart), until the leadership ends (`stop`) or is lost. A failed renewal is
/// tried again at the next; the record outlives a lost lease by the retention anyway.
async fn keep_record(
    engine: std::sync::Weak<Engine>,
    names: Names,
    token: String,
    life: Duration,
    stop: CancellationToken,
    lost: CancellationToken,
) {
    let every = (life / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = lost.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        if let Err(e) = engine.keep_record(&names, &token, life).await {
            tracing::debug!(key = %names.key, error = %e, "the leader's record was not renewed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_is_the_holder_that_announced_itself() {
        let rec = "1000000 0123456789ab/t a the value, with spaces\nand lines";
        let l = leader_of("q0123456789ab/t", 900, rec, 3_000_000).expect("leads");
        assert_eq!(l.value, "the value, with spaces\nand lines");
        assert_eq!(l.term, 1_000_000);
        assert_eq!(l.leading_for, Some(Duration::from_secs(2)));
        assert_eq!(l.lease_left, Some(Duration::from_millis(900)));
        assert_eq!(l.process_id.as_deref(), Some("0123456789ab"));
        // Another holder (not announced yet), or nobody: no leader.
        assert_eq!(leader_of("pother", 900, rec, 3_000_000), None);
        assert_eq!(leader_of("", -2, rec, 3_000_000), None);
        assert_eq!(record("7 t r "), Some((7, "t", true, "")));
    }
}
