//! `waitlock run`: take the lock (or permits of the key: -s, -x, --limit), run the command in
//! its own process group while refreshing it, release it when the command exits.

use crate::args::{ElectArgs, RunArgs};
use crate::report::{self, describe, exit_code, quoted, secs, Reporter};
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;
use waitlock::{Error, Leadership, LockGuard, LockOptions, LockSetGuard, Locker, Queue};

/// What `run` takes on KEY: the lock, or permits of the key. The only place the two differ;
/// everything after (waiting, refresh, supervision, release) works on the same `LockGuard`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The plain lock (none of -s, -x, --limit).
    Lock,
    /// A read hold of KEY's read-write lock (-s).
    Shared,
    /// A write hold of KEY's read-write lock (-x).
    Exclusive,
    /// One of this many permits of KEY's semaphore (--limit N).
    Limit(u32),
    /// The leadership of the election KEY (`waitlock elect`).
    Elect,
}

impl Hold {
    /// The choice made on the command line (clap lets at most one of them through).
    pub fn of(args: &RunArgs) -> Hold {
        match (args.shared, args.exclusive, args.limit) {
            (true, _, _) => Hold::Shared,
            (_, true, _) => Hold::Exclusive,
            (_, _, Some(n)) => Hold::Limit(n),
            _ => Hold::Lock,
        }
    }

    /// One attempt (`wait` false) or a wait up to `opts.wait`.
    async fn acquire(
        self,
        locker: &Locker<Queue>,
        key: &str,
        opts: &LockOptions,
        wait: bool,
    ) -> Result<LockGuard, Error> {
        match (self, wait) {
            (Hold::Lock, false) => locker.acquire(key, opts).await,
            (Hold::Lock, true) => locker.acquire_wait(key, opts).await,
            (Hold::Shared, false) => locker.rw_lock().read(key, opts).await,
            (Hold::Shared, true) => locker.rw_lock().read_wait(key, opts).await,
            (Hold::Exclusive, false) => locker.rw_lock().write(key, opts).await,
            (Hold::Exclusive, true) => locker.rw_lock().write_wait(key, opts).await,
            (Hold::Limit(n), false) => locker.semaphore(n)?.acquire(key, 1, opts).await,
            (Hold::Limit(n), true) => locker.semaphore(n)?.acquire_wait(key, 1, opts).await,
            // Campaigns go through `elect`, never here.
            (Hold::Elect, _) => Err(Error::InvalidSetting {
                field: "hold",
                value: "elect".into(),
                reason: "is taken by `waitlock elect` only",
            }),
        }
    }

    /// What is waited for, where the lock's messages name the key: `'k'`, `a shared hold of
    /// 'k'`, ...
    fn target(self, key: &str) -> String {
        let key = quoted(key);
        match self {
            Hold::Lock => key,
            Hold::Shared => format!("a shared hold of {key}"),
            Hold::Exclusive => format!("an exclusive hold of {key}"),
            Hold::Limit(n) => format!("one of the {n} permits of {key}"),
            Hold::Elect => format!("the leadership of {key}"),
        }
    }

    /// What is held, where the lock's messages say `lock on 'k'`.
    fn held(self, key: &str) -> String {
        let key = quoted(key);
        match self {
            Hold::Lock => format!("lock on {key}"),
            Hold::Shared => format!("shared hold of {key}"),
            Hold::Exclusive => format!("exclusive hold of {key}"),
            Hold::Limit(_) => format!("permit of {key}"),
            Hold::Elect => format!("leadership of {key}"),
        }
    }

    /// Why one attempt did not get it; `remaining` is the `Locked` error's: the holder's TTL
    /// for the lock, when the first lease ends for permits (zero: only waiters are ahead).
    fn busy(self, key: &str, remaining: Option<Duration>) -> String {
        let key = quoted(key);
        let when = match remaining {
            Some(d) if !d.is_zero() => format!("the first lease ends in {}", secs(d)),
            _ => "others are queued first".to_owned(),
        };
        match self {
            Hold::Lock => {
                let expires = remaining.map_or_else(
                    || "it has no expiry".to_owned(),
                    |d| format!("expires in {}", secs(d)),
                );
                format!("{key} is held by another holder ({expires})")
            }
            Hold::Shared => format!("{key} is held for writing or a writer waits ({when})"),
            Hold::Exclusive => {
                format!("{key} is held by readers or a writer, or others wait ({when})")
            }
            Hold::Limit(n) => {
                format!("all permits of {key} (limit {n}) are held or others wait ({when})")
            }
            Hold::Elect => format!("{key} has a leader or candidates queued first ({when})"),
        }
    }
}

