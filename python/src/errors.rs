//! The library's errors as Python exceptions, and the conversions the others share.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::BoundObject;
use std::time::Duration;
use waitlock::{Error, LossReason};

create_exception!(
    waitlock,
    WaitlockError,
    PyException,
    "Any waitlock failure."
);
create_exception!(
    waitlock,
    WaitTimeout,
    WaitlockError,
    "The wait ran out before the lock was ours (`key`, `waited` seconds, `attempts`)."
);
create_exception!(
    waitlock,
    Locked,
    WaitlockError,
    "One attempt (wait=0) found the lock held (`key`, `remaining_ttl` seconds or None)."
);
create_exception!(
    waitlock,
    Expired,
    WaitlockError,
    "The lock was lost while held (`key`, `reason`: token_gone, unreachable, ttl_elapsed, not_replicated)."
);
create_exception!(
    waitlock,
    NotHeld,
    WaitlockError,
    "The lock is not held by this holder any more (`key`)."
);
create_exception!(
    waitlock,
    ConnectError,
    WaitlockError,
    "Redis could not be reached, or cannot hold locks."
);
create_exception!(
    waitlock,
    InvalidArgument,
    WaitlockError,
    "A setting, an option or a key was refused (`key`, `field`)."
);
create_exception!(
    waitlock,
    RedisError,
    WaitlockError,
    "Redis failed or did not answer in time (`key`)."
);
create_exception!(
    waitlock,
    ForkError,
    WaitlockError,
    "A locker or a held lock made before fork() was used in the child process."
);

pub(crate) fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The duration of `s` seconds, refused when negative or not a number.
pub(crate) fn duration(field: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| {
        InvalidArgument::new_err(format!(
            "{field} = {s}: must be a number of seconds, zero or more"
        ))
    })
}

pub(crate) fn reason(r: LossReason) -> &'static str {
    match r {
        LossReason::TokenGone => "token_gone",
        LossReason::Unreachable => "unreachable",
        LossReason::TtlElapsed => "ttl_elapsed",
        LossReason::NotReplicated => "not_replicated",
        _ => "lost",
    }
}

/// `v` as a Python object (None if it cannot be one).
pub(crate) fn obj<'py, T: IntoPyObject<'py>>(py: Python<'py>, v: T) -> Py<PyAny> {
    v.into_pyobject(py)
        .map(|o| o.into_any().unbind())
        .unwrap_or_else(|_| py.None())
}

/// The library's error as the Python exception of its kind, with its fields as attributes.
pub(crate) fn py_err(py: Python<'_>, e: Error) -> PyErr {
    let msg = e.to_string();
    let key = e.key().to_owned();
    let mut attrs: Vec<(&str, Py<PyAny>)> = Vec::new();
    let err = match &e {
        Error::WaitTimeout {
            waited, attempts, ..
        } => {
            attrs.push(("waited", obj(py, secs(*waited))));
            attrs.push(("attempts", obj(py, attempts)));
            WaitTimeout::new_err(msg)
        }
        Error::Locked { remaining_ttl, .. } | Error::AlreadyHeld { remaining_ttl, .. } => {
            let ttl = remaining_ttl.map(secs);
            attrs.push(("remaining_ttl", obj(py, ttl)));
            Locked::new_err(msg)
        }
        Error::Expired { reason: r, .. } => {
            attrs.push(("reason", obj(py, reason(*r))));
            Expired::new_err(msg)
        }
        Error::NotHeld { .. } => NotHeld::new_err(msg),
        Error::InvalidSetting { field, .. } | Error::InvalidOptions { field, .. } => {
            attrs.push(("field", obj(py, field)));
            InvalidArgument::new_err(msg)
        }
        Error::InvalidKey { .. } => InvalidArgument::new_err(msg),
        Error::Connect { .. } => ConnectError::new_err(msg),
        _ => RedisError::new_err(msg),
    };
    let value = err.value(py);
    let _ = value.setattr("key", key);
    for (name, v) in attrs {
        let _ = value.setattr(name, v);
    }
    err
}
