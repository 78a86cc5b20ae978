//! Several workers contend for one key through a `PubSubLocker` (the queued locker) and say what happened.
//!
//! Run: `cargo run --example demo` (Redis at `$REDIS_URL`, default `redis://127.0.0.1:6379`;
//! when nothing answers there and `redis-server` is installed, a private one is started).

use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use waitlock::{Error, LockOptions, PubSubLocker};

const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// `host:port` of a `redis://[user:pass@]host[:port][/db]` URL.
fn address(url: &str) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let hostport = rest.split('/').next()?.rsplit('@').next()?;
    Some(if hostport.contains(':') {
        hostport.to_owned()
    } else {
        format!("{hostport}:6379")
    })
}

fn answers(addr: &str) -> bool {
    let Ok(mut addrs) = addr.to_socket_addrs() else {
        return false;
    };
    addrs.any(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok())
}

/// A private redis-server on a free port, killed when dropped.
struct PrivateRedis(Child);

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_private() -> Option<(PrivateRedis, String)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = PrivateRedis(child);
    let addr = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !answers(&addr) {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((server, format!("redis://{addr}")))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| DEFAULT_URL.to_owned());
    let mut _private = None;
    let url = match address(&url) {
        Some(addr) if answers(&addr) => url,
        _ => match start_private() {
            Some((server, private_url)) => {
                println!("Nothing answers at {url}; started a private redis-server at {private_url} (stopped when the demo ends).");
                _private = Some(server);
                private_url
            }
            None => {
                eprintln!(
                    "Nothing answers at {url} and no redis-server could be started.\n\
                     Install Redis: `sudo apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` (macOS),\n\
                     or point REDIS_URL at a running server, e.g. REDIS_URL=redis://host:6379 cargo run --example demo"
                );
                std::process::exit(1);
            }
        },
    };
    println!("Using Redis at {url}\n");

    let locker = PubSubLocker::from_url(&url).await?;
    let key = format!("demo:nightly-report:{}", std::process::id());
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(5))
        .with_wait(Duration::from_secs(10));
    let started = Instant::now();

    let mut workers = Vec::new();
    for worker in 0..6 {
        let (locker, key, opts) = (locker.clone(), key.clone(), opts.clone());
        workers.push(tokio::spawn(async move {
            let mut waits = Vec::new();
            for round in 0..3 {
                let asked = Instant::now();
                locker
                    .run(&key, &opts, |ctx| async move {
                        let waited = asked.elapsed();
                        println!(
                            "{:>7.1} ms  worker {worker} holds {:?} (round {round}, fence {}) after waiting {:.2} ms",
                            started.elapsed().as_secs_f64() * 1e3,
                            ctx.key,
                            ctx.fence,
                            waited.as_secs_f64() * 1e3
                        );
                        tokio::time::sleep(Duration::from_millis(15)).await; // the "work"
                        Ok::<_, Error>(())
                    })
                    .await?;
                waits.push(asked.elapsed());
            }
            Ok::<_, Error>(waits)
        }));
    }
    let mut total = 0;
    for w in workers {
        total += w.await??.len();
    }

    let stats = locker.stats().wakes;
    println!(
        "\n{total} critical sections by 6 workers in {:.0} ms, one at a time.",
        started.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "Waiters handed the lock by the release (a grant on their channel): {}, woken by a timer: {}; attempts sent to Redis: {}.",
        stats.by_notification, stats.by_timer, stats.attempts
    );
    println!(
        "Registry after the run: {:?} (empty: every subscription was dropped).",
        locker.registry_size()
    );
    Ok(())
}
