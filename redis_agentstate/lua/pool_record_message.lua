-- pool_record_message.lua: store a message with its receipt and append
-- run_message, unless its idempotency key was recorded before (atomic dedupe).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - message id
--   ARGV[3]    - idempotency key
--   ARGV[4]    - receipt blob
--   ARGV[5]    - stored message blob (message + receipt; also the record's payload)
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, seq} recorded; {POOL_DONE_BEFORE, seq}
-- the key was recorded before: nothing written, seq is the first record's;
-- {POOL_MALFORMED_ENTRY} the stored dedupe entry is not '<seq>:<blob>'.
local maxlen, message_id, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local receipt, stored = ARGV[4], ARGV[5]

return record_once('run_message', KEYS[3], KEYS[4], message_id, key, receipt, stored, maxlen)