/// What a run holds while its command runs: a lock's (or permits') guard, a set of locks
/// (`--also`), or a leadership.
pub enum Held {
    Guard(LockGuard),
    Set(LockSetGuard),
    Lead(Leadership),
}

impl Held {
    /// Starts the keep-alive (a set's runs since it was taken); the loss token.
    fn keep_alive(&mut self) -> CancellationToken {
        match self {
            Held::Guard(g) => g.keep_alive(),
            Held::Set(s) => s.lost(),
            Held::Lead(l) => l.guard_mut().keep_alive(),
        }
    }

    /// Why it was lost (for a set: which key, and why), if it was.
    fn loss(&mut self) -> Option<String> {
        match self {
            Held::Guard(g) => g.loss().map(|r| r.to_string()),
            Held::Set(s) => s.loss().map(|(k, r)| format!("{}: {r}", quoted(k))),
            Held::Lead(l) => l.guard_mut().loss().map(|r| r.to_string()),
        }
    }

    /// The command's environment: WAITLOCK_KEY, WAITLOCK_FENCE, WAITLOCK_TOKEN (of KEY, the
    /// first key given), and for a set WAITLOCK_KEYS (one per line) and WAITLOCK_FENCES
    /// (space-separated), both in the order taken.
    fn env(&mut self, key: &str) -> Vec<(&'static str, String)> {
        let one = |g: &LockGuard| {
            vec![
                ("WAITLOCK_KEY", key.to_owned()),
                ("WAITLOCK_FENCE", g.fence().to_string()),
                ("WAITLOCK_TOKEN", g.token().to_owned()),
            ]
        };
        match self {
            Held::Guard(g) => one(g),
            Held::Lead(l) => one(l.guard_mut()),
            Held::Set(s) => {
                let first = s.guards().iter().find(|g| g.key() == key);
                let mut env = first.map(one).unwrap_or_default();
                env.push(("WAITLOCK_KEYS", s.keys().collect::<Vec<_>>().join("\n")));
                let fences: Vec<String> =
                    s.guards().iter().map(|g| g.fence().to_string()).collect();
                env.push(("WAITLOCK_FENCES", fences.join(" ")));
                env
            }
        }
    }

    /// The fence(s), for messages: `fence 7`, or `fences 'a' 7, 'b' 3`.
    fn fences(&mut self) -> String {
        match self {
            Held::Guard(g) => format!("fence {}", g.fence()),
            Held::Lead(l) => format!("fence {}", l.guard_mut().fence()),
            Held::Set(s) => {
                let each: Vec<String> = s
                    .guards()
                    .iter()
                    .map(|g| format!("{} {}", quoted(g.key()), g.fence()))
                    .collect();
                format!("fences {}", each.join(", "))
            }
        }
    }

    /// Gives it back (a leadership resigns).
    async fn release(self) -> Result<(), Error> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Set(s) => s.release().await,
            Held::Lead(l) => l.resign().await,
        }
    }

    /// As `LockGuard::release_after_section` (a leadership resigns after its term).
    async fn release_after_section(self) -> Result<(), Error> {
        match self {
            Held::Guard(g) => g.release_after_section().await,
            Held::Set(s) => s.release_after_section().await,
            Held::Lead(l) => l.resign_after_term().await,
        }
    }
}

/// The keys a run holds: KEY, then every --also key.
fn keys(args: &RunArgs) -> Vec<String> {
    std::iter::once(&args.key)
        .chain(&args.also)
        .cloned()
        .collect()
}

