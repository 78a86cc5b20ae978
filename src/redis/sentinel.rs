//! Following a Sentinel failover at once. fred finds the new primary only when it reconnects;
//! after `SENTINEL FAILOVER` with the old primary still alive its connections stay up, so its
//! clients keep writing to a primary that is about to be demoted (about 10 s here). A
//! subscription to every sentinel's `+switch-master` makes the locker's clients (and the
//! queued locker's subscriber) reconnect the moment a sentinel announces the new primary.

use super::Engine;
use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::config::{Config, ReconnectPolicy, ServerConfig};
use fred::types::Builder;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// What following the sentinels keeps on the engine.
pub(crate) struct Failover {
    /// Told when a sentinel announces a new primary (the hub reconnects its subscriber).
    pub(crate) switched: tokio::sync::broadcast::Sender<()>,
    /// When a READONLY reply last forced a reconnection (ms since the epoch).
    last_forced_reconnect: AtomicU64,
    /// Tasks that follow the sentinels (stopped when the engine goes).
    watchers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Default for Failover {
    fn default() -> Self {
        Failover {
            switched: tokio::sync::broadcast::Sender::new(4),
            last_forced_reconnect: AtomicU64::new(0),
            watchers: Mutex::default(),
        }
    }
}

impl Drop for Failover {
    fn drop(&mut self) {
        for t in self
            .watchers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// Starts watching the sentinels of the engine's client config, if it is a Sentinel config and
/// a tokio runtime is there.
pub(crate) fn watch(engine: &Arc<Engine>) {
    let config = engine.backend.next_client().client_config();
    let ServerConfig::Sentinel {
        hosts,
        service_name,
        ..
    } = config.server.clone()
    else {
        return;
    };
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut tasks = Vec::new();
    for host in hosts {
        let sentinel = Config {
            server: ServerConfig::Centralized { server: host },
            ..Config::default()
        };
        let Ok(subscriber) = Builder::from_config(sentinel)
            .set_policy(ReconnectPolicy::new_exponential(0, 10, 1000, 2))
            .with_connection_config(|c| c.connection_timeout = Duration::from_secs(2))
            .build_subscriber_client()
        else {
            continue;
        };
        tasks.push(handle.spawn(follow(
            Arc::downgrade(engine),
            subscriber,
            service_name.clone(),
        )));
    }
    engine
        .failover
        .watchers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(tasks);
}

impl Engine {
    /// A write met `READONLY`: the client talks to a primary that was demoted (a failover it
    /// has not followed, or followed too early, before the sentinels had the new primary).
    /// Reconnect it (fred asks the sentinels again), and the subscriber too; at most every
    /// 100 ms.
    pub(crate) fn primary_demoted(&self, client: &fred::clients::Client) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let last = self.failover.last_forced_reconnect.load(Ordering::SeqCst);
        if now.saturating_sub(last) < 100
            || self
                .failover
                .last_forced_reconnect
                .compare_exchange(last, now, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        tracing::info!("a write met READONLY (demoted primary); reconnecting");
        let _ = self.failover.switched.send(());
        let client = client.clone();
        handle.spawn(async move {
            let _ = client.force_reconnection().await;
        });
    }
}

/// Listens on one sentinel; on `+switch-master` for `service` forces every client to
/// reconnect (to the new primary, which fred asks the sentinels for).
async fn follow(engine: Weak<Engine>, subscriber: SubscriberClient, service: String) {
    let mut messages = subscriber.message_rx();
    let mut reconnects = subscriber.reconnect_rx();
    // A sentinel that is down now may come back: keep trying (fred stops after a failed
    // first connection).
    let mut retry = Duration::from_millis(100);
    loop {
        match subscriber.init().await {
            Ok(task) => {
                super::supervise(subscriber.clone(), task, "a sentinel subscriber");
                break;
            }
            Err(_) if engine.strong_count() == 0 => return,
            Err(_) => {
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(5));
            }
        }
    }
    loop {
        let message = tokio::select! {
            r = reconnects.recv() => {
                match r {
                    // Every (re)connection, the first included: (re)subscribe.
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        if subscriber.subscribe("+switch-master").await.is_err() {
                            tracing::warn!("could not subscribe to +switch-master; failovers are followed when connections drop");
                        }
                        continue;
                    }
                    Err(_) => break,
                }
            }
            m = messages.recv() => match m {
                Ok(m) => m,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(_) => break,
            },
        };
        let text = message.value.as_str().unwrap_or_default().into_owned();
        if text.split(' ').next() != Some(service.as_str()) {
            continue;
        }
        let Some(engine) = engine.upgrade() else {
            break;
        };
        tracing::info!(switch = %text, "Sentinel switched the primary; reconnecting");
        let _ = engine.failover.switched.send(());
        let _ = match &engine.backend {
            super::Backend::Pool(pool) => pool.force_reconnection().await,
            super::Backend::Client(client) => client.force_reconnection().await,
        };
    }
    let _ = subscriber.quit().await;
}
