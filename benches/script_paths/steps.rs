//! `BENCH_STEPS=1`: where a script's time goes inside one call, step by step. Redis has no Lua
//! profiler and perf sees only the interpreter's C functions, so the scripts are run with
//! checkpoints: a local `STEP(name)` that appends `<name> <Redis TIME in µs>` to a list, put
//! between the steps of the paths the contention bench runs most (a release that grants, a
//! queueing attempt). A checkpoint costs a `TIME`, an `RPUSH` and a little Lua itself: the
//! step `(a checkpoint)` (two checkpoints in a row, after a first one that warms up) measures
//! that, and the table subtracts it from every step. `TIME` counts whole microseconds: the
//! table gives means, which average that out over many calls, not medians.
//!
//! The checkpoints are placed by anchors, lines of the scripts they go before. When a script
//! changes so that an anchor is gone (or appears twice), this panics and names it: move the
//! anchor, it is a diagnostic's, not the protocol's.

/// The list the checkpoints append to (the private server's; no key of the bench's).
pub const LIST: &str = "bench:steps";

/// The checkpoint function, and the first three checkpoints (the third one measures the cost of
/// a checkpoint), put before the scripts' own text.
const PRELUDE: &str = "local function STEP(name) local t = redis.call('TIME'); \
redis.call('RPUSH', 'bench:steps', name .. ' ' .. t[1] .. string.format('%06d', tonumber(t[2]))) end\n\
STEP('') STEP('(the first checkpoint)') STEP('(a checkpoint)')\n";

use crate::common::scripts::run;
use waitlock::fred::prelude::*;

/// (anchor, step): `STEP(step)` goes before the anchor, which must occur exactly once in the
/// composed script; `step` names what ran since the previous checkpoint.
const COMMON: &[(&str, &str)] = &[
    // lock.lua, `hand`: a grant.
    (
        "  local f, old = next_fence(more, pending, px, K.fkey)\n",
        "serve: the walk's verdict",
    ),
    (
        "  if tell and not K:grant(tell, pid, f, px, token) then\n",
        "hand: next fence (TIME, SET GET)",
    ),
    (
        "  redis.call('SET', K.key, state .. token, 'PX', px)\n  -- ('!h' = pid",
        "hand: SPUBLISH the grant (its receivers: the head's liveness)",
    ),
    (
        "  if tell then\n    K:watch_granted(pid, px)\n",
        "hand: SET the lock",
    ),
    (
        "  -- (The hash may be new here: it gets an expiry either way.)\n",
        "hand: the watchers (watch_granted, or all of watch)",
    ),
    (
        "  return f\nend\n\n-- Hands the lock to the oldest",
        "hand: keep (PEXPIREs)",
    ),
    // lock.lua, `serve_once`.
    (
        "  local stopped, full_scan, _, behind = K:walk(self, nil, function(m)\n",
        "serve: its start (the walk's bound, ahead)",
    ),
    // queue_walk.lua, `next_head`: the first batch of heads.
    ("    local pre = nil\n    n = #heads\n", "walk: ZRANGE of the first heads"),
    (
        "    K:know(heads, n, pre, K.ahead_on)\n",
        "walk: HMGET of their records and the watchers' fields",
    ),
    (
        "  end\n  W.i = W.i + 1\n  return W.heads[W.i]\n",
        "walk: the freshness of their processes (know, by record)",
    ),
    // queue_walk.lua, `walk`.
    (
        "  local kept = W.ended and queue_writes == writes0\n",
        "walk: the visit (parse, verdict)",
    ),
    (
        "  local spent = W.from - (#W.heads - W.i) + W.extra\n  if budget then budget",
        "walk: ZREM of those taken",
    ),
    // queue_walk.lua, `know`.
    (
        "  local hows = {}\n  for k, how in pairs(listeners(live)) do",
        "know: whom to ask (tables, members' pids)",
    ),
    (
        "  for j, who in ipairs(ask) do\n    known[who] = judge(",
        "know: PUBSUB SHARDNUMSUB (none in a grant's walk)",
    ),
    // queue_watch.lua, `watch_granted` (`watchers_fit`).
    (
        "  local score = K:queued(ms)\n  return score[1] and score[2]",
        "watch_granted: the fields parsed",
    ),
    (
        "  K:ahead(false)\n  K:use_hint(was)\n  if was[3] == pid then",
        "watch_granted: are they queued (ZMSCORE or the walk's read)",
    ),
    // queue_watch.lua, `watch`.
    (
        "    K:know({cur[1].m, cur[2] and cur[2].m}, 2)\n",
        "watch: the current watchers parsed",
    ),
    (
        "  K:pick(C, true, false)\n",
        "watch: are they queued (ZMSCORE or the walk's read)",
    ),
    (
        "  -- Written only where a field changes (a kept watcher",
        "watch: pick (the queue's back read, parsed)",
    ),
    (
        "  K:flush(writes, fresh)\n  if #gone > 0 then redis.call('HDEL', K.pkey",
        "watch: the fields and 'w3' messages",
    ),
    (
        "  -- (`kept`: the caller sets the hash's expiry after this.)\n  if #C.chosen > 0 and not kept",
        "watch: flush (HSET)",
    ),
    // lock.lua, `enqueue`: a queueing attempt.
    (
        "  -- (The record is written with the watcher's field: `queued_reply`.)\n  K:seen",
        "(enqueue called)",
    ),
    (
        "  K:add_member()\n  local old = redis.call('GET', K.fkey)\n",
        "enqueue: seen",
    ),
    (
        "  local old = redis.call('GET', K.fkey)\n  local _, _, pending = fence_parse(old)\n",
        "enqueue: ZADD, ZRANGE (add_member)",
    ),
    (
        "  return K:queued_reply(pttl, f, nil)\n",
        "enqueue: GET the fence, its flags",
    ),
];

