//! The waiter: `src/wait/notify/mod.rs::wait` and `take_grant` (`start`, `attempt`,
//! `on_attempt`, `wake`, `take_grant`), with `Request::full_lease` and `Waiting::attempt` /
//! `limit` (`src/wait/mod.rs`: an attempt's limit and its `full_lease` extend's, the confirm's
//! limit cut to the deadline), the validity arithmetic of `src/hold/lease.rs`, the cell's
//! sticky `hub_woke` flag, the client (a call runs now, or waits on a stalled connection) and
//! a holder's own lease-setting calls. One waiter for both keys: the key's scripts are
//! `Key::acquire`, `release`, `extend`, `leave`.

use crate::system::*;

impl<K: Key> System<K> {
    /// Runs a call (one script).
    pub fn run_call(&self, s: &mut State<K>, c: Call) -> Reply {
        match c {
            Call::Acquire { w, member, .. } => K::acquire(self, s, w, member),
            Call::Extend { w, .. } => K::extend(self, s, w, self.world().ttl),
            Call::Release { w } => K::release(self, s, w),
            Call::Leave { w, member, flag } => K::leave(self, s, w, member, flag),
            Call::Renew { w, ttl, .. } => K::extend(self, s, w, ttl),
        }
    }

    /// A call on the process's client: runs now, or waits on the stalled connection.
    pub fn issue(&self, s: &mut State<K>, w: usize, c: Call) -> Option<Reply> {
        let p = self.pw(w as W);
        if s.procs[p].stalled {
            K::incident(self, s, Incident::StalledCall(w));
            s.late[p].push(c);
            None
        } else {
            Some(self.run_call(s, c))
        }
    }

    /// `acquire_wait` returns a guard.
    pub fn guard(&self, s: &mut State<K>, w: usize, fence: u8, until: u8, reference: u8, bg: bool) {
        K::guard(self, s, w, fence, until, reference);
        s.ws[w] = Ws::Holding {
            until,
            fence,
            bg,
            conf: until,
            pend: 0,
            ttl: self.world().ttl,
            care: false,
            call: None,
        };
    }

    /// A holder sends a call that sets its lease to `ttl` (a user's `extend` when `user`, else
    /// a keep-alive refresh): mirrors `LockGuard::extend` / the refresher with `Lease::sending`
    /// (the validity is cut at once to what the call gives; R1 reverted: nothing), the call
    /// (extend.lua), and `on_renew` for its reply. Calls that set the lease take turns: this is
    /// offered only while none is awaited.
    pub fn renew(&self, s: &mut State<K>, w: usize, ttl: u8, user: bool) {
        let Ws::Holding {
            until,
            fence,
            bg,
            conf,
            pend,
            ttl: old_ttl,
            care,
            ..
        } = s.ws[w]
        else {
            return;
        };
        let sent = s.now;
        let (mut until, mut pend) = (until, pend);
        if !self.rules.max_lease {
            let d = sent + ttl;
            pend = if pend == 0 { d } else { pend.min(d) };
            until = conf.min(pend);
        }
        let p = self.pw(w as W);
        let stalled = s.procs[p].stalled;
        if stalled {
            // the call waits on the stalled connection, and its outcome is unknown: the guard
            // has given up what the call may have cut
            K::incident(self, s, Incident::StalledRenew(w, until));
        }
        s.ws[w] = Ws::Holding {
            until,
            fence,
            bg,
            conf,
            pend,
            ttl: if user { ttl } else { old_ttl },
            care,
            call: stalled.then_some((sent, ttl, user)),
        };
        let c = Call::Renew {
            w: w as W,
            ttl,
            awaited: true,
        };
        if let Some(r) = self.issue(s, w, c) {
            self.on_renew(s, w, r, sent, ttl);
        }
    }

    /// The reply to a holder's lease-setting call sent at `sent` with `ttl`: `Lease::renewed`
    /// (the lease is that call's, shorter or longer; R1 reverted: the larger deadline kept) or,
    /// not held, `mark_lost` (the validity ends now; R1 reverted: kept).
    pub fn on_renew(&self, s: &mut State<K>, w: usize, r: Reply, sent: u8, ttl: u8) {
        let Ws::Holding {
            until,
            fence,
            bg,
            ttl: t,
            care,
            ..
        } = s.ws[w]
        else {
            return;
        };
        let r1 = self.rules.max_lease;
        let until = match r {
            Reply::NotHeld if r1 => until,
            Reply::NotHeld => until.min(s.now),
            _ if r1 => until.max(sent + ttl),
            _ => sent + ttl,
        };
        s.ws[w] = Ws::Holding {
            until,
            fence,
            bg,
            conf: until,
            pend: 0,
            ttl: t,
            care,
            call: None,
        };
    }

