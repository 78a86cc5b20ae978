//! The functions of `src/redis/lua/queue.lua` that both keys' scripts use, on the queue and
//! the processes hash (records, the watcher fields `'!w1'` `'!w2'`, `'!h'`): same names.

use crate::fifo::Fifo;
use crate::system::*;

/// How much longer than it must a `keep` that moves them makes the queue and the processes
/// hash live (the Lua: a quarter of the retention), so that a busy key moves them only once
/// in a while.
pub const KEEP_SLACK: u8 = 1;

impl<K: Key> System<K> {
    // mirrors queue.lua -> Key.listener(pid) (`listeners` asks for several at once):
    // somebody listens on the process's grant channel (its subscriber connection is up and a
    // waiter of it is registered on the key)
    pub fn listener(&self, s: &State<K>, p: usize) -> bool {
        let pr = s.procs[p];
        pr.sub && pr.run != Run::Killed && self.registered(s, p)
    }

    /// Whether `p`'s record says Redis saw it call within the presence window by Redis' own
    /// clock: `0 <= now - seen <= presence` (R4 reverted: a record in Redis' future too).
    pub fn recent(&self, s: &State<K>, p: usize) -> bool {
        match s.procs[p].rec {
            Rec::Seen(t) => {
                let d = self.rnow(s) as i16 - t as i16;
                (d >= 0 || self.rules.future_fresh) && d <= self.world().presence as i16
            }
            _ => false,
        }
    }

    // mirrors queue_walk.lua -> Key.process(pid) (with `judge`; `know` asks for several pids
    // in one read, a grant's first heads' with the watcher fields (`read_fields`), the same
    // answers): gone (lapsed 'x', or nobody listens), fresh (seen
    // within the presence window, by Redis' clock, not in its future) or stale
    pub fn process(&self, s: &State<K>, p: usize) -> Status {
        let pr = s.procs[p];
        if pr.rec == Rec::Lapsed || !self.listener(s, p) {
            return Status::Gone;
        }
        if self.recent(s, p) {
            Status::Fresh
        } else {
            Status::Stale
        }
    }

    // mirrors queue_walk.lua -> publish(how, hub, msg)
    pub fn publish(&self, s: &mut State<K>, p: usize, m: Msg) {
        s.chans[p].push(m);
    }

    /// The processes hash exists (a record, a watcher field or `'!h'`).
    pub fn pkey_exists(&self, s: &State<K>) -> bool {
        s.procs.iter().any(|pr| pr.rec != Rec::None)
            || s.watchers.iter().any(|w| w.is_some())
            || s.holder_pid.is_some()
            || s.e_hint != 0
    }

    // mirrors queue.lua -> Key.seen(pid, later): a new field gives the hash the retention
    // (the sweep of records that say nothing changes nothing here: a record that is not fresh
    // means what no record means). With `later` the Lua writes the record with the call's next
    // write of the hash (`flush`) and reads it as written until then: the same end state, one
    // HSET fewer.
    //
    // The retention only if the hash has no expiry (`PEXPIRE ... NX`): a new record must not
    // cut the life `keep` gave the hash (and that '!e' states).
    //
    // `read`: the call read the record on its way (the Lua's `read_fields`, in `watching`,
    // `watch` and a grant's walk), and leaves one younger than `young` ticks as it is (`flush`:
    // a process that calls often writes its record once in a while, not on every call).
    pub fn seen(&self, s: &mut State<K>, hub: Option<usize>, read: bool) {
        if let Some(p) = hub {
            if let (true, Rec::Seen(t)) = (read, s.procs[p].rec) {
                let now = self.rnow(s);
                if now >= t && now - t < self.world().young {
                    return;
                }
            }
            let new = s.procs[p].rec == Rec::None;
            s.procs[p].rec = Rec::Seen(self.rnow(s));
            if new {
                if let Some(r) = self.world().retain {
                    if s.p_exp == 0 {
                        s.p_exp = self.rnow(s) + r;
                    }
                }
            }
        }
    }

    // mirrors queue.lua -> Key.retain(): the processes hash gets the retention if it has
    // no expiry
    pub fn retain(&self, s: &mut State<K>) {
        if let Some(r) = self.world().retain {
            if s.p_exp == 0 && self.pkey_exists(s) {
                s.p_exp = self.rnow(s) + r;
            }
        }
    }

    // mirrors queue.lua -> Key.keep(px, force): the queue and the processes hash live the
    // lease `px` plus the retention at least. When '!e' says they do already, nothing is
    // written; else both live that and `KEEP_SLACK` more, and '!e' says until when (`force`: a
    // new queue, which has no expiry yet, whatever '!e' says). (R3 reverted: not called.) The
    // Lua writes '!e' only where the call read it; the calls of the Lua that did not (a
    // "continue", and every permits call) set the life exactly and drop '!e': the model has
    // neither (its scan has no bound, its permits no retention).
    pub fn keep(&self, s: &mut State<K>, px: u8, force: bool) {
        let Some(r) = self.world().retain else { return };
        if !self.rules.keep {
            return;
        }
        let life = self.rnow(s) + px + r;
        if !force && s.e_hint != 0 && s.e_hint >= life {
            return;
        }
        let life = life + KEEP_SLACK;
        // (HSET '!e' first: it makes the hash if it is gone, and the PEXPIRE gives it its life)
        s.e_hint = life;
        if !s.queue.is_empty() {
            s.q_exp = life;
        }
        s.p_exp = life;
    }

