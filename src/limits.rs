//! The crate's limits in one place: what a call refuses (key, token, label and value lengths,
//! set sizes, permits) and how big a batch or a report grows. The public ones are re-exported
//! at the crate's root.

// Keys, tokens, labels and values.

/// Keys longer than this are refused.
pub(crate) const MAX_KEY_LEN: usize = 16 * 1024;

/// Tokens longer than this are refused (the token is compared on every call).
pub(crate) const MAX_TOKEN_LEN: usize = 1024;

/// Labels longer than this are refused.
pub const MAX_LABEL_LEN: usize = 256;

/// Values longer than this are refused.
pub const MAX_VALUE_LEN: usize = 64 * 1024;

// Several keys at once.

/// The most keys one set may have; above it the set is refused
/// ([`Error::InvalidOptions`](crate::Error::InvalidOptions), field `keys`). Taken at once (one node), a set costs one call per 256 keys (1,000 free keys
/// took 12-19 ms on a local server); in order, one call per key waited for plus one per run of
/// up to 256 free keys in one slot (1,000 in one slot: 13-18 ms; over 3 primaries, each key
/// in its own slot: 26-58 ms).
pub const MAX_SET_KEYS: usize = 10_000;

/// The most keys a queued locker waits for at once: a grant, a queueing call and a release
/// of such a set each do about a dozen commands per key in one script (Redis serves nobody
/// meanwhile). A larger set is waited for in order (`LockOptions::with_ordered_sets`).
pub(crate) const QUEUED_SET_MAX: usize = 64;

/// The most locks one `take_set.lua` call takes (the script's bound; a larger set is split).
pub(crate) const TAKE_SET_MAX: usize = 256;

/// Attempts sent at once when a set's next keys are tried together.
pub(crate) const BURST: usize = 512;

// Permits.

/// The most permits a key can have (a read-write lock has this many: a reader holds one, a
/// writer all of them).
pub const MAX_PERMITS: u32 = 1 << 20;

// Batches and reports.

/// Locks per batched refresh call at most: a call's script time stays short (three commands
/// per lock), and 10,000 leases refreshed once per period take under 100 calls.
pub(crate) const BATCH: usize = 128;

/// How many waiters [`Locker::status`](crate::Locker::status) lists, at most (the first, in
/// queue order).
pub const STATUS_WAITERS: usize = 10;
