//! The MIGRATING window of a slot (review 2, finding 6): while a Redis Cluster slot moves,
//! every waitlock script on it fails with `TRYAGAIN` (the scripts name keys that do not exist
//! yet: the queue, the processes hash), from the moment the slot is marked MIGRATING until
//! the move ends. How long that is depends on how many keys the slot holds: the lock's own,
//! or also other data that hashes to it.
//!
//! A 3-primary cluster; one lock key; its slot filled with 0, 10,000 or 100,000 other keys
//! (100-byte strings). A polling locker (command timeout 1 s) loops `acquire` (wait 0) +
//! `release` on the key while the slot moves as `redis-cli --cluster reshard` moves it
//! (IMPORTING / MIGRATING, `MIGRATE` of the keys in batches over one connection, `SETSLOT
//! NODE` on every node), batches of 10 keys (redis-cli's default `--cluster-pipeline`) and of
//! 100. Reports the move's length, the longest stretch with no successful acquire + release,
//! and the failed calls.
//!
//! `cargo bench --bench migration` (`MIGRATION_DEBUG=1`: every failed call, and the stalls after
//! a move).

#[path = "../tests/common/mod.rs"]
mod common;

use common::cluster::RedisCluster;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use waitlock::fred::prelude::*;
use waitlock::{LockOptions, Locker};

/// Fills the slot of `tag` with `n` keys `{tag}:data:<i>` (one script per 10,000: same slot).
async fn fill(client: &Client, tag: &str, n: usize) {
    let script = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do \
                  redis.call('SET', KEYS[1] .. ':' .. i, string.rep('x', 100)) end return 1";
    let mut from = 0;
    while from < n {
        let to = (from + 10_000).min(n);
        let _: i64 = client
            .eval(
                script,
                vec![format!("{{{tag}}}:data")],
                vec![from.to_string(), (to - 1).to_string()],
            )
            .await
            .expect("fill the slot");
        from = to;
    }
}

/// A plain connection to the node on `port`.
async fn node(port: u16) -> Client {
    common::client_for(&format!("redis://127.0.0.1:{port}")).await
}

