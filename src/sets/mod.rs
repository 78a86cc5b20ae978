//! Several keys at once: `acquire_many`, `acquire_many_wait` and `run_many` on both lockers.
//!
//! Three paths, chosen per call (docs/design.md, "Several keys at once"):
//!
//! - **At once** (keys on one node: a single server, or one Cluster slot; for one attempt on
//!   either locker, and for a polling locker's wait): every key in one script
//!   (`lua/take_set.lua`, at most `TAKE_SET_MAX` = 256 keys a call; a larger set is taken in
//!   calls of 256, in order, each all or none, the first that finds a key held giving back
//!   what the ones before it took), or none. A key whose queue may have waiters counts as held
//!   (they come first). A polling wait holds nothing between attempts. No opt-in.
//! - **Queued at once** (a queued locker's wait for keys on one node, at most
//!   [`QUEUED_SET_MAX`] = 64): the set's member in every key's queue, holding nothing; the call
//!   that frees its last key hands it every key in one step and one message, when it heads
//!   each of those queues and each key is free (`lua/set_acquire.lua`, the wait loop of
//!   `wait::notify`, one for one key or a set). Sets that share a key are served in the order
//!   they queued; no deadlock. No opt-in.
//! - **Ordered acquisition** (keys in several slots, or a queued locker's wait for more than
//!   64 keys; only when the caller opts in with [`LockOptions::with_ordered_sets`]): the keys,
//!   made a set (duplicates merged), are sorted by hash slot and then by key, and taken in that
//!   order a run (the keys of one slot) at a time, each kept alive from the moment it is
//!   taken, under one deadline. Waiting, a run is waited for as a whole (queued at once, or by
//!   polling at once) only when a key of it was found held; the runs after it are tried all at
//!   once (in bursts of [`BURST`] keys), keeping those taken from the first and releasing
//!   those after the first that failed. Every caller sorts the same way, so a waiter only ever
//!   waits for a run of a slot greater than every key it holds, and holds nothing of that
//!   slot: no cycle of waiters, also beside sets waiting at once, and no rollback-and-retry
//!   livelock (it never gives back a key to let another set through). What it does not give:
//!   a waiter holds the earlier slots' keys while it waits, and FIFO holds per slot, not per
//!   set.
//!
//! Anything that ends a call early (its deadline, an error, a dropped future) releases every
//! key taken and leaves every queue. The keys share one loss token: any key lost cancels it.
//!
//! The wing: `order` (checking a set, its order by slot and key, and its runs), `at_once`
//! (one script a call, or a polling wait), `queued` (a queued locker's wait at once),
//! `in_order` (runs one after another) and `guard` (the held set and its release).

mod at_once;
mod guard;
mod in_order;
mod order;
mod queued;

pub use guard::{LockSetContext, LockSetGuard};

use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::run::{section_result, CatchUnwind};
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::wait::strategy::Strategy;
use std::future::Future;

/// How a set is taken (see `Locker::set_order`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Keys on one node, in one script (one call per 256 keys), no queue.
    AtOnce,
    /// Keys on one node waited for by a queued locker: once in every key's queue.
    Queued,
    /// Keys taken one after another in the one order (opt-in).
    InOrder,
}

impl<S: Strategy> Locker<S> {
    /// One attempt at the set `keys`: all of them held, or none. On one node (a single server,
    /// or keys of one Cluster slot, e.g. hash-tagged `{acct}:1`, `{acct}:2`) every key is taken
    /// in one script (one per 256 keys), never a key whose queue has waiters; across slots,
    /// one attempt at each key in order, which needs [`LockOptions::with_ordered_sets`].
    ///
    /// Errors: [`Error::InvalidOptions`] (nothing sent) when the keys are in several slots
    /// and `opts` has not opted in to ordered sets (field `ordered_sets`; the value names the
    /// keys' hash slots), `keys` is
    /// empty or has more than [`MAX_SET_KEYS`](crate::MAX_SET_KEYS) keys (field `keys`), `opts` has a fixed token
    /// (field `token`: each key gets a generated one, which a dropped attempt can give back),
    /// or an option is out of range (as for one key); [`Error::InvalidKey`] for
    /// a bad key; [`Error::Locked`] for the first key found held (the keys taken before it
    /// are released before this returns); [`Error::Expired`] when a key taken was lost
    /// before the last was taken; otherwise as [`acquire`](Self::acquire) for the key that
    /// failed.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future releases the keys it had taken in the background.
    pub async fn acquire_many<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<LockSetGuard> {
        let (keys, path) = self.set_order(keys, opts, false)?;
        match path {
            Path::AtOnce | Path::Queued => self.take_at_once(&keys, opts, false).await,
            Path::InOrder => self.take_in_order(&keys, opts, false).await,
        }
    }

