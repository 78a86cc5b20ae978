//! The scripts as one Redis Functions library: loaded once per server and called by `FCALL`;
//! the same scripts by `EVALSHA` where the server refuses Functions (an ACL without them),
//! or loaded by the deployer where the application may call but not load them; clients of
//! both kinds queued on one key (FIFO, one holder at a time); and a lock released, and a
//! held one extended, while the server is out of memory.

mod common;

use common::RedisServer;
use fred::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use waitlock::{LockOptions, Locker, Queue};

use common::server_info::commandstats as stats;

/// FCALLs answered with an error (here: "Function not found"), from `INFO commandstats`.
async fn fcall_failures(admin: &Client) -> u64 {
    common::fcall_stats(admin)
        .await
        .split(',')
        .find_map(|kv| kv.strip_prefix("failed_calls="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn since(before: &HashMap<String, u64>, after: &HashMap<String, u64>, name: &str) -> u64 {
    after.get(name).unwrap_or(&0) - before.get(name).unwrap_or(&0)
}

/// `server`'s URL for user `app` (password `pw`).
fn app_url(server: &RedisServer) -> String {
    server.url().replacen("redis://", "redis://app:pw@", 1)
}

/// User `app` with every command but those `rules` take away.
async fn app_user(admin: &Client, rules: &[&str]) {
    let mut args: Vec<Value> = ["SETUSER", "app", "reset", "on", ">pw", "~*", "&*", "+@all"]
        .iter()
        .map(|s| Value::from(*s))
        .collect();
    args.extend(rules.iter().map(|s| Value::from(*s)));
    let ok: String = common::cmd(admin, "ACL", args).await;
    assert_eq!(ok, "OK");
}

fn opts() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30))
}

/// Every kind of call a locker makes, on `locker`: a lock taken, extended and released; a
/// queued handoff to a second locker of the same connection kind; a semaphore with a waiter;
/// a set of keys; status.
async fn every_call(locker: &Locker<Queue>, other: &Locker<Queue>, tag: &str) {
    let key = format!("{tag}-lock");
    let mut g = locker.acquire(&key, &opts()).await.expect("acquire");
    g.extend(Duration::from_secs(20)).await.expect("extend");
    let waiter = {
        let (other, key) = (other.clone(), key.clone());
        tokio::spawn(async move { other.acquire_wait(&key, &opts()).await })
    };
    common::lock_queued(locker, &key, 1).await.expect("queued");
    let fence = g.fence();
    g.release().await.expect("release (handoff)");
    let g2 = waiter.await.expect("task").expect("granted");
    assert!(g2.fence() > fence, "fences grow");
    assert_eq!(locker.status(&key).await.expect("status").queued, 0);
    g2.release().await.expect("release");

    let sem = locker.semaphore(2).expect("semaphore");
    let osem = other.semaphore(2).expect("semaphore");
    let key = format!("{tag}-sem");
    let p = sem.acquire(&key, 2, &opts()).await.expect("permits");
    let waiter = {
        let (osem, key) = (osem.clone(), key.clone());
        tokio::spawn(async move { osem.acquire_wait(&key, 1, &opts()).await })
    };
    common::permits_queued(&sem, &key, 1)
        .await
        .expect("permit waiter");
    p.release().await.expect("permits back");
    let p2 = waiter.await.expect("task").expect("permit granted");
    assert_eq!(sem.status(&key).await.expect("permit status").queued, 0);
    p2.release().await.expect("permit back");

    let keys = [format!("{{{tag}}}:a"), format!("{{{tag}}}:b")];
    let set = locker
        .acquire_many_wait(&keys, &opts())
        .await
        .expect("a set");
    set.release().await.expect("the set back");
}

