//! `Locker`: waits by retrying with jittered exponential backoff.

use crate::core::{new_token, Attempt, Backend, Core};
use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::jitter::Delays;
use crate::keys::{check_prefix, Names};
use crate::options::{check_token, check_ttl, LockOptions};
use crate::pubsub::PubSubLocker;
use crate::run::{run_under, LockContext};
use fred::clients::{Client, Pool};
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::Builder;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The default time limit of one Redis call made by this crate.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(3);
/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "waitlock:";
/// When a wait deadline is this close, the last attempt still gets this long to answer.
const LAST_ATTEMPT_GRACE: Duration = Duration::from_millis(5);

/// A distributed lock manager that waits by polling with full-jitter exponential backoff.
///
/// Cheap to clone (an `Arc` inside). Built from a connected fred [`Client`] or [`Pool`].
/// Prefer [`PubSubLocker`] when waiters are common: it wakes them on release instead.
///
/// **What your client must have:** fred has by default no reconnect policy (a cut connection
/// never comes back) and no command timeout. This crate bounds each of its calls by its own
/// command timeout ([`LockerBuilder::command_timeout`]), but set a `ReconnectPolicy` on the
/// client you pass in. [`Locker::connect`] builds a client with both.
#[derive(Clone)]
pub struct Locker {
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("prefix", &self.core.prefix)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Locker`] or a [`PubSubLocker`].
#[derive(Clone)]
#[must_use]
pub struct LockerBuilder {
    backend: Backend,
    prefix: String,
    command_timeout: Duration,
}

impl LockerBuilder {
    /// The prefix of every Redis name this locker uses; non-empty, at most 256 bytes, without
    /// braces. Defaults to `waitlock:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The time limit of each Redis call the locker makes (a call that passes it fails with
    /// [`Error::Timeout`]). Must be non-zero. Defaults to 3 s.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    fn core(self) -> Result<Core> {
        check_prefix(&self.prefix)?;
        if self.command_timeout.is_zero() {
            return Err(Error::InvalidOptions {
                key: String::new(),
                field: "command_timeout",
                value: "0ns".into(),
                reason: "must be non-zero",
            });
        }
        Ok(Core::new(self.backend, self.prefix, self.command_timeout))
    }

    /// A polling [`Locker`]. Errors: [`Error::InvalidOptions`] for a bad prefix or timeout.
    pub fn build(self) -> Result<Locker> {
        Ok(Locker {
            core: Arc::new(self.core()?),
        })
    }

    /// A [`PubSubLocker`]: opens its one subscriber connection with the client's config.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves nothing running.
    pub async fn build_pubsub(self) -> Result<PubSubLocker> {
        PubSubLocker::start(Locker {
            core: Arc::new(self.core()?),
        })
        .await
    }
}

/// One acquisition request, validated.
pub(crate) struct Request {
    pub(crate) names: Names,
    pub(crate) token: String,
    pub(crate) own_token: bool,
    pub(crate) ttl_ms: u64,
    pub(crate) refresh_ratio: f64,
    pub(crate) wait: Duration,
    pub(crate) start: Instant,
    pub(crate) deadline: Instant,
    pub(crate) delays: Delays,
    pub(crate) backoff_cap: Duration,
}

impl Request {
    /// The time limit of an attempt made at `now`: the command timeout, shortened to reach the
    /// wait deadline (plus a small grace for the last attempt).
    fn limit(&self, core: &Core, now: Instant) -> Duration {
        if self.wait.is_zero() {
            return core.command_timeout;
        }
        core.command_timeout.min(
            self.deadline
                .saturating_duration_since(now)
                .max(LAST_ATTEMPT_GRACE),
        )
    }

    /// The next sleep: a backoff delay, cut to the holder's remaining TTL (plus 1 ms, as PTTL
    /// rounds down) and to the deadline.
    pub(crate) fn next_sleep(&mut self, now: Instant, remaining: Option<Duration>) -> Duration {
        let mut d = self.delays.next_delay(self.backoff_cap);
        if let Some(r) = remaining {
            d = d.min(r + Duration::from_millis(1));
        }
        d.min(self.deadline.saturating_duration_since(now))
    }

    /// The error of a wait that ran out: the last connection error if the last attempt failed
    /// that way (it says more), else `WaitTimeout`.
    pub(crate) fn give_up(&self, attempts: u32, last_error: Option<Error>) -> Error {
        last_error.unwrap_or_else(|| Error::WaitTimeout {
            key: self.names.key.clone(),
            waited: self.start.elapsed(),
            attempts,
        })
    }
}

