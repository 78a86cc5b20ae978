//! The system both models check: processes with waiters (one `acquire_wait` each) and their
//! faults, on one key in Redis. `System<K>` is the model; `K: Key` is the key's Redis side (the
//! lock's in `lock.rs`, the permits' in `permits.rs`); everything else is shared: the waiter
//! (`waiter.rs`), the processes, their faults and time (`process.rs`), the functions of
//! `queue.lua` (`queue.rs`), symmetry (`canon.rs`) and narration (`narrate.rs`).

use crate::fifo::Fifo;
use stateright::Property;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// A waiter (one `acquire_wait`, one token, one queue member).
pub type W = u8;
/// A process (one hub: a subscriber connection, a client, waiters).
pub type Pid = u8;

/// Capacities: processes, waiters, messages in flight per connection, stalled calls.
pub const MAXP: usize = 3;
pub const MAXW: usize = 6;
pub const MAXM: usize = 14;
pub const MAXC: usize = 12;

/// A watch message's receiver had no anchor: it looks `px` after reading it.
pub const NO_BOUND: u8 = 255;

pub const CALM_FREEZE: u8 = 1;
pub const CALM_KILL: u8 = 2;
pub const CALM_DROP: u8 = 4;
pub const CALM_STALL: u8 = 8;
pub const CALM_RELEASE: u8 = 16;
/// Resume, re-made subscriber connection, the start of a stalled connection's replay.
pub const CALM_RECOVER: u8 = 32;
/// A calm release, kill or subscriber drop may still interleave with its own process's urgent
/// steps (its messages in flight, its waiters' reactions), not with other processes'.
pub const CALM_OWN: u8 = 64;

/// The budgets (`State::budget`).
pub const LOSS: usize = 0;
pub const FREEZE: usize = 1;
pub const DROP: usize = 2;
pub const KILL: usize = 3;
pub const STALL: usize = 4;
pub const EXTEND: usize = 5;
pub const REFRESH: usize = 6;
pub const CARELESS: usize = 7;
pub const STEP: usize = 8;

/// The shared machinery's parameters: the processes and their waiters, the times, the faults'
/// budgets (each at most this many in a run), Redis' clock and the retention. Times are in
/// ticks.
#[derive(Clone, Debug)]
pub struct World {
    pub procs: u8,
    /// Waiters per process.
    pub wpp: u8,
    /// Every waiter's TTL (the PX of a free acquisition, a full grant, a confirm).
    pub ttl: u8,
    /// A process is fresh when Redis saw it call within this many ticks (`now - seen <= presence`).
    pub presence: u8,
    /// A record younger than this many ticks that a call read is not written again by that
    /// call (`seen`; the Lua: a quarter of the presence window, so 0 here unless a run sets a
    /// wider window).
    pub young: u8,
    /// Each wait's deadline, from its start.
    pub wait: u8,
    /// The clock stops here.
    pub horizon: u8,
    /// A freeze of at least this many ticks is noticed on resume (the housekeeper's "1 s late").
    pub notice: u8,
    /// The command timeout (a call's time limit; an attempt's is also cut by the deadline).
    pub cmd: u8,
    /// Fault budgets: a message lost, a process frozen, a subscriber connection dropped, a
    /// process killed, a client connection stalled.
    pub losses: u8,
    pub freezes: u8,
    pub drops: u8,
    pub kills: u8,
    pub stalls: u8,
    /// Holders' own calls: an `extend` with another TTL (`ttl_short` or `ttl_long`), a
    /// keep-alive refresh with the holder's TTL, a careless holder that does not release
    /// before its lease ends (no fault: it overstays, then releases late or never).
    pub extends: u8,
    pub refreshes: u8,
    pub careless: u8,
    /// Backward steps of Redis' clock (each by `step` ticks).
    pub steps: u8,
    pub step: u8,
    /// The TTLs a holder's `extend` may set.
    pub ttl_short: u8,
    pub ttl_long: u8,
    /// The retention (`LockerBuilder::retention`): the queue, the processes hash (and the
    /// key's own keys that have one) expire; `None`: they outlive every hold.
    pub retain: Option<u8>,
    /// Steps offered only between cascades (when no urgent step is pending): CALM_* bits.
    pub calm: u8,
}

