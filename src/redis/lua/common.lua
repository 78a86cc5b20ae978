-- Shared by every waitlock script (prepended to each; Redis runs each script on its own).
--
-- Names: KEYS[1] lock, KEYS[2] fence, KEYS[3] queue; a waiter's grant channel is
-- KEYS[1] .. ':w:' .. hub (same hash tag, so the same Cluster slot).
-- Lock value: one state letter, then the holder's token:
--   'p' nobody was queued when it was taken (release may just DEL it),
--   'q' waiters may be queued (release serves the queue),
--   'g' handed over by a grant and not yet confirmed by its new holder (PX = claim window).
-- Fence value: "<fence>", "<fence> q" (waiters may be queued) or "<fence> q <hub>" (the last
-- grant went to a waiter of process <hub> and is not confirmed yet).
-- Queue: a sorted set; member "<hub> <ttl ms> <token>", score = enqueue time in microseconds.
--
-- Every script gets the same ARGV: token, ttl ms, fence counter ttl ms, claim window ms, queue
-- member ('' when the caller does not queue), and one flag of its own.

local TOKEN, TTL, FTTL, CLAIM, MEMBER, FLAG = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6]

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Fence number, queued flag, pending grant hub of a fence value.
local function fence_parse(v)
  if not v then return 0, false, nil end
  local f, q, hub = string.match(v, '^(%d+) ?(q?) ?(%S*)$')
  if not f then return 0, true, nil end
  if hub == '' then hub = nil end
  return tonumber(f), q == 'q', hub
end

local function fence_text(f, queued, hub)
  local s = string.format('%.0f', f)
  if queued then
    s = s .. ' q'
    if hub then s = s .. ' ' .. hub end
  end
  return s
end

-- Takes the next fence: max(previous + 1, Redis TIME in microseconds). Writes it with the given
-- flags and the counter's TTL; returns the fence and the previous value.
local function next_fence(fkey, fttl, queued, hub)
  local f = now_us()
  local old = redis.call('SET', fkey, fence_text(f, queued, hub), 'PX', fttl, 'GET')
  local prev = fence_parse(old)
  if prev >= f then
    f = prev + 1
    redis.call('SET', fkey, fence_text(f, queued, hub), 'PX', fttl)
  end
  return f, old
end

-- The slow paths' functions, created only when a call needs one (Redis runs the whole script
-- body on every call, and creating a dozen closures there costs the fast paths ~15%).
local function slow()
  -- Rewrites the fence flags, keeping the number and the TTL.
  local function fence_flags(fkey, queued, hub)
    local old = redis.call('GET', fkey)
    local f, q, h = fence_parse(old)
    if old and q == queued and h == hub then return f end
    if old then
      redis.call('SET', fkey, fence_text(f, queued, hub), 'KEEPTTL')
    else
      redis.call('SET', fkey, fence_text(f, queued, hub), 'PX', FTTL)
    end
    return f
  end

  -- How a process listens on a grant channel: 's' sharded, 'c' classic, nil nobody (its process
  -- died, or lost its subscriber connection).
  local function listener(channel)
    local r = redis.pcall('PUBSUB', 'SHARDNUMSUB', channel)
    if type(r) == 'table' and not r.err and tonumber(r[2]) > 0 then return 's' end
    if tonumber(redis.call('PUBSUB', 'NUMSUB', channel)[2]) > 0 then return 'c' end
    return nil
  end

  local function split_member(m)
    return string.match(m, '^(%S+) (%d+) (.*)$')
  end

  -- Hands the lock to the oldest live queued waiter other than `self` (a member string or '').
  -- Dead waiters (nobody listens on their channel) are dropped on the way. Returns 'self' when
  -- the oldest live waiter is `self` (removed from the queue, nothing written), the granted
  -- token and its PX when another waiter got it, or nil when no live waiter is queued.
  local function grant_next(self)
    local lock, fkey, q = KEYS[1], KEYS[2], KEYS[3]
    for _ = 1, 1000 do
      local heads = redis.call('ZRANGE', q, 0, 1)
      local head = heads[1]
      if not head then return nil end
      redis.call('ZREM', q, head)
      if head == self then return 'self' end
      local hub, ttl, token = split_member(head)
      if hub then
        local channel = lock .. ':w:' .. hub
        local how = listener(channel)
        if how then
          local more = heads[2] ~= nil
          local px = math.min(tonumber(ttl), CLAIM)
          local hub_pending = nil
          if more then hub_pending = hub end
          local f = next_fence(fkey, FTTL, more, hub_pending)
          redis.call('SET', lock, 'g' .. token, 'PX', px)
          local msg = 'g ' .. string.format('%.0f', f) .. ' ' .. token
          if how == 's' then
            redis.call('SPUBLISH', channel, msg)
          else
            redis.call('PUBLISH', channel, msg)
          end
          return token, px
        end
      end
    end
    return nil
  end

  -- Releases a lock held by the caller: serves the queue or deletes the key. 1 deleted, 2 handed
  -- to a waiter.
  local function release_held(state)
    if state ~= 'p' then
      if grant_next('') then return 2 end
      fence_flags(KEYS[2], false, nil)
    end
    redis.call('DEL', KEYS[1])
    return 1
  end

  -- Confirms a grant: the full TTL, state 'q', and the fence no longer names a pending grant.
  local function confirm_grant()
    redis.call('SET', KEYS[1], 'q' .. TOKEN, 'PX', TTL)
    local _, q = fence_parse(redis.call('GET', KEYS[2]))
    return fence_flags(KEYS[2], q, nil)
  end

  -- Removes every queued waiter of process `hub` (its grant lapsed: it is frozen or gone).
  local function purge(hub)
    local prefix = hub .. ' '
    for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
      if string.sub(m, 1, #prefix) == prefix then redis.call('ZREM', KEYS[3], m) end
    end
  end

  -- Puts MEMBER in the queue (once) and makes sure the fence says waiters may be queued.
  -- Returns 1 if MEMBER's process listens on its grant channel, else 0.
  local function enqueue()
    local added = redis.call('ZADD', KEYS[3], 'NX', now_us(), MEMBER)
    if added == 1 then
      redis.call('PEXPIRE', KEYS[3], FTTL)
      local v = redis.call('GET', KEYS[2])
      local _, queued, hub = fence_parse(v)
      if not v or not queued then fence_flags(KEYS[2], true, hub) end
    end
    local id = string.match(MEMBER, '^(%S+)')
    if id and listener(KEYS[1] .. ':w:' .. id) then return 1 end
    return 0
  end
  return {fence_flags = fence_flags, listener = listener, split_member = split_member, grant_next = grant_next, release_held = release_held, confirm_grant = confirm_grant, purge = purge, enqueue = enqueue}
end
