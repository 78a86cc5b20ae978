//! What both lockers share: the connection, the scripts, and one call per operation.

use crate::error::{Error, Result};
use crate::keys::Names;
use crate::tasks::TaskCounter;
use fred::clients::{Client, Pool};
use fred::interfaces::LuaInterface;
use fred::types::scripts::Script;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Acquire: SET NX PX plus a fence that never goes backwards.
///
/// KEYS: lock, fence. ARGV: token, ttl ms, fence-counter ttl ms.
/// Reply: `{0, ttl, fence}` acquired; `{1, pttl, fence}` this token already holds it;
/// `{2, pttl, 0}` another token holds it (pttl -1: no expiry).
///
/// Safe to run twice (fred re-sends in-flight commands after a reconnect): the second run finds
/// its own token and answers `1` with the same fence.
pub(crate) const ACQUIRE_LUA: &str = r#"
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  return {1, redis.call('PTTL', KEYS[1]), tonumber(redis.call('GET', KEYS[2]) or '0')}
end
if cur then
  return {2, redis.call('PTTL', KEYS[1]), 0}
end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
local f = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
if f < floor then
  f = floor
  redis.call('SET', KEYS[2], t[1] .. string.format('%06d', tonumber(t[2])))
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {0, tonumber(ARGV[2]), f}
"#;

/// Extend: reset the TTL only if the token still holds the key. KEYS: lock. ARGV: token, ttl ms.
/// Reply 1 extended, 0 not held. Idempotent.
pub(crate) const EXTEND_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"#;

/// Release: delete only if the token holds the key, then PUBLISH on the lock's channel.
/// KEYS: lock, channel, fence. ARGV: token. Reply 1 released, 0 not held. A second run finds no
/// token and does nothing.
///
/// The message is `"<fence> <subscribers>"`: the released hold's fence (the fence counter's
/// value, since the holder made the latest acquisition) and how many connections subscribe to
/// the channel, i.e. how many processes have waiters. A process that sees its own release
/// while others wait lets them go first (fairness across processes).
pub(crate) const RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local subscribers = redis.call('PUBSUB', 'NUMSUB', KEYS[2])[2]
  redis.call('PUBLISH', KEYS[2], (redis.call('GET', KEYS[3]) or '0') .. ' ' .. subscribers)
  return 1
end
return 0
"#;

/// The fence counter outlives any lock by this much (or by the TTL when longer); after that it
/// expires and the `TIME` floor keeps fences growing.
const FENCE_COUNTER_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The user's connection: one client, or a pool whose clients take turns.
#[derive(Clone)]
pub(crate) enum Backend {
    Client(Client),
    Pool(Pool),
}

impl Backend {
    pub(crate) fn client(&self) -> &Client {
        match self {
            Backend::Client(c) => c,
            Backend::Pool(p) => p.next(),
        }
    }
}

/// What an acquire attempt learned.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// We hold it now, with this fence.
    Acquired { fence: u64 },
    /// This token held it already (a re-sent script, or a fixed token used twice).
    AlreadyHeld {
        fence: u64,
        remaining: Option<Duration>,
    },
    /// Another token holds it.
    Locked { remaining: Option<Duration> },
}

pub(crate) struct Core {
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    pub(crate) command_timeout: Duration,
    pub(crate) tasks: Arc<TaskCounter>,
    acquire: Lua,
    extend: Lua,
    release: Lua,
}

/// A script and the operation name its errors carry.
struct Lua {
    script: Script,
    op: &'static str,
}

impl Lua {
    fn new(op: &'static str, lua: &'static str) -> Lua {
        Lua {
            script: Script::from_lua(lua),
            op,
        }
    }
}

impl Core {
    pub(crate) fn new(backend: Backend, prefix: String, command_timeout: Duration) -> Core {
        Core {
            backend,
            prefix,
            command_timeout,
            tasks: Arc::default(),
            acquire: Lua::new("acquire", ACQUIRE_LUA),
            extend: Lua::new("extend", EXTEND_LUA),
            release: Lua::new("release", RELEASE_LUA),
        }
    }

    pub(crate) fn names(&self, key: &str) -> Result<Names> {
        Names::new(&self.prefix, key)
    }

    /// EVALSHA, loading the script on NOSCRIPT (after SCRIPT FLUSH or a Redis restart), bounded
    /// by `limit`.
    async fn eval(
        &self,
        client: &Client,
        lua: &Lua,
        names: &Names,
        keys: Vec<String>,
        args: Vec<String>,
        limit: Duration,
    ) -> Result<Vec<i64>> {
        let (script, op) = (&lua.script, lua.op);
        // Boxed: fred's call state is several KiB, and an unboxed future would make every
        // future that awaits it (a waiter, a task holding a guard until `release`) that large
        // for its whole life. One allocation per network round trip is noise.
        let call = Box::pin(async {
            match client
                .evalsha::<Vec<i64>, _, _, _>(script.sha1().clone(), keys.clone(), args.clone())
                .await
            {
                Err(e) if e.details().starts_with("NOSCRIPT") => {
                    let lua = script.lua().cloned().unwrap_or_default();
                    client.script_load::<String, _>(lua).await?;
                    client
                        .evalsha::<Vec<i64>, _, _, _>(script.sha1().clone(), keys, args)
                        .await
                }
                other => other,
            }
        });
        match tokio::time::timeout(limit, call).await {
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
            Ok(Err(source)) => Err(Error::Redis {
                key: names.key.clone(),
                op,
                source,
            }),
        }
    }

