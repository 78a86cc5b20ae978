//! The scripts' row tables, one harness for the lock's and the permits': each row sets a key's
//! Redis state up by hand, runs one script with the arguments the library sends, and checks the
//! reply, the keys afterwards and the messages published on the grant channels. Also `Raw`, a
//! script caller for the tests that drive a sequence of calls.

use super::RedisServer;
use waitlock::fred::prelude::*;
use waitlock::fred::types::CustomCommand;

/// Two processes that listen on their grant channels, and one that does not.
pub const LIVE: &str = "aaaaaaaaaaaa";
pub const LIVE2: &str = "bbbbbbbbbbbb";
pub const DEAD: &str = "dddddddddddd";

/// A key's Redis names in a table (`{L}`, `{F}`, `{Q}`, `{P}`, `{X}` in setups), and what the
/// scripts of its kind take beyond the common arguments.
pub struct Kind {
    /// The key (a lock; a semaphore's holders): KEYS[1], `{L}`.
    pub main: &'static str,
    /// Its state (a lock's fence counter; a semaphore's state): KEYS[2], `{F}`.
    pub state: &'static str,
    pub queue: &'static str,
    pub procs: &'static str,
    /// A semaphore's holder fences (KEYS[5], `{X}`), if any.
    pub fences: Option<&'static str>,
    /// ARGV after the nine common ones (a semaphore's number of permits).
    pub extra: &'static [&'static str],
}

impl Kind {
    fn keys(&self) -> Vec<&'static str> {
        let mut k = vec![self.main, self.state, self.queue, self.procs];
        k.extend(self.fences);
        k
    }
}

/// One script call's arguments, as the library sends them.
#[derive(Clone, Copy)]
pub struct Args {
    pub token: &'static str,
    pub ttl: u64,
    pub member: &'static str,
    /// The caller's process id.
    pub pid: &'static str,
    pub flag: &'static str,
    pub fence: &'static str,
    /// The presence window, ms (a record younger than a quarter of it is not written again).
    pub presence: u64,
}

pub const fn args(token: &'static str) -> Args {
    Args {
        token,
        ttl: 10_000,
        member: "",
        pid: "",
        flag: "",
        fence: "",
        presence: 100,
    }
}

