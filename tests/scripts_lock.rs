//! The lock's scripts driven directly, one state transition per row, against a private
//! `redis-server` (the harness, shared with the permits' table, is `tests/common/scripts.rs`):
//! each row sets the lock's Redis keys up by hand, runs one script with the arguments the
//! library sends, and checks the reply, the keys afterwards and the messages published on the
//! grant channels. The formats are those of `src/redis/protocol.rs` and the headers of
//! `src/redis/lua/queue.lua` and `lock.lua`.

mod common;

use common::scripts::{args, run, run_rows, Args, Kind, Row, DEAD, LIVE, LIVE2};
use common::{fence_key, lock_key, procs_key, queue_key, RedisServer};
use waitlock::fred::prelude::*;
use waitlock::scripts;

// The names of the lock on key "k", as constants for the tables below (checked against the
// shared helpers by `the_table_names_are_the_librarys`).
const L: &str = "{waitlock:k}";
const F: &str = "{waitlock:k}:fence";
const Q: &str = "{waitlock:k}:q";
const P: &str = "{waitlock:k}:p";

const LOCK: Kind = Kind {
    main: L,
    state: F,
    queue: Q,
    procs: P,
    fences: None,
    extra: &[],
};

const M_LIVE: &str = "aaaaaaaaaaaa 20000 w1";
const M_LIVE_B: &str = "aaaaaaaaaaaa 20000 w2";
const M_LIVE2: &str = "bbbbbbbbbbbb 30000 x1";
const M_DEAD: &str = "dddddddddddd 20000 z1";

/// A held lock with two waiters of two processes, both watching, and LIVE's record a second
/// old: a queueing attempt of LIVE changes neither watcher.
const YOUNG_RECORD: &[&str] = &[
    "SET {L} qH PX 5000",
    "SET {F} 100_q PX 60000",
    "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
    "ZADD {Q} 2 eeeeeeeeeeee_30000_y1",
    "HSET {P} aaaaaaaaaaaa {young} bbbbbbbbbbbb {now} !w1 {soon}_bbbbbbbbbbbb_30000_x1 !w2 {soon}_eeeeeeeeeeee_30000_y1 !h cccccccccccc !e {far}",
    "PEXPIRE {Q} 5000000",
    "PEXPIRE {P} 5000000",
];

#[path = "scripts_lock/acquire.rs"]
mod acquire_rows;
#[path = "scripts_lock/extend.rs"]
mod extend_rows;
#[path = "scripts_lock/leave.rs"]
mod leave_rows;
#[path = "scripts_lock/release.rs"]
mod release_rows;
#[path = "scripts_lock/status.rs"]
mod status_rows;

/// Every row, by script (one file each under `scripts_lock/`).
const TABLE: &[&[Row]] = &[
    acquire_rows::ROWS,
    release_rows::ROWS,
    extend_rows::ROWS,
    leave_rows::ROWS,
    status_rows::ROWS,
];

#[tokio::test]
async fn every_transition_of_every_script() {
    run_rows(&LOCK, TABLE.iter().copied().flatten()).await;
}

