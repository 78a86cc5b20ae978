//! The protocol's formats, written once on the Rust side: everything Rust and the Lua scripts
//! (`lua/queue.lua` and `lua/lock.lua`, whose headers are the other half of this module)
//! exchange.
//!
//! **Version rule.** Formats only grow: a reader ignores what it does not know (a message with
//! an unknown tag is dropped, an unknown lock state reads as "held"), and a new meaning gets a
//! new tag, never an old one reused. During a rolling upgrade, scripts and clients of two
//! versions meet on the same keys; the rule keeps every guard's lease one that Redis gave (an
//! older client may be served late, never wrongly). `tests/scripts_lock.rs` and `tests/scripts_permits.rs` drive every transition
//! of the scripts through a real Redis; `model/` (crate `waitlock-model`)
//! checks the protocol exhaustively.

use std::time::Duration;

/// A waiter's queue member: `"<pid> <ttl ms> <token>"` (the grant uses the TTL; the token is
/// last and may hold spaces).
pub(crate) fn member(pid: &str, ttl_ms: u64, token: &str) -> String {
    format!("{pid} {ttl_ms} {token}")
}

/// A set's queue member, the same in each of its keys' queues (see `lua/queue.lua`):
/// `"<pid> <ttl ms>* <token> <locks>"`, each lock name as `"<length>:<name>"`, the set's first
/// key's first (its channel is the set's). The token is generated, without spaces.
pub(crate) fn set_member<'a>(
    pid: &str,
    ttl_ms: u64,
    token: &str,
    locks: impl Iterator<Item = &'a str>,
) -> String {
    let mut m = format!("{pid} {ttl_ms}* {token} ");
    for lock in locks {
        m.push_str(&lock.len().to_string());
        m.push(':');
        m.push_str(lock);
    }
    m
}

/// The lock names of a set's member's tail (`"<length>:<name>"` each); `None` if malformed.
pub(crate) fn set_locks(mut text: &str) -> Option<Vec<&str>> {
    let mut locks = Vec::new();
    while !text.is_empty() {
        let (len, rest) = text.split_once(':')?;
        let len: usize = len.parse().ok()?;
        let name = rest.get(..len)?;
        locks.push(name);
        text = &rest[len..];
    }
    (!locks.is_empty()).then_some(locks)
}

/// The separator between a lock's Redis name and a process id in its grant channels.
const CHANNEL_SEPARATOR: &str = ":w:";

/// The channel on which the waiters of process `pid` receive grants for the lock `lock`.
pub(crate) fn channel(lock: &str, pid: &str) -> String {
    format!("{lock}{CHANNEL_SEPARATOR}{pid}")
}

/// The lock's Redis name in a grant channel of process `pid` (the inverse of [`channel`]).
pub(crate) fn lock_of_channel<'a>(channel: &'a str, pid: &str) -> Option<&'a str> {
    channel.strip_suffix(pid)?.strip_suffix(CHANNEL_SEPARATOR)
}

/// A message on a grant channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    /// The lock is `token`'s: `"g2 <fence> <px ms> <grant time us> <token>"`; or every key of a
    /// set is: `"m4 <px ms> <grant time us> <fence>,<fence>,... <member>"` (the set's member,
    /// whose token and lock names it gives: `set`).
    Grant {
        grant: Grant,
        token: &'a str,
        set: Option<&'a str>,
    },
    /// `token` is one of the lock's watchers: its holder's lease ends in `px` (0: the lock is
    /// free, look now) from Redis time `at_us`: `"w3 <px ms> <time us> <token>"`. (Format 2,
    /// `"w2 <px ms> <token>"`, did not say when: `at_us` is `None`, and a waiter that reads it
    /// late looks late.)
    Watch {
        px: Duration,
        at_us: Option<u64>,
        token: &'a str,
    },
    /// A queue scan dropped this process's waiters (a short grant to it lapsed: it was judged
    /// frozen or gone): they look again, and queue again. `"d2"`.
    Dropped,
}

/// What a grant gave: the fence of the new hold, the lease Redis set, and when (Redis' clock).
/// `lease` is `None` for a grant of an older version, which did not say (its waiter confirms
/// the grant before using it). A set's grant: `fence` is its first key's, `others` the other
/// keys' in order (empty for one key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) fence: u64,
    pub(crate) lease: Option<Lease>,
    pub(crate) others: Vec<u64>,
}

