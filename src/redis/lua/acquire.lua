-- Model: `Queue::acquire` in model/ mirrors this script (change both together).
-- Acquire; when the lock is held and MEMBER is given, queue MEMBER.
-- Reply ({2, pttl, 0, 1}: held, and waiters may be queued, who come first; the queued reply ends
-- with the queue's length, the caller included, when counted):
-- {0, ttl, fence} acquired; {3, ttl, fence} a short grant to this token, confirmed now;
-- {1, pttl, fence} this token holds it already (a full grant is claimed: 'h' becomes 'q'); {2, pttl, 0} another token holds it (pttl -1:
-- no expiry); {2, pttl, 1, listening, fence, watching, time, depth} the same, and MEMBER is queued:
-- listening 0 says nobody listens on its process's grant channel (Redis dropped the
-- subscription, e.g. when a Cluster slot moved), fence is the latest fence now (a grant
-- message with a fence not above it was published before this call and must not be used),
-- watching 1 if the caller is one of the key's watchers, time Redis' clock in microseconds,
-- depth the queue's length (counted only with FLAG 'd' or when the caller was alone or queued
-- already; 0: not counted; see `queued_reply` in queue.lua) (pttl -1 also
-- when the lock is free while a set at the head of its queue waits for its other keys:
-- nothing to look at); {4} the lock was
-- free with only departed waiters at the head of the queue: it is the caller's only to pass
-- on (call release until it says something else, then try again).
local lock = KEYS[1]
local cur = redis.call('SET', lock, TAKEN .. TOKEN, 'NX', 'PX', TTL, 'GET')
if not cur then
  local ok, f, old = pcall(next_fence, false, nil, tonumber(TTL))
  if not ok then
    -- WRONGTYPE on the fence key: leave nothing behind.
    redis.call('DEL', lock)
    return redis.error_reply(tostring(f.err or f))
  end
  local _, queued, pending = fence_parse(old)
  if not queued then return {ACQUIRED, tonumber(TTL), f} end
  -- Waiters may be queued: they come first. A short grant that lapsed unconfirmed means its
  -- process is frozen or gone: its waiters are skipped until it calls again.
  local L = lock_key()
  if pending and pending ~= PID then L:lapse(pending) end
  L:seen(PID)
  local got, px = L:serve(MEMBER)
  if got == 'self' or got == 'empty' then
    local more = redis.call('ZCARD', KEYS[3]) > 0
    if more then
      -- The caller holds now, with waiters behind it: its process is the holder's, and the
      -- watchers are chosen again (one of them may be the caller itself, or of its process).
      redis.call('SETRANGE', lock, 0, QUEUED)
      -- ('!h' = PID, written with the watchers; `keep` gives the hash its expiry.)
      L:watch(PID, tonumber(TTL), nil, nil, nil, true, PID)
      L:keep(tonumber(TTL))
    else
      redis.call('DEL', KEYS[4])
    end
    L:fence_flags(more, nil, nil, tonumber(TTL))
    return {ACQUIRED, tonumber(TTL), f}
  end
  if got == 'more' then
    redis.call('SET', lock, QUEUED .. TOKEN, 'PX', CLAIM)
    L:keep(CLAIM)
    L:fence_flags(true, nil, nil, CLAIM)
    return {CONTINUE}
  end
  if got == 'blocked' then
    -- The oldest live waiter is a set that waits for its other keys: the lock stays free, and
    -- the caller waits behind the set (no lease to look at: -1).
    redis.call('DEL', lock)
    L:fence_flags(true, nil)
    px = -1
  end
  if MEMBER == '' then return {HELD, px, 0, 1} end
  return L:enqueue(px)
end
if holder_of(cur) == TOKEN and state_of(cur) ~= RESERVED then
  local state = state_of(cur)
  if state == GRANTED then
    local L = lock_key()
    local f = L:confirm_grant()
    return {GRANT_CONFIRMED, tonumber(TTL), f}
  end
  local pttl, f = lock_key():held_again(state)
  return {HELD_BY_CALLER, pttl, f}
end
local pttl = redis.call('PTTL', lock)
if MEMBER == '' then
  if state_of(cur) == TAKEN then return {HELD, pttl, 0} end
  return {HELD, pttl, 0, 1}
end
local L = lock_key()
if state_of(cur) == TAKEN then
  -- The first waiter behind a lock taken free: record the holder's process (from its token),
  -- so that the watchers are not both left in it.
  redis.call('SETRANGE', lock, 0, QUEUED)
  L:held_by(string.match(holder_of(cur), '^(%x+)/') or '')
end
return L:enqueue(pttl)
