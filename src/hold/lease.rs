//! What a holder knows of its lease, and the task that refreshes (or confirms) it.

use crate::error::LossReason;
use crate::keys::Names;
use crate::redis::{scripts::validity_deadline, Engine};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

/// How a lock came to be held: the fence, when the command that started its current PX in
/// Redis was sent (or an earlier command that Redis ran before it), and that PX.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    pub(crate) fence: u64,
    pub(crate) sent_at: Instant,
    pub(crate) px: Duration,
    /// False for a grant not yet confirmed: Redis keeps it for the claim window only.
    pub(crate) confirmed: bool,
}

pub(crate) struct LeaseState {
    /// The TTL the lock was asked for (what every refresh sets).
    pub(crate) ttl: Duration,
    pub(crate) sent_at: Instant,
    /// The PX Redis applied from `sent_at` on.
    px: Duration,
    pub(crate) valid_until: Instant,
    pub(crate) lost: Option<LossReason>,
    pub(crate) confirmed: bool,
}

/// Shared by a guard and its background task.
pub(crate) struct Lease(Mutex<LeaseState>);

impl Lease {
    pub(crate) fn new(ttl: Duration, hold: &Hold) -> Lease {
        Lease(Mutex::new(LeaseState {
            ttl,
            sent_at: hold.sent_at,
            px: hold.px,
            valid_until: validity_deadline(hold.sent_at, hold.px),
            lost: None,
            confirmed: hold.confirmed,
        }))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LeaseState> {
        // A panic while holding this lock cannot leave the plain data inconsistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A refresh (or confirmation) sent at `sent_at` set the PX to `ttl`.
    pub(crate) fn renewed(&self, sent_at: Instant, ttl: Duration) {
        let mut s = self.lock();
        if s.lost.is_none() {
            s.ttl = ttl;
            s.px = ttl;
            s.confirmed = true;
            s.sent_at = s.sent_at.max(sent_at);
            s.valid_until = s.valid_until.max(validity_deadline(sent_at, ttl));
        }
    }

    pub(crate) fn mark_lost(&self, reason: LossReason) {
        self.lock().lost.get_or_insert(reason);
    }

    /// When the next refresh is due: an unconfirmed grant at half its claim window, otherwise
    /// `ratio` of the TTL after the last one; `None` when nothing needs sending.
    fn next_refresh(&self, ratio: f64) -> Option<Instant> {
        let s = self.lock();
        if !s.confirmed {
            Some(s.sent_at + s.px / 2)
        } else if ratio > 0.0 {
            Some(s.sent_at + s.ttl.mul_f64(ratio))
        } else {
            None
        }
    }
}

/// Refreshes a lease in the background: forever (`keep_alive`), or until a grant is confirmed.
pub(crate) struct Refresher {
    pub(crate) engine: Weak<Engine>,
    pub(crate) names: Names,
    pub(crate) token: String,
    pub(crate) lease: Arc<Lease>,
    /// 0 = refresh off (a pending grant is still confirmed).
    pub(crate) ratio: f64,
    /// Stop after the grant is confirmed (no keep-alive was asked for).
    pub(crate) confirm_only: bool,
    pub(crate) stop: CancellationToken,
    pub(crate) lost: CancellationToken,
}

impl Refresher {
    /// Starts the task if a tokio runtime is there (counted in the locker's tasks).
    pub(crate) fn spawn(self, engine: &Arc<Engine>) {
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let ticket = engine.tasks.ticket();
                handle.spawn(async move {
                    let _ticket = ticket;
                    self.run().await
                });
            }
            Err(_) => {
                tracing::warn!(key = %self.names.key, "no tokio runtime: nothing refreshes or confirms the lock")
            }
        }
    }

    fn lose(&self, reason: LossReason) {
        if let Some(engine) = self.engine.upgrade() {
            engine.meter.locks_lost.fetch_add(1, Ordering::Relaxed);
        }
        self.lease.mark_lost(reason);
        self.lost.cancel();
        tracing::warn!(key = %self.names.key, %reason, "lock lost");
    }

    async fn run(self) {
        let mut retry_at: Option<Instant> = None;
        loop {
            let (valid_until, ttl, confirmed) = {
                let s = self.lease.lock();
                (s.valid_until, s.ttl, s.confirmed)
            };
            if confirmed && self.confirm_only {
                return;
            }
            let next = retry_at.or_else(|| self.lease.next_refresh(self.ratio));
            let refreshing = next.is_some();
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                _ = sleep_until(valid_until) => {
                    if self.lease.lock().valid_until > Instant::now() {
                        continue; // extended meanwhile by `LockGuard::extend`
                    }
                    self.lose(if self.ratio > 0.0 || !confirmed { LossReason::Unreachable } else { LossReason::TtlElapsed });
                    return;
                }
                _ = sleep_until(next.unwrap_or(valid_until)), if refreshing => {}
            }
            let Some(engine) = self.engine.upgrade() else {
                return;
            };
            let sent_at = Instant::now();
            let limit = engine
                .command_timeout
                .min(valid_until.saturating_duration_since(sent_at))
                .max(Duration::from_millis(1));
            let ttl_ms = ttl.as_millis() as u64;
            let result = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                r = engine.extend(&self.names, &self.token, ttl_ms, limit) => r,
            };
            drop(engine);
            match result {
                Ok(true) => {
                    tracing::debug!(key = %self.names.key, confirmed, "refreshed");
                    self.lease.renewed(sent_at, ttl);
                    retry_at = None;
                }
                Ok(false) => {
                    self.lose(LossReason::TokenGone);
                    return;
                }
                Err(crate::error::Error::NotReplicated { .. }) => {
                    self.lose(LossReason::NotReplicated);
                    return;
                }
                Err(e) => {
                    let left = valid_until.saturating_duration_since(Instant::now());
                    let retry = (left / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
                    tracing::warn!(key = %self.names.key, error = %e, ?retry, "refresh failed; retrying");
                    retry_at = Some(Instant::now() + retry);
                }
            }
        }
    }
}
