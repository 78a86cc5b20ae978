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
--       confirms (extends) it before using it.
-- Fence value (KEYS[2]): "<fence>", "<fence> q" (waiters may be queued) or "<fence> q <pid>"
--   (the last grant was a short grant to process <pid> and is not confirmed yet). It lives the
--   lease set by the call that wrote it plus the retention; a vanished one is started again
--   from Redis' clock, never from 0.
-- The processes hash's '!h' = the holder's pid: written by a grant, by a queued attempt that
--   takes the lock, and when the first waiter queues behind a lock taken free (from the
--   holder's token, which a queued locker makes "<pid>/<uuid>"; unknown for a polling
--   locker's or a fixed token).

local TAKEN, QUEUED, HANDED, GRANTED = 'p', 'q', 'h', 'g'

-- A lock's processes hash keeps '!e', the queue's expiry hint (see `keep` in queue.lua).
EXPIRY_HINT = true

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
-- every lease: a lock held longer than the retention keeps its fence and its 'q'). Returns the
-- fence and the previous value.
local function next_fence(queued, pid, px)
  local f = now_us()
  local life = tonumber(RETAIN) + px
  local old = redis.call('SET', KEYS[2], fence_text(f, queued, pid), 'PX', life, 'GET')
  local prev = fence_parse(old)
  if prev >= f then
    f = prev + 1
    redis.call('SET', KEYS[2], fence_text(f, queued, pid), 'PX', life)
  end
  return f, old
end

-- The lock's slow paths, on the queue layer's functions (which `slow()` also gives), built
-- once, only when a call needs them.
local lock_fns
local function slow()
  if lock_fns then return lock_fns end
  local Q = queue()
  local lock, fkey, q, pkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

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

  -- Hands the lock to the oldest waiter whose process listens, skipping (and dropping) the
  -- others (`walk`). A fresh process gets the waiter's full TTL (state 'h'): its waiter holds
  -- the lock when the message arrives, with no further step. A stale one gets a short grant
  -- (state 'g'): its waiter confirms before it uses the lock, and if it does not, the grant
  -- lapses. The waiters behind are told to watch the new holder's lease (see `watch`), and the
  -- queue lives that lease and the retention. Returns 'self' (the oldest live waiter is
  -- `self`: removed, nothing written), 'granted' and the PX, 'empty', or 'more' (SCAN departed
  -- waiters dropped, more to look at: call again).
  local function serve(self)
    local chosen = nil
    -- (The watchers' processes are learnt with the heads': `ahead`.)
    Q.ahead(true)
    local stopped, full_scan, _, behind = Q.walk(self, nil, function(m)
      chosen = m
      return 'last'
    end)
    if not stopped then
      Q.ahead(false)
      if full_scan then return 'more' end
      return 'empty'
    end
    if chosen.own then return 'self' end
    local pid, token, p = chosen.pid, chosen.token, chosen.p
    local full = p.is == 'fresh'
    local px = chosen.ttl
    if not full then
      -- A short grant is always shorter than its waiter's TTL, so that its waiter always
      -- confirms it (a TTL within the claim window gets half of it): one left unconfirmed
      -- would keep naming its process as pending, which a later lapse would mark 'x'.
      if px > CLAIM then px = CLAIM else px = math.max(1, math.floor(px / 2)) end
    end
    -- (Every member before the chosen one left: the queue is what is behind it.)
    local more = behind
    if more == nil then more = redis.call('ZCARD', q) > 0 end
    local pending = nil
    if more and not full then pending = pid end
    local f = next_fence(more, pending, px)
    local state = full and HANDED or GRANTED
    redis.call('SET', lock, state .. token, 'PX', px)
    Q.grant(p.how, pid, f, px, token)
    -- ('!h' = pid, with the watchers.)
    Q.watch(pid, px, nil, nil, nil, true, pid)
    -- (The hash may be new here: it gets an expiry either way.)
    if more then Q.keep(px) else Q.retain() end
    return 'granted', px
  end

  -- Releases a lock held by the caller in `state`: serves the queue or deletes the key.
  -- Returns DONE (deleted), HANDED_OVER, or CONTINUE (departed waiters dropped, more to look
  -- at: the lock stays the caller's for the claim window, and it calls release again).
  local function release_held(state)
    if state ~= TAKEN then
      local r = serve('')
      if r == 'granted' then return HANDED_OVER end
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

  lock_fns = setmetatable({serve = serve, release_held = release_held,
    confirm_grant = confirm_grant, enqueue = enqueue, fence_flags = fence_flags,
    held_by = held_by, holder_pid = holder_pid}, {__index = Q})
  return lock_fns
end
