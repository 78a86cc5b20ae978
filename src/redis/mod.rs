//! Everything that talks to Redis for the lock itself: the connection, the scripts and one call
//! per operation. Waiting (`crate::wait`) and holding (`crate::hold`) build on this.

mod background;
mod connect;
pub(crate) mod scripts;
pub(crate) mod sentinel;
#[cfg(feature = "tls-rustls")]
mod tls;

pub(crate) use background::{QueueResidue, ResidueGuard};
pub(crate) use connect::connect_client;
pub use connect::ConnectOptions;
pub(crate) use scripts::{Attempt, Left, Released};
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
    /// The client for the next call (a pool hands out its clients in turn).
    pub(crate) fn next_client(&self) -> &Client {
        match self {
            Backend::Client(c) => c,
            Backend::Pool(p) => p.next(),
        }
    }
}

/// What a locker is made of, shared by its clones, its guards and their background tasks.
pub(crate) struct Engine {
    pub(crate) backend: Backend,
    pub(crate) prefix: String,
    pub(crate) command_timeout: Duration,
    /// How long a granted lock stays in Redis before its new holder confirms it.
    pub(crate) claim_window: Duration,
    /// Replicas that must acknowledge every acquisition and refresh (`WAIT`), and how long to
    /// wait for them.
    pub(crate) replicas: Option<(u32, Duration)>,
    pub(crate) tasks: Arc<TaskCounter>,
    /// Outcomes and wait times, for `stats()`.
    pub(crate) meter: Meter,
    /// Told when a sentinel announces a new primary (the hub reconnects its subscriber).
    pub(crate) switched: tokio::sync::broadcast::Sender<()>,
    /// When a READONLY reply last forced a reconnection (ms since the epoch).
    pub(crate) last_forced_reconnect: std::sync::atomic::AtomicU64,
    /// Tasks that follow the sentinels (stopped when the engine goes).
    pub(crate) watchers: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    scripts: Scripts,
}

impl Engine {
    pub(crate) fn new(
        backend: Backend,
        prefix: String,
        command_timeout: Duration,
        claim_window: Duration,
    ) -> Engine {
        Engine {
            backend,
            prefix,
            command_timeout,
            claim_window,
            replicas: None,
            tasks: Arc::default(),
            meter: Meter::default(),
            switched: tokio::sync::broadcast::Sender::new(4),
            last_forced_reconnect: std::sync::atomic::AtomicU64::new(0),
            watchers: std::sync::Mutex::default(),
            scripts: Scripts::new(),
        }
    }

    pub(crate) fn names(&self, key: &str) -> Result<Names> {
        Names::new(&self.prefix, key)
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

/// A fresh random lock token.
pub(crate) fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}
