//! The lock's scripts driven directly, one state transition per row, against a private
//! `redis-server` (the harness, shared with the permits' table, is `tests/common/scripts.rs`):
//! each row sets the lock's Redis keys up by hand, runs one script with the arguments the
//! library sends, and checks the reply, the keys afterwards and the messages published on the
//! grant channels. The formats are those of `src/redis/protocol.rs` and the headers of
//! `src/redis/lua/queue.lua` and `lock.lua`.

mod common;

use common::scripts::{args, run, run_rows, Args, Check, Kind, Row, DEAD, LIVE, LIVE2};
use common::{fence_key, lock_key, procs_key, queue_key, RedisServer};
use waitlock::fred::prelude::*;
use waitlock::scripts;

// The names of the lock on key "k", as constants for the tables below (checked against the
// shared helpers by `the_table_names_are_the_librarys`).
const L: &str = "{waitlock:k}";
const F: &str = "{waitlock:k}:fence";
const Q: &str = "{waitlock:k}:q";
const P: &str = "{waitlock:k}:p";

const LOCK: Kind = Kind {
    main: L,
    state: F,
    queue: Q,
    procs: P,
    fences: None,
    extra: &[],
};

const M_LIVE: &str = "aaaaaaaaaaaa 20000 w1";
const M_LIVE_B: &str = "aaaaaaaaaaaa 20000 w2";
const M_LIVE2: &str = "bbbbbbbbbbbb 30000 x1";
const M_DEAD: &str = "dddddddddddd 20000 z1";

/// A held lock with two waiters of two processes, both watching, and LIVE's record a second
/// old: a queueing attempt of LIVE changes neither watcher.
const YOUNG_RECORD: &[&str] = &[
    "SET {L} qH PX 5000",
    "SET {F} 100_q PX 60000",
    "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
    "ZADD {Q} 2 eeeeeeeeeeee_30000_y1",
    "HSET {P} aaaaaaaaaaaa {young} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_eeeeeeeeeeee_30000_y1 !h cccccccccccc !e {far}",
    "PEXPIRE {Q} 5000000",
    "PEXPIRE {P} 5000000",
];

