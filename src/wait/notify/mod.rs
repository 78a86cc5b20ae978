//! The queue strategy: a waiter queues in Redis and the release hands it the lock.
//!
//! 1. **Fast path.** Unless waiters of this process already wait on the key, one plain
//!    attempt (an uncontended acquire costs one call and subscribes nothing).
//! 2. **Listen.** Register in the hub; the key's grant channel for this process
//!    (`{pk}:w:<hub id>`) is subscribed, and Redis confirms it.
//! 3. **Queue.** An attempt that finds the lock held puts the waiter in the key's Redis queue
//!    in the same script call.
//! 4. **Wait** for the grant (the release made this waiter the holder and published the fence
//!    on its channel), a wake-up (reconnect, lost messages), or a timer: the holder's remaining
//!    TTL, the check interval, the deadline. After a timer or a wake-up the waiter checks
//!    (another queueing attempt: it takes a lapsed lock, finds a grant whose message was lost,
//!    or re-queues a waiter the queue lost).
//! 5. **At the deadline** one call leaves the queue, keeping a grant that raced it.
//!
//! A dropped waiter leaves the queue in the background and gives back a grant it may have
//! been sent, so the next waiter is served at once.

pub(crate) mod hub;
pub(crate) mod stats;

use super::{Request, Step, Waiting};
use crate::error::{Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::lease::Hold;
use crate::redis::scripts::{validity_deadline, Call};
use crate::redis::{Engine, Left, QueueResidue};
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::config::ReconnectPolicy;
use fred::types::{CustomCommand, Value};
use hub::{Hub, Mode, SubState};
use stats::WakeReason;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// How often a queued waiter checks the lock when nothing else wakes it (jittered by ±25%).
/// It bounds how long a grant that nobody confirms (its waiter's process froze or died right
/// after the grant) keeps the others waiting: the claim window plus this.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Opens the subscriber connection with the client's config and starts the hub.
pub(crate) async fn start_hub(engine: &Arc<Engine>) -> Result<Arc<Hub>> {
    let client = engine.backend.next_client();
    let mode = detect_mode(client, engine.command_timeout).await;
    let mut perf = client.perf_config();
    // Bursts of grants must not overflow the message buffer (fred's default is 32). The
    // dispatcher only looks each message up and wakes one waiter, so it drains far faster than
    // Redis can publish; 4,096 slots (fred sizes each of its event channels so) are ample, and
    // an overflow only makes every waiter check its lock.
    perf.broadcast_channel_capacity = perf.broadcast_channel_capacity.max(4096);
    if perf.default_command_timeout.is_zero() {
        perf.default_command_timeout = engine.command_timeout;
    }
    let subscriber = SubscriberClient::new(
        client.client_config(),
        Some(perf),
        Some(client.connection_config().clone()),
        Some(ReconnectPolicy::new_exponential(0, 10, 1000, 2)),
    );
    let messages = subscriber.message_rx();
    let reconnects = subscriber.reconnect_rx();
    let connect_limit = engine.command_timeout.max(Duration::from_secs(1));
    let fail = |source| Error::Redis {
        key: String::new(),
        op: "connect subscriber",
        source,
    };
    match tokio::time::timeout(connect_limit, subscriber.init()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(fail(e)),
        Err(_) => {
            let s = subscriber.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), s.quit()).await;
            });
            return Err(Error::Timeout {
                key: String::new(),
                op: "connect subscriber",
                after: connect_limit,
            });
        }
    }
    tracing::debug!(?mode, "pub/sub mode");
    // On a cluster, a command that meets MOVED makes fred report a topology change: shard
    // channels of moved slots may have been dropped, so every channel is subscribed again.
    let topology = client.is_clustered().then(|| client.cluster_change_rx());
    let switched = Some(engine.switched.subscribe());
    Ok(Hub::start(
        Arc::downgrade(engine),
        subscriber,
        mode,
        hub::Events {
            messages,
            reconnects,
            topology,
            switched,
        },
        engine.command_timeout,
    ))
}

