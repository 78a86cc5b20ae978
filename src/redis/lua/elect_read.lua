-- Election: who leads (reads only). KEYS[1] the lock, KEYS[2] the record. Reply {the lock's
-- value or '', its PTTL, the record or '', Redis' time in µs}.
local t = redis.call('TIME')
return {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '', tonumber(t[1]) * 1000000 + tonumber(t[2])}
