-- requeue.lua: make a parked task runnable again (an operator's decision).
--   KEYS[1..7] - the task's keys (see _common.lua)
--   KEYS[8]    - the shard's parked index (see _common.lua)
--   ARGV[1]    - nonce: of this call (a re-send after a lost reply returns REPLY_DONE_BEFORE)
-- The task leaves the parked index and is claimable at once, at the cycle and
-- status it was parked at; its attempts start again from 0. The last failure
-- ('why') is kept, so `agentstate show` still says what parked it, until a
-- commit moves the cycle on.
-- Returns {REPLY_DONE, attempts, reason} requeued (the attempts it had);
-- {REPLY_DONE_BEFORE} this nonce requeued it already; {REPLY_REFUSED} no such
-- task; {REPLY_NOT_PARKED, status} the task is not parked (nothing written);
-- an AGENTSTATE_CORRUPT error reply for a field this library would not write.
local nonce = ARGV[1]

local h = redis.call('HMGET', KEYS[1], unpack(HASH_FIELDS))
if not present(h) then return {REPLY_REFUSED} end
local bad = bad_field(h)
if bad then return corrupt(1, bad) end
local applied = redis.call('HGET', KEYS[1], 'applied')
if h[11] ~= '1' then
  if ring_has(applied, nonce) then return {REPLY_DONE_BEFORE} end
  return {REPLY_NOT_PARKED, h[1]}
end
local now = server_now_ms()
local task_id = task_id_of(KEYS[1])
probe(4, 5, 8)
redis.call('ZREM', KEYS[8], task_id)
reindex(KEYS[4], KEYS[5], task_id, h[1], h[7], h[4], h[6], now, h[14], h[15])
redis.call('HSET', KEYS[1], 'parked', '', 'att', '0', 'applied', ring_push(applied, nonce))
return {REPLY_DONE, h[10], h[12]}
