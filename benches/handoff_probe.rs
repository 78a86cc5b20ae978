//! Where a handoff's time goes: Redis round trips, pub/sub delivery, and the cost of waking an
//! idle process, measured one at a time in one process against a private `redis-server`.
//!
//! `cargo bench --bench handoff_probe`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};
use waitlock::fred::prelude::*;
use waitlock::{LockOptions, Locker, PubSubLocker};

const N: usize = 1000;

fn summary(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "p50 {:>6.1} us   p90 {:>6.1} us",
        v[v.len() / 2],
        v[v.len() * 9 / 10]
    )
}

/// Times `N` handoffs: the key is held, one waiter waits, the holder (after `idle`) releases;
/// the time runs from the release call to the moment the waiter holds the lock.
async fn handoffs(locker: &PubSubLocker, tag: &str, idle: Duration) -> Vec<f64> {
    let mut v = Vec::with_capacity(N);
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
        while locker.registry_size().waiters == 0 {
            tokio::task::yield_now().await;
        }
        locker.subscriptions_settled().await;
        if !idle.is_zero() {
            tokio::time::sleep(idle).await; // every thread of the process parks
        }
        let released = Instant::now();
        g.release().await.expect("release");
        let (held, g2) = waiter.await.expect("waiter");
        v.push((held - released).as_secs_f64() * 1e6);
        g2.release().await.expect("release");
    }
    v
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

    let sub = Builder::from_config(Config::from_url(&url).expect("url"))
        .build_subscriber_client()
        .expect("subscriber");
    sub.init().await.expect("connect");
    let mut rx = sub.message_rx();
    sub.subscribe("probe").await.expect("subscribe");
    let _: Value = sub.ping(None).await.expect("ping");
    let mut v = Vec::with_capacity(N);
    for _ in 0..N {
        let t = Instant::now();
        let _: i64 = client.publish("probe", "x").await.expect("publish");
        let _ = rx.recv().await.expect("message");
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    println!(
        "PUBLISH until the subscriber has the message      {}",
        summary(v)
    );

    let pubsub = PubSubLocker::connect(&url)
        .await
        .expect("connect")
        .build_pubsub()
        .await
        .expect("pubsub");
    println!(
        "handoff, process busy (release -> next holds)    {}",
        summary(handoffs(&pubsub, "busy", Duration::ZERO).await)
    );
    println!(
        "handoff, process idle 2 ms before the release    {}",
        summary(handoffs(&pubsub, "idle", Duration::from_millis(2)).await)
    );

    // The same idle handoff without waitlock's machinery: a task blocked on the raw fred
    // subscriber stream, then one acquire attempt. The floor for any pub/sub design.
    let mut v = Vec::with_capacity(N);
    for i in 0..N {
        let key = format!("raw{i}");
        let g = locker
            .acquire(&key, &LockOptions::new())
            .await
            .expect("acquire");
        let channel = format!("{{waitlock:{key}}}:released");
        sub.subscribe(channel.clone()).await.expect("subscribe");
        let _: Value = sub.ping(None).await.expect("ping");
        let mut rx = sub.message_rx();
        let (l, k) = (locker.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let _ = rx.recv().await;
            let g = l.acquire(&k, &LockOptions::new()).await.expect("acquire");
            (Instant::now(), g)
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        let released = Instant::now();
        g.release().await.expect("release");
        let (held, g2) = waiter.await.expect("waiter");
        v.push((held - released).as_secs_f64() * 1e6);
        g2.release().await.expect("release");
        sub.unsubscribe(channel).await.expect("unsubscribe");
    }
    println!(
        "raw fred subscriber + 1 attempt, idle 2 ms       {}",
        summary(v)
    );
}
