//! A concurrency limit shared by a fleet (feature `tower`): at most N requests in flight across
//! every instance of a service, over a [`Semaphore`], for [tower] services.
//!
//! Named and shaped after tower's own `tower::limit::ConcurrencyLimitLayer`: the layer wraps a
//! service; `poll_ready` waits for a permit (FIFO across the fleet with a queued locker) and
//! only then for the inner service; `call` hands the permit to the response future, which gives
//! it back when it completes or is dropped. Unlike tower's in-process limit:
//! - the wait has a deadline, the [`LockOptions`]' `wait`: a request that does not get a
//!   permit by then fails with [`Error::WaitTimeout`] in `poll_ready` (load shedding: the
//!   caller answers it at once, e.g. with 503, instead of queueing without bound);
//! - a request whose permit is lost while it runs (its lease could not be refreshed: Redis
//!   unreachable past the validity deadline, the permit taken away) is cancelled: the inner
//!   future is dropped and the response is [`Error::Expired`].
//!
//! Errors are boxed (`tower::BoxError`); downcast them to [`Error`] to tell the two apart from
//! the inner service's own.
//!
//! [tower]: https://docs.rs/tower

use crate::error::{Error, LossReason, Result};
use crate::hold::guard::LockGuard;
use crate::options::LockOptions;
use crate::permits::Semaphore;
use crate::wait::strategy::{Queue, Strategy};
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio_util::sync::WaitForCancellationFutureOwned;

/// The error type of [`ConcurrencyLimit`]: the inner service's, or an [`Error`], boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Wraps services in a [`ConcurrencyLimit`]: at most `semaphore.permits()` requests in flight
/// on `key` across every service that uses the same key, on every host.
#[derive(Clone)]
pub struct ConcurrencyLimitLayer<S: Strategy = Queue> {
    semaphore: Semaphore<S>,
    key: String,
    opts: LockOptions,
}

impl<S: Strategy> ConcurrencyLimitLayer<S> {
    /// A layer that takes one of `semaphore`'s permits of `key` per request, with `opts`
    /// (their `wait` is the deadline after which a request is shed; their TTL the permit's
    /// lease, refreshed while the request runs). A [`Queue`] locker's semaphore serves the
    /// waiting requests of the whole fleet in order.
    pub fn new(semaphore: Semaphore<S>, key: impl Into<String>, opts: LockOptions) -> Self {
        ConcurrencyLimitLayer {
            semaphore,
            key: key.into(),
            opts,
        }
    }
}

impl<S: Strategy> std::fmt::Debug for ConcurrencyLimitLayer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("key", &self.key)
            .field("permits", &self.semaphore.permits())
            .field("opts", &self.opts)
            .finish()
    }
}

impl<S: Strategy + Clone, T> tower_layer::Layer<T> for ConcurrencyLimitLayer<S> {
    type Service = ConcurrencyLimit<T, S>;

    fn layer(&self, inner: T) -> Self::Service {
        ConcurrencyLimit {
            inner,
            semaphore: self.semaphore.clone(),
            key: self.key.clone(),
            opts: self.opts.clone(),
            state: State::Empty,
        }
    }
}

type Acquiring = Pin<Box<dyn Future<Output = Result<LockGuard>> + Send>>;

enum State {
    /// No permit, none asked for.
    Empty,
    /// Waiting for a permit.
    Waiting(Acquiring),
    /// A permit is held for the next `call`.
    Ready(LockGuard),
}

/// A service that runs at most N of its requests at once across the fleet (see the
/// [module](self)). A clone starts without a permit, as tower's `ConcurrencyLimit`'s does.
pub struct ConcurrencyLimit<T, S: Strategy = Queue> {
    inner: T,
    semaphore: Semaphore<S>,
    key: String,
    opts: LockOptions,
    state: State,
}

impl<T, S: Strategy> std::fmt::Debug for ConcurrencyLimit<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.state {
            State::Empty => "no permit",
            State::Waiting(_) => "waiting for a permit",
            State::Ready(_) => "holds a permit",
        };
        f.debug_struct("ConcurrencyLimit")
            .field("key", &self.key)
            .field("permits", &self.semaphore.permits())
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

