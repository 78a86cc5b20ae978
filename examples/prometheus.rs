//! waitlock's metrics, served to Prometheus (feature `metrics`):
//!
//! ```sh
//! cargo run --example prometheus --features metrics   # then: curl http://127.0.0.1:9898/metrics
//! ```
//!
//! Four workers contend for one key against `REDIS_URL` (default `redis://127.0.0.1:6379`)
//! while `/metrics` serves the Prometheus text format. The recorder is
//! `metrics-exporter-prometheus`'s (any `metrics` recorder works); the few lines of HTTP below
//! stand in for the exporter's own listener so that the example needs no web stack.
//! `METRICS_ADDR` sets the address, `SECONDS` how long it runs (default: until Ctrl-C).

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use waitlock::{LockOptions, Locker};

/// Answers every HTTP request on `listener` with the metrics in Prometheus' text format.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let handle = handle.clone();
        tokio::spawn(async move {
            // The request itself does not matter: read what came, answer with the metrics.
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
            let body = handle.render();
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(body.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}

/// A few workers taking one lock in turn, for something to see.
pub async fn workload(locker: &Locker<waitlock::Queue>, rounds: usize) -> waitlock::Result<()> {
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::from_secs(5));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (locker, opts) = (locker.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                locker
                    .run("prometheus-demo", &opts, |_ctx| async {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        Ok::<_, waitlock::Error>(())
                    })
                    .await?;
            }
            Ok::<_, waitlock::Error>(())
        }));
    }
    for t in tasks {
        t.await.expect("worker")?;
    }
    Ok(())
}

#[tokio::main]
#[allow(dead_code)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9898".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("metrics on http://{addr}/metrics");
    tokio::spawn(serve(listener, handle));
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locker = Locker::connect(&url).await?.queued().build().await?;
    let seconds: u64 = std::env::var("SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    let until = tokio::time::Instant::now() + Duration::from_secs(seconds.min(1 << 32));
    loop {
        workload(&locker, 25).await?;
        println!("{:?}", locker.stats());
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep_until(until) => break,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    Ok(())
}
