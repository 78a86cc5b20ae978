//! An exhaustive model of waitlock's queue handoff (protocol format 2), checked with
//! stateright 0.31 (see `tests/exhaustive.rs` and `README.md`).
//!
//! **What it is.** One key. Redis is one state machine whose transitions are the scripts of
//! `src/redis/lua/` (acquire, release, extend, leave: `Queue::acquire`, `release`, `extend`,
//! `leave`), each one atomic step as Redis runs it, with one function per local function of
//! `common.lua` that holds state (same names: `listener`, `process`, `seen`, `lapse`,
//! `next_fence`, `fence_flags`, `watch`, `watching`, `serve`, `release_held`, `confirm_grant`,
//! `enqueue`, `held_by`, `holder_hub`); every function says what it mirrors. Processes each
//! have waiters (one `acquire_wait` each, with its own token `"<hub>/<uuid>"`, so Redis can read
//! the holder's process from the lock), one subscriber connection (grant and watch
//! messages: one FIFO per connection) and one client connection (calls: one FIFO per process
//! while the connection is stalled). The waiter is `src/wait/notify/mod.rs::wait` and
//! `take_grant` (`Queue::start`, `attempt`, `on_attempt`, `wake`, `take_grant`), with
//! `Request::full_lease` and `Waiting::attempt`/`limit` (`src/wait/mod.rs`), the dispatcher's
//! `deliver` (a `d2` wakes the channel), the cell's sticky `hub_woke` flag and the
//! housekeeper's freeze notice (`src/wait/notify/hub.rs`).
//!
//! **Time** is a tick (`now`); the clock runs only while nothing is due (timers, messages and
//! replies of running processes are urgent: a late process is a frozen one). Keys expire in
//! `Tick`. A guard's `valid_until` is computed as the code does it, from the send tick of the
//! call that set the lease (`Hold::sent`), or for a grant message from the anchor
//! (`since = anchor.sent + (grant time − anchor Redis time)`); the drift margin (1% + 2 ms) is
//! below a tick, so it is 0 in the model, and `full_lease`'s "about a full TTL" test
//! (`valid_until ≥ now + TTL − 2·margin`) is `valid_until ≥ now + TTL`.
//!
//! **Faults** are budgeted nondeterministic steps: a message lost (the hub then wakes every
//! waiter of the process: a lagged buffer or the reconnect that lost it), a process frozen
//! (messages sit in its FIFO, timers do not fire; resuming after `notice` ticks or more wakes
//! its waiters, as the housekeeper does), a subscriber connection dropped (messages in flight
//! lost, Redis counts no listener) and re-made (every waiter woken), a process killed, and a
//! stalled client connection (its calls wait in a FIFO; a caller waiting for a reply gives up
//! at its time limit, and the calls run later, in order).
//!
//! **Abstractions** (what the model leaves out or narrows, stated so a reader can judge):
//! - a call answered in time runs within the tick it is sent; only a stalled connection
//!   separates send, run and reply (so the anchor's send and Redis times differ only there);
//!   the 1% clock-rate factor is not modelled; the attempts' 5 ms last grace
//!   (`LAST_ATTEMPT_GRACE`) is below a tick: a call sent at the deadline has a limit of 0;
//! - the queue scan is unbounded (the scripts stop at 200 heads and answer "continue": release
//!   `{4}` / `{0, 4}`, acquire `{4}` never happen here); the fence counter and the processes
//!   hash outlive every hold (no retention: extend always answers `{1, fence}`);
//! - only `acquire_wait` with a hub: no polling callers (`wait::once`, a locker without
//!   pub/sub), no fixed tokens, no required replicas, no `give_back`; so every token names its
//!   process, and acquire.lua's `held_by(<hub of the holder's token>)` never gets '' (a lock
//!   taken free by a fixed token or a polling locker leaves '!h' unknown: not checked);
//! - every waiter has the same TTL and starts at tick 0 (or when its frozen process resumes);
//!   holders do not refresh, and release before their lease ends unless frozen, killed or
//!   stalled (an overrunning holder is one of those faults); a process's channel is
//!   unsubscribed as soon as its last waiter returns; a timed-out attempt is retried one tick
//!   later (the backoff);
//! - voluntary steps happen between cascades of urgent steps (`Cfg::calm`): a holder's
//!   release, a freeze, a stall, a resume, a re-made subscriber connection, the start of a
//!   replay are offered only when no urgent step (a reaction: a delivery, a wake-up, an
//!   attempt, a timeout...) is pending; a release, a kill or a subscriber drop may still
//!   interleave with its own process's pending steps (its messages in flight, its other
//!   waiters' reactions), not with another process's. Message losses happen anywhere;
//! - the fast path (one plain attempt before registering) is skipped while the process's
//!   connection is stalled;
//! - the subscriber connection's drop and re-making are two steps (`SubDrop`, `Resub`): the
//!   hub's `Pending` between reconnect and confirmation is seen only by a waiter whose attempt
//!   found its process deaf.
//!
//! **Switches.** `Cfg::default()` is the code as it is. `Cfg::bug` brings back one of two old
//! bugs, and `Cfg::revert` takes one of the fixes of findings F1–F7 back (the finding tests).

pub mod permits;
use stateright::{Model, Property, Representative};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// A waiter (one `acquire_wait`, one token, one queue member).
pub type W = u8;
/// A process (one hub: a subscriber connection, a client, waiters).
pub type Pid = u8;

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

/// The model's parameters. Times are in ticks.
#[derive(Clone, Debug)]
pub struct Cfg {
    pub procs: u8,
    /// Waiters per process.
    pub wpp: u8,
    /// Every waiter's TTL (the PX of a free acquisition, a full grant, a confirm).
    pub ttl: u8,
    /// The claim window: a short grant's PX is `min(ttl, claim)`.
    pub claim: u8,
    /// A process is fresh when Redis saw it call within this many ticks (`now - seen <= presence`).
    pub presence: u8,
    /// Each wait's deadline, from its start.
    pub wait: u8,
    /// The clock stops here.
    pub horizon: u8,
    /// A freeze of at least this many ticks is noticed on resume (the housekeeper's "1 s late").
    pub notice: u8,
    /// The command timeout (a call's time limit; an attempt's is also cut by the deadline).
    pub cmd: u8,
    /// `Bug::OwnClaimWindow`: the waiter's own claim window.
    pub own_claim: u8,
    /// (f): a returned guard must be valid until at least `reference + ttl - slack`.
    pub slack: u8,
    /// Fault budgets.
    pub losses: u8,
    pub freezes: u8,
    pub drops: u8,
    pub kills: u8,
    pub stalls: u8,
    /// Holders' own calls (budgets, each at most this many in a run): an `extend` with
    /// another TTL (`ttl_short` or `ttl_long`), a keep-alive refresh with the holder's TTL,
    /// a careless holder that does not release before its lease ends (no fault: it overstays,
    /// then releases late or never).
    pub extends: u8,
    pub refreshes: u8,
    pub careless: u8,
    /// Backward steps of Redis' clock (each by `step` ticks).
    pub steps: u8,
    pub step: u8,
    /// The TTLs a holder's `extend` may set.
    pub ttl_short: u8,
    pub ttl_long: u8,
    /// The retention (`LockerBuilder::retention`): the queue, the processes hash and the fence
    /// counter expire; `None`: they outlive every hold (the model before review 2).
    pub retain: Option<u8>,
    pub bug: Bug,
    /// One behaviour of the code taken back to what it was before the fix of one of the
    /// findings F1–F7 (`None`: the code as it is). The finding tests replay each finding's
    /// trace with its behaviour reverted (it breaks its property) and as implemented (it does
    /// not).
    pub revert: Option<Revert>,
    /// Incident costs left out of the idle bound (COST_* bits; experiments only).
    pub no_cost: u8,
    /// Steps offered only between cascades (when no urgent step is pending): CALM_* bits.
    pub calm: u8,
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
    /// the holder's, and leave's skips `holder_hub()`, 3c87246). This is the code of 8d0d2c8.
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
            procs: 3,
            wpp: 2,
            ttl: 4,
            claim: 2,
            presence: 1,
            wait: 6,
            horizon: 8,
            notice: 3,
            cmd: 2,
            own_claim: 4,
            slack: 1,
            losses: 0,
            freezes: 0,
            drops: 0,
            kills: 0,
            stalls: 0,
            extends: 0,
            refreshes: 0,
            careless: 0,
            steps: 0,
            step: 2,
            ttl_short: 1,
            ttl_long: 6,
            retain: None,
            bug: Bug::None,
            calm: CALM_RELEASE | CALM_OWN | CALM_FREEZE | CALM_STALL | CALM_RECOVER,
            revert: None,
            no_cost: 0,
        }
    }
}

/// A small vector of fixed capacity, stored inline (a state is cloned at every step: no
/// allocation). Unused slots stay `T::default()`, so the derived `Eq`/`Hash` see only the
/// items.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fifo<T: Copy + Default, const N: usize> {
    len: u8,
    items: [T; N],
}

impl<T: Copy + Default, const N: usize> Default for Fifo<T, N> {
    fn default() -> Self {
        Fifo {
            len: 0,
            items: [T::default(); N],
        }
    }
}

impl<T: Copy + Default, const N: usize> Fifo<T, N> {
    pub fn push(&mut self, x: T) {
        assert!((self.len as usize) < N, "model capacity {N} exceeded");
        self.items[self.len as usize] = x;
        self.len += 1;
    }
    pub fn remove(&mut self, i: usize) -> T {
        let n = self.len as usize;
        assert!(i < n);
        let x = self.items[i];
        self.items.copy_within(i + 1..n, i);
        self.items[n - 1] = T::default();
        self.len -= 1;
        x
    }
    /// Removes the first `k` items.
    pub fn drain_front(&mut self, k: usize) {
        let n = self.len as usize;
        self.items.copy_within(k..n, 0);
        for x in &mut self.items[n - k..n] {
            *x = T::default();
        }
        self.len -= k as u8;
    }
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

impl<T: Copy + Default, const N: usize> std::ops::Deref for Fifo<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len as usize]
    }
}

impl<T: Copy + Default, const N: usize> std::ops::DerefMut for Fifo<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len as usize]
    }
}

impl<T: Copy + Default, const N: usize> FromIterator<T> for Fifo<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(it: I) -> Self {
        let mut f = Self::default();
        for x in it {
            f.push(x);
        }
        f
    }
}

/// A watch message's receiver had no anchor: it looks `px` after reading it.
pub const NO_BOUND: u8 = 255;

/// Capacities: processes, waiters, messages in flight per connection, stalled calls.
pub const MAXP: usize = 3;
pub const MAXW: usize = 6;
pub const MAXM: usize = 14;
pub const MAXC: usize = 12;

/// Lock states (`common.lua` header): taken free (`p`), held with waiters maybe queued (`q`),
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

