//! Both lockers on a local Redis Cluster (3 primaries): handoffs by grant on keys spread over
//! every primary, SCRIPT FLUSH on every node mid-run, and a slot that moves while its lock has
//! queued waiters.

mod common;

use common::cluster::{cli, RedisCluster};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::{LockOptions, Locker, PubSubLocker};

async fn pubsub(url: &str) -> PubSubLocker {
    PubSubLocker::connect(url)
        .await
        .expect("connect to the cluster")
        .build_pubsub()
        .await
        .expect("pubsub locker on the cluster")
}

async fn polling(url: &str) -> Locker {
    Locker::connect(url)
        .await
        .expect("connect to the cluster")
        .build()
        .expect("locker")
}

/// The slot of `key`'s lock (the hash tag is `waitlock:<key>` for plain keys).
fn slot(key: &str) -> u16 {
    waitlock::fred::util::redis_keyslot(format!("waitlock:{key}").as_bytes())
}

/// Sharded subscriber connections per node (`ssub=` non-zero in CLIENT LIST).
fn shard_subscribers(cluster: &RedisCluster) -> Vec<usize> {
    cluster
        .primaries()
        .iter()
        .map(|p| {
            cli(*p, &["client", "list"])
                .lines()
                .filter(|l| {
                    l.split(' ')
                        .any(|f| f.starts_with("ssub=") && f != "ssub=0")
                })
                .count()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoffs_by_grant_on_keys_over_every_primary() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let holder = polling(&url).await;
    let (a, b) = (pubsub(&url).await, pubsub(&url).await);
    assert!(a.uses_sharded_pubsub());
    let keys: Vec<String> = (0..100).map(|i| format!("spread-{i}")).collect();
    let owners: HashSet<u16> = keys.iter().map(|k| cluster.owner(slot(k))).collect();
    assert_eq!(owners.len(), 3, "the keys do not cover every primary");
    let mut held = Vec::new();
    for k in &keys {
        held.push(holder.acquire(k, &LockOptions::new()).await.expect("hold"));
    }
    let busy: Arc<Vec<AtomicBool>> =
        Arc::new(keys.iter().map(|_| AtomicBool::new(false)).collect());
    let overlaps = Arc::new(AtomicU64::new(0));
    let opts = LockOptions::new().with_wait(Duration::from_secs(20));
    let mut waiters = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        for locker in [&a, &b, &a] {
            let (l, k, o, busy, overlaps) = (
                locker.clone(),
                k.clone(),
                opts.clone(),
                busy.clone(),
                overlaps.clone(),
            );
            waiters.push(tokio::spawn(async move {
                let g = l.acquire_wait(&k, &o).await.expect("acquire_wait");
                if busy[i].swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                busy[i].store(false, Ordering::SeqCst);
                g.release().await.expect("release");
            }));
        }
    }
    // Every waiter queued, then the holder lets go of every key.
    for k in &keys {
        let deadline = Instant::now() + Duration::from_secs(20);
        while holder.status(k).await.expect("status").queued < 3 {
            assert!(Instant::now() < deadline, "{k}: waiters never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let subscribers = shard_subscribers(&cluster);
    for g in held {
        g.release().await.expect("release");
    }
    for w in waiters {
        w.await.expect("waiter");
    }
    let (sa, sb) = (a.stats(), b.stats());
    let grants = sa.wakes.by_notification + sb.wakes.by_notification;
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(grants, 300, "handoffs by grant: {sa:?} {sb:?}");
    assert_eq!(sa.wakes.by_timer + sb.wakes.by_timer, 0);
    // One subscriber connection per primary and locker at most.
    assert!(subscribers.iter().all(|n| *n <= 2), "{subscribers:?}");
    a.subscriptions_settled().await;
    b.subscriptions_settled().await;
    a.locker().idle().await;
    for k in &keys {
        assert_eq!(holder.status(k).await.expect("status").queued, 0, "{k}");
    }
    println!("300 handoffs by grant over 3 primaries; shard subscriber connections per primary: {subscribers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_on_every_node_mid_run() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let (a, b) = (pubsub(&url).await, polling(&url).await);
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..6 {
        let (a, b, stop, done) = (a.clone(), b.clone(), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("flushed-{}", t % 3);
            let opts = common::tight().with_wait(Duration::from_secs(10));
            while !stop.load(Ordering::SeqCst) {
                let g = if t % 2 == 0 {
                    a.acquire_wait(&key, &opts).await
                } else {
                    b.acquire_wait(&key, &opts).await
                };
                let g = g.expect("acquire across SCRIPT FLUSH");
                g.release().await.expect("release across SCRIPT FLUSH");
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in cluster.primaries() {
        assert!(cli(p, &["script", "flush"]).contains("OK"));
    }
    let at_flush = done.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("task");
    }
    let after = done.load(Ordering::SeqCst) - at_flush;
    assert!(after > 20, "only {after} acquisitions after SCRIPT FLUSH");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_a_slot_that_moves() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let holder = polling(&url).await;
    let locker = pubsub(&url).await;
    let key = "moving";
    let g = holder
        .acquire(key, &LockOptions::new())
        .await
        .expect("hold");
    let opts = LockOptions::new().with_wait(Duration::from_secs(20));
    let acquired = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let (l, o, acquired) = (locker.clone(), opts.clone(), acquired.clone());
        waiters.push(tokio::spawn(async move {
            let g = l.acquire_wait(key, &o).await.expect("acquire_wait");
            acquired
                .lock()
                .expect("lock")
                .push((Instant::now(), g.fence()));
            tokio::time::sleep(Duration::from_millis(1)).await;
            g.release().await.expect("release");
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while holder.status(key).await.expect("status").queued < 3 {
        assert!(Instant::now() < deadline, "waiters never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Move the lock's slot (lock, fence, queue) to another primary while it is held and
    // waited for: Redis drops the waiters' shard subscription without telling fred.
    let s = slot(key);
    let from = cluster.owner(s);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|p| *p != from)
        .expect("another primary");
    cluster.move_slot(s, to);
    assert_eq!(cluster.owner(s), to);
    let released = Instant::now();
    g.release().await.expect("release after the move");
    for w in waiters {
        w.await.expect("waiter");
    }
    let got = acquired.lock().expect("lock").clone();
    let first = got
        .iter()
        .map(|(at, _)| at.saturating_duration_since(released))
        .min()
        .unwrap_or_default();
    let fences: Vec<u64> = got.iter().map(|(_, f)| *f).collect();
    let mut sorted = fences.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 3, "fences {fences:?}");
    let stats = locker.stats().wakes;
    // The waiters learn of the move at their next check at the latest (check interval <= 1.25
    // s), subscribe again on the new owner and are served.
    assert!(
        first < Duration::from_secs(3),
        "first waiter held the lock {first:?} after the release"
    );
    println!(
        "slot moved: first waiter held the lock {first:?} after the release; lost subscriptions found {}, timer wakes {}, grants {}",
        stats.lost_subscriptions, stats.by_timer, stats.by_notification
    );
    locker.subscriptions_settled().await;
    locker.locker().idle().await;
    assert_eq!(holder.status(key).await.expect("status").queued, 0);
}
