//! `waitlock`: run a command under a distributed lock on Redis, show or release a lock.
//!
//! See `docs/cli.md` and `waitlock --help`. Exit codes follow flock(1) and sysexits(3); they
//! are listed in `report.rs` and in the long help.

mod args;
mod report;
mod run;

use args::{Cli, Command, Conn, ReleaseArgs, StatusArgs};
use clap::Parser;
use report::{describe, exit_code, quoted, secs, Reporter};
use std::process::ExitCode;
use waitlock::{Error, Locker};

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
    Locker::connect_with(&conn.url, &conn.options())
        .await?
        .prefix(conn.prefix.as_str())
        .build()
}

/// `waitlock status`: one line for people, or one JSON object; exit 0 whether held or not.
async fn status(args: StatusArgs, out: Reporter) -> u8 {
    let status = match locker(&args.conn).await {
        Ok(locker) => locker.status(&args.key).await,
        Err(e) => Err(e),
    };
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            return exit_code(&e, report::SOFTWARE);
        }
    };
    let key = &args.key;
    if args.json {
        let ttl_ms = status
            .remaining_ttl
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let json = serde_json::json!({
            "key": key,
            "held": status.held,
            "remaining_ttl_ms": ttl_ms,
            "fence": status.fence,
            "queued": status.queued,
        });
        println!("{json}");
        return 0;
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
    0
}

/// `waitlock release`: 0 released, 1 not held by that token.
async fn release(args: ReleaseArgs, out: Reporter) -> u8 {
    let released = match locker(&args.conn).await {
        Ok(locker) => locker.unlock(&args.key, &args.token).await,
        Err(e) => Err(e),
    };
    match released {
        Ok(()) => {
            out.info(format!("released {}", quoted(&args.key)));
            0
        }
        Err(Error::NotHeld { key }) => {
            out.error(format!(
                "{} is not held by that token (it expired, was released, or another \
                 holder has it now); nothing changed",
                quoted(&key)
            ));
            1
        }
        Err(e) => {
            out.error(describe(&e, &args.conn.url));
            exit_code(&e, report::SOFTWARE)
        }
    }
}
