//! The lock's Redis side (protocol format 3): the scripts of `src/redis/lua/` (acquire,
//! release, extend, leave: `Queue::acquire`, `release`, `extend`, `leave`), each one atomic
//! step, with one function per local function of `lock.lua` that holds the lock's state
//! (same names: `lapse`, `next_fence`, `fence_flags`, `serve`, `release_held`,
//! `confirm_grant`, `enqueue`, `held_by`, `holder_pid`; `listener`, `process`, `seen`,
//! `watch`, `watching`, `keep`, `retain` are shared, `queue.rs`); every function says what it
//! mirrors. Its state: the lock (`p q h g`), the fence counter with its queued and pending
//! hints and its retention. Its properties and their ghosts are in `lock/bound.rs`.

mod bound;
mod words;

use crate::system::*;

pub use bound::{
    COST_CARELESS, COST_DROP, COST_GRANT, COST_KILL, COST_LATE_ACQUIRE, COST_STALLED_CALL,
    COST_STEP, FENCE_REGRESS, FENCE_STALE, LATE_END, OVER_LEASE, SHORT_RETURN,
};

/// The lock model.
pub type Queue = System<LockKey>;
/// A state of the lock model.
pub type St = State<LockKey>;

/// The bug switches: the old behaviour of the two reproduced findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The protocol as it is.
    None,
    /// Finding 1 (commit b5d1a59): every grant is a short grant (claim window) and its waiter
    /// uses it at once, its guard valid for the claim window only, confirmed later in the
    /// background.
    ShortLeaseBackgroundConfirm,
    /// Finding 2: the waiter assumes its own (longer) claim window, `min(ttl, own_claim)`,
    /// instead of the PX the grant message says.
    OwnClaimWindow,
}

/// The lock model's parameters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// The processes, the times, the faults (shared with the permits model).
    pub world: World,
    /// The claim window: a short grant's PX is `min(ttl, claim)`.
    pub claim: u8,
    /// `Bug::OwnClaimWindow`: the waiter's own claim window.
    pub own_claim: u8,
    /// (f): a returned guard must be valid until at least `reference + ttl - slack`.
    pub slack: u8,
    pub bug: Bug,
    /// One behaviour of the code taken back to what it was before the fix of one of the
    /// findings F1–F7, R1–R5 (`None`: the code as it is). The finding tests replay each
    /// finding's trace with its behaviour reverted (it breaks its property) and as implemented
    /// (it does not).
    pub revert: Option<Revert>,
    /// Incident costs left out of the idle bound (COST_* bits; experiments only).
    pub no_cost: u8,
    /// One rule of protocol 4's grant broken, or protocol 3's grant (`None`: as implemented).
    /// Each breaking mutation has a counterexample (`tests/exhaustive.rs`, "protocol 4").
    pub grant: Option<Grant>,
}

/// Protocol 4's grant rule taken apart (`Cfg::grant`): the grant learns whether its head
/// listens from its own message (`SPUBLISH`'s count of receivers), and keeps the two
/// watchers as they are unless the grant makes one of them unfit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Protocol 3: every grant chooses the watchers again (their processes' liveness read, the
    /// back of the queue read when they do not do).
    ChooseAlways,
    /// Mutation: a grant whose message nobody received stands (the head's process does not
    /// listen: it died, or its subscriber connection dropped).
    StandsUnheard,
    /// The first cut of the rule: a watcher of the new holder's process is chosen again (it
    /// would fail with it; a newcomer's queueing attempt replaces it all the same). No
    /// property needs it within the model's world, and it made half the grants of a queue of
    /// four processes choose again.
    ChooseForHolders,
    /// Mutation: a watcher that is no longer queued (granted, or dropped by this walk or
    /// an earlier one) is kept.
    KeepDeparted,
    /// Mutation: a grant nobody heard keeps the fence it took (the counter not put back), so
    /// an acquire that took the free lock, then served a queue whose head was unheard, returns
    /// a fence that is not its hold's (found by this model, (c2)).
    UnheardFenceKept,
    /// Mutation: a watcher that would look after the new lease ends is kept, not told again.
    KeepLate,
}

