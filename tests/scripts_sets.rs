//! The scripts of a queued wait for several keys at once (issue 32), driven directly against a
//! private `redis-server`: a set's attempt (`set_acquire.lua`), its release (`set_release.lua`)
//! and its departure (`set_leave.lua`), and the one-key scripts (`release.lua`, `acquire.lua`,
//! `extend.lua`) meeting a set's member in a queue. Each test sets the keys up by calls (or by
//! hand), runs the script with the arguments the library sends, and checks the reply, the keys
//! and the messages on the grant channels. The formats are those of `src/redis/protocol.rs` and
//! the headers of `src/redis/lua/queue.lua` and `lock.lua` ("Sets").

mod common;

use common::scripts::{subscriber, LIVE, LIVE2};
use common::{cmd, RedisServer};
use tokio::sync::broadcast::Receiver;
use waitlock::fred::clients::SubscriberClient;
use waitlock::fred::prelude::*;
use waitlock::fred::types::Message;
use waitlock::scripts;

const TTL: u64 = 10_000;
const AB: &[&str] = &["a", "b"];

fn lock(key: &str) -> String {
    format!("{{waitlock:{key}}}")
}

/// A set's member in its keys' queues: `"<pid> <ttl>* <token> <locks>"`.
fn set_member(pid: &str, token: &str, keys: &[&str]) -> String {
    let locks: String = keys
        .iter()
        .map(|k| {
            let l = lock(k);
            format!("{}:{l}", l.len())
        })
        .collect();
    format!("{pid} {TTL}* {token} {locks}")
}

/// A script's `ARGV` beyond its keys, as the library sends it (`ttl` 0: the TTL of these tests).
#[derive(Clone, Copy, Default)]
struct Argv<'a> {
    token: &'a str,
    ttl: u64,
    member: &'a str,
    pid: &'a str,
    flag: &'a str,
    fence: &'a str,
    /// Sent as a Cluster's client sends it (ARGV[10] `cluster`).
    cluster: bool,
}

struct Calls {
    c: Client,
}

impl Calls {
    /// One script call: `keys` the user keys (each gives lock, fence, queue, processes).
    async fn call(&self, script: &'static str, keys: &[&str], a: Argv<'_>) -> Vec<i64> {
        let mut k = Vec::new();
        for key in keys {
            let l = lock(key);
            k.push(l.clone());
            k.push(format!("{l}:fence"));
            k.push(format!("{l}:q"));
            k.push(format!("{l}:p"));
        }
        let ttl = if a.ttl == 0 { TTL } else { a.ttl };
        let argv: Vec<String> = vec![
            a.token.into(),
            ttl.to_string(),
            "3600000".into(),
            "500".into(),
            "100".into(),
            a.member.into(),
            a.pid.into(),
            a.flag.into(),
            a.fence.into(),
        ];
        let mut argv = argv;
        if a.cluster {
            argv.push("cluster".into());
        }
        self.c
            .eval(script, k, argv)
            .await
            .unwrap_or_else(|e| panic!("{keys:?}: {e}"))
    }

    /// The set `token` of process `pid` on `keys` queues (or takes them): its member, the reply.
    async fn set_queue(&self, keys: &[&str], token: &str, pid: &str) -> (String, Vec<i64>) {
        let member = set_member(pid, token, keys);
        let argv = Argv {
            token,
            member: &member,
            pid,
            ..Argv::default()
        };
        let reply = self.call(scripts::SET_ACQUIRE, keys, argv).await;
        (member, reply)
    }

    /// One attempt at the set, no member.
    async fn set_try(&self, keys: &[&str], token: &str) -> Vec<i64> {
        let argv = Argv {
            token,
            ..Argv::default()
        };
        self.call(scripts::SET_ACQUIRE, keys, argv).await
    }

    /// The one-key waiter `token` of process `pid` queues on `key` (or takes it).
    async fn one_queue(&self, key: &str, token: &str, pid: &str) -> (String, Vec<i64>) {
        let member = format!("{pid} {TTL} {token}");
        let argv = Argv {
            token,
            member: &member,
            pid,
            ..Argv::default()
        };
        let reply = self.call(scripts::ACQUIRE, &[key], argv).await;
        (member, reply)
    }

    /// Takes `key` for `token` (free) with acquire.lua.
    async fn take(&self, key: &str, token: &str) {
        let r = self.one_try(key, token).await;
        assert_eq!(r[0], 0, "take {key}: {r:?}");
    }

    /// One attempt at `key` alone (a polling caller's).
    async fn one_try(&self, key: &str, token: &str) -> Vec<i64> {
        let argv = Argv {
            token,
            ..Argv::default()
        };
        self.call(scripts::ACQUIRE, &[key], argv).await
    }

    async fn release(&self, key: &str, token: &str) -> Vec<i64> {
        let argv = Argv {
            token,
            ttl: 1,
            ..Argv::default()
        };
        self.call(scripts::RELEASE, &[key], argv).await
    }

