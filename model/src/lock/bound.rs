//! The lock's properties (a)–(g) and their ghosts: the idle bound's incident costs, the checks
//! of a returned guard, the lease rule, the expiries of time passing.

use super::{Queue, St};
use crate::system::*;
use stateright::Property;

/// Ghost flags.
pub const FENCE_REGRESS: u8 = 1;
pub const FENCE_STALE: u8 = 2;
pub const SHORT_RETURN: u8 = 4;
pub const LATE_END: u8 = 8;
/// A guard read valid past what Redis was last told for its token (its lease), or while its
/// token did not hold the lock.
pub const OVER_LEASE: u8 = 16;

/// The idle bound's incident costs (`Cfg::no_cost` switches one off, to show it is needed).
/// A grant to a frozen process, or to one whose client connection is stalled: its lease.
pub const COST_GRANT: u8 = 1;
/// The holder's process is killed: the rest of its lease.
pub const COST_KILL: u8 = 4;
/// A subscriber connection drops while its process holds an unclaimed grant: the rest of it.
pub const COST_DROP: u8 = 8;
/// A call of the lock's holder (release, leave, confirm) waits on a stalled connection: the
/// rest of the lease.
pub const COST_STALLED_CALL: u8 = 16;
/// A timed-out attempt runs later and takes the lock for a waiter that does not know: one
/// tick (its backoff).
pub const COST_LATE_ACQUIRE: u8 = 32;
/// A careless holder overstays: the rest of the lock's lease beyond its guard's validity.
pub const COST_CARELESS: u8 = 64;
/// Redis' clock steps back: every lease in Redis lasts that much longer by the waiters' clock.
pub const COST_STEP: u8 = 128;

const CAP: u8 = 40;

pub(super) fn properties() -> Vec<Property<Queue>> {
    vec![
        Property::<Queue>::always("(a) never two valid holders", |m, s| {
            m.latch(0, m.valid_holders(s) < 2)
        }),
        Property::<Queue>::always("(b) idle within the bound", |m, s| {
            m.latch(1, s.idle <= s.key.allowance)
        }),
        Property::<Queue>::always("(c) guard fences strictly increase", |m, s| {
            m.latch(2, s.flags & FENCE_REGRESS == 0)
        }),
        Property::<Queue>::always("(c2) a guard's fence is its hold's", |m, s| {
            m.latch(3, s.flags & FENCE_STALE == 0)
        }),
        Property::<Queue>::always("(d) every wait ends by its deadline", |m, s| {
            m.latch(4, s.flags & LATE_END == 0)
        }),
        Property::<Queue>::always("(e) nothing left behind", |m, s| {
            m.latch(5, !(m.quiescent(s) && m.left_behind(s)))
        }),
        Property::<Queue>::always("(f) full lease at return", |m, s| {
            m.latch(6, s.flags & SHORT_RETURN == 0)
        }),
        Property::<Queue>::always("(g) a guard never outlives its lease in Redis", |m, s| {
            m.latch(7, s.flags & OVER_LEASE == 0)
        }),
        Property::<Queue>::sometimes("canary: every waiter ended", |_, s| {
            s.ws.iter().all(|w| *w == Ws::Done)
        }),
        Property::<Queue>::sometimes("canary: a handed-over guard", |_, s| s.key.top_fence >= 3),
    ]
}

impl Queue {
    fn charge(&self, s: &mut St, kind: u8, ticks: u8) {
        if self.cfg.no_cost & kind != 0 {
            return;
        }
        s.key.allowance = s.key.allowance.saturating_add(ticks).min(CAP);
    }

    /// Idle cost: a grant to a frozen process waits (at most) its whole lease: its TTL if
    /// Redis saw it within the presence window by its own clock (`recent`, as the fixed
    /// `process()` judges), else the claim window (it should have had a short grant); a grant
    /// to a process whose calls (the confirm) are held up, its lease.
    pub(super) fn charge_grant(&self, s: &mut St, p: usize, px: u8) {
        let now = self.rnow(s);
        if matches!(s.procs[p].run, Run::Frozen(_)) {
            let fresh = matches!(s.procs[p].rec, Rec::Seen(t) if {
                let d = now as i16 - t as i16;
                d >= 0 && d <= self.world().presence as i16
            });
            let cost = if fresh { px } else { px.min(self.cfg.claim) };
            self.charge(s, COST_GRANT, cost);
        } else if s.procs[p].stalled {
            self.charge(s, COST_GRANT, px);
        }
    }

    /// The idle cost of the lock held by a waiter of `p` that cannot pass it on now.
    fn charge_hold_of(&self, s: &mut St, p: usize, guard_gone: bool, kind: u8) {
        let Some(l) = s.key.lock else { return };
        if self.pw(l.holder) != p {
            return;
        }
        let from = match s.ws[l.holder as usize] {
            Ws::Holding { until, .. } if !guard_gone => until.max(s.now),
            _ => s.now,
        };
        // (the lock's expiry is a Redis time: `back` ticks later by the waiters' clock)
        self.charge(s, kind, (l.exp + s.back).saturating_sub(from));
    }

