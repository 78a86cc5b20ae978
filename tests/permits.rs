//! Permits (issue 22): the fair semaphore and the read-write lock against real `redis-server`s.
//!
//! - FIFO without barging: a head asking for 3 permits is not passed by later 1-permit
//!   waiters; one release grants to several waiters at once; readers at the head are granted
//!   together and a queued writer holds back later readers.
//! - The counting invariant ("never more than N weight held by guards whose validity has not
//!   passed", checked at every acquisition by the guards' own `valid_until`) and a fenced store
//!   under steady contention, connection kills and a kill -9 + restart of an AOF Redis.
//! - A crashed holder's permits come back when its lease ends; a frozen holder (its thread
//!   blocked) learns it lost them; release is idempotent; a cancellation sweep leaves nothing;
//!   bad input is a typed error that changes nothing.

mod common;

use common::{
    cmd, permit_key, permit_queue_key, permit_state_key, permits_queued, queued_locker, RedisServer,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{Error, LockGuard, LockOptions, Locker, MAX_PERMITS};

fn opts(ttl_ms: u64, wait_ms: u64) -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_millis(ttl_ms))
        .with_wait(Duration::from_millis(wait_ms))
}

/// ZRANGE's arguments for every member of `key` with its score.
fn zrange(key: &str) -> Vec<Value> {
    vec![key.into(), 0.into(), (-1).into(), "WITHSCORES".into()]
}

/// Guards whose validity has not passed, by token: (valid until, weight).
#[derive(Default)]
struct Ledger {
    live: Mutex<BTreeMap<String, (Instant, u32)>>,
    /// Every fence granted, with its weight (for the fenced-store rule).
    fences: Mutex<BTreeMap<u64, u32>>,
    max_seen: AtomicU64,
}

impl Ledger {
    /// Records a new guard; panics if the valid guards now weigh more than `n`.
    fn enter(&self, g: &LockGuard, weight: u32, n: u32) {
        let now = Instant::now();
        let mut live = self.live.lock().unwrap();
        live.retain(|_, (until, _)| *until > now);
        live.insert(g.token().to_owned(), (g.valid_until(), weight));
        let held: u32 = live.values().map(|(_, w)| w).sum();
        self.max_seen.fetch_max(u64::from(held), Ordering::SeqCst);
        assert!(
            held <= n,
            "{held} permits held by valid guards, more than {n}: {live:?}"
        );
    }

    fn leave(&self, g: &LockGuard) {
        self.live.lock().unwrap().remove(g.token());
    }

    /// Records a granted fence: each is new (fences are unique per key, across permits).
    fn fence(&self, fence: u64, weight: u32) {
        let old = self.fences.lock().unwrap().insert(fence, weight);
        assert!(old.is_none(), "fence {fence} given twice");
    }
}

