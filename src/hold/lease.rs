//! What a holder knows of its lease, and the task that refreshes it.

use crate::error::LossReason;
use crate::keys::Names;
use crate::redis::scripts::Call;
use crate::redis::{Engine, Extended};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

/// The drift margin of a lease of `px`: 1% of it (clocks that run at slightly different rates,
/// as Redlock's clock-drift factor) plus 2 ms (a timer that fires late on a busy host).
pub(crate) fn margin(px: Duration) -> Duration {
    px / 100 + Duration::from_millis(2)
}

/// The last instant a holder may assume no one else holds the lock, for a lease of `px` that
/// Redis started no earlier than `from` (by our clock): `from + px − margin(px)`.
pub(crate) fn validity_deadline(from: Instant, px: Duration) -> Instant {
    from + px.saturating_sub(margin(px))
}

/// How a lock came to be held: its fence, the last instant this holder may rely on it, and
/// the local instant its current lease started at the latest (by our clock).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    pub(crate) fence: u64,
    pub(crate) valid_until: Instant,
    pub(crate) since: Instant,
}

impl Hold {
    /// A lease of `px` that Redis set when it ran a command we sent at `sent_at`.
    pub(crate) fn sent(fence: u64, sent_at: Instant, px: Duration) -> Hold {
        Hold {
            fence,
            valid_until: validity_deadline(sent_at, px),
            since: sent_at,
        }
    }
}

pub(crate) struct LeaseState {
    /// The TTL the lock was asked for (what every refresh sets).
    pub(crate) ttl: Duration,
    /// When the current lease started, at the latest (the send time of its command).
    pub(crate) since: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) lost: Option<LossReason>,
}

/// Shared by a guard and its background task.
pub(crate) struct Lease(Mutex<LeaseState>);

impl Lease {
    pub(crate) fn new(ttl: Duration, hold: &Hold) -> Lease {
        Lease(Mutex::new(LeaseState {
            ttl,
            since: hold.since,
            valid_until: hold.valid_until,
            lost: None,
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
            s.since = s.since.max(sent_at);
            s.valid_until = s.valid_until.max(validity_deadline(sent_at, ttl));
        }
    }

    pub(crate) fn mark_lost(&self, reason: LossReason) {
        self.lock().lost.get_or_insert(reason);
    }

    /// When the next refresh is due: `ratio` of the TTL after the last one; `None` when
    /// nothing needs sending.
    fn next_refresh(&self, ratio: f64) -> Option<Instant> {
        let s = self.lock();
        (ratio > 0.0).then(|| s.since + s.ttl.mul_f64(ratio))
    }
}

/// Refreshes a lease in the background, and judges it lost when it is.
pub(crate) struct Refresher {
    pub(crate) engine: Weak<Engine>,
    pub(crate) names: Names,
    pub(crate) token: String,
    pub(crate) lease: Arc<Lease>,
    /// The locker's process id (a pub/sub locker's), for the scripts' records.
    pub(crate) hub: String,
    /// 0 = refresh off.
    pub(crate) ratio: f64,
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
                tracing::warn!(key = %self.names.key, "no tokio runtime: nothing refreshes the lock")
            }
        }
    }

    fn lose(&self, reason: LossReason) {
        if let Some(engine) = self.engine.upgrade() {
            engine.meter.locks_lost.fetch_add(1, Ordering::Relaxed);
            crate::metrics::lost(&engine.meter, &self.names.key, reason);
        }
        self.lease.mark_lost(reason);
        self.lost.cancel();
        tracing::warn!(key = %self.names.key, %reason, "lock lost");
    }

    async fn run(self) {
        let mut retry_at: Option<Instant> = None;
        loop {
            let (valid_until, ttl) = {
                let s = self.lease.lock();
                (s.valid_until, s.ttl)
            };
            let next = retry_at.or_else(|| self.lease.next_refresh(self.ratio));
            let refreshing = next.is_some();
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                _ = sleep_until(valid_until) => {
                    if self.lease.lock().valid_until > Instant::now() {
                        continue; // extended meanwhile by `LockGuard::extend`
                    }
                    self.lose(if self.ratio > 0.0 { LossReason::Unreachable } else { LossReason::TtlElapsed });
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
            let call = Call {
                ttl_ms: ttl.as_millis() as u64,
                hub: &self.hub,
                ..Call::new(&self.names, &self.token)
            };
            let client = engine.backend.client_for(&self.token);
            let span = tracing::debug_span!(
                "refresh",
                key = %self.names.key,
                outcome = tracing::field::Empty
            );
            let result = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                r = tracing::Instrument::instrument(engine.extend_on(client, &call, limit), span.clone()) => r,
            };
            span.record(
                "outcome",
                match &result {
                    Ok(Extended::NotHeld) => "not held",
                    Ok(_) => "refreshed",
                    Err(_) => "failed",
                },
            );
            drop(engine);
            match result {
                Ok(Extended::Renewed { .. } | Extended::Confirmed { .. }) => {
                    tracing::debug!(key = %self.names.key, "refreshed");
                    self.lease.renewed(sent_at, ttl);
                    retry_at = None;
                }
                Ok(Extended::NotHeld) => {
                    self.lose(LossReason::TokenGone);
                    return;
                }
                Err(crate::error::Error::NotReplicated { .. }) => {
                    self.lose(LossReason::NotReplicated);
                    return;
                }
                Err(e) => {
                    if let Some(engine) = self.engine.upgrade() {
                        crate::metrics::refresh_failed(&engine.meter, &self.names.key);
                    }
                    let left = valid_until.saturating_duration_since(Instant::now());
                    let retry = (left / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
                    tracing::warn!(key = %self.names.key, error = %e, ?retry, "refresh failed; retrying");
                    retry_at = Some(Instant::now() + retry);
                }
            }
        }
    }
}

