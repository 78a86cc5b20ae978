//! The `metrics` feature: every metric moves when it should (a debugging recorder), and the
//! Prometheus example serves them (scraped once over HTTP). Each test installs its recorder for
//! its own thread only (`metrics::with_local_recorder`, on a current-thread runtime, so that
//! the library's background tasks record there too).

mod common;
#[path = "../examples/prometheus.rs"]
#[allow(dead_code)]
mod prometheus_example;

use common::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use waitlock::fred::prelude::*;
use waitlock::metrics::names;
use waitlock::{Error, LockOptions, Locker};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Every metric's series: name, then its labels as `k=v` joined by `,` → counter value or
/// histogram sample count.
type Series = BTreeMap<(String, String), u64>;

/// Adds what the recorder saw since the last snapshot (a snapshot drains it) to `out`.
fn series(snapshotter: &metrics_util::debugging::Snapshotter, out: &mut Series) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let mut labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let n = match value {
            DebugValue::Counter(c) => c,
            DebugValue::Histogram(h) => h.len() as u64,
            DebugValue::Gauge(_) => 1,
        };
        *out.entry((key.key().name().to_owned(), labels.join(",")))
            .or_default() += n;
    }
}

fn get(s: &Series, name: &str, labels: &str) -> u64 {
    s.get(&(name.to_owned(), labels.to_owned()))
        .copied()
        .unwrap_or(0)
}

