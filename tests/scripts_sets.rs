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
use waitlock::fred::clients::SubscriberClient;
use waitlock::fred::prelude::*;
use waitlock::scripts;

fn lock(key: &str) -> String {
    format!("{{waitlock:{key}}}")
}

/// A set's member in its keys' queues: `"<pid> <ttl>* <token> <locks>"`.
fn set_member(pid: &str, ttl: u64, token: &str, keys: &[&str]) -> String {
    let locks: String = keys
        .iter()
        .map(|k| {
            let l = lock(k);
            format!("{}:{l}", l.len())
        })
        .collect();
    format!("{pid} {ttl}* {token} {locks}")
}

fn one_member(pid: &str, ttl: u64, token: &str) -> String {
    format!("{pid} {ttl} {token}")
}

struct Calls {
    c: Client,
}

impl Calls {
    /// One script call: `keys` the user keys (each gives lock, fence, queue, processes), then
    /// the script's `ARGV` as the library sends it (its arguments, one by one).
    #[allow(clippy::too_many_arguments)]
    async fn eval(
        &self,
        script: &'static str,
        keys: &[&str],
        token: &str,
        ttl: u64,
        member: &str,
        pid: &str,
        flag: &str,
        fence: &str,
    ) -> Vec<i64> {
        let mut k = Vec::new();
        for key in keys {
            let l = lock(key);
            k.push(l.clone());
            k.push(format!("{l}:fence"));
            k.push(format!("{l}:q"));
            k.push(format!("{l}:p"));
        }
        let argv: Vec<String> = vec![
            token.into(),
            ttl.to_string(),
            "3600000".into(),
            "500".into(),
            "100".into(),
            member.into(),
            pid.into(),
            flag.into(),
            fence.into(),
        ];
        self.c
            .eval(script, k, argv)
            .await
            .unwrap_or_else(|e| panic!("{keys:?}: {e}"))
    }

    async fn get(&self, key: &str) -> Option<String> {
        self.c.get(key).await.expect("GET")
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
        self.c.pttl(key).await.expect("PTTL")
    }

    /// Takes `key` for `token` (free) with acquire.lua.
    async fn take(&self, key: &str, token: &str) {
        let r = self
            .eval(scripts::ACQUIRE, &[key], token, 10_000, "", "", "", "")
            .await;
        assert_eq!(r[0], 0, "take {key}: {r:?}");
    }
}

/// Starts a rig: the subscriber listens as `LIVE` and `LIVE2` on keys a, b and c.
async fn rig() -> (RedisServer, Calls, SubscriberClient) {
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
    (server, Calls { c }, sub)
}

/// A process `MORTAL` that listens on the grant channel of `key` until [`die`] (a set's waiter
/// whose first key is `key`).
const MORTAL: &str = "cccccccccccc";

async fn mortal(server: &RedisServer, key: &str) -> SubscriberClient {
    let sub = subscriber(server).await;
    sub.ssubscribe(format!("{}:w:{MORTAL}", lock(key)))
        .await
        .expect("ssubscribe");
    sub
}

