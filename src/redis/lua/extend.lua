-- Extend: the full TTL again if TOKEN holds the lock; the lock's watchers are told when the
-- lease now ends (they make no call while it is refreshed). Reply {0} not held; {1} extended;
-- {1, fence} a short grant confirmed (the fence of the hold).
local cur = redis.call('GET', KEYS[1])
if not cur or holder_of(cur) ~= TOKEN then return {0} end
local state = state_of(cur)
if state == GRANTED then
  local L = slow()
  local f = L.confirm_grant()
  L.watch(nil, tonumber(TTL), true)
  return {1, f}
end
if state == HANDED then redis.call('SETRANGE', KEYS[1], 0, QUEUED) end
redis.call('PEXPIRE', KEYS[1], TTL)
if state ~= TAKEN then
  -- Waiters may be queued: the fence counter, which says so, lives on with the lock.
  redis.call('PEXPIRE', KEYS[2], RETAIN)
  slow().watch(nil, tonumber(TTL), true)
end
return {1}
