-- Model: `Permits::leave` in model/ mirrors this script (change both together).
-- A waiter leaves: MEMBER out of the queue (the heads behind it may fit now: they are served);
-- then, if TOKEN holds permits, it gives them back: FLAG 'G' whatever it holds, FLAG 'o' only
-- an unclaimed grant with fence FENCE (a grant whose waiter had gone; one its waiter's own
-- call found is kept). Reply {0} it gave nothing back; {2} it gave its permits back.
local s = state()
local before = s.used
purge(s)
local left = MEMBER ~= '' and redis.call('ZREM', PQ, MEMBER) == 1
if left then queue_written() end
local r = NOT_HELD
if redis.call('ZSCORE', HOLDERS, TOKEN)
    and (FLAG ~= 'o' or redis.call('HGET', FENCES, TOKEN) == FENCE .. ' g') then
  if give_back(s, TOKEN) == 1 then r = HANDED_OVER end
end
-- The queue is served and its watchers chosen again (the leaver may have been one).
serve_freed(s, before, left)
settle(s)
return {r}
