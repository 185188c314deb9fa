-- pool_record_message.lua: store a message with its receipt and append
-- run_message, unless its idempotency key was recorded before (atomic dedupe).
--   KEYS[1..10] - the pool's keys (see _pool.lua)
--   KEYS[11]   - ns:{ns#SS}:pool-msg-order:<pool>  zset  the pool's retained messages, oldest
--                first: member '<seq, 16 digits><#message_id>:<message_id><idempotency key>',
--                score = server ms recorded (written only with a retention below); the
--                zero-padded record sequence orders the messages of one millisecond (a zset
--                orders equal scores by member), so the newest is never taken for the oldest
--   ARGV[1]    - max records to keep in the log (0 = all)
--   ARGV[2]    - message id
--   ARGV[3]    - idempotency key
--   ARGV[4]    - receipt blob
--   ARGV[5]    - stored message blob (message + receipt; also the record's payload)
--   ARGV[6]    - max_messages: messages (and their dedupe entries) to keep (0 = all)
--   ARGV[7]    - message_ttl_ms: drop messages recorded longer ago than this (0 = never)
-- Retention: each write that records a message drops at most TRIM_PER_WRITE of
-- the oldest retained ones (past max_messages, or older than message_ttl_ms):
-- bounded work per call, never a scan, and since a write adds one and may drop
-- several, the hashes converge to the bound even after it was lowered. A
-- dropped message goes from the message hash and its idempotency key from the
-- dedupe hash (the log keeps its record until max_records trims it): a re-send
-- with that key is recorded again, as new.
-- Returns {POOL_NOT_OPEN}; {POOL_DONE, seq} recorded; {POOL_DONE_BEFORE, seq}
-- the key was recorded before: nothing written, seq is the first record's;
-- {POOL_MALFORMED_ENTRY} the stored dedupe entry is not '<seq>:<blob>'.
local maxlen, message_id, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local receipt, stored = ARGV[4], ARGV[5]
local max_messages, message_ttl_ms = tonumber(ARGV[6]), tonumber(ARGV[7])

local TRIM_PER_WRITE = 4
local retain = max_messages > 0 or message_ttl_ms > 0
-- Type-checked before the first write (a key of another type fails with nothing written).
if retain then redis.call('ZCARD', KEYS[11]) end

local out = record_once('run_message', KEYS[3], KEYS[4], message_id, key, receipt, stored, maxlen)
if not retain or out[1] ~= POOL_DONE then return out end

local now = server_now_ms()
local seq = fmt(tonumber(out[2]))
redis.call('ZADD', KEYS[11], now, string.rep('0', 16 - #seq) .. seq .. fmt(#message_id) .. ':' .. message_id .. key)

-- The oldest members to drop now: expired ones first, then any past the count.
local drop = {}
if message_ttl_ms > 0 then
  drop = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', '(' .. fmt(now - message_ttl_ms), 'LIMIT', 0, TRIM_PER_WRITE)
end
if max_messages > 0 and #drop < TRIM_PER_WRITE then
  local over = redis.call('ZCARD', KEYS[11]) - #drop - max_messages
  if over > 0 then
    drop = redis.call('ZRANGE', KEYS[11], 0, #drop + math.min(over, TRIM_PER_WRITE - #drop) - 1)
  end
end
for i = 1, #drop do
  local member = drop[i]
  local colon = string.find(member, ':', 17, true)
  local n = tonumber(string.sub(member, 17, colon - 1))
  redis.call('HDEL', KEYS[3], string.sub(member, colon + 1, colon + n))
  redis.call('HDEL', KEYS[4], string.sub(member, colon + n + 1))
  redis.call('ZREM', KEYS[11], member)
end
return out