/// A process's field in the processes hash.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Rec {
    /// No field.
    #[default]
    None,
    /// Called on the key at this tick (fresh; becomes `Stale` after the presence window).
    Seen(u8),
    Stale,
    /// 'x': its short grant lapsed unconfirmed; its waiters are skipped until it calls again.
    Lapsed,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Run {
    #[default]
    Running,
    /// Frozen for this many ticks so far (capped at `notice`).
    Frozen(u8),
    Killed,
}

/// One process: its run state, its connections, the hub's view, its processes-hash field.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pr {
    pub run: Run,
    /// Redis counts its subscriber connection (false after a drop, until it is re-made).
    pub sub: bool,
    /// The hub's slot is `Confirmed` (false: `Pending`, its waiters wait for the wake-up).
    pub slot_ok: bool,
    /// Ghost: the process was frozen (its waiters may end late).
    pub thawed: bool,
    /// A message was lost: the hub wakes every waiter (lagged buffer, reconnect).
    pub missed: bool,
    /// Its client connection is stalled: calls wait in `late`, in order.
    pub stalled: bool,
    /// The stalled calls are being replayed (the rest follow before time passes).
    pub draining: bool,
    pub rec: Rec,
}

/// A message on a process's grant channel.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Msg {
    /// `g2 <fence> <px> <grant time> <token>`
    Grant { to: W, fence: u8, px: u8, at: u8 },
    /// `w3 <px> <time> <token>`: look at the lock px after Redis time `<time>`. The receiver
    /// looks `px` after reading it, or at `by` if that is earlier: `<time>` carried over to
    /// its clock from its anchor, plus px (`look_at`). The anchor cannot change while the
    /// message is in flight (a new queueing attempt drops the older messages: they are
    /// stale), so the model computes `by` when the message is published, and forgets it once
    /// it has passed (0: look at once). `NO_BOUND`: the receiver had no anchor.
    Watch { to: W, px: u8, by: u8 },
    /// `d2`: "your waiters were dropped from the queue (your process was lapsed)".
    #[default]
    Dropped,
}

/// Leave flags: 'G' give back whatever the token holds; 'o' only an unclaimed grant with
/// this fence.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flag {
    G,
    O(u8),
}

/// A call waiting on a stalled connection. `awaited`: its caller still waits for the reply.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Call {
    Acquire {
        w: W,
        member: bool,
        awaited: bool,
    },
    Extend {
        w: W,
        awaited: bool,
    },
    Release {
        w: W,
    },
    Leave {
        w: W,
        member: bool,
        flag: Flag,
    },
    /// A holder's extend (`extend.lua`) with this TTL: a refresh or a user's `extend`.
    Renew {
        w: W,
        ttl: u8,
        awaited: bool,
    },
}

impl Default for Call {
    fn default() -> Call {
        Call::Release { w: 0 }
    }
}

/// The call a waiter waits for (on a stalled connection).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum Inflight {
    /// A queueing attempt.
    Attempt { sent: u8 },
    /// `full_lease`'s extend after an attempt found a lease shorter than the TTL.
    /// `limit`: the attempt's time limit (`Waiting::limit` when it was sent), which the extend
    /// has too.
    Lease { fence: u8, sent: u8, limit: u8 },
    /// `take_grant`'s confirmation of a grant.
    Confirm { fence: u8, sent: u8 },
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct GrantMsg {
    pub fence: u8,
    pub px: u8,
    pub at: u8,
}

/// A waiter inside `wait`'s loop.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Wt {
    pub deadline: u8,
    /// The last attempt that left it queued: (latest fence then, Redis run tick − send tick:
    /// negative after Redis' clock stepped back).
    pub anchor: Option<(u8, i8)>,
    /// A watcher looks at this tick (0: due).
    pub watch: Option<u8>,
    /// Backoff after a failed attempt (0: due).
    pub timer: Option<u8>,
    /// The loop attempts next (`check = true`).
    pub check: bool,
    /// A stored `Notify` permit.
    pub permit: bool,
    /// The cell's mail.
    pub grant: Option<GrantMsg>,
    /// A watch message in the mail: (px, `by`: see `Msg::Watch`).
    pub watch_msg: Option<(u8, u8)>,
    pub inflight: Option<Inflight>,
    /// The cell's `hub_woke`: a wake-up from the hub (lost messages, reconnect, resume,
    /// dropped waiters) came since the waiter last looked at its mail.
    pub hub_wake: bool,
}

#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Ws {
    /// Not started.
    #[default]
    Idle,
    Waiting(Wt),
    /// `acquire_wait` returned this guard. `bg`: a background confirm is due (the bugs).
    /// The lease as `src/hold/lease.rs` keeps it: `until` (the guard's validity) is `conf`
    /// (the deadline of the latest call Redis confirmed) cut to `pend` (the earliest deadline
    /// of the calls sent since, whose outcome is not known; 0: none); `ttl` is what the
    /// refreshes set (the latest `extend`'s); `call` the lease-setting call it waits for on
    /// a stalled connection (send tick, TTL, whether an `extend`); `care`: it overstays.
    Holding {
        until: u8,
        fence: u8,
        bg: bool,
        conf: u8,
        pend: u8,
        ttl: u8,
        care: bool,
        call: Option<(u8, u8, bool)>,
    },
    /// Returned (`WaitTimeout`, or the guard released, lost or killed).
    Done,
}

pub const CALM_FREEZE: u8 = 1;
pub const CALM_KILL: u8 = 2;
pub const CALM_DROP: u8 = 4;
pub const CALM_STALL: u8 = 8;
pub const CALM_RELEASE: u8 = 16;
/// A calm release, kill or subscriber drop may still interleave with its own process's urgent
/// steps (its messages in flight, its waiters' reactions), not with other processes'.
pub const CALM_OWN: u8 = 64;
/// Resume, re-made subscriber connection, the start of a stalled connection's replay.
pub const CALM_RECOVER: u8 = 32;

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

pub const LOSS: usize = 0;
pub const FREEZE: usize = 1;
pub const DROP: usize = 2;
pub const KILL: usize = 3;
pub const STALL: usize = 4;
pub const EXTEND: usize = 5;
pub const REFRESH: usize = 6;
pub const CARELESS: usize = 7;
pub const STEP: usize = 8;

