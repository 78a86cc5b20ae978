//! `waitlock`: run a command under a distributed lock (or permits) on Redis, show a key's lock
//! and permits, release a lock.
//!
//! See `docs/cli.md` and `waitlock --help`. Exit codes follow flock(1) and sysexits(3); they
//! are listed in `report.rs` and in the long help.

mod args;
mod report;
mod run;
mod watch;

use args::{Cli, Command, Conn, LeaderArgs, ReleaseArgs, StatusArgs};
use clap::Parser;
use report::{describe, exit_code, quoted, secs, Reporter};
use std::process::ExitCode;
use std::time::Duration;
use waitlock::{Error, Locker, PermitStatus, MAX_PERMITS};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; everything else is bad usage,
            // which scripts tell apart from the command's own failures by 64 (clap says 2).
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { report::USAGE } else { 0 });
        }
    };
    if cli.verbose {
        init_tracing();
    }
    let out = Reporter::new(cli.quiet);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            out.error(format!("cannot start the async runtime: {e}"));
            return ExitCode::from(report::SOFTWARE);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(args, out).await,
            Command::Status(args) => status(args, out).await,
            Command::Release(args) => release(args, out).await,
            Command::Leader(args) => leader(args, out).await,
            Command::Elect(args) => run::elect(args, out).await,
        }
    });
    ExitCode::from(code)
}

/// The library's debug log (and this tool's) on stderr.
fn init_tracing() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(Targets::new().with_target("waitlock", LevelFilter::DEBUG))
        .init();
}

/// A polling locker: status and release send one command each and never wait.
async fn locker(conn: &Conn) -> Result<Locker, Error> {
    tracing::debug!(url = %report::redact(&conn.url), "connecting");
    let builder = Locker::connect_with(&conn.url, &conn.options())
        .await?
        .prefix(conn.prefix.as_str());
    match &conn.label {
        Some(label) => builder.label(label.as_str()),
        None => builder,
    }
    .build()
}

/// `waitlock status`: the lock's line and, when the key has permits recorded, theirs; or one
/// JSON object. Exit 0 whether held or not. With `--watch`, again at every change of the key.
async fn status(args: StatusArgs, out: Reporter) -> u8 {
    let locker = match locker(&args.conn).await {
        Ok(l) => l,
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            return exit_code(&e, report::SOFTWARE);
        }
    };
    let shown = if args.watch {
        watch::watch(&locker, &args).await
    } else {
        let mut shown = Ok(());
        for key in std::iter::once(&args.key).chain(&args.more) {
            shown = show(&locker, &args, key).await;
            if shown.is_err() {
                break;
            }
        }
        shown
    };
    match shown {
        Ok(()) => 0,
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            exit_code(&e, report::SOFTWARE)
        }
    }
}

/// Reads `key`'s lock and permits and prints them (one line each, the table of who holds
/// and waits; or one JSON object).
async fn show(locker: &Locker, args: &StatusArgs, key: &str) -> Result<(), Error> {
    let status = locker.status(key).await?;
    // A key's permit state does not depend on the number asked for: any semaphore reads
    // it, whatever N (or the read-write lock) the key is used with.
    let permits = locker.semaphore(1)?.status(key).await?;
    if args.json {
        let json = serde_json::json!({
            "key": key,
            "held": status.held,
            "remaining_ttl_ms": status.remaining_ttl.map(millis),
            "fence": status.fence,
            "queued": status.queued,
            // Never the token: whoever has it can release the lock.
            "holder": status.holder.as_ref().map(|h| serde_json::json!({
                "process_id": h.process_id,
                "label": h.label,
                "held_for_ms": h.held_for.map(millis),
            })),
            "waiters": waiters_json(&status.waiters),
            "permits": permits_json(&permits),
        });
        println!("{json}");
        return Ok(());
    }
    let fence = status
        .fence
        .map_or_else(|| "none".to_owned(), |f| f.to_string());
    if status.held {
        let expires = status.remaining_ttl.map_or_else(
            || "never expires".to_owned(),
            |d| format!("expires in {}", secs(d)),
        );
        println!(
            "{} is held: {expires}, fence {fence}, {} queued",
            quoted(key),
            status.queued
        );
    } else {
        println!(
            "{} is free: last fence {fence}, {} queued",
            quoted(key),
            status.queued
        );
    }
    for line in people(&status) {
        println!("{line}");
    }
    if let Some(line) = permits_line(key, &permits) {
        println!("{line}");
        for line in permit_people(&permits) {
            println!("{line}");
        }
    }
    Ok(())
}

