//! Several keys at once (issue 32): the grant rule of a set of keys in one Cluster slot, as the
//! scripts build it, and the two naive rules it replaces, checked exhaustively. The lock model
//! (`lock.rs`) has one key; this one has three keys and their queues, and sets of them.
//!
//! **The rule (`Rule::AllAtOnce`)**, that of `lua/set_acquire.lua`, `set_release.lua`,
//! `set_leave.lua` and `serve` in `lock.lua`. A set's first call serves each of its free keys'
//! queues, then takes every key when each is free with an empty queue, or joins the back of
//! every one of its keys' queues in one step, holding nothing. A call that serves a free key
//! (`serve_key`) walks its queue from the head: a departed head (its process died) leaves every
//! queue it is in, and each other free key whose queue it headed gets a look (`drop_departed`:
//! the scripts tell that key's watchers to look now, and the look serves it; the call itself
//! does not, so its work stays bounded); the first live head is granted all of its keys in one
//! step when it is ready (each of them free, and it heads each of their queues: only the heads
//! are read there), else it stays at the head and the key stays free. A release frees every
//! key, then serves each one still free; a leave serves the free keys whose queue it headed; a
//! holder's keep-alive refresh drops departed heads at its keys' queues.
//!
//! **FIFO for overlapping sets**, as this rule defines it: a set is never granted while an
//! older set that shares a key with it still waits ("older": joined its queues first; joining
//! is one step, so the order is one order for every queue). Sets that share no key are not
//! ordered: a set that waits for a held key does not hold back a later set on other keys.
//! No deadlock follows from the same order: the oldest waiting set is at the head of each of
//! its queues, so it is granted as soon as its keys are free, and keys held by running holders
//! are freed by their release, by a crashed holder's lease ending.
//!
//! **The naive rules**, each with a counterexample (`tests/sets.rs`):
//! - `Rule::EachInTurn` (Redisson's `MultiLock` with waiting, composite locks in the caller's
//!   order): each key of the caller's order in turn, through that key's own FIFO queue, the keys
//!   taken so far held while waiting for the next: A,B against B,A deadlocks;
//! - `Rule::WhenAllFree` (one script, polling: node-redlock's arrays): a set takes its keys
//!   when it finds them all free, queue order ignored: a later set passes an older one that
//!   overlaps it (and can starve it).
//!
//! `Rule::EachInTurn` with every set **sorted** (one order for every caller) is the path built
//! first (`src/sets/in_order.rs`, `Locker::acquire_many_wait` with `LockOptions::with_ordered_sets`;
//! the only one for keys in several Cluster slots): it keeps (S1), (S3)-(S6) under the same
//! faults and breaks (S2) only, FIFO holding per key (`tests/sets.rs`). What the model leaves
//! out of it: a key already taken that is lost while a later one is waited for (a Redis
//! restart: the lock model's fault), on which the implementation releases every key and takes
//! the set again from the first.
//!
//! **Sets taken at once by polling** (`Cfg::polling`: `take_set.lua`, built for keys on one
//! node; a polling locker's wait repeats it) can run beside the queued sets of any rule: an
//! attempt takes every key of its set when each is free and its queue empty (the script
//! reads a queue from the fence's `q`), else serves one free key's queue (the release call
//! the implementation sends on such a key: its waiters' watchers may be gone), else is only
//! its backoff. They are in no queue, so (S2) is among queued sets only; (S7) instead: a set
//! taken at once never takes a key a live waiter is queued on. `Cfg::poll_ignores_queues`
//! (node-redlock's arrays, which look at the keys only) breaks (S7) in 5 steps: a lease that
//! ended leaves a free key with a waiter queued, and a polling set takes it.
//!
//! **Faults:** a waiter's process dies while it waits (its members stay queued until a call
//! finds them at a head) or while it holds (its keys stay held until their lease ends, which
//! Redis notices in any order; then a watcher looks); a waiter leaves (a timeout or a
//! cancellation: its members are removed, and the keys it touched served). **Abstracted:** the
//! clock (a lease ends at any step after its holder died; holders release at any step),
//! messages (a grant is delivered: the lock model checks its faults: loss, freeze, drop, stall,
//! which a set's one grant message meets as a single key's does), the processes hash and the
//! watchers (a look at a key is offered once its dead holder's lease ended with waiters
//! queued, and until a call serves that key: the watcher whose look the lock model checks).
//!
//! **Properties:** (S1) no key has two holders, and a holder holds every key of its set; (S2)
//! FIFO as defined above; (S3) no deadlock: every run ends with every waiter ended (granted
//! and released, left, or dead); (S4) nothing left behind: at the end, every key free and
//! every queue empty; (S5) no waiting (for queued sets): after every step, no live set that
//! the rule would grant is left waiting, except on a key whose look is due (a lease that just
//! ended: its watcher's look is the cost, as for one key; or a departed head dropped by a call
//! on another key: the look it was given). (S5) is this model's idle bound, and what finds a
//! call that forgets to serve a queue it changed.
//!
//! **What the model found** (before any script): every queue whose head a call changes must be
//! served by that call, or get a look. A departed waiter found at the head of one queue is
//! dropped from all of its queues, and each of them whose head it was must be served; serving
//! fewer leaves a live set behind it waiting on free keys (`Cfg::drop_serves` off: no look,
//! (S5); a first draft of this model served only the other queues, and deadlocked (S3) with
//! five sets: the head judged had a departed waiter before it on a free key). And a cost the
//! rule has that one key does not: a departed waiter at the head of a free key's queue,
//! blocked by another key of its set that a live holder keeps, holds back the sets behind it
//! on the free key until a call finds it; a process that dies is noticed only by a call. (S5)
//! does not count it (a dead head is not live), and (S3) holds because the holder releases.
//! The design's answer, modelled here: a holder's keep-alive refresh drops departed heads at
//! its keys' queues (`Act::Refresh`), so it finds the departed head within one refresh
//! interval, and the look then serves the free key; (S6) a refresh leaves no departed waiter at
//! the head of its keys' queues; (S7) above.

use stateright::{Model, Property};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Keys in the model (A, B, C).
pub const KEYS: usize = 3;

