//! The Lua scripts driven directly, one state transition per row, against a private
//! `redis-server`: each row sets the lock's Redis keys up by hand, runs one script with the
//! arguments the library sends, and checks the reply, the keys afterwards and the messages
//! published on the grant channels. The formats are those of `src/redis/protocol.rs` and the
//! header of `src/redis/lua/common.lua`.

mod common;

use common::{fence_key, lock_key, procs_key, queue_key, RedisServer};
use std::time::Duration;
use waitlock::fred::prelude::*;
use waitlock::fred::types::CustomCommand;
use waitlock::scripts;

// The names of the lock on key "k", as constants for the tables below (checked against the
// shared helpers by `the_table_names_are_the_librarys`).
const L: &str = "{waitlock:k}";
const F: &str = "{waitlock:k}:fence";
const Q: &str = "{waitlock:k}:q";
const P: &str = "{waitlock:k}:p";
/// Two processes that listen on their grant channels, and one that does not.
const LIVE: &str = "aaaaaaaaaaaa";
const LIVE2: &str = "bbbbbbbbbbbb";
const DEAD: &str = "dddddddddddd";

/// One script call's arguments, as the library sends them.
#[derive(Clone, Copy)]
struct Args {
    token: &'static str,
    ttl: u64,
    member: &'static str,
    hub: &'static str,
    flag: &'static str,
    fence: &'static str,
}

const fn args(token: &'static str) -> Args {
    Args {
        token,
        ttl: 10_000,
        member: "",
        hub: "",
        flag: "",
        fence: "",
    }
}

/// What a row expects after its call.
enum Check {
    /// The value of a key (`None`: absent).
    Get(&'static str, Option<&'static str>),
    /// The fence counter holds a fence from Redis' clock (microseconds, at least the row's
    /// start), followed by these hints.
    FenceNow(&'static str),
    /// The lock's PTTL in ms is within this range.
    Pttl(u64, u64),
    /// The queue holds exactly these members, in order.
    Queue(&'static [&'static str]),
    /// A process's record in `{pk}:p` (`None`: absent; `Some("now")`: a recent time).
    Process(&'static str, Option<&'static str>),
    /// Messages published on the listeners' grant channels, in order, by prefix
    /// (`"<hub>: <text>"`).
    Messages(&'static [&'static str]),
    /// The member a watcher field (`!w1`, `!w2`) of `{pk}:p` names (`None`: no watcher).
    Watcher(&'static str, Option<&'static str>),
    /// The fence counter's PTTL in ms is within this range.
    FencePttl(u64, u64),
    /// A key's PTTL in ms is within this range.
    Ttl(&'static str, u64, u64),
}

struct Row {
    name: &'static str,
    /// Commands run before the call; `{now}` is Redis' clock in ms, `{old}` ten seconds ago,
    /// `{soon}` in five seconds, `{future}` in ten minutes (a record made before Redis' clock
    /// stepped back),
    /// `{queue:N}` adds N waiters of the dead process at the head.
    setup: &'static [&'static str],
    script: &'static str,
    call: Args,
    /// The reply; `_` matches any number at that place.
    reply: &'static str,
    checks: &'static [Check],
}

const M_LIVE: &str = "aaaaaaaaaaaa 20000 w1";
const M_LIVE_B: &str = "aaaaaaaaaaaa 20000 w2";
const M_LIVE2: &str = "bbbbbbbbbbbb 30000 x1";
const M_DEAD: &str = "dddddddddddd 20000 z1";

