//! Reading a key for operators: a lock's and a permit key's status (holders, the first
//! waiters), and the processes' labels that name them (`LockerBuilder::label`).

use super::{text, unexpected, Call, Via};
use crate::error::{Error, Op, Result};
use crate::keys::Names;
use crate::redis::protocol::Flag;
use crate::redis::Engine;
use fred::interfaces::ClientLike;
use fred::types::{FromValue, Value};
use std::time::Duration;

/// What a status read found.
#[derive(Debug, Clone)]
pub(crate) struct RawStatus {
    pub(crate) state: i64,
    pub(crate) pttl: i64,
    pub(crate) fence: u64,
    pub(crate) queued: u64,
    /// Redis' clock when it ran (µs).
    pub(crate) now_us: u64,
    /// The holder's token, if held.
    pub(crate) holder: Option<String>,
    /// The first queue members and when each queued (Redis time, µs).
    pub(crate) waiters: Vec<(String, u64)>,
}

/// What a permit status read found.
#[derive(Debug, Clone)]
pub(crate) struct RawPermits {
    pub(crate) limit: u64,
    pub(crate) used: u64,
    pub(crate) holders: u64,
    pub(crate) queued: u64,
    pub(crate) first_end: Duration,
    pub(crate) fence: u64,
    /// The holders whose leases end first (10 at most): token and time left.
    pub(crate) leases: Vec<(String, Duration)>,
    /// Redis' clock when it ran (µs).
    pub(crate) now_us: u64,
    /// The first queue members and when each queued (Redis time, µs).
    pub(crate) waiters: Vec<(String, u64)>,
}

/// A status reply that does not read as one (its integers, for the error).
fn malformed(names: &Names, reply: &[Value]) -> Error {
    let ints: Vec<i64> = reply.iter().filter_map(Value::as_i64).collect();
    unexpected(names, Op::Status, &ints)
}

impl Engine {
    /// A status script's reply, with the first `waiters` queue members listed.
    async fn listing(&self, names: &Names, waiters: u32, lua: &super::Lua) -> Result<Vec<Value>> {
        let c = Call {
            flag: Some(Flag::Listing(waiters)),
            ..Call::new(names, "-")
        };
        self.eval(
            self.backend.next_client(),
            lua,
            &c,
            self.settings.command_timeout,
            Via::Sha,
        )
        .await
    }

    /// The lock's state, the holder's token and the first `waiters` queue members (100 at
    /// most), read in one script call.
    pub(crate) async fn status(&self, names: &Names, waiters: u32) -> Result<RawStatus> {
        let reply = self
            .listing(names, waiters, &self.scripts.lock.status)
            .await?;
        let malformed = || malformed(names, &reply);
        if reply.len() < 6 {
            return Err(malformed());
        }
        let (head, rest) = reply.split_at(6);
        let int = |v: &Value| v.as_i64().ok_or_else(malformed);
        let text = |v: &Value| text(v).ok_or_else(malformed);
        let holder = text(&head[5])?;
        let mut waiters = Vec::with_capacity(rest.len() / 2);
        for pair in rest.chunks_exact(2) {
            let score = text(&pair[1])?.parse::<f64>().map_err(|_| malformed())?;
            waiters.push((text(&pair[0])?, score.max(0.0) as u64));
        }
        Ok(RawStatus {
            state: int(&head[0])?,
            pttl: int(&head[1])?,
            fence: int(&head[2])?.max(0) as u64,
            queued: int(&head[3])?.max(0) as u64,
            now_us: int(&head[4])?.max(0) as u64,
            holder: (!holder.is_empty()).then_some(holder),
            waiters,
        })
    }

