-- reshard_seal.lua: seal one old shard before a reshard copies it (core/reshard.py; keys.py, "Resharding").
--   KEYS[1]    - <old shard prefix>fence  string  the generation of the mover holding the slot
--                (reshard_fence.lua)
--   KEYS[2]    - <old shard prefix>moved  string  absent, 'sealed' or 'moved'
--   ARGV[1]    - the mover's generation
-- From here on every script of the shard's data refuses (_moved.lua: 'AGENTSTATE_MOVED sealed')
-- and every plain read of it is followed by this seal (wire/relocation.py), so nothing changes
-- in the shard while it is copied. Returns the seal as it was: false (sealed now), 'sealed'
-- (a reshard that stopped half-way sealed it: the copy starts again) or 'moved' (copied and
-- the drop begun already: what is left of it is deleted, then the layout record counts it);
-- 'fenced' (nothing written) when the fence holds another mover's generation. A re-sent seal
-- answers 'sealed': the copy starts, as it would have.
local fence, seal = KEYS[1], KEYS[2]
if redis.call('GET', fence) ~= ARGV[1] then
  return 'fenced'
end
local state = redis.call('GET', seal)
if not state then
  redis.call('SET', seal, 'sealed')
end
return state
