//! The hub's background tasks, each holding the hub weakly (they end when it goes): the
//! manager applies subscription changes in order, the dispatcher reads messages and connection
//! events, the housekeeper notices freezes, drops idle subscriptions and probes the connection.

use super::Hub;
use crate::wait::notify::stats::WakeReason;
use fred::interfaces::ClientLike;
use fred::types::{ClusterStateChange, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{broadcast::error::RecvError, Notify};

/// How often the housekeeper looks.
const TICK: Duration = Duration::from_millis(250);
/// A tick this late means the process was frozen (SIGSTOP, a long pause): the queue may have
/// skipped its waiters meanwhile.
const FROZEN: Duration = Duration::from_secs(1);
/// How often the subscriber connection is probed while waiters wait.
const PROBE: Duration = Duration::from_secs(1);

/// Every quarter second: notices that the process was frozen (a tick a second or more late)
/// and has every waiter look again (the queue skips the waiters of a process whose short
/// grant lapsed); every second while waiters wait, probes the subscriber connection with a
/// PING and forces a reconnection when a connection that says it is up does not answer (a
/// half-open connection loses grants without a word; the reconnection has every waiter look).
pub(super) async fn housekeep(hub: Weak<Hub>) {
    let mut last = tokio::time::Instant::now();
    let mut next_probe = last + PROBE;
    loop {
        tokio::time::sleep(TICK).await;
        let now = tokio::time::Instant::now();
        let Some(h) = hub.upgrade() else { return };
        h.prune(false);
        if now.saturating_duration_since(last) >= TICK + FROZEN {
            tracing::warn!(late = ?now.saturating_duration_since(last) - TICK, "the process was frozen; every waiter looks again");
            h.counters.freezes.fetch_add(1, Ordering::Relaxed);
            h.wake_all(WakeReason::Resumed);
        }
        last = now;
        if now < next_probe {
            continue;
        }
        next_probe = now + PROBE;
        if h.size().1 == 0 || !h.subscriber.is_connected() {
            continue;
        }
        if h.subscriber.is_clustered() {
            h.audit().await;
        }
        let subscriber = h.subscriber.clone();
        let limit = h.command_timeout.min(Duration::from_secs(2));
        drop(h);
        let answered = matches!(
            tokio::time::timeout(limit, subscriber.ping::<Value>(None)).await,
            Ok(Ok(_))
        );
        if !answered && subscriber.is_connected() {
            tracing::warn!(
                ?limit,
                "the subscriber connection did not answer a PING; reconnecting"
            );
            if let Some(h) = hub.upgrade() {
                h.counters.probe_failures.fetch_add(1, Ordering::Relaxed);
            }
            tokio::spawn(async move {
                let _ = subscriber.force_reconnection().await;
            });
        }
        last = tokio::time::Instant::now();
    }
}

pub(super) async fn manage(hub: Weak<Hub>, wake: Arc<Notify>) {
    let mut retry = Duration::from_millis(20);
    loop {
        wake.notified().await;
        loop {
            let Some(h) = hub.upgrade() else { return };
            if h.sync().await {
                retry = Duration::from_millis(20);
                break;
            }
            drop(h);
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(1));
        }
    }
}

/// What the dispatcher listens to.
pub(crate) struct Events {
    /// Grants (and anything else published on the subscribed channels).
    pub(crate) messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    /// The subscriber's (re)connections.
    pub(crate) reconnects: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
    /// Cluster topology changes seen by the locker's client (clustered configs only).
    pub(crate) topology: Option<tokio::sync::broadcast::Receiver<Vec<ClusterStateChange>>>,
    /// A sentinel announced a new primary.
    pub(crate) switched: Option<tokio::sync::broadcast::Receiver<()>>,
}

pub(super) async fn dispatch(hub: Weak<Hub>, events: Events) {
    let Events {
        mut messages,
        mut reconnects,
        mut topology,
        mut switched,
    } = events;
    loop {
        tokio::select! {
            s = async {
                match switched.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(h) = hub.upgrade() else { return };
                match s {
                    // A sentinel named a new primary: reconnect the subscriber (to it); the
                    // reconnect event then re-subscribes and has every waiter check.
                    Ok(()) | Err(RecvError::Lagged(_)) => {
                        let subscriber = h.subscriber.clone();
                        tokio::spawn(async move {
                            let _ = subscriber.force_reconnection().await;
                        });
                    }
                    Err(RecvError::Closed) => switched = None,
                }
            }
            r = async {
                match topology.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                let Some(h) = hub.upgrade() else { return };
                match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => h.on_reconnect(false),
                    Err(RecvError::Closed) => topology = None,
                }
            }
            m = messages.recv() => {
                let Some(h) = hub.upgrade() else { return };
                match m {
                    Ok(msg) => {
                        if let Some(text) = msg.value.as_str() {
                            h.deliver(&msg.channel, &text);
                        }
                    }
                    Err(RecvError::Lagged(n)) => {
                        tracing::warn!(lost = n, "subscriber lagged; every waiter checks its lock");
                        h.counters.lagged.fetch_add(1, Ordering::Relaxed);
                        h.wake_all(WakeReason::Lagged);
                    }
                    Err(RecvError::Closed) => return,
                }
            }
            r = reconnects.recv() => {
                let Some(h) = hub.upgrade() else { return };
                match r {
                    Ok(_) | Err(RecvError::Lagged(_)) => h.on_reconnect(true),
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }
}
