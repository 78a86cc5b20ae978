//! What a holder knows of its lease (`super::refresh` keeps it alive).

use crate::error::LossReason;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;

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

/// How a lock came to be held: its fence, the last instant this holder may rely on it, the
/// local instant its current lease started at the latest (by our clock), and whether it was
/// taken free (not handed over: its release may then be one compare-and-delete, see
/// `redis/scripts/taken.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    pub(crate) fence: u64,
    pub(crate) valid_until: Instant,
    pub(crate) since: Instant,
    pub(crate) taken: bool,
}

impl Hold {
    /// A lease of `px` that Redis set when it ran a command we sent at `sent_at`.
    pub(crate) fn sent(fence: u64, sent_at: Instant, px: Duration) -> Hold {
        Hold {
            fence,
            valid_until: validity_deadline(sent_at, px),
            since: sent_at,
            taken: false,
        }
    }

    /// The same, for a lock the call took free.
    pub(crate) fn taken(self) -> Hold {
        Hold {
            taken: true,
            ..self
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

/// Shared by a guard and the locker's refresher.
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
    turn: Arc<tokio::sync::Mutex<()>>,
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
            turn: Arc::default(),
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

    /// The turn, if no call holds it now (a batched refresh does not wait for it).
    pub(crate) fn try_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        Arc::clone(&self.turn).try_lock_owned().ok()
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
        s.settle();
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
    }

    /// The lock is judged lost: its validity ends now (if it had not ended), for good.
    pub(crate) fn mark_lost(&self, reason: LossReason) {
        let mut s = self.lock();
        s.lost.get_or_insert(reason);
        s.confirmed = s.confirmed.min(Instant::now());
        s.settle();
    }
}

/// The lease rules on a paused clock, without Redis.
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
}
