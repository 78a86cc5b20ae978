//! Connecting to a URL with the settings a lock client needs.

use crate::error::{ConnectStep, Error, Result};
use fred::clients::Client;
use fred::error::{Error as FredError, ErrorKind};
use fred::interfaces::ClientLike;
use fred::types::config::{Config, ReconnectPolicy};
use fred::types::{Builder, ConnectHandle, CustomCommand};
use std::time::Duration;

/// The default time limit of [`Locker::connect`](crate::Locker::connect).
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most one connection attempt (TCP, then the TLS handshake) may take, also on reconnects.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// How [`Locker::connect_with`](crate::Locker::connect_with) connects: its time limit and, with
/// the `tls-rustls` feature, the TLS settings of a `rediss://` URL.
///
/// # Examples
/// ```no_run
/// # async fn example() -> waitlock::Result<()> {
/// use std::time::Duration;
/// let opts = waitlock::ConnectOptions::new().with_timeout(Duration::from_secs(2));
/// let locker = waitlock::Locker::connect_with("redis://127.0.0.1:6379", &opts).await?.build()?;
/// # let _ = locker; Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct ConnectOptions {
    timeout: Duration,
    eviction_allowed: bool,
    #[cfg(feature = "tls-rustls")]
    tls: Option<crate::TlsOptions>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: DEFAULT_CONNECT_TIMEOUT,
            eviction_allowed: false,
            #[cfg(feature = "tls-rustls")]
            tls: None,
        }
    }
}

impl ConnectOptions {
    /// The defaults: a 5 s time limit; for `rediss://`, the system's CAs and no client
    /// certificate.
    pub fn new() -> ConnectOptions {
        ConnectOptions::default()
    }

    /// How long connecting may take, TLS handshake and authentication included; a connection
    /// that is not up by then fails with [`Error::Connect`] (step `Connect`, source kind
    /// `Timeout`). Each attempt's TCP
    /// connect and TLS handshake are also cut at 2 s (or this limit, when shorter). Must be
    /// non-zero. Defaults to 5 s.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connects to a server that may evict keys (`maxmemory` set with a policy other than
    /// `noeviction`), which connecting refuses by default: an evicted lock key lets a second
    /// holder in, and `volatile-ttl` evicts the shortest TTLs (short grants) first. Only for
    /// servers whose memory you know will not run out. Defaults to refusing.
    pub fn with_eviction_allowed(mut self) -> Self {
        self.eviction_allowed = true;
        self
    }

