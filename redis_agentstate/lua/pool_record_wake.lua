-- pool_record_wake.lua: store a wake condition with its compiled filter and
-- registration and append wake, unless its idempotency key was recorded
-- before (atomic dedupe).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - condition id
--   ARGV[3]    - idempotency key
--   ARGV[4]    - registration blob
--   ARGV[5]    - stored wake blob (condition + filter + registration; the record's payload)
-- Returns {-1} never opened; {1, seq} recorded; {2, seq} the key was recorded
-- before: nothing written, seq is the first record's; {-3} the stored
-- dedupe entry is not '<seq>:<blob>' (corrupt).
local maxlen, condition_id, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local registration, stored = ARGV[4], ARGV[5]

if not is_open() then return { -1 } end
local first = redis.call('HGET', KEYS[6], key)
if first then
  local seq = split_seq(first)
  if not seq then return { -3 } end
  return { 2, seq }
end
local seq = append('wake', stored, maxlen)
redis.call('HSET', KEYS[5], condition_id, stored)
redis.call('HSET', KEYS[6], key, fmt(seq) .. ':' .. registration)
return { 1, seq }
