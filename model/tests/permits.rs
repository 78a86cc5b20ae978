//! The model checks of waitlock's permits (`waitlock_model::permits`, see `model/README.md`,
//! "Permits"): 3 processes × 2 waiters of weights 2 and 1 on one key of 3 permits, exhaustive
//! runs (DFS + symmetry, 2 threads) of the scripts as they are (`Cfg::default()`) without
//! faults and for each pair of the fault families loss, freeze and kill (budget 1 each); the
//! findings P1–P3, each replayed with its fix reverted (`Cfg::revert`); the bug switches'
//! shortest counterexamples (1-thread BFS with the first-violation latch).
//!
//! **Properties** (`waitlock_model::permits::P1`…`P4`):
//! - (1) the weights of the guards valid at a tick (`valid_until`, as the client computes it,
//!   not passed) sum to at most N;
//! - (2) FIFO without barging: no script makes a hold for a waiter while an older queue member
//!   (one queued before it) of a process Redis sees listening stays queued, ungranted, after
//!   that script;
//! - (2b) the idle bound: no tick passes while a waiter of a running process waits in the queue
//!   and a serve run then (a purge, then the scan as the scripts do it: a head nobody listens
//!   for is dropped, the first other head that does not fit stops it) would grant someone
//!   (`Cfg::idle_bound` = 0 consecutive ticks);
//! - (3) a returned guard's fence is the fence Redis has for its hold (whose lease runs), and
//!   every hold's fence is above every earlier one;
//! - (4) once every waiter has returned and no message is in flight, no queue member and no
//!   running lease of a process that is still alive is left.
//!
//! **Findings** (the scripts before commit "Permits: fix three findings of the permits
//! model", for P2's first fix before commit "Permits: watchers preferably outside the
//! holders' processes, chosen again whenever permits come free", and for the fill before
//! commit "Permits: when the watchers must come from holders' processes, the first lease's
//! process last"; `Cfg::revert` brings each back, `Cfg::fill_first_last` false the fill's):
//! - P1, safety, no fault needed: a waiter whose attempt crossed its own grant message returned
//!   a guard from the attempt's `{1, pttl, fence}` reply; the grant message then reached a
//!   process where that waiter had gone, and the dispatcher's give-back (permit_leave.lua, flag
//!   `o`, fence matching) freed the permits the guard was using: (1) fails
//!   (`finding_p1_orphan_give_back`). Fix: a grant is recorded unclaimed (`"<fence> g"`), the
//!   waiter's acquire `{1}` and extend claim it, and `o` gives back only an unclaimed one.
//! - P2, liveness: the watchers could be waiters of a holder's process; a freeze of that
//!   process (its lease runs out, its watcher is silent) and the kill of the other watcher's
//!   process left the live waiters of the third process sleeping while every permit was free
//!   (`finding_p2_watchers_fail_with_a_holder`, `Revert::P2Watchers`). First fix
//!   (`Revert::P2FirstHub`): `watch` skipped `first_hub()`, the process of the holder whose
//!   lease ends first, and `watching` replaced a watcher of it; (2b) then failed with one
//!   freeze (`finding_p2_first_fix_one_freeze`) and in freeze + kill
//!   (`finding_p2_first_fix_freeze_kill`). Fix now: `watch` skips every holder's process
//!   (`holding()`) and fills both fields from them when no other is left, `watching` replaces a
//!   watcher of a holder's process by a newcomer of another, and every call that frees permits
//!   with waiters queued chooses the watchers again.
//! - The fill (of that fix), freeze + kill: two of the three processes hold, so one watcher
//!   comes from a holder's process, and the fill took the first lease's (its waiter the
//!   queue's last); that process frozen and the other watcher's killed, the third process's
//!   waiter, fitting when the frozen lease ends, waited a tick for its own process's holder to
//!   release (`finding_fill_any_freeze_kill`, `Cfg::fill_first_last` false). Fix: the fill takes
//!   the first lease's process last.
//! - P3 (an observation, not a property): `serve` asked whether a head fits before whether
//!   anyone listens for it, so a dead head that did not fit held back lighter live waiters
//!   (`finding_p3_dead_head`). Fix: a dead head is dropped first.
//!
//! **What is left** (the scripts as they are): (1), (2), (3) and (4) hold in every pair, and
//! (2b) in loss + freeze and loss + kill; (2b) fails in freeze + kill, by one tick at most,
//! by a late watch message (`remaining_freeze_kill`, the shortest, 24 steps;
//! `remaining_late_watch_message`): a process frozen for less than `notice` reads `w2 <px>`
//! late and its waiter looks px after reading, later than the lease it watches ends. A watch
//! message that names a time (`Cfg::watch_at`, the scripts' `w3` since review 2) removes it:
//! every property holds in freeze + kill; `w2_freeze_kill` keeps the old message's result.
//!
//! (2b) counts from the next call after a kill (`Cfg::idle_strict` counts from the kill:
//! `observation_kill_strict`).

