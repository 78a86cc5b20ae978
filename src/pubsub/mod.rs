//! `PubSubLocker`: waiters woken by the release's PUBLISH.

mod hub;
mod stats;

pub use stats::{RegistrySize, WakeStats};

use crate::error::{Error, Result};
use crate::guard::LockGuard;
use crate::locker::{Locker, LockerBuilder};
use crate::options::LockOptions;
use crate::run::{run_under, LockContext};
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::ReconnectPolicy;
use hub::{Hint, Hub, SubState};
use stats::WakeReason;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, sleep_until, Instant};

/// How long a head that defers to other processes waits before it attempts anyway.
const DEFER_LIMIT: Duration = Duration::from_millis(5);

/// A distributed lock manager whose waiters are woken when the holder releases.
///
/// Same lock surface as [`Locker`] (same scripts, same keys, interoperable with it: a release
/// by either wakes the other's waiters). All waiters of all keys in the process share ONE
/// subscriber connection; a per-key registry subscribes a key's channel while someone waits on
/// it. Within a process, the waiters of a key queue (FIFO) and only the head contends in Redis;
/// across processes, heads race on each release.
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
            .field("prefix", &self.locker.core.prefix)
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

    /// A builder (prefix, command timeout); finish it with [`LockerBuilder::build_pubsub`].
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

    pub(crate) async fn start(locker: Locker) -> Result<PubSubLocker> {
        let core = &locker.core;
        let client = core.backend.client();
        let mut perf = client.perf_config();
        // Bursts of releases must not overflow the message buffer (fred's default is 32). The
        // dispatcher only looks each message up and wakes a slot, so it drains far faster than
        // Redis can publish; 4,096 slots (fred sizes each of its event channels so) are ample,
        // and an overflow still only costs a wake-up of every waiter.
        perf.broadcast_channel_capacity = perf.broadcast_channel_capacity.max(4096);
        if perf.default_command_timeout.is_zero() {
            perf.default_command_timeout = core.command_timeout;
        }
        let subscriber = SubscriberClient::new(
            client.client_config(),
            Some(perf),
            Some(client.connection_config().clone()),
            Some(ReconnectPolicy::new_exponential(0, 10, 1000, 2)),
        );
        let messages = subscriber.message_rx();
        let reconnects = subscriber.reconnect_rx();
        let connect_limit = core.command_timeout.max(Duration::from_secs(1));
        let fail = |source| Error::Redis {
            key: String::new(),
            op: "connect subscriber",
            source,
        };
        match tokio::time::timeout(connect_limit, subscriber.init()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(fail(e)),
            Err(_) => {
                let s = subscriber.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(Duration::from_secs(1), s.quit()).await;
                });
                return Err(Error::Timeout {
                    key: String::new(),
                    op: "connect subscriber",
                    after: connect_limit,
                });
            }
        }
        let hub = Hub::start(subscriber, messages, reconnects, core.command_timeout);
        Ok(PubSubLocker { locker, hub })
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

    /// Resolves once Redis has confirmed every subscribe and unsubscribe that the registry
    /// asked for before this call (e.g. to check `PUBSUB NUMSUB` after waiters left).
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn subscriptions_settled(&self) {
        self.hub.settled().await
    }

    /// Counters of attempts and of why waits ended, since the locker was built.
    pub fn stats(&self) -> WakeStats {
        self.hub.counters.snapshot()
    }

    /// The id fred gives the subscriber connection's client (to find it in `CLIENT LIST`
    /// together with `CLIENT SETNAME`, or in logs).
    pub fn subscriber_id(&self) -> &str {
        self.hub.subscriber.id()
    }

    /// One attempt; exactly as [`Locker::acquire`].
    ///
    /// # Cancel safety
    /// As [`Locker::acquire`].
    pub async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.locker.acquire(key, opts).await
    }

    /// Takes the lock on `key`, waiting up to `opts.wait`.
    ///
    /// One attempt first, unless other waiters of this key in this process are queued (then it
    /// queues behind them). If it fails: register, have Redis confirm the key's subscription,
    /// wait for the local queue's head, then loop: attempt; if held, wait for the release
    /// notification or a timer of min(backoff delay, holder's remaining TTL, time to the
    /// deadline), whichever comes first. Connection errors are retried the same way.
    ///
    /// Errors: as [`Locker::acquire_wait`].
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future leaves the registry (and, when it was the key's last
    /// waiter, the channel is unsubscribed), and an attempt in flight is cleaned up as in
    /// [`Locker::acquire`].
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(client: waitlock::fred::clients::Client) -> waitlock::Result<()> {
    /// let locker = waitlock::PubSubLocker::new(client).await?;
    /// let guard = locker.acquire_wait("cron:cleanup", &waitlock::LockOptions::new()).await?;
    /// // woken by the previous holder's release, not by polling
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "acquire_wait", level = "debug", skip_all, fields(key = %key))]
    pub async fn acquire_wait(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        let mut req = self.locker.request(key, opts)?;
        if req.wait.is_zero() {
            // Try once, with the request already validated (not a second validation and token).
            return Box::pin(self.locker.acquire_once(&req)).await;
        }
        let counters = &self.hub.counters;
        let mut attempts = 0u32;
        let mut last_error = None;
        if !self.hub.has_waiters(&req.names.channel) {
            attempts += 1;
            counters.attempts.fetch_add(1, Ordering::Relaxed);
            match Box::pin(self.locker.attempt(&req)).await {
                Ok(Ok(guard)) => return Ok(guard),
                Ok(Err(_)) => {}
                Err(e) if e.is_transient() => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        // (Attempts are boxed below: their state would otherwise stay in every waiting future.)
        let registration = self.hub.register(&req.names.channel);
        let slot = &registration.slot;

        // Redis must have processed the SUBSCRIBE before the attempt that may fail, or a
        // release published in between would be missed.
        let mut sub = slot.sub.subscribe();
        tokio::select! {
            r = sub.wait_for(|s| *s != SubState::Pending) => {
                if r.is_err() {
                    return Err(req.give_up(attempts, last_error));
                }
            }
            _ = sleep_until(req.deadline) => return Err(req.give_up(attempts, last_error)),
        }
        let _turn = tokio::select! {
            turn = slot.gate.lock() => turn,
            _ = sleep_until(req.deadline) => return Err(req.give_up(attempts, last_error)),
        };

        let mut hint = slot.hint();
        let mut defer = false;
        loop {
            let notified = slot.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let epoch = slot.epoch();
            let skip = hint.take().filter(|h| h.epoch == epoch);
            let deferring = std::mem::take(&mut defer);
            let remaining = if let Some(h) = skip {
                // The previous local head took the lock at this epoch and no release has been
                // seen since: it is still held, skip the attempt.
                Some(h.expires.saturating_duration_since(Instant::now()))
            } else if deferring {
                // Other processes' turn (see `Slot::should_defer`): one of them takes the lock
                // and its release wakes us; if none does, the short timer brings us back.
                counters.deferred.fetch_add(1, Ordering::Relaxed);
                Some(DEFER_LIMIT)
            } else {
                attempts += 1;
                counters.attempts.fetch_add(1, Ordering::Relaxed);
                match Box::pin(self.locker.attempt(&req)).await {
                    Ok(Ok(guard)) => {
                        slot.won();
                        slot.set_hint(Hint {
                            epoch,
                            expires: Instant::now() + Duration::from_millis(req.ttl_ms),
                        });
                        return Ok(guard);
                    }
                    Ok(Err(remaining)) => {
                        last_error = None;
                        remaining
                    }
                    Err(e) if e.is_transient() => {
                        last_error = Some(e);
                        None
                    }
                    Err(e) => return Err(e),
                }
            };
            let now = Instant::now();
            if now >= req.deadline {
                return Err(req.give_up(attempts, last_error));
            }
            let timer = req.next_sleep(now, remaining);
            let reason = tokio::select! {
                _ = &mut notified => Some(slot.reason()),
                _ = sleep(timer) => None,
            };
            counters.woke(reason);
            defer = reason == Some(WakeReason::Notification) && slot.should_defer();
            // The deadline came first. While the subscription stands, a release would have
            // been notified, and the holder's TTL outlasts the deadline, so the lock is still
            // held: give up without a futile last attempt.
            let still_held =
                !deferring && remaining.is_some_and(|r| r > timer) && last_error.is_none();
            if reason.is_none()
                && now + timer >= req.deadline
                && still_held
                && *slot.sub.borrow() == SubState::Confirmed
            {
                return Err(req.give_up(attempts, last_error));
            }
            tracing::debug!(key = %req.names.key, attempts, ?reason, "woke (None = timer)");
        }
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

    /// Token-level; as [`Locker::unlock`] (wakes the key's waiters everywhere).
    ///
    /// # Cancel safety
    /// As [`Locker::unlock`].
    pub async fn unlock(&self, key: &str, token: &str) -> Result<()> {
        self.locker.unlock(key, token).await
    }
}
