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
//!   grant channel, no registry entry, no background task, no lock key; a processes hash
//!   left without its queue has an expiry within its bound, the election's record one;
//! - (f) a set is held whole: its guard holds every key asked for, and no other;
//! - (g) an election observer's terms never go back; (h) it shows a leader only from its
//!   campaign to its term's end (plus a bound), and nobody only when nobody leads (a bound).
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
//! Sets (a quarter of the operations: 2 or 3 of the keys, in any order, waited for at once on
//! a queued locker, polled for at once on a polling one, some given 63 keys of their own so
//! that they take the in-order path; cancelled, `run_many` and one-shot too) count as holds of
//! each key; a worker's candidate campaigns in an election and ends each term in one of four
//! ways (resign, resign after the term, drop, or die: its lease runs out), each term a hold
//! of the election's name, and every worker observes it. A first test feeds the checker a
//! made-up history with one breach of each property, and fails unless it finds them all.
//!
//! What it can and cannot see of review 3: finding 3 (a fence counter expiring before its
//! kept queue) shows as a key left free beyond (b)'s bound, and the processes hash left
//! without its queue as (e); findings 1 and 2 need a Cluster (a slot's run of more than 256
//! keys; a set whose keys' hashes live on two primaries), and this runs one server; finding
//! 4 needs many contended locks on one client behind a slow link, and finding 5 a re-sent
//! reading, which (g) does not count as going back: `tests/cluster.rs`,
//! `tests/lock_queue_processes.rs`, `tests/refresh.rs` and `src/election/observe.rs` test those.
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
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use waitlock::fred::prelude::*;
use waitlock::strategy::Strategy;
use waitlock::{Backoff, Error, LockOptions, LockSetGuard, Locker, Refresh};

/// The keys the workers fight over.
const KEYS: [&str; 3] = ["h-0", "h-1", "h-2"];
/// The election every worker has a candidate in, and an observer of.
const ELECTION: &str = "h-e";
/// Keys of a task's own added to a queued locker's set (opted in to ordered sets), so that it
/// has more than 64 keys and takes the in-order path (on one server: the whole set waited
/// for at once, by polling). Nobody else takes them.
const FILLERS: usize = 63;
/// How much later than a waiter a set may have called and still be ahead of it in a queue
/// (the calls race to Redis).
const AHEAD: Duration = Duration::from_millis(200);
/// How much earlier than the holder's view Redis may have taken a key, and later freed it
/// (the round trips of the acquisition and of the release).
const HELD_SLACK: Duration = Duration::from_millis(50);
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
    let me = env_num("H_WORKER");
    let stop_observing = CancellationToken::new();
    let observer = tokio::spawn(observe(locker.clone(), tx.clone(), stop_observing.clone()));
    let candidate = tokio::spawn(campaigns(
        locker.clone(),
        store.clone(),
        Rng::new(seed ^ 0xE1EC_7105),
        until,
        tx.clone(),
        strategy,
        me,
    ));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (locker, store, tx) = (locker.clone(), store.clone(), tx.clone());
        let mut rng = Rng::new(seed ^ (t + 1).wrapping_mul(0x1000_0001));
        let filler = format!("h-f{me}-{t}");
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                // A quarter of the operations take a set of 2 or 3 of the keys.
                if rng.below(4) == 0 {
                    set_op(&locker, &store, &mut rng, &tx, strategy, &filler).await;
                    continue;
                }
                let key = KEYS[rng.below(KEYS.len() as u64) as usize];
                let wait = if rng.below(10) == 0 {
                    Duration::ZERO
                } else {
                    rng.ms(1, 1500)
                };
                let careless = rng.below(8) == 0;
                let opts = waiting(wait);
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
    candidate.await.expect("candidate task");
    stop_observing.cancel();
    observer.await.expect("observer task");
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

/// The options of a wait of `wait`: the TTL, a backoff of 2 to 50 ms (for a polling locker).
fn waiting(wait: Duration) -> LockOptions {
    LockOptions::new()
        .with_ttl(TTL)
        .with_wait(wait)
        .with_backoff(Backoff::exponential(
            Duration::from_millis(2),
            Duration::from_millis(50),
        ))
}

/// The keys of a set, sorted, without duplicates, joined by commas (for a `G` line).
fn key_list<'a>(keys: impl Iterator<Item = &'a str>) -> String {
    let mut keys: Vec<&str> = keys.collect();
    keys.sort_unstable();
    keys.dedup();
    keys.join(",")
}