/// Sharded pub/sub when the server has SSUBSCRIBE and SPUBLISH (Redis >= 7.0, and not renamed
/// away), classic otherwise. Asked once, when the locker starts.
async fn detect_mode(client: &Client, limit: Duration) -> Mode {
    let ask = client.custom::<Value, _>(
        CustomCommand::new_static("COMMAND", None, false),
        vec!["INFO", "SSUBSCRIBE", "SPUBLISH"],
    );
    match tokio::time::timeout(limit, ask).await {
        Ok(Ok(Value::Array(found)))
            if found.len() == 2 && found.iter().all(|c| !matches!(c, Value::Null)) =>
        {
            Mode::Sharded
        }
        _ => Mode::Classic,
    }
}

/// A jittered check interval: `CHECK_INTERVAL` × [0.75, 1.25).
fn check_interval() -> Duration {
    let r = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
    CHECK_INTERVAL.mul_f64(0.75 + r / 2.0)
}

/// The queue strategy's wait (see the module docs).
pub(crate) async fn wait(engine: &Arc<Engine>, hub: &Arc<Hub>, req: &Request) -> Result<LockGuard> {
    if req.plan.wait.is_zero() {
        return super::once(engine, req).await;
    }
    let counters = &hub.counters;
    let mut w = Waiting::new(&req.plan);
    // One client for the whole wait, so the departure call runs after the last attempt.
    let client = engine.backend.next_client().clone();
    let registration = {
        let channel = req.names.channel(&hub.id);
        // Waiters of this process wait on the key already: it is held, and a plain attempt
        // would be a wasted call (and a free lock with waiters goes to the queue anyway).
        if !hub.has_waiters(&channel) {
            counters.attempts.fetch_add(1, Ordering::Relaxed);
            // Boxed (as every attempt below): its state would otherwise stay in every waiting
            // future.
            if let Step::Won(g) = Box::pin(w.attempt(engine, req, &client, "")).await? {
                return Ok(g);
            }
        }
        hub.register(&req.names.key, &channel, &req.token)?
    };
    let cell = &registration.cell;
    let mut queue = QueueResidue {
        engine,
        client: &client,
        names: &req.names,
        token: &req.token,
        waiter_id: &hub.id,
        ttl_ms: req.plan.ttl_ms,
        own_token: req.own_token,
        armed: false,
    };
    let slot = &registration.slot;
    // The send time of the last attempt that left us queued, and the latest fence when it ran:
    // Redis ran it before any grant with a higher fence.
    let mut queued_at: Option<Instant> = None;
    let mut queued_fence = 0u64;
    loop {
        let now = Instant::now();
        // Queue only on a subscription Redis has confirmed: a release skips (and drops) a
        // queued waiter that nobody listens for. While it is pending (first subscription, or
        // after a reconnect) wait for the hub's wake-up at its confirmation; while it has
        // failed, poll without queueing.
        let timer = match slot.state() {
            SubState::Pending => w.deadline.saturating_duration_since(now),
            state => {
                let listening = state == SubState::Confirmed;
                queue.armed |= listening;
                counters.attempts.fetch_add(1, Ordering::Relaxed);
                let step = {
                    // Built per attempt: a waiting future keeps no copy of it.
                    let member = if listening {
                        queue.member()
                    } else {
                        String::new()
                    };
                    Box::pin(w.attempt(engine, req, &client, &member)).await?
                };
                let remaining = match step {
                    Step::Won(g) => {
                        queue.armed = false;
                        return Ok(g);
                    }
                    Step::Held {
                        remaining,
                        queued,
                        deaf,
                        fence,
                        sent_at,
                    } => {
                        queued_at = queued.then_some(sent_at);
                        if queued {
                            queued_fence = fence;
                        }
                        if deaf && listening {
                            // Redis dropped our subscription without telling fred (a Cluster
                            // slot moved): subscribe again, then check.
                            hub.lost_subscription(slot);
                            continue;
                        }
                        remaining
                    }
                    Step::Failed => None,
                };
                let now = Instant::now();
                let timer = if listening {
                    remaining
                        .map(|r| r + Duration::from_millis(1))
                        .unwrap_or(Duration::MAX)
                        .min(check_interval())
                } else {
                    w.backoff(now, remaining)
                };
                timer.min(w.deadline.saturating_duration_since(now))
            }
        };
        // Wait for the grant, a wake-up (reconnect, lost messages, a confirmed subscription)
        // or the timer.
        let reason = tokio::select! {
            _ = cell.wake.notified() => Some(cell.reason()),
            _ = sleep(timer) => None,
        };
        // A grant published before our last queueing attempt ran (its fence is not above the
        // fence that attempt saw) had lapsed by then: the attempt found the lock not ours and
        // queued us again. Its message may still arrive after the reply; it must not be used.
        if let Some(fence) = cell
            .take_grant()
            .filter(|f| queued_at.is_none() || *f > queued_fence)
        {
            counters.woke(Some(WakeReason::Notification));
            // Boxed (as `finish`): their call state would otherwise size every waiting future.
            if let Some(g) = Box::pin(take_grant(engine, req, hub, queued_at, fence)).await? {
                queue.armed = false;
                return Ok(g);
            }
            // The grant lapsed before we could confirm it: check again.
            continue;
        }
        if reason != Some(WakeReason::Notification) {
            counters.woke(reason);
        }
        if Instant::now() >= w.deadline {
            return Box::pin(finish(engine, req, &mut w, &mut queue, &client)).await;
        }
        tracing::debug!(key = %req.names.key, attempts = w.attempts, ?reason, "woke (None = timer)");
    }
}

