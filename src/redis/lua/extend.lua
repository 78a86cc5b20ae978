-- Extend: the full TTL again if TOKEN holds the lock (confirming a grant). Reply {1} or {0}.
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 2) ~= TOKEN then return {0} end
if string.sub(cur, 1, 1) == 'g' then
  slow().confirm_grant()
else
  redis.call('PEXPIRE', KEYS[1], TTL)
end
return {1}
