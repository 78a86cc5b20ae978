//! Releasing a lock taken free in one command, on a server that has a compare-and-delete
//! (issue 36): Redis 8.4's `DELEX key IFEQ value`, Valkey 9's `DELIFEQ key value`.
//!
//! A lock taken free and never queued for holds the value `p<token>` (`lock.lua`: state
//! "taken"), and its release script does nothing but delete it. Such a release is then one
//! command, with no script: it deletes the key only while its value is still that one. When
//! the value is another (a waiter queued since: state `q`; the lease ran out; another token
//! holds it), nothing is deleted and the release script runs as on any server, which hands
//! the lock on or says it was not held. Detected once per engine (`COMMAND INFO`); a node
//! that refuses the command (a Cluster half upgraded) turns the path off for the engine.

use super::{Released, Via};
use crate::error::{Op, Result};
use crate::keys::{Kind, Names};
use crate::redis::{Client, Engine};
use fred::interfaces::ClientLike;
use fred::types::{CustomCommand, Value};
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::Instant;

/// The lock's state letter of a lock taken free (`TAKEN` in `lock.lua`).
const TAKEN: &str = "p";

/// A server's compare-and-delete command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompareDelete {
    /// Redis 8.4 and later: `DELEX key IFEQ value`.
    Delex,
    /// Valkey 9 and later: `DELIFEQ key value`.
    DelIfEq,
}

impl CompareDelete {
    /// What `COMMAND INFO DELEX DELIFEQ` said (`Null` for a command the server lacks).
    fn of(reply: &Value) -> Option<CompareDelete> {
        let Value::Array(found) = reply else {
            return None;
        };
        match found.as_slice() {
            [delex, _] if !delex.is_null() => Some(CompareDelete::Delex),
            [_, delifeq] if !delifeq.is_null() => Some(CompareDelete::DelIfEq),
            _ => None,
        }
    }

    /// The command and its arguments, deleting `lock` only while it holds `value`.
    fn call(self, lock: &str, value: String) -> (CustomCommand, Vec<Value>) {
        let key = Value::from(lock.to_owned());
        match self {
            CompareDelete::Delex => (
                CustomCommand::new_static("DELEX", None, false),
                vec![key, Value::from("IFEQ"), Value::from(value)],
            ),
            CompareDelete::DelIfEq => (
                CustomCommand::new_static("DELIFEQ", None, false),
                vec![key, Value::from(value)],
            ),
        }
    }
}

/// Whether `e` is the server refusing the command (not a connection, routing or timeout
/// failure, and not a demoted primary, which the script would meet too).
fn refused(e: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    !matches!(
        e.kind(),
        ErrorKind::IO
            | ErrorKind::Timeout
            | ErrorKind::Canceled
            | ErrorKind::Routing
            | ErrorKind::Cluster
    ) && !e.details().starts_with("READONLY")
}

/// What the engine learned of the server's compare-and-delete command.
#[derive(Default)]
pub(crate) struct CompareDeleteState {
    /// The command, once asked.
    found: tokio::sync::OnceCell<Option<CompareDelete>>,
    /// A node refused it: releases use the script only.
    off: std::sync::atomic::AtomicBool,
}

impl Engine {
    /// The server's compare-and-delete command, asked once (`None`: it has none, it could not
    /// be asked, or a node refused it).
    async fn compare_delete(&self, client: &Client) -> Option<CompareDelete> {
        if self.compare_delete.off.load(Ordering::Relaxed) {
            return None;
        }
        let found = self
            .compare_delete
            .found
            .get_or_init(|| async {
                let asked = tokio::time::timeout(
                    self.settings.command_timeout,
                    client.custom::<Value, Value>(
                        CustomCommand::new_static("COMMAND", None, false),
                        vec!["INFO".into(), "DELEX".into(), "DELIFEQ".into()],
                    ),
                )
                .await;
                match asked {
                    Ok(Ok(reply)) => CompareDelete::of(&reply),
                    _ => None,
                }
            })
            .await;
        *found
    }

    /// Releases a lock `token` took free (see the module's text): one compare-and-delete
    /// where the server has one and the lock is as it was taken, else the release script.
    pub(crate) async fn release_taken(
        &self,
        client: &Client,
        names: &Names,
        token: &str,
        pid: &str,
        limit: Duration,
    ) -> Result<Released> {
        let deadline = Instant::now() + limit;
        let cad = match names.kind {
            Kind::Lock => self.compare_delete(client).await,
            Kind::Permits { .. } => None,
        };
        if let Some(cad) = cad {
            let (cmd, args) = cad.call(&names.lock, format!("{TAKEN}{token}"));
            let left = deadline.saturating_duration_since(Instant::now());
            let sent = tokio::time::timeout(left, client.custom::<i64, Value>(cmd, args)).await;
            match sent {
                Ok(Ok(1)) => return Ok(Released::Deleted),
                Ok(Ok(_)) => {}
                // Refused (an unknown command on a node not upgraded, an ACL without it): the
                // script from now on.
                Ok(Err(e)) if refused(&e) => {
                    self.compare_delete.off.store(true, Ordering::Relaxed);
                }
                other => {
                    self.outcome(client, names, Op::Release, left, other)?;
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        self.release_with(client, names, token, pid, left, Via::Sha)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_info_reply_names_the_command() {
        let of = |a: Value, b: Value| CompareDelete::of(&Value::Array(vec![a, b]));
        let info = || Value::Array(vec![Value::from("delex")]);
        assert_eq!(of(info(), Value::Null), Some(CompareDelete::Delex));
        assert_eq!(of(Value::Null, info()), Some(CompareDelete::DelIfEq));
        assert_eq!(of(Value::Null, Value::Null), None);
        assert_eq!(CompareDelete::of(&Value::Null), None);
    }
}
