-- kv_swap.lua: compare-and-set one key of one shard: set its value if it holds the one expected.
--   KEYS[1..2] - the shard's kvkeys and kvttl (see _kv.lua)
--   KEYS[3]    - the value key
--   ARGV[1]    - '1': the key must hold ARGV[2]; '0': it must not exist
--   ARGV[2]    - the value expected (ignored for '0')
--   ARGV[3]    - the new value (set with no expiry)
-- Returns 1 if the key now holds ARGV[3] (set by this call, or already: a re-sent call after a lost
-- reply), else 0 (it holds something else, or nothing where a value was expected: nothing written).
-- Fails with WRONGTYPE before any write if the key index is not ours.
redis.call('ZCARD', KEYS[1])
local now = server_now_ms()
prune(now)
local held = redis.call('GET', KEYS[3])
if held == ARGV[3] then
  return 1
end
if ARGV[1] == '0' then
  if held then
    return 0
  end
elseif held ~= ARGV[2] then
  return 0
end
local member = user_key(KEYS[3])
redis.call('ZADD', KEYS[1], 0, member)
redis.call('SET', KEYS[3], ARGV[3])
redis.call('ZREM', KEYS[2], member)
return 1
