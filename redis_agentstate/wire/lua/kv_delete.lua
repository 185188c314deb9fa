-- kv_delete.lua: delete keys of one shard (missing keys are fine).
--   KEYS[1..2] - the shard's kvkeys and kvttl (see _kv.lua)
--   KEYS[3..]  - value keys
-- Returns the number of values that existed.
-- Fails with WRONGTYPE before the first DEL if the key index is not ours.
redis.call('ZCARD', KEYS[1])
prune(server_now_ms())
local n = 0
for i = 3, #KEYS do
  local member = user_key(KEYS[i])
  n = n + redis.call('DEL', KEYS[i])
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
end
return n
