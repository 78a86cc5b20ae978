//! The election's observers (`src/election.rs`: `Election::observe`, its `Reader` and the
//! locker's `Tracker`), checked exhaustively.
//!
//! **What is abstracted.** An election is the lock plus a record (`{pk}:leader`, written by
//! `lua/elect_announce.lua`): a candidate's `campaign` is `acquire_wait` then the
//! announcement, and its `Leadership` is the lock's guard. So "no two candidates both believe
//! they lead with valid leases" is the lock model's (a) and "terms grow" its (c): a term is the
//! hold's fence, and the announcement runs only while the token holds the lock (`lock.rs`
//! checks both for every waiter, leaders included). What the lock model does not have is the
//! observers, modelled here over the lock's *effects* on the two keys, in any order the lock
//! allows: a hold begins with a new, larger term; its holder announces itself; it marks its
//! record resigned; the hold ends (a release, or the lease's expiry as Redis notices it); a
//! resigned record expires after the retention.
//!
//! **The observer** mirrors `Reader::run` and `Tracker`: the tracking connection (RESP3, client
//! tracking in broadcast mode on the election's prefix) tells it of every write to either key
//! while tracking is on (`pending`: in flight or buffered; a lagged buffer counts as a change);
//! a reading (`election.read`, one script: the lock and the record at once) is a step, its
//! result applied in a later step, so changes may land in between; a reading is shown when its
//! term is not below the highest seen and differs from the last reading (or says "nobody" after
//! someone). `observe` starts tracking and subscribes to the changes *before* its first reading.
//! Faults: the tracking connection drops (tracking off, buffered changes lost: a superset of
//! what fred loses) and comes back (tracking on again, then the epoch wakes the reader to read).
//! The backstop readings (lease end, 30 s) are left out: convergence must hold without them.
//!
//! **Properties:** (O1) shown terms never go back; (O2) once the reader has nothing to read
//! (no change pending, no reading in flight) while tracking is on, it shows the leader Redis
//! has: the holder whose record it is, or nobody. Two switches restore a broken reader, and
//! each gives a counterexample (`tests/election.rs`).

use stateright::{Model, Property};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Elections in one run (terms 1..=TERMS).
const TERMS: u8 = 3;

/// A reader taken back to a broken rule (each gives a counterexample).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// As implemented.
    None,
    /// The first reading before the reader listens for changes: a change in between is lost.
    ReadBeforeListen,
    /// A reconnection turns tracking on again but does not wake the reader: a change during
    /// the outage is never read.
    NoRereadOnReconnect,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct Cfg {
    /// Tracking connection drops (each followed, some time later, by its reconnection).
    pub drops: u8,
    pub bug: Bug,
}

impl Default for Cfg {
    fn default() -> Cfg {
        Cfg {
            drops: 2,
            bug: Bug::None,
        }
    }
}

/// The observer's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not observing yet.
    Idle,
    /// `observe` has read first but listens to nothing yet (only with `ReadBeforeListen`).
    ReadNotListening,
    /// Running `Reader::run`.
    Running,
}

/// Redis' two keys, the tracking connection and the observer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct St {
    /// The lock: the term of the hold (its fence), if held.
    pub lock: Option<u8>,
    /// The record: the term (and so the token) of the last announcement, and whether resigned.
    pub record: Option<(u8, bool)>,
    /// The next hold's term.
    pub next: u8,
    /// Tracking is on (the connection is up and `CLIENT TRACKING` was sent again).
    pub tracking: bool,
    pub drops_left: u8,
    pub phase: Phase,
    /// A change told by Redis that the reader has not acted on (or the reconnect epoch).
    pub pending: bool,
    /// A reading in flight: what Redis answered (the leader then).
    pub reading: Option<Option<u8>>,
    /// `last_term` and `shown` of `Reader::run`, and what the watch channel holds.
    pub last_term: u8,
    pub shown: Option<u8>,
    pub displayed: Option<u8>,
    /// Ghost: a shown term below one shown before.
    pub backwards: bool,
}

/// A step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// A candidate takes the free lock (a new term).
    Take,
    /// The holder announces itself (`elect_announce.lua`).
    Announce,
    /// The leader marks its record resigned (`elect_resign.lua`).
    Resign,
    /// The hold ends: a release, or the lease's expiry as Redis notices it.
    End,
    /// A resigned record expires (after the retention).
    RecordExpires,
    /// `observe`: tracking on, subscribe to the changes, the first reading.
    Observe,
    /// `ReadBeforeListen` only: the reader starts listening after its first reading.
    Listen,
    /// The reader wakes on a change and reads (one script call: the answer is Redis' now).
    Read,
    /// The reading's answer is applied.
    Apply,
    /// The tracking connection drops.
    Drop,
    /// It comes back: tracking on again, the epoch wakes the reader.
    Reconnect,
}

/// The observer model.
pub struct Observers {
    pub cfg: Cfg,
    /// Report only the first violation of each property (for shortest traces by 1-thread
    /// BFS: stateright keeps the last one it met), as `System::latch`.
    pub first_only: bool,
    latched: [AtomicBool; 2],
}

