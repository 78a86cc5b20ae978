//! Everything that talks to Redis for the lock itself: the connection, the scripts and one call
//! per operation. Waiting (`crate::wait`) and holding (`crate::hold`) build on this.

mod background;
mod connect;
pub(crate) mod protocol;
pub(crate) mod scripts;
pub(crate) mod sentinel;
#[cfg(feature = "tls-rustls")]
mod tls;

pub(crate) use background::ResidueGuard;
pub(crate) use connect::{connect_client, reconnect_policy, supervise};
pub use connect::{redact_url, ConnectOptions};
pub(crate) use scripts::{Attempt, Extended, GivenBack, Queued, Released, SetAttempt, SetTry};
#[cfg(feature = "tls-rustls")]
pub use tls::TlsOptions;

use crate::error::Result;
use crate::keys::Names;
use crate::stats::Meter;
use crate::tasks::TaskCounter;
use fred::clients::{Client, Pool};
use scripts::Scripts;
use std::sync::Arc;
use std::time::Duration;

/// The user's connection: one client, or a pool whose clients take turns.
#[derive(Clone)]
pub(crate) enum Backend {
    Client(Client),
    Pool(Pool),
}

impl Backend {
    /// The client for the next call that concerns no token (a pool hands out its clients in
    /// turn).
    pub(crate) fn next_client(&self) -> &Client {
        match self {
            Backend::Client(c) => c,
            Backend::Pool(p) => p.next(),
        }
    }

    /// The client for every call of `token`: always the same one, so that Redis runs a token's
    /// calls in the order they were sent. A call that timed out on the client but runs later
    /// (fred sends it once it can, or again after a reconnect) then still runs before the
    /// token's later calls, never after them: a stale release cannot hit a later acquisition.
    pub(crate) fn client_for(&self, token: &str) -> &Client {
        self.client_at(self.index_for(token))
    }

    /// Which of the pool's clients is `token`'s (0 for a single client): see
    /// [`client_for`](Self::client_for).
    pub(crate) fn index_for(&self, token: &str) -> usize {
        match self {
            Backend::Client(_) => 0,
            Backend::Pool(p) => {
                let n = p.clients().len().max(1) as u64;
                // FNV-1a: stable, cheap, spreads tokens over the pool.
                let mut h: u64 = 0xcbf2_9ce4_8422_2325;
                for b in token.bytes() {
                    h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
                }
                (h % n) as usize
            }
        }
    }

    /// The client at `index` (see [`index_for`](Self::index_for)); a pool without clients
    /// hands out its next.
    pub(crate) fn client_at(&self, index: usize) -> &Client {
        match self {
            Backend::Client(c) => c,
            Backend::Pool(p) => p.clients().get(index).unwrap_or_else(|| p.next()),
        }
    }
}

/// A locker's settings, validated by its builder.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) command_timeout: Duration,
    /// The lease of a short grant: how long Redis keeps a lock handed to a waiter whose
    /// process was not seen lately, until that waiter confirms it.
    pub(crate) claim_window: Duration,
    /// A waiter's process seen on the key this recently gets its full TTL in the grant.
    pub(crate) presence_window: Duration,
    /// How long the fence counter, the queue and the process records outlive their last use.
    pub(crate) retention: Duration,
    /// Replicas that must acknowledge every acquisition and refresh (`WAIT`), and how long to
    /// wait for them.
    pub(crate) replicas: Option<(u32, Duration)>,
    /// Metrics carry the key as a label.
    pub(crate) metrics_key_label: bool,
    /// The process's name for operators (`None`: the default label).
    pub(crate) label: Option<String>,
}

/// What a locker is made of, shared by its clones, its guards and their background tasks.
pub(crate) struct Engine {
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    pub(crate) command_timeout: Duration,
    /// See [`Settings`].
    pub(crate) claim_window: Duration,
    pub(crate) presence_window: Duration,
    pub(crate) retention: Duration,
    pub(crate) replicas: Option<(u32, Duration)>,
    /// The process's name for operators (see `LockerBuilder::label`).
    pub(crate) label: String,
    pub(crate) tasks: Arc<TaskCounter>,
    /// Outcomes and wait times, for `stats()`.
    pub(crate) meter: Meter,
    /// Told when a sentinel announces a new primary (the hub reconnects its subscriber).
    pub(crate) switched: tokio::sync::broadcast::Sender<()>,
    /// When a READONLY reply last forced a reconnection (ms since the epoch).
    pub(crate) last_forced_reconnect: std::sync::atomic::AtomicU64,
    /// Tasks that follow the sentinels (stopped when the engine goes).
    pub(crate) watchers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Keeps every guard's lease alive that asked for it (`LockGuard::keep_alive`).
    pub(crate) refresher: Arc<crate::hold::refresh::Refreshing>,
    /// The connection that tracks observed elections (`Election::observe`), once one is.
    pub(crate) tracker: tokio::sync::OnceCell<Arc<crate::election::Tracker>>,
    /// The client is a Cluster's: the lock scripts are told (a set's other keys are then
    /// written only by a call that declares them: a slot can migrate; see `lua/lock.lua`),
    /// and calls are grouped by hash slot ([`Engine::node_slot`]).
    pub(crate) clustered: bool,
    /// The server's compare-and-delete command, once asked (see `scripts/taken.rs`).
    pub(crate) compare_delete: tokio::sync::OnceCell<Option<scripts::CompareDelete>>,
    /// A node refused it: releases use the script only.
    pub(crate) compare_delete_off: std::sync::atomic::AtomicBool,
    scripts: Scripts,
}

impl Engine {
    pub(crate) fn new(backend: Backend, s: Settings) -> Engine {
        use fred::interfaces::ClientLike;
        let clustered = backend.next_client().is_clustered();
        Engine {
            clustered,
            backend,
            prefix: s.prefix,
            command_timeout: s.command_timeout,
            claim_window: s.claim_window,
            presence_window: s.presence_window,
            retention: s.retention,
            replicas: s.replicas,
            label: s.label.unwrap_or_else(crate::builder::default_label),
            tasks: Arc::default(),
            meter: {
                let m = Meter::default();
                m.set_key_label(s.metrics_key_label);
                m
            },
            switched: tokio::sync::broadcast::Sender::new(4),
            last_forced_reconnect: std::sync::atomic::AtomicU64::new(0),
            watchers: std::sync::Mutex::default(),
            refresher: Arc::default(),
            tracker: tokio::sync::OnceCell::new(),
            compare_delete: tokio::sync::OnceCell::new(),
            compare_delete_off: std::sync::atomic::AtomicBool::new(false),
            scripts: Scripts::new(),
        }
    }

    pub(crate) fn names(&self, key: &str) -> Result<Names> {
        Names::new(&self.prefix, key)
    }

    /// What one call's keys must share: the hash slot of `lock` on a Cluster, 0 on a single
    /// server (one node serves every key).
    pub(crate) fn node_slot(&self, lock: &str) -> u16 {
        if self.clustered {
            fred::util::redis_keyslot(lock.as_bytes())
        } else {
            0
        }
    }
}

impl Drop for Engine {
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
