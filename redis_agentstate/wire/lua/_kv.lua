-- _kv.lua: prelude prepended to every key/value script (see core/kv.py).
--
-- Key/value layout, per shard SS (keys.py builds these; a script only ever
-- touches the keys of one shard, which share one hash slot):
--   KEYS[1]   - ns:{ns#SS}:kvkeys   zset  every key of the shard, score 0 (lex order)
--   KEYS[2]   - ns:{ns#SS}:kvttl    zset  keys that have a TTL -> absolute expiry,
--                                           unix ms on the server clock (PEXPIRETIME)
--   KEYS[3..] - ns:{ns#SS}:kv:<key> string the values
--
-- The index is written by the same script as the value, so it never misses a
-- live key. A key that expired stays in the index until pruned; every reader
-- compares its expiry with the server clock, so an expired key is never
-- reported, and writers prune a bounded number of expired entries per call.

local PRUNE = 100

-- The user's key is the verbatim suffix of its value key.
local function user_key(value_key)
  return id_after(value_key, '}:kv:')
end

-- Drop up to PRUNE index entries whose key has expired.
local function prune(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. fmt(now), 'LIMIT', 0, PRUNE)
  if #gone > 0 then
    redis.call('ZREM', KEYS[1], unpack(gone))
    redis.call('ZREM', KEYS[2], unpack(gone))
  end
end
