//! The cron use: a job scheduled on every host every few minutes, of which one run at a time
//! does the work and the others skip quietly. With the `waitlock` command (feature `cli`):
//!
//! ```cron
//! */5 * * * * REDIS_URL=redis://redis.internal:6379 waitlock -q run --nonblock --ttl 2m sync-invoices -- /usr/local/bin/sync-invoices
//! ```
//!
//! and the same in a program: `cargo run --example cron` (uses `REDIS_URL`, default
//! `redis://127.0.0.1:6379`).

use std::time::Duration;
use waitlock::{Error, LockOptions, Locker};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locker = match Locker::connect(&url).await.and_then(|b| b.build()) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(69); // as the command: Redis unreachable
        }
    };
    // Wait 0: one attempt. The TTL is refreshed while the job runs, so it need only outlive a
    // stall, not the job.
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(120))
        .with_wait(Duration::ZERO);
    let job = locker
        .run("sync-invoices", &opts, |ctx| async move {
            tokio::select! {
                // Stop at once if the lock is lost (the command sends SIGTERM then, exit 75).
                _ = ctx.lost.cancelled() => Err(Error::Expired {
                    key: ctx.key,
                    reason: waitlock::LossReason::TokenGone,
                }),
                r = sync_invoices(ctx.fence) => r,
            }
        })
        .await;
    match job {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The last run is still going: skip quietly (the command's `--nonblock`, exit 1).
        Err(Error::Locked { .. }) => std::process::ExitCode::from(1),
        Err(e @ Error::Expired { .. }) => {
            eprintln!("{e}");
            std::process::ExitCode::from(75)
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::from(69)
        }
    }
}

async fn sync_invoices(fence: u64) -> Result<(), Error> {
    println!("syncing invoices (fence {fence})");
    Ok(())
}
