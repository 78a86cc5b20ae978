//! Who holds, who waits (issue 35), against a real private redis-server: labels named in
//! `Locker::status`, a dead process's waiters, and where the label lives.

mod common;

use common::{cmd, lock_key, RedisServer};
use std::time::Duration;
use waitlock::fred::prelude::*;
use waitlock::{LockOptions, Locker, Queue};

async fn labelled(server: &RedisServer, label: &str) -> Locker<Queue> {
    Locker::builder(server.client().await)
        .label(label)
        .queued()
        .build()
        .await
        .expect("queued locker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_names_the_holder_and_the_waiters_and_drops_a_dead_processs_waiter() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let (a, b, c) = (
        labelled(&server, "alpha").await,
        labelled(&server, "beta").await,
        labelled(&server, "gamma").await,
    );
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait(Duration::from_secs(30));
    let held = a.acquire_wait("k", &opts).await.expect("alpha holds");
    let mut waits = Vec::new();
    for (n, l) in [&b, &c].into_iter().enumerate() {
        let (l, opts) = (l.clone(), opts.clone());
        waits.push(tokio::spawn(async move {
            l.acquire_wait("k", &opts).await.expect("a waiter")
        }));
        common::lock_queued(&a, "k", n + 1).await.expect("queued");
    }
    // A waiter of a process that died: queued by hand, nobody listens on its channel.
    let dead = "dddddddddddd";
    let _: () = cmd(
        &admin,
        "ZADD",
        vec![
            common::queue_key("k").into(),
            "9999999999999999".into(),
            format!("{dead} 30000 {dead}/x").into(),
        ],
    )
    .await;
    let s = a.status("k").await.expect("status");
    let h = s.holder.as_ref().expect("held");
    assert_eq!(h.label.as_deref(), Some("alpha"));
    assert_eq!(h.process_id.as_deref(), Some(a.process_id()));
    assert!(
        h.held_for.is_some_and(|d| d < Duration::from_secs(30)),
        "{h:?}"
    );
    let labels: Vec<Option<&str>> = s.waiters.iter().map(|w| w.label.as_deref()).collect();
    assert_eq!(
        labels,
        [Some("beta"), Some("gamma"), None],
        "queue order; the dead one has no label"
    );
    assert_eq!(s.waiters[2].process_id, dead);
    assert!(s.waiters[0].waited >= s.waiters[1].waited);
    assert_eq!(s.queued, 3);
    // Each release hands the lock on; the walk drops the dead process's waiter.
    held.release().await.expect("release");
    for w in waits {
        w.await.expect("task").release().await.expect("release");
    }
    let s = a.status("k").await.expect("status");
    assert!(s.waiters.is_empty() && s.queued == 0, "{s:?}");
    assert!(s.holder.is_none());
    // A polling locker's holder is named by token only.
    let poller = Locker::new(server.client().await);
    let g = poller
        .acquire("p", &LockOptions::new())
        .await
        .expect("free");
    let s = a.status("p").await.expect("status");
    let h = s.holder.expect("held");
    assert_eq!((h.process_id, h.label), (None, None));
    assert_eq!(h.token, g.token());
    let v: Option<String> = admin.get(lock_key("p")).await.expect("GET");
    assert!(v.is_some());
}

#[tokio::test]
async fn a_label_is_one_key_per_process_kept_for_the_retention() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let locker = Locker::builder(server.client().await)
        .retention(Duration::from_secs(60))
        .queued()
        .build()
        .await
        .expect("queued locker");
    let key = format!("{{waitlock:labels}}:{}", locker.process_id());
    let mut label: Option<String> = None;
    for _ in 0..500 {
        label = admin.get(&key).await.expect("GET");
        if label.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let label = label.expect("the label key exists");
    assert_eq!(label, waitlock::default_label());
    assert!(
        label.contains(&format!(":{}:", std::process::id())),
        "{label}"
    );
    let pttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!((50_000..=60_000).contains(&pttl), "PTTL {pttl}");
    // Too long a label is refused at build, naming the setting.
    let e = Locker::builder(server.client().await)
        .label("x".repeat(waitlock::MAX_LABEL_LEN + 1))
        .build()
        .expect_err("too long");
    assert!(e.to_string().contains("label"), "{e}");
}
