//! The queue strategy: a waiter queues in Redis and the release hands it the lock.
//!
//! 1. **Fast path.** Unless waiters of this process already wait on the key, one plain
//!    attempt (an uncontended acquire costs one call and subscribes nothing).
//! 2. **Listen.** Register in the hub; the key's grant channel for this process
//!    (`{pk}:w:<hub id>`) is subscribed, and Redis confirms it.
//! 3. **Queue.** An attempt that finds the lock held puts the waiter in the key's Redis queue
//!    in the same script call.
//! 4. **Wait** for the grant (the release made this waiter the holder and published the
//!    grant, with its lease, on its channel). Two waiters of the queue, of two processes, watch
//!    the holder's lease (they look when it ends: a holder that crashed, a short grant that
//!    lapsed); Redis appoints them (a watch message, or the queueing reply) and keeps them
//!    while they stay queued and fresh. The others sleep until their grant, a watch message, a
//!    wake-up (reconnect, lost messages, the process was frozen) or the deadline.
//! 5. **At the deadline** the wait ends at once; its queue entry is taken out in the
//!    background (giving back a grant that raced the deadline).
//!
//! A dropped waiter leaves the queue in the background and gives back a grant it may have
//! been sent, so the next waiter is served at once.
//!
//! Model: `wait` and `take_grant` are mirrored by `Queue::start`, `attempt`, `on_attempt`,
//! `wake` and `take_grant` in model/src/lib.rs (change both together).

pub(crate) mod hub;
pub(crate) mod stats;

use super::{Request, Step, Waiting};
use crate::error::{ConnectStep, Error, Result};
use crate::hold::guard::LockGuard;
use crate::hold::lease::{validity_deadline, Hold};
use crate::redis::protocol::Grant;
use crate::redis::{Engine, QueueResidue};
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::{ClientLike, EventInterface};
use fred::types::{CustomCommand, Value};
use hub::{Hub, Mode, SubState};
use stats::WakeReason;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// How long a queued waiter that does not watch the lock sleeps when nothing wakes it
/// (jittered by ±25%): a last resort for a queue entry that vanished without a word (the queue
/// key deleted by hand). Everything else wakes it: its grant, a watch message when it becomes
/// a watcher, a reconnect, lost messages, the process resuming from a freeze.
pub(crate) const SAFETY_INTERVAL: Duration = Duration::from_secs(100);

/// Opens the subscriber connection with the client's config and starts the hub.
pub(crate) async fn start_hub(engine: &Arc<Engine>) -> Result<Arc<Hub>> {
    engine.meter.set_queued();
    let client = engine.backend.next_client();
    let mode = detect_mode(client, engine.command_timeout).await?;
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
        Some(crate::redis::reconnect_policy(&client.client_config())),
    );
    let messages = subscriber.message_rx();
    let reconnects = subscriber.reconnect_rx();
    let connect_limit = engine.command_timeout.max(Duration::from_secs(1));
    let fail = |source| Error::Connect {
        step: ConnectStep::ConnectSubscriber,
        target: "the subscriber connection".into(),
        source,
    };
    match tokio::time::timeout(connect_limit, subscriber.init()).await {
        Ok(Ok(task)) => crate::redis::supervise(subscriber.clone(), task, "the subscriber"),
        Ok(Err(e)) => return Err(fail(e)),
        Err(_) => {
            let s = subscriber.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), s.quit()).await;
            });
            return Err(fail(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                format!("no answer within {connect_limit:?}"),
            )));
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
/// away), classic otherwise. Asked once, when the locker starts (three tries). A server that
/// does not answer is an error, not a guess; so is a cluster without sharded pub/sub (classic
/// subscriptions live on one node, where a release on another cannot see them).
async fn detect_mode(client: &Client, limit: Duration) -> Result<Mode> {
    let mut last = None;
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
        }
        let ask = client.custom::<Value, _>(
            CustomCommand::new_static("COMMAND", None, false),
            vec!["INFO", "SSUBSCRIBE", "SPUBLISH"],
        );
        let found = match tokio::time::timeout(limit, ask).await {
            Ok(Ok(Value::Array(found))) if found.len() == 2 => found,
            Ok(Ok(other)) => {
                last = Some(format!("unexpected reply {other:?}"));
                continue;
            }
            Ok(Err(e)) => {
                last = Some(e.to_string());
                continue;
            }
            Err(_) => {
                last = Some(format!("no answer within {limit:?}"));
                continue;
            }
        };
        if found.iter().all(|c| !matches!(c, Value::Null)) {
            return Ok(Mode::Sharded);
        }
        if client.is_clustered() {
            return Err(Error::Connect {
                step: ConnectStep::PubSub,
                target: "the cluster".into(),
                source: fred::error::Error::new(
                    fred::error::ErrorKind::Config,
                    "this cluster has no sharded pub/sub (SSUBSCRIBE and SPUBLISH, Redis >= 7.0): \
                     a PubSubLocker cannot work on it (use a polling Locker)",
                ),
            });
        }
        return Ok(Mode::Classic);
    }
    Err(Error::Connect {
        step: ConnectStep::PubSub,
        target: "the server".into(),
        source: fred::error::Error::new(
            fred::error::ErrorKind::IO,
            format!(
                "could not ask the server which pub/sub it has (COMMAND INFO SSUBSCRIBE SPUBLISH): {}",
                last.unwrap_or_default()
            ),
        ),
    })
}

