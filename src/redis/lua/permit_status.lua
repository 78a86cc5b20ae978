-- Permit status (reads only): {limit (0: none recorded), permits held by running leases,
-- holders, queued, ms until the first running lease ends (0: none), last fence, Redis time ms}.
local s = state()
local live = redis.call('ZRANGEBYSCORE', HOLDERS, '(' .. now_ms(), '+inf', 'LIMIT', 0, 1000)
local used = 0
for _, token in ipairs(live) do used = used + (weight_of(token) or 0) end
-- The first running lease's end (an ended one not dropped yet is not counted).
local first = redis.call('ZRANGEBYSCORE', HOLDERS, '(' .. now_ms(), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local ends = 0
if first[2] then ends = tonumber(first[2]) - now_ms() end
return {s.limit or 0, used, #live, redis.call('ZCARD', PQ), ends, s.fence, now_ms()}
