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

-- The lock names this call declared (see `declared`), once it asked.
local declared_locks

-- The lock's slow paths on one key: the call's own (`slow()`: KEYS[1], its fence KEYS[2],
-- queue KEYS[3], processes KEYS[4]), or another key of a set (`slow(lock)`: names built from
-- the lock's), on that key's queue layer (whose functions they also give), built only when a
-- call needs them, once per key per call in a script, and kept across calls by the library
-- (`kept_group` in queue.lua: a later call starts them afresh with `reset_call`); what sets
-- need of them (and the rarer paths) only when a call meets them (`rares`: closures cost every
-- call that builds them).
local slow_cache

-- A lock call's start (see `begin_queue`). A lock's processes hash keeps '!e', the queue's
-- expiry hint (see `keep` in queue.lua).
local function begin_lock()
  begin_queue()
  EXPIRY_HINT, ON_CLUSTER = true, ARGV[10] == 'cluster'
  declared_locks, slow_cache = nil, nil
end

-- (`slow` below; declared here, since the rarer paths a group builds ask it for other keys'.)
local slow

local function build_slow(l)
  local lock, fkey, q, pkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  if l then lock, fkey, q, pkey = l, l .. ':fence', l .. ':q', l .. ':p' end
  local Q = queue(lock, q, pkey)
  local fns, rare_fns

  local function short(ttl)
    if ttl > CLAIM then return CLAIM end
    return math.max(1, math.floor(ttl / 2))
  end

  -- Rewrites the fence hints, keeping the number, and the TTL unless `px` (a lease this call
  -- set) says it must last that lease plus the retention. A missing counter is started at
  -- Redis TIME (never 0: a fence is always above every earlier one). Returns the fence.
  local function fence_flags(queued, pid, old, px)
    if old == nil then old = redis.call('GET', fkey) end
    local f, q0, h = fence_parse(old)
    local life = px and (tonumber(RETAIN) + px)
    if old and q0 == queued and h == pid then
      if life then redis.call('PEXPIRE', fkey, life) end
      return f
    end
    if old then
      if life then
        redis.call('SET', fkey, fence_text(f, queued, pid), 'PX', life)
      else
        redis.call('SET', fkey, fence_text(f, queued, pid), 'KEEPTTL')
      end
      return f
    end
    f = now_us()
    redis.call('SET', fkey, fence_text(f, queued, pid), 'PX', life or RETAIN)
    return f
  end

  -- This key is handed to `token` of process `pid` in `state` ('h' full, 'g' short) for `px`
  -- ms, with waiters left in its queue or not (`more`): the next fence (naming `pid` as
  -- pending for a short grant with waiters), the lock, the watchers (who skip `pid`, now the
  -- holder's), the queue's life. `tell`: a one-key grant, its message published first, `true`
  -- when nobody asked whether `pid` listens (the message asks: `Q.grant`; nobody heard it:
  -- nil is returned, and the fence counter is as it was); nil: a set's
  -- one message goes after all its keys, by its caller. `was_free`: the key was free
  -- (a set's other key), so a short grant its fence names as pending lapsed unconfirmed: its
  -- process is frozen or gone, as an attempt on the free lock would find. Returns the fence.
  local function hand(state, token, pid, px, more, tell, was_free)
    local pending = nil
    if more and state == GRANTED then pending = pid end
    local f, old = next_fence(more, pending, px, fkey)
    if was_free then
      local _, _, lapsed = fence_parse(old)
      if lapsed and lapsed ~= pid then Q.lapse(lapsed) end
    end
    if tell and not Q.grant(tell, pid, f, px, token) then
      -- (Unheard: the counter is put back as it was, a vanished one gone again. Nobody
      -- received `f`, so the next grant may take it again; an acquire that took the lock free
      -- before it served the queue returns the fence it took, still the hold's.)
      if old then redis.call('SET', fkey, old, 'KEEPTTL') else redis.call('DEL', fkey) end
      return nil
    end
    redis.call('SET', lock, state .. token, 'PX', px)
    -- ('!h' = pid, with the watchers: a one-key grant keeps them while they fit.)
    if tell then
      Q.watch_granted(pid, px)
    else
      Q.watch(pid, px, nil, nil, nil, true, pid)
    end
    -- (The hash may be new here: it gets an expiry either way.)
    if more then Q.keep(px) else Q.retain() end
    return f
  end

  -- The rarer paths: sets (several keys waited for at once), a confirmation, a key left free
  -- for a set, a refresh's look at its queue's head. (The walk drops a departed set from its
  -- other queues through `rares().gone`: `Q.sets`.)
  local function rares()
    if rare_fns then return rare_fns end

    -- A read of another key of a set (a name the call built), as a hint: nil and true when
    -- Redis refused it (in a slot being migrated, a key not on this node).
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
    local function set_ready(m)
      for _, l in ipairs(m.set) do
        if l ~= lock then
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
    local function grantable_here(m)
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
    local function reserve(m)
      redis.call('SET', lock, RESERVED .. m.token, 'PX', CLAIM)
      fence_flags(true, m.pid, nil, CLAIM)
      Q.watch(m.pid, CLAIM, nil, nil, nil, true, m.pid)
      Q.keep(CLAIM)
      Q.publish(m.p.how, m.chan, 'w3 0 ' .. string.format('%.0f', now_us()) .. ' ' .. m.token)
      return CLAIM
    end

    -- Grants every key of set member `m` (ready, see `set_ready`; this key's queue has lost it
    -- already, `behind` says whether waiters are left in it) in one step, each as `hand` does,
    -- and tells its process in one message ('m4', on its channel). Returns the PX.
    local function grant_set(m, behind)
      local full = m.p.is == 'fresh'
      local px = m.ttl
      if not full then px = short(px) end
      local state = full and HANDED or GRANTED
      local fences = {}
      for j, l in ipairs(m.set) do
        local more
        local L = fns
        if l == lock then
          more = behind
          if more == nil then more = redis.call('ZCARD', q) > 0 end
        else
          local lq = l .. ':q'
          redis.call('ZREM', lq, m.member)
          queue_written()
          more = redis.call('ZCARD', lq) > 0
          L = slow(l)
        end
        fences[j] = string.format('%.0f', L.hand(state, m.token, m.pid, px, more, nil, l ~= lock))
      end
      Q.publish(m.p.how, m.chan, 'm4 ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' ..
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
        local p = w and Q.parse(w)
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
    local function gone_set(m)
      for _, l in ipairs(m.set) do
        if l ~= lock and ON_CLUSTER and not declared(l) then
          look_now(l, m)
        elseif l ~= lock then
          local lq = l .. ':q'
          local head = (other('ZRANGE', lq, 0, 0) or {})[1]
          if redis.call('ZREM', lq, m.member) == 1 then
            queue_written()
            local cur = redis.call('GET', l)
            local O = slow(l)
            if cur then
              O.watch(O.holder_pid(), math.max(redis.call('PTTL', l), 0))
            elseif head == m.member then
              O.watch('', 0)
            else
              O.watch('', NO_LEASE)
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
    local function leave_blocked()
      redis.call('DEL', lock)
      fence_flags(true, nil, nil, NO_LEASE)
      Q.watch('', NO_LEASE, nil, nil, nil, true, '')
      Q.keep(NO_LEASE)
    end
    -- Confirms a short grant: the full TTL, state 'q', the fence names no pending grant, and
    -- the watchers (who skip the caller's process) are told when the lease now ends. Returns
    -- the fence (of the hold: fences change only when a lock changes hands).
    local function confirm_grant()
      redis.call('SET', lock, QUEUED .. TOKEN, 'PX', TTL)
      local old = redis.call('GET', fkey)
      local _, queued = fence_parse(old)
      -- (The record is written with the watchers, and `keep` comes after them: it uses their
      -- read of '!e'.)
      Q.seen(PID, true)
      Q.watch(PID, tonumber(TTL), true, nil, nil, queued)
      if queued then Q.keep(tonumber(TTL)) end
      return fence_flags(queued, nil, old or false, tonumber(TTL))
    end
    -- A refresh of a held lock with waiters: departed waiters at the head of the queue are
    -- dropped, as a walk drops them (a set from every one of its queues: `gone_set`; a lapsed
    -- process that still listens told), 8 at most, so that a departed set heading one of its
    -- free keys' queues holds the waiters there back a refresh interval at most. The first live
    -- head ends it. (A head at a time: most refreshes find a live one.)
    local function drop_departed_set()
      local saved = budget
      for _ = 1, 8 do
        budget = 1
        local stopped, _, out = Q.walk('', nil, function() return 'stop' end)
        if stopped or out == 0 then break end
      end
      budget = saved
    end
    rare_fns = {ready = set_ready, here = grantable_here, reserve = reserve, grant = grant_set,
      gone = gone_set, leave_blocked = leave_blocked, confirm_grant = confirm_grant,
      drop_departed_set = drop_departed_set}
    return rare_fns
  end
  Q.sets = rares

  -- Hands the lock to the oldest waiter whose process listens, skipping (and dropping) the
  -- others (`walk`). A fresh process gets the waiter's full TTL (state 'h'): its waiter holds
  -- the lock when the message arrives, with no further step. A stale one gets a short grant
  -- (state 'g'): its waiter confirms before it uses the lock, and if it does not, the grant
  -- lapses. The waiters behind are told to watch the new holder's lease (see `watch`), and the
  -- queue lives that lease and the retention. A set is granted all of its keys when it is
  -- ready (`set_ready`), else it stays at the head and the lock stays free ('blocked'); on a
  -- Cluster a ready set whose keys this call did not all declare has this key reserved instead
  -- (`reserve`, 'granted' with the claim window); the caller's own set member (a set's
  -- attempt) stays too ('self'). Returns 'self' (the oldest
  -- live waiter is `self`: a one-key waiter's member is removed, nothing written), 'granted'
  -- and the PX, 'blocked', 'empty', or 'more' (SCAN departed waiters dropped, more to look
  -- at: call again).
  local serve_once

  -- (A grant nobody heard, its process gone, and the walk goes on: the call's scan bound is
  -- shared by its walks, `budget`, so it ends at SCAN members, then 'more'.)
  local function serve(self)
    local saved = budget
    budget = budget or SCAN
    -- (The watcher fields are read with the first heads: `ahead`.)
    Q.ahead(true)
    local r, px
    repeat r, px = serve_once(self) until r ~= 'unheard'
    budget = saved
    return r, px
  end

  serve_once = function(self)
    local chosen, blocked, reserved = nil, false, false
    local stopped, full_scan, _, behind = Q.walk(self, nil, function(m)
      if m.set then
        if m.own then
          chosen = m
          return 'stop'
        end
        local S = rares()
        local ready, departed = S.ready(m)
        if departed then return 'gone' end
        if not ready then
          blocked = true
          return 'stop'
        end
        if not S.here(m) then
          chosen, reserved = m, true
          return 'stop'
        end
      end
      chosen = m
      return 'last'
    end)
    if not stopped then
      Q.ahead(false)
      if full_scan then return 'more' end
      return 'empty'
    end
    if blocked then return 'blocked' end
    if chosen.own then return 'self' end
    if reserved then return 'granted', rares().reserve(chosen) end
    if chosen.set then return 'granted', rares().grant(chosen, behind) end
    local pid, token, p = chosen.pid, chosen.token, chosen.p
    local full = p.is == 'fresh'
    local px = chosen.ttl
    if not full then px = short(px) end
    -- (Every member before the chosen one left: the queue is what is behind it.)
    local more = behind
    if more == nil then more = redis.call('ZCARD', q) > 0 end
    if not hand(full and HANDED or GRANTED, token, pid, px, more, p.how) then return 'unheard' end
    return 'granted', px
  end

  -- Releases a lock held by the caller in `state`: serves the queue or deletes the key.
  -- Returns DONE (deleted, or left free for a set that waits: 'blocked'), HANDED_OVER, or
  -- CONTINUE (departed waiters dropped, more to look at: the lock stays the caller's for the
  -- claim window, and it calls release again).
  local function release_held(state)
    if state ~= TAKEN then
      local r = serve('')
      if r == 'granted' then return HANDED_OVER end
      if r == 'blocked' then
        rares().leave_blocked()
        return DONE
      end
      if r == 'more' then
        redis.call('SET', lock, QUEUED .. TOKEN, 'PX', CLAIM)
        Q.flush({}, 0)
        Q.keep(CLAIM)
        return CONTINUE
      end
      -- (A due record, see `seen`, goes with the hash.)
      fence_flags(false, nil)
      redis.call('DEL', pkey)
    end
    redis.call('DEL', lock)
    return DONE
  end

  -- Puts MEMBER in the queue (once) and makes sure the fence says waiters may be queued.
  -- Returns the 'queued' reply (see `queued_reply`).
  local function enqueue(pttl)
    -- (The record is written with the watcher's field: `queued_reply`.)
    Q.seen(PID, true)
    Q.add_member()
    local old = redis.call('GET', fkey)
    local _, queued, pending = fence_parse(old)
    local f = fence_flags(true, pending, old or false)
    return Q.queued_reply(pttl, f, nil)
  end

  -- Process `pid` holds the lock now ('' = unknown). (The hash's expiry is the caller's: a
  -- queue is behind the lock, which `keep` gives it.)
  local function held_by(pid)
    if pid ~= '' then
      redis.call('HSET', pkey, '!h', pid)
    else
      redis.call('HDEL', pkey, '!h')
    end
  end

  -- The holder's process as recorded ('' = unknown).
  local function holder_pid()
    return redis.call('HGET', pkey, '!h') or ''
  end

  fns = setmetatable({serve = serve, release_held = release_held, enqueue = enqueue,
    fence_flags = fence_flags, held_by = held_by, holder_pid = holder_pid, hand = hand,
    lock = lock, fkey = fkey, q = q, pkey = pkey, reset_call = function() Q.reset_call() end},
    {__index = function(_, name)
      if name == 'confirm_grant' or name == 'leave_blocked' or name == 'drop_departed_set' then
        return rares()[name]
      end
      return Q[name]
    end})
  return fns
end

slow = function(l)
  slow_cache = slow_cache or {}
  local id = l or KEYS[1]
  local cached = slow_cache[id]
  if cached then return cached end
  cached = kept_group('s' .. id, build_slow, l)
  slow_cache[id] = cached
  return cached
end
