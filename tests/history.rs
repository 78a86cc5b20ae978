//! Randomized history test (issue 18, part 2): the real library, driven from several worker
//! processes (copies of this binary) against a private `redis-server`, under a seeded mix of
//! operations and faults. Every hold is recorded with its interval and fence; the history is
//! then checked for the protocol's properties:
//!
//! - (a) no two holds of a key overlap: a hold runs from the moment `acquire_wait` (or `run`)
//!   gave it to the caller until its release was sent or its validity deadline passed,
//!   whichever came first (the deadline is read from the guard, not from a timer);
//! - (b) a lock with a queued waiter (of a running process) is never left free longer than a
//!   bound: 1 s with no fault near, else the fault's length plus the TTL and the claim window
//!   plus a second;
//! - (c) fences of a key strictly increase from hold to hold, and a fence-checking store (a
//!   second, never-faulted Redis) refuses no write a holder sent within its validity, while the
//!   read-modify-write counter it protects loses no update;
//! - (d) every wait ends by its deadline (plus the last attempt's command timeout and slack),
//!   except while its own process was stopped;
//! - (e) nothing is left behind: once every worker is done and settled, no queued member, no
//!   grant channel, no registry entry, no background task, no lock key.
//!
//! Operations: `acquire_wait` with random waits (0 included) and holds, some refreshed past
//! their TTL, a third of them calling `extend` with a random shorter or longer TTL (30 ms to
//! 2 s) during the hold; cancellation at a random await (a timeout around `acquire_wait`);
//! `run` with refresh; one-shot `acquire`; careless holders that overstay their lease and
//! write late (the fence must stop them); on a queued and a polling locker, all with a
//! retention (1 s) shorter than the long holds. Faults, on a seeded schedule:
//! `CLIENT KILL` of the subscriber connections and of the command connections, `SIGSTOP` /
//! `SIGCONT` of a worker, `DEBUG SLEEP`, and a kill -9 and restart of Redis (with an
//! `appendfsync always` AOF, so that an acknowledged lock survives the restart: without it a
//! restart loses every lock, which only fences can cover; `tests/faults.rs` runs that case).
//!
//! The seed is printed; `WAITLOCK_HISTORY_SEED=<seed>` replays its schedule of operations and
//! faults (the interleaving itself depends on timing). `WAITLOCK_HISTORY_SECS` sets the length
//! (default 30 s; a soak: `WAITLOCK_HISTORY_SECS=600 cargo test --all-features --test history`).

mod common;

use common::runner::Runner;
use common::worker::{Pipe, Proc};
use common::{client_for, cmd, env, env_num, now_ns, RedisServer};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::strategy::Strategy;
use waitlock::{Backoff, Error, LockOptions, Locker};

/// The keys the workers fight over.
const KEYS: [&str; 3] = ["h-0", "h-1", "h-2"];
/// Worker processes: these many queued, then one polling.
const QUEUED_WORKERS: usize = 3;
/// Tasks per worker process.
const TASKS: u64 = 4;
/// The TTL of every hold.
const TTL: Duration = Duration::from_millis(800);
/// The lockers' command timeout.
const CMD_TIMEOUT: Duration = Duration::from_millis(400);
/// The claim window (the library's default).
const CLAIM: Duration = waitlock::DEFAULT_CLAIM_WINDOW;
/// The lockers' retention: shorter than the long holds (review 2, finding 3: a queue, its
/// processes hash and its fence counter must live while waiters wait, however long).
const RETENTION: Duration = Duration::from_secs(1);

fn store_keys(key: &str) -> Vec<String> {
    ["counter", "max", "accepted"]
        .iter()
        .map(|k| format!("store:{key}:{k}"))
        .collect()
}

async fn store_op(store: &Client, key: &str, fence: u64, op: &str, value: i64) -> i64 {
    common::store_op(store, store_keys(key), fence, op, value).await
}

/// A seeded xorshift64* sequence.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so that nearby seeds start far apart.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)).max(1))
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

// ------------------------------------------------------------------ worker process

/// Wall-clock ns of a tokio instant (for intervals compared across processes).
fn wall(at: Instant) -> u64 {
    let now = Instant::now();
    let n = now_ns();
    if at >= now {
        n + (at - now).as_nanos() as u64
    } else {
        n.saturating_sub((now - at).as_nanos() as u64)
    }
}

