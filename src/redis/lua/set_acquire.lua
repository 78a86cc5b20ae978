-- Model: a set's attempt, `Act::Start` and `Act::Look` of model/src/sets.rs (change both
-- together); each key's writes are those of acquire.lua on that key.
-- A set's attempt on one node, all of its keys or none (a queued locker's wait for several
-- keys at once): takes every key when each is free and no live waiter is queued ahead of the
-- set on it; else, with MEMBER (the set's member, see queue.lua), queues the set once in every
-- key's queue, holding nothing. Each free key whose queue may have waiters is served first, as
-- an attempt on that key alone would (its waiters' watchers may be gone). A set that heads a
-- free key's queue holds its later waiters back (lock.lua, "Sets").
-- KEYS: lock, fence, queue, processes of each key, the set's first key first (its grant
-- channel is the set's). ARGV: as every lock script's.
-- Reply:
--   {0, ttl, fence 1, ..., fence n}  every key taken;
--   {3, ttl, fence 1, ..., fence n}  a short grant of the set to this token, confirmed now;
--   {1, pttl, fence 1, ..., fence n} this token holds every key already (a full grant is
--                                    claimed: 'h' becomes 'q');
--   {2, pttl, 0, i}                  key i is held (pttl -1: free, but a set queued ahead
--                                    waits for other keys), nothing taken, not queued;
--   {2, pttl, 1, listening, fence, watching, time, depth, i}  queued in every key's queue,
--                                    as acquire.lua's (pttl: the lease that ends first among
--                                    the keys it watches; fence: the first key's; depth: the
--                                    longest of its queues; i: the first key it waits for);
--   {4, i}                           key i was free with only departed waiters at the head of
--                                    its queue: it is the caller's only to pass on (release it
--                                    until it says something else, then try again).
-- (Its phases are functions of lock_sets.lua, over the call's state: `set_call`.)
budget = SCAN
local S = set_call()
local r = set_held(S) or set_serve_free(S)
if r then return r end
local blocked, heads = set_blocked(S)
if not blocked then return set_take(S, heads) end
r = set_give_reserved(S)
if r then return r end
if MEMBER == '' then return {HELD, set_pttl(S, blocked), 0, blocked} end
return set_enqueue(S) or set_queued_reply(S, blocked)
