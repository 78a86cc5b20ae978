//! The Lua scripts, how they are called, and what their replies mean.
//!
//! Every queued call shares one prelude, the queue layer (`lua/queue.lua`: names, the queue,
//! the processes hash, the messages, the reply codes; `lua/queue_walk.lua`: the grant's message
//! and the dead-head walk; `lua/queue_watch.lua`: the watchers), then a lock's value grammar
//! (`lua/lock.lua`, `lua/lock_sets.lua`) or a semaphore's leases (`lua/permits.lua`), and the
//! same `KEYS` (the key, its state, queue, processes; permits: and holder fences) and `ARGV`
//! (token, ttl ms, retention ms, claim window ms, presence window ms, queue member, process
//! id, flag, fence; permits: and the number of permits), so any call can be read the same way
//! in `MONITOR`. `docs/design.md` explains the protocol;
//! `super::protocol` names the formats.
//!
//! Here: the scripts' texts, how a call is sent (`FCALL` of the one library, `library`; the
//! same text by `EVALSHA` where a server refuses Functions; whatever is missing loaded once),
//! and what its reply means in general. The calls by family: `lock` (a lock's or a permit
//! key's attempt, extend, refresh, release, departure: both kinds share them through
//! [`KindScripts`]), `sets` (several keys at once), `election`, `status`, and `taken` (a free
//! lock's one-command release).

use super::protocol::{reply, Flag};
use super::{Client, Engine};
use crate::error::{Error, Op, Result};
use crate::keys::{Kind, Names};
use fred::interfaces::{ClientLike, FunctionInterface, LuaInterface, ServerInterface};
use fred::types::scripts::Script;
use fred::types::{FromValue, Value};
use std::time::Duration;
use tokio::time::Instant;

mod election;
mod library;
mod lock;
mod sets;
mod status;
mod taken;

pub(crate) use library::{library, preload, Loader};
pub(crate) use lock::{Attempt, Batched, Extended, Left, Queued, Released};
pub(crate) use sets::{GivenBack, SetAttempt, SetTry};
pub(crate) use status::{RawPermits, RawStatus};
pub(crate) use taken::CompareDeleteState;

/// The queue layer's files, in order (the only place that lists them: the scripts below and
/// the library both take them from here).
macro_rules! queue_layer {
    () => {
        concat!(
            include_str!("lua/queue.lua"),
            include_str!("lua/queue_walk.lua"),
            include_str!("lua/queue_watch.lua")
        )
    };
}

/// The lock's grammar files, in order (as `queue_layer!`).
macro_rules! lock_grammar {
    () => {
        concat!(
            include_str!("lua/lock.lua"),
            include_str!("lua/lock_sets.lua")
        )
    };
}

/// The queue layer, for the library.
const QUEUE_LAYER: &str = queue_layer!();
/// The lock's grammar, for the library.
const LOCK_GRAMMAR: &str = lock_grammar!();
/// The semaphore's leases, for the library.
const PERMITS_GRAMMAR: &str = include_str!("lua/permits.lua");