/// `MORTAL`'s process dies: Redis counts no listener on its channel of `key` any more.
async fn die(r: &Calls, sub: SubscriberClient, key: &str) {
    sub.quit().await.expect("quit");
    let chan = format!("{}:w:{MORTAL}", lock(key));
    for _ in 0..1000 {
        let n: Vec<Value> = cmd(&r.c, "PUBSUB SHARDNUMSUB", vec![chan.clone().into()]).await;
        if n.get(1).and_then(Value::as_i64) == Some(0) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    panic!("{MORTAL} still listens on {chan}");
}

/// The messages published since the last call of this, as `"<channel>: <text>"`.
async fn messages(
    sub: &SubscriberClient,
    rx: &mut tokio::sync::broadcast::Receiver<waitlock::fred::types::Message>,
) -> Vec<String> {
    // A PING on the subscriber comes back after every message published before it.
    let _: Value = sub.ping(None).await.expect("ping");
    let mut seen = Vec::new();
    while let Ok(m) = rx.try_recv() {
        seen.push(format!(
            "{}: {}",
            m.channel,
            m.value.as_str().unwrap_or_default()
        ));
    }
    seen
}

const TTL: u64 = 10_000;

#[tokio::test]
async fn a_free_set_is_taken_at_once_and_released_in_one_call() {
    let (_s, r, _sub) = rig().await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    let got = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(&got[..2], &[0, TTL as i64], "{got:?}");
    assert_eq!(got.len(), 4);
    assert!(got[2] > 0 && got[3] > 0);
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("pS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("pS"));
    assert!(r.queue("a").await.is_empty() && r.queue("b").await.is_empty());
    // Sent again: held by the caller, with the same fences.
    let again = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(again[0], 1);
    assert_eq!(&again[2..], &got[2..]);
    let rel = r
        .eval(scripts::SET_RELEASE, &["a", "b"], "S", 1, "", LIVE, "", "")
        .await;
    assert_eq!(rel, vec![1, 1]);
    assert_eq!(r.get(&lock("a")).await, None);
    assert_eq!(r.get(&lock("b")).await, None);
    // Not held any more: nothing.
    let rel = r
        .eval(scripts::SET_RELEASE, &["a", "b"], "S", 1, "", LIVE, "", "")
        .await;
    assert_eq!(rel, vec![0, 0]);
}

#[tokio::test]
async fn a_set_queues_once_in_every_queue_holding_nothing_and_is_granted_in_one_message() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("a", "X").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    // One attempt (no member): held, naming key 1 (a), not queued.
    let once = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            "",
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!((once[0], once[2], once[3]), (2, 0, 1), "{once:?}");
    let q = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!((q[0], q[2], q[3]), (2, 1, 1), "queued, listening: {q:?}");
    assert_eq!(q.len(), 9);
    assert_eq!(q[8], 1, "waiting for a first: {q:?}");
    assert_eq!(r.queue("a").await, vec![m.clone()]);
    assert_eq!(r.queue("b").await, vec![m.clone()]);
    // Holding nothing: b is free, and says waiters may be queued.
    assert_eq!(r.get(&lock("b")).await, None);
    assert!(r
        .get(&format!("{}:fence", lock("b")))
        .await
        .unwrap()
        .ends_with(" q"));
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("qX"));
    messages(&sub, &mut rx).await;
    // X's release frees a, the set's last key held: the set holds both, told in one message.
    let rel = r
        .eval(scripts::RELEASE, &["a"], "X", 1, "", "", "", "")
        .await;
    assert_eq!(rel, vec![2]);
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("hS"));
    assert!(r.pttl(&lock("b")).await > 9_000);
    assert!(r.queue("a").await.is_empty() && r.queue("b").await.is_empty());
    let seen = messages(&sub, &mut rx).await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    let prefix = format!("{}:w:{LIVE}: m4 {TTL} ", lock("a"));
    assert!(seen[0].starts_with(&prefix), "{seen:?}");
    assert!(seen[0].ends_with(&format!(" {m}")), "{seen:?}");
    // The set's attempt finds its grant: claimed ('h' -> 'q'), its fences.
    let mine = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(mine[0], 1, "{mine:?}");
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("qS"));
    let fences: Vec<String> = mine[2..].iter().map(|f| f.to_string()).collect();
    assert!(seen[0].contains(&fences.join(",")), "{seen:?} {fences:?}");
}

#[tokio::test]
async fn a_set_at_the_head_holds_later_waiters_back_and_the_last_release_grants_it() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("a", "X").await;
    r.take("b", "Y").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    let q = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(q[0], 2);
    // W waits for a alone, behind the set.
    let w = one_member(LIVE2, TTL, "W");
    let qw = r
        .eval(scripts::ACQUIRE, &["a"], "W", TTL, &w, LIVE2, "", "")
        .await;
    assert_eq!((qw[0], qw[2]), (2, 1));
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    messages(&sub, &mut rx).await;
    // X releases a: the set heads a's queue but b is held: a stays free, W is not granted.
    let rel = r
        .eval(scripts::RELEASE, &["a"], "X", 1, "", "", "", "")
        .await;
    assert_eq!(rel, vec![1]);
    assert_eq!(r.get(&lock("a")).await, None);
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    let seen = messages(&sub, &mut rx).await;
    assert!(
        seen.iter()
            .all(|s| !s.contains(" g2 ") && !s.contains(" m4 ")),
        "{seen:?}"
    );
    // An attempt at a alone (a polling caller's, or W's look) does not pass the set.
    let look = r
        .eval(scripts::ACQUIRE, &["a"], "W", TTL, &w, LIVE2, "", "")
        .await;
    assert_eq!((look[0], look[1]), (2, -1), "{look:?}");
    let poll = r
        .eval(scripts::ACQUIRE, &["a"], "P", TTL, "", "", "", "")
        .await;
    assert_eq!(poll, vec![2, -1, 0, 1]);
    assert_eq!(r.get(&lock("a")).await, None);
    // Y releases b: the set holds both.
    let rel = r
        .eval(scripts::RELEASE, &["b"], "Y", 1, "", "", "", "")
        .await;
    assert_eq!(rel, vec![2]);
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("hS"));
    assert_eq!(r.queue("a").await, vec![w.clone()]);
    let seen = messages(&sub, &mut rx).await;
    assert_eq!(
        seen.iter().filter(|s| s.contains(": m4 ")).count(),
        1,
        "{seen:?}"
    );
    // The set releases: a goes to W.
    let rel = r
        .eval(scripts::SET_RELEASE, &["a", "b"], "S", 1, "", LIVE, "", "")
        .await;
    assert_eq!(rel, vec![2, 1]);
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hW"));
    assert_eq!(r.get(&lock("b")).await, None);
    let seen = messages(&sub, &mut rx).await;
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&format!("{}:w:{LIVE2}: g2 ", lock("a")))),
        "{seen:?}"
    );
}

