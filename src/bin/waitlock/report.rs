//! Exit codes and the messages a person reads on stderr.

use std::time::Duration;
use waitlock::{ConnectStep, Error, MAX_PERMITS};

/// Bad usage (sysexits' EX_USAGE).
pub const USAGE: u8 = 64;
/// Redis could not be reached (EX_UNAVAILABLE).
pub const UNAVAILABLE: u8 = 69;
/// Anything else that went wrong (EX_SOFTWARE).
pub const SOFTWARE: u8 = 70;
/// The lock was lost while the command ran (EX_TEMPFAIL: trying again later may work).
pub const LOST: u8 = 75;
/// The command exists but could not be run (as in the shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in the shells).
pub const NOT_FOUND: u8 = 127;

/// Writes waitlock's own messages to stderr, prefixed with `waitlock: `.
#[derive(Debug, Clone, Copy)]
pub struct Reporter {
    quiet: bool,
}

impl Reporter {
    /// A reporter that prints informational messages unless `quiet`.
    pub fn new(quiet: bool) -> Reporter {
        Reporter { quiet }
    }

    /// Expected outcomes (waited, held, signal forwarded): silenced by `-q`.
    pub fn info(&self, msg: impl std::fmt::Display) {
        if !self.quiet {
            eprintln!("waitlock: {msg}");
        }
    }

    /// Failures: always printed.
    pub fn error(&self, msg: impl std::fmt::Display) {
        eprintln!("waitlock: {msg}");
    }
}

/// A duration for people: `1.2 s`, `31.0 s`, `0.3 s`.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// A key as messages show it: in single quotes, with control characters escaped.
pub fn quoted(key: &str) -> String {
    format!("'{}'", key.escape_debug())
}

/// `url` safe to print (the library's redaction: one rule for both).
pub fn redact(url: &str) -> String {
    waitlock::redact_url(url)
}

/// How the command line names a key's number of permits (a read-write lock has MAX_PERMITS).
pub fn limit_name(permits: u32) -> String {
    if permits == MAX_PERMITS {
        "-s/-x (a read-write lock)".to_owned()
    } else {
        format!("--limit {permits}")
    }
}

/// The exit code for a library error; `conflict` for "someone else has the lock".
pub fn exit_code(e: &Error, conflict: u8) -> u8 {
    match e {
        Error::Locked { .. } | Error::WaitTimeout { .. } | Error::AlreadyHeld { .. } => conflict,
        Error::InvalidKey { .. } | Error::InvalidOptions { .. } | Error::InvalidSetting { .. } => {
            USAGE
        }
        // Another run of the key gives another --limit (or -s/-x): a mistake in the scripts.
        Error::PermitsMismatch { .. } => USAGE,
        Error::Connect {
            step: ConnectStep::ParseUrl,
            ..
        } => USAGE,
        Error::Connect { .. } => UNAVAILABLE,
        e if e.is_transient() => UNAVAILABLE,
        _ => SOFTWARE,
    }
}

/// A message for an error that is not about the lock being held: where it tried to connect
/// for connection trouble, the key otherwise. Never includes a token or a password.
pub fn describe(e: &Error, url: &str) -> String {
    let at = redact(url);
    match e {
        Error::Connect {
            step: ConnectStep::ParseUrl,
            source,
            ..
        } => {
            format!("bad Redis URL {at:?}: {source}")
        }
        Error::Connect { source, .. } => {
            // The library's TLS hints name its API; say the options of this command instead.
            let why = source
                .to_string()
                .replace("TlsOptions::with_ca_file", "--tls-ca FILE")
                .replace(
                    "TlsOptions::with_client_cert_files",
                    "--tls-cert FILE --tls-key FILE",
                );
            format!("cannot connect to Redis at {at}: {why}")
        }
        Error::InvalidKey { key, reason } => format!("invalid key {}: {reason}", quoted(key)),
        Error::InvalidOptions {
            field,
            value,
            reason,
            ..
        }
        | Error::InvalidSetting {
            field,
            value,
            reason,
        } => format!("invalid {field} {value}: {reason}"),
        Error::PermitsMismatch {
            key,
            asked,
            current,
        } => format!(
            "{} is in use with {}, not {}: every run of a key must give the same --limit \
             (or all use -s/-x); nothing changed",
            quoted(key),
            limit_name(*current),
            limit_name(*asked)
        ),
        e if e.is_transient() => format!("Redis at {at} failed: {e}"),
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            redact("redis://user:s3cr/et@db.example:6380/2"),
            "redis://***@db.example:6380/2"
        );
        assert_eq!(redact("rediss://:pw@h"), "rediss://***@h");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "<not a URL>");
        // The library's rule: a password with '/' or a query with '@' (the CLI had its own).
        assert_eq!(redact("rediss://:Xq9@Zr/Kv8@host"), "rediss://***@host");
        assert_eq!(redact("redis://:pw@h/0?x=a@b"), "redis://***@h/0?x=a@b");
    }

    #[test]
    fn durations_read_as_seconds() {
        assert_eq!(secs(Duration::from_millis(1234)), "1.2 s");
        assert_eq!(secs(Duration::from_secs(31)), "31.0 s");
    }
}
