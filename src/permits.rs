//! Permits on a key: a fair counting semaphore ([`Semaphore`]) and a read-write lock
//! ([`RwLock`]), on the same queue, grant and guard as the lock.
//!
//! A key's permits are a set of leases in Redis, one per holder, each with its own TTL and its
//! own fence; a holder holds a *weight* of them (at least 1, at most the key's permits). A
//! crashed or frozen holder's permits come back when its lease ends, never later; a release
//! frees only its own token's lease (a repeated or late release frees nothing). Waiters queue
//! as a lock's do, FIFO across processes and without barging: the oldest waiter is granted
//! when its weight fits in what is free, and a waiter that does not fit holds back the lighter
//! ones behind it; one release may grant to several waiters at once. `docs/design.md`
//! ("Permits") gives the protocol and its bounds.

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::refresh::Refreshing;
use crate::hold::run::{run_under, LockContext};
use crate::limits::{MAX_PERMITS, STATUS_WAITERS};
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::redis::scripts::RawPermits;
use crate::redis::Engine;
use crate::status::{LeaseHolder, Waiter};
use crate::wait::strategy::{Poll, Strategy};
use crate::wait::{self, Request};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A fair counting semaphore: at most `permits` weight held at once per key, across every
/// process and host. Made by [`Locker::semaphore`]; cheap to clone.
///
/// Its guards are [`LockGuard`]s with the whole surface of a lock's: `release`, background
/// refresh (`keep_alive`) and the loss token, `fence`, `valid_until`. A permit's fence is
/// taken from the key's one counter: every acquisition's is above every earlier one's, also
/// across restarts. Holders overlap by design, so a fence orders and names acquisitions but
/// cannot tell a store that a lower one's lease ended (a newer holder may come and go while
/// an older one still holds): to refuse stale writers to one resource, lock that resource.
#[derive(Clone)]
pub struct Semaphore<S = Poll> {
    engine: Arc<Engine>,
    refresher: Arc<Refreshing>,
    strategy: S,
    permits: u32,
}

impl<S: Strategy + std::fmt::Debug> std::fmt::Debug for Semaphore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("permits", &self.permits)
            .field("prefix", &self.engine.settings.prefix)
            .field("strategy", &self.strategy)
            .finish()
    }
}

/// What Redis holds for a key's permits now (see [`Semaphore::status`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitStatus {
    /// The key's number of permits, while anyone holds, waits or did lately (`None`: nothing
    /// recorded; the key is unused).
    pub permits: Option<u32>,
    /// Permits held by leases that have not ended (a read-write lock's writer holds all).
    pub held: u32,
    /// Holders whose lease has not ended.
    pub holders: usize,
    /// Waiters queued (dead ones are dropped by the next grant).
    pub queued: usize,
    /// When the first lease ends, if any is held: a crashed holder's permits come back then.
    pub first_lease_ends_in: Option<Duration>,
    /// The holders whose leases end first (10 at most), soonest first: token (`w<weight>:`,
    /// then the holder's process id and a random id for a queued locker's) and time left.
    pub leases: Vec<(String, Duration)>,
    /// The fence of the latest acquisition, if the key's state exists.
    pub fence: Option<u64>,
    /// The holders of `leases`, in the same order: process, label, permits held, time left.
    pub lease_holders: Vec<LeaseHolder>,
    /// The first waiters in queue order ([`STATUS_WAITERS`] at most; `queued` counts them
    /// all), with the permits each asks for.
    pub waiters: Vec<Waiter>,
}

impl PermitStatus {
    fn from_raw(raw: RawPermits, label: impl Fn(&str) -> Option<String>) -> PermitStatus {
        let small = |v: u64| v.min(u64::from(u32::MAX)) as u32;
        PermitStatus {
            lease_holders: crate::status::lease_holders(&raw.leases, &label),
            waiters: crate::status::waiters(&raw.waiters, raw.now_us, "", &label),
            permits: (raw.limit > 0).then(|| small(raw.limit)),
            held: small(raw.used),
            holders: raw.holders as usize,
            queued: raw.queued as usize,
            first_lease_ends_in: (raw.holders > 0).then_some(raw.first_end),
            fence: (raw.fence > 0).then_some(raw.fence),
            leases: raw.leases,
        }
    }
}

