//! The Lua scripts, how they are called, and what their replies mean.
//!
//! Every script shares one prelude, the queue layer (`lua/queue.lua`: names, the queue, the
//! processes hash, the watchers, the messages, the dead-head walk, the reply codes), then a
//! lock's value grammar (`lua/lock.lua`) or a semaphore's leases (`lua/permits.lua`), and the
//! same `KEYS` (the key, its state, queue, processes; permits: and holder fences) and `ARGV`
//! (token, ttl ms, retention ms, claim window ms, presence window ms, queue member, process
//! id, flag, fence; permits: and the number of permits), so any call can be read the same way
//! in `MONITOR`. `docs/design.md` explains the protocol;
//! `super::protocol` names the formats.

use super::protocol::{reply, Flag};
use super::{Client, Engine};
use crate::error::{Error, Op, Result};
use crate::keys::{Kind, Names};
use fred::interfaces::{ClientLike, LuaInterface, ServerInterface};
use fred::types::scripts::Script;
use fred::types::{FromValue, Value};
use std::time::Duration;
use tokio::time::Instant;

mod election;
mod status;
mod taken;
pub(crate) use status::{RawPermits, RawStatus};
pub(crate) use taken::CompareDelete;

/// A lock script: the queue layer, the lock's value grammar, the script.
macro_rules! lua {
    ($file:literal) => {
        concat!(
            include_str!("lua/queue.lua"),
            include_str!("lua/lock.lua"),
            include_str!($file)
        )
    };
}

/// Acquire; when held and a queue member is given, queue it.
pub(crate) const ACQUIRE: &str = lua!("lua/acquire.lua");
/// Extend (confirms a grant).
pub(crate) const EXTEND: &str = lua!("lua/extend.lua");
/// Release: hand the lock to the oldest live waiter, or delete it.
pub(crate) const RELEASE: &str = lua!("lua/release.lua");
/// A waiter leaves the queue, keeping or giving back a grant.
pub(crate) const LEAVE: &str = lua!("lua/leave.lua");
/// Status: read only.
pub(crate) const STATUS: &str = lua!("lua/status.lua");
/// A set's attempt on one node: every key, or queued once in every key's queue.
pub(crate) const SET_ACQUIRE: &str = lua!("lua/set_acquire.lua");
/// A set's release: every key let go, then each one's queue served.
pub(crate) const SET_RELEASE: &str = lua!("lua/set_release.lua");
/// A set's waiter leaves every queue, keeping or giving back a grant.
pub(crate) const SET_LEAVE: &str = lua!("lua/set_leave.lua");

/// Refresh many locks taken free in one call (on its own: see the script).
pub(crate) const REFRESH: &str = include_str!("lua/refresh.lua");
/// Take a set of free locks in one call, all or none (on its own: see the script).
pub(crate) const TAKE_SET: &str = include_str!("lua/take_set.lua");

/// Give back many locks taken free in one call (on its own: see the script).
pub(crate) const GIVE_BACK: &str = include_str!("lua/give_back.lua");

/// The most locks one [`TAKE_SET`] call takes (the script's bound; a larger set is split).
pub(crate) const TAKE_SET_MAX: usize = 256;

/// Election: a new leader's announcement (on its own: see the script).
pub(crate) const ELECT_ANNOUNCE: &str = include_str!("lua/elect_announce.lua");
/// Election: a leader marks its record resigned.
pub(crate) const ELECT_RESIGN: &str = include_str!("lua/elect_resign.lua");
/// Election: who leads, read only.
pub(crate) const ELECT_READ: &str = include_str!("lua/elect_read.lua");

/// A permit script: the queue layer, the semaphore's leases, the script.
macro_rules! permits_lua {
    ($file:literal) => {
        concat!(
            include_str!("lua/queue.lua"),
            include_str!("lua/permits.lua"),
            include_str!($file)
        )
    };
}

/// Permits: acquire (queueing when given a member).
pub(crate) const PERMIT_ACQUIRE: &str = permits_lua!("lua/permit_acquire.lua");
/// Permits: extend a holder's lease.
pub(crate) const PERMIT_EXTEND: &str = permits_lua!("lua/permit_extend.lua");
/// Permits: give them back and grant to the waiters that now fit.
pub(crate) const PERMIT_RELEASE: &str = permits_lua!("lua/permit_release.lua");
/// Permits: a waiter leaves the queue, keeping or giving back a grant.
pub(crate) const PERMIT_LEAVE: &str = permits_lua!("lua/permit_leave.lua");
/// Permits: status, read only.
pub(crate) const PERMIT_STATUS: &str = permits_lua!("lua/permit_status.lua");