/// A lock script: the queue layer, the lock's value grammar, the call's start, the script.
macro_rules! lua {
    ($file:literal) => {
        concat!(
            queue_layer!(),
            lock_grammar!(),
            "\nbegin_lock()\n",
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

/// Election: a new leader's announcement (on its own: see the script).
pub(crate) const ELECT_ANNOUNCE: &str = include_str!("lua/elect_announce.lua");
/// Election: a leader marks its record resigned.
pub(crate) const ELECT_RESIGN: &str = include_str!("lua/elect_resign.lua");
/// Election: who leads, read only.
pub(crate) const ELECT_READ: &str = include_str!("lua/elect_read.lua");

/// A permit script: the queue layer, the semaphore's leases, the call's start, the script.
macro_rules! permits_lua {
    ($file:literal) => {
        concat!(
            queue_layer!(),
            include_str!("lua/permits.lua"),
            "\nbegin_permits()\n",
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

/// Loads of something the server can lose (a script, the library), counted, and the gate that
/// makes the calls that find it missing together wait for one load: after a restart, a
/// failover or a flush, every call in flight finds it missing at once (10,000 leases' refresh
/// batches loaded their script 80 times over: review 3).
#[derive(Default)]
pub(crate) struct LoadGate {
    loads: std::sync::atomic::AtomicU64,
    gate: tokio::sync::Mutex<()>,
}

impl LoadGate {
    /// The loads so far, read before a call: a load counted after it makes this call's own
    /// needless.
    pub(crate) fn seen(&self) -> u64 {
        self.loads.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits for a load in progress; then the gate, held while this call loads, or `None`
    /// when a load was counted after `seen`.
    pub(crate) async fn enter(&self, seen: u64) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let held = self.gate.lock().await;
        (self.seen() == seen).then_some(held)
    }

    /// A load done (by the call that holds the gate).
    pub(crate) fn count(&self) {
        self.loads
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// Waits for a load in progress, if any (the gate is held).
    pub(crate) async fn settled(&self) {
        drop(self.gate.lock().await);
    }
}

/// A script, its function in the library, and the operation name its errors carry.
pub(crate) struct Lua {
    script: Script,
    /// Its function's full name (`library::function`).
    function: String,
    op: Op,
    /// Its loads after `NOSCRIPT`.
    loads: LoadGate,
}

impl Lua {
    /// The script `text`, whose file in `lua/` is `stem`.lua.
    fn new(op: Op, text: &'static str, stem: &str) -> Lua {
        Lua {
            script: Script::from_lua(text),
            function: library::function(stem),
            op,
            loads: LoadGate::default(),
        }
    }

    /// Loads the script (on every primary of a cluster) unless another call loaded it after
    /// `seen` (the count before this call's send), waiting for a load in progress.
    async fn load(
        &self,
        client: &Client,
        seen: u64,
    ) -> std::result::Result<(), fred::error::Error> {
        let Some(_gate) = self.loads.enter(seen).await else {
            return Ok(());
        };
        let text = self.script.lua().cloned().unwrap_or_default();
        if client.is_clustered() {
            client
                .script_load_cluster::<fred::types::Value, _>(text)
                .await?;
        } else {
            client.script_load::<String, _>(text).await?;
        }
        self.loads.count();
        Ok(())
    }
}

/// One kind of key's scripts (a lock's, a permit key's).
pub(crate) struct KindScripts {
    acquire: Lua,
    extend: Lua,
    release: Lua,
    leave: Lua,
    status: Lua,
}

pub(crate) struct Scripts {
    /// How the calls go (the library by `FCALL`, or scripts), and its loads.
    pub(crate) loader: Loader,
    lock: KindScripts,
    permits: KindScripts,
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
            loader: Loader::default(),
            lock: KindScripts {
                acquire: Lua::new(Op::Acquire, ACQUIRE, "acquire"),
                extend: Lua::new(Op::Extend, EXTEND, "extend"),
                release: Lua::new(Op::Release, RELEASE, "release"),
                leave: Lua::new(Op::LeaveQueue, LEAVE, "leave"),
                status: Lua::new(Op::Status, STATUS, "status"),
            },
            permits: KindScripts {
                acquire: Lua::new(Op::Acquire, PERMIT_ACQUIRE, "permit_acquire"),
                extend: Lua::new(Op::Extend, PERMIT_EXTEND, "permit_extend"),
                release: Lua::new(Op::Release, PERMIT_RELEASE, "permit_release"),
                leave: Lua::new(Op::LeaveQueue, PERMIT_LEAVE, "permit_leave"),
                status: Lua::new(Op::Status, PERMIT_STATUS, "permit_status"),
            },
            set_acquire: Lua::new(Op::Acquire, SET_ACQUIRE, "set_acquire"),
            set_release: Lua::new(Op::Release, SET_RELEASE, "set_release"),
            set_leave: Lua::new(Op::LeaveQueue, SET_LEAVE, "set_leave"),
            refresh: Lua::new(Op::Extend, REFRESH, "refresh"),
            take_set: Lua::new(Op::Acquire, TAKE_SET, "take_set"),
            give_back: Lua::new(Op::Release, GIVE_BACK, "give_back"),
            announce: Lua::new(Op::Acquire, ELECT_ANNOUNCE, "elect_announce"),
            resign: Lua::new(Op::Release, ELECT_RESIGN, "elect_resign"),
            read_leader: Lua::new(Op::Status, ELECT_READ, "elect_read"),
        }
    }

    /// The scripts of `names`' kind of key.
    fn of(&self, names: &Names) -> &KindScripts {
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

/// How a script is sent: as the library's function (`FCALL`; `EVALSHA` where the server
/// refuses Functions), loaded again when missing, or with its text (clean-up that must run in
/// order with what was sent before it on the same client: a retry after a load would go
/// behind later commands).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Sha,
    Text,
}

/// One send of `lua`'s call: `FCALL` of its function (`fcall`), `EVALSHA`, or `EVAL` of its
/// text.
async fn send<R: FromValue>(
    client: &Client,
    lua: &Lua,
    keys: &[String],
    args: &[String],
    how: Via,
    fcall: bool,
) -> std::result::Result<R, fred::error::Error> {
    let (keys, args) = (keys.to_vec(), args.to_vec());
    match how {
        Via::Sha if fcall => client.fcall(lua.function.as_str(), keys, args).await,
        Via::Sha => client.evalsha(lua.script.sha1().clone(), keys, args).await,
        Via::Text => {
            let text = lua.script.lua().cloned().unwrap_or_default();
            client.eval(text, keys, args).await
        }
    }
}

impl Engine {
    fn argv(&self, c: &Call<'_>) -> Vec<String> {
        let retention = ms(self.settings.retention);
        let (flag, fence) = c.flag.map(Flag::args).unwrap_or(("", String::new()));
        let mut argv = vec![
            c.token.to_owned(),
            c.ttl_ms.to_string(),
            retention.to_string(),
            ms(self.settings.claim_window).to_string(),
            ms(self.settings.presence_window).to_string(),
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
        let op = lua.op;
        // Boxed: fred's call state is several KiB, and an unboxed future would make every
        // future that awaits it (a waiter, a task holding a guard until `release`) that large
        // for its whole life. One allocation per network round trip is noise.
        let loader = &self.scripts.loader;
        let call = Box::pin(async {
            // Loaded once each (the library, the script) per call; `by_script`: this call
            // runs as a script (the library could not be loaded now, or went missing again).
            let (mut loaded, mut loaded_library, mut by_script) = (false, false, false);
            loop {
                let fcall = how == Via::Sha && !by_script && loader.functions();
                if fcall {
                    loader.settled().await;
                }
                let seen = (lua.loads.seen(), loader.seen());
                match send::<R>(client, lua, &keys, &args, how, fcall).await {
                    // Missing: loaded once, then called again; missing after that (a node
                    // that lost it again) or not loaded now: this call runs as a script.
                    Err(e) if fcall && library::missing_function(&e) => {
                        if loaded_library {
                            by_script = true;
                        } else if let library::Load::NotNow = loader.load(client, seen.1).await {
                            by_script = true;
                        }
                        loaded_library = true;
                    }
                    Err(e) if fcall && library::refuses_functions(&e) => loader.refuse(&e),
                    Err(e) if e.details().starts_with("NOSCRIPT") && !loaded => {
                        lua.load(client, seen.0).await?;
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
}
