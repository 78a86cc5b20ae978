-- Model: `Permits::release` in model/ mirrors this script (change both together).
-- Release: TOKEN's permits are free again, and the queue's heads that now fit are granted.
-- Reply {1} given back, {2} given back and granted to waiters, {0} TOKEN held nothing (its
-- lease had ended: nothing of anyone else's is freed; ended leases dropped on the way free
-- theirs, as any call does).
local s = state()
local before = s.used
purge(s)
local r = give_back(s, TOKEN)
if serve_freed(s, before, false) > 0 and r == DONE then r = HANDED_OVER end
settle(s)
return {r}
