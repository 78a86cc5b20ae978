//! Several keys at once (`waitlock_model::sets`, issue 32): the rule to build holds every
//! property with a death and a leave; each naive rule's shortest counterexample.

use stateright::{Checker, Model};
use std::time::Instant;
use waitlock_model::check::until_found;
use waitlock_model::sets::{Cfg, Revert, Rule, Sets};

const S1: &str = "(S1) one holder per key, a holder holds its whole set";
const S2: &str = "(S2) no set granted while an older overlapping set waits";
const S3: &str = "(S3) every waiter ends (no deadlock)";
const S4: &str = "(S4) nothing left behind: every waiter ended, every key free, every queue empty";
const REFRESH: &str = "canary: a refresh drops a departed head";
const S6: &str = "(S6) a refresh leaves no departed waiter at the head of its keys' queues";
const S5: &str = "(S5) no live set left waiting that the rule grants, after any call";
const S8: &str = "(S8) no live waiter held back on free keys by departed sets only, past its look";

/// Checks `cfg` exhaustively (breadth first, 2 threads), prints its counts, and asserts that
/// it finished with at least `min_unique` states (a run cut short would prove nothing).
fn explore(name: &str, cfg: Cfg, min_unique: usize) -> impl Checker<Sets> {
    let t = Instant::now();
    let c = Sets::new(cfg).checker().threads(2).spawn_bfs().join();
    println!(
        "{name}: {} unique states ({} generated), depth {}, {:.2} s",
        c.unique_state_count(),
        c.state_count(),
        c.max_depth(),
        t.elapsed().as_secs_f64()
    );
    assert!(c.is_done());
    assert!(
        c.unique_state_count() >= min_unique,
        "{name}: only {} unique states: run cut short?",
        c.unique_state_count()
    );
    c
}

/// `refresh_drops`: the run must reach a refresh that drops a departed head (a set of two
/// keys at the head of a held key's queue, dead while it also heads a free key's: the
/// waiters it held back there are served by that key's look).
fn run(name: &str, cfg: Cfg, min_unique: usize, refresh_drops: bool) {
    let c = explore(name, cfg, min_unique);
    for p in [S1, S2, S3, S4, S5, S6, S8] {
        assert!(c.discovery(p).is_none(), "{name}: {p}");
    }
    // (not `assert_properties`: it requires every `sometimes` canary, and the refresh one is
    // out of reach where every set has two keys)
    assert!(
        c.discovery("canary: every set granted and released")
            .is_some(),
        "{name}: no run granted every set"
    );
    assert!(
        !refresh_drops || c.discovery(REFRESH).is_some(),
        "{name}: no refresh found a departed head"
    );
}

#[test]
fn all_at_once_with_a_death_and_a_leave() {
    run(
        "sets, all at once, 1 death + 1 leave",
        Cfg::default(),
        12_380,
        false,
    );
}

#[test]
fn all_at_once_with_two_deaths_and_two_leaves() {
    let cfg = Cfg {
        deaths: 2,
        leaves: 2,
        ..Cfg::default()
    };
    run("sets, all at once, 2 deaths + 2 leaves", cfg, 45_000, false);
}

#[test]
fn all_at_once_five_sets_of_one_to_three_keys() {
    let cfg = Cfg {
        sets: vec![vec![0, 1, 2], vec![1], vec![2, 0], vec![0], vec![1, 2]],
        ..Cfg::default()
    };
    run(
        "sets, all at once, five sets of 1-3 keys, 1 death + 1 leave",
        cfg,
        145_500,
        true,
    );
}

#[test]
fn all_at_once_six_sets_two_deaths_two_leaves() {
    let cfg = Cfg {
        sets: vec![
            vec![0, 1, 2],
            vec![1],
            vec![2, 0],
            vec![0],
            vec![1, 2],
            vec![0, 1],
        ],
        deaths: 2,
        leaves: 2,
        // (with a refresh: 12.1 M states, 47 s; the five sets' run has one)
        refreshes: 0,
        ..Cfg::default()
    };
    run(
        "sets, all at once, six sets of 1-3 keys, 2 deaths + 2 leaves",
        cfg,
        5_600_000,
        false,
    );
}