/// One operation on a set of 2 or 3 of the keys (in any order the caller likes): a wait
/// (`acquire_many_wait`: on a queued locker the set waits at once in every key's queue, on a
/// polling locker it polls at once), cancelled at a random await or not, `run_many`, or one
/// attempt (`acquire_many`); half of them opted in to ordered sets, and on a queued locker one
/// wait in eight given `FILLERS` more keys of the task's own, so that it takes the in-order
/// path. Each key the set held is reported as a hold of that key (`H`, kind `set` or `srun`),
/// every grant with the keys asked for and the keys got (`G`), and the operation (`O`, its
/// keys joined by commas; strategy `o` for the in-order path, which waits in no queue).
async fn set_op<S: Strategy>(
    locker: &Locker<S>,
    store: &Client,
    rng: &mut Rng,
    tx: &UnboundedSender<String>,
    strategy: &'static str,
    filler: &str,
) {
    let mut keys: Vec<String> = if rng.below(3) == 0 {
        KEYS.iter().map(|k| (*k).to_owned()).collect()
    } else {
        let a = rng.below(3) as usize;
        let b = (a + 1 + rng.below(2) as usize) % 3;
        vec![KEYS[a].to_owned(), KEYS[b].to_owned()]
    };
    if rng.below(2) == 0 {
        keys.reverse();
    }
    let contested = keys.clone();
    let wait = if rng.below(10) == 0 {
        Duration::ZERO
    } else {
        rng.ms(1, 1500)
    };
    let hold = if rng.below(30) == 0 {
        rng.ms(900, 2000)
    } else {
        rng.ms(0, 12)
    };
    let mut opts = waiting(wait);
    if rng.below(2) == 0 {
        opts = opts.with_ordered_sets();
    }
    let op = rng.below(100);
    let mut strategy = strategy;
    if strategy == "q" && op < 6 && !wait.is_zero() {
        keys.extend((0..FILLERS).map(|i| format!("{filler}-{i}")));
        opts = opts.with_ordered_sets();
        strategy = "o";
    }
    let called = now_ns();
    let started = Instant::now();
    let (name, outcome): (&str, Result<Option<Vec<Hold>>, Error>) = if op < 50 {
        let r = locker.acquire_many_wait(&keys, &opts).await;
        let extend = (rng.below(4) == 0).then(|| (rng.ms(0, 20), rng.ms(30, 2000)));
        let name = if strategy == "o" { "sorder" } else { "swait" };
        (
            name,
            set_hold(r, store, &keys, &contested, hold, extend, tx).await,
        )
    } else if op < 62 {
        let cut = rng.ms(0, 40);
        match tokio::time::timeout(cut, locker.acquire_many_wait(&keys, &opts)).await {
            Err(_) => ("scancel", Ok(None)),
            Ok(r) => (
                "swait",
                set_hold(r, store, &keys, &contested, hold.min(TTL / 4), None, tx).await,
            ),
        }
    } else if op < 85 {
        let (store2, tx2, asked, contested2) =
            (store.clone(), tx.clone(), keys.clone(), contested.clone());
        let r = locker
            .run_many(
                &keys,
                &opts.clone().with_refresh_ratio(0.5),
                |ctx| async move {
                    let acquired = now_ns();
                    let _ = tx2.send(format!(
                        "G srun {} {}",
                        key_list(asked.iter().map(String::as_str)),
                        key_list(ctx.fences.iter().map(|(k, _)| k.as_str()))
                    ));
                    let fences: Vec<(String, u64)> = contested2
                        .iter()
                        .filter_map(|k| ctx.fence(k).map(|f| (k.clone(), f)))
                        .collect();
                    let done =
                        set_section(&store2, &fences, &|| ctx.valid_until(), &ctx.lost, hold).await;
                    let end = now_ns().min(wall(ctx.valid_until()));
                    Ok::<_, Error>(
                        fences
                            .into_iter()
                            .zip(done)
                            .map(|((key, fence), (refused_valid, zombie))| Hold {
                                key,
                                fence,
                                kind: "srun",
                                acquired,
                                end,
                                refused_valid,
                                zombie,
                            })
                            .collect(),
                    )
                },
            )
            .await;
        ("srun", r.map(Some))
    } else {
        match locker.acquire_many(&keys, &opts).await {
            Err(Error::Locked { .. }) => ("sonce", Ok(None)),
            r => (
                "sonce",
                set_hold(r, store, &keys, &contested, hold.min(TTL / 4), None, tx).await,
            ),
        }
    };
    let ended = now_ns();
    let took = started.elapsed();
    let shown = contested.join(",");
    match outcome {
        Ok(Some(holds)) => {
            for h in holds {
                let _ = tx.send(h.line());
            }
        }
        Ok(None) => {}
        Err(e) => {
            let _ = tx.send(format!("E {} {shown} {e}", kind_of(&e)));
        }
    }
    let waited_ms = match name {
        "scancel" => took.as_millis(),
        _ => took.saturating_sub(hold).as_millis(),
    };
    let _ = tx.send(format!(
        "O {name} {strategy} {shown} {called} {ended} {} {waited_ms}",
        wait.as_millis()
    ));
}

/// Holds a set `acquire_many_wait` or `acquire_many` returned: says which keys it got (`G`),
/// runs the section over the contested keys (each with its own fence), maybe `extend`s the
/// set first, then releases it. Each contested key's hold ends at the release or at that
/// key's validity deadline.
async fn set_hold(
    r: Result<LockSetGuard, Error>,
    store: &Client,
    asked: &[String],
    contested: &[String],
    hold: Duration,
    extend: Option<(Duration, Duration)>,
    tx: &UnboundedSender<String>,
) -> Result<Option<Vec<Hold>>, Error> {
    let mut set = r?;
    let acquired = now_ns();
    let _ = tx.send(format!(
        "G set {} {}",
        key_list(asked.iter().map(String::as_str)),
        key_list(set.keys())
    ));
    if let Some((pause, ttl)) = extend {
        tokio::time::sleep(pause).await;
        // A failure shows in the keys' validity and in the loss token.
        let _ = set.extend(ttl).await;
    }
    let lost = set.lost();
    let fences: Vec<(String, u64)> = contested
        .iter()
        .filter_map(|k| set.fence(k).map(|f| (k.clone(), f)))
        .collect();
    let done = {
        let set = &set;
        set_section(store, &fences, &|| set.valid_until(), &lost, hold).await
    };
    let now = now_ns();
    let holds = fences
        .into_iter()
        .zip(done)
        .map(|((key, fence), (refused_valid, zombie))| {
            let valid = set
                .guards()
                .iter()
                .find(|g| g.key() == key)
                .map_or(now, |g| wall(g.valid_until()));
            Hold {
                key,
                fence,
                kind: "set",
                acquired,
                end: now.min(valid),
                refused_valid,
                zombie,
            }
        })
        .collect();
    match set.release().await {
        Ok(()) | Err(Error::NotHeld { .. } | Error::Timeout { .. } | Error::Redis { .. }) => {
            Ok(Some(holds))
        }
        Err(e) => Err(e),
    }
}