impl<S: Strategy> Locker<S> {
    /// A semaphore of `permits` permits per key, waiting as this locker does (a [`Queue`]
    /// locker's waiters are queued and granted, FIFO; a [`Poll`] locker's retry). A key's
    /// number of permits is fixed while anyone holds or waits: a semaphore with another number
    /// gets [`Error::PermitsMismatch`] there.
    ///
    /// Errors: [`Error::InvalidSetting`] when `permits` is 0 or above [`MAX_PERMITS`].
    ///
    /// [`Queue`]: crate::Queue
    pub fn semaphore(&self, permits: u32) -> Result<Semaphore<S>> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::invalid_setting(
                "permits",
                permits,
                "a semaphore has 1 to 1,048,576 permits",
            ));
        }
        Ok(Semaphore {
            engine: Arc::clone(&self.engine),
            refresher: Arc::clone(&self.refresher),
            strategy: self.strategy.clone(),
            permits,
        })
    }

    /// A read-write lock: many readers or one writer per key, FIFO (a queued writer holds back
    /// the readers that come after it; the readers at the head of the queue are granted
    /// together). Its keys are permit keys ([`MAX_PERMITS`] permits: a reader holds one, a
    /// writer all), so a semaphore on the same key name is refused while either is in use.
    pub fn rw_lock(&self) -> RwLock<S> {
        RwLock {
            sem: Semaphore {
                engine: Arc::clone(&self.engine),
                refresher: Arc::clone(&self.refresher),
                strategy: self.strategy.clone(),
                permits: MAX_PERMITS,
            },
        }
    }
}

impl<S: Strategy> Semaphore<S> {
    /// The number of permits of this semaphore's keys.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// A request for `weight` permits of `key`, its token naming this process (a queued
    /// locker's, also for a one-shot attempt): the scripts keep the watchers of the key's queue
    /// out of holders' processes where they can.
    fn request(&self, key: &str, weight: u32, opts: &LockOptions) -> Result<Request> {
        let pid = self.strategy.process_id();
        Request::permits(
            (&self.engine, &self.refresher),
            key,
            opts,
            pid,
            self.permits,
            weight,
        )
    }

    /// One attempt to take `weight` permits of `key`. It never jumps the queue: with waiters
    /// queued, it gets [`Error::Locked`] (they come first) even when the permits are free.
    ///
    /// Errors: [`Error::Locked`] (`remaining_ttl`: when the first lease ends);
    /// [`Error::PermitsMismatch`]; [`Error::InvalidOptions`] (`weight` 0 or above the
    /// permits, a fixed token; nothing sent); [`Error::InvalidKey`]; [`Error::WrongType`];
    /// [`Error::Timeout`] or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: permits taken by a dropped call are given back in the background.
    pub async fn acquire(&self, key: &str, weight: u32, opts: &LockOptions) -> Result<LockGuard> {
        let req = self.request(key, weight, opts);
        wait::strategy::acquire(&self.engine, key, req).await
    }

