//! The permits' Redis side (the fair counting semaphore of `src/permits.rs`, format 1 of
//! `src/redis/lua/permits.lua`), checked by `tests/permits.rs` (see the "Permits" section of
//! `README.md`).
//!
//! **What it is.** One key of `permits` (3) permits. Redis is one state machine whose
//! transitions are the permit scripts of `src/redis/lua/` (`permit_acquire.lua`,
//! `permit_release.lua`, `permit_extend.lua`, `permit_leave.lua`: `Permits::acquire`,
//! `release`, `extend`, `leave`), each one atomic step, with one function per stateful
//! function of `permits.lua` (same names: `state`, `drop_holder`, `purge`, `claim`,
//! `holding`, `rewatch`, `first_end`, `next_fence`, `hold`, `settle`, `serve`, `after_serve`,
//! `serve_freed`, `give_back`; `first_hub`: `holding()`'s second value, and as it was for
//! `Revert::P2FirstHub`) and of `queue.lua` that they use (shared with the lock, `queue.rs`:
//! `listener`, `process`, `publish`, `seen`, `watch(skip, px, later, fill, last)` with `skip`
//! a set of processes, `watching(pttl, holding)`). Redis state: the holders (token → lease
//! end, and the holder fences hash: fence and whether the hold is an unclaimed grant,
//! `"<fence> g"`), the state key's fence and `used`, the FIFO queue, the processes hash (seen
//! ticks and the two watcher fields `'!w1'`, `'!w2'`), and the messages `g2` and `w3` in
//! flight (one FIFO per subscriber connection).
//!
//! Three processes with two waiters each (one `Semaphore::acquire_wait` each, its own token
//! `w<weight>:<hub>/<uuid>`); every process has the same two weights (`Cfg::weights`, 2 and
//! 1 by default), so a heavy head can be unable to fit while a lighter waiter behind it could.
//! The waiter is the lock's, the same code (`waiter.rs`: `wait`, `take_grant`, `full_lease`),
//! with the dispatcher's `deliver` (a grant whose waiter has gone is given back with leave `o`
//! and its fence), the queue residue's leave `G` at the deadline, and the guard's release
//! (`permit_release.lua`).
//!
//! **Time** is a tick, as in the lock model. A lease ends at `run tick + TTL`; a lease whose
//! end has passed is dropped by the next script (`purge`, unbounded here), and the holders key
//! expires with its last lease. Every lease is the same TTL from the call that sets it, so the
//! holders are kept in the order their leases were set, which is the order of their ends in
//! Redis (`first_end`, `first_hub` and `ZRANGE HOLDERS 0 0`), also for leases that end in the
//! same tick here; `holding()` reads every holder (at most 6 here, the scripts read 16).
//!
//! **Faults**, budgeted (`World`): the configurations checked today use a message lost, a
//! process frozen and resumed, a process killed (its leases run out; Redis sees nobody
//! listening); the other families of the shared machinery (subscriber drops, stalled
//! connections, holders' own calls, clock steps, the retention) are off (their budgets 0).
//!
//! **Abstractions**: with no stalled connection every call runs in the tick it is sent and its
//! reply comes at once (the `{5}` limit mismatch, the `deaf` reply and the attempts' time
//! limits never happen); the purge and the queue scan are unbounded (PURGE 16, SCAN 200: the
//! "look now" `w2 0` of `after_serve`, sent when the head fits after a scan stopped at its
//! bound, never happens here); the state key outlives every lease (no retention); holders do
//! not refresh; voluntary steps happen between cascades of urgent steps (`CALM_OWN`); processes
//! are renamed into a canonical form (symmetry: every process has the same weights; waiters
//! keep their place within their process) and fences renumbered by rank.
//!
//! **Findings** (`tests/permits.rs`, README "Permits"), each fixed in the scripts and kept as
//! `Cfg::revert` (the fill as `Cfg::fill_first_last` false, the late watch message as
//! `Cfg::watch_at` false): P1 (1) failed without any fault (`Revert::P1Claim`); P2 (2b) failed
//! in freeze + kill (`Revert::P2Watchers`), and its first fix with one freeze
//! (`Revert::P2FirstHub`); P3: a dead head that did not fit held back lighter live waiters
//! (`Revert::P3DeadFirst`); the fill took the frozen first lease's process; a `w2` watch
//! message read late made its waiter look late.
//!
//! **Switches** (`Cfg::bug`): `Bug::Barging` (serve skips a head that does not fit and grants
//! the lighter ones behind it) and `Bug::DoubleFree` (give_back subtracts the token's weight
//! even when the token holds nothing: a late release of a lease already dropped frees permits
//! twice).