/// A key of another type under the fence counter's name: the acquire fails with WRONGTYPE and
/// leaves no lock behind (the lock it had just set is deleted again).
#[tokio::test]
async fn a_foreign_fence_key_leaves_no_lock() {
    let server = RedisServer::start();
    let c = server.client().await;
    let _: Value = run(&c, vec!["RPUSH".into(), F.into(), "x".into()]).await;
    let argv: Vec<String> = ["T", "10000", "3600000", "500", "100", "", "", "", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let e = c
        .eval::<Vec<i64>, _, _, _>(scripts::ACQUIRE, vec![L, F, Q, P], argv)
        .await
        .expect_err("WRONGTYPE");
    assert!(e.details().contains("WRONGTYPE"), "{e}");
    let v: Option<String> = c.get(L).await.expect("GET");
    assert_eq!(v, None, "a lock was left behind");
}

#[test]
fn the_table_names_are_the_librarys() {
    assert_eq!(
        [L, F, Q, P].map(str::to_owned),
        [
            lock_key("k"),
            fence_key("k"),
            queue_key("k"),
            procs_key("k")
        ]
    );
}

/// The batched refresh (`lua/refresh.lua`), one lock per state in one call: a lock taken free
/// is refreshed (lock and fence counter), every other state is left untouched for `EXTEND`, a
/// lock of another token or none is "not held", a vanished fence counter is left for `EXTEND`
/// to restart.
#[tokio::test]
async fn the_batched_refresh_does_extends_fast_path_and_leaves_the_rest_alone() {
    let server = RedisServer::start();
    let c = server.client().await;
    // (key, lock value or none, fence counter or none) and the code expected.
    let rows: [(&str, Option<&str>, Option<&str>, i64); 7] = [
        ("free", Some("pT"), Some("7"), 1),
        ("queued", Some("qT"), Some("7 q"), 6),
        ("handed", Some("hT"), Some("7 q"), 6),
        ("granted", Some("gT"), Some("7 q aaaaaaaaaaaa"), 6),
        ("other", Some("pU"), Some("7"), 0),
        ("gone", None, Some("7"), 0),
        ("no-fence", Some("pT"), None, 6),
    ];
    let mut keys = Vec::new();
    let mut argv = vec!["3600000".to_owned()];
    for (key, lock, fence, _) in rows {
        let (l, f) = (lock_key(key), fence_key(key));
        if let Some(v) = lock {
            let _: () = c
                .set(&l, v, Some(Expiration::PX(1_000)), None, false)
                .await
                .expect("SET");
        }
        if let Some(v) = fence {
            let _: () = c
                .set(&f, v, Some(Expiration::PX(1_000)), None, false)
                .await
                .expect("SET");
        }
        keys.extend([l, f]);
        argv.extend(["T".to_owned(), "30000".to_owned()]);
    }
    let reply: Vec<i64> = c.eval(scripts::REFRESH, keys, argv).await.expect("REFRESH");
    assert_eq!(reply, rows.map(|r| r.3).to_vec());
    for (key, lock, fence, code) in rows {
        let lock_ttl: i64 = c.pttl(lock_key(key)).await.expect("PTTL");
        let fence_ttl: i64 = c.pttl(fence_key(key)).await.expect("PTTL");
        if code == 1 {
            assert!(
                (29_000..=30_000).contains(&lock_ttl),
                "{key}: lock PTTL {lock_ttl}"
            );
            assert!(fence_ttl > 3_600_000, "{key}: fence PTTL {fence_ttl}");
        } else {
            // Untouched: the PX set above, or absent.
            let expect = |present: bool, ttl: i64| {
                if present {
                    (0..=1_000).contains(&ttl)
                } else {
                    ttl == -2
                }
            };
            assert!(
                expect(lock.is_some(), lock_ttl),
                "{key}: lock PTTL {lock_ttl}"
            );
            assert!(
                expect(fence.is_some(), fence_ttl),
                "{key}: fence PTTL {fence_ttl}"
            );
        }
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        assert_eq!(v.as_deref(), lock, "{key}: the value is never changed");
    }
}

/// `take_set.lua`'s `KEYS` and `ARGV` for `keys`, all with token `T`, the retention an hour and
/// `ttl` ms (or `check`).
fn take_set_call(keys: &[&str], ttl: &str) -> (Vec<String>, Vec<String>) {
    let mut k = Vec::new();
    let mut argv = vec!["3600000".to_owned(), ttl.to_owned()];
    for key in keys {
        k.extend([lock_key(key), fence_key(key)]);
        argv.push("T".to_owned());
    }
    (k, argv)
}

/// Taking a set in one call (`lua/take_set.lua`): free locks are all taken (state 'p', the
/// TTL, fences above the last one and Redis' clock); one lock held, free with waiters queued,
/// or of another type stops the call with nothing written; sent again, the call finds its own
/// locks and answers their fences.
#[tokio::test]
async fn taking_a_set_is_all_or_none() {
    let server = RedisServer::start();
    let c = server.client().await;
    let set = ["s-a", "s-b", "s-c"];
    let call = |keys: &[&str]| take_set_call(keys, "30000");
    let huge = "9999999999999999";
    let _: () = c
        .set(fence_key("s-b"), huge, None, None, false)
        .await
        .expect("SET");
    let (k, a) = call(&set);
    let taken: Vec<i64> = c
        .eval(scripts::TAKE_SET, k.clone(), a.clone())
        .await
        .expect("take");
    assert_eq!(taken.len(), 4, "{taken:?}");
    assert_eq!(taken[0], 0);
    assert_eq!(taken[2], 9_999_999_999_999_999 + 1, "above the last fence");
    let now_us = {
        let t: Vec<String> = c
            .custom(fred::cmd!("TIME"), Vec::<String>::new())
            .await
            .expect("TIME");
        t[0].parse::<i64>().expect("s") * 1_000_000
    };
    assert!(
        taken[1] > now_us - 10_000_000 && taken[3] > now_us - 10_000_000,
        "{taken:?}"
    );
    for key in set {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        assert_eq!(v.as_deref(), Some("pT"), "{key}");
        let ttl: i64 = c.pttl(lock_key(key)).await.expect("PTTL");
        assert!((29_000..=30_000).contains(&ttl), "{key}: {ttl}");
        let fttl: i64 = c.pttl(fence_key(key)).await.expect("PTTL");
        assert!(fttl > 3_600_000, "{key}: fence PTTL {fttl}");
    }
    // Sent again: its own locks, the same fences, nothing rewritten.
    let again: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("again");
    assert_eq!(again, taken);

    // One of them held by another: {2, i, pttl}, and nothing of the others written.
    let _: () = c
        .set(
            lock_key("t-b"),
            "pU",
            Some(Expiration::PX(5_000)),
            None,
            false,
        )
        .await
        .expect("SET");
    let (k, a) = call(&["t-a", "t-b", "t-c"]);
    let held: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("held");
    assert_eq!(held.len(), 3, "{held:?}");
    assert_eq!(&held[..2], &[2, 2]);
    assert!((4_000..=5_000).contains(&held[2]), "{held:?}");
    // Free, but its fence says waiters may be queued: {2, i, -3}.
    let _: () = c
        .set(fence_key("t-c"), "12 q", None, None, false)
        .await
        .expect("SET");
    let (k, a) = call(&["t-a", "t-c"]);
    let queued: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("queued");
    assert_eq!(queued, [2, 2, -3]);
    // A key of another type (a fence counter here): {7, i, 2}, nothing overwritten.
    let _: i64 = c.rpush(fence_key("t-d"), "x").await.expect("RPUSH");
    let (k, a) = call(&["t-a", "t-d"]);
    let wrong: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("wrong type");
    assert_eq!(wrong, [7, 2, 2]);
    let kind: String = c.r#type(fence_key("t-d")).await.expect("TYPE");
    assert_eq!(kind, "list");
    for key in ["t-a", "t-c", "t-d"] {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        assert_eq!(v, None, "{key}: nothing written");
    }
    let fa: Option<String> = c.get(fence_key("t-a")).await.expect("GET");
    assert_eq!(fa, None, "t-a's fence: nothing written");
}

/// A set's look (`take_set.lua` with ttl `check`) answers as a take would and writes nothing;
/// the batched give-back (`lua/give_back.lua`) deletes the locks its tokens took free and
/// leaves every other state, and other tokens' locks, untouched.
#[tokio::test]
async fn a_sets_look_writes_nothing_and_the_give_back_deletes_only_free_takes() {
    let server = RedisServer::start();
    let c = server.client().await;
    let look = |keys: &[&str]| take_set_call(keys, "check");
    let (k, a) = look(&["g-a", "g-b"]);
    let free: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("look");
    assert_eq!(free, [0]);
    for key in ["g-a", "g-b"] {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        let f: Option<String> = c.get(fence_key(key)).await.expect("GET");
        assert_eq!((v, f), (None, None), "{key}: a look writes nothing");
    }
    let _: () = c
        .set(
            lock_key("g-b"),
            "pU",
            Some(Expiration::PX(5_000)),
            None,
            false,
        )
        .await
        .expect("SET");
    let (k, a) = look(&["g-a", "g-b"]);
    let held: Vec<i64> = c.eval(scripts::TAKE_SET, k, a).await.expect("look");
    assert_eq!(&held[..2], &[2, 2], "{held:?}");

    // (key, lock value) and the code expected.
    let rows: [(&str, Option<&str>, i64); 5] = [
        ("b-free", Some("pT"), 1),
        ("b-queued", Some("qT"), 6),
        ("b-handed", Some("hT"), 6),
        ("b-other", Some("pU"), 0),
        ("b-gone", None, 0),
    ];
    let mut keys = Vec::new();
    for (key, lock, _) in rows {
        if let Some(v) = lock {
            let _: () = c
                .set(lock_key(key), v, Some(Expiration::PX(5_000)), None, false)
                .await
                .expect("SET");
        }
        keys.push(lock_key(key));
    }
    let argv = vec!["T".to_owned(); rows.len()];
    let reply: Vec<i64> = c
        .eval(scripts::GIVE_BACK, keys, argv)
        .await
        .expect("give back");
    assert_eq!(reply, rows.map(|r| r.2).to_vec());
    for (key, lock, code) in rows {
        let v: Option<String> = c.get(lock_key(key)).await.expect("GET");
        if code == 1 {
            assert_eq!(v, None, "{key}: deleted");
        } else {
            assert_eq!(v.as_deref(), lock, "{key}: untouched");
        }
    }
}