    /// The TLS settings of a `rediss://` URL: the CAs to trust and a client certificate. The
    /// locker's client and a queued locker's subscriber connection
    /// both use them. Giving them with a `redis://` URL is an error. Defaults to the system's
    /// CAs and no client certificate. Only with the `tls-rustls` feature.
    #[cfg(feature = "tls-rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls-rustls")))]
    pub fn with_tls(mut self, tls: crate::TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// `url` safe to print: its user and password (`user:password@`, `:password@`) replaced by
/// `***@`, and the value of any query parameter whose name contains "password" (such as
/// `sentinelPassword`) by `***`. Passwords may hold `@`, `/`, `:` or `?` unencoded: the user
/// information ends at the last `@` before the query, and the query starts at the first `?`
/// followed by a parameter name and `=`. Not a URL (no `://`): `<not a URL>`.
///
/// ```
/// assert_eq!(waitlock::redact_url("rediss://:Xq9@Zr/Kv8@host:6380/0"), "rediss://***@host:6380/0");
/// assert_eq!(waitlock::redact_url("redis://:pw@h/0?x=a@b"), "redis://***@h/0?x=a@b");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".into();
    };
    // The query: the first '?' followed by a parameter name and '='.
    let query = rest
        .char_indices()
        .filter(|(_, c)| *c == '?')
        .find_map(|(i, _)| {
            let tail = &rest[i + 1..];
            let name = tail.find('=')?;
            (name > 0
                && tail[..name]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then_some(i)
        });
    let (before, query) = rest.split_at(query.unwrap_or(rest.len()));
    let before = match before.rfind('@') {
        Some(at) => format!("***@{}", &before[at + 1..]),
        None => before.to_owned(),
    };
    let query: Vec<String> = query
        .strip_prefix('?')
        .map(|q| {
            q.split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.to_ascii_lowercase().contains("password") => {
                        format!("{k}=***")
                    }
                    _ => kv.to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    if query.is_empty() {
        format!("{scheme}://{before}")
    } else {
        format!("{scheme}://{before}?{}", query.join("&"))
    }
}

pub(crate) use redact_url as redact;

/// The scheme of `url` without its TLS `s` (`rediss-cluster` gives `redis-cluster`), or `None`
/// when the URL does not ask for TLS. fred's own test: the scheme starts with `rediss` or
/// `valkeys`.
fn plain_scheme(url: &str) -> Option<String> {
    let scheme = url.split_once("://")?.0.to_ascii_lowercase();
    for tls in ["rediss", "valkeys"] {
        if let Some(rest) = scheme.strip_prefix(tls) {
            return Some(format!("{}{rest}", &tls[..tls.len() - 1]));
        }
    }
    None
}

/// The reconnect policy of the clients waitlock makes: exponential from 10 ms, forever, capped
/// at 1 s, and at 50 ms behind Sentinel. fred follows a Sentinel failover only when it
/// reconnects, and a reconnection forced on `+switch-master` waits for the policy's next
/// attempt: after a crash, with the delay grown to 1 s over the seconds before the switch,
/// that was up to 1 s (0.29-0.51 s measured; 52 ms now). An attempt to a primary that is down
/// is refused at once, so the faster pace costs a few cheap attempts per second while it is
/// down. (On a cluster a 100 ms cap made fred give up commands, "Too many failed write
/// attempts", before its topology caught up: it keeps 1 s there.)
pub(crate) fn reconnect_policy(config: &Config) -> ReconnectPolicy {
    use fred::types::config::ServerConfig;
    let max_ms = match config.server {
        ServerConfig::Sentinel { .. } => 50,
        _ => 1000,
    };
    ReconnectPolicy::new_exponential(0, 10, max_ms, 2)
}

/// The client config for `url`. fred's own parsing of a `rediss://` URL is bypassed: without a
/// TLS feature it would connect in plain text (with only a log warning), and with one it
/// builds a default connector that cannot trust a private CA.
fn config_for(url: &str, opts: &ConnectOptions) -> Result<Config> {
    let parse = |u: &str| {
        Config::from_url(u).map_err(|source| Error::Connect {
            step: ConnectStep::ParseUrl,
            target: redact(url),
            source,
        })
    };
    match plain_scheme(url) {
        None => {
            #[cfg(feature = "tls-rustls")]
            if opts.tls.is_some() {
                return Err(Error::invalid_setting(
                    "tls",
                    redact(url),
                    "TLS settings were given for a URL without TLS: use rediss://",
                ));
            }
            parse(url)
        }
        #[cfg(not(feature = "tls-rustls"))]
        Some(_) => {
            let _ = opts;
            Err(Error::invalid_setting(
                "url",
                redact(url),
                "rediss:// needs TLS: build waitlock with the tls-rustls feature",
            ))
        }
        #[cfg(feature = "tls-rustls")]
        Some(plain) => {
            let tls = opts.tls.clone().unwrap_or_default().fred_config()?;
            let rest = url.split_once("://").map_or("", |(_, r)| r);
            let mut config = parse(&format!("{plain}://{rest}"))?;
            config.tls = Some(tls);
            Ok(config)
        }
    }
}

/// A client for `url` with a reconnect policy and a command timeout.
pub(crate) async fn connect_client(
    url: &str,
    command_timeout: Duration,
    opts: &ConnectOptions,
) -> Result<Client> {
    let limit = opts.timeout;
    if limit.is_zero() {
        return Err(Error::invalid_setting(
            "connect_timeout",
            format!("{limit:?}"),
            "must be non-zero",
        ));
    }
    let config = config_for(url, opts)?;
    let policy = reconnect_policy(&config);
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = command_timeout)
        .with_connection_config(|c| c.connection_timeout = ATTEMPT_TIMEOUT.min(limit))
        .set_policy(policy)
        .build()
        .map_err(|source| Error::Connect {
            step: ConnectStep::Connect,
            target: redact(url),
            source,
        })?;
    // `init` resolves on the first connection attempt's outcome; if it fails the router task
    // is stopped, so nothing is left behind.
    match tokio::time::timeout(limit, client.init()).await {
        Ok(Ok(task)) => match check_server(&client, url, limit, opts).await {
            Ok(()) => {
                super::scripts::preload(&client, limit).await;
                supervise(client.clone(), task, "the locker's client");
                Ok(client)
            }
            Err(e) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
                Err(e)
            }
        },
        Ok(Err(source)) => Err(Error::Connect {
            step: ConnectStep::Connect,
            target: redact(url),
            source: explain(
                source,
                plain_scheme(url).is_some(),
                ATTEMPT_TIMEOUT.min(limit),
            ),
        }),
        Err(_) => {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.quit()).await;
            Err(Error::Connect {
                step: ConnectStep::Connect,
                target: redact(url),
                source: FredError::new(ErrorKind::Timeout, format!("no answer within {limit:?}")),
            })
        }
    }
}

