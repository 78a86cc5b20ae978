-- Election: a new leader announces itself. On its own (no prelude). KEYS[1] the lock,
-- KEYS[2] the election's record "<term> <token> <a|r> <value>" ('a' leading, 'r' resigned).
-- ARGV: token, term (the hold's fence), value, and the record's life in ms (its lease plus
-- the retention: the leader keeps it alive while it leads, so a leader that dies leaves a
-- record that expires). If TOKEN holds the lock: the record is now its own; reply {1, the
-- previous record or ''}. Else {0}.
local cur = redis.call('GET', KEYS[1])
if not cur or string.sub(cur, 2) ~= ARGV[1] then return {0} end
local prev = redis.call('GET', KEYS[2]) or ''
redis.call('SET', KEYS[2], ARGV[2] .. ' ' .. ARGV[1] .. ' a ' .. ARGV[3], 'PX', ARGV[4])
return {1, prev}