/// The grant rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// The rule to build: queued once in every key's queue, granted all at once.
    AllAtOnce,
    /// Naive: each key in the caller's order, each through its own queue, held while waiting.
    EachInTurn,
    /// Naive: all at once when all are free, the queues ignored (a poller).
    WhenAllFree,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct Cfg {
    pub rule: Rule,
    /// Each waiter's keys, in its caller's order (the order matters to `EachInTurn` only).
    pub sets: Vec<Vec<usize>>,
    /// Processes that die (each a waiter's, waiting or holding).
    pub deaths: u8,
    /// Waiters that leave (a timeout or a cancellation).
    pub leaves: u8,
    /// Holders' keep-alive refreshes in a run (`AllAtOnce`: each drops departed heads at the
    /// holder's keys' queues; the naive rules: each serves them).
    pub refreshes: u8,
    /// A departed waiter dropped from the head of one queue gives each other free key whose
    /// queue it headed a look (as implemented, or, `EachInTurn`, a serve; false: none, which
    /// (S5) breaks).
    pub drop_serves: bool,
    /// Waiters (by index; missing: false) that take their set **at once by polling**
    /// (`take_set.lua`, a polling locker's `acquire_many_wait`), beside the queued ones of
    /// `rule`: an attempt takes every key when each is free and its queue empty, else, when
    /// one of them is free with a queue, serves that queue (the release call the
    /// implementation sends on such a key), else changes nothing (its backoff).
    pub polling: Vec<bool>,
    /// Mutation: a polling attempt ignores the queues (takes free keys with waiters queued:
    /// (S7) breaks).
    pub poll_ignores_queues: bool,
    /// The keys are a Cluster's (`AllAtOnce`): a call grants a set only when it declared every
    /// one of its keys; otherwise the key it serves is reserved for the set, which takes its
    /// keys by its own call (`Act::Claim`), or lets the reservation lapse (`Act::Lapse`).
    pub cluster: bool,
    /// Reservations of live sets that lapse in a run (`Cfg::cluster`: the set's process was
    /// slow or frozen past the claim window); a dead set's always lapses.
    pub lapses: u8,
    /// A claim that cannot take every key serves each key it gives back (as built; false:
    /// only frees them, which (S5) breaks).
    pub claim_serves: bool,
    /// Each key's hash slot (`Rule::AllAtOnce`; default: one slot for all).
    pub slots: [u8; KEYS],
    /// Waiters (by index; missing: false) that take their set **in order** (`Rule::AllAtOnce`
    /// beside them: keys in several slots, `with_ordered_sets`): each run of keys of one slot,
    /// in slot order, waited for as a set at once, the runs before it held meanwhile.
    pub in_order: Vec<bool>,
    /// Mutation: an in-order waiter waits for one key at a time, holding the keys of its slot
    /// before it (the path as first built; (S3) breaks beside a set waiting at once).
    pub by_key: bool,
    /// Keys per `take_set.lua` call (`TAKE_SET_MAX`, 256 in the code) of an in-order waiter's
    /// burst (`attempt_all`): the keys after a run it waited for are tried at once, a slot's
    /// run in calls of at most this many keys, each call all or none and each its own step
    /// (`Act::Call`, in any order), then the outcome settled (`Act::Settle`). A run of more
    /// keys takes more calls.
    pub call_max: usize,
    /// Waiters whose process freezes while they wait (SIGSTOP, a long pause: its connections
    /// stay up, so the scripts see it listening, but it takes no step), each resumed later
    /// (`Act::Resume`) or never before the property is judged.
    pub freezes: u8,
    /// One fix of review 3 taken back: its finding's interleaving is then possible.
    pub revert: Option<Revert>,
}

/// The fixes of review 3's findings 1-3, each as it was before (`Cfg::revert`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Revert {
    /// Finding 1 (`src/sets/in_order.rs`, `take_in_order`): a call of a burst that fails keeps the
    /// calls before it, even those of the very slot's run it is in (a run split into calls);
    /// the rest of that run is then waited for, holding its first part (now: the keys taken of
    /// that run are given back, what is kept ends at a slot boundary, and the whole run is
    /// waited for).
    SplitRun,
    /// Finding 2 (`serve` in lock.lua): a set member at the head of a free key's queue that
    /// is not ready stays there, whatever its other queues say (now: when it is missing from
    /// the queue of another of its keys, and that key is not reserved for it, it is judged
    /// departed on this key: dropped, as `gone_set` drops, and its process told `d2`).
    FrozenSet,
    /// Finding 3 (`leave_blocked` in lock.lua): a key a release leaves free for a set at the
    /// head of its queue that is not ready keeps its fence counter's life (the last hold's
    /// lease plus the retention), shorter than the queue's (`NO_LEASE` plus the retention), so
    /// the counter, and its `q` hint, can expire first (now: `leave_blocked` gives the counter
    /// the queue's life).
    FenceLife,
    /// Finding 3's other door, found by this model: a set queued first on a free key
    /// (set_acquire.lua gives the new queue `NO_LEASE` plus the retention) wrote the fence's
    /// `q` `KEEPTTL` (or started a missing counter with the retention only): the counter
    /// expired first (now: it is given the queue's life there too).
    FenceLifeInKeep,
}

/// A key's fence counter, the key that carries its `q` hint ("waiters may be queued"), beside
/// its queue: the clock reduced to the order of the two expiries (`Cfg::revert`
/// `FenceLife` only makes it anything but `Kept`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fence {
    /// It expires no earlier than the queue (or the queue is empty).
    Kept,
    /// It expires before the queue (`Act::FenceExpires` may come).
    Short,
    /// It expired while the queue lives (or was written again without `q`): nothing says
    /// waiters may be queued.
    Gone,
}

impl Default for Cfg {
    /// A,B against B,A, and a cycle B,C and C,A (dining philosophers), one death and one leave.
    fn default() -> Cfg {
        Cfg {
            rule: Rule::AllAtOnce,
            sets: vec![vec![0, 1], vec![1, 0], vec![1, 2], vec![2, 0]],
            deaths: 1,
            leaves: 1,
            refreshes: 1,
            drop_serves: true,
            polling: Vec::new(),
            poll_ignores_queues: false,
            cluster: false,
            lapses: 1,
            claim_serves: true,
            slots: [0; KEYS],
            in_order: Vec::new(),
            by_key: false,
            call_max: KEYS,
            freezes: 0,
            revert: None,
        }
    }
}

/// A waiter's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ph {
    Idle,
    Waiting,
    Holding,
    /// Released its set.
    Done,
    /// Left while waiting (what it had taken given back).
    Left,
    /// Its process died: what it holds stays until the lease ends, its members stay queued
    /// until a call finds them.
    Dead,
}

