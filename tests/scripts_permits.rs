//! The permit scripts driven directly, one state transition per row, on the lock's harness
//! (`tests/common/scripts.rs`), against a private `redis-server`; then the sequences of raw
//! calls that reproduced the permits' findings. Formats: `src/redis/lua/permits.lua` and the
//! queue layer's `queue.lua`.

mod common;

use common::scripts::{args, run_rows, Args, Kind, Raw, Row, DEAD, LIVE, LIVE2};
use common::{cmd, RedisServer};
use std::time::Duration;
use waitlock::fred::prelude::*;
use waitlock::scripts::{PERMIT_ACQUIRE, PERMIT_EXTEND, PERMIT_LEAVE, PERMIT_RELEASE};

// The names of a semaphore of 3 permits on key "k".
const L: &str = "{waitlock:k}:s";
const F: &str = "{waitlock:k}:s:fence";
const Q: &str = "{waitlock:k}:s:q";
const P: &str = "{waitlock:k}:s:p";
const X: &str = "{waitlock:k}:s:f";

const PERMITS: Kind = Kind {
    main: L,
    state: F,
    queue: Q,
    procs: P,
    fences: Some(X),
    extra: &["3"],
};

// Tokens `w<weight>:<pid>/<id>` and their queue members.
const T1: &str = "w1:aaaaaaaaaaaa/t1";
const T2: &str = "w2:aaaaaaaaaaaa/t2";
const T3: &str = "w3:aaaaaaaaaaaa/t3";
const B1: &str = "w1:bbbbbbbbbbbb/b1";
const B3: &str = "w3:bbbbbbbbbbbb/b3";
const M_T1: &str = "aaaaaaaaaaaa 10000 w1:aaaaaaaaaaaa/t1";
const M_T2: &str = "aaaaaaaaaaaa 20000 w2:aaaaaaaaaaaa/t2";
const M_T3: &str = "aaaaaaaaaaaa 20000 w3:aaaaaaaaaaaa/t3";
const M_B1: &str = "bbbbbbbbbbbb 20000 w1:bbbbbbbbbbbb/b1";
const M_DEAD3: &str = "dddddddddddd 20000 w3:dddddddddddd/d3";

#[path = "scripts_permits/acquire.rs"]
mod acquire_rows;
#[path = "scripts_permits/extend.rs"]
mod extend_rows;
#[path = "scripts_permits/leave.rs"]
mod leave_rows;
#[path = "scripts_permits/release.rs"]
mod release_rows;

/// Every row, by script (one file each under `scripts_permits/`).
const TABLE: &[&[Row]] = &[
    acquire_rows::ROWS,
    release_rows::ROWS,
    extend_rows::ROWS,
    leave_rows::ROWS,
];

#[tokio::test]
async fn every_transition_of_every_permit_script() {
    // (DEAD's queued waiters, and M_DEAD3, name a process nobody listens for.)
    let _ = (DEAD, M_DEAD3);
    run_rows(&PERMITS, TABLE.iter().copied().flatten()).await;
}

/// Finding P1 of the permits model (model/README.md): a grant that its waiter's own call found
/// (its message lost, or crossing the call) is claimed by that call, so the late message,
/// reaching a process whose waiter had gone, cannot give it back (leave `o`). Before the fix
/// the leave freed the permit of a holder that was using it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_grant_is_not_given_back_by_its_late_message() {
    let server = RedisServer::start();
    let raw = Raw::new(&server, "p1", "abc123", 3_600_000, 1).await;
    let eval =
        |script, token, member, flag, fence| raw.eval(script, token, 10_000, member, flag, fence);
    let (a, b) = ("w1:aaaaaa/1", "w1:abc123/2");
    let member_b = format!("abc123 10000 {b}");
    assert_eq!(
        eval(PERMIT_ACQUIRE, a, "", "", "").await[0],
        0,
        "a takes the permit"
    );
    let queued = eval(PERMIT_ACQUIRE, b, &member_b, "", "").await;
    assert_eq!(&queued[..4], &[2, queued[1], 1, 1], "b queues, listening");
    assert_eq!(
        eval(PERMIT_RELEASE, a, "", "", "").await,
        vec![2],
        "granted to b"
    );
    let found = eval(PERMIT_ACQUIRE, b, &member_b, "", "").await;
    assert_eq!(found[0], 1, "b's own call finds its grant: {found:?}");
    let fence = found[2].to_string();
    assert_eq!(
        eval(PERMIT_LEAVE, b, &member_b, "o", &fence).await,
        vec![0],
        "the late message gave back a claimed grant"
    );
    let status = raw.status().await;
    assert_eq!(
        &status[..4],
        &[1, 1, 1, 0],
        "b still holds its permit: {status:?}"
    );
    // An unclaimed grant is given back by its orphaned message, and served on.
    let c = "w1:abc123/3";
    let member_c = format!("abc123 10000 {c}");
    eval(PERMIT_ACQUIRE, c, &member_c, "", "").await;
    assert_eq!(
        eval(PERMIT_RELEASE, b, "", "", "").await,
        vec![2],
        "granted to c"
    );
    let fence_c = raw.status().await[5].to_string();
    assert_eq!(
        eval(PERMIT_LEAVE, c, &member_c, "o", &fence_c).await,
        vec![2]
    );
    let status = raw.status().await;
    assert_eq!(&status[..4], &[1, 0, 0, 0], "{status:?}");
}