mod props;

use crate::fifo::Fifo;
use crate::system::*;
pub use crate::system::{Act, Pid, World, W};

pub use props::{
    CANARY_BLOCKED, CANARY_ENDED, CANARY_THREE, FENCE_REGRESS, FENCE_STALE, FIFO_BREAK, P1, P2,
    P2B, P3, P4,
};

/// The permits model.
pub type Permits = System<PermitKey>;
/// A state of the permits model.
pub type St = State<PermitKey>;

pub const NP: usize = 3;
pub const WPP: usize = 2;
pub const NW: usize = NP * WPP;

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

/// The permits model's parameters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// The processes, the times, the faults (shared with the lock model; `procs` and `wpp`
    /// stay `NP` and `WPP`).
    pub world: World,
    /// The key's permits (N).
    pub permits: u8,
    /// The weights of each process's waiters (every process has the same).
    pub weights: [u8; WPP],
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

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg {
            world: World {
                calm: CALM_RELEASE | CALM_OWN | CALM_FREEZE | CALM_KILL | CALM_RECOVER,
                ..World::default()
            },
            permits: 3,
            weights: [2, 1],
            idle_bound: 0,
            idle_strict: false,
            bug: Bug::None,
            revert: None,
            fill_first_last: true,
            watch_at: true,
        }
    }
}

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

/// The permits' keys (besides the queue and the processes hash).
#[derive(Clone, Debug, Hash, PartialEq, Eq, Default)]
pub struct PermitKey {
    /// The holders, in the order their leases were set: every lease is the same TTL from the
    /// call that sets it, so this is the order of their ends (the sorted set's order; leases
    /// set in the same tick end in the same tick here, but one after the other in Redis).
    pub holders: Fifo<Hd, NW>,
    /// The state key's `used` (0 whenever the holders key is gone).
    pub used: u8,
    /// The state key's fence (the last fence given).
    pub fence: u8,
}

impl Key for PermitKey {
    type Cfg = Cfg;
    /// The waiter's hold: its lease end, fence, claim marker and place among the holders.
    type WKey = Option<(u8, u8, bool, u8)>;
    type PKey = ();
    const ALIKE: bool = false;
    const ATTEMPT: &'static str = "attempts (permit_acquire with its member)";

    fn world(cfg: &Cfg) -> &World {
        &cfg.world
    }

    fn rules(cfg: &Cfg) -> Rules {
        Rules {
            watch_msg: if cfg.watch_at {
                WatchMsg::Countdown
            } else {
                WatchMsg::Delay
            },
            clamp: true,
            drop_stale_watch: false,
            thaw: false,
            ..Rules::default()
        }
    }

    fn init(_: &Cfg) -> PermitKey {
        PermitKey::default()
    }

    fn acquire(m: &Permits, s: &mut St, w: W, member: bool) -> Reply {
        m.script(s, |m, s| m.acquire(s, w, member))
    }
    fn release(m: &Permits, s: &mut St, w: W) -> Reply {
        m.script(s, |m, s| m.release(s, w))
    }
    fn extend(m: &Permits, s: &mut St, w: W, ttl: u8) -> Reply {
        m.script(s, |m, s| m.extend(s, w, ttl))
    }
    fn leave(m: &Permits, s: &mut St, w: W, member: bool, flag: Flag) -> Reply {
        m.script(s, |m, s| m.leave(s, w, member, flag))
    }