    async fn extend(&self, key: &str, token: &str) -> Vec<i64> {
        let argv = Argv {
            token,
            ..Argv::default()
        };
        self.call(scripts::EXTEND, &[key], argv).await
    }

    async fn set_release(&self, keys: &[&str], token: &str, pid: &str) -> Vec<i64> {
        let argv = Argv {
            token,
            ttl: 1,
            pid,
            ..Argv::default()
        };
        self.call(scripts::SET_RELEASE, keys, argv).await
    }

    /// The set leaves (`member`, unless empty) and gives back by `flag` (`fence`: `o`'s).
    async fn set_leave(&self, keys: &[&str], token: &str, member: &str, a: Argv<'_>) -> Vec<i64> {
        let argv = Argv {
            token,
            ttl: 1,
            member,
            ..a
        };
        self.call(scripts::SET_LEAVE, keys, argv).await
    }

    async fn get(&self, key: &str) -> Option<String> {
        self.c.get(lock(key)).await.expect("GET")
    }

    async fn queue(&self, key: &str) -> Vec<String> {
        cmd(
            &self.c,
            "ZRANGE",
            vec![format!("{}:q", lock(key)).into(), 0.into(), (-1).into()],
        )
        .await
    }

    async fn pttl(&self, key: &str) -> i64 {
        self.c.pttl(lock(key)).await.expect("PTTL")
    }
}

/// A private server, its calls, and a subscriber listening as `LIVE` and `LIVE2` on the grant
/// channels of keys a, b and c (its messages from now on in `rx`).
struct Rig {
    server: RedisServer,
    r: Calls,
    sub: SubscriberClient,
    rx: Receiver<Message>,
}

async fn rig() -> Rig {
    let server = RedisServer::start();
    let c = server.client().await;
    let sub = subscriber(&server).await;
    for key in ["a", "b", "c"] {
        for pid in [LIVE, LIVE2] {
            sub.ssubscribe(format!("{}:w:{pid}", lock(key)))
                .await
                .expect("ssubscribe");
        }
    }
    let rx = sub.message_rx();
    Rig {
        server,
        r: Calls { c },
        sub,
        rx,
    }
}

impl Rig {
    /// The messages published since the last call of this, as `"<channel>: <text>"`.
    async fn messages(&mut self) -> Vec<String> {
        // A PING on the subscriber comes back after every message published before it.
        let _: Value = self.sub.ping(None).await.expect("ping");
        let mut seen = Vec::new();
        while let Ok(m) = self.rx.try_recv() {
            seen.push(format!(
                "{}: {}",
                m.channel,
                m.value.as_str().unwrap_or_default()
            ));
        }
        seen
    }

    /// X holds a, the set S of `LIVE` queues on a and b, X releases a: S is granted. Its member,
    /// and its grant's fences as the message says them.
    async fn granted_to_s(&mut self) -> (String, String) {
        self.r.take("a", "X").await;
        let (m, q) = self.r.set_queue(AB, "S", LIVE).await;
        assert_eq!(q[0], 2, "{q:?}");
        self.messages().await;
        assert_eq!(self.r.release("a", "X").await, vec![2]);
        let seen = self.messages().await;
        assert_eq!(seen.len(), 1, "one message: {seen:?}");
        let fences = seen[0].split(' ').nth(4).expect("fences").to_owned();
        (m, fences)
    }

    /// A process `MORTAL` that listens on the grant channel of `key` until [`Rig::die`] (a
    /// set's waiter whose first key is `key`).
    async fn mortal(&self, key: &str) -> SubscriberClient {
        let sub = subscriber(&self.server).await;
        sub.ssubscribe(format!("{}:w:{MORTAL}", lock(key)))
            .await
            .expect("ssubscribe");
        sub
    }

    /// `MORTAL`'s process dies: Redis counts no listener on its channel of `key` any more.
    async fn die(&self, sub: SubscriberClient, key: &str) {
        sub.quit().await.expect("quit");
        let chan = format!("{}:w:{MORTAL}", lock(key));
        for _ in 0..1000 {
            let n: Vec<Value> =
                cmd(&self.r.c, "PUBSUB SHARDNUMSUB", vec![chan.clone().into()]).await;
            if n.get(1).and_then(Value::as_i64) == Some(0) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("{MORTAL} still listens on {chan}");
    }
}

const MORTAL: &str = "cccccccccccc";

#[tokio::test]
async fn a_free_set_is_taken_at_once_and_released_in_one_call() {
    let rig = rig().await;
    let r = &rig.r;
    let (_, got) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(&got[..2], &[0, TTL as i64], "{got:?}");
    assert_eq!(got.len(), 4);
    assert!(got[2] > 0 && got[3] > 0);
    assert_eq!(r.get("a").await.as_deref(), Some("pS"));
    assert_eq!(r.get("b").await.as_deref(), Some("pS"));
    assert!(r.queue("a").await.is_empty() && r.queue("b").await.is_empty());
    // Sent again: held by the caller, with the same fences.
    let (_, again) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(again[0], 1);
    assert_eq!(&again[2..], &got[2..]);
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![1, 1]);
    assert_eq!(r.get("a").await, None);
    assert_eq!(r.get("b").await, None);
    // Not held any more: nothing.
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![0, 0]);
}

