//! The rows of `STATUS` (see the table's runner in `scripts_lock.rs`).

use super::*;

pub const ROWS: &[Row] = &[Row {
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
}];
