//! The polling `Locker` against a real private redis-server.

mod common;

use common::{fence_key, hold_keys, lock_key, tight, RedisServer};
use std::sync::Arc;
use std::time::Duration;
use waitlock::fred::prelude::*;
use waitlock::{Error, LockOptions, Locker, Op};

async fn setup() -> (RedisServer, Client, Locker) {
    let server = RedisServer::start();
    let client = server.client().await;
    let locker = Locker::new(client.clone());
    (server, client, locker)
}

async fn raw_get(client: &Client, name: &str) -> Option<String> {
    client.get(name).await.expect("GET")
}

#[tokio::test]
async fn mutual_exclusion_over_two_clients() {
    let server = RedisServer::start();
    let a = Locker::new(server.client().await);
    let b = Locker::new(server.client().await);
    let counter = server.client().await;
    let opts = tight()
        .with_wait(Duration::from_secs(30))
        .with_ttl(Duration::from_secs(10));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let locker = if i % 2 == 0 { a.clone() } else { b.clone() };
        let counter = counter.clone();
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                let guard = locker
                    .acquire_wait("counter", &opts)
                    .await
                    .expect("acquire");
                let v: Option<i64> = counter.get("count").await.expect("GET");
                tokio::task::yield_now().await;
                let _: () = counter
                    .set("count", v.unwrap_or(0) + 1, None, None, false)
                    .await
                    .expect("SET");
                guard.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let v: i64 = counter.get("count").await.expect("GET");
    assert_eq!(v, 16 * 20, "a lost update means two holders overlapped");
}

#[tokio::test]
async fn fences_increase_across_holders_expiry_and_eviction() {
    let (_s, client, locker) = setup().await;
    let opts = LockOptions::new().with_ttl(Duration::from_millis(50));
    let mut last = 0u64;
    for round in 0..5 {
        let g = locker.acquire("fenced", &opts).await.expect("acquire");
        assert!(
            g.fence() > last,
            "round {round}: fence {} after {last}",
            g.fence()
        );
        last = g.fence();
        if round % 2 == 0 {
            g.release().await.expect("release");
        } else {
            std::mem::forget(g); // let it expire instead
            let _ = locker
                .acquire_wait("fenced", &tight())
                .await
                .map(std::mem::forget);
            let _: i64 = client.del(&lock_key("fenced")).await.expect("DEL");
        }
    }
    // The fence counter itself is evicted: fences still grow (they are floored by Redis TIME).
    let _: i64 = client.del(&fence_key("fenced")).await.expect("DEL");
    let g = locker
        .acquire("fenced", &opts)
        .await
        .expect("acquire after eviction");
    assert!(
        g.fence() > last,
        "fence {} after eviction, earlier {last}",
        g.fence()
    );
}

#[tokio::test]
async fn fences_grow_across_a_redis_restart() {
    let (mut server, _client, locker) = setup().await;
    let g = locker
        .acquire("restart", &LockOptions::new())
        .await
        .expect("acquire");
    let before = g.fence();
    std::mem::forget(g);
    server.restart();
    let client = server.client().await;
    let locker = Locker::new(client);
    let g = locker
        .acquire("restart", &LockOptions::new())
        .await
        .expect("acquire after restart");
    assert!(
        g.fence() > before,
        "fence {} after restart, earlier {before}",
        g.fence()
    );
}

#[tokio::test]
async fn wrong_token_gets_not_held_and_leaves_the_lock() {
    let (_s, client, locker) = setup().await;
    let g = locker
        .acquire("owned", &LockOptions::new())
        .await
        .expect("acquire");
    let ttl = Duration::from_secs(5);
    assert!(
        matches!(locker.extend("owned", "intruder", ttl).await, Err(Error::NotHeld { key }) if key == "owned")
    );
    assert!(matches!(
        locker.unlock("owned", "intruder").await,
        Err(Error::NotHeld { .. })
    ));
    // The value is a state letter ('p': nobody queued) and the holder's token.
    assert_eq!(
        raw_get(&client, &lock_key("owned")).await,
        Some(format!("p{}", g.token()))
    );
    let pttl: i64 = client.pttl(&lock_key("owned")).await.expect("PTTL");
    assert!(pttl > 25_000, "TTL changed by a wrong token: {pttl}");
    g.release().await.expect("release");
    assert_eq!(raw_get(&client, &lock_key("owned")).await, None);
}

