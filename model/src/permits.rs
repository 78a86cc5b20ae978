//! An exhaustive model of waitlock's permits (the fair counting semaphore of `src/permits.rs`),
//! checked with stateright 0.31 (see `tests/permits.rs` and the "Permits" section of
//! `README.md`).
//!
//! **What it is.** One key of `permits` (3) permits. Redis is one state machine whose
//! transitions are the permit scripts of `src/redis/lua/` (`permit_acquire.lua`,
//! `permit_release.lua`, `permit_extend.lua`, `permit_leave.lua`: `Permits::acquire`,
//! `release`, `extend`, `leave`), each one atomic step, with one function per stateful
//! function of `permits.lua` (same names: `state`, `drop_holder`, `purge`, `claim`,
//! `holding`, `rewatch`, `first_end`, `next_fence`, `hold`, `settle`, `serve`, `after_serve`,
//! `serve_freed`, `give_back`; `first_hub`: `holding()`'s second value, and as it was for
//! `Revert::P2FirstHub`) and of `common.lua` that they use (`listener`, `process`, `publish`,
//! `seen`, `watch(skip, px, later, fill, last)` with `skip` a set of processes,
//! `watching(pttl, holding)`). Redis
//! state: the holders (token → lease end, and the holder fences hash: fence and whether the
//! hold is an unclaimed grant, `"<fence> g"`), the state key's fence and `used`, the FIFO
//! queue, the processes hash (seen ticks and the two watcher fields `'!w1'`, `'!w2'`), and the
//! messages `g2` and `w2` in flight (one FIFO per subscriber connection).
//!
//! Three processes with two waiters each (one `Semaphore::acquire_wait` each, its own token
//! `w<weight>:<hub>/<uuid>`); every process has the same two weights (`Cfg::weights`, 2 and
//! 1 by default), so a heavy head can be unable to fit while a lighter waiter behind it could.
//! The waiter is the lock's (`src/wait/notify/mod.rs::wait` and `take_grant`:
//! `Permits::start`, `attempt`, `on_attempt`, `wake`, `take_grant`, with
//! `Request::full_lease`), the dispatcher's `deliver` (a grant whose waiter has gone is given
//! back with leave `o` and its fence), the queue residue's leave `G` at the deadline, and the
//! guard's release (`permit_release.lua`).
//!
//! **Time** is a tick (`now`); the clock runs only while nothing is due (as in the lock model:
//! timers, messages and replies of running processes are urgent). A lease ends at
//! `run tick + TTL`; a lease whose end has passed is dropped by the next script (`purge`,
//! unbounded here), and the holders key expires with its last lease. A guard's `valid_until`
//! is computed as the client does: from the send tick of the call that set the lease, or for a
//! grant message from the anchor (the queueing attempt: every call here runs in the tick it is
//! sent, so `since` is the grant's tick); the drift margin is below a tick (0). Every lease is
//! the same TTL from the call that sets it, so the holders are kept in the order their leases
//! were set, which is the order of their ends in Redis (`first_end`, `first_hub` and `ZRANGE
//! HOLDERS 0 0`), also for leases that end in the same tick here; `holding()` reads every
//! holder (at most 6 here, the scripts read 16).
//!
//! **Faults**, budgeted: a message lost (the hub then wakes the process's waiters), a process
//! frozen and resumed (a freeze of `notice` ticks or more is noticed: its waiters look), a
//! process killed (its leases run out; Redis sees nobody listening).
//!
//! **Abstractions**: no subscriber-connection drops and no stalled client connections (every
//! call runs in the tick it is sent, and its reply comes at once: the `{5}` limit mismatch, the
//! `deaf` reply and the attempt's time limits never happen); the purge and the queue scan are
//! unbounded (PURGE 16, SCAN 200: the "look now" `w2 0` of `after_serve`, sent when the head
//! fits after a scan stopped at its bound, never happens here); the state key outlives every
//! lease (no retention); every waiter starts at tick 0, has the same TTL and deadline; holders
//! do not refresh (extend runs only as `full_lease`'s confirm of a grant or renewal of a hold
//! found by an attempt) and release before their lease ends unless frozen or killed; voluntary
//! steps (a release, a freeze, a kill, a resume) happen between cascades of urgent steps,
//! though a release or a kill may still interleave with its own process's pending steps
//! (`CALM_OWN`, as in the lock model); processes are renamed into a canonical form (symmetry:
//! every process has the same weights) and fences renumbered by rank.
//!
//! **Findings** (`tests/permits.rs`, README "Permits"), each fixed in the scripts (commit
//! "Permits: fix three findings of the permits model"; P2 again in commit "Permits: watchers
//! preferably outside the holders' processes, chosen again whenever permits come free", and
//! its fill in commit "Permits: when the watchers must come from holders' processes, the first
//! lease's process last") and kept as `Cfg::revert` (the fill as `Cfg::fill_first_last`
//! false): P1 (1) failed without any fault: a waiter whose attempt crossed its
//! own grant message returned a guard from the `{1, pttl, fence}` reply, and the dispatcher
//! then gave that grant back (leave `o`, its fence matched) while the guard was in use
//! (`Revert::P1Claim`). P2 (2b) failed in freeze + kill: the watchers could be waiters of a
//! holder's process (`Revert::P2Watchers`); the first fix, skipping only the first lease's
//! process (`Revert::P2FirstHub`), failed with one freeze. P3: a dead head that did not fit held
//! back lighter live waiters (`Revert::P3DeadFirst`). The fill: with two of three processes
//! holding, the fill could take the watcher of the holders' processes from the first lease's
//! one, and the two watchers' processes frozen and killed left a waiter idle for a tick (now
//! that process is taken last). The late watch message: (2b) failed in freeze + kill only, by
//! a tick at most here: a watch message read late by a process frozen briefly (less than
//! `notice`) made its waiter look late. Fixed since review 2: a watch message names its Redis
//! time (`w3`, `Cfg::watch_at`, on by default; false: the `w2` message before).
//!
//! **Switches** (`Cfg::bug`): `Bug::Barging` (serve skips a head that does not fit and grants
//! the lighter ones behind it) and `Bug::DoubleFree` (give_back subtracts the token's weight
//! even when the token holds nothing: a late release of a lease already dropped frees permits
//! twice).

use crate::Fifo;
use stateright::{Model, Property, Representative};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// A waiter (one `acquire_wait`, one token, one queue member).
pub type W = u8;
/// A process (one hub).
pub type Pid = u8;

pub const NP: usize = 3;
pub const WPP: usize = 2;
pub const NW: usize = NP * WPP;
/// Messages in flight per subscriber connection (capacity).
pub const MAXM: usize = 10;

/// The bug switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The scripts as they are.
    None,
    /// `serve` skips a head that does not fit (`continue` for `break`) and grants the lighter
    /// waiters behind it.
    Barging,
    /// `give_back` subtracts the token's weight from `used` even when the token holds nothing
    /// (a late release of a lease that a purge dropped already frees its permits twice).
    DoubleFree,
}

/// The behaviours that findings P1–P3 changed (commit "Permits: fix three findings of the
/// permits model", and for P2 again commit "Permits: watchers preferably outside the holders'
/// processes, chosen again whenever permits come free"), each as it was before its fix
/// (`Cfg::revert`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revert {
    /// P1: no unclaimed marker: a holder fence is `"<fence>"` whoever made the hold, nothing
    /// claims it, and leave 'o' gives back a hold whose fence matches (now: a grant made by a
    /// message is `"<fence> g"`, acquire's `{1}` path and extend claim it, and 'o' gives back
    /// only `FENCE .. ' g'`).
    P1Claim,
    /// P2 as it first was: the watchers ignore the holders' processes: `after_serve` and leave
    /// call `watch('', ..)`, extend `watch(HUB, ..)` (the caller's process), and acquire's
    /// enqueue path records no `'!h'` before `watching`; with `serve_freed` and leave as in
    /// `P2FirstHub`.
    P2Watchers,
    /// P2's first fix (commit "Permits: fix three findings of the permits model"):
    /// `first_hub()`, the process of the holder whose lease ends first, is skipped by `watch`
    /// (after_serve, extend, leave: `watch(first_hub(), ..)`, no `fill`: another holder's process
    /// is not skipped, and the skipped one is taken only when no other is left) and written as
    /// `'!h'` before `watching` (`held_by(first_hub())`); `serve_freed` calls `after_serve` only
    /// when the serve changed the queue, and leave, when it left the queue and nobody was
    /// granted, calls `watch(first_hub(), first_end())` or, the queue gone, `DEL` the processes
    /// hash (now: `holding()`, the set of holders' processes, with `fill`; `serve_freed`
    /// chooses the watchers whenever permits came free).
    P2FirstHub,
    /// P3: `serve` asks whether a head fits before whether anyone listens for it, so a dead head
    /// that does not fit stops the scan and is kept (now: a head nobody listens for is dropped
    /// first).
    P3DeadFirst,
}