/// The lease rules and the refresher's deadline on a paused clock, without Redis.
#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_margin_is_one_percent_plus_two_ms() {
        assert_eq!(margin(MS * 1000), MS * 12);
        assert_eq!(margin(MS * 30_000), MS * 302);
        assert_eq!(margin(MS), Duration::from_micros(2010));
    }

    #[tokio::test(start_paused = true)]
    async fn validity_counts_from_the_send_and_never_goes_back() {
        let t0 = Instant::now();
        let ttl = MS * 1000;
        let hold = Hold::sent(7, t0, ttl);
        assert_eq!(hold.valid_until, t0 + MS * 988);
        // A lease shorter than its margin is no lease at all.
        assert_eq!(validity_deadline(t0, MS), t0);
        let lease = Lease::new(ttl, &hold);
        tokio::time::advance(MS * 500).await;
        lease.renewed(Instant::now(), ttl);
        assert_eq!(lease.lock().valid_until, t0 + MS * 1488);
        assert_eq!(lease.lock().since, t0 + MS * 500);
        // A reply that arrives late for an older refresh moves nothing back.
        lease.renewed(t0 + MS * 100, ttl);
        assert_eq!(lease.lock().valid_until, t0 + MS * 1488);
        assert_eq!(lease.lock().since, t0 + MS * 500);
        // Nor does a shorter TTL set by `extend`.
        lease.renewed(Instant::now(), MS * 100);
        assert_eq!(lease.lock().valid_until, t0 + MS * 1488);
        // The next refresh is due `ratio` of the TTL after the last one; none with refresh off.
        assert_eq!(lease.next_refresh(0.0), None);
        assert_eq!(lease.next_refresh(0.5), Some(t0 + MS * 550));
        // Once lost, a lease is never renewed again, and the first reason stays.
        lease.mark_lost(LossReason::TokenGone);
        lease.mark_lost(LossReason::Unreachable);
        lease.renewed(Instant::now() + MS * 1000, ttl);
        assert_eq!(lease.lock().valid_until, t0 + MS * 1488);
        assert_eq!(lease.lock().lost, Some(LossReason::TokenGone));
    }

    fn refresher(ratio: f64, hold: &Hold) -> (Refresher, Arc<Lease>, CancellationToken) {
        let lease = Arc::new(Lease::new(MS * 1000, hold));
        let lost = CancellationToken::new();
        let r = Refresher {
            engine: Weak::new(),
            names: Names::new("waitlock:", "k").expect("valid key"),
            token: "t".into(),
            lease: Arc::clone(&lease),
            hub: String::new(),
            ratio,
            stop: CancellationToken::new(),
            lost: lost.clone(),
        };
        (r, lease, lost)
    }

    #[tokio::test(start_paused = true)]
    async fn with_refresh_off_the_token_fires_at_the_validity_deadline_exactly() {
        let hold = Hold::sent(1, Instant::now(), MS * 1000);
        let (r, lease, lost) = refresher(0.0, &hold);
        let task = tokio::spawn(r.run());
        lost.cancelled().await;
        assert_eq!(Instant::now(), hold.valid_until, "not a tick early or late");
        assert_eq!(lease.lock().lost, Some(LossReason::TtlElapsed));
        task.await.expect("the refresher ends");
    }

    #[tokio::test(start_paused = true)]
    async fn an_extend_meanwhile_moves_the_deadline() {
        let t0 = Instant::now();
        let hold = Hold::sent(1, t0, MS * 1000);
        let (r, lease, lost) = refresher(0.0, &hold);
        let task = tokio::spawn(r.run());
        tokio::time::advance(MS * 900).await;
        lease.renewed(Instant::now(), MS * 1000);
        lost.cancelled().await;
        assert_eq!(Instant::now(), t0 + MS * 1888);
        task.await.expect("the refresher ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresher_whose_locker_is_gone_stops_without_judging_the_lock() {
        let hold = Hold::sent(1, Instant::now(), MS * 1000);
        let (r, lease, lost) = refresher(0.5, &hold);
        // Due at 500 ms; the locker (the Weak) is gone, so it ends there, and says nothing.
        tokio::spawn(r.run()).await.expect("the refresher ends");
        assert!(!lost.is_cancelled());
        assert_eq!(lease.lock().lost, None);
        assert!(Instant::now() < hold.valid_until);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_ends_the_refresher_at_once() {
        let hold = Hold::sent(1, Instant::now(), MS * 1000);
        let (r, _lease, lost) = refresher(0.0, &hold);
        let stop = r.stop.clone();
        let t = Instant::now();
        let task = tokio::spawn(r.run());
        stop.cancel();
        task.await.expect("the refresher ends");
        assert_eq!(Instant::now(), t);
        assert!(!lost.is_cancelled());
    }
}
