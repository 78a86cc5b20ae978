//! A held set: one loss token, one release, a fence per key.

use crate::error::{Error, LossReason, Result};
use crate::hold::guard::{release_many, LockGuard};
use crate::hold::lease::Lease;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A set of held locks, taken together by
/// [`Locker::acquire_many`](crate::Locker::acquire_many) or [`Locker::acquire_many_wait`](crate::Locker::acquire_many_wait): one loss token for the whole
/// set, one release, a fence per key. Each key's lock is refreshed in the background from the
/// moment it was taken (the locker's refresher batches them; with [`Refresh::Off`](crate::Refresh::Off)(crate::Refresh::Off) nothing
/// is refreshed and the token fires at the first key's validity deadline). Dropping it
/// releases every key in the background.
#[must_use = "dropping the set releases its locks at once"]
pub struct LockSetGuard {
    /// In the order taken (hash slot, then key).
    pub(super) guards: Vec<LockGuard>,
    pub(super) lost: CancellationToken,
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

/// What a critical section over a set gets ([`Locker::run_many`](crate::Locker::run_many)).
#[derive(Clone)]
#[non_exhaustive]
pub struct LockSetContext {
    /// Cancelled the moment any key of the set is judged lost; stop touching the protected
    /// resources then.
    pub lost: CancellationToken,
    /// Each key with its fencing token, in the order taken (hash slot, then key).
    pub fences: Vec<(String, u64)>,
    pub(super) leases: Vec<Arc<Lease>>,
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

/// Releases `guards` all at once (after a section: judged as `release_after_section` judges
/// one), the keys a token took free in one call per slot (`release_many`); each outcome in
/// `guards`' order. A dropped call leaves each guard not yet released to its drop (a
/// background release).
pub(super) async fn release_all(guards: Vec<LockGuard>, after_section: bool) -> Vec<Result<()>> {
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

pub(super) fn first_error(outcomes: Vec<Result<()>>) -> Result<()> {
    outcomes.into_iter().find(Result::is_err).unwrap_or(Ok(()))
}

pub(super) fn earliest(instants: impl Iterator<Item = Instant>) -> Instant {
    instants.min().unwrap_or_else(Instant::now)
}