/// On a Cluster a call writes no key it did not declare: a set whose keys the serving call did
/// not all name has the served key reserved, and takes its keys by its own claim, or the
/// reservation lapses (the set, if alive, queues again at the back). Every property holds.
#[test]
fn all_at_once_on_a_cluster_reserves_and_claims() {
    for (name, cfg, min_unique) in [
        (
            "sets on a cluster, all at once, 1 death + 1 leave",
            Cfg {
                cluster: true,
                ..Cfg::default()
            },
            10_000,
        ),
        (
            "sets on a cluster, all at once, five sets of 1-3 keys, 1 death + 1 leave",
            Cfg {
                cluster: true,
                sets: vec![vec![0, 1, 2], vec![1], vec![2, 0], vec![0], vec![1, 2]],
                ..Cfg::default()
            },
            100_000,
        ),
    ] {
        let c = explore(name, cfg, min_unique);
        for p in [S1, S2, S3, S4, S5, S6, S8] {
            assert!(c.discovery(p).is_none(), "{name}: {p}");
        }
        for canary in [
            "canary: every set granted and released",
            "canary: a set takes its keys by its own claim of a reservation",
        ] {
            assert!(c.discovery(canary).is_some(), "{name}: {canary}");
        }
    }
    // A set that gives its reservations back without serving those keys (its head may be
    // another set, queued while it lapsed and queued again) leaves it waiting on free keys.
    let naive = Cfg {
        cluster: true,
        claim_serves: false,
        ..Cfg::default()
    };
    assert!(shortest_with(naive, S5) > 0);
}

/// Sets waiting at once beside sets taken in order (keys in two slots: 0 and 1 in one, 2 in
/// the other), as built: an in-order waiter waits for each run of one slot as a whole, holding
/// only the runs of earlier slots, none that a set of that slot waiting at once could need. No
/// deadlock, nothing left behind, no live set left waiting on what it could have; FIFO among
/// the sets waiting at once. Waiting for one key at a time (the in-order path as first built)
/// deadlocks beside a set waiting at once: it holds a key the set needs while queued behind
/// the set on another.
#[test]
fn sets_in_order_by_runs_beside_sets_at_once() {
    let base = Cfg {
        // at once: A,B (slot 0); in order: B,A,C and C,B (two slots); at once: C (slot 1)
        sets: vec![vec![0, 1], vec![1, 0, 2], vec![2, 1], vec![2]],
        slots: [0, 0, 1],
        in_order: vec![false, true, true, false],
        ..Cfg::default()
    };
    for (name, cfg, min_unique) in [
        ("1 death + 1 leave", base.clone(), 10_000),
        (
            "2 deaths + 2 leaves",
            Cfg {
                deaths: 2,
                leaves: 2,
                ..base.clone()
            },
            40_000,
        ),
        (
            "on a cluster, 1 death + 1 leave",
            Cfg {
                cluster: true,
                ..base.clone()
            },
            10_000,
        ),
    ] {
        let name = format!("sets in order by runs beside sets at once, {name}");
        let c = explore(&name, cfg, min_unique);
        for p in [S1, S2, S3, S4, S5, S6, S8] {
            assert!(c.discovery(p).is_none(), "{name}: {p}");
        }
        assert!(
            c.discovery("canary: every set granted and released")
                .is_some(),
            "{name}: no run granted every set"
        );
    }
    let by_key = Cfg {
        by_key: true,
        sets: vec![vec![0, 1], vec![0, 1, 2]],
        in_order: vec![false, true],
        deaths: 0,
        leaves: 0,
        refreshes: 0,
        ..base
    };
    assert!(shortest_with(by_key, S3) > 0);
}

/// The shortest counterexample to `property` under `rule` (no faults: the naive rules fail
/// on their own), printed; its length.
fn shortest(rule: Rule, property: &'static str) -> usize {
    shortest_with(
        Cfg {
            rule,
            deaths: 0,
            leaves: 0,
            refreshes: 0,
            ..Cfg::default()
        },
        property,
    )
}

