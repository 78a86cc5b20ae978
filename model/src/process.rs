//! The processes and time: which steps are enabled (urgent steps first, voluntary ones between
//! cascades), the faults (a message lost, a freeze and the resume's notice, a kill, a
//! subscriber connection dropped and re-made, a client connection stalled with its FIFO of
//! late calls and their replay, calls timing out), the dispatcher's `deliver`, holders' own
//! calls, Redis' clock stepping back, and the tick.

use crate::system::*;
use stateright::{Model, Property};

impl<K: Key> Model for System<K> {
    type State = State<K>;
    type Action = Act;

    fn init_states(&self) -> Vec<State<K>> {
        let c = self.world();
        vec![State {
            now: 0,
            key: K::init(&self.cfg),
            queue: Default::default(),
            watchers: [None, None],
            holder_pid: None,
            back: 0,
            q_exp: 0,
            p_exp: 0,
            e_hint: 0,
            procs: (0..self.np())
                .map(|_| Pr {
                    run: Run::Running,
                    sub: true,
                    slot_ok: true,
                    thawed: false,
                    missed: false,
                    stalled: false,
                    draining: false,
                    rec: Rec::None,
                })
                .collect(),
            chans: Default::default(),
            late: Default::default(),
            ws: (0..self.nw()).map(|_| Ws::Idle).collect(),
            budget: [
                c.losses,
                c.freezes,
                c.drops,
                c.kills,
                c.stalls,
                c.extends,
                c.refreshes,
                c.careless,
                c.steps,
            ],
            idle: 0,
            flags: 0,
        }]
    }

