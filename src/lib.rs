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
mod status;
mod tasks;

pub use error::{Error, LossReason, Result};
pub use guard::LockGuard;
pub use locker::{Locker, LockerBuilder, DEFAULT_COMMAND_TIMEOUT, DEFAULT_PREFIX};
pub use options::{Backoff, LockOptions};
pub use pubsub::{PubSubLocker, RegistrySize, WakeStats};
pub use run::LockContext;
pub use status::LockStatus;

/// The Lua scripts behind every lock, as sent to Redis (for audits, preloading with
/// `SCRIPT LOAD`, or measuring Redis' own ceiling with `redis-benchmark`).
pub mod scripts {
    /// Acquire: `KEYS` lock, fence; `ARGV` token, ttl ms, fence-counter ttl ms.
    pub const ACQUIRE: &str = crate::core::ACQUIRE_LUA;
    /// Extend: `KEYS` lock; `ARGV` token, ttl ms.
    pub const EXTEND: &str = crate::core::EXTEND_LUA;
    /// Release: `KEYS` lock, channel, fence; `ARGV` token. Publishes `"<fence> <subscribers>"`.
    pub const RELEASE: &str = crate::core::RELEASE_LUA;
}

/// The fred crate this crate is built on, for building clients of the same version.
pub use fred;
