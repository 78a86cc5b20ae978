-- A waiter leaves: MEMBER out of the queue; then, if TOKEN holds the lock:
-- FLAG 't' keep a grant (confirmed here), 'T' keep any hold of TOKEN; 'g' give a grant back
-- (handed on or deleted), 'G' give back any hold of TOKEN.
-- Reply {0} it held nothing (or kept nothing); {1, pttl, fence} it keeps the lock; {2} it gave it back.
if MEMBER ~= '' then redis.call('ZREM', KEYS[3], MEMBER) end
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 2) ~= TOKEN then return {0} end
local state = string.sub(cur, 1, 1)
local L = slow()
if FLAG == 't' or FLAG == 'T' then
  if state == 'g' then return {1, tonumber(TTL), L.confirm_grant()} end
  if FLAG == 'T' then
    return {1, redis.call('PTTL', KEYS[1]), (fence_parse(redis.call('GET', KEYS[2])))}
  end
  return {0}
end
if state == 'g' or FLAG == 'G' then
  L.release_held(state)
  return {2}
end
return {0}
