//! The rows of `LEAVE` (see the table's runner in `scripts_lock.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
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
];
