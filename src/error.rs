//! The crate's one error type.

use std::time::Duration;

/// Why a held lock was judged lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// A refresh found that the lock key no longer holds our token (it expired, was deleted,
    /// or was overwritten by someone else).
    TokenGone,
    /// Redis could not be reached (or did not answer) long enough that the lock's validity
    /// deadline passed before a refresh succeeded.
    Unreachable,
    /// Refresh was off ([`Refresh::Off`](crate::Refresh::Off)) and the lock's validity deadline passed: the
    /// critical section outlived the TTL.
    TtlElapsed,
    /// A refresh was not acknowledged by as many replicas as the locker requires
    /// (`LockerBuilder::require_replicas`) within its timeout: a failover could lose it.
    NotReplicated,
}

impl std::fmt::Display for LossReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LossReason::TokenGone => "the lock key no longer holds this token",
            LossReason::Unreachable => {
                "Redis did not confirm a refresh before the validity deadline"
            }
            LossReason::TtlElapsed => "the TTL elapsed with refresh turned off",
            LossReason::NotReplicated => {
                "a refresh was not acknowledged by the required number of replicas"
            }
        })
    }
}

/// The operation a call to Redis was for (in [`Error::Redis`] and [`Error::Timeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Taking the lock (an attempt, or a queued waiter's queueing call or look).
    Acquire,
    /// Setting its TTL again (a refresh, `extend`, or confirming a short grant).
    Extend,
    /// Releasing it.
    Release,
    /// Leaving the waiter queue.
    LeaveQueue,
    /// Reading its status.
    Status,
    /// Waiting for replicas to acknowledge a write (`require_replicas`).
    WaitForReplicas,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Acquire => "acquire",
            Op::Extend => "extend",
            Op::Release => "release",
            Op::LeaveQueue => "leave queue",
            Op::Status => "status",
            Op::WaitForReplicas => "wait for replicas",
        })
    }
}

/// The step of connecting that failed (in [`Error::Connect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectStep {
    /// Reading the URL.
    ParseUrl,
    /// Opening the connection (TCP, TLS, authentication).
    Connect,
    /// Checking that the server can hold locks (its version, that it never evicts them).
    CheckServer,
    /// Opening a queued locker's subscriber connection.
    ConnectSubscriber,
    /// Asking the server which pub/sub it has (a queued locker needs sharded pub/sub on a
    /// cluster).
    PubSub,
}

impl std::fmt::Display for ConnectStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ConnectStep::ParseUrl => "reading the URL",
            ConnectStep::Connect => "connecting",
            ConnectStep::CheckServer => "checking the server",
            ConnectStep::ConnectSubscriber => "connecting the subscriber",
            ConnectStep::PubSub => "asking for pub/sub",
        })
    }
}

/// Everything that can go wrong in `waitlock`.
///
/// Every variant about a lock names its key ([`Error::key`]); the two that concern no key,
/// connecting ([`Error::Connect`]) and a locker's setting ([`Error::InvalidSetting`]: the
/// prefix, a timeout, a TLS file), have their own.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Another token holds the lock (for permits: too few are free), or waiters are queued,
    /// who come first.
    #[error("lock {key:?} is held by another token (remaining TTL: {remaining_ttl:?})")]
    Locked {
        /// The user's key (without prefix).
        key: String,
        /// The holder's remaining TTL as Redis reported it; `None` when the key has no expiry.
        /// For permits: when the first lease ends (zero when only waiters are ahead).
        remaining_ttl: Option<Duration>,
    },
    /// The same (fixed) token already holds the lock; nothing was changed.
    #[error("lock {key:?} is already held by this token (remaining TTL: {remaining_ttl:?})")]
    AlreadyHeld {
        /// The user's key.
        key: String,
        /// The remaining TTL of the existing hold; `None` when the key has no expiry.
        remaining_ttl: Option<Duration>,
    },
    /// `acquire_wait` did not get the lock before its wait deadline (Redis answering, or its
    /// last attempt still in flight at the deadline).
    #[error("gave up waiting for lock {key:?} after {waited:?} ({attempts} attempts)")]
    WaitTimeout {
        /// The user's key.
        key: String,
        /// How long the call waited.
        waited: Duration,
        /// How many acquisition attempts were sent to Redis.
        attempts: u32,
    },
    /// Extend or release by a token that does not hold the key (it expired, or another token
    /// holds it now). The lock, if any, was left untouched.
    #[error("lock {key:?} is not held by this token")]
    NotHeld {
        /// The user's key.
        key: String,
    },
    /// The lock was, or may have been, lost while a critical section ran (with refresh off:
    /// the section outlived the TTL, [`LossReason::TtlElapsed`]).
    #[error("lock {key:?} was lost while held: {reason}")]
    Expired {
        /// The user's key.
        key: String,
        /// What made the holder judge the lock lost.
        reason: LossReason,
    },
    /// A locker's setting (of its builder, of connecting, of a semaphore) is out of range;
    /// nothing was sent to Redis and no lock is involved.
    #[error("invalid setting: {field} = {value} ({reason})")]
    InvalidSetting {
        /// The setting's name (`prefix`, `command_timeout`, `tls.ca`, `permits`, ...).
        field: &'static str,
        /// The offending value, printed.
        value: String,
        /// What the setting must be.
        reason: &'static str,
    },
    /// An option of one call on a lock is out of range; nothing was sent to Redis.
    #[error("invalid option for lock {key:?}: {field} = {value} ({reason})")]
    InvalidOptions {
        /// The user's key.
        key: String,
        /// The option's name.
        field: &'static str,
        /// The offending value, printed.
        value: String,
        /// What the option must be.
        reason: &'static str,
    },
    /// The key cannot be used; nothing was sent to Redis.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The key (cut to its first 64 characters when longer).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The Redis key that backs the lock holds a value that is not a string (a list, a hash…),
    /// so it was not written by this crate.
    #[error(
        "lock {key:?}: the Redis key {redis_key:?} holds a non-string value; refusing to touch it"
    )]
    WrongType {
        /// The user's key.
        key: String,
        /// The Redis key name that holds the foreign value.
        redis_key: String,
    },
    /// The lock was taken, but fewer replicas than required
    /// ([`LockerBuilder::require_replicas`](crate::LockerBuilder::require_replicas))
    /// acknowledged it within the timeout; it was released again.
    #[error("lock {key:?}: only {acknowledged} of {required} required replicas acknowledged it within {after:?}; released")]
    NotReplicated {
        /// The user's key.
        key: String,
        /// Replicas required.
        required: u32,
        /// Replicas that acknowledged the write.
        acknowledged: u32,
        /// The replication timeout that passed.
        after: Duration,
    },
    /// The key has another number of permits than asked for: it is fixed while anyone holds or
    /// waits for them (a semaphore of 4 and one of 8 on the same key would each count their
    /// own). Nothing was changed.
    #[error("permits {key:?}: the key has {current} permits while in use, not {asked}")]
    PermitsMismatch {
        /// The user's key.
        key: String,
        /// The number of permits this call's semaphore has.
        asked: u32,
        /// The number the key has now.
        current: u32,
    },
    /// Redis did not answer a call in time.
    ///
    /// `after` is the locker's command timeout, or less for a refresh (cut to the lock's
    /// validity deadline). A waiting acquire whose last attempt is cut short by its own wait
    /// deadline returns [`Error::WaitTimeout`] instead.
    #[error("lock {key:?}: {op} got no answer from Redis within {after:?}")]
    Timeout {
        /// The user's key.
        key: String,
        /// The operation that timed out.
        op: Op,
        /// The time limit that passed.
        after: Duration,
    },
    /// Redis (or the connection to it) returned an error.
    #[error("lock {key:?}: {op} failed: {source}")]
    Redis {
        /// The user's key.
        key: String,
        /// The operation that failed.
        op: Op,
        /// fred's error.
        #[source]
        source: fred::error::Error,
    },
    /// Connecting failed, or the server cannot hold locks safely; no lock is involved.
    #[error("{step} {target} failed: {source}")]
    Connect {
        /// What connecting was doing.
        step: ConnectStep,
        /// Where to: the URL without its password (or what was connected to).
        target: String,
        /// fred's error, or what is wrong (a timeout is `ErrorKind::Timeout`).
        #[source]
        source: fred::error::Error,
    },
}

