//! Contention benchmark: handoff latency, Redis load per acquisition, fairness, wait-timeout
//! precision and memory at scale, for `Locker` (default and tight backoff) and `Locker<Queue>`.
//!
//! `cargo bench --bench contention` (full) or `cargo bench --bench contention -- --quick`.
//! Uses a private `redis-server` unless `REDIS_URL` is set. Worker processes are copies of
//! this binary. Prints a table and writes one JSON object per configuration to
//! `target/waitlock-bench.json`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "contention/floor.rs"]
mod floor;
#[path = "contention/plain.rs"]
mod plain;

use common::worker::{Pipe, Proc};
use common::{cpu_us, env, env_num, now_ns, pct};
use std::collections::HashMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use waitlock::fred::prelude::*;
use waitlock::strategy::Strategy;
use waitlock::{Backoff, LockOptions, Locker, Queue};

/// Counts live heap bytes, so the scale workload can report what waiters hold now rather than
/// the allocator's high-water mark that RSS shows.
#[global_allocator]
static ALLOC: common::alloc::CountingAlloc = common::alloc::CountingAlloc;

use common::alloc::live_heap;
use common::server_info::{calls_since, commandstats, redis_cpu_us, used_memory};

const LOCKERS: [&str; 3] = ["locker-default", "locker-tight", "pubsub"];

/// The uncontended rows: the lockers, and the plain `SET NX PX` + release-script pair
/// (`contention/plain.rs`: what most Redis locks do, through the same workers).
const UNCONTENDED_KINDS: [&str; 4] = ["locker-default", "locker-tight", "pubsub", "plain"];

/// The handoff's rows: the lockers, and the floor of any two-call woken handoff
/// (`contention/floor.rs`: not a lock, a reference for Redis' work per acquisition).
const HANDOFF_KINDS: [&str; 4] = ["locker-default", "locker-tight", "pubsub", "floor"];

// ---------------------------------------------------------------- worker side

/// The wake statistics line a worker prints (`S <by grant> <by timer> <by other wake-ups>`).
fn stats_line<S: Strategy>(locker: &Locker<S>) -> String {
    let s = locker.stats().wakes;
    format!(
        "S {} {} {}",
        s.by_notification,
        s.by_timer,
        s.by_reconnect + s.by_lagged + s.by_resubscribe
    )
}

/// The queued locker behind a generic one, if it is one.
fn queued<S: Strategy>(locker: &Locker<S>) -> Option<&Locker<Queue>> {
    (locker as &dyn std::any::Any).downcast_ref::<Locker<Queue>>()
}

fn options(kind: &str) -> LockOptions {
    let o = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait(Duration::from_secs(30));
    if kind == "locker-tight" {
        o.with_backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(8),
        ))
    } else {
        o
    }
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse::<u64>().ok())
        .unwrap_or(0)
        * 4096
}

async fn worker() {
    let url = env("BENCH_URL");
    let kind = env("BENCH_LOCKER");
    if kind == "floor" || kind == "plain" {
        return bare_worker(&url, &kind).await;
    }
    let mut builder = Locker::connect(&url).await.expect("worker connect");
    // To compare handoff designs: 0 makes every handoff a short grant its waiter confirms.
    if let Ok(ms) = std::env::var("BENCH_PRESENCE_MS").map(|v| v.parse().unwrap_or(100)) {
        builder = builder.presence_window(Duration::from_millis(ms));
    }
    if kind == "pubsub" {
        worker_with(builder.queued().build().await.expect("pubsub"), &kind).await
    } else {
        worker_with(builder.build().expect("locker"), &kind).await
    }
}

