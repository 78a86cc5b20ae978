//! The floor every feature stands on: the connection, the scripts and one call per
//! operation, and nothing above them (it imports no waiting, holding or feature module).

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

/// Redis' side of a locker, shared by its clones, its guards and their background tasks: the
/// connection, the scripts, the settings, and what the connection learned about the server.
/// What a feature keeps (the refresher, the election tracker) lives with the feature, owned
/// by the locker: nothing here knows waiting, holding or elections.
pub(crate) struct Engine {
    pub(crate) backend: Backend,
    /// The locker's settings, validated and with the label resolved (see [`Settings`]).
    pub(crate) settings: Settings,
    pub(crate) tasks: Arc<TaskCounter>,
    /// Outcomes and wait times, for `stats()`.
    pub(crate) meter: Meter,
    /// What the sentinels said (see `sentinel.rs`).
    pub(crate) failover: sentinel::Failover,
    /// The client is a Cluster's: the lock scripts are told (a set's other keys are then
    /// written only by a call that declares them: a slot can migrate; see `lua/lock.lua`),
    /// and calls are grouped by hash slot ([`Engine::node_slot`]).
    pub(crate) clustered: bool,
    /// The server's compare-and-delete command, once asked (see `scripts/taken.rs`).
    pub(crate) compare_delete: scripts::CompareDeleteState,
    scripts: Scripts,
}

impl Engine {
    /// The engine for `backend` with `s`, whose label the builder resolved (an unset one
    /// stays empty).
    pub(crate) fn new(backend: Backend, s: Settings) -> Engine {
        use fred::interfaces::ClientLike;
        let clustered = backend.next_client().is_clustered();
        let meter = Meter::default();
        meter.set_key_label(s.metrics_key_label);
        Engine {
            clustered,
            backend,
            settings: s,
            tasks: Arc::default(),
            meter,
            failover: sentinel::Failover::default(),
            compare_delete: scripts::CompareDeleteState::default(),
            scripts: Scripts::new(),
        }
    }

    /// The engine shared, following its sentinels from now on (if its client is a Sentinel
    /// client and a tokio runtime is there).
    pub(crate) fn start(self) -> Arc<Engine> {
        let engine = Arc::new(self);
        sentinel::watch(&engine);
        engine
    }

    /// The process's name for operators (see `LockerBuilder::label`).
    pub(crate) fn label(&self) -> &str {
        self.settings.label.as_deref().unwrap_or_default()
    }

    pub(crate) fn names(&self, key: &str) -> Result<Names> {
        Names::new(&self.settings.prefix, key)
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