/// What is waited for: as [`Hold::target`], or for a set `the set 'a', 'b'`.
fn target(args: &RunArgs, hold: Hold) -> String {
    if args.also.is_empty() {
        return hold.target(&args.key);
    }
    let each: Vec<String> = keys(args).iter().map(|k| quoted(k)).collect();
    format!("the set {}", each.join(", "))
}

/// What is held: as [`Hold::held`], or for a set `locks on the set 'a', 'b'`.
fn held_name(args: &RunArgs, hold: Hold) -> String {
    if args.also.is_empty() {
        hold.held(&args.key)
    } else {
        format!("locks on {}", target(args, hold))
    }
}

/// One attempt (`wait` false) or a wait up to `opts.wait` for what the run holds: KEY as
/// `hold` says, or the set of KEY and the --also keys.
async fn take(
    args: &RunArgs,
    hold: Hold,
    locker: &Locker<Queue>,
    opts: &LockOptions,
    wait: bool,
) -> Result<Held, Error> {
    if args.also.is_empty() {
        return hold
            .acquire(locker, &args.key, opts, wait)
            .await
            .map(Held::Guard);
    }
    let opts = opts.clone().with_ordered_sets();
    let keys = keys(args);
    let set = if wait {
        locker.acquire_many_wait(&keys, &opts).await
    } else {
        locker.acquire_many(&keys, &opts).await
    };
    set.map(Held::Set)
}

/// `waitlock elect`: campaigns in the election KEY, runs the command while leading, resigns.
pub async fn elect(args: ElectArgs, out: Reporter) -> u8 {
    let run = &args.run;
    if run.shared || run.exclusive || run.limit.is_some() || !run.also.is_empty() {
        out.error("-s, -x, --limit and --also do not apply to `elect`".to_owned());
        return report::USAGE;
    }
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            out.error(format!("cannot install signal handlers: {e}"));
            return report::SOFTWARE;
        }
    };
    let key = run.key.as_str();
    let url = run.conn.url.as_str();
    let fail = |e: Error| {
        out.error(describe(&e, url));
        exit_code(&e, run.conflict_exit_code)
    };
    let campaign = async {
        let locker = connect(run).await?;
        let value = args.value.clone().unwrap_or_else(|| {
            run.conn
                .label
                .clone()
                .unwrap_or_else(waitlock::default_label)
        });
        let wait = if run.nonblock {
            Duration::ZERO
        } else {
            run.wait
        };
        let opts = LockOptions::new().with_ttl(run.ttl).with_wait(wait);
        let started = Instant::now();
        let lead = locker
            .election(key)?
            .with_lock_delay(args.lock_delay)
            .campaign(&value, &opts)
            .await?;
        out.info(format!(
            "leading {} as {} after {} (term {})",
            quoted(key),
            quoted(&value.escape_debug().to_string()),
            secs(started.elapsed()),
            lead.term()
        ));
        Ok::<_, Error>((locker, lead))
    };
    let led = tokio::select! {
        led = campaign => led,
        sig = signals.recv() => {
            out.info(format!("got {} while campaigning for {}: not running the command", signal_name(sig), quoted(key)));
            return killed_by(sig);
        }
    };
    let (locker, lead) = match led {
        Ok(led) => led,
        Err(e @ (Error::WaitTimeout { .. } | Error::Locked { .. })) => {
            out.info(format!(
                "did not lead {}: not running the command",
                quoted(key)
            ));
            return exit_code(&e, run.conflict_exit_code);
        }
        Err(e) => return fail(e),
    };
    let code = supervise(run, Hold::Elect, Held::Lead(lead), &mut signals, out).await;
    drop(locker);
    code
}

/// The run's queued locker (its prefix and label from the command line).
async fn connect(args: &RunArgs) -> Result<Locker<Queue>, Error> {
    let mut builder = Locker::connect_with(&args.conn.url, &args.conn.options())
        .await?
        .prefix(args.conn.prefix.as_str());
    if let Some(label) = &args.conn.label {
        builder = builder.label(label.as_str());
    }
    builder.queued().build().await
}

