//! Where Redis' time goes, path by path (issue 36): each lock script called directly, with the
//! arguments the library sends, against a private `redis-server`; the time of every call inside
//! Redis (its Lua and its commands) read from `SLOWLOG`, its commands from `INFO commandstats`.
//!
//! ```sh
//! cargo bench --bench script_paths                              # this build's scripts
//! BENCH_SCRIPTS_FROM=<rev> cargo bench --bench script_paths     # and <rev>'s, call for call
//! cargo bench --bench script_paths -- --quick                   # fewer cycles
//! BENCH_STEPS=1 cargo bench --bench script_paths                # each call's steps (steps.rs)
//! ```
//!
//! Paths: a take of a free key and its release, nobody queued (the uncontended pair); a release
//! that grants to the head of a queue of 31 waiters (`BENCH_WORKERS` - 1) over 4 listening
//! processes, the old holder's queueing attempt behind the new one, and a watcher's look (the
//! back waiter's attempt on the held key), the contention bench's 8 x 4 handoff without the
//! clients (whose wait rooms keep 6-7 in Redis' queue: `BENCH_WORKERS=8`). This build runs
//! twice, on keys of its own each: as the library's functions (`FCALL`, what the lockers send)
//! and as its scripts (`EVALSHA`, the fallback). With
//! `BENCH_SCRIPTS_FROM`, the scripts of that commit (`git show`) run on their own keys, each
//! cycle calling both versions in turn, so that a noisy machine slows both alike.
//!
//! This is a diagnostic: the server is warm and nothing else runs, so a script here takes
//! about a third of its time in the contention bench, where Redis is preempted between calls.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "script_paths/steps.rs"]
mod steps;

use common::scripts::{run as custom, subscriber};
use common::server_info::{calls_since, commandstats};
use common::RedisServer;
use std::collections::VecDeque;
use waitlock::fred::prelude::*;

/// Waiters in the queue, over this many processes (the contention bench's 8 x 4, less the holder;
/// `BENCH_WORKERS=<n>` for another number, 3 at least: the contention bench's wait rooms keep
/// its Redis queue far shorter than its workers).
const PROCESSES: usize = 4;
const WORKERS: usize = 32;
const TTL_MS: u64 = 10_000;

/// One version of the scripts, on its own keys.
struct Version {
    name: String,
    /// Called as the library's functions (`FCALL`), not as scripts (`EVALSHA`).
    fcall: bool,
    acquire: String,
    release: String,
    /// The contended key's names, and the free key's.
    busy: Vec<String>,
    free: Vec<String>,
}

/// A waiter: its process id, token and queue member (`"<pid> <ttl> <token>"`).
#[derive(Clone)]
struct Waiter {
    pid: String,
    token: String,
    member: String,
}

/// The paths measured, in the order they are printed.
const PATHS: [&str; 5] = [
    "take, free key",
    "release, nobody queued",
    "release that grants",
    "queueing attempt",
    "watcher's look",
];