/// Keeps a client that waitlock made connected for good: when its connection task ends for
/// any reason but a `QUIT`, it is started again.
///
/// fred 10.1 ends a client's routing task when it cannot follow an `ASK` redirection (its
/// `ASKING` fails, "Max attempts reached."), which happens while a Cluster slot migrates
/// under load (`cargo bench --bench migration`). The client then never answers again, and
/// still says it is connected. A client you build yourself needs the same care: await the
/// handle `init` returns and call `connect` again.
pub(crate) fn supervise<C>(client: C, task: ConnectHandle, what: &'static str)
where
    C: ClientLike + Clone + Send + Sync + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut task = task;
        loop {
            match task.await {
                // Ended by QUIT (or the runtime going away): nothing to keep alive.
                Ok(Ok(())) | Err(_) => return,
                Ok(Err(e)) if e.is_canceled() => return,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "{what}'s connection task ended: starting it again");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    task = client.connect();
                }
            }
        }
    });
}

/// The server must be one waitlock can rely on: Redis 7.0 or later (`SET ... NX GET`, sharded
/// pub/sub), and it must never evict a lock: eviction off (`maxmemory 0`) or the `noeviction`
/// policy (any other policy may evict a lock key, its shortest TTL first with `volatile-ttl`,
/// and two holders follow), unless `opts` allows eviction. A server that will not say (`CONFIG`
/// renamed away or refused by an ACL) gets a warning in the log, not an error.
async fn check_server(
    client: &Client,
    url: &str,
    limit: Duration,
    opts: &ConnectOptions,
) -> Result<()> {
    let refuse = |why: String| Error::Connect {
        step: ConnectStep::CheckServer,
        target: redact(url),
        source: FredError::new(ErrorKind::Config, why),
    };
    let info = client.custom::<String, _>(
        CustomCommand::new_static("INFO", None, false),
        vec!["server"],
    );
    if let Ok(Ok(info)) = tokio::time::timeout(limit, info).await {
        if let Some(version) = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .map(str::trim)
        {
            let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
            let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
            if (major, minor) < (7, 0) {
                return Err(refuse(format!(
                    "the server runs Redis {version}; waitlock needs Redis 7.0 or later \
                     (SET NX GET, sharded pub/sub)"
                )));
            }
        }
    }
    if opts.eviction_allowed {
        return Ok(());
    }
    let ask = client.custom::<Vec<String>, _>(
        CustomCommand::new_static("CONFIG", None, false),
        vec!["GET", "maxmemory*"],
    );
    let config = match tokio::time::timeout(limit, ask).await {
        Ok(Ok(pairs)) => pairs,
        _ => {
            tracing::warn!("could not read the server's maxmemory settings (CONFIG GET); make sure it never evicts keys (maxmemory-policy noeviction): an evicted lock lets a second holder in");
            return Ok(());
        }
    };
    let get = |name: &str| {
        config
            .chunks(2)
            .find(|kv| kv.first().map(String::as_str) == Some(name))
            .and_then(|kv| kv.get(1).cloned())
            .unwrap_or_default()
    };
    let (maxmemory, policy) = (get("maxmemory"), get("maxmemory-policy"));
    if maxmemory != "0" && !maxmemory.is_empty() && policy != "noeviction" {
        return Err(refuse(format!(
            "the server may evict keys (maxmemory {maxmemory}, maxmemory-policy {policy}): an \
             evicted lock lets a second holder in; set maxmemory-policy noeviction (or allow \
             it with ConnectOptions::with_eviction_allowed)"
        )));
    }
    Ok(())
}

/// fred's connection error with what it most likely means put first, in words (fred and
/// rustls only give `Debug` output such as `InvalidCertificate(UnknownIssuer)`); the original
/// follows in parentheses. Errors it does not recognise are returned as they are.
fn explain(e: FredError, tls: bool, attempt: Duration) -> FredError {
    let details = e.details();
    let hint = if tls {
        tls_hint(&e, attempt)
    } else if *e.kind() == ErrorKind::IO
        && ["ConnectionReset", "UnexpectedEof", "BrokenPipe"]
            .iter()
            .any(|s| details.contains(s))
    {
        Some((
            ErrorKind::IO,
            "the server closed the connection at once: if it only speaks TLS on this port, use \
             a rediss:// URL"
                .to_owned(),
        ))
    } else {
        None
    };
    match hint {
        Some((kind, hint)) => FredError::new(kind, format!("{hint} ({details})")),
        None => e,
    }
}

