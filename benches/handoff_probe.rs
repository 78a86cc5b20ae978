//! Where a handoff's time goes: Redis round trips, pub/sub delivery, and the cost of waking an
//! idle process, measured one at a time in one process against a private `redis-server`.
//!
//! `cargo bench --bench handoff_probe`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};
use waitlock::fred::prelude::*;
use waitlock::{LockOptions, Locker, Queue};

const N: usize = 1000;

fn summary(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "p50 {:>6.1} us   p90 {:>6.1} us",
        v[v.len() / 2],
        v[v.len() * 9 / 10]
    )
}

/// Times `N` handoffs: the key is held, one waiter is queued, the holder (after `idle`)
/// releases; the time runs from the release call to the moment the waiter holds the lock.
/// Also returns the attempts and grant deliveries the waiters needed between release and hold.
async fn handoffs(locker: &Locker<Queue>, tag: &str, idle: Duration) -> (Vec<f64>, u64, u64) {
    let mut v = Vec::with_capacity(N);
    let (mut attempts, mut grants) = (0, 0);
    for i in 0..N {
        let key = format!("{tag}{i}");
        let g = locker
            .acquire(&key, &LockOptions::new())
            .await
            .expect("acquire");
        let (l, k) = (locker.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let g = l
                .acquire_wait(&k, &LockOptions::new())
                .await
                .expect("acquire_wait");
            (Instant::now(), g)
        });
        // Queued in Redis (the waiter's queueing attempt has run).
        while locker.status(&key).await.expect("status").queued == 0 {
            tokio::task::yield_now().await;
        }
        if !idle.is_zero() {
            tokio::time::sleep(idle).await; // every thread of the process parks
        }
        let before = locker.stats().wakes;
        let released = Instant::now();
        g.release().await.expect("release");
        let (held, g2) = waiter.await.expect("waiter");
        v.push((held - released).as_secs_f64() * 1e6);
        let after = locker.stats().wakes;
        attempts += after.attempts - before.attempts;
        grants += after.by_notification - before.by_notification;
        g2.release().await.expect("release");
    }
    (v, attempts, grants)
}

fn report(what: &str, (v, attempts, grants): (Vec<f64>, u64, u64)) {
    println!(
        "{what} {}   per handoff: {:.2} deliveries, {:.2} attempts (round trips)",
        summary(v),
        grants as f64 / N as f64,
        attempts as f64 / N as f64
    );
}

#[tokio::main]
async fn main() {
    let server = common::RedisServer::start();
    let url = server.url();
    let locker = Locker::connect(&url)
        .await
        .expect("connect")
        .build()
        .expect("locker");
    let client = locker.client().clone();

    let _held = locker
        .acquire("held", &LockOptions::new())
        .await
        .expect("acquire");
    let mut v = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let _ = locker.acquire("held", &LockOptions::new()).await;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "one acquire attempt (EVALSHA round trip)          {}",
        summary(v)
    );

    // What the replication check costs: acquire + release pairs against a primary with one
    // replica, without and with `require_replicas(1, 1 s)` (one WAIT per acquisition).
    let _replica = common::RedisServer::start_with(&[
        "--replicaof",
        "127.0.0.1",
        &server.port.to_string(),
        "--repl-diskless-sync-delay",
        "0",
    ]);
    let checked = Locker::connect(&url)
        .await
        .expect("connect")
        .require_replicas(1, Duration::from_secs(1))
        .build()
        .expect("locker");
    // The replica must be in sync before the check can pass.
    while checked.acquire("sync", &LockOptions::new()).await.is_err() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (what, l) in [("without", &locker), ("with", &checked)] {
        let mut v = Vec::with_capacity(N);
        for i in 0..N {
            let t = Instant::now();
            let g = l
                .acquire(&format!("pair{i}"), &LockOptions::new())
                .await
                .expect("acquire");
            g.release().await.expect("release");
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        println!(
            "acquire + release, {what:<7} require_replicas(1) {}",
            summary(v)
        );
    }

    let sub = Builder::from_config(Config::from_url(&url).expect("url"))
        .build_subscriber_client()
        .expect("subscriber");
    sub.init().await.expect("connect");
    let mut rx = sub.message_rx();
    sub.ssubscribe("probe").await.expect("ssubscribe");
    let mut v = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let _: i64 = client.spublish("probe", "x").await.expect("spublish");
        let _ = rx.recv().await.expect("message");
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "SPUBLISH until the subscriber has the message     {}",
        summary(v)
    );

    let pubsub = Locker::connect(&url)
        .await
        .expect("connect")
        .queued()
        .build()
        .await
        .expect("pubsub");
    report(
        "handoff, process busy (release -> next holds)   ",
        handoffs(&pubsub, "busy", Duration::ZERO).await,
    );
    report(
        "handoff, process idle 2 ms before the release   ",
        handoffs(&pubsub, "idle", Duration::from_millis(2)).await,
    );

    // The same idle delivery without waitlock's machinery: a task blocked on the raw fred
    // subscriber stream, woken by an SPUBLISH sent after 2 ms of idleness. The floor for one
    // delivery to a parked process.
    let mut v = Vec::with_capacity(N);
    for _ in 0..N {
        let mut rx = sub.message_rx();
        let waiter = tokio::spawn(async move {
            let _ = rx.recv().await;
            Instant::now()
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        let sent = Instant::now();
        let _: i64 = client.spublish("probe", "x").await.expect("spublish");
        let got = waiter.await.expect("waiter");
        v.push((got - sent).as_secs_f64() * 1e6);
    }
    println!(
        "raw fred subscriber, idle 2 ms, SPUBLISH -> woken {}",
        summary(v)
    );
}
