//! Cost curves (issue 34): how the handoff gap, Redis' CPU and the calls grow with the work, each
//! curve measured point by point in one run.
//!
//! ```sh
//! cargo bench --bench curves && cargo bench --bench plots   # -- --quick: smaller points
//! ```
//!
//! - `refreshing`: locks held and kept alive by one locker (100, 10,000, 100,000): script calls
//!   per refresh period, Redis CPU as a share of one core, the heap each held lock costs, and
//!   losses while `CLIENT KILL` cuts the locker's connection every 2 s;
//! - `held`: distinct keys one process holds at once (1, 1,000, 100,000), and what an acquire +
//!   release pair of another key then costs (latency, Redis CPU);
//! - `queued`: waiters queued on one key in one process (1, 100, 1,000, 10,000): handoff gap and
//!   Redis CPU per acquisition;
//! - `processes`: queued lockers, each with its own connections and process id as a separate
//!   process has, contending for one key (2, 8, 32): the same figures.
//!
//! Uses a private `redis-server` unless `REDIS_URL` is set. Prints one line per point and writes
//! them to `target/waitlock-curves.json` (one JSON object per line).

#[path = "../tests/common/mod.rs"]
mod common;

use common::alloc::live_heap;
use common::server_info::{calls_since, commandstats, redis_cpu_us};
use common::{cmd, pct};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{LockOptions, Locker, Queue, Refresh};

#[global_allocator]
static ALLOC: common::alloc::CountingAlloc = common::alloc::CountingAlloc;

/// One point of one curve: its x and named figures.
struct Point {
    curve: &'static str,
    x: usize,
    figures: Vec<(&'static str, f64)>,
}

impl Point {
    fn json(&self) -> String {
        let mut s = format!("{{\"curve\":\"{}\",\"x\":{}", self.curve, self.x);
        for (k, v) in &self.figures {
            if v.is_finite() {
                s.push_str(&format!(",\"{k}\":{v:.4}"));
            }
        }
        s.push('}');
        s
    }