impl Default for World {
    fn default() -> World {
        World {
            procs: 3,
            wpp: 2,
            ttl: 4,
            presence: 1,
            young: 0,
            wait: 6,
            horizon: 8,
            notice: 3,
            cmd: 2,
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
            calm: CALM_RELEASE | CALM_OWN | CALM_FREEZE | CALM_STALL | CALM_RECOVER,
        }
    }
}

/// How a watch message's time reaches the waiter (`Rules::watch_msg`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchMsg {
    /// `w3 <px> <time>`: look `px` after reading it, or at `by` (the message's Redis time
    /// carried over from the anchor, plus px) if that is earlier; `by` is computed when the
    /// message is published and forgotten once it has passed (`Msg::Watch`).
    Bound,
    /// `w3` where every call runs in the tick it is sent: the time to look at, kept as the
    /// ticks left (`px` counts down as time passes; `by` unused).
    Countdown,
    /// `w2 <px>`: look `px` after reading it (`by` unused).
    Delay,
}

/// The shared machinery's behaviours that a key's configuration chooses (`Key::rules`): how
/// the state encodes some times (each model's own encoding, kept so that its state counts
/// stay what they are), the ghosts it keeps, and behaviours of the waiter taken back to
/// before a fix or brought back as a bug switch.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    pub watch_msg: WatchMsg,
    /// Times set in the past read 0 at once (a watch time, not only when time passes), and a
    /// guard's validity reads 0 once it has passed (the permits model's encoding).
    pub clamp: bool,
    /// A queueing attempt drops the watch messages published before it ran (they are stale:
    /// the code ignores them when it reads them); false: they stay and are read.
    pub drop_stale_watch: bool,
    /// Ghost of (d): a resumed process is marked thawed.
    pub thaw: bool,
    /// Finding 1's bug: a short grant is used at once, confirmed in the background.
    pub bg_confirm: bool,
    /// Finding 2's bug: the waiter assumes this claim window, not the grant's PX.
    pub own_claim: Option<u8>,
    /// A grant's time is kept while `at + grant_keep > now` (1: while it can be used at once).
    pub grant_keep: u8,
    /// F3 reverted: a confirm keeps the fence in hand, not extend's.
    pub fence_in_hand: bool,
    /// F4 reverted: a hub wake-up that finds a watch message is taken as that message.
    pub absorb_hub_wake: bool,
    /// F6 reverted: a confirm's (and `full_lease`'s extend's) limit is the command timeout.
    pub cmd_limit: bool,
    /// R1 reverted: a guard keeps the larger of its deadlines.
    pub max_lease: bool,
    /// queue.lua's `keep()` (R3 reverted: not called).
    pub keep: bool,
    /// R4 reverted: a record in Redis' future counts as fresh.
    pub future_fresh: bool,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            watch_msg: WatchMsg::Bound,
            clamp: false,
            drop_stale_watch: true,
            thaw: true,
            bg_confirm: false,
            own_claim: None,
            grant_keep: 1,
            fence_in_hand: false,
            absorb_hub_wake: false,
            cmd_limit: false,
            max_lease: false,
            keep: true,
            future_fresh: false,
        }
    }
}

/// What happened that the key's idle bound may charge for (`Key::incident`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incident {
    /// Process `p` is killed (before its waiters end).
    Kill(usize),
    /// Process `p`'s subscriber connection drops.
    SubDrop(usize),
    /// Waiter `w`, a holder, overstays.
    Overstay(usize),
    /// Waiter `w`'s call waits on its stalled connection.
    StalledCall(usize),
    /// Holder `w`'s lease-setting call waits on its stalled connection; its guard's validity
    /// is now `until`.
    StalledRenew(usize, u8),
    /// Redis' clock stepped back.
    StepBack,
    /// A timed-out attempt ran later and took the key for a waiter that does not know.
    LateAcquire,
}

/// Where a key's effects go in the words of a step (`Key::effects`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// First: the key's own state.
    Redis,
    /// After the messages published, before the queue.
    Queue,
    /// After the watchers.
    Records,
    /// Last: the properties.
    End,
}

