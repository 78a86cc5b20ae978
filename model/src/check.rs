//! The two checks both keys' tests run (`tests/exhaustive.rs`, `tests/permits.rs`), written
//! once: an exhaustive run that must be complete and violate exactly what is expected, and the
//! shortest counterexample of one property, printed in words; and the search under that, for
//! any model (`until_found`: the sets' and the observers' tests too).

use crate::system::{Act, Key, System};
use stateright::{Checker, HasDiscoveries, Model};
use std::collections::BTreeSet;
use std::hash::Hash;
use std::time::Instant;

/// One exhaustive run: every reachable state, DFS + symmetry on `threads` threads. Asserts the
/// run was complete (`min_unique`: the recorded count less ~1%; a run cut short would still
/// pass `assert_properties`), that every one of `canaries` was reached, and that exactly the
/// `expected` properties are violated (a trace of each difference is printed).
pub fn exhaustive<K: Key>(
    name: &str,
    model: System<K>,
    threads: usize,
    min_unique: usize,
    canaries: &[&str],
    expected: &[&str],
) {
    let t = Instant::now();
    let c = model
        .checker()
        .symmetry()
        .threads(threads)
        .spawn_dfs()
        .join();
    let unique = c.unique_state_count();
    println!(
        "{name}: {unique} unique states ({} generated), depth {}, {:.1} s",
        c.state_count(),
        c.max_depth(),
        t.elapsed().as_secs_f64()
    );
    assert!(c.is_done());
    assert!(
        unique >= min_unique,
        "{name}: only {unique} unique states (expected at least {min_unique}): run cut short?"
    );
    let found = c.discoveries();
    for canary in canaries {
        assert!(found.contains_key(canary), "{name}: {canary} not reached");
    }
    let violated: BTreeSet<&str> = found
        .keys()
        .copied()
        .filter(|p| !p.starts_with("canary"))
        .collect();
    let expected: BTreeSet<&str> = expected.iter().copied().collect();
    if violated != expected {
        let m = c.model();
        for p in violated.symmetric_difference(&expected) {
            if let Some(path) = found.get(p) {
                println!(
                    "{name}: {p} (a trace, not the shortest):\n{}",
                    m.narrate(&path.clone().into_vec())
                );
            }
        }
        panic!(
            "{name}: violated {violated:?}, expected {expected:?} (a protocol or model change: \
             update the findings)"
        );
    }
}

/// The shortest counterexample of `property` (1-thread BFS in depth order, each property
/// reporting only its first violation, until `property` has one), printed in words; its
/// actions, checked to replay.
pub fn shortest<K: Key>(name: &str, mut model: System<K>, property: &'static str) -> Vec<Act> {
    let t = Instant::now();
    model.first_only = true;
    let c = until_found(model, property);
    let path = c
        .discovery(property)
        .unwrap_or_else(|| panic!("{name}: no counterexample to {property}"));
    let actions = path.clone().into_actions();
    println!(
        "{name}: shortest counterexample to {property}: {} steps ({} unique states, {:.1} s)\n{}",
        actions.len(),
        c.unique_state_count(),
        t.elapsed().as_secs_f64(),
        c.model().narrate(&path.into_vec())
    );
    c.model().unlatch();
    c.assert_discovery(property, actions.clone());
    actions
}

/// A 1-thread BFS of `model` in depth order until `property` has a counterexample (the run
/// ends there, or when the states run out): with properties that report only their first
/// violation, its discovery is a shortest one.
pub fn until_found<M>(model: M, property: &'static str) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::fmt::Debug + Eq + Hash + Send + Sync + 'static,
    M::Action: Clone + std::fmt::Debug + PartialEq + Send + Sync + 'static,
{
    model
        .checker()
        .threads(1)
        .finish_when(HasDiscoveries::AnyOf([property].into_iter().collect()))
        .spawn_bfs()
        .join()
}
