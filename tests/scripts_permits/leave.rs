//! The rows of `PERMIT_LEAVE` (see the table's runner in `scripts_permits.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
    Row {
        name: "leave G of a holder: its permits back, and the waiter behind granted",
        setup: &[
            "ZADD {L} {soon} w3:aaaaaaaaaaaa/t3",
            "HSET {X} w3:aaaaaaaaaaaa/t3 100",
            "SET {F} 100_3_3 PX 60000",
            "ZADD {Q} 1 bbbbbbbbbbbb_20000_w1:bbbbbbbbbbbb/b1",
            "HSET {P} bbbbbbbbbbbb {now}",
        ],
        script: PERMIT_LEAVE,
        call: Args {
            flag: "G",
            ..args(T3)
        },
        reply: "[2]",
        checks: &[
            Lease(T3, None),
            Lease(B1, Some((19_900, 20_000))),
            Messages(&["bbbbbbbbbbbb: g2 "]),
        ],
    },
    Row {
        name: "leave o of a grant its waiter's own call claimed: kept",
        setup: &[
            "ZADD {L} {soon} w1:aaaaaaaaaaaa/t1",
            "HSET {X} w1:aaaaaaaaaaaa/t1 100",
            "SET {F} 100_3_1 PX 60000",
        ],
        script: PERMIT_LEAVE,
        call: Args {
            flag: "o",
            fence: "100",
            ..args(T1)
        },
        reply: "[0]",
        checks: &[Lease(T1, Some((4_000, 5_000)))],
    },
    Row {
        name: "leave o of an unclaimed grant with its fence: given back",
        setup: &[
            "ZADD {L} {soon} w1:aaaaaaaaaaaa/t1",
            "HSET {X} w1:aaaaaaaaaaaa/t1 100_g",
            "SET {F} 100_3_1 PX 60000",
        ],
        script: PERMIT_LEAVE,
        call: Args {
            flag: "o",
            fence: "100",
            ..args(T1)
        },
        reply: "[2]",
        checks: &[Lease(T1, None)],
    },
    Row {
        name: "a leave that lets the heads fit serves them, and chooses the watchers again",
        setup: &[
            "ZADD {L} {soon} w1:bbbbbbbbbbbb/b1",
            "SET {F} 100_3_1 PX 60000",
            "ZADD {Q} 1 aaaaaaaaaaaa_20000_w3:aaaaaaaaaaaa/t3",
            "ZADD {Q} 2 aaaaaaaaaaaa_20000_w2:aaaaaaaaaaaa/t2",
            "HSET {P} aaaaaaaaaaaa {now}",
        ],
        script: PERMIT_LEAVE,
        call: Args {
            member: M_T3,
            flag: "G",
            ..args(T3)
        },
        reply: "[0]",
        checks: &[
            Queue(&[]),
            Lease(T2, Some((19_900, 20_000))),
            Messages(&["aaaaaaaaaaaa: g2 "]),
        ],
    },
];
