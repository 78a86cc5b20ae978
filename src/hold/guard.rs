//! A held lock.

use super::lease::{Hold, Lease, Refresher};
use crate::error::{Error, LossReason, Result};
use crate::keys::Names;
use crate::options::check_ttl;
use crate::redis::{Engine, Released};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The running background task of one guard (a keep-alive, or the confirmation of a grant).
struct Task {
    stop: CancellationToken,
    lost: CancellationToken,
    keep_alive: bool,
}

/// A held lock. Release it with [`release`](LockGuard::release); dropping it releases the lock
/// in a background task instead (never blocking the thread), and outside a tokio runtime lets it
/// expire by its TTL.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    engine: Arc<Engine>,
    names: Names,
    token: String,
    fence: u64,
    refresh_ratio: f64,
    lease: Arc<Lease>,
    task: Option<Task>,
    released: bool,
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
    /// A guard for a lock taken with `hold`. A grant not yet confirmed is confirmed by a
    /// background task at half its claim window (unless the guard is released first).
    pub(crate) fn new(
        engine: Arc<Engine>,
        names: Names,
        token: String,
        ttl: Duration,
        refresh_ratio: f64,
        hold: Hold,
    ) -> Self {
        let mut guard = LockGuard {
            lease: Arc::new(Lease::new(ttl, &hold)),
            engine,
            names,
            token,
            fence: hold.fence,
            refresh_ratio,
            task: None,
            released: false,
        };
        if !hold.confirmed {
            guard.start_task(false);
        }
        guard
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
    /// last command that set its expiry in Redis was sent (for a lock handed over by a grant:
    /// the waiter's last queue check, which Redis ran before the grant), plus that expiry,
    /// minus a drift margin of 1% of it plus 2 ms.
    pub fn valid_until(&self) -> Instant {
        self.lease.lock().valid_until
    }

    /// Why the lock was judged lost, if it was (only known while a keep-alive runs, or after
    /// `extend` found it gone).
    pub fn loss(&self) -> Option<LossReason> {
        self.lease.lock().lost
    }

    /// Sets the lock's remaining TTL to `ttl`, if this guard's token still holds it.
    ///
    /// Errors: [`Error::NotHeld`] when the token no longer holds the key (it is then marked
    /// lost), [`Error::InvalidOptions`] for a bad TTL, or a Redis error.
    ///
    /// # Cancel safety
    /// Cancel safe: the extend script is idempotent; a dropped call leaves the TTL either
    /// extended or as it was.
    #[tracing::instrument(name = "extend", level = "debug", skip_all, fields(key = %self.names.key))]
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl_ms = check_ttl(&self.names.key, ttl)?;
        let sent_at = Instant::now();
        if self
            .engine
            .extend(
                &self.names,
                &self.token,
                ttl_ms,
                self.engine.command_timeout,
            )
            .await?
        {
            self.lease.renewed(sent_at, Duration::from_millis(ttl_ms));
            Ok(())
        } else {
            if self.loss().is_none() {
                self.engine
                    .meter
                    .locks_lost
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.lease.mark_lost(LossReason::TokenGone);
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
    /// taken), or a Redis error (the lock then expires by its TTL).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, the guard's drop sends the release in the
    /// background.
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(key = %self.names.key))]
    pub async fn release(mut self) -> Result<()> {
        self.stop_task();
        let released = self
            .engine
            .release_on(
                self.engine.backend.next_client(),
                &self.names,
                &self.token,
                self.engine.command_timeout,
            )
            .await;
        self.released = true;
        match released {
            Ok(Released::Deleted | Released::HandedOver) => Ok(()),
            Ok(Released::NotHeld) => Err(Error::NotHeld {
                key: self.names.key.clone(),
            }),
            Err(e) => Err(e),
        }
    }

    /// Starts refreshing the lock in the background every `refresh_ratio × TTL` (the ratio of
    /// the options it was acquired with) and returns a token that is cancelled the moment the
    /// lock is judged lost:
    /// - a refresh finds the token gone ([`LossReason::TokenGone`]);
    /// - no refresh succeeded before [`valid_until`](Self::valid_until)
    ///   ([`LossReason::Unreachable`]): cancelled at that deadline, before Redis lets another
    ///   client in;
    /// - with `refresh_ratio = 0`, nothing is refreshed and the token is cancelled at the
    ///   validity deadline ([`LossReason::TtlElapsed`]).
    ///
    /// A lock handed over by a grant (see [`PubSubLocker`](crate::PubSubLocker)) is confirmed
    /// (extended to its full TTL) half-way through its claim window whether or not a keep-alive
    /// runs; a failed confirmation is a loss like a failed refresh.
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
        match &self.task {
            Some(t) if t.keep_alive => t.lost.clone(),
            _ => self.start_task(true),
        }
    }

    /// Starts the background task (replacing a confirm-only one); returns its loss token.
    fn start_task(&mut self, keep_alive: bool) -> CancellationToken {
        let lost = match self.task.take() {
            Some(old) => {
                old.stop.cancel();
                old.lost
            }
            None => CancellationToken::new(),
        };
        let stop = CancellationToken::new();
        if self.loss().is_some() {
            lost.cancel();
        } else {
            Refresher {
                engine: Arc::downgrade(&self.engine),
                names: self.names.clone(),
                token: self.token.clone(),
                lease: Arc::clone(&self.lease),
                ratio: self.refresh_ratio,
                confirm_only: !keep_alive,
                stop: stop.clone(),
                lost: lost.clone(),
            }
            .spawn(&self.engine);
        }
        self.task = Some(Task {
            stop,
            lost: lost.clone(),
            keep_alive,
        });
        lost
    }

    fn stop_task(&mut self) {
        if let Some(t) = &self.task {
            t.stop.cancel();
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.lease.lock().ttl
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_task();
        if !self.released {
            self.engine.release_in_background(
                None,
                self.names.clone(),
                std::mem::take(&mut self.token),
            );
        }
    }
}