#[tokio::test]
async fn an_older_set_is_not_passed_by_a_later_one_that_overlaps_it() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    // X holds a and b.
    let mx = set_member(LIVE2, TTL, "X", &["a", "b"]);
    assert_eq!(
        r.eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "X",
            TTL,
            &mx,
            LIVE2,
            "",
            ""
        )
        .await[0],
        0
    );
    // S {a, b} queues, then T {b, c}: c is free, but T must not pass S on b.
    let ms = set_member(LIVE, TTL, "S", &["a", "b"]);
    let mt = set_member(LIVE2, TTL, "T", &["b", "c"]);
    assert_eq!(
        r.eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &ms,
            LIVE,
            "",
            ""
        )
        .await[0],
        2
    );
    let t = r
        .eval(
            scripts::SET_ACQUIRE,
            &["b", "c"],
            "T",
            TTL,
            &mt,
            LIVE2,
            "",
            "",
        )
        .await;
    assert_eq!((t[0], t[2]), (2, 1), "{t:?}");
    assert_eq!(r.queue("b").await, vec![ms.clone(), mt.clone()]);
    assert_eq!(r.queue("c").await, vec![mt.clone()]);
    assert_eq!(r.get(&lock("c")).await, None);
    messages(&sub, &mut rx).await;
    // X releases both in one call: S is granted a and b; T still waits (b is S's).
    let rel = r
        .eval(scripts::SET_RELEASE, &["a", "b"], "X", 1, "", LIVE2, "", "")
        .await;
    assert_eq!(rel, vec![2, 1], "a handed to S (b with it)");
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("hS"));
    assert_eq!(r.get(&lock("c")).await, None);
    assert_eq!(r.queue("b").await, vec![mt.clone()]);
    let seen = messages(&sub, &mut rx).await;
    let grants: Vec<&String> = seen.iter().filter(|s| s.contains(" m4 ")).collect();
    assert_eq!(grants.len(), 1, "{seen:?}");
    assert!(grants[0].ends_with(&ms), "{seen:?}");
    // S releases: T gets b and c.
    let rel = r
        .eval(scripts::SET_RELEASE, &["a", "b"], "S", 1, "", LIVE, "", "")
        .await;
    assert_eq!(rel, vec![1, 2]);
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("hT"));
    assert_eq!(r.get(&lock("c")).await.as_deref(), Some("hT"));
    assert!(r.queue("b").await.is_empty() && r.queue("c").await.is_empty());
}