    /// Wakes every registered waiter of `p` (`wake_all` / `wake_channel`: one key).
    pub fn wake_all(&self, s: &mut State<K>, p: usize) {
        for w in self.waiters(p) {
            if let Ws::Waiting(t) = &mut s.ws[w] {
                t.permit = true;
                // Cell::wake with a reason other than Notification / Watch sets `hub_woke`
                // (before F4's fix the reason said so: the same, but for a watch message)
                t.hub_wake = true;
            }
        }
    }

    // mirrors src/wait/notify/mod.rs -> wait: fast path, then register
    pub fn start(&self, s: &mut State<K>, w: usize) {
        let p = self.pw(w as W);
        let siblings = self.registered(s, p);
        if !siblings && !s.procs[p].stalled {
            // `if !hub.listening(&channel)`: one plain attempt (no MEMBER, HUB '')
            if let Reply::Acquired(f) = K::acquire(self, s, w as W, false) {
                let now = s.now;
                self.guard(s, w, f, now + self.world().ttl, now, false);
                return;
            }
        }
        if !siblings {
            // A new slot: Pending until the subscription is confirmed (at once while connected).
            s.procs[p].slot_ok = s.procs[p].sub;
        }
        s.ws[w] = Ws::Waiting(Wt {
            deadline: s.now + self.world().wait,
            check: true,
            ..Wt::default()
        });
    }

    // mirrors src/wait/notify/mod.rs -> wait: `if check` (an attempt with the member)
    pub fn attempt(&self, s: &mut State<K>, w: usize) {
        let p = self.pw(w as W);
        let mut t = Self::wt(s, w);
        t.check = false;
        if !s.procs[p].slot_ok {
            // SubState::Pending: no attempt, no watch time (`watch = None`), the timer at the
            // deadline: it waits for the hub's wake-up at the confirmation (or the deadline).
            t.watch = None;
            t.timer = None;
            s.ws[w] = Ws::Waiting(t);
            return;
        }
        if s.procs[p].stalled {
            t.inflight = Some(Inflight::Attempt { sent: s.now });
            s.ws[w] = Ws::Waiting(t);
            let c = Call::Acquire {
                w: w as W,
                member: true,
                awaited: true,
            };
            self.issue(s, w, c);
            return;
        }
        s.ws[w] = Ws::Waiting(t);
        let r = K::acquire(self, s, w as W, true);
        let now = s.now;
        self.on_attempt(s, w, r, now);
    }

    // mirrors src/wait/mod.rs -> Waiting::attempt (the reply) and wait's `match step`
    pub fn on_attempt(&self, s: &mut State<K>, w: usize, r: Reply, sent: u8) {
        let p = self.pw(w as W);
        let mut t = Self::wt(s, w);
        t.inflight = None;
        s.ws[w] = Ws::Waiting(t);
        let ttl = self.world().ttl;
        match r {
            Reply::Acquired(f) | Reply::Granted(f) => self.full_lease(s, w, f, sent + ttl, sent),
            Reply::AlreadyHeld { fence, remaining } => {
                self.full_lease(s, w, fence, sent + remaining, sent)
            }
            Reply::Locked {
                remaining,
                queued: Some(q),
            } => {
                t.anchor = Some((q.fence, (self.rnow(s) as i16 - sent as i16) as i8));
                t.timer = None;
                if self.rules.drop_stale_watch {
                    // Watch messages published before this attempt ran are stale (`look_at`'s
                    // `None`): the code ignores them when it reads them; here they go now.
                    t.watch_msg = None;
                    let wa = w as W;
                    s.chans[p] = s.chans[p]
                        .iter()
                        .copied()
                        .filter(|m| !matches!(m, Msg::Watch { to, .. } if *to == wa))
                        .collect();
                }
                if q.deaf {
                    // hub.lost_subscription: Pending until the subscription is made again; the
                    // loop checks again at once and finds it Pending (`watch = None`)
                    s.procs[p].slot_ok = false;
                    t.watch = None;
                } else {
                    // (from the attempt's send: a late reply does not make it look late)
                    t.watch = q.watcher.then(|| self.due(s, sent + remaining));
                }
                s.ws[w] = Ws::Waiting(t);
            }
            other => panic!("attempt with a member replied {other:?}"),
        }
    }

