//! The Lua scripts, how they are called, and what their replies mean.
//!
//! Every script shares one prelude (`lua/common.lua`: names, value formats, the fence, the
//! grant) and the same `KEYS` (lock, fence, queue) and `ARGV` (token, ttl ms, fence-counter ttl
//! ms, claim window ms, queue member, flag), so any call can be read the same way in `MONITOR`.
//! `docs/design.md` explains the protocol.

use super::{Client, Engine};
use crate::error::{Error, Result};
use crate::keys::Names;
use fred::interfaces::{ClientLike, LuaInterface, ServerInterface};
use fred::types::scripts::Script;
use std::time::Duration;
use tokio::time::Instant;

macro_rules! lua {
    ($file:literal) => {
        concat!(include_str!("lua/common.lua"), include_str!($file))
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

/// The fence counter outlives any lock by this much (or by the TTL when longer); after that it
/// expires and the `TIME` floor keeps fences growing.
const FENCE_COUNTER_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// What an acquire attempt learned.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// We hold it now, with this fence.
    Acquired { fence: u64 },
    /// The lock had been granted to this token while it waited; the attempt confirmed it.
    Granted { fence: u64 },
    /// This token held it already (a re-sent script, or a fixed token used twice).
    AlreadyHeld {
        fence: u64,
        remaining: Option<Duration>,
    },
    /// Another token holds it; `queued` when our member is in the queue now; `deaf` when it is
    /// but Redis has no subscription on our grant channel (it dropped it: a slot moved);
    /// `fence`: the latest fence when the attempt ran (0 when not queued).
    Locked {
        remaining: Option<Duration>,
        queued: bool,
        deaf: bool,
        fence: u64,
    },
}

/// What leaving the queue did.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Left {
    /// Nothing held by the token (it was queued or not).
    Nothing,
    /// The token holds the lock and keeps it (a grant, confirmed now).
    Kept {
        fence: u64,
        remaining: Option<Duration>,
    },
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

/// What a status read found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawStatus {
    pub(crate) state: i64,
    pub(crate) pttl: i64,
    pub(crate) fence: u64,
    pub(crate) queued: u64,
}

/// A script and the operation name its errors carry.
pub(crate) struct Lua {
    script: Script,
    op: &'static str,
}

impl Lua {
    fn new(op: &'static str, text: &'static str) -> Lua {
        Lua {
            script: Script::from_lua(text),
            op,
        }
    }
}

pub(crate) struct Scripts {
    acquire: Lua,
    extend: Lua,
    release: Lua,
    leave: Lua,
    status: Lua,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            acquire: Lua::new("acquire", ACQUIRE),
            extend: Lua::new("extend", EXTEND),
            release: Lua::new("release", RELEASE),
            leave: Lua::new("leave queue", LEAVE),
            status: Lua::new("status", STATUS),
        }
    }
}

fn remaining(ms: i64) -> Option<Duration> {
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

fn unexpected(names: &Names, op: &'static str, reply: &[i64]) -> Error {
    Error::Redis {
        key: names.key.clone(),
        op,
        source: fred::error::Error::new(
            fred::error::ErrorKind::Parse,
            format!("unexpected {op} reply {reply:?}"),
        ),
    }
}

/// One script call's arguments (`ARGV` is the same for every script).
pub(crate) struct Call<'a> {
    pub(crate) names: &'a Names,
    pub(crate) token: &'a str,
    pub(crate) ttl_ms: u64,
    /// The queue member ("<hub> <ttl ms> <token>"), empty when the caller does not queue.
    pub(crate) member: &'a str,
    pub(crate) flag: &'static str,
}

impl Engine {
    fn argv(&self, c: &Call<'_>) -> Vec<String> {
        let fence_ttl = (FENCE_COUNTER_TTL.as_millis() as u64).max(c.ttl_ms);
        vec![
            c.token.to_owned(),
            c.ttl_ms.to_string(),
            fence_ttl.to_string(),
            (self.claim_window.as_millis() as u64).max(1).to_string(),
            c.member.to_owned(),
            c.flag.to_owned(),
        ]
    }