/// The behaviours that findings F1–F7 changed, each as it was before its fix (`Cfg::revert`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revert {
    /// F1: `watching()` makes a new member a watcher whenever a watcher field is free, whatever
    /// its process (now: two processes, and a newcomer replaces a watcher of the holder's
    /// process, when Redis knows it: '!h').
    F1Watchers,
    /// F2: a queue scan drops the waiters of a lapsed process silently (now: it publishes `d2`
    /// to that process if it listens, and its waiters look again).
    F2Lapse,
    /// F3: extend's renewal `{1}` carries no fence, and the guard keeps the fence in hand (now:
    /// `{1, fence}`, and the guard uses it).
    F3Fence,
    /// F4: a wake-up from the hub that finds a watch message in the cell is taken as that
    /// message, no look (now: a hub wake always makes the waiter look).
    F4Wake,
    /// F5: a release that finds the lock free does nothing (now: if the fence says waiters
    /// are queued, it serves them).
    F5Release,
    /// F6: a grant's confirmation (and an attempt's `full_lease` extend) has the command
    /// timeout as its limit (now: the wait's attempt limit, cut to the deadline).
    F6Limit,
    /// F7: the holder's process ('!h') stays unknown after a lock was taken free (state 'p'):
    /// acquire.lua's `p` -> `q` records nothing, and extend and leave call `watch(nil, ..)`
    /// (now: the first member queued behind a lock taken free records the holder's process,
    /// parsed from its token, `held_by(..)`; extend's `watch` skips the caller's process,
    /// the holder's, and leave's skips `holder_pid()`, 3c87246). This is the code of 8d0d2c8.
    F7Holder,
    /// Review 2, finding 1: a guard kept the larger of its deadlines (`Lease::renewed`'s
    /// `max`), so an `extend` to a shorter TTL shortened Redis' lease but not the guard's
    /// validity (now: the latest confirmed call's lease, cut at the send by every call whose
    /// outcome is unknown).
    R1Lease,
    /// Review 2, finding 2: a queued attempt that took the free lock as the oldest live waiter
    /// (serve's `'self'`) did not choose the watchers again (now: `watch(HUB, TTL)`).
    R2SelfWatch,
    /// Review 2, finding 3: the queue's TTL was the retention from the last *new* member, the
    /// processes hash's from its last new field, the fence counter's the retention from the
    /// last acquisition (and `{1}`/extend answered fence 0 / no fence once it was gone). Now
    /// every queueing attempt and every call that sets the lease with waiters queued keeps
    /// them the lease plus the retention, the counter lives its lease plus the retention, and
    /// a vanished counter is started again.
    R3Retention,
    /// Review 2, finding 4: a process record in Redis' future (a backward clock step) counted
    /// as fresh (now: only `0 <= now - seen <= presence`).
    R4Future,
    /// Found by this model once holders could overstay (careless): `watch` took a watcher
    /// from the holder's own process only when no other process waited, so with one other
    /// process, frozen, and a holder that overstays its lease without a fault, its own
    /// process's waiters slept with the lock free (now: whenever fewer than two are chosen).
    R5Fill,
}

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg {
            world: World::default(),
            claim: 2,
            own_claim: 4,
            slack: 1,
            bug: Bug::None,
            revert: None,
            no_cost: 0,
            grant: None,
        }
    }
}

/// Lock states (`lock.lua` header): taken free (`p`), held with waiters maybe queued (`q`),
/// handed by a full grant not claimed yet (`h`), handed by a short grant not confirmed (`g`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum LockSt {
    P,
    Q,
    H,
    G,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lock {
    pub st: LockSt,
    pub holder: W,
    /// Redis expires the key when `now` reaches this.
    pub exp: u8,
}

