-- The lock's functions for sets (several keys of one node waited for at once: lock.lua,
-- "Sets"), assembled right after lock.lua: a set's readiness, its grant, its reservation on a
-- Cluster, a departed set's removal, and the phases of a set's attempt (set_acquire.lua).

-- A read of another key of a set (a name the call built), as a hint: nil and true when Redis
-- refused it (in a slot being migrated, a key not on this node).
local function other(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then return nil, true end
  return r
end

-- Whether this call declared lock `l` in its KEYS (lock, fence, queue, processes per key).
local function declared(l)
  if not declared_locks then
    declared_locks = {}
    for j = 1, #KEYS, 4 do declared_locks[KEYS[j]] = true end
  end
  return declared_locks[l] == true
end

-- Whether set member `m` (the head of this key's queue, live) can be granted now: each of
-- its other keys is free and has `m` at the head of its queue. (Only the head is read there:
-- a departed waiter ahead of it is found by a call on that key.) Second: `m` has departed
-- all the same: it is missing from another of its keys' queues, which is not reserved for
-- it. On a Cluster a walk that drops a departed set writes only the queues its call
-- declared, and a frozen process (it listens, it does not act) is marked lapsed only in
-- the hash of the key whose grant it let lapse; on its other keys it would head a queue,
-- never ready, for as long as it stays frozen (review 3, finding 2). It must queue again
-- at the back of every queue anyway (set_acquire.lua: one order of sets).
function Key.set_ready(K, m)
  for _, l in ipairs(m.set) do
    if l ~= K.key then
      local cur, failed = other('GET', l)
      if failed then return false end
      local lq = l .. ':q'
      local head = other('ZRANGE', lq, 0, 0)
      if not head then return false end
      if head[1] ~= m.member then
        return false, cur ~= RESERVED .. m.token and other('ZSCORE', lq, m.member) == false
      end
      if cur then return false end
    end
  end
  return true
end

-- Whether set `m` can be granted by this call: on a single server always; on a Cluster only
-- when the call declared every one of its keys (see "Sets").
function Key.grantable_here(K, m)
  if not ON_CLUSTER then return true end
  for _, l in ipairs(m.set) do
    if not declared(l) then return false end
  end
  return true
end

-- Reserves this key for set `m` (ready, as far as this call can read: Cluster only): state
-- 'r' for the claim window, the fence naming its process as pending (a reservation it does
-- not take lapses as a short grant does), the watchers told when it ends, and the set told to
-- look now ('w3 0': its own call takes every key). It stays at the head of the queue.
function Key.reserve(K, m)
  redis.call('SET', K.key, RESERVED .. m.token, 'PX', CLAIM)
  K:fence_flags(true, m.pid, nil, CLAIM)
  K:watch(m.pid, CLAIM, nil, nil, nil, true, m.pid)
  K:keep(CLAIM)
  publish(m.p.how, m.chan, 'w3 0 ' .. string.format('%.0f', now_us()) .. ' ' .. m.token)
  return CLAIM
end

-- Grants every key of set member `m` (ready, see `set_ready`; this key's queue has lost it
-- already, `behind` says whether waiters are left in it) in one step, each as `hand` does,
-- and tells its process in one message ('m4', on its channel). Returns the PX.
function Key.grant_set(K, m, behind)
  local full = m.p.is == 'fresh'
  local px = m.ttl
  if not full then px = short(px) end
  local state = full and HANDED or GRANTED
  local fences = {}
  for j, l in ipairs(m.set) do
    local more
    local L = K
    if l == K.key then
      more = behind
      if more == nil then more = redis.call('ZCARD', K.q) > 0 end
    else
      local lq = l .. ':q'
      redis.call('ZREM', lq, m.member)
      queue_written()
      more = redis.call('ZCARD', lq) > 0
      L = lock_key(l)
    end
    fences[j] = string.format('%.0f', L:hand(state, m.token, m.pid, px, more, nil, l ~= K.key))
  end
  publish(m.p.how, m.chan, 'm4 ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' ..
    table.concat(fences, ',') .. ' ' .. m.member)
  return px
end

-- On a Cluster, where a call writes no key it did not declare: when departed set `m` heads
-- the queue of `l` (another of its keys, free, as far as this call can read), `l`'s watchers
-- are told to look now ('w3 0'; sharded pub/sub, as every Cluster's): their look drops it
-- there. Nothing is written.
local function look_now(l, m)
  local head = other('ZRANGE', l .. ':q', 0, 0)
  if not head or head[1] ~= m.member then return end
  local cur, failed = other('GET', l)
  if cur or failed then return end
  local fields = other('HMGET', l .. ':p', '!w1', '!w2')
  for _, v in ipairs(fields or {}) do
    local w = v and string.match(v, '^%d+ (.*)$')
    local p = w and parse_member(w)
    if p then
      local chan = p.chan or (l .. ':w:' .. p.pid)
      redis.pcall('SPUBLISH', chan, 'w3 0 ' .. string.format('%.0f', now_us()) .. ' ' .. p.token)
    end
  end
end

-- A departed set `m`, dropped from this key's queue by a walk, leaves its other keys'
-- queues too; where it was the head of a free key's queue, that key's watchers are told to
-- look now (they serve it: this call does not, so its work stays bounded); elsewhere the
-- watchers are kept fit (it may have been one of them).
function Key.gone_set(K, m)
  for _, l in ipairs(m.set) do
    if l ~= K.key and ON_CLUSTER and not declared(l) then
      look_now(l, m)
    elseif l ~= K.key then
      local lq = l .. ':q'
      local head = (other('ZRANGE', lq, 0, 0) or {})[1]
      if redis.call('ZREM', lq, m.member) == 1 then
        queue_written()
        local cur = redis.call('GET', l)
        local O = lock_key(l)
        if cur then
          O:watch(O:holder_pid(), math.max(redis.call('PTTL', l), 0))
        elseif head == m.member then
          O:watch('', 0)
        else
          O:watch('', NO_LEASE)
        end
      end
    end
  end
end

-- The lock is free while a set at the head of its queue waits for its other keys: the fence
-- keeps saying waiters may be queued for as long as the queue lives (NO_LEASE plus the
-- retention, the queue's `keep`: the counter kept only the last hold's life, and expired
-- first, an attempt would take the key past the queue: review 3, finding 3), there is no
-- holder, and the watchers have no lease to look at (NO_LEASE: the set's grant, or their
-- look, which leaves it blocked again, tells them the next one).
function Key.leave_blocked(K)
  redis.call('DEL', K.key)
  K:fence_flags(true, nil, nil, NO_LEASE)
  K:watch('', NO_LEASE, nil, nil, nil, true, '')
  K:keep(NO_LEASE)
end

-- A refresh of a held lock with waiters: departed waiters at the head of the queue are
-- dropped, as a walk drops them (a set from every one of its queues: `gone_set`; a lapsed
-- process that still listens told), 8 at most, so that a departed set heading one of its
-- free keys' queues holds the waiters there back a refresh interval at most. The first live
-- head ends it. (A head at a time: most refreshes find a live one.)
function Key.drop_departed_set(K)
  local saved = budget
  for _ = 1, 8 do
    budget = 1
    local stopped, _, out = K:walk('', nil, function() return 'stop' end)
    if stopped or out == 0 then break end
  end
  budget = saved
end

-- A set's attempt (set_acquire.lua), in phases over its call's state `S`: its `n` keys'
-- `locks` and fence keys `fkeys`, `cur` the locks' values as last read, `fv` the fences'.
local function set_call()
  local n = #KEYS / 4
  local S = {n = n, locks = {}, fkeys = {}}
  for j = 1, n do S.locks[j], S.fkeys[j] = KEYS[4 * j - 3], KEYS[4 * j - 2] end
  S.cur = redis.call('MGET', unpack(S.locks))
  return S
end

-- Holds of this token: the set's grant (found by its own call: its message was lost, or
-- crossed this call), or the call sent again. (A key reserved for the set, on a Cluster, is
-- not held: it is free for the set alone, `reserved_for_me`.)
local function reserved_for_me(S, j)
  local v = S.cur[j]
  return v ~= nil and v ~= false and state_of(v) == RESERVED and holder_of(v) == TOKEN
end
local function held_by_me(S, j)
  return S.cur[j] and holder_of(S.cur[j]) == TOKEN and not reserved_for_me(S, j)
end

-- The set holds every key: its reply (a short grant confirmed on every key; a full grant
-- claimed). It holds some only (one deleted by hand, say): they are given back, as a
-- departing waiter would, and the set tried again as a whole (nil; {CONTINUE, i} when a key's
-- release must go on).
local function set_held(S)
  local n, mine = S.n, 0
  for j = 1, n do
    if held_by_me(S, j) then mine = mine + 1 end
  end
  if mine == n then
    local fences, confirm, pttl = {}, false, nil
    for j = 1, n do
      if state_of(S.cur[j]) == GRANTED then confirm = true end
    end
    if confirm then
      -- A short grant: every key confirmed (the full TTL, state 'q', the watchers told).
      for j = 1, n do fences[j] = lock_key(S.locks[j]):confirm_grant() end
      return {GRANT_CONFIRMED, tonumber(TTL), unpack(fences)}
    end
    for j = 1, n do
      local left
      left, fences[j] = lock_key(S.locks[j]):held_again(state_of(S.cur[j]))
      if not pttl or left < pttl then pttl = left end
    end
    return {HELD_BY_CALLER, pttl, unpack(fences)}
  end
  if mine > 0 then
    for j = 1, n do
      if held_by_me(S, j) then
        if lock_key(S.locks[j]):release_held(state_of(S.cur[j])) == CONTINUE then return {CONTINUE, j} end
      end
    end
    S.cur = redis.call('MGET', unpack(S.locks))
  end
  return nil
end

-- Each free key whose queue may have waiters is served first (they come first, the set
-- among them if it is queued). Returns {CONTINUE, i} when key i's walk must go on, else nil.
local function set_serve_free(S)
  S.fv = redis.call('MGET', unpack(S.fkeys))
  local served = false
  for j = 1, S.n do
    local _, queued, pending = fence_parse(S.fv[j])
    if not S.cur[j] and queued and not reserved_for_me(S, j) then
      served = true
      local K = lock_key(S.locks[j])
      if pending and pending ~= PID then K:lapse(pending) end
      K:seen(PID)
      local got = K:serve(MEMBER)
      if got == 'more' then
        redis.call('SET', S.locks[j], QUEUED .. TOKEN, 'PX', CLAIM)
        K:keep(CLAIM)
        K:fence_flags(true, nil, nil, CLAIM)
        return {CONTINUE, j}
      end
      K:ahead(false)
    end
  end
  if served then S.cur = redis.call('MGET', unpack(S.locks)) end
  return nil
end

-- Where the set can take a key: free, and nobody live ahead of it in its queue (the queue
-- is empty, or the set heads it). Returns the first key it cannot take (nil: none), and each
-- free key's queue's head.
local function set_blocked(S)
  local blocked, heads = nil, {}
  for j = 1, S.n do
    if S.cur[j] and not reserved_for_me(S, j) then
      blocked = blocked or j
    else
      heads[j] = redis.call('ZRANGE', KEYS[4 * j - 1], 0, 0)[1]
      if heads[j] and heads[j] ~= MEMBER then blocked = blocked or j end
    end
  end
  return blocked, heads
end

-- Takes every key (none blocked; `heads`: from `set_blocked`). Returns the reply.
local function set_take(S, heads)
  local n, locks = S.n, S.locks
  -- Every key: a lock or fence key of another type would be overwritten by a SET.
  local absent = {}
  for j = 1, n do
    if not reserved_for_me(S, j) then absent[#absent + 1] = locks[j] end
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
    local _, hadq = fence_parse(S.fv[j])
    local ok, f = pcall(next_fence, more, nil, tonumber(TTL), S.fkeys[j])
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
      local K = lock_key(locks[j])
      K:watch(PID, tonumber(TTL), nil, nil, nil, true, PID)
      K:keep(tonumber(TTL))
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
-- Returns {CONTINUE, i} when key i's walk must go on, else nil.
local function set_give_reserved(S)
  for j = 1, S.n do
    if reserved_for_me(S, j) then
      local K = lock_key(S.locks[j])
      K:fence_flags(true, nil)
      if K:release_held(QUEUED) == CONTINUE then return {CONTINUE, j} end
      S.cur[j] = redis.call('GET', S.locks[j])
    end
  end
  return nil
end

-- Ms until key `j`'s lease ends (-1: free).
local function set_pttl(S, j)
  if not S.cur[j] then return -1 end
  return redis.call('PTTL', S.locks[j])
end

-- Queued once in every key's queue, at the back: a set missing from one of them (dropped
-- there) leaves them all first, so that it is behind the same waiters everywhere (one order of
-- sets for all queues: no two sets wait for each other). Returns {CONTINUE, i} when key i's
-- walk must go on, else nil.
local function set_enqueue(S)
  local n, added = S.n, 0
  for j = 1, n do
    if lock_key(S.locks[j]):add_member() then added = added + 1 end
  end
  if added == 0 or added == n then return nil end
  -- (A free key whose queue it headed has a new head: served, as a departing waiter does.)
  for j = 1, n do
    local q = KEYS[4 * j - 1]
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    redis.call('ZREM', q, MEMBER)
    queue_written()
    if head == MEMBER and not redis.call('GET', S.locks[j]) then
      if lock_key(S.locks[j]):release_held(QUEUED) == CONTINUE then return {CONTINUE, j} end
    end
  end
  for j = 1, n do lock_key(S.locks[j]):add_member() end
  S.cur = redis.call('MGET', unpack(S.locks))
  return nil
end

-- The queued set's reply (set_acquire.lua's), each key's queue and watchers kept as
-- acquire.lua's queueing attempt keeps them.
local function set_queued_reply(S, blocked)
  local look, watcher, depth, f1 = nil, 0, 0, nil
  for j = 1, S.n do
    local K = lock_key(S.locks[j])
    K:seen(PID, true)
    local cur = S.cur[j]
    if cur and state_of(cur) == TAKEN then
      -- The first waiter behind a lock taken free: record the holder's process (from its
      -- token), so that the watchers are not both left in it.
      redis.call('SETRANGE', S.locks[j], 0, QUEUED)
      K:held_by(string.match(holder_of(cur), '^(%x+)/') or '')
    end
    local _, _, pending = fence_parse(S.fv[j])
    local pttl = set_pttl(S, j)
    local d = redis.call('ZCARD', KEYS[4 * j - 1])
    -- A free key's new queue lives NO_LEASE plus the retention (below): its fence counter, the
    -- 'q' hint that keeps one-shot calls off the key, as long (review 3, finding 3).
    local px = nil
    if d == 1 and pttl < 0 then px = NO_LEASE end
    local f = K:fence_flags(true, pending, nil, px)
    if j == 1 then f1 = f end
    if K:watching(pttl, nil) == 1 then
      watcher = 1
      local at = pttl
      if at < 0 then at = NO_LEASE end
      if not look or at < look then look = at end
    end
    -- A queue's first member gives it (and the processes hash) the lease plus the retention.
    if d == 1 then
      local life = pttl
      if life < 0 then life = NO_LEASE end
      K:keep(life, true)
    end
    if d > depth then depth = d end
  end
  if not look then look = set_pttl(S, blocked) end
  if look == NO_LEASE then look = -1 end
  local listening = 0
  if lock_key():listener(PID) then listening = 1 end
  return {HELD, look, 1, listening, f1, watcher, now_us(), depth, blocked}
end
