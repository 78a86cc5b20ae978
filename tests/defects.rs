//! Regression tests for defects found by using the library from the outside (issue 13). Each
//! failed on the code before the queue handoff; the frozen-process finding is in
//! `tests/queue.rs` (it needs processes to freeze).

mod common;

use common::{eventually, hold_keys, listeners, RedisServer};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{Error, LockOptions, Locker, PubSubLocker};

async fn pubsub(server: &RedisServer) -> PubSubLocker {
    Locker::queued(server.client().await)
        .await
        .expect("pubsub locker")
}

/// Finding 1: after the subscriber connection is killed, releases landing while fred
/// reconnects and resubscribes must not be lost: every waiter checks its lock once Redis has
/// confirmed the new subscription, so each key is taken within milliseconds of its release,
/// never after a timer (the check interval is 0.75-1.25 s; before the fix: 0.36-3.8 s in
/// 5-15% of rounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wake_up_is_lost_across_a_subscriber_reconnect() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let holder = Locker::new(server.client().await);
    let locker = pubsub(&server).await;
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
        // Far below any fallback: a lost wake-up would wait for the 100 s last-resort look.
        worst < Duration::from_millis(500),
        "a key was taken {worst:?} after its release (a wake-up was lost)"
    );
    println!(
        "{rounds} rounds x {} waiters: worst release-to-holder {worst:?}",
        keys * per_key
    );
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

/// Finding 3: `subscriptions_settled()` resolves only after Redis has processed the
/// unsubscribe of a waiter that left (before the fix: the channel still counted a subscriber
/// in 3-17 of 2,000 tries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_means_redis_processed_the_unsubscribe() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let holder = Locker::new(server.client().await);
    let locker = pubsub(&server).await;
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
    let locker = Arc::new(pubsub(&server).await);
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
