-- Status (reads only): {state, pttl, fence, queued}; state 0 free, 1 held, 2 held by a short
-- grant its waiter has not confirmed yet (or reserved for a set that has not taken it yet). With FLAG 'w' (the operators' view) the reply goes
-- on: Redis' time (µs), the holder's token ('' when free), then the first FENCE members of the
-- queue (at most 100) each followed by its score (when it queued, µs).
local cur = redis.call('GET', KEYS[1])
local f = fence_parse(redis.call('GET', KEYS[2]))
local n = redis.call('ZCARD', KEYS[3])
local s, pttl = 0, -2
if cur then
  s = 1
  if state_of(cur) == GRANTED or state_of(cur) == RESERVED then s = 2 end
  pttl = redis.call('PTTL', KEYS[1])
end
if FLAG ~= 'w' then return {s, pttl, f, n} end
local out = {s, pttl, f, n, now_us(), cur and holder_of(cur) or ''}
local count = math.min(tonumber(FENCE) or 10, 100)
if count > 0 then
  local first = redis.call('ZRANGE', KEYS[3], 0, count - 1, 'WITHSCORES')
  for i = 1, #first do out[#out + 1] = first[i] end
end
return out
