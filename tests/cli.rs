//! The `waitlock` binary as a process, against a private redis-server per test.
//!
//! Synchronisation is by events (a line in a file, a message on stderr), each awaited with a
//! deadline; every process a test starts is killed by pid if the test fails.

mod common;

use common::tls::TlsRedis;
use common::RedisServer;
use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_waitlock");
/// Long enough for a loaded 2-core machine; never reached when things work.
const LIMIT: Duration = Duration::from_secs(20);

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("waitlock-cli-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path(name)).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `waitlock` with the test server's URL, in `dir`, with none of the caller's WAITLOCK_*.
fn waitlock(server: &RedisServer, dir: &Scratch) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(&dir.0)
        .env("REDIS_URL", server.url())
        .env("WL", BIN)
        .env_remove("WAITLOCK_KEY")
        .env_remove("WAITLOCK_FENCE")
        .env_remove("WAITLOCK_TOKEN")
        .stdin(Stdio::null());
    c
}

/// Runs to completion (bounded by `LIMIT`) and returns the output. Only for commands that
/// leave no background process holding the pipes.
fn output(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waitlock");
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            kill_tree(&mut child);
            panic!("waitlock did not exit within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("output")
}

/// Kills a still running waitlock and its command's process group, by pid.
fn kill_tree(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        // The command leads its own group, a child of waitlock: kill those groups too.
        let pid = child.id();
        let children =
            fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let _ = child.kill();
        for c in children.split_whitespace() {
            // The group, and the child itself should it not lead one.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{c}"), c])
                .stderr(Stdio::null())
                .status();
        }
        let _ = child.wait();
    }
}

/// A running `waitlock`: on drop (a failed test), its command's process group and itself
/// are killed by pid.
struct Spawned {
    child: Child,
    stderr: PathBuf,
}

impl Spawned {
    /// Starts `c` with its stderr going to `dir/<name>` (read it with `stderr()`).
    fn start(mut c: Command, dir: &Scratch, name: &str) -> Spawned {
        c.stdout(Stdio::null());
        Self::start_keeping_stdout(c, dir, name)
    }

    /// As `start`, with the stdout `c` was given.
    fn start_keeping_stdout(mut c: Command, dir: &Scratch, name: &str) -> Spawned {
        let path = dir.path(name);
        let file = fs::File::create(&path).expect("stderr file");
        let child = c.stderr(file).spawn().expect("spawn waitlock");
        Spawned {
            child,
            stderr: path,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for exit, at most `LIMIT` (then the drop kills it).
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "waitlock did not exit within {LIMIT:?}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends `sig` (e.g. "-TERM") to waitlock itself.
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.pid().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} {}", self.pid());
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        kill_tree(&mut self.child);
    }
}

