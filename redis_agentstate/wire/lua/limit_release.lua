-- limit_release.lua: give back a lease's place in a concurrency key's limiter.
--   KEYS[1..3] - the limiter's keys (see _limit.lua)
--   ARGV[1]    - holder: '<task id>\0<token>' (as limit_acquire.lua)
--   ARGV[2]    - wake: how many put-off tasks to hand back at most when places are free
-- Returns {released, waiter id, put off ms, ...}: released 1 if the holder had a place (0: it had
-- none, or it had expired), then the put-off tasks taken out of KEYS[3] for the caller to wake, each
-- with the time it was put off (as many as there are free places, at most ARGV[2]: the caller
-- makes each due in its shard, limit_wake.lua); an AGENTSTATE_CORRUPT error reply for a limit this library would not write.
local holder, wake = ARGV[1], tonumber(ARGV[2])

local limit = limit_of(KEYS[1])
if limit == false then return corrupt(1, 'limit') end
local now = server_now_ms()
local released = redis.call('ZREM', KEYS[2], holder)
local room = wake
if limit then room = math.min(wake, limit - live_places(KEYS[2], now)) end
local out = pop_waiters(KEYS[3], room)
table.insert(out, 1, released)
return out