/// The lock's keys (besides the queue and the processes hash) and its properties' ghosts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, Default)]
pub struct LockKey {
    pub lock: Option<Lock>,
    /// Fence counter (0: no key yet), its queued hint and pending short-grant process.
    pub fence: u8,
    pub fence_q: bool,
    pub fence_pending: Option<Pid>,
    /// With a retention: when the fence counter expires (Redis time; 0: no expiry, or no key),
    /// and whether it is gone (`fence` keeps the highest fence given: a vanished counter is
    /// started again above it, from Redis' clock).
    pub f_exp: u8,
    pub f_gone: bool,
    // ghosts
    /// The idle bound so far: the sum of the costs of the incidents since the last acquisition.
    pub allowance: u8,
    /// The highest fence of a returned guard.
    pub top_fence: u8,
}

/// What `serve` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    Me,
    Granted,
    Empty,
}

/// A set of at most one process (`skip`, `'!h'`), a bit.
fn one(p: Option<usize>) -> u8 {
    p.map_or(0, |p| 1 << p)
}

impl Key for LockKey {
    type Cfg = Cfg;
    type WKey = bool;
    type PKey = bool;
    const ALIKE: bool = true;
    const ATTEMPT: &'static str = "checks the lock (acquire with its queue member)";

    fn world(cfg: &Cfg) -> &World {
        &cfg.world
    }

    fn rules(cfg: &Cfg) -> Rules {
        let r = |x: Revert| cfg.revert == Some(x);
        Rules {
            watch_msg: WatchMsg::Bound,
            clamp: false,
            drop_stale_watch: true,
            thaw: true,
            bg_confirm: cfg.bug == Bug::ShortLeaseBackgroundConfirm,
            own_claim: (cfg.bug == Bug::OwnClaimWindow).then_some(cfg.own_claim),
            grant_keep: if cfg.bug == Bug::None {
                1
            } else {
                cfg.world.ttl.max(cfg.own_claim)
            },
            fence_in_hand: r(Revert::F3Fence),
            absorb_hub_wake: r(Revert::F4Wake),
            cmd_limit: r(Revert::F6Limit),
            max_lease: r(Revert::R1Lease),
            keep: !r(Revert::R3Retention),
            future_fresh: r(Revert::R4Future),
        }
    }

    fn init(_: &Cfg) -> LockKey {
        LockKey::default()
    }

    fn acquire(m: &Queue, s: &mut St, w: W, member: bool) -> Reply {
        m.acquire(s, w, member)
    }
    fn release(m: &Queue, s: &mut St, w: W) -> Reply {
        m.release(s, w)
    }
    fn extend(m: &Queue, s: &mut St, w: W, ttl: u8) -> Reply {
        m.extend(s, w, ttl)
    }
    fn leave(m: &Queue, s: &mut St, w: W, member: bool, flag: Flag) -> Reply {
        m.leave(s, w, member, flag)
    }

    fn guard(m: &Queue, s: &mut St, w: usize, fence: u8, until: u8, reference: u8) {
        m.returned(s, w, fence, until, reference)
    }
    fn incident(m: &Queue, s: &mut St, i: Incident) {
        m.incident(s, i)
    }
    fn before_tick(m: &Queue, s: &mut St) {
        m.before_tick(s)
    }
    fn expire(m: &Queue, s: &mut St) {
        m.expire(s)
    }
    fn settle(m: &Queue, s: &mut St) {
        m.settle(s)
    }
    fn properties() -> Vec<stateright::Property<Queue>> {
        bound::properties()
    }

