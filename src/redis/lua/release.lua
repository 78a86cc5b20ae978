-- Release: if TOKEN holds the lock, hand it to the oldest live waiter or delete it.
-- Reply {1} deleted, {2} handed over, {0} not held (nothing changed), {4} departed waiters
-- dropped and more to look at: the lock is still TOKEN's (for the claim window), call again.
local cur = redis.call('GET', KEYS[1])
if not cur or holder_of(cur) ~= TOKEN then return {0} end
local state = state_of(cur)
if state == TAKEN then
  redis.call('DEL', KEYS[1])
  return {1}
end
local L = slow()
L.seen(HUB)
return {L.release_held(state)}
