//! Symmetry: fences renumbered by rank, and processes (and, when the key's waiters of a process
//! are alike, the waiters within each process) renamed into a canonical order.

use crate::fifo::Fifo;
use crate::system::*;
use stateright::Representative;

impl<K: Key> Representative for State<K> {
    fn representative(&self) -> Self {
        canonical(self)
    }
}

fn rename_msg(m: Msg, f: impl Fn(W) -> W) -> Msg {
    match m {
        Msg::Grant { to, fence, px, at } => Msg::Grant {
            to: f(to),
            fence,
            px,
            at,
        },
        Msg::Watch { to, px, by } => Msg::Watch { to: f(to), px, by },
        Msg::Dropped => Msg::Dropped,
    }
}

fn rename_call(c: Call, f: impl Fn(W) -> W) -> Call {
    match c {
        Call::Acquire { w, member, awaited } => Call::Acquire {
            w: f(w),
            member,
            awaited,
        },
        Call::Extend { w, awaited } => Call::Extend { w: f(w), awaited },
        Call::Release { w } => Call::Release { w: f(w) },
        Call::Leave { w, member, flag } => Call::Leave {
            w: f(w),
            member,
            flag,
        },
        Call::Renew { w, ttl, awaited } => Call::Renew {
            w: f(w),
            ttl,
            awaited,
        },
    }
}

/// Applies `f` to every fence the state holds.
fn each_fence<K: Key>(s: &mut State<K>, mut f: impl FnMut(&mut u8)) {
    s.key.each_fence(&mut f);
    for w in s.ws.iter_mut() {
        match w {
            Ws::Waiting(t) => {
                if let Some(a) = t.anchor.as_mut() {
                    f(&mut a.0);
                }
                if let Some(g) = t.grant.as_mut() {
                    f(&mut g.fence);
                }
                if let Some(Inflight::Lease { fence, .. } | Inflight::Confirm { fence, .. }) =
                    t.inflight.as_mut()
                {
                    f(fence);
                }
            }
            Ws::Holding { fence, .. } => f(fence),
            _ => {}
        }
    }
    for ch in s.chans.iter_mut() {
        for m in ch.iter_mut() {
            if let Msg::Grant { fence, .. } = m {
                f(fence);
            }
        }
    }
    for l in s.late.iter_mut() {
        for c in l.iter_mut() {
            if let Call::Leave {
                flag: Flag::O(fence),
                ..
            } = c
            {
                f(fence);
            }
        }
    }
}

/// Fences matter only by their order and equality (and the counter is above every other):
/// the same state with every fence replaced by its rank among the state's fences (0, a fence
/// forgotten, stays 0).
fn renumber_fences<K: Key>(s: &mut State<K>) {
    let mut seen = [false; 256];
    each_fence(s, |f| seen[*f as usize] = true);
    let mut rank = [0u8; 256];
    let mut r = 0u8;
    for (v, &used) in seen.iter().enumerate().skip(1) {
        if used {
            r += 1;
            rank[v] = r;
        }
    }
    each_fence(s, |f| *f = rank[*f as usize]);
}

/// What a waiter's place in the canonical order depends on: its state, its queue position,
/// the key's part (its hold), its watcher fields (and when it looks), which of its process's
/// messages and stalled calls name it (by position).
type WKey<K> = (Ws, u8, <K as Key>::WKey, u8, u16, u16);
/// A process's: its state, whether `'!h'` names it, the key's part, its waiters' keys, its
/// messages and stalled calls with waiters renamed within the process.
type PKey<K> = (
    Pr,
    bool,
    <K as Key>::PKey,
    Fifo<WKey<K>, MAXW>,
    Fifo<Msg, MAXM>,
    Fifo<Call, MAXC>,
);

/// The same state with fences renumbered and processes (and, with `Key::ALIKE`, waiters within
/// each process) renamed into a canonical order: sorted by everything that does not name
/// another process's waiter.
pub fn canonical<K: Key>(s0: &State<K>) -> State<K> {
    let mut renumbered = s0.clone();
    renumber_fences(&mut renumbered);
    let s = &renumbered;
    let np = s.procs.len();
    let wpp = s.ws.len() / np;
    let wkey = |w: usize| -> WKey<K> {
        let pos = s
            .queue
            .iter()
            .position(|&m| m as usize == w)
            .map_or(255, |i| i as u8);
        let mut wf = 0u8;
        for f in 0..2 {
            if let Some((at, m)) = s.watchers[f] {
                if m as usize == w {
                    wf |= 1 << f | at << 2;
                }
            }
        }
        let p = w / wpp;
        let mut msgs = 0u16;
        for (i, m) in s.chans[p].iter().enumerate() {
            if matches!(m, Msg::Grant { to, .. } | Msg::Watch { to, .. } if *to as usize == w) {
                msgs |= 1 << i;
            }
        }
        let mut calls = 0u16;
        for (i, c) in s.late[p].iter().enumerate() {
            if c.w() as usize == w {
                calls |= 1 << i;
            }
        }
        (s.ws[w], pos, K::wkey(s, w), wf, msgs, calls)
    };
    let mut keys: Fifo<(PKey<K>, usize, Fifo<u8, MAXW>), MAXP> = Fifo::default();
    for p in 0..np {
        let mut idx: Fifo<u8, MAXW> = (0..wpp as u8).collect();
        if K::ALIKE {
            idx.sort_by_cached_key(|&j| wkey(p * wpp + j as usize));
        }
        let mut inv = [0u8; MAXW];
        for (nj, &oj) in idx.iter().enumerate() {
            inv[oj as usize] = nj as u8;
        }
        let local = |w: W| inv[w as usize % wpp];
        let chans = s.chans[p].iter().map(|&m| rename_msg(m, local)).collect();
        let late = s.late[p].iter().map(|&c| rename_call(c, local)).collect();
        let wk = idx.iter().map(|&j| wkey(p * wpp + j as usize)).collect();
        let pkey = (
            s.procs[p],
            s.holder_pid == Some(p as Pid),
            K::pkey(s, p),
            wk,
            chans,
            late,
        );
        keys.push((pkey, p, idx));
    }
    keys.sort_unstable();
    let mut pmap = [0u8; MAXP];
    let mut wmap = [0u8; MAXW];
    for (np_new, (_, p, idx)) in keys.iter().enumerate() {
        pmap[*p] = np_new as u8;
        for (nj, &oj) in idx.iter().enumerate() {
            wmap[p * wpp + oj as usize] = (np_new * wpp + nj) as u8;
        }
    }
    if wmap
        .iter()
        .take(s.ws.len())
        .enumerate()
        .all(|(i, &w)| i == w as usize)
    {
        return renumbered;
    }
    let wm = |w: W| wmap[w as usize];
    let pm = |p: Pid| pmap[p as usize];
    let mut t = s.clone();
    for (w, &to) in wmap.iter().enumerate().take(s.ws.len()) {
        t.ws[to as usize] = s.ws[w];
    }
    for (p, &q) in pmap.iter().enumerate().take(np) {
        let q = q as usize;
        t.procs[q] = s.procs[p];
        t.chans[q] = s.chans[p].iter().map(|&m| rename_msg(m, wm)).collect();
        t.late[q] = s.late[p].iter().map(|&c| rename_call(c, wm)).collect();
    }
    t.key.rename(&wm, &pm);
    t.holder_pid = s.holder_pid.map(pm);
    for m in t.queue.iter_mut() {
        *m = wm(*m);
    }
    for (_, m) in t.watchers.iter_mut().flatten() {
        *m = wm(*m);
    }
    t
}
