//! The command line, as clap reads it.

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;
use waitlock::{ConnectOptions, TlsOptions};

/// Printed after `--help`: what a script or cron job needs to know.
const AFTER_LONG_HELP: &str = "\
Exit codes of `run`:
  the command's own   when it ran (128 + n when it was killed by signal n)
  1                   the lock was held (--nonblock) or the wait ran out (see --conflict-exit-code)
  64                  bad usage: unknown option, bad duration, empty key or prefix, bad URL,
                      a --tls-* file that cannot be read or holds no usable PEM, --limit 0,
                      two of -s/-x/--limit, --also with one of them, or a key in use with
                      another --limit (or with -s/-x when this run gives --limit, and the
                      other way round)
  69                  Redis could not be reached, refused the password or the TLS handshake
                      (e.g. a certificate from an untrusted CA), or stopped answering
  70                  any other failure (e.g. the lock's Redis key holds foreign data)
  75                  the lock (or permit) was lost while the command ran (the command was
                      terminated), or was no longer held when the command exited
  126 / 127           the command could not be run / was not found
  128 + n             waitlock itself got signal n while waiting for the lock
`status` exits 0 whether the key is held or free; `release` exits 0 when it released the lock
and 1 when the token did not hold it; both use 64, 69 and 70 as above.

Permits (-s, -x, --limit N) are not the plain lock: KEY's read-write lock and semaphore are
other Redis keys, so a plain `run KEY` does not wait for a `run -s KEY` (nor the other way
round). All runs of a key use the same kind: -s/-x, or --limit with one N. `release` frees
plain locks only; a permit is given back by the run that holds it.

Environment:
  REDIS_URL           the default for --url
  The command gets WAITLOCK_KEY, WAITLOCK_FENCE (a number that grows with every acquisition
  of the key: hand it to storage that refuses stale writers; with -s or --limit, holders
  overlap, so it orders them but cannot fence one out) and WAITLOCK_TOKEN (the holder's
  token; `waitlock release` reads it for a plain lock). With --also: those of KEY, and
  WAITLOCK_KEYS (every key held, one per line) and WAITLOCK_FENCES (their fences, space-
  separated), in the order taken.

Examples:
  waitlock run nightly-report -- ./report.sh --full
  waitlock run --tls-ca ca.pem --url rediss://redis.internal:6380 report -- ./report.sh
  waitlock -q run --nonblock backup -- /usr/local/bin/backup   # cron: skip if still running
  waitlock run --limit 4 thumbnails -- ./thumb.sh    # at most 4 at once, across hosts
  waitlock run -s config -- ./read.sh                # readers run together...
  waitlock run -x config -- ./write.sh               # ...a writer runs alone
  waitlock run {stock}:paris --also {stock}:lyon -- ./move.sh   # both keys, at once
  waitlock status nightly-report --json";

/// Runs a command while holding a distributed lock on Redis; shows and releases locks.
#[derive(Debug, Parser)]
#[command(
    name = "waitlock",
    version,
    about = "Run a command under a distributed lock on Redis (like flock(1), across hosts)",
    long_about = "Run a command under a distributed lock on Redis, like flock(1) across hosts.\n\n\
        `waitlock run KEY -- COMMAND` waits for the lock on KEY (woken by the holder's \
        release, not polling), runs COMMAND while refreshing the lock, and releases it when \
        COMMAND exits. If the lock is lost meanwhile, COMMAND is terminated. With -s/-x \
        (a read-write lock, like flock -s/-x) or --limit N (at most N at once), it holds \
        permits of KEY instead.",
    after_long_help = AFTER_LONG_HELP,
    propagate_version = true
)]
pub struct Cli {
    /// Print only errors: no "waited for", "held, waiting" or conflict messages.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Also print the library's debug log (acquire, refresh, release) to stderr.
    #[arg(short, long, global = true)]
    pub verbose: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Take the lock on KEY (or a permit: -s, -x, --limit N), run COMMAND while holding it,
    /// release it when COMMAND exits.
    #[command(
        long_about = "Take the lock on KEY, run COMMAND while holding it, release it when \
            COMMAND exits; exit with COMMAND's status.\n\n\
            COMMAND runs in its own process group. SIGINT, SIGTERM and SIGHUP sent to waitlock \
            are forwarded to that group, and the lock is released once COMMAND has exited. \
            The lock is refreshed every 0.8 x TTL; if it is lost anyway (it expired while \
            Redis was unreachable, or someone released or deleted it), the group gets SIGTERM, \
            then SIGKILL after the grace period, and waitlock exits 75.\n\n\
            With -s (--shared) it takes a read hold of KEY's read-write lock: shared runs \
            overlap, an exclusive one waits for them; with -x (--exclusive) a write hold: it \
            runs alone, no shared run at the same time. With --limit N it holds 1 of N permits \
            of KEY: at most N such runs at once. Waiters are served in order (a waiting writer \
            holds back the readers that come after it). Everything else (waiting, --nonblock, \
            refresh, termination on loss, signals, exit codes, WAITLOCK_*) is as for the lock.",
        after_long_help = AFTER_LONG_HELP
    )]
    Run(RunArgs),

    /// Show whether KEY is held, for how long yet, its fence and its queue, and its permits
    /// (read-write lock or semaphore) when any are recorded.
    Status(StatusArgs),

    /// Release KEY held by TOKEN (for operators: a holder that is stuck or gone).
    #[command(
        long_about = "Release KEY if TOKEN holds it, and wake its waiters. For operators: a \
            holder that is stuck or gone. Exits 0 when released, 1 when TOKEN does not hold \
            KEY (it expired, was released, or another holder has it now).\n\n\
            Inside a command run by `waitlock run`, `waitlock release \"$WAITLOCK_KEY\"` \
            releases the lock early (waitlock then sees the lock lost and terminates the \
            command).\n\n\
            Plain locks only: a permit (`run -s`, `-x` or `--limit`) is given back by the run \
            that holds it (end or signal that run; a crashed holder's permit comes back when \
            its lease ends)."
    )]
    Release(ReleaseArgs),

    /// Campaign in the election NAME and run COMMAND while leading; resign when it exits.
    #[command(
        long_about = "Wait in the queue of the election NAME until leading (FIFO across hosts), \
            announce VALUE as the leader's, run COMMAND while leading, and resign when it \
            exits: the next candidate leads at once. Exit with COMMAND's status.\n\n\
            As `run`: the lease is refreshed every 0.8 x TTL, and if leadership is lost the \
            command's group gets SIGTERM, then SIGKILL after the grace period, and waitlock \
            exits 75. WAITLOCK_FENCE is the term. -s, -x and --limit do not apply."
    )]
    Elect(ElectArgs),

    /// Show who leads the election NAME (its value, term, how long, lease left), or that
    /// nobody does; with --watch, again at every change of leader.
    Leader(LeaderArgs),
}

