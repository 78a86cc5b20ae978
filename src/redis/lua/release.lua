-- Model: `Queue::release` in model/ mirrors this script (change both together).
-- Release: if TOKEN holds the lock, hand it to the oldest live waiter or delete it.
-- Reply {1} deleted, {2} handed over, {0} not held (nothing changed), {4} departed waiters
-- dropped and more to look at: the lock is still TOKEN's (for the claim window), call again;
-- {0, 4} not held, but the lock was free with waiters queued and is TOKEN's now only to pass
-- on, as with {4} (call again; the release still did not find its own lock).
local cur = redis.call('GET', KEYS[1])
if not cur then
  -- The lease ran out before this release and nobody took the lock. Waiters may be queued
  -- whose watchers are gone with their processes: serve them now, as an attempt on the free
  -- lock would (a short grant that lapsed unconfirmed marks its process, as there).
  local _, queued, pending = fence_parse(redis.call('GET', KEYS[2]))
  if not queued then return {NOT_HELD} end
  local L = lock_key()
  if pending and pending ~= PID then L:lapse(pending) end
  redis.call('SET', KEYS[1], QUEUED .. TOKEN, 'PX', CLAIM)
  if L:release_held(QUEUED) == CONTINUE then return {NOT_HELD, CONTINUE} end
  return {NOT_HELD}
end
if holder_of(cur) ~= TOKEN then return {NOT_HELD} end
local state = state_of(cur)
if state == TAKEN then
  redis.call('DEL', KEYS[1])
  return {DONE}
end
local L = lock_key()
-- (The record is written with the release's next write of the hash: the grant's.)
L:seen(PID, true)
return {L:release_held(state)}
