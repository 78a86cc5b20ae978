//! The lock's calls: an attempt (and a queueing), an extend, the batched refresh, a release
//! (handed on, or deleted), a departure from the queue, and the replication check.

use super::*;

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

impl Queued {
    /// The queueing reply's fields after its code, pttl and "queued" flag (a lock's and a
    /// set's attempt say them alike; see `queued_reply` in the queue layer).
    pub(crate) fn from_reply(
        listening: i64,
        fence: i64,
        watcher: i64,
        now: i64,
        depth: i64,
    ) -> Queued {
        Queued {
            deaf: listening == 0,
            fence: fence.max(0) as u64,
            watcher: watcher == 1,
            redis_us: now.max(0) as u64,
            depth: depth.max(0) as u64,
        }
    }
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

impl Engine {
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
                    queued: Some(Queued::from_reply(
                        *listening, *fence, *watcher, *now, *depth,
                    )),
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
        args.push(ms(self.settings.retention).to_string());
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

    /// With required replicas: `WAIT` on `client` (the connection that sent the write) until
    /// enough acknowledged it, else `Error::NotReplicated`. Without: nothing.
    pub(crate) async fn replicated(&self, client: &Client, names: &Names) -> Result<()> {
        let Some((required, timeout)) = self.settings.replicas else {
            return Ok(());
        };
        let wait = client.wait::<i64>(i64::from(required), timeout.as_millis() as i64);
        let limit = timeout + self.settings.command_timeout;
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
