//! Waiting at scale: idle queued waiters cost Redis (almost) nothing, and nothing piles up.
//! Counts, not timings: calls from `INFO commandstats`, keys from `SCAN` and `PTTL`.

mod common;

use common::RedisServer;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{LockOptions, Locker};

/// Client calls so far (the commands a client sends: scripts, (un)subscribes, pings).
async fn client_calls(admin: &Client) -> u64 {
    let info: String = common::cmd(admin, "INFO commandstats", vec![]).await;
    let calls = common::command_calls(&info);
    [
        "fcall",
        "function|load",
        "evalsha",
        "eval",
        "ssubscribe",
        "sunsubscribe",
        "subscribe",
        "unsubscribe",
        "ping",
    ]
    .iter()
    .map(|c| calls.get(*c).copied().unwrap_or(0))
    .sum()
}

/// Two processes (lockers with one subscriber each) queue 2,000 waiters: 1,000 on one hot key,
/// 1,000 on 100 others. The holders refresh every 3 s (the test sends the refreshes itself, to
/// subtract them). Over 10 s of nothing released, the waiters' calls must stay within 0.02 per
/// waiter per second: they make no call while they wait, the lock's watchers are told each
/// new lease by the refresh, and each subscriber connection is probed once a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_queued_waiters_make_almost_no_calls() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let holder = Locker::new(server.client().await);
    // Held through the queueing below (up to a minute on a busy machine), then refreshed to
    // a 10 s lease every 3 s while the idle waiters are counted.
    let hold = LockOptions::new()
        .with_ttl(Duration::from_secs(120))
        .without_refresh();
    let mut keys = vec!["hot".to_owned()];
    keys.extend((0..100).map(|i| format!("cold-{i}")));
    let mut held = Vec::new();
    for k in &keys {
        held.push(holder.acquire(k, &hold).await.expect("hold"));
    }
    let lockers = [
        Locker::queued(server.client().await).await.expect("a"),
        Locker::queued(server.client().await).await.expect("b"),
    ];
    let opts = LockOptions::new().with_wait(Duration::from_secs(60));
    let mut waiters = Vec::new();
    for (n, l) in lockers.iter().enumerate() {
        for i in 0..1000 {
            let key = if i < 500 {
                "hot".to_owned()
            } else {
                format!("cold-{}", (i + n) % 100)
            };
            let (l, o) = (l.clone(), opts.clone());
            waiters.push(tokio::spawn(async move {
                let g = l.acquire_wait(&key, &o).await.expect("acquire_wait");
                g.release().await.expect("release");
            }));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut queued = 0;
        for k in &keys {
            queued += holder.status(k).await.expect("status").queued;
        }
        if queued == 2000 {
            break;
        }
        assert!(Instant::now() < deadline, "only {queued} of 2,000 queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for g in held.iter_mut() {
        g.extend(Duration::from_secs(10)).await.expect("refresh");
    }
    for l in &lockers {
        l.subscriptions_settled().await;
    }
    let before = client_calls(&admin).await;
    let started = Instant::now();
    let mut refreshes = 0;
    while started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_secs(3)).await;
        for g in held.iter_mut() {
            g.extend(Duration::from_secs(10)).await.expect("refresh");
            refreshes += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The status reads above are not in the window; the refreshes are, and are the holders'.
    let calls = client_calls(&admin).await - before - refreshes;
    let per_waiter_second = calls as f64 / 2000.0 / elapsed;
    println!(
        "2,000 idle waiters (1,000 on one key, 1,000 on 100 keys), 2 processes: {calls} calls in {elapsed:.1} s = {per_waiter_second:.4} per waiter per second"
    );
    assert!(
        per_waiter_second <= 0.02,
        "{calls} calls in {elapsed:.1} s: {per_waiter_second:.4} per waiter per second"
    );
    for g in held {
        g.release().await.expect("release");
    }
    for w in waiters {
        w.await.expect("waiter");
    }
}

/// After uncontended use, only fence counters are left, each for its last lease and the
/// retention at most (here 0.5 s and 2 s); after contended use, no queue, no process record and
/// no subscription once nobody waits. Then, after the lease and the retention, nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_piles_up() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let retention = Duration::from_secs(2);
    let locker = Locker::builder(server.client().await)
        .retention(retention)
        .queued()
        .build()
        .await
        .expect("locker");
    let ttl = Duration::from_millis(500);
    for i in 0..200 {
        let g = locker
            .acquire(&format!("once-{i}"), &LockOptions::new().with_ttl(ttl))
            .await
            .expect("acquire");
        g.release().await.expect("release");
    }
    // Contended: a holder and 20 waiters on 4 keys.
    let opts = LockOptions::new()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(10));
    let mut tasks = Vec::new();
    for i in 0..24 {
        let (l, o) = (locker.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let g = l
                .acquire_wait(&format!("busy-{}", i % 4), &o)
                .await
                .expect("acquire_wait");
            tokio::time::sleep(Duration::from_millis(2)).await;
            g.release().await.expect("release");
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    locker.subscriptions_settled().await;
    locker.idle().await;
    let names = common::lock_names(&admin).await;
    for name in &names {
        assert!(name.ends_with(":fence"), "left behind: {name}");
        let pttl: i64 = common::cmd(&admin, "PTTL", vec![name.clone().into()]).await;
        assert!(
            pttl > 0 && pttl <= (ttl + retention).as_millis() as i64,
            "{name} lives {pttl} ms (lease {ttl:?}, retention {retention:?})"
        );
    }
    assert_eq!(names.len(), 204, "one fence counter per key used");
    assert_eq!(common::lock_channels(&admin).await, 0, "a grant channel");
    tokio::time::sleep(ttl + retention + Duration::from_millis(200)).await;
    // KEYS, not DBSIZE: every key is past its expiry now, but Redis deletes expired keys in
    // sampled background cycles, which lag on a busy machine; KEYS hides expired keys.
    let left = common::lock_names(&admin).await;
    assert!(left.is_empty(), "keys left after the retention: {left:?}");
}