/// `status`'s table of who holds and who waits, labels escaped (a label is any text):
///
/// ```text
///   holder   build-7:4113:worker   held 12.0 s   process 0123456789ab
///   waiter 1 build-8:977:worker    waited 3.2 s  process 89abcdef0123
/// ```
fn people(status: &waitlock::LockStatus) -> Vec<String> {
    let mut rows: Vec<[String; 4]> = Vec::new();
    if let Some(h) = &status.holder {
        rows.push([
            "holder".into(),
            shown(&h.label),
            h.held_for
                .map_or_else(String::new, |d| format!("held {}", secs(d))),
            match &h.process_id {
                Some(pid) => format!("process {pid}"),
                // (Never the token: whoever has it can release the lock.)
                None => "(a polling locker's or a caller's token)".into(),
            },
        ]);
    }
    waiter_rows(&mut rows, &status.waiters, status.queued, false);
    table(&rows)
}

/// The permits' table: each lease's holder (permits held, when the lease ends), then the
/// waiters (permits asked for).
fn permit_people(p: &PermitStatus) -> Vec<String> {
    let mut rows: Vec<[String; 4]> = p
        .lease_holders
        .iter()
        .map(|h| {
            [
                format!("holds {}", h.weight),
                shown(&h.label),
                format!("lease ends in {}", secs(h.ends_in)),
                h.process_id.as_ref().map_or_else(
                    || "(a polling locker's)".into(),
                    |pid| format!("process {pid}"),
                ),
            ]
        })
        .collect();
    waiter_rows(&mut rows, &p.waiters, p.queued, true);
    table(&rows)
}

/// A label as the table shows it: escaped, on one line.
fn shown(label: &Option<String>) -> String {
    match label {
        Some(l) => l.escape_debug().to_string(),
        None => "(no label)".to_owned(),
    }
}

fn waiter_rows(
    rows: &mut Vec<[String; 4]>,
    waiters: &[waitlock::Waiter],
    queued: usize,
    weights: bool,
) {
    for (i, w) in waiters.iter().enumerate() {
        let asks = if weights {
            format!(" for {}", w.weight)
        } else if !w.set.is_empty() {
            format!(" (a set of {})", w.set.len())
        } else {
            String::new()
        };
        rows.push([
            format!("waiter {}{asks}", i + 1),
            shown(&w.label),
            format!("waited {}", secs(w.waited)),
            format!("process {}", w.process_id),
        ]);
    }
    if queued > waiters.len() {
        let more = queued - waiters.len();
        rows.push([
            String::new(),
            format!("... {more} more queued"),
            String::new(),
            String::new(),
        ]);
    }
}

/// Rows as aligned columns, indented.
fn table(rows: &[[String; 4]]) -> Vec<String> {
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    rows.iter()
        .map(|r| {
            format!("  {:<w0$} {:<w1$} {:<w2$} {}", r[0], r[1], r[2], r[3])
                .trim_end()
                .to_owned()
        })
        .collect()
}

/// `waitlock leader`: who leads NAME (one line, or one JSON object); with `--watch`, again
/// at every change until Ctrl-C. Exit 0 whether someone leads or not.
async fn leader(args: LeaderArgs, out: Reporter) -> u8 {
    let shown = async {
        let locker = locker(&args.conn).await?;
        let election = locker.election(&args.name)?;
        let print = |l: &Option<waitlock::Leader>| {
            let name = &args.name;
            if args.json {
                let leader = l.as_ref().map(|l| {
                    serde_json::json!({
                        "value": l.value,
                        "term": l.term,
                        "leading_for_ms": l.leading_for.map(millis),
                        "lease_left_ms": l.lease_left.map(millis),
                        "process_id": l.process_id,
                    })
                });
                println!(
                    "{}",
                    serde_json::json!({"election": name, "leader": leader})
                );
            } else {
                match l {
                    None => println!("nobody leads {}", quoted(name)),
                    Some(l) => println!(
                        "{} is led by {} (term {}{}{})",
                        quoted(name),
                        quoted(&l.value.escape_debug().to_string()),
                        l.term,
                        l.leading_for
                            .map(|d| format!(", for {}", secs(d)))
                            .unwrap_or_default(),
                        l.lease_left
                            .map(|d| format!(", lease ends in {}", secs(d)))
                            .unwrap_or_default()
                    ),
                }
            }
        };
        if !args.watch {
            print(&election.leader().await?);
            return Ok::<_, Error>(());
        }
        let mut changes = election.observe().await?;
        let mut interrupt = watch::interrupt()?;
        print(&changes.borrow_and_update().clone());
        loop {
            tokio::select! {
                _ = interrupt.recv() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    print(&changes.borrow_and_update().clone());
                }
            }
        }
    };
    match shown.await {
        Ok(()) => 0,
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            exit_code(&e, report::SOFTWARE)
        }
    }
}