async fn worker() {
    let builder = Locker::connect(&env("H_URL"))
        .await
        .expect("worker connects")
        .command_timeout(CMD_TIMEOUT)
        .retention(RETENTION);
    match env("H_LOCKER").as_str() {
        "queue" => worker_with(builder.queued().build().await.expect("queued locker")).await,
        _ => worker_with(builder.build().expect("polling locker")).await,
    }
}

/// What one task reports of a hold.
struct Hold {
    key: String,
    fence: u64,
    kind: &'static str,
    acquired: u64,
    /// The release was sent, or the validity ran out, whichever came first.
    end: u64,
    /// Writes sent within the validity that the store refused.
    refused_valid: u64,
    /// Writes sent after the validity (a careless holder): accepted, refused.
    zombie: (u64, u64),
}

impl Hold {
    fn line(&self) -> String {
        format!(
            "H {} {} {} {} {} {} {} {}",
            self.key,
            self.fence,
            self.kind,
            self.acquired,
            self.end,
            self.refused_valid,
            self.zombie.0,
            self.zombie.1
        )
    }
}

/// The section every hold runs: read the counter, hold, write it back plus one, each through
/// the store with the hold's fence. A write is sent only while the lease is valid (by the
/// guard's deadline, less 5 ms for the trip to the store), except by a careless holder, whose
/// late writes the fence must stop if someone else wrote since.
async fn section(
    store: &Client,
    key: &str,
    fence: u64,
    valid_until: &(dyn Fn() -> Instant + Sync),
    lost: Option<&tokio_util::sync::CancellationToken>,
    hold: Duration,
    careless: bool,
) -> (u64, (u64, u64)) {
    let mut refused_valid = 0;
    let mut zombie = (0, 0);
    let mut write = |sent_valid: bool, ok: bool| {
        if sent_valid {
            refused_valid += u64::from(!ok);
        } else if ok {
            zombie.0 += 1;
        } else {
            zombie.1 += 1;
        }
    };
    let valid = |margin: Duration| Instant::now() + margin < valid_until();
    let m = Duration::from_millis(5);
    let sent_valid = valid(m);
    let read = store_op(store, key, fence, "read", 0).await;
    write(sent_valid, read >= 0);
    let stop = Instant::now() + hold;
    match lost {
        Some(lost) => {
            tokio::select! {
                _ = tokio::time::sleep_until(stop) => {}
                _ = lost.cancelled() => {}
            }
        }
        None => tokio::time::sleep_until(stop).await,
    }
    if read >= 0 && (careless || valid(m)) {
        let sent_valid = valid(m);
        let ok = store_op(store, key, fence, "write", read + 1).await == 1;
        write(sent_valid, ok);
    }
    (refused_valid, zombie)
}

fn kind_of(e: &Error) -> &'static str {
    match e {
        Error::WaitTimeout { .. } => "WaitTimeout",
        Error::Timeout { .. } => "Timeout",
        Error::Redis { .. } => "Redis",
        Error::Expired { .. } => "Expired",
        Error::Locked { .. } => "Locked",
        Error::NotHeld { .. } => "NotHeld",
        _ => "Other",
    }
}