/// `d` × [0.75, 1.25): spreads timers that would otherwise fire together.
fn spread(d: Duration) -> Duration {
    d.mul_f64(0.75 + super::jitter::unit() / 2.0)
}

/// The last attempt that left a waiter queued: when it was sent, Redis' clock when it ran, and
/// the latest fence then. Redis ran it before any grant to the waiter with a higher fence.
#[derive(Clone, Copy)]
struct Anchor {
    sent_at: Instant,
    redis_us: u64,
    fence: u64,
}

/// The queue strategy's wait (see the module docs).
pub(crate) async fn wait(engine: &Arc<Engine>, hub: &Arc<Hub>, req: &Request) -> Result<LockGuard> {
    if req.plan.wait.is_zero() {
        return super::once(engine, req).await;
    }
    let counters = &hub.counters;
    let mut w = Waiting::new(&req.plan);
    // Every call of the request on one client, so Redis runs them in order.
    let client = req.client(engine).clone();
    let channel = req.names.channel(&hub.id);
    // This process listens on the key already (its waiters wait there, or did a moment ago):
    // the queueing attempt below takes a free lock as a plain attempt would, so that one
    // would be a wasted call.
    if !hub.listening(&channel) {
        counters.attempts.fetch_add(1, Ordering::Relaxed);
        // Boxed (as every attempt below): its state would otherwise stay in every waiting
        // future.
        if let Step::Won(g) = Box::pin(w.attempt(engine, req, &client, "")).await? {
            return Ok(g);
        }
    }
    let registration = hub.register(&req.names.key, &channel, &req.token)?;
    drop(channel);
    let cell = &registration.cell;
    let mut queue = QueueResidue {
        engine,
        names: &req.names,
        token: &req.token,
        hub: &hub.id,
        ttl_ms: req.plan.ttl_ms,
        armed: false,
    };
    let slot = &registration.slot;
    let mut anchor: Option<Anchor> = None;
    // When this waiter looks at the lock next, if it is one of the lock's watchers.
    let mut watch: Option<Instant> = None;
    let mut check = true;
    let mut timer = Duration::ZERO;
    // Queueing attempts in a row that found our subscription gone.
    let mut deaf = 0u32;
    loop {
        let now = Instant::now();
        if check {
            // Queue only on a subscription Redis has confirmed: a release skips (and drops) a
            // queued waiter that nobody listens for. While it is pending (first subscription,
            // or after a reconnect) wait for the hub's wake-up at its confirmation; while it
            // has failed, poll without queueing.
            timer = match slot.state() {
                SubState::Pending => {
                    // No look until Redis confirms the subscription (the hub wakes us then): a
                    // watch time that has passed must not make this loop spin.
                    watch = None;
                    w.deadline.saturating_duration_since(now)
                }
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
                    let now = Instant::now();
                    match step {
                        Step::Won(g) => {
                            queue.armed = false;
                            crate::metrics::handoff(&engine.meter, &req.names.key, false);
                            return Ok(g);
                        }
                        Step::Held {
                            remaining,
                            queued: Some(q),
                            sent_at,
                        } if listening => {
                            anchor = Some(Anchor {
                                sent_at,
                                redis_us: q.redis_us,
                                fence: q.fence,
                            });
                            crate::metrics::queue_depth(&engine.meter, &req.names.key, q.depth);
                            if q.deaf {
                                // Redis dropped our subscription without telling fred (a
                                // Cluster slot moved): subscribe again, then check. While a
                                // slot migrates, scripts run on the importing node (ASK) and
                                // the subscription on the source: wait a growing delay, not
                                // spin.
                                hub.lost_subscription(slot);
                                deaf = deaf.saturating_add(1);
                                let pause = Duration::from_millis(10 << deaf.min(7))
                                    .min(w.deadline.saturating_duration_since(now));
                                sleep(pause).await;
                                continue;
                            }
                            deaf = 0;
                            // A watcher looks when the holder's lease ends (plus a little:
                            // PTTL rounds down); the others wait to be told.
                            // (From the attempt's send: Redis ran it no earlier, so the lease
                            // ends no earlier than that; a late reply does not make us late.)
                            watch = q.watcher.then(|| {
                                sent_at
                                    + remaining
                                        .map(|r| r + Duration::from_millis(1))
                                        .unwrap_or(SAFETY_INTERVAL)
                            });
                            spread(SAFETY_INTERVAL)
                        }
                        Step::Held { remaining, .. } => {
                            anchor = None;
                            w.backoff(now, remaining)
                        }
                        Step::Failed => w.backoff(now, None),
                    }
                }
            };
        }
        let now = Instant::now();
        let mut sleep_for = timer.min(w.deadline.saturating_duration_since(now));
        if let Some(at) = watch {
            sleep_for = sleep_for.min(at.saturating_duration_since(now));
        }
        let started = now;
        // The deadline is kept to the tick (tokio's timers fire on the millisecond after).
        let at_deadline = now + sleep_for >= w.deadline;
        if at_deadline {
            sleep_for = sleep_for.saturating_sub(super::TIMER_TICK);
        }
        // Wait for the grant, a watch message, a wake-up (reconnect, lost messages, a
        // confirmed subscription, a resumed process) or the timer.
        let reason = tokio::select! {
            _ = cell.wake.notified() => Some(cell.reason()),
            _ = sleep(sleep_for) => None,
        };
        if reason.is_none() && at_deadline {
            super::until(w.deadline).await;
        }
        timer = timer.saturating_sub(started.elapsed());
        // A grant published before our last queueing attempt ran (its fence is not above the
        // fence that attempt saw) had lapsed by then: the attempt found the lock not ours and
        // queued us again. Its message may still arrive after the reply; it must not be used.
        if let Some(grant) = cell
            .take_grant()
            .filter(|g| anchor.is_none_or(|a| g.fence > a.fence))
        {
            counters.woke(Some(WakeReason::Notification));
            // Boxed (as the attempts): its call state would otherwise size every waiting
            // future.
            // Its confirmation (if it needs one) ends by the wait's deadline too.
            let (limit, _) = w.limit(engine.command_timeout, Instant::now());
            match Box::pin(take_grant(engine, hub, req, &client, anchor, grant, limit)).await {
                Ok(Some(g)) => {
                    queue.armed = false;
                    crate::metrics::handoff(&engine.meter, &req.names.key, true);
                    return Ok(g);
                }
                // The grant lapsed before we could confirm it: this process may have been
                // judged frozen, and its other waiters on the key skipped. They all look again.
                Ok(None) => hub.wake_channel(&slot.channel, WakeReason::Resumed),
                // Its confirmation got no answer (it may still run): look again; a hold of ours
                // is then ours to keep, or given back by the queue residue.
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            }
            check = true;
            continue;
        }
        // A wake-up from the hub (lost messages, a reconnect, a resumed process, dropped
        // waiters) always makes the waiter look, even when a watch message came with it.
        let hub_woke = cell.take_hub_wake();
        if let Some((px, at_us)) = cell.take_watch() {
            // We are one of the lock's watchers now: look when the holder's lease ends. The
            // message may be read late (this process was slow, or frozen too briefly for the
            // hub to notice): its Redis time, carried over to our clock from the anchor as a
            // grant's is, says when the lease ends at the latest, never later. One published
            // before our last queueing attempt ran is stale: that attempt's reply said more.
            counters.woke(Some(WakeReason::Watch));
            if let Some(at) = look_at(anchor, px, at_us) {
                watch = Some(at + Duration::from_millis(1));
            }
            check = hub_woke;
        } else if hub_woke || !matches!(reason, Some(WakeReason::Notification | WakeReason::Watch))
        {
            if reason != Some(WakeReason::Notification) {
                counters.woke(reason);
            }
            check = true;
        } else {
            // Woken by a message with nothing in the mail: a permit left over (two messages
            // came before the waiter ran; the first wake took both mails), or a grant from
            // before our last queueing attempt, which that attempt saw. Nothing new to look
            // at, and a look now can cross our own grant and take it as a look. A timer that
            // is due fires at the next select.
            check = false;
        }
        if Instant::now() >= w.deadline {
            // The queue residue takes us out of the queue in the background.
            return Err(w.give_up(req));
        }
        tracing::debug!(key = %req.names.key, attempts = w.attempts, ?reason, "woke (None = timer)");
    }
}

