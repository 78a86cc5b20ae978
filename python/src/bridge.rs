//! One runtime per process, and the two ways an operation runs: blocking, or started with
//! a callback on an asyncio loop.

use crate::errors::*;
use crate::held::Held;
use pyo3::prelude::*;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use waitlock::Error;

/// The process's runtime, and the process it was made in.
static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);

/// This process's runtime, made on first use. A forked child makes its own: the parent's
/// threads are not in the child, so the parent's runtime is left as it is (never dropped:
/// dropping it would wait for threads that do not exist).
pub(crate) fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((made_in, rt)) = *slot {
        if made_in == pid {
            return Ok(rt);
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("waitlock")
        .enable_all()
        .build()
        .map_err(|e| WaitlockError::new_err(format!("cannot start waitlock's runtime: {e}")))?;
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Refuses an object made in another process (before a fork).
pub(crate) fn same_process(made_in: u32, what: &str) -> PyResult<()> {
    if made_in == std::process::id() {
        return Ok(());
    }
    Err(ForkError::new_err(format!(
        "this {what} was made in process {made_in}, before a fork(); its connections belong \
         to that process. Make lockers in the process that uses them (in a worker pool: in \
         the worker's initializer, after the fork)"
    )))
}

/// Runs `fut` on the runtime and blocks this thread until it ends, the GIL released; on the
/// main thread a signal (Ctrl-C) cancels it (its future is dropped) and raises.
pub(crate) fn block<F, T>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let rt = runtime()?;
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(WaitlockError::new_err(
            "a blocking waitlock call from one of waitlock's own threads: use the awaitable one",
        ));
    }
    // Polled on this thread (`block_on`, the GIL released), so a grant wakes it directly, with
    // no hop through a task and a channel; in slices of 50 ms, between which a signal is
    // looked for. Dropped here when a signal ends it, inside the runtime: what a dropped
    // operation leaves to clean up (a queued waiter's leave, a taken guard's release) is
    // spawned there, and found no runtime on this thread.
    let mut fut = Box::pin(fut);
    loop {
        let slice = || {
            rt.block_on(async { tokio::time::timeout(Duration::from_millis(50), &mut fut).await })
        };
        match py.detach(slice) {
            Ok(v) => return Ok(v),
            Err(_) => {
                if let Err(signal) = py.check_signals() {
                    let _inside = rt.enter();
                    drop(fut);
                    return Err(signal);
                }
            }
        }
    }
}

/// Runs the operation `fut` blocking (see [`block`]): its value for Python, or its error as
/// the Python exception of its kind.
pub(crate) fn finish<F>(py: Python<'_>, fut: F) -> PyResult<Py<PyAny>>
where
    F: Future<Output = Result<Outcome, Error>> + Send + 'static,
{
    block(py, fut)?.map_err(|e| py_err(py, e))?.into_py(py)
}

/// A started operation (see the module's text).
#[pyclass(module = "waitlock._native", frozen)]
pub(crate) struct Pending {
    pub(crate) task: tokio::task::AbortHandle,
}

#[pymethods]
impl Pending {
    /// Cancels the operation: its future is dropped on the runtime (the library's cancel
    /// safety applies: a queued waiter leaves its queue, a grant is given back). A result that
    /// was on its way still reaches the callback.
    fn cancel(&self) {
        self.task.abort();
    }
}

/// The interpreter is shutting down (`shutdown`, which the package registers with `atexit`),
/// and how many threads are attaching to it to deliver a callback (`start`). A thread that
/// attaches while the interpreter finalizes aborts the process ("PyGILState_Release: thread
/// state must be current", seen 1 exit in 30 of a script whose cancelled tasks' callbacks were
/// on their way): after `shutdown` none attaches, and `shutdown` lets those already on their
/// way finish first.
static CLOSING: AtomicBool = AtomicBool::new(false);
static ATTACHING: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` attached to Python, unless the interpreter is shutting down (then what `f` would
/// have delivered is dropped: a held lock is released in the background).
fn attach_unless_closing(f: impl FnOnce(Python<'_>)) {
    ATTACHING.fetch_add(1, Ordering::SeqCst);
    if !CLOSING.load(Ordering::SeqCst) {
        Python::attach(f);
    }
    ATTACHING.fetch_sub(1, Ordering::SeqCst);
}

/// Called at interpreter exit (`atexit`): no callback attaches from now on; those on their way
/// finish first (the GIL released meanwhile, one second at most).
#[pyfunction]
pub(crate) fn shutdown(py: Python<'_>) {
    CLOSING.store(true, Ordering::SeqCst);
    py.detach(|| {
        let until = Instant::now() + Duration::from_secs(1);
        while ATTACHING.load(Ordering::SeqCst) > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// Starts `fut` on the runtime; when it ends, `callback(value, error)` is scheduled on
/// `event_loop` (from a blocking thread: the runtime's own threads never wait for the GIL).
pub(crate) fn start<F>(event_loop: Py<PyAny>, callback: Py<PyAny>, fut: F) -> PyResult<Pending>
where
    F: Future<Output = Result<Outcome, Error>> + Send + 'static,
{
    let task = runtime()?.spawn(async move {
        let out = fut.await;
        let _ = tokio::task::spawn_blocking(move || {
            attach_unless_closing(|py| {
                let (value, error) = match out {
                    Ok(o) => match o.into_py(py) {
                        Ok(v) => (v, py.None()),
                        Err(e) => (py.None(), e.into_value(py).into_any()),
                    },
                    Err(e) => (py.None(), py_err(py, e).into_value(py).into_any()),
                };
                // A closed loop has nobody to tell: the value is dropped (a held lock is then
                // released in the background).
                let _ =
                    event_loop.call_method1(py, "call_soon_threadsafe", (callback, value, error));
            })
        })
        .await;
    });
    Ok(Pending {
        task: task.abort_handle(),
    })
}

/// What an operation gives Python.
pub(crate) enum Outcome {
    Held(Held),
    Unit,
    Reason(Option<&'static str>),
}

impl Outcome {
    pub(crate) fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Outcome::Held(h) => Py::new(py, h)?.into_any(),
            Outcome::Unit => py.None(),
            Outcome::Reason(r) => r.into_pyobject(py)?.into_any().unbind(),
        })
    }
}
