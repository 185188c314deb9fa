-- kv_delete.lua: delete keys of one shard (missing keys are fine).
--   KEYS[1..2] - the shard's kvkeys and kvttl (see _kv.lua)
--   KEYS[3..]  - value keys
-- Returns the number of values that existed.
prune(now_ms())
local n = 0
for i = 3, #KEYS do
  local member = user_key(KEYS[i])
  n = n + redis.call('DEL', KEYS[i])
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
end
return n
