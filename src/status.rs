//! TEMPORARY: replaced by the library's own status when merged.
//!
//! Reads the current key layout (lock key `{<prefix><key>}`, fence counter
//! `{<prefix><key>}:fence`). Waiters are not recorded in Redis in this layout, so `queued` is
//! always 0 here.

use crate::error::{Error, Result};
use crate::locker::Locker;
use fred::interfaces::LuaInterface;
use fred::types::Value;
use std::time::Duration;

/// One snapshot of a lock, as [`Locker::status`] read it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockStatus {
    /// Whether some token holds the lock now.
    pub held: bool,
    /// The holder's remaining TTL; `None` when the lock is free or its key has no expiry.
    pub remaining_ttl: Option<Duration>,
    /// The fence of the latest acquisition of this key, if its counter still exists.
    pub fence: Option<u64>,
    /// How many waiters are queued for the lock.
    pub queued: usize,
}

/// One round trip, so the three readings are of the same instant: the holder's token (or
/// false), its PTTL, and the fence counter (or false).
const STATUS_LUA: &str = r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
"#;

impl Locker {
    /// Whether `key` is held, for how long yet, its latest fence, and how many wait for it.
    /// Reads only; the holder's token is not returned.
    ///
    /// Errors: [`Error::InvalidKey`] (nothing sent); [`Error::WrongType`] when the lock key
    /// holds a foreign value; [`Error::Timeout`] or [`Error::Redis`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn example(locker: waitlock::Locker) -> waitlock::Result<()> {
    /// let status = locker.status("nightly-report").await?;
    /// if status.held {
    ///     println!("held for {:?} more, fence {:?}", status.remaining_ttl, status.fence);
    /// }
    /// # Ok(()) }
    /// ```
    #[tracing::instrument(name = "status", level = "debug", skip_all, fields(key = %key))]
    pub async fn status(&self, key: &str) -> Result<LockStatus> {
        let names = self.core.names(key)?;
        let client = self.client();
        let limit = self.core.command_timeout;
        let call = client.eval::<Vec<Value>, _, _, _>(
            STATUS_LUA,
            vec![names.lock.clone(), names.fence.clone()],
            Vec::<String>::new(),
        );
        // Bounded here: fred ignores per-call options on script calls.
        let reply = match tokio::time::timeout(limit, call).await {
            Err(_) => {
                return Err(Error::Timeout {
                    key: names.key,
                    op: "status",
                    after: limit,
                })
            }
            Ok(Err(e)) if e.details().contains("WRONGTYPE") => {
                return Err(Error::WrongType {
                    key: names.key,
                    redis_key: names.lock,
                })
            }
            Ok(Err(source)) => {
                return Err(Error::Redis {
                    key: names.key,
                    op: "status",
                    source,
                })
            }
            Ok(Ok(reply)) => reply,
        };
        let bad_reply = |reply: &[Value]| Error::Redis {
            key: names.key.clone(),
            op: "status",
            source: fred::error::Error::new(
                fred::error::ErrorKind::Parse,
                format!("unexpected status reply {reply:?}"),
            ),
        };
        let (held, pttl, fence) = match reply.as_slice() {
            [token, pttl, fence] => (
                !token.is_null(),
                pttl.as_i64().ok_or_else(|| bad_reply(&reply))?,
                fence.as_string().and_then(|f| f.parse::<u64>().ok()),
            ),
            _ => return Err(bad_reply(&reply)),
        };
        // PTTL: -2 no key, -1 no expiry.
        let remaining_ttl = (held && pttl >= 0).then(|| Duration::from_millis(pttl as u64));
        Ok(LockStatus {
            held,
            remaining_ttl,
            fence,
            queued: 0,
        })
    }
}
