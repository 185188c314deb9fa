-- pool_get.lua: one field of one of the pool's hashes (read-only), for
-- message_receipt, wake_registration and wake.
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]    - which hash: 4 (message dedupe), 5 (wakes) or 6 (wake dedupe)
--   ARGV[2]    - the field
-- Returns {-1} never opened; {0} no such field; {1, value}.
local which, field = tonumber(ARGV[1]), ARGV[2]

if not is_open() then return { -1 } end
local value = redis.call('HGET', KEYS[which], field)
if not value then return { 0 } end
return { 1, value }
