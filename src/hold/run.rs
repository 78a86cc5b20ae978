//! Critical sections: `run` on both lockers.

use super::guard::LockGuard;
use super::lease::Lease;
use crate::error::Error;
use std::future::Future;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a critical section gets: the loss signal, the key, the fence and the lease.
#[derive(Clone)]
#[non_exhaustive]
pub struct LockContext {
    /// Cancelled the moment the lock is judged lost; stop touching the protected resource then.
    /// (Not the lock's token: that is [`LockGuard::token`].)
    pub lost: CancellationToken,
    /// The user's key.
    pub key: String,
    /// The fencing token of this hold; pass it to storage that checks fences.
    pub fence: u64,
    lease: Arc<Lease>,
}

impl LockContext {
    /// The last instant this holder may assume no one else holds the lock, as of the latest
    /// refresh (see [`LockGuard::valid_until`]). `lost` is cancelled when it passes without a
    /// refresh; checking it before a write that must not land late does not depend on a timer
    /// firing on time (a busy runtime may run the section first).
    pub fn valid_until(&self) -> Instant {
        self.lease.lock().valid_until
    }
}

impl std::fmt::Debug for LockContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockContext")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("lost", &self.lost.is_cancelled())
            .field("valid_until", &self.valid_until())
            .finish()
    }
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
        lease: guard.lease(),
    };
    // If this future is dropped here, the guard's drop stops the keep-alive and releases.
    let outcome = CatchUnwind(Box::pin(f(ctx))).await;
    let ended = guard.release_after_section().await;
    section_result(outcome, ended)
}

/// What a critical section returns: `f`'s `outcome` (a panic resumed, now that the lock is
/// released) unless the release after it (`ended`) says the lock was lost meanwhile.
pub(crate) fn section_result<T, E: From<Error>>(
    outcome: std::thread::Result<Result<T, E>>,
    ended: Result<(), Error>,
) -> Result<T, E> {
    let value = match outcome {
        Ok(value) => value,
        Err(panic) => resume_unwind(panic),
    };
    match ended {
        Ok(()) => value,
        Err(e @ Error::Expired { .. }) => Err(e.into()),
        Err(e) => {
            // `f` finished while the lock was valid; failing to release only delays the next
            // holder until the TTL. Report `f`'s result.
            tracing::warn!(error = %e, "release after critical section failed");
            value
        }
    }
}

/// Catches a panic while polling the inner future, so the lock is released before it resumes.
pub(crate) struct CatchUnwind<F>(pub(crate) Pin<Box<F>>);

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