async fn worker_with<S: Strategy>(locker: Locker<S>, kind: &str) {
    let kind = kind.to_owned();
    let workload = env("BENCH_WORKLOAD");
    let tasks = env_num("BENCH_TASKS") as usize;
    let iters = env_num("BENCH_ITERS") as usize;
    let base = env_num("BENCH_BASE_ID") as usize;
    let locker = Arc::new(locker);
    let mut pipe = Pipe::open();
    if workload == "idle" {
        return idle_worker(&locker, &kind, tasks, pipe).await;
    }
    pipe.say("ready");
    let _go = pipe.input.recv().await;
    let cpu_at_go = cpu_us();

    let records = Arc::new(Mutex::new(Vec::<String>::new()));
    match workload.as_str() {
        "uncontended" | "handoff" => {
            let mut handles = Vec::new();
            for t in 0..tasks {
                let (locker, records) = (locker.clone(), records.clone());
                let id = base + t;
                let key = if workload == "handoff" {
                    "bench-handoff".to_owned()
                } else {
                    format!("bench-own-{id}")
                };
                let opts = options(&kind);
                let hold = workload == "handoff";
                let until =
                    std::time::Instant::now() + Duration::from_millis(env_num("BENCH_DURATION_MS"));
                handles.push(tokio::spawn(async move {
                    let mut mine = Vec::new();
                    // uncontended: a fixed count; handoff: until the shared deadline, so that
                    // how many each worker got measures fairness.
                    let mut done = 0;
                    while if hold {
                        std::time::Instant::now() < until
                    } else {
                        done < iters
                    } {
                        done += 1;
                        let g = if hold {
                            match locker.acquire_wait(&key, &opts).await {
                                Ok(g) => g,
                                // Starvation is a result here (the polling locker with its
                                // default backoff can wait past 30 s), not a harness failure.
                                Err(waitlock::Error::WaitTimeout { .. }) => {
                                    mine.push("X".to_owned());
                                    continue;
                                }
                                Err(e) => panic!("acquire_wait: {e}"),
                            }
                        } else {
                            locker.acquire(&key, &opts).await.expect("acquire")
                        };
                        let acquired = now_ns();
                        if hold {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                        let release_start = now_ns();
                        g.release().await.expect("release");
                        mine.push(format!("R {id} {acquired} {release_start}"));
                    }
                    records.lock().await.extend(mine);
                }));
            }
            for h in handles {
                h.await.expect("task");
            }
        }
        "wait-timeout" => {
            let opts = options(&kind).with_wait(Duration::from_millis(200));
            for _ in 0..iters {
                let start = std::time::Instant::now();
                let r = locker.acquire_wait("bench-held", &opts).await;
                let over = start.elapsed().as_nanos() as i64 - 200_000_000;
                assert!(
                    matches!(r, Err(waitlock::Error::WaitTimeout { .. })),
                    "{r:?}"
                );
                records.lock().await.push(format!("T {over}"));
            }
        }
        "scale" => {
            let client = locker.client().clone();
            let holder = Locker::new(client.clone());
            let keys = 1000;
            let mut held = Vec::new();
            for k in 0..keys {
                held.push(
                    holder
                        .acquire(&format!("bench-scale-{k}"), &LockOptions::new())
                        .await
                        .expect("hold"),
                );
            }
            let before = rss_bytes();
            let heap_before = live_heap();
            let opts = options(&kind).with_wait(Duration::from_secs(120));
            let mut handles = Vec::new();
            for i in 0..tasks {
                let (locker, opts) = (locker.clone(), opts.clone());
                handles.push(tokio::spawn(async move {
                    let g = locker
                        .acquire_wait(&format!("bench-scale-{}", i % keys), &opts)
                        .await
                        .expect("wait");
                    g.release().await.expect("release");
                }));
            }
            // Wait until every waiter is registered (pub/sub) or has made its first attempt.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let ready = queued(&locker).is_none_or(|l| l.registry_size().waiters == tasks);
                if ready || tokio::time::Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if let Some(l) = queued(&locker) {
                l.subscriptions_settled().await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await; // let the Locker's waiters settle into sleeping
            let during = rss_bytes();
            let heap_during = live_heap();
            let subs = common::pubsub_connections(&client).await;
            for g in held {
                g.release().await.expect("release");
            }
            for h in handles {
                h.await.expect("waiter");
            }
            let registry = queued(&locker).map_or(0, |l| l.registry_size().waiters);
            locker.idle().await;
            let mut queued = 0;
            for k in 0..keys {
                queued += holder
                    .status(&format!("bench-scale-{k}"))
                    .await
                    .expect("status")
                    .queued;
            }
            let after = rss_bytes();
            let heap_after = live_heap();
            records.lock().await.push(format!(
                "M {before} {during} {after} {subs} {registry} {heap_before} {heap_during} {heap_after} {queued}"
            ));
        }
        other => panic!("unknown workload {other}"),
    }
    for r in records.lock().await.iter() {
        pipe.say(r.clone());
    }
    pipe.say(stats_line(&locker));
    pipe.say(format!("C {}", cpu_us() - cpu_at_go));
    pipe.close();
}

/// Either bare pair the bench measures waitlock against: the floor of a woken handoff, or the
/// plain lock pair.
enum Bare {
    Floor(floor::Floor),
    Plain(plain::Plain),
}

impl Bare {
    async fn acquire(&self, key: &str, token: &str) {
        match self {
            Bare::Floor(f) => f.acquire(key, token).await,
            Bare::Plain(p) => p.acquire(key, token).await,
        }
    }

    async fn release(&self, key: &str, token: &str) {
        match self {
            Bare::Floor(f) => f.release(key, token).await,
            Bare::Plain(p) => p.release(key, token).await,
        }
    }
}

/// Role `handoff` for the `floor` row, `uncontended` for the `plain` row: the workload's loop
/// (handoff: acquire, hold 1 ms, release, until the shared deadline; uncontended: acquire and
/// release a key of its own, `BENCH_ITERS` times) on the bare pair of `contention/floor.rs` or
/// `contention/plain.rs`.
async fn bare_worker(url: &str, kind: &str) {
    let tasks = env_num("BENCH_TASKS") as usize;
    let base = env_num("BENCH_BASE_ID") as usize;
    let iters = env_num("BENCH_ITERS");
    let handoff = kind == "floor";
    assert_eq!(
        env("BENCH_WORKLOAD"),
        if handoff { "handoff" } else { "uncontended" },
        "the {kind} row's workload"
    );
    let bare = Arc::new(if handoff {
        Bare::Floor(floor::Floor::connect(url).await)
    } else {
        Bare::Plain(plain::Plain::connect(url).await)
    });
    let mut pipe = Pipe::open();
    pipe.say("ready");
    let _go = pipe.input.recv().await;
    let cpu_at_go = cpu_us();
    let until = std::time::Instant::now() + Duration::from_millis(env_num("BENCH_DURATION_MS"));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let bare = bare.clone();
            let id = base + t;
            let key = if handoff {
                "bench-handoff".to_owned()
            } else {
                format!("bench-own-{id}")
            };
            tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut n = 0u64;
                while if handoff {
                    std::time::Instant::now() < until
                } else {
                    n < iters
                } {
                    let token = format!("{id}.{n}");
                    n += 1;
                    bare.acquire(&key, &token).await;
                    let acquired = now_ns();
                    if handoff {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    let release_start = now_ns();
                    bare.release(&key, &token).await;
                    mine.push(format!("R {id} {acquired} {release_start}"));
                }
                mine
            })
        })
        .collect();
    for h in handles {
        for r in h.await.expect("task") {
            pipe.say(r);
        }
    }
    pipe.say("S 0 0 0".to_owned());
    pipe.say(format!("C {}", cpu_us() - cpu_at_go));
    pipe.close();
}