    fn line(&self) -> String {
        let figures: Vec<String> = self
            .figures
            .iter()
            .map(|(k, v)| format!("{k}={v:.3}"))
            .collect();
        format!("{:<11} x={:<7} {}", self.curve, self.x, figures.join(" "))
    }
}

async fn release_all(guards: Vec<waitlock::LockGuard>) {
    let mut tasks = Vec::new();
    let mut guards = guards.into_iter().peekable();
    while guards.peek().is_some() {
        let chunk: Vec<_> = guards.by_ref().take(1_000).collect();
        tasks.push(tokio::spawn(async move {
            for g in chunk {
                let _ = g.release().await;
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}

/// `n` locks kept alive by one locker for two refresh periods after one of warm-up, with the
/// locker's connection cut every 2 s.
async fn refreshing(url: &str, admin: &Client, n: usize, ttl: Duration) -> Point {
    let client = common::client_for(url).await;
    let locker = Locker::new(client.clone());
    let ratio = 0.8;
    let period = ttl.mul_f64(ratio);
    let opts = LockOptions::new().with_ttl(ttl).with_refresh_ratio(ratio);
    // The heap of the guards alone, then with their keep-alive.
    let heap0 = live_heap();
    let mut guards = common::hold_many(&locker, "refreshing", n, &opts, false).await;
    let heap_guards = live_heap();
    for g in guards.iter_mut() {
        g.keep_alive();
    }
    let heap_kept = live_heap();
    tokio::time::sleep(period).await;
    let before = commandstats(admin).await;
    let cpu0 = redis_cpu_us(admin).await;
    let start = Instant::now();
    let measure = period * 2;
    let mut kills = 0;
    while start.elapsed() < measure {
        tokio::time::sleep(Duration::from_secs(2).min(measure.saturating_sub(start.elapsed())))
            .await;
        if start.elapsed() < measure {
            if let Ok(id) = client.client_id::<i64>().await {
                let _: i64 = cmd(admin, "CLIENT KILL ID", vec![id.into()]).await;
                kills += 1;
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = redis_cpu_us(admin).await - cpu0;
    let (scripts, commands) = calls_since(&before, &commandstats(admin).await);
    let lost = guards.iter().filter(|g| g.loss().is_some()).count();
    let periods = wall / period.as_secs_f64();
    release_all(guards).await;
    locker.idle().await;
    Point {
        curve: "refreshing",
        x: n,
        figures: vec![
            ("script_calls_per_period", scripts as f64 / periods),
            ("script_calls_per_s", scripts as f64 / wall),
            ("commands_per_s", commands as f64 / wall),
            ("redis_cpu_pct_of_core", cpu / (wall * 1e6) * 100.0),
            ("redis_cpu_us_per_lease_refresh", cpu / (n as f64 * periods)),
            ("heap_bytes_per_lock", (heap_kept - heap0) as f64 / n as f64),
            (
                "heap_bytes_keep_alive_per_lock",
                (heap_kept - heap_guards) as f64 / n as f64,
            ),
            ("spurious_losses", lost as f64),
            ("connection_kills", kills as f64),
        ],
    }
}

/// `pairs` acquire + release pairs of fresh keys while the locker holds `n` other keys.
async fn held(url: &str, admin: &Client, n: usize, pairs: usize) -> Point {
    let locker = Locker::new(common::client_for(url).await);
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(120))
        .with_refresh(Refresh::Off);
    let guards = common::hold_many(&locker, "held", n, &opts, false).await;
    let before = commandstats(admin).await;
    let cpu0 = redis_cpu_us(admin).await;
    let mut took = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let t = Instant::now();
        let g = locker
            .acquire(&format!("pair-{i}"), &opts)
            .await
            .expect("acquire a free key");
        g.release().await.expect("release");
        took.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu = redis_cpu_us(admin).await - cpu0;
    let (_, commands) = calls_since(&before, &commandstats(admin).await);
    took.sort_by(f64::total_cmp);
    release_all(guards).await;
    Point {
        curve: "held",
        x: n,
        figures: vec![
            ("pair_p50_ms", pct(&took, 0.5)),
            ("pair_p99_ms", pct(&took, 0.99)),
            ("redis_cpu_us_per_pair", cpu / pairs as f64),
            ("commands_per_pair", commands as f64 / pairs as f64),
        ],
    }
}

/// Handoffs of one key among `tasks` tasks spread over `lockers`: each takes the key, holds it
/// 1 ms, releases, and queues again (so `tasks - 1` wait behind every holder); `acquisitions`
/// are measured once every task is queued. The gap is one holder's release (its start) to the
/// next holder's acquisition, as the contention bench measures it.
async fn handoffs(
    admin: &Client,
    curve: &'static str,
    x: usize,
    lockers: &[Locker<Queue>],
    tasks_n: usize,
    acquisitions: usize,
) -> Point {
    let key = format!("{curve}-{x}");
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(600));
    let first = lockers[0]
        .acquire_wait(&key, &opts)
        .await
        .expect("the first holder");
    // (acquired at, release started at) in ns since `epoch`.
    let epoch = Instant::now();
    let log = Arc::new(Mutex::new(Vec::<(u64, u64)>::with_capacity(
        acquisitions + 8,
    )));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in 0..tasks_n {
        let locker = lockers[w % lockers.len()].clone();
        let (key, opts, log, stop) = (key.clone(), opts.clone(), log.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let g = locker
                    .acquire_wait(&key, &opts)
                    .await
                    .expect("acquire_wait");
                let at = epoch.elapsed().as_nanos() as u64;
                tokio::time::sleep(Duration::from_millis(1)).await;
                let release = epoch.elapsed().as_nanos() as u64;
                g.release().await.expect("release");
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                log.push((at, release));
                if log.len() >= acquisitions {
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }));
    }
    // Every waiter queued before the clock starts.
    let limit = Instant::now() + Duration::from_secs(300);
    loop {
        let depth = common::queued(admin, &key).await;
        if depth as usize >= tasks_n || Instant::now() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = commandstats(admin).await;
    let cpu0 = redis_cpu_us(admin).await;
    let start = Instant::now();
    let released_first = epoch.elapsed().as_nanos() as u64;
    first.release().await.expect("release");
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = redis_cpu_us(admin).await - cpu0;
    let (scripts, commands) = calls_since(&before, &commandstats(admin).await);
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
    let n = log.len().max(1) as f64;
    let gaps = common::handoff_gaps(&mut log, released_first);
    Point {
        curve,
        x,
        figures: vec![
            ("gap_p50_ms", pct(&gaps, 0.5)),
            ("gap_p99_ms", pct(&gaps, 0.99)),
            ("redis_cpu_us_per_acq", cpu / n),
            ("script_calls_per_acq", scripts as f64 / n),
            ("commands_per_acq", commands as f64 / n),
            ("acq_per_s", n / wall),
        ],
    }
}

/// Which curves to run: all, or those named by `--only NAME` (repeatable).
fn selected(curve: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    let only: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--only")
        .map(|w| w[1].as_str())
        .collect();
    only.is_empty() || only.contains(&curve)
}

async fn coordinator(quick: bool) {
    let (_server, url) = common::bench_redis();
    let admin = common::client_for(&url).await;
    println!(
        "waitlock cost curves ({}) against {url}",
        if quick { "quick" } else { "full" }
    );
    let mut points = Vec::new();
    let mut emit = |p: Point| {
        println!("{}", p.line());
        points.push(p);
    };
    if selected("refreshing") {
        let sizes: &[usize] = if quick {
            &[100, 10_000]
        } else {
            &[100, 10_000, 100_000]
        };
        for &n in sizes {
            emit(refreshing(&url, &admin, n, Duration::from_secs(5)).await);
        }
    }
    if selected("held") {
        let sizes: &[usize] = if quick {
            &[1, 1_000]
        } else {
            &[1, 1_000, 100_000]
        };
        for &n in sizes {
            emit(held(&url, &admin, n, if quick { 500 } else { 3_000 }).await);
        }
    }
    if selected("queued") {
        let sizes: &[usize] = if quick {
            &[1, 100, 1_000]
        } else {
            &[1, 100, 1_000, 10_000]
        };
        let locker = common::queued_locker(&url).await;
        for &n in sizes {
            let acquisitions = if quick { 200 } else { 1_000 };
            // n queued behind every holder: n + 1 tasks.
            emit(
                handoffs(
                    &admin,
                    "queued",
                    n,
                    std::slice::from_ref(&locker),
                    n + 1,
                    acquisitions,
                )
                .await,
            );
        }
    }
    if selected("processes") {
        let sizes: &[usize] = if quick { &[2, 8] } else { &[2, 8, 32] };
        for &n in sizes {
            let mut lockers = Vec::new();
            for _ in 0..n {
                lockers.push(common::queued_locker(&url).await);
            }
            let acquisitions = if quick { 200 } else { 1_000 };
            // n lockers, one task each.
            emit(handoffs(&admin, "processes", n, &lockers, n, acquisitions).await);
        }
    }
    let json: Vec<String> = points.iter().map(Point::json).collect();
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/waitlock-curves.json");
    match std::fs::write(&out, json.join("\n") + "\n") {
        Ok(()) => println!("wrote {}", out.display()),
        Err(e) => eprintln!("could not write {}: {e}", out.display()),
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