fn shortest_with(cfg: Cfg, property: &'static str) -> usize {
    let rule = cfg.rule;
    let mut model = Sets::new(cfg);
    model.first_only = true;
    let t = Instant::now();
    let c = until_found(model, property);
    let path = c
        .discovery(property)
        .unwrap_or_else(|| panic!("{rule:?}: no counterexample to {property}"));
    let steps = path.clone().into_actions();
    println!(
        "{rule:?}: shortest counterexample to {property}: {} steps ({} unique states, {:.2} s)",
        steps.len(),
        c.unique_state_count(),
        t.elapsed().as_secs_f64()
    );
    for (s, a) in path.into_vec() {
        match a {
            Some(a) => println!("  {a:?}"),
            None => println!(
                "  then: waiters {:?}, holders {:?}, queues {:?}",
                s.ph, s.holder, s.queue
            ),
        }
    }
    steps.len()
}

#[test]
fn naive_each_key_in_turn_deadlocks() {
    // A,B against B,A: each takes its first key and waits for the other's (6 steps: the
    // others must end first, as (S3) is judged where a run ends).
    assert_eq!(shortest(Rule::EachInTurn, S3), 6);
}

#[test]
fn naive_all_when_free_passes_an_older_set() {
    // A,B holds, B,A waits; A,B released, and B,C (later) finds B and C free first.
    assert_eq!(shortest(Rule::WhenAllFree, S2), 4);
}

/// The ordered path (`Locker::acquire_many_wait` with `LockOptions::with_ordered_sets`, built
/// in `src/sets/in_order.rs`; the only path for keys in several slots, which no one script can
/// take): each key in turn in one order for everyone, (slot, key), the keys taken held
/// while the next is waited for. No deadlock, nothing left behind, no live waiter left on a
/// key it could have, with deaths and leaves; but FIFO is per key only: a later set may be
/// granted while an older overlapping set waits (for a key the later one does not need,
/// holding others).
fn sorted(cfg: Cfg, name: &str, min_unique: usize) {
    let mut cfg = Cfg {
        rule: Rule::EachInTurn,
        ..cfg
    };
    for s in cfg.sets.iter_mut() {
        s.sort();
    }
    let c = explore(name, cfg, min_unique);
    for p in [S1, S3, S4, S5, S6, S8] {
        assert!(c.discovery(p).is_none(), "{name}: {p}");
    }
    assert!(
        c.discovery("canary: every set granted and released")
            .is_some(),
        "{name}: no run granted every set"
    );
    assert!(
        c.discovery(S2).is_some(),
        "{name}: FIFO across keys was expected to break"
    );
}

#[test]
fn sorted_each_in_turn_cannot_deadlock_but_is_fifo_per_key_only() {
    sorted(
        Cfg::default(),
        "sets, each in turn sorted, 1 death + 1 leave",
        14_000,
    );
    sorted(
        Cfg {
            deaths: 2,
            leaves: 2,
            ..Cfg::default()
        },
        "sets, each in turn sorted, 2 deaths + 2 leaves",
        50_000,
    );
    sorted(
        Cfg {
            sets: vec![vec![0, 1, 2], vec![1], vec![2, 0], vec![0], vec![1, 2]],
            ..Cfg::default()
        },
        "sets, each in turn sorted, five sets of 1-3 keys, 1 death + 1 leave",
        167_000,
    );
    // Where FIFO across keys breaks: the shortest run.
    let mut sets = Cfg::default().sets;
    for s in sets.iter_mut() {
        s.sort();
    }
    let cfg = Cfg {
        rule: Rule::EachInTurn,
        sets,
        deaths: 0,
        leaves: 0,
        refreshes: 0,
        ..Cfg::default()
    };
    assert!(shortest_with(cfg, S2) > 0);
}

