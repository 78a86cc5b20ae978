//! Building a locker: its settings, validated once, and its waiting strategy.

use crate::error::{Error, Result};
use crate::keys::check_prefix;
use crate::limits::MAX_LABEL_LEN;
use crate::locker::Locker;
use crate::redis::{Backend, Engine, Settings};
use crate::wait::strategy::{Poll, Queue};
use std::marker::PhantomData;
use std::time::Duration;

/// The default time limit of one Redis call made by this crate.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);
/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "waitlock:";
/// The default claim window: the lease of a short grant (see [`LockerBuilder::claim_window`]).
pub const DEFAULT_CLAIM_WINDOW: Duration = Duration::from_millis(500);
/// The default presence window (see [`LockerBuilder::presence_window`]).
pub const DEFAULT_PRESENCE_WINDOW: Duration = Duration::from_millis(100);
/// The default retention (see [`LockerBuilder::retention`]).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(3600);

/// Builds a [`Locker`]: polling (`S` = [`Poll`], what [`Locker::builder`] and
/// [`Locker::connect`] give), or queued in Redis after [`queued`](LockerBuilder::queued)
/// (`S` = [`Queue`]). The settings are the same for both; [`build`](LockerBuilder::build)
/// is synchronous for a polling locker and `async` for a queued one (it opens a subscriber
/// connection), so the kind you get is the kind you asked for.
#[must_use]
pub struct LockerBuilder<S = Poll> {
    pub(crate) backend: Backend,
    pub(crate) settings: Settings,
    strategy: PhantomData<S>,
}

impl<S> Clone for LockerBuilder<S> {
    fn clone(&self) -> Self {
        LockerBuilder {
            backend: self.backend.clone(),
            settings: self.settings.clone(),
            strategy: PhantomData,
        }
    }
}

impl<S> std::fmt::Debug for LockerBuilder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("strategy", &std::any::type_name::<S>())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl LockerBuilder<Poll> {
    /// A builder on `backend` with the defaults.
    pub(crate) fn new(backend: Backend) -> LockerBuilder<Poll> {
        LockerBuilder {
            backend,
            settings: default_settings(),
            strategy: PhantomData,
        }
    }
}

/// The defaults every locker starts from.
pub(crate) fn default_settings() -> Settings {
    Settings {
        prefix: DEFAULT_PREFIX.into(),
        command_timeout: DEFAULT_COMMAND_TIMEOUT,
        claim_window: DEFAULT_CLAIM_WINDOW,
        presence_window: DEFAULT_PRESENCE_WINDOW,
        retention: DEFAULT_RETENTION,
        replicas: None,
        metrics_key_label: false,
        label: None,
    }
}

/// `s` with its label resolved (the default label when none was set).
pub(crate) fn resolved(mut s: Settings) -> Settings {
    s.label.get_or_insert_with(default_label);
    s
}

/// The default label of a locker: `<host>:<pid>:<program>`, each cut short (host name from
/// the kernel or `$HOSTNAME`, the OS process id, the executable's file name).
pub fn default_label() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "?".into());
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "?".into());
    let short = |s: &str, n: usize| s.chars().take(n).collect::<String>();
    format!(
        "{}:{}:{}",
        short(&host, 40),
        std::process::id(),
        short(&program, 40)
    )
}

impl<S> LockerBuilder<S> {
    /// With the `metrics` feature: label every metric of a lock with its key (`key="..."`).
    /// Off by default: a label per key makes a time series per key, which a monitoring system
    /// pays for; turn it on only for a bounded set of keys. Without the feature it does
    /// nothing.
    pub fn metrics_key_label(mut self, on: bool) -> Self {
        self.settings.metrics_key_label = on;
        self
    }