    fn each_fence(&mut self, f: &mut impl FnMut(&mut u8)) {
        f(&mut self.fence);
        f(&mut self.top_fence);
    }
    /// Whether the waiter holds the lock.
    fn wkey(s: &St, w: usize) -> bool {
        s.key.lock.is_some_and(|l| l.holder as usize == w)
    }
    /// Whether the fence's pending short grant is the process's.
    fn pkey(s: &St, p: usize) -> bool {
        s.key.fence_pending == Some(p as Pid)
    }
    fn rename(&mut self, wm: &impl Fn(W) -> W, pm: &impl Fn(Pid) -> Pid) {
        if let Some(l) = self.lock.as_mut() {
            l.holder = wm(l.holder);
        }
        self.fence_pending = self.fence_pending.map(pm);
    }

    fn start_words(m: &Queue, s: &St, n: &St, w: W) -> &'static str {
        m.start_words(s, n, w)
    }
    fn tick_words(_: &Queue, s: &St, n: &St) -> String {
        if s.key.lock.is_some() && n.key.lock.is_none() {
            "; Redis expires the lock".into()
        } else {
            String::new()
        }
    }
    fn effects(m: &Queue, s: &St, n: &St, a: &Act, at: Part, eff: &mut Vec<String>) {
        m.effects(s, n, a, at, eff)
    }
    fn guard_note(m: &Queue, s: &St, n: &St, a: &Act, w: usize) -> String {
        m.guard_note(s, n, a, w)
    }
    fn summary_head(m: &Queue, s: &St) -> String {
        format!("the lock is {}", m.lock_words(s.key.lock))
    }
    fn summary_tail(_: &Queue, s: &St) -> String {
        format!(
            "; idle ticks since the last acquisition: {}, bound for the incidents since: {}",
            s.idle, s.key.allowance
        )
    }
}

impl Queue {
    /// Whether `r`'s behaviour is taken back to before its fix.
    fn reverted(&self, r: Revert) -> bool {
        self.cfg.revert == Some(r)
    }

    /// queue.lua's `watch(skip, px, later)` for the lock: `skip` one process or none, the
    /// skipped one filled in when fewer than two are chosen (R5 reverted: only when none is).
    fn watch_but(&self, s: &mut St, skip: Option<usize>, px: u8, later: bool) {
        let fill = !self.reverted(Revert::R5Fill);
        self.watch(s, one(skip), px, later, fill, None);
    }

    // mirrors queue_watch.lua -> Key.watch_granted(pid, px): protocol 4's watchers at a one-key
    // grant to process `p` for `px`: both fields set, both watchers still queued, and each
    // looking no later than the new lease ends: kept as they are (no read of their processes,
    // no message, nothing written; one of `p` too); else chosen again, as `watch` does.
    // (Protocol 3, `Grant::ChooseAlways`: always chosen again.)
    fn watch_granted(&self, s: &mut St, p: usize, px: u8) {
        let g = self.cfg.grant;
        let until = self.rnow(s) + px;
        let fit = |w: Option<(u8, W)>| match w {
            None => false,
            Some((at, m)) => {
                (self.pw(m) != p || g != Some(Grant::ChooseForHolders))
                    && (s.queue.contains(&m) || g == Some(Grant::KeepDeparted))
                    && (at <= until || g == Some(Grant::KeepLate))
            }
        };
        if g != Some(Grant::ChooseAlways) && fit(s.watchers[0]) && fit(s.watchers[1]) {
            return;
        }
        self.watch_but(s, Some(p), px, false);
    }

    // mirrors queue.lua -> Key.lapse(pid): only if the processes hash exists
    fn lapse(&self, s: &mut St, p: usize) {
        if self.pkey_exists(s) {
            s.procs[p].rec = Rec::Lapsed;
        }
    }

    /// The fence counter's expiry after a write for the lease `px` (the lease plus the
    /// retention; R3 reverted: the retention alone).
    fn fence_life(&self, s: &St, px: u8) -> u8 {
        match self.world().retain {
            None => 0,
            Some(r) if self.reverted(Revert::R3Retention) => self.rnow(s) + r,
            Some(r) => self.rnow(s) + r + px,
        }
    }