async fn worker_with<S: Strategy>(locker: Locker<S>) {
    let locker = Arc::new(locker);
    let queue =
        (&*locker as &dyn std::any::Any).downcast_ref::<waitlock::Locker<waitlock::Queue>>();
    let store = client_for(&env("H_STORE_URL")).await;
    let mut pipe = Pipe::open();
    let tx = pipe.out.clone();
    pipe.say("ready");
    let _go = pipe.input.recv().await;
    let seed = env_num("H_SEED");
    let until = Instant::now() + Duration::from_millis(env_num("H_DURATION_MS"));
    let strategy = if queue.is_some() { "q" } else { "p" };
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (locker, store, tx) = (locker.clone(), store.clone(), tx.clone());
        let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0x1000_0001));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let key = KEYS[rng.below(KEYS.len() as u64) as usize];
                let wait = if rng.below(10) == 0 {
                    Duration::ZERO
                } else {
                    rng.ms(1, 1500)
                };
                let careless = rng.below(8) == 0;
                let opts = LockOptions::new()
                    .with_ttl(TTL)
                    .with_wait(wait)
                    .with_backoff(Backoff::exponential(
                        Duration::from_millis(2),
                        Duration::from_millis(50),
                    ));
                let op = rng.below(100);
                let called = now_ns();
                let started = Instant::now();
                // Long holds outlive the TTL: only the refresh keeps them (a careless
                // holder's guard is not refreshed: its late writes meet the fence).
                let hold = if rng.below(30) == 0 {
                    rng.ms(900, 2000)
                } else {
                    rng.ms(0, 12)
                };
                let (name, outcome): (&str, Result<Option<Hold>, Error>) = if op < 45 {
                    // acquire_wait, hold (refreshed when long, or half the time), release; one
                    // hold in three calls `extend` with a shorter or a longer TTL first, after
                    // a pause (review 2, finding 1: the guard must follow Redis' new lease).
                    let r = locker.acquire_wait(key, &opts).await;
                    let refresh = !careless && (hold > TTL / 2 || rng.below(2) == 0);
                    let extend = (rng.below(3) == 0).then(|| (rng.ms(0, 20), rng.ms(30, 2000)));
                    (
                        "wait",
                        guard_hold(r, &store, key, hold, refresh, careless, extend).await,
                    )
                } else if op < 65 {
                    // Cancelled at a random await (or not, if it is quick).
                    let cut = rng.ms(0, 40);
                    match tokio::time::timeout(cut, locker.acquire_wait(key, &opts)).await {
                        Err(_) => ("cancel", Ok(None)),
                        Ok(r) => (
                            "wait",
                            guard_hold(r, &store, key, hold.min(TTL / 4), false, careless, None)
                                .await,
                        ),
                    }
                } else if op < 90 {
                    // run, with refresh.
                    let store2 = store.clone();
                    let r = locker
                        .run(
                            key,
                            &opts.clone().with_refresh_ratio(0.5),
                            |ctx| async move {
                                let acquired = now_ns();
                                let lease = ctx.clone();
                                let (refused_valid, zombie) = section(
                                    &store2,
                                    &ctx.key,
                                    ctx.fence,
                                    &|| lease.valid_until(),
                                    Some(&ctx.lost),
                                    hold,
                                    careless,
                                )
                                .await;
                                let end = now_ns().min(wall(ctx.valid_until()));
                                Ok::<_, Error>(Hold {
                                    key: ctx.key.clone(),
                                    fence: ctx.fence,
                                    kind: "run",
                                    acquired,
                                    end,
                                    refused_valid,
                                    zombie,
                                })
                            },
                        )
                        .await;
                    ("run", r.map(Some))
                } else {
                    // One attempt, no wait.
                    let r = locker.acquire(key, &opts).await;
                    match r {
                        Err(Error::Locked { .. }) => ("once", Ok(None)),
                        r => (
                            "once",
                            guard_hold(r, &store, key, hold.min(TTL / 4), false, careless, None)
                                .await,
                        ),
                    }
                };
                let ended = now_ns();
                let took = started.elapsed();
                match outcome {
                    Ok(Some(h)) => {
                        let _ = tx.send(h.line());
                    }
                    Ok(None) => {}
                    Err(e) => {
                        let _ = tx.send(format!("E {} {key} {e}", kind_of(&e)));
                    }
                }
                // The op's wait, for the deadline check: from the call to the hold (or error).
                let waited_ms = match name {
                    "run" | "wait" | "once" => took.saturating_sub(hold).as_millis(),
                    _ => took.as_millis(),
                };
                let _ = tx.send(format!(
                    "O {name} {strategy} {key} {called} {ended} {} {waited_ms}",
                    wait.as_millis()
                ));
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    drop(tx);
    common::worker::finish_locker(&locker, pipe).await;
}

