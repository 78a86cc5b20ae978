-- waitlock protocol, format 2. Prepended to every script (Redis runs each script on its own).
-- src/redis/protocol.rs is the Rust side of every format named here; tests/scripts.rs drives
-- each transition; model/src/lib.rs (`Queue::acquire`, `release`, `extend`, `leave`, and one
-- function per local function below, same names) mirrors each script as one atomic step and
-- model/tests/exhaustive.rs checks it. Change them together.
--
-- Version rule: formats only grow. A reader ignores what it does not know (a message with an
-- unknown tag, an unknown state letter is read as "held"); a new meaning gets a new tag or
-- letter, never an old one reused. Scripts of older versions may run against the same keys
-- during a rolling upgrade: they must never make a guard believe in a lease Redis did not give
-- (at worst a waiter is served late).
--
-- Names: KEYS[1] lock, KEYS[2] fence, KEYS[3] queue, KEYS[4] processes; a process's grant
-- channel is KEYS[1] .. ':w:' .. hub (same hash tag, so the same Cluster slot).
-- Lock value: one state letter, then the holder's token:
--   'p' taken while nobody was queued (release may just DEL it),
--   'q' held, waiters may be queued (release serves the queue),
--   'h' handed by a full grant (PX = the waiter's TTL), not claimed by a call of its waiter
--       yet (its waiter holds it when the message arrives, and may never call; a grant message
--       that reaches a process whose waiter has gone gives back only an unclaimed grant),
--   'g' handed by a short grant (PX = claim window) that its new holder has not confirmed yet:
--       its process had not been seen lately, so its waiter confirms (extends) it before using it.
-- Fence value: "<fence>", "<fence> q" (waiters may be queued) or "<fence> q <hub>" (the last
--   grant was a short grant to process <hub> and is not confirmed yet).
-- Queue: a sorted set; member "<hub> <ttl ms> <token>", score = enqueue time in microseconds.
-- Processes: a hash; field <hub> = Redis time in ms when that process last called on this key,
--   or 'x' when its short grant lapsed (it is frozen or gone: its waiters are skipped until it
--   calls again); fields '!w1', '!w2' = "<ms> <member>": the lock's two watchers (see `watch`)
--   and when each will look; field '!h' = the holder's hub: written by a grant, by a queued
--   attempt that takes the lock, and when the first waiter queues behind a lock taken free
--   (from the holder's token, which a queued locker makes "<hub>/<uuid>"; unknown for a
--   polling locker's or a fixed token). A hint for choosing watchers, never for safety.
--   Deleted when the queue empties.
-- Messages on a grant channel: 'g2 <fence> <px ms> <grant time us> <token>' (the lock is
--   <token>'s for px ms from Redis time <grant time>); 'w3 <px ms> <time us> <token>' (<token>
--   is one of the lock's watchers: look at the lock px ms after Redis time <time>, when the
--   holder's lease ends; format 2's 'w2 <px ms> <token>' did not say when); 'd2' (a
--   queue scan dropped this process's waiters because a short grant to it lapsed: they look
--   again, and queue again).
--
-- ARGV (every script): token, ttl ms, retention ms (fence counter, queue, processes), claim
-- window ms, presence window ms, queue member or '', caller's hub or '', flag, fence or ''.

local TOKEN, TTL, RETAIN, CLAIM, PRESENCE = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local MEMBER, HUB, FLAG, FENCE = ARGV[6], ARGV[7], ARGV[8], ARGV[9]

local TAKEN, QUEUED, HANDED, GRANTED = 'p', 'q', 'h', 'g'

local function state_of(v) return string.sub(v, 1, 1) end
local function holder_of(v) return string.sub(v, 2) end

local now_cache
local function now_us()
  if not now_cache then
    local t = redis.call('TIME')
    now_cache = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_cache
end

-- Fence number, queued flag, pending short-grant hub of a fence value.
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

-- Takes the next fence: max(previous + 1, Redis TIME in microseconds), written with the given
-- hints, for the lease `px` just set plus the retention (the counter, and its hints, outlive
-- every lease: a lock held longer than the retention keeps its fence and its 'q'). Returns the
-- fence and the previous value.
local function next_fence(queued, hub, px)
  local f = now_us()
  local life = tonumber(RETAIN) + px
  local old = redis.call('SET', KEYS[2], fence_text(f, queued, hub), 'PX', life, 'GET')
  local prev = fence_parse(old)
  if prev >= f then
    f = prev + 1
    redis.call('SET', KEYS[2], fence_text(f, queued, hub), 'PX', life)
  end
  return f, old
end

-- The slow paths' functions, created only when a call needs one (Redis runs the whole script
-- body on every call, and creating a dozen closures there costs the fast paths ~15%), once.
local slow_fns
local function slow()
  if slow_fns then return slow_fns end
  local lock, fkey, q, pkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  -- A queue scan looks at this many heads at most (bounded script time, however long the
  -- queue); a release that finds only departed waiters among them says 'continue'.
  local SCAN = 200
  local LAPSED = 'x'

  -- Rewrites the fence hints, keeping the number, and the TTL unless `px` (a lease this call
  -- set) says it must last that lease plus the retention. A missing counter is started at
  -- Redis TIME (never 0: a fence is always above every earlier one). Returns the fence.
  local function fence_flags(queued, hub, old, px)
    if old == nil then old = redis.call('GET', fkey) end
    local f, q0, h = fence_parse(old)
    local life = px and (tonumber(RETAIN) + px)
    if old and q0 == queued and h == hub then
      if life then redis.call('PEXPIRE', fkey, life) end
      return f
    end
    if old then
      if life then
        redis.call('SET', fkey, fence_text(f, queued, hub), 'PX', life)
      else
        redis.call('SET', fkey, fence_text(f, queued, hub), 'KEEPTTL')
      end
      return f
    end
    f = now_us()
    redis.call('SET', fkey, fence_text(f, queued, hub), 'PX', life or RETAIN)
    return f
  end

  local function channel(hub) return lock .. ':w:' .. hub end

  -- How a process listens on its grant channel: 's' sharded, 'c' classic, nil nobody (its
  -- process died, or lost its subscriber connection).
  local function listener(hub)
    local ch = channel(hub)
    local r = redis.pcall('PUBSUB', 'SHARDNUMSUB', ch)
    if type(r) == 'table' and not r.err and tonumber(r[2]) > 0 then return 's' end
    if tonumber(redis.call('PUBSUB', 'NUMSUB', ch)[2]) > 0 then return 'c' end
    return nil
  end

  local function publish(how, hub, msg)
    if how == 's' then
      redis.call('SPUBLISH', channel(hub), msg)
    else
      redis.call('PUBLISH', channel(hub), msg)
    end
  end

  -- Tells `token`'s waiter in process `hub` (listening `how`) that it holds the key for `px`
  -- ms with fence `f`, from Redis' time now: the 'g2' message.
  local function grant(how, hub, f, px, token)
    publish(how, hub, 'g2 ' .. string.format('%.0f', f) .. ' ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' .. token)
  end

  local function split_member(m)
    return string.match(m, '^(%S+) (%d+) (.*)$')
  end

  -- Puts MEMBER at the back of the queue, once. Its score is Redis' clock in microseconds, but
  -- never below the last member's (+1): after the clock steps back, a newcomer still queues
  -- behind every waiter already there (FIFO).
  local function add_member()
    if redis.call('ZADD', q, 'NX', now_us(), MEMBER) == 1 then
      local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')
      if last[1] ~= MEMBER then
        redis.call('ZADD', q, 'XX', tonumber(last[2]) + 1, MEMBER)
      end
    end
  end

  -- The processes hash outlives its queue by the retention at most: a write that (re)creates
  -- it after it expired, while its queue lived on, gives it the retention again.
  local function retain()
    if redis.call('PTTL', pkey) == -1 then redis.call('PEXPIRE', pkey, RETAIN) end
  end

  -- The queue and the processes hash live while waiters wait: every queueing attempt, and
  -- every call that sets the lock's lease (`px` ms from now) while waiters may be queued,
  -- gives them that lease plus the retention (an expiry set only when a member is added would
  -- let a long wait lose its queue: nobody would be granted, nobody told).
  local function keep(px)
    local life = tonumber(RETAIN) + math.max(px, 0)
    redis.call('PEXPIRE', q, life)
    redis.call('PEXPIRE', pkey, life)
  end

  -- A process record says when its process last called (ms). A record that is not fresh
  -- (older than the presence window, or in Redis' future after a clock step) means the same
  -- as none, so `seen` drops a few of them whenever it adds a field: a key that never drains
  -- does not keep one field per process that ever called. A lapsed process's 'x' goes once
  -- nobody listens for it (it died).
  local SWEEP = 8
  local function sweep(now_ms)
    local r = redis.call('HRANDFIELD', pkey, SWEEP, 'WITHVALUES')
    local stale = {}
    for i = 1, #r, 2 do
      local field, v = r[i], r[i + 1]
      if string.sub(field, 1, 1) ~= '!' then
        local t = tonumber(v)
        if t then
          local d = now_ms - t
          if d < 0 or d > PRESENCE then stale[#stale + 1] = field end
        elseif v == LAPSED and not listener(field) then
          stale[#stale + 1] = field
        end
      end
    end
    if #stale > 0 then redis.call('HDEL', pkey, unpack(stale)) end
  end

  -- Process `hub` called on this key now.
  local function seen(hub)
    if hub == '' then return end
    local now_ms = math.floor(now_us() / 1000)
    if redis.call('HSET', pkey, hub, now_ms) == 1 then
      redis.call('PEXPIRE', pkey, RETAIN)
      sweep(now_ms)
    end
  end

  -- A short grant to `hub` lapsed unconfirmed: its process is frozen or gone.
  local function lapse(hub)
    if redis.call('EXISTS', pkey) == 1 then redis.call('HSET', pkey, hub, LAPSED) end
  end

  -- What a queue scan knows of each process (asked once per call): listening how, and
  -- 'fresh' (seen within the presence window), 'stale' (listening, not seen lately) or 'gone'
  -- (nobody listens, or its short grant lapsed).
  local known = {}
  local function process(hub)
    local k = known[hub]
    if k then return k end
    k = {}
    local rec = redis.call('HGET', pkey, hub)
    k.lapsed = rec == LAPSED
    k.how = (not k.lapsed) and listener(hub) or nil
    -- A record in Redis' future (its clock stepped back, or the key moved to a node whose
    -- clock is behind) says nothing of the process: not fresh.
    local d = rec and not k.lapsed and (math.floor(now_us() / 1000) - tonumber(rec))
    if not k.how then
      k.is = 'gone'
    elseif d and d >= 0 and d <= PRESENCE then
      k.is = 'fresh'
    else
      k.is = 'stale'
    end
    known[hub] = k
    return k
  end

  -- Watchers: two queued waiters of two processes look at the lock when its holder's lease
  -- ends (a holder that crashed, or a short grant that lapsed, is then served at once). They
  -- are recorded in the processes hash as '!w1' / '!w2' = "<ms when it looks> <member>", and
  -- kept across grants while they stay queued and their process fresh: a busy queue appoints
  -- (and messages) a watcher only once in a while. A watcher looks again when its look finds
  -- the lock held (the reply says the new lease). New ones come from the back of the queue,
  -- which is granted last.
  local WATCHERS = {'!w1', '!w2'}

  -- Keeps the watchers of the lock fit after a change: `skip` the process of a new holder
  -- (its watchers would fail with it), `px` the lease that now ends first (ms from now; 0: the
  -- lock is free, look now). Two watchers of two other processes, fresh ones first (a frozen
  -- process is not fresh), current ones before new ones (a new one costs a message); when
  -- fewer than two other processes wait, from the skipped one too. A kept
  -- watcher that would look later than the lease ends is told again; with `later` (a refresh)
  -- also one that would look earlier, so that watchers of a lock held long make no calls.
  -- Permits pass `skip` as a set of hubs (the holders' processes) and `fill`: both fields are
  -- filled, from the skipped processes when no other is left, `last` (the process whose lease
  -- ends first) last.
  local function watch(skip, px, later, fill, last)
    local skips = skip
    if type(skip) ~= 'table' then skips = {[skip] = true} end
    local until_ms = math.floor(now_us() / 1000) + px
    local cands = {}
    for _, field in ipairs(WATCHERS) do
      local v = redis.call('HGET', pkey, field)
      local at, m = nil, nil
      if v then at, m = string.match(v, '^(%d+) (.*)$') end
      if m and redis.call('ZSCORE', q, m) then
        cands[#cands + 1] = {m = m, at = tonumber(at)}
      end
    end
    local tail = redis.call('ZRANGE', q, -16, -1)
    for j = #tail, 1, -1 do cands[#cands + 1] = {m = tail[j]} end
    local chosen, hubs = {}, {}
    local function pick(fresh_only, allow_skip, except)
      for _, c in ipairs(cands) do
        if #chosen == 2 then return end
        local whub, _, wtoken = split_member(c.m)
        if whub and not hubs[whub] and (allow_skip or not skips[whub]) and whub ~= except then
          local p = process(whub)
          if p.is ~= 'gone' and (p.is == 'fresh' or not fresh_only) then
            hubs[whub] = true
            c.hub, c.token, c.how = whub, wtoken, p.how
            chosen[#chosen + 1] = c
          end
        end
      end
    end
    pick(true, false)
    pick(false, false)
    -- Fewer than two other processes wait: the second watcher (or both) from the holder's
    -- own process, better than none. (A holder that overstays its lease without a fault,
    -- with the only other process frozen, would leave its own process's waiters asleep.)
    if #chosen < 2 or fill then
      if fill and last then pick(false, true, last) end
      pick(false, true)
    end
    redis.call('HDEL', pkey, WATCHERS[1], WATCHERS[2])
    for i, c in ipairs(chosen) do
      if not c.at or until_ms < c.at or (later and until_ms > c.at) then
        publish(c.how, c.hub, 'w3 ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' .. c.token)
        c.at = until_ms
      end
      redis.call('HSET', pkey, WATCHERS[i], string.format('%.0f', c.at) .. ' ' .. c.m)
    end
    if #chosen > 0 then retain() end
  end

  -- MEMBER, just queued with the lock's lease ending in `pttl` ms: whether it watches the
  -- lock (it is a watcher already, or takes a free field); records when it will look. The two
  -- watchers stay in two processes (one process's fault must not silence both), and a
  -- newcomer of another process replaces a watcher of the holder's (which would fail with
  -- the holder).
  -- Permits pass `holding`, the set of holders' processes, in place of the lock's holder.
  local function watching(pttl, holding)
    local ms, hubs = {}, {}
    for i, field in ipairs(WATCHERS) do
      local v = redis.call('HGET', pkey, field)
      ms[i] = v and string.match(v, '^%d+ (.*)$')
      hubs[i] = ms[i] and split_member(ms[i])
    end
    local function fits(i) return hubs[3 - i] ~= HUB end
    local mine = nil
    for i = 1, 2 do
      if ms[i] == MEMBER then mine = i end
    end
    if not mine then
      for i = 1, 2 do
        if not mine and not ms[i] and fits(i) then mine = i end
      end
    end
    if not mine and not holding then
      holding = {}
      local holder = redis.call('HGET', pkey, '!h')
      if holder then holding[holder] = true end
    end
    if not mine and not holding[HUB] then
      for i = 1, 2 do
        if not mine and hubs[i] and holding[hubs[i]] and fits(i) then mine = i end
      end
    end
    if not mine then return 0 end
    if pttl < 0 then pttl = 0 end
    -- (The hash's expiry is the caller's: `enqueue` keeps it.)
    redis.call('HSET', pkey, WATCHERS[mine], string.format('%.0f', math.floor(now_us() / 1000) + pttl) .. ' ' .. MEMBER)
    return 1
  end

  -- Hands the lock to the oldest waiter whose process listens, skipping (and dropping) the
  -- others. A fresh process gets the waiter's full TTL (state 'h'): its waiter holds the lock
  -- when the message arrives, with no further step. A stale one gets the claim window (state 'g'): its
  -- waiter confirms before it uses the lock, and if it does not, the grant lapses. The waiters
  -- behind are told to watch the new holder's lease (see `watch`). Returns 'self' (the oldest
  -- live waiter is `self`: removed, nothing written), 'granted' and the PX, 'empty', or 'more'
  -- (SCAN departed waiters dropped, more to look at: call again).
  local function serve(self)
    local heads = redis.call('ZRANGE', q, 0, SCAN - 1)
    local drop = {}
    for i, head in ipairs(heads) do
      drop[#drop + 1] = head
      if head == self then
        redis.call('ZREM', q, unpack(drop))
        return 'self'
      end
      local hub, ttl, token = split_member(head)
      local p = hub and process(hub)
      if p and p.lapsed and not p.told then
        -- Its waiters are dropped: if it still listens (it was frozen, not dead), they must
        -- know, or they sleep with nobody to wake them.
        p.told = true
        local how = listener(hub)
        if how then publish(how, hub, 'd2') end
      end
      if p and p.is ~= 'gone' then
        redis.call('ZREM', q, unpack(drop))
        local full = p.is == 'fresh'
        local px = tonumber(ttl)
        if not full then
          -- A short grant is always shorter than its waiter's TTL, so that its waiter always
          -- confirms it (a TTL within the claim window gets half of it): one left unconfirmed
          -- would keep naming its process as pending, which a later lapse would mark 'x'.
          if px > CLAIM then px = CLAIM else px = math.max(1, math.floor(px / 2)) end
        end
        local more = redis.call('ZCARD', q) > 0
        local pending = nil
        if more and not full then pending = hub end
        local f = next_fence(more, pending, px)
        local state = full and HANDED or GRANTED
        redis.call('SET', lock, state .. token, 'PX', px)
        redis.call('HSET', pkey, '!h', hub)
        grant(p.how, hub, f, px, token)
        watch(hub, px)
        -- (The hash may be new here: it gets an expiry either way.)
        if more then keep(px) else retain() end
        return 'granted', px
      end
    end
    if #drop > 0 then redis.call('ZREM', q, unpack(drop)) end
    if #heads < SCAN then return 'empty' end
    return 'more'
  end

  -- Releases a lock held by the caller in `state`: serves the queue or deletes the key.
  -- Returns 1 deleted, 2 handed to a waiter, 4 'continue' (departed waiters dropped, more to
  -- look at: the lock stays the caller's for the claim window, and it calls release again).
  local function release_held(state)
    if state ~= TAKEN then
      local r = serve('')
      if r == 'granted' then return 2 end
      if r == 'more' then
        redis.call('SET', lock, QUEUED .. TOKEN, 'PX', CLAIM)
        keep(CLAIM)
        return 4
      end
      fence_flags(false, nil)
      redis.call('DEL', pkey)
    end
    redis.call('DEL', lock)
    return 1
  end

  -- Confirms a short grant: the full TTL, state 'q', and the fence names no pending grant.
  -- Returns the fence (of the hold: fences change only when a lock changes hands).
  local function confirm_grant()
    redis.call('SET', lock, QUEUED .. TOKEN, 'PX', TTL)
    local old = redis.call('GET', fkey)
    local _, queued = fence_parse(old)
    seen(HUB)
    if queued then keep(tonumber(TTL)) end
    return fence_flags(queued, nil, old or false, tonumber(TTL))
  end

  -- Puts MEMBER in the queue (once) and makes sure the fence says waiters may be queued.
  -- Returns the 'queued' reply: {2, pttl, 1, listening, fence, watching, Redis time us, depth}
  -- (watching 1: the waiter looks at the lock when the lease ends, in pttl ms; depth: the
  -- queue's length now, the caller included).
  local function enqueue(pttl)
    seen(HUB)
    add_member()
    local old = redis.call('GET', fkey)
    local _, queued, pending = fence_parse(old)
    local f = fence_flags(true, pending, old or false)
    local listening = 0
    if listener(HUB) then listening = 1 end
    local watcher = watching(pttl)
    local depth = redis.call('ZCARD', q)
    -- The first member of a queue gives it (and the processes hash) the lease plus the
    -- retention. A queue that already had members has that life at least: from its first
    -- member, or from the last call that set the lease since (they all `keep` it).
    if depth == 1 then keep(pttl) end
    return {2, pttl, 1, listening, f, watcher, now_us(), depth}
  end

  -- Process `hub` holds the lock now ('' = unknown). (The hash's expiry is the caller's: a
  -- queue is behind the lock, which `keep` gives it.)
  local function held_by(hub)
    if hub ~= '' then
      redis.call('HSET', pkey, '!h', hub)
    else
      redis.call('HDEL', pkey, '!h')
    end
  end

  -- The holder's process as recorded ('' = unknown).
  local function holder_hub()
    return redis.call('HGET', pkey, '!h') or ''
  end

  slow_fns = {serve = serve, release_held = release_held, confirm_grant = confirm_grant,
    enqueue = enqueue, fence_flags = fence_flags, seen = seen, lapse = lapse,
    watch = watch, held_by = held_by, holder_hub = holder_hub, keep = keep,
    add_member = add_member,
    -- The permit scripts' queue (permits.lua) uses these too.
    watching = watching, process = process, grant = grant, listener = listener,
    split_member = split_member}
  return slow_fns
end