/// The release script's own checkpoints (release.lua).
const RELEASE: &[(&str, &str)] = &[
    (
        "local cur = redis.call('GET', KEYS[1])\nif not cur then\n  -- The lease ran out",
        "prelude: queue.lua and lock.lua run",
    ),
    ("local L = lock_key()\n-- (The record", "GET the lock"),
    ("L:seen(PID, true)\nreturn", "lock_key()"),
    ("return {L:release_held(state)}", "seen (deferred write)"),
];

/// The acquire script's own checkpoints (acquire.lua).
const ACQUIRE: &[(&str, &str)] = &[
    (
        "local lock = KEYS[1]\nlocal cur = redis.call('SET', lock, TAKEN",
        "prelude: queue.lua and lock.lua run",
    ),
    (
        "local L = lock_key()\nif state_of(cur) == TAKEN then",
        "SET NX GET, PTTL",
    ),
    (
        "if state_of(cur) == TAKEN then\n  -- The first waiter",
        "lock_key()",
    ),
];

/// Whole-statement replacements that put a checkpoint after a call whose result is returned.
const ENDS: &[(&str, &str)] = &[
    (
        "return {L:release_held(state)}",
        "local r = {L:release_held(state)}\nSTEP('release_held: serve, hand (all of it)')\nreturn r",
    ),
    (
        "  return K:queued_reply(pttl, f, nil)\n",
        "  local r = K:queued_reply(pttl, f, nil)\n  STEP('queued_reply: watching, the reply')\n  return r\n",
    ),
];

fn once(src: &str, anchor: &str) -> usize {
    let mut at = src.match_indices(anchor).map(|(i, _)| i);
    match (at.next(), at.next()) {
        (Some(i), None) => i,
        (None, _) => panic!("BENCH_STEPS: anchor not found in the scripts: {anchor:?}"),
        (Some(_), Some(_)) => panic!("BENCH_STEPS: anchor found twice: {anchor:?}"),
    }
}

/// `src` (a composed lock script: queue.lua, lock.lua, then `acquire` or `release`) with the
/// checkpoints.
pub fn instrument(src: &str, release: bool) -> String {
    let own = if release { RELEASE } else { ACQUIRE };
    let mut out = src.to_owned();
    for (anchor, step) in COMMON.iter().chain(own) {
        let at = once(&out, anchor);
        out.insert_str(at, &format!("STEP([[{step}]])\n"));
    }
    for (anchor, with) in ENDS {
        if let Some(at) = out.find(anchor) {
            once(&out, anchor);
            out.replace_range(at..at + anchor.len(), with);
        }
    }
    format!("{PRELUDE}{out}")
}

/// Empties the list (what the setup's calls left).
pub async fn clear(c: &Client) {
    run(c, vec!["DEL".to_owned(), LIST.to_owned()]).await;
}

/// Adds the steps of the call just made to `into` (each step and its times, in the order first
/// seen), and empties the list.
pub async fn record(c: &Client, into: &mut Vec<(String, Vec<f64>)>) {
    let words = ["LRANGE", LIST, "0", "-1"].map(str::to_owned).to_vec();
    let entries: Vec<String> = run(c, words).await.convert().expect("the steps");
    clear(c).await;
    for (step, us) in deltas(&entries) {
        match into.iter_mut().find(|(s, _)| *s == step) {
            Some((_, times)) => times.push(us),
            None => into.push((step, vec![us])),
        }
    }
}

/// The steps of one call, from the list's entries (`<name> <µs>`, in order): (step, µs since
/// the previous checkpoint).
fn deltas(entries: &[String]) -> Vec<(String, f64)> {
    let parsed: Vec<(String, f64)> = entries
        .iter()
        .filter_map(|e| {
            let (name, t) = e.rsplit_once(' ')?;
            Some((name.to_owned(), t.parse().ok()?))
        })
        .collect();
    parsed
        .windows(2)
        .map(|w| (w[1].0.clone(), w[1].1 - w[0].1))
        .collect()
}

/// Each path's steps: the mean µs per call that ran it, and that less a checkpoint's own cost
/// (the `(a checkpoint)` step's mean).
pub fn print(paths: &[&str], by_step: Vec<Vec<(String, Vec<f64>)>>) {
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "\nwhere each call's time goes (BENCH_STEPS; the SLOWLOG times above include the \
         checkpoints): mean µs per step, and net of a checkpoint's own cost"
    );
    for (path, found) in paths.iter().zip(by_step) {
        let cost = found
            .iter()
            .find(|(s, _)| s == "(a checkpoint)")
            .map_or(0.0, |(_, v)| mean(v));
        println!("\n  {path} (a checkpoint: {cost:.1} µs)");
        let mut net_sum = 0.0;
        for (step, v) in found {
            if step.starts_with("(the first") || step == "(a checkpoint)" {
                continue;
            }
            let m = mean(&v);
            let net = m - cost;
            net_sum += net;
            println!(
                "    {step:<60} mean {m:>6.1}  net {net:>6.1}  (in {} calls)",
                v.len()
            );
        }
        println!("    {:<60} net {net_sum:>6.1}", "sum of the steps");
    }
}
