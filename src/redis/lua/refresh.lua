-- Refresh many locks in one call: for each lock i, the fast path of `extend.lua` (a lock taken
-- while nobody was queued, state 'p'), and nothing at all for any other. It runs on its own,
-- without the queue layer's prelude (its top level runs on every call), so it repeats the
-- two facts of `lock.lua` it needs: the value is one state letter then the holder's token,
-- and 'p' is the state of a lock taken free.
--
-- Model: each lock's step is `Queue::extend` of model/ in state 'p' (the same commands, one
-- lock after another, no lock's step reading another's keys); a lock in any other state is
-- left untouched and refreshed by `extend.lua` alone. So the model's extend covers it.
--
-- KEYS: lock 1, fence 1, lock 2, fence 2, ... (all in one Cluster slot).
-- ARGV: retention ms, then token 1, ttl ms 1, token 2, ttl ms 2, ...
-- Reply: one code per lock: 0 not held (untouched), 1 refreshed (PX = its ttl, the fence
-- counter its ttl + the retention), 6 call extend for this one (another state, or the fence
-- counter is gone: `extend.lua` restarts it; untouched).
local RETAIN = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS / 2 do
  local token, ttl = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local cur = redis.call('GET', KEYS[2 * i - 1])
  if not cur or string.sub(cur, 2) ~= token then
    out[i] = 0
  elseif string.sub(cur, 1, 1) ~= 'p' then
    out[i] = 6
  elseif not redis.call('GETEX', KEYS[2 * i], 'PX', RETAIN + ttl) then
    out[i] = 6
  else
    redis.call('PEXPIRE', KEYS[2 * i - 1], ttl)
    out[i] = 1
  end
end
return out
