//! The locker: the public surface. Its waiting strategy is a type parameter
//! ([`crate::strategy`]); the builder is in `builder.rs`. The work happens in `wait`
//! (waiting), `redis` (scripts) and `hold` (guards, refresh, critical sections).

use crate::builder::{default_settings, resolved, LockerBuilder, DEFAULT_COMMAND_TIMEOUT};
use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::refresh::Refreshing;
use crate::hold::run::{run_under, LockContext};
use crate::options::{check_token, check_ttl, LockOptions};
use crate::redis::scripts::Call;
use crate::redis::{connect_client, Attempt, Backend, ConnectOptions, Engine, Extended, Released};
use crate::stats::{LockerStats, RegistrySize};
use crate::status::LockStatus;
use crate::wait::strategy::{Poll, Queue, Strategy};
use crate::wait::{self, Request};
use fred::clients::{Client, Pool};
use fred::interfaces::ClientLike;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A distributed lock manager. Its waiting strategy `S` is [`Poll`] (the default: retry with
/// jittered exponential backoff) or [`Queue`] (waiters queue in Redis, FIFO across processes,
/// and the release hands the lock to the oldest live one: a *queued locker*, built with
/// [`Locker::queued`] or `.queued().build().await` on a builder). Every method
/// exists once; those about the queue's subscriber exist for `Locker<Queue>` only.
///
/// Cheap to clone (an `Arc` inside); clones share the connection, the statistics and, for a
/// queued locker, the subscriber connection (closed when the last clone is dropped). Built from
/// a connected fred [`Client`] or [`Pool`] ([`Locker::new`], [`Locker::builder`]), or from a
/// URL ([`Locker::connect`]).
///
/// A polling waiter never jumps the queue: when it finds the lock free while waiters are
/// queued, it hands the lock to the oldest of them and keeps waiting, so under sustained
/// queued contention a polling waiter may wait until its deadline. Use one strategy per key;
/// [`Queue`] whenever waiting is common.
///
/// **What your client must have:** fred has by default no reconnect policy (a cut connection
/// never comes back) and no command timeout. This crate bounds each of its calls by its own
/// command timeout ([`LockerBuilder::command_timeout`]), but set a `ReconnectPolicy` on the
/// client you pass in. [`Locker::connect`] builds a client with both.
#[derive(Clone)]
pub struct Locker<S = Poll> {
    /// Redis' side: the connection, the scripts, the settings.
    pub(crate) engine: Arc<Engine>,
    /// The one batched refresher of this locker's guards.
    pub(crate) refresher: Arc<Refreshing>,
    /// What features keep per locker (an election's tracking connection, ...).
    pub(crate) extensions: Arc<Extensions>,
    pub(crate) strategy: S,
}

/// What features keep per locker, one value of each type, shared by the locker's clones. The
/// locker knows none of them: a feature asks for its own type
/// (`locker.extensions.get::<T>()`), so nothing below the features imports one.
#[derive(Default)]
pub(crate) struct Extensions(std::sync::Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>);

impl Extensions {
    /// The locker's `T`, made with `T::default()` by the first caller.
    pub(crate) fn get<T: std::any::Any + Default + Send + Sync>(&self) -> Arc<T> {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = all.iter().find_map(|e| Arc::clone(e).downcast::<T>().ok()) {
            return t;
        }
        let t = Arc::new(T::default());
        all.push(Arc::clone(&t) as Arc<dyn std::any::Any + Send + Sync>);
        t
    }
}

impl<S> Locker<S> {
    /// A locker over `engine` waiting with `strategy`.
    pub(crate) fn assemble(engine: Arc<Engine>, strategy: S) -> Locker<S> {
        Locker {
            engine,
            refresher: Arc::default(),
            extensions: Arc::default(),
            strategy,
        }
    }

    /// The pair a request is made with: the engine, and the refresher its guard joins.
    pub(crate) fn holding(&self) -> (&Engine, &Arc<Refreshing>) {
        (&self.engine, &self.refresher)
    }
}

impl<S: Strategy + std::fmt::Debug> std::fmt::Debug for Locker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("prefix", &self.engine.settings.prefix)
            .field("strategy", &self.strategy)
            .finish_non_exhaustive()
    }
}

impl Locker<Poll> {
    /// A polling locker with the defaults (prefix `waitlock:`, command timeout 3 s, claim
    /// window 500 ms, presence window 100 ms, retention one hour) on `client`.
    pub fn new(client: Client) -> Locker<Poll> {
        let settings = resolved(default_settings());
        Locker::assemble(Engine::new(Backend::Client(client), settings).start(), Poll)
    }

    /// A builder on a connected client (a polling locker; `.queued()` for a queued one).
    pub fn builder(client: Client) -> LockerBuilder<Poll> {
        LockerBuilder::new(Backend::Client(client))
    }

    /// A builder on a connected pool (each token's calls go through one of its clients).
    pub fn builder_with_pool(pool: Pool) -> LockerBuilder<Poll> {
        LockerBuilder::new(Backend::Pool(pool))
    }