impl Grant {
    /// A grant of `px_ms` from Redis time `at_us`, with `fence` (and a set's `others`).
    fn leased(fence: u64, px_ms: u64, at_us: u64, others: Vec<u64>) -> Grant {
        Grant {
            fence,
            lease: Some(Lease {
                px: Duration::from_millis(px_ms),
                at_us,
            }),
            others,
        }
    }

    /// The fences of every key it grants, in order.
    pub(crate) fn fences(&self) -> impl Iterator<Item = u64> + '_ {
        std::iter::once(self.fence).chain(self.others.iter().copied())
    }
}

/// A lease as Redis set it: `px` from Redis time `at_us` (microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lease {
    pub(crate) px: Duration,
    pub(crate) at_us: u64,
}

impl<'a> Message<'a> {
    /// Parses a message; `None` for anything else (a malformed or unknown one is ignored).
    pub(crate) fn parse(text: &'a str) -> Option<Message<'a>> {
        if text == "d2" {
            return Some(Message::Dropped);
        }
        let (tag, rest) = text.split_once(' ')?;
        match tag {
            "g2" => {
                let mut p = rest.splitn(4, ' ');
                let fence = p.next()?.parse().ok()?;
                let px = p.next()?.parse().ok()?;
                let at_us = p.next()?.parse().ok()?;
                let token = p.next()?;
                Some(Message::Grant {
                    grant: Grant::leased(fence, px, at_us, Vec::new()),
                    token,
                    set: None,
                })
            }
            "m4" => {
                let mut p = rest.splitn(4, ' ');
                let px = p.next()?.parse().ok()?;
                let at_us = p.next()?.parse().ok()?;
                let mut fences = p.next()?.split(',').map(str::parse::<u64>);
                let fence = fences.next()?.ok()?;
                let others = fences.collect::<Result<Vec<u64>, _>>().ok()?;
                // The member: "<pid> <ttl>* <token> <locks>".
                let member = p.next()?;
                let (_, rest) = member.split_once("* ")?;
                let (token, locks) = rest.split_once(' ')?;
                if set_locks(locks)?.len() != others.len() + 1 {
                    return None;
                }
                Some(Message::Grant {
                    grant: Grant::leased(fence, px, at_us, others),
                    token,
                    set: Some(locks),
                })
            }
            // Format 1 (milestone 2): "g <fence> <token>", with a PX it did not say.
            "g" => {
                let (fence, token) = rest.split_once(' ')?;
                Some(Message::Grant {
                    grant: Grant {
                        fence: fence.parse().ok()?,
                        lease: None,
                        others: Vec::new(),
                    },
                    token,
                    set: None,
                })
            }
            "w3" => {
                let mut p = rest.splitn(3, ' ');
                let px = p.next()?.parse().ok()?;
                let at_us = p.next()?.parse().ok()?;
                let token = p.next()?;
                Some(Message::Watch {
                    px: Duration::from_millis(px),
                    at_us: Some(at_us),
                    token,
                })
            }
            "w2" => {
                let (px, token) = rest.split_once(' ')?;
                Some(Message::Watch {
                    px: Duration::from_millis(px.parse().ok()?),
                    at_us: None,
                    token,
                })
            }
            _ => None,
        }
    }
}

/// The flag argument of a script (and the fence argument it comes with): for leave, what a
/// departing waiter does with a hold of its token; for status, the operators' view; for a
/// queueing attempt, whether the queue's length is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flag {
    /// Leave: give back whatever the token holds (a departing or cancelled wait: any hold of its
    /// token was made by this wait).
    GiveBack,
    /// Leave: give back only the grant with this fence (a grant that reached a process whose
    /// waiter had gone; a newer grant to the same token is kept).
    Orphan(u64),
    /// Status: the operators' view, with the holder's token and the first this many waiters.
    Listing(u32),
    /// Acquire (queueing): count the queue's length for the reply (one `ZCARD`), which only the
    /// queue-depth metric reads.
    Depth,
}

impl Flag {
    /// The flag and fence arguments of `leave.lua`, `status.lua` and a queueing attempt.
    pub(crate) fn args(self) -> (&'static str, String) {
        match self {
            Flag::GiveBack => ("G", String::new()),
            Flag::Orphan(fence) => ("o", fence.to_string()),
            Flag::Listing(n) => ("w", n.to_string()),
            Flag::Depth => ("d", String::new()),
        }
    }
}