fn rows() -> Vec<Row> {
    use Check::*;
    vec![
        Row {
            name: "acquire a free key, nobody queued: p, a fence, 4 commands",
            setup: &[],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[0, 10000, _]",
            checks: &[Get(L, Some("pT")), Pttl(9_900, 10_000), Queue(&[])],
        },
        Row {
            name: "acquire by the holder: held by the caller",
            setup: &["SET {L} pT PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[1, _, _]",
            checks: &[Get(L, Some("pT")), Pttl(4_000, 5_000)],
        },
        Row {
            name: "acquire a held key without queueing: held, nothing changes",
            setup: &["SET {L} pH PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, _, 0]",
            checks: &[Get(L, Some("pH")), Queue(&[])],
        },
        Row {
            name: "acquire a key held with waiters queued, without queueing: held, behind the queue",
            setup: &["SET {L} qH PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, _, 0, 1]",
            checks: &[Get(L, Some("qH")), Queue(&[])],
        },
        Row {
            name: "acquire a held key with a member: queued, p becomes q, the process recorded",
            setup: &["SET {L} pH PX 5000", "SET {F} 100 PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[
                Get(L, Some("qH")),
                Queue(&[M_LIVE]),
                Get(F, Some("100 q")),
                Process(LIVE, Some("now")),
            ],
        },
        Row {
            name: "queue of a process nobody listens for: queued, listening 0",
            setup: &["SET {L} qH PX 5000", "SET {F} 100_q PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_DEAD,
                hub: DEAD,
                ..args("z1")
            },
            reply: "[2, _, 1, 0, 100, 1, _, _]",
            checks: &[Queue(&[M_DEAD])],
        },
        Row {
            name: "release by the holder, nobody queued: deleted (3 commands)",
            setup: &["SET {L} pT PX 5000"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[1]",
            checks: &[Get(L, None)],
        },
        Row {
            name: "release by another token: not held, nothing changes",
            setup: &["SET {L} qH PX 5000"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[Get(L, Some("qH"))],
        },
        Row {
            name: "release to a fresh process: its full TTL, state q, the grant and a watch",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Pttl(19_900, 20_000),
                Queue(&[M_LIVE2]),
                FenceNow(" q"),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 20000 "]),
            ],
        },
        Row {
            name: "a busy queue keeps its watchers: a grant sends no watch message",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 3 aaaaaaaaaaaa_20000_w2",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} !w1 {soon}_bbbbbbbbbbbb_30000_x1",
                "HSET {P} !w2 {soon}_aaaaaaaaaaaa_20000_w2",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[Get(L, Some("hw1")), Messages(&["aaaaaaaaaaaa: g2 "])],
        },
        Row {
            name: "a watcher that would look after a shorter lease ends is told again",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {old}",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} !w1 {soon}_bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 500 "]),
            ],
        },
        Row {
            name: "release to a stale process: a short grant (g, the claim window), pending in the fence",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {old}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Pttl(400, 500),
                FenceNow(" q aaaaaaaaaaaa"),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 500 "]),
            ],
        },
        Row {
            name: "release skips a dead process's waiters (dropped) and grants the live one",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
                "ZADD {Q} 2 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[Get(L, Some("hw1")), Queue(&[]), Messages(&["aaaaaaaaaaaa: g2 "])],
        },
        Row {
            name: "release with only dead waiters: deleted, hints and process records gone",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
                "HSET {P} dddddddddddd {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[1]",
            checks: &[
                Get(L, None),
                Queue(&[]),
                Get(F, Some("100")),
                Process(DEAD, None),
            ],
        },
        Row {
            name: "release behind more than 200 dead waiters: continue, the lock stays the caller's",
            setup: &["SET {L} qH PX 5000", "SET {F} 100_q PX 60000", "{queue:250}"],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[4]",
            checks: &[Get(L, Some("qH")), Pttl(400, 500), Get(F, Some("100 q"))],
        },
        Row {
            name: "acquire a free key whose queue holds a fresh waiter: granted to it, not taken",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, 20000, 0, 1]",
            checks: &[Get(L, Some("hw1")), Messages(&["aaaaaaaaaaaa: g2 "])],
        },
        Row {
            name: "acquire by the queue's head itself: taken, out of the queue, the watchers chosen again",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[0, 20000, _]",
            checks: &[
                Get(L, Some("qw1")),
                Queue(&[M_LIVE2]),
                Messages(&["bbbbbbbbbbbb: w3 20000 "]),
                Watcher("!w1", Some(M_LIVE2)),
            ],
        },
        Row {
            name: "a short grant lapsed: its process is marked x, its waiters skipped and told (d2)",
            setup: &[
                "SET {F} 100_q_aaaaaaaaaaaa PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w2",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, 30000, 0, 1]",
            checks: &[
                Get(L, Some("hx1")),
                Queue(&[]),
                Process(LIVE, Some("x")),
                Process("!h", Some(LIVE2)),
                Messages(&["aaaaaaaaaaaa: d2", "bbbbbbbbbbbb: g2 "]),
            ],
        },
        Row {
            name: "a lapsed process that calls again is seen again",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "HSET {P} aaaaaaaaaaaa x",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE_B,
                hub: LIVE,
                ..args("w2")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[Process(LIVE, Some("now")), Queue(&[M_LIVE_B])],
        },
        Row {
            name: "acquire by the holder of a short grant (its message was lost): confirmed",
            setup: &["SET {L} gw1 PX 500", "SET {F} 100_q_aaaaaaaaaaaa PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[3, 20000, 100]",
            checks: &[Get(L, Some("qw1")), Pttl(19_900, 20_000), Get(F, Some("100 q"))],
        },
        Row {
            name: "extend a short grant: confirmed, the fence of the hold",
            setup: &["SET {L} gw1 PX 500", "SET {F} 100_q_aaaaaaaaaaaa PX 60000"],
            script: scripts::EXTEND,
            call: Args {
                hub: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[3, 100]",
            checks: &[Get(L, Some("qw1")), Pttl(19_900, 20_000), Get(F, Some("100 q"))],
        },
        Row {
            name: "a refresh tells the lock's watchers when the lease now ends (no calls from them)",
            setup: &[
                "SET {L} qT PX 500",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} !w1 {soon}_bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, 100]",
            checks: &[
                Pttl(9_900, 10_000),
                Messages(&["bbbbbbbbbbbb: w3 10000 "]),
            ],
        },
        Row {
            name: "extend a confirmed hold: the TTL again, and the fence of the hold",
            setup: &["SET {L} pT PX 500", "SET {F} 100 PX 500"],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, 100]",
            checks: &[Get(L, Some("pT")), Pttl(9_900, 10_000), FencePttl(3_609_000, 3_610_000)],
        },
        Row {
            name: "extend by another token: not held",
            setup: &["SET {L} pH PX 500"],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[0]",
            checks: &[Pttl(1, 500)],
        },
        Row {
            name: "extend with the fence key gone: a fence from Redis' clock, never 0",
            setup: &["SET {L} gw1 PX 500"],
            script: scripts::EXTEND,
            call: args("w1"),
            reply: "[3, _]",
            checks: &[FenceNow(""), Get(L, Some("qw1"))],
        },
        Row {
            name: "leave G: out of the queue, the grant given back (handed on)",
            setup: &[
                "SET {L} qw1 PX 20000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::LEAVE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                flag: "G",
                ..args("w1")
            },
            reply: "[2]",
            checks: &[Get(L, Some("hx1")), Messages(&["bbbbbbbbbbbb: g2 "])],
        },
        Row {
            name: "leave o with another fence: a newer grant to the same token is kept",
            setup: &["SET {L} hw1 PX 20000", "SET {F} 200_q PX 60000"],
            script: scripts::LEAVE,
            call: Args {
                flag: "o",
                fence: "100",
                ..args("w1")
            },
            reply: "[0]",
            checks: &[Get(L, Some("hw1"))],
        },
        Row {
            name: "leave o of a grant its waiter claimed by its own call: kept",
            setup: &["SET {L} qw1 PX 20000", "SET {F} 100_q PX 60000"],
            script: scripts::LEAVE,
            call: Args {
                flag: "o",
                fence: "100",
                ..args("w1")
            },
            reply: "[0]",
            checks: &[Get(L, Some("qw1"))],
        },
        Row {
            name: "acquire by the holder of an unclaimed full grant (its message lost): claimed",
            setup: &["SET {L} hw1 PX 20000", "SET {F} 100_q PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ttl: 20_000,
                ..args("w1")
            },
            reply: "[1, _, 100]",
            checks: &[Get(L, Some("qw1")), Pttl(19_000, 20_000)],
        },
        Row {
            name: "leave o with the grant's fence: given back",
            setup: &["SET {L} hw1 PX 20000", "SET {F} 100_q PX 60000"],
            script: scripts::LEAVE,
            call: Args {
                flag: "o",
                fence: "100",
                ..args("w1")
            },
            reply: "[2]",
            checks: &[Get(L, None), Get(F, Some("100"))],
        },
        Row {
            name: "a waiter leaves: the lock keeps two watchers (one appointed and told)",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::LEAVE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                flag: "G",
                ..args("w1")
            },
            reply: "[0]",
            checks: &[Queue(&[M_LIVE2]), Messages(&["bbbbbbbbbbbb: w3 "])],
        },
        Row {
            name: "a lapsed process nobody listens for is not told",
            setup: &[
                "SET {F} 100_q_dddddddddddd PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} dddddddddddd {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[2, 30000, 0, 1]",
            checks: &[Process(DEAD, Some("x")), Messages(&["bbbbbbbbbbbb: g2 "])],
        },
        Row {
            name: "watchers stay in two processes: a second waiter of the watcher's process is not one",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} !w1 {soon}_aaaaaaaaaaaa_20000_w1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE_B,
                hub: LIVE,
                ..args("w2")
            },
            reply: "[2, _, 1, 1, 100, 0, _, _]",
            checks: &[Watcher("!w2", None), Queue(&[M_LIVE, M_LIVE_B])],
        },
        Row {
            name: "a waiter of another process takes the free watcher field",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} !w1 {soon}_aaaaaaaaaaaa_20000_w1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE2,
                hub: LIVE2,
                ..args("x1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[Watcher("!w2", Some(M_LIVE2))],
        },
        Row {
            name: "a newcomer replaces a watcher of the holder's process (it would fail with it)",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 dddddddddddd_20000_z1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} dddddddddddd {now}",
                "HSET {P} !h aaaaaaaaaaaa",
                "HSET {P} !w1 {soon}_aaaaaaaaaaaa_20000_w1",
                "HSET {P} !w2 {soon}_dddddddddddd_20000_z1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE2,
                hub: LIVE2,
                ..args("x1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, _]",
            checks: &[
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_DEAD)),
            ],
        },
        Row {
            name: "the first waiter behind a lock taken free records the holder's process from its token",
            setup: &["SET {L} pdddddddddddd/T PX 5000", "SET {F} 100 PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 1]",
            checks: &[
                Get(L, Some("qdddddddddddd/T")),
                Process("!h", Some(DEAD)),
                Watcher("!w1", Some(M_LIVE)),
            ],
        },
        Row {
            name: "a lock taken free by a token without a process: the holder stays unknown",
            setup: &["SET {L} pT PX 5000", "SET {F} 100 PX 60000"],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, 1, _, 1]",
            checks: &[Process("!h", None)],
        },
        Row {
            name: "a refresh takes watchers outside the holder's process first, then from it",
            setup: &[
                "SET {L} qT PX 500",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::EXTEND,
            call: Args {
                hub: LIVE,
                ..args("T")
            },
            reply: "[1, 100]",
            checks: &[
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE)),
                Messages(&["bbbbbbbbbbbb: w3 10000 ", "aaaaaaaaaaaa: w3 10000 "]),
            ],
        },
        Row {
            name: "a queued attempt that takes a free lock records its process as the holder's",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[0, 10000, _]",
            checks: &[
                Get(L, Some("qw1")),
                Queue(&[M_LIVE2]),
                Process("!h", Some(LIVE)),
            ],
        },
        Row {
            name: "a release after the lease ran out, waiters queued: served anyway, not held",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {now}",
            ],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[
                Get(L, Some("hw1")),
                Queue(&[]),
                Messages(&["aaaaaaaaaaaa: g2 "]),
            ],
        },
        Row {
            name: "a release after the lease ran out, only dead waiters: all cleared, not held",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 dddddddddddd_20000_z1",
            ],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[Get(L, None), Queue(&[]), Get(F, Some("100"))],
        },
        Row {
            name: "a release after the lease ran out behind 200 dead waiters: continue, not held",
            setup: &["SET {F} 100_q PX 60000", "{queue:201}"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0, 4]",
            checks: &[Get(L, Some("qT")), Pttl(1, 500)],
        },
        Row {
            name: "a release onto a free lock nobody waits for: not held, nothing changes",
            setup: &["SET {F} 100 PX 60000"],
            script: scripts::RELEASE,
            call: args("T"),
            reply: "[0]",
            checks: &[Get(L, None), Get(F, Some("100"))],
        },
        // Found by the widened model (R5): with one other process waiting, the second watcher
        // comes from the holder's own process (a holder that overstays without a fault, and
        // the other process frozen, left its own process's waiters asleep).
        Row {
            name: "a grant with one other process waiting: the second watcher from the holder's process",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "ZADD {Q} 3 aaaaaaaaaaaa_20000_w2",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", Some(M_LIVE_B)),
                Messages(&[
                    "aaaaaaaaaaaa: g2 ",
                    "bbbbbbbbbbbb: w3 20000 ",
                    "aaaaaaaaaaaa: w3 20000 ",
                ]),
            ],
        },
        // Review 2, finding 2: a waiter that took the free lock as the oldest live waiter
        // (serve's 'self') left a watcher field naming itself, the holder.
        Row {
            name: "a waiter taking the free lock as the oldest live waiter chooses the watchers again",
            setup: &[
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {now}",
                "HSET {P} bbbbbbbbbbbb {old}",
                "HSET {P} !w1 {now}_aaaaaaaaaaaa_20000_w1",
                "HSET {P} !w2 {now}_bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[0, 10000, _]",
            checks: &[
                Get(L, Some("qw1")),
                Queue(&[M_LIVE2]),
                Watcher("!w1", Some(M_LIVE2)),
                Watcher("!w2", None),
                Process("!h", Some(LIVE)),
            ],
        },
        // Review 2, finding 3: the queue's TTL was set only when a new member was added.
        Row {
            name: "a waiter queueing again renews the queue and the processes hash",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "PEXPIRE {Q} 1000",
                "HSET {P} aaaaaaaaaaaa {old}",
                "PEXPIRE {P} 1000",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, _, _, 1]",
            checks: &[
                Queue(&[M_LIVE]),
                Ttl(Q, 3_604_000, 3_605_000),
                Ttl(P, 3_604_000, 3_605_000),
            ],
        },
        Row {
            name: "a refresh with waiters queued: queue, processes and fence live the lease and the retention",
            setup: &[
                "SET {L} qT PX 500",
                "SET {F} 100_q PX 500",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "PEXPIRE {Q} 500",
                "HSET {P} bbbbbbbbbbbb {now}",
                "PEXPIRE {P} 500",
            ],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, 100]",
            checks: &[
                Pttl(9_900, 10_000),
                Ttl(Q, 3_609_000, 3_610_000),
                Ttl(P, 3_609_000, 3_610_000),
                FencePttl(3_609_000, 3_610_000),
            ],
        },
        Row {
            name: "a grant with waiters left: the queue lives the grant's lease and the retention",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 500",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "PEXPIRE {Q} 1000",
                "HSET {P} aaaaaaaaaaaa {now}",
                "PEXPIRE {P} 1000",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("hw1")),
                Ttl(Q, 3_619_000, 3_620_000),
                Ttl(P, 3_619_000, 3_620_000),
                FencePttl(3_619_000, 3_620_000),
            ],
        },
        // Review 2, finding 4: a record in Redis' future counted as fresh.
        Row {
            name: "a process record in Redis' future is not fresh: a short grant",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_20000_w1",
                "HSET {P} aaaaaaaaaaaa {future}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Pttl(1, 500),
                Messages(&["aaaaaaaaaaaa: g2 "]),
            ],
        },
        // Review 2, section 7: FIFO under a backward step of Redis' clock.
        Row {
            name: "a newcomer queues behind a waiter whose score is in Redis' future",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 5000000000000000 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, _, _, 2]",
            checks: &[Queue(&[M_LIVE2, M_LIVE])],
        },
        // Review 2, section 7: fence 0 from `{1}` after the counter expired.
        Row {
            name: "acquire by the holder after its fence counter vanished: a fence from Redis' clock",
            setup: &["SET {L} qT PX 5000"],
            script: scripts::ACQUIRE,
            call: args("T"),
            reply: "[1, _, _]",
            checks: &[Get(L, Some("qT")), FenceNow(" q")],
        },
        Row {
            name: "extend after the fence counter vanished: a fence from Redis' clock",
            setup: &["SET {L} pT PX 500"],
            script: scripts::EXTEND,
            call: args("T"),
            reply: "[1, _]",
            checks: &[FenceNow(""), FencePttl(3_609_000, 3_610_000)],
        },
        // Review 2, section 7: the processes hash grew by one field per process that ever
        // called, on a key that never drains.
        Row {
            name: "a new process's record sweeps the records that say nothing",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 bbbbbbbbbbbb_30000_x1",
                "HSET {P} bbbbbbbbbbbb {now}",
                "HSET {P} eeeeeeeeeeee {old}",
                "HSET {P} ffffffffffff {old}",
                "HSET {P} cccccccccccc {future}",
                "HSET {P} dddddddddddd x",
            ],
            script: scripts::ACQUIRE,
            call: Args {
                member: M_LIVE,
                hub: LIVE,
                ..args("w1")
            },
            reply: "[2, _, 1, 1, 100, _, _, 2]",
            checks: &[
                Process("eeeeeeeeeeee", None),
                Process("ffffffffffff", None),
                Process("cccccccccccc", None),
                Process(DEAD, None),
                Process(LIVE2, Some("now")),
                Process(LIVE, Some("now")),
            ],
        },
        // The first review's finding 14: a short grant as long as its waiter's TTL was used
        // without a confirmation, and its pending hint stayed.
        Row {
            name: "a short grant to a waiter whose TTL is within the claim window: half of it, so it confirms",
            setup: &[
                "SET {L} qH PX 5000",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 1 aaaaaaaaaaaa_400_w1",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
                "HSET {P} aaaaaaaaaaaa {old}",
            ],
            script: scripts::RELEASE,
            call: args("H"),
            reply: "[2]",
            checks: &[
                Get(L, Some("gw1")),
                Pttl(1, 200),
                FenceNow(" q aaaaaaaaaaaa"),
                Messages(&["aaaaaaaaaaaa: g2 ", "bbbbbbbbbbbb: w3 200 "]),
            ],
        },
        Row {
            name: "status: held by a short grant, its fence and queue",
            setup: &[
                "SET {L} gw1 PX 500",
                "SET {F} 100_q PX 60000",
                "ZADD {Q} 2 bbbbbbbbbbbb_30000_x1",
            ],
            script: scripts::STATUS,
            call: args("-"),
            reply: "[2, _, 100, 1]",
            checks: &[],
        },
    ]
}

