-- Give back many locks in one call: for each lock i, the fast path of `release.lua` (a lock its
-- token took while nobody was queued, state 'p': DEL), and nothing at all for any other. It
-- runs on its own, without the queue layer's prelude, so it repeats the two facts of
-- `lock.lua` it needs: the value is one state letter then the holder's token, and 'p' is the
-- state of a lock taken free (a lock with waiters queued behind it is 'q': its release serves
-- them, `release.lua` alone).
--
-- Model: each lock's step is `Queue::release` of model/ in state 'p' (one DEL, no lock's step
-- reading another's keys); a lock in any other state is left untouched and released by
-- `release.lua` alone. So the model's release covers it.
--
-- KEYS: lock 1, lock 2, ... (one Cluster slot).
-- ARGV: token 1, token 2, ...
-- Reply: one code per lock: 0 not held (untouched), 1 deleted, 6 release this one alone
-- (another state; untouched).
local out, del = {}, {}
local cur = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do
  local v = cur[i]
  if not v or string.sub(v, 2) ~= ARGV[i] then
    out[i] = 0
  elseif string.sub(v, 1, 1) ~= 'p' then
    out[i] = 6
  else
    del[#del + 1] = KEYS[i]
    out[i] = 1
  end
end
if #del > 0 then redis.call('DEL', unpack(del)) end
return out