    /// `Waiting::limit` of a call sent at `sent`: the command timeout, cut to the deadline (the
    /// 5 ms grace is below a tick). F6 reverted: the command timeout.
    pub fn limit(&self, t: &Wt, sent: u8, f6: bool) -> u8 {
        let cmd = self.world().cmd;
        if f6 && self.rules.cmd_limit {
            return cmd;
        }
        cmd.min(t.deadline.saturating_sub(sent))
    }

    // mirrors src/wait/mod.rs -> Request::full_lease (after Waiting::attempt, with its limit)
    pub fn full_lease(&self, s: &mut State<K>, w: usize, fence: u8, until: u8, sent: u8) {
        if until >= s.now + self.world().ttl {
            self.guard(s, w, fence, until, sent, false);
            return;
        }
        let limit = self.limit(&Self::wt(s, w), sent, true);
        let kind = Inflight::Lease {
            fence,
            sent: s.now,
            limit,
        };
        self.extend_then(s, w, kind);
    }

    /// The extend of `full_lease` (after an attempt, or to confirm a grant).
    pub fn extend_then(&self, s: &mut State<K>, w: usize, kind: Inflight) {
        let p = self.pw(w as W);
        if s.procs[p].stalled {
            let mut t = Self::wt(s, w);
            t.inflight = Some(kind);
            s.ws[w] = Ws::Waiting(t);
            let c = Call::Extend {
                w: w as W,
                awaited: true,
            };
            self.issue(s, w, c);
            return;
        }
        let r = K::extend(self, s, w as W, self.world().ttl);
        self.on_extend(s, w, r, kind);
    }

    // mirrors full_lease's `match engine.extend_on(..)`, then attempt's / wait's handling
    pub fn on_extend(&self, s: &mut State<K>, w: usize, r: Reply, kind: Inflight) {
        let p = self.pw(w as W);
        let mut t = Self::wt(s, w);
        t.inflight = None;
        let (fence, sent, confirm) = match kind {
            Inflight::Lease { fence, sent, .. } => (fence, sent, false),
            Inflight::Confirm { fence, sent } => (fence, sent, true),
            Inflight::Attempt { .. } => unreachable!(),
        };
        let ttl = self.world().ttl;
        match r {
            Reply::NotHeld if confirm => {
                // take_grant's Ok(None): the grant lapsed; every waiter of the key looks again
                t.check = true;
                s.ws[w] = Ws::Waiting(t);
                self.wake_all(s, p);
            }
            Reply::NotHeld => {
                // attempt's Ok(None) => Step::Failed: the backoff
                t.timer = Some((s.now + 1).min(t.deadline));
                s.ws[w] = Ws::Waiting(t);
            }
            // {1, fence}: the fence of the hold as Redis has it (F3 reverted: {1}, and the
            // guard keeps the fence in hand, the message's or the attempt's)
            Reply::Renewed(f) => {
                let fence = if self.rules.fence_in_hand { fence } else { f };
                self.guard(s, w, fence, sent + ttl, sent, false)
            }
            Reply::Confirmed(f) => self.guard(s, w, f, sent + ttl, sent, false),
            other => panic!("extend replied {other:?}"),
        }
    }

    // mirrors src/wait/notify/mod.rs -> take_grant: `since = anchor.sent + (grant time −
    // anchor Redis time)`, `valid_until = since + px − margin` (the margin is below a tick), a
    // full lease used at once, else confirmed (extend) first
    pub fn take_grant(&self, s: &mut State<K>, w: usize, g: GrantMsg) {
        let t = Self::wt(s, w);
        let ttl = self.world().ttl;
        let px = match self.rules.own_claim {
            Some(own) => ttl.min(own),
            None => g.px,
        };
        let lag = t.anchor.map_or(0, |a| a.1) as i16;
        let until = g.at as i16 - lag + px as i16;
        let now = s.now as i16;
        if self.rules.bg_confirm {
            // the old fast path: used at once while some of the window is left
            if until > now {
                self.guard(s, w, g.fence, until as u8, s.now, true);
                return;
            }
        } else if px >= ttl && t.anchor.is_some() && until >= now + ttl as i16 {
            self.guard(s, w, g.fence, until as u8, s.now, false);
            return;
        }
        let kind = Inflight::Confirm {
            fence: g.fence,
            sent: s.now,
        };
        self.extend_then(s, w, kind);
    }

