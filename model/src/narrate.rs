//! Traces in words: each step (`describe`: the action, then what it changed), where a trace
//! ends (`summary`), a whole trace (`narrate`). The key gives the words of its Redis state
//! (`Key::effects`, `summary_head`, ...).

use crate::system::*;
use std::fmt::Write as _;

/// What a waiter's stalled call is, in words.
fn awaited_words(awaited: bool) -> &'static str {
    if awaited {
        " (its caller still waits for the reply)"
    } else {
        " (its caller gave up on it)"
    }
}

impl<K: Key> System<K> {
    pub fn wn(&self, w: W) -> String {
        K::wn(self, w)
    }

    /// The members of a queue, or the watchers, in words.
    fn members(q: &[W]) -> String {
        let q: Vec<String> = q.iter().map(|&w| format!("w{w}")).collect();
        q.join(", ")
    }

    fn call_words(&self, c: Call) -> String {
        match c {
            Call::Acquire { w, awaited, .. } => format!(
                "{}'s queueing attempt{}",
                self.wn(w),
                awaited_words(awaited)
            ),
            Call::Extend { w, awaited } => format!(
                "{}'s extend (confirm){}",
                self.wn(w),
                awaited_words(awaited)
            ),
            Call::Release { w } => format!("{}'s release", self.wn(w)),
            Call::Renew { w, ttl, awaited } => format!(
                "{}'s extend to {ttl} ticks{}",
                self.wn(w),
                awaited_words(awaited)
            ),
            Call::Leave {
                w, flag: Flag::G, ..
            } => format!("{}'s leave ('G')", self.wn(w)),
            Call::Leave {
                w,
                flag: Flag::O(f),
                ..
            } => format!("the give-back ('o', fence {f}) of {}'s grant", self.wn(w)),
        }
    }

    /// The action, in words.
    fn act_words(&self, s: &State<K>, n: &State<K>, a: &Act, o: &mut String) {
        let c = self.world();
        match *a {
            Act::Tick => {
                let _ = write!(
                    o,
                    "time passes to tick {}{}",
                    n.now,
                    K::tick_words(self, s, n)
                );
            }
            Act::Start(w) => {
                let _ = write!(
                    o,
                    "{} starts acquire_wait{}",
                    self.wn(w),
                    K::start_words(self, s, n, w)
                );
            }
            Act::Attempt(w) => {
                let _ = write!(o, "{} {}", self.wn(w), K::ATTEMPT);
                if let Ws::Waiting(t) = n.ws[w as usize] {
                    if t.inflight.is_some() {
                        o.push_str(": the call waits on the stalled connection");
                    } else if s.queue != n.queue || s.key != n.key {
                        let _ = write!(
                            o,
                            ": queued{}",
                            match t.watch {
                                Some(x) if x > 0 => format!(", a watcher looking at tick {x}"),
                                _ => String::new(),
                            }
                        );
                    } else {
                        o.push_str(": still queued");
                    }
                }
            }
            Act::Wake(w) => {
                let t = Self::wt(s, w as usize);
                let _ = write!(o, "{} wakes", self.wn(w));
                if let Some(g) = t.grant {
                    let how = if g.px >= c.ttl {
                        ", a full grant"
                    } else {
                        ", a short grant"
                    };
                    let _ = write!(
                        o,
                        " and reads a grant (fence {}, lease {} ticks from tick {}{how})",
                        g.fence, g.px, g.at
                    );
                } else if let Some((px, _)) = t.watch_msg {
                    let _ = write!(o, " and reads a watch message (look in {px} ticks)");
                } else if s.now >= t.deadline {
                    o.push_str(" at its deadline");
                } else if t.permit {
                    o.push_str(" (woken by its hub)");
                } else {
                    o.push_str(" (its timer)");
                }
            }
            Act::TimeOut(w) => {
                let _ = write!(
                    o,
                    "{}'s call reaches its time limit (it will run later)",
                    self.wn(w)
                );
            }
            Act::Release(w) => {
                let _ = write!(o, "{} releases its guard", self.wn(w));
            }
            Act::BgConfirm(w) => {
                let _ = write!(
                    o,
                    "{}'s background task confirms (extends) its grant",
                    self.wn(w)
                );
            }
            Act::Deliver(p) => match s.chans[p as usize][0] {
                Msg::Grant { to, fence, px, .. } => {
                    let _ = write!(
                        o,
                        "P{p}'s dispatcher receives the grant for {} (fence {fence}, lease {px})",
                        self.wn(to)
                    );
                    if !matches!(s.ws[to as usize], Ws::Waiting(_)) {
                        o.push_str("; its waiter has gone: it gives the grant back (leave 'o')");
                    }
                }
                Msg::Watch { to, px, .. } => {
                    let _ = write!(
                        o,
                        "P{p}'s dispatcher receives a watch message for {} (look in {px})",
                        self.wn(to)
                    );
                }
                Msg::Dropped => {
                    let _ = write!(
                        o,
                        "P{p}'s dispatcher learns that its waiters were dropped, and wakes them"
                    );
                }
            },
            Act::Lose(p) => {
                let what = match s.chans[p as usize][0] {
                    Msg::Grant { to, fence, .. } => {
                        format!("the grant for {} (fence {fence})", self.wn(to))
                    }
                    Msg::Watch { to, .. } => format!("the watch message for {}", self.wn(to)),
                    Msg::Dropped => "the wake-up message".to_string(),
                };
                let _ = write!(o, "{what} is lost on P{p}'s subscriber connection");
            }
            Act::Notice(p) => {
                let _ = write!(
                    o,
                    "P{p}'s hub notices the lost message and wakes its waiters"
                );
            }
            Act::Freeze(p) => {
                let _ = write!(o, "P{p} freezes");
            }
            Act::Resume(p) => {
                let _ = write!(o, "P{p} resumes");
                if let Run::Frozen(k) = s.procs[p as usize].run {
                    if k >= c.notice {
                        o.push_str(" (its housekeeper notices the freeze and wakes its waiters)");
                    } else {
                        o.push_str(" (the freeze was too short for its housekeeper to notice)");
                    }
                }
            }
            Act::Kill(p) => {
                let _ = write!(o, "P{p} is killed");
            }
            Act::SubDrop(p) => {
                let _ = write!(
                    o,
                    "P{p}'s subscriber connection drops (messages in flight lost)"
                );
            }
            Act::Resub(p) => {
                let _ = write!(
                    o,
                    "P{p}'s subscriber connection is re-made; its waiters wake"
                );
            }
            Act::Stall(p) => {
                let _ = write!(o, "P{p}'s client connection stalls");
            }
            Act::Extend(w, long) => {
                let ttl = if long { c.ttl_long } else { c.ttl_short };
                let _ = write!(o, "{} calls extend({ttl} ticks)", self.wn(w));
            }
            Act::Refresh(w) => {
                let _ = write!(o, "{}'s keep-alive refreshes its lock", self.wn(w));
            }
            Act::Overstay(w) => {
                let _ = write!(
                    o,
                    "{} is careless: it will not release before its lease ends",
                    self.wn(w)
                );
            }
            Act::StepBack => {
                let _ = write!(o, "Redis' clock steps back {} ticks", c.step);
            }
            Act::Replay(p) => match s.late[p as usize].first().copied() {
                Some(c) => {
                    let _ = write!(o, "Redis runs the stalled call: {}", self.call_words(c));
                }
                None => {
                    let _ = write!(o, "P{p}'s client connection recovers");
                }
            },
        }
    }

