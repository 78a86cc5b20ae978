#![doc = include_str!("../README.md")]
#![warn(missing_docs, missing_debug_implementations)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod builder;
mod election;
mod error;
mod hold;
mod keys;
mod limits;
mod locker;
pub mod metrics;
mod options;
mod permits;
mod redis;
mod sets;
mod stats;
mod status;
mod tasks;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
mod wait;

pub use builder::{
    default_label, LockerBuilder, DEFAULT_CLAIM_WINDOW, DEFAULT_COMMAND_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_PRESENCE_WINDOW, DEFAULT_RETENTION,
};
pub use election::{Election, Leader, Leadership};
pub use error::{ConnectStep, Error, LossReason, Op, Result};
pub use hold::guard::LockGuard;
pub use hold::run::LockContext;
pub use limits::{MAX_LABEL_LEN, MAX_PERMITS, MAX_SET_KEYS, MAX_VALUE_LEN, STATUS_WAITERS};
pub use locker::Locker;
pub use options::{Backoff, LockOptions, Refresh};
pub use permits::{PermitStatus, RwLock, Semaphore};
#[cfg(feature = "tls-rustls")]
#[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
pub use redis::TlsOptions;
pub use redis::{redact_url, ConnectOptions};
pub use sets::{LockSetContext, LockSetGuard};
pub use stats::{LockerStats, RegistrySize, WaitSummary, WakeStats};
pub use status::{Holder, LeaseHolder, LockStatus, Waiter};
pub use wait::strategy::{self, Poll, Queue};

/// The queued locker, under the name its first users know: waiters queue FIFO in Redis, share
/// one subscriber connection per locker, and are **handed** the lock by the release, which
/// publishes the grant on the waiter's channel (the waiter holds the lock when the message
/// arrives; nobody polls).
///
/// The same type as [`Locker<Queue>`](Locker): every method of [`Locker`] is here
/// ([`acquire_wait`](Locker::acquire_wait), [`run`](Locker::run), [`acquire`](Locker::acquire),
/// [`status`](Locker::status), [`semaphore`](Locker::semaphore), [`election`](Locker::election),
/// ...), and [`from_url`](Locker::from_url) / [`from_client`](Locker::from_client) build one
/// with the defaults. For other settings, build it with
/// `Locker::connect(url).await?.prefix("myapp:").queued().build().await?` (or
/// [`Locker::builder`] on a fred client you have); the result is a `PubSubLocker`.
///
/// # Examples
/// ```no_run
/// # async fn example() -> waitlock::Result<()> {
/// use std::time::Duration;
/// use waitlock::{LockOptions, PubSubLocker};
///
/// let locker = PubSubLocker::from_url("redis://127.0.0.1:6379").await?;
/// let opts = LockOptions::new()
///     .with_ttl(Duration::from_secs(30))
///     .with_wait(Duration::from_secs(10));
/// let done = locker
///     .run("resource-key", &opts, |ctx| async move {
///         // the critical section; ctx.lost is cancelled the moment the lock is lost
///         Ok::<_, waitlock::Error>(ctx.fence)
///     })
///     .await?;
/// let guard = locker.acquire_wait("resource-key", &opts).await?;
/// guard.release().await?;
/// # let _ = done; Ok(()) }
/// ```
pub type PubSubLocker = Locker<Queue>;

