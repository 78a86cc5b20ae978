//! Ordered acquisition: the runs of a set (its keys of one slot) taken one after another,
//! each kept alive from the moment it is taken (see the wing's text).

use super::guard::{release_all, LockSetGuard};
use crate::error::{Error, LossReason, Result};
use crate::hold::guard::LockGuard;
use crate::limits::{BURST, QUEUED_SET_MAX};
use crate::locker::Locker;
use crate::options::{LockOptions, Refresh};
use crate::wait::notify::{self};
use crate::wait::strategy::Strategy;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

impl<S: Strategy> Locker<S> {
    /// Takes `keys` in order (one attempt each, or waiting until `opts`' deadline),
    /// each kept alive from the moment its attempt returns, with the set's shared loss token
    /// once it is known to be kept.
    pub(super) async fn take_in_order(
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
                    let tried = self.burst(keys, &mut guards, opts, &lost, wait, &mut attempts);
                    if let Some(e) = tried.await? {
                        transient = e.is_transient().then_some(e);
                        must_wait = true;
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
                let expired = lost_set(keys, guards).await;
                // Taken again from the first: a key Redis lost (a restart, a failover). Not
                // when nothing refreshes the keys: the first keys' TTL would elapse again
                // while a later one is waited for, round after round.
                if wait && opts.refresh() != Refresh::Off {
                    continue 'set;
                }
                return Err(expired);
            }
            return Ok(LockSetGuard { guards, lost });
        }
    }

    /// One burst of the in-order path: the next keys (at most `BURST`) tried all at once,
    /// those taken from the first kept (see [`attempt_all`](Self::attempt_all)). Not waiting,
    /// a failure ends the set: every key released, the failure returned. Waiting, the failure
    /// is given (`Some`) and the run it failed in is waited for next: what is kept ends at a
    /// slot boundary, the keys taken of that run (by an earlier call of a run over 256 keys,
    /// or an earlier burst) given back. Kept, a set at once in that slot could need one of
    /// them while it heads the queue of a key this waiter waits for: each would wait for the
    /// other (review 3, finding 1).
    async fn burst(
        &self,
        keys: &[String],
        guards: &mut Vec<LockGuard>,
        opts: &LockOptions,
        lost: &CancellationToken,
        wait: bool,
        attempts: &mut u32,
    ) -> Result<Option<Error>> {
        let from = guards.len();
        let burst = &keys[from..keys.len().min(from + BURST)];
        *attempts = attempts.saturating_add(burst.len() as u32);
        let (taken, failed) = self.attempt_all(burst, opts, lost).await;
        guards.extend(taken);
        match failed {
            None => Ok(None),
            Some(e) if wait => {
                let start = self.run_start(keys, guards.len());
                if start < guards.len() {
                    release_all(guards.split_off(start), false).await;
                }
                Ok(Some(e))
            }
            Some(e) => {
                release_all(std::mem::take(guards), false).await;
                Err(e)
            }
        }
    }

    /// Waits for `run` (keys of one node) as a whole, holding nothing of it while it waits: a
    /// queued locker's wait at once for up to `QUEUED_SET_MAX` keys, else a polling wait at
    /// once (holding nothing between attempts). So a waiter of the in-order path holds only
    /// keys of earlier slots while it waits: none that a set of this slot waiting at once
    /// could need (docs/design.md, "In order").
    pub(super) async fn wait_run(
        &self,
        run: &[String],
        opts: &LockOptions,
    ) -> Result<Vec<LockGuard>> {
        let start = Instant::now();
        let pid = self.strategy.process_id();
        let taken = match self.strategy.hub() {
            Some(hub) if run.len() <= QUEUED_SET_MAX => {
                let reqs = super::queued::queued_requests(self.holding(), run, opts, pid)?;
                notify::wait(&self.engine, hub, &super::queued::SetRequest::new(reqs)).await
            }
            _ => {
                let mut reqs = super::at_once::requests(self.holding(), run, opts, pid)?;
                super::at_once::poll(&self.engine, &mut reqs, pid).await
            }
        };
        let waited = Some(start.elapsed());
        for key in run {
            self.engine.meter.record(key, &taken, waited);
        }
        taken
    }
}

/// A set whose loss token fired while it was taken in order: every key released, and
/// `Expired` naming the key lost (the first key, `TokenGone`, when none says).
async fn lost_set(keys: &[String], guards: Vec<LockGuard>) -> Error {
    let (key, reason) = guards
        .iter()
        .find_map(|g| g.loss().map(|r| (g.key().to_owned(), r)))
        .unwrap_or_else(|| (keys[0].clone(), LossReason::TokenGone));
    release_all(guards, false).await;
    Error::Expired { key, reason }
}