/// The model's parameters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// The key's permits (N).
    pub permits: u8,
    /// The weights of each process's waiters (every process has the same).
    pub weights: [u8; WPP],
    /// Every waiter's TTL (the PX of every lease).
    pub ttl: u8,
    /// A process is fresh when Redis saw it queue within this many ticks.
    pub presence: u8,
    /// Each wait's deadline, from its start (tick 0).
    pub wait: u8,
    /// The clock stops here.
    pub horizon: u8,
    /// A freeze of at least this many ticks is noticed on resume.
    pub notice: u8,
    /// Fault budgets.
    pub losses: u8,
    pub freezes: u8,
    pub kills: u8,
    /// (2b): consecutive ticks a live waiter may wait while the first listening waiter of the
    /// queue fits in the permits no running lease holds.
    pub idle_bound: u8,
    /// (2b)'s scan drops a head nobody listens for at once, as `serve` does since P3's fix
    /// (false: such a head that does not fit stops the scan, as before the fix: a kill is
    /// noticed by the next call, at the latest when the first lease ends and a watcher looks,
    /// which is what the design promises; true: the wait between a kill and that call counts).
    pub idle_strict: bool,
    pub bug: Bug,
    /// One behaviour of the scripts taken back to what it was before the fix of one of the
    /// findings P1–P3 (`None`: the scripts as they are). The finding tests replay each
    /// finding with its behaviour reverted.
    pub revert: Option<Revert>,
    /// Steps offered only between cascades of urgent steps: CALM_* bits.
    pub calm: u8,
    /// `watch` with `fill` takes the skipped (holders') processes other than the first
    /// lease's before that one (`last`, `holding()`'s `first_hub()`: a running process whose
    /// lease ends first releases, a call, before the others' end): the scripts since commit
    /// "Permits: when the watchers must come from holders' processes, the first lease's process
    /// last" (true, the default); false: the rule before, candidate order only. With
    /// `Revert::P2Watchers` or `Revert::P2FirstHub` there is no `fill` (nor `last`): no effect.
    pub fill_first_last: bool,
    /// A watch message says when to look (`w3 <px> <Redis time> <token>`, carried over to the
    /// waiter's clock as a grant's time is: the scripts and the client since review 2; the
    /// default), not a delay counted from its reading (`w2`, false: a process frozen for less
    /// than `notice` read it late and looked late).
    pub watch_at: bool,
}

pub const CALM_FREEZE: u8 = 1;
pub const CALM_KILL: u8 = 2;
pub const CALM_RELEASE: u8 = 16;
pub const CALM_RECOVER: u8 = 32;
/// A calm release or kill may still interleave with its own process's urgent steps.
pub const CALM_OWN: u8 = 64;

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg {
            permits: 3,
            weights: [2, 1],
            ttl: 4,
            presence: 1,
            wait: 6,
            horizon: 8,
            notice: 3,
            losses: 0,
            freezes: 0,
            kills: 0,
            idle_bound: 0,
            idle_strict: false,
            bug: Bug::None,
            revert: None,
            calm: CALM_RELEASE | CALM_OWN | CALM_FREEZE | CALM_KILL | CALM_RECOVER,
            fill_first_last: true,
            watch_at: true,
        }
    }
}

pub const LOSS: usize = 0;
pub const FREEZE: usize = 1;
pub const KILL: usize = 2;

/// Ghost flags (sticky).
pub const FIFO_BREAK: u8 = 1;
pub const FENCE_STALE: u8 = 2;
pub const FENCE_REGRESS: u8 = 4;

/// A holder: a member of the holders sorted set (token → lease end) and its fence (the holder
/// fences hash).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Hd {
    pub w: W,
    /// The lease ends when `now` reaches this (0: ended, kept until a purge drops it).
    pub end: u8,
    pub fence: u8,
    /// Its waiter claimed it (its fence is `"<fence>"`, not `"<fence> g"`): leave 'o' does not
    /// give it back. Always false with `Revert::P1Claim`.
    pub claimed: bool,
}

/// A process's field in the processes hash.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Rec {
    #[default]
    None,
    /// Queued at this tick (fresh; `Stale` after the presence window).
    Seen(u8),
    Stale,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Run {
    #[default]
    Running,
    /// Frozen for this many ticks so far (capped at `notice`).
    Frozen(u8),
    Killed,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pr {
    pub run: Run,
    /// A message was lost: the hub wakes every waiter of the process.
    pub missed: bool,
    pub rec: Rec,
}

/// A message on a process's grant channel.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Msg {
    /// `g2 <fence> <px> <grant time> <token>`: a full lease (px = TTL) from the grant's tick;
    /// `fresh`: granted in the current tick (a grant read later is confirmed first).
    Grant { to: W, fence: u8, fresh: bool },
    /// `w2 <px> <token>`: look in px.
    Watch { to: W, px: u8 },
}

impl Default for Msg {
    fn default() -> Msg {
        Msg::Watch { to: 0, px: 0 }
    }
}

/// Leave flags: 'G' give back whatever the token holds; 'o' only the hold with this fence.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flag {
    G,
    O(u8),
}

/// A grant in a waiter's mail.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gm {
    pub fence: u8,
    pub fresh: bool,
}

