//! How a locker's waiters wait: the type parameter of [`Locker`](crate::Locker).
//!
//! - [`Poll`]: retry with jittered exponential backoff. Nothing to set up; right when waiting
//!   is rare. Its waiters never jump the queue of [`Queue`] waiters on the same key: under
//!   sustained queued contention they wait until their deadline.
//! - [`Queue`]: queue in Redis (FIFO across processes) and be handed the lock by the
//!   release; one subscriber connection per locker. Right whenever waiting is common; use it
//!   for every locker that waits on a hot key.

use crate::error::Result;
use crate::hold::guard::LockGuard;
use crate::redis::Engine;
use crate::stats::WakeStats;
use crate::wait::notify::hub::Hub;
use crate::wait::{once, Request};
use std::future::Future;
use std::sync::Arc;
use tokio::time::Instant;

/// Waiting by polling (see the [module](self) docs).
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct Poll;

/// Waiting queued in Redis (see the [module](self) docs). Holds the locker's subscriber
/// connection.
#[derive(Clone)]
pub struct Queue {
    pub(crate) hub: Arc<Hub>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (keys, waiters) = self.hub.size();
        f.debug_struct("Queue")
            .field("keys", &keys)
            .field("waiters", &waiters)
            .finish_non_exhaustive()
    }
}

/// A waiting strategy: [`Poll`] or [`Queue`] (sealed).
pub trait Strategy: sealed::Wait {}

impl Strategy for Poll {}
impl Strategy for Queue {}

// The sealed pattern: `Wait` cannot be named outside the crate (nobody can implement
// `Strategy` or call these methods), though the compiler counts its methods as reachable
// through `Strategy`.
#[allow(private_interfaces)]
pub(crate) mod sealed {
    use super::*;

    /// What a strategy does; the one place the lockers differ.
    pub trait Wait: Clone + Send + Sync + 'static {
        /// The id of this locker's process in Redis (empty for a polling locker).
        fn process_id(&self) -> &str;

        /// Waits for the lock as the strategy does.
        fn wait<'a>(
            &'a self,
            engine: &'a Arc<Engine>,
            req: &'a Request,
        ) -> impl Future<Output = Result<LockGuard>> + Send + 'a;

        /// Why waiters woke (all zero for a polling locker).
        fn wakes(&self) -> WakeStats;

        /// The queued locker's hub (its waiters wait for a set at once through it); `None`
        /// for a polling locker.
        fn hub(&self) -> Option<&Arc<Hub>>;
    }

    impl Wait for Poll {
        fn process_id(&self) -> &str {
            ""
        }

        fn wait<'a>(
            &'a self,
            engine: &'a Arc<Engine>,
            req: &'a Request,
        ) -> impl Future<Output = Result<LockGuard>> + Send + 'a {
            crate::wait::poll(engine, req)
        }

        fn wakes(&self) -> WakeStats {
            WakeStats::default()
        }

        fn hub(&self) -> Option<&Arc<Hub>> {
            None
        }
    }

    impl Wait for Queue {
        fn process_id(&self) -> &str {
            &self.hub.pid
        }

        fn wait<'a>(
            &'a self,
            engine: &'a Arc<Engine>,
            req: &'a Request,
        ) -> impl Future<Output = Result<LockGuard>> + Send + 'a {
            crate::wait::notify::wait(engine, &self.hub, req)
        }

        fn wakes(&self) -> WakeStats {
            self.hub.counters.snapshot()
        }

        fn hub(&self) -> Option<&Arc<Hub>> {
            Some(&self.hub)
        }
    }
}

/// The way in for a lock's or permits' `acquire`: one attempt for `req` (or its validation
/// error), counted in the locker's stats.
#[tracing::instrument(name = "acquire", level = "debug", skip_all, fields(key = %key))]
pub(crate) async fn acquire(
    engine: &Arc<Engine>,
    key: &str,
    req: Result<Request>,
) -> Result<LockGuard> {
    let result = match req {
        Ok(req) => once(engine, &req).await,
        Err(e) => Err(e),
    };
    engine.meter.record(key, &result, None);
    result
}

/// The way in for a lock's or permits' `acquire_wait`: waits for `req` (or returns its
/// validation error) as `strategy` does, counted in the locker's stats and traced.
#[tracing::instrument(
    name = "acquire_wait",
    level = "debug",
    skip_all,
    fields(
        key = %key,
        locker = engine.meter.subject("").locker,
        waited_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
        fence = tracing::field::Empty,
    )
)]
pub(crate) async fn acquire_wait<S: Strategy>(
    engine: &Arc<Engine>,
    strategy: &S,
    key: &str,
    req: Result<Request>,
) -> Result<LockGuard> {
    let start = Instant::now();
    let result = match req {
        Ok(req) => strategy.wait(engine, &req).await,
        Err(e) => Err(e),
    };
    let waited = start.elapsed();
    engine.meter.record(key, &result, Some(waited));
    let span = tracing::Span::current();
    span.record("waited_ms", waited.as_secs_f64() * 1e3);
    match &result {
        Ok(g) => {
            span.record("outcome", "acquired");
            span.record("fence", g.fence());
        }
        Err(e) => {
            span.record("outcome", tracing::field::display(e));
        }
    }
    result
}