/// Runs one command on a node (a plain connection to it, not the cluster client).
async fn on(node: &Client, args: Vec<String>) -> Value {
    let (head, rest) = args.split_first().expect("a command");
    node.custom(
        waitlock::fred::types::CustomCommand::new(head.clone(), None::<u16>, false),
        rest.to_vec(),
    )
    .await
    .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn words(s: &str) -> Vec<String> {
    s.split(' ').map(str::to_owned).collect()
}

/// Moves `slot` from `from` to `to` as `redis-cli --cluster reshard` does, `batch` keys per
/// MIGRATE over one connection to the source; returns when every node knows the new owner.
async fn move_slot(cluster: &RedisCluster, slot: u16, from: u16, to: u16, batch: usize) {
    let (from_id, to_id) = (cluster.id(from), cluster.id(to));
    let (src, dst) = (node(from).await, node(to).await);
    on(
        &dst,
        words(&format!("CLUSTER SETSLOT {slot} IMPORTING {from_id}")),
    )
    .await;
    on(
        &src,
        words(&format!("CLUSTER SETSLOT {slot} MIGRATING {to_id}")),
    )
    .await;
    loop {
        let keys = on(
            &src,
            words(&format!("CLUSTER GETKEYSINSLOT {slot} {batch}")),
        )
        .await;
        let keys: Vec<String> = keys.convert().expect("keys");
        if keys.is_empty() {
            break;
        }
        let mut args = words(&format!("MIGRATE 127.0.0.1 {to}"));
        args.extend(["".to_owned(), "0".into(), "10000".into(), "KEYS".into()]);
        args.extend(keys);
        on(&src, args).await;
    }
    for n in &cluster.nodes {
        on(
            &node(n.port).await,
            words(&format!("CLUSTER SETSLOT {slot} NODE {to_id}")),
        )
        .await;
    }
    tokio::task::block_in_place(|| cluster.wait_ok());
}

struct Outcome {
    moved: Duration,
    /// From the move's end to the next successful acquire + release.
    recovered: Duration,
    longest_gap: Duration,
    pairs: u64,
    failed: u64,
}

async fn measure(cluster: &Arc<RedisCluster>, key: &str, others: usize, batch: usize) -> Outcome {
    let locker = Locker::connect(&cluster.url())
        .await
        .expect("connect")
        .command_timeout(Duration::from_secs(1))
        .build()
        .expect("locker");
    let tag = format!("waitlock:{key}");
    let slot = waitlock::fred::util::redis_keyslot(tag.as_bytes());
    fill(locker.client(), &tag, others).await;
    let opts = LockOptions::new().with_ttl(Duration::from_secs(5));
    locker
        .acquire(key, &opts)
        .await
        .expect("first acquire")
        .release()
        .await
        .expect("first release");
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let done: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let looper = {
        let (locker, stop, failed, done, key) = (
            locker.clone(),
            stop.clone(),
            failed.clone(),
            done.clone(),
            key.to_owned(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match locker.acquire(&key, &opts).await {
                    Ok(g) => {
                        let token = g.token().to_owned();
                        match g.release().await {
                            Ok(()) => done.lock().expect("log").push(Instant::now()),
                            Err(e) => {
                                if std::env::var("MIGRATION_DEBUG").is_ok() {
                                    eprintln!("{:?} release {token}: {e}", Instant::now());
                                }
                                failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Err(e) => {
                        if std::env::var("MIGRATION_DEBUG").is_ok()
                            && !matches!(e, waitlock::Error::Locked { .. })
                        {
                            eprintln!("{:?} acquire: {e}", Instant::now());
                        }
                        failed.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let from = cluster.owner(slot);
    let to = *cluster
        .primaries()
        .iter()
        .find(|p| **p != from)
        .expect("another primary");
    let started = Instant::now();
    move_slot(cluster, slot, from, to, batch).await;
    let moved = started.elapsed();
    // Until the locker works on the new owner again (fred follows MOVED).
    let after = Instant::now();
    while done.lock().expect("log").last().is_none_or(|t| *t < after)
        && after.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let recovered = after.elapsed();
    if std::env::var("MIGRATION_DEBUG").is_ok() && recovered > Duration::from_millis(100) {
        eprintln!("{key}: stalled {recovered:?} after the move");
    }
    stop.store(true, Ordering::Relaxed);
    looper.await.expect("looper");
    let times = done.lock().expect("log").clone();
    let mut longest = Duration::ZERO;
    for w in times.windows(2) {
        if w[1] > started {
            longest = longest.max(w[1] - w[0].max(started));
        }
    }
    let pairs = times.iter().filter(|t| **t >= started).count() as u64;
    Outcome {
        moved,
        recovered,
        longest_gap: longest,
        pairs,
        failed: failed.load(Ordering::Relaxed),
    }
}

fn main() {
    let rt = common::runner::runtime();
    let cluster = Arc::new(RedisCluster::start(3, 0));
    println!("| other keys in the slot | keys per MIGRATE | the move took | longest stretch without an acquire + release | first pair after the move's end | failed calls |");
    println!("|---|---|---|---|---|---|");
    for (i, (others, batch)) in [
        (0, 10),
        (10_000, 10),
        (10_000, 100),
        (100_000, 100),
        (100_000, 10),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("migrating-{i}");
        let o = rt.block_on(measure(&cluster, &key, others, batch));
        println!(
            "| {others} | {batch} | {:.0} ms | {:.0} ms | {:.0} ms | {} ({} pairs after the start) |",
            o.moved.as_secs_f64() * 1e3,
            o.longest_gap.as_secs_f64() * 1e3,
            o.recovered.as_secs_f64() * 1e3,
            o.failed,
            o.pairs
        );
    }
}