    /// EVALSHA, bounded by `limit`: loads the script on NOSCRIPT (after SCRIPT FLUSH, a Redis
    /// restart or a failover; on a cluster, on every primary) and runs it again; retries
    /// `TRYAGAIN` (a slot split by a migration) and `CLUSTERDOWN` until the limit. Neither
    /// error means the script ran. fred follows MOVED and ASK itself.
    async fn eval(
        &self,
        client: &Client,
        lua: &Lua,
        c: &Call<'_>,
        limit: Duration,
    ) -> Result<Vec<i64>> {
        let (script, op, names) = (&lua.script, lua.op, c.names);
        let keys = vec![names.lock.clone(), names.fence(), names.queue()];
        let args = self.argv(c);
        // Boxed: fred's call state is several KiB, and an unboxed future would make every
        // future that awaits it (a waiter, a task holding a guard until `release`) that large
        // for its whole life. One allocation per network round trip is noise.
        let call = Box::pin(async {
            let mut loaded = false;
            loop {
                match client
                    .evalsha::<Vec<i64>, _, _, _>(script.sha1().clone(), keys.clone(), args.clone())
                    .await
                {
                    Err(e) if e.details().starts_with("NOSCRIPT") && !loaded => {
                        let text = script.lua().cloned().unwrap_or_default();
                        if client.is_clustered() {
                            client
                                .script_load_cluster::<fred::types::Value, _>(text)
                                .await?;
                        } else {
                            client.script_load::<String, _>(text).await?;
                        }
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

    /// One acquire attempt on `client` (queueing `c.member` when it is not empty).
    pub(crate) async fn attempt_on(
        &self,
        client: &Client,
        c: &Call<'_>,
        limit: Duration,
    ) -> Result<Attempt> {
        let reply = self.eval(client, &self.scripts.acquire, c, limit).await?;
        Ok(match reply.as_slice() {
            [0, _, fence] => Attempt::Acquired {
                fence: *fence as u64,
            },
            [3, _, fence] => Attempt::Granted {
                fence: *fence as u64,
            },
            [1, pttl, fence] => Attempt::AlreadyHeld {
                fence: *fence as u64,
                remaining: remaining(*pttl),
            },
            [2, pttl, queued, rest @ ..] => Attempt::Locked {
                remaining: remaining(*pttl),
                queued: *queued == 1,
                deaf: *queued == 1 && rest.first() == Some(&0),
                fence: rest.get(1).copied().unwrap_or(0).max(0) as u64,
            },
            other => return Err(unexpected(c.names, "acquire", other)),
        })
    }

    /// Resets the TTL if `token` holds the key (confirming a grant). `Ok(false)`: not held.
    /// Idempotent, so cancel safe. With required replicas, a write that too few acknowledged
    /// gives `Error::NotReplicated` (the lock is left as it is: the holder decides).
    pub(crate) async fn extend(
        &self,
        names: &Names,
        token: &str,
        ttl_ms: u64,
        limit: Duration,
    ) -> Result<bool> {
        let c = Call {
            names,
            token,
            ttl_ms,
            member: "",
            flag: "",
        };
        let client = self.backend.next_client();
        let reply = self.eval(client, &self.scripts.extend, &c, limit).await?;
        let extended = reply.first() == Some(&1);
        if extended {
            self.replicated(client, names).await?;
        }
        Ok(extended)
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
                    op: "wait for replicas",
                    after: limit,
                })
            }
            Ok(Err(source)) => {
                return Err(Error::Redis {
                    key: names.key.clone(),
                    op: "wait for replicas",
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
    pub(crate) async fn release_on(
        &self,
        client: &Client,
        names: &Names,
        token: &str,
        limit: Duration,
    ) -> Result<Released> {
        let c = Call {
            names,
            token,
            ttl_ms: 1,
            member: "",
            flag: "",
        };
        let reply = self.eval(client, &self.scripts.release, &c, limit).await?;
        Ok(match reply.first() {
            Some(1) => Released::Deleted,
            Some(2) => Released::HandedOver,
            _ => Released::NotHeld,
        })
    }

    /// Takes `c.member` out of the queue; then, by `c.flag`, keeps or gives back what the
    /// token holds (see `lua/leave.lua`).
    pub(crate) async fn leave_on(
        &self,
        client: &Client,
        c: &Call<'_>,
        limit: Duration,
    ) -> Result<Left> {
        let reply = self.eval(client, &self.scripts.leave, c, limit).await?;
        Ok(match reply.as_slice() {
            [0, ..] => Left::Nothing,
            [1, pttl, fence] => Left::Kept {
                fence: *fence as u64,
                remaining: remaining(*pttl),
            },
            [2, ..] => Left::GaveBack,
            other => return Err(unexpected(c.names, "leave queue", other)),
        })
    }

    /// The lock's state, read in one script call.
    pub(crate) async fn status(&self, names: &Names) -> Result<RawStatus> {
        let c = Call {
            names,
            token: "-",
            ttl_ms: 1,
            member: "",
            flag: "",
        };
        let reply = self
            .eval(
                self.backend.next_client(),
                &self.scripts.status,
                &c,
                self.command_timeout,
            )
            .await?;
        match reply.as_slice() {
            [state, pttl, fence, queued] => Ok(RawStatus {
                state: *state,
                pttl: *pttl,
                fence: (*fence).max(0) as u64,
                queued: (*queued).max(0) as u64,
            }),
            other => Err(unexpected(names, "status", other)),
        }
    }
}

/// When the last command that Redis ran before the lock's PX started was *sent*, plus that PX,
/// minus a drift margin: the last instant the holder may assume no one else can hold the lock.
///
/// The margin is 1% of the PX plus 2 ms (as Redlock's clock-drift factor): Redis' expiry clock
/// and ours can run at slightly different rates, and timers on a busy host fire late.
pub(crate) fn validity_deadline(sent_at: Instant, px: Duration) -> Instant {
    let margin = px / 100 + Duration::from_millis(2);
    sent_at + px.saturating_sub(margin)
}
