-- kv_set.lua: set the values of one or more keys of one shard.
--   KEYS[1..2] - the shard's kvkeys and kvttl (see _kv.lua)
--   KEYS[3..]  - value keys
--   ARGV[1]    - ttl in ms ('' = no expiry: an earlier TTL is removed)
--   ARGV[2..]  - the values, one per value key, in the same order
-- Returns the number of values set.
local ttl = ARGV[1]

prune(server_now_ms())
for i = 3, #KEYS do
  local member = user_key(KEYS[i])
  redis.call('ZADD', KEYS[1], 0, member)
  if ttl == '' then
    redis.call('SET', KEYS[i], ARGV[i - 1])
    redis.call('ZREM', KEYS[2], member)
  else
    redis.call('SET', KEYS[i], ARGV[i - 1], 'PX', ttl)
    redis.call('ZADD', KEYS[2], redis.call('PEXPIRETIME', KEYS[i]), member)
  end
end
return #KEYS - 2
