//! Critical sections (`run`) and keep-alive against a real private redis-server.

mod common;

use common::{lock_key, tight, RedisServer};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{Error, LockOptions, Locker, LossReason};

#[derive(Debug)]
enum AppError {
    Lock(Error),
    Business(&'static str),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Lock(e)
    }
}

async fn setup() -> (RedisServer, Client, Locker) {
    let server = RedisServer::start();
    let client = server.client().await;
    let locker = Locker::new(server.client().await);
    (server, client, locker)
}

async fn is_free(client: &Client, key: &str) -> bool {
    let v: Option<String> = client.get(lock_key(key)).await.expect("GET");
    v.is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_keeps_the_lock_for_five_ttls() {
    let (_s, client, locker) = setup().await;
    let ttl = Duration::from_millis(200);
    let opts = LockOptions::new().with_ttl(ttl).with_refresh_ratio(0.5);
    let rival = locker.clone();
    let out = locker
        .run("long", &opts, |ctx| async move {
            let until = Instant::now() + ttl * 5;
            let mut tries = 0;
            while Instant::now() < until {
                match rival.acquire("long", &LockOptions::new()).await {
                    Err(Error::Locked { .. }) => tries += 1,
                    other => panic!("someone else got the lock while refreshed: {other:?}"),
                }
                assert!(!ctx.lost.is_cancelled());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, Error>(tries)
        })
        .await
        .expect("run");
    assert!(out > 20);
    assert!(is_free(&client, "long").await);
    locker.idle().await;
    assert_eq!(locker.background_tasks(), 0);
}

#[tokio::test]
async fn without_refresh_the_token_fires_before_redis_expires_the_lock() {
    let (_s, client, locker) = setup().await;
    // 1.5 s: the drift margin (1% + 2 ms = 17 ms) must also absorb a late timer on a busy machine.
    let ttl = Duration::from_millis(1500);
    let opts = LockOptions::new().with_ttl(ttl).without_refresh();
    let r = locker
        .run("norefresh", &opts, |ctx| {
            let client = client.clone();
            async move {
                ctx.lost.cancelled().await;
                let pttl: i64 = client.pttl(&lock_key("norefresh")).await.expect("PTTL");
                assert!(
                    pttl > 0,
                    "the token fired after Redis let the lock go (PTTL {pttl})"
                );
                Ok::<_, Error>(())
            }
        })
        .await;
    match r {
        Err(Error::Expired { key, reason }) => {
            assert_eq!(key, "norefresh");
            assert_eq!(reason, LossReason::TtlElapsed);
        }
        other => panic!("expected Expired(TtlElapsed), got {other:?}"),
    }
}

#[tokio::test]
async fn a_lock_deleted_behind_the_holder_cancels_within_one_refresh_interval() {
    let (_s, client, locker) = setup().await;
    let ttl = Duration::from_millis(400);
    let interval = ttl / 4;
    let opts = LockOptions::new().with_ttl(ttl).with_refresh_ratio(0.25);
    let r = locker
        .run("stolen", &opts, |ctx| {
            let client = client.clone();
            async move {
                let _: () = client
                    .set(&lock_key("stolen"), "thief", None, None, false)
                    .await
                    .expect("SET");
                let deleted = Instant::now();
                ctx.lost.cancelled().await;
                let took = deleted.elapsed();
                assert!(
                    // One interval, plus a round trip and scheduling on a busy machine.
                    took <= interval + Duration::from_millis(100),
                    "noticed after {took:?}"
                );
                Ok::<_, Error>(())
            }
        })
        .await;
    assert!(
        matches!(
            r,
            Err(Error::Expired {
                reason: LossReason::TokenGone,
                ..
            })
        ),
        "{r:?}"
    );
    let v: Option<String> = client.get(&lock_key("stolen")).await.expect("GET");
    assert_eq!(
        v.as_deref(),
        Some("thief"),
        "the release must not delete someone else's lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_redis_cancels_by_the_validity_deadline() {
    let mut server = RedisServer::start();
    let locker = Locker::builder(server.client().await)
        .command_timeout(Duration::from_millis(100))
        .build()
        .expect("locker");
    // 1 s: a 12 ms drift margin, so a timer that fires a little late still beats the TTL.
    let ttl = Duration::from_millis(1000);
    let opts = LockOptions::new().with_ttl(ttl).with_refresh_ratio(0.5);
    let pid = server.pid();
    let r = locker
        .run("paused", &opts, |ctx| async move {
            // Every acquire or refresh so far was sent before this instant.
            let paused = Instant::now();
            let status = std::process::Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .status()
                .expect("kill");
            assert!(status.success());
            ctx.lost.cancelled().await;
            let after = paused.elapsed();
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
            assert!(
                after <= ttl,
                "cancelled {after:?} after the last refresh could have been sent; TTL {ttl:?}"
            );
            Ok::<_, Error>(())
        })
        .await;
    server.resume();
    assert!(
        matches!(
            r,
            Err(Error::Expired {
                reason: LossReason::Unreachable,
                ..
            })
        ),
        "{r:?}"
    );
}

#[tokio::test]
async fn the_closures_error_comes_back_and_the_lock_is_released() {
    let (_s, client, locker) = setup().await;
    let r: Result<(), AppError> = locker
        .run("app", &LockOptions::new(), |ctx| async move {
            assert!(ctx.fence > 0);
            assert_eq!(ctx.key, "app");
            Err(AppError::Business("no stock"))
        })
        .await;
    assert!(matches!(r, Err(AppError::Business("no stock"))), "{r:?}");
    assert!(is_free(&client, "app").await);
    // And the lock error flows through the same type.
    let _held = locker
        .acquire("app", &LockOptions::new())
        .await
        .expect("hold");
    let r: Result<(), AppError> = locker
        .run(
            "app",
            &LockOptions::new().with_wait(Duration::ZERO),
            |_| async { Ok(()) },
        )
        .await;
    assert!(
        matches!(r, Err(AppError::Lock(Error::Locked { .. }))),
        "{r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_releases_the_lock_then_propagates() {
    let (_s, client, locker) = setup().await;
    let l = locker.clone();
    let joined = tokio::spawn(async move {
        l.run("boom", &LockOptions::new(), |_| async {
            panic!("boom");
            #[allow(unreachable_code)]
            Ok::<(), Error>(())
        })
        .await
    })
    .await;
    assert!(joined.expect_err("the panic propagates").is_panic());
    // The release happened before the panic resumed: the lock is already free.
    assert!(is_free(&client, "boom").await);
    locker.idle().await;
    assert_eq!(locker.background_tasks(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_runs_leave_no_lock_and_no_task() {
    let (_s, client, locker) = setup().await;
    let pubsub = Locker::queued(locker.client().clone())
        .await
        .expect("pubsub");
    // A long TTL: a leaked lock would still be there when checked, not expired away.
    let opts = tight()
        .with_ttl(Duration::from_secs(60))
        .with_refresh_ratio(0.2)
        .with_wait(Duration::from_secs(5));
    let mut rng = common::Seeded::new(0x9e37_79b9_7f4a_7c15);
    let mut tasks = Vec::new();
    for i in 0..1000u64 {
        let cut = rng.below(Duration::from_millis(30));
        let key = format!("drop-{}", i % 7);
        let opts = opts.clone();
        let (locker, pubsub) = (locker.clone(), pubsub.clone());
        tasks.push(tokio::spawn(async move {
            let work = |_ctx| async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, Error>(())
            };
            if i % 2 == 0 {
                let _ = tokio::time::timeout(cut, locker.run(&key, &opts, work)).await;
            } else {
                let _ = tokio::time::timeout(cut, pubsub.run(&key, &opts, work)).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    locker.idle().await;
    pubsub.idle().await;
    assert_eq!(
        locker.background_tasks(),
        0,
        "a refresher or release task is still running"
    );
    assert_eq!(
        pubsub.background_tasks(),
        0,
        "a refresher or release task is still running"
    );
    for k in 0..7 {
        assert!(
            is_free(&client, &format!("drop-{k}")).await,
            "drop-{k} is still held"
        );
    }
    assert_eq!(pubsub.registry_size().waiters, 0);
}

#[tokio::test]
async fn a_guard_keep_alive_refreshes_and_stops_on_release() {
    let (_s, client, locker) = setup().await;
    let ttl = Duration::from_millis(150);
    let mut g = locker
        .acquire(
            "guarded",
            &LockOptions::new().with_ttl(ttl).with_refresh_ratio(0.3),
        )
        .await
        .expect("acquire");
    let lost = g.keep_alive();
    let until = Instant::now() + ttl * 4;
    while Instant::now() < until {
        assert!(matches!(
            locker.acquire("guarded", &LockOptions::new()).await,
            Err(Error::Locked { .. })
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!lost.is_cancelled());
    // The refresher, and a refresh call's own task when one is in flight (seen once with two
    // CPU burners beside the suite).
    let tasks = locker.background_tasks();
    assert!((1..=2).contains(&tasks), "{tasks} background tasks");
    g.release().await.expect("release");
    locker.idle().await;
    assert!(is_free(&client, "guarded").await);
}

/// Issue 25: a release that reaches Redis after the lease (the server stalled by `DEBUG SLEEP
/// 0.5` 150 ms into a 200 ms section, TTL 300 ms) is not a lost lock: the section ended while
/// the lock was valid and nobody held it meanwhile, so `run` returns its value and counts the
/// late release (milestone 2 returned `Expired(TokenGone)` in 3 of 3 rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_comes_late_is_not_a_lost_lock() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let admin = server.client().await;
    let locker = Locker::new(server.client().await);
    let opts = LockOptions::new().with_ttl(Duration::from_millis(300));
    for round in 0..3 {
        let stall = {
            let admin = admin.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let _: Value = common::cmd(&admin, "DEBUG SLEEP 0.5", vec![]).await;
            })
        };
        let started = Instant::now();
        let r = locker
            .run("stalled", &opts, |_ctx| async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok::<_, Error>(round)
            })
            .await;
        stall.await.expect("stall");
        assert_eq!(
            r.expect("the section ended within the lease"),
            round,
            "round {round}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(600),
            "the release waited out the stall"
        );
    }
    assert_eq!(locker.stats().late_releases, 3);
    assert_eq!(locker.stats().locks_lost, 0);
}

/// The other side of the rule: a lock deleted while the section runs is lost, and the release
/// that finds it gone answers within the lease: `run` says `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_that_vanished_during_the_section_is_expired_at_its_end() {
    let (_s, client, locker) = setup().await;
    let opts = LockOptions::new().with_ttl(Duration::from_secs(10));
    let r = locker
        .run("vanishing", &opts, |_ctx| async {
            let _: i64 = client
                .del(common::lock_key("vanishing"))
                .await
                .expect("DEL");
            Ok::<_, Error>(())
        })
        .await;
    assert!(
        matches!(
            r,
            Err(Error::Expired {
                reason: LossReason::TokenGone,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(locker.stats().late_releases, 0);
}

/// Review 2, finding 1: `extend` to a shorter TTL shortened Redis' lease while the guard kept
/// its longer `valid_until`, so a second holder took the key while both guards read valid.
/// Now the guard follows: valid until the send plus the new TTL (less the margin), and once
/// Redis let the key go, the first guard's validity has passed.
#[tokio::test]
async fn a_shorter_extend_shortens_the_guards_validity() {
    let (_s, client, a) = setup().await;
    let b = Locker::new(client.clone());
    let opts = LockOptions::new().with_ttl(Duration::from_secs(10));
    let mut ga = a.acquire("shorter", &opts).await.expect("a acquires");
    let sent = Instant::now();
    ga.extend(Duration::from_millis(300)).await.expect("extend");
    let left = ga.valid_until().saturating_duration_since(Instant::now());
    assert!(
        ga.valid_until() <= sent + Duration::from_millis(300),
        "after extend(300 ms) the guard says valid for {left:?} more"
    );
    let pttl: i64 = client.pttl(lock_key("shorter")).await.expect("PTTL");
    assert!(pttl <= 300, "Redis holds it {pttl} ms");
    // Wait for Redis to let it go (the event, not a clock), then B takes it.
    let gb = loop {
        match b.acquire("shorter", &opts).await {
            Ok(g) => break g,
            Err(Error::Locked { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(e) => panic!("b: {e}"),
        }
    };
    assert!(
        ga.valid_until() <= Instant::now(),
        "two valid holders: a's guard says valid for {:?} more, b holds fence {}",
        ga.valid_until().saturating_duration_since(Instant::now()),
        gb.fence()
    );
    gb.release().await.expect("b releases");
}

/// The same for a semaphore of one permit: a shorter `extend` of the permit's lease counts in
/// the guard, so the weight of guards that read valid never exceeds the permits.
#[tokio::test]
async fn a_shorter_extend_of_a_permit_shortens_the_guards_validity() {
    let (_s, client, a) = setup().await;
    let b = Locker::new(client);
    let opts = LockOptions::new().with_ttl(Duration::from_secs(10));
    let (sa, sb) = (
        a.semaphore(1).expect("semaphore"),
        b.semaphore(1).expect("semaphore"),
    );
    let mut ga = sa.acquire("shorter-permit", 1, &opts).await.expect("a");
    let sent = Instant::now();
    ga.extend(Duration::from_millis(300)).await.expect("extend");
    assert!(ga.valid_until() <= sent + Duration::from_millis(300));
    let gb = common::take_over_permit(&sb, "shorter-permit", &opts, &ga).await;
    gb.release().await.expect("b releases");
}

/// A keep-alive racing user `extend`s of other TTLs, shorter and longer: whatever the order
/// Redis ran them in, the guard never says valid for longer than Redis holds the key. (With
/// the refresher's TTL read at its loop's start and the larger deadline kept, a refresh sent
/// after a longer extend shortened Redis' lease behind the guard.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_racing_extends_never_outruns_redis() {
    let (_s, client, locker) = setup().await;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_millis(400))
        .with_refresh_ratio(0.05);
    let mut g = locker.acquire("race", &opts).await.expect("acquire");
    let lost = g.keep_alive();
    let ttls = [5_000u64, 400, 3_000, 300, 8_000, 350];
    for i in 0..120 {
        let ttl = Duration::from_millis(ttls[i % ttls.len()]);
        g.extend(ttl).await.expect("extend");
        // Whatever ran last in Redis: the guard's deadline is never past Redis' expiry. Read
        // the deadline first; Redis' expiry can only move later meanwhile (the refresher sends
        // the TTL of the last extend, from a later time).
        let valid_until = g.valid_until();
        let pttl: i64 = client.pttl(lock_key("race")).await.expect("PTTL");
        let expiry = Instant::now() + Duration::from_millis(pttl.max(0) as u64 + 1);
        assert!(
            valid_until <= expiry,
            "round {i}: the guard says valid {:?} past Redis' expiry (PTTL {pttl} ms after extend({ttl:?}))",
            valid_until - expiry
        );
        tokio::time::sleep(Duration::from_millis((i % 7) as u64)).await;
    }
    assert!(!lost.is_cancelled(), "lost: {:?}", g.loss());
    g.release().await.expect("release");
}

/// `FUNCTION LOAD`s the server has run (`INFO commandstats`).
async fn library_loads(client: &Client) -> u64 {
    common::server_info::commandstats(client)
        .await
        .get("function|load")
        .copied()
        .unwrap_or(0)
}

/// After a function flush (or a restart without persistence, or a new node), every call in
/// flight meets "Function not found" at once: the library is loaded once, not once per call
/// (review 3: the first refresh period after a server start sent 80-158 calls and loaded the
/// refresh script for each batch). 200 acquisitions at once after a flush; then, after another,
/// the refresh of the 600 locks they hold (five batches of at most 128, sent together).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_library_is_loaded_once_not_once_per_call_in_flight() {
    let (_server, client, locker) = setup().await;
    let flush = || async {
        let ok: String = common::cmd(&client, "FUNCTION", vec!["FLUSH".into()]).await;
        assert_eq!(ok, "OK");
    };
    flush().await;
    let before = library_loads(&client).await;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_refresh_ratio(0.05);
    let takes = (0..200).map(|i| {
        let (locker, opts) = (locker.clone(), opts.clone());
        tokio::spawn(async move { locker.acquire(&format!("ld-{i}"), &opts).await })
    });
    let mut guards = Vec::new();
    for t in takes.collect::<Vec<_>>() {
        guards.push(t.await.expect("task").expect("acquire after a flush"));
    }
    let loads = library_loads(&client).await - before;
    let missed = common::fcall_stats(&client).await;
    println!("200 acquisitions after a flush: FCALL {missed}");
    assert_eq!(
        loads, 1,
        "200 acquisitions after a flush loaded the library {loads} times"
    );
    for i in 200..600 {
        guards.push(
            locker
                .acquire(&format!("ld-{i}"), &opts)
                .await
                .expect("acquire"),
        );
    }
    let losses: Vec<_> = guards.iter_mut().map(|g| g.keep_alive()).collect();
    // The refresher's batches after another flush: the first load is the event waited for;
    // then another refresh period, for any batch that met "not found" late.
    flush().await;
    let before = library_loads(&client).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while library_loads(&client).await == before {
        assert!(
            Instant::now() < deadline,
            "no refresh in 60 s after the flush"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for (g, lost) in guards.iter().zip(&losses) {
        assert!(!lost.is_cancelled(), "{} lost: {:?}", g.key(), g.loss());
    }
    let loads = library_loads(&client).await - before;
    assert_eq!(
        loads, 1,
        "the refreshes of 600 locks loaded the library {loads} times"
    );
    for g in guards {
        g.release().await.expect("release");
    }
}

/// Review 3, finding 4: the locks the batched call leaves to their own extend script (those
/// with waiters queued) are extended together, not one after another. Through a link with
/// 40 ms of latency, 64 contended locks with a TTL of 1.5 s: extended in turn, the last would
/// go out 64 round trips (2.6 s) after the first, past its TTL, and be lost; together they
/// all go out at once. Held for three TTLs, none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contended_locks_are_extended_together_not_in_turn() {
    let server = RedisServer::start();
    let far = common::latency::Latency::start(server.port, Duration::from_millis(40)).await;
    let holder = Locker::connect(&far.url())
        .await
        .expect("connect through the proxy")
        .build()
        .expect("locker");
    let waiter = common::queued_locker(&server.url()).await;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_millis(1_500))
        .with_refresh_ratio(0.3);
    let keys: Vec<String> = (0..64).map(|i| format!("far-{i}")).collect();
    let takes = keys.iter().map(|k| {
        let (holder, opts, k) = (holder.clone(), opts.clone(), k.clone());
        tokio::spawn(async move { holder.acquire(&k, &opts).await })
    });
    let mut guards = Vec::new();
    for t in takes.collect::<Vec<_>>() {
        guards.push(t.await.expect("task").expect("acquire"));
    }
    let losses: Vec<_> = guards.iter_mut().map(|g| g.keep_alive()).collect();
    let mut waits = Vec::new();
    for k in &keys {
        let (w, k2) = (waiter.clone(), k.clone());
        waits.push(tokio::spawn(async move {
            let opts = LockOptions::new().with_wait(Duration::from_secs(120));
            w.acquire_wait(&k2, &opts).await
        }));
        common::lock_queued(&waiter, k, 1).await.expect("queued");
    }
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let lost: Vec<_> = guards
        .iter()
        .zip(&losses)
        .filter(|(_, l)| l.is_cancelled())
        .map(|(g, _)| format!("{} ({:?})", g.key(), g.loss()))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of 64 contended locks lost, the first: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    for g in guards {
        g.release().await.expect("release");
    }
    for w in waits {
        let g = w.await.expect("task").expect("the waiter is granted");
        g.release().await.expect("release");
    }
}
