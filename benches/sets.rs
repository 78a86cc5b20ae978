//! Several keys at once (issue 32): what a set costs against one key, in one run.
//!
//! ```sh
//! cargo bench --bench sets            # -- --quick: fewer acquisitions and repeats
//! ```
//!
//! - `handoff`: 8 workers over 4 queued lockers (each its own connections and process id),
//!   hold 1 ms, all on one key, then all on one set of 2 keys, twice in turn: handoff gap
//!   p50/p99 (a holder's release started to the next holder's return), script calls and Redis
//!   CPU per acquisition, and the set's gap p50 over the key's;
//! - `many`: 1,000 free keys in one hash slot taken and released by one call: a queued
//!   locker in order (`acquire_many_wait`) and at once (`acquire_many`), a polling locker at
//!   once (`acquire_many_wait`): median time to take them, calls per take, Redis CPU;
//! - `cluster`: the same across a 3-primary cluster (a private one; keys without hash tags,
//!   spread over its slots).
//!
//! Uses a private `redis-server` unless `REDIS_URL` is set (the cluster is always private).

#[path = "../tests/common/mod.rs"]
mod common;

use common::cluster::RedisCluster;
use common::pct;
use common::server_info::{calls_since, commandstats, redis_cpu_us};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::strategy::Strategy;
use waitlock::{LockOptions, Locker, Queue};

fn opts() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(600))
        .with_ordered_sets()
}

/// The gap figures of one contended run over `keys` (one key, or a set).
struct Gaps {
    p50_ms: f64,
    p99_ms: f64,
    calls: f64,
    cpu_us: f64,
}