/// The state: Redis' keys and queues, the waiters, the budgets, the ghosts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct St {
    pub ph: Vec<Ph>,
    /// Redis: each key's holder (a waiter), while its lease lasts.
    pub holder: [Option<u8>; KEYS],
    /// Redis (`Cfg::cluster`): a key reserved for a set ('r'), until it takes it or the
    /// reservation lapses. Nobody holds it, and nobody else may take it.
    pub reserved: [Option<u8>; KEYS],
    /// Redis: each key's queue, oldest first.
    pub queue: [Vec<u8>; KEYS],
    /// Ghost: the order in which waiters began to wait (0: not yet).
    pub seq: Vec<u8>,
    pub next_seq: u8,
    pub deaths_left: u8,
    pub leaves_left: u8,
    pub refreshes_left: u8,
    pub lapses_left: u8,
    /// Ghost: a grant broke FIFO (S2).
    pub unfair: bool,
    /// A look at the key is due, and no call has served it since: a dead holder's lease of
    /// it ended with waiters queued, or a departed head of its queue was dropped by a call on
    /// another key (a watcher looks: the only step these offer).
    pub lapsed: [bool; KEYS],
    /// Ghost: a refresh granted a set (the canary of the departed head a refresh finds).
    pub refresh_granted: bool,
    /// Ghost: a refresh dropped a departed head (the scripts' canary of the same: there the
    /// waiters it held back on a free key are served by that key's watchers' look).
    pub refresh_dropped: bool,
    /// Ghost: a refresh left a departed waiter at the head of one of its keys' queues (S6).
    pub refresh_missed: bool,
    /// Ghost: a polling set took a key while a live waiter was queued on it (S7).
    pub poll_passed: bool,
    /// Ghost: a polling attempt served a free key's queue (a canary).
    pub poll_served: bool,
    /// Ghost (`Cfg::cluster`): a set took its keys by its own claim of a reservation.
    pub claimed: bool,
    /// In-order waiters' bursts (`Cfg::call_max`): the keys whose call ran in this burst.
    pub called: Vec<u8>,
    /// The keys whose call failed in this burst.
    pub failed: Vec<u8>,
    /// An in-order waiter whose burst failed: its next step waits for the run it stopped in.
    pub must_wait: Vec<bool>,
    /// Frozen processes (`Cfg::freezes`): they take no step; the scripts see them listening.
    pub frozen: Vec<bool>,
    /// A process told `d2` (its set was dropped from a queue): it makes its first call again
    /// when it runs (`Act::Requeue`).
    pub told: Vec<bool>,
    pub freezes_left: u8,
    /// Redis: each key's processes hash's lapse marks (`x`), as bits of waiters (one process
    /// each): a reservation of this key lapsed unclaimed. A walk on this key judges a marked
    /// process gone; on another key, only that key's mark counts.
    pub marked: [u8; KEYS],
    /// Redis: each key's fence counter against its queue (`Fence`).
    pub fence: [Fence; KEYS],
    /// Redis: a key taken in state `p` ("no waiters") past a queue whose hint had expired; its
    /// release is a bare `DEL`, which serves nobody (a waiter queueing behind makes it `q`).
    pub taken_free: [bool; KEYS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// The waiter's first call (`acquire_many_wait`).
    Start(u8),
    /// A poller's retry (`WhenAllFree`).
    Poll(u8),
    Release(u8),
    Leave(u8),
    /// A holder's keep-alive refresh: it also serves its keys' queues (it finds a departed
    /// waiter at their heads, and drops it).
    Refresh(u8),
    Die(u8),
    /// A dead holder's lease of this key ends (Redis deletes the key).
    Expire(u8),
    /// A watcher looks at this key: free, with a queue.
    Look(u8),
    /// A set told its key is reserved for it takes its keys by its own call (or gives the
    /// reservations back: it cannot take them all).
    Claim(u8),
    /// A waiter taking its set in order, a run held, waits for its next run (`Cfg::in_order`).
    Next(u8),
    /// A reservation of this key ends before its set took it (its process was slow, frozen or
    /// dead): a live set is dropped from the key's queue, told, and queues again at the back
    /// of all of its queues; a look at the key is due. (A frozen set's: its process is marked
    /// lapsed in this key's processes hash, and the look drops it from this key's queue.)
    Lapse(u8),
    /// An in-order waiter's `take_set.lua` call in a burst (`Cfg::call_max`): the call of
    /// the keys from this key (a chunk of one slot's run), all or none.
    Call(u8, u8),
    /// An in-order waiter's burst, every call answered and one failed, settled: the keys of
    /// the calls after the first that failed given back (and, as fixed, those of its run
    /// before it), then the run waited for.
    Settle(u8),
    /// The waiter's process freezes (`Cfg::freezes`).
    Freeze(u8),
    /// A frozen process runs again.
    Resume(u8),
    /// A set told `d2` makes its first call again (it queues at the back of every queue).
    Requeue(u8),
    /// This key's fence counter expires while its queue lives (`Revert::FenceLife` only).
    FenceExpires(u8),
}

/// The model.
pub struct Sets {
    pub cfg: Cfg,
    /// Report only the first violation of each property (the shortest traces with BFS).
    pub first_only: bool,
    latched: [AtomicBool; 6],
}

impl Sets {
    pub fn new(cfg: Cfg) -> Sets {
        Sets {
            cfg,
            first_only: false,
            latched: Default::default(),
        }
    }

    fn latch(&self, n: usize, ok: bool) -> bool {
        ok || (self.first_only && self.latched[n].swap(true, Relaxed))
    }

    fn keys(&self, w: u8) -> &[usize] {
        &self.cfg.sets[w as usize]
    }

    /// Whether `w` takes its set at once by polling (`Cfg::polling`).
    fn polls(&self, w: u8) -> bool {
        self.cfg.polling.get(w as usize).copied().unwrap_or(false)
    }

    /// Whether `w` takes its set in order, run by run (`Cfg::in_order`).
    fn ordered(&self, w: u8) -> bool {
        self.cfg.in_order.get(w as usize).copied().unwrap_or(false)
    }

    fn reverted(&self, r: Revert) -> bool {
        self.cfg.revert == Some(r)
    }

    fn bit(x: usize) -> u8 {
        1 << x
    }

    /// Whether `k`'s fence says waiters may be queued (its `q` hint): a queue, and a fence
    /// counter that did not expire before it.
    fn hint(s: &St, k: usize) -> bool {
        !s.queue[k].is_empty() && s.fence[k] != Fence::Gone
    }

    /// Whether a walk on `k` judges member `h` gone: nobody listens for its process (dead), or
    /// its process is marked lapsed in `k`'s processes hash.
    fn gone(s: &St, h: u8, k: usize) -> bool {
        s.ph[h as usize] == Ph::Dead || s.marked[k] & Self::bit(h as usize) != 0
    }

    /// The fence of a key a call leaves free with a queue that it gives `NO_LEASE` plus the
    /// retention (`leave_blocked`, or, `by_keep`, a set queued first on a free key): as long as
    /// the queue's (the fix), or, reverted, shorter.
    fn left_free(&self, by_keep: bool) -> Fence {
        let reverted = if by_keep {
            self.reverted(Revert::FenceLifeInKeep)
        } else {
            self.reverted(Revert::FenceLife)
        };
        if reverted {
            Fence::Short
        } else {
            Fence::Kept
        }
    }

    /// `w`'s keys in the in-order path's one order: by slot, then by key.
    fn sorted(&self, w: u8) -> Vec<usize> {
        let mut keys = self.keys(w).to_vec();
        keys.sort_by_key(|&k| (self.cfg.slots[k], k));
        keys
    }

    /// Whether in-order waiter `w` is in a burst (`Cfg::call_max`): a run taken, more keys
    /// to take, not waiting for a run (in no queue, no reservation, not told `d2` while it
    /// waited for one: it then queues for that run again), not told to wait.
    fn in_burst(&self, s: &St, w: u8) -> bool {
        let i = w as usize;
        self.ordered(w)
            && !self.cfg.by_key
            && s.ph[i] == Ph::Waiting
            && !s.frozen[i]
            && !s.must_wait[i]
            && !s.told[i]
            && s.holder.contains(&Some(w))
            && !s.queue.iter().any(|q| q.contains(&w))
            && !s.reserved.contains(&Some(w))
    }