#[tokio::test]
async fn a_departed_set_leaves_every_queue_and_the_waiters_it_held_back_look() {
    let (s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("a", "X").await;
    // D {a, b}, then W on b alone behind it; then D's process dies.
    let dsub = mortal(&s, "a").await;
    let d = set_member(MORTAL, TTL, "D", &["a", "b"]);
    assert_eq!(
        r.eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "D",
            TTL,
            &d,
            MORTAL,
            "",
            ""
        )
        .await[0],
        2
    );
    let w = one_member(LIVE, TTL, "W");
    let qw = r
        .eval(scripts::ACQUIRE, &["b"], "W", TTL, &w, LIVE, "", "")
        .await;
    assert_eq!(
        (qw[0], qw[1], qw[5]),
        (2, -1, 1),
        "free b, behind D: a watcher with nothing to look at: {qw:?}"
    );
    die(&r, dsub, "a").await;
    messages(&sub, &mut rx).await;
    // X releases a: D is gone, dropped from a and from b; b's watcher W is told to look now.
    let rel = r
        .eval(scripts::RELEASE, &["a"], "X", 1, "", "", "", "")
        .await;
    assert_eq!(rel, vec![1]);
    assert!(r.queue("a").await.is_empty());
    assert_eq!(r.queue("b").await, vec![w.clone()]);
    let seen = messages(&sub, &mut rx).await;
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&format!("{}:w:{LIVE}: w3 0 ", lock("b"))) && s.ends_with(" W")),
        "{seen:?}"
    );
    // W looks: b is its.
    let look = r
        .eval(scripts::ACQUIRE, &["b"], "W", TTL, &w, LIVE, "", "")
        .await;
    assert_eq!(look[0], 0, "{look:?}");
    assert!(r.queue("b").await.is_empty());
}

#[tokio::test]
async fn a_set_that_leaves_serves_the_keys_it_held_back() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("b", "Y").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "S",
        TTL,
        &m,
        LIVE,
        "",
        "",
    )
    .await;
    let w = one_member(LIVE2, TTL, "W");
    r.eval(scripts::ACQUIRE, &["a"], "W", TTL, &w, LIVE2, "", "")
        .await;
    assert_eq!(r.queue("a").await, vec![m.clone(), w.clone()]);
    messages(&sub, &mut rx).await;
    let left = r
        .eval(scripts::SET_LEAVE, &["a", "b"], "S", 1, &m, LIVE, "G", "")
        .await;
    assert_eq!(left, vec![0], "it held nothing");
    assert!(r.queue("b").await.is_empty());
    assert!(r.queue("a").await.is_empty());
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hW"));
    let seen = messages(&sub, &mut rx).await;
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&format!("{}:w:{LIVE2}: g2 ", lock("a")))),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_refresh_drops_a_departed_set_at_the_head_of_its_queue() {
    let (s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("b", "Y").await;
    let dsub = mortal(&s, "a").await;
    let d = set_member(MORTAL, TTL, "D", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "D",
        TTL,
        &d,
        MORTAL,
        "",
        "",
    )
    .await;
    let w = one_member(LIVE, TTL, "W");
    r.eval(scripts::ACQUIRE, &["a"], "W", TTL, &w, LIVE, "", "")
        .await;
    assert_eq!(r.queue("a").await, vec![d.clone(), w.clone()]);
    die(&r, dsub, "a").await;
    messages(&sub, &mut rx).await;
    // Y refreshes b: D heads b's queue and is gone: it leaves both queues, a's watcher looks.
    let ext = r
        .eval(scripts::EXTEND, &["b"], "Y", TTL, "", "", "", "")
        .await;
    assert_eq!(ext[0], 1);
    assert!(r.queue("b").await.is_empty());
    assert_eq!(r.queue("a").await, vec![w.clone()]);
    let seen = messages(&sub, &mut rx).await;
    assert!(
        seen.iter()
            .any(|s| s.starts_with(&format!("{}:w:{LIVE}: w3 0 ", lock("a")))),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_short_set_grant_is_confirmed_by_the_sets_attempt() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("a", "X").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "S",
        TTL,
        &m,
        LIVE,
        "",
        "",
    )
    .await;
    // LIVE's records say it called long ago: a short grant.
    for key in ["a", "b"] {
        let _: Value = cmd(
            &r.c,
            "HSET",
            vec![format!("{}:p", lock(key)).into(), LIVE.into(), "1".into()],
        )
        .await;
    }
    messages(&sub, &mut rx).await;
    r.eval(scripts::RELEASE, &["a"], "X", 1, "", "", "", "")
        .await;
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("gS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("gS"));
    assert!(r.pttl(&lock("b")).await <= 500);
    let seen = messages(&sub, &mut rx).await;
    assert!(seen.iter().any(|s| s.contains(": m4 500 ")), "{seen:?}");
    let confirmed = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(&confirmed[..2], &[3, TTL as i64], "{confirmed:?}");
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("qS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("qS"));
    assert!(r.pttl(&lock("a")).await > 9_000 && r.pttl(&lock("b")).await > 9_000);
}

#[tokio::test]
async fn the_orphan_give_back_takes_only_the_unclaimed_grant_of_its_fences() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("a", "X").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "S",
        TTL,
        &m,
        LIVE,
        "",
        "",
    )
    .await;
    messages(&sub, &mut rx).await;
    r.eval(scripts::RELEASE, &["a"], "X", 1, "", "", "", "")
        .await;
    let seen = messages(&sub, &mut rx).await;
    let fences = seen[0].split(' ').nth(4).expect("fences").to_owned();
    // Another grant's fences: nothing.
    let none = r
        .eval(
            scripts::SET_LEAVE,
            &["a", "b"],
            "S",
            1,
            "",
            LIVE,
            "o",
            "1,2",
        )
        .await;
    assert_eq!(none, vec![0]);
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hS"));
    let gave = r
        .eval(
            scripts::SET_LEAVE,
            &["a", "b"],
            "S",
            1,
            "",
            LIVE,
            "o",
            &fences,
        )
        .await;
    assert_eq!(gave, vec![2]);
    assert_eq!(r.get(&lock("a")).await, None);
    assert_eq!(r.get(&lock("b")).await, None);
}

#[tokio::test]
async fn a_claimed_set_grant_is_not_given_back_by_its_late_message() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    r.take("a", "X").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "S",
        TTL,
        &m,
        LIVE,
        "",
        "",
    )
    .await;
    messages(&sub, &mut rx).await;
    r.eval(scripts::RELEASE, &["a"], "X", 1, "", "", "", "")
        .await;
    let seen = messages(&sub, &mut rx).await;
    let fences = seen[0].split(' ').nth(4).expect("fences").to_owned();
    let claimed = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(claimed[0], 1);
    let none = r
        .eval(
            scripts::SET_LEAVE,
            &["a", "b"],
            "S",
            1,
            "",
            LIVE,
            "o",
            &fences,
        )
        .await;
    assert_eq!(none, vec![0]);
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("qS"));
    assert_eq!(r.get(&lock("b")).await.as_deref(), Some("qS"));
}

