//! An exhaustive model of waitlock's queue handoff, checked with stateright 0.31, for both of
//! its keys: the lock (protocol format 3; `lock`, `tests/exhaustive.rs`) and the permits (the
//! fair semaphore; `permits`, `tests/permits.rs`). See `README.md`.
//!
//! **One waiter, two keys.** The code has one waiter (`src/wait/notify/mod.rs`) for both keys,
//! and so has the model: `System<K>` is processes with waiters on one key, `K: Key` that key's
//! Redis side. Shared:
//! - `waiter.rs`: `src/wait/notify/mod.rs::wait` and `take_grant` (`start`, `attempt`,
//!   `on_attempt`, `wake`, `take_grant`), with `Request::full_lease` and
//!   `Waiting::attempt`/`limit` (`src/wait/mod.rs`), the validity arithmetic of
//!   `src/hold/lease.rs`, the cell's sticky `hub_woke` flag, the client (a call runs now or
//!   waits on a stalled connection), holders' own lease-setting calls;
//! - `process.rs`: the processes and time: the enabled steps (urgent first, voluntary ones
//!   between cascades), the dispatcher's `deliver` (a `d2` wakes the channel; an orphan grant
//!   is given back with leave `o`), the faults (a message lost, a freeze and the
//!   housekeeper's notice, a kill, a subscriber connection dropped and re-made, a stalled
//!   client connection with its FIFO of late calls and their replay, time limits), holders'
//!   extends, refreshes and overstays, Redis' clock stepping back, the retention's expiries,
//!   the tick and the forgetting of dead data;
//! - `queue.rs`: the functions of `queue.lua` both keys' scripts use (`listener`,
//!   `process`, `publish`, `seen`, `retain`, `keep`, `watch`, `watching`);
//! - `canon.rs`: symmetry (processes, and alike waiters, renamed; fences renumbered by rank);
//! - `narrate.rs`: traces in words; `fifo.rs`: the inline vectors of the state.
//!
//! Each key's file holds its Redis side only: its scripts (acquire, release, extend, leave and
//! the functions of the Lua they mirror, same names), its state, its properties and their
//! ghosts, its configuration (`Cfg`: the shared `World` of processes, times and faults, and the
//! key's switches, which also choose the shared machinery's `Rules`), its words.
//!
//! **Time** is a tick (`now`); the clock runs only while nothing is due (timers, messages and
//! replies of running processes are urgent: a late process is a frozen one). Keys expire in
//! `Tick`. A guard's `valid_until` is computed as the code does it, from the send tick of the
//! call that set the lease (`Hold::sent`), or for a grant message from the anchor
//! (`since = anchor.sent + (grant time − anchor Redis time)`); the drift margin (1% + 2 ms) is
//! below a tick, so it is 0 in the model, and `full_lease`'s "about a full TTL" test
//! (`valid_until ≥ now + TTL − 2·margin`) is `valid_until ≥ now + TTL`.
//!
//! **Faults** are budgeted nondeterministic steps (`World`): a message lost (the hub then wakes
//! every waiter of the process: a lagged buffer or the reconnect that lost it), a process
//! frozen (messages sit in its FIFO, timers do not fire; resuming after `notice` ticks or more
//! wakes its waiters, as the housekeeper does), a subscriber connection dropped (messages in
//! flight lost, Redis counts no listener) and re-made (every waiter woken), a process killed,
//! and a stalled client connection (its calls wait in a FIFO; a caller waiting for a reply
//! gives up at its time limit, and the calls run later, in order).
//!
//! **Abstractions** (what the model leaves out or narrows, stated so a reader can judge):
//! - a call answered in time runs within the tick it is sent; only a stalled connection
//!   separates send, run and reply (so the anchor's send and Redis times differ only there);
//!   the 1% clock-rate factor is not modelled; the attempts' 5 ms last grace
//!   (`LAST_ATTEMPT_GRACE`) is below a tick: a call sent at the deadline has a limit of 0;
//! - the queue scan is unbounded (the scripts stop at 200 heads and answer "continue": release
//!   `{4}` / `{0, 4}`, acquire `{4}` never happen here);
//! - only `acquire_wait` with a hub: no polling callers (`wait::once`, a locker without
//!   pub/sub), no fixed tokens, no required replicas, no `give_back`; so every token names its
//!   process, and acquire.lua's `held_by(<hub of the holder's token>)` never gets '' (a lock
//!   taken free by a fixed token or a polling locker leaves '!h' unknown: not checked);
//! - every waiter has the same TTL and starts at tick 0 (or when its frozen process resumes);
//!   holders release before their lease ends unless frozen, killed, stalled or careless; a
//!   process's channel is unsubscribed as soon as its last waiter returns; a timed-out attempt
//!   is retried one tick later (the backoff);
//! - voluntary steps happen between cascades of urgent steps (`World::calm`): a holder's
//!   release, a freeze, a stall, a resume, a re-made subscriber connection, the start of a
//!   replay are offered only when no urgent step (a reaction: a delivery, a wake-up, an
//!   attempt, a timeout...) is pending; a release, a kill or a subscriber drop may still
//!   interleave with its own process's pending steps (its messages in flight, its other
//!   waiters' reactions), not with another process's. Message losses happen anywhere;
//! - the fast path (one plain attempt before registering) is skipped while the process's
//!   connection is stalled;
//! - the subscriber connection's drop and re-making are two steps (`SubDrop`, `Resub`): the
//!   hub's `Pending` between reconnect and confirmation is seen only by a waiter whose attempt
//!   found its process deaf.
//!
//! **Several keys at once** (issue 32) have a model of their own, `sets`: the grant rule of
//! a set of keys in one slot, written before its scripts, with two naive rules'
//! counterexamples (`tests/sets.rs`).
//!
//! **Switches.** `Cfg::default()` is the code as it is. The lock's `Cfg::bug` brings back one
//! of two old bugs, and `Cfg::revert` takes one of the fixes of findings F1–F7, R1–R5 back (the
//! finding tests); the permits' likewise P1–P3 (`permits::Cfg`).

mod canon;
pub mod check;
pub mod election;
pub mod fifo;
pub mod lock;
mod narrate;
pub mod permits;
mod process;
mod queue;
pub mod sets;
pub mod system;
mod waiter;

pub use canon::canonical;
pub use fifo::Fifo;
pub use lock::*;
pub use system::*;