/// Holds a lock `acquire_wait` or `acquire` returned: the section, then the release. With
/// `extend` = (pause, ttl), the holder calls `extend(ttl)` after the pause, with its keep-alive
/// running when it refreshes: the section then runs on the new lease (a shorter one may end
/// before the section does; its writes then stop, or meet the fence if careless).
async fn guard_hold(
    r: Result<waitlock::LockGuard, Error>,
    store: &Client,
    key: &str,
    hold: Duration,
    refresh: bool,
    careless: bool,
    extend: Option<(Duration, Duration)>,
) -> Result<Option<Hold>, Error> {
    let mut g = r?;
    let acquired = now_ns();
    let lost = refresh.then(|| g.keep_alive());
    if let Some((pause, ttl)) = extend {
        tokio::time::sleep(pause).await;
        // A failure (the lock gone, Redis unreachable) shows in the guard's validity and loss.
        let _ = g.extend(ttl).await;
    }
    let fence = g.fence();
    let (refused_valid, zombie) = {
        let g = &g;
        section(
            store,
            key,
            fence,
            &|| g.valid_until(),
            lost.as_ref(),
            hold,
            careless,
        )
        .await
    };
    let end = now_ns().min(wall(g.valid_until()));
    let released = g.release().await;
    let h = Hold {
        key: key.to_owned(),
        fence,
        kind: "guard",
        acquired,
        end,
        refused_valid,
        zombie,
    };
    match released {
        // A release that found the lock gone (it expired, maybe while the process was stopped)
        // or could not reach Redis still ends the hold (its interval is cut at the deadline).
        Ok(()) | Err(Error::NotHeld { .. } | Error::Timeout { .. } | Error::Redis { .. }) => {
            Ok(Some(h))
        }
        Err(e) => Err(e),
    }
}

// ------------------------------------------------------------------ coordinator

/// A fault and when it acted (wall ns); `worker` for a stopped worker.
#[derive(Debug, Clone)]
struct Fault {
    what: &'static str,
    start: u64,
    end: u64,
    worker: Option<usize>,
}

#[derive(Debug, Clone)]
struct HoldRec {
    worker: usize,
    fence: u64,
    kind: String,
    start: u64,
    end: u64,
    refused_valid: u64,
}

#[derive(Debug, Clone)]
struct OpRec {
    worker: usize,
    name: String,
    strategy: String,
    key: String,
    start: u64,
    end: u64,
    wait_ms: u64,
    waited_ms: u64,
}

/// Runs the schedule of faults until `until`; returns what was done.
async fn inject(
    rng: &mut Rng,
    redis: &mut RedisServer,
    admin: &Client,
    workers: &[Proc],
    until: Instant,
) -> Vec<Fault> {
    let mut faults = Vec::new();
    let port = redis.port.to_string();
    loop {
        let pause = rng.ms(600, 2500);
        if Instant::now() + pause >= until {
            break;
        }
        tokio::time::sleep(pause).await;
        let start = now_ns();
        let mut worker = None;
        let what = match rng.below(6) {
            0 => {
                let _: i64 = common::try_cmd(admin, "CLIENT KILL TYPE pubsub", vec![]).await;
                "kill subscribers"
            }
            1 => {
                // Every command connection, the coordinator's own included (it reconnects).
                let _: i64 = common::try_cmd(admin, "CLIENT KILL TYPE normal", vec![]).await;
                "kill command connections"
            }
            2 | 3 => {
                let w = rng.below(workers.len() as u64) as usize;
                worker = Some(w);
                workers[w].signal("-STOP");
                tokio::time::sleep(rng.ms(100, 1500)).await;
                workers[w].signal("-CONT");
                "stop a worker"
            }
            4 => {
                let secs = format!("{:.2}", rng.ms(100, 700).as_secs_f64());
                let port = port.clone();
                tokio::task::spawn_blocking(move || {
                    std::process::Command::new("redis-cli")
                        .args(["-p", &port, "DEBUG", "SLEEP", &secs])
                        .output()
                })
                .await
                .expect("join")
                .expect("redis-cli DEBUG SLEEP (install redis-tools)");
                "debug sleep"
            }
            _ => {
                tokio::task::block_in_place(|| redis.restart());
                "restart redis"
            }
        };
        faults.push(Fault {
            what,
            start,
            end: now_ns(),
            worker,
        });
    }
    faults
}

/// What the checks found.
#[derive(Default)]
struct Verdict {
    problems: Vec<String>,
}

