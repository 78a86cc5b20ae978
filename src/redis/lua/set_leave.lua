-- Model: a set that leaves, `Act::Leave` of model/src/sets.rs (change both together).
-- A set's waiter leaves: MEMBER (the set's member) out of every one of its keys' queues; a key
-- that is free and whose queue it headed (it held the waiters there back) is served; the others
-- keep their watchers fit. Then, if TOKEN holds the set's keys, it gives them back (as
-- set_release.lua): FLAG 'G' whatever it holds, FLAG 'o' only an unclaimed grant whose fences
-- FENCE lists ("<fence 1>,<fence 2>,...": a grant whose waiter had gone), and only if every key
-- is still that grant's (a newer grant, or one its waiter claimed, is kept whole).
-- KEYS: lock, fence, queue, processes of each key. ARGV: as every lock script's.
-- Reply {0} it gave nothing back; {2} it gave keys back; {4} departed waiters dropped, more to
-- look at on some key, which is TOKEN's for the claim window: call set_release.lua.
budget = SCAN
local n = #KEYS / 4
local more = false
if MEMBER ~= '' then
  for j = 1, n do
    local l, q = KEYS[4 * j - 3], KEYS[4 * j - 1]
    local head = redis.call('ZRANGE', q, 0, 0)[1]
    if redis.call('ZREM', q, MEMBER) == 1 then
      queue_written()
      local K = lock_key(l)
      local cur = redis.call('GET', l)
      if cur then
        K:watch(K:holder_pid(), math.max(redis.call('PTTL', l), 0))
      elseif head == MEMBER then
        if K:release_held(QUEUED) == CONTINUE then more = true end
      else
        K:watch('', NO_LEASE)
      end
    end
  end
end
local cur = {}
for j = 1, n do cur[j] = redis.call('GET', KEYS[4 * j - 3]) end
if FLAG == 'o' then
  local fences = {}
  for f in string.gmatch(FENCE, '[^,]+') do fences[#fences + 1] = f end
  for j = 1, n do
    local v = cur[j]
    local state = v and state_of(v)
    if not (v and holder_of(v) == TOKEN and (state == HANDED or state == GRANTED)
        and string.format('%.0f', (fence_parse(redis.call('GET', KEYS[4 * j - 2])))) == fences[j]) then
      if more then return {CONTINUE} end
      return {NOT_HELD}
    end
  end
end
local gave, serve = false, {}
for j = 1, n do
  local v = cur[j]
  if v and holder_of(v) == TOKEN then
    gave = true
    redis.call('DEL', KEYS[4 * j - 3])
    if state_of(v) ~= TAKEN then serve[#serve + 1] = j end
  end
end
for _, j in ipairs(serve) do
  local l = KEYS[4 * j - 3]
  if not redis.call('GET', l) then
    if lock_key(l):release_held(QUEUED) == CONTINUE then more = true end
  end
end
if more then return {CONTINUE} end
if gave then return {HANDED_OVER} end
return {NOT_HELD}
