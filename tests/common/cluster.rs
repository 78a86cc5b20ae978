//! A local Redis Cluster: `redis-server` processes on free ports (each a [`RedisServer`], so
//! killed by pid on drop), joined with `redis-cli --cluster create`.

use super::RedisServer;
use std::process::Command;
use std::time::{Duration, Instant};

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// Runs `redis-cli -p PORT ARGS...` and returns its output.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .expect(
            "`redis-cli` was not found: it comes with redis-server \
             (`sudo apt-get install redis-server redis-tools` on Debian/Ubuntu)",
        );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl RedisCluster {
    /// `primaries` primaries with `replicas` replicas each; returns once every node reports
    /// `cluster_state:ok` and agrees on the slots.
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    // A replica's first sync starts at once, not after the default 5 s.
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create (install redis-tools)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        // Replicas in sync with their primaries (a manual failover waits for that, and gives up
        // silently after 5 s). The bound is for a loaded machine; the replica's view and log
        // are in the message when it is missed.
        let deadline = Instant::now() + Duration::from_secs(60);
        for n in &cluster.nodes {
            loop {
                let info = cli(n.port, &["info", "replication"]);
                if info.contains("role:master") || info.contains("master_link_status:up") {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "replica {} not in sync with its primary after 60 s:\n{info}\n{}\n--- its log ---\n{}",
                    n.port,
                    cli(n.port, &["cluster", "nodes"]),
                    n.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    /// Waits until every node says `cluster_state:ok`.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &self.nodes {
            while !cli(n.port, &["cluster", "info"]).contains("cluster_state:ok") {
                assert!(
                    Instant::now() < deadline,
                    "cluster not ok on port {}",
                    n.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    pub fn url(&self) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.nodes[0].port)
    }

    /// The node id of the server on `port`.
    pub fn id(&self, port: u16) -> String {
        cli(port, &["cluster", "myid"]).trim().to_owned()
    }

    /// The ports of the primaries.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .map(|n| n.port)
            .filter(|p| cli(*p, &["role"]).starts_with("master"))
            .collect()
    }

    /// The port of the primary that owns `slot` (as the first node sees the cluster).
    pub fn owner(&self, slot: u16) -> u16 {
        let nodes = cli(self.nodes[0].port, &["cluster", "nodes"]);
        for line in nodes.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() > 8 && f[2].contains("master") && serves(line, slot) {
                // f[1] is "127.0.0.1:PORT@BUSPORT".
                if let Some(port) = f[1]
                    .split('@')
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse().ok())
                {
                    return port;
                }
            }
        }
        panic!("no primary owns slot {slot}:\n{nodes}");
    }

    /// Moves `slot` (and its keys) from its owner to the primary on `to`, as `redis-cli
    /// --cluster reshard` does: IMPORTING/MIGRATING, MIGRATE the keys, SETSLOT NODE everywhere.
    pub fn move_slot(&self, slot: u16, to: u16) {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} is on port {to} already");
        let (from_id, to_id) = (self.id(from), self.id(to));
        let s = slot.to_string();
        cli(to, &["cluster", "setslot", &s, "importing", &from_id]);
        cli(from, &["cluster", "setslot", &s, "migrating", &to_id]);
        loop {
            let keys = cli(from, &["cluster", "getkeysinslot", &s, "100"]);
            let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            let port = to.to_string();
            let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys);
            let out = cli(from, &args);
            assert!(!out.contains("ERR"), "MIGRATE failed: {out}");
        }
        for n in &self.nodes {
            cli(n.port, &["cluster", "setslot", &s, "node", &to_id]);
        }
        self.wait_ok();
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn serves(line: &str, slot: u16) -> bool {
    line.split(' ').skip(8).any(|r| {
        if r.starts_with('[') {
            return false;
        }
        match r.split_once('-') {
            Some((a, b)) => {
                a.parse::<u16>().is_ok_and(|a| a <= slot)
                    && b.parse::<u16>().is_ok_and(|b| slot <= b)
            }
            None => r.parse::<u16>() == Ok(slot),
        }
    })
}
