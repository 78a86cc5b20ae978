//! Several keys at once (`acquire_many`, `acquire_many_wait`, `run_many`) on both strategies,
//! against a real private redis-server: the ordered path (a queued locker's wait, with the
//! opt-in) and the atomic one (one node: every key in one script, or none; a polling
//! locker's wait, and any one attempt).

mod common;

use common::{lock_key, tight, RedisServer, Seeded};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::strategy::Strategy;
use waitlock::{Error, LockGuard, LockOptions, LockSetGuard, Locker, Queue};

fn set_opts() -> LockOptions {
    tight().with_ordered_sets()
}

/// Nothing of `keys` is held or queued once `locker`'s background work is done.
async fn nothing_left<S: Strategy>(locker: &Locker<S>, keys: &[&str]) {
    locker.idle().await;
    for key in keys {
        let status = locker.status(key).await.expect("status");
        assert!(!status.held, "{key} is still held: {status:?}");
        assert_eq!(status.queued, 0, "{key} still has waiters: {status:?}");
    }
}

/// Who holds each key, as the workers see it: a flag and the last fence.
#[derive(Default)]
struct Book(Mutex<HashMap<String, (bool, u64)>>);

impl Book {
    fn enter(&self, set: &waitlock::LockSetGuard) {
        let mut book = self.0.lock().unwrap();
        for guard in set.guards() {
            let entry = book.entry(guard.key().to_owned()).or_default();
            assert!(!entry.0, "two valid holders of {}", guard.key());
            assert!(
                guard.fence() > entry.1,
                "{}: fence {} after {}",
                guard.key(),
                guard.fence(),
                entry.1
            );
            *entry = (true, guard.fence());
        }
    }

    fn leave(&self, set: &waitlock::LockSetGuard) {
        let mut book = self.0.lock().unwrap();
        for key in set.keys() {
            book.get_mut(key).expect("entered").0 = false;
        }
    }
}

