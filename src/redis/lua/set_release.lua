-- Model: a set's release, `Act::Release` of model/src/sets.rs; each key's steps are
-- release.lua's (change them together).
-- Releases every key of a set that TOKEN holds, in one call: first every key is let go (a key
-- taken while nobody was queued is deleted; the others are freed), then each freed key that
-- is still free is served as release.lua serves it (so a set waiting for several of these
-- keys finds them all free, and is granted by the first), or left free for a set that waits at
-- its head. A key found free (its lease ran out) whose queue may have waiters is served too,
-- as release.lua's late release does. The walks of all keys share one bound (SCAN members).
-- KEYS: lock, fence, queue, processes of each key. ARGV: as every lock script's.
-- Reply: one code per key as release.lua's ({0} not held, {1} deleted or left free, {2}
-- handed over), or {4, code 1, ..., code n}: the same, and departed waiters dropped with more to
-- look at on some key, which stays TOKEN's for the claim window: call again (what this call
-- said of each key stands: the keys released now answer 0 then).
budget = SCAN
local n = #KEYS / 4
local out, serve = {}, {}
for j = 1, n do
  local l = KEYS[4 * j - 3]
  local cur = redis.call('GET', l)
  out[j] = NOT_HELD
  if cur and holder_of(cur) == TOKEN then
    out[j] = DONE
    redis.call('DEL', l)
    if state_of(cur) ~= TAKEN then serve[#serve + 1] = j end
  elseif not cur then
    -- The lease ran out before this release: waiters may be queued whose watchers are gone.
    local _, queued, pending = fence_parse(redis.call('GET', KEYS[4 * j - 2]))
    if queued then
      if pending and pending ~= PID then lock_key(l):lapse(pending) end
      serve[#serve + 1] = j
    end
  end
end
local more = false
for _, j in ipairs(serve) do
  local l = KEYS[4 * j - 3]
  -- (A set granted by an earlier key's serve may hold this one now: it is its.)
  if not redis.call('GET', l) then
    local K = lock_key(l)
    -- (The record is written with the key's next write of the hash.)
    K:seen(PID, true)
    local r = K:release_held(QUEUED)
    if r == CONTINUE then
      more = true
    elseif out[j] ~= NOT_HELD then
      out[j] = r
    end
  end
end
if more then return {CONTINUE, unpack(out)} end
return out
