//! Shared test fixture: a private `redis-server` per test on a free port, plus helpers.
#![allow(dead_code)]

pub mod alloc;
pub mod cluster;
pub mod latency;
pub mod runner;
pub mod scripts;
pub mod sentinel;
pub mod server_info;
pub mod worker;

use fred::prelude::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use waitlock::fred;

pub mod tls;

/// The binary to run: `$WAITLOCK_REDIS_SERVER` or `redis-server` on the PATH.
pub(crate) fn binary() -> String {
    std::env::var("WAITLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// A private `redis-server` (no persistence), killed on drop; its log is printed when the test
/// fails.
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    /// This server's own directory (removed on drop): a subdirectory per try in it.
    dir: PathBuf,
    /// The current try's directory: `--dir` and the log (kept across restarts).
    data: PathBuf,
    paused: bool,
    /// Extra `redis-server` arguments (kept for restarts).
    extra: Vec<String>,
    /// Listens with TLS only (`--port 0 --tls-port P`, the TLS settings in `extra`).
    tls_only: bool,
    /// The `redis-server` binary ([`binary`], or another: [`RedisServer::start_program`]).
    program: String,
}

/// Server arguments that take sharded pub/sub away (renamed to names no client knows), as on a
/// server without it: lockers must fall back to classic PUBLISH/SUBSCRIBE.
pub const WITHOUT_SHARDED_PUBSUB: [&str; 4] = [
    "--rename-command",
    "SSUBSCRIBE",
    "--rename-command",
    "SPUBLISH",
];

/// A new, empty directory under the temp dir, `<prefix>-<pid>-<n>`, unique by construction: `n`
/// counts up in this process, and a name left by an earlier process with the same pid (pids
/// are reused) is skipped, as `create_dir` refuses one that exists. (A port is no unique name:
/// the OS can hand out the same free port twice, and two servers then shared one directory,
/// a Cluster node refusing the other's `nodes.conf`.)
pub(crate) fn unique_dir(prefix: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return dir,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => panic!("could not create the test directory {}: {e}", dir.display()),
        }
    }
}

