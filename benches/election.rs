//! Leader election (issue 33): failover on a clean resign, after a crash, observer lag, and
//! what an idle election costs Redis.
//!
//! ```sh
//! cargo bench --bench election            # -- --quick: fewer rounds
//! ```
//!
//! Candidates and observers are queued lockers (each its own connections and process id, as a
//! separate process has) in this one OS process. Uses a private `redis-server` unless
//! `REDIS_URL` is set.

#[path = "../tests/common/mod.rs"]
mod common;

use common::pct;
use common::server_info::{calls_since, commandstats};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::{LockOptions, Refresh};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn quantiles(name: &str, v: &mut [f64]) {
    v.sort_by(f64::total_cmp);
    println!(
        "{name}: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({} samples)",
        pct(v, 0.5),
        pct(v, 0.99),
        v.last().copied().unwrap_or(f64::NAN),
        v.len()
    );
}

async fn main_async(quick: bool) {
    let (_server, url) = common::bench_redis();
    let admin = common::client_for(&url).await;
    println!("waitlock election benchmark against {url}");
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30));

    // 1. Failover on a clean resign, and the observer's lag.
    let (a, b, o) = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
    );
    let name = "bench-resign";
    let mut seen = o
        .election(name)
        .expect("name")
        .observe()
        .await
        .expect("observe");
    let mut leader = a
        .election(name)
        .expect("name")
        .campaign("a", &opts)
        .await
        .expect("lead");
    let rounds = if quick { 50 } else { 300 };
    let (mut failover, mut lag_resign, mut lag_announced) = (Vec::new(), Vec::new(), Vec::new());
    let mut resign_call = Vec::new();
    for i in 0..rounds {
        let next_locker = if i % 2 == 0 { b.clone() } else { a.clone() };
        let next = tokio::spawn(async move {
            let l = next_locker
                .election("bench-resign")
                .expect("name")
                .campaign(
                    "next",
                    &LockOptions::new().with_wait(Duration::from_secs(30)),
                )
                .await
                .expect("lead");
            (l, Instant::now())
        });
        common::lock_queued(&o, name, 1).await.expect("queued");
        let old_term = leader.term();
        let resigned = Instant::now();
        leader.resign().await.expect("resign");
        resign_call.push(ms(resigned.elapsed()));
        let (l, led_at) = next.await.expect("task");
        seen.wait_for(|s| s.as_ref().is_some_and(|s| s.term > old_term))
            .await
            .expect("observed");
        let observed_at = Instant::now();
        failover.push(ms(led_at - resigned));
        lag_resign.push(ms(observed_at - resigned));
        lag_announced.push(ms(observed_at.saturating_duration_since(led_at)));
        leader = l;
    }
    leader.resign().await.expect("resign");
    quantiles(
        "failover on resign (resign called -> the next campaign returns)",
        &mut failover,
    );
    quantiles(
        "  of which the resign call itself (mark + release)",
        &mut resign_call,
    );
    quantiles("observer: resign called -> new term seen", &mut lag_resign);
    quantiles(
        "observer: new leader's campaign returned -> new term seen",
        &mut lag_announced,
    );

    // 2. Failover after a crash: a leader that stops refreshing (lease 200 ms).
    let ttl = Duration::from_millis(200);
    let crash_rounds = if quick { 5 } else { 20 };
    let mut over = Vec::new();
    for _ in 0..crash_rounds {
        let stopped = a
            .election("bench-crash")
            .expect("name")
            .campaign("a", &opts.clone().with_ttl(ttl).with_refresh(Refresh::Off))
            .await
            .expect("lead");
        let taken = Instant::now();
        std::mem::forget(stopped);
        let next = b
            .election("bench-crash")
            .expect("name")
            .campaign("b", &opts)
            .await
            .expect("lead");
        over.push(ms(taken.elapsed()) - ms(ttl));
        next.resign().await.expect("resign");
    }
    quantiles("failover after a crash: past the 200 ms lease", &mut over);

    // 3. An idle election: 10 candidates (1 leads, 9 queued), 100 observers in 10 lockers.
    let mut candidates = Vec::new();
    for _ in 0..10 {
        candidates.push(common::queued_locker(&url).await);
    }
    let idle = "bench-idle";
    let lead = candidates[0]
        .election(idle)
        .expect("name")
        .campaign("c0", &opts)
        .await
        .expect("lead");
    let mut waiting = Vec::new();
    for c in &candidates[1..] {
        let e = c.election(idle).expect("name");
        let opts = opts.clone().with_wait(Duration::from_secs(120));
        waiting.push(tokio::spawn(async move { e.campaign("c", &opts).await }));
    }
    common::lock_queued(&candidates[0], idle, 9)
        .await
        .expect("queued");
    let mut receivers = Vec::new();
    for c in &candidates {
        for _ in 0..10 {
            receivers.push(
                c.election(idle)
                    .expect("name")
                    .observe()
                    .await
                    .expect("observe"),
            );
        }
    }
    let window = Duration::from_secs(if quick { 5 } else { 20 });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = commandstats(&admin).await;
    tokio::time::sleep(window).await;
    let after = commandstats(&admin).await;
    let (_, calls) = calls_since(&before, &after);
    println!(
        "idle election, 10 candidates and 100 observers: {calls} commands in {window:?} ({:.2}/s; the leader's lease is 10 s, refreshed every 8 s)",
        calls as f64 / window.as_secs_f64()
    );
    let mut by: Vec<(String, u64)> = after
        .iter()
        .map(|(n, v)| (n.clone(), v - before.get(n).unwrap_or(&0)))
        .filter(|(n, v)| *v > 0 && !n.starts_with("info"))
        .collect();
    by.sort_by_key(|e| std::cmp::Reverse(e.1));
    println!("  by command: {by:?}");
    drop(receivers);
    lead.resign().await.expect("resign");
    for w in waiting {
        w.abort();
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let quick = std::env::args().any(|a| a == "--quick");
    rt.block_on(main_async(quick));
}
