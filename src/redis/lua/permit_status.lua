-- Permit status (reads only): {limit (0: none recorded), permits held by running leases,
-- holders, queued, ms until the first running lease ends (0: none), last fence}, then token
-- and ms left of the (at most) 10 running leases that end first. Counts the first 1,000
-- running leases at most. With FLAG 'w' (the operators' view), after those pairs: Redis' time
-- (µs), then the first FENCE members of the queue (at most 100) each followed by its score
-- (when it queued, µs).
local s = state()
local now = now_ms()
local live = redis.call('ZRANGEBYSCORE', HOLDERS, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1000)
local used, first, reply = 0, 0, {}
for i = 1, #live, 2 do
  local token, left = live[i], tonumber(live[i + 1]) - now
  used = used + (weight_of(token) or 0)
  if i == 1 then first = left end
  if i < 20 then
    reply[#reply + 1] = token
    reply[#reply + 1] = left
  end
end
local head = {s.limit or 0, used, #live / 2, redis.call('ZCARD', PQ), first, s.fence}
for i, v in ipairs(reply) do head[6 + i] = v end
if FLAG ~= 'w' then return head end
head[#head + 1] = now_us()
local count = math.min(tonumber(FENCE) or 10, 100)
if count > 0 then
  local queued = redis.call('ZRANGE', PQ, 0, count - 1, 'WITHSCORES')
  for i = 1, #queued do head[#head + 1] = queued[i] end
end
return head
