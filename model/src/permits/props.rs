//! The permits' properties (1)–(4) and their ghosts, the expiries and the forgetting of dead
//! fences as time passes, and the permits' part of a trace in words.

use super::{Permits, St};
use crate::system::*;
use stateright::Property;

/// Ghost flags (sticky).
pub const FIFO_BREAK: u8 = 1;
pub const FENCE_STALE: u8 = 2;
pub const FENCE_REGRESS: u8 = 4;

const CAP: u8 = 20;

/// (1) the weight of the guards valid now is at most N.
pub const P1: &str = "(1) never more than N valid permits";
/// (2) no hold is made for a waiter while an older queue member of a process that listens
/// stays queued after the call (FIFO, no barging).
pub const P2: &str = "(2) FIFO: no grant passes an older listening waiter";
/// (2b) the idle bound (`Permits::starving`, `Cfg::idle_bound`).
pub const P2B: &str = "(2b) idle within the bound";
/// (3) a returned guard's fence is the fence Redis has for its hold, whose lease runs; every
/// hold's fence is above every earlier one.
pub const P3: &str = "(3) fences: a guard's is its hold's, and they grow";
/// (4) once every waiter has returned and no message is in flight, no queue member and no
/// running lease of a process that is alive is left.
pub const P4: &str = "(4) nothing left behind";
pub const CANARY_ENDED: &str = "canary: every waiter ended";
pub const CANARY_BLOCKED: &str = "canary: a head holds back a lighter waiter";
pub const CANARY_THREE: &str = "canary: three holders";

pub(super) fn properties() -> Vec<Property<Permits>> {
    vec![
        Property::<Permits>::always(P1, |m, s| m.latch(0, m.valid_weight(s) <= m.cfg.permits)),
        Property::<Permits>::always(P2, |m, s| m.latch(1, s.flags & FIFO_BREAK == 0)),
        Property::<Permits>::always(P2B, |m, s| m.latch(2, s.idle <= m.cfg.idle_bound)),
        Property::<Permits>::always(P3, |m, s| {
            m.latch(3, s.flags & (FENCE_STALE | FENCE_REGRESS) == 0)
        }),
        Property::<Permits>::always(P4, |m, s| m.latch(4, !(m.quiescent(s) && m.left_behind(s)))),
        Property::<Permits>::sometimes(CANARY_ENDED, |_, s| s.ws.iter().all(|w| *w == Ws::Done)),
        Property::<Permits>::sometimes(CANARY_BLOCKED, |m, s| m.blocked(s)),
        Property::<Permits>::sometimes(CANARY_THREE, |_, s| s.key.holders.len() >= 3),
    ]
}

impl Permits {
    /// Runs one script; the FIFO ghost: a hold made by it must not pass an older queue member
    /// of a process that listens and that is still queued after it.
    pub(super) fn script<R>(&self, s: &mut St, f: impl FnOnce(&Self, &mut St) -> R) -> R {
        let q0 = s.queue;
        let f0 = s.key.fence;
        let r = f(self, s);
        if s.key.fence != f0 {
            let mut broken = false;
            for h in s.key.holders.iter().filter(|h| h.fence > f0) {
                let xpos = q0.iter().position(|&m| m == h.w);
                for &m in s.queue.iter() {
                    let Some(mpos) = q0.iter().position(|&o| o == m) else {
                        continue;
                    };
                    if self.listener(s, self.pw(m)) && xpos.is_none_or(|x| x > mpos) {
                        broken = true;
                    }
                }
            }
            if broken {
                s.flags |= FIFO_BREAK;
            }
        }
        r
    }

    /// The weight of the guards valid now.
    pub fn valid_weight(&self, s: &St) -> u8 {
        (0..self.nw())
            .filter(|&w| self.valid(s, w))
            .map(|w| self.weight(w as W))
            .sum()
    }

    /// The permits no running lease holds (an ended lease not dropped yet is free).
    pub fn free(&self, s: &St) -> u8 {
        let held: u8 = s
            .key
            .holders
            .iter()
            .filter(|h| h.end > s.now)
            .map(|h| self.weight(h.w))
            .sum();
        self.cfg.permits.saturating_sub(held)
    }

    /// A serve run now would grant (a call now would grant a waiter that waits, or grant the
    /// dead or frozen ones ahead of it), while a waiter of a running process waits in the
    /// queue: the scan as the scripts do it, a kill noticed by the next call (after a purge; a
    /// head nobody listens for is dropped once it fits, the first head that does not fit
    /// stops it; with `Cfg::idle_strict`, a head nobody listens for is dropped first, as
    /// `serve` does since P3's fix).
    pub fn starving(&self, s: &St) -> bool {
        let live = s.queue.iter().any(|&m| {
            let p = self.pw(m);
            self.running(s, p) && matches!(s.ws[m as usize], Ws::Waiting(_))
        });
        if !live {
            return false;
        }
        let free = self.free(s);
        for &m in s.queue.iter() {
            let gone = !self.listener(s, self.pw(m));
            if gone && self.cfg.idle_strict {
                continue;
            }
            let w = self.weight(m);
            if w > free {
                return false;
            }
            if !gone {
                return true;
            }
        }
        false
    }

    /// After a scan: a waiter of a listening process that fits waits behind a head nobody
    /// listens for that does not fit (P3; its fix drops such a head).
    pub fn held_by_dead(&self, s: &St) -> bool {
        let free = self.free(s);
        let mut dead_block = false;
        for &m in s.queue.iter() {
            let gone = !self.listener(s, self.pw(m));
            if gone {
                if self.weight(m) > free {
                    dead_block = true;
                }
                continue;
            }
            return dead_block && self.weight(m) <= free;
        }
        false
    }

