//! A primary, replicas and sentinels from `redis-server` processes on free ports, each killed by
//! its pid on drop.

use super::cluster::cli;
use super::RedisServer;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The service name the sentinels monitor.
pub const SERVICE: &str = "mymaster";

/// One `redis-server --sentinel` with its own writable config file.
pub struct Sentinel {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub struct SentinelSet {
    pub primary: RedisServer,
    pub replicas: Vec<RedisServer>,
    pub sentinels: Vec<Sentinel>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl SentinelSet {
    /// A primary with `replicas` replicas (in sync before this returns) and `sentinels`
    /// sentinels (quorum 1, down-after 1 s, failover timeout 5 s) that know every replica.
    pub fn start(replicas: usize, sentinels: usize) -> SentinelSet {
        let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let p = primary.port.to_string();
        let replicas: Vec<RedisServer> = (0..replicas)
            .map(|_| {
                RedisServer::start_with(&[
                    "--replicaof",
                    "127.0.0.1",
                    &p,
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        for r in &replicas {
            while !cli(r.port, &["info", "replication"]).contains("master_link_status:up") {
                assert!(Instant::now() < deadline, "replica {} never synced", r.port);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let sentinels: Vec<Sentinel> = (0..sentinels)
            .map(|_| spawn_sentinel(primary.port))
            .collect();
        for s in &sentinels {
            loop {
                let known = cli(s.port, &["sentinel", "replicas", SERVICE]);
                if replicas.iter().all(|r| known.contains(&r.port.to_string())) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {} never saw the replicas",
                    s.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        SentinelSet {
            primary,
            replicas,
            sentinels,
        }
    }

    /// `redis-sentinel://` URL naming every sentinel.
    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SERVICE}",
            self.sentinels[0].port
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port));
        }
        url
    }

    /// The primary's port as the first sentinel sees it now.
    pub fn current_primary(&self) -> u16 {
        let out = cli(
            self.sentinels[0].port,
            &["sentinel", "get-master-addr-by-name", SERVICE],
        );
        out.lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .expect("sentinel names a primary")
    }

    /// A task that records when the first sentinel announces `+switch-master` (its own
    /// subscriber connection: the moment the lockers can follow, measured exactly).
    pub async fn switch_announced(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<tokio::time::Instant>> {
        use waitlock::fred::prelude::*;
        let config = Config::from_url(&format!("redis://127.0.0.1:{}", self.sentinels[0].port))
            .expect("sentinel url");
        let sub = Builder::from_config(config)
            .build_subscriber_client()
            .expect("sentinel subscriber");
        sub.init().await.expect("connect to the sentinel");
        sub.subscribe("+switch-master").await.expect("subscribe");
        let mut rx = sub.message_rx();
        let (tx, out) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            if rx.recv().await.is_ok() {
                let _ = tx.send(Some(tokio::time::Instant::now()));
            }
            let _ = sub.quit().await;
        });
        out
    }

    /// A task that records when `replica` answers `ROLE` with `master` (polled every 2 ms):
    /// the moment of the promotion, before the sentinels announce it.
    pub fn promotion_of(
        &self,
        replica: u16,
    ) -> tokio::sync::watch::Receiver<Option<tokio::time::Instant>> {
        let (tx, out) = tokio::sync::watch::channel(None);
        tokio::spawn(async move {
            let client = super::client_for(&format!("redis://127.0.0.1:{replica}")).await;
            loop {
                let role: Vec<waitlock::fred::types::Value> =
                    super::try_cmd(&client, "ROLE", vec![]).await;
                if role.first().and_then(|v| v.as_str()).as_deref() == Some("master") {
                    let _ = tx.send(Some(tokio::time::Instant::now()));
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        out
    }

    /// Waits until the sentinels name a primary other than `old`; returns its port.
    pub fn wait_for_new_primary(&self, old: u16, limit: Duration) -> u16 {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.current_primary();
            if now != old {
                return now;
            }
            assert!(Instant::now() < deadline, "no failover within {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn spawn_sentinel(primary: u16) -> Sentinel {
    for _ in 0..5 {
        let port = free_port();
        let dir = super::unique_dir("waitlock-sentinel");
        let conf = dir.join("sentinel.conf");
        let mut f = std::fs::File::create(&conf).expect("sentinel.conf");
        writeln!(
            f,
            "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n\
             sentinel down-after-milliseconds {SERVICE} 1000\nsentinel failover-timeout {SERVICE} 5000\n",
            dir.display()
        )
        .expect("write sentinel.conf");
        let child = Command::new(
            std::env::var("WAITLOCK_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
        )
        .arg(&conf)
        .arg("--sentinel")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server --sentinel (install redis-server)");
        let mut s = Sentinel { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = s.child.try_wait() {
                break; // port taken: try another
            }
            if cli(port, &["ping"]).contains("PONG") {
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = s.child.kill();
    }
    panic!("no sentinel started after 5 tries");
}
