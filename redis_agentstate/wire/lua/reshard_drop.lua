-- reshard_drop.lua: mark a copied old shard moved and delete a batch of its keys (core/reshard.py).
--   KEYS[1]    - <old shard prefix>fence  string  the generation of the mover holding the slot
--   KEYS[2]    - <old shard prefix>moved  string  'sealed' -> 'moved' (kept for good: a client
--                that read the layout before the reshard learns from it where the data went)
--   KEYS[3..]  - keys of the old shard, copied to its new shards already
--   ARGV[1]    - the mover's generation
--   ARGV[2]    - the old shard's due channel (<old shard prefix>due): a message on it wakes the
--                blocked claim_next callers subscribed to it, which then find the seal and
--                follow the layout to the new shards' channels
-- Returns the number of keys deleted (a re-sent batch deletes nothing more), or 'fenced' (nothing
-- written) when the fence holds another mover's generation.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 'fenced'
end
redis.call('SET', KEYS[2], 'moved')
local dropped = 0
for i = 3, #KEYS do
  dropped = dropped + redis.call('UNLINK', KEYS[i])
end
redis.call('SPUBLISH', ARGV[2], '0')
return dropped
