//! The queued `Locker<Queue>`: waiters woken by the release, against a real private
//! redis-server.

mod common;

use common::{
    eventually, hold_keys, listeners, lock_channels, lock_key, pubsub_connections, tight,
    RedisServer, Seeded,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::{Error, LockOptions, Locker, Queue};

/// Starts one `acquire_wait` in a task and returns once it is queued in Redis (its
/// subscription confirmed, its queueing attempt run).
async fn registered_waiter(
    locker: &Locker<Queue>,
    key: &'static str,
    opts: &LockOptions,
) -> tokio::task::JoinHandle<waitlock::Result<waitlock::LockGuard>> {
    let before = locker.registry_size().waiters;
    let queued_before = locker.status(key).await.expect("status").queued;
    let waiter = {
        let (locker, opts) = (locker.clone(), opts.clone());
        tokio::spawn(async move { locker.acquire_wait(key, &opts).await })
    };
    eventually("waiter registered", Duration::from_secs(10), || {
        locker.registry_size().waiters > before
    })
    .await;
    locker.subscriptions_settled().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while locker.status(key).await.expect("status").queued <= queued_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    waiter
}

async fn handoff_is_driven_by_notifications(server: RedisServer) {
    let a = common::queued_locker(&server.url()).await;
    let b = common::queued_locker(&server.url()).await;
    // Default backoff (1 s base): a timer wake would take long, notifications must do the work.
    let opts = LockOptions::new().with_wait(Duration::from_secs(20));
    let handoffs = Arc::new(AtomicU64::new(0));
    let last_owner = Arc::new(AtomicU64::new(u64::MAX));
    let mut tasks = Vec::new();
    for (id, locker) in [(0u64, a.clone()), (1, b.clone())] {
        let (opts, handoffs, last_owner) = (opts.clone(), handoffs.clone(), last_owner.clone());
        tasks.push(tokio::spawn(async move {
            while handoffs.load(Ordering::SeqCst) < 1000 {
                let g = locker
                    .acquire_wait("baton", &opts)
                    .await
                    .expect("no waiter may time out");
                if last_owner.swap(id, Ordering::SeqCst) != id {
                    handoffs.fetch_add(1, Ordering::SeqCst);
                }
                g.release().await.expect("release");
                // Let the other side win the next round most of the time.
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    let (sa, sb) = (a.stats().wakes, b.stats().wakes);
    let notified = sa.by_notification + sb.by_notification;
    let timer = sa.by_timer + sb.by_timer;
    println!(
        "handoffs {} notification wakes {notified} timer wakes {timer}",
        handoffs.load(Ordering::SeqCst)
    );
    assert!(notified > 0);
    assert!(
        notified * 100 >= (notified + timer) * 99,
        "only {notified} of {} wakes were notifications",
        notified + timer
    );
    assert_eq!(a.registry_size().waiters + b.registry_size().waiters, 0);
}

async fn a_crashed_holder_is_replaced_promptly_after_its_ttl(server: RedisServer) {
    let locker = common::queued_locker(&server.url()).await;
    let holder = Locker::new(server.client().await);
    let g = holder
        .acquire(
            "crash",
            &LockOptions::new().with_ttl(Duration::from_millis(300)),
        )
        .await
        .expect("acquire");
    std::mem::forget(g); // never released: no PUBLISH ever comes
    let started = std::time::Instant::now();
    let g = locker
        .acquire_wait("crash", &LockOptions::new())
        .await
        .expect("takes the expired lock");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "took {took:?} for a 300 ms TTL (backoff base 1 s)"
    );
    assert!(locker.stats().wakes.by_timer >= 1, "woken by the TTL timer");
    g.release().await.expect("release");
}

async fn dropped_waiters_leave_no_registry_entry_and_no_subscription(server: RedisServer) {
    let admin = server.client().await;
    let locker = common::queued_locker(&server.url()).await;
    let holder = Locker::new(server.client().await);
    let held = hold_keys(&holder, "sweep", 10).await;
    let opts = tight().with_wait(Duration::from_secs(10));
    let mut rng = Seeded::new(0x2545_f491_4f6c_dd1d);
    let mut tasks = Vec::new();
    for i in 0..1000u64 {
        let cut = rng.below(Duration::from_millis(20));
        let (locker, opts) = (locker.clone(), opts.clone());
        let key = format!("sweep-{}", i % 11); // sweep-10 is free: some waits succeed
        tasks.push(tokio::spawn(async move {
            if let Ok(Ok(g)) = tokio::time::timeout(cut, locker.acquire_wait(&key, &opts)).await {
                g.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(locker.registry_size().keys, 0);
    assert_eq!(locker.registry_size().waiters, 0);
    locker.subscriptions_settled().await;
    for k in 0..11 {
        let key = format!("sweep-{k}");
        assert_eq!(common::listeners(&admin, &key).await, 0, "{key}");
        // Departures run in background tasks: wait for them before reading the queue.
        locker.idle().await;
        assert_eq!(common::queued(&admin, &key).await, 0, "{key}");
    }
    assert_eq!(lock_channels(&admin).await, 0);
    locker.idle().await;
    let free: Option<String> = admin
        .get::<Option<String>, _>(&lock_key("sweep-10"))
        .await
        .expect("GET");
    assert_eq!(free, None, "a dropped waiter left the free key locked");
    drop(held);
}

use waitlock::fred::prelude::*;

async fn waiters_survive_a_killed_subscriber_connection(server: RedisServer) {
    let admin = server.client().await;
    let locker = common::queued_locker(&server.url()).await;
    let holder = Locker::new(server.client().await);
    let g = holder
        .acquire("killsub", &LockOptions::new())
        .await
        .expect("hold");
    let opts = LockOptions::new().with_wait(Duration::from_secs(15));
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (locker, opts) = (locker.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let g = locker.acquire_wait("killsub", &opts).await?;
            g.release().await
        }));
    }
    eventually("5 waiters registered", Duration::from_secs(10), || {
        locker.registry_size().waiters == 5
    })
    .await;
    locker.subscriptions_settled().await;
    let killed: i64 = common::cmd(&admin, "CLIENT KILL TYPE pubsub", vec![]).await;
    assert_eq!(killed, 1, "exactly one subscriber connection");
    g.release().await.expect("release");
    for t in tasks {
        t.await
            .expect("task")
            .expect("every waiter acquires and releases");
    }
    assert!(locker.stats().wakes.reconnects >= 1, "{:?}", locker.stats());
}

async fn waiters_survive_or_fail_cleanly_across_a_redis_restart(mut server: RedisServer) {
    let locker = Locker::builder(server.client().await)
        .command_timeout(Duration::from_millis(500))
        .queued()
        .build()
        .await
        .expect("locker");
    let holder = Locker::new(server.client().await);
    let _g = holder
        .acquire("restart", &LockOptions::new())
        .await
        .expect("hold");
    let wait = Duration::from_secs(5);
    let opts = tight().with_wait(wait);
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (locker, opts) = (locker.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let r = locker.acquire_wait("restart", &opts).await;
            let took = started.elapsed();
            (r.map(std::mem::forget), took)
        }));
    }
    eventually("5 waiters registered", Duration::from_secs(10), || {
        locker.registry_size().waiters == 5
    })
    .await;
    server.restart(); // the held lock vanishes with the data
    let mut acquired = 0;
    for t in tasks {
        let (r, took) = tokio::time::timeout(wait + Duration::from_secs(3), t)
            .await
            .expect("a waiter hung past its deadline")
            .expect("task");
        assert!(
            took < wait + Duration::from_secs(1),
            "returned {took:?} after a {wait:?} wait"
        );
        match r {
            Ok(()) => acquired += 1,
            Err(e) => assert!(
                matches!(
                    e,
                    Error::WaitTimeout { .. } | Error::Timeout { .. } | Error::Redis { .. }
                ),
                "unclear error: {e:?}"
            ),
        }
    }
    assert_eq!(
        acquired, 1,
        "exactly one waiter holds the lock after the restart (they never release)"
    );
}

async fn a_thousand_waiters_on_a_hundred_keys_share_one_subscriber(server: RedisServer) {
    let admin = server.client().await;
    let locker = common::queued_locker(&server.url()).await;
    let holder = Locker::new(server.client().await);
    let held = hold_keys(&holder, "scale", 100).await;
    let opts = LockOptions::new().with_wait(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for i in 0..1000 {
        let (locker, opts) = (locker.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let g = locker
                .acquire_wait(&format!("scale-{}", i % 100), &opts)
                .await
                .expect("acquire");
            g.release().await.expect("release");
        }));
    }
    eventually("1000 waiters registered", Duration::from_secs(20), || {
        locker.registry_size().waiters == 1000
    })
    .await;
    assert_eq!(locker.registry_size().keys, 100);
    locker.subscriptions_settled().await;
    assert_eq!(
        pubsub_connections(&admin).await,
        1,
        "one subscriber connection for all waiters"
    );
    assert_eq!(lock_channels(&admin).await, 100);
    for g in held {
        g.release().await.expect("release");
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(locker.registry_size().keys, 0);
    locker.subscriptions_settled().await;
    assert_eq!(lock_channels(&admin).await, 0);
    // Heads whose backoff timer fired while the holders held on are legitimate timer wakes
    // here; what matters is that every release woke its key's next waiter.
    let s = locker.stats().wakes;
    assert!(s.by_notification >= 900, "{s:?}");
}

async fn releases_by_a_plain_locker_or_unlock_wake_pubsub_waiters(server: RedisServer) {
    let locker = common::queued_locker(&server.url()).await;
    let plain = Locker::new(server.client().await);
    // Default backoff: without the notification the waiter would sleep up to a second.
    let opts = LockOptions::new().with_wait(Duration::from_secs(10));

    let g = plain
        .acquire("interop", &LockOptions::new())
        .await
        .expect("hold");
    let waiter = registered_waiter(&locker, "interop", &opts).await;
    g.release().await.expect("release");
    waiter
        .await
        .expect("task")
        .expect("acquire")
        .release()
        .await
        .expect("release");

    plain
        .try_lock("interop", "manual", Duration::from_secs(30))
        .await
        .expect("try_lock");
    let waiter = registered_waiter(&locker, "interop", &opts).await;
    plain.unlock("interop", "manual").await.expect("unlock");
    waiter
        .await
        .expect("task")
        .expect("acquire")
        .release()
        .await
        .expect("release");
    assert_eq!(
        locker.stats().wakes.by_notification,
        2,
        "{:?}",
        locker.stats()
    );
}

async fn processes_take_turns_under_sustained_contention(server: RedisServer) {
    // Three lockers, three subscriber connections: three "processes" as Redis sees them.
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(common::queued_locker(&server.url()).await);
    }
    let opts = LockOptions::new().with_wait(Duration::from_secs(30));
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (p, locker) in lockers.iter().enumerate() {
        for _ in 0..2 {
            let (locker, opts, total) = (locker.clone(), opts.clone(), total.clone());
            tasks.push(tokio::spawn(async move {
                let mut mine = 0u64;
                while total.load(Ordering::SeqCst) < 300 {
                    let g = locker.acquire_wait("turns", &opts).await.expect("acquire");
                    total.fetch_add(1, Ordering::SeqCst);
                    mine += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await; // the work
                    g.release().await.expect("release");
                }
                (p, mine)
            }));
        }
    }
    let mut per_process = [0u64; 3];
    for t in tasks {
        let (p, n) = t.await.expect("task");
        per_process[p] += n;
    }
    let (min, max) = (
        per_process.iter().min().copied().unwrap_or(0),
        per_process.iter().max().copied().unwrap_or(1),
    );
    let grants: u64 = lockers
        .iter()
        .map(|l| l.stats().wakes.by_notification)
        .sum();
    assert!(grants >= 150, "only {grants} of 300 handoffs came by grant");
    assert!(min * 2 >= max, "unfair across processes: {per_process:?}");
}

async fn dropping_the_locker_closes_its_subscriber_and_stops_its_tasks(server: RedisServer) {
    let admin = server.client().await;
    let connections = |list: String| list.lines().count();
    let before = connections(common::cmd(&admin, "CLIENT LIST", vec![]).await);
    let locker = common::queued_locker(&server.url()).await; // its own command client plus one subscriber
    let with = connections(common::cmd(&admin, "CLIENT LIST", vec![]).await);
    assert_eq!(with, before + 2);
    let g = locker
        .acquire("bye", &LockOptions::new())
        .await
        .expect("acquire");
    g.release().await.expect("release");
    let client = locker.client().clone();
    drop(locker);
    let _ = client.quit().await;
    // Nothing keeps the hub alive: its tasks end and the subscriber connection closes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = connections(common::cmd(&admin, "CLIENT LIST", vec![]).await);
        if now == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{now} connections remain, {before} expected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn the_pubsub_kind_is_detected_once_at_start() {
    let sharded = RedisServer::start();
    assert!(common::queued_locker(&sharded.url())
        .await
        .uses_sharded_pubsub());
    let classic = RedisServer::start_classic();
    assert!(!common::queued_locker(&classic.url())
        .await
        .uses_sharded_pubsub());
}

/// Every test above runs twice: against a Redis with sharded pub/sub (SSUBSCRIBE/SPUBLISH), and
/// against one without it, where the lockers fall back to classic PUBLISH/SUBSCRIBE.
macro_rules! on_both_pubsub_kinds {
    ($( #[$attr:meta] $name:ident; )*) => {
        mod sharded {
            use super::*;
            $( #[$attr] async fn $name() { super::$name(RedisServer::start()).await } )*
        }
        mod classic {
            use super::*;
            $( #[$attr] async fn $name() { super::$name(RedisServer::start_classic()).await } )*
        }
    };
}

on_both_pubsub_kinds! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] handoff_is_driven_by_notifications;
    #[tokio::test] a_crashed_holder_is_replaced_promptly_after_its_ttl;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] dropped_waiters_leave_no_registry_entry_and_no_subscription;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] waiters_survive_a_killed_subscriber_connection;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] waiters_survive_or_fail_cleanly_across_a_redis_restart;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] a_thousand_waiters_on_a_hundred_keys_share_one_subscriber;
    #[tokio::test] releases_by_a_plain_locker_or_unlock_wake_pubsub_waiters;
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)] processes_take_turns_under_sustained_contention;
    #[tokio::test] dropping_the_locker_closes_its_subscriber_and_stops_its_tasks;
}

/// Finding 1: after the subscriber connection is killed, releases landing while fred
/// reconnects and resubscribes must not be lost: every waiter checks its lock once Redis has
/// confirmed the new subscription, so each key is taken as soon as its release is read
/// (milliseconds on a quiet machine), never after a timer (the check interval is 0.75-1.25 s; before the fix: 0.36-3.8 s in
/// 5-15% of rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wake_up_is_lost_across_a_subscriber_reconnect() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let holder = Locker::new(server.client().await);
    let locker = common::queued_locker(&server.url()).await;
    let opts = LockOptions::new().with_wait(Duration::from_secs(20));
    let (keys, per_key, rounds) = (200, 5, 12);
    let mut worst = Duration::ZERO;
    for round in 0..rounds {
        let prefix = format!("reconnect-{round}");
        let held = hold_keys(&holder, &prefix, keys).await;
        let mut waiters = Vec::new();
        for k in 0..keys {
            for _ in 0..per_key {
                let (l, o, key) = (locker.clone(), opts.clone(), format!("{prefix}-{k}"));
                waiters.push(tokio::spawn(async move {
                    let g = l.acquire_wait(&key, &o).await.expect("acquire_wait");
                    let at = Instant::now();
                    g.release().await.expect("release");
                    (key, at)
                }));
            }
        }
        eventually("all waiters registered", Duration::from_secs(20), || {
            locker.registry_size().waiters == keys * per_key
        })
        .await;
        for k in 0..keys {
            let key = format!("{prefix}-{k}");
            let deadline = Instant::now() + Duration::from_secs(20);
            while holder.status(&key).await.expect("status").queued < per_key {
                assert!(Instant::now() < deadline, "{key}: waiters never queued");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let reconnects = locker.stats().wakes.reconnects;
        let _: Value = common::cmd(&admin, "CLIENT KILL TYPE pubsub", vec![]).await;
        // Noticed at once (not on a 1 ms poll): the race is in the first milliseconds.
        let deadline = Instant::now() + Duration::from_secs(10);
        while locker.stats().wakes.reconnects == reconnects {
            assert!(Instant::now() < deadline, "fred never reconnected");
            tokio::task::yield_now().await;
        }
        // Releases spread over the first ~10 ms after the reconnect, while the channels are
        // being subscribed again.
        let releases: Vec<_> = held
            .into_iter()
            .enumerate()
            .map(|(k, g)| {
                let key = format!("{prefix}-{k}");
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_micros(50 * k as u64)).await;
                    g.release().await.expect("release");
                    (key, Instant::now())
                })
            })
            .collect();
        let mut released = std::collections::HashMap::new();
        for r in releases {
            let (key, at) = r.await.expect("release task");
            released.insert(key, at);
        }
        let mut first = std::collections::HashMap::new();
        for w in waiters {
            let (key, at) = w.await.expect("waiter");
            let e = first.entry(key).or_insert(at);
            *e = (*e).min(at);
        }
        for (key, at) in first {
            worst = worst.max(at.saturating_duration_since(released[&key]));
        }
    }
    assert!(
        // Far below any fallback: a lost grant waits out its lease (the default TTL, 30 s)
        // or the 100 s last-resort look. The bound is not a speed target: with two CPU
        // burners beside the suite, scheduling 1,000 waking tasks on 2 cores took 724 ms
        // once (milliseconds on a quiet machine).
        worst < Duration::from_secs(5),
        "a key was taken {worst:?} after its release (a wake-up was lost)"
    );
    println!(
        "{rounds} rounds x {} waiters: worst release-to-holder {worst:?}",
        keys * per_key
    );
}

/// Finding 3: `subscriptions_settled()` resolves only after Redis has processed the
/// unsubscribe of a waiter that left (before the fix: the channel still counted a subscriber
/// in 3-17 of 2,000 tries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_means_redis_processed_the_unsubscribe() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let holder = Locker::new(server.client().await);
    let locker = common::queued_locker(&server.url()).await;
    let _held = hold_keys(&holder, "parked", 1).await;
    let opts = LockOptions::new().with_wait(Duration::from_secs(30));
    for i in 0..2000 {
        let waiter = {
            let (l, o) = (locker.clone(), opts.clone());
            tokio::spawn(async move { l.acquire_wait("parked-0", &o).await })
        };
        eventually("waiter registered", Duration::from_secs(10), || {
            locker.registry_size().waiters == 1
        })
        .await;
        locker.subscriptions_settled().await;
        assert_eq!(
            listeners(&admin, "parked-0").await,
            1,
            "try {i}: not subscribed"
        );
        waiter.abort();
        let _ = waiter.await;
        locker.subscriptions_settled().await;
        assert_eq!(
            listeners(&admin, "parked-0").await,
            0,
            "try {i}: still subscribed after subscriptions_settled()"
        );
    }
}

