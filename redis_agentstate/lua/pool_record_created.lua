-- pool_record_created.lua: mark the pool created and append pool_created.
--   KEYS[1..8] - the pool's keys (see _pool.lua)
--   KEYS[9]    - nonce key of this call
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - ms to remember this call's reply (for a re-send after a lost reply)
--   ARGV[3]    - payload blob of the record (an encoded nil)
-- Returns {-1} never opened; {1, seq} recorded; {2, seq} this nonce recorded it already.
local maxlen, remember_ms, blob = tonumber(ARGV[1]), ARGV[2], ARGV[3]

local seen = remembered()
if seen then return { 2, seen } end
if not is_open() then return { -1 } end
redis.call('HSET', KEYS[1], 'created', '1')
local seq = append('pool_created', blob, maxlen)
remember(fmt(seq), remember_ms)
return { 1, seq }
