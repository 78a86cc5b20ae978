//! The queue handoff across real processes: FIFO order, crashed and frozen waiters, mixed
//! lockers, and race hunts of grants against enqueues and cancellations.
//!
//! `harness = false`: the binary is also the waiter process (`QUEUE_CHILD=...`), started by the
//! scenarios and killed by pid. Each scenario prints a line; the last line counts them.

mod common;

use common::runner::Runner;
use common::worker::{field, Pipe, Proc};
use common::{now_ns, RedisServer, Seeded};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use waitlock::{Error, LockOptions, Locker};

// ------------------------------------------------------------------ worker processes

/// Role `waiters`: reads `wait <id>` lines and starts one `acquire_wait` per line; prints
/// `ACQ <id> <ns>` when it holds the lock, holds `Q_HOLD_MS`, releases, prints `REL <id> <ns>`.
/// Role `contend`: `Q_TASKS` tasks loop acquire / hold / release until `stop`, each
/// acquisition printed as `A <task> <acquired ns> <released ns> <fence> <1 if valid throughout>`.
async fn child(mode: &str) {
    let url = common::env("Q_URL");
    let key = common::env("Q_KEY");
    let hold = Duration::from_millis(common::env_num("Q_HOLD_MS"));
    let locker = Locker::connect(&url)
        .await
        .expect("child connects")
        .queued()
        .build()
        .await
        .expect("child pubsub");
    let mut pipe = Pipe::open();
    let ttl = match common::env_num("Q_TTL_MS") {
        0 => Duration::from_secs(10),
        ms => Duration::from_millis(ms),
    };
    let opts = LockOptions::new()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(30));
    pipe.say("ready");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    if mode == "contend" {
        for t in 0..common::env_num("Q_TASKS") {
            let (locker, opts, tx, key, stop) = (
                locker.clone(),
                opts.clone(),
                pipe.out.clone(),
                key.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    match locker.acquire_wait(&key, &opts).await {
                        Ok(g) => {
                            let got = now_ns();
                            tokio::time::sleep(hold).await;
                            let fence = g.fence();
                            let rel = now_ns();
                            // A process frozen while holding loses the lock: only holds still
                            // valid (by the holder's own clock) at the end, and released by
                            // their token, were exclusive.
                            let valid = g.valid_until() > Instant::now() && g.loss().is_none();
                            let released = g.release().await.is_ok();
                            let ok = u8::from(valid && released);
                            let _ = tx.send(format!("A {t} {got} {rel} {fence} {ok}"));
                        }
                        Err(e) => {
                            let _ = tx.send(format!("E {e}"));
                        }
                    }
                }
            }));
        }
    }
    while let Some(line) = pipe.input.recv().await {
        let mut words = line.split(' ');
        match (words.next(), words.next()) {
            (Some("wait"), Some(id)) => {
                // `wait <id> <k1,k2,...>`: a set of those keys at once.
                let set: Option<Vec<String>> = words
                    .next()
                    .map(|w| w.split(',').map(str::to_owned).collect());
                let (locker, opts, tx, key, id) = (
                    locker.clone(),
                    opts.clone(),
                    pipe.out.clone(),
                    key.clone(),
                    id.to_owned(),
                );
                tasks.push(tokio::spawn(async move {
                    let held = match &set {
                        Some(keys) => locker
                            .acquire_many_wait(keys, &opts)
                            .await
                            .map(|s| s.into_guards()),
                        None => locker.acquire_wait(&key, &opts).await.map(|g| vec![g]),
                    };
                    match held {
                        Ok(guards) => {
                            let _ = tx.send(format!("ACQ {id} {}", now_ns()));
                            tokio::time::sleep(hold).await;
                            let _ = tx.send(format!("REL {id} {}", now_ns()));
                            for g in guards {
                                let _ = g.release().await;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(format!("E {id} {e}"));
                        }
                    }
                }));
            }
            (Some("stop"), _) => {
                stop.store(true, std::sync::atomic::Ordering::SeqCst);
                break;
            }
            _ => {}
        }
    }
    for t in tasks {
        let _ = t.await;
    }
    pipe.say("done");
    pipe.close();
}

/// A worker of this suite: `mode` is its role; holds of `hold_ms`, `tasks` contending tasks,
/// waiters' TTL `ttl_ms` (0: 10 s).
fn worker(mode: &str, url: &str, key: &str, hold_ms: u64, tasks: u64, ttl_ms: u64) -> Proc {
    Proc::spawn(
        mode,
        &[
            ("Q_URL", url.to_owned()),
            ("Q_KEY", key.to_owned()),
            ("Q_HOLD_MS", hold_ms.to_string()),
            ("Q_TASKS", tasks.to_string()),
            ("Q_TTL_MS", ttl_ms.to_string()),
        ],
    )
}

// ------------------------------------------------------------------ helpers