    /// Takes every key of `keys`, waiting up to `opts.wait` for all of them: one deadline for
    /// the whole set.
    ///
    /// - A queued locker, keys on one node (a single server, or one Cluster slot), at most
    ///   64 of them: the set waits once in every key's queue, holding nothing, and is handed
    ///   every key in one step and one message when it is the oldest live waiter of each and
    ///   each is free. Sets that share a key are served in the order they queued (an older set
    ///   is never passed by a later one that overlaps it); a one-key waiter queued on one of
    ///   the keys is served in that order too. No opt-in needed.
    /// - A polling locker, keys on one node: the set at once, as
    ///   [`acquire_many`](Self::acquire_many) takes it, attempt after attempt with the backoff
    ///   of [`acquire_wait`](Self::acquire_wait), holding nothing between attempts (and in no
    ///   order: a polling waiter has no queue). No opt-in needed.
    /// - Otherwise (keys in several slots, or a queued locker's wait for more than 64 keys) in
    ///   order, which needs [`LockOptions::with_ordered_sets`]: the keys of each slot are
    ///   waited for together as above (at once in every key's queue, or by polling at once),
    ///   holding the keys of the slots before them. If a key already taken is lost
    /// meanwhile (Redis restarted, or stayed unreachable past its validity), every key is
    /// released and the set is taken again from the first, within the same deadline; with
    /// refresh off ([`Refresh::Off`](crate::Refresh::Off): the first keys' TTL elapsing while a later one is waited
    /// for is such a loss) it returns [`Error::Expired`] instead, so the set is never taken
    /// round after round.
    ///
    /// Errors: [`Error::WaitTimeout`] at the deadline (naming the key it was waiting for, the
    /// first its last attempt found held, `waited` the whole set's wait, `attempts` every
    /// attempt the set sent; the keys taken are released before it returns), or the
    /// connection error or timeout of the last attempt at that key when it failed so;
    /// [`Error::Locked`] when `wait` is zero; otherwise as
    /// [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped future releases the keys it had taken in the background, and
    /// leaves every queue it waited in (giving back a grant that raced the drop), with no lock,
    /// queue entry or task left behind (as [`acquire_wait`](Self::acquire_wait)).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(locker: waitlock::Locker<waitlock::Queue>) -> waitlock::Result<()> {
    /// use std::time::Duration;
    /// let opts = waitlock::LockOptions::new().with_wait(Duration::from_secs(2));
    /// // One hash tag: one Cluster slot, so the set waits at once in both keys' queues.
    /// let set = locker.acquire_many_wait(&["{stock}:paris", "{stock}:lyon"], &opts).await?;
    /// let (paris, lyon) = (set.fence("{stock}:paris"), set.fence("{stock}:lyon"));
    /// // ... move stock, passing each store its own fence ...
    /// # let _ = (paris, lyon);
    /// set.release().await?;
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "acquire_many", level = "debug", skip_all, fields(keys = keys.len()))]
    pub async fn acquire_many_wait<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<LockSetGuard> {
        let wait = !opts.wait().is_zero();
        let (keys, path) = self.set_order(keys, opts, wait)?;
        match path {
            Path::AtOnce => self.take_at_once(&keys, opts, wait).await,
            Path::Queued => self.take_queued(&keys, opts).await,
            Path::InOrder => self.take_in_order(&keys, opts, wait).await,
        }
    }

    /// Runs `f` under the locks on every key of `keys`: takes them as
    /// [`acquire_many_wait`](Self::acquire_many_wait) does, refreshes them while `f` runs,
    /// releases them afterwards and returns `f`'s value. As [`run`](Self::run) for one key:
    /// [`Error::Expired`] (naming the first key lost) when any key was, or may have been,
    /// lost while `f` ran, whatever `f` returned; a panic in `f` releases the set, then
    /// resumes.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future stops the refreshes and releases every key in the
    /// background.
    pub async fn run_many<K, F, Fut, T, E>(
        &self,
        keys: &[K],
        opts: &LockOptions,
        f: F,
    ) -> Result<T, E>
    where
        K: AsRef<str>,
        F: FnOnce(LockSetContext) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let set = self.acquire_many_wait(keys, opts).await?;
        let ctx = LockSetContext {
            lost: set.lost(),
            fences: set
                .guards
                .iter()
                .map(|g| (g.key().to_owned(), g.fence()))
                .collect(),
            leases: set.guards.iter().map(LockGuard::lease).collect(),
        };
        // If this future is dropped here, the guards' drops release them.
        let outcome = CatchUnwind(Box::pin(f(ctx))).await;
        let ended = set.release_after_section().await;
        section_result(outcome, ended)
    }
}