/// Role `idle`: `tasks` waiters on the keys `bench-idle-<i % BENCH_KEYS>` (held by the
/// coordinator). Says `ready` once all are registered and subscribed; on `measure` (every
/// waiter queued) `heap <live heap before> <live heap now>`; on `go` (the locks are released)
/// they take the lock in turn, each printing `A <key index> <ns when acquired>`, and release
/// at once.
async fn idle_worker<S: Strategy>(locker: &Arc<Locker<S>>, kind: &str, tasks: usize, pipe: Pipe) {
    let keys = env_num("BENCH_KEYS").max(1) as usize;
    let base = env_num("BENCH_BASE_ID") as usize;
    let heap_before = live_heap();
    let opts = options(kind).with_wait(Duration::from_secs(300));
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let mut handles = Vec::new();
    for i in 0..tasks {
        let (locker, opts, out, go) = (locker.clone(), opts.clone(), pipe.out.clone(), go.clone());
        let k = (base + i) % keys;
        handles.push(tokio::spawn(async move {
            let g = locker
                .acquire_wait(&format!("bench-idle-{k}"), &opts)
                .await
                .expect("wait");
            let at = now_ns();
            g.release().await.expect("release");
            let _ = out.send(format!("A {k} {at}"));
            drop(go);
        }));
    }
    if let Some(l) = queued(locker) {
        while l.registry_size().waiters < tasks {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        l.subscriptions_settled().await;
    }
    pipe.say("ready");
    let mut pipe = pipe;
    // Once every waiter is queued (the coordinator sees the queues full), what they hold.
    let _measure = pipe.input.recv().await;
    let heap_during = live_heap();
    pipe.say(format!("heap {heap_before} {heap_during}"));
    let _go = pipe.input.recv().await;
    for h in handles {
        h.await.expect("waiter");
    }
    pipe.say(stats_line(locker));
    pipe.close();
}

// ---------------------------------------------------------------- coordinator side

/// Commands a waitlock client sends: its calls.
const CLIENT_CMDS: [&str; 11] = [
    "fcall",
    "function|load",
    "evalsha",
    "eval",
    "script|load",
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "ping",
    "script",
];
/// What idle waiters send besides [`CLIENT_CMDS`]: no script runs while nothing is released,
/// so every `PUBSUB SHARDNUMSUB` (which scripts also run inside Redis) is then the hub's audit
/// on a cluster.
const AUDIT_CMD: &str = "pubsub|shardnumsub";

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| after.get(*n).unwrap_or(&0) - before.get(*n).unwrap_or(&0))
        .sum()
}