/// A grant arrived: the lock is ours with a PX of `min(ttl, claim window)` that Redis started
/// after our last queueing attempt was sent. Use it at once when enough of that window is
/// left by our own clock; otherwise confirm it first (one round trip). `None`: it lapsed.
async fn take_grant(
    engine: &Arc<Engine>,
    req: &Request,
    hub: &Hub,
    queued_at: Option<Instant>,
    fence: u64,
) -> Result<Option<LockGuard>> {
    let ttl = req.plan.ttl();
    let px = ttl.min(engine.claim_window);
    let now = Instant::now();
    // With required replicas a grant counts only once confirmed by a write of our own that
    // enough replicas acknowledged (the grant itself was written by the releaser).
    if let Some(sent_at) = queued_at.filter(|_| engine.replicas.is_none()) {
        if validity_deadline(sent_at, px) > now + px / 4 {
            return Ok(Some(req.guard(
                engine,
                Hold {
                    fence,
                    sent_at,
                    px,
                    confirmed: px >= ttl,
                },
            )));
        }
    }
    hub.counters
        .confirmed_on_arrival
        .fetch_add(1, Ordering::Relaxed);
    let sent_at = Instant::now();
    let confirmed = match engine
        .extend(
            &req.names,
            &req.token,
            req.plan.ttl_ms,
            engine.command_timeout,
        )
        .await
    {
        Err(e @ Error::NotReplicated { .. }) => {
            let client = engine.backend.next_client();
            let _ = engine
                .release_on(client, &req.names, &req.token, engine.command_timeout)
                .await;
            return Err(e);
        }
        other => other?,
    };
    if confirmed {
        Ok(Some(req.guard(
            engine,
            Hold {
                fence,
                sent_at,
                px: ttl,
                confirmed: true,
            },
        )))
    } else {
        Ok(None)
    }
}

/// The deadline came: leave the queue, keeping a grant that raced the deadline.
async fn finish(
    engine: &Arc<Engine>,
    req: &Request,
    w: &mut Waiting,
    queue: &mut QueueResidue<'_>,
    client: &Client,
) -> Result<LockGuard> {
    if !queue.armed {
        return Err(w.give_up(req));
    }
    let sent_at = Instant::now();
    let member = queue.member();
    let call = Call {
        names: &req.names,
        token: &req.token,
        ttl_ms: req.plan.ttl_ms,
        member: &member,
        flag: if req.own_token { "T" } else { "t" },
    };
    match Box::pin(engine.leave_on(client, &call, engine.command_timeout)).await {
        Ok(Left::Kept { fence, remaining }) => {
            queue.armed = false;
            if let Err(e) = engine.replicated(client, &req.names).await {
                let _ = engine
                    .release_on(client, &req.names, &req.token, engine.command_timeout)
                    .await;
                return Err(e);
            }
            Ok(req.guard(
                engine,
                Hold {
                    fence,
                    sent_at,
                    px: remaining.unwrap_or(req.plan.ttl()),
                    confirmed: true,
                },
            ))
        }
        Ok(Left::Nothing | Left::GaveBack) => {
            queue.armed = false;
            Err(w.give_up(req))
        }
        // The queue residue retries the departure in the background.
        Err(e) if e.is_transient() => Err(w.give_up(req)),
        Err(e) => Err(e),
    }
}