/// Workers looping acquire_wait / hold a few ms / release on one key, each acquisition checked
/// by the ledger.
struct Contention {
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Contention {
    /// `procs` queued lockers × `per` workers on `key` of `n` permits; worker `t` of locker
    /// `p` asks for `weight(p, t)` with a lease of `ttl_ms`.
    async fn start(
        url: &str,
        key: &'static str,
        n: u32,
        procs: u32,
        per: u32,
        weight: fn(u32, u32) -> u32,
        ttl_ms: u64,
    ) -> Contention {
        let ledger = Arc::new(Ledger::default());
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for p in 0..procs {
            let sem = queued_locker(url).await.semaphore(n).unwrap();
            for t in 0..per {
                let (sem, ledger, stop, count) =
                    (sem.clone(), ledger.clone(), stop.clone(), count.clone());
                let weight = weight(p, t);
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        match sem.acquire_wait(key, weight, &opts(ttl_ms, 10_000)).await {
                            Ok(g) => {
                                ledger.enter(&g, weight, n);
                                ledger.fence(g.fence(), weight);
                                let hold = 1 + u64::from(t % 3);
                                tokio::time::sleep(Duration::from_millis(hold)).await;
                                ledger.leave(&g);
                                let _ = g.release().await;
                                count.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e)
                                if e.is_transient() || matches!(e, Error::WaitTimeout { .. }) => {}
                            Err(e) => panic!("unexpected {e}"),
                        }
                    }
                }));
            }
        }
        Contention {
            ledger,
            stop,
            count,
            tasks,
        }
    }

    /// Stops the workers; the acquisitions and the ledger.
    async fn stop(self) -> (u64, Arc<Ledger>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("worker");
        }
        (self.count.load(Ordering::SeqCst), self.ledger)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_head_is_not_passed_and_one_release_grants_several() {
    let server = RedisServer::start();
    let (a, b) = (
        queued_locker(&server.url()).await,
        queued_locker(&server.url()).await,
    );
    let sa = a.semaphore(3).unwrap();
    let sb = b.semaphore(3).unwrap();
    let key = "fifo";
    let first = sa
        .acquire(key, 1, &opts(10_000, 0))
        .await
        .expect("one permit");
    // The heavy waiter queues first; then two light ones that would fit beside the holder.
    let heavy = tokio::spawn({
        let sb = sb.clone();
        async move { sb.acquire_wait(key, 3, &opts(10_000, 20_000)).await }
    });
    permits_queued(&sa, key, 1).await.expect("queued");
    let order = Arc::new(Mutex::new(Vec::new()));
    // Queued in the order 1, 2: granted in that order (by one release, so their fences say it).
    let mut light = Vec::new();
    for (i, sem) in [(1, sa.clone()), (2, sb.clone())] {
        let order = order.clone();
        light.push(tokio::spawn(async move {
            let g = sem.acquire_wait(key, 1, &opts(10_000, 20_000)).await?;
            order.lock().unwrap().push(i);
            Ok::<_, Error>(g)
        }));
        permits_queued(&sa, key, 1 + i as usize)
            .await
            .expect("queued");
    }
    // A one-shot attempt does not jump the queue either, though a permit would fit.
    assert!(matches!(
        sa.acquire(key, 1, &opts(10_000, 0)).await,
        Err(Error::Locked { .. })
    ));
    assert!(order.lock().unwrap().is_empty(), "a light waiter barged");
    first.release().await.expect("release");
    let heavy = heavy.await.unwrap().expect("the heavy head is granted");
    let st = sa.status(key).await.unwrap();
    assert_eq!((st.held, st.holders, st.queued), (3, 1, 2), "{st:?}");
    assert!(order.lock().unwrap().is_empty(), "a light waiter barged");
    // One release, two grants.
    heavy.release().await.expect("release heavy");
    let mut guards = Vec::new();
    for l in light {
        guards.push(l.await.unwrap().expect("light granted"));
    }
    assert_eq!(order.lock().unwrap().len(), 2);
    assert!(
        guards[0].fence() < guards[1].fence(),
        "FIFO: granted out of order"
    );
    let st = sa.status(key).await.unwrap();
    assert_eq!((st.held, st.holders, st.queued), (2, 2, 0), "{st:?}");
    for g in guards {
        g.release().await.unwrap();
    }
    let st = sa.status(key).await.unwrap();
    assert_eq!((st.held, st.holders, st.queued), (0, 0, 0), "{st:?}");
}

/// Steady contention: 3 permits, 4 queued lockers (4 processes as Redis sees them) × 6 tasks
/// with weights 1 and 2, connections killed every 300 ms (subscribers every 600 ms). Every
/// acquisition checks the valid
/// guards' weight and that its fence is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_more_than_n_under_contention_and_connection_kills() {
    let server = RedisServer::start();
    let n = 3;
    let run = Contention::start(&server.url(), "hot", n, 4, 6, |p, t| 1 + (t + p) % 2, 2_000).await;
    let admin = server.client().await;
    for i in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        // The command connections, and every other time the subscribers (the waiters then
        // subscribe again, and look: grants sent meanwhile are not lost).
        let _: Value = cmd(&admin, "CLIENT KILL TYPE normal SKIPME yes", vec![]).await;
        if i % 2 == 1 {
            let _: Value = cmd(&admin, "CLIENT KILL TYPE pubsub", vec![]).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (done, ledger) = run.stop().await;
    let max = ledger.max_seen.load(Ordering::SeqCst);
    println!("{done} acquisitions, up to {max} permits held at once");
    assert!(done >= 100, "only {done} acquisitions in 3.3 s");
    assert_eq!(max, u64::from(n), "the permits were never all in use");
}