struct Run {
    records: Vec<String>,
    calls: u64,
    commands: u64,
    /// Redis' CPU time during the run (µs, `INFO cpu`).
    redis_cpu_us: f64,
    /// Calls by command name during the run (client calls and commands run inside scripts).
    by_command: Vec<(String, u64)>,
    wall: Duration,
    stats: (u64, u64, u64),
}

/// Starts `procs` worker processes for `workload`, each with `tasks` tasks.
#[allow(clippy::too_many_arguments)]
fn spawn_workers(
    url: &str,
    kind: &str,
    workload: &str,
    procs: usize,
    tasks: usize,
    iters: usize,
    duration: Duration,
    extra: &[(&str, String)],
) -> Vec<Proc> {
    (0..procs)
        .map(|p| {
            let mut env = vec![
                ("BENCH_URL", url.to_owned()),
                ("BENCH_LOCKER", kind.to_owned()),
                ("BENCH_WORKLOAD", workload.to_owned()),
                ("BENCH_TASKS", tasks.to_string()),
                ("BENCH_ITERS", iters.to_string()),
                ("BENCH_DURATION_MS", duration.as_millis().to_string()),
                ("BENCH_BASE_ID", (p * tasks).to_string()),
            ];
            env.extend(extra.iter().cloned());
            Proc::spawn("bench", &env)
        })
        .collect()
}

/// Reads every worker's lines until it exits; sums their wake statistics (`S` lines).
async fn collect(workers: Vec<Proc>) -> (Vec<String>, (u64, u64, u64)) {
    let mut lines = Vec::new();
    let mut stats = (0, 0, 0);
    for mut w in workers {
        while let Some(l) = w
            .next_line(tokio::time::Instant::now() + Duration::from_secs(600))
            .await
        {
            if let Some(s) = l.strip_prefix("S ") {
                let v: Vec<u64> = s.split(' ').filter_map(|x| x.parse().ok()).collect();
                if v.len() == 3 {
                    stats = (stats.0 + v[0], stats.1 + v[1], stats.2 + v[2]);
                }
            } else if l != "ready" && !l.starts_with("heap ") {
                lines.push(l);
            }
        }
    }
    (lines, stats)
}

#[allow(clippy::too_many_arguments)]
async fn run_config(
    admin: &Client,
    url: &str,
    kind: &str,
    workload: &str,
    procs: usize,
    tasks: usize,
    iters: usize,
    duration: Duration,
) -> Run {
    let mut workers = spawn_workers(url, kind, workload, procs, tasks, iters, duration, &[]);
    for w in workers.iter_mut() {
        w.expect("ready", Duration::from_secs(60))
            .await
            .expect("worker did not start");
    }
    let before = commandstats(admin).await;
    let cpu_before = redis_cpu_us(admin).await;
    let start = std::time::Instant::now();
    for w in workers.iter_mut() {
        w.send("go");
    }
    let (records, stats) = collect(workers).await;
    let wall = start.elapsed();
    let redis_cpu = redis_cpu_us(admin).await - cpu_before;
    let after = commandstats(admin).await;
    let calls = delta(&before, &after, &CLIENT_CMDS);
    // Every command Redis ran (client calls and those inside scripts), not a list of names: a
    // list goes stale when a script starts using a command it does not name (until 2026-12-05
    // it lacked HMGET and ZMSCORE, 3 of 22.9 commands per contended acquisition).
    let (_, commands) = calls_since(&before, &after);
    let mut by_command: Vec<(String, u64)> = after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).unwrap_or(&0)))
        .filter(|(name, n)| *n > 0 && !name.starts_with("info") && name != "cluster|nodes")
        .collect();
    by_command.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Run {
        records,
        calls,
        commands,
        redis_cpu_us: redis_cpu,
        by_command,
        wall,
        stats,
    }
}

struct Report {
    fields: Vec<(String, String)>,
}

impl Report {
    fn new(locker: &str, workload: &str, workers: usize, procs: usize) -> Report {
        let mut r = Report { fields: Vec::new() };
        r.s("locker", locker);
        r.s("workload", workload);
        r.n("workers", workers as f64);
        r.n("procs", procs as f64);
        r
    }
    fn s(&mut self, k: &str, v: &str) {
        self.fields.push((k.into(), format!("\"{v}\"")));
    }
    fn n(&mut self, k: &str, v: f64) {
        let v = if v.is_finite() {
            format!("{}", (v * 1000.0).round() / 1000.0)
        } else {
            "null".into()
        };
        self.fields.push((k.into(), v));
    }
    /// A distribution as 41 quantiles (0, 2.5%, ..., 100%), for the plots.
    fn quantiles(&mut self, k: &str, sorted: &[f64]) {
        if sorted.is_empty() {
            return;
        }
        let q: Vec<String> = (0..=40)
            .map(|i| {
                format!(
                    "{}",
                    (pct(sorted, i as f64 / 40.0) * 1000.0).round() / 1000.0
                )
            })
            .collect();
        self.fields.push((k.into(), format!("[{}]", q.join(","))));
    }
    fn json(&self) -> String {
        let body: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", body.join(","))
    }
    fn line(&self) -> String {
        self.fields
            .iter()
            .filter(|(_, v)| !v.starts_with('['))
            .map(|(k, v)| format!("{k}={}", v.trim_matches('"')))
            .collect::<Vec<_>>()
            .join("  ")
    }
}

