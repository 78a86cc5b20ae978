//! A locker behind Sentinel that follows a failover at once and checks replication:
//! `cargo run --example sentinel -- 'redis-sentinel://HOST:26379?sentinelServiceName=mymaster'`.

use std::time::Duration;
use waitlock::{Error, LockOptions, Locker};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis-sentinel://127.0.0.1:26379?sentinelServiceName=mymaster".into());
    // WAIT 1 100 after every acquisition and refresh: a lock counts only once a replica has it
    // (one more round trip; no acquisition while no replica acknowledges).
    let locker = Locker::connect(&url)
        .await?
        .require_replicas(1, Duration::from_millis(100))
        .build()?;
    let opts = LockOptions::new().with_wait(Duration::from_secs(10));
    match locker
        .run("settlement", &opts, |ctx| async move {
            println!("holding with fence {}", ctx.fence);
            Ok::<_, Error>(())
        })
        .await
    {
        Ok(()) => println!("done"),
        // Too few replicas acknowledged: the lock was given back, nothing ran.
        Err(e @ Error::NotReplicated { .. }) => eprintln!("not replicated: {e}"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
