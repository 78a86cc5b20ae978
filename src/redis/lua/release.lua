-- Release: if TOKEN holds the lock, hand it to the oldest live waiter or delete it.
-- Reply {1} deleted, {2} handed over, {0} not held (nothing changed).
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 2) ~= TOKEN then return {0} end
local state = string.sub(cur, 1, 1)
if state == 'p' then
  redis.call('DEL', KEYS[1])
  return {1}
end
return {slow().release_held(state)}