/// Waits until Redis counts `alive` listeners on the grant channels of `keys` (a killed
/// process's gone). The bounds of the crash scenarios are for a process whose death Redis has
/// seen: its subscriber connection closed, so nobody listens on its grant channel. Killing the
/// process only starts that: on a busy machine Redis may read the close after the release, and
/// then counts the dead process as alive (a full grant to a process seen within the presence
/// window: its TTL, as a process frozen at the release). So the scenarios wait for the event.
async fn until_dead(url: &str, keys: &[&str], alive: usize) -> Result<(), String> {
    let admin = common::client_for(url).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut n = 0;
        for key in keys {
            n += common::listeners(&admin, key).await;
        }
        if n <= alive {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("Redis still counts the killed process's subscriber after 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

// ------------------------------------------------------------------ scenarios

/// Waiters enqueued one by one, in turn from three processes, acquire in that order.
async fn fifo_across_three_processes(url: &str) -> Result<String, String> {
    let locker = Locker::new(common::client_for(url).await);
    let key = "fifo";
    let g = locker
        .acquire(key, &LockOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    let mut procs: Vec<Proc> = (0..3)
        .map(|_| worker("waiters", url, key, 1, 0, 0))
        .collect();
    for p in procs.iter_mut() {
        p.expect("ready", Duration::from_secs(20)).await?;
    }
    let n = 12;
    for i in 0..n {
        procs[i % 3].send(&format!("wait {i}"));
        common::lock_queued(&locker, key, i + 1).await?;
    }
    g.release().await.map_err(|e| e.to_string())?;
    let mut acquired = Vec::new();
    for (i, p) in procs.iter_mut().enumerate() {
        for _ in 0..n / 3 {
            let l = p.expect("ACQ", Duration::from_secs(20)).await?;
            acquired.push((field(&l, 2), field(&l, 1) as usize, i));
        }
        p.send("stop");
    }
    acquired.sort();
    let order: Vec<usize> = acquired.iter().map(|a| a.1).collect();
    if order != (0..n).collect::<Vec<_>>() {
        return Err(format!("acquired in order {order:?}"));
    }
    Ok(format!(
        "{n} waiters from 3 processes acquired in enqueue order"
    ))
}

/// Sets that overlap, queued in turn from three processes (each set in every key's queue at
/// once), never pass an older set they overlap: for every two that share a key, the older
/// holds first (and releases before the later one holds).
async fn overlapping_sets_in_queue_order_across_three_processes(
    url: &str,
) -> Result<String, String> {
    let locker = Locker::new(common::client_for(url).await);
    let all = ["o-a", "o-b", "o-c", "o-d"];
    let held = locker
        .acquire_many(&all, &LockOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    let mut procs: Vec<Proc> = (0..3)
        .map(|_| worker("waiters", url, "o-a", 2, 0, 0))
        .collect();
    for p in procs.iter_mut() {
        p.expect("ready", Duration::from_secs(20)).await?;
    }
    let sets: [&[&str]; 9] = [
        &["o-a", "o-b"],
        &["o-b", "o-c"],
        &["o-c"],
        &["o-a", "o-d"],
        &["o-b", "o-c", "o-d"],
        &["o-a"],
        &["o-d"],
        &["o-a", "o-b", "o-c", "o-d"],
        &["o-c", "o-d"],
    ];
    let mut queued = [0usize; 4];
    for (i, set) in sets.iter().enumerate() {
        procs[i % 3].send(&format!("wait {i} {}", set.join(",")));
        for key in *set {
            let k = all.iter().position(|a| a == key).unwrap_or(0);
            queued[k] += 1;
            common::lock_queued(&locker, key, queued[k]).await?;
        }
    }
    held.release().await.map_err(|e| e.to_string())?;
    let mut at = vec![(0u64, 0u64); sets.len()];
    for (i, p) in procs.iter_mut().enumerate() {
        // (A process's sets that share no key may hold at once: their lines interleave.)
        for _ in 0..2 * (i..sets.len()).step_by(3).count() {
            let l = p.expect("", Duration::from_secs(30)).await?;
            let id = field(&l, 1) as usize;
            match l.split(' ').next() {
                Some("ACQ") => at[id].0 = field(&l, 2),
                Some("REL") => at[id].1 = field(&l, 2),
                _ => return Err(format!("worker {i}: {l}")),
            }
        }
        p.send("stop");
    }
    for i in 0..sets.len() {
        for j in i + 1..sets.len() {
            if sets[i].iter().any(|k| sets[j].contains(k)) && at[j].0 < at[i].1 {
                return Err(format!(
                    "set {j} {:?} held before the older set {i} {:?} released",
                    sets[j], sets[i]
                ));
            }
        }
    }
    Ok(format!(
        "{} overlapping sets from 3 processes held in queue order",
        sets.len()
    ))
}

/// A process SIGKILLed while its set waits at the head of a free key's queue (held back there
/// by another key of the set): a waiter of another process queued behind it on that key holds
/// it right after that other key's release (the release drops the dead set from every queue,
/// and tells the free key's watchers to look: one round trip more than a grant).
async fn a_crashed_set_waiter_holds_back_the_waiters_behind_it_briefly(
    url: &str,
) -> Result<String, String> {
    let locker = Locker::new(common::client_for(url).await);
    let g = locker
        .acquire("d-b", &LockOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    let mut doomed = worker("waiters", url, "d-a", 1, 0, 0);
    let mut survivor = worker("waiters", url, "d-a", 1, 0, 0);
    doomed.expect("ready", Duration::from_secs(20)).await?;
    survivor.expect("ready", Duration::from_secs(20)).await?;
    doomed.send("wait set d-a,d-b");
    common::lock_queued(&locker, "d-a", 1).await?;
    common::lock_queued(&locker, "d-b", 1).await?;
    survivor.send("wait one");
    common::lock_queued(&locker, "d-a", 2).await?;
    if locker.status("d-a").await.map_err(|e| e.to_string())?.held {
        return Err("d-a is held while the set waits at its head".into());
    }
    doomed.kill();
    // (The set listens on its first key's channel, the survivor on d-a's.)
    until_dead(url, &["d-a", "d-b"], 1).await?;
    let after = released_to(g, &mut survivor).await?;
    survivor.send("stop");
    survivor.expect("done", Duration::from_secs(10)).await?;
    common::lock_queued(&locker, "d-a", 0).await?;
    common::lock_queued(&locker, "d-b", 0).await?;
    if after > 250.0 {
        return Err(format!(
            "the survivor held d-a {after:.1} ms after d-b's release"
        ));
    }
    Ok(format!(
        "a set waiter killed at the head of a free key's queue: the next held it {after:.2} ms after the release of the set's other key"
    ))
}

/// Releases `g` and waits for `next`'s acquisition ("ACQ"): the ms from the release to it.
async fn released_to(g: waitlock::LockGuard, next: &mut Proc) -> Result<f64, String> {
    let released = now_ns();
    g.release().await.map_err(|e| e.to_string())?;
    let l = next.expect("ACQ", Duration::from_secs(10)).await?;
    Ok(common::ms(field(&l, 2).saturating_sub(released)))
}

/// A process SIGKILLed with `n` waiters queued: a waiter of another process queued behind them
/// holds the lock right after the release (dead waiters are skipped, no timer involved).
async fn crashed_waiters(url: &str, n: usize) -> Result<String, String> {
    let locker = Locker::new(common::client_for(url).await);
    let key = format!("crashed-{n}");
    let g = locker
        .acquire(&key, &LockOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    let mut doomed = worker("waiters", url, &key, 1, 0, 0);
    let mut survivor = worker("waiters", url, &key, 1, 0, 0);
    doomed.expect("ready", Duration::from_secs(20)).await?;
    survivor.expect("ready", Duration::from_secs(20)).await?;
    for i in 0..n {
        doomed.send(&format!("wait {i}"));
    }
    common::lock_queued(&locker, &key, n).await?;
    survivor.send("wait survivor");
    common::lock_queued(&locker, &key, n + 1).await?;
    doomed.kill();
    until_dead(url, &[&key], 1).await?;
    let after = released_to(g, &mut survivor).await?;
    survivor.send("stop");
    survivor.expect("done", Duration::from_secs(10)).await?;
    common::lock_queued(&locker, &key, 0).await?;
    if after > 250.0 {
        return Err(format!(
            "survivor held the lock {after:.1} ms after the release"
        ));
    }
    Ok(format!(
        "{n} waiters killed: the next live waiter held the lock {after:.2} ms after the release"
    ))
}

/// Review 2, finding 2. A holder (a polling locker's) that never releases; waiters A, B and C
/// of three processes queue in that order, A and B the lock's watchers. B freezes. At the
/// holder's lease end A looks and takes the free lock as the oldest live waiter; then A dies
/// holding it. C, alive, must hold the lock once A's lease ends (plus B's short grant, which
/// lapses): the waiter that took the lock chooses the watchers again (before the fix one
/// watcher field named A itself and the other the frozen B, so nobody looked, and C slept
/// until its 100 s look or its deadline).
async fn a_waiter_taking_the_free_lock_chooses_the_watchers(url: &str) -> Result<String, String> {
    let key = "self-path";
    let mut a = worker("waiters", url, key, 60_000, 0, 2000);
    let mut b = worker("waiters", url, key, 1, 0, 2000);
    a.expect("ready", Duration::from_secs(20)).await?;
    b.expect("ready", Duration::from_secs(20)).await?;
    let holder = Locker::new(common::client_for(url).await);
    let crashed = holder
        .acquire(key, &LockOptions::new().with_ttl(Duration::from_secs(3)))
        .await
        .map_err(|e| e.to_string())?;
    std::mem::forget(crashed);
    a.send("wait a");
    common::lock_queued(&holder, key, 1).await?;
    b.send("wait b");
    common::lock_queued(&holder, key, 2).await?;
    let c_locker = common::queued_locker(url).await;
    let c = tokio::spawn(async move {
        let r = c_locker
            .acquire_wait(
                key,
                &LockOptions::new()
                    .with_ttl(Duration::from_secs(2))
                    .with_wait(Duration::from_secs(12)),
            )
            .await;
        (now_ns(), r.map(|g| g.fence()))
    });
    common::lock_queued(&holder, key, 3).await?;
    b.signal("-STOP");
    a.expect("ACQ", Duration::from_secs(10)).await?;
    a.kill();
    let killed = now_ns();
    let (at, got) = c.await.map_err(|e| e.to_string())?;
    b.signal("-CONT");
    got.map_err(|e| format!("C did not get the lock after A died: {e}"))?;
    let after = common::ms(at.saturating_sub(killed));
    // A's lease (2 s from its grant) and B's short grant (the claim window), plus slack.
    let bound = 2000.0 + 500.0 + 1500.0;
    if after > bound {
        return Err(format!(
            "C held the lock {after:.0} ms after A died holding it (bound {bound} ms)"
        ));
    }
    Ok(format!(
        "A took the free lock as the oldest waiter and died holding it, B frozen: C held it {after:.0} ms after A's death (A's lease 2 s, B's short grant 0.5 s)"
    ))
}

/// Review 2, finding 4. A process queued, then frozen longer than the presence window before
/// the release, but its record in the processes hash is in Redis' future (written before a
/// backward step of Redis' clock, or by a node whose clock was ahead): it must still get a
/// short grant (the claim window), not its full TTL (5 s here), so the live waiter behind it
/// holds the lock within about the claim window of the release.
async fn a_record_in_redis_future_is_not_fresh(url: &str) -> Result<String, String> {
    let key = "future-record";
    let admin = common::client_for(url).await;
    let holder = Locker::new(common::client_for(url).await);
    let g = holder
        .acquire(key, &LockOptions::new().with_ttl(Duration::from_secs(20)))
        .await
        .map_err(|e| e.to_string())?;
    let mut frozen = worker("waiters", url, key, 1, 0, 5000);
    frozen.expect("ready", Duration::from_secs(20)).await?;
    frozen.send("wait f");
    common::lock_queued(&holder, key, 1).await?;
    let live_locker = common::queued_locker(url).await;
    let live = tokio::spawn(async move {
        let r = live_locker
            .acquire_wait(
                key,
                &LockOptions::new()
                    .with_ttl(Duration::from_secs(5))
                    .with_wait(Duration::from_secs(15)),
            )
            .await;
        (now_ns(), r.map(|g| g.fence()))
    });
    common::lock_queued(&holder, key, 2).await?;
    frozen.signal("-STOP");
    // The frozen process's record, as if written ten minutes ahead of Redis' clock now.
    let members: Vec<String> = common::cmd(
        &admin,
        "ZRANGE",
        vec![common::queue_key(key).into(), 0.into(), 0.into()],
    )
    .await;
    let hub = members
        .first()
        .and_then(|m| m.split(' ').next())
        .ok_or("no member queued")?
        .to_owned();
    let time: Vec<String> = common::cmd(&admin, "TIME", vec![]).await;
    let now_ms =
        time[0].parse::<u64>().unwrap_or(0) * 1000 + time[1].parse::<u64>().unwrap_or(0) / 1000;
    let _: i64 = common::cmd(
        &admin,
        "HSET",
        vec![
            common::procs_key(key).into(),
            hub.into(),
            (now_ms + 600_000).to_string().into(),
        ],
    )
    .await;
    // Frozen longer than the presence window (100 ms) before the release: the scenario.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let released = now_ns();
    g.release().await.map_err(|e| e.to_string())?;
    let (at, got) = live.await.map_err(|e| e.to_string())?;
    frozen.signal("-CONT");
    got.map_err(|e| format!("the live waiter did not get the lock: {e}"))?;
    let after = common::ms(at.saturating_sub(released));
    let bound = 500.0 + 1000.0;
    if after > bound {
        return Err(format!(
            "the live waiter held the lock {after:.0} ms after the release (claim window 500 ms, the frozen one's TTL 5,000 ms; bound {bound} ms)"
        ));
    }
    Ok(format!(
        "a frozen process with a record in Redis' future got a short grant: the live waiter held the lock {after:.0} ms after the release (claim window 500 ms; its TTL would be 5,000 ms)"
    ))
}

/// Review 2, finding 3. With a retention of 1 s, three waiters of three lockers wait behind a
/// holder for 2 s (longer than the retention since they queued) before it releases: the queue
/// must still be there, and the release hands the lock to each in turn at once (before the
/// fix the queue had expired: the release granted nobody, the two watchers took the lock at
/// the holder's old lease end, 4 s later, and the third waited until its deadline).
async fn a_wait_longer_than_the_retention_keeps_its_queue(url: &str) -> Result<String, String> {
    let key = "retention";
    let retain = Duration::from_secs(1);
    let holder = Locker::connect(url)
        .await
        .map_err(|e| e.to_string())?
        .retention(retain)
        .build()
        .map_err(|e| e.to_string())?;
    let g = holder
        .acquire(key, &LockOptions::new().with_ttl(Duration::from_secs(6)))
        .await
        .map_err(|e| e.to_string())?;
    let mut waiters = Vec::new();
    for i in 0..3 {
        let l = Locker::connect(url)
            .await
            .map_err(|e| e.to_string())?
            .retention(retain)
            .queued()
            .build()
            .await
            .map_err(|e| e.to_string())?;
        waiters.push(tokio::spawn(async move {
            let r = l
                .acquire_wait(
                    key,
                    &LockOptions::new()
                        .with_ttl(Duration::from_millis(300))
                        .with_wait(Duration::from_secs(8)),
                )
                .await;
            let at = now_ns();
            match r {
                Ok(g) => {
                    let _ = g.release().await;
                    Ok(at)
                }
                Err(e) => Err(e.to_string()),
            }
        }));
        common::lock_queued(&holder, key, i + 1).await?;
    }
    // Longer than the retention since the last waiter queued: the scenario.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let released = now_ns();
    g.release().await.map_err(|e| e.to_string())?;
    let mut after = Vec::new();
    for (i, w) in waiters.into_iter().enumerate() {
        let at = w
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("waiter {i}: {e}"))?;
        after.push(common::ms(at.saturating_sub(released)));
    }
    if after.iter().any(|&a| a > 1000.0) {
        return Err(format!(
            "after a wait longer than the retention, the waiters held the lock {after:.0?} ms after the release"
        ));
    }
    Ok(format!(
        "retention 1 s, waited 2 s: the three waiters held the lock {after:.1?} ms after the release"
    ))
}

/// Review 3, finding 2, on a 3-primary Cluster: set S {a, b} of a process that freezes (its
/// connections stay up) heads b's queue while a is held; W_A waits on a, W_B on b. a's release
/// reserves a for S (a call writes only the keys it declared), the reservation lapses, and
/// W_A's look drops S from a's queue, marking its process lapsed in a's hash only. On b, S
/// still heads the queue and listens, never ready: with nothing more, W_B waited as long as
/// S's process stayed frozen (it timed out after 30 s, b free throughout). Now S, missing from
/// a's queue, is judged departed on b: W_B holds b shortly after W_A holds a, and S, resumed,
/// queues again and takes both keys.
async fn a_frozen_set_waiter_on_a_cluster_holds_back_no_free_key() -> Result<String, String> {
    let cluster = common::cluster::RedisCluster::start(3, 0);
    let url = cluster.url();
    let (a, b) = ("{fz}:a".to_owned(), "{fz}:b".to_owned());
    let e = |e: Error| e.to_string();
    let holder = Locker::connect(&url).await.map_err(e)?.build().map_err(e)?;
    let held_a = holder
        .acquire(&a, &LockOptions::new().with_ttl(Duration::from_secs(30)))
        .await
        .map_err(e)?;
    let mut set_proc = worker("waiters", &url, &a, 10, 0, 10_000);
    set_proc.expect("ready", Duration::from_secs(30)).await?;
    set_proc.send(&format!("wait 1 {a},{b}"));
    let (wa, wb) = (
        common::queued_locker(&url).await,
        common::queued_locker(&url).await,
    );
    common::lock_queued(&wa, &a, 1).await?;
    common::lock_queued(&wa, &b, 1).await?;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::from_secs(30));
    let wait_a = {
        let (wa, a, opts) = (wa.clone(), a.clone(), opts.clone());
        tokio::spawn(async move { wa.acquire_wait(&a, &opts).await })
    };
    let wait_b = {
        let (wb, b, opts) = (wb.clone(), b.clone(), opts.clone());
        tokio::spawn(async move { wb.acquire_wait(&b, &opts).await })
    };
    common::lock_queued(&wa, &a, 2).await?;
    common::lock_queued(&wa, &b, 2).await?;
    set_proc.signal("-STOP");
    let released = Instant::now();
    held_a.release().await.map_err(e)?;
    let got_a = wait_a.await.map_err(|j| j.to_string())?.map_err(e)?;
    let a_after = released.elapsed();
    let got_b = wait_b
        .await
        .map_err(|j| j.to_string())?
        .map_err(|err| format!("W_B, behind the frozen set on free key b: {err}"))?;
    let b_after = released.elapsed();
    got_a.release().await.map_err(e)?;
    got_b.release().await.map_err(e)?;
    set_proc.signal("-CONT");
    set_proc.expect("ACQ 1", Duration::from_secs(60)).await?;
    set_proc.expect("REL 1", Duration::from_secs(30)).await?;
    set_proc.send("stop");
    set_proc.expect("done", Duration::from_secs(30)).await?;
    wa.idle().await;
    for key in [&a, &b] {
        let status = wa.status(key).await.map_err(e)?;
        if status.held || status.queued > 0 {
            return Err(format!("{key} left behind: {status:?}"));
        }
    }
    Ok(format!(
        "the set's process frozen: W_A held a {a_after:.2?} and W_B held b {b_after:.2?} after a's release"
    ))
}

/// Two waiters of a process that froze before the release (longer ago than the presence
/// window, 100 ms) and a live waiter behind them: the release gives the frozen one a short
/// grant (the claim window), which lapses; the live waiter, told to watch the lock, holds it
/// within the claim window (plus a little) of the release. The frozen process's waiters are
/// skipped, and served after SIGCONT (they queue again).
async fn frozen_grantee(url: &str) -> Result<String, String> {
    let (live_ms, frozen_line) = frozen_before_release(url, "frozen-grantee", 300, 0).await?;
    let bound = 500.0 + 250.0;
    if live_ms > bound {
        return Err(format!(
            "live waiter held the lock {live_ms:.0} ms after the release (bound {bound} ms)"
        ));
    }
    Ok(format!(
        "process frozen 300 ms before the release: its short grant lapsed; the live waiter held the lock {live_ms:.0} ms after the release (claim window 500 ms); {frozen_line}"
    ))
}

/// The cost the presence window leaves: a process frozen just before the release (it was
/// seen on the key within the presence window) is handed the lock with its full TTL, and
/// keeps it that long, like a frozen holder. TTL 2 s here: the live waiter holds the lock
/// after the TTL plus a claim window at most (the frozen process's second waiter gets a short
/// grant, which lapses).
async fn frozen_right_before_its_grant(url: &str) -> Result<String, String> {
    let (live_ms, frozen_line) = frozen_before_release(url, "frozen-just-before", 0, 2000).await?;
    let bound = 2000.0 + 500.0 + 500.0;
    if live_ms > bound {
        return Err(format!(
            "live waiter held the lock {live_ms:.0} ms after the release (bound {bound} ms)"
        ));
    }
    Ok(format!(
        "process frozen at the release: it kept its full-TTL grant; the live waiter held the lock {live_ms:.0} ms after the release (TTL 2 s + claim window 0.5 s); {frozen_line}"
    ))
}

/// A holder, a process with two queued waiters that is frozen `freeze_ms` before the release,
/// and a live waiter queued behind them. Returns when the live waiter held the lock (ms after
/// the release), and a line about the frozen one's waiters after SIGCONT.
async fn frozen_before_release(
    url: &str,
    key: &str,
    freeze_ms: u64,
    ttl_ms: u64,
) -> Result<(f64, String), String> {
    let locker = Locker::new(common::client_for(url).await);
    let g = locker
        .acquire(key, &LockOptions::new())
        .await
        .map_err(|e| e.to_string())?;
    let mut frozen = worker("waiters", url, key, 1, 0, ttl_ms);
    let mut live = worker("waiters", url, key, 1, 0, ttl_ms);
    frozen.expect("ready", Duration::from_secs(20)).await?;
    live.expect("ready", Duration::from_secs(20)).await?;
    frozen.send("wait f0");
    frozen.send("wait f1");
    common::lock_queued(&locker, key, 2).await?;
    live.send("wait live");
    common::lock_queued(&locker, key, 3).await?;
    frozen.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(freeze_ms)).await;
    let after = released_to(g, &mut live).await?;
    frozen.signal("-CONT");
    // The resumed process finds its waiters skipped, queues them again and is served.
    frozen.expect("ACQ", Duration::from_secs(10)).await?;
    frozen.expect("ACQ", Duration::from_secs(10)).await?;
    Ok((
        after,
        "the frozen one's two waiters were served after SIGCONT".into(),
    ))
}

/// Three processes contend with 1 ms holds and a 2 s TTL; two are frozen with their
/// connections open. After a one-time cost (the TTL of a full grant one of them got as it
/// froze, and a claim window per frozen process), the live one's handoffs run at full speed
/// again: the frozen processes' waiters are skipped.
async fn frozen_processes_do_not_slow_the_live_one(url: &str) -> Result<String, String> {
    let key = "frozen-procs";
    let mut procs: Vec<Proc> = (0..3)
        .map(|_| worker("contend", url, key, 1, 2, 2000))
        .collect();
    for p in procs.iter_mut() {
        p.expect("ready", Duration::from_secs(20)).await?;
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    procs[1].signal("-STOP");
    procs[2].signal("-STOP");
    let frozen_at = now_ns();
    tokio::time::sleep(Duration::from_millis(5500)).await;
    procs[1].signal("-CONT");
    procs[2].signal("-CONT");
    for p in procs.iter_mut() {
        p.send("stop");
    }
    let (mut all, mut lost) = (Vec::new(), 0);
    for (i, p) in procs.iter_mut().enumerate() {
        p.expect("done", Duration::from_secs(40)).await?;
        for l in p.drain() {
            if l.starts_with("A ") {
                if field(l, 5) == 1 {
                    all.push((field(l, 2), field(l, 3), i));
                } else {
                    lost += 1;
                }
            }
        }
    }
    all.sort();
    for w in all.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(format!("overlap: {:?} and {:?}", w[0], w[1]));
        }
    }
    // The live process's handoffs from 3.5 s after the freeze (TTL 2 s + two claim windows
    // + slack) to the SIGCONT.
    let (from, to) = (frozen_at + 3_500_000_000, frozen_at + 5_400_000_000);
    let live: Vec<&(u64, u64, usize)> = all
        .iter()
        .filter(|a| a.2 == 0 && a.0 >= from && a.0 <= to)
        .collect();
    let mut gaps: Vec<f64> = live
        .windows(2)
        .map(|w| common::ms(w[1].0.saturating_sub(w[0].1)))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let p50 = gaps.get(gaps.len() / 2).copied().unwrap_or(f64::MAX);
    let first_after = all
        .iter()
        .filter(|a| a.2 == 0 && a.0 >= frozen_at)
        .map(|a| common::ms(a.0 - frozen_at))
        .nth(5)
        .unwrap_or(f64::MAX);
    if live.len() < 100 || p50 > 3.0 {
        return Err(format!(
            "live process: {} acquisitions in 1.9 s, gap p50 {p50:.2} ms",
            live.len()
        ));
    }
    Ok(format!(
        "2 of 3 processes frozen: the live one's 6th acquisition came {first_after:.0} ms after the freeze, then {} acquisitions in 1.9 s, gap p50 {p50:.2} ms; no overlap among valid holds ({lost} holds frozen past their validity, as expected)",
        live.len()
    ))
}

/// A free lock with a live waiter queued (its holder crashed): one-shot `acquire`, `try_lock`
/// and a polling waiter do not take it; the queued waiter does. Nobody overlaps.
async fn others_do_not_jump_the_queue(url: &str) -> Result<String, String> {
    let admin = common::client_for(url).await;
    let pubsub = common::queued_locker(url).await;
    let poller = Locker::new(common::client_for(url).await);
    let key = "no-jumping";
    // A holder that crashes: its lock expires by its TTL, nobody releases it.
    let crashed = poller
        .acquire(
            key,
            &LockOptions::new().with_ttl(Duration::from_millis(300)),
        )
        .await
        .map_err(|e| e.to_string())?;
    std::mem::forget(crashed);
    let w = {
        let l = pubsub.clone();
        tokio::spawn(async move {
            l.acquire_wait(key, &LockOptions::new().with_wait(Duration::from_secs(5)))
                .await
        })
    };
    common::lock_queued(&poller, key, 1).await?;
    // Until the waiter holds it, every other caller is refused.
    let mut refused = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let s = poller.status(key).await.map_err(|e| e.to_string())?;
        if s.queued == 0 {
            break; // the queued waiter has it
        }
        match poller.acquire(key, &LockOptions::new()).await {
            Err(Error::Locked { .. }) => refused += 1,
            other => return Err(format!("one-shot acquire jumped the queue: {other:?}")),
        }
        match poller
            .try_lock(key, "intruder", Duration::from_secs(5))
            .await
        {
            Err(Error::Locked { .. }) => refused += 1,
            other => return Err(format!("try_lock jumped the queue: {other:?}")),
        }
        if Instant::now() > deadline {
            return Err("the queued waiter never got the lock".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let g = w
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    // The polling locker was told it stood behind a queue (counted; warned once).
    let behind = poller.stats().behind_queue;
    if behind == 0 {
        return Err("the polling locker's stats do not show it stood behind the queue".into());
    }
    // A polling waiter waits its turn behind the holder and gets it after the release.
    let p = {
        let l = poller.clone();
        tokio::spawn(async move {
            l.acquire_wait(key, &common::tight().with_wait(Duration::from_secs(5)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    if p.is_finished() {
        return Err("the polling waiter took a held lock".into());
    }
    g.release().await.map_err(|e| e.to_string())?;
    let pg = p
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    pg.release().await.map_err(|e| e.to_string())?;
    let v: Option<String> = common::cmd(&admin, "GET", vec![common::lock_key(key).into()]).await;
    if v.is_some() {
        return Err(format!("lock left behind: {v:?}"));
    }
    Ok(format!(
        "{refused} one-shot/try_lock attempts on a free lock with a waiter queued were refused ({behind} counted as behind the queue); the waiter got it, then the poller"
    ))
}

/// Thousands of rounds of a release racing a waiter's enqueue at random sub-millisecond
/// offsets: the waiter always holds the lock within milliseconds of the release, never after a
/// timer; and of a release racing the waiter's cancellation: never a lock left to a token
/// nobody waits for, no queue entry, no subscription, no task.
async fn grant_race_hunt(url: &str) -> Result<String, String> {
    let admin = common::client_for(url).await;
    let holder = Locker::new(common::client_for(url).await);
    let pubsub = common::queued_locker(url).await;
    let opts = LockOptions::new().with_wait(Duration::from_secs(5));
    let mut rng = Seeded::new(0x9e37_79b9_7f4a_7c15);
    let rounds = 1500;
    let mut worst = 0.0f64;
    let mut by_grant = 0;
    let timers_before = pubsub.stats().wakes.by_timer;
    for i in 0..rounds {
        let key = format!("race-{}", i % 7);
        let g = holder
            .acquire(&key, &LockOptions::new())
            .await
            .map_err(|e| format!("round {i}: {e}"))?;
        let w = {
            let (l, k, o) = (pubsub.clone(), key.clone(), opts.clone());
            tokio::spawn(async move { l.acquire_wait(&k, &o).await.map(|g| (now_ns(), g)) })
        };
        tokio::time::sleep(rng.below(Duration::from_micros(1500))).await;
        g.release().await.map_err(|e| format!("round {i}: {e}"))?;
        let released = now_ns();
        let (held, wg) = w
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("round {i}: {e}"))?;
        worst = worst.max(common::ms(held.saturating_sub(released)));
        wg.release().await.map_err(|e| format!("round {i}: {e}"))?;
        by_grant = pubsub.stats().wakes.by_notification;
    }
    let timer_wakes = pubsub.stats().wakes.by_timer - timers_before;
    if worst > 100.0 || timer_wakes > 0 {
        return Err(format!(
            "a waiter held the lock {worst:.1} ms after the release; {timer_wakes} timer wakes"
        ));
    }
    // Cancellation racing the release (and the grant's delivery).
    for i in 0..rounds {
        let key = format!("cancel-{}", i % 7);
        let g = holder
            .acquire(&key, &LockOptions::new())
            .await
            .map_err(|e| format!("cancel round {i}: {e}"))?;
        let w = {
            let (l, k, o) = (pubsub.clone(), key.clone(), opts.clone());
            tokio::spawn(async move { l.acquire_wait(&k, &o).await })
        };
        tokio::time::sleep(rng.below(Duration::from_micros(1500))).await;
        let cut = rng.below(Duration::from_micros(400));
        let release = async {
            g.release()
                .await
                .map_err(|e| format!("cancel round {i}: {e}"))
        };
        let abort = async {
            tokio::time::sleep(cut).await;
            w.abort();
            let _ = w.await;
        };
        let (r, _) = tokio::join!(release, abort);
        r?;
        // The waiter may have won the lock before it was aborted: then its guard was dropped
        // and released in the background. Either way nothing may stay behind.
        pubsub.idle().await;
        let s = holder.status(&key).await.map_err(|e| e.to_string())?;
        if s.held || s.queued != 0 {
            return Err(format!("cancel round {i}: left behind {s:?}"));
        }
    }
    pubsub.subscriptions_settled().await;
    let size = pubsub.registry_size();
    let channels = common::lock_channels(&admin).await;
    if size.keys + size.waiters != 0 || channels != 0 || pubsub.background_tasks() != 0 {
        return Err(format!(
            "leaks: registry {size:?}, {channels} channels, {} tasks",
            pubsub.background_tasks()
        ));
    }
    Ok(format!(
        "{rounds} release/enqueue races: worst handoff {worst:.2} ms, {by_grant} by grant, 0 timer wakes; {rounds} release/cancel races: no lock or queue entry left, no subscription, no task"
    ))
}

/// A waiter cancelled right after its grant was published (before or after its process read
/// the message) gives the lock back: the next waiter holds it at once.
async fn cancelled_after_the_grant(url: &str) -> Result<String, String> {
    let holder = Locker::new(common::client_for(url).await);
    let a = common::queued_locker(url).await;
    let b = common::queued_locker(url).await;
    let opts = LockOptions::new().with_wait(Duration::from_secs(5));
    let mut worst = 0.0f64;
    let rounds = 200;
    for i in 0..rounds {
        let key = format!("after-grant-{i}");
        let g = holder
            .acquire(&key, &LockOptions::new())
            .await
            .map_err(|e| e.to_string())?;
        let first = {
            let (l, k, o) = (a.clone(), key.clone(), opts.clone());
            tokio::spawn(async move { l.acquire_wait(&k, &o).await })
        };
        common::lock_queued(&holder, &key, 1).await?;
        let second = {
            let (l, k, o) = (b.clone(), key.clone(), opts.clone());
            tokio::spawn(async move { l.acquire_wait(&k, &o).await.map(|g| (now_ns(), g)) })
        };
        common::lock_queued(&holder, &key, 2).await?;
        g.release().await.map_err(|e| e.to_string())?; // the grant to `first` is published
        first.abort();
        let aborted = now_ns();
        if let Ok(Ok(g)) = first.await {
            g.release().await.map_err(|e| e.to_string())?; // it won before the abort landed
        }
        let (held, g2) = second
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("round {i}: {e}"))?;
        worst = worst.max(common::ms(held.saturating_sub(aborted)));
        g2.release().await.map_err(|e| e.to_string())?;
    }
    a.idle().await;
    if worst > 100.0 {
        return Err(format!(
            "the next waiter waited {worst:.1} ms after the cancellation"
        ));
    }
    Ok(format!(
        "{rounds} waiters cancelled just after their grant: the next held the lock within {worst:.2} ms"
    ))
}

// ------------------------------------------------------------------ runner

fn main() -> std::process::ExitCode {
    if let Some(mode) = common::worker::role() {
        common::runner::runtime().block_on(child(&mode));
        return std::process::ExitCode::SUCCESS;
    }
    let mut r = Runner::new();
    let server = RedisServer::start();
    let url = server.url();
    let limit = Duration::from_secs(120);
    r.run(
        "fifo_across_three_processes",
        limit,
        fifo_across_three_processes(&url),
    );
    r.run(
        "overlapping_sets_in_queue_order_across_three_processes",
        limit,
        overlapping_sets_in_queue_order_across_three_processes(&url),
    );
    r.run(
        "a_crashed_set_waiter_holds_back_the_waiters_behind_it_briefly",
        limit,
        a_crashed_set_waiter_holds_back_the_waiters_behind_it_briefly(&url),
    );
    r.run(
        "crashed_process_with_1_waiter",
        limit,
        crashed_waiters(&url, 1),
    );
    r.run(
        "crashed_process_with_100_waiters",
        limit,
        crashed_waiters(&url, 100),
    );
    r.run("frozen_grantee", limit, frozen_grantee(&url));
    r.run(
        "a_frozen_set_waiter_on_a_cluster_holds_back_no_free_key",
        limit,
        a_frozen_set_waiter_on_a_cluster_holds_back_no_free_key(),
    );
    r.run(
        "a_waiter_taking_the_free_lock_chooses_the_watchers",
        limit,
        a_waiter_taking_the_free_lock_chooses_the_watchers(&url),
    );
    r.run(
        "a_record_in_redis_future_is_not_fresh",
        limit,
        a_record_in_redis_future_is_not_fresh(&url),
    );
    r.run(
        "a_wait_longer_than_the_retention_keeps_its_queue",
        limit,
        a_wait_longer_than_the_retention_keeps_its_queue(&url),
    );
    r.run(
        "frozen_right_before_its_grant",
        limit,
        frozen_right_before_its_grant(&url),
    );
    r.run(
        "frozen_processes_do_not_slow_the_live_one",
        limit,
        frozen_processes_do_not_slow_the_live_one(&url),
    );
    r.run(
        "others_do_not_jump_the_queue",
        limit,
        others_do_not_jump_the_queue(&url),
    );
    r.run("grant_race_hunt", limit, grant_race_hunt(&url));
    r.run(
        "cancelled_after_the_grant",
        limit,
        cancelled_after_the_grant(&url),
    );
    drop(server);
    r.finish("lock_queue_processes")
}