/// Finding 5: a wait that runs out while the subscription stands and the holder's TTL
/// outlasts the deadline sends no attempt beyond its first two (the plain one and the
/// queueing one): no backoff timer fires before the deadline (before the fix: 5.1-5.3 calls per
/// trial, the 1 s-base backoff firing before a 200 ms deadline). While the key's subscription
/// lingers after a wait (2 s), the next wait skips the plain attempt: one attempt.
#[tokio::test]
async fn a_wait_timeout_costs_at_most_two_attempts() {
    let server = RedisServer::start();
    let holder = Locker::new(server.client().await);
    let locker = Arc::new(common::queued_locker(&server.url()).await);
    let _held = hold_keys(&holder, "long", 1).await; // 30 s TTL
    let opts = LockOptions::new().with_wait(Duration::from_millis(200));
    let trials = 20;
    let before = locker.stats().wakes;
    for i in 0..trials {
        let r = locker.acquire_wait("long-0", &opts).await;
        let want = if i == 0 { 2 } else { 1 };
        assert!(
            matches!(r, Err(Error::WaitTimeout { attempts, .. }) if attempts == want),
            "trial {i}: {r:?}"
        );
    }
    let after = locker.stats().wakes;
    assert_eq!(after.attempts - before.attempts, trials + 1);
    assert_eq!(
        after.by_timer - before.by_timer,
        trials,
        "one timer: the deadline"
    );
    locker.idle().await;
    assert_eq!(holder.status("long-0").await.expect("status").queued, 0);
}