    /// The prefix of every Redis name this locker uses; non-empty, at most 256 bytes, without
    /// braces. Defaults to `waitlock:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.settings.prefix = prefix.into();
        self
    }

    /// The time limit of each Redis call the locker makes (a call that passes it fails with
    /// [`Error::Timeout`]). Must be non-zero. Defaults to 3 s.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.settings.command_timeout = timeout;
        self
    }

    /// The lease of a *short grant*: when a release hands the lock to a queued waiter whose
    /// process Redis has not seen on the key within the [presence
    /// window](Self::presence_window), it grants the lock for this long only, and the waiter
    /// confirms it (extends it to its TTL, one round trip) before `acquire_wait` returns. A
    /// waiter whose process froze before such a release costs the others this window (plus a
    /// millisecond or two), never a TTL. The grant message carries its lease, so lockers with
    /// different windows can share keys. Whole milliseconds, at least 10 ms. Defaults to
    /// 500 ms.
    pub fn claim_window(mut self, window: Duration) -> Self {
        self.settings.claim_window = window;
        self
    }

    /// A release hands the lock to a queued waiter with the waiter's **full TTL** (no further
    /// step: the waiter holds the lock when the grant arrives) when the waiter's process
    /// called Redis on that key within this window before the release; otherwise it gives a
    /// short grant (see [`claim_window`](Self::claim_window)). Busy waiters are always seen:
    /// their handoffs cost one message and no round trip. The price: a process that freezes
    /// less than this window before it is handed the lock keeps it for its TTL, like a frozen
    /// holder. Zero makes every handoff a short grant confirmed by its waiter. At most one
    /// hour. Defaults to 100 ms.
    pub fn presence_window(mut self, window: Duration) -> Self {
        self.settings.presence_window = window;
        self
    }

    /// How long the Redis keys of a lock outlive their last use: the fence counter after the
    /// last acquisition (whatever the TTL), the queue and the record of waiting
    /// processes after the last waiter queued. A fence counter that expired starts again at
    /// Redis' clock in microseconds, so fences keep growing (see `docs/design.md`,
    /// "Fencing"). At least 1 s, at most 30 days. Defaults to one hour.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.settings.retention = retention;
        self
    }

    /// The name operators see for this locker's process in [`Locker::status`] and
    /// `waitlock status` (as the holder, and beside each of its waiters): any text up to
    /// [`MAX_LABEL_LEN`] bytes (shown escaped). Defaults to [`default_label`]
    /// (`<host>:<pid>:<program>`). A queued locker stores it once, in a key of its own
    /// (`{<prefix>labels}:<process id>`, kept for the retention and written again every third
    /// of it), never on an acquisition's path; a polling locker's tokens name no process, so its
    /// holders are shown by token only.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.settings.label = Some(label.into());
        self
    }

    /// Requires `replicas` replicas to acknowledge every acquisition, confirmation of a grant
    /// and refresh (Redis `WAIT`, up to `timeout`) before it counts: an acquisition too few
    /// acknowledged is released and fails with [`Error::NotReplicated`]; such a refresh is a
    /// lost lock ([`LossReason::NotReplicated`](crate::LossReason::NotReplicated)). It closes
    /// the window in which a failover to a replica that missed the write loses the lock, at
    /// the price of one more round trip per acquisition and refresh (and a handed-over lock
    /// is confirmed before `acquire_wait` returns).
    ///
    /// `WAIT` blocks the connection it is sent on until the replicas answer: give the locker a
    /// client (or pool) of its own. Defaults to none (no check). `replicas` must be at least
    /// 1 and `timeout` non-zero.
    pub fn require_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.settings.replicas = Some((replicas, timeout));
        self
    }

    fn engine(self) -> Result<Engine> {
        let s = &self.settings;
        check_prefix(&s.prefix)?;
        let bad = |field, value: Duration, reason| {
            Error::invalid_setting(field, format!("{value:?}"), reason)
        };
        if s.command_timeout.is_zero() {
            return Err(bad(
                "command_timeout",
                s.command_timeout,
                "must be non-zero",
            ));
        }
        if s.claim_window < Duration::from_millis(10) || s.claim_window.as_secs() > 86_400 {
            return Err(bad(
                "claim_window",
                s.claim_window,
                "must be between 10 ms and one day",
            ));
        }
        if s.presence_window.as_secs() > 3_600 {
            return Err(bad(
                "presence_window",
                s.presence_window,
                "must be at most one hour",
            ));
        }
        if s.retention < Duration::from_secs(1) || s.retention.as_secs() > 30 * 86_400 {
            return Err(bad(
                "retention",
                s.retention,
                "must be between 1 s and 30 days",
            ));
        }
        if let Some(label) = &s.label {
            if label.len() > MAX_LABEL_LEN {
                return Err(Error::invalid_setting(
                    "label",
                    format!("<{} bytes>", label.len()),
                    "must be at most 256 bytes",
                ));
            }
        }
        if let Some((n, timeout)) = s.replicas {
            if n == 0 || timeout.is_zero() {
                return Err(Error::invalid_setting(
                    "require_replicas",
                    format!("({n}, {timeout:?})"),
                    "needs at least 1 replica and a non-zero timeout",
                ));
            }
        }
        Ok(Engine::new(self.backend, resolved(self.settings)))
    }

    fn with<T>(self) -> LockerBuilder<T> {
        LockerBuilder {
            backend: self.backend,
            settings: self.settings,
            strategy: PhantomData,
        }
    }
}

impl LockerBuilder<Poll> {
    /// A polling locker: its waiters retry with jittered exponential backoff.
    ///
    /// Errors: [`Error::InvalidSetting`] for a bad prefix, timeout, window or retention.
    pub fn build(self) -> Result<Locker<Poll>> {
        Ok(Locker::assemble(self.engine()?.start(), Poll))
    }

    /// The same settings for a locker whose waiters queue in Redis and are handed the lock
    /// by the release (finish with the `async` [`build`](LockerBuilder::<Queue>::build)).
    pub fn queued(self) -> LockerBuilder<Queue> {
        self.with()
    }
}

impl LockerBuilder<Queue> {
    /// A locker whose waiters queue in Redis: opens its one subscriber connection with the
    /// client's config (and asks the server once which pub/sub it has), and writes the
    /// process's [label](Self::label).
    ///
    /// Errors: as [`LockerBuilder::<Poll>::build`]; [`Error::Connect`] if the subscriber cannot
    /// connect, or the server cannot serve a queue (a cluster without sharded pub/sub).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    pub async fn build(self) -> Result<Locker<Queue>> {
        let engine = self.engine()?.start();
        let hub = crate::wait::notify::hub::open(&engine).await?;
        // The label, once (its task writes it again later): `status` names this process from
        // its first acquisition on. A failure here is not the locker's: the task retries.
        engine.write_label(&hub.pid).await;
        Ok(Locker::assemble(engine, Queue { hub }))
    }

    /// The same settings for a polling locker.
    pub fn polling(self) -> LockerBuilder<Poll> {
        self.with()
    }
}
