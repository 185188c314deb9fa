-- reshard_record.lua: move a namespace's layout record on, one step of a reshard (core/reshard.py).
--   KEYS[1]    - ns:{ns#layout}:layout  string  '<layout> <shards>[ <target> <moved>]'
--   KEYS[2]    - ns:{ns#layout}:fence   string  the generation of the mover holding the reshard
--                (reshard_lease.lua)
--   ARGV[1]    - the mover's generation
--   ARGV[2]    - the record this step expects
--   ARGV[3]    - the record it writes: '<layout> <n> <target> 0' (a reshard starts),
--                '<layout> <n> <target> <k + 1>' (one more old shard moved) or 'slots <target>'
-- Fenced, then compare-and-set: only the mover holding the fence writes, and only from the record
-- it expects. Since no other mover writes while the fence is this one's, a record that already
-- says ARGV[3] was written by this mover (a re-sent step). Returns {'ok', record} when the record
-- says ARGV[3] after the call, {'fenced', record} when another mover holds the fence,
-- {'conflict', record} when the record says something else (nothing written either way).
local record, fence = KEYS[1], KEYS[2]
local stored = redis.call('GET', record) or ''
if redis.call('GET', fence) ~= ARGV[1] then
  return {'fenced', stored}
end
if stored == ARGV[2] then
  redis.call('SET', record, ARGV[3])
  return {'ok', ARGV[3]}
end
if stored == ARGV[3] then
  return {'ok', stored}
end
return {'conflict', stored}