    fn actions(&self, s: &State<K>, out: &mut Vec<Act>) {
        let c = self.world();
        let mut urgent = false;
        // urgent steps pending, per process (a release may interleave with its own process's)
        let mut busy = 0u32;
        let mut calm: Vec<Act> = Vec::new();
        let mut now = |p: usize, a: Act, out: &mut Vec<Act>| {
            urgent = true;
            busy |= 1 << p;
            out.push(a);
        };
        for w in 0..self.nw() {
            let p = self.pw(w as W);
            if !self.running(s, p) {
                continue;
            }
            let a = w as W;
            match s.ws[w] {
                Ws::Idle => now(p, Act::Start(a), out),
                Ws::Waiting(t) => {
                    if let Some(i) = t.inflight {
                        if s.now >= self.timeout_at(&t, i) {
                            now(p, Act::TimeOut(a), out);
                        }
                    } else if t.check {
                        now(p, Act::Attempt(a), out);
                    } else if self.wake_due(s, &t) {
                        now(p, Act::Wake(a), out);
                    }
                }
                Ws::Holding {
                    until,
                    bg,
                    care,
                    call,
                    ..
                } => {
                    if let Some((sent, _, _)) = call {
                        // its lease-setting call waits on the stalled connection
                        if s.now >= sent + c.cmd {
                            now(p, Act::TimeOut(a), out);
                        }
                    }
                    // A user's `extend` in flight holds up the section (a refresh does not).
                    let blocked = matches!(call, Some((_, _, true)));
                    if care {
                        // A careless holder overstays: it releases late, or never.
                        if s.now >= until && !blocked {
                            calm.push(Act::Release(a));
                        }
                    } else if !blocked {
                        // A holder releases before its lease ends (one that does not is
                        // frozen, killed or stalled: the faults; or careless).
                        if s.now + 1 >= until {
                            now(p, Act::Release(a), out);
                        } else {
                            calm.push(Act::Release(a));
                        }
                    }
                    if bg && s.now < until && !s.procs[p].stalled {
                        out.push(Act::BgConfirm(a));
                    }
                    let valid = s.now < until;
                    if valid && call.is_none() && !care {
                        if s.budget[EXTEND] > 0 {
                            calm.push(Act::Extend(a, false));
                            calm.push(Act::Extend(a, true));
                        }
                        if s.budget[REFRESH] > 0 {
                            calm.push(Act::Refresh(a));
                        }
                        if s.budget[CARELESS] > 0 {
                            calm.push(Act::Overstay(a));
                        }
                    }
                }
                Ws::Done => {}
            }
        }
        for p in 0..self.np() {
            let pr = s.procs[p];
            let a = p as Pid;
            let running = pr.run == Run::Running;
            if !s.chans[p].is_empty() {
                if running {
                    now(p, Act::Deliver(a), out);
                }
                if s.budget[LOSS] > 0 {
                    out.push(Act::Lose(a));
                }
            }
            if running && pr.missed {
                now(p, Act::Notice(a), out);
            }
            if running && pr.stalled {
                if pr.draining {
                    now(p, Act::Replay(a), out);
                } else {
                    calm.push(Act::Replay(a));
                }
            }
            if matches!(pr.run, Run::Frozen(_)) {
                calm.push(Act::Resume(a));
            }
            if running && !pr.sub {
                calm.push(Act::Resub(a));
            }
            let active = self.waiters(p).any(|w| s.ws[w] != Ws::Done);
            if running && active {
                if s.budget[FREEZE] > 0 {
                    calm.push(Act::Freeze(a));
                }
                if s.budget[KILL] > 0 {
                    calm.push(Act::Kill(a));
                }
                if s.budget[DROP] > 0 && pr.sub {
                    calm.push(Act::SubDrop(a));
                }
                if s.budget[STALL] > 0 && !pr.stalled {
                    calm.push(Act::Stall(a));
                }
            }
        }
        if s.budget[STEP] > 0 && self.rnow(s) >= c.step {
            calm.push(Act::StepBack);
        }
        for a in calm {
            let bit = match a {
                Act::Freeze(_) => CALM_FREEZE,
                Act::Kill(_) => CALM_KILL,
                Act::SubDrop(_) => CALM_DROP,
                Act::Stall(_) => CALM_STALL,
                Act::Release(_)
                | Act::Extend(..)
                | Act::Refresh(_)
                | Act::Overstay(_)
                | Act::StepBack => CALM_RELEASE,
                Act::Resume(_) | Act::Resub(_) | Act::Replay(_) => CALM_RECOVER,
                _ => 0,
            };
            let own = c.calm & CALM_OWN != 0;
            let others_busy = match a {
                Act::Release(w) if own => busy & !(1 << self.pw(w)) != 0,
                Act::SubDrop(p) | Act::Kill(p) if own => busy & !(1 << p) != 0,
                _ => urgent,
            };
            if !others_busy || c.calm & bit == 0 {
                out.push(a);
            }
        }
        let all_done = s.ws.iter().all(|w| *w == Ws::Done);
        if !urgent && s.now < c.horizon && !all_done {
            out.push(Act::Tick);
        }
    }