/// On a server that lets it: one `FUNCTION LOAD` (at the first locker's connect), every call
/// by `FCALL`, no script; the library on the server is this build's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_is_loaded_once_and_every_call_is_an_fcall() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let before = stats(&admin).await;
    let a = common::queued_locker(&server.url()).await;
    let b = common::queued_locker(&server.url()).await;
    every_call(&a, &b, "fn").await;
    let after = stats(&admin).await;
    // Loaded at connect: no call found it missing.
    assert_eq!(since(&before, &after, "function|load"), 1, "{after:?}");
    assert_eq!(fcall_failures(&admin).await, 0);
    assert!(since(&before, &after, "fcall") >= 10, "{after:?}");
    assert_eq!(since(&before, &after, "evalsha"), 0, "{after:?}");
    assert_eq!(since(&before, &after, "script|load"), 0, "{after:?}");
    assert!(
        common::has_library(&admin).await,
        "this build's library listed"
    );
    let memory: String = common::cmd(&admin, "INFO memory", vec![]).await;
    let vm = memory
        .lines()
        .find(|l| l.starts_with("used_memory_vm_functions:"))
        .unwrap_or("used_memory_vm_functions: not reported");
    println!("the library loaded: {vm}");
    // A script flush takes nothing from the library.
    let ok: String = common::cmd(&admin, "SCRIPT", vec!["FLUSH".into()]).await;
    assert_eq!(ok, "OK");
    let before = stats(&admin).await;
    every_call(&a, &b, "fn2").await;
    let after = stats(&admin).await;
    assert_eq!(since(&before, &after, "function|load"), 0, "{after:?}");
    assert_eq!(since(&before, &after, "script|load"), 0, "{after:?}");
}

/// A server whose ACL refuses `FCALL`, or lets it but refuses `FUNCTION LOAD` (the library not
/// loaded): every call works, by `EVALSHA` of the same scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_server_refuses_functions_the_scripts_are_called() {
    let server = RedisServer::start();
    let admin = server.client().await;
    // The rules, and the FCALLs answered "not found" before the load was refused: one per
    // locker.
    for (i, (rules, missed)) in [
        (&["-fcall", "-fcall_ro", "-function"][..], 0),
        (&["-function|load"][..], 2),
    ]
    .iter()
    .enumerate()
    {
        app_user(&admin, rules).await;
        let before = stats(&admin).await;
        let a = common::queued_locker(&app_url(&server)).await;
        let b = common::queued_locker(&app_url(&server)).await;
        every_call(&a, &b, &format!("acl{i}")).await;
        let after = stats(&admin).await;
        assert!(
            since(&before, &after, "evalsha") >= 10,
            "{rules:?}: {after:?}"
        );
        assert_eq!(
            since(&before, &after, "fcall"),
            *missed,
            "{rules:?}: {after:?}"
        );
        assert_eq!(since(&before, &after, "function|load"), 0, "{rules:?}");
    }
}

/// An application that may call Functions but not load them, with the library loaded by the
/// deployer (`waitlock::scripts::library_code`): every call by `FCALL`, no load, no script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_loaded_by_the_deployer_is_called() {
    let server = RedisServer::start();
    let admin = server.client().await;
    app_user(&admin, &["-function|load"]).await;
    common::load_library(&admin).await;
    let before = stats(&admin).await;
    let a = common::queued_locker(&app_url(&server)).await;
    let b = common::queued_locker(&app_url(&server)).await;
    every_call(&a, &b, "deployed").await;
    let after = stats(&admin).await;
    assert!(since(&before, &after, "fcall") >= 10, "{after:?}");
    assert_eq!(since(&before, &after, "evalsha"), 0, "{after:?}");
    assert_eq!(since(&before, &after, "function|load"), 0, "{after:?}");
}

/// A fleet mid-upgrade: lockers calling the library and lockers calling the scripts (the
/// protocol-3 texts, by `EVALSHA`) queue on one key. Each is served in the order it queued,
/// and never do two hold the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_and_scripts_serve_one_queue_together() {
    let server = RedisServer::start();
    let admin = server.client().await;
    app_user(&admin, &["-fcall", "-fcall_ro", "-function"]).await;
    let by_function = common::queued_locker(&server.url()).await;
    let by_script = common::queued_locker(&app_url(&server)).await;
    let key = "mixed";
    let first = by_function.acquire(key, &opts()).await.expect("first");
    let order = Arc::new(Mutex::new(Vec::new()));
    let holding = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for i in 0..6 {
        let locker = if i % 2 == 0 { &by_script } else { &by_function }.clone();
        let (order, holding) = (order.clone(), holding.clone());
        waiters.push(tokio::spawn(async move {
            let g = locker.acquire_wait(key, &opts()).await.expect("granted");
            assert_eq!(holding.fetch_add(1, Ordering::SeqCst), 0, "two holders");
            order.lock().expect("order").push(i);
            tokio::time::sleep(Duration::from_millis(2)).await;
            holding.fetch_sub(1, Ordering::SeqCst);
            g.release().await.expect("release");
        }));
        // Queued in this order.
        common::lock_queued(&by_function, key, i + 1)
            .await
            .expect("queued");
    }
    let before = stats(&admin).await;
    first.release().await.expect("release");
    for w in waiters {
        w.await.expect("waiter");
    }
    let after = stats(&admin).await;
    assert_eq!(*order.lock().expect("order"), vec![0, 1, 2, 3, 4, 5]);
    assert!(since(&before, &after, "fcall") >= 3, "{after:?}");
    assert!(since(&before, &after, "evalsha") >= 3, "{after:?}");
}