/// Replaces the placeholders of a setup command and splits it into words (`_` inside a word
/// stands for a space: queue members hold spaces).
fn words(cmd: &str, now_ms: u64) -> Vec<String> {
    cmd.replace("{L}", L)
        .replace("{F}", F)
        .replace("{Q}", Q)
        .replace("{P}", P)
        .replace("{now}", &now_ms.to_string())
        .replace("{old}", &(now_ms - 10_000).to_string())
        .replace("{soon}", &(now_ms + 5_000).to_string())
        .replace("{future}", &(now_ms + 600_000).to_string())
        .split(' ')
        .map(|w| w.replace('_', " "))
        .collect()
}

async fn run(c: &Client, words: Vec<String>) -> Value {
    let (head, rest) = words.split_first().expect("a command");
    c.custom(
        CustomCommand::new(head.clone(), None::<u16>, false),
        rest.to_vec(),
    )
    .await
    .unwrap_or_else(|e| panic!("{words:?}: {e}"))
}

fn matches(reply: &[i64], expected: &str) -> bool {
    let want: Vec<&str> = expected
        .trim_matches(['[', ']'])
        .split(", ")
        .filter(|w| !w.is_empty())
        .collect();
    want.len() == reply.len()
        && want
            .iter()
            .zip(reply)
            .all(|(w, r)| *w == "_" || w.parse::<i64>() == Ok(*r))
}

