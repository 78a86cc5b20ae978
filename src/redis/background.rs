//! Clean-up that must happen even when a future is dropped: releases and queue departures sent
//! from a background task.
//!
//! Each is *sent* before the call that asks for it returns: its future is polled once on the
//! spot (fred queues a command on its client at the first poll), then finished by a task. So
//! a clean-up of a token always reaches Redis before that token's later calls, which go
//! through the same client ([`Backend::client_for`](super::Backend::client_for)).

use super::protocol::Flag;
use super::scripts::{Call, Via};
use super::Engine;
use crate::keys::Names;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

impl Engine {
    /// Sends `job`'s first command now and finishes it in a counted background task; does
    /// nothing outside a tokio runtime (the lock or queue entry then lapses by itself: the
    /// TTL, or the missing subscriber).
    fn spawn_cleanup<F>(self: &Arc<Self>, key: &str, job: impl FnOnce(Arc<Engine>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %key, "no tokio runtime to clean up in; the lock expires by its TTL");
            return;
        };
        let ticket = self.tasks.ticket();
        let mut job = Box::pin(job(Arc::clone(self)));
        if job
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_ready()
        {
            return;
        }
        handle.spawn(async move {
            let _ticket = ticket;
            job.await
        });
    }

    /// Releases in a background task (a guard dropped without `release`, or a release that
    /// failed with an unknown outcome). A release that cannot reach Redis (a timeout, a
    /// connection or a redirection error: while a Cluster slot moves, every call on it fails)
    /// is tried again, a little later each time, until `until` (the lease's end: after it
    /// Redis lets the lock go by itself). The token makes no later calls, so a late release
    /// can hit nothing of anyone else's.
    pub(crate) fn release_in_background(
        self: &Arc<Self>,
        names: Names,
        token: String,
        pid: String,
        until: tokio::time::Instant,
    ) {
        let key = names.key.clone();
        self.spawn_cleanup(&key, move |engine| async move {
            let client = engine.backend.client_for(&token).clone();
            let mut pause = std::time::Duration::from_millis(10);
            loop {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                let limit = engine
                    .settings.command_timeout
                    .min(left)
                    .max(std::time::Duration::from_millis(1));
                match engine
                    .release_with(&client, &names, &token, &pid, limit, Via::Sha)
                    .await
                {
                    Ok(r) => {
                        tracing::debug!(key = %names.key, result = ?r, "background release");
                        return;
                    }
                    Err(e) if e.is_transient() && tokio::time::Instant::now() + pause < until => {
                        tracing::debug!(key = %names.key, error = %e, ?pause, "background release failed; trying again");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_millis(500));
                    }
                    Err(e) => {
                        tracing::warn!(key = %names.key, error = %e, "background release failed; the lock will expire by its TTL");
                        return;
                    }
                }
            }
        });
    }

    /// Leaves the queue (when `member` is not empty) and gives back what `flag` says, in a
    /// background task: a wait that ended without the lock, or a grant whose waiter had gone.
    pub(crate) fn leave_in_background(
        self: &Arc<Self>,
        names: Names,
        token: String,
        member: String,
        pid: String,
        flag: Flag,
    ) {
        let key = names.key.clone();
        self.spawn_cleanup(&key, move |engine| async move {
            let client = engine.backend.client_for(&token).clone();
            let c = Call {
                member: &member,
                pid: &pid,
                flag: Some(flag),
                ..Call::new(&names, &token)
            };
            // With the script's text: a NOSCRIPT retry would go out behind the token's later
            // calls.
            match engine
                .leave_on(&client, &c, engine.settings.command_timeout, Via::Text)
                .await
            {
                Ok(left) => tracing::debug!(key = %names.key, ?left, "background queue departure"),
                Err(e) => tracing::warn!(key = %names.key, error = %e, "leaving the queue failed; the entry lapses when this process stops listening"),
            }
        });
    }

    /// A set's waiter leaves every queue of `set` (when `member` is not empty) and gives back
    /// what its token holds (`orphan`: only the unclaimed grant with those fences), in a
    /// background task: a set's wait that ended without the set, or a set's grant whose
    /// waiter had gone.
    pub(crate) fn set_leave_in_background(
        self: &Arc<Self>,
        set: Vec<Names>,
        token: String,
        member: String,
        pid: String,
        orphan: Option<Vec<u64>>,
    ) {
        let Some(key) = set.first().map(|n| n.key.clone()) else {
            return;
        };
        self.spawn_cleanup(&key, move |engine| async move {
            let client = engine.backend.client_for(&token).clone();
            let names: Vec<&Names> = set.iter().collect();
            // With the script's text: a NOSCRIPT retry would go out behind the token's later
            // calls.
            match engine
                .set_leave_on(
                    &client,
                    &names,
                    &token,
                    &member,
                    &pid,
                    orphan.as_deref(),
                    engine.settings.command_timeout,
                    Via::Text,
                )
                .await
            {
                Ok(left) => tracing::debug!(key = %set[0].key, ?left, "background departure of a set"),
                Err(e) => tracing::warn!(key = %set[0].key, error = %e, "a set leaving its queues failed; its entries lapse when this process stops listening, its keys by their TTL"),
            }
        });
    }
}

/// Gives back whatever a token may have taken by an attempt whose outcome is unknown (it was
/// dropped, or timed out and may still run), when dropped armed.
pub(crate) struct ResidueGuard<'a> {
    pub(crate) engine: &'a Arc<Engine>,
    pub(crate) names: &'a Names,
    pub(crate) token: &'a str,
    pub(crate) armed: bool,
}

impl Drop for ResidueGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.engine.leave_in_background(
                self.names.clone(),
                self.token.to_owned(),
                String::new(),
                String::new(),
                Flag::GiveBack,
            );
        }
    }
}