/// A departed waiter dropped from a head leaves its other queues: serving only the queue it
/// was found at leaves a live set waiting on free keys (what the model found before the
/// scripts were written).
#[test]
fn dropping_a_departed_head_serves_every_queue_it_leaves() {
    let cfg = Cfg {
        drop_serves: false,
        sets: vec![vec![0, 1], vec![1, 2], vec![0], vec![2]],
        deaths: 1,
        leaves: 0,
        ..Cfg::default()
    };
    assert!(shortest_with(cfg, S5) > 0);
}

const S7: &str = "(S7) a set taken at once never takes a key a live waiter is queued on";

/// Sets taken at once by polling (`take_set.lua`: a polling locker's `acquire_many_wait`, or
/// any `acquire_many`, on one node) beside queued sets taken in order (the built queued
/// path), on the same keys: one holder per key, no deadlock, nothing left behind, no queued
/// set left on keys it could have, and (S7) a polling set never takes a key a live waiter is
/// queued on; with the queues ignored (node-redlock's arrays: `poll_ignores_queues`), (S7)
/// breaks.
#[test]
fn polling_sets_at_once_beside_queued_sets_in_order() {
    let base = Cfg {
        rule: Rule::EachInTurn,
        // queued, sorted: A,B and B,C; polling: B,A and C,A
        sets: vec![vec![0, 1], vec![1, 2], vec![1, 0], vec![2, 0]],
        polling: vec![false, false, true, true],
        ..Cfg::default()
    };
    for (name, cfg, min_unique) in [
        ("1 death + 1 leave", base.clone(), 17_000),
        (
            "2 deaths + 2 leaves",
            Cfg {
                deaths: 2,
                leaves: 2,
                ..base.clone()
            },
            56_000,
        ),
    ] {
        let name = format!("sets, polling at once beside queued in order, {name}");
        let c = explore(&name, cfg, min_unique);
        for p in [S1, S3, S4, S5, S6, S7, S8] {
            assert!(c.discovery(p).is_none(), "{name}: {p}");
        }
        for canary in [
            "canary: every set granted and released",
            "canary: a polling set holds while a queued set waits",
            "canary: a polling attempt serves a free key's queue",
        ] {
            assert!(c.discovery(canary).is_some(), "{name}: {canary}");
        }
    }
    // (A free key with a live waiter queued needs a lease that ended: a holder's death.)
    let naive = Cfg {
        poll_ignores_queues: true,
        deaths: 1,
        leaves: 0,
        refreshes: 0,
        ..base
    };
    assert!(shortest_with(naive, S7) > 0);
}

