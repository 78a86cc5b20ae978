//! `NativeLocker`: a polling or queued locker, bound to its process.

use crate::bridge::*;
use crate::errors::*;
use crate::held::{Guard, Held};
use pyo3::prelude::*;
use std::future::Future;
use waitlock::{Error, LockOptions, Locker, Poll, Queue, Refresh};

/// The two lockers behind one class.
#[derive(Clone)]
pub(crate) enum Kind {
    Poll(Locker<Poll>),
    Queue(Locker<Queue>),
}

/// What to acquire.
#[derive(Clone)]
pub(crate) enum Target {
    Key(String),
    Permits {
        key: String,
        permits: u32,
        weight: u32,
    },
    Keys(Vec<String>),
}

/// A locker (polling or queued), bound to the process it was made in.
#[pyclass(module = "waitlock._native", frozen)]
pub(crate) struct NativeLocker {
    pub(crate) kind: Kind,
    pub(crate) pid: u32,
}

impl NativeLocker {
    fn options(ttl: f64, wait: f64, refresh: bool, ordered: bool) -> PyResult<LockOptions> {
        let mut o = LockOptions::new()
            .with_ttl(duration("ttl", ttl)?)
            .with_wait(duration("wait", wait)?);
        if !refresh {
            o = o.with_refresh(Refresh::Off);
        }
        if ordered {
            o = o.with_ordered_sets();
        }
        Ok(o)
    }

    /// The acquisition of `target` (one attempt when `wait` is zero), kept alive.
    fn acquire_fut(
        &self,
        target: Target,
        opts: LockOptions,
    ) -> PyResult<impl Future<Output = Result<Outcome, Error>> + Send + 'static> {
        same_process(self.pid, "locker")?;
        let kind = self.kind.clone();
        let pid = self.pid;
        Ok(async move {
            let wait = !opts.wait().is_zero();
            let guard = match &kind {
                Kind::Poll(l) => acquire(l, target, &opts, wait).await?,
                Kind::Queue(l) => acquire(l, target, &opts, wait).await?,
            };
            Ok(Outcome::Held(Held::new(guard, pid)))
        })
    }
}

pub(crate) async fn acquire<S: waitlock::strategy::Strategy>(
    l: &Locker<S>,
    target: Target,
    opts: &LockOptions,
    wait: bool,
) -> Result<Guard, Error> {
    Ok(match target {
        Target::Key(key) if wait => Guard::One(l.acquire_wait(&key, opts).await?),
        Target::Key(key) => Guard::One(l.acquire(&key, opts).await?),
        Target::Permits {
            key,
            permits,
            weight,
        } => {
            let sem = l.semaphore(permits)?;
            Guard::One(if wait {
                sem.acquire_wait(&key, weight, opts).await?
            } else {
                sem.acquire(&key, weight, opts).await?
            })
        }
        Target::Keys(keys) if wait => Guard::Set(l.acquire_many_wait(&keys, opts).await?),
        Target::Keys(keys) => Guard::Set(l.acquire_many(&keys, opts).await?),
    })
}

#[pymethods]
impl NativeLocker {
    /// Connects to `url` and builds a locker: queued (waiters queue in Redis, FIFO, and are
    /// handed the lock) or polling. Blocks until connected.
    #[new]
    #[pyo3(signature = (url, queued, prefix=None, command_timeout=None, label=None))]
    fn new(
        py: Python<'_>,
        url: String,
        queued: bool,
        prefix: Option<String>,
        command_timeout: Option<f64>,
        label: Option<String>,
    ) -> PyResult<Self> {
        let timeout = command_timeout
            .map(|t| duration("command_timeout", t))
            .transpose()?;
        let kind = block(py, async move {
            let mut b = Locker::connect(&url).await?;
            if let Some(p) = prefix {
                b = b.prefix(p);
            }
            if let Some(t) = timeout {
                b = b.command_timeout(t);
            }
            if let Some(l) = label {
                b = b.label(l);
            }
            Ok::<_, Error>(if queued {
                Kind::Queue(b.queued().build().await?)
            } else {
                Kind::Poll(b.build()?)
            })
        })?
        .map_err(|e| py_err(py, e))?;
        Ok(NativeLocker {
            kind,
            pid: std::process::id(),
        })
    }

    /// Whether waiters queue in Redis (a `PubSubLocker`).
    #[getter]
    fn queued(&self) -> bool {
        matches!(self.kind, Kind::Queue(_))
    }

    /// Acquires `key` (or `permits`' `weight` of it, or every key of `keys`), blocking.
    #[pyo3(signature = (key, ttl, wait, refresh=true, permits=None, weight=1, keys=None, ordered=false))]
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &self,
        py: Python<'_>,
        key: String,
        ttl: f64,
        wait: f64,
        refresh: bool,
        permits: Option<u32>,
        weight: u32,
        keys: Option<Vec<String>>,
        ordered: bool,
    ) -> PyResult<Py<PyAny>> {
        let opts = Self::options(ttl, wait, refresh, ordered)?;
        finish(
            py,
            self.acquire_fut(target(key, permits, weight, keys), opts)?,
        )
    }

    /// As `acquire`, started: `callback(held, error)` on `event_loop` when it ends.
    #[pyo3(signature = (event_loop, callback, key, ttl, wait, refresh=true, permits=None, weight=1, keys=None, ordered=false))]
    #[allow(clippy::too_many_arguments)]
    fn acquire_start(
        &self,
        event_loop: Py<PyAny>,
        callback: Py<PyAny>,
        key: String,
        ttl: f64,
        wait: f64,
        refresh: bool,
        permits: Option<u32>,
        weight: u32,
        keys: Option<Vec<String>>,
        ordered: bool,
    ) -> PyResult<Pending> {
        let opts = Self::options(ttl, wait, refresh, ordered)?;
        let fut = self.acquire_fut(target(key, permits, weight, keys), opts)?;
        start(event_loop, callback, fut)
    }

    /// What Redis holds for `key` now: `(held, fence, waiters)`.
    fn status(&self, py: Python<'_>, key: String) -> PyResult<(bool, Option<u64>, usize)> {
        same_process(self.pid, "locker")?;
        let kind = self.kind.clone();
        let s = block(py, async move {
            match &kind {
                Kind::Poll(l) => l.status(&key).await,
                Kind::Queue(l) => l.status(&key).await,
            }
        })?
        .map_err(|e| py_err(py, e))?;
        Ok((s.held, s.fence, s.queued))
    }

    /// Waits until the locker's background work (releases, queue departures) is done.
    fn idle(&self, py: Python<'_>) -> PyResult<()> {
        same_process(self.pid, "locker")?;
        let kind = self.kind.clone();
        block(py, async move {
            match &kind {
                Kind::Poll(l) => l.idle().await,
                Kind::Queue(l) => l.idle().await,
            }
        })
    }
}

pub(crate) fn target(
    key: String,
    permits: Option<u32>,
    weight: u32,
    keys: Option<Vec<String>>,
) -> Target {
    match (keys, permits) {
        (Some(keys), _) => Target::Keys(keys),
        (None, Some(permits)) => Target::Permits {
            key,
            permits,
            weight,
        },
        (None, None) => Target::Key(key),
    }
}
