-- A lock's value grammar, on the queue layer (`queue.lua`, before this): prepended, after it,
-- to every lock script. (Keep the fast paths' top level small: every call runs it.)
--
-- Lock value (KEYS[1]): one state letter, then the holder's token:
--   'p' taken while nobody was queued (release may just DEL it),
--   'q' held, waiters may be queued (release serves the queue),
--   'h' handed by a full grant (PX = the waiter's TTL), not claimed by a call of its waiter
--       yet (its waiter holds it when the message arrives, and may never call; a grant message
--       that reaches a process whose waiter has gone gives back only an unclaimed grant),
--   'g' handed by a short grant (PX = the claim window, or half the TTL within it) that its new
--       holder has not confirmed yet: its process had not been seen lately, so its waiter
--       confirms (extends) it before using it,
--   'r' reserved for a set (PX = the claim window; on a Cluster only, see "Sets" below): not
--       held by anyone; the set takes it with its other keys by its own call, or the
--       reservation lapses as a short grant does (the fence names the set's process).
-- Fence value (KEYS[2]): "<fence>", "<fence> q" (waiters may be queued) or "<fence> q <pid>"
--   (the last grant was a short grant to process <pid> and is not confirmed yet). It lives the
--   lease set by the call that wrote it plus the retention; a vanished one is started again
--   from Redis' clock, never from 0.
-- The processes hash's '!h' = the holder's pid: written by a grant, by a queued attempt that
--   takes the lock, and when the first waiter queues behind a lock taken free (from the
--   holder's token, which a queued locker makes "<pid>/<uuid>"; unknown for a polling
--   locker's or a fixed token).
-- Sets (several keys of one node waited for at once, queue.lua's set member): a set waits in
--   each of its keys' queues and is granted all of its keys in one call, only when it heads
--   each of those queues and each key is free (`set_ready`); so a release (or any call that
--   serves a queue) whose oldest live waiter is a set that cannot be granted yet leaves the
--   lock free, with the set at the head of its queue ("blocked": later waiters wait behind
--   it), and the call that frees its last key grants it. A set's other keys are in the same
--   Cluster slot (or on a single server), so a call on one key reads and writes them (names
--   it builds, as it builds the channels). On a Cluster (ARGV[10] 'cluster') a slot can be
--   migrating, and a key not yet moved reads as absent on the importing node: there a call
--   only reads the keys it did not declare (hints), and writes none of them. A set whose keys
--   the call did not all declare is then not granted: the served key is reserved for it ('r')
--   and it is told to look now; its own call (set_acquire.lua, which declares every key, so
--   Redis refuses it with TRYAGAIN while the slot is split) takes every key. A set found
--   departed leaves every queue it is in (`gone_set`; on a Cluster only the declared ones, and
--   the other free keys it headed get a look).

local TAKEN, QUEUED, HANDED, GRANTED, RESERVED = 'p', 'q', 'h', 'g', 'r'

-- The keys are in a Redis Cluster (whose slots can migrate: see "Sets" above): ARGV[10]
-- 'cluster' (set by `begin_lock`).
local ON_CLUSTER

local function state_of(v) return string.sub(v, 1, 1) end
local function holder_of(v) return string.sub(v, 2) end

-- Fence number, queued flag, pending short-grant pid of a fence value.
local function fence_parse(v)
  if not v then return 0, false, nil end
  local f, q, pid = string.match(v, '^(%d+) ?(q?) ?(%S*)$')
  if not f then return 0, true, nil end
  if pid == '' then pid = nil end
  return tonumber(f), q == 'q', pid
end

local function fence_text(f, queued, pid)
  local s = string.format('%.0f', f)
  if queued then
    s = s .. ' q'
    if pid then s = s .. ' ' .. pid end
  end
  return s
end

-- Takes the next fence: max(previous + 1, Redis TIME in microseconds), written with the given
-- hints, for the lease `px` just set plus the retention (the counter, and its hints, outlive
-- every lease: a lock held longer than the retention keeps its fence and its 'q'), in `fkey`
-- (KEYS[2] if nil). Returns the fence and the previous value.
local function next_fence(queued, pid, px, fkey)
  fkey = fkey or KEYS[2]
  local f = now_us()
  local life = tonumber(RETAIN) + px
  local old = redis.call('SET', fkey, fence_text(f, queued, pid), 'PX', life, 'GET')
  local prev = fence_parse(old)
  if prev >= f then
    f = prev + 1
    redis.call('SET', fkey, fence_text(f, queued, pid), 'PX', life)
  end
  return f, old
end

-- A short grant's lease: the claim window, or half the TTL within it.
local function short(ttl)
  if ttl > CLAIM then return CLAIM end
  return math.max(1, math.floor(ttl / 2))
end

-- The lock's functions are the key's (`Key`, methods, as the queue layer's), over a lock's
-- state: `key` the lock, `fkey` its fence counter, `q` its queue, `pkey` its processes hash.
-- `lock_key()`: the call's own key's (KEYS[1] to KEYS[4]); `lock_key(lock)`: another key of a
-- set (names built from the lock's); one per key per call. The sets' functions are in
-- lock_sets.lua.
local function lock_key(l)
  if not l or l == KEYS[1] then
    local K = queue()
    K.fkey = KEYS[2]
    return K
  end
  return key_states and key_states[l]
    or keep_state(l, {key = l, fkey = l .. ':fence', q = l .. ':q', pkey = l .. ':p', known = {}})
end

-- The lock names this call declared (see `declared` in lock_sets.lua), once it asked.
local declared_locks

-- A lock call's start (see `begin_queue`). A lock's processes hash keeps '!e', the queue's
-- expiry hint (see `keep` in queue.lua).
local function begin_lock()
  begin_queue()
  EXPIRY_HINT, ON_CLUSTER, SETS = true, ARGV[10] == 'cluster', true
  declared_locks = nil
end

-- Rewrites the fence hints, keeping the number, and the TTL unless `px` (a lease this call
-- set) says it must last that lease plus the retention. A missing counter is started at
-- Redis TIME (never 0: a fence is always above every earlier one). Returns the fence.
function Key.fence_flags(K, queued, pid, old, px)
  if old == nil then old = redis.call('GET', K.fkey) end
  local f, q0, h = fence_parse(old)
  local life = px and (tonumber(RETAIN) + px)
  if old and q0 == queued and h == pid then
    if life then redis.call('PEXPIRE', K.fkey, life) end
    return f
  end
  if old then
    if life then
      redis.call('SET', K.fkey, fence_text(f, queued, pid), 'PX', life)
    else
      redis.call('SET', K.fkey, fence_text(f, queued, pid), 'KEEPTTL')
    end
    return f
  end
  f = now_us()
  redis.call('SET', K.fkey, fence_text(f, queued, pid), 'PX', life or RETAIN)
  return f
end

-- This key is handed to `token` of process `pid` in `state` ('h' full, 'g' short) for `px`
-- ms, with waiters left in its queue or not (`more`): the next fence (naming `pid` as
-- pending for a short grant with waiters), the lock, the watchers (who skip `pid`, now the
-- holder's), the queue's life. `tell`: a one-key grant, its message published first, `true`
-- when nobody asked whether `pid` listens (the message asks: `grant`; nobody heard it: nil is
-- returned, and the fence counter is as it was); nil: a set's one message goes after all its
-- keys, by its caller. `was_free`: the key was free (a set's other key), so a short grant its
-- fence names as pending lapsed unconfirmed: its process is frozen or gone, as an attempt on
-- the free lock would find. Returns the fence.
function Key.hand(K, state, token, pid, px, more, tell, was_free)
  local pending = nil
  if more and state == GRANTED then pending = pid end
  local f, old = next_fence(more, pending, px, K.fkey)
  if was_free then
    local _, _, lapsed = fence_parse(old)
    if lapsed and lapsed ~= pid then K:lapse(lapsed) end
  end
  if tell and not K:grant(tell, pid, f, px, token) then
    -- (Unheard: the counter is put back as it was, a vanished one gone again. Nobody
    -- received `f`, so the next grant may take it again; an acquire that took the lock free
    -- before it served the queue returns the fence it took, still the hold's.)
    if old then redis.call('SET', K.fkey, old, 'KEEPTTL') else redis.call('DEL', K.fkey) end
    return nil
  end
  redis.call('SET', K.key, state .. token, 'PX', px)
  -- ('!h' = pid, with the watchers: a one-key grant keeps them while they fit.)
  if tell then
    K:watch_granted(pid, px)
  else
    K:watch(pid, px, nil, nil, nil, true, pid)
  end
  -- (The hash may be new here: it gets an expiry either way.)
  if more then K:keep(px) else K:retain() end
  return f
end

-- Hands the lock to the oldest waiter whose process listens, skipping (and dropping) the
-- others (`walk`). A fresh process gets the waiter's full TTL (state 'h'): its waiter holds
-- the lock when the message arrives, with no further step. A stale one gets a short grant
-- (state 'g'): its waiter confirms before it uses the lock, and if it does not, the grant
-- lapses. The waiters behind are told to watch the new holder's lease (see `watch`), and the
-- queue lives that lease and the retention. A set is granted all of its keys when it is
-- ready (`set_ready`), else it stays at the head and the lock stays free ('blocked'); on a
-- Cluster a ready set whose keys this call did not all declare has this key reserved instead
-- (`reserve`, 'granted' with the claim window); the caller's own set member (a set's
-- attempt) stays too ('self'). Returns 'self' (the oldest live waiter is `self`: a one-key
-- waiter's member is removed, nothing written), 'granted' and the PX, 'blocked', 'empty', or
-- 'more' (SCAN departed waiters dropped, more to look at: call again).
-- (A grant nobody heard, its process gone, and the walk goes on: the call's scan bound is
-- shared by its walks, `budget`, so it ends at SCAN members, then 'more'.)
function Key.serve(K, self)
  local saved = budget
  budget = budget or SCAN
  -- (The watcher fields are read with the first heads: `ahead`.)
  K:ahead(true)
  local r, px
  repeat r, px = K:serve_once(self) until r ~= 'unheard'
  budget = saved
  return r, px
end

-- One walk of `serve`: 'unheard' when the head it granted did not hear its grant.
function Key.serve_once(K, self)
  local chosen, blocked, reserved = nil, false, false
  local stopped, full_scan, _, behind = K:walk(self, nil, function(m)
    if m.set then
      if m.own then
        chosen = m
        return 'stop'
      end
      local ready, departed = K:set_ready(m)
      if departed then return 'gone' end
      if not ready then
        blocked = true
        return 'stop'
      end
      if not K:grantable_here(m) then
        chosen, reserved = m, true
        return 'stop'
      end
    end
    chosen = m
    return 'last'
  end)
  if not stopped then
    K:ahead(false)
    if full_scan then return 'more' end
    return 'empty'
  end
  if blocked then return 'blocked' end
  if chosen.own then return 'self' end
  if reserved then return 'granted', K:reserve(chosen) end
  if chosen.set then return 'granted', K:grant_set(chosen, behind) end
  local full = chosen.p.is == 'fresh'
  local px = chosen.ttl
  if not full then px = short(px) end
  -- (Every member before the chosen one left: the queue is what is behind it.)
  local more = behind
  if more == nil then more = redis.call('ZCARD', K.q) > 0 end
  if not K:hand(full and HANDED or GRANTED, chosen.token, chosen.pid, px, more, chosen.p.how) then
    return 'unheard'
  end
  return 'granted', px
end

-- Releases a lock held by the caller in `state`: serves the queue or deletes the key.
-- Returns DONE (deleted, or left free for a set that waits: 'blocked'), HANDED_OVER, or
-- CONTINUE (departed waiters dropped, more to look at: the lock stays the caller's for the
-- claim window, and it calls release again).
function Key.release_held(K, state)
  if state ~= TAKEN then
    local r = K:serve('')
    if r == 'granted' then return HANDED_OVER end
    if r == 'blocked' then
      K:leave_blocked()
      return DONE
    end
    if r == 'more' then
      redis.call('SET', K.key, QUEUED .. TOKEN, 'PX', CLAIM)
      K:flush({}, 0)
      K:keep(CLAIM)
      return CONTINUE
    end
    -- (A due record, see `seen`, goes with the hash.)
    K:fence_flags(false, nil)
    redis.call('DEL', K.pkey)
  end
  redis.call('DEL', K.key)
  return DONE
end

-- Puts MEMBER in the queue (once) and makes sure the fence says waiters may be queued.
-- Returns the 'queued' reply (see `queued_reply`).
function Key.enqueue(K, pttl)
  -- (The record is written with the watcher's field: `queued_reply`.)
  K:seen(PID, true)
  K:add_member()
  local old = redis.call('GET', K.fkey)
  local _, _, pending = fence_parse(old)
  local f = K:fence_flags(true, pending, old or false)
  return K:queued_reply(pttl, f, nil)
end

-- Confirms a short grant: the full TTL, state 'q', the fence names no pending grant, and
-- the watchers (who skip the caller's process) are told when the lease now ends. Returns
-- the fence (of the hold: fences change only when a lock changes hands).
function Key.confirm_grant(K)
  redis.call('SET', K.key, QUEUED .. TOKEN, 'PX', TTL)
  local old = redis.call('GET', K.fkey)
  local _, queued = fence_parse(old)
  -- (The record is written with the watchers, and `keep` comes after them: it uses their
  -- read of '!e'.)
  K:seen(PID, true)
  K:watch(PID, tonumber(TTL), true, nil, nil, queued)
  if queued then K:keep(tonumber(TTL)) end
  return K:fence_flags(queued, nil, old or false, tonumber(TTL))
end

-- The caller's token holds the lock (in `state`), found by its own call again: a full grant
-- found so (its message lost, or crossing the call) is claimed now, so that a late message
-- cannot have it given back. Returns the lease left and the fence (a counter gone only if
-- something deleted it, since it outlives every lease: started again from Redis' clock,
-- never 0).
function Key.held_again(K, state)
  if state == HANDED then redis.call('SETRANGE', K.key, 0, QUEUED) end
  local pttl = redis.call('PTTL', K.key)
  local fv = redis.call('GET', K.fkey)
  if not fv then return pttl, K:fence_flags(state ~= TAKEN, nil, false, math.max(pttl, 0)) end
  return pttl, (fence_parse(fv))
end

-- Process `pid` holds the lock now ('' = unknown). (The hash's expiry is the caller's: a
-- queue is behind the lock, which `keep` gives it.)
function Key.held_by(K, pid)
  if pid ~= '' then
    redis.call('HSET', K.pkey, '!h', pid)
  else
    redis.call('HDEL', K.pkey, '!h')
  end
end

-- The holder's process as recorded ('' = unknown).
function Key.holder_pid(K)
  return redis.call('HGET', K.pkey, '!h') or ''
end