/// After a failed release: a note when the key has permits held, whose tokens `release` does
/// not take (a token from a `run -s`, `-x` or `--limit` fails as "not held").
async fn permits_hint(locker: &Locker, key: &str) -> String {
    let Ok(any) = locker.semaphore(1) else {
        return String::new();
    };
    match any.status(key).await {
        Ok(p) if p.holders > 0 => format!(
            ". {} has permits held: `release` frees plain locks only; a permit is given back \
             by the `waitlock run` that holds it",
            quoted(key)
        ),
        _ => String::new(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `status --json`'s waiters (the lock's, the permits').
fn waiters_json(waiters: &[waitlock::Waiter]) -> serde_json::Value {
    waiters
        .iter()
        .map(|w| {
            serde_json::json!({
                "process_id": w.process_id,
                "label": w.label,
                "waited_ms": millis(w.waited),
                "ttl_ms": millis(w.ttl),
                "weight": w.weight,
                "set": w.set,
            })
        })
        .collect()
}

/// `status --json`'s "permits": null when the key has none recorded.
fn permits_json(p: &PermitStatus) -> serde_json::Value {
    let Some(n) = p.permits else {
        return serde_json::Value::Null;
    };
    serde_json::json!({
        "kind": if n == MAX_PERMITS { "rw_lock" } else { "semaphore" },
        "permits": n,
        "held": p.held,
        "holders": p.holders,
        "queued": p.queued,
        "first_lease_ends_in_ms": p.first_lease_ends_in.map(millis),
        "fence": p.fence,
        "leases": p.leases.iter().zip(&p.lease_holders).map(|((token, left), h)| serde_json::json!({
            "token": token,
            "ends_in_ms": millis(*left),
            "weight": h.weight,
            "process_id": h.process_id,
            "label": h.label,
        })).collect::<Vec<_>>(),
        "waiters": waiters_json(&p.waiters),
    })
}

/// `status`'s second line, when the key has permits recorded: e.g. `'config' read-write lock:
/// held by 2 readers, the first lease ends in 29.1 s, fence 17, 1 queued`.
fn permits_line(key: &str, p: &PermitStatus) -> Option<String> {
    let n = p.permits?;
    let fence = p.fence.map_or_else(|| "none".to_owned(), |f| f.to_string());
    let plural = |count: usize, one: &str| {
        if count == 1 {
            format!("1 {one}")
        } else {
            format!("{count} {one}s")
        }
    };
    let (kind, held) = match (n == MAX_PERMITS, p.held) {
        (true, 0) => ("read-write lock", "free".to_owned()),
        (true, MAX_PERMITS) => ("read-write lock", "held by a writer".to_owned()),
        (true, _) => (
            "read-write lock",
            format!("held by {}", plural(p.holders, "reader")),
        ),
        (false, 0) => ("semaphore", format!("0 of {n} permits held")),
        (false, held) => (
            "semaphore",
            format!(
                "{held} of {n} permits held by {}",
                plural(p.holders, "holder")
            ),
        ),
    };
    let lease = match p.first_lease_ends_in {
        Some(d) => format!("the first lease ends in {}, fence {fence}", secs(d)),
        None => format!("last fence {fence}"),
    };
    // Then the holders whose leases end first (10 at most) and the first waiters: see
    // `permit_people`.
    Some(format!(
        "{} {kind}: {held}, {lease}, {} queued",
        quoted(key),
        p.queued
    ))
}

/// `waitlock release`: 0 released, 1 not held by that token.
async fn release(args: ReleaseArgs, out: Reporter) -> u8 {
    let locker = match locker(&args.conn).await {
        Ok(locker) => locker,
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            return exit_code(&e, report::SOFTWARE);
        }
    };
    match locker.unlock(&args.key, &args.token).await {
        Ok(()) => {
            out.info(format!("released {}", quoted(&args.key)));
            0
        }
        Err(Error::NotHeld { key }) => {
            out.error(format!(
                "{} is not held by that token (it expired, was released, or another \
                 holder has it now); nothing changed{}",
                quoted(&key),
                permits_hint(&locker, &key).await
            ));
            1
        }
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            exit_code(&e, report::SOFTWARE)
        }
    }
}
