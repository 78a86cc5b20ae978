//! Clean-up that must happen even when a future is dropped: releases and queue departures sent
//! from a background task.

use super::scripts::Call;
use super::{Client, Engine};
use crate::keys::Names;
use std::sync::Arc;

impl Engine {
    /// Runs `job` in a counted background task; does nothing outside a tokio runtime (the lock
    /// or queue entry then lapses by itself: the TTL, or the missing subscriber).
    fn spawn_cleanup<F>(self: &Arc<Self>, key: &str, job: impl FnOnce(Arc<Engine>) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %key, "no tokio runtime to clean up in; the lock expires by its TTL");
            return;
        };
        let ticket = self.tasks.ticket();
        let fut = job(Arc::clone(self));
        handle.spawn(async move {
            let _ticket = ticket;
            fut.await
        });
    }

    /// Releases in a background task (for `Drop`), on `client` when given so that it runs after
    /// whatever was sent on it before.
    pub(crate) fn release_in_background(
        self: &Arc<Self>,
        client: Option<Client>,
        names: Names,
        token: String,
    ) {
        let key = names.key.clone();
        self.spawn_cleanup(&key, move |engine| async move {
            let client = client.unwrap_or_else(|| engine.backend.next_client().clone());
            match engine
                .release_on(&client, &names, &token, engine.command_timeout)
                .await
            {
                Ok(r) => tracing::debug!(key = %names.key, result = ?r, "background release"),
                Err(e) => tracing::warn!(key = %names.key, error = %e, "background release failed; the lock will expire by its TTL"),
            }
        });
    }

    /// Leaves the queue in a background task, giving back a grant (or, for generated tokens,
    /// any hold of the token), on `client` so that it runs after the waiter's last attempt.
    pub(crate) fn leave_in_background(
        self: &Arc<Self>,
        client: Client,
        names: Names,
        token: String,
        member: String,
        own_token: bool,
    ) {
        let key = names.key.clone();
        self.spawn_cleanup(&key, move |engine| async move {
            let c = Call {
                names: &names,
                token: &token,
                ttl_ms: 1,
                member: &member,
                flag: if own_token { "G" } else { "g" },
            };
            match engine.leave_on(&client, &c, engine.command_timeout).await {
                Ok(left) => tracing::debug!(key = %names.key, ?left, "background queue departure"),
                Err(e) => tracing::warn!(key = %names.key, error = %e, "leaving the queue failed; the entry lapses when this process stops listening"),
            }
        });
    }
}

/// Sends a release of a token whose acquire outcome is unknown when dropped armed.
pub(crate) struct ResidueGuard<'a> {
    pub(crate) engine: &'a Arc<Engine>,
    pub(crate) client: &'a Client,
    pub(crate) names: &'a Names,
    pub(crate) token: &'a str,
    pub(crate) armed: bool,
}

impl Drop for ResidueGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.engine.release_in_background(
                Some(self.client.clone()),
                self.names.clone(),
                self.token.to_owned(),
            );
        }
    }
}

/// A waiter's place in a Redis queue: when dropped armed (the waiter's future was dropped, or it
/// failed after queueing), it leaves the queue in the background and gives back a grant it may
/// have been sent, so the next waiter is served at once.
///
/// It borrows what it needs from the waiting future (whose size is every waiter's cost).
pub(crate) struct QueueResidue<'a> {
    pub(crate) engine: &'a Arc<Engine>,
    pub(crate) client: &'a Client,
    pub(crate) names: &'a Names,
    pub(crate) token: &'a str,
    /// The waiting process's id (the hub's).
    pub(crate) waiter_id: &'a str,
    pub(crate) ttl_ms: u64,
    pub(crate) own_token: bool,
    pub(crate) armed: bool,
}

impl QueueResidue<'_> {
    /// The waiter's queue member, as the scripts store it: `"<id> <ttl ms> <token>"`.
    pub(crate) fn member(&self) -> String {
        format!("{} {} {}", self.waiter_id, self.ttl_ms, self.token)
    }
}

impl Drop for QueueResidue<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.engine.leave_in_background(
                self.client.clone(),
                self.names.clone(),
                self.token.to_owned(),
                self.member(),
                self.own_token,
            );
        }
    }
}
