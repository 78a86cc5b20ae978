//! `waitlock._native`: the Rust library behind the Python package. The Python side
//! (`python/waitlock/__init__.py`) wraps it in Python's idiom, blocking and asyncio alike; this
//! module only runs the library's futures on one background runtime per process and carries
//! their results over.
//!
//! Every operation exists twice: `op(...)` blocks the calling thread (the GIL released, Ctrl-C
//! honoured on the main thread), and `op_start(loop, callback, ...)` starts it and returns a
//! [`Pending`] at once; the callback is scheduled on `loop` with `(value, error)` when it ends.
//! Cancelling a `Pending` drops the operation's future, whose cancel safety (the library's)
//! leaves nothing behind.
//!
//! Fork: the runtime's threads do not survive `fork()`. The runtime is made per process (a
//! child makes its own on first use, the parent's is left alone), and a locker or a held lock
//! made before the fork refuses to be used in the child (`ForkError`): its connections belong
//! to the parent.

mod bridge;
mod errors;
mod held;
mod locker;

use bridge::Pending;
use errors::*;
use held::Held;
use locker::NativeLocker;
use pyo3::prelude::*;

/// The native half of the `waitlock` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<NativeLocker>()?;
    m.add_class::<Held>()?;
    m.add_class::<Pending>()?;
    m.add_function(wrap_pyfunction!(bridge::shutdown, m)?)?;
    m.add("WaitlockError", py.get_type::<WaitlockError>())?;
    m.add("WaitTimeout", py.get_type::<WaitTimeout>())?;
    m.add("Locked", py.get_type::<Locked>())?;
    m.add("Expired", py.get_type::<Expired>())?;
    m.add("NotHeld", py.get_type::<NotHeld>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("InvalidArgument", py.get_type::<InvalidArgument>())?;
    m.add("RedisError", py.get_type::<RedisError>())?;
    m.add("ForkError", py.get_type::<ForkError>())?;
    Ok(())
}
