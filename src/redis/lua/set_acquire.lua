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
budget = SCAN
local n = #KEYS / 4
local locks, fkeys = {}, {}
for j = 1, n do locks[j], fkeys[j] = KEYS[4 * j - 3], KEYS[4 * j - 2] end
local function L(j) return slow(locks[j]) end
local cur = redis.call('MGET', unpack(locks))

-- Holds of this token: the set's grant (found by its own call: its message was lost, or
-- crossed this call), or the call sent again. (A key reserved for the set, on a Cluster, is
-- not held: it is free for the set alone, `reserved_for_me`.)
local function reserved_for_me(j)
  return cur[j] ~= nil and cur[j] ~= false and state_of(cur[j]) == RESERVED
    and holder_of(cur[j]) == TOKEN
end
local function held_by_me(j)
  return cur[j] and holder_of(cur[j]) == TOKEN and not reserved_for_me(j)
end
local mine = 0
for j = 1, n do
  if held_by_me(j) then mine = mine + 1 end
end
if mine == n then
  local fences, short, pttl = {}, false, nil
  for j = 1, n do
    if state_of(cur[j]) == GRANTED then short = true end
  end
  if short then
    -- A short grant: every key confirmed (the full TTL, state 'q', the watchers told).
    for j = 1, n do fences[j] = L(j).confirm_grant() end
    return {GRANT_CONFIRMED, tonumber(TTL), unpack(fences)}
  end
  for j = 1, n do
    local state = state_of(cur[j])
    if state == HANDED then redis.call('SETRANGE', locks[j], 0, QUEUED) end
    local left = redis.call('PTTL', locks[j])
    if not pttl or left < pttl then pttl = left end
    local fv = redis.call('GET', fkeys[j])
    if fv then
      fences[j] = fence_parse(fv)
    else
      -- (Deleted by hand: started again from Redis' clock, never 0.)
      fences[j] = L(j).fence_flags(state ~= TAKEN, nil, false, math.max(left, 0))
    end
  end
  return {HELD_BY_CALLER, pttl, unpack(fences)}
end
if mine > 0 then
  -- Some keys only (one deleted by hand, say): given back, as a departing waiter would, and
  -- the set tried again as a whole.
  for j = 1, n do
    if held_by_me(j) then
      if L(j).release_held(state_of(cur[j])) == CONTINUE then return {CONTINUE, j} end
    end
  end
  cur = redis.call('MGET', unpack(locks))
end

-- Each free key whose queue may have waiters is served first (they come first, the set
-- among them if it is queued).
local fv = redis.call('MGET', unpack(fkeys))
local served = false
for j = 1, n do
  local _, queued, pending = fence_parse(fv[j])
  if not cur[j] and queued and not reserved_for_me(j) then
    served = true
    local K = L(j)
    if pending and pending ~= PID then K.lapse(pending) end
    K.seen(PID)
    local got = K.serve(MEMBER)
    if got == 'more' then
      redis.call('SET', locks[j], QUEUED .. TOKEN, 'PX', CLAIM)
      K.keep(CLAIM)
      K.fence_flags(true, nil, nil, CLAIM)
      return {CONTINUE, j}
    end
    K.ahead(false)
  end
end
if served then cur = redis.call('MGET', unpack(locks)) end

-- Where the set can take a key: free, and nobody live ahead of it in its queue (the queue
-- is empty, or the set heads it).
local blocked = nil
local heads = {}
for j = 1, n do
  if cur[j] and not reserved_for_me(j) then
    blocked = blocked or j
  else
    heads[j] = redis.call('ZRANGE', KEYS[4 * j - 1], 0, 0)[1]
    if heads[j] and heads[j] ~= MEMBER then blocked = blocked or j end
  end
end

if not blocked then
  -- Every key: a lock or fence key of another type would be overwritten by a SET.
  local absent = {}
  for j = 1, n do
    if not reserved_for_me(j) then absent[#absent + 1] = locks[j] end
  end
  if #absent > 0 and redis.call('EXISTS', unpack(absent)) > 0 then
    return redis.error_reply('WRONGTYPE a key of the set holds another kind of value')
  end
  local fences = {}
  for j = 1, n do
    local q = KEYS[4 * j - 1]
    local more = false
    if heads[j] then
      redis.call('ZREM', q, MEMBER)
      queue_written()
      more = redis.call('ZCARD', q) > 0
    end
    local _, hadq = fence_parse(fv[j])
    local ok, f = pcall(next_fence, more, nil, tonumber(TTL), fkeys[j])
    if not ok then
      -- WRONGTYPE on a fence key: leave nothing behind.
      for i = 1, j - 1 do redis.call('DEL', locks[i]) end
      return redis.error_reply(tostring(f.err or f))
    end
    fences[j] = f
    if more then
      -- Waiters behind: the caller's process is the holder's, and the watchers are chosen
      -- again (as acquire.lua's queued attempt that takes the lock).
      redis.call('SET', locks[j], QUEUED .. TOKEN, 'PX', TTL)
      local K = L(j)
      K.watch(PID, tonumber(TTL), nil, nil, nil, true, PID)
      K.keep(tonumber(TTL))
    else
      redis.call('SET', locks[j], TAKEN .. TOKEN, 'PX', TTL)
      -- (A queue that emptied takes its processes hash with it.)
      if hadq then redis.call('DEL', KEYS[4 * j]) end
    end
  end
  return {ACQUIRED, tonumber(TTL), unpack(fences)}
end

-- Keys reserved for the set that it cannot take with the others (one of them held again, or
-- another waiter ahead of it, e.g. after it queued again): given back and served (their head
-- may be another waiter that can have them now; if it is this set, they stay free for it).
for j = 1, n do
  if reserved_for_me(j) then
    local K = L(j)
    K.fence_flags(true, nil)
    if K.release_held(QUEUED) == CONTINUE then return {CONTINUE, j} end
    cur[j] = redis.call('GET', locks[j])
  end
end

local function pttl_of(j)
  if not cur[j] then return -1 end
  return redis.call('PTTL', locks[j])
end
if MEMBER == '' then return {HELD, pttl_of(blocked), 0, blocked} end

-- Queued once in every key's queue, at the back: a set missing from one of them (dropped there)
-- leaves them all first, so that it is behind the same waiters everywhere (one order of sets
-- for all queues: no two sets wait for each other).
local added = 0
for j = 1, n do
  if L(j).add_member() then added = added + 1 end
end
if added > 0 and added < n then
  -- (A free key whose queue it headed has a new head: served, as a departing waiter does.)
  for j = 1, n do
    local q = KEYS[4 * j - 1]
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    redis.call('ZREM', q, MEMBER)
    queue_written()
    if head == MEMBER and not redis.call('GET', locks[j]) then
      if L(j).release_held(QUEUED) == CONTINUE then return {CONTINUE, j} end
    end
  end
  for j = 1, n do L(j).add_member() end
  cur = redis.call('MGET', unpack(locks))
end
local look, watcher, depth, f1 = nil, 0, 0, nil
for j = 1, n do
  local K = L(j)
  K.seen(PID, true)
  if cur[j] and state_of(cur[j]) == TAKEN then
    -- The first waiter behind a lock taken free: record the holder's process (from its token),
    -- so that the watchers are not both left in it.
    redis.call('SETRANGE', locks[j], 0, QUEUED)
    K.held_by(string.match(holder_of(cur[j]), '^(%x+)/') or '')
  end
  local _, _, pending = fence_parse(fv[j])
  local pttl = pttl_of(j)
  local d = redis.call('ZCARD', KEYS[4 * j - 1])
  -- A free key's new queue lives NO_LEASE plus the retention (below): its fence counter, the
  -- 'q' hint that keeps one-shot calls off the key, as long (review 3, finding 3).
  local px = nil
  if d == 1 and pttl < 0 then px = NO_LEASE end
  local f = K.fence_flags(true, pending, nil, px)
  if j == 1 then f1 = f end
  if K.watching(pttl, nil) == 1 then
    watcher = 1
    local at = pttl
    if at < 0 then at = NO_LEASE end
    if not look or at < look then look = at end
  end
  -- A queue's first member gives it (and the processes hash) the lease plus the retention.
  if d == 1 then
    local life = pttl
    if life < 0 then life = NO_LEASE end
    K.keep(life, true)
  end
  if d > depth then depth = d end
end
if not look then look = pttl_of(blocked) end
if look == NO_LEASE then look = -1 end
local listening = 0
if slow().listener(PID) then listening = 1 end
return {HELD, look, 1, listening, f1, watcher, now_us(), depth, blocked}
