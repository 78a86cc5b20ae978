//! `Held`: a held lock, kept alive until released, and its loss.

use crate::bridge::*;
use crate::errors::*;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use waitlock::{Error, LockGuard, LockSetGuard};

/// A held lock: one key's (or permits') guard, or a set's.
pub(crate) enum Guard {
    One(LockGuard),
    Set(LockSetGuard),
}

impl Guard {
    /// Why it was lost, as Python names it (None while held).
    fn loss(&self) -> Option<&'static str> {
        match self {
            Guard::One(g) => g.loss().map(reason),
            Guard::Set(s) => s.loss().map(|(_, r)| reason(r)),
        }
    }
}

/// `found`, kept in `why` the first time (a reason outlives the guard's release); else what
/// `why` kept.
fn remember(
    why: &std::sync::OnceLock<&'static str>,
    found: Option<&'static str>,
) -> Option<&'static str> {
    found
        .map(|w| *why.get_or_init(|| w))
        .or_else(|| why.get().copied())
}

/// Drops the guard in the runtime, where a guard's drop releases it in the background
/// (outside one it would only expire by its TTL).
fn let_go(guard: &Arc<tokio::sync::Mutex<Option<Guard>>>) {
    let guard = Arc::clone(guard);
    if let Ok(rt) = runtime() {
        rt.spawn(async move {
            guard.lock().await.take();
        });
    }
}

/// A held lock, kept alive in the background until released; its loss token fires the moment
/// it is lost.
#[pyclass(module = "waitlock._native", frozen)]
pub(crate) struct Held {
    pub(crate) guard: Arc<tokio::sync::Mutex<Option<Guard>>>,
    pub(crate) lost: CancellationToken,
    pub(crate) fences: Vec<(String, u64)>,
    pub(crate) token: String,
    pub(crate) pid: u32,
    /// Why it was lost, once read (the guard is gone after a release).
    pub(crate) why: Arc<std::sync::OnceLock<&'static str>>,
}

impl Held {
    pub(crate) fn new(mut guard: Guard, pid: u32) -> Held {
        let (lost, fences, token) = match &mut guard {
            Guard::One(g) => (
                g.keep_alive(),
                vec![(g.key().to_owned(), g.fence())],
                g.token().to_owned(),
            ),
            Guard::Set(s) => (
                s.lost(),
                s.guards()
                    .iter()
                    .map(|g| (g.key().to_owned(), g.fence()))
                    .collect(),
                s.guards()
                    .first()
                    .map(|g| g.token().to_owned())
                    .unwrap_or_default(),
            ),
        };
        Held {
            guard: Arc::new(tokio::sync::Mutex::new(Some(guard))),
            lost,
            fences,
            token,
            pid,
            why: Arc::default(),
        }
    }

    /// The release, its guard taken out of this `Held` before the future first runs: a
    /// release cancelled at once (an asyncio task cancelled right after `release_start`, whose
    /// future is then dropped unpolled) still lets the lock go, since the guard drops with the
    /// future and a dropped guard releases in the background. Kept inside until the first
    /// poll, a cancelled release left the lock held, and refreshed, for as long as the `Held`
    /// lived (a cancelled task's traceback keeps it): its waiters waited out their deadlines.
    /// While an extend of this `Held` is in flight, the guard is taken when it ends, by a task
    /// of its own that a cancellation does not stop (what it takes drops with it then).
    fn release_fut(
        &self,
    ) -> PyResult<impl Future<Output = Result<Outcome, Error>> + Send + 'static> {
        same_process(self.pid, "held lock")?;
        // (The runtime first: without one, the guard stays in this `Held`.)
        let rt = runtime()?;
        let key = self.key();
        let taken = match self.guard.try_lock() {
            Ok(mut g) => Ok(g.take()),
            Err(_) => {
                let guard = Arc::clone(&self.guard);
                Err(rt.spawn(async move { guard.lock().await.take() }))
            }
        };
        Ok(async move {
            let guard = match taken {
                Ok(g) => g,
                // (The task never panics nor is aborted: an error would mean nothing taken.)
                Err(task) => task.await.unwrap_or(None),
            };
            match guard {
                Some(Guard::One(g)) => g.release().await?,
                Some(Guard::Set(s)) => s.release().await?,
                None => return Err(Error::NotHeld { key }),
            }
            Ok(Outcome::Unit)
        })
    }

    fn extend_fut(
        &self,
        ttl: Duration,
    ) -> PyResult<impl Future<Output = Result<Outcome, Error>> + Send + 'static> {
        same_process(self.pid, "held lock")?;
        let guard = Arc::clone(&self.guard);
        let key = self.key();
        Ok(async move {
            match guard.lock().await.as_mut() {
                Some(Guard::One(g)) => g.extend(ttl).await?,
                Some(Guard::Set(s)) => s.extend(ttl).await?,
                None => return Err(Error::NotHeld { key }),
            }
            Ok(Outcome::Unit)
        })
    }

    /// Why it was lost, read from the guard once and kept (None while the guard is busy
    /// with a call, or held).
    fn reason_now(&self) -> Option<&'static str> {
        if let Some(why) = self.why.get() {
            return Some(why);
        }
        let found = self.guard.try_lock().ok()?.as_ref()?.loss();
        remember(&self.why, found)
    }
}

