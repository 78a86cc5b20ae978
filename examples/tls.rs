//! A queued locker over TLS with a private CA and a client certificate (feature `tls-rustls`):
//! `cargo run --example tls --features tls-rustls -- rediss://HOST:6380 ca.pem client.pem client.key`.

use std::time::Duration;
use waitlock::{ConnectOptions, LockOptions, Locker, TlsOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "rediss://127.0.0.1:6380".into());
    let mut tls = TlsOptions::new();
    if let Some(ca) = args.next() {
        tls = tls.with_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (args.next(), args.next()) {
        tls = tls.with_client_cert_files(cert, key);
    }
    // The subscriber connection of the queued locker uses the same TLS settings.
    let locker = Locker::connect_with(&url, &ConnectOptions::new().with_tls(tls))
        .await?
        .queued()
        .build()
        .await?;
    let guard = locker
        .acquire_wait(
            "rotate-keys",
            &LockOptions::new().with_wait(Duration::from_secs(5)),
        )
        .await?;
    println!("holding with fence {}", guard.fence());
    guard.release().await?;
    Ok(())
}