/// What a row expects after its call.
pub enum Check {
    /// The value of a key (`None`: absent).
    Get(&'static str, Option<&'static str>),
    /// The state key holds a fence from Redis' clock (microseconds, at least the row's start)
    /// first, followed by this text.
    FenceNow(&'static str),
    /// The main key's PTTL in ms is within this range.
    Pttl(u64, u64),
    /// A key's PTTL in ms is within this range.
    Ttl(&'static str, u64, u64),
    /// The state key's PTTL in ms is within this range.
    FencePttl(u64, u64),
    /// The queue holds exactly these members, in order.
    Queue(&'static [&'static str]),
    /// A field of the processes hash (`None`: absent; `Some("now")`: a recent time;
    /// `Some("{young}")`: the setup's `{young}`, not written again).
    Process(&'static str, Option<&'static str>),
    /// The member a watcher field (`!w1`, `!w2`) names (`None`: no watcher).
    Watcher(&'static str, Option<&'static str>),
    /// Messages published on the listeners' grant channels, in order, by prefix
    /// (`"<pid>: <text>"`).
    Messages(&'static [&'static str]),
    /// A member's lease in the holders (a semaphore's main key): its score, in ms from the
    /// row's start, within this range (`None`: no lease).
    Lease(&'static str, Option<(u64, u64)>),
    /// A field of a hash (`None`: absent).
    HGet(&'static str, &'static str, Option<&'static str>),
    /// Redis ran this many commands for the call, the `EVAL` included (`INFO commandstats`:
    /// what issue 36 counts per path; a change that adds one fails here).
    Commands(u64),
}

pub struct Row {
    pub name: &'static str,
    /// Commands run before the call; `{now}` is Redis' clock in ms, `{old}` ten seconds ago,
    /// `{young}` one second ago (young for a presence window of a minute),
    /// `{soon}` in five seconds, `{far}` in 5,000 s (an expiry hint '!e' no call of a row needs
    /// to move), `{future}` in ten minutes (a record made before Redis' clock
    /// stepped back); `{queue:N}` adds N waiters of the dead process at the head; `_` inside a
    /// word stands for a space (queue members hold spaces).
    pub setup: &'static [&'static str],
    pub script: &'static str,
    pub call: Args,
    /// The reply; `_` matches any number at that place.
    pub reply: &'static str,
    pub checks: &'static [Check],
}

/// How old the setups' `{young}` record is, ms.
const YOUNG_AGE_MS: u64 = 1_000;

fn words(kind: &Kind, cmd: &str, now_ms: u64) -> Vec<String> {
    cmd.replace("{L}", kind.main)
        .replace("{F}", kind.state)
        .replace("{Q}", kind.queue)
        .replace("{P}", kind.procs)
        .replace("{X}", kind.fences.unwrap_or("{X}"))
        .replace("{now}", &now_ms.to_string())
        .replace("{old}", &(now_ms - 10_000).to_string())
        .replace("{young}", &(now_ms - YOUNG_AGE_MS).to_string())
        .replace("{soon}", &(now_ms + 5_000).to_string())
        .replace("{future}", &(now_ms + 600_000).to_string())
        .replace("{far}", &(now_ms + 5_000_000).to_string())
        .split(' ')
        .map(|w| w.replace('_', " "))
        .collect()
}

/// A subscriber connection to `server`, connected (for the grant channels' messages).
pub async fn subscriber(server: &RedisServer) -> waitlock::fred::clients::SubscriberClient {
    let sub = waitlock::fred::clients::SubscriberClient::new(
        Config::from_url(&server.url()).expect("url"),
        None,
        None,
        None,
    );
    sub.init().await.expect("subscriber");
    sub
}

/// Runs one command given as words.
pub async fn run(c: &Client, words: Vec<String>) -> Value {
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

async fn now_ms(c: &Client) -> u64 {
    let time: Vec<String> = c
        .custom(
            CustomCommand::new_static("TIME", None, false),
            Vec::<String>::new(),
        )
        .await
        .expect("TIME");
    time[0].parse::<u64>().expect("secs") * 1000 + time[1].parse::<u64>().expect("us") / 1000
}

async fn hget(c: &Client, key: &str, field: &str) -> Option<String> {
    c.custom(
        CustomCommand::new_static("HGET", None, false),
        vec![key, field],
    )
    .await
    .expect("HGET")
}

/// The library's function for the script `text` (one of `waitlock::scripts`' lock and permit
/// scripts).
fn function_of(text: &str) -> String {
    use waitlock::scripts::*;
    let stems = [
        (ACQUIRE, "acquire"),
        (EXTEND, "extend"),
        (RELEASE, "release"),
        (LEAVE, "leave"),
        (STATUS, "status"),
        (SET_ACQUIRE, "set_acquire"),
        (SET_RELEASE, "set_release"),
        (SET_LEAVE, "set_leave"),
        (PERMIT_ACQUIRE, "permit_acquire"),
        (PERMIT_EXTEND, "permit_extend"),
        (PERMIT_RELEASE, "permit_release"),
        (PERMIT_LEAVE, "permit_leave"),
        (PERMIT_STATUS, "permit_status"),
    ];
    let stem = stems
        .iter()
        .find(|(t, _)| *t == text)
        .map(|(_, stem)| *stem)
        .expect("a lock or permit script");
    function_name(stem)
}

/// Runs every row of `rows` against a fresh private server, with `LIVE` and `LIVE2` listening
/// on their grant channels of `kind`'s key (sharded, as the lockers do): every row by `EVAL`
/// of its script, then every row again by `FCALL` of its function in the library (loaded once:
/// what a call leaves in the library's variables must not reach the next row).
pub async fn run_rows(kind: &Kind, rows: impl IntoIterator<Item = &Row>) {
    let server = RedisServer::start();
    let c = server.client().await;
    super::load_library(&c).await;
    let rows: Vec<&Row> = rows.into_iter().collect();
    for fcall in [false, true] {
        run_rows_by(kind, &rows, &server, &c, fcall).await;
    }
}

async fn run_rows_by(kind: &Kind, rows: &[&Row], server: &RedisServer, c: &Client, fcall: bool) {
    let c = c.clone();
    let via = if fcall { "FCALL" } else { "EVAL" };
    // (Shown with a failing row's message.)
    eprintln!("the rows, each by {via}");
    let sub = subscriber(server).await;
    let mut messages = sub.message_rx();
    for pid in [LIVE, LIVE2] {
        sub.ssubscribe(format!("{}:w:{pid}", kind.main))
            .await
            .expect("ssubscribe");
    }
    for row in rows {
        let _: Value = run(&c, vec!["FLUSHALL".into()]).await;
        let now_ms = now_ms(&c).await;
        for cmd in row.setup {
            if let Some(n) = cmd.strip_prefix("{queue:") {
                let n: usize = n.trim_end_matches('}').parse().expect("count");
                for i in 0..n {
                    let _: Value = run(
                        &c,
                        vec![
                            "ZADD".into(),
                            kind.queue.into(),
                            i.to_string(),
                            format!("{DEAD} 20000 dead{i}"),
                        ],
                    )
                    .await;
                }
                continue;
            }
            let _: Value = run(&c, words(kind, cmd, now_ms)).await;
        }
        while messages.try_recv().is_ok() {}
        let a = row.call;
        let mut argv: Vec<String> = vec![
            a.token.into(),
            a.ttl.to_string(),
            "3600000".into(),
            "500".into(),
            a.presence.to_string(),
            a.member.into(),
            a.pid.into(),
            a.flag.into(),
            a.fence.into(),
        ];
        argv.extend(kind.extra.iter().map(|s| s.to_string()));
        let count = row.checks.iter().any(|c| matches!(c, Check::Commands(_)));
        if count {
            let _: Value = run(&c, vec!["CONFIG".into(), "RESETSTAT".into()]).await;
        }
        let reply: std::result::Result<Vec<i64>, _> = if fcall {
            c.fcall(function_of(row.script), kind.keys(), argv).await
        } else {
            c.eval(row.script, kind.keys(), argv).await
        };
        let reply = reply.unwrap_or_else(|e| panic!("{} ({via}): {e}", row.name));
        // Every command since the reset but the reset itself (and any INFO).
        let commands: u64 = if count {
            let info: String = super::cmd(&c, "INFO commandstats", vec![]).await;
            let calls = super::command_calls(&info);
            if std::env::var_os("WAITLOCK_SHOW_COMMANDS").is_some() {
                eprintln!("{}: {calls:?}", row.name);
            }
            calls
                .iter()
                .filter(|(name, _)| !name.starts_with("config") && name.as_str() != "info")
                .map(|(_, n)| n)
                .sum()
        } else {
            0
        };
        assert!(
            matches(&reply, row.reply),
            "{} ({via}): reply {reply:?}, expected {}",
            row.name,
            row.reply
        );
        // A PING on the subscriber comes back after every message published before it.
        let _: Value = sub.ping(None).await.expect("ping");
        let mut seen = Vec::new();
        while let Ok(m) = messages.try_recv() {
            let pid = m.channel.rsplit(':').next().unwrap_or_default().to_owned();
            seen.push(format!("{pid}: {}", m.value.as_str().unwrap_or_default()));
        }
        for check in row.checks {
            if let Check::Commands(want) = check {
                assert_eq!(commands, *want, "{} ({via}): commands Redis ran", row.name);
                continue;
            }
            check_one(&c, kind, row, check, now_ms, &seen).await;
        }
    }
}

async fn check_one(
    c: &Client,
    kind: &Kind,
    row: &Row,
    check: &Check,
    now_ms: u64,
    seen: &[String],
) {
    let in_range = |t: i64, lo: &u64, hi: &u64| (*lo as i64..=*hi as i64).contains(&t);
    match check {
        Check::Get(key, want) => {
            let v: Option<String> = c.get(*key).await.expect("GET");
            assert_eq!(v.as_deref(), *want, "{}: {key}", row.name);
        }
        Check::FenceNow(rest) => {
            let v: Option<String> = c.get(kind.state).await.expect("GET");
            let v = v.unwrap_or_default();
            let (num, tail) = v.split_at(v.find(' ').unwrap_or(v.len()));
            let f: u64 = num.parse().unwrap_or(0);
            assert!(
                f >= now_ms * 1000 && tail == *rest,
                "{}: state {v:?}, expected a fence from Redis' clock (>= {}) and {rest:?}",
                row.name,
                now_ms * 1000
            );
        }
        Check::Pttl(lo, hi) => {
            let t: i64 = c.pttl(kind.main).await.expect("PTTL");
            assert!(
                in_range(t, lo, hi),
                "{}: PTTL {t}, not in {lo}..={hi}",
                row.name
            );
        }
        Check::Ttl(key, lo, hi) => {
            let t: i64 = c.pttl(*key).await.expect("PTTL");
            assert!(
                in_range(t, lo, hi),
                "{}: {key} PTTL {t}, not in {lo}..={hi}",
                row.name
            );
        }
        Check::FencePttl(lo, hi) => {
            let t: i64 = c.pttl(kind.state).await.expect("PTTL");
            assert!(
                in_range(t, lo, hi),
                "{}: state PTTL {t}, not in {lo}..={hi}",
                row.name
            );
        }
        Check::Queue(want) => {
            let q: Vec<String> = c
                .custom(
                    CustomCommand::new_static("ZRANGE", None, false),
                    vec![kind.queue, "0", "-1"],
                )
                .await
                .expect("ZRANGE");
            assert_eq!(q, want.to_vec(), "{}: queue", row.name);
        }
        Check::Process(field, want) => {
            let v = hget(c, kind.procs, field).await;
            match want {
                Some("now") => {
                    let t: u64 = v.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
                    assert!(
                        t + 1_000 >= now_ms,
                        "{}: process {field} recorded at {v:?}, not now ({now_ms})",
                        row.name
                    );
                }
                Some("{young}") => assert_eq!(
                    v,
                    Some((now_ms - YOUNG_AGE_MS).to_string()),
                    "{}: process {field} written again",
                    row.name
                ),
                other => assert_eq!(v.as_deref(), *other, "{}: process {field}", row.name),
            }
        }
        Check::Watcher(field, want) => {
            let v = hget(c, kind.procs, field).await;
            let member = v.as_deref().and_then(|v| v.split_once(' ')).map(|(_, m)| m);
            assert_eq!(member, *want, "{}: watcher {field} ({v:?})", row.name);
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
        Check::Lease(member, want) => {
            let score: Option<f64> = c
                .custom(
                    CustomCommand::new_static("ZSCORE", None, false),
                    vec![kind.main, *member],
                )
                .await
                .expect("ZSCORE");
            match (score, want) {
                (None, None) => {}
                (Some(s), Some((lo, hi))) => {
                    // Redis' clock now, not at the row's start: the script ran since.
                    let left = s as i64 - self::now_ms(c).await as i64;
                    assert!(
                        in_range(left, lo, hi),
                        "{}: lease of {member} ends in {left} ms, not in {lo}..={hi}",
                        row.name
                    );
                }
                (got, _) => panic!(
                    "{}: lease of {member}: {got:?}, expected {want:?}",
                    row.name
                ),
            }
        }
        Check::HGet(key, field, want) => {
            let v = hget(c, key, field).await;
            assert_eq!(v.as_deref(), *want, "{}: {key} {field}", row.name);
        }
        // (counted right after the call, in `run_rows`)
        Check::Commands(_) => {}
    }
}

/// A script caller for tests that drive a sequence of calls on one key, with a subscriber
/// listening as process `pid` (a grant skips waiters nobody listens for). `permits`: a
/// semaphore's key of that many permits; 0: a lock.
pub struct Raw {
    pub admin: Client,
    _listener: Client,
    keys: Vec<String>,
    retention_ms: u64,
    permits: u32,
}

impl Raw {
    pub async fn new(
        server: &RedisServer,
        key: &str,
        pid: &str,
        retention_ms: u64,
        permits: u32,
    ) -> Raw {
        let admin = server.client().await;
        let listener = server.client().await;
        let base = if permits > 0 {
            format!("{{waitlock:{key}}}:s")
        } else {
            format!("{{waitlock:{key}}}")
        };
        let channel = format!("{base}:w:{pid}");
        listener
            .subscribe(channel.clone())
            .await
            .expect("subscribe");
        // fred's subscribe can return before another connection's script counts it.
        let start = std::time::Instant::now();
        loop {
            let n: Vec<Value> =
                super::cmd(&admin, "PUBSUB NUMSUB", vec![channel.clone().into()]).await;
            if n.get(1).and_then(Value::as_i64) == Some(1) {
                break;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "never subscribed"
            );
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let mut keys = vec![
            base.clone(),
            format!("{base}:fence"),
            format!("{base}:q"),
            format!("{base}:p"),
        ];
        if permits > 0 {
            keys.push(format!("{base}:f"));
        }
        Raw {
            admin,
            _listener: listener,
            keys,
            retention_ms,
            permits,
        }
    }

    /// One script call: `member` names its process first (or is empty).
    pub async fn eval(
        &self,
        script: &'static str,
        token: &str,
        ttl_ms: u64,
        member: &str,
        flag: &str,
        fence: &str,
    ) -> Vec<i64> {
        self.call(script, token, ttl_ms, member, flag, fence).await
    }

    /// A semaphore's status counts: permits, held, holders, queued, first lease end, fence (the
    /// leases listed after them are left out).
    pub async fn status(&self) -> Vec<i64> {
        let reply: Vec<Value> = self
            .call(waitlock::scripts::PERMIT_STATUS, "-", 1, "", "", "")
            .await;
        reply[..6]
            .iter()
            .map(|v| v.as_i64().expect("a count"))
            .collect()
    }

    async fn call<R: waitlock::fred::types::FromValue>(
        &self,
        script: &'static str,
        token: &str,
        ttl_ms: u64,
        member: &str,
        flag: &str,
        fence: &str,
    ) -> R {
        let mut args: Vec<Value> = vec![script.into(), (self.keys.len() as i64).into()];
        for k in &self.keys {
            args.push(k.clone().into());
        }
        let pid = member.split(' ').next().unwrap_or("");
        let (ttl, retention, permits) = (
            ttl_ms.to_string(),
            self.retention_ms.to_string(),
            self.permits.to_string(),
        );
        for a in [
            token, &ttl, &retention, "500", "100", member, pid, flag, fence,
        ] {
            args.push(a.into());
        }
        if self.permits > 0 {
            args.push(permits.into());
        }
        super::cmd::<R>(&self.admin, "EVAL", args).await
    }
}