use stateright::{Model, Path};
use waitlock_model::check;
use waitlock_model::permits::*;

// The unique-state floors of the exhaustive runs (the counts measured less ~1%).
const FLOOR_NONE: usize = 53_600;
const FLOOR_LF: usize = 5_052_000;
const FLOOR_LK: usize = 590_000;
const FLOOR_FK: usize = 2_054_000;
const FLOOR_R1: usize = 55_300;
const FLOOR_R2: usize = 522_000;
const FLOOR_W2FK: usize = 2_249_000;

/// The scripts as they are with these fault families (budget 1 each): loss, freeze, kill.
fn with(faults: &[&str]) -> Cfg {
    let mut c = Cfg::default();
    for f in faults {
        match *f {
            "loss" => c.world.losses = 1,
            "freeze" => c.world.freezes = 1,
            "kill" => c.world.kills = 1,
            other => panic!("unknown fault family {other}"),
        }
    }
    c
}

/// `cfg` with the fix of one finding taken back.
fn reverted(r: Revert, cfg: Cfg) -> Cfg {
    Cfg {
        revert: Some(r),
        ..cfg
    }
}

/// `cfg` with the fill as it was before the first lease's process was taken last.
fn fill_any(cfg: Cfg) -> Cfg {
    Cfg {
        fill_first_last: false,
        ..cfg
    }
}

/// One exhaustive run of the permits' model (`check::exhaustive`, 2 threads), every canary
/// reached.
fn exhaustive(name: &str, cfg: Cfg, min_unique: usize, expected: &[&str]) {
    let canaries = [CANARY_ENDED, CANARY_BLOCKED, CANARY_THREE];
    check::exhaustive(name, Permits::new(cfg), 2, min_unique, &canaries, expected);
}

/// The shortest counterexample of `property` in the permits' model (`check::shortest`).
fn shortest(name: &str, cfg: Cfg, property: &'static str) -> Vec<Act> {
    check::shortest(name, Permits::new(cfg), property)
}

/// Replays `actions` on `cfg` (`None` if one is not enabled); `Some(states)` otherwise.
fn replay(cfg: Cfg, actions: &[Act]) -> Option<(Permits, Vec<St>)> {
    let m = Permits::new(cfg);
    let init = m.init_states().remove(0);
    let path = Path::from_actions(&m, init, actions)?;
    let states = path.into_states();
    Some((m, states))
}

fn holds(m: &Permits, property: &str, s: &St) -> bool {
    let props = m.properties();
    let p = props.iter().find(|p| p.name == property).unwrap();
    (p.condition)(m, s)
}

// ---------------------------------------------------------------- the scripts as they are
//
// (1), (2), (3) and (4) hold in every pair; (2b) holds without faults, in loss + freeze and in
// loss + kill, and fails in freeze + kill (`remaining_freeze_kill`: a late watch message).

#[test]
fn fixed_no_faults() {
    exhaustive("fixed, no faults", with(&[]), FLOOR_NONE, &[]);
}

#[test]
fn fixed_loss_freeze() {
    exhaustive(
        "fixed, loss + freeze",
        with(&["loss", "freeze"]),
        FLOOR_LF,
        &[],
    );
}