/// The signals forwarded to the command (and that end a wait for the lock).
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    /// Installs the handlers; from here on these signals no longer kill waitlock.
    fn install() -> io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal received. Cancel safe (each `recv` is).
    async fn recv(&mut self) -> libc::c_int {
        tokio::select! {
            Some(()) = self.int.recv() => libc::SIGINT,
            Some(()) = self.term.recv() => libc::SIGTERM,
            Some(()) = self.hup.recv() => libc::SIGHUP,
        }
    }
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        libc::SIGKILL => "SIGKILL",
        _ => "a signal",
    }
}

/// The exit code of a process killed by `sig`, as the shells report it.
fn killed_by(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

/// Sends `sig` to the process group `pgid` (the command and whatever it started).
fn signal_group(pgid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::kill(-pgid, sig) };
    if rc != 0 {
        // ESRCH: the group is gone already, which is what we wanted.
        tracing::debug!(pgid, sig, error = %io::Error::last_os_error(), "kill");
    }
}

/// The shell's view of how the command ended.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(255),
        (None, Some(sig)) => killed_by(sig),
        (None, None) => report::SOFTWARE,
    }
}

/// Runs `waitlock run`; returns the exit code.
pub async fn run(args: RunArgs, out: Reporter) -> u8 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            out.error(format!("cannot install signal handlers: {e}"));
            return report::SOFTWARE;
        }
    };
    let hold = Hold::of(&args);
    // Until the command runs, a signal ends waitlock as it would have without handlers
    // (nothing is held yet, or the guard's drop releases what was).
    let guard = tokio::select! {
        guard = lock(&args, hold, out) => guard,
        sig = signals.recv() => {
            out.info(format!("got {} while waiting for {}: not running the command", signal_name(sig), target(&args, hold)));
            return killed_by(sig);
        }
    };
    let (locker, held) = match guard {
        Ok(held) => held,
        Err(code) => return code,
    };
    let code = supervise(&args, hold, held, &mut signals, out).await;
    // With --verbose: the locker's counters (waits, grants, losses) for this run.
    tracing::debug!(stats = ?locker.stats(), "lock statistics");
    drop(locker);
    code
}

/// Connects and takes the lock (or the permits); on failure, the message is printed and the
/// exit code returned.
async fn lock(args: &RunArgs, hold: Hold, out: Reporter) -> Result<(Locker<Queue>, Held), u8> {
    let url = args.conn.url.as_str();
    let fail = |e: Error| {
        out.error(describe(&e, url));
        exit_code(&e, args.conflict_exit_code)
    };
    tracing::debug!(url = %report::redact(url), "connecting");
    let locker = connect(args).await.map_err(fail)?;

    let once = LockOptions::new()
        .with_ttl(args.ttl)
        .with_wait(Duration::ZERO);
    let started = Instant::now();
    let nonblock = args.nonblock || args.wait.is_zero();
    // One attempt first, to say that we wait and for whom; the wait repeats it.
    match take(args, hold, &locker, &once, false).await {
        Ok(held) => return Ok((locker, held)),
        // (for a set: the first key found held)
        Err(Error::Locked { key, remaining_ttl }) => {
            let busy = hold.busy(&key, remaining_ttl);
            if nonblock {
                out.info(format!("{busy}: not running the command"));
                return Err(args.conflict_exit_code);
            }
            out.info(format!("{busy}: waiting up to {}", secs(args.wait)));
        }
        // A hiccup: the wait retries it until its deadline, as for any attempt.
        Err(e) if e.is_transient() && !nonblock => {
            tracing::debug!(error = %e, "first attempt failed; waiting");
        }
        Err(e) => return Err(fail(e)),
    }
    let wait = LockOptions::new()
        .with_ttl(args.ttl)
        .with_wait(args.wait.saturating_sub(started.elapsed()));
    match take(args, hold, &locker, &wait, true).await {
        Ok(mut held) => {
            out.info(format!(
                "waited {} for {} ({})",
                secs(started.elapsed()),
                target(args, hold),
                held.fences()
            ));
            Ok((locker, held))
        }
        Err(e @ (Error::WaitTimeout { .. } | Error::Locked { .. })) => {
            out.info(format!(
                "gave up on {} after waiting {}: not running the command",
                target(args, hold),
                secs(started.elapsed())
            ));
            Err(exit_code(&e, args.conflict_exit_code))
        }
        Err(e) => Err(fail(e)),
    }
}

