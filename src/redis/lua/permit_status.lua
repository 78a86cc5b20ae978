-- Permit status (reads only): {limit (0: none recorded), permits held by running leases,
-- holders, queued, ms until the first lease ends (0: none), last fence}.
local s = state()
local live = redis.call('ZRANGEBYSCORE', HOLDERS, '(' .. now_ms(), '+inf', 'LIMIT', 0, 1000)
local used = 0
for _, token in ipairs(live) do used = used + (weight_of(token) or 0) end
return {s.limit or 0, used, #live, redis.call('ZCARD', PQ), first_end(), s.fence}
