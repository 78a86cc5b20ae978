-- Model: `Queue::extend` in model/src/lib.rs mirrors this script (change both together).
-- Extend: the full TTL again if TOKEN holds the lock; the lock's watchers are told when the
-- lease now ends (they make no call while it is refreshed). Reply {0} not held; {1, fence}
-- extended ({1} when the fence counter is gone: only after the retention); {3, fence} a short
-- grant confirmed. The fence is the hold's, as Redis has it: a caller's copy (a grant
-- message's, an attempt's) may be older.
local cur = redis.call('GET', KEYS[1])
if not cur or holder_of(cur) ~= TOKEN then return {0} end
local state = state_of(cur)
if state == GRANTED then
  local L = slow()
  local f = L.confirm_grant()
  L.watch(HUB, tonumber(TTL), true)
  return {3, f}
end
if state == HANDED then redis.call('SETRANGE', KEYS[1], 0, QUEUED) end
redis.call('PEXPIRE', KEYS[1], TTL)
-- The fence counter lives on with the lock (it also says whether waiters may be queued).
local fv = redis.call('GETEX', KEYS[2], 'PX', RETAIN)
-- The watchers skip the holder's (the caller's) process.
if state ~= TAKEN then slow().watch(HUB, tonumber(TTL), true) end
if not fv then return {1} end
return {1, (fence_parse(fv))}
