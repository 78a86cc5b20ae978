//! Both lockers on a local Redis Cluster (3 primaries): handoffs by grant on keys spread over
//! every primary, FUNCTION FLUSH and SCRIPT FLUSH on every node mid-run, a slot that moves
//! while its lock has queued waiters, failovers, and sets of keys across primaries.

mod common;

use common::cluster::{cli, RedisCluster};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::interfaces::LuaInterface;
use waitlock::{LockOptions, Locker};

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
    let (a, b) = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
    );
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
        common::lock_queued(&holder, k, 3).await.expect("queued");
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
    // Handoffs are grants, except where a waiter's own look crossed its grant and claimed it
    // (docs/design.md, "Race analysis"): that counts as a look (0-3 of 300 while left-over
    // wake-ups made looks; none in five runs since). A primary whose grants did not arrive
    // would turn a third of the handoffs (its keys) into looks at the lease's end (30 s): the
    // count, the timer wakes and the longest wait each rule that out.
    assert!(grants >= 250, "handoffs by grant: {sa:?} {sb:?}");
    assert_eq!(sa.wakes.by_timer + sb.wakes.by_timer, 0);
    assert!(
        sa.wait.max.max(sb.wait.max) < Duration::from_secs(10),
        "a waiter waited for a lease's end: {sa:?} {sb:?}"
    );
    // One subscriber connection per primary and locker at most.
    assert!(subscribers.iter().all(|n| *n <= 2), "{subscribers:?}");
    a.subscriptions_settled().await;
    b.subscriptions_settled().await;
    a.idle().await;
    for k in &keys {
        assert_eq!(holder.status(k).await.expect("status").queued, 0, "{k}");
    }
    println!("300 handoffs, {grants} by grant, over 3 primaries; shard subscriber connections per primary: {subscribers:?}; {:?} {:?}", sa.wakes, sb.wakes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_and_function_flush_on_every_node_mid_run() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let (a, b) = (common::queued_locker(&url).await, polling(&url).await);
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
                let g = g.expect("acquire across FUNCTION FLUSH");
                g.release().await.expect("release across FUNCTION FLUSH");
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in cluster.primaries() {
        assert!(cli(p, &["function", "flush"]).contains("OK"));
        assert!(cli(p, &["script", "flush"]).contains("OK"));
    }
    let at_flush = done.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("task");
    }
    let after = done.load(Ordering::SeqCst) - at_flush;
    assert!(after > 20, "only {after} acquisitions after FUNCTION FLUSH");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_follow_a_slot_that_moves() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let holder = polling(&url).await;
    let locker = common::queued_locker(&url).await;
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
    // The waiters learn of the move from their hub's audit (every second: which grant channels
    // each primary still has), subscribe again on the new owner and are served.
    assert!(
        first < Duration::from_secs(3),
        "first waiter held the lock {first:?} after the release"
    );
    println!(
        "slot moved: first waiter held the lock {first:?} after the release; lost subscriptions found {}, timer wakes {}, grants {}",
        stats.lost_subscriptions, stats.by_timer, stats.by_notification
    );
    locker.subscriptions_settled().await;
    locker.idle().await;
    assert_eq!(holder.status(key).await.expect("status").queued, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_and_a_killed_primary_end_every_wait_by_its_deadline() {
    let mut cluster = RedisCluster::start(3, 1);
    let url = cluster.url();
    let lockers = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
        polling(&url).await,
    );
    let store = Arc::new(common::FencedStore::default());
    let stop = Arc::new(AtomicBool::new(false));
    let wait = Duration::from_secs(8);
    // (key, when) of every acquisition.
    let acquired = Arc::new(std::sync::Mutex::new(Vec::<(String, Instant)>::new()));
    let mut tasks = Vec::new();
    for t in 0..9usize {
        let (a, b, c) = (lockers.0.clone(), lockers.1.clone(), lockers.2.clone());
        let (store, stop, acquired) = (store.clone(), stop.clone(), acquired.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("failover-{}", t % 6);
            let opts = common::tight()
                .with_wait(wait)
                .with_ttl(Duration::from_secs(2));
            let (mut ok, mut refused, mut errors, mut late) = (0u64, 0u64, Vec::new(), 0u64);
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let r = match t % 3 {
                    0 => a.acquire_wait(&key, &opts).await,
                    1 => b.acquire_wait(&key, &opts).await,
                    _ => c.acquire_wait(&key, &opts).await,
                };
                if started.elapsed() > wait + Duration::from_secs(4) {
                    late += 1;
                }
                match r {
                    Ok(g) => {
                        acquired
                            .lock()
                            .expect("acquired")
                            .push((key.clone(), Instant::now()));
                        if store.write(&key, g.fence()) {
                            ok += 1;
                        } else {
                            refused += 1;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let _ = g.release().await;
                    }
                    Err(e) => {
                        errors.push(format!("{e}"));
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (ok, refused, errors, late)
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A graceful failover: a replica takes over its primary's slots.
    let replica = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .find(|p| cli(*p, &["role"]).starts_with("slave"))
        .expect("a replica");
    // A manual failover gives up silently after 5 s (e.g. on a loaded machine): ask again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut asked = Instant::now() - Duration::from_secs(10);
    while !cli(replica, &["role"]).starts_with("master") {
        assert!(Instant::now() < deadline, "failover did not happen");
        if asked.elapsed() > Duration::from_secs(6) {
            assert!(cli(replica, &["cluster", "failover"]).contains("OK"));
            asked = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let graceful_promoted = Instant::now();
    let graceful_keys: Vec<String> = (0..6)
        .map(|i| format!("failover-{i}"))
        .filter(|k| cluster.owner(slot(k)) == replica)
        .collect();
    cluster.wait_ok();
    tokio::time::sleep(Duration::from_millis(700)).await;
    // A primary killed (SIGKILL): its replica is promoted after the node timeout (2 s).
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.port != replica && cli(n.port, &["role"]).starts_with("master"))
        .expect("a primary to kill");
    let victim_port = cluster.nodes[victim].port;
    let victim_keys: Vec<String> = (0..6)
        .map(|i| format!("failover-{i}"))
        .filter(|k| cluster.owner(slot(k)) == victim_port)
        .collect();
    let replicas_before: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .filter(|p| *p != victim_port && cli(*p, &["role"]).starts_with("slave"))
        .collect();
    cluster.nodes[victim].kill();
    let killed = Instant::now();
    // Its replica's promotion, polled every 2 ms.
    let deadline = Instant::now() + Duration::from_secs(30);
    let killed_promoted = loop {
        let promoted = replicas_before
            .iter()
            .any(|p| cli(*p, &["role"]).starts_with("master"));
        if promoted {
            break Instant::now();
        }
        assert!(Instant::now() < deadline, "no replica was promoted");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = cluster
            .nodes
            .iter()
            .filter(|n| n.port != victim_port)
            .all(|n| cli(n.port, &["cluster", "info"]).contains("cluster_state:ok"));
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cluster did not recover from the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let (mut ok, mut refused, mut late) = (0, 0, 0);
    let mut errors = Vec::new();
    for t in tasks {
        let (o, r, e, l) = t.await.expect("task");
        ok += o;
        refused += r;
        late += l;
        errors.extend(e);
    }
    assert_eq!(late, 0, "waits that ended long after their deadline");
    assert!(ok > 100, "only {ok} acquisitions");
    // How long after each promotion the keys of the shard that moved were acquired again.
    let acquired = acquired.lock().expect("acquired").clone();
    let first_after = |keys: &[String], at: Instant| {
        acquired
            .iter()
            .filter(|(k, t)| keys.contains(k) && *t > at)
            .map(|(_, t)| t.saturating_duration_since(at))
            .min()
    };
    println!(
        "CLUSTER FAILOVER: keys of the shard acquired again {:?} after the replica's promotion ({} keys); SIGKILL of a primary: replica promoted {:?} after the kill, its keys acquired again {:?} after the promotion ({} keys); {ok} acquisitions accepted by the fenced store, {refused} stale ones refused, {} errors ({:?})",
        first_after(&graceful_keys, graceful_promoted),
        graceful_keys.len(),
        killed_promoted.saturating_duration_since(killed),
        first_after(&victim_keys, killed_promoted),
        victim_keys.len(),
        errors.len(),
        errors.iter().take(3).collect::<Vec<_>>()
    );
}

/// A process waits on 5,000 keys in 5,000 distinct slots of a 3-primary cluster; its subscriber
/// connections are killed on every primary. Its 5,000 shard subscriptions must all come back
/// (one SSUBSCRIBE per slot, all at once, each bounded on its own: a slot that fails is asked
/// again alone), and every waiter then gets its turn. The locker's command timeout is 250 ms, as
/// a slow network would make 5,000 round trips in turn exceed any single limit (milestone 2
/// subscribed slot after slot under one limit, and started over from scratch when it passed:
/// it never finished). The target, back within 2 s, is a figure this test prints (0.2-0.49 s on
/// a quiet machine, 3.8 s once while another build ran): it asserts the event and a bound on
/// the SSUBSCRIBE calls, which do not depend on how busy the machine is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_slots_resubscribe_after_a_kill() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let holder = polling(&url).await;
    let locker = Locker::connect(&url)
        .await
        .expect("connect to the cluster")
        .command_timeout(Duration::from_millis(250))
        .queued()
        .build()
        .await
        .expect("queued locker on the cluster");
    // 5,000 keys whose locks live in 5,000 distinct slots.
    let mut seen = HashSet::new();
    let keys: Vec<String> = (0..)
        .map(|i| format!("slot-{i}"))
        .filter(|k| seen.insert(slot(k)))
        .take(5000)
        .collect();
    // Held (not refreshed) through every phase below, each bounded by its own wait: the
    // default 30 s TTL ran out once with two CPU burners beside the suite.
    let hold = LockOptions::new().with_ttl(Duration::from_secs(600));
    let mut held = Vec::new();
    for k in &keys {
        held.push(holder.acquire(k, &hold).await.expect("hold"));
    }
    let opts = LockOptions::new().with_wait(Duration::from_secs(120));
    let mut waiters = Vec::new();
    for k in &keys {
        let (l, k, o) = (locker.clone(), k.clone(), opts.clone());
        waiters.push(tokio::spawn(async move {
            let g = l.acquire_wait(&k, &o).await.expect("acquire_wait");
            // The 250 ms command timeout can pass on a busy machine: the lock then lapses.
            match g.release().await {
                Ok(()) | Err(waitlock::Error::Timeout { .. }) => {}
                Err(e) => panic!("release: {e}"),
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while locker.registry_size().waiters < keys.len() {
        assert!(Instant::now() < deadline, "waiters never registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    locker.subscriptions_settled().await;
    let count = |cluster: &RedisCluster| -> usize {
        cluster
            .primaries()
            .iter()
            .map(|p| {
                cli(*p, &["pubsub", "shardchannels", "*:w:*"])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .count()
            })
            .sum()
    };
    assert_eq!(count(&cluster), keys.len(), "subscriptions before the kill");
    let ssubscribes = |cluster: &RedisCluster| -> u64 {
        cluster
            .primaries()
            .iter()
            .filter_map(|p| {
                common::command_calls(&cli(*p, &["info", "commandstats"]))
                    .get("ssubscribe")
                    .copied()
            })
            .sum()
    };
    let ssubscribes_before = ssubscribes(&cluster);
    let reconnects = locker.stats().wakes.reconnects;
    for p in cluster.primaries() {
        cli(p, &["client", "kill", "type", "pubsub"]);
    }
    let killed = Instant::now();
    while locker.stats().wakes.reconnects == reconnects {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the subscriber never noticed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::timeout(Duration::from_secs(20), locker.subscriptions_settled())
        .await
        .expect("the subscriptions never came back (20 s)");
    let back = killed.elapsed();
    let channels = count(&cluster);
    assert_eq!(channels, keys.len(), "subscriptions after the kill");
    // One per slot for each reconnect event the hub sees (one per primary; a second event
    // during the first round starts a second: 5,001 calls alone, 10,002 once in the full
    // suite), plus a retry of each group that timed out, alone. Starting over for all of
    // them on every timeout, as milestone 2 did, never ends: the 20 s bound above catches
    // that. The count is a sanity bound, not a target: with two CPU burners beside the suite
    // the 250 ms command timeout passes often and 30,411-55,033 calls were sent.
    let sent = ssubscribes(&cluster) - ssubscribes_before;
    assert!(
        sent < 20 * keys.len() as u64,
        "{sent} SSUBSCRIBE calls to bring back {} slots",
        keys.len()
    );
    let released = Instant::now();
    for g in held {
        g.release().await.expect("release");
    }
    for w in waiters {
        w.await.expect("waiter");
    }
    println!(
        "5,000 distinct slots: subscriptions back {back:?} after the kill (target 2 s), {sent} SSUBSCRIBE calls; every waiter served {:?} after the releases began",
        released.elapsed()
    );
    locker.idle().await;
}

/// Permits on a cluster: a semaphore of 2 on keys over every primary; each key's queue of 3
/// waiters (weight 1) is served by grants (sharded pub/sub), two at once per release of both
/// permits, and never more than 2 hold a key at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_grants_on_keys_over_every_primary() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let holder = polling(&url).await.semaphore(2).expect("semaphore");
    let (a, b) = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
    );
    let keys: Vec<String> = (0..30).map(|i| format!("permits-{i}")).collect();
    let owners: HashSet<u16> = keys.iter().map(|k| cluster.owner(slot(k))).collect();
    assert_eq!(owners.len(), 3, "the keys do not cover every primary");
    let mut held = Vec::new();
    for k in &keys {
        held.push(
            holder
                .acquire(k, 2, &LockOptions::new())
                .await
                .expect("hold both"),
        );
    }
    let inside: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let over = Arc::new(AtomicU64::new(0));
    let opts = LockOptions::new().with_wait(Duration::from_secs(20));
    let mut waiters = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        for locker in [&a, &b, &a] {
            let sem = locker.semaphore(2).expect("semaphore");
            let (k, o, inside, over) = (k.clone(), opts.clone(), inside.clone(), over.clone());
            waiters.push(tokio::spawn(async move {
                let g = sem.acquire_wait(&k, 1, &o).await.expect("acquire_wait");
                if inside[i].fetch_add(1, Ordering::SeqCst) >= 2 {
                    over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside[i].fetch_sub(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }));
        }
    }
    for k in &keys {
        common::permits_queued(&holder, k, 3).await.expect("queued");
    }
    for g in held {
        g.release().await.expect("release");
    }
    for w in waiters {
        w.await.expect("waiter");
    }
    let (sa, sb) = (a.stats(), b.stats());
    let grants = sa.wakes.by_notification + sb.wakes.by_notification;
    assert_eq!(over.load(Ordering::SeqCst), 0, "more than 2 held a key");
    assert!(
        grants >= 75,
        "90 acquisitions, {grants} by grant: {sa:?} {sb:?}"
    );
    assert_eq!(sa.wakes.by_timer + sb.wakes.by_timer, 0);
    for k in &keys {
        let st = holder.status(k).await.expect("status");
        assert_eq!((st.held, st.queued), (0, 0), "{k}: {st:?}");
    }
    println!("90 permit acquisitions on 3 primaries, {grants} by grant");
}

/// A slot that moves while a locker hammers a lock on it (review 2, finding 6): every call on
/// the slot fails while it migrates (`TRYAGAIN`: the scripts name keys the move has not
/// brought yet), and fred 10.1 ends its client's connection task when an `ASK` redirection
/// it follows fails ("Max attempts reached."). The client then never answered again and
/// still said it was connected: every lock on that client was gone for good. A locker that
/// built its client starts the task again; after the move, the lock works within a TTL (a
/// timed-out acquisition may have taken it for a token nobody holds) and a little.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_works_again_after_its_slot_moved_under_load() {
    let cluster = Arc::new(RedisCluster::start(3, 0));
    let url = cluster.url();
    let locker = polling(&url).await;
    let key = "moved-under-load";
    let s = slot(key);
    // Other data in the slot, so that the move takes a while (10,000 keys: about a second).
    let _: i64 = locker
        .client()
        .eval(
            "for i = 1, 10000 do redis.call('SET', KEYS[1] .. i, 'x') end return 1",
            vec![format!("{{waitlock:{key}}}:data:")],
            Vec::<String>::new(),
        )
        .await
        .expect("fill the slot");
    let ttl = Duration::from_secs(1);
    let opts = LockOptions::new().with_ttl(ttl);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let last_ok = Arc::new(std::sync::Mutex::new(Instant::now()));
    let looper = {
        let (locker, opts, stop, last_ok) =
            (locker.clone(), opts.clone(), stop.clone(), last_ok.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match locker.acquire(key, &opts).await {
                    Ok(g) => {
                        if g.release().await.is_ok() {
                            *last_ok.lock().expect("lock") = Instant::now();
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let from = cluster.owner(s);
    let to = cluster
        .primaries()
        .into_iter()
        .find(|p| *p != from)
        .expect("another primary");
    let c = Arc::clone(&cluster);
    tokio::task::spawn_blocking(move || c.move_slot(s, to))
        .await
        .expect("move");
    let moved = Instant::now();
    let limit = ttl + Duration::from_secs(3);
    while *last_ok.lock().expect("lock") < moved {
        assert!(
            moved.elapsed() < limit,
            "no acquire + release on the moved slot within {limit:?} of the move's end"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let back = moved.elapsed();
    stop.store(true, Ordering::SeqCst);
    looper.await.expect("looper");
    println!("slot moved under load: the lock worked again {back:?} after the move's end");
}

/// Held locks on keys over every primary, kept alive by the locker's one refresher: cutting the
/// connections to one primary loses none of them, and the refresh calls are batched per slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_refresher_keeps_locks_on_every_primary_through_a_cut_connection() {
    let cluster = RedisCluster::start(3, 0);
    let locker = polling(&cluster.url()).await;
    // 600 keys in 30 hash tags (the lock `{waitlock:{group-N}-i}` hashes "waitlock:{group-N"):
    // the locks of one tag share a slot, and so their refresh calls.
    let keys: Vec<String> = (0..600)
        .map(|i| format!("{{group-{}}}-{i}", i % 30))
        .collect();
    let owners: HashSet<u16> = keys
        .iter()
        .map(|k| {
            let name = format!("{{waitlock:{k}}}");
            cluster.owner(waitlock::fred::util::redis_keyslot(name.as_bytes()))
        })
        .collect();
    assert_eq!(owners.len(), 3, "the keys do not cover every primary");
    let opts = LockOptions::new()
        .with_ttl(Duration::from_millis(1_500))
        .with_refresh_ratio(0.5);
    let mut guards = Vec::new();
    for k in &keys {
        let mut g = locker.acquire(k, &opts).await.expect("acquire a free key");
        g.keep_alive();
        guards.push(g);
    }
    let evalshas = || -> u64 {
        cluster
            .primaries()
            .iter()
            .map(|p| {
                let calls = common::command_calls(&cli(*p, &["info", "commandstats"]));
                ["fcall", "evalsha"]
                    .iter()
                    .filter_map(|c| calls.get(*c))
                    .sum::<u64>()
            })
            .sum()
    };
    let calls_before = evalshas();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    // Every normal connection to one primary cut (the locker's among them).
    let victim = cluster.primaries()[0];
    cli(victim, &["client", "kill", "type", "normal"]);
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let periods = start.elapsed().as_secs_f64() / 0.75;
    for g in &guards {
        assert_eq!(g.loss(), None, "{} was reported lost", g.key());
    }
    let calls = evalshas() - calls_before;
    println!(
        "{} locks on {} primaries: {calls} script calls in {periods:.1} refresh periods",
        keys.len(),
        owners.len()
    );
    // One call per lock and period would be 600 a period; one per slot is 30.
    assert!(
        (calls as f64) < periods * 150.0,
        "{calls} script calls in {periods:.1} periods"
    );
    for g in guards {
        g.release().await.expect("release");
    }
    locker.idle().await;
}

/// Sets across slots (the ordered path of `acquire_many_wait`): six keys, two on each of the
/// three primaries, taken by six workers of two queued lockers in different orders and
/// overlapping subsets; then a primary is killed (SIGKILL) and its replica promoted. No call
/// outlives its deadline by more than a command timeout, every worker takes its set again
/// after the promotion, and at the end no key is held or queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_across_primaries_survive_a_killed_primary() {
    let mut cluster = RedisCluster::start(3, 1);
    let url = cluster.url();
    let primaries = cluster.primaries();
    let mut keys: Vec<String> = Vec::new();
    for p in &primaries {
        let mine = (0..10_000)
            .map(|i| format!("xset-{i}"))
            .filter(|k| cluster.owner(slot(k)) == *p)
            .take(2);
        keys.extend(mine);
    }
    assert_eq!(keys.len(), 6, "two keys per primary");
    let lockers = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
        polling(&url).await,
    );
    match lockers
        .0
        .acquire_many_wait(&keys, &LockOptions::new())
        .await
    {
        Err(waitlock::Error::InvalidOptions { field, value, .. }) => {
            assert_eq!(field, "ordered_sets");
            assert!(value.contains(", "), "several slots named: {value}");
        }
        other => panic!("a set without the opt-in: {other:?}"),
    }
    // Keys of one slot are taken at once, without the opt-in: a polling locker's wait, and a
    // queued locker's one attempt.
    let tagged = ["{xset}:a", "{xset}:b", "{xset}:c"];
    let set = lockers
        .2
        .acquire_many_wait(&tagged, &LockOptions::new())
        .await
        .expect("one slot, at once");
    assert_eq!(set.keys().count(), 3);
    set.release().await.expect("release");
    let set = lockers
        .0
        .acquire_many(&tagged, &LockOptions::new())
        .await
        .expect("one slot, one attempt");
    set.release().await.expect("release");
    let wait = Duration::from_secs(20);
    let stop = Arc::new(AtomicBool::new(false));
    let promoted_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    // Sets each worker took that it had asked for after the promotion.
    let after: Arc<Vec<AtomicU64>> = Arc::new((0..6).map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let (a, b) = (lockers.0.clone(), lockers.1.clone());
        let (stop, promoted_at, after) = (stop.clone(), promoted_at.clone(), after.clone());
        // Overlapping subsets of four, each given in a different order.
        let set: Vec<String> = [t, t + 3, t + 1, t + 5]
            .iter()
            .map(|i| keys[i % 6].clone())
            .collect();
        tasks.push(tokio::spawn(async move {
            let opts = common::tight()
                .with_wait(wait)
                .with_ttl(Duration::from_secs(2))
                .with_ordered_sets();
            let (mut ok, mut late, mut errors) = (0u64, 0u64, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let r = if t % 2 == 0 {
                    a.acquire_many_wait(&set, &opts).await
                } else {
                    b.acquire_many_wait(&set, &opts).await
                };
                if started.elapsed() > wait + Duration::from_secs(4) {
                    late += 1;
                }
                match r {
                    Ok(held) => {
                        ok += 1;
                        if promoted_at
                            .lock()
                            .expect("promoted")
                            .is_some_and(|p| started > p)
                        {
                            after[t].fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let _ = held.release().await;
                    }
                    Err(e) => {
                        errors.push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (ok, late, errors)
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let victim = cluster
        .nodes
        .iter()
        .position(|n| n.port == primaries[1])
        .expect("the victim");
    let replicas_before: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|n| n.port)
        .filter(|p| cli(*p, &["role"]).starts_with("slave"))
        .collect();
    cluster.nodes[victim].kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !replicas_before
        .iter()
        .any(|p| cli(*p, &["role"]).starts_with("master"))
    {
        assert!(Instant::now() < deadline, "no replica was promoted");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    *promoted_at.lock().expect("promoted") = Some(Instant::now());
    // Every worker asks for its set after the promotion and gets it (the event, not a clock;
    // the bound is for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(60);
    while after.iter().any(|a| a.load(Ordering::SeqCst) == 0) {
        assert!(
            Instant::now() < deadline,
            "workers without a set since the promotion: {after:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut total = 0;
    for (t, task) in tasks.into_iter().enumerate() {
        let (ok, late, errors) = task.await.expect("worker");
        println!(
            "CLUSTER SETS: worker {t}: {ok} sets, {} errors {:?}",
            errors.len(),
            errors.iter().take(2).collect::<Vec<_>>()
        );
        assert_eq!(late, 0, "worker {t}: calls that outlived their deadline");
        total += ok;
    }
    assert!(total > 20, "only {total} sets taken");
    lockers.0.idle().await;
    lockers.1.idle().await;
    lockers.2.idle().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for key in &keys {
        loop {
            let status = lockers.2.status(key).await.expect("status");
            if !status.held && status.queued == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{key} left behind after the run: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A queued locker's wait for keys of one slot (hash-tagged) on a cluster: each set queued once
/// in every key's queue and granted every key in one call and one message on the slot's
/// primary (the grant reads and writes the set's other keys, which share the slot). Sets on
/// two tags (two primaries), 12 workers over 2 lockers taking overlapping sets of 2-3 of
/// 4 keys: every set taken well within its deadline, no key with two valid holders, nothing
/// left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_sets_of_one_slot_are_granted_at_once() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    // Two tags whose slots are on two primaries.
    let tags: Vec<String> = {
        let mut found: Vec<(String, u16)> = Vec::new();
        for i in 0..1000 {
            let tag = format!("qs{i}");
            let lock = common::lock_key(&format!("{{{tag}}}:x"));
            let owner = cluster.owner(waitlock::fred::util::redis_keyslot(lock.as_bytes()));
            if found.iter().all(|(_, o)| *o != owner) {
                found.push((tag, owner));
            }
            if found.len() == 2 {
                break;
            }
        }
        found.into_iter().map(|(t, _)| t).collect()
    };
    let lockers = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
    );
    let holders: Arc<std::sync::Mutex<HashSet<String>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..12usize {
        let locker = if t % 2 == 0 {
            lockers.0.clone()
        } else {
            lockers.1.clone()
        };
        let tag = tags[t % 2].clone();
        let holders = holders.clone();
        tasks.push(tokio::spawn(async move {
            let opts = common::tight().with_wait(Duration::from_secs(60));
            let mut rng = common::Seeded::new(0x5e7 + t as u64);
            for _ in 0..15 {
                let size = 2 + rng.below(Duration::from_nanos(2)).as_nanos() as usize;
                let mut keys: Vec<String> = Vec::new();
                while keys.len() < size {
                    let k = format!(
                        "{{{tag}}}:{}",
                        rng.below(Duration::from_nanos(4)).as_nanos()
                    );
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                let started = Instant::now();
                let set = locker
                    .acquire_many_wait(&keys, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("worker {t}, {keys:?}: {e}"));
                assert!(started.elapsed() < Duration::from_secs(30));
                {
                    let mut h = holders.lock().expect("holders");
                    for k in &keys {
                        assert!(h.insert(k.clone()), "two holders of {k}");
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
                {
                    let mut h = holders.lock().expect("holders");
                    for k in &keys {
                        h.remove(k);
                    }
                }
                set.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    lockers.0.idle().await;
    lockers.1.idle().await;
    for tag in &tags {
        for i in 0..4 {
            let key = format!("{{{tag}}}:{i}");
            let status = lockers.0.status(&key).await.expect("status");
            assert!(
                !status.held && status.queued == 0,
                "{key} left behind: {status:?}"
            );
        }
    }
}

/// In order (keys in two slots, with the opt-in), the first slot's run is held while the next
/// run is waited for; with refresh off, the first run's TTL elapsing meanwhile ends the call
/// with `Expired` naming its key (taking the set again would go round until the deadline).
/// The run waited for holds nothing of it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_with_refresh_off_a_wait_longer_than_the_first_runs_ttl_ends_expired() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let locker = common::queued_locker(&url).await;
    let other = polling(&url).await;
    // Two keys of two slots, in the one order (by the lock's slot).
    let mut keys: Vec<String> = ["ro-a", "ro-b"].iter().map(|k| k.to_string()).collect();
    keys.sort_by_key(|k| waitlock::fred::util::redis_keyslot(common::lock_key(k).as_bytes()));
    let blocker = other
        .acquire(&keys[1], &LockOptions::new())
        .await
        .expect("hold the second key");
    let opts = common::tight()
        .with_ordered_sets()
        .without_refresh()
        .with_ttl(Duration::from_millis(300))
        .with_wait(Duration::from_secs(60));
    match locker.acquire_many_wait(&keys, &opts).await {
        Err(waitlock::Error::Expired { key, .. }) => assert_eq!(key, keys[0]),
        other => panic!("expected Expired on {}, got {other:?}", keys[0]),
    }
    locker.idle().await;
    let status = locker.status(&keys[0]).await.expect("status");
    assert!(!status.held && status.queued == 0, "{status:?}");
    blocker.release().await.expect("release");
}

/// Two tags whose locks' slots differ, the first's slot before the second's (the in-order
/// path's one order).
fn two_ordered_tags(prefix: &str) -> (String, String) {
    let slot_of = |tag: &str| {
        waitlock::fred::util::redis_keyslot(common::lock_key(&format!("{{{tag}}}:x")).as_bytes())
    };
    let first = format!("{prefix}0");
    for i in 1..1000 {
        let tag = format!("{prefix}{i}");
        if slot_of(&tag) > slot_of(&first) {
            return (first, tag);
        }
    }
    panic!("no tag with a slot after {first}'s");
}

/// Review 3, finding 1: in order, a slot's run of more than 256 keys takes more than one call;
/// when a later call of the run fails, the keys the earlier calls took are given back, so that
/// the waiter holds only earlier slots while it waits for the run as a whole. Kept (5ecc195),
/// they deadlocked with a set waiting at once that needed one of them and headed the queue
/// of the key the in-order waiter waited for: the blocking key stayed free 6.6 s, until the
/// in-order waiter's deadline, and only then was the set granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_order_a_run_split_into_calls_is_given_back_whole_beside_a_set_at_once() {
    let cluster = RedisCluster::start(3, 0);
    let url = cluster.url();
    let (t0, t1) = two_ordered_tags("rs");
    let k0 = format!("{{{t0}}}:k0");
    // 257 keys in one slot: calls of 256 and 1.
    let run: Vec<String> = (0..256).map(|i| format!("{{{t1}}}:a{i:03}")).collect();
    let e = format!("{{{t1}}}:z");
    let holder = polling(&url).await;
    let held_e = holder
        .acquire(&e, &LockOptions::new().with_ttl(Duration::from_secs(30)))
        .await
        .expect("hold e");
    let x = polling(&url).await;
    let mut x_keys = vec![k0.clone()];
    x_keys.extend(run.iter().cloned());
    x_keys.push(e.clone());
    let x_task = {
        let x_keys = x_keys.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .with_ttl(Duration::from_secs(10))
                .with_wait(Duration::from_secs(30))
                .with_ordered_sets()
                .with_backoff(waitlock::Backoff::exponential(
                    Duration::from_millis(5),
                    Duration::from_millis(50),
                ));
            x.acquire_many_wait(&x_keys, &opts).await
        })
    };
    // X's burst has run: the run's first key was taken (its fence counter exists).
    let owner = cluster.owner(waitlock::fred::util::redis_keyslot(
        common::lock_key(&run[0]).as_bytes(),
    ));
    let fence = common::fence_key(&run[0]);
    common::eventually(
        "X takes the run's first call",
        Duration::from_secs(30),
        || cli(owner, &["exists", &fence]).trim() == "1",
    )
    .await;
    let y = common::queued_locker(&url).await;
    let y_task = {
        let (y, a, e) = (y.clone(), run[0].clone(), e.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .with_ttl(Duration::from_secs(10))
                .with_wait(Duration::from_secs(60));
            y.acquire_many_wait(&[a, e], &opts).await
        })
    };
    common::lock_queued(&y, &e, 1).await.expect("Y queues on e");
    let released = Instant::now();
    held_e.release().await.expect("release e");
    let y_set = y_task.await.expect("task").expect("Y is granted");
    let after = released.elapsed();
    assert!(
        !x_task.is_finished(),
        "Y was granted only after the in-order waiter ended ({after:?} after e's release): \
         it kept part of the run it waited for; it ended with {:?}",
        x_task.await.expect("task").map(|s| s.keys().count())
    );
    println!("the set at once was granted {after:?} after e's release");
    y_set.release().await.expect("release Y");
    let x_set = x_task
        .await
        .expect("task")
        .expect("X takes its set after Y");
    assert_eq!(x_set.keys().count(), x_keys.len());
    x_set.release().await.expect("release X");
    y.idle().await;
    for key in [&run[0], &e, &k0] {
        let status = y.status(key).await.expect("status");
        assert!(!status.held && status.queued == 0, "{key}: {status:?}");
    }
}
