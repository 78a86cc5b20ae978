//! A lock taken free is released with one compare-and-delete where the server has one (Redis
//! 8.4's `DELEX key IFEQ`, Valkey 9's `DELIFEQ`; issue 36), and with the release script where
//! it has neither, or where the lock is no longer as it was taken (a waiter queued since, the
//! lease ran out).
//!
//! Each test runs against `WAITLOCK_NEWER_REDIS_SERVER` when it is set (a `redis-server` with
//! `DELEX`: `.ci/run` builds Redis 8.6 from Debian's source package with `.ci/newer-redis`, and
//! sets it), else against the default `redis-server` (7.0: the script path), and says which.

mod common;

use common::server_info::commandstats;
use common::RedisServer;
use std::time::Duration;
use waitlock::{Error, LockOptions, Locker};

/// A private server, and whether it has a compare-and-delete command.
fn server() -> (RedisServer, bool) {
    match std::env::var("WAITLOCK_NEWER_REDIS_SERVER") {
        Ok(path) if !path.is_empty() => (RedisServer::start_program(&path), true),
        _ => {
            eprintln!(
                "compare_delete: WAITLOCK_NEWER_REDIS_SERVER is not set: testing the release \
                 script's path on the default redis-server (`bash .ci/newer-redis` builds a \
                 server with DELEX and prints its path)"
            );
            (RedisServer::start(), false)
        }
    }
}

/// Calls of `name` between two `commandstats` readings.
fn calls(
    before: &std::collections::HashMap<String, u64>,
    after: &std::collections::HashMap<String, u64>,
    name: &str,
) -> u64 {
    after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0)
}

async fn uncontended_pairs<S: waitlock::strategy::Strategy>(locker: Locker<S>, with_cad: bool) {
    let server_admin = locker.client().clone();
    let opts = LockOptions::new().with_ttl(Duration::from_secs(10));
    // The first release asks the server once which command it has.
    locker
        .acquire("pair-warm", &opts)
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let before = commandstats(&server_admin).await;
    const PAIRS: u64 = 20;
    for i in 0..PAIRS {
        let g = locker
            .acquire(&format!("pair-{i}"), &opts)
            .await
            .expect("acquire");
        g.release().await.expect("release");
    }
    let after = commandstats(&server_admin).await;
    let scripts = calls(&before, &after, "fcall") + calls(&before, &after, "evalsha");
    let cad = calls(&before, &after, "delex") + calls(&before, &after, "delifeq");
    if with_cad {
        assert_eq!(cad, PAIRS, "one compare-and-delete per release");
        assert_eq!(scripts, PAIRS, "a script for each take only");
        assert_eq!(calls(&before, &after, "del"), 0, "no release script ran");
    } else {
        assert_eq!(cad, 0);
        assert_eq!(
            scripts,
            2 * PAIRS,
            "a script for each take and each release"
        );
    }
    for i in 0..PAIRS {
        let held: Option<String> = common::cmd(
            &server_admin,
            "GET",
            vec![format!("{{waitlock:pair-{i}}}").into()],
        )
        .await;
        assert_eq!(held, None, "pair-{i} released");
    }
}

#[tokio::test]
async fn an_uncontended_release_is_one_command_where_the_server_has_one() {
    let (server, with_cad) = server();
    uncontended_pairs(common::queued_locker(&server.url()).await, with_cad).await;
    let polling = Locker::connect(&server.url())
        .await
        .expect("connect")
        .build()
        .expect("locker");
    uncontended_pairs(polling, with_cad).await;
}

#[tokio::test]
async fn a_release_after_a_waiter_queued_hands_the_lock_over() {
    let (server, _) = server();
    let a = common::queued_locker(&server.url()).await;
    let b = common::queued_locker(&server.url()).await;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(20));
    let held = a.acquire("baton", &opts).await.expect("taken free");
    let waiter = {
        let (b, opts) = (b.clone(), opts.clone());
        tokio::spawn(async move { b.acquire_wait("baton", &opts).await })
    };
    // Queued in Redis: the lock's value is no longer the free take's.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.status("baton").await.expect("status").queued == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never queued");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let fence = held.fence();
    held.release().await.expect("handed over");
    let next = waiter
        .await
        .expect("task")
        .expect("the waiter gets the lock");
    assert!(next.fence() > fence);
    next.release().await.expect("release");
}

#[tokio::test]
async fn a_release_after_the_lease_ran_out_says_not_held() {
    let (server, _) = server();
    let locker = common::queued_locker(&server.url()).await;
    let admin = server.client().await;
    let g = locker
        .acquire(
            "short",
            &LockOptions::new()
                .with_ttl(Duration::from_millis(100))
                .with_refresh(waitlock::Refresh::Off),
        )
        .await
        .expect("acquire");
    // The key is gone (its lease ran out): watched in Redis, not timed.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let v: Option<String> = common::cmd(&admin, "GET {waitlock:short}", vec![]).await;
        if v.is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease never ran out"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Another token takes it: the release must neither delete it nor succeed.
    let other = locker
        .acquire(
            "short",
            &LockOptions::new().with_ttl(Duration::from_secs(10)),
        )
        .await
        .expect("taken again");
    assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
    let v: Option<String> = common::cmd(&admin, "GET {waitlock:short}", vec![]).await;
    assert!(v.is_some(), "the other holder's lock stays");
    other.release().await.expect("release");
}

#[tokio::test]
async fn a_server_that_refuses_the_command_gets_the_release_script() {
    let (server, with_cad) = server();
    let admin = server.client().await;
    // A user that may run everything but the compare-and-delete commands (on a server that has
    // them: an older one knows no such command to deny).
    let mut acl: Vec<waitlock::fred::types::Value> =
        ["SETUSER", "limited", "on", "nopass", "~*", "&*", "+@all"]
            .into_iter()
            .map(Into::into)
            .collect();
    let known: Vec<waitlock::fred::types::Value> =
        common::cmd(&admin, "COMMAND INFO DELEX DELIFEQ", vec![]).await;
    for (name, info) in ["-delex", "-delifeq"].into_iter().zip(&known) {
        if !info.is_null() {
            acl.push(name.into());
        }
    }
    assert_eq!(
        acl.len() > 7,
        with_cad,
        "the server has a compare-and-delete"
    );
    let _: String = common::cmd(&admin, "ACL", acl).await;
    let url = server.url().replacen("redis://", "redis://limited:x@", 1);
    let locker = common::queued_locker(&url).await;
    let opts = LockOptions::new().with_ttl(Duration::from_secs(10));
    for i in 0..3 {
        let g = locker
            .acquire(&format!("acl-{i}"), &opts)
            .await
            .expect("acquire");
        g.release().await.expect("released by the script");
        let held: Option<String> =
            common::cmd(&admin, "GET", vec![format!("{{waitlock:acl-{i}}}").into()]).await;
        assert_eq!(held, None, "acl-{i} released");
    }
}
