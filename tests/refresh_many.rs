//! One refresher for many held locks (issue 34), against a real private redis-server: thousands
//! of guards kept alive through a killed connection, a loss that reaches only its own guard,
//! mixed TTLs in one schedule, and the calls it costs.

mod common;

use common::{cmd, lock_key, script_calls, RedisServer};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{LockGuard, LockOptions, Locker};

/// Every guard still holds its key in Redis and has seen no loss.
async fn all_held(admin: &Client, guards: &[LockGuard]) {
    for g in guards {
        assert_eq!(g.loss(), None, "{} reported lost", g.key());
        let v: Option<String> = admin.get(lock_key(g.key())).await.expect("GET");
        assert_eq!(
            v.as_deref().map(|v| &v[1..]),
            Some(g.token()),
            "{} is not held by its guard's token in Redis",
            g.key()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_guards_stay_held_through_a_killed_connection_in_few_calls() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let client = server.client().await;
    let locker = Locker::new(client.clone());
    // TTL 3 s, refreshed every 1.5 s: three periods are 4.5 s.
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(3))
        .with_refresh_ratio(0.5);
    let n = 10_000;
    let guards = common::hold_many(&locker, "many", n, &opts, true).await;
    let calls_before = script_calls(&admin).await;
    let start = Instant::now();
    // Mid-run, the locker's connection is cut; fred reconnects, the refresher retries.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let id: i64 = client.client_id().await.expect("CLIENT ID");
    let killed: i64 = cmd(&admin, "CLIENT KILL ID", vec![id.into()]).await;
    assert_eq!(killed, 1, "the locker's connection was cut");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let periods = start.elapsed().as_secs_f64() / 1.5;
    let calls = script_calls(&admin).await - calls_before;
    all_held(&admin, &guards).await;
    // One call per lease and period would be 10,000 a period; batched, a few hundred at most
    // (the killed connection's retries included).
    let per_period = calls as f64 / periods;
    println!("{n} leases: {calls} script calls in {periods:.1} refresh periods ({per_period:.0} a period)");
    assert!(
        per_period < 500.0,
        "{per_period:.0} script calls per refresh period for {n} leases"
    );
    for g in guards {
        g.release().await.expect("release");
    }
    locker.idle().await;
    let keys: i64 = cmd(&admin, "DBSIZE", vec![]).await;
    assert_eq!(keys, n as i64, "only the fence counters are left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_deleted_behind_one_guard_fires_that_guards_token_and_no_other() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let locker = Locker::new(server.client().await);
    let ttl = Duration::from_millis(1_000);
    let period = ttl / 2;
    let opts = LockOptions::new().with_ttl(ttl).with_refresh_ratio(0.5);
    let mut guards = common::hold_many(&locker, "one-of-many", 300, &opts, true).await;
    let mut victim = guards.swap_remove(123);
    let lost = victim.keep_alive();
    let _: i64 = admin.del(lock_key(victim.key())).await.expect("DEL");
    let deleted = Instant::now();
    tokio::time::timeout(period * 4, lost.cancelled())
        .await
        .expect("the deleted key's guard learned of it");
    let took = deleted.elapsed();
    println!("the deleted key's loss token fired {took:?} after the DEL");
    assert!(
        // Within one refresh period, plus a round trip and scheduling on a busy machine.
        took <= period + Duration::from_millis(250),
        "fired {took:?} after the DEL"
    );
    assert_eq!(victim.loss(), Some(waitlock::LossReason::TokenGone));
    // A full period later, every other guard still holds.
    tokio::time::sleep(period).await;
    all_held(&admin, &guards).await;
    for g in guards {
        g.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_ttls_share_one_refresher_and_each_keeps_its_own_times() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let locker = Locker::new(server.client().await);
    let short = LockOptions::new().with_ttl(Duration::from_secs(1));
    let long = LockOptions::new().with_ttl(Duration::from_secs(60));
    let mut guards = common::hold_many(&locker, "short", 50, &short, true).await;
    guards.extend(common::hold_many(&locker, "long", 50, &long, true).await);
    // Three seconds: the 1 s locks need three refreshes or more to be held; the 60 s locks are
    // due at 48 s (ratio 0.8) and are not refreshed at all.
    tokio::time::sleep(Duration::from_secs(3)).await;
    all_held(&admin, &guards).await;
    for g in &guards {
        let pttl: i64 = admin.pttl(lock_key(g.key())).await.expect("PTTL");
        if g.key().starts_with("long") {
            assert!(
                (50_000..=57_500).contains(&pttl),
                "{}: PTTL {pttl} ms: refreshed when not due",
                g.key()
            );
        } else {
            assert!(pttl > 0 && pttl <= 1_000, "{}: PTTL {pttl}", g.key());
        }
    }
    assert!(guards.iter().all(|g| g.valid_until() > Instant::now()));
    for g in guards {
        g.release().await.expect("release");
    }
    locker.idle().await;
}