/// The worker processes' CPU time (user + system) over the run, in µs.
fn worker_cpu_us(run: &Run) -> f64 {
    run.records
        .iter()
        .filter_map(|l| l.strip_prefix("C ")?.parse::<f64>().ok())
        .sum()
}

fn handoff_figures(r: &mut Report, run: &Run) {
    let mut holds: Vec<(u64, u64, u64)> = run
        .records
        .iter()
        .filter_map(|l| {
            let v: Vec<u64> = l
                .strip_prefix("R ")?
                .split(' ')
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() == 3).then(|| (v[1], v[2], v[0]))
        })
        .collect();
    holds.sort_unstable();
    let n = holds.len();
    let mut all = Vec::new();
    let mut diff = Vec::new();
    let (mut same, mut overlaps) = (0usize, 0usize);
    let mut per_worker: HashMap<u64, usize> = HashMap::new();
    for (i, h) in holds.iter().enumerate() {
        *per_worker.entry(h.2).or_default() += 1;
        if i == 0 {
            continue;
        }
        let prev = holds[i - 1];
        if h.0 < prev.1 {
            overlaps += 1;
        }
        let gap = (h.0 as f64 - prev.1 as f64) / 1e6;
        all.push(gap);
        if h.2 == prev.2 {
            same += 1;
        } else {
            diff.push(gap);
        }
    }
    all.sort_by(f64::total_cmp);
    diff.sort_by(f64::total_cmp);
    r.n("acquisitions", n as f64);
    r.n("acq_per_s", n as f64 / run.wall.as_secs_f64());
    for (name, v) in [("gap_all", &all), ("gap_diff", &diff)] {
        r.n(&format!("{name}_p50_ms"), pct(v, 0.5));
        r.n(&format!("{name}_p90_ms"), pct(v, 0.9));
        r.n(&format!("{name}_p99_ms"), pct(v, 0.99));
        r.n(
            &format!("{name}_max_ms"),
            v.last().copied().unwrap_or(f64::NAN),
        );
    }
    r.quantiles("gap_diff_quantiles_ms", &diff);
    r.n("same_worker_share", same as f64 / (n.max(2) - 1) as f64);
    r.n("calls_per_acq", run.calls as f64 / n.max(1) as f64);
    r.n("cpu_us_per_acq", worker_cpu_us(run) / n.max(1) as f64);
    r.n("commands_per_acq", run.commands as f64 / n.max(1) as f64);
    r.n("redis_cpu_us_per_acq", run.redis_cpu_us / n.max(1) as f64);
    if std::env::var("BENCH_BY_COMMAND").is_ok() {
        let per: Vec<String> = run
            .by_command
            .iter()
            .map(|(c, k)| format!("{c} {:.2}", *k as f64 / n.max(1) as f64))
            .collect();
        println!(
            "# commands per acquisition (the next line's run): {}",
            per.join(", ")
        );
    }
    let min = per_worker.values().min().copied().unwrap_or(0);
    let max = per_worker.values().max().copied().unwrap_or(1);
    r.n("fair_min", min as f64);
    r.n("fair_max", max as f64);
    r.n("fairness_min_over_max", min as f64 / max as f64);
    r.n("violations", overlaps as f64);
    r.n(
        "wait_timeouts",
        run.records.iter().filter(|l| *l == "X").count() as f64,
    );
    r.n("wakes_notification", run.stats.0 as f64);
    r.n("wakes_timer", run.stats.1 as f64);
}

/// `SCRIPT LOAD`: the script's SHA1.
async fn script_load(admin: &Client, script: &str) -> Option<String> {
    admin
        .custom(
            waitlock::fred::types::CustomCommand::new_static("SCRIPT", None, false),
            vec!["LOAD", script],
        )
        .await
        .ok()
}

/// Requests per second of `redis-benchmark -c 16` running one command `requests` times.
fn redis_benchmark(port: u16, requests: usize, command: &[&str]) -> Option<f64> {
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-c",
            "16",
            "-n",
            &requests.to_string(),
        ])
        .args(["-r", "100000000", "--csv"])
        .args(command)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().last()?;
    row.split(',').nth(1)?.trim_matches('"').parse().ok()
}