/// What an acquire attempt learned.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// We hold it now, with this fence.
    Acquired { fence: u64 },
    /// A short grant to this token was waiting for it; the attempt confirmed it.
    Granted { fence: u64 },
    /// This token held it already (a re-sent script, a grant whose message was lost, or a
    /// fixed token used twice).
    AlreadyHeld {
        fence: u64,
        remaining: Option<Duration>,
    },
    /// Another token holds it; `queued` when our member is in the queue now; `behind_queue`
    /// when waiters may be queued (who come first).
    Locked {
        remaining: Option<Duration>,
        queued: Option<Queued>,
        behind_queue: bool,
    },
}

/// What a one-shot attempt at a set of locks ([`TAKE_SET`]) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetAttempt {
    /// Every lock taken (or held already by its token, the call sent again): their fences,
    /// in order.
    Taken { fences: Vec<u64> },
    /// Lock `index` is held by another token (`remaining`: its TTL); nothing taken.
    Held {
        index: usize,
        remaining: Option<Duration>,
    },
    /// Lock `index` is free but waiters may be queued on it (they come first); nothing taken.
    Queued { index: usize },
}

/// What a set's attempt ([`SET_ACQUIRE`]) learned.
#[derive(Debug, Clone)]
pub(crate) enum SetTry {
    /// Every key taken now: their fences, in order.
    Acquired { fences: Vec<u64> },
    /// A short grant of the set to this token was waiting for it; the attempt confirmed it.
    Granted { fences: Vec<u64> },
    /// This token held every key already (a grant whose message was lost or crossed this
    /// call, or the call sent twice); the shortest of their remaining TTLs.
    AlreadyHeld {
        fences: Vec<u64>,
        remaining: Option<Duration>,
    },
    /// Key `index` is held, or free with a set ahead of ours waiting at its head (`remaining`
    /// `None`); `queued` when our member is in every key's queue now (`remaining`: the lease
    /// that ends first among the keys we watch).
    Locked {
        index: usize,
        remaining: Option<Duration>,
        queued: Option<Queued>,
    },
}

/// What a batched give-back ([`GIVE_BACK`]) did to one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GivenBack {
    /// The token does not hold the lock; nothing changed.
    NotHeld,
    /// Deleted.
    Deleted,
    /// Untouched (waiters may be queued behind it): release it alone.
    Alone,
}

/// What a queueing attempt learned about the queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queued {
    /// Redis has no subscription on our grant channel (it dropped it: a Cluster slot moved).
    pub(crate) deaf: bool,
    /// The latest fence when the attempt ran: only a grant with a higher one is new.
    pub(crate) fence: u64,
    /// We are one of the lock's watchers: we look at the lock when the holder's lease ends.
    pub(crate) watcher: bool,
    /// Redis' clock when the attempt ran (microseconds).
    pub(crate) redis_us: u64,
    /// The queue's length after the attempt (our member included), counted with the
    /// `metrics` feature (its queue-depth metric is the one reader); 0 when not counted.
    pub(crate) depth: u64,
}

/// What an extend did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extended {
    /// The token does not hold the lock.
    NotHeld,
    /// The TTL is set again; the fence of the hold as Redis has it (`None` only when the
    /// fence counter outlived its retention).
    Renewed { fence: Option<u64> },
    /// A short grant to the token is confirmed (full TTL); the fence of the hold.
    Confirmed { fence: u64 },
}

/// What a batched refresh did to one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batched {
    /// The token does not hold the lock; nothing changed.
    NotHeld,
    /// The TTL is set again.
    Renewed,
    /// Untouched: refresh it with the extend script.
    Alone,
}

/// What leaving the queue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Nothing given back (the token held nothing, or a newer grant than the orphan's).
    Nothing,
    /// The token held the lock and gave it back (handed on, or deleted).
    GaveBack,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The token did not hold the lock; nothing changed.
    NotHeld,
    /// Deleted: nobody was waiting.
    Deleted,
    /// Handed to the oldest live waiter.
    HandedOver,
}

/// A script and the operation name its errors carry.
pub(crate) struct Lua {
    script: Script,
    op: Op,
    /// How many times this engine loaded the script (after `NOSCRIPT`), and the gate that
    /// makes the calls that meet `NOSCRIPT` together wait for one load: after a restart, a
    /// failover or a flush, every call in flight meets it at once (10,000 leases' refresh
    /// batches loaded their script 80 times over: review 3).
    loads: std::sync::atomic::AtomicU64,
    gate: tokio::sync::Mutex<()>,
}

impl Lua {
    fn new(op: Op, text: &'static str) -> Lua {
        Lua {
            script: Script::from_lua(text),
            op,
            loads: std::sync::atomic::AtomicU64::new(0),
            gate: tokio::sync::Mutex::new(()),
        }
    }

