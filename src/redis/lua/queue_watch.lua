-- (queue.lua's queue layer, continued: assembled after queue_walk.lua) The watchers' choice
-- (see "Watchers" in queue.lua).

-- Adds watchers to `C.chosen` (two at most) from `C.cands` (the current ones first), then
-- from the back of the queue: processes not chosen yet, fresh ones only with `fresh_only`, a
-- skipped process (`C.skips`) only with `allow_skip`, never process `except`.
function Key.pick(K, C, fresh_only, allow_skip, except)
  local j = 1
  while #C.chosen < 2 do
    if j > #C.cands then
      -- New watchers come from the back of the queue (its last 16 members), read only when
      -- the current ones do not do (a busy queue keeps its watchers), and from the back in
      -- two reads, the last 4 members first: `pick` goes back to front and most often stops
      -- there. (The choice is the one a single read of all 16 would make.)
      if C.tail_read == 2 then return end
      C.tail_read = C.tail_read + 1
      local tail
      if C.tail_read == 1 then
        tail = K:members(-4, -1)
      else
        tail = K:members(-16, -5)
      end
      -- (Fewer than 4: the queue has no more.)
      if #tail < 4 then C.tail_read = 2 end
      -- (Parsed when looked at: most are not.)
      for k = #tail, 1, -1 do C.cands[#C.cands + 1] = {m = tail[k]} end
      K:know(tail, #tail)
      if j > #C.cands then return end
    end
    local c = C.cands[j]
    j = j + 1
    if c.p == nil then c.p = parse_member(c.m) or false end
    local wpid = c.p and c.p.pid
    if wpid and not C.pids[wpid] and (allow_skip or not C.skips[wpid]) and wpid ~= except then
      local p = K:process(c.p)
      if p.is ~= 'gone' and (p.is == 'fresh' or not fresh_only) then
        C.pids[wpid] = true
        c.how = p.how
        C.chosen[#C.chosen + 1] = c
      end
    end
  end
end

-- The current watchers (of `was`, the fields read) that are still queued, with what is known
-- of their processes: the first candidates.
function Key.current_watchers(K, was)
  local cands, cur = {}, {}
  for i = 1, 2 do
    local m, at = watcher_of(was[i])
    local p = m and parse_member(m)
    if p then cur[#cur + 1] = {m = m, at = at, p = p} end
  end
  if #cur > 0 then
    K:know({cur[1].m, cur[2] and cur[2].m}, 2)
    local score = K:queued({cur[1].m, (cur[2] or cur[1]).m})
    for j, c in ipairs(cur) do
      if score[j] then cands[#cands + 1] = c end
    end
  end
  return cands
end

-- Keeps the watchers fit after a change: `skip` the process of a new holder (its watchers
-- would fail with it), `px` the lease that now ends first (ms from now; 0: the key is free,
-- look now). Two watchers of two other processes, fresh ones first (a frozen process is not
-- fresh), current ones before new ones (a new one costs a message); when fewer than two
-- other processes wait, from the skipped one too. A kept watcher that would look later than
-- the lease ends is told again; with `later` (a refresh) also one that would look earlier, so
-- that watchers of a lock held long make no calls. Permits pass `skip` as a set of pids (the
-- holders' processes) and `fill`: both fields are filled, from the skipped processes when no
-- other is left, `last` (the process whose lease ends first) last. `kept`: the caller gives
-- the processes hash its expiry after this call (else a hash this call made gets one).
-- `holder` (a lock's change of holder): the new holder's pid, '!h', written with the
-- watchers (and the due record, see `seen`) in one HSET, where a field changes ('': not
-- known, '!h' goes).
function Key.watch(K, skip, px, later, fill, last, kept, holder)
  local skips = skip
  if type(skip) ~= 'table' then skips = {[skip] = true} end
  local until_ms = math.floor(now_us() / 1000) + px
  local was = K.ahead_was or K:read_fields()
  K:ahead(false)
  K:use_hint(was)
  local C = {cands = K:current_watchers(was), chosen = {}, pids = {}, tail_read = 0,
    skips = skips}
  K:pick(C, true, false)
  K:pick(C, false, false)
  -- Fewer than two other processes wait: the second watcher (or both) from the holder's
  -- own process, better than none. (A holder that overstays its lease without a fault,
  -- with the only other process frozen, would leave its own process's waiters asleep.)
  if #C.chosen < 2 or fill then
    if fill and last then K:pick(C, false, true, last) end
    K:pick(C, false, true)
  end
  -- Written only where a field changes (a kept watcher that is not told again keeps its),
  -- in one HSET (then one HDEL: the hash is not emptied on the way).
  local writes, fresh, gone = {}, 0, {}
  local function put(n, field, v)
    if was[n] == v then return end
    writes[#writes + 1] = field
    writes[#writes + 1] = v
    if not was[n] then fresh = fresh + 1 end
  end
  for i = 1, 2 do
    local c = C.chosen[i]
    if c then
      if not c.at or until_ms < c.at or (later and until_ms > c.at) then
        publish(c.how, K:chan_of(c.p), 'w3 ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' .. c.p.token)
        c.at = until_ms
      end
      put(i, WATCHERS[i], string.format('%.0f', c.at) .. ' ' .. c.m)
    elseif was[i] then
      gone[#gone + 1] = WATCHERS[i]
    end
  end
  if holder == '' then
    if was[3] then gone[#gone + 1] = '!h' end
  elseif holder then
    put(3, '!h', holder)
  end
  K:flush(writes, fresh)
  if #gone > 0 then redis.call('HDEL', K.pkey, unpack(gone)) end
  -- (`kept`: the caller sets the hash's expiry after this.)
  if #C.chosen > 0 and not kept then K:retain() end
end

-- Whether the watchers of `was` (the fields read) fit a grant of `px` ms from now: both
-- fields set, both still queued, and each looks no later than the new lease ends.
function Key.watchers_fit(K, was, px)
  local until_ms = math.floor(now_us() / 1000) + px
  local ms = {}
  for i = 1, 2 do
    local m, at = watcher_of(was[i])
    if not m or at > until_ms then return false end
    ms[i] = m
  end
  local score = K:queued(ms)
  return score[1] and score[2]
end

-- Protocol 4's watchers at a one-key grant to process `pid` for `px` ms, its holder now
-- (model: `watch_granted`): kept as they are when they fit (`watchers_fit`); then nothing is
-- read of their processes and nobody is told, and only '!h' (with the due record) is written
-- where it changes. Else chosen again (`watch`). A watcher of `pid`'s process, or one whose
-- process died meanwhile, stays (until a newcomer of another process takes the field of the
-- holder's: `watching`; until a walk drops a dead one): the other, always of another
-- process, looks (docs/design.md, "The grant").
function Key.watch_granted(K, pid, px)
  local was = K.ahead_was or K:read_fields()
  if not K:watchers_fit(was, px) then return K:watch(pid, px, nil, nil, nil, true, pid) end
  K:ahead(false)
  K:use_hint(was)
  if was[3] == pid then
    K:flush({}, 0)
  else
    K:flush({'!h', pid}, was[3] and 0 or 1)
  end
end

-- `member` (MEMBER if nil), just queued with the lease that ends first ending in `pttl` ms
-- (-1: no lease to look at, NO_LEASE): whether it watches the key (it is a watcher already,
-- or takes a free field); records when it will look. The two watchers stay in two
-- processes (one process's fault must not silence both), and a newcomer of another process
-- replaces a watcher of a holder's process (which would fail with the holder): `holding` is
-- the set of the holders' processes (nil: a lock's, its '!h').
function Key.watching(K, pttl, holding, member)
  member = member or MEMBER
  local ms, pids = {}, {}
  local was = K:read_fields()
  K:use_hint(was)
  for i = 1, 2 do
    ms[i] = watcher_of(was[i])
    pids[i] = ms[i] and string.match(ms[i], '^(%S+) ')
  end
  local function fits(i) return pids[3 - i] ~= PID end
  local mine = nil
  for i = 1, 2 do
    if ms[i] == member then mine = i end
  end
  if not mine then
    for i = 1, 2 do
      if not mine and not ms[i] and fits(i) then mine = i end
    end
  end
  if not mine and not holding then
    -- A lock's holder, as recorded ('!h').
    holding = {}
    if was[3] then holding[was[3]] = true end
  end
  if not mine and not holding[PID] then
    for i = 1, 2 do
      if not mine and pids[i] and holding[pids[i]] and fits(i) then mine = i end
    end
  end
  -- (One HSET, with the due record, see `seen`. The hash's expiry is the caller's: it keeps
  -- the queue.)
  if not mine then
    K:flush({}, 0)
    return 0
  end
  if pttl == -1 then pttl = NO_LEASE elseif pttl < 0 then pttl = 0 end
  local v = string.format('%.0f', math.floor(now_us() / 1000) + pttl) .. ' ' .. member
  if was[mine] == v then
    K:flush({}, 0)
  else
    K:flush({WATCHERS[mine], v}, was[mine] and 0 or 1)
  end
  return 1
end

-- The end of a queueing attempt, MEMBER queued behind a lease that ends in `pttl` ms (`f`:
-- the latest fence, `holding`: as for `watching`, `life`: a function giving the lease a new
-- queue must outlive, `pttl` if nil): whether the caller listens, the watchers, and a new
-- queue's life. Returns the 'queued' reply: {HELD, pttl, 1, listening, fence, watching, Redis
-- time us, depth} (listening 0: nobody listens on the caller's grant channel, e.g. Redis
-- dropped it when a Cluster slot moved; watching 1: the caller looks when the lease ends;
-- depth: the queue's length now, the caller included, counted (ZCARD) only with FLAG 'd', for
-- the queue-depth metric, or when `add_member` did not learn whether the caller is alone; 0:
-- not counted).
function Key.queued_reply(K, pttl, f, holding, life)
  local listening = 0
  if K:listener(PID) then listening = 1 end
  local watcher = K:watching(pttl, holding)
  local depth = 0
  if K.alone then
    depth = 1
  elseif FLAG == 'd' or K.alone == nil then
    depth = redis.call('ZCARD', K.q)
  end
  -- The first member of a queue gives it (and the processes hash) the lease plus the
  -- retention. A queue that already had members has that life at least: from its first
  -- member, or from the last call that set a lease since (they all `keep` it).
  if depth == 1 then K:keep(life and life() or pttl, true) end
  return {HELD, pttl, 1, listening, f, watcher, now_us(), depth}
end