    /// The calls of `w`'s burst, in order: the keys it did not hold when the burst began (or
    /// took by its calls), each slot's run in chunks of `Cfg::call_max` keys.
    fn calls(&self, s: &St, w: u8) -> Vec<Vec<usize>> {
        let keys: Vec<usize> = self
            .sorted(w)
            .into_iter()
            .filter(|&k| s.holder[k] != Some(w) || s.called[w as usize] & Self::bit(k) != 0)
            .collect();
        let mut out = Vec::new();
        let mut i = 0;
        while i < keys.len() {
            let slot = self.cfg.slots[keys[i]];
            let end = i + keys[i..]
                .iter()
                .take_while(|&&k| self.cfg.slots[k] == slot)
                .count();
            out.extend(
                keys[i..end]
                    .chunks(self.cfg.call_max.max(1))
                    .map(|c| c.to_vec()),
            );
            i = end;
        }
        out
    }

    fn mask(keys: &[usize]) -> u8 {
        keys.iter().fold(0, |m, &k| m | Self::bit(k))
    }

    /// `keys`, held, let go: each freed; returns those to serve (a key taken in state `p` past
    /// a queue is deleted only, a bare `DEL`, and serves nobody).
    fn let_go(s: &mut St, keys: &[usize]) -> Vec<usize> {
        let mut serve = Vec::new();
        for &k in keys {
            s.holder[k] = None;
            if !std::mem::take(&mut s.taken_free[k]) {
                serve.push(k);
            }
        }
        serve
    }

    /// Whether member `h`, ahead of a live waiter in `k`'s queue, has departed as far as the
    /// scripts can know: its process is marked lapsed in `k`'s hash, or it is a set missing
    /// from the queue of another key of its run, that key not reserved for it (it must queue
    /// again: one order of sets).
    /// (A dead member ahead is not counted: a call that reaches it drops it, and until then
    /// it is the cost of a process that dies, which (S5) and (S6) bound.)
    fn departed(&self, s: &St, h: u8, k: usize) -> bool {
        s.ph[h as usize] != Ph::Dead
            && (s.marked[k] & Self::bit(h as usize) != 0 || self.out_of_one(s, h, k))
    }

    /// Whether set `h`, met on `k`, is missing from the queue of another key of its run that
    /// is not reserved for it (`set_ready`'s "departed": review 3, finding 2).
    fn out_of_one(&self, s: &St, h: u8, k: usize) -> bool {
        self.run(s, h)
            .iter()
            .any(|&j| j != k && !s.queue[j].contains(&h) && s.reserved[j] != Some(h))
    }

    /// (S8): live waiter `w` waits on free keys whose queues have only departed members (see
    /// `departed`) ahead of it, at least one, and no look due at any of them.
    fn held_back(&self, s: &St, w: u8) -> bool {
        let i = w as usize;
        if self.cfg.rule != Rule::AllAtOnce
            || s.ph[i] != Ph::Waiting
            || s.frozen[i]
            || self.polls(w)
        {
            return false;
        }
        let run = self.run(s, w);
        let mut behind = false;
        for &k in &run {
            if !Self::free(s, k, w) || s.lapsed[k] {
                return false;
            }
            let Some(at) = s.queue[k].iter().position(|&x| x == w) else {
                return false;
            };
            if !s.queue[k][..at].iter().all(|&h| self.departed(s, h, k)) {
                return false;
            }
            behind |= at > 0;
        }
        behind
    }

    /// Clears what no longer matters (a smaller state space; none of it is read again).
    fn tidy(&self, s: &mut St) {
        for i in 0..s.ph.len() {
            if !matches!(s.ph[i], Ph::Waiting | Ph::Holding) {
                s.frozen[i] = false;
            }
            if s.ph[i] != Ph::Waiting {
                s.called[i] = 0;
                s.failed[i] = 0;
                s.must_wait[i] = false;
                s.told[i] = false;
            }
        }
        for k in 0..KEYS {
            if s.queue[k].is_empty() {
                s.fence[k] = Fence::Kept;
                s.taken_free[k] = false;
            }
            // (a mark matters while its set is in this key's queue)
            let mut m = 0;
            for &h in &s.queue[k] {
                if s.ph[h as usize] == Ph::Waiting {
                    m |= Self::bit(h as usize);
                }
            }
            s.marked[k] &= m;
        }
    }

    /// Set `h`, told `d2` (or its reservation lapsed, live), makes its first call again: out of
    /// every queue (serving the free keys whose queue it headed) and queued at the back of
    /// each, or its keys taken if nobody waits (set_acquire.lua: a set missing from one of its
    /// queues leaves them all first).
    fn requeue(&self, n: &mut St, h: u8) {
        let keys = self.keys(h).to_vec();
        let headed: Vec<usize> = keys
            .iter()
            .copied()
            .filter(|&j| n.queue[j].first() == Some(&h))
            .collect();
        // (Out of every queue it lost its place: it waits again as a new waiter, FIFO from
        // there, as a frozen one-key waiter's process does: told, it makes its first call
        // again.)
        for q in n.queue.iter_mut() {
            q.retain(|&x| x != h);
        }
        n.seq[h as usize] = n.next_seq;
        n.next_seq += 1;
        for &j in &headed {
            self.serve_key(n, j, &keys);
        }
        self.attempt(n, h);
    }

    /// The keys `w` waits for now (`Rule::AllAtOnce`): its whole set, or, in order, its first
    /// run (keys of one slot, by slot then key; with `by_key`, one key) not held yet.
    fn run(&self, s: &St, w: u8) -> Vec<usize> {
        if !self.ordered(w) {
            return self.keys(w).to_vec();
        }
        let keys = self.sorted(w);
        let Some(first) = keys.iter().position(|&k| s.holder[k] != Some(w)) else {
            return Vec::new();
        };
        let slot = self.cfg.slots[keys[first]];
        let mut run: Vec<usize> = keys[first..]
            .iter()
            .copied()
            .take_while(|&k| self.cfg.slots[k] == slot)
            .collect();
        if self.cfg.by_key {
            run.truncate(1);
        }
        run
    }

    /// A polling set's attempt (`take_set.lua`, then, on a free key with a queue, the release
    /// call that serves it).
    fn poll_at_once(&self, s: &mut St, w: u8) {
        let keys = self.keys(w).to_vec();
        let free = |s: &St, k: usize| {
            s.holder[k].is_none()
                && s.reserved[k].is_none()
                && (self.cfg.poll_ignores_queues || !Self::hint(s, k))
        };
        if keys.iter().all(|&k| free(s, k)) {
            for &k in &keys {
                self.take_free(s, w, k);
            }
            return;
        }
        if let Some(&k) = keys
            .iter()
            .find(|&&k| s.holder[k].is_none() && Self::hint(s, k))
        {
            self.serve(s, &[k]);
            s.poll_served = true;
        }
    }

    /// Whether a polling attempt by `w` would change anything (else it is its backoff, and
    /// not a step).
    fn poll_changes(&self, s: &St, w: u8) -> bool {
        let mut t = s.clone();
        self.poll_at_once(&mut t, w);
        t.poll_served = s.poll_served;
        t != *s
    }