/// A set sent again while it holds every key, one key's fence counter deleted by hand: that
/// counter starts again from Redis' clock (above the fence it gave, never 0), the other
/// key's fence is the one it had.
#[tokio::test]
async fn a_held_sets_fence_counter_deleted_by_hand_starts_again_from_the_clock() {
    let rig = rig().await;
    let r = &rig.r;
    let (_, got) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(got[0], 0, "{got:?}");
    let _: i64 = cmd(&r.c, "DEL", vec![format!("{}:fence", lock("b")).into()]).await;
    let (_, again) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(again[0], 1, "{again:?}");
    assert_eq!(again[2], got[2], "{again:?} after {got:?}");
    assert!(again[3] > got[3], "{again:?} after {got:?}");
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![1, 1]);
}

#[tokio::test]
async fn a_set_queues_once_in_every_queue_holding_nothing_and_is_granted_in_one_message() {
    let mut rig = rig().await;
    let r = &rig.r;
    r.take("a", "X").await;
    // One attempt (no member): held, naming key 1 (a), not queued.
    let once = r.set_try(AB, "S").await;
    assert_eq!((once[0], once[2], once[3]), (2, 0, 1), "{once:?}");
    let (m, q) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!((q[0], q[2], q[3]), (2, 1, 1), "queued, listening: {q:?}");
    assert_eq!(q.len(), 9);
    assert_eq!(q[8], 1, "waiting for a first: {q:?}");
    assert_eq!(r.queue("a").await, vec![m.clone()]);
    assert_eq!(r.queue("b").await, vec![m.clone()]);
    // Holding nothing: b is free, and says waiters may be queued.
    assert_eq!(r.get("b").await, None);
    let fence: Option<String> = r.c.get(format!("{}:fence", lock("b"))).await.expect("GET");
    assert!(fence.is_some_and(|f| f.ends_with(" q")));
    assert_eq!(r.get("a").await.as_deref(), Some("qX"));
    rig.messages().await;
    // X's release frees a, the set's last key held: the set holds both, told in one message.
    let r = &rig.r;
    assert_eq!(r.release("a", "X").await, vec![2]);
    assert_eq!(r.get("a").await.as_deref(), Some("hS"));
    assert_eq!(r.get("b").await.as_deref(), Some("hS"));
    assert!(r.pttl("b").await > 9_000);
    assert!(r.queue("a").await.is_empty() && r.queue("b").await.is_empty());
    let seen = rig.messages().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let prefix = format!("{}:w:{LIVE}: m4 {TTL} ", lock("a"));
    assert!(seen[0].starts_with(&prefix), "{seen:?}");
    assert!(seen[0].ends_with(&format!(" {m}")), "{seen:?}");
    // The set's attempt finds its grant: claimed ('h' -> 'q'), its fences.
    let r = &rig.r;
    let (_, mine) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(mine[0], 1, "{mine:?}");
    assert_eq!(r.get("a").await.as_deref(), Some("qS"));
    let fences: Vec<String> = mine[2..].iter().map(|f| f.to_string()).collect();
    assert!(seen[0].contains(&fences.join(",")), "{seen:?} {fences:?}");
}

#[tokio::test]
async fn a_set_at_the_head_holds_later_waiters_back_and_the_last_release_grants_it() {
    let mut rig = rig().await;
    let r = &rig.r;
    r.take("a", "X").await;
    r.take("b", "Y").await;
    let (m, _) = r.set_queue(AB, "S", LIVE).await;
    // W waits for a alone, behind the set.
    let (w, qw) = r.one_queue("a", "W", LIVE2).await;
    assert_eq!((qw[0], qw[2]), (2, 1));
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    rig.messages().await;
    // X releases a: the set heads a's queue but b is held: a stays free, W is not granted.
    let r = &rig.r;
    assert_eq!(r.release("a", "X").await, vec![1]);
    assert_eq!(r.get("a").await, None);
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    let seen = rig.messages().await;
    assert!(
        seen.iter()
            .all(|s| !s.contains(" g2 ") && !s.contains(" m4 ")),
        "{seen:?}"
    );
    // An attempt at a alone (a polling caller's, or W's look) does not pass the set.
    let r = &rig.r;
    let (_, look) = r.one_queue("a", "W", LIVE2).await;
    assert_eq!((look[0], look[1]), (2, -1), "{look:?}");
    assert_eq!(r.one_try("a", "P").await, vec![2, -1, 0, 1]);
    assert_eq!(r.get("a").await, None);
    // Y releases b: the set holds both.
    assert_eq!(r.release("b", "Y").await, vec![2]);
    assert_eq!(r.get("a").await.as_deref(), Some("hS"));
    assert_eq!(r.get("b").await.as_deref(), Some("hS"));
    assert_eq!(r.queue("a").await, vec![w.clone()]);
    let seen = rig.messages().await;
    assert_eq!(
        seen.iter().filter(|s| s.contains(": m4 ")).count(),
        1,
        "{seen:?}"
    );
    // The set releases: a goes to W.
    let r = &rig.r;
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![2, 1]);
    assert_eq!(r.get("a").await.as_deref(), Some("hW"));
    assert_eq!(r.get("b").await, None);
    let seen = rig.messages().await;
    let granted = format!("{}:w:{LIVE2}: g2 ", lock("a"));
    assert!(seen.iter().any(|s| s.starts_with(&granted)), "{seen:?}");
}