#[tokio::test]
async fn every_transition_of_every_script() {
    let server = RedisServer::start();
    let c = server.client().await;
    // Two processes listen on their grant channels (sharded, as the lockers do).
    let sub = waitlock::fred::clients::SubscriberClient::new(
        Config::from_url(&server.url()).expect("url"),
        None,
        None,
        None,
    );
    sub.init().await.expect("subscriber");
    let mut messages = sub.message_rx();
    for hub in [LIVE, LIVE2] {
        sub.ssubscribe(format!("{L}:w:{hub}"))
            .await
            .expect("ssubscribe");
    }
    for row in rows() {
        let _: Value = run(&c, vec!["FLUSHALL".into()]).await;
        let time: Vec<String> = c
            .custom(
                CustomCommand::new_static("TIME", None, false),
                Vec::<String>::new(),
            )
            .await
            .expect("TIME");
        let now_ms = time[0].parse::<u64>().expect("secs") * 1000
            + time[1].parse::<u64>().expect("us") / 1000;
        for cmd in row.setup {
            if let Some(n) = cmd.strip_prefix("{queue:") {
                let n: usize = n.trim_end_matches('}').parse().expect("count");
                for i in 0..n {
                    let _: Value = run(
                        &c,
                        vec![
                            "ZADD".into(),
                            Q.into(),
                            i.to_string(),
                            format!("{DEAD} 20000 dead{i}"),
                        ],
                    )
                    .await;
                }
                continue;
            }
            let _: Value = run(&c, words(cmd, now_ms)).await;
        }
        while messages.try_recv().is_ok() {}
        let a = row.call;
        let argv: Vec<String> = vec![
            a.token.into(),
            a.ttl.to_string(),
            "3600000".into(),
            "500".into(),
            "100".into(),
            a.member.into(),
            a.hub.into(),
            a.flag.into(),
            a.fence.into(),
        ];
        let reply: Vec<i64> = c
            .eval(row.script, vec![L, F, Q, P], argv)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", row.name));
        assert!(
            matches(&reply, row.reply),
            "{}: reply {reply:?}, expected {}",
            row.name,
            row.reply
        );
        // A PING on the subscriber comes back after every message published before it.
        let _: Value = sub.ping(None).await.expect("ping");
        let mut seen = Vec::new();
        while let Ok(m) = messages.try_recv() {
            let hub = m.channel.rsplit(':').next().unwrap_or_default().to_owned();
            seen.push(format!("{hub}: {}", m.value.as_str().unwrap_or_default()));
        }
        for check in row.checks {
            match check {
                Check::Get(key, want) => {
                    let v: Option<String> = c.get(*key).await.expect("GET");
                    assert_eq!(v.as_deref(), *want, "{}: {key}", row.name);
                }
                Check::FenceNow(hints) => {
                    let v: Option<String> = c.get(F).await.expect("GET");
                    let v = v.unwrap_or_default();
                    let (num, rest) = v.split_at(v.find(' ').unwrap_or(v.len()));
                    let f: u64 = num.parse().unwrap_or(0);
                    assert!(
                        f >= now_ms * 1000 && rest == *hints,
                        "{}: fence counter {v:?}, expected Redis' clock (>= {}) and {hints:?}",
                        row.name,
                        now_ms * 1000
                    );
                }
                Check::Pttl(lo, hi) => {
                    let t: i64 = c.pttl(L).await.expect("PTTL");
                    assert!(
                        (*lo as i64..=*hi as i64).contains(&t),
                        "{}: PTTL {t}, not in {lo}..={hi}",
                        row.name
                    );
                }
                Check::Queue(want) => {
                    let q: Vec<String> = c
                        .custom(
                            CustomCommand::new_static("ZRANGE", None, false),
                            vec![Q, "0", "-1"],
                        )
                        .await
                        .expect("ZRANGE");
                    assert_eq!(q, want.to_vec(), "{}: queue", row.name);
                }
                Check::Process(hub, want) => {
                    let v: Option<String> = c
                        .custom(
                            CustomCommand::new_static("HGET", None, false),
                            vec![P, *hub],
                        )
                        .await
                        .expect("HGET");
                    match want {
                        Some("now") => {
                            let t: u64 = v.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
                            assert!(
                                t + 1_000 >= now_ms,
                                "{}: process {hub} recorded at {v:?}, not now ({now_ms})",
                                row.name
                            );
                        }
                        other => assert_eq!(v.as_deref(), *other, "{}: process {hub}", row.name),
                    }
                }
                Check::Watcher(field, want) => {
                    let v: Option<String> = c
                        .custom(
                            CustomCommand::new_static("HGET", None, false),
                            vec![P, *field],
                        )
                        .await
                        .expect("HGET");
                    let member = v.as_deref().and_then(|v| v.split_once(' ')).map(|(_, m)| m);
                    assert_eq!(member, *want, "{}: watcher {field} ({v:?})", row.name);
                }
                Check::FencePttl(lo, hi) => {
                    let t: i64 = c.pttl(F).await.expect("PTTL");
                    assert!(
                        (*lo as i64..=*hi as i64).contains(&t),
                        "{}: fence PTTL {t}, not in {lo}..={hi}",
                        row.name
                    );
                }
                Check::Ttl(key, lo, hi) => {
                    let t: i64 = c.pttl(*key).await.expect("PTTL");
                    assert!(
                        (*lo as i64..=*hi as i64).contains(&t),
                        "{}: {key} PTTL {t}, not in {lo}..={hi}",
                        row.name
                    );
                }
                Check::Messages(want) => {
                    assert_eq!(seen.len(), want.len(), "{}: messages {seen:?}", row.name);
                    for (s, w) in seen.iter().zip(want.iter()) {
                        assert!(
                            s.starts_with(w),
                            "{}: message {s:?}, expected {w:?}",
                            row.name
                        );
                    }
                }
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

/// A key of another type under the fence counter's name: the acquire fails with WRONGTYPE and
/// leaves no lock behind (the lock it had just set is deleted again).
#[tokio::test]
async fn a_foreign_fence_key_leaves_no_lock() {
    let server = RedisServer::start();
    let c = server.client().await;
    let _: Value = run(&c, vec!["RPUSH".into(), F.into(), "x".into()]).await;
    let argv: Vec<String> = ["T", "10000", "3600000", "500", "100", "", "", "", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let e = c
        .eval::<Vec<i64>, _, _, _>(scripts::ACQUIRE, vec![L, F, Q, P], argv)
        .await
        .expect_err("WRONGTYPE");
    assert!(e.details().contains("WRONGTYPE"), "{e}");
    let v: Option<String> = c.get(L).await.expect("GET");
    assert_eq!(v, None, "a lock was left behind");
}

#[test]
fn the_table_names_are_the_librarys() {
    assert_eq!(
        [L, F, Q, P].map(str::to_owned),
        [
            lock_key("k"),
            fence_key("k"),
            queue_key("k"),
            procs_key("k")
        ]
    );
}