fn rows() -> Vec<Row> {
    use Check::*;
    vec![
        Row {
            name: "acquire a free key, nobody queued: p, a fence, 4 commands",
            setup: &[],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[0, 10000, _]",
            checks: &[
                Get(L, Some("pT")),
                Pttl(9_900, 10_000),
                Queue(&[]),
                Commands(4),
            ],
        },
        Row {
            name: "acquire by the holder: held by the caller",
            setup: &["SET {L} pT PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[1, _, _]",
            checks: &[Get(L, Some("pT")), Pttl(4_000, 5_000)],
        },
        Row {
            name: "acquire a held key without queueing: held, nothing changes",
            setup: &["SET {L} pH PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, _, 0]",
            checks: &[Get(L, Some("pH")), Queue(&[])],
        },
        Row {
            name: "acquire a key held with waiters queued, without queueing: held, behind the queue",
            setup: &["SET {L} qH PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, _, 0, 1]",
            checks: &[Get(L, Some("qH")), Queue(&[])],
        },
        Row {
            name: "acquire a held key with a member: queued, p becomes q, the process recorded",
            setup: &["SET {L} pH PX 5000", "SET {F} 100 PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[
                Get(L, Some("qH")),
                Queue(&[M_LIVE]),
                Get(F, Some("100 q")),
                Process(LIVE, Some("now")),
            ],
        },
        Row {
            name: "queue of a process nobody listens for: queued, listening 0",
            setup: &["SET {L} qH PX 5000", "SET {F} 100_q PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_DEAD,
                pid: DEAD,
                ..args("z1")
            },
            reply: "[2, _, 1, 0, 100, 1, _, _]",
            checks: &[Queue(&[M_DEAD])],
        },
        Row {
            name: "release by the holder, nobody queued: deleted (3 commands)",
            setup: &["SET {L} pT PX 5000"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[1]",
            checks: &[Get(L, None), Commands(3)],
        },
        Row {
            name: "release by another token: not held, nothing changes",
            setup: &["SET {L} qH PX 5000"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[Get(L, Some("qH"))],
        },
        Row {
            name: "release to a fresh process: its full TTL, state q, the grant and a watch",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Pttl(19_900, 20_000),
                Queue(&[M_LIVE2]),
                FenceNow(" q"),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 20000 "]),
            ],
        },
        Row {
            name: "a busy queue keeps its watchers: a grant sends no watch message",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 3 aaaaaaaaaaaa_20000_w2",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} !w1 {soon}_bbbbbbbbbbbb_30000_x1",
                "HSET {P} !w2 {soon}_aaaaaaaaaaaa_20000_w2",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[Get(L, Some("hw1")), Messages(&["aaaaaaaaaaaa: g2 "])],
        },
        Row {
            name: "a watcher that would look after a shorter lease ends is told again",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {old}",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} !w1 {soon}_bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 500 "]),
            ],
        },
        Row {
            name: "release to a stale process: a short grant (g, the claim window), pending in the fence",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {old}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Pttl(400, 500),
                FenceNow(" q aaaaaaaaaaaa"),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 500 "]),
            ],
        },
        Row {
            name: "release skips a dead process's waiters (dropped) and grants the live one",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
                "ZADD {Q} 2 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[Get(L, Some("hw1")), Queue(&[]), Messages(&["aaaaaaaaaaaa: g2 "])],
        },
        Row {
            name: "release with only dead waiters: deleted, hints and process records gone",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
                "HSET {P} dddddddddddd {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[1]",
            checks: &[
                Get(L, None),
                Queue(&[]),
                Get(F, Some("100")),
                Process(DEAD, None),
            ],
        },
        Row {
            name: "release behind more than 200 dead waiters: continue, the lock stays the caller's",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "{queue:250}",
                "HSET {P} !e {far}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[4]",
            checks: &[
                Get(L, Some("qH")),
                Pttl(400, 500),
                Get(F, Some("100 q")),
                // (a `keep` that did not read the expiry hint sets the life exactly: the hint
                // it may have cut goes)
                Ttl(Q, 3_600_000, 3_600_500),
                HGet(P, "!e", None),
            ],
        },
        Row {
            name: "acquire a free key whose queue holds a fresh waiter: granted to it, not taken",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, 20000, 0, 1]",
            checks: &[Get(L, Some("hw1")), Messages(&["aaaaaaaaaaaa: g2 "])],
        },
        Row {
            name: "acquire by the queue's head itself: taken, out of the queue, the watchers chosen again",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[0, 20000, _]",
            checks: &[
                Get(L, Some("qw1")),
                Queue(&[M_LIVE2]),
                Messages(&["bbbbbbbbbbbb: w3 20000 "]),
                Watcher("!w1", Some(M_LIVE2)),
            ],
        },
        Row {
            name: "a short grant lapsed: its process is marked x, its waiters skipped and told (d2)",
            setup: &[
                "SET {F} 100_q_aaaaaaaaaaaa PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w2",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, 30000, 0, 1]",
            checks: &[
                Get(L, Some("hx1")),
                Queue(&[]),
                Process(LIVE, Some("x")),
                Process("!h", Some(LIVE2)),
                Messages(&["aaaaaaaaaaaa: d2", "bbbbbbbbbbbb: g2 "]),
            ],
        },
        Row {
            name: "a lapsed process that calls again is seen again",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "HSET {P} aaaaaaaaaaaa x",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE_B,
                pid: LIVE,
                ..args("w2")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[Process(LIVE, Some("now")), Queue(&[M_LIVE_B])],
        },
        Row {
            name: "acquire by the holder of a short grant (its message was lost): confirmed",
            setup: &["SET {L} gw1 PX 500", "SET {F} 100_q_aaaaaaaaaaaa PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[3, 20000, 100]",
            checks: &[Get(L, Some("qw1")), Pttl(19_900, 20_000), Get(F, Some("100 q"))],
        },
        Row {
            name: "extend a short grant: confirmed, the fence of the hold",
            setup: &["SET {L} gw1 PX 500", "SET {F} 100_q_aaaaaaaaaaaa PX 60000"],
            script: scripts::EXTEND,
            call: Args {
                pid: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[3, 100]",
            checks: &[Get(L, Some("qw1")), Pttl(19_900, 20_000), Get(F, Some("100 q"))],
        },
        Row {
            name: "a refresh tells the lock's watchers when the lease now ends (no calls from them)",
            setup: &[
                "SET {L} qT PX 500",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} !w1 {soon}_bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, 100]",
            checks: &[
                Pttl(9_900, 10_000),
                Messages(&["bbbbbbbbbbbb: w3 10000 "]),
            ],
        },
        Row {
            name: "extend a confirmed hold: the TTL again, and the fence of the hold",
            setup: &["SET {L} pT PX 500", "SET {F} 100 PX 500"],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, 100]",
            checks: &[Get(L, Some("pT")), Pttl(9_900, 10_000), FencePttl(3_609_000, 3_610_000)],
        },
        Row {
            name: "extend by another token: not held",
            setup: &["SET {L} pH PX 500"],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[0]",
            checks: &[Pttl(1, 500)],
        },
        Row {
            name: "extend with the fence key gone: a fence from Redis' clock, never 0",
            setup: &["SET {L} gw1 PX 500"],
            script: scripts::EXTEND,
            call: args("w1"),
            reply: "[3, _]",
            checks: &[FenceNow(""), Get(L, Some("qw1"))],
        },
        Row {
            name: "leave G: out of the queue, the grant given back (handed on)",
            setup: &[
                "SET {L} qw1 PX 20000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::LEAVE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                flag: "G",
                ..args("w1")
            },
            reply: "[2]",
            checks: &[Get(L, Some("hx1")), Messages(&["bbbbbbbbbbbb: g2 "])],
        },
        Row {
            name: "leave o with another fence: a newer grant to the same token is kept",
            setup: &["SET {L} hw1 PX 20000", "SET {F} 200_q PX 60000"],
            script: scripts::LEAVE,
            call: Args {
                flag: "o",
                fence: "100",
                ..args("w1")
            },
            reply: "[0]",
            checks: &[Get(L, Some("hw1"))],
        },
        Row {
            name: "leave o of a grant its waiter claimed by its own call: kept",
            setup: &["SET {L} qw1 PX 20000", "SET {F} 100_q PX 60000"],
            script: scripts::LEAVE,
            call: Args {
                flag: "o",
                fence: "100",
                ..args("w1")
            },
            reply: "[0]",
            checks: &[Get(L, Some("qw1"))],
        },
        Row {
            name: "acquire by the holder of an unclaimed full grant (its message lost): claimed",
            setup: &["SET {L} hw1 PX 20000", "SET {F} 100_q PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[1, _, 100]",
            checks: &[Get(L, Some("qw1")), Pttl(19_000, 20_000)],
        },
        Row {
            name: "leave o with the grant's fence: given back",
            setup: &["SET {L} hw1 PX 20000", "SET {F} 100_q PX 60000"],
            script: scripts::LEAVE,
            call: Args {
                flag: "o",
                fence: "100",
                ..args("w1")
            },
            reply: "[2]",
            checks: &[Get(L, None), Get(F, Some("100"))],
        },
        Row {
            name: "a waiter leaves: the lock keeps two watchers (one appointed and told)",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::LEAVE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                flag: "G",
                ..args("w1")
            },
            reply: "[0]",
            checks: &[Queue(&[M_LIVE2]), Messages(&["bbbbbbbbbbbb: w3 "])],
        },
        Row {
            name: "a lapsed process nobody listens for is not told",
            setup: &[
                "SET {F} 100_q_dddddddddddd PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} dddddddddddd {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, 30000, 0, 1]",
            checks: &[Process(DEAD, Some("x")), Messages(&["bbbbbbbbbbbb: g2 "])],
        },
        Row {
            name: "watchers stay in two processes: a second waiter of the watcher's process is not one",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} !w1 {soon}_aaaaaaaaaaaa_20000_w1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE_B,
                pid: LIVE,
                ..args("w2")
            },
            reply: "[2, _, 1, 1, 100, 0, _, _]",
            checks: &[Watcher("!w2", None), Queue(&[M_LIVE, M_LIVE_B])],
        },
        Row {
            name: "a waiter of another process takes the free watcher field",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} !w1 {soon}_aaaaaaaaaaaa_20000_w1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE2,
                pid: LIVE2,
                ..args("x1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[Watcher("!w2", Some(M_LIVE2))],
        },
        Row {
            name: "a newcomer replaces a watcher of the holder's process (it would fail with it)",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 dddddddddddd_20000_z1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} dddddddddddd {now}",
                "HSET {P} !h aaaaaaaaaaaa",
                "HSET {P} !w1 {soon}_aaaaaaaaaaaa_20000_w1",
                "HSET {P} !w2 {soon}_dddddddddddd_20000_z1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE2,
                pid: LIVE2,
                ..args("x1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_DEAD)),
            ],
        },
        Row {
            name: "the first waiter behind a lock taken free records the holder's process from its token",
            setup: &["SET {L} pdddddddddddd/T PX 5000", "SET {F} 100 PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 1]",
            checks: &[
                Get(L, Some("qdddddddddddd/T")),
                Process("!h", Some(DEAD)),
                Watcher("!w1", Some(M_LIVE)),
            ],
        },
        Row {
            name: "a lock taken free by a token without a process: the holder stays unknown",
            setup: &["SET {L} pT PX 5000", "SET {F} 100 PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 1]",
            checks: &[Process("!h", None)],
        },
        Row {
            name: "a refresh takes watchers outside the holder's process first, then from it",
            setup: &[
                "SET {L} qT PX 500",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::EXTEND,
            call: Args {
                pid: LIVE,
                ..args("T")
            },
            reply: "[1, 100]",
            checks: &[
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE)),
                Messages(&["bbbbbbbbbbbb: w3 10000 ", "aaaaaaaaaaaa: w3 10000 "]),
            ],
        },
        Row {
            name: "a queued attempt that takes a free lock records its process as the holder's",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[0, 10000, _]",
            checks: &[
                Get(L, Some("qw1")),
                Queue(&[M_LIVE2]),
                Process("!h", Some(LIVE)),
            ],
        },
        Row {
            name: "a release after the lease ran out, waiters queued: served anyway, not held",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[
                Get(L, Some("hw1")),
                Queue(&[]),
                Messages(&["aaaaaaaaaaaa: g2 "]),
            ],
        },
        Row {
            name: "a release after the lease ran out, only dead waiters: all cleared, not held",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
            ],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[Get(L, None), Queue(&[]), Get(F, Some("100"))],
        },
        Row {
            name: "a release after the lease ran out behind 200 dead waiters: continue, not held",
            setup: &["SET {F} 100_q PX 60000", "{queue:201}"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0, 4]",
            checks: &[Get(L, Some("qT")), Pttl(1, 500)],
        },
        Row {
            name: "a release onto a free lock nobody waits for: not held, nothing changes",
            setup: &["SET {F} 100 PX 60000"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[Get(L, None), Get(F, Some("100"))],
        },
        // Found by the widened model (R5): with one other process waiting, the second watcher
        // comes from the holder's own process (a holder that overstays without a fault, and
        // the other process frozen, left its own process's waiters asleep).
        Row {
            name: "a grant with one other process waiting: the second watcher from the holder's process",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 3 aaaaaaaaaaaa_20000_w2",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE_B)),
                Messages(&[
                    "aaaaaaaaaaaa: g2 ",
                    "bbbbbbbbbbbb: w3 20000 ",
                    "aaaaaaaaaaaa: w3 20000 ",
                ]),
            ],
        },
        // Issue 36: new watchers are read from the back of the queue in two reads (the last 4
        // members, then the 12 before them, only when the first do not do): the choice is the
        // one a single read of the last 16 made. Here the walk read the whole queue (its first
        // read of 8 found its end), so both come from that read: no ZRANGE, no ZMSCORE. The
        // next row takes both reads from Redis.
        Row {
            name: "new watchers: the back 4 all of the new holder's process, the next from the read before them",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 3 aaaaaaaaaaaa_20000_w2",
                "ZADD {Q} 4 aaaaaaaaaaaa_20000_w3",
                "ZADD {Q} 5 aaaaaaaaaaaa_20000_w4",
                "ZADD {Q} 6 aaaaaaaaaaaa_20000_w5",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some("aaaaaaaaaaaa 20000 w5")),
                Messages(&[
                    "aaaaaaaaaaaa: g2 ",
                    "bbbbbbbbbbbb: w3 20000 ",
                    "aaaaaaaaaaaa: w3 20000 ",
                ]),
                // (two fewer than with the reads from Redis, the next row)
                Commands(16),
            ],
        },
        // The same, with a queue longer than the walk's first read (three departed waiters at
        // the head, dropped): the walk did not read its end, so the watchers' choice reads the
        // back from Redis (and asks whether the current watchers are queued: ZMSCORE).
        Row {
            name: "new watchers from Redis: the back 4 all of the new holder's process, the next from the read before them",
            setup: &[
                "{queue:3}",
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 3 aaaaaaaaaaaa_20000_w2",
                "ZADD {Q} 4 aaaaaaaaaaaa_20000_w3",
                "ZADD {Q} 5 aaaaaaaaaaaa_20000_w4",
                "ZADD {Q} 6 aaaaaaaaaaaa_20000_w5",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some("aaaaaaaaaaaa 20000 w5")),
                Messages(&[
                    "aaaaaaaaaaaa: g2 ",
                    "bbbbbbbbbbbb: w3 20000 ",
                    "aaaaaaaaaaaa: w3 20000 ",
                ]),
                // (one ZRANGE more than a single read of 16 would take; the departed heads'
                // process, which nobody listens for sharded, is also asked PUBSUB NUMSUB)
                Commands(19),
            ],
        },
        // Review 2, finding 2: a waiter that took the free lock as the oldest live waiter
        // (serve's 'self') left a watcher field naming itself, the holder.
        Row {
            name: "a waiter taking the free lock as the oldest live waiter chooses the watchers again",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {old}",
                "HSET {P} !w1 {now}_aaaaaaaaaaaa_20000_w1",
                "HSET {P} !w2 {now}_bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[0, 10000, _]",
            checks: &[
                Get(L, Some("qw1")),
                Queue(&[M_LIVE2]),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", None),
                Process("!h", Some(LIVE)),
            ],
        },
        // Review 2, finding 3: the queue's TTL was set only when a new member was added.
        Row {
            name: "a waiter queueing again renews the queue and the processes hash",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "PEXPIRE {Q} 1000",
                "HSET {P} aaaaaaaaaaaa {old}",
                "PEXPIRE {P} 1000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, _, _, 1]",
            checks: &[
                Queue(&[M_LIVE]),
                // (the lease, the retention and a quarter of it: see `keep`)
                Ttl(Q, 4_504_000, 4_505_000),
                Ttl(P, 4_504_000, 4_505_000),
            ],
        },
        Row {
            name: "a refresh with waiters queued: queue, processes and fence live the lease and the retention",
            setup: &[
                "SET {L} qT PX 500",
                "SET {F} 100_q PX 500",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "PEXPIRE {Q} 500",
                "HSET {P} bbbbbbbbbbbb {now}",
                "PEXPIRE {P} 500",
            ],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, 100]",
            checks: &[
                Pttl(9_900, 10_000),
                Ttl(Q, 4_509_000, 4_510_000),
                Ttl(P, 4_509_000, 4_510_000),
                FencePttl(3_609_000, 3_610_000),
            ],
        },
        Row {
            name: "a grant with waiters left: the queue lives the grant's lease and the retention",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 500",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "PEXPIRE {Q} 1000",
                "HSET {P} aaaaaaaaaaaa {now}",
                "PEXPIRE {P} 1000",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Ttl(Q, 4_519_000, 4_520_000),
                Ttl(P, 4_519_000, 4_520_000),
                FencePttl(3_619_000, 3_620_000),
            ],
        },
        // Review 2, finding 4: a record in Redis' future counted as fresh.
        Row {
            name: "a process record in Redis' future is not fresh: a short grant",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {future}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Pttl(1, 500),
                Messages(&["aaaaaaaaaaaa: g2 "]),
            ],
        },
        // Review 2, section 7: FIFO under a backward step of Redis' clock.
        Row {
            name: "a newcomer queues behind a waiter whose score is in Redis' future",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 5000000000000000 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, _, _, 0]",
            checks: &[Queue(&[M_LIVE2, M_LIVE])],
        },
        // Review 2, section 7: fence 0 from `{1}` after the counter expired.
        Row {
            name: "acquire by the holder after its fence counter vanished: a fence from Redis' clock",
            setup: &["SET {L} qT PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[1, _, _]",
            checks: &[Get(L, Some("qT")), FenceNow(" q")],
        },
        Row {
            name: "extend after the fence counter vanished: a fence from Redis' clock",
            setup: &["SET {L} pT PX 500"],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, _]",
            checks: &[FenceNow(""), FencePttl(3_609_000, 3_610_000)],
        },
        // Review 2, section 7: the processes hash grew by one field per process that ever
        // called, on a key that never drains.
        Row {
            name: "a new process's record sweeps the records that say nothing",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} eeeeeeeeeeee {old}",
                "HSET {P} ffffffffffff {old}",
                "HSET {P} cccccccccccc {future}",
                "HSET {P} dddddddddddd x",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, _, _, 0]",
            checks: &[
                Process("eeeeeeeeeeee", None),
                Process("ffffffffffff", None),
                Process("cccccccccccc", None),
                Process(DEAD, None),
                Process(LIVE2, Some("now")),
                Process(LIVE, Some("now")),
            ],
        },
        // The first review's finding 14: a short grant as long as its waiter's TTL was used
        // without a confirmation, and its pending hint stayed.
        Row {
            name: "a short grant to a waiter whose TTL is within the claim window: half of it, so it confirms",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_400_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {old}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Pttl(1, 200),
                FenceNow(" q aaaaaaaaaaaa"),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 200 "]),
            ],
        },
        Row {
            name: "status: held by a short grant, its fence and queue",
            setup: &[
                "SET {L} gw1 PX 500",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::STATUS,
            call: args("-"),
            reply: "[2, _, 100, 1]",
            checks: &[],
        },
        // Issue 36: the commands Redis runs per path of a contended acquisition (the EVAL
        // included): one queueing attempt, one release that grants.
        Row {
            name: "commands: a queueing attempt behind a held lock, a watcher's field free",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !h cccccccccccc !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 0]",
            checks: &[
                Queue(&[M_LIVE2, M_LIVE]),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE)),
                Process(LIVE, Some("now")),
                Commands(10),
            ],
        },
        // The queue's length is counted (ZCARD) only for the queue-depth metric (FLAG 'd',
        // with the metrics feature), or when the caller was queued already.
        Row {
            name: "commands: the same attempt counting the queue for the metric (flag 'd')",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !h cccccccccccc !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                flag: "d",
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 2]",
            checks: &[
                Queue(&[M_LIVE2, M_LIVE]),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE)),
                Process(LIVE, Some("now")),
                Commands(11),
            ],
        },
        Row {
            name: "an attempt of a waiter queued already counts the queue (whether it is alone decides the queue's life)",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 2 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_aaaaaaaaaaaa_20000_w1 !h cccccccccccc !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 2]",
            checks: &[Queue(&[M_LIVE2, M_LIVE])],
        },
        Row {
            name: "commands: a release that grants to a fresh waiter, waiters and watchers kept",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 aaaaaaaaaaaa_20000_w2",
                "ZADD {Q} 3 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} cccccccccccc {old} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_aaaaaaaaaaaa_20000_w2 !h cccccccccccc !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::RELEASE,
            call: Args {
                pid: "cccccccccccc",
                ..args("H")
            },
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Queue(&[M_LIVE_B, M_LIVE2]),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE_B)),
                Process("!h", Some(LIVE)),
                Process("cccccccccccc", Some("now")),
                Messages(&["aaaaaaaaaaaa: g2 "]),
                // ('!e' says the queue and the hash live long enough: not moved)
                Ttl(Q, 4_990_000, 5_000_000),
                Ttl(P, 4_990_000, 5_000_000),
                // (the walk read the whole queue: whether the watchers are queued, and the
                // queue's back, come from that read, not from a ZMSCORE and a ZRANGE)
                Commands(11),
            ],
        },
        Row {
            name: "commands: the same release when the expiry hint is too near: both moved, '!e' too",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 aaaaaaaaaaaa_20000_w2",
                "ZADD {Q} 3 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} cccccccccccc {old} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_aaaaaaaaaaaa_20000_w2 !h cccccccccccc !e {future}",
                "PEXPIRE {Q} 600000",
                "PEXPIRE {P} 600000",
            ],
            script: scripts::RELEASE,
            call: Args {
                pid: "cccccccccccc",
                ..args("H")
            },
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Ttl(Q, 4_519_000, 4_520_000),
                Ttl(P, 4_519_000, 4_520_000),
                Commands(14),
            ],
        },
        Row {
            name: "a queue's first member gives it its life whatever the expiry hint says",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "HSET {P} aaaaaaaaaaaa {now} !e {far}",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 1]",
            checks: &[
                Queue(&[M_LIVE]),
                Ttl(Q, 4_504_000, 4_505_000),
                Ttl(P, 4_504_000, 4_505_000),
            ],
        },
        // Issue 36: a record the call read that is younger than a quarter of the presence
        // window is not written again (these rows: a window of a minute, the record a second
        // old).
        Row {
            name: "commands: a queueing attempt, its record young, the watchers kept: 9, no HSET",
            setup: YOUNG_RECORD,
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                presence: 60_000,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 0, _, 0]",
            checks: &[
                Queue(&["bbbbbbbbbbbb 30000 x1", "eeeeeeeeeeee 30000 y1", M_LIVE]),
                Process(LIVE, Some("{young}")),
                Commands(9),
            ],
        },
        Row {
            name: "a record older than a quarter of the presence window is written again",
            setup: YOUNG_RECORD,
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                presence: 3_000,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 0, _, 0]",
            checks: &[Process(LIVE, Some("now")), Commands(10)],
        },
        Row {
            name: "commands: a release that grants, its record young, '!h' and the watchers kept: 10, no HSET",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {young} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !h aaaaaaaaaaaa !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::RELEASE,
            call: Args {
                pid: LIVE,
                presence: 60_000,
                ..args("H")
            },
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Queue(&[M_LIVE2]),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", None),
                Process("!h", Some(LIVE)),
                Process(LIVE, Some("{young}")),
                Messages(&["aaaaaaaaaaaa: g2 "]),
                Commands(10),
            ],
        },
        Row {
            name: "commands: a release that grants, a watcher's process not among the heads: read after them",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x2",
                "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} cccccccccccc {old} eeeeeeeeeeee {now} !w1 {soon}_eeeeeeeeeeee_30000_y1 !h cccccccccccc !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::RELEASE,
            call: Args {
                pid: "cccccccccccc",
                ..args("H")
            },
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Queue(&["bbbbbbbbbbbb 30000 x2"]),
                Watcher("!w1", Some("bbbbbbbbbbbb 30000 x2")),
                Watcher("!w2", None),
                Process("!h", Some(LIVE)),
                Process("cccccccccccc", Some("now")),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 "]),
                // (the second HMGET: the departed watcher's process, and a PUBSUB NUMSUB for
                // it, as nobody listens for it sharded; its membership and the queue's back
                // from the walk's whole read)
                Commands(14),
            ],
        },
        Row {
            name: "a new process's record does not cut the processes hash's life",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !e {far}",
                "PEXPIRE {Q} 5000000",
                "PEXPIRE {P} 5000000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                pid: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 0]",
            checks: &[
                Process(LIVE, Some("now")),
                Ttl(P, 4_990_000, 5_000_000),
                Ttl(Q, 4_990_000, 5_000_000),
            ],
        },
    ]
}

