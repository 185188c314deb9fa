-- limit_set.lua: set or remove a concurrency key's limit.
--   KEYS[1..3] - the limiter's keys (see _limit.lua)
--   ARGV[1]    - limit: a decimal from 1 to MAX_LIMIT, or '' to remove the limit
--   ARGV[2]    - wake: how many put-off tasks to hand back at most
-- Live places are kept: lowering a limit below them takes no lease away, it only refuses new
-- places until fewer are live. Returns {live, waiter id, put off ms, ...}: the live places, then
-- the put-off tasks taken out of KEYS[3] for the caller to wake (as limit_release.lua's; as many as
-- the new limit has free places, at most ARGV[2]); a key of another Redis type fails with WRONGTYPE before anything is written.
local limit, wake = ARGV[1], tonumber(ARGV[2])

local now = server_now_ms()
redis.call('GET', KEYS[1])
local live = live_places(KEYS[2], now)
redis.call('ZCARD', KEYS[3])
local room = wake
if limit == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], limit)
  room = math.min(wake, tonumber(limit) - live)
end
local out = pop_waiters(KEYS[3], room)
table.insert(out, 1, live)
return out
