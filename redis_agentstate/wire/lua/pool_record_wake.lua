-- pool_record_wake.lua: store a wake condition with its compiled filter and
-- registration and append wake, unless its idempotency key was recorded
-- before (atomic dedupe).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - condition id
--   ARGV[3]    - idempotency key
--   ARGV[4]    - registration blob
--   ARGV[5]    - stored wake blob (condition + filter + registration; the record's payload)
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, seq} recorded; {POOL_DONE_BEFORE, seq}
-- the key was recorded before: nothing written, seq is the first record's;
-- {POOL_MALFORMED_ENTRY} the stored dedupe entry is not '<seq>:<blob>'.
local maxlen, condition_id, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local registration, stored = ARGV[4], ARGV[5]

return record_once('wake', KEYS[5], KEYS[6], condition_id, key, registration, stored, maxlen)