/// A key's Redis side: its state (the keys the scripts keep besides the queue and the
/// processes hash, and its properties' ghosts), its scripts, its properties, its part of the
/// canonical form and of the words.
pub trait Key: Clone + Debug + Hash + Eq + Send + Sync + Sized + 'static {
    /// The configuration the tests build (it holds the `World`).
    type Cfg: Clone + Debug + Send + Sync;
    /// What a waiter's canonical key adds (its hold).
    type WKey: Copy + Ord + Default + Debug;
    /// What a process's canonical key adds.
    type PKey: Copy + Ord + Default + Debug;
    /// The waiters of one process are interchangeable (the canonical form sorts them).
    const ALIKE: bool;

    fn world(cfg: &Self::Cfg) -> &World;
    fn rules(cfg: &Self::Cfg) -> Rules;
    fn init(cfg: &Self::Cfg) -> Self;

    // The scripts, each one atomic step.
    fn acquire(m: &System<Self>, s: &mut State<Self>, w: W, member: bool) -> Reply;
    fn release(m: &System<Self>, s: &mut State<Self>, w: W) -> Reply;
    fn extend(m: &System<Self>, s: &mut State<Self>, w: W, ttl: u8) -> Reply;
    fn leave(m: &System<Self>, s: &mut State<Self>, w: W, member: bool, flag: Flag) -> Reply;

    // Ghosts.
    /// `acquire_wait` returns a guard (before the waiter's state says so).
    fn guard(m: &System<Self>, s: &mut State<Self>, w: usize, fence: u8, until: u8, reference: u8);
    fn incident(_m: &System<Self>, _s: &mut State<Self>, _i: Incident) {}
    /// Before time passes.
    fn before_tick(m: &System<Self>, s: &mut State<Self>);
    /// Time has passed (`now` is the new tick): the key's keys expire.
    fn expire(m: &System<Self>, s: &mut State<Self>);
    /// After every step.
    fn settle(_m: &System<Self>, _s: &mut State<Self>) {}
    fn properties() -> Vec<Property<System<Self>>>;

    // Symmetry.
    fn each_fence(&mut self, f: &mut impl FnMut(&mut u8));
    fn wkey(s: &State<Self>, w: usize) -> Self::WKey;
    fn pkey(s: &State<Self>, p: usize) -> Self::PKey;
    fn rename(&mut self, wm: &impl Fn(W) -> W, pm: &impl Fn(Pid) -> Pid);

    // Words.
    fn wn(m: &System<Self>, w: W) -> String {
        format!("w{w} (P{})", m.pw(w))
    }
    /// What a queueing attempt does, in words ("checks the lock (acquire with its queue member)").
    const ATTEMPT: &'static str;
    /// What follows "w starts acquire_wait" (its fast path took the key, served the queue, or
    /// it registers).
    fn start_words(m: &System<Self>, s: &State<Self>, n: &State<Self>, w: W) -> &'static str;
    fn tick_words(_m: &System<Self>, _s: &State<Self>, _n: &State<Self>) -> String {
        String::new()
    }
    fn effects(
        m: &System<Self>,
        s: &State<Self>,
        n: &State<Self>,
        a: &Act,
        at: Part,
        eff: &mut Vec<String>,
    );
    /// What follows "w returns a guard (fence f) valid until tick u".
    fn guard_note(
        _m: &System<Self>,
        _s: &State<Self>,
        _n: &State<Self>,
        _a: &Act,
        _w: usize,
    ) -> String {
        String::new()
    }
    fn summary_head(m: &System<Self>, s: &State<Self>) -> String;
    fn summary_tail(_m: &System<Self>, _s: &State<Self>) -> String {
        String::new()
    }
}

