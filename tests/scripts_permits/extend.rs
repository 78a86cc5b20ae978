//! The rows of `PERMIT_EXTEND` (see the table's runner in `scripts_permits.rs`).

use super::*;
use common::scripts::Check::*;

pub const ROWS: &[Row] = &[
    Row {
        name: "extend a running lease: the TTL again, and the fence of the hold",
        setup: &[
            "ZADD {L} {soon} w1:aaaaaaaaaaaa/t1",
            "HSET {X} w1:aaaaaaaaaaaa/t1 100",
            "SET {F} 100_3_1 PX 60000",
        ],
        script: PERMIT_EXTEND,
        call: args(T1),
        reply: "[1, 100]",
        checks: &[Lease(T1, Some((9_900, 10_000)))],
    },
    Row {
        name: "extend a lease that has ended: not held, the lease dropped",
        setup: &[
            "ZADD {L} {old} w1:aaaaaaaaaaaa/t1",
            "HSET {X} w1:aaaaaaaaaaaa/t1 100",
            "SET {F} 100_3_1 PX 60000",
        ],
        script: PERMIT_EXTEND,
        call: args(T1),
        reply: "[0]",
        checks: &[Lease(T1, None)],
    },
];
