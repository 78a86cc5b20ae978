//! A rolling upgrade on one key: protocol 3's library (`tests/fixtures/protocol3_library.lua`,
//! the library of 1506c7c, the last build whose grant asked PUBSUB whether its head listened
//! and chose the watchers again at every grant) and this build's lockers (protocol 4's grant)
//! serve one queue, in both directions: this build's release grants to a protocol-3 waiter,
//! whose protocol-3 release grants to this build's waiter; FIFO, one holder at a time, fences
//! growing. The protocol-3 client is driven by hand (`FCALL` of its functions, its grant
//! channel subscribed as a locker's hub would), as no locker of this build can call it.

mod common;

use common::{fence_key, lock_key, procs_key, queue_key, RedisServer};
use fred::prelude::*;
use std::time::Duration;
use waitlock::LockOptions;

const P3_LIBRARY: &str = include_str!("fixtures/protocol3_library.lua");
/// The protocol-3 client's process id (12 characters, as a locker's) and token.
const P3_PID: &str = "p3p3p3p3p3p3";
const P3_TOKEN: &str = "p3p3p3p3p3p3/1";

/// The fixture library's name, from its first line (`#!lua name=...`).
fn p3_name() -> &'static str {
    P3_LIBRARY
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("#!lua name="))
        .expect("the fixture starts with its name")
}

/// Calls protocol 3's function `stem` on `key` as the hand-driven client (TTL 10 s, retention
/// 60 s, claim window 500 ms, presence window 100 ms; `member` queues it).
async fn p3_call(c: &Client, stem: &str, key: &str, member: &str) -> Value {
    let mut args: Vec<Value> = vec![
        format!("{}_{stem}", p3_name()).into(),
        4.into(),
        lock_key(key).into(),
        fence_key(key).into(),
        queue_key(key).into(),
        procs_key(key).into(),
    ];
    for a in [
        P3_TOKEN, "10000", "60000", "500", "100", member, P3_PID, "", "", "",
    ] {
        args.push(a.into());
    }
    common::cmd(c, "FCALL", args).await
}

fn opts() -> LockOptions {
    LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30))
}

/// The first integer of a script's reply.
fn code(v: &Value) -> i64 {
    match v {
        Value::Array(a) => a.first().and_then(|x| x.as_i64()).unwrap_or(-1),
        _ => -1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_3_and_4_serve_one_queue_in_turn() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let loaded: String =
        common::cmd(&admin, "FUNCTION", vec!["LOAD".into(), P3_LIBRARY.into()]).await;
    assert_eq!(loaded, p3_name());
    assert_ne!(p3_name(), waitlock::scripts::library_name());
    let key = "upgrade";
    let a = common::queued_locker(&server.url()).await;
    let b = common::queued_locker(&server.url()).await;
    let first = a
        .acquire(key, &opts())
        .await
        .expect("this build takes the lock");

    // The protocol-3 client listens on its grant channel, then queues (protocol 3's acquire).
    let sub = common::scripts::subscriber(&server).await;
    let mut messages = sub.message_rx();
    sub.ssubscribe(format!("{}:w:{P3_PID}", lock_key(key)))
        .await
        .expect("ssubscribe");
    let member = format!("{P3_PID} 10000 {P3_TOKEN}");
    let queued = p3_call(&admin, "acquire", key, &member).await;
    assert_eq!(code(&queued), 2, "protocol 3's attempt queues: {queued:?}");

    // This build's waiter queues behind it.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire_wait(key, &opts()).await })
    };
    common::lock_queued(&a, key, 2).await.expect("both queued");

    // This build's release grants to the protocol-3 waiter, the head.
    let fence_a = first.fence();
    first.release().await.expect("release");
    let grant = tokio::time::timeout(Duration::from_secs(10), messages.recv())
        .await
        .expect("the protocol-3 waiter's grant within 10 s")
        .expect("message");
    let text = grant.value.as_string().unwrap_or_default();
    let words: Vec<&str> = text.split(' ').collect();
    assert_eq!(words.first(), Some(&"g2"), "{text}");
    assert_eq!(words.last(), Some(&P3_TOKEN), "{text}");
    let fence_p3: u64 = words[1].parse().expect("fence");
    assert!(fence_p3 > fence_a, "{fence_p3} after {fence_a}");
    let held: Option<String> = common::cmd(&admin, "GET", vec![lock_key(key).into()]).await;
    assert_eq!(held.as_deref(), Some(format!("h{P3_TOKEN}").as_str()));
    assert!(!waiter.is_finished(), "one holder at a time");

    // Protocol 3's release grants to this build's waiter.
    let released = p3_call(&admin, "release", key, "").await;
    assert_eq!(code(&released), 2, "handed over: {released:?}");
    let g = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("this build's waiter within 10 s")
        .expect("task")
        .expect("granted");
    assert!(g.fence() > fence_p3, "{} after {fence_p3}", g.fence());
    let held: Option<String> = common::cmd(&admin, "GET", vec![lock_key(key).into()]).await;
    assert_eq!(
        held.map(|v| v[1..].to_owned()).as_deref(),
        Some(g.token()),
        "the lock is the guard's"
    );
    g.release().await.expect("release");
    let left: u64 = common::cmd(&admin, "ZCARD", vec![queue_key(key).into()]).await;
    assert_eq!(left, 0, "nothing left queued");
}
