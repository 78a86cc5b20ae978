-- Election: a leader resigns (before it releases the lock). KEYS[2] the record; ARGV: token,
-- retention ms. If the record is TOKEN's, it says 'r' (a successor elected now waits no lock
-- delay) and lives the retention. Reply 1 marked, 0 not its record.
local rec = redis.call('GET', KEYS[2])
if not rec then return 0 end
local term, token, _, value = string.match(rec, '^(%S+) (%S+) (%S) (.*)$')
if token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], term .. ' ' .. token .. ' r ' .. value, 'PX', ARGV[2])
return 1
