//! Following an election without polling: one reader task per observed election, which
//! reads the lock and the record again whenever Redis says one of its names changed (client
//! tracking on one RESP3 connection per locker, the `Tracker`), and what it has shown
//! (`Shown`: terms never go back).

use super::{Election, Leader};
use crate::error::{Error, Result};
use crate::redis::Engine;
use crate::wait::strategy::Strategy;
use fred::interfaces::{ClientLike, EventInterface, TrackingInterface};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// The one task that reads an observed election again at each change, for every receiver of
/// its locker.
pub(super) struct Reader<S> {
    pub(super) election: Election<S>,
    pub(super) tracker: std::sync::Weak<Tracker>,
    /// The lock's name (every name of the election starts with it).
    pub(super) prefix: String,
    /// The record's name.
    pub(super) record: String,
    pub(super) tx: watch::Sender<Option<Leader>>,
}

impl<S: Strategy> Reader<S> {
    pub(super) async fn run(
        self,
        first: Option<Leader>,
        mut changes: tokio::sync::broadcast::Receiver<fred::types::client::Invalidation>,
        mut retracked: watch::Receiver<u64>,
    ) {
        let mut shown = Shown::new(first);
        loop {
            let backstop = shown.lease_left().map_or(Duration::from_secs(30), |left| {
                (left + Duration::from_millis(50)).min(Duration::from_secs(30))
            });
            tokio::select! {
                _ = self.tx.closed() => {
                    // No receiver left: stop, unless one subscribed meanwhile.
                    let Some(tracker) = self.tracker.upgrade() else { return };
                    let mut observed = tracker.observed();
                    if self.tx.receiver_count() == 0 {
                        observed.remove(&self.prefix);
                        return;
                    }
                    continue;
                }
                _ = tokio::time::sleep(backstop) => {}
                _ = retracked.changed() => {}
                change = changes.recv() => match change {
                    Ok(inv) => {
                        // The lock (taken, deleted, expired, refreshed) or the record: not the
                        // fence counter, the queue or the processes (candidates coming and
                        // going change no leader).
                        let ours = inv.keys.iter().any(|k| {
                            let k = k.as_bytes();
                            k == self.prefix.as_bytes() || k == self.record.as_bytes()
                        });
                        if !ours {
                            continue;
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
            let Ok(now) = self.election.leader().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            if let Some(send) = shown.reading(now) {
                self.tx.send_replace(send);
            }
        }
    }
}

/// What an observer has shown: the last reading sent, and the highest term read.
struct Shown {
    shown: Option<Leader>,
    last_term: u64,
}

impl Shown {
    fn new(first: Option<Leader>) -> Shown {
        Shown {
            last_term: first.as_ref().map_or(0, |l| l.term),
            shown: first,
        }
    }

    /// The lease left of the leader shown, which times the backstop reading.
    fn lease_left(&self) -> Option<Duration> {
        self.shown.as_ref().and_then(|l| l.lease_left)
    }

    /// Takes a reading: what to send, if anything. A reading older than one shown is skipped
    /// whole, neither sent nor kept as the one shown (kept, the next reading of the newer term
    /// would be sent again, and the backstop would time itself by the skipped one's lease:
    /// review 3, finding 5). A new term, or no leader after one, is sent.
    fn reading(&mut self, now: Option<Leader>) -> Option<Option<Leader>> {
        if matches!(&now, Some(l) if l.term < self.last_term) {
            return None;
        }
        let show = match &now {
            Some(l) => self.shown.as_ref().is_none_or(|s| s.term != l.term),
            None => self.shown.is_some(),
        };
        if let Some(l) = &now {
            self.last_term = self.last_term.max(l.term);
        }
        self.shown = now.clone();
        show.then_some(now)
    }
}

/// One RESP3 connection per locker that tracks the names of every observed election (client
/// tracking, broadcast mode, one prefix per election) and turns tracking on again after a
/// reconnection.
pub(crate) struct Tracker {
    pub(super) client: fred::clients::Client,
    prefixes: Mutex<HashSet<String>>,
    /// The observed elections' senders, by prefix (one reader each).
    observed: Mutex<std::collections::HashMap<String, watch::Sender<Option<Leader>>>>,
    /// Bumped once tracking is on again after a reconnection (observers read again then).
    pub(super) epoch: watch::Sender<u64>,
}

/// A locker's tracker, once an election is observed: kept in the locker's extensions.
#[derive(Default)]
pub(super) struct TrackerSlot(tokio::sync::OnceCell<Arc<Tracker>>);

impl Tracker {
    /// The tracker in `slot`, opened on `engine`'s client config by the first observer.
    pub(super) async fn of(engine: &Arc<Engine>, slot: &TrackerSlot) -> Result<Arc<Tracker>> {
        slot.0
            .get_or_try_init(|| async {
                let base = engine.backend.next_client();
                let mut config = base.client_config();
                config.version = fred::types::RespVersion::RESP3;
                let fail = |source| Error::Connect {
                    step: crate::error::ConnectStep::ConnectSubscriber,
                    target: "the election tracking connection".into(),
                    source,
                };
                let client = fred::types::Builder::from_config(config)
                    .set_connection_config(base.connection_config().clone())
                    .set_policy(crate::redis::reconnect_policy(&base.client_config()))
                    .build()
                    .map_err(fail)?;
                let mut reconnects = client.reconnect_rx();
                let limit = engine.settings.command_timeout.max(Duration::from_secs(1));
                match tokio::time::timeout(limit, client.init()).await {
                    Ok(Ok(task)) => {
                        crate::redis::supervise(client.clone(), task, "the tracking connection")
                    }
                    Ok(Err(e)) => return Err(fail(e)),
                    Err(_) => {
                        return Err(fail(fred::error::Error::new(
                            fred::error::ErrorKind::Timeout,
                            format!("no answer within {limit:?}"),
                        )))
                    }
                }
                let tracker = Arc::new(Tracker {
                    client,
                    prefixes: Mutex::default(),
                    observed: Mutex::default(),
                    epoch: watch::Sender::new(0),
                });
                let weak = Arc::downgrade(&tracker);
                tokio::spawn(async move {
                    while reconnects.recv().await.is_ok() {
                        let Some(t) = weak.upgrade() else { return };
                        let all: Vec<String> = t.lock().iter().cloned().collect();
                        let _ = t.client.stop_tracking().await;
                        if !all.is_empty()
                            && t.client
                                .start_tracking(all, true, false, false, false)
                                .await
                                .is_err()
                        {
                            tracing::warn!("could not turn election tracking on again");
                        }
                        t.epoch.send_modify(|e| *e += 1);
                    }
                });
                Ok(tracker)
            })
            .await
            .cloned()
    }

    pub(super) fn observed(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, watch::Sender<Option<Leader>>>>
    {
        self.observed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.prefixes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tracks `prefix` (once per locker).
    pub(super) async fn track(&self, prefix: &str) -> Result<()> {
        if !self.lock().insert(prefix.to_owned()) {
            return Ok(());
        }
        let on = self
            .client
            .start_tracking(vec![prefix.to_owned()], true, false, false, false)
            .await;
        if let Err(source) = on {
            self.lock().remove(prefix);
            return Err(Error::Redis {
                key: prefix.to_owned(),
                op: crate::error::Op::Status,
                source,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leader(term: u64, lease_ms: u64) -> Leader {
        Leader {
            value: format!("v{term}"),
            term,
            leading_for: None,
            lease_left: Some(Duration::from_millis(lease_ms)),
            process_id: None,
        }
    }

    /// Review 3, finding 5: a reading older than one shown (a read that raced a new term) is
    /// skipped whole; the next reading of the newer term is not sent again, and the backstop
    /// keeps the newer term's lease.
    #[test]
    fn an_older_reading_is_skipped_whole() {
        let mut s = Shown::new(None);
        assert_eq!(s.reading(Some(leader(5, 900))), Some(Some(leader(5, 900))));
        assert_eq!(s.reading(Some(leader(5, 800))), None, "same term: not sent");
        assert_eq!(s.reading(Some(leader(3, 50))), None, "older: skipped");
        assert_eq!(s.lease_left(), Some(Duration::from_millis(800)));
        assert_eq!(
            s.reading(Some(leader(5, 700))),
            None,
            "the newer term, again: not sent"
        );
        assert_eq!(s.reading(None), Some(None), "no leader after one: sent");
        assert_eq!(s.reading(None), None);
        assert_eq!(
            s.reading(Some(leader(4, 900))),
            None,
            "a term older than one seen"
        );
        assert_eq!(s.reading(Some(leader(7, 900))), Some(Some(leader(7, 900))));
    }
}