/// Reply codes, per script (the first element of every reply).
pub(crate) mod reply {
    /// acquire: taken.
    pub(crate) const ACQUIRED: i64 = 0;
    /// acquire: this token holds it already.
    pub(crate) const HELD_BY_CALLER: i64 = 1;
    /// acquire: another token holds it (the caller may be queued now).
    pub(crate) const HELD: i64 = 2;
    /// acquire, extend: a short grant to this token, confirmed by this call.
    pub(crate) const GRANT_CONFIRMED: i64 = 3;
    /// acquire, release, leave: departed waiters dropped and more to look at; the lock is the
    /// caller's (for the claim window) only to pass on: call release again.
    pub(crate) const CONTINUE: i64 = 4;
    /// release: not held by the token, nothing changed. extend: not held. leave: nothing given
    /// back.
    pub(crate) const NOT_HELD: i64 = 0;
    /// release: deleted (nobody waited). extend: extended (with the fence).
    pub(crate) const DONE: i64 = 1;
    /// release, leave: handed to a waiter (or, leave, given back).
    pub(crate) const HANDED_OVER: i64 = 2;
    /// acquire (permits): the key has another number of permits while in use (with it).
    pub(crate) const OTHER_LIMIT: i64 = 5;
    /// refresh (batched): this lock was left untouched; refresh it with extend alone.
    pub(crate) const ALONE: i64 = 6;
    /// take a set: a key of the set holds another type of value (nothing written).
    pub(crate) const WRONG_TYPE: i64 = 7;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_round_trip() {
        let ch = channel("{waitlock:a:w:b}", "0123abcd4567");
        assert_eq!(ch, "{waitlock:a:w:b}:w:0123abcd4567");
        assert_eq!(
            lock_of_channel(&ch, "0123abcd4567"),
            Some("{waitlock:a:w:b}")
        );
        assert_eq!(lock_of_channel(&ch, "ffff"), None);
        assert_eq!(member("ab", 30_000, "t o k"), "ab 30000 t o k");
    }

    #[test]
    fn messages_parse_or_are_ignored() {
        assert_eq!(
            Message::parse("g2 17 500 1700000000000001 tok en"),
            Some(Message::Grant {
                grant: Grant {
                    fence: 17,
                    lease: Some(Lease {
                        px: Duration::from_millis(500),
                        at_us: 1_700_000_000_000_001
                    }),
                    others: Vec::new(),
                },
                token: "tok en",
                set: None,
            })
        );
        assert_eq!(
            Message::parse("g 9 t"),
            Some(Message::Grant {
                grant: Grant {
                    fence: 9,
                    lease: None,
                    others: Vec::new(),
                },
                token: "t",
                set: None,
            })
        );
        let member = set_member("ab", 300, "ab/t", ["{w:a}", "{w:b b}"].into_iter());
        assert_eq!(member, "ab 300* ab/t 5:{w:a}7:{w:b b}");
        assert_eq!(
            Message::parse(&format!("m4 500 1700000000000001 7,9 {member}")),
            Some(Message::Grant {
                grant: Grant {
                    fence: 7,
                    lease: Some(Lease {
                        px: Duration::from_millis(500),
                        at_us: 1_700_000_000_000_001
                    }),
                    others: vec![9],
                },
                token: "ab/t",
                set: Some("5:{w:a}7:{w:b b}"),
            })
        );
        assert_eq!(
            set_locks("5:{w:a}7:{w:b b}"),
            Some(vec!["{w:a}", "{w:b b}"])
        );
        for bad in ["", "5:{w:a", "x:{w:a}", "5{w:a}"] {
            assert_eq!(set_locks(bad), None, "{bad:?}");
        }
        assert_eq!(
            Message::parse("w3 250 1700000000000001 t o"),
            Some(Message::Watch {
                px: Duration::from_millis(250),
                at_us: Some(1_700_000_000_000_001),
                token: "t o"
            })
        );
        assert_eq!(
            Message::parse("w2 250 t"),
            Some(Message::Watch {
                px: Duration::from_millis(250),
                at_us: None,
                token: "t"
            })
        );
        assert_eq!(Message::parse("d2"), Some(Message::Dropped));
        for bad in [
            "",
            "d2 x",
            "g2",
            "g2 x 1 2 t",
            "g2 1 2 t",
            "w2 t",
            "w3 250 t",
            "z9 1 t",
            "g x t",
            "m4 500 1 7 ab 300 t 5:{w:a}",
            "m4 500 1 7,9 ab 300* t 5:{w:a}",
            "m4 500 1 7,x ab 300* t 5:{w:a}7:{w:b b}",
        ] {
            assert_eq!(Message::parse(bad), None, "{bad:?}");
        }
    }
}
