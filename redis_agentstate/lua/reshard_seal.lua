-- reshard_seal.lua: seal one old shard before a reshard copies it (_reshard.py; keys.py, "Resharding").
--   KEYS[1]    - <old shard prefix>moved  string  absent, 'sealed' or 'moved'
-- From here on every script of the shard's data refuses (_moved.lua: 'AGENTSTATE_MOVED sealed')
-- and every plain read of it is followed by this seal (_ops/relocation.py), so nothing changes
-- in the shard while it is copied. Returns the seal as it was: false (sealed now), 'sealed'
-- (a reshard that stopped half-way sealed it: the copy starts again) or 'moved' (copied and
-- dropped already: only the layout record is left to count it).
local seal = redis.call('GET', KEYS[1])
if not seal then
  redis.call('SET', KEYS[1], 'sealed')
end
return seal