#[cfg(not(feature = "tls-rustls"))]
fn tls_hint(_: &FredError, _: Duration) -> Option<(ErrorKind, String)> {
    None
}

/// What a failed TLS connection means, from rustls' error names, and the error kind to give
/// it: a refused certificate or handshake is a TLS error (not a transient I/O error).
#[cfg(feature = "tls-rustls")]
fn tls_hint(e: &FredError, attempt: Duration) -> Option<(ErrorKind, String)> {
    let d = e.details();
    let has = |s: &str| d.contains(s);
    if *e.kind() == ErrorKind::Timeout {
        return Some((
            ErrorKind::Timeout,
            format!(
                "no TLS session within {attempt:?}: the server may not speak TLS on this port (a \
                 plain-text port wants a redis:// URL), or it does not answer"
            ),
        ));
    }
    let hint = if has("UnknownIssuer") {
        "the server's certificate is not signed by a CA this client trusts (give its CA with \
         TlsOptions::with_ca_file)"
    } else if has("NotValidForName") {
        "the server's certificate does not name the host in the URL"
    } else if has("Expired") || has("NotValidYet") {
        "the server's certificate is expired or not yet valid"
    } else if has("InvalidCertificate") {
        "the server's certificate was refused"
    } else if has("AlertReceived(CertificateRequired)") || has("AlertReceived(HandshakeFailure)") {
        "the server refused the TLS handshake: it may want a client certificate (give one with \
         TlsOptions::with_client_cert_files)"
    } else if has("AlertReceived(UnknownCA)")
        || has("AlertReceived(BadCertificate)")
        || has("AlertReceived(CertificateUnknown)")
    {
        "the server does not trust the client certificate"
    } else if has("InvalidMessage") || has("CorruptMessage") || has("InvalidContentType") {
        "the server does not speak TLS on this port (a plain-text port wants a redis:// URL)"
    } else if has("AlertReceived") {
        "the server refused the TLS handshake"
    } else {
        return None;
    };
    Some((ErrorKind::Tls, hint.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_print() {
        // Every form, with passwords that hold '@', '/', ':' and '?'.
        let cases = [
            (
                "rediss://user:s3cr/et@db.example:6380/2",
                "rediss://***@db.example:6380/2",
            ),
            ("redis://:p@w@h:1/0", "redis://***@h:1/0"),
            ("rediss://:Xq9@Zr/Kv8@host", "rediss://***@host"),
            ("redis://:p@ss/w@host:6379/0", "redis://***@host:6379/0"),
            ("redis://us:er:p:w@h:1", "redis://***@h:1"),
            ("redis://:p?w@h:1/0", "redis://***@h:1/0"),
            ("redis://:pw@h/0?x=a@b", "redis://***@h/0?x=a@b"),
            (
                "redis-sentinel://:p@s/s@h:26379/0?sentinelServiceName=m&sentinelPassword=s@c/r:t",
                "redis-sentinel://***@h:26379/0?sentinelServiceName=m&sentinelPassword=***",
            ),
            (
                "redis-cluster://:a:b@c@h1:7000?node=h2:7001",
                "redis-cluster://***@h1:7000?node=h2:7001",
            ),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://h:1/0?x=1", "redis://h:1/0?x=1"),
            ("secret", "<not a URL>"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact(url), shown, "{url}");
        }
    }

    #[test]
    fn tls_schemes_lose_their_s() {
        assert_eq!(plain_scheme("rediss://h").as_deref(), Some("redis"));
        assert_eq!(plain_scheme("REDISS://h").as_deref(), Some("redis"));
        assert_eq!(
            plain_scheme("rediss-cluster://h").as_deref(),
            Some("redis-cluster")
        );
        assert_eq!(plain_scheme("valkeys://h").as_deref(), Some("valkey"));
        assert_eq!(plain_scheme("redis://h"), None);
        assert_eq!(plain_scheme("redis-sentinel://h"), None);
    }

    #[cfg(not(feature = "tls-rustls"))]
    #[test]
    fn rediss_without_tls_is_refused_not_sent_in_plain_text() {
        let e = config_for("rediss://:pw@127.0.0.1:1", &ConnectOptions::new()).unwrap_err();
        assert!(
            matches!(e, Error::InvalidSetting { field: "url", .. }),
            "{e}"
        );
        assert!(!e.to_string().contains("pw"), "{e}");
    }
}