    /// The incidents' costs.
    pub(super) fn incident(&self, s: &mut St, i: Incident) {
        let (lock, now, back) = (s.key.lock, s.now, s.back);
        // the rest of the lock's lease, by the waiters' clock, from `from`
        let left = |from: u8| lock.map_or(0, |l| (l.exp + back).saturating_sub(from));
        match i {
            Incident::Kill(p) => self.charge_hold_of(s, p, true, COST_KILL),
            Incident::Overstay(w) => {
                let p = self.pw(w as W);
                self.charge_hold_of(s, p, false, COST_CARELESS)
            }
            // a subscriber drop while its process holds the lock without a valid guard (an
            // unclaimed grant)
            Incident::SubDrop(p) => {
                if let Some(l) = lock {
                    if self.pw(l.holder) == p && !self.valid(s, l.holder as usize) {
                        self.charge(s, COST_DROP, left(now));
                    }
                }
            }
            // the lock's holder cannot pass it on while its call waits
            Incident::StalledCall(w) => {
                if lock.is_some_and(|l| l.holder as usize == w) && !self.valid(s, w) {
                    self.charge(s, COST_STALLED_CALL, left(now));
                }
            }
            // the guard has given up what the call may have cut, while Redis keeps the lock
            // until its lease ends (a user's extend holds up the section, and its release)
            Incident::StalledRenew(w, until) => {
                if lock.is_some_and(|l| l.holder as usize == w) {
                    self.charge(s, COST_STALLED_CALL, left(until.max(now)));
                }
            }
            Incident::StepBack => self.charge(s, COST_STEP, self.world().step),
            Incident::LateAcquire => self.charge(s, COST_LATE_ACQUIRE, 1),
        }
    }

    /// `acquire_wait` returns a guard: (f), (c), (c2); the idle bound starts again.
    pub(super) fn returned(&self, s: &mut St, _w: usize, fence: u8, until: u8, reference: u8) {
        let ttl = self.world().ttl;
        if (until as u16) + (self.cfg.slack as u16) < reference as u16 + ttl as u16 {
            s.flags |= SHORT_RETURN;
        }
        if fence <= s.key.top_fence {
            s.flags |= FENCE_REGRESS;
        }
        if fence != s.key.fence {
            s.flags |= FENCE_STALE;
        }
        s.key.top_fence = s.key.top_fence.max(fence);
        s.idle = 0;
        s.key.allowance = 0;
    }

    /// (g): every guard that reads valid is its token's hold in Redis, and no longer than
    /// Redis keeps it (the lock's expiry, a Redis time, by the waiters' clock).
    fn check_leases(&self, s: &mut St) {
        for w in 0..self.nw() {
            if let Ws::Holding { until, .. } = s.ws[w] {
                if s.now < until {
                    let ok = s
                        .key
                        .lock
                        .is_some_and(|l| l.holder as usize == w && until <= l.exp + s.back);
                    if !ok {
                        s.flags |= OVER_LEASE;
                    }
                }
            }
        }
    }

    /// The fence counter, gone, has no expiry (so that equal Redis states are equal states).
    fn settle_fence(&self, s: &mut St) {
        if s.key.f_gone || s.key.fence == 0 {
            s.key.f_exp = 0;
        }
    }

    /// After every step: the keys settle, (g).
    pub(super) fn settle(&self, s: &mut St) {
        if self.world().retain.is_some() {
            self.settle_fence(s);
        }
        self.check_leases(s);
    }

    /// Before time passes: (d), and the idle ghost counts a tick with no valid guard while a
    /// live waiter waits.
    pub(super) fn before_tick(&self, s: &mut St) {
        if self.late_waiter(s) {
            s.flags |= LATE_END;
        }
        if self.valid_holders(s) == 0 && self.live_waiter(s) {
            s.idle = (s.idle + 1).min(s.key.allowance + 1);
        }
    }

    /// Time has passed: the lock expires, and with a retention the fence counter.
    pub(super) fn expire(&self, s: &mut St) {
        let now = self.rnow(s);
        if s.key.lock.is_some_and(|l| l.exp <= now) {
            s.key.lock = None;
        }
        if self.world().retain.is_some() {
            let k = &mut s.key;
            if k.f_exp != 0 && k.f_exp <= now {
                k.f_gone = true;
                k.fence_q = false;
                k.fence_pending = None;
            }
            self.settle_fence(s);
        }
    }

    pub fn valid_holders(&self, s: &St) -> usize {
        (0..self.nw()).filter(|&w| self.valid(s, w)).count()
    }

    fn left_behind(&self, s: &St) -> bool {
        let killed = |w: W| s.procs[self.pw(w)].run == Run::Killed;
        s.queue.iter().any(|&m| !killed(m)) || s.key.lock.is_some_and(|l| !killed(l.holder))
    }
}