/// What Redis does with the crate's own acquire and release scripts: (acquires/s, releases/s,
/// Redis CPU µs per acquire + release).
async fn ceiling(admin: &Client, port: Option<u16>, requests: usize) -> Option<(f64, f64, f64)> {
    let port = port?;
    let acquire = script_load(admin, waitlock::scripts::ACQUIRE).await?;
    let release = script_load(admin, waitlock::scripts::RELEASE).await?;
    // The same KEYS and ARGV as the crate sends (see `waitlock::scripts`).
    let call = |sha: &str| -> Vec<String> {
        [
            "EVALSHA",
            sha,
            "4",
            "{b:__rand_int__}",
            "{b:__rand_int__}:fence",
            "{b:__rand_int__}:q",
            "{b:__rand_int__}:p",
            "tok",
            "30000",
            "3600000",
            "500",
            "100",
            "",
            "",
            "",
            "",
        ]
        .map(String::from)
        .to_vec()
    };
    let run = |sha: &str| {
        let args = call(sha);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        redis_benchmark(port, requests, &args)
    };
    let cpu = redis_cpu_us(admin).await;
    let (a, r) = (run(&acquire)?, run(&release)?);
    Some((a, r, (redis_cpu_us(admin).await - cpu) / requests as f64))
}

/// The same measure for a peer-shaped lock without fence or queue (rslock's pair): a plain
/// `SET NX PX` and a three-line release script.
async fn plain_ceiling(
    admin: &Client,
    port: Option<u16>,
    requests: usize,
) -> Option<(f64, f64, f64)> {
    let port = port?;
    let release = script_load(
        admin,
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
    .await?;
    let cpu = redis_cpu_us(admin).await;
    let a = redis_benchmark(
        port,
        requests,
        &["SET", "{p:__rand_int__}", "tok", "NX", "PX", "30000"],
    )?;
    let r = redis_benchmark(
        port,
        requests,
        &["EVALSHA", &release, "1", "{p:__rand_int__}", "tok"],
    )?;
    Some((a, r, (redis_cpu_us(admin).await - cpu) / requests as f64))
}

/// `--only WORKLOAD` and `--locker KIND` select configurations (for profiling one of them).
fn selected(flag: &str, value: &str) -> bool {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == flag) {
        Some(i) => args.get(i + 1).is_some_and(|v| v == value),
        None => true,
    }
}

