#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod core;
mod error;
mod guard;
mod jitter;
mod keys;
mod locker;
mod options;
mod pubsub;
mod run;
mod tasks;

pub use error::{Error, LossReason, Result};
pub use guard::LockGuard;
pub use locker::{Locker, LockerBuilder, DEFAULT_COMMAND_TIMEOUT, DEFAULT_PREFIX};
pub use options::{Backoff, LockOptions};
pub use pubsub::{PubSubLocker, RegistrySize, WakeStats};
pub use run::LockContext;

/// The fred crate this crate is built on, for building clients of the same version.
pub use fred;