impl Verdict {
    fn fail(&mut self, what: String) {
        if self.problems.len() < 20 {
            self.problems.push(what);
        }
    }
}

fn stopped_during(faults: &[Fault], worker: usize, start: u64, end: u64) -> bool {
    faults
        .iter()
        .any(|f| f.worker == Some(worker) && f.start < end && f.end > start)
}

fn check_history(
    holds: &BTreeMap<String, Vec<HoldRec>>,
    ops: &[OpRec],
    faults: &[Fault],
    v: &mut Verdict,
) {
    for (key, hs) in holds {
        let mut hs = hs.clone();
        hs.sort_by_key(|h| (h.start, h.fence));
        // (a) no overlap; (c) fences grow from hold to hold.
        for w in hs.windows(2) {
            let (a, b) = (&w[0], &w[1]);
            if b.start < a.end {
                v.fail(format!(
                    "(a) {key}: two holds overlap by {:.3} ms: fence {} ({} of worker {}, {:.3}..{:.3}) and fence {} ({} of worker {}, from {:.3})",
                    common::ms(a.end - b.start), a.fence, a.kind, a.worker, common::ms(a.start), common::ms(a.end), b.fence, b.kind, b.worker, common::ms(b.start)
                ));
            }
            if b.fence <= a.fence {
                v.fail(format!(
                    "(c) {key}: fence {} (worker {}) after fence {} (worker {})",
                    b.fence, b.worker, a.fence, a.worker
                ));
            }
        }
        for h in &hs {
            if h.refused_valid > 0 && !stopped_during(faults, h.worker, h.start, h.end) {
                v.fail(format!(
                    "(c) {key}: the store refused {} write(s) fence {} sent within its validity",
                    h.refused_valid, h.fence
                ));
            }
        }
        // (b) a lock left free while a queued waiter of a running process waited.
        let mut busy_until = 0u64;
        for h in &hs {
            if busy_until > 0 && h.start > busy_until {
                let (gs, ge) = (busy_until, h.start);
                let waiting = ops.iter().any(|o| {
                    o.key == *key
                        && o.strategy == "q"
                        && o.name != "cancel"
                        && o.start + 50_000_000 <= gs
                        && o.end >= ge
                        && !stopped_during(faults, o.worker, o.start, o.end)
                });
                if waiting {
                    let near: Vec<&Fault> = faults
                        .iter()
                        .filter(|f| {
                            f.start < ge && f.end + 2 * TTL.as_nanos() as u64 + 1_000_000_000 > gs
                        })
                        .collect();
                    let allowed = if near.is_empty() {
                        Duration::from_secs(1)
                    } else {
                        let longest = near.iter().map(|f| f.end - f.start).max().unwrap_or(0);
                        Duration::from_nanos(longest) + TTL + CLAIM + Duration::from_secs(1)
                    };
                    let gap = Duration::from_nanos(ge - gs);
                    if gap > allowed {
                        v.fail(format!(
                            "(b) {key}: free for {gap:?} ({:.3}..{:.3}) while a queued waiter waited (allowed {allowed:?}, faults near: {:?})",
                            common::ms(gs), common::ms(ge), near.iter().map(|f| f.what).collect::<Vec<_>>()
                        ));
                    }
                }
            }
            busy_until = busy_until.max(h.end);
        }
    }
    // (d) every wait ends by its deadline (plus the last attempt's time and slack).
    for o in ops {
        if o.name == "cancel" || stopped_during(faults, o.worker, o.start, o.end) {
            continue;
        }
        let limit = o.wait_ms + CMD_TIMEOUT.as_millis() as u64 * 2 + 500;
        if o.waited_ms > limit {
            v.fail(format!(
                "(d) {} {} on {} (worker {}) waited {} ms, wait {} ms (limit {limit} ms)",
                o.name, o.strategy, o.key, o.worker, o.waited_ms, o.wait_ms
            ));
        }
    }
}