    /// Takes `weight` permits of `key`, waiting up to `opts.wait`, as
    /// [`Locker::acquire_wait`] waits for a lock: queued and granted in FIFO order by a
    /// [`Queue`](crate::Queue) locker, retrying with backoff by a [`Poll`] one. The guard is
    /// valid for the TTL asked for, like a lock's.
    ///
    /// Errors: as [`Locker::acquire_wait`], and [`Error::PermitsMismatch`] (nothing changed).
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Locker::acquire_wait`]: a dropped wait leaves the queue in the
    /// background and gives back permits it had been granted but not read, so the waiters
    /// behind it are served at once.
    pub async fn acquire_wait(
        &self,
        key: &str,
        weight: u32,
        opts: &LockOptions,
    ) -> Result<LockGuard> {
        let req = self.request(key, weight, opts);
        wait::strategy::acquire_wait(&self.engine, &self.strategy, key, req).await
    }

    /// Runs `f` holding `weight` permits of `key`, as [`Locker::run`] runs under a lock: waits
    /// (up to `opts.wait`), refreshes the lease while `f` runs, gives the permits back after,
    /// and returns `f`'s value ([`Error::Expired`] if they were or may have been lost while
    /// `f` ran).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops the refresh and gives the permits back in the
    /// background.
    pub async fn run<F, Fut, T, E>(
        &self,
        key: &str,
        weight: u32,
        opts: &LockOptions,
        f: F,
    ) -> Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.acquire_wait(key, weight, opts).await?;
        run_under(guard, f).await
    }

    /// What Redis holds for `key`'s permits now, read in one script call.
    ///
    /// Errors: [`Error::InvalidKey`], [`Error::WrongType`], [`Error::Timeout`] or
    /// [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<PermitStatus> {
        let engine = &self.engine;
        let names = crate::keys::Names::permits(&engine.settings.prefix, key, self.permits)?;
        let raw = engine.permit_status(&names, STATUS_WAITERS as u32).await?;
        let pids =
            crate::status::named_pids(raw.leases.iter().map(|(t, _)| t.as_str()), &raw.waiters);
        let labels = engine.labels(&pids).await?;
        Ok(PermitStatus::from_raw(raw, |pid| labels.get(pid).cloned()))
    }
}

/// A fair read-write lock: shared (read) and exclusive (write) holds of one key, FIFO. Made by
/// [`Locker::rw_lock`]; cheap to clone.
///
/// A queued writer holds back every reader that comes after it, and the readers at the head
/// of the queue are granted together (one release may grant a whole batch). There is no
/// upgrade: a reader that asks to write waits behind its own read until its wait deadline;
/// release the read first. Guards are [`LockGuard`]s, as for a lock.
#[derive(Clone)]
pub struct RwLock<S = Poll> {
    sem: Semaphore<S>,
}

impl<S: Strategy + std::fmt::Debug> std::fmt::Debug for RwLock<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwLock")
            .field("prefix", &self.sem.engine.settings.prefix)
            .field("strategy", &self.sem.strategy)
            .finish()
    }
}

impl<S: Strategy> RwLock<S> {
    /// One attempt to read `key` (shared). As [`Semaphore::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn read(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.sem.acquire(key, 1, opts).await
    }

    /// One attempt to write `key` (exclusive). As [`Semaphore::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire`].
    pub async fn write(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.sem.acquire(key, MAX_PERMITS, opts).await
    }

    /// Reads `key` (shared), waiting up to `opts.wait`. As [`Semaphore::acquire_wait`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire_wait`].
    pub async fn read_wait(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.sem.acquire_wait(key, 1, opts).await
    }

    /// Writes `key` (exclusive), waiting up to `opts.wait`. As [`Semaphore::acquire_wait`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::acquire_wait`].
    pub async fn write_wait(&self, key: &str, opts: &LockOptions) -> Result<LockGuard> {
        self.sem.acquire_wait(key, MAX_PERMITS, opts).await
    }

    /// Runs `f` reading `key` (shared). As [`Semaphore::run`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::run`].
    pub async fn run_read<F, Fut, T, E>(&self, key: &str, opts: &LockOptions, f: F) -> Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.sem.run(key, 1, opts, f).await
    }

    /// Runs `f` writing `key` (exclusive). As [`Semaphore::run`].
    ///
    /// # Cancel safety
    /// Cancel safe, as [`Semaphore::run`].
    pub async fn run_write<F, Fut, T, E>(&self, key: &str, opts: &LockOptions, f: F) -> Result<T, E>
    where
        F: FnOnce(LockContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        self.sem.run(key, MAX_PERMITS, opts, f).await
    }

    /// What Redis holds for `key` now: `held` is 1 per reader, [`MAX_PERMITS`] for a writer.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn status(&self, key: &str) -> Result<PermitStatus> {
        self.sem.status(key).await
    }
}