/// Found in review: a waiter that calls without its member while its earlier entry is still
/// queued (its subscription judged failed on the client, alive in Redis) was granted twice in
/// one call (its entry, then a free take), and the key counted its weight twice for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_own_queued_entry_is_not_granted_twice() {
    let server = RedisServer::start();
    let raw = Raw::new(&server, "twice", "cccc", 3_600_000, 1).await;
    let (a, b) = ("w1:aaaa/1", "w1:cccc/2");
    let member_b = format!("cccc 10000 {b}");
    assert_eq!(raw.eval(PERMIT_ACQUIRE, a, 300, "", "", "").await[0], 0);
    assert_eq!(
        raw.eval(PERMIT_ACQUIRE, b, 10_000, &member_b, "", "").await[0],
        2
    );
    // a's lease ends unreleased; b calls again without its member.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(raw.eval(PERMIT_ACQUIRE, b, 10_000, "", "", "").await[0], 0);
    let status = raw.status().await;
    assert_eq!(&status[..4], &[1, 1, 1, 0], "{status:?}");
    assert_eq!(raw.eval(PERMIT_RELEASE, b, 1, "", "", "").await, vec![1]);
    let c = raw
        .eval(PERMIT_ACQUIRE, "w1:dddd/3", 10_000, "", "", "")
        .await;
    assert_eq!(c[0], 0, "the permit is free but the key says held: {c:?}");
}

/// Found in review: the processes hash got its expiry only when a process first wrote its
/// field, so it could expire while its queue lived on; a watcher write then made it again
/// with no expiry, and it stayed behind when the queue expired. Retention 1 s here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processes_hash_always_expires() {
    let server = RedisServer::start();
    let raw = Raw::new(&server, "procs", "aaaa", 1_000, 1).await;
    let holder = "w1:bbbb/1";
    assert_eq!(
        raw.eval(PERMIT_ACQUIRE, holder, 20_000, "", "", "").await[0],
        0
    );
    for i in 1..=2 {
        let member = format!("aaaa 20000 w1:aaaa/{i}");
        let token = format!("w1:aaaa/{i}");
        assert_eq!(
            raw.eval(PERMIT_ACQUIRE, &token, 20_000, &member, "", "")
                .await[0],
            2
        );
        // Past the hash's retention (set by the first entry), not the queue's (renewed).
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
    assert_eq!(
        raw.eval(PERMIT_EXTEND, holder, 20_000, "", "", "").await[0],
        1
    );
    let pttl: i64 = cmd(&raw.admin, "PTTL {waitlock:procs}:s:p", vec![]).await;
    assert_ne!(pttl, -1, "the processes hash has no expiry");
}

/// Found in review: with the key's state deleted by hand (or evicted) while waiters were
/// queued, a leave dropped every waiter as if none could ever fit. The queue now waits until
/// the number of permits is known again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_state_drops_no_waiter() {
    let server = RedisServer::start();
    let raw = Raw::new(&server, "lost", "bbbb", 3_600_000, 1).await;
    assert_eq!(
        raw.eval(PERMIT_ACQUIRE, "w1:h/1", 60_000, "", "", "").await[0],
        0
    );
    for i in 1..=3 {
        let member = format!("bbbb 60000 w1:bbbb/{i}");
        let token = format!("w1:bbbb/{i}");
        assert_eq!(
            raw.eval(PERMIT_ACQUIRE, &token, 60_000, &member, "", "")
                .await[0],
            2
        );
    }
    let _: Value = cmd(&raw.admin, "DEL {waitlock:lost}:s:fence", vec![]).await;
    let left = raw
        .eval(
            PERMIT_LEAVE,
            "w1:bbbb/3",
            60_000,
            "bbbb 60000 w1:bbbb/3",
            "G",
            "",
        )
        .await;
    assert_eq!(left, vec![0]);
    let queued: i64 = cmd(&raw.admin, "ZCARD {waitlock:lost}:s:q", vec![]).await;
    assert_eq!(queued, 2, "waiters dropped");
}