    /// Connects a new client to `url` (e.g. `redis://127.0.0.1:6379`) with a reconnect policy
    /// (exponential, 10 ms to 1 s, forever) and a default command timeout, and builds a
    /// locker builder on it. Finish with [`LockerBuilder::build`] (a polling locker) or
    /// `.queued().build().await` (a queued one).
    ///
    /// With the `tls-rustls` feature a `rediss://` URL connects with TLS, trusting the system's
    /// CAs; [`connect_with`](Self::connect_with) takes a private CA and a client certificate.
    /// Without it a `rediss://` URL is refused ([`Error::InvalidSetting`], field `url`), never
    /// sent in plain text.
    ///
    /// Errors: [`Error::Connect`] with step [`ConnectStep::ParseUrl`](crate::ConnectStep::ParseUrl) when the URL does not
    /// parse, [`ConnectStep::Connect`](crate::ConnectStep::Connect) when connecting fails (nothing answers, the password or
    /// the server's certificate is refused, the server does not speak TLS, or it takes more
    /// than 5 s: source kind `Timeout`), [`ConnectStep::CheckServer`](crate::ConnectStep::CheckServer) when the server cannot
    /// hold locks (older than 7.0, or it may evict keys). Messages never show the URL's
    /// password.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no connection behind.
    pub async fn connect(url: &str) -> Result<LockerBuilder<Poll>> {
        Self::connect_with(url, &ConnectOptions::new()).await
    }

    /// As [`connect`](Self::connect), with a time limit of your own and, with the `tls-rustls`
    /// feature, TLS settings (`ConnectOptions::with_tls`) that the locker's client and a
    /// queued locker's subscriber connection both use.
    ///
    /// Errors: as [`connect`](Self::connect), [`Error::Connect`] (source kind `Timeout`) after
    /// `opts`' time limit; [`Error::InvalidSetting`] for a zero time limit (field `connect_timeout`),
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
    pub async fn connect_with(url: &str, opts: &ConnectOptions) -> Result<LockerBuilder<Poll>> {
        Ok(Self::builder(
            connect_client(url, DEFAULT_COMMAND_TIMEOUT, opts).await?,
        ))
    }
}

impl<S: Strategy> Locker<S> {
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
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let req = Request::attempt(self.holding(), key, opts, self.strategy.process_id());
        wait::strategy::acquire(&self.engine, key, req).await
    }

    /// Takes the lock on `key`, waiting up to `opts.wait`.
    ///
    /// - [`Poll`]: retries until the deadline; each sleep is a backoff delay, never past the
    ///   holder's remaining TTL (so an expired lock is taken promptly) or the deadline.
    /// - [`Queue`]: one plain attempt first (unless this process listens on the key already),
    ///   then the waiter queues in Redis (in the same call as its next attempt, once its grant
    ///   channel is subscribed) and is handed the lock by a release, in FIFO order across
    ///   processes. While queued it makes no calls, unless it is one of the two waiters that
    ///   watch the lock (they look when the holder's lease ends), its subscription was lost
    ///   and confirmed again, or its process was frozen.
    ///
    /// The guard it returns is valid for the TTL asked for (less the drift margin and the
    /// reply's or grant's delivery), handed over or taken free, and Redis keeps the lock that
    /// long with no further step: a waiter whose process Redis saw on the key within the
    /// presence window is granted its full TTL; another confirms its short grant (one round
    /// trip) before this returns. Connection errors and timeouts are retried until the
    /// deadline; at the deadline it returns at once (a queued waiter's entry leaves the queue
    /// in the background).
    ///
    /// Errors: [`Error::WaitTimeout`] at the deadline, or, when the last attempt before the
    /// deadline failed to reach Redis, that error ([`Error::Redis`], or [`Error::Timeout`]
    /// after a full command timeout); [`Error::Locked`] when `wait` is zero; otherwise as
    /// [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future leaves no lock and no task behind; a queued waiter
    /// leaves the registry (the channel is unsubscribed when it was the key's last waiter here,
    /// after a moment), leaves the Redis queue in the background, and gives back a grant it had
    /// been sent but not read, so the next waiter is served at once.
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
    pub async fn acquire_wait(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let req = Request::new(self.holding(), key, opts, self.strategy.process_id());
        wait::strategy::acquire_wait(&self.engine, &self.strategy, key, req).await
    }

    /// Runs `f` under the lock on `key`: waits for it (up to `opts.wait`), refreshes it every
    /// `ratio × TTL` ([`Refresh`](crate::Refresh)) while `f` runs, releases it afterwards and returns `f`'s value.
    ///
    /// `f` gets a [`LockContext`] whose `lost` token is cancelled the moment the lock is judged
    /// lost. `run` then returns [`Error::Expired`] (refresh found the token gone, or Redis
    /// stayed unreachable until the validity deadline) or with [`LossReason::TtlElapsed`](crate::LossReason::TtlElapsed) (refresh off
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
    #[tracing::instrument(name = "run", level = "debug", skip_all, fields(key = %key))]
    pub async fn run<F, Fut, T, E>(&self, key: &str, opts: &LockOptions, f: F) -> Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.acquire_wait(key, opts).await?;
        run_under(guard, f).await
    }

    /// Outcomes, wait times, lost locks and, for a queued locker, why its waiters woke, since
    /// the locker was built (shared by its clones).
    pub fn stats(&self) -> LockerStats {
        self.engine.meter.snapshot(self.strategy.wakes())
    }

    /// What Redis holds for `key` now: held or not, the remaining TTL, the last fence, how
    /// many waiters are queued (queued lockers' waiters; polling waiters do not queue), who
    /// holds it (its token; for a queued locker's holder, its process and label, and how long
    /// it has held) and the first [`STATUS_WAITERS`](crate::STATUS_WAITERS) waiters in queue
    /// order (process, label, how long each has waited). Two calls: one script, and one `MGET`
    /// of the labels when a process is named.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::WrongType`], [`Error::Timeout`] or
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<LockStatus> {
        let names = self.engine.names(key)?;
        let raw = self
            .engine
            .status(&names, crate::limits::STATUS_WAITERS as u32)
            .await?;
        let pids = LockStatus::pids(&raw);
        let labels = self.engine.labels(&pids).await?;
        Ok(LockStatus::from_raw(
            &raw,
            &self.engine.settings.prefix,
            |pid| labels.get(pid).cloned(),
        ))
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
                self.engine.settings.command_timeout,
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
                self.engine.settings.command_timeout,
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
                self.engine.settings.command_timeout,
            )
            .await?
        {
            Released::Deleted | Released::HandedOver => Ok(()),
            Released::NotHeld => Err(Error::NotHeld { key: names.key }),
        }
    }
}