/// Checks each of `runs` exhaustively: every property holds, and every one of `canaries` is
/// reached.
fn all_hold(runs: Vec<(String, Cfg, usize)>, canaries: &[&'static str]) {
    for (name, cfg, min_unique) in runs {
        let c = explore(&name, cfg, min_unique);
        for p in [S1, S2, S3, S4, S5, S6, S7, S8] {
            assert!(c.discovery(p).is_none(), "{name}: {p}");
        }
        for canary in canaries {
            assert!(c.discovery(canary).is_some(), "{name}: {canary}");
        }
    }
}

const EVERY_SET: &str = "canary: every set granted and released";

/// Review 3, finding 1: the in-order path takes the runs after the one it waited for in a
/// burst, each slot's run in `take_set` calls of at most `TAKE_SET_MAX` keys (here
/// `call_max` 1: a run of two keys takes two calls, each its own step, in any order). X takes
/// C (slot 0) then A,B (slot 1) in order; Y waits for A,B at once; H takes B alone.
fn split_run() -> Cfg {
    Cfg {
        sets: vec![vec![0, 1, 2], vec![0, 1], vec![1]],
        slots: [1, 1, 0],
        in_order: vec![true, false, false],
        call_max: 1,
        deaths: 0,
        leaves: 0,
        refreshes: 0,
        ..Cfg::default()
    }
}

const SPLIT: &str = "canary: a burst's call fails while the waiter holds a key of that run";

/// As fixed: a failed call gives back what was taken of its run, and the whole run is waited
/// for at once, holding only earlier slots: every property holds, with faults and on a
/// Cluster.
#[test]
fn run_split_into_calls_is_given_back_whole() {
    all_hold(
        vec![
            (
                "sets, a run split into calls, no faults".into(),
                split_run(),
                1,
            ),
            (
                "sets, a run split into calls, 1 death + 1 leave + 1 refresh".into(),
                Cfg {
                    deaths: 1,
                    leaves: 1,
                    refreshes: 1,
                    ..split_run()
                },
                1,
            ),
            (
                "sets, a run split into calls, 2 deaths + 2 leaves".into(),
                Cfg {
                    deaths: 2,
                    leaves: 2,
                    ..split_run()
                },
                1,
            ),
            (
                "sets, a run split into calls, two in order (C then A,B), one at once (A,B), one \
                 key (B), 1 death + 1 leave + 1 refresh"
                    .into(),
                Cfg {
                    sets: vec![vec![0, 1, 2], vec![0, 1], vec![1], vec![2, 1, 0]],
                    in_order: vec![true, false, false, true],
                    deaths: 1,
                    leaves: 1,
                    refreshes: 1,
                    ..split_run()
                },
                1,
            ),
            (
                "sets, a run split into calls, on a cluster, 1 death + 1 leave + 1 lapse".into(),
                Cfg {
                    cluster: true,
                    deaths: 1,
                    leaves: 1,
                    ..split_run()
                },
                1,
            ),
        ],
        &[EVERY_SET, SPLIT],
    );
}

/// With the fix reverted (`Revert::SplitRun`): the calls before the failed one are kept, the
/// first half of the very run it waits for; a set at once in that slot needs a kept key and
/// heads the queue of the missing one: each waits for the other (S3).
#[test]
fn run_split_into_calls_kept_in_part_deadlocks() {
    let cfg = Cfg {
        revert: Some(Revert::SplitRun),
        ..split_run()
    };
    assert_eq!(shortest_with(cfg, S3), 8);
}

const MARKED: &str = "canary: a frozen set marked lapsed on one key";
const RESUMED: &str = "canary: a frozen set told d2 resumes and queues again";
const EXPIRED: &str = "canary: a fence's q hint expired while its queue lives";

/// Review 3, finding 2: on a Cluster, set A,B (in two slots) waits behind B's holder and heads
/// A's queue, free; a one-key waiter on A queues behind it. B is released and reserved for the
/// set, whose process is frozen (listening, acting not): the reservation lapses and marks it in
/// B's processes hash only.
fn frozen_set() -> Cfg {
    Cfg {
        cluster: true,
        slots: [0, 1, 2],
        sets: vec![vec![0, 1], vec![1], vec![0]],
        freezes: 1,
        lapses: 0,
        deaths: 0,
        leaves: 0,
        refreshes: 0,
        ..Cfg::default()
    }
}

/// As fixed: a set at the head of a free key's queue that is missing from another of its
/// queues (not reserved for it there) has departed: dropped, told `d2`, it queues again when
/// it runs. Every property holds, with faults beside the freeze.
#[test]
fn a_frozen_set_on_a_cluster_holds_back_no_free_key() {
    all_hold(
        vec![
            ("sets on a cluster, a frozen set".into(), frozen_set(), 200),
            (
                "sets on a cluster, a frozen set, 1 death + 1 leave + 1 refresh + 1 lapse".into(),
                Cfg {
                    deaths: 1,
                    leaves: 1,
                    refreshes: 1,
                    lapses: 1,
                    ..frozen_set()
                },
                1_000,
            ),
            (
                "sets on a cluster, a frozen set, A,B and B,A and two one-key waiters, 1 death + \
                 1 leave"
                    .into(),
                Cfg {
                    sets: vec![vec![0, 1], vec![1], vec![0], vec![1, 0]],
                    deaths: 1,
                    leaves: 1,
                    ..frozen_set()
                },
                1_000,
            ),
        ],
        &[EVERY_SET, MARKED, RESUMED],
    );
}

/// With the fix reverted (`Revert::FrozenSet`): the frozen set stays at the head of A's queue,
/// never ready, never marked there; the live waiter behind it is held back on a free key (S8)
/// for as long as the process stays frozen.
#[test]
fn a_frozen_set_reverted_holds_back_a_free_key() {
    let cfg = Cfg {
        revert: Some(Revert::FrozenSet),
        ..frozen_set()
    };
    assert_eq!(shortest_with(cfg, S8), 7);
}

/// Review 3, finding 3: set A,B queues behind B's holder; a one-shot poller wants A. The clock
/// is reduced to the order of two expiries: a fence counter that may expire before its queue
/// (`Fence::Short`) does, at any step.
fn fence_life() -> Cfg {
    Cfg {
        sets: vec![vec![0, 1], vec![1], vec![0]],
        polling: vec![false, false, true],
        deaths: 0,
        leaves: 0,
        refreshes: 0,
        ..Cfg::default()
    }
}

/// As fixed: a key left free with a queue (by `leave_blocked`, or a set queueing first on it)
/// gives its fence counter the queue's life; every property holds, with faults.
#[test]
fn a_fence_counter_lives_as_long_as_its_queue() {
    all_hold(
        vec![
            ("sets, a fence beside its queue".into(), fence_life(), 50),
            (
                "sets, a fence beside its queue, two pollers".into(),
                Cfg {
                    sets: vec![vec![0, 1], vec![1], vec![0], vec![0]],
                    polling: vec![false, false, true, true],
                    ..fence_life()
                },
                200,
            ),
            (
                "sets, a fence beside its queue, A,B and B,A, one key each, a poller, 1 death + \
                 1 leave + 1 refresh"
                    .into(),
                Cfg {
                    sets: vec![vec![0, 1], vec![1], vec![0], vec![1, 0]],
                    polling: vec![false, false, true, false],
                    deaths: 1,
                    leaves: 1,
                    refreshes: 1,
                    ..fence_life()
                },
                1_000,
            ),
        ],
        &[EVERY_SET],
    );
}

/// With the fix of `leave_blocked` reverted (review 3's finding): set A,B queues behind B's
/// holder, first on A (free); a poller's attempt on A serves A's queue (the release call it
/// sends), which leaves A free for the set by `leave_blocked`, with a counter shorter than the
/// queue; it expires, and the poller's next attempt takes A past the queued set (S7); its
/// release, a bare `DEL`, serves nobody: the set is left waiting with both keys free (S5).
/// With the other door reverted (a set queued first on a free key), the same without the
/// poller's first attempt.
#[test]
fn a_fence_counter_shorter_than_its_queue_lets_a_poller_pass() {
    let cfg = |r| Cfg {
        revert: Some(r),
        sets: vec![vec![0, 1], vec![1], vec![0], vec![0]],
        polling: vec![false, false, true, true],
        ..fence_life()
    };
    assert_eq!(shortest_with(cfg(Revert::FenceLife), S7), 5);
    assert_eq!(shortest_with(cfg(Revert::FenceLife), S5), 7);
    assert_eq!(shortest_with(cfg(Revert::FenceLifeInKeep), S5), 6);
    let c = explore("sets, a fence reverted", cfg(Revert::FenceLife), 50);
    assert!(c.discovery(EXPIRED).is_some());
}

/// The three together: an in-order set whose run is split into calls, a set at once, a poller
/// and a one-key waiter, on a Cluster, with a freeze, a death, a leave, a refresh and a lapse.
#[test]
fn calls_freezes_and_fences_together() {
    all_hold(
        vec![(
            "sets, calls + a freeze + fences on a cluster, 1 death + 1 leave + 1 refresh + 1 \
             lapse"
                .into(),
            Cfg {
                sets: vec![vec![0, 1, 2], vec![0, 1], vec![1], vec![2]],
                in_order: vec![true],
                polling: vec![false, false, false, true],
                slots: [1, 1, 0],
                call_max: 1,
                cluster: true,
                freezes: 1,
                deaths: 1,
                leaves: 1,
                refreshes: 1,
                lapses: 1,
                ..Cfg::default()
            },
            100_000,
        )],
        &[EVERY_SET, SPLIT, MARKED, RESUMED],
    );
}