    /// One acquire attempt. Cancel safe for `own_token`s: if the future is dropped (or the call
    /// times out or fails in transit) after the script may have been sent, a release of `token`
    /// is sent in the background on the same client (so it runs after the acquire), and a lock
    /// nobody knows about does not sit in Redis until its TTL.
    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        names: &Names,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
        own_token: bool,
    ) -> Result<Attempt> {
        let client = self.backend.client().clone();
        // Only a token this crate generated may be released blindly: a user's fixed token may
        // hold the lock from an earlier call.
        let mut residue = ResidueGuard {
            core: self,
            client: &client,
            names,
            token,
            armed: own_token,
        };
        let fence_ttl = (FENCE_COUNTER_TTL.as_millis() as u64).max(ttl_ms);
        let reply = self
            .eval(
                &client,
                &self.acquire,
                names,
                vec![names.lock.clone(), names.fence.clone()],
                vec![token.to_owned(), ttl_ms.to_string(), fence_ttl.to_string()],
                limit,
            )
            .await;
        // A timeout may still run the script later; keep the guard armed for it. Any answer
        // from Redis means the state is known.
        residue.armed = own_token && matches!(&reply, Err(e) if e.is_transient());
        let reply = reply?;
        let remaining = |ms: i64| (ms >= 0).then(|| Duration::from_millis(ms as u64));
        match reply.as_slice() {
            [0, _, fence] => Ok(Attempt::Acquired {
                fence: *fence as u64,
            }),
            [1, pttl, fence] => Ok(Attempt::AlreadyHeld {
                fence: *fence as u64,
                remaining: remaining(*pttl),
            }),
            [2, pttl, _] => Ok(Attempt::Locked {
                remaining: remaining(*pttl),
            }),
            other => Err(Error::Redis {
                key: names.key.clone(),
                op: "acquire",
                source: fred::error::Error::new(
                    fred::error::ErrorKind::Parse,
                    format!("unexpected acquire reply {other:?}"),
                ),
            }),
        }
    }

    /// Resets the TTL if `token` holds the key. `Ok(false)`: not held. Idempotent, so cancel safe.
    pub(crate) async fn extend(
        &self,
        names: &Names,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
    ) -> Result<bool> {
        let reply = self
            .eval(
                self.backend.client(),
                &self.extend,
                names,
                vec![names.lock.clone()],
                vec![token.to_owned(), ttl_ms.to_string()],
                limit,
            )
            .await?;
        Ok(reply.first() == Some(&1))
    }

    /// Deletes the key if `token` holds it and publishes the release. `Ok(false)`: not held.
    pub(crate) async fn release(
        &self,
        names: &Names,
        token: &str,
        limit: Duration,
    ) -> Result<bool> {
        self.release_on(self.backend.client(), names, token, limit)
            .await
    }

    async fn release_on(
        &self,
        client: &Client,
        names: &Names,
        token: &str,
        limit: Duration,
    ) -> Result<bool> {
        let reply = self
            .eval(
                client,
                &self.release,
                names,
                vec![
                    names.lock.clone(),
                    names.channel.clone(),
                    names.fence.clone(),
                ],
                vec![token.to_owned()],
                limit,
            )
            .await?;
        Ok(reply.first() == Some(&1))
    }

    /// Releases in a background task (for `Drop`); does nothing outside a tokio runtime, where
    /// the lock then expires by its TTL.
    pub(crate) fn release_in_background(
        self: &Arc<Self>,
        client: Option<Client>,
        names: Names,
        token: String,
    ) {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %names.key, "no tokio runtime to release the lock in; it will expire by its TTL");
            return;
        };
        let core = Arc::clone(self);
        let ticket = self.tasks.ticket();
        handle.spawn(async move {
            let _ticket = ticket;
            let client = client.unwrap_or_else(|| core.backend.client().clone());
            match core.release_on(&client, &names, &token, core.command_timeout).await {
                Ok(released) => tracing::debug!(key = %names.key, released, "background release"),
                Err(e) => tracing::warn!(key = %names.key, error = %e, "background release failed; the lock will expire by its TTL"),
            }
        });
    }
}

/// Sends a release of a token whose acquire outcome is unknown when dropped armed.
struct ResidueGuard<'a> {
    core: &'a Arc<Core>,
    client: &'a Client,
    names: &'a Names,
    token: &'a str,
    armed: bool,
}

impl Drop for ResidueGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.core.release_in_background(
                Some(self.client.clone()),
                self.names.clone(),
                self.token.to_owned(),
            );
        }
    }
}

/// When the last successful acquire or refresh was sent plus the TTL, minus a drift margin:
/// the last instant the holder may assume no one else can hold the lock.
///
/// The margin is 1% of the TTL plus 2 ms (as Redlock's clock-drift factor): Redis' expiry clock
/// and ours can run at slightly different rates, and timers on a busy host fire late.
pub(crate) fn validity_deadline(sent_at: Instant, ttl: Duration) -> Instant {
    let margin = ttl / 100 + Duration::from_millis(2);
    sent_at + ttl.saturating_sub(margin)
}

pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}
