//! The subscriber connection: opened with the locker's client config, (un)subscribed as the
//! registry says (one (S)SUBSCRIBE per slot on a cluster), resubscribed after a reconnect, and
//! audited on a cluster, where Redis drops the shard channels of a slot that moves.

use super::registry::Slot;
use super::{lock, Hub, SubState};
use crate::error::{ConnectStep, Error, Result};
use crate::redis::Engine;
use crate::wait::notify::stats::WakeReason;
use fred::clients::{Client, SubscriberClient};
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::{CustomCommand, Value};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// How this server's pub/sub is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// SSUBSCRIBE / SPUBLISH (Redis >= 7.0): the subscribe reply confirms it.
    Sharded,
    /// SUBSCRIBE / PUBLISH, confirmed by a PING after it.
    Classic,
}

/// Opens the subscriber connection with the client's config and starts the hub.
pub(crate) async fn open(engine: &Arc<Engine>) -> Result<Arc<Hub>> {
    engine.meter.set_queued();
    let client = engine.backend.next_client();
    let mode = detect_mode(client, engine.settings.command_timeout).await?;
    let mut perf = client.perf_config();
    // Bursts of grants must not overflow the message buffer (fred's default is 32). The
    // dispatcher only looks each message up and wakes one waiter, so it drains far faster than
    // Redis can publish; 4,096 slots (fred sizes each of its event channels so) are ample, and
    // an overflow only makes every waiter check its lock.
    perf.broadcast_channel_capacity = perf.broadcast_channel_capacity.max(4096);
    if perf.default_command_timeout.is_zero() {
        perf.default_command_timeout = engine.settings.command_timeout;
    }
    let subscriber = SubscriberClient::new(
        client.client_config(),
        Some(perf),
        Some(client.connection_config().clone()),
        Some(crate::redis::reconnect_policy(&client.client_config())),
    );
    let messages = subscriber.message_rx();
    let reconnects = subscriber.reconnect_rx();
    let connect_limit = engine.settings.command_timeout.max(Duration::from_secs(1));
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
    let switched = Some(engine.failover.switched.subscribe());
    Ok(Hub::start(
        Arc::downgrade(engine),
        subscriber,
        mode,
        super::Events {
            messages,
            reconnects,
            topology,
            switched,
        },
        engine.settings.command_timeout,
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
                     a queued locker cannot work on it (use a polling Locker)",
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

impl Hub {
    /// A queued waiter learned that Redis has no subscription on its channel although the
    /// slot is confirmed (Redis drops shard channels of a slot that moves, and fred does not
    /// say so): subscribe again; the slot's waiters wait for the confirmation, then check.
    pub(crate) fn lost_subscription(&self, slot: &Slot) {
        if slot.set(SubState::Pending) == SubState::Confirmed {
            tracing::debug!(channel = %slot.channel, "subscription dropped by Redis; subscribing again");
            self.counters
                .lost_subscriptions
                .fetch_add(1, Ordering::Relaxed);
            self.mark_dirty(slot.channel.clone());
        }
    }

    /// After a reconnect every subscription is gone and messages may have been lost: every
    /// channel goes back to pending (so woken waiters wait for Redis to confirm the new
    /// subscription before they check the lock), then every waiter is woken.
    /// (Also after a Cluster topology change, `reconnected` false: subscriptions of moved slots
    /// may be gone.)
    pub(super) fn on_reconnect(&self, reconnected: bool) {
        self.connection_epoch.fetch_add(1, Ordering::SeqCst);
        let channels: Vec<String> = {
            let reg = lock(&self.registry);
            reg.slots()
                .map(|slot| {
                    slot.set(SubState::Pending);
                    slot.channel.clone()
                })
                .collect()
        };
        tracing::debug!(
            channels = channels.len(),
            "subscriber reconnected; resubscribing and waking every waiter"
        );
        let n = channels.len() as u64;
        lock(&self.dirty).extend(channels);
        self.requested.fetch_add(n, Ordering::SeqCst);
        self.manager_wake.notify_one();
        if reconnected {
            self.counters.reconnects.fetch_add(1, Ordering::Relaxed);
            if let Some(engine) = self.engine.upgrade() {
                crate::metrics::subscriber_reconnect(engine.meter.subject(""));
            }
        }
        self.wake_all(WakeReason::Reconnect);
    }

    /// Shard channels grouped so that one (S)SUBSCRIBE names one slot only (a cluster refuses
    /// cross-slot ones); on a single server, one group.
    fn by_slot(&self, channels: Vec<String>) -> Vec<Vec<String>> {
        if !self.subscriber.is_clustered() {
            return vec![channels];
        }
        let mut groups: HashMap<u16, Vec<String>> = HashMap::new();
        for c in channels {
            groups
                .entry(fred::util::redis_keyslot(c.as_bytes()))
                .or_default()
                .push(c);
        }
        groups.into_values().collect()
    }

    /// Subscribes `channels`, one (S)SUBSCRIBE per slot group, all at once (fred queues them
    /// per connection, so a few thousand slots take a few round trips per node, not one each
    /// in turn), each group bounded by the command timeout on its own. Returns the channels
    /// that failed: a slow or failing slot delays only its own waiters.
    async fn subscribe(&self, channels: Vec<String>) -> Vec<String> {
        match self.mode {
            // SSUBSCRIBE waits for its reply (from the slot's primary, following MOVED).
            Mode::Sharded => {
                let limit = self.command_timeout;
                let mut set = tokio::task::JoinSet::new();
                for group in self.by_slot(channels) {
                    let subscriber = self.subscriber.clone();
                    set.spawn(async move {
                        let ok = matches!(
                            tokio::time::timeout(limit, subscriber.ssubscribe(group.clone())).await,
                            Ok(Ok(_))
                        );
                        (group, ok)
                    });
                }
                let mut failed = Vec::new();
                while let Some(done) = set.join_next().await {
                    match done {
                        Ok((_, true)) => {}
                        Ok((group, false)) => failed.extend(group),
                        Err(_) => {}
                    }
                }
                failed
            }
            Mode::Classic => {
                let done = tokio::time::timeout(self.command_timeout, async {
                    self.subscriber.subscribe(channels.clone()).await?;
                    // SUBSCRIBE resolves when written; PING's reply comes after Redis
                    // processed it.
                    self.subscriber.ping::<Value>(None).await.map(|_| ())
                })
                .await;
                match done {
                    Ok(Ok(())) => Vec::new(),
                    _ => channels,
                }
            }
        }
    }

    /// Unsubscribes `channels` (they resolve when written; `settled` PINGs after them).
    /// Returns the channels that failed.
    async fn unsubscribe(&self, channels: Vec<String>) -> Vec<String> {
        self.unconfirmed_unsubscribe.store(true, Ordering::SeqCst);
        let limit = self.command_timeout;
        match self.mode {
            Mode::Sharded => {
                let mut failed = Vec::new();
                for group in self.by_slot(channels) {
                    let done =
                        tokio::time::timeout(limit, self.subscriber.sunsubscribe(group.clone()))
                            .await;
                    if !matches!(done, Ok(Ok(_))) {
                        failed.extend(group);
                    }
                }
                failed
            }
            Mode::Classic => {
                match tokio::time::timeout(limit, self.subscriber.unsubscribe(channels.clone()))
                    .await
                {
                    Ok(Ok(())) => Vec::new(),
                    _ => channels,
                }
            }
        }
    }

    /// Brings Redis' subscriptions in line with the registry. Returns false when some failed
    /// (those channels stay dirty and are tried again; the others are confirmed now).
    pub(super) async fn sync(&self) -> bool {
        let (mut channels, requested) = {
            let mut dirty = lock(&self.dirty);
            (
                std::mem::take(&mut *dirty),
                self.requested.load(Ordering::SeqCst),
            )
        };
        if channels.is_empty() {
            self.applied
                .send_if_modified(|a| std::mem::replace(a, requested) != requested);
            return true;
        }
        channels.sort_unstable();
        channels.dedup();
        let mut subs = Vec::new();
        let mut unsubs = Vec::new();
        {
            let reg = lock(&self.registry);
            for ch in channels.iter() {
                match reg.slot(ch) {
                    Some(slot) => subs.push((ch.clone(), Arc::clone(slot))),
                    None => unsubs.push(ch.clone()),
                }
            }
        }
        let epoch = self.connection_epoch.load(Ordering::SeqCst);
        // Never an empty list: fred would clear everything, or Redis answer an arity error.
        let mut failed = if unsubs.is_empty() {
            Vec::new()
        } else {
            self.unsubscribe(unsubs.clone()).await
        };
        let sub_failed = if subs.is_empty() {
            Vec::new()
        } else {
            self.subscribe(subs.iter().map(|(c, _)| c.clone()).collect())
                .await
        };
        self.counters
            .subscribes
            .fetch_add((subs.len() - sub_failed.len()) as u64, Ordering::Relaxed);
        self.counters
            .unsubscribes
            .fetch_add((unsubs.len() - failed.len()) as u64, Ordering::Relaxed);
        let bad: std::collections::HashSet<&String> = sub_failed.iter().collect();
        // A reconnect during the sync may have dropped what it subscribed: the channels are
        // dirty again, and only the next sync may confirm them.
        let same_connection = self.connection_epoch.load(Ordering::SeqCst) == epoch;
        for (channel, slot) in &subs {
            if bad.contains(channel) {
                if slot.set(SubState::Failed) == SubState::Pending {
                    // Waiting for a confirmation that will not come soon: poll meanwhile.
                    self.wake_channel(channel, WakeReason::Resubscribed);
                }
            } else if same_connection && slot.set(SubState::Confirmed) != SubState::Confirmed {
                // Its waiters wait for this (or poll, after a failure): they look at the lock
                // now that grants can reach them.
                self.wake_channel(channel, WakeReason::Resubscribed);
            }
        }
        failed.extend(sub_failed);
        if failed.is_empty() {
            self.applied
                .send_if_modified(|a| std::mem::replace(a, requested) != requested);
            return true;
        }
        tracing::warn!(
            failed = failed.len(),
            of = channels.len(),
            "some subscription changes failed; those waiters poll until they succeed"
        );
        lock(&self.dirty).extend(failed);
        false
    }
}

impl Hub {
    /// On a cluster: asks every primary which of this process's grant channels it still has
    /// (Redis drops the shard channels of a slot that moves to another node, and fred does not
    /// say so), and subscribes again those it lost; their waiters look again once Redis
    /// confirms. `PUBSUB SHARDNUMSUB` with this process's own channels (at most
    /// [`AUDIT_BATCH`] per call), so that a call costs Redis a lookup per channel asked about:
    /// `PUBSUB SHARDCHANNELS <pattern>` matched every shard channel of the node, so its cost
    /// grew with the whole fleet's waiters (1.35 ms a call with 8 processes on 1,000 keys).
    pub(super) async fn audit(&self) {
        let confirmed: Vec<Arc<Slot>> = lock(&self.registry)
            .slots()
            .filter(|slot| slot.state() == SubState::Confirmed)
            .cloned()
            .collect();
        let Some(engine) = self.engine.upgrade() else {
            return;
        };
        if confirmed.is_empty() {
            return;
        }
        let client = engine.backend.next_client();
        let mut present = std::collections::HashSet::new();
        for server in client.active_connections() {
            let node = client.with_cluster_node(server);
            for batch in confirmed.chunks(AUDIT_BATCH) {
                let mut args = Vec::with_capacity(batch.len() + 1);
                args.push("SHARDNUMSUB".to_owned());
                args.extend(batch.iter().map(|slot| slot.channel.clone()));
                let ask = node.custom::<Vec<fred::types::Value>, _>(
                    fred::types::CustomCommand::new_static("PUBSUB", None, false),
                    args,
                );
                match tokio::time::timeout(self.command_timeout, ask).await {
                    // [channel, subscribers, channel, subscribers, ...]
                    Ok(Ok(reply)) => {
                        present.extend(reply.chunks(2).filter_map(|pair| match pair {
                            [channel, n] if n.as_i64().is_some_and(|n| n > 0) => {
                                channel.as_string()
                            }
                            _ => None,
                        }))
                    }
                    // Cannot tell now: the next audit will.
                    _ => return,
                }
            }
        }
        for slot in confirmed {
            if !present.contains(&slot.channel) {
                self.lost_subscription(&slot);
            }
        }
    }
}

/// Channels asked about per `PUBSUB SHARDNUMSUB` call of the cluster audit: one call stays
/// well under a millisecond of Redis' time.
const AUDIT_BATCH: usize = 1000;
