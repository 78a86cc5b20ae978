//! Fault suite: mutual exclusion and liveness under real faults, with real worker processes
//! (copies of this binary) and real `redis-server`s.
//!
//! Runs as part of `cargo test` (harness = false). Each scenario prints one summary line; the
//! last line is `N passed, M failed`.

mod common;

use common::runner::Runner;
use common::worker::{Pipe, Proc};
use common::{client_for, cmd, env, env_num, lock_key, now_ns, RedisServer};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::strategy::Strategy;
use waitlock::{Backoff, Error, LockOptions, Locker, Queue};

const STORE_KEYS: [&str; 3] = ["store:counter", "store:maxfence", "store:accepted"];

async fn store_op(store: &Client, fence: u64, op: &str, value: i64) -> i64 {
    let keys = STORE_KEYS.iter().map(|k| k.to_string()).collect();
    common::store_op(store, keys, fence, op, value).await
}

// ------------------------------------------------------------------ worker process

fn worker_options() -> LockOptions {
    let mut o = LockOptions::new()
        .with_ttl(Duration::from_millis(env_num("F_TTL_MS")))
        .with_wait(Duration::from_millis(env_num("F_WAIT_MS")))
        .with_refresh_ratio(env("F_REFRESH").parse().unwrap_or(0.5));
    if env("F_LOCKER") == "poll" {
        o = o.with_backoff(Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(16),
        ));
    }
    o
}

async fn worker() {
    let builder = Locker::connect(&env("F_URL"))
        .await
        .expect("worker connects");
    let builder =
        builder.command_timeout(Duration::from_millis(env_num("F_CMD_TIMEOUT_MS").max(1)));
    match env("F_LOCKER").as_str() {
        "pubsub" => worker_with(builder.queued().build().await.expect("pubsub")).await,
        _ => worker_with(builder.build().expect("locker")).await,
    }
}

