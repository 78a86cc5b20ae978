-- (queue.lua's queue layer, continued: assembled right after it) The walk, the grants and the
-- watchers' choice. What a call learns here is kept in its key's state (see `Key`):
-- `known` (its listeners), `ahead_on` and `ahead_was` (a grant's walk, see `ahead`), `whole`
-- (the queue as a walk read it).

local function publish(how, chan, msg)
  if how == 's' then
    redis.call('SPUBLISH', chan, msg)
  else
    redis.call('PUBLISH', chan, msg)
  end
end

-- Tells `token`'s waiter in process `pid` that it holds the key for `px` ms with fence `f`,
-- from Redis' time now: the 'g2' message. `how`: how it listens, or true when a walk did
-- not ask (`probe`): the message itself asks, sharded (classic where Redis has no sharded
-- pub/sub), and the number of its receivers says whether the process listens. Returns how it
-- listens (nil: nobody heard it, and the process is known gone for the rest of the call).
function Key.grant(K, how, pid, f, px, token)
  local chan = K:channel(pid)
  local msg = 'g2 ' .. string.format('%.0f', f) .. ' ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' .. token
  if how ~= true then
    publish(how, chan, msg)
    return how
  end
  -- (Classic only where Redis has no sharded pub/sub: every locker listens sharded where
  -- it has, and PUBLISH's count would include pattern subscribers.)
  local n = redis.pcall('SPUBLISH', chan, msg)
  how = nil
  if type(n) == 'number' then
    if n > 0 then how = 's' end
  elseif redis.call('PUBLISH', chan, msg) > 0 then
    how = 'c'
  end
  local k = K.known[pid]
  if not how then
    K.known[pid] = {is = 'gone'}
  elseif k then
    k.how, k.probe = how, nil
  end
  return how
end

-- What a queue walk knows of each listener of a member (asked once per call), by its
-- channel (`K.known`): listening how, and 'fresh' (its process seen on this key within the
-- presence window), 'stale' (listening, not seen lately) or 'gone' (nobody listens, or its
-- process's short grant lapsed). `probe`: the listeners were not asked (a grant's walk, whose
-- message asks: `grant`), 'fresh' or 'stale' by the record alone, `rec` kept.
local function judge(rec, how, probe)
  probe = probe and rec ~= LAPSED
  if probe then how = true end
  local k = {lapsed = rec == LAPSED, how = how, probe = probe, rec = rec}
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
  return k
end

-- Learns what `K.known` says of each of the members `ms` (strings; `n` of them, some may be
-- false) not known yet, in one read of their processes' records (none for those whose
-- record `pre` has, from `read_fields`, or a probe kept) and one (or, for classic pub/sub,
-- two) of their listeners, whatever their number. `probe`: one-key waiters' listeners are
-- not asked (see `judge`); without it, what a probe left is asked.
function Key.know(K, ms, n, pre, probe)
  local known, ask, pids, unread, asked, wanted = K.known, {}, {}, {}, {}, {}
  pre = pre or {}
  for k = 1, n do
    local who, pid = nil, nil
    if ms[k] then who, pid = ident(ms[k]) end
    local kn = who and known[who]
    if kn and kn.probe and not probe then
      if pre[pid] == nil then pre[pid] = kn.rec end
      kn = nil
    end
    if who and not kn and not asked[who] then
      asked[who] = true
      ask[#ask + 1], pids[#ask + 1] = who, pid
      if pre[pid] == nil and not wanted[pid] then
        wanted[pid] = true
        unread[#unread + 1] = pid
      end
    end
  end
  if #ask == 0 then return end
  if #unread > 0 then
    local r = redis.call('HMGET', K.pkey, unpack(unread))
    for j, pid in ipairs(unread) do pre[pid] = r[j] or false end
  end
  local recs = {}
  -- A lapsed process is gone whoever listens: only the others are asked about. (A due
  -- record reads as written: see `seen`. A one-key waiter is known by its pid, a set by
  -- its channel.)
  local live, of = {}, {}
  for j, who in ipairs(ask) do
    local pid = pids[j]
    recs[j] = pre[pid] or nil
    if pid == K.due then recs[j] = math.floor(now_us() / 1000) end
    if recs[j] ~= LAPSED and not (probe and who == pid) then
      live[#live + 1] = (who == pid) and K:channel(pid) or who
      of[#live] = j
    end
  end
  local hows = {}
  for k, how in pairs(listeners(live)) do hows[of[k]] = how end
  for j, who in ipairs(ask) do
    known[who] = judge(recs[j], hows[j], probe and who == pids[j])
  end
end

-- What `K.known` says of parsed member `m`'s listener (`probe`: as `know`'s).
function Key.process(K, m, probe)
  local k = K.known[m.who]
  if not k or (k.probe and not probe) then
    K:know({m.member}, 1, nil, probe)
    k = K.known[m.who]
  end
  return k
end

-- `K:ahead(true)`: the next walk reads the watcher fields and '!h' with its first heads'
-- records, in one HMGET (`K.ahead_was`), for the `watch_granted` (or `watch`) that follows
-- (nothing writes those fields in between); and it does not ask whether its heads' processes
-- listen: its grant's message asks (`probe`, `grant`). `K:ahead(false)`: no `watch` follows,
-- or a field was written (forgotten).
function Key.ahead(K, on)
  K.ahead_on, K.ahead_was = on, nil
end

-- `K.whole`: the queue as this call's last walk read it to its end, in order, less the
-- members that walk took out (nil: no such walk, or a queue was written since: see
-- `queue_writes`). The watchers' choice reads members from it instead of from Redis: a short
-- queue is read once per call.
function Key.whole_now(K)
  local w = K.whole
  if w and w.at == queue_writes then return w end
  return nil
end

-- Whether each of the members `ms` (strings) is queued: ZMSCORE, or `whole`.
function Key.queued(K, ms)
  local w = K:whole_now()
  if not w then return redis.call('ZMSCORE', K.q, unpack(ms)) end
  if not w.has then
    w.has = {}
    for _, m in ipairs(w) do w.has[m] = true end
  end
  local r = {}
  for j, m in ipairs(ms) do r[j] = w.has[m] or false end
  return r
end

-- The queue's members from `a` to `b` (negative: from its back, as ZRANGE's): ZRANGE, or
-- `whole`.
function Key.members(K, a, b)
  local w = K:whole_now()
  if not w then return redis.call('ZRANGE', K.q, a, b) end
  local r = {}
  for k = math.max(1, #w + a + 1), #w + b + 1 do r[#r + 1] = w[k] end
  return r
end

-- A walk's next head (nil: none left within its bound). Heads are read a few at a time (most
-- walks stop at the first live one), `W.limit` at most: `W.from` heads read so far,
-- `W.heads` the last batch, `W.i` its members visited; `W.extra`: what the departed sets
-- dropped from their other queues cost (a key each).
function Key.next_head(K, W)
  -- (members visited, and what departed sets cost: `limit` at most)
  local spent = W.from - (#W.heads - W.i) + W.extra
  if spent >= W.limit then return nil end
  if W.i == #W.heads then
    if not W.full then return nil end
    local n = math.min(W.size, W.limit - spent)
    local heads = redis.call('ZRANGE', K.q, W.from, W.from + n - 1)
    W.heads, W.full, W.from, W.i = heads, #heads == n, W.from + #heads, 0
    W.size = math.min(W.size * 4, SCAN)
    W.ended = not W.full
    W.batches[#W.batches + 1] = heads
    if #heads == 0 then return nil end
    local pre = nil
    n = #heads
    if K.ahead_on and not K.ahead_was then
      -- (The first two heads' records in the same HMGET as the watcher fields; a grant's
      -- walk learns the others', by record only, when it reaches them: most stop at the
      -- first. The batch is read whole all the same: `whole`.)
      n = math.min(n, 2)
      local pids = {}
      for k = 1, n do pids[k] = string.match(heads[k], '^%S+') end
      K.ahead_was, pre = K:read_fields(pids)
    end
    K:know(heads, n, pre, K.ahead_on)
  end
  W.i = W.i + 1
  return W.heads[W.i]
end

-- A head `m` (parsed) whose process is gone, or lapsed: a lapsed process that still listens
-- (it was frozen, not dead) is told 'd2' once, or its waiters sleep with nobody to wake them.
-- Returns whether it is dropped (gone); a set dropped leaves its other queues at once (a live
-- set behind it is then judged against its other queues as they are without it), which
-- counts against the walk's bound (`W.extra`).
function Key.drop_gone(K, W, m)
  if m.p.lapsed and not m.p.told then
    m.p.told = true
    local chan = K:chan_of(m)
    local how = listeners({chan})[1]
    if how then publish(how, chan, 'd2') end
  end
  if m.p.is ~= 'gone' then return false end
  if m.set and SETS then
    W.extra = W.extra + #m.set - 1
    K:gone_set(m)
  end
  return true
end

-- Walks the queue from its head, SCAN members at most: the one dead-head scan of every
-- script. A member whose process is gone (nobody listens, or it lapsed) is dropped (a set's
-- from each of its queues, at once: the lock's `gone_set`; each of its other keys counts as a
-- member against the bound); a lapsed process that still listens is told ('d2') once, so its
-- waiters do not sleep out of the queue. `visit(m)` sees every other member, the caller's own
-- too (`m.own`: `self`, or any member of `own_token`), with `m.pid`, `m.ttl`, `m.token`,
-- `m.set` (and a set's `m.chan`), and `m.p` (`process(m)`, not for the caller's own) and
-- answers 'take' (it leaves the queue and the walk goes on), 'last' (it leaves and the walk
-- ends), 'stop' (it stays and the walk ends), 'gone' (a set found departed though its process
-- listens: dropped as a gone one, and told 'd2') or nil (it stays and the walk goes on). A
-- malformed member is dropped. The members that leave go in one ZREM.
-- Returns whether the walk ended by `visit`, whether it saw all the members it could (more
-- may be left), how many left the queue, and whether members are left behind the last one
-- it visited (nil: not known without asking).
function Key.walk(K, self, own_token, visit)
  local out, stopped = {}, false
  -- `batches`: every batch of members read, in order, and `ended`: whether a read reached the
  -- queue's end (then they are the whole queue, as no queue was written during the walk).
  local limit = SCAN
  if budget then limit = math.max(0, math.min(SCAN, budget)) end
  local W = {limit = limit, from = 0, heads = {}, i = 0, size = 8, full = limit > 0, extra = 0,
    batches = {}, ended = false}
  local writes0 = queue_writes
  K.whole = nil
  while true do
    local head = K:next_head(W)
    if not head then break end
    local m = parse_member(head)
    local verdict
    if not m then
      verdict = 'take'
    else
      m.own = head == self or (own_token ~= nil and m.token == own_token)
      if m.own then
        verdict = visit(m)
      else
        m.p = K:process(m, K.ahead_on)
        if K:drop_gone(W, m) then
          verdict = 'take'
        else
          verdict = visit(m)
          if verdict == 'gone' then
            -- A set the visit found departed (missing from another of its queues: see
            -- `set_ready`) though its process listens: dropped as a gone one is, and told,
            -- so that it queues again (at the back of every queue) when it acts.
            verdict = 'take'
            W.extra = W.extra + #m.set - 1
            publish(m.p.how, K:chan_of(m), 'd2')
            K:gone_set(m)
          end
        end
      end
    end
    if verdict == 'take' or verdict == 'last' then out[#out + 1] = head end
    if verdict == 'last' or verdict == 'stop' then
      stopped = true
      break
    end
  end
  local kept = W.ended and queue_writes == writes0
  if #out > 0 then
    redis.call('ZREM', K.q, unpack(out))
    queue_written()
  end
  if kept then
    local left = {}
    for _, m in ipairs(out) do left[m] = true end
    local whole = {at = queue_writes}
    for _, batch in ipairs(W.batches) do
      for _, m in ipairs(batch) do
        if not left[m] then whole[#whole + 1] = m end
      end
    end
    K.whole = whole
  end
  local spent = W.from - (#W.heads - W.i) + W.extra
  if budget then budget = budget - spent end
  -- Members behind the last one visited: true, false, or nil (not read: maybe).
  local behind = W.i < #W.heads or nil
  if not behind and not W.full then behind = false end
  return stopped, spent >= limit, #out, behind
end

-- (the watchers' choice goes on in queue_watch.lua)
