//! What `status` reports about one lock.

use crate::keys::Names;
use crate::redis::protocol;
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
    /// Who holds it, when held.
    pub holder: Option<Holder>,
    /// The first waiters in queue order ([`STATUS_WAITERS`](crate::STATUS_WAITERS) at most; `queued` counts them
    /// all). A waiter of a process that died stays listed until a release drops it.
    pub waiters: Vec<Waiter>,
}

/// The holder of a lock, as [`LockStatus`] names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// Its token. Whoever has it can release the lock (`Locker::unlock`): show it to no one
    /// who should not.
    pub token: String,
    /// The process id of a queued locker's holder (its tokens are `<process id>/<uuid>`);
    /// `None` for a polling locker's or a caller's own token.
    pub process_id: Option<String>,
    /// That process's label (`LockerBuilder::label`), if it is recorded.
    pub label: Option<String>,
    /// How long it has held the lock, by Redis' clock (from the fence, which is Redis' time in
    /// microseconds when it was taken; `None` when the fence is not a time of this clock).
    pub held_for: Option<Duration>,
}

/// A queued waiter, as [`LockStatus`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// Its process id.
    pub process_id: String,
    /// That process's label (`LockerBuilder::label`), if it is recorded.
    pub label: Option<String>,
    /// How long it has waited in the queue, by Redis' clock.
    pub waited: Duration,
    /// The TTL it asked for.
    pub ttl: Duration,
    /// The permits it asks for (1 for a lock; a read-write lock's writer asks for all).
    pub weight: u32,
    /// The keys of the set it waits for at once (this key among them, in the set's order;
    /// empty when it waits for this key alone: see [`Locker::acquire_many_wait`](crate::Locker::acquire_many_wait)).
    pub set: Vec<String>,
}

/// A holder of permits, as [`PermitStatus`](crate::PermitStatus) names it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseHolder {
    /// Its process id, for a queued locker's holder (`None`: a polling locker's).
    pub process_id: Option<String>,
    /// That process's label (`LockerBuilder::label`), if it is recorded.
    pub label: Option<String>,
    /// The permits it holds.
    pub weight: u32,
    /// When its lease ends.
    pub ends_in: Duration,
}

/// The weight and the rest of a permit token (`w<weight>:<rest>`); a lock's token weighs 1.
fn weighed(token: &str) -> (u32, &str) {
    token
        .strip_prefix('w')
        .and_then(|t| t.split_once(':'))
        .and_then(|(w, rest)| Some((w.parse().ok()?, rest)))
        .unwrap_or((1, token))
}

/// The process id in a queued locker's token (`<12 hex digits>/<uuid>`).
pub(crate) fn token_pid(token: &str) -> Option<&str> {
    let (pid, rest) = token.split_once('/')?;
    (pid.len() == 12 && pid.bytes().all(|b| b.is_ascii_hexdigit()) && !rest.is_empty())
        .then_some(pid)
}

/// A queue member's process id, TTL, weight and, a set's, lock names (`"<pid> <ttl ms>
/// <token>"`, or a set's `"<pid> <ttl ms>* <token> <locks>"`).
fn member(m: &str) -> Option<(&str, u64, u32, Vec<&str>)> {
    let mut parts = m.splitn(3, ' ');
    let pid = parts.next()?;
    let ttl = parts.next()?;
    let rest = parts.next()?;
    if let Some(ttl) = ttl.strip_suffix('*') {
        let (_, locks) = rest.split_once(' ')?;
        return Some((pid, ttl.parse().ok()?, 1, protocol::set_locks(locks)?));
    }
    let (weight, _) = weighed(rest);
    Some((pid, ttl.parse().ok()?, weight, Vec::new()))
}

/// The waiters of queue members `raw` (member, when queued in µs) at Redis time `now_us`; a
/// set's keys are its locks' names less the braces and `prefix`.
pub(crate) fn waiters(
    raw: &[(String, u64)],
    now_us: u64,
    prefix: &str,
    label: &impl Fn(&str) -> Option<String>,
) -> Vec<Waiter> {
    raw.iter()
        .filter_map(|(m, queued_at)| {
            let (pid, ttl, weight, locks) = member(m)?;
            Some(Waiter {
                label: label(pid),
                process_id: pid.to_owned(),
                waited: Duration::from_micros(now_us.saturating_sub(*queued_at)),
                ttl: Duration::from_millis(ttl),
                weight,
                set: locks
                    .into_iter()
                    .map(|l| Names::key_of_lock(prefix, l).to_owned())
                    .collect(),
            })
        })
        .collect()
}