/// The model (Sync: the latches are atomics).
pub struct System<K: Key> {
    pub cfg: K::Cfg,
    pub rules: Rules,
    /// Report only the first violation of each property (shortest traces with 1-thread BFS).
    pub first_only: bool,
    pub latched: [AtomicBool; 10],
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
    /// Ghost: the process was frozen (its waiters may end late; `Rules::thaw`).
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
    /// `g2 <fence> <px> <grant time> <token>`; the grant time is Redis', forgotten (0) once the
    /// grant can no longer be used at once (`Rules::grant_keep`).
    Grant { to: W, fence: u8, px: u8, at: u8 },
    /// `w3 <px> <time> <token>`: look at the key px after Redis time `<time>`. The receiver
    /// looks `px` after reading it, or at `by` if that is earlier: `<time>` carried over to
    /// its clock from its anchor, plus px (`look_at`). The anchor cannot change while the
    /// message is in flight (a new queueing attempt drops the older messages: they are
    /// stale), so the model computes `by` when the message is published, and forgets it once
    /// it has passed (0: look at once). `NO_BOUND`: the receiver had no anchor. (`Rules::
    /// watch_msg`: or `px` counts down, or it is a delay, `w2`.)
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
    /// A holder's extend with this TTL: a refresh or a user's `extend`.
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

impl Call {
    /// The waiter that made the call.
    pub fn w(self) -> W {
        match self {
            Call::Acquire { w, .. }
            | Call::Extend { w, .. }
            | Call::Release { w }
            | Call::Leave { w, .. }
            | Call::Renew { w, .. } => w,
        }
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

/// A state: the key's Redis state, the queue and the processes hash (queue.lua's), the
/// processes, their waiters, messages and stalled calls, the budgets and the ghosts.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct State<K> {
    pub now: u8,
    // Redis
    /// The key's own keys (and its properties' ghosts).
    pub key: K,
    /// The queue, oldest first.
    pub queue: Fifo<W, MAXW>,
    /// '!w1', '!w2': (tick it looks, 0 = past; member).
    pub watchers: [Option<(u8, W)>; 2],
    /// '!h': the holder's process as Redis recorded it (the lock's scripts; kept when the lock
    /// expires or is released: it may name a former holder); deleted with the processes hash.
    pub holder_pid: Option<Pid>,
    /// How far Redis' clock stepped back (Redis time = `now - back`). Every time Redis keeps
    /// (expiries, records, watchers' times, grants' times) is a Redis time.
    pub back: u8,
    /// With a retention: when the queue and the processes hash expire (Redis time; 0: no
    /// expiry, or no key).
    pub q_exp: u8,
    pub p_exp: u8,
    /// '!e': until when (Redis time) the last `keep` that moved them made the queue and the
    /// processes hash live (0: no field); deleted with the processes hash.
    pub e_hint: u8,
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
    /// The key's idle ghost (see its properties).
    pub idle: u8,
    /// The key's sticky ghost flags.
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

impl Act {
    /// The waiter that takes the step.
    pub fn waiter(&self) -> Option<W> {
        match *self {
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
        }
    }
}

/// The scripts' replies.
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

/// A process as queue.lua's `process(pid)` sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Gone,
    Stale,
    Fresh,
}

/// `at`, or 0 once it has passed.
pub fn clamp(now: u8, at: u8) -> u8 {
    if at <= now {
        0
    } else {
        at
    }
}

impl<K: Key> System<K> {
    pub fn new(cfg: K::Cfg) -> Self {
        System {
            rules: K::rules(&cfg),
            cfg,
            first_only: false,
            latched: Default::default(),
        }
    }

    pub fn world(&self) -> &World {
        K::world(&self.cfg)
    }

    /// A property's result, or with `first_only` its first violation only.
    pub fn latch(&self, i: usize, ok: bool) -> bool {
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

    pub fn nw(&self) -> usize {
        let c = self.world();
        (c.procs * c.wpp) as usize
    }
    pub fn np(&self) -> usize {
        self.world().procs as usize
    }
    /// The process of waiter `w`.
    pub fn pw(&self, w: W) -> usize {
        (w / self.world().wpp) as usize
    }
    pub fn waiters(&self, p: usize) -> std::ops::Range<usize> {
        let wpp = self.world().wpp as usize;
        p * wpp..(p + 1) * wpp
    }
    pub fn running(&self, s: &State<K>, p: usize) -> bool {
        s.procs[p].run == Run::Running
    }
    pub fn registered(&self, s: &State<K>, p: usize) -> bool {
        self.waiters(p).any(|w| matches!(s.ws[w], Ws::Waiting(_)))
    }
    pub fn wt(s: &State<K>, w: usize) -> Wt {
        match s.ws[w] {
            Ws::Waiting(t) => t,
            other => panic!("waiter {w} is not waiting: {other:?}"),
        }
    }
    /// Waiter `w` holds a guard that reads valid.
    pub fn valid(&self, s: &State<K>, w: usize) -> bool {
        matches!(s.ws[w], Ws::Holding { until, .. } if s.now < until)
    }
    /// Redis' clock (it may have stepped back: `back`).
    pub fn rnow(&self, s: &State<K>) -> u8 {
        s.now - s.back
    }
    /// A time the waiter sets: `at`, or with `Rules::clamp` 0 if it has passed.
    pub fn due(&self, s: &State<K>, at: u8) -> u8 {
        if self.rules.clamp {
            clamp(s.now, at)
        } else {
            at
        }
    }
}