impl<T: Clone, S: Strategy + Clone> Clone for ConcurrencyLimit<T, S> {
    fn clone(&self) -> Self {
        ConcurrencyLimit {
            inner: self.inner.clone(),
            semaphore: self.semaphore.clone(),
            key: self.key.clone(),
            opts: self.opts.clone(),
            state: State::Empty,
        }
    }
}

impl<T, S, Request> tower_service::Service<Request> for ConcurrencyLimit<T, S>
where
    T: tower_service::Service<Request>,
    T::Error: Into<BoxError>,
    S: Strategy + Clone + Send + Sync + 'static,
{
    type Response = T::Response;
    type Error = BoxError;
    type Future = ResponseFuture<T::Future>;

    /// Waits for a permit (up to the options' `wait`: then [`Error::WaitTimeout`], and the next
    /// call waits again), then for the inner service. Dropping the service while it waits
    /// leaves the queue, as a dropped `acquire_wait` does.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), BoxError>> {
        loop {
            match &mut self.state {
                State::Ready(_) => return self.inner.poll_ready(cx).map_err(Into::into),
                State::Empty => {
                    let (sem, key, opts) =
                        (self.semaphore.clone(), self.key.clone(), self.opts.clone());
                    self.state =
                        State::Waiting(Box::pin(
                            async move { sem.acquire_wait(&key, 1, &opts).await },
                        ));
                }
                State::Waiting(acquiring) => match ready!(acquiring.as_mut().poll(cx)) {
                    Ok(guard) => self.state = State::Ready(guard),
                    Err(e) => {
                        self.state = State::Empty;
                        return Poll::Ready(Err(Box::new(e)));
                    }
                },
            }
        }
    }

    /// Runs the request with the permit `poll_ready` got, refreshed while it runs. Without one
    /// (`poll_ready` was not called, or did not say ready) the response is an error
    /// ([`Error::InvalidSetting`] naming `poll_ready`), not a panic.
    fn call(&mut self, request: Request) -> Self::Future {
        match std::mem::replace(&mut self.state, State::Empty) {
            State::Ready(mut guard) => {
                let lost = guard.keep_alive().cancelled_owned();
                ResponseFuture {
                    inner: Some(Box::pin(self.inner.call(request))),
                    lost: Some(Box::pin(lost)),
                    guard: Some(guard),
                    key: self.key.clone(),
                }
            }
            other => {
                self.state = other;
                ResponseFuture {
                    inner: None,
                    lost: None,
                    guard: None,
                    key: self.key.clone(),
                }
            }
        }
    }
}

/// The response of a [`ConcurrencyLimit`]: the inner service's, with the permit held until it
/// completes or is dropped (the permit is then given back in the background).
pub struct ResponseFuture<F> {
    inner: Option<Pin<Box<F>>>,
    lost: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    guard: Option<LockGuard>,
    key: String,
}

impl<F> std::fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("key", &self.key)
            .field("running", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = std::result::Result<R, E>>,
    E: Into<BoxError>,
{
    type Output = std::result::Result<R, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(Err(Box::new(Error::invalid_setting(
                "poll_ready",
                "not ready",
                "must have said ready before call",
            ))));
        };
        if let Poll::Ready(out) = inner.as_mut().poll(cx) {
            this.inner = None;
            // Given back in the background (the guard's drop).
            this.guard = None;
            return Poll::Ready(out.map_err(Into::into));
        }
        if let Some(lost) = this.lost.as_mut() {
            if lost.as_mut().poll(cx).is_ready() {
                let reason = this
                    .guard
                    .as_ref()
                    .and_then(LockGuard::loss)
                    .unwrap_or(LossReason::Unreachable);
                this.inner = None;
                this.lost = None;
                this.guard = None;
                return Poll::Ready(Err(Box::new(Error::Expired {
                    key: std::mem::take(&mut this.key),
                    reason,
                })));
            }
        }
        Poll::Pending
    }
}
