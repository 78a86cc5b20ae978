//! The rows of `PERMIT_RELEASE` (see the table's runner in `scripts_permits.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
    Row {
        name: "release: the permits free, the head that fits granted a full lease and a g2",
        setup: &[
            "ZADD {L} {soon} w3:bbbbbbbbbbbb/b3",
            "SET {F} 100_3_3 PX 60000",
            "ZADD {Q} 1 aaaaaaaaaaaa_20000_w2:aaaaaaaaaaaa/t2",
            "HSET {P} aaaaaaaaaaaa {now}",
        ],
        script: PERMIT_RELEASE,
        call: args(B3),
        reply: "[2]",
        checks: &[
            Lease(B3, None),
            Lease(T2, Some((19_900, 20_000))),
            Queue(&[]),
            Messages(&["aaaaaaaaaaaa: g2 "]),
        ],
    },
    Row {
        name: "release by a token that holds nothing: nothing of anyone else's is freed",
        setup: &[
            "ZADD {L} {soon} w3:bbbbbbbbbbbb/b3",
            "SET {F} 100_3_3 PX 60000",
        ],
        script: PERMIT_RELEASE,
        call: args(T1),
        reply: "[0]",
        checks: &[Lease(B3, Some((4_000, 5_000))), Get(F, Some("100 3 3"))],
    },
    Row {
        name: "no barging: a head that does not fit holds back a lighter waiter behind it",
        setup: &[
            "ZADD {L} {soon} w1:bbbbbbbbbbbb/b1",
            "ZADD {L} {soon} w2:bbbbbbbbbbbb/b2",
            "SET {F} 100_3_3 PX 60000",
            "ZADD {Q} 1 aaaaaaaaaaaa_20000_w3:aaaaaaaaaaaa/t3",
            "ZADD {Q} 2 bbbbbbbbbbbb_20000_w1:bbbbbbbbbbbb/b1",
            "HSET {P} aaaaaaaaaaaa {now}",
            "HSET {P} bbbbbbbbbbbb {now}",
        ],
        script: PERMIT_RELEASE,
        call: args(B1),
        reply: "[1]",
        // Both waiters are told to watch (nobody else holds), neither is granted.
        checks: &[
            Queue(&[M_T3, M_B1]),
            Messages(&["aaaaaaaaaaaa: w3 ", "bbbbbbbbbbbb: w3 "]),
        ],
    },
    Row {
        name: "a dead head is dropped first: the lighter live waiter behind it is granted",
        setup: &[
            "ZADD {L} {soon} w3:bbbbbbbbbbbb/b3",
            "SET {F} 100_3_3 PX 60000",
            "ZADD {Q} 1 dddddddddddd_20000_w3:dddddddddddd/d3",
            "ZADD {Q} 2 aaaaaaaaaaaa_20000_w2:aaaaaaaaaaaa/t2",
            "HSET {P} aaaaaaaaaaaa {now}",
        ],
        script: PERMIT_RELEASE,
        call: args(B3),
        reply: "[2]",
        checks: &[
            Queue(&[]),
            Lease(T2, Some((19_900, 20_000))),
            Messages(&["aaaaaaaaaaaa: g2 "]),
        ],
    },
];