/// Waits until `dir/name` satisfies `cond`; returns its content.
fn await_file(dir: &Scratch, name: &str, what: &str, cond: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + LIMIT;
    loop {
        let s = dir.read(name);
        if cond(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {LIMIT:?} waiting for {what}; {name} holds {s:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until a spawned waitlock's stderr contains `needle`.
fn await_stderr(p: &Spawned, needle: &str) {
    let deadline = Instant::now() + LIMIT;
    while !p.stderr().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {needle:?} on stderr; it holds {:?}",
            p.stderr()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A command that writes its start, then holds the lock until `go` exists.
const HOLD_UNTIL_GO: &str = r#"echo "start $$ $WAITLOCK_FENCE" >> log; echo "$WAITLOCK_TOKEN" > token
while [ ! -e go ]; do sleep 0.01; done
echo "end $$" >> log"#;

/// Starts a `waitlock run KEY -- sh -c HOLD_UNTIL_GO` and waits until it holds the lock.
fn hold(server: &RedisServer, dir: &Scratch, key: &str) -> Spawned {
    hold_with(server, dir, &[], key)
}

/// As `hold`, with `options` to `run` (e.g. `--limit 2`: it holds a permit).
fn hold_with(server: &RedisServer, dir: &Scratch, options: &[&str], key: &str) -> Spawned {
    let mut c = waitlock(server, dir);
    c.arg("run")
        .args(options)
        .args([key, "--", "sh", "-c", HOLD_UNTIL_GO]);
    let p = Spawned::start(c, dir, "holder.err");
    await_file(dir, "log", "the holder's start line", |s| {
        s.contains("start")
    });
    p
}

fn status_json(server: &RedisServer, dir: &Scratch, key: &str) -> serde_json::Value {
    let mut c = waitlock(server, dir);
    c.args(["status", "--json", key]);
    let out = output(c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Start and end lines of each run, in file order: never interleaved, each run whole.
fn assert_serial(log: &str, runs: usize) {
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2 * runs, "log:\n{log}");
    let mut pids = Vec::new();
    for pair in lines.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let end: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(start[0], "start", "log:\n{log}");
        assert_eq!(end[0], "end", "log:\n{log}");
        assert_eq!(start[1], end[1], "interleaved runs; log:\n{log}");
        pids.push(start[1].to_owned());
    }
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), runs, "log:\n{log}");
}

#[test]
fn a_second_run_waits_for_the_first_and_then_runs() {
    let server = RedisServer::start();
    let dir = Scratch::new("serial");
    let mut first = hold(&server, &dir, "nightly-report");

    let mut c = waitlock(&server, &dir);
    c.args([
        "run",
        "--wait",
        "15s",
        "nightly-report",
        "--",
        "sh",
        "-c",
        HOLD_UNTIL_GO,
    ]);
    let mut second = Spawned::start(c, &dir, "second.err");
    await_stderr(&second, "waiting up to 15.0 s");
    assert!(
        !dir.read("log").contains("end"),
        "first ended before go: {}",
        dir.read("log")
    );
    fs::write(dir.path("go"), "").expect("go");

    assert_eq!(first.wait().code(), Some(0), "{}", first.stderr());
    assert!(second.wait().success(), "{}", second.stderr());
    assert_serial(&dir.read("log"), 2);
    let stderr = second.stderr();
    assert!(
        stderr.contains("waited") && stderr.contains("for 'nightly-report'"),
        "{stderr}"
    );
}

#[test]
fn concurrent_runs_never_interleave() {
    let server = RedisServer::start();
    let dir = Scratch::new("concurrent");
    let script = r#"echo "start $$" >> log; sleep 0.05; echo "end $$" >> log"#;
    let runs: Vec<Spawned> = (0..4)
        .map(|i| {
            let mut c = waitlock(&server, &dir);
            c.args(["run", "--wait", "15s", "k", "--", "sh", "-c", script]);
            Spawned::start(c, &dir, &format!("run{i}.err"))
        })
        .collect();
    for mut r in runs {
        assert!(r.wait().success(), "{}", r.stderr());
    }
    assert_serial(&dir.read("log"), 4);
}

#[test]
fn a_held_key_gives_the_conflict_code_without_running_the_command() {
    let server = RedisServer::start();
    let dir = Scratch::new("conflict");
    let mut holder = hold(&server, &dir, "job");
    let marker = "echo ran > marker";

    let mut c = waitlock(&server, &dir);
    c.args(["run", "--nonblock", "job", "--", "sh", "-c", marker]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("'job' is held"),
        "{}",
        stderr_of(&out)
    );

    let mut c = waitlock(&server, &dir);
    c.args([
        "-q", "run", "-n", "-E", "42", "job", "--", "sh", "-c", marker,
    ]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(42));
    assert_eq!(stderr_of(&out), "", "-q prints nothing for a conflict");

    let mut c = waitlock(&server, &dir);
    c.args(["run", "--wait", "200ms", "job", "--", "sh", "-c", marker]);
    let started = Instant::now();
    let out = output(c);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(took >= Duration::from_millis(200), "gave up after {took:?}");
    assert!(took < Duration::from_secs(5), "gave up after {took:?}");
    assert!(
        stderr_of(&out).contains("gave up on 'job' after waiting 0.2 s"),
        "{}",
        stderr_of(&out)
    );

    assert!(
        !dir.path("marker").exists(),
        "a command ran without the lock"
    );
    fs::write(dir.path("go"), "").expect("go");
    assert!(holder.wait().success());
}

#[test]
fn a_signal_while_waiting_ends_the_wait_without_running_the_command() {
    let server = RedisServer::start();
    let dir = Scratch::new("waitsignal");
    let mut holder = hold(&server, &dir, "k");
    let mut c = waitlock(&server, &dir);
    c.args([
        "run",
        "--wait",
        "15s",
        "k",
        "--",
        "sh",
        "-c",
        "echo ran > marker",
    ]);
    let mut waiter = Spawned::start(c, &dir, "waiter.err");
    await_stderr(&waiter, "waiting up to");
    waiter.signal("-INT");
    assert_eq!(waiter.wait().code(), Some(128 + 2), "{}", waiter.stderr());
    assert!(
        waiter.stderr().contains("got SIGINT while waiting for 'k'"),
        "{}",
        waiter.stderr()
    );
    fs::write(dir.path("go"), "").expect("go");
    assert!(holder.wait().success());
    assert!(!dir.path("marker").exists(), "the command ran after all");
}

#[test]
fn verbose_shows_the_librarys_log_and_quiet_only_errors() {
    let server = RedisServer::start();
    let dir = Scratch::new("verbose");
    let mut c = waitlock(&server, &dir);
    c.args(["--verbose", "run", "k", "--", "true"]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr_of(&out).contains("acquired"), "{}", stderr_of(&out));

    let mut c = waitlock(&server, &dir);
    c.args(["run", "-q", "k", "--", "no-such-command-for-waitlock"]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr_of(&out).contains("command not found"),
        "errors still print"
    );
}

#[test]
fn a_lost_lock_terminates_the_commands_group_and_exits_75() {
    let server = RedisServer::start();
    let dir = Scratch::new("lost");
    // The command releases its own lock as an operator would, then waits on a grandchild:
    // SIGTERM must reach both (the trap runs once the grandchild is gone).
    let script = r#"trap 'echo term >> log; exit 0' TERM
"$WL" release "$WAITLOCK_KEY" --token "$WAITLOCK_TOKEN" 2>> log
sleep 10 & wait"#;
    let mut c = waitlock(&server, &dir);
    c.args([
        "run", "--ttl", "300ms", "--grace", "5s", "lost", "--", "sh", "-c", script,
    ]);
    let mut p = Spawned::start(c, &dir, "run.err");
    let started = Instant::now();
    let code = p.wait().code();
    let stderr = p.stderr();
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the grandchild kept it alive"
    );
    assert!(
        dir.read("log").contains("released 'lost'"),
        "{}",
        dir.read("log")
    );
    assert!(
        dir.read("log").contains("term"),
        "no SIGTERM: {}",
        dir.read("log")
    );
    assert!(stderr.contains("lock on 'lost' lost after"), "{stderr}");
    assert!(!stderr.contains("sending SIGKILL"), "{stderr}");
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let server = RedisServer::start();
    let dir = Scratch::new("grace");
    // `sleep` inherits the ignored TERM: only SIGKILL to the group ends it.
    let script = r#"trap '' TERM; echo $$ > pgid
"$WL" -q release "$WAITLOCK_KEY" --token "$WAITLOCK_TOKEN"
sleep 10; echo survived >> log"#;
    let mut c = waitlock(&server, &dir);
    c.args([
        "run", "--ttl", "300ms", "--grace", "400ms", "stubborn", "--", "sh", "-c", script,
    ]);
    let mut p = Spawned::start(c, &dir, "run.err");
    let pgid = await_file(&dir, "pgid", "the command's pid", |s| s.ends_with('\n'));
    let started = Instant::now();
    let code = p.wait().code();
    let stderr = p.stderr();
    assert_eq!(code, Some(75), "{stderr}");
    assert!(stderr.contains("sending SIGKILL"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(!dir.read("log").contains("survived"));
    // The whole group dies, the `sleep` included (SIGKILL is delivered asynchronously).
    let pgid: u32 = pgid.trim().parse().expect("pgid");
    let deadline = Instant::now() + LIMIT;
    while !live_members(pgid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the command's process group outlived SIGKILL: {:?}",
            live_members(pgid)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Pids of the processes in group `pgid` that are not zombies (a zombie is dead, waiting to
/// be reaped, and `kill -0` still succeeds on it).
fn live_members(pgid: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(2) == Some(&pgid.to_string().as_str()) && fields.first() != Some(&"Z") {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn the_commands_status_passes_through() {
    let server = RedisServer::start();
    let dir = Scratch::new("status");
    let run = |args: &[&str]| {
        let mut c = waitlock(&server, &dir);
        c.args(["run", "k", "--"]).args(args);
        output(c)
    };
    assert_eq!(run(&["sh", "-c", "exit 3"]).status.code(), Some(3));
    assert_eq!(run(&["true"]).status.code(), Some(0));
    assert_eq!(
        run(&["sh", "-c", "kill -USR1 $$"]).status.code(),
        Some(128 + 10)
    );
    let out = run(&["sh", "-c", "echo \"$WAITLOCK_KEY $WAITLOCK_FENCE\""]);
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let (key, fence) = line.trim().split_once(' ').expect("key and fence");
    assert_eq!(key, "k");
    assert!(fence.parse::<u64>().is_ok(), "{line}");

    let out = run(&["no-such-command-for-waitlock"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr_of(&out).contains("command not found"),
        "{}",
        stderr_of(&out)
    );
    let out = run(&["/"]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr_of(&out));
    // None of these left the lock behind.
    assert_eq!(status_json(&server, &dir, "k")["held"], false);
}

#[test]
fn redis_down_gives_69_and_says_where_without_the_password() {
    let dir = Scratch::new("down");
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    }; // closed again: nothing listens there
    for sub in [
        &["run", "k", "--", "sh", "-c", "echo ran > marker"][..],
        &["status", "k"][..],
    ] {
        let url = format!("redis://user:hunter2@127.0.0.1:{port}");
        let mut c = Command::new(BIN);
        c.current_dir(&dir.0).env("REDIS_URL", &url).args(sub);
        let out = output(c);
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(69), "{sub:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "cannot connect to Redis at redis://***@127.0.0.1:{port}"
            )),
            "{stderr}"
        );
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
    assert!(!dir.path("marker").exists());
}

#[test]
fn sigterm_reaches_the_command_and_the_lock_is_released_after_it() {
    let server = RedisServer::start();
    let dir = Scratch::new("sigterm");
    let script = r#"trap 'echo "got TERM" >> log; exit 5' TERM
echo ready >> log
sleep 10 & wait"#;
    let mut c = waitlock(&server, &dir);
    c.args(["run", "k", "--", "sh", "-c", script]);
    let mut p = Spawned::start(c, &dir, "run.err");
    await_file(&dir, "log", "the command's ready line", |s| {
        s.contains("ready")
    });
    assert_eq!(status_json(&server, &dir, "k")["held"], true);
    p.signal("-TERM");
    assert_eq!(p.wait().code(), Some(5), "the command's own status");
    assert!(dir.read("log").contains("got TERM"), "{}", dir.read("log"));
    assert!(
        p.stderr().contains("got SIGTERM: passing it on"),
        "{}",
        p.stderr()
    );
    assert_eq!(status_json(&server, &dir, "k")["held"], false);
    let mut c = waitlock(&server, &dir);
    c.args(["run", "--nonblock", "k", "--", "true"]);
    assert_eq!(output(c).status.code(), Some(0), "the lock was left held");
}

#[test]
fn status_reports_held_and_free_keys() {
    let server = RedisServer::start();
    let dir = Scratch::new("statusjson");
    let never = status_json(&server, &dir, "never-used");
    assert_eq!(
        never,
        serde_json::json!({"key": "never-used", "held": false, "remaining_ttl_ms": null,
                           "fence": null, "queued": 0, "holder": null, "waiters": [],
                           "permits": null})
    );

    let mut holder = hold(&server, &dir, "report");
    let fence: u64 = dir
        .read("log")
        .split_whitespace()
        .nth(2)
        .and_then(|f| f.parse().ok())
        .expect("fence in the log");
    let held = status_json(&server, &dir, "report");
    assert_eq!(held["key"], "report");
    assert_eq!(held["held"], true);
    assert_eq!(held["fence"], fence);
    assert_eq!(held["queued"], 0);
    let ttl = held["remaining_ttl_ms"].as_u64().expect("a TTL");
    assert!(ttl > 0 && ttl <= 30_000, "{ttl}");
    assert!(!held.to_string().contains(dir.read("token").trim()));

    let mut c = waitlock(&server, &dir);
    c.args(["status", "report"]);
    let human = String::from_utf8_lossy(&output(c).stdout).into_owned();
    assert!(
        human.starts_with("'report' is held: expires in ")
            && human.contains(&format!("fence {fence}")),
        "{human}"
    );

    fs::write(dir.path("go"), "").expect("go");
    assert!(holder.wait().success());
    let free = status_json(&server, &dir, "report");
    assert_eq!(free["held"], false);
    assert_eq!(free["fence"], fence, "the last fence stays readable");
}

#[test]
fn release_by_token_for_operators() {
    let server = RedisServer::start();
    let dir = Scratch::new("release");
    let holder = hold(&server, &dir, "stuck");

    let mut c = waitlock(&server, &dir);
    c.args(["release", "stuck", "--token", "not-the-token"]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr_of(&out).contains("'stuck' is not held by that token"),
        "{}",
        stderr_of(&out)
    );

    let token = dir.read("token");
    let mut c = waitlock(&server, &dir);
    c.args(["release", "stuck", "--token", token.trim()]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(!stderr_of(&out).contains(token.trim()), "the token printed");
    assert_eq!(status_json(&server, &dir, "stuck")["held"], false);

    // The holder finds out at its next refresh (TTL 30 s: in 24 s); do not wait for that.
    drop(holder);
}

#[test]
fn bad_usage_exits_64_and_help_and_version_exit_0() {
    let dir = Scratch::new("usage");
    let code = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.current_dir(&dir.0)
            .env_remove("WAITLOCK_TOKEN")
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .args(args);
        output(c)
    };
    for args in [
        &[][..],
        &["frobnicate"],
        &["run", "k"],
        &["run", "--bogus", "k", "--", "true"],
        &["run", "--ttl", "30", "k", "--", "true"],
        &["run", "--ttl", "0s", "k", "--", "true"],
        &["run", "--nonblock", "--wait", "1s", "k", "--", "true"],
        &["run", "-E", "256", "k", "--", "true"],
        &["status"],
        &["release", "k"],
        &["-q", "-v", "status", "k"],
    ] {
        let out = code(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr_of(&out));
        assert!(!stderr_of(&out).is_empty(), "{args:?} said nothing");
    }
    // Refused by the library, before any command runs: also usage.
    let server = RedisServer::start();
    for args in [
        &["run", "--prefix", "a{b", "k", "--", "true"][..],
        &["run", "", "--", "true"],
        &["status", ""],
        &["release", "k", "--token", ""],
    ] {
        let mut c = waitlock(&server, &dir);
        c.args(args);
        let out = output(c);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr_of(&out));
    }

    let help = code(&["run", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    let text = String::from_utf8_lossy(&help.stdout).into_owned();
    for needle in [
        "--nonblock",
        "--conflict-exit-code",
        "--shared",
        "--exclusive",
        "--limit <N>",
        "REDIS_URL",
        "75",
        "WAITLOCK_FENCE",
    ] {
        assert!(text.contains(needle), "run --help lacks {needle}:\n{text}");
    }
    let version = code(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("waitlock {}", env!("CARGO_PKG_VERSION"))
    );
}

/// `waitlock` against a TLS server, with none of the caller's WAITLOCK_* or REDIS_URL.
fn waitlock_tls(dir: &Scratch, args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.current_dir(&dir.0)
        .env_remove("REDIS_URL")
        .env_remove("WAITLOCK_KEY")
        .env_remove("WAITLOCK_FENCE")
        .env_remove("WAITLOCK_TOKEN")
        .stdin(Stdio::null())
        .args(args);
    output(c)
}

#[test]
fn run_and_status_over_tls_with_a_private_ca_and_a_client_certificate() {
    let dir = Scratch::new("tls");
    let server = TlsRedis::start(false);
    let (url, ca) = (server.url(), server.certs.ca());
    let ca = ca.to_str().expect("utf-8 path");

    let out = waitlock_tls(
        &dir,
        &[
            "run",
            "--tls-ca",
            ca,
            "--url",
            &url,
            "k",
            "--",
            "sh",
            "-c",
            "echo ran > marker",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(dir.path("marker").exists());
    let out = waitlock_tls(
        &dir,
        &["status", "--json", "--tls-ca", ca, "--url", &url, "k"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(status["held"], false);
    assert!(status["fence"].is_u64(), "the run took the lock: {status}");

    // No --tls-ca: the system's CAs do not know the private one.
    let started = Instant::now();
    let out = waitlock_tls(&dir, &["status", "--url", &url, "k"]);
    let stderr = stderr_of(&out);
    eprintln!(
        "untrusted server: exit {:?} after {:?}: {stderr}",
        out.status.code(),
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("give its CA with --tls-ca FILE"),
        "{stderr}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // An unreadable CA file is bad usage, and says which file.
    let out = waitlock_tls(
        &dir,
        &["status", "--tls-ca", "nope.pem", "--url", &url, "k"],
    );
    assert_eq!(out.status.code(), Some(64), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("nope.pem"), "{}", stderr_of(&out));

    // Mutual TLS: `run`'s subscriber connection presents the certificate too.
    let mtls = TlsRedis::start(true);
    let certs = &mtls.certs;
    let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
    let (ca, cert, key) = (
        ca.to_str().expect("utf-8"),
        cert.to_str().expect("utf-8"),
        key.to_str().expect("utf-8"),
    );
    let url = mtls.url();
    let tls = [
        "--tls-ca",
        ca,
        "--tls-cert",
        cert,
        "--tls-key",
        key,
        "--url",
        &url,
    ];
    let out = waitlock_tls(
        &dir,
        &[
            &["run"][..],
            &tls,
            &["m", "--", "sh", "-c", "echo ran > mtls-marker"],
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(dir.path("mtls-marker").exists());
    let out = waitlock_tls(&dir, &["status", "--tls-ca", ca, "--url", &url, "m"]);
    assert_eq!(out.status.code(), Some(69), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("--tls-cert FILE --tls-key FILE"),
        "{}",
        stderr_of(&out)
    );
}

/// The command as the releaser: a `waitlock run` holds the key; a library waiter with another
/// claim window (3 s) and a 30 s TTL queues, then a second `waitlock run`. When the first run
/// ends, its release hands the lock to the library waiter, which holds it 2 s; the second run
/// must not start before the library waiter released. Twice: the library waiter seen just
/// before the release (a full grant), and idle 300 ms first (the command's short grant,
/// confirmed before `acquire_wait` returns).
#[test]
fn a_lock_the_command_hands_over_is_the_waiters_for_its_whole_ttl() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let url = server.url();
    for idle_ms in [0u64, 300] {
        let dir = Scratch::new(&format!("releaser-{idle_ms}"));
        let key = format!("handed-{idle_ms}");
        let mut first = hold(&server, &dir, &key);
        let (u, k) = (url.clone(), key.clone());
        let waiter = rt.spawn(async move {
            let locker = waitlock::Locker::connect(&u)
                .await
                .expect("connect")
                .claim_window(Duration::from_secs(3))
                .queued()
                .build()
                .await
                .expect("queued locker");
            let opts = waitlock::LockOptions::new()
                .with_ttl(Duration::from_secs(30))
                .with_wait(Duration::from_secs(20));
            let g = locker.acquire_wait(&k, &opts).await.expect("acquire_wait");
            let got = common::now_ns();
            let left = g.valid_until() - tokio::time::Instant::now();
            tokio::time::sleep(Duration::from_secs(2)).await;
            let released = common::now_ns();
            g.release().await.expect("release");
            (got, released, left)
        });
        let queued = |n: u64| {
            let deadline = Instant::now() + LIMIT;
            while status_json(&server, &dir, &key)["queued"].as_u64() != Some(n) {
                assert!(Instant::now() < deadline, "never {n} queued");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        queued(1);
        let mut c = waitlock(&server, &dir);
        c.args([
            "run",
            "--wait",
            "20s",
            &key,
            "--",
            "sh",
            "-c",
            "echo \"second $(date +%s%N)\" >> log2",
        ]);
        let mut second = Spawned::start(c, &dir, "second.err");
        queued(2);
        std::thread::sleep(Duration::from_millis(idle_ms));
        fs::write(dir.path("go"), "").expect("go");
        assert_eq!(first.wait().code(), Some(0), "{}", first.stderr());
        let (got, released, left) = rt.block_on(waiter).expect("waiter");
        assert!(second.wait().success(), "{}", second.stderr());
        let started: u64 = dir
            .read("log2")
            .split_whitespace()
            .nth(1)
            .and_then(|t| t.parse().ok())
            .expect("the second run's start time");
        assert!(
            started >= released,
            "two holders: the second run started {} ms after the waiter took the lock, before its release at {} ms (its guard said {left:?} left)",
            (started.saturating_sub(got)) / 1_000_000,
            (released - got) / 1_000_000
        );
        assert!(
            left >= Duration::from_millis(29_300),
            "the waiter's guard was valid for {left:?} at return, not the TTL (30 s)"
        );
    }
}

/// Issue 25 for the command: a release that reaches Redis after the lease (the server stalled
/// 150 ms into a 200 ms command, TTL 300 ms) is not a lost lock: the command's status (0), not
/// 75 (milestone 2 exited 75).
#[test]
fn a_late_release_keeps_the_commands_status() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let dir = Scratch::new("late-release");
    let mut c = waitlock(&server, &dir);
    c.args([
        "run",
        "--ttl",
        "300ms",
        "stalled",
        "--",
        "sh",
        "-c",
        "touch started; sleep 0.2",
    ]);
    let mut run = Spawned::start(c, &dir, "run.err");
    await_file(&dir, "started", "the command's start", |_| {
        dir.path("started").exists()
    });
    std::thread::sleep(Duration::from_millis(150));
    let port = server.port.to_string();
    let out = Command::new("redis-cli")
        .args(["-p", &port, "DEBUG", "SLEEP", "0.5"])
        .output()
        .expect("redis-cli DEBUG SLEEP");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = run.wait();
    assert_eq!(status.code(), Some(0), "{}", run.stderr());
}

/// The runs in progress after each start line of a log of `start TAG ID` and `end TAG ID`
/// lines, in file order (tags, e.g. `s` and `x`). A run writes both lines while it holds, so
/// runs shown in progress together held together. Checks that there are `runs` whole runs.
fn in_progress(log: &str, runs: usize) -> Vec<Vec<String>> {
    let mut now: Vec<(String, String)> = Vec::new();
    let (mut snapshots, mut ended) = (Vec::new(), 0);
    for line in log.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let [what, tag, id] = words[..] else {
            panic!("bad line {line:?}; log:\n{log}")
        };
        let run = (tag.to_owned(), id.to_owned());
        match what {
            "start" => {
                assert!(!now.contains(&run), "{line:?} twice; log:\n{log}");
                now.push(run);
                snapshots.push(now.iter().map(|(t, _)| t.clone()).collect());
            }
            "end" => {
                let at = now.iter().position(|r| *r == run);
                let at = at.unwrap_or_else(|| panic!("{line:?} before its start; log:\n{log}"));
                now.remove(at);
                ended += 1;
            }
            _ => panic!("bad line {line:?}; log:\n{log}"),
        }
    }
    assert!(now.is_empty(), "runs never ended: {now:?}; log:\n{log}");
    assert_eq!(ended, runs, "log:\n{log}");
    snapshots
}

/// `run --limit 2`: of four runs, two hold together while the other two are queued (seen in
/// `status`); when the two end, the other two run. Never more than two at once.
#[test]
fn limit_runs_at_most_n_at_once() {
    let server = RedisServer::start();
    let dir = Scratch::new("limit");
    let script = r#"echo "start n $$" >> log
while [ ! -e go ]; do sleep 0.01; done
echo "end n $$" >> log"#;
    let runs: Vec<Spawned> = (0..4)
        .map(|i| {
            let mut c = waitlock(&server, &dir);
            c.args([
                "run",
                "--limit",
                "2",
                "--wait",
                "15s",
                "thumbnails",
                "--",
                "sh",
                "-c",
                script,
            ]);
            Spawned::start(c, &dir, &format!("run{i}.err"))
        })
        .collect();
    await_file(&dir, "log", "two runs", |s| s.matches("start").count() >= 2);
    let deadline = Instant::now() + LIMIT;
    loop {
        let permits = status_json(&server, &dir, "thumbnails")["permits"].clone();
        if permits["queued"] == 2 && permits["held"] == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never 2 held and 2 queued: {permits}; log:\n{}",
            dir.read("log")
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        dir.read("log").matches("start").count(),
        2,
        "{}",
        dir.read("log")
    );
    fs::write(dir.path("go"), "").expect("go");
    for mut r in runs {
        assert_eq!(r.wait().code(), Some(0), "{}", r.stderr());
    }
    let log = dir.read("log");
    let most = in_progress(&log, 4).iter().map(Vec::len).max();
    assert_eq!(most, Some(2), "log:\n{log}");
}

/// `run -s` and `run -x` on one key: two readers run together (each waits for the other to
/// start); a writer waits for both, and a reader that comes after the queued writer waits for
/// the writer. `status` shows the readers and the queue meanwhile.
#[test]
fn shared_runs_overlap_and_an_exclusive_run_is_alone() {
    let server = RedisServer::start();
    let dir = Scratch::new("rwlock");
    let reader = r#"echo "start s $$" >> log
while [ "$(grep -c 'start s' log)" -lt 2 ]; do sleep 0.01; done
while [ ! -e go ]; do sleep 0.01; done
echo "end s $$" >> log"#;
    let run = |flag: &str, script: &str, name: &str| {
        let mut c = waitlock(&server, &dir);
        c.args([
            "run", flag, "--wait", "15s", "config", "--", "sh", "-c", script,
        ]);
        Spawned::start(c, &dir, name)
    };
    let mut readers = [
        run("-s", reader, "r1.err"),
        run("--shared", reader, "r2.err"),
    ];
    await_file(&dir, "log", "two readers", |s| {
        s.matches("start s").count() == 2
    });

    let mut writer = run(
        "-x",
        r#"echo "start x $$" >> log; echo "end x $$" >> log"#,
        "w.err",
    );
    await_stderr(&writer, "waiting up to 15.0 s");
    let queued = |n: u64| {
        let deadline = Instant::now() + LIMIT;
        loop {
            let status = status_json(&server, &dir, "config");
            if status["permits"]["queued"].as_u64() == Some(n) {
                return status;
            }
            assert!(Instant::now() < deadline, "never {n} queued: {status}");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let status = queued(1);
    assert_eq!(status["permits"]["kind"], "rw_lock", "{status}");
    assert_eq!(status["permits"]["holders"], 2, "{status}");
    assert_eq!(
        status["held"], false,
        "the plain lock is another key: {status}"
    );
    let mut c = waitlock(&server, &dir);
    c.args(["status", "config"]);
    let text = String::from_utf8_lossy(&output(c).stdout).into_owned();
    assert!(
        text.contains("'config' read-write lock: held by 2 readers, the first lease ends in")
            && text.contains("1 queued"),
        "{text}"
    );

    let late = r#"echo "start t $$" >> log; echo "end t $$" >> log"#;
    let mut late = run("-s", late, "r3.err");
    await_stderr(&late, "is held for writing or a writer waits");
    queued(2);
    fs::write(dir.path("go"), "").expect("go");

    for r in readers.iter_mut().chain([&mut writer, &mut late]) {
        assert_eq!(r.wait().code(), Some(0), "{}", r.stderr());
    }
    let log = dir.read("log");
    let snapshots = in_progress(&log, 4);
    assert!(
        snapshots.iter().any(|s| s == &["s", "s"]),
        "the readers never overlapped; log:\n{log}"
    );
    for s in &snapshots {
        assert!(
            !s.contains(&"x".to_owned()) || s.len() == 1,
            "the writer ran with {s:?}; log:\n{log}"
        );
    }
    let at = |line: &str| log.find(line).unwrap_or_else(|| panic!("no {line:?}"));
    assert!(
        at("start t") > at("end x"),
        "a reader passed the queued writer; log:\n{log}"
    );
}

/// Bad permit options are usage (64) before anything is sent; so is a run whose --limit is
/// not the one the key is in use with, and the message names both.
#[test]
fn bad_limits_and_a_key_in_use_with_another_limit_exit_64() {
    let dir = Scratch::new("badlimit");
    for args in [
        &["run", "--limit", "0", "k", "--", "true"][..],
        &["run", "--limit", "1048577", "k", "--", "true"],
        &["run", "--limit", "two", "k", "--", "true"],
        &["run", "-s", "-x", "k", "--", "true"],
        &["run", "--shared", "--limit", "2", "k", "--", "true"],
        &["run", "-x", "--limit", "2", "k", "--", "true"],
    ] {
        let mut c = Command::new(BIN);
        c.current_dir(&dir.0)
            .env("REDIS_URL", "redis://127.0.0.1:1")
            .args(args);
        let out = output(c);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr_of(&out));
        assert!(!stderr_of(&out).is_empty(), "{args:?} said nothing");
    }

    let server = RedisServer::start();
    let mut holder = hold_with(&server, &dir, &["--limit", "2"], "thumbnails");
    let marker = ["--", "sh", "-c", "echo ran > marker"];
    for (options, asked) in [(&["--limit", "3"][..], "--limit 3"), (&["-s"], "-s/-x")] {
        let mut c = waitlock(&server, &dir);
        c.arg("run").args(options).arg("thumbnails").args(marker);
        let out = output(c);
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(64), "{options:?}: {stderr}");
        assert!(
            stderr.contains("'thumbnails' is in use with --limit 2, not ")
                && stderr.contains(asked),
            "{options:?}: {stderr}"
        );
    }
    assert!(!dir.path("marker").exists(), "a command ran");
    fs::write(dir.path("go"), "").expect("go");
    assert_eq!(holder.wait().code(), Some(0), "{}", holder.stderr());
}

/// `status` shows a key's permits next to its lock: a semaphore's while a `--limit 2` run
/// holds one (text and JSON), a writer of a read-write lock.
#[test]
fn status_shows_the_permits_of_a_key() {
    let server = RedisServer::start();
    let dir = Scratch::new("permitstatus");
    let mut holder = hold_with(&server, &dir, &["--limit", "2"], "thumbnails");
    let fence: u64 = dir
        .read("log")
        .split_whitespace()
        .nth(2)
        .and_then(|f| f.parse().ok())
        .expect("fence in the log");
    let status = status_json(&server, &dir, "thumbnails");
    assert_eq!(status["held"], false, "the lock is another key: {status}");
    let permits = &status["permits"];
    let ends_in = permits["first_lease_ends_in_ms"].as_u64().expect("a lease");
    assert!(ends_in > 0 && ends_in <= 30_000, "{status}");
    let token = dir.read("token").trim().to_owned();
    assert!(token.starts_with("w1:"), "{token}");
    let pid = token[3..15].to_owned();
    let label = permits["leases"][0]["label"].clone();
    assert!(
        label.as_str().is_some_and(|l| l.contains(":waitlock")),
        "{status}"
    );
    assert_eq!(
        permits,
        &serde_json::json!({"kind": "semaphore", "permits": 2, "held": 1, "holders": 1,
                            "queued": 0, "first_lease_ends_in_ms": ends_in, "fence": fence,
                            "leases": [{"token": token, "ends_in_ms": ends_in, "weight": 1,
                                        "process_id": pid, "label": label}],
                            "waiters": []})
    );
    let mut c = waitlock(&server, &dir);
    c.args(["status", "thumbnails"]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("'thumbnails' is free"), "{text}");
    assert!(
        lines[2].starts_with("  holds 1")
            && lines[2].contains("lease ends in ")
            && lines[2].ends_with(&format!("process {pid}")),
        "{text}"
    );
    assert!(
        lines[1].starts_with(
            "'thumbnails' semaphore: 1 of 2 permits held by 1 holder, the first lease ends in "
        ) && lines[1].ends_with(&format!("fence {fence}, 0 queued")),
        "{text}"
    );
    // `release` frees plain locks only, and says so for a key with permits held.
    let mut c = waitlock(&server, &dir);
    c.args(["release", "thumbnails", "--token", dir.read("token").trim()]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("`release` frees plain locks only"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(
        status_json(&server, &dir, "thumbnails")["permits"]["held"],
        1
    );
    fs::write(dir.path("go"), "").expect("go");
    assert_eq!(holder.wait().code(), Some(0), "{}", holder.stderr());

    let dir = Scratch::new("permitstatus-x");
    let mut writer = hold_with(&server, &dir, &["-x"], "config");
    assert_eq!(
        status_json(&server, &dir, "config")["permits"]["kind"],
        "rw_lock"
    );
    let mut c = waitlock(&server, &dir);
    c.args(["status", "config"]);
    let text = String::from_utf8_lossy(&output(c).stdout).into_owned();
    assert!(
        text.contains("'config' read-write lock: held by a writer, the first lease ends in "),
        "{text}"
    );
    fs::write(dir.path("go"), "").expect("go");
    assert_eq!(writer.wait().code(), Some(0), "{}", writer.stderr());
}

/// A permit lost while the command runs (its lease deleted: here every key, by the command
/// itself) ends the run as a lost lock does: SIGTERM to the command's group, exit 75.
#[test]
fn a_lost_permit_terminates_the_command_and_exits_75() {
    let server = RedisServer::start();
    let dir = Scratch::new("lostpermit");
    let script = format!(
        r#"trap 'echo term >> log; exit 0' TERM
redis-cli -p {} FLUSHALL > /dev/null
sleep 10 & wait"#,
        server.port
    );
    let mut c = waitlock(&server, &dir);
    c.args([
        "run", "-s", "--ttl", "300ms", "config", "--", "sh", "-c", &script,
    ]);
    let mut p = Spawned::start(c, &dir, "run.err");
    let code = p.wait().code();
    let stderr = p.stderr();
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        stderr.contains("shared hold of 'config' lost after"),
        "{stderr}"
    );
    assert!(
        dir.read("log").contains("term"),
        "no SIGTERM: {}",
        dir.read("log")
    );
}

/// Real holder processes of both permits of a `--limit 2` key (lease 1 s): one is killed
/// (-9, its command too), the other frozen (SIGSTOP). Two new runs get the permits when the
/// leases end, while the frozen holder is still stopped; resumed, it finds its permit gone,
/// terminates its command and exits 75.
#[test]
fn killed_and_frozen_permit_holders_free_their_permits_at_lease_end() {
    let server = RedisServer::start();
    let dir = Scratch::new("permit-faults");
    let holders: Vec<Spawned> = (0..2)
        .map(|i| {
            let mut c = waitlock(&server, &dir);
            c.args(["run", "--limit", "2", "--ttl", "1s", "jobs", "--"])
                .args(["sh", "-c", HOLD_UNTIL_GO]);
            Spawned::start(c, &dir, &format!("holder{i}.err"))
        })
        .collect();
    await_file(&dir, "log", "both holders", |s| {
        s.matches("start").count() == 2
    });
    let (mut killed, mut frozen) = {
        let mut it = holders.into_iter();
        (it.next().unwrap(), it.next().unwrap())
    };
    kill_tree(&mut killed.child);
    frozen.signal("-STOP");
    let stopped_at = Instant::now();
    let runs: Vec<Spawned> = (0..2)
        .map(|i| {
            let mut c = waitlock(&server, &dir);
            c.args(["run", "--limit", "2", "--wait", "15s", "jobs", "--"])
                .args(["sh", "-c", "echo got >> got"]);
            Spawned::start(c, &dir, &format!("run{i}.err"))
        })
        .collect();
    for mut r in runs {
        assert_eq!(r.wait().code(), Some(0), "{}", r.stderr());
    }
    let took = stopped_at.elapsed();
    assert_eq!(dir.read("got").lines().count(), 2);
    println!("both permits back {took:?} after the kill and the freeze (lease 1 s)");
    frozen.signal("-CONT");
    assert_eq!(frozen.wait().code(), Some(75), "{}", frozen.stderr());
    assert!(frozen.stderr().contains("lost"), "{}", frozen.stderr());
}

/// Issue 35: three `waitlock run` processes with labels (one with a quote, a newline and a
/// control byte): `status` names the holder and the waiters in queue order with plausible ages,
/// in the table (labels escaped) and in JSON (parsed back exactly), and never shows a token.
#[test]
fn status_names_the_holder_and_the_waiters_by_label_in_queue_order() {
    let server = RedisServer::start();
    let dir = Scratch::new("labels");
    let key = "who";
    let odd = "night \"batch\"\n\u{7}x";
    let mut holder = hold_with(&server, &dir, &["--label", "alpha"], key);
    let queued = |n: u64| {
        let deadline = Instant::now() + LIMIT;
        while status_json(&server, &dir, key)["queued"].as_u64() != Some(n) {
            assert!(Instant::now() < deadline, "never {n} queued");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut waiters = Vec::new();
    for (i, label) in ["beta", odd].into_iter().enumerate() {
        let mut c = waitlock(&server, &dir);
        c.args(["run", "--wait", "30s", "--label", label, key, "--", "true"]);
        waiters.push(Spawned::start(c, &dir, &format!("waiter{i}.err")));
        queued(i as u64 + 1);
        // The first waiter has waited longer than the second, visibly.
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = status_json(&server, &dir, key);
    assert_eq!(s["holder"]["label"], "alpha", "{s}");
    assert!(
        s["holder"]["process_id"]
            .as_str()
            .is_some_and(|p| p.len() == 12),
        "{s}"
    );
    let held_for = s["holder"]["held_for_ms"].as_u64().expect("held for");
    assert!(held_for < 60_000, "held for {held_for} ms");
    let w = s["waiters"].as_array().expect("waiters");
    assert_eq!(w.len(), 2, "{s}");
    assert_eq!(w[0]["label"], "beta");
    assert_eq!(w[1]["label"], odd, "the JSON carries the label exactly");
    let (w0, w1) = (
        w[0]["waited_ms"].as_u64().expect("ms"),
        w[1]["waited_ms"].as_u64().expect("ms"),
    );
    assert!(w0 >= w1 + 40 && w0 < 60_000, "waited {w0} and {w1} ms");
    assert!(
        !s.to_string().contains(dir.read("token").trim()),
        "a token was shown"
    );

    let mut c = waitlock(&server, &dir);
    c.args(["status", key]);
    let human = String::from_utf8_lossy(&output(c).stdout).into_owned();
    let lines: Vec<&str> = human.lines().collect();
    assert!(lines.len() >= 4, "{human}");
    assert!(
        lines[1].trim_start().starts_with("holder") && lines[1].contains("alpha"),
        "{human}"
    );
    assert!(
        lines[2].contains("waiter 1") && lines[2].contains("beta"),
        "{human}"
    );
    assert!(
        lines[3].contains("waiter 2") && lines[3].contains(r#"night \"batch\"\n\u{7}x"#),
        "the odd label is escaped on one line: {human}"
    );
    assert!(
        !human.contains(dir.read("token").trim()),
        "a token was shown"
    );

    fs::write(dir.path("go"), "").expect("go");
    assert!(holder.wait().success(), "{}", holder.stderr());
    for mut w in waiters {
        assert!(w.wait().success(), "{}", w.stderr());
    }
}

/// Issue 35: `status --watch` prints a new snapshot when the key changes (Redis tells it: no
/// polling) and exits 0 on SIGINT.
#[test]
fn status_watch_prints_each_change_and_exits_on_sigint() {
    let server = RedisServer::start();
    let dir = Scratch::new("watch");
    let mut c = waitlock(&server, &dir);
    c.args(["status", "--watch", "watched"])
        .stdout(fs::File::create(dir.path("out")).expect("stdout file"));
    let mut watcher = Spawned::start_keeping_stdout(c, &dir, "watch.err");
    await_file(&dir, "out", "the first snapshot", |s| s.contains("is free"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut latencies = Vec::new();
    for round in 0..3 {
        // Held: one snapshot says so; released: the next says free again.
        let url = server.url();
        let (guard, locker) = rt.block_on(async move {
            let locker = waitlock::Locker::connect(&url)
                .await
                .expect("connect")
                .label("watched-holder")
                .queued()
                .build()
                .await
                .expect("locker");
            (
                locker
                    .acquire("watched", &waitlock::LockOptions::new())
                    .await
                    .expect("free"),
                locker,
            )
        });
        let changed = Instant::now();
        let held = await_file(&dir, "out", "the held snapshot", |s| {
            s.matches("is held").count() > round
        });
        latencies.push(changed.elapsed());
        assert!(held.contains("watched-holder"), "{held}");
        rt.block_on(guard.release()).expect("release");
        await_file(&dir, "out", "the free snapshot", |s| {
            s.rsplit("--- +")
                .next()
                .is_some_and(|last| last.contains("is free"))
        });
        drop(locker);
    }
    latencies.sort();
    println!(
        "--watch printed the change {:?} after it (median of 3)",
        latencies[1]
    );
    assert!(
        latencies[1] < Duration::from_secs(2),
        "the change took {:?} to show",
        latencies[1]
    );
    watcher.signal("-INT");
    assert_eq!(watcher.wait().code(), Some(0), "{}", watcher.stderr());
}

/// Issue 33: `waitlock leader NAME` says who leads (text and JSON); `--watch` prints each new
/// leader and the end of leadership, and exits 0 on SIGINT.
#[test]
fn leader_shows_and_follows_an_election() {
    let server = RedisServer::start();
    let dir = Scratch::new("leader");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let url = server.url();
    let candidate = |url: String| async move {
        waitlock::Locker::connect(&url)
            .await
            .expect("connect")
            .queued()
            .build()
            .await
            .expect("locker")
    };
    let (a, b) =
        rt.block_on(async { (candidate(url.clone()).await, candidate(url.clone()).await) });
    let opts = waitlock::LockOptions::new().with_wait(Duration::from_secs(20));
    let first = rt
        .block_on(
            a.election("scheduler")
                .expect("name")
                .campaign("host-a", &opts),
        )
        .expect("a leads");
    let mut c = waitlock(&server, &dir);
    c.args(["leader", "--json", "scheduler"]);
    let out = output(c);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["leader"]["value"], "host-a", "{json}");
    assert_eq!(json["leader"]["term"], first.term());
    let mut c = waitlock(&server, &dir);
    c.args(["leader", "--watch", "scheduler"])
        .stdout(fs::File::create(dir.path("out")).expect("stdout file"));
    let mut watcher = Spawned::start_keeping_stdout(c, &dir, "watch.err");
    await_file(&dir, "out", "the first line", |s| {
        s.contains("led by 'host-a'")
    });
    let election_b = b.election("scheduler").expect("name");
    let next = rt.spawn(async move { election_b.campaign("host-b", &opts).await });
    rt.block_on(common::lock_queued(&a, "scheduler", 1))
        .expect("b queued");
    rt.block_on(first.resign()).expect("resign");
    let second = rt.block_on(next).expect("task").expect("b leads");
    await_file(&dir, "out", "the new leader", |s| {
        s.contains("led by 'host-b'")
    });
    rt.block_on(second.resign()).expect("resign");
    await_file(&dir, "out", "nobody leads", |s| {
        s.contains("nobody leads 'scheduler'")
    });
    watcher.signal("-INT");
    assert_eq!(watcher.wait().code(), Some(0), "{}", watcher.stderr());
}

/// Issue 33: `waitlock elect NAME -- COMMAND` runs the command while leading; a clean exit
/// resigns and the next candidate leads at once; a SIGKILLed leader is followed after its
/// lease.
#[test]
fn elect_runs_the_command_while_leading_and_hands_over() {
    let server = RedisServer::start();
    let dir = Scratch::new("elect");
    // Each candidate logs "<name> <term> <ns>" when it leads, and leads until its go file.
    let lead = |name: &str| {
        let script = format!(
            "echo \"{name} $WAITLOCK_FENCE $(date +%s%N)\" >> log; while [ ! -e go-{name} ]; do sleep 0.01; done"
        );
        let mut c = waitlock(&server, &dir);
        c.args([
            "elect", "--ttl", "1s", "--wait", "30s", "--value", name, "cron", "--", "sh", "-c",
        ])
        .arg(script);
        Spawned::start(c, &dir, &format!("{name}.err"))
    };
    let mut a = lead("a");
    await_file(&dir, "log", "a leads", |s| s.contains("a "));
    let b = lead("b");
    let mut c = waitlock(&server, &dir);
    c.args(["leader", "--json", "cron"]);
    let deadline = Instant::now() + LIMIT;
    while status_json(&server, &dir, "cron")["queued"] != 1 {
        assert!(Instant::now() < deadline, "b never queued");
        std::thread::sleep(Duration::from_millis(5));
    }
    let json: serde_json::Value = serde_json::from_slice(&output(c).stdout).expect("JSON");
    assert_eq!(json["leader"]["value"], "a", "{json}");
    // a's command ends: a resigns, b leads at once.
    let resigned = common::now_ns();
    fs::write(dir.path("go-a"), "").expect("go");
    assert_eq!(a.wait().code(), Some(0), "{}", a.stderr());
    let log = await_file(&dir, "log", "b leads", |s| s.contains("b "));
    let line = |who: &str| -> (u64, u64) {
        let l = log.lines().find(|l| l.starts_with(who)).expect("line");
        let f: Vec<u64> = l
            .split(' ')
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        (f[0], f[1])
    };
    let ((term_a, _), (term_b, b_at)) = (line("a "), line("b "));
    assert!(term_b > term_a, "terms grow: {log}");
    let handover = Duration::from_nanos(b_at.saturating_sub(resigned));
    println!("b's command started {handover:?} after a's command was told to end");
    assert!(handover < Duration::from_secs(5), "{handover:?}");
    // b is SIGKILLed while leading (its command is left running, in its own group): a third
    // candidate leads once b's 1 s lease has run out.
    let mut c3 = lead("c");
    std::thread::sleep(Duration::from_millis(300));
    b.signal("-KILL");
    let killed = common::now_ns();
    let log = await_file(&dir, "log", "c leads", |s| s.contains("c "));
    let c_at = log
        .lines()
        .find(|l| l.starts_with("c "))
        .and_then(|l| l.split(' ').nth(2))
        .and_then(|t| t.parse::<u64>().ok())
        .expect("c's line");
    let after = Duration::from_nanos(c_at.saturating_sub(killed));
    println!("c led {after:?} after b was killed (lease 1 s)");
    assert!(
        after < Duration::from_secs(4),
        "c led {after:?} after the kill"
    );
    fs::write(dir.path("go-b"), "").expect("go");
    fs::write(dir.path("go-c"), "").expect("go");
    assert_eq!(c3.wait().code(), Some(0), "{}", c3.stderr());
}

/// Issue 33: three `waitlock elect` processes and an observer in a fourth. The leader, its
/// command with it, is stopped (SIGSTOP) past its 1 s lease, as a paused host: the next
/// candidate leads after the lease, and the store the commands write to (a fence-checking
/// store: a write is taken only with a term at least the highest it took) refuses the
/// writes of the stopped leader's command once it resumes; the resumed leader learns of its
/// loss at once (its deadline has passed), terminates its command and exits 75. A clean exit then
/// hands over to the third. The observer sees every term, in order, and the end.
#[test]
fn a_stopped_leader_is_fenced_off_and_an_observer_sees_every_term_in_order() {
    let server = RedisServer::start();
    let dir = Scratch::new("elect-stop");
    const STORE: &str = "local t = tonumber(ARGV[1]) \
        if t < tonumber(redis.call('GET', KEYS[1]) or '0') then return 0 end \
        redis.call('SET', KEYS[1], ARGV[1]) redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. ARGV[1]) \
        return 1";
    // Each candidate's command: its pid, a line when it leads, then a write to the store every
    // 20 ms ("<name> <term> <1 taken | 0 refused>") until its go file.
    let lead = |name: &str| {
        let script = format!(
            "echo $$ > pid-{name}; echo \"lead {name} $WAITLOCK_FENCE\" >> log; \
             while [ ! -e go-{name} ]; do \
               r=$(redis-cli -u '{url}' EVAL \"$STORE\" 2 store taken \"$WAITLOCK_FENCE\" {name}); \
               echo \"{name} $WAITLOCK_FENCE $r\" >> writes; sleep 0.02; \
             done",
            url = server.url()
        );
        let mut c = waitlock(&server, &dir);
        c.env("STORE", STORE)
            .args([
                "elect", "--ttl", "1s", "--wait", "60s", "--value", name, "cron", "--", "sh", "-c",
            ])
            .arg(script);
        Spawned::start(c, &dir, &format!("{name}.err"))
    };
    let mut o = waitlock(&server, &dir);
    o.args(["leader", "--watch", "--json", "cron"])
        .stdout(fs::File::create(dir.path("observed")).expect("stdout file"));
    let mut observer = Spawned::start_keeping_stdout(o, &dir, "observer.err");
    await_file(&dir, "observed", "the observer's first line", |s| {
        s.contains("\"leader\":null")
    });
    let mut a = lead("a");
    await_file(&dir, "writes", "a's first write", |s| s.contains("a "));
    // b queues first, then c (FIFO: b leads next).
    let queued = |n: u64| {
        let deadline = Instant::now() + LIMIT;
        while status_json(&server, &dir, "cron")["queued"] != n {
            assert!(Instant::now() < deadline, "{n} never queued");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut b = lead("b");
    queued(1);
    let mut c = lead("c");
    queued(2);
    // The host pauses: waitlock and its command (its own process group) stop.
    let group = dir.read("pid-a").trim().to_owned();
    let kill = |sig: &str, target: String| {
        let ok = Command::new("kill")
            .args([sig, "--", &target])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} {target}");
    };
    kill("-STOP", format!("-{group}"));
    kill("-STOP", a.pid().to_string());
    let stopped = Instant::now();
    let log = await_file(&dir, "log", "the next leader", |s| s.contains("lead b"));
    let took_over = stopped.elapsed();
    println!("b led {took_over:?} after the leader was stopped (lease 1 s)");
    assert!(took_over < Duration::from_secs(5), "{took_over:?}");
    // A candidate's term, from its "lead <name> <term>" line.
    let term = |log: &str, who: &str| -> u64 {
        log.lines()
            .find_map(|l| l.strip_prefix(&format!("lead {who} ")))
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("{who}'s term: {log}"))
    };
    let (term_a, term_b) = (term(&log, "a"), term(&log, "b"));
    assert!(term_b > term_a, "terms grow: {log}");
    await_file(&dir, "writes", "b's first write", |s| s.contains("b "));
    // The old leader's command resumes first (waitlock still stopped, as a supervisor that
    // runs late): its writes carry the old term and the store refuses them.
    kill("-CONT", format!("-{group}"));
    await_file(&dir, "writes", "a refused write", |s| {
        s.lines().any(|l| l.starts_with("a ") && l.ends_with(" 0"))
    });
    // Then waitlock: its deadline has passed.
    let resumed = Instant::now();
    kill("-CONT", a.pid().to_string());
    assert_eq!(a.wait().code(), Some(75), "{}", a.stderr());
    println!(
        "the resumed leader exited 75 {:?} after SIGCONT",
        resumed.elapsed()
    );
    // A clean exit hands over to c; c's ends the election.
    fs::write(dir.path("go-b"), "").expect("go");
    assert_eq!(b.wait().code(), Some(0), "{}", b.stderr());
    let log = await_file(&dir, "log", "c leads", |s| s.contains("lead c"));
    let term_c = term(&log, "c");
    assert!(term_c > term_b, "terms grow: {log}");
    await_file(&dir, "writes", "c's first write", |s| s.contains("c "));
    fs::write(dir.path("go-c"), "").expect("go");
    assert_eq!(c.wait().code(), Some(0), "{}", c.stderr());
    // The store's own record (a write the stopped leader's command sent just before the
    // stop is logged to the file after it resumes, but taken before b's): terms in order,
    // and none of the old term after the new leader's first. The late ones were refused.
    let out = Command::new("redis-cli")
        .args(["-u", &server.url(), "LRANGE", "taken", "0", "-1"])
        .output()
        .expect("run redis-cli");
    let taken: Vec<(String, u64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (who, term) = l.split_once(' ')?;
            Some((who.to_owned(), term.parse().ok()?))
        })
        .collect();
    let terms_taken: Vec<u64> = taken.iter().map(|t| t.1).collect();
    assert!(
        terms_taken.windows(2).all(|w| w[0] <= w[1]),
        "the store took terms out of order: {taken:?}"
    );
    let first_b = taken
        .iter()
        .position(|t| t.0 == "b")
        .expect("b's writes taken");
    assert!(
        taken[first_b..].iter().all(|t| t.0 != "a"),
        "a write of the stopped leader was taken after the new leader's: {taken:?}"
    );
    assert!(
        taken.iter().any(|t| t.0 == "c"),
        "c's writes taken: {taken:?}"
    );
    let refused = dir
        .read("writes")
        .lines()
        .filter(|l| l.ends_with(" 0"))
        .count();
    println!("{} writes taken, {refused} refused", taken.len());
    // The observer: every term, each once and in order, and nobody at the end.
    let observed = await_file(&dir, "observed", "the end of the election", |s| {
        s.lines()
            .last()
            .is_some_and(|l| l.contains("\"leader\":null"))
            && s.contains(&format!("\"term\":{term_c}"))
    });
    observer.signal("-INT");
    assert_eq!(observer.wait().code(), Some(0), "{}", observer.stderr());
    let mut terms: Vec<u64> = observed
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|j| j["leader"]["term"].as_u64())
        .collect();
    terms.dedup();
    assert_eq!(terms, vec![term_a, term_b, term_c], "observed {observed}");
}

/// `run KEY --also KEY2 ...`: runs over overlapping sets given in opposite orders never
/// interleave and never deadlock; the command sees every key and fence; a set whose one key is
/// held gives the conflict code, names that key, and leaves the other keys free; `status`
/// shows several keys.
#[test]
fn runs_over_sets_of_keys_take_them_all_in_one_order() {
    let server = RedisServer::start();
    let dir = Scratch::new("sets");
    let script = r#"echo "start $$" >> log; sleep 0.05; echo "end $$" >> log"#;
    let orders: [&[&str]; 4] = [
        &["a", "--also", "b"],
        &["b", "--also", "a"],
        &["b", "--also", "c", "--also", "a"],
        &["c", "--also", "a"],
    ];
    let runs: Vec<Spawned> = orders
        .iter()
        .enumerate()
        .map(|(i, keys)| {
            let mut c = waitlock(&server, &dir);
            c.args(["run", "--wait", "30s"])
                .args(*keys)
                .args(["--", "sh", "-c", script]);
            Spawned::start(c, &dir, &format!("run{i}.err"))
        })
        .collect();
    for mut r in runs {
        assert!(r.wait().success(), "{}", r.stderr());
    }
    // Every pair of these sets shares a key: they ran one at a time.
    assert_serial(&dir.read("log"), 4);

    let mut c = waitlock(&server, &dir);
    c.args([
        "run",
        "b",
        "--also",
        "a",
        "--",
        "sh",
        "-c",
        r#"printf '%s|%s|%s|%s' "$WAITLOCK_KEY" "$WAITLOCK_FENCE" "$WAITLOCK_KEYS" "$WAITLOCK_FENCES" > env"#,
    ]);
    assert!(output(c).status.success());
    let env = dir.read("env");
    let parts: Vec<&str> = env.split('|').collect();
    assert_eq!(parts[0], "b", "{env}");
    assert_eq!(parts[2], "a\nb", "keys in the order taken: {env}");
    let fences: Vec<&str> = parts[3].split(' ').collect();
    assert_eq!(fences.len(), 2, "{env}");
    assert_eq!(fences[1], parts[1], "b's fence is WAITLOCK_FENCE: {env}");

    // (a fresh directory: `hold` waits for the first start line of its log)
    let dir = Scratch::new("sets-held");
    let mut holder = hold(&server, &dir, "held");
    let mut c = waitlock(&server, &dir);
    c.args(["run", "--nonblock", "free", "--also", "held", "--", "true"]);
    let out = output(c);
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("'held' is held"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(status_json(&server, &dir, "free")["held"], false);

    let mut c = waitlock(&server, &dir);
    c.args(["status", "--json", "free", "held"]);
    let out = output(c);
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        (lines[0]["key"].clone(), lines[0]["held"].clone()),
        ("free".into(), false.into())
    );
    assert_eq!(
        (lines[1]["key"].clone(), lines[1]["held"].clone()),
        ("held".into(), true.into())
    );
    fs::write(dir.path("go"), "").expect("go");
    assert!(holder.wait().success());

    // Not with permits.
    let mut c = waitlock(&server, &dir);
    c.args(["run", "-s", "a", "--also", "b", "--", "true"]);
    assert_eq!(output(c).status.code(), Some(64));
}