    fn next_state(&self, s0: &State<K>, a: Act) -> Option<State<K>> {
        let mut s = self.step(s0, a)?;
        if self.world().retain.is_some() {
            self.settle_keys(&mut s);
        }
        K::settle(self, &mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        K::properties()
    }
}

impl<K: Key> System<K> {
    /// One step (`next_state` is this, then the keys settle: `settle_keys`, `Key::settle`).
    pub fn step(&self, s0: &State<K>, a: Act) -> Option<State<K>> {
        let mut s = s0.clone();
        match a {
            // Time passes; Redis expires keys (PX) -- see `tick`.
            Act::Tick => self.tick(&mut s),
            // mirrors src/wait/notify/mod.rs -> wait: fast path (acquire, no MEMBER), hub.register
            Act::Start(w) => self.start(&mut s, w as usize),
            // mirrors wait's `if check` -> Waiting::attempt -> the acquire script (with MEMBER)
            Act::Attempt(w) => self.attempt(&mut s, w as usize),
            // mirrors wait after its select: take_grant (-> extend), take_watch, the deadline
            // (-> QueueResidue's leave 'G')
            Act::Wake(w) => self.wake(&mut s, w as usize),
            // a holder's lease-setting call reaches its time limit: its outcome is unknown
            // (it may still run): the guard keeps its cut (`pend`), and may send another
            Act::TimeOut(w) if matches!(s.ws[w as usize], Ws::Holding { .. }) => {
                let w = w as usize;
                let p = self.pw(w as W);
                if let Ws::Holding { call, .. } = &mut s.ws[w] {
                    *call = None;
                }
                for c in s.late[p].iter_mut() {
                    if let Call::Renew { w: cw, awaited, .. } = c {
                        if *cw as usize == w {
                            *awaited = false;
                        }
                    }
                }
            }
            // mirrors a call's time limit (Engine::*_on's timeout): Waiting::failed -> Step::Failed
            // -> backoff, or take_grant's transient error -> `check = true`; Redis may still run it
            Act::TimeOut(w) => {
                let w = w as usize;
                let p = self.pw(w as W);
                let mut t = Self::wt(&s, w);
                let kind = t.inflight.take().unwrap();
                for c in s.late[p].iter_mut() {
                    match c {
                        Call::Acquire { w: cw, awaited, .. } | Call::Extend { w: cw, awaited }
                            if *cw as usize == w =>
                        {
                            *awaited = false
                        }
                        _ => {}
                    }
                }
                match kind {
                    // Step::Failed: the backoff
                    Inflight::Attempt { .. } | Inflight::Lease { .. } => {
                        t.timer = Some((s.now + 1).min(t.deadline))
                    }
                    // take_grant's transient error: `check = true; continue`
                    Inflight::Confirm { .. } => t.check = true,
                }
                s.ws[w] = Ws::Waiting(t);
            }
            Act::Release(w) => {
                // LockGuard::release (or its drop): mirrors the release script
                let w = w as usize;
                s.ws[w] = Ws::Done;
                self.issue(&mut s, w, Call::Release { w: w as W });
            }
            // the bug switches only: the old background confirm (extend -> confirm_grant)
            Act::BgConfirm(w) => {
                let w = w as usize;
                let Ws::Holding { until, .. } = s.ws[w] else {
                    return None;
                };
                let ttl = self.world().ttl;
                let until = match K::extend(self, &mut s, w as W, ttl) {
                    Reply::NotHeld => until,
                    _ => until.max(s.now + ttl),
                };
                if let Ws::Holding {
                    until: u, bg, conf, ..
                } = &mut s.ws[w]
                {
                    (*u, *bg, *conf) = (until, false, until);
                }
            }
            // mirrors src/wait/notify/hub/mod.rs -> Hub::deliver
            Act::Deliver(p) => self.deliver(&mut s, p as usize),
            // a fault: the head message on P's subscriber connection is lost (reconnect, lagged)
            Act::Lose(p) => {
                s.chans[p as usize].remove(0);
                s.budget[LOSS] -= 1;
                s.procs[p as usize].missed = true;
            }
            // mirrors hub/tasks.rs -> dispatch: RecvError::Lagged / on_reconnect -> wake_all
            Act::Notice(p) => {
                s.procs[p as usize].missed = false;
                self.wake_all(&mut s, p as usize);
            }
            // a fault: the process freezes (SIGSTOP, a long pause): no timers, no messages read
            Act::Freeze(p) => {
                s.budget[FREEZE] -= 1;
                s.procs[p as usize].run = Run::Frozen(0);
            }
            Act::Resume(p) => {
                // the housekeeper notices a freeze of `notice` ticks or more and wakes every waiter
                let p = p as usize;
                let Run::Frozen(k) = s.procs[p].run else {
                    return None;
                };
                s.procs[p].run = Run::Running;
                if self.rules.thaw {
                    s.procs[p].thawed = true;
                }
                if k >= self.world().notice {
                    self.wake_all(&mut s, p);
                }
            }
            // a fault: the process dies; its connections close (Redis counts no listener)
            Act::Kill(p) => {
                let p = p as usize;
                s.budget[KILL] -= 1;
                K::incident(self, &mut s, Incident::Kill(p));
                for w in self.waiters(p) {
                    s.ws[w] = Ws::Done;
                }
                let pr = &mut s.procs[p];
                pr.run = Run::Killed;
                pr.sub = false;
                pr.stalled = false;
                pr.draining = false;
                pr.missed = false;
                s.chans[p].clear();
                s.late[p].clear();
            }
            // a fault: the subscriber connection drops: messages in flight lost, Redis counts no
            // listener (serve skips and drops its members) until it is re-made
            Act::SubDrop(p) => {
                let p = p as usize;
                s.budget[DROP] -= 1;
                s.procs[p].sub = false;
                s.chans[p].clear();
                K::incident(self, &mut s, Incident::SubDrop(p));
            }
            // mirrors hub/subscriber.rs -> on_reconnect (every slot Pending, wake_all) then sync's confirmation
            // (Confirmed, wake_channel(Resubscribed))
            Act::Resub(p) => {
                let p = p as usize;
                s.procs[p].sub = true;
                s.procs[p].slot_ok = true;
                self.wake_all(&mut s, p);
            }
            // a holder's `extend` with another TTL (LockGuard::extend)
            Act::Extend(w, long) => {
                s.budget[EXTEND] -= 1;
                let c = self.world();
                let ttl = if long { c.ttl_long } else { c.ttl_short };
                self.renew(&mut s, w as usize, ttl, true);
            }
            // a holder's keep-alive refresh (the Refresher), with the holder's TTL
            Act::Refresh(w) => {
                s.budget[REFRESH] -= 1;
                let Ws::Holding { ttl, .. } = s.ws[w as usize] else {
                    return None;
                };
                self.renew(&mut s, w as usize, ttl, false);
            }
            // a careless holder: no release before its lease ends
            Act::Overstay(w) => {
                s.budget[CARELESS] -= 1;
                if let Ws::Holding { care, .. } = &mut s.ws[w as usize] {
                    *care = true;
                }
                K::incident(self, &mut s, Incident::Overstay(w as usize));
            }
            // Redis' clock steps back (an NTP step, a failover to a node whose clock is behind)
            Act::StepBack => {
                s.budget[STEP] -= 1;
                s.back += self.world().step;
                K::incident(self, &mut s, Incident::StepBack);
            }
            // a fault: the client connection stalls: calls wait (fred replays them on reconnect)
            Act::Stall(p) => {
                s.budget[STALL] -= 1;
                s.procs[p as usize].stalled = true;
            }
            Act::Replay(p) => self.replay(&mut s, p as usize),
        }
        Some(s)
    }