/// A crashed holder (its guard forgotten, its connection closed: no release, no refresh):
/// the waiter gets the permits when the lease ends, from a watcher's look, never later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permits_come_back_at_lease_end() {
    let server = RedisServer::start();
    let crashed = Locker::connect(&server.url())
        .await
        .unwrap()
        .build()
        .unwrap();
    let sem = crashed.semaphore(2).unwrap();
    // Before the take is sent: the lease starts after this, so it cannot end sooner than a
    // lease from here (less the millisecond the scripts' clock rounds down).
    let taken = Instant::now();
    let g = sem
        .acquire("crash", 2, &opts(1_000, 0))
        .await
        .expect("take both");
    std::mem::forget(g);
    crashed.client().quit().await.unwrap();
    let waiter = queued_locker(&server.url()).await.semaphore(2).unwrap();
    let got = waiter
        .acquire_wait("crash", 1, &opts(5_000, 10_000))
        .await
        .expect("granted after the lease");
    let after = taken.elapsed();
    println!("permits back {after:?} after the take (lease 1 s)");
    assert!(
        after >= Duration::from_millis(998),
        "{after:?}: before the lease ended"
    );
    // The watcher looks when the lease ends: a loose bound, for a busy machine.
    assert!(
        after < Duration::from_millis(3_000),
        "{after:?}: long after the lease ended"
    );
    got.release().await.unwrap();
}

/// A frozen holder (its runtime's only thread blocked past its lease): the waiter gets the
/// permit after the lease, and the holder, when it runs again, knows it lost it (its
/// validity ended before the waiter's began).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_loses_its_permit_and_knows() {
    let server = RedisServer::start();
    let url = server.url();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let frozen = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let locker = queued_locker(&url).await;
            let sem = locker.semaphore(1).unwrap();
            let mut g = sem.acquire("frozen", 1, &opts(600, 0)).await.unwrap();
            let lost = g.keep_alive();
            let until = g.valid_until();
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(1_500)); // frozen: no refresh runs
            tokio::time::timeout(Duration::from_secs(5), lost.cancelled())
                .await
                .expect("the holder learns it lost the permit");
            (until, g.loss())
        })
    });
    rx.await.unwrap();
    let sem = queued_locker(&server.url()).await.semaphore(1).unwrap();
    let g = sem
        .acquire_wait("frozen", 1, &opts(5_000, 10_000))
        .await
        .expect("granted");
    let got_at = Instant::now();
    let (until, loss) = frozen.join().unwrap();
    assert!(
        until <= got_at,
        "the frozen holder's validity outlived the new grant"
    );
    assert!(loss.is_some(), "no loss reason");
    g.release().await.unwrap();
}

/// Release is idempotent: a repeated release of a token frees nothing of anyone else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_release_frees_nothing_else() {
    let server = RedisServer::start();
    let locker = queued_locker(&server.url()).await;
    let sem = locker.semaphore(2).unwrap();
    let a = sem.acquire("rel", 1, &opts(10_000, 0)).await.unwrap();
    let b = sem.acquire("rel", 1, &opts(10_000, 0)).await.unwrap();
    let token = a.token().to_owned();
    a.release().await.unwrap();
    let raw = common::scripts::Raw::new(&server, "rel", "ffff", 3_600_000, 2).await;
    for _ in 0..3 {
        let r = raw
            .eval(waitlock::scripts::PERMIT_RELEASE, &token, 1, "", "", "")
            .await;
        assert_eq!(r, vec![0], "a repeated release");
    }
    let st = sem.status("rel").await.unwrap();
    assert_eq!((st.held, st.holders), (1, 1), "{st:?}");
    assert!(
        sem.acquire("rel", 2, &opts(10_000, 0)).await.is_err(),
        "b's permit was freed"
    );
    b.release().await.unwrap();
}