    /// `DEL` the processes hash, watchers and `'!h'` included.
    pub fn del_pkey(&self, s: &mut State<K>) {
        for pr in s.procs.iter_mut() {
            pr.rec = Rec::None;
        }
        s.watchers = [None, None];
        s.holder_pid = None;
        s.e_hint = 0;
        s.p_exp = 0;
    }

    // mirrors queue_watch.lua -> Key.watch(skip, px, later, fill, last): keep two watchers of
    // two processes, fresh ones not skipped first, then stale ones not skipped, then (when
    // none was chosen, or with `fill`) from the skipped processes, `last` (with `fill`) after
    // the others. `skip`: a set of processes, a bit each (the lock's single `skip` is one bit,
    // `''` none). A kept watcher is told again if it would look later than the lease ends
    // (with `later`, a refresh: also earlier); any chosen: `retain()` (`kept`, serve's call,
    // leaves it to the caller's `keep`/`retain` right after: the same end state). The Lua
    // reads the back of the queue only when the current watchers do not do (its last 4
    // members, then the 12 before them if those do not do: the order of one read of 16), and
    // writes only the fields that change: the same watchers, the same messages
    pub fn watch(
        &self,
        s: &mut State<K>,
        skip: u8,
        px: u8,
        later: bool,
        fill: bool,
        last: Option<usize>,
    ) {
        let now = self.rnow(s);
        let until = now + px;
        let mut stat = [Status::Gone; MAXP];
        for (p, st) in stat.iter_mut().enumerate().take(self.np()) {
            *st = self.process(s, p);
        }
        let mut cands: Fifo<(W, Option<u8>), 8> = Fifo::default();
        for f in 0..2 {
            if let Some((at, m)) = s.watchers[f] {
                if s.queue.contains(&m) {
                    cands.push((m, Some(at)));
                }
            }
        }
        for &m in s.queue.iter().rev().take(16) {
            cands.push((m, None));
        }
        let mut chosen: Fifo<(W, Option<u8>), 2> = Fifo::default();
        let mut hubs = 0u8;
        let mut pick = |fresh_only: bool, allowed: u8, chosen: &mut Fifo<(W, Option<u8>), 2>| {
            for &(m, at) in cands.iter() {
                if chosen.len() == 2 {
                    return;
                }
                let wp = self.pw(m);
                if hubs & (1 << wp) == 0 && allowed & (1 << wp) != 0 {
                    let st = stat[wp];
                    if st != Status::Gone && (st == Status::Fresh || !fresh_only) {
                        hubs |= 1 << wp;
                        chosen.push((m, at));
                    }
                }
            }
        };
        pick(true, !skip, &mut chosen);
        pick(false, !skip, &mut chosen);
        if chosen.is_empty() || fill {
            if let (true, Some(l)) = (fill, last) {
                pick(false, !(1 << l), &mut chosen);
            }
            pick(false, !0, &mut chosen);
        }
        s.watchers = [None, None];
        for (i, &(m, at)) in chosen.iter().enumerate() {
            let at = match at {
                Some(a) if until >= a && !(later && until > a) => a,
                _ => {
                    let by = self.watch_by(s, m, now, px);
                    self.publish(s, self.pw(m), Msg::Watch { to: m, px, by });
                    until
                }
            };
            s.watchers[i] = Some((clamp(now, at), m));
        }
        if !chosen.is_empty() {
            self.retain(s);
        }
    }

    /// `w3 <px> <now> <token>`, kept as the receiver's `look_at` bound (see `Msg::Watch`).
    fn watch_by(&self, s: &State<K>, m: W, now: u8, px: u8) -> u8 {
        if self.rules.watch_msg != WatchMsg::Bound {
            return 0;
        }
        match s.ws[m as usize] {
            Ws::Waiting(Wt {
                anchor: Some((_, lag)),
                ..
            }) => (now as i16 - lag as i16 + px as i16).clamp(0, 254) as u8,
            _ => NO_BOUND,
        }
    }

    // mirrors queue_watch.lua -> Key.watching(pttl, holding): is the new member a watcher? Its
    // own field, a free field (`fits(i)`: the other field's watcher is not of the caller's
    // process), or, if its process is not in `holding` (a set of processes, a bit each: the
    // lock's '!h', the permits' `holding()`), the field of a watcher whose process is (the
    // other field's process not the caller's). `any_field` (the lock's F1 reverted): its own
    // field, else the first free one, whatever the processes.
    pub fn watching(&self, s: &mut State<K>, m: W, pttl: u8, holding: u8, any_field: bool) -> bool {
        let hub = self.pw(m);
        let hubs = s.watchers.map(|x| x.map(|(_, o)| self.pw(o)));
        let fits = |f: usize| any_field || hubs[1 - f] != Some(hub);
        let field = (0..2)
            .find(|&f| matches!(s.watchers[f], Some((_, o)) if o == m))
            .or_else(|| (0..2).find(|&f| s.watchers[f].is_none() && fits(f)))
            .or_else(|| {
                if any_field || holding & (1 << hub) != 0 {
                    return None;
                }
                (0..2).find(|&f| hubs[f].is_some_and(|h| holding & (1 << h) != 0) && fits(f))
            });
        let Some(f) = field else { return false };
        let now = self.rnow(s);
        s.watchers[f] = Some((clamp(now, now + pttl), m));
        true
    }
}