/// The section of a set: read each key's counter with its fence, hold, write each back plus
/// one, every write sent only while the set is valid (by its earliest deadline, less 5 ms).
async fn set_section(
    store: &Client,
    fences: &[(String, u64)],
    valid_until: &(dyn Fn() -> Instant + Sync),
    lost: &CancellationToken,
    hold: Duration,
) -> Vec<(u64, (u64, u64))> {
    let m = Duration::from_millis(5);
    let valid = || Instant::now() + m < valid_until();
    let mut out = vec![(0u64, (0u64, 0u64)); fences.len()];
    let mut reads = Vec::with_capacity(fences.len());
    for (i, (key, fence)) in fences.iter().enumerate() {
        let sent_valid = valid();
        let read = store_op(store, key, *fence, "read", 0).await;
        if sent_valid && read < 0 {
            out[i].0 += 1;
        }
        reads.push(read);
    }
    tokio::select! {
        _ = tokio::time::sleep(hold) => {}
        _ = lost.cancelled() => {}
    }
    for (i, (key, fence)) in fences.iter().enumerate() {
        if reads[i] < 0 || !valid() {
            continue;
        }
        let ok = store_op(store, key, *fence, "write", reads[i] + 1).await == 1;
        if !ok {
            out[i].0 += 1;
        }
    }
    out
}

/// A worker's candidate in the election: it campaigns (a wait of 50 ms to 2.5 s, with a lock
/// delay half the time), leads a while (writing to the store with its term as the fence), and
/// ends its term in one of four ways: `resign`, `resign_after_term`, dropping the leadership
/// (released in the background, not marked resigned), or dying: it campaigned with refresh
/// off and lets its lease run out, then drops it. (A fault may stop it too: its worker is
/// stopped, its connections killed, Redis restarted.) Each term is a hold of the election's
/// name (`H`, kind `lead`: so (a) and (c) apply to terms) and a `T` line with the campaign's
/// start, for the observers' check.
async fn campaigns<S: Strategy>(
    locker: Arc<Locker<S>>,
    store: Client,
    mut rng: Rng,
    until: Instant,
    tx: UnboundedSender<String>,
    strategy: &'static str,
    me: u64,
) {
    let election = locker.election(ELECTION).expect("election name");
    let value = format!("worker-{me}");
    while Instant::now() + Duration::from_millis(60) < until {
        let wait = rng
            .ms(50, 2500)
            .min(until.saturating_duration_since(Instant::now()));
        let delay = if rng.below(2) == 0 {
            Duration::ZERO
        } else {
            rng.ms(50, 200)
        };
        let ending = rng.below(100);
        let dies = ending >= 85;
        let lead_for = if rng.below(5) == 0 {
            rng.ms(900, 2000)
        } else {
            rng.ms(0, 300)
        };
        let mut opts = waiting(wait);
        if dies {
            opts = opts.with_refresh(Refresh::Off);
        }
        let called = now_ns();
        let started = Instant::now();
        let r = election
            .clone()
            .with_lock_delay(delay)
            .campaign(&value, &opts)
            .await;
        let waited_ms = started.elapsed().as_millis();
        match r {
            Ok(mut leader) => {
                let acquired = now_ns();
                let term = leader.term();
                let lost = leader.keep_alive();
                let (refused_valid, zombie) = {
                    let l = &leader;
                    section(
                        &store,
                        ELECTION,
                        term,
                        &|| l.valid_until(),
                        Some(&lost),
                        lead_for,
                        false,
                    )
                    .await
                };
                if dies {
                    // Dead: no refresh, no resign; the lease runs out.
                    tokio::time::sleep_until(leader.valid_until() + rng.ms(0, 300)).await;
                }
                let end = now_ns().min(wall(leader.valid_until()));
                match ending {
                    0..=54 => {
                        let _ = leader.resign().await;
                    }
                    55..=69 => {
                        let _ = leader.resign_after_term().await;
                    }
                    _ => drop(leader),
                }
                let h = Hold {
                    key: ELECTION.to_owned(),
                    fence: term,
                    kind: "lead",
                    acquired,
                    end,
                    refused_valid,
                    zombie,
                };
                let _ = tx.send(h.line());
                let _ = tx.send(format!("T {ELECTION} {term} {called} {acquired} {end}"));
            }
            Err(e) => {
                let _ = tx.send(format!("E {} {ELECTION} {e}", kind_of(&e)));
            }
        }
        let _ = tx.send(format!(
            "O campaign {strategy} {ELECTION} {called} {} {} {waited_ms}",
            now_ns(),
            wait.as_millis()
        ));
    }
}