#[pymethods]
impl Held {
    /// The key (a set's first key).
    #[getter]
    fn key(&self) -> String {
        self.fences.first().map(|f| f.0.clone()).unwrap_or_default()
    }

    /// The keys held, in the order taken.
    #[getter]
    fn keys(&self) -> Vec<String> {
        self.fences.iter().map(|f| f.0.clone()).collect()
    }

    /// The fence of this acquisition (a set's first key's): higher than every earlier one's.
    #[getter]
    fn fence(&self) -> u64 {
        self.fences.first().map_or(0, |f| f.1)
    }

    /// Each key's fence, in the order taken.
    #[getter]
    fn fences(&self) -> Vec<(String, u64)> {
        self.fences.clone()
    }

    /// The holder's token.
    #[getter]
    fn token(&self) -> String {
        self.token.clone()
    }

    /// Why the lock was lost (`token_gone`, `unreachable`, `ttl_elapsed`, `not_replicated`),
    /// or None while it is held (and after a release).
    #[getter]
    fn lost(&self) -> Option<&'static str> {
        if !self.lost.is_cancelled() {
            return None;
        }
        self.reason_now().or(Some("lost"))
    }

    /// Blocks until the lock is lost (its reason) or `timeout` seconds pass (None).
    #[pyo3(signature = (timeout=None))]
    fn wait_lost(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<&'static str>> {
        let limit = timeout.map(|t| duration("timeout", t)).transpose()?;
        let lost = self.lost.clone();
        let gone = block(py, async move {
            match limit {
                Some(l) => tokio::time::timeout(l, lost.cancelled()).await.is_ok(),
                None => {
                    lost.cancelled().await;
                    true
                }
            }
        })?;
        Ok(if gone { self.lost() } else { None })
    }

    /// As `wait_lost` without a limit, started: `callback(reason, error)` when it is lost.
    fn wait_lost_start(&self, event_loop: Py<PyAny>, callback: Py<PyAny>) -> PyResult<Pending> {
        let lost = self.lost.clone();
        let guard = Arc::clone(&self.guard);
        let kept = Arc::clone(&self.why);
        start(event_loop, callback, async move {
            lost.cancelled().await;
            let found = guard.lock().await.as_ref().and_then(Guard::loss);
            Ok(Outcome::Reason(remember(&kept, found).or(Some("lost"))))
        })
    }

    /// Releases the lock (every key of a set), blocking. Raises `NotHeld` when it no longer
    /// held it (lost, or released already).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        finish(py, self.release_fut()?).map(drop)
    }

    /// As `release`, started.
    fn release_start(&self, event_loop: Py<PyAny>, callback: Py<PyAny>) -> PyResult<Pending> {
        start(event_loop, callback, self.release_fut()?)
    }

    /// Extends the lease to `ttl` seconds from now, blocking.
    fn extend(&self, py: Python<'_>, ttl: f64) -> PyResult<()> {
        finish(py, self.extend_fut(duration("ttl", ttl)?)?).map(drop)
    }

    /// As `extend`, started.
    fn extend_start(
        &self,
        event_loop: Py<PyAny>,
        callback: Py<PyAny>,
        ttl: f64,
    ) -> PyResult<Pending> {
        start(
            event_loop,
            callback,
            self.extend_fut(duration("ttl", ttl)?)?,
        )
    }

    /// Lets the lock go in the background (what dropping it does).
    fn discard(&self) {
        if self.pid == std::process::id() {
            let_go(&self.guard);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A held lock of a parent process is left alone (its connections are the parent's).
        if self.pid != std::process::id() {
            if let Ok(mut g) = self.guard.try_lock() {
                std::mem::forget(g.take());
            }
            return;
        }
        let_go(&self.guard);
    }
}
