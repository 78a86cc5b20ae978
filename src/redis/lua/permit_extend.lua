-- Model: `Permits::extend` in model/ mirrors this script (change both together).
-- Extend: TOKEN's lease is the full TTL again if it is running. Reply {0} not held (the lease
-- ended); {1, fence} extended, with the fence of the hold. The queue's watchers are told when
-- the first lease now ends.
local s = state()
local before = s.used
purge(s)
local score = redis.call('ZSCORE', HOLDERS, TOKEN)
if not score or tonumber(score) <= now_ms() then
  if score then drop_holder(s, TOKEN) end
  serve_freed(s, before, false)
  settle(s)
  return {NOT_HELD}
end
redis.call('ZADD', HOLDERS, 'XX', now_ms() + tonumber(TTL), TOKEN)
s.changed = true
serve_freed(s, before, false)
settle(s)
if redis.call('EXISTS', PQ) == 1 then rewatch(queue(), first_end(), true) end
return {DONE, claim(TOKEN)}