impl Locker<Queue> {
    /// A queued locker with the defaults on `client`: opens its subscriber connection with
    /// the client's config (and its own reconnect policy). The same as
    /// `Locker::builder(client).queued().build().await`.
    ///
    /// Errors: [`Error::Connect`] if the subscriber cannot connect.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(client: waitlock::fred::clients::Client) -> waitlock::Result<()> {
    /// let locker = waitlock::Locker::queued(client).await?;
    /// let guard = locker.acquire_wait("cron:cleanup", &waitlock::LockOptions::new()).await?;
    /// // handed over by the previous holder's release, not found by polling
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn queued(client: Client) -> Result<Locker<Queue>> {
        Locker::builder(client).queued().build().await
    }

    /// A queued locker ([`PubSubLocker`](crate::PubSubLocker)) with the defaults, connected
    /// to `url`: the same as `Locker::connect(url).await?.queued().build().await`.
    ///
    /// Errors: as [`Locker::connect`], then as [`LockerBuilder::<Queue>::build`](crate::LockerBuilder::<Queue>::build).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no connection and nothing running.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example() -> waitlock::Result<()> {
    /// let locker = waitlock::PubSubLocker::from_url("redis://127.0.0.1:6379").await?;
    /// let guard = locker.acquire_wait("cron:cleanup", &waitlock::LockOptions::new()).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn from_url(url: &str) -> Result<Locker<Queue>> {
        Locker::connect(url).await?.queued().build().await
    }

    /// A queued locker ([`PubSubLocker`](crate::PubSubLocker)) with the defaults on `client`:
    /// the same as [`Locker::queued`].
    ///
    /// Errors: [`Error::Connect`] if the subscriber cannot connect.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    pub async fn from_client(client: Client) -> Result<Locker<Queue>> {
        Locker::queued(client).await
    }

    /// How many keys and waiters the registry holds now (both 0 when nobody waits).
    pub fn registry_size(&self) -> RegistrySize {
        let (keys, waiters) = self.strategy.hub.size();
        RegistrySize { keys, waiters }
    }

    /// Resolves once Redis has processed every subscribe and unsubscribe that the registry
    /// asked for before this call, the subscriptions of keys nobody waits on any more (they
    /// linger 2 s after their last waiter) included (e.g. to check `PUBSUB SHARDNUMSUB` after
    /// waiters left).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn subscriptions_settled(&self) {
        self.strategy.hub.settled().await
    }

    /// The id fred gives the subscriber connection's client (to find it in `CLIENT LIST`
    /// together with `CLIENT SETNAME`, or in logs).
    pub fn subscriber_id(&self) -> &str {
        self.strategy.hub.subscriber.id()
    }

    /// This locker's process id in Redis (12 hex digits): its waiters' queue entries and its
    /// holders' tokens start with it, the processes hash records it, and its grants arrive on
    /// `{<prefix><key>}:w:<id>`.
    pub fn process_id(&self) -> &str {
        &self.strategy.hub.pid
    }

    /// Whether the server has sharded pub/sub and this locker uses it (else classic pub/sub).
    pub fn uses_sharded_pubsub(&self) -> bool {
        self.strategy.hub.mode == wait::notify::hub::Mode::Sharded
    }
}