    // mirrors lock.lua -> next_fence(queued, hub, px): the counter lives the lease `px`
    // plus the retention (R3 reverted: the retention)
    fn next_fence(&self, s: &mut St, queued: bool, pending: Option<Pid>, px: u8) -> u8 {
        let life = self.fence_life(s, px);
        let k = &mut s.key;
        k.fence += 1;
        k.fence_q = queued;
        k.fence_pending = pending;
        k.f_gone = false;
        k.f_exp = life;
        k.fence
    }

    // mirrors lock.lua -> Key.fence_flags(queued, hub, old, px): the fence's hints, same
    // number; with `px` the counter lives that lease plus the retention (R3 reverted: its TTL
    // is kept); a vanished counter is started again from Redis' clock (above every fence)
    fn fence_flags(&self, s: &mut St, queued: bool, pending: Option<Pid>, px: Option<u8>) -> u8 {
        let r3 = self.reverted(Revert::R3Retention);
        let restart = match self.world().retain {
            Some(r) => self.rnow(s) + r + px.filter(|_| !r3).unwrap_or(0),
            None => 0,
        };
        let life = px.map(|px| self.fence_life(s, px));
        let k = &mut s.key;
        k.fence_q = queued;
        k.fence_pending = pending;
        if k.f_gone || k.fence == 0 {
            k.fence += 1;
            k.f_gone = false;
            k.f_exp = restart;
        } else if let Some(life) = life {
            if !r3 {
                k.f_exp = life;
            }
        }
        k.fence
    }

    // mirrors lock.lua -> Key.held_by(pid): '!h' = hub, or HDEL when hub is '' (unknown)
    fn held_by(&self, s: &mut St, hub: Option<usize>) {
        s.holder_pid = hub.map(|p| p as Pid);
    }

    // mirrors lock.lua -> Key.holder_pid(): HGET '!h' ('' = unknown)
    fn holder_pid(&self, s: &St) -> Option<usize> {
        s.holder_pid.map(|p| p as usize)
    }

    // mirrors lock.lua -> short(ttl): a short grant is always shorter than the TTL
    // (half of it within the claim window), so that its waiter always confirms it
    fn short(&self, ttl: u8) -> u8 {
        if ttl > self.cfg.claim {
            self.cfg.claim
        } else {
            (ttl / 2).max(1)
        }
    }

