//! Both lockers behind Sentinel (a primary, a replica, a sentinel: `redis-server` processes
//! killed by pid): the replication check, `kill -9` of the primary while workers contend, and
//! `SENTINEL FAILOVER` with the old primary alive.

mod common;

use common::cluster::cli;
use common::sentinel::{SentinelSet, SERVICE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::{Error, LockOptions, Locker, Queue};

/// A queued locker and a polling locker, each with its own connection through the sentinels.
async fn lockers(url: &str) -> (Locker<Queue>, Locker) {
    let a = Locker::connect(url)
        .await
        .expect("connect")
        .queued()
        .build()
        .await
        .expect("pubsub");
    let b = Locker::connect(url)
        .await
        .expect("connect")
        .build()
        .expect("locker");
    (a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_replicas_refuses_a_lock_no_replica_acknowledged() {
    let set = SentinelSet::start(1, 1);
    let locker = Locker::connect(&set.url())
        .await
        .expect("connect through sentinel")
        // Generous: on a loaded machine the replica's acknowledgement can take a while.
        .require_replicas(1, Duration::from_secs(1))
        .build()
        .expect("locker");
    let admin = set.primary.client().await;
    let g = locker
        .acquire("replicated", &LockOptions::new())
        .await
        .expect("acquire with the replica up");
    g.release().await.expect("release");
    let mut replica = set.replicas.into_iter().next().expect("replica");
    replica.pause();
    let started = Instant::now();
    let r = locker.acquire("replicated", &LockOptions::new()).await;
    match &r {
        Err(Error::NotReplicated {
            required: 1,
            acknowledged: 0,
            ..
        }) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let left: Option<String> =
        common::cmd(&admin, "GET", vec![common::lock_key("replicated").into()]).await;
    assert_eq!(left, None, "the unreplicated lock was left behind");
    println!("{}", r.expect_err("error"));
    replica.resume();
    let g = locker
        .acquire("replicated", &LockOptions::new())
        .await
        .expect("acquire with the replica back");
    g.release().await.expect("release");
}

/// Workers contend through Sentinel; the primary is SIGKILLed. Every wait ends by its
/// deadline, acquisitions resume on the promoted replica, and the fence-checking store accepts
/// no stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_primary_while_workers_contend() {
    let mut set = SentinelSet::start(1, 1);
    let url = set.url();
    let (a, b) = lockers(&url).await;
    let store = Arc::new(common::FencedStore::default());
    let stop = Arc::new(AtomicBool::new(false));
    let wait = Duration::from_secs(8);
    let after_failover = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let (a, b, store, stop, after) = (
            a.clone(),
            b.clone(),
            store.clone(),
            stop.clone(),
            after_failover.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let key = format!("killed-primary-{}", t % 2);
            let opts = common::tight()
                .with_wait(wait)
                .with_ttl(Duration::from_secs(2));
            let (mut refused, mut late, mut errors) = (0u64, 0u64, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let r = if t % 2 == 0 {
                    a.acquire_wait(&key, &opts).await
                } else {
                    b.acquire_wait(&key, &opts).await
                };
                if started.elapsed() > wait + Duration::from_secs(4) {
                    late += 1;
                }
                match r {
                    Ok(g) => {
                        if !store.write(&key, g.fence()) {
                            refused += 1;
                        }
                        after.lock().expect("times").push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        let _ = g.release().await;
                    }
                    Err(e) => {
                        errors.push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            (refused, late, errors)
        }));
    }
    let announced = set.switch_announced().await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let old = set.primary.port;
    set.primary.kill();
    let killed = Instant::now();
    let new = set.wait_for_new_primary(old, Duration::from_secs(30));
    let promoted = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::SeqCst);
    let (mut refused, mut late, mut errors) = (0, 0, Vec::new());
    for t in tasks {
        let (r, l, e) = t.await.expect("task");
        refused += r;
        late += l;
        errors.extend(e);
    }
    let times = after_failover.lock().expect("times").clone();
    let resumed = times.iter().filter(|t| **t > killed + promoted).count();
    let first = times
        .iter()
        .filter(|t| **t > killed)
        .map(|t| t.saturating_duration_since(killed))
        .min();
    let switch = announced.borrow().expect("+switch-master was announced");
    // How long after the announcement the lockers were acquiring on the new primary: the
    // reconnection (fred's policy is capped at 50 ms behind Sentinel) plus one attempt.
    let followed = times
        .iter()
        .filter(|t| **t > switch)
        .map(|t| t.saturating_duration_since(switch))
        .min()
        .expect("an acquisition after the switch");
    assert_eq!(late, 0, "waits that ended long after their deadline");
    assert!(
        resumed > 20,
        "only {resumed} acquisitions on the new primary"
    );
    assert!(
        followed < Duration::from_millis(400),
        "the first acquisition came {followed:?} after +switch-master"
    );
    println!(
        "kill -9: replica on port {new} promoted (announced) {:?} after the kill; first acquisition {followed:?} after +switch-master; first after the kill at {first:?}; {resumed} acquisitions after it; {refused} stale writes refused; {} errors, e.g. {:?}",
        switch.saturating_duration_since(killed),
        errors.len(),
        errors.first()
    );
}

/// `SENTINEL FAILOVER` with the old primary alive: the lockers follow the sentinel's
/// `+switch-master` at once, so no acquisition lands on the old primary after a small bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_at_once() {
    let set = SentinelSet::start(1, 1);
    let url = set.url();
    let (a, b) = lockers(&url).await;
    let old = set.primary.port;
    let new = set.replicas[0].port;
    let old_admin = set.primary.client().await;
    let new_admin = set.replicas[0].client().await;
    let stop = Arc::new(AtomicBool::new(false));
    // (when, held on the old primary but not on the new one)
    let seen = Arc::new(Mutex::new(Vec::<(Instant, bool)>::new()));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut tasks = Vec::new();
    for t in 0..4usize {
        let (a, b, stop, seen, old_admin, new_admin, errors) = (
            a.clone(),
            b.clone(),
            stop.clone(),
            seen.clone(),
            old_admin.clone(),
            new_admin.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let key = format!("switched-{t}");
            // A short TTL: a release that reached the old primary in the switch window is lost,
            // and the lock replicated before the switch then expires by its TTL.
            let opts = common::tight()
                .with_wait(Duration::from_secs(8))
                .with_ttl(Duration::from_secs(1));
            while !stop.load(Ordering::SeqCst) {
                let r = if t % 2 == 0 {
                    a.acquire_wait(&key, &opts).await
                } else {
                    b.acquire_wait(&key, &opts).await
                };
                let g = match r {
                    Ok(g) => g,
                    Err(e) => {
                        errors.lock().expect("errors").push(e.to_string());
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let at = Instant::now();
                let name = common::lock_key(&key);
                let on_old: Option<String> =
                    common::try_cmd(&old_admin, "GET", vec![name.clone().into()]).await;
                let on_new: Option<String> =
                    common::try_cmd(&new_admin, "GET", vec![name.into()]).await;
                let mine =
                    |v: &Option<String>| v.as_deref().is_some_and(|v| v.ends_with(g.token()));
                seen.lock()
                    .expect("seen")
                    .push((at, mine(&on_old) && !mine(&on_new)));
                let _ = g.release().await;
            }
        }));
    }
    let announced = set.switch_announced().await;
    let promotion = set.promotion_of(new);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // (The replica's `FUNCTION LOAD`s so far: a load after the failover was a locker's, for a
    // library the new primary did not have.)
    let loads = || async {
        common::server_info::commandstats(&new_admin)
            .await
            .get("function|load")
            .copied()
            .unwrap_or(0)
    };
    let loads_before = loads().await;
    let had = common::has_library(&new_admin).await;
    assert!(cli(set.sentinels[0].port, &["sentinel", "failover", SERVICE]).contains("OK"));
    let asked = Instant::now();
    let promoted_port = set.wait_for_new_primary(old, Duration::from_secs(30));
    assert_eq!(promoted_port, new);
    let switched = announced.borrow().unwrap_or_else(Instant::now);
    let promoted = promotion.borrow().unwrap_or(switched);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("task");
    }
    let seen = seen.lock().expect("seen").clone();
    let stale_after: Vec<Duration> = seen
        .iter()
        .filter(|(at, stale)| *stale && *at > switched)
        .map(|(at, _)| at.saturating_duration_since(switched))
        .collect();
    let last_stale = stale_after.iter().max().copied().unwrap_or_default();
    let on_new_after = seen
        .iter()
        .filter(|(at, stale)| !stale && *at > switched)
        .count();
    // Acquisitions that landed on the old primary after the replica was promoted: lost when
    // the old primary is demoted and resyncs (the window Sentinel leaves; require_replicas
    // closes it).
    let lost = seen
        .iter()
        .filter(|(at, stale)| *stale && *at > promoted)
        .count();
    println!(
        "SENTINEL FAILOVER: replica promoted {:?} after the request, announced {:?} after the promotion; {lost} acquisitions landed on the old primary after the promotion (lost with the demotion), {} after the announcement, the last {last_stale:?} after it; {on_new_after} on the new one",
        promoted.saturating_duration_since(asked),
        switched.saturating_duration_since(promoted),
        stale_after.len()
    );
    assert!(
        last_stale < Duration::from_millis(1000),
        "acquisitions on the old primary {last_stale:?} after the switch"
    );
    let errors = errors.lock().expect("errors").clone();
    assert!(
        on_new_after > 20,
        "only {on_new_after} acquisitions on the new primary; {} errors, e.g. {:?}",
        errors.len(),
        errors.iter().take(3).collect::<Vec<_>>()
    );
    // The library came with the replica (Functions are replicated): the new primary has it.
    assert!(
        common::has_library(&new_admin).await,
        "the new primary does not list the library"
    );
    let fcall = common::fcall_stats(&new_admin).await;
    let errors: String = common::cmd(&new_admin, "INFO", vec!["errorstats".into()]).await;
    let errors: Vec<&str> = errors
        .lines()
        .filter(|l| l.starts_with("errorstat_"))
        .collect();
    let loaded = loads().await - loads_before;
    println!(
        "SENTINEL FAILOVER: the replica had the library before the failover: {had}; FCALL on \
         it as the new primary: {fcall}; its errors: {errors:?}; library loads on it since \
         before the failover: {loaded}"
    );
}

