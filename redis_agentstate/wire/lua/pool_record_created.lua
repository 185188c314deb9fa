-- pool_record_created.lua: mark the pool created and append pool_created,
-- once: 'created' is a flag, so any later call (a re-send after a lost reply,
-- by this process or another) is the same write and gets the first cursor.
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]     - max records to keep in the log (0 = all)
--   ARGV[2]     - payload blob of the record (an encoded nil)
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, seq} recorded; {POOL_DONE_BEFORE, seq}
-- recorded before (nothing written).
local maxlen, blob = tonumber(ARGV[1]), ARGV[2]

if not is_open() then return { POOL_NOT_OPEN } end
local first = redis.call('HGET', KEYS[1], 'created_seq')
if first then return { POOL_DONE_BEFORE, first } end
redis.call('HSET', KEYS[1], 'created', '1')
local seq = append('pool_created', blob, maxlen)
redis.call('HSET', KEYS[1], 'created_seq', fmt(seq))
return { POOL_DONE, seq }