    // mirrors src/wait/notify/mod.rs -> wait: after the select (take_grant, take_hub_wake,
    // take_watch, the deadline)
    pub fn wake(&self, s: &mut State<K>, w: usize) {
        let mut t = Self::wt(s, w);
        // Woken by a message (the select's `notified()`), not by its timer or deadline.
        let by_message = t.permit && !Self::time_due(s, &t);
        t.permit = false;
        if let Some(g) = t.grant.take() {
            if t.anchor.is_none_or(|a| g.fence > a.0) {
                s.ws[w] = Ws::Waiting(t);
                self.take_grant(s, w, g);
                if let Ws::Waiting(t) = &mut s.ws[w] {
                    if t.inflight.is_none() {
                        t.check = true; // `check = true; continue`
                    }
                }
                return;
            }
        }
        // `cell.take_hub_wake()` (after the grant: a grant taken leaves the flag for later)
        let hub_wake = std::mem::take(&mut t.hub_wake);
        if let Some((px, by)) = t.watch_msg.take() {
            // `look_at`: px from now, or earlier by the message's Redis time carried over from
            // the anchor (a message read late does not make the watcher look late; the stale
            // ones, published before the anchor ran, were dropped when it ran)
            let at = match self.rules.watch_msg {
                WatchMsg::Bound => (s.now + px).min(by),
                WatchMsg::Countdown | WatchMsg::Delay => s.now + px,
            };
            t.watch = Some(self.due(s, at));
            // `check = hub_woke`: a hub wake always makes it look (F4 reverted: never here)
            t.check = hub_wake && !self.rules.absorb_hub_wake;
        } else {
            // `check = hub_woke || reason is not a message`: a message that left nothing in
            // the mail (a left-over permit, a stale grant) gives nothing to look at.
            t.check = hub_wake || !by_message;
        }
        if s.now >= t.deadline {
            // WaitTimeout; the queue residue leaves in the background ('G')
            s.ws[w] = Ws::Done;
            let c = Call::Leave {
                w: w as W,
                member: true,
                flag: Flag::G,
            };
            self.issue(s, w, c);
        } else {
            s.ws[w] = Ws::Waiting(t);
        }
    }

    /// When the call a waiter waits for reaches its time limit.
    pub fn timeout_at(&self, t: &Wt, i: Inflight) -> u8 {
        match i {
            Inflight::Attempt { sent } => sent + self.limit(t, sent, false),
            Inflight::Lease { sent, limit, .. } => sent + limit,
            // take_grant's limit: `w.limit(..)` when the grant is taken
            Inflight::Confirm { sent, .. } => sent + self.limit(t, sent, true),
        }
    }

    pub fn wake_due(&self, s: &State<K>, t: &Wt) -> bool {
        t.permit || Self::time_due(s, t)
    }

    /// The select's sleep is over: the deadline, the backoff timer or the watch time is due.
    pub fn time_due(s: &State<K>, t: &Wt) -> bool {
        let due = |x: Option<u8>| x.is_some_and(|v| v <= s.now);
        s.now >= t.deadline || due(t.timer) || due(t.watch)
    }

    /// Every waiter has returned, and no stalled call or message is left.
    pub fn quiescent(&self, s: &State<K>) -> bool {
        s.ws.iter().all(|w| *w == Ws::Done)
            && s.late.iter().all(|l| l.is_empty())
            && s.chans.iter().all(|c| c.is_empty())
    }

    /// A waiter of a running process, whose connections are up, waits.
    pub fn live_waiter(&self, s: &State<K>) -> bool {
        (0..self.nw()).any(|w| {
            let p = self.pw(w as W);
            matches!(s.ws[w], Ws::Waiting(_))
                && self.running(s, p)
                && s.procs[p].sub
                && !s.procs[p].stalled
        })
    }

    /// Time is about to pass while a waiter of a process that never froze is still waiting
    /// at or after its deadline (its deadline step is urgent: it should have returned).
    pub fn late_waiter(&self, s: &State<K>) -> bool {
        (0..self.nw()).any(|w| {
            let p = self.pw(w as W);
            match s.ws[w] {
                Ws::Waiting(t) => {
                    s.now >= t.deadline && s.procs[p].run == Run::Running && !s.procs[p].thawed
                }
                _ => false,
            }
        })
    }
}
