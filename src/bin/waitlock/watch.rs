//! `waitlock status KEY --watch`: the status again at every change of the key, until
//! interrupted.
//!
//! Redis says when the key changes: a connection of its own (RESP3) turns on client tracking
//! in broadcast mode for the prefix every name of the key shares (`{<prefix><key>}`: the lock,
//! its fence counter, queue and processes, and the permits' names), so every write to them,
//! and every expiry, sends it an invalidation. Nothing is polled. A burst of invalidations (a
//! release that hands over writes four names) gives one snapshot, printed once the burst has
//! been quiet for 2 ms (10 ms at most after its first message). After a reconnection the
//! tracking is turned on again and a snapshot printed, since changes may have been missed.

use super::args::StatusArgs;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use waitlock::fred::interfaces::{ClientLike, EventInterface, TrackingInterface};
use waitlock::fred::prelude::Builder;
use waitlock::fred::types::RespVersion;
use waitlock::{Error, Locker};

/// A burst of invalidations is over once quiet this long.
const QUIET: Duration = Duration::from_millis(2);
/// A snapshot waits this long at most after a change.
const AT_MOST: Duration = Duration::from_millis(10);

fn redis_error(key: &str, source: waitlock::fred::error::Error) -> Error {
    Error::Redis {
        key: key.to_owned(),
        op: waitlock::Op::Status,
        source,
    }
}

/// The SIGINT (Ctrl-C) that ends a `--watch`.
pub fn interrupt() -> Result<Signal, Error> {
    signal(SignalKind::interrupt()).map_err(|e| Error::InvalidSetting {
        field: "SIGINT handler",
        value: e.to_string(),
        reason: "cannot be installed",
    })
}

pub async fn watch(locker: &Locker, args: &StatusArgs) -> Result<(), Error> {
    let key = &args.key;
    let base = locker.client();
    let mut config = base.client_config();
    config.version = RespVersion::RESP3;
    let tracker = Builder::from_config(config)
        .set_connection_config(base.connection_config().clone())
        .set_policy(
            waitlock::fred::types::config::ReconnectPolicy::new_exponential(0, 10, 1_000, 2),
        )
        .build()
        .map_err(|e| redis_error(key, e))?;
    let mut changes = tracker.invalidation_rx();
    let mut reconnects = tracker.reconnect_rx();
    tracker.init().await.map_err(|e| redis_error(key, e))?;
    let prefix = format!("{{{}{}}}", args.conn.prefix, key);
    let track = || async {
        tracker
            .start_tracking(vec![prefix.clone()], true, false, false, false)
            .await
            .map_err(|e| redis_error(key, e))
    };
    track().await?;
    let mut interrupt = interrupt()?;
    let start = Instant::now();
    let snapshot = |at: Instant| {
        println!("--- +{:.3} s ---", at.duration_since(start).as_secs_f64());
        super::show(locker, args, &args.key)
    };
    snapshot(Instant::now()).await?;
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            change = changes.recv() => match change {
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
            reconnected = reconnects.recv() => {
                if let Err(RecvError::Closed) = reconnected {
                    break;
                }
                // (Also told for the first connection, whose tracking is on: off, then on.)
                let _ = tracker.stop_tracking().await;
                track().await?;
            }
        }
        // The rest of the burst.
        let first = Instant::now();
        loop {
            let quiet = tokio::time::sleep(
                QUIET.min((first + AT_MOST).saturating_duration_since(Instant::now())),
            );
            tokio::select! {
                _ = quiet => break,
                more = changes.recv() => if let Err(RecvError::Closed) = more { break },
            }
        }
        snapshot(Instant::now()).await?;
    }
    let _ = tokio::time::timeout(Duration::from_millis(100), tracker.quit()).await;
    Ok(())
}
