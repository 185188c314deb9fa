-- pool_record_message.lua: store a message with its receipt and append
-- run_message, unless its idempotency key was recorded before (atomic dedupe).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - message id
--   ARGV[3]    - idempotency key
--   ARGV[4]    - receipt blob
--   ARGV[5]    - stored message blob (message + receipt; also the record's payload)
-- Returns {-1} never opened; {1, seq} recorded; {2, seq} the key was recorded
-- before: nothing written, seq is the first record's; {-3} the stored
-- dedupe entry is not '<seq>:<blob>' (corrupt).
local maxlen, message_id, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local receipt, stored = ARGV[4], ARGV[5]

if not is_open() then return { -1 } end
local first = redis.call('HGET', KEYS[4], key)
if first then
  local seq = split_seq(first)
  if not seq then return { -3 } end
  return { 2, seq }
end
local seq = append('run_message', stored, maxlen)
redis.call('HSET', KEYS[3], message_id, stored)
redis.call('HSET', KEYS[4], key, fmt(seq) .. ':' .. receipt)
return { 1, seq }