async fn handoffs(admin: &Client, lockers: &[Locker<Queue>], keys: &[String], n: usize) -> Gaps {
    let opts = opts();
    let first = lockers[0]
        .acquire_many_wait(keys, &opts)
        .await
        .expect("the first holder");
    let epoch = Instant::now();
    let log = Arc::new(Mutex::new(Vec::<(u64, u64)>::with_capacity(n + 16)));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let locker = lockers[w % lockers.len()].clone();
        let (keys, opts, log, stop) = (keys.to_vec(), opts.clone(), log.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let set = locker
                    .acquire_many_wait(&keys, &opts)
                    .await
                    .expect("acquire_many_wait");
                let at = epoch.elapsed().as_nanos() as u64;
                tokio::time::sleep(Duration::from_millis(1)).await;
                let release = epoch.elapsed().as_nanos() as u64;
                set.release().await.expect("release");
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.push((at, release));
                if log.len() >= n {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    // Every waiter queued before the clock starts (a set's waiters queue on the first of its
    // keys in (slot, key) order, which need not be the first given).
    let limit = Instant::now() + Duration::from_secs(120);
    loop {
        let mut queued = 0;
        for key in keys {
            queued += common::queued(admin, key).await as usize;
        }
        if queued >= 8 || Instant::now() >= limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = commandstats(admin).await;
    let cpu0 = redis_cpu_us(admin).await;
    let released_first = epoch.elapsed().as_nanos() as u64;
    first.release().await.expect("release");
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cpu = redis_cpu_us(admin).await - cpu0;
    let (scripts, _) = calls_since(&before, &commandstats(admin).await);
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    for l in lockers {
        l.idle().await;
    }
    let mut log = log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let gaps = common::handoff_gaps(&mut log, released_first);
    let count = log.len().max(1) as f64;
    Gaps {
        p50_ms: pct(&gaps, 0.5),
        p99_ms: pct(&gaps, 0.99),
        calls: scripts as f64 / count,
        cpu_us: cpu / count,
    }
}

/// Takes and releases `keys` `repeats` times (`once`: with `acquire_many`, one attempt;
/// else `acquire_many_wait`); the median time to take them (ms), the script calls per key of
/// one take, and Redis' CPU (summed over `admin`'s servers) per take (ms).
async fn take_many<S: Strategy>(
    locker: &Locker<S>,
    admin: &[Client],
    keys: &[String],
    repeats: usize,
    once: bool,
) -> (f64, f64, f64) {
    let mut times = Vec::with_capacity(repeats);
    let (mut calls, mut cpu) = (0, 0.0);
    for _ in 0..repeats {
        let mut before = Vec::new();
        for a in admin {
            before.push(commandstats(a).await);
            cpu -= redis_cpu_us(a).await;
        }
        let start = Instant::now();
        let set = if once {
            locker.acquire_many(keys, &opts()).await
        } else {
            locker.acquire_many_wait(keys, &opts()).await
        }
        .expect("free keys");
        times.push(start.elapsed().as_secs_f64() * 1e3);
        for (a, b) in admin.iter().zip(&before) {
            cpu += redis_cpu_us(a).await;
            calls += calls_since(b, &commandstats(a).await).0;
        }
        set.release().await.expect("release");
        locker.idle().await;
    }
    times.sort_by(f64::total_cmp);
    (
        pct(&times, 0.5),
        calls as f64 / (repeats * keys.len()) as f64,
        cpu / 1e3 / repeats as f64,
    )
}

fn selected(case: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    let only: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--only")
        .map(|w| w[1].as_str())
        .collect();
    only.is_empty() || only.contains(&case)
}

async fn coordinator(quick: bool) {
    let (_server, url) = common::bench_redis();
    let admin = common::client_for(&url).await;
    println!(
        "waitlock sets ({}) against {url}",
        if quick { "quick" } else { "full" }
    );
    if selected("handoff") {
        let mut lockers = Vec::new();
        for _ in 0..4 {
            lockers.push(common::queued_locker(&url).await);
        }
        let n = if quick { 300 } else { 1_000 };
        let one = vec!["sets-one".to_owned()];
        let two = vec!["sets-a".to_owned(), "sets-b".to_owned()];
        let (mut p50_one, mut p50_two) = (Vec::new(), Vec::new());
        for round in 0..2 {
            for (name, keys) in [("1 key", &one), ("2-key set", &two)] {
                let g = handoffs(&admin, &lockers, keys, n).await;
                println!(
                    "handoff round {round} {name:>9}: gap p50 {:.3} ms p99 {:.3} ms, {:.2} calls/acq, Redis CPU {:.0} us/acq",
                    g.p50_ms, g.p99_ms, g.calls, g.cpu_us
                );
                if keys.len() == 1 {
                    p50_one.push(g.p50_ms);
                } else {
                    p50_two.push(g.p50_ms);
                }
            }
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "handoff: 2-key set gap p50 / 1 key gap p50 = {:.2} (target <= 1.5)",
            mean(&p50_two) / mean(&p50_one)
        );
    }
    let repeats = if quick { 5 } else { 11 };
    if selected("many") {
        let keys: Vec<String> = (0..1000).map(|i| format!("{{acct}}:{i}")).collect();
        let queued = common::queued_locker(&url).await;
        let admin = std::slice::from_ref(&admin);
        let (ms, calls, cpu) = take_many(&queued, admin, &keys, repeats, false).await;
        println!("many: 1,000 keys in one slot, queued locker, in order (acquire_many_wait): median {ms:.1} ms to take, {:.0} calls, Redis CPU {cpu:.1} ms per take", calls * 1000.0);
        let (ms, calls, cpu) = take_many(&queued, admin, &keys, repeats, true).await;
        println!("many: 1,000 keys in one slot, queued locker, at once (acquire_many): median {ms:.1} ms to take, {:.0} calls, Redis CPU {cpu:.1} ms per take", calls * 1000.0);
        let polling = Locker::new(common::client_for(&url).await);
        let (ms, calls, cpu) = take_many(&polling, admin, &keys, repeats, false).await;
        println!("many: 1,000 keys in one slot, polling locker, at once (acquire_many_wait): median {ms:.1} ms to take, {:.0} calls, Redis CPU {cpu:.1} ms per take", calls * 1000.0);
    }
    if selected("cluster") {
        let cluster = RedisCluster::start(3, 0);
        let mut admins = Vec::new();
        for port in cluster.primaries() {
            admins.push(common::client_for(&format!("redis://127.0.0.1:{port}")).await);
        }
        let keys: Vec<String> = (0..1000).map(|i| format!("spread:{i}")).collect();
        let queued = common::queued_locker(&cluster.url()).await;
        let (ms, calls, cpu) = take_many(&queued, &admins, &keys, repeats, false).await;
        println!("cluster: 1,000 keys over 3 primaries, queued locker, in order: median {ms:.1} ms to take, {:.0} calls, Redis CPU {cpu:.1} ms per take", calls * 1000.0);
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let quick = std::env::args().any(|a| a == "--quick");
    rt.block_on(coordinator(quick));
}
