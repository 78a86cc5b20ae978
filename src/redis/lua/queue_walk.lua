  -- (queue.lua's queue layer, continued: assembled right after it, inside `queue`)
  -- The walk, the grants and the watchers' choice, built (once) only when a call needs them:
  -- a queueing attempt or a watcher's look does not (their closures were 6% of its time).
  local walk_fns, walk_reset
  local function walking()
    if walk_fns then return walk_fns end
    local function publish(how, chan, msg)
      if how == 's' then
        redis.call('SPUBLISH', chan, msg)
      else
        redis.call('PUBLISH', chan, msg)
      end
    end

    local known = {}

    -- Tells `token`'s waiter in process `pid` that it holds the key for `px` ms with fence `f`,
    -- from Redis' time now: the 'g2' message. `how`: how it listens, or true when a walk did
    -- not ask (`probe`): the message itself asks, sharded (classic where Redis has no sharded
    -- pub/sub), and the number of its receivers says whether the process listens. Returns how it listens (nil: nobody heard
    -- it, and the process is known gone for the rest of the call).
    local function grant(how, pid, f, px, token)
      local chan = channel(pid)
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
      local k = known[pid]
      if not how then
        known[pid] = {is = 'gone'}
      elseif k then
        k.how, k.probe = how, nil
      end
      return how
    end

    -- What a queue walk knows of each listener of a member (asked once per call), by its
    -- channel (`known`, above): listening how, and 'fresh' (its process seen on this key within
    -- the presence window), 'stale' (listening, not seen lately) or 'gone' (nobody listens, or
    -- its process's short grant lapsed). `probe`: the listeners were not asked (a grant's walk,
    -- whose message asks: `grant`), 'fresh' or 'stale' by the record alone, `rec` kept.
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

    -- Learns what `known` says of each of the members `ms` (strings; `n` of them, some may be
    -- false) not known yet, in one read of their processes' records (none for those whose
    -- record `pre` has, from `read_fields`, or a probe kept) and one (or, for classic pub/sub,
    -- two) of their listeners, whatever their number. `probe`: one-key waiters' listeners are
    -- not asked (see `judge`); without it, what a probe left is asked.
    local function know(ms, n, pre, probe)
      local ask, pids, unread, asked, wanted = {}, {}, {}, {}, {}
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
        local r = redis.call('HMGET', pkey, unpack(unread))
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
        if pid == due then recs[j] = math.floor(now_us() / 1000) end
        if recs[j] ~= LAPSED and not (probe and who == pid) then
          live[#live + 1] = (who == pid) and channel(pid) or who
          of[#live] = j
        end
      end
      local hows = {}
      for k, how in pairs(listeners(live)) do hows[of[k]] = how end
      for j, who in ipairs(ask) do
        known[who] = judge(recs[j], hows[j], probe and who == pids[j])
      end
    end

    -- What `known` says of parsed member `m`'s listener (`probe`: as `know`'s).
    local function process(m, probe)
      local k = known[m.who]
      if not k or (k.probe and not probe) then
        know({m.member}, 1, nil, probe)
        k = known[m.who]
      end
      return k
    end

    -- A grant's walk (after `ahead(true)`) reads the watcher fields and '!h' with its first
    -- heads' records, in one HMGET, for the `watch_granted` (or `watch`) that follows (nothing
    -- writes those fields in between); and it does not ask whether its heads' processes listen:
    -- its grant's message asks (`probe`, `grant`).
    local ahead_on, ahead_was = false, nil

    -- The queue as this call's last walk read it to its end, in order, less the members that
    -- walk took out (nil: no such walk, or a queue was written since: see `queue_writes`).
    -- The watchers' choice reads members from it instead of from Redis: a short queue is read
    -- once per call.
    local whole = nil
    local function whole_now()
      if whole and whole.at == queue_writes then return whole end
      return nil
    end

    -- Whether each of the members `ms` (strings) is queued: ZMSCORE, or `whole`.
    local function queued(ms)
      local w = whole_now()
      if not w then return redis.call('ZMSCORE', q, unpack(ms)) end
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
    local function members(a, b)
      local w = whole_now()
      if not w then return redis.call('ZRANGE', q, a, b) end
      local r = {}
      for k = math.max(1, #w + a + 1), #w + b + 1 do r[#r + 1] = w[k] end
      return r
    end

    -- Walks the queue from its head, SCAN members at most: the one dead-head scan of every
    -- script. A member whose process is gone (nobody listens, or it lapsed) is dropped (a set's
    -- from each of its queues, at once: `fns.sets().gone`, the lock's; each of its other keys
    -- counts as a member against the bound); a lapsed process that still listens
    -- is told ('d2') once, so its waiters do not sleep out of the queue. `visit(m)` sees every
    -- other member, the caller's own too (`m.own`: `self`, or any member of `own_token`), with
    -- `m.pid`, `m.ttl`, `m.token`, `m.set` (and a set's `m.chan`), and `m.p` (`process(m)`, not for the
    -- caller's own) and answers 'take' (it leaves the queue and the walk goes on), 'last' (it
    -- leaves and the walk ends), 'stop' (it stays and the walk ends), 'gone' (a set found
    -- departed though its process listens: dropped as a gone one, and told 'd2') or nil (it
    -- stays and the walk goes on). A malformed member is dropped. The members that leave go in one ZREM.
    -- Returns whether the walk ended by `visit`, whether it saw all the members it could (more
    -- may be left), how many left the queue, and whether members are left behind the last one
    -- it visited (nil: not known without asking).
    local function walk(self, own_token, visit)
      local out, stopped = {}, false
      -- Every batch of members read, in order, and whether a read reached the queue's end
      -- (then they are the whole queue, as no queue was written during the walk: `whole`).
      local batches, ended, writes0 = {}, false, queue_writes
      whole = nil
      local limit = SCAN
      if budget then limit = math.max(0, math.min(SCAN, budget)) end
      -- Heads are read a few at a time (most walks stop at the first live one), `limit` at
      -- most: `from` heads read so far, `heads` the last batch, `i` its members visited;
      -- `extra`: what the departed sets dropped from their other queues cost (a key each).
      local from, heads, i, size, full, extra = 0, {}, 0, 8, limit > 0, 0
      local function next_head()
        -- (members visited, and what departed sets cost: `limit` at most)
        local spent = from - (#heads - i) + extra
        if spent >= limit then return nil end
        if i == #heads then
          if not full then return nil end
          local n = math.min(size, limit - spent)
          heads = redis.call('ZRANGE', q, from, from + n - 1)
          full, from, i, size = #heads == n, from + #heads, 0, math.min(size * 4, SCAN)
          ended = not full
          batches[#batches + 1] = heads
          if #heads == 0 then return nil end
          local pre, n = nil, #heads
          if ahead_on and not ahead_was then
            -- (The first two heads' records in the same HMGET as the watcher fields; a
            -- grant's walk learns the others', by record only, when it reaches them: most
            -- stop at the first. The batch is read whole all the same: `whole`.)
            n = math.min(n, 2)
            local pids = {}
            for k = 1, n do pids[k] = string.match(heads[k], '^%S+') end
            ahead_was, pre = read_fields(pids)
          end
          know(heads, n, pre, ahead_on)
        end
        i = i + 1
        return heads[i]
      end
      while true do
        local head = next_head()
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
            m.p = process(m, ahead_on)
            if m.p.lapsed and not m.p.told then
              -- Its waiters are dropped: if it still listens (it was frozen, not dead), they must
              -- know, or they sleep with nobody to wake them.
              m.p.told = true
              local chan = chan_of(m)
              local how = listeners({chan})[1]
              if how then publish(how, chan, 'd2') end
            end
            if m.p.is == 'gone' then
              verdict = 'take'
              -- (At once: a live set behind it is then judged against its other queues as
              -- they are without it.)
              if m.set and fns.sets then
                extra = extra + #m.set - 1
                fns.sets().gone(m)
              end
            else
              verdict = visit(m)
              if verdict == 'gone' then
                -- A set the visit found departed (missing from another of its queues: see
                -- `set_ready`) though its process listens: dropped as a gone one is, and told,
                -- so that it queues again (at the back of every queue) when it acts.
                verdict = 'take'
                extra = extra + #m.set - 1
                publish(m.p.how, chan_of(m), 'd2')
                fns.sets().gone(m)
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
      local kept = ended and queue_writes == writes0
      if #out > 0 then
        redis.call('ZREM', q, unpack(out))
        queue_written()
      end
      if kept then
        local left = {}
        for _, m in ipairs(out) do left[m] = true end
        whole = {at = queue_writes}
        for _, batch in ipairs(batches) do
          for _, m in ipairs(batch) do
            if not left[m] then whole[#whole + 1] = m end
          end
        end
      end
      local spent = from - (#heads - i) + extra
      if budget then budget = budget - spent end
      -- Members behind the last one visited: true, false, or nil (not read: maybe).
      local behind = i < #heads or nil
      if not behind and not full then behind = false end
      return stopped, spent >= limit, #out, behind
    end

    -- `ahead(true)`: the next walk reads the watchers' fields for the `watch` that follows (see
    -- `ahead_on`); `ahead(false)`: no `watch` follows, or a field was written (forgotten).
    local function ahead(on)
      ahead_on, ahead_was = on, nil
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
    local function watch(skip, px, later, fill, last, kept, holder)
      local skips = skip
      if type(skip) ~= 'table' then skips = {[skip] = true} end
      local until_ms = math.floor(now_us() / 1000) + px
      local cands, was = {}, ahead_was or read_fields()
      ahead(false)
      use_hint(was)
      local cur = {}
      for i = 1, 2 do
        local m, at = watcher_of(was[i])
        local p = m and parse_member(m)
        if p then cur[#cur + 1] = {m = m, at = at, p = p} end
      end
      if #cur > 0 then
        know({cur[1].m, cur[2] and cur[2].m}, 2)
        local score = queued({cur[1].m, (cur[2] or cur[1]).m})
        for j, c in ipairs(cur) do
          if score[j] then cands[#cands + 1] = c end
        end
      end
      local chosen, pids, tail_read = {}, {}, 0
      local function pick(fresh_only, allow_skip, except)
        local j = 1
        while #chosen < 2 do
          if j > #cands then
            -- New watchers come from the back of the queue (its last 16 members), read only
            -- when the current ones do not do (a busy queue keeps its watchers), and from the
            -- back in two reads, the last 4 members first: `pick` goes back to front and most
            -- often stops there. (The choice is the one a single read of all 16 would make.)
            if tail_read == 2 then return end
            tail_read = tail_read + 1
            local tail
            if tail_read == 1 then
              tail = members(-4, -1)
            else
              tail = members(-16, -5)
            end
            -- (Fewer than 4: the queue has no more.)
            if #tail < 4 then tail_read = 2 end
            -- (Parsed when looked at: most are not.)
            for k = #tail, 1, -1 do cands[#cands + 1] = {m = tail[k]} end
            know(tail, #tail)
            if j > #cands then return end
          end
          local c = cands[j]
          j = j + 1
          if c.p == nil then c.p = parse_member(c.m) or false end
          local wpid = c.p and c.p.pid
          if wpid and not pids[wpid] and (allow_skip or not skips[wpid]) and wpid ~= except then
            local p = process(c.p)
            if p.is ~= 'gone' and (p.is == 'fresh' or not fresh_only) then
              pids[wpid] = true
              c.how = p.how
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
        local c = chosen[i]
        if c then
          if not c.at or until_ms < c.at or (later and until_ms > c.at) then
            publish(c.how, chan_of(c.p), 'w3 ' .. px .. ' ' .. string.format('%.0f', now_us()) .. ' ' .. c.p.token)
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
      flush(writes, fresh)
      if #gone > 0 then redis.call('HDEL', pkey, unpack(gone)) end
      -- (`kept`: the caller sets the hash's expiry after this.)
      if #chosen > 0 and not kept then retain() end
    end

    -- Protocol 4's watchers at a one-key grant to process `pid` for `px` ms, its holder now
    -- (model: `watch_granted`): kept as they are when both fields are set, both watchers are
    -- still queued and each looks no later than the new lease ends; then nothing is read of
    -- their processes and nobody is told, and only '!h' (with the due record) is written where
    -- it changes. Else chosen again (`watch`). A watcher of `pid`'s process, or one whose
    -- process died meanwhile, stays (until a newcomer of another process takes the field of the
    -- holder's: `watching`; until a walk drops a dead one): the other, always of another
    -- process, looks (docs/design.md, "The grant").
    local function watch_granted(pid, px)
      local was = ahead_was or read_fields()
      local function fit()
        local until_ms = math.floor(now_us() / 1000) + px
        local ms = {}
        for i = 1, 2 do
          local m, at = watcher_of(was[i])
          if not m or at > until_ms then return false end
          ms[i] = m
        end
        local score = queued(ms)
        return score[1] and score[2]
      end
      if not fit() then return watch(pid, px, nil, nil, nil, true, pid) end
      ahead(false)
      use_hint(was)
      if was[3] == pid then
        flush({}, 0)
      else
        flush({'!h', pid}, was[3] and 0 or 1)
      end
    end

    -- (What a call learnt, forgotten by the next: `reset_call`.)
    walk_reset = function()
      known = {}
      ahead_on, ahead_was, whole = false, nil, nil
    end
    walk_fns = {publish = publish, grant = grant, process = process, walk = walk, ahead = ahead,
      watch = watch, watch_granted = watch_granted}
    return walk_fns
  end

  -- `member` (MEMBER if nil), just queued with the lease that ends first ending in `pttl` ms
  -- (-1: no lease to look at, NO_LEASE): whether it watches the key (it is a watcher already,
  -- or takes a free field); records when it will look. The two watchers stay in two
  -- processes (one process's fault must not silence both), and a newcomer of another process
  -- replaces a watcher of a holder's process (which would fail with the holder): `holding` is
  -- the set of the holders' processes (nil: a lock's, its '!h').
  local function watching(pttl, holding, member)
    member = member or MEMBER
    local ms, pids = {}, {}
    local was = read_fields()
    use_hint(was)
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
      flush({}, 0)
      return 0
    end
    if pttl == -1 then pttl = NO_LEASE elseif pttl < 0 then pttl = 0 end
    local v = string.format('%.0f', math.floor(now_us() / 1000) + pttl) .. ' ' .. member
    if was[mine] == v then
      flush({}, 0)
    else
      flush({WATCHERS[mine], v}, was[mine] and 0 or 1)
    end
    return 1
  end

  -- The end of a queueing attempt, MEMBER queued behind a lease that ends in `pttl` ms (`f`:
  -- the latest fence, `holding`: as for `watching`, `life`: a function giving the lease a new
  -- queue must outlive, `pttl` if nil): whether the caller listens, the watchers, and a new
  -- queue's life. Returns
  -- the 'queued' reply: {HELD, pttl, 1,
  -- listening, fence, watching, Redis time us, depth} (listening 0: nobody listens on the
  -- caller's grant channel, e.g. Redis dropped it when a Cluster slot moved; watching 1: the
  -- caller looks when the lease ends; depth: the queue's length now, the caller included,
  -- counted (ZCARD) only with FLAG 'd', for the queue-depth metric, or when `add_member` did
  -- not learn whether the caller is alone; 0: not counted).
  local function queued_reply(pttl, f, holding, life)
    local listening = 0
    if listener(PID) then listening = 1 end
    local watcher = watching(pttl, holding)
    local depth = 0
    if alone then
      depth = 1
    elseif FLAG == 'd' or alone == nil then
      depth = redis.call('ZCARD', q)
    end
    -- The first member of a queue gives it (and the processes hash) the lease plus the
    -- retention. A queue that already had members has that life at least: from its first
    -- member, or from the last call that set a lease since (they all `keep` it).
    if depth == 1 then keep(life and life() or pttl, true) end
    return {HELD, pttl, 1, listening, f, watcher, now_us(), depth}
  end

  -- A later call's start with this group (kept by the library: `kept_group`): what the call
  -- before learnt is forgotten, and the windows are this call's.
  local function reset_call()
    alone, hint, due, due_rec = nil, nil, nil, nil
    SLACK = math.floor(tonumber(RETAIN) / 4)
    MARGIN = math.floor(SLACK / 2)
    YOUNG = math.floor(PRESENCE / 4)
    if walk_reset then walk_reset() end
  end

  fns = setmetatable({channel = channel, listener = listener, listeners = listeners,
    split_member = split_member, parse = parse_member, add_member = add_member, retain = retain,
    keep = keep, seen = seen, flush = flush, lapse = lapse, watching = watching,
    queued_reply = queued_reply, reset_call = reset_call},
    {__index = function(t, name)
      -- (Only the walk group: `sets`, a hook the lock sets, may be absent.)
      if name == 'sets' then return nil end
      local more = walking()
      for k, f in pairs(more) do rawset(t, k, f) end
      return more[name]
    end})
  return fns
end

