//! Critical sections: `run` on both lockers.

use super::guard::LockGuard;
use crate::error::{Error, LossReason};
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a critical section gets: the loss signal, the key and the fence.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LockContext {
    /// Cancelled the moment the lock is judged lost; stop touching the protected resource then.
    /// (Not the lock's token: that is [`LockGuard::token`].)
    pub lost: CancellationToken,
    /// The user's key.
    pub key: String,
    /// The fencing token of this hold; pass it to storage that checks fences.
    pub fence: u64,
}

/// Runs `f` under `guard` with a keep-alive, then releases.
pub(crate) async fn run_under<F, Fut, T, E>(mut guard: LockGuard, f: F) -> Result<T, E>
where
    F: FnOnce(LockContext) -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: From<Error>,
{
    let lost = guard.keep_alive();
    let ctx = LockContext {
        lost,
        key: guard.key().to_owned(),
        fence: guard.fence(),
    };
    // If this future is dropped here, the guard's drop stops the keep-alive and releases.
    let outcome = CatchUnwind(Box::pin(f(ctx))).await;
    // What the holder could know when the section ended: no loss seen, and the lease still
    // valid by its own clock.
    let loss = guard.loss();
    let valid_until = guard.valid_until();
    let ended_valid = loss.is_none() && valid_until > Instant::now();
    let key = guard.key().to_owned();
    let ttl = guard.ttl();
    let engine = guard.engine();
    let released = guard.release().await;
    // A release that found the lock gone although its answer came back before the lease
    // ended ran while Redis should have held the lock: it vanished while `f` ran (a restart, a
    // failover, a hand-made DEL). One whose answer came later may simply have reached Redis
    // after the lease (a stalled server, a slow network, a re-send after a reconnect): the
    // section ended while the lock was valid, so it was held throughout.
    let late_release = ended_valid && Instant::now() >= valid_until;
    let value = match outcome {
        Ok(value) => value,
        Err(panic) => resume_unwind(panic),
    };
    match loss {
        Some(LossReason::TtlElapsed) => return Err(Error::LockTimeout { key, ttl }.into()),
        Some(reason) => return Err(Error::Expired { key, reason }.into()),
        None => {}
    }
    match released {
        // The release came after the lease (a stalled server, a slow network) or was sent
        // again by fred after a reconnect: `f` ended while the lock was valid.
        Err(Error::NotHeld { .. }) if late_release => {
            engine
                .meter
                .late_releases
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(key = %key, "the release found the lock gone, but the section ended while it was valid");
            value
        }
        // The lock vanished between the last refresh and the end of `f`.
        Err(Error::NotHeld { key }) => Err(Error::Expired {
            key,
            reason: LossReason::TokenGone,
        }
        .into()),
        Err(e) => {
            // `f` finished while the lock was valid; failing to release only delays the next
            // holder until the TTL. Report `f`'s result.
            tracing::warn!(key = %key, error = %e, "release after critical section failed");
            value
        }
        Ok(()) => value,
    }
}

/// Catches a panic while polling the inner future, so the lock is released before it resumes.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