/// The distinct process ids named by `tokens` (holders') and queue `members`.
pub(crate) fn named_pids<'a>(
    tokens: impl Iterator<Item = &'a str>,
    members: &[(String, u64)],
) -> Vec<String> {
    let mut pids: Vec<String> = tokens
        .filter_map(|t| token_pid(weighed(t).1))
        .map(str::to_owned)
        .chain(
            members
                .iter()
                .filter_map(|(m, _)| member(m).map(|(pid, ..)| pid.to_owned())),
        )
        .collect();
    pids.sort();
    pids.dedup();
    pids
}

/// The holders of permit leases `(token, time left)`.
pub(crate) fn lease_holders(
    leases: &[(String, Duration)],
    label: &impl Fn(&str) -> Option<String>,
) -> Vec<LeaseHolder> {
    leases
        .iter()
        .map(|(token, left)| {
            let (weight, rest) = weighed(token);
            let pid = token_pid(rest);
            LeaseHolder {
                process_id: pid.map(str::to_owned),
                label: pid.and_then(label),
                weight,
                ends_in: *left,
            }
        })
        .collect()
}

impl LockStatus {
    /// The snapshot of `raw`; `label` names a process (`None` when not recorded).
    pub(crate) fn from_raw(
        raw: &RawStatus,
        prefix: &str,
        label: impl Fn(&str) -> Option<String>,
    ) -> LockStatus {
        let held = raw.state != 0;
        let holder = raw.holder.as_ref().filter(|_| held).map(|token| {
            let pid = token_pid(token).map(str::to_owned);
            Holder {
                label: pid.as_deref().and_then(&label),
                process_id: pid,
                token: token.clone(),
                held_for: raw
                    .now_us
                    .checked_sub(raw.fence)
                    .filter(|_| raw.fence > 0)
                    .map(Duration::from_micros),
            }
        });
        let waiters = waiters(&raw.waiters, raw.now_us, prefix, &label);
        LockStatus {
            held,
            remaining_ttl: (held && raw.pttl >= 0).then(|| Duration::from_millis(raw.pttl as u64)),
            fence: (raw.fence > 0).then_some(raw.fence),
            queued: raw.queued as usize,
            granted_unconfirmed: raw.state == 2,
            holder,
            waiters,
        }
    }

    /// The process ids `from_raw` will ask labels for.
    pub(crate) fn pids(raw: &RawStatus) -> Vec<String> {
        named_pids(raw.holder.as_deref().into_iter(), &raw.waiters)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_names_the_holder_and_the_waiters_in_queue_order() {
        let raw = RawStatus {
            state: 1,
            pttl: 900,
            fence: 1_000_000,
            queued: 3,
            now_us: 3_500_000,
            holder: Some("0123456789ab/3f2a".into()),
            waiters: vec![
                ("bbbbbbbbbbbb 30000 t1".into(), 2_000_000),
                ("cccccccccccc 5000 t2".into(), 3_000_000),
                ("malformed".into(), 3_100_000),
                (
                    "dddddddddddd 9000* dddddddddddd/s 12:{waitlock:k}14:{waitlock:k:2}".into(),
                    3_200_000,
                ),
            ],
        };
        assert_eq!(
            LockStatus::pids(&raw),
            [
                "0123456789ab",
                "bbbbbbbbbbbb",
                "cccccccccccc",
                "dddddddddddd"
            ]
        );
        let s = LockStatus::from_raw(&raw, "waitlock:", |pid| {
            (pid != "cccccccccccc").then(|| format!("L{pid}"))
        });
        let h = s.holder.expect("held");
        assert_eq!(h.process_id.as_deref(), Some("0123456789ab"));
        assert_eq!(h.label.as_deref(), Some("L0123456789ab"));
        assert_eq!(h.held_for, Some(Duration::from_millis(2500)));
        assert_eq!(s.waiters.len(), 3, "a malformed member is left out");
        assert_eq!(s.waiters[2].set, ["k", "k:2"]);
        assert!(s.waiters[0].set.is_empty());
        assert_eq!(s.waiters[0].waited, Duration::from_millis(1500));
        assert_eq!(s.waiters[0].ttl, Duration::from_secs(30));
        assert_eq!(s.waiters[1].label, None);
        assert_eq!(s.waiters[1].weight, 1);
        // Permit tokens carry their weight.
        let leases = [("w3:0123456789ab/x".to_owned(), Duration::from_secs(2))];
        let h = lease_holders(&leases, &|_| Some("L".into()));
        assert_eq!(
            (h[0].weight, h[0].process_id.as_deref()),
            (3, Some("0123456789ab"))
        );
        let members = [("bbbbbbbbbbbb 5000 w2:bbbbbbbbbbbb/y".to_owned(), 0)];
        assert_eq!(waiters(&members, 1, "waitlock:", &|_| None)[0].weight, 2);
        // A polling locker's token names no process.
        assert_eq!(token_pid("3f2a9c1e-0000"), None);
        assert_eq!(token_pid("0123456789ab/"), None);
    }
}
