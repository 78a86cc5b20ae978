//! Permits under contention (issue 22): a semaphore of 4 permits and a read-write lock with
//! 90% readers, 4 queued lockers (4 processes as Redis sees them: each has its own subscriber
//! and connections) × 32 workers in this process, each looping acquire_wait / hold 1 ms /
//! release on one key, against a private `redis-server`.
//!
//! Reports per row: acquisitions per second against the ideal (N / hold for the semaphore),
//! the handoff gap (from a release being sent to the next acquisition returning, p50/p99),
//! fairness (Jain's index over the workers' counts), script calls per acquisition (from
//! INFO commandstats), and CPU per acquisition of this process (workers and Redis' client
//! side; Redis' own CPU is not counted).
//!
//! `cargo bench --bench permits`; `PERMITS_SECS` (default 5) per row.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{pct, RedisServer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::{LockOptions, Locker, MAX_PERMITS};

const PROCS: usize = 4;
const WORKERS: usize = 32;
const HOLD: Duration = Duration::from_millis(1);

/// Events of one run: (time, is_release).
#[derive(Default)]
struct Log {
    events: Vec<(Instant, bool)>,
}

async fn row(server: &RedisServer, name: &str, rw: bool, secs: u64) {
    let permits = if rw { MAX_PERMITS } else { 4 };
    let log = Arc::new(Mutex::new(Log::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let key = format!("bench-{name}");
    let mut tasks = Vec::new();
    for p in 0..PROCS {
        let locker = Locker::connect(&server.url())
            .await
            .expect("connect")
            .queued()
            .build()
            .await
            .expect("locker");
        let sem = locker.semaphore(permits).expect("semaphore");
        for w in 0..WORKERS {
            let (sem, log, stop, key) = (sem.clone(), log.clone(), stop.clone(), key.clone());
            // 90% readers: one worker in ten writes.
            let weight = if rw && (p * WORKERS + w).is_multiple_of(10) {
                MAX_PERMITS
            } else {
                1
            };
            tasks.push(tokio::spawn(async move {
                let opts = LockOptions::new()
                    .with_ttl(Duration::from_secs(5))
                    .with_wait(Duration::from_secs(60));
                let (mut n, mut held) = (0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let g = sem
                        .acquire_wait(&key, weight, &opts)
                        .await
                        .expect("acquire");
                    let got = Instant::now();
                    log.lock().unwrap().events.push((got, false));
                    tokio::time::sleep(HOLD).await;
                    held += got.elapsed();
                    log.lock().unwrap().events.push((Instant::now(), true));
                    g.release().await.expect("release");
                    n += 1;
                }
                (n, weight, held)
            }));
        }
    }
    let admin = server.client().await;
    // Warm up, then measure.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls0 = common::script_calls(&admin).await;
    let cpu0 = common::cpu_us();
    let start = Instant::now();
    log.lock().unwrap().events.clear();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let elapsed = start.elapsed().as_secs_f64();
    let calls = common::script_calls(&admin).await - calls0;
    let cpu = (common::cpu_us() - cpu0) as f64 / 1e6;
    let events = std::mem::take(&mut log.lock().unwrap().events);
    stop.store(true, Ordering::Relaxed);
    let mut counts = Vec::new();
    let (mut writes, mut held) = (0u64, Duration::ZERO);
    for t in tasks {
        let (n, weight, h) = t.await.expect("worker");
        held += h;
        counts.push(n as f64);
        if weight == MAX_PERMITS {
            writes += n;
        }
    }
    let acquisitions = events.iter().filter(|(_, r)| !r).count() as f64;
    let mut gaps = Vec::new();
    let mut last_release: Option<Instant> = None;
    let mut sorted = events.clone();
    sorted.sort_by_key(|(t, _)| *t);
    for (t, release) in sorted {
        if release {
            last_release = Some(t);
        } else if let Some(r) = last_release.take() {
            gaps.push((t - r).as_secs_f64() * 1e3);
        }
    }
    gaps.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let sum: f64 = counts.iter().sum();
    let sq: f64 = counts.iter().map(|c| c * c).sum();
    let jain = sum * sum / (counts.len() as f64 * sq);
    let rate = acquisitions / elapsed;
    // What a 1 ms tokio sleep really holds (timer ticks round it up).
    let hold_ms = held.as_secs_f64() * 1e3 / sum;
    let ideal = if rw {
        String::from("-")
    } else {
        format!(
            "{:.0} ({:.0} at the measured hold)",
            f64::from(permits) / HOLD.as_secs_f64(),
            f64::from(permits) / hold_ms * 1e3
        )
    };
    println!(
        "| {name} | {PROCS} x {WORKERS} | {rate:.0}/s | {ideal} | {hold_ms:.2} | {:.3} | {:.3} | {jain:.3} | {:.2} | {:.0} | {} |",
        pct(&gaps, 0.5),
        pct(&gaps, 0.99),
        calls as f64 / acquisitions,
        cpu / acquisitions * 1e6,
        if rw { format!("{writes} writes") } else { "-".into() },
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let secs = std::env::var("PERMITS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let server = RedisServer::start();
    println!("| row | procs x workers | acquisitions | ideal (N / hold) | hold measured ms | gap p50 ms | gap p99 ms | fairness | calls / acq | CPU µs / acq | notes |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    row(&server, "semaphore N=4", false, secs).await;
    row(&server, "rw lock 90% readers", true, secs).await;
}
