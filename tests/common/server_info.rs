//! What a server (or every primary of a cluster) says about itself: `INFO` sections, Redis'
//! own CPU time, calls per command, memory. For the benchmarks and tests that measure Redis'
//! work.

use super::command_calls;
use fred::prelude::*;
use std::collections::HashMap;
use waitlock::fred;

/// `INFO <section>` of the server, or of every primary of a cluster, one after another.
pub async fn info(admin: &Client, section: &'static str) -> Vec<String> {
    if !admin.is_clustered() {
        let one: String = super::cmd(admin, "INFO", vec![section.into()]).await;
        return vec![one];
    }
    // CLUSTER NODES: "<id> <host:port@bus> <flags> ..." per node; primaries have "master".
    let nodes: String = super::cmd(admin, "CLUSTER NODES", vec![]).await;
    let primaries = nodes.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        if !f.get(2)?.split(',').any(|x| x == "master") {
            return None;
        }
        let (host, port) = f.get(1)?.split('@').next()?.rsplit_once(':')?;
        Some(fred::types::config::Server::new(
            host,
            port.parse::<u16>().ok()?,
        ))
    });
    let mut all = Vec::new();
    for node in primaries.collect::<Vec<_>>() {
        let one: String = admin
            .with_cluster_node(node.clone())
            .custom(
                fred::types::CustomCommand::new_static("INFO", None, false),
                vec![section],
            )
            .await
            .unwrap_or_else(|e| panic!("INFO {section} of {node}: {e}"));
        all.push(one);
    }
    all
}

/// Redis' own CPU time so far, `used_cpu_sys + used_cpu_user` of `INFO cpu`, in microseconds
/// (summed over a cluster's primaries).
pub async fn redis_cpu_us(admin: &Client) -> f64 {
    info(admin, "cpu")
        .await
        .iter()
        .map(|text| {
            text.lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    matches!(k, "used_cpu_sys" | "used_cpu_user")
                        .then(|| v.trim().parse::<f64>().ok())
                        .flatten()
                })
                .sum::<f64>()
        })
        .sum::<f64>()
        * 1e6
}

/// Calls per command (summed over a cluster's primaries).
pub async fn commandstats(admin: &Client) -> HashMap<String, u64> {
    let mut stats = HashMap::new();
    for text in info(admin, "commandstats").await {
        for (name, calls) in command_calls(&text) {
            *stats.entry(name).or_insert(0) += calls;
        }
    }
    stats
}

/// Redis's `used_memory` (summed over a cluster's primaries).
pub async fn used_memory(admin: &Client) -> i64 {
    info(admin, "memory")
        .await
        .iter()
        .filter_map(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<i64>().ok())
        })
        .sum()
}

/// Script calls and every command (client calls and those inside scripts) since `before`.
pub fn calls_since(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> (u64, u64) {
    let d = |n: &str| after.get(n).unwrap_or(&0) - before.get(n).unwrap_or(&0);
    let scripts = d("fcall") + d("evalsha") + d("eval");
    let all: u64 = after
        .keys()
        .filter(|n| !n.starts_with("info") && !n.starts_with("client") && *n != "config|get")
        .map(|n| d(n))
        .sum();
    (scripts, all)
}