    /// The labels of the processes `pids` (`LockerBuilder::label`) by process id, in one
    /// `MGET` (every label key is in one hash slot); a process whose label is not recorded is
    /// left out.
    pub(crate) async fn labels(
        &self,
        pids: &[String],
    ) -> Result<std::collections::HashMap<String, String>> {
        if pids.is_empty() {
            return Ok(Default::default());
        }
        let keys: Vec<Value> = pids
            .iter()
            .map(|pid| crate::keys::label_key(&self.settings.prefix, pid).into())
            .collect();
        let values: Vec<Value> = self.label_command("MGET", keys, pids.join(",")).await?;
        Ok(pids
            .iter()
            .zip(&values)
            .filter_map(|(pid, v)| {
                let label = String::from_utf8_lossy(v.as_bytes()?).into_owned();
                Some((pid.clone(), label))
            })
            .collect())
    }

    /// Writes process `pid`'s label (`LockerBuilder::label`) for `status`, kept for the
    /// retention; false when Redis did not take it in time.
    pub(crate) async fn write_label(&self, pid: &str) -> bool {
        let key = crate::keys::label_key(&self.settings.prefix, pid);
        let px = self.settings.retention.as_millis().max(1) as i64;
        let args = vec![key.into(), self.label().into(), "PX".into(), px.into()];
        self.label_command::<Value>("SET", args, pid.to_owned())
            .await
            .is_ok()
    }

    /// `cmd` on the label keys' one hash slot (the first argument is a label key), bounded by
    /// the command timeout; errors name `key`.
    async fn label_command<R: FromValue>(
        &self,
        cmd: &'static str,
        args: Vec<Value>,
        key: String,
    ) -> Result<R> {
        let first = args.first().and_then(text).unwrap_or_default();
        let slot = fred::util::redis_keyslot(first.as_bytes());
        let call = self.backend.next_client().custom::<R, Value>(
            fred::types::CustomCommand::new_static(cmd, Some(slot), false),
            args,
        );
        match tokio::time::timeout(self.settings.command_timeout, Box::pin(call)).await {
            Err(_) => Err(Error::Timeout {
                key,
                op: Op::Status,
                after: self.settings.command_timeout,
            }),
            Ok(r) => r.map_err(|source| Error::Redis {
                key,
                op: Op::Status,
                source,
            }),
        }
    }

    /// A permit key's state and the first `waiters` queue members (100 at most), read in one
    /// script call.
    pub(crate) async fn permit_status(&self, names: &Names, waiters: u32) -> Result<RawPermits> {
        let reply = self
            .listing(names, waiters, &self.scripts.permits.status)
            .await?;
        let malformed = || malformed(names, &reply);
        let n = |v: &Value| v.as_i64().map(|v| v.max(0) as u64);
        if reply.len() < 7 {
            return Err(malformed());
        }
        let (counts, rest) = reply.split_at(6);
        let counts: Option<Vec<u64>> = counts.iter().map(n).collect();
        let Some(&[limit, used, holders, queued, first_end, fence]) = counts.as_deref() else {
            return Err(malformed());
        };
        // Then token, ms left, for the leases that end first (10 at most); Redis' time; the
        // first waiters, member and score.
        let pairs = (holders.min(10) as usize) * 2;
        if rest.len() < pairs + 1 {
            return Err(malformed());
        }
        let (leases, rest) = rest.split_at(pairs);
        let leases: Option<Vec<(String, Duration)>> = leases
            .chunks_exact(2)
            .map(|pair| Some((pair[0].as_string()?, Duration::from_millis(n(&pair[1])?))))
            .collect();
        let now_us = n(&rest[0]).ok_or_else(malformed)?;
        let waiters: Option<Vec<(String, u64)>> = rest[1..]
            .chunks_exact(2)
            .map(|pair| {
                let score = pair[1].as_string()?.parse::<f64>().ok()?;
                Some((pair[0].as_string()?, score.max(0.0) as u64))
            })
            .collect();
        Ok(RawPermits {
            limit,
            used,
            holders,
            queued,
            first_end: Duration::from_millis(first_end),
            fence,
            leases: leases.ok_or_else(malformed)?,
            now_us,
            waiters: waiters.ok_or_else(malformed)?,
        })
    }
}