#[tokio::test]
async fn every_transition_of_every_script() {
    run_rows(&LOCK, rows()).await;
}

/// A key of another type under the fence counter's name: the acquire fails with WRONGTYPE and
/// leaves no lock behind (the lock it had just set is deleted again).
#[tokio::test]
async fn a_foreign_fence_key_leaves_no_lock() {
    let server = RedisServer::start();
    let c = server.client().await;
    let _: Value = run(&c, vec!["RPUSH".into(), F.into(), "x".into()]).await;
    let argv: Vec<String> = ["T", "10000", "3600000", "500", "100", "", "", "", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let e = c
        .eval::<Vec<i64>, _, _, _>(scripts::ACQUIRE, vec![L, F, Q, P], argv)
        .await
        .expect_err("WRONGTYPE");
    assert!(e.details().contains("WRONGTYPE"), "{e}");
    let v: Option<String> = c.get(L).await.expect("GET");
    assert_eq!(v, None, "a lock was left behind");
}

#[test]
fn the_table_names_are_the_librarys() {
    assert_eq!(
        [L, F, Q, P].map(str::to_owned),
        [
            lock_key("k"),
            fence_key("k"),
            queue_key("k"),
            procs_key("k")
        ]
    );
}

/// The batched refresh (`lua/refresh.lua`), one lock per state in one call: a lock taken free
/// is refreshed (lock and fence counter), every other state is left untouched for `EXTEND`, a
/// lock of another token or none is "not held", a vanished fence counter is left for `EXTEND`
/// to restart.
#[tokio::test]
async fn the_batched_refresh_does_extends_fast_path_and_leaves_the_rest_alone() {
    let server = RedisServer::start();
    let c = server.client().await;
    // (key, lock value or none, fence counter or none) and the code expected.
    let rows: [(&str, Option<&str>, Option<&str>, i64); 7] = [
        ("free", Some("pT"), Some("7"), 1),
        ("queued", Some("qT"), Some("7 q"), 6),
        ("handed", Some("hT"), Some("7 q"), 6),
        ("granted", Some("gT"), Some("7 q aaaaaaaaaaaa"), 6),
        ("other", Some("pU"), Some("7"), 0),
        ("gone", None, Some("7"), 0),
        ("no-fence", Some("pT"), None, 6),
    ];
    let mut keys = Vec::new();
    let mut argv = vec!["3600000".to_owned()];
    for (key, lock, fence, _) in rows {
        let (l, f) = (lock_key(key), fence_key(key));
        if let Some(v) = lock {
            let _: () = c
                .set(&l, v, Some(Expiration::PX(1_000)), None, false)
                .await
                .expect("SET");
        }
        if let Some(v) = fence {
            let _: () = c
                .set(&f, v, Some(Expiration::PX(1_000)), None, false)
                .await
                .expect("SET");
        }
        keys.extend([l, f]);
        argv.extend(["T".to_owned(), "30000".to_owned()]);
    }
    let reply: Vec<i64> = c.eval(scripts::REFRESH, keys, argv).await.expect("REFRESH");
    assert_eq!(reply, rows.map(|r| r.3).to_vec());
    for (key, lock, fence, code) in rows {
        let lock_ttl: i64 = c.pttl(lock_key(key)).await.expect("PTTL");
        let fence_ttl: i64 = c.pttl(fence_key(key)).await.expect("PTTL");
        if code == 1 {
            assert!(
                (29_000..=30_000).contains(&lock_ttl),
                "{key}: lock PTTL {lock_ttl}"
            );
            assert!(fence_ttl > 3_600_000, "{key}: fence PTTL {fence_ttl}");
        } else {
            // Untouched: the PX set above, or absent.
            let expect = |present: bool, ttl: i64| {
                if present {
                    (0..=1_000).contains(&ttl)
                } else {
                    ttl == -2
                }
            };
            assert!(
                expect(lock.is_some(), lock_ttl),
                "{key}: lock PTTL {lock_ttl}"
            );
            assert!(
                expect(fence.is_some(), fence_ttl),
                "{key}: fence PTTL {fence_ttl}"
            );
        }
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        assert_eq!(v.as_deref(), lock, "{key}: the value is never changed");
    }
}

/// `take_set.lua`'s `KEYS` and `ARGV` for `keys`, all with token `T`, the retention an hour and
/// `ttl` ms (or `check`).
fn take_set_call(keys: &[&str], ttl: &str) -> (Vec<String>, Vec<String>) {
    let mut k = Vec::new();
    let mut argv = vec!["3600000".to_owned(), ttl.to_owned()];
    for key in keys {
        k.extend([lock_key(key), fence_key(key)]);
        argv.push("T".to_owned());
    }
    (k, argv)
}

/// Taking a set in one call (`lua/take_set.lua`): free locks are all taken (state 'p', the
/// TTL, fences above the last one and Redis' clock); one lock held, free with waiters queued,
/// or of another type stops the call with nothing written; sent again, the call finds its own
/// locks and answers their fences.
#[tokio::test]
async fn taking_a_set_is_all_or_none() {
    let server = RedisServer::start();
    let c = server.client().await;
    let set = ["s-a", "s-b", "s-c"];
    let call = |keys: &[&str]| take_set_call(keys, "30000");
    let huge = "9999999999999999";
    let _: () = c
        .set(fence_key("s-b"), huge, None, None, false)
        .await
        .expect("SET");
    let (k, a) = call(&set);
    let taken: Vec<i64> = c
        .eval(scripts::TAKE_SET, k.clone(), a.clone())
        .await
        .expect("take");
    assert_eq!(taken.len(), 4, "{taken:?}");
    assert_eq!(taken[0], 0);
    assert_eq!(taken[2], 9_999_999_999_999_999 + 1, "above the last fence");
    let now_us = {
        let t: Vec<String> = c
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .expect("TIME");
        t[0].parse::<i64>().expect("s") * 1_000_000
    };
    assert!(
        taken[1] > now_us - 10_000_000 && taken[3] > now_us - 10_000_000,
        "{taken:?}"
    );
    for key in set {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        assert_eq!(v.as_deref(), Some("pT"), "{key}");
        let ttl: i64 = c.pttl(lock_key(key)).await.expect("PTTL");
        assert!((29_000..=30_000).contains(&ttl), "{key}: {ttl}");
        let fttl: i64 = c.pttl(fence_key(key)).await.expect("PTTL");
        assert!(fttl > 3_600_000, "{key}: fence PTTL {fttl}");
    }
    // Sent again: its own locks, the same fences, nothing rewritten.
    let again: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("again");
    assert_eq!(again, taken);

    // One of them held by another: {2, i, pttl}, and nothing of the others written.
    let _: () = c
        .set(
            lock_key("t-b"),
            "pU",
            Some(Expiration::PX(5_000)),
            None,
            false,
        )
        .await
        .expect("SET");
    let (k, a) = call(&["t-a", "t-b", "t-c"]);
    let held: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("held");
    assert_eq!(held.len(), 3, "{held:?}");
    assert_eq!(&held[..2], &[2, 2]);
    assert!((4_000..=5_000).contains(&held[2]), "{held:?}");
    // Free, but its fence says waiters may be queued: {2, i, -3}.
    let _: () = c
        .set(fence_key("t-c"), "12 q", None, None, false)
        .await
        .expect("SET");
    let (k, a) = call(&["t-a", "t-c"]);
    let queued: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("queued");
    assert_eq!(queued, [2, 2, -3]);
    // A key of another type (a fence counter here): {7, i, 2}, nothing overwritten.
    let _: i64 = c.rpush(fence_key("t-d"), "x").await.expect("RPUSH");
    let (k, a) = call(&["t-a", "t-d"]);
    let wrong: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("wrong type");
    assert_eq!(wrong, [7, 2, 2]);
    let kind: String = c.r#type(fence_key("t-d")).await.expect("TYPE");
    assert_eq!(kind, "list");
    for key in ["t-a", "t-c", "t-d"] {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        assert_eq!(v, None, "{key}: nothing written");
    }
    let fa: Option<String> = c.get(fence_key("t-a")).await.expect("GET");
    assert_eq!(fa, None, "t-a's fence: nothing written");
}

/// A set's look (`take_set.lua` with ttl `check`) answers as a take would and writes nothing;
/// the batched give-back (`lua/give_back.lua`) deletes the locks its tokens took free and
/// leaves every other state, and other tokens' locks, untouched.
#[tokio::test]
async fn a_sets_look_writes_nothing_and_the_give_back_deletes_only_free_takes() {
    let server = RedisServer::start();
    let c = server.client().await;
    let look = |keys: &[&str]| take_set_call(keys, "check");
    let (k, a) = look(&["g-a", "g-b"]);
    let free: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("look");
    assert_eq!(free, [0]);
    for key in ["g-a", "g-b"] {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        let f: Option<String> = c.get(fence_key(key)).await.expect("GET");
        assert_eq!((v, f), (None, None), "{key}: a look writes nothing");
    }
    let _: () = c
        .set(
            lock_key("g-b"),
            "pU",
            Some(Expiration::PX(5_000)),
            None,
            false,
        )
        .await
        .expect("SET");
    let (k, a) = look(&["g-a", "g-b"]);
    let held: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("look");
    assert_eq!(&held[..2], &[2, 2], "{held:?}");

    // (key, lock value) and the code expected.
    let rows: [(&str, Option<&str>, i64); 5] = [
        ("b-free", Some("pT"), 1),
        ("b-queued", Some("qT"), 6),
        ("b-handed", Some("hT"), 6),
        ("b-other", Some("pU"), 0),
        ("b-gone", None, 0),
    ];
    let mut keys = Vec::new();
    for (key, lock, _) in rows {
        if let Some(v) = lock {
            let _: () = c
                .set(lock_key(key), v, Some(Expiration::PX(5_000)), None, false)
                .await
                .expect("SET");
        }
        keys.push(lock_key(key));
    }
    let argv = vec!["T".to_owned(); rows.len()];
    let reply: Vec<i64> = c
        .eval(scripts::GIVE_BACK, keys, argv)
        .await
        .expect("give back");
    assert_eq!(reply, rows.map(|r| r.2).to_vec());
    for (key, lock, code) in rows {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        if code == 1 {
            assert_eq!(v, None, "{key}: deleted");
        } else {
            assert_eq!(v.as_deref(), lock, "{key}: untouched");
        }
    }
}