/// A waiter inside `wait`'s loop.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Wt {
    pub deadline: u8,
    /// The fence its last queueing attempt saw (the anchor).
    pub anchor: Option<u8>,
    /// A watcher looks at this tick (0: due).
    pub watch: Option<u8>,
    /// The loop attempts next (`check = true`).
    pub check: bool,
    /// A stored `Notify` permit.
    pub permit: bool,
    /// The cell's mail.
    pub grant: Option<Gm>,
    pub watch_msg: Option<u8>,
    /// The cell's `hub_woke`.
    pub hub_wake: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Ws {
    #[default]
    Idle,
    Waiting(Wt),
    /// `acquire_wait` returned a guard valid until this tick (0: passed).
    Holding {
        until: u8,
    },
    /// Returned (`WaitTimeout`, or the guard released, or the process killed).
    Done,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct St {
    pub now: u8,
    // Redis
    /// The holders, in the order their leases were set: every lease is the same TTL from the
    /// call that sets it, so this is the order of their ends (the sorted set's order; leases
    /// set in the same tick end in the same tick here, but one after the other in Redis).
    pub holders: Fifo<Hd, NW>,
    /// The state key's `used` (0 whenever the holders key is gone).
    pub used: u8,
    /// The state key's fence (the last fence given).
    pub fence: u8,
    /// The queue, oldest first.
    pub queue: Fifo<W, NW>,
    /// '!w1', '!w2': (tick it looks, 0 = past; member).
    pub watchers: [Option<(u8, W)>; 2],
    // processes
    pub procs: [Pr; NP],
    pub chans: [Fifo<Msg, MAXM>; NP],
    pub ws: [Ws; NW],
    /// Fault budgets left: LOSS, FREEZE, KILL.
    pub budget: [u8; 3],
    // ghosts
    /// Consecutive ticks during which a live waiter waited while the first listening waiter of
    /// the queue fitted in the permits that no running lease holds (saturated).
    pub idle: u8,
    pub flags: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    Tick,
    /// A waiter starts: the fast path (one plain attempt), then it registers.
    Start(W),
    /// A queueing attempt (`check`).
    Attempt(W),
    /// The loop wakes: a grant or watch message, a wake-up, its watch time, the deadline.
    Wake(W),
    /// The holder releases its guard (permit_release.lua).
    Release(W),
    /// The dispatcher delivers the head message of a process's subscriber connection.
    Deliver(Pid),
    Lose(Pid),
    /// The hub notices a loss and wakes every waiter of the process.
    Notice(Pid),
    Freeze(Pid),
    Resume(Pid),
    Kill(Pid),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// acquire {0, ttl, fence}
    Acquired(u8),
    /// acquire {1, pttl, fence}
    AlreadyHeld { fence: u8, remaining: u8 },
    /// acquire {2, pttl, 0(, 1)} or {2, pttl, 1, listening, fence, watching, time, depth}
    Locked {
        remaining: u8,
        queued: Option<Queued>,
    },
    /// release/extend/leave {0}
    NotHeld,
    /// extend {1, fence}
    Renewed(u8),
    /// release {1} / {2}, leave {2}
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub fence: u8,
    pub deaf: bool,
    pub watcher: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Gone,
    Stale,
    Fresh,
}

/// The model (Sync: the latches are atomics).
pub struct Permits {
    pub cfg: Cfg,
    /// Report only the first violation of each property (shortest traces with 1-thread BFS).
    pub first_only: bool,
    pub latched: [AtomicBool; 8],
}

const CAP: u8 = 20;

fn clamp(now: u8, at: u8) -> u8 {
    if at <= now {
        0
    } else {
        at
    }
}

fn pw(w: W) -> usize {
    w as usize / WPP
}

fn waiters(p: usize) -> std::ops::Range<usize> {
    p * WPP..(p + 1) * WPP
}

impl Permits {
    pub fn new(cfg: Cfg) -> Permits {
        Permits {
            cfg,
            first_only: false,
            latched: Default::default(),
        }
    }

    fn latch(&self, i: usize, ok: bool) -> bool {
        if ok || !self.first_only {
            return ok;
        }
        self.latched[i].swap(true, Relaxed)
    }

    /// Clears the latches (before `assert_discovery`, which re-evaluates the property).
    pub fn unlatch(&self) {
        for l in &self.latched {
            l.store(false, Relaxed);
        }
    }

    fn reverted(&self, r: Revert) -> bool {
        self.cfg.revert == Some(r)
    }

    /// P3's fix: `serve` drops a head nobody listens for before asking whether it fits.
    pub fn dead_first(&self) -> bool {
        !self.reverted(Revert::P3DeadFirst)
    }

    /// The weight of waiter `w`'s token (`weight_of`: `w<weight>:...`).
    pub fn weight(&self, w: W) -> u8 {
        self.cfg.weights[w as usize % WPP]
    }

    fn running(&self, s: &St, p: usize) -> bool {
        s.procs[p].run == Run::Running
    }

    fn registered(&self, s: &St, p: usize) -> bool {
        waiters(p).any(|w| matches!(s.ws[w], Ws::Waiting(_)))
    }

    fn wt(s: &St, w: usize) -> Wt {
        match s.ws[w] {
            Ws::Waiting(t) => t,
            other => panic!("waiter {w} is not waiting: {other:?}"),
        }
    }

    fn holder(s: &St, w: W) -> Option<Hd> {
        s.holders.iter().copied().find(|h| h.w == w)
    }

    // ---------------------------------------------------------------- Redis: common.lua

    // mirrors common.lua -> slow -> listener(hub): somebody listens on the process's grant
    // channel (the process is alive and a waiter of it is registered on the key)
    fn listener(&self, s: &St, p: usize) -> bool {
        s.procs[p].run != Run::Killed && self.registered(s, p)
    }

    // mirrors common.lua -> slow -> process(hub): gone (nobody listens; a permit key's
    // processes are never lapsed), fresh (queued within the presence window) or stale
    fn process(&self, s: &St, p: usize) -> Status {
        if !self.listener(s, p) {
            return Status::Gone;
        }
        match s.procs[p].rec {
            Rec::Seen(t) if s.now - t <= self.cfg.presence => Status::Fresh,
            _ => Status::Stale,
        }
    }

    // mirrors common.lua -> slow -> publish(how, hub, msg)
    fn publish(&self, s: &mut St, p: usize, m: Msg) {
        s.chans[p].push(m);
    }

    // mirrors common.lua -> slow -> seen(hub)
    fn seen(&self, s: &mut St, p: usize) {
        s.procs[p].rec = Rec::Seen(s.now);
    }

    /// `DEL PP`: the processes hash, watchers included.
    fn del_pp(&self, s: &mut St) {
        for pr in s.procs.iter_mut() {
            pr.rec = Rec::None;
        }
        s.watchers = [None, None];
    }

    // mirrors common.lua -> slow -> watch(skip, px, later, fill, last): keep two watchers of
    // two processes, fresh ones not skipped first, then stale ones not skipped, then (when
    // none was chosen, or with `fill`) from the skipped processes, with `fill` the first
    // lease's (`last`: `first_hub()`, read here) last (`Cfg::fill_first_last`). `skip`: a set
    // of processes (a bit each; the lock's single `skip` and `''` are one bit and none)
    fn watch(&self, s: &mut St, skip: u8, px: u8, later: bool, fill: bool) {
        let until = s.now + px;
        let stat: [Status; NP] = std::array::from_fn(|p| self.process(s, p));
        let mut cands: Fifo<(W, Option<u8>), 8> = Fifo::default();
        for f in 0..2 {
            if let Some((at, m)) = s.watchers[f] {
                if s.queue.contains(&m) {
                    cands.push((m, Some(at)));
                }
            }
        }
        for &m in s.queue.iter().rev() {
            cands.push((m, None));
        }
        let mut chosen: Fifo<(W, Option<u8>), 2> = Fifo::default();
        let mut hubs = 0u8;
        let mut pick = |fresh_only: bool, allowed: u8, chosen: &mut Fifo<(W, Option<u8>), 2>| {
            for &(m, at) in cands.iter() {
                if chosen.len() == 2 {
                    return;
                }
                let wp = pw(m);
                if hubs & (1 << wp) == 0 && allowed & (1 << wp) != 0 {
                    let st = stat[wp];
                    if st != Status::Gone && (st == Status::Fresh || !fresh_only) {
                        hubs |= 1 << wp;
                        chosen.push((m, at));
                    }
                }
            }
        };
        pick(true, !skip, &mut chosen);
        pick(false, !skip, &mut chosen);
        if chosen.is_empty() || fill {
            if fill && self.cfg.fill_first_last {
                // `pick(false, true, last)`: every process but the first lease's
                let first = self.first_hub(s).map_or(0, |p| 1 << p);
                pick(false, !first, &mut chosen);
            }
            pick(false, !0, &mut chosen);
        }
        s.watchers = [None, None];
        for (i, &(m, at)) in chosen.iter().enumerate() {
            // a kept watcher is told again if it would look later than the lease ends (with
            // `later`: also earlier)
            let at = match at {
                Some(a) if until >= a && !(later && until > a) => a,
                _ => {
                    self.publish(s, pw(m), Msg::Watch { to: m, px });
                    until
                }
            };
            s.watchers[i] = Some((clamp(s.now, at), m));
        }
    }

    // mirrors common.lua -> slow -> watching(pttl, holding): is the new member a watcher? Its
    // own field, a free field (the two in two processes), or, if its process is not in
    // `holding` (a set of processes, a bit each), the field of a watcher whose process is
    // (another field's process not the caller's). Permits pass `holding()`; before, the lock's
    // rule with the '!h' field that `L.held_by(first_hub())` wrote just before (one process,
    // `Revert::P2FirstHub`; none recorded, `Revert::P2Watchers`; the field is read by nothing
    // else in the permit scripts, so it is not kept in the state).
    fn watching(&self, s: &mut St, m: W, pttl: u8, holding: u8) -> bool {
        let hub = pw(m);
        let hubs = s.watchers.map(|x| x.map(|(_, o)| pw(o)));
        let fits = |f: usize| hubs[1 - f] != Some(hub);
        let field = (0..2)
            .find(|&f| matches!(s.watchers[f], Some((_, o)) if o == m))
            .or_else(|| (0..2).find(|&f| s.watchers[f].is_none() && fits(f)))
            .or_else(|| {
                if holding & (1 << hub) != 0 {
                    return None;
                }
                (0..2).find(|&f| hubs[f].is_some_and(|h| holding & (1 << h) != 0) && fits(f))
            });
        let Some(f) = field else { return false };
        s.watchers[f] = Some((clamp(s.now, s.now + pttl), m));
        true
    }

    // ---------------------------------------------------------------- Redis: permits.lua

    // mirrors permits.lua -> state(): `used` (0 when the holders key is gone). Returns it (the
    // scripts' `before`).
    fn state(&self, s: &mut St) -> u8 {
        if s.holders.is_empty() {
            s.used = 0;
        }
        s.used
    }

    // mirrors permits.lua -> drop_holder(s, token)
    fn drop_holder(&self, s: &mut St, w: W) {
        if let Some(i) = s.holders.iter().position(|h| h.w == w) {
            s.holders.remove(i);
        }
        s.used = s.used.saturating_sub(self.weight(w));
    }

    // mirrors permits.lua -> purge(s): every lease whose end has passed (unbounded here)
    fn purge(&self, s: &mut St) {
        let now = s.now;
        let ended: Fifo<W, NW> = s
            .holders
            .iter()
            .filter(|h| h.end <= now)
            .map(|h| h.w)
            .collect();
        for &w in ended.iter() {
            self.drop_holder(s, w);
        }
    }

    // mirrors permits.lua -> first_end(): ticks until the first lease ends (0: none)
    fn first_end(&self, s: &St) -> u8 {
        s.holders
            .iter()
            .map(|h| h.end.saturating_sub(s.now))
            .min()
            .unwrap_or(0)
    }

    // mirrors permits.lua -> holding(): the processes of the holders whose leases end first
    // (ZRANGE HOLDERS 0 15: here every holder), a bit each; its second value, the first's
    // process, is `first_hub()`, read by `watch`
    fn holding(&self, s: &St) -> u8 {
        s.holders.iter().fold(0, |set, h| set | 1 << pw(h.w))
    }

    // mirrors permits.lua -> rewatch(L, px, later): `L.watch(set, px, later, true, first)`
    // with `set, first = holding()` (`first` read by `watch`, `Cfg::fill_first_last`).
    // With P2 reverted, the call it replaced: `watch(first_hub(), px, later)`
    // (`Revert::P2FirstHub`), or `watch('', px)`, extend's `watch(HUB, px, true)` (`caller`,
    // `Revert::P2Watchers`)
    fn rewatch(&self, s: &mut St, px: u8, later: bool, caller: Option<usize>) {
        match self.cfg.revert {
            Some(Revert::P2Watchers) => {
                let skip = caller.map_or(0, |p| 1 << p);
                self.watch(s, skip, px, later, false)
            }
            Some(Revert::P2FirstHub) => {
                let skip = self.first_hub(s).map_or(0, |p| 1 << p);
                self.watch(s, skip, px, later, false)
            }
            _ => {
                let skip = self.holding(s);
                self.watch(s, skip, px, later, true)
            }
        }
    }

    /// The rule of the watchers is P2's second fix (`holding()`, `rewatch`, `serve_freed`
    /// choosing the watchers whenever permits came free), not an earlier one.
    fn holding_rule(&self) -> bool {
        !matches!(
            self.cfg.revert,
            Some(Revert::P2Watchers | Revert::P2FirstHub)
        )
    }

    // mirrors holding()'s second value (tokens[1] of ZRANGE HOLDERS 0 15, `last` of `watch`,
    // `Cfg::fill_first_last`) and permits.lua -> first_hub() as it was (`Revert::P2FirstHub`):
    // the process of the holder whose lease ends first (the lowest end; of leases ending in the
    // same tick, the one set first, `holders` being in that order)
    fn first_hub(&self, s: &St) -> Option<usize> {
        s.holders.iter().min_by_key(|h| h.end).map(|h| pw(h.w))
    }

    // mirrors permits.lua -> next_fence(s)
    fn next_fence(&self, s: &mut St) -> u8 {
        s.fence += 1;
        s.fence
    }

    // mirrors permits.lua -> hold(s, token, px, granted)
    fn hold(&self, s: &mut St, w: W, px: u8, granted: bool) -> u8 {
        let before = s.fence;
        let f = self.next_fence(s);
        if f <= before || s.holders.iter().any(|h| h.fence >= f) {
            s.flags |= FENCE_REGRESS;
        }
        let h = Hd {
            w,
            end: s.now + px,
            fence: f,
            claimed: !granted && !self.reverted(Revert::P1Claim),
        };
        // ZADD: the lease set last ends last
        if let Some(i) = s.holders.iter().position(|x| x.w == w) {
            s.holders.remove(i);
        }
        s.holders.push(h);
        s.used += self.weight(w);
        f
    }

    // mirrors permits.lua -> claim(token): the hold of `w` is its waiter's now (its fence
    // loses the ' g'; nothing with `Revert::P1Claim`)
    fn claim(&self, s: &mut St, w: W) {
        if self.reverted(Revert::P1Claim) {
            return;
        }
        if let Some(h) = s.holders.iter_mut().find(|h| h.w == w) {
            h.claimed = true;
        }
    }

    // mirrors permits.lua -> settle(s): with no holder left, used is 0 (the holders key expires
    // with its last lease: `Tick`)
    fn settle(&self, s: &mut St) {
        if s.holders.is_empty() {
            s.used = 0;
        }
    }

    // mirrors permits.lua -> serve(L, s, self): grant the heads in order while they fit.
    // Returns the caller's fence if it was granted, whether the queue changed, how many others
    // were granted.
    fn serve(&self, s: &mut St, me: Option<W>) -> (Option<u8>, bool, u8) {
        let n = self.cfg.permits;
        let heads = s.queue;
        let mut done = 0u32;
        let mut mine = None;
        let mut granted = 0;
        for &head in heads.iter() {
            let w = self.weight(head);
            let gone = Some(head) != me && self.process(s, pw(head)) == Status::Gone;
            if w > n || (gone && self.dead_first()) {
                // can never fit, or nobody listens for it: dropped (a dead head holds back
                // nobody)
                done |= 1 << head;
            } else if s.used + w > n {
                if self.cfg.bug == Bug::Barging {
                    continue;
                }
                break;
            } else if Some(head) == me {
                done |= 1 << head;
                mine = Some(self.hold(s, head, self.cfg.ttl, false));
            } else {
                done |= 1 << head;
                let p = pw(head);
                // (with P3 reverted, a dead head that fits is dropped here, not granted)
                if !gone {
                    let f = self.hold(s, head, self.cfg.ttl, true);
                    granted += 1;
                    self.publish(
                        s,
                        p,
                        Msg::Grant {
                            to: head,
                            fence: f,
                            fresh: true,
                        },
                    );
                }
            }
        }
        let kept: Fifo<W, NW> = s
            .queue
            .iter()
            .copied()
            .filter(|&m| done & (1 << m) == 0)
            .collect();
        s.queue = kept;
        (mine, done != 0, granted)
    }

    // mirrors permits.lua -> after_serve(L, s)
    fn after_serve(&self, s: &mut St) {
        if s.queue.is_empty() {
            self.del_pp(s);
            return;
        }
        let mut px = self.first_end(s);
        let head = s.queue[0];
        if s.used + self.weight(head) <= self.cfg.permits {
            px = 0;
        }
        self.rewatch(s, px, false, None);
    }

    // mirrors permits.lua -> serve_freed(s, before, always)
    fn serve_freed(&self, s: &mut St, before: u8, always: bool) -> u8 {
        if !always && s.used >= before {
            return 0;
        }
        if s.queue.is_empty() {
            if always && self.holding_rule() {
                self.del_pp(s);
            }
            return 0;
        }
        let (_, changed, granted) = self.serve(s, None);
        // the holders changed: the watchers are chosen again (before P2's second fix: only
        // when the queue changed)
        if changed || self.holding_rule() {
            self.after_serve(s);
        }
        granted
    }

    // mirrors permits.lua -> give_back(s, token): 1 if its lease was running
    fn give_back(&self, s: &mut St, w: W) -> u8 {
        let Some(h) = Self::holder(s, w) else {
            if self.cfg.bug == Bug::DoubleFree {
                // the switch: the token's weight is freed although it holds nothing
                s.used = s.used.saturating_sub(self.weight(w));
            }
            return 0;
        };
        self.drop_holder(s, w);
        if h.end > s.now {
            1
        } else {
            0
        }
    }

    /// Runs one script; the FIFO ghost: a hold made by it must not pass an older queue member
    /// of a process that listens and that is still queued after it.
    fn script<R>(&self, s: &mut St, f: impl FnOnce(&Self, &mut St) -> R) -> R {
        let q0 = s.queue;
        let f0 = s.fence;
        let r = f(self, s);
        if s.fence != f0 {
            let mut broken = false;
            for h in s.holders.iter().filter(|h| h.fence > f0) {
                let xpos = q0.iter().position(|&m| m == h.w);
                for &m in s.queue.iter() {
                    let Some(mpos) = q0.iter().position(|&o| o == m) else {
                        continue;
                    };
                    if self.listener(s, pw(m)) && xpos.is_none_or(|x| x > mpos) {
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

    // mirrors src/redis/lua/permit_acquire.lua (with MEMBER and HUB when `member`)
    fn acquire(&self, s: &mut St, w: W, member: bool) -> Reply {
        self.script(s, |m, s| m.acquire_script(s, w, member))
    }

    fn acquire_script(&self, s: &mut St, w: W, member: bool) -> Reply {
        let before = self.state(s);
        self.purge(s);
        if let Some(h) = Self::holder(s, w) {
            // after the purge a holder's lease is running: granted already
            let left = h.end - s.now;
            self.claim(s, w);
            self.serve_freed(s, before, false);
            self.settle(s);
            return Reply::AlreadyHeld {
                fence: h.fence,
                remaining: left,
            };
        }
        if !s.queue.is_empty() {
            let (mine, changed, _) = self.serve(s, if member { Some(w) } else { None });
            if changed {
                self.after_serve(s);
            }
            if let Some(f) = mine {
                self.settle(s);
                return Reply::Acquired(f);
            }
        }
        let queued = !s.queue.is_empty();
        if !queued && s.used + self.weight(w) <= self.cfg.permits {
            let f = self.hold(s, w, self.cfg.ttl, false);
            self.settle(s);
            return Reply::Acquired(f);
        }
        let pttl = self.first_end(s);
        if !member {
            self.settle(s);
            return Reply::Locked {
                remaining: pttl,
                queued: None,
            };
        }
        let p = pw(w);
        self.seen(s, p);
        if !s.queue.contains(&w) {
            s.queue.push(w);
        }
        // `L.watching(pttl, holding())`; before P2's second fix `L.held_by(first_hub())`
        // then `L.watching(pttl)` (the '!h' field: one process), and before P2's first fix
        // no '!h' (none)
        let holding = match self.cfg.revert {
            Some(Revert::P2Watchers) => 0,
            Some(Revert::P2FirstHub) => self.first_hub(s).map_or(0, |p| 1 << p),
            _ => self.holding(s),
        };
        let deaf = !self.listener(s, p);
        let watcher = self.watching(s, w, pttl, holding);
        self.settle(s);
        Reply::Locked {
            remaining: pttl,
            queued: Some(Queued {
                fence: s.fence,
                deaf,
                watcher,
            }),
        }
    }

    // mirrors src/redis/lua/permit_release.lua
    fn release(&self, s: &mut St, w: W) -> Reply {
        self.script(s, |m, s| {
            let before = m.state(s);
            m.purge(s);
            let r = m.give_back(s, w);
            m.serve_freed(s, before, false);
            m.settle(s);
            if r == 1 {
                Reply::Done
            } else {
                Reply::NotHeld
            }
        })
    }

    // mirrors src/redis/lua/permit_extend.lua (HUB: the caller's process)
    fn extend(&self, s: &mut St, w: W) -> Reply {
        self.script(s, |m, s| {
            let before = m.state(s);
            m.purge(s);
            let Some(h) = Self::holder(s, w) else {
                m.serve_freed(s, before, false);
                m.settle(s);
                return Reply::NotHeld;
            };
            // ZADD XX: the renewed lease ends last
            let i = s.holders.iter().position(|x| x.w == w).unwrap();
            let mut renewed = s.holders.remove(i);
            renewed.end = s.now + m.cfg.ttl;
            s.holders.push(renewed);
            m.claim(s, w);
            m.serve_freed(s, before, false);
            m.settle(s);
            if !s.queue.is_empty() {
                let fe = m.first_end(s);
                m.rewatch(s, fe, true, Some(pw(w)));
            }
            Reply::Renewed(h.fence)
        })
    }

    // mirrors src/redis/lua/permit_leave.lua (the queue residue's 'G'; the dispatcher's 'o'
    // for a grant whose waiter has gone, with no member)
    fn leave(&self, s: &mut St, w: W, member: bool, flag: Flag) -> Reply {
        self.script(s, |m, s| {
            let before = m.state(s);
            m.purge(s);
            let mut left = false;
            if member {
                if let Some(i) = s.queue.iter().position(|&x| x == w) {
                    s.queue.remove(i);
                    left = true;
                }
            }
            let mut r = Reply::NotHeld;
            if let Some(h) = Self::holder(s, w) {
                let ok = match flag {
                    Flag::G => true,
                    Flag::O(f) => h.fence == f && !h.claimed,
                };
                if ok && m.give_back(s, w) == 1 {
                    r = Reply::Done;
                }
            }
            // the queue is served and its watchers chosen again (the leaver may have been
            // one)
            let granted = m.serve_freed(s, before, left);
            if !m.holding_rule() && granted == 0 && left {
                // before P2's second fix: nobody granted, the watchers kept fit
                if !s.queue.is_empty() {
                    let fe = m.first_end(s);
                    m.rewatch(s, fe, false, None);
                } else {
                    m.del_pp(s);
                }
            }
            m.settle(s);
            r
        })
    }

    // ---------------------------------------------------------------- the client

    /// `acquire_wait` returns a guard: the (3) ghost checks its fence against Redis's.
    fn guard(&self, s: &mut St, w: usize, fence: u8, until: u8) {
        match Self::holder(s, w as W) {
            Some(h) if h.fence == fence && h.end > s.now => {}
            _ => s.flags |= FENCE_STALE,
        }
        s.ws[w] = Ws::Holding { until };
    }

    /// Wakes every registered waiter of `p` (`wake_all` / `wake_channel`: a hub wake).
    fn wake_all(&self, s: &mut St, p: usize) {
        for w in waiters(p) {
            if let Ws::Waiting(t) = &mut s.ws[w] {
                t.permit = true;
                t.hub_wake = true;
            }
        }
    }

    // mirrors src/wait/notify/mod.rs -> wait: fast path, then register
    fn start(&self, s: &mut St, w: usize) {
        let p = pw(w as W);
        if !self.registered(s, p) {
            // `if !hub.listening(&channel)`: one plain attempt (no MEMBER, HUB '')
            match self.acquire(s, w as W, false) {
                Reply::Acquired(f) => {
                    let until = s.now + self.cfg.ttl;
                    self.guard(s, w, f, until);
                    return;
                }
                Reply::Locked { queued: None, .. } => {}
                other => panic!("a plain attempt replied {other:?}"),
            }
        }
        s.ws[w] = Ws::Waiting(Wt {
            deadline: s.now + self.cfg.wait,
            check: true,
            ..Wt::default()
        });
    }

    // mirrors src/wait/notify/mod.rs -> wait: `if check` (an attempt with the member)
    fn attempt(&self, s: &mut St, w: usize) {
        let mut t = Self::wt(s, w);
        t.check = false;
        s.ws[w] = Ws::Waiting(t);
        let r = self.acquire(s, w as W, true);
        self.on_attempt(s, w, r);
    }

    // mirrors src/wait/mod.rs -> Waiting::attempt (the reply) and wait's `match step`
    fn on_attempt(&self, s: &mut St, w: usize, r: Reply) {
        let mut t = Self::wt(s, w);
        let now = s.now;
        match r {
            Reply::Acquired(f) => self.full_lease(s, w, f, now + self.cfg.ttl),
            Reply::AlreadyHeld { fence, remaining } => {
                self.full_lease(s, w, fence, now + remaining)
            }
            Reply::Locked {
                remaining,
                queued: Some(q),
            } => {
                assert!(!q.deaf, "a running process's attempt is always heard");
                t.anchor = Some(q.fence);
                t.watch = if q.watcher {
                    Some(clamp(now, now + remaining))
                } else {
                    None
                };
                s.ws[w] = Ws::Waiting(t);
            }
            other => panic!("attempt with a member replied {other:?}"),
        }
    }

    // mirrors src/wait/mod.rs -> Request::full_lease: a lease short of the TTL is extended
    // first (one round trip)
    fn full_lease(&self, s: &mut St, w: usize, fence: u8, until: u8) {
        if until >= s.now + self.cfg.ttl {
            self.guard(s, w, fence, until);
            return;
        }
        match self.extend(s, w as W) {
            Reply::Renewed(f) => {
                let until = s.now + self.cfg.ttl;
                self.guard(s, w, f, until);
            }
            // Held a moment ago, gone now: Step::Failed (never here: the extend runs in the
            // same tick as the attempt)
            other => panic!("full_lease's extend replied {other:?}"),
        }
    }

    // mirrors src/wait/notify/mod.rs -> take_grant
    fn take_grant(&self, s: &mut St, w: usize, g: Gm) {
        let t = Self::wt(s, w);
        // since = anchor.sent + (grant time − anchor Redis time): the grant's tick;
        // valid_until = since + px (px = TTL): enough when the grant is from this tick
        if t.anchor.is_some() && g.fresh {
            let until = s.now + self.cfg.ttl;
            self.guard(s, w, g.fence, until);
            return;
        }
        // confirm first: full_lease with an unconfirmed hold (extend)
        match self.extend(s, w as W) {
            Reply::Renewed(f) => {
                let until = s.now + self.cfg.ttl;
                self.guard(s, w, f, until);
            }
            Reply::NotHeld => {
                // Ok(None): the grant lapsed; every waiter of the key looks again
                let mut t = Self::wt(s, w);
                t.check = true;
                s.ws[w] = Ws::Waiting(t);
                self.wake_all(s, pw(w as W));
            }
            other => panic!("extend replied {other:?}"),
        }
    }

    // mirrors src/wait/notify/mod.rs -> wait: after the select (take_grant, take_hub_wake,
    // take_watch, the deadline)
    fn wake(&self, s: &mut St, w: usize) {
        let mut t = Self::wt(s, w);
        let by_message = t.permit && !Self::time_due(s, &t);
        t.permit = false;
        if let Some(g) = t.grant.take() {
            if t.anchor.is_none_or(|a| g.fence > a) {
                s.ws[w] = Ws::Waiting(t);
                self.take_grant(s, w, g);
                if let Ws::Waiting(t) = &mut s.ws[w] {
                    t.check = true; // `check = true; continue`
                }
                return;
            }
        }
        let hub_wake = std::mem::take(&mut t.hub_wake);
        if let Some(px) = t.watch_msg.take() {
            t.watch = Some(clamp(s.now, s.now + px));
            t.check = hub_wake;
        } else {
            t.check = hub_wake || !by_message;
        }
        if s.now >= t.deadline {
            // WaitTimeout; the queue residue leaves ('G')
            s.ws[w] = Ws::Done;
            self.leave(s, w as W, true, Flag::G);
        } else {
            s.ws[w] = Ws::Waiting(t);
        }
    }

    fn wake_due(s: &St, t: &Wt) -> bool {
        t.permit || Self::time_due(s, t)
    }

    /// The select's sleep is over: the deadline or the watch time is due.
    fn time_due(s: &St, t: &Wt) -> bool {
        s.now >= t.deadline || t.watch.is_some_and(|v| v <= s.now)
    }

    // ---------------------------------------------------------------- properties' helpers

    /// The weight of the guards valid now.
    pub fn valid_weight(&self, s: &St) -> u8 {
        (0..NW)
            .filter(|&w| matches!(s.ws[w], Ws::Holding { until } if s.now < until))
            .map(|w| self.weight(w as W))
            .sum()
    }

    /// The permits no running lease holds (an ended lease not dropped yet is free).
    pub fn free(&self, s: &St) -> u8 {
        let held: u8 = s
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
            let p = pw(m);
            self.running(s, p) && matches!(s.ws[m as usize], Ws::Waiting(_))
        });
        if !live {
            return false;
        }
        let free = self.free(s);
        for &m in s.queue.iter() {
            let gone = !self.listener(s, pw(m));
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
            let gone = !self.listener(s, pw(m));
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
        let mut it = s.queue.iter().copied().filter(|&m| self.listener(s, pw(m)));
        match it.next() {
            Some(h) if self.weight(h) > free => it.any(|m| self.weight(m) <= free),
            _ => false,
        }
    }

    fn quiescent(&self, s: &St) -> bool {
        s.ws.iter().all(|w| *w == Ws::Done) && s.chans.iter().all(|c| c.is_empty())
    }

    /// A queue member or a running lease of a process that is still alive.
    fn left_behind(&self, s: &St) -> bool {
        let alive = |w: W| s.procs[pw(w)].run != Run::Killed;
        s.queue.iter().any(|&m| alive(m)) || s.holders.iter().any(|h| h.end > s.now && alive(h.w))
    }
}

impl Model for Permits {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        let c = &self.cfg;
        vec![St {
            now: 0,
            holders: Fifo::default(),
            used: 0,
            fence: 0,
            queue: Fifo::default(),
            watchers: [None, None],
            procs: [Pr::default(); NP],
            chans: Default::default(),
            ws: [Ws::Idle; NW],
            budget: [c.losses, c.freezes, c.kills],
            idle: 0,
            flags: 0,
        }]
    }

    fn actions(&self, s: &St, out: &mut Vec<Act>) {
        let mut urgent = false;
        let mut busy = 0u32;
        let mut calm: Vec<Act> = Vec::new();
        for w in 0..NW {
            let p = pw(w as W);
            if !self.running(s, p) {
                continue;
            }
            let a = w as W;
            match s.ws[w] {
                Ws::Idle => {
                    urgent = true;
                    busy |= 1 << p;
                    out.push(Act::Start(a));
                }
                Ws::Waiting(t) => {
                    if t.check {
                        urgent = true;
                        busy |= 1 << p;
                        out.push(Act::Attempt(a));
                    } else if Self::wake_due(s, &t) {
                        urgent = true;
                        busy |= 1 << p;
                        out.push(Act::Wake(a));
                    }
                }
                Ws::Holding { until } => {
                    // A holder releases before its lease ends (one that does not is frozen or
                    // killed: the faults).
                    if s.now + 1 >= until {
                        urgent = true;
                        busy |= 1 << p;
                        out.push(Act::Release(a));
                    } else {
                        calm.push(Act::Release(a));
                    }
                }
                Ws::Done => {}
            }
        }
        for p in 0..NP {
            let pr = s.procs[p];
            let a = p as Pid;
            let running = pr.run == Run::Running;
            if !s.chans[p].is_empty() {
                if running {
                    urgent = true;
                    busy |= 1 << p;
                    out.push(Act::Deliver(a));
                }
                if s.budget[LOSS] > 0 {
                    out.push(Act::Lose(a));
                }
            }
            if running && pr.missed {
                urgent = true;
                busy |= 1 << p;
                out.push(Act::Notice(a));
            }
            if matches!(pr.run, Run::Frozen(_)) {
                calm.push(Act::Resume(a));
            }
            let active = waiters(p).any(|w| s.ws[w] != Ws::Done);
            if running && active {
                if s.budget[FREEZE] > 0 {
                    calm.push(Act::Freeze(a));
                }
                if s.budget[KILL] > 0 {
                    calm.push(Act::Kill(a));
                }
            }
        }
        for a in calm {
            let bit = match a {
                Act::Freeze(_) => CALM_FREEZE,
                Act::Kill(_) => CALM_KILL,
                Act::Release(_) => CALM_RELEASE,
                Act::Resume(_) => CALM_RECOVER,
                _ => 0,
            };
            let others_busy = match a {
                Act::Release(w) if self.cfg.calm & CALM_OWN != 0 => busy & !(1 << pw(w)) != 0,
                Act::Kill(p) if self.cfg.calm & CALM_OWN != 0 => busy & !(1 << p) != 0,
                _ => urgent,
            };
            if !others_busy || self.cfg.calm & bit == 0 {
                out.push(a);
            }
        }
        let all_done = s.ws.iter().all(|w| *w == Ws::Done);
        if !urgent && s.now < self.cfg.horizon && !all_done {
            out.push(Act::Tick);
        }
    }

    fn next_state(&self, s0: &St, a: Act) -> Option<St> {
        let mut s = self.step(s0, a)?;
        self.forget(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always(P1, |m, s| m.latch(0, m.valid_weight(s) <= m.cfg.permits)),
            Property::<Self>::always(P2, |m, s| m.latch(1, s.flags & FIFO_BREAK == 0)),
            Property::<Self>::always(P2B, |m, s| m.latch(2, s.idle <= m.cfg.idle_bound)),
            Property::<Self>::always(P3, |m, s| {
                m.latch(3, s.flags & (FENCE_STALE | FENCE_REGRESS) == 0)
            }),
            Property::<Self>::always(P4, |m, s| m.latch(4, !(m.quiescent(s) && m.left_behind(s)))),
            Property::<Self>::sometimes(CANARY_ENDED, |_, s| s.ws.iter().all(|w| *w == Ws::Done)),
            Property::<Self>::sometimes(CANARY_BLOCKED, |m, s| m.blocked(s)),
            Property::<Self>::sometimes(CANARY_THREE, |_, s| s.holders.len() >= 3),
        ]
    }
}

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

impl Permits {
    /// One step (`next_state` is this, then `forget`).
    fn step(&self, s0: &St, a: Act) -> Option<St> {
        let mut s = s0.clone();
        match a {
            Act::Tick => self.tick(&mut s),
            // mirrors wait: fast path (permit_acquire.lua, no MEMBER), hub.register
            Act::Start(w) => self.start(&mut s, w as usize),
            // mirrors wait's `if check` -> Waiting::attempt -> permit_acquire.lua (MEMBER)
            Act::Attempt(w) => self.attempt(&mut s, w as usize),
            // mirrors wait after its select
            Act::Wake(w) => self.wake(&mut s, w as usize),
            Act::Release(w) => {
                // LockGuard::release: mirrors permit_release.lua
                let w = w as usize;
                s.ws[w] = Ws::Done;
                self.release(&mut s, w as W);
            }
            Act::Deliver(p) => {
                // mirrors src/wait/notify/hub.rs -> Hub::deliver
                let p = p as usize;
                let m = s.chans[p].remove(0);
                match m {
                    Msg::Grant { to, fence, fresh } => match &mut s.ws[to as usize] {
                        Ws::Waiting(t) => {
                            t.grant = Some(Gm { fence, fresh });
                            t.permit = true;
                        }
                        _ => {
                            // its waiter has gone: give back this grant only (leave 'o')
                            self.leave(&mut s, to, false, Flag::O(fence));
                        }
                    },
                    Msg::Watch { to, px } => {
                        if let Ws::Waiting(t) = &mut s.ws[to as usize] {
                            t.watch_msg = Some(px);
                            t.permit = true;
                        }
                    }
                }
            }
            Act::Lose(p) => {
                s.chans[p as usize].remove(0);
                s.budget[LOSS] -= 1;
                s.procs[p as usize].missed = true;
            }
            Act::Notice(p) => {
                s.procs[p as usize].missed = false;
                self.wake_all(&mut s, p as usize);
            }
            Act::Freeze(p) => {
                s.budget[FREEZE] -= 1;
                s.procs[p as usize].run = Run::Frozen(0);
            }
            Act::Resume(p) => {
                let p = p as usize;
                let Run::Frozen(k) = s.procs[p].run else {
                    return None;
                };
                s.procs[p].run = Run::Running;
                if k >= self.cfg.notice {
                    self.wake_all(&mut s, p);
                }
            }
            Act::Kill(p) => {
                let p = p as usize;
                s.budget[KILL] -= 1;
                for w in waiters(p) {
                    s.ws[w] = Ws::Done;
                }
                let pr = &mut s.procs[p];
                pr.run = Run::Killed;
                pr.missed = false;
                s.chans[p].clear();
            }
        }
        Some(s)
    }
}

impl Permits {
    /// Forgets fences no future step compares: a waiter's anchor and its hold's fence (and
    /// claim marker) matter
    /// only while a grant message to it is in flight or in its mail (a later grant's fence is
    /// above every fence of the state; the reply `{1, pttl, fence}` and extend's `{1, fence}`
    /// return the hold's fence, which the guard then carries: (3) compares it with itself).
    fn forget(&self, s: &mut St) {
        let mut pending = 0u32;
        for ch in s.chans.iter() {
            for m in ch.iter() {
                if let Msg::Grant { to, .. } = m {
                    pending |= 1 << to;
                }
            }
        }
        for (w, ws) in s.ws.iter_mut().enumerate() {
            if let Ws::Waiting(t) = ws {
                if t.grant.is_some() {
                    pending |= 1 << w;
                } else if let Some(a) = t.anchor.as_mut() {
                    if pending & (1 << w) == 0 {
                        *a = 0;
                    }
                }
            }
        }
        for h in s.holders.iter_mut() {
            if pending & (1 << h.w) == 0 {
                // the claim marker matters only to leave 'o', which only a grant message
                // brings
                h.fence = 0;
                h.claimed = false;
            }
        }
    }

    // Time passes: leases end, the holders key expires with its last lease, records age, dead
    // data is forgotten, the idle ghost counts.
    fn tick(&self, s: &mut St) {
        s.idle = if self.starving(s) {
            (s.idle + 1).min(CAP)
        } else {
            0
        };
        s.now += 1;
        let now = s.now;
        if s.holders.iter().all(|h| h.end <= now) {
            // PEXPIREAT of the last lease's end: the holders (and their fences) are gone
            s.holders.clear();
            s.used = 0;
        }
        for h in s.holders.iter_mut() {
            h.end = clamp(now, h.end);
        }
        for pr in s.procs.iter_mut() {
            if let Rec::Seen(t) = pr.rec {
                if now - t > self.cfg.presence {
                    pr.rec = Rec::Stale;
                }
            }
            if let Run::Frozen(k) = pr.run {
                pr.run = Run::Frozen((k + 1).min(self.cfg.notice));
            }
        }
        for w in s.watchers.iter_mut().flatten() {
            w.0 = clamp(now, w.0);
        }
        for ws in s.ws.iter_mut() {
            match ws {
                Ws::Waiting(t) => {
                    if let Some(x) = t.watch.as_mut() {
                        *x = clamp(now, *x);
                    }
                    if let Some(g) = t.grant.as_mut() {
                        g.fresh = false;
                    }
                    if let Some(px) = t.watch_msg.as_mut().filter(|_| self.cfg.watch_at) {
                        *px = px.saturating_sub(1);
                    }
                }
                Ws::Holding { until } => *until = clamp(now, *until),
                _ => {}
            }
        }
        for ch in s.chans.iter_mut() {
            for m in ch.iter_mut() {
                match m {
                    Msg::Grant { fresh, .. } => *fresh = false,
                    // the suggestion: a watch message names a time, not a delay from its
                    // reading
                    Msg::Watch { px, .. } if self.cfg.watch_at => *px = px.saturating_sub(1),
                    Msg::Watch { .. } => {}
                }
            }
        }
    }
}

// ---------------------------------------------------------------- symmetry

impl Representative for St {
    fn representative(&self) -> Self {
        canonical(self)
    }
}

/// Applies `f` to every fence the state holds.
fn each_fence(s: &mut St, mut f: impl FnMut(&mut u8)) {
    f(&mut s.fence);
    for h in s.holders.iter_mut() {
        f(&mut h.fence);
    }
    for w in s.ws.iter_mut() {
        if let Ws::Waiting(t) = w {
            if let Some(a) = t.anchor.as_mut() {
                f(a);
            }
            if let Some(g) = t.grant.as_mut() {
                f(&mut g.fence);
            }
        }
    }
    for ch in s.chans.iter_mut() {
        for m in ch.iter_mut() {
            if let Msg::Grant { fence, .. } = m {
                f(fence);
            }
        }
    }
}

/// The same state with every fence replaced by its rank among the state's fences.
fn renumber_fences(s: &mut St) {
    let mut seen = [false; 256];
    each_fence(s, |f| seen[*f as usize] = true);
    let mut rank = [0u8; 256];
    let mut r = 0u8;
    for (v, &used) in seen.iter().enumerate().skip(1) {
        if used {
            r += 1;
            rank[v] = r;
        }
    }
    each_fence(s, |f| *f = rank[*f as usize]);
}

fn rename_msg(m: Msg, f: impl Fn(W) -> W) -> Msg {
    match m {
        Msg::Grant { to, fence, fresh } => Msg::Grant {
            to: f(to),
            fence,
            fresh,
        },
        Msg::Watch { to, px } => Msg::Watch { to: f(to), px },
    }
}

/// (state, queue position, its hold (with its place among the holders), watcher fields) of a
/// waiter: what does not name another.
type WKey = (Ws, u8, Option<(u8, u8, bool, u8)>, u8);
type PKey = (Pr, [WKey; WPP], Fifo<Msg, MAXM>);

/// The same state with processes renamed into a canonical order (every process has the same
/// weights; waiters keep their place within their process), fences renumbered by rank.
pub fn canonical(s0: &St) -> St {
    let mut s = s0.clone();
    renumber_fences(&mut s);
    let wkey = |w: usize| -> WKey {
        let pos = s
            .queue
            .iter()
            .position(|&m| m as usize == w)
            .map_or(255, |i| i as u8);
        let hold = s
            .holders
            .iter()
            .enumerate()
            .find(|(_, h)| h.w as usize == w)
            .map(|(i, h)| (h.end, h.fence, h.claimed, i as u8));
        let mut wf = 0u8;
        for f in 0..2 {
            if let Some((at, m)) = s.watchers[f] {
                if m as usize == w {
                    wf |= 1 << f;
                    // the time it looks is part of its key
                    wf |= at << 2;
                }
            }
        }
        (s.ws[w], pos, hold, wf)
    };
    let mut keys: [(PKey, usize); NP] = std::array::from_fn(|p| {
        let local = |w: W| (w as usize % WPP) as W;
        (
            (
                s.procs[p],
                std::array::from_fn(|j| wkey(p * WPP + j)),
                s.chans[p].iter().map(|&m| rename_msg(m, local)).collect(),
            ),
            p,
        )
    });
    keys.sort_unstable();
    let mut pmap = [0usize; NP];
    for (new, (_, old)) in keys.iter().enumerate() {
        pmap[*old] = new;
    }
    if pmap.iter().enumerate().all(|(i, &p)| i == p) {
        return s;
    }
    let wm = |w: W| (pmap[pw(w)] * WPP + w as usize % WPP) as W;
    let mut t = s.clone();
    for (p, &q) in pmap.iter().enumerate() {
        t.procs[q] = s.procs[p];
        t.chans[q] = s.chans[p].iter().map(|&m| rename_msg(m, wm)).collect();
        for j in 0..WPP {
            t.ws[q * WPP + j] = s.ws[p * WPP + j];
        }
    }
    for h in t.holders.iter_mut() {
        h.w = wm(h.w);
    }
    for m in t.queue.iter_mut() {
        *m = wm(*m);
    }
    for (_, m) in t.watchers.iter_mut().flatten() {
        *m = wm(*m);
    }
    t
}

// ---------------------------------------------------------------- narration

impl Permits {
    pub fn wn(&self, w: W) -> String {
        format!("w{w} (P{}, weight {})", pw(w), self.weight(w))
    }

    fn holders_words(&self, s: &St) -> String {
        if s.holders.is_empty() {
            return "none".into();
        }
        let hs: Vec<String> = s
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

    /// One step of a trace, in words: the action, then what it changed.
    pub fn describe(&self, s: &St, a: &Act) -> String {
        let Some(n) = self.step(s, *a) else {
            return format!("{a:?} (disabled)");
        };
        let mut o = format!("tick {}: ", s.now);
        match *a {
            Act::Tick => {
                let _ = write!(o, "time passes to tick {}", n.now);
            }
            Act::Start(w) => {
                let _ = write!(o, "{} starts acquire_wait", self.wn(w));
                if matches!(n.ws[w as usize], Ws::Holding { .. }) {
                    o.push_str(": its plain attempt takes the permits");
                } else if !self.registered(s, pw(w)) {
                    o.push_str(": its plain attempt does not take them; it registers");
                } else {
                    o.push_str(" and registers (its process listens already)");
                }
            }
            Act::Attempt(w) => {
                let _ = write!(
                    o,
                    "{} attempts (permit_acquire with its member)",
                    self.wn(w)
                );
            }
            Act::Wake(w) => {
                let t = Self::wt(s, w as usize);
                let _ = write!(o, "{} wakes", self.wn(w));
                if let Some(g) = t.grant {
                    let _ = write!(
                        o,
                        " and reads a grant (fence {}{})",
                        g.fence,
                        if g.fresh {
                            ", from this tick"
                        } else {
                            ", from an earlier tick"
                        }
                    );
                } else if let Some(px) = t.watch_msg {
                    let _ = write!(o, " and reads a watch message (look in {px})");
                } else if s.now >= t.deadline {
                    o.push_str(" at its deadline");
                } else if t.watch.is_some_and(|x| x <= s.now) {
                    o.push_str(" (its watch time)");
                } else if t.hub_wake {
                    o.push_str(" (woken by its hub)");
                } else {
                    o.push_str(" (a left-over wake-up)");
                }
            }
            Act::Release(w) => {
                let _ = write!(o, "{} releases its guard (permit_release)", self.wn(w));
            }
            Act::Deliver(p) => match s.chans[p as usize][0] {
                Msg::Grant { to, fence, .. } => {
                    let _ = write!(
                        o,
                        "P{p}'s dispatcher receives the grant for {} (fence {fence})",
                        self.wn(to)
                    );
                    if !matches!(s.ws[to as usize], Ws::Waiting(_)) {
                        o.push_str(
                            "; its waiter has gone: it gives the grant back (permit_leave 'o')",
                        );
                    }
                }
                Msg::Watch { to, px } => {
                    let _ = write!(
                        o,
                        "P{p}'s dispatcher receives a watch message for {} (look in {px})",
                        self.wn(to)
                    );
                }
            },
            Act::Lose(p) => {
                let _ = write!(o, "a message on P{p}'s subscriber connection is lost");
            }
            Act::Notice(p) => {
                let _ = write!(o, "P{p}'s hub notices the loss and wakes its waiters");
            }
            Act::Freeze(p) => {
                let _ = write!(o, "P{p} freezes");
            }
            Act::Resume(p) => {
                let _ = write!(o, "P{p} resumes");
                if let Run::Frozen(k) = s.procs[p as usize].run {
                    if k >= self.cfg.notice {
                        o.push_str(" (the freeze is noticed: its waiters look)");
                    }
                }
            }
            Act::Kill(p) => {
                let _ = write!(o, "P{p} is killed");
            }
        }
        let mut eff: Vec<String> = Vec::new();
        if n.holders != s.holders && !matches!(a, Act::Tick) {
            eff.push(format!(
                "holders: {} (used {})",
                self.holders_words(&n),
                n.used
            ));
        } else if matches!(a, Act::Tick) && n.holders != s.holders {
            eff.push(format!("holders: {}", self.holders_words(&n)));
        }
        if n.used != s.used && n.holders == s.holders {
            eff.push(format!("used {}", n.used));
        }
        for p in 0..NP {
            let before = s.chans[p].len();
            let kept = if matches!(a, Act::Deliver(q) | Act::Lose(q) if *q as usize == p) {
                before - 1
            } else {
                before
            };
            if n.chans[p].len() > kept {
                for m in &n.chans[p][kept..] {
                    match *m {
                        Msg::Grant { to, fence, .. } => eff.push(format!(
                            "Redis publishes a grant to {} (fence {fence})",
                            self.wn(to)
                        )),
                        Msg::Watch { to, px } => eff.push(format!(
                            "Redis tells {} to watch (look in {px})",
                            self.wn(to)
                        )),
                    }
                }
            }
        }
        if n.queue != s.queue {
            let q: Vec<String> = n.queue.iter().map(|&w| format!("w{w}")).collect();
            eff.push(format!("queue [{}]", q.join(", ")));
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
        for w in 0..NW {
            let (b, f) = (s.ws[w], n.ws[w]);
            if b == f {
                continue;
            }
            let who = self.wn(w as W);
            match f {
                Ws::Holding { until } if !matches!(b, Ws::Holding { .. }) => {
                    let fence = Self::holder(&n, w as W).map_or(0, |h| h.fence);
                    eff.push(format!(
                        "{who} returns a guard valid until tick {until} (its hold's fence {fence})"
                    ))
                }
                Ws::Done if matches!(b, Ws::Waiting(_)) && !matches!(a, Act::Kill(_)) => {
                    eff.push(format!("{who} returns WaitTimeout"))
                }
                Ws::Waiting(t) if Some(w as W) == w_of(a) => {
                    if let (Act::Attempt(_), Some(at)) = (a, t.watch) {
                        if at > 0 {
                            eff.push(format!("{who} watches: it looks at tick {at}"));
                        }
                    }
                }
                _ => {}
            }
        }
        if n.flags & FIFO_BREAK != 0 && s.flags & FIFO_BREAK == 0 {
            eff.push("a grant passed an older listening waiter still queued".into());
        }
        if n.flags & FENCE_STALE != 0 && s.flags & FENCE_STALE == 0 {
            eff.push("a guard's fence is not its hold's".into());
        }
        let (vb, vn) = (self.valid_weight(s), self.valid_weight(&n));
        if vn > self.cfg.permits && vb <= self.cfg.permits {
            let hs: Vec<String> = (0..NW)
                .filter(|&x| matches!(n.ws[x], Ws::Holding { until } if n.now < until))
                .map(|x| self.wn(x as W))
                .collect();
            eff.push(format!(
                "valid guards now weigh {vn} > {} permits: {}",
                self.cfg.permits,
                hs.join(", ")
            ));
        }
        if matches!(a, Act::Tick) && n.idle > 0 {
            eff.push(format!(
                "a live waiter waited a tick while the queue's first listening waiter fitted ({} in a row)",
                n.idle
            ));
        }
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

    /// Where a trace ends.
    pub fn summary(&self, s: &St) -> String {
        let mut o = format!(
            "at tick {}: holders {} (used {}); queue [{}]",
            s.now,
            self.holders_words(s),
            s.used,
            s.queue
                .iter()
                .map(|&w| format!("w{w}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for w in 0..NW {
            let who = self.wn(w as W);
            let what = match s.ws[w] {
                Ws::Idle => "has not started".to_string(),
                Ws::Done => continue,
                Ws::Holding { until } if until > s.now => {
                    format!("holds a guard valid until tick {until}")
                }
                Ws::Holding { .. } => "holds a guard no longer valid".to_string(),
                Ws::Waiting(t) => {
                    let mut x = String::from("waits");
                    match t.watch {
                        Some(at) if at > s.now => {
                            let _ = write!(x, ", watching (looks at tick {at})");
                        }
                        Some(_) => x.push_str(", its watch time due"),
                        None => x.push_str(", not watching"),
                    }
                    let _ = write!(x, " (deadline tick {})", t.deadline);
                    x
                }
            };
            let run = match s.procs[pw(w as W)].run {
                Run::Running => "",
                Run::Frozen(_) => " [frozen]",
                Run::Killed => " [killed]",
            };
            let _ = write!(o, "; {who}{run} {what}");
        }
        o
    }

    /// A whole trace in words: one numbered line per step, then where it ends.
    pub fn narrate(&self, path: &[(St, Option<Act>)]) -> String {
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

fn w_of(a: &Act) -> Option<W> {
    match *a {
        Act::Start(w) | Act::Attempt(w) | Act::Wake(w) | Act::Release(w) => Some(w),
        _ => None,
    }
}