impl Observers {
    pub fn new(cfg: Cfg) -> Observers {
        Observers {
            cfg,
            first_only: false,
            latched: Default::default(),
        }
    }

    /// `ok`, or, reporting first violations only, false just once.
    fn latch(&self, i: usize, ok: bool) -> bool {
        if ok || !self.first_only {
            return ok;
        }
        self.latched[i].swap(true, Relaxed)
    }

    /// `leader_of`: the holder whose record it is (resigned or not), else nobody.
    pub fn truth(s: &St) -> Option<u8> {
        match (s.lock, s.record) {
            (Some(t), Some((r, _))) if t == r => Some(t),
            _ => None,
        }
    }

    /// Redis tells the tracking connection of a write to either key.
    fn changed(&self, s: &mut St) {
        if s.tracking && s.phase == Phase::Running {
            s.pending = true;
        }
    }

    /// Shows `now` as `Reader::run` does.
    fn apply(s: &mut St, now: Option<u8>) {
        let show = match now {
            Some(t) if t < s.last_term => false,
            Some(t) => s.shown != Some(t),
            None => s.shown.is_some(),
        };
        if let Some(t) = now {
            s.last_term = s.last_term.max(t);
        }
        if show {
            if let (Some(new), Some(old)) = (now, s.displayed) {
                if new < old {
                    s.backwards = true;
                }
            }
            s.displayed = now;
        }
        s.shown = now;
    }
}

impl Model for Observers {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        vec![St {
            lock: None,
            record: None,
            next: 1,
            tracking: false,
            drops_left: self.cfg.drops,
            phase: Phase::Idle,
            pending: false,
            reading: None,
            last_term: 0,
            shown: None,
            displayed: None,
            backwards: false,
        }]
    }

    fn actions(&self, s: &St, acts: &mut Vec<Act>) {
        if s.lock.is_none() && s.next <= TERMS {
            acts.push(Act::Take);
        }
        if let Some(t) = s.lock {
            if s.record.map(|r| r.0) != Some(t) {
                acts.push(Act::Announce);
            }
            if s.record == Some((t, false)) {
                acts.push(Act::Resign);
            }
            acts.push(Act::End);
        }
        if let Some((r, true)) = s.record {
            if s.lock != Some(r) {
                acts.push(Act::RecordExpires);
            }
        }
        match s.phase {
            Phase::Idle => acts.push(Act::Observe),
            Phase::ReadNotListening => acts.push(Act::Listen),
            Phase::Running => {
                if s.reading.is_some() {
                    acts.push(Act::Apply);
                } else if s.pending {
                    acts.push(Act::Read);
                }
                if s.tracking && s.drops_left > 0 {
                    acts.push(Act::Drop);
                }
                if !s.tracking {
                    acts.push(Act::Reconnect);
                }
            }
        }
    }

    fn next_state(&self, s: &St, a: Act) -> Option<St> {
        let mut n = s.clone();
        match a {
            Act::Take => {
                n.lock = Some(n.next);
                n.next += 1;
                self.changed(&mut n);
            }
            Act::Announce => {
                n.record = n.lock.map(|t| (t, false));
                self.changed(&mut n);
            }
            Act::Resign => {
                n.record = n.record.map(|(t, _)| (t, true));
                self.changed(&mut n);
            }
            Act::End => {
                n.lock = None;
                self.changed(&mut n);
            }
            Act::RecordExpires => {
                n.record = None;
                self.changed(&mut n);
            }
            Act::Observe => {
                // track(prefix) is awaited first: tracking is on from here
                n.tracking = true;
                let first = Self::truth(&n);
                if self.cfg.bug == Bug::ReadBeforeListen {
                    n.phase = Phase::ReadNotListening;
                } else {
                    n.phase = Phase::Running;
                }
                n.last_term = first.unwrap_or(0);
                n.shown = first;
                n.displayed = first;
            }
            Act::Listen => n.phase = Phase::Running,
            Act::Read => {
                n.pending = false;
                n.reading = Some(Self::truth(&n));
            }
            Act::Apply => {
                let now = n.reading.take().flatten();
                Self::apply(&mut n, now);
            }
            Act::Drop => {
                n.tracking = false;
                n.pending = false;
                n.drops_left -= 1;
            }
            Act::Reconnect => {
                n.tracking = true;
                if self.cfg.bug != Bug::NoRereadOnReconnect {
                    n.pending = true;
                }
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::<Self>::always("(O1) shown terms never go back", |m, s| {
                m.latch(0, !s.backwards)
            }),
            Property::<Self>::always(
                "(O2) with nothing to read, the observer shows the leader",
                |m, s| {
                    let quiet = s.phase == Phase::Running
                        && s.tracking
                        && !s.pending
                        && s.reading.is_none();
                    m.latch(1, !quiet || s.displayed == Self::truth(s))
                },
            ),
            Property::<Self>::sometimes("canary: a third term shown", |_, s| {
                s.displayed == Some(TERMS)
            }),
            Property::<Self>::sometimes("canary: a change pending lost by a drop", |_, s| {
                s.phase == Phase::Running && !s.tracking && s.drops_left == 0
            }),
        ]
    }
}
