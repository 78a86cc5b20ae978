//! The rows of `PERMIT_ACQUIRE` (see the table's runner in `scripts_permits.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
    Row {
        name: "acquire on a free key: a lease of the TTL, the state counts it",
        setup: &[],
        script: PERMIT_ACQUIRE,
        call: args(T1),
        reply: "[0, 10000, _]",
        checks: &[
            Lease(T1, Some((9_900, 10_000))),
            FenceNow(" 3 1"),
            Queue(&[]),
        ],
    },
    Row {
        name: "acquire by a holder: its lease and the fence of its hold, claimed",
        setup: &[
            "ZADD {L} {soon} w1:aaaaaaaaaaaa/t1",
            "HSET {X} w1:aaaaaaaaaaaa/t1 100_g",
            "SET {F} 100_3_1 PX 60000",
        ],
        script: PERMIT_ACQUIRE,
        call: args(T1),
        reply: "[1, _, 100]",
        checks: &[HGet(X, T1, Some("100")), Get(F, Some("100 3 1"))],
    },
    Row {
        name: "acquire of more than is free, without a member: held, nothing changes",
        setup: &[
            "ZADD {L} {soon} w3:bbbbbbbbbbbb/b3",
            "SET {F} 100_3_3 PX 60000",
        ],
        script: PERMIT_ACQUIRE,
        call: args(T1),
        reply: "[2, _, 0]",
        checks: &[Get(F, Some("100 3 3")), Queue(&[])],
    },
    Row {
        name: "acquire of more than is free, with a member: queued, listening, a watcher",
        setup: &[
            "ZADD {L} {soon} w3:bbbbbbbbbbbb/b3",
            "SET {F} 100_3_3 PX 60000",
        ],
        script: PERMIT_ACQUIRE,
        call: Args {
            member: M_T1,
            pid: LIVE,
            ..args(T1)
        },
        reply: "[2, _, 1, 1, 100, 1, _, 1]",
        checks: &[
            Queue(&[M_T1]),
            Process(LIVE, Some("now")),
            Watcher("!w1", Some(M_T1)),
            Ttl(Q, 3_600_000, 3_605_000),
        ],
    },
    Row {
        name: "another number of permits while the key is in use: {5, n}, nothing changes",
        setup: &[
            "ZADD {L} {soon} w1:bbbbbbbbbbbb/b1",
            "SET {F} 100_2_1 PX 60000",
        ],
        script: PERMIT_ACQUIRE,
        call: args(T1),
        reply: "[5, 2]",
        checks: &[Get(F, Some("100 2 1")), Lease(T1, None)],
    },
    Row {
        name: "leases keep their length on a node whose clock is ahead of the writer's",
        setup: &[
            "ZADD {L} {soon} w3:bbbbbbbbbbbb/b3",
            "PEXPIRE {L} 6500",
            "SET {F} 100_3_3 PX 60000",
        ],
        script: PERMIT_ACQUIRE,
        call: args(T1),
        reply: "[2, _, 0]",
        checks: &[Lease(B3, Some((4_000, 5_000)))],
    },
    Row {
        name: "a new queue lives the last lease and the retention",
        setup: &[
            "ZADD {L} {soon} w1:bbbbbbbbbbbb/b1",
            "ZADD {L} {soon} w2:bbbbbbbbbbbb/b2",
            "SET {F} 100_3_3 PX 60000",
        ],
        script: PERMIT_ACQUIRE,
        call: Args {
            member: M_T2,
            pid: LIVE,
            ..args(T2)
        },
        reply: "[2, _, 1, 1, 100, _, _, 1]",
        checks: &[Ttl(Q, 3_604_000, 3_605_000), Ttl(P, 3_604_000, 3_605_000)],
    },
    Row {
        name: "a waiter of a dead process does not pin the number of permits",
        setup: &[
            "SET {F} 100_2_0 PX 60000",
            "ZADD {Q} 1 dddddddddddd_20000_w3:dddddddddddd/d3",
        ],
        script: PERMIT_ACQUIRE,
        call: Args {
            member: M_B1,
            pid: LIVE2,
            ..args(B1)
        },
        reply: "[0, 10000, _]",
        checks: &[Queue(&[]), FenceNow(" 3 1")],
    },
];