    /// `w` takes `k` by a one-shot call (take_set.lua, acquire.lua), which read no `q` hint:
    /// state `p`. A queue it passes (its hint expired, or the mutation ignores it) stays, and
    /// the key keeps no hint of it.
    fn take_free(&self, s: &mut St, w: u8, k: usize) {
        let passed = !s.queue[k].is_empty();
        if s.queue[k].iter().any(|&v| s.ph[v as usize] == Ph::Waiting) {
            s.poll_passed = true;
        }
        let fence = s.fence[k];
        self.take(s, w, k);
        if passed {
            s.taken_free[k] = true;
            s.fence[k] = fence;
        }
    }

    fn overlap(&self, a: u8, b: u8) -> bool {
        self.keys(a).iter().any(|k| self.keys(b).contains(k))
    }

    /// `w` takes `k` (and, with all its keys taken, holds): the FIFO ghost looks at the sets
    /// that still wait.
    fn take(&self, s: &mut St, w: u8, k: usize) {
        s.holder[k] = Some(w);
        s.reserved[k] = None;
        // (a hold writes the fence counter with its lease, and the queue's life with it)
        s.fence[k] = Fence::Kept;
        s.taken_free[k] = false;
        // (a set leaves every queue at once; one key's turn leaves that key's; a poller has none)
        for (j, q) in s.queue.iter_mut().enumerate() {
            if self.cfg.rule == Rule::AllAtOnce || j == k {
                q.retain(|&x| x != w);
            }
        }
        if self.keys(w).iter().all(|&j| s.holder[j] == Some(w)) {
            s.ph[w as usize] = Ph::Holding;
            // (FIFO is among queued sets: a polling set has no place in any queue, and is
            // held to (S7) instead)
            // (and among sets waiting at once: one taken in order is FIFO per run)
            // (a set dropped from a queue and told `d2` has lost its place: it queues again as
            // a new waiter)
            let older_waits = !self.polls(w)
                && !self.ordered(w)
                && (0..s.ph.len() as u8).any(|v| {
                    s.ph[v as usize] == Ph::Waiting
                        && !s.told[v as usize]
                        && !self.polls(v)
                        && !self.ordered(v)
                        && s.seq[v as usize] < s.seq[w as usize]
                        && self.overlap(v, w)
                });
            if older_waits {
                s.unfair = true;
            }
        }
    }

    /// Drops departed waiters at the head of `k`'s queue, from every queue of theirs (a set's
    /// members go together); returns the keys whose queues lost a member, `k`'s included:
    /// their new heads must be served too (`Rule::AllAtOnce`'s `serve`; without
    /// `Cfg::drop_serves`, none is).
    fn drop_dead_heads(&self, s: &mut St, k: usize) -> Vec<usize> {
        let mut left = Vec::new();
        while let Some(&h) = s.queue[k].first() {
            if s.ph[h as usize] != Ph::Dead {
                break;
            }
            for (j, q) in s.queue.iter_mut().enumerate() {
                if q.contains(&h) && self.cfg.drop_serves && !left.contains(&j) {
                    left.push(j);
                }
                q.retain(|&x| x != h);
            }
        }
        left
    }

    /// One free key's queue served, as `serve` in lock.lua walks it from the head: a departed
    /// head leaves every queue it is in (`drop_departed`); the first live head is granted every
    /// key of its set when it is ready (`set_ready`: each of its keys free, and it heads each
    /// of those queues; only the heads are read there), else it stays at the head and the key
    /// stays free ('blocked': the waiters behind it wait).
    /// A set's first call (`Rule::AllAtOnce`, set_acquire.lua, in no queue yet): each free
    /// key's queue served first; then every key taken when each is free with an empty queue,
    /// else it queues in each, at the back.
    fn attempt(&self, n: &mut St, w: u8) {
        let keys = self.run(n, w);
        // (`seen`: its process's record on each key is written, a lapse mark with it)
        for &k in &keys {
            n.marked[k] &= !Self::bit(w as usize);
        }
        for &k in &keys {
            if n.holder[k].is_none() && Self::hint(n, k) {
                self.serve_key(n, k, &keys);
            }
        }
        if keys
            .iter()
            .all(|&k| Self::free(n, k, w) && n.queue[k].is_empty())
        {
            for &k in &keys {
                self.take(n, w, k);
            }
        } else {
            for &k in &keys {
                let first = n.queue[k].is_empty();
                n.queue[k].push(w);
                // (a lock taken free becomes 'q' with a waiter behind it)
                n.taken_free[k] = false;
                // (the fence's 'q' written again, KEEPTTL or, gone, with the retention; a first
                // member on a free key gives the queue NO_LEASE plus the retention)
                let free = n.holder[k].is_none() && n.reserved[k].is_none();
                if n.fence[k] == Fence::Gone {
                    n.fence[k] = Fence::Short;
                }
                if first && free {
                    n.fence[k] = self.left_free(true);
                }
            }
        }
    }

    /// `declared`: the keys the call named (`Cfg::cluster`: the only ones it may write).
    fn serve_key(&self, s: &mut St, k: usize, declared: &[usize]) {
        s.lapsed[k] = false;
        if s.holder[k].is_some() || s.reserved[k].is_some() {
            return;
        }
        while let Some(&h) = s.queue[k].first() {
            if Self::gone(s, h, k) {
                // (a lapsed process that listens is told `d2`)
                if s.ph[h as usize] != Ph::Dead {
                    s.told[h as usize] = true;
                }
                self.drop_departed(s, h, k, declared);
                continue;
            }
            let run = self.run(s, h);
            let ready = run
                .iter()
                .all(|&j| Self::free(s, j, h) && s.queue[j].first() == Some(&h));
            if ready {
                if self.cfg.cluster && !run.iter().all(|j| declared.contains(j)) {
                    s.reserved[k] = Some(h);
                    s.fence[k] = Fence::Kept;
                    return;
                }
                for &j in &run {
                    self.take(s, h, j);
                }
                return;
            }
            // (the fix of review 3's finding 2: a set missing from the queue of another of its
            // keys, not reserved for it there, has departed: dropped here, as `gone_set`
            // drops, and told `d2`; it queues again at the back of every queue)
            if !self.reverted(Revert::FrozenSet) && self.out_of_one(s, h, k) {
                s.told[h as usize] = true;
                self.drop_departed(s, h, k, declared);
                continue;
            }
            // (`leave_blocked`)
            s.fence[k] = self.left_free(false);
            return;
        }
    }

    /// Whether key `j` is free for set `h`: nobody holds it, and it is not reserved for
    /// another set.
    fn free(s: &St, j: usize, h: u8) -> bool {
        s.holder[j].is_none() && s.reserved[j].is_none_or(|r| r == h)
    }

