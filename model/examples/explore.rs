//! A tool for finding traces, not a check:
//!
//! ```sh
//! EXPLORE=kill,stall [BFS=1] [PROP=text] cargo run --release -p waitlock-model --example explore
//! ```
//!
//! `EXPLORE` is a comma-separated list: fault families (budget 1 each) `loss`, `freeze`, `drop`,
//! `kill`, `stall`; holders' own calls and clock steps (each once more per mention) `extend`,
//! `refresh`, `careless`, `step`; `retain=<ticks>`, `horizon=<ticks>`, `wait=<ticks>`; bug
//! switches `short` (`Bug::ShortLeaseBackgroundConfirm`), `own` (`Bug::OwnClaimWindow`); one
//! behaviour taken back to before its fix `-f1` … `-f7`, `-r1` … `-r4` (review 2's findings
//! 1-4) (`Cfg::revert`); protocol 3's grant `p3`, or one of protocol 4's grant rules broken
//! `unheard`, `fence-kept`, `keep-departed`, `keep-late`, or the rule's first cut
//! `choose-for-holders` (`Cfg::grant`);
//! `nocost=<bits>` leaves incident costs out of the idle bound (`Cfg::no_cost`, `COST_*` bits). `BFS=1` stops at the first
//! violation (of a property whose name contains `PROP`, if given) and prints it: the shortest counterexample there is (1 thread, no symmetry: mind
//! the memory, a pair can need tens of GB); otherwise DFS + symmetry on 2 threads explores
//! everything and prints a counterexample (not the shortest) per violated property. `PROP`
//! keeps only the properties whose name contains it.

use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;
use waitlock_model::{Bug, Cfg, Grant, Queue, Revert};

fn main() {
    let which = std::env::var("EXPLORE").unwrap_or_default();
    let mut cfg = Cfg::default();
    for f in which.split(',') {
        match f.trim() {
            "loss" => cfg.world.losses = 1,
            "freeze" => cfg.world.freezes += 1,
            "drop" => cfg.world.drops = 1,
            "kill" => cfg.world.kills += 1,
            "stall" => cfg.world.stalls = 1,
            "short" => cfg.bug = Bug::ShortLeaseBackgroundConfirm,
            "own" => cfg.bug = Bug::OwnClaimWindow,
            "-f1" => cfg.revert = Some(Revert::F1Watchers),
            "-f2" => cfg.revert = Some(Revert::F2Lapse),
            "-f3" => cfg.revert = Some(Revert::F3Fence),
            "-f4" => cfg.revert = Some(Revert::F4Wake),
            "-f5" => cfg.revert = Some(Revert::F5Release),
            "-f6" => cfg.revert = Some(Revert::F6Limit),
            "-f7" => cfg.revert = Some(Revert::F7Holder),
            "-r1" => cfg.revert = Some(Revert::R1Lease),
            "-r2" => cfg.revert = Some(Revert::R2SelfWatch),
            "-r3" => cfg.revert = Some(Revert::R3Retention),
            "-r4" => cfg.revert = Some(Revert::R4Future),
            "-r5" => cfg.revert = Some(Revert::R5Fill),
            "p3" => cfg.grant = Some(Grant::ChooseAlways),
            "unheard" => cfg.grant = Some(Grant::StandsUnheard),
            "choose-for-holders" => cfg.grant = Some(Grant::ChooseForHolders),
            "keep-departed" => cfg.grant = Some(Grant::KeepDeparted),
            "keep-late" => cfg.grant = Some(Grant::KeepLate),
            "fence-kept" => cfg.grant = Some(Grant::UnheardFenceKept),
            "extend" => cfg.world.extends += 1,
            "refresh" => cfg.world.refreshes += 1,
            "careless" => cfg.world.careless += 1,
            "step" => cfg.world.steps += 1,
            x if x.starts_with("retain=") => {
                cfg.world.retain = Some(x[7..].parse().expect("retain=<ticks>"))
            }
            x if x.starts_with("horizon=") => {
                cfg.world.horizon = x[8..].parse().expect("horizon=<ticks>")
            }
            x if x.starts_with("wait=") => cfg.world.wait = x[5..].parse().expect("wait=<ticks>"),
            x if x.starts_with("nocost=") => {
                cfg.no_cost = x[7..].parse().expect("nocost=<COST_* bits>")
            }
            "" => {}
            other => panic!("unknown: {other} (see the doc comment of examples/explore.rs)"),
        }
    }
    let prop = std::env::var("PROP").unwrap_or_default();
    let t = Instant::now();
    let mut m = Queue::new(cfg);
    let bfs = std::env::var("BFS").is_ok();
    m.first_only = bfs;
    // BFS stops at the first violation (of a property whose name contains PROP, if given)
    let wanted: std::collections::BTreeSet<&'static str> = m
        .properties()
        .iter()
        .map(|p| p.name)
        .filter(|n| !n.starts_with("canary") && n.contains(prop.as_str()))
        .collect();
    let c: Box<dyn Checker<Queue>> = if bfs {
        Box::new(
            m.checker()
                .finish_when(HasDiscoveries::AnyOf(wanted))
                .spawn_bfs()
                .join(),
        )
    } else {
        Box::new(m.checker().symmetry().threads(2).spawn_dfs().join())
    };
    println!(
        "{which}: {} unique states, depth {}, {:.1} s",
        c.unique_state_count(),
        c.max_depth(),
        t.elapsed().as_secs_f64()
    );
    for (p, path) in c.discoveries() {
        if !p.contains(prop.as_str()) {
            continue;
        }
        if p.starts_with("canary") {
            println!("{p}: reached");
            continue;
        }
        println!(
            "{p}: {:?}\n{}",
            path.clone().into_actions(),
            c.model().narrate(&path.into_vec())
        );
    }
}
