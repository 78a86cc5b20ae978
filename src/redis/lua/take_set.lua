-- Take a set of locks in one call, all or none: each lock as `acquire.lua`'s free path takes
-- it (state 'p', PX = ttl, the next fence), and only when every lock of the set is free and
-- no waiters may be queued on it (a queued key goes to its waiters first, as for one key).
-- It runs on its own, without the queue layer's prelude (its top level runs on every call),
-- so it repeats the facts of `lock.lua` it needs: a value is one state letter then the
-- holder's token, 'p' is a lock taken free, and a fence value is "<fence>" or, when waiters
-- may be queued, "<fence> q..."; the next fence is max(previous + 1, Redis TIME in µs), and
-- the counter lives the lease plus the retention.
--
-- Model: a set's one-shot attempt, all of its keys in one step (model/src/sets.rs: it never
-- waits and never takes a key with waiters queued, so to every other waiter it is one
-- acquire that took free keys, or nothing); each key's writes are `Queue::acquire`'s on a
-- free lock with no queue.
--
-- KEYS: lock 1, fence 1, lock 2, fence 2, ... (one Cluster slot). At most 256 locks: the
-- caller splits a larger set (src/sets/at_once.rs).
-- ARGV: retention ms, ttl ms (or 'check': only look, write nothing, and answer {0} where the
-- set would be taken), then token 1, token 2, ...
-- Reply: {0, fence 1, fence 2, ...} every lock taken (a lock its token holds already in state
-- 'p', the call sent again, counts as taken, with its fence); {2, i, pttl} lock i is held
-- (pttl -1: no expiry), nothing written; {2, i, -3} lock i is free but waiters may be queued
-- (or its fence value is not one this script reads), nothing written; {7, i, 1} lock i's key
-- (or {7, i, 2}: its fence counter) holds another type of value, nothing written.
local RETAIN, TTL = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = #KEYS / 2
local locks, fences = {}, {}
for i = 1, n do
  locks[i], fences[i] = KEYS[2 * i - 1], KEYS[2 * i]
end
local cur = redis.call('MGET', unpack(locks))
local fv = redis.call('MGET', unpack(fences))
-- MGET reads a key of another type as absent: a SET would overwrite it.
local absent = {}
for i = 1, n do
  if not cur[i] then absent[#absent + 1] = locks[i] end
  if not fv[i] then absent[#absent + 1] = fences[i] end
end
if #absent > 0 and redis.call('EXISTS', unpack(absent)) > 0 then
  for i = 1, n do
    if not cur[i] and redis.call('EXISTS', locks[i]) == 1 then return {7, i, 1} end
    if not fv[i] and redis.call('EXISTS', fences[i]) == 1 then return {7, i, 2} end
  end
end
local prev, own = {}, {}
for i = 1, n do
  local v, f = cur[i], fv[i]
  if v then
    if string.sub(v, 2) == ARGV[2 + i] and string.sub(v, 1, 1) == 'p' and f and string.match(f, '^%d+$') then
      own[i] = true
      prev[i] = tonumber(f)
    else
      return {2, i, redis.call('PTTL', locks[i])}
    end
  elseif f and not string.match(f, '^%d+$') then
    return {2, i, -3}
  else
    prev[i] = tonumber(f) or 0
  end
end
if ARGV[2] == 'check' then return {0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {0}
for i = 1, n do
  local f = prev[i]
  if not own[i] then
    f = math.max(f + 1, now)
    redis.call('SET', locks[i], 'p' .. ARGV[2 + i], 'PX', TTL)
    redis.call('SET', fences[i], string.format('%.0f', f), 'PX', RETAIN + TTL)
  end
  out[i + 1] = f
end
return out