/// What one attempt gives the wait loops: a guard, or the holder's remaining TTL.
pub(crate) type Outcome = std::result::Result<LockGuard, Option<Duration>>;

impl Locker {
    /// A locker with the defaults (prefix `waitlock:`, command timeout 3 s) on `client`.
    pub fn new(client: Client) -> Locker {
        Locker {
            core: Arc::new(Core::new(
                Backend::Client(client),
                DEFAULT_PREFIX.into(),
                DEFAULT_COMMAND_TIMEOUT,
            )),
        }
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
            prefix: DEFAULT_PREFIX.into(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
        }
    }

    /// Connects a new client to `url` (e.g. `redis://127.0.0.1:6379`) with a reconnect policy
    /// (exponential, 10 ms to 1 s, forever) and a default command timeout, and builds a
    /// locker builder on it.
    ///
    /// Errors: [`Error::Redis`] (key empty) when the URL does not parse or nothing answers
    /// within the connection timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call leaves no connection behind.
    pub async fn connect(url: &str) -> Result<LockerBuilder> {
        Ok(Self::builder(connect_client(url).await?))
    }

    /// The fred client this locker sends commands through (a pool's next client).
    pub fn client(&self) -> &Client {
        self.core.backend.client()
    }

    /// The number of this locker's background tasks still running (keep-alives and background
    /// releases).
    pub fn background_tasks(&self) -> usize {
        self.core.tasks.get()
    }