#[tokio::test]
async fn an_older_set_is_not_passed_by_a_later_one_that_overlaps_it() {
    let mut rig = rig().await;
    let r = &rig.r;
    // X holds a and b.
    assert_eq!(r.set_queue(AB, "X", LIVE2).await.1[0], 0);
    // S {a, b} queues, then T {b, c}: c is free, but T must not pass S on b.
    let (ms, _) = r.set_queue(AB, "S", LIVE).await;
    let (mt, t) = r.set_queue(&["b", "c"], "T", LIVE2).await;
    assert_eq!((t[0], t[2]), (2, 1), "{t:?}");
    assert_eq!(r.queue("b").await, vec![ms.clone(), mt.clone()]);
    assert_eq!(r.queue("c").await, vec![mt.clone()]);
    assert_eq!(r.get("c").await, None);
    rig.messages().await;
    // X releases both in one call: S is granted a and b; T still waits (b is S's).
    let r = &rig.r;
    assert_eq!(
        r.set_release(AB, "X", LIVE2).await,
        vec![2, 1],
        "a handed to S (b with it)"
    );
    assert_eq!(r.get("a").await.as_deref(), Some("hS"));
    assert_eq!(r.get("b").await.as_deref(), Some("hS"));
    assert_eq!(r.get("c").await, None);
    assert_eq!(r.queue("b").await, vec![mt.clone()]);
    let seen = rig.messages().await;
    let grants: Vec<&String> = seen.iter().filter(|s| s.contains(" m4 ")).collect();
    assert_eq!(grants.len(), 1, "{seen:?}");
    assert!(grants[0].ends_with(&ms), "{seen:?}");
    // S releases: T gets b and c.
    let r = &rig.r;
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![1, 2]);
    assert_eq!(r.get("b").await.as_deref(), Some("hT"));
    assert_eq!(r.get("c").await.as_deref(), Some("hT"));
    assert!(r.queue("b").await.is_empty() && r.queue("c").await.is_empty());
}

#[tokio::test]
async fn a_departed_set_leaves_every_queue_and_the_waiters_it_held_back_look() {
    let mut rig = rig().await;
    rig.r.take("a", "X").await;
    // D {a, b}, then W on b alone behind it; then D's process dies.
    let dsub = rig.mortal("a").await;
    let (_, d) = rig.r.set_queue(AB, "D", MORTAL).await;
    assert_eq!(d[0], 2);
    let (w, qw) = rig.r.one_queue("b", "W", LIVE).await;
    assert_eq!(
        (qw[0], qw[1], qw[5]),
        (2, -1, 1),
        "free b, behind D: a watcher with nothing to look at: {qw:?}"
    );
    rig.die(dsub, "a").await;
    rig.messages().await;
    // X releases a: D is gone, dropped from a and from b; b's watcher W is told to look now.
    assert_eq!(rig.r.release("a", "X").await, vec![1]);
    assert!(rig.r.queue("a").await.is_empty());
    assert_eq!(rig.r.queue("b").await, vec![w.clone()]);
    let seen = rig.messages().await;
    let look = format!("{}:w:{LIVE}: w3 0 ", lock("b"));
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&look) && s.ends_with(" W")),
        "{seen:?}"
    );
    // W looks: b is its.
    let (_, took) = rig.r.one_queue("b", "W", LIVE).await;
    assert_eq!(took[0], 0, "{took:?}");
    assert!(rig.r.queue("b").await.is_empty());
}

#[tokio::test]
async fn a_set_that_leaves_serves_the_keys_it_held_back() {
    let mut rig = rig().await;
    let r = &rig.r;
    r.take("b", "Y").await;
    let (m, _) = r.set_queue(AB, "S", LIVE).await;
    let (w, _) = r.one_queue("a", "W", LIVE2).await;
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    rig.messages().await;
    let give_back = Argv {
        pid: LIVE,
        flag: "G",
        ..Argv::default()
    };
    let r = &rig.r;
    assert_eq!(
        r.set_leave(AB, "S", &m, give_back).await,
        vec![0],
        "it held nothing"
    );
    assert!(r.queue("b").await.is_empty());
    assert!(r.queue("a").await.is_empty());
    assert_eq!(r.get("a").await.as_deref(), Some("hW"));
    let seen = rig.messages().await;
    let granted = format!("{}:w:{LIVE2}: g2 ", lock("a"));
    assert!(seen.iter().any(|s| s.starts_with(&granted)), "{seen:?}");
}