/// A worker's observer of the election: every reading it is shown (`R <election> <term, 0 for
/// nobody> <time>`), from the first, until told to stop (`R <election> stop <time>`).
async fn observe<S: Strategy>(
    locker: Arc<Locker<S>>,
    tx: UnboundedSender<String>,
    stop: CancellationToken,
) {
    let election = locker.election(ELECTION).expect("election name");
    let mut shown = loop {
        // Redis may be restarting: try again.
        match election.observe().await {
            Ok(rx) => break rx,
            Err(_) => {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }
    };
    loop {
        let term = shown.borrow_and_update().as_ref().map_or(0, |l| l.term);
        let _ = tx.send(format!("R {ELECTION} {term} {}", now_ns()));
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = shown.changed() => if changed.is_err() { break },
        }
    }
    let _ = tx.send(format!("R {ELECTION} stop {}", now_ns()));
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
    /// `q` (waits in the queues), `p` (polls), `o` (a set in order: polls on one server).
    strategy: String,
    /// One key, or a set's keys (the contested ones).
    keys: Vec<String>,
    start: u64,
    end: u64,
    wait_ms: u64,
    waited_ms: u64,
}

impl OpRec {
    fn is_set(&self) -> bool {
        self.keys.len() > 1
    }

    fn cancelled(&self) -> bool {
        self.name == "cancel" || self.name == "scancel"
    }

    /// When it stopped waiting: its start plus what it waited (not its hold).
    fn wait_end(&self) -> u64 {
        (self.start + self.waited_ms * 1_000_000).min(self.end)
    }
}

/// A set granted: the keys asked for and the keys the guard (or the context) holds.
#[derive(Debug, Clone)]
struct GrantRec {
    worker: usize,
    want: Vec<String>,
    got: Vec<String>,
}

/// A term, as its leader saw it: campaign called, returned, and the term's end (resigned,
/// dropped, or its validity over).
#[derive(Debug, Clone)]
struct LeadRec {
    worker: usize,
    election: String,
    term: u64,
    called: u64,
    acquired: u64,
    end: u64,
}

/// What an observer was shown, and when (`term` `None`: nobody leads).
#[derive(Debug, Clone)]
struct Reading {
    worker: usize,
    election: String,
    term: Option<u64>,
    at: u64,
}