#[test]
fn fixed_loss_kill() {
    exhaustive("fixed, loss + kill", with(&["loss", "kill"]), FLOOR_LK, &[]);
}

#[test]
fn fixed_freeze_kill() {
    exhaustive(
        "fixed, freeze + kill",
        with(&["freeze", "kill"]),
        FLOOR_FK,
        &[],
    );
}

// ---------------------------------------------------------------- the findings, reverted

/// P1 reverted, no faults: (1) fails, and only (1).
#[test]
fn revert_p1_no_faults() {
    exhaustive(
        "P1 reverted, no faults",
        reverted(Revert::P1Claim, with(&[])),
        FLOOR_R1,
        &[P1],
    );
}

/// P2 reverted to its very first rule, loss + kill: every property holds (with P2's first fix,
/// `Revert::P2FirstHub`, (2b) failed here: the watchers could be left in another holder's
/// process).
#[test]
fn revert_p2_loss_kill() {
    exhaustive(
        "P2 reverted, loss + kill",
        reverted(Revert::P2Watchers, with(&["loss", "kill"])),
        FLOOR_R2,
        &[],
    );
}

/// P1: the shortest trace, no faults (24 steps). w1 (P0) and w3 (P1) take a permit each free;
/// w0 (P0, 2), w2 (P1, 2), w4 and w5 (P2) queue, w2 watching (it looks at tick 4). At tick 1
/// w1's release grants w0 (lease to tick 5). At tick 4 w0 releases and grants w2 (g2 in
/// flight); w2's watch time is due in the same tick: its attempt finds its own hold
/// (`{1, 4, fence}`) and returns a guard. Its grant message then reaches P1, where w2 has
/// gone: the dispatcher gives it back (permit_leave 'o', the fence matches), which grants w4
/// (weight 2) and w5: w2 and w4 hold valid guards weighing 4 of 3 permits. As the scripts
/// are, w2's attempt claimed the hold and the give-back leaves it: (1) holds on the replay.
#[test]
fn finding_p1_orphan_give_back() {
    let actions = shortest(
        "P1 (claim reverted)",
        reverted(Revert::P1Claim, with(&[])),
        P1,
    );
    assert_eq!(actions.len(), 24);
    match replay(with(&[]), &actions) {
        None => println!("P1: as the scripts are, these steps do not happen"),
        Some((m, states)) => {
            assert!(states.iter().all(|s| holds(&m, P1, s)));
            println!("P1: as the scripts are, these steps happen and (1) holds");
        }
    }
}

/// P2: the shortest trace (16 steps, freeze + kill, P1 and P3 fixed). w0 (P0) takes 2
/// permits free; w2 (P1) and w1 (P0) queue and become the watchers (P0 is the holder's
/// process); P2's two waiters queue behind. P1 is killed and P0 freezes: w0's lease ends at
/// tick 4 and nobody looks; P2's waiters sleep with every permit free until their deadline
/// (in the code: their deadline, or the 100 s safety interval). As the scripts are (and with
/// the first fix), w1 is not made a watcher (P0 holds), so these steps do not happen.
#[test]
fn finding_p2_watchers_fail_with_a_holder() {
    let actions = shortest(
        "P2 (watchers reverted, freeze + kill)",
        reverted(Revert::P2Watchers, with(&["freeze", "kill"])),
        P2B,
    );
    assert_eq!(actions.len(), 16);
    not_replayed("P2, replayed", with(&["freeze", "kill"]), &actions);
    let first = reverted(Revert::P2FirstHub, with(&["freeze", "kill"]));
    not_replayed("P2, replayed on the first fix", first, &actions);
}