    /// (3): a returned guard's fence is its hold's, whose lease runs.
    fn guard(_: &Permits, s: &mut St, w: usize, fence: u8, _until: u8, _reference: u8) {
        match Permits::holder(s, w as W) {
            Some(h) if h.fence == fence && h.end > s.now => {}
            _ => s.flags |= FENCE_STALE,
        }
    }
    fn before_tick(m: &Permits, s: &mut St) {
        m.before_tick(s)
    }
    fn expire(m: &Permits, s: &mut St) {
        m.expire(s)
    }
    fn settle(m: &Permits, s: &mut St) {
        m.forget_fences(s)
    }
    fn properties() -> Vec<stateright::Property<Permits>> {
        props::properties()
    }

    fn each_fence(&mut self, f: &mut impl FnMut(&mut u8)) {
        f(&mut self.fence);
        for h in self.holders.iter_mut() {
            f(&mut h.fence);
        }
    }
    fn wkey(s: &St, w: usize) -> Self::WKey {
        s.key
            .holders
            .iter()
            .enumerate()
            .find(|(_, h)| h.w as usize == w)
            .map(|(i, h)| (h.end, h.fence, h.claimed, i as u8))
    }
    fn pkey(_: &St, _: usize) {}
    fn rename(&mut self, wm: &impl Fn(W) -> W, _: &impl Fn(Pid) -> Pid) {
        for h in self.holders.iter_mut() {
            h.w = wm(h.w);
        }
    }

    fn wn(m: &Permits, w: W) -> String {
        format!("w{w} (P{}, weight {})", m.pw(w), m.weight(w))
    }
    fn start_words(m: &Permits, s: &St, n: &St, w: W) -> &'static str {
        if matches!(n.ws[w as usize], Ws::Holding { .. }) {
            ": its plain attempt takes the permits"
        } else if !m.registered(s, m.pw(w)) {
            ": its plain attempt does not take them; it registers"
        } else {
            " and registers (its process listens already)"
        }
    }
    fn effects(m: &Permits, s: &St, n: &St, a: &Act, at: Part, eff: &mut Vec<String>) {
        m.effects(s, n, a, at, eff)
    }
    fn summary_head(m: &Permits, s: &St) -> String {
        format!("holders {} (used {})", m.holders_words(s), s.key.used)
    }
}

impl Permits {
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

    fn holder(s: &St, w: W) -> Option<Hd> {
        s.key.holders.iter().copied().find(|h| h.w == w)
    }

    // mirrors permits.lua -> state(): `used` (0 when the holders key is gone). Returns it (the
    // scripts' `before`).
    fn state(&self, s: &mut St) -> u8 {
        if s.key.holders.is_empty() {
            s.key.used = 0;
        }
        s.key.used
    }

    // mirrors permits.lua -> drop_holder(s, token)
    fn drop_holder(&self, s: &mut St, w: W) {
        if let Some(i) = s.key.holders.iter().position(|h| h.w == w) {
            s.key.holders.remove(i);
        }
        s.key.used = s.key.used.saturating_sub(self.weight(w));
    }

    // mirrors permits.lua -> purge(s): every lease whose end has passed (unbounded here)
    fn purge(&self, s: &mut St) {
        let now = s.now;
        let ended: Fifo<W, NW> = s
            .key
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
        s.key
            .holders
            .iter()
            .map(|h| h.end.saturating_sub(s.now))
            .min()
            .unwrap_or(0)
    }

    // mirrors permits.lua -> holding(): the processes of the holders whose leases end first
    // (ZRANGE HOLDERS 0 15: here every holder), a bit each; its second value, the first's
    // process, is `first_hub()`, read by `watch`
    fn holding(&self, s: &St) -> u8 {
        s.key
            .holders
            .iter()
            .fold(0, |set, h| set | 1 << self.pw(h.w))
    }