    /// Loads the script (on every primary of a cluster) unless another call loaded it after
    /// `seen` (the count before this call's send), waiting for a load in progress.
    async fn load(
        &self,
        client: &Client,
        seen: u64,
    ) -> std::result::Result<(), fred::error::Error> {
        use std::sync::atomic::Ordering;
        let _gate = self.gate.lock().await;
        if self.loads.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        let text = self.script.lua().cloned().unwrap_or_default();
        if client.is_clustered() {
            client
                .script_load_cluster::<fred::types::Value, _>(text)
                .await?;
        } else {
            client.script_load::<String, _>(text).await?;
        }
        self.loads.fetch_add(1, Ordering::Release);
        Ok(())
    }
}

/// One kind of key's scripts.
pub(crate) struct Set {
    acquire: Lua,
    extend: Lua,
    release: Lua,
    leave: Lua,
    status: Lua,
}

pub(crate) struct Scripts {
    lock: Set,
    permits: Set,
    set_acquire: Lua,
    set_release: Lua,
    set_leave: Lua,
    refresh: Lua,
    take_set: Lua,
    give_back: Lua,
    announce: Lua,
    resign: Lua,
    read_leader: Lua,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            lock: Set {
                acquire: Lua::new(Op::Acquire, ACQUIRE),
                extend: Lua::new(Op::Extend, EXTEND),
                release: Lua::new(Op::Release, RELEASE),
                leave: Lua::new(Op::LeaveQueue, LEAVE),
                status: Lua::new(Op::Status, STATUS),
            },
            permits: Set {
                acquire: Lua::new(Op::Acquire, PERMIT_ACQUIRE),
                extend: Lua::new(Op::Extend, PERMIT_EXTEND),
                release: Lua::new(Op::Release, PERMIT_RELEASE),
                leave: Lua::new(Op::LeaveQueue, PERMIT_LEAVE),
                status: Lua::new(Op::Status, PERMIT_STATUS),
            },
            set_acquire: Lua::new(Op::Acquire, SET_ACQUIRE),
            set_release: Lua::new(Op::Release, SET_RELEASE),
            set_leave: Lua::new(Op::LeaveQueue, SET_LEAVE),
            refresh: Lua::new(Op::Extend, REFRESH),
            take_set: Lua::new(Op::Acquire, TAKE_SET),
            give_back: Lua::new(Op::Release, GIVE_BACK),
            announce: Lua::new(Op::Acquire, ELECT_ANNOUNCE),
            resign: Lua::new(Op::Release, ELECT_RESIGN),
            read_leader: Lua::new(Op::Status, ELECT_READ),
        }
    }

    /// The scripts of `names`' kind of key.
    fn of(&self, names: &Names) -> &Set {
        match names.kind {
            Kind::Lock => &self.lock,
            Kind::Permits { .. } => &self.permits,
        }
    }
}

fn remaining(ms: i64) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

fn unexpected(names: &Names, op: Op, reply: &[i64]) -> Error {
    Error::Redis {
        key: names.key.clone(),
        op,
        source: fred::error::Error::new(
            fred::error::ErrorKind::Parse,
            format!("unexpected {op} reply {reply:?}"),
        ),
    }
}

/// A reply element as text: its bytes (lossy UTF-8) or, for another kind, what fred makes of
/// it.
fn text(v: &Value) -> Option<String> {
    v.as_bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .or_else(|| v.as_string())
}

fn ms(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// One script call's arguments (`ARGV` is the same for every script; see `lua/queue.lua`).
pub(crate) struct Call<'a> {
    pub(crate) names: &'a Names,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    /// The queue member (see [`protocol::member`]), empty when the caller does not queue.
    pub(crate) member: &'a str,
    /// The calling process's id (a queued locker's), empty for others.
    pub(crate) pid: &'a str,
    pub(crate) flag: Option<Flag>,
}

impl<'a> Call<'a> {
    /// A call for `token` on `names` with no TTL, no queueing and no process id.
    pub(crate) fn new(names: &'a Names, token: &'a str) -> Call<'a> {
        Call {
            names,
            token,
            ttl_ms: 1,
            member: "",
            pid: "",
            flag: None,
        }
    }
}

/// How a script is sent: by its SHA (loaded again on NOSCRIPT), or with its text (clean-up
/// that must run in order with what was sent before it on the same client: a NOSCRIPT retry
/// would go behind later commands).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Sha,
    Text,
}

impl Engine {
    fn argv(&self, c: &Call<'_>) -> Vec<String> {
        let retention = ms(self.retention);
        let (flag, fence) = c.flag.map(Flag::args).unwrap_or(("", String::new()));
        let mut argv = vec![
            c.token.to_owned(),
            c.ttl_ms.to_string(),
            retention.to_string(),
            ms(self.claim_window).to_string(),
            ms(self.presence_window).to_string(),
            c.member.to_owned(),
            c.pid.to_owned(),
            flag.to_owned(),
            fence,
        ];
        match c.names.kind {
            Kind::Permits { limit } => argv.push(limit.to_string()),
            // (A lock's: whether the keys are a Cluster's, see `lua/lock.lua`, "Sets".)
            Kind::Lock if self.clustered => argv.push("cluster".to_owned()),
            Kind::Lock => {}
        }
        argv
    }