/// `waitlock elect`.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The value to announce as the leader's (default: this process's label).
    #[arg(long, value_name = "TEXT")]
    pub value: Option<String>,

    /// After a leader whose lease ran out (it did not resign), wait this long more before
    /// leading (as Consul's lock-delay).
    #[arg(long, default_value = "0s", value_parser = duration, value_name = "DURATION")]
    pub lock_delay: Duration,

    /// The run's options; KEY is the election's name.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `waitlock leader`.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    #[command(flatten)]
    pub conn: Conn,

    /// Print one JSON object: {"election", "leader"}; "leader" is null or {"value", "term",
    /// "leading_for_ms", "lease_left_ms", "process_id"}.
    #[arg(long)]
    pub json: bool,

    /// Print the leader again at every change of leader (a new term, or nobody leading), told
    /// by Redis (no polling), until interrupted (Ctrl-C: exit 0).
    #[arg(long)]
    pub watch: bool,

    /// The election's name.
    #[arg(value_name = "NAME")]
    pub name: String,
}

/// Where the locks live.
#[derive(Debug, Args)]
pub struct Conn {
    /// The Redis to use: redis://[user:password@]host[:port][/db], rediss:// for TLS.
    #[arg(
        long,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub url: String,

    /// The prefix of the lock's Redis names; every locker of a key must use the same one.
    #[arg(long, default_value = waitlock::DEFAULT_PREFIX, value_name = "P")]
    pub prefix: String,

    /// With a rediss:// URL: trust only the CA certificates in this PEM file (e.g. a private
    /// CA) instead of the system's.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// With a rediss:// URL: present this client certificate (PEM, with any intermediates),
    /// for servers with `tls-auth-clients yes`. Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// The name `waitlock status` shows for this process while it holds or waits (default:
    /// <host>:<pid>:waitlock).
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
}

impl Conn {
    /// How to connect: the TLS settings given on the command line, if any (a rediss:// URL
    /// without them trusts the system's CAs).
    pub fn options(&self) -> ConnectOptions {
        let mut tls = None;
        if let Some(ca) = &self.tls_ca {
            tls = Some(TlsOptions::new().with_ca_file(ca));
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            tls = Some(tls.unwrap_or_default().with_client_cert_files(cert, key));
        }
        match tls {
            Some(tls) => ConnectOptions::new().with_tls(tls),
            None => ConnectOptions::new(),
        }
    }
}