pub(crate) fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// A free port for a cluster node: at most 55,535, with its bus port (+ 10,000) free as well
/// (Redis refuses a higher port; the ephemeral range reaches 60,999).
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port <= 55_535 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A server without sharded pub/sub (see [`WITHOUT_SHARDED_PUBSUB`]).
    pub fn start_classic() -> RedisServer {
        let mut args = Vec::new();
        for pair in WITHOUT_SHARDED_PUBSUB.chunks(2) {
            args.push(pair[0].to_owned());
            args.push(pair[1].to_owned());
            args.push(format!("{}-renamed-away-{}", pair[1], std::process::id()));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        Self::start_with(&refs)
    }

    /// A server started with extra arguments.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_configured(extra, false)
    }

    /// A server run from `program` (another build than [`binary`]).
    #[allow(dead_code)]
    pub fn start_program(program: &str) -> RedisServer {
        Self::start_run(program, &[], false)
    }

    /// A server that speaks TLS only; `extra` must hold its TLS settings (see `tls.rs`).
    pub fn start_tls_only(extra: &[&str]) -> RedisServer {
        Self::start_configured(extra, true)
    }

    fn start_configured(extra: &[&str], tls_only: bool) -> RedisServer {
        Self::start_run(&binary(), extra, tls_only)
    }

    fn start_run(program: &str, extra: &[&str], tls_only: bool) -> RedisServer {
        let dir = unique_dir("waitlock-test");
        // A cluster node also listens on its port + 10,000 (the bus), so its port must be at most
        // 55,535 and that second port free too.
        let cluster = extra.contains(&"--cluster-enabled");
        // Each try in a directory of its own (a failed try is killed; its log stays, for the
        // message below, until the server is dropped): nothing one try wrote (a Cluster node's
        // `nodes.conf`) is read by the next.
        let mut s = RedisServer {
            child: None,
            port: 0,
            data: dir.clone(),
            dir,
            paused: false,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            tls_only,
            program: program.to_owned(),
        };
        const TRIES: usize = 10;
        for attempt in 0..TRIES {
            s.data = s.dir.join(format!("try-{attempt}"));
            std::fs::create_dir(&s.data).expect("create the try's directory");
            s.port = if cluster {
                free_cluster_port()
            } else {
                free_port()
            };
            if s.spawn() {
                return s;
            }
            s.kill();
        }
        let mut logs = String::new();
        for attempt in 0..TRIES {
            let data = s.dir.join(format!("try-{attempt}"));
            for entry in std::fs::read_dir(&data).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    logs.push_str(&format!("--- {} ---\n{text}\n", path.display()));
                }
            }
        }
        panic!("redis-server did not start on a free port after {TRIES} tries:\n{logs}");
    }

    /// Starts the process on `self.port`; true once its log says it accepts connections and it
    /// answers PING (a TLS-only server answers no plain-text PING: the log alone).
    fn spawn(&mut self) -> bool {
        let log = self.data.join(format!("redis-{}.log", self.port));
        let port = self.port.to_string();
        // (`--tls-port` only where needed: a redis-server built without TLS does not know it.)
        let ports: Vec<&str> = if self.tls_only {
            vec!["--port", "0", "--tls-port", &port]
        } else {
            vec!["--port", &port]
        };
        let child = Command::new(&self.program)
            .args(ports)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .arg("--dir")
            .arg(&self.data)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "`{}` was not found. These tests run a private Redis: install it with \
                 `sudo apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS), \
                 or set WAITLOCK_REDIS_SERVER to the binary's path.",
                self.program
            ),
            Err(e) => panic!("could not start `{}`: {e}", self.program),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(_)) = c.try_wait() {
                    self.child = None;
                    return false; // exited: port taken, most likely
                }
            }
            // Our own log first: a PING alone could be answered by another test's server
            // that took the port between `free_port` and this spawn.
            let ready = self.log().contains("Ready to accept connections")
                && (self.tls_only || self.ping());
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A raw PING over TCP.
    pub fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {sig} {} failed", self.pid());
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if self.paused {
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                self.paused = false;
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kill, then start again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    /// A client with a reconnect policy and a command timeout.
    pub async fn client(&self) -> Client {
        client_for(&self.url()).await
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data.join(format!("redis-{}.log", self.port)))
            .unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- redis-server log (port {}) ---\n{}",
                self.port,
                self.log()
            );
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub async fn client_for(url: &str) -> Client {
    let config = Config::from_url(url).expect("url");
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(2))
        .with_connection_config(|c| c.connection_timeout = Duration::from_secs(2))
        .set_policy(ReconnectPolicy::new_constant(0, 20))
        .build()
        .expect("client");
    client
        .init()
        .await
        .expect("connect to the test redis-server");
    client
}

/// Options that wait with a tight backoff (tests must not sleep for seconds).
pub fn tight() -> waitlock::LockOptions {
    waitlock::LockOptions::new().with_backoff(waitlock::Backoff::exponential(
        Duration::from_millis(2),
        Duration::from_millis(20),
    ))
}

/// Runs a Redis command via fred's `custom`.
pub async fn cmd<R: FromValue>(client: &Client, name: &'static str, args: Vec<Value>) -> R {
    let (head, rest) = match name.split_once(' ') {
        Some((h, r)) => (h, Some(r)),
        None => (name, None),
    };
    let mut all: Vec<Value> = rest
        .map(|r| r.split(' ').map(|s| Value::from(s.to_owned())).collect())
        .unwrap_or_default();
    all.extend(args);
    client
        .custom(
            fred::types::CustomCommand::new_static(head, None, false),
            all,
        )
        .await
        .expect(name)
}

/// As [`cmd`], but an error gives the default value (for servers that may be failing over).
pub async fn try_cmd<R: FromValue + Default>(
    client: &Client,
    name: &'static str,
    args: Vec<Value>,
) -> R {
    client
        .custom(
            fred::types::CustomCommand::new_static(name, None, false),
            args,
        )
        .await
        .unwrap_or_default()
}

