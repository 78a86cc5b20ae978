//! A tool for finding traces of the permits model (`waitlock_model::permits`), not a check:
//!
//! ```sh
//! PERMITS=freeze,kill,-p2 [BFS=1] cargo run --release -p waitlock-model --example permits_explore
//! ```
//!
//! `PERMITS` is a comma-separated list: fault families (budget 1 each) `loss`, `freeze`,
//! `kill`; bug switches `barging`, `double`; one fix taken back `-p1`, `-p2` (P2's very first
//! rule), `-p2first` (P2's first fix, `first_hub`), `-p3` (`Cfg::revert`), `-fill` (the fill
//! as it was: `Cfg::fill_first_last` false); the suggestion `at` (`Cfg::watch_at`); `bound=`,
//! `h=`, `d=`, `ttl=`, `notice=` (idle bound, horizon, deadline, TTL, freeze notice, in
//! ticks). `BFS=1` stops at the first violation and prints the shortest
//! counterexample of each property violated by then (1 thread, no symmetry); otherwise DFS +
//! symmetry on 2 threads explores everything and prints a counterexample (not the shortest) per
//! violated property.

use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;
use waitlock_model::permits::{Bug, Cfg, Permits, Revert};

fn main() {
    let which = std::env::var("PERMITS").unwrap_or_default();
    let mut cfg = Cfg::default();
    for f in which.split(',') {
        let num = |x: &str| -> u8 { x.parse().expect("a number") };
        match f.trim() {
            "" => {}
            "loss" => cfg.world.losses = 1,
            "freeze" => cfg.world.freezes = 1,
            "kill" => cfg.world.kills = 1,
            "barging" => cfg.bug = Bug::Barging,
            "double" => cfg.bug = Bug::DoubleFree,
            "-p1" => cfg.revert = Some(Revert::P1Claim),
            "-p2" => cfg.revert = Some(Revert::P2Watchers),
            "-p2first" => cfg.revert = Some(Revert::P2FirstHub),
            "-p3" => cfg.revert = Some(Revert::P3DeadFirst),
            "-fill" => cfg.fill_first_last = false,
            "at" => cfg.watch_at = true,
            x if x.starts_with("bound=") => cfg.idle_bound = num(&x[6..]),
            x if x.starts_with("h=") => cfg.world.horizon = num(&x[2..]),
            x if x.starts_with("d=") => cfg.world.wait = num(&x[2..]),
            x if x.starts_with("ttl=") => cfg.world.ttl = num(&x[4..]),
            x if x.starts_with("notice=") => cfg.world.notice = num(&x[7..]),
            x => panic!("unknown {x}"),
        }
    }
    let bfs = std::env::var("BFS").is_ok();
    let t = Instant::now();
    let mut m = Permits::new(cfg);
    m.first_only = bfs;
    if bfs {
        let c = m
            .checker()
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        report(&which, t, &c);
    } else {
        let c = m.checker().symmetry().threads(2).spawn_dfs().join();
        report(&which, t, &c);
    }
}

fn report(which: &str, t: Instant, c: &impl Checker<Permits>) {
    println!(
        "{which}: {} unique ({} generated), depth {}, {:.1} s",
        c.unique_state_count(),
        c.state_count(),
        c.max_depth(),
        t.elapsed().as_secs_f64()
    );
    for (name, path) in c.discoveries() {
        if name.starts_with("canary") {
            println!("reached {name}");
            continue;
        }
        let v = path.clone().into_vec();
        println!(
            "VIOLATED {name}: {} steps\n{}",
            v.len() - 1,
            c.model().narrate(&v)
        );
    }
}