#[tokio::test]
async fn token_level_control_as_in_the_seeds() {
    let (_s, client, locker) = setup().await;
    let ttl = Duration::from_secs(10);
    let f1 = locker
        .try_lock("manual", "tok-1", ttl)
        .await
        .expect("try_lock");
    assert!(matches!(
        locker.try_lock("manual", "tok-1", ttl).await,
        Err(Error::AlreadyHeld {
            remaining_ttl: Some(_),
            ..
        })
    ));
    assert!(matches!(
        locker.try_lock("manual", "tok-2", ttl).await,
        Err(Error::Locked {
            remaining_ttl: Some(_),
            ..
        })
    ));
    locker
        .extend("manual", "tok-1", Duration::from_secs(100))
        .await
        .expect("extend");
    let pttl: i64 = client.pttl(&lock_key("manual")).await.expect("PTTL");
    assert!(pttl > 90_000, "extend did not set the TTL: {pttl}");
    locker.unlock("manual", "tok-1").await.expect("unlock");
    assert!(matches!(
        locker.unlock("manual", "tok-1").await,
        Err(Error::NotHeld { .. })
    ));
    let f2 = locker
        .try_lock("manual", "tok-2", ttl)
        .await
        .expect("try_lock again");
    assert!(f2 > f1);
}

#[tokio::test]
async fn expiry_frees_the_lock_and_locked_reports_the_ttl() {
    let (_s, _c, locker) = setup().await;
    let g = locker
        .acquire(
            "exp",
            &LockOptions::new().with_ttl(Duration::from_millis(100)),
        )
        .await
        .expect("acquire");
    match locker.acquire("exp", &LockOptions::new()).await {
        Err(Error::Locked {
            key,
            remaining_ttl: Some(r),
        }) => {
            assert_eq!(key, "exp");
            assert!(r <= Duration::from_millis(100));
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    // With the default backoff (1 s base, 1 min cap) the wait is still cut to the holder's TTL.
    let started = std::time::Instant::now();
    let g2 = locker
        .acquire_wait("exp", &LockOptions::new())
        .await
        .expect("takes the expired lock");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "waited {:?} for a 100 ms TTL",
        started.elapsed()
    );
    assert!(g2.fence() > g.fence());
    assert!(
        matches!(g.release().await, Err(Error::NotHeld { .. })),
        "old holder must not release the new one"
    );
    g2.release().await.expect("release");
}

#[tokio::test]
async fn acquire_wait_honours_its_deadline_and_wait_zero() {
    let (_s, _c, locker) = setup().await;
    let _held = locker
        .acquire("busy", &LockOptions::new())
        .await
        .expect("acquire");
    let started = std::time::Instant::now();
    match locker
        .acquire_wait("busy", &tight().with_wait(Duration::from_millis(200)))
        .await
    {
        Err(Error::WaitTimeout {
            key,
            waited,
            attempts,
        }) => {
            assert_eq!(key, "busy");
            assert!(
                waited >= Duration::from_millis(200),
                "gave up early: {waited:?}"
            );
            assert!(attempts >= 2);
        }
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "hung past the deadline"
    );
    match locker
        .acquire_wait("busy", &LockOptions::new().with_wait(Duration::ZERO))
        .await
    {
        Err(Error::Locked { .. }) => {}
        other => panic!("wait = 0 tries once: expected Locked, got {other:?}"),
    }
}

// Bad input (keys, options, tokens, builders, URLs) is one table: `scenario_bad_input` in
// tests/faults.rs, run against both strategies.

#[tokio::test]
async fn odd_keys_work() {
    let (_s, _c, locker) = setup().await;
    let long = "k".repeat(1024);
    for key in [
        "{braced}",
        "a}b{c",
        "with space",
        "ünïcødé 🔒",
        long.as_str(),
    ] {
        let g = locker.acquire(key, &LockOptions::new()).await.expect(key);
        assert!(
            matches!(
                locker.acquire(key, &LockOptions::new()).await,
                Err(Error::Locked { .. })
            ),
            "{key}"
        );
        g.release().await.expect(key);
        locker
            .acquire(key, &LockOptions::new())
            .await
            .expect(key)
            .release()
            .await
            .expect(key);
    }
}

#[tokio::test]
async fn a_foreign_value_under_the_lock_key_is_a_typed_error() {
    let (_s, client, locker) = setup().await;
    let _: i64 = client.rpush(&lock_key("listy"), "x").await.expect("RPUSH");
    match locker.acquire("listy", &LockOptions::new()).await {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, "listy"),
        other => panic!("expected WrongType, got {other:?}"),
    }
    let len: i64 = client.llen(&lock_key("listy")).await.expect("LLEN");
    assert_eq!(len, 1, "the list must be left alone");
}