/// Ghost flags.
pub const FENCE_REGRESS: u8 = 1;
pub const FENCE_STALE: u8 = 2;
pub const SHORT_RETURN: u8 = 4;
pub const LATE_END: u8 = 8;
/// A guard read valid past what Redis was last told for its token (its lease), or while its
/// token did not hold the lock.
pub const OVER_LEASE: u8 = 16;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct St {
    pub now: u8,
    // Redis
    pub lock: Option<Lock>,
    /// Fence counter (0: no key yet), its queued hint and pending short-grant process.
    pub fence: u8,
    pub fence_q: bool,
    pub fence_pending: Option<Pid>,
    /// The queue, oldest first.
    pub queue: Fifo<W, MAXW>,
    /// '!w1', '!w2': (tick it looks, 0 = past; member).
    pub watchers: [Option<(u8, W)>; 2],
    /// '!h': the holder's process as Redis recorded it: by a grant, by a queued attempt that
    /// took the lock free with waiters left behind it, and when the first member queues behind
    /// a lock taken free (state 'p': from the holder's token; every token here has its
    /// process); kept when the lock expires or is released (it may name a former holder);
    /// deleted with the processes hash.
    pub holder_hub: Option<Pid>,
    /// How far Redis' clock stepped back (Redis time = `now - back`). Every time Redis keeps
    /// (the lock's expiry, records, watchers' times, grants' times, the keys' expiries) is a
    /// Redis time.
    pub back: u8,
    /// With a retention: when the queue, the processes hash and the fence counter expire
    /// (Redis time; 0: no expiry, or no key), and whether the counter is gone (`fence` keeps
    /// the highest fence given: a vanished counter is started again above it, from Redis'
    /// clock).
    pub q_exp: u8,
    pub p_exp: u8,
    pub f_exp: u8,
    pub f_gone: bool,
    // processes
    pub procs: Fifo<Pr, MAXP>,
    /// Messages in flight, FIFO per subscriber connection.
    pub chans: [Fifo<Msg, MAXM>; MAXP],
    /// Calls on a stalled client connection, FIFO per process.
    pub late: [Fifo<Call, MAXC>; MAXP],
    pub ws: Fifo<Ws, MAXW>,
    /// Budgets left: LOSS, FREEZE, DROP, KILL, STALL, EXTEND, REFRESH, CARELESS, STEP.
    pub budget: [u8; 9],
    // ghosts
    /// Ticks since the last acquisition during which no guard was valid and a live waiter waited.
    pub idle: u8,
    /// The idle bound so far: the sum of the costs of the incidents since the last acquisition.
    pub allowance: u8,
    /// The highest fence of a returned guard.
    pub top_fence: u8,
    pub flags: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    Tick,
    /// A waiter starts: the fast path (one plain attempt), then it registers.
    Start(W),
    /// A queueing attempt (`check`).
    Attempt(W),
    /// The loop wakes: a grant or watch message, a wake-up, its watch time, backoff, deadline.
    Wake(W),
    /// A call on a stalled connection reaches its time limit.
    TimeOut(W),
    /// The holder releases (or drops) its guard.
    Release(W),
    /// The bugs' background confirm.
    BgConfirm(W),
    /// The dispatcher delivers the head message of a process's subscriber connection.
    Deliver(Pid),
    Lose(Pid),
    /// The hub notices a loss (lagged / reconnect) and wakes every waiter.
    Notice(Pid),
    Freeze(Pid),
    Resume(Pid),
    Kill(Pid),
    SubDrop(Pid),
    /// The subscriber connection is re-made and its channels confirmed; every waiter wakes.
    Resub(Pid),
    Stall(Pid),
    /// Redis runs the next call of a stalled connection.
    Replay(Pid),
    /// A holder calls `extend(ttl)`: `false` the short TTL, `true` the long one.
    Extend(W, bool),
    /// A holder's keep-alive refreshes (its TTL).
    Refresh(W),
    /// A holder overstays: it does not release before its lease ends (no fault).
    Overstay(W),
    /// Redis' clock steps back by `step` ticks.
    StepBack,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// acquire {0}
    Acquired(u8),
    /// acquire {3}
    Granted(u8),
    /// acquire {1}
    AlreadyHeld { fence: u8, remaining: u8 },
    /// acquire {2, pttl, 0(, 1)} or {2, pttl, 1, listening, fence, watching, time, depth}
    Locked {
        remaining: u8,
        queued: Option<Queued>,
    },
    /// release/extend/leave {0}
    NotHeld,
    /// extend {1, fence}: renewed, the fence of the hold
    Renewed(u8),
    /// extend {3, fence}: a short grant confirmed
    Confirmed(u8),
    /// release {1} / {2}, leave {2}
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub fence: u8,
    pub deaf: bool,
    pub watcher: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    Me,
    Granted,
    Empty,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Status {
    Gone,
    Stale,
    Fresh,
}

/// The model (Sync: the latches are atomics).
pub struct Queue {
    pub cfg: Cfg,
    /// Report only the first violation of each property (shortest traces with 1-thread BFS).
    pub first_only: bool,
    pub latched: [AtomicBool; 10],
}

const CAP: u8 = 40;

fn clamp(now: u8, at: u8) -> u8 {
    if at <= now {
        0
    } else {
        at
    }
}

impl Queue {
    pub fn new(cfg: Cfg) -> Queue {
        Queue {
            cfg,
            first_only: false,
            latched: Default::default(),
        }
    }

    /// Whether `r`'s behaviour is taken back to before its fix.
    fn reverted(&self, r: Revert) -> bool {
        self.cfg.revert == Some(r)
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

    fn nw(&self) -> usize {
        (self.cfg.procs * self.cfg.wpp) as usize
    }
    fn np(&self) -> usize {
        self.cfg.procs as usize
    }
    /// The process of waiter `w`.
    pub fn pw(&self, w: W) -> usize {
        (w / self.cfg.wpp) as usize
    }
    fn waiters(&self, p: usize) -> impl Iterator<Item = usize> {
        let wpp = self.cfg.wpp as usize;
        p * wpp..(p + 1) * wpp
    }
    fn running(&self, s: &St, p: usize) -> bool {
        s.procs[p].run == Run::Running
    }
    fn registered(&self, s: &St, p: usize) -> bool {
        self.waiters(p).any(|w| matches!(s.ws[w], Ws::Waiting(_)))
    }
    fn wt(s: &St, w: usize) -> Wt {
        match s.ws[w] {
            Ws::Waiting(t) => t,
            other => panic!("waiter {w} is not waiting: {other:?}"),
        }
    }

    // ---------------------------------------------------------------- Redis (the scripts)

    // mirrors common.lua -> slow -> listener(hub): somebody listens on the process's grant
    // channel (its subscriber connection is up and a waiter of it is registered on the key)
    fn listener(&self, s: &St, p: usize) -> bool {
        let pr = s.procs[p];
        pr.sub && pr.run != Run::Killed && self.registered(s, p)
    }

    /// Redis' clock (it may have stepped back: `back`).
    pub fn rnow(&self, s: &St) -> u8 {
        s.now - s.back
    }

    /// Whether `p`'s record says Redis saw it call within the presence window by Redis' own
    /// clock: `0 <= now - seen <= presence` (R4 reverted: a record in Redis' future too).
    fn recent(&self, s: &St, p: usize) -> bool {
        match s.procs[p].rec {
            Rec::Seen(t) => {
                let d = self.rnow(s) as i16 - t as i16;
                (d >= 0 || self.reverted(Revert::R4Future)) && d <= self.cfg.presence as i16
            }
            _ => false,
        }
    }

    // mirrors common.lua -> slow -> process(hub): gone (lapsed 'x', or nobody listens), fresh
    // (seen within the presence window, by Redis' clock, not in its future) or stale
    fn process(&self, s: &St, p: usize) -> Status {
        let pr = s.procs[p];
        if pr.rec == Rec::Lapsed || !self.listener(s, p) {
            return Status::Gone;
        }
        if self.recent(s, p) {
            Status::Fresh
        } else {
            Status::Stale
        }
    }

    /// The processes hash exists (a record, a watcher field or `'!h'`).
    fn pkey_exists(&self, s: &St) -> bool {
        s.procs.iter().any(|pr| pr.rec != Rec::None)
            || s.watchers.iter().any(|w| w.is_some())
            || s.holder_hub.is_some()
    }

    // mirrors common.lua -> slow -> seen(hub): a new field gives the hash the retention (the
    // sweep of records that say nothing changes nothing here: a record that is not fresh
    // means what no record means)
    fn seen(&self, s: &mut St, hub: Option<usize>) {
        if let Some(p) = hub {
            let new = s.procs[p].rec == Rec::None;
            s.procs[p].rec = Rec::Seen(self.rnow(s));
            if new {
                if let Some(r) = self.cfg.retain {
                    s.p_exp = self.rnow(s) + r;
                }
            }
        }
    }

    // mirrors common.lua -> slow -> retain(): the processes hash gets the retention if it has
    // no expiry
    fn retain(&self, s: &mut St) {
        if let Some(r) = self.cfg.retain {
            if s.p_exp == 0 && self.pkey_exists(s) {
                s.p_exp = self.rnow(s) + r;
            }
        }
    }

    // mirrors common.lua -> slow -> keep(px): the queue and the processes hash live the lease
    // `px` plus the retention (R3 reverted: not called)
    fn keep(&self, s: &mut St, px: u8) {
        let Some(r) = self.cfg.retain else { return };
        if self.reverted(Revert::R3Retention) {
            return;
        }
        let life = self.rnow(s) + px + r;
        if !s.queue.is_empty() {
            s.q_exp = life;
        }
        if self.pkey_exists(s) {
            s.p_exp = life;
        }
    }

    /// The fence counter's expiry after a write for the lease `px` (the lease plus the
    /// retention; R3 reverted: the retention alone).
    fn fence_life(&self, s: &St, px: u8) -> u8 {
        match self.cfg.retain {
            None => 0,
            Some(r) if self.reverted(Revert::R3Retention) => self.rnow(s) + r,
            Some(r) => self.rnow(s) + r + px,
        }
    }

    // mirrors common.lua -> slow -> lapse(hub): only if the processes hash exists
    fn lapse(&self, s: &mut St, p: usize) {
        let exists = s.procs.iter().any(|pr| pr.rec != Rec::None)
            || s.watchers.iter().any(|w| w.is_some())
            || s.holder_hub.is_some();
        if exists {
            s.procs[p].rec = Rec::Lapsed;
        }
    }

    /// `DEL KEYS[4]`: the processes hash, watchers included.
    fn del_pkey(&self, s: &mut St) {
        for pr in s.procs.iter_mut() {
            pr.rec = Rec::None;
        }
        s.watchers = [None, None];
        s.holder_hub = None;
        s.p_exp = 0;
    }

    // mirrors common.lua -> next_fence(queued, hub, px): the counter lives the lease `px`
    // plus the retention (R3 reverted: the retention)
    fn next_fence(&self, s: &mut St, queued: bool, pending: Option<Pid>, px: u8) -> u8 {
        s.fence += 1;
        s.fence_q = queued;
        s.fence_pending = pending;
        s.f_gone = false;
        s.f_exp = self.fence_life(s, px);
        s.fence
    }

    // mirrors common.lua -> slow -> fence_flags(queued, hub, old, px): the fence's hints, same
    // number; with `px` the counter lives that lease plus the retention (R3 reverted: its TTL
    // is kept); a vanished counter is started again from Redis' clock (above every fence)
    fn fence_flags(&self, s: &mut St, queued: bool, pending: Option<Pid>, px: Option<u8>) -> u8 {
        s.fence_q = queued;
        s.fence_pending = pending;
        if s.f_gone || s.fence == 0 {
            s.fence += 1;
            s.f_gone = false;
            s.f_exp = match self.cfg.retain {
                Some(r) => {
                    self.rnow(s)
                        + r
                        + px.filter(|_| !self.reverted(Revert::R3Retention))
                            .unwrap_or(0)
                }
                None => 0,
            };
        } else if let Some(px) = px {
            if !self.reverted(Revert::R3Retention) {
                s.f_exp = self.fence_life(s, px);
            }
        }
        s.fence
    }

    // mirrors common.lua -> slow -> held_by(hub): '!h' = hub, or HDEL when hub is '' (unknown)
    fn held_by(&self, s: &mut St, hub: Option<usize>) {
        s.holder_hub = hub.map(|p| p as Pid);
    }

    // mirrors common.lua -> slow -> holder_hub(): HGET '!h' ('' = unknown)
    fn holder_hub(&self, s: &St) -> Option<usize> {
        s.holder_hub.map(|p| p as usize)
    }

    // mirrors common.lua -> slow -> serve(self): hand the lock to the oldest live waiter
    fn serve(&self, s: &mut St, me: Option<W>) -> Served {
        let (ttl, claim) = (self.cfg.ttl, self.cfg.claim);
        let mut i = 0;
        let mut told = 0u32;
        while i < s.queue.len() {
            let head = s.queue[i];
            if Some(head) == me {
                s.queue.drain_front(i + 1);
                return Served::Me;
            }
            let p = self.pw(head);
            let st = self.process(s, p);
            if s.procs[p].rec == Rec::Lapsed
                && told & (1 << p) == 0
                && !self.reverted(Revert::F2Lapse)
            {
                // `p.lapsed and not p.told`: a process whose waiters are dropped is told so
                // ('d2') if it still listens
                told |= 1 << p;
                if self.listener(s, p) {
                    s.chans[p].push(Msg::Dropped);
                }
            }
            if st != Status::Gone {
                s.queue.drain_front(i + 1);
                let full = st == Status::Fresh && self.cfg.bug != Bug::ShortLeaseBackgroundConfirm;
                // a short grant is always shorter than the TTL (half of it within the claim
                // window), so that its waiter always confirms it
                let px = if full {
                    ttl
                } else if ttl > claim {
                    claim
                } else {
                    (ttl / 2).max(1)
                };
                let more = !s.queue.is_empty();
                let pending = if more && !full { Some(p as Pid) } else { None };
                let f = self.next_fence(s, more, pending, px);
                let now = self.rnow(s);
                s.lock = Some(Lock {
                    st: if full { LockSt::H } else { LockSt::G },
                    holder: head,
                    exp: now + px,
                });
                s.holder_hub = Some(p as Pid); // HSET pkey '!h' hub
                s.chans[p].push(Msg::Grant {
                    to: head,
                    fence: f,
                    px,
                    at: now,
                });
                self.watch(s, Some(p), px, false);
                if more {
                    self.keep(s, px);
                } else if !self.reverted(Revert::R3Retention) {
                    self.retain(s);
                }
                // Idle cost: a grant to a frozen process waits (at most) its whole lease: its
                // TTL if Redis saw it within the presence window by its own clock (`recent`,
                // as the fixed `process()` judges), else the claim window (it should have had a
                // short grant); a grant to a process whose calls (the confirm) are held up, its
                // lease.
                if matches!(s.procs[p].run, Run::Frozen(_)) {
                    let fresh = matches!(s.procs[p].rec, Rec::Seen(t) if {
                        let d = now as i16 - t as i16;
                        d >= 0 && d <= self.cfg.presence as i16
                    });
                    let cost = if fresh { px } else { px.min(claim) };
                    self.charge(s, COST_GRANT, cost);
                } else if s.procs[p].stalled {
                    self.charge(s, COST_GRANT, px);
                }
                return Served::Granted;
            }
            i += 1;
        }
        // Every member scanned was dropped (the model scans without the 200 bound).
        s.queue.clear();
        Served::Empty
    }

    // mirrors common.lua -> slow -> watch(skip, px, later): keep two watchers of other processes
    fn watch(&self, s: &mut St, skip: Option<usize>, px: u8, later: bool) {
        let now = self.rnow(s);
        let until = now + px;
        let stat: Vec<Status> = (0..self.np()).map(|p| self.process(s, p)).collect();
        let mut cands: Vec<(W, Option<u8>)> = Vec::with_capacity(8);
        for f in 0..2 {
            if let Some((at, m)) = s.watchers[f] {
                if s.queue.contains(&m) {
                    cands.push((m, Some(at)));
                }
            }
        }
        for &m in s.queue.iter().rev().take(16) {
            cands.push((m, None));
        }
        let mut chosen: Vec<(W, Option<u8>)> = Vec::with_capacity(2);
        let mut hubs = 0u32;
        let mut pick = |fresh_only: bool, allow_skip: bool, chosen: &mut Vec<(W, Option<u8>)>| {
            for &(m, at) in &cands {
                if chosen.len() == 2 {
                    return;
                }
                let wp = self.pw(m);
                if hubs & (1 << wp) == 0 && (allow_skip || Some(wp) != skip) {
                    let st = stat[wp];
                    if st != Status::Gone && (st == Status::Fresh || !fresh_only) {
                        hubs |= 1 << wp;
                        chosen.push((m, at));
                    }
                }
            }
        };
        pick(true, false, &mut chosen);
        pick(false, false, &mut chosen);
        // fewer than two other processes: from the skipped one too (R5 reverted: only when
        // none is left)
        let fill = chosen.is_empty() || !self.reverted(Revert::R5Fill);
        if fill && chosen.len() < 2 {
            pick(false, true, &mut chosen);
        }
        s.watchers = [None, None];
        let any = !chosen.is_empty();
        for (i, (m, at)) in chosen.into_iter().enumerate() {
            // a kept watcher is told again if it would look later than the lease ends (with
            // `later`, a refresh: also earlier)
            let at = match at {
                Some(a) if until >= a && !(later && until > a) => a,
                _ => {
                    // `w3 <px> <now> <token>`; kept as the receiver's `look_at` bound (see
                    // `Msg::Watch`)
                    let by = match s.ws[m as usize] {
                        Ws::Waiting(Wt {
                            anchor: Some((_, lag)),
                            ..
                        }) => (now as i16 - lag as i16 + px as i16).clamp(0, 254) as u8,
                        _ => NO_BOUND,
                    };
                    s.chans[self.pw(m)].push(Msg::Watch { to: m, px, by });
                    until
                }
            };
            s.watchers[i] = Some((clamp(now, at), m));
        }
        if any {
            self.retain(s);
        }
    }

    // mirrors common.lua -> slow -> watching(pttl): is the new member a watcher?
    fn watching(&self, s: &mut St, m: W, pttl: u8) -> bool {
        let field = if self.reverted(Revert::F1Watchers) {
            // before F1's fix: its own field, else the first free one
            (0..2)
                .find(|&f| matches!(s.watchers[f], Some((_, o)) if o == m))
                .or_else(|| (0..2).find(|&f| s.watchers[f].is_none()))
        } else {
            let hub = self.pw(m);
            let hubs = s.watchers.map(|x| x.map(|(_, o)| self.pw(o)));
            // `fits(i)`: the other field's watcher is not of the caller's process
            let fits = |f: usize| hubs[1 - f] != Some(hub);
            (0..2)
                .find(|&f| matches!(s.watchers[f], Some((_, o)) if o == m))
                .or_else(|| (0..2).find(|&f| s.watchers[f].is_none() && fits(f)))
                .or_else(|| {
                    // HGET pkey '!h': replace a watcher of the holder's process, if known
                    let holder = s.holder_hub.map(|h| h as usize).filter(|&h| h != hub)?;
                    (0..2).find(|&f| hubs[f] == Some(holder) && fits(f))
                })
        };
        let Some(f) = field else { return false };
        let now = self.rnow(s);
        s.watchers[f] = Some((clamp(now, now + pttl), m));
        if self.reverted(Revert::R3Retention) {
            self.retain(s); // (now `enqueue` keeps the hash)
        }
        true
    }

    // mirrors common.lua -> slow -> enqueue(pttl)
    fn enqueue(&self, s: &mut St, w: W, pttl: u8) -> Reply {
        let p = self.pw(w);
        self.seen(s, Some(p));
        // `add_member`: at the back, once (its score never below the last member's, so the
        // queue's order is the order of arrival, as here, also across a clock step)
        if !s.queue.contains(&w) {
            s.queue.push(w);
            if let (Some(r), true) = (self.cfg.retain, self.reverted(Revert::R3Retention)) {
                s.q_exp = self.rnow(s) + r; // the old `PEXPIRE q RETAIN` on a new member
            }
        }
        self.fence_flags(s, true, s.fence_pending, None);
        let deaf = !self.listener(s, p);
        let watcher = self.watching(s, w, pttl);
        // the first member keeps the queue (later ones find it kept: by the first, or by the
        // calls that set the lease since)
        if s.queue.len() == 1 {
            self.keep(s, pttl);
        }
        Reply::Locked {
            remaining: pttl,
            queued: Some(Queued {
                fence: s.fence,
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
        let ttl = self.cfg.ttl;
        match s.lock {
            None => {
                s.lock = Some(Lock {
                    st: LockSt::P,
                    holder: w,
                    exp: now + ttl,
                });
                let (old_q, old_pending) = (s.fence_q, s.fence_pending);
                let f = self.next_fence(s, false, None, ttl);
                if !old_q {
                    return Reply::Acquired(f);
                }
                if let Some(pp) = old_pending {
                    if Some(pp as usize) != hub {
                        self.lapse(s, pp as usize);
                    }
                }
                self.seen(s, hub);
                match self.serve(s, if member { Some(w) } else { None }) {
                    Served::Me | Served::Empty => {
                        let more = !s.queue.is_empty();
                        if more {
                            s.lock.as_mut().unwrap().st = LockSt::Q;
                            self.held_by(s, hub);
                            // the caller holds now: the watchers are chosen again (R2 reverted:
                            // not)
                            if !self.reverted(Revert::R2SelfWatch) {
                                self.watch(s, hub, ttl, false);
                            }
                            self.keep(s, ttl);
                        } else {
                            self.del_pkey(s);
                        }
                        self.fence_flags(s, more, None, Some(ttl));
                        Reply::Acquired(f)
                    }
                    Served::Granted => {
                        let px = s.lock.unwrap().exp - now;
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
                    self.watch(s, hub, ttl, true);
                    return Reply::Granted(f);
                }
                if l.st == LockSt::H {
                    s.lock.as_mut().unwrap().st = LockSt::Q;
                }
                let remaining = l.exp - now;
                // a vanished counter is started again (R3 reverted: fence 0)
                let fence = if s.f_gone && self.reverted(Revert::R3Retention) {
                    0
                } else if s.f_gone {
                    self.fence_flags(s, l.st != LockSt::P, None, Some(remaining))
                } else {
                    s.fence
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
                    s.lock.as_mut().unwrap().st = LockSt::Q;
                    if !self.reverted(Revert::F7Holder) {
                        self.held_by(s, Some(self.pw(l.holder)));
                    }
                }
                self.enqueue(s, w, pttl)
            }
        }
    }

    // mirrors common.lua -> slow -> confirm_grant (`ttl`: the call's TTL)
    fn confirm_grant(&self, s: &mut St, w: W, ttl: u8) -> u8 {
        s.lock = Some(Lock {
            st: LockSt::Q,
            holder: w,
            exp: self.rnow(s) + ttl,
        });
        self.seen(s, Some(self.pw(w)));
        let queued = s.fence_q;
        if queued {
            self.keep(s, ttl);
        }
        self.fence_flags(s, queued, None, Some(ttl))
    }

    // mirrors src/redis/lua/release.lua (HUB: the guard's process)
    fn release(&self, s: &mut St, w: W) -> Reply {
        let Some(l) = s.lock else {
            if s.fence_q && !self.reverted(Revert::F5Release) {
                // The lease ran out before this release and nobody took the lock, waiters
                // queued: lapse a pending short grant (not the caller's process), SET the lock
                // 'q'..TOKEN PX CLAIM and release_held('q'): serve them, or delete everything.
                // No `seen(HUB)`, no fence for the caller; the reply is {0} (or {0, 4}).
                if let Some(pp) = s.fence_pending {
                    if pp as usize != self.pw(w) {
                        self.lapse(s, pp as usize);
                    }
                }
                s.lock = Some(Lock {
                    st: LockSt::Q,
                    holder: w,
                    exp: self.rnow(s) + self.cfg.ttl.min(self.cfg.claim),
                });
                self.release_held(s, LockSt::Q);
            }
            return Reply::NotHeld;
        };
        if l.holder != w {
            return Reply::NotHeld;
        }
        if l.st == LockSt::P {
            s.lock = None;
            return Reply::Done;
        }
        self.seen(s, Some(self.pw(w)));
        self.release_held(s, l.st)
    }

    // mirrors common.lua -> slow -> release_held(state): serve the queue or delete
    fn release_held(&self, s: &mut St, st: LockSt) -> Reply {
        if st != LockSt::P {
            if self.serve(s, None) == Served::Granted {
                return Reply::Done;
            }
            self.fence_flags(s, false, None, None);
            self.del_pkey(s);
        }
        s.lock = None;
        Reply::Done
    }

    // mirrors src/redis/lua/extend.lua: `{3, fence}` a short grant confirmed, `{1, fence}` renewed;
    // the watchers are told when the lease now ends (`watch(HUB, TTL, true)`: they skip the
    // caller's process, the holder's; F7 reverted: `watch(nil, TTL, true)`)
    fn extend(&self, s: &mut St, w: W, ttl: u8) -> Reply {
        let Some(l) = s.lock else {
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
            self.watch(s, hub, ttl, true);
            return Reply::Confirmed(f);
        }
        let now = self.rnow(s);
        let lock = s.lock.as_mut().unwrap();
        if l.st == LockSt::H {
            lock.st = LockSt::Q;
        }
        lock.exp = now + ttl;
        // GETEX PX retention + TTL (R3 reverted: the retention)
        let gone = s.f_gone;
        if !gone {
            s.f_exp = self.fence_life(s, ttl);
        }
        if l.st != LockSt::P {
            self.watch(s, hub, ttl, true);
            self.keep(s, ttl);
        }
        if !gone {
            return Reply::Renewed(s.fence);
        }
        // the counter is gone: `{1}` without a fence (R3 reverted), else started again
        if self.reverted(Revert::R3Retention) {
            return Reply::Renewed(0);
        }
        Reply::Renewed(self.fence_flags(s, l.st != LockSt::P, None, Some(ttl)))
    }

    // mirrors src/redis/lua/leave.lua (the model's leaves: the queue residue's 'G', the
    // dispatcher's 'o' for a grant whose waiter has gone); a member that leaves: `watch(
    // holder_hub(), pttl)` (F7 reverted: `watch(nil, pttl)`)
    fn leave(&self, s: &mut St, w: W, member: bool, flag: Flag) -> Reply {
        if member {
            if let Some(i) = s.queue.iter().position(|&m| m == w) {
                s.queue.remove(i);
                let now = self.rnow(s);
                let pttl = s.lock.map_or(0, |l| l.exp - now);
                let skip = if self.reverted(Revert::F7Holder) {
                    None
                } else {
                    self.holder_hub(s)
                };
                self.watch(s, skip, pttl, false);
            }
        }
        let Some(l) = s.lock else {
            return Reply::NotHeld;
        };
        if l.holder != w {
            return Reply::NotHeld;
        }
        if let Flag::O(f) = flag {
            if !matches!(l.st, LockSt::H | LockSt::G) || s.fence != f {
                return Reply::NotHeld;
            }
        }
        self.release_held(s, l.st)
    }

    fn run_call(&self, s: &mut St, c: Call) -> Reply {
        match c {
            Call::Acquire { w, member, .. } => self.acquire(s, w, member),
            Call::Extend { w, .. } => self.extend(s, w, self.cfg.ttl),
            Call::Release { w } => self.release(s, w),
            Call::Leave { w, member, flag } => self.leave(s, w, member, flag),
            Call::Renew { w, ttl, .. } => self.extend(s, w, ttl),
        }
    }

    // ---------------------------------------------------------------- ghosts

    fn charge(&self, s: &mut St, kind: u8, ticks: u8) {
        if self.cfg.no_cost & kind != 0 {
            return;
        }
        s.allowance = s.allowance.saturating_add(ticks).min(CAP);
    }

    /// (g): every guard that reads valid is its token's hold in Redis, and no longer than
    /// Redis keeps it (the lock's expiry, a Redis time, by the waiters' clock).
    fn check_leases(&self, s: &mut St) {
        for w in 0..self.nw() {
            if let Ws::Holding { until, .. } = s.ws[w] {
                if s.now < until {
                    let ok = s
                        .lock
                        .is_some_and(|l| l.holder as usize == w && until <= l.exp + s.back);
                    if !ok {
                        s.flags |= OVER_LEASE;
                    }
                }
            }
        }
    }

    fn valid(&self, s: &St, w: usize) -> bool {
        matches!(s.ws[w], Ws::Holding { until, .. } if s.now < until)
    }

    /// The idle cost of the lock held by a waiter of `p` that cannot pass it on now.
    fn charge_hold_of(&self, s: &mut St, p: usize, guard_gone: bool, kind: u8) {
        let Some(l) = s.lock else { return };
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

    /// `acquire_wait` returns a guard.
    fn guard(&self, s: &mut St, w: usize, fence: u8, until: u8, reference: u8, bg: bool) {
        if (until as u16) + (self.cfg.slack as u16) < reference as u16 + self.cfg.ttl as u16 {
            s.flags |= SHORT_RETURN;
        }
        if fence <= s.top_fence {
            s.flags |= FENCE_REGRESS;
        }
        if fence != s.fence {
            s.flags |= FENCE_STALE;
        }
        s.top_fence = s.top_fence.max(fence);
        s.ws[w] = Ws::Holding {
            until,
            fence,
            bg,
            conf: until,
            pend: 0,
            ttl: self.cfg.ttl,
            care: false,
            call: None,
        };
        s.idle = 0;
        s.allowance = 0;
    }

    /// A holder sends a call that sets its lease to `ttl` (a user's `extend` when `user`, else
    /// a keep-alive refresh): mirrors `LockGuard::extend` / the refresher with `Lease::sending`
    /// (the validity is cut at once to what the call gives; R1 reverted: nothing), the call
    /// (extend.lua), and `on_renew` for its reply. Calls that set the lease take turns: this is
    /// offered only while none is awaited.
    fn renew(&self, s: &mut St, w: usize, ttl: u8, user: bool) {
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
        if !self.reverted(Revert::R1Lease) {
            let d = sent + ttl;
            pend = if pend == 0 { d } else { pend.min(d) };
            until = conf.min(pend);
        }
        let p = self.pw(w as W);
        let stalled = s.procs[p].stalled;
        if stalled {
            // Idle cost: the call waits on the stalled connection, and its outcome is unknown:
            // the guard has given up what the call may have cut, while Redis keeps the lock
            // until its lease ends (a user's extend holds up the section, and its release).
            if let Some(l) = s.lock.filter(|l| l.holder as usize == w) {
                let left = (l.exp + s.back).saturating_sub(until.max(s.now));
                self.charge(s, COST_STALLED_CALL, left);
            }
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
    fn on_renew(&self, s: &mut St, w: usize, r: Reply, sent: u8, ttl: u8) {
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
        let r1 = self.reverted(Revert::R1Lease);
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

    // ---------------------------------------------------------------- the client

    /// A call on the process's client: runs now, or waits on the stalled connection.
    fn issue(&self, s: &mut St, w: usize, c: Call) -> Option<Reply> {
        let p = self.pw(w as W);
        if s.procs[p].stalled {
            // Idle cost: the lock's holder cannot pass it on while its call waits.
            if let Some(l) = s.lock {
                if l.holder as usize == w && !self.valid(s, w) {
                    self.charge(s, COST_STALLED_CALL, (l.exp + s.back).saturating_sub(s.now));
                }
            }
            s.late[p].push(c);
            None
        } else {
            Some(self.run_call(s, c))
        }
    }

    /// Wakes every registered waiter of `p` (`wake_all` / `wake_channel`: one key).
    fn wake_all(&self, s: &mut St, p: usize) {
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
    fn start(&self, s: &mut St, w: usize) {
        let p = self.pw(w as W);
        let siblings = self.registered(s, p);
        if !siblings && !s.procs[p].stalled {
            // `if !hub.listening(&channel)`: one plain attempt (acquire.lua, no MEMBER, HUB '')
            if let Reply::Acquired(f) = self.acquire(s, w as W, false) {
                let now = s.now;
                self.guard(s, w, f, now + self.cfg.ttl, now, false);
                return;
            }
        }
        if !siblings {
            // A new slot: Pending until the subscription is confirmed (at once while connected).
            s.procs[p].slot_ok = s.procs[p].sub;
        }
        s.ws[w] = Ws::Waiting(Wt {
            deadline: s.now + self.cfg.wait,
            check: true,
            ..Wt::default()
        });
    }

    // mirrors src/wait/notify/mod.rs -> wait: `if check` (an attempt with the member)
    fn attempt(&self, s: &mut St, w: usize) {
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
            self.issue(
                s,
                w,
                Call::Acquire {
                    w: w as W,
                    member: true,
                    awaited: true,
                },
            );
            return;
        }
        s.ws[w] = Ws::Waiting(t);
        let r = self.acquire(s, w as W, true);
        let now = s.now;
        self.on_attempt(s, w, r, now);
    }

    // mirrors src/wait/mod.rs -> Waiting::attempt (the reply) and wait's `match step`
    fn on_attempt(&self, s: &mut St, w: usize, r: Reply, sent: u8) {
        let p = self.pw(w as W);
        let mut t = Self::wt(s, w);
        t.inflight = None;
        s.ws[w] = Ws::Waiting(t);
        let ttl = self.cfg.ttl;
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
                // Watch messages published before this attempt ran are stale (`look_at`'s
                // `None`): the code ignores them when it reads them; here they go now.
                t.watch_msg = None;
                let wa = w as W;
                s.chans[p] = s.chans[p]
                    .iter()
                    .copied()
                    .filter(|m| !matches!(m, Msg::Watch { to, .. } if *to == wa))
                    .collect();
                if q.deaf {
                    // hub.lost_subscription: Pending until the subscription is made again; the
                    // loop checks again at once and finds it Pending (`watch = None`)
                    s.procs[p].slot_ok = false;
                    t.watch = None;
                } else {
                    // (from the attempt's send: a late reply does not make it look late)
                    t.watch = if q.watcher {
                        Some(sent + remaining)
                    } else {
                        None
                    };
                }
                s.ws[w] = Ws::Waiting(t);
            }
            other => panic!("attempt with a member replied {other:?}"),
        }
    }

    /// `Waiting::limit` of a call sent at `sent`: the command timeout, cut to the deadline (the
    /// 5 ms grace is below a tick). F6 reverted: the command timeout.
    fn limit(&self, t: &Wt, sent: u8, f6: bool) -> u8 {
        if f6 && self.reverted(Revert::F6Limit) {
            return self.cfg.cmd;
        }
        self.cfg.cmd.min(t.deadline.saturating_sub(sent))
    }

    // mirrors src/wait/mod.rs -> Request::full_lease (after Waiting::attempt, with its limit)
    fn full_lease(&self, s: &mut St, w: usize, fence: u8, until: u8, sent: u8) {
        if until >= s.now + self.cfg.ttl {
            self.guard(s, w, fence, until, sent, false);
            return;
        }
        let limit = self.limit(&Self::wt(s, w), sent, true);
        self.extend_then(
            s,
            w,
            Inflight::Lease {
                fence,
                sent: s.now,
                limit,
            },
        );
    }

    /// The extend of `full_lease` (after an attempt, or to confirm a grant).
    fn extend_then(&self, s: &mut St, w: usize, kind: Inflight) {
        let p = self.pw(w as W);
        if s.procs[p].stalled {
            let mut t = Self::wt(s, w);
            t.inflight = Some(kind);
            s.ws[w] = Ws::Waiting(t);
            self.issue(
                s,
                w,
                Call::Extend {
                    w: w as W,
                    awaited: true,
                },
            );
            return;
        }
        let r = self.extend(s, w as W, self.cfg.ttl);
        self.on_extend(s, w, r, kind);
    }

    // mirrors full_lease's `match engine.extend_on(..)`, then attempt's / wait's handling
    fn on_extend(&self, s: &mut St, w: usize, r: Reply, kind: Inflight) {
        let p = self.pw(w as W);
        let mut t = Self::wt(s, w);
        t.inflight = None;
        let (fence, sent, confirm) = match kind {
            Inflight::Lease { fence, sent, .. } => (fence, sent, false),
            Inflight::Confirm { fence, sent } => (fence, sent, true),
            Inflight::Attempt { .. } => unreachable!(),
        };
        let ttl = self.cfg.ttl;
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
                let fence = if self.reverted(Revert::F3Fence) {
                    fence
                } else {
                    f
                };
                self.guard(s, w, fence, sent + ttl, sent, false)
            }
            Reply::Confirmed(f) => self.guard(s, w, f, sent + ttl, sent, false),
            other => panic!("extend replied {other:?}"),
        }
    }

    // mirrors src/wait/notify/mod.rs -> take_grant
    fn take_grant(&self, s: &mut St, w: usize, g: GrantMsg) {
        let t = Self::wt(s, w);
        let ttl = self.cfg.ttl;
        let px = match self.cfg.bug {
            Bug::OwnClaimWindow => ttl.min(self.cfg.own_claim),
            _ => g.px,
        };
        let lag = t.anchor.map_or(0, |a| a.1) as i16;
        let until = g.at as i16 - lag + px as i16;
        let now = s.now as i16;
        match self.cfg.bug {
            Bug::ShortLeaseBackgroundConfirm => {
                // the old fast path: used at once while some of the window is left
                if until > now {
                    self.guard(s, w, g.fence, until as u8, s.now, true);
                    return;
                }
            }
            _ => {
                if px >= ttl && t.anchor.is_some() && until >= now + ttl as i16 {
                    self.guard(s, w, g.fence, until as u8, s.now, false);
                    return;
                }
            }
        }
        self.extend_then(
            s,
            w,
            Inflight::Confirm {
                fence: g.fence,
                sent: s.now,
            },
        );
    }

    // mirrors src/wait/notify/mod.rs -> wait: after the select (take_grant, take_hub_wake,
    // take_watch, the deadline)
    fn wake(&self, s: &mut St, w: usize) {
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
            t.watch = Some((s.now + px).min(by));
            // `check = hub_woke`: a hub wake always makes it look (F4 reverted: never here)
            t.check = hub_wake && !self.reverted(Revert::F4Wake);
        } else {
            // `check = hub_woke || reason is not a message`: a message that left nothing in
            // the mail (a left-over permit, a stale grant) gives nothing to look at.
            t.check = hub_wake || !by_message;
        }
        if s.now >= t.deadline {
            // WaitTimeout; the queue residue leaves in the background ('G')
            s.ws[w] = Ws::Done;
            self.issue(
                s,
                w,
                Call::Leave {
                    w: w as W,
                    member: true,
                    flag: Flag::G,
                },
            );
        } else {
            s.ws[w] = Ws::Waiting(t);
        }
    }

    fn timeout_at(&self, t: &Wt, i: Inflight) -> u8 {
        match i {
            Inflight::Attempt { sent } => sent + self.limit(t, sent, false),
            Inflight::Lease { sent, limit, .. } => sent + limit,
            // take_grant's limit: `w.limit(..)` when the grant is taken
            Inflight::Confirm { sent, .. } => sent + self.limit(t, sent, true),
        }
    }

    fn wake_due(&self, s: &St, t: &Wt) -> bool {
        t.permit || Self::time_due(s, t)
    }

    /// The select's sleep is over: the deadline, the backoff timer or the watch time is due.
    fn time_due(s: &St, t: &Wt) -> bool {
        let due = |x: Option<u8>| x.is_some_and(|v| v <= s.now);
        s.now >= t.deadline || due(t.timer) || due(t.watch)
    }

    // ---------------------------------------------------------------- properties' helpers

    pub fn valid_holders(&self, s: &St) -> usize {
        (0..self.nw()).filter(|&w| self.valid(s, w)).count()
    }

    fn live_waiter(&self, s: &St) -> bool {
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
    fn late_waiter(&self, s: &St) -> bool {
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

    fn quiescent(&self, s: &St) -> bool {
        s.ws.iter().all(|w| *w == Ws::Done)
            && s.late.iter().all(|l| l.is_empty())
            && s.chans.iter().all(|c| c.is_empty())
    }

    fn left_behind(&self, s: &St) -> bool {
        let killed = |w: W| s.procs[self.pw(w)].run == Run::Killed;
        s.queue.iter().any(|&m| !killed(m)) || s.lock.is_some_and(|l| !killed(l.holder))
    }
}

impl Model for Queue {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        let c = &self.cfg;
        vec![St {
            now: 0,
            lock: None,
            fence: 0,
            fence_q: false,
            fence_pending: None,
            queue: Fifo::default(),
            watchers: [None, None],
            holder_hub: None,
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
            back: 0,
            q_exp: 0,
            p_exp: 0,
            f_exp: 0,
            f_gone: false,
            idle: 0,
            allowance: 0,
            top_fence: 0,
            flags: 0,
        }]
    }

    fn actions(&self, s: &St, out: &mut Vec<Act>) {
        let mut urgent = false;
        // urgent steps pending, per process (a release may interleave with its own process's)
        let mut busy = 0u32;
        let mut calm: Vec<Act> = Vec::new();
        for w in 0..self.nw() {
            let p = self.pw(w as W);
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
                    if let Some(i) = t.inflight {
                        if s.now >= self.timeout_at(&t, i) {
                            urgent = true;
                            busy |= 1 << p;
                            out.push(Act::TimeOut(a));
                        }
                    } else if t.check {
                        urgent = true;
                        busy |= 1 << p;
                        out.push(Act::Attempt(a));
                    } else if self.wake_due(s, &t) {
                        urgent = true;
                        busy |= 1 << p;
                        out.push(Act::Wake(a));
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
                        if s.now >= sent + self.cfg.cmd {
                            urgent = true;
                            busy |= 1 << p;
                            out.push(Act::TimeOut(a));
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
                            urgent = true;
                            busy |= 1 << p;
                            out.push(Act::Release(a));
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
            if running && pr.stalled {
                if pr.draining {
                    urgent = true;
                    busy |= 1 << p;
                    out.push(Act::Replay(a));
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
        if s.budget[STEP] > 0 && self.rnow(s) >= self.cfg.step {
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
            let others_busy = match a {
                Act::Release(w) if self.cfg.calm & CALM_OWN != 0 => busy & !(1 << self.pw(w)) != 0,
                Act::SubDrop(p) | Act::Kill(p) if self.cfg.calm & CALM_OWN != 0 => {
                    busy & !(1 << p) != 0
                }
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
        let mut s = s0.clone();
        match a {
            // Time passes; Redis expires keys (PX) -- see `tick`.
            Act::Tick => self.tick(&mut s),
            // mirrors src/wait/notify/mod.rs -> wait: fast path (acquire.lua, no MEMBER), hub.register
            Act::Start(w) => self.start(&mut s, w as usize),
            // mirrors wait's `if check` -> Waiting::attempt -> src/redis/lua/acquire.lua (with MEMBER)
            Act::Attempt(w) => self.attempt(&mut s, w as usize),
            // mirrors wait after its select: take_grant (-> extend.lua), take_watch, the deadline
            // (-> QueueResidue's leave.lua 'G')
            Act::Wake(w) => self.wake(&mut s, w as usize),
            // mirrors a call's time limit (Engine::*_on's timeout): Waiting::failed -> Step::Failed
            // -> backoff, or take_grant's transient error -> `check = true`; Redis may still run it
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
                // LockGuard::release (or its drop): mirrors release.lua
                let w = w as usize;
                s.ws[w] = Ws::Done;
                self.issue(&mut s, w, Call::Release { w: w as W });
            }
            // the bug switches only: the old background confirm (extend.lua -> confirm_grant)
            Act::BgConfirm(w) => {
                // the old background confirm: mirrors extend.lua
                let w = w as usize;
                let Ws::Holding { until, fence, .. } = s.ws[w] else {
                    return None;
                };
                let until = match self.extend(&mut s, w as W, self.cfg.ttl) {
                    Reply::NotHeld => until,
                    _ => until.max(s.now + self.cfg.ttl),
                };
                if let Ws::Holding {
                    until: u, bg, conf, ..
                } = &mut s.ws[w]
                {
                    (*u, *bg, *conf) = (until, false, until);
                }
                let _ = fence;
            }
            Act::Deliver(p) => {
                // mirrors src/wait/notify/hub.rs -> Hub::deliver
                let p = p as usize;
                let m = s.chans[p].remove(0);
                match m {
                    Msg::Grant { to, fence, px, at } => match &mut s.ws[to as usize] {
                        Ws::Waiting(t) => {
                            t.grant = Some(GrantMsg { fence, px, at });
                            t.permit = true;
                        }
                        _ => {
                            // its waiter has gone: give back this grant only (leave 'o')
                            self.issue(
                                &mut s,
                                to as usize,
                                Call::Leave {
                                    w: to,
                                    member: false,
                                    flag: Flag::O(fence),
                                },
                            );
                        }
                    },
                    Msg::Watch { to, px, by } => {
                        if let Ws::Waiting(t) = &mut s.ws[to as usize] {
                            t.watch_msg = Some((px, by));
                            t.permit = true;
                        }
                    }
                    // `d2`: wake_channel(WakeReason::Resumed), a hub wake
                    Msg::Dropped => self.wake_all(&mut s, p),
                }
            }
            // a fault: the head message on P's subscriber connection is lost (reconnect, lagged)
            Act::Lose(p) => {
                s.chans[p as usize].remove(0);
                s.budget[LOSS] -= 1;
                s.procs[p as usize].missed = true;
            }
            // mirrors hub.rs -> dispatch: RecvError::Lagged / on_reconnect -> wake_all
            Act::Notice(p) => {
                s.procs[p as usize].missed = false;
                self.wake_all(&mut s, p as usize);
            }
            // a fault: the process freezes (SIGSTOP, a long pause): no timers, no messages read
            Act::Freeze(p) => {
                let p = p as usize;
                s.budget[FREEZE] -= 1;
                s.procs[p].run = Run::Frozen(0);
            }
            Act::Resume(p) => {
                // the housekeeper notices a freeze of `notice` ticks or more and wakes every waiter
                let p = p as usize;
                let Run::Frozen(k) = s.procs[p].run else {
                    return None;
                };
                s.procs[p].run = Run::Running;
                s.procs[p].thawed = true;
                if k >= self.cfg.notice {
                    self.wake_all(&mut s, p);
                }
            }
            // a fault: the process dies; its connections close (Redis counts no listener)
            Act::Kill(p) => {
                let p = p as usize;
                s.budget[KILL] -= 1;
                self.charge_hold_of(&mut s, p, true, COST_KILL);
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
                if let Some(l) = s.lock {
                    if self.pw(l.holder) == p && !self.valid(&s, l.holder as usize) {
                        let left = (l.exp + s.back).saturating_sub(s.now);
                        self.charge(&mut s, COST_DROP, left);
                    }
                }
            }
            // mirrors hub.rs -> on_reconnect (every slot Pending, wake_all) then sync's confirmation
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
                let ttl = if long {
                    self.cfg.ttl_long
                } else {
                    self.cfg.ttl_short
                };
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
            // a careless holder: no release before its lease ends (it costs the lock's lease
            // beyond its guard's validity, if any)
            Act::Overstay(w) => {
                s.budget[CARELESS] -= 1;
                if let Ws::Holding { care, .. } = &mut s.ws[w as usize] {
                    *care = true;
                }
                let p = self.pw(w);
                self.charge_hold_of(&mut s, p, false, COST_CARELESS);
            }
            // Redis' clock steps back (an NTP step, a failover to a node whose clock is behind)
            Act::StepBack => {
                s.budget[STEP] -= 1;
                s.back += self.cfg.step;
                self.charge(&mut s, COST_STEP, self.cfg.step);
            }
            // a fault: the client connection stalls: calls wait (fred replays them on reconnect)
            Act::Stall(p) => {
                s.budget[STALL] -= 1;
                s.procs[p as usize].stalled = true;
            }
            // Redis runs the next stalled call (acquire/extend/release/leave.lua); a caller still
            // waiting gets the reply
            Act::Replay(p) => {
                let p = p as usize;
                if !s.late[p].is_empty() {
                    s.procs[p].draining = true;
                    let c = s.late[p].remove(0);
                    let r = self.run_call(&mut s, c);
                    match c {
                        Call::Acquire {
                            w, awaited: true, ..
                        } => {
                            let Some(Inflight::Attempt { sent }) =
                                Self::wt(&s, w as usize).inflight
                            else {
                                unreachable!()
                            };
                            self.on_attempt(&mut s, w as usize, r, sent);
                        }
                        Call::Extend { w, awaited: true } => {
                            let kind = Self::wt(&s, w as usize).inflight.unwrap();
                            self.on_extend(&mut s, w as usize, r, kind);
                        }
                        Call::Renew {
                            w, awaited: true, ..
                        } => {
                            if let Ws::Holding {
                                call: Some((sent, ttl, _)),
                                ..
                            } = s.ws[w as usize]
                            {
                                self.on_renew(&mut s, w as usize, r, sent, ttl);
                            }
                        }
                        Call::Acquire { awaited: false, .. }
                            if matches!(r, Reply::Acquired(_) | Reply::Granted(_)) =>
                        {
                            // Idle cost: a timed-out attempt took the lock for a waiter that
                            // does not know it; it learns at its next attempt (the backoff),
                            // or its queue residue gives it back.
                            self.charge(&mut s, COST_LATE_ACQUIRE, 1);
                        }
                        _ => {}
                    }
                }
                if s.late[p].is_empty() {
                    s.procs[p].stalled = false;
                    s.procs[p].draining = false;
                }
            }
        }
        if self.cfg.retain.is_some() {
            self.settle_keys(&mut s);
        }
        self.check_leases(&mut s);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always("(a) never two valid holders", |m, s| {
                m.latch(0, m.valid_holders(s) < 2)
            }),
            Property::<Self>::always("(b) idle within the bound", |m, s| {
                m.latch(1, s.idle <= s.allowance)
            }),
            Property::<Self>::always("(c) guard fences strictly increase", |m, s| {
                m.latch(2, s.flags & FENCE_REGRESS == 0)
            }),
            Property::<Self>::always("(c2) a guard's fence is its hold's", |m, s| {
                m.latch(3, s.flags & FENCE_STALE == 0)
            }),
            Property::<Self>::always("(d) every wait ends by its deadline", |m, s| {
                m.latch(4, s.flags & LATE_END == 0)
            }),
            Property::<Self>::always("(e) nothing left behind", |m, s| {
                m.latch(5, !(m.quiescent(s) && m.left_behind(s)))
            }),
            Property::<Self>::always("(f) full lease at return", |m, s| {
                m.latch(6, s.flags & SHORT_RETURN == 0)
            }),
            Property::<Self>::always("(g) a guard never outlives its lease in Redis", |m, s| {
                m.latch(7, s.flags & OVER_LEASE == 0)
            }),
            Property::<Self>::sometimes("canary: every waiter ended", |_, s| {
                s.ws.iter().all(|w| *w == Ws::Done)
            }),
            Property::<Self>::sometimes("canary: a handed-over guard", |_, s| s.top_fence >= 3),
        ]
    }
}

impl Queue {
    /// Keys that are gone have no expiry (so that equal Redis states are equal states).
    fn settle_keys(&self, s: &mut St) {
        if s.queue.is_empty() {
            s.q_exp = 0;
        }
        if !self.pkey_exists(s) {
            s.p_exp = 0;
        }
        if s.f_gone || s.fence == 0 {
            s.f_exp = 0;
        }
    }

    // Time passes: keys expire, records age, dead data is forgotten, the idle ghost counts.
    fn tick(&self, s: &mut St) {
        if self.late_waiter(s) {
            s.flags |= LATE_END;
        }
        if self.valid_holders(s) == 0 && self.live_waiter(s) {
            s.idle = (s.idle + 1).min(s.allowance + 1);
        }
        s.now += 1;
        // Redis' clock: its keys expire, and its records age, by it.
        let now = self.rnow(s);
        if s.lock.is_some_and(|l| l.exp <= now) {
            s.lock = None;
        }
        for pr in s.procs.iter_mut() {
            if let Rec::Seen(t) = pr.rec {
                // (a record in Redis' future stays: it ages once Redis' clock passes it)
                if now >= t && now - t > self.cfg.presence {
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
        // The retention: the queue, the processes hash and the fence counter expire.
        if self.cfg.retain.is_some() {
            if s.q_exp != 0 && s.q_exp <= now {
                s.queue.clear();
            }
            if s.p_exp != 0 && s.p_exp <= now {
                self.del_pkey(s);
            }
            if s.f_exp != 0 && s.f_exp <= now {
                s.f_gone = true;
                s.fence_q = false;
                s.fence_pending = None;
            }
            self.settle_keys(s);
        }
        let px_max = self.cfg.ttl.max(self.cfg.own_claim);
        let bug = self.cfg.bug != Bug::None;
        let forget = |at: u8| -> u8 {
            // A grant's time matters only while its lease could still be used at once.
            if (!bug && at < now) || (bug && at + px_max <= now) {
                0
            } else {
                at
            }
        };
        // (a grant's time is Redis': one before Redis' now can no longer be used at once, as
        // Redis' clock only steps back; a waiter's timers are its own clock's)
        let local = s.now;
        for ws in s.ws.iter_mut() {
            if let Ws::Waiting(t) = ws {
                if let Some(x) = t.watch.as_mut() {
                    if *x <= local {
                        *x = 0;
                    }
                }
                if let Some(x) = t.timer.as_mut() {
                    if *x <= local {
                        *x = 0;
                    }
                }
                if let Some(g) = t.grant.as_mut() {
                    g.at = forget(g.at);
                }
                if let Some((_, by)) = t.watch_msg.as_mut() {
                    if *by <= local {
                        *by = 0;
                    }
                }
            }
        }
        for ch in s.chans.iter_mut() {
            for m in ch.iter_mut() {
                match m {
                    Msg::Grant { at, .. } => *at = forget(*at),
                    Msg::Watch { by, .. } if *by <= local => *by = 0,
                    _ => {}
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

fn rename_msg(m: Msg, f: impl Fn(W) -> W) -> Msg {
    match m {
        Msg::Grant { to, fence, px, at } => Msg::Grant {
            to: f(to),
            fence,
            px,
            at,
        },
        Msg::Watch { to, px, by } => Msg::Watch { to: f(to), px, by },
        Msg::Dropped => Msg::Dropped,
    }
}

fn rename_call(c: Call, f: impl Fn(W) -> W) -> Call {
    match c {
        Call::Acquire { w, member, awaited } => Call::Acquire {
            w: f(w),
            member,
            awaited,
        },
        Call::Extend { w, awaited } => Call::Extend { w: f(w), awaited },
        Call::Release { w } => Call::Release { w: f(w) },
        Call::Leave { w, member, flag } => Call::Leave {
            w: f(w),
            member,
            flag,
        },
        Call::Renew { w, ttl, awaited } => Call::Renew {
            w: f(w),
            ttl,
            awaited,
        },
    }
}

/// Applies `f` to every fence the state holds.
fn each_fence(s: &mut St, mut f: impl FnMut(&mut u8)) {
    f(&mut s.fence);
    f(&mut s.top_fence);
    for w in s.ws.iter_mut() {
        match w {
            Ws::Waiting(t) => {
                if let Some(a) = t.anchor.as_mut() {
                    f(&mut a.0);
                }
                if let Some(g) = t.grant.as_mut() {
                    f(&mut g.fence);
                }
                if let Some(Inflight::Lease { fence, .. } | Inflight::Confirm { fence, .. }) =
                    t.inflight.as_mut()
                {
                    f(fence);
                }
            }
            Ws::Holding { fence, .. } => f(fence),
            _ => {}
        }
    }
    for ch in s.chans.iter_mut() {
        for m in ch.iter_mut() {
            if let Msg::Grant { fence, .. } = m {
                f(fence);
            }
        }
    }
    for l in s.late.iter_mut() {
        for c in l.iter_mut() {
            if let Call::Leave {
                flag: Flag::O(fence),
                ..
            } = c
            {
                f(fence);
            }
        }
    }
}

/// Fences matter only by their order and equality (and the counter is above every other):
/// the same state with every fence replaced by its rank among the state's fences.
fn renumber_fences(s: &St) -> St {
    let mut t = s.clone();
    let mut seen = [false; 256];
    each_fence(&mut t, |f| seen[*f as usize] = true);
    let mut rank = [0u8; 256];
    let mut r = 0u8;
    for (v, &used) in seen.iter().enumerate().skip(1) {
        if used {
            r += 1;
            rank[v] = r;
        }
    }
    each_fence(&mut t, |f| *f = rank[*f as usize]);
    t
}

type WKey = (Ws, u8, bool, u8, u16, u16);
type PKey = (
    Pr,
    bool,
    bool,
    Fifo<WKey, MAXW>,
    Fifo<Msg, MAXM>,
    Fifo<Call, MAXC>,
);

/// The same state with processes, and waiters within each process, renamed into a canonical
/// order (sorted by everything that does not name another waiter: a waiter's state, its queue
/// position, whether it holds the key, its watcher fields; a process's state, its waiters, its
/// messages and stalled calls with waiters renamed within the process).
pub fn canonical(s: &St) -> St {
    let renumbered = renumber_fences(s);
    let s = &renumbered;
    let np = s.procs.len();
    let wpp = s.ws.len() / np;
    let wkey = |w: usize| -> WKey {
        let pos = s
            .queue
            .iter()
            .position(|&m| m as usize == w)
            .map_or(255, |i| i as u8);
        let holder = s.lock.is_some_and(|l| l.holder as usize == w);
        let mut wf = 0u8;
        for f in 0..2 {
            if matches!(s.watchers[f], Some((_, m)) if m as usize == w) {
                wf |= 1 << f;
            }
        }
        // which of its process's messages and stalled calls name it (by position)
        let p = w / wpp;
        let mut msgs = 0u16;
        for (i, m) in s.chans[p].iter().enumerate() {
            if matches!(m, Msg::Grant { to, .. } | Msg::Watch { to, .. } if *to as usize == w) {
                msgs |= 1 << i;
            }
        }
        let mut calls = 0u16;
        for (i, c) in s.late[p].iter().enumerate() {
            let cw = match *c {
                Call::Acquire { w, .. }
                | Call::Extend { w, .. }
                | Call::Release { w }
                | Call::Leave { w, .. }
                | Call::Renew { w, .. } => w,
            };
            if cw as usize == w {
                calls |= 1 << i;
            }
        }
        (s.ws[w], pos, holder, wf, msgs, calls)
    };
    let mut keys: Fifo<(PKey, usize, Fifo<u8, MAXW>), MAXP> = Fifo::default();
    for p in 0..np {
        let mut idx: Fifo<u8, MAXW> = (0..wpp as u8).collect();
        idx.sort_by_cached_key(|&j| wkey(p * wpp + j as usize));
        let mut inv = [0u8; MAXW];
        for (nj, &oj) in idx.iter().enumerate() {
            inv[oj as usize] = nj as u8;
        }
        let local = |w: W| inv[w as usize % wpp];
        let chans = s.chans[p].iter().map(|&m| rename_msg(m, local)).collect();
        let late = s.late[p].iter().map(|&c| rename_call(c, local)).collect();
        let wk = idx.iter().map(|&j| wkey(p * wpp + j as usize)).collect();
        keys.push((
            (
                s.procs[p],
                s.fence_pending == Some(p as Pid),
                s.holder_hub == Some(p as Pid),
                wk,
                chans,
                late,
            ),
            p,
            idx,
        ));
    }
    keys.sort_unstable();
    let mut pmap = [0u8; MAXP];
    let mut wmap = [0u8; MAXW];
    for (np_new, (_, p, idx)) in keys.iter().enumerate() {
        pmap[*p] = np_new as u8;
        for (nj, &oj) in idx.iter().enumerate() {
            wmap[p * wpp + oj as usize] = (np_new * wpp + nj) as u8;
        }
    }
    let wm = |w: W| wmap[w as usize];
    let mut t = s.clone();
    for (w, &to) in wmap.iter().enumerate().take(s.ws.len()) {
        t.ws[to as usize] = s.ws[w];
    }
    for (p, &q) in pmap.iter().enumerate().take(np) {
        let q = q as usize;
        t.procs[q] = s.procs[p];
        t.chans[q] = s.chans[p].iter().map(|&m| rename_msg(m, wm)).collect();
        t.late[q] = s.late[p].iter().map(|&c| rename_call(c, wm)).collect();
    }
    if let Some(l) = t.lock.as_mut() {
        l.holder = wm(l.holder);
    }
    t.fence_pending = s.fence_pending.map(|p| pmap[p as usize]);
    t.holder_hub = s.holder_hub.map(|p| pmap[p as usize]);
    for m in t.queue.iter_mut() {
        *m = wm(*m);
    }
    for (_, m) in t.watchers.iter_mut().flatten() {
        *m = wm(*m);
    }
    t
}

// ---------------------------------------------------------------- narration

impl Queue {
    fn wn(&self, w: W) -> String {
        format!("w{w} (P{})", self.pw(w))
    }

    fn lock_words(&self, l: Option<Lock>) -> String {
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

    /// One step of a trace, in words: the action, then what it changed.
    pub fn describe(&self, s: &St, a: &Act) -> String {
        let Some(n) = self.next_state(s, *a) else {
            return format!("{a:?} (disabled)");
        };
        let mut o = format!("tick {}: ", s.now);
        let w_of = |a: &Act| match *a {
            Act::Start(w)
            | Act::Attempt(w)
            | Act::Wake(w)
            | Act::TimeOut(w)
            | Act::Release(w)
            | Act::BgConfirm(w)
            | Act::Extend(w, _)
            | Act::Refresh(w)
            | Act::Overstay(w) => Some(w),
            _ => None,
        };
        match *a {
            Act::Tick => {
                let _ = write!(o, "time passes to tick {}", n.now);
                if s.lock.is_some() && n.lock.is_none() {
                    o.push_str("; Redis expires the lock");
                }
            }
            Act::Start(w) => {
                let _ = write!(o, "{} starts acquire_wait", self.wn(w));
                if matches!(n.ws[w as usize], Ws::Holding { .. }) {
                    o.push_str(": its first (plain) attempt finds the lock free and takes it");
                } else if s.lock != n.lock || s.queue != n.queue {
                    o.push_str(": its plain attempt finds the lock free with waiters queued and serves them");
                } else {
                    o.push_str(" and registers on its process's grant channel");
                }
            }
            Act::Attempt(w) => {
                let _ = write!(
                    o,
                    "{} checks the lock (acquire with its queue member)",
                    self.wn(w)
                );
                if let Ws::Waiting(t) = n.ws[w as usize] {
                    if t.inflight.is_some() {
                        o.push_str(": the call waits on the stalled connection");
                    } else if s.queue != n.queue || s.lock != n.lock {
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
                    let _ = write!(
                        o,
                        " and reads a grant (fence {}, lease {} ticks from tick {}{})",
                        g.fence,
                        g.px,
                        g.at,
                        if g.px >= self.cfg.ttl {
                            ", a full grant"
                        } else {
                            ", a short grant"
                        }
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
            Act::Deliver(p) => {
                let m = s.chans[p as usize][0];
                match m {
                    Msg::Grant { to, fence, px, .. } => {
                        let _ = write!(o, "P{p}'s dispatcher receives the grant for {} (fence {fence}, lease {px})", self.wn(to));
                        if !matches!(s.ws[to as usize], Ws::Waiting(_)) {
                            o.push_str(
                                "; its waiter has gone: it gives the grant back (leave 'o')",
                            );
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
                        let _ = write!(o, "P{p}'s dispatcher learns that its waiters were dropped, and wakes them");
                    }
                }
            }
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
                    if k >= self.cfg.notice {
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
                let ttl = if long {
                    self.cfg.ttl_long
                } else {
                    self.cfg.ttl_short
                };
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
                let _ = write!(o, "Redis' clock steps back {} ticks", self.cfg.step);
            }
            Act::Replay(p) => {
                let c = s.late[p as usize].first().copied();
                match c {
                    Some(c) => {
                        let what = match c {
                            Call::Acquire { w, awaited, .. } => format!(
                                "{}'s queueing attempt{}",
                                self.wn(w),
                                if awaited {
                                    " (its caller still waits for the reply)"
                                } else {
                                    " (its caller gave up on it)"
                                }
                            ),
                            Call::Extend { w, awaited } => format!(
                                "{}'s extend (confirm){}",
                                self.wn(w),
                                if awaited {
                                    " (its caller still waits for the reply)"
                                } else {
                                    " (its caller gave up on it)"
                                }
                            ),
                            Call::Release { w } => format!("{}'s release", self.wn(w)),
                            Call::Renew { w, ttl, awaited } => format!(
                                "{}'s extend to {ttl} ticks{}",
                                self.wn(w),
                                if awaited {
                                    " (its caller still waits for the reply)"
                                } else {
                                    " (its caller gave up on it)"
                                }
                            ),
                            Call::Leave {
                                w, flag: Flag::G, ..
                            } => format!("{}'s leave ('G')", self.wn(w)),
                            Call::Leave {
                                w,
                                flag: Flag::O(f),
                                ..
                            } => {
                                format!("the give-back ('o', fence {f}) of {}'s grant", self.wn(w))
                            }
                        };
                        let _ = write!(o, "Redis runs the stalled call: {what}");
                    }
                    None => {
                        let _ = write!(o, "P{p}'s client connection recovers");
                    }
                }
            }
        }
        // What changed, in Redis and for the waiter.
        let mut eff: Vec<String> = Vec::new();
        if s.lock != n.lock && !matches!(a, Act::Tick) {
            eff.push(format!("the lock is now {}", self.lock_words(n.lock)));
        }
        if n.fence != s.fence {
            eff.push(format!("fence {}", n.fence));
        }
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
                    match *m {
                        Msg::Grant { to, fence, px, at } => eff.push(format!(
                            "Redis publishes a grant to {} (fence {fence}, lease {px} ticks from tick {at})",
                            self.wn(to)
                        )),
                        Msg::Watch { to, px, .. } => {
                            eff.push(format!("Redis tells {} to watch (look in {px} ticks)", self.wn(to)))
                        }
                        Msg::Dropped => eff.push(format!("Redis tells P{p} that its waiters were dropped")),
                    }
                }
            }
        }
        let actor = w_of(a);
        let dropped: Vec<String> = s
            .queue
            .iter()
            .filter(|&&m| {
                !n.queue.contains(&m) && Some(m) != actor && n.lock.is_none_or(|l| l.holder != m)
            })
            .map(|&m| self.wn(m))
            .collect();
        if !dropped.is_empty() && !matches!(a, Act::Replay(_)) {
            eff.push(format!(
                "Redis drops {} from the queue (not listening or lapsed)",
                dropped.join(", ")
            ));
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
        for p in 0..self.np() {
            if n.procs[p].rec != s.procs[p].rec && n.procs[p].rec == Rec::Lapsed {
                eff.push(format!("Redis marks P{p} lapsed (its waiters are skipped)"));
            }
        }
        for w in 0..self.nw() {
            let (b, f) = (s.ws[w], n.ws[w]);
            if b == f {
                continue;
            }
            let who = self.wn(w as W);
            match f {
                Ws::Holding {
                    until, fence, bg, ..
                } if !matches!(b, Ws::Holding { .. }) => {
                    let mut note = String::new();
                    if matches!(a, Act::Wake(_)) && s.lock != n.lock {
                        note.push_str(" after confirming the grant (extend)");
                    }
                    if bg {
                        note.push_str(", to be confirmed in the background");
                    }
                    if fence != n.fence {
                        let _ = write!(note, ", although its hold's fence is {}", n.fence);
                    }
                    if fence <= s.top_fence {
                        let _ = write!(
                            note,
                            ", not above fence {} that an earlier guard returned",
                            s.top_fence
                        );
                    }
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
                Ws::Waiting(t) if Some(w as W) == w_of(a) => {
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
        for (w, v) in n.ws.iter().enumerate() {
            let Ws::Holding { until, .. } = *v else {
                continue;
            };
            if n.now < until && s.ws[w] != *v {
                let others: Vec<String> = (0..self.nw())
                    .filter(|&x| x != w && self.valid(&n, x))
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
        if a == &Act::Tick && self.valid_holders(&n) >= 2 {
            let hs: Vec<String> = (0..self.nw())
                .filter(|&x| self.valid(&n, x))
                .map(|x| self.wn(x as W))
                .collect();
            eff.push(format!("{} hold valid guards at once", hs.join(" and ")));
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

    /// Where a trace ends: each waiter, the lock, the queue, the ghosts.
    pub fn summary(&self, s: &St) -> String {
        let mut o = format!("at tick {}: the lock is {}", s.now, self.lock_words(s.lock));
        let q: Vec<String> = s.queue.iter().map(|&w| format!("w{w}")).collect();
        let _ = write!(o, "; queue [{}]", q.join(", "));
        for w in 0..self.nw() {
            let who = self.wn(w as W);
            let p = self.pw(w as W);
            let what = match s.ws[w] {
                Ws::Idle => "has not started".to_string(),
                Ws::Done => continue,
                Ws::Holding { until, fence, .. } => {
                    format!("holds a guard (fence {fence}) valid until tick {until}")
                }
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
            let _ = write!(o, "; {who} {what}");
        }
        let _ = write!(
            o,
            "; idle ticks since the last acquisition: {}, bound for the incidents since: {}",
            s.idle, s.allowance
        );
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