/// Runs the command under `guard` until it exits; releases the lock; returns the exit code.
async fn supervise(
    args: &RunArgs,
    hold: Hold,
    mut held: Held,
    signals: &mut Signals,
    out: Reporter,
) -> u8 {
    let key = args.key.as_str();
    let held_since = Instant::now();
    let lost = held.keep_alive();
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut command = tokio::process::Command::new(program);
    command
        .args(rest)
        .envs(held.env(key))
        // Its own group, so a lost lock stops everything the command started, not only the
        // command itself.
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let name = program.to_string_lossy();
            let code = if e.kind() == io::ErrorKind::NotFound {
                out.error(format!("cannot run {name:?}: command not found"));
                report::NOT_FOUND
            } else {
                out.error(format!("cannot run {name:?}: {e}"));
                report::CANNOT_EXECUTE
            };
            release(held, target(args, hold), out).await;
            return code;
        }
    };
    // A group id is the pid of its leader; `id` is `Some` until the child has been waited for.
    let pgid = child
        .id()
        .and_then(|id| libc::pid_t::try_from(id).ok())
        .expect("a spawned child has a pid");

    let mut lost_at: Option<Instant> = None;
    let mut killed = false;
    let status = loop {
        let kill_at = lost_at.map(|t| t + args.grace);
        tokio::select! {
            status = child.wait() => break status,
            sig = signals.recv() => {
                out.info(format!("got {}: passing it on to the command", signal_name(sig)));
                signal_group(pgid, sig);
            }
            _ = lost.cancelled(), if lost_at.is_none() => {
                let why = held.loss().unwrap_or_else(|| "unknown reason".to_owned());
                out.error(format!(
                    "{} lost after {} ({why}): terminating the command (SIGTERM, SIGKILL after {})",
                    held_name(args, hold), secs(held_since.elapsed()), secs(args.grace)
                ));
                signal_group(pgid, libc::SIGTERM);
                lost_at = Some(Instant::now());
            }
            _ = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                out.error(format!("the command outlived the {} grace period: sending SIGKILL", secs(args.grace)));
                signal_group(pgid, libc::SIGKILL);
                killed = true;
            }
        }
    };
    let status = match status {
        Ok(status) => status,
        Err(e) => {
            // Not expected: the child was spawned by us and is waited for only here.
            out.error(format!("cannot wait for the command: {e}"));
            signal_group(pgid, libc::SIGKILL);
            release(held, target(args, hold), out).await;
            return report::SOFTWARE;
        }
    };
    let code = status_code(status);
    let ran = secs(held_since.elapsed());
    if let Some(at) = lost_at {
        out.error(format!(
            "command terminated {} after the {} was lost (its status: {code})",
            secs(at.elapsed()),
            held_name(args, hold)
        ));
        release(held, target(args, hold), out).await;
        return report::LOST;
    }
    // The library's rule (`run`'s): a release that only came late after the command ended
    // within the lease is not a lost lock.
    match held.release_after_section().await {
        Ok(()) => code,
        Err(Error::Expired { .. }) => {
            out.error(format!(
                "{} was no longer held when the command exited after {ran} (its status: {code}): \
                 it may have run partly without the lock",
                target(args, hold)
            ));
            report::LOST
        }
        Err(e) => {
            out.error(format!(
                "could not release {} ({}); it expires by its TTL of {}",
                target(args, hold),
                describe(&e, &args.conn.url),
                secs(args.ttl)
            ));
            code
        }
    }
}

/// Releases after a failure (the exit code is decided already): says only what is useful.
/// `what` is [`Hold::target`]'s.
async fn release(held: Held, what: String, out: Reporter) {
    match held.release().await {
        Ok(()) | Err(Error::NotHeld { .. }) => {}
        Err(e) => out.error(format!(
            "could not release {what}: {e}; it expires by its TTL"
        )),
    }
}