    /// A queue head (of a listening process) that does not fit holds back a lighter waiter
    /// behind it that would (the canary that blocking happens).
    pub fn blocked(&self, s: &St) -> bool {
        let free = self.free(s);
        let mut it = s
            .queue
            .iter()
            .copied()
            .filter(|&m| self.listener(s, self.pw(m)));
        match it.next() {
            Some(h) if self.weight(h) > free => it.any(|m| self.weight(m) <= free),
            _ => false,
        }
    }

    /// A queue member or a running lease of a process that is still alive.
    fn left_behind(&self, s: &St) -> bool {
        let alive = |w: W| s.procs[self.pw(w)].run != Run::Killed;
        s.queue.iter().any(|&m| alive(m))
            || s.key.holders.iter().any(|h| h.end > s.now && alive(h.w))
    }

    /// Before time passes: the idle ghost (`starving`, consecutive ticks).
    pub(super) fn before_tick(&self, s: &mut St) {
        s.idle = if self.starving(s) {
            (s.idle + 1).min(CAP)
        } else {
            0
        };
    }

    /// Time has passed: leases end, the holders key expires with its last lease.
    pub(super) fn expire(&self, s: &mut St) {
        let now = s.now;
        let k = &mut s.key;
        if k.holders.iter().all(|h| h.end <= now) {
            // PEXPIREAT of the last lease's end: the holders (and their fences) are gone
            k.holders.clear();
            k.used = 0;
        }
        for h in k.holders.iter_mut() {
            h.end = clamp(now, h.end);
        }
    }

    /// Forgets fences no future step compares (after every step): a waiter's anchor and its
    /// hold's fence (and claim marker) matter only while a grant message to it is in flight
    /// or in its mail (a later grant's fence is above every fence of the state; the reply
    /// `{1, pttl, fence}` and extend's `{1, fence}` return the hold's fence, which the guard
    /// then carries: (3) compares it with itself when the guard returns, and never after).
    pub(super) fn forget_fences(&self, s: &mut St) {
        let mut pending = 0u32;
        for ch in s.chans.iter() {
            for m in ch.iter() {
                if let Msg::Grant { to, .. } = m {
                    pending |= 1 << to;
                }
            }
        }
        for (w, ws) in s.ws.iter_mut().enumerate() {
            match ws {
                Ws::Waiting(t) => {
                    if t.grant.is_some() {
                        pending |= 1 << w;
                    } else if let Some(a) = t.anchor.as_mut() {
                        if pending & (1 << w) == 0 {
                            a.0 = 0;
                        }
                    }
                }
                Ws::Holding { fence, .. } => *fence = 0,
                _ => {}
            }
        }
        for h in s.key.holders.iter_mut() {
            if pending & (1 << h.w) == 0 {
                // the claim marker matters only to leave 'o', which only a grant message
                // brings
                h.fence = 0;
                h.claimed = false;
            }
        }
    }

    pub(super) fn holders_words(&self, s: &St) -> String {
        if s.key.holders.is_empty() {
            return "none".into();
        }
        let hs: Vec<String> = s
            .key
            .holders
            .iter()
            .map(|h| {
                // a fence 0 was forgotten (`forget`: no grant message names it)
                let f = if h.fence > 0 {
                    format!("fence {}, ", h.fence)
                } else {
                    String::new()
                };
                if h.end > s.now {
                    format!("w{} ({f}until tick {})", h.w, h.end)
                } else {
                    format!("w{} ({f}ended)", h.w)
                }
            })
            .collect();
        hs.join(", ")
    }

    pub(super) fn effects(&self, s: &St, n: &St, a: &Act, at: Part, eff: &mut Vec<String>) {
        let tick = matches!(a, Act::Tick);
        match at {
            Part::Redis => {
                if n.key.holders != s.key.holders && !tick {
                    eff.push(format!(
                        "holders: {} (used {})",
                        self.holders_words(n),
                        n.key.used
                    ));
                } else if tick && n.key.holders != s.key.holders {
                    eff.push(format!("holders: {}", self.holders_words(n)));
                }
                if n.key.used != s.key.used && n.key.holders == s.key.holders {
                    eff.push(format!("used {}", n.key.used));
                }
            }
            Part::End => {
                if n.flags & FIFO_BREAK != 0 && s.flags & FIFO_BREAK == 0 {
                    eff.push("a grant passed an older listening waiter still queued".into());
                }
                if n.flags & FENCE_STALE != 0 && s.flags & FENCE_STALE == 0 {
                    eff.push("a guard's fence is not its hold's".into());
                }
                let (vb, vn) = (self.valid_weight(s), self.valid_weight(n));
                if vn > self.cfg.permits && vb <= self.cfg.permits {
                    let hs: Vec<String> = (0..self.nw())
                        .filter(|&x| self.valid(n, x))
                        .map(|x| self.wn(x as W))
                        .collect();
                    eff.push(format!(
                        "valid guards now weigh {vn} > {} permits: {}",
                        self.cfg.permits,
                        hs.join(", ")
                    ));
                }
                if tick && n.idle > 0 {
                    eff.push(format!(
                        "a live waiter waited a tick while the queue's first listening waiter fitted ({} in a row)",
                        n.idle
                    ));
                }
            }
            Part::Queue | Part::Records => {}
        }
    }
}