    /// EVALSHA (or EVAL), bounded by `limit`: loads the script on NOSCRIPT (after SCRIPT
    /// FLUSH, a Redis restart or a failover; on a cluster, on every primary) and runs it again;
    /// retries `TRYAGAIN` (a slot split by a migration) and `CLUSTERDOWN` until the limit.
    /// Neither error means the script ran. fred follows MOVED and ASK itself.
    async fn eval<R: FromValue>(
        &self,
        client: &Client,
        lua: &Lua,
        c: &Call<'_>,
        limit: Duration,
        how: Via,
    ) -> Result<R> {
        let names = c.names;
        let mut keys = vec![
            names.lock.clone(),
            names.fence(),
            names.queue(),
            names.processes(),
        ];
        if let Kind::Permits { .. } = names.kind {
            keys.push(names.holder_fences());
        }
        self.eval_with(client, lua, names, keys, self.argv(c), limit, how)
            .await
    }

    /// [`eval`](Self::eval) with its own `KEYS` and `ARGV`; errors name `names`' key.
    #[allow(clippy::too_many_arguments)]
    async fn eval_with<R: FromValue>(
        &self,
        client: &Client,
        lua: &Lua,
        names: &Names,
        keys: Vec<String>,
        args: Vec<String>,
        limit: Duration,
        how: Via,
    ) -> Result<R> {
        let (script, op) = (&lua.script, lua.op);
        // Boxed: fred's call state is several KiB, and an unboxed future would make every
        // future that awaits it (a waiter, a task holding a guard until `release`) that large
        // for its whole life. One allocation per network round trip is noise.
        let call = Box::pin(async {
            let mut loaded = false;
            loop {
                let seen = lua.loads.load(std::sync::atomic::Ordering::Acquire);
                let sent = match how {
                    Via::Sha => {
                        client
                            .evalsha::<R, _, _, _>(
                                script.sha1().clone(),
                                keys.clone(),
                                args.clone(),
                            )
                            .await
                    }
                    Via::Text => {
                        let text = script.lua().cloned().unwrap_or_default();
                        client
                            .eval::<R, _, _, _>(text, keys.clone(), args.clone())
                            .await
                    }
                };
                match sent {
                    Err(e) if e.details().starts_with("NOSCRIPT") && !loaded => {
                        lua.load(client, seen).await?;
                        loaded = true;
                    }
                    Err(e)
                        if e.details().starts_with("TRYAGAIN")
                            || e.details().starts_with("CLUSTERDOWN") =>
                    {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    other => return other,
                }
            }
        });
        let outcome = tokio::time::timeout(limit, call).await;
        self.outcome(client, names, op, limit, outcome)
    }

    /// What a call to Redis on `names`' key for `op`, bounded by `limit`, came to: its value,
    /// or the error that names the key.
    fn outcome<R>(
        &self,
        client: &Client,
        names: &Names,
        op: Op,
        limit: Duration,
        outcome: std::result::Result<
            std::result::Result<R, fred::error::Error>,
            tokio::time::error::Elapsed,
        >,
    ) -> Result<R> {
        match outcome {
            Err(_) => Err(Error::Timeout {
                key: names.key.clone(),
                op,
                after: limit,
            }),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if e.details().contains("WRONGTYPE") => Err(Error::WrongType {
                key: names.key.clone(),
                redis_key: names.lock.clone(),
            }),
            Ok(Err(source)) => {
                if source.details().starts_with("READONLY") {
                    // A demoted primary: fred does not reconnect by itself.
                    self.primary_demoted(client);
                }
                Err(Error::Redis {
                    key: names.key.clone(),
                    op,
                    source,
                })
            }
        }
    }

    /// One acquire attempt on `client` (queueing `c.member` when it is not empty). When the
    /// script answers "continue" (the lock was free with only departed waiters at the head of
    /// the queue, and the call now holds it only to pass it on), it releases until the queue
    /// is served, then tries again.
    pub(crate) async fn attempt_on(
        &self,
        client: &Client,
        c: &Call<'_>,
        limit: Duration,
    ) -> Result<Attempt> {
        // The queue's length is counted only for the queue-depth metric.
        let counted = Call {
            flag: c
                .flag
                .or((cfg!(feature = "metrics") && !c.member.is_empty()).then_some(Flag::Depth)),
            ..*c
        };
        let c = &counted;
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply: Vec<i64> = self
                .eval(client, &self.scripts.of(c.names).acquire, c, left, Via::Sha)
                .await?;
            return Ok(match reply.as_slice() {
                [reply::ACQUIRED, _, fence] => Attempt::Acquired {
                    fence: *fence as u64,
                },
                [reply::GRANT_CONFIRMED, _, fence] => Attempt::Granted {
                    fence: *fence as u64,
                },
                [reply::HELD_BY_CALLER, pttl, fence] => Attempt::AlreadyHeld {
                    fence: *fence as u64,
                    remaining: remaining(*pttl),
                },
                [reply::HELD, pttl, 0, rest @ ..] => Attempt::Locked {
                    remaining: remaining(*pttl),
                    queued: None,
                    behind_queue: rest == [1],
                },
                [reply::HELD, pttl, 1, listening, fence, watcher, now, depth] => Attempt::Locked {
                    remaining: remaining(*pttl),
                    behind_queue: true,
                    queued: Some(Queued {
                        deaf: *listening == 0,
                        fence: (*fence).max(0) as u64,
                        watcher: *watcher == 1,
                        redis_us: (*now).max(0) as u64,
                        depth: (*depth).max(0) as u64,
                    }),
                },
                [reply::OTHER_LIMIT, current] => {
                    return Err(Error::PermitsMismatch {
                        key: c.names.key.clone(),
                        asked: match c.names.kind {
                            Kind::Permits { limit } => limit,
                            Kind::Lock => 0,
                        },
                        current: (*current).clamp(0, i64::from(u32::MAX)) as u32,
                    })
                }
                [reply::CONTINUE] => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.release_on(client, c.names, c.token, c.pid, left)
                        .await?;
                    continue;
                }
                other => return Err(unexpected(c.names, Op::Acquire, other)),
            });
        }
    }

    /// Sets the TTL again if `token` holds the key (confirming a short grant). Idempotent, so
    /// cancel safe. With required replicas, a write that too few acknowledged gives
    /// `Error::NotReplicated` (the lock is left as it is: the holder decides).
    pub(crate) async fn extend_on(
        &self,
        client: &Client,
        c: &Call<'_>,
        limit: Duration,
    ) -> Result<Extended> {
        let reply: Vec<i64> = self
            .eval(client, &self.scripts.of(c.names).extend, c, limit, Via::Sha)
            .await?;
        let extended = match reply.as_slice() {
            [reply::NOT_HELD] => return Ok(Extended::NotHeld),
            [reply::DONE] => Extended::Renewed { fence: None },
            [reply::DONE, fence] => Extended::Renewed {
                fence: Some(*fence as u64),
            },
            [reply::GRANT_CONFIRMED, fence] => Extended::Confirmed {
                fence: *fence as u64,
            },
            other => return Err(unexpected(c.names, Op::Extend, other)),
        };
        self.replicated(client, c.names).await?;
        Ok(extended)
    }

    /// A script over many locks in one Cluster slot (`lua/refresh.lua`, `lua/take_set.lua`):
    /// `KEYS` lock 1, fence 1, lock 2, fence 2, ... of `locks`, `args` as given; errors name
    /// the first lock's key. (No locks: no call, no reply.)
    async fn eval_locks(
        &self,
        client: &Client,
        lua: &Lua,
        locks: &[&Names],
        args: Vec<String>,
        limit: Duration,
    ) -> Result<Vec<i64>> {
        let Some(first) = locks.first() else {
            return Ok(Vec::new());
        };
        let mut keys = Vec::with_capacity(locks.len() * 2);
        for names in locks {
            keys.push(names.lock.clone());
            keys.push(names.fence());
        }
        self.eval_with(client, lua, first, keys, args, limit, Via::Sha)
            .await
    }

    /// Refreshes many locks taken free (`lua/refresh.lua`) in one call on `client`: all of
    /// them in one Cluster slot, `(names, token, ttl ms)` each. One answer per lock, in order;
    /// [`Batched::Alone`] for a lock this call left untouched (a queue formed behind it, or its
    /// fence counter is gone), which [`extend_on`](Self::extend_on) refreshes. Errors name
    /// the first lock's key. Idempotent, so cancel safe.
    pub(crate) async fn refresh_many_on(
        &self,
        client: &Client,
        locks: &[(&Names, &str, u64)],
        limit: Duration,
    ) -> Result<Vec<Batched>> {
        let Some(first) = locks.first().map(|l| l.0) else {
            return Ok(Vec::new());
        };
        let mut args = Vec::with_capacity(locks.len() * 2 + 1);
        args.push(ms(self.retention).to_string());
        for (_, token, ttl_ms) in locks {
            args.push((*token).to_owned());
            args.push(ttl_ms.to_string());
        }
        let names: Vec<&Names> = locks.iter().map(|l| l.0).collect();
        let reply = self
            .eval_locks(client, &self.scripts.refresh, &names, args, limit)
            .await?;
        if reply.len() != locks.len() {
            return Err(unexpected(first, Op::Extend, &reply));
        }
        let batched = reply
            .iter()
            .map(|code| match *code {
                reply::NOT_HELD => Ok(Batched::NotHeld),
                reply::DONE => Ok(Batched::Renewed),
                reply::ALONE => Ok(Batched::Alone),
                _ => Err(unexpected(first, Op::Extend, &reply)),
            })
            .collect::<Result<Vec<_>>>()?;
        self.replicated(client, first).await?;
        Ok(batched)
    }

    /// One attempt at a set of locks in one Cluster slot (`lua/take_set.lua`), `(names,
    /// token)` each, at most [`TAKE_SET_MAX`]: all taken for `ttl_ms`, or none (`check`:
    /// only a look, nothing written: `Taken` with no fences where the set would be taken).
    /// Errors name the first lock's key. Not cancel safe on its own: a dropped or timed-out
    /// call may still run, and the caller gives back what it may have taken.
    pub(crate) async fn take_set_on(
        &self,
        client: &Client,
        locks: &[(&Names, &str)],
        ttl_ms: u64,
        check: bool,
        limit: Duration,
    ) -> Result<SetAttempt> {
        let Some(first) = locks.first().map(|l| l.0) else {
            return Ok(SetAttempt::Taken { fences: Vec::new() });
        };
        let mut args = Vec::with_capacity(locks.len() + 2);
        args.push(ms(self.retention).to_string());
        args.push(if check {
            "check".to_owned()
        } else {
            ttl_ms.to_string()
        });
        args.extend(locks.iter().map(|l| l.1.to_owned()));
        let names: Vec<&Names> = locks.iter().map(|l| l.0).collect();
        let reply = self
            .eval_locks(client, &self.scripts.take_set, &names, args, limit)
            .await?;
        let index = |i: i64| {
            usize::try_from(i)
                .ok()
                .filter(|i| (1..=locks.len()).contains(i))
                .map(|i| i - 1)
        };
        match reply.as_slice() {
            [reply::ACQUIRED] if check => Ok(SetAttempt::Taken { fences: Vec::new() }),
            [reply::ACQUIRED, fences @ ..] if fences.len() == locks.len() => {
                Ok(SetAttempt::Taken {
                    fences: fences.iter().map(|f| (*f).max(0) as u64).collect(),
                })
            }
            [reply::HELD, i, pttl] => match index(*i) {
                Some(index) if *pttl == -3 => Ok(SetAttempt::Queued { index }),
                Some(index) => Ok(SetAttempt::Held {
                    index,
                    remaining: remaining(*pttl),
                }),
                None => Err(unexpected(first, Op::Acquire, &reply)),
            },
            [reply::WRONG_TYPE, i, which] => match index(*i) {
                Some(index) => {
                    let names = locks[index].0;
                    Err(Error::WrongType {
                        key: names.key.clone(),
                        redis_key: if *which == 2 {
                            names.fence()
                        } else {
                            names.lock.clone()
                        },
                    })
                }
                None => Err(unexpected(first, Op::Acquire, &reply)),
            },
            other => Err(unexpected(first, Op::Acquire, other)),
        }
    }

    /// Gives back many locks in one Cluster slot (`lua/give_back.lua`), `(names, token)` each,
    /// at most [`TAKE_SET_MAX`]: each one its token took free (state `p`) is deleted; one answer
    /// per lock, in order. Errors name the first lock's key. Idempotent, so cancel safe.
    pub(crate) async fn give_back_on(
        &self,
        client: &Client,
        locks: &[(&Names, &str)],
        limit: Duration,
    ) -> Result<Vec<GivenBack>> {
        let Some(first) = locks.first().map(|l| l.0) else {
            return Ok(Vec::new());
        };
        let keys: Vec<String> = locks.iter().map(|l| l.0.lock.clone()).collect();
        let args: Vec<String> = locks.iter().map(|l| l.1.to_owned()).collect();
        let reply: Vec<i64> = self
            .eval_with(
                client,
                &self.scripts.give_back,
                first,
                keys,
                args,
                limit,
                Via::Sha,
            )
            .await?;
        if reply.len() != locks.len() {
            return Err(unexpected(first, Op::Release, &reply));
        }
        reply
            .iter()
            .map(|code| match *code {
                reply::NOT_HELD => Ok(GivenBack::NotHeld),
                reply::DONE => Ok(GivenBack::Deleted),
                reply::ALONE => Ok(GivenBack::Alone),
                _ => Err(unexpected(first, Op::Release, &reply)),
            })
            .collect()
    }

    /// A set script's `KEYS` (lock, fence, queue, processes of each key, in order) and
    /// `ARGV` (as every lock script's, for the set's `token`).
    fn set_call(&self, set: &[&Names], c: &Call<'_>) -> (Vec<String>, Vec<String>) {
        let mut keys = Vec::with_capacity(set.len() * 4);
        for names in set {
            keys.push(names.lock.clone());
            keys.push(names.fence());
            keys.push(names.queue());
            keys.push(names.processes());
        }
        (keys, self.argv(c))
    }

    /// One attempt at a set on one node ([`SET_ACQUIRE`]), `set` its keys' names in order
    /// (the first key's channel is the set's), queueing `member` (the set's member, see
    /// `protocol::set_member`) unless it is empty. When the script answers "continue" (a
    /// free key had only departed waiters at the head of its queue, and the call holds it
    /// only to pass it on), it releases that key until its queue is served, then tries again.
    /// Not cancel safe on its own: a dropped or timed-out call may still run, and the caller
    /// gives back what it may have taken (its queue residue, or a give-back).
    pub(crate) async fn set_attempt_on(
        &self,
        client: &Client,
        set: &[&Names],
        c: &Call<'_>,
        limit: Duration,
    ) -> Result<SetTry> {
        let Some(&first) = set.first() else {
            return Ok(SetTry::Acquired { fences: Vec::new() });
        };
        let deadline = Instant::now() + limit;
        let (keys, args) = self.set_call(set, c);
        let n = set.len();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply: Vec<i64> = self
                .eval_with(
                    client,
                    &self.scripts.set_acquire,
                    first,
                    keys.clone(),
                    args.clone(),
                    left,
                    Via::Sha,
                )
                .await?;
            let fences = |f: &[i64]| f.iter().map(|f| (*f).max(0) as u64).collect();
            let index = |i: i64| {
                usize::try_from(i)
                    .ok()
                    .filter(|i| (1..=n).contains(i))
                    .map(|i| i - 1)
            };
            return Ok(match reply.as_slice() {
                [reply::ACQUIRED, _, f @ ..] if f.len() == n => {
                    SetTry::Acquired { fences: fences(f) }
                }
                [reply::GRANT_CONFIRMED, _, f @ ..] if f.len() == n => {
                    SetTry::Granted { fences: fences(f) }
                }
                [reply::HELD_BY_CALLER, pttl, f @ ..] if f.len() == n => SetTry::AlreadyHeld {
                    fences: fences(f),
                    remaining: remaining(*pttl),
                },
                [reply::HELD, pttl, 0, i] if index(*i).is_some() => SetTry::Locked {
                    index: index(*i).unwrap_or(0),
                    remaining: remaining(*pttl),
                    queued: None,
                },
                [reply::HELD, pttl, 1, listening, fence, watcher, now, depth, i] => {
                    SetTry::Locked {
                        index: index(*i).unwrap_or(0),
                        remaining: remaining(*pttl),
                        queued: Some(Queued {
                            deaf: *listening == 0,
                            fence: (*fence).max(0) as u64,
                            watcher: *watcher == 1,
                            redis_us: (*now).max(0) as u64,
                            depth: (*depth).max(0) as u64,
                        }),
                    }
                }
                [reply::CONTINUE, i] if index(*i).is_some() => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let names = set[index(*i).unwrap_or(0)];
                    self.release_on(client, names, c.token, c.pid, left).await?;
                    continue;
                }
                other => return Err(unexpected(first, Op::Acquire, other)),
            });
        }
    }

    /// Releases every key of `set` that `token` holds ([`SET_RELEASE`]), in one call (again
    /// while the script says "continue"): each key let go, then each freed key's queue
    /// served. One answer per key, in order. Errors name the first key.
    pub(crate) async fn set_release_on(
        &self,
        client: &Client,
        set: &[&Names],
        token: &str,
        pid: &str,
        limit: Duration,
        how: Via,
    ) -> Result<Vec<Released>> {
        let Some(first) = set.first() else {
            return Ok(Vec::new());
        };
        let c = Call {
            pid,
            ..Call::new(first, token)
        };
        let (keys, args) = self.set_call(set, &c);
        let deadline = Instant::now() + limit;
        // What the first call said of each key stands: a call that goes on ("continue")
        // finds the keys released already not held any more.
        let mut first_codes: Option<Vec<i64>> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply: Vec<i64> = self
                .eval_with(
                    client,
                    &self.scripts.set_release,
                    first,
                    keys.clone(),
                    args.clone(),
                    left,
                    how,
                )
                .await?;
            let (more, codes) = match reply.as_slice() {
                [reply::CONTINUE, codes @ ..] if codes.len() == set.len() => (true, codes),
                codes if codes.len() == set.len() => (false, codes),
                other => return Err(unexpected(first, Op::Release, other)),
            };
            let codes = first_codes.get_or_insert_with(|| codes.to_vec());
            if more {
                continue;
            }
            return Ok(codes
                .iter()
                .map(|code| match *code {
                    reply::DONE => Released::Deleted,
                    reply::HANDED_OVER => Released::HandedOver,
                    _ => Released::NotHeld,
                })
                .collect());
        }
    }

    /// A set's waiter leaves every queue of `set` (`member`, unless empty) and gives back what
    /// `orphan` says ([`SET_LEAVE`]): `None` whatever `token` holds, `Some(fences)` only the
    /// unclaimed grant with those fences.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn set_leave_on(
        &self,
        client: &Client,
        set: &[&Names],
        token: &str,
        member: &str,
        pid: &str,
        orphan: Option<&[u64]>,
        limit: Duration,
        how: Via,
    ) -> Result<Left> {
        let Some(first) = set.first() else {
            return Ok(Left::Nothing);
        };
        let c = Call {
            member,
            pid,
            flag: Some(Flag::GiveBack),
            ..Call::new(first, token)
        };
        let (keys, mut args) = self.set_call(set, &c);
        if let Some(fences) = orphan {
            let list: Vec<String> = fences.iter().map(u64::to_string).collect();
            args[7] = "o".to_owned();
            args[8] = list.join(",");
        }
        let deadline = Instant::now() + limit;
        let reply: Vec<i64> = self
            .eval_with(
                client,
                &self.scripts.set_leave,
                first,
                keys,
                args,
                limit,
                how,
            )
            .await?;
        Ok(match reply.as_slice() {
            [reply::NOT_HELD] => Left::Nothing,
            [reply::HANDED_OVER] => Left::GaveBack,
            [reply::CONTINUE] => {
                let left = deadline.saturating_duration_since(Instant::now());
                self.set_release_on(client, set, token, pid, left, how)
                    .await?;
                Left::GaveBack
            }
            other => return Err(unexpected(first, Op::LeaveQueue, other)),
        })
    }

    /// With required replicas: `WAIT` on `client` (the connection that sent the write) until
    /// enough acknowledged it, else `Error::NotReplicated`. Without: nothing.
    pub(crate) async fn replicated(&self, client: &Client, names: &Names) -> Result<()> {
        let Some((required, timeout)) = self.replicas else {
            return Ok(());
        };
        let wait = client.wait::<i64>(i64::from(required), timeout.as_millis() as i64);
        let limit = timeout + self.command_timeout;
        let acknowledged = match tokio::time::timeout(limit, Box::pin(wait)).await {
            Err(_) => {
                return Err(Error::Timeout {
                    key: names.key.clone(),
                    op: Op::WaitForReplicas,
                    after: limit,
                })
            }
            Ok(Err(source)) => {
                return Err(Error::Redis {
                    key: names.key.clone(),
                    op: Op::WaitForReplicas,
                    source,
                })
            }
            Ok(Ok(n)) => n.max(0) as u32,
        };
        if acknowledged < required {
            return Err(Error::NotReplicated {
                key: names.key.clone(),
                required,
                acknowledged,
                after: timeout,
            });
        }
        Ok(())
    }

    /// Releases the lock if `token` holds it: handed to the oldest live waiter, or deleted.
    /// A release that finds only departed waiters at the head of a long queue drops them in
    /// bounded steps (calling again while the script says "continue").
    pub(crate) async fn release_on(
        &self,
        client: &Client,
        names: &Names,
        token: &str,
        pid: &str,
        limit: Duration,
    ) -> Result<Released> {
        self.release_with(client, names, token, pid, limit, Via::Sha)
            .await
    }

    pub(crate) async fn release_with(
        &self,
        client: &Client,
        names: &Names,
        token: &str,
        pid: &str,
        limit: Duration,
        how: Via,
    ) -> Result<Released> {
        let c = Call {
            pid,
            ..Call::new(names, token)
        };
        let deadline = Instant::now() + limit;
        // The lock was found free (the lease ran out) with waiters queued: the release serves
        // them, and still did not find its own lock.
        let mut late = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply: Vec<i64> = self
                .eval(client, &self.scripts.of(names).release, &c, left, how)
                .await?;
            let released = match reply.as_slice() {
                [reply::NOT_HELD, reply::CONTINUE] => {
                    late = true;
                    continue;
                }
                [reply::CONTINUE] => continue,
                _ if late => Released::NotHeld,
                [reply::DONE] => Released::Deleted,
                [reply::HANDED_OVER] => Released::HandedOver,
                _ => Released::NotHeld,
            };
            return Ok(released);
        }
    }

    /// Takes `c.member` out of the queue; then, by `c.leave`, gives back what the token holds
    /// (see `lua/leave.lua`).
    pub(crate) async fn leave_on(
        &self,
        client: &Client,
        c: &Call<'_>,
        limit: Duration,
        how: Via,
    ) -> Result<Left> {
        let deadline = Instant::now() + limit;
        let reply: Vec<i64> = self
            .eval(client, &self.scripts.of(c.names).leave, c, limit, how)
            .await?;
        Ok(match reply.as_slice() {
            [reply::NOT_HELD] => Left::Nothing,
            [reply::HANDED_OVER] => Left::GaveBack,
            [reply::CONTINUE] => {
                let left = deadline.saturating_duration_since(Instant::now());
                self.release_with(client, c.names, c.token, c.pid, left, how)
                    .await?;
                Left::GaveBack
            }
            other => return Err(unexpected(c.names, Op::LeaveQueue, other)),
        })
    }
}