fn int(v: &Value) -> i64 {
    match v {
        Value::Integer(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

/// The script `name` of commit `rev`, composed as `src/redis/scripts.rs` composes it (the
/// queue layer's later files, `queue_walk.lua` and `queue_watch.lua`, and the lock's
/// `lock_sets.lua`, where the commit has them: the queue layer was one file until issue 52,
/// and the other two came with issue 53's functions).
fn script_at(rev: &str, name: &str) -> String {
    let mut composed = String::new();
    for f in [
        "queue",
        "queue_walk",
        "queue_watch",
        "lock",
        "lock_sets",
        name,
    ] {
        let path = format!("{rev}:src/redis/lua/{f}.lua");
        let out = std::process::Command::new("git")
            .args(["show", &path])
            .output()
            .unwrap_or_else(|e| panic!("git show {path}: {e}"));
        if ["queue_walk", "queue_watch", "lock_sets"].contains(&f) && !out.status.success() {
            continue;
        }
        assert!(
            out.status.success(),
            "git show {path}: {} (BENCH_SCRIPTS_FROM needs a commit with the queue layer's \
             files, src/redis/lua/queue.lua and lock.lua)",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        // (A commit whose calls start by `begin_lock`, as `scripts.rs` composes them since the
        // Functions library: the call's start goes before the script itself.)
        if f == name && composed.contains("local function begin_lock()") {
            composed.push_str("\nbegin_lock()\n");
        }
        composed.push_str(&String::from_utf8(out.stdout).expect("utf-8 script"));
    }
    composed
}

fn names(tag: &str) -> Vec<String> {
    let k = format!("{{bench:{tag}}}");
    vec![
        k.clone(),
        format!("{k}:fence"),
        format!("{k}:q"),
        format!("{k}:p"),
    ]
}

impl Version {
    /// The words of a call by `w` of `target` (a script's SHA, or the library's function) on
    /// `keys`.
    fn call(&self, target: &str, keys: &[String], w: &Waiter) -> Vec<String> {
        let verb = if self.fcall { "FCALL" } else { "EVALSHA" };
        let mut words = vec![verb.to_owned(), target.to_owned(), keys.len().to_string()];
        words.extend(keys.iter().cloned());
        words.extend([
            w.token.clone(),
            TTL_MS.to_string(),
            waitlock::DEFAULT_RETENTION.as_millis().to_string(),
            waitlock::DEFAULT_CLAIM_WINDOW.as_millis().to_string(),
            waitlock::DEFAULT_PRESENCE_WINDOW.as_millis().to_string(),
            w.member.clone(),
            w.pid.clone(),
            String::new(),
            String::new(),
        ]);
        words
    }
}

/// A script reply's code, its first element.
fn code(reply: &Value) -> i64 {
    match reply {
        Value::Array(v) if !v.is_empty() => int(&v[0]),
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Runs one call and returns its reply code and its time inside Redis (µs, from the newest
/// SLOWLOG entry, which is this call's: nothing else sends commands).
async fn timed(c: &Client, words: Vec<String>) -> (i64, i64) {
    let code = code(&custom(c, words).await);
    let log = custom(c, vec!["SLOWLOG".into(), "GET".into(), "1".into()]).await;
    let us = match log {
        Value::Array(entries) => match entries.first() {
            Some(Value::Array(e)) if e.len() > 2 => int(&e[2]),
            other => panic!("unexpected SLOWLOG entry {other:?}"),
        },
        other => panic!("unexpected SLOWLOG reply {other:?}"),
    };
    (code, us)
}

/// One version's contended queue: its holder and its waiters, oldest first.
struct Queue {
    holder: Waiter,
    waiting: VecDeque<Waiter>,
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let cycles = if quick { 300 } else { 2_000 };
    let workers = match std::env::var("BENCH_WORKERS") {
        Ok(n) => n
            .parse::<usize>()
            .ok()
            .filter(|&n| n >= 3)
            .unwrap_or_else(|| panic!("BENCH_WORKERS={n}: a number, 3 at least")),
        Err(_) => WORKERS,
    };
    // (`BENCH_STEPS`: this build's scripts with checkpoints, and each call's steps printed.)
    let stepped = std::env::var_os("BENCH_STEPS").is_some();
    assert!(
        !(stepped && std::env::var_os("BENCH_SCRIPTS_FROM").is_some()),
        "BENCH_STEPS and BENCH_SCRIPTS_FROM: one at a time"
    );
    let with_steps = |src: &str, release: bool| {
        if stepped {
            steps::instrument(src, release)
        } else {
            src.to_owned()
        }
    };
    let server = RedisServer::start();
    let c = server.client().await;
    // Every call logged: `timed` reads its time from the newest entry.
    for (k, v) in [("slowlog-log-slower-than", "0"), ("slowlog-max-len", "16")] {
        custom(&c, vec!["CONFIG".into(), "SET".into(), k.into(), v.into()]).await;
    }

    // This build as the library (FCALL: what the lockers call), as scripts (EVALSHA: the
    // fallback), and `BENCH_SCRIPTS_FROM`'s scripts; with steps, this build's scripts only.
    let mut versions = Vec::new();
    if !stepped {
        versions.push(Version {
            name: "this build, the library (FCALL)".into(),
            fcall: true,
            acquire: String::new(),
            release: String::new(),
            busy: names("busy-fn"),
            free: names("free-fn"),
        });
    }
    versions.push(Version {
        name: "this build, scripts (EVALSHA)".into(),
        fcall: false,
        acquire: with_steps(waitlock::scripts::ACQUIRE, false),
        release: with_steps(waitlock::scripts::RELEASE, true),
        busy: names("busy0"),
        free: names("free0"),
    });
    if let Ok(rev) = std::env::var("BENCH_SCRIPTS_FROM") {
        versions.push(Version {
            name: rev.clone(),
            fcall: false,
            acquire: script_at(&rev, "acquire"),
            release: script_at(&rev, "release"),
            busy: names("busy1"),
            free: names("free1"),
        });
    }
    let mut shas = Vec::new();
    for v in &versions {
        if v.fcall {
            let loaded = custom(
                &c,
                vec![
                    "FUNCTION".into(),
                    "LOAD".into(),
                    "REPLACE".into(),
                    waitlock::scripts::library_code().into(),
                ],
            )
            .await;
            assert!(loaded.as_string().is_some(), "FUNCTION LOAD: {loaded:?}");
            shas.push((
                waitlock::scripts::function_name("acquire"),
                waitlock::scripts::function_name("release"),
            ));
            continue;
        }
        let load = |src: &String| {
            let (c, src) = (c.clone(), src.clone());
            async move {
                custom(&c, vec!["SCRIPT".into(), "LOAD".into(), src])
                    .await
                    .convert::<String>()
                    .expect("sha")
            }
        };
        shas.push((load(&v.acquire).await, load(&v.release).await));
    }

    // The processes, one subscriber connection each, listening on every version's key.
    let pids: Vec<String> = (0..PROCESSES)
        .map(|i| format!("{:012x}", 0xbe0c_0000 + i))
        .collect();
    let mut subscribers = Vec::new();
    for pid in &pids {
        let sub = subscriber(&server).await;
        for v in &versions {
            sub.ssubscribe(format!("{}:w:{pid}", v.busy[0]))
                .await
                .expect("ssubscribe");
        }
        subscribers.push(sub);
    }
    let waiter = |i: usize| {
        let pid = pids[i % PROCESSES].clone();
        let token = format!("{pid}/{}", uuid::Uuid::new_v4().simple());
        let member = format!("{pid} {TTL_MS} {token}");
        Waiter { pid, token, member }
    };

    // Each version's queue: the first worker holds, the others queue behind it.
    let mut queues = Vec::new();
    for (v, (acq, _)) in versions.iter().zip(&shas) {
        let ws: Vec<Waiter> = (0..workers).map(waiter).collect();
        let (code, _) = timed(&c, v.call(acq, &v.busy, &ws[0])).await;
        assert_eq!(code, 0, "{}: the first take", v.name);
        for w in &ws[1..] {
            let (code, _) = timed(&c, v.call(acq, &v.busy, w)).await;
            assert_eq!(code, 2, "{}: a waiter queues", v.name);
        }
        queues.push(Queue {
            holder: ws[0].clone(),
            waiting: ws[1..].iter().cloned().collect(),
        });
    }
    let lone = waiter(0);

    // Per version and path: the times (µs), then the commands of a counting pass.
    let mut times = vec![vec![Vec::with_capacity(cycles); PATHS.len()]; versions.len()];
    let mut counted = vec![vec![0u64; PATHS.len()]; versions.len()];
    // Per path, each step and its times (µs), in the order first seen.
    let mut by_step: Vec<Vec<(String, Vec<f64>)>> = vec![Vec::new(); PATHS.len()];
    steps::clear(&c).await;
    // (With steps, no counting pass: the checkpoints' commands would be counted.)
    let passes = [(cycles, false), (if stepped { 0 } else { 50 }, true)];
    for (n, counting) in passes {
        for cycle in 0..n {
            // (Each version first every other cycle: neither gains from going second.)
            let mut order: Vec<usize> = (0..versions.len()).collect();
            if cycle % 2 == 1 {
                order.reverse();
            }
            for vi in order {
                let v = &versions[vi];
                let (acq, rel) = &shas[vi];
                let q = &mut queues[vi];
                let next = q.waiting.pop_front().expect("a waiter");
                let back = q.waiting.back().expect("a waiter").clone();
                let calls = [
                    (v.call(acq, &v.free, &lone), 0),
                    (v.call(rel, &v.free, &lone), 1),
                    (v.call(rel, &v.busy, &q.holder), 2),
                    (v.call(acq, &v.busy, &q.holder), 2),
                    (v.call(acq, &v.busy, &back), 2),
                ];
                for (p, (words, want)) in calls.into_iter().enumerate() {
                    if counting {
                        // (Untimed: only the script and its commands between the two reads.)
                        let before = commandstats(&c).await;
                        let got = code(&custom(&c, words).await);
                        assert_eq!(got, want, "{}: {}", v.name, PATHS[p]);
                        counted[vi][p] += calls_since(&before, &commandstats(&c).await).1;
                    } else {
                        let (got, us) = timed(&c, words).await;
                        assert_eq!(got, want, "{}: {}", v.name, PATHS[p]);
                        times[vi][p].push(us as f64);
                        if stepped {
                            steps::record(&c, &mut by_step[p]).await;
                        }
                    }
                }
                let old = std::mem::replace(&mut q.holder, next);
                q.waiting.push_back(old);
            }
        }
    }

    println!(
        "waitlock script paths: {cycles} cycles, {workers} workers over {PROCESSES} processes, \
         Redis' time per call (SLOWLOG, µs) and commands per call (the FCALL or EVALSHA included)"
    );
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut medians = Vec::new();
    for (vi, v) in versions.iter().enumerate() {
        println!("\n{}", v.name);
        let mut med = Vec::new();
        for (p, path) in PATHS.iter().enumerate() {
            let (p50, mean) = stats(&mut times[vi][p]);
            let cmds = counted[vi][p] as f64 / 50.0;
            println!("  {path:<24} p50 {p50:>6.1} µs  mean {mean:>6.1} µs  commands {cmds:>5.2}");
            med.push(p50);
        }
        println!(
            "  = uncontended pair p50 {:.1} µs; contended acquisition (grant + attempt) p50 {:.1} µs",
            med[0] + med[1],
            med[2] + med[3]
        );
        medians.push(med);
    }
    if stepped {
        steps::print(&PATHS, by_step);
    }
    for (i, v) in versions.iter().enumerate().skip(1) {
        println!("\n{} / {}, p50:", versions[0].name, v.name);
        for (p, path) in PATHS.iter().enumerate() {
            println!("  {path:<24} {:.2}", medians[0][p] / medians[i][p]);
        }
    }
    drop(subscribers);
}