    // mirrors lock.lua -> Key.serve(self): hand the lock to the oldest live waiter
    fn serve(&self, s: &mut St, me: Option<W>) -> Served {
        let ttl = self.world().ttl;
        let mut i = 0;
        let (mut told, mut unheard) = (0u32, 0u32);
        while i < s.queue.len() {
            let head = s.queue[i];
            if Some(head) == me {
                s.queue.drain_front(i + 1);
                return Served::Me;
            }
            let p = self.pw(head);
            let mut st = self.process(s, p);
            let g = self.cfg.grant;
            if st == Status::Gone && s.procs[p].rec != Rec::Lapsed && g != Some(Grant::ChooseAlways)
            {
                // Protocol 4 asks nobody whether `p` listens: its grant's message does (the
                // fence is taken first, and given back when nobody hears it), once per process
                let fresh = self.recent(s, p);
                if g == Some(Grant::StandsUnheard) {
                    // (the grant stands, though nobody received it)
                    st = if fresh { Status::Fresh } else { Status::Stale };
                } else if unheard & (1 << p) == 0 {
                    unheard |= 1 << p;
                    let px = if fresh { ttl } else { self.short(ttl) };
                    if g == Some(Grant::UnheardFenceKept) {
                        let (q, pending) = (s.key.fence_q, s.key.fence_pending);
                        self.next_fence(s, q, pending, px);
                    } else if !s.key.f_gone && s.key.fence != 0 {
                        // (`hand`: the counter is put back as it was, with the life the
                        // grant's `next_fence` gave it; a vanished one vanishes again)
                        s.key.f_exp = self.fence_life(s, px);
                    }
                }
            }
            if s.procs[p].rec == Rec::Lapsed
                && told & (1 << p) == 0
                && !self.reverted(Revert::F2Lapse)
            {
                // `p.lapsed and not p.told`: a process whose waiters are dropped is told so
                // ('d2') if it still listens
                told |= 1 << p;
                if self.listener(s, p) {
                    self.publish(s, p, Msg::Dropped);
                }
            }
            if st != Status::Gone {
                s.queue.drain_front(i + 1);
                let full = st == Status::Fresh && self.cfg.bug != Bug::ShortLeaseBackgroundConfirm;
                let px = if full { ttl } else { self.short(ttl) };
                let more = !s.queue.is_empty();
                let pending = if more && !full { Some(p as Pid) } else { None };
                let f = self.next_fence(s, more, pending, px);
                let now = self.rnow(s);
                s.key.lock = Some(Lock {
                    st: if full { LockSt::H } else { LockSt::G },
                    holder: head,
                    exp: now + px,
                });
                s.holder_pid = Some(p as Pid); // '!h' = hub (written by `watch`, with its fields)
                let g = Msg::Grant {
                    to: head,
                    fence: f,
                    px,
                    at: now,
                };
                self.publish(s, p, g);
                self.watch_granted(s, p, px);
                if more {
                    self.keep(s, px, false);
                } else if !self.reverted(Revert::R3Retention) {
                    self.retain(s);
                }
                self.charge_grant(s, p, px);
                return Served::Granted;
            }
            i += 1;
        }
        // Every member scanned was dropped (the model scans without the 200 bound).
        s.queue.clear();
        Served::Empty
    }

    // mirrors lock.lua -> Key.enqueue(pttl)
    fn enqueue(&self, s: &mut St, w: W, pttl: u8) -> Reply {
        let p = self.pw(w);
        self.seen(s, Some(p), true);
        // `add_member`: at the back, once (its score never below the last member's, so the
        // queue's order is the order of arrival, as here, also across a clock step)
        if !s.queue.contains(&w) {
            s.queue.push(w);
            if let (Some(r), true) = (self.world().retain, self.reverted(Revert::R3Retention)) {
                s.q_exp = self.rnow(s) + r; // the old `PEXPIRE q RETAIN` on a new member
            }
        }
        self.fence_flags(s, true, s.key.fence_pending, None);
        let deaf = !self.listener(s, p);
        // HGET pkey '!h': a newcomer may replace a watcher of the holder's process, if known
        // (F1 reverted: its own field, else the first free one)
        let f1 = self.reverted(Revert::F1Watchers);
        let watcher = self.watching(s, w, pttl, one(self.holder_pid(s)), f1);
        if watcher && self.reverted(Revert::R3Retention) {
            self.retain(s); // (now `enqueue` keeps the hash)
        }
        // the first member keeps the queue (later ones find it kept: by the first, or by the
        // calls that set the lease since)
        if s.queue.len() == 1 {
            self.keep(s, pttl, true);
        }
        Reply::Locked {
            remaining: pttl,
            queued: Some(Queued {
                fence: s.key.fence,
                deaf,
                watcher,
            }),
        }
    }