#[test]
fn every_metric_moves_when_it_should() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let s = metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            let admin = server.client().await;
            let queued = Locker::connect(&server.url())
                .await
                .expect("connect")
                .metrics_key_label(true)
                .queued()
                .build()
                .await
                .expect("queued locker");
            let polling = Locker::new(server.client().await);
            let quick = LockOptions::new()
                .with_ttl(Duration::from_secs(5))
                .with_wait(Duration::from_secs(5));

            // Acquired, and a one-shot attempt on a held lock: locked.
            let g = polling.acquire("m", &quick).await.expect("acquire");
            assert!(matches!(
                polling.acquire("m", &quick).await,
                Err(Error::Locked { .. })
            ));
            // A queued waiter: queued (depth 1), handed the lock by the release (a grant).
            let waiter = {
                let l = queued.clone();
                let o = quick.clone();
                tokio::spawn(async move { l.acquire_wait("m", &o).await })
            };
            while polling.status("m").await.expect("status").queued == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            // A polling caller behind that queue.
            assert!(matches!(
                polling.acquire("m", &quick).await,
                Err(Error::Locked { .. })
            ));
            g.release().await.expect("release");
            let w = waiter.await.expect("join").expect("handed over");
            // A wait that runs out while the waiter holds it.
            let short = quick.clone().with_wait(Duration::from_millis(50));
            assert!(matches!(
                polling.acquire_wait("m", &short).await,
                Err(Error::WaitTimeout { .. })
            ));
            w.release().await.expect("release");

            // Lost: refresh off, the TTL runs out while the section runs.
            let r = queued
                .run(
                    "lost",
                    &quick
                        .clone()
                        .with_ttl(Duration::from_millis(100))
                        .without_refresh(),
                    |ctx| async move {
                        ctx.lost.cancelled().await;
                        Ok::<_, Error>(())
                    },
                )
                .await;
            assert!(matches!(r, Err(Error::Expired { .. })), "{r:?}");

            // A refresh that cannot reach Redis (stalled by DEBUG SLEEP), and a release that
            // reaches it after the lease: a late release, not a lost lock.
            let fragile = Locker::connect(&server.url())
                .await
                .expect("connect")
                .command_timeout(Duration::from_millis(100))
                .build()
                .expect("locker");
            let stall = {
                let admin = admin.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    let _: Value = common::cmd(&admin, "DEBUG SLEEP 0.5", vec![]).await;
                })
            };
            let r = queued
                .run(
                    "stalled",
                    &quick.clone().with_ttl(Duration::from_millis(300)),
                    |_ctx| async {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, Error>(())
                    },
                )
                .await;
            stall.await.expect("stall");
            r.expect("a late release is not a lost lock");
            let mut g = fragile
                .acquire(
                    "refreshed",
                    &quick.clone().with_ttl(Duration::from_millis(200)),
                )
                .await
                .expect("acquire");
            let lost = g.keep_alive();
            // Redis sleeps through the refresh (due at 160 ms) and the validity deadline.
            let _: Value = common::cmd(&admin, "DEBUG SLEEP 0.4", vec![]).await;
            lost.cancelled().await;
            drop(g);

            // The subscriber connection is cut: it reconnects.
            let before = queued.stats().wakes.by_reconnect;
            let _: i64 = common::cmd(&admin, "CLIENT KILL TYPE pubsub", vec![]).await;
            let start = tokio::time::Instant::now();
            let mut seen = Series::new();
            while queued.stats().wakes.by_reconnect == before
                && seen.keys().all(|(n, _)| n != names::SUBSCRIBER_RECONNECTS)
            {
                series(&snapshotter, &mut seen);
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "no reconnect seen"
                );
                // A waiter makes the reconnection observable (and the probe notices a dead
                // connection within a second anyway).
                let _ = queued
                    .acquire_wait("probe", &quick.clone().with_wait(Duration::ZERO))
                    .await
                    .map(drop);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            queued.idle().await;
            fragile.idle().await;
            series(&snapshotter, &mut seen);
            seen
        })
    });

    let a = names::ACQUISITIONS;
    assert!(get(&s, a, "locker=poll,outcome=acquired") >= 1, "{s:#?}");
    assert!(get(&s, a, "locker=poll,outcome=locked") >= 2, "{s:#?}");
    assert_eq!(get(&s, a, "locker=poll,outcome=wait_timeout"), 1, "{s:#?}");
    // The queued locker labels its series with the key (it opted in).
    assert_eq!(
        get(&s, a, "key=m,locker=queue,outcome=acquired"),
        1,
        "{s:#?}"
    );
    assert!(
        get(&s, names::WAIT_SECONDS, "key=m,locker=queue") >= 1,
        "{s:#?}"
    );
    assert_eq!(
        get(&s, names::HANDOFFS, "key=m,locker=queue,via=grant"),
        1,
        "{s:#?}"
    );
    assert!(
        get(&s, names::QUEUE_DEPTH, "key=m,locker=queue") >= 1,
        "{s:#?}"
    );
    assert!(get(&s, names::BEHIND_QUEUE, "locker=poll") >= 1, "{s:#?}");
    assert_eq!(
        get(
            &s,
            names::LOCKS_LOST,
            "key=lost,locker=queue,reason=ttl_elapsed"
        ),
        1,
        "{s:#?}"
    );
    assert_eq!(
        get(&s, names::LATE_RELEASES, "key=stalled,locker=queue"),
        1,
        "{s:#?}"
    );
    assert!(
        get(&s, names::REFRESH_FAILURES, "locker=poll") >= 1,
        "{s:#?}"
    );
    assert!(
        get(&s, names::SUBSCRIBER_RECONNECTS, "locker=queue") >= 1,
        "{s:#?}"
    );
    // Every documented name was seen.
    for name in names::ALL {
        assert!(
            s.keys().any(|(n, _)| n == name),
            "{name} never moved: {s:#?}"
        );
    }
}

#[test]
fn the_prometheus_example_serves_the_metrics() {
    let server = RedisServer::start();
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let body = metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(prometheus_example::serve(listener, handle));
            let locker = Locker::connect(&server.url())
                .await
                .expect("connect")
                .queued()
                .build()
                .await
                .expect("locker");
            prometheus_example::workload(&locker, 3)
                .await
                .expect("workload");
            // One scrape, as Prometheus would.
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("request");
            let mut body = String::new();
            s.read_to_string(&mut body).await.expect("response");
            body
        })
    });
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.contains("waitlock_acquisitions_total{locker=\"queue\",outcome=\"acquired\"} 12"),
        "{body}"
    );
    assert!(body.contains("waitlock_wait_seconds"), "{body}");
    assert!(body.contains("waitlock_handoffs_total"), "{body}");
}
