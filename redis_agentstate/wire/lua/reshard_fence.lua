-- reshard_fence.lua: a mover claims one slot before it writes there (core/reshard.py, "The fenced mover").
--   KEYS[1]    - <shard prefix>fence  string  the generation of the mover that may write this
--                shard's slot: an old shard's (its seal, its keys) or a new shard's (its copies)
--   ARGV[1]    - the mover's generation (reshard_lease.lua)
-- Every other reshard script of the slot writes only while the fence holds its caller's
-- generation, so once a newer mover claimed a slot an older one (stalled, then woken) writes
-- nothing there again. A fence never goes back: a claim by an older generation is refused.
-- Returns the fence as stored after the call (ARGV[1] when claimed; a re-sent claim is the same).
local fence, gen = KEYS[1], tonumber(ARGV[1])
local stored = tonumber(redis.call('GET', fence) or '0')
if stored > gen then
  return stored
end
redis.call('SET', fence, ARGV[1])
return gen
