//! A queued locker on a Redis Cluster: `cargo run --example cluster -- redis-cluster://HOST:PORT`
//! (any node; fred discovers the others). Each process that runs it takes the lock `report` in
//! turn; run it on several hosts at once to see the queue hand the lock over.

use std::time::Duration;
use waitlock::{LockOptions, Locker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis-cluster://127.0.0.1:7000".into());
    // One subscriber connection per primary; every lock's keys share one hash tag, so each
    // lock's scripts run on the primary that owns its slot.
    let locker = Locker::connect(&url).await?.queued().build().await?;
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(30));
    let fence = locker
        .run("report", &opts, |ctx| async move {
            // Replication is asynchronous: a failover can lose a lock just taken. Hand the
            // fence to the storage you protect, which refuses a lower one than it has seen.
            println!("holding {:?} with fence {}", ctx.key, ctx.fence);
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, waitlock::Error>(ctx.fence)
        })
        .await?;
    println!("released (fence {fence})");
    Ok(())
}