    /// The messages a step published, in words.
    fn published(&self, s: &State<K>, n: &State<K>, a: &Act, eff: &mut Vec<String>) {
        for p in 0..self.np() {
            let before = s.chans[p].len();
            let after = &n.chans[p];
            let kept = if matches!(a, Act::Deliver(q) | Act::Lose(q) if *q as usize == p) {
                before - 1
            } else {
                before
            };
            if after.len() > kept {
                for m in &after[kept..] {
                    eff.push(match *m {
                        Msg::Grant { to, fence, px, at } => format!(
                            "Redis publishes a grant to {} (fence {fence}, lease {px} ticks from tick {at})",
                            self.wn(to)
                        ),
                        Msg::Watch { to, px, .. } => {
                            format!("Redis tells {} to watch (look in {px} ticks)", self.wn(to))
                        }
                        Msg::Dropped => format!("Redis tells P{p} that its waiters were dropped"),
                    });
                }
            }
        }
    }

    /// What a step did to the waiters, in words.
    fn waiters_words(&self, s: &State<K>, n: &State<K>, a: &Act, eff: &mut Vec<String>) {
        for w in 0..self.nw() {
            let (b, f) = (s.ws[w], n.ws[w]);
            if b == f {
                continue;
            }
            let who = self.wn(w as W);
            match f {
                Ws::Holding { until, fence, .. } if !matches!(b, Ws::Holding { .. }) => {
                    let note = K::guard_note(self, s, n, a, w);
                    eff.push(format!(
                        "{who} returns a guard (fence {fence}) valid until tick {until}{note}"
                    ))
                }
                Ws::Holding { until, .. } => {
                    eff.push(format!("{who}'s guard is now valid until tick {until}"))
                }
                Ws::Done if matches!(b, Ws::Waiting(_)) && matches!(a, Act::Kill(_)) => {}
                Ws::Done if matches!(b, Ws::Waiting(_)) => {
                    eff.push(format!("{who} returns WaitTimeout"))
                }
                Ws::Waiting(t) if Some(w as W) == a.waiter() => {
                    if let Ws::Waiting(tb) = b {
                        if t.inflight.is_some()
                            && tb.inflight.is_none()
                            && !matches!(a, Act::Attempt(_))
                        {
                            eff.push(format!("{who} confirms (extend) before using it; the call waits on the stalled connection"));
                        } else if t.check
                            && !tb.check
                            && matches!(a, Act::Wake(_))
                            && tb.grant.is_some()
                        {
                            eff.push(format!("{who} looks again"));
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// One step of a trace, in words: the action, then what it changed.
    pub fn describe(&self, s: &State<K>, a: &Act) -> String {
        let Some(n) = self.step(s, *a) else {
            return format!("{a:?} (disabled)");
        };
        let mut o = format!("tick {}: ", s.now);
        self.act_words(s, &n, a, &mut o);
        // What changed, in Redis and for the waiters.
        let mut eff: Vec<String> = Vec::new();
        K::effects(self, s, &n, a, Part::Redis, &mut eff);
        self.published(s, &n, a, &mut eff);
        K::effects(self, s, &n, a, Part::Queue, &mut eff);
        if n.queue != s.queue {
            eff.push(format!("queue [{}]", Self::members(&n.queue)));
        }
        if n.watchers != s.watchers {
            let ws: Vec<String> = n
                .watchers
                .iter()
                .flatten()
                .map(|&(at, m)| {
                    if at > 0 {
                        format!("w{m} at tick {at}")
                    } else {
                        format!("w{m}")
                    }
                })
                .collect();
            eff.push(format!("watchers [{}]", ws.join(", ")));
        }
        K::effects(self, s, &n, a, Part::Records, &mut eff);
        self.waiters_words(s, &n, a, &mut eff);
        K::effects(self, s, &n, a, Part::End, &mut eff);
        if !eff.is_empty() {
            o.push_str(". ");
            let mut first = eff.remove(0);
            if let Some(c) = first.get_mut(0..1) {
                c.make_ascii_uppercase();
            }
            o.push_str(&first);
            for e in eff {
                o.push_str("; ");
                o.push_str(&e);
            }
        }
        o.push('.');
        o
    }

    /// Where a trace ends: the key, the queue, each waiter, the ghosts.
    pub fn summary(&self, s: &State<K>) -> String {
        let mut o = format!("at tick {}: {}", s.now, K::summary_head(self, s));
        let _ = write!(o, "; queue [{}]", Self::members(&s.queue));
        for w in 0..self.nw() {
            let who = self.wn(w as W);
            let p = self.pw(w as W);
            let what = match s.ws[w] {
                Ws::Idle => "has not started".to_string(),
                Ws::Done => continue,
                Ws::Holding { until, .. } if self.rules.clamp && until <= s.now => {
                    "holds a guard no longer valid".to_string()
                }
                Ws::Holding { until, fence, .. } if fence > 0 => {
                    format!("holds a guard (fence {fence}) valid until tick {until}")
                }
                Ws::Holding { until, .. } => format!("holds a guard valid until tick {until}"),
                Ws::Waiting(t) => {
                    let mut x = String::from("waits");
                    x.push_str(if s.queue.contains(&(w as W)) {
                        ", queued"
                    } else {
                        ", not in the queue"
                    });
                    match t.watch {
                        Some(at) if at > s.now => {
                            let _ = write!(x, ", watching (looks at tick {at})");
                        }
                        Some(_) if !s.procs[p].slot_ok => {}
                        Some(_) => x.push_str(", its watch time due"),
                        None => x.push_str(", not watching"),
                    }
                    if t.inflight.is_some() {
                        x.push_str(", its call held up on the stalled connection");
                    }
                    let _ = write!(x, " (deadline tick {})", t.deadline);
                    x
                }
            };
            let run = match s.procs[p].run {
                Run::Frozen(_) => " [frozen]",
                _ => "",
            };
            let _ = write!(o, "; {who}{run} {what}");
        }
        o.push_str(&K::summary_tail(self, s));
        o
    }

    /// A whole trace in words: one numbered line per step, then where it ends.
    pub fn narrate(&self, path: &[(State<K>, Option<Act>)]) -> String {
        let mut o = String::new();
        let mut n = 0;
        for (s, a) in path {
            match a {
                Some(a) => {
                    n += 1;
                    let _ = writeln!(o, "{n}. {}", self.describe(s, a));
                }
                None => {
                    let _ = writeln!(o, "End {}.", self.summary(s));
                }
            }
        }
        o
    }
}
