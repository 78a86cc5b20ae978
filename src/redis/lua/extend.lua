-- Model: `Queue::extend` in model/ mirrors this script (change both together).
-- Extend: the full TTL again if TOKEN holds the lock; the lock's watchers are told when the
-- lease now ends (they make no call while it is refreshed). Reply {0} not held; {1, fence}
-- extended; {3, fence} a short grant confirmed. The fence is the hold's, as Redis has it: a caller's copy (a grant
-- message's, an attempt's) may be older.
local cur = redis.call('GET', KEYS[1])
-- (A key reserved for a set is nobody's yet: its set takes it by set_acquire.lua.)
if not cur or holder_of(cur) ~= TOKEN or state_of(cur) == RESERVED then return {NOT_HELD} end
local state = state_of(cur)
if state == GRANTED then
  local L = lock_key()
  local f = L:confirm_grant()
  return {GRANT_CONFIRMED, f}
end
if state == HANDED then redis.call('SETRANGE', KEYS[1], 0, QUEUED) end
redis.call('PEXPIRE', KEYS[1], TTL)
-- The fence counter lives on with the lock, the lease and the retention (it also says whether
-- waiters may be queued).
local fv = redis.call('GETEX', KEYS[2], 'PX', tonumber(RETAIN) + tonumber(TTL))
local L = nil
if state ~= TAKEN then
  -- The queue lives as long as the lease and the retention, and the watchers (who skip the
  -- holder's process, the caller's) are told when the lease now ends. A departed set at the
  -- head of the queue is dropped (it may hold back the waiters of its other, free, keys).
  L = lock_key()
  L:drop_departed_set()
  L:watch(PID, tonumber(TTL), true, nil, nil, true)
  L:keep(tonumber(TTL))
end
-- The counter is gone only if something deleted it: started again from Redis' clock, never 0.
if not fv then return {DONE, (L or lock_key()):fence_flags(state ~= TAKEN, nil, false, tonumber(TTL))} end
return {DONE, (fence_parse(fv))}