/// P3: P1 is killed while its w2 (weight 2) heads the queue; w1 releases one permit: its
/// release scans the queue. With P3 reverted, w2 (nobody listens for it) does not fit, so the
/// scan stops there and keeps it; w5 (P2, weight 1), which fits, waits behind a dead waiter
/// until two permits are free. As the scripts are, w2 is dropped first and w5 is granted in
/// that release.
#[test]
fn finding_p3_dead_head() {
    use Act::*;
    let t = [
        Start(0),
        Start(1),
        Start(2),
        Attempt(2),
        Start(4),
        Start(5),
        Attempt(5),
        Attempt(4),
        Kill(1),
        Release(1),
    ];
    let (m, states) = replay(reverted(Revert::P3DeadFirst, with(&["kill"])), &t).expect("replays");
    let last = states.last().unwrap();
    println!(
        "P3 (dead-first reverted):\n{}",
        m.narrate(
            &states
                .iter()
                .cloned()
                .zip(t.iter().map(|a| Some(*a)).chain([None]))
                .collect::<Vec<_>>()
        )
    );
    assert!(m.held_by_dead(last), "the dead head holds back w5");
    assert!(!last.key.holders.iter().any(|h| h.w == 5));
    let (m, states) = replay(with(&["kill"]), &t).expect("replays");
    let last = states.last().unwrap();
    assert!(!m.held_by_dead(last));
    assert!(last.key.holders.iter().any(|h| h.w == 5), "w5 is granted");
}

/// `actions` do not all happen on `cfg` (the watchers differ, so a step is not enabled).
fn not_replayed(what: &str, cfg: Cfg, actions: &[Act]) {
    assert!(replay(cfg, actions).is_none(), "{what}: the steps happen");
    println!("{what}: these steps do not happen");
}

/// The watchers after the first `n` steps of `actions` replayed on `cfg`.
fn watchers_after(cfg: Cfg, actions: &[Act], n: usize) -> Vec<W> {
    let (_, states) = replay(cfg, &actions[..n]).expect("replays");
    let last = states.last().unwrap();
    last.watchers.iter().flatten().map(|&(_, m)| m).collect()
}

/// P2's first fix (`Revert::P2FirstHub`), one freeze (21 steps): w1 (P0, weight 1) and w2 (P1,
/// 2) take permits free at tick 0 (leases to tick 4, w1's first); w3 (P1), w4 (P2), w0 (P0)
/// and w5 (P2) queue, w3 and w4 watching. w2's release grants w3: the watchers kept out of P0
/// (w1's lease ends first), so w0 was passed over and w4 alone watched; w3's release granted
/// w4, and w5 (P2) became the only watcher, in the process of the holder w4. P2 freezes. w1
/// releases: w0 (2) does not fit yet, nobody is granted, and the watchers were not looked at
/// again, although P0 then held nothing and P2 held the first lease. w4's lease ends at tick
/// 4; w5 is frozen; w0 (P0, running) waits with every permit free. As the scripts are, w0 is
/// made a watcher at w2's release (as with the very first rule): these steps do not happen.
#[test]
fn finding_p2_first_fix_one_freeze() {
    let actions = shortest(
        "P2's first fix, freeze",
        reverted(Revert::P2FirstHub, with(&["freeze"])),
        P2B,
    );
    assert_eq!(actions.len(), 21);
    // after w2's release (step 11): w4 (P2) alone watched (w0 is in P0, the first lease's
    // process); with the very first rule and as the scripts are, w0 watches too
    let first = reverted(Revert::P2FirstHub, with(&["freeze"]));
    assert_eq!(watchers_after(first, &actions, 11), vec![4]);
    let original = reverted(Revert::P2Watchers, with(&["freeze"]));
    assert_eq!(watchers_after(original, &actions, 11), vec![4, 0]);
    assert_eq!(watchers_after(with(&["freeze"]), &actions, 11), vec![4, 0]);
    not_replayed(
        "P2's first fix, freeze, replayed",
        with(&["freeze"]),
        &actions,
    );
}

