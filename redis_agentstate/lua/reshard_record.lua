-- reshard_record.lua: move a namespace's layout record on, one step of a reshard (_reshard.py).
--   KEYS[1]    - ns:{ns#layout}:layout  string  '<layout> <shards>[ <target> <moved>]'
--   ARGV[1]    - the record this step expects
--   ARGV[2]    - the record it writes: '<layout> <n> <target> 0' (a reshard starts),
--                '<layout> <n> <target> <k + 1>' (one more old shard moved) or 'slots <target>'
-- Compare-and-set, so two reshards of one namespace at once cannot both move it: the second
-- finds another record and stops. Returns the record as stored after the call.
local stored = redis.call('GET', KEYS[1])
if stored == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return ARGV[2]
end
return stored
