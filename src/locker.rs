//! The two lockers and their builder: the public surface. The work happens in `wait` (waiting),
//! `redis` (scripts) and `hold` (guards, refresh, critical sections).

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::run::{run_under, LockContext};
use crate::keys::check_prefix;
use crate::options::{check_token, check_ttl, LockOptions};
use crate::redis::scripts::Call;
use crate::redis::{
    connect_client, Attempt, Backend, ConnectOptions, Engine, Extended, Released, Settings,
};
use crate::stats::LockerStats;
use crate::status::LockStatus;
use crate::wait::notify::hub::Hub;
use crate::wait::notify::stats::RegistrySize;
use crate::wait::{self, Request};
use fred::clients::{Client, Pool};
use fred::interfaces::ClientLike;
use std::future::Future;
use std::sync::Arc;
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

/// A distributed lock manager that waits by polling with full-jitter exponential backoff.
///
/// Cheap to clone (an `Arc` inside). Built from a connected fred [`Client`] or [`Pool`].
/// Prefer [`PubSubLocker`] when waiters are common: its waiters queue and are handed the lock.
/// A `Locker` never jumps that queue: when it finds the lock free while waiters are queued, it
/// hands the lock to the oldest of them and keeps waiting, so under sustained queued
/// contention a polling waiter may wait until its deadline.
///
/// **What your client must have:** fred has by default no reconnect policy (a cut connection
/// never comes back) and no command timeout. This crate bounds each of its calls by its own
/// command timeout ([`LockerBuilder::command_timeout`]), but set a `ReconnectPolicy` on the
/// client you pass in. [`Locker::connect`] builds a client with both.
#[derive(Clone)]
pub struct Locker {
    pub(crate) engine: Arc<Engine>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("prefix", &self.engine.prefix)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Locker`] or a [`PubSubLocker`].
#[derive(Clone)]
#[must_use]
pub struct LockerBuilder {
    backend: Backend,
    settings: Settings,
}

impl std::fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The defaults every locker starts from.
fn default_settings() -> Settings {
    Settings {
        prefix: DEFAULT_PREFIX.into(),
        command_timeout: DEFAULT_COMMAND_TIMEOUT,
        claim_window: DEFAULT_CLAIM_WINDOW,
        presence_window: DEFAULT_PRESENCE_WINDOW,
        retention: DEFAULT_RETENTION,
        replicas: None,
    }
}

impl LockerBuilder {
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
        let bad = |field, value: Duration, reason| Error::InvalidOptions {
            key: String::new(),
            field,
            value: format!("{value:?}"),
            reason,
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
        if let Some((n, timeout)) = s.replicas {
            if n == 0 || timeout.is_zero() {
                return Err(Error::InvalidOptions {
                    key: String::new(),
                    field: "require_replicas",
                    value: format!("({n}, {timeout:?})"),
                    reason: "needs at least 1 replica and a non-zero timeout",
                });
            }
        }
        Ok(Engine::new(self.backend, self.settings))
    }

    /// A polling [`Locker`]. Errors: [`Error::InvalidOptions`] for a bad prefix, timeout or
    /// claim window.
    pub fn build(self) -> Result<Locker> {
        let engine = Arc::new(self.engine()?);
        crate::redis::sentinel::watch(&engine);
        Ok(Locker { engine })
    }

    /// A [`PubSubLocker`]: opens its one subscriber connection with the client's config (and
    /// asks the server once whether it has sharded pub/sub).
    ///
    /// Errors: as [`build`](Self::build); [`Error::Redis`] / [`Error::Timeout`] (key empty) if
    /// the subscriber cannot connect.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    pub async fn build_pubsub(self) -> Result<PubSubLocker> {
        let engine = Arc::new(self.engine()?);
        crate::redis::sentinel::watch(&engine);
        let hub = wait::notify::start_hub(&engine).await?;
        Ok(PubSubLocker {
            locker: Locker { engine },
            hub,
        })
    }
}

impl Locker {
    /// A locker with the defaults (prefix `waitlock:`, command timeout 3 s, claim window
    /// 500 ms, presence window 100 ms, retention one hour) on `client`.
    pub fn new(client: Client) -> Locker {
        let engine = Arc::new(Engine::new(Backend::Client(client), default_settings()));
        crate::redis::sentinel::watch(&engine);
        Locker { engine }
    }

    /// A builder on a connected client.
    pub fn builder(client: Client) -> LockerBuilder {
        Self::builder_on(Backend::Client(client))
    }

    /// A builder on a connected pool (each call takes the pool's next client).
    pub fn builder_with_pool(pool: Pool) -> LockerBuilder {
        Self::builder_on(Backend::Pool(pool))
    }

    fn builder_on(backend: Backend) -> LockerBuilder {
        LockerBuilder {
            backend,
            settings: default_settings(),
        }
    }

    /// Connects a new client to `url` (e.g. `redis://127.0.0.1:6379`) with a reconnect policy
    /// (exponential, 10 ms to 1 s, forever) and a default command timeout, and builds a
    /// locker builder on it. Finish with [`LockerBuilder::build`] or
    /// [`LockerBuilder::build_pubsub`].
    ///
    /// With the `tls-rustls` feature a `rediss://` URL connects with TLS, trusting the system's
    /// CAs; [`connect_with`](Self::connect_with) takes a private CA and a client certificate.
    /// Without it a `rediss://` URL is refused ([`Error::InvalidOptions`], field `url`), never
    /// sent in plain text.
    ///
    /// Errors: [`Error::Redis`] (key empty) when the URL does not parse (op `parse url`) or
    /// connecting fails (op `connect`: nothing answers, the password or the server's
    /// certificate is refused, the server does not speak TLS); [`Error::Timeout`] (op
    /// `connect`) when connecting takes more than 5 s. Messages never show the URL's password.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no connection behind.
    pub async fn connect(url: &str) -> Result<LockerBuilder> {
        Self::connect_with(url, &ConnectOptions::new()).await
    }