/// Calls per command in the text of `INFO commandstats` (`cmdstat_<name>:calls=<n>,...`).
pub fn command_calls(info: &str) -> std::collections::HashMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// Channels subscribed on the server (sharded and classic), via PUBSUB SHARDCHANNELS/CHANNELS.
pub async fn lock_channels(client: &Client) -> usize {
    let sharded: Vec<String> = cmd(client, "PUBSUB SHARDCHANNELS", vec![]).await;
    let classic: Vec<String> = cmd(client, "PUBSUB CHANNELS", vec![]).await;
    sharded.len() + classic.len()
}

/// `CLIENT LIST` lines whose flags show a pub/sub connection (classic, pattern or sharded).
pub async fn pubsub_connections(client: &Client) -> usize {
    let list: String = cmd(client, "CLIENT LIST", vec![]).await;
    list.lines()
        .filter(|l| {
            l.split(' ').any(|f| {
                (f.starts_with("sub=") || f.starts_with("psub=") || f.starts_with("ssub="))
                    && !f.ends_with("=0")
            })
        })
        .count()
}

/// The Redis name of the lock on `key` (default prefix); every test names Redis keys through
/// these four, never by hand.
pub fn lock_key(key: &str) -> String {
    format!("{{{}{key}}}", waitlock::DEFAULT_PREFIX)
}

/// The Redis name of `key`'s fence counter.
pub fn fence_key(key: &str) -> String {
    format!("{}:fence", lock_key(key))
}

/// The Redis name of `key`'s waiter queue.
pub fn queue_key(key: &str) -> String {
    format!("{}:q", lock_key(key))
}

/// The Redis name of the hash of `key`'s waiting processes.
pub fn procs_key(key: &str) -> String {
    format!("{}:p", lock_key(key))
}

/// The Redis name of the leases of the semaphore on `key` (a sorted set: token → lease end).
pub fn permit_key(key: &str) -> String {
    format!("{}:s", lock_key(key))
}

/// The Redis name of the semaphore's state (`<permits> <held> <fence>`) on `key`.
pub fn permit_state_key(key: &str) -> String {
    format!("{}:fence", permit_key(key))
}

/// The Redis name of the semaphore's waiter queue on `key`.
pub fn permit_queue_key(key: &str) -> String {
    format!("{}:q", permit_key(key))
}

/// How many processes (subscriber connections) listen for grants on `key` now: its grant
/// channels, sharded or classic.
pub async fn listeners(client: &Client, key: &str) -> usize {
    let pattern = Value::from(format!("{}:w:*", lock_key(key)));
    let sharded: Vec<String> = cmd(client, "PUBSUB SHARDCHANNELS", vec![pattern.clone()]).await;
    let classic: Vec<String> = cmd(client, "PUBSUB CHANNELS", vec![pattern]).await;
    sharded.len() + classic.len()
}

/// Every key name on the server but the processes' labels (`{waitlock:labels}:<pid>`, one per
/// queued locker, kept while it lives), sorted: what locks and permits left behind.
pub async fn lock_names(client: &Client) -> Vec<String> {
    let mut names: Vec<String> = cmd(client, "KEYS *", vec![]).await;
    names.retain(|k| !k.starts_with("{waitlock:labels}:"));
    names.sort();
    names
}

/// The Redis a benchmark uses: `$REDIS_URL`, or a private server started here (returned, so
/// that it lives as long as the benchmark).
pub fn bench_redis() -> (Option<RedisServer>, String) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return (None, url);
    }
    let server = RedisServer::start();
    let url = server.url();
    (Some(server), url)
}

/// Takes `n` distinct keys `prefix-0..n` with `opts`, 64 at a time; keeps each alive when
/// `keep`.
pub async fn hold_many<S: waitlock::strategy::Strategy>(
    locker: &waitlock::Locker<S>,
    prefix: &str,
    n: usize,
    opts: &waitlock::LockOptions,
    keep: bool,
) -> Vec<waitlock::LockGuard> {
    let per = n.div_ceil(64).max(1);
    let mut tasks = Vec::new();
    for t in 0..n.div_ceil(per) {
        let (locker, opts, prefix) = (locker.clone(), opts.clone(), prefix.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for i in t * per..((t + 1) * per).min(n) {
                let mut g = locker
                    .acquire(&format!("{prefix}-{i}"), &opts)
                    .await
                    .expect("acquire a free key");
                if keep {
                    g.keep_alive();
                }
                guards.push(g);
            }
            guards
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.expect("task"));
    }
    all
}

