//! Redis key names of one lock.
//!
//! For prefix `p` and user key `k` every name shares the base `{pk}`: lock `{pk}`, fence
//! counter `{pk}:fence`, waiter queue `{pk}:q`, waiting processes `{pk}:p`, and one grant
//! channel per waiting process `{pk}:w:<process id>`. Whatever the key holds (braces included), the first `{…}` of every
//! name is the same, and never empty since the prefix is non-empty and brace-free, so they
//! hash to one Redis Cluster slot.

use crate::error::{Error, Result};

/// Keys longer than this are refused.
pub(crate) const MAX_KEY_LEN: usize = 16 * 1024;

/// The Redis names behind one user key (the others derive from the lock's name when a call
/// needs them: a waiting future keeps only these two).
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) key: String,
    pub(crate) lock: String,
}

impl Names {
    pub(crate) fn new(prefix: &str, key: &str) -> Result<Names> {
        check_key(key)?;
        let lock = format!("{{{prefix}{key}}}");
        Ok(Names {
            key: key.to_owned(),
            lock,
        })
    }

    /// The fence counter's name.
    pub(crate) fn fence(&self) -> String {
        format!("{}:fence", self.lock)
    }

    /// The waiter queue's name.
    pub(crate) fn queue(&self) -> String {
        format!("{}:q", self.lock)
    }

    /// The name of the hash that records when each waiting process last called on the key.
    pub(crate) fn processes(&self) -> String {
        format!("{}:p", self.lock)
    }

    /// The names behind a lock name (for a grant whose waiter is gone: the channel gives
    /// only the lock's Redis name, which then stands for the key in errors and logs).
    pub(crate) fn from_lock(lock: &str) -> Names {
        Names {
            key: lock.to_owned(),
            lock: lock.to_owned(),
        }
    }

    /// The channel on which grants reach the waiters of process `hub` (as the scripts build it).
    pub(crate) fn channel(&self, hub: &str) -> String {
        crate::redis::protocol::channel(&self.lock, hub)
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
        return Err(Error::InvalidOptions {
            key: String::new(),
            field: "prefix",
            value: format!("{prefix:?}"),
            reason: "must be non-empty, at most 256 bytes, without '{' or '}'",
        });
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
