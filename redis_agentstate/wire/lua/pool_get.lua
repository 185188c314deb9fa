-- pool_get.lua: one field of one of the pool's hashes (read-only), for
-- message_receipt, wake_registration and wake.
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]    - which hash: 4 (message dedupe), 5 (wakes) or 6 (wake dedupe)
--   ARGV[2]    - the field
-- Returns {POOL_NOT_OPEN}; {POOL_ABSENT} no such field; {POOL_DONE, value}.
local which, field = tonumber(ARGV[1]), ARGV[2]

if not is_open() then return { POOL_NOT_OPEN } end
local value = redis.call('HGET', KEYS[which], field)
if not value then return { POOL_ABSENT } end
return { POOL_DONE, value }