/// How many waiters the Redis queue of `key` holds.
pub async fn queued(client: &Client, key: &str) -> i64 {
    cmd(client, "ZCARD", vec![Value::from(queue_key(key))]).await
}

/// Waits until `cond` holds, checking every millisecond, failing after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A queued locker on `url` (one server, a cluster or a Sentinel set: what the URL names).
pub async fn queued_locker(url: &str) -> waitlock::Locker<waitlock::Queue> {
    waitlock::Locker::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
        .queued()
        .build()
        .await
        .unwrap_or_else(|e| panic!("a queued locker on {url}: {e}"))
}

/// Waits until `count` (how many wait on `key` now) is `n`, checking every 2 ms; an error
/// after 30 s (a bound that holds on a busy machine) or when `count` fails.
pub async fn until_queued<F, Fut>(key: &str, n: usize, mut count: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<usize, String>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = count().await?;
        if now == n {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{key}: {now} waiters queued, not {n}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits until `key`'s lock queue holds `n` waiters (see [`until_queued`]).
pub async fn lock_queued<S: waitlock::strategy::Strategy>(
    locker: &waitlock::Locker<S>,
    key: &str,
    n: usize,
) -> Result<(), String> {
    until_queued(key, n, || async {
        let status = locker.status(key).await.map_err(|e| e.to_string())?;
        Ok(status.queued)
    })
    .await
}

/// Waits until `key`'s permit queue holds `n` waiters (see [`until_queued`]).
pub async fn permits_queued<S: waitlock::strategy::Strategy>(
    sem: &waitlock::Semaphore<S>,
    key: &str,
    n: usize,
) -> Result<(), String> {
    until_queued(key, n, || async {
        let status = sem.status(key).await.map_err(|e| e.to_string())?;
        Ok(status.queued)
    })
    .await
}

/// Nanoseconds as milliseconds, for reports.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Loads waitlock's Functions library on `client`'s server, as a deployer would
/// (`FUNCTION LOAD`, no `REPLACE`: the server must not have it), and checks the name it got.
pub async fn load_library(client: &Client) {
    let name: String = cmd(
        client,
        "FUNCTION",
        vec!["LOAD".into(), waitlock::scripts::library_code().into()],
    )
    .await;
    assert_eq!(name, waitlock::scripts::library_name());
}

/// Whether this build's Functions library is loaded on `client`'s server.
pub async fn has_library(client: &Client) -> bool {
    let listed: Value = cmd(
        client,
        "FUNCTION",
        vec![
            "LIST".into(),
            "LIBRARYNAME".into(),
            waitlock::scripts::library_name().into(),
        ],
    )
    .await;
    matches!(&listed, Value::Array(libs) if libs.len() == 1)
}

/// The server's `INFO commandstats` figures for FCALL (`calls=..,failed_calls=..`; empty
/// before the first).
pub async fn fcall_stats(client: &Client) -> String {
    let info: String = cmd(client, "INFO commandstats", vec![]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_fcall:"))
        .unwrap_or_default()
        .to_owned()
}

/// Script calls Redis has run (FCALL of the library, EVALSHA and EVAL), from INFO
/// commandstats.
pub async fn script_calls(admin: &Client) -> u64 {
    let info: String = cmd(admin, "INFO commandstats", vec![]).await;
    let calls = command_calls(&info);
    ["fcall", "evalsha", "eval"]
        .iter()
        .filter_map(|c| calls.get(*c))
        .sum()
}

/// Wall-clock nanoseconds since the epoch: comparable across the processes of one host.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// An environment variable, empty when unset (worker processes are configured this way).
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_default()
}

/// A numeric environment variable, 0 when unset or not a number.
pub fn env_num(name: &str) -> u64 {
    env(name).parse().unwrap_or(0)
}

/// A fixed-seed xorshift sequence: cancellation points that are random but reproducible.
pub struct Seeded(u64);

impl Seeded {
    pub fn new(seed: u64) -> Seeded {
        Seeded(seed.max(1))
    }

    /// A duration in `[0, max)`.
    pub fn below(&mut self, max: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Duration::from_nanos(self.0 % (max.as_nanos() as u64).max(1))
    }
}

/// Takes `n` locks named `{prefix}-0` … with `locker`, and keeps them.
pub async fn hold_keys(
    locker: &waitlock::Locker,
    prefix: &str,
    n: usize,
) -> Vec<waitlock::LockGuard> {
    let mut held = Vec::with_capacity(n);
    for k in 0..n {
        let key = format!("{prefix}-{k}");
        held.push(
            locker
                .acquire(&key, &waitlock::LockOptions::new())
                .await
                .expect("hold"),
        );
    }
    held
}

/// What a fence-checking store does: accept a write only with a fence at least as high as the
/// highest it has seen for the key (in memory, for tests that check fences in-process).
#[derive(Default)]
pub struct FencedStore(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl FencedStore {
    /// Whether a write of `key` with `fence` is accepted.
    pub fn write(&self, key: &str, fence: u64) -> bool {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let seen = m.entry(key.to_owned()).or_insert(0);
        let ok = fence >= *seen;
        if ok {
            *seen = fence;
        }
        ok
    }
}

/// This process's CPU time (user + system) in µs, from /proc/self/stat (10 ms resolution;
/// Linux). For the benchmarks.
pub fn cpu_us() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 after the name.
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    ticks * 10_000 // CLK_TCK = 100 on Linux
}

/// Handoff gaps in ms, sorted: each acquisition's time after the release that preceded it,
/// from a log of (acquired at, release started at) in ns, the first after `released_first`.
pub fn handoff_gaps(log: &mut [(u64, u64)], released_first: u64) -> Vec<f64> {
    log.sort();
    let mut gaps = Vec::with_capacity(log.len());
    let mut last_release = released_first;
    for (at, release) in log.iter() {
        gaps.push(at.saturating_sub(last_release) as f64 / 1e6);
        last_release = *release;
    }
    gaps.sort_by(f64::total_cmp);
    gaps
}

/// The `p` quantile (0..=1) of sorted values, the nearest rank; NaN when there are none.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The fence-checking store (on a second Redis, never faulted): refuses a read or write whose
/// fence is below the highest it has seen. KEYS: counter, max fence, accepted writes. ARGV:
/// fence, "read" | "write", value. Reply: -1 refused, else the value read / 1.
const STORE_LUA: &str = r#"
local max = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < max then return -1 end
redis.call('SET', KEYS[2], ARGV[1])
if ARGV[2] == 'read' then return tonumber(redis.call('GET', KEYS[1]) or '0') end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('INCR', KEYS[3])
return 1
"#;

/// One fenced operation on the store: `op` "read" or "write" (of `value`) on the store keys
/// `keys` (counter, max fence, accepted writes), with `fence`. -1 when the store refused it.
#[allow(dead_code)]
pub async fn store_op(store: &Client, keys: Vec<String>, fence: u64, op: &str, value: i64) -> i64 {
    store
        .eval::<i64, _, _, _>(
            STORE_LUA,
            keys,
            vec![fence.to_string(), op.to_owned(), value.to_string()],
        )
        .await
        .expect("the store is never faulted")
}

/// `b`'s `weight` permits of `key` as soon as they are free (one attempt every 5 ms), after
/// checking that `a`'s guard, whose lease is over, no longer reads valid once `b` holds.
#[allow(dead_code)]
pub async fn take_over_permit<S: waitlock::strategy::Strategy>(
    b: &waitlock::Semaphore<S>,
    key: &str,
    opts: &waitlock::LockOptions,
    a: &waitlock::LockGuard,
) -> waitlock::LockGuard {
    let gb = loop {
        match b.acquire(key, 1, opts).await {
            Ok(g) => break g,
            Err(waitlock::Error::Locked { .. }) => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            Err(e) => panic!("b: {e}"),
        }
    };
    let now = tokio::time::Instant::now();
    assert!(
        a.valid_until() <= now,
        "two valid holders of one permit: a's guard says valid for {:?} more",
        a.valid_until().saturating_duration_since(now)
    );
    gb
}
