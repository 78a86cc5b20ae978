-- waitlock protocol, format 3: the queue layer. Prepended to every script, the lock's and the
-- permits'; then `lock.lua` (a lock's value grammar) or `permits.lua` (a semaphore's leases),
-- then the script itself (Redis runs each script on its own). `src/redis/protocol.rs` is the
-- Rust side of every format named here; `tests/scripts_lock.rs` and `tests/scripts_permits.rs`
-- drive each transition; `model/` mirrors each script as one atomic step, with one function
-- per function of these files (same names), except the helpers that only split one in parts
-- (`next_head` and `drop_gone` of `walk`, `pick` and `current_watchers` of `watch`,
-- `watchers_fit` of `watch_granted`, the `set_*` phases of set_acquire.lua, `held_again` of
-- acquire.lua and `set_held`): the model has them inside their caller. Change them together.
--
-- Version rule: formats only grow. A reader ignores what it does not know (a message with an
-- unknown tag is dropped, an unknown lock state letter reads as "held"); a new meaning gets a
-- new tag or letter, never an old one reused. Scripts of older versions may run against the
-- same keys during a rolling upgrade: they must never make a guard believe in a lease Redis
-- did not give (at worst a waiter is served late). Format 3 (review 2) adds the watch message
-- 'w3' (format 2's 'w2' did not say when) and changes no other format.
--
-- Names (every one begins with the key's hash tag: one Cluster slot): KEYS[1] the key (a
-- lock, or a semaphore's holders), KEYS[2] its state (a lock's fence counter, a semaphore's
-- "<fence> <permits> <used>"), KEYS[3] the queue, KEYS[4] the processes hash, (permits)
-- KEYS[5] the holders' fences. A process's grant channel is KEYS[1] .. ':w:' .. <pid>.
-- Process id (pid): 12 hex digits per queued locker (its hub: one subscriber connection).
-- Queue: a sorted set; member "<pid> <ttl ms> <token>", score = Redis time in microseconds at
--   enqueue, never below the last member's + 1 (FIFO across a backward clock step). A set's
--   member (locks only: a queued wait for several keys of one node at once, see lock.lua) is
--   "<pid> <ttl ms>* <token> <locks>", the same text in each of its keys' queues: <token>
--   without spaces, <locks> its keys' lock names, each "<length>:<name>", the set's first
--   key's first. Format 3's scripts read it as malformed (and drop it).
-- Processes: a hash; field <pid> = Redis time in ms when that process last called on this key
--   (fresh when 0 <= now - seen <= the presence window: a record in Redis' future, after its
--   clock stepped back, is not), or 'x' when a short grant to it lapsed (it is frozen or gone:
--   its waiters are skipped until it calls again); fields '!w1', '!w2' = "<ms> <member>": the
--   key's two watchers (see `watch`) and when each will look; '!h' (locks) the holder's pid,
--   a hint for choosing watchers, never for safety; '!e' (locks) Redis time in ms until which
--   the queue and the hash live at least (see `keep`). Deleted when the queue empties.
-- Messages on a grant channel: 'g2 <fence> <px ms> <grant time us> <token>' (the key is
--   <token>'s for px ms from Redis time <grant time>); 'w3 <px ms> <time us> <token>' (<token>
--   is one of the watchers: look px ms after Redis time <time>, when the lease that ends first
--   ends); 'd2' (a queue scan dropped this process's waiters because a short grant to it
--   lapsed: they look again, and queue again); 'm4 <px ms> <grant time us> <fence>,<fence>,...
--   <member>' (the set <member> holds every one of its keys, with these fences in its keys'
--   order, for px ms from Redis time <grant time>). A set's messages (its grant, its watch
--   messages for any of its keys, 'd2') go to its first key's channel of its process.
--
-- ARGV (every script): token, ttl ms, retention ms (the state, the queue, the processes hash),
-- claim window ms, presence window ms, queue member or '', the caller's pid or '', flag (a
-- queueing attempt: 'd' counts the queue for its reply, see `queued_reply`), fence or '';
-- (permits) ARGV[10] the number of permits the caller expects.