/// `waitlock run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub conn: Conn,

    /// How long Redis keeps the lock without a refresh (it is refreshed every 0.8 x TTL), so
    /// how long others wait if waitlock's host dies: e.g. 30s, 1m, 500ms.
    #[arg(long, default_value = "30s", value_parser = positive_duration, value_name = "DURATION")]
    pub ttl: Duration,

    /// How long to wait for the lock before giving up with the conflict exit code.
    #[arg(
        short,
        long,
        default_value = "10s",
        value_parser = duration,
        value_name = "DURATION",
        conflicts_with = "nonblock"
    )]
    pub wait: Duration,

    /// Do not wait: if the lock is held, exit with the conflict exit code at once.
    #[arg(short, long)]
    pub nonblock: bool,

    /// The exit code when the lock could not be had (held, or the wait ran out).
    #[arg(short = 'E', long, default_value_t = 1, value_name = "N")]
    pub conflict_exit_code: u8,

    /// Take a shared (read) hold of KEY's read-write lock instead of the lock: shared runs
    /// overlap; an exclusive one (-x) runs with none of them.
    #[arg(short, long, group = "permits")]
    pub shared: bool,

    /// Take an exclusive (write) hold of KEY's read-write lock instead of the lock: no other
    /// -s or -x run of KEY at the same time.
    #[arg(short = 'x', long, group = "permits")]
    pub exclusive: bool,

    /// Hold 1 of N permits of KEY's semaphore instead of the lock: at most N runs of KEY at
    /// once, across hosts (1 to 1048576; every run of KEY must give the same N).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(waitlock::MAX_PERMITS)),
        group = "permits"
    )]
    pub limit: Option<u32>,

    /// When the lock is lost: how long the command has after SIGTERM before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = duration, value_name = "DURATION")]
    pub grace: Duration,

    /// The lock's name.
    #[arg(value_name = "KEY")]
    pub key: String,

    /// Also hold the lock on this key (repeat for more): the command runs holding KEY and
    /// every --also key, taken as a set, so runs that give the same keys in other orders never
    /// deadlock. Keys on one node (one server, or one hash tag: {acct}:a, {acct}:b; up to 64):
    /// waited for at once, holding nothing, in the order runs started waiting; otherwise in
    /// one fixed order (by hash slot then key), each slot's keys together, those of earlier
    /// slots held while the next are waited for. Plain locks only (not with -s, -x, --limit).
    #[arg(long, value_name = "KEY", conflicts_with = "permits")]
    pub also: Vec<String>,

    /// The command to run under the lock, and its arguments (after `--`).
    #[arg(
        value_name = "COMMAND",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// `waitlock status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub conn: Conn,

    /// Print one JSON object: {"key", "held", "remaining_ttl_ms", "fence", "queued", "holder",
    /// "waiters", "permits"}; "holder" is null or {"process_id", "label", "held_for_ms"} (never
    /// the token); "waiters" lists the first 10 in queue order as {"process_id", "label",
    /// "waited_ms", "ttl_ms", "weight"}; "permits" is null, or {"kind": "rw_lock" or
    /// "semaphore", "permits", "held", "holders", "queued", "first_lease_ends_in_ms", "fence",
    /// "leases" (the first 10 to end: {"token", "ends_in_ms", "weight", "process_id",
    /// "label"}), "waiters" (as the lock's)}.
    #[arg(long)]
    pub json: bool,

    /// Print the status again whenever the key changes in Redis (told by Redis itself: client
    /// tracking of the key's names, no polling), until interrupted (Ctrl-C: exit 0). Each
    /// snapshot starts with a line "--- +<seconds> ---" (with --json: one object per line).
    #[arg(long)]
    pub watch: bool,

    /// The lock's name.
    #[arg(value_name = "KEY")]
    pub key: String,

    /// More keys (a set, as `run --also` takes it): each is shown in turn (with --json, one
    /// object per line). Not with --watch.
    #[arg(value_name = "MORE_KEYS", conflicts_with = "watch")]
    pub more: Vec<String>,
}

/// `waitlock release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub conn: Conn,

    /// The holder's token (a running command has it in WAITLOCK_TOKEN).
    #[arg(long, env = "WAITLOCK_TOKEN", hide_env_values = true, value_name = "T")]
    pub token: String,

    /// The lock's name.
    #[arg(value_name = "KEY")]
    pub key: String,
}

/// A duration such as `30s`, `1m 30s` or `250ms`.
fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 30s, 1m 30s, 250ms)"))
}

/// A duration of at least 1 ms.
fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_command_keeps_its_own_options() {
        let cli = Cli::try_parse_from(["waitlock", "run", "-n", "k", "--", "ls", "-l", "--all"])
            .expect("parse");
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert!(run.nonblock);
        assert_eq!(run.command, ["ls", "-l", "--all"]);
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let cert_only = ["waitlock", "status", "--tls-cert", "c.pem", "k"];
        assert!(Cli::try_parse_from(cert_only).is_err());
        let both = [
            "waitlock",
            "status",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "c.key",
            "k",
        ];
        let cli = Cli::try_parse_from(both).expect("parse");
        let Command::Status(status) = cli.command else {
            panic!("not status")
        };
        let shown = format!("{:?}", status.conn.options());
        assert!(
            shown.contains("ca.pem") && shown.contains("c.pem"),
            "{shown}"
        );
    }

    #[test]
    fn durations_are_human() {
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(duration("30").is_err());
        assert!(positive_duration("0s").is_err());
    }
}