/// P2's first fix (`Revert::P2FirstHub`), freeze + kill (17 steps): w1 (P0, 1), w3 (P1, 1) and
/// w5 (P2, 1) take permits free at tick 0, in this order (w1's lease ends first); w2 (P1, 2)
/// and w4 (P2, 2) queue and take the two free watcher fields (`watching` replaced a watcher of
/// P0 only); w0 (P0, 2) queues behind, not a watcher. w1 releases: w2 (2) does not fit, nobody
/// is granted, the watchers stayed in P1 and P2, both holders' processes then. P1 freezes and
/// P2 is killed: w3's and w5's leases end at tick 4 and nobody looks; w0 (P0, running) waits
/// with every permit free. As the scripts are, w1's release chooses the watchers again (P0,
/// holding nothing now, first: w0).
#[test]
fn finding_p2_first_fix_freeze_kill() {
    let actions = shortest(
        "P2's first fix, freeze + kill",
        reverted(Revert::P2FirstHub, with(&["freeze", "kill"])),
        P2B,
    );
    assert_eq!(actions.len(), 17);
    not_replayed(
        "P2's first fix, freeze + kill, replayed",
        with(&["freeze", "kill"]),
        &actions,
    );
}

/// The fill as it was (`Cfg::fill_first_last` false), freeze + kill (20 steps): w0 (P0, 2)
/// and w5 (P2, 1) take the 3 permits free at tick 0 (leases to tick 4); w2 (P1, 2), w1 (P0,
/// 1), w3 (P1, 1) and w4 (P2, 2) queue in this order, w2 and w1 watching. P2 freezes. At tick
/// 2 w0's release grants w2 (lease to tick 6); the holders are w5 (P2, first lease) and w2
/// (P1): w1 (P0, the only process holding nothing) is kept, and the fill takes the other
/// watcher from the holders' processes: w4 (P2, frozen; the queue's last, looked at first)
/// rather than w3 (P1, running). P0 is killed. w5's lease ends at tick 4 unreleased: 1 permit
/// is free, w1 (dead) would be dropped and w3 (1) granted, but w1 is dead and w4 frozen:
/// nobody looks, and w3 waits until w2 (P1, running) releases, at tick 5 at the latest (one
/// tick: (2b) holds with `idle_bound` 1). As the scripts are (the first lease's process, P2,
/// last), the fill takes w3: these steps do not happen.
#[test]
fn finding_fill_any_freeze_kill() {
    let any = fill_any(with(&["freeze", "kill"]));
    let actions = shortest("fill as it was, freeze + kill", any.clone(), P2B);
    assert_eq!(actions.len(), 20);
    // after w0's release (step 14)
    assert_eq!(watchers_after(any, &actions, 14), vec![1, 4]);
    assert_eq!(
        watchers_after(with(&["freeze", "kill"]), &actions, 14),
        vec![1, 3]
    );
    not_replayed(
        "fill as it was, freeze + kill, replayed",
        with(&["freeze", "kill"]),
        &actions,
    );
}

// ---------------------------------------------------------------- what is left

/// The late watch message (`remaining_late_watch_message`): the shortest counterexample to
/// (2b) on the scripts as they are, freeze + kill.
fn late_watch_message() -> [Act; 24] {
    use Act::*;
    [
        Start(0),
        Start(1),
        Start(2),
        Attempt(2),
        Start(3),
        Attempt(3),
        Start(4),
        Start(5),
        Attempt(5),
        Attempt(4),
        Release(0),
        Kill(1),
        Freeze(2),
        Release(1),
        Tick,
        Tick,
        Resume(2),
        Deliver(2),
        Wake(5),
        Deliver(2),
        Wake(4),
        Tick,
        Tick,
        Tick,
    ]
}

/// `w2` messages (before review 2: a delay from the reading), freeze + kill: the shortest
/// counterexample to (2b) is 24 steps, a late watch message, the very steps of
/// `remaining_late_watch_message`; with `w3` (`Cfg::watch_at`, the scripts now) they do not all
/// happen (w4 looks at tick 4).
#[test]
fn remaining_freeze_kill() {
    let actions = shortest("w2 (2b), freeze + kill", w2(with(&["freeze", "kill"])), P2B);
    assert_eq!(actions.len(), 24);
    assert_eq!(actions, late_watch_message());
    not_replayed("w3, freeze + kill", with(&["freeze", "kill"]), &actions);
}

/// The watch message as it was before review 2 (`w2`: a delay counted from its reading).
fn w2(cfg: Cfg) -> Cfg {
    Cfg {
        watch_at: false,
        ..cfg
    }
}

