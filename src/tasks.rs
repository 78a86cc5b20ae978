//! Counts the crate's background tasks (refreshers, background releases) so that users and
//! tests can check none is left running.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct TaskCounter {
    count: AtomicUsize,
    idle: Notify,
}

impl TaskCounter {
    pub(crate) fn ticket(self: &Arc<Self>) -> Ticket {
        self.count.fetch_add(1, Ordering::SeqCst);
        Ticket(Arc::clone(self))
    }

    pub(crate) fn get(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Resolves once no task is running.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.get() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Held by a running task; its drop marks the task done.
pub(crate) struct Ticket(Arc<TaskCounter>);

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
