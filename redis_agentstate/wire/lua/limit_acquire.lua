-- limit_acquire.lua: take (or keep) a place in a concurrency key's limiter for a lease.
--   KEYS[1..3] - the limiter's keys (see _limit.lua)
--   ARGV[1]    - holder: '<task id>\0<token>', the lease the place is for
--   ARGV[2]    - ttl_ms: how long the place lives from now (the lease's lease_ms + LIMIT_SKEW)
--   ARGV[3]    - replaces: '' or another holder whose place this one takes over (commit_and_claim:
--                the lease of the next cycle takes the place of the lease of the cycle it commits)
--   ARGV[4]    - waiter: the task id to record as put off when the key is full ('' for none:
--                claim_next's candidates are recorded, so a place that frees wakes one of them)
-- A holder that has a live place keeps it (its expiry moves to now + ttl_ms, a renewal or a
-- re-send), as does one that takes over a live place; else a place is taken if the key has
-- fewer live places than its limit (any number without a limit).
-- Returns {REPLY_DONE, expires_ms} the place is held until expires_ms (server ms);
-- {REPLY_LIMITED, earliest_expiry_ms, live, limit} the key is full: nothing taken (the task of
-- ARGV[4] recorded as put off); an AGENTSTATE_CORRUPT error reply when KEYS[1] holds a value
-- this library would not write (nothing written).
local holder, ttl_ms, replaces, waiter = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]

local limit = limit_of(KEYS[1])
if limit == false then return corrupt(1, 'limit') end
local now = server_now_ms()
local expires = now + ttl_ms
local live = live_places(KEYS[2], now)
local held = redis.call('ZSCORE', KEYS[2], holder)
if not held and replaces ~= '' and redis.call('ZREM', KEYS[2], replaces) == 1 then
  held, live = true, live - 1
end
if not held and limit and live >= limit then
  if waiter ~= '' then redis.call('ZADD', KEYS[3], 'NX', fmt(now), waiter) end
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return {REPLY_LIMITED, first[2] or fmt(now), fmt(live), fmt(limit)}
end
redis.call('ZADD', KEYS[2], fmt(expires), holder)
if not held and waiter ~= '' then redis.call('ZREM', KEYS[3], waiter) end
return {REPLY_DONE, fmt(expires)}