/// 0 permits, a weight above the permits, a fixed token and another number of permits on a
/// key in use: typed errors, nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error_and_changes_nothing() {
    let server = RedisServer::start();
    let locker = queued_locker(&server.url()).await;
    assert!(matches!(
        locker.semaphore(0),
        Err(Error::InvalidSetting {
            field: "permits",
            ..
        })
    ));
    assert!(locker.semaphore(MAX_PERMITS + 1).is_err());
    let sem = locker.semaphore(3).unwrap();
    for w in [0, 4] {
        assert!(matches!(
            sem.acquire_wait("bad", w, &opts(1_000, 100)).await,
            Err(Error::InvalidOptions {
                field: "permits",
                ..
            })
        ));
    }
    assert!(matches!(
        sem.acquire("bad", 1, &LockOptions::new().with_token("mine"))
            .await,
        Err(Error::InvalidOptions { field: "token", .. })
    ));
    let admin = server.client().await;
    assert_eq!(
        common::lock_names(&admin).await,
        Vec::<String>::new(),
        "bad input wrote something"
    );
    let held = sem.acquire("bad", 2, &opts(10_000, 0)).await.unwrap();
    let before: Vec<Value> = cmd(&admin, "ZRANGE", zrange(&permit_key("bad"))).await;
    let state: Value = cmd(&admin, "GET", vec![permit_state_key("bad").into()]).await;
    let other = locker.semaphore(4).unwrap();
    match other.acquire_wait("bad", 1, &opts(1_000, 500)).await {
        Err(Error::PermitsMismatch {
            key,
            asked: 4,
            current: 3,
        }) => assert_eq!(key, "bad"),
        other => panic!("expected PermitsMismatch, got {other:?}"),
    }
    let after: Vec<Value> = cmd(&admin, "ZRANGE", zrange(&permit_key("bad"))).await;
    assert_eq!(before, after);
    assert_eq!(
        state,
        cmd::<Value>(&admin, "GET", vec![permit_state_key("bad").into()]).await
    );
    held.release().await.unwrap();
    // Nobody holds or waits: the key may have another number of permits now.
    let g = other
        .acquire("bad", 4, &opts(10_000, 0))
        .await
        .expect("4 permits now");
    g.release().await.unwrap();
}

/// Readers at the head are granted together; a queued writer holds back later readers; the
/// writer is granted when the readers before it are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_lock_is_fifo_and_batches_readers() {
    let server = RedisServer::start();
    let (a, b) = (
        queued_locker(&server.url()).await,
        queued_locker(&server.url()).await,
    );
    let (ra, rb) = (a.rw_lock(), b.rw_lock());
    let key = "doc";
    // A read-write lock's keys are those of a semaphore of MAX_PERMITS.
    let probe = a.semaphore(MAX_PERMITS).unwrap();
    let r1 = ra.read(key, &opts(10_000, 0)).await.expect("first reader");
    let r2 = rb.read(key, &opts(10_000, 0)).await.expect("readers share");
    let writer = tokio::spawn({
        let rb = rb.clone();
        async move { rb.write_wait(key, &opts(10_000, 20_000)).await }
    });
    permits_queued(&probe, key, 1).await.expect("queued");
    let mut late = Vec::new();
    for (i, rw) in [ra.clone(), rb.clone(), ra.clone()].into_iter().enumerate() {
        late.push(tokio::spawn(async move {
            rw.read_wait(key, &opts(10_000, 20_000)).await
        }));
        permits_queued(&probe, key, 2 + i).await.expect("queued");
    }
    assert!(matches!(
        ra.read(key, &opts(10_000, 0)).await,
        Err(Error::Locked { .. })
    ));
    r1.release().await.unwrap();
    let st = ra.status(key).await.unwrap();
    assert_eq!(
        (st.holders, st.queued),
        (1, 4),
        "the writer is not granted before both readers left"
    );
    r2.release().await.unwrap();
    let w = writer.await.unwrap().expect("writer granted");
    let st = ra.status(key).await.unwrap();
    assert_eq!(
        (st.held, st.holders, st.queued),
        (MAX_PERMITS, 1, 3),
        "{st:?}"
    );
    w.release().await.unwrap();
    let mut readers = Vec::new();
    for l in late {
        readers.push(l.await.unwrap().expect("late readers granted together"));
    }
    let st = ra.status(key).await.unwrap();
    assert_eq!((st.held, st.holders, st.queued), (3, 3, 0), "{st:?}");
    for r in readers {
        r.release().await.unwrap();
    }
}