-- (Set by `begin_queue`, as is every variable below that a call changes.)
local TOKEN, TTL, RETAIN, CLAIM, PRESENCE
local MEMBER, PID, FLAG, FENCE

-- Reply codes, the first element of every reply (`protocol::reply`). acquire: taken, held by
-- the caller already, held by another (the caller may be queued now), a short grant to the
-- caller confirmed by this call, "continue" (departed waiters dropped, more to look at), the
-- key has another number of permits; release, extend, leave: not held (nothing changed), done
-- (deleted, extended), handed over (or, leave, given back).
local ACQUIRED, HELD_BY_CALLER, HELD, GRANT_CONFIRMED, CONTINUE, OTHER_LIMIT = 0, 1, 2, 3, 4, 5
local NOT_HELD, DONE, HANDED_OVER = 0, 1, 2

-- Whether the key's scripts keep '!e', the queue's expiry hint (see `keep`): the lock's
-- (`lock.lua` sets it); the permits' keep no hint.
local EXPIRY_HINT = false

local now_cache
local function now_us()
  if not now_cache then
    local t = redis.call('TIME')
    now_cache = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_cache
end

-- A queue walk looks at this many members at most (bounded script time, however long the
-- queue); a call that finds only departed waiters among them says "continue". A call that
-- walks several queues (a set's) shares one such budget among them: `budget` (nil: each walk
-- has SCAN of its own, the single key's calls, which walk once).
local SCAN = 200
local budget = nil

-- The most keys a set waits for at once (QUEUED_SET_MAX in src/limits.rs): every call's
-- work on a set grows with its keys.
local SET_MAX = 64

-- A watcher of a key that is free while a set at the head of its queue waits for its other
-- keys has no lease to look at: it is told this (ms), the waiter's last resort, as a lease
-- (it is served by that set's grant, and told again then).
local NO_LEASE = 100000

-- A short grant to a process lapsed unconfirmed (its record: see "Processes").
local LAPSED = 'x'

-- The two watcher fields (see `watch`).
local WATCHERS = {'!w1', '!w2'}

-- Writes of any queue by this call, counted (`queue_written` after each ZADD or ZREM of a
-- queue, in every script): a walk that read a whole queue keeps what it read (`whole`, see
-- `walk`), which holds only while no queue was written since.
local queue_writes = 0
local function queue_written() queue_writes = queue_writes + 1 end

-- The windows a call's arguments set (see `keep` and `flush`).
local SLACK, MARGIN, YOUNG

-- The functions of a key (`Key`, methods: the queue layer's, and the lock's in lock.lua and
-- lock_sets.lua) act on one key's state, a table: its names (`key`, its queue `q`, its
-- processes hash `pkey`, a lock's fence counter `fkey`) and what this call learnt of them
-- (each function below says which fields it keeps). Every function is defined once (when the
-- library loads; a script defines them on every call); a call builds one such table per key
-- it serves (`queue()`, or the lock's `lock_key`), nothing else before its first command.
local Key = {}
Key.__index = Key

-- The key's queue may hold sets (a lock's: `begin_lock` sets it; a walk that drops a departed
-- set has it leave its other queues, the lock's `gone_set`).
local SETS = false

-- The states this call built, by key name: one per key per call (`queue()`, the lock's
-- `lock_key`, which keeps its own key's here too); `begin_queue` forgets them.
local key_states

-- Keeps `K` as the state of `key` for the rest of the call; returns it.
local function keep_state(key, K)
  key_states = key_states or {}
  key_states[key] = setmetatable(K, Key)
  return K
end

-- The call's own key's state (KEYS[1], KEYS[3], KEYS[4]).
local function queue()
  return key_states and key_states[KEYS[1]]
    or keep_state(KEYS[1], {key = KEYS[1], q = KEYS[3], pkey = KEYS[4], known = {}})
end

-- A call's start: its arguments, and nothing kept from the call before it. Every call runs it
-- first (through `begin_lock` or `begin_permits`): in the Functions library every function
-- here is defined once, when the library loads, and these variables outlive a call; a script
-- runs this file's top level on every call.
local function begin_queue()
  TOKEN, TTL, RETAIN, CLAIM, PRESENCE = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  MEMBER, PID, FLAG, FENCE = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
  EXPIRY_HINT, now_cache, budget, key_states, queue_writes = false, nil, nil, nil, 0
  SETS = false
  SLACK = math.floor(tonumber(RETAIN) / 4)
  MARGIN = math.floor(SLACK / 2)
  YOUNG = math.floor(PRESENCE / 4)
end

-- A member's parts: {member, pid, ttl, token, set (a set's lock names, nil for one key's
-- waiter), chan (a set's grant channel, its first key's; a one-key waiter's is its key's,
-- `key .. ':w:' .. pid`, built where it is needed), who (what a walk knows it by: its pid, or
-- a set's channel)}; nil if malformed.
local function parse_member(m)
  local pid, ttl, star, rest = string.match(m, '^(%S+) (%d+)(%*?) (.*)$')
  if not pid then return nil end
  local p = {member = m, pid = pid, ttl = tonumber(ttl), who = pid}
  if star == '' then
    p.token = rest
    return p
  end
  local token, tail = string.match(rest, '^(%S+) (.+)$')
  if not token then return nil end
  -- Its locks: "<length>:<name>" each.
  local set, pos, n = {}, 1, #tail
  while pos <= n do
    local len, at = string.match(tail, '^(%d+):()', pos)
    if not len then return nil end
    local e = at + tonumber(len) - 1
    if e > n or e < at then return nil end
    set[#set + 1] = string.sub(tail, at, e)
    pos = e + 1
  end
  -- (No set has more keys than QUEUED_SET_MAX: one that does is no member of ours.)
  if #set == 0 or #set > SET_MAX then return nil end
  p.token, p.set, p.chan = token, set, set[1] .. ':w:' .. pid
  p.who = p.chan
  return p
end

-- A member's pid, ttl and token (nil if malformed).
local function split_member(m)
  local p = parse_member(m)
  if p then return p.pid, p.ttl, p.token end
end

-- What a walk knows member `m` (a string) by, and its pid, without parsing all of it (no
-- table for a one-key waiter's): its pid, or a set's grant channel; nil if malformed.
local function ident(m)
  local pid, star = string.match(m, '^(%S+) %d+(%*?) ')
  if not pid then return nil end
  if star == '' then return pid, pid end
  local p = parse_member(m)
  if p then return p.chan, pid end
end

-- The member a watcher field names ("<ms> <member>"), and its ms.
local function watcher_of(v)
  local at, m = string.match(v or '', '^(%d+) (.*)$')
  return m, at and tonumber(at)
end

function Key.channel(K, pid) return K.key .. ':w:' .. pid end

-- The grant channel parsed member `m` listens on for this key.
function Key.chan_of(K, m) return m.chan or K:channel(m.pid) end

-- How a process listens on a grant channel: 's' sharded, 'c' classic, nil nobody (its
-- process died, or lost its subscriber connection).
-- `listeners(chans)[n]` for each of `chans`, asked in one PUBSUB SHARDNUMSUB (and one NUMSUB
-- for those nobody listens for sharded).
local function listeners(chans)
  local hows, rest = {}, {}
  if #chans == 0 then return hows end
  local r = redis.pcall('PUBSUB', 'SHARDNUMSUB', unpack(chans))
  for n = 1, #chans do
    if type(r) == 'table' and not r.err and tonumber(r[2 * n]) > 0 then
      hows[n] = 's'
    else
      rest[#rest + 1] = n
    end
  end
  if #rest > 0 then
    local cs = {}
    for m, n in ipairs(rest) do cs[m] = chans[n] end
    local r2 = redis.call('PUBSUB', 'NUMSUB', unpack(cs))
    for m, n in ipairs(rest) do
      if tonumber(r2[2 * m]) > 0 then hows[n] = 'c' end
    end
  end
  return hows
end

function Key.listener(K, pid) return listeners({K:channel(pid)})[1] end

-- Puts `member` (MEMBER if nil) at the back of the queue, once. Its score is Redis' clock in
-- microseconds, but never below the last member's (+1): after the clock steps back, a
-- newcomer still queues behind every waiter already there (FIFO). Returns whether it was
-- not queued before. `K.alone`: it was added to an empty queue (true), to a queue with
-- members (false), or was queued already (nil: not known).
function Key.add_member(K, member)
  member = member or MEMBER
  if redis.call('ZADD', K.q, 'NX', now_us(), member) == 1 then
    queue_written()
    -- (The last two: the last member, and whether the newcomer is alone.)
    local last = redis.call('ZRANGE', K.q, -2, -1, 'WITHSCORES')
    if last[#last - 1] ~= member then
      redis.call('ZADD', K.q, 'XX', tonumber(last[#last]) + 1, member)
    end
    K.alone = #last == 2
    return true
  end
  K.alone = nil
  return false
end

-- The processes hash outlives its queue by the retention at most: a write that (re)creates
-- it after it expired, while its queue lived on, gives it the retention again.
function Key.retain(K)
  if redis.call('PTTL', K.pkey) == -1 then redis.call('PEXPIRE', K.pkey, RETAIN) end
end

-- The queue and the processes hash live while waiters wait: a queue's first member, and
-- every call that sets a lease (`px` ms from now) while waiters may be queued, give them
-- that lease plus the retention at least (an expiry set only when a member is added would
-- let a long wait lose its queue: nobody would be granted, nobody told).
-- Their expiry moves only when it must: the hash's '!e' (a lock's) says until when (Redis
-- ms) both live at least. A call that read it (`K.hint`, from `watch` or `watching`) and
-- finds it far enough writes nothing; else both get the lease plus the retention and
-- `SLACK` more, and '!e' says so (a busy key moves them once in an eighth of the retention:
-- `MARGIN` below '!e' is too short, which also covers a slot moved to a node whose clock
-- is behind by less than that). `force`: a new queue (no expiry yet, whatever '!e' says).
-- A call that did not read it sets the life exactly, and drops '!e' (it may have cut it).
function Key.keep(K, px, force)
  local life = tonumber(RETAIN) + math.max(px, 0)
  if EXPIRY_HINT and K.hint ~= nil then
    local need = math.floor(now_us() / 1000) + life
    if not force and K.hint and K.hint >= need + MARGIN then return end
    K.hint = need + SLACK
    -- ('!e' first: it makes the hash if it is gone, and the PEXPIRE gives it its life.)
    redis.call('HSET', K.pkey, '!e', string.format('%.0f', K.hint))
    life = life + SLACK
  end
  redis.call('PEXPIRE', K.q, life)
  redis.call('PEXPIRE', K.pkey, life)
  if EXPIRY_HINT and K.hint == nil then redis.call('HDEL', K.pkey, '!e') end
end

-- The fields a change of holder or of watchers reads: the two watchers ('!w1', '!w2', see
-- `watch`), a lock's holder ('!h') and the expiry hint ('!e'), in one HMGET.
-- With a record due (`K.due`, see `seen`), the same HMGET reads it too (`K.due_rec`); and the
-- records of `pids` (a grant's first heads, each once), returned as a table pid -> record
-- (false: none) for `know`.
function Key.read_fields(K, pids)
  local fields, asked = {'!w1', '!w2', '!h', '!e'}, {}
  if K.due then fields[5] = K.due end
  local at = #fields
  for _, pid in ipairs(pids or {}) do
    if not asked[pid] then
      asked[pid] = true
      fields[#fields + 1] = pid
    end
  end
  local r = redis.call('HMGET', K.pkey, unpack(fields))
  if K.due then K.due_rec = r[5] or false end
  local recs = {}
  for j = at + 1, #fields do recs[fields[j]] = r[j] or false end
  return r, recs
end

-- `keep` uses the hint of `was` (from `read_fields`) from now on (false: no field). Only
-- the calls whose `keep` follows their watchers' choice do (`watch`, `watching`).
function Key.use_hint(K, was)
  K.hint = (was[4] and tonumber(was[4])) or false
end

-- A process record says when its process last called (ms). A record that is not fresh
-- (older than the presence window, or in Redis' future after a clock step) means the same
-- as none, so `seen` drops a few of them whenever it adds a field: a key that never drains
-- does not keep one field per process that ever called. A lapsed process's 'x' goes once
-- nobody listens for it (it died).
local SWEEP = 8
function Key.sweep(K, now_ms)
  local r = redis.call('HRANDFIELD', K.pkey, SWEEP, 'WITHVALUES')
  local stale = {}
  for i = 1, #r, 2 do
    local field, v = r[i], r[i + 1]
    if string.sub(field, 1, 1) ~= '!' then
      local t = tonumber(v)
      if t then
        local d = now_ms - t
        if d < 0 or d > PRESENCE then stale[#stale + 1] = field end
      elseif v == LAPSED and not K:listener(field) then
        stale[#stale + 1] = field
      end
    end
  end
  if #stale > 0 then redis.call('HDEL', K.pkey, unpack(stale)) end
end

-- The caller's record, when `seen(pid, true)` left it due (`K.due`): written with this call's
-- next write of the hash (`flush`), one HSET for both. Until then the call reads it as
-- written. A record the call read (`K.due_rec`, see `read_fields`) that is younger than a
-- quarter of the presence window is not written again (`YOUNG`): a process that calls a key
-- often writes its record about once per quarter window, not on every call. It reads as
-- fresh either way (a record only ever gets older than the process's last call: a process
-- may read as stale sooner, never as fresh longer).

-- Writes `writes` (field, value, ...; `fresh` of them new fields, as the caller read them)
-- and the due record in one HSET; a record that is a new field gives the hash the retention
-- and sweeps (see `seen`).
function Key.flush(K, writes, fresh)
  local pid, now_ms = K.due, nil
  K.due = nil
  if pid then
    now_ms = math.floor(now_us() / 1000)
    local age = K.due_rec and now_ms - (tonumber(K.due_rec) or -1e15)
    if age and age >= 0 and age < YOUNG then pid = nil end
  end
  if pid then
    writes[#writes + 1] = pid
    writes[#writes + 1] = now_ms
  end
  if #writes == 0 then return end
  if redis.call('HSET', K.pkey, unpack(writes)) > fresh and pid then
    -- (NX: a hash that has an expiry keeps it, the one `keep` gave it and '!e' states.)
    redis.call('PEXPIRE', K.pkey, RETAIN, 'NX')
    K:sweep(now_ms)
  end
end

-- Process `pid` called on this key now. `later`: its record is written by the call's next
-- write of the hash (the caller makes sure one comes: `flush`, `watch`, `watching`), and
-- read as written until then; the end state is the same, except that a young record the
-- call read on the way stays as it is (see `flush`).
function Key.seen(K, pid, later)
  if pid == '' then return end
  K.due = pid
  if not later then K:flush({}, 0) end
end

-- A short grant to `pid` lapsed unconfirmed: its process is frozen or gone.
function Key.lapse(K, pid)
  if redis.call('EXISTS', K.pkey) == 1 then redis.call('HSET', K.pkey, pid, LAPSED) end
end

-- Watchers: two queued waiters of two processes look at the key when the lease that ends
-- first ends (a holder that crashed or overstays, or a short grant that lapsed, is then
-- served at once). They are recorded in the processes hash as '!w1' / '!w2' = "<ms when it
-- looks> <member>", and kept across grants while they stay queued and their process fresh:
-- a busy queue appoints (and messages) a watcher only once in a while. A watcher looks
-- again when its look finds the key held (the reply says the new lease). New ones come from
-- the back of the queue, which is granted last.

-- (the queue layer goes on in queue_walk.lua: the walk, the grants, the watchers)