#[tokio::test]
async fn a_refresh_drops_a_departed_set_at_the_head_of_its_queue() {
    let mut rig = rig().await;
    rig.r.take("b", "Y").await;
    let dsub = rig.mortal("a").await;
    let (d, _) = rig.r.set_queue(AB, "D", MORTAL).await;
    let (w, _) = rig.r.one_queue("a", "W", LIVE).await;
    assert_eq!(rig.r.queue("a").await, vec![d.clone(), w.clone()]);
    rig.die(dsub, "a").await;
    rig.messages().await;
    // Y refreshes b: D heads b's queue and is gone: it leaves both queues, a's watcher looks.
    assert_eq!(rig.r.extend("b", "Y").await[0], 1);
    assert!(rig.r.queue("b").await.is_empty());
    assert_eq!(rig.r.queue("a").await, vec![w.clone()]);
    let seen = rig.messages().await;
    let look = format!("{}:w:{LIVE}: w3 0 ", lock("a"));
    assert!(seen.iter().any(|s| s.starts_with(&look)), "{seen:?}");
}

#[tokio::test]
async fn a_short_set_grant_is_confirmed_by_the_sets_attempt() {
    let mut rig = rig().await;
    let r = &rig.r;
    r.take("a", "X").await;
    r.set_queue(AB, "S", LIVE).await;
    // LIVE's records say it called long ago: a short grant.
    for key in ["a", "b"] {
        let _: Value = cmd(
            &r.c,
            "HSET",
            vec![format!("{}:p", lock(key)).into(), LIVE.into(), "1".into()],
        )
        .await;
    }
    rig.messages().await;
    let r = &rig.r;
    r.release("a", "X").await;
    assert_eq!(r.get("a").await.as_deref(), Some("gS"));
    assert_eq!(r.get("b").await.as_deref(), Some("gS"));
    assert!(r.pttl("b").await <= 500);
    let seen = rig.messages().await;
    assert!(seen.iter().any(|s| s.contains(": m4 500 ")), "{seen:?}");
    let r = &rig.r;
    let (_, confirmed) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(&confirmed[..2], &[3, TTL as i64], "{confirmed:?}");
    assert_eq!(r.get("a").await.as_deref(), Some("qS"));
    assert_eq!(r.get("b").await.as_deref(), Some("qS"));
    assert!(r.pttl("a").await > 9_000 && r.pttl("b").await > 9_000);
}

#[tokio::test]
async fn the_orphan_give_back_takes_only_the_unclaimed_grant_of_its_fences() {
    let mut rig = rig().await;
    let (_, fences) = rig.granted_to_s().await;
    let r = &rig.r;
    // Another grant's fences: nothing.
    let other = Argv {
        pid: LIVE,
        flag: "o",
        fence: "1,2",
        ..Argv::default()
    };
    assert_eq!(r.set_leave(AB, "S", "", other).await, vec![0]);
    assert_eq!(r.get("a").await.as_deref(), Some("hS"));
    let orphan = Argv {
        fence: &fences,
        ..other
    };
    assert_eq!(r.set_leave(AB, "S", "", orphan).await, vec![2]);
    assert_eq!(r.get("a").await, None);
    assert_eq!(r.get("b").await, None);
}

#[tokio::test]
async fn a_claimed_set_grant_is_not_given_back_by_its_late_message() {
    let mut rig = rig().await;
    let (_, fences) = rig.granted_to_s().await;
    let r = &rig.r;
    assert_eq!(r.set_queue(AB, "S", LIVE).await.1[0], 1, "claimed");
    let orphan = Argv {
        pid: LIVE,
        flag: "o",
        fence: &fences,
        ..Argv::default()
    };
    assert_eq!(r.set_leave(AB, "S", "", orphan).await, vec![0]);
    assert_eq!(r.get("a").await.as_deref(), Some("qS"));
    assert_eq!(r.get("b").await.as_deref(), Some("qS"));
}

#[tokio::test]
async fn a_set_missing_from_one_queue_queues_again_at_the_back_of_all() {
    let rig = rig().await;
    let r = &rig.r;
    r.take("a", "X").await;
    r.take("b", "Y").await;
    let (m, _) = r.set_queue(AB, "S", LIVE).await;
    let (w, _) = r.set_queue(AB, "W", LIVE2).await;
    // S dropped from b's queue only (by hand): its next attempt puts it behind W in both.
    let _: i64 = cmd(
        &r.c,
        "ZREM",
        vec![format!("{}:q", lock("b")).into(), m.clone().into()],
    )
    .await;
    r.set_queue(AB, "S", LIVE).await;
    assert_eq!(r.queue("a").await, vec![w.clone(), m.clone()]);
    assert_eq!(r.queue("b").await, vec![w.clone(), m.clone()]);
}