    // mirrors permits.lua -> rewatch(L, px, later): `L.watch(set, px, later, true, first)`
    // with `set, first = holding()` (`first` with `Cfg::fill_first_last`).
    // With P2 reverted, the call it replaced: `watch(first_hub(), px, later)`
    // (`Revert::P2FirstHub`), or `watch('', px)`, extend's `watch(HUB, px, true)` (`caller`,
    // `Revert::P2Watchers`)
    fn rewatch(&self, s: &mut St, px: u8, later: bool, caller: Option<usize>) {
        match self.cfg.revert {
            Some(Revert::P2Watchers) => {
                let skip = caller.map_or(0, |p| 1 << p);
                self.watch(s, skip, px, later, false, None)
            }
            Some(Revert::P2FirstHub) => {
                let skip = self.first_hub(s).map_or(0, |p| 1 << p);
                self.watch(s, skip, px, later, false, None)
            }
            _ => {
                let skip = self.holding(s);
                let last = self.first_hub(s).filter(|_| self.cfg.fill_first_last);
                self.watch(s, skip, px, later, true, last)
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
        s.key
            .holders
            .iter()
            .min_by_key(|h| h.end)
            .map(|h| self.pw(h.w))
    }

    // mirrors permits.lua -> next_fence(s)
    fn next_fence(&self, s: &mut St) -> u8 {
        s.key.fence += 1;
        s.key.fence
    }

    // mirrors permits.lua -> hold(s, token, px, granted)
    fn hold(&self, s: &mut St, w: W, px: u8, granted: bool) -> u8 {
        let before = s.key.fence;
        let f = self.next_fence(s);
        if f <= before || s.key.holders.iter().any(|h| h.fence >= f) {
            s.flags |= FENCE_REGRESS;
        }
        let h = Hd {
            w,
            end: s.now + px,
            fence: f,
            claimed: !granted && !self.reverted(Revert::P1Claim),
        };
        // ZADD: the lease set last ends last
        if let Some(i) = s.key.holders.iter().position(|x| x.w == w) {
            s.key.holders.remove(i);
        }
        s.key.holders.push(h);
        s.key.used += self.weight(w);
        f
    }

    // mirrors permits.lua -> claim(token): the hold of `w` is its waiter's now (its fence
    // loses the ' g'; nothing with `Revert::P1Claim`)
    fn claim(&self, s: &mut St, w: W) {
        if self.reverted(Revert::P1Claim) {
            return;
        }
        if let Some(h) = s.key.holders.iter_mut().find(|h| h.w == w) {
            h.claimed = true;
        }
    }

    // mirrors permits.lua -> settle(s): with no holder left, used is 0 (the holders key expires
    // with its last lease: `Tick`)
    fn settle(&self, s: &mut St) {
        if s.key.holders.is_empty() {
            s.key.used = 0;
        }
    }

    // mirrors permits.lua -> serve(L, s, self): grant the heads in order while they fit.
    // Returns the caller's fence if it was granted, whether the queue changed, how many others
    // were granted.
    fn serve(&self, s: &mut St, me: Option<W>) -> (Option<u8>, bool, u8) {
        let (n, ttl) = (self.cfg.permits, self.world().ttl);
        let heads = s.queue;
        let mut done = 0u32;
        let mut mine = None;
        let mut granted = 0;
        for &head in heads.iter() {
            let w = self.weight(head);
            let gone = Some(head) != me && self.process(s, self.pw(head)) == Status::Gone;
            if w > n || (gone && self.dead_first()) {
                // can never fit, or nobody listens for it: dropped (a dead head holds back
                // nobody)
                done |= 1 << head;
            } else if s.key.used + w > n {
                if self.cfg.bug == Bug::Barging {
                    continue;
                }
                break;
            } else if Some(head) == me {
                done |= 1 << head;
                mine = Some(self.hold(s, head, ttl, false));
            } else {
                done |= 1 << head;
                // (with P3 reverted, a dead head that fits is dropped here, not granted)
                if !gone {
                    let f = self.hold(s, head, ttl, true);
                    granted += 1;
                    let at = self.rnow(s);
                    let g = Msg::Grant {
                        to: head,
                        fence: f,
                        px: ttl,
                        at,
                    };
                    self.publish(s, self.pw(head), g);
                }
            }
        }
        let kept: Fifo<W, MAXW> = s
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
            self.del_pkey(s);
            return;
        }
        let mut px = self.first_end(s);
        let head = s.queue[0];
        if s.key.used + self.weight(head) <= self.cfg.permits {
            px = 0;
        }
        self.rewatch(s, px, false, None);
    }

    // mirrors permits.lua -> serve_freed(s, before, always)
    fn serve_freed(&self, s: &mut St, before: u8, always: bool) -> u8 {
        if !always && s.key.used >= before {
            return 0;
        }
        if s.queue.is_empty() {
            if always && self.holding_rule() {
                self.del_pkey(s);
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
                s.key.used = s.key.used.saturating_sub(self.weight(w));
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

    // mirrors src/redis/lua/permit_acquire.lua (with MEMBER and HUB when `member`)
    fn acquire(&self, s: &mut St, w: W, member: bool) -> Reply {
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
        if !queued && s.key.used + self.weight(w) <= self.cfg.permits {
            let f = self.hold(s, w, self.world().ttl, false);
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
        let p = self.pw(w);
        self.seen(s, Some(p), true);
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
        let watcher = self.watching(s, w, pttl, holding, false);
        self.settle(s);
        Reply::Locked {
            remaining: pttl,
            queued: Some(Queued {
                fence: s.key.fence,
                deaf,
                watcher,
            }),
        }
    }

    // mirrors src/redis/lua/permit_release.lua
    fn release(&self, s: &mut St, w: W) -> Reply {
        let before = self.state(s);
        self.purge(s);
        let r = self.give_back(s, w);
        self.serve_freed(s, before, false);
        self.settle(s);
        if r == 1 {
            Reply::Done
        } else {
            Reply::NotHeld
        }
    }

    // mirrors src/redis/lua/permit_extend.lua (HUB: the caller's process)
    fn extend(&self, s: &mut St, w: W, ttl: u8) -> Reply {
        let before = self.state(s);
        self.purge(s);
        let Some(h) = Self::holder(s, w) else {
            self.serve_freed(s, before, false);
            self.settle(s);
            return Reply::NotHeld;
        };
        // ZADD XX: the renewed lease ends last
        let i = s.key.holders.iter().position(|x| x.w == w).unwrap();
        let mut renewed = s.key.holders.remove(i);
        renewed.end = s.now + ttl;
        s.key.holders.push(renewed);
        self.claim(s, w);
        self.serve_freed(s, before, false);
        self.settle(s);
        if !s.queue.is_empty() {
            let fe = self.first_end(s);
            self.rewatch(s, fe, true, Some(self.pw(w)));
        }
        Reply::Renewed(h.fence)
    }

    // mirrors src/redis/lua/permit_leave.lua (the queue residue's 'G'; the dispatcher's 'o'
    // for a grant whose waiter has gone, with no member)
    fn leave(&self, s: &mut St, w: W, member: bool, flag: Flag) -> Reply {
        let before = self.state(s);
        self.purge(s);
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
            if ok && self.give_back(s, w) == 1 {
                r = Reply::Done;
            }
        }
        // the queue is served and its watchers chosen again (the leaver may have been one)
        let granted = self.serve_freed(s, before, left);
        if !self.holding_rule() && granted == 0 && left {
            // before P2's second fix: nobody granted, the watchers kept fit
            if !s.queue.is_empty() {
                let fe = self.first_end(s);
                self.rewatch(s, fe, false, None);
            } else {
                self.del_pkey(s);
            }
        }
        self.settle(s);
        r
    }
}