#[tokio::test]
async fn a_frozen_redis_gives_an_error_within_the_command_timeout() {
    let (mut server, _client, _) = setup().await;
    let locker = Locker::builder(server.client().await)
        .command_timeout(Duration::from_millis(300))
        .build()
        .expect("build");
    server.pause();
    let started = std::time::Instant::now();
    let r = locker.acquire("frozen", &LockOptions::new()).await;
    let took = started.elapsed();
    server.resume();
    assert!(
        matches!(
            r,
            Err(Error::Timeout {
                op: Op::Acquire,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(
        took < Duration::from_secs(2),
        "took {took:?}: a call must not hang"
    );
    // After SIGCONT it works again, and the timed-out attempt left no lock behind.
    locker.idle().await;
    let g = locker
        .acquire_wait("frozen", &tight())
        .await
        .expect("after resume");
    g.release().await.expect("release");
}

#[tokio::test]
async fn a_dropped_guard_frees_the_lock() {
    let (_s, client, locker) = setup().await;
    let g = locker
        .acquire("dropped", &LockOptions::new())
        .await
        .expect("acquire");
    drop(g);
    locker.idle().await;
    assert_eq!(raw_get(&client, &lock_key("dropped")).await, None);
    locker
        .acquire("dropped", &LockOptions::new())
        .await
        .expect("free again")
        .release()
        .await
        .expect("release");
}

#[tokio::test]
async fn a_dropped_acquire_leaves_no_lock() {
    let (_s, client, locker) = setup().await;
    let locker = Arc::new(locker);
    for i in 0..200u64 {
        let l = Arc::clone(&locker);
        let fut = async move { l.acquire("cancelled", &LockOptions::new()).await };
        // Poll a little and drop at varying points.
        let _ = tokio::time::timeout(Duration::from_micros(i * 5), fut)
            .await
            .map(|r| r.map(drop));
    }
    locker.idle().await;
    assert_eq!(
        raw_get(&client, &lock_key("cancelled")).await,
        None,
        "a cancelled acquire left a lock"
    );
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: T) {}
    let client = Client::default();
    let locker = Locker::new(client);
    let opts = LockOptions::new();
    send(locker.acquire("k", &opts));
    send(locker.acquire_wait("k", &opts));
    send(locker.run("k", &opts, |_ctx| async { Ok::<_, Error>(()) }));
}

#[tokio::test]
async fn a_pool_backed_locker_works() {
    let server = RedisServer::start();
    let config = Config::from_url(&server.url()).expect("url");
    let pool = Builder::from_config(config)
        .set_policy(ReconnectPolicy::new_constant(0, 20))
        .build_pool(3)
        .expect("pool");
    pool.init().await.expect("connect pool");
    let locker = Locker::builder_with_pool(pool).build().expect("locker");
    let mut fences = Vec::new();
    for _ in 0..6 {
        // Each call takes the pool's next client; the lock state is the same everywhere.
        let g = locker
            .acquire("pooled", &LockOptions::new())
            .await
            .expect("acquire");
        assert!(matches!(
            locker.acquire("pooled", &LockOptions::new()).await,
            Err(Error::Locked { .. })
        ));
        fences.push(g.fence());
        g.release().await.expect("release");
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
}

#[tokio::test]
async fn stats_count_outcomes_waits_and_losses() {
    let (_s, client, locker) = setup().await;
    let g = locker
        .acquire("counted", &LockOptions::new())
        .await
        .expect("acquire");
    assert!(matches!(
        locker.acquire("counted", &LockOptions::new()).await,
        Err(Error::Locked { .. })
    ));
    let short = common::tight().with_wait(Duration::from_millis(30));
    assert!(matches!(
        locker.acquire_wait("counted", &short).await,
        Err(Error::WaitTimeout { .. })
    ));
    let waiter = {
        let l = locker.clone();
        tokio::spawn(async move {
            l.acquire_wait(
                "counted",
                &common::tight().with_wait(Duration::from_secs(5)),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(40)).await;
    g.release().await.expect("release");
    let mut g = waiter.await.expect("task").expect("acquire_wait");
    let lost = g.keep_alive();
    let _: i64 = client.del(&lock_key("counted")).await.expect("DEL");
    g.extend(Duration::from_secs(5))
        .await
        .expect_err("not held");
    assert!(lost.is_cancelled());
    drop(g);
    let s = locker.stats();
    assert_eq!(
        (
            s.acquisitions,
            s.locked,
            s.wait_timeouts,
            s.locks_lost,
            s.errors
        ),
        (2, 1, 1, 1, 0),
        "{s:?}"
    );
    assert_eq!(s.wait.count, 1);
    assert!(
        s.wait.p50 >= Duration::from_millis(30) && s.wait.p50 <= s.wait.max,
        "{s:?}"
    );
}

/// A server that may evict keys is refused when connecting (an evicted lock lets a second
/// holder in), with the reason and the setting that fixes it; allowing eviction connects.
#[tokio::test]
async fn a_server_that_evicts_is_refused_at_connect() {
    let server =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-ttl"]);
    let e = Locker::connect(&server.url())
        .await
        .expect_err("an evicting server must be refused");
    let text = e.to_string();
    assert!(
        text.contains("volatile-ttl") && text.contains("noeviction"),
        "{text}"
    );
    let opts = waitlock::ConnectOptions::new().with_eviction_allowed();
    let locker = Locker::connect_with(&server.url(), &opts)
        .await
        .expect("allowed")
        .build()
        .expect("locker");
    let g = locker
        .acquire("k", &LockOptions::new())
        .await
        .expect("acquire");
    g.release().await.expect("release");
    // No limit, or the noeviction policy: fine as they are.
    let ok = RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]);
    let _builder = Locker::connect(&ok.url())
        .await
        .expect("noeviction connects");
}

/// Finding 2: thousands of `Locker` waiters whose wait runs out against a healthy Redis get
/// `WaitTimeout`, never `Timeout` (before the fix: up to 1,943 of 3,000 got a `Timeout` of the
/// 5 ms last-attempt grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_redis_gives_wait_timeout_at_the_deadline() {
    let server = RedisServer::start();
    let locker = Locker::new(server.client().await);
    let _held = hold_keys(&locker, "busy", 1).await;
    let opts = LockOptions::new().with_wait(Duration::from_millis(200));
    let tasks: Vec<_> = (0..3000)
        .map(|_| {
            let (l, o) = (locker.clone(), opts.clone());
            tokio::spawn(async move { l.acquire_wait("busy-0", &o).await })
        })
        .collect();
    let mut other = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Err(Error::WaitTimeout { .. }) => {}
            r => other.push(format!("{r:?}")),
        }
    }
    assert!(
        other.is_empty(),
        "{} of 3000 did not end with WaitTimeout, e.g. {:?}",
        other.len(),
        other.first()
    );
}