    /// As [`connect`](Self::connect), with a time limit of your own and, with the `tls-rustls`
    /// feature, TLS settings (`ConnectOptions::with_tls`) that the locker's client and a
    /// [`PubSubLocker`]'s subscriber connection both use.
    ///
    /// Errors: as [`connect`](Self::connect), [`Error::Timeout`] after `opts`' time limit;
    /// [`Error::InvalidOptions`] (key empty) for a zero time limit (field `connect_timeout`),
    /// TLS settings with a `redis://` URL (field `tls`), or a CA or client certificate file
    /// that cannot be read or holds no usable PEM (fields `tls.ca`, `tls.client_cert`,
    /// `tls.client_key`).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no connection behind.
    ///
    /// # Examples
    /// ```no_run
    /// # #[cfg(feature = "tls-rustls")]
    /// # async fn example() -> waitlock::Result<()> {
    /// use waitlock::{ConnectOptions, Locker, TlsOptions};
    /// let opts = ConnectOptions::new().with_tls(TlsOptions::new().with_ca_file("ca.pem"));
    /// let locker = Locker::connect_with("rediss://:secret@redis.internal:6380", &opts)
    ///     .await?
    ///     .build()?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub async fn connect_with(url: &str, opts: &ConnectOptions) -> Result<LockerBuilder> {
        Ok(Self::builder(
            connect_client(url, DEFAULT_COMMAND_TIMEOUT, opts).await?,
        ))
    }

    /// The fred client this locker sends its next command through (a pool's next client).
    pub fn client(&self) -> &Client {
        self.engine.backend.next_client()
    }

    /// The number of this locker's background tasks still running (keep-alives, grant
    /// confirmations, background releases and queue departures).
    pub fn background_tasks(&self) -> usize {
        self.engine.tasks.get()
    }

    /// Resolves when no background task of this locker is running.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn idle(&self) {
        self.engine.tasks.idle().await
    }

    /// One attempt to take the lock on `key`. It never jumps a queue: a free lock with live
    /// waiters queued goes to the oldest of them, and this call gets [`Error::Locked`].
    ///
    /// Errors: [`Error::Locked`] with the holder's remaining TTL; [`Error::AlreadyHeld`] when
    /// `opts` has a fixed token that already holds the key; [`Error::InvalidKey`] /
    /// [`Error::InvalidOptions`] (nothing sent); [`Error::WrongType`]; [`Error::Timeout`] or
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: if the future is dropped after the script may have run, the lock taken with
    /// the generated token is released in the background (with a fixed token, releasing it is
    /// the caller's business).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(locker: waitlock::Locker) -> waitlock::Result<()> {
    /// match locker.acquire("report", &waitlock::LockOptions::new()).await {
    ///     Ok(guard) => guard.release().await?,
    ///     Err(waitlock::Error::Locked { remaining_ttl, .. }) => {
    ///         println!("busy for another {remaining_ttl:?}")
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "acquire", level = "debug", skip_all, fields(key = %key))]
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let result = match Request::new(&self.engine, key, opts, "") {
            Ok(req) => wait::once(&self.engine, &req).await,
            Err(e) => Err(e),
        };
        self.engine.meter.record(&result, None);
        result
    }

    /// Takes the lock on `key`, retrying until `opts.wait` has passed. Each sleep is a backoff
    /// delay, never past the holder's remaining TTL (so an expired lock is taken promptly) or
    /// the deadline. Connection errors and timeouts are retried the same way until the
    /// deadline.
    ///
    /// Errors: [`Error::WaitTimeout`] at the deadline, or, when the last attempt before the
    /// deadline failed to reach Redis, that error ([`Error::Redis`], or [`Error::Timeout`]
    /// after a full command timeout); [`Error::Locked`] when `wait` is zero; otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`acquire`](Self::acquire): dropping it mid-wait leaves no lock and no
    /// task behind.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(client: waitlock::fred::clients::Client) -> waitlock::Result<()> {
    /// use std::time::Duration;
    /// let locker = waitlock::Locker::new(client);
    /// let opts = waitlock::LockOptions::new().with_wait(Duration::from_secs(2));
    /// let guard = locker.acquire_wait("invoice:42", &opts).await?;
    /// // ... work, passing guard.fence() to storage that checks it ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "acquire_wait", level = "debug", skip_all, fields(key = %key))]
    pub async fn acquire_wait(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let start = tokio::time::Instant::now();
        let result = match Request::new(&self.engine, key, opts, "") {
            Ok(req) => wait::poll(&self.engine, &req).await,
            Err(e) => Err(e),
        };
        self.engine.meter.record(&result, Some(start.elapsed()));
        result
    }

    /// Runs `f` under the lock on `key`: waits for it (up to `opts.wait`), refreshes it every
    /// `refresh_ratio × TTL` while `f` runs, releases it afterwards and returns `f`'s value.
    ///
    /// `f` gets a [`LockContext`] whose `lost` token is cancelled the moment the lock is judged
    /// lost. `run` then returns [`Error::Expired`] (refresh found the token gone, or Redis
    /// stayed unreachable until the validity deadline) or [`Error::LockTimeout`] (refresh off
    /// and the TTL passed) once `f` returns, whatever `f` returned. `f`'s own errors come back
    /// as they are. A panic in `f` releases the lock, then resumes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops the refresh and releases the lock in the
    /// background.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(locker: waitlock::Locker) -> Result<(), waitlock::Error> {
    /// let opts = waitlock::LockOptions::new();
    /// let total = locker
    ///     .run("nightly-report", &opts, |ctx| async move {
    ///         if ctx.lost.is_cancelled() {
    ///             return Ok(0); // lost already: `run` will return Error::Expired
    ///         }
    ///         Ok::<_, waitlock::Error>(42)
    ///     })
    ///     .await?;
    /// # let _ = total; Ok(()) }
    /// ```
    pub async fn run<F, Fut, T, E>(&self, key: &str, opts: &LockOptions, f: F) -> Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.acquire_wait(key, opts).await?;
        run_under(guard, f).await
    }

    /// Outcomes, wait times and lost locks since the locker was built (shared by its clones).
    pub fn stats(&self) -> LockerStats {
        self.engine.meter.snapshot(Default::default())
    }

    /// What Redis holds for `key` now: held or not, the remaining TTL, the last fence, and
    /// how many waiters are queued (pub/sub lockers' waiters; polling waiters do not queue).
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::WrongType`], [`Error::Timeout`] or
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<LockStatus> {
        let names = self.engine.names(key)?;
        let raw = self.engine.status(&names).await?;
        Ok(LockStatus::from_raw(&raw))
    }

    /// Token-level: one attempt to take `key` for `token` with `ttl` (never jumping a queue of
    /// waiters). Returns the fence.
    ///
    /// Errors: [`Error::Locked`], [`Error::AlreadyHeld`] (this token holds it already; the
    /// TTL is left as it was), bad input, or Redis errors.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call may leave `key` held by `token` until you
    /// [`unlock`](Self::unlock) it or it expires.
    #[tracing::instrument(name = "acquire", level = "debug", skip_all, fields(key = %key))]
    pub async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<u64> {
        let names = self.engine.names(key)?;
        let ttl_ms = check_ttl(key, ttl)?;
        check_token(key, token)?;
        let call = Call {
            ttl_ms,
            ..Call::new(&names, token)
        };
        match self
            .engine
            .attempt_on(
                self.engine.backend.client_for(token),
                &call,
                self.engine.command_timeout,
            )
            .await?
        {
            Attempt::Acquired { fence } | Attempt::Granted { fence } => Ok(fence),
            Attempt::AlreadyHeld { remaining, .. } => Err(Error::AlreadyHeld {
                key: names.key,
                remaining_ttl: remaining,
            }),
            Attempt::Locked { remaining, .. } => Err(Error::Locked {
                key: names.key,
                remaining_ttl: remaining,
            }),
        }
    }

    /// Token-level: sets the remaining TTL of `key` to `ttl` if `token` holds it.
    ///
    /// Errors: [`Error::NotHeld`] (the lock is left as it is), bad input, or Redis errors.
    ///
    /// # Cancel safety
    /// Cancel safe: the script is idempotent.
    #[tracing::instrument(name = "extend", level = "debug", skip_all, fields(key = %key))]
    pub async fn extend(&self, key: &str, token: &str, ttl: Duration) -> Result<()> {
        let names = self.engine.names(key)?;
        let ttl_ms = check_ttl(key, ttl)?;
        check_token(key, token)?;
        let call = Call {
            ttl_ms,
            ..Call::new(&names, token)
        };
        if self
            .engine
            .extend_on(
                self.engine.backend.client_for(token),
                &call,
                self.engine.command_timeout,
            )
            .await?
            != Extended::NotHeld
        {
            Ok(())
        } else {
            Err(Error::NotHeld { key: names.key })
        }
    }

    /// Token-level: releases `key` if `token` holds it, handing it to the oldest queued
    /// waiter if there is one.
    ///
    /// Errors: [`Error::NotHeld`] (the lock is left as it is), bad input, or Redis errors.
    ///
    /// # Cancel safety
    /// Cancel safe: the script is idempotent; a dropped call leaves the lock released or held.
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(key = %key))]
    pub async fn unlock(&self, key: &str, token: &str) -> Result<()> {
        let names = self.engine.names(key)?;
        check_token(key, token)?;
        match self
            .engine
            .release_on(
                self.engine.backend.client_for(token),
                &names,
                token,
                "",
                self.engine.command_timeout,
            )
            .await?
        {
            Released::Deleted | Released::HandedOver => Ok(()),
            Released::NotHeld => Err(Error::NotHeld { key: names.key }),
        }
    }
}

/// A distributed lock manager whose waiters queue in Redis and are handed the lock by the
/// release.
///
/// Same lock surface as [`Locker`] (same scripts and keys; interoperable with it). Waiters
/// form one FIFO queue per key in Redis, across processes; the release gives the lock straight
/// to the oldest live waiter and publishes the grant, so the waiter holds the lock when the
/// message arrives. All waiters of all keys in the process share ONE subscriber connection;
/// a per-key registry subscribes the key's grant channel while someone waits on it. Uses
/// sharded pub/sub (SSUBSCRIBE/SPUBLISH) when the server has it, classic pub/sub otherwise.
///
/// Cheap to clone. The subscriber connection closes when the last clone is dropped.
#[derive(Clone)]
pub struct PubSubLocker {
    locker: Locker,
    hub: Arc<Hub>,
}

impl std::fmt::Debug for PubSubLocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PubSubLocker")
            .field("prefix", &self.locker.engine.prefix)
            .field("registry", &self.registry_size())
            .finish_non_exhaustive()
    }
}

impl PubSubLocker {
    /// A pub/sub locker with the defaults on `client`; opens the subscriber connection with the
    /// client's config (and its own reconnect policy).
    ///
    /// Errors: [`Error::Redis`] / [`Error::Timeout`] (key empty) if the subscriber cannot connect.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    pub async fn new(client: Client) -> Result<PubSubLocker> {
        Locker::builder(client).build_pubsub().await
    }

    /// A builder (prefix, command timeout, claim window); finish it with
    /// [`LockerBuilder::build_pubsub`] (its `build` gives a polling [`Locker`]).
    pub fn builder(client: Client) -> LockerBuilder {
        Locker::builder(client)
    }

    /// Connects a new client to `url` with a reconnect policy and a command timeout, as
    /// [`Locker::connect`]; finish with [`LockerBuilder::build_pubsub`].
    ///
    /// # Cancel safety
    /// As [`Locker::connect`].
    pub async fn connect(url: &str) -> Result<LockerBuilder> {
        Locker::connect(url).await
    }

    /// As [`Locker::connect_with`]; finish with [`LockerBuilder::build_pubsub`], whose
    /// subscriber connection uses the same TLS settings (it is opened with the client's config).
    ///
    /// # Cancel safety
    /// As [`Locker::connect_with`].
    pub async fn connect_with(url: &str, opts: &ConnectOptions) -> Result<LockerBuilder> {
        Locker::connect_with(url, opts).await
    }

    /// The polling [`Locker`] sharing this locker's connection and scripts.
    pub fn locker(&self) -> &Locker {
        &self.locker
    }

    /// How many keys and waiters the registry holds now (both 0 when nobody waits).
    pub fn registry_size(&self) -> RegistrySize {
        let (keys, waiters) = self.hub.size();
        RegistrySize { keys, waiters }
    }

    /// Resolves once Redis has processed every subscribe and unsubscribe that the registry
    /// asked for before this call (e.g. to check `PUBSUB SHARDNUMSUB` after waiters left).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn subscriptions_settled(&self) {
        self.hub.settled().await
    }

    /// Outcomes, wait times, lost locks, and why waiters woke, since the locker was built
    /// (shared by its clones).
    pub fn stats(&self) -> LockerStats {
        self.locker
            .engine
            .meter
            .snapshot(self.hub.counters.snapshot())
    }

    /// The id fred gives the subscriber connection's client (to find it in `CLIENT LIST`
    /// together with `CLIENT SETNAME`, or in logs).
    pub fn subscriber_id(&self) -> &str {
        self.hub.subscriber.id()
    }

    /// This locker's id in Redis: its waiters' queue entries start with it, and their grants
    /// arrive on `{<prefix><key>}:w:<id>`.
    pub fn waiter_id(&self) -> &str {
        &self.hub.id
    }

    /// Whether the server has sharded pub/sub and this locker uses it (else classic pub/sub).
    pub fn uses_sharded_pubsub(&self) -> bool {
        self.hub.mode == wait::notify::hub::Mode::Sharded
    }

    /// One attempt; exactly as [`Locker::acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`].
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.locker.acquire(key, opts).await
    }

    /// Takes the lock on `key`, waiting up to `opts.wait`: one plain attempt first (unless
    /// waiters of this process already wait on the key), then the waiter queues in Redis (in
    /// the same call as its next attempt, once its grant channel is subscribed) and is handed
    /// the lock by a release, in FIFO order across processes. While queued it makes no calls,
    /// unless it is one of the two waiters that watch the lock (they look when the holder's
    /// lease ends), its subscription was lost and confirmed again, or its process was frozen.
    ///
    /// The guard it returns is valid for the TTL asked for (less the drift margin and the
    /// grant's delivery), handed over or taken free, and Redis keeps the lock that long with no
    /// further step: a waiter whose process Redis saw on the key within the presence window is
    /// granted its full TTL; another confirms its short grant (one round trip) before this
    /// returns. At the deadline it returns at once; the queue entry is taken out in the
    /// background.
    ///
    /// Errors: as [`Locker::acquire_wait`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future leaves the registry (the channel is unsubscribed when it
    /// was the key's last waiter here), leaves the Redis queue in the background, and gives
    /// back a grant it had been sent but not read, so the next waiter is served at once.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(client: waitlock::fred::clients::Client) -> waitlock::Result<()> {
    /// let locker = waitlock::PubSubLocker::new(client).await?;
    /// let guard = locker.acquire_wait("cron:cleanup", &waitlock::LockOptions::new()).await?;
    /// // handed over by the previous holder's release, not found by polling
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "acquire_wait", level = "debug", skip_all, fields(key = %key))]
    pub async fn acquire_wait(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let engine = &self.locker.engine;
        let start = tokio::time::Instant::now();
        let result = match Request::new(engine, key, opts, &self.hub.id) {
            Ok(req) => wait::notify::wait(engine, &self.hub, &req).await,
            Err(e) => Err(e),
        };
        engine.meter.record(&result, Some(start.elapsed()));
        result
    }

    /// Runs `f` under the lock; exactly as [`Locker::run`], waiting as
    /// [`acquire_wait`](Self::acquire_wait) does.
    ///
    /// # Cancel safety
    /// As [`Locker::run`].
    pub async fn run<F, Fut, T, E>(&self, key: &str, opts: &LockOptions, f: F) -> Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.acquire_wait(key, opts).await?;
        run_under(guard, f).await
    }

    /// As [`Locker::status`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<LockStatus> {
        self.locker.status(key).await
    }

    /// Token-level; as [`Locker::try_lock`].
    ///
    /// # Cancel safety
    /// As [`Locker::try_lock`].
    pub async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<u64> {
        self.locker.try_lock(key, token, ttl).await
    }

    /// Token-level; as [`Locker::extend`].
    ///
    /// # Cancel safety
    /// As [`Locker::extend`].
    pub async fn extend(&self, key: &str, token: &str, ttl: Duration) -> Result<()> {
        self.locker.extend(key, token, ttl).await
    }

    /// Token-level; as [`Locker::unlock`].
    ///
    /// # Cancel safety
    /// As [`Locker::unlock`].
    pub async fn unlock(&self, key: &str, token: &str) -> Result<()> {
        self.locker.unlock(key, token).await
    }
}
