-- Extend: the full TTL again if TOKEN holds the lock. Reply {0} not held; {1} extended; {1,
-- fence} a short grant confirmed (the fence of the hold).
local cur = redis.call('GET', KEYS[1])
if not cur or holder_of(cur) ~= TOKEN then return {0} end
if state_of(cur) == GRANTED then return {1, slow().confirm_grant()} end
if state_of(cur) == HANDED then redis.call('SETRANGE', KEYS[1], 0, QUEUED) end
redis.call('PEXPIRE', KEYS[1], TTL)
return {1}
