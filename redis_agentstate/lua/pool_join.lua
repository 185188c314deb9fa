-- pool_join.lua: add (or replace) a member and append member_joined.
--   KEYS[1..8] - the pool's keys (see _pool.lua)
--   KEYS[9]    - nonce key of this call
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - ms to remember this call's reply (for a re-send after a lost reply)
--   ARGV[3]    - run id of the member
--   ARGV[4]    - member blob (also the record's payload)
-- Returns {-1} never opened; {1, seq} joined; {2, seq} this nonce joined already.
local maxlen, remember_ms, run_id, member = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]

local seen = remembered()
if seen then return { 2, seen } end
if not is_open() then return { -1 } end
redis.call('HSET', KEYS[2], run_id, member)
local seq = append('member_joined', member, maxlen)
remember(fmt(seq), remember_ms)
return { 1, seq }