    /// A departed waiter `h`, found at the head of `k`'s queue by a call, leaves every queue it
    /// is in (`gone_set` in lock.lua); each other free key whose queue it headed has a look due
    /// (its watchers are told to look now: that call serves it, not this one, whose work stays
    /// bounded). Without `Cfg::drop_serves`, no look is due.
    /// (`Cfg::cluster`: the call leaves it in the queues of keys it did not declare, and only
    /// tells their watchers; their look drops it there.)
    fn drop_departed(&self, s: &mut St, h: u8, k: usize, declared: &[usize]) {
        for j in 0..KEYS {
            let headed = s.queue[j].first() == Some(&h);
            let written = !self.cfg.cluster || j == k || declared.contains(&j);
            if written {
                s.queue[j].retain(|&x| x != h);
            }
            let waiters_behind = s.queue[j].iter().any(|&x| x != h);
            if j != k
                && headed
                && s.holder[j].is_none()
                && s.reserved[j].is_none()
                && waiters_behind
                && self.cfg.drop_serves
            {
                s.lapsed[j] = true;
            }
        }
    }

    /// Serves each of `keys`, in order: the rule's grant, in one script (that named
    /// `keys`).
    fn serve(&self, s: &mut St, keys: &[usize]) {
        self.serve_declared(s, keys, keys);
    }

    /// `serve`, by a call that named `declared`.
    fn serve_declared(&self, s: &mut St, keys: &[usize], declared: &[usize]) {
        let mut todo: Vec<usize> = keys.to_vec();
        match self.cfg.rule {
            Rule::AllAtOnce => {
                for &k in keys {
                    self.serve_key(s, k, declared);
                }
            }
            Rule::EachInTurn => {
                while let Some(k) = todo.pop() {
                    s.lapsed[k] = false;
                    self.drop_dead_heads(s, k);
                    if s.holder[k].is_some() {
                        continue;
                    }
                    let Some(&h) = s.queue[k].first() else {
                        continue;
                    };
                    self.take(s, h, k);
                    // its next key, in its caller's order: queued there (and served)
                    if let Some(&next) = self.keys(h).iter().find(|&&j| s.holder[j] != Some(h)) {
                        s.queue[next].push(h);
                        todo.push(next);
                    }
                }
            }
            Rule::WhenAllFree => {}
        }
    }

    /// Whether live waiter `w` could be granted now and is not: the rule's grant condition
    /// holds (a poller's is its own to find).
    fn grantable(&self, s: &St, w: u8) -> bool {
        // (a key whose lease just ended waits for its watcher's look: that is the lease's cost)
        // (nor a set whose key is reserved for it: its claim is the cost, as a short grant's
        // confirmation is)
        if s.ph[w as usize] != Ph::Waiting
            || self.polls(w)
            || self.keys(w).iter().any(|&k| s.lapsed[k])
            || s.reserved.contains(&Some(w))
        {
            return false;
        }
        match self.cfg.rule {
            Rule::AllAtOnce => {
                let run = self.run(s, w);
                !run.is_empty()
                    && run
                        .iter()
                        .all(|&k| Self::free(s, k, w) && s.queue[k].first() == Some(&w))
            }
            Rule::EachInTurn => {
                (0..KEYS).any(|k| s.holder[k].is_none() && s.queue[k].first() == Some(&w))
            }
            Rule::WhenAllFree => false,
        }
    }

    /// The keys `w` holds now.
    fn held(&self, s: &St, w: u8) -> Vec<usize> {
        (0..KEYS).filter(|&k| s.holder[k] == Some(w)).collect()
    }

    fn ended(s: &St) -> bool {
        s.ph.iter()
            .all(|p| matches!(p, Ph::Done | Ph::Left | Ph::Dead))
    }
}