#[tokio::test]
async fn a_set_missing_from_one_queue_queues_again_at_the_back_of_all() {
    let (_s, r, _sub) = rig().await;
    r.take("a", "X").await;
    r.take("b", "Y").await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "S",
        TTL,
        &m,
        LIVE,
        "",
        "",
    )
    .await;
    let w = set_member(LIVE2, TTL, "W", &["a", "b"]);
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "W",
        TTL,
        &w,
        LIVE2,
        "",
        "",
    )
    .await;
    // S dropped from b's queue only (by hand): its next attempt puts it behind W in both.
    let _: i64 = cmd(
        &r.c,
        "ZREM",
        vec![format!("{}:q", lock("b")).into(), m.clone().into()],
    )
    .await;
    r.eval(
        scripts::SET_ACQUIRE,
        &["a", "b"],
        "S",
        TTL,
        &m,
        LIVE,
        "",
        "",
    )
    .await;
    assert_eq!(r.queue("a").await, vec![w.clone(), m.clone()]);
    assert_eq!(r.queue("b").await, vec![w.clone(), m.clone()]);
}

#[tokio::test]
async fn a_set_attempt_serves_a_free_keys_queue_first() {
    let (_s, r, sub) = rig().await;
    let mut rx = sub.message_rx();
    // a is free with W queued (its holder's lease ran out, say): W comes first.
    r.take("a", "X").await;
    let w = one_member(LIVE2, TTL, "W");
    r.eval(scripts::ACQUIRE, &["a"], "W", TTL, &w, LIVE2, "", "")
        .await;
    let _: i64 = cmd(&r.c, "DEL", vec![lock("a").into()]).await;
    messages(&sub, &mut rx).await;
    let m = set_member(LIVE, TTL, "S", &["a", "b"]);
    let got = r
        .eval(
            scripts::SET_ACQUIRE,
            &["a", "b"],
            "S",
            TTL,
            &m,
            LIVE,
            "",
            "",
        )
        .await;
    assert_eq!(got[0], 2, "{got:?}");
    assert_eq!(r.get(&lock("a")).await.as_deref(), Some("hW"));
    assert_eq!(r.queue("a").await, vec![m.clone()]);
    let seen = messages(&sub, &mut rx).await;
    assert!(
        seen.iter().any(|s| s.contains(&format!(":w:{LIVE2}: g2 "))),
        "{seen:?}"
    );
}