impl Error {
    /// The user's key this error is about (empty for connection-level errors).
    pub fn key(&self) -> &str {
        match self {
            Error::Locked { key, .. }
            | Error::AlreadyHeld { key, .. }
            | Error::WaitTimeout { key, .. }
            | Error::NotHeld { key }
            | Error::Expired { key, .. }
            | Error::InvalidOptions { key, .. }
            | Error::InvalidKey { key, .. }
            | Error::WrongType { key, .. }
            | Error::Timeout { key, .. }
            | Error::NotReplicated { key, .. }
            | Error::PermitsMismatch { key, .. }
            | Error::Redis { key, .. } => key,
            Error::Connect { .. } | Error::InvalidSetting { .. } => "",
        }
    }

    /// The error for option `field` of a call on `key`: `value` (printed) is not what
    /// `reason` says it must be.
    pub(crate) fn invalid_option(
        key: &str,
        field: &'static str,
        value: impl std::fmt::Display,
        reason: &'static str,
    ) -> Error {
        Error::InvalidOptions {
            key: key.to_owned(),
            field,
            value: value.to_string(),
            reason,
        }
    }

    /// The error for the locker's setting `field` (no key): `value` (printed) is not what
    /// `reason` says it must be.
    pub(crate) fn invalid_setting(
        field: &'static str,
        value: impl std::fmt::Display,
        reason: &'static str,
    ) -> Error {
        Error::InvalidSetting {
            field,
            value: value.to_string(),
            reason,
        }
    }

    /// Whether retrying the same call later may succeed: a timeout, or a connection-level error.
    /// Script errors, bad input, lock states and a server that cannot hold locks are not
    /// transient.
    pub fn is_transient(&self) -> bool {
        use fred::error::ErrorKind as K;
        match self {
            Error::Timeout { .. } => true,
            Error::Connect { step, source, .. } => {
                !matches!(
                    step,
                    ConnectStep::ParseUrl | ConnectStep::CheckServer | ConnectStep::PubSub
                ) && matches!(source.kind(), K::IO | K::Timeout | K::Canceled)
            }
            Error::Redis { source, .. } => {
                // (Routing: a redirection fred could not follow, e.g. while a Cluster slot
                // moves; Unknown: fred's own ends of a call, "channel closed" when its
                // connection task ended, "Too many failed write attempts."; either call may
                // have run: its outcome is unknown, as a timeout's.)
                matches!(
                    source.kind(),
                    K::IO
                        | K::Timeout
                        | K::Canceled
                        | K::Backpressure
                        | K::Cluster
                        | K::Sentinel
                        | K::Routing
                        | K::Unknown
                ) || source.details().starts_with("LOADING")
                    || source.details().starts_with("BUSY")
                    // A demoted primary (Sentinel failover): the client reconnects to the new one.
                    || source.details().starts_with("READONLY")
            }
            _ => false,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
