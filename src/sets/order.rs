//! A set checked and put in the one order every caller takes: by hash slot, then by key;
//! its runs (the keys of one slot).

use super::Path;
use crate::error::{Error, Result};
use crate::limits::{MAX_SET_KEYS, QUEUED_SET_MAX};
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::wait::strategy::Strategy;

impl<S: Strategy> Locker<S> {
    /// The set's keys, checked (nothing sent), without duplicates, in the order every caller
    /// takes them: by hash slot, then by key; and how they are taken: at once (one node: see
    /// [`take_at_once`](Self::take_at_once)), waited for at once in every key's queue (a
    /// queued locker's wait on one node, at most `QUEUED_SET_MAX` keys: see
    /// [`take_queued`](Self::take_queued)), or in order (which needs the caller's opt-in).
    pub(super) fn set_order<K: AsRef<str>>(
        &self,
        keys: &[K],
        opts: &LockOptions,
        wait: bool,
    ) -> Result<(Vec<String>, Path)> {
        let first = keys.first().map_or("", |k| k.as_ref());
        if keys.is_empty() {
            return Err(Error::invalid_option(
                first,
                "keys",
                "[]",
                "a set needs at least one key",
            ));
        }
        if keys.len() > MAX_SET_KEYS {
            return Err(Error::invalid_option(
                first,
                "keys",
                format!("{} keys", keys.len()),
                "a set has at most MAX_SET_KEYS (10,000) keys",
            ));
        }
        opts.validate(first)?;
        if opts.token().is_some() {
            return Err(Error::invalid_option(
                first,
                "token",
                "fixed",
                "a set's keys each get a generated token (a fixed one could not be given back \
                 when an attempt in flight is dropped)",
            ));
        }
        let mut order = Vec::with_capacity(keys.len());
        for key in keys {
            let names = self.engine.names(key.as_ref())?;
            order.push((fred::util::redis_keyslot(names.lock.as_bytes()), names.key));
        }
        order.sort_unstable();
        order.dedup();
        let one_node =
            !self.engine.clustered || order.first().map(|o| o.0) == order.last().map(|o| o.0);
        let queued_wait = wait && self.strategy.hub().is_some();
        let path = match (one_node, queued_wait) {
            (true, false) => Path::AtOnce,
            (true, true) if order.len() <= QUEUED_SET_MAX => Path::Queued,
            _ => Path::InOrder,
        };
        if path == Path::InOrder && !opts.ordered_sets() {
            let mut slots: Vec<u16> = order.iter().map(|(slot, _)| *slot).collect();
            slots.dedup();
            let shown: Vec<String> = slots.iter().take(8).map(u16::to_string).collect();
            let more = if slots.len() > 8 { ", ..." } else { "" };
            let reason = if one_node {
                "a queued locker waits for at most QUEUED_SET_MAX (64) keys at once; a larger \
                 set only in order (each key held while the next is waited for): opt in with \
                 LockOptions::with_ordered_sets, split the set, or take it at once with \
                 acquire_many or a polling locker"
            } else {
                "keys in several hash slots can only be taken in order (each key held while \
                 the next is waited for); opt in with LockOptions::with_ordered_sets, or give \
                 the keys one hash tag (\"{tag}:a\", \"{tag}:b\") to take them at once"
            };
            return Err(Error::invalid_option(
                &order[0].1,
                "ordered_sets",
                format!("off (keys in hash slots {}{more})", shown.join(", ")),
                reason,
            ));
        }
        Ok((order.into_iter().map(|(_, key)| key).collect(), path))
    }

    /// The end (exclusive) of the run of `keys` from `from` that share its hash slot (every key
    /// on a single server): what the in-order path waits for as a whole, and what its bursts
    /// take in calls of one slot.
    pub(super) fn run_end(&self, keys: &[String], from: usize) -> usize {
        if !self.engine.clustered {
            return keys.len();
        }
        let slot = self.slot(&keys[from]);
        keys[from..]
            .iter()
            .position(|k| self.slot(k) != slot)
            .map_or(keys.len(), |p| from + p)
    }

    /// The start of the run of `keys` (see [`Self::run_end`]) that `at` is in.
    pub(super) fn run_start(&self, keys: &[String], at: usize) -> usize {
        if !self.engine.clustered {
            return 0;
        }
        if at >= keys.len() {
            return at;
        }
        let slot = self.slot(&keys[at]);
        keys[..at]
            .iter()
            .rposition(|k| self.slot(k) != slot)
            .map_or(0, |p| p + 1)
    }

    /// The hash slot of `key`'s lock (0 for a key the names refuse: `set_order` checked them).
    pub(super) fn slot(&self, key: &str) -> u16 {
        self.engine
            .names(key)
            .map_or(0, |n| fred::util::redis_keyslot(n.lock.as_bytes()))
    }
}
