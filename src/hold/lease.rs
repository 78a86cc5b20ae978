//! What a holder knows of its lease, and the task that refreshes it.

use crate::error::LossReason;
use crate::keys::Names;
use crate::options::Refresh;
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
    /// The TTL every refresh sets: the one asked for, or the latest `extend`'s.
    pub(crate) ttl: Duration,
    /// When the lease of the latest call that Redis confirmed started, at the latest (that
    /// call's send time).
    pub(crate) since: Instant,
    /// The validity deadline of that lease.
    confirmed: Instant,
    /// The earliest validity deadline among the calls sent since, whose outcome is not known
    /// (in flight, timed out, dropped): each may still run, and set a shorter lease.
    pending: Option<Instant>,
    /// `confirmed`, cut to `pending`: never later than what Redis was last told for the token.
    pub(crate) valid_until: Instant,
    pub(crate) lost: Option<LossReason>,
}

impl LeaseState {
    fn settle(&mut self) {
        self.valid_until = match self.pending {
            Some(p) => self.confirmed.min(p),
            None => self.confirmed,
        };
    }
}

/// Shared by a guard and its background task.
///
/// **The rule.** A guard's validity never exceeds what Redis was last told for its token. The
/// calls that set the lease (the keep-alive's refreshes and `LockGuard::extend`, with any TTL,
/// shorter or longer) go out one at a time (`turn`), on the token's one client, so Redis runs
/// them in the order they were sent; a call whose outcome is unknown still runs before any
/// later one, or never. So the lease is the latest confirmed call's (its send time plus its
/// TTL, less the margin), cut by every call sent after it that may still run; a confirmation
/// settles every call sent before it.
pub(crate) struct Lease {
    state: Mutex<LeaseState>,
    /// One lease-setting call at a time.
    turn: tokio::sync::Mutex<()>,
    /// Bumped whenever the validity changes (the refresher sleeps until it, or a change).
    changed: tokio::sync::watch::Sender<()>,
}