async fn coordinator(quick: bool) {
    let (server, url) = common::bench_redis();
    let admin = common::client_for(&url).await;
    let version: String = common::cmd(&admin, "INFO server", vec![]).await;
    let version = version
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_owned();
    println!(
        "waitlock contention benchmark ({}), Redis {version} at {url}",
        if quick { "quick" } else { "full" }
    );
    let mut reports: Vec<Report> = Vec::new();
    let mut emit = |r: Report| {
        println!("{}", r.line());
        reports.push(r);
    };

    // 1. uncontended
    let k = if quick { 2000 } else { 20000 };
    for kind in UNCONTENDED_KINDS
        .into_iter()
        .filter(|k| selected("--only", "uncontended") && selected("--locker", k))
    {
        for tasks in [1usize, 16] {
            let iters = k / tasks;
            let run = run_config(
                &admin,
                &url,
                kind,
                "uncontended",
                1,
                tasks,
                iters,
                Duration::ZERO,
            )
            .await;
            let pairs = run.records.iter().filter(|l| l.starts_with("R ")).count();
            let mut r = Report::new(kind, "uncontended", tasks, 1);
            r.n("pairs", pairs as f64);
            r.n("pairs_per_s", pairs as f64 / run.wall.as_secs_f64());
            r.n("calls_per_pair", run.calls as f64 / pairs as f64);
            r.n("cpu_us_per_pair", worker_cpu_us(&run) / pairs as f64);
            r.n("commands_per_pair", run.commands as f64 / pairs as f64);
            r.n("redis_cpu_us_per_pair", run.redis_cpu_us / pairs as f64);
            if std::env::var("BENCH_BY_COMMAND").is_ok() {
                let per: Vec<String> = run
                    .by_command
                    .iter()
                    .map(|(c, k)| format!("{c} {:.2}", *k as f64 / pairs as f64))
                    .collect();
                println!(
                    "# {kind} uncontended x{tasks} commands per pair: {}",
                    per.join(", ")
                );
            }
            emit(r);
        }
    }
    if selected("--only", "uncontended") {
        let port = server.as_ref().map(|s| s.port);
        let requests = if quick { 20000 } else { 200000 };
        let ceilings = [
            ("redis-benchmark", ceiling(&admin, port, requests).await),
            (
                "plain SET NX PX + release script",
                plain_ceiling(&admin, port, requests).await,
            ),
        ];
        for (name, rps) in ceilings {
            if let Some((a, rel, cpu)) = rps {
                let mut r = Report::new(name, "ceiling", 16, 1);
                r.n("acquire_rps", a);
                r.n("release_rps", rel);
                r.n("redis_cpu_us_per_pair", cpu);
                r.n("pairs_per_s", 1.0 / (1.0 / a + 1.0 / rel));
                emit(r);
            }
        }
    }

    // 2. handoff
    for kind in HANDOFF_KINDS
        .into_iter()
        .filter(|k| selected("--only", "handoff") && selected("--locker", k))
    {
        let shapes: Vec<(usize, usize)> = match std::env::var("BENCH_HANDOFF_SHAPE") {
            // e.g. BENCH_HANDOFF_SHAPE=2x2 (workers x procs) to study one shape
            Ok(s) => s
                .split_once('x')
                .and_then(|(w, p)| Some((w.parse().ok()?, p.parse().ok()?)))
                .into_iter()
                .collect(),
            Err(_) => vec![(8, 4), (64, 4)],
        };
        for (workers, procs) in shapes {
            // About 2,000 acquisitions at Locker<Queue>'s rate (about 370/s here); 400 in quick mode.
            let duration = Duration::from_millis(if quick { 1100 } else { 5500 });
            let run = run_config(
                &admin,
                &url,
                kind,
                "handoff",
                procs,
                workers / procs,
                0,
                duration,
            )
            .await;
            let mut r = Report::new(kind, "handoff", workers, procs);
            handoff_figures(&mut r, &run);
            emit(r);
        }
    }

    // 3. wait-timeout
    let holder = Locker::new(admin.clone());
    let held = holder
        .acquire(
            "bench-held",
            &LockOptions::new().with_ttl(Duration::from_secs(60)),
        )
        .await
        .expect("hold");
    for kind in LOCKERS
        .into_iter()
        .filter(|k| selected("--only", "wait-timeout") && selected("--locker", k))
    {
        let trials = 20;
        let run = run_config(
            &admin,
            &url,
            kind,
            "wait-timeout",
            1,
            1,
            trials,
            Duration::ZERO,
        )
        .await;
        let mut over: Vec<f64> = run
            .records
            .iter()
            .filter_map(|l| l.strip_prefix("T ")?.parse::<f64>().ok())
            .map(|ns| ns / 1e6)
            .collect();
        over.sort_by(f64::total_cmp);
        let mut r = Report::new(kind, "wait-timeout", 1, 1);
        r.n("trials", over.len() as f64);
        r.n("overshoot_p50_ms", pct(&over, 0.5));
        r.n("overshoot_max_ms", over.last().copied().unwrap_or(f64::NAN));
        r.quantiles("overshoot_quantiles_ms", &over);
        r.n("calls_per_trial", run.calls as f64 / trials as f64);
        r.n("commands_per_trial", run.commands as f64 / trials as f64);
        emit(r);
    }
    held.release().await.expect("release");

    // 4. scale
    let waiters = if quick { 2000 } else { 10000 };
    for kind in ["locker-default", "pubsub"]
        .into_iter()
        .filter(|k| selected("--only", "scale") && selected("--locker", k))
    {
        let run = run_config(&admin, &url, kind, "scale", 1, waiters, 1, Duration::ZERO).await;
        let m: Vec<i64> = run
            .records
            .iter()
            .find_map(|l| l.strip_prefix("M "))
            .map(|s| s.split(' ').filter_map(|x| x.parse().ok()).collect())
            .unwrap_or_default();
        let mut r = Report::new(kind, "scale", waiters, 1);
        if let [before, during, after, subs, registry, heap_before, heap_during, heap_after, queued] =
            m[..]
        {
            r.n("redis_queue_after", queued as f64);
            r.n(
                "heap_bytes_per_waiter",
                (heap_during as f64 - heap_before as f64) / waiters as f64,
            );
            r.n(
                "heap_after_minus_before_kib",
                (heap_after as f64 - heap_before as f64) / 1024.0,
            );
            r.n("rss_before_mib", before as f64 / 1048576.0);
            r.n("rss_waiting_mib", during as f64 / 1048576.0);
            r.n("rss_after_mib", after as f64 / 1048576.0);
            r.n(
                "rss_bytes_per_waiter",
                (during as f64 - before as f64) / waiters as f64,
            );
            r.n("subscriber_connections", subs as f64);
            r.n("registry_after", registry as f64);
        }
        r.n("calls_per_waiter", run.calls as f64 / waiters as f64);
        emit(r);
    }

    // 5. idle queues at scale: waiters of 8 processes queued on one key, then on 1,000 keys
    // (one waiter of each process per key), the locks held without refresh; what waiting costs
    // Redis and each process, then the handoffs at that depth.
    for keys in [1usize, 1000] {
        if !selected("--only", "idle") || !selected("--locker", "pubsub") {
            break;
        }
        let (procs, tasks) = if quick { (2, 250) } else { (8, 1000) };
        let total = procs * tasks;
        let holder = Locker::new(admin.clone());
        let mem_before = used_memory(&admin).await;
        let mut held = Vec::new();
        for k in 0..keys {
            held.push(
                holder
                    .acquire(
                        &format!("bench-idle-{k}"),
                        &LockOptions::new()
                            .with_ttl(Duration::from_secs(300))
                            .with_refresh_ratio(0.0),
                    )
                    .await
                    .expect("hold"),
            );
        }
        let mut workers = spawn_workers(
            &url,
            "pubsub",
            "idle",
            procs,
            tasks,
            0,
            Duration::ZERO,
            &[("BENCH_KEYS", keys.to_string())],
        );
        for w in workers.iter_mut() {
            w.expect("ready", Duration::from_secs(300))
                .await
                .expect("worker ready");
        }
        let queued_key = |k: usize| common::queue_key(&format!("bench-idle-{k}"));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let mut n = 0i64;
            for k in 0..keys {
                n += common::cmd::<i64>(&admin, "ZCARD", vec![queued_key(k).into()]).await;
            }
            if n as usize >= total || std::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mem_during = used_memory(&admin).await;
        let mut heap = 0i64;
        for w in workers.iter_mut() {
            w.send("measure");
            let l = w
                .expect("heap", Duration::from_secs(60))
                .await
                .expect("worker heap");
            let v: Vec<i64> = l
                .split(' ')
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            heap += v.get(1).copied().unwrap_or(0) - v.first().copied().unwrap_or(0);
        }
        let idle = Duration::from_secs(if quick { 3 } else { 10 });
        let before = commandstats(&admin).await;
        tokio::time::sleep(idle).await;
        let after = commandstats(&admin).await;
        let idle_cmds: Vec<&str> = CLIENT_CMDS.iter().copied().chain([AUDIT_CMD]).collect();
        let idle_calls = delta(&before, &after, &idle_cmds);
        let mut by_cmd: Vec<String> = idle_cmds
            .iter()
            .map(|c| (c, delta(&before, &after, &[c])))
            .filter(|(_, n)| *n > 0)
            .map(|(c, n)| format!("{c}:{n}"))
            .collect();
        by_cmd.sort();
        for w in workers.iter_mut() {
            w.send("go");
        }
        let released = now_ns();
        for g in held {
            g.release().await.expect("release");
        }
        let (lines, _) = collect(workers).await;
        let mut per_key: HashMap<u64, Vec<u64>> = HashMap::new();
        for l in &lines {
            if let Some(rest) = l.strip_prefix("A ") {
                let v: Vec<u64> = rest.split(' ').filter_map(|x| x.parse().ok()).collect();
                if let [k, at] = v[..] {
                    per_key.entry(k).or_default().push(at);
                }
            }
        }
        let mut gaps = Vec::new();
        let mut last = 0u64;
        for (_, mut ats) in per_key {
            ats.sort_unstable();
            last = last.max(*ats.last().unwrap_or(&0));
            gaps.extend(ats.windows(2).map(|w| (w[1] - w[0]) as f64 / 1e6));
        }
        gaps.sort_by(f64::total_cmp);
        let mut r = Report::new("pubsub", "idle", total, procs);
        r.n("keys", keys as f64);
        r.n("idle_s", idle.as_secs_f64());
        r.n("idle_calls", idle_calls as f64);
        r.n(
            "idle_calls_per_waiter_s",
            idle_calls as f64 / total as f64 / idle.as_secs_f64(),
        );
        r.s("idle_calls_by_command", &by_cmd.join(" "));
        r.n("heap_bytes_per_waiter", heap as f64 / total as f64);
        r.n(
            "redis_bytes_per_waiter",
            (mem_during - mem_before) as f64 / total as f64,
        );
        r.n("handoffs", gaps.len() as f64);
        r.n("gap_p50_ms", pct(&gaps, 0.5));
        r.n("gap_p99_ms", pct(&gaps, 0.99));
        r.n("all_served_s", (last.saturating_sub(released)) as f64 / 1e9);
        emit(r);
    }

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/waitlock-bench.json");
    let body: String = reports.iter().map(|r| r.json() + "\n").collect();
    match std::fs::write(&path, body) {
        Ok(()) => println!("\nwrote {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}

fn main() {
    let rt = if env("BENCH_RT") == "current" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    }
    .expect("runtime");
    if common::worker::role().is_some() {
        rt.block_on(worker());
    } else {
        let quick = std::env::args().any(|a| a == "--quick");
        rt.block_on(coordinator(quick));
    }
}