/// 64 workers over 4 lockers (4 processes' worth: each its own connection and, for queued
/// lockers, its own subscriber and process id) take random sets of 2-4 of 8 keys, in any
/// order the caller likes (A,B against B,A included): every acquisition completes well
/// before its deadline (no deadlock), no key ever has two holders, each key's fences grow.
async fn overlapping_sets_never_deadlock<S>(lockers: Vec<Locker<S>>, opts: LockOptions)
where
    S: Strategy + Clone + Send + Sync + 'static,
{
    const KEYS: [&str; 8] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    let book = Arc::new(Book::default());
    let opts = opts
        .with_wait(Duration::from_secs(120))
        .with_ttl(Duration::from_secs(10));
    let mut tasks = Vec::new();
    for w in 0..64u64 {
        let locker = lockers[w as usize % lockers.len()].clone();
        let (book, opts) = (book.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Seeded::new(0x9e37_79b9_7f4a_7c15 ^ (w + 1));
            for _ in 0..6 {
                let size = 2 + rng.below(Duration::from_nanos(3)).as_nanos() as usize;
                let mut keys: Vec<&str> = Vec::new();
                while keys.len() < size {
                    let k = KEYS[rng.below(Duration::from_nanos(8)).as_nanos() as usize];
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
                let set = locker
                    .acquire_many_wait(&keys, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("worker {w}, set {keys:?}: {e}"));
                book.enter(&set);
                assert!(set.loss().is_none());
                tokio::time::sleep(Duration::from_micros(500)).await;
                book.leave(&set);
                set.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    nothing_left(&lockers[0], &KEYS).await;
}

/// A set whose middle key is held: the call waits for it holding the first, and a timeout
/// releases that first key before it returns, and leaves no waiter queued.
async fn a_timeout_leaves_nothing_held_or_queued<S: Strategy>(locker: Locker<S>, other: Locker) {
    let blocker = other
        .acquire("t-b", &LockOptions::new())
        .await
        .expect("hold t-b");
    let opts = set_opts().with_wait(Duration::from_millis(300));
    let started = Instant::now();
    match locker
        .acquire_many_wait(&["t-c", "t-b", "t-a"], &opts)
        .await
    {
        Err(Error::WaitTimeout { key, waited, .. }) => {
            assert_eq!(key, "t-b");
            assert!(waited >= Duration::from_millis(300), "{waited:?}");
        }
        other => panic!("expected a wait timeout on t-b, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Released before the call returned, not later.
    assert!(!locker.status("t-a").await.expect("status").held);
    nothing_left(&locker, &["t-a", "t-c"]).await;
    assert_eq!(locker.status("t-b").await.expect("status").queued, 0);
    blocker.release().await.expect("release");
    // One attempt each: Locked names the held key, and the key taken before it is free.
    let blocker = other
        .acquire("t-b", &LockOptions::new())
        .await
        .expect("hold t-b");
    match locker.acquire_many(&["t-a", "t-b"], &set_opts()).await {
        Err(Error::Locked { key, .. }) => assert_eq!(key, "t-b"),
        other => panic!("expected Locked on t-b, got {other:?}"),
    }
    assert!(!locker.status("t-a").await.expect("status").held);
    blocker.release().await.expect("release");
    nothing_left(&locker, &["t-a", "t-b", "t-c"]).await;
}

/// A set dropped at a random instant of its wait (before, while, or after it takes the first
/// key, while it waits for the held one) leaves nothing held or queued; then it is taken.
async fn a_cancellation_at_any_await_leaves_nothing<S: Strategy>(locker: Locker<S>, other: Locker) {
    let keys = ["c-a", "c-b", "c-c"];
    let mut rng = Seeded::new(0x51_7cc1_b727_220a);
    let opts = set_opts().with_wait(Duration::from_secs(30));
    for _ in 0..40 {
        let blocker = other
            .acquire("c-b", &LockOptions::new())
            .await
            .expect("hold c-b");
        let after = rng.below(Duration::from_millis(15));
        let dropped = tokio::time::timeout(after, locker.acquire_many_wait(&keys, &opts)).await;
        assert!(dropped.is_err(), "c-b is held: the set cannot be taken");
        blocker.release().await.expect("release");
        nothing_left(&locker, &keys).await;
    }
    let set = locker
        .acquire_many_wait(&keys, &opts)
        .await
        .expect("the set, once free");
    assert_eq!(set.keys().collect::<Vec<_>>().len(), 3);
    set.release().await.expect("release");
    nothing_left(&locker, &keys).await;
}

/// A set one of whose keys a crashed process holds (its lock left to its TTL) is granted when
/// that lease ends, and holds the key before it meanwhile.
async fn a_crashed_holders_key_is_granted_when_its_lease_ends<S: Strategy>(
    locker: Locker<S>,
    other: Locker,
) {
    other
        .try_lock("x-b", "crashed", Duration::from_millis(400))
        .await
        .expect("the crashed holder's lock");
    let started = Instant::now();
    let set = locker
        .acquire_many_wait(
            &["x-a", "x-b"],
            &set_opts().with_wait(Duration::from_secs(30)),
        )
        .await
        .expect("granted after the lease");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "x-b was held for 400 ms, taken after {:?}",
        started.elapsed()
    );
    assert!(set.fence("x-a").is_some() && set.fence("x-b").is_some());
    set.release().await.expect("release");
    nothing_left(&locker, &["x-a", "x-b"]).await;
}

/// A key lost while the set is held (deleted by hand) cancels the set's one loss token, and
/// `run_many` ends with `Expired` naming it.
async fn any_key_lost_cancels_the_set<S: Strategy>(
    locker: Locker<S>,
    admin: fred::clients::Client,
) {
    let opts = set_opts().with_ttl(Duration::from_millis(400));
    let ended = locker
        .run_many(&["l-a", "l-b", "l-c"], &opts, |ctx| {
            let admin = admin.clone();
            async move {
                assert_eq!(ctx.fences.len(), 3);
                assert!(ctx.fence("l-b").is_some());
                let _: i64 = common::cmd(&admin, "DEL", vec![lock_key("l-b").into()]).await;
                tokio::time::timeout(Duration::from_secs(30), ctx.lost.cancelled())
                    .await
                    .expect("the refresh finds l-b gone and cancels the set's token");
                Ok::<_, Error>(())
            }
        })
        .await;
    match ended {
        Err(Error::Expired { key, .. }) => assert_eq!(key, "l-b"),
        other => panic!("expected Expired on l-b, got {other:?}"),
    }
    nothing_left(&locker, &["l-a", "l-b", "l-c"]).await;
}

/// A thousand keys in one hash slot: taken, held, released, nothing left.
async fn a_thousand_keys_in_one_slot<S: Strategy>(locker: Locker<S>) {
    let keys: Vec<String> = (0..1000).map(|i| format!("{{acct}}:{i}")).collect();
    let set = locker
        .acquire_many_wait(&keys, &set_opts())
        .await
        .expect("a thousand free keys");
    assert_eq!(set.guards().len(), 1000);
    let slot = fred::util::redis_keyslot(lock_key(&keys[0]).as_bytes());
    assert!(keys
        .iter()
        .all(|k| fred::util::redis_keyslot(lock_key(k).as_bytes()) == slot));
    set.release().await.expect("release");
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    nothing_left(&locker, &refs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_overlapping_sets_never_deadlock() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(common::queued_locker(&server.url()).await);
    }
    overlapping_sets_never_deadlock(lockers, set_opts()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_overlapping_sets_never_deadlock() {
    let server = RedisServer::start();
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(Locker::new(server.client().await));
    }
    // (No opt-in: on one node a polling locker takes each set at once.)
    overlapping_sets_never_deadlock(lockers, tight()).await;
}

#[tokio::test]
async fn a_timeout_leaves_nothing_on_both_strategies() {
    let server = RedisServer::start();
    let other = Locker::new(server.client().await);
    a_timeout_leaves_nothing_held_or_queued(
        common::queued_locker(&server.url()).await,
        other.clone(),
    )
    .await;
    a_timeout_leaves_nothing_held_or_queued(Locker::new(server.client().await), other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancellation_leaves_nothing_on_both_strategies() {
    let server = RedisServer::start();
    let other = Locker::new(server.client().await);
    a_cancellation_at_any_await_leaves_nothing(
        common::queued_locker(&server.url()).await,
        other.clone(),
    )
    .await;
    a_cancellation_at_any_await_leaves_nothing(Locker::new(server.client().await), other).await;
}

#[tokio::test]
async fn a_crashed_holders_key_is_granted_on_both_strategies() {
    let server = RedisServer::start();
    let other = Locker::new(server.client().await);
    a_crashed_holders_key_is_granted_when_its_lease_ends(
        common::queued_locker(&server.url()).await,
        other.clone(),
    )
    .await;
    a_crashed_holders_key_is_granted_when_its_lease_ends(Locker::new(server.client().await), other)
        .await;
}

#[tokio::test]
async fn any_key_lost_cancels_the_set_on_both_strategies() {
    let server = RedisServer::start();
    let admin = server.client().await;
    any_key_lost_cancels_the_set(common::queued_locker(&server.url()).await, admin.clone()).await;
    any_key_lost_cancels_the_set(Locker::new(server.client().await), admin).await;
}

#[tokio::test]
async fn a_thousand_keys_in_one_slot_on_both_strategies() {
    let server = RedisServer::start();
    a_thousand_keys_in_one_slot(common::queued_locker(&server.url()).await).await;
    a_thousand_keys_in_one_slot(Locker::new(server.client().await)).await;
}

/// A set that can only be taken in order needs the opt-in (nothing is sent without it); a
/// set needs at least one key and at most `MAX_SET_KEYS`; duplicates are merged; the order
/// given does not matter.
#[tokio::test]
async fn sets_are_checked_and_merged() {
    let server = RedisServer::start();
    let locker = Locker::new(server.client().await);
    let queued = common::queued_locker(&server.url()).await;
    // A queued locker waits for up to 64 keys of one node at once (no opt-in); more only in
    // order.
    let many: Vec<String> = (0..65).map(|i| format!("m-{i}")).collect();
    match queued.acquire_many_wait(&many, &tight()).await {
        Err(Error::InvalidOptions { field, value, .. }) => {
            assert_eq!(field, "ordered_sets");
            assert!(value.contains("hash slots"), "{value}");
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(!locker.status("m-0").await.expect("status").held);
    let set = queued
        .acquire_many_wait(&["m-a", "m-b"], &tight())
        .await
        .expect("at once, no opt-in");
    set.release().await.expect("release");
    let none: [&str; 0] = [];
    assert!(matches!(
        locker.acquire_many(&none, &set_opts()).await,
        Err(Error::InvalidOptions { field: "keys", .. })
    ));
    let too_many: Vec<String> = (0..=waitlock::MAX_SET_KEYS)
        .map(|i| format!("m{i}"))
        .collect();
    assert!(matches!(
        locker.acquire_many(&too_many, &set_opts()).await,
        Err(Error::InvalidOptions { field: "keys", .. })
    ));
    assert!(matches!(
        locker.acquire_many(&["m-a", ""], &set_opts()).await,
        Err(Error::InvalidKey { .. })
    ));
    // A wait too long to form a deadline, and a fixed token, are refused, not a panic.
    assert!(matches!(
        locker
            .acquire_many_wait(&["m-a", "m-b"], &set_opts().with_wait(Duration::MAX))
            .await,
        Err(Error::InvalidOptions { field: "wait", .. })
    ));
    assert!(matches!(
        locker
            .acquire_many(&["m-a", "m-b"], &set_opts().with_token("mine"))
            .await,
        Err(Error::InvalidOptions { field: "token", .. })
    ));
    let set = locker
        .acquire_many(&["m-b", "m-a", "m-b"], &set_opts())
        .await
        .expect("merged");
    let keys: Vec<&str> = set.keys().collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, ["m-a", "m-b"]);
    set.release().await.expect("release");
    nothing_left(&locker, &["m-a", "m-b"]).await;
}

/// A queued locker's set on one node waits at once, holding nothing: with refresh off, a
/// wait longer than the TTL is only a wait; every key is granted in one step when the held
/// one is released.
#[tokio::test]
async fn a_queued_set_waits_holding_nothing() {
    let server = RedisServer::start();
    let locker = common::queued_locker(&server.url()).await;
    let other = Locker::new(server.client().await);
    let blocker = other
        .acquire("h-b", &LockOptions::new())
        .await
        .expect("hold h-b");
    let opts = tight()
        .without_refresh()
        .with_ttl(Duration::from_millis(300))
        .with_wait(Duration::from_secs(60));
    let waiting = tokio::spawn({
        let locker = locker.clone();
        async move { locker.acquire_many_wait(&["h-a", "h-b"], &opts).await }
    });
    // Queued in both keys' queues, holding neither, for longer than its TTL.
    common::lock_queued(&other, "h-a", 1)
        .await
        .expect("queued on h-a");
    common::lock_queued(&other, "h-b", 1)
        .await
        .expect("queued on h-b");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!other.status("h-a").await.expect("status").held);
    assert!(!waiting.is_finished());
    blocker.release().await.expect("release");
    let set = waiting.await.expect("task").expect("granted at once");
    assert!(set.fence("h-a").is_some() && set.fence("h-b").is_some());
    assert!(set.loss().is_none());
    set.release().await.expect("release");
    nothing_left(&locker, &["h-a", "h-b"]).await;
}

/// Whenever it is looked at, each of `keys` is free while a set waits: taken and given back by
/// `other`, `looks` times at least, over `span` at least (5 ms apart).
async fn stay_free(other: &Locker, keys: &[&str], looks: usize, span: Duration) {
    let started = Instant::now();
    let mut n = 0;
    while n < looks || started.elapsed() < span {
        for key in keys {
            let g = other
                .acquire(key, &LockOptions::new())
                .await
                .unwrap_or_else(|e| panic!("{key} is held while the set waits: {e}"));
            g.release().await.expect("release");
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A polling locker's set on one node waits holding nothing (no opt-in): while one key is
/// held, its other keys stay free for anyone, and with refresh off a wait longer than the
/// TTL is only a wait; it is taken, every key at once, when the held key is released.
#[tokio::test]
async fn a_polling_set_waits_holding_nothing() {
    let server = RedisServer::start();
    let locker = Locker::new(server.client().await);
    let other = Locker::new(server.client().await);
    let blocker = other
        .acquire("w-b", &LockOptions::new())
        .await
        .expect("hold w-b");
    let opts = tight()
        .without_refresh()
        .with_ttl(Duration::from_millis(300))
        .with_wait(Duration::from_secs(60));
    let waiting = {
        let locker = locker.clone();
        tokio::spawn(async move {
            locker
                .acquire_many_wait(&["w-a", "w-b", "w-c"], &opts)
                .await
        })
    };
    // Over the set's attempts (its backoff is a few ms).
    stay_free(&other, &["w-a", "w-c"], 40, Duration::from_millis(400)).await;
    assert!(!waiting.is_finished(), "w-b is still held");
    blocker.release().await.expect("release w-b");
    let set = waiting
        .await
        .expect("task")
        .expect("the set, once w-b is free");
    assert_eq!(set.keys().count(), 3);
    set.release().await.expect("release");
    nothing_left(&locker, &["w-a", "w-b", "w-c"]).await;
}

/// A set taken at once never jumps a key's queue: a key with a queued waiter goes to that
/// waiter first (the release hands it over), and the polling set takes it after, with a
/// higher fence. A queued locker's one attempt at a set needs no opt-in either.
#[tokio::test]
async fn a_set_taken_at_once_lets_a_keys_queued_waiter_go_first() {
    let server = RedisServer::start();
    let (q1, q2) = (
        common::queued_locker(&server.url()).await,
        common::queued_locker(&server.url()).await,
    );
    let polling = Locker::new(server.client().await);
    let holder = q1
        .acquire("j-k", &LockOptions::new())
        .await
        .expect("hold j-k");
    let waiter = {
        let q2 = q2.clone();
        tokio::spawn(async move {
            let g = q2
                .acquire_wait("j-k", &tight().with_wait(Duration::from_secs(30)))
                .await
                .expect("the queued waiter's grant");
            let fence = g.fence();
            g.release().await.expect("release");
            fence
        })
    };
    // Until it is queued, a release would just delete the lock.
    let deadline = Instant::now() + Duration::from_secs(30);
    while polling.status("j-k").await.expect("status").queued == 0 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let set = {
        let polling = polling.clone();
        tokio::spawn(async move {
            polling
                .acquire_many_wait(&["j-j", "j-k"], &tight().with_wait(Duration::from_secs(30)))
                .await
        })
    };
    holder
        .release()
        .await
        .expect("release: handed to the waiter");
    let waiter_fence = waiter.await.expect("waiter");
    let set = set.await.expect("task").expect("the set, after the waiter");
    assert!(
        set.fence("j-k").expect("j-k") > waiter_fence,
        "the set took j-k after its queued waiter"
    );
    set.release().await.expect("release");
    // One attempt, no opt-in, on a queued locker: all of them or none.
    let blocker = q2
        .acquire("j-j", &LockOptions::new())
        .await
        .expect("hold j-j");
    match q1.acquire_many(&["j-k", "j-j"], &LockOptions::new()).await {
        Err(Error::Locked { key, .. }) => assert_eq!(key, "j-j"),
        other => panic!("expected Locked on j-j, got {other:?}"),
    }
    assert!(
        !q1.status("j-k").await.expect("status").held,
        "nothing taken"
    );
    blocker.release().await.expect("release");
    let set = q1
        .acquire_many(&["j-k", "j-j"], &LockOptions::new())
        .await
        .expect("both free");
    set.release().await.expect("release");
    nothing_left(&q1, &["j-j", "j-k"]).await;
}

/// A polling set of more than one call's keys (600: calls of 256) whose key in its second
/// call is held retries by looking at that call's keys first: over the whole wait Redis runs
/// no more `SET`s than its first attempt's one call (two per key: the lock and its fence),
/// however many retries it makes, and the timeout names the held key.
#[tokio::test]
async fn a_large_polling_set_retries_by_looking_first() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let locker = Locker::new(server.client().await);
    let keys: Vec<String> = (0..600).map(|i| format!("{{big}}:{i:03}")).collect();
    let blocker = locker
        .acquire(&keys[400], &LockOptions::new())
        .await
        .expect("hold key 400");
    let before = common::server_info::commandstats(&admin).await;
    match locker
        .acquire_many_wait(&keys, &tight().with_wait(Duration::from_millis(400)))
        .await
    {
        Err(Error::WaitTimeout { key, attempts, .. }) => {
            assert_eq!(key, keys[400]);
            assert!(attempts >= 4, "a few retries at least: {attempts} calls");
        }
        other => panic!("expected a wait timeout on {}, got {other:?}", keys[400]),
    }
    let after = common::server_info::commandstats(&admin).await;
    let sets = after.get("set").unwrap_or(&0) - before.get("set").unwrap_or(&0);
    assert!(sets <= 2 * 256, "{sets} SETs: a retry took keys again");
    blocker.release().await.expect("release");
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    nothing_left(&locker, &refs).await;
}

/// In order, a run of keys of one slot is waited for as a whole, holding none of it: a queued
/// locker's set of 300 keys in one slot (more than it waits for in every key's queue at once),
/// key 200 held, leaves keys 0-199 free for others all through its wait (it takes the run at
/// once when it can, as a polling wait does), and takes the set once key 200 is released.
#[tokio::test]
async fn in_order_a_run_of_one_slot_is_waited_for_holding_none_of_it() {
    let server = RedisServer::start();
    let queued = common::queued_locker(&server.url()).await;
    let other = Locker::new(server.client().await);
    let keys: Vec<String> = (0..300).map(|i| format!("{{run}}:{i:03}")).collect();
    let blocker = other
        .acquire(&keys[200], &LockOptions::new())
        .await
        .expect("hold key 200");
    let waiting = {
        let (queued, keys) = (queued.clone(), keys.clone());
        tokio::spawn(async move {
            queued
                .acquire_many_wait(&keys, &set_opts().with_wait(Duration::from_secs(30)))
                .await
        })
    };
    // Over the set's attempts (its backoff is a few ms).
    stay_free(
        &other,
        &[&keys[0], &keys[199]],
        20,
        Duration::from_millis(200),
    )
    .await;
    assert!(!waiting.is_finished(), "key 200 is still held");
    blocker.release().await.expect("release key 200");
    let set = waiting.await.expect("task").expect("the set");
    assert_eq!(set.keys().count(), 300);
    set.release().await.expect("release");
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    nothing_left(&queued, &refs).await;
}

/// FIFO for overlapping sets, a queued locker's wait at once: S {f-a, f-b} queues first, then
/// T {f-b, f-c}, then W on f-a alone, while H holds f-a and f-b. When H releases, S holds
/// both; T waits although f-c is free all along (it must not pass S on f-b), and W waits
/// behind S on f-a; when S releases, both are granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_sets_are_fifo_and_a_later_set_never_passes_an_older_one() {
    let server = RedisServer::start();
    let h = common::queued_locker(&server.url()).await;
    let (s, t, w) = (
        common::queued_locker(&server.url()).await,
        common::queued_locker(&server.url()).await,
        common::queued_locker(&server.url()).await,
    );
    let opts = tight().with_wait(Duration::from_secs(60));
    let held = h
        .acquire_many_wait(&["f-a", "f-b"], &opts)
        .await
        .expect("H holds f-a, f-b");
    let s_wait = tokio::spawn({
        let (s, o) = (s.clone(), opts.clone());
        async move { s.acquire_many_wait(&["f-a", "f-b"], &o).await }
    });
    common::lock_queued(&h, "f-b", 1).await.expect("S queued");
    let t_wait = tokio::spawn({
        let (t, o) = (t.clone(), opts.clone());
        async move { t.acquire_many_wait(&["f-b", "f-c"], &o).await }
    });
    common::lock_queued(&h, "f-b", 2).await.expect("T queued");
    let w_wait = tokio::spawn({
        let (w, o) = (w.clone(), opts.clone());
        async move { w.acquire_wait("f-a", &o).await }
    });
    common::lock_queued(&h, "f-a", 2).await.expect("W queued");
    assert!(!h.status("f-c").await.expect("status").held);
    held.release().await.expect("H releases");
    let s_set = s_wait.await.expect("task").expect("S holds f-a, f-b");
    let f = (s_set.fence("f-a"), s_set.fence("f-b"));
    assert!(f.0.is_some() && f.1.is_some());
    // S holds both until it releases: T and W wait, f-c stays free.
    assert!(!t_wait.is_finished() && !w_wait.is_finished());
    assert!(!h.status("f-c").await.expect("status").held);
    assert_eq!(h.status("f-b").await.expect("status").queued, 1);
    s_set.release().await.expect("S releases");
    let t_set = t_wait.await.expect("task").expect("T holds f-b, f-c");
    let w_guard = w_wait.await.expect("task").expect("W holds f-a");
    assert!(t_set.fence("f-b") > f.1);
    assert!(w_guard.fence() > f.0.unwrap_or(0));
    t_set.release().await.expect("release");
    w_guard.release().await.expect("release");
    nothing_left(&h, &["f-a", "f-b", "f-c"]).await;
}

/// A queued set's handoff costs the queued wait's calls: its queueing call and the release
/// that grants it (every key at once, one message), no call of the waiter after the grant.
#[tokio::test]
async fn a_queued_set_is_granted_in_one_call_with_one_message() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let h = common::queued_locker(&server.url()).await;
    let s = common::queued_locker(&server.url()).await;
    let opts = tight().with_wait(Duration::from_secs(60));
    // (Every script loaded once: a first call of each meets NOSCRIPT, counted as a call.)
    for locker in [&h, &s] {
        let set = locker
            .acquire_many_wait(&["g-a", "g-b"], &opts)
            .await
            .expect("free");
        set.release().await.expect("release");
    }
    let held = h
        .acquire_many_wait(&["g-a", "g-b"], &opts)
        .await
        .expect("H holds the set");
    let waiting = tokio::spawn({
        let (s, o) = (s.clone(), opts.clone());
        async move { s.acquire_many_wait(&["g-a", "g-b"], &o).await }
    });
    common::lock_queued(&h, "g-b", 1).await.expect("S queued");
    let before = common::script_calls(&admin).await;
    held.release().await.expect("release");
    let set = waiting.await.expect("task").expect("S holds the set");
    // The release (one call for both keys), and the status reads of nobody: the grant needed
    // no call of the waiter.
    let calls = common::script_calls(&admin).await - before;
    assert_eq!(
        calls, 1,
        "script calls from the release to S holding the set"
    );
    assert!(set.valid_until() > Instant::now() + Duration::from_secs(5));
    set.release().await.expect("release");
    nothing_left(&h, &["g-a", "g-b"]).await;
}

/// Review 3, finding 3: a key that a waiting set keeps free keeps its fence counter (and with
/// it the hint that waiters are queued) as long as its queue. With the counter living only the
/// last hold's TTL plus the retention (5ecc195), it expired first: a one-shot `acquire` then
/// took the key past the queued set, and its release (a bare `DEL`) served nobody; the set
/// stalled with both keys free until its deadline (15.7 s with a retention of 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_kept_free_for_a_set_keeps_its_fence_as_long_as_its_queue() {
    let server = RedisServer::start();
    let url = server.url();
    let polling = || async { retained(&url).await.build().expect("polling locker") };
    let (h1, h2, x) = (polling().await, polling().await, polling().await);
    let s = retained(&url)
        .await
        .queued()
        .build()
        .await
        .expect("queued locker");
    let (a, b) = ("{kf}:a", "{kf}:b");
    let ga = h1
        .acquire(a, &LockOptions::new().with_ttl(Duration::from_secs(2)))
        .await
        .expect("h1 takes a");
    let gb = h2
        .acquire(b, &LockOptions::new().with_ttl(Duration::from_secs(30)))
        .await
        .expect("h2 takes b");
    let waiting = queue_set(&s, [a, b]).await;
    ga.release().await.expect("h1 releases a");
    // a is left free for the set, which waits for b. Past the last hold's TTL plus the
    // retention (when the counter expired before): a's queue, and the set, still come first.
    the_set_keeps_a_first(
        &server,
        &s,
        &x,
        [a, b],
        gb,
        waiting,
        Duration::from_millis(3_500),
    )
    .await;
}

/// Review 3, finding 3, its other door (found by the model, `Revert::FenceLifeInKeep`): a set
/// that queues first on a free key (its other key held) gives that key's queue `NO_LEASE`
/// plus the retention; the key's fence counter, which carries the hint that waiters are
/// queued, must live as long. Written `KEEPTTL` (or, missing, started with the retention only),
/// it expired first: a one-shot `acquire` then took the key past the queued set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_key_a_set_queues_first_on_keeps_its_fence_as_long_as_its_queue() {
    let server = RedisServer::start();
    let url = server.url();
    let polling = || async { retained(&url).await.build().expect("polling locker") };
    let (h, x) = (polling().await, polling().await);
    let s = retained(&url)
        .await
        .queued()
        .build()
        .await
        .expect("queued locker");
    let (a, b) = ("{kq}:a", "{kq}:b");
    let gb = h
        .acquire(b, &LockOptions::new().with_ttl(Duration::from_secs(30)))
        .await
        .expect("h takes b");
    let waiting = queue_set(&s, [a, b]).await;
    // Past the retention (when the counter expired before): the set still comes first.
    the_set_keeps_a_first(
        &server,
        &s,
        &x,
        [a, b],
        gb,
        waiting,
        Duration::from_millis(1_500),
    )
    .await;
}

/// A locker builder on `url` with a retention of 1 s.
async fn retained(url: &str) -> waitlock::LockerBuilder {
    Locker::connect(url)
        .await
        .expect("connect")
        .retention(Duration::from_secs(1))
}

/// `s` waits for set `[a, b]` (TTL 5 s, wait 60 s), once queued on both.
async fn queue_set(
    s: &Locker<Queue>,
    [a, b]: [&'static str; 2],
) -> tokio::task::JoinHandle<Result<LockSetGuard, Error>> {
    let waiting = {
        let s = s.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .with_ttl(Duration::from_secs(5))
                .with_wait(Duration::from_secs(60));
            s.acquire_many_wait(&[a, b], &opts).await
        })
    };
    common::lock_queued(s, a, 1)
        .await
        .expect("the set queues on a");
    common::lock_queued(s, b, 1)
        .await
        .expect("the set queues on b");
    waiting
}

/// Set `[a, b]`, queued on both (`waiting`), with `a` free and `b` held (`gb`): `a`'s fence
/// counter lives as long as its queue, still does `past` later, keeps a one-shot `acquire` by
/// `x` off `a`, and the set is granted when `b` is released.
async fn the_set_keeps_a_first(
    server: &RedisServer,
    s: &Locker<Queue>,
    x: &Locker,
    [a, b]: [&str; 2],
    gb: LockGuard,
    waiting: tokio::task::JoinHandle<Result<LockSetGuard, Error>>,
    past: Duration,
) {
    let admin = server.client().await;
    let pttl = |name: String| {
        let admin = admin.clone();
        async move { common::cmd::<i64>(&admin, "PTTL", vec![name.into()]).await }
    };
    let (fence_life, queue_life) = (
        pttl(common::fence_key(a)).await,
        pttl(common::queue_key(a)).await,
    );
    assert!(
        queue_life > 0 && fence_life >= queue_life - 1_000,
        "a's fence lives {fence_life} ms, its queue {queue_life} ms"
    );
    tokio::time::sleep(past).await;
    assert!(
        pttl(common::fence_key(a)).await > 0,
        "a's fence counter expired while its queue waits"
    );
    match x.acquire(a, &LockOptions::new()).await {
        Err(Error::Locked { .. }) => {}
        Err(e) => panic!("a one-shot acquire of a: {e}"),
        Ok(g) => panic!(
            "a one-shot acquire took a past the queued set (fence {})",
            g.fence()
        ),
    }
    let released = Instant::now();
    gb.release().await.expect("b's holder releases it");
    let set = waiting.await.expect("task").expect("the set is granted");
    println!(
        "the set was granted {:?} after b's release",
        released.elapsed()
    );
    set.release().await.expect("release");
    nothing_left(s, &[a, b]).await;
}