async fn history(redis: &mut RedisServer, store_url: &str, seed: u64) -> Result<String, String> {
    let secs = env_num("WAITLOCK_HISTORY_SECS").max(1);
    let secs = if env("WAITLOCK_HISTORY_SECS").is_empty() {
        30
    } else {
        secs
    };
    let admin = redis.client().await;
    let store = client_for(store_url).await;
    let duration = Duration::from_secs(secs);
    let mut workers: Vec<Proc> = (0..=QUEUED_WORKERS)
        .map(|i| {
            Proc::spawn(
                "history-worker",
                &[
                    ("H_URL", redis.url()),
                    ("H_STORE_URL", store_url.to_owned()),
                    (
                        "H_LOCKER",
                        if i < QUEUED_WORKERS { "queue" } else { "poll" }.to_owned(),
                    ),
                    ("H_SEED", (seed ^ ((i as u64 + 1) << 32)).to_string()),
                    ("H_DURATION_MS", duration.as_millis().to_string()),
                ],
            )
        })
        .collect();
    for w in workers.iter_mut() {
        w.expect("ready", Duration::from_secs(30)).await?;
    }
    for w in workers.iter_mut() {
        w.send("go");
    }
    let mut rng = Rng::new(seed);
    let faults = inject(&mut rng, redis, &admin, &workers, Instant::now() + duration).await;
    let limit = duration + Duration::from_secs(60);
    for w in workers.iter_mut() {
        w.expect("done", limit).await?;
    }
    let mut v = Verdict::default();
    // (e) Redis: no queued member, no grant channel, and no lock key once the last TTL ran out
    // (a release that met a fault leaves the key to expire).
    let deadline = Instant::now() + TTL + Duration::from_secs(2);
    loop {
        let mut left = Vec::new();
        for key in KEYS {
            let queued = common::queued(&admin, key).await;
            let listeners = common::listeners(&admin, key).await;
            let lock: i64 = cmd(&admin, "EXISTS", vec![common::lock_key(key).into()]).await;
            if queued + listeners as i64 + lock > 0 {
                left.push(format!(
                    "{key}: {queued} queued, {listeners} grant channels, lock key {lock}"
                ));
            }
        }
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for l in left {
                v.fail(format!("(e) left behind: {l}"));
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut holds: BTreeMap<String, Vec<HoldRec>> = BTreeMap::new();
    let mut ops = Vec::new();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut zombies = (0u64, 0u64);
    for (i, mut w) in workers.into_iter().enumerate() {
        for l in w.drain().to_vec() {
            let f: Vec<&str> = l.split(' ').collect();
            let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            match f[0] {
                "H" => {
                    zombies.0 += n(7);
                    zombies.1 += n(8);
                    holds.entry(f[1].to_owned()).or_default().push(HoldRec {
                        worker: i,
                        fence: n(2),
                        kind: f[3].to_owned(),
                        start: n(4),
                        end: n(5),
                        refused_valid: n(6),
                    })
                }
                "O" => ops.push(OpRec {
                    worker: i,
                    name: f[1].to_owned(),
                    strategy: f[2].to_owned(),
                    key: f[3].to_owned(),
                    start: n(4),
                    end: n(5),
                    wait_ms: n(6),
                    waited_ms: n(7),
                }),
                "E" => *errors.entry(f[1].to_owned()).or_default() += 1,
                "L" => {
                    let leaked: u64 = (1..4).map(n).sum();
                    if leaked > 0 {
                        v.fail(format!(
                            "(e) worker {i}: {l} (registry keys, waiters, tasks)"
                        ));
                    }
                }
                _ => {}
            }
        }
        w.finish();
    }
    check_history(&holds, &ops, &faults, &mut v);
    // (c) the counter the store protects lost no update: it equals the writes it accepted.
    for key in KEYS {
        let k = store_keys(key);
        let counter: Option<i64> = store.get(&k[0]).await.map_err(|e| e.to_string())?;
        let accepted: Option<i64> = store.get(&k[2]).await.map_err(|e| e.to_string())?;
        if counter.unwrap_or(0) != accepted.unwrap_or(0) {
            v.fail(format!(
                "(c) {key}: {} writes accepted, the counter says {}: lost updates",
                accepted.unwrap_or(0),
                counter.unwrap_or(0)
            ));
        }
    }
    let n_holds: usize = holds.values().map(Vec::len).sum();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &faults {
        *kinds.entry(f.what).or_default() += 1;
    }
    let mut by_op: BTreeMap<String, usize> = BTreeMap::new();
    for o in &ops {
        *by_op
            .entry(format!("{} {}", o.name, o.strategy))
            .or_default() += 1;
    }
    let summary = format!(
        "seed {seed}: {} operations {by_op:?}, {n_holds} holds, faults {kinds:?}, late writes of careless holders accepted {} / refused by the fence {}, errors {errors:?}",
        ops.len(),
        zombies.0,
        zombies.1
    );
    if n_holds < 300 {
        v.fail(format!(
            "only {n_holds} holds: the workers did not get going"
        ));
    }
    if v.problems.is_empty() {
        Ok(summary)
    } else {
        Err(format!(
            "{summary}\n  replay: WAITLOCK_HISTORY_SEED={seed} cargo test --all-features --test history\n  {}",
            v.problems.join("\n  ")
        ))
    }
}

/// The checker has teeth: a made-up history with one fault of each kind is caught.
async fn checker_self_test() -> Result<String, String> {
    let s = 1_000_000_000u64;
    let hold = |worker, fence, start: u64, end: u64, refused| HoldRec {
        worker,
        fence,
        kind: "guard".into(),
        start,
        end,
        refused_valid: refused,
    };
    let op = |worker, start: u64, end: u64, wait_ms, waited_ms| OpRec {
        worker,
        name: "wait".into(),
        strategy: "q".into(),
        key: "k".into(),
        start,
        end,
        wait_ms,
        waited_ms,
    };
    let mut holds = BTreeMap::new();
    holds.insert(
        "k".to_owned(),
        vec![
            hold(0, 10, s, 2 * s, 0),
            // (a) overlaps the first; (c) a lower fence after a higher one.
            hold(1, 9, 2 * s - 1, 3 * s, 0),
            // (c) a write sent within the validity was refused.
            hold(2, 11, 3 * s, 4 * s, 1),
            // (b) free for 3 s while worker 3's queued wait (below) waited.
            hold(3, 12, 7 * s, 8 * s, 0),
        ],
    );
    let ops = vec![
        op(3, 3 * s, 7 * s, 10_000, 4_000),
        // (d) waited 5 s with a 1 s wait.
        op(1, 0, 5 * s, 1_000, 5_000),
    ];
    let mut v = Verdict::default();
    check_history(&holds, &ops, &[], &mut v);
    let found: Vec<&str> = ["(a)", "(b)", "(c) k: fence", "(c) k: the store", "(d)"]
        .into_iter()
        .filter(|p| !v.problems.iter().any(|x| x.starts_with(p)))
        .collect();
    // And the same history, with the stopped worker and the fault it explains, passes (b)
    // and (d) for the ops of the stopped worker.
    let faults = vec![Fault {
        what: "stop a worker",
        start: 4 * s,
        end: 5 * s,
        worker: Some(3),
    }];
    let mut v2 = Verdict::default();
    check_history(&holds, &ops, &faults, &mut v2);
    if !found.is_empty() {
        return Err(format!("the checker missed {found:?}: {:?}", v.problems));
    }
    if v2.problems.iter().any(|p| p.starts_with("(b)")) {
        return Err(format!(
            "a waiter of a stopped process counted for (b): {:?}",
            v2.problems
        ));
    }
    Ok(format!(
        "{} problems found in a made-up history",
        v.problems.len()
    ))
}

fn main() -> std::process::ExitCode {
    if common::worker::role().is_some() {
        common::runner::runtime().block_on(worker());
        return std::process::ExitCode::SUCCESS;
    }
    let mut r = Runner::new();
    r.run(
        "the checker catches each property",
        Duration::from_secs(5),
        checker_self_test(),
    );
    let seed = match env("WAITLOCK_HISTORY_SEED").parse::<u64>() {
        Ok(s) => s,
        Err(_) => now_ns() % 1_000_000_007,
    };
    println!("history seed {seed} (replay: WAITLOCK_HISTORY_SEED={seed})");
    let mut redis = RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--enable-debug-command",
        "local",
    ]);
    let store = RedisServer::start();
    let secs = env_num("WAITLOCK_HISTORY_SECS").max(30);
    r.run(
        "randomized history under faults",
        Duration::from_secs(secs + 120),
        history(&mut redis, &store.url(), seed),
    );
    r.finish("history")
}