#[tokio::test]
async fn a_set_attempt_serves_a_free_keys_queue_first() {
    let mut rig = rig().await;
    let r = &rig.r;
    // a is free with W queued (its holder's lease ran out, say): W comes first.
    r.take("a", "X").await;
    r.one_queue("a", "W", LIVE2).await;
    let _: i64 = cmd(&r.c, "DEL", vec![lock("a").into()]).await;
    rig.messages().await;
    let r = &rig.r;
    let (m, got) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(got[0], 2, "{got:?}");
    assert_eq!(r.get("a").await.as_deref(), Some("hW"));
    assert_eq!(r.queue("a").await, vec![m.clone()]);
    let seen = rig.messages().await;
    let granted = format!(":w:{LIVE2}: g2 ");
    assert!(seen.iter().any(|s| s.contains(&granted)), "{seen:?}");
}

/// A set's release that meets more departed waiters than one call looks at says "continue"
/// with what it did to each key, which the next call does not change.
#[tokio::test]
async fn a_set_release_that_goes_on_keeps_what_it_said_of_each_key() {
    let rig = rig().await;
    let r = &rig.r;
    assert_eq!(r.set_queue(AB, "S", LIVE).await.1[0], 0);
    // 250 waiters of a process nobody listens for, queued on a behind the set.
    for i in 0..250 {
        let _: i64 = cmd(
            &r.c,
            "ZADD",
            vec![
                format!("{}:q", lock("a")).into(),
                i.into(),
                format!("dddddddddddd {TTL} dead{i}").into(),
            ],
        )
        .await;
    }
    let _: () =
        r.c.set(lock("a"), "qS", None, None, false)
            .await
            .expect("SET");
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![4, 1, 1]);
    // a is the caller's to pass on, for the claim window; the next call finishes.
    assert_eq!(r.get("a").await.as_deref(), Some("qS"));
    assert_eq!(r.set_release(AB, "S", LIVE).await, vec![1, 0]);
    assert_eq!(r.get("a").await, None);
    assert!(r.queue("a").await.is_empty());
}

/// A refresh drops departed waiters at its queue's head one after another, one-key waiters
/// included, so a departed set behind a departed one-key waiter goes too.
#[tokio::test]
async fn a_refresh_drops_departed_heads_of_both_kinds() {
    let mut rig = rig().await;
    rig.r.take("b", "Y").await;
    let dsub = rig.mortal("a").await;
    // A departed one-key waiter heads b's queue; then D {a, b}; W waits on a behind D.
    let _: i64 = cmd(
        &rig.r.c,
        "ZADD",
        vec![
            format!("{}:q", lock("b")).into(),
            0.into(),
            format!("dddddddddddd {TTL} one").into(),
        ],
    )
    .await;
    let (d, _) = rig.r.set_queue(AB, "D", MORTAL).await;
    let (w, _) = rig.r.one_queue("a", "W", LIVE).await;
    assert_eq!(rig.r.queue("a").await, vec![d.clone(), w.clone()]);
    rig.die(dsub, "a").await;
    rig.messages().await;
    assert_eq!(rig.r.extend("b", "Y").await[0], 1);
    assert!(rig.r.queue("b").await.is_empty(), "both heads dropped");
    assert_eq!(rig.r.queue("a").await, vec![w.clone()]);
    let seen = rig.messages().await;
    let look = format!("{}:w:{LIVE}: w3 0 ", lock("a"));
    assert!(seen.iter().any(|s| s.starts_with(&look)), "{seen:?}");
}

/// The orphan give-back is all or nothing: a grant one of whose keys its waiter claimed (or
/// another grant holds) is kept whole.
#[tokio::test]
async fn the_orphan_give_back_keeps_a_grant_partly_claimed() {
    let mut rig = rig().await;
    let (_, fences) = rig.granted_to_s().await;
    let r = &rig.r;
    let _: i64 = cmd(
        &r.c,
        "SETRANGE",
        vec![lock("b").into(), 0.into(), "q".into()],
    )
    .await;
    let orphan = Argv {
        pid: LIVE,
        flag: "o",
        fence: &fences,
        ..Argv::default()
    };
    assert_eq!(r.set_leave(AB, "S", "", orphan).await, vec![0]);
    assert_eq!(r.get("a").await.as_deref(), Some("hS"));
    assert_eq!(r.get("b").await.as_deref(), Some("qS"));
}

/// A set missing from one of its queues leaves them all when it queues again: a free key whose
/// queue it headed is served (its next waiter holds it), and the set joins each queue at the
/// back.
#[tokio::test]
async fn a_set_queueing_again_serves_the_free_keys_it_headed() {
    let mut rig = rig().await;
    let r = &rig.r;
    r.take("b", "Y").await;
    let (m, _) = r.set_queue(AB, "S", LIVE).await;
    let (w, _) = r.one_queue("a", "W", LIVE2).await;
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    let _: i64 = cmd(
        &r.c,
        "ZREM",
        vec![format!("{}:q", lock("b")).into(), m.clone().into()],
    )
    .await;
    rig.messages().await;
    let r = &rig.r;
    let (_, again) = r.set_queue(AB, "S", LIVE).await;
    assert_eq!(again[0], 2, "{again:?}");
    assert_eq!(r.get("a").await.as_deref(), Some("hW"));
    assert_eq!(r.queue("a").await, vec![m.clone()]);
    assert_eq!(r.queue("b").await, vec![m.clone()]);
    let seen = rig.messages().await;
    let granted = format!("{}:w:{LIVE2}: g2 ", lock("a"));
    assert!(seen.iter().any(|s| s.starts_with(&granted)), "{seen:?}");
}

