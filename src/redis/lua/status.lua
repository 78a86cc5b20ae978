-- Status (reads only): {state, pttl, fence, queued}; state 0 free, 1 held, 2 held by a short
-- grant its waiter has not confirmed yet.
local cur = redis.call('GET', KEYS[1])
local f = fence_parse(redis.call('GET', KEYS[2]))
local n = redis.call('ZCARD', KEYS[3])
if not cur then return {0, -2, f, n} end
local s = 1
if state_of(cur) == GRANTED then s = 2 end
return {s, redis.call('PTTL', KEYS[1]), f, n}