/// `PubSubLocker`, the queued locker under its users' name: built from a URL and from a fred
/// client, it is a `Locker<Queue>` (the same type), its waiter is handed the lock by the
/// holder's release, and `run` runs a section under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_locker_is_the_queued_locker() {
    let server = RedisServer::start();
    let a: waitlock::PubSubLocker = waitlock::PubSubLocker::from_url(&server.url())
        .await
        .expect("from a URL");
    let b: Locker<Queue> = waitlock::PubSubLocker::from_client(server.client().await)
        .await
        .expect("from a client");
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30));
    let held = a.acquire_wait("ps", &opts).await.expect("a holds");
    let waiter = {
        let (b, opts) = (b.clone(), opts.clone());
        tokio::spawn(async move { b.acquire_wait("ps", &opts).await })
    };
    common::lock_queued(&b, "ps", 1).await.expect("b queues");
    let first = held.fence();
    held.release().await.expect("release");
    let next = waiter.await.expect("task").expect("b is handed the lock");
    assert!(next.fence() > first);
    next.release().await.expect("release");
    let fence = a
        .run("ps", &opts, |ctx| async move { Ok::<_, Error>(ctx.fence) })
        .await
        .expect("run");
    assert!(fence > first);
    assert_eq!(a.status("ps").await.expect("status").queued, 0);
}