/// Out of memory (`maxmemory` below what the server uses, no eviction): a new lock is
/// refused, with an error that names its key; a held lock is extended and released, and a
/// waiter is handed it, because those functions are `allow-oom`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_still_lets_locks_go() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let a = common::queued_locker(&server.url()).await;
    let b = common::queued_locker(&server.url()).await;
    let mut g = a.acquire("full", &opts()).await.expect("acquire");
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire_wait("full", &opts()).await })
    };
    common::lock_queued(&a, "full", 1).await.expect("queued");
    let config = |v: &'static str| {
        common::cmd::<String>(
            &admin,
            "CONFIG",
            vec!["SET".into(), "maxmemory".into(), v.into()],
        )
    };
    assert_eq!(config("1").await, "OK");
    let refused = a
        .acquire("another", &opts())
        .await
        .expect_err("no new lock when memory is full");
    let text = refused.to_string();
    assert!(text.contains("another") && text.contains("OOM"), "{text}");
    g.extend(Duration::from_secs(20))
        .await
        .expect("extend when full");
    g.release().await.expect("release when full");
    let g2 = waiter.await.expect("task").expect("handed over when full");
    g2.release().await.expect("release when full");
    assert_eq!(config("0").await, "OK");
}

/// A restart without persistence takes the library: each locker's first call after it finds
/// it missing and loads it once (no call of the many after it finds it missing again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_library_is_loaded_again_once_per_locker() {
    let mut server = RedisServer::start();
    let a = common::queued_locker(&server.url()).await;
    let b = common::queued_locker(&server.url()).await;
    every_call(&a, &b, "before").await;
    server.restart();
    let admin = server.client().await;
    for round in 0..3 {
        every_call(&a, &b, &format!("after{round}")).await;
    }
    let after = stats(&admin).await;
    let loads = since(&HashMap::new(), &after, "function|load");
    assert!((1..=2).contains(&loads), "{loads} loads: {after:?}");
    let missed = fcall_failures(&admin).await;
    assert!((1..=2).contains(&missed), "{missed} calls found it missing");
}

/// Where the server refuses Functions, a script flush with 200 acquisitions sent at once loads
/// the acquire script once, not once per call (each script's own gate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_scripts_are_called_a_flush_loads_each_once() {
    let server = RedisServer::start();
    let admin = server.client().await;
    app_user(&admin, &["-fcall", "-fcall_ro", "-function"]).await;
    let locker = common::queued_locker(&app_url(&server)).await;
    // (The first call finds FCALL refused: scripts from then on.)
    let g = locker.acquire("warm", &opts()).await.expect("warm");
    g.release().await.expect("release");
    let ok: String = common::cmd(&admin, "SCRIPT", vec!["FLUSH".into()]).await;
    assert_eq!(ok, "OK");
    let before = stats(&admin).await;
    let takes: Vec<_> = (0..200)
        .map(|i| {
            let locker = locker.clone();
            tokio::spawn(async move { locker.acquire(&format!("flushed-{i}"), &opts()).await })
        })
        .collect();
    let mut guards = Vec::new();
    for t in takes {
        guards.push(t.await.expect("task").expect("acquire after a flush"));
    }
    let after = stats(&admin).await;
    assert_eq!(since(&before, &after, "script|load"), 1, "{after:?}");
    assert_eq!(since(&before, &after, "fcall"), 0, "{after:?}");
    for g in guards {
        g.release().await.expect("release");
    }
}