/// 90% readers: writers still make progress, and no reader is valid while a writer is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rw_lock_writers_progress_among_readers() {
    let server = RedisServer::start();
    let ledger = Arc::new(Ledger::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let rw = queued_locker(&server.url()).await.rw_lock();
        for t in 0..10u32 {
            let (rw, ledger, stop, writes, reads) = (
                rw.clone(),
                ledger.clone(),
                stop.clone(),
                writes.clone(),
                reads.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut i = t;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let write = i % 10 == 0;
                    let o = opts(2_000, 10_000);
                    let got = if write {
                        rw.write_wait("rw", &o).await
                    } else {
                        rw.read_wait("rw", &o).await
                    };
                    let g = got.expect("acquired");
                    let weight = if write { MAX_PERMITS } else { 1 };
                    ledger.enter(&g, weight, MAX_PERMITS);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    ledger.leave(&g);
                    g.release().await.unwrap();
                    if write { &writes } else { &reads }.fetch_add(1, Ordering::SeqCst);
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("task");
    }
    let (w, r) = (writes.load(Ordering::SeqCst), reads.load(Ordering::SeqCst));
    println!("{w} writes, {r} reads in 3 s");
    assert!(w >= 10, "writers starved: {w} writes, {r} reads");
    assert!(r >= 5 * w, "{r} reads against {w} writes");
}

/// Waiters cancelled at random moments (queued, granted but unread, holding): afterwards the
/// key is empty but for its state, and all permits can be taken at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_sweep_leaves_nothing() {
    let server = RedisServer::start();
    let lockers = [
        queued_locker(&server.url()).await,
        queued_locker(&server.url()).await,
    ];
    let sems: Vec<_> = lockers.iter().map(|l| l.semaphore(3).unwrap()).collect();
    let mut seed = common::Seeded::new(common::now_ns());
    let holder = sems[0].acquire("sweep", 3, &opts(10_000, 0)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let sem = sems[i % 2].clone();
        let cancel_after = seed.below(Duration::from_millis(400));
        let weight = 1 + (i as u32 % 3);
        tasks.push(tokio::spawn(async move {
            let _ = tokio::time::timeout(cancel_after, async {
                let g = sem
                    .acquire_wait("sweep", weight, &opts(10_000, 20_000))
                    .await;
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(g);
            })
            .await;
        }));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    holder.release().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    for l in &lockers {
        l.idle().await;
    }
    let start = Instant::now();
    loop {
        let st = sems[0].status("sweep").await.unwrap();
        if st.holders == 0 && st.queued == 0 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "residue: {st:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let admin = server.client().await;
    let keys = common::lock_names(&admin).await;
    assert_eq!(keys, vec![permit_state_key("sweep")], "left behind");
    let g = sems[1]
        .acquire("sweep", 3, &opts(10_000, 0))
        .await
        .expect("all permits free");
    g.release().await.unwrap();
}

/// A Redis that is killed (-9) and restarted from its append-only file in the middle of
/// steady contention: the counting invariant holds across it and fences keep growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_and_fences_hold_across_a_redis_restart() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let n = 2;
    let run = Contention::start(&server.url(), "aof", n, 2, 4, |_, _| 1, 1_000).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let before = run.count.load(Ordering::SeqCst);
    let last_fence = run
        .ledger
        .fences
        .lock()
        .unwrap()
        .keys()
        .next_back()
        .copied();
    server.kill();
    server.restart();
    let start = Instant::now();
    while run.count.load(Ordering::SeqCst) < before + 50 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no progress after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (done, ledger) = run.stop().await;
    println!("{before} acquisitions before the restart, {done} in all");
    // Fences keep growing across the restart: every acquisition after it (the 50 counted)
    // has a fence above every one before.
    let fences = ledger.fences.lock().unwrap();
    let last = last_fence.expect("acquisitions before the restart");
    assert!(
        fences.range(last + 1..).count() >= 50,
        "fences did not grow past {last}"
    );
}

/// A polling locker's semaphore: the same counting, without a queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_semaphore_counts_too() {
    let server = RedisServer::start();
    let locker = Locker::connect(&server.url())
        .await
        .unwrap()
        .build()
        .unwrap();
    let sem = locker.semaphore(2).unwrap();
    let ledger = Arc::new(Ledger::default());
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (sem, ledger) = (sem.clone(), ledger.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let o = common::tight()
                    .with_ttl(Duration::from_secs(2))
                    .with_wait(Duration::from_secs(20));
                let g = sem.acquire_wait("poll", 1, &o).await.expect("acquired");
                ledger.enter(&g, 1, 2);
                tokio::time::sleep(Duration::from_millis(2)).await;
                ledger.leave(&g);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(ledger.max_seen.load(Ordering::SeqCst), 2);
}

/// A wait timeout behaves as the lock's: `WaitTimeout` at the deadline (not long after), and
/// the waiter's queue entry is gone afterwards, so the next release has nobody to skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_timeout_ends_at_the_deadline_and_leaves_the_queue() {
    let server = RedisServer::start();
    let (a, b) = (
        queued_locker(&server.url()).await,
        queued_locker(&server.url()).await,
    );
    let (sa, sb) = (a.semaphore(2).unwrap(), b.semaphore(2).unwrap());
    let held = sa.acquire("timeout", 2, &opts(10_000, 0)).await.unwrap();
    let start = Instant::now();
    match sb.acquire_wait("timeout", 1, &opts(10_000, 300)).await {
        Err(Error::WaitTimeout { key, .. }) => assert_eq!(key, "timeout"),
        other => panic!("expected WaitTimeout, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(
        took < Duration::from_millis(1_300),
        "{took:?}: long past the deadline"
    );
    b.idle().await;
    assert_eq!(
        sa.status("timeout").await.unwrap().queued,
        0,
        "entry left behind"
    );
    held.release().await.unwrap();
    let st = sa.status("timeout").await.unwrap();
    assert_eq!((st.held, st.holders, st.queued), (0, 0, 0), "{st:?}");
}

/// The number of permits is fixed while anyone holds or waits, but waiters of processes that
/// are gone (nobody listens on their grant channel) do not pin it: a semaphore with another
/// number drops them and takes the key. A live waiter does pin it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiters_do_not_pin_the_number_of_permits() {
    let server = RedisServer::start();
    let locker = queued_locker(&server.url()).await;
    let three = locker.semaphore(3).unwrap();
    three
        .acquire("pin", 3, &opts(10_000, 0))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A waiter of a process that died after that release: queued, nobody listens for it.
    let admin = server.client().await;
    let _: Value = cmd(
        &admin,
        "ZADD",
        vec![
            permit_queue_key("pin").into(),
            "1".into(),
            "0123456789ab 10000 w1:0123456789ab/x".into(),
        ],
    )
    .await;
    let four = locker.semaphore(4).unwrap();
    let g4 = four
        .acquire("pin", 4, &opts(10_000, 0))
        .await
        .expect("the dead waiter does not pin 3 permits");
    // Now a live waiter of 4 permits: a semaphore of 3 is refused while it waits.
    let waiter = tokio::spawn({
        let four = four.clone();
        async move { four.acquire_wait("pin", 1, &opts(10_000, 20_000)).await }
    });
    permits_queued(&four, "pin", 1).await.expect("queued");
    assert!(matches!(
        three.acquire("pin", 1, &opts(10_000, 0)).await,
        Err(Error::PermitsMismatch {
            asked: 3,
            current: 4,
            ..
        })
    ));
    g4.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

/// Review 2, finding 5. A permit lease is a Redis time in the holders' sorted set, and that
/// set moves verbatim with a slot (MIGRATE) while its TTL moves as the time left. On a node
/// whose clock runs 1.5 s ahead (simulated here: the same leases written 1.5 s behind this
/// node's clock, the key's TTL unchanged, which is what such a node sees after a MIGRATE) the
/// leases must keep their length: no second holder of a 1-permit semaphore while the first
/// guard is valid. (Before, the leases ended 1.5 s early there: two valid holders.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_lease_keeps_its_length_on_a_node_whose_clock_is_ahead() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let a = Locker::new(server.client().await).semaphore(1).expect("a");
    let b = Locker::new(server.client().await).semaphore(1).expect("b");
    let ga = a
        .acquire("moved", 1, &opts(2000, 0))
        .await
        .expect("a holds");
    let holders = permit_key("moved");
    let holders = holders.as_str();
    let before: i64 = cmd(&admin, "PTTL", vec![holders.into()]).await;
    let leases: Vec<String> = cmd(
        &admin,
        "ZRANGE",
        vec![holders.into(), 0.into(), (-1).into(), "WITHSCORES".into()],
    )
    .await;
    for pair in leases.chunks(2) {
        let score: f64 = pair[1].parse().expect("score");
        let _: i64 = cmd(
            &admin,
            "ZADD",
            vec![
                holders.into(),
                "XX".into(),
                (score - 1500.0).to_string().into(),
                pair[0].clone().into(),
            ],
        )
        .await;
    }
    let after: i64 = cmd(&admin, "PTTL", vec![holders.into()]).await;
    assert!(
        after <= before && after > 0,
        "the key's TTL moved: {before} -> {after}"
    );
    let gb = common::take_over_permit(&b, "moved", &opts(2000, 0), &ga).await;
    gb.release().await.expect("b releases");
}