/// `require_replicas` closes the window a Sentinel failover leaves: with the old primary alive
/// during `SENTINEL FAILOVER`, no acquisition that succeeded landed on the old primary after
/// the replica's promotion (a write the replica no longer acknowledges fails with
/// `NotReplicated` and is released).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_replicas_closes_the_failover_window() {
    let set = SentinelSet::start(1, 1);
    let url = set.url();
    let locker = Locker::connect(&url)
        .await
        .expect("connect")
        .require_replicas(1, Duration::from_millis(200))
        .build()
        .expect("locker");
    let old_admin = set.primary.client().await;
    let new_admin = set.replicas[0].client().await;
    let new = set.replicas[0].port;
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::<(Instant, bool)>::new()));
    let mut tasks = Vec::new();
    for t in 0..4usize {
        let (locker, stop, seen, old_admin, new_admin) = (
            locker.clone(),
            stop.clone(),
            seen.clone(),
            old_admin.clone(),
            new_admin.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let key = format!("replicated-switch-{t}");
            let opts = common::tight()
                .with_wait(Duration::from_secs(8))
                .with_ttl(Duration::from_secs(1));
            let mut rejected = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let g = match locker.acquire_wait(&key, &opts).await {
                    Ok(g) => g,
                    Err(_) => {
                        rejected += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let at = Instant::now();
                let name = common::lock_key(&key);
                let on_old: Option<String> =
                    common::try_cmd(&old_admin, "GET", vec![name.clone().into()]).await;
                let on_new: Option<String> =
                    common::try_cmd(&new_admin, "GET", vec![name.into()]).await;
                let mine =
                    |v: &Option<String>| v.as_deref().is_some_and(|v| v.ends_with(g.token()));
                seen.lock()
                    .expect("seen")
                    .push((at, mine(&on_old) && !mine(&on_new)));
                let _ = g.release().await;
            }
            rejected
        }));
    }
    let promotion = set.promotion_of(new);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(cli(set.sentinels[0].port, &["sentinel", "failover", SERVICE]).contains("OK"));
    set.wait_for_new_primary(set.primary.port, Duration::from_secs(30));
    // Until the demoted primary has resynced as the new one's replica, nothing is acknowledged
    // (that is the price): wait for 20 acquisitions after the promotion, 20 s at most.
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let promoted = *promotion.borrow();
        let n = promoted.map_or(0, |p| {
            seen.lock()
                .expect("seen")
                .iter()
                .filter(|(at, _)| *at > p)
                .count()
        });
        if n >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let mut rejected = 0;
    for t in tasks {
        rejected += t.await.expect("task");
    }
    let promoted = promotion.borrow().expect("the replica was promoted");
    let seen = seen.lock().expect("seen").clone();
    let lost = seen
        .iter()
        .filter(|(at, stale)| *stale && *at > promoted)
        .count();
    let after = seen.iter().filter(|(at, _)| *at > promoted).count();
    let resumed = seen
        .iter()
        .filter(|(at, _)| *at > promoted)
        .map(|(at, _)| at.saturating_duration_since(promoted))
        .min();
    println!(
        "SENTINEL FAILOVER with require_replicas(1, 200 ms): {lost} acquisitions on the old primary after the promotion; the first acquisition {resumed:?} after the promotion (once a replica acknowledged again); {after} after it in all; {rejected} refused (NotReplicated or timeouts)"
    );
    assert_eq!(
        lost, 0,
        "acquisitions that landed on the old primary after the promotion"
    );
    assert!(after > 10, "only {after} acquisitions after the promotion");
}

