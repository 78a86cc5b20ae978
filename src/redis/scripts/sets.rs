//! The calls of several keys at once: a one-shot take of a set (`take_set.lua`) and its
//! batched give-back, and a set's queued wait (`set_acquire.lua`, `set_release.lua`,
//! `set_leave.lua`).

use super::*;

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

impl Engine {
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
        args.push(ms(self.settings.retention).to_string());
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
                        queued: Some(Queued::from_reply(
                            *listening, *fence, *watcher, *now, *depth,
                        )),
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
}
