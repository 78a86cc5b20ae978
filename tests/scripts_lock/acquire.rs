//! The rows of `ACQUIRE` (see the table's runner in `scripts_lock.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
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
    Row {
        name: "acquire by the holder after its fence counter vanished: a fence from Redis' clock",
        setup: &["SET {L} qT PX 5000"],
        script: scripts::ACQUIRE,
        call: args("T"),
        reply: "[1, _, _]",
        checks: &[Get(L, Some("qT")), FenceNow(" q")],
    },
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
];