/// Issue 33: candidates campaign, write to a fence-checking store while they lead, and resign,
/// in a loop, through a Sentinel failover. The store (`common::store_op`, on its own Redis,
/// never failed over) takes a write only with a term at least the highest it took; every
/// leader writes only while its leadership reads valid. The store refuses none: the terms
/// leaders hold never go back, across the switch too (a fence is the counter + 1 or Redis'
/// time in µs, whichever is larger, so the promoted replica's lagging counter cannot give an
/// older term); and leaders keep being elected on the new primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_keep_their_terms_in_order_through_a_failover() {
    let set = SentinelSet::start(1, 1);
    let url = set.url();
    let store_server = common::RedisServer::start();
    let store = store_server.client().await;
    let keys = || vec!["value".to_owned(), "top".to_owned(), "taken".to_owned()];
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..4usize {
        let (stop, store) = (stop.clone(), store.clone());
        let (a, _) = lockers(&url).await;
        tasks.push(tokio::spawn(async move {
            let election = a.election("scheduler").expect("name");
            let opts = LockOptions::new()
                .with_wait(Duration::from_secs(8))
                .with_ttl(Duration::from_secs(1));
            // (terms led, writes sent, writes refused)
            let (mut led, mut sent, mut refused) = (0u32, 0u32, 0u32);
            while !stop.load(Ordering::SeqCst) {
                let Ok(leading) = election.campaign(&format!("c{t}"), &opts).await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                for _ in 0..3 {
                    if leading.loss().is_some() || Instant::now() >= leading.valid_until() {
                        break;
                    }
                    let r = common::store_op(&store, keys(), leading.term(), "write", t as i64);
                    sent += 1;
                    if r.await < 0 {
                        refused += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                led += 1;
                let _ = leading.resign().await;
            }
            (led, sent, refused)
        }));
    }
    let old = set.primary.port;
    let new = set.replicas[0].port;
    let taken = || common::try_cmd::<i64>(&store, "GET", vec!["taken".into()]);
    // Terms before the switch, then the failover.
    while taken().await < 20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(cli(set.sentinels[0].port, &["sentinel", "failover", SERVICE]).contains("OK"));
    assert_eq!(set.wait_for_new_primary(old, Duration::from_secs(30)), new);
    let before = taken().await;
    // Leaders on the new primary: 20 more writes taken (bounded by the wait, not a sleep).
    let deadline = Instant::now() + Duration::from_secs(30);
    while taken().await < before + 20 {
        assert!(Instant::now() < deadline, "no leaders after the failover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (mut led, mut sent, mut refused) = (0, 0, 0);
    for t in tasks {
        let (l, s, r) = t.await.expect("task");
        (led, sent, refused) = (led + l, sent + s, refused + r);
    }
    let taken = taken().await;
    println!(
        "ELECTION FAILOVER: {led} terms led, {sent} writes sent, {taken} taken, {refused} refused"
    );
    assert_eq!(
        refused, 0,
        "writes of an older term than one the store took"
    );
    assert_eq!(taken, i64::from(sent), "every write sent was taken");
}
