//! Holding a lock: the guard, its lease and refresh, and critical sections.

pub(crate) mod guard;
pub(crate) mod lease;
pub(crate) mod refresh;
pub(crate) mod run;
