//! The lock's part of a trace in words.

use super::{Lock, LockSt, Queue, St};
use crate::system::*;

impl Queue {
    pub(super) fn lock_words(&self, l: Option<Lock>) -> String {
        match l {
            None => "free".into(),
            Some(l) => {
                let how = match l.st {
                    LockSt::P => "taken",
                    LockSt::Q => "held",
                    LockSt::H => "handed by a full grant (h), unclaimed",
                    LockSt::G => "handed by a short grant (g), unconfirmed",
                };
                format!("{how} by {}, expiring at tick {}", self.wn(l.holder), l.exp)
            }
        }
    }

    pub(super) fn start_words(&self, s: &St, n: &St, w: W) -> &'static str {
        if matches!(n.ws[w as usize], Ws::Holding { .. }) {
            ": its first (plain) attempt finds the lock free and takes it"
        } else if s.key.lock != n.key.lock || s.queue != n.queue {
            ": its plain attempt finds the lock free with waiters queued and serves them"
        } else {
            " and registers on its process's grant channel"
        }
    }

    pub(super) fn effects(&self, s: &St, n: &St, a: &Act, at: Part, eff: &mut Vec<String>) {
        match at {
            Part::Redis => {
                if s.key.lock != n.key.lock && !matches!(a, Act::Tick) {
                    eff.push(format!("the lock is now {}", self.lock_words(n.key.lock)));
                }
                if n.key.fence != s.key.fence {
                    eff.push(format!("fence {}", n.key.fence));
                }
            }
            Part::Queue => {
                let actor = a.waiter();
                let dropped: Vec<String> = s
                    .queue
                    .iter()
                    .filter(|&&m| {
                        !n.queue.contains(&m)
                            && Some(m) != actor
                            && n.key.lock.is_none_or(|l| l.holder != m)
                    })
                    .map(|&m| self.wn(m))
                    .collect();
                if !dropped.is_empty() && !matches!(a, Act::Replay(_)) {
                    eff.push(format!(
                        "Redis drops {} from the queue (not listening or lapsed)",
                        dropped.join(", ")
                    ));
                }
            }
            Part::Records => {
                for p in 0..self.np() {
                    if n.procs[p].rec != s.procs[p].rec && n.procs[p].rec == Rec::Lapsed {
                        eff.push(format!("Redis marks P{p} lapsed (its waiters are skipped)"));
                    }
                }
            }
            Part::End => {
                for (w, v) in n.ws.iter().enumerate() {
                    let Ws::Holding { until, .. } = *v else {
                        continue;
                    };
                    if n.now < until && s.ws[w] != *v {
                        let others: Vec<String> = (0..self.nw())
                            .filter(|&x| x != w && self.valid(n, x))
                            .map(|x| self.wn(x as W))
                            .collect();
                        if !others.is_empty() {
                            eff.push(format!(
                                "{} and {} both hold valid guards",
                                self.wn(w as W),
                                others.join(", ")
                            ));
                        }
                    }
                }
                if a == &Act::Tick && self.valid_holders(n) >= 2 {
                    let hs: Vec<String> = (0..self.nw())
                        .filter(|&x| self.valid(n, x))
                        .map(|x| self.wn(x as W))
                        .collect();
                    eff.push(format!("{} hold valid guards at once", hs.join(" and ")));
                }
            }
        }
    }

    pub(super) fn guard_note(&self, s: &St, n: &St, a: &Act, w: usize) -> String {
        let Ws::Holding { fence, bg, .. } = n.ws[w] else {
            return String::new();
        };
        let mut note = String::new();
        if matches!(a, Act::Wake(_)) && s.key.lock != n.key.lock {
            note.push_str(" after confirming the grant (extend)");
        }
        if bg {
            note.push_str(", to be confirmed in the background");
        }
        if fence != n.key.fence {
            note.push_str(&format!(", although its hold's fence is {}", n.key.fence));
        }
        if fence <= s.key.top_fence {
            note.push_str(&format!(
                ", not above fence {} that an earlier guard returned",
                s.key.top_fence
            ));
        }
        note
    }
}