async fn worker_with<S: Strategy>(locker: Locker<S>) {
    let locker = Arc::new(locker);
    let store = client_for(&env("F_STORE_URL")).await;
    let mut pipe = Pipe::open();
    let tx = pipe.out.clone();
    pipe.say("ready");
    let _go = pipe.input.recv().await;

    let key = env("F_KEY");
    let hold = Duration::from_millis(env_num("F_HOLD_MS"));
    let until = Instant::now() + Duration::from_millis(env_num("F_DURATION_MS"));
    let iters = env_num("F_ITERS");
    let mode = env("F_MODE");
    let mut tasks = Vec::new();
    for _ in 0..env_num("F_TASKS") {
        let (locker, store, tx, key, mode) = (
            locker.clone(),
            store.clone(),
            tx.clone(),
            key.clone(),
            mode.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let opts = worker_options();
            let mut done = 0;
            while Instant::now() < until && (iters == 0 || done < iters) {
                done += 1;
                let called = Instant::now();
                let (store2, tx2, mode2) = (store.clone(), tx.clone(), mode.clone());
                let section = move |ctx: waitlock::LockContext| async move {
                    let start = now_ns();
                    let _ = tx2.send(format!("HELD {}", ctx.fence));
                    let read = store_op(&store2, ctx.fence, "read", 0).await;
                    if mode2 == "naive" {
                        // Hold on, writing now and then, without looking at the loss token:
                        // only the fence stops these writes once the lock is lost.
                        let stop = Instant::now() + hold;
                        while Instant::now() < stop {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            let w = store_op(&store2, ctx.fence, "write", read.max(0)).await;
                            let _ = tx2.send(format!(
                                "W {} {} {}",
                                now_ns(),
                                w == 1,
                                ctx.lost.is_cancelled()
                            ));
                        }
                    } else if !hold.is_zero() {
                        tokio::select! {
                            _ = tokio::time::sleep(hold) => {}
                            _ = ctx.lost.cancelled() => {}
                        }
                    } else {
                        tokio::task::yield_now().await;
                    }
                    let wrote = if read >= 0 {
                        store_op(&store2, ctx.fence, "write", read + 1).await == 1
                    } else {
                        false
                    };
                    let end = now_ns();
                    let _ = tx2.send(format!(
                        "H {} {start} {end} {} {}",
                        ctx.fence,
                        read >= 0,
                        wrote
                    ));
                    Ok::<_, Error>(())
                };
                let r = locker.run(&key, &opts, section).await;
                let took = called.elapsed();
                if let Err(e) = r {
                    let kind = match &e {
                        Error::WaitTimeout { .. } => "WaitTimeout",
                        Error::Timeout { .. } => "Timeout",
                        Error::Redis { .. } => "Redis",
                        Error::Expired { .. } => "Expired",
                        _ => "Other",
                    };
                    let _ = tx.send(format!("E {kind} {} {e}", took.as_millis()));
                }
                // A wait ends by its deadline plus one attempt's grace and scheduling slack;
                // a critical section adds its hold and one release call.
                let limit =
                    opts.wait() + hold + Duration::from_millis(env_num("F_CMD_TIMEOUT_MS") + 300);
                if took > limit {
                    let _ = tx.send(format!("LATE {} {}", took.as_millis(), limit.as_millis()));
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    drop(tx);
    common::worker::finish_locker(&locker, pipe).await;
}

// ------------------------------------------------------------------ coordinator

#[derive(Clone)]
struct Spec {
    locker: &'static str,
    tasks: u64,
    iters: u64,
    duration_ms: u64,
    ttl_ms: u64,
    wait_ms: u64,
    hold_ms: u64,
    refresh: f64,
    cmd_timeout_ms: u64,
    mode: &'static str,
}

impl Spec {
    fn new(locker: &'static str) -> Spec {
        Spec {
            locker,
            tasks: 8,
            iters: 0,
            duration_ms: 60_000,
            ttl_ms: 1000,
            wait_ms: 10_000,
            hold_ms: 0,
            refresh: 0.5,
            cmd_timeout_ms: 500,
            mode: "count",
        }
    }
}

/// A worker process running `s` on `key` (its settings in `F_*` variables).
fn spawn_worker(url: &str, store: &str, key: &str, s: &Spec) -> Proc {
    Proc::spawn(
        "fault-worker",
        &[
            ("F_URL", url.to_owned()),
            ("F_STORE_URL", store.to_owned()),
            ("F_KEY", key.to_owned()),
            ("F_LOCKER", s.locker.to_owned()),
            ("F_TASKS", s.tasks.to_string()),
            ("F_ITERS", s.iters.to_string()),
            ("F_DURATION_MS", s.duration_ms.to_string()),
            ("F_TTL_MS", s.ttl_ms.to_string()),
            ("F_WAIT_MS", s.wait_ms.to_string()),
            ("F_HOLD_MS", s.hold_ms.to_string()),
            ("F_REFRESH", s.refresh.to_string()),
            ("F_CMD_TIMEOUT_MS", s.cmd_timeout_ms.to_string()),
            ("F_MODE", s.mode.to_owned()),
        ],
    )
}

/// Figures of one scenario run.
#[derive(Default, Debug)]
struct Tally {
    acquisitions: usize,
    overlaps: usize,
    caught: usize,
    refused: usize,
    lost_updates: i64,
    late: usize,
    errors: std::collections::BTreeMap<String, usize>,
    leaks: usize,
    /// Start times (ns since the epoch) of every hold.
    starts: Vec<u64>,
}

impl Tally {
    fn after(&self, t: u64) -> usize {
        self.starts.iter().filter(|s| **s > t).count()
    }
}

impl Tally {
    fn line(&self) -> String {
        format!(
            "acquisitions={} overlaps={} caught_by_fence={} refused_ops={} lost_updates={} late_waits={} leaks={} errors={:?}",
            self.acquisitions, self.overlaps, self.caught, self.refused, self.lost_updates, self.late, self.leaks, self.errors
        )
    }
}

/// What the scenarios share: the two servers' URLs and clients.
struct Conn {
    url: String,
    store_url: String,
    admin: Client,
    store: Client,
    /// The primaries' ports when `url` is a Redis Cluster (empty for one server).
    primaries: Vec<u16>,
}

impl Conn {
    /// Grant channels of `key` still subscribed (on every primary of a cluster).
    async fn listeners(&self, key: &str) -> usize {
        if self.primaries.is_empty() {
            return common::listeners(&self.admin, key).await;
        }
        let pattern = format!("{}:w:*", lock_key(key));
        self.primaries
            .iter()
            .map(|p| {
                common::cluster::cli(*p, &["pubsub", "shardchannels", &pattern])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .count()
            })
            .sum()
    }

    /// Waiters left in `key`'s queue (asked of the primary that owns it).
    async fn queued(&self, key: &str) -> i64 {
        if self.primaries.is_empty() {
            return common::queued(&self.admin, key).await;
        }
        let name = common::queue_key(key);
        self.primaries
            .iter()
            .filter_map(|p| {
                common::cluster::cli(*p, &["zcard", &name])
                    .trim()
                    .parse::<i64>()
                    .ok()
            })
            .sum()
    }

    /// Kills the lockers' connections (every primary's, on a cluster); how many were killed.
    async fn kill_connections(&self) -> i64 {
        let mut killed = 0;
        if self.primaries.is_empty() {
            for kind in ["pubsub", "normal"] {
                let n: Result<i64, _> = self
                    .admin
                    .custom(
                        waitlock::fred::types::CustomCommand::new_static("CLIENT", None, false),
                        vec!["KILL", "TYPE", kind],
                    )
                    .await;
                killed += n.unwrap_or(0);
            }
            return killed;
        }
        for p in &self.primaries {
            for kind in ["pubsub", "normal"] {
                killed += common::cluster::cli(*p, &["client", "kill", "type", kind])
                    .trim()
                    .parse::<i64>()
                    .unwrap_or(0);
            }
        }
        killed
    }

    async fn reset_store(&self) {
        let _: i64 = self.store.del(STORE_KEYS.to_vec()).await.expect("DEL");
    }
}

/// Starts `procs` workers, lets them run while `during` injects faults, then collects and
/// checks the records.
async fn contend<F, Fut>(
    env: &Conn,
    key: &str,
    procs: usize,
    spec: &Spec,
    during: F,
) -> Result<Tally, String>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    env.reset_store().await;
    let mut workers: Vec<Proc> = (0..procs)
        .map(|_| spawn_worker(&env.url, &env.store_url, key, spec))
        .collect();
    for w in workers.iter_mut() {
        w.expect("ready", Duration::from_secs(20)).await?;
    }
    for w in workers.iter_mut() {
        w.send("go");
    }
    during().await;
    let limit = Duration::from_millis(spec.duration_ms + spec.wait_ms + 20_000);
    for w in workers.iter_mut() {
        w.expect("done", limit).await?;
    }
    let mut tally = Tally::default();
    // Every worker has left and settled: Redis must show no listener and no queued waiter.
    tally.leaks += env.listeners(key).await;
    tally.leaks += env.queued(key).await.max(0) as usize;
    let mut holds = Vec::new();
    for w in workers {
        for l in &w.seen {
            let f: Vec<&str> = l.split(' ').collect();
            match f[0] {
                "H" => {
                    let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
                    holds.push((n(2), n(3), n(1), f[4] == "true" && f[5] == "true"));
                }
                "E" => *tally.errors.entry(f[1].to_owned()).or_default() += 1,
                "LATE" => tally.late += 1,
                "L" => {
                    tally.leaks += f[1..]
                        .iter()
                        .map(|x| x.parse::<usize>().unwrap_or(1))
                        .sum::<usize>()
                }
                _ => {}
            }
        }
        w.finish();
    }
    holds.sort_unstable();
    tally.acquisitions = holds.len();
    tally.starts = holds.iter().map(|h| h.0).collect();
    tally.refused = holds.iter().filter(|h| !h.3).count();
    for i in 1..holds.len() {
        // Overlap with any earlier hold still running at this one's start.
        if let Some(prev) = holds[..i]
            .iter()
            .filter(|p| p.1 > holds[i].0)
            .min_by_key(|p| p.2)
        {
            tally.overlaps += 1;
            let older_ok = if prev.2 < holds[i].2 {
                prev.3
            } else {
                holds[i].3
            };
            if !older_ok {
                tally.caught += 1;
            }
        }
    }
    let counter: Option<i64> = env.store.get(STORE_KEYS[0]).await.expect("GET");
    let accepted: Option<i64> = env.store.get(STORE_KEYS[2]).await.expect("GET");
    tally.lost_updates = accepted.unwrap_or(0) - counter.unwrap_or(0);
    Ok(tally)
}

/// The registry is empty, Redis shows no subscriber on the keys' channels, and no background
/// task of the locker is running.
async fn leak_check(env: &Conn, pubsub: &Locker<Queue>, keys: &[&str]) -> Result<(), String> {
    pubsub.subscriptions_settled().await;
    pubsub.idle().await;
    let size = pubsub.registry_size();
    if size.keys + size.waiters != 0 {
        return Err(format!("registry not empty: {size:?}"));
    }
    for key in keys {
        let subs = env.listeners(key).await;
        if subs != 0 {
            return Err(format!("{subs} grant channels of {key:?} still subscribed"));
        }
        let queued = env.queued(key).await;
        if queued != 0 {
            return Err(format!("{queued} waiters left in {key:?}'s queue"));
        }
    }
    Ok(())
}

fn check(ok: bool, what: impl Into<String>, problems: &mut Vec<String>) {
    if !ok {
        problems.push(what.into());
    }
}

/// Checks the invariants every scenario shares.
fn common_checks(t: &Tally, p: &mut Vec<String>) {
    check(
        t.lost_updates == 0,
        format!("{} lost updates", t.lost_updates),
        p,
    );
    check(
        t.late == 0,
        format!("{} waits missed their deadline", t.late),
        p,
    );
    check(
        t.leaks == 0,
        format!(
            "{} leaked registry entries, tasks or subscriptions",
            t.leaks
        ),
        p,
    );
}

async fn scenario_steady(env: &Conn) -> Result<String, String> {
    let mut out = Vec::new();
    for locker in ["poll", "pubsub"] {
        let spec = Spec {
            iters: 5000 / 64 + 1,
            ..Spec::new(locker)
        };
        let t = contend(env, &format!("steady-{locker}"), 8, &spec, || async {}).await?;
        let mut p = Vec::new();
        common_checks(&t, &mut p);
        check(t.overlaps == 0, format!("{} overlaps", t.overlaps), &mut p);
        check(t.refused == 0, format!("{} refused ops", t.refused), &mut p);
        check(
            t.acquisitions >= 5000,
            format!("only {} acquisitions", t.acquisitions),
            &mut p,
        );
        check(
            t.errors.is_empty(),
            format!("errors {:?}", t.errors),
            &mut p,
        );
        if !p.is_empty() {
            return Err(format!("{locker}: {}", p.join("; ")));
        }
        out.push(format!("{locker}: {}", t.line()));
    }
    Ok(out.join(" | "))
}

async fn scenario_kill_connections(env: &Conn) -> Result<String, String> {
    let mut out = Vec::new();
    for locker in ["poll", "pubsub"] {
        let spec = Spec {
            duration_ms: 4000,
            wait_ms: 3000,
            ..Spec::new(locker)
        };
        let mut kills = 0;
        let t = contend(env, &format!("kills-{locker}"), 8, &spec, || async {
            let until = Instant::now() + Duration::from_millis(3500);
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(250)).await;
                kills += env.kill_connections().await;
            }
        })
        .await?;
        let mut p = Vec::new();
        common_checks(&t, &mut p);
        check(t.overlaps == 0, format!("{} overlaps", t.overlaps), &mut p);
        check(kills > 0, "no connection was killed", &mut p);
        check(
            t.acquisitions > 100,
            format!("only {} acquisitions", t.acquisitions),
            &mut p,
        );
        if !p.is_empty() {
            return Err(format!("{locker}: {}", p.join("; ")));
        }
        out.push(format!("{locker}: connections_killed={kills} {}", t.line()));
    }
    Ok(out.join(" | "))
}

/// `restart(key)` kills and restarts, empty, the server that holds `key`.
async fn scenario_redis_restart(
    env: &Conn,
    mut restart: impl FnMut(&str),
) -> Result<String, String> {
    // A cluster node takes longer to come back than a lone server, long enough for a 150 ms
    // hold's release to fail on the connection instead of finding its lock gone: on a cluster
    // holds last longer and refresh more often, so a holder learns of the loss from a refresh.
    let on_cluster = !env.primaries.is_empty();
    let mut out = Vec::new();
    for locker in ["poll", "pubsub"] {
        // Long holds and a refresh only every 500 ms: when the data vanishes, holders keep
        // going until their next refresh while others take the lock on the fresh Redis. The
        // fence-checking store must refuse every stale holder's write.
        let spec = Spec {
            duration_ms: if on_cluster { 6000 } else { 4000 },
            wait_ms: 5000,
            hold_ms: if on_cluster { 400 } else { 150 },
            ttl_ms: 1000,
            refresh: if on_cluster { 0.25 } else { 0.5 },
            tasks: 2,
            ..Spec::new(locker)
        };
        let key = format!("restart-{locker}");
        let restarted = std::cell::Cell::new(u64::MAX);
        let t = contend(env, &key, 4, &spec, || async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            // While a holder holds (the lock is free for moments between holds): that holder's
            // release or refresh is what must learn that its lock vanished.
            let until = tokio::time::Instant::now() + Duration::from_secs(3);
            loop {
                let held: Option<String> = env.admin.get(lock_key(&key)).await.unwrap_or(None);
                if held.is_some() || tokio::time::Instant::now() > until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            restart(&key);
            restarted.set(now_ns());
        })
        .await?;
        let recovered = t.after(restarted.get());
        let mut p = Vec::new();
        common_checks(&t, &mut p);
        // On one server the restart is quick: a holder's release or next refresh finds its
        // lock gone. A cluster node takes longer to come back, and a holder whose release met
        // the dead connection is not told (its lock is gone with the node's data anyway); the
        // fence checks above are what must hold there.
        check(
            on_cluster || t.errors.get("Expired").copied().unwrap_or(0) > 0,
            "no holder was told its lock vanished",
            &mut p,
        );
        check(
            recovered > if on_cluster { 2 } else { 5 },
            format!("only {recovered} acquisitions after the restart"),
            &mut p,
        );
        if !p.is_empty() {
            return Err(format!("{locker}: {} ({})", p.join("; "), t.line()));
        }
        out.push(format!(
            "{locker}: acquisitions_after_restart={recovered} {}",
            t.line()
        ));
    }
    Ok(out.join(" | "))
}

async fn scenario_holder_killed(env: &Conn) -> Result<String, String> {
    let mut out = Vec::new();
    for locker in ["poll", "pubsub"] {
        let ttl = Duration::from_millis(500);
        let key = format!("killed-holder-{locker}");
        let spec = Spec {
            tasks: 1,
            iters: 1,
            hold_ms: 60_000,
            ttl_ms: ttl.as_millis() as u64,
            ..Spec::new(locker)
        };
        let mut holder = spawn_worker(&env.url, &env.store_url, &key, &spec);
        holder.expect("ready", Duration::from_secs(20)).await?;
        holder.send("go");
        holder.expect("HELD", Duration::from_secs(10)).await?;
        let waiter_locker = Locker::new(env.admin.clone());
        let pubsub = Locker::queued(env.admin.clone())
            .await
            .map_err(|e| e.to_string())?;
        let waiting = {
            let key = key.clone();
            let (l, ps) = (waiter_locker.clone(), pubsub.clone());
            tokio::spawn(async move {
                let opts = LockOptions::new().with_wait(Duration::from_secs(10));
                let g = if locker == "poll" {
                    l.acquire_wait(&key, &opts).await
                } else {
                    ps.acquire_wait(&key, &opts).await
                };
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await; // let the waiter start waiting
        let killed_at = Instant::now();
        holder.signal("-KILL");
        let (got_at, g) = waiting.await.map_err(|e| e.to_string())?;
        let g = g.map_err(|e| format!("waiter failed: {e}"))?;
        let after = got_at - killed_at;
        g.release().await.map_err(|e| e.to_string())?;
        drop(holder);
        leak_check(env, &pubsub, &[&key]).await?;
        waiter_locker.idle().await;
        let slack = Duration::from_millis(250);
        if after > ttl + slack {
            return Err(format!(
                "{locker}: next waiter got the lock {after:?} after the kill (TTL {ttl:?})"
            ));
        }
        out.push(format!(
            "{locker}: acquired {:.0} ms after the holder was killed (TTL {} ms)",
            after.as_secs_f64() * 1e3,
            ttl.as_millis()
        ));
    }
    Ok(out.join(" | "))
}

async fn scenario_holder_frozen(env: &Conn) -> Result<String, String> {
    env.reset_store().await;
    let ttl = Duration::from_millis(300);
    let key = "frozen-holder";
    let spec = Spec {
        tasks: 1,
        iters: 1,
        hold_ms: 1500,
        ttl_ms: 300,
        refresh: 0.3,
        mode: "naive",
        ..Spec::new("pubsub")
    };
    let mut holder = spawn_worker(&env.url, &env.store_url, key, &spec);
    holder.expect("ready", Duration::from_secs(20)).await?;
    holder.send("go");
    let held = holder.expect("HELD", Duration::from_secs(10)).await?;
    let old_fence: u64 = held[5..].parse().unwrap_or(0);
    holder.expect("W ", Duration::from_secs(5)).await?; // it is writing
    holder.signal("-STOP");
    // Another worker takes the lock once the TTL has passed in Redis, and writes.
    let rival = Locker::new(env.admin.clone());
    let g = rival
        .acquire_wait(key, &LockOptions::new().with_wait(Duration::from_secs(5)))
        .await
        .map_err(|e| e.to_string())?;
    let new_fence = g.fence();
    let v = store_op(&env.store, new_fence, "read", 0).await;
    let w = store_op(&env.store, new_fence, "write", v + 1).await;
    tokio::time::sleep(ttl).await; // frozen well past its TTL
    let resumed_ns = now_ns();
    holder.signal("-CONT");
    let mut writes_after = 0;
    let mut accepted_after = 0;
    let mut cancel_ms = None;
    let mut holder_leaks = usize::MAX;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let Some(l) = holder.next_line(deadline).await else {
            break;
        };
        let f: Vec<&str> = l.split(' ').collect();
        if f[0] == "W" {
            let t: u64 = f[1].parse().unwrap_or(0);
            if t >= resumed_ns {
                writes_after += 1;
                accepted_after += usize::from(f[2] == "true");
                if f[3] == "true" && cancel_ms.is_none() {
                    cancel_ms = Some((t - resumed_ns) as f64 / 1e6);
                }
            }
        }
        if f[0] == "L" {
            holder_leaks = f[1..].iter().map(|x| x.parse::<usize>().unwrap_or(1)).sum();
        }
        if f[0] == "done" {
            break;
        }
    }
    g.release().await.map_err(|e| e.to_string())?;
    let channel_subs = common::listeners(&env.admin, key).await;
    holder.finish();
    let mut p = Vec::new();
    check(
        new_fence > old_fence,
        format!("rival fence {new_fence} not above {old_fence}"),
        &mut p,
    );
    check(w == 1, "the rival's write was refused", &mut p);
    check(writes_after > 0, "the resumed holder wrote nothing", &mut p);
    check(
        accepted_after == 0,
        format!("{accepted_after} stale writes accepted"),
        &mut p,
    );
    check(
        holder_leaks == 0,
        format!("holder left registry entries or tasks: {holder_leaks}"),
        &mut p,
    );
    check(
        channel_subs == 0,
        format!("{channel_subs} subscribers left on the lock channel"),
        &mut p,
    );
    // Its first write after resuming already sees the token cancelled (≤ one 10 ms tick).
    check(
        cancel_ms.is_some_and(|ms| ms < 100.0),
        format!("loss token seen {cancel_ms:?} ms after resume"),
        &mut p,
    );
    if !p.is_empty() {
        return Err(p.join("; "));
    }
    Ok(format!(
        "stale_writes_after_resume={writes_after} accepted=0 loss_token_seen_after_ms={:.1} old_fence={old_fence} new_fence={new_fence}",
        cancel_ms.unwrap_or(f64::NAN)
    ))
}

async fn scenario_redis_frozen(env: &Conn, redis: &mut RedisServer) -> Result<String, String> {
    let mut out = Vec::new();
    for locker in ["poll", "pubsub"] {
        let spec = Spec {
            duration_ms: 3500,
            wait_ms: 800,
            cmd_timeout_ms: 200,
            tasks: 4,
            ..Spec::new(locker)
        };
        let key = format!("frozen-redis-{locker}");
        let resumed = std::cell::Cell::new(u64::MAX);
        let t = contend(env, &key, 4, &spec, || async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            redis.pause();
            tokio::time::sleep(Duration::from_millis(1200)).await;
            redis.resume();
            resumed.set(now_ns());
        })
        .await?;
        let recovered = t.after(resumed.get());
        let mut p = Vec::new();
        common_checks(&t, &mut p);
        check(t.overlaps == 0, format!("{} overlaps", t.overlaps), &mut p);
        check(
            !t.errors.is_empty(),
            "no call failed while Redis was frozen",
            &mut p,
        );
        check(
            recovered > 100,
            format!("only {recovered} acquisitions after SIGCONT"),
            &mut p,
        );
        if !p.is_empty() {
            return Err(format!("{locker}: {} ({})", p.join("; "), t.line()));
        }
        out.push(format!(
            "{locker}: acquisitions_after_resume={recovered} {}",
            t.line()
        ));
    }
    Ok(out.join(" | "))
}

async fn scenario_bad_input(env: &Conn) -> Result<String, String> {
    let admin = &env.admin;
    let _: () = admin
        .set("bystander", "untouched", None, None, false)
        .await
        .map_err(|e| e.to_string())?;
    let _: i64 = admin
        .rpush(&lock_key("a-list"), "x")
        .await
        .map_err(|e| e.to_string())?;
    let _: i64 = cmd(
        admin,
        "HSET",
        vec![lock_key("a-hash").into(), "f".into(), "v".into()],
    )
    .await;
    // (A queued locker built meanwhile writes its process's label: not a lock's name.)
    let keys_before = common::lock_names(admin).await;
    let locker = Locker::new(admin.clone());
    let pubsub = Locker::queued(admin.clone())
        .await
        .map_err(|e| e.to_string())?;
    let d = Duration::from_secs;
    let huge = "k".repeat(1 << 20);
    let o = LockOptions::new;
    let cases: Vec<(&str, String, LockOptions, &str)> = vec![
        ("empty key", String::new(), o(), "InvalidKey"),
        (
            "key over 16 KiB",
            "k".repeat(16 * 1024 + 1),
            o(),
            "InvalidKey",
        ),
        ("1 MiB key", huge.clone(), o(), "InvalidKey"),
        ("zero TTL", "k".into(), o().with_ttl(Duration::ZERO), "ttl"),
        (
            "sub-millisecond TTL",
            "k".into(),
            o().with_ttl(Duration::from_micros(500)),
            "ttl",
        ),
        (
            "TTL over i64 ms",
            "k".into(),
            o().with_ttl(Duration::from_millis(u64::MAX)),
            "ttl",
        ),
        (
            "Duration::MAX TTL",
            "k".into(),
            o().with_ttl(Duration::MAX),
            "ttl",
        ),
        (
            "Duration::MAX wait",
            "k".into(),
            o().with_wait(Duration::MAX),
            "wait",
        ),
        (
            "NaN refresh",
            "k".into(),
            o().with_refresh_ratio(f64::NAN),
            "refresh_ratio",
        ),
        (
            "refresh 1.0",
            "k".into(),
            o().with_refresh_ratio(1.0),
            "refresh_ratio",
        ),
        (
            "negative refresh",
            "k".into(),
            o().with_refresh_ratio(-0.5),
            "refresh_ratio",
        ),
        (
            "infinite refresh",
            "k".into(),
            o().with_refresh_ratio(f64::INFINITY),
            "refresh_ratio",
        ),
        ("empty token", "k".into(), o().with_token(""), "token"),
        (
            "1 KiB + 1 token",
            "k".into(),
            o().with_token("t".repeat(1025)),
            "token",
        ),
        (
            "1 MiB token",
            "k".into(),
            o().with_token(huge.clone()),
            "token",
        ),
        (
            "zero backoff base",
            "k".into(),
            o().with_backoff(Backoff::exponential(Duration::ZERO, d(1))),
            "backoff.base",
        ),
        (
            "backoff cap below base",
            "k".into(),
            o().with_backoff(Backoff::exponential(d(2), d(1))),
            "backoff.cap",
        ),
        (
            "a list under the lock key",
            "a-list".into(),
            o(),
            "WrongType",
        ),
        (
            "a hash under the lock key",
            "a-hash".into(),
            o(),
            "WrongType",
        ),
    ];
    let mut n = 0;
    for (what, key, opts, expect) in &cases {
        for (which, r) in [
            (
                "Locker",
                tokio::time::timeout(d(5), locker.acquire_wait(key, opts)).await,
            ),
            (
                "Locker<Queue>",
                tokio::time::timeout(d(5), pubsub.acquire_wait(key, opts)).await,
            ),
        ] {
            n += 1;
            let e = match r {
                Err(_) => return Err(format!("{what} ({which}): hung")),
                Ok(Ok(_)) => return Err(format!("{what} ({which}): accepted")),
                Ok(Err(e)) => e,
            };
            let named = match &e {
                Error::InvalidKey { .. } => *expect == "InvalidKey",
                Error::InvalidOptions { field, .. } => field == expect,
                Error::WrongType { .. } => *expect == "WrongType",
                _ => false,
            };
            if !named {
                return Err(format!("{what} ({which}): expected {expect}, got {e:?}"));
            }
            // The message names the key (a long one by its first 64 characters).
            let shown = format!("{:?}", key.chars().take(64).collect::<String>());
            let shown = if key.len() > 64 {
                shown.strip_suffix('"').unwrap_or(&shown)
            } else {
                &shown
            };
            if !e.to_string().contains(shown) {
                return Err(format!(
                    "{what} ({which}): the message does not name the key: {e}"
                ));
            }
        }
    }
    // Token-level calls, builders and URLs.
    let token_level: Vec<(&str, Result<(), Error>)> = vec![
        (
            "try_lock empty token",
            locker.try_lock("k", "", d(1)).await.map(drop),
        ),
        (
            "try_lock zero TTL",
            locker.try_lock("k", "t", Duration::ZERO).await.map(drop),
        ),
        ("extend empty key", locker.extend("", "t", d(1)).await),
        ("extend 1 MiB token", locker.extend("k", &huge, d(1)).await),
        ("unlock empty token", locker.unlock("k", "").await),
        (
            "prefix with a brace",
            Locker::builder(admin.clone())
                .prefix("a{")
                .build()
                .map(drop),
        ),
        (
            "empty prefix",
            Locker::builder(admin.clone()).prefix("").build().map(drop),
        ),
        (
            "zero command timeout",
            Locker::builder(admin.clone())
                .command_timeout(Duration::ZERO)
                .build()
                .map(drop),
        ),
        (
            "URL that does not parse",
            Locker::connect("not a url").await.map(drop),
        ),
        (
            "URL pointing nowhere",
            Locker::connect("redis://127.0.0.1:1").await.map(drop),
        ),
    ];
    for (what, r) in token_level {
        n += 1;
        match r {
            Ok(()) => return Err(format!("{what}: accepted")),
            Err(
                Error::InvalidKey { .. }
                | Error::InvalidOptions { .. }
                | Error::InvalidSetting { .. }
                | Error::Redis { .. }
                | Error::Connect { .. }
                | Error::Timeout { .. },
            ) => {}
            Err(e) => return Err(format!("{what}: unexpected {e:?}")),
        }
    }
    let keys_after = common::lock_names(admin).await;
    let mut a = keys_before.clone();
    let mut b = keys_after.clone();
    a.sort();
    b.sort();
    if a != b {
        return Err(format!("keys changed: before {a:?}, after {b:?}"));
    }
    let v: Option<String> = admin.get("bystander").await.map_err(|e| e.to_string())?;
    if v.as_deref() != Some("untouched") {
        return Err("the bystander key changed".into());
    }
    let keys: Vec<&str> = cases
        .iter()
        .map(|c| c.1.as_str())
        .filter(|k| k.len() < 64)
        .collect();
    leak_check(env, &pubsub, &keys).await?;
    Ok(format!("{n} hostile inputs: each a typed error naming the problem, no panic, no hang, no key changed"))
}

fn main() -> std::process::ExitCode {
    if common::worker::role().is_some() {
        common::runner::runtime().block_on(worker());
        return std::process::ExitCode::SUCCESS;
    }
    let mut r = Runner::new();
    let limit = Duration::from_secs(120);
    let mut redis = RedisServer::start();
    let store_server = RedisServer::start();
    let env = r.rt.block_on(async {
        Conn {
            url: redis.url(),
            store_url: store_server.url(),
            admin: redis.client().await,
            store: store_server.client().await,
            primaries: Vec::new(),
        }
    });
    r.run("1 steady contention", limit, scenario_steady(&env));
    r.run(
        "2 connections killed",
        limit,
        scenario_kill_connections(&env),
    );
    r.run(
        "3 redis killed and restarted",
        limit,
        scenario_redis_restart(&env, |_| redis.restart()),
    );
    r.run("4 holder killed", limit, scenario_holder_killed(&env));
    r.run(
        "5 holder frozen past its TTL",
        limit,
        scenario_holder_frozen(&env),
    );
    r.run(
        "6 redis frozen",
        limit,
        scenario_redis_frozen(&env, &mut redis),
    );
    r.run("7 bad input", limit, scenario_bad_input(&env));
    // Scenarios 1-3 again, on a local 3-primary Redis Cluster.
    let on_cluster = [
        "c1 steady contention on a cluster",
        "c2 connections killed on every primary",
        "c3 the key's primary killed and restarted empty",
    ];
    if on_cluster.iter().any(|n| r.selected(n)) {
        let mut cluster = common::cluster::RedisCluster::start(3, 0);
        let node = format!("redis://127.0.0.1:{}", cluster.nodes[0].port);
        let cenv = r.rt.block_on(async {
            Conn {
                url: cluster.url(),
                store_url: env.store_url.clone(),
                admin: client_for(&node).await,
                store: env.store.clone(),
                primaries: cluster.primaries(),
            }
        });
        r.run(on_cluster[0], limit, scenario_steady(&cenv));
        r.run(on_cluster[1], limit, scenario_kill_connections(&cenv));
        r.run(
            on_cluster[2],
            limit,
            scenario_redis_restart(&cenv, |key| {
                let slot =
                    waitlock::fred::util::redis_keyslot(format!("waitlock:{key}").as_bytes());
                let port = cluster.owner(slot);
                if let Some(n) = cluster.nodes.iter_mut().find(|n| n.port == port) {
                    n.restart();
                }
                cluster.wait_ok();
            }),
        );
    }
    r.finish("faults")
}
