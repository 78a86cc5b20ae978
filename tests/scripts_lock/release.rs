//! The rows of `RELEASE` (see the table's runner in `scripts_lock.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
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
            // process is granted first, unheard (its SPUBLISH has no receiver; the fence
            // counter taken and put back), then its heads are dropped by a second walk, which
            // reads the next head's record)
            Commands(24),
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
            // (protocol 4: the watchers kept, w2 of the new holder's process too; the walk
            // read the whole queue, so whether they are queued comes from that read, not from
            // a ZMSCORE; no PUBSUB)
            Commands(10),
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
            // (the row above, and three more: HSET !e, two PEXPIREs)
            Commands(13),
        ],
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
            // (one watcher field only: the watchers are chosen again. The second HMGET: the
            // departed watcher's process, and a PUBSUB NUMSUB for it, as nobody listens for it
            // sharded; one PUBSUB SHARDNUMSUB for the back's x2, whose process the grant's walk
            // did not ask about; its membership and the queue's back from the walk's whole read)
            Commands(15),
        ],
    },
    Row {
        name: "protocol 4: a grant keeps both watchers (queued, of other processes, looking before the new lease ends): nothing read of their processes, nobody told",
        setup: &[
            "SET {L} qH PX 5000",
            "SET {F} 100_q PX 60000",
            "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
            "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
            "ZADD {Q} 3 eeeeeeeeeeee_30000_y1",
            "HSET {P} aaaaaaaaaaaa {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_eeeeeeeeeeee_30000_y1 !h cccccccccccc !e {far}",
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
            Queue(&["bbbbbbbbbbbb 30000 x1", "eeeeeeeeeeee 30000 y1"]),
            Watcher("!w1", Some("bbbbbbbbbbbb 30000 x1")),
            Watcher("!w2", Some("eeeeeeeeeeee 30000 y1")),
            Process("!h", Some(LIVE)),
            Messages(&["aaaaaaaaaaaa: g2 "]),
            // (no PUBSUB, no read of the queue's back, no HSET of watcher fields: the heads'
            // records with the fields in one HMGET, the watchers' membership in one ZMSCORE)
            Commands(12),
        ],
    },
    Row {
        name: "protocol 4: a grant whose lease ends before a watcher looks chooses again, and tells it",
        setup: &[
            "SET {L} qH PX 5000",
            "SET {F} 100_q PX 60000",
            "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
            "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
            "HSET {P} aaaaaaaaaaaa {now} bbbbbbbbbbbb {now} !w1 {far}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_aaaaaaaaaaaa_20000_w9",
        ],
        script: scripts::RELEASE,
        call: args("H"),
        reply: "[2]",
        checks: &[
            Get(L, Some("hw1")),
            Watcher("!w1", Some("bbbbbbbbbbbb 30000 x1")),
            Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 20000 "]),
        ],
    },
];
