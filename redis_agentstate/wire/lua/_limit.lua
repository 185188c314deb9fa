-- _limit.lua: prelude of the limiter scripts (limit_acquire, limit_release, limit_set,
-- limit_register): one concurrency key's limiter, the per-key concurrency limits of
-- _common.lua's limits note.
--
-- Limiter key layout (keys.LimiterKeys; the three share the slot of the key's shard tag,
-- which is in general not the slot of the tasks it limits):
--   KEYS[1] - ns:{ns#SS}:limit:<ck>    string  the limit, a decimal from 1 to MAX_LIMIT (absent: none)
--   KEYS[2] - ns:{ns#SS}:holders:<ck>  zset    '<task id>\0<token>' -> ms the place expires
--   KEYS[3] - ns:{ns#SS}:lwait:<ck>    zset    task ids put off because the key was full -> ms put off
--
-- A place is a live lease's: taken before its claim, for LIMIT_SKEW longer than the lease, and
-- moved on with every renewal; a commit, finalize or release gives it back. A place whose
-- holder died expires by itself: expired places are dropped before any count, so the key's
-- live count is the number of places that have not expired, never more than a lease behind.

-- The limit KEYS[1] holds (nil: none), or false when it holds a value this library would not write.
local function limit_of(key)
  local v = redis.call('GET', key)
  if not v then return nil end
  if #v > 7 or not string.find(v, '^%d+$') then return false end
  local n = tonumber(v)
  if n < 1 or n > MAX_LIMIT then return false end
  return n
end

-- Drops the expired places of ``holders``; returns how many are live.
local function live_places(holders, now)
  redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
  return redis.call('ZCARD', holders)
end

-- Up to ``n`` put-off tasks of ``waiters``, oldest first, taken out of it: a flat array of
-- task id, ms it was put off (limit_wake.lua gives it back its place in line with it).
local function pop_waiters(waiters, n)
  if n <= 0 then return {} end
  return redis.call('ZPOPMIN', waiters, n)
end