/// When a watcher looks, told that the holder's lease ends `px` after Redis time `at_us`: that
/// moment by our clock at the latest (the anchor's send time is a lower bound of the moment
/// Redis' clock read its time, and the time between them counts 1% short), and never later than
/// `px` from now. `None`: the message was published before the anchor ran (stale).
fn look_at(anchor: Option<Anchor>, px: Duration, at_us: Option<u64>) -> Option<Instant> {
    let by_now = Instant::now() + px;
    match (anchor, at_us) {
        (Some(a), Some(at)) if at < a.redis_us => None,
        (Some(a), Some(at)) => {
            let since = a.sent_at + Duration::from_micros(at - a.redis_us).mul_f64(0.99);
            Some(by_now.min(since + px))
        }
        _ => Some(by_now),
    }
}

/// A grant arrived: the lock is ours for the lease it says, from the grant's time in Redis.
/// That time is carried over to our clock from the anchor (our last queueing attempt, which
/// Redis ran before the grant: its send time is a lower bound of the moment Redis' clock read
/// its time), counting the time between them 1% short (clock rates). A full lease that is
/// still worth the TTL is used at once; a short one (our process was not seen lately), one
/// that arrived late, or one of an older version that did not say its lease is confirmed
/// first (one round trip). `None`: it lapsed before we could confirm it.
#[tracing::instrument(
    name = "handoff",
    level = "debug",
    skip_all,
    fields(key = %req.names.key, fence = grant.fence, confirmed = tracing::field::Empty)
)]
async fn take_grant(
    engine: &Arc<Engine>,
    hub: &Hub,
    req: &Request,
    client: &Client,
    anchor: Option<Anchor>,
    grant: Grant,
    limit: Duration,
) -> Result<Option<LockGuard>> {
    let ttl = req.plan.ttl();
    if let (Some(lease), Some(a)) = (grant.lease, anchor) {
        if lease.px >= ttl && lease.at_us >= a.redis_us {
            let since = a.sent_at + Duration::from_micros(lease.at_us - a.redis_us).mul_f64(0.99);
            let hold = Hold {
                fence: grant.fence,
                valid_until: validity_deadline(since, lease.px),
                since,
            };
            if hold.valid_until > Instant::now() {
                return req.full_lease(engine, client, hold, false, limit).await;
            }
        }
    }
    hub.counters
        .confirmed_on_arrival
        .fetch_add(1, Ordering::Relaxed);
    tracing::Span::current().record("confirmed", true);
    let now = Instant::now();
    let unconfirmed = Hold {
        fence: grant.fence,
        valid_until: now,
        since: now,
    };
    req.full_lease(engine, client, unconfirmed, false, limit)
        .await
}