    // mirrors src/wait/notify/hub/mod.rs -> Hub::deliver: the head message of P's subscriber
    // connection to its waiter's cell (a grant whose waiter has gone is given back: leave 'o')
    fn deliver(&self, s: &mut State<K>, p: usize) {
        let m = s.chans[p].remove(0);
        match m {
            Msg::Grant { to, fence, px, at } => match &mut s.ws[to as usize] {
                Ws::Waiting(t) => {
                    t.grant = Some(GrantMsg { fence, px, at });
                    t.permit = true;
                }
                _ => {
                    // its waiter has gone: give back this grant only (leave 'o')
                    let c = Call::Leave {
                        w: to,
                        member: false,
                        flag: Flag::O(fence),
                    };
                    self.issue(s, to as usize, c);
                }
            },
            Msg::Watch { to, px, by } => {
                if let Ws::Waiting(t) = &mut s.ws[to as usize] {
                    t.watch_msg = Some((px, by));
                    t.permit = true;
                }
            }
            // `d2`: wake_channel(WakeReason::Resumed), a hub wake
            Msg::Dropped => self.wake_all(s, p),
        }
    }

    // Redis runs the next stalled call (the scripts); a caller still waiting gets the reply
    fn replay(&self, s: &mut State<K>, p: usize) {
        if !s.late[p].is_empty() {
            s.procs[p].draining = true;
            let c = s.late[p].remove(0);
            let r = self.run_call(s, c);
            match c {
                Call::Acquire {
                    w, awaited: true, ..
                } => {
                    let Some(Inflight::Attempt { sent }) = Self::wt(s, w as usize).inflight else {
                        unreachable!()
                    };
                    self.on_attempt(s, w as usize, r, sent);
                }
                Call::Extend { w, awaited: true } => {
                    let kind = Self::wt(s, w as usize).inflight.unwrap();
                    self.on_extend(s, w as usize, r, kind);
                }
                Call::Renew {
                    w, awaited: true, ..
                } => {
                    if let Ws::Holding {
                        call: Some((sent, ttl, _)),
                        ..
                    } = s.ws[w as usize]
                    {
                        self.on_renew(s, w as usize, r, sent, ttl);
                    }
                }
                Call::Acquire { awaited: false, .. }
                    if matches!(r, Reply::Acquired(_) | Reply::Granted(_)) =>
                {
                    // a timed-out attempt took the key for a waiter that does not know it; it
                    // learns at its next attempt (the backoff), or its queue residue gives it back
                    K::incident(self, s, Incident::LateAcquire);
                }
                _ => {}
            }
        }
        if s.late[p].is_empty() {
            s.procs[p].stalled = false;
            s.procs[p].draining = false;
        }
    }

