//! The election's observers (`waitlock_model::election`): exhaustive with every property
//! holding, and each bug switch's shortest counterexample to convergence (O2).

use stateright::{Checker, Model};
use std::time::Instant;
use waitlock_model::check::until_found;
use waitlock_model::election::{Bug, Cfg, Observers};

const O1: &str = "(O1) shown terms never go back";
const O2: &str = "(O2) with nothing to read, the observer shows the leader";

#[test]
fn observers_converge_and_never_go_back() {
    let t = Instant::now();
    let c = Observers::new(Cfg::default()).checker().spawn_bfs().join();
    println!(
        "observers, 3 terms, 2 drops: {} unique states, depth {}, {:.2} s",
        c.unique_state_count(),
        c.max_depth(),
        t.elapsed().as_secs_f64()
    );
    assert!(c.is_done());
    c.assert_properties();
    assert!(c.discovery(O1).is_none() && c.discovery(O2).is_none());
}

/// The shortest counterexample to `property` with `bug`; its length.
fn shortest(bug: Bug, property: &'static str) -> usize {
    let mut model = Observers::new(Cfg {
        bug,
        ..Cfg::default()
    });
    model.first_only = true;
    let c = until_found(model, property);
    let path = c
        .discovery(property)
        .unwrap_or_else(|| panic!("{bug:?}: no counterexample to {property}"));
    let actions = path.into_actions();
    println!(
        "{bug:?}: {property} fails in {} steps: {actions:?}",
        actions.len()
    );
    actions.len()
}

/// Reading first and listening after: Take, Observe (the first reading: nobody, term 1 has
/// not announced), Announce (unheard), Listen: the observer shows nobody while term 1 leads.
#[test]
fn switch_read_before_listen() {
    assert_eq!(shortest(Bug::ReadBeforeListen, O2), 4);
}

/// A reconnection that does not wake the reader: Take, Observe (nobody yet), Announce (told),
/// Drop (the change lost with the connection), Reconnect: nobody shown while term 1 leads.
#[test]
fn switch_no_reread_on_reconnect() {
    assert_eq!(shortest(Bug::NoRereadOnReconnect, O2), 5);
}