/// Everything the workers and the coordinator recorded.
#[derive(Default)]
struct History {
    holds: BTreeMap<String, Vec<HoldRec>>,
    ops: Vec<OpRec>,
    faults: Vec<Fault>,
    grants: Vec<GrantRec>,
    leads: Vec<LeadRec>,
    readings: Vec<Reading>,
    /// When each observer (worker, election) stopped.
    observed_until: BTreeMap<(usize, String), u64>,
    /// Campaigns that failed (a failed announcement may have been shown for a moment).
    campaign_failures: usize,
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

/// A stretch of time, wall ns, `[.0, .1)`.
type Span = (u64, u64);

/// `spans` sorted and merged, empty ones dropped.
fn merged(mut spans: Vec<Span>) -> Vec<Span> {
    spans.retain(|s| s.0 < s.1);
    spans.sort_unstable();
    let mut out: Vec<Span> = Vec::with_capacity(spans.len());
    for s in spans {
        match out.last_mut() {
            Some(last) if s.0 <= last.1 => last.1 = last.1.max(s.1),
            _ => out.push(s),
        }
    }
    out
}

/// `spans` cut to `[lo, hi)`.
fn clipped(spans: &[Span], lo: u64, hi: u64) -> Vec<Span> {
    spans
        .iter()
        .map(|s| (s.0.max(lo), s.1.min(hi)))
        .filter(|s| s.0 < s.1)
        .collect()
}

fn total(spans: &[Span]) -> u64 {
    spans.iter().map(|s| s.1 - s.0).sum()
}

/// The longest stretch of `[lo, hi)` that no span of `covered` (merged) covers.
fn longest_uncovered(lo: u64, hi: u64, covered: &[Span]) -> Span {
    let mut best = (lo, lo);
    let mut from = lo;
    for s in covered {
        if s.1 <= from {
            continue;
        }
        if s.0 >= hi {
            break;
        }
        if s.0 > from && s.0 - from > best.1 - best.0 {
            best = (from, s.0);
        }
        from = from.max(s.1);
    }
    if hi > from && hi - from > best.1 - best.0 {
        best = (from, hi);
    }
    best
}

/// When each queued set (by its index in `ops`) was legitimately kept waiting: while one of
/// its keys was held (the holder's view widened by `HELD_SLACK`), or while a queued set that
/// shares a key with it and may be ahead of it (it called before, or up to `AHEAD` after) was
/// itself kept waiting so (FIFO: it waits behind it). The least fixpoint: only holds start a
/// chain. Each set's stretches lie within its wait.
fn blocked_sets(h: &History) -> BTreeMap<usize, Vec<Span>> {
    let slack = HELD_SLACK.as_nanos() as u64;
    let ahead = AHEAD.as_nanos() as u64;
    let sets: Vec<usize> = (0..h.ops.len())
        .filter(|&i| h.ops[i].is_set() && h.ops[i].strategy == "q")
        .collect();
    let active = |i: usize| (h.ops[i].start, h.ops[i].wait_end() + 50_000_000);
    let mut blocked: BTreeMap<usize, Vec<Span>> = BTreeMap::new();
    for &i in &sets {
        let (lo, hi) = active(i);
        let mut spans = Vec::new();
        for k in &h.ops[i].keys {
            for hold in h.holds.get(k).into_iter().flatten() {
                spans.push((hold.start.saturating_sub(slack), hold.end + slack));
            }
        }
        blocked.insert(i, merged(clipped(&merged(spans), lo, hi)));
    }
    // Pairs (i, j): j may be ahead of i, they share a key, and their waits overlap.
    let mut behind: Vec<(usize, usize)> = Vec::new();
    for &i in &sets {
        for &j in &sets {
            let (a, b) = (&h.ops[i], &h.ops[j]);
            if i != j
                && b.start < a.start + ahead
                && active(j).0 < active(i).1
                && active(i).0 < active(j).1
                && a.keys.iter().any(|k| b.keys.contains(k))
            {
                behind.push((i, j));
            }
        }
    }
    for _ in 0..50 {
        let mut changed = false;
        for &(i, j) in &behind {
            let (lo, hi) = active(i);
            let extra = clipped(&blocked[&j], lo, hi);
            if extra.is_empty() {
                continue;
            }
            let before = total(&blocked[&i]);
            let mut spans = blocked[&i].clone();
            spans.extend(extra);
            let spans = merged(spans);
            if total(&spans) != before {
                changed = true;
                blocked.insert(i, spans);
            }
        }
        if !changed {
            break;
        }
    }
    blocked
}

/// The bound on a lock left free while a live queued waiter waits (b), and on an observer's
/// lag (h): `quiet` with no fault near `[from, to)`, else the longest near fault's length plus
/// the TTL, the claim window and a second.
fn bound_near(
    faults: &[Fault],
    from: u64,
    to: u64,
    quiet: Duration,
) -> (Duration, Vec<&'static str>) {
    let near: Vec<&Fault> = faults
        .iter()
        .filter(|f| f.start < to && f.end + 2 * TTL.as_nanos() as u64 + 1_000_000_000 > from)
        .collect();
    if near.is_empty() {
        return (quiet, Vec::new());
    }
    let longest = near.iter().map(|f| f.end - f.start).max().unwrap_or(0);
    (
        Duration::from_nanos(longest) + TTL + CLAIM + Duration::from_secs(1),
        near.iter().map(|f| f.what).collect(),
    )
}

fn check_history(h: &History, v: &mut Verdict) {
    let faults = &h.faults[..];
    let blocked = blocked_sets(h);
    for (key, hs) in &h.holds {
        // A hold whose validity had passed before the caller got it (its process was stopped
        // between the grant and the return) was never held from the caller's view: its end
        // (the deadline) is before its start, and no write of it was sent within a validity.
        let mut hs: Vec<HoldRec> = hs.iter().filter(|h| h.end > h.start).cloned().collect();
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
        for hold in &hs {
            if hold.refused_valid > 0 && !stopped_during(faults, hold.worker, hold.start, hold.end)
            {
                v.fail(format!(
                    "(c) {key}: the store refused {} write(s) fence {} sent within its validity",
                    hold.refused_valid, hold.fence
                ));
            }
        }
        // (b) a lock left free while a queued waiter (one key or a set) of a running process
        // waited, beyond the bound, except while a queued set that has the key and is ahead
        // of the waiter (or is the waiter) was kept waiting by a hold of its other keys.
        let mut busy_until = 0u64;
        for next in &hs {
            if busy_until > 0 && next.start > busy_until {
                let (gs, ge) = (busy_until, next.start);
                let mut worst: Option<(Span, &OpRec)> = None;
                for o in &h.ops {
                    if !o.keys.contains(key)
                        || o.strategy != "q"
                        || o.cancelled()
                        || stopped_during(faults, o.worker, o.start, o.end)
                    {
                        continue;
                    }
                    let lo = gs.max(o.start + 50_000_000);
                    let hi = ge.min(o.wait_end());
                    if lo >= hi {
                        continue;
                    }
                    let excused: Vec<Span> = blocked
                        .iter()
                        .filter(|(&j, _)| {
                            let s = &h.ops[j];
                            s.keys.contains(key)
                                && (std::ptr::eq(s, o)
                                    || s.start < o.start + AHEAD.as_nanos() as u64)
                        })
                        .flat_map(|(_, spans)| clipped(spans, lo, hi))
                        .collect();
                    let stretch = longest_uncovered(lo, hi, &merged(excused));
                    if worst.is_none_or(|(w, _)| stretch.1 - stretch.0 > w.1 - w.0) {
                        worst = Some((stretch, o));
                    }
                }
                if let Some(((ss, se), o)) = worst {
                    let (allowed, near) = bound_near(faults, gs, ge, Duration::from_secs(1));
                    let gap = Duration::from_nanos(se - ss);
                    if gap > allowed {
                        v.fail(format!(
                            "(b) {key}: free for {gap:?} ({:.3}..{:.3}) while a queued waiter waited ({} of worker {} for [{}], from {:.3}; allowed {allowed:?}, faults near: {near:?})",
                            common::ms(ss), common::ms(se), o.name, o.worker, o.keys.join(","), common::ms(o.start)
                        ));
                    }
                }
            }
            busy_until = busy_until.max(next.end);
        }
    }
    // (d) every wait ends by its deadline (plus the last attempt's time and slack).
    for o in &h.ops {
        if o.cancelled() || stopped_during(faults, o.worker, o.start, o.end) {
            continue;
        }
        let limit = o.wait_ms + CMD_TIMEOUT.as_millis() as u64 * 2 + 500;
        if o.waited_ms > limit {
            v.fail(format!(
                "(d) {} {} on {} (worker {}) waited {} ms, wait {} ms (limit {limit} ms)",
                o.name,
                o.strategy,
                o.keys.join(","),
                o.worker,
                o.waited_ms,
                o.wait_ms
            ));
        }
    }
    // (f) a set is held whole: its guard holds every key asked for, and no other.
    for g in &h.grants {
        if g.want != g.got {
            v.fail(format!(
                "(f) worker {}: a set asked for [{}] was granted [{}]",
                g.worker,
                g.want.join(","),
                g.got.join(",")
            ));
        }
    }
    // (g) an observer's terms never go back; (h) it shows a leader only from its campaign to
    // the end of its term plus the lease bound, and shows nobody only while nobody leads
    // (but within that bound of a term's start or end).
    let mut observers: BTreeMap<(usize, &str), Vec<&Reading>> = BTreeMap::new();
    for r in &h.readings {
        observers
            .entry((r.worker, &r.election))
            .or_default()
            .push(r);
    }
    let quiet = TTL + Duration::from_secs(1);
    for ((worker, election), mut rs) in observers {
        rs.sort_by_key(|r| r.at);
        let mut last = 0u64;
        for r in &rs {
            if let Some(t) = r.term {
                if t < last {
                    v.fail(format!(
                        "(g) {election}: the observer of worker {worker} was shown term {t} at {:.3}, after term {last}",
                        common::ms(r.at)
                    ));
                }
                last = last.max(t);
            }
        }
        let until = h
            .observed_until
            .get(&(worker, election.to_owned()))
            .copied();
        for (i, r) in rs.iter().enumerate() {
            let Some(to) = rs.get(i + 1).map(|n| n.at).or(until) else {
                continue;
            };
            if stopped_during(faults, worker, r.at, to) {
                continue;
            }
            let (allowed, near) = bound_near(faults, r.at, to, quiet);
            let allowed_ns = allowed.as_nanos() as u64;
            match r.term {
                Some(t) => {
                    let Some(l) = h
                        .leads
                        .iter()
                        .find(|l| l.election == election && l.term == t)
                    else {
                        if h.campaign_failures == 0 {
                            v.fail(format!(
                                "(h) {election}: the observer of worker {worker} was shown term {t}, which nobody led"
                            ));
                        }
                        continue;
                    };
                    if r.at < l.called {
                        v.fail(format!(
                            "(h) {election}: the observer of worker {worker} was shown term {t} at {:.3}, before its candidate (worker {}) campaigned at {:.3}",
                            common::ms(r.at), l.worker, common::ms(l.called)
                        ));
                    }
                    if to > l.end + allowed_ns {
                        v.fail(format!(
                            "(h) {election}: the observer of worker {worker} showed term {t} until {:.3}, {:?} after the term ended (worker {}, at {:.3}; allowed {allowed:?}, faults near: {near:?})",
                            common::ms(to), Duration::from_nanos(to - l.end), l.worker, common::ms(l.end)
                        ));
                    }
                }
                None => {
                    for l in h.leads.iter().filter(|l| l.election == election) {
                        let (lo, hi) = (r.at.max(l.acquired + allowed_ns), to.min(l.end));
                        if lo < hi {
                            v.fail(format!(
                                "(h) {election}: the observer of worker {worker} showed nobody from {:.3} to {:.3} while term {} (worker {}) led from {:.3} to {:.3} (allowed {allowed:?}, faults near: {near:?})",
                                common::ms(r.at), common::ms(to), l.term, l.worker, common::ms(l.acquired), common::ms(l.end)
                            ));
                        }
                    }
                }
            }
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
                    ("H_WORKER", i.to_string()),
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
        for key in KEYS.into_iter().chain([ELECTION]) {
            let queued = common::queued(&admin, key).await;
            let listeners = common::listeners(&admin, key).await;
            let lock: i64 = cmd(&admin, "EXISTS", vec![common::lock_key(key).into()]).await;
            if queued + listeners as i64 + lock > 0 {
                left.push(format!(
                    "{key}: {queued} queued, {listeners} grant channels, lock key {lock}"
                ));
            }
        }
        // The ordered sets' own keys.
        let fillers = common::lock_key("h-f");
        let fillers = &fillers[..fillers.len() - 1];
        let names: Vec<String> = cmd(&admin, "KEYS *", vec![]).await;
        for n in names {
            if n.starts_with(fillers) && n.ends_with('}') {
                left.push(format!("lock key {n}"));
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
    // (e) A processes hash may outlive its queue (a queue emptied by its own expiry, or by a
    // call that does not look), but only to its own expiry: the longest lease (an extend of
    // 2 s) plus the retention and a quarter of it (review 3 found one left 4,495 s, bounded
    // so; docs/design.md had said it goes with the queue).
    let bound = (Duration::from_secs(2) + RETENTION + RETENTION / 4).as_millis() as i64;
    for key in KEYS.into_iter().chain([ELECTION]) {
        let procs: i64 = cmd(&admin, "PTTL", vec![common::procs_key(key).into()]).await;
        if procs == -1 || procs > bound {
            v.fail(format!(
                "(e) {key}: its processes hash lives {procs} ms (at most {bound} ms)"
            ));
        }
    }
    // (e) The election's record expires after its last leader (review 3: a leader that died
    // with nobody queued left it with no expiry).
    let record: i64 = cmd(
        &admin,
        "PTTL",
        vec![format!("{}:leader", common::lock_key(ELECTION)).into()],
    )
    .await;
    if record == -1 {
        v.fail(format!("(e) {ELECTION}: its leader's record has no expiry"));
    }
    let mut h = History {
        faults,
        ..History::default()
    };
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    let mut zombies = (0u64, 0u64);
    let list = |x: Option<&&str>| -> Vec<String> {
        x.map(|x| {
            x.split(',')
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
    };
    for (i, mut w) in workers.into_iter().enumerate() {
        for l in w.drain().to_vec() {
            let f: Vec<&str> = l.split(' ').collect();
            let n = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
            match f[0] {
                "H" => {
                    zombies.0 += n(7);
                    zombies.1 += n(8);
                    h.holds.entry(f[1].to_owned()).or_default().push(HoldRec {
                        worker: i,
                        fence: n(2),
                        kind: f[3].to_owned(),
                        start: n(4),
                        end: n(5),
                        refused_valid: n(6),
                    })
                }
                "O" => h.ops.push(OpRec {
                    worker: i,
                    name: f[1].to_owned(),
                    strategy: f[2].to_owned(),
                    keys: list(f.get(3)),
                    start: n(4),
                    end: n(5),
                    wait_ms: n(6),
                    waited_ms: n(7),
                }),
                "G" => h.grants.push(GrantRec {
                    worker: i,
                    want: list(f.get(2)),
                    got: list(f.get(3)),
                }),
                "T" => h.leads.push(LeadRec {
                    worker: i,
                    election: f[1].to_owned(),
                    term: n(2),
                    called: n(3),
                    acquired: n(4),
                    end: n(5),
                }),
                "R" if f.get(2) == Some(&"stop") => {
                    h.observed_until.insert((i, f[1].to_owned()), n(3));
                }
                "R" => h.readings.push(Reading {
                    worker: i,
                    election: f[1].to_owned(),
                    term: Some(n(2)).filter(|t| *t > 0),
                    at: n(3),
                }),
                "E" => {
                    if f.get(2) == Some(&ELECTION) {
                        h.campaign_failures += 1;
                    }
                    *errors.entry(f[1].to_owned()).or_default() += 1
                }
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
    check_history(&h, &mut v);
    // (c) the counter the store protects lost no update: it equals the writes it accepted.
    for key in KEYS.into_iter().chain([ELECTION]) {
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
    let n_holds: usize = h.holds.values().map(Vec::len).sum();
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for f in &h.faults {
        *kinds.entry(f.what).or_default() += 1;
    }
    let mut by_op: BTreeMap<String, usize> = BTreeMap::new();
    for o in &h.ops {
        *by_op
            .entry(format!("{} {}", o.name, o.strategy))
            .or_default() += 1;
    }
    let mut by_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for hold in h.holds.values().flatten() {
        *by_kind.entry(&hold.kind).or_default() += 1;
    }
    let summary = format!(
        "seed {seed}: {} operations {by_op:?}, {n_holds} holds {by_kind:?}, {} sets granted, {} terms, {} observer readings, faults {kinds:?}, late writes of careless holders accepted {} / refused by the fence {}, errors {errors:?}",
        h.ops.len(),
        h.grants.len(),
        h.leads.len(),
        h.readings.len(),
        zombies.0,
        zombies.1
    );
    if n_holds < 300 {
        v.fail(format!(
            "only {n_holds} holds: the workers did not get going"
        ));
    }
    if h.grants.len() < 20 || h.leads.len() < 5 {
        v.fail(format!(
            "only {} sets granted and {} terms: the sets or the elections did not get going",
            h.grants.len(),
            h.leads.len()
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
    let ms = 1_000_000u64;
    let hold = |worker, fence, start: u64, end: u64, refused| HoldRec {
        worker,
        fence,
        kind: "guard".into(),
        start,
        end,
        refused_valid: refused,
    };
    let op_on = |keys: &[&str], worker, start: u64, end: u64, wait_ms, waited_ms| OpRec {
        worker,
        name: if keys.len() > 1 { "swait" } else { "wait" }.into(),
        strategy: "q".into(),
        keys: keys.iter().map(|k| (*k).to_owned()).collect(),
        start,
        end,
        wait_ms,
        waited_ms,
    };
    let op = |worker, start, end, wait_ms, waited_ms| {
        op_on(&["k"], worker, start, end, wait_ms, waited_ms)
    };
    let mut h = History::default();
    h.holds.insert(
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
    h.ops = vec![
        op(3, 3 * s, 7 * s, 10_000, 4_000),
        // (d) waited 5 s with a 1 s wait.
        op(1, 0, 5 * s, 1_000, 5_000),
    ];
    // (a) for sets: worker 4's set holds `s1` (a hold of each of its keys) while worker 5's
    // one-key hold does.
    h.holds.insert(
        "s1".to_owned(),
        vec![
            HoldRec {
                kind: "set".into(),
                ..hold(4, 5, 10 * s, 11 * s, 0)
            },
            hold(5, 6, 10 * s + 500 * ms, 12 * s, 0),
        ],
    );
    // (b) for sets: `s2` free from 21 s to 24 s while worker 6's queued set [s2, s3] waited,
    // and nothing held `s3`: the set should have been granted.
    h.holds.insert(
        "s2".to_owned(),
        vec![hold(0, 1, 20 * s, 21 * s, 0), hold(1, 2, 24 * s, 25 * s, 0)],
    );
    h.ops.push(op_on(
        &["s2", "s3"],
        6,
        20 * s + 500 * ms,
        25 * s,
        5_000,
        3_500,
    ));
    // (f) a set granted in part.
    h.grants = vec![
        GrantRec {
            worker: 2,
            want: vec!["a".into(), "b".into(), "c".into()],
            got: vec!["a".into(), "b".into()],
        },
        GrantRec {
            worker: 2,
            want: vec!["a".into(), "b".into()],
            got: vec!["a".into(), "b".into()],
        },
    ];
    // (g) an observer shown term 20, then term 15; (h) term 20 shown until 40 s though it
    // ended at 32 s, term 15 shown before its candidate campaigned, and nobody shown from
    // 45 s to 50 s while term 30 led.
    let lead = |worker, term, called, acquired, end| LeadRec {
        worker,
        election: "e".into(),
        term,
        called,
        acquired,
        end,
    };
    h.leads = vec![
        lead(0, 20, 30 * s, 30 * s + ms, 32 * s),
        lead(1, 15, 36 * s, 36 * s + ms, 37 * s),
        lead(2, 30, 42 * s, 42 * s + ms, 52 * s),
    ];
    let reading = |term, at| Reading {
        worker: 3,
        election: "e".into(),
        term,
        at,
    };
    h.readings = vec![
        reading(Some(20), 30 * s + 2 * ms),
        reading(Some(15), 35 * s),
        reading(Some(20), 35 * s + ms),
        reading(None, 40 * s),
        reading(Some(30), 42 * s + 2 * ms),
        reading(None, 45 * s),
        reading(Some(30), 50 * s),
    ];
    h.observed_until.insert((3, "e".into()), 51 * s);
    let mut v = Verdict::default();
    check_history(&h, &mut v);
    let want = [
        "(a) k:",
        "(a) s1:",
        "(b) k:",
        "(b) s2:",
        "(c) k: fence",
        "(c) k: the store",
        "(d)",
        "(f)",
        "(g)",
        "(h) e: the observer of worker 3 showed term 20 until",
        "(h) e: the observer of worker 3 was shown term 15 at",
        "(h) e: the observer of worker 3 showed nobody",
    ];
    let missed: Vec<&str> = want
        .into_iter()
        .filter(|p| !v.problems.iter().any(|x| x.starts_with(p)))
        .collect();
    if !missed.is_empty() {
        return Err(format!("the checker missed {missed:?}: {:?}", v.problems));
    }
    // And the same history, with the stopped worker and the fault it explains, passes (b)
    // and (d) for the ops of the stopped worker.
    let mut h2 = History {
        holds: h.holds.clone(),
        ops: h.ops.clone(),
        faults: vec![Fault {
            what: "stop a worker",
            start: 4 * s,
            end: 5 * s,
            worker: Some(3),
        }],
        ..History::default()
    };
    let mut v2 = Verdict::default();
    check_history(&h2, &mut v2);
    if v2.problems.iter().any(|p| p.starts_with("(b) k")) {
        return Err(format!(
            "a waiter of a stopped process counted for (b): {:?}",
            v2.problems
        ));
    }
    // A set kept waiting by a hold of its other key leaves `s2` free rightly; so does a
    // one-key waiter behind it, and a set behind a set kept waiting (a chain: [s4, s2]
    // waits behind [s2, s3], which waits for `s3`).
    h2.holds
        .insert("s3".to_owned(), vec![hold(2, 1, 20 * s, 24 * s, 0)]);
    h2.ops
        .push(op_on(&["s2"], 7, 20 * s + 600 * ms, 25 * s, 5_000, 3_400));
    h2.ops.push(op_on(
        &["s4", "s2"],
        8,
        20 * s + 700 * ms,
        25 * s,
        5_000,
        3_300,
    ));
    let mut v3 = Verdict::default();
    check_history(&h2, &mut v3);
    if v3.problems.iter().any(|p| p.starts_with("(b) s2")) {
        return Err(format!(
            "a set kept waiting by a hold counted for (b): {:?}",
            v3.problems
        ));
    }
    // But a one-key waiter that queued before the set is not kept waiting by it.
    h2.ops.push(op_on(&["s2"], 9, 20 * s, 25 * s, 5_000, 4_000));
    let mut v4 = Verdict::default();
    check_history(&h2, &mut v4);
    if !v4.problems.iter().any(|p| p.starts_with("(b) s2")) {
        return Err(format!(
            "a waiter ahead of a set that waits was let wait: {:?}",
            v4.problems
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
