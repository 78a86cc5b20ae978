//! What `status` reports about one lock.

use crate::redis::scripts::RawStatus;
use std::time::Duration;

/// A snapshot of one lock in Redis (see [`Locker::status`](crate::Locker::status)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// Whether some token holds the lock.
    pub held: bool,
    /// The holder's remaining TTL; `None` when free or when the key has no expiry.
    pub remaining_ttl: Option<Duration>,
    /// The fence of the latest acquisition, if the key's fence counter exists.
    pub fence: Option<u64>,
    /// How many waiters are queued (dead ones are dropped by the next release).
    pub queued: usize,
    /// The holder got the lock from a grant it has not confirmed yet (its claim window runs).
    pub granted_unconfirmed: bool,
}

impl LockStatus {
    pub(crate) fn from_raw(raw: &RawStatus) -> LockStatus {
        let held = raw.state != 0;
        LockStatus {
            held,
            remaining_ttl: (held && raw.pttl >= 0).then(|| Duration::from_millis(raw.pttl as u64)),
            fence: (raw.fence > 0).then_some(raw.fence),
            queued: raw.queued as usize,
            granted_unconfirmed: raw.state == 2,
        }
    }
}
