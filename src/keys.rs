//! Redis key names of one lock.
//!
//! For prefix `p` and user key `k` every name shares the base `{pk}`: lock `{pk}`, fence
//! counter `{pk}:fence`, waiter queue `{pk}:q`, waiting processes `{pk}:p`, and one grant
//! channel per waiting process `{pk}:w:<process id>`. Whatever the key holds (braces included), the first `{…}` of every
//! name is the same, and never empty since the prefix is non-empty and brace-free, so they
//! hash to one Redis Cluster slot.

use crate::error::{Error, Result};
use crate::limits::MAX_KEY_LEN;

/// The Redis name of a process's label (`LockerBuilder::label`): `{<prefix>labels}:<pid>`,
/// every process's in one hash slot, so one `MGET` reads them all.
pub(crate) fn label_key(prefix: &str, pid: &str) -> String {
    format!("{{{prefix}labels}}:{pid}")
}

/// What a key's names stand for: a lock, or permits (a semaphore or a read-write lock, whose
/// names are the lock's with `:s` after the hash tag: `{pk}:s`, `{pk}:s:fence`, `{pk}:s:q`,
/// `{pk}:s:p`, `{pk}:s:f` and `{pk}:s:w:<process id>`; a lock's name always ends with `}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Lock,
    /// `limit` permits (0: not known here, e.g. for a grant whose waiter is gone; only
    /// acquiring needs it).
    Permits {
        limit: u32,
    },
}

/// The suffix of a permit key's holders set after the shared hash tag.
const PERMITS_SUFFIX: &str = ":s";

/// The Redis names behind one user key (the others derive from the lock's name when a call
/// needs them: a waiting future keeps only these).
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) key: String,
    pub(crate) lock: String,
    pub(crate) kind: Kind,
}

impl Names {
    pub(crate) fn new(prefix: &str, key: &str) -> Result<Names> {
        check_key(key)?;
        let lock = format!("{{{prefix}{key}}}");
        Ok(Names {
            key: key.to_owned(),
            lock,
            kind: Kind::Lock,
        })
    }

    /// The names of `limit` permits on `key` (a semaphore's or a read-write lock's).
    pub(crate) fn permits(prefix: &str, key: &str, limit: u32) -> Result<Names> {
        check_key(key)?;
        Ok(Names {
            key: key.to_owned(),
            lock: format!("{{{prefix}{key}}}{PERMITS_SUFFIX}"),
            kind: Kind::Permits { limit },
        })
    }

    /// The hash of permit holders' fences (permits only).
    pub(crate) fn holder_fences(&self) -> String {
        format!("{}:f", self.lock)
    }

    /// The fence counter's name.
    pub(crate) fn fence(&self) -> String {
        format!("{}:fence", self.lock)
    }

    /// An election's record (`crate::election`): who leads, with what value.
    pub(crate) fn leader(&self) -> String {
        format!("{}:leader", self.lock)
    }

    /// The waiter queue's name.
    pub(crate) fn queue(&self) -> String {
        format!("{}:q", self.lock)
    }

    /// The name of the hash that records when each waiting process last called on the key.
    pub(crate) fn processes(&self) -> String {
        format!("{}:p", self.lock)
    }

    /// The user key behind lock name `lock` of a lock (`{<prefix><key>}`, as [`Names::new`]
    /// makes it); `lock` itself when it is not one of `prefix`'s.
    pub(crate) fn key_of_lock<'a>(prefix: &str, lock: &'a str) -> &'a str {
        lock.strip_prefix('{')
            .and_then(|l| l.strip_prefix(prefix))
            .and_then(|l| l.strip_suffix('}'))
            .unwrap_or(lock)
    }

    /// The names behind a lock name (for a grant whose waiter is gone: the channel gives
    /// only the lock's Redis name, which then stands for the key in errors and logs).
    pub(crate) fn from_lock(lock: &str) -> Names {
        let kind = if lock.ends_with(PERMITS_SUFFIX) {
            Kind::Permits { limit: 0 }
        } else {
            Kind::Lock
        };
        Names {
            key: lock.to_owned(),
            lock: lock.to_owned(),
            kind,
        }
    }

    /// The channel on which grants reach the waiters of process `pid` (as the scripts build it).
    pub(crate) fn channel(&self, pid: &str) -> String {
        crate::redis::protocol::channel(&self.lock, pid)
    }
}

fn check_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "must not be empty"
    } else if key.len() > MAX_KEY_LEN {
        "must be at most 16 KiB"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKey {
        key: key.chars().take(64).collect(),
        reason,
    })
}

/// A prefix must be non-empty and brace-free so the hash tag is never empty.
pub(crate) fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() || prefix.contains(['{', '}']) || prefix.len() > 256 {
        return Err(Error::invalid_setting(
            "prefix",
            format!("{prefix:?}"),
            "must be non-empty, at most 256 bytes, without '{' or '}'",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash tag Redis Cluster would use: the text between the first `{` and the next `}`,
    /// when non-empty; otherwise the whole name.
    fn hash_tag(name: &str) -> &str {
        if let Some(open) = name.find('{') {
            if let Some(len) = name[open + 1..].find('}') {
                if len > 0 {
                    return &name[open + 1..open + 1 + len];
                }
            }
        }
        name
    }

    #[test]
    fn all_names_share_one_hash_tag() {
        for key in ["job", "a}b", "}x", "{y}", "{", "}", "sp ace", "ünï", "{}{}"] {
            let n = Names::new("waitlock:", key).unwrap();
            assert_eq!(hash_tag(&n.lock), hash_tag(&n.fence()), "{key}");
            assert_eq!(hash_tag(&n.lock), hash_tag(&n.queue()), "{key}");
            assert_eq!(hash_tag(&n.lock), hash_tag(&n.processes()), "{key}");
            assert_eq!(hash_tag(&n.lock), hash_tag(&n.channel("ab12")), "{key}");
            assert!(!hash_tag(&n.lock).is_empty());
            let p = Names::permits("waitlock:", key, 3).unwrap();
            assert_eq!(hash_tag(&n.lock), hash_tag(&p.lock), "{key}");
            assert_eq!(hash_tag(&n.lock), hash_tag(&p.holder_fences()), "{key}");
            assert_eq!(hash_tag(&n.lock), hash_tag(&p.channel("ab12")), "{key}");
            assert_eq!(Names::from_lock(&p.lock).kind, Kind::Permits { limit: 0 });
            assert_eq!(Names::from_lock(&n.lock).kind, Kind::Lock);
            assert_ne!(n.fence(), p.fence());
        }
    }

    #[test]
    fn bad_keys_and_prefixes_are_refused() {
        assert!(matches!(
            Names::new("p:", ""),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(
            Names::new("p:", &"k".repeat(MAX_KEY_LEN + 1)),
            Err(Error::InvalidKey { .. })
        ));
        assert!(Names::new("p:", &"k".repeat(1024)).is_ok());
        for p in ["", "a{", "}", &"p".repeat(257)] {
            assert!(check_prefix(p).is_err(), "{p}");
        }
    }
}