/// (2b) on the scripts as they are (and with the fill as it was), freeze + kill, 24 steps: w0 (P0, 2) and w1 (P0, 1) take the 3 permits
/// free at tick 0; w2, w3 (P1), w5 and w4 (P2) queue in this order, w2 and w5 watching. w0's
/// release grants w2 (P1, 2); the watchers are w5 (P2) and w3 (P1). P1 is killed, P2 freezes.
/// w1's release grants w5 (P2, 1); the holders are w2 (P1, dead, lease to tick 4) and w5; the
/// only waiter left, w4 (P2), is told "look in 4" (at tick 4). P2 resumes at tick 2 (a freeze
/// of 2 ticks, not noticed: `notice` 3): w5 confirms its grant (extend: the watchers are kept,
/// w4's look is still due at tick 4), and w4 reads its watch message late and looks 4 ticks
/// after reading, at tick 6. w2's lease ends at tick 4: 2 permits are free, w4 (2) would be
/// granted, and nobody looks (one tick: w4's deadline is tick 6). A watch message naming a
/// time (`Cfg::watch_at`) makes w4 look at tick 4.
#[test]
fn remaining_late_watch_message() {
    let t = late_watch_message();
    // the steps happen and (2b) fails on one of their states
    let fails = |cfg: Cfg| -> bool {
        replay(cfg, &t).is_some_and(|(m, states)| !states.iter().all(|s| holds(&m, P2B, s)))
    };
    let (m, states) = replay(w2(with(&["freeze", "kill"])), &t).expect("replays");
    println!(
        "late watch message:\n{}",
        m.narrate(
            &states
                .iter()
                .cloned()
                .zip(t.iter().map(|a| Some(*a)).chain([None]))
                .collect::<Vec<_>>()
        )
    );
    assert!(fails(w2(with(&["freeze", "kill"]))));
    assert!(fails(fill_any(w2(with(&["freeze", "kill"])))));
    assert!(!fails(with(&["freeze", "kill"])));
}

/// The `w2` message as it was, freeze + kill: (2b) fails, and only (2b).
#[test]
fn w2_freeze_kill() {
    exhaustive(
        "w2, freeze + kill",
        w2(with(&["freeze", "kill"])),
        FLOOR_W2FK,
        &[P2B],
    );
}

/// (2b) counted strictly (`Cfg::idle_strict`: a dead head is dropped by the scan at once, as
/// `serve` does since P3's fix), one kill (11 steps): w0 (P0) holds 2 permits; w2 (P1, 2)
/// heads the queue, w1 (P0, 1) behind it. P1 is killed: a call now would drop w2 and grant w1,
/// but no call comes until w0's release or its lease's end (a watcher looks then, which is
/// what the design promises; the default (2b) counts from there).
#[test]
fn observation_kill_strict() {
    let cfg = Cfg {
        idle_strict: true,
        ..with(&["kill"])
    };
    let actions = shortest("kill, strict (2b)", cfg, P2B);
    assert_eq!(actions.len(), 11);
}

// ---------------------------------------------------------------- the bug switches

/// Barging (serve skips a head that does not fit): w4's plain attempt serves the queue and
/// grants w1 (weight 1) past w2 (weight 2), which stays queued: (2) fails in 6 steps.
#[test]
fn switch_barging() {
    let cfg = Cfg {
        bug: Bug::Barging,
        ..with(&[])
    };
    let actions = shortest("Barging", cfg, P2);
    assert_eq!(actions.len(), 6);
}

/// A double free (give_back frees a token's weight although it holds nothing), with one
/// freeze: P0 freezes holding 2 permits (w0) past its lease; at tick 4 the holders key expires
/// with it and w2 (P1, 2), a watcher, takes 2 permits; P0 resumes and w0's late release frees
/// its 2 permits again, granting w4 (P2, 2) and w1 (P0, 1): w2 and w4 hold valid guards
/// weighing 4 of 3 permits: (1) fails in 24 steps.
#[test]
fn switch_double_free() {
    let cfg = Cfg {
        bug: Bug::DoubleFree,
        ..with(&["freeze"])
    };
    let actions = shortest("DoubleFree", cfg, P1);
    assert_eq!(actions.len(), 24);
}
