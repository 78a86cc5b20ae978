-- Acquire; when the lock is held and MEMBER is given, queue MEMBER.
-- Reply: {0, ttl, fence} acquired; {1, pttl, fence} this token holds it already (a grant it had
-- not read yet is confirmed here and answered {3, ttl, fence}); {2, pttl, 0} another token holds
-- it (pttl -1: no expiry); {2, pttl, 1, listening, fence} the same, and MEMBER is queued;
-- listening 0 says nobody listens on its process's grant channel (Redis dropped the
-- subscription, e.g. when a Cluster slot moved): grants cannot reach it until it subscribes
-- again; fence is the latest fence now: a grant message with a fence not above it was
-- published before this call (a grant that lapsed) and must not be used.
local lock, fkey = KEYS[1], KEYS[2]
local cur = redis.call('SET', lock, 'p' .. TOKEN, 'NX', 'PX', TTL, 'GET')
if not cur then
  local f, old = next_fence(fkey, FTTL, false, nil)
  local _, queued, pending = fence_parse(old)
  if not queued then return {0, tonumber(TTL), f} end
  -- Waiters may be queued: they come first. A grant that lapsed unconfirmed means its process
  -- is frozen or gone: its other waiters go too (unless the caller is of that process).
  local L = slow()
  if pending and string.match(MEMBER, '^(%S+)') ~= pending then L.purge(pending) end
  local got, px = L.grant_next(MEMBER)
  if got == 'self' or not got then
    local more = redis.call('ZCARD', KEYS[3]) > 0
    if more then redis.call('SETRANGE', lock, 0, 'q') end
    L.fence_flags(fkey, more, nil)
    return {0, tonumber(TTL), f}
  end
  if MEMBER == '' then return {2, px, 0} end
  local listening = L.enqueue()
  return {2, px, 1, listening, (fence_parse(redis.call('GET', fkey)))}
end
local state, holder = string.sub(cur, 1, 1), string.sub(cur, 2)
if holder == TOKEN then
  if state == 'g' then return {3, tonumber(TTL), slow().confirm_grant()} end
  return {1, redis.call('PTTL', lock), (fence_parse(redis.call('GET', fkey)))}
end
local pttl = redis.call('PTTL', lock)
if MEMBER == '' then return {2, pttl, 0} end
if state == 'p' then redis.call('SETRANGE', lock, 0, 'q') end
local listening = slow().enqueue()
return {2, pttl, 1, listening, (fence_parse(redis.call('GET', fkey)))}