    // mirrors src/redis/lua/acquire.lua (with MEMBER when `member`; HUB is '' without it)
    fn acquire(&self, s: &mut St, w: W, member: bool) -> Reply {
        let p = self.pw(w);
        let hub = if member { Some(p) } else { None };
        let now = self.rnow(s);
        let ttl = self.world().ttl;
        match s.key.lock {
            None => {
                s.key.lock = Some(Lock {
                    st: LockSt::P,
                    holder: w,
                    exp: now + ttl,
                });
                let (old_q, old_pending) = (s.key.fence_q, s.key.fence_pending);
                let f = self.next_fence(s, false, None, ttl);
                if !old_q {
                    return Reply::Acquired(f);
                }
                if let Some(pp) = old_pending {
                    if Some(pp as usize) != hub {
                        self.lapse(s, pp as usize);
                    }
                }
                self.seen(s, hub, false);
                match self.serve(s, if member { Some(w) } else { None }) {
                    Served::Me | Served::Empty => {
                        let more = !s.queue.is_empty();
                        if more {
                            s.key.lock.as_mut().unwrap().st = LockSt::Q;
                            self.held_by(s, hub);
                            // the caller holds now: the watchers are chosen again (R2 reverted:
                            // not)
                            if !self.reverted(Revert::R2SelfWatch) {
                                self.watch_but(s, hub, ttl, false);
                            }
                            self.keep(s, ttl, false);
                        } else {
                            self.del_pkey(s);
                        }
                        self.fence_flags(s, more, None, Some(ttl));
                        Reply::Acquired(f)
                    }
                    Served::Granted => {
                        let px = s.key.lock.unwrap().exp - now;
                        if !member {
                            return Reply::Locked {
                                remaining: px,
                                queued: None,
                            };
                        }
                        self.enqueue(s, w, px)
                    }
                }
            }
            Some(l) if l.holder == w => {
                if l.st == LockSt::G {
                    let f = self.confirm_grant(s, w, ttl);
                    self.watch_but(s, hub, ttl, true);
                    return Reply::Granted(f);
                }
                if l.st == LockSt::H {
                    s.key.lock.as_mut().unwrap().st = LockSt::Q;
                }
                let remaining = l.exp - now;
                // a vanished counter is started again (R3 reverted: fence 0)
                let fence = if s.key.f_gone && self.reverted(Revert::R3Retention) {
                    0
                } else if s.key.f_gone {
                    self.fence_flags(s, l.st != LockSt::P, None, Some(remaining))
                } else {
                    s.key.fence
                };
                Reply::AlreadyHeld { fence, remaining }
            }
            Some(l) => {
                let pttl = l.exp - now;
                if !member {
                    return Reply::Locked {
                        remaining: pttl,
                        queued: None,
                    };
                }
                if l.st == LockSt::P {
                    // the first waiter behind a lock taken free: SETRANGE 'q', and
                    // `held_by(<hub> of the holder's token "<hub>/<uuid>">)` (every token of the
                    // model has its process; a polling locker's or a fixed token would give '')
                    s.key.lock.as_mut().unwrap().st = LockSt::Q;
                    if !self.reverted(Revert::F7Holder) {
                        self.held_by(s, Some(self.pw(l.holder)));
                    }
                }
                self.enqueue(s, w, pttl)
            }
        }
    }

    // mirrors lock.lua -> Key.confirm_grant (`ttl`: the call's TTL)
    fn confirm_grant(&self, s: &mut St, w: W, ttl: u8) -> u8 {
        s.key.lock = Some(Lock {
            st: LockSt::Q,
            holder: w,
            exp: self.rnow(s) + ttl,
        });
        self.seen(s, Some(self.pw(w)), true);
        let queued = s.key.fence_q;
        if queued {
            self.keep(s, ttl, false);
        }
        self.fence_flags(s, queued, None, Some(ttl))
    }

    // mirrors src/redis/lua/release.lua (HUB: the guard's process)
    fn release(&self, s: &mut St, w: W) -> Reply {
        let Some(l) = s.key.lock else {
            if s.key.fence_q && !self.reverted(Revert::F5Release) {
                // The lease ran out before this release and nobody took the lock, waiters
                // queued: lapse a pending short grant (not the caller's process), SET the lock
                // 'q'..TOKEN PX CLAIM and release_held('q'): serve them, or delete everything.
                // No `seen(HUB)`, no fence for the caller; the reply is {0} (or {0, 4}).
                if let Some(pp) = s.key.fence_pending {
                    if pp as usize != self.pw(w) {
                        self.lapse(s, pp as usize);
                    }
                }
                s.key.lock = Some(Lock {
                    st: LockSt::Q,
                    holder: w,
                    exp: self.rnow(s) + self.world().ttl.min(self.cfg.claim),
                });
                self.release_held(s, LockSt::Q);
            }
            return Reply::NotHeld;
        };
        if l.holder != w {
            return Reply::NotHeld;
        }
        if l.st == LockSt::P {
            s.key.lock = None;
            return Reply::Done;
        }
        // (read: by the grant's walk; a queue that is empty deletes the hash)
        self.seen(s, Some(self.pw(w)), true);
        self.release_held(s, l.st)
    }