/// A one-key waiter that leaves a free key's queue behind a waiting set does not tell the
/// watchers to look now (a look would find the set still waiting).
#[tokio::test]
async fn leaving_behind_a_waiting_set_sends_no_look() {
    let mut rig = rig().await;
    let r = &rig.r;
    r.take("b", "Y").await;
    r.set_queue(AB, "S", LIVE).await;
    let (w, _) = r.one_queue("a", "W", LIVE2).await;
    // (V stays: the queue keeps watchers to tell.)
    r.one_queue("a", "V", LIVE2).await;
    rig.messages().await;
    let leave = Argv {
        pid: LIVE2,
        flag: "G",
        member: &w,
        ..Argv::default()
    };
    let r = &rig.r;
    assert_eq!(
        r.call(
            scripts::LEAVE,
            &["a"],
            Argv {
                token: "W",
                ..leave
            }
        )
        .await,
        vec![0]
    );
    let seen = rig.messages().await;
    assert!(seen.iter().all(|s| !s.contains(" w3 0 ")), "{seen:?}");
}

/// On a Cluster (a slot can be migrating: a key not yet moved reads as absent on the importing
/// node) a call does not grant a set whose keys it did not all declare: the key it serves is
/// reserved for the set ('r', the claim window), and the set, told to look now, takes every
/// key by its own call (which declares them all).
#[tokio::test]
async fn on_a_cluster_a_set_is_reserved_then_takes_its_keys_by_its_own_call() {
    let mut rig = rig().await;
    rig.r.take("a", "X").await;
    let cluster = Argv {
        cluster: true,
        ..Argv::default()
    };
    let m = set_member(LIVE, "S", AB);
    let queue = Argv {
        token: "S",
        member: &m,
        pid: LIVE,
        ..cluster
    };
    assert_eq!(rig.r.call(scripts::SET_ACQUIRE, AB, queue).await[0], 2);
    rig.messages().await;
    let release = Argv {
        token: "X",
        ttl: 1,
        ..cluster
    };
    assert_eq!(rig.r.call(scripts::RELEASE, &["a"], release).await, vec![2]);
    assert_eq!(rig.r.get("a").await.as_deref(), Some("rS"));
    assert!(rig.r.pttl("a").await <= 500);
    assert_eq!(
        rig.r.get("b").await,
        None,
        "b not written: a call on a did not declare it"
    );
    assert_eq!(rig.r.queue("a").await, vec![m.clone()]);
    let fence: Option<String> = rig
        .r
        .c
        .get(format!("{}:fence", lock("a")))
        .await
        .expect("GET");
    assert!(fence.is_some_and(|f| f.ends_with(&format!(" q {LIVE}"))));
    let seen = rig.messages().await;
    let told = format!("{}:w:{LIVE}: w3 0 ", lock("a"));
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&told) && s.ends_with(" S")),
        "{seen:?}"
    );
    // Nobody else takes a reserved key, nor refreshes one.
    assert_eq!(rig.r.one_try("a", "P").await[0], 2);
    let extend = Argv {
        token: "S",
        ..cluster
    };
    assert_eq!(rig.r.call(scripts::EXTEND, &["a"], extend).await, vec![0]);
    // The set's own call takes both keys.
    let took = rig.r.call(scripts::SET_ACQUIRE, AB, queue).await;
    assert_eq!(&took[..2], &[0, TTL as i64], "{took:?}");
    assert_eq!(rig.r.get("a").await.as_deref(), Some("pS"));
    assert_eq!(rig.r.get("b").await.as_deref(), Some("pS"));
    assert!(rig.r.queue("a").await.is_empty() && rig.r.queue("b").await.is_empty());
}