/// The Lua scripts behind every lock, as sent to Redis (for audits, preloading with
/// `SCRIPT LOAD`, or measuring Redis' own ceiling with `redis-benchmark`).
///
/// Each starts with the same prelude, the queue layer, then the lock's or the permits' own
/// (protocol format 3). `KEYS` are always lock `{pk}`, fence
/// `{pk}:fence`, queue `{pk}:q`, processes `{pk}:p`; `ARGV` always token, ttl ms, retention
/// ms, claim window ms, presence window ms, queue member (`"<process id> <ttl ms> <token>"`, or
/// empty), process id (or empty), flag, fence (or empty). `docs/design.md` describes them.
pub mod scripts {
    /// Acquire (SET NX PX plus a fence); when held and a member is given, queue it.
    pub const ACQUIRE: &str = crate::redis::scripts::ACQUIRE;
    /// Extend the TTL if the token holds the lock (confirming a grant).
    pub const EXTEND: &str = crate::redis::scripts::EXTEND;
    /// Release: hand the lock to the oldest live queued waiter (publishing the grant on its
    /// channel), or delete it.
    pub const RELEASE: &str = crate::redis::scripts::RELEASE;
    /// A waiter leaves the queue and gives back what its token holds (flag `G`), or only a
    /// grant with a given fence (flag `o`).
    pub const LEAVE: &str = crate::redis::scripts::LEAVE;
    /// Status: reads the lock, its fence and its queue length.
    pub const STATUS: &str = crate::redis::scripts::STATUS;
    /// Refresh many locks in one call (the refresher's batches; no prelude): `KEYS` lock 1,
    /// fence 1, lock 2, fence 2, ...; `ARGV` retention ms, then token, ttl ms per lock. One
    /// reply code per lock: 0 not held, 1 refreshed, 6 left alone (refresh it with [`EXTEND`]).
    pub const REFRESH: &str = crate::redis::scripts::REFRESH;
    /// Take a set of free locks in one call, all or none (no prelude): `KEYS` lock 1, fence 1,
    /// lock 2, fence 2, ... (at most 256 locks); `ARGV` retention ms, ttl ms, then a token per
    /// lock. Reply `{0, fence 1, fence 2, ...}` all taken, `{2, i, pttl}` lock i held,
    /// `{2, i, -3}` lock i free with waiters queued, `{7, i, 1 | 2}` lock i's key (or fence
    /// counter) of another type; nothing written unless all are taken. With ttl `check`: only
    /// a look (`{0}` where it would take them all).
    pub const TAKE_SET: &str = crate::redis::scripts::TAKE_SET;
    /// Give back many locks taken free in one call (no prelude): `KEYS` lock 1, lock 2, ...;
    /// `ARGV` a token per lock. One reply code per lock: 0 not held, 1 deleted (state `p`), 6
    /// left alone (release it with [`RELEASE`]).
    pub const GIVE_BACK: &str = crate::redis::scripts::GIVE_BACK;
    /// A set of locks on one node (one Cluster slot, or a single server) waited for at once:
    /// takes every key, or queues the set's member (`"<process id> <ttl ms>* <token>
    /// <locks>"`, each lock name as `<length>:<name>`, the first key's first) once in every
    /// key's queue. `KEYS` lock, fence, queue, processes of each key; `ARGV` as above. Reply
    /// `{0 | 1 | 3, ttl, fence 1, fence 2, ...}` held (taken, already held, a short grant
    /// confirmed), `{2, pttl, 0, i}` key i held, `{2, pttl, 1, listening, fence, watching,
    /// time, depth, i}` queued (waiting for key i first), `{4, i}` release key i and try
    /// again.
    pub const SET_ACQUIRE: &str = crate::redis::scripts::SET_ACQUIRE;
    /// Release every key of a set (`KEYS` as [`SET_ACQUIRE`]): one reply code per key as
    /// [`RELEASE`]'s, or `{4}` (call again).
    pub const SET_RELEASE: &str = crate::redis::scripts::SET_RELEASE;
    /// A set's waiter leaves every queue (`KEYS` as [`SET_ACQUIRE`], flags as [`LEAVE`]; the
    /// fence of flag `o` is the grant's fences, `f1,f2,...`).
    pub const SET_LEAVE: &str = crate::redis::scripts::SET_LEAVE;
    /// Permits (a semaphore's, a read-write lock's): acquire, queueing when given a member.
    /// `KEYS` are holders `{pk}:s`, state `{pk}:s:fence`, queue `{pk}:s:q`, processes
    /// `{pk}:s:p`, holder fences `{pk}:s:f`; `ARGV` as above, then the key's permits. The
    /// token is `w<weight>:<id>`.
    pub const PERMIT_ACQUIRE: &str = crate::redis::scripts::PERMIT_ACQUIRE;
    /// Permits: the holder's lease is the TTL again.
    pub const PERMIT_EXTEND: &str = crate::redis::scripts::PERMIT_EXTEND;
    /// Permits: give them back; grant to the waiters that now fit.
    pub const PERMIT_RELEASE: &str = crate::redis::scripts::PERMIT_RELEASE;
    /// Permits: a waiter leaves the queue (flags as [`LEAVE`]).
    pub const PERMIT_LEAVE: &str = crate::redis::scripts::PERMIT_LEAVE;
    /// Permits: status (permits, held, holders, queued, first lease end, fence).
    pub const PERMIT_STATUS: &str = crate::redis::scripts::PERMIT_STATUS;

    /// The scripts above as one Redis Functions library, what a locker loads (`FUNCTION LOAD`,
    /// on every primary) and calls (`FCALL`): its code. Each function's body is its script's
    /// text; a deployment whose application user may not run `FUNCTION LOAD` can load this
    /// code itself (a locker that cannot load it, and finds it missing, calls the scripts).
    pub fn library_code() -> &'static str {
        &crate::redis::scripts::library().code
    }

    /// The library's name, `waitlock_<protocol>_<8 hex digits of its code's SHA-1>`: two
    /// versions load side by side during a rolling upgrade.
    pub fn library_name() -> &'static str {
        &crate::redis::scripts::library().name
    }

    /// The name of the library's function for the script whose file's stem is `stem`
    /// (`acquire`, `release`, `permit_status`, `refresh`, ...): the library's name, `_`, the
    /// stem.
    pub fn function_name(stem: &str) -> String {
        format!("{}_{stem}", library_name())
    }
}

/// The fred crate this crate is built on, for building clients of the same version.
pub use fred;