    /// Keys that are gone have no expiry (so that equal Redis states are equal states).
    pub fn settle_keys(&self, s: &mut State<K>) {
        if s.queue.is_empty() {
            s.q_exp = 0;
        }
        if !self.pkey_exists(s) {
            s.p_exp = 0;
        }
    }

    // Time passes: keys expire, records age, dead data is forgotten, the ghosts count.
    fn tick(&self, s: &mut State<K>) {
        let c = self.world();
        K::before_tick(self, s);
        s.now += 1;
        K::expire(self, s);
        // Redis' clock: its keys expire, and its records age, by it.
        let now = self.rnow(s);
        for pr in s.procs.iter_mut() {
            if let Rec::Seen(t) = pr.rec {
                // (a record in Redis' future stays: it ages once Redis' clock passes it)
                if now >= t && now - t > c.presence {
                    pr.rec = Rec::Stale;
                }
            }
            if let Run::Frozen(k) = pr.run {
                pr.run = Run::Frozen((k + 1).min(c.notice));
            }
        }
        for w in s.watchers.iter_mut().flatten() {
            w.0 = clamp(now, w.0);
        }
        // The retention: the queue and the processes hash expire.
        if c.retain.is_some() {
            if s.q_exp != 0 && s.q_exp <= now {
                s.queue.clear();
            }
            if s.p_exp != 0 && s.p_exp <= now {
                self.del_pkey(s);
            }
            self.settle_keys(s);
        }
        self.forget(s);
    }

    /// Dead data is forgotten: past timer values, grant times that can no longer matter,
    /// watch messages' bounds once they have passed (or, counting down, their ticks left).
    fn forget(&self, s: &mut State<K>) {
        let now = self.rnow(s);
        let keep = self.rules.grant_keep;
        // A grant's time (Redis') matters only while its lease could still be used at once (one
        // before Redis' now can no longer be, as Redis' clock only steps back).
        let grant = |at: u8| -> u8 {
            if at + keep <= now {
                0
            } else {
                at
            }
        };
        // (a waiter's timers are its own clock's)
        let local = s.now;
        let mode = self.rules.watch_msg;
        let watch = |px: &mut u8, by: &mut u8| match mode {
            WatchMsg::Bound if *by <= local => *by = 0,
            WatchMsg::Countdown => *px = px.saturating_sub(1),
            _ => {}
        };
        let past = |x: &mut u8| {
            if *x <= local {
                *x = 0;
            }
        };
        for ws in s.ws.iter_mut() {
            match ws {
                Ws::Waiting(t) => {
                    if let Some(x) = t.watch.as_mut() {
                        past(x);
                    }
                    if let Some(x) = t.timer.as_mut() {
                        past(x);
                    }
                    if let Some(g) = t.grant.as_mut() {
                        g.at = grant(g.at);
                    }
                    if let Some((px, by)) = t.watch_msg.as_mut() {
                        watch(px, by);
                    }
                }
                Ws::Holding { until, conf, .. } if self.rules.clamp => {
                    past(until);
                    past(conf);
                }
                _ => {}
            }
        }
        for ch in s.chans.iter_mut() {
            for m in ch.iter_mut() {
                match m {
                    Msg::Grant { at, .. } => *at = grant(*at),
                    Msg::Watch { px, by, .. } => watch(px, by),
                    _ => {}
                }
            }
        }
    }
}