impl Model for Sets {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        let n = self.cfg.sets.len();
        vec![St {
            ph: vec![Ph::Idle; n],
            holder: [None; KEYS],
            reserved: [None; KEYS],
            queue: Default::default(),
            seq: vec![0; n],
            next_seq: 1,
            deaths_left: self.cfg.deaths,
            leaves_left: self.cfg.leaves,
            refreshes_left: self.cfg.refreshes,
            lapses_left: self.cfg.lapses,
            unfair: false,
            lapsed: [false; KEYS],
            refresh_granted: false,
            refresh_dropped: false,
            refresh_missed: false,
            poll_passed: false,
            poll_served: false,
            claimed: false,
            called: vec![0; n],
            failed: vec![0; n],
            must_wait: vec![false; n],
            frozen: vec![false; n],
            told: vec![false; n],
            freezes_left: self.cfg.freezes,
            marked: [0; KEYS],
            fence: [Fence::Kept; KEYS],
            taken_free: [false; KEYS],
        }]
    }

    fn actions(&self, s: &St, out: &mut Vec<Act>) {
        for (w, p) in s.ph.iter().enumerate() {
            let w = w as u8;
            if s.frozen[w as usize] {
                out.push(Act::Resume(w));
                continue;
            }
            match p {
                Ph::Idle => out.push(Act::Start(w)),
                Ph::Waiting => {
                    if self.polls(w) {
                        if self.poll_changes(s, w) {
                            out.push(Act::Poll(w));
                        }
                    } else if self.cfg.rule == Rule::WhenAllFree
                        && self.keys(w).iter().all(|&k| s.holder[k].is_none())
                    {
                        out.push(Act::Poll(w));
                    }
                    if s.leaves_left > 0 {
                        out.push(Act::Leave(w));
                    }
                    if s.freezes_left > 0 {
                        out.push(Act::Freeze(w));
                    }
                    if s.told[w as usize] {
                        out.push(Act::Requeue(w));
                    }
                }
                Ph::Holding => {
                    out.push(Act::Release(w));
                    if s.refreshes_left > 0 {
                        out.push(Act::Refresh(w));
                    }
                }
                _ => {}
            }
            if matches!(p, Ph::Waiting | Ph::Holding) && s.deaths_left > 0 {
                out.push(Act::Die(w));
            }
        }
        for k in 0..KEYS {
            if let Some(h) = s.holder[k] {
                if s.ph[h as usize] == Ph::Dead {
                    out.push(Act::Expire(k as u8));
                }
            } else if s.lapsed[k] {
                out.push(Act::Look(k as u8));
            }
            if let Some(h) = s.reserved[k] {
                let h = h as usize;
                if s.ph[h] != Ph::Waiting || s.frozen[h] || s.lapses_left > 0 {
                    out.push(Act::Lapse(k as u8));
                }
            }
            if s.fence[k] == Fence::Short
                && s.holder[k].is_none()
                && s.reserved[k].is_none()
                && !s.queue[k].is_empty()
            {
                out.push(Act::FenceExpires(k as u8));
            }
        }
        for (w, p) in s.ph.iter().enumerate() {
            let w = w as u8;
            if *p != Ph::Waiting || s.frozen[w as usize] {
                continue;
            }
            if s.reserved.contains(&Some(w)) {
                out.push(Act::Claim(w));
            }
            // (waiting for its next run: each one with `by_key`, else after a burst failed)
            let between_runs = self.ordered(w)
                && (self.cfg.by_key || s.must_wait[w as usize])
                && s.holder.contains(&Some(w))
                && !s.queue.iter().any(|q| q.contains(&w));
            if between_runs {
                out.push(Act::Next(w));
            }
            if self.in_burst(s, w) {
                let called = s.called[w as usize];
                let mut all = true;
                for c in self.calls(s, w) {
                    if called & Self::mask(&c) == 0 {
                        all = false;
                        out.push(Act::Call(w, c[0] as u8));
                    }
                }
                if all {
                    out.push(Act::Settle(w));
                }
            }
        }
    }

    fn next_state(&self, s: &St, a: Act) -> Option<St> {
        let mut n = s.clone();
        match a {
            Act::Start(w) => {
                n.ph[w as usize] = Ph::Waiting;
                n.seq[w as usize] = n.next_seq;
                n.next_seq += 1;
                let keys = self.keys(w).to_vec();
                if self.polls(w) {
                    self.poll_at_once(&mut n, w);
                    return Some(n);
                }
                match self.cfg.rule {
                    Rule::AllAtOnce => self.attempt(&mut n, w),
                    Rule::EachInTurn => {
                        n.queue[keys[0]].push(w);
                        self.serve(&mut n, &keys[..1]);
                    }
                    Rule::WhenAllFree => {
                        if keys.iter().all(|&k| n.holder[k].is_none()) {
                            for &k in &keys {
                                self.take(&mut n, w, k);
                            }
                        }
                    }
                }
            }
            Act::Poll(w) if self.polls(w) => self.poll_at_once(&mut n, w),
            Act::Poll(w) => {
                for &k in self.cfg.sets[w as usize].clone().iter() {
                    self.take(&mut n, w, k);
                }
            }
            Act::Release(w) => {
                n.ph[w as usize] = Ph::Done;
                // (set_release.lua: every key let go first, then each one still free served)
                let keys = self.held(&n, w);
                let keys = Self::let_go(&mut n, &keys);
                self.serve(&mut n, &keys);
            }
            Act::Leave(w) => {
                n.ph[w as usize] = Ph::Left;
                n.leaves_left -= 1;
                let held = self.held(&n, w);
                let mut keys = Self::let_go(&mut n, &held);
                for k in 0..KEYS {
                    // (its reservations are given back with what it holds)
                    if n.reserved[k] == Some(w) {
                        n.reserved[k] = None;
                        keys.push(k);
                    }
                    if n.queue[k].contains(&w) {
                        // (set_leave.lua serves a free key whose queue it headed; the others
                        // only lose it)
                        let headed = n.queue[k].first() == Some(&w);
                        n.queue[k].retain(|&x| x != w);
                        if (headed || self.cfg.rule != Rule::AllAtOnce)
                            && !keys.contains(&k)
                            && !held.contains(&k)
                        {
                            keys.push(k);
                        }
                    }
                }
                let declared = self.keys(w).to_vec();
                self.serve_declared(&mut n, &keys, &declared);
            }
            Act::Next(w) => {
                n.must_wait[w as usize] = false;
                self.attempt(&mut n, w);
            }
            Act::Call(w, k0) => {
                // (take_set.lua on one chunk: every key free with no 'q' hint, all taken; else
                // nothing written, and a first such key free with waiters is served by the
                // release call the implementation sends on it)
                let i = w as usize;
                let calls = self.calls(&n, w);
                let chunk = calls.iter().find(|c| c[0] == k0 as usize)?.clone();
                let takes = |n: &St, k: usize| {
                    n.holder[k].is_none() && n.reserved[k].is_none() && !Self::hint(n, k)
                };
                if chunk.iter().all(|&k| takes(&n, k)) {
                    n.called[i] |= Self::mask(&chunk);
                    for &k in &chunk {
                        self.take_free(&mut n, w, k);
                    }
                } else {
                    n.called[i] |= Self::mask(&chunk);
                    n.failed[i] |= Self::mask(&chunk);
                    let k = *chunk.iter().find(|&&k| !takes(&n, k))?;
                    if n.holder[k].is_none() && n.reserved[k].is_none() {
                        self.serve(&mut n, &[k]);
                    }
                }
                // (a burst whose every call took its keys: the set is held)
                let all = Self::mask(&calls.concat());
                if n.called[i] & all == all && n.failed[i] == 0 {
                    n.called[i] = 0;
                }
            }
            Act::Settle(w) => {
                // (attempt_all: what the calls after the first that failed took is given back;
                // take_in_order, as fixed: so is what is taken of the run it failed in)
                let i = w as usize;
                let calls = self.calls(&n, w);
                let first = calls
                    .iter()
                    .position(|c| n.failed[i] & Self::mask(c) != 0)?;
                let slot = self.cfg.slots[calls[first][0]];
                let after = Self::mask(&calls[first + 1..].concat());
                let give: Vec<usize> = (0..KEYS)
                    .filter(|&k| n.holder[k] == Some(w))
                    .filter(|&k| {
                        after & Self::bit(k) != 0
                            || (self.cfg.slots[k] == slot && !self.reverted(Revert::SplitRun))
                    })
                    .collect();
                let keys = Self::let_go(&mut n, &give);
                self.serve(&mut n, &keys);
                n.called[i] = 0;
                n.failed[i] = 0;
                n.must_wait[i] = true;
            }
            Act::Freeze(w) => {
                n.frozen[w as usize] = true;
                n.freezes_left -= 1;
            }
            Act::Resume(w) => n.frozen[w as usize] = false,
            Act::Requeue(w) => {
                n.told[w as usize] = false;
                self.requeue(&mut n, w);
            }
            Act::FenceExpires(k) => n.fence[k as usize] = Fence::Gone,
            Act::Claim(w) => {
                // (set_acquire.lua, which names every key of the set: its free keys' queues
                // served, then every key taken, or its reservations given back)
                let keys = self.run(&n, w);
                for &k in &keys {
                    n.marked[k] &= !Self::bit(w as usize);
                }
                for &k in &keys {
                    if n.holder[k].is_none() && n.reserved[k].is_none() && Self::hint(&n, k) {
                        self.serve_key(&mut n, k, &keys);
                    }
                }
                if n.ph[w as usize] == Ph::Waiting
                    && keys.iter().all(|&k| {
                        Self::free(&n, k, w) && n.queue[k].first().is_none_or(|&h| h == w)
                    })
                {
                    for &k in &keys {
                        self.take(&mut n, w, k);
                    }
                    n.claimed = true;
                } else {
                    // (each given back and served: its head may be another set, or a waiter
                    // queued since, which can be granted now)
                    for k in 0..KEYS {
                        if n.reserved[k] == Some(w) {
                            n.reserved[k] = None;
                            if self.cfg.claim_serves {
                                self.serve_key(&mut n, k, &keys);
                            }
                        }
                    }
                }
            }
            Act::Lapse(k) => {
                let k = k as usize;
                let h = n.reserved[k].take()?;
                if n.ph[h as usize] != Ph::Waiting {
                    // (dead: the look drops it)
                    n.lapsed[k] = !n.queue[k].is_empty();
                } else if n.frozen[h as usize] {
                    // (frozen: the watchers' look at the claim window's end finds the fence
                    // naming its process as pending and marks it lapsed in `k`'s processes hash
                    // only (`lapse`); that look's walk drops it from `k`'s queue, tells it `d2`,
                    // and on a Cluster offers its other free keys only a look, `look_now`)
                    n.marked[k] |= Self::bit(h as usize);
                    n.lapsed[k] = !n.queue[k].is_empty();
                } else {
                    // (its process is marked lapsed on `k`: the next call on `k` drops it from
                    // every queue, serving the free keys it headed, and tells it; it queues
                    // again at the back of each)
                    self.requeue(&mut n, h);
                    n.lapsed[k] = false;
                    n.lapses_left -= 1;
                }
            }
            Act::Refresh(w) if self.cfg.rule == Rule::AllAtOnce => {
                // (extend.lua on each key: departed waiters at the head of its queue leave every
                // queue they are in, as a walk's)
                n.refreshes_left -= 1;
                let keys = self.held(&n, w);
                for &k in &keys {
                    while let Some(&h) = n.queue[k].first() {
                        if !Self::gone(&n, h, k) {
                            break;
                        }
                        if n.ph[h as usize] != Ph::Dead {
                            n.told[h as usize] = true;
                        }
                        self.drop_departed(&mut n, h, k, &keys);
                        n.refresh_dropped = true;
                    }
                }
                if keys
                    .iter()
                    .any(|&k| n.queue[k].first().is_some_and(|&h| Self::gone(&n, h, k)))
                {
                    n.refresh_missed = true;
                }
            }
            Act::Refresh(w) => {
                n.refreshes_left -= 1;
                let keys = self.held(&n, w);
                let before = n.ph.iter().filter(|p| **p == Ph::Holding).count();
                self.serve(&mut n, &keys);
                if n.ph.iter().filter(|p| **p == Ph::Holding).count() > before {
                    n.refresh_granted = true;
                }
                if keys.iter().any(|&k| {
                    n.queue[k]
                        .first()
                        .is_some_and(|&h| n.ph[h as usize] == Ph::Dead)
                }) {
                    n.refresh_missed = true;
                }
            }
            Act::Die(w) => {
                n.ph[w as usize] = Ph::Dead;
                n.deaths_left -= 1;
            }
            Act::Expire(k) => {
                n.holder[k as usize] = None;
                n.lapsed[k as usize] = !n.queue[k as usize].is_empty();
            }
            Act::Look(k) => self.serve(&mut n, &[k as usize]),
        }
        self.tidy(&mut n);
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always(
                "(S1) one holder per key, a holder holds its whole set",
                |m, s| {
                    let ok = (0..s.ph.len() as u8).all(|w| {
                        s.ph[w as usize] != Ph::Holding
                            || m.keys(w).iter().all(|&k| s.holder[k] == Some(w))
                    });
                    m.latch(0, ok)
                },
            ),
            Property::<Self>::always(
                "(S2) no set granted while an older overlapping set waits",
                |m, s| m.latch(1, !s.unfair),
            ),
            Property::<Self>::eventually("(S3) every waiter ends (no deadlock)", |_, s| {
                Sets::ended(s)
            }),
            Property::<Self>::eventually(
                "(S4) nothing left behind: every waiter ended, every key free, every queue empty",
                |m, s| {
                    // (On a Cluster a departed waiter may stay in the queue of a key a call did
                    // not declare, with nobody behind it to look: it goes with the queue's
                    // retention, as a one-key waiter's process that dies in a queue nobody calls
                    // on again.)
                    let gone = |q: &Vec<u8>| {
                        q.is_empty()
                            || (m.cfg.cluster && q.iter().all(|&w| s.ph[w as usize] == Ph::Dead))
                    };
                    Sets::ended(s)
                        && s.holder.iter().all(|h| h.is_none())
                        && s.reserved.iter().all(|r| r.is_none())
                        && s.queue.iter().all(gone)
                },
            ),
            Property::<Self>::always(
                "(S5) no live set left waiting that the rule grants, after any call",
                |m, s| {
                    let ok = !(0..s.ph.len() as u8).any(|w| m.grantable(s, w));
                    m.latch(2, ok)
                },
            ),
            Property::<Self>::sometimes("canary: a set granted while another waits", |_, s| {
                s.ph.contains(&Ph::Holding) && s.ph.contains(&Ph::Waiting)
            }),
            Property::<Self>::always(
                "(S6) a refresh leaves no departed waiter at the head of its keys' queues",
                |m, s| m.latch(3, !s.refresh_missed),
            ),
            Property::<Self>::sometimes(
                "canary: a refresh drops a departed head and grants a set behind it",
                |_, s| s.refresh_granted,
            ),
            Property::<Self>::sometimes("canary: a refresh drops a departed head", |_, s| {
                s.refresh_dropped
            }),
            Property::<Self>::sometimes("canary: every set granted and released", |_, s| {
                s.ph.iter().all(|p| *p == Ph::Done)
            }),
            Property::<Self>::always(
                "(S7) a set taken at once never takes a key a live waiter is queued on",
                |m, s| m.latch(4, !s.poll_passed),
            ),
            Property::<Self>::sometimes(
                "canary: a polling set holds while a queued set waits",
                |m, s| {
                    let n = s.ph.len() as u8;
                    (0..n).any(|w| m.polls(w) && s.ph[w as usize] == Ph::Holding)
                        && (0..n).any(|w| !m.polls(w) && s.ph[w as usize] == Ph::Waiting)
                },
            ),
            Property::<Self>::sometimes(
                "canary: a polling attempt serves a free key's queue",
                |_, s| s.poll_served,
            ),
            Property::<Self>::sometimes(
                "canary: a set takes its keys by its own claim of a reservation",
                |_, s| s.claimed,
            ),
            Property::<Self>::always(
                "(S8) no live waiter held back on free keys by departed sets only, past its look",
                |m, s| {
                    let ok = !(0..s.ph.len() as u8).any(|w| m.held_back(s, w));
                    m.latch(5, ok)
                },
            ),
            Property::<Self>::sometimes(
                "canary: a burst's call fails while the waiter holds a key of that run",
                |m, s| {
                    (0..s.ph.len()).any(|w| {
                        let f = s.failed[w];
                        f != 0
                            && (0..KEYS).any(|k| {
                                s.holder[k] == Some(w as u8)
                                    && (0..KEYS).any(|j| {
                                        f & Self::bit(j) != 0 && m.cfg.slots[j] == m.cfg.slots[k]
                                    })
                            })
                    })
                },
            ),
            Property::<Self>::sometimes("canary: a frozen set marked lapsed on one key", |_, s| {
                s.marked.iter().any(|&m| m != 0)
            }),
            Property::<Self>::sometimes(
                "canary: a frozen set told d2 resumes and queues again",
                |_, s| (0..s.ph.len()).any(|w| s.told[w] && !s.frozen[w] && s.ph[w] == Ph::Waiting),
            ),
            Property::<Self>::sometimes(
                "canary: a fence's q hint expired while its queue lives",
                |_, s| s.fence.contains(&Fence::Gone),
            ),
        ]
    }
}
