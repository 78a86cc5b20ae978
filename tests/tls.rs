//! TLS end to end against a private TLS-only `redis-server` whose certificates the fixture
//! makes per test (`tests/common/tls.rs`): both lockers over `rediss://` with a private CA,
//! mutual TLS, the failures that must be clear and quick, and secrets kept out of messages.

mod common;

use common::tls::TlsRedis;
use common::RedisServer;
use std::future::Future;
use std::time::{Duration, Instant};
use waitlock::fred::prelude::*;
use waitlock::{ConnectOptions, ConnectStep, Error, LockOptions, Locker, Queue, TlsOptions};

/// Every failure must be reported well within this (connecting is cut at 5 s).
const FAIL_WITHIN: Duration = Duration::from_secs(10);

fn trusting(ca: std::path::PathBuf) -> ConnectOptions {
    ConnectOptions::new().with_tls(TlsOptions::new().with_ca_file(ca))
}

/// Runs `f`, asserts it failed within [`FAIL_WITHIN`], prints and returns the error and how
/// long it took.
async fn fails<T: std::fmt::Debug>(
    what: &str,
    f: impl Future<Output = waitlock::Result<T>>,
) -> (Error, Duration) {
    let start = Instant::now();
    let r = tokio::time::timeout(FAIL_WITHIN * 2, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {:?}", FAIL_WITHIN * 2));
    let took = start.elapsed();
    let e = r.expect_err(what);
    eprintln!("{what}: failed after {took:?}: {e}");
    assert!(took < FAIL_WITHIN, "{what}: took {took:?}");
    (e, took)
}

/// One waiter queued behind a holder, then handed the lock by the release.
async fn handoff(locker: &Locker<Queue>, key: &str) {
    let holder = locker
        .acquire(key, &LockOptions::new())
        .await
        .expect("acquire over TLS");
    let waiter = {
        let locker = locker.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            locker
                .acquire_wait(&key, &LockOptions::new().with_wait(Duration::from_secs(10)))
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while locker.status(key).await.expect("status").queued == 0 {
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.release().await.expect("release over TLS");
    let g = waiter
        .await
        .expect("waiter task")
        .expect("the waiter is handed the lock");
    g.release().await.expect("release");
    let wakes = locker.stats().wakes;
    assert!(wakes.by_notification >= 1, "{wakes:?}");
}

/// A lock kept alive past several short TTLs, then released.
async fn refresh<S: waitlock::strategy::Strategy>(locker: &Locker<S>, key: &str) {
    let ttl = Duration::from_millis(200);
    let mut g = locker
        .acquire(
            key,
            &LockOptions::new().with_ttl(ttl).with_refresh_ratio(0.3),
        )
        .await
        .expect("acquire");
    let lost = g.keep_alive();
    tokio::time::sleep(ttl * 4).await;
    assert!(!lost.is_cancelled(), "lost: {:?}", g.loss());
    let status = locker.status(key).await.expect("status");
    assert!(status.held, "{status:?}");
    g.release().await.expect("release");
    assert!(!locker.status(key).await.expect("status").held);
}

#[tokio::test]
async fn both_lockers_acquire_wait_refresh_and_release_over_tls_with_a_private_ca() {
    let server = TlsRedis::start(false);
    let opts = trusting(server.certs.ca());

    let locker = Locker::connect_with(&server.url(), &opts)
        .await
        .expect("connect over TLS")
        .build()
        .expect("build");
    refresh(&locker, "tls-poll").await;
    let g = locker
        .acquire_wait("tls-poll", &common::tight())
        .await
        .expect("acquire_wait");
    g.release().await.expect("release");

    let pubsub = Locker::connect_with(&server.url(), &opts)
        .await
        .expect("connect over TLS")
        .queued()
        .build()
        .await
        .expect("the subscriber connects over TLS");
    handoff(&pubsub, "tls-queue").await;
    refresh(&pubsub, "tls-queue").await;
    assert_eq!(pubsub.registry_size().waiters, 0);
}

#[tokio::test]
async fn mutual_tls_works_with_the_client_certificate_and_fails_clearly_without() {
    let server = TlsRedis::start(true);
    let certs = &server.certs;

    // Files, as the CLI gives them.
    let with_files = ConnectOptions::new().with_tls(
        TlsOptions::new()
            .with_ca_file(certs.ca())
            .with_client_cert_files(certs.client_cert(), certs.client_key()),
    );
    // The subscriber connection must present the certificate too, or no grant arrives.
    let pubsub = Locker::connect_with(&server.url(), &with_files)
        .await
        .expect("connect with a client certificate")
        .queued()
        .build()
        .await
        .expect("the subscriber presents the client certificate");
    handoff(&pubsub, "mtls").await;

    // PEM bytes.
    let with_pem = ConnectOptions::new().with_tls(
        TlsOptions::new()
            .with_ca_pem(certs.read("ca.pem"))
            .with_client_cert_pem(certs.read("client.pem"), certs.read("client.key")),
    );
    let locker = Locker::connect_with(&server.url(), &with_pem)
        .await
        .expect("connect with a client certificate from PEM bytes")
        .build()
        .expect("build");
    refresh(&locker, "mtls-pem").await;

    let (e, _) = fails(
        "mTLS without a client certificate",
        Locker::connect_with(&server.url(), &trusting(certs.ca())),
    )
    .await;
    assert!(
        matches!(
            e,
            Error::Connect {
                step: ConnectStep::Connect,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("client certificate"), "{e}");
}

#[tokio::test]
async fn a_server_certificate_from_another_ca_is_refused_quickly() {
    let server = TlsRedis::start(false);
    let (e, _) = fails(
        "wrong CA",
        Locker::connect_with(&server.url(), &trusting(server.certs.other_ca())),
    )
    .await;
    assert!(
        matches!(
            e,
            Error::Connect {
                step: ConnectStep::Connect,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("not signed by a CA this client trusts"),
        "{msg}"
    );
    // The queued locker connects the same way, so fails the same way.
    fails(
        "wrong CA, pub/sub",
        Locker::connect_with(&server.url(), &trusting(server.certs.other_ca())),
    )
    .await;
    // With no CA given, the system's trust store does not know the private CA either.
    fails("system roots", Locker::connect(&server.url())).await;
}

#[tokio::test]
async fn a_plain_text_server_behind_rediss_fails_quickly() {
    let server = RedisServer::start();
    let certs = common::tls::Certs::generate();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let (e, _) = fails(
        "plain-text server behind rediss://",
        Locker::connect_with(&url, &trusting(certs.ca())),
    )
    .await;
    assert!(
        matches!(
            e,
            Error::Connect {
                step: ConnectStep::Connect,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("redis:// URL"), "{e}");
}

#[tokio::test]
async fn a_tls_server_behind_redis_fails_quickly() {
    let server = TlsRedis::start(false);
    let (e, _) = fails(
        "TLS server behind redis://",
        Locker::connect(&server.plain_url()),
    )
    .await;
    assert!(
        matches!(
            e,
            Error::Connect {
                step: ConnectStep::Connect,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("rediss://"), "{e}");
    // TLS settings with a redis:// URL are a mistake, said before anything is sent.
    let (e, _) = fails(
        "TLS settings with redis://",
        Locker::connect_with(&server.plain_url(), &trusting(server.certs.ca())),
    )
    .await;
    assert!(
        matches!(e, Error::InvalidSetting { field: "tls", .. }),
        "{e:?}"
    );
    // A setting, not a lock's option: the message names no lock.
    assert!(!e.to_string().contains("lock"), "{e}");
}

#[tokio::test]
async fn unreadable_pem_names_the_option() {
    let server = TlsRedis::start(false);
    let missing = server.certs.path("no-such-ca.pem");
    let (e, _) = fails(
        "missing CA file",
        Locker::connect_with(&server.url(), &trusting(missing.clone())),
    )
    .await;
    assert!(
        matches!(
            e,
            Error::InvalidSetting {
                field: "tls.ca",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("no-such-ca.pem"), "{e}");

    let not_a_key = ConnectOptions::new().with_tls(
        TlsOptions::new()
            .with_ca_file(server.certs.ca())
            .with_client_cert_files(server.certs.client_cert(), server.certs.ca()),
    );
    let (e, _) = fails(
        "a certificate given as the key",
        Locker::connect_with(&server.url(), &not_a_key),
    )
    .await;
    assert!(
        matches!(
            e,
            Error::InvalidSetting {
                field: "tls.client_key",
                ..
            }
        ),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_password_in_the_url_never_shows() {
    const PW: &str = "s3cret-Pa55";
    let server = TlsRedis::start_with(false, &["--requirepass", PW]);
    let url = format!("rediss://:{PW}@127.0.0.1:{}", server.port);
    let opts = trusting(server.certs.ca());

    let builder = Locker::connect_with(&url, &opts)
        .await
        .expect("connect with the password");
    let shown = format!("{builder:?} {opts:?}");
    let pubsub = builder.queued().build().await.expect("subscriber");
    let token_opts = LockOptions::new().with_ttl(Duration::from_secs(5));
    let g = pubsub.acquire("pw", &token_opts).await.expect("acquire");
    let token = g.token().to_owned();
    let shown = format!("{shown} {pubsub:?} {g:?} {:?}", pubsub.stats());
    assert!(!shown.contains(PW), "{shown}");
    assert!(!shown.contains(&token), "{shown}");
    g.release().await.expect("release");

    let mut messages = Vec::new();
    // A wrong password, a wrong CA, a URL that does not parse, TLS settings with redis://.
    let wrong_pw = format!("rediss://:wrong-{PW}@127.0.0.1:{}", server.port);
    let (e, _) = fails("wrong password", Locker::connect_with(&wrong_pw, &opts)).await;
    messages.push(format!("{e} {e:?}"));
    let (e, _) = fails(
        "wrong CA with a password",
        Locker::connect_with(&url, &trusting(server.certs.other_ca())),
    )
    .await;
    messages.push(format!("{e} {e:?}"));
    let bad = format!("rediss://:{PW}@127.0.0.1:notaport");
    let (e, _) = fails("bad URL", Locker::connect_with(&bad, &opts)).await;
    messages.push(format!("{e} {e:?}"));
    let plain = format!("redis://:{PW}@127.0.0.1:{}", server.port);
    let (e, _) = fails(
        "TLS settings with redis://",
        Locker::connect_with(&plain, &opts),
    )
    .await;
    messages.push(format!("{e} {e:?}"));
    for m in &messages {
        assert!(!m.contains(PW), "{m}");
    }
}

#[tokio::test]
async fn fred_config_serves_a_client_built_by_hand_and_its_subscriber() {
    let server = TlsRedis::start(true);
    let certs = &server.certs;
    let mut config = Config::from_url(&server.plain_url()).expect("url");
    config.tls = Some(
        TlsOptions::new()
            .with_ca_file(certs.ca())
            .with_client_cert_files(certs.client_cert(), certs.client_key())
            .fred_config()
            .expect("fred's TLS config"),
    );
    let client = Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(2))
        .set_policy(ReconnectPolicy::new_constant(0, 20))
        .build()
        .expect("client");
    client.init().await.expect("connect with fred's config");
    // The subscriber is opened from the client's config: TLS and certificate included.
    let pubsub = Locker::queued(client).await.expect("subscriber over mTLS");
    handoff(&pubsub, "by-hand").await;
}
