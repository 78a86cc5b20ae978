//! The rows of `EXTEND` (see the table's runner in `scripts_lock.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
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
        name: "extend after the fence counter vanished: a fence from Redis' clock",
        setup: &["SET {L} pT PX 500"],
        script: scripts::EXTEND,
        call: args("T"),
        reply: "[1, _]",
        checks: &[FenceNow(""), FencePttl(3_609_000, 3_610_000)],
    },
];
