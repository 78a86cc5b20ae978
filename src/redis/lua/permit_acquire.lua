-- Model: `Permits::acquire` in model/ mirrors this script (change both together).
-- Acquire TOKEN's weight in permits of a key of ARGV[10] permits; when they do not fit (or
-- waiters are queued, who come first) and MEMBER is given, queue MEMBER. Replies as
-- acquire.lua's, pttl being the time until the first lease ends: {0, ttl, fence} acquired;
-- {1, pttl, fence} this token holds them already; {2, pttl, 0[, 1]} not now (1: waiters are
-- queued); {2, pttl, 1, listening, fence, watching, time, depth} not now, MEMBER queued; and
-- {5, limit}: the key has `limit` permits while someone holds or waits (nothing changed but
-- the dropping of waiters whose process is gone).
local w, asked = weight_of(TOKEN), tonumber(ARGV[10])
if not w or not asked or w < 1 or w > asked then
  return redis.error_reply('ERR waitlock: a permit token is w<weight>:<id>, 1 <= weight <= permits')
end
local s = state()
if s.limit ~= asked then
  -- In use: someone holds, or a waiter whose process listens waits (waiters of processes
  -- gone are dropped here, 200 at most, so that a crash does not pin the limit for the
  -- queue's retention).
  if s.limit and (redis.call('EXISTS', HOLDERS) == 1 or not drop_dead()) then
    return {OTHER_LIMIT, s.limit}
  end
  s.limit, s.changed = asked, true
end
local before = s.used
purge(s)
local score = redis.call('ZSCORE', HOLDERS, TOKEN)
if score then
  local left = tonumber(score) - now_ms()
  if left > 0 then
    -- Granted already (its message lost, or crossing this call): claimed now, so that a late
    -- message cannot have it given back.
    local f = claim(TOKEN)
    serve_freed(s, before, false)
    settle(s)
    return {HELD_BY_CALLER, left, f}
  end
  drop_holder(s, TOKEN)
end
local L = nil
if redis.call('EXISTS', PQ) == 1 then
  -- Waiters are queued: they come first, the caller among them if it is queued.
  L = queue()
  local mine, changed = serve(L, s, MEMBER, TOKEN)
  if changed then after_serve(L, s) end
  if mine then
    settle(s)
    return {ACQUIRED, tonumber(TTL), mine}
  end
end
local queued = redis.call('EXISTS', PQ)
if queued == 0 and s.used + w <= s.limit then
  local f = hold(s, TOKEN, tonumber(TTL), false)
  settle(s)
  return {ACQUIRED, tonumber(TTL), f}
end
local pttl = first_end()
if MEMBER == '' then
  settle(s)
  if queued == 1 then return {HELD, pttl, 0, 1} end
  return {HELD, pttl, 0}
end
L = L or queue()
-- (The record is written with the watcher's field: `queued_reply`.)
L:seen(PID, true)
L:add_member()
settle(s)
-- A new queue lives as long as the last lease, and the retention after it (see `keep`).
return L:queued_reply(pttl, s.fence, holding(), function()
  local last = redis.call('ZRANGE', HOLDERS, -1, -1, 'WITHSCORES')
  return last[2] and (tonumber(last[2]) - now_ms()) or 0
end)
