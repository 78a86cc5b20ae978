//! A fleet-wide concurrency limit: at most 3 thumbnail jobs at once across every process and
//! host, and a read-write lock on a shared config. `cargo run --example semaphore` (uses
//! `REDIS_URL`, default `redis://127.0.0.1:6379`). With the `waitlock` command:
//! `waitlock run --limit 3 thumbnails -- ./thumb.sh`, `waitlock run -s config -- ./read.sh`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use waitlock::{LockOptions, Locker};

#[tokio::main]
async fn main() -> waitlock::Result<()> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locker = Locker::connect(&url).await?.queued().build().await?;
    let thumbnails = locker.semaphore(3)?;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_wait(Duration::from_secs(30));
    let running = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for job in 0..8 {
        let (sem, opts, running) = (thumbnails.clone(), opts.clone(), running.clone());
        jobs.push(tokio::spawn(async move {
            // Weight 1 of the 3 permits; `run` refreshes the lease and gives it back after.
            sem.run("example-thumbnails", 1, &opts, |ctx| async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                println!("job {job}: running ({now} at once), fence {}", ctx.fence);
                tokio::time::sleep(Duration::from_millis(200)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, waitlock::Error>(())
            })
            .await
        }));
    }
    for j in jobs {
        j.await.expect("job task")?;
    }
    let config = locker.rw_lock();
    let r1 = config.read_wait("example-config", &opts).await?;
    let r2 = config.read_wait("example-config", &opts).await?;
    println!(
        "two readers at once: {:?}",
        config.status("example-config").await?
    );
    r1.release().await?;
    r2.release().await?;
    let w = config.write_wait("example-config", &opts).await?;
    println!("one writer alone, fence {}", w.fence());
    w.release().await?;
    Ok(())
}
