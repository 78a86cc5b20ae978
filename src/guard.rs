//! A held lock, and the keep-alive that refreshes it and reports its loss.

use crate::core::{validity_deadline, Core};
use crate::error::{Error, LossReason, Result};
use crate::keys::Names;
use crate::options::check_ttl;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

/// What the holder knows of its lease.
struct LeaseState {
    ttl: Duration,
    sent_at: Instant,
    valid_until: Instant,
    lost: Option<LossReason>,
}

/// Shared by the guard and its keep-alive task.
struct Lease(Mutex<LeaseState>);

impl Lease {
    fn lock(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        // A panic while holding this lock cannot leave the plain data inconsistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn renewed(&self, sent_at: Instant, ttl: Duration) {
        let mut s = self.lock();
        if s.lost.is_none() {
            s.ttl = ttl;
            s.sent_at = s.sent_at.max(sent_at);
            s.valid_until = s.valid_until.max(validity_deadline(sent_at, ttl));
        }
    }

    fn mark_lost(&self, reason: LossReason) {
        let mut s = self.lock();
        s.lost.get_or_insert(reason);
    }
}

/// The running keep-alive of one guard.
struct KeepAlive {
    stop: CancellationToken,
    lost: CancellationToken,
}

/// A held lock. Release it with [`release`](LockGuard::release); dropping it releases the lock
/// in a background task instead (never blocking the thread), and outside a tokio runtime lets it
/// expire by its TTL.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    core: Arc<Core>,
    names: Names,
    token: String,
    fence: u64,
    refresh_ratio: f64,
    lease: Arc<Lease>,
    keep_alive: Option<KeepAlive>,
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
    pub(crate) fn new(
        core: Arc<Core>,
        names: Names,
        token: String,
        fence: u64,
        ttl: Duration,
        sent_at: Instant,
        refresh_ratio: f64,
    ) -> Self {
        LockGuard {
            core,
            names,
            token,
            fence,
            refresh_ratio,
            lease: Arc::new(Lease(Mutex::new(LeaseState {
                ttl,
                sent_at,
                valid_until: validity_deadline(sent_at, ttl),
                lost: None,
            }))),
            keep_alive: None,
            released: false,
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
    /// last successful acquire or refresh was sent, plus the TTL, minus a drift margin of
    /// 1% of the TTL plus 2 ms.
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
            .core
            .extend(&self.names, &self.token, ttl_ms, self.core.command_timeout)
            .await?
        {
            self.lease.renewed(sent_at, Duration::from_millis(ttl_ms));
            Ok(())
        } else {
            self.lease.mark_lost(LossReason::TokenGone);
            if let Some(k) = &self.keep_alive {
                k.lost.cancel();
            }
            Err(Error::NotHeld {
                key: self.names.key.clone(),
            })
        }
    }

    /// Releases the lock (and PUBLISHes the release to waiters). Stops the keep-alive first, so
    /// no refresh is sent after this call starts.
    ///
    /// Errors: [`Error::NotHeld`] when the token no longer held the key (it expired or was
    /// taken), or a Redis error (the lock then expires by its TTL).
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped, the guard's drop sends the release in the
    /// background.
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(key = %self.names.key))]
    pub async fn release(mut self) -> Result<()> {
        self.stop_keep_alive();
        let released = self
            .core
            .release(&self.names, &self.token, self.core.command_timeout)
            .await;
        self.released = true;
        match released {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::NotHeld {
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
        if let Some(k) = &self.keep_alive {
            return k.lost.clone();
        }
        let k = KeepAlive {
            stop: CancellationToken::new(),
            lost: CancellationToken::new(),
        };
        let lost = k.lost.clone();
        let task = KeepAliveTask {
            core: Arc::downgrade(&self.core),
            names: self.names.clone(),
            token: self.token.clone(),
            lease: Arc::clone(&self.lease),
            ratio: self.refresh_ratio,
            stop: k.stop.clone(),
            lost: k.lost.clone(),
        };
        if self.loss().is_some() {
            lost.cancel();
        } else if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let ticket = self.core.tasks.ticket();
            handle.spawn(async move {
                let _ticket = ticket;
                task.run().await
            });
        } else {
            tracing::warn!(key = %self.names.key, "keep_alive called outside a tokio runtime; nothing refreshes the lock");
        }
        self.keep_alive = Some(k);
        lost
    }

    fn stop_keep_alive(&mut self) {
        if let Some(k) = &self.keep_alive {
            k.stop.cancel();
        }
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.lease.lock().ttl
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_keep_alive();
        if !self.released {
            self.core.release_in_background(
                None,
                self.names.clone(),
                std::mem::take(&mut self.token),
            );
        }
    }
}

struct KeepAliveTask {
    core: Weak<Core>,
    names: Names,
    token: String,
    lease: Arc<Lease>,
    ratio: f64,
    stop: CancellationToken,
    lost: CancellationToken,
}

impl KeepAliveTask {
    fn lose(&self, reason: LossReason) {
        self.lease.mark_lost(reason);
        self.lost.cancel();
        tracing::warn!(key = %self.names.key, %reason, "lock lost");
    }

    async fn run(self) {
        let refreshing = self.ratio > 0.0;
        let mut next_refresh = {
            let s = self.lease.lock();
            s.sent_at + s.ttl.mul_f64(self.ratio)
        };
        loop {
            let (valid_until, ttl) = {
                let s = self.lease.lock();
                (s.valid_until, s.ttl)
            };
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                _ = sleep_until(valid_until) => {
                    if self.lease.lock().valid_until > Instant::now() {
                        continue; // extended meanwhile by `LockGuard::extend`
                    }
                    self.lose(if refreshing { LossReason::Unreachable } else { LossReason::TtlElapsed });
                    return;
                }
                _ = sleep_until(next_refresh), if refreshing => {}
            }
            let Some(core) = self.core.upgrade() else {
                return;
            };
            let sent_at = Instant::now();
            let limit = core
                .command_timeout
                .min(valid_until.saturating_duration_since(sent_at))
                .max(Duration::from_millis(1));
            let ttl_ms = ttl.as_millis() as u64;
            let result = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                r = core.extend(&self.names, &self.token, ttl_ms, limit) => r,
            };
            drop(core);
            match result {
                Ok(true) => {
                    tracing::debug!(key = %self.names.key, "refreshed");
                    self.lease.renewed(sent_at, ttl);
                    next_refresh = sent_at + ttl.mul_f64(self.ratio);
                }
                Ok(false) => {
                    self.lose(LossReason::TokenGone);
                    return;
                }
                Err(e) => {
                    let left = valid_until.saturating_duration_since(Instant::now());
                    let retry = (left / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
                    tracing::warn!(key = %self.names.key, error = %e, ?retry, "refresh failed; retrying");
                    next_refresh = Instant::now() + retry;
                }
            }
        }
    }
}
