-- Model: `Queue::leave` in model/ mirrors this script (change both together).
-- A waiter leaves: MEMBER out of the queue (when it watched the lock, another waiter is
-- appointed); then, if TOKEN holds the lock, it gives it back (handed on or deleted): FLAG 'G' whatever it holds, FLAG 'o' only while FENCE is still the lock's fence
-- (a grant whose waiter had gone: a newer grant to the same token is kept).
-- Reply {0} it gave nothing back; {2} it gave the lock back; {4} it gave it back in part
-- (departed waiters dropped, more to look at): call release to continue.
local L = lock_key()
if MEMBER ~= '' and redis.call('ZREM', KEYS[3], MEMBER) == 1 then
  queue_written()
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then
    -- Free: the watchers look now, unless a set at the head waits for its other keys (a look
    -- would find it still waiting; its grant tells them).
    local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
    local m = head and parse_member(head)
    if m and m.set then pttl = NO_LEASE else pttl = 0 end
  end
  L:watch(L:holder_pid(), pttl)
end
local cur = redis.call('GET', KEYS[1])
if not cur or holder_of(cur) ~= TOKEN then return {NOT_HELD} end
if FLAG == 'o' then
  local state = state_of(cur)
  if (state ~= HANDED and state ~= GRANTED)
      or string.format('%.0f', (fence_parse(redis.call('GET', KEYS[2])))) ~= FENCE then
    return {NOT_HELD}
  end
end
if L:release_held(state_of(cur)) == CONTINUE then return {CONTINUE} end
return {HANDED_OVER}