/// A reservation the set does not take lapses as a short grant does: the next call on the
/// free key marks the set's process lapsed, drops the set, tells it ('d2'), and serves the key.
/// A set that finds it cannot take its keys gives its reservation back.
#[tokio::test]
async fn on_a_cluster_a_reservation_lapses_or_is_given_back() {
    for lapse in [false, true] {
        let mut rig = rig().await;
        let cluster = Argv {
            cluster: true,
            ..Argv::default()
        };
        let m = set_member(LIVE, "S", AB);
        let queue = Argv {
            token: "S",
            member: &m,
            pid: LIVE,
            ..cluster
        };
        let release = Argv {
            token: "X",
            ttl: 1,
            ..cluster
        };
        rig.r.take("a", "X").await;
        rig.r.call(scripts::SET_ACQUIRE, AB, queue).await;
        rig.r.call(scripts::RELEASE, &["a"], release).await;
        assert_eq!(rig.r.get("a").await.as_deref(), Some("rS"));
        if !lapse {
            // Given back: b is taken (by hand) before the set looks.
            let _: () = rig
                .r
                .c
                .set(lock("b"), "pZ", None, None, false)
                .await
                .expect("SET");
            let looked = rig.r.call(scripts::SET_ACQUIRE, AB, queue).await;
            assert_eq!((looked[0], looked[2]), (2, 1), "queued still: {looked:?}");
            assert_eq!(rig.r.get("a").await, None, "reservation given back");
            assert_eq!(rig.r.queue("a").await, vec![m.clone()]);
            continue;
        }
        // Lapsed: a's reservation ends (by hand here) before the set takes it.
        let _: i64 = cmd(&rig.r.c, "DEL", vec![lock("a").into()]).await;
        rig.messages().await;
        let poll = Argv {
            token: "P",
            ..cluster
        };
        let took = rig.r.call(scripts::ACQUIRE, &["a"], poll).await;
        assert_eq!(took[0], 0, "the lapsed set is skipped: {took:?}");
        assert!(rig.r.queue("a").await.is_empty());
        let seen = rig.messages().await;
        let dropped = format!("{}:w:{LIVE}: d2", lock("a"));
        assert!(seen.contains(&dropped), "{seen:?}");
    }
}

/// On a Cluster a departed set is dropped from the queues the call declared only; the other
/// free keys whose queue it headed get their watchers told to look now, and nothing else of
/// them is written.
#[tokio::test]
async fn on_a_cluster_a_departed_set_is_dropped_where_declared_and_looked_at_elsewhere() {
    let mut rig = rig().await;
    rig.r.take("a", "X").await;
    let dsub = rig.mortal("a").await;
    let d = set_member(MORTAL, "D", AB);
    let cluster = Argv {
        cluster: true,
        ..Argv::default()
    };
    let queue = Argv {
        token: "D",
        member: &d,
        pid: MORTAL,
        ..cluster
    };
    rig.r.call(scripts::SET_ACQUIRE, AB, queue).await;
    let (w, _) = rig.r.one_queue("b", "W", LIVE).await;
    rig.die(dsub, "a").await;
    rig.messages().await;
    let release = Argv {
        token: "X",
        ttl: 1,
        ..cluster
    };
    assert_eq!(rig.r.call(scripts::RELEASE, &["a"], release).await, vec![1]);
    assert!(rig.r.queue("a").await.is_empty());
    assert_eq!(
        rig.r.queue("b").await,
        vec![d.clone(), w.clone()],
        "b not written"
    );
    let seen = rig.messages().await;
    let look = format!("{}:w:{LIVE}: w3 0 ", lock("b"));
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&look) && s.ends_with(" W")),
        "{seen:?}"
    );
    // W's look drops D there and takes b.
    let look = Argv {
        token: "W",
        member: &w,
        pid: LIVE,
        ..cluster
    };
    assert_eq!(rig.r.call(scripts::ACQUIRE, &["b"], look).await[0], 0);
}

/// On a Cluster, a set that cannot take the keys reserved for it gives each back and serves
/// it: its head may be another waiter, queued while the set was out of that queue (found by the
/// model: freeing the key alone left that waiter on a free key with nothing to wake it).
#[tokio::test]
async fn on_a_cluster_a_reservation_given_back_is_served() {
    let rig = rig().await;
    let r = &rig.r;
    let cluster = Argv {
        cluster: true,
        ..Argv::default()
    };
    r.take("b", "X").await;
    let m = set_member(LIVE, "S", AB);
    let queue = Argv {
        token: "S",
        member: &m,
        pid: LIVE,
        ..cluster
    };
    r.call(scripts::SET_ACQUIRE, AB, queue).await;
    let release = Argv {
        token: "X",
        ttl: 1,
        ..cluster
    };
    r.call(scripts::RELEASE, &["b"], release).await;
    assert_eq!(r.get("b").await.as_deref(), Some("rS"));
    // The set is out of b's queue (dropped there), and W queues on b meanwhile.
    let _: i64 = cmd(
        &r.c,
        "ZREM",
        vec![format!("{}:q", lock("b")).into(), m.clone().into()],
    )
    .await;
    let w = format!("{LIVE2} {TTL} W");
    let wq = Argv {
        token: "W",
        member: &w,
        pid: LIVE2,
        ..cluster
    };
    r.call(scripts::ACQUIRE, &["b"], wq).await;
    let looked = r.call(scripts::SET_ACQUIRE, AB, queue).await;
    assert_eq!(looked[0], 2, "{looked:?}");
    assert_eq!(
        r.get("b").await.as_deref(),
        Some("hW"),
        "given back, and served"
    );
    assert_eq!(r.queue("b").await, vec![m.clone()]);
    assert_eq!(r.queue("a").await, vec![m.clone()]);
}