    /// Resolves when no background task of this locker is running.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn idle(&self) {
        self.core.tasks.idle().await
    }

    pub(crate) fn request(&self, key: &str, opts: &LockOptions) -> Result<Request> {
        let checked = opts.validate(key)?;
        let names = self.core.names(key)?;
        let (token, own_token) = match opts.token() {
            Some(t) => (t.to_owned(), false),
            None => (new_token(), true),
        };
        let start = Instant::now();
        let backoff = opts.backoff();
        Ok(Request {
            names,
            token,
            own_token,
            ttl_ms: checked.ttl_ms,
            refresh_ratio: opts.refresh_ratio(),
            wait: opts.wait(),
            start,
            deadline: start + opts.wait(),
            delays: Delays::new(backoff.base(), backoff.cap()),
            backoff_cap: backoff.cap(),
        })
    }

    /// One attempt: a guard, the holder's remaining TTL, or an error.
    pub(crate) async fn attempt(&self, req: &Request) -> Result<Outcome> {
        let sent_at = Instant::now();
        let limit = req.limit(&self.core, sent_at);
        let attempt = self
            .core
            .try_acquire(&req.names, &req.token, req.ttl_ms, limit, req.own_token)
            .await?;
        let fence = match attempt {
            Attempt::Acquired { fence } => fence,
            // Our own fresh token can only be there because fred re-sent the script.
            Attempt::AlreadyHeld { fence, .. } if req.own_token => fence,
            Attempt::AlreadyHeld { remaining, .. } => {
                return Err(Error::AlreadyHeld {
                    key: req.names.key.clone(),
                    remaining_ttl: remaining,
                })
            }
            Attempt::Locked { remaining } => return Ok(Err(remaining)),
        };
        tracing::debug!(key = %req.names.key, fence, "acquired");
        Ok(Ok(LockGuard::new(
            Arc::clone(&self.core),
            req.names.clone(),
            req.token.clone(),
            fence,
            Duration::from_millis(req.ttl_ms),
            sent_at,
            req.refresh_ratio,
        )))
    }

    /// One attempt to take the lock on `key`.
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
    #[tracing::instrument(name = "acquire", level = "debug", skip_all, fields(key = %key))]
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let req = self.request(key, opts)?;
        self.acquire_once(&req).await
    }

    /// One attempt for a validated request; `Locked` when another token holds the key.
    pub(crate) async fn acquire_once(&self, req: &Request) -> Result<LockGuard> {
        self.attempt(req).await?.map_err(|remaining| Error::Locked {
            key: req.names.key.clone(),
            remaining_ttl: remaining,
        })
    }

    /// Takes the lock on `key`, retrying until `opts.wait` has passed. Each sleep is a backoff
    /// delay, never past the holder's remaining TTL (so an expired lock is taken promptly) or
    /// the deadline. Connection errors and timeouts are retried the same way until the
    /// deadline.
    ///
    /// Errors: [`Error::WaitTimeout`] at the deadline (or the last connection error, when the
    /// last attempt failed for that reason); [`Error::Locked`] when `wait` is zero; otherwise as
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
        let mut req = self.request(key, opts)?;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            // Boxed: the attempt's state (~0.9 KiB) would otherwise stay in the future while it
            // sleeps, for every waiter.
            let (remaining, last_error) = match Box::pin(self.attempt(&req)).await {
                Ok(Ok(guard)) => return Ok(guard),
                Ok(Err(remaining)) => (remaining, None),
                Err(e) if e.is_transient() && !req.wait.is_zero() => (None, Some(e)),
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            if now >= req.deadline {
                if req.wait.is_zero() {
                    return Err(Error::Locked {
                        key: req.names.key.clone(),
                        remaining_ttl: remaining,
                    });
                }
                return Err(req.give_up(attempts, last_error));
            }
            let sleep = req.next_sleep(now, remaining);
            tracing::debug!(key = %req.names.key, attempts, ?sleep, "waiting (timer)");
            tokio::time::sleep(sleep).await;
        }
    }

    /// Runs `f` under the lock on `key`: waits for it (up to `opts.wait`), refreshes it every
    /// `refresh_ratio × TTL` while `f` runs, releases it afterwards and returns `f`'s value.
    ///
    /// `f` gets a [`LockContext`] whose token is cancelled the moment the lock is judged lost.
    /// `run` then returns [`Error::Expired`] (refresh found the token gone, or Redis stayed
    /// unreachable until the validity deadline) or [`Error::LockTimeout`] (refresh off and the
    /// TTL passed) once `f` returns, whatever `f` returned. `f`'s own errors come back as they
    /// are. A panic in `f` releases the lock, then resumes.
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
    ///         if ctx.token.is_cancelled() {
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

    /// Token-level: one attempt to take `key` for `token` with `ttl`. Returns the fence.
    ///
    /// Errors: [`Error::Locked`], [`Error::AlreadyHeld`] (this token holds it already; the
    /// TTL is left as it was), bad input, or Redis errors.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call may leave `key` held by `token` until you
    /// [`unlock`](Self::unlock) it or it expires.
    #[tracing::instrument(name = "acquire", level = "debug", skip_all, fields(key = %key))]
    pub async fn try_lock(&self, key: &str, token: &str, ttl: Duration) -> Result<u64> {
        let names = self.core.names(key)?;
        let ttl_ms = check_ttl(key, ttl)?;
        check_token(key, token)?;
        match self
            .core
            .try_acquire(&names, token, ttl_ms, self.core.command_timeout, false)
            .await?
        {
            Attempt::Acquired { fence } => Ok(fence),
            Attempt::AlreadyHeld { remaining, .. } => Err(Error::AlreadyHeld {
                key: names.key,
                remaining_ttl: remaining,
            }),
            Attempt::Locked { remaining } => Err(Error::Locked {
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
        let names = self.core.names(key)?;
        let ttl_ms = check_ttl(key, ttl)?;
        check_token(key, token)?;
        if self
            .core
            .extend(&names, token, ttl_ms, self.core.command_timeout)
            .await?
        {
            Ok(())
        } else {
            Err(Error::NotHeld { key: names.key })
        }
    }

    /// Token-level: releases `key` if `token` holds it, and wakes its waiters.
    ///
    /// Errors: [`Error::NotHeld`] (the lock is left as it is), bad input, or Redis errors.
    ///
    /// # Cancel safety
    /// Cancel safe: the script is idempotent; a dropped call leaves the lock released or held.
    #[tracing::instrument(name = "release", level = "debug", skip_all, fields(key = %key))]
    pub async fn unlock(&self, key: &str, token: &str) -> Result<()> {
        let names = self.core.names(key)?;
        check_token(key, token)?;
        if self
            .core
            .release(&names, token, self.core.command_timeout)
            .await?
        {
            Ok(())
        } else {
            Err(Error::NotHeld { key: names.key })
        }
    }
}

/// A client for `url` with a reconnect policy and a command timeout.
pub(crate) async fn connect_client(url: &str) -> Result<Client> {
    let redis = |op, source| Error::Redis {
        key: String::new(),
        op,
        source,
    };
    let config = Config::from_url(url).map_err(|e| redis("parse url", e))?;
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = DEFAULT_COMMAND_TIMEOUT)
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(2))
        .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
        .build()
        .map_err(|e| redis("connect", e))?;
    // `init` resolves on the first connection attempt's outcome; if it fails the router task
    // is stopped, so nothing is left behind.
    match tokio::time::timeout(Duration::from_secs(5), client.init()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(redis("connect", e)),
        Err(_) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
            Err(Error::Timeout {
                key: String::new(),
                op: "connect",
                after: Duration::from_secs(5),
            })
        }
    }
}