impl Lease {
    pub(crate) fn new(ttl: Duration, hold: &Hold) -> Lease {
        Lease {
            state: Mutex::new(LeaseState {
                ttl,
                since: hold.since,
                confirmed: hold.valid_until,
                pending: None,
                valid_until: hold.valid_until,
                lost: None,
            }),
            turn: tokio::sync::Mutex::new(()),
            changed: tokio::sync::watch::Sender::new(()),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, LeaseState> {
        // A panic while holding this lock cannot leave the plain data inconsistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for this lease's turn to send a call that sets it (held until the call's outcome
    /// is known, or the call is abandoned).
    pub(crate) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    /// A call that sets the lease to `ttl` is sent now (with the turn held): until Redis
    /// confirms it, the validity is cut to what it would give. With `new_ttl` (a user's
    /// `extend`), later refreshes set `ttl` too. Returns the send time.
    pub(crate) fn sending(&self, ttl: Duration, new_ttl: bool) -> Instant {
        let sent_at = Instant::now();
        let mut s = self.lock();
        if new_ttl {
            s.ttl = ttl;
        }
        let d = validity_deadline(sent_at, ttl);
        s.pending = Some(s.pending.map_or(d, |p| p.min(d)));
        let before = s.valid_until;
        s.settle();
        let moved = s.valid_until != before;
        drop(s);
        if moved {
            self.changed.send_replace(());
        }
        sent_at
    }

    /// Redis confirmed the call sent at `sent_at` (the latest sent: the turn was held), which
    /// set the PX to `ttl`: the lease is that call's, shorter or longer than before.
    pub(crate) fn renewed(&self, sent_at: Instant, ttl: Duration) {
        let mut s = self.lock();
        if s.lost.is_some() {
            return;
        }
        s.since = sent_at;
        s.confirmed = validity_deadline(sent_at, ttl);
        s.pending = None;
        s.settle();
        drop(s);
        self.changed.send_replace(());
    }

    /// The lock is judged lost: its validity ends now (if it had not ended), for good.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        let mut s = self.lock();
        s.lost.get_or_insert(reason);
        s.confirmed = s.confirmed.min(Instant::now());
        s.settle();
        drop(s);
        self.changed.send_replace(());
    }

    /// A receiver that sees every later change of the validity.
    fn watch(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// When the next refresh is due: its ratio of the TTL after the last one; `None` when
    /// nothing needs sending.
    fn next_refresh(&self, refresh: Refresh) -> Option<Instant> {
        let s = self.lock();
        refresh.ratio().map(|ratio| s.since + s.ttl.mul_f64(ratio))
    }
}

/// Refreshes a lease in the background, and judges it lost when it is.
pub(crate) struct Refresher {
    pub(crate) engine: Weak<Engine>,
    pub(crate) names: Names,
    pub(crate) token: String,
    pub(crate) lease: Arc<Lease>,
    /// The locker's process id (a queued locker's), for the scripts' records.
    pub(crate) pid: String,
    pub(crate) refresh: Refresh,
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
            crate::metrics::lost(engine.meter.subject(&self.names.key), reason);
        }
        self.lease.mark_lost(reason);
        self.lost.cancel();
        tracing::warn!(key = %self.names.key, %reason, "lock lost");
    }

    async fn run(self) {
        let mut retry_at: Option<Instant> = None;
        let mut changes = self.lease.watch();
        loop {
            changes.borrow_and_update();
            let valid_until = self.lease.lock().valid_until;
            let next = retry_at.or_else(|| self.lease.next_refresh(self.refresh));
            let refreshing = next.is_some();
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                // The validity moved (a user's `extend`, shorter or longer): judge it again.
                _ = changes.changed() => continue,
                _ = sleep_until(valid_until) => {
                    if self.lease.lock().valid_until > Instant::now() {
                        continue; // extended meanwhile by `LockGuard::extend`
                    }
                    self.lose(if self.refresh == Refresh::Off { LossReason::TtlElapsed } else { LossReason::Unreachable });
                    return;
                }
                _ = sleep_until(next.unwrap_or(valid_until)), if refreshing => {}
            }
            let Some(engine) = self.engine.upgrade() else {
                return;
            };
            // One lease-setting call at a time (see `Lease`): a user's `extend` may be in
            // flight. The TTL is read once the turn is ours: the latest `extend`'s.
            let turn = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return,
                t = self.lease.turn() => t,
            };
            let ttl = self.lease.lock().ttl;
            let sent_at = self.lease.sending(ttl, false);
            let valid_until = self.lease.lock().valid_until;
            let limit = engine
                .command_timeout
                .min(valid_until.saturating_duration_since(sent_at))
                .max(Duration::from_millis(1));
            let call = Call {
                ttl_ms: ttl.as_millis() as u64,
                pid: &self.pid,
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
                        crate::metrics::refresh_failed(engine.meter.subject(&self.names.key));
                    }
                    let left = self
                        .lease
                        .lock()
                        .valid_until
                        .saturating_duration_since(Instant::now());
                    let retry = (left / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
                    tracing::warn!(key = %self.names.key, error = %e, ?retry, "refresh failed; retrying");
                    retry_at = Some(Instant::now() + retry);
                }
            }
            drop(turn);
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
    async fn validity_follows_the_latest_confirmed_call() {
        let t0 = Instant::now();
        let ttl = MS * 1000;
        let hold = Hold::sent(7, t0, ttl);
        assert_eq!(hold.valid_until, t0 + MS * 988);
        // A lease shorter than its margin is no lease at all.
        assert_eq!(validity_deadline(t0, MS), t0);
        let lease = Lease::new(ttl, &hold);
        tokio::time::advance(MS * 500).await;
        let sent = lease.sending(ttl, false);
        lease.renewed(sent, ttl);
        assert_eq!(lease.lock().valid_until, t0 + MS * 1488);
        assert_eq!(lease.lock().since, t0 + MS * 500);
        // A shorter TTL set by `extend` shortens it (Redis now holds the lock that long), from
        // the moment it is sent, and it is the new TTL of later refreshes.
        tokio::time::advance(MS * 10).await;
        let sent = lease.sending(MS * 100, true);
        assert_eq!(
            lease.lock().valid_until,
            t0 + MS * 607,
            "cut at the send: 510 + 100 - 3"
        );
        lease.renewed(sent, MS * 100);
        assert_eq!(lease.lock().valid_until, t0 + MS * 607);
        assert_eq!(lease.lock().ttl, MS * 100);
        // A longer one lengthens it, once confirmed (not before: it may not run).
        let sent = lease.sending(MS * 5000, true);
        assert_eq!(lease.lock().valid_until, t0 + MS * 607);
        lease.renewed(sent, MS * 5000);
        assert_eq!(lease.lock().valid_until, t0 + MS * 5458);
        // The next refresh is due `ratio` of the TTL after the last one; none with refresh off.
        assert_eq!(lease.next_refresh(Refresh::Off), None);
        assert_eq!(
            lease.next_refresh(Refresh::Every(0.5)),
            Some(t0 + MS * 3010)
        );
        // Once lost, its validity has ended and is never renewed again; the first reason
        // stays.
        lease.mark_lost(LossReason::TokenGone);
        assert_eq!(lease.lock().valid_until, t0 + MS * 510);
        lease.mark_lost(LossReason::Unreachable);
        let sent = lease.sending(ttl, false);
        lease.renewed(sent, ttl);
        assert_eq!(lease.lock().valid_until, t0 + MS * 510);
        assert_eq!(lease.lock().lost, Some(LossReason::TokenGone));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_of_unknown_outcome_cuts_the_validity_until_a_later_one_is_confirmed() {
        let t0 = Instant::now();
        let lease = Lease::new(MS * 10_000, &Hold::sent(1, t0, MS * 10_000));
        assert_eq!(lease.lock().valid_until, t0 + MS * 9898);
        // extend(300 ms) times out: it may still run, so the guard counts it as run.
        tokio::time::advance(MS * 100).await;
        let _lost = lease.sending(MS * 300, true);
        assert_eq!(lease.lock().valid_until, t0 + MS * 395);
        // A refresh (now of 300 ms) that also fails changes nothing for the better.
        tokio::time::advance(MS * 100).await;
        let _failed = lease.sending(MS * 300, false);
        assert_eq!(lease.lock().valid_until, t0 + MS * 395);
        // A later extend(10 s) confirmed: every earlier call ran before it, or never will.
        tokio::time::advance(MS * 100).await;
        let sent = lease.sending(MS * 10_000, true);
        assert_eq!(lease.lock().valid_until, t0 + MS * 395);
        lease.renewed(sent, MS * 10_000);
        assert_eq!(lease.lock().valid_until, t0 + MS * 10_198);
    }

    #[tokio::test(start_paused = true)]
    async fn lease_setting_calls_take_turns() {
        let lease = Arc::new(Lease::new(
            MS * 1000,
            &Hold::sent(1, Instant::now(), MS * 1000),
        ));
        let first = lease.turn().await;
        let l2 = Arc::clone(&lease);
        let second = tokio::spawn(async move {
            let _t = l2.turn().await;
            Instant::now()
        });
        tokio::time::advance(MS * 50).await;
        let released_at = Instant::now();
        drop(first);
        assert_eq!(second.await.expect("joins"), released_at);
    }

    fn refresher(refresh: Refresh, hold: &Hold) -> (Refresher, Arc<Lease>, CancellationToken) {
        let lease = Arc::new(Lease::new(MS * 1000, hold));
        let lost = CancellationToken::new();
        let r = Refresher {
            engine: Weak::new(),
            names: Names::new("waitlock:", "k").expect("valid key"),
            token: "t".into(),
            lease: Arc::clone(&lease),
            pid: String::new(),
            refresh,
            stop: CancellationToken::new(),
            lost: lost.clone(),
        };
        (r, lease, lost)
    }

    #[tokio::test(start_paused = true)]
    async fn with_refresh_off_the_token_fires_at_the_validity_deadline_exactly() {
        let hold = Hold::sent(1, Instant::now(), MS * 1000);
        let (r, lease, lost) = refresher(Refresh::Off, &hold);
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
        let (r, lease, lost) = refresher(Refresh::Off, &hold);
        let task = tokio::spawn(r.run());
        tokio::time::advance(MS * 900).await;
        let sent = lease.sending(MS * 1000, true);
        lease.renewed(sent, MS * 1000);
        lost.cancelled().await;
        assert_eq!(Instant::now(), t0 + MS * 1888);
        task.await.expect("the refresher ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_extend_meanwhile_brings_the_loss_forward() {
        let t0 = Instant::now();
        let hold = Hold::sent(1, t0, MS * 1000);
        let (r, lease, lost) = refresher(Refresh::Off, &hold);
        let task = tokio::spawn(r.run());
        tokio::time::advance(MS * 100).await;
        let sent = lease.sending(MS * 200, true);
        lease.renewed(sent, MS * 200);
        lost.cancelled().await;
        assert_eq!(
            Instant::now(),
            t0 + MS * 296,
            "100 + 200 - 4: not at the old 988"
        );
        assert_eq!(lease.lock().lost, Some(LossReason::TtlElapsed));
        task.await.expect("the refresher ends");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refresher_whose_locker_is_gone_stops_without_judging_the_lock() {
        let hold = Hold::sent(1, Instant::now(), MS * 1000);
        let (r, lease, lost) = refresher(Refresh::Every(0.5), &hold);
        // Due at 500 ms; the locker (the Weak) is gone, so it ends there, and says nothing.
        tokio::spawn(r.run()).await.expect("the refresher ends");
        assert!(!lost.is_cancelled());
        assert_eq!(lease.lock().lost, None);
        assert!(Instant::now() < hold.valid_until);
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_ends_the_refresher_at_once() {
        let hold = Hold::sent(1, Instant::now(), MS * 1000);
        let (r, _lease, lost) = refresher(Refresh::Off, &hold);
        let stop = r.stop.clone();
        let t = Instant::now();
        let task = tokio::spawn(r.run());
        stop.cancel();
        task.await.expect("the refresher ends");
        assert_eq!(Instant::now(), t);
        assert!(!lost.is_cancelled());
    }
}