    // mirrors lock.lua -> Key.release_held(state): serve the queue or delete
    fn release_held(&self, s: &mut St, st: LockSt) -> Reply {
        if st != LockSt::P {
            if self.serve(s, None) == Served::Granted {
                return Reply::Done;
            }
            self.fence_flags(s, false, None, None);
            self.del_pkey(s);
        }
        s.key.lock = None;
        Reply::Done
    }

    // mirrors src/redis/lua/extend.lua: `{3, fence}` a short grant confirmed, `{1, fence}` renewed;
    // the watchers are told when the lease now ends (`watch(HUB, TTL, true)`: they skip the
    // caller's process, the holder's; F7 reverted: `watch(nil, TTL, true)`)
    fn extend(&self, s: &mut St, w: W, ttl: u8) -> Reply {
        let Some(l) = s.key.lock else {
            return Reply::NotHeld;
        };
        if l.holder != w {
            return Reply::NotHeld;
        }
        let hub = if self.reverted(Revert::F7Holder) {
            None
        } else {
            Some(self.pw(w))
        };
        if l.st == LockSt::G {
            let f = self.confirm_grant(s, w, ttl);
            self.watch_but(s, hub, ttl, true);
            return Reply::Confirmed(f);
        }
        let now = self.rnow(s);
        let lock = s.key.lock.as_mut().unwrap();
        if l.st == LockSt::H {
            lock.st = LockSt::Q;
        }
        lock.exp = now + ttl;
        // GETEX PX retention + TTL (R3 reverted: the retention)
        let gone = s.key.f_gone;
        if !gone {
            s.key.f_exp = self.fence_life(s, ttl);
        }
        if l.st != LockSt::P {
            self.watch_but(s, hub, ttl, true);
            self.keep(s, ttl, false);
        }
        if !gone {
            return Reply::Renewed(s.key.fence);
        }
        // the counter is gone: `{1}` without a fence (R3 reverted), else started again
        if self.reverted(Revert::R3Retention) {
            return Reply::Renewed(0);
        }
        Reply::Renewed(self.fence_flags(s, l.st != LockSt::P, None, Some(ttl)))
    }

    // mirrors src/redis/lua/leave.lua (the model's leaves: the queue residue's 'G', the
    // dispatcher's 'o' for a grant whose waiter has gone); a member that leaves: `watch(
    // holder_pid(), pttl)` (F7 reverted: `watch(nil, pttl)`)
    fn leave(&self, s: &mut St, w: W, member: bool, flag: Flag) -> Reply {
        if member {
            if let Some(i) = s.queue.iter().position(|&m| m == w) {
                s.queue.remove(i);
                let now = self.rnow(s);
                let pttl = s.key.lock.map_or(0, |l| l.exp - now);
                let skip = if self.reverted(Revert::F7Holder) {
                    None
                } else {
                    self.holder_pid(s)
                };
                self.watch_but(s, skip, pttl, false);
            }
        }
        let Some(l) = s.key.lock else {
            return Reply::NotHeld;
        };
        if l.holder != w {
            return Reply::NotHeld;
        }
        if let Flag::O(f) = flag {
            if !matches!(l.st, LockSt::H | LockSt::G) || s.key.fence != f {
                return Reply::NotHeld;
            }
        }
        self.release_held(s, l.st)
    }
}
