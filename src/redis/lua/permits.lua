-- A semaphore's leases (permits: the fair semaphore and the read-write lock), on the queue
-- layer (`queue.lua`, before this): prepended, after it, to every permit script. The model's
-- permits side mirrors these functions (same names); tests/scripts_permits.rs drives them.
--
-- Names: KEYS[1] holders, KEYS[2] state, KEYS[3] queue, KEYS[4] processes, KEYS[5] holder
-- fences. The queue, the processes hash, the watchers, the walk and the messages are the
-- queue layer's.
-- Token: 'w<weight>:<id>': a permit token says how many permits it holds or asks for (a
--   queued locker's id is "<pid>/<uuid>").
-- Holders: a sorted set; member a holder's token, score the Redis time (ms) its lease ends.
--   It expires with its last lease. A lease whose end has passed is over: it is dropped by the
--   next call (at most PURGE a call), and counted as held until then (a lease not yet dropped
--   delays a grant, never doubles one).
-- State: "<fence> <limit> <used>": the last fence given (an acquisition's fence only grows,
--   across all permits of the key), the number of permits of the key, and how many the
--   holders hold (their weights summed; 0 when the holders key is gone). It outlives every
--   lease (its PX is the retention, or the last lease's end and a second, if later). The
--   limit is fixed while anyone holds or waits; then a caller asking another gets {5, limit}.
-- Holder fences: a hash, token -> fence of its hold: "<fence>", or "<fence> g" for a grant its
--   waiter has not claimed by a call yet (its waiter holds it when the message arrives, and may
--   never call; a grant message that reaches a process whose waiter has gone gives back only an
--   unclaimed grant, as the lock's 'h' state). Expires with the holders.
-- Watchers: as a lock's (two, of two processes), chosen first among processes that hold no
--   permits (the holders' processes are read from their tokens; the first 16 leases to end),
--   then among holders' ones, the process of the lease that ends first last: a fault of a
--   holder's process must not silence the waiters that would take its permits.
-- Granting: FIFO without barging. The oldest waiter is granted when its weight fits in what is
-- free; one that does not fit stops the scan (later, lighter waiters wait behind it), so a
-- release may grant to several waiters at once. Every grant is a full lease (the waiter's TTL):
-- a frozen grantee holds its permits for that lease, as a frozen holder does.
-- ARGV[10]: the limit the caller expects (acquire; '' otherwise).

-- (Set by `begin_permits`.)
local HOLDERS, STATE, PQ, PP, FENCES
-- At most this many ended leases are dropped per call (the queue walk has its own bound).
local PURGE = 16

local function weight_of(token)
  return tonumber(string.match(token, '^w(%d+):'))
end

-- Redis time in ms, on the clock the leases were written by. The leases are Redis times (the
-- holders' scores), and the holders key expires at the last one (`settle`), so "now" is the
-- last lease's end less the key's PTTL. MIGRATE moves a key's TTL as the time left (as it does
-- a lock's PX), so the leases keep their length on a node whose clock is ahead or behind;
-- without holders, Redis' own clock (a failover to a replica writes expiries as absolute
-- times, so there the leases run on the replica's clock, as a lock's PX does).
local clock
local function now_ms()
  if not clock then
    clock = math.floor(now_us() / 1000)
    local last = redis.call('ZRANGE', HOLDERS, -1, -1, 'WITHSCORES')
    if last[2] then
      local left = redis.call('PTTL', HOLDERS)
      if left >= 0 then clock = tonumber(last[2]) - left end
    end
  end
  return clock
end

-- A permits call's start (see `begin_queue`).
local function begin_permits()
  begin_queue()
  HOLDERS, STATE, PQ, PP, FENCES = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
  clock = nil
end

-- The key's state: {fence, limit (nil: none recorded), used}.
local function state()
  local v = redis.call('GET', STATE)
  local s = {fence = 0, limit = nil, used = 0}
  if v then
    local f, n, u = string.match(v, '^(%d+) (%d+) (%d+)$')
    if f then s.fence, s.limit, s.used = tonumber(f), tonumber(n), tonumber(u) end
    if s.limit == 0 then s.limit = nil end
  end
  if redis.call('EXISTS', HOLDERS) == 0 then
    s.used = 0
  elseif not v then
    -- Holders without a state (deleted by hand, or evicted): count every permit as held
    -- until their leases end.
    s.used = math.huge
  end
  return s
end

-- Drops a holder: its weight is free again.
local function drop_holder(s, token)
  s.changed = true
  redis.call('ZREM', HOLDERS, token)
  redis.call('HDEL', FENCES, token)
  s.used = math.max(0, s.used - (weight_of(token) or 0))
  -- Without a state (see `state`), the count is known again once the last holder is gone.
  if s.used == math.huge and redis.call('EXISTS', HOLDERS) == 0 then s.used = 0 end
end

-- Drops up to PURGE leases that have ended.
local function purge(s)
  local ended = redis.call('ZRANGEBYSCORE', HOLDERS, '-inf', now_ms(), 'LIMIT', 0, PURGE)
  for _, token in ipairs(ended) do drop_holder(s, token) end
end

-- The fence of `token`'s hold (0 if none), claiming it (a call of its waiter found it).
local function claim(token)
  local v = redis.call('HGET', FENCES, token)
  if not v then return 0 end
  local f, g = string.match(v, '^(%d+)( ?g?)$')
  if g == ' g' then redis.call('HSET', FENCES, token, f) end
  return tonumber(f) or 0
end

-- The processes of the holders whose leases end first (16 at most): a set, and the process of
-- the first (nil if its token names none).
local function holding()
  local set, first = {}, nil
  for i, token in ipairs(redis.call('ZRANGE', HOLDERS, 0, 15)) do
    local pid = string.match(token, '^w%d+:(%x+)/')
    if pid then set[pid] = true end
    if i == 1 then first = pid end
  end
  return set, first
end

-- Tells the watchers when to look (see `watch` in queue.lua): filled from the holders'
-- processes when no other waits, the first lease's last (if it runs, it releases before the
-- other leases end, and that call chooses the watchers again).
local function rewatch(L, px, later)
  local set, first = holding()
  L:watch(set, px, later, true, first)
end

-- Ms until the first lease ends (when a permit may come back without a release); 0 if none.
local function first_end()
  local first = redis.call('ZRANGE', HOLDERS, 0, 0, 'WITHSCORES')
  if not first[2] then return 0 end
  return math.max(0, tonumber(first[2]) - now_ms())
end

-- The next fence: max(last + 1, Redis time in microseconds).
local function next_fence(s)
  s.fence = math.max(s.fence + 1, now_us())
  return s.fence
end

-- Gives `token` a lease of `px` ms and the next fence (`granted`: by a grant message, not
-- claimed yet). Returns the fence.
local function hold(s, token, px, granted)
  local f = next_fence(s)
  s.changed = true
  redis.call('ZADD', HOLDERS, now_ms() + px, token)
  local v = string.format('%.0f', f)
  if granted then v = v .. ' g' end
  redis.call('HSET', FENCES, token, v)
  s.used = s.used + weight_of(token)
  return f
end

-- Writes the state back (when this call changed it); the holders and their fences expire
-- with the last lease, the state outlives it.
local function settle(s)
  if not s.changed then return end
  local last = redis.call('ZRANGE', HOLDERS, -1, -1, 'WITHSCORES')
  local keep = tonumber(RETAIN)
  if last[2] then
    -- As time left, not as a Redis time: see `now_ms`.
    local left = tonumber(last[2]) - now_ms()
    redis.call('PEXPIRE', HOLDERS, left)
    redis.call('PEXPIRE', FENCES, left)
    keep = math.max(keep, left + 1000)
    -- The queue lives while a lease runs, and the retention after it (see `keep`).
    if redis.call('EXISTS', PQ) == 1 then queue():keep(left) end
  else
    s.used = 0
  end
  if s.used == math.huge then return end
  redis.call('SET', STATE, string.format('%.0f %d %d', s.fence, s.limit or 0, s.used), 'PX', keep)
end

-- Grants to the queue's heads in order while the head's weight fits (`walk`, which drops the
-- heads whose process nobody listens for: a dead head holds back nobody); the caller's own
-- entry (`self`: its member, or any entry of its token `self_token`, e.g. one queued before it
-- last called without a member) is granted as the others, with TTL and no message. Returns
-- the caller's fence if it was granted (else nil), whether the queue changed, and how many
-- others were granted.
local function serve(L, s, self, self_token)
  -- The key's number of permits is unknown (its state was deleted): nobody can be granted.
  if not s.limit then return nil, false, 0 end
  local mine, granted = nil, 0
  local _, _, left = L:walk(self, self_token, function(m)
    local w = weight_of(m.token)
    -- Malformed, or can never fit: dropped.
    if not w or w > s.limit then return 'take' end
    if s.used + w > s.limit then return 'stop' end
    if m.own then
      mine = hold(s, m.token, tonumber(TTL), false)
    else
      local f = hold(s, m.token, m.ttl, true)
      granted = granted + 1
      L:grant(m.p.how, m.pid, f, m.ttl, m.token)
    end
    return 'take'
  end)
  return mine, left > 0, granted
end

-- Drops the queue's heads whose process nobody listens for (the walk's bound at most).
-- Returns whether the queue is empty now.
local function drop_dead()
  if redis.call('EXISTS', PQ) == 0 then return true end
  queue():walk('', nil, function() return 'stop' end)
  if redis.call('EXISTS', PQ) == 1 then return false end
  redis.call('DEL', PP)
  return true
end

-- After the queue changed: the waiters left are told when to look (now, when the head fits
-- in what is free: the scan stopped at its bound; else when the first lease ends), or, with
-- nobody left, the processes hash goes.
local function after_serve(L, s)
  if redis.call('EXISTS', PQ) == 0 then
    redis.call('DEL', PP)
    return
  end
  local px = first_end()
  local head = redis.call('ZRANGE', PQ, 0, 0)[1]
  local _, _, token = split_member(head or '')
  if token and s.used + (weight_of(token) or 0) <= (s.limit or 0) then px = 0 end
  rewatch(L, px, false)
end

-- Serves the queue when permits came free during this call (`before`: the used count when it
-- began) or `always`; then the watchers are chosen again (the holders changed). Returns how
-- many waiters were granted.
local function serve_freed(s, before, always)
  if not always and s.used >= before then return 0 end
  if redis.call('EXISTS', PQ) == 0 then
    if always then redis.call('DEL', PP) end
    return 0
  end
  local L = queue()
  local _, _, granted = serve(L, s, '')
  after_serve(L, s)
  return granted
end

-- Drops what `token` holds. Returns 1 if its lease was running, 0 if it held nothing (or an
-- ended lease not dropped yet: dropped now).
local function give_back(s, token)
  local score = redis.call('ZSCORE', HOLDERS, token)
  if not score then return 0 end
  drop_holder(s, token)
  if tonumber(score) > now_ms() then return 1 end
  return 0
end
